//! Directory blocks: linear lists of `ext4_dir_entry_2` records, with a 12-byte checksum tail
//! when `metadata_csum` is on. Hashed (htree) directories keep their index in blocks that look
//! like one empty record to a linear reader; tidefs reads those linearly and, before changing
//! such a directory, rewrites the index blocks as plain empty blocks (see [`is_index_block`]).
//!
//! Layout of a record:
//! ```text
//! 0x0 inode u32 (0 = unused) | 0x4 rec_len u16 (to the next record, multiple of 4)
//! 0x6 name_len u8 | 0x7 file_type u8 | 0x8 name [name_len], padded to 4 bytes
//! ```
//! Checksum tail (last 12 bytes of the block): inode 0, rec_len 12, name_len 0,
//! file_type 0xDE, then det_checksum u32 = crc32c(inode seed, block bytes before the tail).
//! htree root (block 0): "." (rec_len 12), ".." (rec_len = block size - 12), then at 0x18
//! dx_root_info {reserved u32, hash_version u8, info_length u8 (8), indirect_levels u8, flags u8}.
//! htree node: one record with inode 0 and rec_len = block size, then dx entries.
//! dx entries start with a count/limit header: at 0x20 in the root (after dx_root_info), at 0x8
//! in a node: limit u16 | count u16 | block u32, then (hash u32, block u32) pairs. With
//! `metadata_csum` a dx_tail follows the `limit` entries: dt_reserved u32 | dt_checksum u32 =
//! crc32c(inode seed, block bytes up to the end of the `count` entries, dt_reserved, 4 zero
//! bytes) (kernel `ext4_dx_csum`).

use crate::error::Corrupt;
use crate::format::{crc32c_raw, le16, le32, put_le16, put_le32};

/// Size of the checksum tail.
pub const TAIL_SIZE: usize = 12;
const TAIL_FT: u8 = 0xDE;
/// Longest name.
pub const NAME_MAX: usize = 255;

/// `file_type` values of directory records.
pub mod ft {
    /// Unknown.
    pub const UNKNOWN: u8 = 0;
    /// Regular file.
    pub const REG: u8 = 1;
    /// Directory.
    pub const DIR: u8 = 2;
    /// Character device.
    pub const CHR: u8 = 3;
    /// Block device.
    pub const BLK: u8 = 4;
    /// Fifo.
    pub const FIFO: u8 = 5;
    /// Socket.
    pub const SOCK: u8 = 6;
    /// Symbolic link.
    pub const SYMLINK: u8 = 7;
}

/// One record of a directory block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirRecord {
    /// Byte offset of the record in its block.
    pub offset: usize,
    /// Inode (0 for an unused record).
    pub inode: u32,
    /// Length of the record.
    pub rec_len: usize,
    /// File type.
    pub file_type: u8,
    /// Name.
    pub name: Vec<u8>,
}

/// Space a record with a name of `name_len` bytes needs.
pub fn rec_size(name_len: usize) -> usize {
    (8 + name_len + 3) & !3
}

fn rec_len_from_disk(v: u16, block_size: usize) -> usize {
    if v == 0 || v == 0xFFFF {
        block_size.min(65536)
    } else {
        usize::from(v)
    }
}

fn rec_len_to_disk(len: usize) -> u16 {
    if len >= 65536 {
        0xFFFF
    } else {
        // Checked just above.
        len as u16
    }
}

/// Bytes of `block` that hold records (all of it, less the tail when checksums are on).
pub fn records_end(block_size: usize, csum: bool) -> usize {
    if csum {
        block_size - TAIL_SIZE
    } else {
        block_size
    }
}

/// Parses every record of a directory block covering `[0, end)`; rejects records that overrun,
/// are misaligned or too short for their names.
pub fn parse_block(block: &[u8], end: usize) -> Result<Vec<DirRecord>, Corrupt> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < end {
        if off + 8 > end {
            return Err(Corrupt::new(format!(
                "directory record at {off} is truncated"
            )));
        }
        let inode = le32(block, off);
        let rec_len = rec_len_from_disk(le16(block, off + 4), block.len());
        let name_len = usize::from(block[off + 6]);
        if rec_len < 8 || rec_len % 4 != 0 || off + rec_len > end || rec_size(name_len) > rec_len {
            return Err(Corrupt::new(format!(
                "directory record at {off} has invalid length {rec_len} (name {name_len})"
            )));
        }
        out.push(DirRecord {
            offset: off,
            inode,
            rec_len,
            file_type: block[off + 7],
            name: block[off + 8..off + 8 + name_len].to_vec(),
        });
        off += rec_len;
    }
    Ok(out)
}

/// Writes one record header and name at `offset` (the record keeps `rec_len`).
pub fn write_record(
    block: &mut [u8],
    offset: usize,
    inode: u32,
    rec_len: usize,
    file_type: u8,
    name: &[u8],
) {
    put_le32(block, offset, inode);
    put_le16(block, offset + 4, rec_len_to_disk(rec_len));
    // Names are at most 255 bytes; callers check.
    block[offset + 6] = name.len() as u8;
    block[offset + 7] = file_type;
    block[offset + 8..offset + 8 + name.len()].copy_from_slice(name);
    let pad_end = offset + rec_size(name.len());
    block[offset + 8 + name.len()..pad_end].fill(0);
}

/// Initialises an empty directory block: one unused record spanning it, plus the tail.
pub fn init_empty_block(block: &mut [u8], csum: bool) {
    block.fill(0);
    let end = records_end(block.len(), csum);
    write_record(block, 0, 0, end, 0, &[]);
    if csum {
        init_tail(block);
    }
}

/// Writes the tail record (checksum still to be set).
pub fn init_tail(block: &mut [u8]) {
    let t = block.len() - TAIL_SIZE;
    block[t..].fill(0);
    put_le16(block, t + 4, TAIL_SIZE as u16);
    block[t + 7] = TAIL_FT;
}

/// Whether the block ends in a valid-looking checksum tail.
pub fn has_tail(block: &[u8]) -> bool {
    let t = block.len() - TAIL_SIZE;
    le32(block, t) == 0
        && le16(block, t + 4) == TAIL_SIZE as u16
        && block[t + 6] == 0
        && block[t + 7] == TAIL_FT
}

/// Stores the tail checksum.
pub fn set_tail_checksum(block: &mut [u8], inode_seed: u32) {
    let t = block.len() - TAIL_SIZE;
    let c = crc32c_raw(inode_seed, &block[..t]);
    put_le32(block, t + 8, c);
}

/// Checks the tail checksum.
pub fn verify_tail_checksum(block: &[u8], inode_seed: u32) -> Result<(), Corrupt> {
    if !has_tail(block) {
        return Err(Corrupt::new("directory block has no checksum tail"));
    }
    let t = block.len() - TAIL_SIZE;
    let stored = le32(block, t + 8);
    let computed = crc32c_raw(inode_seed, &block[..t]);
    if stored != computed {
        return Err(Corrupt::new(format!(
            "directory block checksum mismatch (stored {stored:#x}, computed {computed:#x})"
        )));
    }
    Ok(())
}

/// Offset of the count/limit header of an htree index block (the kernel's
/// `get_dx_countlimit`), or `None` when the block is neither a dx root nor a dx node.
fn dx_countlimit_offset(block: &[u8]) -> Option<usize> {
    let bs = block.len();
    if bs < 40 {
        return None;
    }
    let first = rec_len_from_disk(le16(block, 4), bs);
    if first == bs {
        return Some(8);
    }
    let info_length = block[0x18 + 5];
    if first == 12
        && rec_len_from_disk(le16(block, 12 + 4), bs) == bs - 12
        && le32(block, 0x18) == 0
        && info_length == 8
    {
        return Some(0x20);
    }
    None
}

/// Verifies the dx_tail checksum of an htree index block (root or node).
pub fn verify_dx_checksum(block: &[u8], inode_seed: u32) -> Result<(), Corrupt> {
    let Some(at) = dx_countlimit_offset(block) else {
        return Err(Corrupt::new("htree index block has no count/limit header"));
    };
    let limit = usize::from(le16(block, at));
    let count = usize::from(le16(block, at + 2));
    let tail = at + limit * 8;
    if count > limit || tail + 8 > block.len() {
        return Err(Corrupt::new(format!(
            "htree index block count {count} / limit {limit} leave no room for its checksum"
        )));
    }
    let mut c = crc32c_raw(inode_seed, &block[..at + count * 8]);
    c = crc32c_raw(c, &block[tail..tail + 4]);
    c = crc32c_raw(c, &[0; 4]);
    let stored = le32(block, tail + 4);
    if stored != c {
        return Err(Corrupt::new(format!(
            "htree index block checksum mismatch (stored {stored:#x}, computed {c:#x})"
        )));
    }
    Ok(())
}

/// Whether `block` (logical block `index` of a directory with the htree flag) is an htree index
/// block rather than a block of records: the root is block 0; interior nodes are one unused
/// record spanning the whole block.
pub fn is_index_block(block: &[u8], index: u64) -> bool {
    if index == 0 {
        return true;
    }
    le32(block, 0) == 0 && rec_len_from_disk(le16(block, 4), block.len()) == block.len()
}

/// Rewrites the htree root block 0 as a plain block holding "." and ".." only.
pub fn htree_root_to_linear(block: &mut [u8], self_ino: u32, parent_ino: u32, csum: bool) {
    block.fill(0);
    write_record(block, 0, self_ino, 12, ft::DIR, b".");
    let end = records_end(block.len(), csum);
    write_record(block, 12, parent_ino, end - 12, ft::DIR, b"..");
    if csum {
        init_tail(block);
    }
}

/// Whether `b` is "." or "..".
pub fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_parse_and_checksum() {
        let mut b = vec![0u8; 4096];
        init_empty_block(&mut b, true);
        write_record(&mut b, 0, 2, 12, ft::DIR, b".");
        write_record(&mut b, 12, 2, 4096 - 12 - 12, ft::DIR, b"..");
        set_tail_checksum(&mut b, 9);
        verify_tail_checksum(&b, 9).unwrap();
        let recs = parse_block(&b, records_end(4096, true)).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].name, b"..");
        assert_eq!(recs[1].rec_len, 4072);
        b[13] ^= 1;
        assert!(verify_tail_checksum(&b, 9).is_err());
    }

    #[test]
    fn rejects_overrunning_and_short_records() {
        let mut b = vec![0u8; 1024];
        write_record(&mut b, 0, 5, 2048, ft::REG, b"x");
        assert!(parse_block(&b, 1024).is_err());
        write_record(&mut b, 0, 5, 8, ft::REG, b"");
        b[6] = 10;
        assert!(parse_block(&b, 1024).is_err());
        let mut z = vec![0u8; 1024];
        put_le16(&mut z, 4, 6);
        assert!(parse_block(&z, 1024).is_err());
    }

    #[test]
    fn record_sizes() {
        assert_eq!(rec_size(1), 12);
        assert_eq!(rec_size(4), 12);
        assert_eq!(rec_size(5), 16);
        assert_eq!(rec_size(255), 264);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 12..600)) {
            let end = bytes.len();
            let _ = parse_block(&bytes, end);
        }
    }
}
