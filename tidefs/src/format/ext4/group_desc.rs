//! Block group descriptors (32 bytes, or `s_desc_size` — 64 — with the 64bit feature).
//!
//! Layout:
//! ```text
//! 0x00 bg_block_bitmap_lo u32      0x04 bg_inode_bitmap_lo u32     0x08 bg_inode_table_lo u32
//! 0x0C bg_free_blocks_count_lo u16 0x0E bg_free_inodes_count_lo u16 0x10 bg_used_dirs_count_lo u16
//! 0x12 bg_flags u16 (1 INODE_UNINIT, 2 BLOCK_UNINIT, 4 ITABLE_ZEROED)
//! 0x18 bg_block_bitmap_csum_lo u16 0x1A bg_inode_bitmap_csum_lo u16 0x1C bg_itable_unused_lo u16
//! 0x1E bg_checksum u16 (crc32c(seed, le32 group, desc with this field zeroed) & 0xFFFF)
//! -- 64-byte descriptors only --
//! 0x20 bg_block_bitmap_hi u32      0x24 bg_inode_bitmap_hi u32     0x28 bg_inode_table_hi u32
//! 0x2C bg_free_blocks_count_hi u16 0x2E bg_free_inodes_count_hi u16 0x30 bg_used_dirs_count_hi u16
//! 0x32 bg_itable_unused_hi u16     0x38 bg_block_bitmap_csum_hi u16 0x3A bg_inode_bitmap_csum_hi u16
//! ```
//! Bitmap checksums: crc32c(seed, bitmap bytes) — `blocks_per_group / 8` bytes for the block
//! bitmap, `inodes_per_group / 8` for the inode bitmap — low half in `_lo`, high half in `_hi`.

use crate::format::{crc32c_raw, le16, le32, put_le16};

const BG_BLOCK_BITMAP_LO: usize = 0x00;
const BG_INODE_BITMAP_LO: usize = 0x04;
const BG_INODE_TABLE_LO: usize = 0x08;
const BG_FREE_BLOCKS_COUNT_LO: usize = 0x0C;
const BG_FREE_INODES_COUNT_LO: usize = 0x0E;
const BG_USED_DIRS_COUNT_LO: usize = 0x10;
const BG_FLAGS: usize = 0x12;
const BG_BLOCK_BITMAP_CSUM_LO: usize = 0x18;
const BG_INODE_BITMAP_CSUM_LO: usize = 0x1A;
const BG_ITABLE_UNUSED_LO: usize = 0x1C;
const BG_CHECKSUM: usize = 0x1E;
const BG_BLOCK_BITMAP_HI: usize = 0x20;
const BG_INODE_BITMAP_HI: usize = 0x24;
const BG_INODE_TABLE_HI: usize = 0x28;
const BG_FREE_BLOCKS_COUNT_HI: usize = 0x2C;
const BG_FREE_INODES_COUNT_HI: usize = 0x2E;
const BG_USED_DIRS_COUNT_HI: usize = 0x30;
const BG_ITABLE_UNUSED_HI: usize = 0x32;
const BG_BLOCK_BITMAP_CSUM_HI: usize = 0x38;
const BG_INODE_BITMAP_CSUM_HI: usize = 0x3A;
const DESC_SIZE_64: usize = 0x40;

/// `bg_flags`: the inode bitmap and table are not initialised.
pub const BG_INODE_UNINIT: u16 = 1;
/// `bg_flags`: the block bitmap is not initialised (computable from the layout).
pub const BG_BLOCK_UNINIT: u16 = 2;
/// `bg_flags`: the inode table has been zeroed.
pub const BG_ITABLE_ZEROED: u16 = 4;

/// A mutable view of one group descriptor inside a descriptor-table block.
pub struct GroupDesc<'a> {
    raw: &'a mut [u8],
}

/// A read-only view of one group descriptor.
pub struct GroupDescRef<'a> {
    raw: &'a [u8],
}

macro_rules! getters {
    () => {
        fn lo_hi32(&self, lo: usize, hi: usize) -> u64 {
            let l = u64::from(le32(self.raw, lo));
            if self.raw.len() >= DESC_SIZE_64 {
                l | (u64::from(le32(self.raw, hi)) << 32)
            } else {
                l
            }
        }
        fn lo_hi16(&self, lo: usize, hi: usize) -> u32 {
            let l = u32::from(le16(self.raw, lo));
            if self.raw.len() >= DESC_SIZE_64 {
                l | (u32::from(le16(self.raw, hi)) << 16)
            } else {
                l
            }
        }
        /// Block number of the block bitmap.
        pub fn block_bitmap(&self) -> u64 {
            self.lo_hi32(BG_BLOCK_BITMAP_LO, BG_BLOCK_BITMAP_HI)
        }
        /// Block number of the inode bitmap.
        pub fn inode_bitmap(&self) -> u64 {
            self.lo_hi32(BG_INODE_BITMAP_LO, BG_INODE_BITMAP_HI)
        }
        /// First block of the inode table.
        pub fn inode_table(&self) -> u64 {
            self.lo_hi32(BG_INODE_TABLE_LO, BG_INODE_TABLE_HI)
        }
        /// Free blocks in the group.
        pub fn free_blocks(&self) -> u32 {
            self.lo_hi16(BG_FREE_BLOCKS_COUNT_LO, BG_FREE_BLOCKS_COUNT_HI)
        }
        /// Free inodes in the group.
        pub fn free_inodes(&self) -> u32 {
            self.lo_hi16(BG_FREE_INODES_COUNT_LO, BG_FREE_INODES_COUNT_HI)
        }
        /// Directories in the group.
        pub fn used_dirs(&self) -> u32 {
            self.lo_hi16(BG_USED_DIRS_COUNT_LO, BG_USED_DIRS_COUNT_HI)
        }
        /// Inodes at the end of the table never used.
        pub fn itable_unused(&self) -> u32 {
            self.lo_hi16(BG_ITABLE_UNUSED_LO, BG_ITABLE_UNUSED_HI)
        }
        /// Flags (`BG_*`).
        pub fn flags(&self) -> u16 {
            le16(self.raw, BG_FLAGS)
        }
        /// Stored descriptor checksum.
        pub fn checksum(&self) -> u16 {
            le16(self.raw, BG_CHECKSUM)
        }
        /// Descriptor checksum as it should be.
        pub fn compute_checksum(&self, seed: u32, group: u32) -> u16 {
            let mut c = crc32c_raw(seed, &group.to_le_bytes());
            c = crc32c_raw(c, &self.raw[..BG_CHECKSUM]);
            c = crc32c_raw(c, &[0, 0]);
            c = crc32c_raw(c, &self.raw[BG_CHECKSUM + 2..]);
            (c & 0xFFFF) as u16
        }
        /// Stored block-bitmap checksum.
        pub fn block_bitmap_csum(&self) -> u32 {
            self.lo_hi16(BG_BLOCK_BITMAP_CSUM_LO, BG_BLOCK_BITMAP_CSUM_HI)
        }
        /// Stored inode-bitmap checksum.
        pub fn inode_bitmap_csum(&self) -> u32 {
            self.lo_hi16(BG_INODE_BITMAP_CSUM_LO, BG_INODE_BITMAP_CSUM_HI)
        }
    };
}

impl GroupDescRef<'_> {
    getters!();
}

impl<'a> GroupDescRef<'a> {
    /// A view of the descriptor bytes `raw` (exactly `desc_size` long).
    pub fn new(raw: &'a [u8]) -> Self {
        GroupDescRef { raw }
    }
}

impl<'a> GroupDesc<'a> {
    /// A mutable view of the descriptor bytes `raw` (exactly `desc_size` long).
    pub fn new(raw: &'a mut [u8]) -> Self {
        GroupDesc { raw }
    }

    getters!();

    fn set_lo_hi16(&mut self, lo: usize, hi: usize, v: u32) {
        put_le16(self.raw, lo, (v & 0xFFFF) as u16);
        if self.raw.len() >= DESC_SIZE_64 {
            put_le16(self.raw, hi, (v >> 16) as u16);
        }
    }
    /// Sets the free block count.
    pub fn set_free_blocks(&mut self, v: u32) {
        self.set_lo_hi16(BG_FREE_BLOCKS_COUNT_LO, BG_FREE_BLOCKS_COUNT_HI, v);
    }
    /// Sets the free inode count.
    pub fn set_free_inodes(&mut self, v: u32) {
        self.set_lo_hi16(BG_FREE_INODES_COUNT_LO, BG_FREE_INODES_COUNT_HI, v);
    }
    /// Sets the directory count.
    pub fn set_used_dirs(&mut self, v: u32) {
        self.set_lo_hi16(BG_USED_DIRS_COUNT_LO, BG_USED_DIRS_COUNT_HI, v);
    }
    /// Sets the unused-inode tail count.
    pub fn set_itable_unused(&mut self, v: u32) {
        self.set_lo_hi16(BG_ITABLE_UNUSED_LO, BG_ITABLE_UNUSED_HI, v);
    }
    /// Sets the flags.
    pub fn set_flags(&mut self, v: u16) {
        put_le16(self.raw, BG_FLAGS, v);
    }
    /// Stores the block-bitmap checksum.
    pub fn set_block_bitmap_csum(&mut self, v: u32) {
        self.set_lo_hi16(BG_BLOCK_BITMAP_CSUM_LO, BG_BLOCK_BITMAP_CSUM_HI, v);
    }
    /// Stores the inode-bitmap checksum.
    pub fn set_inode_bitmap_csum(&mut self, v: u32) {
        self.set_lo_hi16(BG_INODE_BITMAP_CSUM_LO, BG_INODE_BITMAP_CSUM_HI, v);
    }
    /// Recomputes and stores the descriptor checksum.
    pub fn update_checksum(&mut self, seed: u32, group: u32) {
        let c = self.compute_checksum(seed, group);
        put_le16(self.raw, BG_CHECKSUM, c);
    }
}

/// Checksum of a bitmap as stored in a group descriptor: crc32c over the first `len` bytes.
pub fn bitmap_checksum(seed: u32, bitmap: &[u8], len: usize) -> u32 {
    crc32c_raw(seed, &bitmap[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_checksum_round_trip() {
        let mut raw = [0u8; 64];
        let mut gd = GroupDesc::new(&mut raw);
        gd.set_free_blocks(0x1_2345);
        gd.set_free_inodes(77);
        gd.set_used_dirs(3);
        gd.set_flags(BG_ITABLE_ZEROED);
        gd.set_block_bitmap_csum(0xABCD_1234);
        gd.update_checksum(0x1111, 5);
        assert_eq!(gd.free_blocks(), 0x1_2345);
        assert_eq!(gd.block_bitmap_csum(), 0xABCD_1234);
        let r = GroupDescRef::new(&raw);
        assert_eq!(r.checksum(), r.compute_checksum(0x1111, 5));
        assert_ne!(r.checksum(), r.compute_checksum(0x1111, 6));
    }

    #[test]
    fn small_descriptors_ignore_high_halves() {
        let mut raw = [0u8; 32];
        let mut gd = GroupDesc::new(&mut raw);
        gd.set_free_blocks(0x1_0005);
        assert_eq!(gd.free_blocks(), 5);
    }
}
