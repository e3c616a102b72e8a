//! The `Idempotency-Key` tower layer over a real axum server on port 0, called with a real HTTP
//! client (reqwest), on SQLite, PostgreSQL and MariaDB.
//!
//! The create handler counts its runs and places an order in the database, so "the business
//! ran once" is asserted from both.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing;
use dtx_sdk::idempotency::Idempotency;
use dtx_sdk::idempotency::http::IdempotencyLayer;
use dtx_sql::Schema;
use dtx_sql::sqlx::Pool;
use dtx_tests::db::{TestBackend, TestDb};
use dtx_tests::idempotency::{HttpServer, create_tables, insert_order_committed, orders_for};
use dtx_tests::test_on_all_databases;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};

const SCHEMAS: &[Schema] = &[Schema::Idempotency];

struct App<DB: TestBackend> {
    pool: Pool<DB>,
    runs: Arc<AtomicUsize>,
    /// Notified when a `"slow"` request is inside the handler.
    entered: Arc<Notify>,
    /// A `"slow"` request waits here for a permit.
    gate: Arc<Semaphore>,
}

impl<DB: TestBackend> Clone for App<DB> {
    fn clone(&self) -> Self {
        App {
            pool: self.pool.clone(),
            runs: self.runs.clone(),
            entered: self.entered.clone(),
            gate: self.gate.clone(),
        }
    }
}

fn request_key(headers: &HeaderMap) -> String {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim_matches('"')
            .to_string()
    };
    format!("{}/{}", get("x-tenant"), get("idempotency-key"))
}

/// POST /orders `{"amount": n}`: 201 + Location + `{"id", "amount"}`. `amount < 0` is a final
/// 422, `"busy"` a retryable 503, `"crash"` a 500 (unknown), `"slow"` waits at the gate,
/// `"sleep_ms"` sleeps that long.
async fn create_order<DB: TestBackend>(
    State(app): State<App<DB>>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Response {
    app.runs.fetch_add(1, SeqCst);
    let amount = request["amount"].as_i64().unwrap_or(0);
    if amount < 0 {
        let problem = json!({"error": "amount must not be negative"});
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(problem)).into_response();
    }
    if request["busy"] == json!(true) {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
    }
    if request["crash"] == json!(true) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "lost the connection").into_response();
    }
    if request["slow"] == json!(true) {
        app.entered.notify_one();
        app.gate.acquire().await.expect("gate").forget();
    }
    if let Some(ms) = request["sleep_ms"].as_u64() {
        app.entered.notify_one();
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let id = insert_order_committed(&app.pool, &request_key(&headers), amount).await;
    let location = format!("/orders/{id}");
    let body = Json(json!({"id": id, "amount": amount}));
    (StatusCode::CREATED, [(header::LOCATION, location)], body).into_response()
}

async fn count_orders() -> &'static str {
    "listing"
}

async fn start<DB: TestBackend>(db: &'static TestDb<DB>) -> (HttpServer, App<DB>) {
    start_with(db, Idempotency::new(db.pool.clone())).await
}

async fn start_with<DB: TestBackend>(
    db: &'static TestDb<DB>,
    store: Idempotency<DB>,
) -> (HttpServer, App<DB>) {
    serve(db, header_tenant(store), false).await
}

/// The layer over `store`, its tenant read from `x-tenant` (where authentication would set it).
fn header_tenant<DB: TestBackend>(store: Idempotency<DB>) -> IdempotencyLayer<DB> {
    IdempotencyLayer::new(store, "order.create")
        .unwrap()
        .tenant(|parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
}

/// Serves the orders routes behind `layer`; with `authenticated`, behind an authentication
/// layer in front of it too (see [`authenticate`]).
async fn serve<DB: TestBackend>(
    db: &'static TestDb<DB>,
    layer: IdempotencyLayer<DB>,
    authenticated: bool,
) -> (HttpServer, App<DB>) {
    create_tables(&db.pool).await;
    let app = App {
        pool: db.pool.clone(),
        runs: Arc::new(AtomicUsize::new(0)),
        entered: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
    };
    let mut router = axum::Router::new()
        .route(
            "/orders",
            routing::post(create_order::<DB>).get(count_orders),
        )
        .route_layer(layer);
    if authenticated {
        // Added last, so it runs first.
        router = router.route_layer(axum::middleware::from_fn(authenticate));
    }
    (HttpServer::start(router.with_state(app.clone())).await, app)
}

/// The caller's tenant, as an authentication layer establishes it.
#[derive(Clone)]
struct Tenant(String);

/// A stand-in authentication layer: `Authorization: Bearer <tenant>` of a known tenant, or 401.
async fn authenticate(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let tenant = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| ["acme", "globex"].contains(t))
        .map(str::to_string);
    match tenant {
        Some(tenant) => {
            request.extensions_mut().insert(Tenant(tenant));
            next.run(request).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// What a test needs of a response, read once.
#[derive(Debug)]
struct Reply {
    status: u16,
    replayed: bool,
    location: Option<String>,
    content_type: Option<String>,
    retry_after: Option<String>,
    body: String,
}

impl Reply {
    fn problem_title(&self) -> String {
        assert_eq!(
            self.content_type.as_deref(),
            Some("application/problem+json")
        );
        let problem: Value = serde_json::from_str(&self.body).unwrap();
        problem["title"].as_str().unwrap().to_string()
    }
}

/// POSTs `body` to /orders as `tenant`, with `key` as the Idempotency-Key if given.
async fn post(server: &HttpServer, tenant: &str, key: Option<&str>, body: &str) -> Reply {
    let mut request = reqwest::Client::new()
        .post(server.url("/orders"))
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("http request");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let replayed = match header("idempotent-replayed").as_deref() {
        None => false,
        Some("true") => true,
        Some(other) => panic!("unexpected idempotent-replayed: {other}"),
    };
    Reply {
        status: response.status().as_u16(),
        replayed,
        location: header("location"),
        content_type: header("content-type"),
        retry_after: header("retry-after"),
        body: response.text().await.unwrap(),
    }
}

const TEN_EUR: &str = r#"{"amount": 10, "currency": "EUR"}"#;

async fn first_201_replay_conflict_and_key_errors<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (server, app) = start(db).await;

    let first = post(&server, "t1", Some("k-1"), TEN_EUR).await;
    assert_eq!((first.status, first.replayed), (201, false));
    assert!(first.location.is_some());

    // Same key, same body in another field order and number format: the stored response.
    let replay = post(
        &server,
        "t1",
        Some("k-1"),
        r#"{"currency":"EUR","amount":10.0}"#,
    )
    .await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(
        (&replay.location, &replay.body),
        (&first.location, &first.body)
    );
    assert_eq!(replay.content_type.as_deref(), Some("application/json"));
    assert_eq!(app.runs.load(SeqCst), 1);
    assert_eq!(orders_for(&db.pool, "t1/k-1").await, 1);

    // Same key, different amount: 409, and the first result stays what repeats get.
    let conflict = post(
        &server,
        "t1",
        Some("k-1"),
        r#"{"amount": 11, "currency": "EUR"}"#,
    )
    .await;
    assert_eq!(conflict.status, 409);
    assert_eq!(
        conflict.problem_title(),
        "Idempotency-Key is already used for a different request"
    );
    let again = post(&server, "t1", Some("k-1"), TEN_EUR).await;
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert_eq!(app.runs.load(SeqCst), 1);

    // Missing or malformed keys: 400 before anything runs.
    let missing = post(&server, "t1", None, TEN_EUR).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.problem_title(), "Idempotency-Key is missing");
    let too_long = "k".repeat(65);
    for bad in ["has space", "\"unterminated", "a/b", too_long.as_str()] {
        let response = post(&server, "t1", Some(bad), TEN_EUR).await;
        assert_eq!(response.status, 400, "key {bad:?}");
        assert_eq!(response.problem_title(), "Idempotency-Key is malformed");
    }
    assert_eq!(app.runs.load(SeqCst), 1);

    // The draft's quoted form is the same key as the bare one.
    let quoted = post(&server, "t1", Some("\"k-1\""), TEN_EUR).await;
    assert_eq!((quoted.status, quoted.replayed), (201, true));

    // Two tenants' equal keys are different intents.
    let other = post(&server, "t2", Some("k-1"), TEN_EUR).await;
    assert_eq!((other.status, other.replayed), (201, false));
    assert_ne!(other.location, first.location);
    assert_eq!(app.runs.load(SeqCst), 2);

    // Safe methods pass through without a key.
    let list = reqwest::get(server.url("/orders")).await.unwrap();
    assert_eq!(list.status(), 200);
    assert_eq!(list.text().await.unwrap(), "listing");
}
test_on_all_databases!(first_201_replay_conflict_and_key_errors, SCHEMAS);

async fn in_progress_is_202_until_the_first_request_finishes<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let (server, app) = start(db).await;
    let server = Arc::new(server);
    let body = r#"{"amount": 5, "slow": true}"#;
    let first = {
        let server = server.clone();
        tokio::spawn(async move { post(&server, "t1", Some("slow-1"), body).await })
    };
    tokio::time::timeout(Duration::from_secs(10), app.entered.notified())
        .await
        .expect("the first request reaches the handler");

    let concurrent = post(&server, "t1", Some("slow-1"), body).await;
    assert_eq!(concurrent.status, 202);
    let retry_after: u64 = concurrent.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(
        concurrent.problem_title(),
        "A request with this Idempotency-Key is being processed"
    );

    app.gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!((first.status, first.replayed), (201, false));
    let after = post(&server, "t1", Some("slow-1"), body).await;
    assert_eq!((after.status, after.replayed), (201, true));
    assert_eq!(after.body, first.body);
    assert_eq!(app.runs.load(SeqCst), 1);
    assert_eq!(orders_for(&db.pool, "t1/slow-1").await, 1);
}
test_on_all_databases!(in_progress_is_202_until_the_first_request_finishes, SCHEMAS);

async fn failures_are_replayed_retried_or_held_by_class<DB: TestBackend>(db: &'static TestDb<DB>) {
    let (server, app) = start(db).await;

    // A final 4xx is recorded and replayed.
    let body = r#"{"amount": -5}"#;
    let refused = post(&server, "t1", Some("neg"), body).await;
    assert_eq!((refused.status, refused.replayed), (422, false));
    let replay = post(&server, "t1", Some("neg"), body).await;
    assert_eq!((replay.status, replay.replayed), (422, true));
    assert_eq!(replay.body, refused.body);
    assert_eq!(app.runs.load(SeqCst), 1);

    // A 503 is retryable: the repeat runs again.
    let body = r#"{"amount": 5, "busy": true}"#;
    for _ in 0..2 {
        let busy = post(&server, "t1", Some("busy"), body).await;
        assert_eq!((busy.status, busy.replayed), (503, false));
    }
    assert_eq!(app.runs.load(SeqCst), 3);

    // A 500 is unknown: the repeat is held (202), not run blindly.
    let body = r#"{"amount": 5, "crash": true}"#;
    assert_eq!(post(&server, "t1", Some("crash"), body).await.status, 500);
    assert_eq!(post(&server, "t1", Some("crash"), body).await.status, 202);
    assert_eq!(app.runs.load(SeqCst), 4);
}
test_on_all_databases!(failures_are_replayed_retried_or_held_by_class, SCHEMAS);

/// A handler that outlives its lease while alive keeps the record: the layer renews the lease
/// (every third of it) for as long as the handler runs, so a repeat is told "in progress" instead
/// of taking the record over, and the handler's 201 is what every later repeat gets.
async fn a_live_handler_keeps_its_lease<DB: TestBackend>(db: &'static TestDb<DB>) {
    let store = Idempotency::new(db.pool.clone()).lease(Duration::from_secs(1));
    let (server, app) = start_with(db, store).await;
    let server = Arc::new(server);
    let body = r#"{"amount": 7, "sleep_ms": 1700}"#;
    let started = tokio::time::Instant::now();
    let first = {
        let server = server.clone();
        tokio::spawn(async move { post(&server, "t1", Some("long-1"), body).await })
    };
    tokio::time::timeout(Duration::from_secs(10), app.entered.notified())
        .await
        .expect("the first request reaches the handler");

    // Past the 1 s lease, while the handler still runs.
    tokio::time::sleep_until(started + Duration::from_millis(1200)).await;
    let repeat = post(&server, "t1", Some("long-1"), body).await;
    assert_eq!(repeat.status, 202, "{repeat:?}");
    assert_eq!(
        repeat.problem_title(),
        "A request with this Idempotency-Key is being processed"
    );

    let first = first.await.unwrap();
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    for _ in 0..2 {
        let later = post(&server, "t1", Some("long-1"), body).await;
        assert_eq!((later.status, later.replayed), (201, true), "{later:?}");
        assert_eq!(
            (&later.body, &later.location),
            (&first.body, &first.location)
        );
    }
    assert_eq!(app.runs.load(SeqCst), 1);
    assert_eq!(orders_for(&db.pool, "t1/long-1").await, 1);
}
test_on_all_databases!(a_live_handler_keeps_its_lease, SCHEMAS);

/// Records of the orders scope, whatever their tenant.
async fn records<DB: TestBackend>(db: &TestDb<DB>) -> i64 {
    dtx_tests::idempotency::count(
        &db.pool,
        "SELECT COUNT(*) FROM dtx_idempotency WHERE scope = ?",
        "order.create",
    )
    .await
}

async fn new_keys_past_a_tenants_limit_are_429_and_stored_nowhere<DB: TestBackend>(
    db: &'static TestDb<DB>,
) {
    let layer = header_tenant(Idempotency::new(db.pool.clone())).limit_new_keys(
        std::num::NonZeroU32::new(3).unwrap(),
        Duration::from_secs(3600),
    );
    let (server, app) = serve(db, layer, false).await;
    for key in ["k1", "k2", "k3"] {
        let first = post(&server, "t1", Some(key), TEN_EUR).await;
        assert_eq!(first.status, 201, "{first:?}");
    }
    let over = post(&server, "t1", Some("k4"), TEN_EUR).await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(over.problem_title(), "Too many new Idempotency-Keys");
    let wait: u64 = over.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=1200).contains(&wait), "Retry-After {wait}");
    assert!(over.body.contains("At most 3 new keys"), "{}", over.body);
    assert_eq!(app.runs.load(SeqCst), 3, "the handler ran past the limit");
    assert_eq!(records(db).await, 3, "the refused key was stored");

    // Repeats of known keys are never limited; another tenant has its own allowance.
    let repeat = post(&server, "t1", Some("k1"), TEN_EUR).await;
    assert_eq!((repeat.status, repeat.replayed), (201, true), "{repeat:?}");
    let other = post(&server, "t2", Some("k4"), TEN_EUR).await;
    assert_eq!((other.status, other.replayed), (201, false), "{other:?}");
    assert_eq!(app.runs.load(SeqCst), 4);
    assert_eq!(orders_for(&db.pool, "t1/k4").await, 0);
}
test_on_all_databases!(
    new_keys_past_a_tenants_limit_are_429_and_stored_nowhere,
    SCHEMAS
);

/// The layer runs after the service's authentication: a refused caller leaves no record, and
/// the tenant authentication established keys the record (two tenants' equal keys never meet).
async fn authentication_runs_before_any_record_is_made<DB: TestBackend>(db: &'static TestDb<DB>) {
    let layer = IdempotencyLayer::new(Idempotency::new(db.pool.clone()), "order.create")
        .unwrap()
        .tenant(|parts| parts.extensions.get::<Tenant>().map(|t| t.0.clone()));
    let (server, app) = serve(db, layer, true).await;
    let send = |token: Option<&'static str>, key: &'static str| {
        let mut request = reqwest::Client::new()
            .post(server.url("/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(TEN_EUR);
        if let Some(token) = token {
            // The handler keys its orders by this header; the layer by the authenticated tenant.
            request = request.bearer_auth(token).header("x-tenant", token);
        }
        request.send()
    };
    for token in [None, Some("mallory")] {
        for i in 0..20 {
            let key: &'static str = Box::leak(format!("spray-{i}").into_boxed_str());
            let refused = send(token, key).await.unwrap();
            assert_eq!(refused.status(), 401);
        }
    }
    assert_eq!(records(db).await, 0, "refused callers created records");
    assert_eq!(app.runs.load(SeqCst), 0);

    let acme = send(Some("acme"), "same-key").await.unwrap();
    assert_eq!(acme.status(), 201);
    let globex = send(Some("globex"), "same-key").await.unwrap();
    assert_eq!(
        globex.status(),
        201,
        "another tenant's equal key met the first"
    );
    assert!(globex.headers().get("idempotent-replayed").is_none());
    let again = send(Some("acme"), "same-key").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(app.runs.load(SeqCst), 2);
    assert_eq!(records(db).await, 2);
}
test_on_all_databases!(authentication_runs_before_any_record_is_made, SCHEMAS);
