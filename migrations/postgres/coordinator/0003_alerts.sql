-- Alerts on their way to the configured webhooks.
--
-- dtx_alert: one row per alert, inserted in the commit of the change that raised it (or by the
-- stuck-transaction scan), so a crash between the change and the delivery loses nothing.
--   id         what it is about (kind:xid[:key]); the event id receivers deduplicate on
--   kind       PARKED | STUCK | ATTEMPTS
--   body       the JSON event, fixed at creation: every resend carries the same bytes
--   due_ms     when a coordinator should (re)try delivering it; NULL once delivered to every
--              webhook. A sender claims a row by moving due_ms past its delivery timeout.
--   delivered  fingerprints of the webhooks that acknowledged it, one per line
--   attempts   delivery rounds so far; last_error the last round's failure
-- Deleted with its transaction by retention.

CREATE TABLE IF NOT EXISTS dtx_alert (
    id         VARCHAR(256) NOT NULL PRIMARY KEY,
    xid        VARCHAR(128) NOT NULL,
    kind       VARCHAR(16)  NOT NULL,
    body       TEXT         NOT NULL,
    created_ms BIGINT       NOT NULL,
    due_ms     BIGINT       NULL,
    attempts   BIGINT       NOT NULL DEFAULT 0,
    delivered  TEXT         NULL,
    last_error TEXT         NULL,
    sent_ms    BIGINT       NULL
);
CREATE INDEX IF NOT EXISTS dtx_alert_due ON dtx_alert (due_ms);
CREATE INDEX IF NOT EXISTS dtx_alert_xid ON dtx_alert (xid, kind);
