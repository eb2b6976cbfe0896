//! Error types shared by every layer. The FUSE adapter is the single place that turns them into
//! errno values.

use std::fmt;

/// Result of every fallible tidefs operation.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// Why an operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum FsError {
    /// No such file or directory (ENOENT).
    NotFound,
    /// The name exists already (EEXIST).
    Exists,
    /// A path component is not a directory (ENOTDIR).
    NotDir,
    /// The target is a directory (EISDIR).
    IsDir,
    /// The directory is not empty (ENOTEMPTY).
    NotEmpty,
    /// No free block or inode left (ENOSPC).
    NoSpace,
    /// The name is longer than 255 bytes (ENAMETOOLONG).
    NameTooLong,
    /// Too many hard links (EMLINK).
    TooManyLinks,
    /// The file would grow past the largest size the format allows (EFBIG).
    FileTooBig,
    /// A bad argument (EINVAL).
    Invalid(&'static str),
    /// The operation is not permitted (EPERM).
    NotPermitted,
    /// Permission denied (EACCES).
    AccessDenied,
    /// The extended attribute does not exist (ENODATA).
    NoAttribute,
    /// The value does not fit in the buffer or the format (ERANGE).
    Range,
    /// The file system is mounted read-only, or was latched read-only after an I/O error (EROFS).
    ReadOnly,
    /// The operation is not supported (EOPNOTSUPP).
    NotSupported,
    /// An I/O error from the device.
    Io(std::io::Error),
    /// Bytes on disk that are not valid ext4 or jbd2.
    Corrupt(Corrupt),
    /// Valid ext4 or jbd2 that uses a feature tidefs does not implement.
    Incompatible(String),
    /// The image or journal device is in use: claimed by another tidefs mount, mkfs or fsck,
    /// or mounted by the kernel (EBUSY). The text starts with the path and names the holder
    /// where it is known.
    Busy(String),
}

/// A description of corrupt on-disk data: what structure, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// What is wrong, in words a user can act on (block numbers included where known).
    pub what: String,
    /// The inode whose structure is corrupt, when the damage belongs to one inode (its
    /// extent tree, directory blocks, size...). Shown before `what`.
    pub ino: Option<u32>,
}

impl Corrupt {
    /// Builds a corruption error from a description.
    pub fn new(what: impl Into<String>) -> Self {
        Corrupt {
            what: what.into(),
            ino: None,
        }
    }

    /// The same error, attributed to inode `ino` (the first attribution wins).
    pub fn in_inode(mut self, ino: u32) -> Self {
        self.ino.get_or_insert(ino);
        self
    }
}

impl FsError {
    /// Shorthand for `FsError::Corrupt(Corrupt::new(what))`.
    pub fn corrupt(what: impl Into<String>) -> Self {
        FsError::Corrupt(Corrupt::new(what))
    }

    /// Shorthand for a corruption of inode `ino`'s own structures.
    pub fn corrupt_inode(ino: u32, what: impl Into<String>) -> Self {
        FsError::Corrupt(Corrupt::new(what).in_inode(ino))
    }
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ino {
            Some(ino) => write!(f, "inode {ino}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsError::NotFound => f.write_str("no such file or directory"),
            FsError::Exists => f.write_str("file exists"),
            FsError::NotDir => f.write_str("not a directory"),
            FsError::IsDir => f.write_str("is a directory"),
            FsError::NotEmpty => f.write_str("directory not empty"),
            FsError::NoSpace => f.write_str("no space left on device"),
            FsError::NameTooLong => f.write_str("file name too long"),
            FsError::TooManyLinks => f.write_str("too many links"),
            FsError::FileTooBig => f.write_str("file too large"),
            FsError::Invalid(why) => write!(f, "invalid argument: {why}"),
            FsError::NotPermitted => f.write_str("operation not permitted"),
            FsError::AccessDenied => f.write_str("permission denied"),
            FsError::NoAttribute => f.write_str("no such extended attribute"),
            FsError::Range => f.write_str("value out of range"),
            FsError::ReadOnly => f.write_str("read-only file system"),
            FsError::NotSupported => f.write_str("operation not supported"),
            FsError::Io(e) => write!(f, "I/O error: {e}"),
            FsError::Corrupt(c) => write!(f, "corrupt file system: {c}"),
            FsError::Incompatible(what) => write!(f, "unsupported feature: {what}"),
            FsError::Busy(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for FsError {}

impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> Self {
        FsError::Io(e)
    }
}

impl From<Corrupt> for FsError {
    fn from(c: Corrupt) -> Self {
        FsError::Corrupt(c)
    }
}
