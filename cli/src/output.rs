//! What the commands print: aligned tables for people, JSON for scripts. Pure functions of the
//! Admin responses.

use dtx_proto::v1 as wire;
use serde_json::{Value, json};

use dtx_proto::present::{short, utc as time};

use dtx_proto::duration::human;

fn status(t: &wire::Transaction) -> String {
    short(t.status().as_str_name(), "TX_STATUS_")
}

fn kind(t: &wire::Transaction) -> String {
    short(t.kind().as_str_name(), "TX_KIND_").to_lowercase()
}

/// Columns padded to their widest cell; the last column is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_string()
    };
    let mut lines = vec![line(header.iter().map(|h| h.to_string()).collect())];
    lines.extend(rows.iter().cloned().map(line));
    lines.join("\n")
}

fn transaction_json(t: &wire::Transaction) -> Value {
    json!({
        "xid": t.xid,
        "kind": kind(t),
        "status": status(t),
        "decision": t.decision,
        "created_unix_ms": t.created_unix_ms,
        "updated_unix_ms": t.updated_unix_ms,
        "deadline_unix_ms": t.deadline_unix_ms,
        "last_error": t.last_error,
        "branches": t.branches.iter().map(|b| json!({
            "branch_id": b.branch_id,
            "target": b.target,
            "handler": b.handler,
            "status": short(b.status().as_str_name(), "BRANCH_STATUS_"),
            "attempts": b.attempts,
            "last_error": b.last_error,
        })).collect::<Vec<_>>(),
    })
}

pub fn list(page: &wire::ListTransactionsResponse, json: bool) -> String {
    if json {
        return json!({
            "transactions": page.transactions.iter().map(transaction_json).collect::<Vec<_>>(),
            "next_page_token": page.next_page_token,
        })
        .to_string();
    }
    let rows: Vec<Vec<String>> = page
        .transactions
        .iter()
        .map(|t| {
            vec![
                t.xid.clone(),
                kind(t),
                status(t),
                time(t.created_unix_ms),
                time(t.updated_unix_ms),
                t.last_error.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "XID",
            "KIND",
            "STATUS",
            "CREATED (UTC)",
            "UPDATED (UTC)",
            "LAST ERROR",
        ],
        &rows,
    );
    if !page.next_page_token.is_empty() {
        out.push_str(&format!("\n(more: --page-token {})", page.next_page_token));
    }
    out
}

pub fn detail(d: &wire::TransactionDetail, json: bool) -> String {
    let t = d.transaction.clone().unwrap_or_default();
    if json {
        let mut value = transaction_json(&t);
        value["owner"] = json!(d.owner);
        value["due_unix_ms"] = json!(d.due_unix_ms);
        value["history"] = d
            .history
            .iter()
            .map(|e| {
                json!({
                    "at_unix_ms": e.at_unix_ms,
                    "kind": short(e.kind().as_str_name(), "HISTORY_KIND_"),
                    "branch_id": e.branch_id,
                    "status": e.status,
                    "attempt": e.attempt,
                    "detail": e.detail,
                    "actor": e.actor,
                })
            })
            .collect();
        return value.to_string();
    }
    let mut out = format!(
        "{}  {} {}{}\ncreated {}  updated {}  deadline {}\n",
        t.xid,
        kind(&t),
        status(&t),
        if t.decision.is_empty() {
            String::new()
        } else {
            format!(" (decision: {})", t.decision)
        },
        time(t.created_unix_ms),
        time(t.updated_unix_ms),
        time(t.deadline_unix_ms),
    );
    if !d.owner.is_empty() {
        out.push_str(&format!("driven by {}\n", d.owner));
    }
    if d.due_unix_ms > 0 {
        out.push_str(&format!(
            "recovery looks again at {}\n",
            time(d.due_unix_ms)
        ));
    }
    if !t.last_error.is_empty() {
        out.push_str(&format!("last error: {}\n", t.last_error));
    }
    let branches: Vec<Vec<String>> = t
        .branches
        .iter()
        .map(|b| {
            vec![
                b.branch_id.clone(),
                short(b.status().as_str_name(), "BRANCH_STATUS_"),
                b.attempts.to_string(),
                b.handler.clone(),
                b.target.clone(),
                b.last_error.clone(),
            ]
        })
        .collect();
    out.push_str("\nBRANCHES\n");
    out.push_str(&table(
        &[
            "BRANCH",
            "STATUS",
            "ATTEMPTS",
            "HANDLER",
            "TARGET",
            "LAST ERROR",
        ],
        &branches,
    ));
    let history: Vec<Vec<String>> = d
        .history
        .iter()
        .map(|e| {
            vec![
                time(e.at_unix_ms),
                short(e.kind().as_str_name(), "HISTORY_KIND_"),
                e.branch_id.clone(),
                e.status.clone(),
                if e.attempt > 0 {
                    e.attempt.to_string()
                } else {
                    String::new()
                },
                if e.actor.is_empty() {
                    "initiator".into()
                } else {
                    e.actor.clone()
                },
                e.detail.clone(),
            ]
        })
        .collect();
    out.push_str("\n\nHISTORY\n");
    out.push_str(&table(
        &[
            "AT (UTC)", "EVENT", "BRANCH", "STATUS", "ATTEMPT", "BY", "DETAIL",
        ],
        &history,
    ));
    out
}

pub fn stats(s: &wire::StatsResponse, json: bool) -> String {
    let counts = s.counts.iter().map(|c| {
        (
            short(c.kind().as_str_name(), "TX_KIND_").to_lowercase(),
            short(c.status().as_str_name(), "TX_STATUS_"),
            c.count,
        )
    });
    if json {
        return json!({
            "counts": counts.map(|(k, st, n)| json!({"kind": k, "status": st, "count": n})).collect::<Vec<_>>(),
            "needs_attention": s.needs_attention,
            "oldest_open_age_ms": s.oldest_open_age_ms,
        })
        .to_string();
    }
    let rows: Vec<Vec<String>> = counts
        .map(|(k, st, n)| vec![k, st, n.to_string()])
        .collect();
    format!(
        "{}\n\nneeds attention: {}\noldest open transaction: {}",
        table(&["KIND", "STATUS", "COUNT"], &rows),
        s.needs_attention,
        if s.oldest_open_age_ms > 0 {
            human(s.oldest_open_age_ms)
        } else {
            "none".into()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(&["A", "B"], &[vec!["long".into(), "x".into()]]);
        assert_eq!(t, "A     B\nlong  x");
    }
}
