-- Payment callbacks (dtx-payments).
-- dtx_payments: one row per payment a provider reported and the service applied, written in the
-- transaction that moved the order (unique per provider, merchant, trade number and event type).
--   amount in minor units (cents), currency ISO 4217; received_at Unix ms
-- dtx_payment_conflicts: callbacks that were verified but could not be applied - the same trade
-- number with another amount, an amount or currency that is not the order's, an order closed or
-- paid by another trade - parked for a person. One row per distinct body (body_hash), counting
-- repeats; resolved_at is set when a person dealt with it.
CREATE TABLE IF NOT EXISTS dtx_payments (
    provider    VARCHAR(64)  NOT NULL,
    merchant    VARCHAR(64)  NOT NULL,
    trade_no    VARCHAR(128) NOT NULL,
    order_no    VARCHAR(128) NOT NULL,
    amount      BIGINT       NOT NULL,
    currency    VARCHAR(8)   NOT NULL,
    event_type  VARCHAR(64)  NOT NULL,
    received_at BIGINT       NOT NULL,
    PRIMARY KEY (provider, merchant, trade_no, event_type)
);
CREATE INDEX IF NOT EXISTS dtx_payments_order ON dtx_payments (order_no);
CREATE TABLE IF NOT EXISTS dtx_payment_conflicts (
    id          BIGSERIAL PRIMARY KEY,
    provider    VARCHAR(64)  NOT NULL,
    merchant    VARCHAR(64)  NOT NULL,
    trade_no    VARCHAR(128) NOT NULL,
    order_no    VARCHAR(128) NOT NULL,
    body_hash   VARCHAR(64)  NOT NULL,
    reason      VARCHAR(512) NOT NULL,
    body        BYTEA        NOT NULL,
    repeats     BIGINT       NOT NULL,
    first_at    BIGINT       NOT NULL,
    last_at     BIGINT       NOT NULL,
    resolved_at BIGINT       NULL,
    UNIQUE (provider, merchant, trade_no, body_hash)
);
