//! TCC and saga semantics on top of the store.
//!
//! The instance that receives Commit, Rollback or SubmitSaga records the decision (one durable
//! write) and drives the work immediately ([`driver`]); recovery ([`recovery`]) only picks up
//! what is due: undecided TCC transactions past their deadline, and transactions whose driver's
//! lease expired (a crashed or partitioned coordinator) or whose slow retry is due.
//!
//! Transactions being driven here are also kept in memory ([`Active`]) so Get and Wait answer
//! from the driver's live view instead of polling the store.

mod driver;
mod metrics;
mod participants;
mod recovery;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dtx_proto::limits::{self, LimitError};
use dtx_proto::v1::SubmitSagaRequest;
use prost::Message;
use tokio::sync::watch;
use tracing::Instrument;

use crate::domain::backoff::RetryPolicy;
use crate::domain::graph::Graph;
use crate::domain::saga::SagaPlan;
use crate::domain::{BranchRow, BranchState, Decision, GlobalRow, Kind, TxRecord, TxStatus};
use crate::error::{Error, Result};
use crate::store::{
    BeginTcc, Created, Decide, Decided, Progress, Progressed, RegisterBranch, Registered, Store,
    SubmitSaga,
};

pub use driver::Ended;
pub use metrics::Metrics;
pub use participants::{CallOutcome, Participants};

use driver::{Job, Phase, StepRun};

/// Tuning of the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This instance's name in the store's `owner` column.
    pub instance: String,
    /// How long a claim lasts without renewal; a crashed instance's work is taken over after
    /// this.
    pub lease: Duration,
    /// How often recovery looks for due work.
    pub poll_interval: Duration,
    /// Most transactions claimed per poll.
    pub claim_batch: i64,
    /// A retry due later than this is handed back to the store instead of waiting in memory.
    pub handoff_after: Duration,
    /// Finished transactions are deleted this long after they finished (`None`: kept).
    pub retention: Option<Duration>,
    /// How often the database's clock is sampled again.
    pub clock_sync: Duration,
    /// A local wall clock further than this from the database's is logged at WARN (the
    /// engine runs on the database's time either way; a large offset means a host to fix).
    pub max_clock_skew: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            instance: format!(
                "coordinator-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            lease: Duration::from_secs(15),
            poll_interval: Duration::from_secs(1),
            claim_batch: 64,
            handoff_after: Duration::from_secs(30),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            clock_sync: Duration::from_secs(5),
            max_clock_skew: Duration::from_secs(1),
        }
    }
}

/// What the driver of a transaction currently knows, for Get and Wait.
#[derive(Debug, Clone)]
pub struct View {
    pub status: TxStatus,
    pub branches: Vec<BranchRow>,
    pub last_error: Option<String>,
    /// Set when the driver stopped (settled, handed off or lost ownership).
    pub ended: Option<Ended>,
}

/// A transaction driven by this instance.
pub struct Active {
    /// The transaction's row as the driver started with it (status and progress are in `view`).
    pub global: GlobalRow,
    pub view: watch::Sender<View>,
}

impl Active {
    /// The transaction as the driver sees it now, or `None` once the driver stopped without
    /// settling it (then the store is the truth).
    fn record(&self) -> Option<TxRecord> {
        let view = self.view.borrow();
        if view.ended.is_some() && !view.status.is_settled() {
            return None;
        }
        Some(TxRecord {
            global: GlobalRow {
                status: view.status,
                decision: view.status.implied_decision().or(self.global.decision),
                last_error: view
                    .last_error
                    .clone()
                    .or_else(|| self.global.last_error.clone()),
                ..self.global.clone()
            },
            branches: view.branches.clone(),
        })
    }
}

/// Shared state of the engine.
pub struct Inner {
    store: Arc<dyn Store>,
    participants: Arc<Participants>,
    config: EngineConfig,
    active: Mutex<HashMap<String, Arc<Active>>>,
    metrics: Metrics,
    shutdown: watch::Sender<bool>,
    drivers: AtomicU64,
    seq: AtomicU64,
}

impl Inner {
    /// Now on the database's clock: the one clock every instance compares leases, due times
    /// and deadlines on.
    fn now_ms(&self) -> i64 {
        self.store.clock().now_ms()
    }

    /// Exports the local clock's offset from the database's; with `warn`, logs it when it is
    /// beyond the bound. Returns whether it is.
    fn observe_clock(&self, warn: bool) -> bool {
        let skew = self.store.clock().skew_ms();
        self.metrics.clock_skew(skew);
        let out = skew.unsigned_abs() > self.config.max_clock_skew.as_millis() as u64;
        if out && warn {
            tracing::warn!(
                offset_ms = skew,
                bound_ms = self.config.max_clock_skew.as_millis() as u64,
                "this host's clock is {} ms {} the database's; leases, due times and deadlines \
                 use the database's time, but fix the host's clock (NTP)",
                skew.unsigned_abs(),
                if skew > 0 { "behind" } else { "ahead of" }
            );
        }
        out
    }
}

/// Samples the database's clock every `clock_sync`; repeats the skew warning at most once a
/// minute while it lasts.
async fn sync_clock(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.subscribe();
    let mut warned_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(inner.config.clock_sync) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = inner.store.sync_clock().await {
            tracing::warn!(error = %e, "could not read the database's clock; keeping the last sample");
            continue;
        }
        let quiet = warned_at.is_some_and(|at| at.elapsed() < Duration::from_secs(60));
        if inner.observe_clock(!quiet) && !quiet {
            warned_at = Some(tokio::time::Instant::now());
        }
    }
}

/// The coordinator's engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Identity and content of a branch to register.
#[derive(Debug, Clone)]
pub struct NewBranch {
    pub branch_id: String,
    pub target: String,
    pub handler: String,
    pub payload: Vec<u8>,
    pub headers: std::collections::BTreeMap<String, String>,
    pub call_timeout: Duration,
    /// Begin the transaction with this timeout if it does not exist yet (saves a round trip).
    pub begin_timeout: Option<Duration>,
}

impl Engine {
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Engine {
        let (shutdown, _) = watch::channel(false);
        Engine {
            inner: Arc::new(Inner {
                store,
                participants: Arc::new(Participants::default()),
                config,
                active: Mutex::new(HashMap::new()),
                metrics: Metrics::default(),
                shutdown,
                drivers: AtomicU64::new(0),
                seq: AtomicU64::new(0),
            }),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Starts recovery (immediately, then every poll interval) and retention, and keeps the
    /// database clock sampled.
    pub fn start_background(&self) {
        self.inner.observe_clock(true);
        tokio::spawn(recovery::run(self.clone()));
        tokio::spawn(sync_clock(self.inner.clone()));
    }

    /// Stops recovery, lets drivers finish their in-flight calls and hand their transactions
    /// back to the store (so another instance continues at once), waiting at most `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutdown.send_replace(true);
        let deadline = tokio::time::Instant::now() + grace;
        while self.inner.drivers.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn is_shutting_down(&self) -> bool {
        *self.inner.shutdown.borrow()
    }

    // ----------------------------------------------------------------------------- TCC

    /// Begins a TCC transaction; an identical repeat returns the existing one.
    pub async fn begin(&self, xid: Option<String>, timeout_ms: u64) -> Result<GlobalRow> {
        let xid = xid.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        limits::check_xid(&xid)?;
        let timeout = limits::timeout(
            "timeout_ms",
            timeout_ms,
            limits::DEFAULT_TX_TIMEOUT,
            limits::MAX_TX_TIMEOUT,
        )?;
        let now = self.inner.now_ms();
        let timeout_ms = timeout.as_millis() as i64;
        let deadline_ms = now + timeout_ms;
        let written = self
            .inner
            .store
            .begin_tcc(BeginTcc {
                xid: xid.clone(),
                timeout_ms,
                deadline_ms,
            })
            .await?;
        match written {
            Created::Inserted => {
                self.inner.metrics.started(Kind::Tcc);
                Ok(GlobalRow {
                    xid,
                    kind: Kind::Tcc,
                    status: TxStatus::Trying,
                    decision: None,
                    timeout_ms,
                    deadline_ms,
                    spec: None,
                    branch_count: 0,
                    owner: None,
                    fence: 0,
                    due_ms: Some(deadline_ms),
                    last_error: None,
                    created_ms: now,
                    updated_ms: now,
                })
            }
            Created::Exists(row) if row.kind == Kind::Tcc && row.timeout_ms == timeout_ms => {
                Ok(row)
            }
            Created::Exists(row) => Err(Error::Conflict(format!(
                "xid {xid:?} is already used by a {} transaction with timeout {} ms",
                row.kind, row.timeout_ms
            ))),
        }
    }

    /// Registers a branch before its Try is invoked.
    pub async fn register_branch(&self, xid: String, branch: NewBranch) -> Result<()> {
        limits::check_xid(&xid)?;
        let begin = branch.begin_timeout.map(|t| {
            let timeout_ms = t.as_millis() as i64;
            (timeout_ms, self.inner.now_ms() + timeout_ms)
        });
        limits::check_branch_id("branch_id", &branch.branch_id)?;
        limits::check_target("target", &branch.target)?;
        limits::check_handler("handler", &branch.handler)?;
        limits::check_payload("payload", &branch.payload)?;
        limits::check_headers("headers", &branch.headers)?;
        let seq = self.inner.now_ms() * 1024
            + (self.inner.seq.fetch_add(1, Ordering::Relaxed) % 1024) as i64;
        let row = BranchRow {
            branch_id: branch.branch_id,
            seq,
            target: branch.target,
            handler: branch.handler,
            payload: branch.payload,
            headers: branch.headers,
            call_timeout_ms: branch.call_timeout.as_millis() as i64,
            ..BranchRow::default()
        };
        let written = self
            .inner
            .store
            .register_branch(RegisterBranch {
                xid: xid.clone(),
                branch: row.clone(),
                max_branches: limits::MAX_BRANCHES as i64,
                begin,
            })
            .await?;
        match written {
            Registered::Added { begun } => {
                if begun {
                    self.inner.metrics.started(Kind::Tcc);
                }
                Ok(())
            }
            Registered::Missing => Err(Error::UnknownXid(xid)),
            Registered::Refused {
                existing: Some(b), ..
            } => {
                let same = b.target == row.target
                    && b.handler == row.handler
                    && b.payload == row.payload
                    && b.headers == row.headers
                    && b.call_timeout_ms == row.call_timeout_ms;
                if same {
                    Ok(())
                } else {
                    Err(Error::Conflict(format!(
                        "branch {:?} of {xid:?} is already registered with different content",
                        row.branch_id
                    )))
                }
            }
            Registered::Refused {
                global,
                existing: None,
            } => Err(if global.kind != Kind::Tcc {
                Error::WrongState(format!(
                    "xid {xid:?} is a saga; branches are registered for TCC transactions"
                ))
            } else if global.status != TxStatus::Trying {
                Error::WrongState(format!(
                    "transaction {xid:?} is already {}; no branch can be added after the decision",
                    global.status
                ))
            } else if global.deadline_ms <= self.inner.now_ms() {
                Error::WrongState(format!(
                    "transaction {xid:?} passed its deadline and is being rolled back"
                ))
            } else {
                Error::Invalid(LimitError(format!(
                    "transaction {xid:?} already has {} branches, the limit is {}",
                    global.branch_count,
                    limits::MAX_BRANCHES
                )))
            }),
        }
    }

    /// Records Commit or Rollback and drives phase two. With `wait`, returns once the
    /// transaction settled or the wait elapsed.
    pub async fn decide(
        &self,
        xid: String,
        decision: Decision,
        wait: Option<Duration>,
    ) -> Result<TxStatus> {
        limits::check_xid(&xid)?;
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let fence = crate::store::new_fence();
        let due_ms = self.inner.now_ms() + self.inner.config.lease.as_millis() as i64;
        let written = self
            .inner
            .store
            .decide(Decide {
                xid: xid.clone(),
                decision,
                owner: self.inner.config.instance.clone(),
                fence,
                due_ms,
            })
            .await?;
        let status = match written {
            Decided::Claimed { global, branches } => {
                let phase = Phase::Settle(decision);
                let record = TxRecord { global, branches };
                let job = self.job(&record, fence, phase)?;
                self.spawn(job, record.global);
                phase.status()
            }
            Decided::Missing => return Err(Error::UnknownXid(xid)),
            Decided::Exists(row) if row.kind != Kind::Tcc => {
                return Err(Error::WrongState(format!(
                    "xid {xid:?} is a saga; Commit/Rollback are for TCC transactions"
                )));
            }
            Decided::Exists(row) => match row.decision {
                Some(d) if d == decision => row.status,
                Some(other) => {
                    return Err(Error::Decided {
                        message: format!(
                            "transaction {xid:?} was already decided: {other} ({})",
                            row.status
                        ),
                        status: row.status,
                    });
                }
                // Still TRYING, so Commit came after the deadline: roll back now.
                None => {
                    let status =
                        Box::pin(self.decide(xid.clone(), Decision::Rollback, None)).await?;
                    return Err(Error::Decided {
                        message: format!(
                            "transaction {xid:?} passed its deadline before Commit and is rolled back"
                        ),
                        status,
                    });
                }
            },
        };
        match wait {
            Some(wait) => Ok(self.wait(&xid, wait).await?.global.status),
            None => Ok(status),
        }
    }

    // ----------------------------------------------------------------------------- Saga

    /// Validates and stores a saga in one write, then runs it. An identical repeat returns the
    /// existing saga.
    pub async fn submit_saga(&self, mut request: SubmitSagaRequest) -> Result<GlobalRow> {
        // How long the caller waits is not part of the definition.
        request.wait_timeout_ms = 0;
        if request.xid.is_empty() {
            request.xid = uuid::Uuid::new_v4().to_string();
        }
        limits::check_xid(&request.xid)?;
        let plan = SagaPlan::from_request(&request)?;
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        // Canonical form: the resolved timeout, so "0 (default)" and "60000" are the same saga.
        request.timeout_ms = plan.timeout.as_millis() as u64;
        let spec = request.encode_to_vec();
        let now = self.inner.now_ms();
        let fence = crate::store::new_fence();
        let global = GlobalRow {
            xid: request.xid.clone(),
            kind: Kind::Saga,
            status: TxStatus::Running,
            decision: None,
            timeout_ms: request.timeout_ms as i64,
            deadline_ms: now + request.timeout_ms as i64,
            spec: Some(spec),
            branch_count: request.steps.len() as i64,
            owner: Some(self.inner.config.instance.clone()),
            fence,
            due_ms: Some(now + self.inner.config.lease.as_millis() as i64),
            last_error: None,
            created_ms: now,
            updated_ms: now,
        };
        match self
            .inner
            .store
            .submit_saga(SubmitSaga {
                global: global.clone(),
            })
            .await?
        {
            Created::Inserted => {
                self.inner.metrics.started(Kind::Saga);
                let record = TxRecord {
                    global: global.clone(),
                    branches: Vec::new(),
                };
                let job = self.job(&record, fence, Phase::Forward)?;
                self.spawn(job, record.global);
                Ok(global)
            }
            Created::Exists(row) if row.kind == Kind::Saga && row.spec == global.spec => Ok(row),
            Created::Exists(row) => Err(Error::Conflict(format!(
                "xid {:?} is already used by a different {}",
                request.xid,
                if row.kind == Kind::Saga {
                    "saga definition"
                } else {
                    "TCC transaction"
                }
            ))),
        }
    }

    // ----------------------------------------------------------------------------- Reads

    /// The transaction as stored, overlaid with the live view of its driver if it runs here.
    pub async fn get(&self, xid: &str) -> Result<TxRecord> {
        limits::check_xid(xid)?;
        // While this instance drives it, its driver holds the lease: memory is the truth.
        if let Some(record) = self.active(xid).and_then(|a| a.record()) {
            return Ok(record);
        }
        self.inner
            .store
            .get(xid)
            .await?
            .ok_or_else(|| Error::UnknownXid(xid.to_string()))
    }

    /// Waits until the transaction is settled (terminal or parked) or `timeout` elapsed, and
    /// returns it as [`Engine::get`] does.
    pub async fn wait(&self, xid: &str, timeout: Duration) -> Result<TxRecord> {
        limits::check_xid(xid)?;
        let until = tokio::time::Instant::now() + timeout;
        let mut poll = Duration::from_millis(20);
        loop {
            // Driven here: wait for the driver's view, no store reads.
            if let Some(active) = self.active(xid) {
                let mut rx = active.view.subscribe();
                let settled = rx.wait_for(|v| v.status.is_settled() || v.ended.is_some());
                let _ = tokio::time::timeout_at(until, settled).await;
                if let Some(record) = active.record()
                    && (record.global.status.is_settled() || tokio::time::Instant::now() >= until)
                {
                    return Ok(record);
                }
            }
            // Driven elsewhere (or handed off): poll the store with backoff.
            let record = self.get(xid).await?;
            if record.global.status.is_settled() || tokio::time::Instant::now() >= until {
                return Ok(record);
            }
            if self.active(xid).is_none() {
                tokio::time::sleep_until(until.min(tokio::time::Instant::now() + poll)).await;
                poll = (poll * 2).min(Duration::from_millis(500));
            }
        }
    }

    /// Operator action: drives a parked transaction's decided phase again.
    pub async fn resume(&self, xid: &str) -> Result<TxRecord> {
        let record = self.get(xid).await?;
        let g = &record.global;
        if g.status != TxStatus::NeedsAttention {
            return Err(Error::WrongState(format!(
                "transaction {xid:?} is {}, not NEEDS_ATTENTION",
                g.status
            )));
        }
        let decision = g
            .decision
            .ok_or_else(|| Error::Corrupt(format!("parked transaction {xid:?} has no decision")))?;
        let phase = Phase::Settle(decision);
        let fence = crate::store::new_fence();
        let retry_from = if g.kind == Kind::Tcc {
            BranchState::Pending
        } else {
            BranchState::InDoubt
        };
        let branches: Vec<BranchRow> = record
            .branches
            .iter()
            .cloned()
            .map(|mut b| {
                if b.state == BranchState::Stuck {
                    b.state = retry_from;
                }
                b
            })
            .collect();
        let progress = Progress {
            xid: xid.to_string(),
            fence: g.fence,
            new_fence: Some(fence),
            from: TxStatus::NeedsAttention,
            to: phase.status(),
            decision: Some(decision),
            owner: Some(self.inner.config.instance.clone()),
            due_ms: Some(self.inner.now_ms() + self.inner.config.lease.as_millis() as i64),
            last_error: None,
            branches: branches.clone(),
        };
        match self.inner.store.progress(progress).await? {
            Progressed::Applied => {
                let resumed = TxRecord {
                    global: GlobalRow {
                        status: phase.status(),
                        fence,
                        ..g.clone()
                    },
                    branches,
                };
                self.spawn(self.job(&resumed, fence, phase)?, resumed.global);
                tracing::info!(%xid, "resumed by an operator");
                self.get(xid).await
            }
            Progressed::Fenced => Err(Error::WrongState(format!(
                "transaction {xid:?} changed while resuming; read it again"
            ))),
        }
    }

    // ----------------------------------------------------------------------------- Drivers

    fn active(&self, xid: &str) -> Option<Arc<Active>> {
        self.inner
            .active
            .lock()
            .expect("active lock")
            .get(xid)
            .cloned()
    }

    /// Builds the driver's job for a record in `phase`, holding `fence`.
    fn job(&self, record: &TxRecord, fence: i64, phase: Phase) -> Result<Job> {
        let g = &record.global;
        let (graph, steps) = match g.kind {
            Kind::Tcc => {
                let steps = record
                    .branches
                    .iter()
                    .map(|b| {
                        let policy = RetryPolicy {
                            call_timeout: if b.call_timeout_ms > 0 {
                                Duration::from_millis(b.call_timeout_ms as u64)
                            } else {
                                limits::DEFAULT_CALL_TIMEOUT
                            },
                            ..RetryPolicy::default()
                        };
                        StepRun::new(
                            b.clone(),
                            Vec::new(),
                            b.payload.clone(),
                            b.headers.clone(),
                            policy,
                        )
                    })
                    .collect::<Vec<_>>();
                (Graph::independent(steps.len()), steps)
            }
            Kind::Saga => {
                let spec = g
                    .spec
                    .as_deref()
                    .ok_or_else(|| Error::Corrupt(format!("saga {:?} has no definition", g.xid)))?;
                let request = SubmitSagaRequest::decode(spec)
                    .map_err(|e| Error::Corrupt(format!("saga {:?} definition: {e}", g.xid)))?;
                let plan = SagaPlan::from_request(&request)?;
                let recorded: HashMap<&str, &BranchRow> = record
                    .branches
                    .iter()
                    .map(|b| (b.branch_id.as_str(), b))
                    .collect();
                let steps = plan
                    .steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let row = recorded
                            .get(s.name.as_str())
                            .map(|r| (*r).clone())
                            .unwrap_or_else(|| BranchRow {
                                branch_id: s.name.clone(),
                                seq: i as i64,
                                target: s.target.clone(),
                                handler: s.handler.clone(),
                                ..BranchRow::default()
                            });
                        StepRun::new(
                            row,
                            s.action_payload.clone(),
                            s.compensate_payload.clone(),
                            s.headers.clone(),
                            s.retry,
                        )
                    })
                    .collect();
                (plan.graph, steps)
            }
        };
        Ok(Job {
            xid: g.xid.clone(),
            kind: g.kind,
            fence,
            phase,
            deadline_ms: (g.kind == Kind::Saga).then_some(g.deadline_ms),
            graph,
            steps,
        })
    }

    /// Runs a driver for `job` in the background, visible to Get/Wait while it runs.
    fn spawn(&self, job: Job, global: GlobalRow) {
        let xid = job.xid.clone();
        let active = Arc::new(Active {
            global,
            view: watch::channel(View {
                status: job.phase.status(),
                branches: Vec::new(),
                last_error: None,
                ended: None,
            })
            .0,
        });
        self.inner
            .active
            .lock()
            .expect("active lock")
            .insert(xid.clone(), active.clone());
        let inner = self.inner.clone();
        inner.drivers.fetch_add(1, Ordering::SeqCst);
        let span = tracing::info_span!("tx", xid = %xid, kind = %job.kind);
        tokio::spawn(
            async move {
                let ended = driver::drive(inner.clone(), job, active.clone()).await;
                tracing::debug!(?ended, "driver ended");
                active.view.send_modify(|v| v.ended = Some(ended));
                let mut map = inner.active.lock().expect("active lock");
                if map.get(&xid).is_some_and(|a| Arc::ptr_eq(a, &active)) {
                    map.remove(&xid);
                }
                drop(map);
                inner.drivers.fetch_sub(1, Ordering::SeqCst);
            }
            .instrument(span),
        );
    }
}
