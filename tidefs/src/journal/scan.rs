//! The log scan: walks the log from its tail and returns the committed transactions with
//! every record they hold, in log order. Recovery replays from it and `dump` prints it, so
//! both read the log through this one piece of code.
//!
//! How the scan moves (docs/DESIGN.md §4.5, §4.5a; formats in docs/FORMAT.md §4, §5):
//! - it starts at block `s_start`, offset 0, expecting tid `s_sequence`;
//! - at a position, a compact commit of the expected tid (`format::jbd2::ext`) is a whole
//!   transaction: if it verifies, the scan continues right after it (the next sector offset in
//!   the same block, or the next block when it ends the block); if it does not (torn, zeroed,
//!   corrupt), the log ends there (`failed_commit`);
//! - at a block boundary, a descriptor, revoke, range or commit block of the expected tid
//!   starts a block-layout transaction, read block by block to its commit block, as the kernel
//!   reads it (fs/jbd2/recovery.c), plus tidefs's range blocks;
//! - at an offset inside a block where no compact commit of the expected tid starts, the scan
//!   tries the next block boundary; anything else there ends the log.
//!
//! What a failed checksum means (as the kernel): a logged copy whose tag checksum fails is left
//! out and counted (`corrupt_blocks`), the rest still replays; a commit record that fails ends
//! the log (whatever its body holds); a descriptor, revoke or range block that fails ends the
//! log quietly when no valid commit block of its transaction follows (a torn write), and is a
//! `Corrupt` error when one does.
//! Except for an *unfenced* transaction (commit block flag `FLAG_UNFENCED`, written with its
//! body before one flush): its commit block does not prove its body reached the disk, so any
//! failed block of it (a copy, a descriptor, revoke or range block) means it was torn, and the
//! log ends there, before it (`torn`) — unless the next transaction has begun right after it,
//! which it can only have done once this one's flush returned: then the failure is damage, and
//! the rules above apply. A commit block that fails its checksum with bytes other than zeros
//! after its header was torn too (`torn`): its first sector is new, a later one old. The failed
//! copies of a transaction that does not commit are not counted in `corrupt_blocks`.
//!
//! Invariants: the scan visits at most `s_maxlen - s_first` blocks, so a corrupt log can neither
//! loop nor read outside the log; everything read is validated before use; it never writes.

use super::log::{layout_for, JournalCore, Tid};
use crate::error::{FsError, Result};
use crate::format::jbd2::ext::{self, Entry};
use crate::format::jbd2::{
    block_tail_verify, commit, crc32_be, data_block_csum, BlockHeader, BlockType, CommitBlock,
    CsumVersion, DescriptorBlock, JournalSuperblock, RevokeBlock, CHKSUM_CRC32, COMPAT_CHECKSUM,
};

/// How a transaction is laid out in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TxnLayout {
    /// Descriptor blocks, copies, range blocks, revoke blocks, commit block.
    Block,
    /// One compact commit.
    Compact,
}

/// One record of a scanned transaction.
#[derive(Clone, Debug)]
pub(super) enum Item {
    /// A full copy of a home block, logged at journal block `position`.
    Full {
        home: u64,
        position: u32,
        escaped: bool,
    },
    /// New bytes of some ranges of a home block (of a zero block when `zero_rest`).
    Range {
        home: u64,
        ranges: Vec<(u32, Vec<u8>)>,
        zero_rest: bool,
    },
    /// A revoke.
    Revoke { home: u64 },
}

/// A transaction the scan found committed.
#[derive(Clone, Debug)]
pub(super) struct ScannedTxn {
    pub tid: Tid,
    pub layout: TxnLayout,
    /// Where it starts: journal block and byte offset in it.
    pub start: (u32, u32),
    /// Bytes it takes: blocks times block size, or the compact commit's length.
    pub len_bytes: u64,
    /// Commit time (seconds, nanoseconds).
    pub commit_time: (u64, u32),
    /// Its commit block carries the unfenced flag (FORMAT.md §5.7).
    pub unfenced: bool,
    /// Its records in log order, without the copies whose checksum failed.
    pub items: Vec<Item>,
    /// Home blocks of the copies whose tag checksum failed (not in `items`).
    pub corrupt: Vec<u64>,
}

/// The result of a scan.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Committed transactions, in log order.
    pub txns: Vec<ScannedTxn>,
    /// Logged copies whose tag checksum failed.
    pub corrupt_blocks: u64,
    /// The transaction whose commit record failed its checksum, ending the log.
    pub failed_commit: Option<Tid>,
    /// The transaction a crash tore (an unfenced body, or its commit block), ending the log: a
    /// normal outcome of a crash, not damage.
    pub torn: Option<Tid>,
    /// Where the scan stopped: block and byte offset.
    pub end: (u32, u32),
}

/// What reading one block-layout transaction gave.
enum BlockTxn {
    /// Committed: the transaction and the block after its commit block.
    Committed(ScannedTxn, u32),
    /// The log ends here (no commit block, or a commit block that failed).
    End,
}

impl JournalCore {
    /// Scans the log that `sb` describes from its tail. An empty log (`s_start = 0`) gives an
    /// empty scan.
    pub(super) fn scan_log(&self, sb: &JournalSuperblock) -> Result<Scan> {
        let mut out = Scan::default();
        if sb.start_block == 0 {
            return Ok(out);
        }
        let layout = layout_for(sb);
        let seed = layout.seed;
        let bs = layout.block_size;
        let budget = self.capacity();
        let mut visited: u32 = 0;
        let (mut block, mut off) = (sb.start_block, 0u32);
        let mut tid = sb.sequence;
        let mut buf = vec![0u8; bs];
        let mut loaded: Option<u32> = None;
        while visited < budget {
            if loaded != Some(block) {
                self.geom.read_block(block, &mut buf)?;
                loaded = Some(block);
            }
            let at = off as usize;
            match ext::parse_compact(&buf[at..], seed, tid, bs) {
                Ok(Some(c)) => {
                    let len = u32::try_from(c.len).unwrap_or(u32::MAX);
                    out.txns.push(ScannedTxn {
                        tid,
                        layout: TxnLayout::Compact,
                        start: (block, off),
                        len_bytes: u64::from(len),
                        commit_time: c.commit_time,
                        unfenced: false,
                        items: c.entries.into_iter().map(Item::from).collect(),
                        corrupt: Vec::new(),
                    });
                    tid = tid.wrapping_add(1);
                    off += len;
                    if off as usize >= bs {
                        block = self.advance(block, 1);
                        off = 0;
                        visited += 1;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    log::info!("journal scan ends at block {block} offset {off}: {e}");
                    out.failed_commit = Some(tid);
                    break;
                }
            }
            if off != 0 {
                // Nothing of ours after the last compact commit of this block: the next
                // transaction, if any, starts at the next block.
                block = self.advance(block, 1);
                off = 0;
                visited += 1;
                continue;
            }
            loaded = None;
            match self.scan_block_txn(sb, block, tid, &mut visited, &mut out)? {
                BlockTxn::Committed(txn, next) => {
                    out.txns.push(txn);
                    tid = tid.wrapping_add(1);
                    block = next;
                }
                BlockTxn::End => break,
            }
        }
        out.end = (block, off);
        Ok(out)
    }

    /// Reads the block-layout transaction `tid` starting at `first`, block by block, up to its
    /// commit block. `visited` counts the blocks read against the scan's budget.
    fn scan_block_txn(
        &self,
        sb: &JournalSuperblock,
        first: u32,
        tid: Tid,
        visited: &mut u32,
        out: &mut Scan,
    ) -> Result<BlockTxn> {
        let layout = layout_for(sb);
        let format = layout.format;
        let seed = layout.seed;
        let v1 = sb.feature_compat & COMPAT_CHECKSUM != 0 && !format.csum.has_tail();
        let bs = layout.block_size;
        let budget = self.capacity();
        let mut cur = ScannedTxn {
            tid,
            layout: TxnLayout::Block,
            start: (first, 0),
            len_bytes: 0,
            commit_time: (0, 0),
            unfenced: false,
            items: Vec::new(),
            corrupt: Vec::new(),
        };
        // The first descriptor, revoke or range block of `cur` whose checksum failed, if any.
        let mut cur_bad: Option<String> = None;
        let mut v1_sum = !0u32;
        let mut block = first;
        let mut blocks: u64 = 0;
        let mut buf = vec![0u8; bs];
        let mut data = vec![0u8; bs];
        while *visited < budget {
            let position = block;
            self.geom.read_block(block, &mut buf)?;
            block = self.advance(block, 1);
            *visited += 1;
            blocks += 1;
            if ext::has_header(&buf, ext::BLOCKTYPE_RANGES, tid) {
                match ext::parse_ranges_block(&buf, seed, tid) {
                    Ok(entries) => cur.items.extend(entries.into_iter().map(Item::from)),
                    Err(e) => {
                        cur_bad.get_or_insert(format!("range block {position}: {e}"));
                    }
                }
                continue;
            }
            let Ok(header) = BlockHeader::parse(&buf) else {
                return Ok(BlockTxn::End);
            };
            if header.sequence != tid {
                return Ok(BlockTxn::End);
            }
            match header.block_type {
                BlockType::Descriptor => {
                    let tail_ok = !format.csum.has_tail()
                        || block_tail_verify(seed, &buf, "descriptor").is_ok();
                    let Ok(desc) = DescriptorBlock::parse(&buf, format) else {
                        return Ok(BlockTxn::End);
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
                        return Ok(BlockTxn::End);
                    }
                    for tag in &desc.tags {
                        let position = block;
                        block = self.advance(block, 1);
                        *visited += 1;
                        blocks += 1;
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
                            cur.corrupt.push(tag.home_block);
                            continue;
                        }
                        cur.items.push(Item::Full {
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
                        Ok(r) if tail_ok => cur
                            .items
                            .extend(r.blocks.into_iter().map(|home| Item::Revoke { home })),
                        _ => {
                            cur_bad.get_or_insert(format!(
                                "revoke block {position} fails its checksum or does not parse"
                            ));
                        }
                    }
                }
                BlockType::Commit => {
                    let Ok(c) = CommitBlock::parse(&buf) else {
                        return Ok(BlockTxn::End);
                    };
                    let commit_ok = !format.csum.has_tail() || commit::verify_csum_v2v3(seed, &buf);
                    // A commit block holds nothing but zeros after its header. One that fails
                    // its checksum with other bytes there, and after which no next transaction
                    // has begun, was torn by the crash (its first sector, with the header, is
                    // new; a later one still holds what the journal block held before): the
                    // transaction never committed, whatever its body holds (an unfenced body
                    // may be torn too). One that fails with only zeros there was written
                    // whole, so its checksum, like a failed body block beside it, points at a
                    // wrong seed or a corrupt log: the rules below.
                    let torn_commit = !commit_ok
                        && buf[commit::COMMIT_HEADER_SIZE..].iter().any(|&b| b != 0)
                        && !self.starts_txn(block, tid.wrapping_add(1), bs)?;
                    if torn_commit {
                        out.torn = Some(tid);
                        return Ok(BlockTxn::End);
                    }
                    if !commit_ok && cur_bad.is_none() {
                        out.failed_commit = Some(tid);
                        return Ok(BlockTxn::End);
                    }
                    let body_failed = cur_bad.is_some() || !cur.corrupt.is_empty();
                    if commit_ok
                        && c.unfenced()
                        && body_failed
                        && !self.starts_txn(block, tid.wrapping_add(1), bs)?
                    {
                        log::info!(
                            "journal scan ends at unfenced transaction {tid}, torn by the crash: {}",
                            cur_bad.unwrap_or_else(|| format!(
                                "{} logged copies fail their checksums",
                                cur.corrupt.len()
                            ))
                        );
                        out.torn = Some(tid);
                        return Ok(BlockTxn::End);
                    }
                    if let Some(why) = cur_bad.take() {
                        return Err(FsError::corrupt(format!(
                            "journal transaction {tid}: {why}, yet its commit block {position} \
                             is present: the log or the journal superblock's UUID (the \
                             checksum seed) is corrupt"
                        )));
                    }
                    if v1 && !v1_commit_ok(&c, v1_sum) {
                        out.failed_commit = Some(tid);
                        return Ok(BlockTxn::End);
                    }
                    out.corrupt_blocks += cur.corrupt.len() as u64;
                    cur.commit_time = (c.commit_sec, c.commit_nsec);
                    cur.unfenced = c.unfenced();
                    cur.len_bytes = blocks * bs as u64;
                    return Ok(BlockTxn::Committed(cur, block));
                }
                BlockType::SuperblockV1 | BlockType::SuperblockV2 => return Ok(BlockTxn::End),
            }
        }
        Ok(BlockTxn::End)
    }

    /// Whether journal block `position` begins a record of transaction `tid`: a jbd2 block of
    /// that sequence (even one that fails its checksum), a range block or a compact commit.
    /// Transaction `tid` is written only after the one before it was flushed, so this shows
    /// that one complete on disk.
    fn starts_txn(&self, position: u32, tid: Tid, bs: usize) -> Result<bool> {
        let mut b = vec![0u8; bs];
        self.geom.read_block(position, &mut b)?;
        Ok(matches!(BlockHeader::parse(&b), Ok(h) if h.sequence == tid)
            || ext::has_header(&b, ext::BLOCKTYPE_RANGES, tid)
            || ext::has_header(&b, ext::BLOCKTYPE_COMPACT, tid))
    }
}

impl From<Entry> for Item {
    fn from(e: Entry) -> Item {
        match e {
            Entry::Range {
                home,
                ranges,
                zero_rest,
            } => Item::Range {
                home,
                ranges,
                zero_rest,
            },
            Entry::Revoke { home } => Item::Revoke { home },
        }
    }
}

/// The v1 compat commit checksum check of recovery.c: a matching crc32, or no checksum at all.
fn v1_commit_ok(c: &CommitBlock, sum: u32) -> bool {
    let matches = c.chksum_type == CHKSUM_CRC32 && c.chksum_size == 4 && c.chksum[0] == sum;
    let absent = c.chksum_type == 0 && c.chksum_size == 0 && c.chksum[0] == 0;
    matches || absent
}
