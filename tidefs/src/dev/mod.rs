//! Block devices: the only place where tidefs touches storage.
//!
//! Invariants:
//! - `read_at` and `write_at` transfer exactly `buf.len()` bytes or fail;
//! - a write is durable only after a later `flush` has returned;
//! - implementations are shared between threads (`Send + Sync`) and positional, so concurrent
//!   readers never serialise on a file offset.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

pub mod fault;
pub mod lock;
pub mod record;

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
}

/// Counts bytes and flushes that went through a device; shared by the stats of the layers above.
#[derive(Debug, Default)]
pub struct IoCounters {
    /// Bytes written.
    pub bytes_written: AtomicU64,
    /// Bytes read.
    pub bytes_read: AtomicU64,
    /// Flushes issued.
    pub flushes: AtomicU64,
}

impl IoCounters {
    fn add(counter: &AtomicU64, n: usize) {
        // usize always fits in u64 on the platforms tidefs supports (Linux, 64-bit).
        counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// An image file or a block device node, accessed with positional reads and writes.
pub struct FileDev {
    file: File,
    len: u64,
}

impl FileDev {
    /// Opens `path` for reading, and for writing unless `read_only`, and claims it
    /// ([`lock`]): exclusively for writing (a writable block device with `O_EXCL`), shared for
    /// reading. A claimed, or kernel-mounted, image fails with `ErrorKind::ResourceBusy` and a
    /// message naming the holder.
    pub fn open(path: &Path, read_only: bool) -> std::io::Result<FileDev> {
        let file = lock::open_claimed(path, !read_only)?;
        let len = device_len(&file)?;
        Ok(FileDev { file, len })
    }
}

/// Size of a regular file, or of a block device (whose metadata length is 0).
fn device_len(file: &File) -> std::io::Result<u64> {
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

impl BlockDevice for FileDev {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    fn len_bytes(&self) -> u64 {
        self.len
    }
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

/// Wraps a device and counts the bytes and flushes that pass through it.
pub struct CountingDevice {
    inner: Arc<dyn BlockDevice>,
    /// The counts.
    pub counters: IoCounters,
}

impl CountingDevice {
    /// Counts the traffic of `inner`.
    pub fn new(inner: Arc<dyn BlockDevice>) -> CountingDevice {
        CountingDevice {
            inner,
            counters: IoCounters::default(),
        }
    }
}

impl BlockDevice for CountingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)?;
        IoCounters::add(&self.counters.bytes_read, buf.len());
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)?;
        IoCounters::add(&self.counters.bytes_written, buf.len());
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
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
        let counted = CountingDevice::new(Arc::new(dev));
        counted.write_at(0, b"xyz").unwrap();
        counted.flush().unwrap();
        assert_eq!(counted.counters.bytes_written.load(Ordering::Relaxed), 3);
        assert_eq!(counted.counters.flushes.load(Ordering::Relaxed), 1);
    }
}
