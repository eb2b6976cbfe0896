//! A mutex whose holds are timed: the metadata lock (docs/DESIGN.md §2.5) keeps the longest
//! hold since mount and the count of holds of a millisecond or more, which `tidefs stats`
//! reports (`metadata_hold_max_us`, `metadata_holds_over_ms`), as jbd2 reports how long
//! transactions stay locked. Every operation that needs the lock waits for the hold before
//! it, so these say how long the lock makes others wait at worst.
//!
//! A hold is timed from the moment the lock is acquired to the moment its guard lets go,
//! with one clock read at each end.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

/// Holds this long or longer are counted in [`TimedLock::holds_over_ms`].
const LONG_HOLD: Duration = Duration::from_millis(1);

/// A mutex that times its holds.
pub(crate) struct TimedLock<T> {
    mutex: Mutex<T>,
    longest_ns: AtomicU64,
    long_holds: AtomicU64,
}

impl<T> TimedLock<T> {
    pub fn new(value: T) -> TimedLock<T> {
        TimedLock {
            mutex: Mutex::new(value),
            longest_ns: AtomicU64::new(0),
            long_holds: AtomicU64::new(0),
        }
    }

    /// Waits for the lock and takes it.
    pub fn lock(&self) -> TimedGuard<'_, T> {
        let guard = self.mutex.lock();
        TimedGuard {
            guard: Some(guard),
            since: Instant::now(),
            lock: self,
        }
    }

    /// The lock, if nobody holds it (tests).
    #[cfg(test)]
    pub fn try_lock(&self) -> Option<TimedGuard<'_, T>> {
        let guard = self.mutex.try_lock()?;
        Some(TimedGuard {
            guard: Some(guard),
            since: Instant::now(),
            lock: self,
        })
    }

    /// The longest hold so far.
    pub fn longest_hold(&self) -> Duration {
        Duration::from_nanos(self.longest_ns.load(Ordering::Relaxed))
    }

    /// Holds of [`LONG_HOLD`] or longer so far.
    pub fn holds_over_ms(&self) -> u64 {
        self.long_holds.load(Ordering::Relaxed)
    }

    fn record(&self, held: Duration) {
        let ns = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
        self.longest_ns.fetch_max(ns, Ordering::Relaxed);
        if held >= LONG_HOLD {
            self.long_holds.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A hold of a [`TimedLock`]; timed when it ends.
pub(crate) struct TimedGuard<'a, T> {
    /// `None` only once let go.
    guard: Option<MutexGuard<'a, T>>,
    since: Instant,
    lock: &'a TimedLock<T>,
}

impl<T> TimedGuard<'_, T> {
    /// Lets go so that a thread waiting for the lock takes it next, rather than this
    /// thread if it asks again at once (a commit between its pieces of allocation).
    pub fn unlock_fair(mut self) {
        if let Some(g) = self.guard.take() {
            self.lock.record(self.since.elapsed());
            MutexGuard::unlock_fair(g);
        }
    }
}

impl<T> Deref for TimedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard
            .as_deref()
            .expect("a guard is held until dropped")
    }
}

impl<T> DerefMut for TimedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard
            .as_deref_mut()
            .expect("a guard is held until dropped")
    }
}

impl<T> Drop for TimedGuard<'_, T> {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            self.lock.record(self.since.elapsed());
            drop(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a hold is timed from acquisition to release, the longest is kept, and holds of a
    /// millisecond or more are counted, also when let go fairly. (Only lower bounds: a hold
    /// may always take longer on a busy machine.)
    #[test]
    fn holds_are_timed() {
        let l = TimedLock::new(0u32);
        *l.lock() += 1;
        let long = l.holds_over_ms();
        {
            let g = l.lock();
            std::thread::sleep(Duration::from_millis(3));
            drop(g);
        }
        assert!(l.longest_hold() >= Duration::from_millis(3));
        assert_eq!(l.holds_over_ms(), long + 1);
        let g = l.lock();
        std::thread::sleep(LONG_HOLD);
        g.unlock_fair();
        assert_eq!(l.holds_over_ms(), long + 2);
        assert!(l.longest_hold() >= Duration::from_millis(3));
        assert_eq!(*l.lock(), 1);
    }
}
