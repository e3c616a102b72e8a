//! Retention: records are deleted per scope after a window, in bounded batches, and never
//! while PROCESSING.
//!
//! The window is a business decision per scope: it must outlive every repeat that can still
//! arrive - a client's longest retry period for HTTP creates, the provider's notification period
//! (and reconciliation) for payment callbacks, the topic retention and longest replay for
//! consumers, the re-run horizon for jobs. Deleting earlier lets an old repeat run again;
//! never deleting grows the table forever. A scope without a window is never purged.
//!
//! Each batch is its own short transaction of at most `batch` rows, so retention never holds
//! long locks next to live traffic. PROCESSING records (in flight, unknown, or parked for a
//! person) are never deleted, whatever their age: they are unresolved intents.

use std::sync::Arc;
use std::time::Duration;

use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;

use crate::clock::SharedClock;
use crate::{Clock, Error, SystemClock, check_scope, sql};

/// Deletes `scope`'s finished records created and last updated more than `window` ago, at most
/// `batch` per transaction, until none is left; returns how many were deleted.
pub async fn purge_scope<DB: Backend>(
    pool: &Pool<DB>,
    scope: &str,
    window: Duration,
    batch: u32,
) -> Result<u64, Error> {
    purge_scope_at(pool, scope, window, batch, SystemClock.now_ms()).await
}

/// [`purge_scope`] as of `now_ms` (the cutoff is `now_ms - window`).
pub async fn purge_scope_at<DB: Backend>(
    pool: &Pool<DB>,
    scope: &str,
    window: Duration,
    batch: u32,
    now_ms: i64,
) -> Result<u64, Error> {
    check_scope(scope)?;
    let cutoff = now_ms - window.as_millis() as i64;
    let batch = i64::from(batch.max(1));
    let args = dtx_sql::args![scope, cutoff, cutoff];
    let deleted = dtx_sql::delete_batched(pool, sql::PURGE, args, batch).await?;
    crate::metrics::purged(scope, deleted);
    Ok(deleted)
}

/// Retention windows per scope, run together (for example from a periodic task).
#[derive(Clone)]
pub struct Retention {
    windows: Vec<(String, Duration)>,
    batch: u32,
    clock: SharedClock,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            windows: Vec::new(),
            batch: 500,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retention")
            .field("windows", &self.windows)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl Retention {
    /// The default windows (see [`Retention::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `scope`'s records for `window`.
    pub fn scope(mut self, scope: impl Into<String>, window: Duration) -> Self {
        self.windows.push((scope.into(), window));
        self
    }

    /// Most rows deleted per transaction (default 500).
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch;
        self
    }

    /// The clock the windows are measured back from (default [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Purges every configured scope; returns how many records were deleted.
    pub async fn run<DB: Backend>(&self, pool: &Pool<DB>) -> Result<u64, Error> {
        let mut total = 0;
        for (scope, window) in &self.windows {
            let now = self.clock.now_ms();
            let deleted = purge_scope_at(pool, scope, *window, self.batch, now).await?;
            if deleted > 0 {
                tracing::info!(
                    scope = scope.as_str(),
                    deleted,
                    "idempotency records purged"
                );
            }
            total += deleted;
        }
        Ok(total)
    }
}
