//! `tidefs-split`: a SQLite VFS that keeps each database's rollback journal in a directory of
//! its own, for the split configuration of `tidefs bench sqlite` (the database in a `journal`
//! mode directory, its rollback journal in a `lightweight` one). SQLite always names the
//! rollback journal `<database>-journal` beside the database; this VFS is SQLite's default
//! (unix) VFS with three methods wrapped, which move that name into the journal directory that
//! [`split_journals`] set for the database's directory:
//!
//! - `xOpen` of a main journal (`SQLITE_OPEN_MAIN_JOURNAL`): opened under the mapped name, built
//!   with `sqlite3_create_filename` as SQLite's own file names are, and kept for the rest of the
//!   process, since the unix VFS keeps the name's pointer as long as the file is open (it
//!   opens the directory by that name to fsync it after creating the journal). There is one
//!   per distinct mapped path. The unix VFS gives a new main journal the permissions and owner
//!   of its database, which it finds by cutting `-journal` off the journal's path; in the
//!   journal directory there is no such file and the open would fail (`SQLITE_IOERR_FSTAT`).
//!   So the mapped journal is opened as a super-journal (`SQLITE_OPEN_SUPER_JOURNAL`), which the
//!   unix VFS opens exactly as a main journal — created if missing, not locked, its directory
//!   fsynced at its first sync — except that it takes the default permissions.
//! - `xDelete` and `xAccess` of any name ending in `-journal`: the mapped name (so the journal
//!   is deleted where it is, with the fsync of that directory SQLite asks for, and a hot
//!   journal left by a crash is found there and rolled back).
//! - Everything else (the database, the WAL, temporary files, `xFullPathname` and the rest) is
//!   the unix VFS's, called unchanged. Its other methods ignore the VFS object they are called
//!   with (checked against SQLite's `os_unix.c`), so our copy of it carries its pointers as
//!   they are; the wrapped methods call the unix VFS with its own object.
//!
//! This module is the benchmarks' only FFI boundary with SQLite's C API and holds all of their
//! `unsafe` code; the rest of the crate denies it.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr, CString, OsStr};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use rusqlite::ffi;

/// The VFS's name, for `Connection::open_with_flags_and_vfs`.
pub const NAME: &str = "tidefs-split";

/// [`NAME`] as SQLite keeps it: a registered VFS's name must outlive the registration.
const NAME_C: &CStr = c"tidefs-split";

/// What SQLite appends to a database's path to name its rollback journal.
const JOURNAL_SUFFIX: &[u8] = b"-journal";

/// The journal directory of each database directory: (database directory, journal
/// directory), both canonical, as SQLite's full path names are.
static SPLITS: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

/// The names made for `xOpen` of mapped journals, by mapped path: the address of the journal
/// part of a `sqlite3_create_filename` result, never freed (the unix VFS may hold it as long as
/// the file is open). Addresses, since raw pointers may not cross threads.
static OPEN_NAMES: Mutex<BTreeMap<PathBuf, usize>> = Mutex::new(BTreeMap::new());

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// From now on, the rollback journals of the databases in `db_dir` that connections open with
/// the VFS [`NAME`] go to `journal_dir` (both must exist; the same directory undoes it). The
/// VFS is registered on first use.
pub fn split_journals(db_dir: &Path, journal_dir: &Path) -> Result<(), String> {
    register()?;
    let canonical = |p: &Path| {
        p.canonicalize()
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let (db_dir, journal_dir) = (canonical(db_dir)?, canonical(journal_dir)?);
    let mut splits = lock(&SPLITS);
    splits.retain(|(dir, _)| *dir != db_dir);
    splits.push((db_dir, journal_dir));
    Ok(())
}

/// Where the rollback journal `path` goes: `Some` path in the journal directory of its
/// database's directory when `splits` moves it, `None` when it stays where SQLite put it (not
/// a journal's name, or a directory without a split).
fn journal_path(path: &Path, splits: &[(PathBuf, PathBuf)]) -> Option<PathBuf> {
    let name = path.file_name()?;
    if !name.as_bytes().ends_with(JOURNAL_SUFFIX) {
        return None;
    }
    let dir = path.parent()?;
    splits
        .iter()
        .find(|(db_dir, _)| db_dir == dir)
        .filter(|(db_dir, journal_dir)| db_dir != journal_dir)
        .map(|(_, journal_dir)| journal_dir.join(name))
}

/// Registers the VFS once per process (not as the default); the error says why SQLite
/// refused.
fn register() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            // SAFETY: sqlite3_vfs_find only reads SQLite's list of VFSes (initialising SQLite
            // first if needed); a null name asks for the default VFS.
            let base = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
            if base.is_null() {
                return Err("SQLite has no default VFS".to_string());
            }
            // SAFETY: `base` points at a registered VFS object, which SQLite never frees and
            // nothing here unregisters; this copies it.
            let mut vfs = unsafe { *base };
            vfs.pNext = std::ptr::null_mut();
            vfs.zName = NAME_C.as_ptr();
            vfs.pAppData = base.cast();
            vfs.xOpen = Some(split_open);
            vfs.xDelete = Some(split_delete);
            vfs.xAccess = Some(split_access);
            let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
            // SAFETY: the VFS object and its name live for the rest of the process (leaked,
            // static), as SQLite requires of a registered VFS; makeDflt 0 keeps the default.
            let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
            if rc == ffi::SQLITE_OK {
                Ok(())
            } else {
                Err(format!("sqlite3_vfs_register: {}", ffi::code_to_str(rc)))
            }
        })
        .clone()
}

/// The unix VFS under ours, and its `method` if it has that method.
///
/// # Safety
/// `vfs` is the object [`register`] gave SQLite, as SQLite passes it to every method.
unsafe fn base_method<M>(
    vfs: *mut ffi::sqlite3_vfs,
    method: impl FnOnce(&ffi::sqlite3_vfs) -> Option<M>,
) -> Option<(*mut ffi::sqlite3_vfs, M)> {
    // SAFETY: the caller passes our registered object, which lives forever; its pAppData is
    // the unix VFS object (register).
    let base: *mut ffi::sqlite3_vfs = unsafe { (*vfs).pAppData.cast() };
    // SAFETY: the unix VFS object is registered and never freed.
    method(unsafe { &*base }).map(|m| (base, m))
}

/// The mapped path of the journal named `name`, per the splits set so far.
///
/// # Safety
/// `name` is null or a NUL-terminated string that lives through the call, as SQLite passes
/// file names to the VFS.
unsafe fn mapped(name: *const c_char) -> Option<PathBuf> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null, and NUL-terminated and alive per the caller's promise.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    journal_path(Path::new(OsStr::from_bytes(bytes)), &lock(&SPLITS))
}

/// A name for the unix VFS's `xOpen` of the mapped journal `path` of the database `db`: made
/// once per path with `sqlite3_create_filename` (so that SQLite's URI functions work on it as
/// on its own names) and kept for the rest of the process; `None` when SQLite has no memory.
fn open_name(path: &Path, db: &Path) -> Option<*const c_char> {
    let mut names = lock(&OPEN_NAMES);
    if let Some(&address) = names.get(path) {
        return Some(address as *const c_char);
    }
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).ok();
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let (db, journal, wal) = (c(db)?, c(path)?, c(Path::new(&wal))?);
    // SAFETY: the three strings are NUL-terminated and live through the call, which copies
    // them; no parameters (0, null).
    let filename = unsafe {
        ffi::sqlite3_create_filename(
            db.as_ptr(),
            journal.as_ptr(),
            wal.as_ptr(),
            0,
            std::ptr::null_mut(),
        )
    };
    if filename.is_null() {
        return None;
    }
    // SAFETY: `filename` is a live result of sqlite3_create_filename (never freed), which is
    // what sqlite3_filename_journal takes; the journal name lies inside it.
    let journal = unsafe { ffi::sqlite3_filename_journal(filename) };
    names.insert(path.to_path_buf(), journal as usize);
    Some(journal)
}

/// `xOpen`: a main journal of a split directory is opened in its journal directory, as a
/// super-journal (module comment); everything else as the unix VFS does.
///
/// # Safety
/// Called by SQLite as a VFS's `xOpen`, with our VFS object.
unsafe extern "C" fn split_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite calls us with our VFS object.
    let Some((base, open)) = (unsafe { base_method(vfs, |base| base.xOpen) }) else {
        return ffi::SQLITE_CANTOPEN;
    };
    let main_journal = flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0;
    // SAFETY: SQLite passes a null name or a NUL-terminated one that outlives the call.
    let Some(path) = main_journal.then(|| unsafe { mapped(name) }).flatten() else {
        // SAFETY: the unix VFS's xOpen with its own object and SQLite's arguments unchanged.
        return unsafe { open(base, name, file, flags, out_flags) };
    };
    // SAFETY: `name` is non-null here (mapped), NUL-terminated and alive for the call.
    let journal = Path::new(OsStr::from_bytes(
        unsafe { CStr::from_ptr(name) }.to_bytes(),
    ));
    let db = journal.with_file_name(OsStr::from_bytes(
        journal
            .file_name()
            .map(OsStr::as_bytes)
            .and_then(|n| n.strip_suffix(JOURNAL_SUFFIX))
            .unwrap_or_default(),
    ));
    // SAFETY: `base` is the unix VFS object, alive for the process.
    let too_long =
        path.as_os_str().len() >= usize::try_from(unsafe { (*base).mxPathname }).unwrap_or(0);
    let Some(mapped_name) = open_name(&path, &db).filter(|_| !too_long) else {
        return ffi::SQLITE_CANTOPEN;
    };
    let as_super = (flags & !ffi::SQLITE_OPEN_MAIN_JOURNAL) | ffi::SQLITE_OPEN_SUPER_JOURNAL;
    // SAFETY: the unix VFS's xOpen with its own object, SQLite's file and out-flags, and a
    // name that lives for the rest of the process (open_name).
    let rc = unsafe { open(base, mapped_name, file, as_super, out_flags) };
    if rc == ffi::SQLITE_OK && !out_flags.is_null() {
        // SAFETY: SQLite's non-null out-flags pointer, valid for the call.
        unsafe {
            *out_flags =
                (*out_flags & !ffi::SQLITE_OPEN_SUPER_JOURNAL) | ffi::SQLITE_OPEN_MAIN_JOURNAL;
        }
    }
    rc
}

/// `xDelete`: a journal of a split directory is deleted in its journal directory (with the
/// fsync of that directory when SQLite asks for one).
///
/// # Safety
/// Called by SQLite as a VFS's `xDelete`, with our VFS object.
unsafe extern "C" fn split_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: SQLite calls us with our VFS object.
    let Some((base, delete)) = (unsafe { base_method(vfs, |base| base.xDelete) }) else {
        return ffi::SQLITE_IOERR_DELETE;
    };
    // SAFETY: SQLite passes a NUL-terminated name that outlives the call; the unix VFS's
    // xDelete is called with its own object, a name alive for the call and SQLite's flag.
    unsafe {
        with_name(name, ffi::SQLITE_IOERR_DELETE, |name| {
            delete(base, name, sync_dir)
        })
    }
}

/// `xAccess`: a journal of a split directory is looked for in its journal directory.
///
/// # Safety
/// Called by SQLite as a VFS's `xAccess`, with our VFS object.
unsafe extern "C" fn split_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    // SAFETY: SQLite calls us with our VFS object.
    let Some((base, access)) = (unsafe { base_method(vfs, |base| base.xAccess) }) else {
        return ffi::SQLITE_IOERR_ACCESS;
    };
    // SAFETY: SQLite passes a NUL-terminated name that outlives the call; the unix VFS's
    // xAccess is called with its own object, a name alive for the call and SQLite's flags and
    // out pointer.
    unsafe {
        with_name(name, ffi::SQLITE_IOERR_ACCESS, |name| {
            access(base, name, flags, out)
        })
    }
}

/// Calls `call` with the name the unix VFS gets for SQLite's `name`: its mapped path when it
/// is a journal of a split directory, else `name` itself; `error` when the mapped path cannot
/// be a C string.
///
/// # Safety
/// `name` is null or a NUL-terminated string that lives through the call.
unsafe fn with_name(
    name: *const c_char,
    error: c_int,
    call: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: per the caller's promise on `name`.
    match unsafe { mapped(name) }.map(|p| CString::new(p.into_os_string().into_vec())) {
        Some(Ok(path)) => call(path.as_ptr()),
        Some(Err(_)) => error,
        None => call(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    /// Goal: only names ending in `-journal` in a directory with a split move, into that
    /// split's journal directory under the same name.
    #[test]
    fn journal_names_are_mapped() {
        let splits = vec![
            (PathBuf::from("/m/db"), PathBuf::from("/m/journal")),
            (PathBuf::from("/same"), PathBuf::from("/same")),
        ];
        let map = |p: &str| journal_path(Path::new(p), &splits);
        assert_eq!(
            map("/m/db/x.db-journal"),
            Some(PathBuf::from("/m/journal/x.db-journal"))
        );
        for unmoved in [
            "/m/db/x.db",
            "/m/db/x.db-wal",
            "/m/db/x.db-journal.bak",
            "/m/db/sub/x.db-journal",
            "/m/other/x.db-journal",
            "/same/x.db-journal",
            "/",
        ] {
            assert_eq!(map(unmoved), None, "{unmoved}");
        }
    }

    /// A database and journal directory under a temporary directory, split.
    fn split_dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().expect("OK to unwrap: temp dir");
        let (db, journal) = (tmp.path().join("db"), tmp.path().join("journal"));
        for dir in [&db, &journal] {
            std::fs::create_dir(dir).expect("OK to unwrap: mkdir");
        }
        split_journals(&db, &journal).expect("OK to unwrap: the VFS registers");
        (tmp, db, journal)
    }

    fn open(path: &Path) -> Connection {
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), NAME)
            .expect("OK to unwrap: open with the VFS");
        conn.execute_batch("PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;")
            .expect("OK to unwrap: pragmas");
        conn
    }

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("OK to unwrap: count")
    }

    /// Goal: through the VFS, the rollback journal lives in the journal directory during a
    /// transaction, never beside the database, and commits and rollbacks leave the database
    /// right. Method: a plain temporary directory; the journal is looked for while a
    /// transaction is open.
    #[test]
    fn journal_lives_in_its_directory() {
        let (_tmp, db_dir, journal_dir) = split_dirs();
        let db = db_dir.join("t.db");
        let conn = open(&db);
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
            .expect("OK to unwrap: create");
        for i in 0..10 {
            conn.execute("INSERT INTO t VALUES (?1, 'x')", [i])
                .expect("OK to unwrap: insert");
        }
        let moved = journal_dir.join("t.db-journal");
        let beside = db_dir.join("t.db-journal");
        conn.execute_batch("BEGIN; UPDATE t SET v = 'y' WHERE id < 5;")
            .expect("OK to unwrap: update");
        assert!(moved.exists(), "the journal is in the journal directory");
        assert!(!beside.exists(), "no journal beside the database");
        conn.execute_batch("COMMIT").expect("OK to unwrap: commit");
        assert!(!moved.exists() && !beside.exists(), "deleted at commit");

        conn.execute_batch("BEGIN; DELETE FROM t WHERE id >= 5;")
            .expect("OK to unwrap: delete");
        assert!(moved.exists() && !beside.exists());
        conn.execute_batch("ROLLBACK")
            .expect("OK to unwrap: rollback");
        assert!(!moved.exists());
        drop(conn);
        let conn = open(&db);
        assert_eq!(count(&conn), 10);
        let changed: i64 = conn
            .query_row("SELECT count(*) FROM t WHERE v = 'y'", [], |r| r.get(0))
            .expect("OK to unwrap: query");
        assert_eq!(changed, 5);
    }

    /// Goal: a hot journal left in the journal directory by a crash is found there and rolled
    /// back when the database is next opened. Method: a transaction that spills pages into the
    /// database file before committing (a one-page cache); a copy of the database and of the
    /// journal taken then, into another split pair, is what a crash at that instant leaves.
    #[test]
    fn hot_journal_is_rolled_back() {
        let (_tmp, db_dir, journal_dir) = split_dirs();
        let db = db_dir.join("t.db");
        let conn = open(&db);
        conn.execute_batch(
            "PRAGMA cache_size=1; CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
             INSERT INTO t SELECT i, 'a' || hex(zeroblob(250)) FROM n;",
        )
        .expect("OK to unwrap: fill");
        conn.execute_batch("BEGIN; UPDATE t SET v = 'b' || hex(zeroblob(250));")
            .expect("OK to unwrap: update");
        let (_crash, crash_db, crash_journal) = split_dirs();
        std::fs::copy(&db, crash_db.join("t.db")).expect("OK to unwrap: copy");
        let image = std::fs::read(crash_db.join("t.db")).expect("OK to unwrap: read");
        assert!(
            image.windows(9).any(|w| w == b"b00000000"),
            "the copy holds pages of the uncommitted update"
        );
        std::fs::copy(
            journal_dir.join("t.db-journal"),
            crash_journal.join("t.db-journal"),
        )
        .expect("OK to unwrap: the journal is in the journal directory");
        conn.execute_batch("ROLLBACK")
            .expect("OK to unwrap: rollback");

        let crashed = open(&crash_db.join("t.db"));
        let b: i64 = crashed
            .query_row("SELECT count(*) FROM t WHERE v LIKE 'b%'", [], |r| r.get(0))
            .expect("OK to unwrap: query");
        assert_eq!((count(&crashed), b), (100, 0));
        assert!(!crash_journal.join("t.db-journal").exists(), "rolled back");
    }
}
