//! Quotas per tenant: how many transactions a tenant may begin per second and how many payload
//! bytes it may send per minute, so one caller cannot take the coordinator (and its store) from
//! the others. Token buckets (GCRA, the `governor` crate) keyed by tenant, checked before
//! anything is stored; over a limit the call is RESOURCE_EXHAUSTED naming the limit, with the
//! wait in `retry-after` metadata (the `Retry-After` header over HTTP/JSON). The buckets are
//! this instance's: with N instances behind a balancer a tenant gets up to N times the rate.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use tonic::Status;

/// The metadata key (and HTTP header) carrying how long to wait, in whole seconds.
pub const RETRY_AFTER: &str = "retry-after";

/// The quotas' names (the metric's `quota` label).
pub const QUOTA_NAMES: [&str; 2] = [BEGINS, PAYLOAD];
const BEGINS: &str = "begins_per_second";
const PAYLOAD: &str = "payload_bytes_per_minute";

/// The configured limits (0 = unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub begins_per_second: u32,
    pub payload_bytes_per_minute: u32,
}

/// The buckets of every tenant.
pub struct Quotas {
    begins: Option<(DefaultKeyedRateLimiter<String>, u32)>,
    payload: Option<(DefaultKeyedRateLimiter<String>, u32)>,
    clock: DefaultClock,
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
            clock: DefaultClock::default(),
        }
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
    let mut status = Status::resource_exhausted(format!("{message}; retry in {seconds} s"));
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
}
