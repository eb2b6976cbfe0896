//! What the inode-table read-ahead remembers of recent misses: per slot of block groups, the
//! last inode-table block found in no memory copy (docs/DESIGN.md §2.5, "Read-ahead"). A leaf
//! module: `Meta` holds the state, `fs/inode_table.rs` decides with it.

/// Slots of misses: a group's misses are recorded in slot `group % MISS_SLOTS`, so walks of
/// different groups' tables (a cold `ls -l` of two directories at once) do not reset each
/// other.
const MISS_SLOTS: usize = 8;

/// The last inode-table block found in no memory copy in a slot of groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InodeTableMiss {
    pub block: u64,
    /// It was read ahead.
    pub ahead: bool,
    /// The block after what it read: a miss of this block is the walk going on forward.
    pub end: u64,
}

/// The last miss of each slot of groups.
#[derive(Default)]
pub(crate) struct InodeTableMisses([Option<InodeTableMiss>; MISS_SLOTS]);

impl InodeTableMisses {
    /// The last miss recorded for `group`'s slot.
    pub fn last(&self, group: u32) -> Option<InodeTableMiss> {
        self.0[group as usize % MISS_SLOTS]
    }

    /// Records `miss` as the last one of `group`'s slot.
    pub fn note(&mut self, group: u32, miss: InodeTableMiss) {
        self.0[group as usize % MISS_SLOTS] = Some(miss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: groups in different slots keep their own last miss; groups that share a slot
    /// replace each other's.
    #[test]
    fn each_slot_keeps_its_last_miss() {
        let mut m = InodeTableMisses::default();
        let miss = |block| InodeTableMiss {
            block,
            ahead: false,
            end: block + 1,
        };
        m.note(0, miss(10));
        m.note(1, miss(20));
        assert_eq!(m.last(0), Some(miss(10)));
        assert_eq!(m.last(1), Some(miss(20)));
        m.note(MISS_SLOTS as u32, miss(30));
        assert_eq!(m.last(0), Some(miss(30)), "same slot");
        assert_eq!(m.last(2), None);
    }
}
