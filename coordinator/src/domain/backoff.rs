//! Capped exponential backoff with jitter.

use std::time::Duration;

/// How a call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts before giving up (saga actions only; Confirm/Cancel/compensations never give
    /// up).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Timeout of one participant call.
    pub call_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            call_timeout: dtx_proto::limits::DEFAULT_CALL_TIMEOUT,
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` (attempt counts from 1): the exponential step
    /// `initial * 2^(attempt-1)` capped at `max_backoff`, of which a random half is jitter
    /// ("equal jitter": never zero, so retries of many transactions spread out but never spin).
    /// `unit` is a uniform random number in [0, 1).
    pub fn backoff(&self, attempt: u32, unit: f64) -> Duration {
        dtx_proto::backoff::Backoff::new(self.initial_backoff, self.max_backoff)
            .jitter(0.5)
            .delay(attempt.saturating_sub(1), unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps_and_keeps_half_as_floor() {
        let p = RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            call_timeout: Duration::from_secs(1),
        };
        assert_eq!(p.backoff(1, 0.0), Duration::from_millis(50));
        assert_eq!(p.backoff(1, 1.0), Duration::from_millis(100));
        assert_eq!(p.backoff(3, 0.0), Duration::from_millis(200));
        assert_eq!(
            p.backoff(10, 0.999).max(Duration::from_millis(1000)),
            Duration::from_millis(1000)
        );
        assert!(p.backoff(60, 0.5) <= Duration::from_millis(1000));
        assert!(p.backoff(60, 0.0) >= Duration::from_millis(500));
    }
}
