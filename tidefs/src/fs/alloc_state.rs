//! The allocator's state, one named part of `Meta`: the group summaries, where block searches
//! start, and the blocks and inodes that may not be handed out yet (freed by a transaction not
//! yet committed, or, in lightweight mode, frees held back until in-place writes are durable).
//! The logic is in `alloc.rs` (it needs the buffer cache for the bitmaps, and the running
//! operation's undo record).

use std::collections::{BTreeMap, HashSet};

/// In-memory summary of one group descriptor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupInfo {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    pub flags: u16,
    pub itable_unused: u32,
    /// Bitmap checksums as the descriptor stores them (masked by `bitmap_csum_mask`).
    pub block_bitmap_csum: u32,
    pub inode_bitmap_csum: u32,
    /// `VERIFIED_*` bits: the bitmap in the cache is known to match its checksum (read and
    /// verified, or written by tidefs). Set once per mount.
    pub verified: u8,
    /// A bitmap of this group failed its checksum: the group is no longer used for
    /// allocation, and frees in it fail with `Corrupt`.
    pub bad: bool,
}

/// A free that lightweight mode holds back: the bitmaps learn of it only once the in-place
/// writes of the transaction that made it (the inode or extent block that stopped pointing at
/// it) are durable. Until then a crash leaks it, which lightweight allows; the other order could
/// leave a block in use that the bitmap calls free.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LateFree {
    /// `len` blocks from `first`, all in one group.
    Blocks {
        first: u64,
        len: u32,
        journaled: bool,
    },
    Inode {
        ino: u32,
        is_dir: bool,
    },
}

/// The allocator's state (see the module comment).
#[derive(Default)]
pub(crate) struct AllocState {
    /// One summary per block group, loaded from the group descriptors at mount.
    pub groups: Vec<GroupInfo>,
    /// Runs of blocks (first, length) freed by the running transaction, released from
    /// quarantine after its commit.
    pub freed_running: Vec<(u64, u32)>,
    /// Blocks that must not be allocated yet.
    pub quarantine: BlockRuns,
    /// Where the next block search starts, per flow of allocation.
    pub block_cursor: u64,
    /// Lightweight mode: frees made by the running transaction, applied to the bitmaps once
    /// its in-place writes are durable (see [`LateFree`]).
    pub late_frees: Vec<LateFree>,
    /// Block and inode bitmap blocks: with the GDT and the superblock, what lightweight mode
    /// journals.
    pub bitmap_blocks: HashSet<u64>,
    /// Blocks a commit's write-back allocated for pages before closing the transaction
    /// (`Meta::allocate_ahead`): the close treats a page over one as over a hole just filled
    /// (nothing of it at home or in the log), as it would have, had it allocated the block
    /// itself. Emptied when the transaction closes.
    pub allocated_ahead: BlockRuns,
}

/// A set of blocks kept as disjoint runs: deleting a 60 GiB file quarantines 15 million
/// blocks, which as one entry per block cost 700 MB of memory and most of the time.
#[derive(Default, Debug)]
pub(crate) struct BlockRuns {
    /// First block of each run to the block after its end; runs neither overlap nor touch.
    runs: BTreeMap<u64, u64>,
    /// Blocks in all runs.
    blocks: u64,
}

impl BlockRuns {
    /// Blocks in the set.
    pub fn len(&self) -> u64 {
        self.blocks
    }

    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// The end (exclusive) of the run holding block `b`, if one does.
    pub fn end_of_run_holding(&self, b: u64) -> Option<u64> {
        self.runs
            .range(..=b)
            .next_back()
            .and_then(|(_, &end)| (end > b).then_some(end))
    }

    pub fn contains(&self, b: u64) -> bool {
        self.end_of_run_holding(b).is_some()
    }

    /// Blocks of the set in `[first, end)`.
    pub fn count_in(&self, first: u64, end: u64) -> u64 {
        if first >= end {
            return 0;
        }
        let before = self
            .runs
            .range(..first)
            .next_back()
            .map_or(0, |(_, &e)| e.min(end).saturating_sub(first));
        let inside: u64 = self
            .runs
            .range(first..end)
            .map(|(&s, &e)| e.min(end) - s)
            .sum();
        before + inside
    }

    /// The first block of the set at `b` or after it.
    pub fn first_at_or_after(&self, b: u64) -> Option<u64> {
        if self.contains(b) {
            return Some(b);
        }
        self.runs.range(b..).next().map(|(&first, _)| first)
    }

    /// Adds `len` blocks from `first`; returns the pieces that were not in the set already
    /// (what removing undoes exactly).
    pub fn insert(&mut self, first: u64, len: u64) -> Vec<(u64, u64)> {
        if len == 0 {
            return Vec::new();
        }
        let end = first.saturating_add(len);
        let mut added = Vec::new();
        let mut at = first;
        // The runs that overlap or touch [first, end), merged into one.
        let mut lo = first;
        let mut hi = end;
        let touching: Vec<(u64, u64)> = self
            .runs
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= first)
            .map(|(&s, &e)| (s, e))
            .collect();
        for &(s, e) in touching.iter().rev() {
            if s > at {
                added.push((at, s.min(end) - at));
            }
            at = at.max(e);
            lo = lo.min(s);
            hi = hi.max(e);
            self.runs.remove(&s);
        }
        if at < end {
            added.push((at, end - at));
        }
        self.blocks += added.iter().map(|&(_, n)| n).sum::<u64>();
        if lo < hi {
            self.runs.insert(lo, hi);
        }
        added
    }

    /// Removes `len` blocks from `first` (those of them in the set).
    pub fn remove(&mut self, first: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = first.saturating_add(len);
        let overlapping: Vec<(u64, u64)> = self
            .runs
            .range(..end)
            .rev()
            .take_while(|(_, &e)| e > first)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.runs.remove(&s);
            self.blocks -= e.min(end) - s.max(first);
            if s < first {
                self.runs.insert(s, first);
            }
            if e > end {
                self.runs.insert(end, e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BlockRuns;

    /// The set as a list of blocks, for comparison with a plain model.
    fn blocks(r: &BlockRuns) -> Vec<u64> {
        r.runs.iter().flat_map(|(&s, &e)| s..e).collect()
    }

    #[test]
    fn insert_reports_only_new_blocks_and_merges_touching_runs() {
        let mut r = BlockRuns::default();
        assert_eq!(r.insert(10, 5), vec![(10, 5)]);
        assert_eq!(r.insert(20, 5), vec![(20, 5)]);
        // Spans both runs and the gap between them, and touches nothing else.
        assert_eq!(r.insert(12, 10), vec![(15, 5)]);
        assert_eq!(r.runs.len(), 1);
        assert_eq!(r.len(), 15);
        // Touching at the end merges too.
        assert_eq!(r.insert(25, 1), vec![(25, 1)]);
        assert_eq!(r.runs.len(), 1);
        assert_eq!(r.insert(10, 16), vec![]);
        assert!(r.contains(25) && !r.contains(26) && !r.contains(9));
        assert_eq!(r.end_of_run_holding(12), Some(26));
        assert_eq!(r.first_at_or_after(0), Some(10));
        assert_eq!(r.first_at_or_after(13), Some(13));
        assert_eq!(r.first_at_or_after(26), None);
    }

    #[test]
    fn remove_splits_runs_and_undoes_an_insert() {
        let mut r = BlockRuns::default();
        r.insert(0, 100);
        let added = r.insert(50, 100);
        for (s, n) in added {
            r.remove(s, n);
        }
        assert_eq!(blocks(&r), (0..100).collect::<Vec<_>>());
        r.remove(10, 5);
        r.remove(98, 10);
        assert_eq!(r.len(), 100 - 5 - 2);
        assert!(!r.contains(12) && r.contains(15) && r.contains(9) && !r.contains(98));
        assert_eq!(r.first_at_or_after(10), Some(15));
    }

    #[test]
    fn matches_a_set_of_blocks_under_random_changes() {
        use std::collections::BTreeSet;
        let mut r = BlockRuns::default();
        let mut model = BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let first = x % 200;
            let len = (x >> 20) % 12;
            if (x >> 40) % 3 == 0 {
                r.remove(first, len);
                for b in first..first + len {
                    model.remove(&b);
                }
            } else {
                let added = r.insert(first, len);
                let fresh: Vec<u64> = (first..first + len)
                    .filter(|b| !model.contains(b))
                    .collect();
                let reported: Vec<u64> = added.iter().flat_map(|&(s, n)| s..s + n).collect();
                assert_eq!(reported, fresh);
                model.extend(first..first + len);
            }
            assert_eq!(blocks(&r), model.iter().copied().collect::<Vec<_>>());
            assert_eq!(r.len(), model.len() as u64);
            let (a, b) = ((x >> 8) % 220, (x >> 30) % 220);
            let (lo, hi) = (a.min(b), a.max(b));
            let counted = model.range(lo..hi).count() as u64;
            assert_eq!(r.count_in(lo, hi), counted, "[{lo}, {hi})");
            // Runs never touch: each is maximal.
            let v: Vec<(u64, u64)> = r.runs.iter().map(|(&s, &e)| (s, e)).collect();
            assert!(v.windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}
