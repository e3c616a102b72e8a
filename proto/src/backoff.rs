//! Capped exponential backoff: the one formula behind every wait between attempts in dtx (the
//! coordinator's branch calls and alert deliveries, its listeners' pause after a failed accept
//! and Wait's polling of the store, the SDK's Try and coordinator retries, the participant
//! server's and the idempotency records' lock-conflict reruns and waits).

use std::time::Duration;

/// Steps of `initial * 2^n`, capped at `max`, of which a share may be random.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first step.
    pub initial: Duration,
    /// No step is longer.
    pub max: Duration,
    /// The random share of each step, 0 to 1: 0 waits exactly the step; 0.5 ("equal jitter")
    /// waits between half the step and the step, so many retrying callers spread out but
    /// never spin.
    pub jitter: f64,
}

impl Backoff {
    /// Without jitter.
    pub const fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            jitter: 0.0,
        }
    }

    /// With `share` of each step random.
    pub const fn jitter(mut self, share: f64) -> Backoff {
        self.jitter = share;
        self
    }

    /// The wait after `failures` failed attempts (0 before the first retry): the step
    /// `initial * 2^failures` capped at `max`, less its random share, plus `unit` (uniform in
    /// [0, 1)) of that share.
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let step = self
            .initial
            .saturating_mul(1u32 << failures.min(30))
            .min(self.max);
        let share = step.mul_f64(self.jitter.clamp(0.0, 1.0));
        step - share + share.mul_f64(unit.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_double_up_to_the_cap() {
        let b = Backoff::new(10 * MS, 250 * MS);
        let steps: Vec<_> = (0..7).map(|n| b.delay(n, 0.7)).collect();
        assert_eq!(
            steps,
            [10, 20, 40, 80, 160, 250, 250].map(|ms| ms * MS).to_vec()
        );
        assert_eq!(b.delay(u32::MAX, 0.0), 250 * MS, "no overflow");
    }

    #[test]
    fn the_random_share_stays_within_its_part_of_the_step() {
        let b = Backoff::new(100 * MS, 1000 * MS).jitter(0.5);
        assert_eq!(b.delay(0, 0.0), 50 * MS);
        assert_eq!(b.delay(0, 1.0), 100 * MS);
        assert_eq!(b.delay(2, 0.0), 200 * MS);
        for unit in [0.0, 0.3, 0.999] {
            let d = b.delay(40, unit);
            assert!((500 * MS..=1000 * MS).contains(&d), "{d:?}");
        }
        let quarter = Backoff::new(1000 * MS, 60_000 * MS).jitter(0.25);
        assert_eq!(quarter.delay(20, 1.0), 60_000 * MS);
        assert_eq!(quarter.delay(20, 0.0), 45_000 * MS);
    }
}
