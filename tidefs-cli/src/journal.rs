//! `tidefs journal get|set`: the journaling mode of directories and files, on a mounted tidefs
//! (through the extended attribute `user.tidefs.journal`, so `getfattr`/`setfattr` see the
//! same) or, with `--image`, on an unmounted image through the library, as `debugfs` would.
//!
//! `get` prints `PATH: MODE` per path (`--json`: a list of `{path, mode, own}`); `set` prints
//! `PATH: OLD -> NEW` per inode it changed. `-R` applies `set` to every directory below PATH
//! and to every file that has an explicit mode of its own (the others follow their directory).
//! Exit codes: 0, 1 when a path fails (the others are still done), 2 for bad usage.

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use serde_json::json;
use tidefs::fs::{DataMode, FileKind, Fs, MountOptions, JOURNAL_MODE_XATTR, ROOT_INO};

use crate::control;
use crate::CliError;

/// Arguments of `tidefs journal`.
#[derive(clap::Subcommand, Debug)]
pub enum JournalCommand {
    /// Print the journaling mode each path obeys.
    Get {
        /// Print JSON: a list of {path, mode, own}.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        image: ImageArgs,
        /// Paths on a mounted tidefs, or inside the image with --image.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Give a directory (its new files and subdirectories inherit it) or a file its own mode.
    Set {
        /// Also every directory below PATH, and every file below it that has a mode of its
        /// own.
        #[arg(short = 'R', long)]
        recursive: bool,
        #[command(flatten)]
        image: ImageArgs,
        /// A path on a mounted tidefs, or inside the image with --image.
        path: PathBuf,
        /// lightweight, writeback, ordered, journal, wasteless, selective or
        /// selective:BYTES.
        mode: String,
    },
}

/// Work on an unmounted image instead of a mount.
#[derive(clap::Args, Debug)]
pub struct ImageArgs {
    /// The image (not mounted); paths are then inside it, from its root.
    #[arg(long)]
    image: Option<PathBuf>,
    /// The image's external journal device.
    #[arg(long, requires = "image")]
    journal_device: Option<PathBuf>,
}

/// An entry of a directory: its path, whether it is a directory, whether a regular file.
type Child = (PathBuf, bool, bool);

/// One path's mode.
struct ModeOf {
    mode: DataMode,
    own: bool,
}

/// Where the modes are read and changed.
trait Modes {
    fn get(&mut self, path: &Path) -> Result<ModeOf, String>;
    /// Sets `path`'s own mode; returns the mode it obeyed before.
    fn set(&mut self, path: &Path, mode: DataMode) -> Result<DataMode, String>;
    /// The entries of `path` if it is a directory: (path, is a directory, is a regular file).
    fn children(&mut self, path: &Path) -> Result<Option<Vec<Child>>, String>;
}

/// Runs `tidefs journal`.
pub fn run(command: JournalCommand) -> Result<u8, CliError> {
    match command {
        JournalCommand::Get { json, image, paths } => {
            with_modes(&image, |modes| Ok(get(modes, &paths, json)))
        }
        JournalCommand::Set {
            recursive,
            image,
            path,
            mode,
        } => {
            let mode = DataMode::parse(&mode).ok_or_else(|| {
                CliError::usage(
                    "journal set",
                    format!(
                        "unknown journaling mode '{mode}': expected {}",
                        DataMode::NAMES_HELP
                    ),
                )
            })?;
            with_modes(&image, |modes| Ok(set(modes, &path, mode, recursive)))
        }
    }
}

/// Runs `f` on the mount, or on the image opened for it (and closed cleanly after).
fn with_modes(
    image: &ImageArgs,
    f: impl FnOnce(&mut dyn Modes) -> Result<u8, CliError>,
) -> Result<u8, CliError> {
    let Some(path) = &image.image else {
        return f(&mut Mounted);
    };
    let what = "journal";
    crate::mount::check_image(path, what)?;
    let opts = MountOptions {
        journal_device: image.journal_device.clone(),
        ..MountOptions::default()
    };
    let fs = Fs::open(path, &opts)
        .map_err(|e| CliError::new(what, control::describe_open_error(path, &e)))?;
    let code = f(&mut Offline { fs: &fs })?;
    fs.unmount().map_err(|e| {
        CliError::new(
            what,
            format!("{}: could not close the image: {e}", path.display()),
        )
    })?;
    Ok(code)
}

fn get(modes: &mut dyn Modes, paths: &[PathBuf], json: bool) -> u8 {
    let mut code = 0;
    let mut out = Vec::new();
    for p in paths {
        match modes.get(p) {
            Ok(m) if json => out.push(json!({
                "path": p.display().to_string(),
                "mode": m.mode.name(),
                "own": m.own,
            })),
            Ok(m) => println!("{}: {}", p.display(), m.mode),
            Err(why) => {
                eprintln!("tidefs: journal get: {}: {why}", p.display());
                code = 1;
            }
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(out));
    }
    code
}

fn set(modes: &mut dyn Modes, path: &Path, mode: DataMode, recursive: bool) -> u8 {
    let mut code = 0;
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        match modes.set(&p, mode) {
            Ok(old) => println!("{}: {old} -> {mode}", p.display()),
            Err(why) => {
                eprintln!("tidefs: journal set: {}: {why}", p.display());
                code = 1;
                continue;
            }
        }
        if !recursive {
            continue;
        }
        match modes.children(&p) {
            Ok(None) => {}
            Ok(Some(children)) => {
                for (child, dir, file) in children.into_iter().rev() {
                    // Files without a mode of their own follow their directory already.
                    if dir || (file && modes.get(&child).is_ok_and(|m| m.own)) {
                        todo.push(child);
                    }
                }
            }
            Err(why) => {
                eprintln!("tidefs: journal set: {}: {why}", p.display());
                code = 1;
            }
        }
    }
    code
}

/// A mounted tidefs, through the extended attribute.
struct Mounted;

impl Mounted {
    fn read(path: &Path) -> Result<DataMode, String> {
        match xattr::get(path, attr_name()) {
            Ok(Some(v)) => std::str::from_utf8(&v)
                .ok()
                .and_then(DataMode::parse)
                .ok_or_else(|| format!("unreadable mode '{}'", String::from_utf8_lossy(&v))),
            Ok(None) => Err(not_here(path)),
            Err(e) => Err(io_why(path, &e)),
        }
    }
}

impl Modes for Mounted {
    fn get(&mut self, path: &Path) -> Result<ModeOf, String> {
        let mode = Mounted::read(path)?;
        let own = xattr::list(path)
            .map_err(|e| io_why(path, &e))?
            .any(|n| n.as_encoded_bytes() == JOURNAL_MODE_XATTR);
        Ok(ModeOf { mode, own })
    }

    fn set(&mut self, path: &Path, mode: DataMode) -> Result<DataMode, String> {
        let old = Mounted::read(path)?;
        xattr::set(path, attr_name(), mode.name().as_bytes()).map_err(|e| io_why(path, &e))?;
        Ok(old)
    }

    fn children(&mut self, path: &Path) -> Result<Option<Vec<Child>>, String> {
        let meta = std::fs::symlink_metadata(path).map_err(|e| io_why(path, &e))?;
        if !meta.is_dir() {
            return Ok(None);
        }
        let entries = std::fs::read_dir(path).map_err(|e| io_why(path, &e))?;
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| io_why(path, &e))?;
            let t = e.file_type().map_err(|err| io_why(&e.path(), &err))?;
            out.push((e.path(), t.is_dir(), t.is_file()));
        }
        out.sort();
        Ok(Some(out))
    }
}

fn attr_name() -> &'static std::ffi::OsStr {
    // The name is ASCII.
    std::ffi::OsStr::new(std::str::from_utf8(JOURNAL_MODE_XATTR).expect("ASCII name"))
}

/// Why a path on the host has no mode.
fn not_here(path: &Path) -> String {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => "a symbolic link has no journaling mode".into(),
        Ok(m) if !m.is_dir() && !m.is_file() => {
            "only directories and regular files have a journaling mode".into()
        }
        _ => "not on a tidefs mount (it has no user.tidefs.journal attribute)".into(),
    }
}

fn io_why(path: &Path, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTSUP) => "not on a tidefs mount (no extended attributes)".into(),
        Some(libc::EINVAL) => "refused by the file system (not a directory or file?)".into(),
        Some(libc::ENODATA) => not_here(path),
        _ => crate::mount::io_reason(e),
    }
}

/// An unmounted image, through the library.
struct Offline<'a> {
    fs: &'a Fs,
}

impl Offline<'_> {
    /// The inode at `path`, from the image's root; symlinks are not followed.
    fn resolve(&self, path: &Path) -> Result<(u64, FileKind), String> {
        let mut ino = ROOT_INO;
        let mut kind = FileKind::Dir;
        for part in path.components() {
            use std::path::Component;
            let name = match part {
                Component::RootDir | Component::CurDir => continue,
                Component::Normal(n) => n.as_encoded_bytes(),
                Component::ParentDir => b"..",
                Component::Prefix(_) => return Err("not a path inside the image".into()),
            };
            if kind != FileKind::Dir {
                return Err("a component of the path is not a directory".into());
            }
            let a = self.fs.lookup(ino, name).map_err(|e| match e {
                tidefs::FsError::NotFound => "no such file or directory".to_string(),
                e => e.to_string(),
            })?;
            ino = a.ino;
            kind = a.kind;
        }
        match kind {
            FileKind::Dir | FileKind::File => Ok((ino, kind)),
            FileKind::Symlink => Err("a symbolic link has no journaling mode".into()),
            _ => Err("only directories and regular files have a journaling mode".into()),
        }
    }
}

impl Modes for Offline<'_> {
    fn get(&mut self, path: &Path) -> Result<ModeOf, String> {
        let (ino, _) = self.resolve(path)?;
        let m = self.fs.journal_mode(ino).map_err(|e| e.to_string())?;
        Ok(ModeOf {
            mode: m.mode,
            own: m.own,
        })
    }

    fn set(&mut self, path: &Path, mode: DataMode) -> Result<DataMode, String> {
        let (ino, _) = self.resolve(path)?;
        self.fs
            .set_journal_mode(ino, Some(mode))
            .map_err(|e| e.to_string())
    }

    fn children(&mut self, path: &Path) -> Result<Option<Vec<Child>>, String> {
        let (ino, kind) = self.resolve(path)?;
        if kind != FileKind::Dir {
            return Ok(None);
        }
        let mut out = Vec::new();
        self.fs
            .readdir(ino, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    let name = std::ffi::OsStr::from_bytes(&e.name);
                    out.push((
                        path.join(name),
                        e.kind == FileKind::Dir,
                        e.kind == FileKind::File,
                    ));
                }
                true
            })
            .map_err(|e| e.to_string())?;
        out.sort();
        Ok(Some(out))
    }
}
