//! The tower layer: claims the key, runs the inner service for the owner, records and replays.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use dtx_sql::Backend;
use futures::future::BoxFuture;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower::{Layer, Service};

use super::envelope::{encode_response, replay};
use super::problem::problem;
use super::{DEFAULT_MAX_REQUEST_BYTES, IDEMPOTENCY_KEY, MAX_CLIENT_KEY_LEN};
use crate::{
    Answer, Claim, Completion, Error, HashRules, Idempotency, Key, MAX_RESOURCE_ID_LEN,
    RequestHash, StoredResult, check_business_id, check_scope,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type TenantFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// How many new keys each tenant may create per period in this layer's scope (a token bucket
/// per tenant, shared by every clone of the service).
struct NewKeys {
    limiter: governor::DefaultKeyedRateLimiter<String>,
    count: u32,
    period: Duration,
}

/// How a handler's response is recorded. Defaults by status (see [`Outcome::of_status`]); a
/// handler overrides it by inserting an `Outcome` into the response extensions (with axum:
/// `(Extension(Outcome::FailedRetryable), StatusCode::INTERNAL_SERVER_ERROR, "...")`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Recorded SUCCEEDED: repeats get this response.
    Succeeded,
    /// Recorded FAILED_FINAL: repeats get this failure.
    FailedFinal,
    /// Recorded FAILED_RETRYABLE: the next request runs the handler again.
    FailedRetryable,
    /// The effect may or may not have happened: the record stays PROCESSING until its lease
    /// expires and the fact check decides.
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
    new_keys: Option<Arc<NewKeys>>,
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
            new_keys: self.new_keys.clone(),
        }
    }
}

/// Applies idempotency records to the wrapped routes; see the [module docs](super).
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
                new_keys: None,
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

    /// At most `count` new keys per `period` for each tenant (see [`IdempotencyLayer::tenant`];
    /// without one, for all callers together) in this scope: a client minting a fresh key for
    /// every request cannot fill the table. Past the limit a request with a new key gets
    /// `429 Too Many Requests` with `Retry-After`, the handler does not run and nothing is
    /// stored; repeats of keys that exist are never limited. Costs one indexed read per request.
    pub fn limit_new_keys(mut self, count: NonZeroU32, period: Duration) -> Self {
        let every = (period / count.get()).max(Duration::from_nanos(1));
        let quota = governor::Quota::with_period(every)
            .expect("a non-zero period")
            .allow_burst(count);
        self.config.new_keys = Some(Arc::new(NewKeys {
            limiter: governor::RateLimiter::keyed(quota),
            count: count.get(),
            period,
        }));
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
    if let Some(limited) = over_new_key_limit(&config, &key).await {
        return Ok(limited);
    }
    let lease = match config.store.claim(&key, &hash).await {
        Ok(Claim::Owned(lease)) => lease,
        Ok(Claim::Answered(answer)) => return Ok(answer_response(answer)),
        Err(e) => {
            tracing::warn!(error = %e, scope = key.scope(), "idempotency claim failed");
            return Ok(with_retry_after(
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "Idempotency store unavailable",
                    "The request was not processed; retry with the same key.",
                ),
                Duration::from_secs(1),
            ));
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

/// The 429 for a new key past its tenant's limit, or `None` to go on (a known key, no limit,
/// or room left). A store that cannot be read lets the claim answer for itself.
async fn over_new_key_limit<DB: Backend, B: From<Bytes>>(
    config: &Config<DB>,
    key: &Key,
) -> Option<Response<B>> {
    let new_keys = config.new_keys.as_ref()?;
    // Detached like every conversation of the layer: the client may go away mid-read.
    let (store, owned) = (config.store.clone(), key.clone());
    let known = dtx_sql::detached(async move { store.record(&owned).await }).await;
    if !matches!(known, Ok(None)) {
        return None;
    }
    let not_until = new_keys
        .limiter
        .check_key(&key.tenant().to_string())
        .err()?;
    // Keys of tenants idle for a whole period hold no state worth keeping.
    if new_keys.limiter.len() > 10_000 {
        new_keys.limiter.retain_recent();
    }
    crate::metrics::request(key.scope(), crate::metrics::Outcome::Limited);
    let wait = not_until.wait_time_from(governor::clock::Clock::now(
        &governor::clock::DefaultClock::default(),
    ));
    let response = problem(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-keys",
        "Too many new Idempotency-Keys",
        &format!(
            "At most {} new keys per {} s are accepted for this operation; retry later.",
            new_keys.count,
            new_keys.period.as_secs_f64()
        ),
    );
    Some(with_retry_after(response, wait))
}

/// `response` with `Retry-After` in whole seconds, at least one.
fn with_retry_after<B>(mut response: Response<B>, wait: Duration) -> Response<B> {
    let seconds = wait.as_millis().div_ceil(1000).max(1);
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_str(&seconds.to_string()).expect("digits"),
    );
    response
}

fn answer_response<B: From<Bytes>>(answer: Answer) -> Response<B> {
    match answer {
        Answer::Replayed { status, result } => replay(status, &result),
        Answer::InProgress { retry_after } => with_retry_after(
            problem(
                StatusCode::ACCEPTED,
                "in-progress",
                "A request with this Idempotency-Key is being processed",
                "Retry later with the same key to get its result.",
            ),
            retry_after,
        ),
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
