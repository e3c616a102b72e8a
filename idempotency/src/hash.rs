//! Request hashes: SHA-256 over a canonical form of the request.
//!
//! A repeat of an intent must carry the *same request*; a client that reuses a key for a
//! different request (amount 100, then 1000) must get a conflict, not the first result. Hashing
//! the raw JSON text would call two semantically equal bodies different (field order,
//! whitespace, `1.0` vs `1`), so the hash is taken over this canonical JSON:
//!
//! 1. **No whitespace**; strings escaped as `serde_json` writes them (`"`, `\` and control
//!    characters escaped, everything else literal UTF-8). No Unicode normalization: `"é"` as
//!    one code point and as `e` + combining accent are different.
//! 2. **Object members sorted** by key, comparing the UTF-8 bytes (which is code point order;
//!    RFC 8785 sorts by UTF-16 units, which differs only between supplementary-plane characters
//!    and U+E000..U+FFFF). Duplicate keys cannot occur: the parser keeps the last one.
//! 3. **Null members are dropped**: `{"a": 1, "b": null}` and `{"a": 1}` hash the same (absent
//!    and null both mean "not given"). Nulls inside arrays are kept, positions matter.
//! 4. **Ignored fields** (see [`HashRules::ignore`]) are removed before hashing: dotted paths
//!    through objects (`"meta.sent_at"`); a path that meets an array applies to each element
//!    (`"items.note"`). Use it for fields that differ per attempt (client timestamps, trace ids).
//! 5. **Numbers by value**: the shortest decimal that reads back to the same number, without
//!    exponent or a trailing `.0`; `-0` is `0`. So `1`, `1.0`, `1.00` and `1e0` hash the same,
//!    and `0.1` equals `0.10`. Integers are exact up to 64 bits; any other number is read as an
//!    IEEE double, so more than ~17 significant digits are rounded (send money as integer minor
//!    units or as strings if that matters).
//!
//! The hash is of the canonical bytes, as 64 lowercase hex digits. It detects conflicts; it is
//! not a signature (authenticate callbacks with their HMAC/signature first).
//!
//! The canonical JSON form needs the cargo feature `json`; hashes of bytes and of parts do not.

use std::fmt;

#[cfg(feature = "json")]
use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 of a canonical request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    /// The hash of `value` under the default rules (nothing ignored).
    #[cfg(feature = "json")]
    pub fn of_json(value: &Value) -> Self {
        HashRules::default().hash_json(value)
    }

    /// The hash of opaque bytes (bodies that are not JSON).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        RequestHash(Sha256::digest(bytes).into())
    }

    /// The hash of several parts (say method, path and canonical body), each length-prefixed so
    /// that moving bytes from one part to the next changes the hash.
    pub fn of_parts(parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        RequestHash(hasher.finalize().into())
    }

    /// Parses the stored form back.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(RequestHash(bytes))
    }

    /// 64 lowercase hex digits, the stored form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestHash({}..)", &self.to_hex()[..12])
    }
}

/// Which fields the canonical form leaves out.
#[cfg(feature = "json")]
#[derive(Debug, Clone, Default)]
pub struct HashRules {
    ignored: Vec<Vec<String>>,
}

#[cfg(feature = "json")]
impl HashRules {
    /// No fields ignored or renamed: the whole body counts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leaves the member at dotted `path` out of the hash (`"trace_id"`, `"meta.sent_at"`).
    pub fn ignore(mut self, path: &str) -> Self {
        self.ignored
            .push(path.split('.').map(str::to_string).collect());
        self
    }

    /// The canonical JSON text of `value` (what is hashed).
    pub fn canonical_json(&self, value: &Value) -> String {
        let mut value = value.clone();
        for path in &self.ignored {
            remove_path(&mut value, path);
        }
        let mut out = String::new();
        write_canonical(&value, &mut out);
        out
    }

    /// The hash of `value`'s canonical form.
    pub fn hash_json(&self, value: &Value) -> RequestHash {
        RequestHash::of_bytes(self.canonical_json(value).as_bytes())
    }
}

#[cfg(feature = "json")]
fn remove_path(value: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match value {
        Value::Object(members) if rest.is_empty() => {
            members.remove(first);
        }
        Value::Object(members) => {
            if let Some(child) = members.get_mut(first) {
                remove_path(child, rest);
            }
        }
        Value::Array(items) => {
            for item in items {
                remove_path(item, path);
            }
        }
        _ => {}
    }
}

#[cfg(feature = "json")]
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut present: Vec<(&String, &Value)> =
                members.iter().filter(|(_, v)| !v.is_null()).collect();
            present.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (name, member)) in present.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write_canonical(member, out);
            }
            out.push('}');
        }
    }
}

#[cfg(feature = "json")]
fn write_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).expect("a string always serializes"));
}

#[cfg(feature = "json")]
fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(f) = n.as_f64() {
        // Rust's `Display` for f64 is the shortest round-trip decimal, never in exponent form
        // and without ".0" for integral values, so an integral float prints exactly like the
        // integer it equals. JSON cannot carry NaN or infinities.
        if f == 0.0 {
            out.push('0');
        } else {
            out.push_str(&f.to_string());
        }
    }
}

#[cfg(all(test, feature = "json"))]
mod tests {
    use serde_json::json;

    use super::*;

    fn canonical(text: &str) -> String {
        HashRules::new().canonical_json(&serde_json::from_str(text).unwrap())
    }

    fn hash(text: &str) -> RequestHash {
        RequestHash::of_json(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn field_order_and_whitespace_do_not_matter() {
        let a = r#"{"amount": 100, "currency": "EUR", "items": [{"sku": "a", "qty": 2}]}"#;
        let b = r#"{"items":[{"qty":2,"sku":"a"}],"currency":"EUR","amount":100}"#;
        assert_eq!(hash(a), hash(b));
        assert_eq!(
            canonical(a),
            r#"{"amount":100,"currency":"EUR","items":[{"qty":2,"sku":"a"}]}"#
        );
    }

    #[test]
    fn different_values_and_array_order_do_matter() {
        assert_ne!(hash(r#"{"amount":100}"#), hash(r#"{"amount":1000}"#));
        assert_ne!(hash(r#"{"amount":100}"#), hash(r#"{"amount":"100"}"#));
        assert_ne!(hash("[1,2]"), hash("[2,1]"));
        assert_ne!(hash(r#"{"a":true}"#), hash(r#"{"a":false}"#));
    }

    #[test]
    fn numbers_are_compared_by_value() {
        assert_eq!(canonical("[1, 1.0, 1.00, 1e0, 10e-1]"), "[1,1,1,1,1]");
        assert_eq!(canonical("[100, 1e2, 100.0]"), "[100,100,100]");
        assert_eq!(canonical("[0.1, 0.10, 1e-1]"), "[0.1,0.1,0.1]");
        assert_eq!(canonical("[-0, -0.0, 0.0]"), "[0,0,0]");
        assert_eq!(canonical("[-5, -5.0, 2.5]"), "[-5,-5,2.5]");
        assert_eq!(canonical("1e21"), "1000000000000000000000");
        assert_eq!(canonical("0.0000001"), "0.0000001");
        // 64-bit integers stay exact; a float literal of the same value agrees.
        assert_eq!(
            canonical("[18446744073709551615, -9223372036854775808]"),
            "[18446744073709551615,-9223372036854775808]"
        );
        assert_eq!(canonical("9007199254740992.0"), "9007199254740992");
        assert_ne!(hash("1.5"), hash("1"));
    }

    #[test]
    fn null_members_are_absent_but_array_nulls_count() {
        assert_eq!(hash(r#"{"a":1,"b":null}"#), hash(r#"{"a":1}"#));
        assert_eq!(canonical(r#"{"b":null,"a":{"c":null}}"#), r#"{"a":{}}"#);
        assert_ne!(hash("[1,null]"), hash("[1]"));
        assert_ne!(hash(r#"{"a":null}"#), hash("null"));
    }

    #[test]
    fn ignored_fields_are_left_out() {
        let rules = HashRules::new()
            .ignore("trace_id")
            .ignore("meta.sent_at")
            .ignore("items.note");
        let a = json!({"amount": 5, "trace_id": "t1", "meta": {"sent_at": 1, "src": "app"},
                       "items": [{"sku": "a", "note": "x"}, {"sku": "b"}]});
        let b = json!({"amount": 5, "trace_id": "t2", "meta": {"sent_at": 2, "src": "app"},
                       "items": [{"sku": "a", "note": "y"}, {"sku": "b", "note": "z"}]});
        assert_eq!(rules.hash_json(&a), rules.hash_json(&b));
        assert_eq!(
            rules.canonical_json(&a),
            r#"{"amount":5,"items":[{"sku":"a"},{"sku":"b"}],"meta":{"src":"app"}}"#
        );
        // Only the named fields: a change anywhere else is still a different request.
        let c = json!({"amount": 6, "trace_id": "t1", "meta": {"sent_at": 1, "src": "app"},
                       "items": [{"sku": "a"}, {"sku": "b"}]});
        assert_ne!(rules.hash_json(&a), rules.hash_json(&c));
        assert_ne!(RequestHash::of_json(&a), RequestHash::of_json(&b));
    }

    #[test]
    fn strings_are_escaped_and_keys_sorted_by_code_point() {
        assert_eq!(
            canonical(r#"{"b":"x\"y\\z\n","a":"é","B":"\u00e9"}"#),
            "{\"B\":\"é\",\"a\":\"é\",\"b\":\"x\\\"y\\\\z\\n\"}"
        );
        // Unicode escapes and literal characters are the same string.
        assert_eq!(hash(r#""\u00e9""#), hash(r#""é""#));
    }

    #[test]
    fn hashes_are_stable_sha256_hex() {
        // SHA-256 of the canonical text `{"a":1}`.
        assert_eq!(
            hash(r#"{ "a" : 1.0 }"#).to_hex(),
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
        assert_eq!(
            RequestHash::of_bytes(br#"{"a":1}"#),
            hash(r#"{"a":1}"#),
            "the hash is over the canonical bytes"
        );
    }
}

#[cfg(test)]
mod byte_tests {
    use super::*;

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(
            RequestHash::of_parts(&[b"ab", b"c"]),
            RequestHash::of_parts(&[b"a", b"bc"])
        );
        assert_eq!(
            RequestHash::of_parts(&[b"POST", b"/orders"]),
            RequestHash::of_parts(&[b"POST", b"/orders"])
        );
    }

    #[test]
    fn the_stored_form_parses_back() {
        let h = RequestHash::of_bytes(b"[1]");
        assert_eq!(RequestHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(RequestHash::from_hex("abc"), None);
    }
}
