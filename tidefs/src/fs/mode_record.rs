//! Journaling-mode records (docs/DESIGN.md §3.2, docs/FORMAT.md §6): where an inode's mode is
//! kept on disk, how it is read and written back, which mode an inode obeys, and the table of
//! records a mount has loaded. Pure data: the rules that move a file from one directory's mode
//! to another's, which need the metadata, are in `fs/modes.rs`.
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::format::ext4::inode::{flags, Inode};
use crate::format::ext4::xattr::{self, Xattr};
use crate::{FsError, Result};

use super::api::DataMode;

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
    pub fn recorded(&self) -> Option<DataMode> {
        self.own.or_else(|| self.linked.and_then(|l| l.mode))
    }

    /// Writes the record into `attrs` (replacing the old entries) and the flag into `i`.
    pub fn apply(&mut self, i: &mut Inode, attrs: &mut Vec<Xattr>) {
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

/// Whether the full attribute name `name` is the journaling-mode attribute ([`MODE_ATTR`]).
pub fn is_mode_attr_name(name: &[u8]) -> bool {
    xattr::split_name(name).is_some_and(|(index, suffix)| is_mode_attr(index, suffix))
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

    pub fn note(&mut self, ino: u32, rec: ModeRecord) {
        // Under a mount mode that journals no data, the record's own effect (a recorded mode,
        // or ext4's data-journaling flag alone).
        if rec.effective(DataMode::Writeback).may_journal_data() {
            self.data_journaling.store(true, Ordering::SeqCst);
        }
        self.records.insert(ino, rec);
    }

    /// The record of `ino`, when held.
    pub fn get(&self, ino: u32) -> Option<ModeRecord> {
        self.records.get(&ino).copied()
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
    pub fn holds(&self, ino: u32) -> bool {
        self.records.contains_key(&ino)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.records.len()
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
