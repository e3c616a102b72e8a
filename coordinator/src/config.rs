//! Configuration: command-line flags, each with an environment variable. Defaults come from
//! [`EngineConfig::default`] and [`StoreOptions::default`] (one source), and the README's
//! options table is generated from these flags and checked by a test.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dtx_proto::duration::Human;

use crate::domain::alert::AlertRules;
use crate::engine::{AlertConfig, Batching, EngineConfig};
use crate::store::StoreOptions;

/// The dtx coordinator: drives TCC transactions and sagas to a terminal state.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "coordinator", version)]
pub struct Config {
    /// Address the gRPC server listens on (gRPC health and reflection v1/v1alpha included).
    #[arg(long, env = "DTX_LISTEN", default_value = "127.0.0.1:50070")]
    pub listen: SocketAddr,

    /// Store URL: sqlite://FILE (created with its schema on start; one coordinator per file,
    /// a second is refused), postgres://... or mysql://... (MySQL or MariaDB; several
    /// instances may share one).
    #[arg(long, env = "DTX_STORE", default_value = "sqlite://dtx-coordinator.db")]
    pub store: String,

    /// This instance's name, recorded as the owner of the transactions it drives (default: a
    /// random name). Give every instance sharing a store a different one.
    #[arg(long, env = "DTX_INSTANCE")]
    pub instance: Option<String>,

    /// How long a claim on a transaction lasts without renewal (at least 100ms); a crashed
    /// instance's work is taken over after this.
    #[arg(long, env = "DTX_LEASE", default_value_t = Human(EngineConfig::default().lease))]
    pub lease: Human,

    /// How often recovery looks for due work (deadlines, expired leases, slow retries; at least
    /// 10ms).
    #[arg(long, env = "DTX_POLL", default_value_t = Human(EngineConfig::default().poll_interval))]
    pub poll: Human,

    /// Retries due later than this are handed back to the store instead of waiting in memory.
    #[arg(long, env = "DTX_HANDOFF", default_value_t = Human(EngineConfig::default().handoff_after))]
    pub handoff: Human,

    /// How long after PrepareMessage a message neither submitted nor aborted is checked back
    /// (its initiator's service asked whether the local transaction committed), unless the
    /// message sets its own.
    #[arg(long, env = "DTX_CHECK_BACK_AFTER", default_value_t = Human(EngineConfig::default().check_back_after))]
    pub check_back_after: Human,

    /// Finished transactions are deleted this long after they finished; `0s` keeps them.
    #[arg(long, env = "DTX_RETENTION", default_value_t = Human(EngineConfig::default().retention.unwrap_or_default()))]
    pub retention: Human,

    /// Most state changes grouped into one database commit (1 = a commit per change).
    #[arg(long, env = "DTX_WRITE_BATCH", default_value_t = StoreOptions::default().max_batch)]
    pub write_batch: usize,

    /// Concurrent store writer tasks.
    #[arg(long, env = "DTX_WRITERS", default_value_t = StoreOptions::default().writers)]
    pub writers: usize,

    /// Connections in the store's pool.
    #[arg(long, env = "DTX_DB_CONNECTIONS", default_value_t = StoreOptions::default().max_connections)]
    pub db_connections: u32,

    /// Serve the Coordinator and Admin RPCs as JSON over HTTP on this address (e.g.
    /// 127.0.0.1:8080): `POST /dtx.v1.Coordinator/Begin` and so on. Off by default.
    #[arg(long, env = "DTX_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,

    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9070).
    #[arg(long, env = "DTX_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Serve the web console (needs-attention queue, transaction list and history, operator
    /// actions) over HTTP on this address (e.g. 127.0.0.1:8070). With auth on, a token signs
    /// in (a session cookie) and the roles decide what it shows and allows.
    #[arg(long, env = "DTX_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,

    /// Warn when this host's clock is further than this from the database's (leases, due
    /// times and deadlines always use the database's time).
    #[arg(long, env = "DTX_MAX_CLOCK_SKEW", default_value_t = Human(EngineConfig::default().max_clock_skew))]
    pub max_clock_skew: Human,

    /// POST a signed JSON event here when a transaction parks, stays open too long or a branch
    /// keeps failing (repeatable; comma-separated in the environment). Off when none is given.
    #[arg(
        long = "alert-webhook",
        env = "DTX_ALERT_WEBHOOK",
        value_delimiter = ','
    )]
    pub alert_webhooks: Vec<String>,

    /// Key of the events' HMAC-SHA256 `dtx-signature` header (prefer the environment: flags
    /// show in process listings). Without it events are sent unsigned.
    #[arg(long, env = "DTX_ALERT_SECRET", hide_env_values = true)]
    pub alert_secret: Option<String>,

    /// A transaction not terminal this long after it began raises a stuck alert (`30s`, `10m`,
    /// `2h`; parked transactions have their own alert).
    #[arg(long, env = "DTX_ALERT_STUCK_AFTER", default_value = "10m")]
    pub alert_stuck_after: Human,

    /// A branch failing or giving no answer more often than this raises an alert (once per
    /// branch).
    #[arg(long, env = "DTX_ALERT_ATTEMPTS", default_value_t = 5)]
    pub alert_attempts: u32,

    /// Longest wait between two delivery attempts of an alert to a webhook that does not
    /// acknowledge it (the wait doubles from 1 s up to this).
    #[arg(long, env = "DTX_ALERT_RETRY_MAX", default_value = "1m")]
    pub alert_retry_max: Human,

    /// How long one webhook call may take before it counts as failed.
    #[arg(long, env = "DTX_ALERT_TIMEOUT", default_value = "10s")]
    pub alert_timeout: Human,

    /// The web console's address as people reach it, for the link in each alert (default:
    /// http:// and `--admin-listen`, if given).
    #[arg(long, env = "DTX_ALERT_CONSOLE_URL")]
    pub alert_console_url: Option<String>,

    /// Export spans (one per branch attempt, in the transaction's W3C trace) to this
    /// OpenTelemetry collector over gRPC (e.g. http://127.0.0.1:4317). Off by default.
    #[arg(long, env = "DTX_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Most handler names given a label of their own in the branch call metrics; calls to
    /// further handlers are counted under `handler="_other"` (keeps the series bounded).
    #[arg(long, env = "DTX_METRICS_MAX_HANDLERS", default_value_t = EngineConfig::default().max_handler_labels)]
    pub metrics_max_handlers: usize,

    /// Most second-phase calls (Confirm, Cancel, saga action and compensation) due at once to
    /// one gRPC participant that are sent together as one `BranchBatch` call (1: every call
    /// alone). A participant without `BranchBatch` gets single calls.
    #[arg(long, env = "DTX_BRANCH_BATCH", default_value_t = Batching::default().max_items as u64,
          value_parser = clap::value_parser!(u64).range(1..=dtx_proto::limits::MAX_BATCH_ITEMS as u64))]
    pub branch_batch: u64,

    /// Calls or batches in flight to one gRPC participant at a time; calls that come due while
    /// all are out leave together with the next.
    #[arg(long, env = "DTX_BRANCH_BATCH_IN_FLIGHT", default_value_t = Batching::default().in_flight as u64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub branch_batch_in_flight: u64,

    /// Longest a due call waits for one of those to come back; then it leaves anyway (a
    /// participant holding its answers delays the others by at most this).
    #[arg(long, env = "DTX_BRANCH_BATCH_WAIT", default_value_t = Human(Batching::default().max_wait))]
    pub branch_batch_wait: Human,

    /// Serve every listener over TLS with this certificate chain (PEM, leaf first); with
    /// `--tls-key`. Re-read on SIGHUP and when the file changes.
    #[arg(long, env = "DTX_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of `--tls-cert` (PEM).
    #[arg(long, env = "DTX_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require a client certificate chained to this CA (PEM) on the gRPC and HTTP/JSON
    /// listeners (mTLS); needs `--tls-cert`.
    #[arg(long, env = "DTX_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Trust these CAs (PEM) for `https://` branch targets (gRPC with ALPN h2, and HTTP/JSON).
    /// Without it (or `--participant-system-roots`) an `https://` target is not called.
    #[arg(long, env = "DTX_PARTICIPANT_CA")]
    pub participant_ca: Option<PathBuf>,

    /// Trust the system's roots for `https://` branch targets too.
    #[arg(long, env = "DTX_PARTICIPANT_SYSTEM_ROOTS")]
    pub participant_system_roots: bool,

    /// Present this certificate (PEM) on every call to an `https://` participant (for
    /// participants that require the coordinator's certificate); with
    /// `--participant-client-key`.
    #[arg(
        long,
        env = "DTX_PARTICIPANT_CLIENT_CERT",
        requires = "participant_client_key"
    )]
    pub participant_client_cert: Option<PathBuf>,

    /// The private key (PEM) of `--participant-client-cert`.
    #[arg(
        long,
        env = "DTX_PARTICIPANT_CLIENT_KEY",
        requires = "participant_client_cert"
    )]
    pub participant_client_key: Option<PathBuf>,

    /// Require a bearer token on every Coordinator and Admin call and on the console: a JWKS
    /// file (`{"keys": [...]}`, RSA, EC or Ed25519 public keys) the callers' JWTs are signed
    /// with; re-read on SIGHUP and when it changes. Needs `--auth-issuer`. Auth is off unless
    /// this or `--auth-tokens` is given.
    #[arg(long, env = "DTX_AUTH_JWKS", requires = "auth_issuer")]
    pub auth_jwks: Option<PathBuf>,

    /// The `iss` every JWT must carry.
    #[arg(long, env = "DTX_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,

    /// The `aud` every JWT must carry.
    #[arg(long, env = "DTX_AUTH_AUDIENCE", default_value = "dtx-coordinator")]
    pub auth_audience: String,

    /// Require a bearer token, accepting opaque tokens listed in this file by their SHA-256,
    /// one per line: `<sha256 hex> <subject> <tenant> <role,role...>` (`dtx token new` makes
    /// a token and its line). Re-read on SIGHUP and when it changes.
    #[arg(long, env = "DTX_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// Sign every branch call with this Ed25519 private key (PKCS#8 PEM, `openssl genpkey
    /// -algorithm ed25519`): a token bound to the target, handler, xid, branch and action,
    /// valid 60 s, that participant servers check against the public key before the barrier
    /// runs. Re-read on SIGHUP and when it changes.
    #[arg(long, env = "DTX_CALL_SIGNING_KEY")]
    pub call_signing_key: Option<PathBuf>,

    /// A branch target (and alert webhook) the coordinator may call: `SCHEME://HOST[:PORT][/PATH]`,
    /// HOST a name (`*.` for subdomains), an address or a network (`10.0.0.0/8`); repeatable,
    /// comma-separated in the environment. Any other target is refused where it enters
    /// (PERMISSION_DENIED). A name must also resolve, when called, inside an allowed network
    /// or to a public address. Default: loopback only.
    #[arg(long = "allow-target", env = "DTX_ALLOW_TARGET", value_delimiter = ',')]
    pub allow_targets: Vec<String>,

    /// Most transactions one tenant may begin per second on this instance (Begin, SubmitSaga,
    /// a RegisterBranch that begins); 0 = unlimited. Over it: RESOURCE_EXHAUSTED with
    /// `retry-after`.
    #[arg(long, env = "DTX_QUOTA_BEGINS_PER_SECOND", default_value_t = 0)]
    pub quota_begins_per_second: u32,

    /// Most payload bytes (branch and saga step payloads) one tenant may send per minute on
    /// this instance; 0 = unlimited.
    #[arg(long, env = "DTX_QUOTA_PAYLOAD_BYTES_PER_MINUTE", default_value_t = 0)]
    pub quota_payload_bytes_per_minute: u32,

    /// Most transactions one tenant may have in flight (begun, not yet finished; parked ones
    /// wait for a person and do not count), across every instance; 0 = unlimited. Read from
    /// the store at most once a second per tenant and instance, counting this instance's
    /// begins in between.
    #[arg(long, env = "DTX_QUOTA_TRANSACTIONS_IN_FLIGHT", default_value_t = 0)]
    pub quota_transactions_in_flight: u32,

    /// Most open connections on the gRPC listener (`--listen`); it has its own, so a flood on
    /// another listener cannot take what initiators need. Further connections are closed at
    /// once.
    #[arg(long, env = "DTX_GRPC_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub grpc_max_connections: usize,

    /// Most open connections on `--http-listen`; further ones get a 503 at once.
    #[arg(long, env = "DTX_HTTP_MAX_CONNECTIONS", default_value_t = 1_000)]
    pub http_max_connections: usize,

    /// Most open connections on the console (`--admin-listen`); further ones get a 503.
    #[arg(long, env = "DTX_ADMIN_MAX_CONNECTIONS", default_value_t = 100)]
    pub admin_max_connections: usize,

    /// Most open connections on `--metrics-listen`; further ones get a 503.
    #[arg(long, env = "DTX_METRICS_MAX_CONNECTIONS", default_value_t = 20)]
    pub metrics_max_connections: usize,

    /// HTTP listeners close a connection whose request head has not arrived within this (slow
    /// clients cannot hold connections open).
    #[arg(long, env = "DTX_HEADER_TIMEOUT", default_value = "10s")]
    pub header_timeout: Human,

    /// HTTP listeners refuse a request whose body has not arrived whole within this (408);
    /// bodies are also cut at the listener's size limit while they are read.
    #[arg(long, env = "DTX_BODY_TIMEOUT", default_value = "30s")]
    pub body_timeout: Human,

    /// Host names the console may be reached by, besides IP addresses and `localhost`
    /// (repeatable; comma-separated in the environment). Any other `Host` is refused, so a page
    /// on another site cannot reach the console through DNS rebinding. The host of
    /// `--alert-console-url` is allowed too.
    #[arg(long = "admin-host", env = "DTX_ADMIN_HOST", value_delimiter = ',')]
    pub admin_hosts: Vec<String>,

    /// On SIGTERM/Ctrl-C, how long the listeners (which stop accepting at once) let requests
    /// in flight finish, and then how long drivers may finish their calls before exiting.
    #[arg(long, env = "DTX_SHUTDOWN_GRACE", default_value_t = Human(DEFAULT_SHUTDOWN_GRACE))]
    pub shutdown_grace: Human,

    #[command(flatten)]
    pub old: OldSpellings,
}

/// Shutdown grace when none is configured.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Declares the duration flags' earlier spellings once: the hidden flags (struct
/// [`OldSpellings`]) and how [`Config::apply_old_spellings`] moves their values.
macro_rules! old_spellings {
    ($($old:ident: $flag:literal, $env:literal, $unit_ms:literal ms => $new:ident;)*) => {
        /// The duration flags' earlier spellings, bare numbers of milliseconds (or hours):
        /// still accepted, hidden from `--help`, each with a deprecation line at start
        /// ([`Config::apply_old_spellings`]). Giving both spellings of one flag is a usage
        /// error.
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct OldSpellings {
            $(
                #[arg(long = $flag, env = $env, hide = true, conflicts_with = stringify!($new))]
                $old: Option<u64>,
            )*
        }

        impl Config {
            /// Moves values given in an earlier spelling onto their flags; one line per
            /// spelling used, saying what to write instead (the caller logs them once logging
            /// is up).
            pub fn apply_old_spellings(&mut self) -> Vec<String> {
                let old = std::mem::take(&mut self.old);
                let mut lines = Vec::new();
                $(
                    if let Some(n) = old.$old {
                        self.$new = Human(Duration::from_millis(n.saturating_mul($unit_ms)));
                        lines.push(format!(
                            "--{} (or {}) is deprecated and will be removed: write --{} {}",
                            $flag,
                            $env,
                            stringify!($new).replace('_', "-"),
                            self.$new
                        ));
                    }
                )*
                lines
            }
        }
    };
}

old_spellings! {
    lease_ms: "lease-ms", "DTX_LEASE_MS", 1 ms => lease;
    poll_ms: "poll-ms", "DTX_POLL_MS", 1 ms => poll;
    handoff_ms: "handoff-ms", "DTX_HANDOFF_MS", 1 ms => handoff;
    check_back_after_ms: "check-back-after-ms", "DTX_CHECK_BACK_AFTER_MS", 1 ms => check_back_after;
    retention_hours: "retention-hours", "DTX_RETENTION_HOURS", 3_600_000 ms => retention;
    max_clock_skew_ms: "max-clock-skew-ms", "DTX_MAX_CLOCK_SKEW_MS", 1 ms => max_clock_skew;
    shutdown_grace_ms: "shutdown-grace-ms", "DTX_SHUTDOWN_GRACE_MS", 1 ms => shutdown_grace;
}

impl Config {
    pub fn engine(&self) -> EngineConfig {
        let default = EngineConfig::default();
        let instance = self.instance.clone().unwrap_or(default.instance.clone());
        EngineConfig {
            alerts: self.alerts(&instance),
            instance,
            lease: self.lease.0.max(Duration::from_millis(100)),
            poll_interval: self.poll.0.max(Duration::from_millis(10)),
            handoff_after: self.handoff.0,
            check_back_after: self.check_back_after.0.max(Duration::from_millis(1)),
            retention: (!self.retention.0.is_zero()).then_some(self.retention.0),
            max_clock_skew: self.max_clock_skew.0,
            max_handler_labels: self.metrics_max_handlers,
            batching: Batching {
                max_items: self.branch_batch as usize,
                in_flight: self.branch_batch_in_flight as usize,
                max_wait: self.branch_batch_wait.0,
            },
            ..default
        }
    }

    /// Where alerts go, if any webhook is configured.
    fn alerts(&self, instance: &str) -> Option<AlertConfig> {
        if self.alert_webhooks.is_empty() {
            return None;
        }
        let console_url = self
            .alert_console_url
            .clone()
            .or_else(|| self.admin_listen.map(|a| format!("http://{a}")));
        Some(AlertConfig {
            webhooks: self.alert_webhooks.clone(),
            secret: self.alert_secret.clone(),
            stuck_after: self.alert_stuck_after.0,
            rules: AlertRules {
                attempts: i64::from(self.alert_attempts),
                console_url,
                instance: instance.to_string(),
            },
            retry_max: self.alert_retry_max.0.max(Duration::from_secs(1)),
            timeout: self.alert_timeout.0.max(Duration::from_millis(100)),
        })
    }

    /// Host names the console answers to besides IP addresses and `localhost`.
    pub fn console_hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self
            .admin_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        if let Some(url) = &self.alert_console_url
            && let Ok(uri) = url.parse::<http::Uri>()
            && let Some(host) = uri.host()
        {
            hosts.push(host.to_ascii_lowercase());
        }
        hosts
    }

    /// The listeners' TLS files, if TLS is on.
    pub fn tls_files(&self) -> Option<crate::tls::TlsFiles> {
        Some(crate::tls::TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }

    /// The files of the participant TLS (reloaded when they change).
    pub fn participant_tls_files(&self) -> Vec<PathBuf> {
        [
            &self.participant_ca,
            &self.participant_client_cert,
            &self.participant_client_key,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }

    /// The per-tenant quotas.
    pub fn quota_limits(&self) -> crate::quota::Limits {
        crate::quota::Limits {
            begins_per_second: self.quota_begins_per_second,
            payload_bytes_per_minute: self.quota_payload_bytes_per_minute,
            transactions_in_flight: self.quota_transactions_in_flight,
        }
    }

    /// Where the callers' keys come from (auth is off when neither file is given).
    pub fn auth_files(&self) -> crate::auth::AuthFiles {
        crate::auth::AuthFiles {
            jwks: self.auth_jwks.clone(),
            tokens: self.auth_tokens.clone(),
            issuer: self.auth_issuer.clone(),
            audience: self.auth_audience.clone(),
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

/// The README's table of coordinator options, rendered from the flags themselves.
pub fn options_table() -> String {
    use clap::CommandFactory;
    let command = Config::command();
    let mut table = String::from("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") || arg.is_hide_set() {
            continue;
        }
        let env = arg
            .get_env()
            .map_or(String::new(), |e| format!("`{}`", e.to_string_lossy()));
        let default = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", ");
        let default = if default.is_empty() {
            "none".into()
        } else {
            default
        };
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| {
                h.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        table.push_str(&format!("| `--{long}` | {env} | {default} | {help} |\n"));
    }
    table
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("coordinator").chain(args.iter().copied()))
    }

    /// Durations are written `15s`, `100ms`, `7d`; the earlier millisecond and hour numbers
    /// still work, each with a line saying what to write instead.
    #[test]
    fn earlier_duration_spellings_still_work_and_say_so() {
        let mut config = parse(&["--lease", "3s", "--poll", "250ms"]).unwrap();
        assert!(config.apply_old_spellings().is_empty());
        assert_eq!(config.engine().lease, Duration::from_secs(3));
        assert_eq!(config.engine().poll_interval, Duration::from_millis(250));

        let mut config = parse(&[
            "--lease-ms",
            "3000",
            "--retention-hours",
            "48",
            "--shutdown-grace-ms",
            "1500",
        ])
        .unwrap();
        let lines = config.apply_old_spellings();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("--lease-ms") && lines[0].ends_with("write --lease 3s"));
        assert!(lines[1].ends_with("write --retention 2d"), "{lines:?}");
        assert!(
            lines[2].ends_with("write --shutdown-grace 1500ms"),
            "{lines:?}"
        );
        let engine = config.engine();
        assert_eq!(engine.lease, Duration::from_secs(3));
        assert_eq!(engine.retention, Some(Duration::from_secs(48 * 3600)));
        assert_eq!(config.shutdown_grace.0, Duration::from_millis(1500));

        let mut keep = parse(&["--retention-hours", "0"]).unwrap();
        keep.apply_old_spellings();
        assert_eq!(
            keep.engine().retention,
            None,
            "0 keeps finished transactions"
        );
        assert_eq!(
            parse(&["--retention", "0s"]).unwrap().engine().retention,
            None
        );

        let both = parse(&["--lease", "3s", "--lease-ms", "3000"]).unwrap_err();
        assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);
        let bare = parse(&["--lease", "3000"]).unwrap_err();
        assert!(bare.to_string().contains("no unit"), "{bare}");
    }

    /// Defaults show in the same spelling (`--help`, the README's table).
    #[test]
    fn duration_defaults_are_shown_with_units() {
        let table = options_table();
        for row in [
            "| `--lease` | `DTX_LEASE` | `15s` |",
            "| `--retention` | `DTX_RETENTION` | `7d` |",
        ] {
            assert!(table.contains(row), "{row} not in\n{table}");
        }
        assert!(
            !table.contains("-ms`"),
            "a hidden spelling is listed:\n{table}"
        );
    }

    /// The README's options table is the one the flags render: a changed default or a new
    /// flag fails here until the README says the same.
    #[test]
    fn the_readme_lists_every_option_with_its_default() {
        let readme = include_str!("../../README.md");
        let (begin, end) = ("<!-- options:begin -->\n", "<!-- options:end -->");
        let start = readme
            .find(begin)
            .expect("README has an options:begin marker")
            + begin.len();
        let stop = readme[start..]
            .find(end)
            .expect("README has an options:end marker")
            + start;
        let expected = super::options_table();
        assert!(
            readme[start..stop] == expected,
            "README.md's options table is out of date; replace it with:\n{expected}"
        );
    }
}
