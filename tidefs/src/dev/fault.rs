//! A fault-injecting device: wraps another device and makes chosen reads, writes or flushes fail,
//! for tests of every error path above it.
//!
//! A [`Fault`] names which operation fails (read, write, flush), which occurrence of it counting
//! from when the fault was injected (`after`: that many matching calls succeed first), an optional
//! byte range the operation must touch to count, how many times it fires (`times`, `None` for
//! every later match: a dead device), and for writes whether a prefix of the buffer still lands
//! before the error (a short write, as a power cut or a failing sector produces).
//!
//! Invariants:
//! - a failed operation returns an `io::Error` of kind `Other` whose message says it was
//!   injected, and (except for a short write's prefix) has no effect on the inner device;
//! - faults are matched in the order they were injected; the first that fires decides;
//! - counters count every call, failed or not, so tests can aim a fault at "the Nth write".

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use super::BlockDevice;

/// The device operation a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// `read_at`.
    Read,
    /// `write_at`.
    Write,
    /// `flush`.
    Flush,
}

/// One planned failure.
#[derive(Clone, Debug)]
pub struct Fault {
    /// Which operation fails.
    pub op: FaultOp,
    /// Matching calls that still succeed before the first failure.
    pub after: u64,
    /// Only calls whose byte range overlaps this one match (ignored for flushes).
    pub range: Option<Range<u64>>,
    /// How many matching calls fail; `None`: every one from then on.
    pub times: Option<u64>,
    /// Writes only: bytes of the buffer written to the inner device before the error.
    pub short_prefix: Option<usize>,
    /// Once this fault fires, every later write and flush fails too: power was cut there.
    pub then_dead: bool,
}

impl Fault {
    /// The `n`th (0-based) call of `op` from now fails, once.
    pub fn nth(op: FaultOp, n: u64) -> Fault {
        Fault {
            op,
            after: n,
            range: None,
            times: Some(1),
            short_prefix: None,
            then_dead: false,
        }
    }

    /// Every call of `op` from the `n`th (0-based) on fails: the device died.
    pub fn from_nth(op: FaultOp, n: u64) -> Fault {
        Fault {
            times: None,
            ..Fault::nth(op, n)
        }
    }

    /// Every call of `op` touching bytes `range` fails (a bad region).
    pub fn range(op: FaultOp, range: Range<u64>) -> Fault {
        Fault {
            op,
            after: 0,
            range: Some(range),
            times: None,
            short_prefix: None,
            then_dead: false,
        }
    }

    /// Fires once, on the `n`th (0-based) call touching `range`.
    pub fn nth_in_range(op: FaultOp, range: Range<u64>, n: u64) -> Fault {
        Fault {
            after: n,
            times: Some(1),
            ..Fault::range(op, range)
        }
    }

    /// Makes the device dead after this fault fires: nothing written later lands, as at a
    /// power cut.
    pub fn then_dead(mut self) -> Fault {
        self.then_dead = true;
        self
    }

    /// Makes a write fault land the first `bytes` of its buffer before failing.
    pub fn short(mut self, bytes: usize) -> Fault {
        self.short_prefix = Some(bytes);
        self
    }
}

/// A fault and how far it got.
struct Armed {
    fault: Fault,
    /// Matching calls seen so far.
    seen: u64,
    /// Failures produced so far.
    fired: u64,
}

/// Call counters of a [`FaultDev`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// `read_at` calls.
    pub reads: u64,
    /// `write_at` calls.
    pub writes: u64,
    /// `flush` calls.
    pub flushes: u64,
    /// Calls that failed by injection.
    pub injected: u64,
    /// A `then_dead` fault fired: writes and flushes fail from then on.
    pub dead: bool,
}

/// A device that fails the operations its faults name.
pub struct FaultDev {
    inner: Arc<dyn BlockDevice>,
    /// Faults in injection order, and the counters.
    state: Mutex<(Vec<Armed>, FaultCounts)>,
}

impl FaultDev {
    /// Wraps `inner` with no fault planned.
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultDev {
        FaultDev {
            inner,
            state: Mutex::new((Vec::new(), FaultCounts::default())),
        }
    }

    /// Plans a failure; its counts start now.
    pub fn inject(&self, fault: Fault) {
        self.state.lock().0.push(Armed {
            fault,
            seen: 0,
            fired: 0,
        });
    }

    /// Removes every planned failure (the device is healthy again).
    pub fn heal(&self) {
        let mut state = self.state.lock();
        state.0.clear();
        state.1.dead = false;
    }

    /// Calls so far.
    pub fn counts(&self) -> FaultCounts {
        self.state.lock().1
    }

    /// Counts the call and decides whether it fails; returns the matching fault if so.
    fn check(&self, op: FaultOp, span: Option<Range<u64>>) -> Option<Fault> {
        let mut state = self.state.lock();
        let (faults, counts) = &mut *state;
        match op {
            FaultOp::Read => counts.reads += 1,
            FaultOp::Write => counts.writes += 1,
            FaultOp::Flush => counts.flushes += 1,
        }
        if counts.dead && op != FaultOp::Read {
            counts.injected += 1;
            return Some(Fault::from_nth(op, 0));
        }
        for armed in faults.iter_mut() {
            let f = &armed.fault;
            if f.op != op {
                continue;
            }
            if let (Some(want), Some(got)) = (&f.range, &span) {
                if got.end <= want.start || want.end <= got.start {
                    continue;
                }
            }
            armed.seen += 1;
            if armed.seen <= f.after {
                continue;
            }
            if f.times.is_some_and(|t| armed.fired >= t) {
                continue;
            }
            armed.fired += 1;
            counts.injected += 1;
            counts.dead |= f.then_dead;
            return Some(f.clone());
        }
        None
    }
}

fn injected(op: FaultOp, offset: Option<u64>) -> std::io::Error {
    match offset {
        Some(at) => std::io::Error::other(format!("injected {op:?} failure at byte {at}")),
        None => std::io::Error::other(format!("injected {op:?} failure")),
    }
}

fn span(offset: u64, len: usize) -> Range<u64> {
    offset..offset.saturating_add(u64::try_from(len).unwrap_or(u64::MAX))
}

impl BlockDevice for FaultDev {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self
            .check(FaultOp::Read, Some(span(offset, buf.len())))
            .is_some()
        {
            return Err(injected(FaultOp::Read, Some(offset)));
        }
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        match self.check(FaultOp::Write, Some(span(offset, buf.len()))) {
            None => self.inner.write_at(offset, buf),
            Some(f) => {
                if let Some(n) = f.short_prefix {
                    let n = n.min(buf.len());
                    self.inner.write_at(offset, &buf[..n])?;
                }
                Err(injected(FaultOp::Write, Some(offset)))
            }
        }
    }

    fn flush(&self) -> std::io::Result<()> {
        if self.check(FaultOp::Flush, None).is_some() {
            return Err(injected(FaultOp::Flush, None));
        }
        self.inner.flush()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn sector_size(&self) -> u32 {
        self.inner.sector_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDev;

    #[test]
    fn nth_write_fails_once_and_leaves_the_device_untouched() {
        let dev = FaultDev::new(Arc::new(MemDev::new(4096)));
        dev.inject(Fault::nth(FaultOp::Write, 1));
        dev.write_at(0, b"a").unwrap();
        assert!(dev.write_at(1, b"b").is_err());
        dev.write_at(2, b"c").unwrap();
        let mut buf = [0u8; 3];
        dev.read_at(0, &mut buf).unwrap();
        assert_eq!(&buf, b"a\0c");
        let c = dev.counts();
        assert_eq!((c.writes, c.reads, c.injected), (3, 1, 1));
    }

    #[test]
    fn range_faults_match_only_overlapping_calls() {
        let dev = FaultDev::new(Arc::new(MemDev::new(4096)));
        dev.inject(Fault::range(FaultOp::Read, 1024..2048));
        let mut buf = [0u8; 16];
        dev.read_at(0, &mut buf).unwrap();
        dev.read_at(2048, &mut buf).unwrap();
        assert!(dev.read_at(1020, &mut buf).is_err());
        assert!(dev.read_at(2040, &mut buf).is_err());
        dev.heal();
        dev.read_at(1500, &mut buf).unwrap();
    }

    #[test]
    fn dead_device_fails_every_flush_and_short_write_lands_a_prefix() {
        let dev = FaultDev::new(Arc::new(MemDev::new(4096)));
        dev.inject(Fault::from_nth(FaultOp::Flush, 0));
        dev.inject(Fault::nth(FaultOp::Write, 0).short(2));
        assert!(dev.flush().is_err());
        assert!(dev.flush().is_err());
        assert!(dev.write_at(100, b"wxyz").is_err());
        let mut buf = [0u8; 4];
        dev.read_at(100, &mut buf).unwrap();
        assert_eq!(&buf, b"wx\0\0");
    }
}
