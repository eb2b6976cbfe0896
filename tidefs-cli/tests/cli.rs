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
    let out = output(tidefs().arg("mkfs").arg(&image));
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
