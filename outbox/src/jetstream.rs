//! The NATS JetStream publisher: each event goes to its topic as the subject, with
//! `Nats-Msg-Id` set to its `event_id` - the stream drops a re-published row within its
//! duplicate window - and counts as published once the stream acknowledged it.

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use futures::future::BoxFuture;

use crate::{Event, Publisher};

/// Publishes to the JetStream stream that captures each event's topic.
pub struct JetStream {
    context: Context,
}

impl JetStream {
    /// Publishes through `context` (each event's subject is its topic).
    pub fn new(context: Context) -> Self {
        JetStream { context }
    }
}

impl Publisher for JetStream {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            for (name, value) in &event.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            headers.insert("Nats-Msg-Id", event.event_id.as_str());
            let ack = self
                .context
                .publish_with_headers(event.topic.clone(), headers, event.payload.clone().into())
                .await
                .map_err(|e| format!("publishing to {}: {e}", event.topic))?;
            ack.await
                .map(drop)
                .map_err(|e| format!("{} was not acknowledged: {e}", event.topic))
        })
    }
}
