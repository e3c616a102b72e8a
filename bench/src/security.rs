//! What a sweep changes from the default one (`--tls`, `--auth`, `--unbatched`): TLS and mTLS on
//! every hop, auth (the initiators' bearer token checked on every coordinator call, every
//! branch call signed by the coordinator and verified by the participants before their
//! barrier), or every branch call sent alone (the A/B arm of batched calls). Each is measured
//! in a sweep of its own against the same baselines.

use dtx_proto::auth::CallVerifier;
use dtx_tests::auth::AuthKeys;

use crate::tls::BenchTls;

/// The security of one sweep; the default is the plain sweep.
#[derive(Default)]
pub struct Security {
    pub tls: Option<BenchTls>,
    pub auth: Option<BenchAuth>,
    /// The coordinator sends every branch call alone (`--branch-batch 1`).
    pub unbatched: bool,
}

impl Security {
    pub fn tls() -> std::io::Result<Security> {
        Ok(Security {
            tls: Some(BenchTls::new()?),
            ..Security::default()
        })
    }

    pub fn auth() -> std::io::Result<Security> {
        Ok(Security {
            auth: Some(BenchAuth::new()?),
            ..Security::default()
        })
    }

    pub fn unbatched() -> std::io::Result<Security> {
        Ok(Security {
            unbatched: true,
            ..Security::default()
        })
    }

    /// The suffix of the sweep's workload names (`saga+tls`, `saga+auth`).
    pub fn suffix(&self) -> &'static str {
        match (&self.tls, &self.auth) {
            (None, None) if self.unbatched => "-unbatched",
            (None, None) => "",
            (Some(_), None) => "+tls",
            (None, Some(_)) => "+auth",
            (Some(_), Some(_)) => "+tls+auth",
        }
    }

    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The coordinator's flags for this sweep.
    pub fn coordinator_flags(&self) -> Vec<String> {
        let mut flags = self
            .tls
            .as_ref()
            .map(BenchTls::coordinator_flags)
            .unwrap_or_default();
        flags.extend(
            self.auth
                .as_ref()
                .map(|a| a.keys.flags())
                .unwrap_or_default(),
        );
        if self.unbatched {
            flags.extend(["--branch-batch".to_string(), "1".to_string()]);
        }
        flags
    }

    /// What a participant answering as `url` verifies calls with, when auth is on.
    pub fn verifier(&self, url: &str) -> Option<CallVerifier> {
        self.auth.as_ref().map(|a| a.keys.verifier(&[url]))
    }

    /// The initiators' bearer token, when auth is on.
    pub fn token(&self) -> Option<&str> {
        self.auth.as_ref().map(|a| a.token.as_str())
    }
}

/// Keys made for the run, and the initiators' token (an initiator of the default tenant).
pub struct BenchAuth {
    _dir: tempfile::TempDir,
    keys: AuthKeys,
    token: String,
}

impl BenchAuth {
    pub fn new() -> std::io::Result<BenchAuth> {
        let dir = tempfile::tempdir()?;
        let keys = AuthKeys::new(dir.path());
        let token = keys.jwt("bench", dtx_proto::limits::DEFAULT_TENANT, &["initiator"]);
        Ok(BenchAuth {
            _dir: dir,
            keys,
            token,
        })
    }
}
