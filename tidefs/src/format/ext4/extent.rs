//! Extent-tree nodes: the root lives in `i_block` (60 bytes, up to 4 entries), the other nodes
//! in whole blocks followed by a 4-byte checksum tail.
//!
//! Layout of a node:
//! ```text
//! header (12 bytes): 0x0 eh_magic u16 (0xF30A) | 0x2 eh_entries u16 | 0x4 eh_max u16
//!                    0x6 eh_depth u16 (0 = leaf) | 0x8 eh_generation u32
//! leaf entry (12):   0x0 ee_block u32 (first logical block) | 0x4 ee_len u16 (> 32768 means
//!                    unwritten, length ee_len - 32768) | 0x6 ee_start_hi u16 | 0x8 ee_start_lo u32
//! index entry (12):  0x0 ei_block u32 | 0x4 ei_leaf_lo u32 | 0x8 ei_leaf_hi u16 | 0xA unused u16
//! tail (blocks only, right after eh_max entries): et_checksum u32 =
//!                    crc32c(inode seed, node bytes before the tail)
//! ```

use crate::error::Corrupt;
use crate::format::{crc32c_raw, le16, le32, put_le16, put_le32};

/// Node magic.
pub const EXTENT_MAGIC: u16 = 0xF30A;
/// Size of the header and of each entry.
pub const ENTRY_SIZE: usize = 12;
/// Longest initialised extent.
pub const MAX_INIT_LEN: u32 = 32768;
/// Longest unwritten extent.
pub const MAX_UNWRITTEN_LEN: u32 = 32767;
/// Deepest tree the kernel accepts.
pub const MAX_DEPTH: u16 = 5;

/// A mapping of logical blocks to physical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First logical block.
    pub logical: u32,
    /// Number of blocks.
    pub len: u32,
    /// First physical block.
    pub physical: u64,
    /// Allocated but not written: reads as zeros.
    pub unwritten: bool,
}

impl Extent {
    /// One past the last logical block.
    pub fn logical_end(&self) -> u64 {
        u64::from(self.logical) + u64::from(self.len)
    }
}

/// An index entry: the subtree at `child` covers logical blocks from `logical` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentIndex {
    /// First logical block covered.
    pub logical: u32,
    /// Block of the child node.
    pub child: u64,
}

/// A decoded node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtentNode {
    /// Depth 0: extents.
    Leaf(Vec<Extent>),
    /// Depth > 0: index entries.
    Index {
        /// Depth of this node.
        depth: u16,
        /// Children in logical order.
        entries: Vec<ExtentIndex>,
    },
}

/// Capacity of a node of `len` bytes (4 in the inode, (block size - 12) / 12 in a block).
pub fn node_capacity(len: usize) -> usize {
    (len - ENTRY_SIZE) / ENTRY_SIZE
}

/// Decodes a node. `buf` is `i_block` or a whole tree block.
pub fn parse_node(buf: &[u8]) -> Result<ExtentNode, Corrupt> {
    if buf.len() < ENTRY_SIZE {
        return Err(Corrupt::new("extent node is truncated"));
    }
    let magic = le16(buf, 0);
    if magic != EXTENT_MAGIC {
        return Err(Corrupt::new(format!(
            "bad extent header magic {magic:#06x}"
        )));
    }
    let entries = usize::from(le16(buf, 2));
    let max = usize::from(le16(buf, 4));
    let depth = le16(buf, 6);
    if max > node_capacity(buf.len()) || entries > max {
        return Err(Corrupt::new(format!(
            "extent header counts invalid (entries {entries}, max {max})"
        )));
    }
    if depth > MAX_DEPTH {
        return Err(Corrupt::new(format!("extent tree depth {depth} too large")));
    }
    let at = |i: usize| ENTRY_SIZE * (i + 1);
    if depth == 0 {
        let mut out = Vec::with_capacity(entries);
        for i in 0..entries {
            let o = at(i);
            let raw_len = u32::from(le16(buf, o + 4));
            let (len, unwritten) = if raw_len > MAX_INIT_LEN {
                (raw_len - MAX_INIT_LEN, true)
            } else {
                (raw_len, false)
            };
            let physical = u64::from(le32(buf, o + 8)) | (u64::from(le16(buf, o + 6)) << 32);
            out.push(Extent {
                logical: le32(buf, o),
                len,
                physical,
                unwritten,
            });
        }
        Ok(ExtentNode::Leaf(out))
    } else {
        let mut out = Vec::with_capacity(entries);
        for i in 0..entries {
            let o = at(i);
            out.push(ExtentIndex {
                logical: le32(buf, o),
                child: u64::from(le32(buf, o + 4)) | (u64::from(le16(buf, o + 8)) << 32),
            });
        }
        Ok(ExtentNode::Index {
            depth,
            entries: out,
        })
    }
}

/// Encodes a node into `buf` (`i_block` or a whole block), zeroing unused entry space. The
/// caller stores the tail checksum of a block with [`set_tail_checksum`].
pub fn write_node(node: &ExtentNode, buf: &mut [u8]) {
    let max = node_capacity(buf.len());
    let (count, depth) = match node {
        ExtentNode::Leaf(e) => (e.len(), 0),
        ExtentNode::Index { depth, entries } => (entries.len(), *depth),
    };
    assert!(count <= max, "extent node overflow");
    let end = ENTRY_SIZE * (max + 1);
    buf[..end].fill(0);
    put_le16(buf, 0, EXTENT_MAGIC);
    // count <= max <= 5461 for 64 KiB blocks, so it fits in u16.
    put_le16(buf, 2, count as u16);
    put_le16(buf, 4, max as u16);
    put_le16(buf, 6, depth);
    match node {
        ExtentNode::Leaf(exts) => {
            for (i, e) in exts.iter().enumerate() {
                let o = ENTRY_SIZE * (i + 1);
                assert!(
                    e.len > 0
                        && e.len
                            <= if e.unwritten {
                                MAX_UNWRITTEN_LEN
                            } else {
                                MAX_INIT_LEN
                            }
                );
                put_le32(buf, o, e.logical);
                let raw_len = if e.unwritten {
                    e.len + MAX_INIT_LEN
                } else {
                    e.len
                };
                put_le16(buf, o + 4, raw_len as u16);
                put_le16(buf, o + 6, ((e.physical >> 32) & 0xFFFF) as u16);
                put_le32(buf, o + 8, (e.physical & 0xFFFF_FFFF) as u32);
            }
        }
        ExtentNode::Index { entries, .. } => {
            for (i, x) in entries.iter().enumerate() {
                let o = ENTRY_SIZE * (i + 1);
                put_le32(buf, o, x.logical);
                put_le32(buf, o + 4, (x.child & 0xFFFF_FFFF) as u32);
                put_le16(buf, o + 8, ((x.child >> 32) & 0xFFFF) as u16);
            }
        }
    }
}

fn tail_offset(block: &[u8]) -> usize {
    ENTRY_SIZE * (node_capacity(block.len()) + 1)
}

/// Stores the checksum tail of a tree block.
pub fn set_tail_checksum(block: &mut [u8], inode_seed: u32) {
    let t = tail_offset(block);
    let c = crc32c_raw(inode_seed, &block[..t]);
    put_le32(block, t, c);
}

/// Verifies the checksum tail of a tree block.
pub fn verify_tail_checksum(block: &[u8], inode_seed: u32) -> Result<(), Corrupt> {
    let t = tail_offset(block);
    if t + 4 > block.len() {
        return Err(Corrupt::new("extent block has no room for its checksum"));
    }
    let stored = le32(block, t);
    let computed = crc32c_raw(inode_seed, &block[..t]);
    if stored != computed {
        return Err(Corrupt::new(format!(
            "extent block checksum mismatch (stored {stored:#x}, computed {computed:#x})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_round_trip_in_inode() {
        let node = ExtentNode::Leaf(vec![
            Extent {
                logical: 0,
                len: 10,
                physical: 1 << 33,
                unwritten: false,
            },
            Extent {
                logical: 100,
                len: 5,
                physical: 77,
                unwritten: true,
            },
        ]);
        let mut buf = [0u8; 60];
        write_node(&node, &mut buf);
        assert_eq!(le16(&buf, 4), 4);
        assert_eq!(parse_node(&buf).unwrap(), node);
    }

    #[test]
    fn index_block_round_trip_with_checksum() {
        let node = ExtentNode::Index {
            depth: 1,
            entries: vec![
                ExtentIndex {
                    logical: 0,
                    child: 9,
                },
                ExtentIndex {
                    logical: 50,
                    child: 1 << 40,
                },
            ],
        };
        let mut buf = vec![0u8; 4096];
        write_node(&node, &mut buf);
        set_tail_checksum(&mut buf, 5);
        verify_tail_checksum(&buf, 5).unwrap();
        assert_eq!(parse_node(&buf).unwrap(), node);
        buf[20] ^= 1;
        assert!(verify_tail_checksum(&buf, 5).is_err());
    }

    #[test]
    fn rejects_bad_magic_and_counts() {
        let mut buf = [0u8; 60];
        assert!(parse_node(&buf).unwrap_err().what.contains("magic"));
        put_le16(&mut buf, 0, EXTENT_MAGIC);
        put_le16(&mut buf, 2, 5);
        put_le16(&mut buf, 4, 4);
        assert!(parse_node(&buf).is_err());
        put_le16(&mut buf, 2, 1);
        put_le16(&mut buf, 6, 9);
        assert!(parse_node(&buf).is_err());
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse_node(&bytes);
        }
    }
}
