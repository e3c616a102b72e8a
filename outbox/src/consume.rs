//! The consuming side: a delivered event is applied once through the idempotency records'
//! consumer support, keyed by the event's id (JetStream's `Nats-Msg-Id`, AMQP's `message_id`,
//! both set by the relay), and acknowledged only after that local transaction committed. A
//! consumer that dies between its commit and its ack gets the event again and answers it as a
//! duplicate without running the handler.
//!
//! | outcome | JetStream | RabbitMQ |
//! |---|---|---|
//! | processed, duplicate | ack | ack |
//! | the handler failed, or another consumer holds the event | nak, delivered again after [`RETRY_AFTER`] | nack after [`RETRY_AFTER`], requeued |
//! | same id, other content (a producer bug): logged and counted, the first processing stands | term | reject, not requeued (dead-letter exchange) |

use bytes::Bytes;
use dtx_idempotency::consumer::{Consumer, Delivery};
use dtx_idempotency::{HandlerError, RequestHash};
use dtx_sql::Backend;
use futures::future::BoxFuture;
use metrics::counter;

use crate::Error;

/// How long a delivery that could not be applied now waits before it comes again: without it
/// a failing handler, or an event another consumer is applying, would be redelivered at once,
/// over and over. (JetStream delays the redelivery; for RabbitMQ, which has no delayed requeue
/// without a dead-letter set-up, the helper waits before its nack.)
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// How the broker is to settle a delivery.
enum Settle {
    Ack,
    Retry,
    DeadLetter,
}

/// Runs `apply` for event `event_id` unless `consumer` processed it; how to settle it.
async fn decide<DB: Backend, F>(
    consumer: &Consumer<DB>,
    event_id: &str,
    payload: Bytes,
    apply: &F,
) -> (Settle, Result<Delivery, Error>)
where
    F: for<'c> Fn(&'c mut DB::Conn, Bytes) -> BoxFuture<'c, Result<(), HandlerError>> + Send + Sync,
{
    let content = RequestHash::of_bytes(&payload);
    let handled = consumer
        .handle(event_id, &content, |conn| apply(conn, payload.clone()))
        .await;
    match handled {
        Ok(Delivery::Conflict) => {
            counter!(crate::metrics::CONSUMER_CONFLICTS).increment(1);
            tracing::error!(
                event_id,
                "an event arrived again with other content: the first processing stands, \
                 this delivery goes to the dead letters"
            );
            (Settle::DeadLetter, Ok(Delivery::Conflict))
        }
        Ok(delivery) if delivery.should_ack() => (Settle::Ack, Ok(delivery)),
        Ok(delivery) => (Settle::Retry, Ok(delivery)),
        Err(e) => (Settle::Retry, Err(e.into())),
    }
}

/// Applies one JetStream delivery once and settles it (see the module's table): `apply` is
/// the business write of a first delivery, run with the payload in the transaction that
/// records the event. A message without `Nats-Msg-Id` cannot be de-duplicated: it is
/// terminated and reported as [`Error::Unidentified`].
#[cfg(feature = "nats")]
pub async fn jetstream<DB: Backend, F>(
    consumer: &Consumer<DB>,
    message: &async_nats::jetstream::Message,
    apply: F,
) -> Result<Delivery, Error>
where
    F: for<'c> Fn(&'c mut DB::Conn, Bytes) -> BoxFuture<'c, Result<(), HandlerError>> + Send + Sync,
{
    use async_nats::jetstream::AckKind;
    let id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
    let Some(event_id) = id.map(|v| v.to_string()) else {
        message.ack_with(AckKind::Term).await.map_err(Error::ack)?;
        return Err(Error::Unidentified(message.subject.to_string()));
    };
    let (settle, outcome) = decide(consumer, &event_id, message.payload.clone(), &apply).await;
    let kind = match settle {
        Settle::Ack => AckKind::Ack,
        Settle::Retry => AckKind::Nak(Some(RETRY_AFTER)),
        Settle::DeadLetter => AckKind::Term,
    };
    message.ack_with(kind).await.map_err(Error::ack)?;
    outcome
}

/// Applies one RabbitMQ delivery once and settles it, as [`jetstream`]. A message without
/// `message_id` cannot be de-duplicated: it is rejected without requeueing and reported as
/// [`Error::Unidentified`].
#[cfg(feature = "rabbitmq")]
pub async fn amqp<DB: Backend, F>(
    consumer: &Consumer<DB>,
    delivery: &lapin::message::Delivery,
    apply: F,
) -> Result<Delivery, Error>
where
    F: for<'c> Fn(&'c mut DB::Conn, Bytes) -> BoxFuture<'c, Result<(), HandlerError>> + Send + Sync,
{
    use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
    let Some(event_id) = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string())
    else {
        delivery
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await
            .map_err(Error::ack)?;
        return Err(Error::Unidentified(delivery.routing_key.to_string()));
    };
    let payload = Bytes::from(delivery.data.clone());
    let (settle, outcome) = decide(consumer, &event_id, payload, &apply).await;
    let acker = &delivery.acker;
    match settle {
        Settle::Ack => acker.ack(BasicAckOptions::default()).await,
        Settle::Retry => {
            tokio::time::sleep(RETRY_AFTER).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            acker.nack(requeue).await
        }
        Settle::DeadLetter => acker.reject(BasicRejectOptions { requeue: false }).await,
    }
    .map_err(Error::ack)?;
    outcome
}
