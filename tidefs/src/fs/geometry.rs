//! The fixed geometry of a mounted file system, derived from its superblock: block and group
//! sizes, where group descriptors, superblock copies and inode tables lie, and the format's
//! size limits.

use crate::format::ext4::superblock::Superblock;
use crate::{FsError, Result};

use super::layout::FixedRun;

/// Fixed geometry derived from the superblock at mount.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inode_size: u32,
    pub desc_size: u32,
    pub groups: u32,
    pub first_ino: u32,
    pub csum_seed: Option<u32>,
    pub extra_isize: u16,
}

impl Geometry {
    pub fn from_superblock(sb: &Superblock) -> Result<Geometry> {
        let groups = u32::try_from(sb.group_count())
            .map_err(|_| FsError::corrupt("too many block groups"))?;
        let inode_size = u32::from(sb.inode_size());
        // What new inodes get: a multiple of 4 (inodes require it) that fits the inode, else
        // the 32 bytes of today's fields (the kernel refuses to mount with a wish past the
        // inode; tidefs mounts and gives new inodes the 32).
        let extra = if inode_size > 128 {
            let want = sb.want_extra_isize().max(sb.min_extra_isize()).max(32) & !3;
            if 128 + u32::from(want) > inode_size {
                32
            } else {
                want
            }
        } else {
            0
        };
        Ok(Geometry {
            block_size: sb.block_size(),
            blocks_count: sb.blocks_count(),
            first_data_block: u64::from(sb.first_data_block()),
            blocks_per_group: sb.blocks_per_group(),
            inodes_per_group: sb.inodes_per_group(),
            inode_size,
            desc_size: sb.desc_size(),
            groups,
            first_ino: sb.first_ino(),
            csum_seed: sb.csum_seed(),
            extra_isize: extra.min(u16::try_from(inode_size.saturating_sub(128)).unwrap_or(0)),
        })
    }

    pub fn bs(&self) -> usize {
        self.block_size as usize
    }

    /// Block and byte offset of group descriptor `g` in the primary table.
    pub fn desc_location(&self, g: u32) -> (u64, usize) {
        let byte = u64::from(g) * u64::from(self.desc_size);
        let bs = u64::from(self.block_size);
        (self.first_data_block + 1 + byte / bs, (byte % bs) as usize)
    }

    pub fn group_of_block(&self, b: u64) -> u32 {
        ((b - self.first_data_block) / u64::from(self.blocks_per_group)) as u32
    }

    pub fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Blocks in group `g` (the last group may be short).
    pub fn blocks_in_group(&self, g: u32) -> u32 {
        let first = self.group_first_block(g);
        (self.blocks_count - first).min(u64::from(self.blocks_per_group)) as u32
    }

    /// Number of inodes: the last valid inode number.
    pub fn inodes_count(&self) -> u64 {
        u64::from(self.inodes_per_group) * u64::from(self.groups)
    }

    pub fn valid_ino(&self, ino: u64) -> bool {
        ino >= 1 && ino <= self.inodes_count()
    }

    /// Whether a directory entry may lead to inode `ino`: the root or an inode past the
    /// reserved ones (the journal, the resize inode and the others below `s_first_ino` are
    /// never in a directory: opened by name, the journal's inode would take writes).
    pub fn entry_may_name(&self, ino: u32) -> bool {
        ino == super::api::ROOT_INO as u32 || (ino >= self.first_ino && self.valid_ino(ino.into()))
    }

    /// `ino` as an inode number of this file system (`NotFound` when out of range).
    pub fn ino32(&self, ino: u64) -> crate::Result<u32> {
        if !self.valid_ino(ino) {
            return Err(crate::FsError::NotFound);
        }
        // valid_ino bounds it by the inode count, a u32.
        Ok(ino as u32)
    }

    /// Most logical blocks a file may have: logical block numbers are 32 bits and ext4 keeps
    /// the last one unused (`ext4_max_size` with extents).
    pub fn max_file_blocks(&self) -> u64 {
        (1u64 << 32) - 1
    }

    /// Largest valid `i_size` of a regular file: 16 TiB - 4 KiB with 4 KiB blocks.
    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_blocks() * u64::from(self.block_size)
    }

    /// Blocks of one group's inode table.
    pub fn itable_blocks(&self) -> u64 {
        (u64::from(self.inodes_per_group) * u64::from(self.inode_size))
            .div_ceil(u64::from(self.block_size))
    }

    /// Blocks at the start of group `g` that hold a superblock copy, the group-descriptor table
    /// and its reserved blocks (0 in a group without a copy).
    pub fn sb_copy_blocks(&self, sb: &Superblock, g: u32) -> u64 {
        if sb.group_has_super(u64::from(g)) {
            1 + sb.gdt_blocks() + u64::from(sb.reserved_gdt_blocks())
        } else {
            0
        }
    }

    /// The superblock and group-descriptor copies of every group, as fixed runs (group 0's
    /// also covers the boot block before the superblock). They depend on the superblock only,
    /// so they can be checked before the descriptors are read.
    pub fn sb_copy_runs(&self, sb: &Superblock) -> Vec<FixedRun> {
        (0..self.groups)
            .filter(|g| self.sb_copy_blocks(sb, *g) > 0)
            .map(|g| {
                let first = self.group_first_block(g);
                FixedRun {
                    start: if g == 0 { 0 } else { first },
                    end: (first + self.sb_copy_blocks(sb, g)).min(self.blocks_count),
                    what: "superblock and group descriptor copy",
                    group: Some(g),
                }
            })
            .collect()
    }

    /// The bits of a bitmap checksum a descriptor stores: the low half only in 32-byte
    /// descriptors.
    pub fn bitmap_csum_mask(&self) -> u32 {
        if self.desc_size >= 64 {
            u32::MAX
        } else {
            0xFFFF
        }
    }
}

/// Largest directory tidefs accepts: ext4 without the largedir feature reads a directory's
/// size from `i_size_lo` only and e2fsck refuses directories of 2 GiB and more.
pub(crate) const MAX_DIR_BYTES: u64 = (1 << 31) - 1;
