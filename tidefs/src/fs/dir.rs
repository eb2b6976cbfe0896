//! Directories: lookup through an in-memory name index, insertion and removal of records in
//! linear directory blocks, and readdir with cookies that stay valid while the directory
//! changes (a cookie is the byte position of a record, and records never move).
//!
//! Invariants:
//! - a directory tidefs has modified has no htree index: the first change to an indexed
//!   directory rewrites its index blocks as empty record blocks and clears the index flag, so
//!   no stale index is ever left behind;
//! - `DirIndex::names` holds exactly the live records of the directory, with their positions.

use std::sync::Arc;

use crate::format::ext4::dirent::{
    self, init_empty_block, is_index_block, rec_size, records_end, set_tail_checksum, write_record,
    DirRecord,
};
use crate::format::ext4::inode::{flags, Inode};
use crate::format::ext4::inode_csum_seed;
use crate::{FsError, Result};

use super::derived::Derived;
use super::dir_index::{block_space, record_spare, spare, DirBuild, DirShape, IndexBuilder};
pub(crate) use super::dir_index::{DirIndex, DirSlot};
use super::extents::{inode_goal, ExtentMap};
use super::log_credits::Reserve;
use super::meta::{Io, Meta};

/// Directories of at least this many blocks have their first index built without the
/// metadata lock (`DirBuild`): a smaller one costs less to build than a stop.
const BUILD_UNLOCKED_MIN: usize = 16;

/// Blocks a listing reads ahead of its position (128 KiB of 4 KiB blocks): a cold directory
/// is listed with a stop and a device read per this many blocks, not one per block.
const READDIR_AHEAD: u32 = 32;

/// [`block_space`] of a block after an edit that replaced the records at offsets `changed`
/// with records whose spare room is `now`: computed from the records before the edit, so the
/// block need not be parsed again. Debug builds check it against a fresh parse.
fn space_after_edit(recs: &[DirRecord], changed: &[usize], now: &[usize]) -> usize {
    recs.iter()
        .filter(|r| !changed.contains(&r.offset))
        .map(record_spare)
        .chain(now.iter().copied())
        .max()
        .unwrap_or(0)
}

impl Meta {
    /// The cached block map of `ino` (loaded from `inode` on first use).
    pub(crate) fn extent_map(&mut self, io: &Io, ino: u32, inode: &Inode) -> Result<&ExtentMap> {
        if !self.derived.maps.contains_key(&ino) {
            let map = ExtentMap::load(self, io, ino, inode)?;
            self.put_extent_map(ino, map);
        }
        // OK to unwrap: inserted above if it was missing. Read-only: a change takes the map
        // out (`Meta::take_extent_map`), so a rollback knows it.
        Ok(self.derived.maps.get(&ino).expect("map present"))
    }

    /// [`Meta::extent_map`], shared: for a caller that needs the map while it uses `self`.
    pub(crate) fn shared_extent_map(
        &mut self,
        io: &Io,
        ino: u32,
        inode: &Inode,
    ) -> Result<Arc<ExtentMap>> {
        self.extent_map(io, ino, inode)?;
        // OK to unwrap: loaded above.
        Ok(Arc::clone(
            self.derived.maps.get(&ino).expect("map present"),
        ))
    }

    fn dir_csum_seed(&self, ino: u32, generation: u32) -> Option<u32> {
        self.geo
            .csum_seed
            .map(|s| inode_csum_seed(s, ino, generation))
    }

    /// Debug builds: `space` is what a fresh parse of the edited block finds.
    fn debug_check_space(
        &mut self,
        io: &Io,
        dir: u32,
        lblk: u32,
        pblk: u64,
        generation: u32,
        space: usize,
    ) {
        if cfg!(debug_assertions) {
            let fresh = self
                .dir_block_records(io, dir, lblk, pblk, false, generation)
                .map(|recs| block_space(&recs));
            debug_assert_eq!(fresh.ok(), Some(space), "directory block {lblk} space");
        }
    }

    /// What checking and parsing the blocks of directory `dir` needs, with or without an
    /// htree index (`indexed`), its inode being of generation `generation`.
    fn dir_shape(&self, dir: u32, indexed: bool, generation: u32) -> DirShape {
        DirShape {
            dir,
            indexed,
            seed: self.dir_csum_seed(dir, generation),
            inodes: self.geo.inodes_count(),
        }
    }

    /// Reads and parses block `lblk` of directory `dir` ([`DirShape::parse`]).
    fn dir_block_records(
        &mut self,
        io: &Io,
        dir: u32,
        lblk: u32,
        pblk: u64,
        indexed: bool,
        generation: u32,
    ) -> Result<Vec<DirRecord>> {
        let shape = self.dir_shape(dir, indexed, generation);
        let b = self.block(io, pblk)?;
        Ok(shape.parse(lblk, pblk, b)?.0)
    }

    /// Physical block of directory block `lblk`, which must be mapped.
    fn dir_pblk(&mut self, io: &Io, dir: u32, inode: &Inode, lblk: u32) -> Result<u64> {
        let map = self.extent_map(io, dir, inode)?;
        map.map(lblk)
            .map(|(p, _)| p)
            .ok_or_else(|| FsError::corrupt_inode(dir, format!("directory block {lblk} unmapped")))
    }

    /// Number of blocks in a directory: its size in blocks (bounded by `read_inode`), but
    /// never past the end of what its extent tree maps, so a corrupt `i_size` cannot make a
    /// scan walk unmapped blocks.
    fn dir_blocks(&mut self, io: &Io, dir: u32, inode: &Inode) -> Result<u32> {
        let by_size = inode.size() / u64::from(self.geo.block_size);
        let map = self.extent_map(io, dir, inode)?;
        let mapped = map.extents().last().map_or(0, |e| e.logical_end());
        // Both bounds are below 2^32: mapped extents end below 2^32 - 1 (walk_tree).
        Ok(by_size.min(mapped) as u32)
    }

    /// The mapped blocks of directory `dir` from `lblk` on, below `nblocks`: the next one as
    /// (logical, physical). Scans jump over holes instead of visiting them one by one.
    fn dir_next_block(
        &mut self,
        io: &Io,
        dir: u32,
        inode: &Inode,
        lblk: u32,
        nblocks: u32,
    ) -> Result<Option<(u32, u64)>> {
        let map = self.extent_map(io, dir, inode)?;
        Ok(map.next_mapped(lblk).filter(|(l, _)| *l < nblocks))
    }

    /// Directory `dir`'s mapped blocks in `lblks`, logical and physical, in logical order.
    fn dir_block_numbers(
        &mut self,
        io: &Io,
        dir: u32,
        inode: &Inode,
        lblks: std::ops::Range<u32>,
    ) -> Result<Vec<(u32, u64)>> {
        let map = self.extent_map(io, dir, inode)?;
        Ok(map
            .extents()
            .iter()
            .filter(|e| e.logical_end() > u64::from(lblks.start) && e.logical < lblks.end)
            .flat_map(|e| {
                let from = lblks.start.max(e.logical);
                let to = lblks.end.min(e.logical.saturating_add(e.len));
                (from..to).map(move |l| (l, e.physical + u64::from(l - e.logical)))
            })
            .collect())
    }

    /// The name index of directory `dir`, built on first use.
    pub(crate) fn dir_index(&mut self, io: &Io, dir: u32) -> Result<&DirIndex> {
        self.load_dir_index(io, dir)?;
        // OK to unwrap: loaded above.
        Ok(self.derived.dirs.get(&dir).expect("index present"))
    }

    /// The name index of directory `dir`, to change: withdrawn from the lookups that run
    /// without the metadata lock first (they read it only under the name cache's lock, so it
    /// is then shared with nobody and changes in place), and its record order forgotten.
    fn dir_index_mut(&mut self, io: &Io, dir: u32) -> Result<&mut DirIndex> {
        self.load_dir_index(io, dir)?;
        self.names.withdraw_dir(dir);
        // OK to unwrap: loaded above.
        let idx = Arc::make_mut(self.derived.dirs.get_mut(&dir).expect("index present"));
        idx.changing();
        Ok(idx)
    }

    /// Forgets the name index of `dir` (rebuilt on next use), here and where lookups find it.
    pub(crate) fn forget_dir_index(&mut self, dir: u32) {
        self.names.withdraw_dir(dir);
        self.derived.dirs.remove(&dir);
    }

    /// Inode `ino` is freed, or made anew: nothing cached of it (as a directory, its index
    /// and the names looked up in it; its published extended attributes) may outlive it,
    /// since its number will name another inode.
    pub(crate) fn forget_inode_entirely(&mut self, ino: u32) {
        self.names.forget_dir(ino);
        self.names.withdraw_xattrs(ino);
        self.names.withdraw_target(ino);
        self.derived.dirs.remove(&ino);
        self.data.lock().writes_mut().forget(ino);
    }

    /// Publishes the name index of `dir`, if built, for lookups without the metadata lock.
    pub(crate) fn publish_dir_index(&self, dir: u32) {
        if let Some(idx) = self.derived.dirs.get(&dir) {
            self.names.publish_dir(dir, idx.clone());
        }
    }

    /// Builds the name index of `dir` unless it is cached.
    fn load_dir_index(&mut self, io: &Io, dir: u32) -> Result<()> {
        if self.derived.dirs.contains_key(&dir) {
            return Ok(());
        }
        let inode = self.read_inode(io, dir)?;
        if !inode.is_dir() {
            return Err(FsError::NotDir);
        }
        let indexed = inode.flags() & flags::INDEX != 0;
        let shape = self.dir_shape(dir, indexed, inode.generation());
        let nblocks = self.dir_blocks(io, dir, &inode)?;
        // Every block is parsed: those no memory holds are fetched at once.
        let numbers = self.dir_block_numbers(io, dir, &inode, 0..nblocks)?;
        self.prefetch(io, numbers.iter().map(|b| b.1))?;
        let built = self.op.reads.take_built(dir);
        // A large directory (but not past what read-ahead takes) whose operation may still
        // stop (it has changed nothing) has its index built without the lock, once.
        let unlocked = built.is_none()
            && numbers.len() >= BUILD_UNLOCKED_MIN
            && numbers.len() <= self.cache.capacity() / 4
            && self.op.reads.may_build(dir)
            && self.may_stop();
        let idx = if built.is_some() || unlocked {
            // The version of each block, shared: what a build without the lock reads, and
            // what one built so is checked against.
            let mut blocks = Vec::with_capacity(numbers.len());
            for (lblk, pblk) in numbers {
                self.load(io, pblk)?;
                // OK to unwrap: just loaded.
                let bytes = self.cache.get_shared(pblk).expect("block just loaded");
                blocks.push((lblk, pblk, bytes));
            }
            match built {
                // Built without the lock from these very versions of the blocks: its index,
                // or the damage it found.
                Some(built) if built.built_from(&shape, nblocks, &blocks) => {
                    self.op.reads.count_built_taken();
                    built.result?
                }
                Some(_) => {
                    let versions = blocks.iter().map(|(l, p, b)| (*l, *p, &b[..]));
                    shape.build(nblocks, versions)?
                }
                None => {
                    return Err(self.op.reads.want_build(DirBuild {
                        shape,
                        nblocks,
                        blocks,
                    }))
                }
            }
        } else {
            // Block by block, none held past its parse: a directory may be far larger than
            // the cache.
            let mut idx = IndexBuilder::new(shape, nblocks);
            for (lblk, pblk) in numbers {
                idx.add(lblk, pblk, self.block(io, pblk)?)?;
            }
            idx.finish()
        };
        self.note_derived(Derived::DirIndex(dir));
        self.derived.dirs.insert(dir, Arc::new(idx));
        Ok(())
    }

    /// Looks `name` up in `dir`. An entry that names a reserved inode is damage, and an
    /// error for that name alone (`Geometry::entry_may_name`).
    pub(crate) fn dir_lookup(&mut self, io: &Io, dir: u32, name: &[u8]) -> Result<Option<DirSlot>> {
        let slot = self.dir_index(io, dir)?.names.get(name).copied();
        match slot {
            Some(s) if !self.geo.entry_may_name(s.ino) => Err(FsError::corrupt_inode(
                dir,
                format!(
                    "the entry '{}' names inode {}, which no directory may hold",
                    String::from_utf8_lossy(name),
                    s.ino
                ),
            )),
            slot => Ok(slot),
        }
    }

    /// [`Meta::dir_lookup`] for an operation that will change `dir`: reserves first the
    /// journal blocks its first change rewrites if it still carries an htree index
    /// ([`Meta::reserve_unindex`]).
    pub(crate) fn dir_lookup_to_change(
        &mut self,
        io: &Io,
        dir: u32,
        name: &[u8],
    ) -> Result<Option<DirSlot>> {
        self.reserve_unindex(io, dir)?;
        self.dir_lookup(io, dir, name)
    }

    /// Refuses, before an operation's first change, to add a name to directory `dir` whose
    /// size ends before one of its mapped blocks: a name that finds no room would append a
    /// block at the size, and hand out a block the directory maps already (damage `e2fsck`
    /// repairs). The refusal does not wait to know whether the name would find room, so any
    /// new name in such a directory is refused, as damage; lookups and listings of it go on,
    /// as they read only up to the size.
    pub(crate) fn check_dir_tail(&mut self, io: &Io, dir: u32) -> Result<()> {
        let inode = self.read_inode(io, dir)?;
        let by_size = inode.size() / u64::from(self.geo.block_size);
        let map = self.extent_map(io, dir, &inode)?;
        let past = u32::try_from(by_size)
            .ok()
            .and_then(|from| map.next_mapped(from));
        if let Some((lblk, _)) = past {
            return Err(FsError::corrupt_inode(
                dir,
                format!(
                    "directory i_size {} ends before its mapped block {lblk}",
                    inode.size()
                ),
            ));
        }
        Ok(())
    }

    /// Reserves, once per operation, the journal blocks that rewriting the htree index of
    /// `dir` as a linear directory changes ([`Meta::dir_unindex`]), if it has one: called by
    /// the operations that will change it, before their first change.
    pub(crate) fn reserve_unindex(&mut self, io: &Io, dir: u32) -> Result<()> {
        let idx = self.dir_index(io, dir)?;
        if !idx.indexed {
            return Ok(());
        }
        let blocks = idx.index_blocks;
        self.reserve_log_for(Reserve::Unindex(dir), blocks)
    }

    /// Rewrites an htree directory as a plain linear one (before its first change).
    fn dir_unindex(&mut self, io: &Io, dir: u32) -> Result<()> {
        // Every change to a directory's entries starts here, so its index is noted as
        // changed for a rollback (lookups without the metadata lock stop using it when it is
        // changed, `Meta::dir_index_mut`).
        self.note_derived(Derived::DirIndex(dir));
        if !self.dir_index(io, dir)?.indexed {
            return Ok(());
        }
        self.reserve_unindex(io, dir)?;
        let mut inode = self.read_inode(io, dir)?;
        let csum = self.geo.csum_seed.is_some();
        let seed = self.dir_csum_seed(dir, inode.generation());
        let nblocks = self.dir_blocks(io, dir, &inode)?;
        let parent = self.dir_lookup(io, dir, b"..")?.map_or(dir, |s| s.ino);
        let mut next = 0;
        while let Some((lblk, pblk)) = self.dir_next_block(io, dir, &inode, next, nblocks)? {
            next = lblk + 1;
            let b = self.block(io, pblk)?;
            if !is_index_block(b, u64::from(lblk)) {
                continue;
            }
            let b = self.block_mut(io, pblk)?;
            if lblk == 0 {
                dirent::htree_root_to_linear(b, dir, parent, csum);
            } else {
                init_empty_block(b, csum);
            }
            if let Some(s) = seed {
                set_tail_checksum(b, s);
            }
        }
        inode.set_flags(inode.flags() & !flags::INDEX);
        self.write_inode(io, dir, &mut inode)?;
        self.forget_dir_index(dir);
        let idx = self.dir_index_mut(io, dir)?;
        debug_assert!(!idx.indexed);
        // Keep the flag off even if the scan above saw the old inode.
        idx.indexed = false;
        Ok(())
    }

    /// Adds `name → ino` to directory `dir` (the caller has checked it is absent).
    pub(crate) fn dir_add(
        &mut self,
        io: &Io,
        dir: u32,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<()> {
        if name.len() > dirent::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        self.names.forget_name(dir, name);
        self.dir_unindex(io, dir)?;
        let need = rec_size(name.len());
        let bs = self.geo.bs();
        let csum = self.geo.csum_seed.is_some();
        let mut inode = self.read_inode(io, dir)?;
        let seed = self.dir_csum_seed(dir, inode.generation());
        let idx = self.dir_index(io, dir)?;
        let found = idx.space.iter().position(|s| *s >= need);
        let lblk = match found {
            Some(l) => l as u32,
            None => {
                // Append a block.
                let lblk = self.dir_blocks(io, dir, &inode)?;
                let map = self.take_extent_map(io, dir, &inode)?;
                if map.map(lblk).is_some() {
                    // The size ends inside the mapped blocks: appending would reuse one.
                    return Err(FsError::corrupt_inode(
                        dir,
                        format!(
                            "directory i_size {} ends before its mapped block {lblk}",
                            inode.size()
                        ),
                    ));
                }
                let goal = inode_goal(&map, self, dir);
                let pblk = self.alloc_block(io, goal)?;
                let b = self.new_block_mut(pblk);
                init_empty_block(b, csum);
                if let Some(s) = seed {
                    set_tail_checksum(b, s);
                }
                let mut map = map;
                map.insert(lblk, pblk, false);
                map.store(self, io, dir, &mut inode)?;
                self.put_extent_map(dir, map);
                inode.set_size(u64::from(lblk + 1) * bs as u64);
                inode.set_blocks_512(
                    inode.blocks_512(self.geo.block_size) + u64::from(self.geo.block_size / 512),
                );
                self.write_inode(io, dir, &mut inode)?;
                let space = records_end(bs, csum);
                let spaces = &mut self.dir_index_mut(io, dir)?.space;
                spaces.resize(lblk as usize + 1, 0);
                spaces[lblk as usize] = space;
                lblk
            }
        };
        let pblk = self.dir_pblk(io, dir, &inode, lblk)?;
        let generation = inode.generation();
        let recs = self.dir_block_records(io, dir, lblk, pblk, false, generation)?;
        let Some(r) = recs.iter().find(|r| record_spare(r) >= need) else {
            return Err(FsError::corrupt_inode(
                dir,
                "directory free space index is stale",
            ));
        };
        let b = self.block_mut(io, pblk)?;
        let offset = if r.inode == 0 {
            write_record(b, r.offset, ino, r.rec_len, file_type, name);
            r.offset
        } else {
            let used = rec_size(r.name.len());
            write_record(b, r.offset, r.inode, used, r.file_type, &r.name);
            write_record(b, r.offset + used, ino, r.rec_len - used, file_type, name);
            r.offset + used
        };
        if let Some(s) = seed {
            set_tail_checksum(b, s);
        }
        // The record that took the name keeps what the name left of its spare room.
        let space = space_after_edit(&recs, &[r.offset], &[record_spare(r) - need]);
        self.debug_check_space(io, dir, lblk, pblk, generation, space);
        let idx = self.dir_index_mut(io, dir)?;
        idx.space[lblk as usize] = space;
        idx.names.insert(
            name.to_vec(),
            DirSlot {
                ino,
                file_type,
                lblk,
                offset: offset as u32,
            },
        );
        Ok(())
    }

    /// Removes `name` from directory `dir`; returns what it pointed to.
    pub(crate) fn dir_remove(&mut self, io: &Io, dir: u32, name: &[u8]) -> Result<DirSlot> {
        self.names.forget_name(dir, name);
        self.dir_unindex(io, dir)?;
        let slot = self.dir_lookup(io, dir, name)?.ok_or(FsError::NotFound)?;
        let inode = self.read_inode(io, dir)?;
        let generation = inode.generation();
        let seed = self.dir_csum_seed(dir, generation);
        let pblk = self.dir_pblk(io, dir, &inode, slot.lblk)?;
        let recs = self.dir_block_records(io, dir, slot.lblk, pblk, false, generation)?;
        let pos = recs
            .iter()
            .position(|r| r.offset == slot.offset as usize)
            .ok_or_else(|| FsError::corrupt_inode(dir, "directory index points between records"))?;
        let b = self.block_mut(io, pblk)?;
        let r = &recs[pos];
        let space = if pos == 0 {
            write_record(b, r.offset, 0, r.rec_len, 0, &[]);
            space_after_edit(&recs, &[r.offset], &[r.rec_len])
        } else {
            let p = &recs[pos - 1];
            write_record(
                b,
                p.offset,
                p.inode,
                p.rec_len + r.rec_len,
                p.file_type,
                &p.name,
            );
            let end = r.offset + r.rec_len;
            b[r.offset..end].fill(0);
            let merged = spare(p.inode, p.rec_len + r.rec_len, p.name.len());
            space_after_edit(&recs, &[p.offset, r.offset], &[merged])
        };
        if let Some(s) = seed {
            set_tail_checksum(b, s);
        }
        self.debug_check_space(io, dir, slot.lblk, pblk, generation, space);
        let idx = self.dir_index_mut(io, dir)?;
        idx.space[slot.lblk as usize] = space;
        idx.names.remove(name);
        Ok(slot)
    }

    /// Points the existing entry `name` of `dir` at another inode.
    pub(crate) fn dir_retarget(
        &mut self,
        io: &Io,
        dir: u32,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<()> {
        self.names.forget_name(dir, name);
        self.dir_unindex(io, dir)?;
        let slot = self.dir_lookup(io, dir, name)?.ok_or(FsError::NotFound)?;
        let inode = self.read_inode(io, dir)?;
        let seed = self.dir_csum_seed(dir, inode.generation());
        let pblk = self.dir_pblk(io, dir, &inode, slot.lblk)?;
        let b = self.block_mut(io, pblk)?;
        let off = slot.offset as usize;
        crate::format::put_le32(b, off, ino);
        b[off + 7] = file_type;
        if let Some(s) = seed {
            set_tail_checksum(b, s);
        }
        // OK to unwrap: looked up above.
        let e = self
            .dir_index_mut(io, dir)?
            .names
            .get_mut(name)
            .expect("entry present");
        e.ino = ino;
        e.file_type = file_type;
        Ok(())
    }

    /// Whether directory `dir` holds nothing but "." and "..".
    pub(crate) fn dir_is_empty(&mut self, io: &Io, dir: u32) -> Result<bool> {
        Ok(self
            .dir_index(io, dir)?
            .names
            .keys()
            .all(|n| dirent::is_dot_or_dotdot(n)))
    }

    /// Records of `dir` from cookie `offset` on, as (record, cookie of the next one).
    pub(crate) fn dir_records_from(
        &mut self,
        io: &Io,
        dir: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<(DirRecord, u64)>> {
        let inode = self.read_inode(io, dir)?;
        if !inode.is_dir() {
            return Err(FsError::NotDir);
        }
        let indexed = inode.flags() & flags::INDEX != 0;
        let bs = u64::from(self.geo.block_size);
        let nblocks = self.dir_blocks(io, dir, &inode)?;
        let mut out = Vec::new();
        let Ok(first) = u32::try_from(offset / bs) else {
            return Ok(out);
        };
        // Read ahead: from the first block not at hand, a window of them fetched at once.
        let ahead = first.saturating_add(2 * READDIR_AHEAD).min(nblocks);
        let blocks: Vec<u64> =
            (self.dir_block_numbers(io, dir, &inode, first.min(ahead)..ahead)?)
                .into_iter()
                .map(|b| b.1)
                .collect();
        self.read_ahead(io, &blocks, READDIR_AHEAD as usize)?;
        let mut next = first;
        while out.len() < max {
            let Some((lblk, pblk)) = self.dir_next_block(io, dir, &inode, next, nblocks)? else {
                break;
            };
            next = lblk + 1;
            let pos = if lblk == first {
                (offset % bs) as usize
            } else {
                0
            };
            let recs = self.dir_block_records(io, dir, lblk, pblk, indexed, inode.generation())?;
            for r in recs {
                if r.offset < pos || r.inode == 0 {
                    continue;
                }
                let next = u64::from(lblk) * bs + (r.offset + r.rec_len) as u64;
                out.push((r, next));
            }
        }
        Ok(out)
    }
}
