//! Helpers shared by the library's integration tests: images made by the real `mkfs.ext4`,
//! and the real `e2fsck -fn` as the consistency oracle.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether e2fsprogs is installed; tests that need it print why they skip otherwise.
pub fn have_e2fsprogs() -> bool {
    let ok = Command::new("mkfs.ext4").arg("-V").output().is_ok()
        && Command::new("e2fsck").arg("-V").output().is_ok();
    if !ok {
        eprintln!("SKIP: mkfs.ext4/e2fsck not installed");
    }
    ok
}

/// Makes an ext4 image of `size_mb` MiB with the feature set tidefs supports.
pub fn mkimage(dir: &Path, name: &str, size_mb: u64, extra: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size_mb << 20).unwrap();
    let out = Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-b",
            "4096",
            "-O",
            "metadata_csum,64bit",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
        ])
        .args(extra)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs.ext4 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Runs `e2fsck -fn` and panics with its output unless the image is clean.
pub fn assert_fsck_clean(image: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn found problems (exit {:?}):\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
