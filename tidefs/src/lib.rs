//! tidefs: a user-space journaling file system that keeps its data in the ext4 on-disk format and
//! its journal in the jbd2 format.
//!
//! Layers, each knowing only the one below it (see `docs/DESIGN.md` §2):
//! - [`fs`]: inodes, directories, files, allocation; every metadata change inside a transaction;
//! - [`journal`]: jbd2 transactions, commit, checkpoint, recovery;
//! - [`cache`]: the metadata buffer cache;
//! - [`dev`]: block devices (image files, memory);
//! - [`format`]: pure parse/serialize of the ext4 and jbd2 on-disk structures.
//!
//! The crate is also the embeddable library: [`fs::Fs`] opens an image and offers POSIX-like
//! operations without FUSE.

pub mod cache;
pub mod dev;
pub mod error;
pub mod format;
pub mod fs;
pub mod journal;
/// The test suite's skip rule, shared by the crate's unit tests and every integration test
/// crate (not part of the file system's API).
#[doc(hidden)]
pub mod test_support;

pub use error::{Corrupt, FsError, Result};
