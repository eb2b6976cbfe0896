//! Goal: the promises an administrator relies on. A root mount is usable by every user the
//! kernel's permission checks allow, and `-o private` keeps it to the mounter; `mount -t
//! fuse.tidefs` and fstab lines work through the mount(8) helper; `tidefs sync` makes what was
//! written durable (checked after SIGKILL and recovery, not on the live mount); an image has
//! one owner: a second mount, mkfs or writing fsck of a served image is refused naming the
//! mount, and an image the kernel has mounted is refused; `tidefs fsck -p`/`-y` repair with
//! fsck(8)'s exit codes while `-n` leaves the image untouched.
//! Method: drive the real binary (and mount(8), umount(8), losetup, debugfs) against real
//! images and real FUSE and loop mounts; every mount has a guard that removes it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// The uid and gid of `nobody`, the other user of the multi-user tests.
const NOBODY: u32 = 65534;

/// A hash of a file's bytes, to show it unchanged.
fn digest(path: &Path) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let bytes = std::fs::read(path).expect("OK to unwrap: the image is readable");
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Skips (printing why) unless this machine can mount and we are root.
fn root_mount_skip(test: &str) -> bool {
    if let Some(why) = mount_skip_reason() {
        skip(test, &why);
        return true;
    }
    if !is_root() {
        skip(test, "needs root");
        return true;
    }
    false
}

/// Goal: a user other than root who asks for a read-ahead window (`-o readahead=`, which only
/// root may set in sysfs) is refused before anything is mounted, with the option named and
/// exit status 1. Method: `tidefs mount` as `nobody` on an image and a mountpoint of its own.
#[test]
fn readahead_is_refused_to_users_other_than_root() {
    let test = "readahead_is_refused_to_users_other_than_root";
    if root_mount_skip(test) {
        return;
    }
    let m = Mount::unmounted("64M", &[]);
    for path in [&m.image, &m.mnt] {
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY))
            .expect("OK to unwrap: chown as root");
    }
    let out = run_as(
        NOBODY,
        NOBODY,
        &format!(
            "{} mount -o readahead=1M {} {}",
            env!("CARGO_BIN_EXE_tidefs"),
            m.image.display(),
            m.mnt.display()
        ),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("readahead: only root may set"),
        "{}",
        stderr(&out)
    );
    assert!(!is_mounted(&m.mnt), "the refused mount was made");
}

#[test]
fn root_mount_is_usable_by_other_users_and_private_keeps_it_to_the_mounter() {
    let test = "root_mount_is_usable_by_other_users";
    if root_mount_skip(test) {
        return;
    }
    let Some(mut m) = Mount::new(test, "64M", &[], &[]) else {
        return;
    };
    std::fs::write(m.path("shared"), b"for everyone\n").expect("OK to unwrap: write");
    set_mode(&m.path("shared"), 0o644);
    std::fs::write(m.path("secret"), b"root only\n").expect("OK to unwrap: write");
    set_mode(&m.path("secret"), 0o600);
    let shared = m.path("shared").display().to_string();
    let secret = m.path("secret").display().to_string();

    let out = run_as(NOBODY, NOBODY, &format!("cat {shared}"));
    assert!(out.status.success(), "nobody: {}", stderr(&out));
    assert_eq!(stdout(&out), "for everyone\n");
    // The kernel's permission checks still apply to the other user.
    let out = run_as(NOBODY, NOBODY, &format!("cat {secret}"));
    assert!(!out.status.success(), "nobody read a 0600 root file");
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let out = run_as(NOBODY, NOBODY, &format!("echo x > {}/new", m.mnt.display()));
    assert!(!out.status.success(), "nobody wrote into a 0755 root dir");

    m.umount_ok();
    m.mount(&["private"]);
    let out = run_as(NOBODY, NOBODY, &format!("cat {shared}"));
    assert!(!out.status.success(), "a private mount served another user");
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let out = run_as(NOBODY, NOBODY, &format!("stat {}", m.mnt.display()));
    assert!(
        !out.status.success(),
        "a private mount answered another user"
    );
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    // The mounter still uses it.
    assert_eq!(
        std::fs::read(m.path("shared")).expect("OK to unwrap: read"),
        b"for everyone\n"
    );
}

/// Puts `/sbin/mount.fuse.tidefs` back as it was when dropped.
struct HelperGuard {
    link: PathBuf,
    previous: Option<PathBuf>,
}

impl HelperGuard {
    fn install() -> HelperGuard {
        let link = PathBuf::from("/sbin/mount.fuse.tidefs");
        let previous = std::fs::read_link(&link).ok();
        let out = output(tidefs().arg("install-helper"));
        assert!(out.status.success(), "install-helper: {}", stderr(&out));
        assert!(
            stdout(&out).contains("/sbin/mount.fuse.tidefs"),
            "{}",
            stdout(&out)
        );
        let target = std::fs::read_link(&link).expect("OK to unwrap: the helper is a link");
        let exe = Path::new(env!("CARGO_BIN_EXE_tidefs"))
            .canonicalize()
            .expect("OK to unwrap: the binary exists");
        assert_eq!(target, exe);
        HelperGuard { link, previous }
    }
}

impl Drop for HelperGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        if let Some(previous) = &self.previous {
            let _ = std::os::unix::fs::symlink(previous, &self.link);
        }
    }
}

/// Unmounts with umount(8) and waits until the daemon `pid` has closed the file system.
fn umount8(m: &mut Mount, pid: u32) {
    let out = output(Command::new("umount").arg(&m.mnt));
    assert!(out.status.success(), "umount: {}", stderr(&out));
    m.mounted = false;
    // umount(8) returns when the kernel let go; the daemon then closes the file system.
    assert!(
        wait_gone(pid, Duration::from_secs(60)),
        "the daemon did not exit after umount(8)"
    );
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "e2fsck -fn after umount(8):\n{text}");
}

#[test]
fn mount_8_and_fstab_lines_mount_through_the_helper() {
    let test = "mount_8_and_fstab_lines";
    if root_mount_skip(test) {
        return;
    }
    if tool("mount").is_none() {
        skip(test, "mount(8) is not installed");
        return;
    }
    let _helper = HelperGuard::install();
    let mut m = Mount::unmounted("64M", &[]);

    let out = output(
        Command::new("mount")
            .args(["-t", "fuse.tidefs"])
            .arg(&m.image)
            .arg(&m.mnt),
    );
    assert!(
        out.status.success(),
        "mount -t fuse.tidefs: {}",
        stderr(&out)
    );
    m.mounted = true;
    assert!(is_mounted(&m.mnt));
    std::fs::write(m.path("via-mount-8"), b"hello from mount(8)\n").expect("OK to unwrap: write");
    let pid = m.daemon_pid();
    umount8(&mut m, pid);

    let fstab = m.dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# an fstab line as an administrator writes it\n\
             {} {} fuse.tidefs defaults,noatime,nodev,nosuid,_netdev,nofail,commit=5 0 0\n",
            m.image.display(),
            m.mnt.display()
        ),
    )
    .expect("OK to unwrap: write fstab");
    let out = output(Command::new("mount").arg("-T").arg(&fstab).arg(&m.mnt));
    assert!(out.status.success(), "mount -T fstab: {}", stderr(&out));
    m.mounted = true;
    assert_eq!(
        std::fs::read(m.path("via-mount-8")).expect("OK to unwrap: read"),
        b"hello from mount(8)\n"
    );
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("OK to unwrap: mountinfo");
    let wanted = m.mnt.canonicalize().expect("OK to unwrap: mountpoint");
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&*wanted.to_string_lossy()))
        .expect("OK to unwrap: the fstab mount is listed");
    for flag in ["nosuid", "nodev"] {
        assert!(
            line.split(' ').nth(5).is_some_and(|f| f.contains(flag)),
            "{flag}: {line}"
        );
    }
    std::fs::write(m.path("via-fstab"), b"written through the fstab mount\n")
        .expect("OK to unwrap: write");
    let pid = m.daemon_pid();
    umount8(&mut m, pid);

    // A typo in the options is refused by the helper, as by `tidefs mount`.
    let out = output(
        Command::new("mount")
            .args(["-t", "fuse.tidefs", "-o", "frobnicate"])
            .arg(&m.image)
            .arg(&m.mnt),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown mount option 'frobnicate'"),
        "{}",
        stderr(&out)
    );
    assert!(!is_mounted(&m.mnt));

    m.mount(&[]);
    assert_eq!(
        std::fs::read(m.path("via-fstab")).expect("OK to unwrap: read"),
        b"written through the fstab mount\n"
    );
}

/// Goal: what was written before `tidefs sync` returned survives a SIGKILL of the daemon.
/// Method: mount with the commit interval at its maximum (a day), so nothing but the sync can
/// commit; write without fsync; sync; kill; recover with `tidefs fsck`; read after a remount.
#[test]
fn tidefs_sync_makes_writes_durable_across_sigkill() {
    let Some(mut m) = Mount::new("tidefs_sync", "64M", &[], &["commit=86400"]) else {
        return;
    };
    std::fs::create_dir(m.path("dir")).expect("OK to unwrap: mkdir");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(m.path("dir/data"), &data).expect("OK to unwrap: write");
    std::fs::write(m.path("small"), b"125 bytes or so").expect("OK to unwrap: write");
    let out = output(tidefs().arg("sync").arg(&m.mnt));
    assert!(out.status.success(), "sync: {}", stderr(&out));
    assert_eq!(stderr(&out), "");

    let pid = m.daemon_pid();
    kill(pid, libc::SIGKILL).expect("OK to unwrap: kill");
    assert!(wait_gone(pid, Duration::from_secs(10)));
    let _ = m.umount();
    assert!(!is_mounted(&m.mnt));
    m.mounted = false;
    let out = output(tidefs().arg("fsck").arg(&m.image));
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "fsck after SIGKILL:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "{text}");
    m.mount(&[]);
    assert!(std::fs::read(m.path("dir/data")).expect("OK to unwrap: read") == data);
    assert_eq!(
        std::fs::read(m.path("small")).expect("OK to unwrap: read"),
        b"125 bytes or so"
    );
}

#[test]
fn sync_of_a_plain_directory_says_it_is_not_tidefs() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let out = output(tidefs().arg("sync").arg(dir.path()));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("tidefs: sync: ")
            && stderr(&out).contains("is not a tidefs mount"),
        "{}",
        stderr(&out)
    );
}

/// Goal: a second `tidefs mount` of a served image fails naming the first mount's pid and
/// mountpoint, and leaves the image as it was.
#[test]
fn a_second_mount_of_a_served_image_is_refused_naming_the_first() {
    let Some(m) = Mount::new("a_second_mount_of_a_served_image", "64M", &[], &[]) else {
        return;
    };
    std::fs::write(m.path("kept"), b"first mount's data").expect("OK to unwrap: write");
    let out = output(tidefs().arg("sync").arg(&m.mnt));
    assert!(out.status.success(), "{}", stderr(&out));
    let before = digest(&m.image);
    let pid = m.daemon_pid();
    let other = m.dir.path().join("other");
    std::fs::create_dir(&other).expect("OK to unwrap: mkdir");

    let out = output(tidefs().arg("mount").arg(&m.image).arg(&other));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.starts_with("tidefs: mount: "), "{err}");
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    let mountpoint = m.mnt.canonicalize().expect("OK to unwrap: mountpoint");
    assert!(err.contains(&*mountpoint.to_string_lossy()), "{err}");
    assert!(!is_mounted(&other));
    assert!(
        digest(&m.image) == before,
        "the refused mount changed the image"
    );
    assert_eq!(
        std::fs::read(m.path("kept")).expect("OK to unwrap: read"),
        b"first mount's data"
    );
}

/// Goal: mkfs and a writing fsck of a served image are refused (naming the mount) and change
/// nothing; `fsck -n` gives a clear answer instead of checking a torn copy; once unmounted,
/// the image is free again for all of them.
#[test]
fn mkfs_and_fsck_of_a_served_image_are_refused() {
    let Some(mut m) = Mount::new("mkfs_and_fsck_of_a_served_image", "64M", &[], &[]) else {
        return;
    };
    std::fs::write(m.path("kept"), b"still here").expect("OK to unwrap: write");
    let out = output(tidefs().arg("sync").arg(&m.mnt));
    assert!(out.status.success(), "{}", stderr(&out));
    let before = digest(&m.image);
    let mountpoint = m.mnt.canonicalize().expect("OK to unwrap: mountpoint");
    let names_the_mount = |out: &std::process::Output| {
        let err = stderr(out);
        assert!(err.contains("in use by the tidefs mount on"), "{err}");
        assert!(err.contains(&*mountpoint.to_string_lossy()), "{err}");
    };

    let out = output(tidefs().args(["mkfs", "-F"]).arg(&m.image));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("tidefs: mkfs: "),
        "{}",
        stderr(&out)
    );
    names_the_mount(&out);
    for flags in [&[][..], &["-p"], &["-y"], &["-n"]] {
        let out = output(tidefs().arg("fsck").args(flags).arg(&m.image));
        assert_eq!(
            out.status.code(),
            Some(8),
            "fsck {flags:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).starts_with("tidefs: fsck: "),
            "{}",
            stderr(&out)
        );
        names_the_mount(&out);
    }
    assert!(
        digest(&m.image) == before,
        "a refused command changed the image"
    );
    assert_eq!(
        std::fs::read(m.path("kept")).expect("OK to unwrap: read"),
        b"still here"
    );

    m.umount_ok();
    let out = output(tidefs().args(["fsck", "-n"]).arg(&m.image));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = output(tidefs().arg("fsck").arg(&m.image));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = output(tidefs().args(["mkfs", "-F"]).arg(&m.image));
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A kernel mount of an image through a loop device, removed (and the loop device detached)
/// on drop.
struct KernelMount {
    mnt: PathBuf,
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        kernel_umount(&self.mnt);
    }
}

/// Removes a kernel mount: umount(8), else a lazy umount, so that no test leaves one behind.
fn kernel_umount(mnt: &Path) {
    let clean = Command::new("umount")
        .arg(mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    if !clean && is_mounted(mnt) {
        let _ = Command::new("umount").arg("-l").arg(mnt).status();
    }
}

/// The tests that make kernel mounts of loop devices run one at a time: each finds a free loop
/// device, and their failures are easier to read alone.
static KERNEL_MOUNTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Goal: an image the kernel has mounted (here read-only, through a loop device) is refused by
/// `tidefs mount`, mkfs and a writing fsck, naming the kernel's mountpoint.
#[test]
fn an_image_the_kernel_has_mounted_is_refused() {
    let test = "an_image_the_kernel_has_mounted_is_refused";
    if root_mount_skip(test) {
        return;
    }
    let _serial = KERNEL_MOUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let m = Mount::unmounted("64M", &[]);
    let kernel_mnt = m.dir.path().join("kernel");
    std::fs::create_dir(&kernel_mnt).expect("OK to unwrap: mkdir");
    let out = output(
        Command::new("mount")
            .args(["-t", "ext4", "-o", "ro,loop"])
            .arg(&m.image)
            .arg(&kernel_mnt),
    );
    if !out.status.success() {
        skip(
            test,
            &format!("the kernel cannot loop-mount ext4 here: {}", stderr(&out)),
        );
        return;
    }
    let _kernel = KernelMount {
        mnt: kernel_mnt.clone(),
    };
    let before = digest(&m.image);
    let kernel_mnt = kernel_mnt.canonicalize().expect("OK to unwrap: mountpoint");
    let names_the_kernel_mount = |out: &std::process::Output| {
        let err = stderr(out);
        assert!(err.contains("mounted by the kernel on"), "{err}");
        assert!(err.contains(&*kernel_mnt.to_string_lossy()), "{err}");
        assert!(err.contains("/dev/loop"), "{err}");
    };

    let out = output(tidefs().arg("mount").arg(&m.image).arg(&m.mnt));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    names_the_kernel_mount(&out);
    assert!(!is_mounted(&m.mnt));
    let out = output(tidefs().args(["mkfs", "-F"]).arg(&m.image));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    names_the_kernel_mount(&out);
    let out = output(tidefs().args(["fsck", "-p"]).arg(&m.image));
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    names_the_kernel_mount(&out);
    assert!(
        digest(&m.image) == before,
        "a refused command changed the image"
    );
    let out = output(Command::new("umount").arg(&kernel_mnt));
    assert!(out.status.success(), "umount: {}", stderr(&out));
    assert!(!is_mounted(&kernel_mnt));
}

/// Marks a free block in use in the block bitmap with debugfs (which keeps the checksums
/// right): a leaked block, with wrong free counts, that e2fsck -p may repair.
fn leak_a_block(image: &Path) {
    let out = output(
        Command::new(tool("debugfs").expect("OK to unwrap: checked by the caller"))
            .args(["-w", "-R", "setb 9000"])
            .arg(image),
    );
    assert!(out.status.success(), "debugfs: {}", stderr(&out));
}

/// Goal: `fsck -n` reports a leaked block (exit 4) without writing; `-p` repairs it (exit 1),
/// after which the image is clean (exit 0); `-y` does the same; conflicting flags are a usage
/// error (exit 16).
#[test]
fn fsck_p_and_y_repair_with_fsck_8_exit_codes() {
    let test = "fsck_p_and_y_repair";
    if tool("mke2fs").is_none() || tool("e2fsck").is_none() || tool("debugfs").is_none() {
        skip(test, "e2fsprogs (mke2fs, e2fsck, debugfs) is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("fs.img");
    mkfs(&image, "64M", &[]);
    let fsck = |flags: &[&str]| {
        let out = output(tidefs().arg("fsck").args(flags).arg(&image));
        (
            out.status.code(),
            format!("{}{}", stdout(&out), stderr(&out)),
        )
    };

    for repair in ["-p", "-y"] {
        leak_a_block(&image);
        let before = digest(&image);
        let (code, text) = fsck(&["-n"]);
        assert_eq!(code, Some(4), "{text}");
        assert!(text.contains("Block bitmap differences"), "{text}");
        assert!(digest(&image) == before, "fsck -n wrote to the image");
        let (code, text) = fsck(&[repair]);
        assert_eq!(code, Some(1), "fsck {repair}: {text}");
        assert!(text.contains("errors corrected"), "{text}");
        let (code, text) = fsck(&["-n"]);
        assert_eq!(code, Some(0), "after fsck {repair}: {text}");
        let (code, text) = fsck(&[repair]);
        assert_eq!(code, Some(0), "a second fsck {repair}: {text}");
    }

    let before = digest(&image);
    for flags in [
        &["-n", "-p"][..],
        &["-p", "-y"],
        &["-n", "-y"],
        &["--bogus"],
    ] {
        let (code, text) = fsck(flags);
        assert_eq!(code, Some(16), "fsck {flags:?}: {text}");
        assert!(text.starts_with("tidefs: "), "{text}");
    }
    assert!(digest(&image) == before);
}

/// A loop device attached to an image, detached on drop (after the mount on it is removed).
struct LoopDevice {
    device: PathBuf,
    mounted_on: Option<PathBuf>,
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(mnt) = &self.mounted_on {
            kernel_umount(mnt);
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Goal: a block device the kernel has mounted is refused by `tidefs mount` and mkfs, naming
/// the kernel's mountpoint; once the kernel let go, tidefs mounts the same device.
/// Method: attach the image to a loop device and mount that device read-only with ext4.
#[test]
fn a_block_device_the_kernel_has_mounted_is_refused() {
    let test = "a_block_device_the_kernel_has_mounted_is_refused";
    if root_mount_skip(test) {
        return;
    }
    if tool("losetup").is_none() {
        skip(test, "losetup is not installed");
        return;
    }
    let _serial = KERNEL_MOUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mount::unmounted("64M", &[]);
    let out = output(
        Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&m.image),
    );
    if !out.status.success() {
        skip(test, &format!("no loop device: {}", stderr(&out)));
        return;
    }
    let mut device = LoopDevice {
        device: PathBuf::from(stdout(&out).trim()),
        mounted_on: None,
    };
    let kernel_mnt = m.dir.path().join("kernel");
    std::fs::create_dir(&kernel_mnt).expect("OK to unwrap: mkdir");
    let out = output(
        Command::new("mount")
            .args(["-t", "ext4", "-o", "ro"])
            .arg(&device.device)
            .arg(&kernel_mnt),
    );
    assert!(out.status.success(), "mount: {}", stderr(&out));
    device.mounted_on = Some(kernel_mnt.clone());
    let kernel_mnt = kernel_mnt.canonicalize().expect("OK to unwrap: mountpoint");

    let out = output(tidefs().arg("mount").arg(&device.device).arg(&m.mnt));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("mounted by the kernel on"), "{err}");
    assert!(err.contains(&*kernel_mnt.to_string_lossy()), "{err}");
    assert!(!is_mounted(&m.mnt));
    let out = output(tidefs().args(["mkfs", "-F"]).arg(&device.device));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("mounted by the kernel on"),
        "{}",
        stderr(&out)
    );

    let out = output(Command::new("umount").arg(&kernel_mnt));
    assert!(out.status.success(), "umount: {}", stderr(&out));
    device.mounted_on = None;
    let device_path = device.device.display().to_string();
    m.image = device.device.clone();
    m.mount(&[]);
    std::fs::write(m.path("on-the-device"), b"x").expect("OK to unwrap: write");
    // While tidefs serves the device (opened with O_EXCL), the kernel cannot mount it.
    let out = output(
        Command::new("mount")
            .args(["-t", "ext4", "-o", "ro"])
            .arg(&device_path)
            .arg(&kernel_mnt),
    );
    assert!(
        !out.status.success(),
        "the kernel mounted a device tidefs serves"
    );
    m.umount_ok();
}

/// Goal: `tidefs umount` never takes a mount for one whose daemon is gone (and detaches it
/// without a clean close) just because the daemon's socket is where it no longer trusts it: a
/// runtime directory that is not private to the user (another user's, or open to others) is
/// passed over when looking for sockets, and a socket found only there makes `umount` refuse,
/// naming it, with the mount left mounted and served. Method: the daemon's socket moved from
/// /run/tidefs into `$XDG_RUNTIME_DIR/tidefs` made 0755, `tidefs umount` run with that
/// `XDG_RUNTIME_DIR`; then the socket put back and the mount unmounted cleanly.
#[test]
fn umount_does_not_detach_a_mount_whose_socket_is_in_a_public_directory() {
    let test = "umount_does_not_detach_a_mount_whose_socket_is_in_a_public_directory";
    let Some(mut m) = Mount::new(test, "64M", &[], &[]) else {
        return;
    };
    let wanted = m.mnt.canonicalize().expect("OK to unwrap: mountpoint");
    let record = std::fs::read_dir("/run/tidefs")
        .expect("OK to unwrap: root's runtime dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "json")
                && std::fs::read_to_string(p)
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| v.get("mountpoint")?.as_str().map(PathBuf::from))
                    == Some(wanted.clone())
        })
        .expect("OK to unwrap: the daemon's record");
    let socket = record.with_extension("sock");
    let public = m.dir.path().join("xdg");
    std::fs::create_dir_all(public.join("tidefs")).expect("OK to unwrap: mkdir");
    set_mode(&public.join("tidefs"), 0o755);
    let moved = public.join("tidefs").join(socket.file_name().unwrap());
    std::fs::rename(&socket, &moved).expect("OK to unwrap: move the socket");
    let out = output(
        tidefs()
            .env("XDG_RUNTIME_DIR", &public)
            .arg("umount")
            .arg(&m.mnt),
    );
    std::fs::rename(&moved, &socket).expect("OK to unwrap: put the socket back");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not private"), "{}", stderr(&out));
    assert!(is_mounted(&m.mnt), "the mount was detached");
    std::fs::write(m.path("still"), b"served").expect("OK to unwrap: write");
    m.umount_ok();
}
