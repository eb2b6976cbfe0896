//! A file's extent tree on disk: loaded (and validated) into an [`ExtentMap`] that mirrors
//! the tree's nodes, and stored back by rewriting only the nodes an edit made dirty
//! (allocating the blocks of new nodes, freeing those of removed ones with revokes).
//!
//! What this file owns: the tree walk shared by every reader of extent trees ([`walk_tree`]),
//! [`ExtentMap::load`] and [`ExtentMap::store`] (the block I/O around the pure node edits of
//! `fs/extent_map.rs`), the allocation goal of a file's blocks ([`inode_goal`]), and
//! [`Meta::take_extent_map`], through which an operation edits a cached map in place.
//!
//! Invariants:
//! - every extent and every tree block lies in the data area, on no fixed metadata (checked
//!   by [`walk_tree`] when the map is loaded; blocks added later come from the allocator,
//!   which hands out only such blocks), so `store` and `write_node` never see a structure
//!   that trips their assertions and no data write lands on metadata;
//! - a cached map equals what the cached blocks say once its operation has stored it: an operation
//!   takes the map out of `DerivedCaches::maps`, edits and stores it, and puts it back; one that
//!   fails in between drops it, and its rollback restores the blocks the map is reloaded from;
//! - the tree blocks a map's nodes name are counted in the inode's `i_blocks`.

use crate::format::ext4::extent::{
    node_capacity, parse_node, set_tail_checksum, verify_tail_checksum, write_node, Extent,
    ExtentNode,
};
use crate::format::ext4::inode::{flags, Inode, I_BLOCK_LEN};
use crate::format::ext4::inode_csum_seed;
use crate::{FsError, Result};

use super::derived::Derived;
use super::layout::Layout;
use super::meta::{Io, Meta};

pub(crate) use super::extent_map::ExtentMap;
use super::extent_map::Node;

use std::collections::HashSet;
use std::sync::Arc;

/// How [`walk_tree`] reads and checks the blocks an extent tree points to.
pub(crate) struct TreeSource<'a> {
    /// Seed of the tree blocks' checksum tails (`None` without metadata_csum).
    pub seed: Option<u32>,
    /// Where file data and tree blocks may live.
    pub layout: &'a Layout,
    /// Most tree blocks to visit (a bound on the work a corrupt tree can cause).
    pub max_nodes: u64,
    /// Reads one tree block; with the first child of an index node come all its children's
    /// blocks (the second argument, empty otherwise), which the reader may fetch at once.
    pub read: &'a mut TreeRead<'a>,
}

/// How [`TreeSource`] reads a tree block: its number, and the blocks that may be fetched with
/// it.
pub(crate) type TreeRead<'a> = dyn FnMut(u64, &[u64]) -> Result<Vec<u8>> + 'a;

/// One node still to visit: its bytes, its block (0 for the root), the depth its parent
/// expects (`None` for the root) and the logical range `[lo, hi)` its parent gives it.
struct Pending {
    node: ExtentNode,
    block: u64,
    depth: Option<u16>,
    lo: u64,
    hi: u64,
}

/// Reads and validates the whole extent tree whose root is `root` (an inode's `i_block`),
/// returning its extents in logical order and its tree blocks (leaves first, then each index
/// level).
///
/// Checked, as the kernel's `ext4_ext_check` and `ext4_valid_extent_entries` do: every node's
/// header (magic, `eh_entries <= eh_max <= capacity`, depth <= 5) and tail checksum; a
/// child's depth is its parent's minus one; an index node has entries; index entries and
/// extents are in strictly increasing logical order, inside the range their parent gives
/// them, without overlap; an extent has a length > 0 and ends below 2^32 - 1; extents and
/// tree blocks lie in the data area and on no fixed metadata ([`Layout::check_run`]); no tree
/// block is visited twice; at most `max_nodes` tree blocks are read.
pub(crate) fn walk_tree(
    ino: u32,
    root: &[u8],
    source: &mut TreeSource<'_>,
) -> Result<(Vec<Extent>, Vec<u64>)> {
    let (extents, levels) = walk_nodes(ino, root, source)?;
    let blocks = levels.iter().flatten().map(|n| n.block);
    Ok((extents, blocks.filter(|b| *b != 0).collect()))
}

/// [`walk_tree`], returning the tree's nodes by level (leaves first, the root last), each
/// level in logical order.
fn walk_nodes(
    ino: u32,
    root: &[u8],
    source: &mut TreeSource<'_>,
) -> Result<(Vec<Extent>, Vec<Vec<Node>>)> {
    let bad = |what: String| FsError::corrupt_inode(ino, what);
    let root = parse_node(root).map_err(|c| bad(c.what))?;
    let mut stack = vec![Pending {
        node: root,
        block: 0,
        depth: None,
        lo: 0,
        hi: (1u64 << 32) - 1,
    }];
    let mut extents: Vec<Extent> = Vec::new();
    let mut levels: Vec<Vec<Node>> = Vec::new();
    let mut seen = HashSet::new();
    while let Some(p) = stack.pop() {
        let depth = match &p.node {
            ExtentNode::Leaf(_) => 0,
            ExtentNode::Index { depth, .. } => *depth,
        };
        if p.depth.is_some_and(|want| want != depth) {
            return Err(bad(format!(
                "extent node of depth {depth} where depth {} was expected",
                p.depth.unwrap_or(0)
            )));
        }
        let count = match &p.node {
            ExtentNode::Leaf(exts) => exts.len(),
            ExtentNode::Index { entries, .. } => entries.len(),
        };
        if levels.len() <= usize::from(depth) {
            levels.resize_with(usize::from(depth) + 1, Vec::new);
        }
        // The key is below 2^32: the root's range ends there and children lie inside it.
        let key = if p.block == 0 { 0 } else { p.lo as u32 };
        levels[usize::from(depth)].push(Node::on_disk(count, p.block, key));
        match p.node {
            ExtentNode::Leaf(exts) => {
                for e in exts {
                    let prev_end = extents.last().map_or(p.lo, |x| x.logical_end().max(p.lo));
                    if e.len == 0 {
                        return Err(bad(format!(
                            "extent at logical block {} has length 0",
                            e.logical
                        )));
                    }
                    if u64::from(e.logical) < prev_end || e.logical_end() > p.hi {
                        return Err(bad(format!(
                            "extent {}+{} is out of order or outside its node's range {}..{}",
                            e.logical, e.len, prev_end, p.hi
                        )));
                    }
                    source
                        .layout
                        .check_run(e.physical, u64::from(e.len))
                        .map_err(|why| {
                            bad(format!("extent at logical block {}: {why}", e.logical))
                        })?;
                    extents.push(e);
                }
            }
            ExtentNode::Index { entries, .. } => {
                if entries.is_empty() {
                    return Err(bad(format!("extent index node of depth {depth} is empty")));
                }
                let mut ranges = Vec::with_capacity(entries.len());
                for (k, e) in entries.iter().enumerate() {
                    let lo = u64::from(e.logical);
                    let hi = entries
                        .get(k + 1)
                        .map_or(p.hi, |next| u64::from(next.logical));
                    if lo < p.lo || lo >= hi || hi > p.hi {
                        return Err(bad(format!(
                            "extent index entry {lo} is out of order or outside its node's \
                             range {}..{}",
                            p.lo, p.hi
                        )));
                    }
                    source
                        .layout
                        .check_run(e.child, 1)
                        .map_err(|why| bad(format!("extent tree block: {why}")))?;
                    if !seen.insert(e.child) {
                        return Err(bad(format!(
                            "extent tree block {} is referenced twice",
                            e.child
                        )));
                    }
                    if seen.len() as u64 > source.max_nodes {
                        return Err(bad("extent tree too large".into()));
                    }
                    ranges.push((e.child, lo, hi));
                }
                let blocks: Vec<u64> = ranges.iter().map(|r| r.0).collect();
                let mut children = Vec::with_capacity(ranges.len());
                for (k, (child, lo, hi)) in ranges.into_iter().enumerate() {
                    let together = if k == 0 { &blocks[..] } else { &[] };
                    let blk = (source.read)(child, together)?;
                    if let Some(s) = source.seed {
                        verify_tail_checksum(&blk, s)
                            .map_err(|c| bad(format!("block {child}: {}", c.what)))?;
                    }
                    let node =
                        parse_node(&blk).map_err(|c| bad(format!("block {child}: {}", c.what)))?;
                    children.push(Pending {
                        node,
                        block: child,
                        depth: Some(depth - 1),
                        lo,
                        hi,
                    });
                }
                // Visit children in logical order: the last pushed is popped first.
                stack.extend(children.into_iter().rev());
            }
        }
    }
    Ok((extents, levels))
}

impl ExtentMap {
    /// Loads the map of `inode` (number `ino`), validating the whole tree ([`walk_tree`]).
    pub fn load(meta: &mut Meta, io: &Io, ino: u32, inode: &Inode) -> Result<ExtentMap> {
        if inode.flags() & flags::EXTENTS == 0 {
            if inode.flags() & flags::INLINE_DATA != 0 {
                return Err(FsError::Incompatible(format!(
                    "inode {ino} uses inline data"
                )));
            }
            // Block-mapped files are not supported; an all-zero i_block is an empty file.
            if inode.i_block().iter().all(|b| *b == 0) {
                return Ok(ExtentMap::default());
            }
            return Err(FsError::Incompatible(format!(
                "inode {ino} uses indirect block maps (ext2/ext3 style)"
            )));
        }
        let seed = meta
            .geo
            .csum_seed
            .map(|s| inode_csum_seed(s, ino, inode.generation()));
        let layout = meta.layout.clone();
        let max_nodes = meta.geo.blocks_count.min(1_000_000);
        // The children of an index node are fetched together (`Meta::prefetch`): a cold tree
        // costs a stop per index node, not one per block.
        let mut read = |nr: u64, together: &[u64]| -> Result<Vec<u8>> {
            meta.prefetch(io, together.iter().copied())?;
            Ok(meta.block(io, nr)?.to_vec())
        };
        let mut source = TreeSource {
            seed,
            layout: &layout,
            max_nodes,
            read: &mut read,
        };
        let (extents, levels) = walk_nodes(ino, inode.i_block(), &mut source)?;
        Ok(ExtentMap::from_tree(extents, levels))
    }

    /// Writes the map's changes back into `inode`'s `i_block` and tree blocks: the tree is
    /// reshaped ([`ExtentMap::normalize`]), the blocks of removed nodes freed (revoked: they
    /// may be in the journal), blocks for new nodes allocated near the file's data, and only
    /// the dirty nodes rewritten; of those, only blocks whose bytes change join the
    /// transaction. Keeps the inode's `i_blocks` in step with the tree blocks.
    pub fn store(&mut self, meta: &mut Meta, io: &Io, ino: u32, inode: &mut Inode) -> Result<()> {
        let bs = meta.geo.bs();
        self.normalize(node_capacity(bs), node_capacity(I_BLOCK_LEN))?;
        let seed = meta
            .geo
            .csum_seed
            .map(|s| inode_csum_seed(s, ino, inode.generation()));
        let sectors = u64::from(meta.geo.block_size / 512);
        let released = self.take_released();
        // A change of the tree's shape (a node made or removed) touches the root in the inode
        // and more than one node: in-place writes (lightweight) could reach the disk in part
        // and leave the index and its nodes disagreeing, which `fsck -p` cannot mend. Such a
        // change is journaled as a stricter mode's (the inode's slot and the nodes).
        if !released.is_empty() || self.unallocated().next().is_some() {
            meta.act_strictly();
        }
        for b in released {
            meta.free_block(io, b, true)?;
            let n = inode
                .blocks_512(meta.geo.block_size)
                .saturating_sub(sectors);
            inode.set_blocks_512(n);
        }
        let goal = inode_goal(self, meta, ino);
        for slot in self.unallocated() {
            let b = meta.alloc_block(io, goal)?;
            meta.new_block_mut(b);
            *slot = b;
            inode.set_blocks_512(inode.blocks_512(meta.geo.block_size) + sectors);
        }
        let (dirty, root) = self.take_dirty();
        let mut ib = [0u8; I_BLOCK_LEN];
        write_node(&root, &mut ib);
        // Entries moved between nodes, or a key of the root changed with a node below it:
        // the same, as one change of several blocks.
        if dirty.len() > 1 || (!dirty.is_empty() && inode.i_block() != &ib[..]) {
            meta.act_strictly();
        }
        let mut buf = vec![0u8; bs];
        for (nr, node) in dirty {
            buf.fill(0);
            write_node(&node, &mut buf);
            if let Some(s) = seed {
                set_tail_checksum(&mut buf, s);
            }
            if meta.block(io, nr)? != &buf[..] {
                meta.block_mut(io, nr)?.copy_from_slice(&buf);
            }
        }
        inode.i_block_mut().copy_from_slice(&ib);
        inode.set_flags(inode.flags() | flags::EXTENTS);
        Ok(())
    }
}

impl Meta {
    /// The block map of `ino`, taken out of the cache (or loaded from `inode`) to be edited
    /// in place; the caller stores it and puts it back into `maps`. If the operation fails in
    /// between, the map is simply dropped (see the module comment).
    pub(crate) fn take_extent_map(
        &mut self,
        io: &Io,
        ino: u32,
        inode: &Inode,
    ) -> Result<ExtentMap> {
        self.note_derived(Derived::ExtentMap(ino));
        // Reads without the metadata lock must not use the map once it starts to change.
        self.data.lock().withdraw_map(ino);
        match self.derived.maps.remove(&ino) {
            // A read that got the published map may still hold it: then it is copied.
            Some(map) => Ok(Arc::unwrap_or_clone(map)),
            None => ExtentMap::load(self, io, ino, inode),
        }
    }
}

/// A good place for new blocks of `ino`: after its last mapped block, else in its group.
pub(crate) fn inode_goal(map: &ExtentMap, meta: &Meta, ino: u32) -> u64 {
    if let Some(e) = map.extents().last() {
        return e.physical + u64::from(e.len);
    }
    let g = (ino - 1) / meta.geo.inodes_per_group;
    meta.geo.group_first_block(g)
}
