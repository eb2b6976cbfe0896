//! `tidefs crashtest`: runs the crash-state harness ([`tidefs::crash`]) for one or every data
//! mode and prints its report. Exit 0 when no state broke a promise, 1 otherwise.

use tidefs::crash::workload::Family;
use tidefs::crash::{Config, Harness, Report};
use tidefs::fs::{Canary, DataMode};

use crate::CliError;

/// The arguments of `tidefs crashtest`.
pub struct CrashtestArgs {
    /// `lightweight`, `writeback`, `ordered`, `journal` or `all`.
    pub mode: String,
    /// `ace`, `random` or `all`.
    pub workloads: String,
    /// Crash states per mode.
    pub states: u64,
    /// Seed.
    pub seed: u64,
    /// Replay only this state.
    pub state: Option<u64>,
    /// `commit-without-flush` or `data-after-commit`.
    pub canary: Option<String>,
    /// Tear in-flight writes at sectors.
    pub torn: bool,
    /// Add sampled three-step ACE sequences.
    pub ace3: bool,
    /// Skip the comparison with e2fsck's own replay.
    pub no_kernel_compare: bool,
    /// Print progress.
    pub progress: bool,
}

/// Runs the harness; returns the exit code.
pub fn run(args: CrashtestArgs) -> Result<u8, CliError> {
    let what = "crashtest";
    let modes: Vec<DataMode> = if args.mode == "all" {
        vec![
            DataMode::Lightweight,
            DataMode::Writeback,
            DataMode::Ordered,
            DataMode::Journal,
        ]
    } else {
        vec![DataMode::parse(&args.mode).ok_or_else(|| {
            CliError::usage(
                what,
                format!(
                    "unknown mode '{}' (lightweight, writeback, ordered, journal, all)",
                    args.mode
                ),
            )
        })?]
    };
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
        Some("commit-without-flush") => Some(Canary::CommitWithoutFlush),
        Some("data-after-commit") => Some(Canary::DataAfterCommit),
        Some(other) => {
            return Err(CliError::usage(
                what,
                format!("unknown canary '{other}' (commit-without-flush, data-after-commit)"),
            ))
        }
    };
    let fresh = tidefs::crash::make_fresh_image()
        .map_err(|e| CliError::new(what, format!("cannot make the base image: {e}")))?;
    let configs: Vec<Config> = modes
        .into_iter()
        .map(|mode| Config {
            family,
            states: args.states,
            seed: args.seed,
            only_state: args.state,
            canary,
            torn: args.torn,
            ace_len3: args.ace3,
            kernel_compare: !args.no_kernel_compare,
            progress: args.progress,
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
                failed |= !report.violations.is_empty();
            }
            Err(e) => return Err(CliError::new(what, e)),
        }
    }
    Ok(u8::from(failed))
}
