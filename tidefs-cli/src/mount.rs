//! `tidefs mount`: option parsing, the background start-up handshake, and the mount daemon.
//!
//! Start-up in the background (the default): the command re-executes itself as
//! `tidefs mount -f --daemon-child ...` with its standard output on a pipe. The child starts a
//! new session, opens the file system, mounts, and writes one line on that pipe: `mounted` once
//! the mount answers a `stat`, or `error: <why>`. The parent prints the error or exits 0. The
//! parent never forks: a process with threads must not fork, and re-executing avoids the question.
//!
//! Invariants:
//! - The stop signals (SIGTERM, SIGINT, SIGHUP) are blocked before the first thread starts, so
//!   only the signal thread receives them; it unmounts like `tidefs umount` does.
//! - The file system is closed exactly once ([`CloseOnce`]): by `destroy` when the session ends
//!   (umount, `fusermount3 -u`, signal), else by the main thread after the session loop returns.

use std::io::{self, BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fuser::{Config, MountOption, RequestCounts, Session, SessionACL};
use serde_json::{json, Value};
use tidefs::dev::Barrier;
use tidefs::fs::{DataMode, Fs, MountOptions, Stats};

use crate::control;
use crate::fuse_adapter::{self, CloseOnce, FuseFs};
use crate::sys;
use crate::CliError;

/// Mount options as parsed from `-o`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountConfig {
    /// `ro` (the last of `ro`/`rw` wins).
    pub read_only: bool,
    /// `commit=SECONDS`; 0 means the default.
    pub commit_seconds: Option<u64>,
    /// `journal_device=PATH`.
    pub journal_device: Option<PathBuf>,
    /// `cache_size=SIZE`.
    pub cache_size_bytes: Option<u64>,
    /// `readahead=SIZE`: the kernel's read-ahead window for the mount (`None`:
    /// [`DEFAULT_READ_AHEAD`], applied if the kernel lets the daemon).
    pub read_ahead_bytes: Option<u64>,
    /// `allow_other`: every user may use the mount (the default when root mounts).
    pub allow_other: bool,
    /// `private`: only the user who mounted may use the mount (FUSE's own rule), also when
    /// root mounts. The last of `allow_other` and `private` wins.
    pub private: bool,
    /// `nosuid`: set-user-id and set-group-id bits are ignored on exec (`suid` clears it).
    pub nosuid: bool,
    /// `nodev`: device files cannot be opened (`dev` clears it).
    pub nodev: bool,
    /// `noexec`: files cannot be executed (`exec` clears it).
    pub noexec: bool,
    /// `data=lightweight|writeback|ordered|journal`.
    pub data_mode: Option<DataMode>,
    /// `barrier=flush|none`; `none` (benchmarks only) is unsafe.
    pub barrier: Option<Barrier>,
    /// `fenced_commits`: every commit flushes its body before its commit block, so a crashed
    /// image's journal stays replayable by the kernel and e2fsck.
    pub fenced_commits: bool,
    /// `fuse_uring`: serve FUSE requests through io_uring, one queue per CPU (Linux 6.14+,
    /// the `fuse` module's `enable_uring` parameter on).
    pub fuse_uring: bool,
}

/// Options that mount(8) and fstab lines carry for mount(8) itself (or that ask for what
/// tidefs does anyway): accepted and ignored, so `mount -t fuse.tidefs` and fstab work. tidefs
/// never updates access times, so the atime family changes nothing.
const GENERIC_OPTIONS: [&str; 22] = [
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "async",
    "atime",
    "noatime",
    "diratime",
    "nodiratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "silent",
];

/// Whether `item` is a mount(8) option to accept and ignore: one of [`GENERIC_OPTIONS`],
/// `loud`, or a userspace comment (`x-*`, `X-*`, `comment=*`).
fn is_generic_option(item: &str) -> bool {
    GENERIC_OPTIONS.contains(&item)
        || item == "loud"
        || item.starts_with("x-")
        || item.starts_with("X-")
        || item.starts_with("comment=")
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`), if it can be read.
fn memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The kernel's read-ahead window for a tidefs mount unless `-o readahead=` says otherwise.
/// The kernel gives every FUSE mount 128 KiB, one READ request of 128 KiB in flight for a
/// sequential reader, each of them a round trip to the daemon and a device read; with 4 MiB
/// it sends READs of 1 MiB (the largest request the daemon takes), several at once. Measured
/// on 2026-11-28 (a cold `dd` of a 512 MiB file, 2-core VM): 1.4–1.7 s with 128 KiB,
/// 0.74–0.79 s with 4 MiB; 2 MiB, 8 MiB and 16 MiB were no faster.
pub const DEFAULT_READ_AHEAD: u64 = 4 << 20;

/// The largest `readahead=` accepted.
const MAX_READ_AHEAD: u64 = 1 << 30;

impl MountConfig {
    /// Parses `-o` arguments (each a comma-separated list).
    pub fn parse(lists: &[String]) -> Result<MountConfig, String> {
        let mut config = MountConfig::default();
        for item in lists.iter().flat_map(|l| l.split(',')) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            match (key, value) {
                ("", None) => {}
                _ if is_generic_option(item) => {}
                ("ro", None) => config.read_only = true,
                ("rw", None) => config.read_only = false,
                ("allow_other", None) => {
                    config.allow_other = true;
                    config.private = false;
                }
                ("private", None) => {
                    config.private = true;
                    config.allow_other = false;
                }
                ("nosuid", None) => config.nosuid = true,
                ("suid", None) => config.nosuid = false,
                ("nodev", None) => config.nodev = true,
                ("dev", None) => config.nodev = false,
                ("noexec", None) => config.noexec = true,
                ("fenced_commits", None) => config.fenced_commits = true,
                ("fuse_uring", None) => config.fuse_uring = true,
                ("exec", None) => config.noexec = false,
                ("commit", Some(v)) => {
                    let seconds: u64 = v
                        .parse()
                        .map_err(|_| format!("commit={v}: expected a number of seconds"))?;
                    if seconds > 86_400 {
                        return Err(format!("commit={v}: at most 86400 seconds"));
                    }
                    config.commit_seconds = Some(seconds);
                }
                ("data", Some(v)) => {
                    config.data_mode =
                        Some(DataMode::parse(v).ok_or_else(|| {
                            format!("data={v}: expected {}", DataMode::NAMES_HELP)
                        })?);
                }
                ("barrier", Some(v)) => {
                    config.barrier = Some(
                        Barrier::parse(v)
                            .ok_or_else(|| format!("barrier={v}: expected flush or none"))?,
                    );
                }
                ("journal_device", Some(v)) if !v.is_empty() => {
                    config.journal_device = Some(PathBuf::from(v));
                }
                ("cache_size", Some(v)) => {
                    let size = tidefs_mkfs::parse_size(v)
                        .ok_or_else(|| format!("cache_size={v}: expected a size like 64M"))?;
                    if size < (1 << 20) {
                        return Err(format!("cache_size={v}: at least 1M"));
                    }
                    if let Some(memory) = memory_bytes().filter(|&m| size > m) {
                        return Err(format!(
                            "cache_size={v}: more than this machine's memory ({} MiB)",
                            memory >> 20
                        ));
                    }
                    config.cache_size_bytes = Some(size);
                }
                ("readahead", Some(v)) => {
                    let size = tidefs_mkfs::parse_size(v)
                        .ok_or_else(|| format!("readahead={v}: expected a size like 4M"))?;
                    if size % 4096 != 0 {
                        return Err(format!("readahead={v}: a multiple of 4K"));
                    }
                    if size > MAX_READ_AHEAD {
                        return Err(format!("readahead={v}: at most 1G"));
                    }
                    config.read_ahead_bytes = Some(size);
                }
                (
                    "ro" | "rw" | "allow_other" | "private" | "nosuid" | "suid" | "nodev" | "dev"
                    | "noexec" | "exec" | "fenced_commits" | "fuse_uring",
                    Some(_),
                ) => {
                    return Err(format!("option {key} takes no value"));
                }
                (
                    "commit" | "journal_device" | "cache_size" | "readahead" | "data" | "barrier",
                    _,
                ) => {
                    return Err(format!("option {key} needs a value ({key}=...)"));
                }
                _ => return Err(format!("unknown mount option '{item}'")),
            }
        }
        Ok(config)
    }

    /// The options given that change nothing on a read-only mount, which commits nothing:
    /// when and how it would commit (`commit=`, `barrier=`, `fenced_commits`). (`data=` still
    /// sets the mode reported for files and directories without one of their own.)
    pub fn ignored_when_read_only(&self) -> Vec<&'static str> {
        if !self.read_only {
            return Vec::new();
        }
        [
            (self.commit_seconds.is_some(), "commit="),
            (self.barrier.is_some(), "barrier="),
            (self.fenced_commits, "fenced_commits"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }

    /// The options as one `-o` argument, with paths made absolute (the daemon runs in `/`).
    fn to_option_string(&self) -> Result<String, String> {
        let mut items = vec![if self.read_only { "ro" } else { "rw" }.to_string()];
        if let Some(seconds) = self.commit_seconds {
            items.push(format!("commit={seconds}"));
        }
        if let Some(path) = &self.journal_device {
            let path = path
                .canonicalize()
                .map_err(|e| format!("journal device {}: {e}", path.display()))?;
            if path.as_os_str().as_encoded_bytes().contains(&b',') {
                // Options travel to the daemon as one comma-separated list.
                return Err(format!(
                    "journal device {}: a path with a comma cannot be a mount option; give \
                     it a name without one (a hard link, or a bind mount)",
                    path.display()
                ));
            }
            items.push(format!("journal_device={}", path.display()));
        }
        if let Some(size) = self.cache_size_bytes {
            items.push(format!("cache_size={size}"));
        }
        if let Some(size) = self.read_ahead_bytes {
            items.push(format!("readahead={size}"));
        }
        if self.allow_other {
            items.push("allow_other".into());
        }
        if self.private {
            items.push("private".into());
        }
        for (set, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.fenced_commits, "fenced_commits"),
            (self.fuse_uring, "fuse_uring"),
        ] {
            if set {
                items.push(name.into());
            }
        }
        if let Some(mode) = self.data_mode {
            items.push(format!("data={}", mode.name()));
        }
        if let Some(barrier) = self.barrier {
            items.push(format!("barrier={}", barrier.name()));
        }
        Ok(items.join(","))
    }

    /// Whether every user may use the mount: asked with `allow_other`, or by default when root
    /// mounts (as for a kernel file system; the kernel's permission checks apply through
    /// `default_permissions`), unless `private`. Without it FUSE answers EACCES to every uid
    /// but the mounter's.
    pub fn shared_with_all_users(&self, mounter_uid: u32) -> bool {
        !self.private && (self.allow_other || mounter_uid == 0)
    }

    /// The library's options.
    fn mount_options(&self) -> MountOptions {
        let mut opts = MountOptions {
            read_only: self.read_only,
            journal_device: self.journal_device.clone(),
            fenced_commits: self.fenced_commits,
            ..MountOptions::default()
        };
        if let Some(seconds) = self.commit_seconds.filter(|s| *s > 0) {
            opts.commit_interval = Duration::from_secs(seconds);
        }
        if let Some(size) = self.cache_size_bytes {
            opts.cache_size_bytes = usize::try_from(size).unwrap_or(usize::MAX);
        }
        if let Some(mode) = self.data_mode {
            opts.data_mode = mode;
        }
        if let Some(barrier) = self.barrier {
            opts.barrier = barrier;
        }
        opts
    }
}

/// Arguments of `tidefs mount`.
pub struct MountArgs {
    pub foreground: bool,
    pub daemon_child: bool,
    pub options: Vec<String>,
    pub image: PathBuf,
    pub mountpoint: PathBuf,
}

/// `tidefs mount`.
pub fn run(args: MountArgs) -> Result<(), CliError> {
    let what = "mount";
    let config = MountConfig::parse(&args.options).map_err(|e| CliError::usage(what, e))?;
    let ignored = config.ignored_when_read_only();
    // Said once, by the command the user ran (not again by its daemon child).
    if !ignored.is_empty() && !args.daemon_child {
        eprintln!(
            "tidefs mount: note: {} change nothing on a read-only mount (ro)",
            ignored.join(", ")
        );
    }
    check_image(&args.image, what)?;
    if let Some(journal) = &config.journal_device {
        check_image(journal, what)?;
    }
    check_mountpoint(&args.mountpoint, what)?;
    check_fuse(what)?;
    if config.fuse_uring {
        check_fuse_uring(what)?;
    }
    if config.read_ahead_bytes.is_some() && sys::geteuid() != 0 {
        return Err(CliError::new(
            what,
            "readahead: only root may set a mount's read-ahead window (read_ahead_kb in sysfs)",
        ));
    }
    if control::find_socket(&args.mountpoint)
        .map(|s| UnixStream::connect(s).is_ok())
        .unwrap_or(false)
    {
        return Err(CliError::new(
            what,
            format!("{} is already a tidefs mount", args.mountpoint.display()),
        ));
    }
    if args.foreground {
        let notify = if args.daemon_child {
            Notify::Parent
        } else {
            Notify::Terminal
        };
        run_daemon(&args, &config, notify)
    } else {
        start_background(&args, &config)
    }
}

/// Checks that an image (or journal device) exists and is a file or block device.
pub fn check_image(path: &Path, what: &str) -> Result<(), CliError> {
    use std::os::unix::fs::FileTypeExt as _;
    let meta = std::fs::metadata(path)
        .map_err(|e| CliError::new(what, format!("{}: {}", path.display(), io_reason(&e))))?;
    let kind = meta.file_type();
    if !(kind.is_file() || kind.is_block_device()) {
        return Err(CliError::new(
            what,
            format!("{}: not a regular file or block device", path.display()),
        ));
    }
    Ok(())
}

fn check_mountpoint(path: &Path, what: &str) -> Result<(), CliError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        CliError::new(
            what,
            format!("mountpoint {}: {}", path.display(), io_reason(&e)),
        )
    })?;
    if !meta.is_dir() {
        return Err(CliError::new(
            what,
            format!("mountpoint {}: not a directory", path.display()),
        ));
    }
    Ok(())
}

fn check_fuse(what: &str) -> Result<(), CliError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(CliError::new(
            what,
            "/dev/fuse is missing (load the fuse module with `modprobe fuse`, or install fuse3)",
        ));
    }
    if sys::geteuid() != 0 && find_in_path("fusermount3").is_none() {
        return Err(CliError::new(
            what,
            "fusermount3 not found (install it: apt-get install fuse3)",
        ));
    }
    Ok(())
}

/// Where the kernel says whether FUSE over io_uring may be used.
pub const FUSE_URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// `fuse_uring` needs a kernel built with it (the parameter exists) and switched on.
fn check_fuse_uring(what: &str) -> Result<(), CliError> {
    match std::fs::read_to_string(FUSE_URING_SWITCH) {
        Ok(v) if v.trim() == "Y" => Ok(()),
        Ok(_) => Err(CliError::new(
            what,
            format!(
                "fuse_uring: FUSE over io_uring is switched off in this kernel; as root: \
                 echo Y > {FUSE_URING_SWITCH}"
            ),
        )),
        Err(_) => Err(CliError::new(
            what,
            "fuse_uring: this kernel has no FUSE over io_uring (it needs Linux 6.14 or later \
             built with CONFIG_FUSE_IO_URING, and the fuse module loaded)",
        )),
    }
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A short reason for an I/O error, without Rust's "(os error N)" suffix.
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(i) => text[..i].to_lowercase(),
                None => text,
            }
        }
    }
}

/// Starts the daemon as a re-executed child and waits for its verdict.
fn start_background(args: &MountArgs, config: &MountConfig) -> Result<(), CliError> {
    let what = "mount";
    let image = args
        .image
        .canonicalize()
        .map_err(|e| CliError::new(what, format!("{}: {}", args.image.display(), io_reason(&e))))?;
    let mountpoint = args.mountpoint.canonicalize().map_err(|e| {
        CliError::new(
            what,
            format!("{}: {}", args.mountpoint.display(), io_reason(&e)),
        )
    })?;
    let options = config
        .to_option_string()
        .map_err(|e| CliError::new(what, e))?;
    let (_, log_path) = control::daemon_paths(&mountpoint)
        .map_err(|e| CliError::new(what, format!("no runtime directory: {e}")))?;
    // Never through a symbolic link planted where the log goes.
    let log = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&log_path)
    }
    .map_err(|e| CliError::new(what, format!("{}: {e}", log_path.display())))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(what, format!("cannot find my own executable: {e}")))?;
    let mut child = Command::new(exe)
        .arg("mount")
        .arg("-f")
        .arg("--daemon-child")
        .arg("-o")
        .arg(options)
        .arg(&image)
        .arg(&mountpoint)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| CliError::new(what, format!("cannot start the daemon: {e}")))?;
    // OK to unwrap: stdout was set to a pipe just above.
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    match (read, line.trim_end()) {
        (Ok(_), "mounted") => Ok(()),
        (Ok(_), message) if message.starts_with("error: ") => {
            let _ = child.wait();
            Err(CliError::new(what, message.trim_start_matches("error: ")))
        }
        _ => {
            let status = child.wait();
            let tail = std::fs::read_to_string(&log_path)
                .map(|t| t.lines().last().unwrap_or("").to_string())
                .unwrap_or_default();
            Err(CliError::new(
                what,
                format!(
                    "the daemon exited during start-up ({}){}; log: {}",
                    status.map(|s| s.to_string()).unwrap_or_default(),
                    if tail.is_empty() {
                        String::new()
                    } else {
                        format!(": {tail}")
                    },
                    log_path.display()
                ),
            ))
        }
    }
}

/// Where the daemon reports whether it mounted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Notify {
    /// `-f` from a terminal: a message on stderr.
    Terminal,
    /// A background start: one line on stdout, which is the parent's pipe.
    Parent,
}

/// The pipe to the parent while start-up lasts: the panic hook reports through it too.
static PARENT_PIPE: Mutex<bool> = Mutex::new(false);

fn notify_parent(line: &str) {
    let mut open = PARENT_PIPE.lock().unwrap_or_else(|e| e.into_inner());
    if *open {
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
        let _ = sys::stdout_to_null();
        *open = false;
    }
}

/// The running daemon's shared state.
struct DaemonState {
    fs: Arc<Fs>,
    image: PathBuf,
    mountpoint: PathBuf,
    read_only: bool,
    /// The options the file system was opened with, reported by `status`. Never changes.
    options: MountOptions,
    /// Set once the kernel accepted an unmount. [own lock]
    unmount_requested: Mutex<bool>,
    /// Control connections waiting for the final close. [own lock]
    waiters: Mutex<Vec<UnixStream>>,
    /// FUSE requests served, by kind (counted by the session threads).
    requests: RequestCounts,
    /// Whether requests come through FUSE over io_uring (`-o fuse_uring`).
    fuse_uring: bool,
    /// The mount's read-ahead window in sysfs ([`read_ahead_file`]), once the mount answers.
    read_ahead_file: OnceLock<PathBuf>,
    /// Why the mount was taken down again right after it was made (it did not answer, or
    /// the read-ahead asked for could not be set): the daemon's exit status says it too.
    start_error: OnceLock<String>,
}

impl DaemonState {
    /// Asks the kernel to unmount; the session loop then ends. `lazy` detaches a busy mount
    /// (the session ends when its last user lets go) instead of failing with EBUSY.
    fn unmount_kernel(&self, lazy: bool) -> Result<(), String> {
        let mut requested = self
            .unmount_requested
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *requested {
            return Ok(());
        }
        match kernel_unmount(&self.mountpoint, false) {
            Ok(()) => {
                *requested = true;
                Ok(())
            }
            Err(e) if lazy => {
                eprintln!(
                    "tidefs: unmount {}: {e}; detaching lazily",
                    self.mountpoint.display()
                );
                kernel_unmount(&self.mountpoint, true)?;
                *requested = true;
                Ok(())
            }
            Err(e) => Err(format!("cannot unmount {}: {e}", self.mountpoint.display())),
        }
    }
}

/// Unmounts a FUSE mount: umount2 as root, else the setuid `fusermount3 -u`.
pub fn kernel_unmount(mountpoint: &Path, lazy: bool) -> Result<(), String> {
    if sys::geteuid() == 0 {
        return sys::umount(mountpoint, lazy).map_err(|e| io_reason(&e));
    }
    let output = Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("cannot run fusermount3: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
    }
}

impl control::Daemon for DaemonState {
    fn status(&self) -> Value {
        json!({
            "ok": true,
            "pid": std::process::id(),
            "image": self.image.display().to_string(),
            "mountpoint": self.mountpoint.display().to_string(),
            "read_only": self.read_only,
            // The error state (docs/DESIGN.md §5): changes refused since this error.
            "error": self.fs.error(),
            "commit_seconds": self.options.commit_interval.as_secs_f64(),
            "cache_size_bytes": self.options.cache_size_bytes,
            "data_mode": self.options.data_mode.name(),
            // What the kernel has now (root may change it after the mount).
            "read_ahead_bytes": self.read_ahead_file.get().and_then(|f| read_ahead(f).ok()),
            "fuse_transport": if self.fuse_uring { "io_uring" } else { "/dev/fuse" },
            "fuse_requests_over_uring": self.requests.over_uring(),
        })
    }

    fn stats(&self) -> Stats {
        self.fs.stats()
    }

    fn requests(&self) -> Vec<(String, u64)> {
        self.requests.snapshot()
    }

    fn sync(&self) -> Result<(), String> {
        if self.read_only {
            // Nothing can be written, so everything is as durable as it will be.
            return Ok(());
        }
        self.fs
            .sync()
            .map_err(|e| format!("sync {}: {e}", self.mountpoint.display()))
    }

    fn unmount(&self, mut stream: UnixStream) {
        // Hold the waiters while unmounting: the session may end at once, and the main thread
        // must find this stream when it sends the final reply.
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        match self.unmount_kernel(false) {
            Ok(()) => {
                if control::send(&mut stream, &json!({"ok": true, "state": "unmounting"})).is_ok() {
                    waiters.push(stream);
                }
            }
            Err(e) => {
                let _ = control::send(&mut stream, &json!({"ok": false, "error": e}));
            }
        }
    }
}

/// The daemon: opens, mounts, serves until unmounted, closes.
fn run_daemon(args: &MountArgs, config: &MountConfig, notify: Notify) -> Result<(), CliError> {
    let what = "mount";
    if notify == Notify::Parent {
        *PARENT_PIPE.lock().unwrap_or_else(|e| e.into_inner()) = true;
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            notify_parent(&format!("error: internal error: {info}").replace('\n', " "));
            default_hook(info);
        }));
        // The parent's process group and terminal are not ours to keep.
        let _ = sys::setsid();
    }
    // Before any thread exists (the file system starts its own).
    sys::block_signals(&sys::STOP_SIGNALS)
        .map_err(|e| CliError::new(what, format!("cannot block signals: {e}")))?;

    let result = serve(args, config, notify);
    if let Err(e) = &result {
        if notify == Notify::Parent {
            notify_parent(&format!("error: {}", e.why));
        }
    }
    result
}

/// The read-ahead window of the tidefs mount at `mountpoint`, in sysfs: the `read_ahead_kb`
/// of its backing-device info, which each FUSE mount has of its own, named after the mount's
/// anonymous device (`0:MINOR`, found in mountinfo, so that nothing mounted over it since
/// is taken for it).
fn read_ahead_file(mountpoint: &Path) -> Result<PathBuf, String> {
    let minor = control::fuse_mount_minor(mountpoint).ok_or_else(|| {
        format!(
            "no tidefs FUSE mount on {} in /proc/self/mountinfo",
            mountpoint.display()
        )
    })?;
    Ok(PathBuf::from(format!(
        "/sys/class/bdi/0:{minor}/read_ahead_kb"
    )))
}

/// Sets the read-ahead window in `file` ([`read_ahead_file`]) to `bytes`. Only once the
/// kernel has taken the daemon's answer to FUSE's INIT (the mount's root answering a stat
/// shows it has), which would lower the window again to the 128 KiB the kernel offered.
fn set_read_ahead(file: &Path, bytes: u64) -> io::Result<()> {
    std::fs::write(file, format!("{}\n", bytes / 1024))
}

/// Sets the read-ahead window in `file` ([`read_ahead_file`], or why it was not found) to
/// the size `asked` with `-o readahead=`, else to [`DEFAULT_READ_AHEAD`]. A size asked for
/// that cannot be set is an error (the mount fails); the default that cannot be set (a
/// read-only `/sys`) leaves the kernel's window, with a warning for the log.
fn apply_read_ahead(
    file: Result<PathBuf, String>,
    asked: Option<u64>,
) -> Result<Option<String>, String> {
    let failed = |why: String| match asked {
        Some(_) => Err(format!("readahead: {why}")),
        None => Ok(Some(format!("read-ahead left as the kernel set it: {why}"))),
    };
    let file = match file {
        Ok(file) => file,
        Err(why) => return failed(why),
    };
    let bytes = asked.unwrap_or(DEFAULT_READ_AHEAD);
    match set_read_ahead(&file, bytes) {
        Ok(()) => Ok(None),
        // The window may already be the one wanted.
        Err(_) if read_ahead(&file).is_ok_and(|now| now == bytes) => Ok(None),
        Err(e) => failed(format!(
            "cannot set the mount's read-ahead window to {} KiB in {}: {}",
            bytes / 1024,
            file.display(),
            io_reason(&e)
        )),
    }
}

/// The read-ahead window in `file`, in bytes.
fn read_ahead(file: &Path) -> io::Result<u64> {
    let text = std::fs::read_to_string(file)?;
    let kib: u64 = text.trim().parse().map_err(io::Error::other)?;
    Ok(kib * 1024)
}

fn serve(args: &MountArgs, config: &MountConfig, notify: Notify) -> Result<(), CliError> {
    let what = "mount";
    let image = &args.image;
    let mountpoint = control::canonical_mountpoint(&args.mountpoint);
    let options = config.mount_options();
    let fs = Fs::open(image, &options)
        .map_err(|e| CliError::new(what, control::describe_open_error(image, &e)))?;
    let fs = Arc::new(fs);
    let close = Arc::new(CloseOnce::default());
    let fail = |why: String| -> CliError {
        if let Err(e) = close.close(&fs) {
            eprintln!("tidefs: closing {}: {e}", image.display());
        }
        CliError::new(what, why)
    };

    let (socket_path, log_path) = control::daemon_paths(&mountpoint)
        .map_err(|e| fail(format!("no runtime directory for the control socket: {e}")))?;
    let listener = control::bind(&socket_path)
        .map_err(|e| fail(format!("control socket {}: {e}", socket_path.display())))?;
    let _socket_guard = RemoveOnDrop(socket_path.clone());
    let image_path = image.canonicalize().unwrap_or_else(|_| image.clone());
    if let Err(e) = control::write_record(&socket_path, &image_path, &mountpoint) {
        eprintln!("tidefs: cannot write the daemon record: {e}");
    }
    let _record_guard = RemoveOnDrop(control::record_path(&socket_path));

    let mut mount_options = vec![
        MountOption::FSName("tidefs".into()),
        MountOption::Subtype("tidefs".into()),
        MountOption::DefaultPermissions,
    ];
    if config.read_only {
        mount_options.push(MountOption::RO);
    }
    for (set, option) in [
        (config.nosuid, MountOption::NoSuid),
        (config.nodev, MountOption::NoDev),
        (config.noexec, MountOption::NoExec),
    ] {
        if set {
            mount_options.push(option);
        }
    }
    let requests = RequestCounts::default();
    let mut fuse_config = Config::default();
    fuse_config.request_counts = Some(requests.clone());
    fuse_config.mount_options = mount_options;
    fuse_config.n_threads = Some(16);
    fuse_config.clone_fd = true;
    if config.fuse_uring {
        // Entries per CPU: each one holds a request from its arrival to its reply, and an
        // fsync's reply waits for its commit, so this bounds the fsyncs one CPU can have in
        // flight before further requests wait in the kernel.
        fuse_config.uring_depth = Some(64);
    }
    fuse_config.acl = if config.shared_with_all_users(sys::geteuid()) {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    let adapter = FuseFs::new(fs.clone(), close.clone()).with_fuse_uring(config.fuse_uring);
    let mut session = Session::new(adapter, &mountpoint, &fuse_config).map_err(|e| {
        fail(format!(
            "cannot mount on {}: {}",
            mountpoint.display(),
            io_reason(&e)
        ))
    })?;
    // How the session ends the connection if an io_uring queue fails (-o fuse_uring).
    session.set_connection_abort(control::fuse_abort_file(&mountpoint), mountpoint.clone());
    fuse_adapter::forget_attributes_of_changed_blocks(&fs, session.notifier());

    let state = Arc::new(DaemonState {
        fs: fs.clone(),
        image: image.clone(),
        mountpoint: mountpoint.clone(),
        read_only: config.read_only,
        options,
        unmount_requested: Mutex::new(false),
        waiters: Mutex::new(Vec::new()),
        requests,
        fuse_uring: config.fuse_uring,
        read_ahead_file: OnceLock::new(),
        start_error: OnceLock::new(),
    });
    spawn("tidefs-signals", {
        let state = state.clone();
        move || loop {
            match sys::wait_signal(&sys::STOP_SIGNALS) {
                Ok(signal) => {
                    eprintln!("tidefs: signal {signal}: unmounting");
                    if let Err(e) = state.unmount_kernel(true) {
                        eprintln!("tidefs: unmount: {e}");
                    }
                }
                Err(e) => {
                    eprintln!("tidefs: waiting for signals: {e}");
                    return;
                }
            }
        }
    });
    spawn("tidefs-control", {
        let state = state.clone();
        move || control::serve(listener, state)
    });
    spawn("tidefs-ready", {
        let mountpoint = mountpoint.clone();
        let image = image.clone();
        let state = state.clone();
        let read_ahead_asked = config.read_ahead_bytes;
        move || {
            // The mount is usable once its root answers a stat through the session loop.
            let ready = std::fs::metadata(&mountpoint)
                .map_err(|e| format!("the new mount does not answer: {}", io_reason(&e)));
            // Only root may write sysfs (`run` refused `readahead=` from anyone else): a
            // mount by another user keeps the kernel's window without a word.
            let ready = ready.and_then(|_| {
                if read_ahead_asked.is_none() && sys::geteuid() != 0 {
                    return Ok(());
                }
                let file = read_ahead_file(&mountpoint);
                if let Ok(file) = &file {
                    let _ = state.read_ahead_file.set(file.clone());
                }
                if let Some(warning) = apply_read_ahead(file, read_ahead_asked)? {
                    eprintln!("tidefs: {warning}");
                }
                Ok(())
            });
            match ready {
                Ok(()) => match notify {
                    Notify::Parent => notify_parent("mounted"),
                    Notify::Terminal => eprintln!(
                        "tidefs: mounted {} on {} (pid {})",
                        image.display(),
                        mountpoint.display(),
                        std::process::id()
                    ),
                },
                Err(why) => {
                    // In the foreground the exit status and its message come when the
                    // session has ended (`serve`).
                    if notify == Notify::Parent {
                        notify_parent(&format!("error: {why}"));
                    }
                    let _ = state.start_error.set(why);
                    let _ = state.unmount_kernel(true);
                }
            }
        }
    });

    let run_result = session.run();
    let close_result = close.close(&fs);
    let final_reply = match &close_result {
        Ok(()) => json!({"ok": true, "state": "closed"}),
        Err(e) => json!({"ok": false, "error": format!("closing the file system: {e}")}),
    };
    drop(_socket_guard);
    drop(_record_guard);
    let mut waiters = std::mem::take(&mut *state.waiters.lock().unwrap_or_else(|e| e.into_inner()));
    for waiter in &mut waiters {
        let _ = control::send(waiter, &final_reply);
    }
    // Keep the connections open until the process exits: their end of file tells `tidefs
    // umount` that the daemon is gone, not merely that it replied.
    std::mem::forget(waiters);
    match run_result {
        // The log is for failed start-ups and crashes; a clean close leaves nothing to read.
        Ok(()) if close_result.is_ok() && notify == Notify::Parent => {
            let _ = std::fs::remove_file(&log_path);
        }
        Ok(()) => {}
        Err(e) => eprintln!("tidefs: session ended with an error: {e}"),
    }
    close_result
        .map_err(|e| CliError::new("unmount", format!("closing {}: {e}", image.display())))?;
    match state.start_error.get() {
        // Said already (to the parent, or on stderr in the foreground); the exit status
        // says it again.
        Some(why) => Err(CliError::new(what, why.clone())),
        None => Ok(()),
    }
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(body) {
        eprintln!("tidefs: cannot start thread {name}: {e}");
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<MountConfig, String> {
        MountConfig::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_parse() {
        let c = parse(&[
            "ro,commit=7,cache_size=64M,data=journal",
            "allow_other,journal_device=/dev/x,barrier=none,fenced_commits,fuse_uring",
        ])
        .expect("OK to unwrap: valid options");
        assert_eq!(
            c,
            MountConfig {
                read_only: true,
                commit_seconds: Some(7),
                journal_device: Some(PathBuf::from("/dev/x")),
                cache_size_bytes: Some(64 << 20),
                allow_other: true,
                data_mode: Some(DataMode::Journal),
                barrier: Some(Barrier::None),
                fenced_commits: true,
                fuse_uring: true,
                ..MountConfig::default()
            }
        );
        assert_eq!(c.mount_options().barrier, Barrier::None);
        assert!(c.mount_options().fenced_commits);
        // Read-only: how it would commit changes nothing, and the mount says so.
        assert_eq!(
            c.ignored_when_read_only(),
            ["commit=", "barrier=", "fenced_commits"]
        );
        let rw = parse(&["commit=7,data=journal"]).expect("OK to unwrap: valid");
        assert!(rw.ignored_when_read_only().is_empty());
        let ro = parse(&["ro,cache_size=64M"]).expect("OK to unwrap: valid");
        assert!(
            ro.ignored_when_read_only().is_empty(),
            "the cache serves reads"
        );
        let passed_on = parse(&["fenced_commits"])
            .expect("OK to unwrap: valid")
            .to_option_string()
            .expect("OK to unwrap: no path to resolve");
        assert_eq!(passed_on, "rw,fenced_commits");
        // The daemon child gets fuse_uring back from the option string.
        let passed_on = parse(&["fuse_uring"])
            .expect("OK to unwrap: valid")
            .to_option_string()
            .expect("OK to unwrap: no paths");
        assert_eq!(passed_on, "rw,fuse_uring");
        assert!(!parse(&["ro,rw"]).expect("OK to unwrap: valid").read_only);
        assert_eq!(
            parse(&[]).expect("OK to unwrap: valid"),
            MountConfig::default()
        );
        let opts = parse(&["commit=0"])
            .expect("OK to unwrap: valid")
            .mount_options();
        assert_eq!(
            opts.commit_interval,
            MountOptions::default().commit_interval
        );
    }

    /// A cache larger than the machine's memory is refused when the options are read, not
    /// found out by the daemon being killed later; a journal device whose path has a comma
    /// (the options travel as one comma-separated list) is refused with a way out.
    #[test]
    fn oversized_caches_and_comma_paths_are_refused() {
        let memory = super::memory_bytes().expect("/proc/meminfo");
        let too_big = format!("cache_size={}", memory + (1 << 30));
        let e = parse(&[too_big.as_str()]).expect_err("more than the memory");
        assert!(e.contains("memory"), "{e}");
        parse(&["cache_size=64M"]).expect("OK to unwrap: a small cache");
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("jour,nal");
        std::fs::write(&odd, b"").unwrap();
        let config = MountConfig {
            journal_device: Some(odd),
            ..MountConfig::default()
        };
        let e = config.to_option_string().expect_err("a comma in the path");
        assert!(e.contains("comma"), "{e}");
    }

    /// Goal: the read-ahead window asked for is written in KiB, as sysfs takes it; one asked
    /// for that cannot be set fails the mount with the option and the file named; the default
    /// that cannot be set leaves a warning and the mount goes on. Method: a file standing in
    /// for sysfs's, and one in a directory that does not exist (the write fails as sysfs's
    /// does for a user other than root).
    #[test]
    fn read_ahead_is_set_in_kib_and_only_an_asked_size_must_be_set() {
        assert_eq!(
            parse(&["readahead=8M"]).expect("valid").read_ahead_bytes,
            Some(8 << 20)
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("read_ahead_kb");
        std::fs::write(&file, "128\n").unwrap();
        assert_eq!(apply_read_ahead(Ok(file.clone()), Some(1 << 20)), Ok(None));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "1024\n");
        assert_eq!(read_ahead(&file).unwrap(), 1 << 20);
        assert_eq!(apply_read_ahead(Ok(file.clone()), None), Ok(None));
        assert_eq!(read_ahead(&file).unwrap(), DEFAULT_READ_AHEAD);

        let missing = dir.path().join("gone").join("read_ahead_kb");
        let e = apply_read_ahead(Ok(missing.clone()), Some(1 << 20)).expect_err("asked for");
        assert!(e.starts_with("readahead: cannot set"), "{e}");
        assert!(e.contains("to 1024 KiB"), "{e}");
        assert!(e.contains("gone/read_ahead_kb"), "{e}");
        let warning = apply_read_ahead(Ok(missing), None)
            .expect("the default is not an error")
            .expect("a warning");
        assert!(warning.contains("left as the kernel set it"), "{warning}");
    }

    #[test]
    fn root_mounts_are_shared_unless_private() {
        let default = parse(&[]).expect("OK to unwrap: valid");
        assert!(default.shared_with_all_users(0));
        assert!(!default.shared_with_all_users(1000));
        let asked = parse(&["allow_other"]).expect("OK to unwrap: valid");
        assert!(asked.shared_with_all_users(1000));
        let private = parse(&["private"]).expect("OK to unwrap: valid");
        assert!(!private.shared_with_all_users(0));
        // The last of allow_other and private wins.
        let last = parse(&["private,allow_other"]).expect("OK to unwrap: valid");
        assert!(last.shared_with_all_users(1000));
        let last = parse(&["allow_other", "private"]).expect("OK to unwrap: valid");
        assert!(!last.shared_with_all_users(0));
    }

    #[test]
    fn mount_8_options_are_accepted() {
        let c = parse(&[
            "defaults,noatime,nodiratime,relatime,_netdev,nofail,noauto,user,x-systemd.automount",
            "comment=x,nosuid,nodev,noexec,async,rw",
        ])
        .expect("OK to unwrap: valid");
        assert_eq!(
            c,
            MountConfig {
                nosuid: true,
                nodev: true,
                noexec: true,
                ..MountConfig::default()
            }
        );
        let c = parse(&["nosuid,suid,nodev,dev,noexec,exec"]).expect("OK to unwrap: valid");
        assert_eq!(c, MountConfig::default());
        // The daemon gets them back.
        for list in [
            "private,nosuid",
            "data=selective:8K",
            "data=wasteless",
            "readahead=0",
            "readahead=8M",
        ] {
            let c = parse(&[list]).expect("OK to unwrap: valid");
            let again = parse(&[&c.to_option_string().expect("OK to unwrap: no paths")])
                .expect("OK to unwrap: valid");
            assert_eq!(again, c, "{list}");
        }
    }

    #[test]
    fn bad_options_are_refused_with_the_option_named() {
        for (list, needle) in [
            ("bogus", "unknown mount option 'bogus'"),
            ("ro,frob=1", "unknown mount option 'frob=1'"),
            ("commit=soon", "commit=soon"),
            ("commit", "needs a value"),
            ("cache_size=lots", "cache_size=lots"),
            ("cache_size=4K", "at least 1M"),
            ("readahead=fast", "readahead=fast: expected a size"),
            ("readahead=6000", "a multiple of 4K"),
            ("readahead=2G", "at most 1G"),
            ("readahead", "needs a value"),
            ("ro=1", "takes no value"),
            ("data=fast", "data=fast: expected"),
            ("data=selective:0", "data=selective:0: expected"),
            ("data=selective:4KB", "selective:BYTES"),
            ("data", "needs a value"),
            ("barrier=fua", "barrier=fua: expected flush or none"),
            ("barrier", "needs a value"),
            ("private=1", "takes no value"),
            ("fenced_commits=yes", "takes no value"),
            ("fuse_uring=64", "takes no value"),
            ("sync", "unknown mount option 'sync'"),
        ] {
            let err = parse(&[list]).expect_err("must be refused");
            assert!(err.contains(needle), "{list}: {err}");
        }
    }
}
