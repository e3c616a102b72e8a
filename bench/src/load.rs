//! The closed-loop load generator: `clients` tasks, each starting its next operation as soon as
//! the previous one finished, for a warm-up and then a measured window.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::{self, Latency};

/// What one measured window produced.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Operations that succeeded and finished inside the window.
    pub completed: u64,
    /// Operations that succeeded from the start of the warm-up until the last client
    /// stopped (what counters read before and after the run divide by).
    pub total_ok: u64,
    /// Operations that failed (error or unexpected outcome) inside the window.
    pub errors: u64,
    pub seconds: f64,
    pub latency: Latency,
    /// The first error seen, to tell a broken run from a slow one.
    pub first_error: Option<String>,
}

impl Measured {
    pub fn per_second(&self) -> f64 {
        stats::ratio(self.completed as f64, self.seconds)
    }
}

/// Runs `op` in a closed loop from `clients` tasks: `warmup` unmeasured, then `window`
/// measured. `op()` returns `Err(reason)` for a failed operation.
pub async fn closed_loop<F, Fut>(
    clients: usize,
    warmup: Duration,
    window: Duration,
    op: F,
) -> Measured
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now() + warmup;
    let end = start + window;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let (mut errors, mut first_error, mut ok) = (0u64, None, 0u64);
                loop {
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let result = op().await;
                    ok += u64::from(result.is_ok());
                    let finished = Instant::now();
                    if began < start || finished > end {
                        continue;
                    }
                    match result {
                        Ok(()) => samples.push((finished - began).as_micros() as u32),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                }
                (samples, errors, first_error, ok)
            })
        })
        .collect();
    let mut samples = Vec::new();
    let (mut errors, mut first_error, mut total_ok) = (0, None, 0);
    for task in tasks {
        let (s, e, f, ok) = task.await.expect("load client panicked");
        total_ok += ok;
        samples.extend(s);
        errors += e;
        if first_error.is_none() {
            first_error = f;
        }
    }
    Measured {
        completed: samples.len() as u64,
        total_ok,
        errors,
        seconds: window.as_secs_f64(),
        latency: stats::latency(&mut samples),
        first_error,
    }
}
