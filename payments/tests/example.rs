//! The README's payment-callback quick start: `cargo run -p dtx-payments --example shop` prints
//! exactly the block the README shows. Needs the local NATS with JetStream (`NATS_URL`);
//! without it the test is skipped, except under `CI=true`, where it fails.

use std::path::PathBuf;
use std::time::Duration;

/// The example binary cargo built beside this test (`target/<profile>/examples/shop`).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    profile.join("examples").join("shop")
}

/// The README's block after the line `<!-- the shop example prints -->`.
fn readme_block() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let (_, after) = readme
        .split_once("<!-- the shop example prints -->")
        .expect("the README marks the shop example's output");
    let block = after
        .trim_start()
        .strip_prefix("```text\n")
        .expect("a text block");
    block[..block.find("```").expect("the block ends")].to_string()
}

#[tokio::test]
async fn the_shop_example_prints_what_the_readme_shows() {
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let reachable = tokio::time::timeout(Duration::from_secs(3), async_nats::connect(&nats)).await;
    if !matches!(reachable, Ok(Ok(_))) {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(
            !ci,
            "NATS at {nats} is unreachable (CI=true: the example must run)"
        );
        eprintln!("SKIPPED: NATS at {nats} is unreachable");
        return;
    }
    let output = tokio::process::Command::new(example())
        .output()
        .await
        .expect("run the shop example (cargo builds examples with the tests)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    assert_eq!(printed, readme_block());
}
