//! Goal: `tidefs dump-journal` lists the transactions of a crashed image's journal, with
//! their layout (compact commit or block layout), records (full blocks, byte ranges, revokes),
//! as text and as JSON; and fails clearly, with its documented exit codes, on a missing file,
//! a file system without a journal, a corrupt journal superblock and bad usage.
//!
//! Method: an image made by `tidefs mkfs`; its journal is written through the library alone
//! (two compact commits of byte ranges sharing a block, then a block-layout transaction with
//! a full block and a revoke), then dropped as at a power cut; the binary is run on it.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{output, skip, stderr, stdout, tidefs, tool};
use tidefs::dev::{BlockDevice, FileDev};
use tidefs::journal::{
    image_journal, open_image, CommitRequest, Journal, JournalOptions, RangeUpdate,
};

const BS: usize = 4096;

/// The journal of `image` opened through the library alone (checksum v3, 64-bit tags, the
/// default unfenced commits), checkpoints held so what is committed stays in the log.
fn open_journal(image: &Path) -> Journal {
    let opts = JournalOptions {
        csum_v3: true,
        tags_64bit: true,
        ..JournalOptions::default()
    };
    let j = open_image(image, None, opts).unwrap();
    j.hold_checkpoints(true);
    j
}

/// Writes three transactions into the journal of `image` and crashes; returns their tids.
fn crash_with_extension_records(image: &Path) -> Vec<u32> {
    let j = open_journal(image);
    let mut data = vec![0u8; BS];
    data[100..109].copy_from_slice(b"RANGE-ONE");
    let first = j
        .commit(CommitRequest {
            ranges: vec![RangeUpdate {
                home: 9000,
                data: data.clone().into(),
                ranges: vec![(100, 9)],
            }],
            ..CommitRequest::default()
        })
        .unwrap();
    data[2000..2003].copy_from_slice(b"two");
    let second = j
        .commit(CommitRequest {
            ranges: vec![RangeUpdate {
                home: 9000,
                data: data.into(),
                ranges: vec![(2000, 3)],
            }],
            ..CommitRequest::default()
        })
        .unwrap();
    let third = j
        .commit(CommitRequest {
            blocks: vec![(9001, vec![0x3C; BS].into())],
            revoked: vec![9002],
            ..CommitRequest::default()
        })
        .unwrap();
    j.stop_background();
    vec![first, second, third]
}

#[test]
fn dump_journal_lists_transactions_and_ranges() {
    if tool("mke2fs").is_none() {
        skip(
            "dump_journal_lists_transactions_and_ranges",
            "mke2fs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    common::mkfs(&image, "64M", &[]);

    // A clean image: an empty log.
    let out = output(tidefs().arg("dump-journal").arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("The log is empty"),
        "{}",
        stdout(&out)
    );

    let tids = crash_with_extension_records(&image);
    let out = output(tidefs().arg("dump-journal").arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for (tid, layout) in tids
        .iter()
        .zip(["compact commit", "compact commit", "block layout"])
    {
        assert!(
            text.contains(&format!("Transaction {tid}: {layout}")),
            "transaction {tid} ({layout}) missing:\n{text}"
        );
    }
    assert!(text.contains("tidefs_extension_records"), "{text}");
    // The third, with no file data to order before it, was written with one flush.
    assert!(
        text.contains(&format!("Transaction {}: block layout (unfenced)", tids[2])),
        "{text}"
    );
    assert!(
        text.contains("range  home block       9000  1 range(s), 9 bytes: 100+9"),
        "{text}"
    );
    assert!(text.contains("2000+3"), "{text}");
    assert!(text.contains("full   home block       9001"), "{text}");
    assert!(text.contains("revoke home block       9002"), "{text}");
    assert!(text.contains("end of the log. 3 transaction(s)"), "{text}");

    let out = output(tidefs().arg("dump-journal").arg("--json").arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["extension_bit"], true);
    let txns = v["transactions"].as_array().unwrap();
    assert_eq!(txns.len(), 3);
    assert_eq!(txns[0]["tid"], tids[0]);
    assert_eq!(txns[0]["layout"], "compact");
    assert_eq!(txns[1]["layout"], "compact");
    assert_eq!(
        txns[1]["offset"], 512,
        "the second compact commit shares a block"
    );
    assert_eq!(txns[2]["layout"], "block");
    assert_eq!(txns[2]["unfenced"], true);
    assert_eq!(txns[0]["unfenced"], false);
    assert_eq!(txns[0]["tags"][0]["kind"], "range");
    assert_eq!(txns[0]["tags"][0]["ranges"][0][0], 100);
    assert_eq!(txns[0]["tags"][0]["ranges"][0][1], 9);
    assert_eq!(txns[2]["revokes"][0], 9002);

    // A corrupt journal superblock: exit 4, saying so.
    let geom = {
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDev::open(&image, true).unwrap());
        image_journal(dev, None).unwrap()
    };
    let sb_at = geom
        .extents
        .iter()
        .find(|e| e.logical_start == 0)
        .unwrap()
        .device_block
        * BS as u64;
    let mut bytes = std::fs::read(&image).unwrap();
    bytes[sb_at as usize] ^= 0xFF;
    let broken = dir.path().join("broken");
    std::fs::write(&broken, &bytes).unwrap();
    let out = output(tidefs().arg("dump-journal").arg(&broken));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("journal superblock"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn dump_journal_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let out = output(tidefs().arg("dump-journal").arg(&missing));
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));

    let out = output(tidefs().arg("dump-journal"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let out = output(tidefs().arg("dump-journal").arg(&zeros));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    let Some(mke2fs) = tool("mke2fs") else {
        skip("dump_journal_errors_are_clear", "mke2fs is not installed");
        return;
    };
    let nojournal = dir.path().join("nojournal");
    std::fs::write(&nojournal, vec![0u8; 16 << 20]).unwrap();
    let made = output(
        std::process::Command::new(mke2fs)
            .args(["-q", "-F", "-t", "ext4", "-O", "^has_journal"])
            .arg(&nojournal),
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let out = output(tidefs().arg("dump-journal").arg(&nojournal));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no journal"), "{}", stderr(&out));
}

/// Goal: a crash that tears the last, unfenced transaction is a normal end of the log, not
/// damage: `dump-journal` says the transaction was torn, `tidefs fsck` says so too and does not
/// report errors left uncorrected (exit code without bit 4), and the transaction before it is
/// replayed. Method: two block-layout transactions written unfenced through the library, one
/// byte of the second's copy damaged in the log (what a crash before the flush leaves).
#[test]
fn a_torn_last_transaction_is_reported_as_torn_not_as_damage() {
    if tool("mke2fs").is_none() || tool("e2fsck").is_none() {
        skip(
            "a_torn_last_transaction_is_reported_as_torn_not_as_damage",
            "e2fsprogs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    common::mkfs(&image, "64M", &[]);
    let j = open_journal(&image);
    let first = j
        .commit(CommitRequest {
            blocks: vec![(9001, vec![0x11; BS].into())],
            ..CommitRequest::default()
        })
        .unwrap();
    let second = j
        .commit(CommitRequest {
            blocks: vec![(9002, vec![0x22; BS].into())],
            ..CommitRequest::default()
        })
        .unwrap();
    j.stop_background();
    drop(j);

    let out = output(tidefs().arg("dump-journal").arg("--json").arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let txns = v["transactions"].as_array().unwrap();
    assert_eq!(txns.len(), 2);
    assert_eq!(txns[1]["unfenced"], true);
    // Unfenced transactions have their own incompat bit, apart from extension records, so a
    // tidefs build that predates them refuses the log instead of replaying a torn one.
    assert_eq!(v["unfenced_bit"], true);
    assert_eq!(v["extension_bit"], false);
    assert!(v["incompat"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("tidefs_unfenced_commits")));
    let logical = u32::try_from(txns[1]["tags"][0]["position"].as_u64().unwrap()).unwrap();
    let geom = {
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDev::open(&image, true).unwrap());
        image_journal(dev, None).unwrap()
    };
    let extent = geom
        .extents
        .iter()
        .find(|e| (e.logical_start..e.logical_start + e.len).contains(&logical))
        .unwrap();
    let at = (extent.device_block + u64::from(logical - extent.logical_start)) * BS as u64;
    drop(geom); // its device holds the image's claim
    let mut bytes = std::fs::read(&image).unwrap();
    bytes[at as usize + 700] ^= 0xFF;
    std::fs::write(&image, &bytes).unwrap();

    let out = output(tidefs().arg("dump-journal").arg(&image));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("Transaction {second} was torn by a crash")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Transaction {first}: block layout")),
        "{text}"
    );

    let out = output(tidefs().arg("fsck").arg("-y").arg(&image));
    let code = out.status.code().unwrap_or(-1);
    assert!(
        matches!(code, 0 | 1),
        "fsck exit {code}:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains(&format!("transaction {second} was torn by the crash")),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let bytes = std::fs::read(&image).unwrap();
    let block = |n: usize| &bytes[n * BS..(n + 1) * BS];
    assert!(
        block(9001).iter().all(|&b| b == 0x11),
        "the first transaction is replayed"
    );
    assert!(
        block(9002).iter().all(|&b| b == 0),
        "nothing of the torn one is"
    );
}

/// Goal: `tidefs dump-journal IMAGE | head -1` ends quietly when the reader goes away, as
/// `cat` does (SIGPIPE), instead of a panic in the printing code (exit 101 and a backtrace).
/// Method: the command's standard output is a pipe whose reading end is closed before it
/// starts; it must die of SIGPIPE with nothing on standard error.
#[test]
fn a_closed_output_pipe_ends_dump_journal_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    if tool("mke2fs").is_none() {
        skip(
            "a_closed_output_pipe_ends_dump_journal_quietly",
            "mke2fs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    common::mkfs(&image, "64M", &[]);
    // The writing end of a pipe whose reader has exited: the standard input of `true`.
    let mut reader = std::process::Command::new("true")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let writer = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    let out = tidefs()
        .arg("dump-journal")
        .arg(&image)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
