//! `tidefs crashtest`: runs the crash-state harness ([`tidefs_crash`]) for one or every data
//! mode and prints its report. Exit 0 when no state broke a promise, 1 otherwise.

use std::path::PathBuf;

use tidefs::fs::DataMode;
use tidefs_crash::canary::Canary;
use tidefs_crash::workload::Family;
use tidefs_crash::{Config, Harness, ImageShape, Report};

use crate::CliError;

/// The arguments of `tidefs crashtest`.
#[derive(clap::Args)]
pub struct CrashtestArgs {
    /// The mount's mode (the root directory's): any mode `-o data=` takes, or all.
    #[arg(long, default_value = "all")]
    pub mode: String,
    /// A mixed tree: directory A gets this mode of its own, and the workloads switch it
    /// between modes while they run; each file is held to its own modes' promise.
    #[arg(long, value_name = "MODE", value_parser = crate::parse_mode_arg)]
    pub dir_mode: Option<DataMode>,
    /// Workload family: ace, random, all (ace and random) or threads.
    #[arg(long, default_value = "ace")]
    pub workloads: String,
    /// Crash states per mode.
    #[arg(long, default_value_t = 1000)]
    pub states: u64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay only this state index (as printed with a violation).
    #[arg(long)]
    pub state: Option<u64>,
    /// A deliberately broken ordering: commit-without-flush or data-after-commit.
    #[arg(long)]
    pub canary: Option<String>,
    /// Base image: one-group or groups (default: groups for threads, one-group otherwise).
    #[arg(long)]
    pub image: Option<String>,
    /// Record through the real file-backed device, on image files in this directory.
    #[arg(long, value_name = "DIR")]
    pub file_dev: Option<PathBuf>,
    /// Also tear in-flight writes at 512-byte sectors (the default when TIDEFS_CI=1).
    #[arg(long, conflicts_with = "no_torn")]
    pub torn: bool,
    /// Never tear writes, also when TIDEFS_CI=1.
    #[arg(long)]
    pub no_torn: bool,
    /// Add sampled three-step sequences to the ace family.
    #[arg(long)]
    pub ace3: bool,
    /// Skip the comparison with e2fsck's own journal replay.
    #[arg(long)]
    pub no_kernel_compare: bool,
    /// Record with `-o fenced_commits` (a flush before every commit block).
    #[arg(long)]
    pub fenced_commits: bool,
    /// Print progress on stderr.
    #[arg(long)]
    pub progress: bool,
}

/// Runs the harness; returns the exit code.
pub fn run(args: CrashtestArgs) -> Result<u8, CliError> {
    let what = "crashtest";
    let modes: Vec<DataMode> = crate::parse_modes(&args.mode)?;
    if args.state.is_some() && modes.len() != 1 {
        return Err(CliError::usage(what, "--state needs one --mode"));
    }
    let family = Family::parse(&args.workloads).ok_or_else(|| {
        CliError::usage(
            what,
            format!(
                "unknown workload family '{}' (ace, random, all)",
                args.workloads
            ),
        )
    })?;
    let canary = match args.canary.as_deref() {
        None => None,
        Some(name) => Some(Canary::parse(name).ok_or_else(|| {
            CliError::usage(
                what,
                format!("unknown canary '{name}' (commit-without-flush, data-after-commit)"),
            )
        })?),
    };
    let image = match args.image.as_deref() {
        None => ImageShape::for_family(family),
        Some(name) => ImageShape::parse(name).ok_or_else(|| {
            CliError::usage(what, format!("unknown image '{name}' (one-group, groups)"))
        })?,
    };
    if let Some(dir) = &args.file_dev {
        if !dir.is_dir() {
            return Err(CliError::usage(
                what,
                format!("--file-dev {}: not a directory", dir.display()),
            ));
        }
    }
    let fresh = tidefs_crash::make_fresh_image(image)
        .map_err(|e| CliError::new(what, format!("cannot make the base image: {e}")))?;
    let configs: Vec<Config> = modes
        .into_iter()
        .map(|mode| Config {
            dir_mode: args.dir_mode,
            family,
            states: args.states,
            seed: args.seed,
            only_state: args.state,
            canary,
            image,
            file_dev_dir: args.file_dev.clone(),
            torn: if args.torn || args.no_torn {
                args.torn
            } else {
                tidefs::test_support::in_ci()
            },
            ace_len3: args.ace3,
            kernel_compare: !args.no_kernel_compare,
            progress: args.progress,
            fenced_commits: args.fenced_commits,
            ..Config::new(mode)
        })
        .collect();
    // One thread per mode, at most as many as there are cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut reports: Vec<Result<Report, String>> = Vec::new();
    for chunk in configs.chunks(cores.max(1)) {
        let out: Vec<Result<Report, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|cfg| {
                    let fresh = &fresh;
                    s.spawn(move || {
                        Harness::new(cfg.clone(), fresh)
                            .and_then(|h| h.run())
                            .map_err(|e| format!("{}: {e}", cfg.mode.name()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("harness thread panicked".into()))
                })
                .collect()
        });
        reports.extend(out);
    }
    let mut failed = false;
    for r in reports {
        match r {
            Ok(report) => {
                print!("{report}");
                failed |= !report.violations.is_empty() || !report.op_failures.is_empty();
            }
            Err(e) => return Err(CliError::new(what, e)),
        }
    }
    Ok(u8::from(failed))
}
