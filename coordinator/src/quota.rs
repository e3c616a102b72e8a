//! Quotas per tenant: how many transactions a tenant may begin per second, how many payload
//! bytes it may send per minute and how many transactions it may have in flight, so one caller
//! cannot take the coordinator (and its store) from the others. Checked before anything is
//! stored; over a limit the call is RESOURCE_EXHAUSTED naming the limit, with the wait in
//! `retry-after` metadata (the `Retry-After` header over HTTP/JSON).
//!
//! The rates are token buckets (GCRA, the `governor` crate) keyed by tenant, this instance's:
//! with N instances behind a balancer a tenant gets up to N times the rate. Transactions in
//! flight are counted in the store (every instance's), at most once a second per tenant.

use dtx_proto::reason::Reason;
use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use tonic::Status;

/// The metadata key (and HTTP header) carrying how long to wait, in whole seconds.
pub const RETRY_AFTER: &str = "retry-after";

/// The quotas' names (the metric's `quota` label).
pub const QUOTA_NAMES: [&str; 3] = [BEGINS, PAYLOAD, IN_FLIGHT];
const BEGINS: &str = "begins_per_second";
const PAYLOAD: &str = "payload_bytes_per_minute";
const IN_FLIGHT: &str = "transactions_in_flight";

/// How long a tenant's count of transactions in flight is used before it is read again.
const IN_FLIGHT_FRESH: Duration = Duration::from_secs(1);

/// The configured limits (0 = unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub begins_per_second: u32,
    pub payload_bytes_per_minute: u32,
    pub transactions_in_flight: u32,
}

/// The buckets of every tenant.
pub struct Quotas {
    begins: Option<(DefaultKeyedRateLimiter<String>, u32)>,
    payload: Option<(DefaultKeyedRateLimiter<String>, u32)>,
    in_flight: Option<InFlight>,
    clock: DefaultClock,
}

/// Each tenant's transactions in flight as last read from the store, plus this instance's
/// begins since: a burst within the second is bounded too.
struct InFlight {
    limit: u32,
    counts: Mutex<HashMap<String, (Instant, u64)>>,
}

/// A refusal: the quota's name (a metric label) and the status to answer.
pub struct Exceeded {
    pub quota: &'static str,
    pub status: Status,
}

impl Quotas {
    pub fn new(limits: Limits) -> Quotas {
        let bucket = |n: u32, quota: fn(NonZeroU32) -> Quota| {
            NonZeroU32::new(n).map(|n| (DefaultKeyedRateLimiter::keyed(quota(n)), n.get()))
        };
        Quotas {
            begins: bucket(limits.begins_per_second, Quota::per_second),
            payload: bucket(limits.payload_bytes_per_minute, Quota::per_minute),
            in_flight: (limits.transactions_in_flight > 0).then(|| InFlight {
                limit: limits.transactions_in_flight,
                counts: Mutex::new(HashMap::new()),
            }),
            clock: DefaultClock::default(),
        }
    }

    /// Refuses a begin of `tenant` while it has its limit of transactions in flight. `count`
    /// reads how many it has from the store, asked to count no further than the number given;
    /// a store that cannot be read lets the begin through (the begin then meets the store).
    pub async fn in_flight<F, Fut, E>(&self, tenant: &str, count: F) -> Result<(), Exceeded>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<u64, E>>,
        E: std::fmt::Display,
    {
        let Some(in_flight) = &self.in_flight else {
            return Ok(());
        };
        let limit = u64::from(in_flight.limit);
        let fresh = {
            let counts = in_flight.counts.lock().unwrap_or_else(|e| e.into_inner());
            counts
                .get(tenant)
                .filter(|(read, _)| read.elapsed() < IN_FLIGHT_FRESH)
                .map(|(_, n)| *n)
        };
        let n = match fresh {
            Some(n) => n,
            None => {
                let n = match count(limit + 1).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(tenant, error = %e, "transactions in flight not counted");
                        return Ok(());
                    }
                };
                let mut counts = in_flight.counts.lock().unwrap_or_else(|e| e.into_inner());
                if counts.len() > 10_000 {
                    counts.retain(|_, (read, _)| read.elapsed() < IN_FLIGHT_FRESH);
                }
                counts.insert(tenant.to_string(), (Instant::now(), n));
                n
            }
        };
        if n >= limit {
            return Err(exceeded(
                IN_FLIGHT,
                format!(
                    "tenant {tenant:?} has {n} transactions in flight, its limit is {limit} \
                     (--quota-transactions-in-flight)"
                ),
                IN_FLIGHT_FRESH,
            ));
        }
        let mut counts = in_flight.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = counts.get_mut(tenant) {
            *n += 1;
        }
        Ok(())
    }

    /// Takes one transaction begin from `tenant`'s bucket.
    pub fn begin(&self, tenant: &str) -> Result<(), Exceeded> {
        let Some((limiter, per_second)) = &self.begins else {
            return Ok(());
        };
        limiter.check_key(&tenant.to_string()).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            exceeded(
                BEGINS,
                format!(
                    "tenant {tenant:?} began more than {per_second} transactions per second \
                     (--quota-begins-per-second)"
                ),
                wait,
            )
        })
    }

    /// Takes `bytes` of payload from `tenant`'s bucket.
    pub fn payload(&self, tenant: &str, bytes: usize) -> Result<(), Exceeded> {
        let Some((limiter, per_minute)) = &self.payload else {
            return Ok(());
        };
        let Some(n) = NonZeroU32::new(u32::try_from(bytes).unwrap_or(u32::MAX)) else {
            return Ok(());
        };
        let message = || {
            format!(
                "tenant {tenant:?} sent more than {per_minute} payload bytes per minute \
                 (--quota-payload-bytes-per-minute)"
            )
        };
        match limiter.check_key_n(&tenant.to_string(), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(exceeded(
                PAYLOAD,
                message(),
                not_until.wait_time_from(self.clock.now()),
            )),
            // More than a whole minute's allowance at once: waiting does not help.
            Err(_) => Err(exceeded(
                PAYLOAD,
                format!("{}: this request alone carries {bytes} bytes", message()),
                Duration::from_secs(60),
            )),
        }
    }
}

fn exceeded(quota: &'static str, message: String, wait: Duration) -> Exceeded {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut status = Reason::QuotaExceeded.status(format!("{message}; retry in {seconds} s"));
    if let Ok(value) = seconds.max(1).to_string().parse() {
        status.metadata_mut().insert(RETRY_AFTER, value);
    }
    Exceeded { quota, status }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_own_bucket() {
        let quotas = Quotas::new(Limits {
            begins_per_second: 2,
            payload_bytes_per_minute: 1000,
            transactions_in_flight: 0,
        });
        assert!(quotas.begin("acme").is_ok());
        assert!(quotas.begin("acme").is_ok());
        let refused = quotas
            .begin("acme")
            .expect_err("a third begin in the second");
        assert_eq!(refused.quota, BEGINS);
        assert_eq!(refused.status.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .status
                .message()
                .contains("--quota-begins-per-second")
        );
        assert_eq!(refused.status.metadata().get(RETRY_AFTER).unwrap(), "1");
        assert!(
            quotas.begin("globex").is_ok(),
            "another tenant is not charged"
        );

        assert!(quotas.payload("acme", 900).is_ok());
        let refused = quotas
            .payload("acme", 200)
            .expect_err("over the minute's bytes");
        assert!(
            refused
                .status
                .message()
                .contains("1000 payload bytes per minute")
        );
        let too_big = quotas
            .payload("globex", 5000)
            .expect_err("larger than a minute");
        assert!(
            too_big
                .status
                .message()
                .contains("alone carries 5000 bytes")
        );
        assert!(Quotas::new(Limits::default()).begin("acme").is_ok());
    }

    #[tokio::test]
    async fn in_flight_counts_the_store_then_the_begins_since() {
        let quotas = Quotas::new(Limits {
            transactions_in_flight: 3,
            ..Limits::default()
        });
        let reads = std::sync::atomic::AtomicU64::new(0);
        let store = |n: u64| {
            let reads = &reads;
            move |up_to: u64| async move {
                assert_eq!(up_to, 4, "counts no further than the limit + 1");
                reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, String>(n)
            }
        };
        // One in flight in the store; two begins fit, the third is over.
        assert!(quotas.in_flight("acme", store(1)).await.is_ok());
        assert!(quotas.in_flight("acme", store(1)).await.is_ok());
        let refused = quotas
            .in_flight("acme", store(1))
            .await
            .expect_err("the limit");
        assert_eq!(refused.quota, IN_FLIGHT);
        assert!(
            refused
                .status
                .message()
                .contains("has 3 transactions in flight, its limit is 3")
        );
        assert_eq!(refused.status.metadata().get(RETRY_AFTER).unwrap(), "1");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Another tenant is counted on its own; an unreadable store lets the begin through.
        assert!(quotas.in_flight("globex", store(0)).await.is_ok());
        let broken = |_: u64| async { Err::<u64, _>("store down") };
        assert!(quotas.in_flight("initech", broken).await.is_ok());
        // Unlimited: the store is never asked.
        let never = |_: u64| async { panic!("asked") as Result<u64, String> };
        assert!(
            Quotas::new(Limits::default())
                .in_flight("acme", never)
                .await
                .is_ok()
        );
    }
}
