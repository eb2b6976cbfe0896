//! A file's block map in memory: the extents of an inode as a sorted list, with the edits
//! file operations make (map a block, merge neighbours, split at a range, truncate, mark
//! written or unwritten). Pure data: reading and writing the on-disk tree is `fs/extents.rs`.
//!
//! Invariants:
//! - `extents` is sorted by logical block, non-overlapping, each extent within the format's
//!   length limits (length > 0) and ending below 2^32 - 1;
//! - `tree_blocks` lists the blocks the on-disk tree uses (leaves first, then index levels),
//!   each counted in the inode's `i_blocks`.

use crate::format::ext4::extent::{Extent, MAX_INIT_LEN, MAX_UNWRITTEN_LEN};

/// The block map of one inode.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExtentMap {
    pub extents: Vec<Extent>,
    pub tree_blocks: Vec<u64>,
}

impl ExtentMap {
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
