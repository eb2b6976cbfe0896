//! Device reads kept out of the metadata lock.
//!
//! An operation runs under the metadata lock from start to end (`Inner::lock_meta_reading`
//! runs every operation of the API, the commit's write-back and fsync planning). When it
//! needs a block that is in no memory copy (buffer cache, commit in flight, journal), it does
//! not read the device under the lock: it asks for the block ([`DeferredReads::home_copy`])
//! and fails; the operation is rolled back whole, the lock is released, the block is read, and
//! the operation runs again with the block at hand ([`FetchedBlocks`]). So no operation
//! waits behind another one's device read (docs/DESIGN.md §2.5).
//!
//! A fetched block is used only while it is still the newest copy: the cache did not hold it
//! when its read was planned, and its removal stamp (`BlockCache::removal_stamp`) has not
//! moved since; otherwise it is read again. After [`MAX_DEFERRED_ROUNDS`] reads for one
//! operation the rest are done under the lock, so an operation always ends.
//!
//! This module owns the bookkeeping; `Meta::read_home` is where it is used.

use std::collections::HashMap;

use crate::{FsError, Result};

/// Rounds of reads without the lock one operation may ask for before it reads under the lock.
/// An operation usually misses a handful of blocks (an inode-table block, a directory block,
/// a bitmap, an extent leaf); a long cold walk finishes under the lock.
pub(crate) const MAX_DEFERRED_ROUNDS: u32 = 16;

/// A block read without the lock, with the removal stamp it had when the read was planned.
struct Fetched {
    stamp: u64,
    bytes: Box<[u8]>,
}

/// Blocks read without the lock for one operation, kept across its runs.
#[derive(Default)]
pub(crate) struct FetchedBlocks(HashMap<u64, Fetched>);

impl FetchedBlocks {
    /// Adds block `nr`, read after its read was planned at removal stamp `stamp`.
    pub fn insert(&mut self, nr: u64, stamp: u64, bytes: Box<[u8]>) {
        self.0.insert(nr, Fetched { stamp, bytes });
    }
}

/// Whether and how the running operation reads the device (see the module comment).
#[derive(Default)]
pub(crate) struct DeferredReads {
    /// Reads are deferred: the operation runs inside `Inner::lock_meta_reading`. Otherwise
    /// (mount, unmount, lightweight frees after a commit) `Meta` reads the device itself.
    active: bool,
    fetched: FetchedBlocks,
    /// The block the operation asked for, if it stopped for one.
    wanted: Option<u64>,
    /// The operation had changed cached metadata when it asked (its run's changes are taken
    /// back and made again).
    after_change: bool,
}

impl DeferredReads {
    /// An operation starts: with `defer`, device reads it needs are asked for instead of done,
    /// and the blocks in `fetched` serve them.
    pub fn begin(&mut self, fetched: FetchedBlocks, defer: bool) {
        self.active = defer;
        self.fetched = fetched;
        self.wanted = None;
        self.after_change = false;
    }

    /// The operation ended: the block it asked for, if any, and the fetched blocks (for its
    /// next run). Reads are done directly again.
    pub fn end(&mut self) -> (Option<u64>, FetchedBlocks) {
        self.active = false;
        (self.wanted.take(), std::mem::take(&mut self.fetched))
    }

    /// The operation asked for a block: whatever it did must be taken back.
    pub fn stopped(&self) -> bool {
        self.wanted.is_some()
    }

    /// The last run stopped for a block after it had changed cached metadata (kept after
    /// [`DeferredReads::end`], until the next run begins).
    pub fn stopped_after_change(&self) -> bool {
        self.after_change
    }

    /// Block `nr` for an operation that needs its home copy, `stamp` being its removal stamp
    /// now and `changed` whether the operation changed cached metadata so far: `None` when
    /// reads are not deferred (the caller reads the device), else the fetched bytes if still
    /// current, or an error after asking for the block.
    pub fn home_copy(&mut self, nr: u64, stamp: u64, changed: bool) -> Option<Result<Box<[u8]>>> {
        if !self.active {
            return None;
        }
        match self.fetched.0.get(&nr) {
            Some(f) if f.stamp == stamp => Some(Ok(f.bytes.clone())),
            _ => {
                self.wanted = Some(nr);
                self.after_change = changed;
                Some(Err(deferred()))
            }
        }
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
            r.home_copy(7, 0, false).is_none(),
            "not deferring: the caller reads"
        );
        r.begin(FetchedBlocks::default(), true);
        assert!(matches!(r.home_copy(7, 0, false), Some(Err(_))));
        assert!(r.stopped());
        let (wanted, mut fetched) = r.end();
        assert_eq!(wanted, Some(7));
        fetched.insert(7, 3, vec![1u8; 8].into_boxed_slice());
        r.begin(fetched, true);
        assert_eq!(&r.home_copy(7, 3, false).unwrap().unwrap()[..], &[1u8; 8]);
        assert!(!r.stopped());
        assert!(
            matches!(r.home_copy(7, 4, false), Some(Err(_))),
            "stale: read again"
        );
        assert_eq!(r.end().0, Some(7));
    }
}
