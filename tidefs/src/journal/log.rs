//! The journal log: geometry, open, commit, checkpoint, close, and the background
//! checkpointer.
//!
//! The log is the circular area `[s_first, s_maxlen)` of journal blocks. Live transactions
//! (committed, not yet checkpointed) occupy the run from the tail (`s_start` on disk, the first
//! block of the oldest live transaction) to the head (where the next transaction goes), wrapping at
//! `s_maxlen` back to `s_first`. The head is a block and a byte offset in it: compact commits
//! (docs/DESIGN.md §4.5a) share a block at successive sector offsets, while a block-layout
//! transaction always starts at a block boundary. Space is counted in blocks: a block is used while
//! any transaction in it is live.
//!
//! ```text
//!   no wrap:  first [ free | tail ==live== head | free ] maxlen
//!   wrapped:  first [ ==live== head | free | tail ==live== ] maxlen
//! ```
//!
//! Checkpoint retires the live transactions that were committed when it started: it writes the
//! newest committed copy of each of their blocks home, in sorted batches, without holding
//! `log`; flushes home; then, holding `log` briefly, moves the tail past them (`s_start` = the
//! oldest transaction still live, or 0 when none is) with one durable superblock write. The
//! head never moves back; the next commit continues the circular log from it.
//!
//! Invariants:
//! - `used` (the sum of the blocks the live transactions opened) never exceeds the log capacity
//!   `s_maxlen - s_first`, so the head never overwrites a live block; it shrinks only after the
//!   superblock naming the new tail is durable;
//! - every journal block holding transactions starts with one at offset 0, and the tail is a
//!   block: a transaction that shares the tail block with a live one stays live (listed in
//!   `live`, replayable, `is_logged`) even once checkpointed, so `s_sequence` is always the tid
//!   at offset 0 of the tail block; when the log empties, the head moves to the next block
//!   boundary, so no retired transaction is ever replayed again;
//! - the incompat bit `INCOMPAT_TIDEFS_EXT` is on in the on-disk superblock (durably) before any
//!   extension record is written, and `INCOMPAT_TIDEFS_UNFENCED` before any unfenced
//!   transaction; each is cleared with the tail write that retires the last live transaction
//!   needing it;
//! - the superblock on disk says `s_start = 0` exactly when no live transaction exists on disk
//!   (it is written with `s_start != 0` before the first block of a transaction on an empty
//!   log, and with 0 only after every live block is durable at home);
//! - a commit block is written only after the transaction's body, the superblock (if
//!   rewritten) and the home device have been flushed, except an unfenced one (no ordered
//!   data; checksum v3; `INCOMPAT_TIDEFS_UNFENCED` durable first), written in one batch with its
//!   body and flushed with it; a compact commit (its own body, under
//!   its own checksum) only after the superblock, if rewritten, is durable and, when ordered
//!   data went home for it, the home device has been flushed;
//! - `pending` holds, for each home block, the newest copy committed and not yet written home;
//!   a block enters only once its commit is durable and leaves only once a copy at least as new
//!   is durable at home or a later durable commit revoked it;
//! - checkpoints run one at a time, so a home block is never written by two checkpoints at
//!   once, and a later checkpoint (the only writer of a newer copy) starts after an earlier one
//!   has finished writing: an older copy never lands over a newer one;
//! - a checkpoint writes a block only if it is still pending when its batch starts, and a commit
//!   that revokes a pending block waits for the batch in flight: once the commit returns (and
//!   the freed block may be reused), no checkpoint writes the old copy;
//! - after an I/O error the journal is aborted: every later commit or checkpoint fails fast.
//!
//! Locks, in the order they are taken: `commit_gate` (one commit, close or recovery at a time)
//! → `checkpoint_gate` (one checkpoint at a time) → `log` (the log's state; a commit holds it
//! across its journal I/O, a checkpoint only to take its snapshot and for the final superblock
//! write) → `cp_batch` (held by a checkpoint across one batch of home writes) → `pending`
//! (held only to look up or update the map, never across I/O, so the fs read path never waits
//! for device writes). A commit never waits for a checkpoint's home writes, except for one batch
//! when it revokes a block that batch may be writing, and except when the log is full.

use std::collections::{HashMap, VecDeque};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};

use super::records::{nonzero_ranges, range_entry_len, Jbd2BlockLayout, Record};
use crate::dev::{sector_span, BlockDevice};
use crate::error::{FsError, Result};
use crate::format::jbd2::{
    check_incompat, csum_seed, superblock::SUPERBLOCK_SIZE, CsumVersion, JournalSuperblock,
    TagFormat, CHKSUM_CRC32C, COMPAT_CHECKSUM, INCOMPAT_64BIT, INCOMPAT_CSUM_V2, INCOMPAT_CSUM_V3,
    INCOMPAT_FAST_COMMIT, INCOMPAT_REVOKE, INCOMPAT_TIDEFS_EXT, INCOMPAT_TIDEFS_ONLY,
    INCOMPAT_TIDEFS_UNFENCED,
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
        let (geom, sb, dev_uuid) = Self::external_device(dev)?;
        if geom.block_size != fs_block_size {
            return Err(FsError::Incompatible(format!(
                "external journal block size {} differs from the file system's \
                 {fs_block_size}",
                geom.block_size
            )));
        }
        if fs_journal_uuid != [0; 16] && fs_journal_uuid != dev_uuid {
            return Err(FsError::corrupt(format!(
                "external journal {} is not the journal the file system names ({})",
                uuid_string(&dev_uuid),
                uuid_string(&fs_journal_uuid)
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
        Ok(geom)
    }

    /// An external journal device on its own, without a file system to check it against (for
    /// reading it, as `tidefs dump-journal --journal-device` does): the device's ext4 and jbd2
    /// superblocks, their block sizes and UUIDs, and `s_maxlen` checked. Returns the geometry,
    /// the jbd2 superblock and the device's UUID.
    pub fn external_device(
        dev: Arc<dyn BlockDevice>,
    ) -> Result<(Self, JournalSuperblock, [u8; 16])> {
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
        let block_size = 1024u32
            .checked_shl(log)
            .filter(|&b| b <= 65536)
            .ok_or_else(|| {
                FsError::corrupt(format!("external journal: bad s_log_block_size {log}"))
            })?;
        let sb_block: u32 = if block_size == 1024 { 2 } else { 1 };
        let mut jsb = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(u64::from(sb_block) * u64::from(block_size), &mut jsb)?;
        let sb = JournalSuperblock::parse(&jsb)
            .map_err(|e| FsError::corrupt(format!("external journal superblock: {e}")))?;
        if sb.block_size != block_size {
            return Err(FsError::Incompatible(format!(
                "external journal superblock block size {} differs from its device's \
                 {block_size}",
                sb.block_size
            )));
        }
        let mut dev_uuid = [0u8; 16];
        dev_uuid.copy_from_slice(&ext4[EXT4_S_UUID..EXT4_S_UUID + 16]);
        if sb.uuid != dev_uuid {
            return Err(FsError::corrupt(format!(
                "external journal superblock UUID {} differs from its device's UUID {}",
                uuid_string(&sb.uuid),
                uuid_string(&dev_uuid)
            )));
        }
        let dev_blocks = dev.len_bytes() / u64::from(block_size);
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
        let geom = JournalGeometry {
            dev,
            block_size,
            extents: vec![JournalExtent {
                logical_start: sb_block,
                device_block: u64::from(sb_block),
                len,
            }],
        };
        Ok((geom, sb, dev_uuid))
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

    /// Bytes the journal device receives for `pieces`: whole sectors.
    pub(super) fn received(&self, pieces: &[(u64, &[u8])]) -> u64 {
        let sector = self.dev.sector_size();
        pieces
            .iter()
            .map(|(o, b)| sector_span(*o, b.len(), sector).0)
            .sum()
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
    /// Always flush a block-layout transaction's body before its commit block, so that every
    /// transaction stays replayable by the kernel and e2fsck. When false (the default), a
    /// transaction under checksum v3 whose data needs no ordering before it is written as
    /// body and commit block together with one flush (see [`JournalCore::commit`]).
    pub fenced_commits: bool,
}

/// What one commit makes durable.
#[derive(Default)]
pub struct CommitRequest {
    /// (home block number on the fs device, full block content): the snapshot to log.
    pub blocks: Vec<(u64, Arc<[u8]>)>,
    /// Home blocks of which only some bytes changed since their previous committed version:
    /// the log may record just those bytes.
    pub ranges: Vec<RangeUpdate>,
    /// Home blocks freed in this transaction: revoke records keep replay from overwriting
    /// their new use.
    pub revoked: Vec<u64>,
    /// The caller wrote file data home for this transaction; it must be durable before the
    /// commit record (ordered mode's promise).
    pub data_written_home: bool,
    /// File data for the home device, as (byte offset, bytes), that must be durable before
    /// the commit record (ordered mode's promise). The journal writes it together with the
    /// log body, so the device works on both at once, and flushes it with the body.
    pub home_data: Vec<(u64, Arc<[u8]>)>,
    /// `home_data` need only be durable when the commit returns, not before the commit record
    /// (writeback and lightweight pages): it does not keep the commit fenced.
    pub home_data_unordered: bool,
}

/// A block of which only some byte ranges changed since its previous committed version.
///
/// The caller's contract: replay of the log onto the home device yields that previous
/// version, so patching it with `ranges` yields `data`. This does not hold for a freshly
/// allocated block (its home content is whatever was there) nor for a block written home in
/// place after the log recorded it: those go in [`CommitRequest::blocks`]. (A range update of
/// a block this same request revokes is logged whole, which is always safe.) The ranges must
/// be non-empty, sorted, disjoint and inside the block, or the commit fails with `Invalid`; an
/// update without ranges logs nothing.
#[derive(Clone, Debug)]
pub struct RangeUpdate {
    /// Home block number on the fs device.
    pub home: u64,
    /// The block's full new content: the copy reads and checkpoint use.
    pub data: Arc<[u8]>,
    /// Sorted, disjoint `(offset, len)` byte ranges of `data` that differ from the previous
    /// committed version.
    pub ranges: Vec<(u32, u32)>,
}

/// Counters of journal activity since open.
#[derive(Clone, Debug, Default)]
pub struct JournalStats {
    /// Bytes the journal device received (blocks and superblock updates, in whole sectors).
    pub journal_bytes: u64,
    /// Flushes the journal issued on the journal device.
    pub journal_flushes: u64,
    /// Flushes the journal issued on the home device when it is not the journal device.
    pub home_flushes: u64,
    /// Durable writes the journal issued: commit blocks and superblock tail updates.
    pub durable_writes: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Block copies logged.
    pub blocks_logged: u64,
    /// Checkpoints that wrote anything.
    pub checkpoints: u64,
    /// Bytes written home by checkpoints.
    pub home_bytes_checkpointed: u64,
    /// Times a commit found the log full and waited for a checkpoint.
    pub commits_waited_for_checkpoint: u64,
    /// Transactions written as one compact commit.
    pub compact_commits: u64,
    /// Byte-range records logged.
    pub range_records: u64,
    /// Bytes of the ranges logged (the new bytes, without record headers).
    pub range_bytes: u64,
}

/// One block-layout transaction on its way to the log (`JournalCore::write_block_layout`).
#[derive(Clone, Copy)]
struct TxnWrite<'a> {
    tid: Tid,
    records: &'a [Record],
    home_data: &'a [(u64, Arc<[u8]>)],
    /// Journal block where it starts.
    start: u32,
    /// (seconds, nanoseconds) since the epoch.
    commit_time: (u64, u32),
    /// Written with its commit block in one batch and one flush (see `JournalCore::commit`).
    unfenced: bool,
    /// The held commit block of the transaction before (device offset, bytes), written first
    /// in the batch.
    carried: Option<(u64, &'a [u8])>,
}

/// A committed transaction whose blocks may not yet be home.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(super) struct LiveTxn {
    pub tid: Tid,
    /// Journal block where it starts.
    pub start: u32,
    /// Byte offset in `start` where it starts (non-zero only for a compact commit).
    pub start_off: u32,
    /// Blocks it opened (counted in `used`): 0 for a compact commit in a block already in use.
    pub len: u32,
    /// The tidefs-only incompat bits it needs while live: `INCOMPAT_TIDEFS_EXT` when it holds
    /// extension records (byte ranges, or it is a compact commit), `INCOMPAT_TIDEFS_UNFENCED`
    /// when it is unfenced.
    pub guard: u32,
    /// The head after it: (block, byte offset).
    pub end: (u32, u32),
}

/// The tidefs-only incompat bits the live transactions, and the one whose commit block is
/// held, need.
fn live_guard(live: &VecDeque<LiveTxn>, held: Option<&HeldCommit>) -> u32 {
    live.iter()
        .chain(held.map(|h| &h.done.live))
        .fold(0, |bits, t| bits | t.guard)
}

/// What a transaction's commit becomes once its commit block is durable
/// ([`JournalCore::made_durable`]).
pub(super) struct DurableTxn {
    pub live: LiveTxn,
    pub records: Vec<Record>,
    pub revoked: Vec<u64>,
    /// Bytes the journal device received for it.
    pub written: u64,
    pub compact: bool,
    /// Its commit block was written as a durable write of its own (a write and a flush).
    pub durable_write: bool,
}

/// A commit block not yet written: its device byte offset and its bytes.
type UnwrittenCommit = (u64, Vec<u8>);

/// A block-layout transaction whose body (and ordered data) is durable and whose commit block
/// is not yet written: the next commit writes it in its first batch, ahead of its own body,
/// so that one flush makes this transaction durable and the next one's body too.
pub(super) struct HeldCommit {
    /// Device byte offset of the commit block.
    pub at: u64,
    pub block: Vec<u8>,
    pub done: DurableTxn,
}

/// The newest committed copy of a home block.
#[derive(Clone, Debug)]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(super) struct PendingCopy {
    pub tid: Tid,
    pub data: Arc<[u8]>,
}

/// Log state guarded by `JournalCore::log`.
pub(super) struct LogState {
    /// In-memory copy of the journal superblock; written on disk at the points above. [log]
    pub sb: JournalSuperblock,
    /// How transactions are serialised; changes only when features change on an empty log. [log]
    pub layout: Jbd2BlockLayout,
    /// The block where the next transaction goes. [log]
    pub head: u32,
    /// Byte offset in `head` where the next compact commit may go (a multiple of the sector
    /// size; 0 = the block is fresh). [log]
    pub head_off: u32,
    /// Committed, not checkpointed transactions, oldest first. [log]
    pub live: VecDeque<LiveTxn>,
    /// The transaction after the live ones whose body is durable and whose commit block
    /// waits in memory, to go out in the next commit's first batch (see
    /// [`JournalCore::commit_holding`]). Its blocks already count in `used`, the head is past
    /// it and `next_tid` names its successor; it joins `live` once its commit block is
    /// durable. [log]
    pub held: Option<HeldCommit>,
    /// Set by the first failed write or flush; never cleared. [log]
    pub aborted: bool,
    /// The features the options ask for are on in the on-disk superblock. Opening never writes
    /// (a file system that refuses to mount must leave the image untouched), so they are turned
    /// on by the first commit or close. [log]
    pub features_ready: bool,
}

/// The journal. `Send + Sync`; every method takes `&self` (they live on [`JournalCore`],
/// which a `Journal` dereferences to). Dropping it stops its background checkpointer.
pub struct Journal {
    core: Arc<JournalCore>,
}

impl Deref for Journal {
    type Target = JournalCore;
    fn deref(&self) -> &JournalCore {
        &self.core
    }
}

impl Journal {
    /// Stops the background checkpointer for good, waiting for a checkpoint it is running:
    /// afterwards the journal writes only when called. For a file system stopping as at a
    /// power cut.
    pub fn stop_background(&self) {
        let handle = {
            let mut w = self.core.worker.lock();
            w.stop = true;
            w.handle.take()
        };
        self.core.worker_wake.notify_all();
        if let Some(h) = handle {
            if h.join().is_err() {
                log::error!("the journal's background checkpointer panicked");
            }
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop_background();
    }
}

/// The background checkpointer's state. [worker]
#[derive(Default)]
pub(super) struct Worker {
    /// A commit asked for a checkpoint since the worker last started one.
    requested: bool,
    /// The journal is being dropped: the worker returns.
    stop: bool,
    /// The worker thread, started by the first request.
    handle: Option<JoinHandle<()>>,
}

/// The journal's state and operations, shared with its background checkpointer.
pub struct JournalCore {
    pub(super) geom: JournalGeometry,
    pub(super) home: Arc<dyn BlockDevice>,
    pub(super) opts: JournalOptions,
    /// Journal block of the superblock.
    pub(super) sb_block: u32,
    /// `s_maxlen`.
    pub(super) len_blocks: u32,
    /// `s_first`.
    pub(super) first_block: u32,
    /// One commit, close or recovery at a time.
    pub(super) commit_gate: Mutex<()>,
    /// One checkpoint at a time.
    pub(super) checkpoint_gate: Mutex<()>,
    pub(super) log: Mutex<LogState>,
    /// Held by a checkpoint while it writes one batch of home blocks.
    pub(super) cp_batch: Mutex<()>,
    /// [pending] newest committed copies not yet home.
    pub(super) pending: RwLock<HashMap<u64, PendingCopy>>,
    /// [logged] home block → tid of the newest live transaction that logged it (full or
    /// range) and that no later live transaction revoked: what `is_logged` answers from.
    /// Updated under `log`; taken after it and never across I/O.
    pub(super) logged: Mutex<HashMap<u64, Tid>>,
    /// Mirror of the live transactions' total length, readable without `log`.
    pub(super) used: AtomicU32,
    /// Tid the next commit gets. Changes under `log`.
    pub(super) next_tid: AtomicU32,
    /// The on-disk log holds transactions to replay. Changes under `log`.
    pub(super) needs_recovery: AtomicBool,
    pub(super) stats: Mutex<JournalStats>,
    /// No background checkpoints (the recovery benchmark needs a full log at its crash).
    pub(super) hold_checkpoints: AtomicBool,
    /// [worker] the background checkpointer.
    pub(super) worker: Mutex<Worker>,
    pub(super) worker_wake: Condvar,
    /// This core, for starting the worker thread.
    me: Weak<JournalCore>,
}

/// Home blocks one checkpoint batch writes at most (4 MiB of 4 KiB blocks).
pub(super) const CHECKPOINT_BATCH_BLOCKS: usize = 1024;

/// True when tid `a` is `b` or later, modulo wrap-around (kernel `tid_geq`).
pub fn tid_geq(a: Tid, b: Tid) -> bool {
    a.wrapping_sub(b) < 0x8000_0000
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

/// Checks a range list: sorted, disjoint, non-empty ranges inside a `bs`-byte block.
fn check_ranges(ranges: &[(u32, u32)], bs: usize) -> Result<()> {
    let mut end = 0usize;
    for &(off, len) in ranges {
        let (off, len) = (off as usize, len as usize);
        if len == 0 || off < end || off + len > bs {
            return Err(FsError::Invalid(
                "range update: ranges must be non-empty, sorted, disjoint and inside the block",
            ));
        }
        end = off + len;
    }
    Ok(())
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
        let core = Arc::new_cyclic(|me| JournalCore {
            sb_block,
            len_blocks: sb.len_blocks,
            first_block: sb.first_log_block,
            log: Mutex::new(LogState {
                layout: layout_for(&sb),
                head: sb.first_log_block,
                head_off: 0,
                live: VecDeque::new(),
                held: None,
                aborted: false,
                features_ready: false,
                sb,
            }),
            geom,
            home,
            opts,
            pending: RwLock::new(HashMap::new()),
            logged: Mutex::new(HashMap::new()),
            used: AtomicU32::new(0),
            next_tid: AtomicU32::new(next_tid),
            needs_recovery: AtomicBool::new(needs_recovery),
            stats: Mutex::new(JournalStats::default()),
            commit_gate: Mutex::new(()),
            checkpoint_gate: Mutex::new(()),
            cp_batch: Mutex::new(()),
            hold_checkpoints: AtomicBool::new(false),
            worker: Mutex::new(Worker::default()),
            worker_wake: Condvar::new(),
            me: me.clone(),
        });
        Ok(Journal { core })
    }
}

impl JournalCore {
    /// Turns on the features the options ask for, on an empty log only (the records already
    /// in a log must be read in the format they were written in).
    pub(super) fn enable_features(&self, state: &mut LogState) -> Result<()> {
        assert!(!self.opts.read_only);
        assert!(state.live.is_empty());
        state.features_ready = true;
        let sb = &mut state.sb;
        let before = sb.clone();
        // The tidefs bits of an empty log guard nothing.
        let mut incompat = (sb.feature_incompat | INCOMPAT_REVOKE) & !INCOMPAT_TIDEFS_ONLY;
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
        self.flush_journal_dev().map_err(|e| io_abort(state, e))?;
        Ok(())
    }

    /// Writes the in-memory superblock to its block (not flushed).
    pub(super) fn write_sb(&self, state: &mut LogState) -> Result<()> {
        self.write_sb_as(state, false)
    }

    /// Writes the in-memory superblock to its block and returns once it is durable:
    /// it orders nothing else.
    pub(super) fn write_sb_durable(&self, state: &mut LogState) -> Result<()> {
        self.write_sb_as(state, true)
    }

    fn write_sb_as(&self, state: &mut LogState, durable: bool) -> Result<()> {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        state.sb.write(&mut b);
        let off = self.geom.offset_of(self.sb_block)?;
        let written = if durable {
            self.geom.dev.write_durable(off, &b)
        } else {
            self.geom.dev.write_at(off, &b)
        };
        written.map_err(|e| io_abort(state, e))?;
        let mut stats = self.stats.lock();
        stats.journal_bytes += self.geom.received(&[(off, &b)]);
        stats.durable_writes += u64::from(durable);
        Ok(())
    }

    /// Whole-state consistency check, run after each commit in debug builds.
    #[cfg(debug_assertions)]
    pub(super) fn check_invariants(&self, state: &LogState) {
        // The held transaction follows the live ones in the log.
        let held = state.held.as_ref().map(|h| &h.done.live);
        let all: Vec<&LiveTxn> = state.live.iter().chain(held).collect();
        let used: u32 = all.iter().map(|t| t.len).sum();
        assert_eq!(used, self.used.load(Ordering::Acquire));
        assert!(used <= self.capacity());
        for pair in all.iter().zip(all.iter().skip(1)) {
            assert_eq!(pair.0.tid.wrapping_add(1), pair.1.tid);
            let (b, off) = pair.0.end;
            let next_boundary = if off == 0 { b } else { self.advance(b, 1) };
            assert!(
                (pair.1.start == next_boundary && pair.1.start_off == 0)
                    || (pair.1.start == b && pair.1.start_off == off && pair.1.len == 0),
                "transaction {} does not follow {}",
                pair.1.tid,
                pair.0.tid
            );
        }
        assert_eq!(
            state.sb.feature_incompat & INCOMPAT_TIDEFS_ONLY,
            live_guard(&state.live, state.held.as_ref())
        );
        if let Some(last) = all.last() {
            let front = all.first().map_or(last.tid, |t| t.tid);
            // Pending copies and logged blocks come from durable transactions only.
            let durable = state.live.back().map_or(front.wrapping_sub(1), |t| t.tid);
            assert_eq!(last.end, (state.head, state.head_off));
            assert_eq!(
                last.tid.wrapping_add(1),
                self.next_tid.load(Ordering::Acquire)
            );
            assert_eq!(
                all.first().map(|t| (t.start, t.tid)),
                Some((state.sb.start_block, state.sb.sequence))
            );
            for p in self.pending.read().values() {
                assert!(tid_geq(p.tid, front) && tid_geq(durable, p.tid));
            }
            for t in self.logged.lock().values() {
                assert!(tid_geq(*t, front) && tid_geq(durable, *t));
            }
        } else {
            assert_eq!(state.head_off, 0);
            assert!(self.logged.lock().is_empty());
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

    /// The home device is the journal device (an internal journal).
    fn internal(&self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.home), Arc::as_ptr(&self.geom.dev))
    }

    /// Flushes the journal device, counted.
    pub(super) fn flush_journal_dev(&self) -> std::io::Result<()> {
        self.stats.lock().journal_flushes += 1;
        self.geom.dev.flush()
    }

    /// Flushes the home device, counted (as a journal flush when it is the same device).
    pub(super) fn flush_home_dev(&self) -> std::io::Result<()> {
        if self.internal() {
            return self.flush_journal_dev();
        }
        self.stats.lock().home_flushes += 1;
        self.home.flush()
    }

    /// Flushes the home device and, when it is another device, the journal device: one flush
    /// for an internal journal.
    fn flush_both(&self, state: &mut LogState) -> Result<()> {
        self.flush_home_dev().map_err(|e| io_abort(state, e))?;
        if !self.internal() {
            self.flush_journal_dev().map_err(|e| io_abort(state, e))?;
        }
        Ok(())
    }

    /// Writes a commit's home data to the home device (not yet durable).
    fn write_home_data(&self, home_data: &[(u64, Arc<[u8]>)]) -> std::io::Result<()> {
        if home_data.is_empty() {
            return Ok(());
        }
        let pieces: Vec<(u64, &[u8])> = home_data.iter().map(|(at, b)| (*at, &b[..])).collect();
        self.home.write_blocks(&pieces)
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

    /// Writes one transaction and returns its tid once durable.
    ///
    /// The records: every block of `req.blocks` whole; each [`RangeUpdate`] as a byte-range record
    /// when that is small (its entry, header and range list included, below half a block), else
    /// whole; a home block named twice, or also revoked, is logged whole; revokes of blocks not
    /// logged. A transaction of range records and revokes that fits in one journal block is written
    /// as a compact commit; any other in the block layout.
    ///
    /// Block layout order: (if the log was empty, the journal superblock with
    /// `s_start`/`s_sequence`), descriptor block(s) with tags and escaped copies, the block
    /// copies, range blocks, revoke block(s), then one flush of `home` and the journal device
    /// (the ordering point that makes the body, and ordered-mode data already written home,
    /// durable before the commit record), then the commit block as a durable write. An internal
    /// journal thus costs a flush before the commit block and one after it.
    ///
    /// Unfenced block layout (a tidefs extension): when `JournalOptions::fenced_commits` is off,
    /// the journal writes checksum v3 records, the request carries no data that must be durable
    /// before the commit record (`data_written_home` false, and `home_data` empty or
    /// `home_data_unordered`) and the transaction is not a compact commit, the body, the home
    /// data and the commit block (marked `FLAG_UNFENCED`) go out in one batch followed by one
    /// flush. Every block of the body carries its own checksum under v3, so a crash that keeps
    /// the commit block but not all of the body is seen by recovery as a torn transaction (the
    /// end of the log), not a committed one. Like an extension record, it sets
    /// `INCOMPAT_TIDEFS_UNFENCED` durably first, so the kernel, e2fsck and tidefs builds that
    /// predate unfenced commits refuse the log (rather than replay a torn one) until it is
    /// checkpointed.
    ///
    /// Compact commit: the home device is flushed first only when `req.data_written_home`;
    /// then the record is written as one durable write (its checksum covers all of it, so no
    /// flush is needed before it). When it is the first extension record since the log was
    /// last empty of them, the superblock with the `INCOMPAT_TIDEFS_EXT` bit is made durable
    /// before it.
    ///
    /// If the log lacks room, waits for a checkpoint (running one itself if none is running);
    /// that is the only time a commit waits for checkpoint I/O, besides one batch of home
    /// writes when it revokes a block a checkpoint may be writing. A block both logged and
    /// revoked in one request is logged, not revoked (the kernel cancels such revokes). Empty
    /// requests still commit.
    pub fn commit(&self, req: CommitRequest) -> Result<Tid> {
        self.commit_holding(req, false).map(|(tid, _)| tid)
    }

    /// [`JournalCore::commit`], except that with `may_hold` a fenced block-layout transaction
    /// (ordered data went home for it) returns once its body and data are durable, with its
    /// commit block held in memory instead of written (the `bool` is then true): the next
    /// commit writes that block in its first batch, ahead of its own body, and its first flush
    /// makes both durable, so a stream of commits costs one flush each instead of two; or
    /// [`JournalCore::finish_held`] writes it alone. Until then the held transaction is not
    /// durable: it is not in `pending`, `is_logged` or `held_in` (its caller keeps its blocks),
    /// a checkpoint leaves it alone, and the log tail never moves past it. Any commit that
    /// cannot carry the held block (a compact commit, one that must first make an incompat
    /// bit durable, one that waits for room) writes it first, as a durable write of its own.
    /// A crash before the held block is durable leaves the held transaction without its
    /// commit block: recovery stops at it, as the kernel's would.
    pub fn commit_holding(&self, mut req: CommitRequest, may_hold: bool) -> Result<(Tid, bool)> {
        let _gate = self.commit_gate.lock();
        let bs = usize::try_from(self.geom.block_size).unwrap_or(usize::MAX);
        let home_data = std::mem::take(&mut req.home_data);
        let data_written_home = req.data_written_home || !home_data.is_empty();
        let ordered_data =
            req.data_written_home || !(home_data.is_empty() || req.home_data_unordered);
        let (records, revoked) = self.records_of(req, bs)?;
        let ext = records.iter().any(Record::is_extension);
        let home_blocks = self.home.len_bytes() / u64::from(self.geom.block_size);
        let sector = usize::try_from(self.geom.dev.sector_size()).unwrap_or(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let now = (now.as_secs(), now.subsec_nanos());
        let tid = self.next_tid.load(Ordering::Acquire);
        let mut state = self.log.lock();
        // Bounded: with `commit_gate` held no other commit adds to the log, and a checkpoint
        // started after any running one retires every live transaction.
        let mut attempts = 0;
        let (compact, start, start_off, needed) = loop {
            self.check_writable(&state)?;
            if !state.features_ready && state.live.is_empty() {
                self.enable_features(&mut state)?;
            }
            let bits64 = state.layout.format.bits64;
            for r in &records {
                let h = r.home();
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
            let compact = state.layout.compact(tid, &records, sector, now);
            // A fresh block: the head's, or the next one when the head block is partly used.
            let boundary = if state.head_off == 0 {
                state.head
            } else {
                self.advance(state.head, 1)
            };
            let (start, start_off, needed) = match &compact {
                Some(c)
                    if state.head_off > 0
                        && !state.live.is_empty()
                        && state.head_off as usize + c.len() <= bs =>
                {
                    (state.head, state.head_off, 0)
                }
                Some(_) => (boundary, 0, 1),
                None => (
                    boundary,
                    0,
                    u32::try_from(state.layout.blocks_needed(&records)).unwrap_or(u32::MAX),
                ),
            };
            if needed > self.capacity() {
                return Err(FsError::Invalid("transaction larger than the journal"));
            }
            if needed <= self.capacity() - self.used.load(Ordering::Acquire) {
                break (compact, start, start_off, needed);
            }
            attempts += 1;
            if attempts > 2 {
                return Err(FsError::Invalid(
                    "the journal is still full after a checkpoint",
                ));
            }
            // A checkpoint retires only durable transactions.
            self.finish_held_locked(&mut state)?;
            drop(state);
            self.stats.lock().commits_waited_for_checkpoint += 1;
            self.checkpoint()?;
            state = self.log.lock();
        };
        let unfenced = compact.is_none()
            && !ordered_data
            && !self.opts.fenced_commits
            && state.layout.format.csum == CsumVersion::V3;
        let guard = if ext || compact.is_some() {
            INCOMPAT_TIDEFS_EXT
        } else {
            0
        } | if unfenced {
            INCOMPAT_TIDEFS_UNFENCED
        } else {
            0
        };
        let set_bit = guard & !state.sb.feature_incompat != 0;
        let carry = compact.is_none() && !set_bit;
        if !carry {
            self.finish_held_locked(&mut state)?;
        }
        let log_empty = state.live.is_empty() && state.held.is_none();
        if log_empty {
            state.sb.start_block = start;
            state.sb.sequence = tid;
        }
        if set_bit {
            // Durable before the first extension record: a crash never leaves one in a log
            // the kernel or e2fsck would replay.
            state.sb.feature_incompat |= guard;
            self.write_sb_durable(&mut state)?;
        } else if log_empty {
            self.write_sb(&mut state)?;
        }
        let (written, end, unwritten) = match &compact {
            Some(rec) => {
                self.write_home_data(&home_data)
                    .map_err(|e| io_abort(&mut state, e))?;
                if data_written_home {
                    self.flush_home_dev().map_err(|e| io_abort(&mut state, e))?;
                }
                let off = self.geom.offset_of(start)? + u64::from(start_off);
                if let Err(e) = self.geom.dev.write_durable(off, rec) {
                    return Err(io_abort(&mut state, e));
                }
                let end_off = start_off + u32::try_from(rec.len()).unwrap_or(u32::MAX);
                let end = if end_off as usize >= bs {
                    (self.advance(start, 1), 0)
                } else {
                    (start, end_off)
                };
                (self.geom.received(&[(off, &rec[..])]), end, None)
            }
            None => {
                let carried = state.held.take();
                let txn = TxnWrite {
                    tid,
                    records: &records,
                    home_data: &home_data,
                    start,
                    commit_time: now,
                    unfenced,
                    carried: carried.as_ref().map(|h| (h.at, &h.block[..])),
                };
                let (n, unwritten) = self.write_block_layout(&mut state, &txn)?;
                if let Some(h) = carried {
                    // Its commit block went out in the batch just flushed.
                    self.made_durable(&mut state, h.done);
                }
                (n, (self.advance(start, needed), 0), unwritten)
            }
        };
        // The log's space and the head are this transaction's from now on, durable or held.
        (state.head, state.head_off) = end;
        self.used.fetch_add(needed, Ordering::AcqRel);
        self.next_tid.store(tid.wrapping_add(1), Ordering::Release);
        let done = DurableTxn {
            live: LiveTxn {
                tid,
                start,
                start_off,
                len: needed,
                guard,
                end,
            },
            records,
            revoked,
            written,
            compact: compact.is_some(),
            // A compact record is one durable write; a fenced commit block gets one below if
            // it is not held (`finish_held_locked`); an unfenced one rode on the flush.
            durable_write: compact.is_some(),
        };
        match unwritten {
            Some((at, block)) => {
                state.held = Some(HeldCommit { at, block, done });
                if !may_hold {
                    self.finish_held_locked(&mut state)?;
                }
            }
            None => self.made_durable(&mut state, done),
        }
        let is_held = state.held.is_some();
        #[cfg(debug_assertions)]
        self.check_invariants(&state);
        drop(state);
        self.request_background_checkpoint();
        Ok((tid, is_held))
    }

    /// Writes the held commit block (if any) as a durable write of its own: its transaction
    /// is then durable. Returns its tid. For a caller whose commit returned with its block
    /// held and that no later commit carried.
    pub fn finish_held(&self) -> Result<Option<Tid>> {
        let _gate = self.commit_gate.lock();
        let mut state = self.log.lock();
        let tid = self.finish_held_locked(&mut state)?;
        #[cfg(debug_assertions)]
        self.check_invariants(&state);
        drop(state);
        self.request_background_checkpoint();
        Ok(tid)
    }

    /// [`JournalCore::finish_held`] with `commit_gate` and `log` held.
    fn finish_held_locked(&self, state: &mut LogState) -> Result<Option<Tid>> {
        let Some(mut h) = state.held.take() else {
            return Ok(None);
        };
        self.check_writable(state)?;
        if let Err(e) = self.geom.dev.write_durable(h.at, &h.block) {
            return Err(io_abort(state, e));
        }
        h.done.written += self.geom.received(&[(h.at, &h.block[..])]);
        h.done.durable_write = true;
        let tid = h.done.live.tid;
        self.made_durable(state, h.done);
        Ok(Some(tid))
    }

    /// A transaction's commit block is durable: it joins the live transactions, its blocks
    /// become pending checkpoint (and its revokes take effect), and it is counted.
    fn made_durable(&self, state: &mut LogState, done: DurableTxn) {
        let DurableTxn {
            live,
            records,
            revoked,
            written,
            compact,
            durable_write,
        } = done;
        let tid = live.tid;
        state.live.push_back(live);
        let mut revoked_pending = false;
        {
            let mut pending = self.pending.write();
            for h in &revoked {
                revoked_pending |= pending.remove(h).is_some();
            }
            for r in &records {
                if let Record::FullBlock { home, data } | Record::Range { home, data, .. } = r {
                    pending.insert(
                        *home,
                        PendingCopy {
                            tid,
                            data: Arc::clone(data),
                        },
                    );
                }
            }
        }
        {
            let mut logged = self.logged.lock();
            for h in &revoked {
                logged.remove(h);
            }
            for r in &records {
                if !matches!(r, Record::Revoke { .. }) {
                    logged.insert(r.home(), tid);
                }
            }
        }
        if revoked_pending {
            // A checkpoint batch that started before the revoke may be writing the old copy;
            // the block may be reused as soon as we return, so let that write finish first.
            // Later batches see the block gone from `pending` and skip it.
            drop(self.cp_batch.lock());
        }
        let mut stats = self.stats.lock();
        stats.commits += 1;
        // An unfenced commit ends with a flush, and a carried commit block rides on the next
        // commit's flush, not a durable write.
        stats.durable_writes += u64::from(durable_write);
        stats.journal_bytes += written;
        stats.compact_commits += u64::from(compact);
        for r in &records {
            match r {
                Record::FullBlock { .. } => stats.blocks_logged += 1,
                Record::Range { ranges, .. } => {
                    stats.range_records += 1;
                    stats.range_bytes += ranges.iter().map(|r| u64::from(r.1)).sum::<u64>();
                }
                Record::Revoke { .. } => {}
            }
        }
    }

    /// Writes a transaction in the block layout at `txn.start`: the body and the home data
    /// (together: one batch when the journal is internal, side by side when it has its own
    /// device; after `txn.carried`, the commit block of the transaction before), and a flush of
    /// both devices. Returns the bytes the journal device received, and the commit block with
    /// its device offset, not yet written (the caller holds it or writes it durably with
    /// `finish_held_locked`); an unfenced transaction puts its commit block into the batch
    /// and ends with the flush instead, and returns none.
    fn write_block_layout(
        &self,
        state: &mut LogState,
        txn: &TxnWrite<'_>,
    ) -> Result<(u64, Option<UnwrittenCommit>)> {
        let TxnWrite {
            tid,
            records,
            home_data,
            start,
            commit_time,
            unfenced,
            carried,
        } = *txn;
        let txn = state.layout.serialize(tid, records, commit_time, unfenced);
        let mut positioned: Vec<(u64, &[u8])> = Vec::with_capacity(txn.body.len() + 2);
        positioned.extend(carried);
        for (i, b) in txn.body.iter().enumerate() {
            let at = self
                .geom
                .offset_of(self.advance(start, u32::try_from(i).unwrap_or(0)));
            positioned.push((at.map_err(|e| io_abort(state, e))?, &b[..]));
        }
        let body_len = u32::try_from(txn.body.len()).unwrap_or(u32::MAX);
        let commit_off = self.geom.offset_of(self.advance(start, body_len))?;
        if unfenced {
            positioned.push((commit_off, &txn.commit[..]));
        }
        let body_bytes = self.geom.received(&positioned);
        let written = if home_data.is_empty() {
            self.geom.dev.write_blocks(&positioned)
        } else if self.internal() {
            let mut all = positioned;
            all.extend(home_data.iter().map(|(at, b)| (*at, &b[..])));
            all.sort_unstable_by_key(|p| p.0);
            self.geom.dev.write_blocks(&all)
        } else {
            std::thread::scope(|scope| {
                let data = scope.spawn(|| self.write_home_data(home_data));
                let body = self.geom.dev.write_blocks(&positioned);
                let data = data
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("home writer panicked")));
                body.and(data)
            })
        };
        if let Err(e) = written {
            return Err(io_abort(state, e));
        }
        if unfenced && home_data.is_empty() {
            // Only the log was written: an external journal's home device has nothing to flush.
            self.flush_journal_dev().map_err(|e| io_abort(state, e))?;
        } else {
            self.flush_both(state)?;
        }
        if unfenced {
            return Ok((body_bytes, None));
        }
        Ok((body_bytes, Some((commit_off, txn.commit))))
    }

    /// The records of a request (see [`JournalCore::commit`]) and its revokes, sorted, without
    /// the blocks it also logs. Checks block lengths and range lists.
    fn records_of(&self, req: CommitRequest, bs: usize) -> Result<(Vec<Record>, Vec<u64>)> {
        // Newest content per home block, in first-seen order, and the ranges of those that
        // appear once, as a range update small enough to log as ranges.
        // A request with range updates comes from a mode that accepts extension records.
        let extensions_allowed = !req.ranges.is_empty();
        let mut order: Vec<u64> = Vec::with_capacity(req.blocks.len() + req.ranges.len());
        let mut content: HashMap<u64, Arc<[u8]>> = HashMap::with_capacity(order.capacity());
        let mut ranged: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
        for (home, data) in req.blocks {
            if data.len() != bs {
                return Err(FsError::Invalid(
                    "commit block content is not one block long",
                ));
            }
            if content.insert(home, data).is_none() {
                order.push(home);
            }
            ranged.remove(&home);
        }
        let revoking: std::collections::HashSet<u64> = req.revoked.iter().copied().collect();
        for r in req.ranges {
            if r.data.len() != bs {
                return Err(FsError::Invalid(
                    "commit block content is not one block long",
                ));
            }
            check_ranges(&r.ranges, bs)?;
            #[cfg(debug_assertions)]
            if !revoking.contains(&r.home) {
                self.check_range_update(&r);
            }
            if r.ranges.is_empty() && !content.contains_key(&r.home) {
                // Nothing changed since the previous committed version.
                continue;
            }
            if content.insert(r.home, r.data).is_none() {
                order.push(r.home);
                if range_entry_len(&r.ranges) < bs / 2 && !revoking.contains(&r.home) {
                    ranged.insert(r.home, r.ranges);
                }
            } else {
                ranged.remove(&r.home);
            }
        }
        let mut revoked: Vec<u64> = req
            .revoked
            .into_iter()
            .filter(|h| !content.contains_key(h))
            .collect();
        revoked.sort_unstable();
        revoked.dedup();
        let mut records: Vec<Record> = order
            .iter()
            .map(|h| {
                let data = Arc::clone(&content[h]);
                match ranged.remove(h) {
                    Some(ranges) => Record::Range {
                        home: *h,
                        data,
                        ranges,
                        zero_rest: false,
                    },
                    None => {
                        // A block mostly of zeros (a new block with little written to it, as an
                        // append makes) goes as its non-zero bytes over a zero block, when the
                        // caller allows extension records at all.
                        let nonzero = if extensions_allowed {
                            nonzero_ranges(&data)
                        } else {
                            Vec::new()
                        };
                        if extensions_allowed && range_entry_len(&nonzero) < bs / 2 {
                            Record::Range {
                                home: *h,
                                data,
                                ranges: nonzero,
                                zero_rest: true,
                            }
                        } else {
                            Record::FullBlock { home: *h, data }
                        }
                    }
                }
            })
            .collect();
        records.extend(revoked.iter().map(|&home| Record::Revoke { home }));
        Ok((records, revoked))
    }

    /// Debug check of the caller's contract for a range update: when the previous committed
    /// version is still known (the held transaction's, else the pending one), `data` differs
    /// from it only inside `ranges`.
    #[cfg(debug_assertions)]
    fn check_range_update(&self, r: &RangeUpdate) {
        let held = self.log.lock().held.as_ref().and_then(|h| {
            h.done.records.iter().find_map(|rec| match rec {
                Record::FullBlock { home, data } | Record::Range { home, data, .. }
                    if *home == r.home =>
                {
                    Some(Arc::clone(data))
                }
                _ => None,
            })
        });
        let Some(prev) = held.or_else(|| self.pending(r.home)) else {
            return;
        };
        let mut at = 0usize;
        for &(off, len) in r
            .ranges
            .iter()
            .chain(std::iter::once(&(self.geom.block_size, 0)))
        {
            let off = off as usize;
            debug_assert!(
                prev[at..off] == r.data[at..off],
                "range update of block {} changes bytes outside its ranges (in {at}..{off})",
                r.home
            );
            at = off + len as usize;
        }
    }

    /// True when a live transaction holds a record (full or byte range) of `home_block` that
    /// no later live transaction revoked (see [`super::CommitLog::is_logged`]).
    pub fn is_logged(&self, home_block: u64) -> bool {
        self.logged.lock().contains_key(&home_block)
    }

    /// The blocks of `first..first + len` with a committed copy not yet home or logged by a
    /// live transaction, sorted (see `CommitLog::held_in`).
    pub fn held_in(&self, first: u64, len: u64) -> Vec<u64> {
        let mut v = {
            let pending = self.pending.read();
            crate::cache::blocks_held_in(first, len, pending.len(), pending.keys().copied(), |b| {
                pending.contains_key(&b)
            })
        };
        let logged = self.logged.lock();
        v.extend(crate::cache::blocks_held_in(
            first,
            len,
            logged.len(),
            logged.keys().copied(),
            |b| logged.contains_key(&b),
        ));
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Newest committed copy of a home block that checkpoint has not yet written home.
    pub fn pending(&self, home_block: u64) -> Option<Arc<[u8]>> {
        self.pending
            .read()
            .get(&home_block)
            .map(|p| Arc::clone(&p.data))
    }

    /// Retires every transaction committed when it starts: writes the newest committed copy
    /// of each of their blocks home in sorted batches (merged into large writes), flushes
    /// home, then moves the log tail past them with one durable superblock write (`s_start` =
    /// the oldest transaction still live, or 0 and `s_sequence` = next tid when none is).
    /// Commits run meanwhile: `log` is held only to take the snapshot and for the final
    /// superblock write. Waits for a checkpoint already running.
    pub fn checkpoint(&self) -> Result<()> {
        let _one = self.checkpoint_gate.lock();
        let (last, homes) = {
            let state = self.log.lock();
            if self.opts.read_only || state.aborted {
                return Err(FsError::ReadOnly);
            }
            if self.needs_recovery() {
                return Err(FsError::Invalid(
                    "journal needs recovery before a checkpoint",
                ));
            }
            let Some(last) = state.live.back().map(|t| t.tid) else {
                debug_assert!(self.pending.read().is_empty());
                return Ok(());
            };
            // Under `log`, `pending` holds exactly the blocks of the live transactions.
            let mut homes: Vec<u64> = self.pending.read().keys().copied().collect();
            homes.sort_unstable();
            (last, homes)
        };
        let bs = u64::from(self.geom.block_size);
        let mut written = 0u64;
        for chunk in homes.chunks(CHECKPOINT_BATCH_BLOCKS) {
            let batch = self.cp_batch.lock();
            // The newest copy now (a commit since the snapshot may have logged a newer one),
            // and nothing for a block revoked since.
            let copies: Vec<(u64, Arc<[u8]>)> = {
                let pending = self.pending.read();
                chunk
                    .iter()
                    .filter_map(|h| pending.get(h).map(|p| (*h, Arc::clone(&p.data))))
                    .collect()
            };
            let pieces: Vec<(u64, &[u8])> = copies.iter().map(|(h, d)| (h * bs, &d[..])).collect();
            let result = self.home.write_blocks(&pieces);
            // Released before `abort_io` takes `log`: a commit may hold `log` waiting for it.
            drop(batch);
            if let Err(e) = result {
                return Err(self.abort_io(e));
            }
            written += copies.len() as u64;
        }
        if let Err(e) = self.flush_home_dev() {
            return Err(self.abort_io(e));
        }
        // Home is durable: move the tail past the retired transactions.
        let mut state = self.log.lock();
        if state.aborted {
            return Err(FsError::ReadOnly);
        }
        let freed = self.retire(&mut state, last);
        // Durable before the space is reused: a crash must never find `s_start` pointing at
        // blocks a newer transaction has overwritten.
        self.write_sb_durable(&mut state)?;
        self.used.fetch_sub(freed, Ordering::AcqRel);
        self.pending.write().retain(|_, p| !tid_geq(last, p.tid));
        match state.live.front().map(|t| t.tid) {
            Some(front) => self.logged.lock().retain(|_, t| tid_geq(*t, front)),
            None => self.logged.lock().clear(),
        }
        #[cfg(debug_assertions)]
        self.check_invariants(&state);
        drop(state);
        let mut stats = self.stats.lock();
        stats.checkpoints += 1;
        stats.home_bytes_checkpointed += written * bs;
        Ok(())
    }

    /// Drops the live transactions up to `last` (all written home) from the live list, except
    /// those that share the block where the oldest remaining transaction starts (the tail is a
    /// block, so they stay replayable), and sets the in-memory superblock's tail and extension
    /// bit to match (not written). Returns the blocks freed.
    pub(super) fn retire(&self, state: &mut LogState, last: Tid) -> u32 {
        let tail_block = state
            .live
            .iter()
            .find(|t| !tid_geq(last, t.tid))
            .map(|t| t.start);
        let mut freed = 0u32;
        while let Some(front) = state.live.front().copied() {
            if !tid_geq(last, front.tid) || Some(front.start) == tail_block {
                break;
            }
            freed += front.len;
            state.live.pop_front();
        }
        let front = state
            .live
            .front()
            .or(state.held.as_ref().map(|h| &h.done.live))
            .copied();
        match front {
            Some(front) => {
                // The held transaction's body is on disk and its commit block may follow:
                // the tail stays at it.
                state.sb.start_block = front.start;
                state.sb.sequence = front.tid;
            }
            None => {
                // The head stays where it is: the next transaction continues the circular
                // log (and wraps at s_maxlen), as kernels since 6.4 do; but at a fresh block,
                // so that the new tail never names a block holding retired transactions.
                state.sb.start_block = 0;
                state.sb.sequence = self.next_tid.load(Ordering::Acquire);
                if state.head_off != 0 {
                    state.head = self.advance(state.head, 1);
                    state.head_off = 0;
                }
            }
        }
        state.sb.feature_incompat = state.sb.feature_incompat & !INCOMPAT_TIDEFS_ONLY
            | live_guard(&state.live, state.held.as_ref());
        freed
    }

    /// Marks the journal aborted after an I/O error met without `log` held.
    fn abort_io(&self, e: impl Into<FsError>) -> FsError {
        self.log.lock().aborted = true;
        e.into()
    }

    /// Stops (`true`) or allows background checkpoints. Held, the log is checkpointed only
    /// when a commit finds it full, by `checkpoint` and by `close`: for the recovery
    /// benchmark, which needs a log full of transactions at its crash.
    pub fn hold_checkpoints(&self, hold: bool) {
        self.hold_checkpoints.store(hold, Ordering::Release);
    }

    /// Wakes the background checkpointer (starting it the first time) once the log is half
    /// full, so that space is reclaimed before a commit has to wait for it.
    fn request_background_checkpoint(&self) {
        if self.opts.read_only
            || self.hold_checkpoints.load(Ordering::Acquire)
            || self.used.load(Ordering::Acquire) <= self.capacity() / 2
        {
            return;
        }
        let mut w = self.worker.lock();
        if w.stop {
            return;
        }
        w.requested = true;
        if w.handle.is_none() {
            let Some(core) = self.me.upgrade() else {
                return;
            };
            match std::thread::Builder::new()
                .name("tidefs-checkpoint".into())
                .spawn(move || core.background_loop())
            {
                Ok(h) => w.handle = Some(h),
                Err(e) => log::warn!("no background checkpointer: {e}"),
            }
        }
        drop(w);
        self.worker_wake.notify_all();
    }

    /// The background checkpointer: one checkpoint per request, until the journal is dropped
    /// or a checkpoint fails (which aborts the journal; the next commit reports it).
    fn background_loop(&self) {
        loop {
            {
                let mut w = self.worker.lock();
                while !w.requested && !w.stop {
                    self.worker_wake.wait(&mut w);
                }
                if w.stop {
                    return;
                }
                w.requested = false;
            }
            if self.hold_checkpoints.load(Ordering::Acquire)
                || self.used.load(Ordering::Acquire) <= self.capacity() / 2
            {
                continue;
            }
            if let Err(e) = self.checkpoint() {
                log::error!("background checkpoint failed, the journal is aborted: {e}");
                return;
            }
        }
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

    /// Revoke records one revoke block holds, for the widest record format (so the answer
    /// never depends on features enabled later).
    pub fn revokes_per_block(&self) -> usize {
        let bs = usize::try_from(self.geom.block_size).unwrap_or(usize::MAX);
        let widest = TagFormat {
            csum: crate::format::jbd2::CsumVersion::V3,
            bits64: true,
        };
        crate::format::jbd2::revoke::RevokeBlock::records_per_block(widest, bs).max(1)
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
        let _gate = self.commit_gate.lock();
        if self.opts.read_only || self.needs_recovery() {
            return Ok(());
        }
        {
            let mut state = self.log.lock();
            if state.aborted {
                return Err(FsError::ReadOnly);
            }
            self.finish_held_locked(&mut state)?;
        }
        // No commit can run (`commit_gate`), so this retires every live transaction.
        self.checkpoint()?;
        let mut state = self.log.lock();
        debug_assert!(state.live.is_empty());
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
        self.flush_journal_dev().map_err(FsError::Io)
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
        self.flush_journal_dev()
            .map_err(|e| io_abort(&mut state, e))
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
