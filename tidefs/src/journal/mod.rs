//! The jbd2 journal: commit, checkpoint and recovery (docs/DESIGN.md §2.4, §4; docs/FORMAT.md §4).
//!
//! INTERFACE CONTRACT (the fs layer codes against exactly this; keep signatures stable):
//!
//! - The fs layer owns the running transaction (which metadata blocks are dirty, which are
//!   revoked). To commit it, it snapshots the dirty blocks and hands a [`CommitRequest`] to
//!   [`Journal::commit`], which writes descriptor blocks + block copies + revoke blocks + a commit
//!   block (checksum v3, 64-bit tags), with the ordering points described there, and returns only
//!   when the transaction is durable.
//! - Committed blocks are remembered until checkpointed; [`Journal::pending`] returns the newest
//!   committed copy of a block not yet written home, so the cache above can reload it.
//! - [`Journal::checkpoint`] writes the newest committed copy of each block home, flushes the home
//!   device, then advances the log tail in the journal superblock.
//! - Recovery ([`Journal::recover`]) scans, collects revokes, replays, and leaves the journal
//!   empty.
//! - [`CommitLog`] is the same contract as a trait, which `Journal` implements, so that other
//!   commit logs (NVM in-place commit, discreet mode) can stand in for it.
//!
//! - Byte-range records and compact commits (docs/DESIGN.md §4.5a, docs/FORMAT.md §5): a
//!   [`RangeUpdate`] is logged as byte ranges when they are small, and a small transaction as
//!   one compact commit of a few sectors; the journal superblock then carries tidefs's incompat
//!   bit until the log holds no such record.
//!
//! Files: `log.rs` the log (geometry, commit, checkpoint, the background checkpointer),
//! `records.rs` the records of a transaction and their serialisation (block layout, compact
//! commit), `scan.rs` the log scan shared by recovery and dump, `recovery.rs` replay,
//! `dump.rs` the read-only listing of `tidefs dump-journal`, `commit_log.rs` the trait.

mod commit_log;
mod dump;
#[cfg(test)]
mod ext_tests;
mod log;
mod records;
mod recovery;
mod scan;
#[cfg(test)]
mod tests;

pub use commit_log::{CommitLog, LogSpace};
pub use dump::{
    dump, dump_image, dump_journal_device, image_journal, open_image, DumpLayout, DumpTag, DumpTxn,
    JournalDump, TagKind,
};
pub use log::tid_geq;
pub use log::{
    CommitRequest, Journal, JournalCore, JournalExtent, JournalGeometry, JournalOptions,
    JournalStats, RangeUpdate, Tid,
};
pub use recovery::RecoveryReport;
