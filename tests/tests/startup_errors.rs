//! The coordinator binary's start-up failures, as an operator meets them: a sentence naming
//! what failed, the value and what to do (never Rust's Debug output), and the exit code the
//! README documents for that failure.

use std::process::Stdio;
use std::time::Duration;

use dtx_tests::coordinator::Process;
use dtx_tests::net::free_addr;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

/// Runs the coordinator with `args` until it exits (it must, within 60 s); its exit code and
/// standard error.
async fn run_failing(args: &[&str]) -> (i32, String) {
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn coordinator");
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the coordinator exits instead of serving")
        .expect("wait for coordinator");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let code = output.status.code().expect("exited, not signalled");
    (code, stderr)
}

/// A sentence, not `Error: Io(Os { code: 98, .. })`.
fn assert_sentence(stderr: &str, expected: &[&str]) {
    for part in expected {
        assert!(stderr.contains(part), "stderr lacks {part:?}:\n{stderr}");
    }
    for debug in ["Os {", "Io(", "Invalid(", "LimitError", "Error: "] {
        assert!(
            !stderr.contains(debug),
            "Debug output {debug:?} in:\n{stderr}"
        );
    }
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("dtx.db").display())
}

#[tokio::test]
async fn a_busy_port_says_which_address_and_flag_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let store = sqlite_url(&dir);
    let (code, stderr) = run_failing(&["--listen", &addr, "--store", &store]).await;
    assert_eq!(code, 3, "{stderr}");
    assert_sentence(
        &stderr,
        &[
            &format!("cannot listen on {addr} (--listen)"),
            "another process is listening there",
        ],
    );

    let free = free_addr().await.to_string();
    let (code, stderr) = run_failing(&[
        "--listen",
        &free,
        "--store",
        &store,
        "--metrics-listen",
        &addr,
    ])
    .await;
    assert_eq!(code, 3, "{stderr}");
    assert_sentence(
        &stderr,
        &[&format!("cannot listen on {addr} (--metrics-listen)")],
    );
}

#[tokio::test]
async fn a_bad_store_url_names_the_schemes_and_exits_4() {
    let free = free_addr().await.to_string();
    let (code, stderr) = run_failing(&["--listen", &free, "--store", "sqlite3:/tmp/x.db"]).await;
    assert_eq!(code, 4, "{stderr}");
    assert_sentence(
        &stderr,
        &[
            "cannot open the store \"sqlite3:/tmp/x.db\" (--store)",
            "must start with sqlite://, postgres:// or mysql://",
        ],
    );
}

#[tokio::test]
async fn an_unreachable_database_is_named_without_its_password_and_exits_4() {
    let free = free_addr().await.to_string();
    // Nothing listens on port 1.
    let url = "postgres://dtx:hunter2@127.0.0.1:1/dtx";
    let (code, stderr) = run_failing(&["--listen", &free, "--store", url]).await;
    assert_eq!(code, 4, "{stderr}");
    assert_sentence(
        &stderr,
        &[
            "cannot connect to the store postgres://dtx:***@127.0.0.1:1/dtx (--store)",
            "Check that the database server runs",
            "Connection refused",
        ],
    );
    assert!(!stderr.contains("hunter2"), "password shown:\n{stderr}");
}

#[tokio::test]
async fn a_bad_flag_value_is_a_usage_error_with_exit_2() {
    let (code, stderr) = run_failing(&["--listen", "localhost-50070"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--listen"), "{stderr}");
}

/// SQLite serves one instance: a second coordinator on the same file refuses to start and
/// says who holds it; once the first is SIGKILLed (no clean-up code runs) the file is free.
#[tokio::test]
async fn a_second_coordinator_on_one_sqlite_file_is_refused_until_the_first_dies() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_url(&dir);
    let first = Process::start(BIN, &store, &[]).await;
    let free = free_addr().await.to_string();
    let (code, stderr) = run_failing(&["--listen", &free, "--store", &store]).await;
    assert_eq!(code, 4, "{stderr}");
    assert_sentence(
        &stderr,
        &[
            &format!(
                "the SQLite store {} (--store) is in use by another running coordinator (pid {})",
                dir.path().join("dtx.db").display(),
                first.pid()
            ),
            "use PostgreSQL or MySQL to run several instances",
        ],
    );
    first.kill().await;
    let second = Process::start(BIN, &store, &[]).await;
    second.client().await;
}

/// An alert webhook is a target like any other: one outside `--allow-target` (here the cloud
/// metadata address, and a loopback port the rules leave out) stops the start with a usage
/// error naming the flag and the fix, before anything listens or is stored.
#[tokio::test]
async fn a_webhook_outside_the_allowlist_is_a_usage_error_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_url(&dir);
    for (webhook, rules) in [
        ("http://169.254.169.254/latest/meta-data", &[][..]),
        (
            "http://127.0.0.1:9/hook",
            &["--allow-target", "http://127.0.0.1:8080"][..],
        ),
    ] {
        let mut args = vec!["--store", &store, "--alert-webhook", webhook];
        args.extend(rules);
        let (code, stderr) = run_failing(&args).await;
        assert_eq!(code, 2, "{webhook}: {stderr}");
        assert_sentence(&stderr, &["--alert-webhook", "--allow-target"]);
    }
    assert!(
        !dir.path().join("dtx.db").exists(),
        "the store was opened before the flags were checked"
    );
}
