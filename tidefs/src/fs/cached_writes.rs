//! Writes served without the metadata lock: which files may take them, and the inode changes
//! they leave behind for the metadata side (docs/DESIGN.md §2.5, "Writes without the lock").
//!
//! A `write()` whose every block already has a page in the cache needs no allocation, no device
//! read and no reservation; what it changes in metadata is the file's size and its times. A block
//! that is a hole of the file's published block map (an append past the last block, typically)
//! needs no device read either, only a reservation: the metadata side sets a few free blocks aside
//! ([`SPARE_BLOCKS`], `DataCache::spare`) that such writes turn into page reservations, and takes
//! them back when space runs short (`Meta::allocatable_blocks_for`). Such a write copies its bytes
//! into the pages and records the inode's new size and times here, as a [`PendingInode`], without
//! the metadata lock; the metadata side folds the record into the inode later: every read of the
//! inode under that lock sees it (`Meta::read_inode`), and the commit's write-back stores it into
//! the inode-table block in the same transaction as the pages it describes (`fs/writeback.rs`).
//!
//! This table lives behind the page cache's mutex (it is part of `DataCache`), so a write's
//! pages and its record change together, and write-back takes both in one snapshot.
//!
//! Invariants:
//! - a file takes writes without the lock only while its journaling mode is published here
//!   ([`CachedWrites::publish_mode`], at the end of a write, truncate or create under the lock,
//!   which found or left the file without capabilities); every change of the file's extended
//!   attributes (where its mode record and capabilities live) withdraws it first, as does freeing
//!   or making the inode;
//! - a record holds the newest size and times of its inode; it is removed only when the
//!   inode is stored with it (`Meta::write_inode` removes the record the operation's first
//!   read of the inode saw, if no newer one came since: whatever copy it stores was read at or
//!   after that read) or the inode is freed, and an operation rolled back puts back what it
//!   removed (merged with anything newer), so no write's size or times are ever lost;
//! - each record carries a sequence number that grows with every write, so the metadata side
//!   removes only what it has folded in.

use std::collections::HashMap;

use super::api::{Attr, DataMode, Timestamp};
use crate::format::ext4::inode::{Inode, InodeTime};

/// Blocks the metadata side keeps set aside for pages that writes without the lock make over
/// holes (256 KiB of 4 KiB blocks): refilled by the next write, truncate or create under the
/// lock once used up (`Meta::allow_cached_writes`).
pub(crate) const SPARE_BLOCKS: u64 = 64;

/// Files whose mode is published at most; the table is emptied when it passes this.
const MAX_PUBLISHED_MODES: usize = 16_384;

/// The size and times a write without the lock gave an inode, not stored in it yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingInode {
    /// Grows with every write (see the module comment).
    pub seq: u64,
    pub size: u64,
    pub mtime: InodeTime,
    pub ctime: InodeTime,
    /// A write since the inode was last stored made the file longer: an fdatasync then needs
    /// a commit (a change of times alone does not).
    pub grew: bool,
}

impl PendingInode {
    /// Puts the record's size and times into `i`. The ctime only moves forward: a change
    /// under the lock that read the inode before this write and stored it after keeps its
    /// own later ctime (the write counts as after it, and changes size and mtime).
    pub fn apply(&self, i: &mut Inode) {
        i.set_size(self.size);
        i.set_mtime(self.mtime);
        i.set_ctime(later(i.ctime(), self.ctime));
    }
}

impl PendingInode {
    /// Puts the record's size and times into `a`, as [`PendingInode::apply`] does to an inode.
    pub fn apply_to_attr(&self, a: &mut Attr) {
        a.size = self.size;
        a.mtime = to_ts(self.mtime);
        a.ctime = to_ts(later(from_ts(a.ctime), self.ctime));
    }
}

/// An inode time as the API shows it.
pub(crate) fn to_ts(t: InodeTime) -> Timestamp {
    Timestamp {
        sec: t.sec,
        nsec: t.nsec,
    }
}

/// An API time as an inode stores it.
pub(crate) fn from_ts(t: Timestamp) -> InodeTime {
    InodeTime {
        sec: t.sec,
        nsec: t.nsec,
    }
}

/// The later of two times.
pub(crate) fn later(a: InodeTime, b: InodeTime) -> InodeTime {
    if (b.sec, b.nsec) > (a.sec, a.nsec) {
        b
    } else {
        a
    }
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct CachedWrites {
    /// Files that may take writes without the lock, with the journaling mode they obey.
    modes: HashMap<u32, DataMode>,
    pending: HashMap<u32, PendingInode>,
    next_seq: u64,
    /// While an operation runs: the records it removed, as they were (or `None`).
    undo: Option<HashMap<u32, Option<PendingInode>>>,
}

impl CachedWrites {
    /// File `ino` obeys `mode` and has no capabilities to remove: it may take writes without
    /// the lock (called under the metadata lock, at the end of an operation that ended well).
    pub fn publish_mode(&mut self, ino: u32, mode: DataMode) {
        if self.modes.len() >= MAX_PUBLISHED_MODES {
            self.modes.clear();
        }
        self.modes.insert(ino, mode);
    }

    /// The mode of `ino`, if it may take writes without the lock.
    pub fn mode(&self, ino: u32) -> Option<DataMode> {
        self.modes.get(&ino).copied()
    }

    /// Writes of `ino` take the lock again: its extended attributes are about to change.
    pub fn withdraw_mode(&mut self, ino: u32) {
        self.modes.remove(&ino);
    }

    /// The record of `ino`, if a write without the lock left one.
    pub fn pending(&self, ino: u32) -> Option<PendingInode> {
        self.pending.get(&ino).copied()
    }

    /// Files with a record.
    pub fn pending_files(&self) -> impl Iterator<Item = u32> + '_ {
        self.pending.keys().copied()
    }

    /// Records that a write without the lock gave `ino` this size and these times; `grew`
    /// when it made the file longer. Never part of an operation's undo.
    pub fn note_write(
        &mut self,
        ino: u32,
        size: u64,
        mtime: InodeTime,
        ctime: InodeTime,
        grew: bool,
    ) {
        self.next_seq += 1;
        let grew = grew || self.pending.get(&ino).is_some_and(|p| p.grew);
        self.pending.insert(
            ino,
            PendingInode {
                seq: self.next_seq,
                size,
                mtime,
                ctime,
                grew,
            },
        );
    }

    /// Inode `ino` was stored with its record of sequence `seq` folded in: the record goes,
    /// unless a newer write replaced it meanwhile.
    pub fn stored(&mut self, ino: u32, seq: u64) {
        if self.pending.get(&ino).is_some_and(|p| p.seq <= seq) {
            self.note(ino);
            self.pending.remove(&ino);
        }
    }

    /// Inode `ino` is freed or made anew: nothing of it stays.
    pub fn forget(&mut self, ino: u32) {
        self.modes.remove(&ino);
        if self.pending.contains_key(&ino) {
            self.note(ino);
            self.pending.remove(&ino);
        }
    }

    /// Starts recording the records an operation removes.
    pub fn begin_undo(&mut self) {
        self.undo = Some(HashMap::new());
    }

    /// Ends the operation, keeping its removals.
    pub fn end_undo(&mut self) {
        self.undo = None;
    }

    /// Ends the operation and puts back every record it removed; a record a write made since
    /// is newer and stays, and keeps the removed one's `grew` (the inode on disk lacks both).
    pub fn rollback(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        for (ino, before) in undo {
            let Some(before) = before else {
                continue;
            };
            match self.pending.get_mut(&ino) {
                Some(now) if now.seq > before.seq => now.grew |= before.grew,
                _ => {
                    self.pending.insert(ino, before);
                }
            }
        }
    }

    /// Saves the record of `ino` as it is, if an operation is open and has not touched it.
    fn note(&mut self, ino: u32) {
        let old = self.pending.get(&ino).copied();
        if let Some(u) = &mut self.undo {
            u.entry(ino).or_insert(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(sec: i64) -> InodeTime {
        InodeTime { sec, nsec: 0 }
    }

    /// Goal: a stored record goes only if nothing newer came; a rollback puts back what the
    /// operation removed, without overwriting a newer write (whose `grew` takes the old one's).
    #[test]
    fn records_go_only_when_folded_and_come_back_on_rollback() {
        let mut w = CachedWrites::default();
        w.note_write(5, 100, t(1), t(1), true);
        let first = w.pending(5).unwrap();
        w.note_write(5, 100, t(2), t(2), false);
        assert!(w.pending(5).unwrap().grew, "grew sticks until stored");
        let second = w.pending(5).unwrap();
        w.stored(5, first.seq);
        assert_eq!(w.pending(5), Some(second), "a newer record stays");
        w.begin_undo();
        w.stored(5, second.seq);
        assert_eq!(w.pending(5), None);
        w.rollback();
        assert_eq!(
            w.pending(5),
            Some(second),
            "rolled back: the record is back"
        );

        w.begin_undo();
        w.stored(5, second.seq);
        w.note_write(5, 200, t(3), t(3), false);
        let third = w.pending(5).unwrap();
        w.rollback();
        assert_eq!(
            w.pending(5).unwrap().seq,
            third.seq,
            "the newer record stays"
        );
        assert!(
            w.pending(5).unwrap().grew,
            "and keeps the removed record's growth"
        );

        w.begin_undo();
        w.forget(5);
        w.end_undo();
        assert_eq!(w.pending(5), None);
    }

    /// Goal: a published mode is withdrawn by withdraw_mode and forget.
    #[test]
    fn modes_are_withdrawn() {
        let mut w = CachedWrites::default();
        w.publish_mode(3, DataMode::Ordered);
        assert_eq!(w.mode(3), Some(DataMode::Ordered));
        w.withdraw_mode(3);
        assert_eq!(w.mode(3), None);
        w.publish_mode(3, DataMode::Journal);
        w.forget(3);
        assert_eq!(w.mode(3), None);
    }
}
