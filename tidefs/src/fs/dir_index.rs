//! A directory's name index in memory: every live name with where its record lives, and the
//! free space of each block. Pure data, built and kept up to date by `fs/dir.rs`.
//!
//! Invariant: `DirIndex::names` holds exactly the live records of the directory, with their
//! positions.

use std::collections::HashMap;

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
}
