//! What an fsync needs to decide what to wait for, readable without the metadata lock
//! (docs/DESIGN.md §4.3, "fsync planning"): the running transaction's tid, whether a commit's
//! write-back is running, and for each inode the transactions holding its last changes; and
//! the decision itself ([`plan`]), one for the planning with and without that lock.
//!
//! Invariants:
//! - [`SyncView::running`] is `Meta::tid`, stored under the metadata lock with every change;
//! - [`SyncView::writeback`] is odd from before a commit's write-back starts until after the
//!   running tid moved past the transaction it closed, so a planner that read it even, and
//!   the same value after reading the running tid, the file's pending record and its dirty
//!   pages, knows that no write-back ran in between: one that starts later takes whatever the
//!   planner saw into the transaction it read as running;
//! - an inode's tids are set by `Meta::write_inode` under the metadata lock before the
//!   operation that changed it returns, so an fsync that starts after it sees them; and
//!   before it removes the record of writes without the lock that the inode now holds, and
//!   by write-back before a page that joins the transaction as journaled data turns clean,
//!   so a planner that reads the pages and record first and the tids after never misses
//!   both (any operation under the lock may fold a record, not only a commit's write-back).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

use super::cached_writes::PendingInode;
use super::fsync_queue::SyncWork;
use crate::journal::tid_geq;

/// The transactions that hold an inode's last changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InodeTids {
    /// Last change of any kind (fsync waits for it).
    pub any: u32,
    /// Last change other than timestamps (fdatasync waits for it), if any.
    pub data: Option<u32>,
}

/// See the module documentation.
pub(crate) struct SyncView {
    running: AtomicU32,
    writeback: AtomicU64,
    /// Wakes the planners waiting for a write-back window to close ([`SyncView::wait_closed`]).
    closed: (Mutex<()>, Condvar),
    /// For each inode changed by a transaction not known durable yet, its [`InodeTids`].
    tids: Mutex<HashMap<u32, InodeTids>>,
}

impl SyncView {
    /// A view whose running transaction is `tid`.
    pub fn new(tid: u32) -> SyncView {
        SyncView {
            running: AtomicU32::new(tid),
            writeback: AtomicU64::new(0),
            closed: (Mutex::new(()), Condvar::new()),
            tids: Mutex::new(HashMap::new()),
        }
    }

    /// The running transaction's tid.
    pub fn running(&self) -> u32 {
        self.running.load(Ordering::SeqCst)
    }

    /// The running transaction is now `tid` (under the metadata lock).
    pub fn set_running(&self, tid: u32) {
        self.running.store(tid, Ordering::SeqCst);
    }

    /// A commit's write-back is about to start: until the guard drops (after the running tid
    /// moved on, or the commit gave up), planners without the lock wait
    /// ([`SyncView::wait_closed`]).
    pub fn writeback_window(&self) -> WritebackWindow<'_> {
        self.writeback.fetch_add(1, Ordering::SeqCst);
        WritebackWindow(self)
    }

    /// The write-back counter (odd: a write-back runs).
    pub fn writeback_count(&self) -> u64 {
        self.writeback.load(Ordering::SeqCst)
    }

    /// Waits until the counter is no longer `count` (the window it counts has closed), for
    /// at most `patience`; whether it closed.
    pub fn wait_closed(&self, count: u64, patience: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + patience;
        let mut g = self.closed.0.lock();
        // Read under the mutex the closer takes after counting: no wake-up is missed.
        while self.writeback_count() == count {
            if self.closed.1.wait_until(&mut g, deadline).timed_out() {
                return self.writeback_count() != count;
            }
        }
        true
    }

    /// The tids of `ino`'s last changes, if not known durable.
    pub fn tids(&self, ino: u32) -> Option<InodeTids> {
        self.tids.lock().get(&ino).copied()
    }

    /// Inode `ino` changed in transaction `tid`; `times_only` when only its timestamps did.
    pub fn changed(&self, ino: u32, tid: u32, times_only: bool) {
        let mut tids = self.tids.lock();
        let t = tids.entry(ino).or_insert(InodeTids {
            any: tid,
            data: None,
        });
        t.any = tid;
        if !times_only {
            t.data = Some(tid);
        }
    }

    /// Forgets the tids that transaction `tid` made durable.
    pub fn durable(&self, tid: u32) {
        self.tids.lock().retain(|_, t| {
            if t.data.is_some_and(|d| tid_geq(tid, d)) {
                t.data = None;
            }
            !tid_geq(tid, t.any)
        });
    }
}

/// A commit's write-back window; closes on drop (see [`SyncView::writeback_window`]).
pub(crate) struct WritebackWindow<'a>(&'a SyncView);

impl Drop for WritebackWindow<'_> {
    fn drop(&mut self) {
        self.0.writeback.fetch_add(1, Ordering::SeqCst);
        let _g = self.0.closed.0.lock();
        self.0.closed.1.notify_all();
    }
}

/// What an fsync of file `ino` (`datasync`: an fdatasync) waits for, given the running tid,
/// the last durable one, whether the file has dirty pages, the record writes without the lock
/// left for it (`fs/cached_writes.rs`) and its tids.
pub(crate) fn plan(
    ino: u32,
    datasync: bool,
    running: u32,
    durable: u32,
    dirty: bool,
    pending: Option<PendingInode>,
    tids: Option<InodeTids>,
) -> Option<SyncWork> {
    // A size or times that writes without the lock left go into the inode at the running
    // transaction's write-back (a change of times alone not for fdatasync).
    let pending_tid = pending.filter(|p| p.grew || !datasync).map(|_| running);
    let target = pending_tid.or_else(|| {
        tids.and_then(|t| if datasync { t.data } else { Some(t.any) })
            .filter(|&t| !tid_geq(durable, t))
    });
    match target {
        // A transaction already closed wrote back only the pages dirty at its close: those
        // written since need their own write-back.
        Some(t) if dirty && t != running => Some(SyncWork::CommitThenOverwrites(t, ino)),
        // The running transaction's commit writes every dirty page back as well.
        Some(t) => Some(SyncWork::Commit(t)),
        None if dirty => Some(SyncWork::Overwrites(ino)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the decision follows the rules of docs/DESIGN.md §4.3: a record that grew the
    /// file (or any record, for fsync) waits for the running transaction; else the inode's
    /// last (data) change if not durable; pages written after a closed transaction go home
    /// after it; dirty pages alone go home without a commit.
    #[test]
    fn plans_follow_the_rules() {
        let grew = PendingInode {
            seq: 1,
            size: 10,
            mtime: Default::default(),
            ctime: Default::default(),
            grew: true,
        };
        let times = PendingInode {
            grew: false,
            ..grew
        };
        let tids = InodeTids {
            any: 8,
            data: Some(7),
        };
        let p = |datasync, dirty, pending, tids| plan(5, datasync, 9, 6, dirty, pending, tids);
        assert!(matches!(
            p(true, true, Some(grew), None),
            Some(SyncWork::Commit(9))
        ));
        assert!(matches!(
            p(false, true, Some(times), None),
            Some(SyncWork::Commit(9))
        ));
        assert!(matches!(
            p(true, true, Some(times), Some(tids)),
            Some(SyncWork::CommitThenOverwrites(7, 5))
        ));
        assert!(matches!(
            p(false, false, None, Some(tids)),
            Some(SyncWork::Commit(8))
        ));
        assert!(matches!(
            p(true, true, None, None),
            Some(SyncWork::Overwrites(5))
        ));
        assert!(p(true, false, Some(times), None).is_none());
        // Durable already: nothing to wait for.
        let old = InodeTids {
            any: 6,
            data: Some(6),
        };
        assert!(p(false, false, None, Some(old)).is_none());
    }

    /// Goal: durable tids are forgotten, the data tid before the inode's entry.
    #[test]
    fn durable_tids_are_forgotten() {
        let v = SyncView::new(3);
        v.changed(4, 3, false);
        v.changed(4, 4, true);
        assert_eq!(
            v.tids(4),
            Some(InodeTids {
                any: 4,
                data: Some(3)
            })
        );
        v.durable(3);
        assert_eq!(v.tids(4).unwrap().data, None);
        v.durable(4);
        assert_eq!(v.tids(4), None);
        let w = v.writeback_window();
        assert_eq!(v.writeback_count() % 2, 1);
        drop(w);
        assert_eq!(v.writeback_count() % 2, 0);
    }
}
