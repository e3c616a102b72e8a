-- What operators read: a transaction's history.
--
-- dtx_history: one row per event (created, registered, decided, status change, branch change,
-- failed or unknown attempt, takeover, operator action), written in the commit of the change it
-- describes; deleted with its transaction by retention.
--   event   CREATED | REGISTERED | DECIDED | STATUS | BRANCH | ATTEMPT_FAILED |
--           ATTEMPT_UNKNOWN | TAKEOVER | OPERATOR
--   status  the transaction's status (branch_id NULL) or the branch's state after the event
--   actor   the coordinator instance or the operator; NULL for the initiator
--   seq     orders a transaction's entries: the database time of the commit x 1000, strictly
--           increasing per coordinator process (no sequence or unique key: nothing to contend on)
--
-- Listings walk the existing dtx_global_status_updated index (one walk per status, merged):
-- an index for listing by creation time cost the saga benchmark about a third of its rate.

CREATE TABLE IF NOT EXISTS dtx_history (
    seq       BIGINT       NOT NULL,
    xid       VARCHAR(128) NOT NULL,
    at_ms     BIGINT       NOT NULL,
    event     VARCHAR(16)  NOT NULL,
    branch_id VARCHAR(64)  NULL,
    status    VARCHAR(16)  NULL,
    attempt   BIGINT       NOT NULL DEFAULT 0,
    detail    TEXT         NULL,
    actor     VARCHAR(128) NULL
);
CREATE INDEX IF NOT EXISTS dtx_history_xid ON dtx_history (xid, seq);

