//! jbd2 journal superblock (1024 bytes, **big-endian**). Source: journal.rst "Super Block",
//! include/linux/jbd2.h `journal_superblock_t`.
//!
//! ```text
//! 0x000 header (12)            h_blocktype 3 (v1) or 4 (v2), h_sequence unused
//! 0x00C s_blocksize      u32   journal block size
//! 0x010 s_maxlen         u32   total blocks in the journal
//! 0x014 s_first          u32   first block of log information
//! 0x018 s_sequence       u32   first commit id expected in the log
//! 0x01C s_start          u32   block of the start of the log; 0 = the log is empty (clean)
//! 0x020 s_errno          i32   error value set by jbd2_journal_abort
//! --- fields below exist only in a v2 superblock ---
//! 0x024 s_feature_compat     u32  COMPAT_CHECKSUM = 1
//! 0x028 s_feature_incompat   u32  REVOKE 1, 64BIT 2, ASYNC_COMMIT 4, CSUM_V2 8, CSUM_V3 0x10,
//!                                 FAST_COMMIT 0x20
//! 0x02C s_feature_ro_compat  u32  (none defined)
//! 0x030 s_uuid           [u8;16]  journal UUID (seeds every v2/v3 checksum)
//! 0x040 s_nr_users       u32   number of file systems sharing the journal
//! 0x044 s_dynsuper       u32   unused
//! 0x048 s_max_transaction  u32 limit of journal blocks per transaction (unused by the kernel)
//! 0x04C s_max_trans_data   u32 limit of data blocks per transaction (unused)
//! 0x050 s_checksum_type  u8    4 = crc32c (v2/v3)
//! 0x051 s_padding2       [u8;3]
//! 0x054 s_num_fc_blks    u32   fast-commit blocks (0 = default 256 when FAST_COMMIT is set)
//! 0x058 s_head           u32   block of the log head (written by kernels >= 6.4 on unmount)
//! 0x05C s_padding        [u32;40]
//! 0x0FC s_checksum       u32   crc32c(~0, the 1024 bytes with this field zeroed)
//! 0x100 s_users          [u8;16*48]  UUIDs of the file systems sharing the journal
//! ```
//!
//! Invariants: `parse` verifies the checksum whenever CSUM_V2 or CSUM_V3 is set; `write`
//! stores a fresh checksum whenever either is set, so a written superblock always parses.

use super::{
    be32, header::HEADER_SIZE, put_be32, BlockHeader, BlockType, CHKSUM_CRC32C, INCOMPAT_CSUM_V2,
    INCOMPAT_CSUM_V3,
};
use crate::error::Corrupt;
use crate::format::crc32c_raw;

/// Size of the journal superblock.
pub const SUPERBLOCK_SIZE: usize = 1024;
const S_BLOCKSIZE: usize = 0x0C;
const S_MAXLEN: usize = 0x10;
const S_FIRST: usize = 0x14;
const S_SEQUENCE: usize = 0x18;
const S_START: usize = 0x1C;
const S_ERRNO: usize = 0x20;
const S_FEATURE_COMPAT: usize = 0x24;
const S_FEATURE_INCOMPAT: usize = 0x28;
const S_FEATURE_RO_COMPAT: usize = 0x2C;
const S_UUID: usize = 0x30;
const S_NR_USERS: usize = 0x40;
const S_DYNSUPER: usize = 0x44;
const S_MAX_TRANSACTION: usize = 0x48;
const S_MAX_TRANS_DATA: usize = 0x4C;
const S_CHECKSUM_TYPE: usize = 0x50;
const S_NUM_FC_BLKS: usize = 0x54;
const S_HEAD: usize = 0x58;
const S_CHECKSUM: usize = 0xFC;
const S_USERS: usize = 0x100;
/// Most users a journal superblock can list.
pub const MAX_USERS: usize = 48;
const _: () = assert!(S_BLOCKSIZE == HEADER_SIZE);
const _: () = assert!(S_USERS + 16 * MAX_USERS == SUPERBLOCK_SIZE);

/// A decoded journal superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSuperblock {
    /// True for a v2 superblock (block type 4); v1 has no feature fields.
    pub v2: bool,
    /// `s_blocksize`.
    pub block_size: u32,
    /// `s_maxlen`: total journal blocks.
    pub len_blocks: u32,
    /// `s_first`: first log block.
    pub first_log_block: u32,
    /// `s_sequence`: first transaction id expected in the log (or the next one, when empty).
    pub sequence: u32,
    /// `s_start`: log block of the oldest live transaction; 0 when the log is empty.
    pub start_block: u32,
    /// `s_errno`.
    pub errno: i32,
    /// `s_feature_compat`.
    pub feature_compat: u32,
    /// `s_feature_incompat`.
    pub feature_incompat: u32,
    /// `s_feature_ro_compat`.
    pub feature_ro_compat: u32,
    /// `s_uuid`.
    pub uuid: [u8; 16],
    /// `s_nr_users`.
    pub nr_users: u32,
    /// `s_dynsuper`.
    pub dynsuper: u32,
    /// `s_max_transaction`.
    pub max_transaction: u32,
    /// `s_max_trans_data`.
    pub max_trans_data: u32,
    /// `s_checksum_type`.
    pub checksum_type: u8,
    /// `s_num_fc_blks`.
    pub num_fc_blocks: u32,
    /// `s_head`.
    pub head_block: u32,
    /// `s_users`: all 48 slots, of which the first `nr_users` are meaningful.
    pub users: [[u8; 16]; MAX_USERS],
}

impl JournalSuperblock {
    /// Decodes and validates a superblock (magic, type, checksum when v2/v3 is on).
    pub fn parse(b: &[u8]) -> Result<JournalSuperblock, Corrupt> {
        if b.len() < SUPERBLOCK_SIZE {
            return Err(Corrupt::new(format!(
                "jbd2 superblock: {} bytes, need {SUPERBLOCK_SIZE}",
                b.len()
            )));
        }
        let b = &b[..SUPERBLOCK_SIZE];
        let header = BlockHeader::parse(b)
            .map_err(|e| Corrupt::new(format!("jbd2 superblock: {}", e.what)))?;
        let v2 = match header.block_type {
            BlockType::SuperblockV1 => false,
            BlockType::SuperblockV2 => true,
            other => {
                return Err(Corrupt::new(format!(
                    "jbd2 superblock: block type {} is not a superblock",
                    other.to_raw()
                )))
            }
        };
        let field = |off: usize| if v2 { be32(b, off) } else { 0 };
        let mut uuid = [0u8; 16];
        let mut users = [[0u8; 16]; MAX_USERS];
        if v2 {
            uuid.copy_from_slice(&b[S_UUID..S_UUID + 16]);
            for (i, user) in users.iter_mut().enumerate() {
                let off = S_USERS + 16 * i;
                user.copy_from_slice(&b[off..off + 16]);
            }
        }
        let sb = JournalSuperblock {
            v2,
            block_size: be32(b, S_BLOCKSIZE),
            len_blocks: be32(b, S_MAXLEN),
            first_log_block: be32(b, S_FIRST),
            sequence: be32(b, S_SEQUENCE),
            start_block: be32(b, S_START),
            errno: i32::from_be_bytes([b[S_ERRNO], b[S_ERRNO + 1], b[S_ERRNO + 2], b[S_ERRNO + 3]]),
            feature_compat: field(S_FEATURE_COMPAT),
            feature_incompat: field(S_FEATURE_INCOMPAT),
            feature_ro_compat: field(S_FEATURE_RO_COMPAT),
            uuid,
            nr_users: field(S_NR_USERS),
            dynsuper: field(S_DYNSUPER),
            max_transaction: field(S_MAX_TRANSACTION),
            max_trans_data: field(S_MAX_TRANS_DATA),
            checksum_type: if v2 { b[S_CHECKSUM_TYPE] } else { 0 },
            num_fc_blocks: field(S_NUM_FC_BLKS),
            head_block: field(S_HEAD),
            users,
        };
        if sb.has_csum_v2_or_v3() {
            if sb.feature_incompat & INCOMPAT_CSUM_V2 != 0
                && sb.feature_incompat & INCOMPAT_CSUM_V3 != 0
            {
                return Err(Corrupt::new(
                    "jbd2 superblock: both checksum v2 and v3 features are set",
                ));
            }
            if sb.checksum_type != CHKSUM_CRC32C {
                return Err(Corrupt::new(format!(
                    "jbd2 superblock: checksum type {} (expected 4 = crc32c)",
                    sb.checksum_type
                )));
            }
            let stored = be32(b, S_CHECKSUM);
            let computed = superblock_csum(b);
            if stored != computed {
                return Err(Corrupt::new(format!(
                    "jbd2 superblock: checksum {stored:#010x} does not match computed \
                     {computed:#010x}"
                )));
            }
        }
        if sb.block_size < 1024 || !sb.block_size.is_power_of_two() || sb.block_size > 65536 {
            return Err(Corrupt::new(format!(
                "jbd2 superblock: block size {} is not a power of two in 1024..=65536",
                sb.block_size
            )));
        }
        if sb.first_log_block == 0 || sb.first_log_block >= sb.len_blocks {
            return Err(Corrupt::new(format!(
                "jbd2 superblock: s_first {} outside 1..s_maxlen ({})",
                sb.first_log_block, sb.len_blocks
            )));
        }
        if sb.start_block != 0
            && (sb.start_block < sb.first_log_block || sb.start_block >= sb.len_blocks)
        {
            return Err(Corrupt::new(format!(
                "jbd2 superblock: s_start {} outside the log [{}, {})",
                sb.start_block, sb.first_log_block, sb.len_blocks
            )));
        }
        Ok(sb)
    }

    /// Encodes the superblock into the first 1024 bytes of `b`, with its checksum when v2/v3
    /// is on. Reserved bytes are written as zeros.
    pub fn write(&self, b: &mut [u8]) {
        let b = &mut b[..SUPERBLOCK_SIZE];
        b.fill(0);
        let block_type = if self.v2 {
            BlockType::SuperblockV2
        } else {
            BlockType::SuperblockV1
        };
        BlockHeader {
            block_type,
            sequence: 0,
        }
        .write(b);
        put_be32(b, S_BLOCKSIZE, self.block_size);
        put_be32(b, S_MAXLEN, self.len_blocks);
        put_be32(b, S_FIRST, self.first_log_block);
        put_be32(b, S_SEQUENCE, self.sequence);
        put_be32(b, S_START, self.start_block);
        b[S_ERRNO..S_ERRNO + 4].copy_from_slice(&self.errno.to_be_bytes());
        if !self.v2 {
            return;
        }
        put_be32(b, S_FEATURE_COMPAT, self.feature_compat);
        put_be32(b, S_FEATURE_INCOMPAT, self.feature_incompat);
        put_be32(b, S_FEATURE_RO_COMPAT, self.feature_ro_compat);
        b[S_UUID..S_UUID + 16].copy_from_slice(&self.uuid);
        put_be32(b, S_NR_USERS, self.nr_users);
        put_be32(b, S_DYNSUPER, self.dynsuper);
        put_be32(b, S_MAX_TRANSACTION, self.max_transaction);
        put_be32(b, S_MAX_TRANS_DATA, self.max_trans_data);
        b[S_CHECKSUM_TYPE] = self.checksum_type;
        put_be32(b, S_NUM_FC_BLKS, self.num_fc_blocks);
        put_be32(b, S_HEAD, self.head_block);
        for (i, user) in self.users.iter().enumerate() {
            let off = S_USERS + 16 * i;
            b[off..off + 16].copy_from_slice(user);
        }
        if self.has_csum_v2_or_v3() {
            let csum = superblock_csum(b);
            put_be32(b, S_CHECKSUM, csum);
        }
    }

    /// True when the superblock (and every block of the log) carries crc32c checksums.
    pub fn has_csum_v2_or_v3(&self) -> bool {
        self.feature_incompat & (INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3) != 0
    }

    /// The meaningful entries of `s_users` (at most 48).
    pub fn user_uuids(&self) -> &[[u8; 16]] {
        let n = usize::try_from(self.nr_users)
            .unwrap_or(MAX_USERS)
            .min(MAX_USERS);
        &self.users[..n]
    }
}

/// crc32c(~0, superblock with s_checksum zeroed) (kernel `jbd2_superblock_csum`).
fn superblock_csum(b: &[u8]) -> u32 {
    let c = crc32c_raw(!0, &b[..S_CHECKSUM]);
    let c = crc32c_raw(c, &[0u8; 4]);
    crc32c_raw(c, &b[S_CHECKSUM + 4..SUPERBLOCK_SIZE])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::jbd2::{INCOMPAT_64BIT, INCOMPAT_REVOKE};

    /// A v2 superblock with checksum v3, as the kernel leaves one after mounting a
    /// metadata_csum file system.
    pub(crate) fn sample() -> JournalSuperblock {
        let mut users = [[0u8; 16]; MAX_USERS];
        users[0] = [0xAB; 16];
        JournalSuperblock {
            v2: true,
            block_size: 4096,
            len_blocks: 1024,
            first_log_block: 1,
            sequence: 7,
            start_block: 0,
            errno: -5,
            feature_compat: 0,
            feature_incompat: INCOMPAT_REVOKE | INCOMPAT_64BIT | INCOMPAT_CSUM_V3,
            feature_ro_compat: 0,
            uuid: [0x11; 16],
            nr_users: 1,
            dynsuper: 0,
            max_transaction: 0,
            max_trans_data: 0,
            checksum_type: CHKSUM_CRC32C,
            num_fc_blocks: 0,
            head_block: 33,
            users,
        }
    }

    #[test]
    fn round_trip_v2_with_checksum() {
        let sb = sample();
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        sb.write(&mut b);
        assert_eq!(&b[0..4], &[0xC0, 0x3B, 0x39, 0x98]);
        assert_eq!(&b[0x28..0x2C], &[0, 0, 0, 0x13]);
        assert_eq!(b[0x50], 4);
        assert_eq!(JournalSuperblock::parse(&b).unwrap(), sb);
        assert_eq!(sb.user_uuids(), &[[0xAB; 16]]);
    }

    #[test]
    fn round_trip_without_checksum() {
        let mut sb = sample();
        sb.feature_incompat = INCOMPAT_REVOKE;
        sb.checksum_type = 0;
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        sb.write(&mut b);
        assert_eq!(&b[0xFC..0x100], &[0; 4]);
        assert_eq!(JournalSuperblock::parse(&b).unwrap(), sb);
    }

    #[test]
    fn rejects_bad_magic() {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        sample().write(&mut b);
        b[1] = 0;
        assert!(JournalSuperblock::parse(&b)
            .unwrap_err()
            .what
            .contains("magic"));
    }

    #[test]
    fn rejects_non_superblock_type() {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        sample().write(&mut b);
        b[7] = 1;
        let e = JournalSuperblock::parse(&b).unwrap_err();
        assert!(e.what.contains("not a superblock"), "{e}");
    }

    #[test]
    fn rejects_bad_checksum() {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        sample().write(&mut b);
        b[0x18] ^= 1; // s_sequence changed without updating the checksum
        let e = JournalSuperblock::parse(&b).unwrap_err();
        assert!(e.what.contains("checksum"), "{e}");
    }

    #[test]
    fn rejects_bad_geometry() {
        let mut sb = sample();
        sb.start_block = 5000;
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        sb.write(&mut b);
        assert!(JournalSuperblock::parse(&b)
            .unwrap_err()
            .what
            .contains("s_start"));
        let mut sb = sample();
        sb.first_log_block = 0;
        sb.write(&mut b);
        assert!(JournalSuperblock::parse(&b)
            .unwrap_err()
            .what
            .contains("s_first"));
    }

    #[test]
    fn rejects_short_buffer() {
        assert!(JournalSuperblock::parse(&[0u8; 1023]).is_err());
    }
}
