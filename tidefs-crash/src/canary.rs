//! Canaries: devices that break one ordering point on purpose, so the tests can prove that the
//! harness catches a broken ordering (a harness that never fails proves nothing).
//!
//! The library has no switch for this: a canary sits between the file system and the recording
//! device of a recorded run, and changes only what reaches the device and when. Recovery and
//! the oracle never see a canary.
//!
//! - [`DropFlushBeforeCommit`] (`commit-without-flush`): drops the flush between a
//!   transaction's body (descriptor and revoke blocks with the logged copies) and its commit
//!   block, so the commit block may reach the disk before the body and before the ordered-mode
//!   data the flush should have made durable (ordering point 1 of docs/DESIGN.md §4.2).
//! - [`DataAfterCommit`] (`data-after-commit`): holds back every write outside the journal
//!   issued between two flushes that also saw a journal write (a commit's body, whose batch
//!   carries the ordered-mode data, in whatever order the batch issues them), and lets it go
//!   only after the next journal write that follows the flush (the commit block): in ordered
//!   mode, file data reaches home after the commit that maps it. Writes outside the journal
//!   with no journal write beside them (a checkpoint's home writes, in-place writes,
//!   overwrites) go out before the next flush, in order, as they would.
//!
//! Invariants:
//! - reads see every write the file system issued, held back or not (the file system above
//!   must not notice the canary, only the disk does);
//! - a canary never reorders writes inside the journal, and never drops or reorders anything
//!   outside the single ordering point it breaks.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;
use tidefs::dev::BlockDevice;
use tidefs::format::jbd2::{BlockHeader, BlockType};

/// A deliberately broken ordering in the recorded runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canary {
    /// The flush before the commit block is dropped ([`DropFlushBeforeCommit`]).
    CommitWithoutFlush,
    /// Ordered data reaches home after the commit that maps it ([`DataAfterCommit`]).
    DataAfterCommit,
}

impl Canary {
    /// Every canary.
    pub const ALL: [Canary; 2] = [Canary::CommitWithoutFlush, Canary::DataAfterCommit];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Canary::CommitWithoutFlush => "commit-without-flush",
            Canary::DataAfterCommit => "data-after-commit",
        }
    }

    /// Parses a name of [`Canary::name`].
    pub fn parse(name: &str) -> Option<Canary> {
        Canary::ALL.into_iter().find(|c| c.name() == name)
    }

    /// `below` with this canary in front of it.
    pub fn wrap(self, below: Arc<dyn BlockDevice>, journal: JournalArea) -> Arc<dyn BlockDevice> {
        match self {
            Canary::CommitWithoutFlush => Arc::new(DropFlushBeforeCommit::new(below, journal)),
            Canary::DataAfterCommit => Arc::new(DataAfterCommit::new(below, journal)),
        }
    }
}

/// The device bytes of an internal journal, and its block size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JournalArea {
    /// Byte ranges on the device, in the journal's logical order.
    pub runs: Vec<Range<u64>>,
    /// Block size of the file system.
    pub block_bytes: u64,
}

impl JournalArea {
    /// The area of the journal whose logical blocks are the device blocks `blocks`, in order.
    pub fn from_blocks(blocks: &[u64], block_bytes: u64) -> JournalArea {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for &b in blocks {
            let (start, end) = (b * block_bytes, (b + 1) * block_bytes);
            match runs.last_mut() {
                Some(r) if r.end == start => r.end = end,
                _ => runs.push(start..end),
            }
        }
        JournalArea { runs, block_bytes }
    }

    /// Whether byte `offset` lies in the journal.
    pub fn contains(&self, offset: u64) -> bool {
        self.runs.iter().any(|r| r.contains(&offset))
    }

    /// The journal's length in blocks.
    pub fn len_blocks(&self) -> u64 {
        let bytes: u64 = self.runs.iter().map(|r| r.end - r.start).sum();
        bytes.checked_div(self.block_bytes).unwrap_or(0)
    }

    /// The logical journal block holding device byte `offset`, if it is in the journal.
    pub fn logical_block(&self, offset: u64) -> Option<u64> {
        let mut before = 0u64;
        for r in &self.runs {
            if r.contains(&offset) {
                return (before + offset - r.start).checked_div(self.block_bytes);
            }
            before += r.end - r.start;
        }
        None
    }

    /// The jbd2 block types of the journal metadata blocks in a write at `offset` (logged
    /// copies of home blocks have no header and give nothing).
    fn block_types(&self, offset: u64, data: &[u8]) -> Vec<BlockType> {
        if !self.contains(offset) || self.block_bytes == 0 {
            return Vec::new();
        }
        // A block size fits in usize.
        let bs = usize::try_from(self.block_bytes).unwrap_or(usize::MAX);
        data.chunks(bs)
            .filter_map(|b| BlockHeader::parse(b).ok().map(|h| h.block_type))
            .collect()
    }
}

/// What [`DropFlushBeforeCommit`] saw since the last flush it passed on.
#[derive(Default)]
struct SinceFlush {
    /// A descriptor or revoke block was written: a transaction body.
    body: bool,
    /// A commit block was written.
    commit: bool,
}

/// Drops the flush between a transaction's body and its commit block: the flush that comes
/// after descriptor or revoke blocks and before any commit block.
pub struct DropFlushBeforeCommit {
    below: Arc<dyn BlockDevice>,
    journal: JournalArea,
    /// [since]
    since: Mutex<SinceFlush>,
}

impl DropFlushBeforeCommit {
    /// The canary in front of `below`, whose journal lies at `journal`.
    pub fn new(below: Arc<dyn BlockDevice>, journal: JournalArea) -> DropFlushBeforeCommit {
        DropFlushBeforeCommit {
            below,
            journal,
            since: Mutex::default(),
        }
    }
}

impl BlockDevice for DropFlushBeforeCommit {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.below.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let mut since = self.since.lock();
        for t in self.journal.block_types(offset, buf) {
            match t {
                BlockType::Descriptor | BlockType::Revoke => since.body = true,
                BlockType::Commit => since.commit = true,
                BlockType::SuperblockV1 | BlockType::SuperblockV2 => {}
            }
        }
        self.below.write_at(offset, buf)
    }

    fn flush(&self) -> std::io::Result<()> {
        let mut since = self.since.lock();
        if since.body && !since.commit {
            // The ordering point this canary removes: the body stays in flight with the commit
            // block that follows.
            return Ok(());
        }
        *since = SinceFlush::default();
        self.below.flush()
    }

    fn len_bytes(&self) -> u64 {
        self.below.len_bytes()
    }
}

/// Writes outside the journal held back by [`DataAfterCommit`].
#[derive(Default)]
struct Held {
    /// (device offset, bytes), in the order they were issued.
    writes: Vec<(u64, Vec<u8>)>,
    /// A journal write was issued since the last flush: a commit is under way.
    journal_since: bool,
    /// A flush passed while a commit was under way: the next journal write is its commit
    /// block, after which the held writes go out.
    armed: bool,
}

/// Holds writes outside the journal back until after the commit block of the transaction
/// being committed when they were issued (see the module comment).
pub struct DataAfterCommit {
    below: Arc<dyn BlockDevice>,
    journal: JournalArea,
    /// [held]
    held: Mutex<Held>,
}

impl DataAfterCommit {
    /// The canary in front of `below`, whose journal lies at `journal`.
    pub fn new(below: Arc<dyn BlockDevice>, journal: JournalArea) -> DataAfterCommit {
        DataAfterCommit {
            below,
            journal,
            held: Mutex::default(),
        }
    }

    fn release(&self, held: &mut Held) -> std::io::Result<()> {
        for (at, bytes) in std::mem::take(&mut held.writes) {
            self.below.write_at(at, &bytes)?;
        }
        held.journal_since = false;
        held.armed = false;
        Ok(())
    }
}

impl BlockDevice for DataAfterCommit {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let held = self.held.lock();
        self.below.read_at(offset, buf)?;
        let end = offset + buf.len() as u64;
        for (at, bytes) in &held.writes {
            let (lo, hi) = (offset.max(*at), end.min(at + bytes.len() as u64));
            if lo < hi {
                // Both differences are below the lengths of in-memory buffers.
                let dst = (lo - offset) as usize;
                let src = (lo - at) as usize;
                let n = (hi - lo) as usize;
                buf[dst..dst + n].copy_from_slice(&bytes[src..src + n]);
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let mut held = self.held.lock();
        if !self.journal.contains(offset) {
            held.writes.push((offset, buf.to_vec()));
            return Ok(());
        }
        self.below.write_at(offset, buf)?;
        if held.armed && !held.writes.is_empty() {
            // The commit block is out: the data it maps follows it (the broken ordering).
            self.release(&mut held)
        } else {
            held.journal_since = true;
            Ok(())
        }
    }

    fn flush(&self) -> std::io::Result<()> {
        let mut held = self.held.lock();
        if !held.writes.is_empty() {
            if held.journal_since {
                held.armed = true;
            } else {
                // No commit is under way: these writes go out before the flush, as issued.
                self.release(&mut held)?;
            }
        }
        // Journal writes before this flush belong to a commit body already flushed.
        held.journal_since = false;
        self.below.flush()
    }

    fn len_bytes(&self) -> u64 {
        self.below.len_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidefs::dev::record::{LogEntry, RecordingDevice};

    const BS: u64 = 4096;

    fn header(t: BlockType) -> Vec<u8> {
        let mut b = vec![0u8; BS as usize];
        BlockHeader {
            block_type: t,
            sequence: 5,
        }
        .write(&mut b);
        b
    }

    /// Journal at blocks 8..16 of a 32-block device; the log as a compact string: `w<block>`
    /// per write, `F` per flush.
    fn rig(canary: Canary) -> (Arc<RecordingDevice>, Arc<dyn BlockDevice>) {
        let rec = Arc::new(RecordingDevice::new(Arc::new(vec![0u8; 32 * BS as usize])));
        let area = JournalArea::from_blocks(&(8..16).collect::<Vec<_>>(), BS);
        let dev = canary.wrap(rec.clone(), area);
        (rec, dev)
    }

    fn shape(rec: &RecordingDevice) -> String {
        rec.recording()
            .log
            .iter()
            .map(|e| match e {
                LogEntry::Write { offset, .. } => format!("w{}", offset / BS),
                LogEntry::Flush => "F".into(),
                LogEntry::Marker(m) => format!("m{m}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// An ordered-mode commit as the journal issues it: data home (block 20), body (descriptor
    /// at 9, copy at 10), flush, commit block (11), flush.
    fn commit(dev: &dyn BlockDevice) {
        dev.write_at(20 * BS, &[1u8; BS as usize]).unwrap();
        dev.write_at(9 * BS, &header(BlockType::Descriptor))
            .unwrap();
        dev.write_at(10 * BS, &[2u8; BS as usize]).unwrap();
        dev.flush().unwrap();
        dev.write_at(11 * BS, &header(BlockType::Commit)).unwrap();
        dev.flush().unwrap();
    }

    #[test]
    fn commit_without_flush_drops_only_the_flush_before_the_commit_block() {
        let (rec, dev) = rig(Canary::CommitWithoutFlush);
        commit(dev.as_ref());
        // A checkpoint: home write, flush, journal superblock, flush; both flushes stay.
        dev.write_at(3 * BS, &[3u8; BS as usize]).unwrap();
        dev.flush().unwrap();
        dev.write_at(8 * BS, &header(BlockType::SuperblockV2))
            .unwrap();
        dev.flush().unwrap();
        assert_eq!(shape(&rec), "w20 w9 w10 w11 F w3 F w8 F");
    }

    #[test]
    fn data_after_commit_moves_home_writes_behind_the_commit_block_only() {
        let (rec, dev) = rig(Canary::DataAfterCommit);
        commit(dev.as_ref());
        // The file system still reads its data while it is held back.
        dev.write_at(21 * BS, &[4u8; BS as usize]).unwrap();
        let mut b = vec![0u8; 8];
        dev.read_at(21 * BS + 100, &mut b).unwrap();
        assert_eq!(b, vec![4u8; 8]);
        // No journal write follows it: it goes out before the next flush, in order.
        dev.flush().unwrap();
        assert_eq!(shape(&rec), "w9 w10 F w11 w20 F w21 F");
    }

    #[test]
    fn journal_area_maps_device_bytes_to_logical_blocks() {
        let area = JournalArea::from_blocks(&[40, 41, 42, 10, 11], BS);
        assert_eq!(area.runs, vec![40 * BS..43 * BS, 10 * BS..12 * BS]);
        assert_eq!(area.len_blocks(), 5);
        assert_eq!(area.logical_block(41 * BS + 7), Some(1));
        assert_eq!(area.logical_block(11 * BS), Some(4));
        assert_eq!(area.logical_block(12 * BS), None);
        assert!(area.contains(10 * BS) && !area.contains(43 * BS));
    }
}
