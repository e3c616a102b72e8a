//! dtx-payments: payment callbacks handled the way the rules of every payment integration say
//! (`../shared/seed`, "payment callbacks"), as a handler a service mounts:
//!
//! 1. the signature over the raw body is verified first ([`Verifier`], [`HmacSha256`]) - a
//!    forged, tampered or replayed-after-the-window callback is answered 401 and nothing is
//!    stored;
//! 2. the notification's shape, then its merchant, amount and currency against the order;
//! 3. the idempotency record is keyed by provider + merchant + trade number (+ event type);
//! 4. in one local transaction: the payment row (unique), the order's forward-only transition
//!    ([`dtx_state`]: `WAIT_PAY -> PAID`, never back) and an outbox event ([`dtx_outbox`]);
//! 5. only after that commit, the acknowledgement the provider expects.
//!
//! A repeated callback gets the same acknowledgement and has no effect; a late one for an order
//! that moved on (PAID, then SHIPPED) is acknowledged and ignored. A callback that cannot be
//! applied - the same trade number with another amount, an amount that is not the order's, an
//! order closed or paid by another trade - is logged, counted and parked in
//! `dtx_payment_conflicts` for a person ([`parked`], [`resolve`]), and answered 409: never
//! acknowledged as a success.

mod error;
pub mod metrics;
mod notification;
mod signature;
mod sql;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use dtx_idempotency::{
    Answer, Completion, HandlerError, Idempotency, Key, RequestHash, Status, StoredResult,
};
use dtx_sql::sqlx::Pool;
use dtx_sql::{Arg, Backend, Conn, Schema, SqlRow, args};
use dtx_state::{Entity, Outcome};
use futures::future::BoxFuture;
use http::{HeaderMap, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

pub use error::Error;
/// The `http` crate the signature and acknowledgement types come from.
pub use http;
pub use notification::{MAX_ID, Notification};
pub use signature::{HmacSha256, SignatureError, Verifier, sign};

/// Creates (or upgrades) every table the callbacks write: `dtx_payments` and
/// `dtx_payment_conflicts`, the idempotency records, the transition log and the outbox.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), Error> {
    DB::migrate(pool, Schema::Payments).await?;
    DB::migrate(pool, Schema::Idempotency).await?;
    DB::migrate(pool, Schema::Transitions).await?;
    DB::migrate(pool, Schema::Outbox).await?;
    Ok(())
}

/// How one callback ended; [`IntoResponse`] turns it into the answer the provider gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// First time: the order moved, the payment row and the outbox event were written.
    Applied,
    /// A repeat of an applied callback: same acknowledgement, no effect.
    Repeated,
    /// The order is already past the state this event moves it to (a late event): acknowledged.
    Stale,
    /// An event type the shop does not handle: acknowledged, counted.
    Ignored,
    /// 401: nothing was read or stored.
    BadSignature(SignatureError),
    /// 400: signed, but not a notification this handler understands.
    Malformed(String),
    /// 409: parked for a person with this reason; never acknowledged as a success.
    Conflict(String),
    /// 503 with `Retry-After`: the same callback is being applied right now, or the database
    /// failed. The provider sends it again.
    RetryLater(String),
}

impl Handled {
    fn outcome(&self) -> &'static str {
        match self {
            Handled::Applied => "applied",
            Handled::Repeated => "repeated",
            Handled::Stale => "stale",
            Handled::Ignored => "ignored",
            Handled::BadSignature(_) => "bad_signature",
            Handled::Malformed(_) => "malformed",
            Handled::Conflict(_) => "conflict",
            Handled::RetryLater(_) => "retry_later",
        }
    }

    /// Whether the provider is told "received".
    pub fn is_acknowledged(&self) -> bool {
        matches!(
            self,
            Handled::Applied | Handled::Repeated | Handled::Stale | Handled::Ignored
        )
    }
}

/// A callback's answer: the provider's acknowledgement, or a status saying why not.
pub struct Answered {
    /// What happened to the callback.
    pub handled: Handled,
    ack: Arc<(StatusCode, Bytes)>,
}

impl IntoResponse for Answered {
    fn into_response(self) -> Response {
        let (status, text) = match &self.handled {
            h if h.is_acknowledged() => return (self.ack.0, self.ack.1.clone()).into_response(),
            Handled::BadSignature(e) => (StatusCode::UNAUTHORIZED, e.to_string()),
            Handled::Malformed(e) => (StatusCode::BAD_REQUEST, e.clone()),
            Handled::Conflict(_) => (
                StatusCode::CONFLICT,
                "parked for review: this callback cannot be applied to its order".into(),
            ),
            _ => {
                let mut response =
                    (StatusCode::SERVICE_UNAVAILABLE, "try again later").into_response();
                let retry = HeaderValue::from_static("5");
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, retry);
                return response;
            }
        };
        (status, text).into_response()
    }
}

/// What a handled event type does: the state it moves the order to and the topic of the
/// outbox event written with the move.
#[derive(Debug, Clone)]
struct Effect {
    state: String,
    topic: String,
}

/// The callbacks of one provider for one merchant account, applied to one order table.
pub struct Callbacks<DB: Backend> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Backend> Clone for Callbacks<DB> {
    fn clone(&self) -> Self {
        Callbacks {
            inner: self.inner.clone(),
        }
    }
}

type Parser = dyn Fn(&[u8]) -> Result<Notification, String> + Send + Sync;

/// What the builder gathers and the handler keeps, as given.
struct Settings<DB: Backend> {
    pool: Pool<DB>,
    provider: String,
    merchant: String,
    verifier: Box<dyn Verifier>,
    parse: Box<Parser>,
    effects: HashMap<String, Effect>,
    orders: Entity,
    ack: Arc<(StatusCode, Bytes)>,
}

struct Inner<DB: Backend> {
    settings: Settings<DB>,
    records: Idempotency<DB>,
    /// `SELECT <amount>, <currency> FROM <orders> WHERE <id> = ?`
    expected: String,
}

/// Configures [`Callbacks`]; see [`Callbacks::builder`].
pub struct CallbacksBuilder<DB: Backend> {
    settings: Settings<DB>,
    columns: (String, String),
}

impl<DB: Backend> Callbacks<DB> {
    /// Callbacks from `provider` (a name of `[A-Za-z0-9._-]`) for the shop's account
    /// `merchant`, verified by `verifier`, moving orders of `orders` (their amount and currency
    /// are read from the columns `amount` and `currency` of its table unless
    /// [`CallbacksBuilder::order_columns`] says otherwise). Bodies are
    /// [`Notification::from_json`] unless [`CallbacksBuilder::parser`] says otherwise; the
    /// acknowledgement is `200 success` unless [`CallbacksBuilder::acknowledgement`] says
    /// otherwise.
    pub fn builder(
        pool: Pool<DB>,
        provider: impl Into<String>,
        merchant: impl Into<String>,
        verifier: impl Verifier,
        orders: Entity,
    ) -> CallbacksBuilder<DB> {
        CallbacksBuilder {
            settings: Settings {
                pool,
                provider: provider.into(),
                merchant: merchant.into(),
                verifier: Box::new(verifier),
                parse: Box::new(Notification::from_json),
                effects: HashMap::new(),
                orders,
                ack: Arc::new((StatusCode::OK, Bytes::from_static(b"success"))),
            },
            columns: ("amount".into(), "currency".into()),
        }
    }

    /// A router serving the callbacks as `POST path`.
    pub fn router(self, path: &str) -> axum::Router {
        async fn callback<DB: Backend>(
            State(callbacks): State<Callbacks<DB>>,
            headers: HeaderMap,
            body: Bytes,
        ) -> Answered {
            callbacks.answer(&headers, &body).await
        }
        axum::Router::new()
            .route(path, axum::routing::post(callback::<DB>))
            .with_state(self)
    }

    /// Handles one callback (its headers and raw body) and says how to answer it.
    pub async fn answer(&self, headers: &HeaderMap, body: &[u8]) -> Answered {
        let handled = self.handle(headers, body).await;
        ::metrics::counter!(
            metrics::CALLBACKS,
            "provider" => self.inner.settings.provider.clone(),
            "outcome" => handled.outcome()
        )
        .increment(1);
        Answered {
            handled,
            ack: self.inner.settings.ack.clone(),
        }
    }

    /// Handles one callback: see the crate's documentation for the order of the steps.
    pub async fn handle(&self, headers: &HeaderMap, body: &[u8]) -> Handled {
        let inner = &self.inner;
        let provider = inner.settings.provider.as_str();
        if let Err(e) = inner
            .settings
            .verifier
            .verify(headers, body, dtx_sql::now_ms())
        {
            // Neither the body nor the header is logged: an attacker's text stays out of logs.
            tracing::warn!(provider, error = %e, "payment callback refused: signature");
            return Handled::BadSignature(e);
        }
        let n = match (inner.settings.parse)(body).and_then(|n| n.check().map(|()| n)) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(provider, error = %e, "payment callback refused: malformed");
                return Handled::Malformed(e);
            }
        };
        let Some(effect) = inner.settings.effects.get(&n.event_type).cloned() else {
            tracing::info!(provider, event_type = %n.event_type, "payment callback ignored");
            return Handled::Ignored;
        };
        if n.merchant != inner.settings.merchant {
            let reason = format!(
                "merchant {} is not this shop's {}",
                n.merchant, inner.settings.merchant
            );
            return self.park(&n, body, &reason).await;
        }
        let key = Key::builder(format!("payments.{provider}"))
            .business_id(format!("{}:{}:{}", n.merchant, n.trade_no, n.event_type))
            .build();
        let key = match key {
            Ok(key) => key,
            Err(e) => return Handled::Malformed(e.to_string()),
        };
        // What must not change between repeats of one trade's event.
        let content = RequestHash::of_bytes(
            format!("{}\n{}\n{}", n.order_no, n.amount, n.currency).as_bytes(),
        );
        let apply = applying(self.inner.clone(), n.clone(), effect);
        match inner
            .records
            .run_in_transaction(&key, &content, apply)
            .await
        {
            Ok(Answer::Executed(Completion::Succeeded(result))) => match result.code.as_str() {
                APPLIED => Handled::Applied,
                STALE => Handled::Stale,
                _ => Handled::Repeated,
            },
            Ok(Answer::Replayed {
                status: Status::Succeeded,
                ..
            }) => Handled::Repeated,
            Ok(Answer::Conflict) => {
                let reason = format!(
                    "trade {} was reported before with another order, amount or currency",
                    n.trade_no
                );
                self.park(&n, body, &reason).await
            }
            Ok(Answer::InProgress { .. }) => Handled::RetryLater("being applied now".into()),
            Ok(other) => Handled::RetryLater(format!("{other:?}")),
            Err(dtx_idempotency::Error::Handler(e)) if e.is::<Refusal>() => {
                self.park(&n, body, &e.to_string()).await
            }
            Err(e) => {
                tracing::error!(provider, trade_no = %n.trade_no, error = %e, "payment callback failed");
                Handled::RetryLater(e.to_string())
            }
        }
    }

    /// Logs, stores and answers a callback a person must look at.
    async fn park(&self, n: &Notification, body: &[u8], reason: &str) -> Handled {
        let inner = &self.inner;
        tracing::error!(
            provider = %inner.settings.provider,
            merchant = %n.merchant,
            trade_no = %n.trade_no,
            order_no = %n.order_no,
            reason,
            "payment callback parked for review"
        );
        let body_hash = hex::encode(Sha256::digest(body));
        let parked = async {
            let mut tx = DB::begin(&inner.settings.pool).await?;
            sql::park(
                DB::conn(&mut tx),
                &inner.settings.provider,
                &n.merchant,
                &n.trade_no,
                &n.order_no,
                &body_hash,
                reason,
                body,
                dtx_sql::now_ms(),
            )
            .await?;
            tx.commit().await
        };
        match parked.await {
            Ok(()) => Handled::Conflict(reason.into()),
            Err(e) => Handled::RetryLater(format!("parking failed: {e}")),
        }
    }
}

/// `Inner::apply` as the records' business closure (owning what it needs, so it is valid for
/// every connection lifetime the records call it with).
fn applying<DB: Backend>(
    inner: Arc<Inner<DB>>,
    n: Notification,
    effect: Effect,
) -> impl for<'c> Fn(&'c mut DB::Conn) -> BoxFuture<'c, Result<Completion, HandlerError>>
+ Send
+ Sync
+ use<DB> {
    move |conn| {
        let (inner, n, effect) = (inner.clone(), n.clone(), effect.clone());
        Box::pin(async move { inner.apply(conn, &n, &effect).await })
    }
}

/// The codes an applied callback's record keeps.
const APPLIED: &str = "APPLIED";
const REPEATED: &str = "REPEATED";
const STALE: &str = "STALE";

/// Why a verified callback cannot be applied: its transaction rolls back and it is parked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refusal(String);

fn refuse(reason: String) -> HandlerError {
    Box::new(Refusal(reason))
}

impl<DB: Backend> Inner<DB> {
    /// The business of one first callback, in the record's transaction.
    async fn apply(
        &self,
        conn: &mut DB::Conn,
        n: &Notification,
        effect: &Effect,
    ) -> Result<Completion, HandlerError> {
        let order: Arg = Arg::from(n.order_no.as_str());
        let rows = conn
            .fetch_all_dynamic(self.expected.clone(), &[order])
            .await?;
        let Some(row) = rows.first() else {
            return Err(refuse(format!("order {} does not exist", n.order_no)));
        };
        let (amount, currency) = (row.i64(0)?, row.text(1)?);
        if (amount, currency.as_str()) != (n.amount, n.currency.as_str()) {
            return Err(refuse(format!(
                "{} {} paid for order {} of {amount} {currency}",
                n.amount, n.currency, n.order_no
            )));
        }
        let now = dtx_sql::now_ms();
        if let Some(before) = sql::record(conn, &self.settings.provider, n, now).await? {
            // The record of the first callback was purged, the payment row was not.
            if before != (n.order_no.clone(), n.amount, n.currency.clone()) {
                return Err(refuse(format!(
                    "trade {} was recorded as {} {} for order {}",
                    n.trade_no, before.1, before.2, before.0
                )));
            }
        }
        let id = n.order_no.as_str().into();
        let code = match self
            .settings
            .orders
            .apply(conn, &id, &effect.state, Some(&n.trade_no))
            .await?
        {
            Outcome::Moved { .. } => {
                let payload = serde_json::json!({
                    "order_no": n.order_no,
                    "trade_no": n.trade_no,
                    "amount": n.amount,
                    "currency": n.currency,
                    "provider": self.settings.provider,
                });
                let headers = [("event_type".to_string(), n.event_type.clone())].into();
                let payload = serde_json::to_vec(&payload)?;
                dtx_outbox::enqueue(conn, &effect.topic, &n.order_no, &headers, &payload).await?;
                APPLIED
            }
            Outcome::AlreadyThere => REPEATED,
            Outcome::Stale { .. } => STALE,
            Outcome::Conflict { current, reason } => {
                return Err(refuse(format!(
                    "order {} is {current}: {reason}",
                    n.order_no
                )));
            }
        };
        Ok(Completion::Succeeded(StoredResult::new(code)))
    }
}

impl<DB: Backend> CallbacksBuilder<DB> {
    /// Event type `event_type` moves the order to `state` and writes an outbox event on
    /// `topic` (keyed by the order number). Other event types are acknowledged and ignored.
    pub fn event(
        mut self,
        event_type: impl Into<String>,
        state: impl Into<String>,
        topic: impl Into<String>,
    ) -> Self {
        let effect = Effect {
            state: state.into(),
            topic: topic.into(),
        };
        self.settings.effects.insert(event_type.into(), effect);
        self
    }

    /// The order table's amount (minor units) and currency columns.
    pub fn order_columns(mut self, amount: &str, currency: &str) -> Self {
        self.columns = (amount.into(), currency.into());
        self
    }

    /// Another body format (the result is still checked by [`Notification::check`]).
    pub fn parser(
        mut self,
        parse: impl Fn(&[u8]) -> Result<Notification, String> + Send + Sync + 'static,
    ) -> Self {
        self.settings.parse = Box::new(parse);
        self
    }

    /// What the provider expects as "received" (`200 success` by default).
    pub fn acknowledgement(mut self, status: StatusCode, body: impl Into<Bytes>) -> Self {
        self.settings.ack = Arc::new((status, body.into()));
        self
    }

    /// The handler, or why this configuration cannot work (an unknown state, a bad column).
    pub fn build(self) -> Result<Callbacks<DB>, Error> {
        let CallbacksBuilder { settings, columns } = self;
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= MAX_ID
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        if !name_ok(&settings.provider) || !name_ok(&settings.merchant) {
            return Err(Error::Config(format!(
                "provider {:?} and merchant {:?}: 1..={MAX_ID} of [A-Za-z0-9._-]",
                settings.provider, settings.merchant
            )));
        }
        if settings.effects.is_empty() {
            return Err(Error::Config("no event type is handled (`event`)".into()));
        }
        for effect in settings.effects.values() {
            if !settings.orders.machine().knows(&effect.state) {
                return Err(Error::Config(format!(
                    "{} has no state {}",
                    settings.orders.machine().name(),
                    effect.state
                )));
            }
            if effect.topic.is_empty() || !effect.topic.chars().all(|c| c.is_ascii_graphic()) {
                return Err(Error::Config(format!("topic {:?}", effect.topic)));
            }
        }
        let (amount, currency) = &columns;
        let (table, id) = settings.orders.table();
        for name in [amount, currency] {
            if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || name.is_empty() {
                return Err(Error::Config(format!("column {name:?}")));
            }
        }
        let expected = format!("SELECT {amount}, {currency} FROM {table} WHERE {id} = ?");
        Ok(Callbacks {
            inner: Arc::new(Inner {
                records: Idempotency::new(settings.pool.clone()),
                settings,
                expected,
            }),
        })
    }
}

/// A callback parked for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    /// The parked row (what [`resolve`] takes).
    pub id: i64,
    /// The payment provider.
    pub provider: String,
    /// The merchant account the callback was for.
    pub merchant: String,
    /// The provider's trade number.
    pub trade_no: String,
    /// Our order the callback named.
    pub order_no: String,
    /// Why it was parked (an amount or currency that differs, a state conflict, ...).
    pub reason: String,
    /// Times this same body arrived.
    pub repeats: i64,
    /// First arrival, Unix ms.
    pub first_at: i64,
    /// Latest arrival, Unix ms.
    pub last_at: i64,
}

/// The parked callbacks nobody resolved yet, oldest first.
pub async fn parked<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<Parked>, Error> {
    let mut conn = pool.acquire().await?;
    let rows = DB::pooled(&mut conn).fetch_all(sql::PARKED, &[]).await?;
    rows.iter()
        .map(|row| {
            Ok(Parked {
                id: row.i64(0)?,
                provider: row.text(1)?,
                merchant: row.text(2)?,
                trade_no: row.text(3)?,
                order_no: row.text(4)?,
                reason: row.text(5)?,
                repeats: row.i64(6)?,
                first_at: row.i64(7)?,
                last_at: row.i64(8)?,
            })
        })
        .collect()
}

/// A person dealt with parked callback `id` (refunded it, say); false if it was not open.
pub async fn resolve<DB: Backend>(pool: &Pool<DB>, id: i64) -> Result<bool, Error> {
    let mut conn = pool.acquire().await?;
    let conn = DB::pooled(&mut conn);
    Ok(conn
        .execute(sql::RESOLVE, args![dtx_sql::now_ms(), id])
        .await?
        == 1)
}
