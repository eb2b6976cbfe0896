//! `FileDev`: an image file or a block-device node, read and written with direct I/O.
//!
//! The device is opened with `O_DIRECT` so that what tidefs writes is what the device receives:
//! no host page cache merges, delays or splits the writes, and a flush (`fdatasync`) only has to
//! empty the disk's own write cache. Where the host refuses `O_DIRECT` (tmpfs, some FUSE file
//! systems, an image whose length is not a whole number of sectors), the device falls back to
//! buffered I/O and logs that once, naming the path and the reason.
//!
//! Direct I/O moves whole logical sectors from sector-aligned memory. Every transfer therefore
//! goes through an [`AlignedBuf`]; a write that does not cover whole sectors reads the sectors
//! it touches partly, patches them and writes them back (read-modify-write) while holding the
//! lock stripes of those sectors, so two writers of neighbouring bytes of one sector never lose
//! each other's bytes.
//!
//! Invariants:
//! - in direct mode every `pread`/`pwrite` covers whole sectors at a sector-aligned offset from
//!   memory aligned to [`MEMORY_ALIGN`](super::aligned::MEMORY_ALIGN);
//! - a partial sector is only ever written back while its stripe lock is held, from a copy read
//!   under that same lock;
//! - with [`Barrier::None`] nothing is ever flushed: for benchmarks only.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt as _, FileTypeExt as _};
use std::path::Path;

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::aligned::AlignedBuf;
use super::uring::UringWriter;
use super::{check_range, lock, Barrier, BlockDevice};

/// Number of lock stripes that serialise read-modify-write of partial sectors.
const RMW_STRIPES: usize = 64;

/// Largest run `write_blocks` gathers into one `pwrite`.
const MAX_MERGED_BYTES: usize = 4 << 20;

/// Most transfers `write_blocks` keeps in flight at once: the caller and the device's pool
/// of writer threads.
const PARALLEL_WRITES: usize = 8;

/// An image file or a block device node.
pub struct FileDev {
    file: Arc<File>,
    len: u64,
    /// Logical sector size: the unit of direct transfers.
    sector: u32,
    /// `O_DIRECT` is on; otherwise the page cache sits between tidefs and the device.
    direct: bool,
    barrier: Barrier,
    /// Stripe `s` guards read-modify-write of every sector whose index is `s` modulo the
    /// stripe count.
    rmw: Vec<Mutex<()>>,
    /// Threads that write the runs of a batch beside the caller ([`FileDev::write_runs`]).
    writers: WriterPool,
    /// io_uring rings that write a batch in one system call, where the host allows it.
    uring: Option<UringWriter>,
}

impl FileDev {
    /// Opens `path` for reading, and for writing unless `read_only`, and claims it
    /// ([`lock`]): exclusively for writing (a writable block device with `O_EXCL`), shared for
    /// reading. A claimed, or kernel-mounted, image fails with `ErrorKind::ResourceBusy` and a
    /// message naming the holder. Flushes follow [`Barrier::Flush`].
    pub fn open(path: &Path, read_only: bool) -> io::Result<FileDev> {
        FileDev::open_with(path, read_only, Barrier::Flush)
    }

    /// [`FileDev::open`] with a chosen barrier policy.
    pub fn open_with(path: &Path, read_only: bool, barrier: Barrier) -> io::Result<FileDev> {
        let file = Arc::new(lock::open_claimed(path, !read_only)?);
        let len = super::device_len(&file)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        let sector = sector_size(&file, block_device);
        let direct = match enable_direct(&file, len, sector) {
            Ok(()) => true,
            Err(why) => {
                log::info!(
                    "{}: direct I/O not available ({why}); using buffered I/O",
                    path.display()
                );
                false
            }
        };
        if barrier == Barrier::None && !read_only {
            log::warn!(
                "{}: barrier=none: flushes are skipped, a power cut can corrupt the file system",
                path.display()
            );
        }
        Ok(FileDev {
            file,
            len,
            sector,
            direct,
            barrier,
            rmw: (0..RMW_STRIPES).map(|_| Mutex::new(())).collect(),
            writers: WriterPool::start(if read_only { 0 } else { PARALLEL_WRITES - 1 }),
            uring: if read_only { None } else { start_uring(path) },
        })
    }

    /// True when the device is read and written with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn sector_u64(&self) -> u64 {
        u64::from(self.sector)
    }

    /// The sector-aligned span `[start, end)` covering `offset..offset + len`.
    fn covering(&self, offset: u64, len: usize) -> (u64, u64) {
        let s = self.sector_u64();
        let end = offset + len as u64;
        (offset / s * s, end.div_ceil(s) * s)
    }

    fn aligned(&self, offset: u64, len: usize) -> bool {
        offset % self.sector_u64() == 0 && len as u64 % self.sector_u64() == 0
    }

    /// Reads the aligned span `[start, end)` into a fresh aligned buffer.
    fn read_span(&self, start: u64, end: u64) -> io::Result<AlignedBuf> {
        let len = usize::try_from(end - start).map_err(io::Error::other)?;
        let mut buf = AlignedBuf::zeroed(len);
        self.file.read_exact_at(buf.as_mut_slice(), start)?;
        Ok(buf)
    }

    /// Writes `bytes` at `offset` (aligned in direct mode); `durable` makes it durable before
    /// returning. That is a write and a flush, not `pwritev2(RWF_DSYNC)`: on a block device
    /// Linux follows a DSYNC write with a cache flush of its own (`generic_write_sync`), and a
    /// device without FUA (a loop device) also gets the FUA emulated by one more flush, so
    /// DSYNC cost three flushes per commit where write + flush costs two (measured on loop
    /// devices with `/sys/block/loopN/stat`).
    fn write_raw(&self, offset: u64, bytes: &[u8], durable: bool) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)?;
        if durable && self.barrier == Barrier::Flush {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Writes `buf` at `offset`, through read-modify-write of partial sectors in direct mode.
    fn write_any(&self, offset: u64, buf: &[u8], durable: bool) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.direct {
            return self.write_raw(offset, buf, durable);
        }
        if self.aligned(offset, buf.len()) {
            let a = AlignedBuf::from_pieces(buf.len(), [buf]);
            return self.write_raw(offset, a.as_slice(), durable);
        }
        let (start, end) = self.covering(offset, buf.len());
        let s = self.sector_u64();
        // Lock the stripes of the first and last sector (the only partial ones), in stripe
        // order so that two writers never wait for each other in a cycle.
        let first = usize::try_from(start / s % RMW_STRIPES as u64).unwrap_or(0);
        let last = usize::try_from((end / s - 1) % RMW_STRIPES as u64).unwrap_or(0);
        let (lo, hi) = (first.min(last), first.max(last));
        let _lo = self.rmw[lo].lock();
        let _hi = (hi != lo).then(|| self.rmw[hi].lock());
        let mut span = self.read_span(start, end)?;
        let at = usize::try_from(offset - start).map_err(io::Error::other)?;
        span.as_mut_slice()[at..at + buf.len()].copy_from_slice(buf);
        self.write_raw(start, span.as_slice(), durable)
    }
}

impl FileDev {
    /// Writes runs that do not touch each other, several at once: the pool's threads take
    /// all but the first, which the caller writes, so the device works on up to
    /// [`PARALLEL_WRITES`] transfers together instead of waiting for each in turn (a commit's
    /// file data and log body, a checkpoint's scattered home blocks). The first error is
    /// returned once every run has finished, so no write is still in flight when the caller
    /// learns of it.
    fn write_runs(&self, mut runs: Vec<(u64, AlignedBuf)>) -> io::Result<()> {
        if runs.len() <= 1 || overlapping(&runs) || self.writers.is_empty() {
            // Overlapping runs keep their order: the later one must land last.
            for (offset, buf) in &runs {
                self.write_raw(*offset, buf.as_slice(), false)?;
            }
            return Ok(());
        }
        if let Some(uring) = &self.uring {
            match uring.write_runs(&self.file, runs) {
                Ok(result) => return result,
                // Every ring busy: the threads write this batch.
                Err(back) => runs = back,
            }
        }
        let first = runs.swap_remove(0);
        let batch = Arc::new(Batch::new(runs.len()));
        for (offset, buf) in runs {
            let job = WriteJob {
                file: Arc::clone(&self.file),
                offset,
                buf,
                batch: Arc::clone(&batch),
            };
            // No worker left (they only stop when the device is dropped): write it here.
            if let Err(job) = self.writers.submit(job) {
                job.run();
            }
        }
        let result = self.write_raw(first.0, first.1.as_slice(), false);
        result.and(batch.wait())
    }
}

/// The device's io_uring rings, or `None` (logged once, with the reason) where the host
/// refuses io_uring; batches then go to the writer threads.
fn start_uring(path: &Path) -> Option<UringWriter> {
    match UringWriter::new() {
        Ok(u) => Some(u),
        Err(e) => {
            log::info!(
                "{}: io_uring not available ({e}); batches of writes use threads",
                path.display()
            );
            None
        }
    }
}

/// The runs of one [`FileDev::write_runs`] call that the pool writes: the caller sleeps until
/// the last of them is written and is woken once, by the thread that wrote it.
struct Batch {
    /// Runs not yet written, and the first error among those written.
    state: Mutex<(usize, io::Result<()>)>,
    finished: Condvar,
}

impl Batch {
    fn new(runs: usize) -> Batch {
        Batch {
            state: Mutex::new((runs, Ok(()))),
            finished: Condvar::new(),
        }
    }

    /// One run is written, with result `r`.
    fn done(&self, r: io::Result<()>) {
        let mut s = self.state.lock();
        s.0 -= 1;
        if s.1.is_ok() {
            s.1 = r;
        }
        if s.0 == 0 {
            self.finished.notify_one();
        }
    }

    /// Waits for every run; the first error, if any.
    fn wait(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        while s.0 > 0 {
            self.finished.wait(&mut s);
        }
        std::mem::replace(&mut s.1, Ok(()))
    }
}

/// One run for a [`WriterPool`] thread, and the batch it belongs to.
struct WriteJob {
    file: Arc<File>,
    offset: u64,
    buf: AlignedBuf,
    batch: Arc<Batch>,
}

impl WriteJob {
    fn run(self) {
        let r = self.file.write_all_at(self.buf.as_slice(), self.offset);
        self.batch.done(r);
    }
}

/// The jobs waiting for a [`WriterPool`] thread.
#[derive(Default)]
struct PoolQueue {
    jobs: VecDeque<WriteJob>,
    /// The device is gone: the threads stop once the queue is empty.
    closed: bool,
}

/// What a [`WriterPool`] and its threads share: a queue under a lock, and a condition
/// variable on which idle threads sleep (a job wakes one of them, nothing else).
#[derive(Default)]
struct PoolShared {
    queue: Mutex<PoolQueue>,
    ready: Condvar,
}

/// Threads that write runs handed over by [`FileDev::write_runs`]; they stop when the
/// device is dropped. Started once per device, so a batch costs a wake-up per run, not a
/// thread.
struct WriterPool {
    shared: Option<Arc<PoolShared>>,
}

impl WriterPool {
    /// `threads` workers (none for a read-only device, or if the system refuses threads).
    fn start(threads: usize) -> WriterPool {
        let shared = Arc::new(PoolShared::default());
        let mut started = 0;
        for i in 0..threads {
            let shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("tidefs-dev-writer-{i}"))
                .stack_size(64 << 10)
                .spawn(move || loop {
                    let job = {
                        let mut q = shared.queue.lock();
                        loop {
                            if let Some(job) = q.jobs.pop_front() {
                                break job;
                            }
                            if q.closed {
                                return;
                            }
                            shared.ready.wait(&mut q);
                        }
                    };
                    job.run();
                });
            if spawned.is_ok() {
                started += 1;
            }
        }
        WriterPool {
            shared: (started > 0).then_some(shared),
        }
    }

    fn is_empty(&self) -> bool {
        self.shared.is_none()
    }

    /// Queues `job`, or gives it back when no worker can take it.
    fn submit(&self, job: WriteJob) -> Result<(), WriteJob> {
        let Some(shared) = &self.shared else {
            return Err(job);
        };
        shared.queue.lock().jobs.push_back(job);
        shared.ready.notify_one();
        Ok(())
    }
}

impl Drop for WriterPool {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.queue.lock().closed = true;
            shared.ready.notify_all();
        }
    }
}

/// True when two runs share a byte of the device.
fn overlapping(runs: &[(u64, AlignedBuf)]) -> bool {
    let mut spans: Vec<(u64, u64)> = runs
        .iter()
        .map(|(o, b)| (*o, *o + b.as_slice().len() as u64))
        .collect();
    spans.sort_unstable();
    spans.windows(2).any(|w| w[1].0 < w[0].1)
}

/// The logical sector size: `BLKSSZGET` for a block device; for a file, the direct-I/O offset
/// alignment its file system reports (`statx` `STATX_DIOALIGN`, Linux 6.1+), else 512.
fn sector_size(file: &File, block_device: bool) -> u32 {
    let valid = |s: u32| s.is_power_of_two() && (512..=65536).contains(&s);
    if block_device {
        if let Ok(s) = rustix::fs::ioctl_blksszget(file) {
            if valid(s) {
                return s;
            }
        }
        return 512;
    }
    match rustix::fs::statx(
        file,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::DIOALIGN,
    ) {
        Ok(st)
            if rustix::fs::StatxFlags::from_bits_retain(st.stx_mask)
                .contains(rustix::fs::StatxFlags::DIOALIGN)
                && valid(st.stx_dio_offset_align) =>
        {
            st.stx_dio_offset_align
        }
        _ => 512,
    }
}

/// Turns `O_DIRECT` on for `file` and checks that a sector can be read with it. The error says
/// why direct I/O is not used.
fn enable_direct(file: &File, len: u64, sector: u32) -> Result<(), String> {
    if len % u64::from(sector) != 0 {
        return Err(format!(
            "its length, {len} bytes, is not a multiple of the {sector}-byte sector"
        ));
    }
    let flags = rustix::fs::fcntl_getfl(file).map_err(|e| e.to_string())?;
    rustix::fs::fcntl_setfl(file, flags | rustix::fs::OFlags::DIRECT)
        .map_err(|e| format!("O_DIRECT refused: {e}"))?;
    if len >= u64::from(sector) {
        let mut probe = AlignedBuf::zeroed(sector as usize);
        if let Err(e) = file.read_exact_at(probe.as_mut_slice(), 0) {
            // Put the descriptor back to buffered I/O, which the caller falls back to.
            let _ = rustix::fs::fcntl_setfl(file, flags);
            return Err(format!("a direct read failed: {e}"));
        }
    }
    Ok(())
}

impl BlockDevice for FileDev {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        if !self.direct || buf.is_empty() {
            return self.file.read_exact_at(buf, offset);
        }
        let (start, end) = self.covering(offset, buf.len());
        let span = self.read_span(start, end)?;
        let at = usize::try_from(offset - start).map_err(io::Error::other)?;
        buf.copy_from_slice(&span.as_slice()[at..at + buf.len()]);
        Ok(())
    }

    fn read_owned(&self, offset: u64, len: usize) -> io::Result<AlignedBuf> {
        check_range(offset, len, self.len)?;
        if self.direct && len > 0 && self.aligned(offset, len) {
            return self.read_span(offset, offset + len as u64);
        }
        super::read_into_new(self, offset, len)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write_any(offset, buf, false)
    }

    fn write_blocks(&self, pieces: &[(u64, &[u8])]) -> io::Result<()> {
        let mut runs: Vec<(u64, AlignedBuf)> = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            let (offset, first) = pieces[i];
            if !self.aligned(offset, first.len()) {
                self.write_at(offset, first)?;
                i += 1;
                continue;
            }
            // Gather the run of aligned pieces that follow each other on the device.
            let mut j = i + 1;
            let mut run_len = first.len();
            while j < pieces.len() {
                let (o, b) = pieces[j];
                if o != offset + run_len as u64
                    || !self.aligned(o, b.len())
                    || run_len + b.len() > MAX_MERGED_BYTES
                {
                    break;
                }
                run_len += b.len();
                j += 1;
            }
            check_range(offset, run_len, self.len)?;
            let run = AlignedBuf::from_pieces(run_len, pieces[i..j].iter().map(|p| p.1));
            runs.push((offset, run));
            i = j;
        }
        self.write_runs(runs)
    }

    fn write_durable(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write_any(offset, buf, true)
    }

    fn flush(&self) -> io::Result<()> {
        match self.barrier {
            Barrier::Flush => self.file.sync_data(),
            Barrier::None => Ok(()),
        }
    }

    fn len_bytes(&self) -> u64 {
        self.len
    }

    fn sector_size(&self) -> u32 {
        self.sector
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn image(len: u64) -> tempfile::NamedTempFile {
        let tmp = tempfile::NamedTempFile::new().expect("OK to unwrap: test setup");
        tmp.as_file()
            .set_len(len)
            .expect("OK to unwrap: test setup");
        tmp
    }

    /// Goal: unaligned reads and writes land exactly their bytes, at the start, the middle
    /// and the end of sectors, on a direct device, and reads into the device's own buffer
    /// (`read_owned`, straight into it when aligned) return the same bytes. Method: compare
    /// against a model buffer.
    #[test]
    fn unaligned_writes_land_exactly_their_bytes() {
        let tmp = image(16384);
        let dev = FileDev::open(tmp.path(), false).expect("OK to unwrap: open");
        let mut model = vec![0u8; 16384];
        let writes: [(u64, usize); 6] = [
            (10, 3),
            (500, 30),
            (511, 2),
            (1024, 512),
            (4000, 5000),
            (16383, 1),
        ];
        for (k, &(at, len)) in writes.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|i| (i + k * 7 + 1) as u8).collect();
            dev.write_at(at, &bytes).expect("OK to unwrap: write");
            model[at as usize..at as usize + len].copy_from_slice(&bytes);
        }
        let mut back = vec![0u8; 16384];
        dev.read_at(0, &mut back).expect("OK to unwrap: read");
        assert_eq!(back, model);
        let mut piece = [0u8; 7];
        dev.read_at(505, &mut piece).expect("OK to unwrap: read");
        assert_eq!(&piece[..], &model[505..512]);
        for (at, len) in [(0u64, 16384usize), (4096, 8192), (505, 7), (16383, 1)] {
            let owned = dev.read_owned(at, len).expect("OK to unwrap: read");
            assert_eq!(
                owned.as_slice(),
                &model[at as usize..at as usize + len],
                "read_owned({at}, {len})"
            );
        }
        assert!(dev.read_owned(16384 - 512, 1024).is_err());
        assert!(dev.write_at(16383, b"ab").is_err());
        assert!(dev.read_at(16380, &mut piece).is_err());
        dev.flush().expect("OK to unwrap: flush");
        assert_eq!(
            std::fs::read(tmp.path()).expect("OK to unwrap: read"),
            model
        );
    }

    /// Goal: concurrent writers of neighbouring bytes in the same sectors never lose each
    /// other's bytes (read-modify-write is serialised per sector). Method: 8 threads each own
    /// every 8th byte of two sectors and write their bytes one at a time.
    #[test]
    fn neighbouring_writers_do_not_lose_bytes() {
        let tmp = image(4096);
        let dev = Arc::new(FileDev::open(tmp.path(), false).expect("OK to unwrap: open"));
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    for i in (usize::from(t)..1024).step_by(8) {
                        dev.write_at(i as u64, &[t + 1])
                            .expect("OK to unwrap: write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("OK to unwrap: writer");
        }
        let mut back = vec![0u8; 1024];
        dev.read_at(0, &mut back).expect("OK to unwrap: read");
        for (i, b) in back.iter().enumerate() {
            assert_eq!(usize::from(*b), i % 8 + 1, "byte {i}");
        }
    }

    /// Goal: batches of scattered blocks written by several threads at once all land,
    /// through the io_uring rings, through the writer threads when every ring is busy, and
    /// through the threads alone on a host without io_uring. Method: 4 threads write batches
    /// of 12 scattered blocks each into their own quarter, with and without rings; the image
    /// is compared with a model.
    #[test]
    fn concurrent_batches_land_with_and_without_rings() {
        for rings in [true, false] {
            let tmp = image(4 * 256 * 4096);
            let mut dev = FileDev::open(tmp.path(), false).expect("OK to unwrap: open");
            if !rings {
                dev.uring = None;
            }
            let dev = Arc::new(dev);
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let dev = Arc::clone(&dev);
                    std::thread::spawn(move || {
                        for round in 0..20u64 {
                            let blocks: Vec<(u64, Vec<u8>)> = (0..12u64)
                                .map(|k| {
                                    let block = t * 256 + (k * 21 + round) % 256;
                                    (block * 4096, vec![(t * 50 + round) as u8; 4096])
                                })
                                .collect();
                            let mut pieces: Vec<(u64, &[u8])> =
                                blocks.iter().map(|(o, b)| (*o, &b[..])).collect();
                            pieces.sort_unstable_by_key(|p| p.0);
                            pieces.dedup_by_key(|p| p.0);
                            dev.write_blocks(&pieces)
                                .expect("OK to unwrap: write_blocks");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("OK to unwrap: writer thread");
            }
            let mut model = vec![0u8; 4 * 256 * 4096];
            for t in 0..4u64 {
                for round in 0..20u64 {
                    for k in 0..12u64 {
                        let block = (t * 256 + (k * 21 + round) % 256) as usize;
                        model[block * 4096..(block + 1) * 4096].fill((t * 50 + round) as u8);
                    }
                }
            }
            assert_eq!(
                std::fs::read(tmp.path()).expect("OK to unwrap: read"),
                model,
                "rings: {rings}"
            );
        }
    }

    /// Goal: `write_blocks` merges adjacent aligned pieces and still writes unaligned ones, and
    /// `write_durable` lands its bytes. Method: compare against a model.
    #[test]
    fn write_blocks_and_durable_writes_land() {
        let tmp = image(65536);
        let dev = FileDev::open(tmp.path(), false).expect("OK to unwrap: open");
        let a = vec![1u8; 4096];
        let b = vec![2u8; 4096];
        let c = vec![3u8; 100];
        let d = vec![4u8; 8192];
        dev.write_blocks(&[(0, &a), (4096, &b), (9000, &c), (16384, &d)])
            .expect("OK to unwrap: write_blocks");
        dev.write_durable(32768, &b).expect("OK to unwrap: durable");
        dev.write_durable(40000, &c).expect("OK to unwrap: durable");
        let mut model = vec![0u8; 65536];
        model[..4096].copy_from_slice(&a);
        model[4096..8192].copy_from_slice(&b);
        model[9000..9100].copy_from_slice(&c);
        model[16384..24576].copy_from_slice(&d);
        model[32768..36864].copy_from_slice(&b);
        model[40000..40100].copy_from_slice(&c);
        let mut back = vec![0u8; 65536];
        dev.read_at(0, &mut back).expect("OK to unwrap: read");
        assert_eq!(back, model);
    }

    /// Goal: a batch of many scattered runs, written by several threads at once, lands whole,
    /// and where two pieces of a batch overlap the later one wins. Method: compare against a
    /// model after each batch.
    #[test]
    fn scattered_and_overlapping_batches_land() {
        let tmp = image(1 << 20);
        let dev = FileDev::open(tmp.path(), false).expect("OK to unwrap: open");
        let mut model = vec![0u8; 1 << 20];
        // 40 runs of one or two blocks, every third block: more runs than writer threads.
        let blocks: Vec<(u64, Vec<u8>)> = (0..40u64)
            .map(|i| {
                (
                    i * 3 * 4096,
                    vec![i as u8 + 1; 4096 * (1 + (i % 2) as usize)],
                )
            })
            .collect();
        let pieces: Vec<(u64, &[u8])> = blocks.iter().map(|(o, b)| (*o, &b[..])).collect();
        dev.write_blocks(&pieces).expect("OK to unwrap: scattered");
        for (o, b) in &blocks {
            model[*o as usize..*o as usize + b.len()].copy_from_slice(b);
        }
        // Overlapping pieces: the second and third cover part of the first.
        let (x, y, z) = (vec![0xaa; 12288], vec![0xbb; 4096], vec![0xcc; 4096]);
        dev.write_blocks(&[(200 * 4096, &x), (201 * 4096, &y), (150 * 4096, &z)])
            .expect("OK to unwrap: overlapping");
        model[200 * 4096..203 * 4096].copy_from_slice(&x);
        model[201 * 4096..202 * 4096].copy_from_slice(&y);
        model[150 * 4096..151 * 4096].copy_from_slice(&z);
        let mut back = vec![0u8; 1 << 20];
        dev.read_at(0, &mut back).expect("OK to unwrap: read");
        assert!(back == model, "the device differs from the model");
    }

    /// Goal: a file the host cannot open with O_DIRECT (here: a length that is not whole
    /// sectors) still works, buffered. Method: open, write, read back.
    #[test]
    fn odd_length_image_falls_back_to_buffered_io() {
        let tmp = image(4097);
        let dev = FileDev::open(tmp.path(), false).expect("OK to unwrap: open");
        assert!(!dev.is_direct());
        dev.write_at(4090, b"abcdefg").expect("OK to unwrap: write");
        let mut back = [0u8; 7];
        dev.read_at(4090, &mut back).expect("OK to unwrap: read");
        assert_eq!(&back, b"abcdefg");
    }

    /// Goal: an image on ext4 is opened with O_DIRECT and reports a power-of-two sector size
    /// of at least 512. Method: a temporary file beside the crate's sources (the build's file
    /// system); on another file system only the sector size is checked.
    #[test]
    fn image_on_ext4_is_direct() {
        const EXT4_SUPER_MAGIC: u64 = 0xEF53;
        let tmp = tempfile::NamedTempFile::new_in(env!("CARGO_MANIFEST_DIR"))
            .expect("OK to unwrap: test setup");
        tmp.as_file()
            .set_len(8192)
            .expect("OK to unwrap: test setup");
        let dev = FileDev::open(tmp.path(), false).expect("OK to unwrap: open");
        assert!(dev.sector_size().is_power_of_two() && dev.sector_size() >= 512);
        let on_ext4 =
            rustix::fs::fstatfs(tmp.as_file()).is_ok_and(|st| st.f_type as u64 == EXT4_SUPER_MAGIC);
        if on_ext4 {
            assert!(dev.is_direct(), "an image on ext4 must use O_DIRECT");
        }
    }

    /// Goal: a block device reports its logical sector size (BLKSSZGET) and unaligned I/O on
    /// it works through read-modify-write of its 4096-byte sectors. Method: a loop device with
    /// `--sector-size 4096 --direct-io=on` over a temporary file (needs root and losetup; skip
    /// rule otherwise).
    #[test]
    fn loop_device_with_4k_sectors() {
        let test = crate::test_support::current_test();
        let Some(losetup) = ["/usr/sbin/losetup", "/sbin/losetup", "/usr/bin/losetup"]
            .into_iter()
            .find(|p| Path::new(p).exists())
        else {
            crate::test_support::skip(&test, "losetup is not installed");
            return;
        };
        let backing = image(1 << 20);
        let out = std::process::Command::new(losetup)
            .args([
                "--find",
                "--show",
                "--sector-size",
                "4096",
                "--direct-io=on",
            ])
            .arg(backing.path())
            .output()
            .expect("OK to unwrap: losetup runs");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
            crate::test_support::skip(&test, &format!("losetup failed (needs root): {why}"));
            return;
        }
        let loop_dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let result = std::panic::catch_unwind(|| {
            let dev = FileDev::open(Path::new(&loop_dev), false).expect("OK to unwrap: open");
            assert_eq!(dev.sector_size(), 4096);
            assert!(dev.is_direct());
            dev.write_at(5000, b"hello").expect("OK to unwrap: write");
            dev.write_durable(8192, &[7u8; 1024])
                .expect("OK to unwrap: durable write");
            dev.flush().expect("OK to unwrap: flush");
            let mut back = [0u8; 5];
            dev.read_at(5000, &mut back).expect("OK to unwrap: read");
            assert_eq!(&back, b"hello");
            let mut around = vec![0u8; 8192];
            dev.read_at(4096, &mut around).expect("OK to unwrap: read");
            assert!(around[..904].iter().all(|&b| b == 0));
            assert!(around[909..4096].iter().all(|&b| b == 0));
            assert!(around[4096..5120].iter().all(|&b| b == 7));
            assert!(around[5120..].iter().all(|&b| b == 0));
        });
        let _ = std::process::Command::new(losetup)
            .arg("-d")
            .arg(&loop_dev)
            .output();
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }
}
