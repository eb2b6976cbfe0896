//! Attributes and directory entries that `lookup` and `getattr` serve without the metadata
//! lock, so those calls never wait for a commit's write-back or for other files' writes.
//!
//! Invariants (docs/DESIGN.md §2.5):
//! - an entry is added only by a caller holding the metadata lock, from the state it just
//!   read under that lock, or, for attributes, by the end of an operation that wrote the
//!   inode, from the bytes it last wrote (`Meta::end_op`; a rolled-back operation adds none);
//!   the one change made without that lock is a write into cached pages
//!   ([`NameCache::change_attr`], under the page cache's mutex), which gives an entry already
//!   there the size and times it also leaves in the page cache for the inode
//!   (`fs/cached_writes.rs`);
//! - every change that could make an entry wrong removes it under the same lock before the
//!   change's operation returns: `Meta::write_inode` for attributes (the inode bytes, which
//!   carry everything an `Attr` holds except the blocks reserved for cached data, and every
//!   change to those reservations also writes the inode), `dir_add`, `dir_remove`,
//!   `dir_retarget` for names, and [`NameCache::forget_dir`] for every name of a directory
//!   freed or made (its number may have held another directory, whose `..` was cached);
//! - so a reader without the lock sees either the state before a change or no entry, never a
//!   state that a rolled-back operation made (that operation held the lock until its
//!   rollback, and removed the entries it touched).
//!
//! Only positive names are cached. The caches are bounded and simply emptied when full.
//!
//! Beside them sit the name indexes of directories published for lookups
//! ([`NameCache::publish_dir`]): a lookup under the metadata lock leaves its directory's index here
//! (shared with `DerivedCaches::dirs`), and later lookups in that directory answer from it, names
//! that do not exist included, and readdir lists it ([`NameCache::listing`]). Every change to a
//! directory's entries withdraws its index first (`Meta::dir_index_mut`, the only way to it), as
//! does every removal of the index from `DerivedCaches::dirs` that could leave it stale (a
//! rollback, a directory freed or made; a trim of `DerivedCaches::dirs` past its bound leaves it,
//! still current), so a published index is always the directory's current one; lookups only read it
//! under this table's read lock, so a withdrawn index is never shared and the change edits it in
//! place.
//!
//! And the extended attributes of inodes published for `getxattr` and `listxattr`
//! ([`NameCache::publish_xattrs`]): a read of an inode's attributes under the metadata lock
//! leaves them here, and later reads answer from them (a missing name included, which is what
//! the kernel asks about `security.capability` before most writes). Every change to an inode's
//! extended attributes withdraws them first (`Meta::store_xattrs`, the only writer), as does
//! freeing or making the inode (`Meta::forget_inode_entirely`); the journaling-mode attribute,
//! which an inode may inherit from its directories, is never answered from here.
//!
//! And symbolic links' targets published for `readlink` ([`NameCache::publish_target`]): a
//! target never changes while its inode lives, and is withdrawn when the inode is freed or
//! made (`Meta::forget_inode_entirely`).
//!
//! It also keeps which inodes changed their times since anyone was last shown them
//! ([`NameCache::changed_unseen`]), for multigrain timestamps (`Meta::change_time`). Every
//! `Attr` handed out is built by `Meta::attr` or served by [`NameCache::attr`], and both
//! forget the inode there. That set is bounded too; emptying it only makes the next change
//! of each inode take the fine clock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::api::Attr;
use super::dir_index::{DirIndex, DirSlot};
use crate::format::ext4::xattr::Xattr;

/// Entries each map holds at most before it is emptied.
const MAX_ENTRIES: usize = 64 * 1024;

/// See the module documentation.
#[derive(Default)]
pub(crate) struct NameCache {
    attrs: RwLock<HashMap<u32, Attr>>,
    names: RwLock<Names>,
    /// Inodes whose times changed after their attributes were last handed out.
    unseen: Mutex<HashSet<u32>>,
    /// Directory indexes published for lookups (see the module documentation).
    dirs: RwLock<HashMap<u32, Arc<DirIndex>>>,
    /// Extended attributes published for reads (see the module documentation).
    xattrs: PerInode<[Xattr], MAX_PUBLISHED_XATTR_SETS, MAX_PUBLISHED_XATTR_BYTES>,
    /// Symbolic links' targets published for `readlink` without the metadata lock: a target
    /// never changes while its inode lives, and is withdrawn when the inode is freed or made
    /// anew (`Meta::forget_inode_entirely`).
    targets: PerInode<[u8], MAX_PUBLISHED_TARGETS, MAX_PUBLISHED_TARGET_BYTES>,
}

/// Values published per inode for reads without the metadata lock (published and withdrawn
/// under it): at most `MAX` inodes' (the table is emptied when full), each of at most
/// `MAX_BYTES` bytes, which bounds the table's memory.
struct PerInode<T: ?Sized, const MAX: usize, const MAX_BYTES: usize>(RwLock<HashMap<u32, Arc<T>>>);

impl<T: ?Sized, const MAX: usize, const MAX_BYTES: usize> Default for PerInode<T, MAX, MAX_BYTES> {
    fn default() -> Self {
        PerInode(RwLock::new(HashMap::new()))
    }
}

impl<T: ?Sized, const MAX: usize, const MAX_BYTES: usize> PerInode<T, MAX, MAX_BYTES> {
    /// Publishes the value of `ino`, `bytes` long, made by `value`, unless it is too long or
    /// published already.
    fn publish(&self, ino: u32, bytes: usize, value: impl FnOnce() -> Arc<T>) {
        if bytes > MAX_BYTES || self.0.read().contains_key(&ino) {
            return;
        }
        let mut t = self.0.write();
        if t.len() >= MAX {
            t.clear();
        }
        t.insert(ino, value());
    }

    /// The published value of `ino`, if any.
    fn get(&self, ino: u32) -> Option<Arc<T>> {
        self.0.read().get(&ino).cloned()
    }

    /// Withdraws the published value of `ino`.
    fn withdraw(&self, ino: u32) {
        if self.0.read().contains_key(&ino) {
            self.0.write().remove(&ino);
        }
    }

    /// Withdraws every published value.
    fn clear(&self) {
        self.0.write().clear();
    }
}

/// Published directory indexes kept at most; the table is emptied when it passes this.
const MAX_PUBLISHED_DIRS: usize = 4096;

/// Inodes whose extended attributes are published at most; the table is emptied when full.
const MAX_PUBLISHED_XATTR_SETS: usize = 16 * 1024;

/// An inode's extended attributes are published only when their names and values take at
/// most this many bytes (most files have none), which bounds the table's memory.
const MAX_PUBLISHED_XATTR_BYTES: usize = 512;

/// Symbolic links whose targets are published at most; the table is emptied when full.
const MAX_PUBLISHED_TARGETS: usize = 16 * 1024;

/// A target is published only when it takes at most this many bytes (most are short), which
/// bounds the table's memory.
const MAX_PUBLISHED_TARGET_BYTES: usize = 512;

/// Directories with more names than this are listed under the metadata lock, which reads
/// only the blocks a call needs: from the index, the first listing of each version of it
/// copies and sorts every name (`DirIndex::in_order`).
const MAX_LISTED_NAMES: usize = 65_536;

/// Directory → name → inode, nested so that a lookup borrows the name instead of allocating
/// a key; with the number of names held.
#[derive(Default)]
struct Names {
    dirs: HashMap<u32, HashMap<Box<[u8]>, u32>>,
    len: usize,
}

impl NameCache {
    /// The cached attributes of `ino`, handed out: its times count as seen.
    pub fn attr(&self, ino: u32) -> Option<Attr> {
        // Marked seen before the read lock goes: a change of the times forgets the entry
        // (under the write lock) before it asks whether they were seen (`Meta::change_time`),
        // so it never misses this look.
        let attrs = self.attrs.read();
        let attr = attrs.get(&ino).cloned();
        if attr.is_some() {
            self.shown(ino);
        }
        attr
    }

    /// The cached attributes of `ino`, for a caller that does not show its times to anyone.
    pub fn attr_unseen(&self, ino: u32) -> Option<Attr> {
        self.attrs.read().get(&ino).cloned()
    }

    /// Whether the cached attributes of `ino` show at least one link (`false` when not
    /// cached). Hands nothing out, so it does not count as showing the times.
    pub fn is_linked(&self, ino: u32) -> bool {
        self.attrs.read().get(&ino).is_some_and(|a| a.nlink > 0)
    }

    /// The attributes of `ino`, its times among them, are being handed out.
    pub fn shown(&self, ino: u32) {
        self.unseen.lock().remove(&ino);
    }

    /// True when the times of `ino` changed and nobody was shown them since.
    pub fn changed_unseen(&self, ino: u32) -> bool {
        self.unseen.lock().contains(&ino)
    }

    /// The times of `ino` just changed.
    pub fn times_changed(&self, ino: u32) {
        let mut u = self.unseen.lock();
        if u.len() >= MAX_ENTRIES {
            u.clear();
        }
        u.insert(ino);
    }

    /// The inode `name` in directory `dir` names, if cached.
    #[cfg(test)]
    pub fn name(&self, dir: u32, name: &[u8]) -> Option<u32> {
        self.names.read().dirs.get(&dir)?.get(name).copied()
    }

    /// Changes the cached attributes of `ino` for a write without the metadata lock
    /// (`Fs::write`, under the page cache's mutex): `f` gets them and whether their times
    /// changed unseen since last shown (`Meta::change_time`'s rule), and changes them when it
    /// returns `Some`; the times then count as changed. `None` when none are cached.
    pub fn change_attr<T>(
        &self,
        ino: u32,
        f: impl FnOnce(&mut Attr, bool) -> Option<T>,
    ) -> Option<T> {
        // Under the write lock: a reader marks the times seen under the read lock
        // (`NameCache::attr`), so the test below sees every look before this change.
        let mut attrs = self.attrs.write();
        let attr = attrs.get_mut(&ino)?;
        let r = f(attr, self.changed_unseen(ino))?;
        self.times_changed(ino);
        Some(r)
    }

    /// Caches `attr` (the caller holds the metadata lock and read it under that lock).
    pub fn put_attr(&self, attr: &Attr) {
        let Ok(ino) = u32::try_from(attr.ino) else {
            return;
        };
        let mut a = self.attrs.write();
        if a.len() >= MAX_ENTRIES {
            a.clear();
        }
        a.insert(ino, attr.clone());
    }

    /// Caches that `name` in `dir` is `ino` (same rule as `put_attr`).
    pub fn put_name(&self, dir: u32, name: &[u8], ino: u32) {
        let mut n = self.names.write();
        if n.len >= MAX_ENTRIES {
            *n = Names::default();
        }
        if n.dirs
            .entry(dir)
            .or_default()
            .insert(Box::from(name), ino)
            .is_none()
        {
            n.len += 1;
        }
    }

    /// Forgets every name, attribute and published directory index (under the metadata
    /// lock, like every removal).
    pub fn clear(&self) {
        self.attrs.write().clear();
        *self.names.write() = Names::default();
        self.dirs.write().clear();
        self.xattrs.clear();
        self.targets.clear();
    }

    /// Publishes `target`, the target of symbolic link `ino`, for `readlink` without the
    /// metadata lock (under that lock, from what it just read), unless it is long.
    pub fn publish_target(&self, ino: u32, target: &[u8]) {
        self.targets
            .publish(ino, target.len(), || Arc::from(target));
    }

    /// The published target of symbolic link `ino`, if any.
    pub fn target(&self, ino: u32) -> Option<Arc<[u8]>> {
        self.targets.get(ino)
    }

    /// Withdraws the published target of `ino`: the inode is freed or made (under the
    /// metadata lock).
    pub fn withdraw_target(&self, ino: u32) {
        self.targets.withdraw(ino);
    }

    /// Publishes `attrs`, the current extended attributes of `ino`, for reads without the
    /// metadata lock (under that lock, from what it just read), unless they are large.
    pub fn publish_xattrs(&self, ino: u32, attrs: &[Xattr]) {
        let bytes: usize = attrs.iter().map(|a| a.name.len() + a.value.len()).sum();
        self.xattrs.publish(ino, bytes, || Arc::from(attrs));
    }

    /// The published extended attributes of `ino`, if any.
    pub fn xattrs(&self, ino: u32) -> Option<Arc<[Xattr]>> {
        self.xattrs.get(ino)
    }

    /// Withdraws the published extended attributes of `ino`: they are about to change, or
    /// the inode is freed or made (under the metadata lock).
    pub fn withdraw_xattrs(&self, ino: u32) {
        self.xattrs.withdraw(ino);
    }

    /// Publishes `idx`, the current name index of directory `dir`, for lookups without the
    /// metadata lock (under that lock).
    pub fn publish_dir(&self, dir: u32, idx: Arc<DirIndex>) {
        // Already published (a listing under the lock publishes at every batch).
        if self
            .dirs
            .read()
            .get(&dir)
            .is_some_and(|p| Arc::ptr_eq(p, &idx))
        {
            return;
        }
        let mut dirs = self.dirs.write();
        if dirs.len() >= MAX_PUBLISHED_DIRS {
            dirs.clear();
        }
        dirs.insert(dir, idx);
    }

    /// Withdraws the published index of `dir`: its entries are about to change, or the index
    /// leaves `DerivedCaches::dirs` (under the metadata lock).
    pub fn withdraw_dir(&self, dir: u32) {
        if self.dirs.read().contains_key(&dir) {
            self.dirs.write().remove(&dir);
        }
    }

    /// What the published index of `dir` says of `name`: `None` if no index of `dir` is
    /// published, else the inode the name points to, or `None` inside if it does not exist.
    #[cfg(test)]
    pub fn indexed_name(&self, dir: u32, name: &[u8]) -> Option<Option<u32>> {
        let dirs = self.dirs.read();
        let idx = dirs.get(&dir)?;
        Some(idx.names.get(name).map(|s| s.ino))
    }

    /// Entries of `dir`'s published index whose record position (block × `block_size` +
    /// offset) is `from` or later, in position order, at most `max`: (position, slot, name).
    /// `None` when no index is published or it holds more than `MAX_LISTED_NAMES` names.
    pub fn listing(
        &self,
        dir: u32,
        from: u64,
        max: usize,
        block_size: u32,
    ) -> Option<Vec<(u64, DirSlot, Vec<u8>)>> {
        let window = |order: &[(u64, DirSlot, Vec<u8>)]| {
            let first = order.partition_point(|e| e.0 < from);
            order[first..].iter().take(max).cloned().collect()
        };
        let idx = {
            let dirs = self.dirs.read();
            let idx = dirs.get(&dir)?;
            if idx.names.len() > MAX_LISTED_NAMES {
                return None;
            }
            if let Some(order) = idx.ordered() {
                return Some(window(order));
            }
            idx.clone()
        };
        // The first listing of this version of the index sorts it outside the table's lock,
        // so a change of the directory (which withdraws the index under the metadata lock)
        // waits for no sort; while this `Arc` is held such a change copies the index instead
        // of editing it in place. Then the listing is answered if the sorted version is still
        // the published one.
        idx.in_order(block_size);
        drop(idx);
        let dirs = self.dirs.read();
        Some(window(dirs.get(&dir)?.ordered()?))
    }

    /// Looks `name` up in `dir` without the metadata lock, from the cached names, else the
    /// directory's published index: `None` when neither answers (or the inode's attributes
    /// are not cached), `Some(None)` when the name does not exist, else the attributes of its
    /// inode (handed out, as [`NameCache::attr`]). The name is held under its table's read lock
    /// while the attributes are read, so no change of the name can come between the two:
    /// without that, the name removed, its inode freed and the number reused meanwhile would
    /// pair the name with the new inode's attributes. (Lock order: names or indexes, then
    /// attributes.)
    pub fn lookup(&self, dir: u32, name: &[u8]) -> Option<Option<Attr>> {
        {
            let names = self.names.read();
            if let Some(&ino) = names.dirs.get(&dir).and_then(|d| d.get(name)) {
                return self.attr(ino).map(Some);
            }
        }
        let dirs = self.dirs.read();
        match dirs.get(&dir)?.names.get(name) {
            None => Some(None),
            Some(slot) => self.attr(slot.ino).map(Some),
        }
    }

    /// Inode `ino` is changing; returns whether its attributes were cached.
    pub fn forget_attr(&self, ino: u32) -> bool {
        self.attrs.read().contains_key(&ino) && self.attrs.write().remove(&ino).is_some()
    }

    /// Directory `dir` is freed or its number handed out again: forgets every name cached in
    /// it (`.` and `..` are written with a new directory, not through `Meta::dir_add`) and
    /// withdraws its published index.
    pub fn forget_dir(&self, dir: u32) {
        self.withdraw_dir(dir);
        if !self.names.read().dirs.contains_key(&dir) {
            return;
        }
        let mut n = self.names.write();
        if let Some(d) = n.dirs.remove(&dir) {
            n.len -= d.len();
        }
    }

    /// Entry `name` of `dir` is changing.
    pub fn forget_name(&self, dir: u32, name: &[u8]) {
        let cached = |n: &Names| n.dirs.get(&dir).is_some_and(|d| d.contains_key(name));
        if !cached(&self.names.read()) {
            return;
        }
        let mut n = self.names.write();
        let Some(d) = n.dirs.get_mut(&dir) else {
            return;
        };
        if d.remove(name).is_some() {
            let empty = d.is_empty();
            n.len -= 1;
            if empty {
                n.dirs.remove(&dir);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A regular file's attributes for tests (also `open_files.rs`'s).
    pub(crate) fn attr(ino: u64, size: u64) -> Attr {
        let t = crate::fs::Timestamp::default();
        Attr {
            ino,
            size,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: crate::fs::FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            generation: 0,
        }
    }

    #[test]
    fn a_published_index_answers_until_withdrawn_and_the_bound_empties_the_table() {
        let c = NameCache::default();
        let mut idx = DirIndex::default();
        idx.names.insert(
            b"a".to_vec(),
            super::super::dir_index::DirSlot {
                ino: 12,
                file_type: 1,
                lblk: 0,
                offset: 24,
            },
        );
        assert_eq!(c.indexed_name(2, b"a"), None);
        c.publish_dir(2, Arc::new(idx));
        assert_eq!(c.indexed_name(2, b"a"), Some(Some(12)));
        assert_eq!(c.indexed_name(2, b"b"), Some(None));
        assert_eq!(c.indexed_name(3, b"a"), None);
        // A lookup answers from it only with the inode's attributes cached.
        assert_eq!(c.lookup(2, b"b"), Some(None));
        assert_eq!(c.lookup(2, b"a"), None);
        c.put_attr(&attr(12, 7));
        assert_eq!(c.lookup(2, b"a").flatten().map(|a| a.size), Some(7));
        c.withdraw_dir(2);
        assert_eq!(c.indexed_name(2, b"a"), None);
        assert_eq!(c.lookup(2, b"b"), None);
        // A directory freed or made forgets its names and its index.
        c.put_name(2, b"..", 1);
        c.put_attr(&attr(1, 0));
        c.publish_dir(2, Arc::default());
        assert!(c.lookup(2, b"..").flatten().is_some());
        c.forget_dir(2);
        assert_eq!(c.lookup(2, b".."), None);
        assert_eq!(c.names.read().len, 0);
        for d in 0..MAX_PUBLISHED_DIRS as u32 + 1 {
            c.publish_dir(d, Arc::default());
        }
        assert!(c.dirs.read().len() <= MAX_PUBLISHED_DIRS);
        c.clear();
        assert!(c.dirs.read().is_empty());
    }

    #[test]
    fn entries_come_back_until_forgotten_and_the_bound_empties_the_map() {
        let c = NameCache::default();
        c.put_attr(&attr(5, 10));
        c.put_name(2, b"a", 5);
        assert_eq!(c.attr(5).map(|a| a.size), Some(10));
        assert_eq!(c.name(2, b"a"), Some(5));
        assert_eq!(c.name(2, b"b"), None);
        c.forget_attr(5);
        c.forget_name(2, b"a");
        assert!(c.attr(5).is_none() && c.name(2, b"a").is_none());
        for i in 0..MAX_ENTRIES as u64 + 1 {
            c.put_attr(&attr(i + 1, 0));
        }
        assert!(c.attrs.read().len() <= MAX_ENTRIES);
        for i in 0..MAX_ENTRIES as u32 + 1 {
            c.put_name(i % 7, &i.to_le_bytes(), i);
        }
        assert!(c.names.read().len <= MAX_ENTRIES);
        c.put_name(3, b"x", 9);
        c.put_name(3, b"x", 10);
        let before = c.names.read().len;
        c.forget_name(3, b"x");
        assert_eq!(c.names.read().len, before - 1);
        assert_eq!(c.name(3, b"x"), None);
    }
}
