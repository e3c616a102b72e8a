//! The console's pages as pure functions of the Admin responses, written as maud templates:
//! everything interpolated is escaped unless marked otherwise, so text from users or
//! participants (xids, errors, targets, reasons, operator names) cannot become markup; URL
//! parts are percent-encoded with the `percent-encoding` crate.

use dtx_proto::present::{short, utc};
use dtx_proto::v1 as wire;
use maud::{DOCTYPE, Markup, html};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// What stays as it is in a path segment or query value: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes a path segment or query value.
pub fn encode(text: &str) -> String {
    utf8_percent_encode(text, UNRESERVED).to_string()
}

/// The console's style sheet, served as `/console.css` (the CSP allows no inline style).
pub const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:0;color:#1b1f24}\
header{background:#1b1f24;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:center}\
header a{color:#fff;text-decoration:none}header b{font-size:16px}\
main{padding:16px 20px}table{border-collapse:collapse;width:100%;margin:8px 0 16px}\
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #ddd;vertical-align:top}\
th{background:#f3f4f6}td.err{color:#9a1c1c;max-width:480px;overflow-wrap:anywhere}\
.status{font-weight:600;padding:1px 6px;border-radius:3px;background:#e5e7eb}\
.NEEDS_ATTENTION,.STUCK{background:#fde2e1;color:#9a1c1c}\
.COMMITTED,.SUCCEEDED,.CONFIRMED,.DONE{background:#def7e5;color:#17663a}\
.ROLLED_BACK,.COMPENSATED,.CANCELLED{background:#e8eefc;color:#1e3a8a}\
.banner{padding:8px 12px;border-radius:4px;margin-bottom:12px}\
.error{background:#fde2e1;color:#9a1c1c}.ok{background:#def7e5;color:#17663a}\
ol.timeline{list-style:none;padding-left:0;border-left:3px solid #d1d5db;margin-left:8px}\
ol.timeline li{padding:4px 12px;position:relative}\
ol.timeline li:before{content:'';position:absolute;left:-8px;top:10px;width:10px;height:10px;\
border-radius:50%;background:#6b7280}\
ol.timeline li.OPERATOR:before{background:#b45309}ol.timeline li.ATTEMPT_FAILED:before{background:#9a1c1c}\
.when{color:#6b7280;font-family:monospace}form.inline{display:inline-block;margin:0 12px 12px 0;\
padding:10px;border:1px solid #ddd;border-radius:4px}input[type=text]{width:260px}\
.muted{color:#6b7280}";

/// Refreshes the element `#live` from the same URL every 5 s while the box is ticked; served
/// as `/console.js` (the CSP allows no inline script). It marks the page as refreshing, which
/// the browser test checks (the script loaded under the CSP).
pub const SCRIPT: &str = "document.documentElement.dataset.refresh='on';setInterval(async()=>{const box=document.getElementById('auto');\
if(!box||!box.checked)return;const r=await fetch(location.href);if(!r.ok)return;\
const d=new DOMParser().parseFromString(await r.text(),'text/html');\
const n=d.getElementById('live');if(n)document.getElementById('live').replaceWith(n);},5000);";

/// The refresh box; [`SCRIPT`] acts on it.
fn refresh() -> Markup {
    html! { label { input type="checkbox" #auto checked; " refresh every 5 s" } }
}

/// A whole page around `body`.
fn page(title: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                title { (title) " - dtx" }
                link rel="stylesheet" href="/console.css";
                script src="/console.js" defer {}
            }
            body {
                header {
                    b { "dtx console" }
                    a href="/" { "Needs attention" }
                    a href="/transactions" { "Transactions" }
                    form.inline #logout method="post" action="/logout" {
                        button type="submit" { "sign out" }
                    }
                }
                main { (body) }
            }
        }
    }
    .into_string()
}

fn status_badge(name: &str) -> Markup {
    html! { span class={ "status " (name) } { (name) } }
}

fn tx_status(t: &wire::Transaction) -> String {
    short(t.status().as_str_name(), "TX_STATUS_")
}

fn kind_name(kind: &str) -> String {
    short(kind, "TX_KIND_").to_lowercase()
}

/// The listing table (inside `#live`), with a link to the next page.
fn listing(page: &wire::ListTransactionsResponse, next_href: Option<String>) -> Markup {
    html! {
        div #live {
            table #transactions {
                tr {
                    th { "XID" } th { "KIND" } th { "STATUS" } th { "CREATED (UTC)" }
                    th { "UPDATED (UTC)" } th { "LAST ERROR" }
                }
                @for t in &page.transactions {
                    tr {
                        td { a.xid href={ "/tx/" (encode(&t.xid)) } { (t.xid) } }
                        td { (kind_name(t.kind().as_str_name())) }
                        td { (status_badge(&tx_status(t))) }
                        td.when { (utc(t.created_unix_ms)) }
                        td.when { (utc(t.updated_unix_ms)) }
                        td.err { (t.last_error) }
                    }
                }
                @if page.transactions.is_empty() {
                    tr { td colspan="6" .muted { "none" } }
                }
            }
            @if let Some(href) = next_href {
                a #next href=(href) { "next page" }
            }
        }
    }
}

/// The first page: what needs a person now, and the counts.
pub fn queue(parked: &wire::ListTransactionsResponse, stats: &wire::StatsResponse) -> String {
    let oldest = if stats.oldest_open_age_ms > 0 {
        format!("{} s old", stats.oldest_open_age_ms / 1000)
    } else {
        "none".into()
    };
    let body = html! {
        h2 { "Needs attention (" (stats.needs_attention) ")" }
        p.muted {
            "Transactions parked because a Confirm, Cancel or compensation was refused. Fix the \
             participant, then open one and Resume it."
        }
        (refresh())
        (listing(parked, None))
        h3 { "All transactions" }
        p { "oldest open transaction: " (oldest) }
        table #counts {
            tr { th { "KIND" } th { "STATUS" } th { "COUNT" } }
            @for c in &stats.counts {
                tr {
                    td { (kind_name(c.kind().as_str_name())) }
                    td { (status_badge(&short(c.status().as_str_name(), "TX_STATUS_"))) }
                    td { (c.count) }
                }
            }
        }
    };
    page("Needs attention", body)
}

/// The filter form's current values, to render it and the next page's link.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct Filters {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub page_token: String,
}

impl Filters {
    fn href(&self, page_token: &str) -> String {
        format!(
            "/transactions?status={}&kind={}&prefix={}&page_token={}",
            encode(&self.status),
            encode(&self.kind),
            encode(&self.prefix),
            encode(page_token)
        )
    }
}

/// The filtered, paginated list.
pub fn transactions(filters: &Filters, listed: &wire::ListTransactionsResponse) -> String {
    let statuses = std::iter::once(("", "any status"))
        .chain(crate::domain::TxStatus::SPELLINGS.iter().map(|s| (*s, *s)));
    let kinds = [
        ("", "any kind"),
        ("tcc", "tcc"),
        ("saga", "saga"),
        ("message", "message"),
    ];
    let next = (!listed.next_page_token.is_empty()).then(|| filters.href(&listed.next_page_token));
    let body = html! {
        h2 { "Transactions" }
        form #filters method="get" action="/transactions" {
            select name="status" {
                @for (value, label) in statuses {
                    option value=(value) selected[value == filters.status] { (label) }
                }
            }
            " "
            select name="kind" {
                @for (value, label) in kinds {
                    option value=(value) selected[value == filters.kind] { (label) }
                }
            }
            " "
            input type="text" name="prefix" placeholder="xid prefix" value=(filters.prefix);
            " "
            button type="submit" { "Filter" }
        }
        (refresh())
        (listing(listed, next))
    };
    page("Transactions", body)
}

/// The actions an operator may take from a transaction's page, with what each does.
pub const ACTIONS: [(&str, &str, &str); 3] = [
    (
        "resume",
        "Resume",
        "drive the decided phase again (after fixing the participant)",
    ),
    (
        "rollback",
        "Force rollback",
        "roll back an undecided TCC or compensate a running saga",
    ),
    ("retry", "Retry now", "retry at once what waits in backoff"),
];

/// One history entry of the timeline.
fn history_entry(e: &wire::HistoryEvent) -> Markup {
    let kind = short(e.kind().as_str_name(), "HISTORY_KIND_");
    html! {
        li class=(kind) {
            span.when { (utc(e.at_unix_ms)) } " " b { (kind) }
            @if !e.branch_id.is_empty() { " branch " (e.branch_id) }
            @if e.attempt > 0 { " attempt " (e.attempt) }
            @if !e.status.is_empty() { " \u{2192} " (status_badge(&e.status)) }
            " "
            span.muted {
                "by " @if e.actor.is_empty() { "the initiator" } @else { (e.actor) }
            }
            @if !e.detail.is_empty() { ": " span.detail { (e.detail) } }
        }
    }
}

/// A transaction: its state, branches, history as a timeline, and the action forms.
pub fn transaction(d: &wire::TransactionDetail, banner: Option<(&str, &str)>) -> String {
    let t = d.transaction.clone().unwrap_or_default();
    let decision = if t.decision.is_empty() {
        "none"
    } else {
        t.decision.as_str()
    };
    let body = html! {
        @if let Some((class, text)) = banner {
            div class={ "banner " (class) } #banner { (text) }
        }
        (refresh())
        div #live {
            h2 { span #xid { (t.xid) } " " (status_badge(&tx_status(&t))) }
            p {
                (kind_name(t.kind().as_str_name())) " \u{b7} decision: " (decision)
                " \u{b7} created " span.when { (utc(t.created_unix_ms)) }
                " \u{b7} updated " span.when { (utc(t.updated_unix_ms)) }
                @if !d.owner.is_empty() { " \u{b7} driven by " (d.owner) }
                @if d.due_unix_ms > 0 {
                    " \u{b7} recovery looks again at " (utc(d.due_unix_ms))
                }
            }
            @if !t.last_error.is_empty() {
                p.err #last-error { "last error: " (t.last_error) }
            }
            h3 { "Branches" }
            table #branches {
                tr {
                    th { "BRANCH" } th { "STATUS" } th { "ATTEMPTS" } th { "HANDLER" }
                    th { "TARGET" } th { "LAST ERROR" }
                }
                @for b in &t.branches {
                    tr {
                        td { (b.branch_id) }
                        td { (status_badge(&short(b.status().as_str_name(), "BRANCH_STATUS_"))) }
                        td { (b.attempts) }
                        td { (b.handler) }
                        td { (b.target) }
                        td.err { (b.last_error) }
                    }
                }
            }
            h3 { "History" }
            ol.timeline #history {
                @for e in &d.history { (history_entry(e)) }
            }
        }
        h3 { "Actions" }
        @for (action, label, what) in ACTIONS {
            form.inline id=(action) method="post" action={ "/tx/" (encode(&t.xid)) "/" (action) } {
                b { (label) } " " span.muted { (what) } br;
                input type="text" name="reason" required maxlength="512"
                    placeholder="reason (required)";
                input type="text" name="operator" maxlength="128" placeholder="your name";
                button type="submit" { (label) "\u{2026}" }
            }
        }
    };
    page(&t.xid, body)
}

/// The confirmation step of an action: what will happen, and a button that does it.
pub fn confirm(xid: &str, action: &str, reason: &str, operator: &str) -> String {
    let (_, label, what) = ACTIONS
        .iter()
        .find(|(a, _, _)| *a == action)
        .copied()
        .unwrap_or((action, action, ""));
    let body = html! {
        h2 { (label) " " (xid) "?" }
        p { (what) "." }
        p { "Reason: " q #reason { (reason) } " \u{b7} by " (operator) }
        form #confirm method="post" action={ "/tx/" (encode(xid)) "/" (action) } {
            input type="hidden" name="reason" value=(reason);
            input type="hidden" name="operator" value=(operator);
            input type="hidden" name="confirmed" value="yes";
            button type="submit" #do { "Yes, " (label) }
            " "
            a href={ "/tx/" (encode(xid)) } { "cancel" }
        }
    };
    page(&format!("{label} {xid}"), body)
}

/// The sign-in page (auth on): a token, and why the last one was refused.
pub fn login(refused: Option<&str>) -> String {
    let body = html! {
        h2 { "Sign in" }
        @if let Some(message) = refused { div.banner.error #banner { (message) } }
        p {
            "Paste a token with the reader or operator role. The console keeps it on the \
             server; your browser holds only a session cookie."
        }
        form #login method="post" action="/login" {
            input type="password" name="token" required autocomplete="off" placeholder="token"
                size="60";
            " "
            button type="submit" { "Sign in" }
        }
    };
    page("sign in", body)
}

/// An error page (unknown xid, refused filter).
pub fn error(message: &str) -> String {
    page("error", html! { div.banner.error #banner { (message) } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_text_is_shown_as_text() {
        let d = wire::TransactionDetail {
            transaction: Some(wire::Transaction {
                xid: "x\"><svg onload=alert(1)>".into(),
                last_error: "<script>alert(1)</script>".into(),
                branches: vec![wire::Branch {
                    branch_id: "b".into(),
                    target: "http://h/\"><img src=x onerror=alert(1)>".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            history: vec![wire::HistoryEvent {
                detail: "it's <b>bold</b> & more".into(),
                actor: "<i>".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let html = transaction(&d, Some(("error", "<x>")));
        assert!(!html.contains("<script>alert"));
        assert!(!html.contains("<img"));
        assert!(!html.contains("<svg"));
        assert!(!html.contains("<b>bold"));
        assert!(!html.contains("<i>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("it's &lt;b&gt;bold&lt;/b&gt; &amp; more"));
        // The xid in a form's action is a percent-encoded path segment.
        assert!(html.contains("action=\"/tx/x%22%3E%3Csvg%20onload%3Dalert%281%29%3E/resume\""));
        assert_eq!(encode("a b/<~"), "a%20b%2F%3C~");
        let confirmed = confirm("x", "resume", "\"><script>", "o'neil");
        assert!(!confirmed.contains("<script>"), "{confirmed}");
    }
}
