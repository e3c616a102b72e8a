//! Error bodies: `application/problem+json` (RFC 9457), typed `urn:dtx:idempotency:<kind>`.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

/// An RFC 9457 problem response.
pub(super) fn problem<B: From<Bytes>>(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> Response<B> {
    let body = serde_json::json!({
        "type": format!("urn:dtx:idempotency:{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(B::from(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
