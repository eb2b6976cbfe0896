//! `tidefs fsck`: replays the journal with tidefs' own recovery, then runs `e2fsck` (when
//! installed) on the result and reports its verdict.
//!
//! Modes, as e2fsck's: without a flag the replayed image is checked with `e2fsck -fn` (report
//! only); `-p` repairs what is safe to repair without questions (`e2fsck -fp`); `-y` repairs
//! everything (`e2fsck -fy`); `-n` never modifies the image: it (and an external journal) is
//! copied into a temporary sparse file, and the copy is replayed and checked with `-fn`. The
//! verdict then says whether the image is consistent once its journal is replayed, as any mount
//! would do first. The flags exclude each other.
//!
//! Exit codes follow fsck(8): 0 clean, 1 errors corrected (the journal was replayed, or e2fsck
//! repaired), 4 errors left uncorrected, 8 operational error (cannot open, not ext4,
//! unsupported feature, in use, I/O error), 16 usage error. (2, "reboot", never applies: a
//! tidefs image is never the running root.)
//!
//! Invariants:
//! - A writing fsck claims the image ([`tidefs::dev::lock`]) for the replay and again for the
//!   repair, so it never writes to an image a mount or mkfs holds or the kernel has mounted;
//!   `-n` holds a shared claim while it copies, so it never copies a live read-write image.

use std::io::{Seek as _, SeekFrom};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::control;
use crate::mount::io_reason;
use crate::sys;

/// fsck(8)'s exit code for a usage error.
pub const USAGE: u8 = 16;

/// What `tidefs fsck` may do to the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No flag: replay the journal, then check with `e2fsck -fn` (report only).
    Check,
    /// `-n`: replay and check a temporary copy; the image is never written.
    ReadOnly,
    /// `-p`: replay, then repair what is safe without questions (`e2fsck -fp`).
    Preen,
    /// `-y`: replay, then repair everything (`e2fsck -fy`).
    Yes,
}

impl Mode {
    /// e2fsck's flags for this mode.
    fn e2fsck_flags(self) -> &'static str {
        match self {
            Mode::Check | Mode::ReadOnly => "-fn",
            Mode::Preen => "-fp",
            Mode::Yes => "-fy",
        }
    }
}

/// Runs `tidefs fsck` and returns its exit code.
pub fn run(image: &Path, journal_device: Option<&Path>, mode: Mode) -> u8 {
    match fsck(image, journal_device, mode) {
        Ok(code) => code,
        Err(why) => {
            eprintln!("tidefs: fsck: {why}");
            8
        }
    }
}

/// Words for a failed claim of `path` (an `io::Error` from [`tidefs::dev::lock`]).
fn claim_error(image: &Path, path: &Path, e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::ResourceBusy {
        control::describe_open_error(image, &tidefs::FsError::Busy(e.to_string()))
    } else {
        format!("{}: {}", path.display(), io_reason(&e))
    }
}

fn fsck(image: &Path, journal_device: Option<&Path>, mode: Mode) -> Result<u8, String> {
    let no_modify = mode == Mode::ReadOnly;
    for path in std::iter::once(image).chain(journal_device) {
        std::fs::metadata(path).map_err(|e| format!("{}: {}", path.display(), io_reason(&e)))?;
    }
    let scratch = if no_modify {
        Some(Scratch::new().map_err(|e| format!("temporary directory: {e}"))?)
    } else {
        None
    };
    let (target, target_journal) = match &scratch {
        Some(scratch) => {
            // A shared claim while copying: a copy of an image that a read-write mount is
            // changing would be a torn snapshot, not the image.
            let _claims = std::iter::once(image)
                .chain(journal_device)
                .map(|path| {
                    tidefs::dev::lock::open_claimed(path, false)
                        .map_err(|e| claim_error(image, path, e))
                })
                .collect::<Result<Vec<_>, String>>()?;
            let copy = scratch.dir.join("image");
            sparse_copy(image, &copy)
                .map_err(|e| format!("copying {} for -n: {e}", image.display()))?;
            let journal_copy = match journal_device {
                Some(journal) => {
                    let copy = scratch.dir.join("journal");
                    sparse_copy(journal, &copy)
                        .map_err(|e| format!("copying {} for -n: {e}", journal.display()))?;
                    Some(copy)
                }
                None => None,
            };
            (copy, journal_copy)
        }
        None => (image.to_path_buf(), journal_device.map(Path::to_path_buf)),
    };

    println!("tidefs fsck {}", image.display());
    let report = tidefs::fs::recover_image(&target, target_journal.as_deref())
        .map_err(|e| control::describe_open_error(image, &e))?;
    let replayed = report.transactions > 0;
    let mut code = 0;
    if replayed {
        println!(
            "  journal: replayed {} transaction(s): {} block(s) written home, {} revoke record(s){}",
            report.transactions,
            report.blocks_replayed,
            report.revoke_records,
            if no_modify {
                " (in a temporary copy; the image itself still needs recovery)"
            } else {
                ""
            }
        );
        if !no_modify {
            code |= 1;
        }
    } else if report.failed_commit.is_none() && report.torn.is_none() {
        println!("  journal: clean, nothing to replay");
    }
    if report.corrupt_blocks > 0 {
        println!(
            "  journal: {} logged block(s) failed their checksum and were not replayed",
            report.corrupt_blocks
        );
        code |= 4;
    }
    if let Some(tid) = report.torn {
        println!(
            "  journal: transaction {tid} was torn by the crash (never completed); not replayed"
        );
    }
    if let Some(tid) = report.failed_commit {
        println!("  journal: transaction {tid} was corrupt (commit block checksum); replay stopped there");
        code |= 4;
    }

    match tidefs_mkfs::find_e2fsprogs_tool("e2fsck") {
        None if matches!(mode, Mode::Preen | Mode::Yes) => {
            return Err(
                "e2fsck is not installed; -p and -y need it (apt-get install e2fsprogs)".into(),
            );
        }
        None => {
            // What was not checked is not clean: an operational error, as for -p and -y,
            // after the replay (which is done and stays done).
            println!(
                "  e2fsck: not installed (apt-get install e2fsprogs): the full check did not run"
            );
            code |= 8;
        }
        Some(e2fsck) => {
            // A repair writes: claim the image (again) for as long as e2fsck runs. Block
            // devices are claimed without O_EXCL, which e2fsck takes itself.
            let _claims = if matches!(mode, Mode::Preen | Mode::Yes) {
                std::iter::once(target.as_path())
                    .chain(target_journal.as_deref())
                    .map(|path| {
                        tidefs::dev::lock::claim_path(path).map_err(|e| claim_error(image, path, e))
                    })
                    .collect::<Result<Vec<_>, String>>()?
            } else {
                Vec::new()
            };
            let flags = mode.e2fsck_flags();
            let mut command = Command::new(e2fsck);
            command.arg(flags);
            if let Some(journal) = &target_journal {
                command.arg("-j").arg(journal);
            }
            let output = command
                .arg(&target)
                .output()
                .map_err(|e| format!("cannot run e2fsck: {e}"))?;
            let status = output.status.code().unwrap_or(8);
            let text = String::from_utf8_lossy(&output.stdout);
            let print_output = |text: &str| {
                for line in text
                    .lines()
                    .chain(String::from_utf8_lossy(&output.stderr).lines())
                    .filter(|l| !l.is_empty())
                {
                    println!("    {line}");
                }
            };
            let repairing = matches!(mode, Mode::Preen | Mode::Yes);
            // e2fsck's exit status is fsck(8)'s bit set: 1 corrected, 2 corrected and reboot
            // (for a mounted root, which never applies here), 4 left uncorrected, 8 and up
            // operational errors.
            match status {
                0 => println!("  e2fsck {flags}: clean"),
                _ if status & !7 == 0 => {
                    if repairing && status & 3 != 0 {
                        code |= 1;
                    }
                    if status & 4 != 0 {
                        println!("  e2fsck {flags}: ERRORS FOUND (exit {status}):");
                        code |= 4;
                    } else {
                        println!("  e2fsck {flags}: errors corrected (exit {status}):");
                    }
                    print_output(&text);
                }
                other => {
                    println!("  e2fsck {flags}: could not check (exit {other}):");
                    print_output(&text);
                    code |= 8;
                }
            }
        }
    }
    let verdict = match code {
        0 => "clean",
        1 if replayed && mode != Mode::Preen && mode != Mode::Yes => "clean after journal replay",
        1 => "errors corrected",
        _ if code & 8 != 0 => "not fully checked",
        _ => "errors left uncorrected",
    };
    println!("  verdict: {verdict} (exit {code})");
    if mode == Mode::Preen && code & 4 != 0 {
        println!(
            "  -p repairs only what needs no questions: run `tidefs fsck -y {}` to repair the rest",
            image.display()
        );
    }
    Ok(code)
}

/// A temporary directory, removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("tidefs-fsck-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir(&dir)?;
        Ok(Scratch { dir })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies `source` (file or block device) to a new sparse file `target`: only the ranges that
/// hold data are written, so a 1 GiB mostly empty image costs little.
pub fn sparse_copy(source: &Path, target: &Path) -> std::io::Result<()> {
    let mut input = std::fs::File::open(source)?;
    let len = input.seek(SeekFrom::End(0))?;
    let output = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(target)?;
    output.set_len(len)?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < len {
        // Where SEEK_DATA is not supported, treat everything as data and skip zero chunks.
        let (start, end) = match sys::seek_data(&input, offset) {
            Ok(None) => break,
            Ok(Some(start)) => (start, sys::seek_hole(&input, start)?.unwrap_or(len)),
            Err(_) => (offset, len),
        };
        let mut position = start;
        while position < end.min(len) {
            let want = usize::try_from((end.min(len) - position).min(1 << 20)).unwrap_or(1 << 20);
            let got = input.read_at(&mut buffer[..want], position)?;
            if got == 0 {
                break;
            }
            let chunk = &buffer[..got];
            if chunk.iter().any(|&b| b != 0) {
                output.write_all_at(chunk, position)?;
            }
            position += got as u64;
        }
        offset = end.max(position);
    }
    output.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_copy_keeps_contents_and_holes() {
        let dir = tempfile::tempdir().expect("OK to unwrap: test setup");
        let source = dir.path().join("source");
        let file = std::fs::File::create(&source).expect("OK to unwrap: test setup");
        file.set_len(64 << 20).expect("OK to unwrap: test setup");
        file.write_all_at(b"head", 0)
            .expect("OK to unwrap: test setup");
        file.write_all_at(b"middle", 32 << 20)
            .expect("OK to unwrap: test setup");
        file.write_all_at(b"tail", (64 << 20) - 4)
            .expect("OK to unwrap: test setup");
        drop(file);
        let target = dir.path().join("target");
        sparse_copy(&source, &target).expect("OK to unwrap: copy works");
        let a = std::fs::read(&source).expect("OK to unwrap: read");
        let b = std::fs::read(&target).expect("OK to unwrap: read");
        assert!(a == b, "contents differ");
        use std::os::unix::fs::MetadataExt as _;
        let blocks = std::fs::metadata(&target)
            .expect("OK to unwrap: stat")
            .blocks();
        assert!(blocks < 8 * 1024, "copy is not sparse: {blocks} sectors");
    }
}
