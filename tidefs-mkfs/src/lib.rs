//! `tidefs mkfs`: formats an image with the supported ext4 feature set by running e2fsprogs'
//! `mke2fs`.
//!
//! A crate of its own beside the library: the file system never formats anything and does not
//! depend on it; the `tidefs` command, the crash harness and the tests do.
//!
//! We do not write our own formatter: `mke2fs` is the reference for the ext4 layout, and images it
//! makes are exactly what the kernel and `e2fsck` expect. This module only decides the arguments,
//! creates (sparse) image and external journal files, and turns failures into clear errors.
//!
//! Invariants:
//! - The feature set is fixed here ([`FEATURES`]) and does not depend on the machine's
//!   `/etc/mke2fs.conf`: `mke2fs` runs with `MKE2FS_CONFIG` pointing at a private config whose
//!   base features are empty, so only the features we name end up on disk.
//! - An existing image is only resized when the caller gave `--size`; a missing one is created
//!   sparse, so a 1 GiB image costs a few MiB of real disk.
//! - Nothing is written before every check passed; an image or journal that already holds an
//!   ext2/3/4 file system is overwritten only with `force`; a failed format leaves no file it
//!   created behind.
//! - The targets are claimed ([`tidefs::dev::lock`]) for the whole format, so mkfs never
//!   formats an image that a tidefs mount or fsck holds or that the kernel has mounted.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use tidefs::{FsError, Result};

/// Block size of every tidefs image.
pub const BLOCK_SIZE: u64 = 4096;

/// Size of a new image when the caller gives none.
pub const DEFAULT_IMAGE_SIZE: u64 = 1 << 30;

/// Size of a new external journal device file when the caller gives none.
pub const DEFAULT_JOURNAL_DEVICE_SIZE: u64 = 64 << 20;

/// The smallest image we format: below this, `mke2fs` leaves too little room beside the journal.
pub const MIN_IMAGE_SIZE: u64 = 8 << 20;

/// The ext4 features of a tidefs image (docs/FORMAT.md §2).
pub const FEATURES: &str = "has_journal,ext_attr,dir_index,filetype,extent,64bit,flex_bg,\
sparse_super,large_file,huge_file,dir_nlink,extra_isize,metadata_csum";

/// A private `mke2fs.conf`: no base features, so the machine's defaults (`resize_inode`,
/// `orphan_file` on newer e2fsprogs, ...) do not leak into our images.
const MKE2FS_CONF: &str = "[defaults]
\tbase_features = sparse_super,filetype
\tblocksize = 4096
\tinode_size = 256
\tinode_ratio = 16384
\tenable_periodic_fsck = 0

[fs_types]
\text4 = {
\t\tfeatures = has_journal
\t}
\tfloppy = {
\t\tinode_ratio = 16384
\t}
\tsmall = {
\t\tinode_ratio = 16384
\t}
\tdefault = {
\t\tinode_ratio = 16384
\t}
\tbig = {
\t\tinode_ratio = 32768
\t}
\thuge = {
\t\tinode_ratio = 65536
\t}
";

/// Options of [`mkfs`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MkfsOptions {
    /// Size of the image in bytes. Required when the image does not exist and must hold a
    /// file-system; an existing regular file is resized to it.
    pub size: Option<u64>,
    /// Size of the internal journal (whole MiB), or of a new external journal device file.
    pub journal_size: Option<u64>,
    /// External journal device (`mke2fs -O journal_dev`); created as a sparse file if missing.
    pub journal_device: Option<PathBuf>,
    /// Number of inodes (`mke2fs -N`); `None` lets `mke2fs` choose from the size.
    pub inode_count: Option<u64>,
    /// Volume label (`mke2fs -L`).
    pub label: Option<String>,
    /// Blocks per block group (`mke2fs -g`, a multiple of 8 up to 32768); `None` lets `mke2fs`
    /// choose (32768). Small groups give small images several groups, for tests.
    pub blocks_per_group: Option<u32>,
    /// Overwrite an image or journal device that already holds an ext2/3/4 file system or an
    /// external journal. Without it such a target is refused ([`existing_format`]).
    pub force: bool,
}

/// Formats `image` as a tidefs (ext4) file system. Creates the image file when it is missing.
///
/// Nothing is touched until every check passed: sizes, an existing file system (unless
/// `force`), and the claim on each target ([`tidefs::dev::lock`]), which refuses an image that
/// a tidefs mount, mkfs or fsck holds or the kernel has mounted, and is held until the format
/// ends. A failed format removes the files it created and gives a grown file its old length.
pub fn mkfs(image: &Path, opts: &MkfsOptions) -> Result<()> {
    let mke2fs = find_e2fsprogs_tool("mke2fs").ok_or_else(|| {
        FsError::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "mke2fs not found (install e2fsprogs: apt-get install e2fsprogs)",
        ))
    })?;
    if let Some(journal_size) = opts.journal_size {
        if journal_size == 0 || journal_size % (1 << 20) != 0 {
            return Err(FsError::Invalid(
                "journal size must be a positive whole number of MiB",
            ));
        }
    }
    let image_plan = Target::plan(image, opts.size, DEFAULT_IMAGE_SIZE, "image")?;
    let journal_plan = match &opts.journal_device {
        Some(journal_device) => Some(Target::plan(
            journal_device,
            opts.journal_size,
            DEFAULT_JOURNAL_DEVICE_SIZE,
            "journal device",
        )?),
        None => None,
    };
    if !opts.force {
        for target in std::iter::once(&image_plan).chain(&journal_plan) {
            if !target.exists {
                continue;
            }
            if let Some(found) = existing_format(&target.path)? {
                return Err(FsError::Io(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!(
                        "{} contains {found}; set force to overwrite it",
                        target.path.display()
                    ),
                )));
            }
        }
    }

    let config = PrivateConfig::write()?;
    let mut rollback = Rollback::default();
    let _image_claim = image_plan.prepare(&mut rollback)?;
    let _journal_claim = match &journal_plan {
        Some(plan) => Some(plan.prepare(&mut rollback)?),
        None => None,
    };

    let mut journal_arg = match &opts.journal_size {
        Some(journal_size) if opts.journal_device.is_none() => {
            Some(format!("size={}", journal_size >> 20))
        }
        _ => None,
    };
    let mut _loop_device = None;
    if let Some(journal_plan) = &journal_plan {
        let journal_device = &journal_plan.path;
        let mut command = Command::new(&mke2fs);
        command
            .env("MKE2FS_CONFIG", &config.path)
            .args(["-F", "-q", "-O", "journal_dev", "-b", "4096"])
            .arg(journal_device);
        if let Some(blocks) = journal_plan.shrink_to_kib() {
            command.arg(format!("{blocks}k"));
        }
        run(command, "mke2fs -O journal_dev")?;
        // mke2fs attaches only block devices as external journals; a journal kept in a regular
        // file is attached through a loop device for the time of the format.
        if journal_plan.is_file {
            let loop_device = LoopDevice::attach(journal_device)?;
            journal_arg = Some(format!("device={}", loop_device.path.display()));
            _loop_device = Some(loop_device);
        } else {
            journal_arg = Some(format!("device={}", journal_device.display()));
        }
    }
    format_image(&mke2fs, &config, &image_plan, opts, journal_arg)?;
    for target in std::iter::once(&image_plan).chain(&journal_plan) {
        target.finish_shrink()?;
    }
    rollback.disarm();
    Ok(())
}

/// What an existing file or device holds, judged by the ext2/3/4 superblock at byte 1024:
/// `Some("an ext4 file system")` (or ext3, ext2, or "an ext4 external journal") when the magic
/// 0xEF53 is at byte 1080, `None` otherwise (including a file too short to hold one).
pub fn existing_format(path: &Path) -> Result<Option<&'static str>> {
    use std::io::Read as _;
    const SUPERBLOCK_OFFSET: u64 = 1024;
    const S_MAGIC: usize = 0x38;
    const S_FEATURE_COMPAT: usize = 0x5c;
    const S_FEATURE_INCOMPAT: usize = 0x60;
    const EXT2_MAGIC: u16 = 0xef53;
    const COMPAT_HAS_JOURNAL: u32 = 0x4;
    const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
    // extents, 64bit, flex_bg: what makes an ext3 an ext4.
    const INCOMPAT_EXT4: u32 = 0x40 | 0x80 | 0x200;
    let mut file = std::fs::File::open(path)?;
    let mut superblock = Vec::with_capacity(1024);
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(SUPERBLOCK_OFFSET))?;
    file.take(1024).read_to_end(&mut superblock)?;
    if superblock.len() < 1024 {
        return Ok(None);
    }
    let u16_at = |at: usize| u16::from_le_bytes([superblock[at], superblock[at + 1]]);
    let u32_at = |at: usize| {
        u32::from_le_bytes([
            superblock[at],
            superblock[at + 1],
            superblock[at + 2],
            superblock[at + 3],
        ])
    };
    if u16_at(S_MAGIC) != EXT2_MAGIC {
        return Ok(None);
    }
    let incompat = u32_at(S_FEATURE_INCOMPAT);
    Ok(Some(if incompat & INCOMPAT_JOURNAL_DEV != 0 {
        "an ext4 external journal"
    } else if incompat & INCOMPAT_EXT4 != 0 {
        "an ext4 file system"
    } else if u32_at(S_FEATURE_COMPAT) & COMPAT_HAS_JOURNAL != 0 {
        "an ext3 file system"
    } else {
        "an ext2 file system"
    }))
}

/// Runs the main `mke2fs` that formats `image`.
fn format_image(
    mke2fs: &Path,
    config: &PrivateConfig,
    image: &Target,
    opts: &MkfsOptions,
    journal_arg: Option<String>,
) -> Result<()> {
    let mut command = Command::new(mke2fs);
    command
        .env("MKE2FS_CONFIG", &config.path)
        .args(["-t", "ext4", "-F", "-q", "-b", "4096", "-O", FEATURES])
        .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"]);
    if let Some(journal_arg) = journal_arg {
        command.arg("-J").arg(journal_arg);
    }
    if let Some(inode_count) = opts.inode_count {
        command.arg("-N").arg(inode_count.to_string());
    }
    if let Some(label) = &opts.label {
        command.arg("-L").arg(label);
    }
    if let Some(blocks) = opts.blocks_per_group {
        command.arg("-g").arg(blocks.to_string());
    }
    command.arg(&image.path);
    if let Some(kib) = image.shrink_to_kib() {
        command.arg(format!("{kib}k"));
    }
    run(command, "mke2fs")
}

/// An image or journal device file as planned before anything is touched.
struct Target {
    path: PathBuf,
    /// The file or device exists now.
    exists: bool,
    /// A regular file (or one to be created), not a device.
    is_file: bool,
    /// The length of an existing regular file.
    current_len: u64,
    /// The length the file must have after the format.
    target_len: u64,
}

impl Target {
    /// Checks `path` and the requested size; touches nothing. A missing file is to be created
    /// with `size` (or `default_size`) bytes; an existing regular file is resized only when
    /// `size` is given; block devices are used as they are.
    fn plan(path: &Path, size: Option<u64>, default_size: u64, what: &str) -> Result<Target> {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => {
                let target_len = size.unwrap_or(meta.len());
                check_size(target_len, what)?;
                Ok(Target {
                    path: path.to_path_buf(),
                    exists: true,
                    is_file: true,
                    current_len: meta.len(),
                    target_len,
                })
            }
            Ok(meta) if meta.is_dir() => Err(FsError::IsDir),
            Ok(_) => {
                if size.is_some() {
                    return Err(FsError::Invalid(
                        "--size applies to image files, not to devices",
                    ));
                }
                Ok(Target {
                    path: path.to_path_buf(),
                    exists: true,
                    is_file: false,
                    current_len: 0,
                    target_len: 0,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let target_len = size.unwrap_or(default_size);
                check_size(target_len, what)?;
                Ok(Target {
                    path: path.to_path_buf(),
                    exists: false,
                    is_file: true,
                    current_len: 0,
                    target_len,
                })
            }
            Err(e) => Err(FsError::Io(e)),
        }
    }

    /// Creates a missing file (sparse, at its length) or grows an existing one, and claims the
    /// target; each change is recorded in `rollback`. A file that must shrink keeps its length
    /// until the format succeeded ([`Target::finish_shrink`]): `mke2fs` is told the smaller
    /// size instead. Returns the claim, held until dropped.
    fn prepare(&self, rollback: &mut Rollback) -> Result<std::fs::File> {
        if !self.exists {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&self.path)?;
            rollback.created.push(self.path.clone());
        }
        let claim = tidefs::dev::lock::claim_path(&self.path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::ResourceBusy {
                FsError::Busy(e.to_string())
            } else {
                FsError::Io(e)
            }
        })?;
        if self.is_file && self.target_len > self.current_len {
            let file = std::fs::OpenOptions::new().write(true).open(&self.path)?;
            if self.exists {
                rollback.grown.push((self.path.clone(), self.current_len));
            }
            file.set_len(self.target_len).map_err(|e| {
                FsError::Io(std::io::Error::new(
                    e.kind(),
                    format!("cannot make it {} bytes long: {e}", self.target_len),
                ))
            })?;
        }
        Ok(claim)
    }

    /// The size in KiB to give `mke2fs` when the file is to shrink, else `None`.
    fn shrink_to_kib(&self) -> Option<u64> {
        (self.is_file && self.exists && self.target_len < self.current_len)
            .then_some(self.target_len / 1024)
    }

    /// Truncates a file that was to shrink, now that the format succeeded.
    fn finish_shrink(&self) -> Result<()> {
        if self.shrink_to_kib().is_some() {
            let file = std::fs::OpenOptions::new().write(true).open(&self.path)?;
            file.set_len(self.target_len)?;
        }
        Ok(())
    }
}

/// What a failed format must undo: files it created are removed, files it grew get their old
/// length back.
#[derive(Default)]
struct Rollback {
    created: Vec<PathBuf>,
    grown: Vec<(PathBuf, u64)>,
    disarmed: bool,
}

impl Rollback {
    /// The format succeeded: keep everything.
    fn disarm(&mut self) {
        self.disarmed = true;
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if self.disarmed {
            return;
        }
        for path in &self.created {
            let _ = std::fs::remove_file(path);
        }
        for (path, len) in &self.grown {
            if let Ok(file) = std::fs::OpenOptions::new().write(true).open(path) {
                let _ = file.set_len(*len);
            }
        }
    }
}

fn check_size(size: u64, what: &str) -> Result<()> {
    let minimum = if what == "image" {
        MIN_IMAGE_SIZE
    } else {
        1024 * BLOCK_SIZE
    };
    if size < minimum {
        return Err(FsError::Invalid(if what == "image" {
            "image size is below the minimum of 8 MiB"
        } else {
            "journal device size is below the minimum of 4 MiB (1024 blocks)"
        }));
    }
    Ok(())
}

/// Runs a command, turning a failure into an error that carries its stderr.
fn run(mut command: Command, what: &str) -> Result<()> {
    let output = command.output().map_err(|e| {
        FsError::Io(std::io::Error::new(
            e.kind(),
            format!("cannot run {what}: {e}"),
        ))
    })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let detail = format!("{}{}", stderr.trim(), stdout.trim());
    Err(FsError::Io(std::io::Error::other(format!(
        "{what} failed ({}): {}",
        output.status,
        detail.trim()
    ))))
}

/// A loop device attached to a file, detached on drop.
struct LoopDevice {
    path: PathBuf,
}

impl LoopDevice {
    fn attach(file: &Path) -> Result<LoopDevice> {
        let losetup = find_e2fsprogs_tool("losetup").ok_or_else(|| {
            FsError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "an external journal in a regular file needs losetup (apt-get install mount)",
            ))
        })?;
        let output = Command::new(&losetup)
            .args(["--find", "--show"])
            .arg(file)
            .output()?;
        if !output.status.success() {
            return Err(FsError::Io(std::io::Error::other(format!(
                "losetup {} failed (an external journal in a regular file needs root and loop \
                 devices): {}",
                file.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ))));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        Ok(LoopDevice { path })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(losetup) = find_e2fsprogs_tool("losetup") {
            let _ = Command::new(losetup).arg("-d").arg(&self.path).output();
        }
    }
}

/// A temporary `mke2fs.conf`, removed on drop.
struct PrivateConfig {
    path: PathBuf,
}

impl PrivateConfig {
    fn write() -> Result<PrivateConfig> {
        let mut path = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        path.push(format!("tidefs-mke2fs-{}-{nanos}.conf", std::process::id()));
        let mut file = std::fs::File::create(&path)?;
        file.write_all(MKE2FS_CONF.as_bytes())?;
        Ok(PrivateConfig { path })
    }
}

impl Drop for PrivateConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Finds an e2fsprogs tool (`mke2fs`, `e2fsck`, `debugfs`) in `PATH` or in the `sbin`
/// directories, which an unprivileged user's `PATH` often lacks.
pub fn find_e2fsprogs_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Parses a size such as `4096`, `64K`, `64M`, `1G`, `2T`, `512MiB` or `1GB` (binary units:
/// K = 1024). Returns `None` for anything else, including overflow.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_len = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_len);
    if digits.is_empty() {
        return None;
    }
    let number: u64 = digits.parse().ok()?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_size_accepts_plain_numbers_and_binary_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("1GB"), Some(1 << 30));
        assert_eq!(parse_size("2T"), Some(2 << 40));
        assert_eq!(parse_size(" 8M "), Some(8 << 20));
        assert_eq!(parse_size("100b"), Some(100));
    }

    #[test]
    fn parse_size_rejects_garbage_and_overflow() {
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("M"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size("1 G"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(parse_size("16777216T"), None);
    }

    /// `fs.img` in `dir`: a fresh 32 MiB image with the default options.
    fn fresh_32m(dir: &Path) -> PathBuf {
        let image = dir.join("fs.img");
        let opts = MkfsOptions {
            size: Some(32 << 20),
            ..MkfsOptions::default()
        };
        mkfs(&image, &opts).expect("OK to unwrap: mkfs of a fresh 32 MiB image");
        image
    }

    /// Goal: `blocks_per_group` gives a small image several block groups (the crash harness's
    /// multi-group image). Method: 16 MiB with 1024 blocks per group; dumpe2fs counts 4 groups.
    #[test]
    fn blocks_per_group_makes_several_groups() {
        let (Some(_), Some(dumpe2fs)) = (
            find_e2fsprogs_tool("mke2fs"),
            find_e2fsprogs_tool("dumpe2fs"),
        ) else {
            tidefs::test_support::skip(
                "blocks_per_group_makes_several_groups",
                "e2fsprogs is not installed",
            );
            return;
        };
        let dir = tempfile::tempdir().expect("OK to unwrap: test setup");
        let image = dir.path().join("groups.img");
        let opts = MkfsOptions {
            size: Some(16 << 20),
            journal_size: Some(4 << 20),
            blocks_per_group: Some(1024),
            ..MkfsOptions::default()
        };
        mkfs(&image, &opts).expect("OK to unwrap: mkfs with small groups");
        let dump = Command::new(&dumpe2fs)
            .arg(&image)
            .output()
            .expect("OK to unwrap: dumpe2fs runs");
        let text = String::from_utf8_lossy(&dump.stdout);
        let groups = text
            .lines()
            .filter(|l| l.starts_with("Group ") && l.contains("(Blocks "))
            .count();
        assert_eq!(groups, 4, "{text}");
        assert!(text.contains("Blocks per group:         1024"), "{text}");
    }

    /// Goal: an image made by `mkfs` is clean by `e2fsck -fn` and has exactly our feature set.
    /// Method: format a sparse 32 MiB file, then ask `e2fsck` and `dumpe2fs`.
    #[test]
    fn mkfs_makes_a_clean_image_with_our_features() {
        let (Some(_), Some(e2fsck), Some(dumpe2fs)) = (
            find_e2fsprogs_tool("mke2fs"),
            find_e2fsprogs_tool("e2fsck"),
            find_e2fsprogs_tool("dumpe2fs"),
        ) else {
            tidefs::test_support::skip(
                "mkfs_makes_a_clean_image_with_our_features",
                "e2fsprogs is not installed",
            );
            return;
        };
        let dir = tempfile::tempdir().expect("OK to unwrap: test setup");
        let image = fresh_32m(dir.path());
        assert_eq!(
            std::fs::metadata(&image)
                .expect("OK to unwrap: image exists")
                .len(),
            32 << 20
        );
        let status = Command::new(&e2fsck)
            .arg("-fn")
            .arg(&image)
            .output()
            .expect("OK to unwrap: e2fsck runs");
        assert!(status.status.success(), "e2fsck: {status:?}");
        let dump = Command::new(&dumpe2fs)
            .arg("-h")
            .arg(&image)
            .output()
            .expect("OK to unwrap: dumpe2fs runs");
        let text = String::from_utf8_lossy(&dump.stdout);
        let features = text
            .lines()
            .find(|l| l.starts_with("Filesystem features:"))
            .expect("OK to unwrap: dumpe2fs prints the features");
        for feature in FEATURES.split(',') {
            assert!(features.contains(feature), "{feature} missing: {features}");
        }
        assert!(!features.contains("resize_inode"), "{features}");
        assert!(!features.contains("orphan_file"), "{features}");
        assert!(text.contains("Block size:               4096"), "{text}");
    }

    #[test]
    fn mkfs_rejects_tiny_images_and_odd_journal_sizes() {
        if find_e2fsprogs_tool("mke2fs").is_none() {
            tidefs::test_support::skip(
                "mkfs_rejects_tiny_images_and_odd_journal_sizes",
                "e2fsprogs is not installed",
            );
            return;
        }
        let dir = tempfile::tempdir().expect("OK to unwrap: test setup");
        let image = dir.path().join("tiny.img");
        let opts = MkfsOptions {
            size: Some(1 << 20),
            ..MkfsOptions::default()
        };
        let err = mkfs(&image, &opts).expect_err("a 1 MiB image is too small");
        assert!(err.to_string().contains("minimum"), "{err}");
        let opts = MkfsOptions {
            size: Some(32 << 20),
            journal_size: Some(3 << 19),
            ..MkfsOptions::default()
        };
        let err = mkfs(&image, &opts).expect_err("1.5 MiB is not a whole number of MiB");
        assert!(err.to_string().contains("MiB"), "{err}");
    }

    /// Goal: the library refuses to format over a file system unless `force`, and a format
    /// that mke2fs itself fails removes the file mkfs created and gives a grown file back its
    /// length and bytes. Method: a journal larger than the image makes mke2fs fail.
    #[test]
    fn mkfs_needs_force_over_a_file_system_and_leaves_nothing_on_failure() {
        if find_e2fsprogs_tool("mke2fs").is_none() {
            tidefs::test_support::skip(
                "mkfs_needs_force_over_a_file_system_and_leaves_nothing_on_failure",
                "e2fsprogs is not installed",
            );
            return;
        }
        let dir = tempfile::tempdir().expect("OK to unwrap: test setup");
        let image = fresh_32m(dir.path());
        let opts = MkfsOptions {
            size: Some(32 << 20),
            ..MkfsOptions::default()
        };
        assert_eq!(
            existing_format(&image).expect("OK to unwrap: readable"),
            Some("an ext4 file system")
        );
        let before = std::fs::read(&image).expect("OK to unwrap: read");
        let err = mkfs(&image, &opts).expect_err("no force: refused");
        assert!(
            err.to_string().contains("contains an ext4 file system"),
            "{err}"
        );
        assert!(std::fs::read(&image).expect("OK to unwrap: read") == before);
        let forced = MkfsOptions {
            force: true,
            ..opts.clone()
        };
        mkfs(&image, &forced).expect("OK to unwrap: forced");

        let impossible = MkfsOptions {
            size: Some(16 << 20),
            journal_size: Some(64 << 20),
            force: true,
            ..MkfsOptions::default()
        };
        let fresh = dir.path().join("fresh.img");
        mkfs(&fresh, &impossible).expect_err("a 64 MiB journal cannot fit in 16 MiB");
        assert!(!fresh.exists(), "a failed mkfs left the file it created");

        let small = dir.path().join("small.img");
        let bytes = vec![0x5au8; 12 << 20];
        std::fs::write(&small, &bytes).expect("OK to unwrap: test setup");
        mkfs(&small, &impossible).expect_err("a 64 MiB journal cannot fit in 16 MiB");
        assert!(
            std::fs::read(&small).expect("OK to unwrap: read") == bytes,
            "a failed mkfs changed the length or bytes of an existing file"
        );
    }

    #[test]
    fn mkfs_with_external_journal_device() {
        let (Some(_), Some(dumpe2fs)) = (
            find_e2fsprogs_tool("mke2fs"),
            find_e2fsprogs_tool("dumpe2fs"),
        ) else {
            tidefs::test_support::skip(
                "mkfs_with_external_journal_device",
                "e2fsprogs is not installed",
            );
            return;
        };
        use std::os::unix::fs::MetadataExt as _;
        if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
            tidefs::test_support::skip(
                "mkfs_with_external_journal_device",
                "an external journal in a file needs root (losetup)",
            );
            return;
        }
        let dir = tempfile::tempdir().expect("OK to unwrap: test setup");
        let image = dir.path().join("fs.img");
        let journal = dir.path().join("journal.img");
        let opts = MkfsOptions {
            size: Some(64 << 20),
            journal_size: Some(8 << 20),
            journal_device: Some(journal.clone()),
            ..MkfsOptions::default()
        };
        mkfs(&image, &opts).expect("OK to unwrap: mkfs with an external journal");
        let dump = Command::new(&dumpe2fs)
            .arg("-h")
            .arg(&image)
            .output()
            .expect("OK to unwrap: dumpe2fs runs");
        let text = String::from_utf8_lossy(&dump.stdout);
        assert!(text.contains("Journal UUID:"), "{text}");
        let dump = Command::new(&dumpe2fs)
            .arg("-h")
            .arg(&journal)
            .output()
            .expect("OK to unwrap: dumpe2fs runs");
        let text = String::from_utf8_lossy(&dump.stdout);
        assert!(text.contains("journal_dev"), "{text}");
    }
}
