//! The Grafana dashboard and the Prometheus rules in `observability/` use only metrics that are
//! exported (the name lists are themselves checked against real scrapes in metrics.rs and
//! sdk_metrics.rs), the dashboard shows every exported metric, the README documents each one,
//! and `promtool check rules` accepts the rules (promtool is required when CI=true; `.ci/run`
//! fetches it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dtx_tests::db::in_ci;

fn repo_file(name: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    (path, text)
}

/// Every exported metric name: the coordinator's, the idempotency records', the barrier's, the
/// outbox's, the payment callbacks'.
fn exported() -> BTreeSet<&'static str> {
    dtx_coordinator::engine::METRIC_NAMES
        .iter()
        .chain(dtx_sdk::idempotency::metrics::METRIC_NAMES)
        .chain(dtx_sdk::metrics::METRIC_NAMES)
        .chain(dtx_outbox::metrics::METRIC_NAMES)
        .chain(dtx_payments::metrics::METRIC_NAMES)
        .copied()
        .collect()
}

/// The `dtx_*` identifiers in `text`, histogram series folded to their metric's name.
fn used(text: &str) -> BTreeSet<String> {
    let exported = exported();
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("dtx_") {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // `dtx_*` in a comment is a pattern, not a name.
        if boundary && end > "dtx_".len() {
            let name = &tail[..end];
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(b)));
            names.insert(base.unwrap_or(name).to_string());
        }
        rest = &tail[end.max(1)..];
    }
    names
}

fn dashboard_exprs() -> String {
    let (_, text) = repo_file("observability/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = String::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            exprs.push_str(expr);
            exprs.push('\n');
        }
    }
    assert!(panels.len() > 10, "the dashboard has its panels");
    exprs
}

#[test]
fn the_dashboard_uses_exported_metrics_and_shows_all_of_them() {
    let used = used(&dashboard_exprs());
    let exported: BTreeSet<String> = exported().iter().map(|s| s.to_string()).collect();
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?}");
    let missing: Vec<_> = exported.difference(&used).collect();
    assert!(missing.is_empty(), "not on the dashboard: {missing:?}");
}

#[test]
fn the_rules_use_exported_metrics() {
    let (_, rules) = repo_file("observability/prometheus-rules.yml");
    let used = used(&rules);
    assert!(used.len() > 10, "{used:?}");
    let exported: BTreeSet<String> = exported().iter().map(|s| s.to_string()).collect();
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?}");
}

#[test]
fn the_readme_documents_every_metric() {
    let (_, readme) = repo_file("README.md");
    let missing: Vec<_> = exported()
        .into_iter()
        .filter(|name| !readme.contains(&format!("`{name}`")))
        .collect();
    assert!(missing.is_empty(), "not in the README: {missing:?}");
}

#[test]
fn the_name_scan_folds_histograms_and_ignores_longer_words() {
    let names =
        used("rate(dtx_branch_call_duration_seconds_bucket[5m]) xdtx_no dtx_* dtx_made_up_count");
    let expected = ["dtx_branch_call_duration_seconds", "dtx_made_up_count"];
    assert_eq!(names, expected.iter().map(|s| s.to_string()).collect());
}

#[test]
fn promtool_accepts_the_rules() {
    let promtool = std::env::var("DTX_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let (path, _) = repo_file("observability/prometheus-rules.yml");
    let output = match std::process::Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(&path)
        .output()
    {
        Ok(output) => output,
        Err(e) if !in_ci() => {
            eprintln!("SKIPPED: {promtool} cannot run ({e}); .ci/run fetches it");
            return;
        }
        Err(e) => panic!("{promtool} cannot run ({e}); CI=true requires it (DTX_PROMTOOL)"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}
