//! Who may call: every Coordinator and Admin RPC is checked here before anything is read or
//! stored. A caller's bearer token is a JWT verified against the keys of a JWKS file, or an
//! opaque token found by its SHA-256 in a token file (which stores no token itself); either way
//! it names a subject, a tenant and roles, and [`RPC_ROLES`] - the one table - says which roles
//! may call which RPC. With neither file configured, auth is off: every caller is an anonymous
//! member of every role in the default tenant (the README's local run).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use tonic::Status;
use tonic::metadata::MetadataMap;

pub use dtx_proto::limits::DEFAULT_TENANT;

/// The operator name recorded when auth is off and a request names none.
pub const ANONYMOUS: &str = "anonymous";

/// The metadata key naming the operator of an action when auth is off (with auth on, the
/// operator is the token's subject and this header is ignored).
pub use dtx_proto::auth::OPERATOR as OPERATOR_HEADER;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Starts and decides its tenant's transactions and reads them.
    Initiator,
    /// Every Admin action, and the reads.
    Operator,
    /// Admin reads and Get.
    Reader,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Initiator, Role::Operator, Role::Reader];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Initiator => "initiator",
            Role::Operator => "operator",
            Role::Reader => "reader",
        }
    }

    fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

use Role::{Initiator, Operator, Reader};

/// Every RPC of the contract (`service/Method`) and the roles that may call it. A test checks
/// that each RPC of the proto is here; an RPC missing from it is refused to everyone.
pub const RPC_ROLES: &[(&str, &[Role])] = &[
    ("dtx.v1.Coordinator/Begin", &[Initiator]),
    ("dtx.v1.Coordinator/RegisterBranch", &[Initiator]),
    ("dtx.v1.Coordinator/Commit", &[Initiator]),
    ("dtx.v1.Coordinator/Rollback", &[Initiator]),
    ("dtx.v1.Coordinator/SubmitSaga", &[Initiator]),
    ("dtx.v1.Coordinator/Get", &[Initiator, Reader, Operator]),
    ("dtx.v1.Coordinator/Wait", &[Initiator]),
    ("dtx.v1.Coordinator/Resume", &[Operator]),
    ("dtx.v1.Coordinator/PrepareMessage", &[Initiator]),
    ("dtx.v1.Coordinator/SubmitMessage", &[Initiator]),
    ("dtx.v1.Coordinator/AbortMessage", &[Initiator]),
    ("dtx.v1.Admin/ListTransactions", &[Reader, Operator]),
    ("dtx.v1.Admin/DescribeTransaction", &[Reader, Operator]),
    ("dtx.v1.Admin/Stats", &[Reader, Operator]),
    ("dtx.v1.Admin/Resume", &[Operator]),
    ("dtx.v1.Admin/ForceRollback", &[Operator]),
    ("dtx.v1.Admin/RetryNow", &[Operator]),
    // Not an RPC: the web console's pages (reads) and its actions.
    (CONSOLE_READ, &[Reader, Operator]),
    (CONSOLE_ACT, &[Operator]),
];

/// The console's pages, in [`RPC_ROLES`].
pub const CONSOLE_READ: &str = "console/read";
/// The console's operator actions, in [`RPC_ROLES`].
pub const CONSOLE_ACT: &str = "console/act";

/// The roles that may call `rpc` (none for an RPC not in the table).
pub fn roles_for(rpc: &str) -> &'static [Role] {
    RPC_ROLES
        .iter()
        .find(|(name, _)| *name == rpc)
        .map_or(&[], |(_, roles)| roles)
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's subject; with auth off, the operator header's name or [`ANONYMOUS`].
    pub subject: String,
    pub tenant: String,
    pub roles: Vec<Role>,
    /// False with auth off (nothing was checked; the subject is whatever the caller says).
    pub authenticated: bool,
}

impl Caller {
    /// The stored key of this caller's transaction `xid` (its tenant's scope); the key is
    /// also the xid participants see.
    pub fn scope(&self, xid: &str) -> Result<String, Status> {
        dtx_proto::limits::scoped_xid(&self.tenant, xid)
            .map_err(|e| Reason::InvalidRequest.status(e.0))
    }

    /// `xid`, or a fresh one when empty, and its stored key.
    pub fn scope_or_new(&self, xid: String) -> Result<(String, String), Status> {
        let xid = match xid.is_empty() {
            true => uuid::Uuid::new_v4().to_string(),
            false => xid,
        };
        let key = self.scope(&xid)?;
        Ok((xid, key))
    }
}

/// Checks a caller's token (or lets everyone in, when off). Cheap to clone; the keys are
/// swapped whole when their files change.
#[derive(Clone, Default)]
pub struct Auth {
    keys: Option<Arc<RwLock<Arc<Keys>>>>,
    files: AuthFiles,
}

/// Where the keys come from.
#[derive(Debug, Clone, Default)]
pub struct AuthFiles {
    /// A JWKS file (`{"keys": [...]}`) with the public keys JWTs are signed with.
    pub jwks: Option<PathBuf>,
    /// Lines of `<sha256 hex of the token> <subject> <tenant> <role,role...>`.
    pub tokens: Option<PathBuf>,
    /// The JWTs' required `iss`.
    pub issuer: Option<String>,
    /// The JWTs' required `aud`.
    pub audience: String,
}

impl AuthFiles {
    pub fn enabled(&self) -> bool {
        self.jwks.is_some() || self.tokens.is_some()
    }

    /// The files to watch for changes.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.jwks.iter().chain(&self.tokens).cloned().collect()
    }
}

/// The keys read from [`AuthFiles`].
struct Keys {
    /// Key id to key and algorithm; a key without `kid` is under "".
    jwks: HashMap<String, (DecodingKey, Algorithm)>,
    /// SHA-256 (hex) of a token to who holds it.
    tokens: HashMap<String, Caller>,
    /// JWTs already verified with these keys, until their `exp`: callers send the same token
    /// with every call, and a signature check costs more than the rest of a Get. Replaced with
    /// the keys on a reload.
    verified: RwLock<HashMap<String, (Caller, u64)>>,
}

/// Most verified JWTs remembered; past it the memory starts over.
const MAX_VERIFIED: usize = 4096;

/// A JWT's claims (the registered ones are checked by `jsonwebtoken`).
#[derive(serde::Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
}

impl Auth {
    /// Auth off: everyone may call everything, in the default tenant.
    pub fn off() -> Auth {
        Auth::default()
    }

    /// Reads the files; fails with a sentence naming the file and what is wrong.
    pub fn load(files: AuthFiles) -> Result<Auth, String> {
        if !files.enabled() {
            return Ok(Auth::off());
        }
        if files.jwks.is_some() && files.issuer.is_none() {
            return Err(
                "--auth-jwks needs --auth-issuer (the issuer every token must name)".into(),
            );
        }
        let keys = Keys::read(&files)?;
        Ok(Auth {
            keys: Some(Arc::new(RwLock::new(Arc::new(keys)))),
            files,
        })
    }

    pub fn enabled(&self) -> bool {
        self.keys.is_some()
    }

    pub fn files(&self) -> &AuthFiles {
        &self.files
    }

    /// Re-reads the files; on an error the keys in use stay.
    pub fn reload(&self) -> Result<(), String> {
        if let Some(keys) = &self.keys {
            let fresh = Keys::read(&self.files)?;
            *keys.write().expect("auth keys") = Arc::new(fresh);
        }
        Ok(())
    }

    /// The caller of `rpc`: UNAUTHENTICATED without a valid token, PERMISSION_DENIED when none
    /// of its roles may call `rpc`.
    pub fn caller(&self, metadata: &MetadataMap, rpc: &str) -> Result<Caller, Status> {
        let caller = self.authenticate(metadata)?;
        authorize(&caller, rpc)?;
        Ok(caller)
    }

    /// The caller a token names, without the role check.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Caller, Status> {
        let Some(keys) = &self.keys else {
            return anonymous(metadata);
        };
        let Some(token) = dtx_proto::auth::bearer(metadata) else {
            return Err(Reason::Unauthenticated
                .status("no bearer token: send the header `authorization: Bearer <token>`"));
        };
        self.verify(&keys.read().expect("auth keys").clone(), token)
    }

    /// The caller a token (a console session's, say) names.
    pub fn verify_token(&self, token: &str) -> Result<Caller, Status> {
        match &self.keys {
            Some(keys) => self.verify(&keys.read().expect("auth keys").clone(), token),
            None => anonymous(&MetadataMap::new()),
        }
    }

    fn verify(&self, keys: &Keys, token: &str) -> Result<Caller, Status> {
        if let Some(caller) = keys.tokens.get(&token_hash(token)) {
            return Ok(caller.clone());
        }
        if token.matches('.').count() != 2 || keys.jwks.is_empty() {
            return Err(Reason::Unauthenticated.status("unknown bearer token"));
        }
        let now = jsonwebtoken::get_current_timestamp();
        if let Some((caller, exp)) = keys.verified.read().expect("verified").get(token)
            && now < *exp
        {
            return Ok(caller.clone());
        }
        let bad =
            |why: String| Reason::Unauthenticated.status(format!("bearer token refused: {why}"));
        let header = jsonwebtoken::decode_header(token).map_err(|e| bad(e.to_string()))?;
        let kid = header.kid.clone().unwrap_or_default();
        let (key, alg) = keys
            .jwks
            .get(&kid)
            .ok_or_else(|| bad(format!("no key {kid:?} in --auth-jwks")))?;
        let mut validation = Validation::new(*alg);
        validation.validate_nbf = true;
        validation.set_audience(&[&self.files.audience]);
        if let Some(issuer) = &self.files.issuer {
            validation.set_issuer(&[issuer]);
        }
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        let claims = jsonwebtoken::decode::<Claims>(token, key, &validation)
            .map_err(|e| bad(e.to_string()))?
            .claims;
        let tenant = claims.tenant.unwrap_or_else(|| DEFAULT_TENANT.into());
        check_tenant(&tenant).map_err(bad)?;
        let caller = Caller {
            subject: claims.sub,
            tenant,
            roles: claims.roles.iter().filter_map(|r| Role::parse(r)).collect(),
            authenticated: true,
        };
        let mut verified = keys.verified.write().expect("verified");
        if verified.len() >= MAX_VERIFIED {
            verified.clear();
        }
        verified.insert(token.to_string(), (caller.clone(), claims.exp));
        Ok(caller)
    }
}

/// With auth off: every role, the default tenant, the operator header's name.
fn anonymous(metadata: &MetadataMap) -> Result<Caller, Status> {
    let subject = match metadata.get(OPERATOR_HEADER) {
        None => ANONYMOUS.to_string(),
        Some(value) => {
            let name = value.to_str().map_err(|_| {
                Reason::InvalidRequest.status(format!("{OPERATOR_HEADER} is not ASCII text"))
            })?;
            dtx_proto::limits::check_operator(OPERATOR_HEADER, name)
                .map_err(|e| Reason::InvalidRequest.status(e.0))?;
            name.to_string()
        }
    };
    Ok(Caller {
        subject,
        tenant: DEFAULT_TENANT.into(),
        roles: Role::ALL.to_vec(),
        authenticated: false,
    })
}

/// PERMISSION_DENIED unless one of the caller's roles may call `rpc`.
pub fn authorize(caller: &Caller, rpc: &str) -> Result<(), Status> {
    let allowed = roles_for(rpc);
    if caller.roles.iter().any(|r| allowed.contains(r)) {
        return Ok(());
    }
    let names = |roles: &[Role]| {
        roles
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(Reason::RoleDenied.status(format!(
        "{rpc} needs the role {}; {} has {}",
        if allowed.is_empty() {
            "(none: not callable)".to_string()
        } else {
            names(allowed)
        },
        caller.subject,
        if caller.roles.is_empty() {
            "none".to_string()
        } else {
            names(&caller.roles)
        }
    )))
}

/// A tenant name, as the contract limits it.
pub fn check_tenant(tenant: &str) -> Result<(), String> {
    dtx_proto::limits::check_tenant(tenant).map_err(|e| e.0)
}

use dtx_proto::auth::token_hash;
use dtx_proto::reason::Reason;

/// A new random opaque token and its token-file line.
pub fn new_token(subject: &str, tenant: &str, roles: &[Role]) -> (String, String) {
    let roles: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    dtx_proto::auth::new_token(subject, tenant, &roles)
}

impl Keys {
    fn read(files: &AuthFiles) -> Result<Keys, String> {
        let mut keys = Keys {
            jwks: HashMap::new(),
            tokens: HashMap::new(),
            verified: RwLock::default(),
        };
        if let Some(path) = &files.jwks {
            let text = read(path, "--auth-jwks")?;
            let set: JwkSet = serde_json::from_str(&text)
                .map_err(|e| format!("--auth-jwks {}: not a JWKS: {e}", path.display()))?;
            for jwk in &set.keys {
                let kid = jwk.common.key_id.clone().unwrap_or_default();
                let alg = jwk
                    .common
                    .key_algorithm
                    .and_then(|a| a.to_string().parse::<Algorithm>().ok())
                    .or(match &jwk.algorithm {
                        jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
                        jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => {
                            Some(Algorithm::ES256)
                        }
                        jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(_) => {
                            Some(Algorithm::EdDSA)
                        }
                        jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_) => None,
                    })
                    .filter(|a| {
                        !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
                    })
                    .ok_or_else(|| {
                        format!(
                            "--auth-jwks {}: key {kid:?} is not a public key (RSA, EC or \
                             OKP): shared secrets are not accepted",
                            path.display()
                        )
                    })?;
                let key = DecodingKey::from_jwk(jwk)
                    .map_err(|e| format!("--auth-jwks {}: key {kid:?}: {e}", path.display()))?;
                keys.jwks.insert(kid, (key, alg));
            }
            if keys.jwks.is_empty() {
                return Err(format!("--auth-jwks {}: no keys", path.display()));
            }
        }
        if let Some(path) = &files.tokens {
            let text = read(path, "--auth-tokens")?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let at = |why: String| format!("--auth-tokens {}:{}: {why}", path.display(), n + 1);
                let fields: Vec<&str> = line.split_whitespace().collect();
                let [hash, subject, tenant, roles] = fields[..] else {
                    return Err(at(
                        "expected `<sha256 hex> <subject> <tenant> <role,role...>`".into(),
                    ));
                };
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(at("the first field is not a SHA-256 in hex".into()));
                }
                check_tenant(tenant).map_err(at)?;
                let roles = roles
                    .split(',')
                    .map(|r| {
                        Role::parse(r).ok_or_else(|| {
                            at(format!(
                                "unknown role {r:?} (initiator, operator or reader)"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                keys.tokens.insert(
                    hash.to_ascii_lowercase(),
                    Caller {
                        subject: subject.into(),
                        tenant: tenant.into(),
                        roles,
                        authenticated: true,
                    },
                );
            }
        }
        Ok(keys)
    }
}

fn read(path: &PathBuf, flag: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(
            "authorization",
            dtx_proto::auth::bearer_value(token).unwrap(),
        );
        m
    }

    #[test]
    fn every_rpc_of_the_contract_is_in_the_role_table() {
        use prost::Message;
        let set =
            prost_types::FileDescriptorSet::decode(dtx_proto::v1::FILE_DESCRIPTOR_SET).unwrap();
        let mut rpcs = Vec::new();
        for file in &set.file {
            for service in &file.service {
                let name = service.name();
                if name == "Participant" {
                    continue; // called by the coordinator, checked by the participant server
                }
                for method in &service.method {
                    rpcs.push(format!("dtx.v1.{name}/{}", method.name()));
                }
            }
        }
        assert_eq!(rpcs.len(), 17, "{rpcs:?}");
        for rpc in &rpcs {
            assert!(!roles_for(rpc).is_empty(), "{rpc} is not in RPC_ROLES");
        }
        let tabled = RPC_ROLES
            .iter()
            .filter(|(n, _)| n.starts_with("dtx."))
            .count();
        assert_eq!(tabled, rpcs.len(), "RPC_ROLES names an RPC the proto lacks");
    }

    #[test]
    fn a_token_file_names_the_caller_and_the_roles_decide() {
        let dir = tempfile::tempdir().unwrap();
        let (token, line) = new_token("orders", "acme", &[Role::Initiator]);
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("# who may call\n{line}\n")).unwrap();
        assert!(!std::fs::read_to_string(&path).unwrap().contains(&token));
        let auth = Auth::load(AuthFiles {
            tokens: Some(path),
            ..AuthFiles::default()
        })
        .unwrap();
        let caller = auth
            .caller(&with_token(&token), "dtx.v1.Coordinator/Begin")
            .unwrap();
        assert_eq!(caller.subject, "orders");
        assert_eq!(caller.tenant, "acme");
        let denied = auth
            .caller(&with_token(&token), "dtx.v1.Admin/ForceRollback")
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(
            denied.message().contains("needs the role operator"),
            "{denied:?}"
        );
        for metadata in [MetadataMap::new(), with_token("dtx_guess")] {
            let e = auth
                .caller(&metadata, "dtx.v1.Coordinator/Get")
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn a_bad_token_file_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("{} me acme admin\n", "ab".repeat(32))).unwrap();
        let e = Auth::load(AuthFiles {
            tokens: Some(path),
            ..AuthFiles::default()
        })
        .err()
        .unwrap();
        assert!(e.contains(":1: unknown role \"admin\""), "{e}");
    }

    #[test]
    fn with_auth_off_everyone_is_an_anonymous_member_of_every_role() {
        let caller = Auth::off()
            .caller(&MetadataMap::new(), "dtx.v1.Admin/ForceRollback")
            .unwrap();
        assert_eq!(caller.subject, ANONYMOUS);
        assert_eq!(caller.tenant, DEFAULT_TENANT);
    }

    #[test]
    fn tenant_names() {
        assert!(check_tenant("acme-eu.1").is_ok());
        assert!(check_tenant("").is_err());
        assert!(check_tenant("a/b").is_err());
        assert!(check_tenant(&"a".repeat(33)).is_err());
    }
}
