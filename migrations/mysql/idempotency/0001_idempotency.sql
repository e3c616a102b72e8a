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
-- Keys, hashes, statuses and tokens are ASCII with a binary collation (case-sensitive like the
-- other dialects, compact in the index); resource ids and parking reasons may be any text.
CREATE TABLE IF NOT EXISTS dtx_idempotency (
    scope        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idem_key     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_hash CHAR(64)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status       VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL
        CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL')),
    owner_token  VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    lease_until  BIGINT       NULL,
    result_code  VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    result_body  MEDIUMBLOB   NULL,
    resource_id  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    retry_count  BIGINT       NOT NULL DEFAULT 0,
    version      BIGINT       NOT NULL DEFAULT 0,
    attention    VARCHAR(512) CHARACTER SET utf8mb4 NULL,
    created_at   BIGINT       NOT NULL,
    updated_at   BIGINT       NOT NULL,
    PRIMARY KEY (scope, idem_key),
    -- Finds expired leases for recovery sweeps.
    KEY dtx_idempotency_status_lease (status, lease_until),
    -- Retention deletes per scope by age.
    KEY dtx_idempotency_created (scope, created_at)
) ENGINE = InnoDB;
