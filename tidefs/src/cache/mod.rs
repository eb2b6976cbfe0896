//! The metadata buffer cache: whole file-system blocks keyed by block number.
//!
//! Invariants:
//! - a block modified by the running transaction (`dirty`) is never evicted: it is the only
//!   copy of that change until the transaction commits;
//! - any other block may be dropped at any time; the layer above reloads it from the newest
//!   committed journal copy (not yet checkpointed) or else from its home location;
//! - while an undo record is open (one file-system operation), the first change, insertion or
//!   removal of each block saves what the cache held before, so a failed operation is taken
//!   back whole and never reaches a commit half done.
//!
//! File data passes through this cache only in `journal` mode, where data blocks join the
//! running transaction like metadata; the other modes write it home directly
//! (docs/DESIGN.md §2.3).

use std::collections::{BTreeSet, HashMap};

/// Cached metadata blocks and the set of blocks the running transaction has modified.
pub struct BlockCache {
    blocks: HashMap<u64, Box<[u8]>>,
    /// Blocks changed since the running transaction began; cleared when it is snapshotted.
    dirty: BTreeSet<u64>,
    max_blocks: usize,
    /// While an operation runs: each block it touched, with what the cache held before (its
    /// bytes and whether it was dirty), or `None` if it was not cached.
    undo: Option<HashMap<u64, Option<PreImage>>>,
    /// The open operation changed or removed a block (loading clean blocks does not count).
    undo_changed: bool,
}

/// A cached block as it was before an operation changed it: its bytes and whether it was dirty.
type PreImage = (Box<[u8]>, bool);

impl BlockCache {
    /// A cache holding at most about `max_blocks` clean blocks.
    pub fn new(max_blocks: usize) -> BlockCache {
        BlockCache {
            blocks: HashMap::new(),
            dirty: BTreeSet::new(),
            max_blocks: max_blocks.max(64),
            undo: None,
            undo_changed: false,
        }
    }

    /// Starts recording pre-images for one operation.
    pub fn begin_undo(&mut self) {
        debug_assert!(self.undo.is_none(), "undo records do not nest");
        self.undo = Some(HashMap::new());
        self.undo_changed = false;
    }

    /// Whether the open operation changed or removed any cached block so far.
    pub fn undo_has_changes(&self) -> bool {
        self.undo_changed
    }

    /// Ends the operation, keeping its changes.
    pub fn end_undo(&mut self) {
        self.undo = None;
    }

    /// Ends the operation and takes back every change it made; returns the blocks restored.
    pub fn rollback(&mut self) -> Vec<u64> {
        let Some(undo) = self.undo.take() else {
            return Vec::new();
        };
        let mut touched = Vec::with_capacity(undo.len());
        for (nr, before) in undo {
            match before {
                Some((bytes, was_dirty)) => {
                    self.blocks.insert(nr, bytes);
                    if was_dirty {
                        self.dirty.insert(nr);
                    } else {
                        self.dirty.remove(&nr);
                    }
                }
                None => {
                    self.blocks.remove(&nr);
                    self.dirty.remove(&nr);
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
                self.blocks
                    .get(&nr)
                    .map(|b| (b.clone(), self.dirty.contains(&nr)))
            });
        }
    }

    /// Whether block `nr` is cached.
    pub fn contains(&self, nr: u64) -> bool {
        self.blocks.contains_key(&nr)
    }

    /// Adds a block read from disk; may evict clean blocks first.
    pub fn insert(&mut self, nr: u64, data: Box<[u8]>) {
        if self.blocks.len() >= self.max_blocks {
            self.evict();
        }
        self.note(nr);
        self.blocks.insert(nr, data);
    }

    fn evict(&mut self) {
        let target = self.max_blocks * 3 / 4;
        let excess = self.blocks.len().saturating_sub(target);
        let victims: Vec<u64> = self
            .blocks
            .keys()
            .filter(|nr| !self.dirty.contains(nr))
            .take(excess)
            .copied()
            .collect();
        for nr in victims {
            self.blocks.remove(&nr);
        }
    }

    /// A cached block, if present.
    pub fn get(&self, nr: u64) -> Option<&[u8]> {
        self.blocks.get(&nr).map(|b| &b[..])
    }

    /// A cached block for modification; marks it dirty in the running transaction.
    pub fn get_mut(&mut self, nr: u64) -> Option<&mut [u8]> {
        if !self.blocks.contains_key(&nr) {
            return None;
        }
        self.note(nr);
        self.undo_changed |= self.undo.is_some();
        let b = self.blocks.get_mut(&nr)?;
        self.dirty.insert(nr);
        Some(&mut b[..])
    }

    /// Forgets a block (freed and about to be reused for something else).
    pub fn forget(&mut self, nr: u64) {
        self.note(nr);
        self.undo_changed |= self.undo.is_some() && self.blocks.contains_key(&nr);
        self.blocks.remove(&nr);
        self.dirty.remove(&nr);
    }

    /// Number of dirty blocks in the running transaction.
    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Whether block `nr` is dirty in the running transaction.
    pub fn is_dirty(&self, nr: u64) -> bool {
        self.dirty.contains(&nr)
    }

    /// Copies of every dirty block, and clears the dirty set: the running transaction closes.
    pub fn take_dirty(&mut self) -> Vec<(u64, std::sync::Arc<[u8]>)> {
        debug_assert!(self.undo.is_none(), "commit inside an operation");
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .filter_map(|nr| {
                self.blocks
                    .get(&nr)
                    .map(|b| (nr, std::sync::Arc::from(&b[..])))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(snap[0].0, 3);
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
        assert!(!c.contains(3));
        assert_eq!(c.dirty_count(), 1);
        // A finished operation keeps its changes.
        c.begin_undo();
        c.get_mut(1).unwrap()[0] = 7;
        c.end_undo();
        assert_eq!(c.rollback(), Vec::<u64>::new());
        assert_eq!(c.get(1).unwrap()[0], 7);
    }
}
