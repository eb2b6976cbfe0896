//! Tests of byte-range records and compact commits on `MemDev` (4 KiB blocks, 512-byte
//! sectors): commit, crash (drop without close), recover, compare with a model.
//!
//! Goal: ranges replay onto the right base in log order; compact commits share blocks and the
//! scan finds each; a torn compact commit, stale bytes after the last one, and the log's
//! wrap-around never make recovery replay something that was not committed; recovery
//! interrupted half-way and run again gives the same result; revokes suppress ranges;
//! `is_logged` is exact; the incompat bit follows the extension records; a compact commit
//! costs one write and one flush.
//! Method: a journal superblock built by hand inside a memory "file system"; crash images are
//! byte copies of the device taken between commits.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::dev::{BlockDevice, CountingDevice, MemDev};
use crate::format::jbd2::superblock::{JournalSuperblock, SUPERBLOCK_SIZE};
use crate::format::jbd2::{INCOMPAT_CSUM_V3, INCOMPAT_TIDEFS_EXT};

const BS: u32 = 4096;
const FS_BLOCKS: u64 = 256;
/// The journal: journal blocks [0, len/2) at device block 100.., the rest at 200.. .
const J1: u64 = 100;
const J2: u64 = 200;

/// Fenced, so that a classic transaction is exactly the kernel's (the unfenced block layout
/// has tests of its own in `tests.rs`).
const OPTS: JournalOptions = JournalOptions {
    read_only: false,
    csum_v3: true,
    tags_64bit: true,
    fenced_commits: true,
};

fn extents(len: u32) -> Vec<JournalExtent> {
    let half = len / 2;
    vec![
        JournalExtent {
            logical_start: 0,
            device_block: J1,
            len: half,
        },
        JournalExtent {
            logical_start: half,
            device_block: J2,
            len: len - half,
        },
    ]
}

/// A memory file system with a `len`-block journal.
struct Rig {
    dev: Arc<MemDev>,
    len: u32,
}

impl Rig {
    fn new(len: u32) -> Rig {
        let dev = Arc::new(MemDev::new((FS_BLOCKS * u64::from(BS)) as usize));
        let mut sb = super::tests::fresh_sb(len, 0, 0);
        sb.block_size = BS;
        sb.uuid = [0x5A; 16];
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        sb.write(&mut raw);
        dev.write_at(J1 * u64::from(BS), &raw).unwrap();
        Rig { dev, len }
    }

    fn from_bytes(bytes: Vec<u8>, len: u32) -> Rig {
        Rig {
            dev: Arc::new(MemDev::from_bytes(bytes)),
            len,
        }
    }

    fn open_on(&self, dev: Arc<dyn BlockDevice>) -> Journal {
        let j = Journal::open(
            JournalGeometry::internal(dev.clone(), BS, extents(self.len)),
            dev,
            OPTS,
        )
        .unwrap();
        j.hold_checkpoints(true);
        j
    }

    fn open(&self) -> Journal {
        self.open_on(self.dev.clone())
    }

    fn home(&self, block: u64) -> Vec<u8> {
        let mut b = vec![0u8; BS as usize];
        self.dev.read_at(block * u64::from(BS), &mut b).unwrap();
        b
    }

    fn sb(&self) -> JournalSuperblock {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        self.dev.read_at(J1 * u64::from(BS), &mut b).unwrap();
        JournalSuperblock::parse(&b).unwrap()
    }

    /// Byte offset on the device of journal block `logical`.
    fn journal_offset(&self, logical: u32) -> usize {
        let half = self.len / 2;
        let dev_block = if logical < half {
            J1 + u64::from(logical)
        } else {
            J2 + u64::from(logical - half)
        };
        (dev_block * u64::from(BS)) as usize
    }

    /// Crashes a copy of the current device, recovers it, and returns it with the report.
    fn recover_copy(&self) -> (Rig, RecoveryReport) {
        let copy = Rig::from_bytes(self.dev.to_bytes(), self.len);
        let j = copy.open();
        let report = j.recover().unwrap();
        drop(j);
        (copy, report)
    }
}

/// The file system's view: each home block's newest content.
#[derive(Default, Clone)]
struct Model {
    blocks: HashMap<u64, Vec<u8>>,
}

impl Model {
    fn get(&self, home: u64) -> Vec<u8> {
        self.blocks
            .get(&home)
            .cloned()
            .unwrap_or_else(|| vec![0; BS as usize])
    }

    /// A range update of `home` writing `bytes` at each offset, applied to the model.
    fn update(&mut self, home: u64, patches: &[(u32, &[u8])]) -> RangeUpdate {
        let mut data = self.get(home);
        let mut ranges = Vec::new();
        for (off, bytes) in patches {
            let o = *off as usize;
            data[o..o + bytes.len()].copy_from_slice(bytes);
            ranges.push((*off, u32::try_from(bytes.len()).unwrap()));
        }
        self.blocks.insert(home, data.clone());
        RangeUpdate {
            home,
            data: data.into(),
            ranges,
        }
    }

    /// A full block `fill`, applied to the model.
    fn full(&mut self, home: u64, fill: u8) -> (u64, Arc<[u8]>) {
        let data = vec![fill; BS as usize];
        self.blocks.insert(home, data.clone());
        (home, data.into())
    }

    fn check(&self, rig: &Rig, what: &str) {
        for (h, d) in &self.blocks {
            assert!(rig.home(*h) == *d, "{what}: home block {h} differs");
        }
    }
}

fn ranges(updates: Vec<RangeUpdate>) -> CommitRequest {
    CommitRequest {
        ranges: updates,
        ..CommitRequest::default()
    }
}

/// Goal: range updates commit as compact commits, set the extension bit, and replay onto the
/// home blocks. Method: three transactions of ranges on two blocks, crash, recover.
#[test]
fn ranges_round_trip_through_compact_commits() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    for t in 0..3u8 {
        let a = m.update(10, &[(u32::from(t) * 100, &[t + 1; 30]), (4000, &[t; 96])]);
        let b = m.update(11, &[(7, b"hello, ranges")]);
        j.commit(ranges(vec![a, b])).unwrap();
    }
    let st = j.stats();
    assert_eq!(st.compact_commits, 3);
    assert_eq!(st.range_records, 6);
    assert_eq!(st.range_bytes, 3 * (30 + 96 + 13));
    assert_eq!(st.blocks_logged, 0);
    assert_eq!(j.pending(10).as_deref(), Some(&m.get(10)[..]));
    assert!(rig.sb().feature_incompat & INCOMPAT_TIDEFS_EXT != 0);
    // All three share the first log block.
    assert!(j.log.lock().live.iter().all(|t| t.start == 1));
    drop(j);
    let j = rig.open();
    let report = j.recover().unwrap();
    assert_eq!(report.transactions, 3);
    assert_eq!(report.range_records, 6);
    assert_eq!(report.blocks_replayed, 2);
    m.check(&rig, "after recovery");
    let sb = rig.sb();
    assert_eq!(sb.feature_incompat & INCOMPAT_TIDEFS_EXT, 0);
    assert!(sb.feature_incompat & INCOMPAT_CSUM_V3 != 0);
    assert_eq!(sb.start_block, 0);
}

/// Goal: several compact commits in one block; a crash after each commit recovers exactly the
/// transactions committed so far; a torn (flipped or zeroed) last commit is ignored.
/// Method: snapshot the device after each commit; recover each snapshot, and each snapshot with
/// its last commit's first or last sector damaged.
#[test]
fn compact_commits_share_a_block_and_crash_at_each_point() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    let mut states = vec![(rig.dev.to_bytes(), m.clone(), None::<(u32, u32, usize)>)];
    for t in 0..7u32 {
        // Sizes vary so that commits take one or two sectors.
        let n = if t % 3 == 0 { 700 } else { 40 };
        let u = m.update(20 + u64::from(t % 3), &[(t * 13, &vec![t as u8 + 1; n])]);
        j.commit(ranges(vec![u])).unwrap();
        let last = *j.log.lock().live.back().unwrap();
        let end = if last.end.1 == 0 { BS } else { last.end.1 };
        let (start_off, len) = (last.start_off, (end - last.start_off) as usize);
        states.push((
            rig.dev.to_bytes(),
            m.clone(),
            Some((last.start, start_off, len)),
        ));
    }
    assert_eq!(j.stats().compact_commits, 7);
    let first_block = j.log.lock().live.front().unwrap().start;
    let shared = j
        .log
        .lock()
        .live
        .iter()
        .filter(|t| t.start == first_block)
        .count();
    assert!(shared >= 3, "compact commits share a block ({shared})");
    drop(j);
    for (k, (bytes, model, at)) in states.iter().enumerate() {
        let r = Rig::from_bytes(bytes.clone(), rig.len);
        let (rec, report) = r.recover_copy();
        assert_eq!(report.transactions as usize, k, "crash after commit {k}");
        model.check(&rec, &format!("crash after commit {k}"));
        let Some((block, off, len)) = *at else {
            continue;
        };
        let prev = &states[k - 1].1;
        let base = rig.journal_offset(block) + off as usize;
        for (what, sector) in [("first", base), ("last", base + len - 512)] {
            for zero in [false, true] {
                let mut torn = bytes.clone();
                if zero {
                    torn[sector..sector + 512].fill(0);
                } else {
                    torn[sector + 100] ^= 0x40;
                }
                let (rec, report) = Rig::from_bytes(torn, rig.len).recover_copy();
                assert_eq!(
                    report.transactions as usize,
                    k - 1,
                    "commit {k} with its {what} sector torn (zeroed: {zero})"
                );
                prev.check(&rec, &format!("commit {k} torn"));
            }
        }
    }
}

/// Goal: stale records left in the log from an earlier lap, after the last commit, are never
/// taken for commits, also when the log wraps with compact commits. Method: an 8-block log
/// (7 log blocks) filled many times over with compact and block-layout transactions,
/// checkpointing now and then; crash at every step and recover a copy.
#[test]
fn wrap_around_with_compact_commits() {
    let rig = Rig::new(8);
    let j = rig.open();
    let mut m = Model::default();
    let mut wrapped = false;
    for t in 0..120u32 {
        let head_before = j.log.lock().head;
        let home = 30 + u64::from(t % 5);
        if t % 11 == 5 {
            // A block-layout transaction (a full block) between compact ones.
            let full = m.full(home, t as u8);
            j.commit(CommitRequest {
                blocks: vec![full],
                ..CommitRequest::default()
            })
            .unwrap();
        } else {
            let n = [20usize, 300, 900, 1500][(t % 4) as usize];
            let u = m.update(home, &[((t * 37) % 2000, &vec![(t % 251) as u8; n])]);
            j.commit(ranges(vec![u])).unwrap();
        }
        if j.log.lock().head < head_before {
            wrapped = true;
        }
        if t % 7 == 6 {
            j.checkpoint().unwrap();
        }
        let (rec, report) = rig.recover_copy();
        assert!(report.failed_commit.is_none(), "step {t}: {report:?}");
        m.check(&rec, &format!("crash after step {t}"));
    }
    assert!(wrapped, "the log must wrap");
}

/// Goal: a valid compact commit of a later tid (not the next one) after the last commit, and
/// one of an old tid, are not replayed. Method: write them by hand into the sectors after the
/// last commit, and at the next block.
#[test]
fn stale_or_out_of_sequence_records_are_not_commits() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    let stale_model = m.clone();
    let u = m.update(40, &[(0, b"committed")]);
    j.commit(ranges(vec![u])).unwrap();
    let (head, off, tid) = {
        let s = j.log.lock();
        (s.head, s.head_off, j.next_tid())
    };
    drop(j);
    let layout = crate::journal::log::layout_for(&rig.sb());
    let mut other = stale_model.clone();
    let stale = other.update(40, &[(0, b"NOT COMMITTED")]);
    let records = vec![super::records::Record::Range {
        home: 40,
        data: stale.data.clone(),
        ranges: stale.ranges.clone(),
        zero_rest: false,
    }];
    for (bad_tid, block, at) in [
        (tid + 1, head, off),
        (tid.wrapping_sub(5), head, off),
        (tid + 1, head + 1, 0),
    ] {
        let rec = layout.compact(bad_tid, &records, 512, (1, 2)).unwrap();
        let mut bytes = rig.dev.to_bytes();
        let o = rig.journal_offset(block) + at as usize;
        bytes[o..o + rec.len()].copy_from_slice(&rec);
        let (rec, report) = Rig::from_bytes(bytes, rig.len).recover_copy();
        assert_eq!(report.transactions, 1, "tid {bad_tid} at {block}+{at}");
        m.check(&rec, "stale record");
    }
}

/// Goal: recovery interrupted half-way (some home blocks written, the superblock not) and run
/// again gives the same image. Method: recover once; build the interrupted image from the
/// crashed journal superblock and half of the replayed home blocks; recover it.
#[test]
fn interrupted_recovery_with_ranges_runs_again_to_the_same_result() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    for t in 0..6u32 {
        let a = m.update(50 + u64::from(t % 4), &[(t * 8, &[t as u8 + 1; 8])]);
        let b = m.update(60, &[(t * 100, &[0xA0 + t as u8; 50])]);
        if t == 3 {
            let full = m.full(61, 0x33);
            j.commit(CommitRequest {
                blocks: vec![full],
                ranges: vec![a, b],
                ..CommitRequest::default()
            })
            .unwrap();
        } else {
            j.commit(ranges(vec![a, b])).unwrap();
        }
    }
    drop(j);
    let crashed = rig.dev.to_bytes();
    let (done, first) = rig.recover_copy();
    let after = done.dev.to_bytes();
    m.check(&done, "first recovery");
    for keep in [0usize, 1] {
        let mut interrupted = after.clone();
        let sb = (J1 * u64::from(BS)) as usize;
        interrupted[sb..sb + BS as usize].copy_from_slice(&crashed[sb..sb + BS as usize]);
        for (i, h) in [50u64, 51, 52, 53, 60, 61].iter().enumerate() {
            if i % 2 == keep {
                let o = (h * u64::from(BS)) as usize;
                interrupted[o..o + BS as usize].copy_from_slice(&crashed[o..o + BS as usize]);
            }
        }
        let (again, second) = Rig::from_bytes(interrupted, rig.len).recover_copy();
        assert_eq!(second.transactions, first.transactions);
        assert!(again.dev.to_bytes() == after, "rerun differs (keep {keep})");
    }
}

/// Goal: a transaction too large for a compact commit logs its ranges in range blocks of the
/// block layout, next to full blocks and revokes, and replays. Method: 300 range updates and
/// two full blocks in one commit, crash, recover.
#[test]
fn large_transaction_uses_range_blocks() {
    let rig = Rig::new(64);
    let j = rig.open();
    let mut m = Model::default();
    // Homes stay clear of the journal (device blocks 100.. and 200..).
    let mut updates = Vec::new();
    for i in 0..90u32 {
        updates.push(m.update(5 + u64::from(i), &[(i * 40, &[i as u8; 60])]));
    }
    // A block named twice in one request is logged whole: here, as it is mostly zeros, as
    // its non-zero bytes over a zero block.
    updates.push(m.update(5, &[(3000, &[0xAB; 10])]));
    let full_a = m.full(240, 0xF1);
    let full_b = m.full(241, 0xF2);
    j.commit(CommitRequest {
        blocks: vec![full_a, full_b],
        ranges: updates,
        revoked: vec![242],
        ..CommitRequest::default()
    })
    .unwrap();
    let st = j.stats();
    assert_eq!(st.compact_commits, 0);
    assert_eq!(st.range_records, 90);
    assert_eq!(st.blocks_logged, 2);
    drop(j);
    let dump = rig.open().dump().unwrap();
    assert_eq!(dump.transactions.len(), 1);
    let t = &dump.transactions[0];
    assert_eq!(t.layout, DumpLayout::Block);
    assert_eq!(t.revokes, vec![242]);
    assert_eq!(
        t.tags.iter().filter(|g| g.kind == TagKind::Range).count(),
        90
    );
    assert_eq!(t.tags.iter().filter(|g| g.zero_rest).count(), 1);
    // Descriptor, 2 copies, 2 range blocks, revoke block, commit block.
    assert_eq!(t.len_bytes, 7 * u64::from(BS));
    let (rec, report) = rig.recover_copy();
    assert_eq!(report.transactions, 1);
    m.check(&rec, "large transaction");
}

/// Goal: compact and block transactions mix; revokes (in compact commits too) suppress older
/// ranges and full copies; a range logged after a revoke applies onto the block's in-place
/// content. Method: a scripted sequence, crash, recover, compare.
#[test]
fn mixed_layouts_and_revokes_replay_in_log_order() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    let x = m.update(70, &[(0, b"x-one")]);
    j.commit(ranges(vec![x])).unwrap();
    let y = m.full(71, 7);
    j.commit(CommitRequest {
        blocks: vec![y],
        ..CommitRequest::default()
    })
    .unwrap();
    let y2 = m.update(71, &[(10, b"patched after full")]);
    let z = m.update(72, &[(5, b"z")]);
    // 70 is freed (revoked, in a compact commit with other ranges) and reused in place.
    j.commit(CommitRequest {
        ranges: vec![y2, z],
        revoked: vec![70],
        ..CommitRequest::default()
    })
    .unwrap();
    assert!(!j.is_logged(70));
    let in_place = vec![0xEE; BS as usize];
    rig.dev.write_at(70 * u64::from(BS), &in_place).unwrap();
    m.blocks.insert(70, in_place);
    // Then logged again as ranges on top of the in-place content.
    let x2 = m.update(70, &[(100, b"x-again")]);
    j.commit(ranges(vec![x2])).unwrap();
    assert_eq!(j.stats().compact_commits, 3);
    // 73: logged, then written in place and updated by ranges in a request that also revokes
    // it: logged whole, so replay does not need the in-place content.
    j.commit(ranges(vec![m.update(73, &[(0, b"old")])]))
        .unwrap();
    let in_place = vec![0x77; BS as usize];
    rig.dev.write_at(73 * u64::from(BS), &in_place).unwrap();
    m.blocks.insert(73, in_place);
    let before = j.stats().blocks_logged;
    j.commit(CommitRequest {
        ranges: vec![m.update(73, &[(8, b"new")])],
        revoked: vec![73],
        ..CommitRequest::default()
    })
    .unwrap();
    assert_eq!(j.stats().blocks_logged, before + 1);
    drop(j);
    // The crash image: the in-place content of 73 is there, but replay must not need it.
    rig.dev
        .write_at(73 * u64::from(BS), &[0u8; BS as usize])
        .unwrap();
    let (rec, report) = rig.recover_copy();
    assert_eq!(report.transactions, 6);
    assert_eq!(report.revoke_records, 1);
    m.check(&rec, "mixed");
}

/// Goal: `is_logged` is exact: true while a live transaction holds a record of the block not
/// revoked later, false otherwise; transactions sharing the tail block stay live. Method:
/// commits, revokes and checkpoints on one journal; the retire rule on its own.
#[test]
fn is_logged_is_exact() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    assert!(!j.is_logged(80));
    j.commit(ranges(vec![m.update(80, &[(0, b"a")])])).unwrap();
    let full = m.full(81, 1);
    j.commit(CommitRequest {
        blocks: vec![full],
        ..CommitRequest::default()
    })
    .unwrap();
    assert!(j.is_logged(80) && j.is_logged(81) && !j.is_logged(82));
    j.commit(CommitRequest {
        revoked: vec![80],
        ..CommitRequest::default()
    })
    .unwrap();
    assert!(!j.is_logged(80) && j.is_logged(81));
    m.blocks.remove(&80);
    j.checkpoint().unwrap();
    assert!(!j.is_logged(81));
    assert_eq!(j.used_blocks(), 0);
    assert_eq!(rig.sb().feature_incompat & INCOMPAT_TIDEFS_EXT, 0);
    // Three compact commits in one block; retiring only the first keeps it live, because
    // the block (the tail) still holds live ones.
    let mut tids = Vec::new();
    for h in 90..93u64 {
        tids.push(j.commit(ranges(vec![m.update(h, &[(0, b"q")])])).unwrap());
    }
    {
        let mut s = j.log.lock();
        let start = s.live.front().unwrap().start;
        assert!(s.live.iter().all(|t| t.start == start));
        assert_eq!(j.retire(&mut s, tids[0]), 0);
        assert_eq!(s.live.len(), 3);
        assert_eq!(s.sb.sequence, tids[0]);
        assert_eq!(s.sb.start_block, start);
    }
    assert!(j.is_logged(90));
    j.checkpoint().unwrap();
    assert!(!j.is_logged(90) && !j.is_logged(92));
    // The next transaction starts at a fresh block, so retired ones are never replayed.
    j.commit(ranges(vec![m.update(93, &[(0, b"r")])])).unwrap();
    assert_eq!(j.log.lock().live.front().unwrap().start_off, 0);
    j.close().unwrap();
    m.check(&rig, "after close");
    let sb = rig.sb();
    assert_eq!(
        (sb.start_block, sb.feature_incompat & INCOMPAT_TIDEFS_EXT),
        (0, 0)
    );
}

/// Goal: the extension bit is on exactly while extension records are live: set durably by
/// the first one, kept while any is live, cleared by the checkpoint that retires the last one
/// and by close; a log of classic transactions never has it. Method: read the on-disk
/// superblock between steps.
#[test]
fn extension_bit_follows_the_extension_records() {
    let rig = Rig::new(32);
    let j = rig.open();
    let mut m = Model::default();
    let bit = |r: &Rig| r.sb().feature_incompat & INCOMPAT_TIDEFS_EXT != 0;
    let full = m.full(5, 1);
    j.commit(CommitRequest {
        blocks: vec![full],
        ..CommitRequest::default()
    })
    .unwrap();
    assert!(!bit(&rig), "a classic transaction needs no bit");
    j.commit(ranges(vec![m.update(6, &[(1, b"r")])])).unwrap();
    assert!(bit(&rig));
    let full = m.full(7, 2);
    j.commit(CommitRequest {
        blocks: vec![full],
        ..CommitRequest::default()
    })
    .unwrap();
    assert!(bit(&rig));
    j.checkpoint().unwrap();
    assert!(!bit(&rig));
    j.commit(ranges(vec![m.update(6, &[(2, b"s")])])).unwrap();
    assert!(bit(&rig));
    j.close().unwrap();
    assert!(!bit(&rig));
    m.check(&rig, "closed");
}

/// Goal: a compact commit costs one write and one flush when no file data went home, and a
/// home flush more when it did; the journal device receives whole sectors only. Method: a
/// counting device under the journal.
#[test]
fn compact_commit_costs_one_write_and_one_flush() {
    use std::sync::atomic::Ordering::Relaxed;
    let rig = Rig::new(32);
    let counted = Arc::new(CountingDevice::new(rig.dev.clone()));
    let j = rig.open_on(counted.clone());
    let mut m = Model::default();
    // The first turns the features and the extension bit on.
    j.commit(ranges(vec![m.update(9, &[(0, b"first")])]))
        .unwrap();
    let c = &counted.counters;
    let (f0, d0, w0) = (
        c.flushes.load(Relaxed),
        c.durable_writes.load(Relaxed),
        c.bytes_written.load(Relaxed),
    );
    let before = j.stats();
    for t in 0..5u32 {
        j.commit(ranges(vec![m.update(9, &[(t * 10 + 10, b"rec")])]))
            .unwrap();
    }
    // One durable write each (a write and a flush), no other flush.
    assert_eq!(c.flushes.load(Relaxed) - f0, 0);
    assert_eq!(c.durable_writes.load(Relaxed) - d0, 5);
    assert_eq!(c.bytes_written.load(Relaxed) - w0, 5 * 512);
    let after = j.stats();
    assert_eq!(after.journal_bytes - before.journal_bytes, 5 * 512);
    assert_eq!(after.compact_commits - before.compact_commits, 5);
    let f1 = c.flushes.load(Relaxed);
    j.commit(CommitRequest {
        ranges: vec![m.update(9, &[(200, b"ordered")])],
        data_written_home: true,
        ..CommitRequest::default()
    })
    .unwrap();
    assert_eq!(
        c.flushes.load(Relaxed) - f1,
        1,
        "a home flush before the commit"
    );
    drop(j);
    let (rec, _) = rig.recover_copy();
    m.check(&rec, "after the counted commits");
}

/// Goal: bad range lists are refused before anything is written. Method: unsorted,
/// overlapping, empty and out-of-block ranges.
#[test]
fn bad_range_updates_are_refused() {
    let rig = Rig::new(32);
    let j = rig.open();
    let data: Arc<[u8]> = vec![0u8; BS as usize].into();
    for bad in [
        vec![(10, 5), (12, 1)],
        vec![(10, 0)],
        vec![(4090, 7)],
        vec![(20, 1), (10, 1)],
    ] {
        let r = j.commit(ranges(vec![RangeUpdate {
            home: 3,
            data: data.clone(),
            ranges: bad.clone(),
        }]));
        assert!(matches!(r, Err(crate::FsError::Invalid(_))), "{bad:?}");
    }
    assert_eq!(j.stats().commits, 0);
}

/// A small deterministic generator (splitmix64) for the randomized test.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Goal: any mix of range updates, full blocks, revokes followed by in-place writes (revoking
/// exactly when `is_logged` says so, as the fs layer does) and checkpoints, in a log that wraps
/// and fills, recovers after a crash at any step to the model. Method: seeded random steps on
/// a 12-block log; after each step a copy of the device is crashed and recovered.
#[test]
fn random_mix_recovers_to_the_model_at_every_step() {
    for seed in 1..=4u64 {
        let rig = Rig::new(12);
        let j = rig.open();
        let mut m = Model::default();
        let mut g = Gen(seed);
        for step in 0..150 {
            let what = g.below(100);
            if what < 55 {
                let n = 1 + g.below(3) as usize;
                let mut req = CommitRequest::default();
                let mut homes: Vec<u64> = (0..n).map(|_| 10 + g.below(30)).collect();
                homes.sort_unstable();
                homes.dedup();
                for h in homes {
                    let max = if g.below(4) == 0 { 2500 } else { 200 };
                    let len = 1 + g.below(max) as u32;
                    let off = g.below(u64::from(BS - len)) as u32;
                    let fill = vec![(g.below(255) + 1) as u8; len as usize];
                    req.ranges.push(m.update(h, &[(off, &fill)]));
                }
                j.commit(req).unwrap();
            } else if what < 70 {
                let full = m.full(10 + g.below(30), (g.below(255) + 1) as u8);
                j.commit(CommitRequest {
                    blocks: vec![full],
                    ..CommitRequest::default()
                })
                .unwrap();
            } else if what < 85 {
                // The block is freed and reused for data written in place.
                let h = 10 + g.below(30);
                if j.is_logged(h) {
                    j.commit(CommitRequest {
                        revoked: vec![h],
                        ..CommitRequest::default()
                    })
                    .unwrap();
                }
                assert!(j.pending(h).is_none(), "step {step}: {h} still pending");
                let data = vec![(g.below(255) + 1) as u8; BS as usize];
                rig.dev.write_at(h * u64::from(BS), &data).unwrap();
                m.blocks.insert(h, data);
            } else {
                j.checkpoint().unwrap();
            }
            let (rec, report) = rig.recover_copy();
            assert!(report.failed_commit.is_none(), "seed {seed} step {step}");
            m.check(&rec, &format!("seed {seed} step {step}"));
        }
        j.close().unwrap();
        m.check(&rig, &format!("seed {seed} closed"));
        assert_eq!(rig.sb().feature_incompat & INCOMPAT_TIDEFS_EXT, 0);
    }
}

/// Goal: a transaction that shares the tail block with one committed during a checkpoint stays
/// live after that checkpoint (the tail is a block): `s_sequence` names it, `is_logged` still
/// counts its blocks, and a crash replays it with the newer one. Method: hold a checkpoint in
/// its home writes (a gated device), commit a compact commit into the same block meanwhile.
#[test]
fn a_checkpointed_transaction_sharing_the_tail_block_stays_live() {
    let rig = Rig::new(32);
    let gate = super::tests::GatedHome::over(rig.dev.clone(), &extents(rig.len), BS);
    let j = Arc::new(rig.open_on(gate.clone()));
    let mut m = Model::default();
    let a = j
        .commit(ranges(vec![m.update(80, &[(0, b"first")])]))
        .unwrap();
    gate.close();
    let cp = {
        let j = Arc::clone(&j);
        std::thread::spawn(move || j.checkpoint())
    };
    gate.wait_for_blocked_write();
    let b = j
        .commit(ranges(vec![m.update(81, &[(9, b"second")])]))
        .unwrap();
    gate.open();
    cp.join().unwrap().unwrap();
    {
        let s = j.log.lock();
        assert_eq!(
            s.live.len(),
            2,
            "the checkpointed transaction shares the tail block"
        );
        assert_eq!(s.live[1].start, s.live[0].start);
        assert_eq!((s.sb.sequence, s.live[1].tid), (a, b));
    }
    assert_eq!(rig.sb().sequence, a);
    assert!(j.pending(80).is_none(), "written home");
    assert!(j.is_logged(80), "still replayable, so still logged");
    assert_eq!(j.used_blocks(), 1);
    let (rec, report) = rig.recover_copy();
    assert_eq!(report.transactions, 2);
    m.check(&rec, "crash after the checkpoint");
    j.checkpoint().unwrap();
    assert!(!j.is_logged(80) && !j.is_logged(81));
    assert_eq!(j.used_blocks(), 0);
    assert_eq!(rig.sb().feature_incompat & INCOMPAT_TIDEFS_EXT, 0);
    m.check(&rig, "after the second checkpoint");
}

/// Goal: a whole block that is mostly zeros, in a request that allows extension records, is
/// logged as its non-zero bytes over a zero block: the transaction stays compact, and replay
/// rebuilds the block whole even over garbage at home (a block freshly allocated). A request
/// without range updates logs it as a plain full block. Method: a fresh block of 125 bytes of
/// data with garbage at its home location, committed with a range update of another block;
/// crash, recover, compare.
#[test]
fn mostly_zero_blocks_go_as_their_nonzero_bytes_over_zeros() {
    let rig = Rig::new(32);
    rig.dev
        .write_at(20 * u64::from(BS), &vec![0xEE; BS as usize])
        .unwrap();
    let j = rig.open();
    let mut m = Model::default();
    let mut fresh = vec![0u8; BS as usize];
    fresh[..125].copy_from_slice(&[b'r'; 125]);
    fresh[129] = 1; // merged with the first run: a gap of a range descriptor
    fresh[3000] = 2;
    m.blocks.insert(20, fresh.clone());
    let other = m.update(21, &[(8, b"inode bytes")]);
    j.commit(CommitRequest {
        blocks: vec![(20, fresh.clone().into())],
        ranges: vec![other],
        ..CommitRequest::default()
    })
    .unwrap();
    let st = j.stats();
    assert_eq!(
        st.compact_commits, 1,
        "a mostly-zero block kept the commit compact"
    );
    assert_eq!(st.blocks_logged, 0);
    assert_eq!(st.range_bytes, 130 + 1 + 11);
    assert_eq!(j.pending(20).as_deref(), Some(&fresh[..]));
    drop(j);
    let (copy, report) = rig.recover_copy();
    assert_eq!(report.range_records, 2);
    m.check(&copy, "after recovery");
    // Without range updates the same block is a plain jbd2 full block: no extension bit.
    let rig = Rig::new(32);
    let j = rig.open();
    j.commit(CommitRequest {
        blocks: vec![(20, fresh.clone().into())],
        ..CommitRequest::default()
    })
    .unwrap();
    assert_eq!(j.stats().blocks_logged, 1);
    assert_eq!(rig.sb().feature_incompat & INCOMPAT_TIDEFS_EXT, 0);
}

#[test]
fn nonzero_ranges_merge_close_runs() {
    use super::records::nonzero_ranges;
    let mut b = vec![0u8; 64];
    assert!(nonzero_ranges(&b).is_empty());
    b[0] = 1;
    b[5] = 1; // gap of 4: merged
    b[20] = 1; // gap of 14: separate
    b[63] = 1;
    assert_eq!(nonzero_ranges(&b), vec![(0, 6), (20, 1), (63, 1)]);
}
