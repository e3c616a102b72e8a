//! TLS for every listener, configured in one place: the certificate chain and key (and, for
//! mTLS, the CA that client certificates must chain to) are read from PEM files, and re-read on
//! SIGHUP and whenever one of the files changes. A new connection gets the newest certificate;
//! connections already open keep theirs until they close. Files that do not parse (say, a key
//! written before its certificate) keep the previous certificate in service and are reported.
//!
//! rustls on the ring provider: no OpenSSL, no C toolchain.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// How often the files are checked for changes (SIGHUP reloads at once).
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// Where the server's TLS material lives.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Client certificates must chain to one of these CAs (PEM) on the listeners that require
    /// them; `None`: no client certificates asked for.
    pub client_ca: Option<PathBuf>,
}

/// What a listener needs of its TLS configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// ALPN `h2` (gRPC) rather than `http/1.1`.
    pub h2: bool,
    /// Require a client certificate (when a client CA is configured).
    pub client_auth: bool,
}

impl Shape {
    fn index(self) -> usize {
        usize::from(self.h2) * 2 + usize::from(self.client_auth)
    }
}

/// The server TLS configurations of every listener shape, swapped whole on reload.
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Loaded>,
}

struct Loaded {
    configs: [Arc<ServerConfig>; 4],
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish()
    }
}

impl ServerTls {
    /// Reads the files; an error says which file and why, for the start-up message.
    pub fn load(files: TlsFiles) -> Result<ServerTls, String> {
        let loaded = Loaded::read(&files)?;
        Ok(ServerTls {
            files,
            current: RwLock::new(loaded),
        })
    }

    /// Whether client certificates are required where a listener asks for them.
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The configuration a new connection of a listener of `shape` gets now.
    pub fn config(&self, shape: Shape) -> Arc<ServerConfig> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.configs[shape.index()].clone()
    }

    /// Reads the files again; on failure the configuration in service stays and the error is
    /// returned.
    pub fn reload(&self) -> Result<(), String> {
        let loaded = Loaded::read(&self.files)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = loaded;
        Ok(())
    }

    /// The files it reads.
    pub fn files(&self) -> Vec<PathBuf> {
        let files = &self.files;
        [
            Some(&files.cert),
            Some(&files.key),
            files.client_ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }
}

/// Calls `reload` on SIGHUP and whenever one of `files` changes (checked every 2 s), until
/// `stop` turns true; `what` names the material in the log. A failed reload is logged (the
/// caller keeps what it had) and retried at the next change.
pub async fn watch(
    what: &'static str,
    files: Vec<PathBuf>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    reload: impl Fn() -> Result<(), String> + Send,
) {
    let stamps = |files: &[PathBuf]| -> Vec<Option<SystemTime>> {
        files
            .iter()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    };
    let mut seen = stamps(&files);
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let why = tokio::select! {
            _ = async {
                match hangup.as_mut() {
                    Some(h) => { h.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => "SIGHUP",
            _ = tokio::time::sleep(WATCH_EVERY) => "a file changed",
            _ = stop.wait_for(|stopping| *stopping) => return,
        };
        #[cfg(not(unix))]
        let why = tokio::select! {
            _ = tokio::time::sleep(WATCH_EVERY) => "a file changed",
            _ = stop.wait_for(|stopping| *stopping) => return,
        };
        let now = stamps(&files);
        if why != "SIGHUP" && now == seen {
            continue;
        }
        // Seen before reading: a change while reading is picked up at the next check, and
        // broken files are reported once per change, not every two seconds.
        seen = now;
        match reload() {
            Ok(()) => tracing::info!("{what} reloaded ({why}); new connections use it"),
            Err(e) => tracing::warn!(
                "{what} not reloaded ({why}), the previous one stays in service: {e}"
            ),
        }
    }
}

impl Loaded {
    fn read(files: &TlsFiles) -> Result<Loaded, String> {
        let certs = read_certs(&files.cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
            format!(
                "cannot read a private key from {} (--tls-key): {e}",
                files.key.display()
            )
        })?;
        let client_roots = match &files.client_ca {
            Some(path) => Some(Arc::new(root_store(path, "--tls-client-ca")?)),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let build = |shape: Shape| -> Result<Arc<ServerConfig>, String> {
            let builder = ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?;
            let builder = match (&client_roots, shape.client_auth) {
                (Some(roots), true) => {
                    let verifier = WebPkiClientVerifier::builder_with_provider(
                        roots.clone(),
                        provider.clone(),
                    )
                    .build()
                    .map_err(|e| format!("the client CA (--tls-client-ca): {e}"))?;
                    builder.with_client_cert_verifier(verifier)
                }
                _ => builder.with_no_client_auth(),
            };
            let mut config = builder
                .with_single_cert(certs.clone(), key.clone_key())
                .map_err(|e| {
                    format!(
                        "the certificate ({}) and key ({}) do not make a TLS identity: {e}",
                        files.cert.display(),
                        files.key.display()
                    )
                })?;
            config.alpn_protocols = if shape.h2 {
                vec![b"h2".to_vec()]
            } else {
                vec![b"http/1.1".to_vec()]
            };
            Ok(Arc::new(config))
        };
        let shape = |index: usize| Shape {
            h2: index / 2 == 1,
            client_auth: index % 2 == 1,
        };
        Ok(Loaded {
            configs: [
                build(shape(0))?,
                build(shape(1))?,
                build(shape(2))?,
                build(shape(3))?,
            ],
        })
    }
}

/// The certificates of a PEM file; at least one.
pub fn read_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "cannot read certificates from {} ({flag}): {e}",
                path.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{} ({flag}) holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

/// The CAs of a PEM file as trust roots.
pub fn root_store(path: &Path, flag: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path, flag)? {
        roots.add(cert).map_err(|e| {
            format!(
                "{} ({flag}) holds an unusable CA certificate: {e}",
                path.display()
            )
        })?;
    }
    Ok(roots)
}
