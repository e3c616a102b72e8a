//! The chaos harness: several coordinator processes on one database, a bank participant keeping
//! a ledger through the barrier, a mix of TCC and saga transactions driven concurrently while
//! faults are injected - transient errors, lost responses, duplicated deliveries, Tries and
//! actions that arrive after their Cancel/compensation, and SIGKILLed coordinators restarted on
//! the same address. At the end every invariant is checked over every transaction (not sampled)
//! and a summary line is printed.
//!
//! Money only moves: a TCC transaction is `transfer` (hold at A) + `deposit` (credit B at
//! Confirm); a saga is `debit` A then `credit` B. So the sum of all balances never changes and no
//! money stays held once everything settled.
//!
//! The same seed replays the same workload and the same participant faults (drawn per call from
//! the seed and the call's identity) and the same kill schedule; what timing changes is which
//! calls happen to be in flight when a kill lands.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dtx_proto::v1::TxStatus;
use dtx_sdk::Error;
use dtx_sdk::client::{Coordinator, RetryPolicy, SagaStep, TccBranch, TccOptions};
use dtx_sql::{Schema, SqlRow};
use tokio::sync::{Mutex, Semaphore};
use tonic::transport::Server;

use crate::coordinator::Process;
use crate::db::{TestBackend, TestDb};
use crate::ledger;
use crate::net::serve;
use crate::participant::{Bank, FaultRates, Faults, payload};

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    pub seed: u64,
    /// Transactions to start (the run stops starting new ones after `duration`).
    pub transactions: usize,
    pub duration: Duration,
    /// Transactions in flight at once.
    pub concurrency: usize,
    pub coordinators: usize,
    /// Mean time between SIGKILLs of a random coordinator (`None`: no kills).
    pub kill_every: Option<Duration>,
    pub rates: FaultRates,
    /// How long every transaction may take to settle after the workload ended.
    pub settle_within: Duration,
    /// The coordinator binary.
    pub coordinator_bin: String,
    /// Accounts money moves between.
    pub accounts: usize,
}

impl ChaosConfig {
    /// The configuration CI runs (a couple of minutes at most).
    pub fn short(coordinator_bin: &str, seed: u64) -> ChaosConfig {
        ChaosConfig {
            seed,
            transactions: 400,
            duration: Duration::from_secs(60),
            concurrency: 24,
            coordinators: 3,
            kill_every: Some(Duration::from_millis(800)),
            rates: default_rates(),
            settle_within: Duration::from_secs(90),
            coordinator_bin: coordinator_bin.to_string(),
            accounts: 10,
        }
    }
}

/// The fault mix used unless told otherwise.
pub fn default_rates() -> FaultRates {
    FaultRates {
        handler_error: 0.04,
        unavailable_before: 0.04,
        lost_response: 0.04,
        duplicate: 0.04,
        late_forward: 0.02,
        late_by: Duration::from_millis(1500),
        refuse_forward: 0.03,
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub tcc: usize,
    pub saga: usize,
    pub coordinators: usize,
    pub kills: u64,
    pub faults: u64,
    pub outcomes: BTreeMap<String, usize>,
    pub anomalies: Vec<String>,
}

impl ChaosReport {
    /// The one-line summary every run prints.
    pub fn summary(&self) -> String {
        format!(
            "chaos: {} tx ({} tcc, {} saga), {} coordinators, {} kills, {} faults, {} anomalies (seed {}; {})",
            self.tcc + self.saga,
            self.tcc,
            self.saga,
            self.coordinators,
            self.kills,
            self.faults,
            self.anomalies.len(),
            self.seed,
            self.outcomes
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[derive(Debug, Clone)]
struct Planned {
    xid: String,
    saga: bool,
    from: String,
    to: String,
    amount: i64,
    coordinator: usize,
    /// TCC: roll back on purpose instead of committing.
    rollback: bool,
}

fn plan(cfg: &ChaosConfig, i: usize) -> Planned {
    let u = |what: &str| crate::seeded_unit(cfg.seed, format!("plan/{i}/{what}").as_bytes());
    let account = |x: f64| format!("acct{}", (x * cfg.accounts as f64) as usize);
    let from = account(u("from"));
    let mut to = account(u("to"));
    if to == from {
        to = format!(
            "acct{}",
            (from[4..].parse::<usize>().unwrap() + 1) % cfg.accounts
        );
    }
    Planned {
        xid: format!("chaos-{}-{i}", cfg.seed),
        saga: u("kind") < 0.5,
        from,
        to,
        amount: 1 + (u("amount") * 100.0) as i64,
        coordinator: i % cfg.coordinators,
        rollback: u("rollback") < 0.1,
    }
}

/// Runs one transaction through coordinator `client`; errors are expected under chaos and
/// only logged - the checks look at what happened, not at what the client was told.
async fn run_one(client: &Coordinator, bank: &str, p: &Planned) {
    let outcome: Result<(), Error> = if p.saga {
        let retry = RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            call_timeout: Duration::from_secs(1),
        };
        let submitted = client
            .saga()
            .xid(&p.xid)
            .timeout(Duration::from_secs(8))
            .retry(retry)
            .step(SagaStep::new("s1", bank, "debit").payload(payload(&p.from, p.amount)))
            .step(SagaStep::new("s2", bank, "credit").payload(payload(&p.to, p.amount)))
            .submit()
            .await;
        match submitted {
            Ok(handle) => handle
                .await_outcome(Duration::from_secs(30))
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        }
    } else {
        let options = TccOptions {
            xid: Some(p.xid.clone()),
            timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(1),
            wait_phase_two: None,
            ..TccOptions::default()
        };
        let rollback = p.rollback;
        client
            .tcc(options, |tx| async move {
                tx.call(TccBranch::new(bank, "transfer", payload(&p.from, p.amount)))
                    .await?;
                tx.call(TccBranch::new(bank, "deposit", payload(&p.to, p.amount)))
                    .await?;
                if rollback {
                    return Err(Error::Barrier("rolled back on purpose".into()));
                }
                Ok(())
            })
            .await
    };
    if let Err(e) = outcome {
        tracing::debug!(xid = %p.xid, error = %e, "client saw an error");
    }
}

/// Counts per (xid, branch, kind) of the ledger's effect log.
async fn effect_counts<DB: TestBackend>(db: &TestDb<DB>) -> HashMap<(String, String, String), i64> {
    db.rows("SELECT xid, branch_id, kind, COUNT(*) FROM effects GROUP BY xid, branch_id, kind")
        .await
        .iter()
        .map(|r| {
            (
                (r.text(0).unwrap(), r.text(1).unwrap(), r.text(2).unwrap()),
                r.i64(3).unwrap(),
            )
        })
        .collect()
}

/// Barrier rows: (xid, branch, action) -> (written_by, outcome).
async fn barrier_rows<DB: TestBackend>(
    db: &TestDb<DB>,
) -> HashMap<(String, String, String), (String, String)> {
    db.rows("SELECT xid, branch_id, action, written_by, outcome FROM dtx_barrier")
        .await
        .iter()
        .map(|r| {
            (
                (r.text(0).unwrap(), r.text(1).unwrap(), r.text(2).unwrap()),
                (r.text(3).unwrap(), r.text(4).unwrap()),
            )
        })
        .collect()
}

/// Transactions the store still has owned or due: (xid, status, owner, due_ms).
async fn unsettled_rows<DB: TestBackend>(db: &TestDb<DB>) -> Vec<String> {
    db.rows("SELECT xid, status, owner, due_ms FROM dtx_global WHERE owner IS NOT NULL OR due_ms IS NOT NULL")
        .await.iter()
        .map(|r| {
            format!(
                "{} status {} owner {:?} due {:?}",
                r.text(0).unwrap(),
                r.text(1).unwrap(),
                r.opt_text(2).unwrap(),
                r.opt_i64(3).unwrap()
            )
        })
        .collect()
}

async fn ledger_totals<DB: TestBackend>(db: &TestDb<DB>) -> (i64, i64) {
    db.rows("SELECT balance, held FROM accounts")
        .await
        .iter()
        .fold((0, 0), |(b, h), r| {
            (b + r.i64(0).unwrap(), h + r.i64(1).unwrap())
        })
}

/// Runs the harness on a fresh coordinator database and a fresh bank database of kind `DB`.
pub async fn run<DB: TestBackend>(cfg: ChaosConfig) -> Option<ChaosReport>
where
    DB::Conn: 'static,
{
    const START_BALANCE: i64 = 1_000_000;
    let store = TestDb::<DB>::create(&[Schema::Coordinator]).await?;
    let bank_db: &'static TestDb<DB> =
        Box::leak(Box::new(TestDb::<DB>::create(&[Schema::Barrier]).await?));
    ledger::create_tables(&bank_db.pool).await;
    for a in 0..cfg.accounts {
        ledger::open_account(&bank_db.pool, &format!("acct{a}"), START_BALANCE).await;
    }
    let faults = Faults::random(cfg.seed, cfg.rates);
    let bank_server = serve(
        Server::builder()
            .add_service(Bank::new(bank_db.pool.clone(), faults.clone()).into_service()),
    )
    .await;
    let bank = bank_server.url();

    let mut processes = Vec::new();
    for i in 0..cfg.coordinators {
        let name = format!("chaos-{i}");
        processes.push(Some(
            Process::start(&cfg.coordinator_bin, &store.url, &["--instance", &name]).await,
        ));
    }
    let addrs: Vec<_> = processes.iter().map(|p| p.as_ref().unwrap().addr).collect();
    let mut clients = Vec::new();
    for p in &processes {
        clients.push(p.as_ref().unwrap().client().await);
    }
    let processes = Arc::new(Mutex::new(processes));

    // The killer: SIGKILL a random coordinator, restart it on the same address.
    let kills = Arc::new(AtomicU64::new(0));
    let (stop_killing, mut killing_stopped) = tokio::sync::watch::channel(false);
    let killer = cfg.kill_every.map(|every| {
        let (processes, kills, cfg, store_url) = (
            processes.clone(),
            kills.clone(),
            cfg.clone(),
            store.url.clone(),
        );
        tokio::spawn(async move {
            for k in 0u64.. {
                let u = |what: &str| {
                    crate::seeded_unit(cfg.seed, format!("kill/{k}/{what}").as_bytes())
                };
                let wait = every.mul_f64(0.5 + u("wait"));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = killing_stopped.changed() => return,
                }
                let victim = (u("victim") * cfg.coordinators as f64) as usize;
                let mut procs = processes.lock().await;
                if let Some(p) = procs[victim].take() {
                    p.kill().await;
                    kills.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(victim, "killed a coordinator");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let name = format!("chaos-{victim}");
                    procs[victim] = Some(
                        Process::start_on(
                            &cfg.coordinator_bin,
                            &store_url,
                            addrs[victim],
                            &["--instance", &name],
                        )
                        .await,
                    );
                }
            }
        })
    });

    // The workload.
    let slots = Arc::new(Semaphore::new(cfg.concurrency));
    let started_at = tokio::time::Instant::now();
    let mut planned = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..cfg.transactions {
        if started_at.elapsed() >= cfg.duration {
            break;
        }
        let permit = slots.clone().acquire_owned().await.unwrap();
        let p = plan(&cfg, i);
        planned.push(p.clone());
        let (client, bank) = (clients[p.coordinator].clone(), bank.clone());
        tasks.push(tokio::spawn(async move {
            run_one(&client, &bank, &p).await;
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.ok();
    }
    stop_killing.send_replace(true);
    if let Some(k) = killer {
        k.await.ok();
    }

    // Settle: every transaction must reach a terminal status within the bound.
    let mut report = ChaosReport {
        seed: cfg.seed,
        coordinators: cfg.coordinators,
        ..ChaosReport::default()
    };
    let observer = clients[0].clone();
    let settle_until = tokio::time::Instant::now() + cfg.settle_within;
    let mut statuses = HashMap::new();
    for p in &planned {
        if p.saga {
            report.saga += 1;
        } else {
            report.tcc += 1;
        }
        let left = settle_until.saturating_duration_since(tokio::time::Instant::now());
        let (status, registered) = match observer
            .wait(&p.xid, left.max(Duration::from_millis(10)))
            .await
        {
            Ok(tx) => (
                tx.status(),
                tx.branches
                    .into_iter()
                    .map(|b| b.branch_id)
                    .collect::<Vec<_>>(),
            ),
            Err(Error::Rpc(s)) if s.code() == tonic::Code::NotFound => {
                (TxStatus::Unspecified, Vec::new())
            }
            Err(e) => {
                report
                    .anomalies
                    .push(format!("{}: could not read its status: {e}", p.xid));
                continue;
            }
        };
        *report
            .outcomes
            .entry(if status == TxStatus::Unspecified {
                "never begun".into()
            } else {
                status
                    .as_str_name()
                    .trim_start_matches("TX_STATUS_")
                    .to_lowercase()
            })
            .or_default() += 1;
        statuses.insert(p.xid.clone(), (status, registered));
    }
    // Late deliveries still in the network land before the ledger is checked.
    tokio::time::sleep(cfg.rates.late_by + Duration::from_millis(500)).await;

    let effects = effect_counts(bank_db).await;
    let barrier = barrier_rows(bank_db).await;
    let count = |xid: &str, branch: &str, kind: &str| {
        effects
            .get(&(xid.to_string(), branch.to_string(), kind.to_string()))
            .copied()
            .unwrap_or(0)
    };
    let row = |xid: &str, branch: &str, action: &str| {
        barrier.get(&(xid.to_string(), branch.to_string(), action.to_string()))
    };
    for p in &planned {
        let Some((status, registered)) = statuses.get(&p.xid) else {
            continue;
        };
        let status = *status;
        let mut broke = Vec::new();
        let branches: [&str; 2] = if p.saga { ["s1", "s2"] } else { ["b1", "b2"] };
        for b in branches {
            let (t, c, x) = if p.saga {
                (
                    count(&p.xid, b, "action"),
                    0,
                    count(&p.xid, b, "compensate"),
                )
            } else {
                (
                    count(&p.xid, b, "try"),
                    count(&p.xid, b, "confirm"),
                    count(&p.xid, b, "cancel"),
                )
            };
            match status {
                TxStatus::Committed => {
                    if (t, c, x) != (1, 1, 0) {
                        broke.push(format!(
                            "{b}: committed but try/confirm/cancel effects {t}/{c}/{x}"
                        ));
                    }
                    if row(&p.xid, b, "cancel").is_some() || row(&p.xid, b, "confirm").is_none() {
                        broke.push(format!(
                            "{b}: committed but the barrier has cancel={:?} confirm={:?}",
                            row(&p.xid, b, "cancel"),
                            row(&p.xid, b, "confirm")
                        ));
                    }
                }
                TxStatus::RolledBack => {
                    if c != 0 || x != t {
                        broke.push(format!(
                            "{b}: rolled back but try/confirm/cancel effects {t}/{c}/{x}"
                        ));
                    }
                    // Every registered branch got its Cancel (an unregistered one never a Try).
                    let cancelled =
                        row(&p.xid, b, "cancel").is_some() || !registered.iter().any(|r| r == b);
                    if row(&p.xid, b, "confirm").is_some() || !cancelled {
                        broke.push(format!(
                            "{b}: rolled back but the barrier has confirm={:?} cancel={:?}",
                            row(&p.xid, b, "confirm"),
                            row(&p.xid, b, "cancel")
                        ));
                    }
                }
                TxStatus::Succeeded => {
                    if (t, x) != (1, 0) {
                        broke.push(format!(
                            "{b}: succeeded but action/compensate effects {t}/{x}"
                        ));
                    }
                    if row(&p.xid, b, "compensate").is_some() {
                        broke.push(format!("{b}: succeeded but the barrier has a compensation"));
                    }
                }
                TxStatus::Compensated => {
                    if x != t {
                        broke.push(format!(
                            "{b}: compensated but action/compensate effects {t}/{x}"
                        ));
                    }
                    let ran = row(&p.xid, b, "action")
                        .is_some_and(|(w, o)| w == "action" && o == "success");
                    if ran && row(&p.xid, b, "compensate").is_none() {
                        broke.push(format!(
                            "{b}: its action took effect but no compensation is recorded"
                        ));
                    }
                }
                TxStatus::Unspecified => {
                    if t + c + x != 0 {
                        broke.push(format!("{b}: never begun but effects {t}/{c}/{x}"));
                    }
                }
                other => broke.push(format!("not settled within the bound: {other:?}")),
            }
        }
        if !broke.is_empty() {
            let history: Vec<String> = faults
                .call_log()
                .into_iter()
                .filter(|c| c.xid == p.xid)
                .map(|c| {
                    format!(
                        "{} {} -> {:?}",
                        c.branch,
                        c.action,
                        c.answer.map(|a| (a.outcome(), a.detail()))
                    )
                })
                .collect();
            report.anomalies.push(format!(
                "{} ({}, {:?}): {}\n    history: {}",
                p.xid,
                if p.saga { "saga" } else { "tcc" },
                status,
                broke.join("; "),
                history.join(" | ")
            ));
        }
    }
    let (balance, held) = ledger_totals(bank_db).await;
    let expected = START_BALANCE * cfg.accounts as i64;
    if (balance, held) != (expected, 0) {
        report.anomalies.push(format!(
            "ledger: balances sum to {balance} (expected {expected}), {held} still held"
        ));
    }
    for row in unsettled_rows(&store).await {
        report.anomalies.push(format!(
            "store row still owned or due after settling: {row}"
        ));
    }
    report.kills = kills.load(Ordering::Relaxed);
    report.faults = faults.injected();

    let mut procs = processes.lock().await;
    for p in procs.iter_mut().filter_map(Option::take) {
        p.kill().await;
    }
    bank_server.stop().await;
    store.drop_database().await;
    bank_db.drop_database().await;
    Some(report)
}
