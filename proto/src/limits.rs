//! Input limits of the wire contract (see the header of `dtx.proto`).
//!
//! Each check returns a [`LimitError`] whose message names the field and the limit, so a caller
//! who hits one knows what to change. The coordinator answers these with `INVALID_ARGUMENT`.

use std::collections::BTreeMap;
use std::time::Duration;

/// Longest accepted global transaction id, in bytes.
pub const MAX_XID_LEN: usize = 128;
/// Longest accepted branch id or saga step name, in bytes.
pub const MAX_BRANCH_ID_LEN: usize = 64;
/// Longest accepted handler name, in bytes.
pub const MAX_HANDLER_LEN: usize = 128;
/// Longest accepted participant target URI, in bytes.
pub const MAX_TARGET_LEN: usize = 512;
/// Largest accepted payload or result, in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Most headers per call.
pub const MAX_HEADERS: usize = 32;
/// Longest header key, in bytes.
pub const MAX_HEADER_KEY_LEN: usize = 64;
/// Longest header value, in bytes.
pub const MAX_HEADER_VALUE_LEN: usize = 1024;
/// Most branches in one TCC transaction, and most steps in one saga.
pub const MAX_BRANCHES: usize = 64;
/// Longest transaction or saga timeout.
pub const MAX_TX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Transaction timeout used when a request says 0.
pub const DEFAULT_TX_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest per-call timeout.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Per-call timeout used when a request says 0.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest long-poll wait.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Largest content of a header map within the limits.
const MAX_HEADERS_BYTES: usize = MAX_HEADERS * (MAX_HEADER_KEY_LEN + MAX_HEADER_VALUE_LEN);
/// Largest content of one saga step within the limits: name, target, handler, both payloads,
/// a dependency on every other step, headers.
const MAX_STEP_BYTES: usize = MAX_BRANCH_ID_LEN
    + MAX_TARGET_LEN
    + MAX_HANDLER_LEN
    + 2 * MAX_PAYLOAD_BYTES
    + MAX_BRANCHES * MAX_BRANCH_ID_LEN
    + MAX_HEADERS_BYTES;
/// Largest encoded request the servers decode (about 11.5 MiB): the largest saga the limits
/// allow (64 largest steps, saga headers) plus 1 MiB for protobuf framing. The headroom also
/// lets a request somewhat over a field limit decode, so it gets that field's message; one over
/// this size is refused before it is buffered, with a message naming the contract's limits.
pub const MAX_REQUEST_BYTES: usize =
    MAX_BRANCHES * MAX_STEP_BYTES + MAX_HEADERS_BYTES + MAX_XID_LEN + (1 << 20);

/// Most items in one `Participant.BranchBatch` call.
pub const MAX_BATCH_ITEMS: usize = 64;
// A batch of the largest items (ids, handler, payload, headers, a call token) still decodes.
const _: () = assert!(
    MAX_BATCH_ITEMS
        * (MAX_XID_LEN
            + MAX_BRANCH_ID_LEN
            + MAX_HANDLER_LEN
            + MAX_PAYLOAD_BYTES
            + MAX_HEADERS_BYTES
            + 2048)
        < MAX_REQUEST_BYTES
);

/// An input outside the contract's limits. The message names the field and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(pub String);

/// The id charset `[A-Za-z0-9._:-]`.
pub fn id_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-')
}

/// Checks `value` is 1..=`max` bytes of the charset `allowed` (described as `charset` in the
/// error message).
pub fn check_token(
    field: &str,
    value: &str,
    max: usize,
    allowed: fn(u8) -> bool,
    charset: &str,
) -> Result<(), LimitError> {
    if value.is_empty() {
        return Err(LimitError(format!("{field} must not be empty")));
    }
    if value.len() > max {
        return Err(LimitError(format!(
            "{field} is {} bytes, longer than the limit of {max} bytes",
            value.len()
        )));
    }
    // By character, not byte: a non-ASCII character is named as itself ('é', not 'Ã').
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii() && allowed(*c as u8))) {
        return Err(LimitError(format!(
            "{field} contains {bad:?}, outside the allowed charset {charset}"
        )));
    }
    Ok(())
}

/// A global transaction id: 1..=128 bytes of `[A-Za-z0-9._:-]`.
pub fn check_xid(xid: &str) -> Result<(), LimitError> {
    check_token("xid", xid, MAX_XID_LEN, id_char, "[A-Za-z0-9._:-]")
}

/// The tenant of callers whose token names none (and of everyone when auth is off). Its
/// transactions' xids reach participants as they are; another tenant's as `tenant/xid`.
pub const DEFAULT_TENANT: &str = "default";

/// Longest tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 32;

/// A tenant name: 1..=32 bytes of `[A-Za-z0-9._-]` (no `:` or `/`).
pub fn check_tenant(tenant: &str) -> Result<(), LimitError> {
    check_token(
        "tenant",
        tenant,
        MAX_TENANT_LEN,
        |c| id_char(c) && c != b':',
        "[A-Za-z0-9._-]",
    )
}

/// The xid of `tenant`'s transaction `xid` as the coordinator stores it and participants see it
/// (their barrier keys): `xid` itself in the default tenant, `tenant/xid` in another, so two
/// tenants may use the same xid. Together at most 128 bytes.
pub fn scoped_xid(tenant: &str, xid: &str) -> Result<String, LimitError> {
    check_xid(xid)?;
    if tenant == DEFAULT_TENANT {
        return Ok(xid.to_string());
    }
    check_tenant(tenant)?;
    let scoped = format!("{tenant}/{xid}");
    if scoped.len() > MAX_XID_LEN {
        return Err(LimitError(format!(
            "xid is {} bytes; in tenant {tenant:?} it is stored as {tenant:?}/xid, which must be \
             at most {MAX_XID_LEN} bytes, so this tenant's xids are limited to {} bytes",
            xid.len(),
            MAX_XID_LEN - tenant.len() - 1
        )));
    }
    Ok(scoped)
}

/// The tenant and the caller's xid of a scoped xid (see [`scoped_xid`]).
pub fn unscoped(scoped: &str) -> (&str, &str) {
    scoped.split_once('/').unwrap_or((DEFAULT_TENANT, scoped))
}

/// A scoped xid as participants receive it: `xid` or `tenant/xid`, at most 128 bytes.
pub fn check_scoped_xid(scoped: &str) -> Result<(), LimitError> {
    let (tenant, xid) = unscoped(scoped);
    if scoped.len() > MAX_XID_LEN {
        return check_xid(scoped);
    }
    check_tenant(tenant)?;
    check_xid(xid)
}

/// Longest operator name (`x-dtx-operator` metadata) of an admin action, in bytes.
pub const MAX_OPERATOR_LEN: usize = 128;
/// Longest reason of an admin action, in bytes.
pub const MAX_REASON_LEN: usize = 512;
/// Largest page of `Admin.ListTransactions`.
pub const MAX_LIST_LIMIT: u32 = 500;
/// Page size of `Admin.ListTransactions` when the request sets none.
pub const DEFAULT_LIST_LIMIT: u32 = 50;

/// An operator name: 1..=128 bytes of `[A-Za-z0-9._:@-]`.
pub fn check_operator(field: &str, name: &str) -> Result<(), LimitError> {
    check_token(
        field,
        name,
        MAX_OPERATOR_LEN,
        |c| id_char(c) || c == b'@',
        "[A-Za-z0-9._:@-]",
    )
}

/// An admin action's reason: 1..=512 bytes of text without control characters.
pub fn check_reason(field: &str, reason: &str) -> Result<(), LimitError> {
    if reason.trim().is_empty() {
        return Err(LimitError(format!("{field} must not be empty: say why")));
    }
    if reason.len() > MAX_REASON_LEN {
        return Err(LimitError(format!(
            "{field} is {} bytes, longer than the limit of {MAX_REASON_LEN} bytes",
            reason.len()
        )));
    }
    if let Some(bad) = reason.chars().find(|c| c.is_control()) {
        return Err(LimitError(format!(
            "{field} contains the control character {bad:?}"
        )));
    }
    Ok(())
}

/// A branch id or saga step name: 1..=64 bytes of `[A-Za-z0-9._:-]`.
pub fn check_branch_id(field: &str, id: &str) -> Result<(), LimitError> {
    check_token(field, id, MAX_BRANCH_ID_LEN, id_char, "[A-Za-z0-9._:-]")
}

/// A handler name: 1..=128 bytes of `[A-Za-z0-9._:/-]`.
pub fn check_handler(field: &str, handler: &str) -> Result<(), LimitError> {
    check_token(
        field,
        handler,
        MAX_HANDLER_LEN,
        |c| id_char(c) || c == b'/',
        "[A-Za-z0-9._:/-]",
    )
}

/// A participant target: an absolute `http://` or `https://` URI of at most 512 bytes.
pub fn check_target(field: &str, target: &str) -> Result<(), LimitError> {
    if target.is_empty() {
        return Err(LimitError(format!("{field} must not be empty")));
    }
    if target.len() > MAX_TARGET_LEN {
        return Err(LimitError(format!(
            "{field} is {} bytes, longer than the limit of {MAX_TARGET_LEN} bytes",
            target.len()
        )));
    }
    let uri: http::Uri = target
        .parse()
        .map_err(|e| LimitError(format!("{field} {target:?} is not a URI: {e}")))?;
    let Some(authority) = uri
        .authority()
        .filter(|_| matches!(uri.scheme_str(), Some("http" | "https")))
    else {
        return Err(LimitError(format!(
            "{field} {target:?} must be an absolute http:// or https:// URI"
        )));
    };
    // Credentials in a target would be stored, shown by Get and the console, and logged.
    if authority.as_str().contains('@') {
        return Err(LimitError(format!(
            "{field} must not carry credentials (user:password@): targets are stored and shown \
             in plain text; authenticate participants another way"
        )));
    }
    // A port the call can never reach would be retried forever: refuse it where it enters.
    if let Some(port) = authority.as_str().rsplit_once(':').map(|(_, p)| p)
        && !authority.as_str().ends_with(']')
        && !matches!(port.parse::<u16>(), Ok(1..))
    {
        return Err(LimitError(format!(
            "{field} {target:?} has port {port:?}; a port is 1 to 65535"
        )));
    }
    Ok(())
}

/// How the coordinator calls a participant target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `http(s)://host:port`: the `dtx.v1.Participant` gRPC service.
    Grpc,
    /// `http(s)://host:port/path`: a JSON POST of the `BranchRequest` to that path, answered
    /// with a `BranchResponse` in JSON (for services without gRPC).
    HttpJson,
}

/// The transport of a target that passed [`check_target`]: a path selects HTTP/JSON.
pub fn transport_of(target: &str) -> Transport {
    match target.parse::<http::Uri>() {
        Ok(uri) if !matches!(uri.path(), "" | "/") => Transport::HttpJson,
        _ => Transport::Grpc,
    }
}

/// A payload or result: at most 64 KiB.
pub fn check_payload(field: &str, payload: &[u8]) -> Result<(), LimitError> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(LimitError(format!(
            "{field} is {} bytes, larger than the limit of {MAX_PAYLOAD_BYTES} bytes",
            payload.len()
        )));
    }
    Ok(())
}

/// Headers: at most 32, keys 1..=64 bytes of `[A-Za-z0-9._-]`, values at most 1024 bytes.
pub fn check_headers(field: &str, headers: &BTreeMap<String, String>) -> Result<(), LimitError> {
    if headers.len() > MAX_HEADERS {
        return Err(LimitError(format!(
            "{field} has {} entries, more than the limit of {MAX_HEADERS}",
            headers.len()
        )));
    }
    for (key, value) in headers {
        check_token(
            &format!("{field} key"),
            key,
            MAX_HEADER_KEY_LEN,
            |c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'),
            "[A-Za-z0-9._-]",
        )?;
        if value.len() > MAX_HEADER_VALUE_LEN {
            return Err(LimitError(format!(
                "{field} value of {key:?} is {} bytes, longer than the limit of {MAX_HEADER_VALUE_LEN} bytes",
                value.len()
            )));
        }
    }
    Ok(())
}

/// Resolves a timeout given in milliseconds: 0 means `default`, otherwise 1 ms ..= `max`.
pub fn timeout(
    field: &str,
    millis: u64,
    default: Duration,
    max: Duration,
) -> Result<Duration, LimitError> {
    if millis == 0 {
        return Ok(default);
    }
    let value = Duration::from_millis(millis);
    if value > max {
        return Err(LimitError(format!(
            "{field} is {millis} ms, longer than the limit of {} ms",
            max.as_millis()
        )));
    }
    Ok(value)
}

/// The number of branches or steps: at most 64.
pub fn check_branch_count(field: &str, count: usize) -> Result<(), LimitError> {
    if count > MAX_BRANCHES {
        return Err(LimitError(format!(
            "{field}: {count} is more than the limit of {MAX_BRANCHES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_for_length_and_charset() {
        assert_eq!(scoped_xid(DEFAULT_TENANT, "o-1").unwrap(), "o-1");
        assert_eq!(scoped_xid("acme", "o-1").unwrap(), "acme/o-1");
        assert_eq!(unscoped("acme/o-1"), ("acme", "o-1"));
        assert_eq!(unscoped("o-1"), (DEFAULT_TENANT, "o-1"));
        assert!(check_scoped_xid("acme/o-1").is_ok());
        assert!(check_scoped_xid("a:b/o-1").is_err());
        assert!(check_scoped_xid("acme/o/1").is_err());
        let e = scoped_xid("acme", &"x".repeat(124)).unwrap_err().0;
        assert!(e.contains("limited to 123 bytes"), "{e}");
        assert!(scoped_xid("acme", &"x".repeat(123)).is_ok());
        assert!(check_xid("order-1:tcc.42_a").is_ok());
        assert_eq!(check_xid("").unwrap_err().0, "xid must not be empty");
        let long = "x".repeat(MAX_XID_LEN + 1);
        assert!(
            check_xid(&long)
                .unwrap_err()
                .0
                .contains("limit of 128 bytes")
        );
        assert!(check_xid(&"x".repeat(MAX_XID_LEN)).is_ok());
        assert!(check_xid("a b").unwrap_err().0.contains("charset"));
        assert_eq!(
            check_xid("tx-é").unwrap_err().0,
            "xid contains 'é', outside the allowed charset [A-Za-z0-9._:-]"
        );
        assert!(check_branch_id("branch_id", &"b".repeat(65)).is_err());
        assert!(check_handler("handler", "svc/transfer").is_ok());
    }

    #[test]
    fn a_path_makes_a_target_http_json() {
        assert_eq!(transport_of("http://127.0.0.1:5000"), Transport::Grpc);
        assert_eq!(transport_of("https://svc.local/"), Transport::Grpc);
        assert_eq!(
            transport_of("http://127.0.0.1:5000/dtx/branch"),
            Transport::HttpJson
        );
    }

    #[test]
    fn targets_must_be_absolute_http_uris() {
        assert!(check_target("target", "http://127.0.0.1:5000").is_ok());
        assert!(check_target("target", "https://svc.local").is_ok());
        assert!(check_target("target", "127.0.0.1:5000").is_err());
        assert!(check_target("target", "ftp://x").is_err());
        assert!(check_target("target", "").is_err());
        assert!(check_target("target", "http://[::1]:5000/x").is_ok());
        assert!(check_target("target", "http://[::1]").is_ok());
    }

    #[test]
    fn targets_with_impossible_ports_or_credentials_are_refused() {
        for port in ["0", "99999", "65536"] {
            let target = format!("http://127.0.0.1:{port}");
            let e = check_target("target", &target).unwrap_err().0;
            assert!(e.contains("a port is 1 to 65535"), "{target}: {e}");
        }
        assert!(check_target("target", "http://127.0.0.1:65535").is_ok());
        assert!(check_target("target", "http://[::1]:0").is_err());
        for target in ["http://user:secret@svc:50051", "https://token@svc/hook"] {
            let e = check_target("target", target).unwrap_err().0;
            assert!(e.contains("must not carry credentials"), "{e}");
            assert!(!e.contains("secret"), "the refusal repeats the secret: {e}");
        }
    }

    #[test]
    fn payloads_and_headers_have_size_limits() {
        assert!(check_payload("payload", &vec![0; MAX_PAYLOAD_BYTES]).is_ok());
        let err = check_payload("payload", &vec![0; MAX_PAYLOAD_BYTES + 1]).unwrap_err();
        assert!(err.0.contains("65536"), "{err}");
        let mut headers = BTreeMap::new();
        headers.insert("trace-id".to_string(), "v".repeat(MAX_HEADER_VALUE_LEN));
        assert!(check_headers("headers", &headers).is_ok());
        headers.insert("bad key".to_string(), String::new());
        assert!(check_headers("headers", &headers).is_err());
    }

    #[test]
    fn timeouts_default_and_cap() {
        assert_eq!(
            timeout("t", 0, DEFAULT_TX_TIMEOUT, MAX_TX_TIMEOUT).unwrap(),
            DEFAULT_TX_TIMEOUT
        );
        assert_eq!(
            timeout("t", 5, DEFAULT_TX_TIMEOUT, MAX_TX_TIMEOUT).unwrap(),
            Duration::from_millis(5)
        );
        assert!(timeout("t", u64::MAX, DEFAULT_TX_TIMEOUT, MAX_TX_TIMEOUT).is_err());
    }
}
