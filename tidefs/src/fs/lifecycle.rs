//! Whether the file system still takes operations, and how many operations that may change it
//! are running: unmount closes it, then waits for those to finish before its final commit, so
//! no change lands after the commit that was meant to be the last (docs/DESIGN.md §4.6).
//!
//! An operation enters ([`Lifecycle::enter`]) before it looks at anything and leaves when its
//! guard drops. Entering raises the count and then reads the flag; closing sets the flag and
//! then reads the count (both sequentially consistent), so either the operation sees the file
//! system closed, or the closer sees it running and waits for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Open or closed, and the operations running.
#[derive(Default)]
pub(crate) struct Lifecycle {
    closed: AtomicBool,
    running: AtomicUsize,
    /// Wakes [`Lifecycle::wait_idle`] when the last operation leaves a closed file system.
    idle: (Mutex<()>, Condvar),
}

/// One running operation; it leaves when dropped.
#[must_use = "the operation leaves when this drops"]
pub(crate) struct Running<'a>(&'a Lifecycle);

impl Lifecycle {
    /// Whether the file system is closed (unmounted or crashed).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Closes the file system; false when it was closed already.
    pub fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::SeqCst)
    }

    /// Counts an operation as running, unless the file system is closed.
    pub fn enter(&self) -> Option<Running<'_>> {
        self.running.fetch_add(1, Ordering::SeqCst);
        let guard = Running(self);
        (!self.is_closed()).then_some(guard)
    }

    /// Operations running now.
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Waits until no operation is running (after [`Lifecycle::close`], none starts).
    pub fn wait_idle(&self) {
        let mut g = self.idle.0.lock();
        while self.running.load(Ordering::SeqCst) != 0 {
            // The timeout only guards against a missed wake-up; `Running::drop` notifies
            // under the same mutex.
            self.idle.1.wait_for(&mut g, Duration::from_millis(10));
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let l = self.0;
        if l.running.fetch_sub(1, Ordering::SeqCst) == 1 && l.is_closed() {
            let _g = l.idle.0.lock();
            l.idle.1.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_closed_file_system_takes_no_operation() {
        let l = Lifecycle::default();
        assert!(l.enter().is_some());
        assert!(l.close());
        assert!(!l.close(), "closed once");
        assert!(l.enter().is_none());
        l.wait_idle();
    }

    #[test]
    fn closing_waits_for_the_operations_running() {
        let l = Arc::new(Lifecycle::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let op = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let _r = l.enter().expect("open");
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                l.running.load(Ordering::SeqCst)
            })
        };
        rx.recv().unwrap();
        assert!(l.close());
        l.wait_idle();
        assert_eq!(l.running.load(Ordering::SeqCst), 0);
        // The operation was still running when it looked, and wait_idle returned after.
        assert_eq!(op.join().unwrap(), 1);
    }
}
