-- The participant's branch barrier: one row per (xid, branch_id, action), written in the same
-- local transaction as the business change, so the unique key decides every race between
-- repeated, concurrent and out-of-order branch calls.
--   action      try | confirm | cancel | action | compensate
--   written_by  the action that inserted the row: the action itself, or (on a try/action row)
--               the cancel/compensate that claimed it first - an empty rollback that blocks the
--               late try/action
--   outcome     success | failure (try/action rows: the first outcome, replayed to repeats)
--               | none (rows claimed by a cancel/compensate)
--   result      the first result payload of a try/action, replayed to repeats
--   created_ms  Unix milliseconds; retention deletes by it

CREATE TABLE IF NOT EXISTS dtx_barrier (
    xid        VARCHAR(128) NOT NULL,
    branch_id  VARCHAR(64)  NOT NULL,
    action     VARCHAR(16)  NOT NULL,
    written_by VARCHAR(16)  NOT NULL,
    outcome    VARCHAR(16)  NOT NULL,
    result     BYTEA        NULL,
    created_ms BIGINT       NOT NULL,
    PRIMARY KEY (xid, branch_id, action)
);
CREATE INDEX IF NOT EXISTS dtx_barrier_created ON dtx_barrier (created_ms);
