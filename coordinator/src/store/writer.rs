//! Group commit: one path per pool through which every write reaches the database.
//!
//! Callers queue writes; a writer task takes whatever is queued (up to `max_batch`), applies it
//! in one database transaction - in xid order, so concurrent batches (of this or another
//! coordinator) lock rows in the same order and do not deadlock - commits once, and answers
//! every caller. While one batch commits the next one fills, so under load one commit carries
//! the writes of many transactions; with one caller it is a plain commit per write.
//!
//! If a batch fails (a database error in one write), it is rolled back and each write is
//! retried alone, so one bad write cannot fail its neighbours. If the commit itself fails, the
//! outcome is unknown and every caller gets the error; all writes are idempotent or fenced,
//! so callers may repeat them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::clock::DbClock;
use super::sql::apply;
use super::{StoreOptions, StoreStats, Write, Written};
use crate::error::{Error, Result};

struct Job {
    write: Write,
    reply: oneshot::Sender<Result<Written>>,
}

/// The submitting side of the group-commit path.
pub(super) struct Writer {
    queue: mpsc::UnboundedSender<Job>,
}

impl Writer {
    /// Starts `options.writers` writer tasks on `pool`.
    pub(super) fn start<DB: Backend>(
        pool: Pool<DB>,
        options: StoreOptions,
        stats: Arc<StoreStats>,
        clock: Arc<DbClock>,
    ) -> Writer {
        let (queue, jobs) = mpsc::unbounded_channel();
        let jobs = Arc::new(Mutex::new(jobs));
        for _ in 0..options.writers.max(1) {
            tokio::spawn(run::<DB>(
                pool.clone(),
                jobs.clone(),
                options.max_batch.max(1),
                stats.clone(),
                clock.clone(),
            ));
        }
        Writer { queue }
    }

    /// Queues a write and waits until it is durable (or failed).
    pub(super) async fn submit(&self, write: Write) -> Result<Written> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { write, reply })
            .map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    jobs: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    max_batch: usize,
    stats: Arc<StoreStats>,
    clock: Arc<DbClock>,
) {
    let mut batch = Vec::with_capacity(max_batch);
    loop {
        {
            let mut jobs = jobs.lock().await;
            if jobs.recv_many(&mut batch, max_batch).await == 0 {
                return; // every sender is gone: the store was dropped
            }
        }
        // Stable: writes of one transaction keep their order.
        batch.sort_by(|a, b| xid_of(&a.write).cmp(xid_of(&b.write)));
        let writes: Vec<&Write> = batch.iter().map(|j| &j.write).collect();
        match commit::<DB>(&pool, &writes, &clock).await {
            Ok(results) => {
                stats.commits.fetch_add(1, Ordering::Relaxed);
                stats
                    .writes
                    .fetch_add(results.len() as u64, Ordering::Relaxed);
                for (job, result) in batch.drain(..).zip(results) {
                    job.reply.send(Ok(result)).ok();
                }
            }
            Err(e) if batch.len() > 1 && !dtx_sql::is_connection_error(&e) => {
                tracing::debug!(error = %e, size = batch.len(), "batch failed; applying its writes one by one");
                for job in batch.drain(..) {
                    let result = commit::<DB>(&pool, &[&job.write], &clock).await;
                    if result.is_ok() {
                        stats.commits.fetch_add(1, Ordering::Relaxed);
                        stats.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    job.reply
                        .send(result.map(|mut r| r.remove(0)).map_err(Error::from))
                        .ok();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, size = batch.len(), "store write failed");
                let message = e.to_string();
                for job in batch.drain(..) {
                    job.reply
                        .send(Err(Error::Store(dtx_sql::sqlx::Error::Protocol(
                            message.clone(),
                        ))))
                        .ok();
                }
            }
        }
    }
}

fn xid_of(write: &Write) -> &str {
    match write {
        Write::BeginTcc { xid, .. }
        | Write::RegisterBranch { xid, .. }
        | Write::Decide { xid, .. } => xid,
        Write::SubmitSaga { global } => &global.xid,
        Write::Progress(p) => &p.xid,
    }
}

/// Applies `writes` in one transaction and commits it.
async fn commit<DB: Backend>(
    pool: &Pool<DB>,
    writes: &[&Write],
    clock: &DbClock,
) -> std::result::Result<Vec<Written>, dtx_sql::sqlx::Error> {
    let mut tx = DB::begin(pool).await?;
    let now = clock.now_ms();
    let mut results = Vec::with_capacity(writes.len());
    for write in writes {
        match apply(DB::conn(&mut tx), write, now).await {
            Ok(written) => results.push(written),
            Err(Error::Store(e)) => return Err(e),
            Err(other) => return Err(dtx_sql::sqlx::Error::Protocol(other.to_string())),
        }
    }
    tx.commit().await?;
    Ok(results)
}
