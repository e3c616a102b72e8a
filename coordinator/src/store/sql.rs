//! The store on PostgreSQL, MySQL/MariaDB and SQLite: its reads, claims and listings; the
//! writes a batch applies are in [`super::writes`], the rows' decoding in [`super::rows`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dtx_sql::sqlx::Pool;
use dtx_sql::{Arg, Backend, Conn, Dialect, Schema, Sql, SqlRow, args};
use futures::future::BoxFuture;

use super::clock::{DB_NOW_MS, DbClock};
use super::rows::{
    LIST_GLOBAL, SELECT_HISTORY, corrupt, entry_from_row, global_from_row, read_branches,
    read_global,
};
use super::writer::Writer;
use super::writes::insert_history;
use super::{
    BeginTcc, Created, Decide, Decided, Delivery, ListQuery, Outgoing, Progress, Progressed,
    RegisterBranch, Registered, Store, StoreOptions, StoreStats, SubmitSaga, Tally,
};
use crate::domain::alert::Alert;
use crate::domain::history::{Entry, Event};
use crate::domain::{Fence, GlobalRow, Kind, TxRecord, TxStatus};
use crate::error::Result;

/// Rows whose recovery time passed, with their previous owner. Other claimers skip the rows
/// this one locked.
const DUE: Sql = Sql {
    postgres: "SELECT xid, owner FROM dtx_global WHERE due_ms <= ? ORDER BY due_ms LIMIT ? \
               FOR UPDATE SKIP LOCKED",
    mysql: "SELECT xid, owner FROM dtx_global WHERE due_ms <= ? ORDER BY due_ms LIMIT ? \
            FOR UPDATE SKIP LOCKED",
    // SQLite has one writer at a time: BEGIN IMMEDIATE already excludes other claimers.
    sqlite: "SELECT xid, owner FROM dtx_global WHERE due_ms <= ? ORDER BY due_ms LIMIT ?",
};

const ANY_DUE: &str = "SELECT xid FROM dtx_global WHERE due_ms <= ? LIMIT 1";

const CLAIM: &str = "UPDATE dtx_global SET owner = ?, fence = ?, due_ms = ?, updated_ms = ? \
     WHERE xid = ? AND due_ms <= ?";

const PARKED: &str = "SELECT COUNT(*) FROM dtx_global WHERE status = 'NEEDS_ATTENTION'";

const TALLY: &str = "SELECT kind, status, COUNT(*) FROM dtx_global GROUP BY kind, status";

/// The oldest row of one status: one step down the (status, created_ms) index.
const OLDEST_OF_STATUS: &str = "SELECT MIN(created_ms) FROM dtx_global WHERE status = ?";

const FINISHED: &str = "SELECT xid FROM dtx_global WHERE status IN \
     ('COMMITTED', 'ROLLED_BACK', 'SUCCEEDED', 'COMPENSATED') AND updated_ms < ? LIMIT ?";

/// `created_ms` of the oldest transaction in a non-terminal status: one index step per status.
async fn oldest_open<DB: Backend>(conn: &mut DB::Conn) -> Result<Option<i64>> {
    let mut oldest: Option<i64> = None;
    for status in TxStatus::ALL.iter().filter(|s| !s.is_terminal()) {
        if let Some(row) = conn
            .fetch_optional(OLDEST_OF_STATUS, args![status.as_str()])
            .await?
            && let Some(created) = row.opt_i64(0)?
        {
            oldest = Some(oldest.map_or(created, |o| o.min(created)));
        }
    }
    Ok(oldest)
}

/// The store on database `DB`. Cheap to clone (every field is shared).
pub struct SqlStore<DB: Backend> {
    pub(super) pool: Pool<DB>,
    writer: Writer,
    pub(super) stats: Arc<StoreStats>,
    pub(super) clock: Arc<DbClock>,
}

// Not derived: a derive would require `DB: Clone`, which database marker types are not.
impl<DB: Backend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            writer: self.writer.clone(),
            stats: self.stats.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<DB: Backend> SqlStore<DB> {
    /// Connects, applies the coordinator schema, and starts the writer tasks.
    pub async fn open(url: &str, options: StoreOptions) -> Result<Self, super::OpenError> {
        let pool = DB::connect(url, options.max_connections).await?;
        DB::migrate(&pool, Schema::Coordinator).await?;
        let stats = Arc::new(StoreStats::default());
        let clock = Arc::new(DbClock::default());
        let writer = Writer::start::<DB>(pool.clone(), options, stats.clone(), clock.clone());
        let store = SqlStore {
            pool,
            writer,
            stats,
            clock,
        };
        store.sample_clock().await?;
        Ok(store)
    }

    /// Reads the database's time and records it on the clock.
    /// Samples the database's clock three times on one connection and keeps the sample with
    /// the shortest round trip: its midpoint error is smallest, and one sample delayed by a
    /// busy host cannot shift every lease and deadline by half its delay.
    async fn sample_clock(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let mut best: Option<(i64, Instant, Instant, i64)> = None;
        for _ in 0..3 {
            let sent = Instant::now();
            let row = conn
                .fetch_optional(DB_NOW_MS.pick(<DB::Conn as Conn>::DIALECT), &[])
                .await?
                .ok_or_else(|| corrupt("database time", "no row"))?;
            let received = Instant::now();
            if best.is_none_or(|(_, s, r, _)| received - sent < r - s) {
                best = Some((row.i64(0)?, sent, received, dtx_sql::now_ms()));
            }
        }
        if let Some((db_ms, sent, received, wall_ms)) = best {
            self.clock.record(db_ms, sent, received, wall_ms);
        }
        Ok(())
    }

    /// Runs `work` with a clone of this store on a task of its own: a request that goes away
    /// mid-query must not hand its connection back to the pool out of step (see
    /// `dtx_sql::detached`). Writes need no such care: the writer tasks run them.
    fn detach<T, F, Fut>(&self, work: F) -> BoxFuture<'static, Result<T>>
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        Box::pin(dtx_sql::detached(work(self.clone())))
    }

    async fn read(&self, xid: &str) -> Result<Option<TxRecord>> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let Some(global) = read_global(conn, xid).await? else {
            return Ok(None);
        };
        let branches = read_branches(conn, xid).await?;
        Ok(Some(TxRecord { global, branches }))
    }

    async fn claim(&self, owner: &str, lease: Duration, limit: i64) -> Result<Vec<TxRecord>> {
        let now = self.clock.now_ms();
        // A plain read first: an idle coordinator polls without opening write transactions.
        {
            let mut conn = self.pool.acquire().await?;
            if DB::pooled(&mut conn)
                .fetch_optional(ANY_DUE, args![now])
                .await?
                .is_none()
            {
                return Ok(Vec::new());
            }
        }
        let due_ms = now + lease.as_millis() as i64;
        let mut tx = DB::begin(&self.pool).await?;
        let conn = DB::conn(&mut tx);
        let rows = conn
            .fetch_all(DUE.pick(<DB::Conn as Conn>::DIALECT), args![now, limit])
            .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut history = Vec::with_capacity(rows.len());
        for row in rows {
            let xid = row.text(0)?;
            let fence = Fence::fresh();
            let n = conn
                .execute(CLAIM, args![owner, fence, due_ms, now, xid.as_str(), now])
                .await?;
            if n == 1 {
                let detail = match row.opt_text(1)? {
                    Some(previous) => format!("lease of {previous} expired"),
                    None => "due".to_string(),
                };
                let entry = Entry::tx(now, Event::Takeover, None)
                    .detail(detail)
                    .by(owner);
                history.push((xid.clone(), entry));
                claimed.push(xid);
            }
        }
        insert_history(conn, &history, now).await?;
        tx.commit().await?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let mut records = Vec::with_capacity(claimed.len());
        for xid in claimed {
            if let Some(record) = self.read(&xid).await? {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// One index walk per status asked for (or one over all), each bounded by the page size,
    /// merged newest first.
    async fn list_rows(&self, q: &ListQuery) -> Result<Vec<GlobalRow>> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        // Every status when none is asked for: the one (status, updated_ms) index serves all.
        let mut statuses = match q.statuses.is_empty() {
            true => TxStatus::ALL.to_vec(),
            false => q.statuses.clone(),
        };
        statuses.sort_by_key(|s| s.as_str());
        statuses.dedup();
        let patterns = list_patterns(q);
        let mut rows = Vec::new();
        for status in statuses {
            let (sql, list) = list_statement(<DB::Conn as Conn>::DIALECT, q, status, &patterns);
            for row in conn.fetch_all_dynamic(sql, &list).await? {
                rows.push(global_from_row(&row)?);
            }
        }
        rows.sort_by(|a, b| (b.updated_ms, &b.xid).cmp(&(a.updated_ms, &a.xid)));
        rows.truncate(q.limit.max(0) as usize);
        Ok(rows)
    }

    async fn tally_rows(&self) -> Result<Tally> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let mut tally = Tally::default();
        for row in conn.fetch_all(TALLY, &[]).await? {
            let (kind, status) = (row.text(0)?, row.text(1)?);
            tally.counts.push((
                Kind::parse(&kind).ok_or_else(|| corrupt("kind", &kind))?,
                TxStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
                row.i64(2)?.max(0) as u64,
            ));
        }
        tally.oldest_open_created_ms = oldest_open::<DB>(conn).await?;
        Ok(tally)
    }

    async fn purge(&self, before_ms: i64, batch: i64) -> Result<u64> {
        let purged = dtx_sql::purge_batched(&self.pool, batch, |mut tx, limit| async move {
            let conn = DB::conn(&mut tx);
            let xids: Vec<String> = conn
                .fetch_all(FINISHED, args![before_ms, limit])
                .await?
                .iter()
                .map(|r| r.text(0))
                .collect::<std::result::Result<_, _>>()?;
            if !xids.is_empty() {
                let marks = vec!["?"; xids.len()].join(", ");
                let list: Vec<Arg<'_>> = xids.iter().map(Arg::from).collect();
                for table in ["dtx_history", "dtx_alert", "dtx_branch"] {
                    conn.execute_dynamic(
                        format!("DELETE FROM {table} WHERE xid IN ({marks})"),
                        &list,
                    )
                    .await?;
                }
                conn.execute_dynamic(
                    format!("DELETE FROM dtx_global WHERE xid IN ({marks})"),
                    &list,
                )
                .await?;
            }
            Ok::<_, dtx_sql::sqlx::Error>((tx, xids.len() as u64))
        })
        .await?;
        Ok(purged)
    }
}

impl<DB: Backend> Store for SqlStore<DB> {
    fn begin_tcc(&self, write: BeginTcc) -> BoxFuture<'_, Result<Created>> {
        Box::pin(self.writer.submit(write))
    }

    fn submit_saga(&self, write: SubmitSaga) -> BoxFuture<'_, Result<Created>> {
        Box::pin(self.writer.submit(write))
    }

    fn register_branch(&self, write: RegisterBranch) -> BoxFuture<'_, Result<Registered>> {
        Box::pin(self.writer.submit(write))
    }

    fn decide(&self, write: Decide) -> BoxFuture<'_, Result<Decided>> {
        Box::pin(self.writer.submit(write))
    }

    fn progress(&self, write: Progress) -> BoxFuture<'_, Result<Progressed>> {
        Box::pin(self.writer.submit(write))
    }

    fn get<'a>(&'a self, xid: &'a str) -> BoxFuture<'a, Result<Option<TxRecord>>> {
        let xid = xid.to_owned();
        self.detach(move |store| async move { store.read(&xid).await })
    }

    fn claim_due<'a>(
        &'a self,
        owner: &'a str,
        lease: Duration,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<TxRecord>>> {
        let owner = owner.to_owned();
        self.detach(move |store| async move { store.claim(&owner, lease, limit).await })
    }

    fn purge_finished(&self, before_ms: i64, batch: i64) -> BoxFuture<'_, Result<u64>> {
        self.detach(move |store| async move { store.purge(before_ms, batch.max(1)).await })
    }

    fn list<'a>(&'a self, query: &'a ListQuery) -> BoxFuture<'a, Result<Vec<GlobalRow>>> {
        let query = query.clone();
        self.detach(move |store| async move { store.list_rows(&query).await })
    }

    fn history<'a>(&'a self, xid: &'a str) -> BoxFuture<'a, Result<Vec<Entry>>> {
        let xid = xid.to_owned();
        self.detach(move |store| async move {
            let mut conn = store.pool.acquire().await?;
            let rows = DB::pooled(&mut conn)
                .fetch_all(SELECT_HISTORY, args![xid.as_str()])
                .await?;
            rows.iter().map(entry_from_row).collect()
        })
    }

    fn tally(&self) -> BoxFuture<'_, Result<Tally>> {
        self.detach(|store| async move { store.tally_rows().await })
    }

    fn oldest_open_created_ms(&self) -> BoxFuture<'_, Result<Option<i64>>> {
        self.detach(|store| async move {
            let mut conn = store.pool.acquire().await?;
            oldest_open::<DB>(DB::pooled(&mut conn)).await
        })
    }

    fn count_parked(&self) -> BoxFuture<'_, Result<u64>> {
        self.detach(|store| async move {
            let mut conn = store.pool.acquire().await?;
            let row = DB::pooled(&mut conn).fetch_optional(PARKED, &[]).await?;
            Ok(row.map_or(Ok(0), |r| r.i64(0))?.max(0) as u64)
        })
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }

    fn clock(&self) -> &DbClock {
        &self.clock
    }

    fn sync_clock(&self) -> BoxFuture<'_, Result<()>> {
        self.detach(|store| async move { store.sample_clock().await })
    }

    fn stuck(&self, created_before_ms: i64, limit: i64) -> BoxFuture<'_, Result<Vec<GlobalRow>>> {
        self.detach(move |store| async move { store.stuck_rows(created_before_ms, limit).await })
    }

    fn add_alerts<'a>(&'a self, alerts: &'a [Alert]) -> BoxFuture<'a, Result<u64>> {
        let alerts = alerts.to_vec();
        self.detach(move |store| async move { store.add(&alerts).await })
    }

    fn claim_alerts(&self, timeout: Duration, limit: i64) -> BoxFuture<'_, Result<Vec<Outgoing>>> {
        self.detach(move |store| async move { store.claim_outgoing(timeout, limit).await })
    }

    fn finish_alert<'a>(
        &'a self,
        id: &'a str,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<()>> {
        let (id, delivery) = (id.to_owned(), delivery.clone());
        self.detach(move |store| async move { store.finish(&id, &delivery).await })
    }
}

/// The listing statement for one status (or all), keyset-paginated newest first. Only
/// placeholders go into the text; xids compare bytewise in every dialect (PostgreSQL is told
/// so), matching the merge in Rust.
fn list_statement<'a>(
    dialect: Dialect,
    q: &'a ListQuery,
    status: TxStatus,
    patterns: &'a [(&'static str, String)],
) -> (String, Vec<Arg<'a>>) {
    let xid = match dialect {
        Dialect::Postgres => "xid COLLATE \"C\"",
        Dialect::MySql | Dialect::Sqlite => "xid",
    };
    let mut filters: Vec<String> = Vec::new();
    let mut list: Vec<Arg<'a>> = Vec::new();
    let mut filter = |sql: String, args: &[Arg<'a>]| {
        filters.push(sql);
        list.extend_from_slice(args);
    };
    filter("status = ?".into(), args![status.as_str()]);
    if let Some(kind) = q.kind {
        filter("kind = ?".into(), args![kind.as_str()]);
    }
    for (like, pattern) in patterns {
        filter(
            format!("{xid} {like} ? ESCAPE '!'"),
            args![pattern.as_str()],
        );
    }
    for (column, (from, to)) in [("created_ms", q.created), ("updated_ms", q.updated)] {
        if let Some(from) = from {
            filter(format!("{column} >= ?"), args![from]);
        }
        if let Some(to) = to {
            filter(format!("{column} <= ?"), args![to]);
        }
    }
    if let Some((updated, after)) = &q.after {
        filter(
            format!("updated_ms <= ? AND (updated_ms < ? OR {xid} < ?)"),
            args![*updated, *updated, after.as_str()],
        );
    }
    let filters = format!(" WHERE {}", filters.join(" AND "));
    list.push(Arg::from(q.limit.max(0)));
    let sql = format!("{LIST_GLOBAL}{filters} ORDER BY updated_ms DESC, {xid} DESC LIMIT ?");
    (sql, list)
}

/// The `LIKE` and `NOT LIKE` patterns of a listing's tenant and xid prefix, `_` escaped with
/// `!` (ids hold no `%` or `!`): a tenant's rows are `tenant/xid`, the default tenant's hold no
/// `/`.
fn list_patterns(q: &ListQuery) -> Vec<(&'static str, String)> {
    let escape = |s: &str| s.replace('_', "!_");
    let prefix = q.xid_prefix.as_deref().map(escape);
    match q.tenant.as_deref() {
        None => prefix
            .map(|p| ("LIKE", format!("{p}%")))
            .into_iter()
            .collect(),
        Some(dtx_proto::limits::DEFAULT_TENANT) => {
            let mut patterns = vec![("NOT LIKE", "%/%".to_string())];
            patterns.extend(prefix.map(|p| ("LIKE", format!("{p}%"))));
            patterns
        }
        Some(tenant) => vec![(
            "LIKE",
            format!("{}/{}%", escape(tenant), prefix.unwrap_or_default()),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing's tenant and prefix become LIKE patterns in which `_` is a character, not a
    /// wildcard: tenant `a_c` must not list tenant `abc`'s transactions, and the default
    /// tenant lists no scoped key even under a prefix the key starts with.
    #[test]
    fn listing_patterns_keep_tenants_apart() {
        let q = |tenant: Option<&str>, prefix: Option<&str>| ListQuery {
            tenant: tenant.map(String::from),
            xid_prefix: prefix.map(String::from),
            ..ListQuery::default()
        };
        let patterns = |tenant, prefix| {
            list_patterns(&q(tenant, prefix))
                .into_iter()
                .map(|(like, p)| format!("{like} {p}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(patterns(Some("a_c"), Some("o_1")), ["LIKE a!_c/o!_1%"]);
        assert_eq!(patterns(Some("acme"), None), ["LIKE acme/%"]);
        assert_eq!(
            patterns(Some(dtx_proto::limits::DEFAULT_TENANT), Some("a")),
            ["NOT LIKE %/%", "LIKE a%"]
        );
        assert_eq!(patterns(None, Some("x_")), ["LIKE x!_%"]);
        assert!(patterns(None, None).is_empty());
    }

    /// Every status, kind and decision spelled inside these statements is one the enums parse.
    #[test]
    fn every_literal_in_the_sql_is_an_enum_spelling() {
        let mut statements = vec![ANY_DUE, CLAIM, PARKED, TALLY, OLDEST_OF_STATUS, FINISHED];
        statements.extend(DUE.texts());
        dtx_sql::assert_literals_known(&statements, &[TxStatus::SPELLINGS, Kind::SPELLINGS]);
    }
}
