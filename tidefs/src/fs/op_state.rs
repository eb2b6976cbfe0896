//! What one operation carries while it runs under the metadata lock, its handle: whether it
//! acts for lightweight inodes only, its undo record, the device reads it deferred out of
//! the lock, the records of writes without the lock its reads folded in, the orphans it left
//! to be freed in steps, the dirty pages when it began, and why it failed after its first
//! change. `Meta::begin_op` starts the undo record and resets the rest but the reads, which
//! `Inner::lock_meta_reading` starts and ends around each pass (taking the failure too);
//! `Meta::end_op` / `Meta::rollback_op` close the undo record (docs/DESIGN.md §4.1).
//! Operations still run one at a time, so `Meta` holds one; it is the state each would carry
//! for itself once they run side by side (docs/DESIGN.md §8).

use std::collections::HashMap;

use crate::format::ext4::inode::Inode;
use crate::format::ext4::superblock::Superblock;

use super::alloc_state::GroupInfo;
use super::derived::Derived;

/// See the module documentation.
#[derive(Default)]
pub(crate) struct OpState {
    /// While an operation runs: whether every inode it acts for is `lightweight` (`None`:
    /// it named none yet). See [`Meta::op_is_lightweight`](super::meta::Meta::op_is_lightweight).
    pub light: Option<bool>,
    /// While an operation runs: what it changed outside the buffer cache (see [`OpUndo`]).
    pub undo: Option<OpUndo>,
    /// Inodes the running operation left on the orphan list to be freed in steps, each its
    /// own transaction, after it (their blocks lie in more groups than one transaction can
    /// carry the bitmaps of; `Meta::free_step`). Emptied when an operation begins.
    pub free_in_steps: Vec<u32>,
    /// Device reads of the running operation, deferred out of the lock inside
    /// `Inner::lock_meta_reading` (`fs/deferred_reads.rs`).
    pub reads: super::deferred_reads::DeferredReads,
    /// For each inode the running operation read, the sequence number of the record of writes
    /// without the lock (`fs/cached_writes.rs`) its first read folded in, 0 if none: when the
    /// operation stores the inode, that record (or an older one) has reached it, whatever
    /// copy it stores (every copy was read at or after that first read).
    pub pending_seen: HashMap<u32, u64>,
    /// What made the last operation of `Inner::lock_meta_reading` fail after it had changed
    /// metadata: a device error or damage found half-way (or a check that came after a
    /// change, which would be a bug: every other failure is found before the first change,
    /// docs/DESIGN.md §4.1). `Inner::lock_meta_reading` takes it and puts the file system in
    /// its error state, so nothing of the running transaction reaches the journal.
    pub failed_after_change: Option<String>,
    /// The dirty pages when the last operation began (`Meta::begin_op`): one that ends with
    /// more added pages, and pays for the commit they start (`Fs::with_meta`).
    pub dirty_at_op_start: usize,
}

/// What one operation changed outside the buffer cache, kept while it runs so that a failure
/// half-way (no space, an I/O error, corruption found) takes the whole operation back: a commit
/// never sees half an operation. The cache keeps the pre-images of the blocks themselves.
pub(crate) struct OpUndo {
    pub(super) sb: Superblock,
    pub(super) sb_dirty: bool,
    pub(super) block_cursor: u64,
    pub(super) next_generation: u32,
    /// Group summaries before their first change.
    pub(super) groups: Vec<(u32, GroupInfo)>,
    /// Changes to the revoke set, oldest first: (block, whether it was revoked before).
    pub(super) revoked: Vec<(u64, bool)>,
    /// Runs of blocks (first, length) this operation put in quarantine.
    pub(super) quarantined: Vec<(u64, u64)>,
    pub(super) freed_running_len: usize,
    pub(super) late_frees_len: usize,
    /// Directories whose name index this operation built or changed, inodes whose block map
    /// it loaded, lent or put back, and inodes whose mode record it loaded or stored: what a
    /// rollback of metadata must forget (the others were derived from blocks the operation
    /// did not change).
    pub(super) derived: Vec<Derived>,
    /// Inodes whose cached attributes this operation forgot (`Meta::forget_attr_in_op`), with
    /// the inode as it last wrote it, if it did: cached again if it ends well (`Meta::end_op`),
    /// so that a `getattr` or a read after a write need not take the lock; a rollback leaves
    /// them forgotten.
    pub(super) forgot: HashMap<u32, Option<Inode>>,
    /// Inodes this operation opened a handle on (an `O_TMPFILE`): a rollback drops the
    /// handles again, so an operation taken back holds none.
    pub(super) opened: Vec<u32>,
    /// Inodes whose times this operation changed, with whether they had changed unseen
    /// before (`NameCache::changed_unseen`): a rollback puts back those that had been seen,
    /// so a later change is stamped by the rule the taken-back one found.
    pub(super) times: Vec<(u32, bool)>,
    /// A file this operation wrote, truncated or created, with its mode, found or left without
    /// capabilities: it may take writes without the lock once the operation ends well
    /// (`Meta::allow_cached_writes`, `fs/cached_writes.rs`), and the spare blocks those
    /// writes use are topped up then.
    pub(super) publish_write: Option<(u32, super::api::DataMode)>,
}
