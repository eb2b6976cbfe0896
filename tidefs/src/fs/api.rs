//! Types of the public file-system API: attributes, credentials, options, directory entries and
//! statistics. The FUSE adapter and library users see only these and [`super::Fs`].

use std::path::PathBuf;
use std::time::Duration;

/// An inode number as ext4 numbers them (the root directory is [`ROOT_INO`]).
pub type Ino = u64;

/// The root directory's inode number in ext4.
pub const ROOT_INO: Ino = 2;

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// Whole seconds (may be negative).
    pub sec: i64,
    /// Nanoseconds, below 1 000 000 000.
    pub nsec: u32,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        }
    }
}

/// What kind of object an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Size in bytes.
    pub size: u64,
    /// Space used, in 512-byte units.
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last data change.
    pub mtime: Timestamp,
    /// Last status change.
    pub ctime: Timestamp,
    /// Creation.
    pub crtime: Timestamp,
    /// Kind of object.
    pub kind: FileKind,
    /// Permission bits, including set-uid, set-gid and sticky (mask 0o7777).
    pub perm: u16,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number for character and block devices (Linux `makedev` encoding).
    pub rdev: u32,
    /// Preferred I/O size (the block size).
    pub blksize: u32,
    /// Inode generation.
    pub generation: u32,
}

/// Who is asking: used for ownership of new inodes and for set-gid inheritance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Creds {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

impl Creds {
    /// The superuser.
    pub const ROOT: Creds = Creds { uid: 0, gid: 0 };
}

/// A time to set: a given instant, or the current time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// This instant.
    At(Timestamp),
    /// The current time.
    Now,
}

/// Attribute changes for [`super::Fs::setattr`]; `None` leaves a field as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (0o7777 mask).
    pub mode: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New change time.
    pub ctime: Option<Timestamp>,
}

/// Flags of [`super::Fs::rename`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists (RENAME_NOREPLACE).
    pub noreplace: bool,
    /// Swap source and target atomically; both must exist (RENAME_EXCHANGE).
    pub exchange: bool,
}

/// How [`super::Fs::setxattr`] treats an existing or missing attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSetMode {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `Exists` if present (XATTR_CREATE).
    Create,
    /// Fail with `NoAttribute` if missing (XATTR_REPLACE).
    Replace,
}

/// One directory entry returned by [`super::Fs::readdir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode of the entry.
    pub ino: Ino,
    /// Kind of the entry.
    pub kind: FileKind,
    /// Name (no NUL, no '/').
    pub name: Vec<u8>,
    /// Cookie to pass to `readdir` to continue after this entry. Cookies stay valid while the
    /// directory changes.
    pub next_offset: u64,
}

/// File-system totals, as `statfs` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Free blocks available to unprivileged users.
    pub blocks_available: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub files_free: u64,
    /// Block size.
    pub block_size: u32,
    /// Longest name.
    pub name_max: u32,
}

/// How file data is journaled (docs/DESIGN.md §3). A per-inode property inside the file system;
/// chosen for the whole mount with `-o data=MODE` for now. More modes may come, so matches
/// outside this crate need a wildcard arm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataMode {
    /// Only the allocation bitmaps (and group descriptors, superblock) are journaled; inodes,
    /// directories and extent blocks are written home in place at commit. Promise: the
    /// allocation structures survive a crash (state 1).
    Lightweight,
    /// All metadata journaled, data written home with no ordering. Promise: + the file's inode
    /// (state 2).
    Writeback,
    /// All metadata journaled, data home before the metadata that points to it commits.
    /// Promise: + no garbage or stale blocks in files (state 3).
    #[default]
    Ordered,
    /// Metadata and whole data blocks journaled, home at checkpoint. Promise: + every write
    /// all-or-nothing (state 4), up to a quarter of the journal's largest transaction (a
    /// larger write is journaled in parts, as ext4 journals a page per handle).
    Journal,
    /// As `Journal`, but a block of which only some bytes changed since its last commit
    /// (file data or metadata) is logged as those byte ranges, packed with the ranges of other
    /// blocks, instead of whole. Promise: state 4 (as `Journal`, up to a quarter of the
    /// journal's largest transaction).
    Wasteless,
    /// Per update sequence of a data block (its writes between two of its checkpoints): when
    /// the sequence's first write is shorter than `threshold` bytes the block is journaled as
    /// in `Wasteless`, otherwise written home as in `Ordered`. Metadata as in `Wasteless`.
    /// Promise: state 4 for small writes, state 3 for large ones.
    Selective {
        /// Writes shorter than this many bytes start a journaled sequence.
        threshold: u32,
    },
}

/// The journaling mode an inode obeys ([`super::Fs::journal_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalingMode {
    pub mode: DataMode,
    /// The mode is the inode's own (a directory's own mode, a file's explicit mode), not
    /// inherited from its directory or the mount's default.
    pub own: bool,
}

/// The threshold of `selective` when none is given.
pub const DEFAULT_SELECTIVE_THRESHOLD: u32 = 4096;

impl DataMode {
    /// Every mode, weakest promise first (`selective` with its default threshold).
    pub const ALL: [DataMode; 6] = [
        DataMode::Lightweight,
        DataMode::Writeback,
        DataMode::Ordered,
        DataMode::Journal,
        DataMode::Wasteless,
        DataMode::Selective {
            threshold: DEFAULT_SELECTIVE_THRESHOLD,
        },
    ];

    /// The name used by `-o data=` and in reports: `selective:T` when the threshold is not
    /// the default. [`DataMode::parse`] reads it back.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        match self {
            DataMode::Lightweight => "lightweight".into(),
            DataMode::Writeback => "writeback".into(),
            DataMode::Ordered => "ordered".into(),
            DataMode::Journal => "journal".into(),
            DataMode::Wasteless => "wasteless".into(),
            DataMode::Selective { threshold } if threshold == DEFAULT_SELECTIVE_THRESHOLD => {
                "selective".into()
            }
            DataMode::Selective { threshold } => format!("selective:{threshold}").into(),
        }
    }

    /// Parses a mode name: one of [`DataMode::ALL`]'s names, or `selective:T` where T is a
    /// byte count from 1 to 1 GiB (suffixes K, M, G of 1024 allowed: `selective:8K`).
    pub fn parse(name: &str) -> Option<DataMode> {
        if let Some(t) = name.strip_prefix("selective:") {
            let threshold = parse_threshold(t)?;
            return Some(DataMode::Selective { threshold });
        }
        DataMode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The accepted names, for error messages.
    pub const NAMES_HELP: &'static str =
        "lightweight, writeback, ordered, journal, wasteless, selective or selective:BYTES \
         (BYTES from 1 to 1G, K/M/G suffixes allowed)";

    /// Whether blocks of this mode's transactions may be logged as byte ranges (wasteless and
    /// selective). The other modes write only standard jbd2 records (which the kernel and
    /// e2fsck can replay when the commits are fenced, `MountOptions::fenced_commits`).
    pub fn logs_byte_ranges(self) -> bool {
        matches!(self, DataMode::Wasteless | DataMode::Selective { .. })
    }

    /// Whether a data block whose update sequence began with a write of `first_write` bytes
    /// is journaled (rather than written home).
    pub fn journals_data(self, first_write: usize) -> bool {
        match self {
            DataMode::Journal | DataMode::Wasteless => true,
            DataMode::Selective { threshold } => first_write < threshold as usize,
            _ => false,
        }
    }

    /// Whether file data this mode writes home must be durable before the commit record of
    /// the metadata that points to it (every mode but `writeback` and `lightweight`).
    pub fn orders_data(self) -> bool {
        !matches!(self, DataMode::Lightweight | DataMode::Writeback)
    }

    /// Whether this mode may journal file data at all.
    pub fn may_journal_data(self) -> bool {
        self.journals_data(0)
    }

    /// Of two modes, the one whose promise is stronger (`self` when they are equal): the mode
    /// of a page written under both before its write-back.
    pub fn stricter(self, other: DataMode) -> DataMode {
        let rank = |m: DataMode| match m {
            DataMode::Lightweight => 0,
            DataMode::Writeback => 1,
            DataMode::Ordered => 2,
            DataMode::Selective { .. } => 3,
            DataMode::Journal | DataMode::Wasteless => 4,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

impl std::fmt::Display for DataMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A selective threshold: 1 byte to 1 GiB, with an optional K/M/G suffix (powers of 1024).
fn parse_threshold(text: &str) -> Option<u32> {
    let (digits, unit) = match text.char_indices().last()? {
        (i, c) if c.eq_ignore_ascii_case(&'k') => (&text[..i], 1u64 << 10),
        (i, c) if c.eq_ignore_ascii_case(&'m') => (&text[..i], 1u64 << 20),
        (i, c) if c.eq_ignore_ascii_case(&'g') => (&text[..i], 1u64 << 30),
        _ => (text, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v = digits.parse::<u64>().ok()?.checked_mul(unit)?;
    if v == 0 || v > 1 << 30 {
        return None;
    }
    u32::try_from(v).ok()
}

#[cfg(test)]
mod mode_tests {
    use super::*;

    #[test]
    fn mode_names_round_trip_and_bad_ones_are_refused() {
        for m in DataMode::ALL {
            assert_eq!(DataMode::parse(&m.name()), Some(m));
        }
        let s = |t| Some(DataMode::Selective { threshold: t });
        assert_eq!(DataMode::parse("selective"), s(4096));
        assert_eq!(DataMode::parse("selective:8K"), s(8192));
        assert_eq!(DataMode::parse("selective:100"), s(100));
        assert_eq!(DataMode::parse("selective:1G"), s(1 << 30));
        assert_eq!(s(8192).unwrap().name(), "selective:8192");
        for bad in [
            "selective:",
            "selective:0",
            "selective:2G",
            "selective:-1",
            "selective:4KB",
            "selective:k",
            "fast",
            "Journal",
            "",
        ] {
            assert_eq!(DataMode::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn selective_journals_only_sequences_that_start_small() {
        let m = DataMode::Selective { threshold: 1000 };
        assert!(m.journals_data(999));
        assert!(!m.journals_data(1000));
        assert!(DataMode::Wasteless.journals_data(1 << 20));
        assert!(!DataMode::Ordered.journals_data(1));
        assert!(m.logs_byte_ranges() && DataMode::Wasteless.logs_byte_ranges());
        assert!(!DataMode::Journal.logs_byte_ranges());
        assert_eq!(DataMode::Ordered.stricter(m), m);
        assert_eq!(m.stricter(DataMode::Lightweight), m);
        assert_eq!(
            DataMode::Journal.stricter(DataMode::Wasteless),
            DataMode::Journal
        );
    }
}

/// Options of [`super::Fs::open`].
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Refuse every change (EROFS).
    pub read_only: bool,
    /// How often the running transaction commits on its own.
    pub commit_interval: Duration,
    /// External journal device, when the image's journal is not internal.
    pub journal_device: Option<PathBuf>,
    /// Memory bound of the caches, in bytes: half for metadata blocks, half for file pages
    /// (dirty pages are written back when they fill half of theirs).
    pub cache_size_bytes: usize,
    /// How file data is journaled.
    pub data_mode: DataMode,
    /// Make every write to the devices follow from the operations alone, not from thread
    /// timing: never start a checkpoint on the timer or at half a log (the log is still
    /// checkpointed when it is full, and by a lightweight commit whose blocks it holds, both
    /// set by the commits alone), and commit a transaction grown large in the operation that
    /// found it so rather than on the background thread. For the recovery benchmark, which
    /// needs a log full of transactions at the crash, and the crash harness, whose recordings
    /// must not depend on thread timing. (The commit timer still runs: set
    /// `commit_interval` long for none.)
    pub deterministic_writes: bool,
    /// Pages over holes a commit allocates blocks for in each hold of the metadata lock
    /// before it closes its transaction (docs/DESIGN.md §2.5, "Delayed allocation and
    /// write-back"); a commit with no more than this allocates them all in its close, which
    /// holds the lock throughout. Smaller pieces let other operations in more often.
    pub allocate_piece_pages: usize,
    /// What a flush does on the image and journal files (`-o barrier=`); `None` is unsafe.
    pub barrier: crate::dev::Barrier,
    /// Flush every transaction's body before its commit block (`-o fenced_commits`), so the
    /// journal of a crashed image is always one the kernel and e2fsck can replay. Off by
    /// default: a commit whose data needs no ordering then costs one flush instead of two
    /// (docs/DESIGN.md §4.2).
    pub fenced_commits: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            commit_interval: Duration::from_secs(5),
            journal_device: None,
            cache_size_bytes: 256 << 20,
            data_mode: DataMode::Ordered,
            deterministic_writes: false,
            allocate_piece_pages: 1024,
            barrier: crate::dev::Barrier::Flush,
            fenced_commits: false,
        }
    }
}

/// Live counters of a mounted file system (`tidefs stats`).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stats {
    /// Bytes written to the journal.
    pub journal_bytes: u64,
    /// Bytes written to home locations (file data, checkpointed metadata).
    pub home_bytes: u64,
    /// Transactions committed.
    pub commits: u64,
    /// fsync/fdatasync calls served.
    pub fsyncs: u64,
    /// fsyncs served per commit.
    pub fsyncs_per_commit: f64,
    /// Average metadata blocks per committed transaction.
    pub avg_transaction_blocks: f64,
    /// Median fsync latency, microseconds.
    pub fsync_p50_us: u64,
    /// 99th percentile fsync latency, microseconds.
    pub fsync_p99_us: u64,
    /// Checkpoints run.
    pub checkpoints: u64,
    /// Bytes of the committed metadata blocks that had really changed: what byte-range
    /// records would log instead of whole blocks.
    pub changed_metadata_bytes: u64,
    /// Byte-range records logged (`wasteless` and `selective`): blocks logged as the bytes that
    /// changed, or as their non-zero bytes, rather than whole.
    pub range_records: u64,
    /// Bytes those records carried (without their headers).
    pub range_bytes: u64,
    /// Transactions written as one compact commit of a few sectors.
    pub compact_commits: u64,
    /// Cache flushes the devices received (file-system and journal device), counting the one
    /// each durable write (a commit record) ends with.
    pub flushes: u64,
    /// Times an operation stopped, before its first change, to read a block from the device
    /// without the metadata lock, then ran again (docs/DESIGN.md §2.5).
    #[cfg_attr(feature = "serde", serde(default))]
    pub deferred_reads: u64,
    /// Device reads operations made after they had changed cached metadata: such an
    /// operation never stops (its change is never taken back), so it reads under the
    /// metadata lock; what fetching blocks before the first change avoids (docs/DESIGN.md
    /// §4.1).
    #[cfg_attr(feature = "serde", serde(default))]
    pub reads_after_change: u64,
    /// Device reads operations made under the metadata lock: those past the rounds of reads
    /// without it one operation may take (docs/DESIGN.md §2.5).
    #[cfg_attr(feature = "serde", serde(default))]
    pub reads_under_lock: u64,
    /// Directory name indexes built without the metadata lock, while other operations ran,
    /// and taken (the index used, or the damage the build found returned): an operation that
    /// needs the index of a directory of 16 blocks or more (and up to a quarter of the
    /// metadata cache) before its first change has it built so (docs/DESIGN.md §2.5); not
    /// counted, an index whose directory changed meanwhile, built again under the lock.
    #[cfg_attr(feature = "serde", serde(default))]
    pub dir_indexes_built_unlocked: u64,
    /// Operations that failed after changing cached metadata, each of which put the file
    /// system in its error state (docs/DESIGN.md §4.1, §5): an I/O error or corruption found
    /// half-way, or a failure found only half-way (space, a check), which is a bug: every
    /// such failure is found before the first change.
    #[cfg_attr(feature = "serde", serde(default))]
    pub failed_after_change: u64,
    /// Operations that stopped because the running transaction had no room in the journal for
    /// what they reserve, and ran again after a commit (docs/DESIGN.md §4.1).
    #[cfg_attr(feature = "serde", serde(default))]
    pub journal_room_waits: u64,
    /// Reservations of journal space made after an operation's first change (an estimate
    /// made too late; kept whether it found room or not, since a change is never taken
    /// back for room): none expected.
    #[cfg_attr(feature = "serde", serde(default))]
    pub late_journal_reservations: u64,
    /// Operations that changed more journal blocks than they reserved: an estimate of
    /// `fs/log_credits.rs` is wrong (none expected).
    #[cfg_attr(feature = "serde", serde(default))]
    pub journal_credit_overruns: u64,
    /// Operations (and commits closing their transaction) that took the file system's
    /// metadata lock; the others ran without it (docs/DESIGN.md §2.5).
    #[cfg_attr(feature = "serde", serde(default))]
    pub metadata_locked: u64,
    /// The longest hold of the metadata lock since mount, in microseconds: the longest any
    /// operation that needs the lock may have waited for the one before it
    /// (`fs/timed_lock.rs`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub metadata_hold_max_us: u64,
    /// Holds of the metadata lock of a millisecond or more since mount.
    #[cfg_attr(feature = "serde", serde(default))]
    pub metadata_holds_over_ms: u64,
}
