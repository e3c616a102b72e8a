//! The RabbitMQ publisher: each event goes to the exchange with its topic as the routing key,
//! persistent, with AMQP `message_id` = its `event_id` (RabbitMQ keeps no de-duplication
//! window: consumers drop a re-published row by that id), `mandatory` so that an event no queue
//! takes comes back as a failure instead of vanishing; it counts as published once the broker
//! confirmed it (publisher confirms).

use futures::future::BoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};

use crate::{Event, Publisher};

/// AMQP delivery mode "persistent".
const PERSISTENT: u8 = 2;

/// Publishes through one channel in confirm mode.
pub struct RabbitMq {
    channel: Channel,
    exchange: String,
}

impl RabbitMq {
    /// A publisher on `channel` (switched to confirm mode here) to `exchange` (`""`: the
    /// default exchange, where a topic names a queue).
    pub async fn new(channel: Channel, exchange: impl Into<String>) -> Result<Self, lapin::Error> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(RabbitMq {
            channel,
            exchange: exchange.into(),
        })
    }
}

impl Publisher for RabbitMq {
    fn publish<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut headers = FieldTable::default();
            for (name, value) in &event.headers {
                let value = AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()));
                headers.insert(ShortString::from(name.as_str()), value);
            }
            let properties = BasicProperties::default()
                .with_message_id(ShortString::from(event.event_id.as_str()))
                .with_delivery_mode(PERSISTENT)
                .with_headers(headers);
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let confirm = self
                .channel
                .basic_publish(
                    &self.exchange,
                    &event.topic,
                    options,
                    &event.payload,
                    properties,
                )
                .await
                .map_err(|e| format!("publishing to {}: {e}", event.topic))?;
            match confirm.await.map_err(|e| format!("{}: {e}", event.topic))? {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                    Err(format!(
                        "{} was returned unroutable: {}",
                        event.topic, returned.reply_text
                    ))
                }
                Confirmation::Nack(None) => {
                    Err(format!("{} was not confirmed (nack)", event.topic))
                }
                Confirmation::NotRequested => Err("the channel is not in confirm mode".to_string()),
            }
        })
    }
}
