//! What the outbox tests share whichever broker they relay to: enqueueing, a fast relay, waiting
//! for the outbox to drain, the per-key order check, a relay that dies after publishing, and
//! the consumer's business write.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use dtx_outbox::{Event, Publisher, RelayConfig};
use dtx_proto::backoff::Backoff;
use dtx_sdk::barrier::HandlerError;
use dtx_sql::sqlx::Pool;
use dtx_sql::{Conn, args};
use futures::StreamExt;
use futures::future::BoxFuture;

use crate::db::TestBackend;

/// Enqueues `payload` on `topic` with `key` (and the header `kind: test`) in a transaction of
/// its own, committed or rolled back; its event id.
pub async fn enqueue<DB: TestBackend>(
    pool: &Pool<DB>,
    topic: &str,
    key: &str,
    payload: &str,
    commit: bool,
) -> String {
    let mut tx = DB::begin(pool).await.unwrap();
    let headers = BTreeMap::from([("kind".to_string(), "test".to_string())]);
    let id = dtx_outbox::enqueue(DB::conn(&mut tx), topic, key, &headers, payload.as_bytes())
        .await
        .unwrap();
    if commit {
        tx.commit().await.unwrap();
    }
    id
}

/// A relay that polls every 10 ms, holds claims 500 ms and parks after 3 attempts.
pub fn config(owner: &str) -> RelayConfig {
    RelayConfig {
        owner: owner.into(),
        batch: 8,
        run_per_key: 8,
        lease: Duration::from_millis(500),
        publish_timeout: Duration::from_secs(2),
        poll: Duration::from_millis(10),
        max_attempts: 3,
        backoff: Backoff::new(Duration::from_millis(10), Duration::from_millis(40)),
        retention: None,
    }
}

/// Waits (20 s at most) until nothing waits in the outbox.
pub async fn drained<DB: TestBackend>(pool: &Pool<DB>) {
    for _ in 0..2000 {
        if dtx_outbox::backlog(pool).await.unwrap().waiting == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the outbox did not drain: {:?}",
        dtx_outbox::backlog(pool).await
    );
}

/// Payloads `"<key>:<n>"` in the order the broker holds them: each key's `n` must count up.
pub fn assert_in_order_per_key<'a>(payloads: impl IntoIterator<Item = &'a str>) {
    let mut last: HashMap<String, i64> = HashMap::new();
    for payload in payloads {
        let (key, n) = payload.split_once(':').unwrap();
        let n: i64 = n.parse().unwrap();
        let before = last.insert(key.to_string(), n).unwrap_or(-1);
        assert!(n > before, "{key}: {n} after {before}");
    }
}

/// Publishes (the broker confirmed it), then never answers: a relay that dies before it marks
/// the row sent.
pub struct DiesAfterPublishing<P>(pub P);

impl<P: Publisher> Publisher for DiesAfterPublishing<P> {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.0.publish(event).await?;
            std::future::pending().await
        })
    }
}

/// A consumer's business write for `event_id`: one `credits` row (see
/// [`crate::idempotency::create_tables`]), in the consumer helper's transaction.
pub fn credit<C: Conn>(
    event_id: &str,
) -> impl for<'c> Fn(&'c mut C) -> BoxFuture<'c, Result<(), HandlerError>> + Send + Sync + use<C> {
    let event_id = event_id.to_string();
    move |conn| {
        let event_id = event_id.clone();
        Box::pin(async move {
            conn.execute(
                "INSERT INTO credits (event_id, account, amount) VALUES (?, ?, ?)",
                args![event_id.as_str(), "acct", 1i64],
            )
            .await?;
            Ok(())
        })
    }
}

/// Every message of `stream`: (Nats-Msg-Id, subject, payload), in stream order.
pub async fn read_all(
    stream: &async_nats::jetstream::stream::Stream,
) -> Vec<(String, String, String)> {
    let mut stream = stream.clone();
    let count = stream.info().await.expect("stream info").state.messages as usize;
    if count == 0 {
        return Vec::new();
    }
    let reader = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("create reader");
    let mut messages = reader
        .fetch()
        .max_messages(count)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .expect("fetch");
    let mut out = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message.expect("message");
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.to_string())
            .unwrap_or_default();
        let payload = String::from_utf8(message.payload.to_vec()).unwrap();
        out.push((id, message.subject.to_string(), payload));
    }
    out
}
