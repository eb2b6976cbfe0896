//! What the running transaction holds besides its dirty blocks, one named part of `Meta`:
//! the blocks it freed that need revoke records, and what the journaling modes of its
//! operations decide about how it is logged (docs/DESIGN.md §3.1, §3.2). A commit takes it
//! whole and the next transaction starts empty. Also how a closing transaction's dirty blocks
//! become journal records: whole, or as the byte ranges that changed.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use crate::cache::DirtyBlock;
use crate::journal::RangeUpdate;

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

/// A block logged whole: its home number and content.
type WholeBlock = (u64, Arc<[u8]>);

/// Whether a dirty block goes to the journal as the byte ranges that changed (when the
/// transaction may use range records at all): not when it is fresh (nothing of it is at home
/// to patch) or changed whole.
pub(super) fn logs_as_ranges(d: &DirtyBlock, ranges_ok: bool) -> bool {
    ranges_ok && !d.fresh && d.changed.bytes() < d.data.len() as u64
}

/// Splits the blocks of a closing transaction into those logged whole and those that may be
/// logged as their changed byte ranges (`ranges_ok`: the mode allows byte-range records).
/// A fresh block (allocated by this transaction) is always whole: its home location holds
/// none of it. A block whose bytes all equal its committed version is left out.
pub(super) fn split_by_record(
    dirty: Vec<DirtyBlock>,
    ranges_ok: bool,
) -> (Vec<WholeBlock>, Vec<RangeUpdate>) {
    let mut whole = Vec::new();
    let mut ranged = Vec::new();
    for d in dirty {
        if !logs_as_ranges(&d, ranges_ok) {
            whole.push((d.nr, d.data));
        } else if !d.changed.is_empty() {
            ranged.push(RangeUpdate {
                home: d.nr,
                data: d.data,
                ranges: d.changed.offset_lengths(),
            });
        }
    }
    (whole, ranged)
}
