//! What the running transaction holds besides its dirty blocks, one named part of `Meta`:
//! the blocks it freed that need revoke records, and what the journaling modes of its
//! operations decide about how it is logged (docs/DESIGN.md §3.1, §3.2). A commit takes it
//! whole and the next transaction starts empty.

use std::collections::{BTreeSet, HashSet};

/// See the module comment.
#[derive(Default)]
pub(crate) struct TxChanges {
    /// Blocks freed by the running transaction that need revoke records.
    pub revoked: BTreeSet<u64>,
    /// Blocks the running transaction changed for an operation that is not lightweight:
    /// they are journaled even when a lightweight operation changed them too.
    pub strict_blocks: HashSet<u64>,
    /// Inodes whose bytes an operation that is not lightweight changed in the running
    /// transaction: in an inode-table block that lightweight operations changed too, only
    /// their slots are journaled (`Meta::sort_for_lightweight`).
    pub strict_inodes: HashSet<u32>,
    /// A lightweight operation changed blocks in the running transaction.
    pub light: bool,
    /// An operation of the running transaction acted for an inode whose mode logs byte ranges:
    /// its changed metadata blocks may be logged as ranges.
    pub ranges: bool,
}
