//! `tidefs bench checkpoint`: the checkpoint of a parallel job. Each of `--threads` ranks
//! writes a file of its own sequentially, `--chunk` bytes per `write()`, up to `--file-size`,
//! then fsyncs and closes it; the checkpoint is done when the last rank's fsync returns. Run
//! on tidefs through FUSE in every data mode, the kernel's ext4 in every mode and fuse2fs,
//! each on a fresh file system whose journal is on its own loop device (fuse2fs has none).
//! Reported: the checkpoint's bandwidth (all ranks' bytes over the wall time from the first
//! write to the last fsync), that time, what the devices received up to the end of the
//! unmount (journal and home bytes, flushes), and the ratio to ext4 `data=ordered`. Then the
//! restart: the file system is mounted again (every cache emptied) and the ranks read their
//! files back at once, `--chunk` bytes per `read()`, each byte checked; its bandwidth and
//! ratio to ext4 `data=ordered` are reported too.

use std::io::{Read as _, Write};
use std::path::Path;
use std::time::Instant;

use super::report;
use super::report::TrafficMedians;
use super::systems::{JournalPlace, System, Target, Traffic};
use crate::CliError;

/// Arguments of `tidefs bench checkpoint`.
#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    /// Ranks writing at once, each its own file.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Bytes each rank writes.
    #[arg(long, value_parser = crate::parse_size_arg, default_value = "64M")]
    pub file_size: u64,
    /// Bytes per `write()` call.
    #[arg(long, value_parser = crate::parse_size_arg, default_value = "1M")]
    pub chunk: u64,
    /// Systems, comma-separated (no embedded ones: the ranks write through a path). Default:
    /// tidefs in every data mode, ext4 in every mode, and fuse2fs if it is installed.
    #[arg(long)]
    pub systems: Option<String>,
    #[command(flatten)]
    pub common: super::CommonArgs,
}

/// One checkpoint, and its restart, on one system.
#[derive(Debug, serde::Serialize)]
struct Sample {
    system: String,
    run: usize,
    seconds: f64,
    mb_per_s: f64,
    /// The restart: every rank's file read back after a remount.
    restart_seconds: f64,
    restart_mb_per_s: f64,
    /// What the file system's device read during the restart (the data, if it came from the
    /// device and not from a cache left warm).
    restart_device_bytes_read: u64,
    /// What the devices received, including the unmount after the run.
    device: Traffic,
}

/// The table's row: one system over all runs (medians).
#[derive(Debug, serde::Serialize)]
struct Row {
    system: String,
    mb_per_s: f64,
    seconds: f64,
    #[serde(flatten)]
    device: TrafficMedians,
    ratio_to_ext4_ordered: Option<f64>,
    restart_mb_per_s: f64,
    restart_seconds: f64,
    restart_ratio_to_ext4_ordered: Option<f64>,
    restart_device_bytes_read: f64,
}

report::compared!(Row, |r| r.mb_per_s, ratio_to_ext4_ordered);

/// Runs the benchmark and prints its table.
pub fn run(args: CheckpointArgs) -> Result<(), CliError> {
    let what = "bench checkpoint";
    if args.threads == 0 || args.file_size == 0 || args.chunk == 0 || args.common.runs == 0 {
        return Err(CliError::usage(what, "counts and sizes must be positive"));
    }
    let total = args.file_size.saturating_mul(args.threads as u64);
    if total >= args.common.size / 10 * 9 {
        return Err(CliError::usage(
            what,
            format!(
                "{} ranks of {} bytes do not fit a {}-byte image with room to spare: \
                 give a larger --size",
                args.threads, args.file_size, args.common.size
            ),
        ));
    }
    let systems = System::parse_path_list(what, args.systems.as_deref())?;
    let dir = args.common.dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::new(format!("{what}: {}", dir.display()), e.to_string()))?;

    let samples = super::rounds(what, "checkpoint", args.common.runs, &systems, |s, run| {
        one_run(s.clone(), &args, &dir, run)
    })?;

    let mut rows: Vec<Row> = report::by_system(&systems, &samples, |x| &x.system)
        .into_iter()
        .map(|(system, mine)| Row {
            mb_per_s: report::median_by(&mine, |x| x.mb_per_s),
            seconds: report::median_by(&mine, |x| x.seconds),
            device: TrafficMedians::of(&mine.iter().map(|x| x.device).collect::<Vec<_>>()),
            restart_mb_per_s: report::median_by(&mine, |x| x.restart_mb_per_s),
            restart_seconds: report::median_by(&mine, |x| x.restart_seconds),
            restart_device_bytes_read: report::median_by(&mine, |x| {
                x.restart_device_bytes_read as f64
            }),
            system,
            ratio_to_ext4_ordered: None,
            restart_ratio_to_ext4_ordered: None,
        })
        .collect();
    report::set_ratios(&mut rows);
    let mut restarts: Vec<Restart> = rows.iter().map(Restart::of).collect();
    report::set_ratios(&mut restarts);
    for (row, restart) in rows.iter_mut().zip(restarts) {
        row.restart_ratio_to_ext4_ordered = restart.ratio;
    }

    println!(
        "checkpoint: {} rank(s) each writing {} bytes in write()s of {} bytes, then fsync; \
         MB/s = all bytes / wall time to the last fsync; journal on its own loop device \
         (fuse2fs: none); restart = every rank reading its file back at once after a \
         remount; median of {} run(s)",
        args.threads, args.file_size, args.chunk, args.common.runs
    );
    report::print_table(
        "system|MB/s|total s|dev MB written|of which journal|flushes|vs ext4:ordered|\
         restart MB/s|restart s|restart vs ext4:ordered",
        &rows,
        |r: &Row| {
            vec![
                r.system.clone(),
                format!("{:.0}", r.mb_per_s),
                format!("{:.2}", r.seconds),
                format!("{:.1}", r.device.device_bytes_written / 1e6),
                r.device
                    .journal_bytes_written
                    .map_or_else(|| "-".into(), |j| format!("{:.1}", j / 1e6)),
                format!("{:.0}", r.device.device_flushes),
                report::ratio_cell(r.ratio_to_ext4_ordered),
                format!("{:.0}", r.restart_mb_per_s),
                format!("{:.2}", r.restart_seconds),
                report::ratio_cell(r.restart_ratio_to_ext4_ordered),
            ]
        },
    );
    if let Some(path) = &args.common.json {
        let value = serde_json::json!({
            "benchmark": "checkpoint",
            "threads": args.threads,
            "file_size": args.file_size,
            "chunk": args.chunk,
            "runs": args.common.runs,
            "rows": rows,
            "samples": samples,
        });
        report::write_json(path, &value)?;
    }
    Ok(())
}

fn one_run(
    system: System,
    args: &CheckpointArgs,
    dir: &Path,
    run: usize,
) -> Result<Sample, CliError> {
    let name = system.name();
    let mut target = Target::prepare(system, dir, args.common.size, JournalPlace::External)?;
    // OK to unwrap: parse_path_list refused the systems without a path.
    let root = target.root().expect("checkpoint systems have a path");
    let location = root.join("checkpoint");
    let failed =
        |e: std::io::Error| CliError::new(format!("bench checkpoint: {name}"), e.to_string());
    std::fs::create_dir(&location).map_err(failed)?;
    target.sync()?;
    let before = target.counters();
    let seconds = all_ranks(&location, args, write_rank)?;
    // Every rank's file is whole.
    for rank in 0..args.threads {
        let len = std::fs::metadata(location.join(format!("rank-{rank}")))
            .map_err(failed)?
            .len();
        if len != args.file_size {
            return Err(CliError::new(
                format!("bench checkpoint: {name}"),
                format!("rank {rank} wrote {len} bytes, not {}", args.file_size),
            ));
        }
    }
    let device = target.remount()?.since(before);
    // OK to unwrap: the remount mounted it at the same path.
    let root = target.root().expect("checkpoint systems have a path");
    let read_before = target.bytes_read();
    let restart_seconds = all_ranks(&root.join("checkpoint"), args, read_rank)?;
    let restart_device_bytes_read = target.bytes_read().saturating_sub(read_before);
    target.finish();
    let bytes = args.file_size as f64 * args.threads as f64;
    Ok(Sample {
        system: name,
        run,
        seconds,
        mb_per_s: bytes / 1e6 / seconds.max(1e-9),
        restart_seconds,
        restart_mb_per_s: bytes / 1e6 / restart_seconds.max(1e-9),
        restart_device_bytes_read,
        device,
    })
}

/// Runs `rank` for every rank at once, each on its file in `location`; returns the wall
/// time from the start to the last rank's end, or the first error (each names its file).
fn all_ranks(
    location: &Path,
    args: &CheckpointArgs,
    rank: fn(&Path, usize, &CheckpointArgs) -> Result<(), CliError>,
) -> Result<f64, CliError> {
    let started = Instant::now();
    let ranks: Vec<Result<(), CliError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|r| {
                let path = location.join(format!("rank-{r}"));
                s.spawn(move || rank(&path, r, args))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CliError::new("bench checkpoint", "a rank panicked")))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    ranks.into_iter().collect::<Result<Vec<()>, CliError>>()?;
    Ok(seconds)
}

/// The restart's figure, for its ratio to ext4 `data=ordered` ([`report::set_ratios`]).
struct Restart {
    system: String,
    mb_per_s: f64,
    ratio: Option<f64>,
}

impl Restart {
    fn of(row: &Row) -> Restart {
        Restart {
            system: row.system.clone(),
            mb_per_s: row.restart_mb_per_s,
            ratio: None,
        }
    }
}

report::compared!(Restart, |r| r.mb_per_s, ratio);

/// The bytes of every chunk of `rank`'s file but its first byte, which is the chunk's
/// number (wrapping): what [`write_rank`] writes, made once per rank, outside the timing.
fn rank_pattern(rank: usize, args: &CheckpointArgs) -> Vec<u8> {
    let len = args.chunk.min(args.file_size) as usize;
    (0..len).map(|i| (i % 251) as u8 ^ rank as u8).collect()
}

/// One rank's restart: its file read back in chunks, each checked against what the rank
/// wrote, and its length.
fn read_rank(path: &Path, rank: usize, args: &CheckpointArgs) -> Result<(), CliError> {
    let what = format!("bench checkpoint: restart: {}", path.display());
    let failed = |e: std::io::Error| CliError::new(what.clone(), e.to_string());
    let mut f = std::fs::File::open(path).map_err(failed)?;
    let want = rank_pattern(rank, args);
    let mut got = vec![0u8; want.len()];
    for (n, at, len) in chunks(args) {
        super::check_interrupt("bench checkpoint")?;
        f.read_exact(&mut got[..len]).map_err(failed)?;
        if got[0] != n as u8 || got[1..len] != want[1..len] {
            return Err(CliError::new(
                what,
                format!("the bytes read back at {at} differ from those written"),
            ));
        }
    }
    let len = f.metadata().map_err(failed)?.len();
    if len != args.file_size {
        return Err(CliError::new(
            what,
            format!("{len} bytes after the remount, not {}", args.file_size),
        ));
    }
    Ok(())
}

/// Each chunk of a rank's file: its number, its offset and its length.
fn chunks(args: &CheckpointArgs) -> impl Iterator<Item = (u64, u64, usize)> + '_ {
    (0..args.file_size.div_ceil(args.chunk)).map(|n| {
        let at = n * args.chunk;
        (n, at, (args.file_size - at).min(args.chunk) as usize)
    })
}

/// One rank: its file written in chunks (bytes that differ by rank and by chunk, so no layer
/// can take the data for zeros), then fsync.
fn write_rank(path: &Path, rank: usize, args: &CheckpointArgs) -> Result<(), CliError> {
    let what = format!("bench checkpoint: {}", path.display());
    let failed = |e: std::io::Error| CliError::new(what.clone(), e.to_string());
    let mut f = std::fs::File::create(path).map_err(failed)?;
    let mut buf = rank_pattern(rank, args);
    for (n, _, len) in chunks(args) {
        super::check_interrupt("bench checkpoint")?;
        buf[0] = n as u8;
        f.write_all(&buf[..len]).map_err(failed)?;
    }
    f.sync_all().map_err(failed)?;
    Ok(())
}
