//! Write-back: dirty file pages (`fs/datacache.rs`) get their blocks and leave memory.
//!
//! Write-back runs inside one operation of the running transaction, at commit (every dirty
//! file) or at fsync of one file. For each file it allocates the blocks of pages over holes
//! (one goal after the other, so a file written in one go gets one extent; a row of pages over
//! holes that follow each other gets its blocks as one run), turns unwritten
//! extents under dirty pages into written ones, stores the extent tree and the inode's block
//! count, and then either
//! - in the modes that journal a page (`journal`, `wasteless`, `selective`'s small writes),
//!   puts it into the buffer cache as a dirty block of the running transaction, its bytes
//!   shared with the page, not copied (the data is logged with the metadata that maps it:
//!   whole, or as the ranges a write changed), or
//! - in the other modes, returns the page as a `HomeWrite` that the caller writes to its home
//!   location: before the transaction's commit record when its mode orders data (ordered,
//!   selective's large writes: `HomeWrite::ordered`), else with it (writeback, lightweight:
//!   the commit may then be unfenced, docs/DESIGN.md §4.2).
//!
//! Pages become clean only once their bytes are at home (`finish_home_writes`), and only
//! if no write changed them meanwhile.

use std::collections::HashMap;
use std::sync::Arc;

use super::datacache::{DataCache, DirtyPage};
use super::extent_map::ExtentMap;
use super::extents::inode_goal;
use super::meta::{Io, Meta};
use crate::format::ext4::inode::flags;
use crate::Result;

/// One file block on its way home.
pub(crate) struct HomeWrite {
    /// Byte offset on the file-system device.
    pub at: u64,
    pub bytes: Arc<[u8]>,
    pub ino: u32,
    pub lblk: u32,
    pub gen: u64,
    /// The page's mode orders data: it must be durable before the commit record
    /// ([`crate::DataMode::orders_data`]).
    pub ordered: bool,
}

impl HomeWrite {
    /// Page `page` of file `ino`, for byte `at` of the device.
    fn of(ino: u32, page: DirtyPage, at: u64, ordered: bool) -> HomeWrite {
        HomeWrite {
            at,
            bytes: page.bytes,
            ino,
            lblk: page.lblk,
            gen: page.gen,
            ordered,
        }
    }
}

/// Which pages a write-back takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every dirty page of every file (commit).
    All,
    /// The dirty pages of one file that overwrite blocks already written on disk, in a mode
    /// that writes data in place: they need no metadata change, so fdatasync can send them
    /// home without a commit.
    Overwrites(u32),
    /// The first `pages` pages over holes, of every file, from block `from.1` of inode
    /// `from.0` on: a commit's write-back allocates their blocks in pieces before it closes
    /// the transaction (`Meta::allocate_ahead`), and collects nothing.
    Allocate { pages: usize, from: (u32, u32) },
}

impl Meta {
    /// Allocates, maps and collects the dirty pages in `scope` (see the module comment), as
    /// one operation of the running transaction: a failure takes back every change.
    pub(crate) fn writeback(&mut self, io: &Io, scope: Scope) -> Result<Vec<HomeWrite>> {
        self.run_op(|m| m.writeback_pages(io, scope))
    }

    /// Allocates the blocks of up to `pages` pages over holes, from block `from.1` of inode
    /// `from.0` on, as one operation of the running transaction; returns how many it
    /// allocated and where the next piece starts. A commit that writes much new data back
    /// runs these in turn, each in one hold of the metadata lock, before its close, so other
    /// operations wait for one piece at most rather than for the whole allocation (the close
    /// then only collects the pages). The pages stay dirty, and the blocks are noted in
    /// `allocated_ahead`, so the close handles each page as it would have had it allocated
    /// the block itself.
    pub(crate) fn allocate_ahead(
        &mut self,
        io: &Io,
        pages: usize,
        from: (u32, u32),
    ) -> Result<(usize, (u32, u32))> {
        let got = self.writeback(io, Scope::Allocate { pages, from })?;
        let mut next = from;
        if !self.op.reads.stopped() {
            let bs = u64::from(self.geo.block_size);
            // `got` is sorted by block: noted run by run.
            let mut run: Option<(u64, u64)> = None;
            for w in &got {
                next = next.max((w.ino, w.lblk.saturating_add(1)));
                let nr = w.at / bs;
                run = match run {
                    Some((first, len)) if first + len == nr => Some((first, len + 1)),
                    Some((first, len)) => {
                        self.alloc.allocated_ahead.insert(first, len);
                        Some((nr, 1))
                    }
                    None => Some((nr, 1)),
                };
            }
            if let Some((first, len)) = run {
                self.alloc.allocated_ahead.insert(first, len);
            }
        }
        Ok((got.len(), next))
    }

    /// Loads what writing back `files` reads, before the write-back's first change (so that
    /// one that must read from the device stops with nothing to take back, docs/DESIGN.md
    /// §4.1), given for each file the blocks it will allocate and whether it has pages to
    /// write: each file's inode-table block and mode record and, for a file with blocks to
    /// allocate or pages to write, its block map and the block bitmaps and descriptors of the
    /// groups its new blocks will come from (`Meta::fetch_for_allocation`, from its goal for
    /// those blocks, or for one tree block: pages over unwritten blocks split extents). The
    /// inode is read as stored: `read_inode` here would note the writes without the lock
    /// seen too early. The bitmaps are loaded ahead of need: a device error on one of them is
    /// left to the allocation that really needs it, if any, and never fails the write-back
    /// here. Cheap when all is cached (one hold of the page cache's mutex, a lookup per
    /// file), since it runs at every commit.
    fn fetch_for_writeback(&mut self, io: &Io, files: &[(u32, u64, bool)]) -> Result<()> {
        // Blocks the files before claim from each group where a search starts: new files of
        // one directory share a goal, and each takes its blocks after those of the others.
        let mut claimed: HashMap<u32, u64> = HashMap::new();
        for &(ino, need, dirty) in files {
            self.fetch_mode_record(io, ino)?;
            // Pages over blocks it has make unwritten ones written, which splits extents: the
            // tree may take a block even when no data block is allocated.
            if need == 0 && !dirty {
                let (nr, _) = self.inode_location(ino)?;
                self.load(io, nr)?;
                continue;
            }
            let inode = self.stored_inode(io, ino)?;
            if inode.flags() & flags::EXTENTS == 0 {
                continue;
            }
            let map = self.shared_extent_map(io, ino, &inode)?;
            let goal = inode_goal(&map, self, ino);
            let need = need.max(1);
            let before = claimed.entry(self.search_start(goal).1).or_default();
            let ahead = *before;
            *before += need;
            match self.fetch_for_allocation(io, goal, ahead + need) {
                Err(e) if !self.op.reads.stopped() => {
                    log::debug!("write-back of inode {ino}: bitmaps not fetched ahead: {e}");
                }
                r => r?,
            }
        }
        Ok(())
    }

    fn writeback_pages(&mut self, io: &Io, scope: Scope) -> Result<Vec<HomeWrite>> {
        // Allocation ahead: the pages of each file the piece takes, chosen first, so that it
        // fetches for those alone (the close fetches for every file).
        let mut chosen: HashMap<u32, Vec<DirtyPage>> = HashMap::new();
        let files = match scope {
            Scope::All => {
                // And the files whose size or times writes without the lock changed.
                let pages = self.data.lock();
                let mut files = pages.dirty_files();
                files.extend(pages.writes().pending_files());
                files.sort_unstable();
                files.dedup();
                files
            }
            Scope::Overwrites(ino) => vec![ino],
            Scope::Allocate {
                pages: mut left,
                from,
            } => {
                let pages = self.data.lock();
                let mut files = Vec::new();
                for ino in pages.dirty_files() {
                    if left == 0 {
                        break;
                    }
                    if ino < from.0 || pages.reserved_of(ino) == 0 {
                        continue;
                    }
                    let first = if ino == from.0 { from.1 } else { 0 };
                    let over_holes = pages.pages_over_holes(ino, first, left);
                    if !over_holes.is_empty() {
                        left -= over_holes.len();
                        files.push(ino);
                        chosen.insert(ino, over_holes);
                    }
                }
                files
            }
        };
        let overwrites = matches!(scope, Scope::Overwrites(_));
        if !overwrites {
            // Blocks to allocate and whether there are pages to write, per file.
            let needs: Vec<(u32, u64, bool)> = {
                let pages = self.data.lock();
                files
                    .iter()
                    .map(|&ino| match chosen.get(&ino) {
                        Some(c) => (ino, c.len() as u64, true),
                        None => (ino, pages.reserved_of(ino), pages.dirty_count_of(ino) > 0),
                    })
                    .collect()
            };
            self.fetch_for_writeback(io, &needs)?;
        }
        let bs = u64::from(self.geo.block_size);
        let mut out = Vec::new();
        for ino in files {
            let mode = self.data_mode(io, ino)?;
            if overwrites && mode.journals_data(usize::MAX) {
                // journal and wasteless: every page goes through the journal, none home.
                continue;
            }
            // The size and times stored below are those of exactly these pages (a write
            // without the lock may come in between the two otherwise). Allocation ahead
            // stores none: they wait for the close.
            let (mut pages, pending) = match chosen.remove(&ino) {
                Some(over_holes) => (over_holes, None),
                None => self.data.lock().dirty_pages_and_pending(ino),
            };
            // Bytes a commit whose block the journal holds sent home are durable there
            // already (its first flush), and the transaction that maps them commits first.
            pages.retain(|p| !p.sent);
            let pending = pending.filter(|_| scope == Scope::All);
            if pages.is_empty() && pending.is_none() {
                continue;
            }
            // The blocks changed for this file follow its mode (and that of its pages).
            self.op.light = None;
            self.act_in_mode(mode);
            for p in &pages {
                self.act_in_mode(p.mode);
            }
            let mut inode = self.read_inode_with(io, ino, pending)?;
            let mut map = self.take_extent_map(io, ino, &inode)?;
            let mut goal = inode_goal(&map, self, ino);
            let mut new_blocks = 0u64;
            let mut map_changed = false;
            // For each page over a hole, how many pages from it on are over the holes that
            // follow it: they get their blocks in one run (one bitmap checksum and descriptor
            // update per run, not per block). Only a commit's write-back allocates.
            let holes_from = holes_ahead(&pages, &map);
            // The rest of the last run allocated: the next file block it serves, and its block.
            let mut run: Option<(u32, u64, u32)> = None;
            for (k, page) in pages.into_iter().enumerate() {
                // `fresh`: nothing of this block's file content is at home or in the log (a
                // block just allocated). A block of an unwritten extent has no content at
                // home, but the log may still hold a copy journaled before the extent was
                // made unwritten (`zero_range`): `logged_before` (found by review: such a
                // copy, neither revoked nor superseded, came back over the data by replay
                // or checkpoint).
                let (pblk, fresh, logged_before) = match map.map(page.lblk) {
                    Some((p, false))
                        if scope == Scope::All && self.alloc.allocated_ahead.contains(p) =>
                    {
                        (p, true, false)
                    }
                    Some((p, false)) => (p, false, true),
                    _ if overwrites => continue,
                    Some(_) if scope != Scope::All => continue,
                    Some((p, true)) => {
                        map.mark_written(page.lblk);
                        map_changed = true;
                        (p, true, true)
                    }
                    None => {
                        let p = match run {
                            Some((lblk, p, left)) if lblk == page.lblk && left > 0 => {
                                run = Some((lblk + 1, p + 1, left - 1));
                                p
                            }
                            _ => {
                                let near = page
                                    .lblk
                                    .checked_sub(1)
                                    .and_then(|l| map.map(l))
                                    .map_or(goal, |(p, _)| p + 1);
                                let (p, got) = self.alloc_run(io, near, holes_from[k])?;
                                run = Some((page.lblk + 1, p + 1, got - 1));
                                p
                            }
                        };
                        map.insert(page.lblk, p, false);
                        goal = p + 1;
                        new_blocks += 1;
                        map_changed = true;
                        (p, true, false)
                    }
                };
                if let Scope::Allocate { .. } = scope {
                    // Noted as allocated ahead by the caller; the close does the rest.
                    self.data.lock().allocated(ino, page.lblk);
                    out.push(HomeWrite::of(ino, page, pblk * bs, false));
                    continue;
                }
                // A page follows the strictest mode it was written under (a switch of mode
                // keeps the old mode's promise for it). A block whose journaled copy is not
                // home yet stays journaled until its checkpoint (selective's update sequence
                // goes on; after a switch away from a journaling mode the same holds), so a
                // checkpoint never writes an older journaled copy over newer data in place.
                let mode = page.mode;
                let journaled = mode.journals_data(page.first_write)
                    || (logged_before
                        && (self.cache.is_dirty(pblk)
                            || self.committing.contains_key(&pblk)
                            || io.journal.pending(pblk).is_some()));
                if journaled && overwrites {
                    continue;
                }
                if page.reserved {
                    self.data.lock().allocated(ino, page.lblk);
                }
                if journaled {
                    // The page joins the transaction; the buffer cache owns it from here, so
                    // the page is clean at once. Only the written bytes are logged when the
                    // block's committed content is known (at home or in the log).
                    if fresh || !(mode.logs_byte_ranges() || self.tx.ranges) {
                        // Shared with the page, not copied under the lock.
                        self.new_block_shared(pblk, Arc::clone(&page.bytes));
                    } else {
                        self.log_data_ranges(pblk, Arc::clone(&page.bytes), &page.changed);
                    }
                    // The file's data is in this transaction now, no longer in a dirty page:
                    // its fsync and fdatasync wait for this commit (noted before the page
                    // turns clean, so a planner that sees it clean sees this too).
                    self.sync.changed(ino, self.tid, false);
                    self.data.lock().written_back(ino, page.lblk, page.gen);
                } else {
                    if logged_before {
                        // An older journaled sequence of this block may still be in the log
                        // (this mode's, or the file's mode before a switch): revoke it, or
                        // replay would write it over this data.
                        if self.log_may_hold(io, pblk) {
                            self.revoke(pblk);
                        }
                        self.cache.forget(pblk);
                    }
                    out.push(HomeWrite::of(ino, page, pblk * bs, mode.orders_data()));
                }
            }
            if map_changed {
                let before = inode.blocks_512(self.geo.block_size);
                map.store(self, io, ino, &mut inode)?;
                if inode.blocks_512(self.geo.block_size) != before {
                    // Tree blocks: `st_blocks` moves although no write asked (the data
                    // blocks were counted as reserved from the write on).
                    self.blocks_changed.push(ino);
                }
                let blocks = inode.blocks_512(self.geo.block_size) + new_blocks * (bs / 512);
                inode.set_blocks_512(blocks);
            }
            if map_changed || pending.is_some() {
                self.write_inode(io, ino, &mut inode)?;
            }
            self.put_extent_map(ino, map);
            // Writes without the lock find its holes again (appends past the blocks just
            // allocated).
            self.publish_extent_map(ino);
        }
        out.sort_unstable_by_key(|w| w.at);
        Ok(out)
    }
}

/// Notes that the pages of `writes` went home with a transaction that is not yet durable (its
/// commit block held): the next write-back leaves them alone unless they change.
pub(crate) fn sent_home_writes(pages: &parking_lot::Mutex<DataCache>, writes: &[HomeWrite]) {
    let mut pages = pages.lock();
    for w in writes {
        pages.sent_home(w.ino, w.lblk, w.gen);
    }
}

/// Marks the pages of `writes` clean now that their bytes are at home (those changed since
/// stay dirty for the next write-back). Needs only the page cache's mutex: a commit of 64 MiB
/// held the metadata lock 2-3 ms longer for it.
pub(crate) fn finish_home_writes(pages: &parking_lot::Mutex<DataCache>, writes: &[HomeWrite]) {
    let mut pages = pages.lock();
    for w in writes {
        pages.written_home(w.ino, w.lblk, w.gen);
    }
}

/// For each of `pages` (in file order), the number of pages from it on whose blocks are
/// holes of `map` and follow each other in the file (0 for a page over a mapped block).
fn holes_ahead(pages: &[DirtyPage], map: &ExtentMap) -> Vec<u32> {
    let mut ahead = vec![0u32; pages.len()];
    for k in (0..pages.len()).rev() {
        if map.map(pages[k].lblk).is_some() {
            continue;
        }
        let next = pages
            .get(k + 1)
            .filter(|n| Some(n.lblk) == pages[k].lblk.checked_add(1));
        ahead[k] = 1 + next.map_or(0, |_| ahead[k + 1]);
    }
    ahead
}

/// Writes `writes` (sorted by offset) to the device in one call, which merges runs of
/// adjacent blocks into one write each.
pub(crate) fn write_home(io: &Io, writes: &[HomeWrite]) -> Result<()> {
    if writes.is_empty() {
        return Ok(());
    }
    let pieces: Vec<(u64, &[u8])> = writes.iter().map(|w| (w.at, &w.bytes[..])).collect();
    io.dev.write_blocks(&pieces)?;
    Ok(())
}
