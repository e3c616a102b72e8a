//! The web console (`--admin-listen`): server-rendered pages on the same calls as the Admin
//! service ([`crate::admin`]), a little plain JavaScript for refreshing, nothing to build.
//!
//! Actions are POSTed forms with a confirmation step; a POST whose `Origin` is not this host is
//! refused (another site cannot act through an operator's browser).

mod html;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use dtx_proto::v1 as wire;
use tokio::net::TcpListener;

use crate::admin::{self, ANONYMOUS, Action};
use crate::engine::Engine;

pub use html::escape;

/// Serves the console on `listener` until the process ends.
pub async fn serve(listener: TcpListener, engine: Engine) {
    let app = Router::new()
        .route("/", get(queue))
        .route("/transactions", get(transactions))
        .route("/tx/{xid}", get(transaction))
        .route("/tx/{xid}/{action}", axum::routing::post(act))
        .with_state(engine);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "web console stopped");
    }
}

/// An Admin error as a page with the HTTP status of its gRPC code.
fn failed(status: tonic::Status) -> Response {
    let code = StatusCode::from_u16(dtx_proto::http::http_status(status.code()))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Html(html::error(status.message()))).into_response()
}

async fn queue(State(engine): State<Engine>) -> Response {
    let parked = wire::ListTransactionsRequest {
        needs_attention: true,
        limit: 100,
        ..Default::default()
    };
    match (
        admin::list(&engine, parked).await,
        admin::stats(&engine).await,
    ) {
        (Ok(parked), Ok(stats)) => Html(html::queue(&parked, &stats)).into_response(),
        (Err(e), _) | (_, Err(e)) => failed(e),
    }
}

async fn transactions(State(engine): State<Engine>, Query(f): Query<html::Filters>) -> Response {
    let statuses = match crate::domain::TxStatus::parse(&f.status) {
        Some(s) => vec![crate::grpc::wire_status(s) as i32],
        None => Vec::new(),
    };
    let kind = match f.kind.as_str() {
        "tcc" => wire::TxKind::Tcc,
        "saga" => wire::TxKind::Saga,
        _ => wire::TxKind::Unspecified,
    };
    let request = wire::ListTransactionsRequest {
        statuses,
        kind: kind as i32,
        xid_prefix: f.prefix.trim().to_string(),
        page_token: f.page_token.clone(),
        ..Default::default()
    };
    match admin::list(&engine, request).await {
        Ok(listed) => Html(html::transactions(&f, &listed)).into_response(),
        Err(e) => failed(e),
    }
}

#[derive(Debug, serde::Deserialize)]
struct Done {
    done: Option<String>,
}

async fn transaction(
    State(engine): State<Engine>,
    Path(xid): Path<String>,
    Query(done): Query<Done>,
) -> Response {
    match admin::detail(&engine, &xid).await {
        Ok(d) => {
            let banner = done.done.map(|a| format!("{a}: done"));
            Html(html::transaction(&d, banner.as_deref().map(|b| ("ok", b)))).into_response()
        }
        Err(e) => failed(e),
    }
}

#[derive(Debug, serde::Deserialize)]
struct ActionForm {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    operator: String,
    #[serde(default)]
    confirmed: String,
}

/// Whether a POST comes from a page of this console (its `Origin` names this host), or from
/// a client that sends no `Origin` (not a browser form on another site).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    host.is_some_and(|host| {
        origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            == Some(host)
    })
}

async fn act(
    State(engine): State<Engine>,
    Path((xid, action)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if !same_origin(&headers) {
        let message = "refused: the request came from another site";
        return (StatusCode::FORBIDDEN, Html(html::error(message))).into_response();
    }
    let which = match action.as_str() {
        "resume" => Action::Resume,
        "rollback" => Action::ForceRollback,
        "retry" => Action::RetryNow,
        _ => return (StatusCode::NOT_FOUND, Html(html::error("no such action"))).into_response(),
    };
    let operator = match form.operator.trim() {
        "" => ANONYMOUS.to_string(),
        name => name.to_string(),
    };
    if let Err(e) = dtx_proto::limits::check_operator("operator", &operator) {
        return failed(tonic::Status::invalid_argument(e.0));
    }
    if form.confirmed != "yes" {
        let page = html::confirm(&xid, &action, &form.reason, &operator);
        return Html(page).into_response();
    }
    match admin::act(&engine, which, &xid, form.reason, operator).await {
        Ok(_) => Redirect::to(&format!("/tx/{}?done={action}", html::encode(&xid))).into_response(),
        Err(e) if e.code() == tonic::Code::NotFound => failed(e),
        Err(e) => {
            // Refused or invalid: the transaction's page, saying why.
            let code = if e.code() == tonic::Code::InvalidArgument {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::CONFLICT
            };
            match admin::detail(&engine, &xid).await {
                Ok(d) => {
                    let page = html::transaction(&d, Some(("error", e.message())));
                    (code, Html(page)).into_response()
                }
                Err(e) => failed(e),
            }
        }
    }
}
