//! The mount(8) helper: `mount -t fuse.tidefs IMAGE DIR` and fstab lines of type `fuse.tidefs`.
//!
//! mount(8) runs `/sbin/mount.fuse.tidefs IMAGE DIR [-sfnv] [-o OPTIONS]` for a file system of
//! type `fuse.tidefs`. `tidefs install-helper` makes that name a symbolic link to the `tidefs`
//! binary, which recognises the name it was started under and mounts in the background exactly
//! like `tidefs mount -o OPTIONS IMAGE DIR`. mount(8)'s own options (`defaults`, `noauto`,
//! `_netdev`, `nofail`, `noatime`, ...) are accepted and ignored by the option parser.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::mount;
use crate::CliError;

/// The name mount(8) looks for.
pub const HELPER_NAME: &str = "mount.fuse.tidefs";

/// Whether the program was started as the mount helper (argv[0] ends in [`HELPER_NAME`]).
pub fn started_as_helper() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == HELPER_NAME))
        .unwrap_or(false)
}

/// Runs as the mount helper with the arguments after argv[0]. Errors are usage errors (exit 2)
/// or mount failures (exit 1), reported as `tidefs: mount: ...`.
pub fn run(args: impl Iterator<Item = OsString>) -> Result<(), CliError> {
    let what = "mount";
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut args = args;
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        match text.as_str() {
            "-o" => {
                let value = args
                    .next()
                    .ok_or_else(|| CliError::usage(what, "-o needs a list of options"))?;
                options.push(value.to_string_lossy().into_owned());
            }
            // -n: no /etc/mtab to write; -s: sloppy; -v: verbose. Nothing to do for them.
            "-n" | "-s" | "-v" => {}
            // -f: fake; mount(8) only wants to know the mount would be attempted.
            "-f" => fake = true,
            // -t fuse.tidefs: the type mount(8) resolved; it is ours.
            "-t" => {
                args.next();
            }
            "-N" => {
                return Err(CliError::usage(
                    what,
                    "-N (mount namespaces) is not supported by the tidefs mount helper",
                ))
            }
            _ if text.starts_with("-o") && text.len() > 2 => options.push(text[2..].to_string()),
            _ if text.starts_with('-') && text.len() > 1 => {
                return Err(CliError::usage(what, format!("unknown helper flag {text}")))
            }
            _ => positional.push(PathBuf::from(arg)),
        }
    }
    let [image, mountpoint] = <[PathBuf; 2]>::try_from(positional).map_err(|_| {
        CliError::usage(
            what,
            format!("usage: {HELPER_NAME} IMAGE MOUNTPOINT [-o OPTIONS]"),
        )
    })?;
    // Check the options even for a fake mount, so `mount -f` reports a typo.
    mount::MountConfig::parse(&options).map_err(|e| CliError::usage(what, e))?;
    if fake {
        return Ok(());
    }
    mount::run(mount::MountArgs {
        foreground: false,
        daemon_child: false,
        options,
        image,
        mountpoint,
    })
}

/// `tidefs install-helper [--dir DIR]`: makes `DIR/mount.fuse.tidefs` (default `/sbin`) a
/// symbolic link to this binary, replacing an older link atomically. Returns the link's path.
pub fn install(dir: &Path) -> Result<PathBuf, CliError> {
    let what = "install-helper";
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| CliError::new(what, format!("cannot find my own executable: {e}")))?;
    let link = dir.join(HELPER_NAME);
    let staging = dir.join(format!(".{HELPER_NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    std::os::unix::fs::symlink(&exe, &staging).map_err(|e| {
        CliError::new(
            what,
            format!(
                "{}: {}{}",
                link.display(),
                mount::io_reason(&e),
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (run it as root)"
                } else {
                    ""
                }
            ),
        )
    })?;
    std::fs::rename(&staging, &link).map_err(|e| {
        let _ = std::fs::remove_file(&staging);
        CliError::new(
            what,
            format!("{}: {}", link.display(), mount::io_reason(&e)),
        )
    })?;
    Ok(link)
}
