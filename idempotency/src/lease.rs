//! Lease mode: claim in a short transaction, work anywhere, complete fenced on the owner token.
//!
//! A claim is a committed PROCESSING record with a random owner token and `lease_until`. The
//! business may then call other services or databases; its completion is one conditional
//! update (`WHERE owner_token = ? AND status = 'PROCESSING'`), so an owner that stalled past its
//! lease and was taken over cannot overwrite what its successor decided.
//!
//! The window between "business done" and "completion recorded" is real (a crash in it leaves
//! a PROCESSING record whose effect exists). That is why an expired lease is never simply
//! claimed again: the taker asks the fact check first. The business effect itself should still
//! be guarded by a business unique key (order request number), because a fact check cannot
//! stop a stalled owner that wakes up later from writing.

use dtx_sql::Backend;
use std::future::Future;

use crate::metrics::Outcome;
use crate::{
    Answer, Completion, Decision, Expired, Fact, Idempotency, Key, Record, RequestHash, Status,
    StoredResult, Waiter, answer_of, attention_text, decide, metrics, new_token, sql,
};
use crate::{Error, HandlerError};

/// The outcome of [`Idempotency::claim`].
pub enum Claim<DB: Backend> {
    /// This request owns the key: run the business, then [`Lease::complete`].
    Owned(Lease<DB>),
    /// Nothing to run: the answer for this request.
    Answered(Answer),
}

/// Ownership of a PROCESSING record until `lease_until`.
pub struct Lease<DB: Backend> {
    store: Idempotency<DB>,
    key: Key,
    token: String,
    /// How the claim was won (first insert, re-claim, take-over), for the request metric.
    won: Outcome,
}

impl<DB: Backend> Lease<DB> {
    /// The key this lease holds.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The owner token the completion is fenced on.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Extends the lease to a full lease from now: work that may outlast one lease calls this
    /// periodically, so nobody takes the record over while it is still running.
    /// [`Error::LeaseLost`] if it already was taken over - stop and don't complete.
    pub async fn renew(&self) -> Result<(), Error> {
        let (store, key, token) = (self.store.clone(), self.key.clone(), self.token.clone());
        // Detached (as every database conversation of lease mode): a request that goes away
        // must not hand its connection back mid-read (see `dtx_sql::detached`).
        let owned = dtx_sql::detached(async move {
            let now = store.now_ms();
            let mut tx = DB::begin(&store.pool).await?;
            let until = store.lease_until(now);
            let owned = sql::renew(DB::conn(&mut tx), &key, &token, until, now).await?;
            tx.commit().await?;
            Ok::<_, Error>(owned)
        })
        .await?;
        if owned { Ok(()) } else { Err(Error::LeaseLost) }
    }

    /// Runs `work` while renewing the lease every third of it, so only a dead owner (crashed,
    /// its future dropped, its runtime stalled past a lease) loses the record; a slow but live
    /// one keeps it, and repeats are told "in progress" instead of taking it over. Work that
    /// may wait forever needs its own timeout: while its future lives, the lease does too.
    /// The one renewal loop of lease mode: [`Idempotency::run_with_lease`] and the HTTP layer
    /// both use it. If the
    /// lease is lost anyway (a renewal came too late), renewing stops and `work` still finishes;
    /// [`Lease::complete`] then refuses. A failed renewal (database hiccup) is tried again at
    /// the next tick.
    pub async fn keep_alive<F: Future>(&self, work: F) -> F::Output {
        let period = (self.store.lease / 3).max(std::time::Duration::from_millis(1));
        let renewing = async {
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                match self.renew().await {
                    Ok(()) => {}
                    Err(Error::LeaseLost) => {
                        tracing::warn!(
                            scope = self.key.scope(),
                            key = %self.key.fingerprint(),
                            "lease lost while the work was still running"
                        );
                        return;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        scope = self.key.scope(),
                        "lease renewal failed; trying again"
                    ),
                }
            }
        };
        tokio::pin!(work);
        tokio::select! {
            output = &mut work => return output,
            () = renewing => {}
        }
        work.await
    }

    pub(crate) fn into_token(self) -> (String, Outcome) {
        (self.token, self.won)
    }

    /// Records how the business ended, if this lease still owns the record; otherwise
    /// [`Error::LeaseLost`] and nothing is written (the record belongs to whoever took it over).
    /// [`Completion::Unknown`] writes nothing either: the record stays PROCESSING and the fact
    /// check decides once the lease has expired. A result over the limits parks the record
    /// (the effect happened but cannot be replayed) and returns the limit error.
    pub async fn complete(self, completion: Completion) -> Result<Answer, Error> {
        dtx_sql::detached(self.record(completion)).await
    }

    async fn record(self, completion: Completion) -> Result<Answer, Error> {
        let store = &self.store;
        let now = store.now_ms();
        let mut tx = DB::begin(&store.pool).await?;
        let conn = DB::conn(&mut tx);
        let owned = match completion.result() {
            None => sql::touch(conn, &self.key, &self.token, now).await?,
            Some(result) => match result.check(store.max_result_bytes) {
                Ok(()) => {
                    sql::finish(
                        conn,
                        &self.key,
                        sql::By::Owner(&self.token),
                        completion.status(),
                        result,
                        now,
                    )
                    .await?
                }
                Err(limit) => {
                    let reason = format!("result could not be stored: {limit}");
                    sql::park(conn, &self.key, &self.token, attention_text(&reason), now).await?;
                    tx.commit().await?;
                    metrics::parked(self.key.scope());
                    return Err(limit);
                }
            },
        };
        tx.commit().await?;
        if !owned {
            tracing::warn!(
                scope = self.key.scope(),
                key = %self.key.fingerprint(),
                "late completion refused: the lease was taken over"
            );
            metrics::refused(self.key.scope());
            return Err(Error::LeaseLost);
        }
        metrics::completion(self.key.scope(), &completion);
        Ok(Answer::Executed(completion))
    }
}

/// What [`Idempotency::recover_expired`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The fact check found the effect: recorded as SUCCEEDED.
    pub succeeded: u64,
    /// The effect did not happen: released as FAILED_RETRYABLE for the client's next retry.
    pub released: u64,
    /// Nobody could tell: parked for a person.
    pub parked: u64,
}

impl<DB: Backend> Idempotency<DB> {
    /// Claims `key` for a request with `hash`, or says why not (see [`crate::decide`]).
    /// Waits up to [`Idempotency::wait`] for a live lease to finish.
    pub async fn claim(&self, key: &Key, hash: &RequestHash) -> Result<Claim<DB>, Error> {
        let (store, owned_key, hash) = (self.clone(), key.clone(), *hash);
        let claim =
            dtx_sql::detached(async move { store.acquire(&owned_key, &hash).await }).await?;
        let outcome = match &claim {
            Claim::Owned(lease) => Some(lease.won),
            Claim::Answered(answer) => Outcome::of_answer(answer),
        };
        if let Some(outcome) = outcome {
            metrics::request(key.scope(), outcome);
        }
        Ok(claim)
    }

    /// [`Idempotency::claim`] without counting the request (a caller that counts it itself).
    pub(crate) async fn acquire(&self, key: &Key, hash: &RequestHash) -> Result<Claim<DB>, Error> {
        let mut waiter = Waiter::new(self.wait);
        let hash_hex = hash.to_hex();
        loop {
            let now = self.now_ms();
            let token = new_token();
            let mut tx = DB::begin(&self.pool).await?;
            let conn = DB::conn(&mut tx);
            if sql::claim(conn, key, &hash_hex, &token, self.lease_until(now), now).await? {
                tx.commit().await?;
                return Ok(Claim::Owned(self.owned(key, token, Outcome::First)));
            }
            let record = sql::read(conn, key).await?;
            tx.commit().await?;
            // Gone between our insert and read (retention): insert again.
            let Some(record) = record else { continue };
            match decide(&record, hash, now) {
                Decision::Reclaim { version } => {
                    let mut tx = DB::begin(&self.pool).await?;
                    let until = self.lease_until(now);
                    let won =
                        sql::reclaim(DB::conn(&mut tx), key, &token, version, until, now).await?;
                    tx.commit().await?;
                    if won {
                        return Ok(Claim::Owned(self.owned(key, token, Outcome::Reclaimed)));
                    }
                }
                Decision::TakeOver { version } => {
                    if let Some(claim) = self.take_over(key, &record, version, token).await? {
                        return Ok(claim);
                    }
                }
                Decision::InProgress { .. } if waiter.has_time() => waiter.pause().await,
                decision => return Ok(Claim::Answered(answer_of(decision, now))),
            }
        }
    }

    /// Claims, runs `business` if this request owns the key (renewing the lease while it runs,
    /// see [`Lease::keep_alive`]), and completes. An `Err` from the business counts as
    /// [`Completion::Unknown`]: work outside a database transaction that failed half-way may
    /// have had its effect.
    pub async fn run_with_lease<F, Fut>(
        &self,
        key: &Key,
        hash: &RequestHash,
        business: F,
    ) -> Result<Answer, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Completion, HandlerError>>,
    {
        match self.claim(key, hash).await? {
            Claim::Answered(answer) => Ok(answer),
            Claim::Owned(lease) => {
                let completion = lease
                    .keep_alive(business())
                    .await
                    .unwrap_or_else(|e| Completion::Unknown(e.to_string()));
                lease.complete(completion).await
            }
        }
    }

    /// Sweeps up to `limit` expired leases of `scope` through the fact check, so stuck
    /// records are resolved even if the client never retries. An effect that did not happen is
    /// released as FAILED_RETRYABLE (a sweeper cannot run the business; the next request will).
    pub async fn recover_expired(&self, scope: &str, limit: u32) -> Result<Recovered, Error> {
        let mut tx = DB::begin(&self.pool).await?;
        let keys = sql::expired(DB::conn(&mut tx), scope, self.now_ms(), limit).await?;
        tx.commit().await?;
        let mut recovered = Recovered::default();
        for idem_key in keys {
            let key = Key::from_stored(scope, &idem_key)?;
            let Some(record) = self.record(&key).await? else {
                continue;
            };
            let Decision::TakeOver { version } =
                decide(&record, &Self::own_hash(&record)?, self.now_ms())
            else {
                continue;
            };
            match self.take_over(&key, &record, version, new_token()).await? {
                Some(Claim::Owned(lease)) => {
                    let result = StoredResult::new("LEASE_EXPIRED_NOT_DONE");
                    match lease.complete(Completion::FailedRetryable(result)).await {
                        Ok(_) => recovered.released += 1,
                        Err(Error::LeaseLost) => {}
                        Err(e) => return Err(e),
                    }
                }
                Some(Claim::Answered(Answer::Replayed { .. })) => recovered.succeeded += 1,
                Some(Claim::Answered(Answer::NeedsAttention { .. })) => recovered.parked += 1,
                Some(Claim::Answered(_)) | None => {}
            }
        }
        Ok(recovered)
    }

    /// A sweep acts on behalf of the stored request, so it presents the stored hash.
    fn own_hash(record: &Record) -> Result<RequestHash, Error> {
        RequestHash::from_hex(&record.request_hash).ok_or_else(|| {
            Error::Corrupt(format!(
                "stored request hash {:?} is malformed",
                record.request_hash
            ))
        })
    }

    fn owned(&self, key: &Key, token: String, won: Outcome) -> Lease<DB> {
        Lease {
            store: self.clone(),
            key: key.clone(),
            token,
            won,
        }
    }

    /// Takes over an expired lease (fencing out its stale owner) and lets the fact check
    /// decide. `None` if someone else changed the record first: read it again.
    async fn take_over(
        &self,
        key: &Key,
        record: &Record,
        version: i64,
        token: String,
    ) -> Result<Option<Claim<DB>>, Error> {
        let now = self.now_ms();
        let mut tx = DB::begin(&self.pool).await?;
        let won = sql::reclaim(
            DB::conn(&mut tx),
            key,
            &token,
            version,
            self.lease_until(now),
            now,
        )
        .await?;
        tx.commit().await?;
        if !won {
            return Ok(None);
        }
        tracing::info!(
            scope = key.scope(),
            key = %key.fingerprint(),
            retry_count = record.retry_count,
            "lease expired; asking the fact check"
        );
        let expired = Expired {
            key: key.clone(),
            retry_count: record.retry_count,
            created_at: record.created_at,
        };
        // On error the record keeps our fresh lease; the check runs again when it expires.
        let fact = (self.fact_check)(expired).await.map_err(|e| {
            metrics::takeover(key.scope(), None);
            Error::FactCheck(e)
        })?;
        metrics::takeover(key.scope(), Some(&fact));
        let now = self.now_ms();
        let answer = match fact {
            Fact::NotHappened => {
                return Ok(Some(Claim::Owned(self.owned(
                    key,
                    token,
                    Outcome::TakenOver,
                ))));
            }
            Fact::Happened(result) => {
                result.check(self.max_result_bytes)?;
                let mut tx = DB::begin(&self.pool).await?;
                let conn = DB::conn(&mut tx);
                let done = sql::finish(
                    conn,
                    key,
                    sql::By::Owner(&token),
                    Status::Succeeded,
                    &result,
                    now,
                )
                .await?;
                tx.commit().await?;
                done.then_some(Answer::Replayed {
                    status: Status::Succeeded,
                    result,
                })
            }
            Fact::Unknown(reason) => {
                tracing::warn!(
                    scope = key.scope(),
                    key = %key.fingerprint(),
                    "fact check could not tell; parked for a person"
                );
                let mut tx = DB::begin(&self.pool).await?;
                let conn = DB::conn(&mut tx);
                let done = sql::park(conn, key, &token, attention_text(&reason), now).await?;
                tx.commit().await?;
                done.then_some(Answer::NeedsAttention { reason })
            }
        };
        Ok(answer.map(Claim::Answered))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dtx_sql::sqlx::{Pool, Sqlite};

    use super::*;
    use crate::ManualClock;

    const LEASE: Duration = Duration::from_secs(30);

    async fn sqlite() -> (tempfile::TempDir, Pool<Sqlite>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("idem.db").display());
        let pool = Sqlite::connect(&url, 2).await.unwrap();
        Sqlite::migrate(&pool, dtx_sql::Schema::Idempotency)
            .await
            .unwrap();
        (dir, pool)
    }

    fn key(id: &str) -> Key {
        Key::builder("order.create")
            .business_id(id)
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn a_lease_lapses_when_the_clock_passes_it_and_the_stale_owner_is_fenced() {
        let (_dir, pool) = sqlite().await;
        let clock = ManualClock::at(1_000_000);
        let store = Idempotency::new(pool).lease(LEASE).clock(clock.clone());
        let (k, hash) = (key("o-1"), RequestHash::of_bytes(b"req"));
        let Claim::Owned(stale) = store.claim(&k, &hash).await.unwrap() else {
            panic!("first claim owns the key")
        };
        // Live up to and including its last millisecond, however long the test really takes.
        clock.advance(LEASE);
        let Claim::Answered(Answer::InProgress { retry_after }) =
            store.claim(&k, &hash).await.unwrap()
        else {
            panic!("the lease still lives")
        };
        assert_eq!(retry_after, Duration::from_millis(1));
        clock.advance(Duration::from_millis(1));
        // Expired: taken over, and the default fact check parks it for a person.
        let Claim::Answered(Answer::NeedsAttention { .. }) = store.claim(&k, &hash).await.unwrap()
        else {
            panic!("an expired lease goes to the fact check")
        };
        let late = stale
            .complete(Completion::Succeeded(StoredResult::new("201")))
            .await;
        assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
        let record = store.record(&k).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.lease_until),
            (Status::Processing, None)
        );
        assert_eq!(record.updated_at, 1_000_000 + 30_001);
    }

    #[tokio::test]
    async fn renewals_and_sweeps_follow_the_clock() {
        let (_dir, pool) = sqlite().await;
        let clock = ManualClock::at(5_000);
        let store = Idempotency::new(pool)
            .lease(LEASE)
            .clock(clock.clone())
            .fact_check(|_| Box::pin(async { Ok(Fact::NotHappened) }));
        let (k, hash) = (key("o-2"), RequestHash::of_bytes(b"req"));
        let Claim::Owned(lease) = store.claim(&k, &hash).await.unwrap() else {
            panic!("first claim owns the key")
        };
        clock.advance(LEASE / 2);
        lease.renew().await.unwrap();
        assert_eq!(
            store.record(&k).await.unwrap().unwrap().lease_until,
            Some(5_000 + 15_000 + 30_000)
        );
        clock.advance(LEASE);
        let nothing = store.recover_expired("order.create", 10).await.unwrap();
        assert_eq!(nothing, Recovered::default(), "renewed: not expired yet");
        clock.advance(Duration::from_millis(1));
        let swept = store.recover_expired("order.create", 10).await.unwrap();
        assert_eq!(swept.released, 1);
        assert_eq!(
            store.record(&k).await.unwrap().unwrap().status,
            Status::FailedRetryable
        );
        assert!(matches!(lease.renew().await, Err(Error::LeaseLost)));
    }
}
