//! `tidefs mkfs`: the question before an existing file system is overwritten, then the
//! format itself ([`tidefs_mkfs`]), then the root's journaling mode (`--default-mode`).
//!
//! As `mke2fs` does: an image or journal device that already holds an ext2/3/4 file system or
//! an external journal is formatted only with `-F`, or after the user answered yes to a
//! question on the terminal. Without a terminal on stdin, the command refuses and names `-F`.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::Path;

use crate::control;
use crate::CliError;

/// Runs `tidefs mkfs` with the library's `options` (whose `force` is the `-F` flag).
pub fn run(image: &Path, mut options: tidefs_mkfs::MkfsOptions) -> Result<(), CliError> {
    let what = "mkfs";
    if !options.force {
        let targets = std::iter::once(image).chain(options.journal_device.as_deref());
        for target in targets {
            let found = match tidefs_mkfs::existing_format(target) {
                Ok(found) => found,
                Err(tidefs::FsError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(CliError::new(what, format!("{}: {e}", target.display()))),
            };
            if let Some(found) = found {
                confirm_overwrite(target, found)?;
            }
        }
        // Asked and answered: the library need not ask again.
        options.force = true;
    }
    tidefs_mkfs::mkfs(image, &options)
        .map_err(|e| CliError::new(what, control::describe_open_error(image, &e)))
}

/// Gives the root directory of the new image its own journaling `mode` (`--default-mode`).
pub fn set_root_mode(
    image: &Path,
    journal_device: Option<std::path::PathBuf>,
    mode: tidefs::fs::DataMode,
) -> Result<(), CliError> {
    let what = "mkfs --default-mode";
    let opts = tidefs::fs::MountOptions {
        journal_device,
        ..Default::default()
    };
    let fs = tidefs::fs::Fs::open(image, &opts)
        .map_err(|e| CliError::new(what, control::describe_open_error(image, &e)))?;
    fs.set_journal_mode(tidefs::fs::ROOT_INO, Some(mode))
        .and_then(|_| fs.unmount())
        .map_err(|e| CliError::new(what, format!("{}: {e}", image.display())))
}

/// Asks on the terminal whether `target`, which holds `found`, may be overwritten; refuses
/// without a terminal.
fn confirm_overwrite(target: &Path, found: &str) -> Result<(), CliError> {
    let what = "mkfs";
    if !std::io::stdin().is_terminal() {
        return Err(CliError::new(
            what,
            format!(
                "{} contains {found}; use -F (--force) to overwrite it",
                target.display()
            ),
        ));
    }
    let mut stderr = std::io::stderr();
    let _ = write!(
        stderr,
        "{} contains {found}.\nProceed anyway? (y/N) ",
        target.display()
    );
    let _ = stderr.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::new(what, format!("cannot read the answer: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES") {
        Ok(())
    } else {
        Err(CliError::new(
            what,
            format!("{}: not formatted (the answer was no)", target.display()),
        ))
    }
}
