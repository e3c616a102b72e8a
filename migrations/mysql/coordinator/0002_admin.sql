-- What operators read: a transaction's history, and indexes for listing newest first.
-- (Column meanings: see the PostgreSQL migration of the same number.)

CREATE TABLE IF NOT EXISTS dtx_history (
    id        BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    xid       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at_ms     BIGINT       NOT NULL,
    event     VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    branch_id VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    status    VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    attempt   BIGINT       NOT NULL DEFAULT 0,
    detail    TEXT         NULL,
    actor     VARCHAR(128) NULL,
    KEY dtx_history_xid (xid, id)
) ENGINE = InnoDB;

CREATE INDEX IF NOT EXISTS dtx_global_created ON dtx_global (created_ms, xid);
CREATE INDEX IF NOT EXISTS dtx_global_status_created ON dtx_global (status, created_ms, xid);
