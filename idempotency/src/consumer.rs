//! Message consumers: a redelivered message is acknowledged without a second effect.
//!
//! Brokers deliver at least once: an ack lost after the business committed, a consumer crash
//! before the offset commit, a rebalance, a manual replay - each delivers the same event again.
//! [`Consumer::handle`] records (consumer group + handler version, business event id) in
//! `dtx_idempotency` **in the same local transaction as the handler's writes**, so either both
//! commit or neither does:
//!
//! * recording "consumed" first and running the handler after would lose the event if the
//!   handler failed (the redelivery is skipped);
//! * committing the handler first and recording after would run it twice after a crash in
//!   between.
//!
//! Key on the *business* event id (the producer's order-created id), not the broker's message
//! id: a producer that retries its publish creates a new broker message for the same event.
//! Ack only after `handle` returned; an ack that gets lost is harmless now. Effects outside the
//! consumer's database (HTTP calls, e-mails) are not covered by this table: make them
//! idempotent downstream calls with their own key, or outbox events.

use dtx_sql::Backend;
use futures::future::BoxFuture;

use crate::{
    Answer, Completion, Error, HandlerError, Idempotency, Key, RequestHash, StoredResult,
    check_scope,
};

/// What to do with a delivery after [`Consumer::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// First delivery: the handler ran and its writes committed with the record. Ack.
    Processed,
    /// A redelivery (or a duplicate publish) of an event already processed. Ack.
    Duplicate,
    /// The same event id arrived with different content: a producer bug. Alert and dead-letter
    /// (ack) it; the first processing stands.
    Conflict,
    /// Another consumer holds the event right now, or it is parked for a person: don't ack, let
    /// the broker deliver it again later.
    Deferred,
}

impl Delivery {
    /// Processed and duplicate deliveries are done and can be acknowledged.
    pub fn should_ack(&self) -> bool {
        matches!(self, Delivery::Processed | Delivery::Duplicate)
    }
}

/// De-duplicates one consumer group's deliveries.
#[derive(Clone)]
pub struct Consumer<DB: Backend> {
    store: Idempotency<DB>,
    group: String,
    handler_version: u32,
}

impl<DB: Backend> Consumer<DB> {
    /// `group` is the records' scope; `handler_version` is part of every key, so a new handler
    /// version deliberately processes replayed events again.
    pub fn new(
        store: Idempotency<DB>,
        group: impl Into<String>,
        handler_version: u32,
    ) -> Result<Self, Error> {
        let group = group.into();
        check_scope(&group)?;
        Ok(Consumer {
            store,
            group,
            handler_version,
        })
    }

    /// Runs `handler` for business event `event_id` unless this group already processed it.
    /// `content` is the hash of the event's content (`RequestHash::of_json` of the payload,
    /// feature `json`).
    ///
    /// `handler` runs inside the transaction that records the event; an `Err` rolls both back
    /// and is returned (don't ack: the redelivery runs it again). It may run more than once
    /// only when the database reports a lock conflict, which also rolled it back.
    pub async fn handle<F>(
        &self,
        event_id: &str,
        content: &RequestHash,
        handler: F,
    ) -> Result<Delivery, Error>
    where
        F: for<'c> Fn(&'c mut DB::Conn) -> BoxFuture<'c, Result<(), HandlerError>> + Send + Sync,
    {
        let key = Key::builder(self.group.as_str())
            .business_id(event_id)
            .version(self.handler_version)
            .build()?;
        let answer = self
            .store
            .run_in_transaction(&key, content, |conn| {
                let handled = handler(conn);
                Box::pin(async move {
                    handled.await?;
                    Ok(Completion::Succeeded(StoredResult::new("PROCESSED")))
                })
            })
            .await?;
        Ok(match answer {
            Answer::Executed(_) => Delivery::Processed,
            Answer::Replayed { .. } => Delivery::Duplicate,
            Answer::Conflict => Delivery::Conflict,
            Answer::InProgress { .. } | Answer::NeedsAttention { .. } => Delivery::Deferred,
        })
    }
}
