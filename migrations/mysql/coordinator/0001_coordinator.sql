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
    xid          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    kind         VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status       VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    decision     VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    timeout_ms   BIGINT       NOT NULL,
    deadline_ms  BIGINT       NOT NULL,
    spec         LONGBLOB     NULL,
    branch_count BIGINT       NOT NULL DEFAULT 0,
    owner        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    fence        BIGINT       NOT NULL DEFAULT 0,
    due_ms       BIGINT       NULL,
    last_error   TEXT         NULL,
    created_ms   BIGINT       NOT NULL,
    updated_ms   BIGINT       NOT NULL,
    KEY dtx_global_due (due_ms),
    KEY dtx_global_status_updated (status, updated_ms)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS dtx_branch (
    xid             VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    branch_id       VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq             BIGINT       NOT NULL,
    target          VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    handler         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    payload         MEDIUMBLOB   NULL,
    headers         BLOB         NULL,
    call_timeout_ms BIGINT       NOT NULL DEFAULT 0,
    status          VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts        BIGINT       NOT NULL DEFAULT 0,
    last_error      TEXT         NULL,
    result          MEDIUMBLOB   NULL,
    updated_ms      BIGINT       NOT NULL,
    PRIMARY KEY (xid, branch_id)
) ENGINE = InnoDB;
