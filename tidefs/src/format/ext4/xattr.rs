//! Extended attributes: stored inside the inode after its extra part, and in one external block
//! named by `i_file_acl`.
//!
//! Layout:
//! ```text
//! in-inode area: h_magic u32 (0xEA020000), then entries; value offsets count from the first entry
//! block header (32 bytes): 0x00 h_magic u32 | 0x04 h_refcount u32 | 0x08 h_blocks u32 (1)
//!                          0x0C h_hash u32 | 0x10 h_checksum u32 | 0x14 reserved [12]
//!                          entries from 0x20; value offsets count from the block start
//! entry (16 + name, padded to 4): 0x0 e_name_len u8 | 0x1 e_name_index u8 | 0x2 e_value_offs u16
//!                          0x4 e_value_inum u32 (0: value inline) | 0x8 e_value_size u32
//!                          0xC e_hash u32 | 0x10 name
//! the entry list ends with 4 zero bytes; values sit at the end of the space, each padded to 4
//! block checksum: crc32c(fs seed, le64 block number, block with h_checksum zeroed)
//! ```
//! Name indexes: 1 "user.", 2 "system.posix_acl_access", 3 "system.posix_acl_default",
//! 4 "trusted.", 6 "security.", 7 "system.", 8 "system.richacl".

use crate::error::Corrupt;
use crate::format::{crc32c_raw, le16, le32, put_le16, put_le32};

/// Magic of the in-inode area and of xattr blocks.
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Size of the block header.
pub const BLOCK_HEADER_SIZE: usize = 32;
const ENTRY_HEADER_SIZE: usize = 16;
const H_REFCOUNT: usize = 0x04;
const H_BLOCKS: usize = 0x08;
const H_HASH: usize = 0x0C;
const H_CHECKSUM: usize = 0x10;

/// Namespace index of `security.` attributes.
pub const INDEX_SECURITY: u8 = 6;

/// One attribute with its namespace index and the name without prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xattr {
    /// Namespace index.
    pub index: u8,
    /// Name without the namespace prefix.
    pub name: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
}

const PREFIXES: &[(u8, &[u8])] = &[
    (2, b"system.posix_acl_access"),
    (3, b"system.posix_acl_default"),
    (8, b"system.richacl"),
    (1, b"user."),
    (4, b"trusted."),
    (INDEX_SECURITY, b"security."),
    (7, b"system."),
];

/// Splits a full attribute name into (index, suffix); `None` for an unknown namespace.
pub fn split_name(full: &[u8]) -> Option<(u8, &[u8])> {
    PREFIXES
        .iter()
        .find(|(_, p)| full.starts_with(p))
        .map(|(i, p)| (*i, &full[p.len()..]))
}

/// The full name of an attribute (prefix + suffix); unknown indexes get no prefix.
pub fn full_name(index: u8, name: &[u8]) -> Vec<u8> {
    let mut out = PREFIXES
        .iter()
        .find(|(i, _)| *i == index)
        .map(|(_, p)| p.to_vec())
        .unwrap_or_default();
    out.extend_from_slice(name);
    out
}

fn entry_size(name_len: usize) -> usize {
    (ENTRY_HEADER_SIZE + name_len + 3) & !3
}

fn value_size(len: usize) -> usize {
    (len + 3) & !3
}

/// The kernel's entry hash (name bytes, then value words for values stored in place).
pub fn entry_hash(name: &[u8], value: &[u8]) -> u32 {
    let mut hash: u32 = 0;
    for &c in name {
        hash = (hash << 5) ^ (hash >> 27) ^ u32::from(c);
    }
    let mut padded = value.to_vec();
    padded.resize(value_size(value.len()), 0);
    for w in padded.chunks_exact(4) {
        hash = (hash << 16) ^ (hash >> 16) ^ le32(w, 0);
    }
    hash
}

fn block_hash(entry_hashes: &[u32]) -> u32 {
    let mut hash: u32 = 0;
    for &h in entry_hashes {
        if h == 0 {
            return 0;
        }
        hash = (hash << 16) ^ (hash >> 16) ^ h;
    }
    hash
}

/// Parses the entries of an area. `entries_at` is where entries start; `values_base` is what
/// value offsets count from.
fn parse_entries(
    area: &[u8],
    entries_at: usize,
    values_base: usize,
) -> Result<Vec<Xattr>, Corrupt> {
    let mut out = Vec::new();
    let mut off = entries_at;
    loop {
        if off + 4 > area.len() {
            return Err(Corrupt::new("xattr entry list runs past its area"));
        }
        if le32(area, off) == 0 {
            break;
        }
        if off + ENTRY_HEADER_SIZE > area.len() {
            return Err(Corrupt::new("xattr entry is truncated"));
        }
        let name_len = usize::from(area[off]);
        let index = area[off + 1];
        let value_offs = usize::from(le16(area, off + 2));
        let value_inum = le32(area, off + 4);
        let value_len = usize::try_from(le32(area, off + 8)).unwrap_or(usize::MAX);
        if off + entry_size(name_len) > area.len() {
            return Err(Corrupt::new("xattr name runs past its area"));
        }
        if value_inum != 0 {
            return Err(Corrupt::new(
                "xattr value stored in an inode (ea_inode) is not supported",
            ));
        }
        let vstart = values_base + value_offs;
        if vstart > area.len() || value_len > area.len() - vstart {
            return Err(Corrupt::new("xattr value runs past its area"));
        }
        out.push(Xattr {
            index,
            name: area[off + ENTRY_HEADER_SIZE..off + ENTRY_HEADER_SIZE + name_len].to_vec(),
            value: area[vstart..vstart + value_len].to_vec(),
        });
        off += entry_size(name_len);
    }
    Ok(out)
}

/// Bytes an attribute set needs in an area (entries + terminator + values).
pub fn space_needed(attrs: &[Xattr]) -> usize {
    attrs
        .iter()
        .map(|a| entry_size(a.name.len()) + value_size(a.value.len()))
        .sum::<usize>()
        + 4
}

/// Writes entries and values into `area[entries_at..]`; values are packed from the end.
/// Returns each entry's hash. The caller has checked that the set fits.
fn write_entries(
    area: &mut [u8],
    entries_at: usize,
    values_base: usize,
    attrs: &[Xattr],
) -> Vec<u32> {
    area[entries_at..].fill(0);
    let mut off = entries_at;
    let mut vend = area.len();
    let mut hashes = Vec::with_capacity(attrs.len());
    for a in attrs {
        let vlen = value_size(a.value.len());
        vend -= vlen;
        area[vend..vend + a.value.len()].copy_from_slice(&a.value);
        let h = entry_hash(&a.name, &a.value);
        hashes.push(h);
        // Names are at most 255 bytes and offsets below 64 KiB; callers check both.
        area[off] = a.name.len() as u8;
        area[off + 1] = a.index;
        put_le16(area, off + 2, (vend - values_base) as u16);
        put_le32(area, off + 4, 0);
        put_le32(area, off + 8, a.value.len() as u32);
        put_le32(area, off + 12, h);
        area[off + ENTRY_HEADER_SIZE..off + ENTRY_HEADER_SIZE + a.name.len()]
            .copy_from_slice(&a.name);
        off += entry_size(a.name.len());
    }
    hashes
}

/// Parses the in-inode area (empty when it does not start with the magic).
pub fn parse_inode_area(area: &[u8]) -> Result<Vec<Xattr>, Corrupt> {
    if area.len() < 4 || le32(area, 0) != XATTR_MAGIC {
        return Ok(Vec::new());
    }
    parse_entries(area, 4, 4)
}

/// Whether `attrs` fit in an in-inode area of `len` bytes.
pub fn fits_in_inode(attrs: &[Xattr], len: usize) -> bool {
    attrs.is_empty() || len >= 4 + space_needed(attrs)
}

/// Writes `attrs` into the in-inode area (clears it when empty).
pub fn write_inode_area(area: &mut [u8], attrs: &[Xattr]) {
    area.fill(0);
    if attrs.is_empty() || area.len() < 4 {
        return;
    }
    put_le32(area, 0, XATTR_MAGIC);
    write_entries(area, 4, 4, attrs);
}

/// Parses an xattr block, checking its magic, block count and (with `seed`) checksum.
pub fn parse_block(block: &[u8], seed: Option<u32>, block_nr: u64) -> Result<Vec<Xattr>, Corrupt> {
    if block.len() < BLOCK_HEADER_SIZE + 4 || le32(block, 0) != XATTR_MAGIC {
        return Err(Corrupt::new(format!("xattr block {block_nr}: bad magic")));
    }
    if le32(block, H_BLOCKS) != 1 {
        return Err(Corrupt::new(format!(
            "xattr block {block_nr}: h_blocks is not 1"
        )));
    }
    if let Some(seed) = seed {
        let stored = le32(block, H_CHECKSUM);
        let computed = block_checksum(block, seed, block_nr);
        if stored != computed {
            return Err(Corrupt::new(format!(
                "xattr block {block_nr}: checksum mismatch (stored {stored:#x}, computed {computed:#x})"
            )));
        }
    }
    parse_entries(block, BLOCK_HEADER_SIZE, 0)
}

/// Reference count of an xattr block (blocks may be shared between inodes).
pub fn block_refcount(block: &[u8]) -> u32 {
    le32(block, H_REFCOUNT)
}

/// Whether `attrs` fit in an xattr block of `len` bytes.
pub fn fits_in_block(attrs: &[Xattr], len: usize) -> bool {
    len >= BLOCK_HEADER_SIZE + space_needed(attrs)
}

/// Writes a complete xattr block with reference count 1, its hash and checksum.
pub fn write_block(block: &mut [u8], attrs: &[Xattr], seed: Option<u32>, block_nr: u64) {
    block.fill(0);
    put_le32(block, 0, XATTR_MAGIC);
    put_le32(block, H_REFCOUNT, 1);
    put_le32(block, H_BLOCKS, 1);
    // The kernel keeps block entries sorted by (index, name length, name).
    let mut sorted = attrs.to_vec();
    sorted.sort_by(|a, b| (a.index, a.name.len(), &a.name).cmp(&(b.index, b.name.len(), &b.name)));
    let hashes = write_entries(block, BLOCK_HEADER_SIZE, 0, &sorted);
    put_le32(block, H_HASH, block_hash(&hashes));
    if let Some(seed) = seed {
        let c = block_checksum(block, seed, block_nr);
        put_le32(block, H_CHECKSUM, c);
    }
}

/// Sets the reference count of an xattr block and re-seals its checksum.
pub fn set_block_refcount(block: &mut [u8], refs: u32, seed: Option<u32>, block_nr: u64) {
    put_le32(block, H_REFCOUNT, refs);
    if let Some(seed) = seed {
        let c = block_checksum(block, seed, block_nr);
        put_le32(block, H_CHECKSUM, c);
    }
}

fn block_checksum(block: &[u8], seed: u32, block_nr: u64) -> u32 {
    let mut copy = block.to_vec();
    put_le32(&mut copy, H_CHECKSUM, 0);
    let c = crc32c_raw(seed, &block_nr.to_le_bytes());
    crc32c_raw(c, &copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> Vec<Xattr> {
        vec![
            Xattr {
                index: 1,
                name: b"color".to_vec(),
                value: b"blue".to_vec(),
            },
            Xattr {
                index: 6,
                name: b"selinux".to_vec(),
                value: b"ctx\0".to_vec(),
            },
            Xattr {
                index: 4,
                name: b"t".to_vec(),
                value: vec![],
            },
        ]
    }

    #[test]
    fn names_split_and_join() {
        assert_eq!(split_name(b"user.a"), Some((1, &b"a"[..])));
        assert_eq!(split_name(b"system.posix_acl_access"), Some((2, &b""[..])));
        assert_eq!(split_name(b"other.a"), None);
        assert_eq!(full_name(6, b"x"), b"security.x");
    }

    #[test]
    fn inode_area_round_trip() {
        let mut area = vec![0u8; 96];
        assert!(fits_in_inode(&attrs(), area.len()));
        write_inode_area(&mut area, &attrs());
        assert_eq!(parse_inode_area(&area).unwrap(), attrs());
        write_inode_area(&mut area, &[]);
        assert!(parse_inode_area(&area).unwrap().is_empty());
    }

    #[test]
    fn block_round_trip_and_checksum() {
        let mut b = vec![0u8; 4096];
        write_block(&mut b, &attrs(), Some(7), 1234);
        let mut got = parse_block(&b, Some(7), 1234).unwrap();
        let mut want = attrs();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(got, want);
        assert!(parse_block(&b, Some(7), 1235).is_err());
        set_block_refcount(&mut b, 3, Some(7), 1234);
        assert_eq!(block_refcount(&b), 3);
        assert!(parse_block(&b, Some(7), 1234).is_ok());
        b[3] = 0;
        assert!(parse_block(&b, None, 1234)
            .unwrap_err()
            .what
            .contains("magic"));
    }

    #[test]
    fn rejects_value_out_of_area() {
        let mut area = vec![0u8; 64];
        write_inode_area(&mut area, &attrs()[..1]);
        put_le32(&mut area, 4 + 8, 1000);
        assert!(parse_inode_area(&area).is_err());
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse_inode_area(&bytes);
            let _ = parse_block(&bytes, None, 0);
        }
    }
}
