//! Console sign-in: a token pasted once, kept server-side under a random session id that the
//! browser holds in a cookie. Every request re-checks the token, so expiry and removal from
//! the token file end the session; a restart ends every session (sign in again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Form, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};

use super::html;
use crate::auth::{Auth, CONSOLE_READ};

/// The cookie holding the session id.
const COOKIE: &str = "dtx_session";

/// A session ends this long after sign-in, whatever the token's own expiry.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Most sessions kept; past it the oldest is dropped.
const MAX_SESSIONS: usize = 10_000;

/// The signed-in sessions of one console.
#[derive(Clone)]
pub struct Sessions {
    auth: Auth,
    secure: bool,
    open: Arc<Mutex<HashMap<String, Session>>>,
}

struct Session {
    token: String,
    since: Instant,
}

impl Sessions {
    pub fn new(auth: Auth, secure: bool) -> Sessions {
        Sessions {
            auth,
            secure,
            open: Arc::default(),
        }
    }

    fn token_of(&self, headers: &HeaderMap) -> Option<String> {
        let id = cookie(headers, COOKIE)?;
        let mut open = self.open.lock().expect("sessions");
        match open.get(id) {
            Some(s) if s.since.elapsed() < SESSION_LIFETIME => Some(s.token.clone()),
            Some(_) => {
                open.remove(id);
                None
            }
            None => None,
        }
    }

    fn open_session(&self, token: String) -> String {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let id = hex::encode(bytes);
        let mut open = self.open.lock().expect("sessions");
        open.retain(|_, s| s.since.elapsed() < SESSION_LIFETIME);
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open
                .iter()
                .min_by_key(|(_, s)| s.since)
                .map(|(id, _)| id.clone())
        {
            open.remove(&oldest);
        }
        open.insert(
            id.clone(),
            Session {
                token,
                since: Instant::now(),
            },
        );
        id
    }

    fn cookie(&self, value: &str, max_age: Option<u64>) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let age = max_age.map_or(String::new(), |s| format!("; Max-Age={s}"));
        HeaderValue::from_str(&format!(
            "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict{secure}{age}"
        ))
        .expect("cookie is ASCII")
    }
}

/// The value of cookie `name`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Gives every page its caller: with auth off an anonymous one; with auth on the session's, or
/// the sign-in page (a GET) or 401 (anything else) without a valid session.
pub async fn signed_in(
    State(sessions): State<Sessions>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = if sessions.auth.enabled() {
        sessions
            .token_of(request.headers())
            .and_then(|token| sessions.auth.verify_token(&token).ok())
    } else {
        sessions
            .auth
            .authenticate(&tonic::metadata::MetadataMap::new())
            .ok()
    };
    match caller {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None if request.method() == axum::http::Method::GET => {
            Redirect::to("/login").into_response()
        }
        None => (
            StatusCode::UNAUTHORIZED,
            Html(html::error("sign in first: your session ended")),
        )
            .into_response(),
    }
}

pub async fn login_page(State(sessions): State<Sessions>) -> Response {
    if !sessions.auth.enabled() {
        return Redirect::to("/").into_response();
    }
    Html(html::login(None)).into_response()
}

#[derive(serde::Deserialize)]
pub struct Login {
    #[serde(default)]
    token: String,
}

/// Checks the token (it must allow the console's pages) and opens a session.
pub async fn login(State(sessions): State<Sessions>, Form(form): Form<Login>) -> Response {
    let token = form.token.trim().to_string();
    let refused = |message: &str| {
        (StatusCode::UNAUTHORIZED, Html(html::login(Some(message)))).into_response()
    };
    if !sessions.auth.enabled() {
        return Redirect::to("/").into_response();
    }
    let caller = match sessions.auth.verify_token(&token) {
        Ok(caller) => caller,
        Err(e) => return refused(e.message()),
    };
    if let Err(e) = crate::auth::authorize(&caller, CONSOLE_READ) {
        return refused(e.message());
    }
    tracing::info!(subject = %caller.subject, tenant = %caller.tenant, "console sign-in");
    let id = sessions.open_session(token);
    let mut response = Redirect::to("/").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sessions.cookie(&id, None));
    response
}

/// Ends the session.
pub async fn logout(State(sessions): State<Sessions>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers, COOKIE) {
        sessions.open.lock().expect("sessions").remove(id);
    }
    let mut response = Redirect::to("/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sessions.cookie("", Some(0)));
    response
}
