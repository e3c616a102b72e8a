//! The Python SDK's own suite (`sdk-python/tests`, pytest): its barrier on PostgreSQL and SQLite,
//! the races over real gRPC, and end to end against this build's coordinator binary.

use std::process::Command;

use dtx_tests::db::postgres_url;
use dtx_tests::python::{python, repo};

#[test]
fn the_python_sdk_suite_passes() {
    let Some(python) = python() else { return };
    let output = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(repo().join("sdk-python"))
        .env(
            "DTX_COORDINATOR_BIN",
            env!("CARGO_BIN_EXE_test-coordinator"),
        )
        .env("DTX_TEST_POSTGRES_URL", postgres_url())
        .output()
        .expect("run pytest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout.lines().last().unwrap_or_default();
    // The count, for the CI log: .ci/run prints this file after the test run.
    println!("python sdk: {summary}");
    let _ = std::fs::write(
        repo().join("target/pytest-summary.txt"),
        format!("{summary}\n"),
    );
    assert!(
        output.status.success(),
        "pytest failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(summary.contains(" passed"), "pytest ran nothing: {summary}");
}
