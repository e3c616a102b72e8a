//! Every statement the outbox runs, and the row it reads back.

use std::collections::BTreeMap;

use dtx_sql::{Arg, Conn, Sql, SqlRow, args, delete_limit};

use crate::{Error, Event};

const INSERT: &str = "INSERT INTO dtx_outbox (event_id, topic, msg_key, headers, payload, \
     status, attempts, next_at, created_at) VALUES (?, ?, ?, ?, ?, 'PENDING', 0, ?, ?)";

/// The oldest unsent row of each key that is due and not claimed: a later row of a key waits
/// until every earlier one is sent (a parked one blocks its key), which keeps order per key.
/// The candidates are the first due, unclaimed rows in id order (at most the second limit,
/// walked on the `(status, id)` index), so a round costs the same however deep the backlog.
/// Rows another relay locked are skipped.
macro_rules! claimable {
    ($lock:literal) => {
        concat!(
            "SELECT o.id, o.event_id, o.topic, o.msg_key, o.headers, o.payload, o.attempts, ",
            "o.created_at FROM (SELECT id FROM dtx_outbox WHERE status = 'PENDING' ",
            "AND next_at <= ? AND (lease_until IS NULL OR lease_until < ?) ",
            "ORDER BY id LIMIT ?) c JOIN dtx_outbox o ON o.id = c.id ",
            // Again on the locked row itself: PostgreSQL re-checks only these conditions on a
            // row another relay claimed and committed meanwhile (the subquery's snapshot is
            // older), and MySQL evaluates them on the latest version it locks.
            "WHERE o.status = 'PENDING' AND o.next_at <= ? ",
            "AND (o.lease_until IS NULL OR o.lease_until < ?) ",
            "AND NOT EXISTS (SELECT 1 FROM dtx_outbox e WHERE e.msg_key = o.msg_key ",
            "AND e.status IN ('PENDING', 'PARKED') AND e.id < o.id) ",
            "ORDER BY o.id LIMIT ?",
            $lock
        )
    };
}

const CLAIMABLE: Sql = Sql {
    postgres: claimable!(" FOR UPDATE OF o SKIP LOCKED"),
    mysql: claimable!(" FOR UPDATE SKIP LOCKED"),
    // One writer at a time (BEGIN IMMEDIATE): no other relay claims meanwhile.
    sqlite: claimable!(""),
};

/// The rows after a claimed head of one key, in order (one of these per key, joined with
/// `UNION ALL`): no other relay claims them while their head is unsent, so the claiming relay
/// may publish them in sequence behind it. Columns as [`CLAIMABLE`], then `next_at` and
/// `lease_until` to stop at a row that is not due.
const FOLLOWERS: &str = "SELECT * FROM (SELECT id, event_id, topic, msg_key, headers, payload, \
     attempts, created_at, next_at, lease_until FROM dtx_outbox WHERE msg_key = ? \
     AND status = 'PENDING' AND id > ? ORDER BY id LIMIT ?) f";

/// `... WHERE id IN (` + one placeholder per claimed row + `)`.
const LEASE: &str = "UPDATE dtx_outbox SET lease_owner = ?, lease_until = ? WHERE id IN (";

/// Whoever marks them first: a relay whose lease ran out may have published them too (the
/// broker drops the duplicate by its message id). Followed by the ids, as [`LEASE`].
const SENT: &str = "UPDATE dtx_outbox SET status = 'SENT', sent_at = ?, lease_owner = NULL, \
     lease_until = NULL WHERE status = 'PENDING' AND id IN (";

/// Claimed rows a relay did not try after an earlier row of their key failed: free again
/// (they still wait behind that row). Followed by the ids, as [`LEASE`].
const RELEASE: &str = "UPDATE dtx_outbox SET lease_owner = NULL, lease_until = NULL \
     WHERE status = 'PENDING' AND lease_owner = ? AND id IN (";

/// A failed publish: due again at `next_at`, or parked once the attempts reach the limit. The
/// status is assigned before `attempts` (MySQL reads assignments left to right).
const FAILED: &str = "UPDATE dtx_outbox SET \
     status = CASE WHEN attempts + 1 >= ? THEN 'PARKED' ELSE 'PENDING' END, \
     attempts = attempts + 1, next_at = ?, last_error = ?, lease_owner = NULL, \
     lease_until = NULL WHERE id = ? AND status = 'PENDING' AND lease_owner = ?";

const REPUBLISH: &str = "UPDATE dtx_outbox SET status = 'PENDING', attempts = 0, next_at = ?, \
     last_error = NULL WHERE event_id = ? AND status = 'PARKED'";

pub(crate) const PURGE: Sql = delete_limit!(
    from: "dtx_outbox",
    where: "status = 'SENT' AND sent_at < ?",
    order_by: "sent_at"
);

const WAITING: &str = "SELECT COUNT(*), MIN(created_at) FROM dtx_outbox WHERE status = 'PENDING'";

const PARKED: &str = "SELECT COUNT(*) FROM dtx_outbox WHERE status = 'PARKED'";

const STATUS: &str = "SELECT status, attempts, last_error FROM dtx_outbox WHERE event_id = ?";

/// Longest `last_error` kept (the column's width).
const MAX_ERROR: usize = 512;

pub(crate) async fn insert<C: Conn>(
    conn: &mut C,
    event_id: &str,
    topic: &str,
    key: &str,
    headers: &BTreeMap<String, String>,
    payload: &[u8],
    now: i64,
) -> Result<(), Error> {
    let headers = serde_json::to_vec(headers).expect("string maps encode");
    conn.execute(
        INSERT,
        args![event_id, topic, key, &headers, payload, now, now],
    )
    .await?;
    Ok(())
}

/// How much one claim takes: rows in all, rows of one key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub batch: i64,
    pub run_per_key: i64,
}

/// Claims up to `limits.batch` due rows for `owner` until `lease_until`, in the caller's transaction,
/// in id order: the oldest unsent row of each key that has one due, and - while the limits
/// allow, shared evenly among those keys - the rows that follow it, so a backlog on few keys
/// moves many rows per round. The caller publishes each key's rows in sequence.
pub(crate) async fn claim<C: Conn>(
    conn: &mut C,
    owner: &str,
    now: i64,
    lease_until: i64,
    limits: Limits,
) -> Result<Vec<Event>, Error> {
    let limit = limits.batch;
    let rows = conn
        .fetch_all(
            CLAIMABLE.pick(C::DIALECT),
            args![now, now, limit * 4, now, now, limit],
        )
        .await?;
    let mut events = rows.iter().map(event).collect::<Result<Vec<_>, _>>()?;
    let room = limit - events.len() as i64;
    if !events.is_empty() && room > 0 && limits.run_per_key > 1 {
        let fair_share = (room + events.len() as i64 - 1) / events.len() as i64;
        let per_key = fair_share.min(limits.run_per_key - 1);
        let followers = followers(conn, &events, per_key, now).await?;
        events.extend(followers.into_iter().take(room as usize));
        events.sort_by_key(|e| e.id);
    }
    if !events.is_empty() {
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        let mut all: Vec<Arg> = args![owner, lease_until].to_vec();
        all.extend(ids.iter().map(|id| Arg::from(*id)));
        conn.execute_dynamic(with_ids(LEASE, ids.len()), &all)
            .await?;
    }
    Ok(events)
}

/// Up to `per_key` rows after each head, each key's run cut at its first row that is not due
/// or still leased (so what is taken stays consecutive).
async fn followers<C: Conn>(
    conn: &mut C,
    heads: &[Event],
    per_key: i64,
    now: i64,
) -> Result<Vec<Event>, Error> {
    let sql = (0..heads.len())
        .map(|i| format!("{FOLLOWERS}{i}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let mut all: Vec<Arg> = Vec::with_capacity(heads.len() * 3);
    for head in heads {
        all.extend([
            Arg::from(head.key.as_str()),
            Arg::from(head.id),
            Arg::from(per_key),
        ]);
    }
    let rows = conn.fetch_all_dynamic(sql, &all).await?;
    let mut rows = rows
        .iter()
        .map(|row| Ok((event(row)?, row.i64(8)?, row.opt_i64(9)?)))
        .collect::<Result<Vec<_>, Error>>()?;
    rows.sort_by_key(|(e, _, _)| e.id);
    let mut stopped = std::collections::HashSet::new();
    let mut taken = Vec::new();
    for (event, next_at, lease_until) in rows {
        let free = next_at <= now && lease_until.is_none_or(|until| until < now);
        if !free {
            stopped.insert(event.key.clone());
        } else if !stopped.contains(&event.key) {
            taken.push(event);
        }
    }
    Ok(taken)
}

/// `statement` closed with `n` id placeholders (the text holds no input, only placeholders).
fn with_ids(statement: &str, n: usize) -> String {
    let mut sql = String::with_capacity(statement.len() + 3 * n);
    sql.push_str(statement);
    for i in 0..n {
        sql.push_str(if i == 0 { "?" } else { ", ?" });
    }
    sql.push(')');
    sql
}

fn event<R: SqlRow>(row: &R) -> Result<Event, Error> {
    let headers = row.bytes(4)?;
    let event_id = row.text(1)?;
    Ok(Event {
        id: row.i64(0)?,
        headers: serde_json::from_slice(&headers)
            .map_err(|e| Error::Corrupt(format!("headers of {event_id}: {e}")))?,
        event_id,
        topic: row.text(2)?,
        key: row.text(3)?,
        payload: row.bytes(5)?,
        attempts: row.i64(6)?,
        created_at: row.i64(7)?,
    })
}

/// Marks the rows `ids` sent, in one statement.
pub(crate) async fn sent<C: Conn>(conn: &mut C, ids: &[i64], now: i64) -> Result<(), Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut all: Vec<Arg> = args![now].to_vec();
    all.extend(ids.iter().map(|id| Arg::from(*id)));
    conn.execute_dynamic(with_ids(SENT, ids.len()), &all)
        .await?;
    Ok(())
}

/// Frees the claimed rows `ids` of `owner` that were not tried.
pub(crate) async fn release<C: Conn>(conn: &mut C, owner: &str, ids: &[i64]) -> Result<(), Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut all: Vec<Arg> = args![owner].to_vec();
    all.extend(ids.iter().map(|id| Arg::from(*id)));
    conn.execute_dynamic(with_ids(RELEASE, ids.len()), &all)
        .await?;
    Ok(())
}

/// Records a failed publish; true if the row is parked now.
pub(crate) async fn failed<C: Conn>(
    conn: &mut C,
    event: &Event,
    owner: &str,
    max_attempts: u32,
    next_at: i64,
    error: &str,
) -> Result<bool, Error> {
    let error = dtx_proto::present::reason(error);
    let mut cut = error.len().min(MAX_ERROR);
    while !error.is_char_boundary(cut) {
        cut -= 1;
    }
    let args: &[Arg] = args![
        i64::from(max_attempts),
        next_at,
        &error[..cut],
        event.id,
        owner
    ];
    conn.execute(FAILED, args).await?;
    Ok(event.attempts + 1 >= i64::from(max_attempts))
}

pub(crate) async fn republish<C: Conn>(
    conn: &mut C,
    event_id: &str,
    now: i64,
) -> Result<bool, Error> {
    Ok(conn.execute(REPUBLISH, args![now, event_id]).await? == 1)
}

/// (rows waiting to be sent, the oldest one's `created_at`, rows parked).
pub(crate) async fn backlog<C: Conn>(conn: &mut C) -> Result<(i64, Option<i64>, i64), Error> {
    let waiting = conn.fetch_optional(WAITING, &[]).await?;
    let (count, oldest) = match waiting {
        Some(row) => (row.i64(0)?, row.opt_i64(1)?),
        None => (0, None),
    };
    let parked = match conn.fetch_optional(PARKED, &[]).await? {
        Some(row) => row.i64(0)?,
        None => 0,
    };
    Ok((count, oldest, parked))
}

/// An event's (status, attempts, last error), if it exists.
pub(crate) async fn status<C: Conn>(
    conn: &mut C,
    event_id: &str,
) -> Result<Option<(String, i64, Option<String>)>, Error> {
    let Some(row) = conn.fetch_optional(STATUS, args![event_id]).await? else {
        return Ok(None);
    };
    Ok(Some((row.text(0)?, row.i64(1)?, row.opt_text(2)?)))
}
