//! The relay: claims due rows, publishes them (rows of different keys at once - a round never
//! holds two rows of one key), marks each sent once the broker confirmed it, or schedules its
//! retry with backoff and parks it after the attempt limit. It also deletes old sent rows and
//! keeps the backlog gauges current.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dtx_proto::backoff::Backoff;
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use metrics::{counter, gauge, histogram};
use tokio::time::Instant;

use crate::{Error, Event, Publisher, sql};

/// How a relay works.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Recorded as the owner of the rows it claims (default: a random name). Give each relay
    /// its own.
    pub owner: String,
    /// Most rows claimed per round.
    pub batch: i64,
    /// How long a claim holds; a relay that dies leaves its rows to another after this. Keep
    /// it above `publish_timeout`.
    pub lease: Duration,
    /// A publish the broker has not confirmed within this counts as failed.
    pub publish_timeout: Duration,
    /// How long a relay that found nothing waits before it looks again.
    pub poll: Duration,
    /// Failed publishes before a row is parked for an operator.
    pub max_attempts: u32,
    /// Waits between the attempts of one row.
    pub backoff: Backoff,
    /// Sent rows are deleted this long after they were sent (`None`: kept).
    pub retention: Option<Duration>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            owner: format!("relay-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            batch: 64,
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            poll: Duration::from_millis(100),
            max_attempts: 10,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

/// Publishes the outbox of one database through one publisher.
pub struct Relay<DB: Backend, P: Publisher> {
    pool: Pool<DB>,
    publisher: Arc<P>,
    config: RelayConfig,
}

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    pub fn new(pool: Pool<DB>, publisher: P) -> Self {
        Relay {
            pool,
            publisher: Arc::new(publisher),
            config: RelayConfig::default(),
        }
    }

    pub fn with_config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// Relays until `shutdown` completes (the round under way finishes first).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut gauges_at = Instant::now();
        let mut purged_at = Instant::now();
        loop {
            let idle = match self.round().await {
                Ok(handled) => handled == 0,
                Err(e) => {
                    tracing::warn!(owner = %self.config.owner, error = %e, "outbox round failed");
                    true
                }
            };
            if gauges_at.elapsed() >= Duration::from_secs(5) {
                gauges_at = Instant::now();
                self.observe().await;
            }
            if let Some(retention) = self.config.retention
                && purged_at.elapsed() >= Duration::from_secs(60)
            {
                purged_at = Instant::now();
                if let Err(e) = self.purge(retention).await {
                    tracing::warn!(error = %e, "purging sent outbox rows failed");
                }
            }
            let pause = if idle {
                self.config.poll
            } else {
                Duration::ZERO
            };
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One round: claim, publish, record. Returns how many rows it handled.
    pub async fn round(&self) -> Result<usize, Error> {
        let c = &self.config;
        let now = dtx_sql::now_ms();
        let lease_until = now + c.lease.as_millis() as i64;
        let mut tx = DB::begin(&self.pool).await?;
        let events = sql::claim(DB::conn(&mut tx), &c.owner, now, lease_until, c.batch).await?;
        tx.commit().await?;
        if events.is_empty() {
            return Ok(0);
        }
        let published =
            futures::future::join_all(events.iter().map(|event| self.publish(event))).await;
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let mut sent = Vec::with_capacity(events.len());
        for (event, outcome) in events.iter().zip(published) {
            match outcome {
                Ok(()) => sent.push(event),
                Err(error) => self.failed(conn, event, &error).await?,
            }
        }
        let now = dtx_sql::now_ms();
        let ids: Vec<i64> = sent.iter().map(|e| e.id).collect();
        sql::sent(conn, &ids, now).await?;
        counter!("dtx_outbox_published_total").increment(sent.len() as u64);
        for event in sent {
            let lag = (now - event.created_at).max(0) as f64 / 1000.0;
            histogram!("dtx_outbox_lag_seconds").record(lag);
        }
        Ok(events.len())
    }

    /// Publishes one event within the timeout, timing the broker's confirmation.
    async fn publish(&self, event: &Event) -> Result<(), String> {
        let started = Instant::now();
        let timeout = self.config.publish_timeout;
        let outcome = match tokio::time::timeout(timeout, self.publisher.publish(event)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "the broker did not confirm within {} ms",
                timeout.as_millis()
            )),
        };
        histogram!("dtx_outbox_publish_seconds").record(started.elapsed().as_secs_f64());
        outcome
    }

    async fn failed(&self, conn: &mut DB::Conn, event: &Event, error: &str) -> Result<(), Error> {
        let c = &self.config;
        let failures = u32::try_from(event.attempts).unwrap_or(u32::MAX);
        let delay = c.backoff.delay(failures, rand::random());
        let next_at = dtx_sql::now_ms() + delay.as_millis() as i64;
        counter!("dtx_outbox_publish_failures_total").increment(1);
        if sql::failed(conn, event, &c.owner, c.max_attempts, next_at, error).await? {
            counter!("dtx_outbox_parked_total").increment(1);
            tracing::error!(
                event_id = %event.event_id,
                topic = %event.topic,
                key = %event.key,
                attempts = event.attempts + 1,
                error = %dtx_proto::present::reason(error),
                "outbox event parked after its attempt limit; later events of its key wait \
                 until it is republished"
            );
        } else {
            tracing::warn!(
                event_id = %event.event_id,
                topic = %event.topic,
                error = %dtx_proto::present::reason(error),
                retry_in_ms = delay.as_millis() as u64,
                "publishing an outbox event failed"
            );
        }
        Ok(())
    }

    /// Deletes rows sent longer than `retention` ago; how many.
    pub async fn purge(&self, retention: Duration) -> Result<u64, Error> {
        let cutoff = dtx_sql::now_ms() - retention.as_millis() as i64;
        let args = dtx_sql::args![cutoff];
        Ok(dtx_sql::delete_batched(&self.pool, sql::PURGE, args, 500).await?)
    }

    /// Exports the backlog: rows waiting, the oldest one's age, rows parked.
    async fn observe(&self) {
        match crate::backlog(&self.pool).await {
            Ok(b) => {
                gauge!("dtx_outbox_waiting").set(b.waiting as f64);
                gauge!("dtx_outbox_parked").set(b.parked as f64);
                let age = b
                    .oldest_created_at
                    .map_or(0, |created| (dtx_sql::now_ms() - created).max(0));
                gauge!("dtx_outbox_oldest_unsent_seconds").set(age as f64 / 1000.0);
            }
            Err(e) => tracing::warn!(error = %e, "reading the outbox backlog failed"),
        }
    }
}
