//! Throwaway certificate authorities made at run time (no key is ever committed): a CA, server
//! certificates for `localhost`/`127.0.0.1`, client certificates, written as PEM files into a
//! temporary folder.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA and the folder its files go to.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

/// PEM files of one certificate: its chain (leaf only) and key.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Identity {
    /// The certificate's PEM text.
    pub fn cert_pem(&self) -> String {
        std::fs::read_to_string(&self.cert).unwrap()
    }

    /// The key's PEM text.
    pub fn key_pem(&self) -> String {
        std::fs::read_to_string(&self.key).unwrap()
    }
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), issuer.pem()).unwrap();
        Ca {
            issuer,
            dir: dir.to_path_buf(),
            name: name.to_string(),
        }
    }

    /// The CA certificate's PEM file.
    pub fn cert(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// The CA certificate's PEM text.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `localhost` and `127.0.0.1`, files `dir/<file>.pem` and
    /// `dir/<file>-key.pem`.
    pub fn server(&self, file: &str) -> Identity {
        self.issue(
            file,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose subject names `name` (as its common name and a DNS SAN).
    pub fn client(&self, file: &str, name: &str) -> Identity {
        self.issue(file, &[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, file: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Identity {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].clone());
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let identity = Identity {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
        };
        std::fs::write(&identity.cert, cert.pem()).unwrap();
        std::fs::write(&identity.key, key.serialize_pem()).unwrap();
        identity
    }
}
