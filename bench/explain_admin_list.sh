#!/usr/bin/env bash
# Query plans of Admin.ListTransactions and Stats on 1,000,000 transactions (PostgreSQL 15):
# makes a scratch database explain1m, loads it, prints EXPLAIN ANALYZE of each listing shape.
set -e
cd "$(dirname "$0")/.."
P="psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1"
$P -d test -c "DROP DATABASE IF EXISTS explain1m" -c "CREATE DATABASE explain1m"
$P -d explain1m -f migrations/postgres/coordinator/0001_coordinator.sql -f migrations/postgres/coordinator/0002_admin.sql >/dev/null
$P -d explain1m -c "
INSERT INTO dtx_global (xid, kind, status, decision, timeout_ms, deadline_ms, branch_count, fence, due_ms, created_ms, updated_ms)
SELECT 'order-' || g, CASE WHEN g % 3 = 0 THEN 'saga' ELSE 'tcc' END,
  CASE WHEN g % 1000 = 0 THEN 'NEEDS_ATTENTION' WHEN g % 997 = 0 THEN 'COMMITTING' WHEN g % 3 = 0 THEN 'SUCCEEDED' ELSE 'COMMITTED' END,
  'commit', 60000, 1790000000000 + g * 10, 2, 0, NULL, 1790000000000 + g * 10, 1790000000000 + g * 10 + 5
FROM generate_series(1, 1000000) g" -c "ANALYZE dtx_global"
q() { echo "### $1"; $P -d explain1m -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $2"; }
SEL="SELECT xid, kind, status, decision, timeout_ms, deadline_ms, NULL, branch_count, owner, fence, due_ms, last_error, created_ms, updated_ms FROM dtx_global"
# An unfiltered page is one such walk per status (10), merged in the coordinator.
q "first page, one status's walk of an unfiltered listing" "$SEL WHERE status = 'COMMITTED' ORDER BY updated_ms DESC, xid COLLATE \"C\" DESC LIMIT 51"
q "needs attention (one status walk)" "$SEL WHERE status = 'NEEDS_ATTENTION' ORDER BY updated_ms DESC, xid COLLATE \"C\" DESC LIMIT 51"
q "next page of COMMITTED, keyset" "$SEL WHERE status = 'COMMITTED' AND updated_ms <= 1790005000005 AND (updated_ms < 1790005000005 OR xid COLLATE \"C\" < 'order-500000') ORDER BY updated_ms DESC, xid COLLATE \"C\" DESC LIMIT 51"
q "older than (unchanged since) + status" "$SEL WHERE status = 'COMMITTING' AND updated_ms <= 1790009000005 ORDER BY updated_ms DESC, xid COLLATE \"C\" DESC LIMIT 51"
q "stats: count by kind, status" "SELECT kind, status, COUNT(*) FROM dtx_global GROUP BY kind, status"
q "stats: oldest open of one status" "SELECT MIN(created_ms) FROM dtx_global WHERE status = 'COMMITTING'"
q "retention: finished rows to purge (uses the status prefix)" "SELECT xid FROM dtx_global WHERE status IN ('COMMITTED', 'ROLLED_BACK', 'SUCCEEDED', 'COMPENSATED') AND updated_ms < 1790001000000 LIMIT 500"
q "parked count" "SELECT COUNT(*) FROM dtx_global WHERE status = 'NEEDS_ATTENTION'"
q "history of one transaction" "SELECT at_ms, event, branch_id, status, attempt, detail, actor FROM dtx_history WHERE xid = 'order-42' ORDER BY seq"
$P -d test -c "DROP DATABASE explain1m" >/dev/null
