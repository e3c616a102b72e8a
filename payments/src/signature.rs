//! Signatures, checked first: nothing about a callback is believed, stored or answered as a
//! success before its signature over the raw body holds. [`HmacSha256`] is the common scheme
//! (a shared secret, a timestamp inside the signed text, a window against replays); other
//! schemes (RSA, a provider's certificate) implement [`Verifier`].

use std::time::Duration;

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use sha2::Sha256;

/// Why a signature was refused (the callback is answered 401 and nothing is stored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The signature header is absent.
    #[error("no {0} header")]
    Missing(String),
    /// The signature header cannot be read.
    #[error("the {0} header is not `t=<unix seconds>,v1=<hex>`")]
    Malformed(String),
    /// Signed too long ago (or in the future): a replay, or a clock far off.
    #[error("signed {skew} s away from now: outside the {window} s window")]
    Expired {
        /// The signed timestamp, Unix seconds.
        signed_at: i64,
        /// Seconds between it and now.
        skew: i64,
        /// The accepted window, seconds.
        window: u64,
    },
    /// No key's signature matches the body.
    #[error("the signature does not match the body")]
    Mismatch,
}

/// Checks that a callback comes from the provider, over its raw body.
pub trait Verifier: Send + Sync + 'static {
    /// `Ok` when `headers` carry a valid signature of `body` at `now_ms`.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now_ms: i64) -> Result<(), SignatureError>;
}

/// `<header>: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`, accepted while
/// `t` is within `window` of now. Several secrets may be current at once (rotation: the
/// provider signs with the new one while the old one still verifies); several `v1=` values too.
#[derive(Clone)]
pub struct HmacSha256 {
    header: HeaderName,
    secrets: Vec<Vec<u8>>,
    window: Duration,
}

impl HmacSha256 {
    /// Verifies `header` with `secret`, within 5 minutes.
    pub fn new(header: HeaderName, secret: impl Into<Vec<u8>>) -> Self {
        HmacSha256 {
            header,
            secrets: vec![secret.into()],
            window: Duration::from_secs(300),
        }
    }

    /// Also accepts signatures made with `secret` (during a rotation).
    pub fn also(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secrets.push(secret.into());
        self
    }

    /// How far the signed time may be from now, either way.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }
}

impl std::fmt::Debug for HmacSha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HmacSha256")
            .field("header", &self.header)
            .field("secrets", &self.secrets.len())
            .field("window", &self.window)
            .finish()
    }
}

/// The header value signing `body` at `unix_seconds` with `secret` (what a provider sends; the
/// simulator and the tests use it).
pub fn sign(secret: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    format!(
        "t={unix_seconds},v1={}",
        hex::encode(mac(secret, unix_seconds, body).finalize().into_bytes())
    )
}

fn mac(secret: &[u8], unix_seconds: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

impl Verifier for HmacSha256 {
    fn verify(&self, headers: &HeaderMap, body: &[u8], now_ms: i64) -> Result<(), SignatureError> {
        let name = self.header.as_str();
        let value = headers
            .get(&self.header)
            .ok_or_else(|| SignatureError::Missing(name.into()))?
            .to_str()
            .map_err(|_| SignatureError::Malformed(name.into()))?;
        let mut signed_at = None;
        let mut signatures = Vec::new();
        for part in value.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => signed_at = t.parse::<i64>().ok(),
                Some(("v1", v)) => signatures
                    .push(hex::decode(v).map_err(|_| SignatureError::Malformed(name.into()))?),
                _ => {}
            }
        }
        let signed_at = signed_at.ok_or_else(|| SignatureError::Malformed(name.into()))?;
        if signatures.is_empty() {
            return Err(SignatureError::Malformed(name.into()));
        }
        let skew = (now_ms / 1000 - signed_at).abs();
        if skew > self.window.as_secs() as i64 {
            return Err(SignatureError::Expired {
                signed_at,
                skew,
                window: self.window.as_secs(),
            });
        }
        // `verify_slice` compares in constant time.
        let matches = self.secrets.iter().any(|secret| {
            signatures
                .iter()
                .any(|sig| mac(secret, signed_at, body).verify_slice(sig).is_ok())
        });
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: i64 = 1_800_000_000_000;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-signature", value.parse().unwrap());
        headers
    }

    fn verifier() -> HmacSha256 {
        HmacSha256::new(HeaderName::from_static("x-signature"), "s3cret")
    }

    #[test]
    fn a_signature_holds_for_its_body_its_secret_and_its_window_only() {
        let body = br#"{"amount":100}"#;
        let now = NOW_MS / 1000;
        let v = verifier();
        assert_eq!(
            v.verify(&headers(&sign(b"s3cret", now, body)), body, NOW_MS),
            Ok(())
        );
        let tampered = br#"{"amount":1}"#;
        assert_eq!(
            v.verify(&headers(&sign(b"s3cret", now, body)), tampered, NOW_MS),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            v.verify(&headers(&sign(b"other", now, body)), body, NOW_MS),
            Err(SignatureError::Mismatch)
        );
        let old = v.verify(&headers(&sign(b"s3cret", now - 301, body)), body, NOW_MS);
        assert!(
            matches!(old, Err(SignatureError::Expired { skew: 301, .. })),
            "{old:?}"
        );
        let ahead = v.verify(&headers(&sign(b"s3cret", now + 301, body)), body, NOW_MS);
        assert!(
            matches!(ahead, Err(SignatureError::Expired { .. })),
            "{ahead:?}"
        );
        // The timestamp is signed: moving it breaks the signature.
        let moved = sign(b"s3cret", now - 1000, body)
            .replace(&format!("t={}", now - 1000), &format!("t={now}"));
        assert_eq!(
            v.verify(&headers(&moved), body, NOW_MS),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn rotation_accepts_both_secrets_and_bad_headers_say_why() {
        let body = b"{}";
        let now = NOW_MS / 1000;
        let v = verifier().also("next");
        assert_eq!(
            v.verify(&headers(&sign(b"next", now, body)), body, NOW_MS),
            Ok(())
        );
        assert_eq!(
            v.verify(&HeaderMap::new(), body, NOW_MS),
            Err(SignatureError::Missing("x-signature".into()))
        );
        for bad in ["v1=00", "t=1", "t=x,v1=00", "t=1,v1=zz"] {
            assert_eq!(
                v.verify(&headers(bad), body, NOW_MS),
                Err(SignatureError::Malformed("x-signature".into())),
                "{bad}"
            );
        }
    }
}
