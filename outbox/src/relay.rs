//! The relay: claims due rows, publishes them (the rows of one key in sequence, different keys
//! at once), marks each sent once the broker confirmed it, or schedules its retry with backoff
//! and parks it after the attempt limit (the rest of its key's rows wait for it). It also
//! deletes old sent rows and keeps the backlog gauges current.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ::metrics::{counter, gauge, histogram};
use dtx_proto::backoff::Backoff;
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use tokio::time::Instant;

use crate::{Error, Event, Publisher, metrics, sql};

/// How a relay works.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Recorded as the owner of the rows it claims (default: a random name). Give each relay
    /// its own.
    pub owner: String,
    /// Most rows claimed per round (the heads of as many keys, then the rows behind them).
    pub batch: i64,
    /// Most rows of one key claimed per round (1: only each key's oldest unsent row). A key's
    /// rows are published one after another, so a long run holds its round; this bounds it.
    pub run_per_key: i64,
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
            run_per_key: 64,
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            poll: Duration::from_millis(100),
            max_attempts: 10,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(30)),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}

/// How one key's run of a round went: its first `published` rows went out; the next one failed
/// with `error` (if any), and the rest were not tried.
struct RunOutcome {
    published: usize,
    error: Option<String>,
}

impl RunOutcome {
    /// Where the rows that were not tried begin.
    fn untried_from(&self) -> usize {
        self.published + usize::from(self.error.is_some())
    }
}

/// Publishes the outbox of one database through one publisher.
pub struct Relay<DB: Backend, P: Publisher> {
    pool: Pool<DB>,
    publisher: Arc<P>,
    config: RelayConfig,
}

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    /// A relay of `pool`'s outbox to `publisher`, with the default [`RelayConfig`].
    pub fn new(pool: Pool<DB>, publisher: P) -> Self {
        Relay {
            pool,
            publisher: Arc::new(publisher),
            config: RelayConfig::default(),
        }
    }

    /// With these batch, lease, retry and run settings.
    pub fn with_config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// Relays until `shutdown` completes (the round under way finishes first).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut gauges_at: Option<Instant> = None;
        let mut purged_at = Instant::now();
        loop {
            let idle = match self.round().await {
                Ok(handled) => handled == 0,
                Err(e) => {
                    tracing::warn!(owner = %self.config.owner, error = %e, "outbox round failed");
                    true
                }
            };
            if gauges_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
                gauges_at = Some(Instant::now());
                self.export_backlog().await;
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
        let limits = sql::Limits {
            batch: c.batch,
            run_per_key: c.run_per_key,
        };
        let events = sql::claim(DB::conn(&mut tx), &c.owner, now, lease_until, limits).await?;
        tx.commit().await?;
        if events.is_empty() {
            return Ok(0);
        }
        // One run per key, in id order: a key's rows go out one after another, keys at once.
        let mut runs: Vec<Vec<&Event>> = Vec::new();
        let mut run_of: HashMap<&str, usize> = HashMap::new();
        for event in &events {
            let run = *run_of.entry(event.key.as_str()).or_insert_with(|| {
                runs.push(Vec::new());
                runs.len() - 1
            });
            runs[run].push(event);
        }
        // A run stops starting publishes at half the lease, so that no row of it is still
        // being published when its claim runs out and another relay may take it.
        let stop_at = Instant::now() + c.lease / 2;
        let outcomes =
            futures::future::join_all(runs.iter().map(|run| self.publish_run(run, stop_at))).await;
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let (mut sent, mut untried) = (Vec::with_capacity(events.len()), Vec::new());
        for (run, outcome) in runs.iter().zip(outcomes) {
            sent.extend_from_slice(&run[..outcome.published]);
            if let Some(error) = &outcome.error {
                self.failed(conn, run[outcome.published], error).await?;
            }
            untried.extend(run[outcome.untried_from()..].iter().map(|e| e.id));
        }
        sql::release(conn, &c.owner, &untried).await?;
        let now = dtx_sql::now_ms();
        let ids: Vec<i64> = sent.iter().map(|e| e.id).collect();
        sql::sent(conn, &ids, now).await?;
        counter!(metrics::PUBLISHED).increment(sent.len() as u64);
        for event in sent {
            let lag = (now - event.created_at).max(0) as f64 / 1000.0;
            histogram!(metrics::LAG_SECONDS).record(lag);
        }
        Ok(events.len())
    }

    /// Publishes one key's rows in order, stopping at the first that fails, or before a row
    /// after `stop_at` (the first one always goes).
    async fn publish_run(&self, run: &[&Event], stop_at: Instant) -> RunOutcome {
        for (published, event) in run.iter().enumerate() {
            if published > 0 && Instant::now() >= stop_at {
                return RunOutcome {
                    published,
                    error: None,
                };
            }
            if let Err(error) = self.publish(event).await {
                return RunOutcome {
                    published,
                    error: Some(error),
                };
            }
        }
        RunOutcome {
            published: run.len(),
            error: None,
        }
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
        histogram!(metrics::PUBLISH_SECONDS).record(started.elapsed().as_secs_f64());
        outcome
    }

    async fn failed(&self, conn: &mut DB::Conn, event: &Event, error: &str) -> Result<(), Error> {
        let c = &self.config;
        let failures = u32::try_from(event.attempts).unwrap_or(u32::MAX);
        let delay = c.backoff.delay(failures, rand::random());
        let next_at = dtx_sql::now_ms() + delay.as_millis() as i64;
        counter!(metrics::PUBLISH_FAILURES).increment(1);
        if sql::failed(conn, event, &c.owner, c.max_attempts, next_at, error).await? {
            counter!(metrics::PARKED_TOTAL).increment(1);
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

    /// Exports the backlog gauges: rows waiting, the oldest one's age, rows parked (`run`
    /// does every 5 s).
    pub async fn export_backlog(&self) {
        match crate::backlog(&self.pool).await {
            Ok(b) => {
                gauge!(metrics::WAITING).set(b.waiting as f64);
                gauge!(metrics::PARKED).set(b.parked as f64);
                let age = b
                    .oldest_created_at
                    .map_or(0, |created| (dtx_sql::now_ms() - created).max(0));
                gauge!(metrics::OLDEST_UNSENT_SECONDS).set(age as f64 / 1000.0);
            }
            Err(e) => tracing::warn!(error = %e, "reading the outbox backlog failed"),
        }
    }
}
