//! A tower layer for the `Idempotency-Key` request header (usable with axum, hyper, tonic-web).
//!
//! Wrap the *create* routes (POST/PATCH) with [`IdempotencyLayer`]. For every request with a key
//! it hashes method, path and body ([`super::HashRules`] canonical JSON for JSON bodies),
//! claims the key in lease mode, calls the inner service only for the request that owns the
//! claim, and stores its status, the headers that matter and the body; repeats get that stored
//! response back. Safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched.
//!
//! | situation                                   | response                                        |
//! |---------------------------------------------|-------------------------------------------------|
//! | first request                               | the handler's response (e.g. 201), recorded     |
//! | repeat after SUCCEEDED / FAILED_FINAL       | the stored status, headers, body + `Idempotent-Replayed: true` |
//! | repeat while the first is running           | `202 Accepted` + `Retry-After` (or waits, see [`super::Idempotency::wait`]) |
//! | repeat after FAILED_RETRYABLE               | runs again (re-claimed with a new owner token)  |
//! | same key, different method/path/body        | `409 Conflict`, the first result untouched      |
//! | lease expired, fact check could not tell    | `202 Accepted`, parked for a person             |
//! | key missing (when required) or malformed    | `400 Bad Request`                               |
//! | body larger than the limit                  | `413 Content Too Large`                         |
//! | idempotency store unavailable               | `503 Service Unavailable` + `Retry-After`; the handler did not run |
//!
//! Error bodies are `application/problem+json` (RFC 9457).
//!
//! # Where this differs from the IETF httpapi Idempotency-Key draft, and why
//!
//! * **Different payload for a used key: 409, not 422.** 422 already means "your body failed
//!   validation" in most APIs, and a client fixing its body would retry with the same key and
//!   keep failing. The key is bound to a state that conflicts with the request: 409 is that.
//! * **Concurrent request while the first is in flight: 202 + `Retry-After`, not 409.** The
//!   first request was accepted and is being processed; a client should come back later with
//!   the same key. Answering 409 would make "wait and retry with this key" indistinguishable
//!   from "this key is used for something else, never retry it" above.
//! * **Missing key: 400**, like the draft (not 422: nothing about the body is wrong).
//! * **Key syntax:** the draft defines the value as a Structured Field String (`"..."`); we
//!   accept that and the bare form most clients send (`Idempotency-Key: 8e03978e-...`), limited
//!   to 64 bytes of `[A-Za-z0-9._:-]` (UUIDs fit) so a header can never inject anything into the
//!   key or blow up the index. The draft leaves the format to the server.
//! * **Replays** repeat the stored status, body and a configurable list of headers
//!   (`Content-Type`, `Location`, `Content-Location`, `ETag` by default) and add
//!   `Idempotent-Replayed: true`; the draft only says "the result of the previously completed
//!   operation". `Date`, cookies and per-attempt headers are not replayed.
//! * **Errors are recorded too**: a final 4xx is replayed to repeats (the draft's "success or an
//!   error"); 408, 425, 429 and 503 are retryable failures the next request runs again; any
//!   other 5xx is *unknown* (the handler may have committed before failing): repeats get 202
//!   until the lease expires and the fact check decides. A handler that knows better inserts an
//!   [`Outcome`] into its response extensions.
//!
//! The key is scoped by the layer's operation scope and by the tenant your authentication
//! established ([`IdempotencyLayer::tenant`]), so two clients' equal keys never meet. Run
//! authentication before this layer, so anonymous traffic cannot fill the table.
//!
//! While the handler runs, the layer renews the lease every third of it
//! ([`super::Lease::keep_alive`]), so a slow handler keeps its record and repeats get 202 until
//! it answers. A client that disconnects mid-request drops the handler future and with it the
//! renewal; the record then stays PROCESSING until its lease expires and the fact check runs -
//! exactly like a crash.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use dtx_sql::Backend;
use futures::future::BoxFuture;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower::{Layer, Service};

use super::{
    Answer, Claim, Completion, HashRules, Idempotency, Key, MAX_RESOURCE_ID_LEN, RequestHash,
    Status, StoredResult, check_business_id, check_scope,
};
use crate::Error;

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on every replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Longest accepted client key, in bytes.
pub const MAX_CLIENT_KEY_LEN: usize = 64;
/// Default limit of a buffered request body.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type TenantFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// How a handler's response is recorded. Defaults by status (see [`Outcome::of_status`]); a
/// handler overrides it by inserting an `Outcome` into the response extensions (with axum:
/// `(Extension(Outcome::FailedRetryable), StatusCode::INTERNAL_SERVER_ERROR, "...")`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    FailedFinal,
    FailedRetryable,
    Unknown,
}

impl Outcome {
    /// 1xx-3xx succeeded; 408, 425, 429, 503 are retryable (the server says it did not
    /// process the request); other 4xx are final; other 5xx are unknown.
    pub fn of_status(status: StatusCode) -> Outcome {
        match status.as_u16() {
            408 | 425 | 429 | 503 => Outcome::FailedRetryable,
            400..=499 => Outcome::FailedFinal,
            500..=599 => Outcome::Unknown,
            _ => Outcome::Succeeded,
        }
    }
}

/// Configuration shared by every clone of the service.
struct Config<DB: Backend> {
    store: Idempotency<DB>,
    scope: String,
    version: u32,
    tenant: Option<TenantFn>,
    required: bool,
    rules: HashRules,
    replay_headers: Vec<HeaderName>,
    max_request_bytes: usize,
}

impl<DB: Backend> Clone for Config<DB> {
    fn clone(&self) -> Self {
        Config {
            store: self.store.clone(),
            scope: self.scope.clone(),
            version: self.version,
            tenant: self.tenant.clone(),
            required: self.required,
            rules: self.rules.clone(),
            replay_headers: self.replay_headers.clone(),
            max_request_bytes: self.max_request_bytes,
        }
    }
}

/// Applies idempotency records to the wrapped routes; see the [module docs](self).
pub struct IdempotencyLayer<DB: Backend> {
    config: Config<DB>,
}

impl<DB: Backend> Clone for IdempotencyLayer<DB> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            config: self.config.clone(),
        }
    }
}

impl<DB: Backend> IdempotencyLayer<DB> {
    /// Records in `store` under `scope`, the operation these routes perform
    /// (`"order.create"`). The store's lease, wait and fact check apply.
    pub fn new(store: Idempotency<DB>, scope: impl Into<String>) -> Result<Self, Error> {
        let scope = scope.into();
        check_scope(&scope)?;
        Ok(IdempotencyLayer {
            config: Config {
                store,
                scope,
                version: 1,
                tenant: None,
                required: true,
                rules: HashRules::default(),
                replay_headers: vec![
                    header::CONTENT_TYPE,
                    header::LOCATION,
                    header::CONTENT_LOCATION,
                    header::ETAG,
                ],
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            },
        })
    }

    /// Extracts the tenant/user from the request (typically an extension your authentication
    /// layer inserted). At most 60 bytes of `[A-Za-z0-9._-]` so that tenant and client key fit
    /// the 128-byte key.
    pub fn tenant<F>(mut self, tenant: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.tenant = Some(Arc::new(tenant));
        self
    }

    /// The protocol version in every key (default 1).
    pub fn version(mut self, version: u32) -> Self {
        self.config.version = version;
        self
    }

    /// Lets requests without a key through unprotected instead of answering 400.
    pub fn optional(mut self) -> Self {
        self.config.required = false;
        self
    }

    /// Fields left out of the body's hash (client timestamps, trace ids).
    pub fn hash_rules(mut self, rules: HashRules) -> Self {
        self.config.rules = rules;
        self
    }

    /// Also replays this response header.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.config.replay_headers.push(name);
        self
    }

    /// Largest request body accepted (default 1 MiB); larger ones get 413.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.config.max_request_bytes = bytes;
        self
    }
}

impl<S, DB: Backend> Layer<S> for IdempotencyLayer<DB> {
    type Service = IdempotencyService<S, DB>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: Arc::new(self.config.clone()),
        }
    }
}

/// The service [`IdempotencyLayer`] produces.
pub struct IdempotencyService<S, DB: Backend> {
    inner: S,
    config: Arc<Config<DB>>,
}

impl<S: Clone, DB: Backend> Clone for IdempotencyService<S, DB> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, DB, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S, DB>
where
    DB: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + From<Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was driven to readiness serves this call; a fresh one stays behind.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(handle(self.config.clone(), inner, request))
    }
}

async fn handle<S, DB, ReqBody, ResBody>(
    config: Arc<Config<DB>>,
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    DB: Backend,
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    if is_safe(request.method()) {
        return inner.call(request).await;
    }
    let (parts, body) = request.into_parts();
    let client_key = match client_key(&parts.headers) {
        Ok(Some(key)) => key,
        Ok(None) if !config.required => {
            return inner.call(Request::from_parts(parts, body)).await;
        }
        Ok(None) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency-Key is missing",
                "This operation requires an Idempotency-Key header, generated once per \
                 intent and sent unchanged with every retry.",
            ));
        }
        Err(detail) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "malformed-key",
                "Idempotency-Key is malformed",
                &detail,
            ));
        }
    };
    let tenant = config.tenant.as_ref().and_then(|f| f(&parts));
    let key = Key::builder(config.scope.as_str())
        .tenant(tenant.unwrap_or_default())
        .business_id(client_key)
        .version(config.version)
        .build();
    let key = match key {
        Ok(key) => key,
        Err(e) => {
            // The client key was valid on its own: the tenant extractor is misconfigured.
            tracing::error!(error = %e, "idempotency key could not be built from the tenant");
            return Ok(problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server-error",
                "Idempotency key could not be built",
                "The server's tenant configuration is invalid.",
            ));
        }
    };
    let bytes = match Limited::new(body, config.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "Request body too large",
                &format!("At most {} bytes are accepted.", config.max_request_bytes),
            ));
        }
        Err(e) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "Request body could not be read",
                &e.to_string(),
            ));
        }
    };
    let hash = request_hash(&parts, &bytes, &config.rules);
    let lease = match config.store.claim(&key, &hash).await {
        Ok(Claim::Owned(lease)) => lease,
        Ok(Claim::Answered(answer)) => return Ok(answer_response(answer)),
        Err(e) => {
            tracing::warn!(error = %e, scope = key.scope(), "idempotency claim failed");
            let mut response = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Idempotency store unavailable",
                "The request was not processed; retry with the same key.",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Ok(response);
        }
    };
    // If the inner service fails as a service (not with an HTTP error response), the outcome
    // is unknown: the lease stays and the fact check decides once it expires. While the
    // handler (and its response body) is alive, the lease is renewed.
    let produced = lease
        .keep_alive(async {
            let response = inner
                .call(Request::from_parts(parts, ReqBody::from(bytes)))
                .await?;
            let (head, body) = response.into_parts();
            let collected = body.collect().await.map_err(Into::<BoxError>::into);
            Ok((head, collected))
        })
        .await?;
    let (mut head, collected) = produced;
    let body = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, scope = key.scope(), "response body failed; outcome unknown");
            return Ok(problem(
                StatusCode::BAD_GATEWAY,
                "unknown-outcome",
                "The response could not be produced",
                "The outcome is unknown; retry later with the same key.",
            ));
        }
    };
    let outcome = head
        .extensions
        .remove::<Outcome>()
        .unwrap_or_else(|| Outcome::of_status(head.status));
    let completion = completion_of(outcome, &head, &body, &config);
    match lease.complete(completion).await {
        Ok(_) => {}
        Err(Error::LeaseLost) => {} // logged by `complete`; this response is still what ran
        Err(e) => {
            tracing::warn!(error = %e, scope = key.scope(), "idempotency completion failed");
        }
    }
    Ok(Response::from_parts(head, ResBody::from(body)))
}

fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// The client's key: a bare token or a Structured Field String, `[A-Za-z0-9._:-]{1,64}`.
fn client_key(headers: &HeaderMap) -> Result<Option<String>, String> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("Send exactly one Idempotency-Key header.".into());
    }
    let text = value
        .to_str()
        .map_err(|_| "Idempotency-Key must be visible ASCII.".to_string())?
        .trim();
    let key = match text.strip_prefix('"') {
        Some(quoted) => quoted
            .strip_suffix('"')
            .ok_or_else(|| "Idempotency-Key has an unterminated quote.".to_string())?,
        None => text,
    };
    check_business_id(key, MAX_CLIENT_KEY_LEN).map_err(|e| match e {
        Error::Limit(limit) => format!("Idempotency-Key: {}", limit.0),
        other => other.to_string(),
    })?;
    Ok(Some(key.to_string()))
}

/// Method, path and query, and the body: canonical JSON when it parses as JSON and is declared
/// JSON (or undeclared), the raw bytes otherwise.
fn request_hash(parts: &http::request::Parts, body: &[u8], rules: &HashRules) -> RequestHash {
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let declared_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|ct| {
            let ct = ct.to_ascii_lowercase();
            ct.starts_with("application/json") || ct.contains("+json")
        });
    let json = (declared_json && !body.is_empty())
        .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
        .flatten();
    let canonical;
    let (kind, payload): (&[u8], &[u8]) = match &json {
        Some(value) => {
            canonical = rules.canonical_json(value);
            (b"json", canonical.as_bytes())
        }
        None => (b"raw", body),
    };
    RequestHash::of_parts(&[
        parts.method.as_str().as_bytes(),
        path.as_bytes(),
        kind,
        payload,
    ])
}

fn completion_of<DB: Backend>(
    outcome: Outcome,
    head: &http::response::Parts,
    body: &[u8],
    config: &Config<DB>,
) -> Completion {
    if outcome == Outcome::Unknown {
        return Completion::Unknown(format!("handler answered {}", head.status));
    }
    let headers: Vec<(&HeaderName, &HeaderValue)> = config
        .replay_headers
        .iter()
        .flat_map(|name| head.headers.get_all(name).iter().map(move |v| (name, v)))
        .collect();
    let max = config.store.max_result_bytes;
    let mut stored = encode_response(&headers, body, false);
    if stored.len() > max {
        tracing::warn!(
            scope = config.scope.as_str(),
            bytes = body.len(),
            "response body exceeds the stored limit; replays will carry no body"
        );
        stored = encode_response(&headers, b"", true);
    }
    let resource_id = head
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= MAX_RESOURCE_ID_LEN)
        .map(str::to_string);
    let result = StoredResult {
        code: head.status.as_u16().to_string(),
        resource_id,
        body: stored,
    };
    match outcome {
        Outcome::Succeeded => Completion::Succeeded(result),
        Outcome::FailedFinal => Completion::FailedFinal(result),
        Outcome::FailedRetryable => Completion::FailedRetryable(result),
        Outcome::Unknown => unreachable!("handled above"),
    }
}

const ENVELOPE_MAGIC: &[u8; 4] = b"DTX1";

/// The stored form of a response: magic, a flags byte (1 = body omitted), the replayed headers
/// as length-prefixed name/value pairs, then the body.
fn encode_response(headers: &[(&HeaderName, &HeaderValue)], body: &[u8], omitted: bool) -> Vec<u8> {
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

fn decode_response(stored: &[u8]) -> Option<Envelope> {
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

fn answer_response<B: From<Bytes>>(answer: Answer) -> Response<B> {
    match answer {
        Answer::Replayed { status, result } => replay(status, &result),
        Answer::InProgress { retry_after } => {
            let mut response = problem(
                StatusCode::ACCEPTED,
                "in-progress",
                "A request with this Idempotency-Key is being processed",
                "Retry later with the same key to get its result.",
            );
            let seconds = retry_after.as_millis().div_ceil(1000).max(1);
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&seconds.to_string()).expect("digits"),
            );
            response
        }
        Answer::Conflict => problem(
            StatusCode::CONFLICT,
            "key-reused",
            "Idempotency-Key is already used for a different request",
            "An Idempotency-Key identifies one request; send a new key for a new request.",
        ),
        Answer::NeedsAttention { .. } => problem(
            StatusCode::ACCEPTED,
            "under-review",
            "The outcome of this request is being reviewed",
            "The first attempt's outcome could not be determined automatically.",
        ),
        Answer::Executed(_) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server-error",
            "Unexpected idempotency answer",
            "",
        ),
    }
}

fn replay<B: From<Bytes>>(status: Status, result: &StoredResult) -> Response<B> {
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

/// An RFC 9457 problem response.
fn problem<B: From<Bytes>>(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn keys_are_bare_or_quoted_and_validated() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(
            client_key(&headers(&[("idempotency-key", uuid)])),
            Ok(Some(uuid.into()))
        );
        assert_eq!(
            client_key(&headers(&[("idempotency-key", &format!("\"{uuid}\""))])),
            Ok(Some(uuid.into()))
        );
        assert_eq!(client_key(&headers(&[])), Ok(None));
        for bad in ["", "\"\"", "has space", "\"open", "a/b", &"x".repeat(65)] {
            assert!(
                client_key(&headers(&[("idempotency-key", bad)])).is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(
            client_key(&headers(&[
                ("idempotency-key", "a"),
                ("idempotency-key", "b")
            ]))
            .is_err()
        );
    }

    #[test]
    fn statuses_classify_by_default() {
        assert_eq!(Outcome::of_status(StatusCode::CREATED), Outcome::Succeeded);
        assert_eq!(
            Outcome::of_status(StatusCode::SEE_OTHER),
            Outcome::Succeeded
        );
        assert_eq!(
            Outcome::of_status(StatusCode::UNPROCESSABLE_ENTITY),
            Outcome::FailedFinal
        );
        assert_eq!(
            Outcome::of_status(StatusCode::TOO_MANY_REQUESTS),
            Outcome::FailedRetryable
        );
        assert_eq!(
            Outcome::of_status(StatusCode::SERVICE_UNAVAILABLE),
            Outcome::FailedRetryable
        );
        assert_eq!(
            Outcome::of_status(StatusCode::INTERNAL_SERVER_ERROR),
            Outcome::Unknown
        );
        assert_eq!(
            Outcome::of_status(StatusCode::GATEWAY_TIMEOUT),
            Outcome::Unknown
        );
    }

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

    fn parts(method: &str, uri: &str, content_type: Option<&str>) -> http::request::Parts {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn request_hash_covers_method_path_and_canonical_body() {
        let rules = HashRules::default();
        let json = Some("application/json");
        let a = request_hash(&parts("POST", "/orders", json), br#"{"a":1,"b":2}"#, &rules);
        let b = request_hash(
            &parts("POST", "/orders", json),
            br#"{ "b":2.0, "a":1 }"#,
            &rules,
        );
        assert_eq!(a, b, "field order and number format do not matter");
        assert_ne!(
            a,
            request_hash(&parts("POST", "/orders", json), br#"{"a":1,"b":3}"#, &rules)
        );
        assert_ne!(
            a,
            request_hash(&parts("PUT", "/orders", json), br#"{"a":1,"b":2}"#, &rules)
        );
        assert_ne!(
            a,
            request_hash(
                &parts("POST", "/orders?x=1", json),
                br#"{"a":1,"b":2}"#,
                &rules
            )
        );
        // Non-JSON bodies are hashed as they are.
        let text = Some("text/plain");
        assert_ne!(
            request_hash(&parts("POST", "/o", text), b"{\"a\":1}", &rules),
            request_hash(&parts("POST", "/o", text), b"{ \"a\":1}", &rules)
        );
    }
}
