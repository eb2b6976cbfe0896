//! The journal log: geometry, open, commit, checkpoint, close.
//!
//! The log is the circular area `[s_first, s_maxlen)` of journal blocks. Live transactions (committed,
//! not yet checkpointed) occupy the run from the tail (`s_start` on disk, the first block of the
//! oldest live transaction) to the head (where the next transaction goes), wrapping at
//! `s_maxlen` back to `s_first`:
//!
//! ```text
//!   no wrap:  first [ free | tail ==live== head | free ] maxlen
//!   wrapped:  first [ ==live== head | free | tail ==live== ] maxlen
//! ```
//!
//! Checkpoint writes every pending block home and empties the log (`s_start = 0`); the head
//! stays where it was, and the next commit writes the superblock (`s_start`, `s_sequence`)
//! again first and continues the circular log from the head.
//!
//! Invariants:
//! - `used` (the sum of the live transactions' lengths) never exceeds the log capacity
//!   `s_maxlen - s_first`, so the head never overwrites a live block;
//! - the superblock on disk says `s_start = 0` exactly when no live transaction exists on disk
//!   (it is written with `s_start != 0` before the first block of a transaction on an empty
//!   log, and with 0 only after every live block is durable at home);
//! - a commit record is written only after the transaction's body, the superblock (if
//!   rewritten) and the home device have been flushed;
//! - `pending` holds, for each home block, the newest copy committed and not yet written home;
//!   a block enters only once its commit is durable and leaves only once its home write is
//!   durable or a later durable commit revoked it;
//! - after an I/O error the journal is aborted: every later commit or checkpoint fails fast.
//!
//! Locks: `log` serialises commit, checkpoint, recovery and close and is held across their
//! journal and home I/O; `pending` is held only to look up or update the map, never across
//! I/O, so the fs read path (`pending()`) never waits for a commit's device writes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use super::records::{Jbd2BlockLayout, Record};
use crate::dev::BlockDevice;
use crate::error::{FsError, Result};
use crate::format::jbd2::{
    check_incompat, csum_seed, superblock::SUPERBLOCK_SIZE, JournalSuperblock, TagFormat,
    CHKSUM_CRC32C, COMPAT_CHECKSUM, INCOMPAT_64BIT, INCOMPAT_CSUM_V2, INCOMPAT_CSUM_V3,
    INCOMPAT_FAST_COMMIT, INCOMPAT_REVOKE,
};
use crate::format::{le16, le32};

/// A transaction id (`h_sequence`).
pub type Tid = u32;

/// One contiguous run of the journal: journal blocks `[logical_start, logical_start + len)`
/// live at device blocks `[device_block, device_block + len)` (device block = byte offset /
/// block size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalExtent {
    /// First journal block of the run.
    pub logical_start: u32,
    /// Device block holding `logical_start`.
    pub device_block: u64,
    /// Blocks in the run.
    pub len: u32,
}

/// Where the journal lives. The journal superblock is the lowest mapped journal block: block 0
/// for an internal journal, block 1 (2 with 1 KiB blocks) for an external journal device, whose
/// journal block numbers are device block numbers.
pub struct JournalGeometry {
    /// The device holding the journal.
    pub dev: Arc<dyn BlockDevice>,
    /// Journal block size in bytes (equal to the fs block size).
    pub block_size: u32,
    /// The journal's runs, in any order.
    pub extents: Vec<JournalExtent>,
}

const EXT4_SB_OFFSET: u64 = 1024;
const EXT4_MAGIC: u16 = 0xEF53;
const EXT4_S_MAGIC: usize = 0x38;
const EXT4_S_LOG_BLOCK_SIZE: usize = 0x18;
const EXT4_S_FEATURE_INCOMPAT: usize = 0x60;
const EXT4_S_UUID: usize = 0x68;
const EXT4_FEATURE_INCOMPAT_JOURNAL_DEV: u32 = 0x8;

fn uuid_string(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl JournalGeometry {
    /// Internal journal: extents of inode 8, on the fs device.
    pub fn internal(
        dev: Arc<dyn BlockDevice>,
        block_size: u32,
        extents: Vec<JournalExtent>,
    ) -> Self {
        JournalGeometry {
            dev,
            block_size,
            extents,
        }
    }

    /// External journal device made by `mke2fs -O journal_dev`: an ext4 superblock with the
    /// journal_dev feature at byte 1024, the jbd2 superblock in block
    /// `ext2fs_journal_sb_start(block_size)` (2 for 1 KiB blocks, else 1), and journal block
    /// numbers equal to device block numbers. Checks that `fs_uuid` is among the journal's users,
    /// that the device is the one the file system names (`fs_journal_uuid`, the fs
    /// superblock's `s_journal_uuid`, when set) and that the jbd2 superblock's UUID is its
    /// device's (a corrupt UUID would seed every checksum wrongly), and that the block sizes
    /// match.
    pub fn external(
        dev: Arc<dyn BlockDevice>,
        fs_block_size: u32,
        fs_uuid: [u8; 16],
        fs_journal_uuid: [u8; 16],
    ) -> Result<Self> {
        let mut ext4 = vec![0u8; 1024];
        dev.read_at(EXT4_SB_OFFSET, &mut ext4)?;
        if le16(&ext4, EXT4_S_MAGIC) != EXT4_MAGIC {
            return Err(FsError::corrupt(
                "external journal: no ext4 superblock at byte 1024 (not made by mke2fs -O journal_dev)",
            ));
        }
        if le32(&ext4, EXT4_S_FEATURE_INCOMPAT) & EXT4_FEATURE_INCOMPAT_JOURNAL_DEV == 0 {
            return Err(FsError::corrupt(
                "external journal: the device's ext4 superblock lacks the journal_dev feature",
            ));
        }
        let log = le32(&ext4, EXT4_S_LOG_BLOCK_SIZE);
        let dev_block_size = 1024u32
            .checked_shl(log)
            .filter(|&b| b <= 65536)
            .ok_or_else(|| {
                FsError::corrupt(format!("external journal: bad s_log_block_size {log}"))
            })?;
        if dev_block_size != fs_block_size {
            return Err(FsError::Incompatible(format!(
                "external journal block size {dev_block_size} differs from the file system's \
                 {fs_block_size}"
            )));
        }
        let sb_block: u32 = if fs_block_size == 1024 { 2 } else { 1 };
        let mut jsb = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(u64::from(sb_block) * u64::from(fs_block_size), &mut jsb)?;
        let sb = JournalSuperblock::parse(&jsb)
            .map_err(|e| FsError::corrupt(format!("external journal superblock: {e}")))?;
        if sb.block_size != fs_block_size {
            return Err(FsError::Incompatible(format!(
                "external journal superblock block size {} differs from the file system's \
                 {fs_block_size}",
                sb.block_size
            )));
        }
        let mut dev_uuid = [0u8; 16];
        dev_uuid.copy_from_slice(&ext4[EXT4_S_UUID..EXT4_S_UUID + 16]);
        if fs_journal_uuid != [0; 16] && fs_journal_uuid != dev_uuid {
            return Err(FsError::corrupt(format!(
                "external journal {} is not the journal the file system names ({})",
                uuid_string(&dev_uuid),
                uuid_string(&fs_journal_uuid)
            )));
        }
        if sb.uuid != dev_uuid {
            return Err(FsError::corrupt(format!(
                "external journal superblock UUID {} differs from its device's UUID {}",
                uuid_string(&sb.uuid),
                uuid_string(&dev_uuid)
            )));
        }
        if !sb.user_uuids().contains(&fs_uuid) {
            return Err(FsError::Incompatible(format!(
                "external journal {} does not list file system {} among its {} user(s)",
                uuid_string(&dev_uuid),
                uuid_string(&fs_uuid),
                sb.user_uuids().len()
            )));
        }
        let dev_blocks = dev.len_bytes() / u64::from(fs_block_size);
        if u64::from(sb.len_blocks) > dev_blocks {
            return Err(FsError::corrupt(format!(
                "external journal: s_maxlen {} is larger than the device ({dev_blocks} blocks)",
                sb.len_blocks
            )));
        }
        let len = sb.len_blocks.checked_sub(sb_block).ok_or_else(|| {
            FsError::corrupt(format!(
                "external journal: s_maxlen {} ends before its superblock (block {sb_block})",
                sb.len_blocks
            ))
        })?;
        Ok(JournalGeometry {
            dev,
            block_size: fs_block_size,
            extents: vec![JournalExtent {
                logical_start: sb_block,
                device_block: u64::from(sb_block),
                len,
            }],
        })
    }

    /// The journal block holding the journal superblock: the lowest mapped block.
    pub(super) fn sb_block(&self) -> u32 {
        self.extents
            .iter()
            .map(|e| e.logical_start)
            .min()
            .unwrap_or(0)
    }

    /// Byte offset on `dev` of journal block `logical`.
    pub(super) fn offset_of(&self, logical: u32) -> Result<u64> {
        let e = self
            .extents
            .iter()
            .find(|e| logical >= e.logical_start && logical - e.logical_start < e.len)
            .ok_or_else(|| {
                FsError::corrupt(format!(
                    "journal block {logical} is not mapped by the journal"
                ))
            })?;
        let device_block = e.device_block + u64::from(logical - e.logical_start);
        device_block
            .checked_mul(u64::from(self.block_size))
            .ok_or_else(|| FsError::corrupt("journal extent overflows the device"))
    }

    /// Reads journal block `logical` into `buf` (one block).
    pub(super) fn read_block(&self, logical: u32, buf: &mut [u8]) -> Result<()> {
        let off = self.offset_of(logical)?;
        self.dev.read_at(off, buf)?;
        Ok(())
    }

    /// Writes blocks at the given journal positions, merging device-contiguous runs into one
    /// write each.
    pub(super) fn write_blocks(&self, blocks: &[(u32, &[u8])]) -> Result<()> {
        let bs = u64::from(self.block_size);
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        for &(logical, data) in blocks {
            let off = self.offset_of(logical)?;
            let run_len = u64::try_from(run.len()).unwrap_or(u64::MAX);
            if !run.is_empty() && run_start + run_len != off {
                self.dev.write_at(run_start, &run)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = off;
            }
            debug_assert_eq!(u64::try_from(data.len()).ok(), Some(bs));
            run.extend_from_slice(data);
        }
        if !run.is_empty() {
            self.dev.write_at(run_start, &run)?;
        }
        Ok(())
    }

    /// Checks that every journal block in `[sb_block, len_blocks)` is mapped.
    fn check_covers(&self, len_blocks: u32) -> Result<()> {
        let mut runs: Vec<(u32, u32)> = self
            .extents
            .iter()
            .map(|e| (e.logical_start, e.logical_start.saturating_add(e.len)))
            .collect();
        runs.sort_unstable();
        let mut next = self.sb_block();
        for (start, end) in runs {
            if start > next {
                break;
            }
            next = next.max(end);
        }
        if next < len_blocks {
            return Err(FsError::corrupt(format!(
                "journal extents map blocks up to {next} only, but s_maxlen is {len_blocks}"
            )));
        }
        let dev_len = self.dev.len_bytes();
        for e in &self.extents {
            let end =
                (e.device_block + u64::from(e.len)).saturating_mul(u64::from(self.block_size));
            if end > dev_len {
                return Err(FsError::corrupt(format!(
                    "journal extent {e:?} runs past the end of the device"
                )));
            }
        }
        Ok(())
    }
}

/// How the journal is used.
#[derive(Clone, Copy, Debug, Default)]
pub struct JournalOptions {
    /// Never write to the journal or home device.
    pub read_only: bool,
    /// Write checksum v3 records (set when the fs has metadata_csum): enables the CSUM_V3
    /// incompat bit in the journal superblock on the first read-write open with an empty log,
    /// as the kernel does.
    pub csum_v3: bool,
    /// Write 64-bit block numbers in tags and revoke records (set when the fs is 64bit):
    /// enables the 64BIT incompat bit likewise.
    pub tags_64bit: bool,
}

/// What one commit makes durable.
#[derive(Default)]
pub struct CommitRequest {
    /// (home block number on the fs device, full block content): the snapshot to log.
    pub blocks: Vec<(u64, Arc<[u8]>)>,
    /// Home blocks freed in this transaction: revoke records keep replay from overwriting
    /// their new use.
    pub revoked: Vec<u64>,
}

/// Counters of journal activity since open.
#[derive(Clone, Debug, Default)]
pub struct JournalStats {
    /// Bytes written to the journal device (blocks and superblock updates).
    pub journal_bytes: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Block copies logged.
    pub blocks_logged: u64,
    /// Checkpoints that wrote anything.
    pub checkpoints: u64,
    /// Bytes written home by checkpoints.
    pub home_bytes_checkpointed: u64,
}

/// A committed transaction whose blocks may not yet be home.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(super) struct LiveTxn {
    pub tid: Tid,
    pub start: u32,
    pub len: u32,
}

/// The newest committed copy of a home block.
#[derive(Clone, Debug)]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(super) struct PendingCopy {
    pub tid: Tid,
    pub data: Arc<[u8]>,
}

/// Log state guarded by `Journal::log`.
pub(super) struct LogState {
    /// In-memory copy of the journal superblock; written on disk at the points above. [log]
    pub sb: JournalSuperblock,
    /// How transactions are serialised; changes only when features change on an empty log. [log]
    pub layout: Jbd2BlockLayout,
    /// Where the next transaction starts. [log]
    pub head: u32,
    /// Committed, not checkpointed transactions, oldest first. [log]
    pub live: VecDeque<LiveTxn>,
    /// Set by the first failed write or flush; never cleared. [log]
    pub aborted: bool,
    /// The features the options ask for are on in the on-disk superblock. Opening never writes
    /// (a file system that refuses to mount must leave the image untouched), so they are turned
    /// on by the first commit or close. [log]
    pub features_ready: bool,
}

/// The journal. `Send + Sync`; every method takes `&self`.
pub struct Journal {
    pub(super) geom: JournalGeometry,
    pub(super) home: Arc<dyn BlockDevice>,
    pub(super) opts: JournalOptions,
    /// Journal block of the superblock.
    pub(super) sb_block: u32,
    /// `s_maxlen`.
    pub(super) len_blocks: u32,
    /// `s_first`.
    pub(super) first_block: u32,
    pub(super) log: Mutex<LogState>,
    /// [pending] newest committed copies not yet home.
    pub(super) pending: RwLock<HashMap<u64, PendingCopy>>,
    /// Mirror of the live transactions' total length, readable without `log`.
    pub(super) used: AtomicU32,
    /// Tid the next commit gets. Changes under `log`.
    pub(super) next_tid: AtomicU32,
    /// The on-disk log holds transactions to replay. Changes under `log`.
    pub(super) needs_recovery: AtomicBool,
    pub(super) stats: Mutex<JournalStats>,
}

pub(super) fn layout_for(sb: &JournalSuperblock) -> Jbd2BlockLayout {
    let format = TagFormat::from_incompat(sb.feature_incompat);
    Jbd2BlockLayout {
        format,
        uuid: sb.uuid,
        seed: csum_seed(&sb.uuid),
        block_size: usize::try_from(sb.block_size).unwrap_or(usize::MAX),
        compat_checksum: sb.feature_compat & COMPAT_CHECKSUM != 0 && !format.csum.has_tail(),
    }
}

fn io_abort(state: &mut LogState, e: impl Into<FsError>) -> FsError {
    state.aborted = true;
    e.into()
}

impl Journal {
    /// Reads and validates the journal superblock. Refuses unknown incompat features and
    /// fast commit (`FsError::Incompatible` naming them), bad magic or checksum
    /// (`FsError::Corrupt`). `home` is the fs device where checkpoint and replay write blocks.
    pub fn open(
        geom: JournalGeometry,
        home: Arc<dyn BlockDevice>,
        opts: JournalOptions,
    ) -> Result<Journal> {
        let sb_block = geom.sb_block();
        let bs = usize::try_from(geom.block_size).map_err(|_| FsError::Invalid("block size"))?;
        if bs < SUPERBLOCK_SIZE {
            return Err(FsError::Invalid("journal block size below 1024"));
        }
        let mut raw = vec![0u8; bs];
        geom.read_block(sb_block, &mut raw)?;
        let sb = JournalSuperblock::parse(&raw)
            .map_err(|e| FsError::corrupt(format!("journal superblock: {e}")))?;
        check_incompat(sb.feature_incompat).map_err(FsError::Incompatible)?;
        if sb.block_size != geom.block_size {
            return Err(FsError::corrupt(format!(
                "journal superblock block size {} differs from the file system's {}",
                sb.block_size, geom.block_size
            )));
        }
        if sb.first_log_block <= sb_block {
            return Err(FsError::corrupt(format!(
                "journal s_first {} overlaps the journal superblock (block {sb_block})",
                sb.first_log_block
            )));
        }
        if sb.len_blocks - sb.first_log_block < 4 {
            return Err(FsError::corrupt(format!(
                "journal too small: {} log blocks",
                sb.len_blocks - sb.first_log_block
            )));
        }
        geom.check_covers(sb.len_blocks)?;
        let needs_recovery = sb.start_block != 0;
        let next_tid = sb.sequence.wrapping_add(u32::from(!needs_recovery));
        let journal = Journal {
            sb_block,
            len_blocks: sb.len_blocks,
            first_block: sb.first_log_block,
            log: Mutex::new(LogState {
                layout: layout_for(&sb),
                head: sb.first_log_block,
                live: VecDeque::new(),
                aborted: false,
                features_ready: false,
                sb,
            }),
            geom,
            home,
            opts,
            pending: RwLock::new(HashMap::new()),
            used: AtomicU32::new(0),
            next_tid: AtomicU32::new(next_tid),
            needs_recovery: AtomicBool::new(needs_recovery),
            stats: Mutex::new(JournalStats::default()),
        };
        Ok(journal)
    }

    /// Turns on the features the options ask for, on an empty log only (the records already
    /// in a log must be read in the format they were written in).
    pub(super) fn enable_features(&self, state: &mut LogState) -> Result<()> {
        assert!(!self.opts.read_only);
        assert!(state.live.is_empty());
        state.features_ready = true;
        let sb = &mut state.sb;
        let before = sb.clone();
        let mut incompat = sb.feature_incompat | INCOMPAT_REVOKE;
        if self.opts.csum_v3 {
            incompat = (incompat | INCOMPAT_CSUM_V3) & !INCOMPAT_CSUM_V2;
            sb.feature_compat &= !COMPAT_CHECKSUM;
            sb.checksum_type = CHKSUM_CRC32C;
        }
        if self.opts.tags_64bit {
            incompat |= INCOMPAT_64BIT;
        }
        debug_assert_eq!(incompat & INCOMPAT_FAST_COMMIT, 0);
        sb.feature_incompat = incompat;
        sb.v2 = true;
        if *sb == before {
            return Ok(());
        }
        state.layout = layout_for(&state.sb);
        self.write_sb(state)?;
        self.geom.dev.flush().map_err(|e| io_abort(state, e))?;
        Ok(())
    }

    /// Writes the in-memory superblock to its block (not flushed).
    pub(super) fn write_sb(&self, state: &mut LogState) -> Result<()> {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        state.sb.write(&mut b);
        let off = self.geom.offset_of(self.sb_block)?;
        self.geom
            .dev
            .write_at(off, &b)
            .map_err(|e| io_abort(state, e))?;
        self.stats.lock().journal_bytes += SUPERBLOCK_SIZE as u64;
        Ok(())
    }

    /// Whole-state consistency check, run after each commit in debug builds.
    #[cfg(debug_assertions)]
    pub(super) fn check_invariants(&self, state: &LogState) {
        let used: u32 = state.live.iter().map(|t| t.len).sum();
        assert_eq!(used, self.used.load(Ordering::Acquire));
        assert!(used <= self.capacity());
        for pair in state.live.iter().zip(state.live.iter().skip(1)) {
            assert_eq!(pair.0.tid.wrapping_add(1), pair.1.tid);
            assert_eq!(self.advance(pair.0.start, pair.0.len), pair.1.start);
        }
        if let Some(last) = state.live.back() {
            assert_eq!(self.advance(last.start, last.len), state.head);
            assert_eq!(
                last.tid.wrapping_add(1),
                self.next_tid.load(Ordering::Acquire)
            );
            assert_eq!(
                state.live.front().map(|t| t.start),
                Some(state.sb.start_block)
            );
            for p in self.pending.read().values() {
                assert!(last.tid.wrapping_sub(p.tid) < self.capacity());
            }
        }
    }

    /// The device blocks the journal occupies, as (first block, blocks) runs: for an internal
    /// journal, the blocks of inode 8 that file data must never use.
    pub fn device_runs(&self) -> Vec<(u64, u64)> {
        self.geom
            .extents
            .iter()
            .map(|e| (e.device_block, u64::from(e.len)))
            .collect()
    }

    /// Log capacity in blocks.
    pub(super) fn capacity(&self) -> u32 {
        self.len_blocks - self.first_block
    }

    /// The journal block `n` blocks after `block`, wrapping at `s_maxlen` to `s_first`.
    pub(super) fn advance(&self, block: u32, n: u32) -> u32 {
        debug_assert!(block >= self.first_block && block < self.len_blocks);
        let cap = self.capacity();
        let rel = (block - self.first_block + n % cap) % cap;
        self.first_block + rel
    }

    fn flush_both(&self, state: &mut LogState) -> Result<()> {
        self.home.flush().map_err(|e| io_abort(state, e))?;
        if !std::ptr::addr_eq(Arc::as_ptr(&self.home), Arc::as_ptr(&self.geom.dev)) {
            self.geom.dev.flush().map_err(|e| io_abort(state, e))?;
        }
        Ok(())
    }

    fn check_writable(&self, state: &LogState) -> Result<()> {
        if self.opts.read_only || state.aborted {
            return Err(FsError::ReadOnly);
        }
        if self.needs_recovery.load(Ordering::Acquire) {
            return Err(FsError::Invalid(
                "journal needs recovery before it can be written",
            ));
        }
        Ok(())
    }

    /// True when `s_start != 0`: the log holds transactions to replay.
    pub fn needs_recovery(&self) -> bool {
        self.needs_recovery.load(Ordering::Acquire)
    }

    /// Writes one transaction and returns its tid once durable. Order: (if the log was empty,
    /// the journal superblock with `s_start`/`s_sequence`), descriptor block(s) with tags and
    /// escaped copies, the block copies, revoke block(s), then a flush of `home` and the journal
    /// device (the ordering point that makes ordered-mode data already written home durable
    /// before the commit record), then the commit block and a flush of the journal device. If
    /// the log lacks room, checkpoints first. A block both logged and revoked in one request is
    /// logged, not revoked (the kernel cancels such revokes). Empty requests still commit.
    pub fn commit(&self, req: CommitRequest) -> Result<Tid> {
        let mut state = self.log.lock();
        self.check_writable(&state)?;
        if !state.features_ready && state.live.is_empty() {
            self.enable_features(&mut state)?;
        }
        let bs = usize::try_from(self.geom.block_size).unwrap_or(usize::MAX);
        // Newest content per home block, in first-seen order.
        let mut order: Vec<u64> = Vec::with_capacity(req.blocks.len());
        let mut content: HashMap<u64, Arc<[u8]>> = HashMap::with_capacity(req.blocks.len());
        for (home, data) in req.blocks {
            if data.len() != bs {
                return Err(FsError::Invalid(
                    "commit block content is not one block long",
                ));
            }
            if content.insert(home, data).is_none() {
                order.push(home);
            }
        }
        let mut revoked: Vec<u64> = req
            .revoked
            .into_iter()
            .filter(|h| !content.contains_key(h))
            .collect();
        revoked.sort_unstable();
        revoked.dedup();
        let home_blocks = self.home.len_bytes() / u64::from(self.geom.block_size);
        let bits64 = state.layout.format.bits64;
        for &h in order.iter().chain(&revoked) {
            if h >= home_blocks {
                return Err(FsError::Invalid(
                    "commit names a block past the end of the device",
                ));
            }
            if !bits64 && h > u64::from(u32::MAX) {
                return Err(FsError::Invalid(
                    "64-bit block number in a journal without 64bit",
                ));
            }
        }
        let mut records: Vec<Record> = order
            .iter()
            .map(|h| Record::FullBlock {
                home: *h,
                data: Arc::clone(&content[h]),
            })
            .collect();
        records.extend(revoked.iter().map(|&home| Record::Revoke { home }));
        let needed = state.layout.blocks_needed(&records);
        let needed = u32::try_from(needed).unwrap_or(u32::MAX);
        if needed > self.capacity() {
            return Err(FsError::Invalid("transaction larger than the journal"));
        }
        if needed > self.capacity() - self.used.load(Ordering::Acquire) {
            self.checkpoint_locked(&mut state)?;
        }
        let tid = self.next_tid.load(Ordering::Acquire);
        if state.live.is_empty() {
            state.sb.start_block = state.head;
            state.sb.sequence = tid;
            self.write_sb(&mut state)?;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let txn = state
            .layout
            .serialize(tid, &records, (now.as_secs(), now.subsec_nanos()));
        let start = state.head;
        let positioned: Vec<(u32, &[u8])> = txn
            .body
            .iter()
            .enumerate()
            .map(|(i, b)| (self.advance(start, u32::try_from(i).unwrap_or(0)), &b[..]))
            .collect();
        if let Err(e) = self.geom.write_blocks(&positioned) {
            return Err(io_abort(&mut state, e));
        }
        self.flush_both(&mut state)?;
        let body_len = u32::try_from(txn.body.len()).unwrap_or(u32::MAX);
        let commit_pos = self.advance(start, body_len);
        if let Err(e) = self.geom.write_blocks(&[(commit_pos, &txn.commit)]) {
            return Err(io_abort(&mut state, e));
        }
        self.geom.dev.flush().map_err(|e| io_abort(&mut state, e))?;
        // Durable: account for it.
        state.live.push_back(LiveTxn {
            tid,
            start,
            len: needed,
        });
        state.head = self.advance(start, needed);
        self.used.fetch_add(needed, Ordering::AcqRel);
        self.next_tid.store(tid.wrapping_add(1), Ordering::Release);
        {
            let mut pending = self.pending.write();
            for h in &revoked {
                pending.remove(h);
            }
            for h in &order {
                pending.insert(
                    *h,
                    PendingCopy {
                        tid,
                        data: Arc::clone(&content[h]),
                    },
                );
            }
        }
        #[cfg(debug_assertions)]
        self.check_invariants(&state);
        let mut stats = self.stats.lock();
        stats.commits += 1;
        stats.blocks_logged += order.len() as u64;
        stats.journal_bytes += u64::from(needed) * u64::from(self.geom.block_size);
        Ok(tid)
    }

    /// Newest committed copy of a home block that checkpoint has not yet written home.
    pub fn pending(&self, home_block: u64) -> Option<Arc<[u8]>> {
        self.pending
            .read()
            .get(&home_block)
            .map(|p| Arc::clone(&p.data))
    }

    /// Writes the newest committed copy of every pending block home, flushes home, then
    /// empties the log (superblock `s_start = 0`, `s_sequence` = next tid; the next commit
    /// continues from the head) and flushes the journal device.
    pub fn checkpoint(&self) -> Result<()> {
        let mut state = self.log.lock();
        if self.opts.read_only || state.aborted {
            return Err(FsError::ReadOnly);
        }
        if self.needs_recovery() {
            return Err(FsError::Invalid(
                "journal needs recovery before a checkpoint",
            ));
        }
        self.checkpoint_locked(&mut state)
    }

    pub(super) fn checkpoint_locked(&self, state: &mut LogState) -> Result<()> {
        if state.live.is_empty() {
            debug_assert!(self.pending.read().is_empty());
            return Ok(());
        }
        let mut copies: Vec<(u64, Arc<[u8]>)> = self
            .pending
            .read()
            .iter()
            .map(|(h, p)| (*h, Arc::clone(&p.data)))
            .collect();
        copies.sort_unstable_by_key(|(h, _)| *h);
        let bs = u64::from(self.geom.block_size);
        for (h, data) in &copies {
            self.home
                .write_at(h * bs, data)
                .map_err(|e| io_abort(state, e))?;
        }
        self.home.flush().map_err(|e| io_abort(state, e))?;
        // Home is durable; the log may forget these transactions. `log` is held, so no commit
        // added newer copies since the snapshot.
        self.pending.write().clear();
        state.live.clear();
        self.used.store(0, Ordering::Release);
        // The head stays where it is: the next transaction continues the circular log (and
        // wraps at s_maxlen), as kernels since 6.4 do.
        state.sb.start_block = 0;
        state.sb.sequence = self.next_tid.load(Ordering::Acquire);
        self.write_sb(state)?;
        self.geom.dev.flush().map_err(|e| io_abort(state, e))?;
        let mut stats = self.stats.lock();
        stats.checkpoints += 1;
        stats.home_bytes_checkpointed += copies.len() as u64 * bs;
        Ok(())
    }

    /// Largest number of blocks (logged plus revoked, each counted as one) one transaction may
    /// carry: about a quarter of the log, minus room for descriptors and the commit block.
    pub fn max_transaction_blocks(&self) -> usize {
        let quarter = usize::try_from(self.capacity() / 4).unwrap_or(usize::MAX);
        // Sized for the widest tag format (tag3, 16 bytes) so the answer never depends on the
        // features enabled later, and never takes `log`.
        let bs = usize::try_from(self.geom.block_size).unwrap_or(usize::MAX);
        let widest = TagFormat {
            csum: crate::format::jbd2::CsumVersion::V3,
            bits64: true,
        };
        let per_desc = widest.tags_per_block(bs).max(1);
        // n blocks take n + ceil(n / per_desc) + 1 (commit) journal blocks; keep one spare.
        let n = quarter.saturating_sub(2) * per_desc / (per_desc + 1);
        n.max(1)
    }

    /// Journal blocks used by live (committed, not checkpointed) transactions.
    pub fn used_blocks(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }

    /// Total journal blocks (`s_maxlen`).
    pub fn len_blocks(&self) -> u32 {
        self.len_blocks
    }

    /// Clean shutdown: checkpoint everything, mark the journal empty (`s_start = 0`), flush.
    /// Does nothing on a read-only journal or one that still needs recovery.
    pub fn close(&self) -> Result<()> {
        let mut state = self.log.lock();
        if self.opts.read_only || self.needs_recovery() {
            return Ok(());
        }
        if state.aborted {
            return Err(FsError::ReadOnly);
        }
        self.checkpoint_locked(&mut state)?;
        if !state.features_ready {
            self.enable_features(&mut state)?;
        }
        Ok(())
    }

    /// Aborts the journal as `jbd2_journal_abort` does: no later commit or checkpoint runs, and
    /// `errno` is recorded in the journal superblock (`s_errno`) so that the next mount (ours,
    /// the kernel's or e2fsck) learns that this mount failed. Writing it is best effort: the
    /// device may be what failed.
    pub fn abort(&self, errno: i32) -> Result<()> {
        let mut state = self.log.lock();
        state.aborted = true;
        if self.opts.read_only || state.sb.errno != 0 {
            return Ok(());
        }
        state.sb.errno = errno;
        self.write_sb(&mut state)?;
        self.geom.dev.flush().map_err(FsError::Io)
    }

    /// The error a previous mount recorded in `s_errno` (0 if none).
    pub fn recorded_errno(&self) -> i32 {
        self.log.lock().sb.errno
    }

    /// Clears `s_errno` once the error was copied into the file-system superblock, as ext4's
    /// mount does.
    pub fn clear_recorded_errno(&self) -> Result<()> {
        let mut state = self.log.lock();
        if self.opts.read_only || state.sb.errno == 0 {
            return Ok(());
        }
        state.sb.errno = 0;
        self.write_sb(&mut state)?;
        self.geom.dev.flush().map_err(|e| io_abort(&mut state, e))
    }

    /// Counters since open.
    pub fn stats(&self) -> JournalStats {
        self.stats.lock().clone()
    }

    /// Tid the next commit will get.
    pub fn next_tid(&self) -> Tid {
        self.next_tid.load(Ordering::Acquire)
    }
}
