//! Idempotency records: the same business intent, delivered many times, has one business effect,
//! and every repeat gets an answer compatible with the first one.
//!
//! For HTTP create endpoints, payment callbacks, message consumers and jobs (TCC/saga branches
//! use dtx-sdk's barrier). One table, `dtx_idempotency`, keyed by [`Key`] (scope +
//! tenant + stable business id + version), holding the [`RequestHash`] of the first request,
//! a [`Status`], the owner's token and lease, and the first result.
//!
//! ```text
//!   (none) --claim--> PROCESSING --complete--> SUCCEEDED | FAILED_FINAL   (replayed to repeats)
//!                        |  ^    \--complete--> FAILED_RETRYABLE --re-claim--> PROCESSING
//!                        |  |     \--unknown--> stays PROCESSING until its lease expires
//!          lease expired v  | fact check: not happened -> re-claim
//!                   take over --> happened -> SUCCEEDED;  cannot tell -> parked for a person
//! ```
//!
//! The primary key decides every race: the first request's insert wins, the others conflict on
//! it and read the record; nobody checks before inserting. Two modes:
//!
//! * **Same transaction** ([`Idempotency::run_in_transaction`]): claim, business writes and the
//!   result commit together in the caller's database; an error rolls all of it back. For
//!   business that lives in the same database and is short. Concurrent repeats wait on the
//!   first one's key and then get its committed result.
//! * **Lease** ([`Idempotency::claim`] / [`Lease::complete`], or [`Idempotency::run_with_lease`]):
//!   a short claim transaction with a random owner token and a lease, the business work
//!   anywhere (remote calls, other databases; [`Lease::keep_alive`] renews the lease while it
//!   runs, so only a dead or hung owner loses it), then a completion fenced on
//!   `owner_token = ? AND status = 'PROCESSING'`. A repeat during a live lease gets
//!   [`Answer::InProgress`] (or waits up to [`Idempotency::wait`]). After the lease expired the
//!   next request does *not* run again blindly: it takes the record over (fencing the stale
//!   owner out) and asks the [fact check](Idempotency::fact_check) whether the effect happened.
//!
//! What a repeat gets ([`decide`]): SUCCEEDED and FAILED_FINAL -> the first result
//! ([`Answer::Replayed`]); PROCESSING with a live lease -> [`Answer::InProgress`];
//! FAILED_RETRYABLE -> an atomic re-claim with a new owner token; another request hash ->
//! [`Answer::Conflict`]. The business classifies its outcome ([`Completion`]): succeeded, final
//! failure, retryable failure or **unknown** - unknown is never deleted and never retried
//! blindly; it stays PROCESSING until the lease expires and the fact check decides.
//!
//! Around it: `http` (a tower layer for the `Idempotency-Key` header, cargo feature `http`),
//! [`consumer`] (message consumers, de-duplicated in the same transaction as their writes) and
//! [`retention`] (bounded deletes per scope, statistics to monitor).
//!
//! Timestamps are the application's [`Clock`] (Unix ms, the system clock unless
//! [`Idempotency::clock`] sets another), so instances sharing a table need clocks synchronized
//! well within a lease. Keys and hashes are logged only as fingerprints.
//!
//! Cargo features: `json` (canonical-JSON request hashes, `RequestHash::of_json` and
//! `HashRules`) and `http` (the tower layer; implies `json`). Without them the crate needs
//! neither serde_json nor the http/tower stack.

mod clock;
pub mod consumer;
mod error;
mod hash;
#[cfg(feature = "http")]
pub mod http;
mod key;
mod lease;
pub mod metrics;
pub mod retention;
mod sql;
mod transaction;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use futures::future::BoxFuture;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, HandlerError};
#[cfg(feature = "json")]
pub use hash::HashRules;
pub use hash::RequestHash;
pub use key::{Key, KeyBuilder, MAX_KEY_LEN, MAX_SCOPE_LEN, check_business_id, check_scope};
pub use lease::{Claim, Lease, Recovered};

use clock::SharedClock;

/// Longest result code, in bytes (printable ASCII).
pub const MAX_RESULT_CODE_LEN: usize = 64;
/// Longest resource id, in bytes.
pub const MAX_RESOURCE_ID_LEN: usize = 128;
/// Longest parking reason kept, in bytes (longer ones are cut).
pub const MAX_ATTENTION_LEN: usize = 512;
/// Default bound of a stored result body.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 * 1024;

dtx_sql::db_enum! {
    /// The state of a record.
    pub enum Status {
        /// Claimed; the owner is working (or the outcome is unknown, or it is parked).
        Processing = "PROCESSING",
        /// Done; repeats get the recorded result.
        Succeeded = "SUCCEEDED",
        /// Failed in a way a later attempt may fix; the next request re-claims it.
        FailedRetryable = "FAILED_RETRYABLE",
        /// Failed for good; repeats get the same failure.
        FailedFinal = "FAILED_FINAL",
    }
}

/// A recorded result: what repeats get back. Keep it small - the resource id and the fields a
/// client needs - rather than a snapshot of everything (the body is bounded).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// A short code: an HTTP status (`"201"`) or a business code (`"INSUFFICIENT_FUNDS"`).
    pub code: String,
    /// The resource the first execution created, if any (order id, payment id).
    pub resource_id: Option<String>,
    /// What repeats get back as the body (bounded by the store's result limit).
    pub body: Vec<u8>,
}

impl StoredResult {
    /// A result with `code`, no resource and an empty body.
    pub fn new(code: impl Into<String>) -> Self {
        StoredResult {
            code: code.into(),
            resource_id: None,
            body: Vec::new(),
        }
    }

    /// With the id of the resource the first execution created.
    pub fn resource(mut self, id: impl Into<String>) -> Self {
        self.resource_id = Some(id.into());
        self
    }

    /// With the body repeats get back.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    fn check(&self, max_body: usize) -> Result<(), Error> {
        let limit = |msg: String| Err(dtx_proto::limits::LimitError(msg).into());
        if self.code.is_empty()
            || self.code.len() > MAX_RESULT_CODE_LEN
            || !self.code.bytes().all(|c| c.is_ascii_graphic())
        {
            return limit(format!(
                "result code must be 1..={MAX_RESULT_CODE_LEN} bytes of printable ASCII"
            ));
        }
        if let Some(id) = &self.resource_id
            && id.len() > MAX_RESOURCE_ID_LEN
        {
            return limit(format!(
                "resource id is {} bytes, longer than the limit of {MAX_RESOURCE_ID_LEN} bytes",
                id.len()
            ));
        }
        if self.body.len() > max_body {
            return limit(format!(
                "result body is {} bytes, larger than the limit of {max_body} bytes",
                self.body.len()
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for StoredResult {
    // The body may hold personal data; show its size only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredResult")
            .field("code", &self.code)
            .field("resource_id", &self.resource_id)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// How the business ended, as classified by the caller (only the caller knows whether a
/// timeout meant "not done" or "don't know").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Done; repeats get this result.
    Succeeded(StoredResult),
    /// Refused for good (invalid request, rule violation); repeats get the same failure.
    FailedFinal(StoredResult),
    /// Not done, and trying again may work (a deadlock, a downstream saying "busy"): the next
    /// request re-claims the key and runs again.
    FailedRetryable(StoredResult),
    /// It may or may not have happened (a downstream timed out after the call was sent). The
    /// record stays PROCESSING; when its lease expires the fact check decides. Never deleted,
    /// never retried blindly.
    Unknown(String),
}

impl Completion {
    fn status(&self) -> Status {
        match self {
            Completion::Succeeded(_) => Status::Succeeded,
            Completion::FailedFinal(_) => Status::FailedFinal,
            Completion::FailedRetryable(_) => Status::FailedRetryable,
            Completion::Unknown(_) => Status::Processing,
        }
    }

    fn result(&self) -> Option<&StoredResult> {
        match self {
            Completion::Succeeded(r)
            | Completion::FailedFinal(r)
            | Completion::FailedRetryable(r) => Some(r),
            Completion::Unknown(_) => None,
        }
    }
}

/// What a request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// This request held the claim and ran the business; this is what it recorded.
    Executed(Completion),
    /// A repeat of a finished intent: its first outcome (SUCCEEDED or FAILED_FINAL), including
    /// one recorded by a fact check after an expired lease.
    Replayed {
        /// SUCCEEDED or FAILED_FINAL.
        status: Status,
        /// What the first execution recorded.
        result: StoredResult,
    },
    /// Another request holds a live lease on the key; ask again after `retry_after`.
    InProgress {
        /// When the live lease ends (at the latest).
        retry_after: Duration,
    },
    /// The key was first used with a different request (hash); the first result is untouched.
    Conflict,
    /// An expired lease whose fact check could not tell what happened: parked until a person
    /// resolves it ([`Idempotency::resolve`]).
    NeedsAttention {
        /// What the fact check said, for the person resolving it.
        reason: String,
    },
}

/// What the fact check found out about an intent whose owner's lease expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    /// The effect exists (the order is there): record this as the first result.
    Happened(StoredResult),
    /// It definitely did not happen: this request re-claims the key and runs the business.
    NotHappened,
    /// Cannot tell: park the record for a person.
    Unknown(String),
}

/// The record a fact check is asked about.
#[derive(Debug, Clone)]
pub struct Expired {
    /// The intent's key.
    pub key: Key,
    /// How often the key was re-claimed before (this take-over not counted).
    pub retry_count: i64,
    /// When the key was first claimed, Unix ms.
    pub created_at: i64,
}

/// A user-supplied fact check: looks at the source of truth (orders, payment ledger, a
/// downstream's query API). An `Err` leaves the record PROCESSING under a fresh lease, so the
/// check runs again later.
pub type FactCheck =
    Arc<dyn Fn(Expired) -> BoxFuture<'static, Result<Fact, HandlerError>> + Send + Sync>;

/// A stored record, for inspection and operator tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The hash of the first request's content (repeats must match it).
    pub request_hash: String,
    /// The record's state.
    pub status: Status,
    /// The current claim's token: only its holder may complete the record.
    pub owner_token: String,
    /// Unix ms; `None` when finished or parked.
    pub lease_until: Option<i64>,
    /// The recorded result, once finished.
    pub result: Option<StoredResult>,
    /// How often the key was re-claimed.
    pub retry_count: i64,
    /// Bumped by every change (claims compare it).
    pub version: i64,
    /// Why the record is parked for a person.
    pub attention: Option<String>,
    /// First claimed, Unix ms.
    pub created_at: i64,
    /// Last changed, Unix ms.
    pub updated_at: i64,
}

/// Counts of one scope's records by state: what to put on a dashboard (per scope, never per
/// key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// PROCESSING records, parked ones included.
    pub processing: u64,
    /// PROCESSING records waiting for a person.
    pub parked: u64,
    /// SUCCEEDED records.
    pub succeeded: u64,
    /// FAILED_RETRYABLE records.
    pub failed_retryable: u64,
    /// FAILED_FINAL records.
    pub failed_final: u64,
    /// Unix ms of the least recently touched PROCESSING record (how stuck the oldest is).
    pub oldest_processing_update: Option<i64>,
    /// Unix ms of the least recently changed finished record: older than the scope's
    /// retention window means cleanup is behind.
    pub oldest_finished_update: Option<i64>,
}

/// The next step for a request that found an existing record: the state machine, free of I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Another request's key: answer 409, touch nothing.
    Conflict,
    /// A finished intent: answer its first outcome.
    Replay(Status, StoredResult),
    /// A live lease until this Unix ms.
    InProgress {
        /// Unix ms.
        lease_until: i64,
    },
    /// FAILED_RETRYABLE: re-claim if the record is still at this version.
    Reclaim {
        /// The version the re-claim expects.
        version: i64,
    },
    /// PROCESSING with an expired lease: take over (at this version), then ask the fact check.
    TakeOver {
        /// The version the take-over expects.
        version: i64,
    },
    /// Waiting for a person.
    Parked {
        /// Why it was parked.
        reason: String,
    },
}

/// Decides what a request with `request_hash` does about an existing `record` at `now` (ms).
pub fn decide(record: &Record, request_hash: &RequestHash, now: i64) -> Decision {
    if record.request_hash != request_hash.to_hex() {
        return Decision::Conflict;
    }
    match record.status {
        Status::Succeeded | Status::FailedFinal => {
            Decision::Replay(
                record.status,
                record.result.clone().unwrap_or_else(|| {
                    // A finished record always carries a result; an empty one is still an answer.
                    StoredResult::new(record.status.as_str())
                }),
            )
        }
        Status::FailedRetryable => Decision::Reclaim {
            version: record.version,
        },
        Status::Processing => match (record.lease_until, &record.attention) {
            (None, reason) => Decision::Parked {
                reason: reason.clone().unwrap_or_default(),
            },
            // Live up to and including `lease_until`, as the take-over's `lease_until < now` says.
            (Some(until), _) if until >= now => Decision::InProgress { lease_until: until },
            (Some(_), _) => Decision::TakeOver {
                version: record.version,
            },
        },
    }
}

/// The idempotency store of one database, with its settings. Cheap to clone.
pub struct Idempotency<DB: Backend> {
    pool: Pool<DB>,
    lease: Duration,
    wait: Duration,
    max_result_bytes: usize,
    conflict_retries: u32,
    fact_check: FactCheck,
    clock: SharedClock,
}

// Not derived: a derive would require `DB: Clone`, which database marker types are not.
impl<DB: Backend> Clone for Idempotency<DB> {
    fn clone(&self) -> Self {
        Idempotency {
            pool: self.pool.clone(),
            lease: self.lease,
            wait: self.wait,
            max_result_bytes: self.max_result_bytes,
            conflict_retries: self.conflict_retries,
            fact_check: self.fact_check.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<DB: Backend> Idempotency<DB> {
    /// Records on `pool` (which must hold `dtx_idempotency`: `dtx_sdk::migrate_idempotency`,
    /// or `Backend::migrate` with `dtx_sql::Schema::Idempotency`). Defaults: 30 s lease, no
    /// waiting, 64 KiB results, the system clock, and a fact check that parks every expired
    /// lease for a person - the only safe choice without knowledge of the business.
    pub fn new(pool: Pool<DB>) -> Self {
        Idempotency {
            pool,
            lease: Duration::from_secs(30),
            wait: Duration::ZERO,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            conflict_retries: 5,
            fact_check: Arc::new(|_| {
                Box::pin(async {
                    Ok(Fact::Unknown(
                        "lease expired and no fact check is configured".into(),
                    ))
                })
            }),
            clock: Arc::new(SystemClock),
        }
    }

    /// How long a claim is presumed alive. Longer than the business normally takes; a crashed
    /// owner's intent stays blocked this long before the fact check runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a repeat waits for a live lease to finish before answering
    /// [`Answer::InProgress`] (default zero: answer at once, don't tie up the caller).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Largest result body stored (default 64 KiB).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// How often a same-transaction run that lost a lock conflict (deadlock, busy) is run again.
    pub fn conflict_retries(mut self, retries: u32) -> Self {
        self.conflict_retries = retries;
        self
    }

    /// The fact check asked when a lease expired: did the effect happen?
    pub fn fact_check<F>(mut self, check: F) -> Self
    where
        F: Fn(Expired) -> BoxFuture<'static, Result<Fact, HandlerError>> + Send + Sync + 'static,
    {
        self.fact_check = Arc::new(check);
        self
    }

    /// The clock leases, take-overs and timestamps are read from (default [`SystemClock`]; a
    /// [`ManualClock`] lets tests expire a lease without waiting for it).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The current time of this store's clock (Unix ms).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The pool the records live in (the business writes share it).
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Reads a record (operator tools, tests).
    pub async fn record(&self, key: &Key) -> Result<Option<Record>, Error> {
        let mut tx = DB::begin(&self.pool).await?;
        let record = sql::read(DB::conn(&mut tx), key).await?;
        tx.commit().await?;
        Ok(record)
    }

    /// A person's decision on a parked record: records `completion` (success, final failure,
    /// or retryable failure to let the next request run again). Errors if the record is not
    /// parked.
    pub async fn resolve(&self, key: &Key, completion: Completion) -> Result<(), Error> {
        let Some(result) = completion.result() else {
            return Err(Error::Misuse(
                "a parked record can only be resolved to a result".into(),
            ));
        };
        result.check(self.max_result_bytes)?;
        let mut tx = DB::begin(&self.pool).await?;
        let now = self.now_ms();
        let done = sql::finish(
            DB::conn(&mut tx),
            key,
            sql::By::Person,
            completion.status(),
            result,
            now,
        )
        .await?;
        tx.commit().await?;
        if !done {
            return Err(Error::Misuse(format!("{key:?} is not parked for a person")));
        }
        metrics::completion(key.scope(), &completion);
        Ok(())
    }

    /// A scope's record counts by state (for metrics, per scope).
    pub async fn stats(&self, scope: &str) -> Result<Stats, Error> {
        let mut tx = DB::begin(&self.pool).await?;
        let stats = sql::stats(DB::conn(&mut tx), scope).await?;
        tx.commit().await?;
        Ok(stats)
    }

    /// Reads `scope`'s [`Stats`] and sets the record gauges of [`metrics`] from them (counts by
    /// status, the oldest PROCESSING and finished ages). Call it periodically (say every 30 s,
    /// from one instance: it is one grouped query on the scope's index) next to retention.
    pub async fn export_stats(&self, scope: &str) -> Result<Stats, Error> {
        let stats = self.stats(scope).await?;
        metrics::export(scope, &stats, self.now_ms());
        Ok(stats)
    }

    fn lease_until(&self, now: i64) -> i64 {
        now + self.lease.as_millis() as i64
    }
}

/// The answer for a decision that does not need this request to run anything.
fn answer_of(decision: Decision, now: i64) -> Answer {
    match decision {
        Decision::Conflict => Answer::Conflict,
        Decision::Replay(status, result) => Answer::Replayed { status, result },
        Decision::InProgress { lease_until } => Answer::InProgress {
            retry_after: Duration::from_millis((lease_until - now).max(1) as u64),
        },
        Decision::Parked { reason } => Answer::NeedsAttention { reason },
        // Callers act on these themselves; reaching here means "ask again shortly".
        Decision::Reclaim { .. } | Decision::TakeOver { .. } => Answer::InProgress {
            retry_after: Duration::from_millis(1),
        },
    }
}

/// A fresh random owner token (128 bits, hex).
fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Cuts `reason` to the stored limit at a character boundary.
fn attention_text(reason: &str) -> &str {
    if reason.len() <= MAX_ATTENTION_LEN {
        return reason;
    }
    let mut end = MAX_ATTENTION_LEN;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Poll interval while waiting for someone else's lease: short at first, then capped.
fn backoff(attempt: u32) -> Duration {
    dtx_proto::backoff::Backoff::new(Duration::from_millis(10), Duration::from_millis(250))
        .delay(attempt, 0.0)
}

/// Paces a repeat that waits for another request's live lease, up to a deadline.
struct Waiter {
    started: Instant,
    limit: Duration,
    waits: u32,
}

impl Waiter {
    fn new(limit: Duration) -> Self {
        Waiter {
            started: Instant::now(),
            limit,
            waits: 0,
        }
    }

    fn has_time(&self) -> bool {
        self.started.elapsed() < self.limit
    }

    async fn pause(&mut self) {
        let left = self.limit.saturating_sub(self.started.elapsed());
        tokio::time::sleep(backoff(self.waits).min(left)).await;
        self.waits += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status, lease_until: Option<i64>) -> Record {
        Record {
            request_hash: RequestHash::of_bytes(b"req").to_hex(),
            status,
            owner_token: "t".into(),
            lease_until,
            result: None,
            retry_count: 0,
            version: 7,
            attention: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn ours() -> RequestHash {
        RequestHash::of_bytes(b"req")
    }

    #[test]
    fn another_request_hash_is_a_conflict_in_every_state() {
        let other = RequestHash::of_bytes(b"other");
        for status in [
            Status::Processing,
            Status::Succeeded,
            Status::FailedRetryable,
            Status::FailedFinal,
        ] {
            assert_eq!(
                decide(&record(status, Some(10)), &other, 0),
                Decision::Conflict
            );
        }
    }

    #[test]
    fn finished_records_are_replayed() {
        let mut r = record(Status::Succeeded, None);
        r.result = Some(StoredResult::new("201").resource("O9001"));
        assert_eq!(
            decide(&r, &ours(), 0),
            Decision::Replay(
                Status::Succeeded,
                StoredResult::new("201").resource("O9001")
            )
        );
        let mut r = record(Status::FailedFinal, None);
        r.result = Some(StoredResult::new("INVALID"));
        assert!(matches!(
            decide(&r, &ours(), 0),
            Decision::Replay(Status::FailedFinal, _)
        ));
    }

    #[test]
    fn retryable_failures_are_reclaimed_at_their_version() {
        assert_eq!(
            decide(&record(Status::FailedRetryable, None), &ours(), 0),
            Decision::Reclaim { version: 7 }
        );
    }

    #[test]
    fn processing_depends_on_the_lease() {
        let live = record(Status::Processing, Some(1_000));
        for now in [999, 1_000] {
            assert_eq!(
                decide(&live, &ours(), now),
                Decision::InProgress { lease_until: 1_000 }
            );
        }
        assert_eq!(
            decide(&live, &ours(), 1_001),
            Decision::TakeOver { version: 7 }
        );
        let mut parked = record(Status::Processing, None);
        parked.attention = Some("payment provider unreachable".into());
        assert_eq!(
            decide(&parked, &ours(), 5_000),
            Decision::Parked {
                reason: "payment provider unreachable".into()
            }
        );
    }

    #[test]
    fn results_are_bounded() {
        assert!(StoredResult::new("201").check(10).is_ok());
        assert!(StoredResult::new("").check(10).is_err());
        assert!(StoredResult::new("has space").check(10).is_err());
        assert!(StoredResult::new("x".repeat(65)).check(10).is_err());
        assert!(
            StoredResult::new("201")
                .resource("r".repeat(129))
                .check(10)
                .is_err()
        );
        let err = StoredResult::new("201")
            .body(vec![0; 11])
            .check(10)
            .unwrap_err();
        assert!(err.to_string().contains("limit of 10 bytes"), "{err}");
    }

    #[test]
    fn parking_reasons_are_cut_at_a_char_boundary() {
        let long = "é".repeat(400);
        let cut = attention_text(&long);
        assert!(cut.len() <= MAX_ATTENTION_LEN);
        assert!(cut.len() >= MAX_ATTENTION_LEN - 1);
        assert_eq!(attention_text("short"), "short");
    }

    #[test]
    fn waiting_backs_off_to_a_cap() {
        assert_eq!(backoff(0), Duration::from_millis(10));
        assert_eq!(backoff(2), Duration::from_millis(40));
        assert_eq!(backoff(30), Duration::from_millis(250));
    }
}
