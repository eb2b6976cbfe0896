//! The metadata state guarded by the file-system lock (`Meta`) and its buffer access: the
//! superblock, the allocator's state (`alloc_state.rs`), the buffer cache and page cache, the
//! block maps, name indexes and mode records derived per inode (`derived.rs`), the running
//! transaction's revokes and logging decisions (`tx_changes.rs`), and the running
//! operation's handle (`op_state.rs`: its undo record, deferred reads and the rest), which
//! `begin_op`, `end_op` and `rollback_op` here open and close. The allocator's logic lives in
//! `alloc.rs` and the inode table in `inode_table.rs`; both work on this state.
//!
//! Invariant: every modified metadata block is marked dirty in the cache in the same critical
//! section that modified it, with its checksum already updated.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cache::BlockCache;
use crate::dev::BlockDevice;
use crate::format::ext4::superblock::{Superblock, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use crate::journal::CommitLog;

use super::alloc_state::{AllocState, GroupInfo};
use super::api::DataMode;
use super::derived::{Derived, DerivedCaches};
use super::layout::Layout;
use super::log_credits::{Reserve, BASE_CREDITS};
use super::op_state::OpUndo;
use super::tx_changes::TxChanges;

pub(crate) use super::geometry::{Geometry, MAX_DIR_BYTES};
use crate::{FsError, Result};

/// Devices and journal, shared outside the lock.
pub(crate) struct Io {
    pub dev: Arc<dyn BlockDevice>,
    /// The commit log (today the jbd2 journal; any `CommitLog` fits).
    pub journal: Box<dyn CommitLog>,
    /// Byte counters of the fs device.
    pub counted: Arc<crate::dev::CountingDevice>,
    /// Whether the journal lives on the fs device (its writes are then counted there too).
    pub internal_journal: bool,
}

/// The superblock's totals and free counts, readable without the metadata lock
/// (`Fs::statfs`). Every change of a free count goes through `Meta::set_free_blocks` or
/// `Meta::set_free_inodes`, which publish it here, and a rollback publishes the counts it
/// restores; so a reader sees the counts as of some moment, at worst in the middle of an
/// operation (as the kernel's own `statfs` counters may be).
pub(crate) struct FreeCounts {
    inodes_count: u64,
    reserved_blocks: u64,
    blocks: AtomicU64,
    inodes: AtomicU64,
}

impl FreeCounts {
    /// The counts of `sb`.
    pub fn of(sb: &Superblock) -> FreeCounts {
        let c = FreeCounts {
            inodes_count: u64::from(sb.inodes_count()),
            reserved_blocks: sb.r_blocks_count(),
            blocks: AtomicU64::new(0),
            inodes: AtomicU64::new(0),
        };
        c.publish(sb);
        c
    }

    /// Takes the free counts of `sb`.
    pub fn publish(&self, sb: &Superblock) {
        self.blocks.store(sb.free_blocks_count(), Ordering::Relaxed);
        self.inodes
            .store(u64::from(sb.free_inodes_count()), Ordering::Relaxed);
    }

    /// Free blocks (reservations for cached data not subtracted).
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Relaxed)
    }

    /// Free inodes.
    pub fn inodes(&self) -> u64 {
        self.inodes.load(Ordering::Relaxed)
    }

    /// Inodes in the file system.
    pub fn inodes_count(&self) -> u64 {
        self.inodes_count
    }

    /// Blocks reserved for the superuser.
    pub fn reserved_blocks(&self) -> u64 {
        self.reserved_blocks
    }
}

/// The state behind the file-system lock.
pub(crate) struct Meta {
    pub geo: Geometry,
    pub sb: Superblock,
    /// The allocator's state (`fs/alloc_state.rs`).
    pub alloc: AllocState,
    pub cache: BlockCache,
    /// Tid of the running transaction.
    pub tid: u32,
    /// The running transaction's revokes and logging decisions (`fs/tx_changes.rs`).
    pub tx: TxChanges,
    pub read_only: bool,
    /// The superblock's free counts changed and must be copied into its block.
    pub sb_dirty: bool,
    /// Block maps, directory name indexes and mode records, by inode (`fs/derived.rs`).
    pub derived: DerivedCaches,
    /// Open handles per inode (shared with the lock-free open and release paths).
    pub open: Arc<super::open_files::OpenFiles>,
    /// Next inode generation number.
    pub next_generation: u32,
    /// The blocks of the transactions being committed, until the journal holds them as
    /// pending: the versions the cache closed each transaction with, shared with it (not
    /// copies), with the tid of the newest transaction that has each. Two transactions may be
    /// in it at once: one whose commit block the journal holds and the next one closing.
    pub committing: HashMap<u64, (u32, Arc<[u8]>)>,
    /// The mode of directories without their own and of the files in them (`-o data=`).
    pub default_mode: DataMode,
    /// The running operation's handle: what it carries while it runs (`fs/op_state.rs`).
    pub op: super::op_state::OpState,
    /// The blocks file data may use; set from the group descriptors by `load_groups`.
    pub layout: Arc<Layout>,
    /// The page cache of file data (delayed allocation). Shared with `Fs::read`, which serves
    /// cached pages without this lock (`Inner::pages`). Taken after this lock; while it is
    /// held only the name cache's locks are taken (docs/DESIGN.md §2.5, lock order).
    pub data: Arc<parking_lot::Mutex<super::datacache::DataCache>>,
    /// The running tid (mirror of `tid`), commit write-back windows and, for each inode
    /// changed by a transaction not known durable yet, the tids of its last change and of its
    /// last change that fdatasync must wait for (anything but timestamps): what fsync planning
    /// reads without this lock (`Inner::sync`).
    pub sync: Arc<super::sync_view::SyncView>,
    /// What `lookup` and `getattr` serve without this lock; entries are dropped here, under
    /// the lock, as their inodes and names change.
    pub names: Arc<super::namecache::NameCache>,
    /// The superblock's free counts, for `Fs::statfs` without this lock.
    pub free: Arc<FreeCounts>,
    /// Inodes whose block count changed without an operation on them asking for it: write-back
    /// added or removed extent-tree blocks, an attribute change allocated or freed the
    /// attribute block. Taken by each commit and by each attribute change, and passed to the
    /// listener of [`super::Fs::on_blocks_changed`] (a server whose clients cache attributes).
    pub blocks_changed: Vec<u32>,
    /// The journal space the running operation reserved (`fs/log_credits.rs`), and the
    /// counts of operations that waited for room or overran their reservation.
    pub credits: super::log_credits::LogCredits,
    /// The last inode-table block found in no memory copy, per slot of block groups
    /// (`Meta::read_ahead_inode_table`): read-ahead follows misses that walk forward.
    pub itable_miss: super::itable_misses::InodeTableMisses,
}

/// Reads block `nr` (of `bs` bytes) from the fs device.
pub(crate) fn read_block(io: &Io, nr: u64, bs: usize) -> Result<Box<[u8]>> {
    let mut buf = vec![0u8; bs].into_boxed_slice();
    io.dev.read_at(nr * bs as u64, &mut buf)?;
    Ok(buf)
}

/// The longest run of blocks [`read_blocks`] reads with one device read (1 MiB of 4 KiB
/// blocks, 16 MiB of 64 KiB ones).
const MAX_READ_RUN: usize = 256;

/// A block read by [`read_blocks`]: its number, its tag, its bytes.
pub(crate) type TaggedBlock = (u64, u64, Box<[u8]>);

/// Reads the blocks of `wanted` (block numbers with a tag each, the tag handed back with the
/// block) from the fs device, in order of block number, each run of consecutive blocks with
/// one read of at most [`MAX_READ_RUN`] blocks. A read that fails fails the call, unless the
/// blocks are read `ahead` of their use: then each block of the run is tried alone, and
/// those that fail are left out (and listed in `failed`).
pub(crate) fn read_blocks(
    io: &Io,
    mut wanted: Vec<(u64, u64)>,
    bs: usize,
    ahead: bool,
    failed: &mut Vec<u64>,
) -> Result<Vec<TaggedBlock>> {
    wanted.sort_unstable();
    wanted.dedup_by_key(|w| w.0);
    let mut out = Vec::with_capacity(wanted.len());
    let mut rest = &wanted[..];
    while let Some(&(first, _)) = rest.first() {
        let run = rest
            .iter()
            .take(MAX_READ_RUN)
            .enumerate()
            .take_while(|&(k, &(nr, _))| nr == first + k as u64)
            .count();
        let mut buf = vec![0u8; run * bs];
        match io.dev.read_at(first * bs as u64, &mut buf) {
            Ok(()) => {
                for (&(nr, tag), bytes) in rest[..run].iter().zip(buf.chunks_exact(bs)) {
                    out.push((nr, tag, bytes.into()));
                }
            }
            Err(e) if !ahead => return Err(e.into()),
            Err(_) => {
                for &(nr, tag) in &rest[..run] {
                    match read_block(io, nr, bs) {
                        Ok(bytes) => out.push((nr, tag, bytes)),
                        Err(_) => failed.push(nr),
                    }
                }
            }
        }
        rest = &rest[run..];
    }
    Ok(out)
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
        // A newer copy in memory is shared, not copied: the cache holds the same version.
        let data: Arc<[u8]> = match self.copy_past_the_cache(io, nr) {
            Some(copy) => copy,
            None => self.read_home(io, nr)?.into(),
        };
        self.cache.insert(nr, data);
        Ok(())
    }

    /// Reads block `nr` from its home location, for a caller that found no newer copy in
    /// memory. Inside `Inner::lock_meta_reading` the read is not done here, under the lock:
    /// the bytes come from an earlier read without the lock if still current, else the block
    /// is asked for and the operation stops (`fs/deferred_reads.rs`).
    pub fn read_home(&mut self, io: &Io, nr: u64) -> Result<Box<[u8]>> {
        self.read_homes(io, &[nr])?
            .pop()
            .ok_or(FsError::Invalid("no block read"))
    }

    /// [`Meta::read_home`] of several blocks, in the order given, with one stop for all
    /// those not fetched yet.
    pub fn read_homes(&mut self, io: &Io, nrs: &[u64]) -> Result<Vec<Box<[u8]>>> {
        let stamped: Vec<(u64, u64)> = nrs
            .iter()
            .map(|&nr| (nr, self.cache.removal_stamp(nr)))
            .collect();
        let changed = self.changed_in_op();
        if let Some(r) = self.op.reads.home_copies(&stamped, changed) {
            return r;
        }
        let bs = self.geo.bs();
        nrs.iter().map(|&nr| read_block(io, nr, bs)).collect()
    }

    /// Inside an operation whose device reads are deferred and which has changed nothing yet,
    /// asks for every block of `blocks` held in no memory copy (cache, commit in flight,
    /// journal) at once, up to `deferred_reads::MAX_BATCH` (they join the cache before the
    /// operation runs again, [`Meta::keep_read_ahead`]): the operation stops and runs again
    /// with them at hand, one stop where reading them as they are used would take one each
    /// (`fs/deferred_reads.rs`). Anywhere else, when at most one block is missing, or when
    /// `blocks` are more than a quarter of the cache's capacity (they could not all stay in
    /// it), does nothing: they are read as they are used.
    pub fn prefetch(&mut self, io: &Io, blocks: impl IntoIterator<Item = u64>) -> Result<()> {
        if !self.op.reads.deferring() || self.changed_in_op() {
            return Ok(());
        }
        let blocks: Vec<u64> = blocks.into_iter().collect();
        // The cache runs between three quarters full and full: a quarter is what it takes
        // without evicting what it just took.
        let room = self.cache.capacity() / 4;
        if blocks.len() > room {
            // The walk cannot stay in the cache whole: batches would evict the ones before
            // them, read again at each run. Its blocks are read as it uses them (one stop
            // each, then under the lock).
            return Ok(());
        }
        let count = self.geo.blocks_count;
        let candidates: Vec<(u64, u64)> = blocks
            .into_iter()
            .filter(|&nr| nr < count && !self.in_memory(io, nr))
            .map(|nr| (nr, self.cache.removal_stamp(nr)))
            .collect();
        let missing = self.op.reads.missing(candidates, room);
        if missing.len() < 2 {
            return Ok(());
        }
        Err(self.op.reads.want_all(missing))
    }

    /// Read-ahead for a walk through `blocks` from the first on: when one of the first
    /// `window` blocks is in no memory copy, [`Meta::prefetch`] of the `window` blocks from
    /// it. A walk whose next `window` blocks are at hand does not stop, so it stops about once
    /// per window, not each time it moves on.
    pub fn read_ahead(&mut self, io: &Io, blocks: &[u64], window: usize) -> Result<()> {
        let near = &blocks[..blocks.len().min(window)];
        let Some(from) = near.iter().position(|&nr| !self.in_memory(io, nr)) else {
            return Ok(());
        };
        let end = blocks.len().min(from + window);
        self.prefetch(io, blocks[from..end].iter().copied())
    }

    /// The blocks of `first..first + len` that a closed transaction not yet durable holds
    /// (`committing`), sorted.
    pub(crate) fn committing_in(&self, first: u64, len: u64) -> Vec<u64> {
        let committing = &self.committing;
        crate::cache::blocks_held_in(
            first,
            len,
            committing.len(),
            committing.keys().copied(),
            |b| committing.contains_key(&b),
        )
    }

    /// Whether a copy of block `nr` may come back from the log over its home location: a live
    /// transaction logged it (`is_logged`, or its copy is still pending), or a transaction
    /// closed and not yet durable did (`committing`: one whose commit block the journal holds
    /// is not live yet, docs/DESIGN.md §4.2). A write of the block in place outside the log
    /// must then revoke it, or keep journaling it.
    pub(crate) fn log_may_hold(&self, io: &Io, nr: u64) -> bool {
        self.committing.contains_key(&nr)
            || io.journal.is_logged(nr)
            || io.journal.pending(nr).is_some()
    }

    /// Whether a copy of block `nr` newer than or as new as its home location is in memory:
    /// cached, in the commit in flight, or in the journal waiting for checkpoint.
    pub(crate) fn in_memory(&self, io: &Io, nr: u64) -> bool {
        self.cache.contains(nr)
            || self.committing.contains_key(&nr)
            || io.journal.pending(nr).is_some()
    }

    /// Blocks read ahead without the lock (asked for by [`Meta::prefetch`]) join the cache as
    /// clean blocks, outside any operation, those still current: no memory holds a copy, and
    /// their removal stamp has not moved since their read was planned, so none left the
    /// cache or was freed meanwhile (`BlockCache::forget_run` moves it even for a block it
    /// does not hold). A pointer led to each when it was asked for; none may lead to it now,
    /// which is why the stamp must cover frees too.
    pub fn keep_read_ahead(&mut self, io: &Io, blocks: Vec<TaggedBlock>) {
        // All judged before any is inserted: an insertion into a full cache evicts, which
        // moves the stamps of other buckets.
        let current: Vec<(u64, Box<[u8]>)> = blocks
            .into_iter()
            .filter(|&(nr, stamp, _)| {
                self.cache.removal_stamp(nr) == stamp && !self.in_memory(io, nr)
            })
            .map(|(nr, _, bytes)| (nr, bytes))
            .collect();
        for (nr, bytes) in current {
            self.cache.insert(nr, bytes);
        }
    }

    /// Block `nr` of file data joins the running transaction with content `bytes` (a file's
    /// page, shared, not copied), of which only `changed` differs from its committed version
    /// (byte-range journaling).
    pub fn log_data_ranges(
        &mut self,
        nr: u64,
        bytes: Arc<[u8]>,
        changed: &crate::cache::ByteRanges,
    ) {
        self.cache.put_with_ranges(nr, bytes, changed);
        self.unrevoke(nr);
        self.note_changed(nr);
    }

    /// Notes which kind of operation changed block `nr` (see [`Meta::strict_blocks`]).
    fn note_changed(&mut self, nr: u64) {
        if self.op_is_lightweight() {
            self.tx.light = true;
        } else {
            self.tx.strict_blocks.insert(nr);
        }
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
        self.note_changed(nr);
        // OK to unwrap: `load` just inserted it and nothing ran in between.
        Ok(self.cache.get_mut(nr).expect("block just loaded"))
    }

    /// A block newly allocated as metadata: zero-filled, owned by the running transaction,
    /// without reading its old content.
    pub fn new_block_mut(&mut self, nr: u64) -> &mut [u8] {
        self.new_block_shared(nr, vec![0u8; self.geo.bs()].into());
        // OK to unwrap: inserted just above.
        self.cache.get_mut(nr).expect("block just inserted")
    }

    /// Block `nr` as a new version in the running transaction, logged whole (*fresh*: a
    /// block just allocated, or a block of file data journaled whole), with `bytes` (a whole
    /// block) as its content, shared with whoever holds them (a file's page joining a
    /// transaction that journals data): not copied; a later change of either copies it first
    /// (`Arc::make_mut`).
    pub fn new_block_shared(&mut self, nr: u64, bytes: Arc<[u8]>) {
        debug_assert_eq!(bytes.len(), self.geo.bs(), "a whole block");
        self.cache.insert_new(nr, bytes);
        self.unrevoke(nr);
        self.note_changed(nr);
    }

    /// Starts an operation: from here until [`Meta::end_op`] or [`Meta::rollback_op`], every
    /// change it makes can be taken back.
    fn begin_op(&mut self) {
        debug_assert!(self.op.undo.is_none(), "operations do not nest");
        self.op.light = None;
        self.op.free_in_steps.clear();
        self.cache.begin_undo();
        {
            let mut pages = self.data.lock();
            pages.begin_undo();
            self.op.dirty_at_op_start = pages.dirty_count();
        }
        self.op.undo = Some(OpUndo {
            sb: self.sb.clone(),
            sb_dirty: self.sb_dirty,
            block_cursor: self.alloc.block_cursor,
            next_generation: self.next_generation,
            groups: Vec::new(),
            revoked: Vec::new(),
            quarantined: Vec::new(),
            freed_running_len: self.alloc.freed_running.len(),
            late_frees_len: self.alloc.late_frees.len(),
            derived: Vec::new(),
            forgot: HashMap::new(),
            opened: Vec::new(),
            times: Vec::new(),
            publish_write: None,
        });
        self.op.pending_seen.clear();
    }

    /// Runs `f` as one operation: kept whole if it succeeds, taken back whole if it fails.
    pub fn run_op<T>(&mut self, f: impl FnOnce(&mut Meta) -> Result<T>) -> Result<T> {
        // No bound: always an answer.
        self.run_op_within(None, f).unwrap_or(Err(FsError::Invalid(
            "operation larger than any transaction",
        )))
    }

    /// [`Meta::run_op`] within a bound on what the running transaction may need of the log: `bound`
    /// is (that many journal blocks, revoke records per journal block). Every operation reserves
    /// the journal blocks it may change before its first change ([`BASE_CREDITS`], and more through
    /// [`Meta::reserve_log`] while it plans; `fs/log_credits.rs`): one for which the transaction
    /// has no room left does not start, or stops where it reserves, and None tells the caller to
    /// commit what came before and run it again. An operation that needs more than an empty
    /// transaction carries fails (EINVAL) before its first change; operations that can be large go
    /// in parts (fallocate, frees, journaled writes, mode changes of large directories). One that
    /// ends having changed more than it reserved is counted as an overrun (an estimate is wrong)
    /// and kept: a change once made is never taken back for room (the bound is three quarters of
    /// the log, and a commit fails only past all of it). An operation that fails after its first
    /// change is taken back in memory, and `Inner::lock_meta_reading` puts the file system in its
    /// error state
    /// ([`OpState::failed_after_change`](super::op_state::OpState::failed_after_change)). The undo
    /// record covers what an operation changes (blocks, pages, allocator and revoke state, derived
    /// caches, the handles it opened, the "changed unseen" marks of times), so an operation that
    /// stopped before its first change and runs again finds the state it first found, and a file
    /// system in its error state serves reads of whole operations only.
    pub fn run_op_within<T>(
        &mut self,
        bound: Option<(usize, usize)>,
        f: impl FnOnce(&mut Meta) -> Result<T>,
    ) -> Option<Result<T>> {
        let per = bound.map_or(1, |(_, per)| per);
        let before = bound.map(|(limit, per)| (limit, self.transaction_size(per)));
        self.credits.begin(before);
        if let Err(e) = self.credits.reserve(BASE_CREDITS, false) {
            return (!self.credits.wants_room()).then_some(Err(e));
        }
        self.begin_op();
        let r = f(self);
        // An operation that stopped for room in the journal (before its first change: a
        // reservation after it is kept, `LogCredits::reserve`) runs again after a commit.
        if self.credits.wants_room() {
            self.rollback_op(None);
            return None;
        }
        // An operation that stopped for a deferred read (before its first change) is taken
        // back even if it went on (someone swallowed the error): it runs again once the block
        // is read.
        if r.is_ok() && !self.op.reads.stopped() {
            if let Some(over) = self.credits.end(self.log_used(per)) {
                // Kept, even past the bound: a change is never taken back once made. A commit
                // fails only past the whole log, a quarter beyond the bound.
                log::warn!(
                    "an operation changed {over} journal block(s) more than it reserved \
                     (docs/DESIGN.md §4.1)"
                );
            }
            self.end_op();
        } else {
            self.rollback_op(r.as_ref().err());
        }
        Some(r)
    }

    /// Reserves `credits` journal blocks for the running operation, beyond the
    /// [`BASE_CREDITS`] every operation has (`fs/log_credits.rs`). Called while it plans,
    /// before its first change: when the running transaction has no room for them, the
    /// operation stops (an error it returns as is) and runs again after a commit.
    pub fn reserve_log(&mut self, credits: usize) -> Result<()> {
        // Outside an operation (orphans freed at mount and unmount, which commit as they
        // go), nothing is reserved.
        let Some(u) = &self.op.undo else {
            return Ok(());
        };
        let changed = self.changed_since(u);
        self.credits.reserve(credits, changed)
    }

    /// [`Meta::reserve_log`] of `credits` for `what`: the running operation may plan the
    /// same change more than once (an unlink fetches for the free before its first change,
    /// and the free fetches again), and reserves only what it did not reserve for it yet.
    pub fn reserve_log_for(&mut self, what: Reserve, credits: usize) -> Result<()> {
        let more = self.credits.more_for(what, credits);
        if more == 0 {
            return Ok(());
        }
        self.reserve_log(more)
    }

    /// The journal blocks the running operation changed so far, those the transaction held
    /// already included, and the blocks of the revoke records it added (`revokes_per_block`
    /// to a block, as the log packs them): what it reserves for, counted as jbd2 counts a
    /// handle's credits, whatever the transaction held before.
    pub fn log_used(&self, revokes_per_block: usize) -> usize {
        let revokes = self.op.undo.as_ref().map_or(0, |u| u.revoked.len());
        self.cache.undo_dirtied() + revokes.div_ceil(revokes_per_block.max(1))
    }

    /// The journal blocks the running transaction will need, about: its dirty blocks, its
    /// revoke records packed `revokes_per_block` to a block, and the pages write-back will
    /// journal (all dirty pages, once data journaling is in use).
    pub fn transaction_size(&self, revokes_per_block: usize) -> usize {
        let journaled_pages = if self.derived.modes.data_journaling_seen() {
            self.data.lock().dirty_count()
        } else {
            0
        };
        self.cache.dirty_count()
            + self.tx.revoked.len().div_ceil(revokes_per_block.max(1))
            + journaled_pages
    }

    /// Ends an operation that succeeded: its changes stay in the running transaction, and the
    /// attributes it forgot of inodes still in use are cached again as it left them.
    fn end_op(&mut self) {
        self.op.light = None;
        self.cache.end_undo();
        self.data.lock().end_undo();
        let Some(u) = self.op.undo.take() else {
            return;
        };
        for (ino, i) in u.forgot {
            if let Some(i) = i.filter(|i| self.in_use(ino, i)) {
                self.attr_cached(ino, &i, false);
            }
        }
        if let Some((ino, mode)) = u.publish_write {
            self.data.lock().writes_mut().publish_mode(ino, mode);
            self.top_up_spare_with_margin(0);
        }
    }

    /// Whether an operation runs and has changed metadata ([`Meta::changed_since`]).
    fn changed_in_op(&self) -> bool {
        self.op.undo.as_ref().is_some_and(|u| self.changed_since(u))
    }

    /// Whether the running operation may still stop to have work done without the lock:
    /// its reads are deferred and it has changed nothing.
    pub fn may_stop(&self) -> bool {
        self.op.reads.deferring() && !self.changed_in_op()
    }

    /// Whether the running operation, begun with undo record `u`, changed metadata: cached
    /// blocks, the superblock, group summaries, revokes, quarantine or the lists of frees.
    fn changed_since(&self, u: &OpUndo) -> bool {
        self.cache.undo_has_changes()
            || self.sb != u.sb
            || self.sb_dirty != u.sb_dirty
            || !u.groups.is_empty()
            || !u.revoked.is_empty()
            || !u.quarantined.is_empty()
            || self.alloc.freed_running.len() != u.freed_running_len
            || self.alloc.late_frees.len() != u.late_frees_len
    }

    /// Ends an operation that failed (`failure`) or stopped before its first change: takes back
    /// every change it made, so the running transaction holds exactly what it held before the
    /// operation began. An operation of `Inner::lock_meta_reading` that failed after a change is
    /// noted in [`OpState::failed_after_change`](super::op_state::OpState::failed_after_change):
    /// the file system goes into its error state, and the rollback only keeps what reads are served
    /// consistent. Block maps, directory indexes and mode records are derived from blocks, so those
    /// the operation built, loaded, lent or changed are dropped and rebuilt on next use (the others
    /// were derived from blocks it did not change, and stay: a create that stops for a cold
    /// inode-table block must not cost the rebuild of its large directory's index, nor the reload
    /// of every mode record). A rollback of pages only keeps them all.
    fn rollback_op(&mut self, failure: Option<&FsError>) {
        self.op.light = None;
        let Some(u) = self.op.undo.take() else {
            return;
        };
        for &ino in &u.opened {
            self.open.release(ino, 1);
        }
        for &(ino, unseen) in u.times.iter().rev() {
            if !unseen {
                self.names.shown(ino);
            }
        }
        let metadata_changed = self.changed_since(&u);
        if let Some(e) = failure.filter(|_| metadata_changed && !self.op.reads.stopped()) {
            if self.op.reads.running() {
                self.op.failed_after_change = Some(e.to_string());
            }
        }
        if !metadata_changed {
            // A failure before any change of metadata (a lookup that finds nothing, a refused
            // argument, a write that failed after filling pages): only pages to take back,
            // and the maps and indexes derived from metadata blocks stay valid (a lent block
            // map that was edited is not put back).
            self.cache.end_undo();
            self.data.lock().rollback();
            return;
        }
        self.cache.rollback();
        self.data.lock().rollback();
        self.sb = u.sb;
        self.free.publish(&self.sb);
        self.sb_dirty = u.sb_dirty;
        self.alloc.block_cursor = u.block_cursor;
        self.next_generation = u.next_generation;
        for (g, info) in u.groups.into_iter().rev() {
            // A group found bad stays bad: the failure that is being rolled back found it.
            let bad = self.alloc.groups[g as usize].bad;
            self.alloc.groups[g as usize] = info;
            self.alloc.groups[g as usize].bad |= bad;
        }
        for (nr, was) in u.revoked.into_iter().rev() {
            if was {
                self.tx.revoked.insert(nr);
            } else {
                self.tx.revoked.remove(&nr);
            }
        }
        for (first, len) in u.quarantined {
            self.alloc.quarantine.remove(first, len);
        }
        self.alloc.freed_running.truncate(u.freed_running_len);
        self.alloc.late_frees.truncate(u.late_frees_len);
        for d in u.derived {
            match d {
                Derived::DirIndex(dir) => self.forget_dir_index(dir),
                Derived::ExtentMap(ino) => {
                    // Withdrawn already if the operation took it to change it; again here, so
                    // a map the rollback forgets is never left to reads without the lock.
                    self.data.lock().withdraw_map(ino);
                    self.derived.maps.remove(&ino);
                }
                Derived::ModeRecord(ino) => self.derived.modes.forget(ino),
            }
        }
    }

    /// The running operation built or changed a derived cache entry: a rollback of its
    /// metadata forgets it.
    pub(crate) fn note_derived(&mut self, d: Derived) {
        if let Some(u) = &mut self.op.undo {
            u.derived.push(d);
        }
    }

    /// Puts the block map of `ino` (edited by the running operation) back in the cache.
    pub(crate) fn put_extent_map(&mut self, ino: u32, map: super::extent_map::ExtentMap) {
        self.note_derived(Derived::ExtentMap(ino));
        // Nothing to withdraw from reads without the lock: a changed map was taken out
        // (`Meta::take_extent_map` withdrew it), and a freed number's map went with its pages.
        self.derived.maps.insert(ino, Arc::new(map));
    }

    /// Publishes the cached block map of `ino` (the current one: a change takes it out of the
    /// cache first) for reads and writes without the metadata lock (`DataCache::publish_map`).
    /// A rollback of the running operation withdraws it if the operation loaded or changed it.
    pub(crate) fn publish_extent_map(&self, ino: u32) {
        if let Some(map) = self.derived.maps.get(&ino) {
            self.data.lock().publish_map(ino, Arc::clone(map));
        }
    }

    /// Group `g`'s summary for modification (its old value is saved for a rollback).
    pub(super) fn group_mut(&mut self, g: u32) -> &mut GroupInfo {
        if let Some(u) = &mut self.op.undo {
            if !u.groups.iter().any(|(h, _)| *h == g) {
                u.groups.push((g, self.alloc.groups[g as usize]));
            }
        }
        &mut self.alloc.groups[g as usize]
    }

    /// The running transaction revokes block `nr`: replay will not write any copy the log
    /// holds of it from earlier transactions.
    pub fn revoke(&mut self, nr: u64) {
        if self.tx.revoked.insert(nr) {
            if let Some(u) = &mut self.op.undo {
                u.revoked.push((nr, false));
            }
        }
    }

    /// Block `nr` is metadata of the running transaction again: no revoke record for it.
    fn unrevoke(&mut self, nr: u64) {
        if self.tx.revoked.remove(&nr) {
            if let Some(u) = &mut self.op.undo {
                u.revoked.push((nr, true));
            }
        }
    }

    /// Whether a commit may make room: frees wait for it before their blocks can be
    /// allocated again, or cached data holds reservations (with their margin for extent-tree
    /// growth) that write-back turns into exact allocations.
    pub fn frees_pending(&self) -> bool {
        !self.alloc.quarantine.is_empty()
            || !self.alloc.late_frees.is_empty()
            || self.data.lock().reserved() > 0
    }

    /// Whether the running transaction holds anything a commit must write.
    pub fn has_uncommitted_changes(&self) -> bool {
        self.cache.dirty_count() > 0
            || !self.tx.revoked.is_empty()
            || !self.alloc.freed_running.is_empty()
            || self.sb_dirty
            || self.data_pending()
            || !self.alloc.late_frees.is_empty()
    }

    /// Whether file data or the size and times of writes without the lock wait for a
    /// commit's write-back (one hold of the page cache's mutex).
    fn data_pending(&self) -> bool {
        let pages = self.data.lock();
        pages.has_unsent_dirty() || pages.writes().pending_files().next().is_some()
    }

    /// Whether block `nr` is an allocation structure (bitmap, group descriptor table or
    /// superblock): the only blocks lightweight mode journals.
    pub fn is_allocation_block(&self, nr: u64) -> bool {
        let gdt_first = self.geo.first_data_block + 1;
        nr == self.sb_location().0
            || (gdt_first..gdt_first + self.sb.gdt_blocks()).contains(&nr)
            || self.alloc.bitmap_blocks.contains(&nr)
    }

    /// The newest copy of block `nr` that is not yet at home, if any: dirty or cached in memory,
    /// being committed, or committed and waiting for checkpoint.
    pub fn unsettled_copy(&self, io: &Io, nr: u64) -> Option<Arc<[u8]>> {
        if let Some(b) = self.cache.get_shared(nr) {
            return Some(b);
        }
        self.copy_past_the_cache(io, nr)
    }

    /// The newest copy of block `nr` newer than its home location that the buffer cache does
    /// not hold: in the commit in flight, else committed and waiting for checkpoint.
    fn copy_past_the_cache(&self, io: &Io, nr: u64) -> Option<Arc<[u8]>> {
        self.committing
            .get(&nr)
            .map(|(_, b)| Arc::clone(b))
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
        let mut bytes = [0u8; SUPERBLOCK_SIZE];
        self.sb.write(&mut bytes);
        self.sb_dirty = false;
        // Changes that cancel out (an orphan added and removed again in one transaction, as
        // every FUSE unlink of a closed file does) leave the block as it is: not journaled.
        if self.block(io, nr)?[off..off + SUPERBLOCK_SIZE] == bytes[..] {
            return Ok(());
        }
        let b = self.block_mut(io, nr)?;
        b[off..off + SUPERBLOCK_SIZE].copy_from_slice(&bytes);
        Ok(())
    }
}
