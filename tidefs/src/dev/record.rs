//! A block device that records every write and flush, for crash tests (docs/DESIGN.md §6).
//!
//! The device either keeps an in-memory image ([`RecordingDevice::new`]: it starts as a copy of
//! a base image and every write is applied to it at once, so the file system above reads its
//! own writes as on a real disk) or passes every read, write and flush through to another
//! device ([`RecordingDevice::over`], for example an image file through `FileDev`), so crash
//! states can be built from what the real I/O path did. Either way every write (offset and
//! bytes) and every flush is also appended to a log, in the order the device saw them. The
//! workload adds markers to the same log ("fsync of X returned here") so the crash harness
//! knows, for any position in the log, which promises had been made before it.
//!
//! Invariants:
//! - the log is append-only; a position returned by [`RecordingDevice::mark`] or
//!   [`RecordingDevice::position`] stays valid for the life of the device;
//! - `base + every write in the log, in order` equals the current content (over another
//!   device: as long as nothing else writes that device);
//! - a write or flush is logged only once the device below has done it;
//! - one mutex guards content and log together (and is held across the I/O of a device
//!   below), so the log order is the order in which the writes became visible to readers.

use std::sync::Arc;

use parking_lot::Mutex;

use super::BlockDevice;

/// One entry of the write log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEntry {
    /// `data` was written at byte `offset`.
    Write {
        /// Byte offset on the device.
        offset: u64,
        /// The bytes written.
        data: Arc<[u8]>,
    },
    /// A flush returned: every write before it is durable.
    Flush,
    /// A marker placed by the workload (for example "fsync of X returned"); writes nothing.
    Marker(u64),
}

/// What a recording device saw: the image it started from and its log.
#[derive(Clone, Debug)]
pub struct Recording {
    /// The content of the device before the first logged write.
    pub base: Arc<Vec<u8>>,
    /// Every write, flush and marker, in order.
    pub log: Vec<LogEntry>,
}

struct RecState {
    /// Current content: `base` with every logged write applied; empty when the device passes
    /// through to `below`. [state]
    content: Vec<u8>,
    /// Writes, flushes and markers in order. [state]
    log: Vec<LogEntry>,
}

/// A thread-safe device that logs every write and flush: in memory, or over another device.
pub struct RecordingDevice {
    base: Arc<Vec<u8>>,
    /// The device every read, write and flush goes to (`None`: the in-memory `content`).
    below: Option<Arc<dyn BlockDevice>>,
    state: Mutex<RecState>,
}

impl RecordingDevice {
    /// A device whose content starts as a copy of `base`.
    pub fn new(base: Arc<Vec<u8>>) -> RecordingDevice {
        let content = base.as_ref().clone();
        RecordingDevice {
            base,
            below: None,
            state: Mutex::new(RecState {
                content,
                log: Vec::new(),
            }),
        }
    }

    /// A device that passes everything through to `below` and logs it; the base is what
    /// `below` holds now (read whole, so meant for test-sized images).
    pub fn over(below: Arc<dyn BlockDevice>) -> std::io::Result<RecordingDevice> {
        let len = usize::try_from(below.len_bytes()).map_err(std::io::Error::other)?;
        let mut base = vec![0u8; len];
        below.read_at(0, &mut base)?;
        Ok(RecordingDevice {
            base: Arc::new(base),
            below: Some(below),
            state: Mutex::new(RecState {
                content: Vec::new(),
                log: Vec::new(),
            }),
        })
    }

    /// Appends marker `id` to the log and returns its position (the index of the marker entry):
    /// every entry before it had happened when the marker was placed.
    pub fn mark(&self, id: u64) -> usize {
        let mut s = self.state.lock();
        s.log.push(LogEntry::Marker(id));
        s.log.len() - 1
    }

    /// The number of log entries so far.
    pub fn position(&self) -> usize {
        self.state.lock().log.len()
    }

    /// A copy of the log entries from position `from` on (cheaper than [`Self::recording`]
    /// when only the tail is needed).
    pub fn log_since(&self, from: usize) -> Vec<LogEntry> {
        let s = self.state.lock();
        s.log
            .get(from..)
            .map_or_else(Vec::new, <[LogEntry]>::to_vec)
    }

    /// A copy of the base image and of the log so far.
    pub fn recording(&self) -> Recording {
        Recording {
            base: self.base.clone(),
            log: self.state.lock().log.clone(),
        }
    }

    /// A copy of the current content (read back from the device below, if any).
    pub fn content(&self) -> std::io::Result<Vec<u8>> {
        let s = self.state.lock();
        match &self.below {
            None => Ok(s.content.clone()),
            Some(below) => {
                let mut out = vec![0u8; self.base.len()];
                below.read_at(0, &mut out)?;
                Ok(out)
            }
        }
    }
}

fn range(offset: u64, len: usize, dev_len: usize) -> std::io::Result<std::ops::Range<usize>> {
    let start = usize::try_from(offset).map_err(std::io::Error::other)?;
    let end = start
        .checked_add(len)
        .filter(|&e| e <= dev_len)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "I/O at byte {offset}+{len} is past the end of the device ({dev_len} bytes)"
                ),
            )
        })?;
    Ok(start..end)
}

impl BlockDevice for RecordingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let s = self.state.lock();
        if let Some(below) = &self.below {
            return below.read_at(offset, buf);
        }
        let r = range(offset, buf.len(), s.content.len())?;
        buf.copy_from_slice(&s.content[r]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let mut s = self.state.lock();
        match &self.below {
            Some(below) => below.write_at(offset, buf)?,
            None => {
                let r = range(offset, buf.len(), s.content.len())?;
                s.content[r].copy_from_slice(buf);
            }
        }
        s.log.push(LogEntry::Write {
            offset,
            data: Arc::from(buf),
        });
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        let mut s = self.state.lock();
        if let Some(below) = &self.below {
            below.flush()?;
        }
        s.log.push(LogEntry::Flush);
        Ok(())
    }

    fn len_bytes(&self) -> u64 {
        u64::try_from(self.base.len()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_writes_flushes_and_markers_in_order() {
        let dev = RecordingDevice::new(Arc::new(vec![0u8; 4096]));
        dev.write_at(10, b"abc").unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.mark(7), 2);
        dev.write_at(11, b"Z").unwrap();
        let mut buf = [0u8; 3];
        dev.read_at(10, &mut buf).unwrap();
        assert_eq!(&buf, b"aZc");
        assert!(dev.write_at(4095, b"xy").is_err());
        let rec = dev.recording();
        assert_eq!(rec.log.len(), 4);
        assert_eq!(rec.log[1], LogEntry::Flush);
        assert_eq!(rec.log[2], LogEntry::Marker(7));
        assert!(rec.base.iter().all(|&b| b == 0));
        assert_eq!(dev.position(), 4);
    }

    #[test]
    fn over_another_device_passes_through_and_logs_the_same() {
        // Goal: a recording over a device logs what reached that device, so base + log equals
        // the device's content. Method: record over a MemDev, compare with its bytes.
        let below = Arc::new(crate::dev::MemDev::from_bytes(vec![7u8; 4096]));
        let dev = RecordingDevice::over(below.clone()).unwrap();
        dev.write_at(100, b"xyz").unwrap();
        dev.flush().unwrap();
        dev.write_at(101, b"Q").unwrap();
        let mut buf = [0u8; 3];
        dev.read_at(100, &mut buf).unwrap();
        assert_eq!(&buf, b"xQz");
        assert!(
            dev.write_at(4095, b"xy").is_err(),
            "past the end of the device below"
        );
        let rec = dev.recording();
        assert_eq!(rec.log.len(), 3, "the failed write is not logged");
        assert!(rec.base.iter().all(|&b| b == 7));
        let mut replayed = rec.base.as_ref().clone();
        for e in &rec.log {
            if let LogEntry::Write { offset, data } = e {
                let at = usize::try_from(*offset).unwrap();
                replayed[at..at + data.len()].copy_from_slice(data);
            }
        }
        assert_eq!(replayed, below.to_bytes());
        assert_eq!(dev.content().unwrap(), below.to_bytes());
    }
}
