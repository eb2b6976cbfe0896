//! Recovery: scan the log for committed transactions (`scan.rs`), collect revokes, replay each
//! home block (its newest committed full copy, then the byte ranges logged after it, in log
//! order), then mark the journal empty and clear the extension bit.
//!
//! Follows the kernel's fs/jbd2/recovery.c (scan, revoke and replay passes over the log) in
//! what a failed checksum means:
//! - a data block whose tag checksum fails is not replayed and is counted
//!   (`RecoveryReport::corrupt_blocks`); the rest of its transaction and every later
//!   committed transaction are still replayed (the kernel's PASS_REPLAY `block_error`);
//! - a commit block whose checksum fails ends the log: its transaction and everything after it
//!   are dropped, and the report names it (`failed_commit`, the kernel's `j_failed_commit`;
//!   e2fsck's "journal transaction N was corrupt, replay was aborted");
//! - a descriptor or revoke block whose checksum fails ends the log when no commit block of
//!   its transaction follows (a write torn by a crash); when that transaction's commit block is
//!   there, the log itself is corrupt (or the journal superblock's UUID, which seeds every
//!   checksum) and recovery fails with `Corrupt` rather than silently dropping committed
//!   transactions (the kernel fails with EFSBADCRC).
//!
//! - a compact commit that fails its checksum ends the log like a failed commit block.
//!
//! And what tidefs adds (FORMAT.md §5.7): an unfenced transaction with a failed block and no
//! next transaction begun after it, or a commit block torn by the crash (non-zero bytes after
//! its header), ends the log as a normal outcome of the crash (`RecoveryReport::torn`), not as
//! damage; nothing of that transaction is replayed.
//!
//! Invariants:
//! - the scan (`scan.rs`) visits at most `s_maxlen - s_first` blocks, so a corrupt log can
//!   neither loop nor read outside the log;
//! - replay writes only transactions that the scan found committed (commit block present
//!   and verified), minus their data blocks whose checksum failed;
//! - a record (full or range) is skipped if revoked by a transaction whose tid is >= its own
//!   (kernel `jbd2_journal_test_revoke`);
//! - a home block's replayed content is its newest unrevoked full copy (else its home content),
//!   patched with every unrevoked range logged after that copy, in log order. Ranges hold
//!   absolute bytes, so patching a home block that already holds some of them (an interrupted
//!   recovery, or a checkpoint that wrote a newer copy) gives the same result;
//! - recovery only writes home blocks and, last, the superblock: running it again after an
//!   interruption replays the same records and gives the same result.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::log::{tid_geq, JournalCore, PendingCopy, Tid, CHECKPOINT_BATCH_BLOCKS};
use super::scan::Item;
use crate::error::{FsError, Result};
use crate::format::jbd2::{INCOMPAT_TIDEFS_ONLY, JBD2_MAGIC};

/// What a recovery did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Committed transactions found (and replayed).
    pub transactions: u32,
    /// Home blocks written (newest copy of each).
    pub blocks_replayed: u64,
    /// Revoke records read from committed transactions.
    pub revoke_records: u64,
    /// Byte-range records applied.
    pub range_records: u64,
    /// Time spent scanning the log and verifying checksums.
    pub scan: Duration,
    /// Time spent building the revoke table.
    pub revoke: Duration,
    /// Time spent writing blocks home and flushing.
    pub replay: Duration,
    /// Tid of the last committed transaction found, if any.
    pub last_tid: Option<Tid>,
    /// Logged data blocks whose tag checksum failed: not replayed (their home blocks keep
    /// their old content).
    pub corrupt_blocks: u64,
    /// The transaction whose commit block failed its checksum, ending the log early: it and
    /// any later transaction were not replayed.
    pub failed_commit: Option<Tid>,
    /// The transaction the crash tore (an unfenced body, or its commit block), ending the log:
    /// not replayed, and not damage (FORMAT.md §5.7).
    pub torn: Option<Tid>,
}

/// What replay starts one home block from.
#[derive(Clone, Copy, Default)]
enum Base {
    /// Its content at home.
    #[default]
    Home,
    /// A logged full copy: (journal block, escaped).
    Copy(u32, bool),
    /// Zeros (a range record with ZERO_REST).
    Zeros,
}

/// What replay does to one home block: start from a full copy (or the home content, or zeros)
/// and apply ranges, in log order.
#[derive(Default)]
struct BlockPlan<'a> {
    /// The newest unrevoked full copy or zero-rest record.
    base: Base,
    /// Ranges logged after it, in log order.
    ranges: Vec<&'a [(u32, Vec<u8>)]>,
    /// Tid of the newest record.
    tid: Tid,
}

impl JournalCore {
    /// Scans, collects revokes, replays (per home block: newest committed full copy, escaped
    /// blocks unescaped, then the ranges logged after it; revokes honoured), flushes home, then
    /// marks the journal empty (`s_start = 0`, `s_sequence` = last tid + 1, extension bit
    /// cleared) and flushes. Safe to interrupt and run again.
    ///
    /// On a read-only journal nothing is written: the replayed copies go to the pending map
    /// instead, so [`Journal::pending`] serves the recovered view, and `needs_recovery()` stays
    /// true.
    pub fn recover(&self) -> Result<RecoveryReport> {
        let _gate = self.commit_gate.lock();
        let _one = self.checkpoint_gate.lock();
        let mut state = self.log.lock();
        let mut report = RecoveryReport::default();
        if !self.needs_recovery() {
            return Ok(report);
        }
        if state.aborted {
            return Err(FsError::ReadOnly);
        }
        let t0 = Instant::now();
        let scan = self.scan_log(&state.sb)?;
        let txns = scan.txns;
        report.corrupt_blocks = scan.corrupt_blocks;
        report.failed_commit = scan.failed_commit;
        report.torn = scan.torn;
        report.scan = t0.elapsed();
        report.transactions = u32::try_from(txns.len()).unwrap_or(u32::MAX);
        report.last_tid = txns.last().map(|t| t.tid);

        let t1 = Instant::now();
        let mut revoked: HashMap<u64, Tid> = HashMap::new();
        for txn in &txns {
            for item in &txn.items {
                if let Item::Revoke { home } = item {
                    report.revoke_records += 1;
                    let e = revoked.entry(*home).or_insert(txn.tid);
                    if tid_geq(txn.tid, *e) {
                        *e = txn.tid;
                    }
                }
            }
        }
        report.revoke = t1.elapsed();

        let t2 = Instant::now();
        let mut plans: HashMap<u64, BlockPlan> = HashMap::new();
        for txn in &txns {
            for item in &txn.items {
                let home = match item {
                    Item::Full { home, .. } | Item::Range { home, .. } => *home,
                    Item::Revoke { .. } => continue,
                };
                if matches!(revoked.get(&home), Some(&r) if tid_geq(r, txn.tid)) {
                    continue;
                }
                let plan = plans.entry(home).or_default();
                plan.tid = txn.tid;
                match item {
                    Item::Full {
                        position, escaped, ..
                    } => {
                        plan.base = Base::Copy(*position, *escaped);
                        plan.ranges.clear();
                    }
                    Item::Range {
                        ranges, zero_rest, ..
                    } => {
                        report.range_records += 1;
                        if *zero_rest {
                            plan.base = Base::Zeros;
                            plan.ranges.clear();
                        }
                        plan.ranges.push(ranges);
                    }
                    Item::Revoke { .. } => {}
                }
            }
        }
        let mut order: Vec<(u64, BlockPlan)> = plans.into_iter().collect();
        order.sort_unstable_by_key(|(h, _)| *h);
        let bs = u64::from(self.geom.block_size);
        let home_blocks = self.home.len_bytes() / bs;
        let magic = JBD2_MAGIC.to_be_bytes();
        // Read-write replay goes home in sorted batches, each merged into few large writes.
        let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
        for (home, plan) in &order {
            if *home >= home_blocks {
                return Err(FsError::corrupt(format!(
                    "journal transaction {} logs block {home}, past the end of the device \
                     ({home_blocks} blocks)",
                    plan.tid
                )));
            }
            let mut buf = vec![0u8; state.layout.block_size];
            match plan.base {
                Base::Copy(position, escaped) => {
                    self.geom.read_block(position, &mut buf)?;
                    if escaped {
                        buf[..4].copy_from_slice(&magic);
                    }
                }
                Base::Home => self.home.read_at(home * bs, &mut buf)?,
                Base::Zeros => {}
            }
            for ranges in &plan.ranges {
                for (off, bytes) in ranges.iter() {
                    // The scan checked every range against the block size.
                    let off = *off as usize;
                    buf[off..off + bytes.len()].copy_from_slice(bytes);
                }
            }
            if self.opts.read_only {
                self.pending.write().insert(
                    *home,
                    PendingCopy {
                        tid: plan.tid,
                        data: Arc::from(&buf[..]),
                    },
                );
            } else {
                batch.push((home * bs, buf));
                if batch.len() >= CHECKPOINT_BATCH_BLOCKS {
                    self.replay_batch(&mut batch)?;
                }
            }
            report.blocks_replayed += 1;
        }
        self.replay_batch(&mut batch)?;
        if self.opts.read_only {
            report.replay = t2.elapsed();
            return Ok(report);
        }
        self.flush_home_dev()?;
        let end_tid = state.sb.sequence.wrapping_add(report.transactions);
        state.sb.start_block = 0;
        state.sb.sequence = end_tid;
        state.sb.feature_incompat &= !INCOMPAT_TIDEFS_ONLY;
        self.write_sb(&mut state)?;
        self.flush_journal_dev()?;
        report.replay = t2.elapsed();
        // The tid right after the last committed one may be partly on disk; skip it, as the
        // kernel does (`j_transaction_sequence = ++info.end_transaction`).
        self.next_tid
            .store(end_tid.wrapping_add(1), Ordering::Release);
        state.head = self.first_block;
        state.head_off = 0;
        state.live.clear();
        self.used.store(0, Ordering::Release);
        self.needs_recovery.store(false, Ordering::Release);
        self.enable_features(&mut state)?;
        Ok(report)
    }

    /// Writes a batch of replayed blocks home and empties it.
    fn replay_batch(&self, batch: &mut Vec<(u64, Vec<u8>)>) -> Result<()> {
        let pieces: Vec<(u64, &[u8])> = batch.iter().map(|(o, b)| (*o, &b[..])).collect();
        self.home.write_blocks(&pieces)?;
        batch.clear();
        Ok(())
    }
}
