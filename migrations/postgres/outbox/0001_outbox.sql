-- The transactional outbox: one row per event, written in the business transaction that causes
-- it (dtx_outbox::enqueue); a relay publishes it to a broker and marks it sent. Several relays may
-- run at once: a row is claimed with a lease, and only the oldest unsent row of a key is ever
-- claimed, so events of one key are published in order.
--   event_id     the broker message id (NATS `Nats-Msg-Id`, AMQP `message_id`): brokers drop
--                duplicates of a re-published row by it, consumers key their idempotency record by it
--   topic        subject (NATS) or routing key (RabbitMQ)
--   msg_key      the ordering key: rows of one key are published one after another, in id order
--   headers      JSON object of string headers
--   status       PENDING | SENT | PARKED (gave up after the attempt limit: an operator republishes it)
--   attempts     failed publishes so far; next_at is when the next may run (Unix ms)
--   lease_owner / lease_until   the relay publishing it now and until when its claim holds
--   last_error   why the last publish failed
--   created_at / sent_at        Unix ms; retention deletes sent rows by sent_at
CREATE TABLE IF NOT EXISTS dtx_outbox (
    id          BIGSERIAL    PRIMARY KEY,
    event_id    VARCHAR(64)  NOT NULL UNIQUE,
    topic       VARCHAR(255) NOT NULL,
    msg_key     VARCHAR(255) NOT NULL,
    headers     BYTEA        NOT NULL,
    payload     BYTEA        NOT NULL,
    status      VARCHAR(8)   NOT NULL CHECK (status IN ('PENDING', 'SENT', 'PARKED')),
    attempts    BIGINT       NOT NULL DEFAULT 0,
    next_at     BIGINT       NOT NULL,
    lease_owner VARCHAR(64)  NULL,
    lease_until BIGINT       NULL,
    last_error  VARCHAR(512) NULL,
    created_at  BIGINT       NOT NULL,
    sent_at     BIGINT       NULL
);
CREATE INDEX IF NOT EXISTS dtx_outbox_pending ON dtx_outbox (status, id);
CREATE INDEX IF NOT EXISTS dtx_outbox_key ON dtx_outbox (msg_key, status, id);
CREATE INDEX IF NOT EXISTS dtx_outbox_sent ON dtx_outbox (sent_at);
