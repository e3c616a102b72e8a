//! The console's pages as pure functions of the Admin responses. Everything that comes from
//! users or participants (xids, errors, targets, reasons, operator names) goes through
//! [`escape`]; the only markup is ours.

use dtx_proto::present::{short, utc};
use dtx_proto::v1 as wire;

/// HTML-escapes text for element content and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a path segment or query value.
pub fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
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
const REFRESH: &str = "<label><input type=checkbox id=auto checked> refresh every 5 s</label>";

/// A whole page around `body`.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{} - dtx</title>\
         <link rel=stylesheet href=\"/console.css\"><script src=\"/console.js\" defer></script>\
         </head><body><header><b>dtx console</b>\
         <a href=\"/\">Needs attention</a><a href=\"/transactions\">Transactions</a>\
         <form class=inline id=logout method=post action=\"/logout\"><button type=submit>sign out\
         </button></form></header>\
         <main>{body}</main></body></html>",
        escape(title)
    )
}

fn status_badge(name: &str) -> String {
    format!("<span class=\"status {0}\">{0}</span>", escape(name))
}

fn tx_status(t: &wire::Transaction) -> String {
    short(t.status().as_str_name(), "TX_STATUS_")
}

fn tx_link(xid: &str) -> String {
    format!(
        "<a class=xid href=\"/tx/{}\">{}</a>",
        encode(xid),
        escape(xid)
    )
}

/// The listing table (inside `#live`), with a link to the next page.
fn listing(page: &wire::ListTransactionsResponse, next_href: Option<String>) -> String {
    let mut out = String::from(
        "<div id=live><table id=transactions><tr><th>XID</th><th>KIND</th><th>STATUS</th>\
         <th>CREATED (UTC)</th><th>UPDATED (UTC)</th><th>LAST ERROR</th></tr>",
    );
    for t in &page.transactions {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=when>{}</td><td class=when>{}</td>\
             <td class=err>{}</td></tr>",
            tx_link(&t.xid),
            short(t.kind().as_str_name(), "TX_KIND_").to_lowercase(),
            status_badge(&tx_status(t)),
            utc(t.created_unix_ms),
            utc(t.updated_unix_ms),
            escape(&t.last_error)
        ));
    }
    if page.transactions.is_empty() {
        out.push_str("<tr><td colspan=6 class=muted>none</td></tr>");
    }
    out.push_str("</table>");
    if let Some(href) = next_href {
        out.push_str(&format!(
            "<a id=next href=\"{}\">next page</a>",
            escape(&href)
        ));
    }
    out.push_str("</div>");
    out
}

/// The first page: what needs a person now, and the counts.
pub fn queue(parked: &wire::ListTransactionsResponse, stats: &wire::StatsResponse) -> String {
    let mut counts = String::new();
    for c in &stats.counts {
        counts.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            short(c.kind().as_str_name(), "TX_KIND_").to_lowercase(),
            status_badge(&short(c.status().as_str_name(), "TX_STATUS_")),
            c.count
        ));
    }
    let body = format!(
        "<h2>Needs attention ({})</h2><p class=muted>Transactions parked because a Confirm, \
         Cancel or compensation was refused. Fix the participant, then open one and Resume it.</p>\
         {REFRESH}{}<h3>All transactions</h3><p>oldest open transaction: {}</p>\
         <table id=counts><tr><th>KIND</th><th>STATUS</th><th>COUNT</th></tr>{counts}</table>",
        stats.needs_attention,
        listing(parked, None),
        if stats.oldest_open_age_ms > 0 {
            format!("{} s old", stats.oldest_open_age_ms / 1000)
        } else {
            "none".into()
        },
    );
    page("Needs attention", &body)
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
    let option = |value: &str, current: &str, label: &str| {
        let selected = if value == current { " selected" } else { "" };
        format!("<option value=\"{value}\"{selected}>{label}</option>")
    };
    let mut statuses = option("", &filters.status, "any status");
    for name in crate::domain::TxStatus::SPELLINGS {
        statuses.push_str(&option(name, &filters.status, name));
    }
    let kinds = [
        ("", "any kind"),
        ("tcc", "tcc"),
        ("saga", "saga"),
        ("message", "message"),
    ]
    .iter()
    .map(|(v, l)| option(v, &filters.kind, l))
    .collect::<String>();
    let next = (!listed.next_page_token.is_empty()).then(|| filters.href(&listed.next_page_token));
    let body = format!(
        "<h2>Transactions</h2><form id=filters method=get action=\"/transactions\">\
         <select name=status>{statuses}</select> <select name=kind>{kinds}</select> \
         <input type=text name=prefix placeholder=\"xid prefix\" value=\"{}\"> \
         <button type=submit>Filter</button></form>{REFRESH}{}",
        escape(&filters.prefix),
        listing(listed, next)
    );
    page("Transactions", &body)
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

/// A transaction: its state, branches, history as a timeline, and the action forms.
pub fn transaction(d: &wire::TransactionDetail, banner: Option<(&str, &str)>) -> String {
    let t = d.transaction.clone().unwrap_or_default();
    let mut out = String::new();
    if let Some((class, text)) = banner {
        out.push_str(&format!(
            "<div class=\"banner {class}\" id=banner>{}</div>",
            escape(text)
        ));
    }
    out.push_str(REFRESH);
    out.push_str(&format!(
        "<div id=live><h2><span id=xid>{}</span> {}</h2><p>{} &middot; decision: {} &middot; \
         created <span class=when>{}</span> &middot; updated <span class=when>{}</span>{}{}</p>",
        escape(&t.xid),
        status_badge(&tx_status(&t)),
        short(t.kind().as_str_name(), "TX_KIND_").to_lowercase(),
        if t.decision.is_empty() {
            "none".to_string()
        } else {
            escape(&t.decision)
        },
        utc(t.created_unix_ms),
        utc(t.updated_unix_ms),
        if d.owner.is_empty() {
            String::new()
        } else {
            format!(" &middot; driven by {}", escape(&d.owner))
        },
        if d.due_unix_ms > 0 {
            format!(" &middot; recovery looks again at {}", utc(d.due_unix_ms))
        } else {
            String::new()
        },
    ));
    if !t.last_error.is_empty() {
        out.push_str(&format!(
            "<p class=err id=last-error>last error: {}</p>",
            escape(&t.last_error)
        ));
    }
    out.push_str(
        "<h3>Branches</h3><table id=branches><tr><th>BRANCH</th><th>STATUS</th><th>ATTEMPTS</th>\
         <th>HANDLER</th><th>TARGET</th><th>LAST ERROR</th></tr>",
    );
    for b in &t.branches {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=err>{}</td></tr>",
            escape(&b.branch_id),
            status_badge(&short(b.status().as_str_name(), "BRANCH_STATUS_")),
            b.attempts,
            escape(&b.handler),
            escape(&b.target),
            escape(&b.last_error)
        ));
    }
    out.push_str("</table><h3>History</h3><ol class=timeline id=history>");
    for e in &d.history {
        let kind = short(e.kind().as_str_name(), "HISTORY_KIND_");
        let mut line = format!(
            "<span class=when>{}</span> <b>{}</b>",
            utc(e.at_unix_ms),
            escape(&kind)
        );
        if !e.branch_id.is_empty() {
            line.push_str(&format!(" branch {}", escape(&e.branch_id)));
        }
        if e.attempt > 0 {
            line.push_str(&format!(" attempt {}", e.attempt));
        }
        if !e.status.is_empty() {
            line.push_str(&format!(" &rarr; {}", status_badge(&e.status)));
        }
        line.push_str(&format!(
            " <span class=muted>by {}</span>",
            if e.actor.is_empty() {
                "the initiator".to_string()
            } else {
                escape(&e.actor)
            }
        ));
        if !e.detail.is_empty() {
            line.push_str(&format!(
                ": <span class=detail>{}</span>",
                escape(&e.detail)
            ));
        }
        out.push_str(&format!("<li class=\"{}\">{line}</li>", escape(&kind)));
    }
    out.push_str("</ol></div><h3>Actions</h3>");
    for (action, label, what) in ACTIONS {
        out.push_str(&format!(
            "<form class=inline id=\"{action}\" method=post action=\"/tx/{}/{action}\">\
             <b>{label}</b> <span class=muted>{what}</span><br>\
             <input type=text name=reason required maxlength=512 placeholder=\"reason (required)\">\
             <input type=text name=operator maxlength=128 placeholder=\"your name\">\
             <button type=submit>{label}&hellip;</button></form>",
            encode(&t.xid)
        ));
    }
    page(&t.xid, &out)
}

/// The confirmation step of an action: what will happen, and a button that does it.
pub fn confirm(xid: &str, action: &str, reason: &str, operator: &str) -> String {
    let (_, label, what) = ACTIONS
        .iter()
        .find(|(a, _, _)| *a == action)
        .copied()
        .unwrap_or((action, action, ""));
    let body = format!(
        "<h2>{label} {}?</h2><p>{what}.</p><p>Reason: <q id=reason>{}</q> &middot; by {}</p>\
         <form id=confirm method=post action=\"/tx/{}/{action}\">\
         <input type=hidden name=reason value=\"{}\"><input type=hidden name=operator value=\"{}\">\
         <input type=hidden name=confirmed value=yes>\
         <button type=submit id=do>Yes, {label}</button> <a href=\"/tx/{}\">cancel</a></form>",
        escape(xid),
        escape(reason),
        escape(operator),
        encode(xid),
        escape(reason),
        escape(operator),
        encode(xid),
    );
    page(&format!("{label} {xid}"), &body)
}

/// The sign-in page (auth on): a token, and why the last one was refused.
pub fn login(refused: Option<&str>) -> String {
    let banner = refused.map_or(String::new(), |m| {
        format!("<div class=\"banner error\" id=banner>{}</div>", escape(m))
    });
    page(
        "sign in",
        &format!(
            "<h2>Sign in</h2>{banner}<p>Paste a token with the reader or operator role. The \
             console keeps it on the server; your browser holds only a session cookie.</p>\
             <form id=login method=post action=\"/login\"><input type=password name=token \
             required autocomplete=off placeholder=token size=60> \
             <button type=submit>Sign in</button></form>"
        ),
    )
}

/// An error page (unknown xid, refused filter).
pub fn error(message: &str) -> String {
    page(
        "error",
        &format!(
            "<div class=\"banner error\" id=banner>{}</div>",
            escape(message)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_text_is_shown_as_text() {
        let d = wire::TransactionDetail {
            transaction: Some(wire::Transaction {
                xid: "x".into(),
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
        assert!(!html.contains("<b>bold"));
        assert!(!html.contains("<i>"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("it&#39;s &lt;b&gt;bold&lt;/b&gt; &amp; more"));
        assert_eq!(encode("a b/<"), "a%20b%2F%3C");
    }
}
