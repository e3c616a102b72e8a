-- (Column meanings: see the PostgreSQL migration of the same number.)

CREATE TABLE IF NOT EXISTS dtx_alert (
    id         VARCHAR(256) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    xid        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind       VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    body       TEXT         NOT NULL,
    created_ms BIGINT       NOT NULL,
    due_ms     BIGINT       NULL,
    attempts   BIGINT       NOT NULL DEFAULT 0,
    delivered  TEXT         NULL,
    last_error TEXT         NULL,
    sent_ms    BIGINT       NULL,
    KEY dtx_alert_due (due_ms),
    KEY dtx_alert_xid (xid, kind)
) ENGINE = InnoDB;
