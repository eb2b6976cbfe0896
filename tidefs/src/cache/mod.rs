//! The metadata buffer cache: whole file-system blocks keyed by block number.
//!
//! Invariants:
//! - a block modified by the running transaction (`dirty`) is never evicted: it is the only
//!   copy of that change until the transaction commits;
//! - any other block may be dropped at any time; the layer above reloads it from the newest
//!   committed journal copy (not yet checkpointed) or else from its home location. Eviction
//!   (when the cache passes its bound) gives a block looked at since it last passed a second
//!   chance, as the CLOCK algorithm does;
//! - while an undo record is open (one file-system operation), the first change, insertion or
//!   removal of each block saves what the cache held before, so a failed operation is taken
//!   back whole and never reaches a commit half done.
//!
//! - each dirty block knows which of its bytes changed since the last commit (`ByteRanges`):
//!   an operation's changes are found by comparing each block it touched with its pre-image
//!   when the operation ends, so the code that edits a block needs no bookkeeping of its own.
//!
//! - a cached block's bytes are one version of it, shared (`Arc`) with the commit in flight,
//!   the journal's copies waiting for checkpoint, operations' pre-images and, for a block of
//!   journaled file data, the file's page; a change copies them only while another holder
//!   shares them (copy on write, docs/DESIGN.md §2.3);
//! - a block allocated by the running transaction (`insert_new`) is *fresh* until it commits:
//!   its home location holds nothing of it, so it must be logged whole, never as ranges;
//! - a block loaded during an operation counts the loaded bytes as its pre-image, so a small
//!   change to it is a small range even on a cache miss.
//!
//! - every removal of a cached block (eviction, `forget`, a rollback dropping a block the
//!   operation added), every free of a block (`forget_run`, cached or not) and `drop_clean`
//!   (all buckets) bump the removal stamp of the block's bucket (`removal_stamp`): a block
//!   read from its home location without the lock is still current when it is used if the
//!   cache did not hold it then and its stamp has not moved since the read was planned,
//!   since any newer version would have been in the cache and left it, and a block freed
//!   meanwhile moved it too (docs/DESIGN.md §2.5).
//!
//! File data is cached separately (`fs/datacache.rs`); it joins this cache at commit in
//! `journal` mode, where data blocks are logged like metadata (docs/DESIGN.md §2.3).

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

pub mod ranges;

pub use ranges::ByteRanges;

/// A block of the transaction being closed: its number, its content, and the bytes that
/// changed since the previous commit.
pub struct DirtyBlock {
    pub nr: u64,
    pub data: Arc<[u8]>,
    pub changed: ByteRanges,
    /// Allocated by this transaction: nothing of it is at home or in the log yet.
    pub fresh: bool,
}

/// Buckets of removal stamps (a power of two): blocks share a stamp by their number modulo
/// this, so a removal may make an unrelated block's planned read look stale (it is then read
/// again), never the other way round.
const REMOVAL_BUCKETS: usize = 4096;

/// Cached metadata blocks and the set of blocks the running transaction has modified.
pub struct BlockCache {
    blocks: HashMap<u64, Cached>,
    /// Removals per bucket of block numbers (see [`BlockCache::removal_stamp`]).
    removals: Box<[u64]>,
    /// Blocks changed since the running transaction began; cleared when it is snapshotted.
    dirty: BTreeSet<u64>,
    max_blocks: usize,
    /// While an operation runs: each block it touched, with what the cache held before (its
    /// bytes and whether it was dirty), or `None` if it was not cached.
    undo: Option<HashMap<u64, Option<PreImage>>>,
    /// The open operation changed or removed a block (loading clean blocks does not count).
    undo_changed: bool,
    /// Bytes of each dirty block changed since the last commit, as of the last finished
    /// operation.
    changed: HashMap<u64, ByteRanges>,
    /// Dirty blocks allocated by the running transaction.
    fresh: HashSet<u64>,
    /// Blocks the open operation replaced with bytes whose changed ranges the caller gave
    /// ([`BlockCache::put_with_ranges`]): added to `changed` when the operation ends.
    undo_given: HashMap<u64, ByteRanges>,
}

/// A cached block's bytes, with whether it was used since eviction last passed it over.
///
/// The bytes are one *version* of the block, shared (`Arc`) with whoever else holds that
/// version: the commit in flight and the journal's copies waiting for checkpoint take the
/// version the running transaction closed with, an operation's pre-image takes the version
/// it started from, and a block of journaled file data was the file's page's version when it
/// joined the transaction. A change copies the bytes only while another holder shares them
/// (`Arc::make_mut`), so each version of a block exists once in memory.
struct Cached {
    bytes: Arc<[u8]>,
    /// Set by every look at the block ([`BlockCache::get`], under the metadata lock, hence
    /// a `Cell`); eviction passes a used block over once and clears the mark (CLOCK).
    used: Cell<bool>,
}

impl Cached {
    fn new(bytes: Arc<[u8]>) -> Cached {
        Cached {
            bytes,
            used: Cell::new(false),
        }
    }
}

/// A cached block as it was before an operation changed it.
struct PreImage {
    bytes: Arc<[u8]>,
    dirty: bool,
    fresh: bool,
}

impl BlockCache {
    /// A cache holding at most about `max_blocks` clean blocks.
    pub fn new(max_blocks: usize) -> BlockCache {
        BlockCache {
            blocks: HashMap::new(),
            removals: vec![0; REMOVAL_BUCKETS].into_boxed_slice(),
            dirty: BTreeSet::new(),
            max_blocks: max_blocks.max(64),
            undo: None,
            undo_changed: false,
            changed: HashMap::new(),
            fresh: HashSet::new(),
            undo_given: HashMap::new(),
        }
    }

    /// Starts recording pre-images for one operation.
    pub fn begin_undo(&mut self) {
        debug_assert!(self.undo.is_none(), "undo records do not nest");
        self.undo = Some(HashMap::new());
        self.undo_changed = false;
        self.undo_given.clear();
    }

    /// Whether the open operation changed or removed any cached block so far.
    pub fn undo_has_changes(&self) -> bool {
        self.undo_changed
    }

    /// The blocks the open operation changed (or added) that are dirty now, those dirty
    /// before it began included: what it needs room in the journal for.
    pub fn undo_dirtied(&self) -> usize {
        // Every block the operation touched has an entry (`note`).
        self.undo
            .as_ref()
            .map_or(0, |u| u.keys().filter(|nr| self.dirty.contains(nr)).count())
    }

    /// Ends the operation, keeping its changes: each dirty block it touched adds the bytes
    /// that differ from its pre-image to its changed ranges (a block that had no pre-image
    /// changed whole).
    pub fn end_undo(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        let mut given = std::mem::take(&mut self.undo_given);
        for (nr, before) in undo {
            if !self.dirty.contains(&nr) {
                continue;
            }
            let Some(now) = self.blocks.get(&nr).map(|c| &c.bytes) else {
                continue;
            };
            let ranges = self.changed.entry(nr).or_default();
            match (given.remove(&nr), before) {
                (Some(g), _) => ranges.union(&g),
                (None, Some(old)) if old.bytes.len() == now.len() => {
                    ranges.add_diff(&old.bytes, now)
                }
                _ => ranges.add(0, block_len(now)),
            }
        }
    }

    /// Bytes of dirty block `nr` changed since the last commit (empty for a clean block).
    pub fn changed_ranges(&self, nr: u64) -> ByteRanges {
        self.changed.get(&nr).cloned().unwrap_or_default()
    }

    /// Ends the operation and takes back every change it made; returns the blocks restored.
    pub fn rollback(&mut self) -> Vec<u64> {
        let Some(undo) = self.undo.take() else {
            return Vec::new();
        };
        self.undo_given.clear();
        let mut touched = Vec::with_capacity(undo.len());
        for (nr, before) in undo {
            match before {
                Some(pre) => {
                    self.blocks.insert(nr, Cached::new(pre.bytes));
                    if pre.dirty {
                        self.dirty.insert(nr);
                    } else {
                        self.dirty.remove(&nr);
                        self.changed.remove(&nr);
                    }
                    if pre.fresh {
                        self.fresh.insert(nr);
                    } else {
                        self.fresh.remove(&nr);
                    }
                }
                None => {
                    self.remove(nr);
                    self.dirty.remove(&nr);
                    self.changed.remove(&nr);
                    self.fresh.remove(&nr);
                }
            }
            touched.push(nr);
        }
        touched
    }

    /// Saves block `nr`'s current state if the open operation has not touched it yet.
    fn note(&mut self, nr: u64) {
        if let Some(undo) = &mut self.undo {
            undo.entry(nr).or_insert_with(|| {
                self.blocks.get(&nr).map(|b| PreImage {
                    bytes: Arc::clone(&b.bytes),
                    dirty: self.dirty.contains(&nr),
                    fresh: self.fresh.contains(&nr),
                })
            });
        }
    }

    /// About how many clean blocks the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.max_blocks
    }

    /// Whether block `nr` is cached.
    pub fn contains(&self, nr: u64) -> bool {
        self.blocks.contains_key(&nr)
    }

    /// Adds a block read from disk or taken from a newer copy in memory (its committed
    /// content, shared with that copy); may evict clean blocks first. Inside an operation the
    /// loaded bytes are the block's pre-image.
    pub fn insert(&mut self, nr: u64, data: impl Into<Arc<[u8]>>) {
        let data = data.into();
        if self.blocks.len() >= self.max_blocks {
            self.evict();
        }
        self.note(nr);
        if let Some(slot @ None) = self.undo.as_mut().and_then(|u| u.get_mut(&nr)) {
            *slot = Some(PreImage {
                bytes: Arc::clone(&data),
                dirty: false,
                fresh: false,
            });
        }
        self.blocks.insert(nr, Cached::new(data));
    }

    /// Adds a block the running transaction allocated, with its first content: dirty and
    /// fresh (logged whole at commit).
    pub fn insert_new(&mut self, nr: u64, data: impl Into<Arc<[u8]>>) {
        let data = data.into();
        // The block's state before, for the open operation (`forget` records it only for a
        // block it has something to drop of).
        self.note(nr);
        self.forget(nr);
        self.undo_changed |= self.undo.is_some();
        self.changed.entry(nr).or_default().add(0, block_len(&data));
        self.blocks.insert(nr, Cached::new(data));
        self.dirty.insert(nr);
        self.fresh.insert(nr);
    }

    /// Replaces block `nr`'s content with `data`, of which only `changed` differs from the
    /// block's committed version (the caller knows; the old bytes need not be cached), and
    /// marks it dirty. Must run inside an operation. `data` is shared, not copied, when it
    /// comes as an `Arc` (a file's page).
    pub fn put_with_ranges(&mut self, nr: u64, data: impl Into<Arc<[u8]>>, changed: &ByteRanges) {
        debug_assert!(self.undo.is_some(), "put_with_ranges outside an operation");
        self.note(nr);
        self.undo_changed = true;
        self.undo_given.entry(nr).or_default().union(changed);
        self.blocks.insert(nr, Cached::new(data.into()));
        self.dirty.insert(nr);
    }

    fn evict(&mut self) {
        let target = self.max_blocks * 3 / 4;
        self.drop_clean_blocks(self.blocks.len().saturating_sub(target));
    }

    /// Drops up to `limit` blocks the running transaction has not changed. A block used
    /// since eviction last passed it is passed over once more (its mark cleared), as the
    /// CLOCK algorithm does, so blocks looked at again and again (the root directory, the
    /// bitmaps in use) outlive blocks read once.
    fn drop_clean_blocks(&mut self, limit: usize) {
        let mut dropped = 0;
        for second_chance in [true, false] {
            let mut victims = Vec::new();
            for (nr, c) in &self.blocks {
                if victims.len() + dropped == limit {
                    break;
                }
                if self.dirty.contains(nr) {
                    continue;
                }
                if second_chance && c.used.replace(false) {
                    continue;
                }
                victims.push(*nr);
            }
            dropped += victims.len();
            for nr in victims {
                self.remove(nr);
            }
            if dropped == limit {
                break;
            }
        }
    }

    /// Drops block `nr`'s bytes, bumping its removal stamp if it was cached.
    fn remove(&mut self, nr: u64) {
        if self.blocks.remove(&nr).is_some() {
            self.bump(nr);
        }
    }

    /// Moves the removal stamp of block `nr`'s bucket.
    fn bump(&mut self, nr: u64) {
        self.removals[nr as usize % REMOVAL_BUCKETS] += 1;
    }

    /// A number that changes whenever block `nr` leaves the cache (and sometimes when another
    /// block does). While it stays the same and the block is not cached, no copy of the block
    /// newer than its home location can have come and gone: a change to a block passes
    /// through the cache, and leaves it only by a removal.
    pub fn removal_stamp(&self, nr: u64) -> u64 {
        self.removals[nr as usize % REMOVAL_BUCKETS]
    }

    /// A cached block, if present.
    pub fn get(&self, nr: u64) -> Option<&[u8]> {
        let c = self.blocks.get(&nr)?;
        c.used.set(true);
        Some(&c.bytes[..])
    }

    /// A cached block's current version, shared (no copy is made).
    pub fn get_shared(&self, nr: u64) -> Option<Arc<[u8]>> {
        let c = self.blocks.get(&nr)?;
        c.used.set(true);
        Some(Arc::clone(&c.bytes))
    }

    /// A cached block for modification; marks it dirty in the running transaction.
    pub fn get_mut(&mut self, nr: u64) -> Option<&mut [u8]> {
        if !self.blocks.contains_key(&nr) {
            return None;
        }
        self.note(nr);
        self.undo_changed |= self.undo.is_some();
        // A new version of the block if the one cached is shared (with a pre-image, the
        // commit in flight or the journal's checkpoint copies).
        let b = Arc::make_mut(&mut self.blocks.get_mut(&nr)?.bytes);
        self.dirty.insert(nr);
        if self.undo.is_none() {
            // No pre-image to compare with when the operation ends: count the whole block.
            self.changed.entry(nr).or_default().add(0, block_len(b));
        }
        Some(b)
    }

    /// Forgets a block (about to be reused for something else).
    pub fn forget(&mut self, nr: u64) {
        // Nothing to forget (a block just allocated is seldom cached): no undo entry either,
        // which for a run of millions of new blocks was most of the allocation's time.
        if !self.knows(nr) {
            return;
        }
        self.note(nr);
        self.undo_changed |= self.undo.is_some() && self.blocks.contains_key(&nr);
        self.remove(nr);
        self.dirty.remove(&nr);
        self.changed.remove(&nr);
        self.fresh.remove(&nr);
        self.undo_given.remove(&nr);
    }

    /// Whether the cache holds anything of block `nr` (a copy, or a change to commit).
    fn knows(&self, nr: u64) -> bool {
        self.blocks.contains_key(&nr)
            || self.dirty.contains(&nr)
            || self.changed.contains_key(&nr)
            || self.fresh.contains(&nr)
            || self.undo_given.contains_key(&nr)
    }

    /// [`BlockCache::forget`] of blocks `first..first + len`; returns those that were dirty
    /// (sorted). A freed run of millions of blocks costs a walk over what the cache holds,
    /// not a lookup per block.
    pub fn forget_run(&mut self, first: u64, len: u64) -> Vec<u64> {
        // Freed: the stamps move even for blocks the cache holds nothing of, since a copy read
        // from their home before is not their content any more once they are handed out
        // again (read-ahead keeps blocks no current pointer led to, `Meta::keep_read_ahead`).
        // Allocation hands out only blocks freed this way, so it need not move them again.
        if len >= REMOVAL_BUCKETS as u64 {
            self.removals.iter_mut().for_each(|s| *s += 1);
        } else {
            (first..first + len).for_each(|b| self.bump(b));
        }
        let held = self.blocks.len()
            + self.dirty.len()
            + self.changed.len()
            + self.fresh.len()
            + self.undo_given.len();
        let walk = self
            .blocks
            .keys()
            .chain(self.dirty.iter())
            .chain(self.changed.keys())
            .chain(self.fresh.iter())
            .chain(self.undo_given.keys())
            .copied();
        let mut known = blocks_held_in(first, len, held, walk, |b| self.knows(b));
        known.dedup();
        let dirty = known
            .iter()
            .copied()
            .filter(|b| self.dirty.contains(b))
            .collect();
        for b in known {
            self.forget(b);
        }
        dirty
    }

    /// Drops every block the running transaction has not changed (outside operations only).
    pub fn drop_clean(&mut self) {
        debug_assert!(self.undo.is_none(), "drop_clean inside an operation");
        self.drop_clean_blocks(usize::MAX);
        // Reads planned before are not kept as read-ahead: the cache is cold.
        self.removals.iter_mut().for_each(|s| *s += 1);
    }

    /// Number of dirty blocks in the running transaction.
    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Whether block `nr` is dirty in the running transaction.
    pub fn is_dirty(&self, nr: u64) -> bool {
        self.dirty.contains(&nr)
    }

    /// Every dirty block (its current version, shared, not copied) with the bytes that
    /// changed, and clears the dirty set: the running transaction closes.
    pub fn take_dirty(&mut self) -> Vec<DirtyBlock> {
        debug_assert!(self.undo.is_none(), "commit inside an operation");
        let dirty = std::mem::take(&mut self.dirty);
        let mut changed = std::mem::take(&mut self.changed);
        let fresh = std::mem::take(&mut self.fresh);
        dirty
            .into_iter()
            .filter_map(|nr| {
                let b = &self.blocks.get(&nr)?.bytes;
                Some(DirtyBlock {
                    nr,
                    data: Arc::clone(b),
                    changed: changed.remove(&nr).unwrap_or_else(|| {
                        let mut all = ByteRanges::new();
                        all.add(0, block_len(b));
                        all
                    }),
                    fresh: fresh.contains(&nr),
                })
            })
            .collect()
    }
}

/// A block's length as a byte offset (block sizes are at most 64 KiB).
fn block_len(b: &[u8]) -> u32 {
    u32::try_from(b.len()).unwrap_or(u32::MAX)
}

/// The blocks of `first..first + len` that a set of `set_len` blocks holds, sorted: by a
/// lookup per block (`contains`) when the range is the shorter, else by a walk over the set
/// (`walk`, which may name a block more than once). Freeing a run of millions of blocks asks
/// the cache, the committing transaction and the journal this, each holding a few thousand.
pub fn blocks_held_in(
    first: u64,
    len: u64,
    set_len: usize,
    walk: impl Iterator<Item = u64>,
    contains: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let range = first..first.saturating_add(len);
    if (set_len as u64) < len {
        let mut v: Vec<u64> = walk.filter(|b| range.contains(b)).collect();
        v.sort_unstable();
        v.dedup();
        v
    } else {
        range.filter(|&b| contains(b)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_held_in_gives_the_same_answer_by_lookups_and_by_walk() {
        let set: std::collections::HashSet<u64> = [3, 5, 9, 5_000_000, 12].into_iter().collect();
        let walk = || set.iter().copied().chain([9, 3]);
        // The set is shorter than the range: walked (and a block named twice counts once).
        assert_eq!(
            blocks_held_in(0, 10, set.len(), walk(), |b| set.contains(&b)),
            vec![3, 5, 9]
        );
        // The range is the shorter: looked up.
        assert_eq!(
            blocks_held_in(4, 2, set.len(), walk(), |b| set.contains(&b)),
            vec![5]
        );
        assert!(blocks_held_in(13, 0, set.len(), walk(), |b| set.contains(&b)).is_empty());
    }

    /// Goal: a block's removal stamp moves whenever it leaves the cache (eviction, forget, a
    /// rollback of the operation that added it), is forgotten (freed or reused) though not
    /// cached, or the cache is emptied, and not when it is loaded or changed, so a read
    /// planned without the lock is never used, or kept as read-ahead, after a newer copy came
    /// and went or the block changed hands.
    #[test]
    fn removal_stamps_move_when_a_block_leaves() {
        let mut c = BlockCache::new(64);
        let s0 = c.removal_stamp(5);
        c.insert(5, vec![0u8; 16].into_boxed_slice());
        c.get_mut(5).unwrap()[0] = 1;
        assert_eq!(c.removal_stamp(5), s0, "loads and changes keep the stamp");
        c.take_dirty();
        c.forget(5);
        let s1 = c.removal_stamp(5);
        assert_ne!(s1, s0, "forget");
        c.forget(5);
        assert_eq!(
            c.removal_stamp(5),
            s1,
            "handing out an absent block (freed before) removes nothing"
        );
        let s7 = c.removal_stamp(7);
        c.forget_run(6, 3);
        assert_ne!(c.removal_stamp(7), s7, "freeing a run of absent blocks");
        let s77 = c.removal_stamp(77);
        c.forget_run(100_000, REMOVAL_BUCKETS as u64);
        assert_ne!(c.removal_stamp(77), s77, "a long run moves every bucket");
        let s9 = c.removal_stamp(9);
        c.drop_clean();
        assert_ne!(
            c.removal_stamp(9),
            s9,
            "every stamp moves when the cache is emptied"
        );
        let s1 = c.removal_stamp(5);
        c.begin_undo();
        c.insert_new(5, vec![0u8; 16].into_boxed_slice());
        c.rollback();
        let s2 = c.removal_stamp(5);
        assert_ne!(s2, s1, "rollback of an added block");
        // A full cache whose only clean block is 5: the next insertion evicts it.
        let mut c = BlockCache::new(64);
        for nr in 100..163 {
            c.insert(nr, vec![0u8; 16].into_boxed_slice());
            c.get_mut(nr).unwrap()[0] = 1;
        }
        c.insert(5, vec![0u8; 16].into_boxed_slice());
        let s3 = c.removal_stamp(5);
        c.insert(200, vec![0u8; 16].into_boxed_slice());
        assert!(!c.contains(5), "the clean block was evicted");
        assert_ne!(c.removal_stamp(5), s3, "eviction");
    }

    #[test]
    fn a_block_looked_at_again_and_again_survives_eviction() {
        // Goal: eviction gives a block in use a second chance; blocks read once go first.
        // Method: 16 blocks looked at between the loads of 1 000 others. The map's order
        // depends on the hash seed; without the second chance one of the 16 falls at the
        // first evictions for all but about one seed in a hundred.
        let mut c = BlockCache::new(64);
        for hot in 0..16 {
            c.insert(hot, vec![7u8; 16].into_boxed_slice());
        }
        for nr in 1000..2000 {
            for hot in 0..16 {
                assert_eq!(c.get(hot).map(|b| b[0]), Some(7), "{hot} evicted at {nr}");
            }
            c.insert(nr, vec![0u8; 16].into_boxed_slice());
        }
        assert!(c.blocks.len() <= 64);
        c.drop_clean();
        assert!(c.blocks.is_empty());
    }

    #[test]
    fn a_committed_version_is_shared_until_the_block_changes_again() {
        // Goal: a commit takes the cached version of each dirty block without copying it,
        // and a later change makes a new version, leaving the committed one as it was (the
        // journal writes it home at checkpoint); a rolled-back change leaves the shared
        // version cached.
        let mut c = BlockCache::new(64);
        c.insert(1, vec![0u8; 16].into_boxed_slice());
        c.begin_undo();
        c.get_mut(1).unwrap()[0] = 1;
        c.end_undo();
        let snap = c.take_dirty();
        assert!(Arc::ptr_eq(&snap[0].data, &c.get_shared(1).unwrap()));
        c.begin_undo();
        c.get_mut(1).unwrap()[0] = 2;
        c.rollback();
        assert!(
            Arc::ptr_eq(&snap[0].data, &c.get_shared(1).unwrap()),
            "a rollback puts the shared version back"
        );
        c.begin_undo();
        c.get_mut(1).unwrap()[0] = 3;
        c.end_undo();
        assert_eq!(snap[0].data[0], 1, "the committed version is untouched");
        assert_eq!(c.get(1).unwrap()[0], 3);
        assert!(!Arc::ptr_eq(&snap[0].data, &c.get_shared(1).unwrap()));
        // A block loaded from a newer copy in memory shares it.
        let copy: Arc<[u8]> = Arc::from(vec![5u8; 16]);
        c.insert(2, Arc::clone(&copy));
        assert!(Arc::ptr_eq(&copy, &c.get_shared(2).unwrap()));
        // With nobody else holding it, a change is made in place.
        drop(snap);
        let before = c.get_shared(1).unwrap().as_ptr();
        c.get_mut(1).unwrap()[0] = 4;
        assert_eq!(c.get(1).unwrap().as_ptr(), before);
    }

    #[test]
    fn dirty_blocks_survive_eviction() {
        let mut c = BlockCache::new(64);
        for nr in 0..64 {
            c.insert(nr, vec![0u8; 16].into_boxed_slice());
        }
        c.get_mut(3).unwrap()[0] = 9;
        for nr in 64..200 {
            c.insert(nr, vec![0u8; 16].into_boxed_slice());
        }
        assert_eq!(c.get(3).unwrap()[0], 9);
        assert!(c.blocks.len() <= 64);
        let snap = c.take_dirty();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].nr, 3);
        assert_eq!(c.dirty_count(), 0);
    }

    #[test]
    fn rollback_restores_changed_inserted_and_forgotten_blocks() {
        let mut c = BlockCache::new(64);
        c.insert(1, vec![1u8; 8].into_boxed_slice());
        c.insert(2, vec![2u8; 8].into_boxed_slice());
        c.get_mut(2).unwrap()[0] = 20; // dirty before the operation
        c.begin_undo();
        c.get_mut(1).unwrap()[0] = 9;
        c.get_mut(2).unwrap()[1] = 21;
        c.forget(2);
        c.insert(3, vec![3u8; 8].into_boxed_slice());
        c.get_mut(3).unwrap()[0] = 30;
        let mut touched = c.rollback();
        touched.sort_unstable();
        assert_eq!(touched, vec![1, 2, 3]);
        assert_eq!(c.get(1).unwrap()[0], 1);
        assert!(!c.is_dirty(1));
        assert_eq!(&c.get(2).unwrap()[..2], &[20, 2]);
        assert!(c.is_dirty(2));
        // A block loaded during the operation stays cached, clean, as loaded.
        assert_eq!(c.get(3).unwrap()[0], 3);
        assert!(!c.is_dirty(3));
        assert_eq!(c.dirty_count(), 1);
        // A finished operation keeps its changes.
        c.begin_undo();
        c.get_mut(1).unwrap()[0] = 7;
        c.end_undo();
        assert_eq!(c.rollback(), Vec::<u64>::new());
        assert_eq!(c.get(1).unwrap()[0], 7);
    }

    #[test]
    fn each_dirty_block_knows_the_bytes_changed_since_the_last_commit() {
        let mut c = BlockCache::new(64);
        c.insert(1, vec![0u8; 64].into_boxed_slice());
        c.insert(2, vec![0u8; 64].into_boxed_slice());
        c.begin_undo();
        c.get_mut(1).unwrap()[10] = 1;
        c.get_mut(1).unwrap()[11] = 1;
        c.end_undo();
        // A second operation on the same block adds to its ranges; writing a byte with the
        // value it already had changes nothing.
        c.begin_undo();
        let b = c.get_mut(1).unwrap();
        b[40] = 5;
        b[0] = 0;
        c.end_undo();
        // A rolled-back operation adds nothing.
        c.begin_undo();
        c.get_mut(2).unwrap()[5] = 9;
        c.rollback();
        // A block loaded during an operation: its loaded bytes are the pre-image.
        c.begin_undo();
        c.insert(3, vec![7u8; 64].into_boxed_slice());
        c.get_mut(3).unwrap()[0] = 1;
        c.end_undo();
        // A new block changed whole, and is fresh.
        c.begin_undo();
        c.insert_new(4, vec![0u8; 64].into_boxed_slice());
        c.get_mut(4).unwrap()[9] = 1;
        c.end_undo();
        // A block given with its ranges keeps exactly those.
        c.begin_undo();
        let mut given = ByteRanges::new();
        given.add(20, 30);
        c.put_with_ranges(5, &[1u8; 64][..], &given);
        c.end_undo();
        let ranges = |r: &ByteRanges| r.iter().map(|x| (x.start, x.end)).collect::<Vec<_>>();
        assert_eq!(ranges(&c.changed_ranges(1)), vec![(10, 12), (40, 41)]);
        assert!(c.changed_ranges(2).is_empty());
        let mut snap = c.take_dirty();
        snap.sort_by_key(|d| d.nr);
        assert_eq!(snap.len(), 4);
        assert_eq!(ranges(&snap[0].changed), vec![(10, 12), (40, 41)]);
        assert_eq!((snap[1].nr, ranges(&snap[1].changed)), (3, vec![(0, 1)]));
        assert_eq!((snap[2].nr, ranges(&snap[2].changed)), (4, vec![(0, 64)]));
        assert_eq!((snap[3].nr, ranges(&snap[3].changed)), (5, vec![(20, 30)]));
        let fresh: Vec<bool> = snap.iter().map(|d| d.fresh).collect();
        assert_eq!(fresh, vec![false, false, true, false]);
        // The next transaction starts from nothing.
        assert!(c.changed_ranges(1).is_empty());
    }
}
