//! The memory figure: the coordinator's peak resident memory while N transactions are in
//! flight, every one of them waiting on a participant that holds its answer.

use std::time::{Duration, Instant};

use dtx_proto::v1::TxStatus;
use dtx_sdk::client::{Coordinator, RetryPolicy, SagaStep, TccOptions};
use serde::Serialize;

use crate::Error;
use crate::coordinator::CoordinatorProcess;
use crate::participants::{Gate, HOLD, NOOP};
use crate::workload;

#[derive(Debug, Clone, Serialize)]
pub struct MemoryFigure {
    pub kind: &'static str,
    pub target_in_flight: usize,
    /// Transactions whose calls the participant held when the peak was read.
    pub in_flight: u64,
    pub idle_rss_mib: f64,
    pub peak_rss_mib: f64,
    /// Transactions that did not end as expected after the gate opened.
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Long enough for every held call to be answered: a held call must not time out and be
/// retried while the figure is taken.
const HOLD_TIMEOUT: Duration = Duration::from_secs(300);

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Waits until `count` calls are held (or progress stops for 10 s); returns how many are.
async fn until_held(gate: &Gate, count: usize) -> u64 {
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let held = gate.held();
        if held >= count as u64 || since.elapsed() > Duration::from_secs(10) {
            return held;
        }
        if held != last {
            (last, since) = (held, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One transaction of a memory test, run to its outcome: `Err` says what went wrong.
pub type Transaction = tokio::task::JoinHandle<Result<(), String>>;

/// Starts `count` transactions with `start`, reads the coordinator's peak memory once the
/// participant holds `held_per_tx` calls of each, then lets them finish.
pub async fn measure(
    kind: &'static str,
    coordinator: &CoordinatorProcess,
    gate: &Gate,
    count: usize,
    held_per_tx: usize,
    start: impl Fn() -> Transaction,
) -> Result<MemoryFigure, Error> {
    gate.close();
    let idle = coordinator.rss_kib()?;
    coordinator.reset_peak()?;
    let transactions: Vec<Transaction> = (0..count).map(|_| start()).collect();
    let in_flight = until_held(gate, held_per_tx * count).await / held_per_tx as u64;
    let peak = coordinator.peak_rss_kib()?;
    gate.open();
    let (mut errors, mut first_error) = (0, None);
    for transaction in transactions {
        match transaction.await {
            Ok(Ok(())) => {}
            other => {
                errors += 1;
                first_error.get_or_insert(format!("{other:?}"));
            }
        }
    }
    Ok(MemoryFigure {
        kind,
        target_in_flight: count,
        in_flight,
        idle_rss_mib: mib(idle),
        peak_rss_mib: mib(peak),
        errors,
        first_error,
    })
}

/// A saga whose first action the participant holds, run to its outcome.
pub fn saga(client: &Coordinator, noop: &str) -> impl Fn() -> Transaction {
    let policy = RetryPolicy {
        call_timeout: HOLD_TIMEOUT,
        ..RetryPolicy::default()
    };
    move || {
        let saga = client
            .saga()
            .timeout(HOLD_TIMEOUT * 2)
            .retry(policy)
            .step(SagaStep::new("s1", noop, HOLD))
            .step(SagaStep::new("s2", noop, NOOP));
        tokio::spawn(async move {
            let handle = saga.submit().await.map_err(|e| format!("submit: {e}"))?;
            match handle.await_outcome(HOLD_TIMEOUT).await {
                Ok(outcome) if outcome.succeeded() => Ok(()),
                other => Err(format!("outcome: {other:?}")),
            }
        })
    }
}

/// A committed two-branch TCC transaction whose Confirms the participant holds (the client
/// waits for phase two).
pub fn tcc(client: &Coordinator, noop: &str, wait: bool) -> impl Fn() -> Transaction {
    let options = TccOptions {
        call_timeout: HOLD_TIMEOUT,
        timeout: HOLD_TIMEOUT * 2,
        ..workload::tcc_options()
    };
    // Without waiting, Commit returns once the decision is durable: the coordinator holds the
    // transactions, not the clients' calls.
    let options = TccOptions {
        wait_phase_two: options.wait_phase_two.filter(|_| wait),
        ..options
    };
    move || {
        let (client, noop, options) = (client.clone(), noop.to_string(), options.clone());
        tokio::spawn(async move {
            let tx = client.begin(options).await.map_err(|e| e.to_string())?;
            workload::try_two(&tx, &noop, HOLD).await?;
            if wait {
                return workload::decide(&tx, true)
                    .await
                    .map_err(|e| format!("decide: {e}"));
            }
            // Decided and durable; the Confirms are still held.
            match tx.commit().await.map_err(|e| format!("commit: {e}"))? {
                TxStatus::Committing | TxStatus::Committed => Ok(()),
                other => Err(format!("{} ended {}", tx.xid(), other.as_str_name())),
            }
        })
    }
}
