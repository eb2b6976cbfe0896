//! The allocator's state, one named part of `Meta`: the group summaries, where block searches
//! start, and the blocks and inodes that may not be handed out yet (freed by a transaction not
//! yet committed, or, in lightweight mode, frees held back until in-place writes are durable).
//! The logic is in `alloc.rs` (it needs the buffer cache for the bitmaps, and the running
//! operation's undo record).

use std::collections::HashSet;

/// In-memory summary of one group descriptor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupInfo {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    pub flags: u16,
    pub itable_unused: u32,
    /// Bitmap checksums as the descriptor stores them (masked by `bitmap_csum_mask`).
    pub block_bitmap_csum: u32,
    pub inode_bitmap_csum: u32,
    /// `VERIFIED_*` bits: the bitmap in the cache is known to match its checksum (read and
    /// verified, or written by tidefs). Set once per mount.
    pub verified: u8,
    /// A bitmap of this group failed its checksum: the group is no longer used for
    /// allocation, and frees in it fail with `Corrupt`.
    pub bad: bool,
}

/// A free that lightweight mode holds back: the bitmaps learn of it only once the in-place
/// writes of the transaction that made it (the inode or extent block that stopped pointing at
/// it) are durable. Until then a crash leaks it, which lightweight allows; the other order could
/// leave a block in use that the bitmap calls free.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LateFree {
    Block { nr: u64, journaled: bool },
    Inode { ino: u32, is_dir: bool },
}

/// The allocator's state (see the module comment).
#[derive(Default)]
pub(crate) struct AllocState {
    /// One summary per block group, loaded from the group descriptors at mount.
    pub groups: Vec<GroupInfo>,
    /// Blocks freed by the running transaction (released from quarantine after its commit).
    pub freed_running: Vec<u64>,
    /// Blocks that must not be allocated yet.
    pub quarantine: HashSet<u64>,
    /// Where the next block search starts, per flow of allocation.
    pub block_cursor: u64,
    /// Lightweight mode: frees made by the running transaction, applied to the bitmaps once
    /// its in-place writes are durable (see [`LateFree`]).
    pub late_frees: Vec<LateFree>,
    /// Block and inode bitmap blocks: with the GDT and the superblock, what lightweight mode
    /// journals.
    pub bitmap_blocks: HashSet<u64>,
}
