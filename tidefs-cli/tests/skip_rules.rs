//! Goal: the skip rule of the command's test suite holds. Outside CI a test without root, FUSE
//! or e2fsprogs says why it skips; in CI (`TIDEFS_CI=1`, set by `.ci/run`) the same missing
//! prerequisite fails the test instead of letting it return early and pass.
//! Method: call the helpers with the CI flag given explicitly (no process-wide environment
//! change, which would race with other tests).

mod common;

#[test]
fn a_missing_prerequisite_skips_outside_ci() {
    // Goal: outside CI the verdict is a printed skip naming the test and the reason.
    assert_eq!(
        common::skip_verdict("some_test", "e2fsprogs is not installed", false),
        Ok("skipped some_test: e2fsprogs is not installed".to_string())
    );
    // (skip_with itself is not called here: its line on stderr would look like a real skip in a
    // CI log.)
}

#[test]
fn a_missing_prerequisite_fails_in_ci() {
    // Goal: in CI the verdict is a failure naming the test and the reason.
    assert_eq!(
        common::skip_verdict("some_test", "not root", true),
        Err("some_test cannot run in CI: not root".to_string())
    );
    // Method: skip_with panics; catch it and check the message.
    let result = std::panic::catch_unwind(|| common::skip_with("some_test", "not root", true));
    let payload = result.expect_err("skip_with returned under CI");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert_eq!(message, "some_test cannot run in CI: not root");
}

#[test]
fn ci_is_recognised_from_the_variable() {
    // Goal: `TIDEFS_CI=1` (what `.ci/run` exports) means CI; unset, empty or 0 does not.
    assert!(common::ci_from(Some("1")));
    assert!(common::ci_from(Some("true")));
    assert!(!common::ci_from(None));
    assert!(!common::ci_from(Some("")));
    assert!(!common::ci_from(Some("0")));
    assert_eq!(common::CI_ENV, "TIDEFS_CI");
}
