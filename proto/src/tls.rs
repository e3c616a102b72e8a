//! TLS for the clients of dtx - the SDK's coordinator client and its direct Trys, the `dtx`
//! CLI, the coordinator's calls to participants - in one place: `https://` means TLS (ALPN
//! `h2`), `http://` plain text, and TLS material given for an `http://` URL is an error rather
//! than silently unused.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Whom a TLS client trusts and how it identifies itself.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// CA certificates (PEM) that servers' certificates must chain to.
    pub ca_pem: Option<Vec<u8>>,
    /// Trust the operating system's roots too.
    pub system_roots: bool,
    /// The client's certificate chain and private key (PEM), presented for mTLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ClientTls")
            .field("ca", &self.ca_pem.is_some())
            .field("system_roots", &self.system_roots)
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// The system's roots only: what an `https://` URL gets when nothing else is configured.
    pub fn system() -> ClientTls {
        ClientTls {
            system_roots: true,
            ..ClientTls::default()
        }
    }

    /// Reads PEM files; `flags` names the options that gave them (CA, certificate, key), for
    /// the messages. Without a CA file the system's roots are trusted.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        flags: [&str; 3],
    ) -> Result<ClientTls, String> {
        let read = |path: &Path, flag: &str| {
            std::fs::read(path).map_err(|e| format!("cannot read {} ({flag}): {e}", path.display()))
        };
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((read(cert, flags[1])?, read(key, flags[2])?)),
            (None, None) => None,
            _ => return Err(format!("{} and {} go together", flags[1], flags[2])),
        };
        let ca_pem = ca.map(|ca| read(ca, flags[0])).transpose()?;
        Ok(ClientTls {
            system_roots: ca_pem.is_none(),
            ca_pem,
            identity,
        })
    }

    /// Whether any TLS material was given (and so a plain-text URL is a mistake).
    pub fn is_configured(&self) -> bool {
        self.ca_pem.is_some() || self.identity.is_some()
    }

    /// tonic's configuration of it.
    pub fn tonic(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.ca_pem {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if self.system_roots {
            config = config.with_native_roots();
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

/// The endpoint of `url`: TLS from `tls` for `https://` (the system's roots when `None`),
/// plain for `http://`.
pub fn endpoint(url: &str, tls: Option<&ClientTls>) -> Result<Endpoint, String> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("{url:?} is not a valid endpoint: {e}"))?;
    if endpoint.uri().scheme_str() != Some("https") {
        return Ok(endpoint);
    }
    let config = match tls {
        Some(tls) => tls.tonic(),
        None => ClientTls::system().tonic(),
    };
    endpoint
        .tls_config(config)
        .map_err(|e| format!("TLS for {url}: {e}"))
}
