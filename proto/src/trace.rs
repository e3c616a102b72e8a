//! W3C trace context (`traceparent`), carried from the initiator through the coordinator to
//! every branch call, so one trace id names a whole transaction.
//!
//! The transaction's context is stored with it as the `traceparent` header of its branches
//! (sagas: of the saga), so calls made after a coordinator restart carry the same trace id.
//! Each call travels with a child of it in the gRPC metadata: same trace id, a span id of its
//! own (one per attempt).

use std::collections::BTreeMap;
use std::fmt;

/// The header and metadata key.
pub const TRACEPARENT: &str = "traceparent";

/// A parsed `traceparent` (version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace the call belongs to.
    pub trace_id: u128,
    /// The calling span.
    pub span_id: u64,
    /// Bit 0: sampled.
    pub flags: u8,
}

impl TraceParent {
    /// A new trace (sampled), for a transaction whose initiator has none.
    pub fn new_root() -> TraceParent {
        TraceParent {
            trace_id: nonzero(rand::random::<u128>),
            span_id: nonzero(rand::random::<u64>),
            flags: 1,
        }
    }

    /// A span of this trace under this one (same trace id and flags, a fresh span id).
    pub fn child(&self) -> TraceParent {
        TraceParent {
            span_id: nonzero(rand::random::<u64>),
            ..*self
        }
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>`; `None` for anything else or all-zero ids (which
    /// the W3C spec says to ignore: the caller starts a new trace).
    pub fn parse(text: &str) -> Option<TraceParent> {
        let mut parts = text.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        fn hex(s: &str, len: usize) -> Option<&str> {
            (s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then_some(s)
        }
        // Version 00 has exactly four fields; a later version may add some after these.
        if hex(version, 2)? == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        let parsed = TraceParent {
            trace_id: u128::from_str_radix(hex(trace, 32)?, 16).ok()?,
            span_id: u64::from_str_radix(hex(span, 16)?, 16).ok()?,
            flags: u8::from_str_radix(hex(flags, 2)?, 16).ok()?,
        };
        (parsed.trace_id != 0 && parsed.span_id != 0).then_some(parsed)
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_hex(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// The stored context of `headers`, if it has a valid one.
    pub fn of_headers(headers: &BTreeMap<String, String>) -> Option<TraceParent> {
        headers.get(TRACEPARENT).and_then(|t| TraceParent::parse(t))
    }

    /// The context a gRPC call carries in its metadata, if valid.
    pub fn of_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<TraceParent> {
        metadata
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse)
    }

    /// Puts this context into a call's metadata.
    pub fn insert_into(&self, metadata: &mut tonic::metadata::MetadataMap) {
        if let Ok(value) = self.to_string().parse() {
            metadata.insert(TRACEPARENT, value);
        }
    }
}

/// Whether two header sets are equal apart from their trace context (a repeated call from
/// another attempt of the caller carries another one, yet it is the same call).
pub fn same_apart_from_trace(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    let untraced = |h: &BTreeMap<String, String>| {
        h.iter()
            .filter(|(k, _)| k.as_str() != TRACEPARENT)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    untraced(a) == untraced(b)
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

fn nonzero<T: PartialEq + Default>(draw: impl Fn() -> T) -> T {
    loop {
        let value = draw();
        if value != T::default() {
            return value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_w3c_example() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceParent::parse(text).unwrap();
        assert_eq!(t.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_hex(), "00f067aa0ba902b7");
        assert_eq!(t.flags, 1);
        assert_eq!(t.to_string(), text);
        let child = t.child();
        assert_eq!((child.trace_id, child.flags), (t.trace_id, t.flags));
        assert_ne!(child.span_id, t.span_id);
    }

    #[test]
    fn headers_compare_apart_from_their_trace() {
        let with = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let a = with(&[("k", "1"), (TRACEPARENT, "00-a")]);
        assert!(same_apart_from_trace(
            &a,
            &with(&[("k", "1"), (TRACEPARENT, "00-b")])
        ));
        assert!(same_apart_from_trace(&a, &with(&[("k", "1")])));
        assert!(!same_apart_from_trace(
            &a,
            &with(&[("k", "2"), (TRACEPARENT, "00-a")])
        ));
    }

    #[test]
    fn rejects_what_the_spec_says_to_ignore() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(
            TraceParent::parse(later).is_some(),
            "a later version's extra fields"
        );
        let root = TraceParent::new_root();
        assert_eq!(TraceParent::parse(&root.to_string()), Some(root));
    }
}
