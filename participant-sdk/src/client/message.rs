//! Two-phase messages at the initiator: "commit my local transaction and have these calls
//! delivered" - both or neither.
//!
//! ```no_run
//! # async fn run(pool: dtx_sdk::sql::sqlx::Pool<dtx_sdk::sql::sqlx::Postgres>) -> Result<(), dtx_sdk::Error> {
//! use dtx_sdk::client::{Coordinator, MessageBranch};
//! use dtx_sdk::sql::sqlx;
//! let coordinator = Coordinator::connect("http://127.0.0.1:50070").await?;
//! coordinator
//!     .message("http://orders:50051", "orders.check_back")
//!     .xid("order-42")
//!     .branch(MessageBranch::new("reserve", "http://inventory:50051", "reserve").payload(b"sku-1:2".to_vec()))
//!     .branch(MessageBranch::new("notify", "http://notifications:50051", "order_placed").payload(b"42".to_vec()))
//!     .do_and_submit(&pool, |conn| Box::pin(async move {
//!         sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *conn).await?;
//!         Ok::<_, dtx_sdk::Error>(())
//!     }))
//!     .await?;
//! # Ok(()) }
//! ```
//! The order service serves the check-back with
//! [`ParticipantServer::message_check_back`](crate::server::ParticipantServer::message_check_back)
//! on the same database: if the process dies between its commit and the submit, the
//! coordinator asks, finds the committed barrier row and delivers; if it dies before the
//! commit, the check-back finds none, makes sure none can commit later, and drops the message.

use std::time::Duration;

use dtx_proto::trace::{TRACEPARENT, TraceParent};
use dtx_proto::v1::{self as wire, TxStatus};
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;
use futures::future::BoxFuture;

use super::{Coordinator, RetryPolicy, idempotent};
use crate::Error;
use crate::barrier::{self, Prepared};

/// One delivery of a message: a participant's handler, called with `BRANCH_ACTION_ACTION`
/// until it answers SUCCESS.
#[derive(Debug, Clone)]
pub struct MessageBranch(pub(super) wire::MessageBranch);

impl MessageBranch {
    /// A branch named `name` (unique in the message; also its barrier branch id) calling
    /// `handler` on the participant at `target`.
    pub fn new(
        name: impl Into<String>,
        target: impl Into<String>,
        handler: impl Into<String>,
    ) -> Self {
        MessageBranch(wire::MessageBranch {
            name: name.into(),
            target: target.into(),
            handler: handler.into(),
            ..Default::default()
        })
    }

    /// The body the branch is delivered with.
    pub fn payload(mut self, payload: Vec<u8>) -> Self {
        self.0.payload = payload;
        self
    }
}

/// Builds a message; [`MessageBuilder::do_and_submit`] runs it with a local transaction.
pub struct MessageBuilder {
    coordinator: Coordinator,
    request: wire::PrepareMessageRequest,
}

/// How [`MessageBuilder::do_and_submit`]'s local transaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed<T> {
    /// The closure ran and its transaction committed; this is what it returned.
    Now(T),
    /// An earlier run of this message (same xid) committed already: the closure did not run
    /// again, and the message was submitted.
    Earlier,
}

impl Coordinator {
    /// Starts defining a two-phase message whose check-backs go to `handler` (served by
    /// [`ParticipantServer::message_check_back`](crate::server::ParticipantServer::message_check_back))
    /// of this service's participant server at `target`.
    pub fn message(&self, target: impl Into<String>, handler: impl Into<String>) -> MessageBuilder {
        MessageBuilder {
            coordinator: self.clone(),
            request: wire::PrepareMessageRequest {
                check_back: Some(wire::CheckBack {
                    target: target.into(),
                    handler: handler.into(),
                }),
                ..Default::default()
            },
        }
    }
}

impl MessageBuilder {
    /// The message's id (generated if not set): preparing the same definition again under it
    /// is harmless, a different one is rejected.
    pub fn xid(mut self, xid: impl Into<String>) -> Self {
        self.request.xid = xid.into();
        self
    }

    /// Adds a branch the message delivers once submitted.
    pub fn branch(mut self, branch: MessageBranch) -> Self {
        self.request.branches.push(branch.0);
        self
    }

    /// How long the coordinator waits for the submit before it checks back (default: the
    /// coordinator's `--check-back-after`).
    pub fn check_back_after(mut self, after: Duration) -> Self {
        self.request.check_back_after_ms = after.as_millis().max(1) as u64;
        self
    }

    /// The policy of every branch without its own, and of the check-backs.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.request.retry = Some(policy.into());
        self
    }

    /// Sent with every delivery and check-back.
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.headers.insert(key.into(), value.into());
        self
    }

    /// The W3C `traceparent` of the work this message is part of; not set or invalid: the
    /// message starts a trace of its own.
    pub fn traceparent(self, traceparent: &str) -> Self {
        match TraceParent::parse(traceparent) {
            Some(trace) => self.header(TRACEPARENT, trace.to_string()),
            None => self,
        }
    }

    /// The definition as it goes on the wire.
    pub fn definition(&self) -> &wire::PrepareMessageRequest {
        &self.request
    }

    /// Records the message durably in PREPARED. Nothing is delivered until it is submitted
    /// (or its check-back finds the local commit).
    pub async fn prepare(mut self) -> Result<PreparedMessage, Error> {
        if self.request.xid.is_empty() {
            self.request.xid = uuid::Uuid::new_v4().to_string();
        }
        let trace = match TraceParent::of_headers(&self.request.headers) {
            Some(trace) => trace,
            None => {
                let root = TraceParent::new_root();
                let headers = &mut self.request.headers;
                headers.insert(TRACEPARENT.to_string(), root.to_string());
                root
            }
        };
        let request = self.request;
        let prepared = rpc!(self.coordinator, prepare_message, request, Some(trace)).await?;
        Ok(PreparedMessage {
            xid: prepared.xid,
            branch_xid: prepared.branch_xid,
            trace,
            coordinator: self.coordinator,
        })
    }

    /// Prepares the message, runs `body` in a local transaction on `pool` that also writes
    /// the message's barrier row, commits, and submits. `body` returning `Err` rolls the local
    /// transaction back and aborts the message (nothing is delivered).
    ///
    /// Only a commit that is known to have failed is followed by no delivery; when the
    /// commit's outcome is unknown (the connection broke), this returns the error and leaves
    /// the message prepared: its check-back finds out and delivers or drops it. A submit that
    /// fails after the commit is not an error either: the check-back delivers (after
    /// [`MessageBuilder::check_back_after`]).
    pub async fn do_and_submit<DB, T, E, F>(
        self,
        pool: &Pool<DB>,
        body: F,
    ) -> Result<Committed<T>, E>
    where
        DB: Backend,
        E: From<Error>,
        F: for<'c> FnOnce(&'c mut DB::Conn) -> BoxFuture<'c, Result<T, E>>,
    {
        let message = self.prepare().await?;
        let mut tx = DB::begin(pool).await.map_err(Error::from)?;
        let ran = match barrier::prepare_message(DB::conn(&mut tx), &message.branch_xid).await {
            Ok(Prepared::Fresh) => match body(DB::conn(&mut tx)).await {
                Ok(value) => Committed::Now(value),
                Err(e) => {
                    drop(tx); // rolls back
                    message.abort_quietly().await;
                    return Err(e);
                }
            },
            Ok(Prepared::AlreadyCommitted) => {
                drop(tx);
                message.submit_quietly().await;
                return Ok(Committed::Earlier);
            }
            Err(e) => {
                drop(tx);
                if !matches!(e, Error::MessageDropped { .. }) {
                    message.abort_quietly().await;
                }
                return Err(e.into());
            }
        };
        tx.commit().await.map_err(Error::from)?;
        message.submit_quietly().await;
        Ok(ran)
    }
}

/// A message in PREPARED: submit it after the local commit, abort it after a rollback.
pub struct PreparedMessage {
    xid: String,
    branch_xid: String,
    trace: TraceParent,
    coordinator: Coordinator,
}

impl PreparedMessage {
    /// The message's xid, as the caller named it.
    pub fn xid(&self) -> &str {
        &self.xid
    }

    /// The xid the message's barrier row is keyed by (the xid with its tenant's scope): pass
    /// it to [`barrier::prepare_message`] in the local transaction.
    pub fn branch_xid(&self) -> &str {
        &self.branch_xid
    }

    /// The local transaction committed: deliver. ABORTED (as [`Error::Rpc`]) if the
    /// message was dropped meanwhile.
    pub async fn submit(&self) -> Result<TxStatus, Error> {
        self.decide(true).await
    }

    /// The local transaction rolled back: drop the message. Never after a commit, nor when
    /// the commit's outcome is unknown (leave that to the check-back).
    pub async fn abort(&self) -> Result<TxStatus, Error> {
        self.decide(false).await
    }

    async fn decide(&self, submit: bool) -> Result<TxStatus, Error> {
        let request = wire::DecideRequest {
            xid: self.xid.clone(),
            ..Default::default()
        };
        let trace = Some(self.trace);
        let response = if submit {
            rpc!(self.coordinator, submit_message, request, trace).await?
        } else {
            rpc!(self.coordinator, abort_message, request, trace).await?
        };
        Ok(response.status())
    }

    /// Submits; a failure is logged, not returned: the check-back delivers anyway.
    async fn submit_quietly(&self) {
        if let Err(e) = self.submit().await {
            tracing::warn!(xid = %self.xid, error = %e, "submitting a committed message failed; its check-back will deliver it");
        }
    }

    /// Aborts; a failure is logged, not returned: the check-back drops it anyway.
    async fn abort_quietly(&self) {
        if let Err(e) = self.abort().await {
            tracing::warn!(xid = %self.xid, error = %e, "aborting a message failed; its check-back will drop it");
        }
    }
}
