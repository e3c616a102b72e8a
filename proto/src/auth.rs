//! Who is calling, on the wire: the bearer token a caller sends the coordinator, and the token
//! the coordinator signs for every branch call so that a participant obeys only it. The names,
//! the claims and the signing and checking of branch-call tokens live here, so the coordinator,
//! the SDK and the CLI agree by construction.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::Digest;

/// The metadata key (HTTP header) of a caller's bearer token.
pub const AUTHORIZATION: &str = "authorization";

/// The metadata key of the coordinator's signed token on a branch call (apart from
/// `authorization`, which the participant's service may use for its own callers).
pub const CALL_TOKEN: &str = "x-dtx-call-token";

/// The metadata key (HTTP header) naming the person behind an admin action, recorded in the
/// history, when auth is off (with auth on, the operator is the token's subject).
pub const OPERATOR: &str = "x-dtx-operator";

/// The issuer of branch-call tokens.
pub const CALL_ISSUER: &str = "dtx-coordinator";

/// A branch-call token is valid for at most this long: one call and its retries of the
/// transport, not a credential to keep.
pub const CALL_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

/// Clock difference tolerated between the coordinator and a participant.
const CALL_LEEWAY_SECS: u64 = 30;

/// The token of `authorization: Bearer <token>`, if the metadata carries one.
pub fn bearer(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let value = metadata.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The `authorization` value carrying `token`.
pub fn bearer_value(
    token: &str,
) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, CallTokenError> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| CallTokenError("a token must be printable ASCII".into()))
}

/// How a token file stores a token: its SHA-256 in hex (tokens are 256 random bits, so a hash
/// without salt reveals nothing usable).
pub fn token_hash(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// A new random opaque token and its token-file line (`<sha256> <subject> <tenant> <roles>`).
pub fn new_token(subject: &str, tenant: &str, roles: &[&str]) -> (String, String) {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = format!("dtx_{}", hex::encode(bytes));
    let line = format!(
        "{} {subject} {tenant} {}",
        token_hash(&token),
        roles.join(",")
    );
    (token, line)
}

/// What a branch-call token binds: the call it was signed for, nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallClaims {
    /// The signing coordinator's issuer name.
    pub iss: String,
    /// The participant target the coordinator calls (its URL as registered).
    pub aud: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expires at, Unix seconds (at most 60 s after `iat`).
    pub exp: u64,
    /// The transaction, as the participant's barrier keys it (tenant-scoped).
    pub xid: String,
    /// The branch (or saga step) id.
    pub branch: String,
    /// The `dtx.v1.Action` name: TRY, CONFIRM, CANCEL, ACTION, COMPENSATE.
    pub action: String,
    /// The participant's handler name.
    pub handler: String,
}

/// The call a token is signed for and checked against (the target apart: the coordinator
/// names it, a participant knows the targets it answers as).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The transaction.
    pub xid: &'a str,
    /// The branch.
    pub branch: &'a str,
    /// The action's claim name ([`action_claim`]).
    pub action: &'a str,
    /// The handler.
    pub handler: &'a str,
}

/// The `action` claim of a branch action: TRY, CONFIRM, CANCEL, ACTION or COMPENSATE.
pub fn action_claim(action: i32) -> &'static str {
    crate::v1::BranchAction::try_from(action)
        .map_or("UNSPECIFIED", |a| a.as_str_name())
        .trim_start_matches("BRANCH_ACTION_")
}

impl<'a> Call<'a> {
    /// The call a branch request makes.
    pub fn of(request: &'a crate::v1::BranchRequest) -> Call<'a> {
        Call {
            xid: &request.xid,
            branch: &request.branch_id,
            action: action_claim(request.action),
            handler: &request.handler,
        }
    }
}

/// Why a branch-call token (or a key) was refused: a sentence for the log and the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CallTokenError(pub String);

/// The key id of an Ed25519 public key: the first 16 hex digits of its SHA-256, so both sides
/// derive it from the key alone and keys rotate by adding the new one at participants first.
pub fn key_id(public_key: &ed25519_dalek::VerifyingKey) -> String {
    hex::encode(&sha2::Sha256::digest(public_key.as_bytes())[..8])
}

/// The coordinator's signing key (Ed25519, PKCS#8 PEM as `openssl genpkey -algorithm ed25519`
/// writes it). Tokens are compact JWTs (`alg` EdDSA) made here on the parsed key: a signature
/// per branch call, nothing parsed again per call.
#[derive(Clone)]
pub struct CallSigner {
    kid: String,
    key: ed25519_dalek::SigningKey,
    /// The encoded JWT header, the same for every token of this key.
    header: String,
    public_pem: String,
}

impl std::fmt::Debug for CallSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSigner")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// The JWT header of a call token.
#[derive(Serialize, Deserialize)]
struct JwtHeader {
    alg: String,
    #[serde(default)]
    typ: Option<String>,
    #[serde(default)]
    kid: Option<String>,
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()
}

impl CallSigner {
    /// A signer from an Ed25519 private key (PKCS#8 PEM); its key id is derived from the
    /// public key, so participants can hold several keys while one rotates.
    pub fn from_pem(pem: &str) -> Result<Self, CallTokenError> {
        use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePublicKey};
        let key = ed25519_dalek::SigningKey::from_pkcs8_pem(pem).map_err(|e| {
            CallTokenError(format!(
                "not an Ed25519 private key in PKCS#8 PEM ({e}); make one with `openssl \
                 genpkey -algorithm ed25519`"
            ))
        })?;
        let public = key.verifying_key();
        let public_pem = public
            .to_public_key_pem(Default::default())
            .map_err(|e| CallTokenError(format!("encoding the public key: {e}")))?;
        let kid = key_id(&public);
        let header = JwtHeader {
            alg: "EdDSA".into(),
            typ: Some("JWT".into()),
            kid: Some(kid.clone()),
        };
        let header = b64(&serde_json::to_vec(&header).expect("a header encodes"));
        Ok(CallSigner {
            kid,
            key,
            header,
            public_pem,
        })
    }

    /// The key id every token names.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key participants verify with (SPKI PEM).
    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// A token for `call` to `target`, valid from now for [`CALL_TOKEN_LIFETIME`].
    pub fn sign(&self, target: &str, call: Call<'_>) -> Result<String, CallTokenError> {
        use ed25519_dalek::Signer;
        let iat = unix_now();
        let claims = CallClaims {
            iss: CALL_ISSUER.into(),
            aud: target.into(),
            iat,
            exp: iat + CALL_TOKEN_LIFETIME.as_secs(),
            xid: call.xid.into(),
            branch: call.branch.into(),
            action: call.action.into(),
            handler: call.handler.into(),
        };
        let claims = serde_json::to_vec(&claims)
            .map_err(|e| CallTokenError(format!("encoding a call token: {e}")))?;
        let mut token = format!("{}.{}", self.header, b64(&claims));
        let signature = self.key.sign(token.as_bytes());
        token.push('.');
        token.push_str(&b64(&signature.to_bytes()));
        Ok(token)
    }
}

/// The coordinator's public keys, by key id, and the targets (URLs) the coordinator calls this
/// participant by, as a participant holds them.
#[derive(Clone)]
pub struct CallVerifier {
    keys: HashMap<String, ed25519_dalek::VerifyingKey>,
    targets: Vec<String>,
}

impl std::fmt::Debug for CallVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallVerifier")
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .field("targets", &self.targets)
            .finish()
    }
}

impl CallVerifier {
    /// The keys of every `PUBLIC KEY` PEM block in `pem` (one file may hold the old and the
    /// new key while they rotate); tokens must name one of `targets` (the URLs under which
    /// this participant is registered, e.g. `http://inventory:50051`) as their audience.
    pub fn from_pem<S: ToString>(pem: &str, targets: &[S]) -> Result<Self, CallTokenError> {
        if targets.is_empty() {
            return Err(CallTokenError(
                "no target: name the URLs the coordinator calls this participant by".into(),
            ));
        }
        use ed25519_dalek::pkcs8::DecodePublicKey;
        const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
        const END: &str = "-----END PUBLIC KEY-----";
        let mut keys = HashMap::new();
        let mut rest = pem;
        while let Some(start) = rest.find(BEGIN) {
            let end = rest[start..]
                .find(END)
                .ok_or_else(|| CallTokenError("a PUBLIC KEY block is not closed".into()))?
                + start
                + END.len();
            let public = ed25519_dalek::VerifyingKey::from_public_key_pem(&rest[start..end])
                .map_err(|e| {
                    CallTokenError(format!("not an Ed25519 public key in SPKI PEM: {e}"))
                })?;
            keys.insert(key_id(&public), public);
            rest = &rest[end..];
        }
        if keys.is_empty() {
            return Err(CallTokenError(
                "no PUBLIC KEY block: give the coordinator's public key (`openssl pkey -in \
                 signing.pem -pubout`)"
                    .into(),
            ));
        }
        Ok(CallVerifier {
            keys,
            targets: targets.iter().map(ToString::to_string).collect(),
        })
    }

    /// Checks the `x-dtx-call-token` of a branch request (see [`CallVerifier::verify`]).
    pub fn verify_request(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        request: &crate::v1::BranchRequest,
    ) -> Result<(), CallTokenError> {
        let token = metadata
            .get(CALL_TOKEN)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                CallTokenError(format!(
                    "branch call refused: no {CALL_TOKEN} (this participant obeys only the \
                     coordinator, which signs every call)"
                ))
            })?;
        self.verify(token, Call::of(request))
    }

    /// Checks that `token` was signed by one of the keys for exactly `call`, and is current.
    pub fn verify(&self, token: &str, call: Call<'_>) -> Result<(), CallTokenError> {
        let refuse = |why: String| Err(CallTokenError(format!("branch call refused: {why}")));
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return refuse("malformed call token (not three parts)".into());
        };
        let header: JwtHeader =
            match unb64(header_b64).and_then(|h| serde_json::from_slice(&h).ok()) {
                Some(header) => header,
                None => return refuse("malformed call token header".into()),
            };
        if header.alg != "EdDSA" {
            return refuse(format!(
                "the call token's algorithm {:?} is not EdDSA",
                header.alg
            ));
        }
        let Some(key) = header.kid.as_deref().and_then(|kid| self.keys.get(kid)) else {
            return refuse(format!(
                "the call token's key {:?} is not one of the coordinator keys this participant \
                 trusts",
                header.kid.unwrap_or_default()
            ));
        };
        let signature =
            unb64(signature_b64).and_then(|s| ed25519_dalek::Signature::from_slice(&s).ok());
        let signed = &token[..header_b64.len() + 1 + claims_b64.len()];
        let verified = signature.is_some_and(|s| key.verify_strict(signed.as_bytes(), &s).is_ok());
        if !verified {
            return refuse("the call token's signature does not verify".into());
        }
        let Some(claims) =
            unb64(claims_b64).and_then(|c| serde_json::from_slice::<CallClaims>(&c).ok())
        else {
            return refuse("malformed call token claims".into());
        };
        if claims.iss != CALL_ISSUER {
            return refuse(format!(
                "the call token's issuer {:?} is not {CALL_ISSUER}",
                claims.iss
            ));
        }
        if !self.targets.contains(&claims.aud) {
            return refuse(format!(
                "call token not valid for {}: it names {:?}",
                self.targets.join(" or "),
                claims.aud
            ));
        }
        if claims.exp + CALL_LEEWAY_SECS < unix_now() {
            return refuse("the call token expired".into());
        }
        if claims.exp.saturating_sub(claims.iat) > CALL_TOKEN_LIFETIME.as_secs() {
            return refuse(format!(
                "the call token lives longer than {} s",
                CALL_TOKEN_LIFETIME.as_secs()
            ));
        }
        let bound = [
            ("xid", &claims.xid, call.xid),
            ("branch", &claims.branch, call.branch),
            ("action", &claims.action, call.action),
            ("handler", &claims.handler, call.handler),
        ];
        for (what, signed, called) in bound {
            if signed != called {
                return refuse(format!(
                    "the call token was signed for {what} {signed:?}, not {called:?}"
                ));
            }
        }
        Ok(())
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> CallSigner {
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let pem = key.to_pkcs8_pem(Default::default()).unwrap();
        CallSigner::from_pem(&pem).unwrap()
    }

    const TARGET: &str = "http://inventory:50051";

    const CALL: Call<'static> = Call {
        xid: "order-1",
        branch: "b1",
        action: "CONFIRM",
        handler: "reserve",
    };

    #[test]
    fn a_signed_call_verifies_only_for_the_call_it_names() {
        let signer = signer();
        let verifier = CallVerifier::from_pem(signer.public_pem(), &[TARGET]).unwrap();
        let token = signer.sign(TARGET, CALL).unwrap();
        verifier.verify(&token, CALL).unwrap();
        let elsewhere = signer.sign("http://billing:50051", CALL).unwrap();
        assert!(verifier.verify(&elsewhere, CALL).is_err());
        for other in [
            Call {
                xid: "order-2",
                ..CALL
            },
            Call {
                branch: "b2",
                ..CALL
            },
            Call {
                action: "CANCEL",
                ..CALL
            },
            Call {
                handler: "refund",
                ..CALL
            },
        ] {
            let e = verifier.verify(&token, other).unwrap_err();
            assert!(e.0.starts_with("branch call refused"), "{e}");
        }
    }

    #[test]
    fn another_key_or_a_tampered_token_is_refused() {
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let theirs = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
        let forger =
            CallSigner::from_pem(&theirs.to_pkcs8_pem(Default::default()).unwrap()).unwrap();
        let verifier = CallVerifier::from_pem(signer().public_pem(), &[TARGET]).unwrap();
        let e = verifier
            .verify(&forger.sign(TARGET, CALL).unwrap(), CALL)
            .unwrap_err();
        assert!(e.0.contains("not one of the coordinator keys"), "{e}");

        let token = signer().sign(TARGET, CALL).unwrap();
        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        parts[1].push_str("AAAA");
        assert!(verifier.verify(&parts.join("."), CALL).is_err());
        assert!(verifier.verify("not-a-token", CALL).is_err());
    }

    #[test]
    fn a_call_token_is_a_standard_jwt() {
        use ed25519_dalek::pkcs8::EncodePublicKey;
        let signer = signer();
        let token = signer.sign(TARGET, CALL).unwrap();
        let public = ed25519_dalek::SigningKey::from_bytes(&[7; 32])
            .verifying_key()
            .to_public_key_pem(Default::default())
            .unwrap();
        let key = jsonwebtoken::DecodingKey::from_ed_pem(public.as_bytes()).unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        validation.set_audience(&[TARGET]);
        validation.set_issuer(&[CALL_ISSUER]);
        let data = jsonwebtoken::decode::<CallClaims>(&token, &key, &validation).unwrap();
        assert_eq!(data.header.kid.as_deref(), Some(signer.kid()));
        assert_eq!(data.claims.xid, CALL.xid);
        assert_eq!(data.claims.action, "CONFIRM");
    }

    #[test]
    fn a_verifier_holds_every_key_of_a_rotation() {
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let new = ed25519_dalek::SigningKey::from_bytes(&[8; 32]);
        let new = CallSigner::from_pem(&new.to_pkcs8_pem(Default::default()).unwrap()).unwrap();
        let both = format!("{}{}", signer().public_pem(), new.public_pem());
        let verifier = CallVerifier::from_pem(&both, &[TARGET]).unwrap();
        verifier
            .verify(&signer().sign(TARGET, CALL).unwrap(), CALL)
            .unwrap();
        verifier
            .verify(&new.sign(TARGET, CALL).unwrap(), CALL)
            .unwrap();
        assert!(CallVerifier::from_pem("nothing", &[TARGET]).is_err());
    }
}
