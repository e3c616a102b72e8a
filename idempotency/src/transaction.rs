//! Same-transaction mode: claim, business writes and result commit together.
//!
//! The claim is an insert into `dtx_idempotency` inside the caller's local transaction. A
//! concurrent repeat's insert waits on the first one's key; when the first commits, the repeat
//! reads the committed record and replays it; when the first rolls back, the repeat's insert
//! goes through and it runs the business itself. No business effect and no record can exist
//! without each other.

use dtx_sql::{Backend, Savepoint};
use futures::future::BoxFuture;

use crate::metrics::Outcome;
use crate::{
    Answer, Claim, Completion, Decision, Idempotency, Key, RequestHash, Waiter, answer_of, backoff,
    decide, metrics, new_token, sql,
};
use crate::{Error, HandlerError};

/// The shape of same-transaction business code, named once for the private steps.
trait TxBusiness<C>:
    for<'c> Fn(&'c mut C) -> BoxFuture<'c, Result<Completion, HandlerError>> + Send + Sync
{
}

impl<C, F> TxBusiness<C> for F where
    F: for<'c> Fn(&'c mut C) -> BoxFuture<'c, Result<Completion, HandlerError>> + Send + Sync
{
}

/// One attempt of a request: its key and hash, the lease token it already owns (won through
/// the lease path) and how it won it, and the business to run.
struct Attempt<'a, F> {
    key: &'a Key,
    hash: &'a RequestHash,
    owned: Option<(&'a str, Outcome)>,
    business: &'a F,
}

// Not derived: a derive would require `F: Copy`; only references are copied.
impl<F> Clone for Attempt<'_, F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for Attempt<'_, F> {}

/// What one transaction attempt came to.
enum Step {
    /// The business ran (having won the key this way) and its outcome committed.
    Executed(Completion, Outcome),
    /// Nothing to run: the answer for this request.
    Answer(Answer),
    /// Lost a race (the record changed or vanished between statements): try again.
    Again,
    /// The record's lease expired: recover it through the fact check outside the transaction.
    Expired,
}

impl<DB: Backend> Idempotency<DB> {
    /// Runs `business` exactly once for `key` inside one local transaction with the record.
    ///
    /// `business` runs on the transaction's connection and says how it ended:
    /// * [`Completion::Succeeded`] - its writes and the result commit together;
    /// * [`Completion::FailedFinal`] / [`Completion::FailedRetryable`] - its writes are rolled
    ///   back (to a savepoint) and the failure is recorded;
    /// * [`Completion::Unknown`] - something outside this database may have happened: its
    ///   writes commit, the record stays PROCESSING, and after the lease the fact check decides;
    /// * `Err` - nothing happened anywhere: everything rolls back, the key is free again.
    ///
    /// `business` may be called again if the transaction loses a lock conflict (deadlock,
    /// busy), which is why it is `Fn`. Repeats are answered as in [`crate::decide`]; a repeat
    /// that finds a live lease waits up to [`Idempotency::wait`].
    pub async fn run_in_transaction<F>(
        &self,
        key: &Key,
        hash: &RequestHash,
        business: F,
    ) -> Result<Answer, Error>
    where
        F: for<'c> Fn(&'c mut DB::Conn) -> BoxFuture<'c, Result<Completion, HandlerError>>
            + Send
            + Sync,
    {
        let mut waiter = Waiter::new(self.wait);
        // A token won through the lease path (fact check said "not happened").
        let mut owned: Option<(String, Outcome)> = None;
        let answered = |answer: Answer| {
            if let Some(outcome) = Outcome::of_answer(&answer) {
                metrics::request(key.scope(), outcome);
            }
            Ok(answer)
        };
        loop {
            let request = Attempt {
                key,
                hash,
                owned: owned.as_ref().map(|(token, won)| (token.as_str(), *won)),
                business: &business,
            };
            let step = dtx_sql::rerun_lock_conflicts(
                self.conflict_retries,
                |n| backoff(n + 1),
                |attempt, e: &Error| {
                    metrics::lock_conflict(key.scope());
                    tracing::debug!(attempt, error = %e, "lock conflict, running again");
                },
                || self.attempt(request),
            )
            .await;
            match step {
                Ok(Step::Answer(Answer::InProgress { .. })) if waiter.has_time() => {
                    waiter.pause().await
                }
                Ok(Step::Answer(answer)) => return answered(answer),
                Ok(Step::Executed(completion, won)) => {
                    metrics::request(key.scope(), won);
                    metrics::completion(key.scope(), &completion);
                    return Ok(Answer::Executed(completion));
                }
                Ok(Step::Again) => {}
                Ok(Step::Expired) => match self.acquire(key, hash).await? {
                    Claim::Owned(lease) => owned = Some(lease.into_token()),
                    Claim::Answered(answer) => return answered(answer),
                },
                Err(e) => return Err(e),
            }
        }
    }

    async fn attempt<F>(&self, request: Attempt<'_, F>) -> Result<Step, Error>
    where
        F: TxBusiness<DB::Conn>,
    {
        let mut tx = DB::begin(&self.pool).await?;
        match self.in_transaction(DB::conn(&mut tx), request).await {
            Ok(step) => {
                tx.commit().await?;
                Ok(step)
            }
            Err(e) => {
                // A failed rollback means the connection is gone, which rolls back anyway.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    async fn in_transaction<F>(
        &self,
        conn: &mut DB::Conn,
        request: Attempt<'_, F>,
    ) -> Result<Step, Error>
    where
        F: TxBusiness<DB::Conn>,
    {
        let Attempt {
            key,
            hash,
            owned,
            business,
        } = request;
        let now = self.now_ms();
        let (token, won) = match owned {
            Some((token, won)) => (token.to_string(), won),
            None => {
                let token = new_token();
                let until = self.lease_until(now);
                if !sql::claim(conn, key, &hash.to_hex(), &token, until, now).await? {
                    let Some(record) = sql::read(conn, key).await? else {
                        return Ok(Step::Again);
                    };
                    match decide(&record, hash, now) {
                        Decision::Reclaim { version } => {
                            if !sql::reclaim(conn, key, &token, version, until, now).await? {
                                return Ok(Step::Again);
                            }
                            (token, Outcome::Reclaimed)
                        }
                        Decision::TakeOver { .. } => return Ok(Step::Expired),
                        decision => return Ok(Step::Answer(answer_of(decision, now))),
                    }
                } else {
                    (token, Outcome::First)
                }
            }
        };
        let savepoint = Savepoint::begin(conn, "dtx_idempotency").await?;
        let completion = business(conn).await.map_err(Error::Handler)?;
        // A failure's business changes are undone; its record is still written below.
        let keep = matches!(
            completion,
            Completion::Succeeded(_) | Completion::Unknown(_)
        );
        savepoint.end(conn, keep).await?;
        let now = self.now_ms();
        let still_owner = match completion.result() {
            Some(result) => {
                result.check(self.max_result_bytes)?;
                sql::finish(
                    conn,
                    key,
                    sql::By::Owner(&token),
                    completion.status(),
                    result,
                    now,
                )
                .await?
            }
            None => sql::touch(conn, key, &token, now).await?,
        };
        if !still_owner {
            return Err(Error::LeaseLost);
        }
        Ok(Step::Executed(completion, won))
    }
}
