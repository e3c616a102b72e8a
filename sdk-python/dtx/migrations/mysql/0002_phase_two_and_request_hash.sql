-- Phase two is one-way, and a repeated try/action must carry the same request.
--   request_hash  SHA-256 (hex) of the try/action request that wrote the row; a repeat with
--                 another hash is a conflict. NULL: written before this migration, or by a
--                 caller that gave no request - accepted without a check.
--   action 'phase2' (new kind of row): the branch's one phase-two slot. Confirm and Cancel both
--                 insert it, written_by = the op that won; the unique key decides their race
--                 and the loser answers a conflict.
-- Existing confirm/cancel rows get their slot here, so a branch confirmed before the upgrade
-- still refuses a later Cancel (and the reverse). Should a branch have both (run by the old
-- barrier), the earlier one takes the slot. Both statements can be run again (MySQL DDL does
-- not roll back if the second one fails).
ALTER TABLE dtx_barrier
    ADD COLUMN IF NOT EXISTS request_hash CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL;

INSERT IGNORE INTO dtx_barrier (xid, branch_id, action, written_by, outcome, result, created_ms)
SELECT xid, branch_id, 'phase2', action, 'success', NULL, created_ms
FROM dtx_barrier
WHERE action IN ('confirm', 'cancel')
ORDER BY created_ms;
