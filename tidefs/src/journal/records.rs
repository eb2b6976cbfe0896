//! Journal records and their serialisation into journal blocks.
//!
//! A commit hands the log a list of [`Record`]s (full blocks, byte ranges of a block, revokes);
//! [`Jbd2BlockLayout`] turns them into the journal bytes of one transaction, in one of two
//! layouts:
//! - the block layout: the classic jbd2 layout (descriptor blocks with tags, the block copies,
//!   revoke blocks, a commit block) that the kernel and e2fsck can replay (unless written
//!   unfenced: its commit block then carries tidefs's flag, FORMAT.md §5.7), plus, when the
//!   transaction has byte-range records, range blocks (tidefs's own, docs/FORMAT.md §5) between
//!   the copies and the revoke blocks;
//! - the compact layout ([`Jbd2BlockLayout::compact`]): a transaction of range records and
//!   revokes only, small enough, written as one compact commit of a few sectors.
//!
//! The byte layouts of the extension records are in `format::jbd2::ext`.
//!
//! Invariants:
//! - `serialize` produces exactly `blocks_needed` blocks: the body, then the commit block;
//! - without range records, the block layout is byte for byte what the kernel writes;
//! - a logged copy never starts with the jbd2 magic: such blocks are escaped (first four bytes
//!   zeroed, ESCAPE flag set), and tag checksums cover the escaped copy, as the kernel does;
//! - a home block appears at most once per transaction.

use std::sync::Arc;

use crate::format::jbd2::ext;
use crate::format::jbd2::{
    block_tail_set, commit, crc32_be, data_block_csum, CommitBlock, CsumVersion, DescriptorBlock,
    RevokeBlock, TagFormat, CHKSUM_CRC32, JBD2_MAGIC,
};

/// One change a transaction makes durable.
#[derive(Clone, Debug)]
pub(super) enum Record {
    /// The full new content of a home block.
    FullBlock {
        /// Home block number on the file-system device.
        home: u64,
        /// Its content (one block).
        data: Arc<[u8]>,
    },
    /// Some byte ranges of a home block; replay patches its previous version with them.
    Range {
        /// Home block number on the file-system device.
        home: u64,
        /// The block's full new content (what `pending` and checkpoint use).
        data: Arc<[u8]>,
        /// Sorted, disjoint `(offset, len)` ranges of `data` to log, each below 64 KiB.
        ranges: Vec<(u32, u32)>,
        /// `data` is zeros outside `ranges`, so replay starts from a zero block instead of
        /// the home block's previous version (a whole block logged as its non-zero bytes).
        zero_rest: bool,
    },
    /// A home block freed by this transaction: replay must not write older copies of it.
    Revoke {
        /// Home block number.
        home: u64,
    },
}

/// The journal blocks of one serialised transaction.
pub(super) struct SerializedTxn {
    /// Blocks written before the ordering point, in log order.
    pub body: Vec<Arc<[u8]>>,
    /// The commit block, written after the ordering point.
    pub commit: Vec<u8>,
}

/// The classic jbd2 block layout of a transaction.
#[derive(Clone, Debug)]
pub(super) struct Jbd2BlockLayout {
    /// Tag and revoke encoding.
    pub format: TagFormat,
    /// Journal UUID, written after the first tag of each descriptor.
    pub uuid: [u8; 16],
    /// Checksum seed (crc32c of the UUID).
    pub seed: u32,
    /// Journal block size in bytes.
    pub block_size: usize,
    /// Write the v1 compat crc32 transaction checksum in the commit block.
    pub compat_checksum: bool,
}

impl Record {
    /// The home block the record is about.
    pub fn home(&self) -> u64 {
        match self {
            Record::FullBlock { home, .. }
            | Record::Range { home, .. }
            | Record::Revoke { home } => *home,
        }
    }

    /// True for the records only tidefs can replay (byte ranges).
    pub fn is_extension(&self) -> bool {
        matches!(self, Record::Range { .. })
    }

    /// Appends the entry-area encoding of a range or revoke record (`format::jbd2::ext`).
    fn encode_entry(&self, out: &mut Vec<u8>) {
        match self {
            Record::Range {
                home,
                data,
                ranges,
                zero_rest,
            } => {
                let parts: Vec<(u32, &[u8])> = ranges
                    .iter()
                    .map(|&(o, l)| (o, &data[o as usize..(o + l) as usize]))
                    .collect();
                ext::encode_range(out, *home, &parts, *zero_rest);
            }
            Record::Revoke { home } => ext::encode_revoke(out, *home),
            Record::FullBlock { .. } => unreachable!("full blocks have no entry encoding"),
        }
    }
}

/// The non-zero bytes of `block` as sorted `(offset, len)` ranges, runs closer than one range
/// descriptor merged (logging the zeros between them is cheaper than another descriptor).
pub(super) fn nonzero_ranges(block: &[u8]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut i = 0;
    while i < block.len() {
        if block[i] == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < block.len() && block[i] != 0 {
            i += 1;
        }
        // Block offsets fit in u32.
        let (s, e) = (start as u32, i as u32);
        match out.last_mut() {
            Some((o, l)) if s - (*o + *l) <= ext::RANGE_DESC as u32 => *l = e - *o,
            _ => out.push((s, e - s)),
        }
    }
    out
}

/// Bytes a range record with these ranges takes in an entry area.
pub(super) fn range_entry_len(ranges: &[(u32, u32)]) -> usize {
    ext::range_entry_len(ranges.iter().map(|r| r.1 as usize))
}

impl Jbd2BlockLayout {
    fn counts(records: &[Record]) -> (usize, usize) {
        let full = records
            .iter()
            .filter(|r| matches!(r, Record::FullBlock { .. }))
            .count();
        let revokes = records
            .iter()
            .filter(|r| matches!(r, Record::Revoke { .. }))
            .count();
        (full, revokes)
    }

    /// Journal blocks the records take in the block layout, commit block included.
    pub fn blocks_needed(&self, records: &[Record]) -> usize {
        let (full, revokes) = Self::counts(records);
        let per_desc = self.format.tags_per_block(self.block_size).max(1);
        let per_revoke = RevokeBlock::records_per_block(self.format, self.block_size).max(1);
        full + full.div_ceil(per_desc)
            + self.range_blocks(records).len()
            + revokes.div_ceil(per_revoke)
            + 1
    }

    /// The range records packed into range blocks, in order: each block's list of records.
    fn range_blocks<'a>(&self, records: &'a [Record]) -> Vec<Vec<&'a Record>> {
        let cap = ext::ranges_capacity(self.block_size);
        let mut blocks: Vec<Vec<&Record>> = Vec::new();
        let mut used = cap;
        for r in records {
            let Record::Range { ranges, .. } = r else {
                continue;
            };
            let len = range_entry_len(ranges);
            assert!(len <= cap, "range record larger than a range block");
            if used + len > cap {
                blocks.push(Vec::new());
                used = 0;
            }
            used += len;
            if let Some(b) = blocks.last_mut() {
                b.push(r);
            }
        }
        blocks
    }

    /// The compact commit of a transaction, if it can have one: only range records and
    /// revokes, at least one range, and the whole record no larger than a journal block.
    /// `sector` is the journal device's logical sector size.
    pub fn compact(
        &self,
        tid: u32,
        records: &[Record],
        sector: usize,
        commit_time: (u64, u32),
    ) -> Option<Vec<u8>> {
        if !records.iter().any(Record::is_extension)
            || records
                .iter()
                .any(|r| matches!(r, Record::FullBlock { .. }))
            || !sector.is_power_of_two()
            || !(512..=self.block_size).contains(&sector)
        {
            return None;
        }
        let mut area_len = 0usize;
        for r in records {
            area_len += match r {
                Record::Range { ranges, .. } => range_entry_len(ranges),
                _ => ext::ENTRY_HEADER,
            };
        }
        if ext::compact_len(area_len, sector) > self.block_size {
            return None;
        }
        let mut area = Vec::with_capacity(area_len);
        for r in records {
            r.encode_entry(&mut area);
        }
        let entries = u32::try_from(records.len()).unwrap_or(u32::MAX);
        Some(ext::build_compact(
            self.seed,
            tid,
            entries,
            &area,
            sector,
            commit_time,
        ))
    }

    /// Serialises one transaction. `commit_time` is (seconds, nanoseconds) since the epoch;
    /// `unfenced` marks the commit block with [`commit::FLAG_UNFENCED`].
    pub fn serialize(
        &self,
        tid: u32,
        records: &[Record],
        commit_time: (u64, u32),
        unfenced: bool,
    ) -> SerializedTxn {
        let per_desc = self.format.tags_per_block(self.block_size).max(1);
        let per_revoke = RevokeBlock::records_per_block(self.format, self.block_size).max(1);
        let magic = JBD2_MAGIC.to_be_bytes();
        let mut body: Vec<Arc<[u8]>> = Vec::new();
        let mut v1_sum = !0u32;
        let full: Vec<(u64, &Arc<[u8]>)> = records
            .iter()
            .filter_map(|r| match r {
                Record::FullBlock { home, data } => Some((*home, data)),
                _ => None,
            })
            .collect();
        for chunk in full.chunks(per_desc) {
            let mut logged: Vec<Arc<[u8]>> = Vec::with_capacity(chunk.len());
            let mut entries = Vec::with_capacity(chunk.len());
            for &(home, data) in chunk {
                assert_eq!(
                    data.len(),
                    self.block_size,
                    "record is not one journal block"
                );
                let escaped = data[..4] == magic;
                let copy: Arc<[u8]> = if escaped {
                    let mut v = data.to_vec();
                    v[..4].fill(0);
                    v.into()
                } else {
                    Arc::clone(data)
                };
                let csum = match self.format.csum {
                    CsumVersion::None => 0,
                    CsumVersion::V2 => data_block_csum(self.seed, tid, &copy) & 0xFFFF,
                    CsumVersion::V3 => data_block_csum(self.seed, tid, &copy),
                };
                entries.push((home, escaped, csum));
                logged.push(copy);
            }
            let mut desc = vec![0u8; self.block_size];
            DescriptorBlock::build(tid, self.format, self.uuid, &entries).write(&mut desc);
            if self.format.csum.has_tail() {
                block_tail_set(self.seed, &mut desc);
            }
            if self.compat_checksum {
                v1_sum = crc32_be(v1_sum, &desc);
                for copy in &logged {
                    v1_sum = crc32_be(v1_sum, copy);
                }
            }
            body.push(desc.into());
            body.extend(logged);
        }
        for group in self.range_blocks(records) {
            let mut area = Vec::new();
            for r in &group {
                r.encode_entry(&mut area);
            }
            let entries = u32::try_from(group.len()).unwrap_or(u32::MAX);
            body.push(
                ext::build_ranges_block(self.seed, tid, entries, &area, self.block_size).into(),
            );
        }
        let revoked: Vec<u64> = records
            .iter()
            .filter_map(|r| match r {
                Record::Revoke { home } => Some(*home),
                _ => None,
            })
            .collect();
        for chunk in revoked.chunks(per_revoke) {
            let mut b = vec![0u8; self.block_size];
            RevokeBlock {
                sequence: tid,
                format: self.format,
                blocks: chunk.to_vec(),
            }
            .write(&mut b);
            if self.format.csum.has_tail() {
                block_tail_set(self.seed, &mut b);
            }
            body.push(b.into());
        }
        let mut commit_block = vec![0u8; self.block_size];
        let (chksum_type, chksum_size, chksum0) = if self.compat_checksum {
            (CHKSUM_CRC32, 4, v1_sum)
        } else {
            (0, 0, 0)
        };
        CommitBlock {
            sequence: tid,
            chksum_type,
            chksum_size,
            flags: if unfenced { commit::FLAG_UNFENCED } else { 0 },
            chksum: [chksum0, 0, 0, 0, 0, 0, 0, 0],
            commit_sec: commit_time.0,
            commit_nsec: commit_time.1,
        }
        .write(&mut commit_block);
        if self.format.csum.has_tail() {
            commit::set_csum_v2v3(self.seed, &mut commit_block);
        }
        debug_assert_eq!(body.len() + 1, self.blocks_needed(records));
        SerializedTxn {
            body,
            commit: commit_block,
        }
    }
}
