//! The skip rule of the test suite, in one place for the crate's unit tests and the integration
//! tests of both crates.
//!
//! A test that lacks a prerequisite (e2fsprogs, root) goes through [`skip`]: outside CI it
//! prints `skipped <test>: <why>` and the test returns; in CI (`TIDEFS_CI=1`, set by `.ci/run`,
//! where every prerequisite is present) the test fails instead of passing without testing.

/// The environment variable that marks a CI run.
pub const CI_ENV: &str = "TIDEFS_CI";

/// Whether a value of [`CI_ENV`] marks a CI run: set, and neither empty nor `0`.
pub fn ci_from(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// What a test lacking a prerequisite does: `Ok(line)` to print before returning (outside CI),
/// `Err(message)` to panic with (in CI).
pub fn skip_verdict(test: &str, why: &str, ci: bool) -> Result<String, String> {
    if ci {
        Err(format!("{test} cannot run in CI: {why}"))
    } else {
        Ok(format!("skipped {test}: {why}"))
    }
}

/// [`skip`] with the CI flag given explicitly.
pub fn skip_with(test: &str, why: &str, ci: bool) {
    match skip_verdict(test, why, ci) {
        // Straight to stderr, not eprintln!: libtest captures that for passing tests, and a
        // skip must be seen.
        Ok(line) => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "{line}");
        }
        Err(message) => panic!("{message}"),
    }
}

/// Whether this run is CI (see [`CI_ENV`]).
pub fn in_ci() -> bool {
    ci_from(std::env::var(CI_ENV).ok().as_deref())
}

/// Prints why `test` skips and returns, or fails it under `TIDEFS_CI=1`.
pub fn skip(test: &str, why: &str) {
    skip_with(test, why, in_ci());
}

/// The name of the running test: libtest names each test's thread after it.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_prerequisite_fails_in_ci_and_skips_outside() {
        // Goal: under CI a missing prerequisite is a failure; outside it is a printed skip.
        // Method: the decision with the flag given, and skip_with caught while it panics.
        assert_eq!(
            skip_verdict("t", "no e2fsprogs", false),
            Ok("skipped t: no e2fsprogs".to_string())
        );
        assert_eq!(
            skip_verdict("t", "no e2fsprogs", true),
            Err("t cannot run in CI: no e2fsprogs".to_string())
        );
        let caught = std::panic::catch_unwind(|| skip_with("t", "no e2fsprogs", true));
        let payload = caught.expect_err("skip_with returned under CI");
        assert_eq!(
            payload.downcast_ref::<String>().map(String::as_str),
            Some("t cannot run in CI: no e2fsprogs")
        );
        assert!(ci_from(Some("1")));
        assert!(!ci_from(None) && !ci_from(Some("")) && !ci_from(Some("0")));
        assert_eq!(CI_ENV, "TIDEFS_CI");
    }

    #[test]
    fn the_current_test_is_named_after_its_thread() {
        // Goal: skips from shared helpers (have_e2fsprogs, can_loop_mount) name the right test.
        assert!(
            current_test().ends_with("the_current_test_is_named_after_its_thread"),
            "{}",
            current_test()
        );
    }
}
