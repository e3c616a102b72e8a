//! Pure arithmetic over measured samples: percentiles and ratios.

use serde::Serialize;

/// End-to-end latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Percentiles of `micros` (sorted in place); all zero for no samples. Nearest-rank method:
/// the p-th percentile is the smallest sample with at least p% of the samples at or below it.
pub fn latency(micros: &mut [u32]) -> Latency {
    if micros.is_empty() {
        return Latency::default();
    }
    micros.sort_unstable();
    let rank = |p: f64| {
        let n = micros.len();
        let idx = ((p / 100.0) * n as f64).ceil() as usize;
        micros[idx.clamp(1, n) - 1] as f64 / 1000.0
    };
    let sum: u64 = micros.iter().map(|&m| m as u64).sum();
    Latency {
        p50_ms: rank(50.0),
        p95_ms: rank(95.0),
        p99_ms: rank(99.0),
        max_ms: *micros.last().unwrap() as f64 / 1000.0,
        mean_ms: sum as f64 / micros.len() as f64 / 1000.0,
    }
}

/// `part / whole`, 0 when `whole` is 0 (nothing measured is not infinitely good).
pub fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<u32> = (1..=100).rev().map(|ms| ms * 1000).collect();
        let l = latency(&mut samples);
        assert_eq!(
            (l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms),
            (50.0, 95.0, 99.0, 100.0)
        );
        assert_eq!(l.mean_ms, 50.5);
    }

    #[test]
    fn one_sample_is_every_percentile() {
        let l = latency(&mut [2500]);
        assert_eq!((l.p50_ms, l.p99_ms, l.max_ms), (2.5, 2.5, 2.5));
    }

    #[test]
    fn no_samples_no_numbers() {
        assert_eq!(latency(&mut []), Latency::default());
        assert_eq!(ratio(5.0, 0.0), 0.0);
        assert_eq!(ratio(1.0, 4.0), 0.25);
    }
}
