//! What can go wrong before the coordinator serves: a listen address that cannot be bound, a
//! store that cannot be opened, an SQLite file another live coordinator holds. A person reads
//! these, so each is a sentence naming what failed, the value and what to do, with its own
//! exit code (the README's "Exit codes" table) so scripts can tell them apart.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use tokio::net::TcpListener;

use crate::store::OpenError;

/// Why the coordinator process stops with an error; the process exits with this code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// It failed while serving (after a clean start).
    Serving = 1,
    /// A flag's value is unusable (clap's own usage errors also exit with 2).
    Config = 2,
    /// A listen address cannot be bound.
    Listen = 3,
    /// The store cannot be opened, migrated or locked.
    Store = 4,
}

impl StartFailure {
    pub(crate) fn error(self, message: impl Into<String>) -> StartError {
        StartError {
            failure: self,
            message: message.into(),
        }
    }
}

/// What stops the coordinator process: a sentence for the operator and its exit code. The
/// request path's errors are [`crate::Error`]; one that ends the serving loop becomes a
/// [`StartFailure::Serving`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StartError {
    pub failure: StartFailure,
    pub message: String,
}

impl StartError {
    /// The process exit code (the README's "Exit codes" table).
    pub fn exit_code(&self) -> u8 {
        self.failure as u8
    }
}

impl From<crate::Error> for StartError {
    fn from(e: crate::Error) -> Self {
        StartFailure::Serving.error(e.to_string())
    }
}

impl From<std::io::Error> for StartError {
    fn from(e: std::io::Error) -> Self {
        StartFailure::Serving.error(format!("network: {e}"))
    }
}

pub type Result<T, E = StartError> = std::result::Result<T, E>;

/// The listeners' TLS configuration, if `--tls-cert` is given; unreadable files stop the start
/// with a sentence naming them.
/// The targets the coordinator may call (`--allow-target`; loopback only without one); the
/// alert webhooks must be among them.
pub fn allowlist(config: &crate::config::Config) -> Result<crate::domain::allow::Allowlist> {
    let allow = crate::domain::allow::Allowlist::parse(&config.allow_targets)
        .map_err(|e| StartFailure::Config.error(e))?;
    for webhook in &config.alert_webhooks {
        allow.check_url(webhook).map_err(|e| {
            StartFailure::Config.error(format!("--alert-webhook: {e}; add an --allow-target rule"))
        })?;
    }
    if config.allow_targets.is_empty() {
        tracing::info!(
            rules = %allow.describe(),
            "branch targets: loopback only (the default); allow others with --allow-target"
        );
    } else {
        tracing::info!(rules = %allow.describe(), "branch targets allowed");
    }
    Ok(allow)
}

/// Who may call, from `--auth-jwks` / `--auth-tokens` (off without either).
pub fn auth(config: &crate::config::Config) -> Result<crate::auth::Auth> {
    crate::auth::Auth::load(config.auth_files()).map_err(|e| StartFailure::Config.error(e))
}

/// The branch-call signing key of `--call-signing-key`, if given.
pub fn call_signer(config: &crate::config::Config) -> Result<Option<dtx_proto::auth::CallSigner>> {
    let Some(path) = &config.call_signing_key else {
        return Ok(None);
    };
    let pem = std::fs::read_to_string(path).map_err(|e| {
        StartFailure::Config.error(format!("--call-signing-key {}: {e}", path.display()))
    })?;
    let signer = dtx_proto::auth::CallSigner::from_pem(&pem).map_err(|e| {
        StartFailure::Config.error(format!("--call-signing-key {}: {e}", path.display()))
    })?;
    tracing::info!(
        key_id = signer.kid(),
        "branch calls are signed; participants verify them with this public key:\n{}",
        signer.public_pem()
    );
    Ok(Some(signer))
}

pub fn tls(
    config: &crate::config::Config,
) -> Result<Option<std::sync::Arc<crate::tls::ServerTls>>> {
    let Some(files) = config.tls_files() else {
        return Ok(None);
    };
    crate::tls::ServerTls::load(files)
        .map(|tls| Some(std::sync::Arc::new(tls)))
        .map_err(|e| {
            StartFailure::Config.error(format!(
                "{e}. Give PEM files: the certificate chain (leaf first), its private key, and \
                 for mTLS the clients' CA."
            ))
        })
}

/// How the coordinator calls `https://` participants: the trust roots and client certificate
/// of `--participant-*`; `None` when no roots are configured (an `https://` target is then not
/// called, and says why).
pub fn participant_tls(
    config: &crate::config::Config,
) -> Result<Option<dtx_proto::tls::ClientTls>> {
    if config.participant_ca.is_none() && !config.participant_system_roots {
        return Ok(None);
    }
    let mut tls = dtx_proto::tls::ClientTls::from_files(
        config.participant_ca.as_deref(),
        config.participant_client_cert.as_deref(),
        config.participant_client_key.as_deref(),
        [
            "--participant-ca",
            "--participant-client-cert",
            "--participant-client-key",
        ],
    )
    .map_err(|e| StartFailure::Config.error(e))?;
    tls.system_roots = config.participant_system_roots;
    Ok(Some(tls))
}

/// Binds `addr` for the listener `flag` configures (`--listen`, `--metrics-listen`, ..).
pub async fn bind(addr: SocketAddr, flag: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| StartFailure::Listen.error(bind_message(addr, flag, &e)))
}

fn bind_message(addr: SocketAddr, flag: &str, e: &std::io::Error) -> String {
    let port = addr.port();
    let why = match e.kind() {
        ErrorKind::AddrInUse => format!(
            "another process is listening there. Stop it (`ss -ltnp 'sport = :{port}'` shows \
             which) or choose a free address with {flag}"
        ),
        ErrorKind::PermissionDenied => format!(
            "permission denied (ports below 1024 need privileges). Choose a port above 1023 \
             with {flag}"
        ),
        ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this machine. Use 127.0.0.1, 0.0.0.0 or one of its \
             interfaces' addresses with {flag}",
            addr.ip()
        ),
        _ => format!("{e}. Check the address given with {flag}"),
    };
    format!("cannot listen on {addr} ({flag}): {why}.")
}

/// Opens the store at `url` (`--store`), with messages a person can act on. For an SQLite
/// file it first takes the file's instance lock, which the caller keeps while serving.
pub async fn open_store(
    url: &str,
    options: crate::store::StoreOptions,
) -> Result<(
    std::sync::Arc<dyn crate::store::Store>,
    Option<InstanceLock>,
)> {
    let shown = redact(url);
    let lock = match dtx_sql::dialect_of_url(url) {
        None => {
            return Err(StartFailure::Store.error(format!(
                "cannot open the store {shown:?} (--store): the URL must start with sqlite://, \
                 postgres:// or mysql://, for example sqlite://dtx-coordinator.db or \
                 postgres://user@127.0.0.1:5432/dtx."
            )));
        }
        Some(dtx_sql::Dialect::Sqlite) => InstanceLock::acquire(url)?,
        Some(_) => None,
    };
    let store = crate::store::open(url, options)
        .await
        .map_err(|e| StartFailure::Store.error(store_message(&shown, &e)))?;
    Ok((store, lock))
}

fn store_message(shown: &str, e: &OpenError) -> String {
    match e {
        OpenError::Scheme(_) => e.to_string(),
        OpenError::Migrate(e) => format!(
            "the store {shown} (--store) is reachable but its schema cannot be brought up to \
             date: {e}. If a newer coordinator migrated it, run that version; otherwise restore \
             the database or point --store at another one."
        ),
        OpenError::Connect(e) if dtx_sql::is_connection_error(e) => format!(
            "cannot connect to the store {shown} (--store): {e}. Check that the database server \
             runs and that the URL's host and port are right."
        ),
        OpenError::Connect(e) if e.as_database_error().is_some() => format!(
            "the store {shown} (--store) refused the coordinator: {e}. Check the URL's user, \
             password and database name, and that this user may create tables in it."
        ),
        OpenError::Connect(e) => format!(
            "cannot open the store {shown} (--store): {e}. Check the URL, and for SQLite that \
             the file's directory exists and is writable."
        ),
        OpenError::FirstRead(e) => format!("cannot open the store {shown} (--store): {e}."),
    }
}

/// An exclusive lock on `<file>.lock` beside an SQLite store, held while a coordinator serves
/// from it. SQLite serializes writers on one host, so a second instance adds no capacity,
/// and an operator who started one by mistake (or left an old one running) should hear so
/// at once. The kernel drops the lock when the process dies, SIGKILL included, so a crash
/// never leaves the file locked.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    /// Takes the lock for the SQLite store `url`; `None` for an in-memory database.
    pub fn acquire(url: &str) -> Result<Option<InstanceLock>> {
        let Some(db) = sqlite_file(url) else {
            return Ok(None);
        };
        let mut path = db.clone().into_os_string();
        path.push(".lock");
        let path = PathBuf::from(path);
        let shown = path.display();
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| {
                StartFailure::Store.error(format!(
                    "cannot create the SQLite store's lock file {shown} (--store): {e}. Check \
                     that its directory exists and is writable."
                ))
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    String::new()
                } else {
                    format!(" ({holder})")
                };
                return Err(StartFailure::Store.error(format!(
                    "the SQLite store {} (--store) is in use by another running coordinator{holder}. \
                     SQLite serves one instance: stop the other one, give this one its own \
                     file, or use PostgreSQL or MySQL to run several instances on one store.",
                    db.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StartFailure::Store.error(format!(
                    "cannot lock the SQLite store's lock file {shown} (--store): {e}."
                )));
            }
        }
        // Who holds it, for the message of the next one that tries.
        let holder = format!("pid {}", std::process::id());
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(holder.as_bytes()));
        Ok(Some(InstanceLock { _file: file }))
    }
}

/// The database file an SQLite URL names, or `None` for an in-memory database.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let options = dtx_sql::sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    let file = options.get_filename();
    let name = file.to_string_lossy();
    let in_memory = name == ":memory:" || name.starts_with("file:") || name.is_empty();
    (!in_memory).then(|| file.to_path_buf())
}

/// The store URL without its password, for logs and messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
    }

    #[test]
    fn a_file_is_locked_and_memory_is_not() {
        assert_eq!(
            sqlite_file("sqlite://data/dtx.db"),
            Some(PathBuf::from("data/dtx.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("sqlite://?mode=memory"), None);
    }

    #[test]
    fn a_second_lock_on_one_file_is_refused_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("c.db").display());
        let first = InstanceLock::acquire(&url).unwrap().expect("a file store");
        let refused = InstanceLock::acquire(&url).unwrap_err();
        assert!(refused.failure == StartFailure::Store, "{refused:?}");
        let message = refused.to_string();
        assert!(
            message.contains("in use by another running coordinator"),
            "{message}"
        );
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        drop(first);
        InstanceLock::acquire(&url).unwrap().expect("free again");
    }
}
