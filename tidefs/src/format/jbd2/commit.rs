//! jbd2 commit block (**big-endian**): the record that makes a transaction count. Source:
//! journal.rst "Commit Block", jbd2.h `struct commit_header`, commit.c
//! `jbd2_commit_block_csum_set`, recovery.c `jbd2_commit_block_csum_verify`.
//!
//! ```text
//! 0x00 header (12)      h_blocktype 2, h_sequence = transaction id
//! 0x0C h_chksum_type    u8   1 = crc32 (v1 compat checksum), 0 under v2/v3
//! 0x0D h_chksum_size    u8   4 under v1, 0 under v2/v3
//! 0x0E h_padding[0]     u8   tidefs's commit flags (the kernel ignores this byte):
//!                            bit 0 `FLAG_UNFENCED`: written without a flush between the
//!                            body and this block (docs/FORMAT.md §5.7)
//! 0x0F h_padding[1]     u8   0
//! 0x10 h_chksum         [u32;8]  v1: [0] = crc32_be over the descriptor and data blocks;
//!                                v2/v3: [0] = crc32c(seed, whole block with [0] zeroed)
//! 0x30 h_commit_sec     u64  commit time, seconds
//! 0x38 h_commit_nsec    u32  commit time, nanoseconds
//! ```
//!
//! Invariants: `write` zeroes the rest of the block, so a v2/v3 checksum computed after `write`
//! covers exactly what the kernel's does.

use super::{be32, be64, put_be32, put_be64, BlockHeader, BlockType};
use crate::error::Corrupt;
use crate::format::crc32c_raw;

const H_CHKSUM_TYPE: usize = 0x0C;
const H_CHKSUM_SIZE: usize = 0x0D;
const H_FLAGS: usize = 0x0E;
const H_CHKSUM: usize = 0x10;
const H_COMMIT_SEC: usize = 0x30;
const H_COMMIT_NSEC: usize = 0x38;
/// Commit flag: the transaction's body and this commit block were written together, with no
/// flush between them, so the commit block alone does not prove the body is on disk: the
/// transaction counts only if every block of it verifies (a tidefs extension, set only under
/// checksum v3 and while the journal superblock carries `INCOMPAT_TIDEFS_EXT`).
pub const FLAG_UNFENCED: u8 = 0x01;
/// Bytes of the commit header.
pub const COMMIT_HEADER_SIZE: usize = 0x3C;
const _: () = assert!(H_CHKSUM + 32 == H_COMMIT_SEC);

/// A decoded commit block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitBlock {
    /// Transaction id.
    pub sequence: u32,
    /// `h_chksum_type`.
    pub chksum_type: u8,
    /// `h_chksum_size`.
    pub chksum_size: u8,
    /// tidefs's commit flags (`h_padding[0]`): [`FLAG_UNFENCED`].
    pub flags: u8,
    /// `h_chksum`.
    pub chksum: [u32; 8],
    /// `h_commit_sec`.
    pub commit_sec: u64,
    /// `h_commit_nsec`.
    pub commit_nsec: u32,
}

impl CommitBlock {
    /// Whether the commit block carries [`FLAG_UNFENCED`].
    pub fn unfenced(&self) -> bool {
        self.flags & FLAG_UNFENCED != 0
    }

    /// Decodes a commit block (checksum not verified: see [`verify_csum_v2v3`]).
    pub fn parse(b: &[u8]) -> Result<CommitBlock, Corrupt> {
        if b.len() < COMMIT_HEADER_SIZE {
            return Err(Corrupt::new("jbd2 commit block: buffer too short"));
        }
        let header = BlockHeader::parse(b)
            .map_err(|e| Corrupt::new(format!("jbd2 commit block: {}", e.what)))?;
        if header.block_type != BlockType::Commit {
            return Err(Corrupt::new(format!(
                "jbd2 commit block: block type {} is not a commit block",
                header.block_type.to_raw()
            )));
        }
        let mut chksum = [0u32; 8];
        for (i, c) in chksum.iter_mut().enumerate() {
            *c = be32(b, H_CHKSUM + 4 * i);
        }
        Ok(CommitBlock {
            sequence: header.sequence,
            chksum_type: b[H_CHKSUM_TYPE],
            chksum_size: b[H_CHKSUM_SIZE],
            flags: b[H_FLAGS],
            chksum,
            commit_sec: be64(b, H_COMMIT_SEC),
            commit_nsec: be32(b, H_COMMIT_NSEC),
        })
    }

    /// Encodes the block into `b` (one journal block), zeroing the rest.
    pub fn write(&self, b: &mut [u8]) {
        b.fill(0);
        BlockHeader {
            block_type: BlockType::Commit,
            sequence: self.sequence,
        }
        .write(b);
        b[H_CHKSUM_TYPE] = self.chksum_type;
        b[H_CHKSUM_SIZE] = self.chksum_size;
        b[H_FLAGS] = self.flags;
        for (i, c) in self.chksum.iter().enumerate() {
            put_be32(b, H_CHKSUM + 4 * i, *c);
        }
        put_be64(b, H_COMMIT_SEC, self.commit_sec);
        put_be32(b, H_COMMIT_NSEC, self.commit_nsec);
    }
}

/// The v2/v3 commit checksum: crc32c(seed, block with h_chksum[0] zeroed).
pub fn csum_v2v3(seed: u32, b: &[u8]) -> u32 {
    let c = crc32c_raw(seed, &b[..H_CHKSUM]);
    let c = crc32c_raw(c, &[0u8; 4]);
    crc32c_raw(c, &b[H_CHKSUM + 4..])
}

/// Stores the v2/v3 checksum in an encoded commit block (kernel `jbd2_commit_block_csum_set`,
/// which also zeroes h_chksum_type and h_chksum_size first).
pub fn set_csum_v2v3(seed: u32, b: &mut [u8]) {
    b[H_CHKSUM_TYPE] = 0;
    b[H_CHKSUM_SIZE] = 0;
    let c = csum_v2v3(seed, b);
    put_be32(b, H_CHKSUM, c);
}

/// Checks the v2/v3 checksum of an encoded commit block.
pub fn verify_csum_v2v3(seed: u32, b: &[u8]) -> bool {
    b.len() >= COMMIT_HEADER_SIZE && be32(b, H_CHKSUM) == csum_v2v3(seed, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CommitBlock {
        CommitBlock {
            sequence: 42,
            chksum_type: 1,
            chksum_size: 4,
            flags: FLAG_UNFENCED,
            chksum: [0x1234_5678, 0, 0, 0, 0, 0, 0, 9],
            commit_sec: 1_700_000_000,
            commit_nsec: 999,
        }
    }

    #[test]
    fn round_trip() {
        let mut b = vec![0xFFu8; 4096];
        sample().write(&mut b);
        assert_eq!(&b[0x10..0x14], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(b[0x0E], FLAG_UNFENCED);
        assert_eq!(CommitBlock::parse(&b).unwrap(), sample());
        assert!(b[COMMIT_HEADER_SIZE..].iter().all(|&x| x == 0));
    }

    #[test]
    fn v3_checksum_set_and_verify() {
        let mut b = vec![0u8; 4096];
        sample().write(&mut b);
        set_csum_v2v3(0xABCD, &mut b);
        let c = CommitBlock::parse(&b).unwrap();
        assert_eq!((c.chksum_type, c.chksum_size), (0, 0));
        assert!(verify_csum_v2v3(0xABCD, &b));
        assert!(!verify_csum_v2v3(0xABCE, &b));
        b[4000] = 1;
        assert!(!verify_csum_v2v3(0xABCD, &b));
    }

    #[test]
    fn rejects_wrong_type_and_magic() {
        let mut b = vec![0u8; 1024];
        sample().write(&mut b);
        b[7] = 5;
        assert!(CommitBlock::parse(&b)
            .unwrap_err()
            .what
            .contains("not a commit"));
        b[0] = 0;
        assert!(CommitBlock::parse(&b).unwrap_err().what.contains("magic"));
    }
}
