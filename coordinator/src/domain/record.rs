//! What the store keeps of a transaction.

use std::collections::BTreeMap;

use super::ids::{BranchId, Fence, Xid};
use super::status::{BranchState, Decision, Kind, TxStatus};

/// One global transaction's row.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalRow {
    pub xid: Xid,
    pub kind: Kind,
    pub status: TxStatus,
    pub decision: Option<Decision>,
    /// The timeout the client asked for (kept to recognise an identical repeat of Begin/Submit).
    pub timeout_ms: i64,
    pub deadline_ms: i64,
    /// Saga: the canonical encoding of the submitted definition.
    pub spec: Option<Vec<u8>>,
    pub branch_count: i64,
    pub owner: Option<String>,
    /// Fencing token: a fresh random value on every claim; a driver's writes require the token
    /// it claimed with, so a stale driver's writes change nothing.
    pub fence: Fence,
    pub due_ms: Option<i64>,
    pub last_error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// One TCC branch or saga step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BranchRow {
    pub branch_id: BranchId,
    /// Registration (TCC) or definition (saga) order.
    pub seq: i64,
    pub target: String,
    pub handler: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub call_timeout_ms: i64,
    pub state: BranchState,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub result: Option<Vec<u8>>,
}

/// A transaction with its branches.
#[derive(Debug, Clone, PartialEq)]
pub struct TxRecord {
    pub global: GlobalRow,
    pub branches: Vec<BranchRow>,
}

/// Encodes headers for the `headers` column: `key=value` lines (keys and values are validated
/// against the contract's charset limits; `\n` in a value is escaped).
pub fn encode_headers(headers: &BTreeMap<String, String>) -> Vec<u8> {
    let mut out = String::new();
    for (k, v) in headers {
        out.push_str(k);
        out.push('=');
        out.push_str(&v.replace('\\', "\\\\").replace('\n', "\\n"));
        out.push('\n');
    }
    out.into_bytes()
}

/// Decodes [`encode_headers`].
pub fn decode_headers(bytes: &[u8]) -> BTreeMap<String, String> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), unescape(v)))
        .collect()
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_including_newlines_and_backslashes() {
        let mut h = BTreeMap::new();
        h.insert("trace-id".to_string(), "a=b\\n\nc".to_string());
        h.insert("empty".to_string(), String::new());
        assert_eq!(decode_headers(&encode_headers(&h)), h);
        assert!(decode_headers(b"").is_empty());
    }
}
