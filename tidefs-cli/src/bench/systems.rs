//! The systems a benchmark compares, and their setup and teardown.
//!
//! Names on the command line (`--systems`, comma-separated):
//! - `tidefs:MODE`: tidefs through a real FUSE mount served by the `tidefs mount` daemon;
//! - `tidefs-uring:MODE`: the same with `-o fuse_uring` (FUSE over io_uring, one queue per
//!   CPU; the kernel's `enable_uring` switch must be on);
//! - `tidefs-embedded:MODE`: the library in this process (`Fs::open`), no FUSE; MODE is passed
//!   through as `-o data=MODE`, checked by tidefs' own option parser, so new modes need nothing
//!   here;
//! - `ext4:ordered`, `ext4:writeback`, `ext4:journal`: the kernel's ext4 with that `data=` mode;
//!   `ext4:fast_commit`: `data=ordered` on a file system made with `-O fast_commit`;
//! - `fuse2fs`: e2fsprogs' FUSE driver on an ext4 file system (it does not use the journal).
//!
//! Every system lives on a fresh sparse image file attached to its own loop device with direct
//! I/O (`losetup --direct-io=on`): the loop device passes writes and flushes straight to the
//! backing file, so no system gains from the host's page cache below it, and the device's
//! counters (`/sys/block/loopN/stat`) measure the bytes and flushes each system issued. With
//! [`JournalPlace::External`] the journal gets an image and loop device of its own, so that
//! journal bytes and home bytes are counted apart ([`Traffic`]).
//!
//! On a tidefs mount, [`set_directory_mode`] gives a directory its own journaling mode
//! (`user.tidefs.journal`) and checks that it took.
//!
//! Invariants:
//! - A [`Target`] drops in the order mount, loop devices, image files: nothing is detached while
//!   mounted, and nothing stays behind on an error or a panic.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidefs::fs::{DataMode, Fs, MountOptions};

use crate::CliError;

/// The journal size every system gets, so that none has more room before a checkpoint: 64 MiB,
/// or a sixteenth of a smaller image (at least 4 MiB), in whole MiB.
fn journal_size(image_size: u64) -> u64 {
    (image_size / 16).clamp(4 << 20, 64 << 20) >> 20 << 20
}

/// A kernel ext4 configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext4Mode {
    /// `data=ordered`, the baseline of every ratio.
    Ordered,
    /// `data=writeback`.
    Writeback,
    /// `data=journal`.
    Journal,
    /// `data=ordered` with the `fast_commit` feature.
    FastCommit,
}

impl Ext4Mode {
    const ALL: [Ext4Mode; 4] = [
        Ext4Mode::Ordered,
        Ext4Mode::Writeback,
        Ext4Mode::Journal,
        Ext4Mode::FastCommit,
    ];

    fn name(self) -> &'static str {
        match self {
            Ext4Mode::Ordered => "ordered",
            Ext4Mode::Writeback => "writeback",
            Ext4Mode::Journal => "journal",
            Ext4Mode::FastCommit => "fast_commit",
        }
    }

    /// The `data=` mount option.
    fn data_option(self) -> &'static str {
        match self {
            Ext4Mode::Ordered | Ext4Mode::FastCommit => "ordered",
            Ext4Mode::Writeback => "writeback",
            Ext4Mode::Journal => "journal",
        }
    }
}

/// One system under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum System {
    /// tidefs through FUSE, with this `-o data=` mode (passed through as written).
    Tidefs(String),
    /// tidefs through FUSE over io_uring (`-o fuse_uring`), with this `-o data=` mode.
    TidefsUring(String),
    /// tidefs in this process, with this `-o data=` mode.
    Embedded(String),
    /// The kernel's ext4.
    Ext4(Ext4Mode),
    /// e2fsprogs' fuse2fs.
    Fuse2fs,
}

impl System {
    /// The baseline of every ratio.
    pub const BASELINE: System = System::Ext4(Ext4Mode::Ordered);

    /// The name as written on the command line and in reports.
    pub fn name(&self) -> String {
        match self {
            System::Tidefs(m) => format!("tidefs:{m}"),
            System::TidefsUring(m) => format!("tidefs-uring:{m}"),
            System::Embedded(m) => format!("tidefs-embedded:{m}"),
            System::Ext4(m) => format!("ext4:{}", m.name()),
            System::Fuse2fs => "fuse2fs".to_string(),
        }
    }

    /// The system `text` names; `Err(None)` for an unknown name, `Err(Some(why))` for a tidefs
    /// mode that tidefs' own `-o data=` parser refuses (so that modes tidefs learns need no
    /// change here).
    fn parse(text: &str) -> Result<System, Option<String>> {
        let (kind, mode) = text.split_once(':').unwrap_or((text, ""));
        let tidefs_mode = || -> Result<String, Option<String>> {
            tidefs_options(mode).map_err(Some)?;
            Ok(mode.to_string())
        };
        match kind {
            "tidefs" => tidefs_mode().map(System::Tidefs),
            "tidefs-uring" => tidefs_mode().map(System::TidefsUring),
            "tidefs-embedded" => tidefs_mode().map(System::Embedded),
            "ext4" => Ext4Mode::ALL
                .into_iter()
                .find(|m| m.name() == mode)
                .map(System::Ext4)
                .ok_or(None),
            "fuse2fs" if mode.is_empty() => Ok(System::Fuse2fs),
            _ => Err(None),
        }
    }

    /// Parses a comma-separated `--systems` list; `path_only` refuses the embedded systems
    /// (for workloads that run other programs on a path).
    pub fn parse_list(what: &str, text: &str, path_only: bool) -> Result<Vec<System>, CliError> {
        let mut systems = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let system = System::parse(name).map_err(|why| {
                CliError::usage(
                    what,
                    match why {
                        Some(why) => format!("{name}: {why}"),
                        None => format!(
                            "unknown system '{name}': expected tidefs:MODE, tidefs-uring:MODE, \
                             tidefs-embedded:MODE (MODE as for `tidefs mount -o data=MODE`), ext4:ordered, \
                             ext4:writeback, ext4:journal, ext4:fast_commit or fuse2fs"
                        ),
                    },
                )
            })?;
            if path_only && matches!(system, System::Embedded(_)) {
                return Err(CliError::usage(
                    what,
                    format!("{name}: this benchmark runs programs on a mounted path"),
                ));
            }
            if !systems.contains(&system) {
                systems.push(system);
            }
        }
        if systems.is_empty() {
            return Err(CliError::usage(what, "--systems names no system"));
        }
        Ok(systems)
    }

    /// Parses `--systems` for a benchmark that runs programs on a mounted path: no embedded
    /// systems. Without a list: every tidefs mode and every ext4 mode ([`path_systems`]) and
    /// fuse2fs, which is left out with a note when it is not installed ([`system_names`]).
    pub fn parse_path_list(what: &str, text: Option<&str>) -> Result<Vec<System>, CliError> {
        let names = system_names(what, text, &path_systems());
        System::parse_list(what, &names.join(","), true)
    }

    /// Whether the system is reached through a path (everything but the embedded library).
    pub fn has_path(&self) -> bool {
        !matches!(self, System::Embedded(_))
    }
}

/// The names of a `--systems` list, or of `default` when there is no list; from the default,
/// fuse2fs is left out with a note when it is not installed.
pub fn system_names(what: &str, text: Option<&str>, default: &str) -> Vec<String> {
    let names = |text: &str| -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect()
    };
    let Some(text) = text else {
        let mut names = names(default);
        if names.iter().any(|n| n == "fuse2fs") && find_tool("fuse2fs").is_none() {
            eprintln!(
                "tidefs: {what}: fuse2fs is not installed (Debian package fuse2fs); left out"
            );
            names.retain(|n| n != "fuse2fs");
        }
        return names;
    };
    names(text)
}

/// Sets the journaling mode of the directory `dir` on a tidefs mount to `mode` (the extended
/// attribute `user.tidefs.journal`) and checks that it took: the directory and a file created in it
/// afterwards must both read back `mode`. A tidefs without per-directory modes either refuses the
/// attribute or keeps it as a plain one, which the new file does not inherit; either way the error
/// says so.
pub fn set_directory_mode(dir: &Path, mode: &str) -> Result<(), CliError> {
    use std::os::unix::ffi::OsStrExt;
    let attr = std::ffi::OsStr::from_bytes(tidefs::fs::JOURNAL_MODE_XATTR);
    let failed = |why: String| {
        CliError::new(
            format!("bench: {} {}={mode}", dir.display(), attr.to_string_lossy()),
            why,
        )
    };
    xattr::set(dir, attr, mode.as_bytes()).map_err(|e| {
        failed(format!(
            "the mount refused it ({e}); this tidefs has no per-directory journaling modes"
        ))
    })?;
    let read = |path: &Path| -> Result<Option<String>, CliError> {
        let value =
            xattr::get(path, attr).map_err(|e| failed(format!("{}: {e}", path.display())))?;
        Ok(value.map(|v| {
            String::from_utf8_lossy(&v)
                .trim_end_matches('\0')
                .to_string()
        }))
    };
    let probe = dir.join(".tidefs-mode-probe");
    std::fs::write(&probe, b"").map_err(|e| failed(format!("{}: {e}", probe.display())))?;
    let (on_dir, on_file) = (read(dir), read(&probe));
    let _ = std::fs::remove_file(&probe);
    let (on_dir, on_file) = (on_dir?, on_file?);
    if on_dir.as_deref() == Some(mode) && on_file.as_deref() == Some(mode) {
        return Ok(());
    }
    let shown = |v: Option<String>| v.map_or_else(|| "nothing".to_string(), |v| format!("'{v}'"));
    Err(failed(format!(
        "the mode did not take: the directory reads back {} and a new file in it {}; this \
         tidefs has no per-directory journaling modes",
        shown(on_dir),
        shown(on_file)
    )))
}

/// The default systems of the benchmarks that run programs on a mounted path: tidefs in every
/// data mode the library lists, ext4 in every mode, fuse2fs.
pub fn path_systems() -> String {
    DataMode::ALL
        .iter()
        .map(|m| format!("tidefs:{}", m.name()))
        .chain(Ext4Mode::ALL.map(|m| format!("ext4:{}", m.name())))
        .chain(["fuse2fs".to_string()])
        .collect::<Vec<_>>()
        .join(",")
}

/// tidefs' mount options for `-o data=MODE`, as `tidefs mount` parses them: an unknown mode is
/// refused in tidefs' own words.
fn tidefs_options(mode: &str) -> Result<crate::mount::MountConfig, String> {
    crate::mount::MountConfig::parse(&[format!("data={mode}")])
}

/// A program the benchmarks run, found in PATH or the sbin directories; the error names the
/// Debian package that provides it.
pub fn need_tool(name: &str, package: &str) -> Result<PathBuf, CliError> {
    find_tool(name).ok_or_else(|| {
        CliError::new(
            format!("bench: {name}"),
            format!(
                "not found; install the Debian package {package} (scripts/install-deps.sh does)"
            ),
        )
    })
}

/// A program in PATH or the sbin directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs a command to completion; its stdout, or an error with its stderr.
pub fn run_tool(command: &mut Command, what: &str) -> Result<String, CliError> {
    let out = command
        .output()
        .map_err(|e| CliError::new(format!("bench: {what}"), e.to_string()))?;
    if !out.status.success() {
        return Err(CliError::new(
            format!("bench: {what}"),
            format!(
                "{} ({})",
                String::from_utf8_lossy(&out.stderr).trim(),
                out.status
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What a block device has received so far.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct DeviceCounters {
    /// Bytes written.
    pub bytes_written: u64,
    /// Flush requests (cache flushes, as fdatasync of the backing file).
    pub flushes: u64,
}

impl DeviceCounters {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            flushes: self.flushes.saturating_sub(earlier.flushes),
        }
    }

    /// Both together.
    pub fn plus(self, other: DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            bytes_written: self.bytes_written + other.bytes_written,
            flushes: self.flushes + other.flushes,
        }
    }
}

/// What a system's devices have received: the file system's own device ("home") and, with
/// [`JournalPlace::External`], the journal's.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Traffic {
    /// The file system's device.
    pub home: DeviceCounters,
    /// The external journal device; `None` when the journal is inside the file system (or the
    /// system has none, as fuse2fs).
    pub journal: Option<DeviceCounters>,
}

impl Traffic {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Traffic) -> Traffic {
        Traffic {
            home: self.home.since(earlier.home),
            journal: self.journal.zip(earlier.journal).map(|(a, b)| a.since(b)),
        }
    }

    /// Both devices together.
    pub fn total(self) -> DeviceCounters {
        self.home.plus(self.journal.unwrap_or_default())
    }
}

/// Where a system's journal lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalPlace {
    /// Inside the file system's image.
    Internal,
    /// On its own image and loop device (tidefs: `mkfs --journal-device`, `-o journal_device=`;
    /// ext4: `mke2fs -O journal_dev`, `-J device=`, `-o journal_path=`), so that its bytes are
    /// counted apart. fuse2fs cannot use one and keeps its internal journal.
    External,
}

/// A sparse image file, removed on drop.
struct ImageFile(PathBuf);

impl Drop for ImageFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// An empty mountpoint directory, removed on drop (after the unmount).
struct Mountpoint(Option<PathBuf>);

impl Drop for Mountpoint {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_dir(path);
        }
    }
}

/// Writes what the page cache holds of a freshly formatted image to the disk, so that a loop
/// device doing direct I/O reads what the format wrote.
fn settle(image: &Path) -> Result<(), CliError> {
    std::fs::File::open(image)
        .and_then(|f| f.sync_all())
        .map_err(|e| CliError::new(format!("bench: sync {}", image.display()), e.to_string()))
}

/// A loop device with direct I/O over an image file, detached on drop.
struct LoopDevice {
    /// `/dev/loopN`.
    path: PathBuf,
    /// The image behind it (absolute), to recognise the device as ours when detaching it.
    image: PathBuf,
}

impl LoopDevice {
    /// Attaches `image`; warns when the kernel does buffered I/O instead.
    fn attach(image: &Path, name: &str) -> Result<LoopDevice, CliError> {
        let losetup = need_tool("losetup", "mount")?;
        let out = run_tool(
            Command::new(losetup)
                .args(["--direct-io=on", "--find", "--show"])
                .arg(image),
            "losetup",
        )?;
        let path = PathBuf::from(out.trim());
        if !path.starts_with("/dev") {
            return Err(CliError::new("bench: losetup", format!("printed '{out}'")));
        }
        let image = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
        let device = LoopDevice { path, image };
        if !device.direct_io() {
            eprintln!(
                "tidefs: bench: {name}: the kernel refused direct I/O for {}; it is buffered",
                device.path.display()
            );
        }
        Ok(device)
    }

    /// `loopN`.
    fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Whether the kernel really does direct I/O to the backing file (losetup falls back to
    /// buffered I/O without failing when the backing file system refuses).
    fn direct_io(&self) -> bool {
        std::fs::read_to_string(format!("/sys/block/{}/loop/dio", self.name()))
            .is_ok_and(|s| s.trim() == "1")
    }

    /// Whether the device is still attached to our image. Once it is detached, another
    /// benchmark running at the same time may attach its own image under the same name, and a
    /// detach by name would then take that one away.
    fn still_ours(&self) -> bool {
        let Ok(backing) =
            std::fs::read_to_string(format!("/sys/block/{}/loop/backing_file", self.name()))
        else {
            return false;
        };
        // The kernel appends " (deleted)" once the image file is removed.
        let backing = backing.trim_end_matches('\n');
        let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
        Path::new(backing) == self.image
    }

    /// `/sys/block/loopN/stat`: field 7 is sectors written (512 bytes each), field 16 flushes.
    fn counters(&self) -> DeviceCounters {
        let fields = self.stat();
        DeviceCounters {
            bytes_written: fields.get(6).copied().unwrap_or(0).saturating_mul(512),
            flushes: fields.get(15).copied().unwrap_or(0),
        }
    }

    /// Bytes read so far.
    fn bytes_read(&self) -> u64 {
        self.stat().get(2).copied().unwrap_or(0).saturating_mul(512)
    }

    /// The device's I/O counters (`/sys/block/NAME/stat`: reads, merged reads, sectors read,
    /// ..., sectors written at 6, ..., flushes at 15).
    fn stat(&self) -> Vec<u64> {
        let text =
            std::fs::read_to_string(format!("/sys/block/{}/stat", self.name())).unwrap_or_default();
        text.split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let losetup = find_tool("losetup").unwrap_or_else(|| PathBuf::from("losetup"));
        // A device the kernel still holds for a moment after an unmount answers EBUSY; retry,
        // as long as the device is still ours (it may have gone meanwhile, and its name been
        // given to another image).
        for _ in 0..50 {
            if !self.still_ours() {
                return;
            }
            let ok = Command::new(&losetup)
                .arg("-d")
                .arg(&self.path)
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "tidefs: bench: could not detach {}; run `losetup -d {}`",
            self.path.display(),
            self.path.display()
        );
    }
}

/// An external journal: its loop device, then its image (drop order).
struct ExternalJournal {
    device: LoopDevice,
    _image: ImageFile,
}

/// A mounted system, unmounted on drop.
enum Mounted {
    /// The kernel's ext4 at this mountpoint.
    Kernel(PathBuf),
    /// A `tidefs mount` daemon at this mountpoint.
    Tidefs(PathBuf),
    /// fuse2fs at this mountpoint, served by this child process (run in the foreground, so
    /// that teardown can wait until it has written its last blocks and closed the device).
    Fuse2fs(PathBuf, std::process::Child),
    /// The library in this process.
    Embedded(Arc<Fs>),
    /// Nothing: between the unmount and the mount of [`Target::remount`].
    Unmounted,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        match self {
            Mounted::Embedded(fs) => {
                if let Err(e) = fs.unmount() {
                    eprintln!("tidefs: bench: unmount of the embedded file system: {e}");
                }
            }
            Mounted::Tidefs(mnt) => {
                if crate::umount(mnt).is_err() {
                    lazy_unmount(mnt);
                }
            }
            Mounted::Kernel(mnt) => kernel_unmount(mnt),
            Mounted::Fuse2fs(mnt, child) => {
                kernel_unmount(mnt);
                // fuse2fs writes its cached blocks after the kernel let go of the mount.
                let _ = child.wait();
            }
            Mounted::Unmounted => {}
        }
    }
}

fn kernel_unmount(mnt: &Path) {
    let ok = Command::new("umount")
        .arg(mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        lazy_unmount(mnt);
    }
}

fn lazy_unmount(mnt: &Path) {
    let _ = Command::new("umount").arg("-l").arg(mnt).output();
}

/// Mounts `system` from `device` (its external journal on `journal`, if any) at `mountpoint`
/// (the library opens it instead, for the embedded systems); `name` names it in errors.
fn mount(
    system: &System,
    device: &Path,
    journal_path: Option<PathBuf>,
    mountpoint: &Path,
    name: &str,
) -> Result<Mounted, CliError> {
    let failed = |e: std::io::Error| CliError::new(format!("bench: {name}"), e.to_string());
    Ok(match system {
        System::Embedded(mode) => {
            let config = tidefs_options(mode).map_err(|e| CliError::usage("bench", e))?;
            let opts = MountOptions {
                data_mode: config.data_mode.unwrap_or_default(),
                journal_device: journal_path,
                ..MountOptions::default()
            };
            let fs = Fs::open(device, &opts)
                .map_err(|e| CliError::new(format!("bench: {name}: open"), e.to_string()))?;
            Mounted::Embedded(Arc::new(fs))
        }
        System::Tidefs(mode) | System::TidefsUring(mode) => {
            let exe = std::env::current_exe().map_err(failed)?;
            let mut options = format!("data={mode}");
            if matches!(system, System::TidefsUring(_)) {
                options += ",fuse_uring";
            }
            if let Some(journal) = &journal_path {
                options += &format!(",journal_device={}", journal.display());
            }
            run_tool(
                Command::new(exe)
                    .arg("mount")
                    .arg("-o")
                    .arg(options)
                    .arg(device)
                    .arg(mountpoint),
                &format!("{name}: tidefs mount"),
            )?;
            Mounted::Tidefs(mountpoint.to_path_buf())
        }
        System::Ext4(mode) => {
            let mut options = format!("data={}", mode.data_option());
            if let Some(journal) = &journal_path {
                options += &format!(",journal_path={}", journal.display());
            }
            run_tool(
                Command::new("mount")
                    .args(["-t", "ext4", "-o"])
                    .arg(options)
                    .arg(device)
                    .arg(mountpoint),
                &format!("{name}: mount"),
            )?;
            Mounted::Kernel(mountpoint.to_path_buf())
        }
        System::Fuse2fs => {
            let fuse2fs = need_tool("fuse2fs", "fuse2fs")?;
            let child = Command::new(fuse2fs)
                .arg(device)
                .arg(mountpoint)
                .args(["-f", "-o", "allow_other"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| CliError::new(format!("bench: {name}: fuse2fs"), e.to_string()))?;
            let mounted = Mounted::Fuse2fs(mountpoint.to_path_buf(), child);
            if !wait_mounted(mountpoint) {
                return Err(CliError::new(
                    format!("bench: {name}: fuse2fs"),
                    "the mount did not appear within 10 s",
                ));
            }
            mounted
        }
    })
}

/// A system set up and ready: mounted on its loop device (or open in this process).
pub struct Target {
    /// Which system.
    pub system: System,
    // Field order is drop order: unmount, then detach, then remove the images.
    mounted: Mounted,
    mountpoint: Mountpoint,
    device: LoopDevice,
    journal: Option<ExternalJournal>,
    _image: ImageFile,
}

impl Target {
    /// Makes a fresh file system of `size` bytes for `system` under `dir`, with its journal at
    /// `place`, and mounts it.
    pub fn prepare(
        system: System,
        dir: &Path,
        size: u64,
        place: JournalPlace,
    ) -> Result<Target, CliError> {
        let name = system.name().replace(':', "-");
        let failed = |e: std::io::Error| CliError::new(format!("bench: {name}"), e.to_string());
        std::fs::create_dir_all(dir).map_err(failed)?;
        let fresh_image = |suffix: &str| {
            let path = dir.join(format!("{name}{suffix}.img"));
            let _ = std::fs::remove_file(&path);
            ImageFile(path)
        };
        let image = fresh_image("");
        let journal_image = (place == JournalPlace::External && system != System::Fuse2fs)
            .then(|| fresh_image("-journal"));
        let journal_size = journal_size(size);
        // An external journal is formatted on the benchmark's own (direct-I/O) loop device,
        // for tidefs as for ext4, so its file is only ever seen through that one device: a
        // journal file formatted through another loop device and then attached again could be
        // read stale past a page cache.
        let mut journal = None;
        match (&system, journal_image) {
            (System::Tidefs(_) | System::TidefsUring(_) | System::Embedded(_), journal_image) => {
                match journal_image {
                    Some(journal_image) => {
                        sparse_file(&journal_image.0, journal_size)?;
                        let device = LoopDevice::attach(&journal_image.0, &name)?;
                        format_tidefs(&image.0, size, Some(device.path.clone()))?;
                        journal = Some(ExternalJournal {
                            device,
                            _image: journal_image,
                        });
                    }
                    None => format_tidefs(&image.0, size, None)?,
                }
            }
            (System::Ext4(mode), journal_image) => {
                let fast_commit = *mode == Ext4Mode::FastCommit;
                if let Some(journal_image) = journal_image {
                    format_ext4_journal(&journal_image.0, journal_size)?;
                    let device = LoopDevice::attach(&journal_image.0, &name)?;
                    let external = ExternalJournal {
                        device,
                        _image: journal_image,
                    };
                    format_ext4(&image.0, size, fast_commit, Some(&external.device.path))?;
                    journal = Some(external);
                } else {
                    format_ext4(&image.0, size, fast_commit, None)?;
                }
            }
            (System::Fuse2fs, _) => format_ext4(&image.0, size, false, None)?,
        }
        settle(&image.0)?;
        let device = LoopDevice::attach(&image.0, &name)?;
        let journal_path = journal.as_ref().map(|j| j.device.path.clone());
        let mountpoint = dir.join(format!("{name}.mnt"));
        if system.has_path() {
            std::fs::create_dir_all(&mountpoint).map_err(failed)?;
        }
        let mounted = mount(&system, &device.path, journal_path, &mountpoint, &name)?;
        Ok(Target {
            mountpoint: Mountpoint(system.has_path().then_some(mountpoint)),
            system,
            mounted,
            device,
            journal,
            _image: image,
        })
    }

    /// The mounted root, for systems reached through a path.
    pub fn root(&self) -> Option<&Path> {
        self.mountpoint.0.as_deref()
    }

    /// The library's file system, for the embedded systems.
    pub fn embedded(&self) -> Option<&Arc<Fs>> {
        match &self.mounted {
            Mounted::Embedded(fs) => Some(fs),
            _ => None,
        }
    }

    /// Journal commits so far, where the system counts them: tidefs' own counter; for ext4 the
    /// kernel's jbd2 transactions plus its fast commits; `None` for fuse2fs.
    pub fn commits(&self) -> Option<u64> {
        match &self.mounted {
            Mounted::Embedded(fs) => Some(fs.stats().commits),
            Mounted::Tidefs(_) => self.daemon_stats()?["stats"]["commits"].as_u64(),
            Mounted::Kernel(_) => {
                let first_number = |path: String| -> Option<u64> {
                    let text = std::fs::read_to_string(path).ok()?;
                    text.split_whitespace().find_map(|w| w.parse().ok())
                };
                // jbd2's first line: "N transactions (M requested), each up to B blocks".
                let full = first_number(format!("/proc/fs/jbd2/{}/info", self.jbd2_name()))?;
                // Fast commits are not jbd2 transactions; ext4 counts them apart
                // ("fc stats:" then "N commits").
                let fast = first_number(format!("/proc/fs/ext4/{}/fc_info", self.device.name()))
                    .unwrap_or(0);
                Some(full + fast)
            }
            Mounted::Fuse2fs(..) | Mounted::Unmounted => None,
        }
    }

    /// Operations (and commit closes) that took tidefs's metadata lock so far (`tidefs stats`'
    /// `metadata_locked`); `None` for other systems.
    pub fn metadata_locked(&self) -> Option<u64> {
        match &self.mounted {
            Mounted::Embedded(fs) => Some(fs.stats().metadata_locked),
            Mounted::Tidefs(_) => self.daemon_stats()?["stats"]["metadata_locked"].as_u64(),
            Mounted::Kernel(_) | Mounted::Fuse2fs(..) | Mounted::Unmounted => None,
        }
    }

    /// FUSE requests the tidefs daemon has served so far (`tidefs stats`' `fuse_requests`, all
    /// kinds); `None` for systems without that count (the kernel's ext4, fuse2fs, the library).
    pub fn fuse_requests(&self) -> Option<u64> {
        let reply = self.daemon_stats()?;
        let kinds = reply["fuse_requests"].as_object()?;
        Some(kinds.values().filter_map(serde_json::Value::as_u64).sum())
    }

    /// The tidefs daemon's `stats` reply over its control socket; `None` for other systems or
    /// when the daemon does not answer.
    fn daemon_stats(&self) -> Option<serde_json::Value> {
        let Mounted::Tidefs(mnt) = &self.mounted else {
            return None;
        };
        let mut client = crate::control::Client::connect(mnt).ok()?;
        client.request("stats").ok()
    }

    /// The kernel's name of an ext4 journal (`/proc/fs/jbd2/NAME`, thread `jbd2/NAME`): the
    /// external journal's device, or the file system's device and the journal inode (8).
    fn jbd2_name(&self) -> String {
        match &self.journal {
            Some(journal) => journal.device.name(),
            None => format!("{}-8", self.device.name()),
        }
    }

    /// CPU seconds (user + system) the process or kernel thread serving the file system has
    /// used so far: the `tidefs mount` daemon, fuse2fs, or ext4's jbd2 thread (ext4 does the
    /// rest of its work in the callers' system calls). `None` for the embedded library, whose
    /// work is the calling process's.
    pub fn server_cpu_seconds(&self) -> Option<f64> {
        match &self.mounted {
            Mounted::Embedded(_) | Mounted::Unmounted => None,
            Mounted::Tidefs(mnt) => {
                let mut client = crate::control::Client::connect(mnt).ok()?;
                let pid = client.request("status").ok()?["pid"].as_u64()?;
                cpu_seconds(&pid.to_string())
            }
            Mounted::Fuse2fs(_, child) => cpu_seconds(&child.id().to_string()),
            Mounted::Kernel(_) => {
                let comm = format!("jbd2/{}", self.jbd2_name());
                std::fs::read_dir("/proc")
                    .ok()?
                    .flatten()
                    .find_map(|entry| {
                        let pid = entry.file_name().to_string_lossy().into_owned();
                        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                        (name.trim_end() == comm).then(|| cpu_seconds(&pid))?
                    })
            }
        }
    }

    /// What the devices received so far.
    pub fn counters(&self) -> Traffic {
        Traffic {
            home: self.device.counters(),
            journal: self.journal.as_ref().map(|j| j.device.counters()),
        }
    }

    /// Bytes the file system's own device (not its journal's) has read so far.
    pub fn bytes_read(&self) -> u64 {
        self.device.bytes_read()
    }

    /// Unmounts (or closes the embedded file system) and returns what the devices received
    /// in all, up to the end of the unmount: fuse2fs, for one, writes its cache only then.
    pub fn finish(self) -> Traffic {
        let Target {
            mounted,
            mountpoint,
            device,
            journal,
            ..
        } = self;
        drop(mounted);
        drop(mountpoint);
        Traffic {
            home: device.counters(),
            journal: journal.as_ref().map(|j| j.device.counters()),
        }
    }

    /// Makes everything written so far durable (`sync -f` on the mount; `tidefs sync` for
    /// tidefs, which reaches the daemon whatever the kernel passes on).
    pub fn sync(&self) -> Result<(), CliError> {
        match &self.mounted {
            Mounted::Embedded(fs) => fs
                .sync()
                .map_err(|e| CliError::new("bench: sync", e.to_string())),
            Mounted::Tidefs(mnt) => {
                let exe = std::env::current_exe()
                    .map_err(|e| CliError::new("bench: sync", e.to_string()))?;
                run_tool(Command::new(exe).arg("sync").arg(mnt), "tidefs sync").map(drop)
            }
            Mounted::Kernel(mnt) | Mounted::Fuse2fs(mnt, _) => {
                run_tool(Command::new("sync").arg("-f").arg(mnt), "sync -f").map(drop)
            }
            Mounted::Unmounted => Ok(()),
        }
    }

    /// Unmounts and mounts again, so that nothing the system read or wrote is left in a cache
    /// (the kernel's page cache of a mount goes with it, the daemon's with the daemon, and the
    /// kernel's clean caches are dropped too, as root); returns what the devices had received
    /// at the end of the unmount.
    pub fn remount(&mut self) -> Result<Traffic, CliError> {
        // Unmounted for good, or an error: the lazy unmount that dropping falls back to would
        // leave the file system and its caches alive, and the next mount of its device would
        // find them (a warm restart taken for a cold one).
        match &self.mounted {
            Mounted::Kernel(mnt) | Mounted::Fuse2fs(mnt, _) => {
                run_tool(Command::new("umount").arg(mnt), "umount")?;
            }
            Mounted::Tidefs(mnt) => crate::umount(mnt)?,
            Mounted::Embedded(_) | Mounted::Unmounted => {}
        }
        // Waits for fuse2fs to end; the others find nothing left to unmount.
        drop(std::mem::replace(&mut self.mounted, Mounted::Unmounted));
        let traffic = self.counters();
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3\n");
        let name = self.system.name();
        let journal = self.journal.as_ref().map(|j| j.device.path.clone());
        // (The embedded systems have none, and mount none.)
        let mountpoint = self.mountpoint.0.clone().unwrap_or_default();
        self.mounted = mount(&self.system, &self.device.path, journal, &mountpoint, &name)?;
        Ok(traffic)
    }
}

/// CPU seconds (user + system, all threads) of process `pid` (`self` for this one) from
/// `/proc/PID/stat`, whose fields 14 and 15 count clock ticks of USER_HZ, which Linux fixes
/// at 100 for user space on every architecture it runs tidefs on.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces; count after it.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // `rest` starts at field 3, so field 14 is index 11.
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

/// Formats an image for tidefs, with its journal on the device `journal` if given: the one place
/// the benchmarks call `tidefs_mkfs`.
fn format_tidefs(image: &Path, size: u64, journal: Option<PathBuf>) -> Result<(), CliError> {
    let opts = tidefs_mkfs::MkfsOptions {
        size: Some(size),
        // An external journal is a device of exactly that size already.
        journal_size: journal.is_none().then(|| journal_size(size)),
        journal_device: journal,
        ..tidefs_mkfs::MkfsOptions::default()
    };
    tidefs_mkfs::mkfs(image, &opts).map_err(|e| CliError::new("bench: mkfs", e.to_string()))
}

/// A sparse file of `size` bytes at `path`.
fn sparse_file(path: &Path, size: u64) -> Result<(), CliError> {
    let failed =
        |e: std::io::Error| CliError::new(format!("bench: {}", path.display()), e.to_string());
    std::fs::File::create(path)
        .map_err(failed)?
        .set_len(size)
        .map_err(failed)
}

/// Formats an external ext4 journal of `size` bytes (`mke2fs -O journal_dev`).
fn format_ext4_journal(image: &Path, size: u64) -> Result<(), CliError> {
    let mke2fs = need_tool("mke2fs", "e2fsprogs")?;
    sparse_file(image, size)?;
    run_tool(
        Command::new(mke2fs)
            .args(["-F", "-q", "-O", "journal_dev", "-b", "4096"])
            .arg(image),
        "mke2fs -O journal_dev",
    )
    .map(drop)
}

/// Formats an image for the kernel's ext4 (and fuse2fs): 4 KiB blocks, the same journal size
/// as tidefs (or the external journal on `journal_device`), inode tables and journal written
/// out now rather than in the background.
fn format_ext4(
    image: &Path,
    size: u64,
    fast_commit: bool,
    journal_device: Option<&Path>,
) -> Result<(), CliError> {
    let mkfs = need_tool("mkfs.ext4", "e2fsprogs")?;
    sparse_file(image, size)?;
    let journal = match journal_device {
        Some(device) => format!("device={}", device.display()),
        None => format!("size={}", journal_size(size) >> 20),
    };
    let mut command = Command::new(mkfs);
    command.args([
        "-F",
        "-q",
        "-b",
        "4096",
        "-J",
        &journal,
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0",
    ]);
    if fast_commit {
        command.args(["-O", "fast_commit"]);
    }
    run_tool(command.arg(image), "mkfs.ext4").map(drop)
}

/// Waits (up to 10 s) until the kernel lists a mount at `path`.
fn wait_mounted(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if is_mounted(path) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn is_mounted(path: &Path) -> bool {
    let wanted = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let wanted = wanted.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| info.lines().any(|l| l.split(' ').nth(4) == Some(&wanted)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every system's name parses back to it; bad names and misplaced systems are usage
    /// errors, and a tidefs mode is refused in the words of tidefs' own option parser.
    #[test]
    fn system_names_round_trip() {
        let all: Vec<System> = DataMode::ALL
            .into_iter()
            .flat_map(|m| {
                [
                    System::Tidefs(m.name().to_string()),
                    System::TidefsUring(m.name().to_string()),
                    System::Embedded(m.name().to_string()),
                ]
            })
            .chain(Ext4Mode::ALL.map(System::Ext4))
            .chain([System::Fuse2fs])
            .collect();
        let text: Vec<String> = all.iter().map(System::name).collect();
        assert_eq!(
            System::parse_list("t", &text.join(","), false).ok(),
            Some(all)
        );
        for bad in ["ext4", "tidefs:fast", "fuse2fs:x", "xfs:ordered", "tidefs"] {
            let e = System::parse_list("t", bad, false).err();
            assert_eq!(e.map(|e| e.code), Some(2), "{bad}");
        }
        let e = System::parse_list("t", "tidefs-embedded:fast", false).err();
        let why = tidefs_options("fast").err();
        assert_eq!(
            e.map(|e| e.why),
            why.map(|w| format!("tidefs-embedded:fast: {w}"))
        );
        assert!(System::parse_list("t", "tidefs-embedded:ordered", true).is_err());
        assert!(path_systems().contains("tidefs:journal,"));
        assert!(path_systems().ends_with("ext4:fast_commit,fuse2fs"));
        assert_eq!(journal_size(1 << 30), 64 << 20);
        assert_eq!(journal_size(128 << 20), 8 << 20);
        assert_eq!(journal_size(16 << 20), 4 << 20);
    }

    /// Goal: CPU time is read from /proc for this process, and a missing process has none.
    #[test]
    fn cpu_seconds_of_this_process() {
        assert!(cpu_seconds("self").is_some_and(|s| s >= 0.0));
        assert_eq!(cpu_seconds("0"), None);
    }
}
