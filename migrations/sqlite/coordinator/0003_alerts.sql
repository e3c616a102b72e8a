-- (Column meanings: see the PostgreSQL migration of the same number.)

CREATE TABLE IF NOT EXISTS dtx_alert (
    id         TEXT    NOT NULL PRIMARY KEY,
    xid        TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    body       TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    due_ms     INTEGER NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    delivered  TEXT    NULL,
    last_error TEXT    NULL,
    sent_ms    INTEGER NULL
);
CREATE INDEX IF NOT EXISTS dtx_alert_due ON dtx_alert (due_ms);
CREATE INDEX IF NOT EXISTS dtx_alert_xid ON dtx_alert (xid, kind);
