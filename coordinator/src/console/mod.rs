//! The web console (`--admin-listen`): server-rendered pages on the same calls as the Admin
//! service ([`crate::admin`]), a little plain JavaScript for refreshing, nothing to build.
//!
//! Actions are POSTed forms with a confirmation step. What keeps other sites out: every request
//! must name this console in `Host` (an IP address, `localhost` or a configured name - a page
//! reached through DNS rebinding names the attacker's host), a POST must carry an `Origin` of
//! this host (browsers send one with every form POST; a request without it is not one of
//! our forms), and every answer forbids framing, MIME sniffing and any script or style not
//! served by the console itself.
//!
//! With auth on, a person signs in by pasting a token (one with the reader or operator role) on
//! `/login`: the console keeps it server-side and hands the browser a random session id in a
//! cookie (`HttpOnly`, `SameSite=Strict`, `Secure` under TLS), re-checks the token on every
//! request (so an expired or removed token ends the session), shows only the token's tenant and
//! records actions under the token's subject.

mod html;
mod session;

use axum::Router;
use axum::extract::{Extension, Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use dtx_proto::reason::Reason;
use dtx_proto::v1 as wire;

use crate::admin::{self, ANONYMOUS, Action};
use crate::auth::{Auth, CONSOLE_ACT, CONSOLE_READ, Caller};
use crate::engine::Engine;
use session::Sessions;

/// The Content-Security-Policy of every answer: only the console's own script and style, no
/// frames, forms that post only back here.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, answering only to `hosts` (lower-case names) besides IP addresses and
/// `localhost`; `secure` when it is served over TLS (its cookie then says so).
pub fn router(engine: Engine, hosts: Vec<String>, auth: Auth, secure: bool) -> Router {
    let hosts = std::sync::Arc::new(hosts);
    let sessions = Sessions::new(auth, secure);
    let pages = Router::new()
        .route("/", get(queue))
        .route("/transactions", get(transactions))
        .route("/tx/{xid}", get(transaction))
        .route("/tx/{xid}/{action}", axum::routing::post(act))
        .with_state(engine)
        .layer(axum::middleware::from_fn_with_state(
            sessions.clone(),
            session::signed_in,
        ));
    Router::new()
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", axum::routing::post(session::logout))
        .with_state(sessions)
        .route(
            "/console.js",
            get(|| asset("text/javascript", html::SCRIPT)),
        )
        .route("/console.css", get(|| asset("text/css", html::STYLE)))
        .merge(pages)
        .layer(axum::middleware::from_fn(move |request, next| {
            guard(hosts.clone(), request, next)
        }))
}

async fn asset(content_type: &'static str, text: &'static str) -> Response {
    let cache = "max-age=300";
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, cache),
        ],
        text,
    )
        .into_response()
}

/// Refuses a foreign `Host` and a POST without this host's `Origin`; adds the security
/// headers to every answer.
async fn guard(hosts: std::sync::Arc<Vec<String>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let refusal = if !known_host(headers, &hosts) {
        Some("refused: the console is not served under this host name (see --admin-host)")
    } else if request.method() == axum::http::Method::POST && !same_origin(headers) {
        Some("refused: the request did not come from a page of this console")
    } else {
        None
    };
    let mut response = match refusal {
        Some(message) => (StatusCode::FORBIDDEN, Html(html::error(message))).into_response(),
        None => next.run(request).await,
    };
    let set = response.headers_mut();
    set.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    set.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    set.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    set.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// Whether `Host` names this console: an IP address (a rebinding page cannot make the browser
/// send one), `localhost`, or one of `hosts`.
fn known_host(headers: &HeaderMap, hosts: &[String]) -> bool {
    let authority = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok());
    let Some(authority) = authority else {
        return false;
    };
    let name = authority.host();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || hosts.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether a POST's `Origin` is this console (same scheme-less host and port as `Host`).
fn same_origin(headers: &HeaderMap) -> bool {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match (origin, host) {
        (Some(origin), Some(host)) => {
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                == Some(host)
        }
        _ => false,
    }
}

/// An Admin error as a page with the HTTP status of its gRPC code.
fn failed(status: tonic::Status) -> Response {
    let code = StatusCode::from_u16(dtx_proto::http::http_status(status.code()))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Html(html::error(status.message()))).into_response()
}

/// The refusal page when the caller's roles do not allow `what` ([`CONSOLE_READ`] or
/// [`CONSOLE_ACT`]).
fn refused(caller: &Caller, what: &str) -> Option<Response> {
    crate::auth::authorize(caller, what).err().map(failed)
}

async fn queue(State(engine): State<Engine>, Extension(caller): Extension<Caller>) -> Response {
    if let Some(refused) = refused(&caller, CONSOLE_READ) {
        return refused;
    }
    let parked = wire::ListTransactionsRequest {
        needs_attention: true,
        limit: 100,
        ..Default::default()
    };
    match (
        admin::list(&engine, &caller, parked).await,
        admin::stats(&engine).await,
    ) {
        (Ok(parked), Ok(stats)) => Html(html::queue(&parked, &stats)).into_response(),
        (Err(e), _) | (_, Err(e)) => failed(e),
    }
}

async fn transactions(
    State(engine): State<Engine>,
    Extension(caller): Extension<Caller>,
    Query(f): Query<html::Filters>,
) -> Response {
    if let Some(refused) = refused(&caller, CONSOLE_READ) {
        return refused;
    }
    let statuses = match crate::domain::TxStatus::parse(&f.status) {
        Some(s) => vec![crate::grpc::wire_status(s) as i32],
        None => Vec::new(),
    };
    let kind = match f.kind.as_str() {
        "tcc" => wire::TxKind::Tcc,
        "saga" => wire::TxKind::Saga,
        "message" => wire::TxKind::Message,
        _ => wire::TxKind::Unspecified,
    };
    let request = wire::ListTransactionsRequest {
        statuses,
        kind: kind as i32,
        xid_prefix: f.prefix.trim().to_string(),
        page_token: f.page_token.clone(),
        ..Default::default()
    };
    match admin::list(&engine, &caller, request).await {
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
    Extension(caller): Extension<Caller>,
    Path(xid): Path<String>,
    Query(done): Query<Done>,
) -> Response {
    if let Some(refused) = refused(&caller, CONSOLE_READ) {
        return refused;
    }
    match admin::detail(&engine, &caller, &xid).await {
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

async fn act(
    State(engine): State<Engine>,
    Extension(mut caller): Extension<Caller>,
    Path((xid, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = refused(&caller, CONSOLE_ACT) {
        return refused;
    }
    let which = match action.as_str() {
        "resume" => Action::Resume,
        "rollback" => Action::ForceRollback,
        "retry" => Action::RetryNow,
        _ => return (StatusCode::NOT_FOUND, Html(html::error("no such action"))).into_response(),
    };
    // With auth off the form names the operator; with auth on it is the token's subject.
    if !caller.authenticated {
        caller.subject = match form.operator.trim() {
            "" => ANONYMOUS.to_string(),
            name => name.to_string(),
        };
        if let Err(e) = dtx_proto::limits::check_operator("operator", &caller.subject) {
            return failed(Reason::InvalidRequest.status(e.0));
        }
    }
    if form.confirmed != "yes" {
        let page = html::confirm(&xid, &action, &form.reason, &caller.subject);
        return Html(page).into_response();
    }
    match admin::act(&engine, &caller, which, &xid, form.reason).await {
        Ok(_) => Redirect::to(&format!("/tx/{}?done={action}", html::encode(&xid))).into_response(),
        Err(e) if e.code() == tonic::Code::NotFound => failed(e),
        Err(e) => {
            // Refused or invalid: the transaction's page, saying why.
            let code = if e.code() == tonic::Code::InvalidArgument {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::CONFLICT
            };
            match admin::detail(&engine, &caller, &xid).await {
                Ok(d) => {
                    let page = html::transaction(&d, Some(("error", e.message())));
                    (code, Html(page)).into_response()
                }
                Err(e) => failed(e),
            }
        }
    }
}
