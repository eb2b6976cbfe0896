//! Workloads for the crash harness: operations over a small file set, a model of what each
//! persistence point promised, and the workload families.
//!
//! File set (as ACE's bounded sequences use): the root, directory `A`, files `foo` and `A/bar`.
//! The base image of every workload holds `A` (empty) and `foo` (8292 bytes of tagged data, an
//! extended attribute `user.a`), made by the setup and a clean unmount.
//!
//! Every byte a workload writes is *tagged*: its value is [`pattern_byte`] of the write's id and
//! the file offset, never zero, so the oracle can tell which write put a byte at an offset, and
//! that a byte nobody wrote there is garbage.
//!
//! The `threads` family runs several writer threads at once, each appending to its own file
//! and calling fsync or fdatasync, so many operations are in flight in one crash state and
//! their fsyncs share commits. Each thread keeps its own copy of the model (it is the only one
//! to touch its file), and the events of all threads are merged by log position. A prelude
//! (single-threaded, before the crash states begin) first moves the journal's head near the end
//! of the log, so the threads' commits wrap around it.
//!
//! Invariants:
//! - the model follows the file system: an operation that fails is recorded as failed and does
//!   not change the model (the generators avoid such operations, so it is rare);
//! - `OpStart` of an operation is marked in the log before the operation writes anything, and a
//!   promise is marked only after the persistence call returned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tidefs::dev::record::{LogEntry, Recording, RecordingDevice};
use tidefs::dev::BlockDevice;
use tidefs::fs::{
    Creds, DataMode, Fs, Ino, MountOptions, RenameFlags, SetAttr, XattrSetMode, ROOT_INO,
};

use crate::canary::JournalArea;
use crate::gen::{mix, Rng};

/// The value of byte `offset` of write `write_id` (never zero).
pub fn pattern_byte(write_id: u64, offset: u64) -> u8 {
    let b = (mix(write_id.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ offset) >> 32) as u8;
    if b == 0 {
        0x5a
    } else {
        b
    }
}

/// `len` tagged bytes of write `write_id` starting at file offset `offset`.
pub fn pattern(write_id: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| pattern_byte(write_id, offset + i))
        .collect()
}

/// How a write chooses its range from the file's current size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// 100 bytes at the end of file.
    AppendSub,
    /// One whole block at the first block boundary at or after the end of file.
    AppendBlock,
    /// 9000 bytes starting 300 bytes past the end of file (unaligned, over three blocks).
    AppendMulti,
    /// 200 bytes at offset 1000.
    OverwriteSub,
    /// 6000 bytes at offset 1500 (unaligned, over two blocks).
    OverwriteMulti,
    /// [`LARGE_WRITE`] bytes starting 300 bytes past the end of file: more new blocks than
    /// the page cache keeps spare (so the write sets blocks aside under the lock and copies
    /// without it), allocated ahead of its commit's close in many pieces, and, in a
    /// data-journaling mode on a small journal, written as several operations. Only the
    /// random family uses it.
    AppendLarge,
}

/// The byte ranges of the operations a write of `len` bytes at `off` goes as in a
/// data-journaling mode ([`DataWrite::parts`]).
fn journaled_parts(fs: &Fs, off: u64, len: usize) -> Vec<std::ops::Range<u64>> {
    let end = off + len as u64;
    let mut parts = Vec::new();
    let mut at = off;
    while at < end {
        let rest = usize::try_from(end - at).unwrap_or(usize::MAX);
        let n = fs.journaled_write_part(at, rest).max(1) as u64;
        parts.push(at..at + n);
        at += n;
    }
    parts
}

/// Bytes of a [`WriteKind::AppendLarge`]: 74 or 75 blocks of 4 KiB (the images' block size),
/// more than the 64 the page cache keeps spare, and than the 62 one journaled operation takes
/// with the images' 4 MiB journal.
pub const LARGE_WRITE: usize = 300_000;

impl WriteKind {
    /// Offset and length for a file of `size` bytes.
    pub fn range(self, size: u64) -> (u64, usize) {
        match self {
            WriteKind::AppendSub => (size, 100),
            WriteKind::AppendBlock => (size.div_ceil(4096) * 4096, 4096),
            WriteKind::AppendMulti => (size + 300, 9000),
            WriteKind::OverwriteSub => (1000, 200),
            WriteKind::OverwriteMulti => (1500, 6000),
            WriteKind::AppendLarge => (size + 300, LARGE_WRITE),
        }
    }
}

/// One operation of a workload. Paths are relative to the root, `""` is the root itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Create an empty regular file.
    Create(&'static str),
    /// Write tagged bytes.
    Write(&'static str, WriteKind),
    /// Truncate to half the size.
    TruncateShrink(&'static str),
    /// Truncate to the size + 6000.
    TruncateGrow(&'static str),
    /// Allocate 8192 bytes at the end of file; grow the size unless `keep_size`.
    Fallocate(&'static str, bool),
    /// Zero the file's first [`ZERO_LEN`] bytes, keeping its size (`zero_range`): its whole
    /// blocks there become unwritten extents, still allocated.
    ZeroRange(&'static str),
    /// Punch a hole over the file's first [`ZERO_LEN`] bytes (`punch_hole`): its whole blocks
    /// there are freed, the size stays.
    PunchHole(&'static str),
    /// Rename source to target (replacing a file target).
    Rename(&'static str, &'static str),
    /// Hard link: existing file, new name.
    Link(&'static str, &'static str),
    /// Remove a file name.
    Unlink(&'static str),
    /// Create a directory.
    Mkdir(&'static str),
    /// Remove an empty directory.
    Rmdir(&'static str),
    /// Create a symbolic link (path, target).
    Symlink(&'static str, &'static str),
    /// Set an extended attribute with a value of this length.
    SetXattr(&'static str, &'static str, usize),
    /// Remove an extended attribute.
    RemoveXattr(&'static str, &'static str),
    /// fsync of a file.
    Fsync(&'static str),
    /// fdatasync of a file.
    Fdatasync(&'static str),
    /// fsync of a directory.
    FsyncDir(&'static str),
    /// sync of the whole file system.
    Sync,
    /// Give a directory its own journaling mode (mixed-mode runs).
    SetMode(&'static str, DataMode),
}

impl Op {
    /// Whether the op is a persistence point.
    pub fn is_persistence(&self) -> bool {
        matches!(
            self,
            Op::Fsync(_) | Op::Fdatasync(_) | Op::FsyncDir(_) | Op::Sync
        )
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Create(p) => write!(f, "create {p}"),
            Op::Write(p, k) => write!(f, "write {p} {k:?}"),
            Op::TruncateShrink(p) => write!(f, "truncate-shrink {p}"),
            Op::TruncateGrow(p) => write!(f, "truncate-grow {p}"),
            Op::ZeroRange(p) => write!(f, "zero-range {p}"),
            Op::PunchHole(p) => write!(f, "punch-hole {p}"),
            Op::Fallocate(p, keep) => {
                write!(f, "fallocate {p}{}", if *keep { " keep-size" } else { "" })
            }
            Op::Rename(a, b) => write!(f, "rename {a} {b}"),
            Op::Link(a, b) => write!(f, "link {a} {b}"),
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
            Op::Symlink(p, t) => write!(f, "symlink {p} -> {t}"),
            Op::SetXattr(p, n, l) => write!(f, "setxattr {p} {n} ({l} bytes)"),
            Op::RemoveXattr(p, n) => write!(f, "removexattr {p} {n}"),
            Op::Fsync(p) => write!(f, "fsync {p}"),
            Op::Fdatasync(p) => write!(f, "fdatasync {p}"),
            Op::FsyncDir(p) => write!(f, "fsync-dir {}", if p.is_empty() { "/" } else { p }),
            Op::Sync => write!(f, "sync"),
            Op::SetMode(p, m) => write!(f, "set-mode {p} {}", m.name()),
        }
    }
}

/// A logical file: one inode for the life of the workload (hard links share it).
pub type Fid = u64;

/// What a name points at, in the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MEntry {
    /// A regular file.
    File(Fid),
    /// A directory.
    Dir,
    /// A symbolic link with this target.
    Symlink(Vec<u8>),
}

/// A regular file in the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MFile {
    /// Expected content (its length is the size).
    pub data: Vec<u8>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Names pointing at it.
    pub nlink: u32,
    /// Its inode number in the recorded run.
    pub ino: Ino,
}

/// A unit of promise: what one persistence point can promise about one object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// What a path names.
    Entry(String),
    /// The names in a directory.
    Listing(String),
    /// Size and bytes of a file.
    Content(Fid),
    /// Extended attributes of a file.
    Xattrs(Fid),
}

/// The promised value of a [`Key`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The path names this (`None`: nothing).
    Entry(Option<ExpectEntry>),
    /// Exactly these names (without "." and "..").
    Listing(BTreeSet<Vec<u8>>),
    /// The file with this inode holds these bytes.
    Content(Ino, Vec<u8>),
    /// The file with this inode has these extended attributes.
    Xattrs(Ino, BTreeMap<Vec<u8>, Vec<u8>>),
}

/// What a promised path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpectEntry {
    /// The regular file with this inode.
    File(Ino),
    /// A directory.
    Dir,
    /// A symbolic link to this target.
    Symlink(Vec<u8>),
}

/// The model of the namespace and the files.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Path → what it names (the root is `""`).
    pub tree: BTreeMap<String, MEntry>,
    /// Live and dead files.
    pub files: BTreeMap<Fid, MFile>,
    next_fid: Fid,
    /// The mount's default journaling mode (of directories without their own).
    pub default_mode: DataMode,
    /// Directories with a mode of their own now.
    pub own_modes: BTreeMap<String, DataMode>,
    /// Every mode each directory path obeyed at any time of the run.
    pub dir_modes_seen: BTreeMap<String, BTreeSet<DataModeKey>>,
    /// Every directory each file was linked in at any time of the run.
    pub fid_dirs: BTreeMap<Fid, BTreeSet<String>>,
    /// The directory each file obeys (the one that linked it last); `None` once that
    /// directory was removed (the file keeps the mode it had, which the model does not track).
    pub fid_governor: BTreeMap<Fid, Option<String>>,
    /// Every inode each directory path had during the run.
    pub dir_inos: BTreeMap<String, BTreeSet<Ino>>,
    /// Every symbolic link made during the run, by the directory path it was made in.
    pub symlink_inos: BTreeMap<String, BTreeSet<Ino>>,
}

/// A [`DataMode`] as an ordered key (its name).
pub type DataModeKey = String;

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn name_of(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, n)| n)
}

impl Model {
    fn new(default_mode: DataMode) -> Model {
        let mut m = Model {
            default_mode,
            ..Model::default()
        };
        m.tree.insert(String::new(), MEntry::Dir);
        m.tree.insert("lost+found".into(), MEntry::Dir);
        m.next_fid = 1;
        m.note_dir_mode("");
        m.dir_inos
            .entry(String::new())
            .or_default()
            .insert(ROOT_INO);
        m
    }

    /// The mode directory `dir` obeys now.
    pub fn dir_mode(&self, dir: &str) -> DataMode {
        self.own_modes
            .get(dir)
            .copied()
            .unwrap_or(self.default_mode)
    }

    /// Notes the mode `dir` obeys now among the modes it has obeyed.
    fn note_dir_mode(&mut self, dir: &str) {
        let m = self.dir_mode(dir).name().into_owned();
        self.dir_modes_seen.entry(dir.into()).or_default().insert(m);
    }

    /// Notes that file `fid` is linked in directory `dir`.
    fn note_link(&mut self, fid: Fid, dir: &str) {
        self.fid_dirs.entry(fid).or_default().insert(dir.into());
        self.fid_governor.insert(fid, Some(dir.into()));
    }

    /// The mode file `fid` obeys now, if the model knows it.
    pub fn mode_now(&self, fid: Fid) -> Option<DataMode> {
        let dir = self.fid_governor.get(&fid)?.as_deref()?;
        Some(self.dir_mode(dir))
    }

    /// Every mode file `fid` may have obeyed during the run: those of every directory it was
    /// linked in, at any time (a superset of the modes its writes were made under).
    pub fn modes_of_file(&self, fid: Fid) -> Vec<DataMode> {
        let dirs = self.fid_dirs.get(&fid);
        let mut out: Vec<DataMode> = dirs
            .into_iter()
            .flatten()
            .flat_map(|d| self.modes_of_dir(d))
            .collect();
        if out.is_empty() {
            out.push(self.default_mode);
        }
        out
    }

    /// Every mode directory `dir` obeyed during the run.
    pub fn modes_of_dir(&self, dir: &str) -> Vec<DataMode> {
        match self.dir_modes_seen.get(dir) {
            Some(names) => names.iter().filter_map(|n| DataMode::parse(n)).collect(),
            None => vec![self.default_mode],
        }
    }

    /// Folds in what another stream of the same run saw (writer threads).
    fn merge_modes(&mut self, other: &Model) {
        for (d, seen) in &other.dir_modes_seen {
            self.dir_modes_seen
                .entry(d.clone())
                .or_default()
                .extend(seen.iter().cloned());
        }
        for (f, dirs) in &other.fid_dirs {
            self.fid_dirs
                .entry(*f)
                .or_default()
                .extend(dirs.iter().cloned());
        }
        for (f, g) in &other.fid_governor {
            self.fid_governor.entry(*f).or_insert_with(|| g.clone());
        }
        for (d, inos) in &other.dir_inos {
            self.dir_inos.entry(d.clone()).or_default().extend(inos);
        }
        for (d, inos) in &other.symlink_inos {
            self.symlink_inos.entry(d.clone()).or_default().extend(inos);
        }
    }

    fn is_dir(&self, p: &str) -> bool {
        matches!(self.tree.get(p), Some(MEntry::Dir))
    }

    fn file(&self, p: &str) -> Option<Fid> {
        match self.tree.get(p) {
            Some(MEntry::File(f)) => Some(*f),
            _ => None,
        }
    }

    fn children(&self, dir: &str) -> BTreeSet<Vec<u8>> {
        self.tree
            .keys()
            .filter(|k| !k.is_empty() && parent_of(k) == dir && k.as_str() != dir)
            .map(|k| name_of(k).as_bytes().to_vec())
            .collect()
    }

    /// Whether `op` can run on the model's state (the generators keep only such ops).
    pub fn valid(&self, op: &Op) -> bool {
        let absent_in_dir = |p: &str| !self.tree.contains_key(p) && self.is_dir(parent_of(p));
        match op {
            Op::Create(p) | Op::Mkdir(p) | Op::Symlink(p, _) => absent_in_dir(p),
            Op::Write(p, _)
            | Op::TruncateShrink(p)
            | Op::TruncateGrow(p)
            | Op::Fallocate(p, _)
            | Op::ZeroRange(p)
            | Op::PunchHole(p)
            | Op::SetXattr(p, _, _)
            | Op::Fsync(p)
            | Op::Fdatasync(p)
            | Op::Unlink(p) => self.file(p).is_some(),
            Op::RemoveXattr(p, n) => self
                .file(p)
                .is_some_and(|f| self.files[&f].xattrs.contains_key(n.as_bytes())),
            Op::Rename(a, b) => {
                self.file(a).is_some()
                    && self.is_dir(parent_of(b))
                    && (!self.tree.contains_key(*b) || self.file(b).is_some())
                    && self.file(a) != self.file(b)
            }
            Op::Link(a, b) => self.file(a).is_some() && absent_in_dir(b),
            Op::Rmdir(p) => self.is_dir(p) && !p.is_empty() && self.children(p).is_empty(),
            Op::FsyncDir(p) | Op::SetMode(p, _) => self.is_dir(p),
            Op::Sync => true,
        }
    }

    /// Drops a name of file `f`; returns the keys touched when its last name goes.
    fn drop_link(&mut self, f: Fid, touched: &mut Vec<Key>) {
        let mf = self
            .files
            .get_mut(&f)
            .expect("OK to unwrap: names point at known files");
        mf.nlink -= 1;
        if mf.nlink == 0 {
            touched.push(Key::Content(f));
            touched.push(Key::Xattrs(f));
        }
    }

    /// The promises a persistence op makes on the current state.
    fn promises(&self, op: &Op) -> Vec<(Key, Expect)> {
        let mut out = Vec::new();
        let file_promise = |out: &mut Vec<(Key, Expect)>, f: Fid, with_attrs: bool| {
            let mf = &self.files[&f];
            out.push((Key::Content(f), Expect::Content(mf.ino, mf.data.clone())));
            if with_attrs {
                out.push((Key::Xattrs(f), Expect::Xattrs(mf.ino, mf.xattrs.clone())));
            }
        };
        match op {
            Op::Fsync(p) => {
                let f = self.file(p).expect("OK to unwrap: validated");
                out.push((Key::Entry((*p).into()), self.entry_expect(p)));
                file_promise(&mut out, f, true);
            }
            Op::Fdatasync(p) => {
                let f = self.file(p).expect("OK to unwrap: validated");
                file_promise(&mut out, f, false);
            }
            Op::FsyncDir(d) => {
                out.push((Key::Listing((*d).into()), Expect::Listing(self.children(d))));
                for name in self.children(d) {
                    let p = if d.is_empty() {
                        String::from_utf8_lossy(&name).into_owned()
                    } else {
                        format!("{d}/{}", String::from_utf8_lossy(&name))
                    };
                    out.push((Key::Entry(p.clone()), self.entry_expect(&p)));
                }
            }
            Op::Sync => {
                for (p, e) in &self.tree {
                    out.push((Key::Entry(p.clone()), self.entry_expect(p)));
                    if matches!(e, MEntry::Dir) {
                        out.push((Key::Listing(p.clone()), Expect::Listing(self.children(p))));
                    }
                }
                for (f, mf) in &self.files {
                    if mf.nlink > 0 {
                        file_promise(&mut out, *f, true);
                    }
                }
            }
            _ => {}
        }
        out
    }

    fn entry_expect(&self, p: &str) -> Expect {
        Expect::Entry(self.tree.get(p).map(|e| match e {
            MEntry::File(f) => ExpectEntry::File(self.files[f].ino),
            MEntry::Dir => ExpectEntry::Dir,
            MEntry::Symlink(t) => ExpectEntry::Symlink(t.clone()),
        }))
    }
}

/// A data write as the oracle needs it.
#[derive(Clone, Debug)]
pub struct DataWrite {
    /// Unique id (the tag of its bytes).
    pub id: u64,
    /// The file.
    pub fid: Fid,
    /// File offset.
    pub offset: u64,
    /// Length.
    pub len: usize,
    /// Log position of the op start (the write may be on disk only in crash states after it).
    pub pos: usize,
    /// The mode the file obeyed when the write ran, when the model knows it for sure (not
    /// while another thread switches modes, nor for a file whose directory was removed).
    pub mode: Option<DataMode>,
    /// The byte ranges of the operations it goes as in a data-journaling mode
    /// (`Fs::journaled_write_part`): one for most writes; a large write goes in parts, each
    /// of which is all or nothing, not the whole.
    pub parts: Vec<std::ops::Range<u64>>,
}

/// One event of a recorded workload, with its log position.
#[derive(Clone, Debug)]
pub enum Event {
    /// Op `index` started at log position `pos`; it may change these keys.
    OpStart {
        /// Index in the workload's op list.
        index: usize,
        /// Log position.
        pos: usize,
        /// Keys it touches.
        touched: Vec<Key>,
    },
    /// A persistence point returned at `pos` and promised these values.
    Promise {
        /// Log position.
        pos: usize,
        /// What it promised.
        promises: Vec<(Key, Expect)>,
    },
    /// A truncate of `fid` to `size` started at `pos` (for the atomicity check).
    Truncate {
        /// Log position.
        pos: usize,
        /// The file.
        fid: Fid,
        /// New size.
        size: u64,
    },
    /// Bytes `[0, len)` of `fid` were zeroed (zero-range, punch-hole) by an op that started at
    /// `pos` (for the atomicity check).
    Zeroed {
        /// Log position.
        pos: usize,
        /// The file.
        fid: Fid,
        /// Bytes zeroed from offset 0.
        len: u64,
    },
}

/// A workload: its name and its operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// `family#index`.
    pub name: String,
    /// The operations, in order (single-threaded workloads).
    pub ops: Vec<Op>,
    /// The operations of each writer thread, run at once (the `threads` family); empty for
    /// single-threaded workloads.
    pub threads: Vec<Vec<Op>>,
}

impl Workload {
    /// The operations, one string each (a thread's prefixed with its number).
    pub fn describe_ops(&self) -> Vec<String> {
        let mut out: Vec<String> = self.ops.iter().map(ToString::to_string).collect();
        for (t, ops) in self.threads.iter().enumerate() {
            out.push(format!(
                "thread {t}: {}",
                ops.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out
    }
}

/// What running a workload on a recording device produced.
pub struct Recorded {
    /// The log and its base.
    pub recording: Recording,
    /// Op starts, promises, truncates, in log order.
    pub events: Vec<Event>,
    /// Every data write, the setup's included (those at position 0).
    pub writes: Vec<DataWrite>,
    /// Inode number of every file the workload knew.
    pub fid_ino: BTreeMap<Fid, Ino>,
    /// Failed operations, as `index: error` (should be empty).
    pub failures: Vec<String>,
    /// The model after the last op.
    pub model: Model,
    /// Log position where the ops began (after mount and any prelude).
    pub first_op_pos: usize,
    /// The journal wrapped (a journal block was written below the one written before it)
    /// after the ops began.
    pub journal_wrapped: bool,
}

const SETUP_FOO_WRITES: [(u64, u64, usize); 2] = [(1, 0, 8192), (2, 8192, 100)];

/// Runs the setup (directory `A`, file `foo` with data and `user.a`) on a fresh image through
/// the library, unmounts cleanly and returns the image and the model.
pub fn setup_base(
    image: Vec<u8>,
    opts: &MountOptions,
    dir_mode: Option<DataMode>,
) -> tidefs::Result<(Vec<u8>, Model, Vec<DataWrite>)> {
    let dev = Arc::new(tidefs::dev::MemDev::from_bytes(image));
    let fs = Fs::open_devices(dev.clone(), None, opts)?;
    let mut model = Model::new(opts.data_mode);
    let mut writes = Vec::new();
    let a_ino = fs.mkdir(ROOT_INO, b"A", 0o755, Creds::ROOT)?.ino;
    model.tree.insert("A".into(), MEntry::Dir);
    model.dir_inos.entry("A".into()).or_default().insert(a_ino);
    if let Some(m) = dir_mode {
        fs.set_journal_mode(a_ino, Some(m))?;
        model.own_modes.insert("A".into(), m);
    }
    model.note_dir_mode("A");
    let a = fs.create(ROOT_INO, b"foo", 0o100_644, 0, Creds::ROOT)?;
    let fid = model.next_fid;
    model.next_fid += 1;
    let mut mf = MFile {
        nlink: 1,
        ino: a.ino,
        ..MFile::default()
    };
    for (id, off, len) in SETUP_FOO_WRITES {
        let data = pattern(id, off, len);
        fs.write(a.ino, off, &data)?;
        let end = off as usize + len;
        if mf.data.len() < end {
            mf.data.resize(end, 0);
        }
        mf.data[off as usize..end].copy_from_slice(&data);
        writes.push(DataWrite {
            id,
            fid,
            offset: off,
            len,
            pos: 0,
            mode: Some(model.dir_mode("")),
            parts: journaled_parts(&fs, off, len),
        });
    }
    let v = pattern(3, 0, 24);
    fs.setxattr(a.ino, b"user.a", &v, XattrSetMode::Any)?;
    mf.xattrs.insert(b"user.a".to_vec(), v);
    model.files.insert(fid, mf);
    model.tree.insert("foo".into(), MEntry::File(fid));
    model.note_link(fid, "");
    fs.unmount()?;
    drop(fs);
    Ok((dev.to_bytes(), model, writes))
}

fn resolve(fs: &Fs, path: &str) -> tidefs::Result<Ino> {
    let mut ino = ROOT_INO;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup(ino, c.as_bytes())?.ino;
    }
    Ok(ino)
}

fn split(path: &str) -> (&str, &[u8]) {
    (parent_of(path), name_of(path).as_bytes())
}

/// The devices of a recorded run: the recording device, and what the file system writes to
/// (the recording device itself, or a canary in front of it).
pub struct RecordDevices {
    /// Logs every write and flush.
    pub recording: Arc<RecordingDevice>,
    /// The device the file system is opened on.
    pub fs_dev: Arc<dyn BlockDevice>,
    /// The journal's place on the device (for the prelude and the wrap check).
    pub journal: JournalArea,
}

/// One stream of operations (the whole workload, or one writer thread) and what it recorded.
struct Stream {
    model: Model,
    events: Vec<Event>,
    writes: Vec<DataWrite>,
    failures: Vec<String>,
    next_write_id: u64,
    /// No other stream switches modes, so this one's model knows each write's mode.
    modes_certain: bool,
}

/// Marker ids: unique per recorded run, shared by its threads.
struct Markers<'a> {
    dev: &'a RecordingDevice,
    next: AtomicU64,
}

impl Markers<'_> {
    fn mark(&self) -> usize {
        self.dev.mark(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// Runs `ops` in order on `fs`, recording op starts and promises; `label` prefixes failures.
fn run_stream(fs: &Fs, markers: &Markers<'_>, stream: &mut Stream, ops: &[Op], label: &str) {
    for (index, op) in ops.iter().enumerate() {
        let pos = markers.mark();
        let mut touched = Vec::new();
        let r = run_op(
            fs,
            &mut stream.model,
            op,
            pos,
            &mut touched,
            &mut stream.writes,
            &mut stream.events,
            &mut stream.next_write_id,
            stream.modes_certain,
        );
        stream.events.push(Event::OpStart {
            index,
            pos,
            touched,
        });
        match r {
            Ok(()) => {
                if op.is_persistence() {
                    let pos = markers.mark();
                    stream.events.push(Event::Promise {
                        pos,
                        promises: stream.model.promises(op),
                    });
                }
            }
            Err(e) => stream
                .failures
                .push(format!("{label}op {index} ({op}): {e}")),
        }
    }
}

/// Journal blocks a prelude leaves free before the end of the log, at the least: the
/// threads' first few commits then wrap, even where each commit is one compact commit of a
/// sector or two (wasteless, selective), eight or more to a block. Larger commits get a
/// margin of [`PRELUDE_MARGIN_COMMITS`] of them.
const PRELUDE_MARGIN_BLOCKS: u64 = 1;
/// Commits of the prelude's size that the margin holds on top of [`PRELUDE_MARGIN_BLOCKS`].
const PRELUDE_MARGIN_COMMITS: u64 = 8;
/// The prelude's file.
const PRELUDE_FILE: &str = "wrap";

/// The logical journal block of the last write into the journal's log area after log index
/// `from` (the journal superblock, logical block 0, is not part of the log).
fn last_log_block(log: &[LogEntry], from: usize, journal: &JournalArea) -> Option<u64> {
    log[from..].iter().rev().find_map(|e| match e {
        LogEntry::Write { offset, data } => journal
            .logical_block(*offset + data.len() as u64 - 1)
            .filter(|&b| b > 0),
        _ => None,
    })
}

/// Whether a journal write after log index `from` went to a lower log block than the one
/// written before it: the circular log wrapped.
pub fn journal_wrapped(log: &[LogEntry], from: usize, journal: &JournalArea) -> bool {
    let mut last = None;
    for e in &log[from..] {
        if let LogEntry::Write { offset, .. } = e {
            if let Some(b) = journal.logical_block(*offset).filter(|&b| b > 0) {
                if last.is_some_and(|l| b < l) {
                    return true;
                }
                last = Some(b);
            }
        }
    }
    false
}

/// Appends and fsyncs [`PRELUDE_FILE`] until the journal's head is near the end of the log.
fn prelude(fs: &Fs, devs: &RecordDevices, stream: &mut Stream) -> tidefs::Result<()> {
    let log_blocks = devs.journal.len_blocks();
    if log_blocks <= PRELUDE_MARGIN_BLOCKS {
        return Ok(());
    }
    let markers = Markers {
        dev: &devs.recording,
        next: AtomicU64::new(1 << 40),
    };
    run_stream(
        fs,
        &markers,
        stream,
        &[Op::Create(PRELUDE_FILE)],
        "prelude ",
    );
    // Each round writes at least two journal blocks, or one sector of a block as a compact
    // commit (wasteless, selective): eight to a 4 KiB block with 512-byte sectors. The bound
    // only stops a runaway loop.
    let mut last_head = None;
    for _ in 0..log_blocks * 8 {
        let start = devs.recording.position();
        run_stream(
            fs,
            &markers,
            stream,
            &[
                Op::Write(PRELUDE_FILE, WriteKind::AppendSub),
                Op::Fsync(PRELUDE_FILE),
            ],
            "prelude ",
        );
        let log = devs.recording.log_since(start);
        let head = last_log_block(&log, 0, &devs.journal).unwrap_or(0);
        // Blocks this round's commit took (0 while compact commits share a block).
        let round = last_head.map_or(0, |l: u64| head.saturating_sub(l));
        last_head = Some(head);
        let margin = PRELUDE_MARGIN_BLOCKS + PRELUDE_MARGIN_COMMITS * round;
        if head + margin >= log_blocks || !stream.failures.is_empty() {
            break;
        }
    }
    // Its events stay: every crash state lies after it, so its promises are all in force.
    Ok(())
}

/// Runs `wl` on `devs` (whose content `model` describes), then unmounts cleanly; everything
/// the oracle needs comes back.
pub fn record(
    devs: &RecordDevices,
    model: &Model,
    setup_writes: &[DataWrite],
    wl: &Workload,
    opts: &MountOptions,
) -> tidefs::Result<Recorded> {
    let dev = &devs.recording;
    let fs = Fs::open_devices(devs.fs_dev.clone(), None, opts)?;
    let mut main = Stream {
        model: model.clone(),
        events: Vec::new(),
        writes: setup_writes.to_vec(),
        failures: Vec::new(),
        next_write_id: 1000,
        modes_certain: true,
    };
    if !wl.threads.is_empty() {
        prelude(&fs, devs, &mut main)?;
    }
    let first_op_pos = dev.position();
    let markers = Markers {
        dev,
        next: AtomicU64::new(1),
    };
    run_stream(&fs, &markers, &mut main, &wl.ops, "");
    let switching = wl
        .threads
        .iter()
        .flatten()
        .any(|op| matches!(op, Op::SetMode(..)));
    // Writer threads: each on its own copy of the model, with its own fids and write ids.
    let streams: Vec<Stream> = std::thread::scope(|s| {
        let handles: Vec<_> = wl
            .threads
            .iter()
            .enumerate()
            .map(|(t, ops)| {
                let t1 = t as u64 + 1;
                let mut stream = Stream {
                    model: Model {
                        next_fid: main.model.next_fid + t1 * 1000,
                        ..main.model.clone()
                    },
                    events: Vec::new(),
                    writes: Vec::new(),
                    failures: Vec::new(),
                    next_write_id: main.next_write_id + t1 * 1_000_000,
                    modes_certain: !switching,
                };
                let (fs, markers) = (&fs, &markers);
                s.spawn(move || {
                    run_stream(fs, markers, &mut stream, ops, &format!("thread {t} "));
                    stream
                })
            })
            .collect();
        handles
            .into_iter()
            // OK to unwrap: a writer thread only panics on a bug, which the test must show.
            .map(|h| h.join().expect("OK to unwrap: writer thread panicked"))
            .collect()
    });
    let mut model = main.model;
    let mut events = main.events;
    let mut writes = main.writes;
    let mut failures = main.failures;
    for st in streams {
        model.merge_modes(&st.model);
        for (fid, f) in st.model.files {
            model.files.entry(fid).or_insert(f);
        }
        for (p, e) in st.model.tree {
            model.tree.entry(p).or_insert(e);
        }
        model.next_fid = model.next_fid.max(st.model.next_fid);
        events.extend(st.events);
        writes.extend(st.writes);
        failures.extend(st.failures);
    }
    // Every operation reserved the journal space it used before its first change, and none
    // failed after it (which would have put the file system in its error state).
    let stats = fs.stats();
    if stats.journal_credit_overruns > 0
        || stats.late_journal_reservations > 0
        || stats.failed_after_change > 0
    {
        failures.push(format!(
            "{} operation(s) changed more journal blocks than they reserved, {} reservation(s) \
             came after an operation's first change, {} operation(s) failed after it",
            stats.journal_credit_overruns,
            stats.late_journal_reservations,
            stats.failed_after_change
        ));
    }
    fs.unmount()?;
    drop(fs);
    // A clean unmount promises everything, as a sync does.
    let pos = markers.mark();
    events.push(Event::Promise {
        pos,
        promises: model.promises(&Op::Sync),
    });
    // Keep events sorted by position: truncates were pushed while their op ran, and each writer
    // thread's events were appended as one block.
    events.sort_by_key(|e| match e {
        Event::OpStart { pos, .. }
        | Event::Promise { pos, .. }
        | Event::Truncate { pos, .. }
        | Event::Zeroed { pos, .. } => *pos,
    });
    let fid_ino = model.files.iter().map(|(f, m)| (*f, m.ino)).collect();
    let recording = dev.recording();
    let journal_wrapped = journal_wrapped(&recording.log, first_op_pos, &devs.journal);
    Ok(Recorded {
        recording,
        events,
        writes,
        fid_ino,
        failures,
        model,
        first_op_pos,
        journal_wrapped,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_op(
    fs: &Fs,
    model: &mut Model,
    op: &Op,
    pos: usize,
    touched: &mut Vec<Key>,
    writes: &mut Vec<DataWrite>,
    events: &mut Vec<Event>,
    next_write_id: &mut u64,
    modes_certain: bool,
) -> tidefs::Result<()> {
    let c = Creds::ROOT;
    match op {
        Op::Create(p) => {
            let (d, n) = split(p);
            let a = fs.create(resolve(fs, d)?, n, 0o100_644, 0, c)?;
            let fid = model.next_fid;
            model.next_fid += 1;
            model.files.insert(
                fid,
                MFile {
                    nlink: 1,
                    ino: a.ino,
                    ..MFile::default()
                },
            );
            model.tree.insert((*p).into(), MEntry::File(fid));
            model.note_link(fid, d);
            touched.extend([
                Key::Entry((*p).into()),
                Key::Listing(d.into()),
                Key::Content(fid),
                Key::Xattrs(fid),
            ]);
        }
        Op::Write(p, kind) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            let ino = resolve(fs, p)?;
            let mode = if modes_certain {
                model.mode_now(fid)
            } else {
                None
            };
            let mf = model.files.get_mut(&fid).expect("OK to unwrap: live file");
            let (off, len) = kind.range(mf.data.len() as u64);
            let id = *next_write_id;
            *next_write_id += 1;
            touched.push(Key::Content(fid));
            writes.push(DataWrite {
                id,
                fid,
                offset: off,
                len,
                pos,
                mode,
                parts: journaled_parts(fs, off, len),
            });
            let data = pattern(id, off, len);
            let n = fs.write(ino, off, &data)?;
            if n as usize != len {
                return Err(tidefs::FsError::NoSpace);
            }
            let end = off as usize + len;
            if mf.data.len() < end {
                mf.data.resize(end, 0);
            }
            mf.data[off as usize..end].copy_from_slice(&data);
        }
        Op::TruncateShrink(p) | Op::TruncateGrow(p) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            let ino = resolve(fs, p)?;
            let mf = model.files.get_mut(&fid).expect("OK to unwrap: live file");
            let size = if matches!(op, Op::TruncateShrink(_)) {
                mf.data.len() as u64 / 2
            } else {
                mf.data.len() as u64 + 6000
            };
            touched.push(Key::Content(fid));
            events.push(Event::Truncate { pos, fid, size });
            fs.setattr(
                ino,
                &SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                },
            )?;
            mf.data.resize(size as usize, 0);
        }
        Op::Fallocate(p, keep) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            let ino = resolve(fs, p)?;
            let mf = model.files.get_mut(&fid).expect("OK to unwrap: live file");
            let off = mf.data.len() as u64;
            touched.push(Key::Content(fid));
            fs.fallocate(ino, off, 8192, *keep)?;
            if !keep {
                mf.data.resize(off as usize + 8192, 0);
            }
        }
        Op::ZeroRange(p) | Op::PunchHole(p) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            let ino = resolve(fs, p)?;
            let mf = model.files.get_mut(&fid).expect("OK to unwrap: live file");
            touched.push(Key::Content(fid));
            events.push(Event::Zeroed {
                pos,
                fid,
                len: ZERO_LEN,
            });
            if matches!(op, Op::ZeroRange(_)) {
                fs.zero_range(ino, 0, ZERO_LEN, true)?;
            } else {
                fs.punch_hole(ino, 0, ZERO_LEN)?;
            }
            zero_front(&mut mf.data);
        }
        Op::Rename(a, b) => {
            let (da, na) = split(a);
            let (db, nb) = split(b);
            let (pa, pb) = (resolve(fs, da)?, resolve(fs, db)?);
            touched.extend([
                Key::Entry((*a).into()),
                Key::Entry((*b).into()),
                Key::Listing(da.into()),
                Key::Listing(db.into()),
            ]);
            if let Some(old) = model.file(b) {
                model.drop_link(old, touched);
            }
            fs.rename(pa, na, pb, nb, RenameFlags::default())?;
            let e = model.tree.remove(*a).expect("OK to unwrap: validated");
            if let MEntry::File(fid) = e {
                model.note_link(fid, db);
            }
            model.tree.insert((*b).into(), e);
        }
        Op::Link(a, b) => {
            let fid = model.file(a).ok_or(tidefs::FsError::NotFound)?;
            let (db, nb) = split(b);
            touched.extend([Key::Entry((*b).into()), Key::Listing(db.into())]);
            fs.link(resolve(fs, a)?, resolve(fs, db)?, nb)?;
            model
                .files
                .get_mut(&fid)
                .expect("OK to unwrap: live file")
                .nlink += 1;
            model.tree.insert((*b).into(), MEntry::File(fid));
            model.note_link(fid, db);
        }
        Op::Unlink(p) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            let (d, n) = split(p);
            touched.extend([Key::Entry((*p).into()), Key::Listing(d.into())]);
            model.drop_link(fid, touched);
            fs.unlink(resolve(fs, d)?, n)?;
            model.tree.remove(*p);
        }
        Op::Mkdir(p) | Op::Rmdir(p) => {
            let (d, n) = split(p);
            touched.extend([
                Key::Entry((*p).into()),
                Key::Listing(d.into()),
                Key::Listing((*p).into()),
            ]);
            let parent = resolve(fs, d)?;
            if matches!(op, Op::Mkdir(_)) {
                let ino = fs.mkdir(parent, n, 0o755, c)?.ino;
                model.tree.insert((*p).into(), MEntry::Dir);
                model.dir_inos.entry((*p).into()).or_default().insert(ino);
                // A new directory copies its parent's own mode.
                match model.own_modes.get(d).copied() {
                    Some(m) => model.own_modes.insert((*p).into(), m),
                    None => model.own_modes.remove(*p),
                };
                model.note_dir_mode(p);
            } else {
                fs.rmdir(parent, n)?;
                model.tree.remove(*p);
                for g in model.fid_governor.values_mut() {
                    if g.as_deref() == Some(*p) {
                        *g = None;
                    }
                }
            }
        }
        Op::Symlink(p, t) => {
            let (d, n) = split(p);
            touched.extend([Key::Entry((*p).into()), Key::Listing(d.into())]);
            let link = fs.symlink(resolve(fs, d)?, n, t.as_bytes(), c)?;
            model
                .tree
                .insert((*p).into(), MEntry::Symlink(t.as_bytes().to_vec()));
            model
                .symlink_inos
                .entry(d.into())
                .or_default()
                .insert(link.ino);
        }
        Op::SetXattr(p, name, len) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            touched.push(Key::Xattrs(fid));
            let v = pattern(*next_write_id, 0, *len);
            *next_write_id += 1;
            fs.setxattr(resolve(fs, p)?, name.as_bytes(), &v, XattrSetMode::Any)?;
            model
                .files
                .get_mut(&fid)
                .expect("OK to unwrap: live file")
                .xattrs
                .insert(name.as_bytes().to_vec(), v);
        }
        Op::RemoveXattr(p, name) => {
            let fid = model.file(p).ok_or(tidefs::FsError::NotFound)?;
            touched.push(Key::Xattrs(fid));
            fs.removexattr(resolve(fs, p)?, name.as_bytes())?;
            model
                .files
                .get_mut(&fid)
                .expect("OK to unwrap: live file")
                .xattrs
                .remove(name.as_bytes());
        }
        Op::Fsync(p) | Op::Fdatasync(p) => {
            fs.fsync(resolve(fs, p)?, matches!(op, Op::Fdatasync(_)))?;
        }
        Op::FsyncDir(p) => fs.fsync(resolve(fs, p)?, false)?,
        Op::Sync => fs.sync()?,
        Op::SetMode(p, m) => {
            fs.set_journal_mode(resolve(fs, p)?, Some(*m))?;
            model.own_modes.insert((*p).into(), *m);
            model.note_dir_mode(p);
        }
    }
    Ok(())
}

/// Bytes [`Op::ZeroRange`] zeroes at the front of a file: one block of the harness's images.
pub const ZERO_LEN: u64 = 4096;

/// Zeroes the front of a model file's content as [`Op::ZeroRange`] does (its size stays).
fn zero_front(data: &mut [u8]) {
    let end = data.len().min(ZERO_LEN as usize);
    data[..end].fill(0);
}

// ---------------------------------------------------------------------------------------------
// Families.

/// The files of the file set.
const FILES: [&str; 2] = ["foo", "A/bar"];

/// Every modifying op of the ACE family, in a fixed order.
pub fn ace_ops() -> Vec<Op> {
    let mut v = Vec::new();
    for f in FILES {
        v.push(Op::Create(f));
        for k in [
            WriteKind::AppendSub,
            WriteKind::AppendBlock,
            WriteKind::AppendMulti,
            WriteKind::OverwriteSub,
            WriteKind::OverwriteMulti,
        ] {
            v.push(Op::Write(f, k));
        }
        v.push(Op::TruncateShrink(f));
        v.push(Op::TruncateGrow(f));
        v.push(Op::Fallocate(f, false));
        v.push(Op::Fallocate(f, true));
        v.push(Op::ZeroRange(f));
        v.push(Op::PunchHole(f));
        v.push(Op::SetXattr(f, "user.a", 40));
        v.push(Op::SetXattr(f, "user.b", 600));
        v.push(Op::RemoveXattr(f, "user.a"));
        v.push(Op::Unlink(f));
    }
    v.extend([
        Op::Rename("foo", "A/bar"),
        Op::Rename("A/bar", "foo"),
        Op::Link("foo", "A/bar"),
        Op::Link("A/bar", "foo"),
        Op::Symlink("A/bar", "foo"),
        Op::Symlink("foo", "A/bar"),
        Op::Mkdir("A"),
        Op::Rmdir("A"),
    ]);
    v
}

/// The persistence points that may follow `op` (ACE: persist what the op touched, or all).
pub fn persistence_after(op: &Op) -> Vec<Op> {
    let mut v = Vec::new();
    let file = |p: &'static str, v: &mut Vec<Op>| {
        v.push(Op::Fsync(p));
        v.push(Op::Fdatasync(p));
        v.push(Op::FsyncDir(parent_of(p)));
    };
    match op {
        Op::Create(p)
        | Op::Write(p, _)
        | Op::TruncateShrink(p)
        | Op::TruncateGrow(p)
        | Op::Fallocate(p, _)
        | Op::ZeroRange(p)
        | Op::PunchHole(p)
        | Op::SetXattr(p, _, _)
        | Op::RemoveXattr(p, _) => file(p, &mut v),
        Op::Unlink(p) | Op::Symlink(p, _) | Op::Mkdir(p) | Op::Rmdir(p) => {
            v.push(Op::FsyncDir(parent_of(p)))
        }
        Op::Rename(a, b) | Op::Link(a, b) => {
            v.push(Op::Fsync(b));
            v.push(Op::FsyncDir(parent_of(a)));
            if parent_of(a) != parent_of(b) {
                v.push(Op::FsyncDir(parent_of(b)));
            }
        }
        _ => {}
    }
    v.push(Op::Sync);
    v
}

/// Sequences that once broke a promise, run first by the ACE family: too long, or too
/// particular, for its enumeration to reach.
pub fn regression_workloads() -> Vec<Vec<Op>> {
    // A small write (journaled by `selective`), made durable; its block zeroed into an
    // unwritten extent (or, second, freed by a punch-hole and allocated again); a large write
    // over that block (sent home), made durable. Write-back once took the unwritten block for
    // one never logged: the first write's journaled copy, not revoked, came back over the
    // zeros by replay.
    [Op::ZeroRange("foo"), Op::PunchHole("foo")]
        .into_iter()
        .map(|clear| {
            vec![
                Op::Write("foo", WriteKind::OverwriteSub),
                Op::Fsync("foo"),
                clear,
                Op::Fsync("foo"),
                Op::Write("foo", WriteKind::OverwriteMulti),
                Op::Fsync("foo"),
            ]
        })
        .collect()
}

/// Every (op, persistence) step of the ACE family.
pub fn ace_steps() -> Vec<(Op, Op)> {
    ace_ops()
        .into_iter()
        .flat_map(|op| {
            persistence_after(&op)
                .into_iter()
                .map(move |p| (op.clone(), p))
        })
        .collect()
}

/// Whether a sequence of ops is valid from `model` (each op valid when it runs).
pub fn valid_sequence(model: &Model, ops: &[Op]) -> bool {
    let mut m = model.clone();
    for op in ops {
        if !m.valid(op) {
            return false;
        }
        m.apply_dry(op);
    }
    true
}

impl Model {
    /// Applies `op` to the namespace only (for validity checks of generated sequences).
    fn apply_dry(&mut self, op: &Op) {
        let mut t = Vec::new();
        match op {
            Op::Create(p) => {
                let fid = self.next_fid;
                self.next_fid += 1;
                self.files.insert(
                    fid,
                    MFile {
                        nlink: 1,
                        ..MFile::default()
                    },
                );
                self.tree.insert((*p).into(), MEntry::File(fid));
            }
            Op::Write(p, k) => {
                if let Some(f) = self.file(p) {
                    let mf = self.files.get_mut(&f).expect("OK to unwrap: live file");
                    let (off, len) = k.range(mf.data.len() as u64);
                    let end = off as usize + len;
                    if mf.data.len() < end {
                        mf.data.resize(end, 1);
                    }
                }
            }
            Op::TruncateShrink(p) | Op::TruncateGrow(p) => {
                if let Some(f) = self.file(p) {
                    let mf = self.files.get_mut(&f).expect("OK to unwrap: live file");
                    let n = if matches!(op, Op::TruncateShrink(_)) {
                        mf.data.len() / 2
                    } else {
                        mf.data.len() + 6000
                    };
                    mf.data.resize(n, 0);
                }
            }
            Op::Fallocate(p, false) => {
                if let Some(f) = self.file(p) {
                    let mf = self.files.get_mut(&f).expect("OK to unwrap: live file");
                    let n = mf.data.len() + 8192;
                    mf.data.resize(n, 0);
                }
            }
            Op::ZeroRange(p) | Op::PunchHole(p) => {
                if let Some(f) = self.file(p) {
                    zero_front(&mut self.files.get_mut(&f).expect("live file").data);
                }
            }
            Op::Rename(a, b) => {
                if let Some(old) = self.file(b) {
                    self.drop_link(old, &mut t);
                }
                if let Some(e) = self.tree.remove(*a) {
                    self.tree.insert((*b).into(), e);
                }
            }
            Op::Link(a, b) => {
                if let Some(f) = self.file(a) {
                    self.files
                        .get_mut(&f)
                        .expect("OK to unwrap: live file")
                        .nlink += 1;
                    self.tree.insert((*b).into(), MEntry::File(f));
                }
            }
            Op::Unlink(p) => {
                if let Some(f) = self.file(p) {
                    self.drop_link(f, &mut t);
                }
                self.tree.remove(*p);
            }
            Op::Mkdir(p) => {
                self.tree.insert((*p).into(), MEntry::Dir);
            }
            Op::Rmdir(p) => {
                self.tree.remove(*p);
            }
            Op::Symlink(p, target) => {
                self.tree
                    .insert((*p).into(), MEntry::Symlink(target.as_bytes().to_vec()));
            }
            Op::SetXattr(p, n, _) => {
                if let Some(f) = self.file(p) {
                    self.files
                        .get_mut(&f)
                        .expect("OK to unwrap: live file")
                        .xattrs
                        .insert(n.as_bytes().to_vec(), Vec::new());
                }
            }
            Op::RemoveXattr(p, n) => {
                if let Some(f) = self.file(p) {
                    self.files
                        .get_mut(&f)
                        .expect("OK to unwrap: live file")
                        .xattrs
                        .remove(n.as_bytes());
                }
            }
            _ => {}
        }
    }
}

/// Which workload family to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// ACE-style bounded sequences.
    Ace,
    /// Longer random sequences.
    Random,
    /// `ace` and `random`, interleaved.
    All,
    /// Several writer threads at once, each appending and fsyncing its own file, after a
    /// prelude that brings the journal's head near the end of the log.
    Threads,
}

impl Family {
    /// Parses `ace`, `random` or `all`.
    pub fn parse(s: &str) -> Option<Family> {
        match s {
            "ace" => Some(Family::Ace),
            "random" => Some(Family::Random),
            "all" => Some(Family::All),
            "threads" => Some(Family::Threads),
            _ => None,
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ace => "ace",
            Family::Random => "random",
            Family::All => "all",
            Family::Threads => "threads",
        }
    }
}

/// The deterministic, endless-or-finite stream of workloads of a family.
pub struct Workloads {
    family: Family,
    seed: u64,
    base: Model,
    steps: Vec<(Op, Op)>,
    /// ACE: the valid one-step sequences, then every two-step sequence in a seeded order.
    ace_index: usize,
    ace_pairs: Vec<u32>,
    ace_len3: bool,
    random_index: u64,
    threads_index: u64,
    ace_count: u64,
    turn: u64,
    /// Mixed-mode runs: the modes `SetMode` ops switch directory `A` between (empty: none).
    switch_modes: Vec<DataMode>,
}

impl Workloads {
    /// The workloads of `family` from the setup state `base`; `ace_len3` adds sampled
    /// three-step ACE sequences after the two-step ones.
    pub fn new(family: Family, seed: u64, base: &Model, ace_len3: bool) -> Workloads {
        Workloads::with_switches(family, seed, base, ace_len3, Vec::new())
    }

    /// As [`Workloads::new`]; with `switch_modes` not empty, the `random` family also switches
    /// directory `A` between those modes now and then, and the `threads` family runs a fifth
    /// thread that switches it while the writers write.
    pub fn with_switches(
        family: Family,
        seed: u64,
        base: &Model,
        ace_len3: bool,
        switch_modes: Vec<DataMode>,
    ) -> Workloads {
        let steps = ace_steps();
        let n = steps.len();
        let mut ace_pairs: Vec<u32> = (0..(n * n) as u32).collect();
        Rng::derive(seed, 1, 0).shuffle(&mut ace_pairs);
        Workloads {
            family,
            seed,
            base: base.clone(),
            steps,
            ace_index: 0,
            ace_pairs,
            ace_len3,
            random_index: 0,
            threads_index: 0,
            ace_count: 0,
            turn: 0,
            switch_modes,
        }
    }

    fn next_ace(&mut self) -> Option<Workload> {
        let n = self.steps.len();
        let regressions = regression_workloads();
        loop {
            let index = self.ace_index;
            self.ace_index += 1;
            if let Some(ops) = regressions.get(index) {
                if valid_sequence(&self.base, ops) {
                    self.ace_count += 1;
                    return Some(Workload {
                        name: format!("regression#{index}"),
                        ops: ops.clone(),
                        threads: Vec::new(),
                    });
                }
                continue;
            }
            let i = index - regressions.len();
            let ops: Vec<Op> = if i < n {
                let (a, b) = &self.steps[i];
                vec![a.clone(), b.clone()]
            } else if i < n + n * n {
                let k = self.ace_pairs[i - n] as usize;
                let (a, b) = &self.steps[k / n];
                let (c, d) = &self.steps[k % n];
                vec![a.clone(), b.clone(), c.clone(), d.clone()]
            } else if self.ace_len3 {
                let mut r = Rng::derive(self.seed, 3, i as u64);
                let mut ops = Vec::new();
                for _ in 0..3 {
                    let (a, b) = &self.steps[r.below(n as u64) as usize];
                    ops.push(a.clone());
                    ops.push(b.clone());
                }
                ops
            } else {
                return None;
            };
            if valid_sequence(&self.base, &ops) {
                self.ace_count += 1;
                return Some(Workload {
                    name: format!("ace#{}", i),
                    ops,
                    threads: Vec::new(),
                });
            }
        }
    }

    fn next_random(&mut self) -> Workload {
        let i = self.random_index;
        self.random_index += 1;
        let mut r = Rng::derive(self.seed, 2, i);
        let mut ops_all = ace_ops();
        ops_all.extend(FILES.map(|f| Op::Write(f, WriteKind::AppendLarge)));
        let len = 4 + r.below(9) as usize;
        let mut m = self.base.clone();
        let mut ops = Vec::new();
        let mut tries = 0;
        while ops.len() < len && tries < 1000 {
            tries += 1;
            let op = ops_all[r.below(ops_all.len() as u64) as usize].clone();
            if !m.valid(&op) {
                continue;
            }
            m.apply_dry(&op);
            let pers = persistence_after(&op);
            ops.push(op);
            if !self.switch_modes.is_empty()
                && r.chance(1, 3)
                && m.valid(&Op::SetMode("A", DataMode::Ordered))
            {
                let k = r.below(self.switch_modes.len() as u64) as usize;
                ops.push(Op::SetMode("A", self.switch_modes[k]));
            }
            if r.chance(3, 5) {
                let p = pers[r.below(pers.len() as u64) as usize].clone();
                if m.valid(&p) {
                    ops.push(p);
                }
            }
        }
        if !ops.last().is_some_and(Op::is_persistence) {
            ops.push(Op::FsyncDir(""));
        }
        Workload {
            name: format!("random#{i}"),
            ops,
            threads: Vec::new(),
        }
    }

    fn next_threads(&mut self) -> Workload {
        let i = self.threads_index;
        self.threads_index += 1;
        let mut r = Rng::derive(self.seed, 4, i);
        let mut threads: Vec<Vec<Op>> = THREAD_FILES
            .iter()
            .map(|&f| {
                let mut ops = vec![Op::Create(f), Op::Fsync(f)];
                for _ in 0..WRITES_PER_THREAD {
                    let kinds = [
                        WriteKind::AppendSub,
                        WriteKind::AppendBlock,
                        WriteKind::AppendMulti,
                    ];
                    ops.push(Op::Write(f, kinds[r.below(3) as usize]));
                    ops.push(if r.chance(1, 2) {
                        Op::Fsync(f)
                    } else {
                        Op::Fdatasync(f)
                    });
                }
                ops
            })
            .collect();
        if !self.switch_modes.is_empty() {
            let n = self.switch_modes.len() as u64;
            let start = r.below(n);
            threads.push(
                (0..SWITCHES_PER_THREADS_WORKLOAD)
                    .map(|k| Op::SetMode("A", self.switch_modes[((start + k) % n) as usize]))
                    .collect(),
            );
        }
        Workload {
            name: format!("threads#{i}"),
            ops: Vec::new(),
            threads,
        }
    }
}

/// The files of the writer threads of the `threads` family, one per thread.
const THREAD_FILES: [&str; 4] = ["t0", "t1", "A/t2", "A/t3"];
/// Write + persistence pairs per writer thread.
const WRITES_PER_THREAD: usize = 5;
/// Mode switches of directory `A` by the switcher thread of mixed-mode `threads` workloads.
const SWITCHES_PER_THREADS_WORKLOAD: u64 = 6;

impl Iterator for Workloads {
    type Item = Workload;

    fn next(&mut self) -> Option<Workload> {
        match self.family {
            Family::Ace => self.next_ace(),
            Family::Random => Some(self.next_random()),
            Family::Threads => Some(self.next_threads()),
            Family::All => {
                self.turn += 1;
                if self.turn % 2 == 1 {
                    if let Some(w) = self.next_ace() {
                        return Some(w);
                    }
                }
                Some(self.next_random())
            }
        }
    }
}
