//! jbd2 revoke block (**big-endian**): home blocks that replay must not overwrite with copies
//! from this or older transactions. Source: journal.rst "Revocation Block", jbd2.h
//! `jbd2_journal_revoke_header_t`, recovery.c `scan_revoke_records`.
//!
//! ```text
//! 0x00 header (12)   h_blocktype 5, h_sequence = transaction id
//! 0x0C r_count       u32  bytes used in the block, including this 16-byte header
//! 0x10 records       u32 each, or u64 each with INCOMPAT_64BIT
//! bs-4 t_checksum    u32 (v2/v3 only) crc32c(seed, block with this field zeroed)
//! ```
//!
//! Invariants: `r_count` never exceeds the block minus its tail (else `Corrupt`, as the kernel
//! returns -EINVAL); trailing bytes shorter than a record are ignored, as the kernel does.

use super::{be32, be64, put_be32, put_be64, BlockHeader, BlockType, TagFormat};
use crate::error::Corrupt;

const R_COUNT: usize = 0x0C;
/// Size of the revoke header (block header + r_count).
pub const REVOKE_HEADER_SIZE: usize = 0x10;

/// A decoded revoke block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokeBlock {
    /// Transaction id.
    pub sequence: u32,
    /// Record encoding (64-bit records and tail presence).
    pub format: TagFormat,
    /// Revoked home blocks.
    pub blocks: Vec<u64>,
}

impl RevokeBlock {
    /// Bytes per revoke record.
    pub fn record_size(format: TagFormat) -> usize {
        if format.bits64 {
            8
        } else {
            4
        }
    }

    /// How many records fit in one block.
    pub fn records_per_block(format: TagFormat, block_size: usize) -> usize {
        block_size.saturating_sub(REVOKE_HEADER_SIZE + format.tail_size())
            / Self::record_size(format)
    }

    /// Decodes a revoke block (tail not verified: see [`super::block_tail_verify`]).
    pub fn parse(b: &[u8], format: TagFormat) -> Result<RevokeBlock, Corrupt> {
        if b.len() < REVOKE_HEADER_SIZE {
            return Err(Corrupt::new("jbd2 revoke block: buffer too short"));
        }
        let header = BlockHeader::parse(b)
            .map_err(|e| Corrupt::new(format!("jbd2 revoke block: {}", e.what)))?;
        if header.block_type != BlockType::Revoke {
            return Err(Corrupt::new(format!(
                "jbd2 revoke block: block type {} is not a revoke block",
                header.block_type.to_raw()
            )));
        }
        let r_count = be32(b, R_COUNT);
        let max = b.len() - format.tail_size();
        let used = usize::try_from(r_count).unwrap_or(usize::MAX);
        if used > max {
            return Err(Corrupt::new(format!(
                "jbd2 revoke block of transaction {}: r_count {r_count} exceeds the block ({max})",
                header.sequence
            )));
        }
        let rec = Self::record_size(format);
        let mut blocks = Vec::new();
        let mut off = REVOKE_HEADER_SIZE;
        while off + rec <= used {
            blocks.push(if format.bits64 {
                be64(b, off)
            } else {
                u64::from(be32(b, off))
            });
            off += rec;
        }
        Ok(RevokeBlock {
            sequence: header.sequence,
            format,
            blocks,
        })
    }

    /// Encodes the block into `b` (one journal block), tail left zero. Panics if the records
    /// do not fit or a block needs 64 bits in a 32-bit format (callers check both).
    pub fn write(&self, b: &mut [u8]) {
        b.fill(0);
        BlockHeader {
            block_type: BlockType::Revoke,
            sequence: self.sequence,
        }
        .write(b);
        let rec = Self::record_size(self.format);
        assert!(self.blocks.len() <= Self::records_per_block(self.format, b.len()));
        let mut off = REVOKE_HEADER_SIZE;
        for &block in &self.blocks {
            if self.format.bits64 {
                put_be64(b, off, block);
            } else {
                let low = u32::try_from(block).expect("32-bit revoke record"); // OK to unwrap: callers check block numbers against the format
                put_be32(b, off, low);
            }
            off += rec;
        }
        let r_count = u32::try_from(off).unwrap_or(u32::MAX);
        put_be32(b, R_COUNT, r_count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::jbd2::CsumVersion;

    #[test]
    fn round_trip_32_and_64() {
        for bits64 in [false, true] {
            let format = TagFormat {
                csum: CsumVersion::V3,
                bits64,
            };
            let n = RevokeBlock::records_per_block(format, 1024);
            let big = if bits64 { 1u64 << 40 } else { 7 };
            let blocks: Vec<u64> = (0..n as u64).map(|i| i + 1).chain([big]).skip(1).collect();
            let r = RevokeBlock {
                sequence: 5,
                format,
                blocks,
            };
            let mut b = vec![0u8; 1024];
            r.write(&mut b);
            let r_count = be32(&b, R_COUNT) as usize;
            assert_eq!(r_count, 16 + n * RevokeBlock::record_size(format));
            assert_eq!(RevokeBlock::parse(&b, format).unwrap(), r);
        }
    }

    #[test]
    fn rejects_oversized_r_count() {
        let format = TagFormat {
            csum: CsumVersion::V3,
            bits64: true,
        };
        let mut b = vec![0u8; 1024];
        RevokeBlock {
            sequence: 1,
            format,
            blocks: vec![3],
        }
        .write(&mut b);
        put_be32(&mut b, R_COUNT, 1022); // past the tail
        let e = RevokeBlock::parse(&b, format).unwrap_err();
        assert!(e.what.contains("r_count"), "{e}");
    }

    #[test]
    fn rejects_wrong_type() {
        let format = TagFormat {
            csum: CsumVersion::None,
            bits64: false,
        };
        let mut b = vec![0u8; 1024];
        RevokeBlock {
            sequence: 1,
            format,
            blocks: vec![3],
        }
        .write(&mut b);
        b[7] = 1;
        assert!(RevokeBlock::parse(&b, format)
            .unwrap_err()
            .what
            .contains("not a revoke"));
    }
}
