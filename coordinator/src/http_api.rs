//! The Coordinator and Admin services as JSON over HTTP (`--http-listen`), for callers without
//! gRPC: `POST /dtx.v1.Coordinator/<Method>` (or `/dtx.v1.Admin/<Method>`) with the request
//! message in the proto3 JSON mapping, answered with the response message in JSON (200) or an
//! `application/problem+json` body carrying the gRPC code (`dtx_proto::http` has the table).
//!
//! Each route calls the very service implementation the gRPC server runs, with the HTTP
//! headers as its metadata (so `traceparent` and `x-dtx-operator` work the same), and the
//! messages' serde is generated from the proto: semantics, limits, codes and idempotence
//! are the gRPC ones by construction, and a test checks that every RPC has its route.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use dtx_proto::http::{PROBLEM_JSON, Problem};
use dtx_proto::limits::MAX_REQUEST_BYTES;
use dtx_proto::reason::Reason;
use dtx_proto::v1::admin_server::Admin;
use dtx_proto::v1::coordinator_server::Coordinator;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;

use crate::admin::AdminService;
use crate::engine::Engine;
use crate::grpc::CoordinatorService;
use crate::listen::BodyError;

/// Largest request body: a request at the gRPC limit, its bytes fields in base64 (4/3) and
/// the JSON around them.
pub const MAX_BODY_BYTES: usize = MAX_REQUEST_BYTES * 3 / 2;

/// One route per RPC of a service: `POST /<service>/<Method>` calls the method of the same
/// name on the gRPC implementation. Also the list of the methods served, which a test
/// compares with the proto.
macro_rules! service_routes {
    ($routes:ident, $methods:ident, $svc:ty, $service:literal, { $($name:literal => $method:ident),* $(,)? }) => {
        #[doc = concat!("The methods of `", $service, "` served over HTTP.")]
        pub const $methods: &[&str] = &[$($name),*];

        fn $routes(mut router: Router, svc: Arc<$svc>) -> Router {
            $(
                let call = svc.clone();
                router = router.route(
                    concat!("/", $service, "/", $name),
                    post(move |headers: HeaderMap, body: Body| async move {
                        unary(headers, body, |request| async move { call.$method(request).await })
                            .await
                    }),
                );
            )*
            router
        }
    };
}

service_routes!(coordinator_routes, COORDINATOR_METHODS, CoordinatorService, "dtx.v1.Coordinator", {
    "Begin" => begin,
    "RegisterBranch" => register_branch,
    "Commit" => commit,
    "Rollback" => rollback,
    "SubmitSaga" => submit_saga,
    "Get" => get,
    "Wait" => wait,
    "Resume" => resume,
    "PrepareMessage" => prepare_message,
    "SubmitMessage" => submit_message,
    "AbortMessage" => abort_message,
});

service_routes!(admin_routes, ADMIN_METHODS, AdminService, "dtx.v1.Admin", {
    "ListTransactions" => list_transactions,
    "DescribeTransaction" => describe_transaction,
    "Resume" => resume,
    "ForceRollback" => force_rollback,
    "RetryNow" => retry_now,
    "Stats" => stats,
});

/// The routes of both services.
pub fn router(
    engine: Engine,
    auth: crate::auth::Auth,
    quotas: Arc<crate::quota::Quotas>,
) -> Router {
    let router = coordinator_routes(
        Router::new(),
        Arc::new(CoordinatorService::plain(
            engine.clone(),
            auth.clone(),
            quotas,
        )),
    );
    admin_routes(router, Arc::new(AdminService::plain(engine, auth)))
        // The body limit is checked by `decode`, with a message naming it.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
}

/// Any other path: problem+json like every other error, saying what is served.
async fn no_route(uri: axum::http::Uri) -> Response {
    problem(&Reason::UnknownMethod.status(format!(
        "no route {}: the RPCs are served as POST /dtx.v1.Coordinator/<Method> and POST \
         /dtx.v1.Admin/<Method>",
        uri.path()
    )))
}

/// A route's path with another method than POST.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let status = Status::unimplemented(format!(
        "{method} {} is not served: RPCs are called with POST",
        uri.path()
    ));
    let mut response = problem_as(Some(StatusCode::METHOD_NOT_ALLOWED), &status);
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// Decodes the JSON request, calls the service with the headers as metadata, encodes the
/// answer.
async fn unary<Req, Resp, F, Fut>(headers: HeaderMap, body: Body, call: F) -> Response
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let body = match read(body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let message = match decode::<Req>(&body) {
        Ok(message) => message,
        Err(status) => return problem(&status),
    };
    let request = tonic::Request::from_parts(
        tonic::metadata::MetadataMap::from_headers(headers),
        tonic::Extensions::default(),
        message,
    );
    match call(request).await {
        Ok(response) => match serde_json::to_vec(response.get_ref()) {
            Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
            Err(e) => problem(&Reason::Internal.status(format!("encoding the answer: {e}"))),
        },
        Err(status) => problem(&status),
    }
}

/// The whole body, or the problem saying which limit of the listener it broke (413 for the
/// size, 408 for the time: the listener cut it while it was read).
async fn read(body: Body) -> Result<Bytes, Response> {
    use http_body_util::BodyExt;
    match body.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => {
            let (code, detail) = match BodyError::find(&e) {
                Some(BodyError::TooLarge { limit }) => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the request body is larger than the limit of {limit} bytes for a JSON \
                         request ({MAX_REQUEST_BYTES} bytes as protobuf)"
                    ),
                ),
                Some(slow @ BodyError::TooSlow { .. }) => {
                    (StatusCode::REQUEST_TIMEOUT, slow.to_string())
                }
                None => (
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body: {e}"),
                ),
            };
            Err(problem_as(
                Some(code),
                &Reason::InvalidRequest.status(detail),
            ))
        }
    }
}

/// The request message; an empty body is the message with every field at its default.
fn decode<Req: DeserializeOwned + Default>(body: &[u8]) -> Result<Req, Status> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Reason::InvalidRequest.status(format!(
            "the request body is {} bytes, larger than the limit of {MAX_BODY_BYTES} bytes for \
             a JSON request ({MAX_REQUEST_BYTES} bytes as protobuf)",
            body.len()
        )));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Req::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        let name = std::any::type_name::<Req>()
            .rsplit("::")
            .next()
            .unwrap_or("request");
        Reason::InvalidRequest.status(format!("the request body is not a {name} in JSON: {e}"))
    })
}

/// A non-OK status as problem+json, its metadata (e.g. `dtx-status`) as headers.
fn problem(status: &Status) -> Response {
    problem_as(None, status)
}

/// [`problem`] with another HTTP status than the code's own (the body says the same).
fn problem_as(http: Option<StatusCode>, status: &Status) -> Response {
    let mut body = Problem::of_status(status);
    if let Some(http) = http {
        body.status = http.as_u16();
    }
    let code = StatusCode::from_u16(body.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut headers = status.metadata().clone().into_headers();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    let json = serde_json::to_vec(&body).unwrap_or_default();
    (code, headers, json).into_response()
}
