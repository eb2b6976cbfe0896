//! The allocator: group descriptors and their in-memory summaries, block and inode bitmaps,
//! and allocation and freeing of blocks and inodes, all inside the running transaction.
//!
//! Invariants:
//! - `groups[g]` always equals group descriptor `g` as stored in its cached GDT block;
//! - descriptors were checked at load: counts fit the group, bitmaps and inode tables lie
//!   inside the file system and overlap neither each other, the superblock copies nor the
//!   journal (`layout` records them all);
//! - a bitmap is used only after it matched its descriptor checksum (`GroupInfo::verified`);
//!   a group whose bitmap failed is `bad` and never allocated from again;
//! - a block freed by a transaction that has not committed is never handed out again (it sits
//!   in `quarantine`), so ordered-mode data never overwrites a block that the last committed
//!   metadata still points to.

use crate::format::ext4::group_desc::{
    bitmap_checksum, GroupDesc, GroupDescRef, BG_BLOCK_UNINIT, BG_INODE_UNINIT,
};
use crate::{FsError, Result};

use std::sync::Arc;

use super::alloc_state::{GroupInfo, LateFree};
use super::cached_writes::SPARE_BLOCKS;
use super::layout::{FixedRun, Layout};
use super::meta::{Io, Meta};

/// `GroupInfo::verified` bit: the block bitmap matched its descriptor checksum.
const VERIFIED_BLOCK_BITMAP: u8 = 1;
/// `GroupInfo::verified` bit: the inode bitmap matched its descriptor checksum.
const VERIFIED_INODE_BITMAP: u8 = 2;

impl Meta {
    /// Applies frees held back by lightweight mode (their transaction's in-place writes are
    /// durable now); they join the running transaction.
    pub fn apply_late_frees(&mut self, io: &Io, frees: Vec<LateFree>) -> Result<()> {
        for f in frees {
            match f {
                LateFree::Blocks {
                    first,
                    len,
                    journaled,
                } => self.free_run_now(io, first, len, journaled)?,
                LateFree::Inode { ino, is_dir } => self.free_inode_now(io, ino, is_dir)?,
            }
        }
        Ok(())
    }

    // ----- group descriptors -----

    /// Reads every group descriptor (checksum verified), checks that its counts fit the group
    /// and that the fixed metadata (superblock copies, GDT, bitmaps, inode tables, internal
    /// journal) lies inside the file system without overlaps, and builds the data layout.
    pub fn load_groups(&mut self, io: &Io) -> Result<()> {
        let mut groups = Vec::with_capacity(self.geo.groups as usize);
        let mut runs = Vec::new();
        let mask = self.geo.bitmap_csum_mask();
        let itable_blocks = self.geo.itable_blocks();
        let ipg = self.geo.inodes_per_group;
        for g in 0..self.geo.groups {
            let (nr, off) = self.geo.desc_location(g);
            let ds = self.geo.desc_size as usize;
            let seed = self.geo.csum_seed;
            let b = self.block(io, nr)?;
            let d = GroupDescRef::new(&b[off..off + ds]);
            if let Some(seed) = seed {
                if d.checksum() != d.compute_checksum(seed, g) {
                    return Err(FsError::corrupt(format!(
                        "group descriptor {g} checksum mismatch"
                    )));
                }
            }
            let info = GroupInfo {
                block_bitmap: d.block_bitmap(),
                inode_bitmap: d.inode_bitmap(),
                inode_table: d.inode_table(),
                free_blocks: d.free_blocks(),
                free_inodes: d.free_inodes(),
                used_dirs: d.used_dirs(),
                flags: d.flags(),
                itable_unused: d.itable_unused(),
                block_bitmap_csum: d.block_bitmap_csum() & mask,
                inode_bitmap_csum: d.inode_bitmap_csum() & mask,
                verified: 0,
                bad: false,
            };
            let blocks = self.geo.blocks_in_group(g);
            for (what, count, limit) in [
                ("free blocks", info.free_blocks, blocks),
                ("free inodes", info.free_inodes, ipg),
                ("directories", info.used_dirs, ipg),
                ("unused inodes", info.itable_unused, ipg),
            ] {
                if count > limit {
                    return Err(FsError::corrupt(format!(
                        "group {g}: {count} {what}, but the group has only {limit}"
                    )));
                }
            }
            let end_of_table = info.inode_table.checked_add(itable_blocks).ok_or_else(|| {
                FsError::corrupt(format!(
                    "group {g}: inode table at block {} overflows",
                    info.inode_table
                ))
            })?;
            for (what, start, end) in [
                (
                    "block bitmap",
                    info.block_bitmap,
                    info.block_bitmap.saturating_add(1),
                ),
                (
                    "inode bitmap",
                    info.inode_bitmap,
                    info.inode_bitmap.saturating_add(1),
                ),
                (super::layout::INODE_TABLE, info.inode_table, end_of_table),
            ] {
                runs.push(FixedRun {
                    start,
                    end,
                    what,
                    group: Some(g),
                });
            }
            groups.push(info);
        }
        runs.extend(self.geo.sb_copy_runs(&self.sb));
        if io.internal_journal {
            for (start, len) in io.journal.device_runs() {
                runs.push(FixedRun {
                    start,
                    end: start.saturating_add(len),
                    what: "journal",
                    group: None,
                });
            }
        }
        let layout = Layout::build(self.geo.first_data_block, self.geo.blocks_count, runs)?;
        self.layout = Arc::new(layout);
        self.alloc.bitmap_blocks = groups
            .iter()
            .flat_map(|g| [g.block_bitmap, g.inode_bitmap])
            .collect();
        self.alloc.groups = groups;
        Ok(())
    }

    /// Sets the superblock's free block and inode counts from the group descriptors, which
    /// are journaled with every allocation: the superblock's own counts are stale after any
    /// crash (they are written only at mount and unmount), as the kernel also assumes.
    pub fn sum_free_counts(&mut self) {
        let groups = &self.alloc.groups;
        let blocks: u64 = groups.iter().map(|g| u64::from(g.free_blocks)).sum();
        let inodes: u64 = groups.iter().map(|g| u64::from(g.free_inodes)).sum();
        if self.sb.free_blocks_count() != blocks {
            self.set_free_blocks(blocks);
            self.sb_dirty = true;
        }
        let inodes = u32::try_from(inodes).unwrap_or(u32::MAX);
        if self.sb.free_inodes_count() != inodes {
            self.set_free_inodes(inodes);
            self.sb_dirty = true;
        }
    }

    /// Sets the superblock's free block count, and publishes it (`FreeCounts`).
    fn set_free_blocks(&mut self, v: u64) {
        self.sb.set_free_blocks_count(v);
        self.free.publish(&self.sb);
    }

    /// Sets the superblock's free inode count, and publishes it (`FreeCounts`).
    fn set_free_inodes(&mut self, v: u32) {
        self.sb.set_free_inodes_count(v);
        self.free.publish(&self.sb);
    }

    /// Writes `groups[g]` into its descriptor, with bitmap checksums `bb`/`ib` if given.
    fn store_group(
        &mut self,
        io: &Io,
        g: u32,
        bb_csum: Option<u32>,
        ib_csum: Option<u32>,
    ) -> Result<()> {
        let info = self.alloc.groups[g as usize];
        let (nr, off) = self.geo.desc_location(g);
        let ds = self.geo.desc_size as usize;
        let seed = self.geo.csum_seed;
        let b = self.block_mut(io, nr)?;
        let mut d = GroupDesc::new(&mut b[off..off + ds]);
        d.set_free_blocks(info.free_blocks);
        d.set_free_inodes(info.free_inodes);
        d.set_used_dirs(info.used_dirs);
        d.set_flags(info.flags);
        d.set_itable_unused(info.itable_unused);
        if let Some(c) = bb_csum {
            d.set_block_bitmap_csum(c);
        }
        if let Some(c) = ib_csum {
            d.set_inode_bitmap_csum(c);
        }
        if let Some(seed) = seed {
            d.update_checksum(seed, g);
        }
        let mask = self.geo.bitmap_csum_mask();
        let gi = self.group_mut(g);
        if let Some(c) = bb_csum {
            gi.block_bitmap_csum = c & mask;
            gi.verified |= VERIFIED_BLOCK_BITMAP;
        }
        if let Some(c) = ib_csum {
            gi.inode_bitmap_csum = c & mask;
            gi.verified |= VERIFIED_INODE_BITMAP;
        }
        // The superblock's free counts are not logged with each allocation: like the kernel,
        // tidefs sums them from the descriptors at mount and writes them at unmount.
        Ok(())
    }

    // ----- bitmaps -----

    /// Computes the block bitmap of a BLOCK_UNINIT group: group metadata that lies inside it.
    pub(super) fn init_block_bitmap(&self, g: u32) -> Vec<u8> {
        let bs = self.geo.bs();
        let mut bm = vec![0u8; bs];
        let first = self.geo.group_first_block(g);
        let n = u64::from(self.geo.blocks_in_group(g));
        let mut mark = |b: u64| {
            if b >= first && b < first + n {
                let i = (b - first) as usize;
                bm[i / 8] |= 1 << (i % 8);
            }
        };
        for b in first..first + self.geo.sb_copy_blocks(&self.sb, g) {
            mark(b);
        }
        let itable_blocks = self.geo.itable_blocks();
        for h in &self.alloc.groups {
            mark(h.block_bitmap);
            mark(h.inode_bitmap);
            for b in h.inode_table..h.inode_table + itable_blocks {
                mark(b);
            }
        }
        for i in n as usize..bs * 8 {
            bm[i / 8] |= 1 << (i % 8);
        }
        bm
    }

    fn block_bitmap_len(&self) -> usize {
        (self.geo.blocks_per_group / 8) as usize
    }

    fn inode_bitmap_len(&self) -> usize {
        (self.geo.inodes_per_group / 8) as usize
    }

    /// Verifies group `g`'s block bitmap (`inode == false`) or inode bitmap against the
    /// checksum in its descriptor, once per mount, as the kernel does before trusting a bitmap
    /// (`ext4_block_bitmap_csum_verify`). An uninitialised bitmap is computed, not read, and
    /// needs no check. A mismatch marks the group bad: it is skipped by the allocators from
    /// then on, and this call fails with a message naming the group and block.
    fn verify_bitmap(&mut self, io: &Io, g: u32, inode: bool) -> Result<()> {
        let info = self.alloc.groups[g as usize];
        let (bit, uninit, nr, stored, len, what) = if inode {
            (
                VERIFIED_INODE_BITMAP,
                BG_INODE_UNINIT,
                info.inode_bitmap,
                info.inode_bitmap_csum,
                self.inode_bitmap_len(),
                "inode",
            )
        } else {
            (
                VERIFIED_BLOCK_BITMAP,
                BG_BLOCK_UNINIT,
                info.block_bitmap,
                info.block_bitmap_csum,
                self.block_bitmap_len(),
                "block",
            )
        };
        if info.bad {
            return Err(FsError::corrupt(format!(
                "group {g}: a bitmap failed its checksum earlier; the group is not used"
            )));
        }
        if info.verified & bit != 0 || info.flags & uninit != 0 {
            return Ok(());
        }
        if let Some(seed) = self.geo.csum_seed {
            let mask = self.geo.bitmap_csum_mask();
            let computed = bitmap_checksum(seed, self.block(io, nr)?, len) & mask;
            if computed != stored {
                self.alloc.groups[g as usize].bad = true;
                return Err(FsError::corrupt(format!(
                    "group {g}: {what} bitmap at block {nr} fails its checksum (stored \
                     {stored:#x}, computed {computed:#x}); the group is no longer used for \
                     allocation"
                )));
            }
        }
        self.alloc.groups[g as usize].verified |= bit;
        Ok(())
    }

    /// Makes sure group `g`'s block bitmap is initialised in the cache and verified.
    fn prepare_block_bitmap(&mut self, io: &Io, g: u32) -> Result<()> {
        // The descriptor that records the bitmap's change is loaded before it: an operation
        // whose first change is to this bitmap then stops for neither after changing
        // (docs/DESIGN.md §4.1, fetch before change).
        self.load(io, self.geo.desc_location(g).0)?;
        let info = self.alloc.groups[g as usize];
        if info.flags & BG_BLOCK_UNINIT == 0 {
            return self.verify_bitmap(io, g, false);
        }
        let bm = self.init_block_bitmap(g);
        self.new_block_mut(info.block_bitmap).copy_from_slice(&bm);
        self.group_mut(g).flags &= !BG_BLOCK_UNINIT;
        let c = self
            .geo
            .csum_seed
            .map(|s| bitmap_checksum(s, &bm, self.block_bitmap_len()));
        self.store_group(io, g, c, None)?;
        self.group_mut(g).verified |= VERIFIED_BLOCK_BITMAP;
        Ok(())
    }

    /// Free blocks in the whole file system.
    pub fn free_blocks(&self) -> u64 {
        self.sb.free_blocks_count()
    }

    /// Free blocks that may be promised now: free, less those freed by transactions that have
    /// not committed yet, those reserved for file data not yet written back and those set
    /// aside for writes without the metadata lock.
    pub fn allocatable_blocks(&self) -> u64 {
        let promised = {
            let pages = self.data.lock();
            pages.reserved() + pages.spare()
        };
        self.free_blocks()
            .saturating_sub(self.alloc.quarantine.len())
            .saturating_sub(promised)
    }

    /// [`Meta::allocatable_blocks`], after giving back the blocks set aside for writes without
    /// the metadata lock if fewer than `need` are allocatable with them set aside: the spare
    /// never makes an operation fail for lack of space.
    pub fn allocatable_blocks_for(&self, need: u64) -> u64 {
        let room = self.allocatable_blocks();
        if room >= need {
            return room;
        }
        self.data.lock().release_spare();
        self.allocatable_blocks()
    }

    /// Sets blocks aside for writes without the metadata lock (`fs/cached_writes.rs`) up to
    /// `target`, when that leaves at least four times [`SPARE_BLOCKS`] allocatable beyond
    /// `margin`: a file system close to full keeps none.
    pub fn top_up_spare(&self, target: u64, margin: u64) {
        let room = self.allocatable_blocks();
        let mut pages = self.data.lock();
        let want = target.saturating_sub(pages.spare());
        if want > 0 && room >= margin + want + 4 * SPARE_BLOCKS {
            pages.add_spare(want);
        }
    }

    /// Where [`Meta::alloc_block`] searches from for `goal` (the cursor for a goal outside
    /// the file system), and that block's group.
    pub(super) fn search_start(&self, goal: u64) -> (u64, u32) {
        let goal = if goal < self.geo.first_data_block || goal >= self.geo.blocks_count {
            self.alloc.block_cursor
        } else {
            goal
        };
        (
            goal,
            self.geo.group_of_block(goal.max(self.geo.first_data_block)),
        )
    }

    /// Loads the block bitmaps and descriptors of the groups that allocating `need` blocks
    /// from `goal` (and a few extent-tree blocks) will take them from, walking the groups as
    /// [`Meta::alloc_block`] does (from the goal's group on, passing over full and damaged
    /// groups) until their free counts cover it: called before an operation's first change,
    /// so that one that must read them stops with nothing to take back (docs/DESIGN.md
    /// §4.1). The goal's own group counts for nothing, since its free blocks may lie before
    /// the goal, which the allocator reaches only after every other group; nor do blocks
    /// waiting in quarantine. Nothing is loaded when the blocks are not there to be had: the
    /// operation will fail for lack of space first. When they are but the few tree blocks
    /// beyond them are not (a file system nearly full), it looks as far as the free blocks
    /// go: a commit's write-back that allocated its reserved blocks there took its tree block
    /// from a group nobody had fetched.
    pub fn fetch_for_allocation(&mut self, io: &Io, goal: u64, need: u64) -> Result<()> {
        let free = self.free_blocks();
        if free < need {
            return Ok(());
        }
        let need = (need + 8).min(free);
        let groups = self.geo.groups;
        let (_, start) = self.search_start(goal);
        let mut left = need;
        for step in 0..groups {
            if left == 0 {
                break;
            }
            let g = (start + step) % groups;
            let info = self.alloc.groups[g as usize];
            if info.free_blocks == 0 || info.bad {
                continue;
            }
            self.load_block_group(io, g)?;
            if step > 0 {
                // Blocks freed by the running transaction are counted free but wait for its
                // commit (`quarantine`): the allocator passes over them.
                let first = self.geo.group_first_block(g);
                let end = first + u64::from(self.geo.blocks_in_group(g));
                let waiting = self.alloc.quarantine.count_in(first, end);
                left = left.saturating_sub(u64::from(info.free_blocks).saturating_sub(waiting));
            }
        }
        Ok(())
    }

    /// Loads what allocating or freeing a block of group `g` changes: its block bitmap
    /// (unless the group is uninitialised, when the bitmap is made in memory, or damaged,
    /// when it is never used again) and its descriptor. For fetching before an operation's
    /// first change (docs/DESIGN.md §4.1).
    pub(super) fn load_block_group(&mut self, io: &Io, g: u32) -> Result<()> {
        let Some(info) = self.alloc.groups.get(g as usize).copied() else {
            return Ok(());
        };
        if info.flags & BG_BLOCK_UNINIT == 0 && !info.bad {
            self.load(io, info.block_bitmap)?;
        }
        self.load(io, self.geo.desc_location(g).0)
    }

    /// Allocates one block, searching from `goal`. Fails with `NoSpace`.
    pub fn alloc_block(&mut self, io: &Io, goal: u64) -> Result<u64> {
        self.alloc_run(io, goal, 1).map(|(b, _)| b)
    }

    /// Allocates a run of 1 to `want` contiguous blocks, searching from `goal`: the first
    /// free block found (from the goal to the end of its group, then the groups after it,
    /// then the start of the goal's group) begins the run, which takes the free blocks that
    /// follow it in the same group, up to `want`. One bitmap checksum and one descriptor
    /// update per run, where a block at a time cost them per block (a 60 GiB fallocate took
    /// 29 s). Returns the first block and the run's length. Fails with `NoSpace`.
    pub fn alloc_run(&mut self, io: &Io, goal: u64, want: u32) -> Result<(u64, u32)> {
        let want = want.max(1) as usize;
        if self.read_only {
            return Err(FsError::ReadOnly);
        }
        let (goal, start_group) = self.search_start(goal);
        let groups = self.geo.groups;
        // A group found damaged is skipped (and never used again); its error is returned only
        // when no other group has room.
        let mut damaged = None;
        for step in 0..=groups {
            let g = (start_group + step) % groups;
            if self.alloc.groups[g as usize].free_blocks == 0 || self.alloc.groups[g as usize].bad {
                continue;
            }
            let first = self.geo.group_first_block(g);
            let n = self.geo.blocks_in_group(g) as usize;
            let from = if step == 0 && goal >= first {
                (goal - first) as usize
            } else {
                0
            };
            match self.prepare_block_bitmap(io, g) {
                Err(FsError::Corrupt(c)) if self.alloc.groups[g as usize].bad => {
                    log::error!("{c}");
                    damaged = Some(c);
                    continue;
                }
                r => r?,
            }
            let bb = self.alloc.groups[g as usize].block_bitmap;
            let found = {
                self.load(io, bb)?;
                let quarantine = &self.alloc.quarantine;
                // OK to unwrap: loaded just above.
                let bm = self.cache.get(bb).expect("bitmap loaded");
                let mut found = None;
                for pass in 0..2 {
                    let (lo, hi) = if pass == 0 {
                        (from, n)
                    } else {
                        (0, from.min(n))
                    };
                    let mut i = lo;
                    while i < hi {
                        if bm[i / 8] == 0xFF && i % 8 == 0 {
                            i += 8;
                            continue;
                        }
                        if bm[i / 8] & (1 << (i % 8)) == 0 {
                            // A quarantined run is skipped whole.
                            match quarantine.end_of_run_holding(first + i as u64) {
                                Some(end) => {
                                    i = usize::try_from(end - first).unwrap_or(usize::MAX);
                                    continue;
                                }
                                None => {
                                    found = Some(i);
                                    break;
                                }
                            }
                        }
                        i += 1;
                    }
                    if found.is_some() {
                        break;
                    }
                }
                found
            };
            let Some(i) = found else { continue };
            // The run: the free blocks after the first, within the group.
            let run = {
                // The run stops at the next quarantined block.
                let limit = self
                    .alloc
                    .quarantine
                    .first_at_or_after(first + i as u64)
                    .map_or(n, |q| ((q - first) as usize).min(n));
                // OK to unwrap: loaded above, and nothing was loaded since that could evict it.
                let bm = self.cache.get(bb).expect("bitmap loaded");
                let mut end = i + 1;
                while end < limit && end - i < want && bm[end / 8] & (1 << (end % 8)) == 0 {
                    end += 1;
                }
                // Never more than the descriptor counts free (a count lower than the bitmap's
                // free bits must not wrap it); the group has at least one, checked above.
                (end - i).min(self.alloc.groups[g as usize].free_blocks as usize)
            };
            // A bitmap that passes its checksum can still be wrong: never hand out a block of
            // fixed metadata (the kernel's "allocating blocks which overlap fs metadata").
            let b = first + i as u64;
            if let Err(why) = self.layout.check_run(b, run as u64) {
                self.alloc.groups[g as usize].bad = true;
                let c = crate::Corrupt::new(format!(
                    "group {g}: the block bitmap marks blocks {b}..{} free, but {why}; the \
                     group is no longer used for allocation",
                    b + run as u64
                ));
                log::error!("{c}");
                damaged = Some(c);
                continue;
            }
            let len = self.block_bitmap_len();
            let seed = self.geo.csum_seed;
            let bm = self.block_mut(io, bb)?;
            for bit in i..i + run {
                bm[bit / 8] |= 1 << (bit % 8);
            }
            let c = seed.map(|s| bitmap_checksum(s, bm, len));
            let run = run as u32;
            self.group_mut(g).free_blocks -= run;
            self.store_group(io, g, c, None)?;
            let free = self.sb.free_blocks_count().saturating_sub(u64::from(run));
            self.set_free_blocks(free);
            self.alloc.block_cursor = b + u64::from(run);
            // Whatever the blocks held before is gone: no cached copy may shadow their new use.
            for block in b..b + u64::from(run) {
                self.cache.forget(block);
            }
            return Ok((b, run));
        }
        Err(damaged.map_or(FsError::NoSpace, FsError::Corrupt))
    }

    /// Frees block `b`. `journaled` says whether it held journaled metadata (then a revoke
    /// record keeps replay from overwriting its next use).
    pub fn free_block(&mut self, io: &Io, b: u64, journaled: bool) -> Result<()> {
        self.free_run(io, b, 1, journaled)
    }

    /// Frees `len` blocks from `first` (see [`Meta::free_block`]): one bitmap change,
    /// checksum and descriptor update per group the run crosses, and one quarantine entry.
    pub fn free_run(&mut self, io: &Io, first: u64, len: u64, journaled: bool) -> Result<()> {
        let end = first.checked_add(len);
        if first < self.geo.first_data_block || end.is_none_or(|e| e > self.geo.blocks_count) {
            return Err(FsError::corrupt(format!(
                "freeing blocks {first}..{} outside the file system",
                first.saturating_add(len)
            )));
        }
        let end = first + len;
        let mut at = first;
        while at < end {
            // One group at a time: a late free and a bitmap change stay within one.
            let g = self.geo.group_of_block(at);
            let group_end = self.geo.group_first_block(g) + u64::from(self.geo.blocks_in_group(g));
            let n = (end.min(group_end) - at) as u32;
            if self.op_is_lightweight() {
                self.free_run_late(at, n, journaled);
            } else {
                self.free_run_now(io, at, n, journaled)?;
            }
            at += u64::from(n);
        }
        Ok(())
    }

    /// Lightweight mode: holds back the free of `len` blocks from `first` (one group) until
    /// the in-place writes of the running transaction are durable ([`LateFree`]). Whether
    /// each block may sit in the journal is decided now, while the cache still knows.
    fn free_run_late(&mut self, first: u64, len: u32, journaled: bool) {
        let end = first + u64::from(len);
        let logged = self.forget_run_logged(first, len);
        let mut push = |first: u64, end: u64, journaled: bool| {
            if end > first {
                self.alloc.late_frees.push(LateFree::Blocks {
                    first,
                    // Within one group.
                    len: (end - first) as u32,
                    journaled,
                });
            }
        };
        if journaled {
            return push(first, end, true);
        }
        let mut at = first;
        for b in logged {
            push(at, b, false);
            push(b, b + 1, true);
            at = b + 1;
        }
        push(at, end, false);
    }

    /// Forgets blocks `first..first + len` in the cache; returns those the running or the
    /// committing transaction holds (sorted), which may reach the journal.
    fn forget_run_logged(&mut self, first: u64, len: u32) -> Vec<u64> {
        let len = u64::from(len);
        let mut logged = self.cache.forget_run(first, len);
        logged.extend(self.committing_in(first, len));
        logged.sort_unstable();
        logged.dedup();
        logged
    }

    /// Clears `len` blocks from `first` (one group) in their bitmap, in the running
    /// transaction.
    fn free_run_now(&mut self, io: &Io, first: u64, len: u32, journaled: bool) -> Result<()> {
        let g = self.geo.group_of_block(first);
        self.prepare_block_bitmap(io, g)?;
        let bb = self.alloc.groups[g as usize].block_bitmap;
        let i0 = (first - self.geo.group_first_block(g)) as usize;
        let bits = i0..i0 + len as usize;
        let bitmap_len = self.block_bitmap_len();
        let seed = self.geo.csum_seed;
        let bm = self.block_mut(io, bb)?;
        // Every block must be in use before any is cleared.
        if let Some(i) = bits.clone().find(|i| bm[i / 8] & (1 << (i % 8)) == 0) {
            return Err(FsError::corrupt(format!(
                "block {} freed twice",
                first + (i - i0) as u64
            )));
        }
        for i in bits {
            bm[i / 8] &= !(1 << (i % 8));
        }
        let c = seed.map(|s| bitmap_checksum(s, bm, bitmap_len));
        let gi = self.group_mut(g);
        gi.free_blocks = gi.free_blocks.saturating_add(len);
        self.store_group(io, g, c, None)?;
        let free = self.sb.free_blocks_count().saturating_add(u64::from(len));
        self.set_free_blocks(free);
        // A block that may sit in the journal gets a revoke record, so replay cannot write its
        // old content over its next use; the revoke takes effect at commit, so until then the
        // block is not handed out again. Plain data blocks wait for the commit too, in every
        // mode as in ext4: until the free commits, a crash brings back the file that owned the
        // block, and its contents must still be its own. A data block journaled by a
        // data-journaling mode (this file's, or one it was in before a switch or a rename) may
        // still be in the log after its checkpoint (`held_in` asks the log).
        let mut logged = self.forget_run_logged(first, len);
        if journaled {
            logged = (first..first + u64::from(len)).collect();
        } else {
            logged.extend(io.journal.held_in(first, u64::from(len)));
            logged.sort_unstable();
            logged.dedup();
        }
        for b in logged {
            self.revoke(b);
        }
        let added = self.alloc.quarantine.insert(first, u64::from(len));
        if let Some(u) = &mut self.op.undo {
            u.quarantined.extend(added);
        }
        self.alloc.freed_running.push((first, len));
        Ok(())
    }

    /// Allocates an inode near group `near`. Directories prefer the emptiest group. With
    /// `takes_block` (a directory, a slow symbolic link), the operation allocates a block for
    /// it next, from its group on (`inode_goal`): the groups that allocation will look in are
    /// fetched before the first change too.
    pub fn alloc_inode(
        &mut self,
        io: &Io,
        near: u32,
        (is_dir, takes_block): (bool, bool),
    ) -> Result<u32> {
        if self.read_only {
            return Err(FsError::ReadOnly);
        }
        let groups = self.geo.groups;
        let start = if is_dir {
            // Spread directories: the group with the most free inodes, ties to the nearest.
            (0..groups)
                .max_by_key(|g| {
                    (
                        self.alloc.groups[*g as usize].free_inodes,
                        u32::MAX - g.abs_diff(near),
                    )
                })
                .unwrap_or(0)
        } else {
            near % groups
        };
        let ipg = self.geo.inodes_per_group;
        for step in 0..groups {
            let g = (start + step) % groups;
            if self.alloc.groups[g as usize].free_inodes == 0 || self.alloc.groups[g as usize].bad {
                continue;
            }
            self.verify_bitmap(io, g, true)?;
            let info = self.alloc.groups[g as usize];
            let len = self.inode_bitmap_len();
            let seed = self.geo.csum_seed;
            let uninit = info.flags & BG_INODE_UNINIT != 0;
            let first_usable = if g == 0 { self.geo.first_ino - 1 } else { 0 };
            // The inode is chosen, and its inode-table block and group descriptor loaded,
            // before the first change:
            // an operation that must read that block from the device stops for it with
            // nothing to take back (docs/DESIGN.md §4.1), as the create that follows writes
            // the new inode into it at once.
            let found = if uninit {
                // Every inode of an uninitialised group is free.
                (first_usable < ipg).then_some(first_usable as usize)
            } else {
                let bm = self.block(io, info.inode_bitmap)?;
                (first_usable as usize..ipg as usize).find(|&i| bm[i / 8] & (1 << (i % 8)) == 0)
            };
            let Some(i) = found else {
                // The descriptor said free inodes exist but the bitmap disagrees.
                return Err(FsError::corrupt(format!(
                    "group {g}: free inode count disagrees with its bitmap"
                )));
            };
            let (table_block, _) = self.inode_location(g * ipg + i as u32 + 1)?;
            self.load(io, table_block)?;
            self.load(io, self.geo.desc_location(g).0)?;
            if takes_block {
                // Its first block is searched for from its inode's group on (`inode_goal`),
                // past full groups as the allocator goes.
                self.fetch_for_allocation(io, self.geo.group_first_block(g), 1)?;
            }
            if uninit {
                let bs = self.geo.bs();
                let bm = self.new_block_mut(info.inode_bitmap);
                for i in ipg as usize..bs * 8 {
                    bm[i / 8] |= 1 << (i % 8);
                }
                self.group_mut(g).flags &= !BG_INODE_UNINIT;
            }
            let bm = self.block_mut(io, info.inode_bitmap)?;
            bm[i / 8] |= 1 << (i % 8);
            let c = seed.map(|s| bitmap_checksum(s, bm, len));
            let gi = self.group_mut(g);
            gi.free_inodes -= 1;
            if is_dir {
                gi.used_dirs = gi.used_dirs.saturating_add(1);
            }
            let used_end = ipg.saturating_sub(gi.itable_unused);
            if i as u32 >= used_end {
                gi.itable_unused = ipg - i as u32 - 1;
            }
            self.store_group(io, g, None, c)?;
            let free = self.sb.free_inodes_count().saturating_sub(1);
            self.set_free_inodes(free);
            return Ok(g * ipg + i as u32 + 1);
        }
        Err(FsError::NoSpace)
    }

    /// Frees inode `ino`.
    pub fn free_inode(&mut self, io: &Io, ino: u32, is_dir: bool) -> Result<()> {
        if self.op_is_lightweight() {
            self.alloc.late_frees.push(LateFree::Inode { ino, is_dir });
            return Ok(());
        }
        self.free_inode_now(io, ino, is_dir)
    }

    /// Clears inode `ino` in its bitmap, in the running transaction.
    fn free_inode_now(&mut self, io: &Io, ino: u32, is_dir: bool) -> Result<()> {
        let ipg = self.geo.inodes_per_group;
        let g = (ino - 1) / ipg;
        let i = ((ino - 1) % ipg) as usize;
        self.load(io, self.geo.desc_location(g).0)?;
        self.verify_bitmap(io, g, true)?;
        let info = self.alloc.groups[g as usize];
        let len = self.inode_bitmap_len();
        let seed = self.geo.csum_seed;
        let bm = self.block_mut(io, info.inode_bitmap)?;
        if bm[i / 8] & (1 << (i % 8)) == 0 {
            return Err(FsError::corrupt(format!("inode {ino} freed twice")));
        }
        bm[i / 8] &= !(1 << (i % 8));
        let c = seed.map(|s| bitmap_checksum(s, bm, len));
        let gi = self.group_mut(g);
        gi.free_inodes = gi.free_inodes.saturating_add(1);
        if is_dir {
            gi.used_dirs = gi.used_dirs.saturating_sub(1);
        }
        self.store_group(io, g, None, c)?;
        let free = self.sb.free_inodes_count().saturating_add(1);
        self.set_free_inodes(free);
        Ok(())
    }
}
