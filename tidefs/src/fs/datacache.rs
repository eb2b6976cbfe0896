//! File data between `write()` and the device: the daemon's page cache, with delayed
//! allocation.
//!
//! A `write()` lands here, one page per file block, and returns; nothing reaches the device
//! until write-back (`fs/writeback.rs`), which runs at every commit (before the commit record,
//! so ordered mode's promise holds), on fsync of the file, and when dirty data passes its
//! memory bound. Blocks are allocated only then, so a file written in one go gets contiguous
//! extents, and a file created and deleted between two commits never costs a device write.
//!
//! Invariants:
//! - a page holds the whole current content of its file block (a partial write into a block
//!   that exists on disk reads the block first), so write-back writes whole blocks;
//! - a dirty page is never evicted; a clean page may be dropped at any time (eviction gives a
//!   page read or written since the last eviction passed it a second chance);
//! - every dirty page over a hole carries one reserved block (`reserved`), and the allocator
//!   never hands out reserved blocks to anything else (`Meta::allocatable_blocks` subtracts
//!   them, and the spare blocks set aside for writes without the metadata lock too), so
//!   write-back cannot run out of space;
//! - a page's `gen` changes with every change, so write-back marks a page clean only if nothing
//!   wrote to it while its bytes were on their way to the device;
//! - while an operation runs (`begin_undo`), the first change to each page saves its old state,
//!   so a failed operation takes its data changes back with its metadata changes.
//!
//! The cache sits behind its own mutex, shared by `Meta`, `Fs::read` and `Fs::write`: operations
//! change it under the metadata lock, a write whose every block has a page (or is a hole it can
//! reserve a spare block for) changes those pages without that lock ([`DataCache::write_cached`],
//! `fs/cached_writes.rs`), and a read serves whole cached pages without that lock
//! ([`DataCache::copy_out`]) and keeps the blocks it read from the device as clean pages
//! ([`DataCache::insert_read`]). The reader holds the file's data lock, which every change to the
//! file's bytes or size takes too; what can still change a file's pages under a reader is counted
//! by [`DataCache::drops`], so a block read from the device is kept, or returned, only if it is
//! still the file's content (docs/DESIGN.md §2.5, "Reads without the lock").
//!
//! Behind the same mutex sit the block maps published for such reads ([`DataCache::publish_map`]):
//! a read planned under the metadata lock, a write, truncate or create under it and the commit's
//! write-back of a file leave its map here, and later reads of blocks no page holds find them on
//! the device through it without that lock, and writes without it find the holes they may fill with
//! pages (reserving blocks set aside, [`DataCache::spare`]). Every change to a file's map withdraws
//! it first (`Meta::take_extent_map`), and so does every drop of the file's pages
//! ([`DataCache::drop_range`]), so a published map is always the file's current one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::api::DataMode;
use super::cached_writes::{CachedWrites, PendingInode};
use super::extent_map::ExtentMap;
use crate::cache::ByteRanges;

/// One cached file block.
#[derive(Clone, Debug)]
pub(crate) struct Page {
    /// Shared with the write-back that snapshots it (no copy per page at commit), and in the
    /// modes that journal data with the buffer cache's block it joined a transaction as; a
    /// write while another holder lives copies it first ([`Arc::make_mut`]).
    pub bytes: Arc<[u8]>,
    /// Changed since the last write-back.
    pub dirty: bool,
    /// Holds a reserved block: the page is over a hole and not yet allocated.
    pub reserved: bool,
    /// Changes with every write to the page.
    pub gen: u64,
    /// Bytes written since the last write-back (what byte-range journaling logs).
    pub changed: ByteRanges,
    /// While dirty: the length of the `write()` that made it dirty, which decides for
    /// `selective` whether this update sequence is journaled.
    pub first_write: usize,
    /// While dirty: the strictest journaling mode its file obeyed at any write since it
    /// became dirty. Write-back follows it, so a change of mode keeps the old mode's promise
    /// for what was written under it.
    pub mode: DataMode,
    /// Read or written since eviction last passed it over (its second chance).
    pub referenced: bool,
    /// The generation a commit sent home whose transaction is not yet durable (its commit
    /// block held, docs/DESIGN.md §4.2): the next commit's write-back leaves the page alone
    /// while it has not changed since, and it turns clean when that transaction is durable.
    pub sent: Option<u64>,
}

impl Page {
    /// A page holding `bytes` as they are where they belong (or zeros over a hole, `reserved`).
    fn clean(bytes: Arc<[u8]>, reserved: bool) -> Page {
        Page {
            bytes,
            dirty: false,
            reserved,
            gen: 0,
            changed: ByteRanges::new(),
            first_write: 0,
            mode: DataMode::default(),
            // Used once so far: only a second use protects it from the next eviction.
            referenced: false,
            sent: None,
        }
    }
}

/// A dirty page as write-back sees it.
pub(crate) struct DirtyPage {
    pub lblk: u32,
    pub gen: u64,
    pub bytes: Arc<[u8]>,
    /// Bytes written since the last write-back.
    pub changed: ByteRanges,
    /// See [`Page::first_write`].
    pub first_write: usize,
    /// See [`Page::mode`].
    pub mode: DataMode,
    /// The page holds a reserved block (it is over a hole).
    pub reserved: bool,
    /// A commit not yet durable sent these very bytes home ([`Page::sent`]).
    pub sent: bool,
}

/// The pages a write covers whole, made ahead of the page cache's mutex: the blocks from
/// `first` on, in order.
#[derive(Default)]
pub(crate) struct WholePages {
    first: u32,
    pages: Vec<Arc<[u8]>>,
}

impl WholePages {
    /// The blocks that `data` written at byte `offset` covers whole (blocks of `block_size`
    /// bytes), each as a new page; none for a write within one block.
    pub fn of(offset: u64, data: &[u8], block_size: u32) -> WholePages {
        let bs = block_size as usize;
        let skip = (bs - (offset % bs as u64) as usize) % bs;
        let Some(rest) = data.get(skip..).filter(|r| r.len() >= bs) else {
            return WholePages::default();
        };
        let Ok(first) = u32::try_from((offset + skip as u64) / bs as u64) else {
            return WholePages::default();
        };
        WholePages {
            first,
            pages: rest.chunks_exact(bs).map(Arc::from).collect(),
        }
    }

    /// Whether no page was made.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Block `lblk`'s new page, if the write covers it whole.
    pub fn get(&self, lblk: u32) -> Option<&Arc<[u8]>> {
        self.pages.get(lblk.checked_sub(self.first)? as usize)
    }
}

/// Why a write without the metadata lock was refused (it then goes under the lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It needs this many more spare blocks than are set aside, and nothing else stopped it:
    /// setting them aside lets it go (`Fs::write`).
    Spare(u64),
    /// Anything else.
    Other,
}

/// One piece of a `write()` as it changes one page.
struct PageWrite<'a> {
    offset: usize,
    data: &'a [u8],
    /// The page's whole new content, made ahead when `data` covers all of it (then set as
    /// is, not copied).
    whole: Option<&'a Arc<[u8]>>,
    /// The length of the whole `write()` (see [`Page::first_write`]).
    request_len: usize,
    mode: DataMode,
    gen: u64,
}

impl PageWrite<'_> {
    /// Writes into `p`; true if it was clean before.
    fn apply(&self, p: &mut Page) -> bool {
        match self.whole {
            Some(whole) => {
                debug_assert!(
                    self.offset == 0 && whole[..] == *self.data,
                    "a page made ahead holds the bytes written"
                );
                p.bytes = Arc::clone(whole);
            }
            None => Arc::make_mut(&mut p.bytes)[self.offset..self.offset + self.data.len()]
                .copy_from_slice(self.data),
        }
        p.referenced = true;
        let newly_dirty = !p.dirty;
        if newly_dirty {
            p.first_write = self.request_len;
            p.mode = self.mode;
        } else {
            p.mode = p.mode.stricter(self.mode);
        }
        p.dirty = true;
        p.gen = self.gen;
        // Offsets inside a block fit in u32.
        p.changed
            .add(self.offset as u32, (self.offset + self.data.len()) as u32);
        newly_dirty
    }
}

/// The pages of one file, with its counts.
#[derive(Default)]
struct FilePages {
    pages: BTreeMap<u32, Page>,
    /// The blocks of the dirty pages: write-back visits them without walking the clean pages
    /// (a long file appended to has many clean pages and one dirty one).
    dirty: BTreeSet<u32>,
    reserved: u64,
}

/// The pages of every file, keyed by inode and logical block.
pub(crate) struct DataCache {
    files: HashMap<u32, FilePages>,
    pages: usize,
    dirty: usize,
    reserved: u64,
    /// Blocks set aside for pages that writes without the metadata lock make over holes
    /// (`fs/cached_writes.rs`): taken from the allocator's room under that lock, and turned
    /// into page reservations without it, so the two together never promise more blocks
    /// than are free.
    spare: u64,
    max_pages: usize,
    next_gen: u64,
    /// Bumped by every drop of a file's pages (truncate, punch, zero range, a deleted file),
    /// one counter per bucket of inode numbers: a block a reader read from the device before
    /// a drop of its file may no longer be that file's content.
    drops: Box<[u64]>,
    /// While an operation runs: the pages it touched as they were before (or `None`).
    undo: Option<HashMap<(u32, u32), Option<Page>>>,
    /// While an operation runs: pages whose reservation it used up ([`DataCache::allocated`])
    /// without touching them otherwise, so not saved whole in `undo`: a rollback gives them
    /// their reservation back. A commit's write-back allocates thousands of pages at once,
    /// and saving each whole cost most of its time under the metadata lock.
    undo_reserved: Vec<(u32, u32)>,
    /// Pages rollbacks put back since the cache was made (an operation that stops after
    /// filling pages wastes their copies; tests look for none, docs/DESIGN.md §4.1).
    #[cfg_attr(not(test), allow(dead_code))]
    pages_taken_back: u64,
    /// Block maps published for reads without the metadata lock (shared with `Meta::maps`).
    maps: HashMap<u32, Arc<ExtentMap>>,
    /// Writes without the metadata lock: which files may take them, and the size and times
    /// they left for the metadata side (`fs/cached_writes.rs`).
    writes: CachedWrites,
    /// Files written under a mode that may journal data since mount: only their blocks can
    /// have a newest copy in the buffer cache rather than at home (a page that joins a
    /// transaction turns clean at once), so only their reads without the metadata lock must
    /// stay off the device. `None`: too many to list, every file counts.
    journaled_files: Option<HashSet<u32>>,
}

/// Files [`DataCache::journaled_files`] lists at most.
const MAX_JOURNALED_FILES: usize = 16_384;

/// Buckets of [`DataCache::drops`]: a drop of one file makes reads of the files that share
/// its bucket plan again too, which costs only time.
const DROP_BUCKETS: usize = 1024;

/// The bucket of [`DataCache::drops`] that counts the drops of `ino`'s pages.
fn drop_bucket(ino: u32) -> usize {
    ino as usize % DROP_BUCKETS
}

/// Published block maps kept at most; the table is emptied when it passes this.
const MAX_PUBLISHED_MAPS: usize = 16_384;

impl DataCache {
    /// A cache of at most about `max_pages` pages (dirty pages are never evicted; the fs
    /// writes them back when they pass half of that).
    pub fn new(max_pages: usize) -> DataCache {
        DataCache {
            files: HashMap::new(),
            pages: 0,
            dirty: 0,
            reserved: 0,
            spare: 0,
            max_pages: max_pages.max(64),
            next_gen: 1,
            drops: vec![0; DROP_BUCKETS].into_boxed_slice(),
            undo: None,
            undo_reserved: Vec::new(),
            pages_taken_back: 0,
            maps: HashMap::new(),
            writes: CachedWrites::default(),
            journaled_files: Some(HashSet::new()),
        }
    }

    /// Publishes `map`, the current block map of `ino`, for reads and writes without the
    /// metadata lock; called under that lock. Reads use it only while no mode of the mount
    /// journals file data (a block's newest copy could then be in the buffer cache, which
    /// such a read cannot see); writes only to find the holes they may fill.
    pub fn publish_map(&mut self, ino: u32, map: Arc<ExtentMap>) {
        if self.maps.len() >= MAX_PUBLISHED_MAPS {
            self.maps.clear();
        }
        self.maps.insert(ino, map);
    }

    /// Whether `ino` had a page written under a mode that may journal data since mount (see
    /// the field): a read without the metadata lock must not read its blocks from the device.
    pub fn may_hold_journaled(&self, ino: u32) -> bool {
        self.journaled_files
            .as_ref()
            .is_none_or(|set| set.contains(&ino))
    }

    /// The published block map of `ino`, if any.
    pub fn published_map(&self, ino: u32) -> Option<Arc<ExtentMap>> {
        self.maps.get(&ino).cloned()
    }

    /// Withdraws the published block map of `ino`: its map is about to change (or the file
    /// to go). Called under the metadata lock before the change.
    pub fn withdraw_map(&mut self, ino: u32) {
        self.maps.remove(&ino);
    }

    /// Withdraws every published block map.
    pub fn withdraw_maps(&mut self) {
        self.maps.clear();
    }

    /// Dirty pages past which the file system writes data back without waiting for a commit.
    pub fn dirty_limit(&self) -> usize {
        self.max_pages / 2
    }

    /// Pages waiting for write-back.
    pub fn dirty_count(&self) -> usize {
        self.dirty
    }

    /// Blocks reserved for pages over holes.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Blocks set aside for writes without the metadata lock (see the field).
    pub fn spare(&self) -> u64 {
        self.spare
    }

    /// Sets `n` more blocks aside for writes without the metadata lock; the caller holds that
    /// lock and found them free and unpromised.
    pub fn add_spare(&mut self, n: u64) {
        self.spare += n;
    }

    /// Gives the blocks set aside back to the allocator (space is short).
    pub fn release_spare(&mut self) {
        self.spare = 0;
    }

    /// Blocks reserved for the pages of `ino` (counted in its `st_blocks`, as ext4 counts
    /// delayed allocations).
    pub fn reserved_of(&self, ino: u32) -> u64 {
        self.files.get(&ino).map_or(0, |f| f.reserved)
    }

    /// The page of `(ino, lblk)`, if cached.
    pub fn get(&self, ino: u32, lblk: u32) -> Option<&Page> {
        self.files.get(&ino)?.pages.get(&lblk)
    }

    /// Copies bytes `[offset, offset + out.len())` of file `ino` from its cached pages of
    /// `block_size` bytes; false (with `out` partly written) if a page in the range is missing.
    /// The pages count as used, so eviction passes them over once.
    pub fn copy_out(&mut self, ino: u32, offset: u64, out: &mut [u8], block_size: u32) -> bool {
        let Some(f) = self.files.get_mut(&ino) else {
            return out.is_empty();
        };
        let bs = u64::from(block_size);
        let mut at = 0usize;
        while at < out.len() {
            let pos = offset + at as u64;
            let Some(page) = u32::try_from(pos / bs)
                .ok()
                .and_then(|l| f.pages.get_mut(&l))
            else {
                return false;
            };
            page.referenced = true;
            let in_block = (pos % bs) as usize;
            let len = (page.bytes.len() - in_block).min(out.len() - at);
            out[at..at + len].copy_from_slice(&page.bytes[in_block..in_block + len]);
            at += len;
        }
        true
    }

    /// How many drops of the pages of `ino` (or of a file sharing its bucket) there have
    /// been ([`DataCache::insert_read`]).
    pub fn drops(&self, ino: u32) -> u64 {
        self.drops[drop_bucket(ino)]
    }

    /// Keeps `bytes`, read from the device without the metadata lock, as the clean page
    /// `(ino, lblk)`, if the slot is still empty and no page was dropped since the read was
    /// planned (`drops` is [`DataCache::drops`] of `ino` then): no write of the file can have run
    /// meanwhile (the reader holds its data lock), so only a drop can have made the bytes
    /// stale (the file deleted and its number reused, or cut by a truncate). Not noted for an
    /// operation's undo: the page is the file's content whatever that operation does.
    pub fn insert_read(&mut self, ino: u32, lblk: u32, bytes: Arc<[u8]>, drops: u64) -> bool {
        if drops != self.drops(ino) || self.get(ino, lblk).is_some() {
            return false;
        }
        if self.pages >= self.max_pages {
            self.evict();
        }
        self.put_page(ino, lblk, Page::clean(bytes, false));
        true
    }

    /// Dirty pages of `ino`.
    pub fn dirty_count_of(&self, ino: u32) -> usize {
        self.files.get(&ino).map_or(0, |f| f.dirty.len())
    }

    /// Whether a dirty page waits for a write-back: one not already sent home by a commit
    /// whose transaction is not yet durable (with nothing else changed since).
    pub fn has_unsent_dirty(&self) -> bool {
        self.unsent_dirty_at_least(1)
    }

    /// Whether at least `n` dirty pages wait for a write-back (see
    /// [`DataCache::has_unsent_dirty`]): a page the held commit sent and a write changed
    /// since counts, as the running transaction's. Stops once it has found `n`.
    pub fn unsent_dirty_at_least(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        if self.dirty < n {
            return false;
        }
        let mut unsent = self.files.values().flat_map(|f| {
            f.dirty
                .iter()
                .filter(|l| f.pages.get(l).is_some_and(|p| p.sent != Some(p.gen)))
        });
        unsent.nth(n - 1).is_some()
    }

    /// Files with dirty pages, in inode order.
    pub fn dirty_files(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .files
            .iter()
            .filter(|(_, f)| !f.dirty.is_empty())
            .map(|(i, _)| *i)
            .collect();
        v.sort_unstable();
        v
    }

    /// The dirty pages of `ino`, in block order.
    pub fn dirty_pages(&self, ino: u32) -> Vec<DirtyPage> {
        self.dirty_pages_where(ino, 0, usize::MAX, |_| true)
    }

    /// The first `limit` dirty pages of `ino` from block `first` on that hold a reserved
    /// block (pages over holes), in block order.
    pub fn pages_over_holes(&self, ino: u32, first: u32, limit: usize) -> Vec<DirtyPage> {
        self.dirty_pages_where(ino, first, limit, |p| p.reserved)
    }

    /// The first `limit` dirty pages of `ino` from block `first` on for which `keep` holds,
    /// in block order.
    fn dirty_pages_where(
        &self,
        ino: u32,
        first: u32,
        limit: usize,
        keep: impl Fn(&Page) -> bool,
    ) -> Vec<DirtyPage> {
        self.files.get(&ino).map_or_else(Vec::new, |f| {
            f.dirty
                .range(first..)
                .filter_map(|l| f.pages.get(l).map(|p| (l, p)))
                .filter(|(_, p)| keep(p))
                .take(limit)
                .map(|(l, p)| DirtyPage {
                    lblk: *l,
                    gen: p.gen,
                    bytes: Arc::clone(&p.bytes),
                    changed: p.changed.clone(),
                    first_write: p.first_write,
                    mode: p.mode,
                    reserved: p.reserved,
                    sent: p.sent == Some(p.gen),
                })
                .collect()
        })
    }

    /// The dirty pages of `ino` and the size and times writes without the metadata lock
    /// left for it, taken together: write-back stores exactly the size these pages hold.
    pub fn dirty_pages_and_pending(&self, ino: u32) -> (Vec<DirtyPage>, Option<PendingInode>) {
        (self.dirty_pages(ino), self.writes.pending(ino))
    }

    /// What an fsync of `ino` needs from here (`fs/sync_view.rs`): whether it has dirty
    /// pages, and the record writes without the metadata lock left for it.
    pub fn sync_inputs(&self, ino: u32) -> (bool, Option<PendingInode>) {
        (self.dirty_count_of(ino) > 0, self.writes.pending(ino))
    }

    /// Writes without the metadata lock (`fs/cached_writes.rs`).
    pub fn writes(&self) -> &CachedWrites {
        &self.writes
    }

    /// Writes without the metadata lock, to change (under the metadata lock, except for
    /// [`DataCache::write_cached`]'s caller noting a write).
    pub fn writes_mut(&mut self) -> &mut CachedWrites {
        &mut self.writes
    }

    /// Starts recording the old state of every page the operation touches.
    pub fn begin_undo(&mut self) {
        self.undo = Some(HashMap::new());
        self.undo_reserved.clear();
        self.writes.begin_undo();
    }

    /// Ends the operation, keeping its changes.
    pub fn end_undo(&mut self) {
        self.undo = None;
        self.undo_reserved.clear();
        self.writes.end_undo();
    }

    /// Pages rollbacks put back since the cache was made.
    #[cfg(test)]
    pub fn pages_taken_back(&self) -> u64 {
        self.pages_taken_back
    }

    /// Ends the operation and puts back every page it touched.
    pub fn rollback(&mut self) {
        self.writes.rollback();
        let Some(undo) = self.undo.take() else {
            return;
        };
        self.pages_taken_back += undo.len() as u64;
        for ((ino, lblk), before) in undo {
            self.remove_page(ino, lblk);
            if let Some(mut p) = before {
                // The commit that sent it may be durable by now, and would then have found
                // the page changed: sent again at worst, never left dirty for good.
                p.sent = None;
                self.put_page(ino, lblk, p);
            }
        }
        // After the pages saved whole: one saved after its reservation was used up comes
        // back without it, and gets it here.
        for (ino, lblk) in std::mem::take(&mut self.undo_reserved) {
            self.set_reserved(ino, lblk, true);
        }
    }

    /// Saves page `(ino, lblk)` as it is, if an operation is open and has not touched it yet.
    fn note(&mut self, ino: u32, lblk: u32) {
        let Some(u) = &self.undo else {
            return;
        };
        if u.contains_key(&(ino, lblk)) {
            return;
        }
        let old = self.get(ino, lblk).cloned();
        if let Some(u) = &mut self.undo {
            u.insert((ino, lblk), old);
        }
    }

    /// Takes a page out, keeping the counters right.
    fn remove_page(&mut self, ino: u32, lblk: u32) -> Option<Page> {
        let f = self.files.get_mut(&ino)?;
        let p = f.pages.remove(&lblk)?;
        f.dirty.remove(&lblk);
        f.reserved -= u64::from(p.reserved);
        if f.pages.is_empty() {
            self.files.remove(&ino);
        }
        self.pages -= 1;
        self.dirty -= usize::from(p.dirty);
        self.reserved -= u64::from(p.reserved);
        Some(p)
    }

    /// Puts a page in, keeping the counters right (the slot must be empty).
    fn put_page(&mut self, ino: u32, lblk: u32, p: Page) {
        self.pages += 1;
        self.dirty += usize::from(p.dirty);
        self.reserved += u64::from(p.reserved);
        let f = self.files.entry(ino).or_default();
        if p.dirty {
            f.dirty.insert(lblk);
        }
        f.reserved += u64::from(p.reserved);
        f.pages.insert(lblk, p);
    }

    /// Caches the content of a block as a clean page (read for a partial write, or loaded to
    /// be changed); `reserved` when the block does not exist yet.
    pub fn insert(&mut self, ino: u32, lblk: u32, bytes: Arc<[u8]>, reserved: bool) {
        if self.pages >= self.max_pages {
            self.evict();
        }
        self.note(ino, lblk);
        self.remove_page(ino, lblk);
        self.put_page(ino, lblk, Page::clean(bytes, reserved));
    }

    /// Writes `data` at byte `offset` of cached page `(ino, lblk)`, which becomes dirty;
    /// `request_len` is the length of the whole `write()` this piece belongs to, `mode` the
    /// journaling mode the file obeys, and `whole` the page's whole new content when it was
    /// made ahead (`data` covers all of it, with the same bytes), which becomes the page as
    /// it is, not copied. Returns false if the page is not cached.
    #[allow(clippy::too_many_arguments)]
    pub fn write_page(
        &mut self,
        ino: u32,
        lblk: u32,
        offset: usize,
        data: &[u8],
        request_len: usize,
        mode: DataMode,
        whole: Option<&Arc<[u8]>>,
    ) -> bool {
        if self.get(ino, lblk).is_none() {
            return false;
        }
        self.note(ino, lblk);
        let change = PageWrite {
            offset,
            data,
            whole,
            request_len,
            mode,
            gen: self.next_gen,
        };
        self.next_gen += 1;
        self.apply_write(ino, lblk, &change);
        true
    }

    /// Writes `data` at byte `offset` of file `ino` (blocks of `block_size` bytes) for a
    /// `write()` without the metadata lock (`fs/cached_writes.rs`), if every block it covers
    /// has a page or is a hole of the file's published map that a spare block can reserve;
    /// else changes nothing and returns `None`. Returns the pages it made over holes. Not the
    /// change of an operation, so not noted for its undo: where an operation running
    /// meanwhile (a commit's write-back) saved a page's old state, the write goes into that
    /// saved state too, so its rollback keeps this write; a block whose page that operation
    /// made or dropped is left to the lock (its rollback would drop or replace the page).
    #[cfg(test)]
    pub fn write_cached(
        &mut self,
        ino: u32,
        offset: u64,
        data: &[u8],
        block_size: u32,
        mode: DataMode,
    ) -> Option<u64> {
        self.write_cached_with(ino, offset, data, block_size, mode, &WholePages::default())
            .ok()
    }

    /// [`DataCache::write_cached`] with the pages the write covers whole made ahead, outside
    /// the page cache's mutex ([`WholePages::of`]): they are set as they are, so the hold of
    /// the mutex does not copy them (nor fault in the memory of new pages; a 1 MiB write into
    /// a new file held it about a millisecond, which every cached read of any file and every
    /// operation under the metadata lock that looks at the pages waited for).
    pub fn write_cached_with(
        &mut self,
        ino: u32,
        offset: u64,
        data: &[u8],
        block_size: u32,
        mode: DataMode,
        whole: &WholePages,
    ) -> Result<u64, Refused> {
        let bs = u64::from(block_size);
        let (first, last, holes) = self
            .holes_of_write(ino, offset, data.len(), block_size)
            .ok_or(Refused::Other)?;
        // No eviction here: it could take a page this write just found.
        if holes > 0 && self.pages + holes as usize > self.max_pages {
            return Err(Refused::Other);
        }
        if holes > self.spare {
            return Err(Refused::Spare(holes - self.spare));
        }
        self.spare -= holes;
        let mut at = 0usize;
        for lblk in first..=last {
            let made = whole.get(lblk);
            if self.get(ino, lblk).is_none() {
                let bytes = made
                    .cloned()
                    .unwrap_or_else(|| zero_page(block_size as usize));
                self.put_page(ino, lblk, Page::clean(bytes, true));
            }
            let pos = offset + at as u64;
            let in_block = (pos % bs) as usize;
            let len = (block_size as usize - in_block).min(data.len() - at);
            let change = PageWrite {
                offset: in_block,
                data: &data[at..at + len],
                whole: made,
                request_len: data.len(),
                mode,
                gen: self.next_gen,
            };
            self.next_gen += 1;
            self.apply_write(ino, lblk, &change);
            if let Some(Some(saved)) = self.undo.as_mut().and_then(|u| u.get_mut(&(ino, lblk))) {
                change.apply(saved);
            }
            at += len;
        }
        Ok(holes)
    }

    /// The blocks (first, last) a write of `len` bytes at `offset` into `ino` covers and how
    /// many of them are holes of its published map with no page: `None` when it cannot go
    /// without the metadata lock for another cause than spare blocks (no published map for a
    /// block without a page, a page the running operation added, an empty write, offsets
    /// past 32-bit blocks).
    fn holes_of_write(
        &self,
        ino: u32,
        offset: u64,
        len: usize,
        block_size: u32,
    ) -> Option<(u32, u32, u64)> {
        let bs = u64::from(block_size);
        let end = offset.checked_add(len as u64)?;
        if len == 0 {
            return None;
        }
        let (Ok(first), Ok(last)) = (u32::try_from(offset / bs), u32::try_from((end - 1) / bs))
        else {
            return None;
        };
        let map = self.maps.get(&ino);
        let mut holes = 0u64;
        for l in first..=last {
            let saved = self.undo.as_ref().and_then(|u| u.get(&(ino, l)));
            match (self.get(ino, l), saved) {
                (Some(_), Some(None)) => return None,
                (Some(_), _) => {}
                (None, None) if map.is_some_and(|m| m.map(l).is_none()) => holes += 1,
                (None, _) => return None,
            }
        }
        Some((first, last, holes))
    }

    /// Applies `change` to the cached page `(ino, lblk)`, keeping the counters right.
    fn apply_write(&mut self, ino: u32, lblk: u32, change: &PageWrite<'_>) {
        if change.mode.may_journal_data() {
            if let Some(set) = &mut self.journaled_files {
                set.insert(ino);
                if set.len() > MAX_JOURNALED_FILES {
                    self.journaled_files = None;
                }
            }
        }
        let Some(f) = self.files.get_mut(&ino) else {
            return;
        };
        let Some(p) = f.pages.get_mut(&lblk) else {
            return;
        };
        if change.apply(p) {
            f.dirty.insert(lblk);
            self.dirty += 1;
        }
    }

    /// After write-back put the page's bytes of generation `gen` where they belong: the page
    /// is clean unless it changed since, and its reservation (if any) is used up. Inside an
    /// operation (a journal-mode page joining the transaction) a rollback makes it dirty again.
    pub fn written_back(&mut self, ino: u32, lblk: u32, gen: u64) {
        if !self.get(ino, lblk).is_some_and(|p| p.gen == gen && p.dirty) {
            return;
        }
        self.note(ino, lblk);
        self.mark_clean(ino, lblk);
    }

    /// A commit whose transaction is not yet durable sent generation `gen` of page
    /// `(ino, lblk)` home ([`Page::sent`]). Outside any operation, like
    /// [`DataCache::written_home`].
    pub fn sent_home(&mut self, ino: u32, lblk: u32, gen: u64) {
        let page = self
            .files
            .get_mut(&ino)
            .and_then(|f| f.pages.get_mut(&lblk));
        if let Some(p) = page.filter(|p| p.gen == gen && p.dirty) {
            p.sent = Some(gen);
        }
    }

    /// [`DataCache::written_back`] for pages whose bytes a commit or an fdatasync wrote home,
    /// called outside any operation and without the metadata lock, so never noted in the
    /// undo record of an operation that may be running meanwhile (taken back, it could only
    /// make such a page dirty again: its bytes would then go home once more).
    pub fn written_home(&mut self, ino: u32, lblk: u32, gen: u64) {
        if self.get(ino, lblk).is_some_and(|p| p.gen == gen && p.dirty) {
            self.mark_clean(ino, lblk);
        }
    }

    /// Page `(ino, lblk)` is clean.
    fn mark_clean(&mut self, ino: u32, lblk: u32) {
        let Some(f) = self.files.get_mut(&ino) else {
            return;
        };
        if let Some(p) = f.pages.get_mut(&lblk) {
            p.dirty = false;
            p.sent = None;
            p.changed.clear();
            f.dirty.remove(&lblk);
            self.dirty -= 1;
        }
    }

    /// The block of page `(ino, lblk)` has been allocated: its reservation is used up.
    pub fn allocated(&mut self, ino: u32, lblk: u32) {
        if !self.get(ino, lblk).is_some_and(|p| p.reserved) {
            return;
        }
        if let Some(u) = &self.undo {
            if !u.contains_key(&(ino, lblk)) {
                self.undo_reserved.push((ino, lblk));
            }
        }
        self.set_reserved(ino, lblk, false);
    }

    /// Marks page `(ino, lblk)`, if cached, as holding a reserved block or not, keeping the
    /// counts right.
    fn set_reserved(&mut self, ino: u32, lblk: u32, reserved: bool) {
        if let Some(f) = self.files.get_mut(&ino) {
            if let Some(p) = f.pages.get_mut(&lblk) {
                if p.reserved != reserved {
                    p.reserved = reserved;
                    if reserved {
                        f.reserved += 1;
                        self.reserved += 1;
                    } else {
                        f.reserved -= 1;
                        self.reserved -= 1;
                    }
                }
            }
        }
    }

    /// [`DataCache::allocated`] for every block in `[from, to)` (a run just allocated),
    /// visiting only the pages cached there.
    pub fn allocated_range(&mut self, ino: u32, from: u32, to: u32) {
        for lblk in self.reserved_pages(ino, from, to) {
            self.allocated(ino, lblk);
        }
    }

    /// The pages of `ino` in `[from, to)` that hold a reserved block: an allocation there
    /// takes the block the page already holds, and needs no new room.
    pub fn reserved_pages(&self, ino: u32, from: u32, to: u32) -> Vec<u32> {
        self.files.get(&ino).map_or_else(Vec::new, |f| {
            f.pages
                .range(from..to)
                .filter(|(_, p)| p.reserved)
                .map(|(lblk, _)| *lblk)
                .collect()
        })
    }

    /// Drops the pages of `ino` for blocks in `[from, to)` (truncate, punch, zero range,
    /// delete): their data never reaches the device and their reservations are returned.
    pub fn drop_range(&mut self, ino: u32, from: u64, to: u64) {
        // Counted even when nothing is cached: a reader may be about to cache a block.
        self.drops[drop_bucket(ino)] += 1;
        // And the published map goes with the pages: a reader that found no page must not
        // find the map of a file being deleted (its blocks about to be freed, its number
        // reused) and plan device reads from it.
        self.withdraw_map(ino);
        let Some(f) = self.files.get(&ino) else {
            return;
        };
        if from >= to {
            return;
        }
        let lo = u32::try_from(from).unwrap_or(u32::MAX);
        let victims: Vec<u32> = f
            .pages
            .range(lo..)
            .map(|(l, _)| *l)
            .filter(|l| u64::from(*l) < to)
            .collect();
        for l in victims {
            self.note(ino, l);
            self.remove_page(ino, l);
        }
    }

    /// Drops every page of `ino`.
    pub fn drop_file(&mut self, ino: u32) {
        self.drop_range(ino, 0, u64::MAX);
    }

    /// Drops clean pages until the cache is back to three quarters of its bound.
    fn evict(&mut self) {
        let target = self.max_pages * 3 / 4;
        self.drop_clean_pages(self.pages.saturating_sub(target));
    }

    /// Drops every clean page (`Fs::drop_caches`).
    pub fn drop_clean(&mut self) {
        self.drop_clean_pages(usize::MAX);
    }

    /// Drops up to `excess` clean pages that the running operation has not touched. A page
    /// used since eviction last passed it is passed over once more (its mark cleared), as
    /// the CLOCK algorithm does, so pages read again and again stay while pages read once go.
    fn drop_clean_pages(&mut self, excess: usize) {
        let mut dropped = self.pick_clean_pages(excess, true);
        for &(ino, l) in &dropped {
            self.remove_page(ino, l);
        }
        if dropped.len() < excess {
            dropped = self.pick_clean_pages(excess - dropped.len(), false);
            for (ino, l) in dropped {
                self.remove_page(ino, l);
            }
        }
    }

    /// Up to `want` clean pages the running operation has not touched; with `second_chance`,
    /// used pages are not taken but lose their mark.
    fn pick_clean_pages(&mut self, want: usize, second_chance: bool) -> Vec<(u32, u32)> {
        let mut picked = Vec::new();
        if want == 0 {
            return picked;
        }
        let undo = &self.undo;
        for (ino, f) in &mut self.files {
            for (l, p) in &mut f.pages {
                let touched = undo.as_ref().is_some_and(|u| u.contains_key(&(*ino, *l)));
                if p.dirty || touched {
                    continue;
                }
                if p.referenced && second_chance {
                    p.referenced = false;
                    continue;
                }
                picked.push((*ino, *l));
                if picked.len() == want {
                    return picked;
                }
            }
        }
        picked
    }
}

/// A page of `len` zeros, made in place (a `Box` or `Vec` turned into an `Arc` is copied).
pub(crate) fn zero_page(len: usize) -> Arc<[u8]> {
    std::iter::repeat_n(0u8, len).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a write without the metadata lock is all or nothing (a missing page: nothing
    /// written), and survives the rollback of an operation that touched the same page
    /// meanwhile (a commit's write-back that failed): it went into the saved state too.
    #[test]
    fn a_write_without_the_lock_survives_a_rollback_of_the_page() {
        let mut c = DataCache::new(64);
        c.insert(5, 0, vec![0u8; 16].into(), true);
        assert!(c
            .write_cached(5, 10, &[1u8; 10], 16, DataMode::Ordered)
            .is_none());
        assert_eq!(
            c.dirty_count(),
            0,
            "a write with a page missing changed nothing"
        );
        // The operation saves the page whole (its own write), then the write without the
        // lock lands in the page and in that saved copy.
        c.begin_undo();
        c.write_page(5, 0, 0, b"z", 1, DataMode::Ordered, None);
        c.allocated(5, 0);
        assert_eq!(c.write_cached(5, 2, b"ab", 16, DataMode::Ordered), Some(0));
        c.rollback();
        let p = c.get(5, 0).unwrap();
        assert_eq!(&p.bytes[..4], &[0, 0, b'a', b'b']);
        assert!(
            p.dirty && p.reserved,
            "the page is as before the operation, written"
        );
        assert_eq!((c.dirty_count(), c.reserved()), (1, 1));
        // A page the operation made (none before it) takes no write without the lock.
        c.begin_undo();
        c.insert(5, 1, vec![0u8; 16].into(), true);
        assert!(c.write_cached(5, 16, b"x", 16, DataMode::Ordered).is_none());
        c.rollback();
        assert!(c.get(5, 1).is_none());
    }

    /// Goal: a write without the metadata lock makes pages over holes of the file's published
    /// map, one spare block each turned into a page reservation, and only then: no map, a
    /// mapped block, too few spare blocks, or a block whose page the running operation
    /// dropped leave the write to the lock, changing nothing. A rollback of that operation
    /// keeps the new page.
    #[test]
    fn a_write_without_the_lock_fills_holes_from_the_spare() {
        let mut c = DataCache::new(64);
        c.insert(5, 0, vec![0u8; 16].into(), true);
        c.add_spare(2);
        let append = |c: &mut DataCache| c.write_cached(5, 14, b"abcd", 16, DataMode::Ordered);
        assert!(append(&mut c).is_none(), "no published map");
        let mut map = ExtentMap::default();
        map.insert(3, 100, false);
        c.publish_map(5, Arc::new(map));
        c.begin_undo();
        assert_eq!(append(&mut c), Some(1));
        c.rollback();
        let p = c.get(5, 1).expect("the page over the hole stays");
        assert_eq!(&p.bytes[..2], b"cd");
        assert!(p.dirty && p.reserved);
        assert_eq!((c.spare(), c.reserved(), c.reserved_of(5)), (1, 2, 2));
        // Block 3 is mapped (its content is on disk): left to the lock.
        assert!(c.write_cached(5, 48, b"x", 16, DataMode::Ordered).is_none());
        // Two holes, one spare block: nothing written.
        assert!(c
            .write_cached(5, 32, &[7u8; 17], 16, DataMode::Ordered)
            .is_none());
        assert!(c.get(5, 2).is_none());
        assert_eq!(c.spare(), 1);
        // A block whose page the running operation dropped: a rollback would bring it back.
        c.insert(5, 4, vec![0u8; 16].into(), true);
        c.begin_undo();
        c.drop_range(5, 4, 5);
        c.publish_map(5, Arc::new(ExtentMap::default()));
        assert!(c.write_cached(5, 64, b"y", 16, DataMode::Ordered).is_none());
        c.rollback();
        c.release_spare();
        assert!(c.write_cached(5, 32, b"z", 16, DataMode::Ordered).is_none());
    }

    #[test]
    fn writes_count_dirty_pages_and_reservations() {
        let mut c = DataCache::new(64);
        c.insert(5, 0, vec![0u8; 16].into(), true);
        c.insert(5, 1, vec![1u8; 16].into(), false);
        assert!(c.write_page(5, 0, 2, b"ab", 1, DataMode::Ordered, None));
        assert!(c.write_page(5, 1, 0, b"z", 1, DataMode::Ordered, None));
        assert!(!c.write_page(5, 9, 0, b"z", 1, DataMode::Ordered, None));
        assert_eq!((c.dirty_count(), c.reserved(), c.reserved_of(5)), (2, 1, 1));
        assert_eq!(c.dirty_count_of(5), 2);
        let pages = c.dirty_pages(5);
        assert_eq!(pages.len(), 2);
        assert_eq!(&pages[0].bytes[..4], &[0, 0, b'a', b'b']);
        // A write after the snapshot keeps the page dirty.
        c.write_page(5, 1, 1, b"y", 1, DataMode::Ordered, None);
        c.allocated(5, 0);
        c.written_back(5, 0, pages[0].gen);
        c.written_back(5, 1, pages[1].gen);
        assert_eq!((c.dirty_count(), c.reserved()), (1, 0));
        assert_eq!(c.dirty_files(), vec![5]);
        c.drop_file(5);
        assert_eq!((c.dirty_count(), c.reserved(), c.pages), (0, 0, 0));
    }

    #[test]
    fn pages_a_held_commit_sent_count_again_once_rewritten() {
        let mut c = DataCache::new(64);
        for lblk in 0..3 {
            c.insert(7, lblk, vec![0u8; 16].into(), false);
            assert!(c.write_page(7, lblk, 0, b"a", 1, DataMode::Ordered, None));
        }
        // A commit whose block is held sent all three home.
        for p in c.dirty_pages(7) {
            c.sent_home(7, p.lblk, p.gen);
        }
        assert_eq!(c.dirty_count(), 3, "dirty until the held commit is durable");
        assert!(!c.has_unsent_dirty());
        assert!(c.unsent_dirty_at_least(0));
        // An append rewrites one of them: the running transaction has that page.
        assert!(c.write_page(7, 2, 1, b"b", 1, DataMode::Ordered, None));
        assert!(c.has_unsent_dirty());
        assert!(c.unsent_dirty_at_least(1));
        assert!(!c.unsent_dirty_at_least(2));
        // And a page of its own.
        c.insert(8, 0, vec![0u8; 16].into(), false);
        assert!(c.write_page(8, 0, 0, b"c", 1, DataMode::Ordered, None));
        assert!(c.unsent_dirty_at_least(2));
        assert!(!c.unsent_dirty_at_least(3));
        assert_eq!(c.dirty_count(), 4);
    }

    #[test]
    fn rollback_restores_pages_and_reservations() {
        let mut c = DataCache::new(64);
        c.insert(1, 0, vec![0u8; 8].into(), false);
        c.begin_undo();
        c.write_page(1, 0, 0, b"x", 1, DataMode::Ordered, None);
        c.insert(1, 1, vec![0u8; 8].into(), true);
        c.write_page(1, 1, 0, b"y", 1, DataMode::Ordered, None);
        c.drop_range(1, 0, 1);
        c.rollback();
        assert_eq!(c.get(1, 0).unwrap().bytes[0], 0);
        assert!(!c.get(1, 0).unwrap().dirty);
        assert!(c.get(1, 1).is_none());
        assert_eq!((c.dirty_count(), c.reserved(), c.pages), (0, 0, 1));
    }

    /// Goal: a rollback gives back the reservations an operation used up, whether the page
    /// was saved whole before (a write first), after (a write-back that marks it clean) or
    /// not at all, and leaves a write without the lock made meanwhile in place.
    #[test]
    fn rollback_gives_back_used_up_reservations() {
        let mut c = DataCache::new(64);
        for l in 0..3 {
            c.insert(4, l, vec![0u8; 8].into(), true);
            c.write_page(4, l, 0, b"d", 1, DataMode::Journal, None);
        }
        c.publish_map(4, Arc::new(ExtentMap::default()));
        assert_eq!(c.reserved(), 3);
        c.begin_undo();
        c.write_page(4, 0, 1, b"e", 1, DataMode::Journal, None);
        for l in 0..3 {
            c.allocated(4, l);
        }
        let gen = c.get(4, 2).unwrap().gen;
        c.written_back(4, 2, gen);
        assert_eq!(
            c.write_cached(4, 4096 + 2, b"w", 4096, DataMode::Journal),
            Some(0)
        );
        assert_eq!((c.reserved(), c.reserved_of(4)), (0, 0));
        c.rollback();
        assert_eq!((c.reserved(), c.reserved_of(4)), (3, 3));
        for l in 0..3 {
            assert!(
                c.get(4, l).unwrap().reserved,
                "page {l} lost its reservation"
            );
        }
        assert_eq!(
            &c.get(4, 0).unwrap().bytes[..2],
            b"d\0",
            "the write was taken back"
        );
        assert_eq!(
            &c.get(4, 1).unwrap().bytes[..3],
            b"d\0w",
            "the write without the lock"
        );
        assert!(c.get(4, 2).unwrap().dirty, "the write-back was taken back");
        c.begin_undo();
        c.allocated(4, 1);
        c.end_undo();
        c.rollback();
        assert_eq!(c.reserved(), 2, "an ended operation's use stays");
    }

    /// Goal: a page that joined the transaction inside an operation (journal mode's
    /// write-back marks it clean there) is dirty again, with its changed bytes, when the
    /// operation is taken back; the write-back that runs again must find it.
    #[test]
    fn rollback_makes_a_page_written_back_inside_the_operation_dirty_again() {
        let mut c = DataCache::new(64);
        c.insert(3, 0, vec![0u8; 8].into(), false);
        c.write_page(3, 0, 2, b"ab", 1, DataMode::Journal, None);
        let gen = c.dirty_pages(3)[0].gen;
        c.begin_undo();
        c.written_back(3, 0, gen);
        assert_eq!(c.dirty_count(), 0);
        c.rollback();
        assert_eq!(c.dirty_count(), 1);
        let pages = c.dirty_pages(3);
        assert_eq!((pages.len(), pages[0].gen), (1, gen));
        assert_eq!(&pages[0].bytes[..4], &[0, 0, b'a', b'b']);
        assert!(
            !pages[0].changed.is_empty(),
            "the changed bytes come back too"
        );
    }

    /// The dirty set that write-back walks agrees with the pages' own marks through writes,
    /// write-backs, drops and a rollback, among many clean pages of the same file.
    #[test]
    fn dirty_pages_are_found_among_many_clean_ones() {
        let mut c = DataCache::new(4096);
        for l in 0..1000 {
            c.insert(7, l, vec![0u8; 8].into(), false);
        }
        c.write_page(7, 900, 0, b"a", 1, DataMode::Ordered, None);
        c.write_page(7, 10, 0, b"b", 1, DataMode::Ordered, None);
        let lblks = |c: &DataCache| c.dirty_pages(7).iter().map(|p| p.lblk).collect::<Vec<_>>();
        assert_eq!(lblks(&c), vec![10, 900]);
        let pages = c.dirty_pages(7);
        c.written_back(7, 10, pages[0].gen);
        assert_eq!(lblks(&c), vec![900]);
        c.begin_undo();
        c.write_page(7, 500, 0, b"c", 1, DataMode::Ordered, None);
        c.drop_range(7, 900, 901);
        assert_eq!(lblks(&c), vec![500]);
        c.rollback();
        assert_eq!(lblks(&c), vec![900]);
        let marked: Vec<u32> = (0..1000)
            .filter(|l| c.get(7, *l).is_some_and(|p| p.dirty))
            .collect();
        assert_eq!(marked, vec![900]);
        assert_eq!((c.dirty_count(), c.dirty_count_of(7)), (1, 1));
        c.drop_file(7);
        assert!(c.dirty_files().is_empty());
    }

    #[test]
    fn eviction_keeps_dirty_pages() {
        let mut c = DataCache::new(64);
        for l in 0..64 {
            c.insert(1, l, vec![0u8; 8].into(), true);
            c.write_page(1, l, 0, b"d", 1, DataMode::Ordered, None);
        }
        for l in 64..200 {
            c.insert(2, l, vec![0u8; 8].into(), false);
        }
        assert_eq!(c.dirty_count(), 64);
        assert!((0..64).all(|l| c.get(1, l).is_some()));
        assert!(c.pages <= 64 + 48);
    }

    #[test]
    fn eviction_keeps_a_page_that_is_read_again_and_again() {
        // Goal: a page in use survives a stream of pages read once (second chance). Fails
        // with eviction in map order, which drops the lowest block of the file first.
        let mut c = DataCache::new(64);
        c.insert(2, 0, vec![7u8; 8].into(), false);
        for l in 1..1000 {
            let mut page = [0u8; 8];
            assert!(c.copy_out(2, 0, &mut page, 8), "evicted at block {l}");
            assert_eq!(page, [7u8; 8]);
            assert!(c.insert_read(2, l, vec![0u8; 8].into(), c.drops(2)));
        }
        assert!(c.pages <= 64);
        c.drop_clean();
        assert_eq!(c.pages, 0);
    }

    #[test]
    fn a_fetched_block_is_kept_only_into_an_empty_slot_and_before_any_drop() {
        // Goal: what a reader fetched without the metadata lock never replaces a page and is
        // dropped when pages were dropped since its plan; an operation's rollback does not
        // resurrect or double-count it. Method: the cache alone.
        let mut c = DataCache::new(64);
        c.insert(3, 0, vec![1u8; 8].into(), false);
        let planned = c.drops(3);
        assert!(!c.insert_read(3, 0, vec![9u8; 8].into(), planned));
        assert_eq!(&c.get(3, 0).unwrap().bytes[..], &[1u8; 8]);
        assert!(c.insert_read(3, 1, vec![2u8; 8].into(), planned));
        // A drop of another file leaves a fetch current; a drop of the file (even one with
        // no pages: it may have been deleted) makes older fetches stale.
        let planned = c.drops(7);
        c.drop_file(44);
        assert!(c.insert_read(7, 0, vec![3u8; 8].into(), planned));
        c.drop_file(7);
        assert!(!c.insert_read(7, 1, vec![3u8; 8].into(), planned));
        assert!(c.get(7, 1).is_none() && c.get(7, 0).is_none());
        // Inside an operation: the fetched page is not noted, so a rollback keeps it.
        c.begin_undo();
        c.insert(3, 5, vec![5u8; 8].into(), false);
        assert!(c.insert_read(3, 6, vec![6u8; 8].into(), c.drops(3)));
        c.rollback();
        assert!(c.get(3, 5).is_none());
        assert_eq!(&c.get(3, 6).unwrap().bytes[..], &[6u8; 8]);
        assert_eq!((c.pages, c.dirty_count()), (3, 0));
        // Bytes across pages; a missing page in the range is a miss.
        let mut out = vec![0u8; 10];
        assert!(c.copy_out(3, 4, &mut out, 8));
        assert_eq!(out, [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        let mut out = vec![0u8; 10];
        assert!(!c.copy_out(3, 10, &mut out, 8));
        assert!(c.copy_out(3, 0, &mut [], 8));
        c.drop_clean();
        assert_eq!(c.pages, 0);
    }

    /// Goal: a write without the lock given its whole pages made ahead leaves exactly what
    /// the same write copied under the mutex leaves: bytes, dirty and changed ranges,
    /// reservations, over holes and over pages already cached (one shared with a commit's
    /// snapshot, which must keep its old bytes); partial blocks at both ends still copy.
    #[test]
    fn whole_pages_made_ahead_write_what_a_copy_writes() {
        let none = WholePages::of(5, &[1u8; 10], 16);
        assert!(none.pages.is_empty());
        let w = WholePages::of(10, &[2u8; 40], 16);
        assert_eq!((w.first, w.pages.len()), (1, 2));
        assert!(w.get(0).is_none() && w.get(3).is_none());
        let data: Vec<u8> = (0..70u8).collect();
        let mut caches = Vec::new();
        for ahead in [false, true] {
            let mut c = DataCache::new(64);
            c.publish_map(5, Arc::new(ExtentMap::default()));
            c.add_spare(8);
            c.insert(5, 2, Arc::from(vec![9u8; 16]), true);
            let snapshot = Arc::clone(&c.get(5, 2).unwrap().bytes);
            let whole = if ahead {
                WholePages::of(6, &data, 16)
            } else {
                WholePages::default()
            };
            let holes = c
                .write_cached_with(5, 6, &data, 16, DataMode::Ordered, &whole)
                .unwrap();
            assert_eq!(holes, 4, "blocks 0, 1, 3 and 4 were holes");
            assert_eq!(&snapshot[..], &[9u8; 16], "the snapshot changed");
            caches.push(c);
        }
        for lblk in 0..5 {
            let (a, b) = (
                caches[0].get(5, lblk).unwrap(),
                caches[1].get(5, lblk).unwrap(),
            );
            assert_eq!(a.bytes, b.bytes, "block {lblk}");
            assert_eq!((a.dirty, a.reserved), (b.dirty, b.reserved), "block {lblk}");
            assert_eq!(a.changed, b.changed, "block {lblk}");
        }
        assert_eq!(caches[0].dirty_count(), caches[1].dirty_count());
        assert_eq!(caches[0].reserved(), caches[1].reserved());
    }
}
