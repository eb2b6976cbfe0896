//! The control socket: how `tidefs umount` and `tidefs stats` reach a mount daemon.
//!
//! Each daemon listens on a Unix socket named after its mountpoint
//! (`<runtime dir>/<16 hex digits of a hash of the canonical mountpoint>.sock`), where the runtime
//! dir is the first usable of `/run/tidefs`, `$XDG_RUNTIME_DIR/tidefs` and `/tmp/tidefs-<uid>`.
//!
//! Protocol: the client sends one command line; the daemon answers with JSON lines.
//! - `status` → `{"ok":true,"pid":..,"image":"..","mountpoint":"..","read_only":..,
//!   "commit_seconds":..,"cache_size_bytes":..,"data_mode":".."}` (the options in effect)
//! - `stats` → `{"ok":true,"stats":{"journal_bytes":..,...},"fuse_requests":{"WRITE":..,...}}`
//! - `sync` → `{"ok":true}` once the running transaction is committed and flushed (durable), or
//!   `{"ok":false,"error":".."}`
//! - `unmount` → `{"ok":true,"state":"unmounting"}` once the kernel let go of the mount, then
//!   `{"ok":true,"state":"closed"}` (or `{"ok":false,"error":".."}`) once the file system was
//!   closed cleanly; then the daemon exits, which the client sees as end of file.
//!
//! Beside its socket each daemon keeps a record, `<key>.json` (`{"pid":..,"image":"..",
//! "mountpoint":".."}`), so that a command refused because the image is in use can name the
//! mount that holds it.
//!
//! Invariants:
//! - A socket file nobody listens on is stale: the daemon replaces it; clients treat the mount as
//!   not a tidefs mount.
//! - A record whose pid is gone is stale (the daemon was killed): it is ignored.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tidefs::fs::Stats;

/// The candidate runtime directories, most preferred first.
fn runtime_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/run/tidefs")];
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR") {
        if !xdg.is_empty() {
            dirs.push(PathBuf::from(xdg).join("tidefs"));
        }
    }
    dirs.push(PathBuf::from(format!(
        "/tmp/tidefs-{}",
        crate::sys::geteuid()
    )));
    dirs
}

/// The canonical form of a mountpoint: symlinks resolved where possible; a dead mount (whose
/// `stat` fails) falls back to the lexically absolute path.
pub fn canonical_mountpoint(path: &Path) -> PathBuf {
    path.canonicalize()
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// FNV-1a, 64 bits: a stable short key for a path (socket paths are limited to 108 bytes).
fn path_key(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in path.as_os_str().as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Whether `dir` is a directory of our own that nobody else may write or read: the runtime
/// directory holds the control socket and the log, and one in `/tmp` could have been made
/// first by another user (who could then plant a socket that answers for the daemon, or a
/// symbolic link where the log goes).
fn is_private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.file_type().is_dir() && m.uid() == crate::sys::geteuid() && m.mode() & 0o077 == 0
    })
}

/// The socket file of the daemon serving `mountpoint`, if one exists in a runtime dir of
/// our own.
pub fn find_socket(mountpoint: &Path) -> Option<PathBuf> {
    socket_where(mountpoint, true)
}

/// A socket for `mountpoint` in a runtime dir that is not private to us (`find_socket` passes
/// it over): its daemon may be alive, so a mount without a socket we trust is not proof that
/// the daemon is gone.
pub fn untrusted_socket(mountpoint: &Path) -> Option<PathBuf> {
    socket_where(mountpoint, false)
}

/// The socket file for `mountpoint` in the first runtime dir that has one among those that
/// are (`private`) or are not private to us.
fn socket_where(mountpoint: &Path, private: bool) -> Option<PathBuf> {
    let key = path_key(&canonical_mountpoint(mountpoint));
    runtime_dirs()
        .into_iter()
        .filter(|dir| is_private_dir(dir) == private)
        .map(|dir| dir.join(format!("{key}.sock")))
        .find(|p| p.exists())
}

/// Where a new daemon for `mountpoint` puts its socket and log: the first runtime dir it can
/// create and write and that is private to us ([`is_private_dir`]). Returns (socket path,
/// log path).
pub fn daemon_paths(mountpoint: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    let key = path_key(&canonical_mountpoint(mountpoint));
    let mut last_error = None;
    for dir in runtime_dirs() {
        match std::fs::create_dir_all(&dir) {
            Ok(()) => {
                let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
                if !is_private_dir(&dir) {
                    last_error = Some(std::io::Error::other(format!(
                        "{} is not a directory of our own that only we may use",
                        dir.display()
                    )));
                    continue;
                }
                let probe = dir.join(format!(".probe-{}", std::process::id()));
                match std::fs::write(&probe, b"") {
                    Ok(()) => {
                        let _ = std::fs::remove_file(&probe);
                        return Ok((
                            dir.join(format!("{key}.sock")),
                            dir.join(format!("{key}.log")),
                        ));
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| std::io::Error::other("no runtime directory")))
}

/// The record file that sits beside the socket `socket`.
pub fn record_path(socket: &Path) -> PathBuf {
    socket.with_extension("json")
}

/// Writes the daemon's record beside its socket.
pub fn write_record(socket: &Path, image: &Path, mountpoint: &Path) -> std::io::Result<()> {
    let record = json!({
        "pid": std::process::id(),
        "image": image.display().to_string(),
        "mountpoint": mountpoint.display().to_string(),
    });
    std::fs::write(record_path(socket), format!("{record}\n"))
}

/// The live tidefs mount serving `image`, as (daemon pid, mountpoint), from the daemons'
/// records in every runtime dir. The image is compared by device and inode, so any path to it
/// matches.
pub fn mount_of_image(image: &Path) -> Option<(u32, PathBuf)> {
    use std::os::unix::fs::MetadataExt as _;
    let wanted = std::fs::metadata(image).ok()?;
    runtime_dirs()
        .into_iter()
        .filter(|dir| is_private_dir(dir))
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
        .find_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let record: Value = serde_json::from_str(&text).ok()?;
            let pid = u32::try_from(record.get("pid")?.as_u64()?).ok()?;
            let path = PathBuf::from(record.get("image")?.as_str()?);
            let meta = std::fs::metadata(&path).ok()?;
            let same = meta.dev() == wanted.dev() && meta.ino() == wanted.ino();
            let alive = Path::new(&format!("/proc/{pid}")).exists();
            let mountpoint = PathBuf::from(record.get("mountpoint")?.as_str()?);
            (same && alive).then_some((pid, mountpoint))
        })
}

/// Words for a library error about `path`: a busy image is named with the tidefs mount that
/// holds it where one does; other errors are prefixed with the path.
pub fn describe_open_error(path: &Path, error: &tidefs::FsError) -> String {
    match error {
        tidefs::FsError::Busy(why) => match mount_of_image(path) {
            Some((pid, mountpoint)) => format!(
                "{}: in use by the tidefs mount on {} (pid {pid}); unmount it first \
                 (tidefs umount {})",
                path.display(),
                mountpoint.display(),
                mountpoint.display()
            ),
            None => why.clone(),
        },
        other => format!("{}: {other}", path.display()),
    }
}

/// Why a request to a daemon failed.
#[derive(Debug)]
pub enum ClientError {
    /// No daemon serves this mountpoint.
    NotTidefs,
    /// The daemon answered with an error, or the conversation broke.
    Failed(String),
}

/// A connection to the daemon serving `mountpoint`.
pub struct Client {
    reader: BufReader<UnixStream>,
}

impl Client {
    /// Connects to the daemon of `mountpoint`.
    pub fn connect(mountpoint: &Path) -> Result<Client, ClientError> {
        let socket = find_socket(mountpoint).ok_or(ClientError::NotTidefs)?;
        let stream = UnixStream::connect(&socket).map_err(|_| ClientError::NotTidefs)?;
        Ok(Client {
            reader: BufReader::new(stream),
        })
    }

    /// Gives up on a reply that takes longer than `patience` (for questions the daemon
    /// answers at once, `status` and `stats`: a stopped or wedged daemon is then an error,
    /// not a client that waits for ever). Commands that wait for the device (`sync`,
    /// `unmount`) keep no limit.
    pub fn patience(self, patience: Duration) -> Client {
        let _ = self.reader.get_ref().set_read_timeout(Some(patience));
        self
    }

    /// Sends `command` and returns the first reply.
    pub fn request(&mut self, command: &str) -> Result<Value, ClientError> {
        let stream = self.reader.get_mut();
        stream
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|e| ClientError::Failed(format!("cannot talk to the daemon: {e}")))?;
        self.next_reply()
    }

    /// Reads the next JSON reply line; an `"ok":false` reply becomes an error.
    pub fn next_reply(&mut self) -> Result<Value, ClientError> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                ClientError::Failed(
                    "the daemon did not answer in time (is it stopped or stuck? its log is \
                     beside its socket)"
                        .into(),
                )
            } else {
                ClientError::Failed(format!("cannot read the daemon's reply: {e}"))
            }
        })?;
        if n == 0 {
            return Err(ClientError::Failed(
                "the daemon closed the connection without a reply".into(),
            ));
        }
        let value: Value = serde_json::from_str(&line)
            .map_err(|e| ClientError::Failed(format!("bad reply from the daemon: {e}")))?;
        if value.get("ok") == Some(&Value::Bool(true)) {
            Ok(value)
        } else {
            let error = value
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown error");
            Err(ClientError::Failed(error.to_string()))
        }
    }

    /// Waits until the daemon closes the connection (it does so by exiting).
    pub fn wait_closed(mut self) {
        let mut rest = Vec::new();
        let _ = self.reader.read_to_end(&mut rest);
    }
}

/// What the daemon's control thread needs from the daemon.
pub trait Daemon: Send + Sync + 'static {
    /// The `status` reply.
    fn status(&self) -> Value;
    /// Current counters.
    fn stats(&self) -> Stats;
    /// FUSE requests served so far, by kind (the kernel's opcode name without `FUSE_`).
    fn requests(&self) -> Vec<(String, u64)>;
    /// Commits the running transaction and flushes; returns when it is durable.
    fn sync(&self) -> Result<(), String>;
    /// Asks the kernel to unmount and answers on `stream`: an error, or `unmounting` and later
    /// (when the session ended and the file system is closed) the final reply.
    fn unmount(&self, stream: UnixStream);
}

/// Binds the daemon's socket at `path`, replacing a stale one. Fails if a live daemon owns it.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "this mountpoint is already served by a running tidefs daemon",
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves control connections until the process exits.
pub fn serve<D: Daemon>(listener: UnixListener, daemon: std::sync::Arc<D>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let daemon = daemon.clone();
        let _ = std::thread::Builder::new()
            .name("tidefs-control".into())
            .spawn(move || handle(stream, &*daemon));
    }
}

/// How long `status` and `stats` wait for the daemon's answer.
pub const QUICK_ANSWER: Duration = Duration::from_secs(30);

/// Bytes a control request may take, its newline included.
const MAX_REQUEST: u64 = 64;

fn handle<D: Daemon>(stream: UnixStream, daemon: &D) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    // A request is one short word: a client that sends more without a newline is cut off
    // there, not buffered without end.
    let mut reader = BufReader::new(read_half).take(MAX_REQUEST);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut stream = stream;
    let reply = match line.trim() {
        "status" => daemon.status(),
        "stats" => {
            let requests: serde_json::Map<String, Value> = daemon
                .requests()
                .into_iter()
                .map(|(kind, n)| (kind, Value::from(n)))
                .collect();
            json!({"ok": true, "stats": daemon.stats(), "fuse_requests": requests})
        }
        "sync" => match daemon.sync() {
            Ok(()) => json!({"ok": true}),
            Err(e) => json!({"ok": false, "error": e}),
        },
        "unmount" => {
            daemon.unmount(stream);
            return;
        }
        other => json!({"ok": false, "error": format!("unknown command {other:?}")}),
    };
    let _ = send(&mut stream, &reply);
}

/// Writes one JSON reply line.
pub fn send(stream: &mut UnixStream, value: &Value) -> std::io::Result<()> {
    stream.write_all(format!("{value}\n").as_bytes())
}

/// Whether `/proc/self/mountinfo` lists a tidefs FUSE mount at `path`.
pub fn is_tidefs_mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| tidefs_mount_device(&info, &canonical_mountpoint(path)).is_some())
}

/// The kernel's abort file of the FUSE connection of the tidefs mount at `path`
/// (`/sys/fs/fuse/connections/N/abort`, N the minor of the mount's anonymous device), found
/// without touching the mount itself.
pub fn fuse_abort_file(path: &Path) -> Option<PathBuf> {
    let minor = fuse_mount_minor(path)?;
    Some(PathBuf::from(format!(
        "/sys/fs/fuse/connections/{minor}/abort"
    )))
}

/// The minor number of the anonymous device (major 0) of the newest tidefs FUSE mount at
/// `path`, from `/proc/self/mountinfo`: what names the mount's FUSE connection and its
/// backing-device info in sysfs.
pub fn fuse_mount_minor(path: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    match tidefs_mount_device(&info, &canonical_mountpoint(path))? {
        (0, minor) => Some(minor),
        _ => None,
    }
}

/// The device (`major`, `minor`) of the newest tidefs FUSE mount at `wanted` in a mountinfo
/// text: per line, field 3 is `major:minor` and field 5 the mount point (octal escapes), and
/// the file-system type and source follow the ` - ` separator.
fn tidefs_mount_device(info: &str, wanted: &Path) -> Option<(u32, u32)> {
    info.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let (fs_type, source) = (right.next(), right.next());
        // A direct mount shows type "fuse" and our FSName as the source; one made through
        // fusermount3 shows "fuse.tidefs".
        let ours = fs_type == Some("fuse.tidefs")
            || (fs_type.is_some_and(|t| t.starts_with("fuse")) && source == Some("tidefs"));
        let mount_point = tidefs::dev::lock::unescape_mountinfo(fields.get(4)?);
        if !ours || mount_point != wanted {
            return None;
        }
        let (major, minor) = fields.get(2)?.split_once(':')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidefs::dev::lock::unescape_mountinfo;

    #[test]
    fn path_key_is_stable_and_short() {
        let a = path_key(Path::new("/mnt/a"));
        assert_eq!(a.len(), 16);
        assert_eq!(a, path_key(Path::new("/mnt/a")));
        assert_ne!(a, path_key(Path::new("/mnt/b")));
    }

    /// Goal: the connection of the newest tidefs mount at a path is found, through escapes,
    /// and other file systems or other paths are not taken for it.
    #[test]
    fn the_tidefs_mount_device_is_found_in_mountinfo() {
        let info = "\
36 25 0:32 / /mnt/with\\040space rw,relatime shared:1 - fuse tidefs rw,user_id=0
37 25 0:33 / /mnt/other rw,relatime shared:2 - fuse.sshfs host: rw
38 25 7:0 / /mnt/other rw,relatime shared:3 - ext4 /dev/loop0 rw
39 25 0:35 / /mnt/other rw,relatime shared:4 - fuse.tidefs tidefs rw
40 25 0:270 / /mnt/other rw,relatime shared:5 - fuse tidefs rw
";
        assert_eq!(
            tidefs_mount_device(info, Path::new("/mnt/with space")),
            Some((0, 32))
        );
        assert_eq!(
            tidefs_mount_device(info, Path::new("/mnt/other")),
            Some((0, 270))
        );
        assert_eq!(tidefs_mount_device(info, Path::new("/mnt")), None);
        assert_eq!(
            tidefs_mount_device("garbage line\n", Path::new("/mnt")),
            None
        );
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(
            unescape_mountinfo("/mnt/with\\040space"),
            PathBuf::from("/mnt/with space")
        );
        assert_eq!(unescape_mountinfo("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape_mountinfo("/end\\"), PathBuf::from("/end\\"));
    }

    /// A daemon that answers every request by name, and nothing else.
    struct Idle;

    impl Daemon for Idle {
        fn status(&self) -> Value {
            json!({"ok": true})
        }
        fn stats(&self) -> Stats {
            Stats::default()
        }
        fn requests(&self) -> Vec<(String, u64)> {
            Vec::new()
        }
        fn sync(&self) -> Result<(), String> {
            Ok(())
        }
        fn unmount(&self, _stream: UnixStream) {}
    }

    /// A client that sends bytes without ever ending its line is answered (refused) once
    /// it has sent more than a request can be, instead of being read, and buffered, until
    /// it stops or the 30-second timeout.
    #[test]
    fn an_endless_request_is_cut_off() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let handler = std::thread::spawn(move || handle(server, &Idle));
        client.write_all(&[b'x'; 4096]).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reply = String::new();
        BufReader::new(&client)
            .read_line(&mut reply)
            .expect("the daemon answers without waiting for a newline");
        let reply: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(reply["ok"], json!(false), "{reply}");
        handler.join().unwrap();
    }

    /// A daemon that takes the question and never answers (stopped, or stuck) makes a
    /// client with patience fail with a message saying so, instead of waiting for ever.
    #[test]
    fn a_silent_daemon_is_an_error_once_patience_runs_out() {
        let (client_end, _daemon_end) = UnixStream::pair().unwrap();
        let mut client = Client {
            reader: BufReader::new(client_end),
        }
        .patience(Duration::from_millis(200));
        match client.request("status") {
            Err(ClientError::Failed(why)) => assert!(why.contains("did not answer"), "{why}"),
            other => panic!("a silent daemon gave {other:?}"),
        }
    }

    /// A runtime directory is trusted only when it is a real directory of ours that nobody
    /// else may use: not one opened to others, not a symbolic link to one of ours (either
    /// could have been made in /tmp by another user).
    #[test]
    fn only_private_directories_of_our_own_are_runtime_dirs() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let own = base.path().join("own");
        std::fs::create_dir(&own).unwrap();
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(super::is_private_dir(&own));
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        assert!(!super::is_private_dir(&link));
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!super::is_private_dir(&own));
        assert!(!super::is_private_dir(&base.path().join("missing")));
        let file = base.path().join("file");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(!super::is_private_dir(&file));
        // Another user's, where we may give one away (as root).
        let theirs = base.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        if std::os::unix::fs::chown(&theirs, Some(65534), None).is_ok() {
            assert!(!super::is_private_dir(&theirs));
        }
    }
}
