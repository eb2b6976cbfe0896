//! Goal: every state promised by a returned fsync survives SIGKILL, and the journal tidefs
//! leaves behind is a real jbd2 journal: tidefs's own recovery, a plain remount and e2fsprogs'
//! replay (`e2fsck -fy`) give the same, consistent file system. And tidefs replays a journal the
//! kernel's ext4 left behind to the same result as `e2fsck`.
//!
//! Method (a): the test binary re-executes itself (env `TIDEFS_CRASH_CHILD=<image>`, ignored test
//! `crash_child_workload`); the child opens the image with the library and runs several
//! threads of appends, new files and atomic rename-replaces with many fsyncs, printing each
//! promised state (`PROMISE kind path length-or-version hash`) only after fsync returned. The
//! parent SIGKILLs it after reading some promises, then on three copies of the image runs
//! `recover_image`, a plain `Fs::open`, and `e2fsck -fy`; each must be clean by `e2fsck -fn`,
//! hold every promise, hold only well-formed content (ordered mode: no stale data), and the
//! three trees must be identical.
//! Method (b): the kernel's ext4 (loop mount) writes and fsyncs files; the backing file is copied
//! while still mounted (a crash image whose journal needs recovery); tidefs replays one copy and
//! `e2fsck -fy` another; both must equal what the kernel showed.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, ROOT_INO};

const CHILD_ENV: &str = "TIDEFS_CRASH_CHILD";
/// Set (to anything) for a child that mounts with `fenced_commits`.
const FENCED_ENV: &str = "TIDEFS_CRASH_FENCED";
const THREADS: u64 = 4;
const APPEND_FILES: u64 = 3;
const VERSION_LEN: usize = 3000;

/// Byte `off` of the deterministic content stream `seed` (splitmix64 of the 8-byte word).
fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut o = off;
    while out.len() < len {
        let mut z = seed ^ (o / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        let start = (o % 8) as usize;
        let take = (8 - start).min(len - out.len());
        out.extend_from_slice(&bytes[start..start + take]);
        o += take as u64;
    }
    out
}

fn seed_of(path: &str) -> u64 {
    common::hash_bytes(path.as_bytes())
}

/// Content of version `v` of a rename-replaced file.
fn version_content(path: &str, v: u64) -> Vec<u8> {
    let mut c = format!("version {v:08}\n").into_bytes();
    c.extend(pattern(seed_of(path) ^ v, 0, VERSION_LEN));
    c
}

/// The child's workload: never returns (the parent kills it).
fn child_main(image: &Path) {
    let opts = MountOptions {
        commit_interval: std::time::Duration::from_millis(200),
        fenced_commits: std::env::var_os(FENCED_ENV).is_some(),
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::open(image, &opts).expect("child: open"));
    let c = Creds::ROOT;
    let dirs: Vec<u64> = (0..THREADS)
        .map(|t| {
            fs.mkdir(ROOT_INO, format!("t{t}").as_bytes(), 0o755, c)
                .unwrap()
                .ino
        })
        .collect();
    fs.sync().unwrap();
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let fs = fs.clone();
        let dir = dirs[t as usize];
        handles.push(std::thread::spawn(move || {
            let mut rng = common::Rng(0xC0FF_EE00 + t);
            let mut appends: Vec<(u64, u64)> = Vec::new(); // (ino, len)
            for k in 0..APPEND_FILES {
                let a = fs
                    .create(dir, format!("a{k}").as_bytes(), 0o100644, 0, c)
                    .unwrap();
                appends.push((a.ino, 0));
            }
            let mut version = 0u64;
            for i in 0..1_000_000u64 {
                match rng.below(12) {
                    0..=5 => {
                        let k = rng.below(APPEND_FILES) as usize;
                        let path = format!("t{t}/a{k}");
                        let (ino, len) = appends[k];
                        let n = 1 + rng.below(20_000);
                        let data = pattern(seed_of(&path), len, n as usize);
                        assert_eq!(u64::from(fs.write(ino, len, &data).unwrap()), n);
                        appends[k].1 = len + n;
                        if rng.below(2) == 0 {
                            fs.fsync(ino, rng.below(2) == 0).unwrap();
                            let new_len = len + n;
                            let h =
                                common::hash_bytes(&pattern(seed_of(&path), 0, new_len as usize));
                            println!("PROMISE append {path} {new_len} {h:016x}");
                        }
                    }
                    6 | 7 => {
                        let path = format!("t{t}/n{i}");
                        let n = rng.below(50_000) as usize;
                        let a = fs
                            .create(dir, format!("n{i}").as_bytes(), 0o100644, 0, c)
                            .unwrap();
                        let data = pattern(seed_of(&path), 0, n);
                        fs.write(a.ino, 0, &data).unwrap();
                        fs.fsync(a.ino, false).unwrap();
                        fs.fsync(dir, false).unwrap();
                        println!("PROMISE new {path} {n} {:016x}", common::hash_bytes(&data));
                    }
                    8 | 9 => {
                        version += 1;
                        let path = format!("t{t}/r");
                        let tmp = format!("tmp{i}");
                        let a = fs.create(dir, tmp.as_bytes(), 0o100644, 0, c).unwrap();
                        let data = version_content(&path, version);
                        fs.write(a.ino, 0, &data).unwrap();
                        fs.fsync(a.ino, false).unwrap();
                        fs.rename(dir, tmp.as_bytes(), dir, b"r", RenameFlags::default())
                            .unwrap();
                        fs.fsync(dir, false).unwrap();
                        println!(
                            "PROMISE version {path} {version} {:016x}",
                            common::hash_bytes(&data)
                        );
                    }
                    _ => {
                        // A directory with files, made durable, then removed: its blocks (journaled
                        // metadata) are freed and may be reused for file data, which needs revoke
                        // records so that replay does not write the old directory block over it.
                        let name = format!("s{i}");
                        let sd = fs.mkdir(dir, name.as_bytes(), 0o755, c).unwrap().ino;
                        for j in 0..40 {
                            fs.create(
                                sd,
                                format!("entry-with-a-long-name-{j:04}").as_bytes(),
                                0o100644,
                                0,
                                c,
                            )
                            .unwrap();
                        }
                        fs.fsync(sd, false).unwrap();
                        for j in 0..40 {
                            fs.unlink(sd, format!("entry-with-a-long-name-{j:04}").as_bytes())
                                .unwrap();
                        }
                        fs.rmdir(dir, name.as_bytes()).unwrap();
                        fs.fsync(dir, false).unwrap();
                        println!("PROMISE gone t{t}/{name} 0 0");
                    }
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    // Not reached in practice; never unmount cleanly.
    loop {
        std::thread::park();
    }
}

/// Not a test of its own: the body of the child process of [`tidefs_sigkill_then_recover`],
/// which runs this binary with `--ignored --exact crash_child_workload` and `TIDEFS_CRASH_CHILD`
/// set to the image. Ignored, so the default test list never runs it; run any other way, it
/// fails instead of passing without doing anything.
#[test]
#[ignore = "the child process of tidefs_sigkill_then_recover, which runs it"]
fn crash_child_workload() {
    let img = std::env::var(CHILD_ENV).unwrap_or_else(|_| {
        panic!(
            "crash_child_workload is the child of tidefs_sigkill_then_recover and runs only \
             from it (with {CHILD_ENV}=<image>); run that test instead"
        )
    });
    child_main(Path::new(&img));
}

#[derive(Debug, Clone)]
struct Promise {
    kind: String,
    path: String,
    n: u64,
    hash: u64,
}

/// Runs the child on `image`, SIGKILLs it after `kill_after` promises; returns all promises it
/// printed.
fn run_child_and_kill(image: &Path, kill_after: usize, fenced: bool) -> Vec<Promise> {
    let exe = std::env::current_exe().unwrap();
    let mut command = Command::new(exe);
    if fenced {
        command.env(FENCED_ENV, "1");
    }
    let mut child = command
        .args([
            "--ignored",
            "--exact",
            "crash_child_workload",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, image)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let mut promises = Vec::new();
    let mut killed = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("PROMISE ") else {
            continue;
        };
        let f: Vec<&str> = rest.split(' ').collect();
        promises.push(Promise {
            kind: f[0].to_string(),
            path: f[1].to_string(),
            n: f[2].parse().unwrap(),
            hash: u64::from_str_radix(f[3], 16).unwrap(),
        });
        if promises.len() == kill_after && !killed {
            child.kill().unwrap(); // SIGKILL
            killed = true;
        }
    }
    let status = child.wait().unwrap();
    let err = err_thread.join().unwrap();
    assert!(
        killed,
        "the child ended by itself after {} promises ({status}):\n{err}",
        promises.len()
    );
    promises
}

fn lookup_path(fs: &Fs, path: &str) -> Option<u64> {
    let mut ino = ROOT_INO;
    for c in path.split('/') {
        ino = fs.lookup(ino, c.as_bytes()).ok()?.ino;
    }
    Some(ino)
}

fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let d = fs.read(ino, out.len() as u64, 1 << 20).unwrap();
        assert!(!d.is_empty(), "read stopped short of the size");
        out.extend(d);
    }
    out
}

/// Every promise holds and every file the workload wrote is well formed.
fn check_promises(what: &str, fs: &Fs, promises: &[Promise]) {
    let mut strongest: BTreeMap<(String, String), Promise> = BTreeMap::new();
    for p in promises {
        let e = strongest
            .entry((p.kind.clone(), p.path.clone()))
            .or_insert_with(|| p.clone());
        if p.n > e.n {
            *e = p.clone();
        }
    }
    for p in strongest.values() {
        if p.kind == "gone" {
            assert!(
                lookup_path(fs, &p.path).is_none(),
                "{what}: {} was removed and fsynced but is back",
                p.path
            );
            continue;
        }
        let ino = lookup_path(fs, &p.path)
            .unwrap_or_else(|| panic!("{what}: promised {} is missing ({p:?})", p.path));
        let data = read_all(fs, ino);
        match p.kind.as_str() {
            "append" => {
                assert!(
                    data.len() as u64 >= p.n,
                    "{what}: {} has {} bytes, fsync promised {}",
                    p.path,
                    data.len(),
                    p.n
                );
                assert_eq!(
                    common::hash_bytes(&data[..p.n as usize]),
                    p.hash,
                    "{what}: {} promised prefix differs",
                    p.path
                );
            }
            "new" => {
                assert_eq!(data.len() as u64, p.n, "{what}: {} size", p.path);
                assert_eq!(
                    common::hash_bytes(&data),
                    p.hash,
                    "{what}: {} content",
                    p.path
                );
            }
            "version" => {
                let v: u64 = std::str::from_utf8(&data[8..16])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| {
                        panic!(
                            "{what}: {} is not a version file: {:?}",
                            p.path,
                            String::from_utf8_lossy(&data[..data.len().min(20)])
                        )
                    });
                assert!(
                    v >= p.n,
                    "{what}: {} has version {v}, fsync promised {}",
                    p.path,
                    p.n
                );
                assert!(
                    data == version_content(&p.path, v),
                    "{what}: {} version {v} content torn",
                    p.path
                );
            }
            k => panic!("unknown promise kind {k}"),
        }
    }
    // Ordered mode: whatever survived (promised or not) holds only what was written, no stale
    // or zeroed blocks inside the size.
    for t in 0..THREADS {
        for k in 0..APPEND_FILES {
            let path = format!("t{t}/a{k}");
            if let Some(ino) = lookup_path(fs, &path) {
                let data = read_all(fs, ino);
                assert!(
                    data == pattern(seed_of(&path), 0, data.len()),
                    "{what}: {path} ({} bytes) holds data never written there",
                    data.len()
                );
            }
        }
    }
}

fn copy(src: &Path, dst: &Path) {
    std::fs::copy(src, dst).unwrap();
}

/// One SIGKILL round. `fenced`: the child mounts with `fenced_commits`, so its journal is the
/// kernel's format throughout and e2fsprogs must replay it; otherwise e2fsprogs may instead
/// refuse it (tidefs's incompat bit, while unfenced transactions are live), and only tidefs's
/// two recoveries are compared.
fn crash_round(dir: &Path, round: usize, kill_after: usize, extra: &[&str], fenced: bool) {
    let img = common::mkimage(dir, &format!("crash{round}.img"), 128, extra);
    let promises = run_child_and_kill(&img, kill_after, fenced);
    eprintln!(
        "round {round}: killed after {} promises (fenced commits: {fenced})",
        promises.len()
    );
    let d = common::dumpe2fs_h(&img);
    assert!(
        d["Filesystem features"].contains("needs_recovery"),
        "a killed mount leaves needs_recovery set"
    );
    // tidefs's incompat bits: unfenced commits (0x40000000, which dumpe2fs names
    // FEATURE_I30) and extension records (0x80000000, FEATURE_I31), which an ordered-mode
    // workload never writes.
    let features = &d["Journal features"];
    assert!(!features.contains("FEATURE_I31"), "{features}");
    let guarded = features.contains("FEATURE_I30");
    if fenced {
        assert!(!guarded, "fenced commits never set tidefs's journal bit");
    }
    // e2fsprogs parses tidefs's journal and finds the same last transaction tidefs replays.
    let logdump = if guarded {
        String::new()
    } else {
        common::run_ok("debugfs", &["-R", "logdump", img.to_str().unwrap()])
    };
    assert!(
        !logdump.to_lowercase().contains("bad "),
        "debugfs logdump complains:\n{logdump}"
    );
    let last_commit = logdump
        .lines()
        .filter(|l| l.contains("(commit block)"))
        .filter_map(|l| {
            l.strip_prefix("Found expected sequence ")?
                .split(',')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .next_back();

    let (a, b, c) = (
        dir.join(format!("a{round}.img")),
        dir.join(format!("b{round}.img")),
        dir.join(format!("c{round}.img")),
    );
    copy(&img, &a);
    copy(&img, &b);
    copy(&img, &c);

    // A: tidefs's own recovery (what `tidefs fsck` runs), then e2fsck -fn.
    let report = tidefs::fs::recover_image(&a, None).expect("recover_image");
    eprintln!("round {round}: recovery report {report:?}");
    if !guarded {
        assert_eq!(
            report.last_tid, last_commit,
            "tidefs and debugfs logdump disagree on the last committed transaction"
        );
    }
    common::assert_fsck_clean(&a);
    let fs = Fs::open(
        &a,
        &MountOptions {
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    check_promises("recover_image", &fs, &promises);
    let tree_a = common::walk_lib(&fs, false);
    drop(fs);

    // B: a plain read-write open replays the journal.
    let fs = Fs::open(&b, &MountOptions::default()).expect("remount after SIGKILL");
    assert!(
        fs.recovery_report().is_some(),
        "the remount did not replay the journal"
    );
    check_promises("remount", &fs, &promises);
    let tree_b = common::walk_lib(&fs, false);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&b);

    // C: e2fsprogs replays tidefs's journal.
    let out = Command::new("e2fsck").arg("-fy").arg(&c).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "round {round}: e2fsck -fy exit {:?}:\n{text}",
        out.status.code()
    );
    if guarded {
        // Unfenced transactions are live: e2fsprogs must refuse the journal, not replay it.
        assert_eq!(out.status.code(), Some(12), "{text}");
        assert!(
            text.contains("unknown incompatible feature flag"),
            "e2fsck did not refuse the guarded journal:\n{text}"
        );
        common::assert_trees_equal("recover_image vs remount", &tree_a, &tree_b);
        return;
    }
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "e2fsck -fy failed on tidefs's journal:\n{text}"
    );
    assert!(
        text.contains("recovering journal"),
        "e2fsck did not replay the journal:\n{text}"
    );
    common::assert_fsck_clean(&c);
    let fs = Fs::open(
        &c,
        &MountOptions {
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    check_promises("e2fsck -fy", &fs, &promises);
    let tree_c = common::walk_lib(&fs, false);
    drop(fs);

    common::assert_trees_equal("recover_image vs remount", &tree_a, &tree_b);
    common::assert_trees_equal("recover_image vs e2fsck -fy", &tree_a, &tree_c);
}

/// Goal and method: module doc (a); SIGKILLs at several points, and once on 1 KiB blocks.
#[test]
fn tidefs_sigkill_then_recover() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let points: &[usize] = if common::long_run() {
        &[1, 20, 75, 150, 300, 600, 1200, 2500]
    } else {
        &[30, 300, 1500]
    };
    // Odd rounds with the default unfenced commits, even ones fenced (e2fsprogs replays).
    for (round, &k) in points.iter().enumerate() {
        crash_round(dir.path(), round, k, &[], round % 2 == 0);
    }
    // 1 KiB blocks: more descriptor blocks per transaction, more groups.
    crash_round(dir.path(), points.len(), 400, &["-b", "1024"], true);
    crash_round(dir.path(), points.len() + 1, 400, &["-b", "1024"], false);
}

/// `debugfs -R "ls -l <dir>"` on an image without replaying its journal: the names it lists.
fn debugfs_names(img: &Path, dir: &str) -> Vec<String> {
    let out = Command::new("debugfs")
        .args(["-R", &format!("ls {dir}")])
        .arg(img)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Goal and method: module doc (b); the kernel's journal replayed by tidefs and by e2fsck.
#[test]
fn kernel_journal_replayed_by_tidefs() {
    if !common::have_e2fsprogs() || !common::can_loop_mount() {
        return;
    }
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "k.img", 128, &[]);
    let km = common::KernelMount::mount(&img, "rw").expect("mount rw");
    let root = km.path().to_path_buf();
    let mut rng = common::Rng(77);
    // A first batch, synced to its home locations.
    std::fs::create_dir(root.join("old")).unwrap();
    for i in 0..50 {
        std::fs::write(root.join(format!("old/f{i}")), rng.bytes(1000 + i * 100)).unwrap();
    }
    common::run_ok("sync", &["-f", root.to_str().unwrap()]);
    // A second batch, only fsynced: committed to the journal, home metadata still in the cache.
    let sync_file = |p: &Path| std::fs::File::open(p).unwrap().sync_all().unwrap();
    std::fs::create_dir(root.join("new")).unwrap();
    for i in 0..200 {
        let p = root.join(format!("new/g{i}"));
        std::fs::write(&p, rng.bytes((i * 37) % 20_000)).unwrap();
        sync_file(&p);
    }
    std::fs::rename(root.join("old/f0"), root.join("new/renamed")).unwrap();
    std::fs::remove_file(root.join("old/f1")).unwrap();
    std::fs::hard_link(root.join("old/f2"), root.join("new/hard")).unwrap();
    symlink("some/target", root.join("new/sym")).unwrap();
    std::fs::write(root.join("old/f3"), b"rewritten").unwrap();
    sync_file(&root.join("old/f3"));
    sync_file(&root.join("old"));
    sync_file(&root.join("new"));
    // The crash image: the backing file while still mounted.
    let crash = dir.path().join("crash.img");
    copy(&img, &crash);
    let (mut kernel_view, _) = common::walk_host(&root, false);
    km.umount();

    let d = common::dumpe2fs_h(&crash);
    assert!(
        d["Filesystem features"].contains("needs_recovery"),
        "the copy of a mounted image needs recovery"
    );
    eprintln!(
        "kernel journal: start {} sequence {}",
        d["Journal start"], d["Journal sequence"]
    );
    assert_ne!(
        d["Journal start"], "0",
        "the kernel's journal is empty in the copy; nothing to replay"
    );
    let unreplayed = debugfs_names(&crash, "/new");
    eprintln!(
        "without replay debugfs sees {} names in /new (after replay: 200+)",
        unreplayed.len()
    );

    // tidefs replays one copy.
    let (x, y) = (dir.path().join("x.img"), dir.path().join("y.img"));
    copy(&crash, &x);
    copy(&crash, &y);
    let fs = Fs::open(&x, &MountOptions::default()).expect("tidefs replays the kernel's journal");
    let report = fs.recovery_report();
    eprintln!("tidefs recovery of the kernel's journal: {report:?}");
    assert!(
        report.is_some(),
        "tidefs did not replay the kernel's journal"
    );
    let mut tidefs_view = common::walk_lib(&fs, false);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&x);

    // e2fsck replays the other.
    let out = Command::new("e2fsck").arg("-fy").arg(&y).output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "e2fsck -fy: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    common::assert_fsck_clean(&y);
    let fs = Fs::open(
        &y,
        &MountOptions {
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let mut e2fsck_view = common::walk_lib(&fs, false);
    drop(fs);

    common::assert_trees_equal(
        "tidefs's replay vs e2fsck's replay of the kernel's journal",
        &tidefs_view,
        &e2fsck_view,
    );
    // And both equal what the kernel showed before the crash (xattrs: none were set).
    common::strip_xattrs(&mut kernel_view);
    common::strip_xattrs(&mut tidefs_view);
    common::strip_xattrs(&mut e2fsck_view);
    common::assert_trees_equal(
        "kernel's view vs tidefs's replay",
        &kernel_view,
        &tidefs_view,
    );
}
