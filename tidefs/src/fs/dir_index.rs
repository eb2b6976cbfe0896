//! A directory's name index in memory: every live name with where its record lives, and the
//! free space of each block; and how it is built from the directory's blocks (checked and
//! parsed), which needs no lock: a large directory's first index is built without the
//! metadata lock ([`DirBuild`], docs/DESIGN.md §2.5). Pure data, kept up to date by
//! `fs/dir.rs`.
//!
//! Invariant: `DirIndex::names` holds exactly the live records of the directory, with their
//! positions; the record order, when built, lists the same names (every change to the index
//! starts with [`DirIndex::changing`], which forgets it).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::format::ext4::dirent::{
    is_index_block, parse_block, rec_size, records_end, verify_dx_checksum, verify_tail_checksum,
    DirRecord,
};
use crate::{FsError, Result};

/// What checking and parsing a directory's blocks needs besides their bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirShape {
    pub dir: u32,
    /// The directory carries an htree index (its index blocks hold no names).
    pub indexed: bool,
    /// Seed of the blocks' checksums (metadata_csum), `None` without.
    pub seed: Option<u32>,
    pub inodes: u64,
}

impl DirShape {
    /// Checks and parses block `lblk` (at `pblk`) of the directory: its checksum, its
    /// records, the inode numbers they name. Returns the records (none for an index block
    /// but the first) and whether it is an htree index block.
    pub fn parse(&self, lblk: u32, pblk: u64, b: &[u8]) -> Result<(Vec<DirRecord>, bool)> {
        let dir = self.dir;
        let bad = |what: String| {
            FsError::corrupt_inode(
                dir,
                format!("directory block {lblk} (block {pblk}): {what}"),
            )
        };
        let index_block = self.indexed && is_index_block(b, u64::from(lblk));
        // With metadata_csum every block carries a checksum, as the kernel requires: a dx_tail
        // in index blocks, a dirent tail in record blocks.
        if let Some(s) = self.seed {
            let checked = if index_block {
                verify_dx_checksum(b, s)
            } else {
                verify_tail_checksum(b, s)
            };
            checked.map_err(|c| bad(c.to_string()))?;
        }
        let end = if index_block || self.seed.is_none() {
            b.len()
        } else {
            records_end(b.len(), true)
        };
        let mut recs = parse_block(b, end).map_err(|c| bad(c.to_string()))?;
        if index_block && lblk != 0 {
            recs.clear();
        }
        // An entry names an inode of the file system: one past the last spoils its block,
        // as the kernel's check of a record does. One of the reserved inodes (below
        // `s_first_ino`, but for the root) is damage of that entry only: it is listed, and
        // a lookup of its name fails (`Meta::dir_lookup`), as with the kernel.
        if let Some(r) = recs.iter().find(|r| u64::from(r.inode) > self.inodes) {
            return Err(bad(format!(
                "an entry names inode {}, past the last ({})",
                r.inode, self.inodes
            )));
        }
        Ok((recs, index_block))
    }

    /// The index of a directory of `nblocks` blocks built from its mapped blocks (logical
    /// block, physical block, bytes), in logical order.
    pub fn build<'a>(
        &self,
        nblocks: u32,
        blocks: impl IntoIterator<Item = (u32, u64, &'a [u8])>,
    ) -> Result<DirIndex> {
        let mut idx = IndexBuilder::new(*self, nblocks);
        for (lblk, pblk, b) in blocks {
            idx.add(lblk, pblk, b)?;
        }
        Ok(idx.finish())
    }
}

/// A directory's index being built from its blocks, one at a time in logical order.
pub(crate) struct IndexBuilder {
    shape: DirShape,
    idx: DirIndex,
}

impl IndexBuilder {
    /// An index of a directory of this shape and of `nblocks` blocks, with no block yet.
    pub fn new(shape: DirShape, nblocks: u32) -> IndexBuilder {
        IndexBuilder {
            shape,
            idx: DirIndex::new(shape.indexed, nblocks as usize),
        }
    }

    /// Adds mapped block `lblk` (at `pblk`), checked and parsed ([`DirShape::parse`]).
    pub fn add(&mut self, lblk: u32, pblk: u64, b: &[u8]) -> Result<()> {
        let (recs, index_block) = self.shape.parse(lblk, pblk, b)?;
        let idx = &mut self.idx;
        if index_block {
            idx.index_blocks += 1;
        }
        idx.space[lblk as usize] = if self.shape.indexed {
            0
        } else {
            block_space(&recs)
        };
        for r in recs {
            if r.inode != 0 {
                let slot = DirSlot {
                    ino: r.inode,
                    file_type: r.file_type,
                    lblk,
                    offset: r.offset as u32,
                };
                idx.names.insert(r.name, slot);
            }
        }
        Ok(())
    }

    /// The index.
    pub fn finish(self) -> DirIndex {
        self.idx
    }
}

/// The largest record a new name could take in a block of records `recs`.
pub(crate) fn block_space(recs: &[DirRecord]) -> usize {
    recs.iter().map(record_spare).max().unwrap_or(0)
}

/// The room a new name could take in a record: all of an unused one, the tail of a used one.
pub(crate) fn spare(inode: u32, rec_len: usize, name_len: usize) -> usize {
    if inode == 0 {
        rec_len
    } else {
        rec_len - rec_size(name_len)
    }
}

/// [`spare`] of record `r`.
pub(crate) fn record_spare(r: &DirRecord) -> usize {
    spare(r.inode, r.rec_len, r.name.len())
}

/// A directory's blocks as one version of each (logical block, physical block, bytes shared
/// with the buffer cache), in logical order.
pub(crate) type DirBlocks = Vec<(u32, u64, Arc<[u8]>)>;

/// A directory index to build without the metadata lock: an operation asks for it and
/// stops (`DeferredReads::want_build`), the lock's owner builds it, and the operation runs
/// again and takes it ([`BuiltIndex`]) if the directory's blocks are still those versions.
pub(crate) struct DirBuild {
    pub shape: DirShape,
    pub nblocks: u32,
    pub blocks: DirBlocks,
}

impl DirBuild {
    /// Builds the index (or finds the damage the build under the lock would find).
    pub fn run(self) -> BuiltIndex {
        let result = self.shape.build(
            self.nblocks,
            self.blocks.iter().map(|(l, p, b)| (*l, *p, &b[..])),
        );
        BuiltIndex {
            shape: self.shape,
            nblocks: self.nblocks,
            blocks: self.blocks,
            result,
        }
    }
}

/// An index built without the lock, with what it was built from.
pub(crate) struct BuiltIndex {
    shape: DirShape,
    nblocks: u32,
    /// Held until the index is taken: a change to one of these blocks copies it (the cache's
    /// copy on write), so a block whose cached version is still this one has not changed.
    blocks: DirBlocks,
    pub result: Result<DirIndex>,
}

impl BuiltIndex {
    /// The directory it indexes.
    pub fn dir(&self) -> u32 {
        self.shape.dir
    }

    /// Whether it was built from exactly `blocks` (the same versions, shared), for a
    /// directory of this shape and size.
    pub fn built_from(&self, shape: &DirShape, nblocks: u32, blocks: &DirBlocks) -> bool {
        self.shape == *shape
            && self.nblocks == nblocks
            && self.blocks.len() == blocks.len()
            && self
                .blocks
                .iter()
                .zip(blocks)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && Arc::ptr_eq(&a.2, &b.2))
    }
}

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
