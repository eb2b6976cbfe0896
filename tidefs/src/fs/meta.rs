//! The metadata state guarded by the file-system lock: superblock, group summaries, the buffer
//! cache, the running transaction's revokes and freed blocks, and the block and inode
//! allocators. Every change here lands in a cached block that the running transaction owns.
//!
//! Invariants:
//! - every modified metadata block is marked dirty in the cache in the same critical section
//!   that modified it, with its checksum already updated;
//! - a block freed by a transaction that has not committed is never handed out again (it sits
//!   in `quarantine`), so ordered-mode data never overwrites a block that the last committed
//!   metadata still points to;
//! - `groups[g]` always equals group descriptor `g` as stored in its cached GDT block;
//! - descriptors were checked at load: counts fit the group, bitmaps and inode tables lie
//!   inside the file system and overlap neither each other, the superblock copies nor the
//!   journal (`layout` records them all);
//! - a bitmap is used only after it matched its descriptor checksum (`GroupInfo::verified`);
//!   a group whose bitmap failed is `bad` and never allocated from again;
//! - no inode read through `read_inode` has a size past the format's limits.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::cache::BlockCache;
use crate::dev::BlockDevice;
use crate::format::ext4::group_desc::{
    bitmap_checksum, GroupDesc, GroupDescRef, BG_BLOCK_UNINIT, BG_INODE_UNINIT,
};
use crate::format::ext4::inode::Inode;
use crate::format::ext4::superblock::{Superblock, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use crate::journal::Journal;

use super::api::DataMode;
use super::layout::{FixedRun, Layout};
use crate::{FsError, Result};

/// Devices and journal, shared outside the lock.
pub(crate) struct Io {
    pub dev: Arc<dyn BlockDevice>,
    pub journal: Journal,
    /// Byte counters of the fs device.
    pub counted: Arc<crate::dev::CountingDevice>,
    /// Whether the journal lives on the fs device (its writes are then counted there too).
    pub internal_journal: bool,
}

/// Fixed geometry derived from the superblock at mount.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inode_size: u32,
    pub desc_size: u32,
    pub groups: u32,
    pub first_ino: u32,
    pub csum_seed: Option<u32>,
    pub extra_isize: u16,
}

impl Geometry {
    pub fn from_superblock(sb: &Superblock) -> Result<Geometry> {
        let groups = u32::try_from(sb.group_count())
            .map_err(|_| FsError::corrupt("too many block groups"))?;
        let inode_size = u32::from(sb.inode_size());
        let extra = if inode_size > 128 {
            sb.want_extra_isize().max(sb.min_extra_isize()).max(32)
        } else {
            0
        };
        Ok(Geometry {
            block_size: sb.block_size(),
            blocks_count: sb.blocks_count(),
            first_data_block: u64::from(sb.first_data_block()),
            blocks_per_group: sb.blocks_per_group(),
            inodes_per_group: sb.inodes_per_group(),
            inode_size,
            desc_size: sb.desc_size(),
            groups,
            first_ino: sb.first_ino(),
            csum_seed: sb.csum_seed(),
            extra_isize: extra.min(u16::try_from(inode_size.saturating_sub(128)).unwrap_or(0)),
        })
    }

    pub fn bs(&self) -> usize {
        self.block_size as usize
    }

    /// Block and byte offset of group descriptor `g` in the primary table.
    pub fn desc_location(&self, g: u32) -> (u64, usize) {
        let byte = u64::from(g) * u64::from(self.desc_size);
        let bs = u64::from(self.block_size);
        (self.first_data_block + 1 + byte / bs, (byte % bs) as usize)
    }

    pub fn group_of_block(&self, b: u64) -> u32 {
        ((b - self.first_data_block) / u64::from(self.blocks_per_group)) as u32
    }

    pub fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Blocks in group `g` (the last group may be short).
    pub fn blocks_in_group(&self, g: u32) -> u32 {
        let first = self.group_first_block(g);
        (self.blocks_count - first).min(u64::from(self.blocks_per_group)) as u32
    }

    pub fn valid_ino(&self, ino: u64) -> bool {
        ino >= 1 && ino <= u64::from(self.inodes_per_group) * u64::from(self.groups)
    }

    /// Most logical blocks a file may have: logical block numbers are 32 bits and ext4 keeps
    /// the last one unused (`ext4_max_size` with extents).
    pub fn max_file_blocks(&self) -> u64 {
        (1u64 << 32) - 1
    }

    /// Largest valid `i_size` of a regular file: 16 TiB - 4 KiB with 4 KiB blocks.
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_blocks() * u64::from(self.block_size)
    }

    /// Blocks of one group's inode table.
    pub fn itable_blocks(&self) -> u64 {
        (u64::from(self.inodes_per_group) * u64::from(self.inode_size))
            .div_ceil(u64::from(self.block_size))
    }

    /// Blocks at the start of group `g` that hold a superblock copy, the group-descriptor table
    /// and its reserved blocks (0 in a group without a copy).
    pub fn sb_copy_blocks(&self, sb: &Superblock, g: u32) -> u64 {
        if sb.group_has_super(u64::from(g)) {
            1 + sb.gdt_blocks() + u64::from(sb.reserved_gdt_blocks())
        } else {
            0
        }
    }

    /// The superblock and group-descriptor copies of every group, as fixed runs (group 0's
    /// also covers the boot block before the superblock). They depend on the superblock only,
    /// so they can be checked before the descriptors are read.
    pub fn sb_copy_runs(&self, sb: &Superblock) -> Vec<FixedRun> {
        (0..self.groups)
            .filter(|g| self.sb_copy_blocks(sb, *g) > 0)
            .map(|g| {
                let first = self.group_first_block(g);
                FixedRun {
                    start: if g == 0 { 0 } else { first },
                    end: (first + self.sb_copy_blocks(sb, g)).min(self.blocks_count),
                    what: "superblock and group descriptor copy",
                    group: Some(g),
                }
            })
            .collect()
    }

    /// The bits of a bitmap checksum a descriptor stores: the low half only in 32-byte
    /// descriptors.
    pub fn bitmap_csum_mask(&self) -> u32 {
        if self.desc_size >= 64 {
            u32::MAX
        } else {
            0xFFFF
        }
    }
}

/// Largest directory tidefs accepts: ext4 without the largedir feature reads a directory's
/// size from `i_size_lo` only and e2fsck refuses directories of 2 GiB and more.
pub(crate) const MAX_DIR_BYTES: u64 = (1 << 31) - 1;

/// `GroupInfo::verified` bit: the block bitmap matched its descriptor checksum.
const VERIFIED_BLOCK_BITMAP: u8 = 1;
/// `GroupInfo::verified` bit: the inode bitmap matched its descriptor checksum.
const VERIFIED_INODE_BITMAP: u8 = 2;

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

/// What one operation changed outside the buffer cache, kept while it runs so that a failure
/// half-way (no space, an I/O error, corruption found) takes the whole operation back: a commit
/// never sees half an operation. The cache keeps the pre-images of the blocks themselves.
pub(crate) struct OpUndo {
    sb: Superblock,
    sb_dirty: bool,
    block_cursor: u64,
    next_generation: u32,
    /// Group summaries before their first change.
    groups: Vec<(u32, GroupInfo)>,
    /// Changes to the revoke set, oldest first: (block, whether it was revoked before).
    revoked: Vec<(u64, bool)>,
    /// Blocks this operation put in quarantine.
    quarantined: Vec<u64>,
    freed_running_len: usize,
    late_frees_len: usize,
}

/// The state behind the file-system lock.
pub(crate) struct Meta {
    pub geo: Geometry,
    pub sb: Superblock,
    pub groups: Vec<GroupInfo>,
    pub cache: BlockCache,
    /// Tid of the running transaction.
    pub tid: u32,
    /// Blocks freed by the running transaction that need revoke records.
    pub revoked: BTreeSet<u64>,
    /// Blocks freed by the running transaction (released from quarantine after its commit).
    pub freed_running: Vec<u64>,
    /// Blocks that must not be allocated yet.
    pub quarantine: HashSet<u64>,
    /// Where the next block search starts, per flow of allocation.
    pub block_cursor: u64,
    pub read_only: bool,
    /// The superblock's free counts changed and must be copied into its block.
    pub sb_dirty: bool,
    /// Block maps of inodes in use, loaded on first access.
    pub maps: HashMap<u32, super::extent_map::ExtentMap>,
    /// Name indexes of directories, built on first access.
    pub dirs: HashMap<u32, super::dir_index::DirIndex>,
    /// Open handles per inode.
    pub open: HashMap<u32, u32>,
    /// Next inode generation number.
    pub next_generation: u32,
    /// Copies of the blocks of the transaction being committed, until the journal holds them.
    pub committing: HashMap<u64, Arc<[u8]>>,
    /// Data mode of files (mount-wide for now; looked up per inode through `data_mode`).
    pub default_mode: DataMode,
    /// While an operation runs: what it changed outside the buffer cache (see [`OpUndo`]).
    pub op_undo: Option<OpUndo>,
    /// Lightweight mode: frees made by the running transaction, applied to the bitmaps once
    /// its in-place writes are durable (see [`LateFree`]).
    pub late_frees: Vec<LateFree>,
    /// Block and inode bitmap blocks: with the GDT and the superblock, what lightweight mode
    /// journals.
    pub bitmap_blocks: HashSet<u64>,
    /// The blocks file data may use; set from the group descriptors by `load_groups`.
    pub layout: Arc<Layout>,
    /// File data not yet written back (delayed allocation).
    pub data: super::datacache::DataCache,
    /// For each inode changed by a transaction not known durable yet, the tids of its last
    /// change and of its last change that fdatasync must wait for (anything but timestamps).
    pub ino_tids: HashMap<u32, InodeTids>,
}

/// The transactions that hold an inode's last changes (see [`Meta::ino_tids`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InodeTids {
    /// Last change of any kind (fsync waits for it).
    pub any: u32,
    /// Last change other than timestamps (fdatasync waits for it), if any.
    pub data: Option<u32>,
}

/// Byte ranges of an on-disk inode that hold only timestamps and the checksum (which follows
/// them): a change confined to these needs no commit for fdatasync. Offsets from the ext4
/// inode layout: i_atime, i_ctime, i_mtime at 0x08..0x14, l_i_checksum_lo at 0x7C..0x7E,
/// i_checksum_hi at 0x82..0x84, i_ctime_extra/i_mtime_extra/i_atime_extra at 0x84..0x90.
const INODE_TIME_FIELDS: [(usize, usize); 3] = [(0x08, 0x14), (0x7C, 0x7E), (0x82, 0x90)];

/// Whether inodes `a` and `b` differ only in timestamps (and so in checksum).
fn only_times_differ(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    for &(lo, hi) in &INODE_TIME_FIELDS {
        let (lo, hi) = (lo.min(a.len()), hi.min(a.len()));
        if a[at..lo] != b[at..lo] {
            return false;
        }
        at = hi;
    }
    a[at..] == b[at..]
}

impl Meta {
    /// Loads block `nr` into the cache (newest committed journal copy first, else home).
    pub fn load(&mut self, io: &Io, nr: u64) -> Result<()> {
        if self.cache.contains(nr) {
            return Ok(());
        }
        if nr >= self.geo.blocks_count {
            return Err(FsError::corrupt(format!(
                "metadata block {nr} is past the end of the file system ({} blocks)",
                self.geo.blocks_count
            )));
        }
        let newest = self
            .committing
            .get(&nr)
            .cloned()
            .or_else(|| io.journal.pending(nr));
        let data: Box<[u8]> = match newest {
            Some(copy) => Box::from(&copy[..]),
            None => {
                let mut buf = vec![0u8; self.geo.bs()].into_boxed_slice();
                io.dev
                    .read_at(nr * u64::from(self.geo.block_size), &mut buf)?;
                buf
            }
        };
        self.cache.insert(nr, data);
        Ok(())
    }

    /// A metadata block for reading.
    pub fn block(&mut self, io: &Io, nr: u64) -> Result<&[u8]> {
        self.load(io, nr)?;
        // OK to unwrap: `load` just inserted it and nothing ran in between.
        Ok(self.cache.get(nr).expect("block just loaded"))
    }

    /// A metadata block for modification; it joins the running transaction.
    pub fn block_mut(&mut self, io: &Io, nr: u64) -> Result<&mut [u8]> {
        if self.read_only {
            return Err(FsError::ReadOnly);
        }
        self.load(io, nr)?;
        self.unrevoke(nr);
        // OK to unwrap: `load` just inserted it and nothing ran in between.
        Ok(self.cache.get_mut(nr).expect("block just loaded"))
    }

    /// A block newly allocated as metadata: zero-filled, owned by the running transaction,
    /// without reading its old content.
    pub fn new_block_mut(&mut self, nr: u64) -> &mut [u8] {
        self.cache.forget(nr);
        self.cache
            .insert(nr, vec![0u8; self.geo.bs()].into_boxed_slice());
        self.unrevoke(nr);
        // OK to unwrap: inserted just above.
        self.cache.get_mut(nr).expect("block just inserted")
    }

    /// Starts an operation: from here until [`Meta::end_op`] or [`Meta::rollback_op`], every
    /// change it makes can be taken back.
    pub fn begin_op(&mut self) {
        debug_assert!(self.op_undo.is_none(), "operations do not nest");
        self.cache.begin_undo();
        self.data.begin_undo();
        self.op_undo = Some(OpUndo {
            sb: self.sb.clone(),
            sb_dirty: self.sb_dirty,
            block_cursor: self.block_cursor,
            next_generation: self.next_generation,
            groups: Vec::new(),
            revoked: Vec::new(),
            quarantined: Vec::new(),
            freed_running_len: self.freed_running.len(),
            late_frees_len: self.late_frees.len(),
        });
    }

    /// Ends an operation that succeeded: its changes stay in the running transaction.
    pub fn end_op(&mut self) {
        self.cache.end_undo();
        self.data.end_undo();
        self.op_undo = None;
    }

    /// Ends an operation that failed: takes back every change it made, so the running
    /// transaction holds exactly what it held before the operation began. Block maps and
    /// directory indexes are derived from blocks, so they are dropped and rebuilt on next use.
    pub fn rollback_op(&mut self) {
        let Some(u) = self.op_undo.take() else {
            return;
        };
        let changed = self.cache.undo_has_changes()
            || self.data.undo_has_changes()
            || self.sb != u.sb
            || self.sb_dirty != u.sb_dirty
            || !u.groups.is_empty()
            || !u.revoked.is_empty()
            || !u.quarantined.is_empty()
            || self.freed_running.len() != u.freed_running_len
            || self.late_frees.len() != u.late_frees_len;
        if !changed {
            // A failure before any change (a lookup that finds nothing, a refused argument):
            // nothing to take back, and the derived caches stay valid.
            self.cache.end_undo();
            self.data.end_undo();
            return;
        }
        self.cache.rollback();
        self.data.rollback();
        self.sb = u.sb;
        self.sb_dirty = u.sb_dirty;
        self.block_cursor = u.block_cursor;
        self.next_generation = u.next_generation;
        for (g, info) in u.groups.into_iter().rev() {
            // A group found bad stays bad: the failure that is being rolled back found it.
            let bad = self.groups[g as usize].bad;
            self.groups[g as usize] = info;
            self.groups[g as usize].bad |= bad;
        }
        for (nr, was) in u.revoked.into_iter().rev() {
            if was {
                self.revoked.insert(nr);
            } else {
                self.revoked.remove(&nr);
            }
        }
        for b in u.quarantined {
            self.quarantine.remove(&b);
        }
        self.freed_running.truncate(u.freed_running_len);
        self.late_frees.truncate(u.late_frees_len);
        self.maps.clear();
        self.dirs.clear();
    }

    /// Group `g`'s summary for modification (its old value is saved for a rollback).
    fn group_mut(&mut self, g: u32) -> &mut GroupInfo {
        if let Some(u) = &mut self.op_undo {
            if !u.groups.iter().any(|(h, _)| *h == g) {
                u.groups.push((g, self.groups[g as usize]));
            }
        }
        &mut self.groups[g as usize]
    }

    /// Block `nr` is metadata of the running transaction again: no revoke record for it.
    fn unrevoke(&mut self, nr: u64) {
        if self.revoked.remove(&nr) {
            if let Some(u) = &mut self.op_undo {
                u.revoked.push((nr, true));
            }
        }
    }

    /// Whether a commit may make room: frees wait for it before their blocks can be
    /// allocated again, or cached data holds reservations (with their margin for extent-tree
    /// growth) that write-back turns into exact allocations.
    pub fn frees_pending(&self) -> bool {
        !self.quarantine.is_empty() || !self.late_frees.is_empty() || self.data.reserved() > 0
    }

    /// Applies frees held back by lightweight mode (their transaction's in-place writes are
    /// durable now); they join the running transaction.
    pub fn apply_late_frees(&mut self, io: &Io, frees: Vec<LateFree>) -> Result<()> {
        for f in frees {
            match f {
                LateFree::Block { nr, journaled } => self.free_block_now(io, nr, journaled)?,
                LateFree::Inode { ino, is_dir } => self.free_inode_now(io, ino, is_dir)?,
            }
        }
        Ok(())
    }

    /// Forgets the inode tids that transaction `tid` made durable.
    pub fn forget_durable_tids(&mut self, tid: u32) {
        let after = |t: u32| t.wrapping_sub(tid).wrapping_sub(1) < (1 << 31);
        self.ino_tids.retain(|_, t| {
            if t.data.is_some_and(|d| !after(d)) {
                t.data = None;
            }
            after(t.any)
        });
    }

    /// Whether the running transaction holds anything a commit must write.
    pub fn has_uncommitted_changes(&self) -> bool {
        self.cache.dirty_count() > 0
            || !self.revoked.is_empty()
            || !self.freed_running.is_empty()
            || self.sb_dirty
            || self.data.dirty_count() > 0
            || !self.late_frees.is_empty()
    }

    /// Drops block maps and directory indexes when too many have piled up. Both are derived
    /// from cached blocks (every change is stored back at once), so they reload on next use.
    pub fn trim_derived_caches(&mut self) {
        const MAX_MAPS: usize = 200_000;
        const MAX_DIRS: usize = 20_000;
        if self.maps.len() > MAX_MAPS {
            let open = &self.open;
            self.maps.retain(|ino, _| open.contains_key(ino));
        }
        if self.dirs.len() > MAX_DIRS {
            self.dirs.clear();
        }
    }

    /// Data mode of inode `ino` (the mount's mode until per-directory modes exist).
    pub fn data_mode(&self, _ino: u32) -> DataMode {
        self.default_mode
    }

    /// Whether block `nr` is an allocation structure (bitmap, group descriptor table or
    /// superblock): the only blocks lightweight mode journals.
    pub fn is_allocation_block(&self, nr: u64) -> bool {
        let gdt_first = self.geo.first_data_block + 1;
        nr == self.sb_location().0
            || (gdt_first..gdt_first + self.sb.gdt_blocks()).contains(&nr)
            || self.bitmap_blocks.contains(&nr)
    }

    /// The newest copy of block `nr` that is not yet at home, if any: dirty or cached in memory,
    /// being committed, or committed and waiting for checkpoint.
    pub fn unsettled_copy(&self, io: &Io, nr: u64) -> Option<Arc<[u8]>> {
        if let Some(b) = self.cache.get(nr) {
            return Some(Arc::from(b));
        }
        self.committing
            .get(&nr)
            .cloned()
            .or_else(|| io.journal.pending(nr))
    }

    /// Block number and byte offset of the superblock.
    pub fn sb_location(&self) -> (u64, usize) {
        let bs = u64::from(self.geo.block_size);
        (SUPERBLOCK_OFFSET / bs, (SUPERBLOCK_OFFSET % bs) as usize)
    }

    /// Copies the in-memory superblock into its cached block (with a fresh checksum).
    pub fn flush_sb_to_cache(&mut self, io: &Io) -> Result<()> {
        self.sb.update_checksum();
        let (nr, off) = self.sb_location();
        let sb = self.sb.clone();
        let b = self.block_mut(io, nr)?;
        sb.write(&mut b[off..off + SUPERBLOCK_SIZE]);
        self.sb_dirty = false;
        Ok(())
    }

    // ----- group descriptors -----

    /// Reads every group descriptor (checksum verified), checks that its counts fit the group
    /// and that the fixed metadata (superblock copies, GDT, bitmaps, inode tables, internal
    /// journal) lies inside the file system without overlaps, and builds the data layout.
    pub fn load_groups(&mut self, io: &Io) -> Result<()> {
        let mut groups = Vec::with_capacity(self.geo.groups as usize);
        let mut runs = Vec::new();
        let mask = self.geo.bitmap_csum_mask();
        let itable_blocks = self.geo.itable_blocks();
        let ipg = self.geo.inodes_per_group;
        for g in 0..self.geo.groups {
            let (nr, off) = self.geo.desc_location(g);
            let ds = self.geo.desc_size as usize;
            let seed = self.geo.csum_seed;
            let b = self.block(io, nr)?;
            let d = GroupDescRef::new(&b[off..off + ds]);
            if let Some(seed) = seed {
                if d.checksum() != d.compute_checksum(seed, g) {
                    return Err(FsError::corrupt(format!(
                        "group descriptor {g} checksum mismatch"
                    )));
                }
            }
            let info = GroupInfo {
                block_bitmap: d.block_bitmap(),
                inode_bitmap: d.inode_bitmap(),
                inode_table: d.inode_table(),
                free_blocks: d.free_blocks(),
                free_inodes: d.free_inodes(),
                used_dirs: d.used_dirs(),
                flags: d.flags(),
                itable_unused: d.itable_unused(),
                block_bitmap_csum: d.block_bitmap_csum() & mask,
                inode_bitmap_csum: d.inode_bitmap_csum() & mask,
                verified: 0,
                bad: false,
            };
            let blocks = self.geo.blocks_in_group(g);
            for (what, count, limit) in [
                ("free blocks", info.free_blocks, blocks),
                ("free inodes", info.free_inodes, ipg),
                ("directories", info.used_dirs, ipg),
                ("unused inodes", info.itable_unused, ipg),
            ] {
                if count > limit {
                    return Err(FsError::corrupt(format!(
                        "group {g}: {count} {what}, but the group has only {limit}"
                    )));
                }
            }
            let end_of_table = info.inode_table.checked_add(itable_blocks).ok_or_else(|| {
                FsError::corrupt(format!(
                    "group {g}: inode table at block {} overflows",
                    info.inode_table
                ))
            })?;
            for (what, start, end) in [
                (
                    "block bitmap",
                    info.block_bitmap,
                    info.block_bitmap.saturating_add(1),
                ),
                (
                    "inode bitmap",
                    info.inode_bitmap,
                    info.inode_bitmap.saturating_add(1),
                ),
                ("inode table", info.inode_table, end_of_table),
            ] {
                runs.push(FixedRun {
                    start,
                    end,
                    what,
                    group: Some(g),
                });
            }
            groups.push(info);
        }
        runs.extend(self.geo.sb_copy_runs(&self.sb));
        if io.internal_journal {
            for (start, len) in io.journal.device_runs() {
                runs.push(FixedRun {
                    start,
                    end: start.saturating_add(len),
                    what: "journal",
                    group: None,
                });
            }
        }
        let layout = Layout::build(self.geo.first_data_block, self.geo.blocks_count, runs)?;
        self.layout = Arc::new(layout);
        self.bitmap_blocks = groups
            .iter()
            .flat_map(|g| [g.block_bitmap, g.inode_bitmap])
            .collect();
        self.groups = groups;
        Ok(())
    }

    /// Sets the superblock's free block and inode counts from the group descriptors, which
    /// are journaled with every allocation: the superblock's own counts are stale after any
    /// crash (they are written only at mount and unmount), as the kernel also assumes.
    pub fn sum_free_counts(&mut self) {
        let blocks: u64 = self.groups.iter().map(|g| u64::from(g.free_blocks)).sum();
        let inodes: u64 = self.groups.iter().map(|g| u64::from(g.free_inodes)).sum();
        if self.sb.free_blocks_count() != blocks {
            self.sb.set_free_blocks_count(blocks);
            self.sb_dirty = true;
        }
        let inodes = u32::try_from(inodes).unwrap_or(u32::MAX);
        if self.sb.free_inodes_count() != inodes {
            self.sb.set_free_inodes_count(inodes);
            self.sb_dirty = true;
        }
    }

    /// Writes `groups[g]` into its descriptor, with bitmap checksums `bb`/`ib` if given.
    fn store_group(
        &mut self,
        io: &Io,
        g: u32,
        bb_csum: Option<u32>,
        ib_csum: Option<u32>,
    ) -> Result<()> {
        let info = self.groups[g as usize];
        let (nr, off) = self.geo.desc_location(g);
        let ds = self.geo.desc_size as usize;
        let seed = self.geo.csum_seed;
        let b = self.block_mut(io, nr)?;
        let mut d = GroupDesc::new(&mut b[off..off + ds]);
        d.set_free_blocks(info.free_blocks);
        d.set_free_inodes(info.free_inodes);
        d.set_used_dirs(info.used_dirs);
        d.set_flags(info.flags);
        d.set_itable_unused(info.itable_unused);
        if let Some(c) = bb_csum {
            d.set_block_bitmap_csum(c);
        }
        if let Some(c) = ib_csum {
            d.set_inode_bitmap_csum(c);
        }
        if let Some(seed) = seed {
            d.update_checksum(seed, g);
        }
        let mask = self.geo.bitmap_csum_mask();
        let gi = self.group_mut(g);
        if let Some(c) = bb_csum {
            gi.block_bitmap_csum = c & mask;
            gi.verified |= VERIFIED_BLOCK_BITMAP;
        }
        if let Some(c) = ib_csum {
            gi.inode_bitmap_csum = c & mask;
            gi.verified |= VERIFIED_INODE_BITMAP;
        }
        // The superblock's free counts are not logged with each allocation: like the kernel,
        // tidefs sums them from the descriptors at mount and writes them at unmount.
        Ok(())
    }

    // ----- bitmaps -----

    /// Computes the block bitmap of a BLOCK_UNINIT group: group metadata that lies inside it.
    pub(super) fn init_block_bitmap(&self, g: u32) -> Vec<u8> {
        let bs = self.geo.bs();
        let mut bm = vec![0u8; bs];
        let first = self.geo.group_first_block(g);
        let n = u64::from(self.geo.blocks_in_group(g));
        let mut mark = |b: u64| {
            if b >= first && b < first + n {
                let i = (b - first) as usize;
                bm[i / 8] |= 1 << (i % 8);
            }
        };
        for b in first..first + self.geo.sb_copy_blocks(&self.sb, g) {
            mark(b);
        }
        let itable_blocks = self.geo.itable_blocks();
        for h in &self.groups {
            mark(h.block_bitmap);
            mark(h.inode_bitmap);
            for b in h.inode_table..h.inode_table + itable_blocks {
                mark(b);
            }
        }
        for i in n as usize..bs * 8 {
            bm[i / 8] |= 1 << (i % 8);
        }
        bm
    }

    fn block_bitmap_len(&self) -> usize {
        (self.geo.blocks_per_group / 8) as usize
    }

    fn inode_bitmap_len(&self) -> usize {
        (self.geo.inodes_per_group / 8) as usize
    }

    /// Verifies group `g`'s block bitmap (`inode == false`) or inode bitmap against the
    /// checksum in its descriptor, once per mount, as the kernel does before trusting a bitmap
    /// (`ext4_block_bitmap_csum_verify`). An uninitialised bitmap is computed, not read, and
    /// needs no check. A mismatch marks the group bad: it is skipped by the allocators from
    /// then on, and this call fails with a message naming the group and block.
    fn verify_bitmap(&mut self, io: &Io, g: u32, inode: bool) -> Result<()> {
        let info = self.groups[g as usize];
        let (bit, uninit, nr, stored, len, what) = if inode {
            (
                VERIFIED_INODE_BITMAP,
                BG_INODE_UNINIT,
                info.inode_bitmap,
                info.inode_bitmap_csum,
                self.inode_bitmap_len(),
                "inode",
            )
        } else {
            (
                VERIFIED_BLOCK_BITMAP,
                BG_BLOCK_UNINIT,
                info.block_bitmap,
                info.block_bitmap_csum,
                self.block_bitmap_len(),
                "block",
            )
        };
        if info.bad {
            return Err(FsError::corrupt(format!(
                "group {g}: a bitmap failed its checksum earlier; the group is not used"
            )));
        }
        if info.verified & bit != 0 || info.flags & uninit != 0 {
            return Ok(());
        }
        if let Some(seed) = self.geo.csum_seed {
            let mask = self.geo.bitmap_csum_mask();
            let computed = bitmap_checksum(seed, self.block(io, nr)?, len) & mask;
            if computed != stored {
                self.groups[g as usize].bad = true;
                return Err(FsError::corrupt(format!(
                    "group {g}: {what} bitmap at block {nr} fails its checksum (stored \
                     {stored:#x}, computed {computed:#x}); the group is no longer used for \
                     allocation"
                )));
            }
        }
        self.groups[g as usize].verified |= bit;
        Ok(())
    }

    /// Makes sure group `g`'s block bitmap is initialised in the cache and verified.
    fn prepare_block_bitmap(&mut self, io: &Io, g: u32) -> Result<()> {
        let info = self.groups[g as usize];
        if info.flags & BG_BLOCK_UNINIT == 0 {
            return self.verify_bitmap(io, g, false);
        }
        let bm = self.init_block_bitmap(g);
        self.new_block_mut(info.block_bitmap).copy_from_slice(&bm);
        self.group_mut(g).flags &= !BG_BLOCK_UNINIT;
        let c = self
            .geo
            .csum_seed
            .map(|s| bitmap_checksum(s, &bm, self.block_bitmap_len()));
        self.store_group(io, g, c, None)?;
        self.group_mut(g).verified |= VERIFIED_BLOCK_BITMAP;
        Ok(())
    }

    /// Free blocks in the whole file system.
    pub fn free_blocks(&self) -> u64 {
        self.sb.free_blocks_count()
    }

    /// Free blocks that may be promised now: free, less those freed by transactions that have
    /// not committed yet and those reserved for file data not yet written back.
    pub fn allocatable_blocks(&self) -> u64 {
        self.free_blocks()
            .saturating_sub(self.quarantine.len() as u64)
            .saturating_sub(self.data.reserved())
    }

    /// Allocates one block, searching from `goal`. Fails with `NoSpace`.
    pub fn alloc_block(&mut self, io: &Io, goal: u64) -> Result<u64> {
        if self.read_only {
            return Err(FsError::ReadOnly);
        }
        let goal = if goal < self.geo.first_data_block || goal >= self.geo.blocks_count {
            self.block_cursor
        } else {
            goal
        };
        let start_group = self.geo.group_of_block(goal.max(self.geo.first_data_block));
        let groups = self.geo.groups;
        // A group found damaged is skipped (and never used again); its error is returned only
        // when no other group has room.
        let mut damaged = None;
        for step in 0..=groups {
            let g = (start_group + step) % groups;
            if self.groups[g as usize].free_blocks == 0 || self.groups[g as usize].bad {
                continue;
            }
            let first = self.geo.group_first_block(g);
            let n = self.geo.blocks_in_group(g) as usize;
            let from = if step == 0 && goal >= first {
                (goal - first) as usize
            } else {
                0
            };
            match self.prepare_block_bitmap(io, g) {
                Err(FsError::Corrupt(c)) if self.groups[g as usize].bad => {
                    log::error!("{c}");
                    damaged = Some(c);
                    continue;
                }
                r => r?,
            }
            let bb = self.groups[g as usize].block_bitmap;
            let found = {
                self.load(io, bb)?;
                let quarantine = &self.quarantine;
                // OK to unwrap: loaded just above.
                let bm = self.cache.get(bb).expect("bitmap loaded");
                let mut found = None;
                for pass in 0..2 {
                    let (lo, hi) = if pass == 0 {
                        (from, n)
                    } else {
                        (0, from.min(n))
                    };
                    let mut i = lo;
                    while i < hi {
                        if bm[i / 8] == 0xFF && i % 8 == 0 {
                            i += 8;
                            continue;
                        }
                        if bm[i / 8] & (1 << (i % 8)) == 0
                            && !quarantine.contains(&(first + i as u64))
                        {
                            found = Some(i);
                            break;
                        }
                        i += 1;
                    }
                    if found.is_some() {
                        break;
                    }
                }
                found
            };
            let Some(i) = found else { continue };
            // A bitmap that passes its checksum can still be wrong: never hand out a block of
            // fixed metadata (the kernel's "allocating blocks which overlap fs metadata").
            let b = first + i as u64;
            if let Err(why) = self.layout.check_run(b, 1) {
                self.groups[g as usize].bad = true;
                let c = crate::Corrupt::new(format!(
                    "group {g}: the block bitmap marks block {b} free, but {why}; the group is \
                     no longer used for allocation"
                ));
                log::error!("{c}");
                damaged = Some(c);
                continue;
            }
            let len = self.block_bitmap_len();
            let seed = self.geo.csum_seed;
            let bm = self.block_mut(io, bb)?;
            bm[i / 8] |= 1 << (i % 8);
            let c = seed.map(|s| bitmap_checksum(s, bm, len));
            self.group_mut(g).free_blocks -= 1;
            self.store_group(io, g, c, None)?;
            let free = self.sb.free_blocks_count().saturating_sub(1);
            self.sb.set_free_blocks_count(free);
            self.block_cursor = b + 1;
            // Whatever the block held before is gone: no cached copy may shadow its new use.
            self.cache.forget(b);
            return Ok(b);
        }
        Err(damaged.map_or(FsError::NoSpace, FsError::Corrupt))
    }

    /// Frees block `b`. `journaled` says whether it held journaled metadata (then a revoke
    /// record keeps replay from overwriting its next use).
    pub fn free_block(&mut self, io: &Io, b: u64, journaled: bool) -> Result<()> {
        if b < self.geo.first_data_block || b >= self.geo.blocks_count {
            return Err(FsError::corrupt(format!(
                "freeing block {b} outside the file system"
            )));
        }
        if self.default_mode == DataMode::Lightweight {
            let journaled = journaled || self.cache.is_dirty(b) || self.committing.contains_key(&b);
            self.cache.forget(b);
            self.late_frees.push(LateFree::Block { nr: b, journaled });
            return Ok(());
        }
        self.free_block_now(io, b, journaled)
    }

    /// Clears block `b` in its bitmap, in the running transaction.
    fn free_block_now(&mut self, io: &Io, b: u64, journaled: bool) -> Result<()> {
        let g = self.geo.group_of_block(b);
        self.prepare_block_bitmap(io, g)?;
        let bb = self.groups[g as usize].block_bitmap;
        let i = (b - self.geo.group_first_block(g)) as usize;
        let len = self.block_bitmap_len();
        let seed = self.geo.csum_seed;
        let bm = self.block_mut(io, bb)?;
        if bm[i / 8] & (1 << (i % 8)) == 0 {
            return Err(FsError::corrupt(format!("block {b} freed twice")));
        }
        bm[i / 8] &= !(1 << (i % 8));
        let c = seed.map(|s| bitmap_checksum(s, bm, len));
        let gi = self.group_mut(g);
        gi.free_blocks = gi.free_blocks.saturating_add(1);
        self.store_group(io, g, c, None)?;
        let free = self.sb.free_blocks_count().saturating_add(1);
        self.sb.set_free_blocks_count(free);
        // A block that may sit in the journal gets a revoke record, so replay cannot write its
        // old content over its next use; the revoke takes effect at commit, so until then the
        // block is not handed out again. Plain data blocks wait for the commit too, in every
        // mode as in ext4: until the free commits, a crash brings back the file that owned the
        // block, and its contents must still be its own.
        let in_journal = journaled
            || self.cache.is_dirty(b)
            || self.committing.contains_key(&b)
            || io.journal.pending(b).is_some();
        self.cache.forget(b);
        if in_journal && self.revoked.insert(b) {
            if let Some(u) = &mut self.op_undo {
                u.revoked.push((b, false));
            }
        }
        if self.quarantine.insert(b) {
            if let Some(u) = &mut self.op_undo {
                u.quarantined.push(b);
            }
        }
        self.freed_running.push(b);
        Ok(())
    }

    /// Allocates an inode near group `near`. Directories prefer the emptiest group.
    pub fn alloc_inode(&mut self, io: &Io, near: u32, is_dir: bool) -> Result<u32> {
        if self.read_only {
            return Err(FsError::ReadOnly);
        }
        let groups = self.geo.groups;
        let start = if is_dir {
            // Spread directories: the group with the most free inodes, ties to the nearest.
            (0..groups)
                .max_by_key(|g| {
                    (
                        self.groups[*g as usize].free_inodes,
                        u32::MAX - g.abs_diff(near),
                    )
                })
                .unwrap_or(0)
        } else {
            near % groups
        };
        let ipg = self.geo.inodes_per_group;
        for step in 0..groups {
            let g = (start + step) % groups;
            if self.groups[g as usize].free_inodes == 0 || self.groups[g as usize].bad {
                continue;
            }
            self.verify_bitmap(io, g, true)?;
            let info = self.groups[g as usize];
            let len = self.inode_bitmap_len();
            let seed = self.geo.csum_seed;
            if info.flags & BG_INODE_UNINIT != 0 {
                let bs = self.geo.bs();
                let bm = self.new_block_mut(info.inode_bitmap);
                for i in ipg as usize..bs * 8 {
                    bm[i / 8] |= 1 << (i % 8);
                }
                self.group_mut(g).flags &= !BG_INODE_UNINIT;
            }
            let first_usable = if g == 0 { self.geo.first_ino - 1 } else { 0 };
            let bm = self.block_mut(io, info.inode_bitmap)?;
            let mut found = None;
            for i in first_usable as usize..ipg as usize {
                if bm[i / 8] & (1 << (i % 8)) == 0 {
                    found = Some(i);
                    break;
                }
            }
            let Some(i) = found else {
                // The descriptor said free inodes exist but the bitmap disagrees.
                return Err(FsError::corrupt(format!(
                    "group {g}: free inode count disagrees with its bitmap"
                )));
            };
            bm[i / 8] |= 1 << (i % 8);
            let c = seed.map(|s| bitmap_checksum(s, bm, len));
            let gi = self.group_mut(g);
            gi.free_inodes -= 1;
            if is_dir {
                gi.used_dirs = gi.used_dirs.saturating_add(1);
            }
            let used_end = ipg.saturating_sub(gi.itable_unused);
            if i as u32 >= used_end {
                gi.itable_unused = ipg - i as u32 - 1;
            }
            self.store_group(io, g, None, c)?;
            let free = self.sb.free_inodes_count().saturating_sub(1);
            self.sb.set_free_inodes_count(free);
            return Ok(g * ipg + i as u32 + 1);
        }
        Err(FsError::NoSpace)
    }

    /// Frees inode `ino`.
    pub fn free_inode(&mut self, io: &Io, ino: u32, is_dir: bool) -> Result<()> {
        if self.default_mode == DataMode::Lightweight {
            self.late_frees.push(LateFree::Inode { ino, is_dir });
            return Ok(());
        }
        self.free_inode_now(io, ino, is_dir)
    }

    /// Clears inode `ino` in its bitmap, in the running transaction.
    fn free_inode_now(&mut self, io: &Io, ino: u32, is_dir: bool) -> Result<()> {
        let ipg = self.geo.inodes_per_group;
        let g = (ino - 1) / ipg;
        let i = ((ino - 1) % ipg) as usize;
        self.verify_bitmap(io, g, true)?;
        let info = self.groups[g as usize];
        let len = self.inode_bitmap_len();
        let seed = self.geo.csum_seed;
        let bm = self.block_mut(io, info.inode_bitmap)?;
        if bm[i / 8] & (1 << (i % 8)) == 0 {
            return Err(FsError::corrupt(format!("inode {ino} freed twice")));
        }
        bm[i / 8] &= !(1 << (i % 8));
        let c = seed.map(|s| bitmap_checksum(s, bm, len));
        let gi = self.group_mut(g);
        gi.free_inodes = gi.free_inodes.saturating_add(1);
        if is_dir {
            gi.used_dirs = gi.used_dirs.saturating_sub(1);
        }
        self.store_group(io, g, None, c)?;
        let free = self.sb.free_inodes_count().saturating_add(1);
        self.sb.set_free_inodes_count(free);
        Ok(())
    }

    // ----- inodes -----

    fn inode_location(&self, ino: u32) -> Result<(u64, usize)> {
        if !self.geo.valid_ino(u64::from(ino)) {
            return Err(FsError::NotFound);
        }
        let ipg = self.geo.inodes_per_group;
        let g = (ino - 1) / ipg;
        let idx = u64::from((ino - 1) % ipg);
        let byte = idx * u64::from(self.geo.inode_size);
        let bs = u64::from(self.geo.block_size);
        Ok((
            self.groups[g as usize].inode_table + byte / bs,
            (byte % bs) as usize,
        ))
    }

    /// Reads inode `ino` (checksum verified).
    pub fn read_inode(&mut self, io: &Io, ino: u32) -> Result<Inode> {
        let (nr, off) = self.inode_location(ino)?;
        let isz = self.geo.inode_size as usize;
        let seed = self.geo.csum_seed;
        let b = self.block(io, nr)?;
        let inode = Inode::from_bytes(&b[off..off + isz]);
        inode.verify(seed, ino)?;
        self.check_inode_size(ino, &inode)?;
        Ok(inode)
    }

    /// Refuses sizes no valid inode has: a regular file past the format's maximum (the kernel's
    /// `ext4_max_size`), a directory that is not a whole number of blocks or larger than
    /// [`MAX_DIR_BYTES`]. Every loop over a file's blocks relies on this bound.
    fn check_inode_size(&self, ino: u32, inode: &Inode) -> Result<()> {
        let size = inode.size();
        if inode.is_reg() && size > self.geo.max_file_bytes() {
            return Err(FsError::corrupt_inode(
                ino,
                format!(
                    "bad i_size {size}: larger than the largest file the format allows ({})",
                    self.geo.max_file_bytes()
                ),
            ));
        }
        if inode.is_dir() && (size % u64::from(self.geo.block_size) != 0 || size > MAX_DIR_BYTES) {
            return Err(FsError::corrupt_inode(
                ino,
                format!(
                    "bad directory i_size {size}: not a multiple of the block size {} or \
                     above {MAX_DIR_BYTES}",
                    self.geo.block_size
                ),
            ));
        }
        Ok(())
    }

    /// Stores inode `ino` with a fresh checksum, and notes which transaction fsync and
    /// fdatasync of the inode must now wait for.
    pub fn write_inode(&mut self, io: &Io, ino: u32, inode: &mut Inode) -> Result<()> {
        let (nr, off) = self.inode_location(ino)?;
        inode.update_checksum(self.geo.csum_seed, ino);
        let isz = self.geo.inode_size as usize;
        let tid = self.tid;
        let b = self.block_mut(io, nr)?;
        let times_only = only_times_differ(&b[off..off + isz], inode.as_bytes());
        b[off..off + isz].copy_from_slice(inode.as_bytes());
        let t = self.ino_tids.entry(ino).or_insert(InodeTids {
            any: tid,
            data: None,
        });
        t.any = tid;
        if !times_only {
            t.data = Some(tid);
        }
        Ok(())
    }
}
