//! One clock for every instance: the database's.
//!
//! Leases, due times and deadlines are compared across instances, so they must all be read
//! off one clock. Instances' wall clocks drift and jump (NTP steps, a VM resumed, a wrong
//! time zone setting); the database is the one thing every instance shares. The store samples
//! the database's time at start and periodically, and [`DbClock::now_ms`] extrapolates from
//! the last sample on this process's monotonic clock, so a jump of the local wall clock
//! between samples changes nothing either.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use dtx_sql::Sql;

/// The database's current time in Unix milliseconds, per dialect. SQLite is embedded: its
/// time is this process's, which is right because only one instance can use the file.
pub(super) const DB_NOW_MS: Sql = Sql {
    postgres: "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    mysql: "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)",
    sqlite: "SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
};

/// Database time, extrapolated on the local monotonic clock from the last sample.
#[derive(Debug)]
pub struct DbClock {
    origin: Instant,
    /// Database time minus milliseconds elapsed since `origin`.
    offset_ms: AtomicI64,
    /// Database time minus this host's wall clock at the last sample (what operators watch).
    skew_ms: AtomicI64,
}

impl Default for DbClock {
    /// Until the first sample: this host's wall clock.
    fn default() -> Self {
        let origin = Instant::now();
        DbClock {
            origin,
            offset_ms: AtomicI64::new(dtx_sql::now_ms()),
            skew_ms: AtomicI64::new(0),
        }
    }
}

impl DbClock {
    /// Unix milliseconds on the database's clock.
    pub fn now_ms(&self) -> i64 {
        self.elapsed_ms(Instant::now()) + self.offset_ms.load(Ordering::Relaxed)
    }

    /// How far this host's wall clock is behind the database's (negative: ahead), as of the
    /// last sample.
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms.load(Ordering::Relaxed)
    }

    /// Records a sample: the database answered `db_ms` to a query sent at `sent` and answered
    /// at `received`; `wall_ms` is this host's wall clock at `received`. The database read its
    /// clock somewhere in between: the midpoint is off by at most half the round trip.
    pub fn record(&self, db_ms: i64, sent: Instant, received: Instant, wall_ms: i64) {
        let half_trip = (received.saturating_duration_since(sent) / 2).as_millis() as i64;
        let at = self.elapsed_ms(received) - half_trip;
        self.offset_ms.store(db_ms - at, Ordering::Relaxed);
        self.skew_ms
            .store(db_ms - (wall_ms - half_trip), Ordering::Relaxed);
    }

    fn elapsed_ms(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.origin).as_millis() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn follows_the_database_not_the_local_wall_clock() {
        let clock = DbClock::default();
        let wall = dtx_sql::now_ms();
        assert!((clock.now_ms() - wall).abs() < 1000);
        // The database is 30 s ahead of this host; the sample took 10 ms.
        let sent = Instant::now();
        let received = sent + Duration::from_millis(10);
        clock.record(wall + 30_000, sent, received, wall + 10);
        assert!(
            (clock.now_ms() - (wall + 30_000)).abs() < 1000,
            "{}",
            clock.now_ms() - wall
        );
        assert_eq!(clock.skew_ms(), 30_000 - 5);
        // 30 s behind.
        clock.record(wall - 30_000, sent, received, wall + 10);
        assert!((clock.now_ms() - (wall - 30_000)).abs() < 1000);
        assert!(clock.skew_ms() < -29_000);
    }
}
