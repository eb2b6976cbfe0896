//! Recovery: scan the log for committed transactions, collect revokes, replay the newest
//! committed copy of each block home, then mark the journal empty.
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
//! Invariants:
//! - the scan stops at the first block that is not a descriptor, revoke or commit block of the
//!   expected transaction, and visits at most `s_maxlen - s_first` blocks, so a corrupt log can
//!   neither loop nor read outside the log;
//! - replay writes only transactions that the scan found committed (commit block present
//!   and verified), minus their data blocks whose checksum failed;
//! - a block is skipped if revoked by a transaction whose tid is >= its own (kernel
//!   `jbd2_journal_test_revoke`);
//! - recovery only writes home blocks and, last, the superblock: running it again after an
//!   interruption replays the same copies and gives the same result.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::log::{
    layout_for, tid_geq, JournalCore, LogState, PendingCopy, Tid, CHECKPOINT_BATCH_BLOCKS,
};
use crate::error::{FsError, Result};
use crate::format::jbd2::{
    block_tail_verify, commit, crc32_be, data_block_csum, BlockHeader, BlockType, CommitBlock,
    CsumVersion, DescriptorBlock, RevokeBlock, CHKSUM_CRC32, COMPAT_CHECKSUM, JBD2_MAGIC,
};

/// What a recovery did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Committed transactions found (and replayed).
    pub transactions: u32,
    /// Home blocks written (newest copy of each).
    pub blocks_replayed: u64,
    /// Revoke records read from committed transactions.
    pub revoke_records: u64,
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
}

/// A logged block copy found by the scan.
#[derive(Clone, Copy, Debug)]
struct LoggedCopy {
    home: u64,
    /// Journal block holding the copy.
    position: u32,
    escaped: bool,
}

/// A transaction the scan found fully committed.
#[derive(Debug, Default)]
struct ScannedTxn {
    tid: Tid,
    copies: Vec<LoggedCopy>,
    revokes: Vec<u64>,
}

impl JournalCore {
    /// Scans, collects revokes, replays (newest committed copy wins, revokes honoured, escaped
    /// blocks unescaped), flushes home, then marks the journal empty (`s_start = 0`,
    /// `s_sequence` = last tid + 1) and flushes. Safe to interrupt and run again.
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
        let txns = self.scan(&state, &mut report)?;
        report.scan = t0.elapsed();
        report.transactions = u32::try_from(txns.len()).unwrap_or(u32::MAX);
        report.last_tid = txns.last().map(|t| t.tid);

        let t1 = Instant::now();
        let mut revoked: HashMap<u64, Tid> = HashMap::new();
        for txn in &txns {
            for &home in &txn.revokes {
                report.revoke_records += 1;
                let e = revoked.entry(home).or_insert(txn.tid);
                if tid_geq(txn.tid, *e) {
                    *e = txn.tid;
                }
            }
        }
        report.revoke = t1.elapsed();

        let t2 = Instant::now();
        let mut newest: HashMap<u64, (Tid, LoggedCopy)> = HashMap::new();
        for txn in &txns {
            for copy in &txn.copies {
                if matches!(revoked.get(&copy.home), Some(&r) if tid_geq(r, txn.tid)) {
                    continue;
                }
                newest.insert(copy.home, (txn.tid, *copy));
            }
        }
        let mut order: Vec<(u64, (Tid, LoggedCopy))> = newest.into_iter().collect();
        order.sort_unstable_by_key(|(h, _)| *h);
        let bs = u64::from(self.geom.block_size);
        let home_blocks = self.home.len_bytes() / bs;
        let magic = JBD2_MAGIC.to_be_bytes();
        // Read-write replay goes home in sorted batches, each merged into few large writes.
        let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
        for (home, (tid, copy)) in &order {
            if *home >= home_blocks {
                return Err(FsError::corrupt(format!(
                    "journal transaction {tid} logs block {home}, past the end of the device \
                     ({home_blocks} blocks)"
                )));
            }
            let mut buf = vec![0u8; state.layout.block_size];
            self.geom.read_block(copy.position, &mut buf)?;
            if copy.escaped {
                buf[..4].copy_from_slice(&magic);
            }
            if self.opts.read_only {
                self.pending.write().insert(
                    *home,
                    PendingCopy {
                        tid: *tid,
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
        self.write_sb(&mut state)?;
        self.flush_journal_dev()?;
        report.replay = t2.elapsed();
        // The tid right after the last committed one may be partly on disk; skip it, as the
        // kernel does (`j_transaction_sequence = ++info.end_transaction`).
        self.next_tid
            .store(end_tid.wrapping_add(1), Ordering::Release);
        state.head = self.first_block;
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

    /// Walks the log from `s_start`, returning the transactions that are fully committed, in
    /// log order, without the data blocks whose checksum failed (counted in `report`).
    fn scan(&self, state: &LogState, report: &mut RecoveryReport) -> Result<Vec<ScannedTxn>> {
        let layout = layout_for(&state.sb);
        let format = layout.format;
        let seed = layout.seed;
        let v1 = state.sb.feature_compat & COMPAT_CHECKSUM != 0 && !format.csum.has_tail();
        let bs = layout.block_size;
        let mut block = state.sb.start_block;
        let mut tid = state.sb.sequence;
        let mut txns = Vec::new();
        let mut cur = ScannedTxn {
            tid,
            ..ScannedTxn::default()
        };
        // The first descriptor or revoke block of `cur` whose checksum failed, if any.
        let mut cur_bad: Option<String> = None;
        let mut v1_sum = !0u32;
        let mut visited: u32 = 0;
        let budget = self.capacity();
        let mut buf = vec![0u8; bs];
        let mut data = vec![0u8; bs];
        while visited < budget {
            let position = block;
            self.geom.read_block(block, &mut buf)?;
            block = self.advance(block, 1);
            visited += 1;
            let Ok(header) = BlockHeader::parse(&buf) else {
                break;
            };
            if header.sequence != tid {
                break;
            }
            match header.block_type {
                BlockType::Descriptor => {
                    let tail_ok = !format.csum.has_tail()
                        || block_tail_verify(seed, &buf, "descriptor").is_ok();
                    let Ok(desc) = DescriptorBlock::parse(&buf, format) else {
                        break;
                    };
                    if !tail_ok {
                        cur_bad.get_or_insert(format!(
                            "descriptor block {position} fails its checksum"
                        ));
                    }
                    if v1 {
                        v1_sum = crc32_be(v1_sum, &buf);
                    }
                    let n = u32::try_from(desc.tags.len()).unwrap_or(u32::MAX);
                    if visited.saturating_add(n) > budget {
                        break;
                    }
                    for tag in &desc.tags {
                        let position = block;
                        block = self.advance(block, 1);
                        visited += 1;
                        if cur_bad.is_some() {
                            // The tags of a failed transaction are not trusted; only its
                            // commit block matters now.
                            continue;
                        }
                        if format.csum.has_tail() || v1 {
                            self.geom.read_block(position, &mut data)?;
                        }
                        if v1 {
                            v1_sum = crc32_be(v1_sum, &data);
                        }
                        let ok = match format.csum {
                            CsumVersion::None => true,
                            CsumVersion::V2 => {
                                data_block_csum(seed, tid, &data) & 0xFFFF == tag.checksum & 0xFFFF
                            }
                            CsumVersion::V3 => data_block_csum(seed, tid, &data) == tag.checksum,
                        };
                        if !ok {
                            report.corrupt_blocks += 1;
                            continue;
                        }
                        cur.copies.push(LoggedCopy {
                            home: tag.home_block,
                            position,
                            escaped: tag.escaped(),
                        });
                    }
                }
                BlockType::Revoke => {
                    let tail_ok =
                        !format.csum.has_tail() || block_tail_verify(seed, &buf, "revoke").is_ok();
                    match RevokeBlock::parse(&buf, format) {
                        Ok(r) if tail_ok => cur.revokes.extend(r.blocks),
                        _ => {
                            cur_bad.get_or_insert(format!(
                                "revoke block {position} fails its checksum or does not parse"
                            ));
                        }
                    }
                }
                BlockType::Commit => {
                    let Ok(c) = CommitBlock::parse(&buf) else {
                        break;
                    };
                    if let Some(why) = cur_bad.take() {
                        return Err(FsError::corrupt(format!(
                            "journal transaction {tid}: {why}, yet its commit block {position} \
                             is present: the log or the journal superblock's UUID (the \
                             checksum seed) is corrupt"
                        )));
                    }
                    let commit_ok = !format.csum.has_tail() || commit::verify_csum_v2v3(seed, &buf);
                    if !commit_ok || (v1 && !v1_commit_ok(&c, v1_sum)) {
                        report.failed_commit = Some(tid);
                        break;
                    }
                    txns.push(std::mem::take(&mut cur));
                    tid = tid.wrapping_add(1);
                    cur.tid = tid;
                    v1_sum = !0;
                }
                BlockType::SuperblockV1 | BlockType::SuperblockV2 => break,
            }
        }
        Ok(txns)
    }
}

/// The v1 compat commit checksum check of recovery.c: a matching crc32, or no checksum at all.
fn v1_commit_ok(c: &CommitBlock, sum: u32) -> bool {
    let matches = c.chksum_type == CHKSUM_CRC32 && c.chksum_size == 4 && c.chksum[0] == sum;
    let absent = c.chksum_type == 0 && c.chksum_size == 0 && c.chksum[0] == 0;
    matches || absent
}
