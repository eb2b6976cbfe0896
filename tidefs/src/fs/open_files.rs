//! Open handles per inode, kept outside the metadata lock so that opening and closing a linked
//! file never waits for a commit or for other files' writes (docs/DESIGN.md §2.5).
//!
//! An inode with open handles is not freed when its last link goes: it goes on the orphan
//! list and is freed at its last release (or by orphan cleanup after a crash). A "handle" is
//! whatever a user of the library counts with `Fs::open_inode`: the FUSE adapter counts each
//! reference the kernel holds (every entry it replies with, until the kernel forgets it) and
//! each handle of a created file, so an inode lives while the kernel may still name it.
//!
//! Invariants (lock order: metadata lock, then this table, then the name cache's locks):
//! - the code that drops an inode's last link (under the metadata lock) asks
//!   [`OpenFiles::last_link_dropped`], which removes the inode's cached attributes and reads
//!   its count under this table's lock, so no fast path runs between the two;
//! - the fast paths, [`OpenFiles::open_linked`] and [`OpenFiles::release_linked`], act only
//!   when the name cache holds the inode's attributes with at least one link, and they read
//!   those attributes while holding this table's lock. Attributes are put in the name cache
//!   only under the metadata lock, so an entry with links seen here means the unlink that
//!   takes the last link has not yet asked this table, and when it does it sees the count as
//!   the fast path left it: an open it must keep the inode for, or a release it may free it
//!   after;
//! - everything else (an orphan's release, a file whose attributes are not cached) goes
//!   through the metadata lock, as before.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::namecache::NameCache;

/// Open handle counts by inode; see the module documentation.
#[derive(Default)]
pub(crate) struct OpenFiles {
    counts: Mutex<HashMap<u32, u64>>,
}

impl OpenFiles {
    /// Whether `ino` has open handles.
    pub fn contains(&self, ino: u32) -> bool {
        self.counts.lock().contains_key(&ino)
    }

    /// The last link of `ino` is going (the caller holds the metadata lock): forgets its
    /// cached attributes, so that no fast path counts a handle of it from here on, and says
    /// whether it has open handles (then it must stay, as an orphan, until the last release).
    pub fn last_link_dropped(&self, ino: u32, names: &NameCache) -> bool {
        let counts = self.counts.lock();
        names.forget_attr(ino);
        counts.contains_key(&ino)
    }

    /// Counts one more handle of `ino` (the caller holds the metadata lock and checked that
    /// the inode is live).
    pub fn add(&self, ino: u32) {
        *self.counts.lock().entry(ino).or_insert(0) += 1;
    }

    /// Counts one more handle of `ino` without the metadata lock, if the name cache shows it
    /// linked; `false`: the caller must take the slow path.
    pub fn open_linked(&self, ino: u32, names: &NameCache) -> bool {
        let mut counts = self.counts.lock();
        if !names.is_linked(ino) {
            return false;
        }
        *counts.entry(ino).or_insert(0) += 1;
        true
    }

    /// Drops `n` handles of `ino` without the metadata lock when that cannot free the inode:
    /// other handles remain, or the name cache shows it linked. `false`: the caller must take
    /// the slow path ([`OpenFiles::release`] under the metadata lock).
    pub fn release_linked(&self, ino: u32, n: u64, names: &NameCache) -> bool {
        let mut counts = self.counts.lock();
        match counts.get_mut(&ino) {
            Some(c) if *c > n => {
                *c -= n;
                true
            }
            Some(_) if names.is_linked(ino) => {
                counts.remove(&ino);
                true
            }
            Some(_) => false,
            // Not counted (opened before a remount, or released twice): nothing to drop.
            None => true,
        }
    }

    /// Drops `n` handles of `ino` (under the metadata lock); true when they were the last.
    pub fn release(&self, ino: u32, n: u64) -> bool {
        let mut counts = self.counts.lock();
        let Some(c) = counts.get_mut(&ino) else {
            return false;
        };
        *c = c.saturating_sub(n);
        if *c > 0 {
            return false;
        }
        counts.remove(&ino);
        true
    }

    /// Every inode with open handles, forgetting them all (unmount).
    pub fn take_all(&self) -> Vec<u32> {
        self.counts.lock().drain().map(|(ino, _)| ino).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::api::Attr;

    fn attr(ino: u32, nlink: u32) -> Attr {
        Attr {
            nlink,
            ..crate::fs::namecache::tests::attr(u64::from(ino), 0)
        }
    }

    #[test]
    fn fast_paths_act_only_on_linked_inodes_with_cached_attributes() {
        let names = NameCache::default();
        let open = OpenFiles::default();
        assert!(!open.open_linked(12, &names), "nothing cached: slow path");
        names.put_attr(&attr(12, 1));
        assert!(open.open_linked(12, &names));
        assert!(open.open_linked(12, &names));
        assert!(open.release_linked(12, 1, &names), "another handle remains");
        names.forget_attr(12);
        assert!(open.contains(12));
        assert!(
            !open.release_linked(12, 1, &names),
            "the last handle of an inode whose links are unknown goes the slow way"
        );
        assert!(open.release(12, 1), "the slow path drops the last handle");
        assert!(!open.contains(12));
        names.put_attr(&attr(14, 1));
        assert!(open.open_linked(14, &names));
        assert!(
            open.last_link_dropped(14, &names),
            "open: kept as an orphan"
        );
        assert!(
            !open.release_linked(14, 1, &names),
            "its last release frees it"
        );
        assert!(open.release(14, 1));
        names.put_attr(&attr(15, 1));
        assert!(
            !open.last_link_dropped(15, &names),
            "not open: freed at once"
        );
        assert!(
            !open.open_linked(15, &names),
            "and never opened without the lock"
        );
        names.put_attr(&attr(13, 0));
        assert!(
            !open.open_linked(13, &names),
            "an unlinked inode: slow path"
        );
        open.add(13);
        assert!(!open.release_linked(13, 1, &names));
        assert_eq!(open.take_all(), vec![13]);
        // Several handles dropped at once (a kernel FORGET of n lookups).
        names.put_attr(&attr(16, 1));
        for _ in 0..3 {
            assert!(open.open_linked(16, &names));
        }
        assert!(open.release_linked(16, 2, &names), "one remains");
        assert!(open.contains(16));
        names.forget_attr(16);
        assert!(
            !open.release_linked(16, 1, &names),
            "the last goes the slow way"
        );
        assert!(open.release(16, 1));
        assert!(!open.contains(16));
    }
}
