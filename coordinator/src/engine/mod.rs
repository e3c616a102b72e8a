//! TCC and saga semantics on top of the store.
//!
//! The instance that receives Commit, Rollback or SubmitSaga records the decision (one durable
//! write) and drives the work immediately (`driver`); recovery (`recovery`) only picks up
//! what is due: undecided TCC transactions past their deadline, and transactions whose driver's
//! lease expired (a crashed or partitioned coordinator) or whose slow retry is due.
//!
//! Transactions being driven here are also kept in memory ([`Active`]) so Get and Wait answer
//! from the driver's live view instead of polling the store.

mod alerts;
mod driver;
mod http_client;
mod jobs;
mod message;
mod metrics;
mod operator;
mod participants;
mod reads;
mod recovery;
mod saga;
mod tcc;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::domain::allow::Allowlist;
use crate::domain::history::{Entry, Event};
use crate::domain::{BranchRow, GlobalRow, TxRecord, TxStatus, Xid};
use crate::store::Store;

pub use crate::domain::job::CallOutcome;
pub use alerts::AlertConfig;
pub use driver::Ended;
pub use metrics::{METRIC_NAMES, Metrics};
pub use operator::{Acted, Described, Operator};
pub use participants::{Batching, Participants};
pub use tcc::NewBranch;

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
    /// A prepared message is checked back this long after PrepareMessage unless it sets its
    /// own delay.
    pub check_back_after: Duration,
    /// Finished transactions are deleted this long after they finished (`None`: kept).
    pub retention: Option<Duration>,
    /// How often the database's clock is sampled again.
    pub clock_sync: Duration,
    /// A local wall clock further than this from the database's is logged at WARN (the
    /// engine runs on the database's time either way; a large offset means a host to fix).
    pub max_clock_skew: Duration,
    /// Alert webhooks; `None`: no alerts are raised or stored.
    pub alerts: Option<AlertConfig>,
    /// Most handler names labelled apart in the call metrics (the rest share one label).
    pub max_handler_labels: usize,
    /// Trust roots and client certificate for `https://` participants; `None`: such targets
    /// are not called (no roots to verify them with).
    pub participant_tls: Option<dtx_proto::tls::ClientTls>,
    /// The branch targets (and webhooks) the coordinator may call (default: loopback only).
    pub allow: Arc<Allowlist>,
    /// How second-phase calls due at once to one participant are sent together.
    pub batching: Batching,
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
            check_back_after: Duration::from_secs(10),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            clock_sync: Duration::from_secs(5),
            max_clock_skew: Duration::from_secs(1),
            alerts: None,
            max_handler_labels: metrics::DEFAULT_MAX_HANDLER_LABELS,
            participant_tls: None,
            allow: Arc::default(),
            batching: Batching::default(),
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

/// An operator's RetryNow for a driver: the history entry and where the count goes.
pub type Nudge = Box<(Entry, oneshot::Sender<usize>)>;

/// A transaction driven by this instance.
pub struct Active {
    /// The transaction's row as the driver started with it (status and progress are in `view`).
    pub global: GlobalRow,
    pub view: watch::Sender<View>,
    /// Operator's RetryNow: the driver retries every step in backoff, records the entry if
    /// there was one, and answers how many it retried. Boxed: a channel allocates room for 32
    /// messages up front, and every transaction in flight has one (3.9 KB each unboxed).
    pub nudge: mpsc::UnboundedSender<Nudge>,
}

impl Active {
    /// The transaction as the driver sees it now, or `None` once the driver stopped without
    /// settling it (then the store is the truth).
    fn record(&self) -> Option<TxRecord> {
        let view = self.view.borrow();
        if view.ended.is_some() && !view.status.is_settled() {
            return None;
        }
        // Settled means released: nobody drives it and recovery has nothing due.
        let (owner, due_ms) = match view.status.is_settled() {
            true => (None, None),
            false => (self.global.owner.clone(), self.global.due_ms),
        };
        Some(TxRecord {
            global: GlobalRow {
                owner,
                due_ms,
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
    /// Where every decision and step is recorded; the only state that survives a crash.
    store: Arc<dyn Store>,
    /// Clients of the participants (one channel per target), with the allowlist and the
    /// call signer.
    participants: Arc<Participants>,
    config: EngineConfig,
    /// Transactions this instance drives now, by xid: their live view answers Get and Wait
    /// ahead of the store's group-committed rows.
    active: Mutex<HashMap<Xid, Arc<Active>>>,
    metrics: Metrics,
    /// Set once at shutdown: drivers stop starting calls and hand their transactions back.
    shutdown: watch::Sender<bool>,
    /// Drivers running now; shutdown waits for it to reach zero (within the grace).
    drivers: AtomicU64,
    /// A counter mixed into branch sequence numbers so that two registered in one
    /// millisecond keep their order.
    seq: AtomicU64,
    /// Wakes recovery before its next poll (a retry made due now).
    wake_recovery: Notify,
    /// Wakes the alert sender before its next poll (an alert was stored).
    wake_alerts: Notify,
}

impl Inner {
    /// Now on the database's clock: the one clock every instance compares leases, due times
    /// and deadlines on.
    fn now_ms(&self) -> i64 {
        self.store.clock().now_ms()
    }

    /// The history entry of a decision by this instance.
    fn decided(&self, status: TxStatus, why: &str) -> Entry {
        Entry::tx(self.now_ms(), Event::Decided, Some(status))
            .detail(why)
            .by(self.config.instance.as_str())
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

/// Folds the metrics' histogram samples into their buckets every few seconds, so memory stays
/// bounded between scrapes.
async fn metrics_upkeep(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => inner.metrics.upkeep(),
            _ = shutdown.changed() => return,
        }
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

impl Engine {
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Engine {
        let (shutdown, _) = watch::channel(false);
        Engine {
            inner: Arc::new(Inner {
                store,
                participants: Arc::new(Participants::new(
                    config.participant_tls.clone(),
                    config.allow.clone(),
                    config.batching,
                )),
                metrics: Metrics::new(config.max_handler_labels),
                config,
                active: Mutex::new(HashMap::new()),
                shutdown,
                drivers: AtomicU64::new(0),
                seq: AtomicU64::new(0),
                wake_recovery: Notify::new(),
                wake_alerts: Notify::new(),
            }),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// New TLS material for `https://` participants (reloaded files): later calls use it.
    pub fn set_participant_tls(&self, tls: Option<dtx_proto::tls::ClientTls>) {
        self.inner.participants.set_tls(tls);
    }

    /// The key branch calls are signed with (set before the engine starts; a reload replaces
    /// it).
    pub fn set_call_signer(&self, signer: Option<dtx_proto::auth::CallSigner>) {
        self.inner.participants.set_signer(signer);
    }

    /// A token for the initiator's own Try of a registered branch (it hands it to the
    /// participant, which then knows the coordinator allowed that Try); `None` when calls are
    /// not signed.
    pub fn sign_try(
        &self,
        target: &str,
        call: dtx_proto::auth::Call<'_>,
    ) -> std::result::Result<Option<String>, String> {
        self.inner.participants.sign(target, call)
    }

    /// Refuses (PERMISSION_DENIED, naming the rules) a branch target `--allow-target` does
    /// not allow, before anything is stored.
    pub fn check_target(&self, target: &str) -> crate::error::Result<()> {
        self.inner
            .config
            .allow
            .check_url(target)
            .map(drop)
            .map_err(crate::Error::Forbidden)
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The Prometheus text of `/metrics`, with the gauges read from the store now.
    pub async fn render_metrics(&self) -> String {
        let store = &self.inner.store;
        let (commits, writes) = store.stats().snapshot();
        let errors = store.stats().failed_writes();
        let now_ms = self.inner.now_ms();
        let oldest = store.oldest_open_created_ms().await;
        if oldest.is_err() {
            self.inner.metrics.store_error("oldest_open");
        }
        self.inner.metrics.render(metrics::Snapshot {
            store_commits: commits,
            store_writes: writes,
            store_errors: &errors,
            parked: store.count_parked().await.ok(),
            oldest_open_ms: oldest.ok().map(|o| o.map_or(0, |created| now_ms - created)),
            drivers: self.inner.drivers.load(Ordering::Relaxed),
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Starts recovery (immediately, then every poll interval) and retention, keeps the
    /// database clock sampled, and sends alerts if webhooks are configured.
    pub fn start_background(&self) {
        self.inner.observe_clock(true);
        tokio::spawn(recovery::run(self.clone()));
        tokio::spawn(sync_clock(self.inner.clone()));
        tokio::spawn(metrics_upkeep(self.inner.clone()));
        if let Some(alerts) = self.inner.config.alerts.clone() {
            tokio::spawn(alerts::run(self.clone(), alerts));
        }
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
}
