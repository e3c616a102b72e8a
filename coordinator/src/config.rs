//! Configuration: command-line flags, each with an environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use crate::engine::EngineConfig;
use crate::store::StoreOptions;

/// The dtx coordinator: drives TCC transactions and sagas to a terminal state.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "coordinator", version)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(long, env = "DTX_LISTEN", default_value = "127.0.0.1:50070")]
    pub listen: SocketAddr,

    /// Store URL: sqlite://FILE (created with its schema on start), postgres://... or
    /// mysql://... (MySQL or MariaDB).
    #[arg(long, env = "DTX_STORE", default_value = "sqlite://dtx-coordinator.db")]
    pub store: String,

    /// This instance's name, recorded as the owner of the transactions it drives (default: a
    /// random name). Give every instance sharing a store a different one.
    #[arg(long, env = "DTX_INSTANCE")]
    pub instance: Option<String>,

    /// How long a claim on a transaction lasts without renewal; a crashed instance's work is
    /// taken over after this.
    #[arg(long, env = "DTX_LEASE_MS", default_value_t = 15_000)]
    pub lease_ms: u64,

    /// How often recovery looks for due work (deadlines, expired leases, slow retries).
    #[arg(long, env = "DTX_POLL_MS", default_value_t = 1_000)]
    pub poll_ms: u64,

    /// Retries due later than this are handed back to the store instead of waiting in memory.
    #[arg(long, env = "DTX_HANDOFF_MS", default_value_t = 30_000)]
    pub handoff_ms: u64,

    /// Finished transactions are deleted this many hours after they finished; 0 keeps them.
    #[arg(long, env = "DTX_RETENTION_HOURS", default_value_t = 168)]
    pub retention_hours: u64,

    /// Most state changes grouped into one database commit (1 = a commit per change).
    #[arg(long, env = "DTX_WRITE_BATCH", default_value_t = 128)]
    pub write_batch: usize,

    /// Concurrent store writer tasks.
    #[arg(long, env = "DTX_WRITERS", default_value_t = 2)]
    pub writers: usize,

    /// Connections in the store's pool.
    #[arg(long, env = "DTX_DB_CONNECTIONS", default_value_t = 16)]
    pub db_connections: u32,

    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9070).
    #[arg(long, env = "DTX_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Warn when this host's clock is further than this from the database's (leases, due
    /// times and deadlines always use the database's time).
    #[arg(long, env = "DTX_MAX_CLOCK_SKEW_MS", default_value_t = 1_000)]
    pub max_clock_skew_ms: u64,

    /// On SIGTERM/Ctrl-C, how long drivers may finish in-flight calls before exiting.
    #[arg(long, env = "DTX_SHUTDOWN_GRACE_MS", default_value_t = 5_000)]
    pub shutdown_grace_ms: u64,
}

impl Config {
    pub fn engine(&self) -> EngineConfig {
        let default = EngineConfig::default();
        EngineConfig {
            instance: self.instance.clone().unwrap_or(default.instance),
            lease: Duration::from_millis(self.lease_ms.max(100)),
            poll_interval: Duration::from_millis(self.poll_ms.max(10)),
            handoff_after: Duration::from_millis(self.handoff_ms),
            retention: (self.retention_hours > 0)
                .then(|| Duration::from_secs(self.retention_hours * 3600)),
            max_clock_skew: Duration::from_millis(self.max_clock_skew_ms),
            ..default
        }
    }

    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            max_batch: self.write_batch.max(1),
            writers: self.writers.max(1),
            max_connections: self.db_connections.max(2),
        }
    }
}
