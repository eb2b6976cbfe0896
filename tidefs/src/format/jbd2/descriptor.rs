//! jbd2 descriptor block (**big-endian**): a header, then one tag per logged block, then (under
//! checksum v2/v3) a 4-byte block tail. The data blocks follow the descriptor in the log, in tag
//! order. Source: journal.rst "Descriptor Block", jbd2.h `journal_block_tag3_t`,
//! `journal_block_tag_t`, `journal_tag_bytes()`, recovery.c `count_tags()`.
//!
//! ```text
//! 0x00 header (12)   h_blocktype 1, h_sequence = transaction id
//! 0x0C tags...       each tag, then the 16-byte UUID unless the tag has SAME_UUID
//! bs-4 t_checksum    u32 (v2/v3 only) crc32c(seed, block with this field zeroed)
//!
//! tag3 (CSUM_V3, 16 bytes)            tag (no CSUM_V3; 8, +4 with 64BIT, +2 with CSUM_V2)
//! 0x0 t_blocknr       u32             0x0 t_blocknr       u32
//! 0x4 t_flags         u32             0x4 t_checksum      u16 (CSUM_V2: low 16 bits)
//! 0x8 t_blocknr_high  u32             0x6 t_flags         u16
//! 0xC t_checksum      u32             0x8 t_blocknr_high  u32 (64BIT only)
//!                                     (CSUM_V2 adds 2 bytes after the tag; the kernel's quirk)
//! t_flags: ESCAPE 1 (the block began with the jbd2 magic, zeroed in the log),
//!          SAME_UUID 2 (no UUID follows), DELETED 4, LAST_TAG 8 (last tag of the block).
//! t_checksum: crc32c(crc32c(seed, be32(sequence)), logged block content).
//! ```
//!
//! Invariants: a parsed tag list ends with a LAST_TAG tag that lies wholly inside the block (a
//! list that runs off the end is `Corrupt`); `write` emits exactly the tags and flags it holds.

use super::header::HEADER_SIZE;
use super::{
    be16, be32, put_be16, put_be32, BlockHeader, BlockType, CsumVersion, BLOCK_TAIL_SIZE,
    INCOMPAT_64BIT,
};
use crate::error::Corrupt;

/// Tag flag: the logged copy had its first four bytes (the jbd2 magic) zeroed.
pub const FLAG_ESCAPE: u32 = 1;
/// Tag flag: no UUID follows this tag.
pub const FLAG_SAME_UUID: u32 = 2;
/// Tag flag: block deleted by this transaction (unused by the kernel).
pub const FLAG_DELETED: u32 = 4;
/// Tag flag: last tag of this descriptor block.
pub const FLAG_LAST_TAG: u32 = 8;
/// Size of the UUID that follows a tag without SAME_UUID.
pub const UUID_SIZE: usize = 16;

/// The tag encoding a journal uses, from its feature bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagFormat {
    /// Checksum version (decides tag3 vs. tag, and whether a block tail exists).
    pub csum: CsumVersion,
    /// 64-bit block numbers (`INCOMPAT_64BIT`).
    pub bits64: bool,
}

impl TagFormat {
    /// The format declared by a superblock's incompat bits.
    pub fn from_incompat(incompat: u32) -> TagFormat {
        TagFormat {
            csum: CsumVersion::from_incompat(incompat),
            bits64: incompat & INCOMPAT_64BIT != 0,
        }
    }

    /// Bytes per tag (kernel `journal_tag_bytes`).
    pub fn tag_size(self) -> usize {
        if self.csum == CsumVersion::V3 {
            return 16;
        }
        let mut size = 12;
        if self.csum == CsumVersion::V2 {
            size += 2;
        }
        if self.bits64 {
            size
        } else {
            size - 4
        }
    }

    /// Bytes reserved at the end of descriptor and revoke blocks for the block tail.
    pub fn tail_size(self) -> usize {
        if self.csum.has_tail() {
            BLOCK_TAIL_SIZE
        } else {
            0
        }
    }

    /// How many tags fit in one descriptor block, with the UUID after the first one.
    pub fn tags_per_block(self, block_size: usize) -> usize {
        let room = block_size.saturating_sub(HEADER_SIZE + UUID_SIZE + self.tail_size());
        room / self.tag_size()
    }
}

/// One descriptor tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    /// Home block number on the file-system device (`t_blocknr` | `t_blocknr_high` << 32).
    pub home_block: u64,
    /// `t_flags` (ESCAPE, SAME_UUID, DELETED, LAST_TAG; unknown bits kept).
    pub flags: u32,
    /// `t_checksum` (32 bits under v3, 16 under v2, 0 otherwise).
    pub checksum: u32,
    /// The UUID that follows the tag when SAME_UUID is clear.
    pub uuid: Option<[u8; 16]>,
}

impl Tag {
    /// True when the logged copy was escaped.
    pub fn escaped(&self) -> bool {
        self.flags & FLAG_ESCAPE != 0
    }
}

/// A descriptor block: the tags of the data blocks that follow it in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorBlock {
    /// Transaction id.
    pub sequence: u32,
    /// Tag encoding.
    pub format: TagFormat,
    /// The tags, in log order.
    pub tags: Vec<Tag>,
}

impl DescriptorBlock {
    /// Builds the descriptor the kernel would write for `entries` (home block, escaped, data
    /// checksum): UUID after the first tag, SAME_UUID on the rest, LAST_TAG on the last.
    pub fn build(
        sequence: u32,
        format: TagFormat,
        uuid: [u8; 16],
        entries: &[(u64, bool, u32)],
    ) -> DescriptorBlock {
        let last = entries.len().saturating_sub(1);
        let tags = entries
            .iter()
            .enumerate()
            .map(|(i, &(home_block, escaped, checksum))| {
                let mut flags = if i == 0 { 0 } else { FLAG_SAME_UUID };
                if escaped {
                    flags |= FLAG_ESCAPE;
                }
                if i == last {
                    flags |= FLAG_LAST_TAG;
                }
                Tag {
                    home_block,
                    flags,
                    checksum,
                    uuid: (i == 0).then_some(uuid),
                }
            })
            .collect();
        DescriptorBlock {
            sequence,
            format,
            tags,
        }
    }

    /// Decodes a descriptor block. Does not check the block tail (see
    /// [`super::block_tail_verify`]): that needs the journal's checksum seed.
    pub fn parse(b: &[u8], format: TagFormat) -> Result<DescriptorBlock, Corrupt> {
        let header = BlockHeader::parse(b)
            .map_err(|e| Corrupt::new(format!("jbd2 descriptor: {}", e.what)))?;
        if header.block_type != BlockType::Descriptor {
            return Err(Corrupt::new(format!(
                "jbd2 descriptor: block type {} is not a descriptor",
                header.block_type.to_raw()
            )));
        }
        let tag_size = format.tag_size();
        let limit = b.len().saturating_sub(format.tail_size());
        let mut off = HEADER_SIZE;
        let mut tags = Vec::new();
        loop {
            if off + tag_size > limit {
                return Err(Corrupt::new(format!(
                    "jbd2 descriptor of transaction {}: tag list truncated after {} tags (no \
                     LAST_TAG before the end of the block)",
                    header.sequence,
                    tags.len()
                )));
            }
            let (low, flags, high, checksum) = if format.csum == CsumVersion::V3 {
                (
                    be32(b, off),
                    be32(b, off + 4),
                    be32(b, off + 8),
                    be32(b, off + 12),
                )
            } else {
                let high = if format.bits64 { be32(b, off + 8) } else { 0 };
                let checksum = u32::from(be16(b, off + 4));
                (be32(b, off), u32::from(be16(b, off + 6)), high, checksum)
            };
            let high = if format.bits64 { high } else { 0 };
            off += tag_size;
            let uuid = if flags & FLAG_SAME_UUID == 0 {
                if off + UUID_SIZE > limit {
                    return Err(Corrupt::new(format!(
                        "jbd2 descriptor of transaction {}: UUID of tag {} runs past the block",
                        header.sequence,
                        tags.len()
                    )));
                }
                let mut u = [0u8; 16];
                u.copy_from_slice(&b[off..off + UUID_SIZE]);
                off += UUID_SIZE;
                Some(u)
            } else {
                None
            };
            tags.push(Tag {
                home_block: u64::from(low) | (u64::from(high) << 32),
                flags,
                checksum,
                uuid,
            });
            if flags & FLAG_LAST_TAG != 0 {
                break;
            }
        }
        Ok(DescriptorBlock {
            sequence: header.sequence,
            format,
            tags,
        })
    }

    /// Encodes the block into `b` (one journal block), tail left zero. Panics if the tags do
    /// not fit or a block number needs 64 bits in a 32-bit format: callers size descriptors
    /// with [`TagFormat::tags_per_block`] and check block numbers first.
    pub fn write(&self, b: &mut [u8]) {
        b.fill(0);
        BlockHeader {
            block_type: BlockType::Descriptor,
            sequence: self.sequence,
        }
        .write(b);
        let tag_size = self.format.tag_size();
        let limit = b.len() - self.format.tail_size();
        let mut off = HEADER_SIZE;
        for tag in &self.tags {
            assert!(
                off + tag_size <= limit,
                "descriptor tags overflow the block"
            );
            let low = (tag.home_block & 0xFFFF_FFFF) as u32;
            let high = (tag.home_block >> 32) as u32;
            assert!(
                self.format.bits64 || high == 0,
                "64-bit block in a 32-bit journal"
            );
            put_be32(b, off, low);
            if self.format.csum == CsumVersion::V3 {
                put_be32(b, off + 4, tag.flags);
                put_be32(b, off + 8, high);
                put_be32(b, off + 12, tag.checksum);
            } else {
                put_be16(b, off + 4, (tag.checksum & 0xFFFF) as u16);
                put_be16(b, off + 6, (tag.flags & 0xFFFF) as u16);
                if self.format.bits64 {
                    put_be32(b, off + 8, high);
                }
            }
            off += tag_size;
            if let Some(uuid) = &tag.uuid {
                assert!(
                    off + UUID_SIZE <= limit,
                    "descriptor UUID overflows the block"
                );
                b[off..off + UUID_SIZE].copy_from_slice(uuid);
                off += UUID_SIZE;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::jbd2::{block_tail_set, block_tail_verify};

    const ALL_FORMATS: [TagFormat; 6] = [
        TagFormat {
            csum: CsumVersion::V3,
            bits64: true,
        },
        TagFormat {
            csum: CsumVersion::V3,
            bits64: false,
        },
        TagFormat {
            csum: CsumVersion::V2,
            bits64: true,
        },
        TagFormat {
            csum: CsumVersion::V2,
            bits64: false,
        },
        TagFormat {
            csum: CsumVersion::None,
            bits64: true,
        },
        TagFormat {
            csum: CsumVersion::None,
            bits64: false,
        },
    ];

    #[test]
    fn tag_sizes_match_journal_tag_bytes() {
        let sizes: Vec<usize> = ALL_FORMATS.iter().map(|f| f.tag_size()).collect();
        assert_eq!(sizes, vec![16, 16, 14, 10, 12, 8]);
    }

    #[test]
    fn round_trip_every_format() {
        for format in ALL_FORMATS {
            let home_high = if format.bits64 { 0x1_0000_0005 } else { 5 };
            let cs = if format.csum == CsumVersion::V3 {
                0xDEAD_BEEF
            } else {
                0xBEEF
            };
            let cs = if format.csum == CsumVersion::None {
                0
            } else {
                cs
            };
            let n = format.tags_per_block(1024);
            let mut entries: Vec<(u64, bool, u32)> =
                (0..n as u64).map(|i| (100 + i, i % 3 == 0, cs)).collect();
            entries[1].0 = home_high;
            let d = DescriptorBlock::build(9, format, [0x5A; 16], &entries);
            let mut b = vec![0u8; 1024];
            d.write(&mut b);
            let back = DescriptorBlock::parse(&b, format).unwrap();
            assert_eq!(back, d, "{format:?}");
            assert_eq!(back.tags[1].home_block, home_high);
            assert!(back.tags[0].escaped());
            assert_eq!(back.tags[0].uuid, Some([0x5A; 16]));
        }
    }

    #[test]
    fn golden_tag3_layout() {
        let format = TagFormat {
            csum: CsumVersion::V3,
            bits64: true,
        };
        let d = DescriptorBlock::build(3, format, [0xEE; 16], &[(0x2_0000_0010, true, 0xCAFEF00D)]);
        let mut b = vec![0u8; 1024];
        d.write(&mut b);
        assert_eq!(&b[0x0C..0x10], &[0, 0, 0, 0x10]); // t_blocknr
        assert_eq!(&b[0x10..0x14], &[0, 0, 0, 0x09]); // t_flags = ESCAPE | LAST_TAG
        assert_eq!(&b[0x14..0x18], &[0, 0, 0, 0x02]); // t_blocknr_high
        assert_eq!(&b[0x18..0x1C], &[0xCA, 0xFE, 0xF0, 0x0D]); // t_checksum
        assert_eq!(&b[0x1C..0x2C], &[0xEE; 16]); // UUID
    }

    #[test]
    fn rejects_truncated_tag_list() {
        let format = TagFormat {
            csum: CsumVersion::V3,
            bits64: true,
        };
        let d = DescriptorBlock::build(3, format, [0; 16], &[(1, false, 0), (2, false, 0)]);
        let mut b = vec![0u8; 1024];
        d.write(&mut b);
        // Clear LAST_TAG on the last tag; the zeroed rest of the block then parses as tags
        // without SAME_UUID until the block runs out.
        b[0x0C + 32 + 7] &= !0x08;
        let e = DescriptorBlock::parse(&b, format).unwrap_err();
        assert!(
            e.what.contains("truncated") || e.what.contains("runs past"),
            "{e}"
        );
    }

    #[test]
    fn rejects_wrong_block_type() {
        let format = TagFormat {
            csum: CsumVersion::None,
            bits64: false,
        };
        let mut b = vec![0u8; 1024];
        DescriptorBlock::build(1, format, [0; 16], &[(1, false, 0)]).write(&mut b);
        b[7] = 2;
        let e = DescriptorBlock::parse(&b, format).unwrap_err();
        assert!(e.what.contains("not a descriptor"), "{e}");
    }

    #[test]
    fn rejects_bad_tail_checksum() {
        let format = TagFormat {
            csum: CsumVersion::V3,
            bits64: true,
        };
        let mut b = vec![0u8; 1024];
        DescriptorBlock::build(1, format, [0; 16], &[(1, false, 0)]).write(&mut b);
        block_tail_set(0x77, &mut b);
        assert!(block_tail_verify(0x77, &b, "descriptor").is_ok());
        b[0x0F] ^= 0x40; // flip a bit of t_blocknr
        let e = block_tail_verify(0x77, &b, "descriptor").unwrap_err();
        assert!(e.what.contains("tail checksum"), "{e}");
    }
}
