//! tidefs patch: how many requests of each kind a session served.
//!
//! A [`RequestCounts`] given to a session in [`crate::Config::request_counts`] is counted up by
//! every session thread before it dispatches a request (one relaxed atomic add), and can be
//! read at any time from elsewhere, e.g. a control socket's statistics.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use crate::ll::fuse_abi::fuse_opcode;

/// Opcodes below this are counted one by one; others (CUSE) share the last slot.
const SLOTS: usize = 64;

/// Requests served by opcode, and how many of them came through FUSE over io_uring; clones
/// share the counters.
#[derive(Clone)]
pub struct RequestCounts(Arc<[AtomicU64; SLOTS]>, Arc<AtomicU64>);

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts(
            Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
            Arc::new(AtomicU64::new(0)),
        )
    }
}

impl RequestCounts {
    /// Counts one request with `opcode`.
    pub(crate) fn add(&self, opcode: u32) {
        let slot = usize::try_from(opcode).map_or(SLOTS - 1, |o| o.min(SLOTS - 1));
        self.0[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request that came through an io_uring queue (also counted by [`Self::add`]).
    pub(crate) fn add_uring(&self) {
        self.1.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests that came through FUSE over io_uring so far.
    pub fn over_uring(&self) -> u64 {
        self.1.load(Ordering::Relaxed)
    }

    /// The kinds served so far and how many of each, by opcode: the kernel's name without its
    /// `FUSE_` prefix (`WRITE`, `GETATTR`, ...), or `OPCODE_<n>` for one this crate does not
    /// know.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (slot, count) in self.0.iter().enumerate() {
            let n = count.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let opcode = u32::try_from(slot).unwrap_or(u32::MAX);
            let name = match fuse_opcode::try_from(opcode) {
                Ok(op) => format!("{op:?}").trim_start_matches("FUSE_").to_string(),
                Err(_) => format!("OPCODE_{opcode}"),
            };
            out.push((name, n));
        }
        out
    }
}

impl fmt::Debug for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.snapshot()).finish()
    }
}

/// Two handles are equal when they share their counters (`Config` is `Eq`).
impl PartialEq for RequestCounts {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RequestCounts {}
