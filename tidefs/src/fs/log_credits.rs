//! Journal space an operation reserves before its first change, as jbd2's handles reserve
//! credits: every operation inside the file-system lock starts with [`BASE_CREDITS`], and an
//! operation that may change more (frees across many groups, a range allocation, an htree
//! directory's first change, a directory's mode change) reserves the rest while it plans,
//! before it changes anything. When the running transaction has no room left for what an
//! operation reserves, the operation stops there with nothing to take back, the transaction
//! commits, and the operation runs again in the next one (docs/DESIGN.md §4.1). An operation
//! that ends having changed more journal blocks than it reserved is counted as an overrun (an
//! estimate below is wrong), and so is a reservation made after an operation's first change
//! (made too late): the random workload of `tests/failures_before_change.rs` and the crash
//! harness look for both. Neither takes the operation back: a change once made is kept (or
//! the file system goes into its error state), and the bound operations reserve against
//! leaves a quarter of the log beyond it before a commit would fail. Outside an operation
//! (orphans freed at mount and unmount, which commit as they go) nothing is reserved.
//!
//! This module owns the bookkeeping and the estimates; `Meta::reserve_log` and
//! `Meta::run_op_within` are where they are used.

use crate::{FsError, Result};

/// Journal blocks every operation may change without saying more: the largest namespace
/// operation (a rename replacing a file, across two directories) changes at most
/// 4 inode-table blocks (both directories, the moved inode and the replaced one), the
/// superblock and one inode on the orphan list, the moved directory's `..` block,
/// 2 directory blocks in each directory with the growth of the target's extent tree
/// ([`TREE_CREDITS`]), a bitmap and a descriptor block in each group it allocates in (the
/// new directory block and the tree blocks: 12 groups at most), the inode bitmap and its
/// descriptor, 4 attribute blocks (mode records and their move) and a block of revoke
/// records: 4 + 2 + 1 + 4 + 12 + 24 + 2 + 4 + 1 = 54, rounded up.
pub(crate) const BASE_CREDITS: usize = 64;

/// Blocks an extent-tree change may touch: ext4 trees are at most 5 levels deep, and an
/// insertion that splits every level changes each node on its path and adds one beside it,
/// plus a new root level.
pub(crate) const TREE_CREDITS: usize = 2 * 5 + 2;

/// Journal blocks that freeing blocks in `groups` block groups may change, besides what
/// [`BASE_CREDITS`] covers: a bitmap and a descriptor block per group, and the extent-tree
/// path of the cut.
pub(crate) fn free_credits(groups: usize) -> usize {
    2 * groups + TREE_CREDITS
}

/// Journal blocks storing `records` journaling-mode records (docs/DESIGN.md §3.2) that take
/// `new_blocks` new attribute blocks may change: per record its inode-table block and the
/// attribute block it leaves or rewrites, and a new block's bitmap and descriptor.
pub(crate) fn records_credits(records: usize, new_blocks: u64) -> usize {
    let new_blocks = usize::try_from(new_blocks).unwrap_or(usize::MAX);
    records
        .saturating_mul(2)
        .saturating_add(new_blocks.saturating_mul(3))
}

/// Journal blocks an extent tree may need for `runs` new extents beyond [`TREE_CREDITS`]:
/// every half-full leaf of `leaf_capacity` extents they fill, and its parent's change.
pub(crate) fn runs_credits(runs: u64, leaf_capacity: usize) -> usize {
    let half = (leaf_capacity / 2).max(1) as u64;
    usize::try_from(runs.div_ceil(half).saturating_mul(2)).unwrap_or(usize::MAX)
}

/// A change an operation may plan more than once, reserved for once
/// ([`LogCredits::more_for`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reserve {
    /// Rewriting the htree index of a directory as a linear directory.
    Unindex(u32),
    /// Freeing blocks of an inode.
    Free(u32),
}

/// The reservation of the running operation, and what it found (see the module comment).
#[derive(Default)]
pub(crate) struct LogCredits {
    /// The operation's bound on the running transaction, in journal blocks (`None`: it is
    /// not bounded, as the commit's own write-back), and its size when the operation began.
    bound: Option<(usize, usize)>,
    /// What the operation reserved so far.
    reserved: usize,
    /// What it reserved for each change it planned by name, so as to reserve once for each.
    planned: Vec<(Reserve, usize)>,
    /// The operation stopped because the transaction had no room for its reservation.
    wants_room: bool,
    /// Operations that stopped for room and ran again after a commit (moved into the file
    /// system's counters by `Inner::lock_meta_reading`).
    pub room_waits: u64,
    /// Reservations made after the operation's first change, an estimate made too late:
    /// kept whether they found room or not (a change is never taken back for room).
    pub late: u64,
    /// Operations that changed more journal blocks than they reserved.
    pub overruns: u64,
}

impl LogCredits {
    /// An operation begins with `bound` = (the journal blocks the transaction may reach, its
    /// size now) when it is bounded.
    pub fn begin(&mut self, bound: Option<(usize, usize)>) {
        self.bound = bound;
        self.reserved = 0;
        self.planned.clear();
        self.wants_room = false;
    }

    /// How many of `credits` for `what` the operation has not reserved yet; notes that it
    /// reserves them all now.
    pub fn more_for(&mut self, what: Reserve, credits: usize) -> usize {
        match self.planned.iter_mut().find(|(w, _)| *w == what) {
            Some((_, had)) => {
                let more = credits.saturating_sub(*had);
                *had = (*had).max(credits);
                more
            }
            None => {
                self.planned.push((what, credits));
                credits
            }
        }
    }

    /// Reserves `credits` more journal blocks for the running operation; `changed` says
    /// whether it changed metadata already (then it is counted as late, and kept: the
    /// operation goes on). Fails when the transaction has no room for them: with
    /// [`LogCredits::wants_room`] set when a commit would make room (the caller commits and
    /// runs the operation again), or for good when not even an empty transaction would.
    pub fn reserve(&mut self, credits: usize, changed: bool) -> Result<()> {
        self.reserved = self.reserved.saturating_add(credits);
        if changed {
            if credits > 0 {
                self.late += 1;
            }
            return Ok(());
        }
        let Some((limit, size)) = self.bound else {
            return Ok(());
        };
        if size.saturating_add(self.reserved) <= limit {
            return Ok(());
        }
        if size == 0 {
            return Err(too_large());
        }
        self.wants_room = true;
        self.room_waits += 1;
        Err(FsError::Invalid(
            "operation waits for room in the next journal transaction",
        ))
    }

    /// Whether the operation stopped for room (see [`LogCredits::reserve`]).
    pub fn wants_room(&self) -> bool {
        self.wants_room
    }

    /// The operation ended well having changed `used` journal blocks (`Meta::log_used`):
    /// counts an overrun if that is more than it reserved, and returns by how much.
    pub fn end(&mut self, used: usize) -> Option<usize> {
        self.bound?;
        (used > self.reserved).then(|| {
            self.overruns += 1;
            used - self.reserved
        })
    }
}

/// The error of an operation that needs more journal blocks than any transaction carries.
pub(crate) fn too_large() -> FsError {
    FsError::Invalid("operation larger than one journal transaction")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a reservation that fits passes; one past the bound asks for room when the
    /// transaction holds something, and fails for good when it is empty; one made after the
    /// operation's first change is counted late and kept, room or not; an unbounded
    /// operation reserves without limit and is never an overrun.
    #[test]
    fn reservations_fit_wait_or_fail() {
        let mut c = LogCredits::default();
        c.begin(Some((100, 30)));
        assert!(c.reserve(BASE_CREDITS, false).is_ok());
        assert!(c.reserve(6, false).is_ok(), "30 + 70 fits 100");
        assert!(c.reserve(1, false).is_err());
        assert!(c.wants_room());
        assert_eq!((c.room_waits, c.late), (1, 0));

        c.begin(Some((100, 0)));
        assert!(!c.wants_room(), "a new operation starts afresh");
        let e = c.reserve(101, false).unwrap_err();
        assert!(matches!(e, FsError::Invalid(m) if m.contains("larger")));
        assert!(!c.wants_room(), "no commit makes room for it");
        assert_eq!(c.late, 0);

        c.begin(Some((100, 30)));
        assert!(c.reserve(BASE_CREDITS, false).is_ok());
        assert!(c.reserve(1000, true).is_ok(), "after a change: kept");
        assert!(!c.wants_room());
        assert_eq!(c.late, 1, "reserved after a change");
        c.reserve(0, true).unwrap();
        assert_eq!(c.late, 1, "nothing reserved");

        c.begin(None);
        assert!(c.reserve(usize::MAX, true).is_ok());
        assert_eq!(c.end(10_000), None);
    }

    /// Goal: a change planned twice is reserved for once, and only what a larger plan adds
    /// is reserved again; a new operation forgets the plans.
    #[test]
    fn a_change_planned_twice_is_reserved_once() {
        let mut c = LogCredits::default();
        c.begin(Some((1000, 0)));
        assert_eq!(c.more_for(Reserve::Free(12), 20), 20);
        assert_eq!(c.more_for(Reserve::Free(12), 20), 0);
        assert_eq!(c.more_for(Reserve::Free(12), 26), 6);
        assert_eq!(c.more_for(Reserve::Free(12), 3), 0);
        assert_eq!(c.more_for(Reserve::Unindex(12), 4), 4, "another change");
        c.begin(Some((1000, 0)));
        assert_eq!(c.more_for(Reserve::Free(12), 20), 20);
    }

    /// Goal: an operation that changed more blocks than it reserved is counted, by how much.
    #[test]
    fn overruns_are_counted() {
        let mut c = LogCredits::default();
        c.begin(Some((1000, 10)));
        c.reserve(BASE_CREDITS, false).unwrap();
        assert_eq!(c.end(BASE_CREDITS), None);
        assert_eq!(c.overruns, 0);
        c.begin(Some((1000, 10)));
        c.reserve(BASE_CREDITS, false).unwrap();
        assert_eq!(c.end(BASE_CREDITS + 3), Some(3));
        assert_eq!(c.overruns, 1);
    }
}
