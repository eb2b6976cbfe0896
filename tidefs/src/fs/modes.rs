//! Per-directory journaling modes (docs/DESIGN.md §3.2, docs/FORMAT.md §6): where an inode's
//! mode is kept on disk, which mode a file obeys, and the rules that move a file from one
//! directory's mode to another's.
//!
//! On disk, in extended attributes of the inode:
//! - `user.tidefs.journal` — a directory's own mode, or a regular file's explicit mode: the
//!   mode's name as text (`journal`, `selective:8192`, ...).
//! - `trusted.tidefs.linked` — on a regular file: the directory that linked it most recently
//!   (4 bytes, little-endian inode number) followed by that directory's mode at the time, as
//!   text (empty: the directory had none and the file follows the mount's default).
//!
//! Which mode an inode obeys:
//! - a directory: its own mode, else the mount's default (`-o data=`, else `ordered`);
//! - a regular file: its explicit mode, else the mode recorded with the directory that linked
//!   it, else `journal` when it carries ext4's per-inode data-journaling flag (set by `chattr
//!   +j` on the kernel's ext4), else the mount's default;
//! - anything else: the mount's default (symlinks and device nodes carry no data of their own).
//!
//! ext4's data-journaling flag is kept set on every inode whose recorded mode is `journal`, so
//! the kernel's ext4 journals those files too.
//!
//! Rules: a new directory takes its parent's own mode; a new regular file records its
//! directory; a link or a rename into another directory records the new directory (when it or
//! the file has a mode record); setting a directory's mode updates the record of every regular
//! file it governs. A change of mode never changes how data written before it is journaled:
//! each dirty page keeps the strictest mode it was written under until it is written back
//! (`fs/datacache.rs`), so what the old mode promised for it holds.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::cache::{ByteRanges, DirtyBlock};
use crate::format::ext4::inode::{flags, Inode};
use crate::format::ext4::xattr::Xattr;
use crate::journal::RangeUpdate;
use crate::{FsError, Result};

use super::api::DataMode;
use super::meta::{Derived, Io, Meta};

/// Full name of the attribute holding a directory's own or a file's explicit mode.
pub const MODE_ATTR: &[u8] = b"user.tidefs.journal";
/// Namespace index and suffix of [`MODE_ATTR`] (`user.`).
const MODE_INDEX: u8 = 1;
const MODE_SUFFIX: &[u8] = b"tidefs.journal";
/// Namespace index and suffix of `trusted.tidefs.linked`, the record of the directory a file
/// obeys (hidden from users).
const LINKED_INDEX: u8 = 4;
const LINKED_SUFFIX: &[u8] = b"tidefs.linked";

/// The directory a regular file obeys, as recorded in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Linked {
    pub dir: u32,
    /// The directory's own mode when recorded; `None`: the mount's default.
    pub mode: Option<DataMode>,
}

/// The mode information of one inode, as its attributes and flags hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ModeRecord {
    pub kind: RecordKind,
    /// A directory's own mode or a file's explicit mode.
    pub own: Option<DataMode>,
    /// Regular files: the directory that linked it most recently.
    pub linked: Option<Linked>,
    /// ext4's per-inode data-journaling flag.
    pub journal_flag: bool,
}

/// What kind of inode a record belongs to (the rules differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordKind {
    Dir,
    File,
    Other,
}

impl ModeRecord {
    /// Reads the record from an inode and its attributes; a value tidefs cannot read is an
    /// error for this inode, never a silent fallback.
    pub fn from_inode(ino: u32, i: &Inode, attrs: &[Xattr]) -> Result<ModeRecord> {
        let kind = if i.is_dir() {
            RecordKind::Dir
        } else if i.is_reg() {
            RecordKind::File
        } else {
            RecordKind::Other
        };
        let mut rec = ModeRecord {
            kind,
            own: None,
            linked: None,
            journal_flag: i.flags() & flags::JOURNAL_DATA != 0,
        };
        for a in attrs {
            if a.index == MODE_INDEX && a.name == MODE_SUFFIX {
                rec.own = Some(parse_mode(ino, &a.value)?);
            } else if a.index == LINKED_INDEX && a.name == LINKED_SUFFIX {
                if a.value.len() < 4 {
                    return Err(FsError::corrupt_inode(
                        ino,
                        "trusted.tidefs.linked is shorter than 4 bytes",
                    ));
                }
                let dir = u32::from_le_bytes([a.value[0], a.value[1], a.value[2], a.value[3]]);
                let mode = match &a.value[4..] {
                    [] => None,
                    name => Some(parse_mode(ino, name)?),
                };
                rec.linked = Some(Linked { dir, mode });
            }
        }
        Ok(rec)
    }

    /// The mode this inode obeys, given the mount's default.
    pub fn effective(&self, default: DataMode) -> DataMode {
        match self.kind {
            RecordKind::Dir => self.own.unwrap_or(default),
            RecordKind::File => self
                .own
                .or_else(|| self.linked.map(|l| l.mode.unwrap_or(default)))
                .or(self.journal_flag.then_some(DataMode::Journal))
                .unwrap_or(default),
            RecordKind::Other => default,
        }
    }

    /// The mode recorded in the inode itself (own, explicit or from its directory), which
    /// decides ext4's data-journaling flag; `None` when it follows the mount's default.
    fn recorded(&self) -> Option<DataMode> {
        self.own.or_else(|| self.linked.and_then(|l| l.mode))
    }

    /// Writes the record into `attrs` (replacing the old entries) and the flag into `i`.
    fn apply(&mut self, i: &mut Inode, attrs: &mut Vec<Xattr>) {
        attrs.retain(|a| !is_mode_attr(a.index, &a.name) && !is_linked_attr(a.index, &a.name));
        if let Some(m) = self.own {
            attrs.push(Xattr {
                index: MODE_INDEX,
                name: MODE_SUFFIX.to_vec(),
                value: m.name().as_bytes().to_vec(),
            });
        }
        if let Some(l) = self.linked {
            let mut value = l.dir.to_le_bytes().to_vec();
            if let Some(m) = l.mode {
                value.extend_from_slice(m.name().as_bytes());
            }
            attrs.push(Xattr {
                index: LINKED_INDEX,
                name: LINKED_SUFFIX.to_vec(),
                value,
            });
        }
        if self.kind != RecordKind::Other {
            self.journal_flag = self.recorded() == Some(DataMode::Journal);
            let f = i.flags() & !flags::JOURNAL_DATA;
            i.set_flags(
                f | if self.journal_flag {
                    flags::JOURNAL_DATA
                } else {
                    0
                },
            );
        }
    }
}

/// Parses a mode name stored on disk.
fn parse_mode(ino: u32, value: &[u8]) -> Result<DataMode> {
    std::str::from_utf8(value)
        .ok()
        .and_then(DataMode::parse)
        .ok_or_else(|| {
            FsError::corrupt_inode(
                ino,
                format!(
                    "unknown journaling mode '{}' in its attributes",
                    String::from_utf8_lossy(value)
                ),
            )
        })
}

/// Parses a mode name given by a user (`setxattr`): the value as `setfattr` passes it, with an
/// optional trailing newline or NUL.
pub fn parse_user_mode(value: &[u8]) -> Result<DataMode> {
    let trimmed = value
        .strip_suffix(b"\0")
        .or_else(|| value.strip_suffix(b"\n"))
        .unwrap_or(value);
    std::str::from_utf8(trimmed)
        .ok()
        .and_then(DataMode::parse)
        .ok_or(FsError::Invalid("unknown journaling mode"))
}

/// Whether `(index, suffix)` names one of the attributes this module owns.
pub fn is_mode_attr(index: u8, suffix: &[u8]) -> bool {
    index == MODE_INDEX && suffix == MODE_SUFFIX
}

/// Whether `(index, suffix)` names the hidden record of a file's directory.
pub fn is_linked_attr(index: u8, suffix: &[u8]) -> bool {
    index == LINKED_INDEX && suffix == LINKED_SUFFIX
}

/// Mode records of inodes, loaded on first use and dropped as the inodes change.
#[derive(Default)]
pub(crate) struct ModeTable {
    records: HashMap<u32, ModeRecord>,
    /// The mount's mode, or some directory or file of this mount, journals file data, so
    /// write-back may put pages in the journal (counted in the running transaction's size),
    /// and a block's newest copy may be in the buffer cache or the journal rather than at
    /// home (reads without the metadata lock then stay off the device). Set before any page
    /// is written under such a mode (the write asks for its file's mode); never cleared.
    data_journaling: Arc<AtomicBool>,
}

impl ModeTable {
    /// A table for a mount whose own mode is `default_mode`.
    pub fn new(default_mode: DataMode) -> ModeTable {
        let t = ModeTable::default();
        t.data_journaling
            .store(default_mode.may_journal_data(), Ordering::SeqCst);
        t
    }

    /// Whether file data may be journaled on this mount (see the field).
    pub fn data_journaling_seen(&self) -> bool {
        self.data_journaling.load(Ordering::SeqCst)
    }

    /// The flag behind [`ModeTable::data_journaling_seen`], for readers without the
    /// metadata lock.
    pub fn data_journaling_flag(&self) -> Arc<AtomicBool> {
        self.data_journaling.clone()
    }

    fn note(&mut self, ino: u32, rec: ModeRecord) {
        // Under a mount mode that journals no data, the record's own effect (a recorded mode,
        // or ext4's data-journaling flag alone).
        if rec.effective(DataMode::Writeback).may_journal_data() {
            self.data_journaling.store(true, Ordering::SeqCst);
        }
        self.records.insert(ino, rec);
    }

    /// Forgets inode `ino` (freed, or its record loaded or changed by an operation that was
    /// rolled back).
    pub fn forget(&mut self, ino: u32) {
        self.records.remove(&ino);
    }

    /// Forgets everything (the table passed its bound).
    pub fn clear(&mut self) {
        self.records.clear();
    }

    /// Whether the record of `ino` is held.
    #[cfg(test)]
    pub fn holds(&self, ino: u32) -> bool {
        self.records.contains_key(&ino)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.records.len()
    }
}

/// A lightweight commit's dirty blocks, sorted by [`Meta::sort_for_lightweight`]: those that
/// go through the journal as usual, those written home in place once the commit is durable,
/// and the inode-table blocks that do both (their stricter inodes' bytes as a range record).
pub(crate) type LightweightSort = (Vec<DirtyBlock>, Vec<(u64, Arc<[u8]>)>, Vec<RangeUpdate>);

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
        for d in dirty {
            let replayable = io.journal.is_logged(d.nr) || io.journal.pending(d.nr).is_some();
            if replayable || self.is_allocation_block(d.nr) {
                journaled.push(d);
            } else if !strict_blocks.contains(&d.nr) {
                if super::logs_as_ranges(&d, ranges_ok) {
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
        (journaled, in_place, shared)
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
        if let Some(r) = self.modes.records.get(&ino) {
            return Ok(*r);
        }
        let i = self.read_inode(io, ino)?;
        let attrs = self.load_xattrs(io, ino, &i)?;
        let rec = ModeRecord::from_inode(ino, &i, &attrs)?;
        self.note_mode_record(ino, rec);
        Ok(rec)
    }

    /// Keeps `rec` as the record of `ino`; a rollback of the running operation forgets it
    /// (it was read from, or written into, bytes the rollback may take back).
    fn note_mode_record(&mut self, ino: u32, rec: ModeRecord) {
        self.note_derived(Derived::ModeRecord(ino));
        self.modes.note(ino, rec);
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
        self.op_light = Some(self.op_light.unwrap_or(true) && light);
        if mode.logs_byte_ranges() {
            self.tx_ranges = true;
        }
    }

    /// Whether every inode the operation acts for is in `lightweight` mode: its frees wait
    /// for its in-place writes, and the blocks it changes may go home in place. An operation
    /// that named no inode counts as strict.
    pub(crate) fn op_is_lightweight(&self) -> bool {
        self.op_light == Some(true)
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
        let mut rec = self.mode_record(io, ino)?;
        if rec.kind != RecordKind::File {
            return Ok(());
        }
        let own = self.mode_record(io, dir)?.own;
        let linked = Linked { dir, mode: own };
        if rec.linked == Some(linked) || (rec.linked.is_none() && own.is_none()) {
            return Ok(());
        }
        rec.linked = Some(linked);
        self.store_mode_record(io, ino, i, rec)
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
        self.store_mode_record(io, ino, &mut i, rec)?;
        i.set_ctime(super::ops::now());
        self.write_inode(io, ino, &mut i)?;
        if rec.kind == RecordKind::Dir {
            self.update_governed_files(io, ino, mode)?;
        }
        Ok(old)
    }

    /// Directory `dir` now has own mode `own`: every regular file in it that obeys it (or
    /// obeys no directory yet) records the new mode.
    fn update_governed_files(&mut self, io: &Io, dir: u32, own: Option<DataMode>) -> Result<()> {
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
        files.sort_unstable();
        files.dedup();
        let linked = Linked { dir, mode: own };
        for f in files {
            let mut rec = self.mode_record(io, f)?;
            if rec.kind != RecordKind::File {
                continue;
            }
            let governed = rec.linked.is_none_or(|l| l.dir == dir);
            if !governed || rec.linked == Some(linked) || (rec.linked.is_none() && own.is_none()) {
                continue;
            }
            self.acts_for(io, f)?;
            rec.linked = Some(linked);
            let mut i = self.read_inode(io, f)?;
            self.store_mode_record(io, f, &mut i, rec)?;
            self.write_inode(io, f, &mut i)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_inode() -> Inode {
        let mut i = Inode::new_zeroed(256, 32);
        i.set_mode(crate::format::ext4::inode::mode::S_IFREG | 0o644);
        i
    }

    #[test]
    fn records_round_trip_through_attributes() {
        let mut i = file_inode();
        let mut rec = ModeRecord::from_inode(12, &i, &[]).unwrap();
        assert_eq!(rec.effective(DataMode::Writeback), DataMode::Writeback);
        rec.linked = Some(Linked {
            dir: 7,
            mode: Some(DataMode::Journal),
        });
        let mut attrs = vec![Xattr {
            index: 1,
            name: b"other".to_vec(),
            value: b"x".to_vec(),
        }];
        rec.apply(&mut i, &mut attrs);
        assert_ne!(
            i.flags() & flags::JOURNAL_DATA,
            0,
            "journal sets ext4's flag"
        );
        let back = ModeRecord::from_inode(12, &i, &attrs).unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.effective(DataMode::Ordered), DataMode::Journal);
        // An explicit mode wins over the directory's.
        let mut rec = back;
        rec.own = Some(DataMode::Selective { threshold: 100 });
        rec.apply(&mut i, &mut attrs);
        assert_eq!(i.flags() & flags::JOURNAL_DATA, 0);
        assert_eq!(attrs.len(), 3, "the unrelated attribute stays");
        let back = ModeRecord::from_inode(12, &i, &attrs).unwrap();
        assert_eq!(
            back.effective(DataMode::Ordered),
            DataMode::Selective { threshold: 100 }
        );
        // A directory that had no mode: the file follows the default.
        let mut rec = back;
        rec.own = None;
        rec.linked = Some(Linked { dir: 9, mode: None });
        rec.apply(&mut i, &mut attrs);
        let back = ModeRecord::from_inode(12, &i, &attrs).unwrap();
        assert_eq!(back.effective(DataMode::Wasteless), DataMode::Wasteless);
    }

    #[test]
    fn ext4_flag_alone_means_journal() {
        let mut i = file_inode();
        i.set_flags(i.flags() | flags::JOURNAL_DATA);
        let rec = ModeRecord::from_inode(3, &i, &[]).unwrap();
        assert_eq!(rec.effective(DataMode::Ordered), DataMode::Journal);
    }

    #[test]
    fn bad_values_are_errors_for_the_inode() {
        let i = file_inode();
        let bad = |index, name: &[u8], value: &[u8]| {
            ModeRecord::from_inode(
                5,
                &i,
                &[Xattr {
                    index,
                    name: name.to_vec(),
                    value: value.to_vec(),
                }],
            )
        };
        assert!(matches!(
            bad(1, MODE_SUFFIX, b"fastest"),
            Err(FsError::Corrupt(_))
        ));
        assert!(matches!(
            bad(4, LINKED_SUFFIX, b"\x01"),
            Err(FsError::Corrupt(_))
        ));
        assert!(matches!(
            bad(4, LINKED_SUFFIX, b"\x01\0\0\0nope"),
            Err(FsError::Corrupt(_))
        ));
        assert!(bad(1, MODE_SUFFIX, b"selective:8K").is_ok());
    }

    #[test]
    fn user_values_accept_a_trailing_newline() {
        assert_eq!(parse_user_mode(b"journal\n").unwrap(), DataMode::Journal);
        assert_eq!(
            parse_user_mode(b"wasteless\0").unwrap(),
            DataMode::Wasteless
        );
        assert!(parse_user_mode(b"journal\n\n").is_err());
        assert!(parse_user_mode(b"\xff").is_err());
    }
}
