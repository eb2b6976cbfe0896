//! `tidefs demo`: the README's main job. Creates an image if missing, mounts it in the
//! background, gives the log directory `wasteless` journaling (`tidefs journal set`), runs a
//! short workload through the mount (16 threads appending 125-byte records with `fdatasync`
//! after each in that directory, and a small tree of files in the default mode), prints
//! `tidefs stats`, unmounts, and checks the image with `tidefs fsck -n`.
//!
//! Each step runs the same `tidefs` executable as a user would, so the demo exercises the real
//! command-line paths.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::CliError;

const THREADS: usize = 16;
const RECORDS_PER_THREAD: usize = 200;
const RECORD_LEN: usize = 125;

/// Runs the demo on `image` (created with `size` bytes when missing).
pub fn run(image: &Path, size: u64) -> Result<(), CliError> {
    let what = "demo";
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(what, format!("cannot find my own executable: {e}")))?;
    if !image.exists() {
        step(&format!("mkfs --size {}M {}", size >> 20, image.display()));
        let opts = tidefs_mkfs::MkfsOptions {
            size: Some(size),
            ..Default::default()
        };
        tidefs_mkfs::mkfs(image, &opts)
            .map_err(|e| CliError::new("mkfs", format!("{}: {e}", image.display())))?;
    } else {
        step(&format!("using the existing image {}", image.display()));
    }
    let mountpoint = std::env::temp_dir().join(format!("tidefs-demo-{}", std::process::id()));
    std::fs::create_dir_all(&mountpoint)
        .map_err(|e| CliError::new(what, format!("{}: {e}", mountpoint.display())))?;
    step(&format!(
        "mount {} {}",
        image.display(),
        mountpoint.display()
    ));
    tidefs(
        &exe,
        &["mount".as_ref(), image.as_os_str(), mountpoint.as_os_str()],
    )?;
    let mounted = MountGuard {
        exe: exe.clone(),
        mountpoint: mountpoint.clone(),
        active: true,
    };

    // The log streams get wasteless journaling (byte ranges packed into shared journal
    // sectors), the rest of the tree the mount's default.
    let logs = mountpoint.join("logs");
    std::fs::create_dir_all(&logs)
        .map_err(|e| CliError::new(what, format!("{}: {e}", logs.display())))?;
    step(&format!("journal set {} wasteless", logs.display()));
    tidefs(
        &exe,
        &[
            "journal".as_ref(),
            "set".as_ref(),
            logs.as_os_str(),
            "wasteless".as_ref(),
        ],
    )?;
    let workload = workload(&mountpoint);
    if let Err(e) = &workload {
        eprintln!("tidefs: demo: workload failed: {e}");
    }
    step(&format!("stats {}", mountpoint.display()));
    let stats = tidefs(&exe, &["stats".as_ref(), mountpoint.as_os_str()]);
    step(&format!("umount {}", mountpoint.display()));
    mounted.unmount()?;
    let _ = std::fs::remove_dir(&mountpoint);
    step(&format!("fsck -n {}", image.display()));
    let fsck = Command::new(&exe)
        .arg("fsck")
        .arg("-n")
        .arg(image)
        .status()
        .map_err(|e| CliError::new(what, format!("cannot run fsck: {e}")))?;
    workload.map_err(|e| CliError::new(what, format!("workload failed: {e}")))?;
    stats?;
    match fsck.code() {
        Some(0) => {
            println!("\ndemo finished: the image is clean");
            Ok(())
        }
        other => Err(CliError::new(
            what,
            format!("fsck -n reported problems (exit {other:?})"),
        )),
    }
}

fn step(text: &str) {
    println!("\n== tidefs {text}");
}

/// Runs `tidefs ARGS` and fails if it fails (its own message is already on stderr).
fn tidefs(exe: &Path, args: &[&std::ffi::OsStr]) -> Result<(), CliError> {
    let status = Command::new(exe)
        .args(args)
        .status()
        .map_err(|e| CliError::new("demo", format!("cannot run tidefs: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(CliError::new(
            "demo",
            format!(
                "`tidefs {}` failed ({status})",
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ))
    }
}

/// Unmounts on drop unless [`MountGuard::unmount`] ran, so a failed demo leaves no mount behind.
struct MountGuard {
    exe: PathBuf,
    mountpoint: PathBuf,
    active: bool,
}

impl MountGuard {
    fn unmount(mut self) -> Result<(), CliError> {
        self.active = false;
        tidefs(&self.exe, &["umount".as_ref(), self.mountpoint.as_os_str()])
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.active {
            let _ = Command::new(&self.exe)
                .arg("umount")
                .arg(&self.mountpoint)
                .status();
        }
    }
}

fn workload(root: &Path) -> std::io::Result<()> {
    step(&format!(
        "workload: {THREADS} threads x {RECORDS_PER_THREAD} appends of {RECORD_LEN} bytes, \
         fdatasync after each"
    ));
    let dir = root.join("logs");
    std::fs::create_dir_all(&dir)?;
    let start = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = dir.join(format!("log-{t:02}"));
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o644)
                    .open(&path)?;
                for r in 0..RECORDS_PER_THREAD {
                    file.write_all(&record(t, r))?;
                    file.sync_data()?;
                }
                Ok(())
            })
        })
        .collect();
    for handle in handles {
        handle
            .join()
            .map_err(|_| std::io::Error::other("a workload thread panicked"))??;
    }
    let elapsed = start.elapsed();
    let total = THREADS * RECORDS_PER_THREAD;
    println!(
        "{total} appends + fdatasync in {:.2} s ({:.0} fsyncs/s)",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    for t in 0..THREADS {
        let data = std::fs::read(dir.join(format!("log-{t:02}")))?;
        let expected: Vec<u8> = (0..RECORDS_PER_THREAD).flat_map(|r| record(t, r)).collect();
        if data != expected {
            return Err(std::io::Error::other(format!(
                "log-{t:02} reads back wrong"
            )));
        }
    }
    println!("all {THREADS} logs read back intact");

    step("workload: a small tree (dirs, files, a symlink, a hard link, a rename)");
    let tree = root.join("tree");
    for a in 0..4 {
        for b in 0..4 {
            let d = tree.join(format!("d{a}")).join(format!("e{b}"));
            std::fs::create_dir_all(&d)?;
            for f in 0..4 {
                std::fs::write(
                    d.join(format!("f{f}.txt")),
                    format!("file {a}/{b}/{f}\n").repeat(f + 1),
                )?;
            }
        }
    }
    std::os::unix::fs::symlink("d0/e0/f0.txt", tree.join("link"))?;
    std::fs::hard_link(tree.join("d1/e1/f1.txt"), tree.join("hard"))?;
    std::fs::rename(tree.join("d3"), tree.join("renamed"))?;
    let via_link = std::fs::read_to_string(tree.join("link"))?;
    if via_link != "file 0/0/0\n" {
        return Err(std::io::Error::other("symlink reads back wrong"));
    }
    let count = count_files(&tree)?;
    println!("tree: {count} entries");
    Ok(())
}

/// Record `r` of thread `t`: exactly RECORD_LEN bytes, ending in a newline.
fn record(t: usize, r: usize) -> Vec<u8> {
    let mut line = format!("thread {t:02} record {r:04} ").into_bytes();
    line.resize(RECORD_LEN - 1, b'.');
    line.push(b'\n');
    line
}

fn count_files(dir: &Path) -> std::io::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        count += 1;
        if entry.file_type()?.is_dir() {
            count += count_files(&entry.path())?;
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_the_right_length() {
        for (t, r) in [(0, 0), (15, 199)] {
            let rec = record(t, r);
            assert_eq!(rec.len(), RECORD_LEN);
            assert_eq!(rec.last(), Some(&b'\n'));
        }
    }
}
