//! A directory's name index in memory: every live name with where its record lives, and the
//! free space of each block. Pure data, built and kept up to date by `fs/dir.rs`.
//!
//! Invariant: `DirIndex::names` holds exactly the live records of the directory, with their
//! positions; the record order, when built, lists the same names (every change to the index
//! starts with [`DirIndex::changing`], which forgets it).

use std::collections::HashMap;
use std::sync::OnceLock;

/// Where a name lives in its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirSlot {
    pub ino: u32,
    pub file_type: u8,
    pub lblk: u32,
    pub offset: u32,
}

impl DirSlot {
    /// Where the record sits in the directory: its byte offset in the directory's data (the
    /// order readdir lists records in; a readdir cookie is such a position).
    pub fn position(&self, block_size: u32) -> u64 {
        u64::from(self.lblk) * u64::from(block_size) + u64::from(self.offset)
    }
}

/// The in-memory index of one directory.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirIndex {
    pub names: HashMap<Vec<u8>, DirSlot>,
    /// Largest record that fits in each block.
    pub space: Vec<usize>,
    /// Whether the on-disk directory still carries an htree index.
    pub indexed: bool,
    /// With an index, the blocks its first change rewrites: the root and the other index
    /// blocks (and leaves left empty, which look the same).
    pub index_blocks: usize,
    /// The names in record order (position, slot, name): built by the first listing that
    /// asks ([`DirIndex::in_order`]), forgotten by every change ([`DirIndex::changing`]).
    order: OnceLock<Vec<(u64, DirSlot, Vec<u8>)>>,
}

impl DirIndex {
    /// An index of no names yet, for a directory of `blocks` blocks.
    pub fn new(indexed: bool, blocks: usize) -> DirIndex {
        DirIndex {
            indexed,
            space: vec![0; blocks],
            ..DirIndex::default()
        }
    }

    /// The names in record order, the order readdir lists them in; sorted once per version
    /// of the index (`block_size` is the file system's, the same at every call).
    pub fn in_order(&self, block_size: u32) -> &[(u64, DirSlot, Vec<u8>)] {
        self.order.get_or_init(|| {
            let mut v: Vec<(u64, DirSlot, Vec<u8>)> = self
                .names
                .iter()
                .map(|(name, s)| (s.position(block_size), *s, name.clone()))
                .collect();
            v.sort_unstable_by_key(|e| e.0);
            v
        })
    }

    /// The names in record order, if a listing sorted this version of the index already.
    pub fn ordered(&self) -> Option<&[(u64, DirSlot, Vec<u8>)]> {
        self.order.get().map(Vec::as_slice)
    }

    /// The index is about to change: forgets the record order.
    pub fn changing(&mut self) {
        self.order = OnceLock::new();
    }
}
