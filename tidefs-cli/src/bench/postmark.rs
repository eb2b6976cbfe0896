//! `tidefs bench postmark`: Debian's `postmark` (the NetApp mail-server benchmark: create a pool of
//! small files, then transactions that each create or delete a file and read or append one, then
//! delete the pool; no fsync) with one configuration and seed for every system, each on a fresh
//! file system whose journal is on its own loop device (fuse2fs has no external journal: all its
//! bytes count as home bytes). Reported: transactions per second, total time, what the devices
//! received (bytes written to the journal and to the file system, flushes; up to the end of the
//! unmount, so that what a system only writes at unmount counts too), FUSE requests per transaction
//! for tidefs (the daemon's count), and the ratio to ext4 `data=ordered`. By default every tidefs
//! data mode and every ext4 mode run side by side.
//!
//! postmark's own timer counts whole seconds, so the rate here is the configured transactions
//! divided by the wall time of the whole postmark run (pool creation, transactions, deletion),
//! measured around the process.

use std::process::Command;
use std::time::Instant;

use super::report;
use super::report::TrafficMedians;
use super::systems::{need_tool, run_tool, JournalPlace, System, Target, Traffic};
use crate::CliError;

/// Arguments of `tidefs bench postmark`.
#[derive(clap::Args, Debug)]
pub struct PostmarkArgs {
    /// Files in the initial pool (postmark `set number`).
    #[arg(long, default_value_t = 500)]
    pub files: u64,
    /// Transactions (postmark `set transactions`).
    #[arg(long, default_value_t = 10_000)]
    pub transactions: u64,
    /// Smallest file, bytes (postmark `set size MIN MAX`).
    #[arg(long, default_value_t = 500)]
    pub min_size: u64,
    /// Largest file, bytes.
    #[arg(long, default_value_t = 10_000)]
    pub max_size: u64,
    /// Subdirectories the files spread over (postmark `set subdirectories`).
    #[arg(long, default_value_t = 1)]
    pub subdirectories: u64,
    /// Seed of postmark's random choices (the same for every system).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Systems, comma-separated (no embedded ones: postmark runs on a path). Default: tidefs in
    /// every data mode, ext4 in every mode (ordered, writeback, journal, fast_commit), and
    /// fuse2fs if it is installed.
    #[arg(long)]
    pub systems: Option<String>,
    #[command(flatten)]
    pub common: super::CommonArgs,
}

/// One postmark run on one system.
#[derive(Debug, serde::Serialize)]
struct Sample {
    system: String,
    run: usize,
    seconds: f64,
    transactions_per_s: f64,
    /// What the devices received, including the unmount after the run.
    device: Traffic,
    /// FUSE requests the tidefs daemon served during the run (`None` for the other systems).
    fuse_requests: Option<u64>,
}

/// The table's row: one system over all runs (medians).
#[derive(Debug, serde::Serialize)]
struct Row {
    system: String,
    transactions_per_s: f64,
    seconds: f64,
    #[serde(flatten)]
    device: TrafficMedians,
    /// FUSE round trips per postmark transaction (tidefs only; creations and deletions of the
    /// initial and final file sets included).
    fuse_requests_per_transaction: Option<f64>,
    ratio_to_ext4_ordered: Option<f64>,
}

report::compared!(Row, |r| r.transactions_per_s, ratio_to_ext4_ordered);

/// Runs the benchmark and prints its table.
pub fn run(args: PostmarkArgs) -> Result<(), CliError> {
    let what = "bench postmark";
    if args.files == 0
        || args.transactions == 0
        || args.common.runs == 0
        || args.subdirectories == 0
    {
        return Err(CliError::usage(what, "counts must be positive"));
    }
    if args.min_size == 0 || args.min_size > args.max_size {
        return Err(CliError::usage(
            what,
            "sizes must be positive, --min-size at most --max-size",
        ));
    }
    let systems = System::parse_path_list(what, args.systems.as_deref())?;
    let postmark = need_tool("postmark", "postmark")?;
    let dir = args.common.dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::new(format!("{what}: {}", dir.display()), e.to_string()))?;

    let samples = super::rounds(what, "postmark", args.common.runs, &systems, |s, run| {
        one_run(&postmark, s.clone(), &args, &dir, run)
    })?;

    let mut rows: Vec<Row> = report::by_system(&systems, &samples, |x| &x.system)
        .into_iter()
        .map(|(system, mine)| Row {
            transactions_per_s: report::median_by(&mine, |x| x.transactions_per_s),
            seconds: report::median_by(&mine, |x| x.seconds),
            device: TrafficMedians::of(&mine.iter().map(|x| x.device).collect::<Vec<_>>()),
            fuse_requests_per_transaction: mine.iter().all(|x| x.fuse_requests.is_some()).then(
                || {
                    report::median_by(&mine, |x| x.fuse_requests.unwrap_or(0) as f64)
                        / args.transactions as f64
                },
            ),
            system,
            ratio_to_ext4_ordered: None,
        })
        .collect();
    report::set_ratios(&mut rows);

    println!(
        "postmark: {} files of {}-{} bytes in {} director{}, {} transactions, seed {}; \
         tx/s = transactions / wall time of the whole run; journal on its own loop device \
         (fuse2fs: none); median of {} run(s)",
        args.files,
        args.min_size,
        args.max_size,
        args.subdirectories,
        if args.subdirectories == 1 { "y" } else { "ies" },
        args.transactions,
        args.seed,
        args.common.runs
    );
    report::print_table(
        "system|tx/s|total s|dev MB written|of which journal|flushes|FUSE req/tx|vs ext4:ordered",
        &rows,
        |r: &Row| {
            vec![
                r.system.clone(),
                format!("{:.0}", r.transactions_per_s),
                format!("{:.2}", r.seconds),
                format!("{:.1}", r.device.device_bytes_written / 1e6),
                r.device
                    .journal_bytes_written
                    .map_or_else(|| "-".into(), |j| format!("{:.1}", j / 1e6)),
                format!("{:.0}", r.device.device_flushes),
                r.fuse_requests_per_transaction
                    .map_or_else(|| "-".into(), |q| format!("{q:.1}")),
                report::ratio_cell(r.ratio_to_ext4_ordered),
            ]
        },
    );
    if let Some(path) = &args.common.json {
        let value = serde_json::json!({
            "benchmark": "postmark",
            "files": args.files,
            "transactions": args.transactions,
            "min_size": args.min_size,
            "max_size": args.max_size,
            "subdirectories": args.subdirectories,
            "seed": args.seed,
            "runs": args.common.runs,
            "rows": rows,
            "samples": samples,
        });
        report::write_json(path, &value)?;
    }
    Ok(())
}

/// postmark's configuration: the same commands for every system but the location.
fn config(args: &PostmarkArgs, location: &std::path::Path) -> String {
    format!(
        "set location {}\nset number {}\nset transactions {}\nset size {} {}\n\
         set subdirectories {}\nset seed {}\nrun\nquit\n",
        location.display(),
        args.files,
        args.transactions,
        args.min_size,
        args.max_size,
        args.subdirectories,
        args.seed
    )
}

fn one_run(
    postmark: &std::path::Path,
    system: System,
    args: &PostmarkArgs,
    dir: &std::path::Path,
    run: usize,
) -> Result<Sample, CliError> {
    let name = system.name();
    let target = Target::prepare(system, dir, args.common.size, JournalPlace::External)?;
    // OK to unwrap: parse_list refused the systems without a path.
    let root = target.root().expect("postmark systems have a path");
    let location = root.join("postmark");
    let failed =
        |e: std::io::Error| CliError::new(format!("bench postmark: {name}"), e.to_string());
    std::fs::create_dir(&location).map_err(failed)?;
    let config_path = dir.join(format!("postmark-{}.cfg", name.replace(':', "-")));
    std::fs::write(&config_path, config(args, &location)).map_err(failed)?;
    target.sync()?;
    let before = target.counters();
    let requests_before = target.fuse_requests();
    let started = Instant::now();
    let out = run_tool(
        Command::new(postmark).arg(&config_path),
        &format!("postmark on {name}"),
    );
    let seconds = started.elapsed().as_secs_f64();
    let fuse_requests = requests_before
        .zip(target.fuse_requests())
        .map(|(a, b)| b.saturating_sub(a));
    let _ = std::fs::remove_file(&config_path);
    let out = out?;
    // postmark reports a failed file operation on stderr and still exits 0; its summary is
    // what shows that the run went through.
    if !out.contains("Deleting files...Done") {
        return Err(CliError::new(
            format!("bench postmark: {name}"),
            format!("postmark did not finish:\n{out}"),
        ));
    }
    let device = target.finish().since(before);
    Ok(Sample {
        system: name,
        run,
        seconds,
        transactions_per_s: args.transactions as f64 / seconds.max(1e-9),
        device,
        fuse_requests,
    })
}
