-- The coordinator's state. Every change is a conditional update (expected status and/or the
-- fencing epoch), so a stale worker can never move a transaction backwards.
--
-- dtx_global: one row per global transaction (TCC or saga).
--   status       TRYING, COMMITTING, COMMITTED, ROLLING_BACK, ROLLED_BACK (TCC);
--                RUNNING, SUCCEEDED, COMPENSATING, COMPENSATED (saga); NEEDS_ATTENTION
--   decision     commit | rollback | compensate, once decided
--   spec         saga: the canonical encoding of the submitted definition (dtx.v1.SubmitSagaRequest)
--   branch_count TCC: registered branches (bounded by the branch limit under the row lock)
--   owner/fence  the coordinator instance driving it, and its fencing token: a fresh random value
--                on every claim; a driver's writes require the token it claimed with
--   due_ms       when recovery must look at it (deadline of an undecided TCC, lease expiry or
--                next retry of one being driven); NULL once settled
--
-- dtx_branch: TCC branches (inserted by RegisterBranch) and the recorded progress of saga steps
-- (written when a saga turns to compensation, retries slowly, or finishes).

CREATE TABLE IF NOT EXISTS dtx_global (
    xid             TEXT    NOT NULL PRIMARY KEY,
    kind            TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    decision        TEXT    NULL,
    timeout_ms      INTEGER NOT NULL,
    deadline_ms     INTEGER NOT NULL,
    spec            BLOB    NULL,
    branch_count    INTEGER NOT NULL DEFAULT 0,
    owner           TEXT    NULL,
    fence           INTEGER NOT NULL DEFAULT 0,
    due_ms          INTEGER NULL,
    last_error      TEXT    NULL,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS dtx_global_due ON dtx_global (due_ms);
CREATE INDEX IF NOT EXISTS dtx_global_status_updated ON dtx_global (status, updated_ms);

CREATE TABLE IF NOT EXISTS dtx_branch (
    xid             TEXT    NOT NULL,
    branch_id       TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    target          TEXT    NOT NULL,
    handler         TEXT    NOT NULL,
    payload         BLOB    NULL,
    headers         BLOB    NULL,
    call_timeout_ms INTEGER NOT NULL DEFAULT 0,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NULL,
    result          BLOB    NULL,
    updated_ms      INTEGER NOT NULL,
    PRIMARY KEY (xid, branch_id)
);
