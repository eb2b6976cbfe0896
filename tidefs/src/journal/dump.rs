//! `dump`: a read-only listing of the journal's log, for `tidefs dump-journal` (like
//! `debugfs logdump`). It reads the log with recovery's own scan (`scan.rs`), so what it lists
//! is exactly what recovery would replay, and never writes.
//!
//! Where the journal is: [`dump_image`] finds an image's internal journal from the copy of the
//! journal inode's extent root that ext4 keeps in its superblock (`s_jnl_blocks`, set by
//! mke2fs and the kernel; a journal whose extent tree is deeper than the inode is refused with
//! a message), or opens its external journal device; [`dump_journal_device`] reads an external
//! journal device alone.

use std::path::Path;
use std::sync::Arc;

use super::log::{Journal, JournalCore, JournalExtent, JournalGeometry, JournalOptions, Tid};
use super::scan::{Item, TxnLayout};
use crate::dev::{BlockDevice, FileDev};
use crate::error::{FsError, Result};
use crate::format::ext4::extent::{parse_node, ExtentNode};
use crate::format::ext4::superblock::{compat, incompat, Superblock, SUPERBLOCK_SIZE};
use crate::format::jbd2::{incompat_name, INCOMPAT_TIDEFS_EXT, INCOMPAT_TIDEFS_UNFENCED};

/// The journal as `dump` found it.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct JournalDump {
    /// Journal block size.
    pub block_size: u32,
    /// `s_first`: first block of the log.
    pub first_block: u32,
    /// `s_maxlen`: blocks in the journal.
    pub len_blocks: u32,
    /// `s_start`: the tail (0 = empty log).
    pub start_block: u32,
    /// `s_sequence`: the tid expected at the tail.
    pub sequence: Tid,
    /// `s_errno`.
    pub errno: i32,
    /// Names of the incompat feature bits set.
    pub incompat: Vec<String>,
    /// The tidefs extension bit is set: the log may hold byte-range records or compact commits.
    pub extension_bit: bool,
    /// The tidefs unfenced bit is set: the log may hold unfenced transactions.
    pub unfenced_bit: bool,
    /// The committed transactions recovery would replay, in log order.
    pub transactions: Vec<DumpTxn>,
    /// Where the scan stopped: journal block.
    pub end_block: u32,
    /// Where the scan stopped: byte offset in `end_block`.
    pub end_offset: u32,
    /// The transaction whose commit record failed its checksum, ending the log.
    pub failed_commit: Option<Tid>,
    /// The transaction a crash tore, ending the log (not damage; FORMAT.md §5.7).
    pub torn: Option<Tid>,
    /// Logged copies whose tag checksum failed.
    pub corrupt_blocks: u64,
}

impl JournalDump {
    /// One of tidefs's own incompat bits is set, so the kernel and e2fsprogs refuse to replay
    /// the log: only tidefs can recover it.
    pub fn tidefs_only(&self) -> bool {
        self.extension_bit || self.unfenced_bit
    }
}

/// How a transaction is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum DumpLayout {
    /// Descriptor blocks, copies, range blocks, revoke blocks, commit block.
    Block,
    /// One compact commit.
    Compact,
}

/// One committed transaction.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DumpTxn {
    /// Transaction id.
    pub tid: Tid,
    /// Its layout.
    pub layout: DumpLayout,
    /// Journal block where it starts.
    pub block: u32,
    /// Byte offset in that block (non-zero only for compact commits sharing a block).
    pub offset: u32,
    /// Bytes it takes in the log.
    pub len_bytes: u64,
    /// Commit time, seconds since the epoch.
    pub commit_sec: u64,
    /// Commit time, nanoseconds.
    pub commit_nsec: u32,
    /// Written with its commit block before one flush (FORMAT.md §5.7).
    pub unfenced: bool,
    /// Its records of home blocks (full copies and byte ranges), in log order.
    pub tags: Vec<DumpTag>,
    /// Home blocks it revokes.
    pub revokes: Vec<u64>,
    /// Home blocks whose logged copy failed its tag checksum (not replayed).
    pub corrupt: Vec<u64>,
}

/// What a record logs of a home block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum TagKind {
    /// The whole block.
    Full,
    /// Byte ranges of it.
    Range,
}

/// A record of a home block.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DumpTag {
    /// Home block number.
    pub home: u64,
    /// Full block or byte ranges.
    pub kind: TagKind,
    /// Journal block of a full copy.
    pub position: Option<u32>,
    /// A full copy was escaped (it began with the jbd2 magic).
    pub escaped: bool,
    /// `(offset, length)` of each range of a range record.
    pub ranges: Vec<(u32, u32)>,
    /// A range record of a block that is zeros outside its ranges.
    pub zero_rest: bool,
}

impl JournalCore {
    /// Lists the log read-only (see the module documentation).
    pub fn dump(&self) -> Result<JournalDump> {
        let sb = self.log.lock().sb.clone();
        let scan = self.scan_log(&sb)?;
        let transactions = scan
            .txns
            .into_iter()
            .map(|t| {
                let mut tags = Vec::new();
                let mut revokes = Vec::new();
                for item in t.items {
                    match item {
                        Item::Full {
                            home,
                            position,
                            escaped,
                        } => tags.push(DumpTag {
                            home,
                            kind: TagKind::Full,
                            position: Some(position),
                            escaped,
                            ranges: Vec::new(),
                            zero_rest: false,
                        }),
                        Item::Range {
                            home,
                            ranges,
                            zero_rest,
                        } => tags.push(DumpTag {
                            home,
                            kind: TagKind::Range,
                            position: None,
                            escaped: false,
                            ranges: ranges
                                .iter()
                                .map(|(o, b)| (*o, u32::try_from(b.len()).unwrap_or(u32::MAX)))
                                .collect(),
                            zero_rest,
                        }),
                        Item::Revoke { home } => revokes.push(home),
                    }
                }
                DumpTxn {
                    tid: t.tid,
                    layout: match t.layout {
                        TxnLayout::Block => DumpLayout::Block,
                        TxnLayout::Compact => DumpLayout::Compact,
                    },
                    block: t.start.0,
                    offset: t.start.1,
                    len_bytes: t.len_bytes,
                    commit_sec: t.commit_time.0,
                    commit_nsec: t.commit_time.1,
                    unfenced: t.unfenced,
                    tags,
                    revokes,
                    corrupt: t.corrupt,
                }
            })
            .collect();
        Ok(JournalDump {
            block_size: sb.block_size,
            first_block: sb.first_log_block,
            len_blocks: sb.len_blocks,
            start_block: sb.start_block,
            sequence: sb.sequence,
            errno: sb.errno,
            incompat: (0..32)
                .map(|i| 1u32 << i)
                .filter(|b| sb.feature_incompat & b != 0)
                .map(incompat_name)
                .collect(),
            extension_bit: sb.feature_incompat & INCOMPAT_TIDEFS_EXT != 0,
            unfenced_bit: sb.feature_incompat & INCOMPAT_TIDEFS_UNFENCED != 0,
            transactions,
            end_block: scan.end.0,
            end_offset: scan.end.1,
            failed_commit: scan.failed_commit,
            torn: scan.torn,
            corrupt_blocks: scan.corrupt_blocks,
        })
    }
}

/// Lists the log of the journal at `geom`, read-only.
pub fn dump(geom: JournalGeometry) -> Result<JournalDump> {
    let dev = Arc::clone(&geom.dev);
    let opts = JournalOptions {
        read_only: true,
        ..JournalOptions::default()
    };
    Journal::open(geom, dev, opts)?.dump()
}

/// Lists the log of an external journal device (made by `mke2fs -O journal_dev`), read-only.
pub fn dump_journal_device(path: &Path) -> Result<JournalDump> {
    dump_image(path, None)
}

/// `s_jnl_blocks`: the copy of the journal inode's `i_block` (and size) in the superblock.
const S_JNL_BLOCKS: usize = 0x10C;
/// `s_jnl_backup_type`: 1 (`EXT3_JNL_BACKUP_BLOCKS`) when `s_jnl_blocks` holds that copy.
const S_JNL_BACKUP_TYPE: usize = 0xFD;
const JNL_BACKUP_BLOCKS: u8 = 1;
const I_BLOCK_LEN: usize = 60;

/// Lists the log of an image's journal, read-only: its internal journal, or the external one
/// at `journal_device`. An external journal device given as `image` is listed alone.
pub fn dump_image(image: &Path, journal_device: Option<&Path>) -> Result<JournalDump> {
    let opts = JournalOptions {
        read_only: true,
        ..JournalOptions::default()
    };
    open_image(image, journal_device, opts)?.dump()
}

/// Opens the journal of an image without mounting it ([`image_journal`]), for tools and tests
/// that read or drive the journal directly; home blocks go to the image. Read-write unless
/// `opts.read_only`. Nothing is replayed.
pub fn open_image(
    image: &Path,
    journal_device: Option<&Path>,
    opts: JournalOptions,
) -> Result<Journal> {
    let open = |p: &Path| -> Result<Arc<dyn BlockDevice>> {
        let dev = FileDev::open(p, opts.read_only).map_err(|e| {
            FsError::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", p.display()),
            ))
        })?;
        Ok(Arc::new(dev))
    };
    let dev = open(image)?;
    let jdev = journal_device.map(open).transpose()?;
    let geom = image_journal(dev.clone(), jdev).map_err(|e| match e {
        FsError::Corrupt(c) => FsError::corrupt(format!("{}: {}", image.display(), c.what)),
        other => other,
    })?;
    Journal::open(geom, dev, opts)
}

/// Where the journal of the image on `dev` is: its internal journal (from `s_jnl_blocks`, see
/// the module documentation), or the external one on `journal_dev`, checked against the file
/// system; `dev` itself when it is an external journal device. For tools and tests that read
/// or drive an image's journal without mounting it.
pub fn image_journal(
    dev: Arc<dyn BlockDevice>,
    journal_dev: Option<Arc<dyn BlockDevice>>,
) -> Result<JournalGeometry> {
    let mut raw = vec![0u8; SUPERBLOCK_SIZE];
    if dev.len_bytes() < 1024 + SUPERBLOCK_SIZE as u64 {
        return Err(FsError::corrupt("too small to hold an ext4 superblock"));
    }
    dev.read_at(1024, &mut raw)?;
    let sb = Superblock::parse(&raw).map_err(|e| FsError::corrupt(e.what))?;
    if sb.feature_incompat() & incompat::JOURNAL_DEV != 0 {
        return Ok(JournalGeometry::external_device(dev)?.0);
    }
    if !sb.has_compat(compat::HAS_JOURNAL) {
        return Err(FsError::Incompatible(
            "the file system has no journal (has_journal is off)".into(),
        ));
    }
    let bs = sb.block_size();
    if sb.journal_inum() == 0 {
        let Some(jdev) = journal_dev else {
            return Err(FsError::Invalid(
                "the image uses an external journal: pass --journal-device",
            ));
        };
        return JournalGeometry::external(jdev, bs, sb.uuid(), sb.journal_uuid());
    }
    if journal_dev.is_some() {
        return Err(FsError::Invalid(
            "the image has an internal journal; --journal-device does not apply",
        ));
    }
    if raw[S_JNL_BACKUP_TYPE] != JNL_BACKUP_BLOCKS {
        return Err(FsError::Incompatible(format!(
            "the superblock keeps no copy of the journal inode's blocks (s_jnl_backup_type {})",
            raw[S_JNL_BACKUP_TYPE]
        )));
    }
    let i_block = &raw[S_JNL_BLOCKS..S_JNL_BLOCKS + I_BLOCK_LEN];
    let extents = match parse_node(i_block)
        .map_err(|e| FsError::corrupt(format!("journal inode extent root: {e}")))?
    {
        ExtentNode::Leaf(exts) => exts,
        ExtentNode::Index { depth, .. } => {
            return Err(FsError::Incompatible(format!(
                "the journal's extent tree has depth {depth}; only journals mapped by at most \
                 4 extents are read without mounting"
            )))
        }
    };
    if extents.is_empty() {
        return Err(FsError::corrupt("the journal inode has no blocks"));
    }
    let dev_blocks = dev.len_bytes() / u64::from(bs);
    let mut runs = Vec::with_capacity(extents.len());
    for e in &extents {
        if e.physical.saturating_add(u64::from(e.len)) > dev_blocks {
            return Err(FsError::corrupt(format!(
                "journal extent at block {} runs past the end of the image",
                e.physical
            )));
        }
        runs.push(JournalExtent {
            logical_start: e.logical,
            device_block: e.physical,
            len: e.len,
        });
    }
    Ok(JournalGeometry::internal(dev, bs, runs))
}
