-- What operators read: a transaction's history.
--
-- dtx_history: one row per event (created, registered, decided, status change, branch change,
-- failed or unknown attempt, takeover, operator action), written in the commit of the change it
-- describes; deleted with its transaction by retention.
--   event   CREATED | REGISTERED | DECIDED | STATUS | BRANCH | ATTEMPT_FAILED |
--           ATTEMPT_UNKNOWN | TAKEOVER | OPERATOR
--   status  the transaction's status (branch_id NULL) or the branch's state after the event
--   actor   the coordinator instance or the operator; NULL for the initiator

CREATE TABLE IF NOT EXISTS dtx_history (
    seq       INTEGER      NOT NULL,
    xid       TEXT         NOT NULL,
    at_ms     INTEGER      NOT NULL,
    event     TEXT         NOT NULL,
    branch_id TEXT         NULL,
    status    TEXT         NULL,
    attempt   INTEGER      NOT NULL DEFAULT 0,
    detail    TEXT         NULL,
    actor     TEXT         NULL
);
CREATE INDEX IF NOT EXISTS dtx_history_xid ON dtx_history (xid, seq);

