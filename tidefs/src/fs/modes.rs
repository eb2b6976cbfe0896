//! Per-directory journaling modes, the rules (docs/DESIGN.md §3.2): which mode an operation
//! acts in, and the rules that move a file from one directory's mode to another's; how a
//! lightweight commit sorts its blocks. The records themselves (their on-disk form and which
//! mode an inode obeys) are in `fs/mode_record.rs`.
//!
//! Rules: a new directory takes its parent's own mode; a new regular file records its
//! directory; a link or a rename into another directory records the new directory (when it or
//! the file has a mode record); setting a directory's mode updates the record of every regular
//! file it governs. A change of mode never changes how data written before it is journaled:
//! each dirty page keeps the strictest mode it was written under until it is written back
//! (`fs/datacache.rs`), so what the old mode promised for it holds.

use std::collections::HashSet;
use std::sync::Arc;

use crate::cache::{ByteRanges, DirtyBlock};
use crate::format::ext4::inode::Inode;
use crate::journal::RangeUpdate;
use crate::{FsError, Result};

use super::api::{DataMode, XattrSetMode};
use super::derived::Derived;
use super::log_credits::records_credits;
use super::meta::{Io, Meta};
use super::mode_record::{Linked, ModeRecord, RecordKind};

/// A lightweight commit's dirty blocks, sorted by [`Meta::sort_for_lightweight`].
pub(crate) struct LightweightSort {
    /// Blocks that go through the journal as usual.
    pub journaled: Vec<DirtyBlock>,
    /// Blocks written home in place once the commit is durable.
    pub in_place: Vec<(u64, Arc<[u8]>)>,
    /// Inode-table blocks that do both: their stricter inodes' bytes as a range record.
    pub shared: Vec<RangeUpdate>,
    /// Some block only lightweight operations changed was journaled because the log still
    /// holds an older copy of it: after a checkpoint the next commits write it in place.
    pub held_by_log: bool,
}

impl Meta {
    /// Sorts the dirty blocks of a transaction that holds lightweight operations
    /// (docs/DESIGN.md §3.2). Journaled: allocation blocks, blocks the log may still replay
    /// (a checkpoint must never write an older copy over an in-place write), and blocks only
    /// stricter operations changed. In place after the commit: blocks only lightweight
    /// operations changed (unless `ranges_ok` lets them go as byte ranges, which costs no
    /// flush). Both: an inode-table block that lightweight operations and stricter ones
    /// changed, in different inodes' slots — the slots of the inodes a stricter operation
    /// wrote go to the journal as a range record (each inode's bytes carry their own
    /// checksum, so a slot is consistent on its own), and the whole block goes home in place
    /// after the commit, lightweight slots with it. Every other shared block (directory,
    /// extent, xattr blocks: one checksum over the whole block) is journaled whole.
    pub(crate) fn sort_for_lightweight(
        &self,
        io: &Io,
        dirty: Vec<DirtyBlock>,
        strict_blocks: &HashSet<u64>,
        strict_inodes: &HashSet<u32>,
        ranges_ok: bool,
    ) -> LightweightSort {
        let mut journaled = Vec::new();
        let mut in_place = Vec::new();
        let mut shared = Vec::new();
        let mut held_by_log = false;
        for d in dirty {
            let replayable = self.log_may_hold(io, d.nr);
            let allocation = self.is_allocation_block(d.nr);
            if replayable || allocation {
                held_by_log |= replayable && !allocation && !strict_blocks.contains(&d.nr);
                journaled.push(d);
            } else if !strict_blocks.contains(&d.nr) {
                if super::tx_changes::logs_as_ranges(&d, ranges_ok) {
                    journaled.push(d);
                } else {
                    in_place.push((d.nr, d.data));
                }
            } else if let Some(ranges) = self.strict_slot_ranges(&d, strict_inodes) {
                in_place.push((d.nr, Arc::clone(&d.data)));
                shared.push(RangeUpdate {
                    home: d.nr,
                    data: d.data,
                    ranges,
                });
            } else {
                journaled.push(d);
            }
        }
        LightweightSort {
            journaled,
            in_place,
            shared,
            held_by_log,
        }
    }

    /// When `d` is an inode-table block whose changed bytes lie partly in slots of inodes a
    /// stricter operation wrote (`strict_inodes`) and partly in slots of inodes only
    /// lightweight operations wrote: the changed bytes of the first kind, as sorted
    /// `(offset, length)` ranges.
    fn strict_slot_ranges(
        &self,
        d: &DirtyBlock,
        strict_inodes: &HashSet<u32>,
    ) -> Option<Vec<(u32, u32)>> {
        if d.fresh {
            return None;
        }
        let table = self
            .layout
            .run_at(d.nr)
            .filter(|r| r.what == super::layout::INODE_TABLE)?;
        let group = table.group?;
        let index = d.nr - table.start;
        let isz = self.geo.inode_size;
        let per_block = self.geo.block_size / isz;
        // Inode numbers fit in u32 (ext4's s_inodes_count), and so does this block's first.
        let first = group * self.geo.inodes_per_group + index as u32 * per_block + 1;
        let mut strict = ByteRanges::new();
        for slot in (0..per_block).filter(|s| strict_inodes.contains(&(first + s))) {
            let (lo, hi) = (slot * isz, (slot + 1) * isz);
            for r in d.changed.iter() {
                strict.add(r.start.max(lo), r.end.min(hi));
            }
        }
        if strict.is_empty() || strict.bytes() == d.changed.bytes() {
            return None;
        }
        Some(strict.offset_lengths())
    }

    /// The mode record of inode `ino`.
    pub(crate) fn mode_record(&mut self, io: &Io, ino: u32) -> Result<ModeRecord> {
        if let Some(r) = self.derived.modes.get(ino) {
            return Ok(r);
        }
        let i = self.read_inode(io, ino)?;
        self.mode_record_of(io, ino, &i)
    }

    /// Loads the mode record of `ino` if it is not known, from the inode as stored: for a
    /// commit's write-back, which fetches what it reads before its first change
    /// (docs/DESIGN.md §4.1) and must not read the inode with writes without the lock folded
    /// in yet (they change sizes and times, never the record).
    pub(crate) fn fetch_mode_record(&mut self, io: &Io, ino: u32) -> Result<()> {
        if !self.derived.modes.holds(ino) {
            let i = self.stored_inode(io, ino)?;
            self.mode_record_of(io, ino, &i)?;
        }
        Ok(())
    }

    /// The mode record of `ino`, now `i`, read from its attributes and kept.
    fn mode_record_of(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<ModeRecord> {
        let attrs = self.load_xattrs(io, ino, i)?;
        let rec = ModeRecord::from_inode(ino, i, &attrs)?;
        self.note_mode_record(ino, rec);
        Ok(rec)
    }

    /// Keeps `rec` as the record of `ino`; a rollback of the running operation forgets it
    /// (it was read from, or written into, bytes the rollback may take back).
    fn note_mode_record(&mut self, ino: u32, rec: ModeRecord) {
        self.note_derived(Derived::ModeRecord(ino));
        self.derived.modes.note(ino, rec);
    }

    /// The journaling mode inode `ino` obeys.
    pub(crate) fn data_mode(&mut self, io: &Io, ino: u32) -> Result<DataMode> {
        Ok(self.mode_record(io, ino)?.effective(self.default_mode))
    }

    /// Stores `rec` in inode `i` (attributes and flag); the caller writes the inode.
    fn store_mode_record(
        &mut self,
        io: &Io,
        ino: u32,
        i: &mut Inode,
        mut rec: ModeRecord,
    ) -> Result<()> {
        let mut attrs = self.load_xattrs(io, ino, i)?;
        rec.apply(i, &mut attrs);
        self.store_xattrs(io, ino, i, &attrs)?;
        self.note_mode_record(ino, rec);
        Ok(())
    }

    /// The operation in progress acts for inode `ino`: the blocks it changes follow the
    /// strictest mode of the inodes it acts for (see [`Meta::op_is_lightweight`]).
    pub(crate) fn acts_for(&mut self, io: &Io, ino: u32) -> Result<()> {
        let mode = self.data_mode(io, ino)?;
        self.act_in_mode(mode);
        Ok(())
    }

    /// As [`Meta::acts_for`], for a mode already known.
    pub(crate) fn act_in_mode(&mut self, mode: DataMode) {
        let light = mode == DataMode::Lightweight;
        self.op.light = Some(self.op.light.unwrap_or(true) && light);
        if mode.logs_byte_ranges() {
            self.tx.ranges = true;
        }
    }

    /// The rest of the operation is not lightweight: what it changes from here on is journaled
    /// (a change of several blocks that must reach the disk together, `ExtentMap::store`).
    pub(crate) fn act_strictly(&mut self) {
        self.op.light = Some(false);
    }

    /// The operation changes names: a directory entry together with the link count of the
    /// inode it names, or a new inode's first image, or the orphan list (which runs through
    /// the inodes on it). Those blocks are journaled in every mode, lightweight too: written in
    /// place, a cut between the entry and the inode leaves an inode no entry names, or a
    /// directory nothing connects, which a boot-time `fsck -p` will not mend
    /// (docs/DESIGN.md §3.1).
    pub(crate) fn changes_names(&mut self) {
        self.act_strictly();
    }

    /// Whether every inode the operation acts for is in `lightweight` mode: its frees wait
    /// for its in-place writes, and the blocks it changes may go home in place. An operation
    /// that named no inode counts as strict.
    pub(crate) fn op_is_lightweight(&self) -> bool {
        self.op.light == Some(true)
    }

    /// A new inode `ino` in directory `parent` takes its mode from it: a directory copies the
    /// parent's own mode, a regular file records the parent. Called before its first write.
    pub(crate) fn inherit_mode(
        &mut self,
        io: &Io,
        parent: u32,
        ino: u32,
        i: &mut Inode,
    ) -> Result<()> {
        let own = self.mode_record(io, parent)?.own;
        let mut rec = ModeRecord::from_inode(ino, i, &[])?;
        match rec.kind {
            RecordKind::Dir if own.is_some() => rec.own = own,
            RecordKind::File if own.is_some() => {
                rec.linked = Some(Linked {
                    dir: parent,
                    mode: own,
                })
            }
            _ => {
                self.note_mode_record(ino, rec);
                return Ok(());
            }
        }
        self.store_mode_record(io, ino, i, rec)
    }

    /// Regular file `ino` was linked into (or renamed into) directory `dir`: from now on it
    /// obeys `dir`. The caller writes the inode.
    pub(crate) fn relink_mode(&mut self, io: &Io, ino: u32, i: &mut Inode, dir: u32) -> Result<()> {
        match self.relinked_record(io, ino, dir)? {
            Some(rec) => self.store_mode_record(io, ino, i, rec),
            None => Ok(()),
        }
    }

    /// The record regular file `ino` gets when linked into `dir`, if it changes.
    fn relinked_record(&mut self, io: &Io, ino: u32, dir: u32) -> Result<Option<ModeRecord>> {
        let mut rec = self.mode_record(io, ino)?;
        if rec.kind != RecordKind::File {
            return Ok(None);
        }
        let own = self.mode_record(io, dir)?.own;
        let linked = Linked { dir, mode: own };
        if rec.linked == Some(linked) || (rec.linked.is_none() && own.is_none()) {
            return Ok(None);
        }
        rec.linked = Some(linked);
        Ok(Some(rec))
    }

    /// The new attribute blocks that linking each `(inode, directory)` of `moves` takes
    /// (`Meta::relink_mode`), for an operation that checks its space before its first change;
    /// `NoSpace` when a record would fit nowhere.
    pub(crate) fn relink_blocks(&mut self, io: &Io, moves: &[(u32, u32)]) -> Result<u64> {
        let mut records = Vec::new();
        for &(ino, dir) in moves {
            if let Some(rec) = self.relinked_record(io, ino, dir)? {
                records.push((ino, rec));
            }
        }
        let blocks = self.records_blocks(io, &records)?;
        self.reserve_log(records_credits(records.len(), blocks))?;
        Ok(blocks)
    }

    /// The new attribute blocks storing `rec` as the record of `ino` (now `i`) takes.
    fn record_blocks(&mut self, io: &Io, ino: u32, i: &Inode, mut rec: ModeRecord) -> Result<u64> {
        let mut after = i.clone();
        let mut attrs = self.load_xattrs(io, ino, i)?;
        rec.apply(&mut after, &mut attrs);
        self.xattr_blocks_needed(io, &after, &attrs)
    }

    /// Sets (or with `None` clears) the own mode of directory `ino` or the explicit mode of
    /// regular file `ino`, as one operation: a directory's regular files that obey it follow
    /// at once. Returns the mode the inode obeyed before.
    pub(crate) fn set_journal_mode(
        &mut self,
        io: &Io,
        ino: u32,
        mode: Option<DataMode>,
    ) -> Result<DataMode> {
        let mut i = self.live_inode(io, ino)?;
        let mut rec = self.mode_record(io, ino)?;
        let old = rec.effective(self.default_mode);
        if rec.kind == RecordKind::Other {
            return Err(FsError::Invalid(
                "journaling modes apply to directories and regular files",
            ));
        }
        self.acts_for(io, ino)?;
        if let Some(m) = mode {
            self.act_in_mode(m);
        }
        rec.own = mode;
        // Every record it changes, and the attribute blocks they take, known before the first
        // change (docs/DESIGN.md §4.1): a directory's files follow it.
        let governed = if rec.kind == RecordKind::Dir {
            self.governed_records(io, ino, mode, (0, usize::MAX))?
        } else {
            Vec::new()
        };
        let blocks = self.record_blocks(io, ino, &i, rec)? + self.records_blocks(io, &governed)?;
        self.reserve_log(records_credits(governed.len() + 1, blocks))?;
        if blocks > 0 {
            self.ensure_space(blocks)?;
        }
        self.store_mode_record(io, ino, &mut i, rec)?;
        i.set_ctime(super::ops::now());
        self.write_inode(io, ino, &mut i)?;
        self.store_records(io, &governed)?;
        Ok(old)
    }

    /// The checks of setting (`how`) or removing (`None`) the journaling-mode attribute of
    /// `ino`: `Create` of a mode it has, `Replace` or removal of one it has not. They hold
    /// across the steps of a large directory's change, whose own record changes last.
    pub(crate) fn check_mode_attr(
        &mut self,
        io: &Io,
        ino: u32,
        how: Option<XattrSetMode>,
    ) -> Result<()> {
        self.live_inode(io, ino)?;
        match (self.mode_record(io, ino)?.own, how) {
            (Some(_), Some(XattrSetMode::Create)) => Err(FsError::Exists),
            (None, Some(XattrSetMode::Replace) | None) => Err(FsError::NoAttribute),
            _ => Ok(()),
        }
    }

    /// One step of a mode change of directory `dir` whose files are too many for one
    /// transaction: the first `batch` of the files that follow it, among those numbered
    /// above `after`, take their new records; returns the cursor past them (the caller moves
    /// its cursor there once the step is kept, and commits after each step; the cursor
    /// bounds the steps even while files are made in the directory meanwhile). Returns None,
    /// having done nothing, once the rest fits one operation: [`Meta::set_journal_mode`] then
    /// changes every file still to change and the directory, whose own record thus changes
    /// last (a crash between steps leaves some of its files on the new mode already; the
    /// change made again finishes it).
    pub(crate) fn mode_change_step(
        &mut self,
        io: &Io,
        dir: u32,
        mode: Option<DataMode>,
        (batch, after): (usize, u32),
    ) -> Result<Option<u32>> {
        if self.mode_record(io, dir)?.kind != RecordKind::Dir {
            return Ok(None);
        }
        // One more than a step takes tells whether the rest fits one operation.
        let governed = self.governed_records(io, dir, mode, (after, batch + 1))?;
        if governed.len() <= batch {
            return Ok(None);
        }
        let part = &governed[..batch];
        let blocks = self.records_blocks(io, part)?;
        self.reserve_log(records_credits(part.len(), blocks))?;
        if blocks > 0 {
            self.ensure_space(blocks)?;
        }
        self.store_records(io, part)?;
        Ok(Some(part[batch - 1].0))
    }

    /// The new attribute blocks storing each of `records` takes ([`Meta::record_blocks`]).
    fn records_blocks(&mut self, io: &Io, records: &[(u32, ModeRecord)]) -> Result<u64> {
        let mut blocks = 0;
        for &(f, frec) in records {
            let fi = self.read_inode(io, f)?;
            blocks += self.record_blocks(io, f, &fi, frec)?;
        }
        Ok(blocks)
    }

    /// Stores each of `records` (regular files' new records) in its inode.
    fn store_records(&mut self, io: &Io, records: &[(u32, ModeRecord)]) -> Result<()> {
        for &(f, frec) in records {
            self.acts_for(io, f)?;
            let mut fi = self.read_inode(io, f)?;
            self.store_mode_record(io, f, &mut fi, frec)?;
            self.write_inode(io, f, &mut fi)?;
        }
        Ok(())
    }

    /// Directory `dir` gets own mode `own`: the regular files in it that obey it (or obey no
    /// directory yet), each with the record it then has; of those numbered above `after`, the
    /// `limit` with the lowest numbers. Only those files' records are looked at (a step of a
    /// large directory's change reads its names, not every file's record).
    fn governed_records(
        &mut self,
        io: &Io,
        dir: u32,
        own: Option<DataMode>,
        (after, limit): (u32, usize),
    ) -> Result<Vec<(u32, ModeRecord)>> {
        let mut files = Vec::new();
        let mut offset = 0;
        loop {
            let batch = self.dir_records_from(io, dir, offset, 1024)?;
            let Some((_, next)) = batch.last() else {
                break;
            };
            offset = *next;
            files.extend(batch.iter().map(|(r, _)| r.inode));
        }
        // An entry naming a reserved inode (the journal's, say) is damage, not a file the
        // directory governs (`Geometry::entry_may_name`).
        files.retain(|&f| f > after && self.geo.entry_may_name(f));
        files.sort_unstable();
        files.dedup();
        let linked = Linked { dir, mode: own };
        let mut governed = Vec::new();
        for f in files {
            if governed.len() == limit {
                break;
            }
            let mut rec = self.mode_record(io, f)?;
            if rec.kind != RecordKind::File {
                continue;
            }
            let obeys = rec.linked.is_none_or(|l| l.dir == dir);
            if !obeys || rec.linked == Some(linked) || (rec.linked.is_none() && own.is_none()) {
                continue;
            }
            rec.linked = Some(linked);
            governed.push((f, rec));
        }
        Ok(governed)
    }
}
