-- General idempotency records (HTTP create endpoints, payment callbacks, message consumers, jobs):
-- one row per (scope, idem_key). The primary key is the unique constraint that decides which of
-- several concurrent requests runs the business; nobody checks before inserting.
--   scope        the operation (or consumer group): retention windows and statistics are per scope
--   idem_key     "<tenant>:<business id>:v<version>" (see dtx_sdk::idempotency::Key)
--   request_hash SHA-256 (hex) of the canonical request: same key + different hash = conflict
--   status       PROCESSING | SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL
--   owner_token  random token of the current processor; completions are fenced on it
--   lease_until  Unix ms until which a PROCESSING owner is presumed alive; NULL when finished or
--                parked for a person
--   result_code / result_body / resource_id   the first result, replayed to repeats (body bounded
--                by the SDK, 64 KiB by default)
--   retry_count  how often the key was re-claimed (retryable failure or expired lease)
--   version      bumped by every transition; re-claims compare it (optimistic concurrency)
--   attention    why a PROCESSING record is parked for a person (fact check could not tell)
--   created_at / updated_at   Unix ms; retention deletes by them
CREATE TABLE IF NOT EXISTS dtx_idempotency (
    scope        VARCHAR(64)  NOT NULL,
    idem_key     VARCHAR(128) NOT NULL,
    request_hash CHAR(64)     NOT NULL,
    status       VARCHAR(16)  NOT NULL
        CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
    owner_token  VARCHAR(64)  NOT NULL,
    lease_until  BIGINT       NULL,
    result_code  VARCHAR(64)  NULL,
    result_body  BYTEA        NULL,
    resource_id  VARCHAR(128) NULL,
    retry_count  BIGINT       NOT NULL DEFAULT 0,
    version      BIGINT       NOT NULL DEFAULT 0,
    attention    VARCHAR(512) NULL,
    created_at   BIGINT       NOT NULL,
    updated_at   BIGINT       NOT NULL,
    PRIMARY KEY (scope, idem_key)
);
-- Finds expired leases for recovery sweeps.
CREATE INDEX IF NOT EXISTS dtx_idempotency_status_lease ON dtx_idempotency (status, lease_until);
-- Retention deletes per scope by age.
CREATE INDEX IF NOT EXISTS dtx_idempotency_created ON dtx_idempotency (scope, created_at);
