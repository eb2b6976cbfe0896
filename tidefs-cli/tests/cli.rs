//! Goal: every command fails with `tidefs: <what>: <why>` and the right exit code on bad input,
//! and `tidefs mkfs` makes images that `e2fsck -fn` finds clean.
//! Method: run the built binary on missing, malformed and foreign inputs; no mount succeeds here
//! except where the test needs the library to refuse an image.

mod common;

use common::*;

fn assert_failure(out: &std::process::Output, code: i32, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(err.starts_with("tidefs: "), "stderr: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
}

/// Goal: mounting a missing image fails with exit 1 naming the file. Method: run `tidefs mount` on
/// a path that does not exist.
#[test]
fn mount_of_a_missing_image_fails() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let out = output(
        tidefs()
            .arg("mount")
            .arg(dir.path().join("nope.img"))
            .arg(dir.path()),
    );
    assert_failure(
        &out,
        1,
        &["tidefs: mount: ", "nope.img", "no such file or directory"],
    );
}

/// Goal: an unknown or malformed `-o` option is a usage error (exit 2) that names it. Method: two
/// bad option lists.
#[test]
fn unknown_mount_option_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("x.img");
    std::fs::write(&image, b"").expect("OK to unwrap: write");
    let out = output(
        tidefs()
            .args(["mount", "-o", "ro,frobnicate"])
            .arg(&image)
            .arg(dir.path()),
    );
    assert_failure(
        &out,
        2,
        &["tidefs: mount: ", "unknown mount option 'frobnicate'"],
    );
    let out = output(
        tidefs()
            .args(["mount", "-o", "commit=soon"])
            .arg(&image)
            .arg(dir.path()),
    );
    assert_failure(&out, 2, &["commit=soon"]);
}

/// Goal: a missing or non-directory mountpoint is refused with exit 1 and the reason. Method: both
/// cases.
#[test]
fn mount_on_a_missing_or_non_directory_mountpoint_fails() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("x.img");
    std::fs::write(&image, b"").expect("OK to unwrap: write");
    let out = output(
        tidefs()
            .arg("mount")
            .arg(&image)
            .arg(dir.path().join("missing")),
    );
    assert_failure(
        &out,
        1,
        &["mountpoint", "missing", "no such file or directory"],
    );
    let out = output(tidefs().arg("mount").arg(&image).arg(&image));
    assert_failure(&out, 1, &["not a directory"]);
}

/// Goal: `umount` and `stats` on a plain directory say it is not a tidefs mount (exit 1).
#[test]
fn umount_and_stats_of_a_plain_directory_say_it_is_not_tidefs() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    for command in ["umount", "stats"] {
        let out = output(tidefs().arg(command).arg(dir.path()));
        assert_failure(
            &out,
            1,
            &[&format!("tidefs: {command}: "), "is not a tidefs mount"],
        );
    }
}

/// Goal: fsck of a missing image is fsck(8)'s operational error, exit 8.
#[test]
fn fsck_of_a_missing_image_is_an_operational_error() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let out = output(tidefs().arg("fsck").arg(dir.path().join("nope.img")));
    assert_failure(&out, 8, &["tidefs: fsck: ", "nope.img"]);
}

/// Goal: a malformed size is a usage error and creates nothing; a missing argument is a usage
/// error.
#[test]
fn bad_sizes_are_usage_errors() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let out = output(
        tidefs()
            .args(["mkfs", "--size", "12X"])
            .arg(dir.path().join("x.img")),
    );
    assert_failure(&out, 2, &["12X", "is not a size"]);
    assert!(!dir.path().join("x.img").exists());
    let out = output(tidefs().args(["mount"]));
    assert_failure(&out, 2, &["tidefs: usage: "]);
}

/// Goal: `tidefs crashtest` refuses an unknown canary, image shape or workload family and a
/// `--file-dev` that is not a directory as usage errors (exit 2) naming the value, before it
/// formats anything. Method: one bad option at a time.
#[test]
fn bad_crashtest_options_are_usage_errors() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--canary", "no-flush-at-all"],
            "unknown canary 'no-flush-at-all'",
        ),
        (&["--image", "huge"], "unknown image 'huge'"),
        (&["--workloads", "many"], "unknown workload family 'many'"),
        (
            &["--file-dev", "/nonexistent/dir"],
            "--file-dev /nonexistent/dir: not a directory",
        ),
    ];
    for (args, needle) in cases {
        let out = output(tidefs().arg("crashtest").args(args));
        assert_failure(&out, 2, &["crashtest", needle]);
    }
}

/// Goal: mkfs refuses an image below the minimum size, saying so. Method: `mkfs --size 1M`.
#[test]
fn mkfs_refuses_a_tiny_image() {
    if tool("mke2fs").is_none() {
        skip("mkfs_refuses_a_tiny_image", "e2fsprogs is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let out = output(
        tidefs()
            .args(["mkfs", "--size", "1M"])
            .arg(dir.path().join("x.img")),
    );
    assert_failure(&out, 1, &["tidefs: mkfs: ", "minimum"]);
}

/// Goal: mkfs output is healthy ext4 by e2fsprogs' own checker, for default and explicit
/// journal sizes, and an existing file keeps its size when no --size is given.
#[test]
fn mkfs_images_are_clean_by_e2fsck() {
    if tool("mke2fs").is_none() || tool("e2fsck").is_none() {
        skip(
            "mkfs_images_are_clean_by_e2fsck",
            "e2fsprogs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("a.img");
    mkfs(&image, "64M", &[]);
    assert_eq!(
        std::fs::metadata(&image).expect("OK to unwrap").len(),
        64 << 20
    );
    let (code, text) = e2fsck(&image);
    assert_eq!(code, 0, "{text}");

    let image = dir.path().join("b.img");
    mkfs(&image, "128M", &["--journal-size", "16M"]);
    let (code, text) = e2fsck(&image);
    assert_eq!(code, 0, "{text}");
    let dump = output(
        std::process::Command::new(tool("dumpe2fs").expect("OK to unwrap: e2fsprogs"))
            .arg("-h")
            .arg(&image),
    );
    assert!(
        stdout(&dump).contains("Total journal size:       16M"),
        "{}",
        stdout(&dump)
    );

    // Re-format an existing file without --size: it keeps its size.
    let out = output(tidefs().args(["mkfs", "-F"]).arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::metadata(&image).expect("OK to unwrap").len(),
        128 << 20
    );
}

/// Goal: a file that is not ext4 is refused by mount (exit 1, the problem named) and by fsck
/// (exit 8), and is not modified.
#[test]
fn bad_magic_is_refused_and_the_image_is_untouched() {
    if let Some(why) = mount_skip_reason() {
        skip("bad_magic_is_refused_and_the_image_is_untouched", &why);
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("junk.img");
    let junk: Vec<u8> = (0..(16u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&image, &junk).expect("OK to unwrap: write");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("OK to unwrap: mkdir");
    let out = output(tidefs().arg("mount").arg(&image).arg(&mnt));
    assert_failure(&out, 1, &["tidefs: mount: ", "junk.img"]);
    assert!(
        stderr(&out).to_lowercase().contains("magic"),
        "{}",
        stderr(&out)
    );
    assert!(!is_mounted(&mnt));
    let out = output(tidefs().arg("fsck").arg(&image));
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(std::fs::read(&image).expect("OK to unwrap: read") == junk);
}

/// Goal: an image with an ext4 feature tidefs does not implement is refused with the feature
/// named, and left as it was.
#[test]
fn unsupported_feature_is_named() {
    if let Some(why) = mount_skip_reason() {
        skip("unsupported_feature_is_named", &why);
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("inline.img");
    let file = std::fs::File::create(&image).expect("OK to unwrap: create");
    file.set_len(32 << 20).expect("OK to unwrap: size");
    let out = output(
        std::process::Command::new(tool("mke2fs").expect("OK to unwrap: e2fsprogs"))
            .args(["-t", "ext4", "-F", "-q", "-b", "4096", "-O", "inline_data"])
            .arg(&image),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(&image).expect("OK to unwrap: read");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("OK to unwrap: mkdir");
    let out = output(tidefs().arg("mount").arg(&image).arg(&mnt));
    assert_failure(&out, 1, &["tidefs: mount: ", "inline_data"]);
    assert!(!is_mounted(&mnt));
    assert!(std::fs::read(&image).expect("OK to unwrap: read") == before);
}

/// Goal: mkfs never overwrites an existing ext2/3/4 file system (or external journal) without
/// -F, as mke2fs: without a terminal it refuses naming -F and leaves the image byte for byte as
/// it was; with -F it formats.
#[test]
fn mkfs_refuses_to_overwrite_a_file_system_without_force() {
    if tool("mke2fs").is_none() || tool("debugfs").is_none() {
        skip(
            "mkfs_refuses_to_overwrite_a_file_system_without_force",
            "e2fsprogs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("a.img");
    mkfs(&image, "64M", &[]);
    // Populate it: a directory the new format would lose.
    let out = output(
        std::process::Command::new(tool("debugfs").expect("OK to unwrap: checked"))
            .args(["-w", "-R", "mkdir precious"])
            .arg(&image),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(&image).expect("OK to unwrap: read");
    for extra in [&[][..], &["--size", "128M"]] {
        let out = output(tidefs().arg("mkfs").args(extra).arg(&image));
        assert_failure(
            &out,
            1,
            &["tidefs: mkfs: ", "contains an ext4 file system", "-F"],
        );
        assert!(
            std::fs::read(&image).expect("OK to unwrap: read") == before,
            "a refused mkfs {extra:?} changed the image"
        );
    }

    // An ext2 file system made by mke2fs itself is named as such.
    let ext2 = dir.path().join("ext2.img");
    std::fs::File::create(&ext2)
        .and_then(|f| f.set_len(16 << 20))
        .expect("OK to unwrap: create");
    let out = output(
        std::process::Command::new(tool("mke2fs").expect("OK to unwrap: checked"))
            .args(["-q", "-F", "-t", "ext2"])
            .arg(&ext2),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(tidefs().arg("mkfs").arg(&ext2));
    assert_failure(&out, 1, &["contains an ext2 file system"]);

    let out = output(tidefs().args(["mkfs", "-F"]).arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(tidefs().args(["mkfs", "--force"]).arg(&ext2));
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, text) = e2fsck(&ext2);
    assert_eq!(code, 0, "{text}");
}

/// Goal: at a terminal, mkfs asks before overwriting; "n" (or nothing) keeps the image, "y"
/// formats it. Method: run it under script(1), which gives it a pseudo-terminal.
#[test]
fn mkfs_asks_at_a_terminal() {
    if tool("mke2fs").is_none() || tool("script").is_none() {
        skip(
            "mkfs_asks_at_a_terminal",
            "e2fsprogs or script(1) is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("a.img");
    mkfs(&image, "64M", &[]);
    let before = std::fs::read(&image).expect("OK to unwrap: read");
    let at_terminal = |answer: &str| {
        use std::io::Write as _;
        let command = format!("{} mkfs {}", env!("CARGO_BIN_EXE_tidefs"), image.display());
        let mut child = std::process::Command::new(tool("script").expect("OK to unwrap: checked"))
            .args(["-q", "-e", "-c", &command, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("OK to unwrap: script runs");
        child
            .stdin
            .take()
            .expect("OK to unwrap: piped")
            .write_all(answer.as_bytes())
            .expect("OK to unwrap: write the answer");
        let out = child.wait_with_output().expect("OK to unwrap: script ends");
        (out.status.code(), stdout(&out))
    };
    let (code, text) = at_terminal("n\n");
    assert!(text.contains("contains an ext4 file system"), "{text}");
    assert!(text.contains("Proceed anyway? (y/N)"), "{text}");
    assert_eq!(code, Some(1), "{text}");
    assert!(std::fs::read(&image).expect("OK to unwrap: read") == before);
    let (code, text) = at_terminal("y\n");
    assert_eq!(code, Some(0), "{text}");
    assert!(std::fs::read(&image).expect("OK to unwrap: read") != before);
}

/// Goal: a format that fails leaves nothing behind: a file mkfs created is removed, and an
/// existing file keeps its length and bytes.
#[test]
fn a_failed_mkfs_leaves_nothing_behind() {
    if tool("mke2fs").is_none() {
        skip(
            "a_failed_mkfs_leaves_nothing_behind",
            "e2fsprogs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("huge.img");
    let out = output(tidefs().args(["mkfs", "--size", "100T"]).arg(&image));
    assert_failure(&out, 1, &["tidefs: mkfs: ", "huge.img"]);
    assert!(
        !image.exists(),
        "a failed mkfs left {} behind",
        image.display()
    );

    let existing = dir.path().join("existing.img");
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(&existing, &bytes).expect("OK to unwrap: write");
    let out = output(tidefs().args(["mkfs", "--size", "100T"]).arg(&existing));
    assert_failure(&out, 1, &["tidefs: mkfs: "]);
    assert!(
        std::fs::read(&existing).expect("OK to unwrap: read") == bytes,
        "a failed mkfs changed an existing file"
    );
}

/// Goal: started as `mount.fuse.tidefs` (how mount(8) runs it), the binary takes mount(8)'s
/// helper arguments: `-f` (fake) checks the options and mounts nothing, a bad option is a usage
/// error, a stray flag or a missing mountpoint is named. Method: a symbolic link of that name
/// in a temporary directory; nothing is mounted, so no root is needed.
#[test]
fn the_mount_helper_takes_mount_8_arguments() {
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let helper = dir.path().join("mount.fuse.tidefs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tidefs"), &helper)
        .expect("OK to unwrap: symlink");
    let image = dir.path().join("x.img");
    let mnt = dir.path().join("mnt");
    let run = |args: &[&str]| {
        output(
            std::process::Command::new(&helper)
                .arg(&image)
                .arg(&mnt)
                .args(args),
        )
    };
    let out = run(&["-f", "-n", "-s", "-o", "rw,noatime,_netdev,nofail,commit=5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!mnt.exists());
    let out = run(&["-f", "-orw,defaults,nodev"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["-f", "-o", "rw,frobnicate"]);
    assert_failure(
        &out,
        2,
        &["tidefs: mount: ", "unknown mount option 'frobnicate'"],
    );
    let out = run(&["-Z"]);
    assert_failure(&out, 2, &["-Z"]);
    let out = output(std::process::Command::new(&helper).arg(&image));
    assert_failure(&out, 2, &["usage: mount.fuse.tidefs IMAGE MOUNTPOINT"]);
    // Not faked: the usual checks of `tidefs mount` apply.
    let out = run(&["-o", "rw"]);
    assert_failure(
        &out,
        1,
        &["tidefs: mount: ", "x.img", "no such file or directory"],
    );
}

/// Goal: `tidefs fsck IMAGE` on a machine without e2fsck still replays the journal but does
/// not call the image clean: the full check did not run, fsck(8)'s operational error (8),
/// saying so and naming the package. Method: as root, a private mount namespace
/// (`unshare -m`) with an empty directory mounted over every directory where e2fsck could
/// be found, and no PATH.
#[test]
fn fsck_without_e2fsck_is_not_clean() {
    let test = "fsck_without_e2fsck_is_not_clean";
    if !need_root(test, "hides e2fsck in a mount namespace") {
        return;
    }
    let Some(unshare) = tool("unshare") else {
        skip(test, "unshare (util-linux) is not installed");
        return;
    };
    if !std::process::Command::new(&unshare)
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        skip(test, "cannot make a mount namespace (no CAP_SYS_ADMIN?)");
        return;
    }
    if tool("mke2fs").is_none() {
        skip(test, "mke2fs is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("img");
    common::mkfs(&image, "64M", &[]);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("OK to unwrap: mkdir");
    let exe = env!("CARGO_BIN_EXE_tidefs");
    // Each directory find_e2fsprogs_tool looks in (on merged-/usr systems /sbin and /bin are
    // links to these).
    let script = format!(
        "for d in /usr/sbin /usr/bin /sbin /bin; do \
           [ -L $d ] || mount --bind '{empty}' $d || exit 90; \
         done; \
         PATH=/nonexistent exec '{exe}' fsck '{image}'",
        empty = empty.display(),
        image = image.display()
    );
    let out = output(
        std::process::Command::new(unshare)
            .args(["-m", "--propagation", "private", "/bin/sh", "-c"])
            .arg(script),
    );
    assert_eq!(
        out.status.code(),
        Some(8),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(
        text.contains("e2fsck: not installed") && text.contains("not fully checked"),
        "{text}"
    );
}
