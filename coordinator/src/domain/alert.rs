//! Alerts: the events that must reach a person (a parked transaction, one stuck for too long, a
//! branch failing again and again), what they say, and how a receiver knows they came from us.
//!
//! An alert is born in the commit of the change that causes it (so a crash cannot lose it) and
//! delivered afterwards, at least once, to every configured webhook. Its id is derived from
//! what it is about, so the same cause gives the same id: the store keeps one row per id, and
//! a receiver that sees an id twice (a resend after a crash mid-delivery) drops the repeat.

use dtx_sql::db_enum;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::history::{Entry, Event};
use super::{Fence, Kind, TxStatus};

db_enum! {
    /// What an alert is about.
    pub enum AlertKind {
        /// The transaction parked in NEEDS_ATTENTION: a person must look.
        Parked = "PARKED",
        /// Not terminal longer than the configured bound.
        Stuck = "STUCK",
        /// A branch failed (or gave no answer) more often than the configured bound.
        Attempts = "ATTEMPTS",
    }
}

impl AlertKind {
    /// The event `type` a receiver switches on.
    pub fn event_type(self) -> &'static str {
        match self {
            AlertKind::Parked => "transaction.parked",
            AlertKind::Stuck => "transaction.stuck",
            AlertKind::Attempts => "branch.attempts",
        }
    }
}

/// When alerts are raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRules {
    /// A branch whose attempt number exceeds this after a failed or unknown attempt raises
    /// an [`AlertKind::Attempts`] alert (once per branch).
    pub attempts: i64,
    /// Base URL of the web console, for the link in each event.
    pub console_url: Option<String>,
    /// The instance raising it.
    pub instance: String,
}

/// An alert as stored and sent: `body` is the JSON event, fixed at creation so every resend
/// carries the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    pub id: String,
    pub xid: String,
    pub kind: AlertKind,
    pub at_ms: i64,
    pub body: String,
}

/// What an alert says about its transaction.
#[derive(Debug, Clone, Default)]
pub struct About<'a> {
    pub xid: &'a str,
    pub kind: Option<Kind>,
    pub status: Option<&'a str>,
    pub branch_id: Option<&'a str>,
    pub attempt: Option<i64>,
    pub reason: Option<&'a str>,
    pub created_ms: Option<i64>,
}

impl Alert {
    /// The alert of `kind` about `about`, raised at `at_ms`. Its id is `kind:xid` plus `key`
    /// (what distinguishes two alerts of one kind about one transaction).
    pub fn new(
        kind: AlertKind,
        key: Option<&str>,
        about: About<'_>,
        at_ms: i64,
        rules: &AlertRules,
    ) -> Alert {
        let id = match key {
            Some(key) => format!("{}:{}:{key}", kind.as_str().to_lowercase(), about.xid),
            None => format!("{}:{}", kind.as_str().to_lowercase(), about.xid),
        };
        let console = rules
            .console_url
            .as_ref()
            .map(|base| format!("{}/tx/{}", base.trim_end_matches('/'), about.xid));
        let body = serde_json::json!({
            "id": id,
            "type": kind.event_type(),
            "xid": about.xid,
            "kind": about.kind.map(Kind::as_str),
            "status": about.status,
            "branch_id": about.branch_id,
            "attempt": about.attempt,
            "reason": about.reason,
            "created_ms": about.created_ms,
            "at_ms": at_ms,
            "at": dtx_proto::present::utc(at_ms),
            "instance": rules.instance,
            "console_url": console,
        })
        .to_string();
        Alert {
            id,
            xid: about.xid.to_string(),
            kind,
            at_ms,
            body,
        }
    }
}

/// The alerts a fenced write of `xid` raises through the history it records: a change to
/// NEEDS_ATTENTION (one per claim: `fence` tells two parkings apart), and a branch's failed or
/// unknown attempt beyond `rules.attempts` (one per branch).
pub fn raised_by(
    xid: &str,
    kind: Kind,
    fence: Fence,
    history: &[Entry],
    rules: &AlertRules,
) -> Vec<Alert> {
    let mut alerts: Vec<Alert> = Vec::new();
    for e in history {
        let about = About {
            xid,
            kind: Some(kind),
            status: e.status,
            branch_id: e.branch_id.as_deref(),
            reason: e.detail.as_deref(),
            ..About::default()
        };
        let alert = match e.event {
            Event::Status if e.status == Some(TxStatus::NeedsAttention.as_str()) => Alert::new(
                AlertKind::Parked,
                Some(&fence.to_string()),
                about,
                e.at_ms,
                rules,
            ),
            Event::AttemptFailed | Event::AttemptUnknown if e.attempt > rules.attempts => {
                let about = About {
                    attempt: Some(e.attempt),
                    ..about
                };
                Alert::new(AlertKind::Attempts, about.branch_id, about, e.at_ms, rules)
            }
            _ => continue,
        };
        if !alerts.iter().any(|a| a.id == alert.id) {
            alerts.push(alert);
        }
    }
    alerts
}

/// The branches whose attempts in `history` raise an attempts alert: the driver writes at once
/// when one appears (instead of at its next write), so the alert is not held back.
pub fn over_attempts<'h>(history: &'h [Entry], rules: &AlertRules) -> Vec<&'h str> {
    history
        .iter()
        .filter(|e| {
            matches!(e.event, Event::AttemptFailed | Event::AttemptUnknown)
                && e.attempt > rules.attempts
        })
        .filter_map(|e| e.branch_id.as_deref())
        .collect()
}

/// The `dtx-signature` header of `body` sent at `unix_s`: `t=<unix seconds>,v1=<hex of
/// HMAC-SHA256(secret, "<t>.<body>")>`. Signing the time with the body lets a receiver reject
/// a replayed old request.
pub fn signature(secret: &[u8], unix_s: i64, body: &str) -> String {
    format!("t={unix_s},v1={}", hex::encode(mac(secret, unix_s, body)))
}

/// Whether `header` is a valid [`signature`] of `body` under `secret` (constant-time compare).
pub fn verify(secret: &[u8], header: &str, body: &str) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = value.parse::<i64>().ok(),
            Some(("v1", value)) => v1 = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let mut mac = keyed(secret);
    mac.update(format!("{t}.").as_bytes());
    mac.update(body.as_bytes());
    mac.verify_slice(&v1).is_ok()
}

fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length")
}

fn mac(secret: &[u8], unix_s: i64, body: &str) -> Vec<u8> {
    let mut mac = keyed(secret);
    mac.update(format!("{unix_s}.").as_bytes());
    mac.update(body.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// The wait before delivery attempt `attempts + 1` of an alert: 1 s doubling up to `max_ms`,
/// with a random quarter of jitter (`unit` in [0, 1)) so a receiver coming back is not hit by
/// every coordinator at once.
pub fn redelivery_ms(attempts: i64, max_ms: i64, unit: f64) -> i64 {
    let max = std::time::Duration::from_millis(max_ms.max(1) as u64);
    let backoff = dtx_proto::backoff::Backoff::new(std::time::Duration::from_secs(1), max);
    // `unit` takes the jitter off the step (so 0 waits the whole step).
    let wait = backoff
        .jitter(0.25)
        .delay(attempts.clamp(0, 30) as u32, 1.0 - unit.clamp(0.0, 1.0));
    wait.as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::BranchState;

    fn rules() -> AlertRules {
        AlertRules {
            attempts: 3,
            console_url: Some("http://console:8070/".into()),
            instance: "c1".into(),
        }
    }

    #[test]
    fn a_park_and_attempts_beyond_the_bound_raise_one_alert_each() {
        let history = vec![
            Entry::branch(1, Event::AttemptUnknown, "b1", BranchState::Pending, 3),
            Entry::branch(2, Event::AttemptUnknown, "b1", BranchState::Pending, 4),
            Entry::branch(3, Event::AttemptFailed, "b1", BranchState::Stuck, 5),
            Entry::tx(4, Event::Status, Some(TxStatus::NeedsAttention)).detail("refused"),
        ];
        let alerts = raised_by("x1", Kind::Tcc, Fence::stored(77), &history, &rules());
        let ids: Vec<_> = alerts.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["attempts:x1:b1", "parked:x1:77"]);
        let event: serde_json::Value = serde_json::from_str(&alerts[1].body).unwrap();
        assert_eq!(event["type"], "transaction.parked");
        assert_eq!(event["reason"], "refused");
        assert_eq!(event["console_url"], "http://console:8070/tx/x1");
        let attempts: serde_json::Value = serde_json::from_str(&alerts[0].body).unwrap();
        assert_eq!(attempts["attempt"], 4, "the first attempt beyond the bound");
        assert_eq!(over_attempts(&history, &rules()), ["b1", "b1"]);
    }

    #[test]
    fn attempts_within_the_bound_and_other_changes_raise_nothing() {
        let history = vec![
            Entry::branch(1, Event::AttemptUnknown, "b1", BranchState::Pending, 3),
            Entry::branch(2, Event::Branch, "b1", BranchState::Confirmed, 4),
            Entry::tx(3, Event::Status, Some(TxStatus::Committed)),
        ];
        assert!(raised_by("x1", Kind::Tcc, Fence::stored(1), &history, &rules()).is_empty());
        assert!(over_attempts(&history, &rules()).is_empty());
    }

    #[test]
    fn a_signature_verifies_with_its_secret_only() {
        let header = signature(b"s3cret", 1_700_000_000, "{\"id\":1}");
        assert!(header.starts_with("t=1700000000,v1="));
        assert!(verify(b"s3cret", &header, "{\"id\":1}"));
        assert!(!verify(b"wrong", &header, "{\"id\":1}"));
        assert!(!verify(b"s3cret", &header, "{\"id\":2}"));
        let replayed_time = header.replace("t=1700000000", "t=1700000001");
        assert!(!verify(b"s3cret", &replayed_time, "{\"id\":1}"));
        assert!(!verify(b"s3cret", "garbage", "{\"id\":1}"));
    }

    #[test]
    fn redelivery_doubles_from_a_second_up_to_the_cap() {
        assert_eq!(redelivery_ms(0, 60_000, 0.0), 1000);
        assert_eq!(redelivery_ms(3, 60_000, 0.0), 8000);
        assert_eq!(redelivery_ms(20, 60_000, 0.0), 60_000);
        assert_eq!(redelivery_ms(20, 60_000, 0.999), 45_015);
    }
}
