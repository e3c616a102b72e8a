//! Idempotency keys: which business intent a request belongs to.
//!
//! A key is `scope` (the operation, or a consumer group) plus `idem_key`, which is built from the
//! tenant/user, a stable business id and a protocol version: `"<tenant>:<business id>:v<n>"`.
//!
//! * The tenant keeps two tenants' equal business ids apart (and one tenant from replaying
//!   another's stored result). Its charset has no `:`, and the version is the last segment, so
//!   the rendering is unambiguous even though business ids may contain `:`.
//! * The operation is the scope so create and cancel of the same business id never share a key,
//!   and so retention windows and statistics can be chosen per operation.
//! * The whole key is at most 128 bytes of `[A-Za-z0-9._:-]`: it fits the unique index, and a
//!   header value from a client can never smuggle anything else into the store.
//!
//! Keys are high-cardinality and may carry business ids: `Debug` shows only the scope and a
//! short fingerprint, and there is no `Display`, so a key is never logged in plain form unless
//! the caller asks for it explicitly ([`Key::idem_key`]).

use std::fmt;

use dtx_proto::limits::{self, LimitError, id_char};
use sha2::{Digest, Sha256};

use crate::Error;

/// Longest scope (operation or consumer group), in bytes.
pub const MAX_SCOPE_LEN: usize = 64;
/// Longest rendered `idem_key`, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Longest tenant, in bytes.
pub const MAX_TENANT_LEN: usize = 64;

const ID_CHARSET: &str = "[A-Za-z0-9._:-]";
const TENANT_CHARSET: &str = "[A-Za-z0-9._-]";

fn tenant_char(c: u8) -> bool {
    id_char(c) && c != b':'
}

/// [`limits::check_token`], optionally accepting an empty value.
fn check(
    field: &str,
    value: &str,
    max: usize,
    allowed: fn(u8) -> bool,
    charset: &str,
    may_be_empty: bool,
) -> Result<(), LimitError> {
    if value.is_empty() && may_be_empty {
        return Ok(());
    }
    limits::check_token(field, value, max, allowed, charset)
}

/// Checks a scope: 1..=64 bytes of `[A-Za-z0-9._:-]`.
pub fn check_scope(scope: &str) -> Result<(), Error> {
    Ok(check(
        "idempotency scope",
        scope,
        MAX_SCOPE_LEN,
        id_char,
        ID_CHARSET,
        false,
    )?)
}

/// Checks a business id (for example a client's `Idempotency-Key` header value) against the
/// key charset and a length limit, before it is combined into a [`Key`].
pub fn check_business_id(business_id: &str, max: usize) -> Result<(), Error> {
    Ok(check(
        "idempotency business id",
        business_id,
        max,
        id_char,
        ID_CHARSET,
        false,
    )?)
}

/// One business intent: scope + tenant + stable business id + version.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    scope: String,
    idem_key: String,
    tenant_len: usize,
    business_len: usize,
    version: u32,
}

/// Builds a [`Key`]; see [`Key::builder`].
#[derive(Clone)]
pub struct KeyBuilder {
    scope: String,
    tenant: String,
    business_id: String,
    version: u32,
}

impl KeyBuilder {
    /// The tenant or user the intent belongs to (none by default). `[A-Za-z0-9._-]`, at most
    /// 64 bytes. Take it from authentication, never from the request body.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }

    /// The stable business id: chosen once when the intent starts and kept across every retry
    /// (an order request number, a payment provider's trade number, an event id). Never a
    /// trace id, which changes per attempt.
    pub fn business_id(mut self, id: impl Into<String>) -> Self {
        self.business_id = id.into();
        self
    }

    /// The protocol version (default 1): bump it when the meaning of a request changes so old
    /// records no longer answer new requests (for consumers: the handler version).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Validates the parts and renders the key.
    pub fn build(self) -> Result<Key, Error> {
        check_scope(&self.scope)?;
        check(
            "idempotency tenant",
            &self.tenant,
            MAX_TENANT_LEN,
            tenant_char,
            TENANT_CHARSET,
            true,
        )?;
        check_business_id(&self.business_id, MAX_KEY_LEN)?;
        let idem_key = format!("{}:{}:v{}", self.tenant, self.business_id, self.version);
        if idem_key.len() > MAX_KEY_LEN {
            return Err(LimitError(format!(
                "idempotency key (tenant, business id and version) is {} bytes, longer than the \
                 limit of {MAX_KEY_LEN} bytes",
                idem_key.len()
            ))
            .into());
        }
        Ok(Key {
            scope: self.scope,
            tenant_len: self.tenant.len(),
            business_len: self.business_id.len(),
            version: self.version,
            idem_key,
        })
    }
}

impl Key {
    /// Starts a key for `scope`: the operation (`"order.create"`,
    /// `"payment-callback.provider-a"`) or, for consumers, the consumer group.
    pub fn builder(scope: impl Into<String>) -> KeyBuilder {
        KeyBuilder {
            scope: scope.into(),
            tenant: String::new(),
            business_id: String::new(),
            version: 1,
        }
    }

    /// Re-creates a key from its stored columns (recovery sweeps read keys back).
    pub fn from_stored(scope: &str, idem_key: &str) -> Result<Key, Error> {
        let malformed = || Error::Corrupt(format!("stored idem_key {idem_key:?} is malformed"));
        let (tenant, rest) = idem_key.split_once(':').ok_or_else(malformed)?;
        let (business_id, version) = rest.rsplit_once(':').ok_or_else(malformed)?;
        let version = version
            .strip_prefix('v')
            .and_then(|v| v.parse().ok())
            .ok_or_else(malformed)?;
        Key::builder(scope)
            .tenant(tenant)
            .business_id(business_id)
            .version(version)
            .build()
    }

    /// The key's scope (an operation: `create-order`).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The tenant the key belongs to.
    pub fn tenant(&self) -> &str {
        &self.idem_key[..self.tenant_len]
    }

    /// The business id; fact checks use it to look the business effect up.
    pub fn business_id(&self) -> &str {
        &self.idem_key[self.tenant_len + 1..self.tenant_len + 1 + self.business_len]
    }

    /// The key format's version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The stored `idem_key` column in plain form. Deliberately not `Display`: log
    /// [`Key::fingerprint`] instead unless you decided the plain key may appear.
    pub fn idem_key(&self) -> &str {
        &self.idem_key
    }

    /// A short, stable, non-reversible tag of the key for logs and traces (12 hex digits of
    /// SHA-256 over scope and key). Still high-cardinality: never a metric label.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.scope.as_bytes());
        hasher.update([0]);
        hasher.update(self.idem_key.as_bytes());
        hex::encode(&hasher.finalize()[..6])
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("scope", &self.scope)
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, id: &str, version: u32) -> Result<Key, Error> {
        Key::builder("order.create")
            .tenant(tenant)
            .business_id(id)
            .version(version)
            .build()
    }

    #[test]
    fn renders_tenant_business_id_and_version() {
        let k = key("tenant-10", "R1001", 1).unwrap();
        assert_eq!(k.scope(), "order.create");
        assert_eq!(k.idem_key(), "tenant-10:R1001:v1");
        assert_eq!(k.tenant(), "tenant-10");
        assert_eq!(k.business_id(), "R1001");
        assert_eq!(k.version(), 1);
        let no_tenant = Key::builder("s").business_id("a:b").build().unwrap();
        assert_eq!(no_tenant.idem_key(), ":a:b:v1");
        assert_eq!(no_tenant.business_id(), "a:b");
    }

    #[test]
    fn stored_keys_parse_back_even_with_colons_in_the_business_id() {
        let k = key("t", "provider-a:trade-7788", 3).unwrap();
        let back = Key::from_stored("order.create", k.idem_key()).unwrap();
        assert_eq!(back, k);
        assert_eq!(back.business_id(), "provider-a:trade-7788");
        assert!(Key::from_stored("s", "no-version").is_err());
        assert!(Key::from_stored("s", "t:id:vx").is_err());
    }

    #[test]
    fn tenants_keep_equal_business_ids_apart() {
        assert_ne!(
            key("a", "R1", 1).unwrap().idem_key(),
            key("b", "R1", 1).unwrap().idem_key()
        );
        // A tenant cannot contain ':' so "a:b"+"c" cannot collide with "a"+"b:c".
        assert!(key("a:b", "c", 1).is_err());
        assert_eq!(key("a", "b:c", 1).unwrap().idem_key(), "a:b:c:v1");
    }

    #[test]
    fn length_and_charset_are_validated() {
        let err = key("t", &"x".repeat(129), 1).unwrap_err().to_string();
        assert!(err.contains("limit of 128 bytes"), "{err}");
        // Each part fits, the rendering does not.
        let err = key(&"t".repeat(60), &"x".repeat(70), 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("limit of 128 bytes"), "{err}");
        let err = key("t", "has space", 1).unwrap_err().to_string();
        assert!(err.contains("charset"), "{err}");
        assert!(key("t", "", 1).is_err());
        assert!(key("t", "ü", 1).is_err());
        assert!(Key::builder("").business_id("x").build().is_err());
        assert!(
            Key::builder("x".repeat(65))
                .business_id("x")
                .build()
                .is_err()
        );
        // Exactly 128 bytes is accepted.
        let id = "x".repeat(128 - ":".len() - ":v1".len());
        assert_eq!(key("", &id, 1).unwrap().idem_key().len(), 128);
    }

    #[test]
    fn debug_never_shows_the_plain_key() {
        let k = key("tenant-10", "secret-order-4711", 1).unwrap();
        let shown = format!("{k:?}");
        assert!(!shown.contains("secret-order-4711"), "{shown}");
        assert!(!shown.contains("tenant-10"), "{shown}");
        assert!(shown.contains(&k.fingerprint()), "{shown}");
        assert_eq!(k.fingerprint().len(), 12);
        assert_ne!(
            k.fingerprint(),
            key("tenant-10", "other", 1).unwrap().fingerprint()
        );
    }
}
