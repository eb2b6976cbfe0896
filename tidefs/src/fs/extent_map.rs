//! A file's block map in memory, and the shape of its on-disk extent tree.
//!
//! What this file owns: the extents of an inode as one sorted list, partitioned into the nodes
//! of the tree that holds them on disk (a mirror of each node: how many entries it holds, the
//! block it lives in, the key its parent names it by, whether its bytes must be rewritten); the
//! edits file operations make (map a block, merge neighbours, split at a range, truncate, mark
//! written or unwritten), each of which replaces one window of the list and marks dirty only
//! the leaves that held it; and the tree's reshaping before a store ([`ExtentMap::normalize`]:
//! pass a full node's excess to a neighbour or split it, drop empty nodes, grow or shrink the
//! depth, as ext4 does) and the list of nodes whose bytes must be rewritten
//! ([`ExtentMap::take_dirty`]). Pure data: reading, allocating and writing tree blocks is
//! `fs/extents.rs`; the byte layout of a node is `format/ext4/extent.rs`.
//!
//! Invariants:
//! - `extents` is sorted by logical block, non-overlapping, each extent within the format's
//!   length limits (length > 0) and ending below 2^32 - 1;
//! - `levels[0]` are the leaves, `levels[d]` the index nodes of depth `d`, in logical order;
//!   the last level holds exactly one node, the root in the inode's `i_block` (block 0);
//! - the leaves' counts add up to `extents.len()` (leaf `k` holds the extents that follow
//!   those of leaves `0..k`), and each index level's counts add up to the number of nodes of
//!   the level below: the tree's shape is fully given by the counts;
//! - between stores a node may be empty or over its capacity (edits only count); after
//!   [`ExtentMap::normalize`] every node below the root holds 1..=capacity entries, the root
//!   at most 4, and the map has depth 0 when it fits in the inode;
//! - every node below the root with a nonzero block owns that tree block (counted in the
//!   inode's `i_blocks`); blocks no node uses any more wait in `released` for the next store.

use crate::format::ext4::extent::{
    Extent, ExtentIndex, ExtentNode, MAX_DEPTH, MAX_INIT_LEN, MAX_UNWRITTEN_LEN,
};
use crate::{FsError, Result};

/// One node of the on-disk tree, mirrored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    /// Entries: extents of a leaf, children of an index node.
    pub count: usize,
    /// Its tree block; 0 for the root (in `i_block`) and for a node not allocated yet.
    pub block: u64,
    /// The first logical block its parent's entry names, as last written.
    pub key: u32,
    /// Its bytes must be rewritten.
    pub dirty: bool,
}

impl Node {
    /// A node as read from disk.
    pub fn on_disk(count: usize, block: u64, key: u32) -> Node {
        Node {
            count,
            block,
            key,
            dirty: false,
        }
    }

    /// A node not written yet (the root, or a node without a block): dirty.
    fn fresh(count: usize) -> Node {
        Node {
            count,
            block: 0,
            key: 0,
            dirty: true,
        }
    }
}

/// The block map of one inode.
#[derive(Clone, Debug)]
pub(crate) struct ExtentMap {
    extents: Vec<Extent>,
    levels: Vec<Vec<Node>>,
    released: Vec<u64>,
}

impl Default for ExtentMap {
    /// An empty map: a leaf root without entries.
    fn default() -> ExtentMap {
        ExtentMap {
            extents: Vec::new(),
            levels: vec![vec![Node::fresh(0)]],
            released: Vec::new(),
        }
    }
}

/// `a` and `b` joined into one extent, when `b` continues `a` logically and physically, in
/// the same state, within the longest length.
fn joined(a: &Extent, b: &Extent) -> Option<Extent> {
    let max = if a.unwritten {
        MAX_UNWRITTEN_LEN
    } else {
        MAX_INIT_LEN
    };
    (a.unwritten == b.unwritten
        && a.logical_end() == u64::from(b.logical)
        && a.physical + u64::from(a.len) == b.physical
        && a.len + b.len <= max)
        .then_some(Extent {
            len: a.len + b.len,
            ..*a
        })
}

/// How a node of `count` entries splits into nodes of at most `cap`: the last node of a level
/// (where appends land) keeps its nodes full, any other splits evenly, leaving room on both
/// sides.
fn split_counts(count: usize, cap: usize, last: bool) -> Vec<usize> {
    if last {
        let mut v = vec![cap; count / cap];
        if count % cap != 0 {
            v.push(count % cap);
        }
        v
    } else {
        let k = count.div_ceil(cap);
        (0..k)
            .map(|i| count / k + usize::from(i < count % k))
            .collect()
    }
}

impl ExtentMap {
    /// A map read from disk: its extents and its nodes by level (leaves first, root last).
    pub fn from_tree(extents: Vec<Extent>, levels: Vec<Vec<Node>>) -> ExtentMap {
        debug_assert_eq!(levels.last().map(Vec::len), Some(1));
        debug_assert_eq!(
            levels[0].iter().map(|n| n.count).sum::<usize>(),
            extents.len()
        );
        ExtentMap {
            extents,
            levels,
            released: Vec::new(),
        }
    }

    /// The extents, in logical order.
    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// The blocks the tree uses (leaves first, then index levels).
    pub fn tree_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.levels
            .iter()
            .flatten()
            .map(|n| n.block)
            .filter(|b| *b != 0)
    }

    /// Empties the map for an inode being freed: returns every tree block it holds or held
    /// since the last store.
    pub fn take_tree_blocks(&mut self) -> Vec<u64> {
        let mut blocks: Vec<u64> = self.tree_blocks().collect();
        blocks.append(&mut self.released);
        *self = ExtentMap::default();
        blocks
    }

    /// The first mapped block at or after `lblk`: (logical, physical).
    pub fn next_mapped(&self, lblk: u32) -> Option<(u32, u64)> {
        let i = self.index_after(u64::from(lblk));
        self.extents.get(i).map(|e| {
            let l = lblk.max(e.logical);
            (l, e.physical + u64::from(l - e.logical))
        })
    }

    /// The unmapped runs of logical blocks in `[first, last)`, as `(start, end)` pairs, found
    /// from the extents (a range of millions of blocks has a few hundred extents).
    pub fn holes(&self, first: u32, last: u32) -> Vec<(u32, u32)> {
        let mut holes = Vec::new();
        let mut at = first;
        while at < last {
            match self.next_mapped(at) {
                Some((l, _)) if l < last => {
                    if l > at {
                        holes.push((at, l));
                    }
                    // OK to unwrap: `l` is mapped, so an extent holds it.
                    let e = self.find(l).expect("mapped block has an extent");
                    at = e.logical_end().min(u64::from(last)) as u32;
                }
                _ => {
                    holes.push((at, last));
                    at = last;
                }
            }
        }
        holes
    }

    /// The extent containing logical block `lblk`.
    pub fn find(&self, lblk: u32) -> Option<Extent> {
        let i = self.index_after(u64::from(lblk));
        self.extents.get(i).filter(|e| e.logical <= lblk).copied()
    }

    /// Maps one logical block: (physical, unwritten).
    pub fn map(&self, lblk: u32) -> Option<(u64, bool)> {
        self.find(lblk)
            .map(|e| (e.physical + u64::from(lblk - e.logical), e.unwritten))
    }

    /// A map of just the extents that hold the logical blocks `lblks` (blocks past the 32-bit
    /// logical space hold nothing): it maps those blocks as this map does, for looking them up
    /// after this one changes, without copying the whole list. Not for storing.
    pub fn excerpt(&self, lblks: impl IntoIterator<Item = u64>) -> ExtentMap {
        let mut extents: Vec<Extent> = lblks
            .into_iter()
            .filter_map(|l| u32::try_from(l).ok().and_then(|l| self.find(l)))
            .collect();
        extents.sort_unstable_by_key(|e| e.logical);
        extents.dedup();
        let n = extents.len();
        ExtentMap::from_tree(extents, vec![vec![Node::on_disk(n, 0, 0)]])
    }

    /// Index of the first extent that ends after logical block `lblk`.
    fn index_after(&self, lblk: u64) -> usize {
        self.extents.partition_point(|e| e.logical_end() <= lblk)
    }

    /// The window `[a, b)` of the extents that overlap logical blocks `[from, to)`.
    fn overlapping(&self, from: u64, to: u64) -> (usize, usize) {
        let a = self.index_after(from);
        let b = self.extents.partition_point(|e| u64::from(e.logical) < to);
        (a, b.max(a))
    }

    /// Inserts the mapping `lblk → pblk` for one unmapped block, merging with neighbours.
    pub fn insert(&mut self, lblk: u32, pblk: u64, unwritten: bool) {
        self.insert_run(lblk, pblk, 1, unwritten);
    }

    /// Maps the `len` unmapped logical blocks from `lblk` to the physical blocks from
    /// `pblk`, in extents of at most the format's length, merged with their neighbours.
    pub fn insert_run(&mut self, lblk: u32, pblk: u64, len: u32, unwritten: bool) {
        let i = self.index_after(u64::from(lblk));
        debug_assert!(
            self.extents
                .get(i)
                .is_none_or(|e| u64::from(e.logical) >= u64::from(lblk) + u64::from(len)),
            "block already mapped"
        );
        let max = if unwritten {
            MAX_UNWRITTEN_LEN
        } else {
            MAX_INIT_LEN
        };
        let parts = (0..len)
            .step_by(max as usize)
            .map(|off| Extent {
                logical: lblk + off,
                len: max.min(len - off),
                physical: pblk + u64::from(off),
                unwritten,
            })
            .collect();
        self.replace_merging(i, i, parts);
    }

    /// Marks one block of an unwritten extent as written (splitting the extent).
    pub fn mark_written(&mut self, lblk: u32) {
        let i = self.index_after(u64::from(lblk));
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
        self.replace_merging(i, i + 1, parts);
    }

    /// Removes every mapping at or after logical block `from`; returns the freed physical runs.
    pub fn truncate_from(&mut self, from: u32) -> Vec<(u64, u32)> {
        self.remove_range(u64::from(from), u64::MAX)
    }

    /// Removes the mappings of logical blocks `[from, to)`, splitting the extents that straddle
    /// either end; returns the freed physical runs.
    pub fn remove_range(&mut self, from: u64, to: u64) -> Vec<(u64, u32)> {
        let mut freed = Vec::new();
        if from >= to {
            return freed;
        }
        let (a, b) = self.overlapping(from, to);
        let mut keep = Vec::with_capacity(2);
        for e in &self.extents[a..b] {
            let (start, end) = (u64::from(e.logical), e.logical_end());
            let (cut_start, cut_end) = (start.max(from), end.min(to));
            if start < cut_start {
                // Shorter than `e`, so it fits in u32.
                keep.push(Extent {
                    len: (cut_start - start) as u32,
                    ..*e
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
        self.splice(a, b, keep);
        freed
    }

    /// Marks the mapped blocks of `[from, to)` unwritten, so they read as zeros and stay
    /// allocated. Returns how many of them were written before.
    pub fn mark_unwritten_range(&mut self, from: u64, to: u64) -> u64 {
        let mut converted = 0u64;
        if from >= to {
            return converted;
        }
        let (a, b) = self.overlapping(from, to);
        let mut out = Vec::with_capacity(b - a + 2);
        for e in &self.extents[a..b] {
            let (start, end) = (u64::from(e.logical), e.logical_end());
            if e.unwritten {
                out.push(*e);
                continue;
            }
            let (cut_start, cut_end) = (start.max(from), end.min(to));
            if start < cut_start {
                out.push(Extent {
                    len: (cut_start - start) as u32,
                    ..*e
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
        if converted > 0 {
            self.replace_merging(a, b, out);
        }
        converted
    }

    /// Replaces the extents `[a, b)` with `parts` (sorted, covering what they covered or
    /// less), joining what can be joined among `parts` and with the extents on either side.
    fn replace_merging(&mut self, mut a: usize, mut b: usize, parts: Vec<Extent>) {
        let mut out: Vec<Extent> = Vec::with_capacity(parts.len());
        for p in parts {
            match out.last_mut() {
                Some(last) if joined(last, &p).is_some() => {
                    *last = joined(last, &p).expect("checked");
                }
                _ => out.push(p),
            }
        }
        if let (Some(prev), Some(first)) = (a.checked_sub(1), out.first_mut()) {
            if let Some(j) = joined(&self.extents[prev], first) {
                *first = j;
                a = prev;
            }
        }
        if let (Some(next), Some(last)) = (self.extents.get(b), out.last_mut()) {
            if let Some(j) = joined(last, next) {
                *last = j;
                b += 1;
            }
        }
        self.splice(a, b, out);
    }

    /// Replaces the extents `[a, b)` with `with`, keeping the leaves' counts right: the
    /// leaves that lose extents and the one that receives `with` (the leaf holding position
    /// `a`; for a pure insertion at the end of a leaf, that leaf, so an append changes no
    /// leaf's first extent) become dirty. Nodes left empty or over capacity are dealt with by
    /// [`ExtentMap::normalize`].
    fn splice(&mut self, a: usize, b: usize, with: Vec<Extent>) {
        debug_assert!(a <= b && b <= self.extents.len());
        if a == b && with.is_empty() {
            return;
        }
        let leaves = &mut self.levels[0];
        let mut start = 0;
        let mut s = leaves.len() - 1;
        for (k, leaf) in leaves.iter().enumerate() {
            let end = start + leaf.count;
            if a < end || (a == b && a == end) {
                s = k;
                break;
            }
            start = end;
        }
        let mut at = start;
        for leaf in &mut leaves[s..] {
            if at >= b {
                break;
            }
            let end = at + leaf.count;
            let gone = b.min(end).saturating_sub(a.max(at));
            leaf.count -= gone;
            leaf.dirty |= gone > 0;
            at = end;
        }
        leaves[s].count += with.len();
        leaves[s].dirty = true;
        self.extents.splice(a..b, with);
    }

    /// Reshapes the tree after edits, as ext4 does: a node over `per_block` entries passes the
    /// excess to a neighbour with room or splits, the new nodes getting no block yet
    /// ([`Self::unallocated`]); an empty node goes, its block released
    /// ([`Self::take_released`]); a full root moves down into a new node and the tree grows one
    /// level; a root with one child that fits in the inode takes that child's entries (the tree
    /// shrinks one level), and a map that fits in the inode becomes a leaf root. Every node
    /// whose entries change is marked dirty. Fails with `FileTooBig` when the tree would need
    /// more than 4 levels below the root.
    pub fn normalize(&mut self, per_block: usize, in_inode: usize) -> Result<()> {
        loop {
            let top = self.levels.len() - 1;
            if top > 0 && self.extents.len() <= in_inode {
                let blocks: Vec<u64> = self.tree_blocks().collect();
                self.released.extend(blocks);
                self.levels = vec![vec![Node::fresh(self.extents.len())]];
                return Ok(());
            }
            for l in 0..top {
                self.normalize_level(l, per_block);
            }
            let root = self.levels[top][0];
            if root.count > in_inode {
                if top + 1 >= usize::from(MAX_DEPTH) {
                    return Err(FsError::FileTooBig);
                }
                self.levels[top][0] = Node::fresh(root.count);
                self.levels.push(vec![Node::fresh(1)]);
                continue;
            }
            if top > 0 && root.count == 1 && self.levels[top - 1][0].count <= in_inode {
                let child = self.levels[top - 1][0];
                if child.block != 0 {
                    self.released.push(child.block);
                }
                self.levels.pop();
                self.levels[top - 1][0] = Node::fresh(child.count);
                continue;
            }
            return Ok(());
        }
    }

    /// Drops the empty nodes of level `l` (not the root) and deals with those that hold more
    /// than `cap` entries: the entries over `cap` move into the next node, or else the
    /// previous one, when it has room for them (as the kernel moves an insertion into the
    /// next leaf), else the node splits; parents' counts follow.
    fn normalize_level(&mut self, l: usize, cap: usize) {
        let (lower, upper) = self.levels.split_at_mut(l + 1);
        let nodes = std::mem::take(&mut lower[l]);
        let total = nodes.len();
        let mut out: Vec<Node> = Vec::with_capacity(total + 1);
        let mut it = nodes.into_iter().peekable();
        let mut seen = 0;
        for parent in &mut upper[0] {
            let mut kept = 0;
            for _ in 0..parent.count {
                // OK to unwrap: the parents' counts add up to the nodes of this level.
                let mut n = it.next().expect("parent counts match the level below");
                seen += 1;
                let excess = n.count.saturating_sub(cap);
                // Entries move between neighbours by their counts alone (each node holds the
                // entries that follow its predecessor's); the keys follow at the store.
                let room = |x: &Node| x.count + excess <= cap;
                let neighbour = match it.peek_mut().filter(|x| room(x)) {
                    Some(next) => Some(next),
                    None => out.last_mut().filter(|x| room(x)),
                };
                if excess > 0 {
                    if let Some(x) = neighbour {
                        x.count += excess;
                        x.dirty = true;
                        n.count = cap;
                    }
                }
                if n.count == 0 {
                    if n.block != 0 {
                        self.released.push(n.block);
                    }
                    parent.dirty = true;
                } else if n.count <= cap {
                    out.push(n);
                    kept += 1;
                } else {
                    parent.dirty = true;
                    for (k, c) in split_counts(n.count, cap, seen == total)
                        .into_iter()
                        .enumerate()
                    {
                        out.push(Node {
                            block: if k == 0 { n.block } else { 0 },
                            key: n.key,
                            ..Node::fresh(c)
                        });
                        kept += 1;
                    }
                }
            }
            parent.count = kept;
        }
        lower[l] = out;
    }

    /// The block slots of the nodes that have no tree block yet (made by
    /// [`Self::normalize`]), for the store to fill.
    pub fn unallocated(&mut self) -> impl Iterator<Item = &mut u64> + '_ {
        let top = self.levels.len() - 1;
        self.levels[..top]
            .iter_mut()
            .flatten()
            .map(|n| &mut n.block)
            .filter(|b| **b == 0)
    }

    /// The tree blocks no node uses any more, for the store to free.
    pub fn take_released(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.released)
    }

    /// After [`Self::normalize`] and with every node's block assigned: brings the index keys
    /// up to date (a node's key is the first logical block under it; a changed key dirties
    /// the parent), then returns the dirty nodes below the root as (block, contents), and the
    /// root, and marks everything clean.
    pub fn take_dirty(&mut self) -> (Vec<(u64, ExtentNode)>, ExtentNode) {
        let top = self.levels.len() - 1;
        let mut pos = 0;
        let mut firsts: Vec<u32> = self.levels[0]
            .iter()
            .map(|n| {
                let k = self.extents.get(pos).map_or(0, |e| e.logical);
                pos += n.count;
                k
            })
            .collect();
        for l in 0..top {
            let (lower, upper) = self.levels.split_at_mut(l + 1);
            let mut next = Vec::with_capacity(upper[0].len());
            let mut c = 0;
            for parent in &mut upper[0] {
                next.push(firsts.get(c).copied().unwrap_or(0));
                for (node, &first) in lower[l][c..c + parent.count].iter_mut().zip(&firsts[c..]) {
                    if node.key != first {
                        node.key = first;
                        parent.dirty = true;
                    }
                }
                c += parent.count;
            }
            firsts = next;
        }
        let mut dirty = Vec::new();
        let mut root = ExtentNode::Leaf(Vec::new());
        for l in 0..=top {
            let mut c = 0;
            for k in 0..self.levels[l].len() {
                let n = self.levels[l][k];
                let range = c..c + n.count;
                c += n.count;
                if !n.dirty && l < top {
                    continue;
                }
                let node = if l == 0 {
                    ExtentNode::Leaf(self.extents[range].to_vec())
                } else {
                    ExtentNode::Index {
                        // At most MAX_DEPTH levels.
                        depth: l as u16,
                        entries: self.levels[l - 1][range]
                            .iter()
                            .map(|ch| ExtentIndex {
                                logical: ch.key,
                                child: ch.block,
                            })
                            .collect(),
                    }
                };
                self.levels[l][k].dirty = false;
                if l == top {
                    root = node;
                } else {
                    dirty.push((n.block, node));
                }
            }
        }
        (dirty, root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ext(logical: u32, len: u32, physical: u64, unwritten: bool) -> Extent {
        Extent {
            logical,
            len,
            physical,
            unwritten,
        }
    }

    fn map_of(extents: Vec<Extent>) -> ExtentMap {
        let n = extents.len();
        ExtentMap::from_tree(extents, vec![vec![Node::on_disk(n, 0, 0)]])
    }

    /// A simulated disk for the tree: the blocks a store would write, and the root.
    struct Disk {
        blocks: HashMap<u64, ExtentNode>,
        root: ExtentNode,
        next_block: u64,
        /// Tree blocks written by the last store.
        written: usize,
    }

    impl Disk {
        fn new() -> Disk {
            Disk {
                blocks: HashMap::new(),
                root: ExtentNode::Leaf(Vec::new()),
                next_block: 1000,
                written: 0,
            }
        }

        /// What `ExtentMap::store` does, with node capacities `per_block` and `in_inode`.
        fn store(&mut self, m: &mut ExtentMap, per_block: usize, in_inode: usize) {
            m.normalize(per_block, in_inode).unwrap();
            for b in m.take_released() {
                assert!(
                    self.blocks.remove(&b).is_some(),
                    "released block {b} unused"
                );
            }
            for slot in m.unallocated() {
                self.next_block += 1;
                *slot = self.next_block;
            }
            let (dirty, root) = m.take_dirty();
            self.written = dirty.len();
            for (b, node) in dirty {
                assert!(node_len(&node) <= per_block && node_len(&node) > 0);
                self.blocks.insert(b, node);
            }
            assert!(node_len(&root) <= in_inode);
            self.root = root;
            // The tree on "disk" holds exactly the map's extents, in order, keys valid, every
            // block reachable once.
            let mut seen = Vec::new();
            let got = self.walk(&self.root.clone(), 0, u64::MAX, &mut seen);
            assert_eq!(got, m.extents(), "on-disk tree differs from the map");
            seen.sort_unstable();
            let mut all: Vec<u64> = self.blocks.keys().copied().collect();
            all.sort_unstable();
            assert_eq!(seen, all, "tree blocks leaked or shared");
            let mut listed: Vec<u64> = m.tree_blocks().collect();
            listed.sort_unstable();
            assert_eq!(listed, all);
        }

        fn walk(&self, node: &ExtentNode, lo: u64, hi: u64, seen: &mut Vec<u64>) -> Vec<Extent> {
            match node {
                ExtentNode::Leaf(exts) => {
                    for e in exts {
                        assert!(u64::from(e.logical) >= lo && e.logical_end() <= hi);
                    }
                    exts.clone()
                }
                ExtentNode::Index { depth, entries } => {
                    let mut out = Vec::new();
                    for (k, x) in entries.iter().enumerate() {
                        let next = entries.get(k + 1).map_or(hi, |n| u64::from(n.logical));
                        assert!(u64::from(x.logical) >= lo && u64::from(x.logical) < next);
                        seen.push(x.child);
                        let child = &self.blocks[&x.child];
                        let child_depth = match child {
                            ExtentNode::Leaf(_) => 0,
                            ExtentNode::Index { depth, .. } => *depth,
                        };
                        assert_eq!(child_depth + 1, *depth);
                        out.extend(self.walk(child, u64::from(x.logical), next, seen));
                    }
                    out
                }
            }
        }

        fn depth(&self) -> u16 {
            match &self.root {
                ExtentNode::Leaf(_) => 0,
                ExtentNode::Index { depth, .. } => *depth,
            }
        }
    }

    fn node_len(n: &ExtentNode) -> usize {
        match n {
            ExtentNode::Leaf(e) => e.len(),
            ExtentNode::Index { entries, .. } => entries.len(),
        }
    }

    /// Goal: the holes of a range, from the extents: before, between and after them, clipped
    /// to the range, and none where it is all mapped.
    #[test]
    fn holes_are_the_unmapped_runs_of_a_range() {
        let mut m = ExtentMap::default();
        m.insert_run(10, 500, 5, false);
        m.insert_run(20, 900, 40_000, true);
        assert_eq!(
            m.extents().len(),
            3,
            "an unwritten run splits at its format's length"
        );
        assert_eq!(
            m.holes(0, 100_000),
            vec![(0, 10), (15, 20), (40_020, 100_000)]
        );
        assert_eq!(m.holes(12, 18), vec![(15, 18)]);
        assert_eq!(m.holes(10, 15), vec![]);
        assert_eq!(m.holes(30, 31), vec![]);
        assert_eq!(ExtentMap::default().holes(7, 9), vec![(7, 9)]);
    }

    #[test]
    fn insert_merges_and_splits() {
        let mut m = ExtentMap::default();
        m.insert(0, 100, false);
        m.insert(1, 101, false);
        m.insert(3, 103, false);
        assert_eq!(m.extents().len(), 2);
        m.insert(2, 102, false);
        assert_eq!(m.extents(), [ext(0, 4, 100, false)]);
        assert_eq!(m.map(2), Some((102, false)));
        assert_eq!(m.map(4), None);
        let freed = m.truncate_from(1);
        assert_eq!(freed, vec![(101, 3)]);
        assert_eq!(m.extents().len(), 1);
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
            m.extents(),
            [
                ext(0, 3, 100, false),
                ext(12, 3, 202, true),
                ext(20, 4, 300, false)
            ]
        );
        // A range inside one extent makes two of it; a range over nothing frees nothing.
        assert_eq!(m.remove_range(21, 22), vec![(301, 1)]);
        assert_eq!(m.extents().len(), 4);
        assert!(m.remove_range(15, 20).is_empty());
        // An empty range (a punch inside one block) removes nothing.
        assert!(m.remove_range(2, 1).is_empty());
        assert_eq!(m.mark_unwritten_range(2, 1), 0);
        // Past the last possible block.
        assert_eq!(m.remove_range(0, 1 << 33).len(), 4);
        assert!(m.extents().is_empty());
    }

    #[test]
    fn mark_unwritten_range_converts_and_merges() {
        let mut m = map_of(vec![ext(0, 10, 100, false), ext(10, 5, 110, true)]);
        assert_eq!(m.mark_unwritten_range(4, 12), 6);
        // The converted blocks join the unwritten extent that follows them.
        assert_eq!(m.extents(), [ext(0, 4, 100, false), ext(4, 11, 104, true)]);
        assert_eq!(m.map(5), Some((105, true)));
        // An initialised extent of the largest length becomes two unwritten ones.
        let mut big = map_of(vec![ext(0, MAX_INIT_LEN, 1000, false)]);
        assert_eq!(big.mark_unwritten_range(0, u64::from(MAX_INIT_LEN)), 32768);
        assert_eq!(big.extents().len(), 2);
        assert!(big
            .extents()
            .iter()
            .all(|e| e.unwritten && e.len <= MAX_UNWRITTEN_LEN));
    }

    #[test]
    fn an_excerpt_maps_its_blocks_as_the_map_did() {
        let mut m = fragmented(100);
        let part = m.excerpt([10, 11, 10, 150, 1 << 40]);
        assert_eq!(
            part.extents(),
            [ext(10, 1, 10_015, false), ext(150, 1, 10_225, false)]
        );
        m.remove_range(0, 200);
        assert_eq!(part.map(10), Some((10_015, false)));
        assert_eq!(part.map(11), None);
    }

    #[test]
    fn mark_written_splits_unwritten() {
        let mut m = map_of(vec![ext(10, 5, 50, true)]);
        m.mark_written(12);
        assert_eq!(m.extents().len(), 3);
        assert_eq!(m.map(12), Some((52, false)));
        assert_eq!(m.map(13), Some((53, true)));
        m.mark_written(13);
        assert_eq!(m.find(12).unwrap().len, 2);
    }

    /// Maps the even logical blocks `0, 2, .. 2(n-1)` to scattered physical blocks: `n`
    /// extents that cannot merge.
    fn fragmented(n: u32) -> ExtentMap {
        let mut m = ExtentMap::default();
        for k in 0..n {
            m.insert(2 * k, 10_000 + 3 * u64::from(k), false);
        }
        m
    }

    #[test]
    fn appends_fill_leaves_and_grow_the_depth() {
        let mut disk = Disk::new();
        let mut m = ExtentMap::default();
        for k in 0..4 {
            m.insert(2 * k, 10_000 + 3 * u64::from(k), false);
            disk.store(&mut m, 4, 2);
        }
        // 4 extents in leaves of 4 under a root of 2: depth 1, one full leaf.
        assert_eq!(disk.depth(), 1);
        for k in 4..40 {
            m.insert(2 * k, 10_000 + 3 * u64::from(k), false);
            disk.store(&mut m, 4, 2);
            // An append rewrites the last leaf; a split adds one node per level it reaches
            // (and rewrites the node it splits).
            let bound = 2 * usize::from(disk.depth()) + 1;
            assert!(disk.written <= bound, "append {k} wrote {}", disk.written);
            if k % 4 != 0 {
                assert_eq!(disk.written, 1, "append {k} without a split");
            }
        }
        // 10 full leaves, 3 index nodes of depth 1, 1 of depth 2 under the root.
        assert_eq!(
            m.levels[0].iter().map(|n| n.count).collect::<Vec<_>>(),
            [4; 10]
        );
        assert_eq!(disk.depth(), 3);
        assert_eq!(disk.blocks.len(), 10 + 3 + 1);
    }

    #[test]
    fn inserts_in_a_full_leaf_split_it_and_touch_one_leaf_otherwise() {
        let mut disk = Disk::new();
        let mut m = fragmented(300);
        disk.store(&mut m, 10, 4);
        let leaves = m.levels[0].len();
        // An odd block in the middle goes into the leaf that holds its neighbours; the leaf
        // is full (appends fill them), so it splits: two leaves and their parent.
        m.insert(301, 50_000, false);
        disk.store(&mut m, 10, 4);
        assert_eq!(m.levels[0].len(), leaves + 1);
        assert!(disk.written <= 4, "wrote {}", disk.written);
        // The next insert next to it finds room: one leaf.
        m.insert(303, 50_010, false);
        disk.store(&mut m, 10, 4);
        assert_eq!(disk.written, 1);
        // Marking a block written inside an unwritten extent of one leaf: one leaf.
        m.remove_range(100, 101);
        m.insert(100, 60_000, true);
        disk.store(&mut m, 10, 4);
        m.mark_written(100);
        disk.store(&mut m, 10, 4);
        assert_eq!(disk.written, 1);
    }

    #[test]
    fn a_full_leaf_passes_its_excess_to_a_neighbour_with_room() {
        let mut disk = Disk::new();
        // Ten full leaves of 4: leaf k holds logical blocks 8k, 8k+2, 8k+4, 8k+6.
        let mut m = fragmented(40);
        disk.store(&mut m, 4, 4);
        let blocks = disk.blocks.len();
        m.remove_range(26, 27);
        disk.store(&mut m, 4, 4);
        assert_eq!(disk.written, 1);
        // Leaf 2 overflows; its last extent moves to leaf 3, which changes leaf 3's key.
        m.insert(19, 90_000, false);
        disk.store(&mut m, 4, 4);
        assert_eq!(disk.blocks.len(), blocks, "no split");
        assert_eq!(disk.written, 3, "two leaves and their parent");
        assert_eq!(m.levels[0][3].key, 22);
        // Now neither neighbour of leaf 2 has room: it splits, and so does its full parent,
        // whose neighbour is full too.
        m.insert(17, 90_010, false);
        disk.store(&mut m, 4, 4);
        assert_eq!(disk.blocks.len(), blocks + 2);
    }

    #[test]
    fn merge_across_a_leaf_boundary_updates_the_index() {
        let mut disk = Disk::new();
        // Pairs (2k, 2k+1) whose physical blocks follow each other except across the gap:
        // filling the gap joins the last extent of one leaf with the first of the next.
        let mut m = ExtentMap::default();
        for k in 0..40u32 {
            m.insert(2 * k, 1000 + 2 * u64::from(k), false);
        }
        disk.store(&mut m, 4, 4);
        let first_of_second = m.levels[0][0].count;
        // The extent ending leaf 0 is at logical 2(c-1), the next leaf starts at 2c.
        let l = 2 * first_of_second as u32 - 1;
        m.insert(l, 1000 + u64::from(l), false);
        // Both neighbours merge into one extent (physical blocks are contiguous).
        assert_eq!(m.find(l).unwrap().len, 3);
        disk.store(&mut m, 4, 4);
        // Leaf 0 changed, leaf 1 lost its first extent, so its key changed: the parent too.
        assert!(disk.written <= 3, "wrote {}", disk.written);
        assert_eq!(m.extents().len(), 39);
    }

    #[test]
    fn a_loaded_key_below_its_leafs_first_extent_is_corrected() {
        // As the kernel may leave it: leaf B's key (10) is below its first extent (20). An
        // extent at 12 goes to the end of leaf A, past B's old key: the store must rewrite
        // the root with B's real first block.
        let a = vec![
            ext(0, 2, 100, false),
            ext(3, 2, 200, false),
            ext(6, 4, 300, false),
        ];
        let b = vec![
            ext(20, 1, 400, false),
            ext(22, 1, 500, false),
            ext(24, 1, 600, false),
        ];
        let mut disk = Disk::new();
        disk.blocks.insert(1, ExtentNode::Leaf(a.clone()));
        disk.blocks.insert(2, ExtentNode::Leaf(b.clone()));
        let mut m = ExtentMap::from_tree(
            [a, b].concat(),
            vec![
                vec![Node::on_disk(3, 1, 0), Node::on_disk(3, 2, 10)],
                vec![Node::on_disk(2, 0, 0)],
            ],
        );
        m.insert(12, 700, false);
        disk.store(&mut m, 4, 4);
        assert_eq!(disk.written, 1, "leaf A only");
        let ExtentNode::Index { entries, .. } = &disk.root else {
            panic!("depth 1 expected");
        };
        assert_eq!(entries[1].logical, 20);
    }

    #[test]
    fn removals_free_leaves_and_shrink_the_tree() {
        let mut disk = Disk::new();
        let mut m = fragmented(200);
        disk.store(&mut m, 5, 4);
        assert_eq!(disk.depth(), 3);
        let blocks = disk.blocks.len();
        // A punch that empties several leaves in the middle frees them.
        let freed = m.remove_range(40, 200);
        assert_eq!(freed.len(), 80);
        disk.store(&mut m, 5, 4);
        assert!(disk.blocks.len() <= blocks - 16);
        // Truncating to 3 extents brings the map back into the inode, all blocks freed.
        m.truncate_from(6);
        disk.store(&mut m, 5, 4);
        assert_eq!(disk.depth(), 0);
        assert!(disk.blocks.is_empty());
        assert_eq!(m.extents().len(), 3);
        // Regrow, then truncate to zero.
        for k in 3..60 {
            m.insert(2 * k, 30_000 + 3 * u64::from(k), false);
        }
        disk.store(&mut m, 5, 4);
        assert!(disk.depth() >= 2);
        assert_eq!(m.truncate_from(0).len(), 60);
        disk.store(&mut m, 5, 4);
        assert_eq!(disk.depth(), 0);
        assert!(disk.blocks.is_empty() && m.extents().is_empty());
        assert_eq!(m.levels.len(), 1);
    }

    #[test]
    fn random_edits_keep_the_disk_tree_equal_to_the_map() {
        let mut disk = Disk::new();
        let mut m = ExtentMap::default();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut next_phys = 100_000u64;
        for round in 0..400 {
            match rand(10) {
                0 => {
                    let from = rand(2000);
                    m.remove_range(from, from + rand(200));
                }
                1 => {
                    let from = rand(2000);
                    m.mark_unwritten_range(from, from + rand(50));
                }
                2 => {
                    let l = rand(2000) as u32;
                    if m.map(l).is_some_and(|(_, u)| u) {
                        m.mark_written(l);
                    }
                }
                3 if round % 50 == 0 => {
                    m.truncate_from(rand(2000) as u32);
                }
                _ => {
                    for _ in 0..rand(40) {
                        let l = rand(2000) as u32;
                        if m.map(l).is_none() {
                            next_phys += 1 + rand(2);
                            m.insert(l, next_phys, rand(4) == 0);
                        }
                    }
                }
            }
            disk.store(&mut m, 10, 4);
        }
    }
}
