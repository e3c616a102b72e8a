//! Group commit: one path per pool through which every write reaches the database.
//!
//! Callers queue writes; a writer task takes whatever is queued (up to `max_batch`), applies it
//! in one database transaction - in xid order, so concurrent batches (of this or another
//! coordinator) lock rows in the same order and do not deadlock - commits once, and answers
//! every caller. While one batch commits the next one fills, so under load one commit carries
//! the writes of many transactions; with one caller it is a plain commit per write.
//!
//! If a batch fails for any reason but a lost connection (a database error in one write, a
//! write the store refuses), it is rolled back and each write is retried alone, so one bad
//! write fails alone with its own error. If the connection is lost, the outcome is unknown and
//! every caller of the batch gets `Unavailable`; all writes are idempotent or fenced, so
//! callers may repeat them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dtx_sql::sqlx::Pool;
use dtx_sql::{Backend, Conn};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::clock::DbClock;
use super::writes::{Apply, Batch, insert_alerts, insert_history};
use super::{BeginTcc, Decide, Progress, RegisterBranch, StoreOptions, StoreStats, SubmitSaga};
use crate::error::{Error, Result};

/// A queued write, its outcome once applied, and where the caller waits for it.
pub(super) struct Slot<W: Apply> {
    write: W,
    outcome: Option<W::Outcome>,
    reply: oneshot::Sender<Result<W::Outcome>>,
}

impl<W: Apply> Slot<W> {
    fn answer(self, result: Result<()>) {
        let answer = result.and_then(|()| {
            self.outcome
                .ok_or_else(|| Error::Corrupt("a committed write has no outcome".into()))
        });
        self.reply.send(answer).ok();
    }
}

/// Every kind of write, each with its own typed reply channel.
// Moved once into the queue; boxing the larger kinds would cost an allocation per write.
#[allow(clippy::large_enum_variant)]
pub(super) enum Job {
    BeginTcc(Slot<BeginTcc>),
    SubmitSaga(Slot<SubmitSaga>),
    RegisterBranch(Slot<RegisterBranch>),
    Decide(Slot<Decide>),
    Progress(Slot<Progress>),
}

/// Runs `$body` with `$slot` bound to the job's typed slot, whatever its kind.
macro_rules! with_slot {
    ($job:expr, $slot:ident => $body:expr) => {
        match $job {
            Job::BeginTcc($slot) => $body,
            Job::SubmitSaga($slot) => $body,
            Job::RegisterBranch($slot) => $body,
            Job::Decide($slot) => $body,
            Job::Progress($slot) => $body,
        }
    };
}

impl Job {
    fn xid(&self) -> &str {
        with_slot!(self, s => s.write.xid())
    }

    async fn apply<C: Conn>(&mut self, conn: &mut C, batch: &mut Batch) -> Result<()> {
        with_slot!(self, s => {
            s.outcome = Some(s.write.apply(conn, batch).await?);
        });
        Ok(())
    }

    /// Index of the job's kind in [`super::WRITE_OPERATIONS`].
    fn operation(&self) -> usize {
        match self {
            Job::BeginTcc(_) => 0,
            Job::SubmitSaga(_) => 1,
            Job::RegisterBranch(_) => 2,
            Job::Decide(_) => 3,
            Job::Progress(_) => 4,
        }
    }

    /// Answers the caller, counting a failure in `stats`.
    fn answer(self, result: Result<()>, stats: &StoreStats) {
        if result.is_err() {
            stats.failed(self.operation());
        }
        with_slot!(self, s => s.answer(result))
    }
}

/// A write type the writer can queue.
pub(super) trait Queue: Apply + Sized {
    fn job(slot: Slot<Self>) -> Job;
}

macro_rules! queue {
    ($($write:ident),*) => {$(
        impl Queue for $write {
            fn job(slot: Slot<Self>) -> Job {
                Job::$write(slot)
            }
        }
    )*};
}

queue!(BeginTcc, SubmitSaga, RegisterBranch, Decide, Progress);

/// The submitting side of the group-commit path.
#[derive(Clone)]
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
    pub(super) async fn submit<W: Queue>(&self, write: W) -> Result<W::Outcome> {
        let (reply, answer) = oneshot::channel();
        let slot = Slot {
            write,
            outcome: None,
            reply,
        };
        self.queue
            .send(W::job(slot))
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
        batch.sort_by(|a, b| a.xid().cmp(b.xid()));
        match commit::<DB>(&pool, &mut batch, &clock).await {
            Ok(()) => {
                stats.commits.fetch_add(1, Ordering::Relaxed);
                stats
                    .writes
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for job in batch.drain(..) {
                    job.answer(Ok(()), &stats);
                }
            }
            Err(e) if batch.len() > 1 && !e.is_connection_lost() => {
                tracing::debug!(error = %e, size = batch.len(), "batch failed; applying its writes one by one");
                for mut job in batch.drain(..) {
                    let result = commit::<DB>(&pool, std::slice::from_mut(&mut job), &clock).await;
                    if result.is_ok() {
                        stats.commits.fetch_add(1, Ordering::Relaxed);
                        stats.writes.fetch_add(1, Ordering::Relaxed);
                    }
                    job.answer(result, &stats);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, size = batch.len(), "store write failed");
                let message = e.to_string();
                for job in batch.drain(..) {
                    job.answer(Err(Error::Unavailable(message.clone())), &stats);
                }
            }
        }
    }
}

/// Applies `jobs` in one transaction, adds their history entries (one statement for the
/// batch) and alerts, and commits it.
async fn commit<DB: Backend>(pool: &Pool<DB>, jobs: &mut [Job], clock: &DbClock) -> Result<()> {
    let mut tx = DB::begin(pool).await?;
    let mut batch = Batch::new(clock.now_ms());
    for job in jobs.iter_mut() {
        job.apply(DB::conn(&mut tx), &mut batch).await?;
    }
    insert_history(DB::conn(&mut tx), &batch.history, batch.now).await?;
    insert_alerts(DB::conn(&mut tx), &batch.alerts, batch.now).await?;
    tx.commit().await?;
    Ok(())
}
