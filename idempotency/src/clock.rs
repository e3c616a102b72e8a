//! The clock records are timed by: leases, take-overs, `updated_at`, retention cutoffs.
//!
//! Every comparison with a lease happens in SQL against a `now` bound from here (never the
//! database's own clock), so a [`ManualClock`] decides alone when a lease has expired: tests
//! advance it instead of sleeping. Waiting for someone else's lease ([`crate::Idempotency::wait`])
//! and the renewal ticks of [`crate::Lease::keep_alive`] are paced by tokio's timer, not by this
//! clock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// The current time in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Now, Unix milliseconds.
    fn now_ms(&self) -> i64;
}

/// The system clock (the default). Instances sharing a table need their clocks synchronized
/// well within a lease.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        dtx_sql::now_ms()
    }
}

/// A clock that moves only when told to; clones share one time.
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn at(now_ms: i64) -> Self {
        ManualClock(Arc::new(AtomicI64::new(now_ms)))
    }

    /// A clock standing at the system clock's current time.
    pub fn starting_now() -> Self {
        Self::at(dtx_sql::now_ms())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`.
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now_ms()).finish()
    }
}

/// A shared clock.
pub(crate) type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = ManualClock::at(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(Duration::from_millis(250));
        assert_eq!(other.now_ms(), 1_250);
        other.set(5);
        assert_eq!(clock.now_ms(), 5);
    }

    #[test]
    fn the_system_clock_is_unix_ms() {
        let now = SystemClock.now_ms();
        // After 2020-01-01 and before 2100-01-01.
        assert!(now > 1_577_836_800_000 && now < 4_102_444_800_000, "{now}");
    }
}
