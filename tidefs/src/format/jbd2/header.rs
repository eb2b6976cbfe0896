//! jbd2 block header (`journal_header_t`, 12 bytes, **big-endian**), the start of every
//! journal metadata block (superblock, descriptor, commit, revoke). Source: journal.rst
//! "Block Header".
//!
//! ```text
//! 0x0 h_magic      u32  0xC03B3998
//! 0x4 h_blocktype  u32  1 descriptor, 2 commit, 3 superblock v1, 4 superblock v2, 5 revoke
//! 0x8 h_sequence   u32  transaction id (0 in superblocks)
//! ```
//!
//! Invariants: `parse` accepts any buffer of at least 12 bytes whose magic matches and whose
//! type is one of the five above; anything else is [`Corrupt`].

use super::{be32, put_be32, JBD2_MAGIC};
use crate::error::Corrupt;

/// Size of the block header.
pub const HEADER_SIZE: usize = 12;
const H_MAGIC: usize = 0x0;
const H_BLOCKTYPE: usize = 0x4;
const H_SEQUENCE: usize = 0x8;
const _: () = assert!(H_SEQUENCE + 4 == HEADER_SIZE);

/// `h_blocktype` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockType {
    /// Describes the data blocks that follow it (tags).
    Descriptor,
    /// Ends a transaction.
    Commit,
    /// Journal superblock, version 1 (no features).
    SuperblockV1,
    /// Journal superblock, version 2.
    SuperblockV2,
    /// Lists home blocks that replay must not overwrite.
    Revoke,
}

impl BlockType {
    /// The on-disk value.
    pub fn to_raw(self) -> u32 {
        match self {
            BlockType::Descriptor => 1,
            BlockType::Commit => 2,
            BlockType::SuperblockV1 => 3,
            BlockType::SuperblockV2 => 4,
            BlockType::Revoke => 5,
        }
    }

    /// Decodes an on-disk value.
    pub fn from_raw(raw: u32) -> Option<BlockType> {
        Some(match raw {
            1 => BlockType::Descriptor,
            2 => BlockType::Commit,
            3 => BlockType::SuperblockV1,
            4 => BlockType::SuperblockV2,
            5 => BlockType::Revoke,
            _ => return None,
        })
    }
}

/// A decoded block header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    /// What kind of journal block this is.
    pub block_type: BlockType,
    /// Transaction id (`h_sequence`).
    pub sequence: u32,
}

impl BlockHeader {
    /// Decodes the header at the start of `b`.
    pub fn parse(b: &[u8]) -> Result<BlockHeader, Corrupt> {
        if b.len() < HEADER_SIZE {
            return Err(Corrupt::new(format!(
                "jbd2 block header: {} bytes, need {HEADER_SIZE}",
                b.len()
            )));
        }
        let h_magic = be32(b, H_MAGIC);
        if h_magic != JBD2_MAGIC {
            return Err(Corrupt::new(format!(
                "jbd2 block header: bad magic {h_magic:#010x} (expected {JBD2_MAGIC:#010x})"
            )));
        }
        let h_blocktype = be32(b, H_BLOCKTYPE);
        let block_type = BlockType::from_raw(h_blocktype).ok_or_else(|| {
            Corrupt::new(format!(
                "jbd2 block header: unknown block type {h_blocktype}"
            ))
        })?;
        Ok(BlockHeader {
            block_type,
            sequence: be32(b, H_SEQUENCE),
        })
    }

    /// Encodes the header into the first 12 bytes of `b`.
    pub fn write(&self, b: &mut [u8]) {
        put_be32(b, H_MAGIC, JBD2_MAGIC);
        put_be32(b, H_BLOCKTYPE, self.block_type.to_raw());
        put_be32(b, H_SEQUENCE, self.sequence);
    }

    /// Decodes `b` and checks that it is a `want` block of transaction `sequence`. Used by the
    /// log scan, where anything else ends the log.
    pub fn is(b: &[u8], want: BlockType, sequence: u32) -> bool {
        matches!(BlockHeader::parse(b), Ok(h) if h.block_type == want && h.sequence == sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden bytes: a commit header of transaction 0x2A.
    const GOLDEN: [u8; 12] = [
        0xC0, 0x3B, 0x39, 0x98, // h_magic
        0x00, 0x00, 0x00, 0x02, // h_blocktype = commit
        0x00, 0x00, 0x00, 0x2A, // h_sequence
    ];

    #[test]
    fn golden_round_trip() {
        let h = BlockHeader::parse(&GOLDEN).unwrap();
        assert_eq!(h.block_type, BlockType::Commit);
        assert_eq!(h.sequence, 0x2A);
        let mut out = [0u8; 12];
        h.write(&mut out);
        assert_eq!(out, GOLDEN);
    }

    #[test]
    fn rejects_bad_magic() {
        let mut b = GOLDEN;
        b[0] = 0;
        let e = BlockHeader::parse(&b).unwrap_err();
        assert!(e.what.contains("magic"), "{e}");
    }

    #[test]
    fn rejects_unknown_block_type() {
        let mut b = GOLDEN;
        b[7] = 9;
        let e = BlockHeader::parse(&b).unwrap_err();
        assert!(e.what.contains("block type 9"), "{e}");
    }

    #[test]
    fn rejects_short_buffer() {
        assert!(BlockHeader::parse(&GOLDEN[..11]).is_err());
    }
}
