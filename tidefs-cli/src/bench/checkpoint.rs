//! `tidefs bench checkpoint`: the checkpoint of a parallel job. Each of `--threads` ranks
//! writes a file of its own sequentially, `--chunk` bytes per `write()`, up to `--file-size`,
//! then fsyncs and closes it; the checkpoint is done when the last rank's fsync returns. Run
//! on tidefs through FUSE in every data mode, the kernel's ext4 in every mode and fuse2fs,
//! each on a fresh file system whose journal is on its own loop device (fuse2fs has none).
//! Reported: the checkpoint's bandwidth (all ranks' bytes over the wall time from the first
//! write to the last fsync), that time, what the devices received up to the end of the
//! unmount (journal and home bytes, flushes), and the ratio to ext4 `data=ordered`.

use std::io::Write;
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

/// One checkpoint on one system.
#[derive(Debug, serde::Serialize)]
struct Sample {
    system: String,
    run: usize,
    seconds: f64,
    mb_per_s: f64,
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
            system,
            ratio_to_ext4_ordered: None,
        })
        .collect();
    report::set_ratios(&mut rows);

    println!(
        "checkpoint: {} rank(s) each writing {} bytes in write()s of {} bytes, then fsync; \
         MB/s = all bytes / wall time to the last fsync; journal on its own loop device \
         (fuse2fs: none); median of {} run(s)",
        args.threads, args.file_size, args.chunk, args.common.runs
    );
    report::print_table(
        "system|MB/s|total s|dev MB written|of which journal|flushes|vs ext4:ordered",
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
    let target = Target::prepare(system, dir, args.common.size, JournalPlace::External)?;
    // OK to unwrap: parse_path_list refused the systems without a path.
    let root = target.root().expect("checkpoint systems have a path");
    let location = root.join("checkpoint");
    let failed =
        |e: std::io::Error| CliError::new(format!("bench checkpoint: {name}"), e.to_string());
    std::fs::create_dir(&location).map_err(failed)?;
    target.sync()?;
    let before = target.counters();
    let started = Instant::now();
    let ranks: Vec<Result<(), CliError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|rank| {
                let path = location.join(format!("rank-{rank}"));
                s.spawn(move || write_rank(&path, rank, args))
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
    // Each rank's error names its file.
    ranks.into_iter().collect::<Result<Vec<()>, CliError>>()?;
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
    let device = target.finish().since(before);
    let bytes = args.file_size as f64 * args.threads as f64;
    Ok(Sample {
        system: name,
        run,
        seconds,
        mb_per_s: bytes / 1e6 / seconds.max(1e-9),
        device,
    })
}

/// One rank: its file written in chunks (bytes that differ by rank and by chunk, so no layer
/// can take the data for zeros), then fsync.
fn write_rank(path: &Path, rank: usize, args: &CheckpointArgs) -> Result<(), CliError> {
    let what = format!("bench checkpoint: {}", path.display());
    let failed = |e: std::io::Error| CliError::new(what.clone(), e.to_string());
    let mut f = std::fs::File::create(path).map_err(failed)?;
    let chunk = usize::try_from(args.chunk).unwrap_or(usize::MAX);
    let mut buf: Vec<u8> = (0..chunk).map(|i| (i % 251) as u8 ^ rank as u8).collect();
    let mut written = 0u64;
    let mut n = 0u8;
    while written < args.file_size {
        super::check_interrupt("bench checkpoint")?;
        let len = (args.file_size - written).min(args.chunk) as usize;
        buf[0] = n;
        n = n.wrapping_add(1);
        f.write_all(&buf[..len]).map_err(failed)?;
        written += len as u64;
    }
    f.sync_all().map_err(failed)?;
    Ok(())
}
