//! The commit path: closing the running transaction, group commit, held commit blocks, what
//! a commit does once its transaction is durable, and the background thread that commits on
//! the timer and checkpoints (docs/DESIGN.md §4.2, §4.3). The gate that admits one committer
//! at a time is `commit_gate.rs`.

use super::tx_changes::split_by_record;
use super::*;

/// Longest a commit waits for more fsyncs to join it (jbd2's max batch time is 15 ms; a
/// user-space device round trip is shorter, so the cap is lower).
const MAX_BATCH_WAIT: Duration = Duration::from_millis(2);

/// How [`Inner::close_and_commit`] ended.
pub(super) enum Committed {
    /// The running transaction held nothing to commit.
    Nothing,
    /// The transaction is durable.
    Durable,
    /// The journal holds its commit block (`Inner::held`).
    Held,
}

/// What a commit still has to do once its transaction is durable ([`Inner::commit_durable`]).
pub(super) struct CommitDone {
    pub(super) tid: u32,
    /// Blocks the transaction freed, allocatable once it is durable.
    freed: Vec<(u64, u32)>,
    /// Lightweight frees to apply in the next transaction.
    late_frees: Vec<alloc_state::LateFree>,
    /// File data that went home with it: clean once it is durable.
    pub(super) home: Vec<writeback::HomeWrite>,
    /// Bytes of its metadata blocks that changed.
    changed: u64,
    /// Blocks (whole and by ranges) it logged.
    pub(super) nblocks: u64,
    /// Lightweight: it journaled blocks that would have gone in place but for older copies
    /// in the log.
    held_by_log: bool,
}

impl Inner {
    /// Commits the running transaction if it holds anything.
    pub(super) fn commit_running(&self) -> Result<()> {
        let t = self.meta.lock().tid;
        self.commit_up_to(t)
    }

    /// Returns once transaction `target` is durable, committing it if nobody else has. Every
    /// caller learns the result of the commit that covered `target`: after a failed commit,
    /// nothing from that transaction on can become durable, and all of them get EIO.
    ///
    /// A commit whose ordered data went home may return from the journal with its commit
    /// block held (docs/DESIGN.md §4.2): its committer then lets the gate go and comes back.
    /// Whoever takes the gate next with a target the held transaction covers either commits
    /// the running transaction, whose first batch and flush carry the held commit block (when
    /// [`Inner::should_carry`] says so), or writes the held block alone.
    pub(super) fn commit_up_to(&self, target: u32) -> Result<()> {
        let durable = || tid_geq(self.committed_tid.load(Ordering::SeqCst), target);
        loop {
            let gate = self.gate.enter(Some(target), self);
            if durable() {
                return Ok(());
            }
            if self.errored.load(Ordering::SeqCst) {
                return Err(self.error_result());
            }
            let Some(gate) = gate else {
                unreachable!("the gate is refused only once the target is settled");
            };
            let held = self.held.lock().as_ref().map(|h| h.tid);
            if held.is_some_and(|h| tid_geq(h, target)) && !self.should_carry() {
                return self.finish_held(&gate);
            }
            match self.close_and_commit(&gate)? {
                Committed::Nothing => return self.finish_held(&gate),
                Committed::Durable => return Ok(()),
                // Back to the gate: someone may carry it, or we write it alone.
                Committed::Held => {}
            }
        }
    }

    /// Whether the held transaction's commit block should wait for the running transaction's
    /// commit to carry it rather than go out alone: when other fsyncs are under way and the
    /// running transaction is already as large as the held one (dirty pages and metadata
    /// blocks), so that closing it now loses nothing of the batching a commit written alone
    /// would give it time for. 16 threads of appends + fdatasync on this project's VM: a
    /// commit serves about 13 of them and 3 are left for the next one, which then grows
    /// while the held block goes out alone; 64 threads leave the next one as large. Asked
    /// once per entry at the gate while a commit block is held; it walks the dirty pages
    /// until it has found enough (all of them when the answer is no) under `meta` and the
    /// page cache's mutex.
    pub(super) fn should_carry(&self) -> bool {
        if self.counters.fsync_active.load(Ordering::SeqCst) <= 1 {
            return false;
        }
        let held_size = match self.held.lock().as_ref() {
            Some(h) => h.home.len() as u64 + h.nblocks,
            None => return false,
        };
        let m = self.meta.lock();
        // The held transaction's pages stay dirty until it is durable: count those a write
        // changed since it sent them, and the others.
        let blocks = m.cache.dirty_count() as u64;
        let pages = usize::try_from(held_size.saturating_sub(blocks)).unwrap_or(usize::MAX);
        // Bound to a name so that the page cache's guard goes before `m` (edition 2021).
        let enough = m.data.lock().unsent_dirty_at_least(pages);
        enough
    }

    /// Makes the transaction whose commit block the journal holds (if any) durable with a
    /// write of its own, then finishes its commit. The caller holds the gate.
    pub(super) fn finish_held(&self, _gate: &GateGuard<'_>) -> Result<()> {
        let Some(held) = self.held.lock().take() else {
            return Ok(());
        };
        match self.io.journal.finish_held() {
            Ok(tid) => {
                debug_assert_eq!(tid, Some(held.tid), "the journal holds another commit");
                self.commit_durable(held)
            }
            Err(e) => {
                let mut m = self.meta.lock();
                Err(self.commit_failed(&mut m, held.tid, e))
            }
        }
    }

    /// Closes the running transaction and commits it, carrying the commit block of a held
    /// transaction: the caller holds the gate. The commit's own block may be held in turn.
    pub(super) fn close_and_commit(&self, gate: &GateGuard<'_>) -> Result<Committed> {
        // Group commit: when other threads are fsyncing too, let the running transaction grow
        // to about one commit's age before closing it, as jbd2 does for multiple sync writers:
        // a transaction that opened while the previous commit ran is old enough already, so
        // back-to-back commits under load never sleep. Not when this commit carries a held
        // commit block: that transaction's fsyncs wait for this one's first flush, and the
        // running transaction grew while its body went out (measured in docs/DESIGN.md §4.3).
        let carrying = self.held.lock().is_some();
        if !carrying && self.counters.fsync_active.load(Ordering::SeqCst) > 1 {
            let avg = Duration::from_nanos(self.counters.avg_commit_ns.load(Ordering::Relaxed));
            let age = self.running_since.lock().elapsed();
            if let Some(wait) = avg.min(MAX_BATCH_WAIT).checked_sub(age) {
                std::thread::sleep(wait);
            }
        }
        // Lightweight: two commits in a row journaled blocks that would go in place but for
        // older copies in the log (a block a change of names journaled, say). Write the log
        // home first, under the gate so that no commit logs them again meanwhile: from this
        // commit on they go in place (docs/DESIGN.md §3.1). Counted in commits, not time, so
        // it runs with `deterministic_writes` too: a recorded workload replays the same, and the
        // crash harness sees the in-place writes that follow.
        if self.light_held_commits.load(Ordering::Relaxed) >= 2 {
            self.light_held_commits.store(0, Ordering::Relaxed);
            // A checkpoint writes home only what is durable.
            self.finish_held(gate)?;
            if let Err(e) = self.io.journal.checkpoint() {
                return Err(self.fail(&mut self.meta.lock(), "checkpoint", e));
            }
        }
        self.allocate_ahead();
        if self.errored.load(Ordering::SeqCst) {
            // A piece failed after its change (or another operation did meanwhile).
            return Err(self.error_result());
        }
        let started = Instant::now();
        let (mut req, done, in_place) = {
            // Write-back: cached file data gets its blocks in this transaction (`None`:
            // nothing to commit, the timer fired on an idle file system; every closed
            // transaction but a held one is already durable, or the error state would have
            // stopped us). Until the running tid moves on, fsync planners wait
            // (`fs/sync_view.rs`).
            let window = self.sync.writeback_window();
            let written = self.lock_meta_reading(|m| {
                m.has_uncommitted_changes()
                    .then(|| m.writeback(&self.io, Scope::All))
            });
            let (mut m, home) = match written {
                Ok(locked) => locked,
                Err(e) => return Err(self.fail(&mut self.meta.lock(), "write-back", e)),
            };
            let home = match home {
                None => return Ok(Committed::Nothing),
                Some(Ok(h)) => h,
                Some(Err(e)) => return Err(self.fail(&mut m, "write-back", e)),
            };
            if m.sb_dirty {
                if let Err(e) = m.flush_sb_to_cache(&self.io) {
                    return Err(self.fail(&mut m, "commit", e));
                }
            }
            let dirty = m.cache.take_dirty();
            let changed: u64 = dirty.iter().map(|d| d.changed.bytes()).sum();
            let tx = std::mem::take(&mut m.tx);
            let ranges_ok = tx.ranges || m.default_mode.logs_byte_ranges();
            // Lightweight mode journals only the allocation structures; the other metadata
            // that only lightweight operations changed goes home in place once the commit is
            // durable, and an inode-table block shared with stricter inodes journals only
            // their bytes (docs/DESIGN.md §3.2). Lightweight frees reach the bitmaps only
            // after that, in the next transaction.
            let modes::LightweightSort {
                journaled: dirty,
                in_place,
                shared,
                held_by_log,
            } = if tx.light {
                m.sort_for_lightweight(
                    &self.io,
                    dirty,
                    &tx.strict_blocks,
                    &tx.strict_inodes,
                    ranges_ok,
                )
            } else {
                modes::LightweightSort {
                    journaled: dirty,
                    in_place: Vec::new(),
                    shared: Vec::new(),
                    held_by_log: false,
                }
            };
            let (blocks, mut ranges) = split_by_record(dirty, ranges_ok);
            ranges.extend(shared);
            let revoked: Vec<u64> = tx.revoked.into_iter().collect();
            let freed = std::mem::take(&mut m.alloc.freed_running);
            let late_frees = std::mem::take(&mut m.alloc.late_frees);
            let tid = m.close_running_tid();
            // Served from here until the journal has them as pending (a held transaction's
            // copies stay beside the next one's, which replace them where both have a block).
            let copies = blocks
                .iter()
                .map(|(nr, b)| (*nr, b))
                .chain(ranges.iter().map(|r| (r.home, &r.data)))
                .chain(in_place.iter().map(|(nr, b)| (*nr, b)));
            for (nr, b) in copies {
                m.committing.insert(nr, (tid, Arc::clone(b)));
            }
            drop(window);
            *self.running_since.lock() = Instant::now();
            let nblocks = (blocks.len() + ranges.len()) as u64;
            (
                CommitRequest {
                    blocks,
                    ranges,
                    revoked,
                    data_written_home: false,
                    home_data: Vec::new(),
                    home_data_unordered: true,
                },
                CommitDone {
                    tid,
                    freed,
                    late_frees,
                    home,
                    changed,
                    nblocks,
                    held_by_log,
                },
                in_place,
            )
        };
        // File data goes home with the log body, durable before the commit record that maps
        // it (ordered mode's promise); listed once the metadata lock is let go (16 384 pages
        // for a 64 MiB commit).
        req.home_data = done
            .home
            .iter()
            .map(|w| (w.at, Arc::clone(&w.bytes)))
            .collect();
        req.home_data_unordered = done.home.iter().all(|w| !w.ordered);
        // Lightweight commits write blocks in place after theirs is durable, and apply frees
        // in the next transaction: they finish at once.
        let may_hold = in_place.is_empty() && done.late_frees.is_empty();
        let tid = done.tid;
        let mut r = self
            .io
            .journal
            .commit_holding(req, may_hold)
            .map(|(t, held)| {
                debug_assert_eq!(t, tid, "journal and fs disagree on the tid");
                held
            });
        if r.is_ok() {
            // The commit carried the held transaction's commit block: it is durable.
            if let Some(carried) = self.held.lock().take() {
                self.commit_durable(carried)?;
            }
        }
        if matches!(r, Ok(false)) && !in_place.is_empty() {
            // Lightweight: the allocations these blocks point at are durable in the journal
            // now, so a crash from here on can only leak; write them home and make them durable
            // before the transaction counts as committed.
            r = self.write_in_place(&in_place).map(|()| false);
        }
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let old = self.counters.avg_commit_ns.load(Ordering::Relaxed);
        self.counters
            .avg_commit_ns
            .store((old * 7 + ns) / 8, Ordering::Relaxed);
        match r {
            Ok(true) => {
                writeback::sent_home_writes(&self.pages, &done.home);
                *self.held.lock() = Some(done);
                Ok(Committed::Held)
            }
            Ok(false) => {
                self.commit_durable(done)?;
                Ok(Committed::Durable)
            }
            Err(e) => {
                self.held.lock().take();
                let mut m = self.meta.lock();
                m.committing.clear();
                Err(self.commit_failed(&mut m, tid, e))
            }
        }
    }

    /// Puts the file system in its error state after the commit of transaction `tid` failed;
    /// returns what its waiters get. The journal refuses a commit once the error state is
    /// latched (an operation failed after its change meanwhile): its waiters learn the
    /// error, not EROFS.
    fn commit_failed(&self, m: &mut Meta, tid: u32, e: FsError) -> FsError {
        match self.fail(m, &format!("commit of transaction {tid}"), e) {
            FsError::ReadOnly => self.error_result(),
            e => e,
        }
    }

    /// What is left of a commit once its transaction is durable: its pages are clean, its
    /// tid counts as committed, the blocks it freed become allocatable, lightweight frees
    /// reach the bitmaps, and it is counted.
    fn commit_durable(&self, done: CommitDone) -> Result<()> {
        let CommitDone {
            tid,
            freed,
            late_frees,
            home,
            changed,
            nblocks,
            held_by_log,
        } = done;
        // Pages clean before the tid counts as durable: an fsync that waited for it finds
        // its pages clean (`SyncWork::CommitThenOverwrites`).
        writeback::finish_home_writes(&self.pages, &home);
        let mut m = self.meta.lock();
        m.committing.retain(|_, (t, _)| !tid_geq(tid, *t));
        self.committed_tid.store(tid, Ordering::SeqCst);
        m.forget_durable_tids(tid);
        for (first, len) in freed {
            m.alloc.quarantine.remove(first, u64::from(len));
        }
        if let Err(e) = m.apply_late_frees(&self.io, late_frees) {
            return Err(self.fail(&mut m, "applying lightweight frees", e));
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .committed_blocks
            .fetch_add(nblocks, Ordering::Relaxed);
        self.counters
            .changed_metadata_bytes
            .fetch_add(changed, Ordering::Relaxed);
        let blocks_changed = std::mem::take(&mut m.blocks_changed);
        drop(m);
        self.tell_blocks_changed(&blocks_changed);
        if held_by_log {
            self.light_held_commits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.light_held_commits.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Allocates the blocks of the running transaction's pages over holes in pieces of
    /// [`MountOptions::allocate_piece_pages`], each one operation in one hold of the metadata
    /// lock (`Meta::allocate_ahead`), so that the commit's close, which holds the lock
    /// throughout, only collects the pages: a commit that writes back 64 MiB of new data held
    /// it 14-16 ms in one piece, 3.4-3.8 ms now, and 0.6-1 ms per piece of 1 024 pages.
    /// Called by a commit holding the gate, so no other commit closes the transaction
    /// meanwhile. Bounded by the pages counted at the start (writes keep adding more); a
    /// failure before a piece's first change is left to the close, which meets it again and
    /// fails the commit as before; one after it puts the file system in its error state
    /// (`Inner::lock_meta_reading`), which the commit then returns.
    fn allocate_ahead(&self) {
        let piece = self.allocate_piece;
        let holes = self.pages.lock().reserved();
        if holes <= piece as u64 {
            return;
        }
        let mut from = (0, 0);
        for _ in 0..=holes.div_ceil(piece as u64) {
            match self.lock_meta_reading(|m| m.allocate_ahead(&self.io, piece, from)) {
                Ok((m, Ok((n, next)))) if n == piece => {
                    // A waiting operation goes next, not this thread's next piece.
                    m.unlock_fair();
                    from = next;
                }
                Ok((_, Ok(_))) => return,
                Ok((_, Err(e))) | Err(e) => {
                    log::debug!("allocation ahead of a commit's close stopped: {e}");
                    return;
                }
            }
        }
    }

    /// Hands `inodes` to the listener of [`Fs::on_blocks_changed`], if any.
    pub(super) fn tell_blocks_changed(&self, inodes: &[u32]) {
        if inodes.is_empty() {
            return;
        }
        let listener = self.blocks_listener.lock().clone();
        if let Some(listener) = listener {
            let inodes: Vec<Ino> = inodes.iter().map(|&i| Ino::from(i)).collect();
            listener(&inodes);
        }
    }

    /// Writes lightweight mode's in-place metadata blocks home (one batch) and flushes.
    fn write_in_place(&self, blocks: &[(u64, Arc<[u8]>)]) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let mut pieces: Vec<(u64, &[u8])> =
            blocks.iter().map(|(nr, b)| (nr * bs, &b[..])).collect();
        pieces.sort_unstable_by_key(|p| p.0);
        self.io.dev.write_blocks(&pieces)?;
        self.io.dev.flush()?;
        Ok(())
    }

    /// Asks the background thread to commit the running transaction now, without waiting for
    /// it.
    pub(super) fn start_commit(&self) {
        let (lock, cv) = &self.wake;
        lock.lock().commit = true;
        cv.notify_all();
    }

    /// Commits on the timer and when asked ([`Inner::start_commit`]), and checkpoints when
    /// the log is half full, until unmount.
    pub(super) fn background_loop(&self) {
        let (lock, cv) = &self.wake;
        loop {
            {
                let mut wake = lock.lock();
                if !wake.stop && !wake.commit {
                    cv.wait_for(&mut wake, self.commit_interval);
                }
                if wake.stop {
                    return;
                }
                wake.commit = false;
            }
            if self.commit_running().is_err() {
                continue;
            }
            let j = &self.io.journal;
            let space = j.space();
            if !self.deterministic_writes && space.used > space.capacity / 2 {
                if let Err(e) = j.checkpoint() {
                    let mut m = self.meta.lock();
                    self.fail(&mut m, "checkpoint", e);
                }
            }
        }
    }
}
