-- Forward-only state transitions (dtx-state): one row per state an entity entered, written in the
-- transaction of the conditional update that moved it there. A machine is forward-only (no cycles),
-- so an entity enters each state at most once: (entity, entity_id, state) is unique.
--   entity      the machine's name (e.g. "order"); entity_id the row's id as text
--   state       the state entered, from_state the one it left, version the row's version after
--   fact        what moved it there (e.g. the payment's trade number): a repeat with the same fact
--               is an idempotent success, one with another fact a conflict
--   at          Unix ms
CREATE TABLE IF NOT EXISTS dtx_transitions (
    entity      VARCHAR(64)  NOT NULL,
    entity_id   VARCHAR(128) NOT NULL,
    state       VARCHAR(64)  NOT NULL,
    from_state  VARCHAR(64)  NOT NULL,
    version     BIGINT       NOT NULL,
    fact        VARCHAR(255) NULL,
    at          BIGINT       NOT NULL,
    PRIMARY KEY (entity, entity_id, state)
);
