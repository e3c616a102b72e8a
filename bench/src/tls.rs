//! TLS and mTLS on every hop of the bench (`--tls`): initiator -> coordinator, coordinator ->
//! participants, initiator -> participant (direct Trys), with a CA made at run time.

use dtx_sdk::client::ClientTls;
use dtx_tests::pki::{Ca, Identity};
use tonic::transport::{Certificate, Identity as TonicIdentity, ServerTlsConfig};

/// A CA, the server certificate every listener uses, and the client certificate every
/// caller presents.
pub struct BenchTls {
    _dir: tempfile::TempDir,
    ca: Ca,
    server: Identity,
    client: Identity,
}

impl BenchTls {
    pub fn new() -> std::io::Result<BenchTls> {
        let dir = tempfile::tempdir()?;
        let ca = Ca::new(dir.path(), "bench");
        let (server, client) = (ca.server("server"), ca.client("client", "dtx-coordinator"));
        Ok(BenchTls {
            _dir: dir,
            ca,
            server,
            client,
        })
    }

    /// The coordinator's flags: TLS with client certificates required, and mTLS to the
    /// participants.
    pub fn coordinator_flags(&self) -> Vec<String> {
        let path = |p: &std::path::Path| p.display().to_string();
        vec![
            "--tls-cert".into(),
            path(&self.server.cert),
            "--tls-key".into(),
            path(&self.server.key),
            "--tls-client-ca".into(),
            path(&self.ca.cert()),
            "--participant-ca".into(),
            path(&self.ca.cert()),
            "--participant-client-cert".into(),
            path(&self.client.cert),
            "--participant-client-key".into(),
            path(&self.client.key),
        ]
    }

    /// What initiators connect with.
    pub fn client(&self) -> ClientTls {
        ClientTls {
            ca_pem: Some(self.ca.pem().into_bytes()),
            system_roots: false,
            identity: Some((
                self.client.cert_pem().into_bytes(),
                self.client.key_pem().into_bytes(),
            )),
        }
    }

    /// What the metrics scrape connects with (the CA's roots; the metrics listener asks for no
    /// client certificate).
    pub fn scraper(&self) -> std::sync::Arc<rustls::ClientConfig> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        if let Ok(ca) = CertificateDer::from_pem_slice(self.ca.pem().as_bytes()) {
            roots.add(ca).ok();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        std::sync::Arc::new(config)
    }

    /// What participants serve with: client certificates of the CA required.
    pub fn participant(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(TonicIdentity::from_pem(
                self.server.cert_pem(),
                self.server.key_pem(),
            ))
            .client_ca_root(Certificate::from_pem(self.ca.pem()))
    }
}
