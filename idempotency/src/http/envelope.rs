//! The stored form of a response: what a replay sends back.
//!
//! A recorded HTTP response is one `result_body` value: magic `DTX1`, a flags byte (1 = body
//! omitted because it was over the stored limit), the replayed headers as length-prefixed
//! name/value pairs, then the body. A stored body without the magic (written by other code)
//! is replayed as a bare body.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::IDEMPOTENT_REPLAYED;
use crate::{Status, StoredResult};

const ENVELOPE_MAGIC: &[u8; 4] = b"DTX1";

/// The stored form of a response: magic, a flags byte (1 = body omitted), the replayed headers
/// as length-prefixed name/value pairs, then the body.
pub(super) fn encode_response(
    headers: &[(&HeaderName, &HeaderValue)],
    body: &[u8],
    omitted: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 64);
    out.extend_from_slice(ENVELOPE_MAGIC);
    out.push(u8::from(omitted));
    let headers: Vec<_> = headers
        .iter()
        .filter(|(n, v)| n.as_str().len() <= 0xffff && v.len() <= 0xffff)
        .take(0xffff)
        .collect();
    out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
    for (name, value) in headers {
        for part in [name.as_str().as_bytes(), value.as_bytes()] {
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out.extend_from_slice(body);
    out
}

/// A decoded stored response: headers, body, and whether the body was left out.
type Envelope = (Vec<(HeaderName, HeaderValue)>, Bytes, bool);

pub(super) fn decode_response(stored: &[u8]) -> Option<Envelope> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        *rest = tail;
        Some(head)
    }
    fn take_u16(rest: &mut &[u8]) -> Option<usize> {
        Some(u16::from_be_bytes(take(rest, 2)?.try_into().ok()?) as usize)
    }
    let mut rest = stored.strip_prefix(ENVELOPE_MAGIC)?;
    let flags = take(&mut rest, 1)?[0];
    let count = take_u16(&mut rest)?;
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let len = take_u16(&mut rest)?;
        let name = HeaderName::from_bytes(take(&mut rest, len)?).ok()?;
        let len = take_u16(&mut rest)?;
        let value = HeaderValue::from_bytes(take(&mut rest, len)?).ok()?;
        headers.push((name, value));
    }
    Some((headers, Bytes::copy_from_slice(rest), flags & 1 == 1))
}

pub(super) fn replay<B: From<Bytes>>(status: Status, result: &StoredResult) -> Response<B> {
    let code = result
        .code
        .parse::<u16>()
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(match status {
            Status::Succeeded => StatusCode::OK,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        });
    let (headers, body, omitted) = decode_response(&result.body)
        .unwrap_or_else(|| (Vec::new(), Bytes::copy_from_slice(&result.body), false));
    let mut response = Response::new(B::from(body));
    *response.status_mut() = code;
    for (name, value) in headers {
        response.headers_mut().append(name, value);
    }
    let flag = if omitted { "body-omitted" } else { "true" };
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static(flag));
    response
}

#[cfg(test)]
mod tests {
    use http::header;

    use super::*;

    #[test]
    fn stored_responses_round_trip() {
        let ct = HeaderValue::from_static("application/json");
        let loc = HeaderValue::from_static("/orders/O1");
        let stored = encode_response(
            &[(&header::CONTENT_TYPE, &ct), (&header::LOCATION, &loc)],
            b"{\"id\":\"O1\"}",
            false,
        );
        let (hs, body, omitted) = decode_response(&stored).unwrap();
        assert_eq!(
            hs,
            vec![(header::CONTENT_TYPE, ct), (header::LOCATION, loc)]
        );
        assert_eq!(&body[..], b"{\"id\":\"O1\"}");
        assert!(!omitted);
        let (hs, body, omitted) = decode_response(&encode_response(&[], b"", true)).unwrap();
        assert!(hs.is_empty() && body.is_empty() && omitted);
        // Not an envelope (or truncated): not decoded.
        assert!(decode_response(b"plain").is_none());
        assert!(decode_response(&stored[..8]).is_none());
    }
}
