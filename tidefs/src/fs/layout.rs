//! Where file data may live: the data area of the file system minus the blocks that hold
//! metadata at fixed places (superblock and group-descriptor copies with their reserved GDT
//! blocks, block and inode bitmaps, inode tables, the internal journal). Every extent read from
//! disk is checked against it before use, so a corrupt extent can never make a data write land
//! on the journal or an inode table.
//!
//! Invariants:
//! - `runs` is sorted by start and no two runs overlap (building a layout from descriptors
//!   that overlap fails with `Corrupt`);
//! - every run lies inside `[0, end)`.

use std::fmt;

use crate::{FsError, Result};

/// [`FixedRun::what`] of a group's inode table.
pub(crate) const INODE_TABLE: &str = "inode table";

/// A run `[start, end)` of blocks holding one piece of fixed metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FixedRun {
    pub start: u64,
    pub end: u64,
    /// What lives there.
    pub what: &'static str,
    /// The group it belongs to, if any.
    pub group: Option<u32>,
}

impl fmt::Display for FixedRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(g) = self.group {
            write!(f, "group {g}'s ")?;
        }
        write!(f, "{} (blocks {}..{})", self.what, self.start, self.end)
    }
}

/// The blocks file data and extent-tree blocks may use.
#[derive(Clone, Debug, Default)]
pub(crate) struct Layout {
    /// First block of the data area (`s_first_data_block`).
    start: u64,
    /// One past the last block (`s_blocks_count`).
    end: u64,
    /// Fixed metadata inside `[start, end)`, sorted, disjoint.
    runs: Vec<FixedRun>,
}

impl Layout {
    /// Builds the layout from fixed metadata runs; fails when one lies outside the file system
    /// or two overlap.
    pub fn build(start: u64, end: u64, mut runs: Vec<FixedRun>) -> Result<Layout> {
        for r in &runs {
            if r.start >= r.end || r.end > end {
                return Err(FsError::corrupt(format!(
                    "{r} lies outside the file system ({end} blocks)"
                )));
            }
        }
        runs.sort_by_key(|r| (r.start, r.end));
        for w in runs.windows(2) {
            if w[1].start < w[0].end {
                return Err(FsError::corrupt(format!("{} overlaps {}", w[0], w[1])));
            }
        }
        Ok(Layout { start, end, runs })
    }

    /// The fixed metadata runs, sorted.
    pub fn runs(&self) -> &[FixedRun] {
        &self.runs
    }

    /// Checks that blocks `[first, first + len)` may hold file data or extent-tree blocks;
    /// the error names the metadata they would overwrite.
    pub fn check_run(&self, first: u64, len: u64) -> std::result::Result<(), String> {
        let Some(last) = first.checked_add(len) else {
            return Err(format!("blocks {first}+{len} overflow"));
        };
        if len == 0 || first < self.start || last > self.end {
            return Err(format!(
                "blocks {first}..{last} are outside the data area ({}..{})",
                self.start, self.end
            ));
        }
        // The first run that ends after `first` is the only candidate for an overlap.
        match self.first_ending_after(first) {
            Some(r) if r.start < last => Err(format!("blocks {first}..{last} overlap {r}")),
            _ => Ok(()),
        }
    }

    /// The fixed metadata run that holds block `nr`, if any.
    pub fn run_at(&self, nr: u64) -> Option<&FixedRun> {
        self.first_ending_after(nr).filter(|r| r.start <= nr)
    }

    /// The first run that ends after block `nr`.
    fn first_ending_after(&self, nr: u64) -> Option<&FixedRun> {
        self.runs.get(self.runs.partition_point(|r| r.end <= nr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, end: u64, what: &'static str) -> FixedRun {
        FixedRun {
            start,
            end,
            what,
            group: Some(0),
        }
    }

    #[test]
    fn check_run_finds_overlaps_and_bounds() {
        let l = Layout::build(
            1,
            100,
            vec![run(50, 60, "inode table"), run(10, 11, "block bitmap")],
        )
        .unwrap();
        assert!(l.check_run(11, 39).is_ok());
        assert!(l.check_run(60, 40).is_ok());
        assert!(l.check_run(5, 6).unwrap_err().contains("block bitmap"));
        assert!(l.check_run(59, 1).unwrap_err().contains("inode table"));
        assert!(l.check_run(0, 1).unwrap_err().contains("outside"));
        assert!(l.check_run(99, 2).unwrap_err().contains("outside"));
        assert!(l.check_run(20, 0).is_err());
        assert!(l.check_run(u64::MAX, 2).is_err());
        assert_eq!(l.run_at(50).map(|r| r.what), Some("inode table"));
        assert_eq!(l.run_at(59).map(|r| r.what), Some("inode table"));
        assert_eq!(l.run_at(10).map(|r| r.what), Some("block bitmap"));
        assert!(l.run_at(60).is_none() && l.run_at(11).is_none() && l.run_at(0).is_none());
    }

    #[test]
    fn build_refuses_overlap_and_outside() {
        let e = Layout::build(0, 100, vec![run(10, 20, "a"), run(15, 16, "b")]).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        assert!(Layout::build(0, 100, vec![run(99, 101, "a")]).is_err());
        assert!(Layout::build(0, 100, vec![run(9, 9, "a")]).is_err());
    }
}
