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
-- Ids are ASCII with a binary collation: case-sensitive like the other dialects, and a compact key.
CREATE TABLE IF NOT EXISTS dtx_barrier (
    xid        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    branch_id  VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action     VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    written_by VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome    VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    result     MEDIUMBLOB   NULL,
    created_ms BIGINT       NOT NULL,
    PRIMARY KEY (xid, branch_id, action),
    KEY dtx_barrier_created (created_ms)
) ENGINE = InnoDB;
