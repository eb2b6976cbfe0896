//! `CommitLog`: the seam between the file system and whatever makes its transactions durable.
//!
//! The fs layer needs few things from a commit log: make a snapshot of blocks (and revokes)
//! durable as one transaction, serve the newest committed copy of a block until it is home,
//! write committed blocks home and reclaim log space, shut down cleanly, and stop for good
//! after an error. [`Journal`] (the jbd2 log) implements it; later logs slot in beside it
//! without changes above this trait:
//!
//! - an NVM in-place commit, whose `commit` freezes the transaction's blocks in a persistent
//!   buffer cache instead of copying them to a log, and whose `pending` serves the frozen
//!   copies;
//! - discreet mode, a jbd2 log whose ordering points evict the disk's cache through a
//!   flushzone instead of flushing it.
//!
//! How fs uses it: hold the log as `Arc<dyn CommitLog>`; commit the running transaction with
//! [`CommitLog::commit`] (its tid must match [`CommitLog::next_tid`] taken when the
//! transaction was closed); look a block up with [`CommitLog::pending`] before its home
//! location; keep transactions at most [`CommitLog::max_transaction_blocks`]; call
//! [`CommitLog::checkpoint`] where the journal must be empty of a block's older copies
//! (never needed for space: the log reclaims it itself); [`CommitLog::close`] at unmount;
//! [`CommitLog::abort`] on the first failed commit. Recovery happens when the log is opened,
//! before the file system reads anything, so it is not part of this trait.
//!
//! Invariants every implementation keeps:
//! - `commit` returns only once the transaction is durable (`commit_holding` may return
//!   with it held, and then the next successful commit or `finish_held` makes it durable),
//!   and after an error no later commit succeeds;
//! - `pending(b)` is the content of `b` in the newest durable transaction that logged it,
//!   until a copy at least that new is durable at home (or a later transaction revoked it);
//! - a checkpoint never writes a block's older copy home after a newer one.

use std::sync::Arc;

use super::log::{CommitRequest, Journal, JournalStats, Tid};
use crate::error::Result;

/// How full a commit log is, in its own units (journal blocks for jbd2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSpace {
    /// Units held by committed transactions not yet checkpointed.
    pub used: u64,
    /// Units the log holds in all.
    pub capacity: u64,
}

/// What makes the file system's transactions durable. See the module documentation.
pub trait CommitLog: Send + Sync {
    /// Makes `req` durable as one transaction and returns its tid.
    fn commit(&self, req: CommitRequest) -> Result<Tid>;
    /// Like [`CommitLog::commit`], but may return before the transaction is durable, with
    /// what is left to write (for jbd2, the commit block) held (the `bool` is then true): the
    /// next commit writes it with its own first batch and one flush makes both durable, or
    /// [`CommitLog::finish_held`] writes it alone. A commit that returns `Ok` has made every
    /// earlier held transaction durable. Held, a transaction is not yet in `pending`,
    /// `is_logged` or `held_in`: the caller keeps serving its blocks.
    fn commit_holding(&self, req: CommitRequest, may_hold: bool) -> Result<(Tid, bool)>;
    /// Makes the held transaction (if any) durable; returns its tid.
    fn finish_held(&self) -> Result<Option<Tid>>;
    /// The newest committed copy of `home_block` not yet written home.
    fn pending(&self, home_block: u64) -> Option<Arc<[u8]>>;
    /// Writes every committed block home and reclaims the log space they held.
    fn checkpoint(&self) -> Result<()>;
    /// Clean shutdown: checkpoints everything and leaves the log empty.
    fn close(&self) -> Result<()>;
    /// Stops the log for good after an error, recording `errno` on disk where it can.
    fn abort(&self, errno: i32) -> Result<()>;
    /// The error a previous mount recorded (0 if none).
    fn recorded_errno(&self) -> i32;
    /// Clears the recorded error once the file system has taken it over.
    fn clear_recorded_errno(&self) -> Result<()>;
    /// Counters since open.
    fn stats(&self) -> JournalStats;
    /// Largest number of blocks (logged plus revoked) one transaction may carry.
    fn max_transaction_blocks(&self) -> usize;
    /// Revoke records one journal block holds.
    fn revokes_per_block(&self) -> usize;
    /// The tid the next commit gets.
    fn next_tid(&self) -> Tid;
    /// How full the log is.
    fn space(&self) -> LogSpace;
    /// Stops or allows checkpoints the log would start on its own.
    fn hold_checkpoints(&self, hold: bool);
    /// Device blocks of the file-system device the log occupies, as (first, count) runs, which
    /// file data must never use.
    fn device_runs(&self) -> Vec<(u64, u64)>;
    /// True when replay might still write a copy of `home_block` that the log holds (a live
    /// transaction recorded it). A caller writing the block home in place outside the log
    /// must then revoke it in its transaction. May answer true when unsure; the jbd2 journal
    /// answers exactly (a live transaction logged it, full or as ranges, and no later live
    /// transaction revoked it).
    fn is_logged(&self, home_block: u64) -> bool;
    /// The blocks of `first..first + len` that [`CommitLog::pending`] or
    /// [`CommitLog::is_logged`] would name, sorted: what a free of that run must revoke.
    fn held_in(&self, first: u64, len: u64) -> Vec<u64>;
    /// Stops all background work for good (the file system stops as at a power cut): from
    /// then on the log writes only when called.
    fn stop_background(&self);
}

impl CommitLog for Journal {
    // Each method names the inherent one through `JournalCore`: `self.commit(..)` here would
    // resolve to this trait method again.
    fn commit(&self, req: CommitRequest) -> Result<Tid> {
        super::log::JournalCore::commit(self, req)
    }
    fn commit_holding(&self, req: CommitRequest, may_hold: bool) -> Result<(Tid, bool)> {
        super::log::JournalCore::commit_holding(self, req, may_hold)
    }
    fn finish_held(&self) -> Result<Option<Tid>> {
        super::log::JournalCore::finish_held(self)
    }
    fn pending(&self, home_block: u64) -> Option<Arc<[u8]>> {
        super::log::JournalCore::pending(self, home_block)
    }
    fn checkpoint(&self) -> Result<()> {
        super::log::JournalCore::checkpoint(self)
    }
    fn close(&self) -> Result<()> {
        super::log::JournalCore::close(self)
    }
    fn abort(&self, errno: i32) -> Result<()> {
        super::log::JournalCore::abort(self, errno)
    }
    fn recorded_errno(&self) -> i32 {
        super::log::JournalCore::recorded_errno(self)
    }
    fn clear_recorded_errno(&self) -> Result<()> {
        super::log::JournalCore::clear_recorded_errno(self)
    }
    fn stats(&self) -> JournalStats {
        super::log::JournalCore::stats(self)
    }
    fn max_transaction_blocks(&self) -> usize {
        super::log::JournalCore::max_transaction_blocks(self)
    }
    fn revokes_per_block(&self) -> usize {
        super::log::JournalCore::revokes_per_block(self)
    }
    fn next_tid(&self) -> Tid {
        super::log::JournalCore::next_tid(self)
    }
    fn space(&self) -> LogSpace {
        LogSpace {
            used: u64::from(self.used_blocks()),
            capacity: u64::from(self.capacity()),
        }
    }
    fn hold_checkpoints(&self, hold: bool) {
        super::log::JournalCore::hold_checkpoints(self, hold)
    }
    fn device_runs(&self) -> Vec<(u64, u64)> {
        super::log::JournalCore::device_runs(self)
    }
    fn is_logged(&self, home_block: u64) -> bool {
        super::log::JournalCore::is_logged(self, home_block)
    }
    fn held_in(&self, first: u64, len: u64) -> Vec<u64> {
        super::log::JournalCore::held_in(self, first, len)
    }
    fn stop_background(&self) {
        Journal::stop_background(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::{BlockDevice, MemDev};
    use crate::format::jbd2::superblock::{JournalSuperblock, MAX_USERS, SUPERBLOCK_SIZE};
    use crate::journal::{JournalExtent, JournalGeometry, JournalOptions};

    /// Goal: the jbd2 journal works through the trait object alone: commit, pending, space,
    /// checkpoint, close. Method: a 64-block journal in memory, driven as `dyn CommitLog`.
    #[test]
    fn journal_works_as_a_dyn_commit_log() {
        const BS: u32 = 1024;
        let dev = Arc::new(MemDev::new(256 * BS as usize));
        let sb = JournalSuperblock {
            v2: true,
            block_size: BS,
            len_blocks: 64,
            first_log_block: 1,
            sequence: 1,
            start_block: 0,
            errno: 0,
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: 0,
            uuid: [7; 16],
            nr_users: 1,
            dynsuper: 0,
            max_transaction: 0,
            max_trans_data: 0,
            checksum_type: 0,
            num_fc_blocks: 0,
            head_block: 0,
            users: [[0; 16]; MAX_USERS],
        };
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        sb.write(&mut raw);
        dev.write_at(100 * u64::from(BS), &raw).unwrap();
        let bdev: Arc<dyn BlockDevice> = dev.clone();
        let geom = JournalGeometry::internal(
            bdev.clone(),
            BS,
            vec![JournalExtent {
                logical_start: 0,
                device_block: 100,
                len: 64,
            }],
        );
        let log: Arc<dyn CommitLog> =
            Arc::new(Journal::open(geom, bdev, JournalOptions::default()).unwrap());
        log.hold_checkpoints(true);
        let content: Arc<[u8]> = vec![9u8; BS as usize].into();
        let tid = log.next_tid();
        let got = log
            .commit(CommitRequest {
                blocks: vec![(30, Arc::clone(&content))],
                ..CommitRequest::default()
            })
            .unwrap();
        assert_eq!(got, tid);
        assert_eq!(log.pending(30).as_deref(), Some(&content[..]));
        assert_eq!(
            log.space(),
            LogSpace {
                used: 3,
                capacity: 63
            }
        );
        assert_eq!(log.device_runs(), vec![(100, 64)]);
        log.checkpoint().unwrap();
        assert_eq!(log.pending(30), None);
        assert_eq!(log.space().used, 0);
        let mut home = vec![0u8; BS as usize];
        dev.read_at(30 * u64::from(BS), &mut home).unwrap();
        assert_eq!(&home[..], &content[..]);
        assert_eq!(log.stats().commits, 1);
        log.close().unwrap();
    }
}
