//! The allocation audit: compares the block and inode bitmaps with what is really in use — the
//! fixed metadata, and the blocks every live inode maps (extents, extent-tree blocks, its xattr
//! block). It is what mount runs after an unclean shutdown in lightweight mode, whose promise
//! is that a crash can leak blocks and inodes (marked in use, used by nothing) but never leave a
//! used one marked free.
//!
//! Invariants:
//! - read only: the audit changes nothing, it counts;
//! - bounded: one pass over the inode tables and each live inode's extent tree, with a bitset
//!   of one bit per block.

use crate::format::ext4::extent::{parse_node, ExtentNode};
use crate::format::ext4::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use crate::format::ext4::inode::flags;
use crate::format::le32;
use crate::Result;

use super::extents::ExtentMap;
use super::meta::{Io, Meta};

/// The resize inode (reserved GDT blocks through a block map).
const RESIZE_INO: u32 = 7;
/// The journal inode.
const JOURNAL_INO: u32 = 8;
/// Index of the doubly indirect block in a block-mapped inode's `i_block`.
const DIND_SLOT: usize = 13;

/// What the audit found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocationAudit {
    /// Blocks the bitmaps mark in use that nothing uses.
    pub leaked_blocks: u64,
    /// Inodes the bitmaps mark in use that have no links.
    pub leaked_inodes: u64,
    /// Blocks in use that the bitmaps call free (a future double allocation).
    pub used_blocks_marked_free: u64,
    /// Live inodes (with links) that the bitmaps call free.
    pub used_inodes_marked_free: u64,
}

/// One bit per block.
struct BlockSet(Vec<u64>);

impl BlockSet {
    fn new(blocks: u64) -> BlockSet {
        BlockSet(vec![0; usize::try_from(blocks.div_ceil(64)).unwrap_or(0)])
    }
    fn mark(&mut self, first: u64, len: u64) {
        for b in first..first.saturating_add(len) {
            if let Some(w) = usize::try_from(b / 64).ok().and_then(|i| self.0.get_mut(i)) {
                *w |= 1 << (b % 64);
            }
        }
    }
    fn contains(&self, b: u64) -> bool {
        usize::try_from(b / 64)
            .ok()
            .and_then(|i| self.0.get(i))
            .is_some_and(|w| w & (1 << (b % 64)) != 0)
    }
}

fn bit(bitmap: &[u8], i: usize) -> bool {
    bitmap
        .get(i / 8)
        .is_some_and(|byte| byte & (1 << (i % 8)) != 0)
}

impl Meta {
    /// Counts leaked and wrongly free blocks and inodes (see the module comment).
    pub(crate) fn audit_allocation(&mut self, io: &Io) -> Result<AllocationAudit> {
        let mut audit = AllocationAudit::default();
        let mut used = BlockSet::new(self.geo.blocks_count);
        for run in self.layout.runs() {
            used.mark(run.start, run.end - run.start);
        }
        let ipg = self.geo.inodes_per_group;
        for g in 0..self.geo.groups {
            let info = self.alloc.groups[g as usize];
            let bitmap = if info.flags & BG_INODE_UNINIT != 0 {
                Vec::new()
            } else {
                self.block(io, info.inode_bitmap)?.to_vec()
            };
            // Inodes past `ipg - itable_unused` were never used.
            let scanned = ipg.saturating_sub(info.itable_unused);
            for i in 0..scanned {
                let ino = g * ipg + i + 1;
                let marked = bit(&bitmap, i as usize);
                let inode = self.read_inode(io, ino)?;
                let live = inode.mode() != 0 && inode.links_count() > 0;
                if ino >= self.geo.first_ino {
                    match (marked, live) {
                        (true, false) => audit.leaked_inodes += 1,
                        (false, true) => audit.used_inodes_marked_free += 1,
                        _ => {}
                    }
                }
                if !live && ino >= self.geo.first_ino {
                    continue;
                }
                if inode.file_acl() != 0 {
                    used.mark(inode.file_acl(), 1);
                }
                if ino == RESIZE_INO {
                    let dind = le32(inode.i_block(), DIND_SLOT * 4);
                    used.mark(u64::from(dind), u64::from(dind != 0));
                    continue;
                }
                if inode.flags() & flags::EXTENTS == 0 {
                    continue;
                }
                if ino == JOURNAL_INO {
                    // Its blocks are fixed metadata already; only index blocks remain.
                    if let Ok(ExtentNode::Index { entries, .. }) = parse_node(inode.i_block()) {
                        for e in entries {
                            used.mark(e.child, 1);
                        }
                    }
                    continue;
                }
                let map = ExtentMap::load(self, io, ino, &inode)?;
                for e in map.extents() {
                    used.mark(e.physical, u64::from(e.len));
                }
                for b in map.tree_blocks() {
                    used.mark(b, 1);
                }
            }
        }
        for g in 0..self.geo.groups {
            let info = self.alloc.groups[g as usize];
            let bitmap = if info.flags & BG_BLOCK_UNINIT != 0 {
                self.init_block_bitmap(g)
            } else {
                self.block(io, info.block_bitmap)?.to_vec()
            };
            let first = self.geo.group_first_block(g);
            for i in 0..self.geo.blocks_in_group(g) as usize {
                let b = first + i as u64;
                match (bit(&bitmap, i), used.contains(b)) {
                    (true, false) => audit.leaked_blocks += 1,
                    (false, true) => audit.used_blocks_marked_free += 1,
                    _ => {}
                }
            }
        }
        Ok(audit)
    }
}
