//! Sets of byte ranges inside one block: which bytes of a cached block changed since the last
//! commit (metadata) or since the last write-back (file data). Byte-range journaling asks these
//! sets what to log; today they also feed the statistics of how much of each journaled block
//! really changed.
//!
//! Most sets hold one or two ranges (a page written whole, an append, an inode's fields), and
//! a dirty page's set is copied at every write-back: up to [`INLINE`] ranges are kept inline,
//! so such a copy allocates nothing.

use std::ops::Range;

use smallvec::SmallVec;

/// Ranges kept without a heap allocation.
const INLINE: usize = 2;

/// Disjoint, sorted, non-adjacent byte ranges (adjacent or overlapping ranges are merged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByteRanges {
    ranges: SmallVec<[Range<u32>; INLINE]>,
}

impl ByteRanges {
    /// The empty set.
    pub fn new() -> ByteRanges {
        ByteRanges::default()
    }

    /// Adds `[start, end)`; an empty range adds nothing.
    pub fn add(&mut self, start: u32, end: u32) {
        if start >= end {
            return;
        }
        // First range that ends at or after `start` (it may touch the new one).
        let i = self.ranges.partition_point(|r| r.end < start);
        let mut j = i;
        let (mut lo, mut hi) = (start, end);
        while j < self.ranges.len() && self.ranges[j].start <= hi {
            lo = lo.min(self.ranges[j].start);
            hi = hi.max(self.ranges[j].end);
            j += 1;
        }
        if j > i {
            // The first range it touches becomes the merged one; the others it covers go.
            self.ranges[i] = lo..hi;
            self.ranges.drain(i + 1..j);
        } else {
            self.ranges.insert(i, lo..hi);
        }
    }

    /// Adds every range where `before` and `after` differ (both the same length).
    pub fn add_diff(&mut self, before: &[u8], after: &[u8]) {
        debug_assert_eq!(before.len(), after.len());
        // Compare in 64-byte chunks first: most of a block is usually unchanged.
        const CHUNK: usize = 64;
        let len = before.len().min(after.len());
        let mut at = 0;
        while at < len {
            let end = (at + CHUNK).min(len);
            if before[at..end] != after[at..end] {
                let mut k = at;
                while k < end {
                    if before[k] != after[k] {
                        let s = k;
                        while k < end && before[k] != after[k] {
                            k += 1;
                        }
                        // Block sizes fit in u32.
                        self.add(s as u32, k as u32);
                    } else {
                        k += 1;
                    }
                }
            }
            at = end;
        }
    }

    /// Adds every range of `other`.
    pub fn union(&mut self, other: &ByteRanges) {
        for r in other.iter() {
            self.add(r.start, r.end);
        }
    }

    /// The ranges as sorted `(offset, length)` pairs.
    pub fn offset_lengths(&self) -> Vec<(u32, u32)> {
        self.ranges
            .iter()
            .map(|r| (r.start, r.end - r.start))
            .collect()
    }

    /// The ranges, sorted.
    pub fn iter(&self) -> impl Iterator<Item = Range<u32>> + '_ {
        self.ranges.iter().cloned()
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| u64::from(r.end - r.start)).sum()
    }

    /// Whether no byte is covered.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(r: &ByteRanges) -> Vec<(u32, u32)> {
        r.iter().map(|x| (x.start, x.end)).collect()
    }

    #[test]
    fn add_merges_overlapping_and_adjacent_ranges() {
        let mut r = ByteRanges::new();
        r.add(10, 20);
        r.add(30, 40);
        assert_eq!(list(&r), vec![(10, 20), (30, 40)]);
        r.add(20, 25);
        assert_eq!(list(&r), vec![(10, 25), (30, 40)]);
        r.add(5, 35);
        assert_eq!(list(&r), vec![(5, 40)]);
        r.add(50, 50);
        assert_eq!(r.bytes(), 35);
        r.add(0, 1);
        r.add(100, 200);
        assert_eq!(list(&r), vec![(0, 1), (5, 40), (100, 200)]);
        r.clear();
        assert!(r.is_empty());
    }

    #[test]
    fn diff_finds_exactly_the_changed_bytes() {
        let before = vec![0u8; 4096];
        let mut after = before.clone();
        after[3] = 1;
        after[4] = 1;
        after[63] = 7;
        after[64] = 7;
        after[4095] = 9;
        let mut r = ByteRanges::new();
        r.add_diff(&before, &after);
        assert_eq!(list(&r), vec![(3, 5), (63, 65), (4095, 4096)]);
        assert_eq!(r.bytes(), 5);
    }

    proptest::proptest! {
        /// Goal: after any sequence of adds, the set covers exactly the bytes some add
        /// covered, as sorted, disjoint, non-adjacent ranges (inline or spilled to the heap).
        #[test]
        fn adds_cover_exactly_their_bytes_in_canonical_ranges(
            adds in proptest::collection::vec((0u32..300, 0u32..40), 0..30)
        ) {
            let mut r = ByteRanges::new();
            let mut covered = vec![false; 340];
            for (start, len) in adds {
                r.add(start, start + len);
                for c in &mut covered[start as usize..(start + len) as usize] {
                    *c = true;
                }
            }
            let ranges = list(&r);
            for w in ranges.windows(2) {
                proptest::prop_assert!(w[0].1 < w[1].0, "not disjoint and apart: {:?}", ranges);
            }
            let mut seen = vec![false; 340];
            for (a, b) in &ranges {
                proptest::prop_assert!(a < b);
                for c in &mut seen[*a as usize..*b as usize] {
                    *c = true;
                }
            }
            proptest::prop_assert_eq!(seen, covered);
        }

        #[test]
        fn diff_covers_every_difference_and_nothing_else(
            changes in proptest::collection::vec((0usize..512, proptest::num::u8::ANY), 0..40)
        ) {
            let before = vec![0u8; 512];
            let mut after = before.clone();
            for (at, v) in changes {
                after[at] = v;
            }
            let mut r = ByteRanges::new();
            r.add_diff(&before, &after);
            let mut covered = vec![false; 512];
            for x in r.iter() {
                for c in &mut covered[x.start as usize..x.end as usize] {
                    *c = true;
                }
            }
            for k in 0..512 {
                proptest::prop_assert_eq!(covered[k], before[k] != after[k]);
            }
        }
    }
}
