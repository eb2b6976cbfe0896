//! The inode table: where each inode lives, reading it (checksum and size checked) and writing
//! it back, and the transactions that fsync and fdatasync of each inode must wait for.
//!
//! Invariant: no inode read through `read_inode` has a size past the format's limits.

use crate::format::ext4::inode::Inode;
use crate::fs::api::Attr;
use crate::fs::cached_writes::PendingInode;
use crate::{FsError, Result};

use super::itable_misses::InodeTableMiss;
use super::meta::{Io, Meta, MAX_DIR_BYTES};

/// Inode-table blocks read at once when an inode's block is in no memory copy and the
/// misses walk forward: that block and those after it in its group's table (as ext4's
/// `inode_readahead_blks`, 32 by default), since the inodes of one directory are mostly made
/// one after the other.
const INODE_READ_AHEAD: u64 = 32;

/// Byte ranges of an on-disk inode that hold only timestamps and the checksum (which follows
/// them): a change confined to these needs no commit for fdatasync. Offsets from the ext4
/// inode layout: i_atime, i_ctime, i_mtime at 0x08..0x14, l_i_checksum_lo at 0x7C..0x7E,
/// i_checksum_hi at 0x82..0x84, i_ctime_extra/i_mtime_extra/i_atime_extra at 0x84..0x90.
const INODE_TIME_FIELDS: [(usize, usize); 3] = [(0x08, 0x14), (0x7C, 0x7E), (0x82, 0x90)];

/// Whether inodes `a` and `b` differ only in timestamps (and so in checksum).
fn only_times_differ(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    for &(lo, hi) in &INODE_TIME_FIELDS {
        let (lo, hi) = (lo.min(a.len()), hi.min(a.len()));
        if a[at..lo] != b[at..lo] {
            return false;
        }
        at = hi;
    }
    a[at..] == b[at..]
}

impl Meta {
    /// Forgets the inode tids that transaction `tid` made durable.
    pub fn forget_durable_tids(&mut self, tid: u32) {
        self.sync.durable(tid);
    }

    /// Closes the running transaction: returns its tid, and the next one runs (published for
    /// fsync planning without the lock).
    pub fn close_running_tid(&mut self) -> u32 {
        let tid = self.tid;
        self.tid = tid.wrapping_add(1);
        self.sync.set_running(self.tid);
        // Blocks allocated ahead of this close are this transaction's (`Meta::allocate_ahead`).
        self.alloc.allocated_ahead = Default::default();
        tid
    }

    // ----- inodes -----

    pub(super) fn inode_location(&self, ino: u32) -> Result<(u64, usize)> {
        if !self.geo.valid_ino(u64::from(ino)) {
            return Err(FsError::NotFound);
        }
        let ipg = self.geo.inodes_per_group;
        let g = (ino - 1) / ipg;
        let idx = u64::from((ino - 1) % ipg);
        let byte = idx * u64::from(self.geo.inode_size);
        let bs = u64::from(self.geo.block_size);
        Ok((
            self.alloc.groups[g as usize].inode_table + byte / bs,
            (byte % bs) as usize,
        ))
    }

    /// Reads inode `ino` (checksum verified), with the size and times that writes without
    /// the lock left for it (`fs/cached_writes.rs`), which are its newest.
    pub fn read_inode(&mut self, io: &Io, ino: u32) -> Result<Inode> {
        let pending = self.data.lock().writes().pending(ino);
        self.read_inode_with(io, ino, pending)
    }

    /// Inode `ino` exactly as stored (checksum verified), without what writes without the
    /// lock left for it and without noting the read for the operation: for loading blocks
    /// before an operation's first change (docs/DESIGN.md §4.1).
    pub(super) fn stored_inode(&mut self, io: &Io, ino: u32) -> Result<Inode> {
        let (nr, off) = self.inode_location(ino)?;
        self.read_ahead_inode_table(io, ino, nr)?;
        let isz = self.geo.inode_size as usize;
        let seed = self.geo.csum_seed;
        let b = self.block(io, nr)?;
        let inode = Inode::from_bytes(&b[off..off + isz]);
        inode.verify(seed, ino)?;
        Ok(inode)
    }

    /// When inode `ino`'s table block `nr` is in no memory copy and the misses walk the table
    /// forward (`nr` is the block just after the last one missed, or just after the last
    /// read-ahead, as a cold `ls -l` goes), fetches it with the blocks after it, up to
    /// [`INODE_READ_AHEAD`] and never past the part of the group's table that holds inodes
    /// in use (`bg_itable_unused`, as ext4 bounds its read-ahead) (`Meta::prefetch`). Other
    /// misses read their block alone: the operation waits for all it reads, and read-ahead
    /// that is not used also evicts what is (random lookups with a 4 MiB cache lost a third of
    /// their rate when read-ahead followed any miss up to 64 blocks after the last).
    fn read_ahead_inode_table(&mut self, io: &Io, ino: u32, nr: u64) -> Result<()> {
        if self.in_memory(io, nr) {
            return Ok(());
        }
        let group = (ino - 1) / self.geo.inodes_per_group;
        let (ahead, end) = match self.itable_miss.last(group) {
            // The same miss, met again when the operation runs after its stop.
            Some(m) if m.block == nr => (m.ahead, m.end),
            Some(m) if m.end == nr => (true, self.inode_table_read_ahead_end(group, nr)),
            _ => (false, nr + 1),
        };
        self.itable_miss.note(
            group,
            InodeTableMiss {
                block: nr,
                ahead,
                end,
            },
        );
        if !ahead {
            return Ok(());
        }
        self.prefetch(io, nr..end)
    }

    /// Where read-ahead of group `group`'s inode table from its block `nr` ends.
    fn inode_table_read_ahead_end(&self, group: u32, nr: u64) -> u64 {
        let ipg = self.geo.inodes_per_group;
        let group = &self.alloc.groups[group as usize];
        let used = u64::from(ipg.saturating_sub(group.itable_unused));
        let used_blocks =
            (used * u64::from(self.geo.inode_size)).div_ceil(u64::from(self.geo.block_size));
        (group.inode_table + used_blocks)
            .min(nr + INODE_READ_AHEAD)
            .max(nr + 1)
    }

    /// Reads inode `ino` as stored, with `pending` (a record of writes without the lock taken
    /// earlier) folded in: storing it removes that record (`Meta::write_inode`) if this is the
    /// operation's first read of the inode.
    pub(super) fn read_inode_with(
        &mut self,
        io: &Io,
        ino: u32,
        pending: Option<PendingInode>,
    ) -> Result<Inode> {
        let mut inode = self.stored_inode(io, ino)?;
        // The first read of the inode in the operation decides which record its stores may
        // remove: one it saw (an operation may store the copy it read first, after a write
        // without the lock left a record a later read folded in). 0: none seen, none removed.
        self.op
            .pending_seen
            .entry(ino)
            .or_insert(pending.map_or(0, |p| p.seq));
        if let Some(p) = pending {
            p.apply(&mut inode);
        }
        self.check_inode_size(ino, &inode)?;
        Ok(inode)
    }

    /// The attributes of `ino` from inode `i` (read under this lock), cached in the name cache
    /// and returned; `seen`: the caller hands them out, so its times count as seen. Built,
    /// marked and cached in one hold of the page cache's mutex, which a write without the
    /// lock holds while it changes the cached size, times and blocks (`Inner::write_cached`):
    /// such a write comes wholly before (what is cached shows it) or after (it changes what
    /// is cached, and sees the look), so the cache never goes back to an older state.
    pub(super) fn attr_cached(&self, ino: u32, i: &Inode, seen: bool) -> Attr {
        let pages = self.data.lock();
        let attr = self.attr_with(ino, i, &pages);
        if seen {
            self.names.shown(ino);
        }
        self.names.put_attr(&attr);
        attr
    }

    /// Refuses sizes no valid inode has: a regular file past the format's maximum (the kernel's
    /// `ext4_max_size`), a directory that is not a whole number of blocks or larger than
    /// [`MAX_DIR_BYTES`]. Every loop over a file's blocks relies on this bound.
    fn check_inode_size(&self, ino: u32, inode: &Inode) -> Result<()> {
        let size = inode.size();
        if inode.is_reg() && size > self.geo.max_file_bytes() {
            return Err(FsError::corrupt_inode(
                ino,
                format!(
                    "bad i_size {size}: larger than the largest file the format allows ({})",
                    self.geo.max_file_bytes()
                ),
            ));
        }
        if inode.is_dir() && (size % u64::from(self.geo.block_size) != 0 || size > MAX_DIR_BYTES) {
            return Err(FsError::corrupt_inode(
                ino,
                format!(
                    "bad directory i_size {size}: not a multiple of the block size {} or \
                     above {MAX_DIR_BYTES}",
                    self.geo.block_size
                ),
            ));
        }
        Ok(())
    }

    /// Forgets the cached attributes of `ino`, which is changing; if they were cached, the
    /// running operation notes it (`OpUndo::forgot`), and `write_inode` then notes each state
    /// it writes, to cache them again when the operation ends well.
    pub(super) fn forget_attr_in_op(&mut self, ino: u32) {
        if self.names.forget_attr(ino) {
            if let Some(u) = self.op.undo.as_mut() {
                u.forgot.entry(ino).or_default();
            }
        }
    }

    /// Stores inode `ino` with a fresh checksum, and notes which transaction fsync and
    /// fdatasync of the inode must now wait for.
    pub fn write_inode(&mut self, io: &Io, ino: u32, inode: &mut Inode) -> Result<()> {
        let (nr, off) = self.inode_location(ino)?;
        inode.update_checksum(self.geo.csum_seed, ino);
        let isz = self.geo.inode_size as usize;
        let tid = self.tid;
        // Also when the bytes stay: the cached attributes count reserved blocks, which may
        // have changed. Cached again as the operation leaves the inode when it ends well
        // (every write of it noted once they were found cached: the last one wins).
        self.forget_attr_in_op(ino);
        if let Some(last) = self.op.undo.as_mut().and_then(|u| u.forgot.get_mut(&ino)) {
            *last = Some(inode.clone());
        }
        if self.block(io, nr)?[off..off + isz] == *inode.as_bytes() {
            // Nothing changed (a write that kept the times): no transaction needs it (the
            // transaction that holds these bytes is in the inode's tids already).
            self.stored_pending(ino);
            return Ok(());
        }
        if !self.op_is_lightweight() {
            self.tx.strict_inodes.insert(ino);
        }
        let b = self.block_mut(io, nr)?;
        let times_only = only_times_differ(&b[off..off + isz], inode.as_bytes());
        b[off..off + isz].copy_from_slice(inode.as_bytes());
        // The tids first: an fsync planned without the lock that no longer finds the record
        // finds the transaction holding it (`fs/sync_view.rs`).
        self.sync.changed(ino, tid, times_only);
        self.stored_pending(ino);
        Ok(())
    }

    /// What writes without the lock left for inode `ino`, as the running operation first read
    /// it, is in the inode now: that record goes (`fs/cached_writes.rs`).
    fn stored_pending(&mut self, ino: u32) {
        if let Some(&seq) = self.op.pending_seen.get(&ino) {
            self.data.lock().writes_mut().stored(ino, seq);
        }
    }
}
