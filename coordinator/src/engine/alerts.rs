//! Delivering alerts to webhooks, and raising the ones no state change raises (transactions
//! stuck for too long).
//!
//! Every coordinator with webhooks configured runs this loop. Alerts are claimed from the
//! store for one delivery round (others skip them meanwhile), posted to every webhook that has
//! not acknowledged them yet, and then marked delivered or due again after a capped backoff.
//! A coordinator that dies mid-round leaves its claims to expire, and whichever instance comes
//! next sends them: at least once, under the same event id.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::join_all;
use sha2::{Digest, Sha256};

use super::Engine;
use super::http_client::{Client, post_json};
use crate::domain::alert::{About, Alert, AlertKind, AlertRules, redelivery_ms, signature};
use crate::store::{Delivery, Outgoing};

/// Where and how alerts are sent.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// Webhook URLs; every alert goes to each of them.
    pub webhooks: Vec<String>,
    /// Key of the `dtx-signature` HMAC; `None` sends unsigned events.
    pub secret: Option<String>,
    /// A transaction open longer than this raises a stuck alert.
    pub stuck_after: Duration,
    /// What raises alerts and what their events carry.
    pub rules: AlertRules,
    /// Longest wait between two delivery rounds of an alert.
    pub retry_max: Duration,
    /// How long one webhook call may take.
    pub timeout: Duration,
}

/// Alerts claimed per round.
const CLAIM_BATCH: i64 = 32;

/// Stuck transactions alerted per status per scan.
const STUCK_BATCH: i64 = 100;

pub(super) async fn run(engine: Engine, config: AlertConfig) {
    let inner = &engine.inner;
    // Webhooks are often public services: the system's roots, plus the participant CA and the
    // coordinator's client certificate when they are configured (an internal receiver).
    let tls = inner.config.participant_tls.clone().map(|mut tls| {
        tls.system_roots = true;
        tls
    });
    let client = match super::http_client::client_with(tls.as_ref(), inner.config.allow.clone()) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook client; alerts are not sent");
            return;
        }
    };
    let mut shutdown = inner.shutdown.subscribe();
    // Scan for stuck transactions often enough to alert within a tenth of the bound late.
    let scan_every =
        (config.stuck_after / 10).clamp(Duration::from_millis(200), Duration::from_secs(60));
    let mut next_scan = tokio::time::Instant::now();
    loop {
        if *shutdown.borrow() {
            return;
        }
        if tokio::time::Instant::now() >= next_scan {
            next_scan = tokio::time::Instant::now() + scan_every;
            if let Err(e) = raise_stuck(&engine, &config).await {
                inner.metrics.store_error("stuck");
                tracing::warn!(error = %e, "could not scan for stuck transactions");
            }
        }
        loop {
            // A round may take a whole timeout; the claim lasts a little longer.
            let hold = config.timeout + Duration::from_secs(1);
            match inner.store.claim_alerts(hold, CLAIM_BATCH).await {
                Ok(claimed) if claimed.is_empty() => break,
                Ok(claimed) => {
                    let full = claimed.len() as i64 >= CLAIM_BATCH;
                    join_all(
                        claimed
                            .into_iter()
                            .map(|a| send(&engine, &client, &config, a)),
                    )
                    .await;
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    inner.metrics.store_error("claim_alerts");
                    tracing::warn!(error = %e, "could not claim alerts to deliver");
                    break;
                }
            }
        }
        let wait = inner
            .config
            .poll_interval
            .min(next_scan - tokio::time::Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = inner.wake_alerts.notified() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Stores a stuck alert for every transaction open longer than the bound that has none.
async fn raise_stuck(engine: &Engine, config: &AlertConfig) -> crate::error::Result<()> {
    let inner = &engine.inner;
    let now = inner.now_ms();
    let before = now - config.stuck_after.as_millis() as i64;
    let rows = inner.store.stuck(before, STUCK_BATCH).await?;
    if rows.is_empty() {
        return Ok(());
    }
    let alerts: Vec<Alert> = rows
        .iter()
        .map(|g| {
            let open_s = (now - g.created_ms) / 1000;
            let reason = match &g.last_error {
                Some(e) => format!("open for {open_s} s in {}; last error: {e}", g.status),
                None => format!("open for {open_s} s in {}", g.status),
            };
            let about = About {
                xid: &g.xid,
                kind: Some(g.kind),
                status: Some(g.status.as_str()),
                reason: Some(&reason),
                created_ms: Some(g.created_ms),
                ..About::default()
            };
            Alert::new(AlertKind::Stuck, None, about, now, &config.rules)
        })
        .collect();
    let added = inner.store.add_alerts(&alerts).await?;
    if added > 0 {
        tracing::warn!(
            count = added,
            "transactions open longer than the stuck bound"
        );
    }
    Ok(())
}

/// One delivery round of `alert`: every webhook that has not acknowledged it yet.
async fn send(engine: &Engine, client: &Client, config: &AlertConfig, alert: Outgoing) {
    let unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut delivered = alert.delivered.clone();
    let mut errors = Vec::new();
    let metrics = &engine.inner.metrics;
    for url in &config.webhooks {
        let print = fingerprint(url);
        if delivered.contains(&print) {
            continue;
        }
        let mut headers = vec![("dtx-event-id", alert.id.clone())];
        if let Some(secret) = &config.secret {
            let signed = signature(secret.as_bytes(), unix_s, &alert.body);
            headers.push(("dtx-signature", signed));
        }
        let body = Bytes::from(alert.body.clone());
        let error = match post_json(client, url, &headers, body, config.timeout).await {
            Ok((status, _)) if status.is_success() => None,
            Ok((status, _)) => Some(format!("{}: HTTP {status}", redact(url))),
            Err(e) => Some(format!("{}: {e}", redact(url))),
        };
        metrics.alert_delivery(error.is_none());
        match error {
            None => delivered.push(print),
            Some(error) => errors.push(error),
        }
    }
    let inner = &engine.inner;
    let retry_at_ms = (!errors.is_empty()).then(|| {
        let wait = redelivery_ms(
            alert.attempts,
            config.retry_max.as_millis() as i64,
            rand::random(),
        );
        inner.now_ms() + wait
    });
    let error = (!errors.is_empty()).then(|| errors.join("; "));
    if let Some(error) = &error {
        tracing::warn!(id = %alert.id, attempts = alert.attempts + 1, %error, "alert not delivered yet");
    }
    let delivery = Delivery {
        delivered,
        retry_at_ms,
        error,
    };
    if let Err(e) = inner.store.finish_alert(&alert.id, &delivery).await {
        inner.metrics.store_error("finish_alert");
        tracing::warn!(id = %alert.id, error = %e, "could not record an alert's delivery; it will be sent again");
    }
}

/// A webhook's stored identity: a hash, so the store holds no URL (and no token in it).
fn fingerprint(url: &str) -> String {
    hex::encode(&Sha256::digest(url.as_bytes())[..8])
}

/// The scheme and host of a URL, for logs and stored errors.
fn redact(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    match url.split_once("://") {
        Some((scheme, _)) => format!("{scheme}://{host}"),
        None => host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_name_a_webhook_by_its_host_only() {
        assert_eq!(
            redact("https://user:pw@hooks.example.com:8443/services/T0/B0/secret?x=1"),
            "https://hooks.example.com:8443"
        );
        assert_eq!(redact("http://127.0.0.1:9/alerts"), "http://127.0.0.1:9");
        assert_ne!(fingerprint("http://a/1"), fingerprint("http://a/2"));
        assert_eq!(fingerprint("http://a/1").len(), 16);
    }
}
