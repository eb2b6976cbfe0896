//! Journal records and their serialisation into journal blocks.
//!
//! A commit hands the log a list of [`Record`]s; a serializer turns them into the journal
//! blocks of one transaction. Today there is one serializer, [`Jbd2BlockLayout`], the classic
//! jbd2 layout (descriptor blocks with tags, the block copies, revoke blocks, a commit block)
//! that the kernel and e2fsck can replay. Later record kinds (byte ranges of a home block) and
//! denser layouts (a compact commit of a few sectors, docs/DESIGN.md §8) plug in here without
//! touching the log's space accounting, which only needs `blocks_needed` and the block list.
//!
//! Invariants:
//! - `serialize` produces exactly `blocks_needed` blocks: the body, then the commit block;
//! - a logged copy never starts with the jbd2 magic: such blocks are escaped (first four bytes
//!   zeroed, ESCAPE flag set), and tag checksums cover the escaped copy, as the kernel does;
//! - a home block appears at most once per transaction.

use std::sync::Arc;

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

impl Jbd2BlockLayout {
    fn counts(records: &[Record]) -> (usize, usize) {
        let full = records
            .iter()
            .filter(|r| matches!(r, Record::FullBlock { .. }))
            .count();
        (full, records.len() - full)
    }

    /// Journal blocks the records take, commit block included.
    pub fn blocks_needed(&self, records: &[Record]) -> usize {
        let (full, revokes) = Self::counts(records);
        self.blocks_for(full, revokes)
    }

    /// Journal blocks for `full` block records and `revokes` revoke records.
    pub fn blocks_for(&self, full: usize, revokes: usize) -> usize {
        let per_desc = self.format.tags_per_block(self.block_size).max(1);
        let per_revoke = RevokeBlock::records_per_block(self.format, self.block_size).max(1);
        full + full.div_ceil(per_desc) + revokes.div_ceil(per_revoke) + 1
    }

    /// Serialises one transaction. `commit_time` is (seconds, nanoseconds) since the epoch.
    pub fn serialize(
        &self,
        tid: u32,
        records: &[Record],
        commit_time: (u64, u32),
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
                Record::Revoke { .. } => None,
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
        let revoked: Vec<u64> = records
            .iter()
            .filter_map(|r| match r {
                Record::Revoke { home } => Some(*home),
                Record::FullBlock { .. } => None,
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
