//! Keys and tokens for coordinators with auth on, made at run time: an Ed25519 key whose JWKS
//! the coordinator trusts for callers' JWTs, a token file, and the coordinator's branch-call
//! signing key (with the verifier participants build from its public key).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// The issuer of the test JWTs.
pub const ISSUER: &str = "https://issuer.test";
/// The audience the coordinator expects by default.
pub const AUDIENCE: &str = "dtx-coordinator";
/// The key id of the JWKS's key.
pub const KID: &str = "k1";

/// The files of a coordinator with auth on and branch calls signed.
pub struct AuthKeys {
    pub jwks: PathBuf,
    pub tokens: PathBuf,
    pub signing_key: PathBuf,
    /// The public key of `signing_key` (what participants verify with).
    pub call_public_pem: String,
    jwt_key: EncodingKey,
    /// A key the coordinator does not trust (forged tokens).
    other_key: EncodingKey,
}

fn pkcs8(seed: u8) -> (EncodingKey, ed25519_dalek::SigningKey, String) {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let pem = key
        .to_pkcs8_pem(Default::default())
        .expect("pkcs8")
        .to_string();
    (
        EncodingKey::from_ed_pem(pem.as_bytes()).expect("ed key"),
        key,
        pem,
    )
}

impl AuthKeys {
    /// Keys under `dir`; the token file starts empty.
    pub fn new(dir: &Path) -> AuthKeys {
        let (jwt_key, signing, _) = pkcs8(11);
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(signing.verifying_key().as_bytes());
        let jwks = dir.join("jwks.json");
        std::fs::write(
            &jwks,
            serde_json::json!({"keys": [{
                "kty": "OKP", "crv": "Ed25519", "x": x, "kid": KID, "alg": "EdDSA", "use": "sig"
            }]})
            .to_string(),
        )
        .expect("write jwks");
        let tokens = dir.join("tokens");
        std::fs::write(&tokens, "# test tokens\n").expect("write tokens");
        let (_, call_key, call_pem) = pkcs8(12);
        let signing_key = dir.join("call-signing.pem");
        std::fs::write(&signing_key, call_pem).expect("write signing key");
        let call_public_pem = call_key
            .verifying_key()
            .to_public_key_pem(Default::default())
            .expect("public pem");
        AuthKeys {
            jwks,
            tokens,
            signing_key,
            call_public_pem,
            jwt_key,
            other_key: pkcs8(13).0,
        }
    }

    /// The coordinator flags: callers' JWTs and token file, signed branch calls.
    pub fn flags(&self) -> Vec<String> {
        [
            "--auth-jwks",
            &self.jwks.display().to_string(),
            "--auth-issuer",
            ISSUER,
            "--auth-tokens",
            &self.tokens.display().to_string(),
            "--call-signing-key",
            &self.signing_key.display().to_string(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// A JWT for `subject` in `tenant` with `roles`, valid for an hour.
    pub fn jwt(&self, subject: &str, tenant: &str, roles: &[&str]) -> String {
        self.sign(&self.jwt_key, claims(subject, tenant, roles))
    }

    /// A JWT with these claims, signed by the trusted key.
    pub fn jwt_with(&self, claims: serde_json::Value) -> String {
        self.sign(&self.jwt_key, claims)
    }

    /// A JWT of the right shape and key id signed by a key the coordinator does not trust.
    pub fn forged_jwt(&self, subject: &str, tenant: &str, roles: &[&str]) -> String {
        self.sign(&self.other_key, claims(subject, tenant, roles))
    }

    fn sign(&self, key: &EncodingKey, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(KID.into());
        jsonwebtoken::encode(&header, &claims, key).expect("sign jwt")
    }

    /// A new opaque token for the token file (its hash appended to it).
    pub fn opaque(&self, subject: &str, tenant: &str, roles: &[&str]) -> String {
        use std::io::Write;
        let (token, line) = dtx_proto::auth::new_token(subject, tenant, roles);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.tokens)
            .expect("open tokens");
        writeln!(file, "{line}").expect("append token");
        token
    }

    /// What a participant answering as `targets` verifies the coordinator's calls with.
    pub fn verifier(&self, targets: &[&str]) -> dtx_proto::auth::CallVerifier {
        dtx_proto::auth::CallVerifier::from_pem(&self.call_public_pem, targets).expect("verifier")
    }
}

/// Registered claims valid for an hour, plus the tenant and roles.
pub fn claims(subject: &str, tenant: &str, roles: &[&str]) -> serde_json::Value {
    let now = now();
    serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": subject, "iat": now, "nbf": now - 5,
        "exp": now + 3600, "tenant": tenant, "roles": roles,
    })
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
