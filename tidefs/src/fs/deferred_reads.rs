//! Device reads kept out of the metadata lock.
//!
//! An operation runs under the metadata lock from start to end (`Inner::lock_meta_reading`
//! runs every operation of the API, the commit's write-back and fsync planning). When it
//! needs a block that is in no memory copy (buffer cache, commit in flight, journal), it does
//! not read the device under the lock: it asks for the block ([`DeferredReads::home_copies`])
//! and fails; the operation, which has changed nothing yet, ends, the lock is released, the
//! block is read, and the operation runs again with the block at hand ([`FetchedBlocks`]). So
//! no operation waits behind another one's device read (docs/DESIGN.md §2.5). An operation
//! that has changed metadata already never stops: it reads under the lock, and such reads are
//! counted (`Stats::reads_after_change`), since fetching before the first change is the rule
//! (docs/DESIGN.md §4.1) and a change is never taken back for a read.
//!
//! A fetched block is used only while it is still the newest copy: the cache did not hold it
//! when its read was planned, and its removal stamp (`BlockCache::removal_stamp`) has not
//! moved since; otherwise it is read again. After [`MAX_DEFERRED_ROUNDS`] stops of one
//! operation (for reads or index builds) the rest of its reads are done under the lock, so an
//! operation always ends; they are counted (`Stats::reads_under_lock`).
//!
//! An operation that knows which blocks it will read, before it has changed anything, asks
//! for all those missing at once (`Meta::prefetch`, up to [`MAX_BATCH`]): the first lookup in
//! a large directory whose blocks left the caches reads them in one stop, contiguous runs in
//! one device read each, instead of one stop per block and the rest under the lock. Those
//! blocks are not held for the operation: when the lock is taken again they join the buffer
//! cache as clean blocks, those still current (`Meta::keep_read_ahead`), so what is read
//! ahead stays within the cache's bound, and a block that fails to read is left out (the
//! operation stops for it alone if it needs it, and then gets the error).
//!
//! An operation may also stop to have a large directory's name index built without the lock
//! (`DeferredReads::want_build`, `fs/dir_index.rs`): it runs again with the index at hand
//! (`DeferredReads::take_built`), which it takes only if the directory's blocks did not
//! change meanwhile.
//!
//! This module owns the bookkeeping; `Meta::read_home` and `Meta::prefetch` are where it is
//! used.

use std::collections::{HashMap, HashSet};

use super::dir_index::{BuiltIndex, DirBuild};
use crate::{FsError, Result};

/// Rounds of reads without the lock one operation may ask for before it reads under the lock.
/// An operation usually misses a handful of blocks (an inode-table block, a directory block,
/// a bitmap, an extent leaf); a long cold walk finishes under the lock.
pub(crate) const MAX_DEFERRED_ROUNDS: u32 = 16;

/// Blocks one stop may ask for at once (4 MiB of 4 KiB blocks): what an operation holds
/// fetched stays bounded, and a larger walk takes several stops.
pub(crate) const MAX_BATCH: usize = 1024;

/// What a stopped operation asked for: blocks to read, for its own use or ahead of it, or a
/// directory index to build.
pub(crate) struct Wanted {
    pub blocks: Vec<u64>,
    /// Read ahead ([`DeferredReads::want_all`]): the blocks join the buffer cache when the
    /// lock is taken again, and one that fails to read is left out.
    pub ahead: bool,
    /// A directory index to build without the lock ([`DeferredReads::want_build`]).
    pub build: Option<DirBuild>,
}

impl Wanted {
    /// The operation did not stop.
    pub fn nothing(&self) -> bool {
        self.blocks.is_empty() && self.build.is_none()
    }
}

/// A block read without the lock, with the removal stamp it had when the read was planned.
struct Fetched {
    stamp: u64,
    bytes: Box<[u8]>,
}

/// Blocks read without the lock for one operation, kept across its runs, and the blocks
/// its read-ahead failed to read (not asked for ahead again).
#[derive(Default)]
pub(crate) struct FetchedBlocks {
    blocks: HashMap<u64, Fetched>,
    failed_ahead: HashSet<u64>,
    /// Directory indexes built without the lock, not taken yet.
    built: Vec<BuiltIndex>,
    /// Directories whose index the operation asked to build (once each).
    build_asked: HashSet<u32>,
}

impl FetchedBlocks {
    /// Adds block `nr`, read after its read was planned at removal stamp `stamp`.
    pub fn insert(&mut self, nr: u64, stamp: u64, bytes: Box<[u8]>) {
        self.blocks.insert(nr, Fetched { stamp, bytes });
    }

    /// Blocks read ahead failed to read: the operation stops for one of them alone if it
    /// needs it.
    pub fn failed_ahead(&mut self, blocks: impl IntoIterator<Item = u64>) {
        self.failed_ahead.extend(blocks);
    }

    /// Adds an index built without the lock.
    pub fn built(&mut self, built: BuiltIndex) {
        self.built.push(built);
    }

    /// Whether block `nr` was fetched and is still current at removal stamp `stamp`.
    fn current(&self, nr: u64, stamp: u64) -> bool {
        self.current_bytes(nr, stamp).is_some()
    }

    /// The bytes of block `nr`, if fetched and still current at removal stamp `stamp`.
    fn current_bytes(&self, nr: u64, stamp: u64) -> Option<&[u8]> {
        self.blocks
            .get(&nr)
            .filter(|f| f.stamp == stamp)
            .map(|f| &f.bytes[..])
    }
}

/// Whether and how the running operation reads the device (see the module comment).
#[derive(Default)]
pub(crate) struct DeferredReads {
    /// Reads are deferred: the operation runs inside `Inner::lock_meta_reading`. Otherwise
    /// (mount, unmount, lightweight frees after a commit) `Meta` reads the device itself.
    active: bool,
    /// An operation of `Inner::lock_meta_reading` runs, deferring or not.
    running: bool,
    /// Device reads operations made under the lock (past their rounds without it), and
    /// directory indexes built without the lock that operations took, not yet moved into the
    /// file system's counters.
    under_lock: u64,
    built_taken: u64,
    fetched: FetchedBlocks,
    /// The blocks the operation asked for, if it stopped for some.
    wanted: Vec<u64>,
    /// They were asked for ahead of their use ([`DeferredReads::want_all`]).
    ahead: bool,
    /// The directory index the operation asked to build, if it stopped for that.
    build: Option<DirBuild>,
    /// Device reads operations made under the lock after their first change (they never
    /// stop then), not yet moved into the file system's counters.
    after_change: u64,
}

impl DeferredReads {
    /// An operation starts: with `defer`, device reads it needs are asked for instead of done,
    /// and the blocks in `fetched` serve them.
    pub fn begin(&mut self, fetched: FetchedBlocks, defer: bool) {
        self.active = defer;
        self.running = true;
        self.fetched = fetched;
        self.wanted.clear();
        self.ahead = false;
        self.build = None;
    }

    /// The operation ended: the blocks it asked for (none if it did not stop), and the
    /// fetched blocks (for its next run). Reads are done directly again.
    pub fn end(&mut self) -> (Wanted, FetchedBlocks) {
        self.active = false;
        self.running = false;
        let wanted = Wanted {
            blocks: std::mem::take(&mut self.wanted),
            ahead: self.ahead,
            build: self.build.take(),
        };
        (wanted, std::mem::take(&mut self.fetched))
    }

    /// The operation asked for a block: whatever it did must be taken back.
    pub fn stopped(&self) -> bool {
        !self.wanted.is_empty() || self.build.is_some()
    }

    /// An operation of `Inner::lock_meta_reading` runs (its reads deferred or not).
    pub fn running(&self) -> bool {
        self.running
    }

    /// Reads are deferred: an operation may ask for blocks ([`DeferredReads::want_all`]).
    pub fn deferring(&self) -> bool {
        self.active
    }

    /// Of `blocks` (with their removal stamps now), the first `limit` (at most
    /// [`MAX_BATCH`]) not fetched or fetched but no longer current, and not failed to read
    /// ahead before: what a stop must read ahead.
    pub fn missing(&self, blocks: impl IntoIterator<Item = (u64, u64)>, limit: usize) -> Vec<u64> {
        blocks
            .into_iter()
            .filter(|&(nr, stamp)| {
                !self.fetched.current(nr, stamp) && !self.fetched.failed_ahead.contains(&nr)
            })
            .map(|(nr, _)| nr)
            .take(limit.min(MAX_BATCH))
            .collect()
    }

    /// The operation, which has changed nothing yet, asks for `blocks` at once: it stops
    /// with the returned error, and runs again once they are read.
    pub fn want_all(&mut self, blocks: Vec<u64>) -> FsError {
        debug_assert!(self.active && !blocks.is_empty());
        self.wanted = blocks;
        self.ahead = true;
        deferred()
    }

    /// Whether the operation may ask for the index of directory `dir` to be built without
    /// the lock: reads are deferred, and it has not asked for that directory before (an
    /// index found stale is then built under the lock, so the operation ends).
    pub fn may_build(&self, dir: u32) -> bool {
        self.active && !self.fetched.build_asked.contains(&dir)
    }

    /// The operation, which has changed nothing yet, asks for a directory index to be built
    /// without the lock: it stops with the returned error, and runs again with the index
    /// at hand ([`DeferredReads::take_built`]).
    pub fn want_build(&mut self, build: DirBuild) -> FsError {
        debug_assert!(self.may_build(build.shape.dir));
        self.fetched.build_asked.insert(build.shape.dir);
        self.build = Some(build);
        deferred()
    }

    /// The index of directory `dir` built without the lock for this operation, if any.
    pub fn take_built(&mut self, dir: u32) -> Option<BuiltIndex> {
        let at = self.fetched.built.iter().position(|b| b.dir() == dir)?;
        Some(self.fetched.built.swap_remove(at))
    }

    /// An index built without the lock was found current and used.
    pub fn count_built_taken(&mut self) {
        self.built_taken += 1;
    }

    /// The indexes built without the lock and used since the last call.
    pub fn take_built_taken(&mut self) -> u64 {
        std::mem::take(&mut self.built_taken)
    }

    /// The device reads made under the lock since the last call.
    pub fn take_under_lock(&mut self) -> u64 {
        std::mem::take(&mut self.under_lock)
    }

    /// The device reads made under the lock after an operation's first change since the
    /// last call.
    pub fn take_after_change(&mut self) -> u64 {
        std::mem::take(&mut self.after_change)
    }

    /// `blocks` (each with its removal stamp now) for an operation that needs their home
    /// copies, `changed` being whether the operation changed cached metadata so far: `None`
    /// when the caller reads the device (reads are not deferred, or the operation changed
    /// something: it never stops then, and the reads are counted), else the fetched bytes in
    /// the order given if all are still current, or an error after asking for every one
    /// that is not: one stop for all, so an operation that needs two (a write's two partial
    /// edge blocks) reads them in one round, not one round each.
    pub fn home_copies(
        &mut self,
        blocks: &[(u64, u64)],
        changed: bool,
    ) -> Option<Result<Vec<Box<[u8]>>>> {
        if self.active {
            let all: Option<Vec<Box<[u8]>>> = blocks
                .iter()
                .map(|&(n, s)| self.fetched.current_bytes(n, s).map(Box::from))
                .collect();
            if let Some(all) = all {
                return Some(Ok(all));
            }
        }
        if !self.active || changed {
            // The caller reads them all from the device: counted as what they are on both
            // counts, past the rounds without the lock and after the operation's first change.
            let n = blocks.len() as u64;
            if self.running && !self.active {
                self.under_lock += n;
            }
            if self.running && changed {
                self.after_change += n;
            }
            return None;
        }
        self.wanted = blocks
            .iter()
            .filter(|&&(n, s)| !self.fetched.current(n, s))
            .map(|&(n, _)| n)
            .collect();
        self.ahead = false;
        Some(Err(deferred()))
    }
}

/// The error an operation stops with when it asked for a block. `Inner::lock_meta_reading`
/// never returns it: it reads the block and runs the operation again.
fn deferred() -> FsError {
    FsError::Io(std::io::Error::new(
        std::io::ErrorKind::WouldBlock,
        "block read deferred out of the metadata lock",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a fetched block serves only while its stamp holds; a missing or stale one is asked
    /// for; with reads not deferred nothing is served or asked for.
    #[test]
    fn fetched_blocks_serve_only_while_current() {
        let mut r = DeferredReads::default();
        assert!(
            r.home_copies(&[(7, 0)], false).is_none(),
            "not deferring: the caller reads"
        );
        r.begin(FetchedBlocks::default(), true);
        assert!(matches!(r.home_copies(&[(7, 0)], false), Some(Err(_))));
        assert!(r.stopped());
        let (wanted, mut fetched) = r.end();
        assert_eq!(wanted.blocks, [7]);
        assert!(!wanted.ahead);
        fetched.insert(7, 3, vec![1u8; 8].into_boxed_slice());
        r.begin(fetched, true);
        assert_eq!(
            &r.home_copies(&[(7, 3)], false).unwrap().unwrap()[0][..],
            &[1u8; 8]
        );
        assert!(!r.stopped());
        assert!(
            matches!(r.home_copies(&[(7, 4)], false), Some(Err(_))),
            "stale: read again"
        );
        assert_eq!(r.end().0.blocks, [7]);
    }

    /// Goal: several home copies asked for together stop once, asking only for those not
    /// fetched and current, and are then served in the order asked. Method: one of two
    /// blocks fetched, the other missing; then both fetched.
    #[test]
    fn home_copies_ask_once_for_every_missing_block() {
        let mut fetched = FetchedBlocks::default();
        fetched.insert(9, 1, vec![9u8; 8].into_boxed_slice());
        let mut r = DeferredReads::default();
        r.begin(fetched, true);
        assert!(matches!(
            r.home_copies(&[(4, 0), (9, 1)], false),
            Some(Err(_))
        ));
        let (wanted, mut fetched) = r.end();
        assert_eq!(wanted.blocks, [4], "only the block not fetched");
        assert!(!wanted.ahead);
        fetched.insert(4, 0, vec![4u8; 8].into_boxed_slice());
        r.begin(fetched, true);
        let got = r.home_copies(&[(9, 1), (4, 0)], false).unwrap().unwrap();
        assert_eq!((got[0][0], got[1][0]), (9, 4), "in the order asked");
        assert!(!r.stopped());
        assert!(
            r.home_copies(&[(9, 1), (4, 0)], true).unwrap().is_ok(),
            "fetched copies serve after a change too"
        );
    }

    /// Goal: a batch asks only for the blocks not fetched or no longer current, and the
    /// reads made under the lock (past the rounds without it) are counted, those of mount
    /// and unmount (no operation running) not.
    #[test]
    fn batches_skip_current_blocks_and_reads_under_the_lock_are_counted() {
        let mut fetched = FetchedBlocks::default();
        fetched.insert(1, 5, vec![0u8; 8].into_boxed_slice());
        fetched.insert(2, 5, vec![0u8; 8].into_boxed_slice());
        fetched.failed_ahead([4]);
        let mut r = DeferredReads::default();
        r.begin(fetched, true);
        assert_eq!(r.missing([(1, 5), (2, 6), (3, 0), (4, 0)], 10), [2, 3]);
        assert_eq!(r.missing([(1, 5), (2, 6), (3, 0)], 1), [2]);
        let many = (0..5000).map(|nr| (nr + 10, 0));
        assert_eq!(r.missing(many, usize::MAX).len(), MAX_BATCH);
        let _ = r.want_all(vec![2, 3]);
        assert!(r.stopped());
        let wanted = r.end().0;
        assert_eq!(wanted.blocks, [2, 3]);
        assert!(wanted.ahead);
        assert!(
            r.home_copies(&[(9, 0)], false).is_none(),
            "no operation: not counted"
        );
        r.begin(FetchedBlocks::default(), false);
        assert!(r.home_copies(&[(9, 0)], false).is_none());
        assert!(r.home_copies(&[(10, 0)], false).is_none());
        r.end();
        assert_eq!(r.take_under_lock(), 2);
        assert_eq!(r.take_under_lock(), 0);
    }
}
