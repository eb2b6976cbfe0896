//! jbd2 journal on-disk structures (**big-endian**), pure parse/serialize with no I/O.
//!
//! Sources: the kernel's Documentation/filesystems/ext4/journal.rst, include/linux/jbd2.h,
//! fs/jbd2/recovery.c and fs/jbd2/commit.c; e2fsprogs lib/ext2fs/kernel-jbd.h.
//!
//! One module per structure: [`header`] (the 12-byte block header every journal metadata block
//! starts with), [`superblock`], [`descriptor`] (descriptor block, tags, block tail),
//! [`commit`] and [`revoke`]; [`ext`] holds tidefs's own extension records (byte ranges,
//! compact commits), guarded by the incompat bit [`ext::INCOMPAT_TIDEFS_EXT`].
//!
//! Invariants:
//! - every multi-byte field of a jbd2 structure is read and written big-endian, here only;
//! - parsers never panic on any input: short or malformed buffers return [`Corrupt`];
//! - checksum helpers take the journal checksum seed ([`csum_seed`]) and never mutate their input.

pub mod commit;
pub mod descriptor;
pub mod ext;
pub mod header;
pub mod revoke;
pub mod superblock;

use crate::error::Corrupt;
use crate::format::crc32c_raw;

pub use commit::CommitBlock;
pub use descriptor::{DescriptorBlock, Tag, TagFormat};
pub use header::{BlockHeader, BlockType};
pub use revoke::RevokeBlock;
pub use superblock::JournalSuperblock;

/// `h_magic` of every jbd2 metadata block: "the first 4 bytes of /dev/random".
pub const JBD2_MAGIC: u32 = 0xC03B_3998;

/// Compat feature: commit blocks carry a crc32 (big-endian flavour) of the transaction (v1).
pub const COMPAT_CHECKSUM: u32 = 0x1;
/// Incompat feature: the journal has revoke blocks.
pub const INCOMPAT_REVOKE: u32 = 0x1;
/// Incompat feature: tags and revoke records carry 64-bit block numbers.
pub const INCOMPAT_64BIT: u32 = 0x2;
/// Incompat feature: commit blocks may be written without a flush before them.
pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
/// Incompat feature: checksum v2 (16-bit tag checksums, crc32c block tails).
pub const INCOMPAT_CSUM_V2: u32 = 0x8;
/// Incompat feature: checksum v3 (32-bit tag checksums in `journal_block_tag3_t`).
pub const INCOMPAT_CSUM_V3: u32 = 0x10;
/// Incompat feature: fast-commit blocks follow the regular journal area. tidefs does not
/// implement it and refuses such journals.
pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;

pub use ext::{INCOMPAT_TIDEFS_EXT, INCOMPAT_TIDEFS_ONLY, INCOMPAT_TIDEFS_UNFENCED};

/// Incompat bits tidefs reads and writes.
pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_REVOKE
    | INCOMPAT_64BIT
    | INCOMPAT_ASYNC_COMMIT
    | INCOMPAT_CSUM_V2
    | INCOMPAT_CSUM_V3
    | INCOMPAT_TIDEFS_ONLY;

/// `s_checksum_type` / `h_chksum_type`: crc32 (v1 transaction checksums).
pub const CHKSUM_CRC32: u8 = 1;
/// `s_checksum_type`: crc32c (v2 and v3 checksums).
pub const CHKSUM_CRC32C: u8 = 4;

/// The name of an incompat feature bit, as e2fsprogs' `e2p_jrnl_feature2string` spells it.
pub fn incompat_name(bit: u32) -> String {
    match bit {
        INCOMPAT_REVOKE => "journal_incompat_revoke".into(),
        INCOMPAT_64BIT => "journal_64bit".into(),
        INCOMPAT_ASYNC_COMMIT => "journal_async_commit".into(),
        INCOMPAT_CSUM_V2 => "journal_checksum_v2".into(),
        INCOMPAT_CSUM_V3 => "journal_checksum_v3".into(),
        INCOMPAT_FAST_COMMIT => "journal_fast_commit".into(),
        INCOMPAT_TIDEFS_EXT => "tidefs_extension_records".into(),
        INCOMPAT_TIDEFS_UNFENCED => "tidefs_unfenced_commits".into(),
        other => format!("unknown journal incompat bit {other:#x}"),
    }
}

/// Returns the names of the incompat bits in `incompat` that tidefs does not implement, or
/// `Ok` when it can read and write the journal.
pub fn check_incompat(incompat: u32) -> Result<(), String> {
    let unknown = incompat & !INCOMPAT_SUPPORTED;
    if unknown == 0 {
        return Ok(());
    }
    let names: Vec<String> = (0..32)
        .map(|i| 1u32 << i)
        .filter(|bit| unknown & bit != 0)
        .map(incompat_name)
        .collect();
    Err(format!(
        "jbd2 journal feature(s) not supported: {}",
        names.join(", ")
    ))
}

/// Which per-block checksums a journal carries, derived from its feature bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsumVersion {
    /// No checksums, or only the v1 compat transaction crc32 in the commit block.
    None,
    /// `INCOMPAT_CSUM_V2`: 16-bit tag checksums, crc32c tails and commit checksum.
    V2,
    /// `INCOMPAT_CSUM_V3`: 32-bit tag checksums, crc32c tails and commit checksum.
    V3,
}

impl CsumVersion {
    /// The checksum version a superblock's incompat bits declare.
    pub fn from_incompat(incompat: u32) -> CsumVersion {
        if incompat & INCOMPAT_CSUM_V3 != 0 {
            CsumVersion::V3
        } else if incompat & INCOMPAT_CSUM_V2 != 0 {
            CsumVersion::V2
        } else {
            CsumVersion::None
        }
    }

    /// True for v2 and v3, which add block tails and commit checksums.
    pub fn has_tail(self) -> bool {
        self != CsumVersion::None
    }
}

/// The journal checksum seed: crc32c(~0, s_uuid) (kernel `j_csum_seed`).
pub fn csum_seed(uuid: &[u8; 16]) -> u32 {
    crc32c_raw(!0, uuid)
}

/// Size of `struct jbd2_journal_block_tail`, the crc32c at the end of descriptor and revoke
/// blocks under checksum v2/v3.
pub const BLOCK_TAIL_SIZE: usize = 4;

/// crc32c of a descriptor or revoke block with its tail field zeroed
/// (kernel `jbd2_descriptor_block_csum_set`).
pub fn block_tail_csum(seed: u32, block: &[u8]) -> u32 {
    let tail = block.len().saturating_sub(BLOCK_TAIL_SIZE);
    let c = crc32c_raw(seed, &block[..tail]);
    crc32c_raw(c, &[0u8; BLOCK_TAIL_SIZE][..block.len() - tail])
}

/// Stores the block tail checksum of `block`.
pub fn block_tail_set(seed: u32, block: &mut [u8]) {
    let tail = block.len() - BLOCK_TAIL_SIZE;
    let csum = block_tail_csum(seed, block);
    put_be32(block, tail, csum);
}

/// Checks the block tail checksum of a descriptor or revoke block.
pub fn block_tail_verify(seed: u32, block: &[u8], what: &str) -> Result<(), Corrupt> {
    if block.len() < BLOCK_TAIL_SIZE + header::HEADER_SIZE {
        return Err(Corrupt::new(format!("{what}: block too short for a tail")));
    }
    let stored = be32(block, block.len() - BLOCK_TAIL_SIZE);
    let computed = block_tail_csum(seed, block);
    if stored != computed {
        return Err(Corrupt::new(format!(
            "{what}: block tail checksum {stored:#010x} does not match computed {computed:#010x}"
        )));
    }
    Ok(())
}

/// Checksum of a logged data block under v2/v3: crc32c(seed, be32(sequence)) then the block
/// (kernel `jbd2_block_tag_csum_set`). v2 stores the low 16 bits.
pub fn data_block_csum(seed: u32, sequence: u32, data: &[u8]) -> u32 {
    let c = crc32c_raw(seed, &sequence.to_be_bytes());
    crc32c_raw(c, data)
}

/// The kernel's `crc32_be`: CRC-32 with polynomial 0x04C11DB7, MSB first, no inversions. Used by
/// the v1 compat transaction checksum, seeded with `!0` per transaction.
pub fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    for &byte in data {
        crc ^= u32::from(byte) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Big-endian u16 at `off`. Callers check the buffer length against their layout first, so an
/// out-of-range offset is a programmer error and panics.
pub fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Big-endian u32 at `off` (see [`be16`] for the bounds contract).
pub fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Big-endian u64 at `off` (see [`be16`] for the bounds contract).
pub fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// Stores `v` big-endian at `off`.
pub fn put_be16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Stores `v` big-endian at `off`.
pub fn put_be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// Stores `v` big-endian at `off`.
pub fn put_be64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn be_helpers_round_trip() {
        let mut b = [0u8; 14];
        put_be16(&mut b, 0, 0xBEEF);
        put_be32(&mut b, 2, 0xC03B_3998);
        put_be64(&mut b, 6, 0x0102_0304_0506_0708);
        assert_eq!(&b[2..6], &[0xC0, 0x3B, 0x39, 0x98]);
        assert_eq!(b[6], 0x01);
        assert_eq!(be16(&b, 0), 0xBEEF);
        assert_eq!(be32(&b, 2), JBD2_MAGIC);
        assert_eq!(be64(&b, 6), 0x0102_0304_0506_0708);
    }

    #[test]
    fn crc32_be_known_vector() {
        // CRC-32/MPEG-2 (poly 0x04C11DB7, init ~0, no reflection, no xorout) of "123456789".
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
    }

    #[test]
    fn incompat_check_names_unknown_and_fast_commit() {
        assert!(check_incompat(INCOMPAT_SUPPORTED).is_ok());
        let e = check_incompat(INCOMPAT_FAST_COMMIT | 0x400).unwrap_err();
        assert!(e.contains("journal_fast_commit"), "{e}");
        assert!(e.contains("0x400"), "{e}");
    }

    #[test]
    fn block_tail_set_then_verify() {
        let mut b = vec![7u8; 1024];
        block_tail_set(0x1234, &mut b);
        assert!(block_tail_verify(0x1234, &b, "t").is_ok());
        b[100] ^= 1;
        assert!(block_tail_verify(0x1234, &b, "t").is_err());
    }

    proptest::proptest! {
        /// Goal: no parser panics on arbitrary bytes (STYLE §1). Method: random buffers of
        /// random length through every parser and tag format.
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
                               magic in proptest::prelude::any::<bool>(),
                               kind in 0u32..7, fmt in 0usize..6) {
            let mut b = bytes;
            if magic && b.len() >= 12 {
                put_be32(&mut b, 0, JBD2_MAGIC);
                put_be32(&mut b, 4, kind);
            }
            let formats = [(CsumVersion::V3, true), (CsumVersion::V3, false), (CsumVersion::V2, true),
                           (CsumVersion::V2, false), (CsumVersion::None, true), (CsumVersion::None, false)];
            let (csum, bits64) = formats[fmt];
            let format = TagFormat { csum, bits64 };
            let _ = BlockHeader::parse(&b);
            let _ = JournalSuperblock::parse(&b);
            let _ = DescriptorBlock::parse(&b, format);
            let _ = CommitBlock::parse(&b);
            let _ = RevokeBlock::parse(&b, format);
            let _ = block_tail_verify(1, &b, "x");
            let _ = commit::verify_csum_v2v3(1, &b);
        }
    }
}
