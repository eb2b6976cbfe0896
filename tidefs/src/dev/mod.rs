//! Block devices: the only place where tidefs touches storage.
//!
//! This module owns the `BlockDevice` trait, the barrier policy, the in-memory and counting
//! devices; `file.rs` the direct-I/O image and block-device backend; `fault.rs` the
//! fault-injecting wrapper; `lock.rs` the one-owner claim on an image; `record.rs` the
//! recording device of the crash harness.
//!
//! Invariants:
//! - `read_at` and `write_at` transfer exactly `buf.len()` bytes or fail;
//! - a write is durable only after a later `flush` has returned, or once `write_durable` of
//!   it has returned;
//! - implementations are shared between threads (`Send + Sync`) and positional, so concurrent
//!   readers never serialise on a file offset;
//! - every method added to the trait after the first four has a default built from them, so a
//!   wrapper that implements only those stays correct (if not as fast).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

mod aligned;
pub mod fault;
mod file;
pub mod lock;
pub mod record;
mod uring;

pub use aligned::AlignedBuf;
pub use file::FileDev;

/// A byte-addressed storage device with a volatile write cache that `flush` empties.
pub trait BlockDevice: Send + Sync {
    /// Reads `buf.len()` bytes at byte `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Writes `buf` at byte `offset`. Not durable until `flush`.
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> std::io::Result<()>;
    /// Size of the device in bytes.
    fn len_bytes(&self) -> u64;

    /// Logical sector size in bytes: the smallest unit the device reads and writes. A write
    /// that covers a sector partly costs the device a read-modify-write of that sector.
    fn sector_size(&self) -> u32 {
        512
    }

    /// Writes several `(offset, bytes)` pieces, as `write_at` each would; where two pieces
    /// overlap, the later one wins. Devices that can (`FileDev`) merge pieces that follow
    /// each other on the device into one transfer and keep several transfers in flight at
    /// once, so callers should pass them sorted by offset. Like `write_at`, nothing is
    /// durable before a flush; when this returns an error, every piece has either been
    /// written or failed.
    fn write_blocks(&self, pieces: &[(u64, &[u8])]) -> std::io::Result<()> {
        for (offset, bytes) in pieces {
            self.write_at(*offset, bytes)?;
        }
        Ok(())
    }

    /// Reads `len` bytes at byte `offset` into a buffer of its own, exactly `len` bytes long,
    /// as `read_at` would into one the caller made. A direct backend (`FileDev` with
    /// `O_DIRECT`) reads a sector-aligned span straight into the buffer it returns, where
    /// `read_at` copies out of one: `Fs::read` reads file data through this, up to a
    /// megabyte at a time.
    fn read_owned(&self, offset: u64, len: usize) -> std::io::Result<AlignedBuf> {
        read_into_new(self, offset, len)
    }

    /// Writes `buf` at `offset` and returns once these bytes are durable. The default (and
    /// `FileDev`) is a write followed by a flush; a device with a cheaper way (a true FUA
    /// write) may override it.
    fn write_durable(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.write_at(offset, buf)?;
        self.flush()
    }
}

/// [`BlockDevice::read_owned`] by way of `read_at`, into a buffer made for it: the default,
/// and what a device that cannot read straight into its own buffer does.
fn read_into_new<D: BlockDevice + ?Sized>(
    dev: &D,
    offset: u64,
    len: usize,
) -> std::io::Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(len);
    dev.read_at(offset, buf.as_mut_slice())?;
    Ok(buf)
}

/// What a flush does, chosen at mount (`-o barrier=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Barrier {
    /// Trust the device's cache flush: `flush` is `fdatasync`, a durable write is followed by
    /// one.
    #[default]
    Flush,
    /// **Unsafe, for benchmarks only**: flushes do nothing and durable writes are plain
    /// writes, so a power cut can leave any subset of recent writes on the disk and a
    /// corrupt file system.
    None,
}

impl Barrier {
    /// Parses `flush` or `none`.
    pub fn parse(text: &str) -> Option<Barrier> {
        match text {
            "flush" => Some(Barrier::Flush),
            "none" => Some(Barrier::None),
            _ => None,
        }
    }

    /// The option value (`flush`, `none`).
    pub fn name(self) -> &'static str {
        match self {
            Barrier::Flush => "flush",
            Barrier::None => "none",
        }
    }
}

/// Counts what a device received: bytes written and read rounded out to whole sectors (the
/// unit the device transfers), the sectors a partial write had to read first, flushes and
/// durable writes. Writes are split into journal and home traffic by the byte ranges the
/// journal occupies on the device ([`CountingDevice::set_journal_ranges`]).
#[derive(Debug, Default)]
pub struct IoCounters {
    /// Bytes written (journal and home).
    pub bytes_written: AtomicU64,
    /// Bytes written inside the journal's ranges.
    pub journal_bytes_written: AtomicU64,
    /// Bytes read, including the sectors read for read-modify-write of partial sectors.
    pub bytes_read: AtomicU64,
    /// Flushes issued.
    pub flushes: AtomicU64,
    /// Durable writes issued (each a write and a flush on `FileDev`).
    pub durable_writes: AtomicU64,
}

impl IoCounters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes written outside the journal's ranges: home locations.
    pub fn home_bytes_written(&self) -> u64 {
        self.bytes_written
            .load(Ordering::Relaxed)
            .saturating_sub(self.journal_bytes_written.load(Ordering::Relaxed))
    }
}

/// The bytes a device of `sector`-byte sectors transfers for `len` bytes at `offset`: the
/// covering whole sectors, and how many of them are partial (read first, then rewritten).
pub fn sector_span(offset: u64, len: usize, sector: u32) -> (u64, u64) {
    if len == 0 {
        return (0, 0);
    }
    let s = u64::from(sector.max(1));
    let end = offset.saturating_add(u64::try_from(len).unwrap_or(u64::MAX));
    let start = offset / s * s;
    let covering = end.div_ceil(s) * s - start;
    let head_partial = offset % s != 0;
    let tail_partial = end % s != 0 && (end / s != offset / s || !head_partial);
    (covering, u64::from(head_partial) + u64::from(tail_partial))
}

/// Size of a regular file, or of a block device (whose metadata length is 0).
fn device_len(file: &std::fs::File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut f = file;
    let len = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(len)
}

fn check_range(offset: u64, len: usize, dev_len: u64) -> std::io::Result<()> {
    let end = u64::try_from(len)
        .ok()
        .and_then(|l| offset.checked_add(l))
        .ok_or_else(|| std::io::Error::other("I/O range overflows"))?;
    if end > dev_len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("I/O at byte {offset}+{len} is past the end of the device ({dev_len} bytes)"),
        ));
    }
    Ok(())
}

/// A device in memory, for tests and for building crash states. Flush does nothing: memory is
/// the durable medium here.
pub struct MemDev {
    bytes: RwLock<Vec<u8>>,
}

impl MemDev {
    /// A zero-filled device of `len` bytes.
    pub fn new(len: usize) -> MemDev {
        MemDev {
            bytes: RwLock::new(vec![0; len]),
        }
    }

    /// A device holding a copy of `bytes`.
    pub fn from_bytes(bytes: Vec<u8>) -> MemDev {
        MemDev {
            bytes: RwLock::new(bytes),
        }
    }

    /// A copy of the whole content.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.read().clone()
    }
}

fn mem_range(offset: u64, len: usize, dev_len: usize) -> std::io::Result<std::ops::Range<usize>> {
    check_range(offset, len, u64::try_from(dev_len).unwrap_or(u64::MAX))?;
    // check_range proved offset + len <= dev_len, so offset fits in usize.
    let start = usize::try_from(offset).map_err(std::io::Error::other)?;
    Ok(start..start + len)
}

impl BlockDevice for MemDev {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let bytes = self.bytes.read();
        let range = mem_range(offset, buf.len(), bytes.len())?;
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let mut bytes = self.bytes.write();
        let range = mem_range(offset, buf.len(), bytes.len())?;
        bytes[range].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn len_bytes(&self) -> u64 {
        u64::try_from(self.bytes.read().len()).unwrap_or(u64::MAX)
    }
}

/// Wraps a device and counts what it received ([`IoCounters`]).
pub struct CountingDevice {
    inner: Arc<dyn BlockDevice>,
    /// Byte ranges of the journal on this device; writes touching them count as journal.
    journal: RwLock<Vec<Range<u64>>>,
    /// The counts.
    pub counters: IoCounters,
}

impl CountingDevice {
    /// Counts the traffic of `inner`; every write counts as home until journal ranges are set.
    pub fn new(inner: Arc<dyn BlockDevice>) -> CountingDevice {
        CountingDevice {
            inner,
            journal: RwLock::new(Vec::new()),
            counters: IoCounters::default(),
        }
    }

    /// Declares the byte ranges the journal occupies on this device (an internal journal's
    /// blocks, or a whole external journal device).
    pub fn set_journal_ranges(&self, ranges: Vec<Range<u64>>) {
        *self.journal.write() = ranges;
    }

    fn count_write(&self, offset: u64, len: usize) {
        let (bytes, partial) = sector_span(offset, len, self.inner.sector_size());
        let c = &self.counters;
        IoCounters::add(&c.bytes_written, bytes);
        IoCounters::add(&c.bytes_read, partial * u64::from(self.inner.sector_size()));
        let end = offset.saturating_add(len as u64);
        if self
            .journal
            .read()
            .iter()
            .any(|r| r.start < end && offset < r.end)
        {
            IoCounters::add(&c.journal_bytes_written, bytes);
        }
    }
}

impl BlockDevice for CountingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)?;
        let (bytes, _) = sector_span(offset, buf.len(), self.inner.sector_size());
        IoCounters::add(&self.counters.bytes_read, bytes);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)?;
        self.count_write(offset, buf.len());
        Ok(())
    }

    fn read_owned(&self, offset: u64, len: usize) -> std::io::Result<AlignedBuf> {
        let buf = self.inner.read_owned(offset, len)?;
        let (bytes, _) = sector_span(offset, len, self.inner.sector_size());
        IoCounters::add(&self.counters.bytes_read, bytes);
        Ok(buf)
    }

    fn flush(&self) -> std::io::Result<()> {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn sector_size(&self) -> u32 {
        self.inner.sector_size()
    }

    fn write_blocks(&self, pieces: &[(u64, &[u8])]) -> std::io::Result<()> {
        self.inner.write_blocks(pieces)?;
        for (offset, bytes) in pieces {
            self.count_write(*offset, bytes.len());
        }
        Ok(())
    }

    fn write_durable(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_durable(offset, buf)?;
        self.count_write(offset, buf.len());
        self.counters.durable_writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memdev_round_trip_and_bounds() {
        let dev = MemDev::new(8192);
        dev.write_at(4000, b"hello").unwrap();
        let mut buf = [0u8; 5];
        dev.read_at(4000, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(dev.read_at(8190, &mut buf).is_err());
        assert!(dev.write_at(u64::MAX, b"x").is_err());
    }

    #[test]
    fn filedev_round_trip_and_bounds() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.as_file().set_len(4096).unwrap();
        let dev = FileDev::open(tmp.path(), false).unwrap();
        dev.write_at(10, b"abc").unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 3];
        dev.read_at(10, &mut buf).unwrap();
        assert_eq!(&buf, b"abc");
        assert!(dev.write_at(4095, b"ab").is_err());
    }

    /// Goal: the counters report what the device received: whole sectors, the partial sectors
    /// read first, journal and home apart, flushes and durable writes. Method: a counting
    /// wrapper over a memory device (512-byte sectors) with one journal range.
    #[test]
    fn counting_device_counts_what_the_device_received() {
        let counted = CountingDevice::new(Arc::new(MemDev::new(65536)));
        counted.set_journal_ranges(vec![32768..49152, 49152..65536]);
        counted.write_at(0, b"xyz").unwrap();
        counted.write_at(1000, &[1u8; 100]).unwrap();
        counted
            .write_blocks(&[(4096, &[2u8; 4096]), (8192, &[3u8; 4096])])
            .unwrap();
        counted.write_durable(32768, &[4u8; 4096]).unwrap();
        counted.flush().unwrap();
        let c = &counted.counters;
        let home = 512 + 1024 + 8192;
        assert_eq!(c.bytes_written.load(Ordering::Relaxed), home + 4096);
        assert_eq!(c.journal_bytes_written.load(Ordering::Relaxed), 4096);
        assert_eq!(c.home_bytes_written(), home);
        // "xyz" and both ends of the 100 bytes at 1000 are partial sectors.
        assert_eq!(c.bytes_read.load(Ordering::Relaxed), 3 * 512);
        // A read into the device's own buffer counts its whole sectors too.
        let owned = counted.read_owned(4096, 4097).unwrap();
        assert_eq!(&owned.as_slice()[..4096], &[2u8; 4096][..]);
        assert_eq!(owned.as_slice()[4096], 3);
        assert_eq!(c.bytes_read.load(Ordering::Relaxed), 3 * 512 + 4096 + 512);
        assert_eq!(c.flushes.load(Ordering::Relaxed), 1);
        assert_eq!(c.durable_writes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn sector_span_covers_and_counts_partial_sectors() {
        assert_eq!(sector_span(0, 512, 512), (512, 0));
        assert_eq!(sector_span(10, 3, 512), (512, 1));
        assert_eq!(sector_span(500, 30, 512), (1024, 2));
        assert_eq!(sector_span(0, 1024, 4096), (4096, 1));
        assert_eq!(sector_span(4096, 0, 512), (0, 0));
    }

    #[test]
    fn barrier_names_round_trip() {
        for b in [Barrier::Flush, Barrier::None] {
            assert_eq!(Barrier::parse(b.name()), Some(b));
        }
        assert_eq!(Barrier::parse("fua"), None);
    }
}
