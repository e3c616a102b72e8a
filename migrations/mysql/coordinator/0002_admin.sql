-- What operators read: a transaction's history.
-- (Column meanings: see the PostgreSQL migration of the same number.)

CREATE TABLE IF NOT EXISTS dtx_history (
    seq       BIGINT       NOT NULL,
    xid       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at_ms     BIGINT       NOT NULL,
    event     VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    branch_id VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    status    VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    attempt   BIGINT       NOT NULL DEFAULT 0,
    detail    TEXT         NULL,
    actor     VARCHAR(128) NULL,
    KEY dtx_history_xid (xid, seq)
) ENGINE = InnoDB;

