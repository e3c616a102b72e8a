//! The global transactions the bench measures, each run to its terminal outcome.

use std::time::Duration;

use dtx_proto::v1::TxStatus;
use std::sync::Arc;

use dtx_sdk::Backend;
use dtx_sdk::client::{
    Coordinator, MessageBranch, MessageBuilder, SagaStep, TccBranch, TccOptions, TccTransaction,
};
use dtx_sdk::sql::sqlx::Pool;
use futures::future::BoxFuture;

use crate::participants::{CHECK_BACK, FAIL, NOOP, ROWS_SAGA, ROWS_TCC};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// TCC, 2 branches (Try, Try), commit; waits until both Confirms are delivered.
    TccCommit,
    /// TCC, 2 branches, rollback; waits until both Cancels are delivered.
    TccRollback,
    /// Saga, 2 sequential steps, both succeed.
    Saga,
    /// Saga, 2 steps, the second refuses: the first is compensated.
    SagaCompensate,
    /// TCC commit where each branch writes 2 business rows through the barrier.
    TccRows,
    /// Saga where each step writes 2 business rows through the barrier.
    SagaRows,
    /// Two-phase message: prepare, a local transaction on the business database that writes
    /// the message's barrier row, submit, then wait until its 2 sequential deliveries (to the
    /// no-op participant) are done.
    Message,
}

/// Where the participants are.
#[derive(Clone)]
pub struct Targets {
    pub noop: String,
    pub rows: String,
    /// Runs a message's local transaction on the business database (whose rows participant
    /// answers its check-backs).
    pub local: Arc<dyn LocalTransactions>,
}

/// The initiator's side of a message on the business database, whatever its kind.
pub trait LocalTransactions: Send + Sync {
    /// `do_and_submit` of `message` with an empty business change.
    fn do_and_submit(&self, message: MessageBuilder) -> BoxFuture<'_, Result<(), String>>;
}

/// [`LocalTransactions`] on a pool of `DB`.
pub struct LocalPool<DB: Backend>(pub Pool<DB>);

impl<DB: Backend> LocalTransactions for LocalPool<DB> {
    fn do_and_submit(&self, message: MessageBuilder) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            message
                .do_and_submit(&self.0, |_conn: &mut DB::Conn| {
                    Box::pin(async { Ok::<_, dtx_sdk::Error>(()) })
                })
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }
}

const TIMEOUT: Duration = Duration::from_secs(60);

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::TccCommit,
        Workload::TccRollback,
        Workload::Saga,
        Workload::SagaCompensate,
        Workload::TccRows,
        Workload::SagaRows,
        Workload::Message,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::TccCommit => "tcc-commit",
            Workload::TccRollback => "tcc-rollback",
            Workload::Saga => "saga",
            Workload::SagaCompensate => "saga-compensate",
            Workload::TccRows => "tcc-rows",
            Workload::SagaRows => "saga-rows",
            Workload::Message => "message",
        }
    }

    /// Durable commits a client must wait for one after another (none can overlap another):
    /// the floor of its latency at one client, in units of one raw commit.
    /// TCC: the first RegisterBranch (which also begins), the second RegisterBranch, the
    /// decision; the rows variant adds each Try's local commit and the Confirms' (concurrent:
    /// one). Saga: the definition; compensation adds the durable turn to compensating; the rows
    /// variant adds each step's local commit.
    pub fn sequential_commits(self) -> u32 {
        match self {
            Workload::TccCommit | Workload::TccRollback => 3,
            Workload::TccRows => 6,
            Workload::Saga => 1,
            Workload::SagaCompensate => 2,
            Workload::SagaRows => 3,
            // PrepareMessage, the local commit, SubmitMessage.
            Workload::Message => 3,
        }
    }

    /// Unary gRPC calls one transaction makes (client -> coordinator and coordinator ->
    /// participant alike). TCC: 2 RegisterBranch (the first also begins), 2 Try, the decision
    /// (which waits for phase two), 2 Confirms or Cancels. Saga: SubmitSaga (which waits for
    /// the outcome) and one call per action or compensation.
    pub fn grpc_calls(self) -> u32 {
        match self {
            Workload::TccCommit | Workload::TccRollback | Workload::TccRows => 7,
            Workload::Saga | Workload::SagaRows => 3,
            Workload::SagaCompensate => 4,
            // PrepareMessage, SubmitMessage, Wait, two deliveries.
            Workload::Message => 5,
        }
    }

    /// Local commits the participants make per transaction (each barrier call of the rows
    /// participant is one; the no-op participant writes nothing).
    pub fn participant_commits(self) -> u32 {
        match self {
            Workload::TccRows => 4,
            Workload::SagaRows => 2,
            Workload::Message => 1,
            _ => 0,
        }
    }

    /// Runs one global transaction to its terminal outcome; `Err` says what went wrong.
    pub async fn run_one(self, coordinator: &Coordinator, targets: &Targets) -> Result<(), String> {
        match self {
            Workload::TccCommit => tcc(coordinator, &targets.noop, NOOP, true).await,
            Workload::TccRollback => tcc(coordinator, &targets.noop, NOOP, false).await,
            Workload::TccRows => tcc(coordinator, &targets.rows, ROWS_TCC, true).await,
            Workload::Saga => saga(coordinator, &targets.noop, [NOOP, NOOP], true).await,
            Workload::SagaCompensate => saga(coordinator, &targets.noop, [NOOP, FAIL], false).await,
            Workload::SagaRows => {
                saga(coordinator, &targets.rows, [ROWS_SAGA, ROWS_SAGA], true).await
            }
            Workload::Message => message(coordinator, targets).await,
        }
    }
}

/// The TCC options of every bench transaction: wait for phase two, like a caller that needs
/// the effects visible before it answers.
pub fn tcc_options() -> TccOptions {
    TccOptions {
        timeout: TIMEOUT,
        wait_phase_two: Some(TIMEOUT),
        ..TccOptions::default()
    }
}

/// Latency of Commit alone - from the Commit call until every Confirm was delivered - over
/// `n` sequential two-branch TCC transactions.
pub async fn commit_to_confirmed(
    c: &Coordinator,
    target: &str,
    n: usize,
) -> Result<crate::stats::Latency, String> {
    let mut micros = Vec::with_capacity(n);
    for _ in 0..n {
        let tx = c.begin(tcc_options()).await.map_err(|e| e.to_string())?;
        try_two(&tx, target, NOOP).await?;
        let started = std::time::Instant::now();
        decide(&tx, true).await?;
        micros.push(started.elapsed().as_micros() as u32);
    }
    Ok(crate::stats::latency(&mut micros))
}

/// Two Try calls, then the decision.
async fn tcc(c: &Coordinator, target: &str, handler: &str, commit: bool) -> Result<(), String> {
    let tx = c.begin(tcc_options()).await.map_err(|e| e.to_string())?;
    try_two(&tx, target, handler).await?;
    decide(&tx, commit).await
}

pub async fn try_two(tx: &TccTransaction, target: &str, handler: &str) -> Result<(), String> {
    for _ in 0..2 {
        tx.call(TccBranch::new(target, handler, b"bench".to_vec()))
            .await
            .map_err(|e| format!("try: {e}"))?;
    }
    Ok(())
}

pub async fn decide(tx: &TccTransaction, commit: bool) -> Result<(), String> {
    let (status, expected) = if commit {
        (tx.commit().await, TxStatus::Committed)
    } else {
        (tx.rollback().await, TxStatus::RolledBack)
    };
    match status.map_err(|e| e.to_string())? {
        s if s == expected => Ok(()),
        s => Err(format!("{} ended {}", tx.xid(), s.as_str_name())),
    }
}

async fn saga(
    c: &Coordinator,
    target: &str,
    handlers: [&str; 2],
    succeeds: bool,
) -> Result<(), String> {
    let outcome = c
        .saga()
        .timeout(TIMEOUT)
        .step(SagaStep::new("s1", target, handlers[0]).payload(b"bench".to_vec()))
        .step(SagaStep::new("s2", target, handlers[1]).payload(b"bench".to_vec()))
        .run(TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let expected = if succeeds {
        TxStatus::Succeeded
    } else {
        TxStatus::Compensated
    };
    if outcome.status() == expected {
        Ok(())
    } else {
        Err(format!(
            "{} ended {}",
            outcome.0.xid,
            outcome.status().as_str_name()
        ))
    }
}

/// A message delivered to the no-op participant twice (sequentially, like the saga's steps),
/// its check-backs answered by the rows participant on the business database.
async fn message(c: &Coordinator, targets: &Targets) -> Result<(), String> {
    let xid = uuid::Uuid::new_v4().to_string();
    let message = c
        .message(&targets.rows, CHECK_BACK)
        .xid(&xid)
        .branch(MessageBranch::new("m1", &targets.noop, NOOP).payload(b"bench".to_vec()))
        .branch(
            MessageBranch::new("m2", &targets.noop, NOOP)
                .payload(b"bench".to_vec())
                .after(["m1"]),
        );
    targets.local.do_and_submit(message).await?;
    let done = c.wait(&xid, TIMEOUT).await.map_err(|e| e.to_string())?;
    match done.status() {
        TxStatus::Committed => Ok(()),
        s => Err(format!("{xid} ended {}", s.as_str_name())),
    }
}
