//! A file's block map: the whole extent tree of an inode loaded into a sorted list, edited in
//! memory, and written back as a tree whose blocks are reused in order so that an append
//! dirties only the blocks whose bytes changed.
//!
//! Invariants:
//! - `extents` is sorted by logical block, non-overlapping, each extent within the format's
//!   length limits (length > 0) and ending below 2^32 - 1;
//! - every extent and every tree block lies in the data area, on no fixed metadata (checked
//!   by [`walk_tree`] when the map is loaded; blocks added later come from the allocator,
//!   which hands out only such blocks), so `store` and `write_node` never see a structure
//!   that trips their assertions and no data write lands on metadata;
//! - `tree_blocks` lists the blocks the on-disk tree uses (leaves first, then index levels),
//!   each counted in the inode's `i_blocks`.

use crate::format::ext4::extent::{
    node_capacity, parse_node, set_tail_checksum, verify_tail_checksum, write_node, Extent,
    ExtentIndex, ExtentNode, MAX_INIT_LEN, MAX_UNWRITTEN_LEN,
};
use crate::format::ext4::inode::{flags, Inode, I_BLOCK_LEN};
use crate::format::ext4::inode_csum_seed;
use crate::{FsError, Result};

use super::layout::Layout;
use super::meta::{Io, Meta};

use std::collections::HashSet;

/// The block map of one inode.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExtentMap {
    pub extents: Vec<Extent>,
    pub tree_blocks: Vec<u64>,
}

/// How [`walk_tree`] reads and checks the blocks an extent tree points to.
pub(crate) struct TreeSource<'a> {
    /// Seed of the tree blocks' checksum tails (`None` without metadata_csum).
    pub seed: Option<u32>,
    /// Where file data and tree blocks may live.
    pub layout: &'a Layout,
    /// Most tree blocks to visit (a bound on the work a corrupt tree can cause).
    pub max_nodes: u64,
    /// Reads one tree block.
    pub read: &'a mut dyn FnMut(u64) -> Result<Vec<u8>>,
}

/// One node still to visit: its bytes, the depth its parent expects (`None` for the root) and
/// the logical range `[lo, hi)` its parent gives it.
struct Pending {
    node: ExtentNode,
    depth: Option<u16>,
    lo: u64,
    hi: u64,
}

/// Reads and validates the whole extent tree whose root is `root` (an inode's `i_block`),
/// returning its extents in logical order and its tree blocks (in visiting order).
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
    let bad = |what: String| FsError::corrupt_inode(ino, what);
    let root = parse_node(root).map_err(|c| bad(c.what))?;
    let mut stack = vec![Pending {
        node: root,
        depth: None,
        lo: 0,
        hi: (1u64 << 32) - 1,
    }];
    let mut extents: Vec<Extent> = Vec::new();
    let mut tree_blocks: Vec<u64> = Vec::new();
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
                let mut children = Vec::with_capacity(entries.len());
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
                    let blk = (source.read)(e.child)?;
                    if let Some(s) = source.seed {
                        verify_tail_checksum(&blk, s)
                            .map_err(|c| bad(format!("block {}: {}", e.child, c.what)))?;
                    }
                    let child = parse_node(&blk)
                        .map_err(|c| bad(format!("block {}: {}", e.child, c.what)))?;
                    tree_blocks.push(e.child);
                    children.push(Pending {
                        node: child,
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
    Ok((extents, tree_blocks))
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
        let mut read = |nr: u64| -> Result<Vec<u8>> { Ok(meta.block(io, nr)?.to_vec()) };
        let mut source = TreeSource {
            seed,
            layout: &layout,
            max_nodes,
            read: &mut read,
        };
        let (extents, tree_blocks) = walk_tree(ino, inode.i_block(), &mut source)?;
        Ok(ExtentMap {
            extents,
            tree_blocks,
        })
    }

    /// The first mapped block at or after `lblk`: (logical, physical).
    pub fn next_mapped(&self, lblk: u32) -> Option<(u32, u64)> {
        let i = self
            .extents
            .partition_point(|e| e.logical_end() <= u64::from(lblk));
        self.extents.get(i).map(|e| {
            let l = lblk.max(e.logical);
            (l, e.physical + u64::from(l - e.logical))
        })
    }

    /// The extent containing logical block `lblk`.
    pub fn find(&self, lblk: u32) -> Option<Extent> {
        let i = self
            .extents
            .partition_point(|e| e.logical_end() <= u64::from(lblk));
        self.extents.get(i).filter(|e| e.logical <= lblk).copied()
    }

    /// Maps one logical block: (physical, unwritten).
    pub fn map(&self, lblk: u32) -> Option<(u64, bool)> {
        self.find(lblk)
            .map(|e| (e.physical + u64::from(lblk - e.logical), e.unwritten))
    }

    /// Inserts the mapping `lblk → pblk` for one unmapped block, merging with neighbours.
    pub fn insert(&mut self, lblk: u32, pblk: u64, unwritten: bool) {
        let i = self
            .extents
            .partition_point(|e| e.logical_end() <= u64::from(lblk));
        debug_assert!(
            self.extents.get(i).is_none_or(|e| e.logical > lblk),
            "block already mapped"
        );
        let max = if unwritten {
            MAX_UNWRITTEN_LEN
        } else {
            MAX_INIT_LEN
        };
        if i > 0 {
            let p = &mut self.extents[i - 1];
            if p.unwritten == unwritten
                && p.logical_end() == u64::from(lblk)
                && p.physical + u64::from(p.len) == pblk
                && p.len < max
            {
                p.len += 1;
                self.merge_at(i - 1);
                return;
            }
        }
        if let Some(n) = self.extents.get_mut(i) {
            if n.unwritten == unwritten
                && n.logical == lblk + 1
                && n.physical == pblk + 1
                && n.len < max
            {
                n.logical = lblk;
                n.physical = pblk;
                n.len += 1;
                return;
            }
        }
        self.extents.insert(
            i,
            Extent {
                logical: lblk,
                len: 1,
                physical: pblk,
                unwritten,
            },
        );
    }

    fn merge_at(&mut self, i: usize) {
        if i + 1 >= self.extents.len() {
            return;
        }
        let (a, b) = (self.extents[i], self.extents[i + 1]);
        let max = if a.unwritten {
            MAX_UNWRITTEN_LEN
        } else {
            MAX_INIT_LEN
        };
        if a.unwritten == b.unwritten
            && a.logical_end() == u64::from(b.logical)
            && a.physical + u64::from(a.len) == b.physical
            && a.len + b.len <= max
        {
            self.extents[i].len += b.len;
            self.extents.remove(i + 1);
        }
    }

    /// Marks one block of an unwritten extent as written (splitting the extent).
    pub fn mark_written(&mut self, lblk: u32) {
        let i = self
            .extents
            .partition_point(|e| e.logical_end() <= u64::from(lblk));
        let e = self.extents[i];
        debug_assert!(e.unwritten && e.logical <= lblk);
        let off = lblk - e.logical;
        let mut parts = Vec::with_capacity(3);
        if off > 0 {
            parts.push(Extent { len: off, ..e });
        }
        parts.push(Extent {
            logical: lblk,
            len: 1,
            physical: e.physical + u64::from(off),
            unwritten: false,
        });
        if off + 1 < e.len {
            parts.push(Extent {
                logical: lblk + 1,
                len: e.len - off - 1,
                physical: e.physical + u64::from(off) + 1,
                unwritten: true,
            });
        }
        self.extents.splice(i..=i, parts);
        // Merge the written block with a written neighbour on either side.
        let j = self
            .extents
            .iter()
            .position(|x| x.logical == lblk)
            .unwrap_or(i);
        self.merge_at(j);
        if j > 0 {
            self.merge_at(j - 1);
        }
    }

    /// Removes every mapping at or after logical block `from`; returns the freed physical runs.
    pub fn truncate_from(&mut self, from: u32) -> Vec<(u64, u32)> {
        let mut freed = Vec::new();
        let mut keep = Vec::with_capacity(self.extents.len());
        for e in self.extents.drain(..) {
            if e.logical_end() <= u64::from(from) {
                keep.push(e);
            } else if e.logical >= from {
                freed.push((e.physical, e.len));
            } else {
                let k = from - e.logical;
                freed.push((e.physical + u64::from(k), e.len - k));
                keep.push(Extent { len: k, ..e });
            }
        }
        self.extents = keep;
        freed
    }

    /// Removes the mappings of logical blocks `[from, to)`, splitting the extents that straddle
    /// either end; returns the freed physical runs.
    pub fn remove_range(&mut self, from: u64, to: u64) -> Vec<(u64, u32)> {
        let mut freed = Vec::new();
        if from >= to {
            return freed;
        }
        let mut keep = Vec::with_capacity(self.extents.len() + 1);
        for e in self.extents.drain(..) {
            let (start, end) = (u64::from(e.logical), e.logical_end());
            if end <= from || start >= to {
                keep.push(e);
                continue;
            }
            let (cut_start, cut_end) = (start.max(from), end.min(to));
            if start < cut_start {
                // Shorter than `e`, so it fits in u32.
                keep.push(Extent {
                    len: (cut_start - start) as u32,
                    ..e
                });
            }
            freed.push((
                e.physical + (cut_start - start),
                (cut_end - cut_start) as u32,
            ));
            if cut_end < end {
                keep.push(Extent {
                    // Below `end`, which is at most 2^32, so it fits in u32.
                    logical: cut_end as u32,
                    len: (end - cut_end) as u32,
                    physical: e.physical + (cut_end - start),
                    unwritten: e.unwritten,
                });
            }
        }
        self.extents = keep;
        freed
    }

    /// Marks the mapped blocks of `[from, to)` unwritten, so they read as zeros and stay
    /// allocated. Returns how many of them were written before.
    pub fn mark_unwritten_range(&mut self, from: u64, to: u64) -> u64 {
        let mut converted = 0u64;
        if from >= to {
            return converted;
        }
        let mut out = Vec::with_capacity(self.extents.len() + 2);
        for e in self.extents.drain(..) {
            let (start, end) = (u64::from(e.logical), e.logical_end());
            if end <= from || start >= to || e.unwritten {
                out.push(e);
                continue;
            }
            let (cut_start, cut_end) = (start.max(from), end.min(to));
            if start < cut_start {
                out.push(Extent {
                    len: (cut_start - start) as u32,
                    ..e
                });
            }
            converted += cut_end - cut_start;
            // An unwritten extent holds one block fewer than the longest written one, so a
            // long run becomes several.
            let mut at = cut_start;
            while at < cut_end {
                let n = (cut_end - at).min(u64::from(MAX_UNWRITTEN_LEN));
                out.push(Extent {
                    logical: at as u32,
                    len: n as u32,
                    physical: e.physical + (at - start),
                    unwritten: true,
                });
                at += n;
            }
            if cut_end < end {
                out.push(Extent {
                    logical: cut_end as u32,
                    len: (end - cut_end) as u32,
                    physical: e.physical + (cut_end - start),
                    unwritten: false,
                });
            }
        }
        self.extents = out;
        let mut i = 0;
        while i + 1 < self.extents.len() {
            let before = self.extents.len();
            self.merge_at(i);
            if self.extents.len() == before {
                i += 1;
            }
        }
        converted
    }

    /// Writes the map back into `inode`'s `i_block` and tree blocks, allocating or freeing tree
    /// blocks as needed. Returns the change in tree blocks (for `i_blocks`).
    pub fn store(&mut self, meta: &mut Meta, io: &Io, ino: u32, inode: &mut Inode) -> Result<()> {
        let bs = meta.geo.bs();
        let per_block = node_capacity(bs);
        let in_inode = node_capacity(I_BLOCK_LEN);
        let seed = meta
            .geo
            .csum_seed
            .map(|s| inode_csum_seed(s, ino, inode.generation()));
        // Build the levels bottom-up: each level is a list of nodes (entries per node).
        let mut levels: Vec<Vec<ExtentNode>> = Vec::new();
        let root: ExtentNode;
        if self.extents.len() <= in_inode {
            root = ExtentNode::Leaf(self.extents.clone());
        } else {
            let leaves: Vec<ExtentNode> = self
                .extents
                .chunks(per_block)
                .map(|c| ExtentNode::Leaf(c.to_vec()))
                .collect();
            let mut firsts: Vec<u32> = self
                .extents
                .chunks(per_block)
                .map(|c| c[0].logical)
                .collect();
            levels.push(leaves);
            let mut depth = 1u16;
            while firsts.len() > in_inode {
                if depth >= 4 {
                    return Err(FsError::FileTooBig);
                }
                let nodes: Vec<ExtentNode> = firsts
                    .chunks(per_block)
                    .map(|c| ExtentNode::Index {
                        depth,
                        entries: c
                            .iter()
                            .map(|l| ExtentIndex {
                                logical: *l,
                                child: 0,
                            })
                            .collect(),
                    })
                    .collect();
                firsts = firsts.chunks(per_block).map(|c| c[0]).collect();
                levels.push(nodes);
                depth += 1;
            }
            root = ExtentNode::Index {
                depth,
                entries: firsts
                    .iter()
                    .map(|l| ExtentIndex {
                        logical: *l,
                        child: 0,
                    })
                    .collect(),
            };
        }
        let needed: usize = levels.iter().map(Vec::len).sum();
        // Reserve or release tree blocks.
        let goal = inode_goal(self, meta, ino);
        while self.tree_blocks.len() < needed {
            let b = meta.alloc_block(io, goal)?;
            meta.new_block_mut(b);
            self.tree_blocks.push(b);
            inode.set_blocks_512(
                inode.blocks_512(meta.geo.block_size) + u64::from(meta.geo.block_size / 512),
            );
        }
        while self.tree_blocks.len() > needed {
            // OK to unwrap: the loop condition says the list is not empty.
            let b = self.tree_blocks.pop().expect("non-empty");
            meta.free_block(io, b, true)?;
            inode.set_blocks_512(
                inode
                    .blocks_512(meta.geo.block_size)
                    .saturating_sub(u64::from(meta.geo.block_size / 512)),
            );
        }
        // Assign block numbers level by level and fill in child pointers.
        let mut next = 0usize;
        let mut level_blocks: Vec<Vec<u64>> = Vec::new();
        for level in &levels {
            level_blocks.push(self.tree_blocks[next..next + level.len()].to_vec());
            next += level.len();
        }
        for li in 0..levels.len() {
            let children = if li == 0 {
                None
            } else {
                Some(level_blocks[li - 1].clone())
            };
            for (ni, node) in levels[li].iter_mut().enumerate() {
                if let (Some(ch), ExtentNode::Index { entries, .. }) = (&children, node) {
                    for (k, e) in entries.iter_mut().enumerate() {
                        e.child = ch[ni * per_block + k];
                    }
                }
            }
        }
        let mut root = root;
        if let (Some(top), ExtentNode::Index { entries, .. }) = (level_blocks.last(), &mut root) {
            for (k, e) in entries.iter_mut().enumerate() {
                e.child = top[k];
            }
        }
        // Write the nodes; only blocks whose bytes change join the transaction.
        for (li, level) in levels.iter().enumerate() {
            for (ni, node) in level.iter().enumerate() {
                let nr = level_blocks[li][ni];
                let mut buf = vec![0u8; bs];
                write_node(node, &mut buf);
                if let Some(s) = seed {
                    set_tail_checksum(&mut buf, s);
                }
                if meta.block(io, nr)? != &buf[..] {
                    meta.block_mut(io, nr)?.copy_from_slice(&buf);
                }
            }
        }
        let mut ib = [0u8; I_BLOCK_LEN];
        write_node(&root, &mut ib);
        inode.i_block_mut().copy_from_slice(&ib);
        inode.set_flags(inode.flags() | flags::EXTENTS);
        Ok(())
    }
}

/// A good place for new blocks of `ino`: after its last mapped block, else in its group.
pub(crate) fn inode_goal(map: &ExtentMap, meta: &Meta, ino: u32) -> u64 {
    if let Some(e) = map.extents.last() {
        return e.physical + u64::from(e.len);
    }
    let g = (ino - 1) / meta.geo.inodes_per_group;
    meta.geo.group_first_block(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_merges_and_splits() {
        let mut m = ExtentMap::default();
        m.insert(0, 100, false);
        m.insert(1, 101, false);
        m.insert(3, 103, false);
        assert_eq!(m.extents.len(), 2);
        m.insert(2, 102, false);
        assert_eq!(
            m.extents,
            vec![Extent {
                logical: 0,
                len: 4,
                physical: 100,
                unwritten: false
            }]
        );
        assert_eq!(m.map(2), Some((102, false)));
        assert_eq!(m.map(4), None);
        let freed = m.truncate_from(1);
        assert_eq!(freed, vec![(101, 3)]);
        assert_eq!(m.extents.len(), 1);
    }

    fn map_of(extents: Vec<Extent>) -> ExtentMap {
        ExtentMap {
            extents,
            tree_blocks: Vec::new(),
        }
    }

    fn ext(logical: u32, len: u32, physical: u64, unwritten: bool) -> Extent {
        Extent {
            logical,
            len,
            physical,
            unwritten,
        }
    }

    #[test]
    fn remove_range_splits_the_extents_at_both_ends() {
        let mut m = map_of(vec![
            ext(0, 10, 100, false),
            ext(10, 5, 200, true),
            ext(20, 4, 300, false),
        ]);
        let freed = m.remove_range(3, 12);
        assert_eq!(freed, vec![(103, 7), (200, 2)]);
        assert_eq!(
            m.extents,
            vec![
                ext(0, 3, 100, false),
                ext(12, 3, 202, true),
                ext(20, 4, 300, false)
            ]
        );
        // A range inside one extent makes two of it; a range over nothing frees nothing.
        assert_eq!(m.remove_range(21, 22), vec![(301, 1)]);
        assert_eq!(m.extents.len(), 4);
        assert!(m.remove_range(15, 20).is_empty());
        // An empty range (a punch inside one block) removes nothing.
        assert!(m.remove_range(2, 1).is_empty());
        assert_eq!(m.mark_unwritten_range(2, 1), 0);
        // Past the last possible block.
        assert_eq!(m.remove_range(0, 1 << 33).len(), 4);
        assert!(m.extents.is_empty());
    }

    #[test]
    fn mark_unwritten_range_converts_and_merges() {
        let mut m = map_of(vec![ext(0, 10, 100, false), ext(10, 5, 110, true)]);
        assert_eq!(m.mark_unwritten_range(4, 12), 6);
        // The converted blocks join the unwritten extent that follows them.
        assert_eq!(
            m.extents,
            vec![ext(0, 4, 100, false), ext(4, 11, 104, true)]
        );
        assert_eq!(m.map(5), Some((105, true)));
        // An initialised extent of the largest length becomes two unwritten ones.
        let mut big = map_of(vec![ext(0, MAX_INIT_LEN, 1000, false)]);
        assert_eq!(big.mark_unwritten_range(0, u64::from(MAX_INIT_LEN)), 32768);
        assert_eq!(big.extents.len(), 2);
        assert!(big
            .extents
            .iter()
            .all(|e| e.unwritten && e.len <= MAX_UNWRITTEN_LEN));
    }

    #[test]
    fn mark_written_splits_unwritten() {
        let mut m = ExtentMap::default();
        m.extents.push(Extent {
            logical: 10,
            len: 5,
            physical: 50,
            unwritten: true,
        });
        m.mark_written(12);
        assert_eq!(m.extents.len(), 3);
        assert_eq!(m.map(12), Some((52, false)));
        assert_eq!(m.map(13), Some((53, true)));
        m.mark_written(13);
        assert_eq!(m.find(12).unwrap().len, 2);
    }
}
