//! The commit gate: admits one committer at a time (docs/DESIGN.md §4.3).
//!
//! A thread that needs transaction `t` durable, and finds a commit in progress, waits in
//! line. Whoever lets the gate go wakes only the waiters its commit settled (their
//! transaction is durable now, or the file system is in its error state) and hands the gate
//! itself to the first of the others, who then commits for everyone still in line. So a
//! commit that served 40 of 64 waiting threads wakes those 40 and one more, each once: with
//! one condition variable every waiter woke at every release, and the ones still waiting
//! took the lock one after another only to sleep again, on two cores a chain of context
//! switches between a commit and the next.
//!
//! Who is settled is judged with the releasing thread's `settled` function; every user of
//! one gate passes the same one (the file system's durable tid and error state).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{self, Thread};

use parking_lot::Mutex;

/// Knows which transactions are settled.
pub(super) trait Settles {
    /// Whether transaction `t` is settled: durable, or never to be (the error state).
    fn settled(&self, t: u32) -> bool;
}

/// Whether a waiter for `target` may leave without the gate: never when it needs the gate
/// itself (`None`).
fn waits_no_more(target: Option<u32>, settled: &dyn Settles) -> bool {
    target.is_some_and(|t| settled.settled(t))
}

/// See the module documentation.
#[derive(Default)]
pub(super) struct CommitGate {
    line: Mutex<Line>,
    /// Waiters woken, settled or handed the gate (tests count them).
    wakeups: AtomicU64,
}

#[derive(Default)]
struct Line {
    /// A commit (or journal close) is in progress: someone holds the gate.
    busy: bool,
    /// Threads waiting, in arrival order.
    waiters: VecDeque<Arc<Waiter>>,
}

/// A waiting thread; its `state` is set under `Line`'s lock before it is unparked.
struct Waiter {
    /// The transaction it needs durable; `None`: it needs the gate itself.
    target: Option<u32>,
    thread: Thread,
    state: AtomicU8,
}

const WAITING: u8 = 0;
/// Its transaction is settled: it leaves without the gate.
const SETTLED: u8 = 1;
/// It holds the gate now.
const HANDED: u8 = 2;

/// Exclusive use of the commit path; released on drop (woken waiters, handed on).
pub(super) struct GateGuard<'a> {
    gate: &'a CommitGate,
    settled: &'a dyn Settles,
}

impl CommitGate {
    /// Takes the gate, waiting in line while a commit is in progress. Returns `None` instead
    /// once `target` is settled (a `None` target always takes the gate).
    pub fn enter<'a>(
        &'a self,
        target: Option<u32>,
        settled: &'a dyn Settles,
    ) -> Option<GateGuard<'a>> {
        let is_settled = || waits_no_more(target, settled);
        let me = {
            let mut line = self.line.lock();
            if is_settled() {
                return None;
            }
            if !line.busy {
                line.busy = true;
                return Some(GateGuard {
                    gate: self,
                    settled,
                });
            }
            let me = Arc::new(Waiter {
                target,
                thread: thread::current(),
                state: AtomicU8::new(WAITING),
            });
            line.waiters.push_back(Arc::clone(&me));
            me
        };
        loop {
            match me.state.load(Ordering::Acquire) {
                // Parking returns spuriously too; the state says why we woke.
                WAITING => thread::park(),
                SETTLED => return None,
                _ => {
                    let guard = GateGuard {
                        gate: self,
                        settled,
                    };
                    // Settled while handed over (the error state): pass the gate on.
                    return (!is_settled()).then_some(guard);
                }
            }
        }
    }

    /// Waiters woken so far.
    #[cfg(test)]
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        let mut line = self.gate.line.lock();
        let mut woken = 0;
        let settled = self.settled;
        line.waiters.retain(|w| {
            let done = waits_no_more(w.target, settled);
            if done {
                w.state.store(SETTLED, Ordering::Release);
                w.thread.unpark();
                woken += 1;
            }
            !done
        });
        match line.waiters.pop_front() {
            // The gate stays busy: it is the next one's.
            Some(next) => {
                next.state.store(HANDED, Ordering::Release);
                next.thread.unpark();
                woken += 1;
            }
            None => line.busy = false,
        }
        self.gate.wakeups.fetch_add(woken, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32};
    use std::time::Duration;

    /// A durable tid and an error flag, as the file system keeps them.
    #[derive(Default)]
    struct Durability {
        tid: AtomicU32,
        errored: AtomicBool,
    }

    impl Settles for Durability {
        fn settled(&self, t: u32) -> bool {
            self.tid.load(Ordering::SeqCst) >= t || self.errored.load(Ordering::SeqCst)
        }
    }

    /// Waits until `n` threads wait in line.
    fn wait_for_line(gate: &CommitGate, n: usize) {
        let start = std::time::Instant::now();
        while gate.line.lock().waiters.len() < n {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{n} never waited"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs a test's body, failing it if it has not finished within a minute: a lost
    /// wake-up leaves a thread parked for ever, which must fail the test, not hang it.
    fn within_a_minute(body: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        let runner = thread::spawn(move || {
            body();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("a waiter never woke"),
            // Finished, or panicked (the sender went with it): join says which.
            _ => {
                if let Err(p) = runner.join() {
                    std::panic::resume_unwind(p);
                }
            }
        }
    }

    #[test]
    fn a_release_wakes_the_settled_waiters_and_hands_the_gate_to_one_other() {
        within_a_minute(|| {
            let gate = CommitGate::default();
            let d = Durability::default();
            let settled = &d;
            let first = gate.enter(Some(1), settled).expect("a free gate is taken");
            let holding = AtomicBool::new(false);
            thread::scope(|s| {
                let waiters: Vec<_> = [1, 1, 2, 2, 2]
                    .into_iter()
                    .map(|target| {
                        let (gate, holding) = (&gate, &holding);
                        s.spawn(move || {
                            let g = gate.enter(Some(target), settled);
                            let took = g.is_some();
                            if took {
                                holding.store(true, Ordering::SeqCst);
                            }
                            // The holder's commit: done when the test says so.
                            while took && !settled.settled(target) {
                                thread::sleep(Duration::from_millis(1));
                            }
                            (target, took)
                        })
                    })
                    .collect();
                wait_for_line(&gate, 5);
                d.tid.store(1, Ordering::SeqCst);
                drop(first);
                // The two waiters of transaction 1 leave, one waiter of 2 holds the gate, the
                // other two stay asleep in line (checked once all have finished, so that a
                // failure cannot leave the holder waiting).
                let woken_at_release = gate.wakeups();
                let left_in_line = gate.line.lock().waiters.len();
                while !holding.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(1));
                }
                d.tid.store(2, Ordering::SeqCst);
                let results: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
                let took: Vec<_> = results.iter().filter(|(_, took)| *took).collect();
                assert_eq!(took, [&(2, true)], "{results:?}");
                assert_eq!(
                    (woken_at_release, left_in_line),
                    (3, 2),
                    "only the settled waiters and one successor wake"
                );
            });
            assert_eq!(gate.wakeups(), 5, "each waiter woke once");
            assert!(!gate.line.lock().busy, "the last release frees the gate");
        });
    }

    #[test]
    fn waiters_for_the_gate_itself_are_handed_it_in_turn_and_the_error_state_settles_the_rest() {
        within_a_minute(|| {
            let gate = CommitGate::default();
            let d = Durability::default();
            let turns = AtomicU32::new(0);
            let first = gate.enter(None, &d).unwrap();
            thread::scope(|s| {
                let (g, d, turns) = (&gate, &d, &turns);
                // Two threads that need the gate itself (an unmount, an fdatasync of
                // overwrites), then three that need transaction 7.
                let closers: Vec<_> = (0..2)
                    .map(|i| {
                        let c = s.spawn(move || {
                            let guard = g.enter(None, d);
                            // Which turn it got; it lets the gate go at once.
                            guard.map(|_| turns.fetch_add(1, Ordering::SeqCst))
                        });
                        wait_for_line(g, i + 1);
                        c
                    })
                    .collect();
                let fsyncs: Vec<_> = (0..3)
                    .map(|_| s.spawn(move || g.enter(Some(7), d).is_some()))
                    .collect();
                wait_for_line(g, 5);
                // A failure elsewhere: every waiter of a transaction learns it at the
                // release; the ones that need the gate itself still get it, in turn.
                d.errored.store(true, Ordering::SeqCst);
                drop(first);
                let turns: Vec<_> = closers.into_iter().map(|c| c.join().unwrap()).collect();
                assert_eq!(turns, [Some(0), Some(1)]);
                for f in fsyncs {
                    assert!(!f.join().unwrap());
                }
            });
            // Three settled and one handed at the first release, one handed at the second.
            assert_eq!(gate.wakeups(), 5);
            assert!(!gate.line.lock().busy);
        });
    }

    #[test]
    fn a_handed_gate_whose_transaction_became_settled_is_passed_on() {
        within_a_minute(|| {
            let gate = CommitGate::default();
            let d = Durability::default();
            let settled = &d;
            // The holder judges no waiter settled, so `a` is handed the gate whatever happens;
            // it then finds its transaction settled (as when the error state comes between a
            // release and the wake-up) and hands the gate to `b` instead of committing.
            struct Never;
            impl Settles for Never {
                fn settled(&self, _: u32) -> bool {
                    false
                }
            }
            let first = gate.enter(None, &Never).unwrap();
            thread::scope(|s| {
                let (g, st) = (&gate, settled);
                let a = s.spawn(move || g.enter(Some(3), st).is_some());
                wait_for_line(&gate, 1);
                let b = s.spawn(move || g.enter(None, st).is_some());
                wait_for_line(&gate, 2);
                d.tid.store(3, Ordering::SeqCst);
                drop(first);
                assert!(!a.join().unwrap());
                assert!(b.join().unwrap());
            });
            assert_eq!(gate.wakeups(), 2);
            assert!(!gate.line.lock().busy);
        });
    }

    #[test]
    fn many_threads_with_random_targets_all_finish() {
        within_a_minute(|| {
            let gate = CommitGate::default();
            let d = Durability::default();
            let settled = &d;
            let commits = AtomicU32::new(0);
            thread::scope(|s| {
                for i in 0..16u32 {
                    let (gate, settled, d, commits) = (&gate, settled, &d, &commits);
                    s.spawn(move || {
                        for round in 0..200u32 {
                            // Each thread needs the running transaction, which is the durable
                            // one plus one: the holder "commits" it.
                            let target = d.tid.load(Ordering::SeqCst) + 1 + (i + round) % 2;
                            if let Some(_g) = gate.enter(Some(target), settled) {
                                commits.fetch_add(1, Ordering::SeqCst);
                                d.tid.fetch_max(target, Ordering::SeqCst);
                            }
                            assert!(d.settled(target));
                        }
                    });
                }
            });
            assert!(commits.load(Ordering::SeqCst) > 0);
            assert!(!gate.line.lock().busy);
        });
    }
}
