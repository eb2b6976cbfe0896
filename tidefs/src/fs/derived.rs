//! What the file system derives from an inode's blocks and keeps by inode number: block maps
//! (`ExtentMap`), the name indexes of directories (`DirIndex`) and journaling-mode records
//! (`ModeTable`). Each entry can be rebuilt from the cached blocks on next use, so any may be
//! dropped: when too many pile up (`DerivedCaches::trim`), when a rolled-back operation had
//! built or changed it (`Derived`, listed in the operation's undo record), or when the caches
//! are emptied. The lock-free copies handed to reads and lookups (the page cache's published
//! maps, the name cache's published indexes) are withdrawn by `Meta`, which owns both sides.

use std::collections::HashMap;
use std::sync::Arc;

use super::dir_index::DirIndex;
use super::extent_map::ExtentMap;
use super::mode_record::ModeTable;

/// Block maps kept before all are dropped: not only those of closed files, since through
/// FUSE every inode the kernel caches is held (docs/DESIGN.md §2.7), so sparing held ones
/// could spare them all. Mode records share the bound.
const MAX_MAPS: usize = 200_000;
/// Directory name indexes kept before all are dropped.
const MAX_DIRS: usize = 20_000;

/// A derived entry an operation built or changed (`OpUndo::derived` in `fs/op_state.rs`): a
/// rollback forgets it, since it may reflect blocks the rollback restores.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Derived {
    DirIndex(u32),
    ExtentMap(u32),
    ModeRecord(u32),
}

/// The derived per-inode state behind the metadata lock.
pub(crate) struct DerivedCaches {
    /// Block maps of inodes in use, loaded on first access.
    pub maps: HashMap<u32, Arc<ExtentMap>>,
    /// Name indexes of directories, built on first access. Shared (`Arc`) with the lookups
    /// the name cache serves (`NameCache::publish_dir`); changed only through
    /// `Meta::dir_index_mut`, which withdraws it there first.
    pub dirs: HashMap<u32, Arc<DirIndex>>,
    /// Mode records of inodes (`fs/modes.rs`).
    pub modes: ModeTable,
}

impl DerivedCaches {
    /// Empty caches; `modes` knows the mount's default mode.
    pub fn new(modes: ModeTable) -> DerivedCaches {
        DerivedCaches {
            maps: HashMap::new(),
            dirs: HashMap::new(),
            modes,
        }
    }

    /// Drops each kind of entry whole when too many have piled up (each reloads on next
    /// use; every change is stored back to the blocks at once).
    pub fn trim(&mut self) {
        if self.maps.len() > MAX_MAPS {
            self.maps.clear();
        }
        if self.dirs.len() > MAX_DIRS {
            self.dirs.clear();
        }
        if self.modes.len() > MAX_MAPS {
            self.modes.clear();
        }
    }

    /// Drops every block map and directory index (`Fs::drop_caches`).
    pub fn drop_maps_and_indexes(&mut self) {
        self.maps.clear();
        self.dirs.clear();
    }
}
