//! The idempotency records' SQL: the only place that knows the `dtx_idempotency` table.
//!
//! Every transition is one conditional statement: the insert is decided by the primary key,
//! completions are fenced on the owner token, re-claims compare the version. Nothing reads a
//! row to decide whether to insert it, and nothing locks a missing row (no gap locks on
//! MySQL/MariaDB).

use dtx_sql::{Arg, Conn, Sql, SqlRow, args, insert_ignore};

use crate::key::Key;
use crate::{Error, Record, Stats, Status, StoredResult};

const CLAIM: Sql = insert_ignore!(
    "dtx_idempotency (scope, idem_key, request_hash, status, owner_token, lease_until, \
     retry_count, version, created_at, updated_at) \
     VALUES (?, ?, ?, 'PROCESSING', ?, ?, 0, 0, ?, ?)"
);

const READ: &str = "SELECT request_hash, status, owner_token, lease_until, result_code, \
                    result_body, resource_id, retry_count, version, attention, created_at, \
                    updated_at FROM dtx_idempotency WHERE scope = ? AND idem_key = ?";

/// The fenced completion: only the current owner of a PROCESSING record may finish it.
const COMPLETE: &str = "UPDATE dtx_idempotency SET status = ?, result_code = ?, result_body = ?, \
                        resource_id = ?, lease_until = NULL, attention = NULL, \
                        version = version + 1, updated_at = ? \
                        WHERE scope = ? AND idem_key = ? AND owner_token = ? \
                        AND status = 'PROCESSING'";

/// Extends the owner's lease (long work heartbeats with it).
const RENEW: &str = "UPDATE dtx_idempotency SET lease_until = ?, updated_at = ? \
                     WHERE scope = ? AND idem_key = ? AND owner_token = ? \
                     AND status = 'PROCESSING' AND lease_until IS NOT NULL";

/// Confirms ownership without finishing (an outcome the caller could not classify).
const TOUCH: &str = "UPDATE dtx_idempotency SET updated_at = ? \
                     WHERE scope = ? AND idem_key = ? AND owner_token = ? \
                     AND status = 'PROCESSING'";

/// Claims an existing record for a new owner: a retryable failure, or a PROCESSING record whose
/// lease expired (which fences the stale owner out from here on). The version must still be the
/// one the caller decided on, so of several concurrent re-claimers exactly one wins.
const RECLAIM: &str = "UPDATE dtx_idempotency SET status = 'PROCESSING', owner_token = ?, \
                       lease_until = ?, retry_count = retry_count + 1, version = version + 1, \
                       updated_at = ? \
                       WHERE scope = ? AND idem_key = ? AND version = ? \
                       AND (status = 'FAILED_RETRYABLE' \
                            OR (status = 'PROCESSING' AND lease_until < ?))";

/// Parks a record the owner could not resolve: no lease (so nobody takes it over), a reason.
const PARK: &str = "UPDATE dtx_idempotency SET lease_until = NULL, attention = ?, \
                    version = version + 1, updated_at = ? \
                    WHERE scope = ? AND idem_key = ? AND owner_token = ? \
                    AND status = 'PROCESSING'";

/// A person's decision on a parked record.
const RESOLVE: &str = "UPDATE dtx_idempotency SET status = ?, result_code = ?, result_body = ?, \
                       resource_id = ?, attention = NULL, \
                       version = version + 1, updated_at = ? \
                       WHERE scope = ? AND idem_key = ? AND status = 'PROCESSING' \
                       AND attention IS NOT NULL";

/// Expired leases of a scope, oldest first (served by the (status, lease_until) index).
const EXPIRED: &str = "SELECT idem_key FROM dtx_idempotency \
                       WHERE status = 'PROCESSING' AND lease_until < ? AND scope = ? \
                       ORDER BY lease_until LIMIT ?";

const STATS: &str = "SELECT status, COUNT(*), COUNT(attention), MIN(updated_at) \
                     FROM dtx_idempotency WHERE scope = ? GROUP BY status";

/// Deletes one bounded batch of a scope's finished records older than the cutoff.
/// Finished records of one scope older than the cutoff (both timestamps), oldest first; the
/// limit is the last placeholder.
pub(crate) const PURGE: Sql = dtx_sql::delete_limit!(
    from: "dtx_idempotency",
    where: "scope = ? AND created_at < ? AND updated_at < ? AND status <> 'PROCESSING'",
    order_by: "created_at"
);

/// Runs a statement aimed at one row; true if it matched it (MySQL reports matched rows).
async fn one_row<'a, C: Conn>(
    conn: &'a mut C,
    sql: &'static str,
    args: &'a [Arg<'a>],
) -> Result<bool, Error> {
    Ok(conn.execute(sql, args).await? == 1)
}

/// Inserts a PROCESSING record owned by `token` unless the key exists; true if inserted.
pub(crate) async fn claim<C: Conn>(
    conn: &mut C,
    key: &Key,
    request_hash: &str,
    token: &str,
    lease_until: i64,
    now: i64,
) -> Result<bool, Error> {
    one_row(
        conn,
        CLAIM.pick(C::DIALECT),
        args![
            key.scope(),
            key.idem_key(),
            request_hash,
            token,
            lease_until,
            now,
            now
        ],
    )
    .await
}

pub(crate) async fn read<C: Conn>(conn: &mut C, key: &Key) -> Result<Option<Record>, Error> {
    let Some(row) = conn
        .fetch_optional(READ, args![key.scope(), key.idem_key()])
        .await?
    else {
        return Ok(None);
    };
    let status = row.text(1)?;
    let status = Status::parse(&status)
        .ok_or_else(|| Error::Corrupt(format!("unknown status {status:?} in the store")))?;
    let result = match row.opt_text(4)? {
        Some(code) => Some(StoredResult {
            code,
            body: row.opt_bytes(5)?.unwrap_or_default(),
            resource_id: row.opt_text(6)?,
        }),
        None => None,
    };
    Ok(Some(Record {
        request_hash: row.text(0)?,
        status,
        owner_token: row.text(2)?,
        lease_until: row.opt_i64(3)?,
        result,
        retry_count: row.i64(7)?,
        version: row.i64(8)?,
        attention: row.opt_text(9)?,
        created_at: row.i64(10)?,
        updated_at: row.i64(11)?,
    }))
}

/// Who finishes a PROCESSING record.
#[derive(Debug, Clone, Copy)]
pub(crate) enum By<'a> {
    /// The owner holding this token (fenced).
    Owner(&'a str),
    /// A person resolving a parked record.
    Person,
}

/// Records `result` on a PROCESSING record; false if `by` may not (any more): the token lost
/// the record (fenced), or the record is not parked.
pub(crate) async fn finish<C: Conn>(
    conn: &mut C,
    key: &Key,
    by: By<'_>,
    status: Status,
    result: &StoredResult,
    now: i64,
) -> Result<bool, Error> {
    // "No resource" is a NULL (dtx_sql binds it typed as text); `Some("")` stays ''.
    let resource = result.resource_id.as_deref();
    let (code, body) = (&result.code, &result.body);
    let (scope, idem_key) = (key.scope(), key.idem_key());
    match by {
        By::Owner(token) => {
            let args = args![
                status.as_str(),
                code,
                body,
                resource,
                now,
                scope,
                idem_key,
                token
            ];
            one_row(conn, COMPLETE, args).await
        }
        // A person resolves a parked record: no owner to fence on.
        By::Person => {
            let args = args![status.as_str(), code, body, resource, now, scope, idem_key];
            one_row(conn, RESOLVE, args).await
        }
    }
}

/// Moves `token`'s lease end to `lease_until`; false if the token lost the record.
pub(crate) async fn renew<C: Conn>(
    conn: &mut C,
    key: &Key,
    token: &str,
    lease_until: i64,
    now: i64,
) -> Result<bool, Error> {
    let args = args![lease_until, now, key.scope(), key.idem_key(), token];
    one_row(conn, RENEW, args).await
}

/// True if `token` still owns the PROCESSING record.
pub(crate) async fn touch<C: Conn>(
    conn: &mut C,
    key: &Key,
    token: &str,
    now: i64,
) -> Result<bool, Error> {
    one_row(conn, TOUCH, args![now, key.scope(), key.idem_key(), token]).await
}

pub(crate) async fn reclaim<C: Conn>(
    conn: &mut C,
    key: &Key,
    token: &str,
    version: i64,
    lease_until: i64,
    now: i64,
) -> Result<bool, Error> {
    one_row(
        conn,
        RECLAIM,
        args![
            token,
            lease_until,
            now,
            key.scope(),
            key.idem_key(),
            version,
            now
        ],
    )
    .await
}

pub(crate) async fn park<C: Conn>(
    conn: &mut C,
    key: &Key,
    token: &str,
    reason: &str,
    now: i64,
) -> Result<bool, Error> {
    one_row(
        conn,
        PARK,
        args![reason, now, key.scope(), key.idem_key(), token],
    )
    .await
}

pub(crate) async fn expired<C: Conn>(
    conn: &mut C,
    scope: &str,
    now: i64,
    limit: u32,
) -> Result<Vec<String>, Error> {
    let rows = conn
        .fetch_all(EXPIRED, args![now, scope, i64::from(limit)])
        .await?;
    Ok(rows
        .iter()
        .map(|row| row.text(0))
        .collect::<Result<_, _>>()?)
}

pub(crate) async fn stats<C: Conn>(conn: &mut C, scope: &str) -> Result<Stats, Error> {
    let mut stats = Stats::default();
    for row in conn.fetch_all(STATS, args![scope]).await? {
        let count = row.i64(1)? as u64;
        match Status::parse(&row.text(0)?) {
            Some(Status::Processing) => {
                stats.processing = count;
                stats.parked = row.i64(2)? as u64;
                stats.oldest_processing_update = row.opt_i64(3)?;
            }
            Some(finished) => {
                match finished {
                    Status::Succeeded => stats.succeeded = count,
                    Status::FailedRetryable => stats.failed_retryable = count,
                    _ => stats.failed_final = count,
                }
                let oldest = row.opt_i64(3)?;
                stats.oldest_finished_update = match (stats.oldest_finished_update, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => {}
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status spelled in the records' SQL is one `Status` parses.
    #[test]
    fn every_literal_in_the_sql_is_a_status_spelling() {
        let mut statements = vec![
            READ, COMPLETE, RENEW, TOUCH, RECLAIM, PARK, RESOLVE, EXPIRED, STATS,
        ];
        for sql in [CLAIM, PURGE] {
            statements.extend(sql.texts());
        }
        dtx_sql::assert_literals_known(&statements, &[Status::SPELLINGS]);
    }
}
