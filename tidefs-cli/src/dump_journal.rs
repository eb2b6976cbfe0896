//! `tidefs dump-journal IMAGE | --journal-device DEV [--json]`: lists every committed
//! transaction in an image's journal, as recovery would replay it (like `debugfs logdump`):
//! its tid, layout (classic block layout or compact commit), position, commit time, and each
//! record (full block copies with their log block and escape flag, byte ranges with their
//! offsets and lengths, revokes). Never writes. The listing comes from
//! `tidefs::journal::dump_image`, which reads the log with recovery's own scan.
//!
//! Exit codes: 0 listed; 1 cannot read (missing file, I/O error); 2 bad usage; 3 no journal
//! to list (no `has_journal`, an external journal not given, an unsupported layout); 4 the
//! image or journal is corrupt (a superblock that does not parse or verify, a log that
//! contradicts itself).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use tidefs::journal::{DumpLayout, JournalDump, TagKind};
use tidefs::FsError;

use crate::CliError;

const WHAT: &str = "dump-journal";

/// Arguments of `tidefs dump-journal`.
#[derive(Args)]
pub struct DumpJournalArgs {
    /// The image (file or block device); omit it to read an external journal device alone.
    pub image: Option<PathBuf>,
    /// The external journal device (made by mke2fs -O journal_dev).
    #[arg(long)]
    pub journal_device: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tidefs dump-journal`.
pub fn run(args: DumpJournalArgs) -> Result<u8, CliError> {
    let dump = match (&args.image, &args.journal_device) {
        (Some(image), jdev) => tidefs::journal::dump_image(image, jdev.as_deref()),
        (None, Some(jdev)) => tidefs::journal::dump_journal_device(jdev),
        (None, None) => {
            return Err(CliError::usage(
                WHAT,
                "name an IMAGE, or an external journal with --journal-device DEV",
            ))
        }
    }
    .map_err(failure)?;
    if args.json {
        let text = serde_json::to_string_pretty(&dump)
            .map_err(|e| CliError::new(WHAT, format!("JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render(&dump));
    }
    Ok(0)
}

/// The CLI error for a library error, with the exit code of the module documentation.
fn failure(e: FsError) -> CliError {
    let code = match &e {
        FsError::Io(_) => 1,
        FsError::Incompatible(_) | FsError::Invalid(_) => 3,
        FsError::Corrupt(_) => 4,
        _ => 1,
    };
    CliError {
        code,
        ..CliError::new(WHAT, e.to_string())
    }
}

/// The text listing.
pub fn render(d: &JournalDump) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Journal: block size {}, log blocks {}..{} (s_first {}, s_maxlen {})",
        d.block_size,
        d.first_block,
        d.len_blocks.saturating_sub(1),
        d.first_block,
        d.len_blocks
    );
    let _ = writeln!(s, "Incompat features: {}", d.incompat.join(", "));
    if d.errno != 0 {
        let _ = writeln!(s, "Recorded error (s_errno): {}", d.errno);
    }
    if d.start_block == 0 {
        let _ = writeln!(
            s,
            "The log is empty (s_start 0): nothing to replay; the next transaction is {}.",
            d.sequence
        );
        return s;
    }
    let _ = writeln!(
        s,
        "Tail: block {}, expecting transaction {} (s_start, s_sequence)",
        d.start_block, d.sequence
    );
    for t in &d.transactions {
        let (layout, size) = match t.layout {
            DumpLayout::Block => (
                if t.unfenced {
                    "block layout (unfenced)"
                } else {
                    "block layout"
                },
                format!("{} blocks", t.len_bytes / u64::from(d.block_size.max(1))),
            ),
            DumpLayout::Compact => ("compact commit", format!("{} bytes", t.len_bytes)),
        };
        let _ = writeln!(
            s,
            "Transaction {}: {layout} at block {} offset {}, {size}, committed at {}.{:09}",
            t.tid, t.block, t.offset, t.commit_sec, t.commit_nsec
        );
        for tag in &t.tags {
            match tag.kind {
                TagKind::Full => {
                    let _ = writeln!(
                        s,
                        "  full   home block {:>10}  logged at block {}{}",
                        tag.home,
                        tag.position.unwrap_or(0),
                        if tag.escaped { "  (escaped)" } else { "" }
                    );
                }
                TagKind::Range => {
                    let bytes: u64 = tag.ranges.iter().map(|r| u64::from(r.1)).sum();
                    let list: Vec<String> =
                        tag.ranges.iter().map(|(o, l)| format!("{o}+{l}")).collect();
                    let _ = writeln!(
                        s,
                        "  range  home block {:>10}  {} range(s), {bytes} bytes: {}{}",
                        tag.home,
                        tag.ranges.len(),
                        list.join(", "),
                        if tag.zero_rest {
                            "  (zeros elsewhere)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        for home in &t.revokes {
            let _ = writeln!(s, "  revoke home block {home:>10}");
        }
        for home in &t.corrupt {
            let _ = writeln!(
                s,
                "  full   home block {home:>10}  CHECKSUM FAILED, not replayed"
            );
        }
    }
    let next = d
        .transactions
        .last()
        .map_or(d.sequence, |t| t.tid.wrapping_add(1));
    match (d.failed_commit, d.torn) {
        (_, Some(tid)) => {
            let _ = writeln!(
                s,
                "Transaction {tid} was torn by a crash (at block {} offset {}): the log ends \
                 there, and nothing of it is replayed. {} transaction(s).",
                d.end_block,
                d.end_offset,
                d.transactions.len()
            );
        }
        (Some(tid), None) => {
            let _ = writeln!(
                s,
                "Transaction {tid} fails its commit checksum at block {} offset {}: the log ends \
                 there.",
                d.end_block, d.end_offset
            );
        }
        (None, None) => {
            let _ = writeln!(
                s,
                "No transaction {next} at block {} offset {}: end of the log. {} transaction(s).",
                d.end_block,
                d.end_offset,
                d.transactions.len()
            );
        }
    }
    if d.corrupt_blocks > 0 {
        let _ = writeln!(
            s,
            "{} logged block(s) failed their checksum.",
            d.corrupt_blocks
        );
    }
    s
}
