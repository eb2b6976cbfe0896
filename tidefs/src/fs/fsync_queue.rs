//! fsyncs answered by callback ([`super::Fs::fsync_then`], [`super::Fs::sync_then`]).
//!
//! A FUSE daemon must not block the thread that read an fsync request until the commit is durable,
//! or one slow commit holds every other request. Instead of handing the request to a waiting thread
//! (a wake-up and a context switch per fsync, and another when the commit ends), the caller decides
//! here what the fsync needs (`Inner::fsync_plan`, on its own thread, most often without the
//! metadata lock) and, when it needs the device, queues the work with a callback. One thread serves
//! the queue: it takes every queued job at once, runs the whole batch's commit (one commit covers
//! every transaction up to the newest target: group commit), and calls each callback with its own
//! result, on that thread, as soon as the commit is durable.
//!
//! This module owns the queue and the serving loop; what a job does is `Inner::run_sync_work`.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::Inner;
use crate::journal::tid_geq;
use crate::{FsError, Result};

/// Called once with the result of a queued fsync or sync; it runs on the thread that made the
/// work durable, so it should only hand the result on (send a reply), not block.
pub type SyncDone = Box<dyn FnOnce(Result<()>) + Send>;

/// What an fsync or sync needs from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SyncWork {
    /// Transaction `tid` (the file's last change) must be durable.
    Commit(u32),
    /// The file's cached pages that overwrite blocks on disk go home and are flushed.
    Overwrites(u32),
    /// Transaction `.0`, closed and being committed, must be durable, and then the file
    /// `.1`'s pages dirtied since its write-back must go home ([`SyncWork::Overwrites`]).
    CommitThenOverwrites(u32, u32),
    /// Everything (sync, syncfs).
    All,
}

/// One queued fsync or sync.
pub(super) struct SyncJob {
    pub(super) work: SyncWork,
    /// When the caller asked; `None` for a sync, which the fsync statistics do not count.
    pub(super) fsync_start: Option<Instant>,
    pub(super) done: SyncDone,
}

#[derive(Default)]
struct QueueState {
    jobs: Vec<SyncJob>,
    /// No more jobs are taken; the serving thread ends once the queue is empty.
    stopped: bool,
    /// Jobs still queued when the queue stopped fail instead of being served (a crash).
    fail_rest: bool,
}

/// The queue between the threads that ask for fsyncs and the thread that serves them.
#[derive(Default)]
pub(super) struct SyncQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

impl SyncQueue {
    /// Queues `job`, or hands it back when the queue has stopped (the caller serves it).
    pub(super) fn push(&self, job: SyncJob) -> std::result::Result<(), SyncJob> {
        let mut s = self.state.lock();
        if s.stopped {
            return Err(job);
        }
        s.jobs.push(job);
        drop(s);
        self.ready.notify_one();
        Ok(())
    }

    /// Takes no more jobs. Those already queued are served, or failed if `fail_rest` (the file
    /// system stops as a power cut would and must write nothing more).
    pub(super) fn stop(&self, fail_rest: bool) {
        let mut s = self.state.lock();
        s.stopped = true;
        s.fail_rest |= fail_rest;
        drop(s);
        self.ready.notify_all();
    }

    /// Takes every queued job (the serving thread is gone and they must fail).
    fn drain(&self) -> Vec<SyncJob> {
        std::mem::take(&mut self.state.lock().jobs)
    }

    /// Waits for jobs and takes all of them; `None` once stopped and empty. The second value
    /// says whether the jobs must fail instead of being served.
    fn next_batch(&self) -> Option<(Vec<SyncJob>, bool)> {
        let mut s = self.state.lock();
        while s.jobs.is_empty() && !s.stopped {
            self.ready.wait(&mut s);
        }
        if s.jobs.is_empty() {
            return None;
        }
        Some((std::mem::take(&mut s.jobs), s.fail_rest))
    }
}

impl Inner {
    /// The serving thread's loop (`tidefs-fsync`), until the queue stops and drains.
    pub(super) fn serve_sync_queue(&self) {
        // Should the thread die (a panic), later fsyncs run on their callers' threads and the
        // ones queued fail, instead of waiting for ever.
        struct Orphaned<'a>(&'a Inner);
        impl Drop for Orphaned<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.syncs.stop(true);
                    for job in self.0.syncs.drain() {
                        let dead = std::io::Error::other("the fsync thread stopped");
                        self.0.finish_sync(job, Err(FsError::Io(dead)));
                    }
                }
            }
        }
        let _orphaned = Orphaned(self);
        while let Some((batch, fail)) = self.syncs.next_batch() {
            if fail {
                for job in batch {
                    self.finish_sync(job, Err(FsError::ReadOnly));
                }
                continue;
            }
            let mut commits = Vec::new();
            for job in batch {
                match job.work {
                    SyncWork::Commit(tid) => commits.push((tid, job)),
                    work => {
                        let r = self.run_sync_work(work);
                        self.finish_sync(job, r);
                    }
                }
            }
            let newest =
                commits
                    .iter()
                    .map(|(tid, _)| *tid)
                    .reduce(|a, b| if tid_geq(a, b) { a } else { b });
            let Some(newest) = newest else {
                continue;
            };
            // One commit makes every older transaction durable too (Ok also when there was
            // nothing left to commit: a transaction emptied by rolled-back operations). When
            // it fails, nothing from the failed transaction on can become durable: those
            // waiters get the error, the ones an earlier commit covered their Ok.
            let all_durable = self.commit_up_to(newest).is_ok();
            let durable = self.committed_tid.load(std::sync::atomic::Ordering::SeqCst);
            for (tid, job) in commits {
                let r = if all_durable || tid_geq(durable, tid) {
                    Ok(())
                } else {
                    Err(self.error_result())
                };
                self.finish_sync(job, r);
            }
        }
    }

    /// Counts a finished fsync and hands its result to its callback.
    pub(super) fn finish_sync(&self, job: SyncJob, r: Result<()>) {
        if let Some(start) = job.fsync_start {
            self.counters.fsync_finished(start);
        }
        (job.done)(r);
    }
}
