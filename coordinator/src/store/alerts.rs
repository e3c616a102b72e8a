//! The store's side of alerts: finding stuck transactions, and the delivery queue several
//! coordinators share. (Alerts are inserted with the change that raised them, in
//! [`super::writes`].)

use std::sync::atomic::Ordering;
use std::time::Duration;

use dtx_sql::{Backend, Conn, Sql, SqlRow, args};

use super::rows::{global_columns, global_from_row};
use super::sql::SqlStore;
use super::writes::insert_alerts;
use super::{Delivery, Outgoing};
use crate::domain::alert::Alert;
use crate::domain::{GlobalRow, TxStatus};
use crate::error::Result;

/// Open transactions of one status created before a time that have no STUCK alert yet (the
/// columns of `SELECT_GLOBAL`): one walk of the status index per status, bounded by the limit.
const STUCK: &str = concat!(
    "SELECT ",
    global_columns!("", "NULL"),
    " FROM dtx_global g WHERE status = ? AND created_ms <= ? AND NOT EXISTS \
     (SELECT 1 FROM dtx_alert a WHERE a.xid = g.xid AND a.kind = 'STUCK') LIMIT ?"
);

/// Alerts due for delivery; other senders skip the rows this one locked.
const DUE_ALERTS: Sql = Sql {
    postgres: "SELECT id, body, attempts, delivered FROM dtx_alert WHERE due_ms <= ? \
               ORDER BY due_ms LIMIT ? FOR UPDATE SKIP LOCKED",
    mysql: "SELECT id, body, attempts, delivered FROM dtx_alert WHERE due_ms <= ? \
            ORDER BY due_ms LIMIT ? FOR UPDATE SKIP LOCKED",
    // SQLite has one writer at a time: BEGIN IMMEDIATE already excludes other senders.
    sqlite: "SELECT id, body, attempts, delivered FROM dtx_alert WHERE due_ms <= ? \
             ORDER BY due_ms LIMIT ?",
};

const ANY_DUE_ALERT: &str = "SELECT id FROM dtx_alert WHERE due_ms <= ? LIMIT 1";

/// Claims a due alert: due again only after the sender's delivery timeout.
const CLAIM_ALERT: &str = "UPDATE dtx_alert SET due_ms = ? WHERE id = ? AND due_ms <= ?";

const FINISH_ALERT: &str = "UPDATE dtx_alert SET due_ms = ?, attempts = attempts + 1, \
     delivered = ?, last_error = ?, sent_ms = ? WHERE id = ?";

impl<DB: Backend> SqlStore<DB> {
    pub(super) async fn stuck_rows(
        &self,
        created_before_ms: i64,
        limit: i64,
    ) -> Result<Vec<GlobalRow>> {
        let mut conn = self.pool.acquire().await?;
        let conn = DB::pooled(&mut conn);
        let mut rows = Vec::new();
        // Parked transactions have their own alert.
        for status in TxStatus::ALL
            .iter()
            .filter(|s| !s.is_terminal() && **s != TxStatus::NeedsAttention)
        {
            let found = conn
                .fetch_all(STUCK, args![status.as_str(), created_before_ms, limit])
                .await?;
            for row in found {
                rows.push(global_from_row(&row)?);
            }
        }
        Ok(rows)
    }

    pub(super) async fn add(&self, alerts: &[Alert]) -> Result<u64> {
        let mut tx = DB::begin(&self.pool).await?;
        let inserted = insert_alerts(DB::conn(&mut tx), alerts, self.clock.now_ms()).await?;
        tx.commit().await?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(inserted)
    }

    pub(super) async fn claim_outgoing(
        &self,
        timeout: Duration,
        limit: i64,
    ) -> Result<Vec<Outgoing>> {
        let now = self.clock.now_ms();
        // A plain read first: an idle sender polls without opening write transactions.
        {
            let mut conn = self.pool.acquire().await?;
            if DB::pooled(&mut conn)
                .fetch_optional(ANY_DUE_ALERT, args![now])
                .await?
                .is_none()
            {
                return Ok(Vec::new());
            }
        }
        let until = now + timeout.as_millis() as i64;
        let mut tx = DB::begin(&self.pool).await?;
        let conn = DB::conn(&mut tx);
        let rows = conn
            .fetch_all(
                DUE_ALERTS.pick(<DB::Conn as Conn>::DIALECT),
                args![now, limit],
            )
            .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let id = row.text(0)?;
            if conn
                .execute(CLAIM_ALERT, args![until, id.as_str(), now])
                .await?
                == 1
            {
                claimed.push(Outgoing {
                    id,
                    body: row.text(1)?,
                    attempts: row.i64(2)?,
                    delivered: row
                        .opt_text(3)?
                        .map(|d| d.lines().map(str::to_string).collect())
                        .unwrap_or_default(),
                });
            }
        }
        tx.commit().await?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(claimed)
    }

    pub(super) async fn finish(&self, id: &str, delivery: &Delivery) -> Result<()> {
        let now = self.clock.now_ms();
        let sent = delivery.retry_at_ms.is_none().then_some(now);
        let delivered = delivery.delivered.join("\n");
        let mut conn = self.pool.acquire().await?;
        DB::pooled(&mut conn)
            .execute(
                FINISH_ALERT,
                args![
                    delivery.retry_at_ms,
                    delivered.as_str(),
                    delivery.error.as_ref(),
                    sent,
                    id
                ],
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::alert::AlertKind;

    #[test]
    fn every_literal_in_the_alert_sql_is_an_enum_spelling() {
        let mut statements = vec![STUCK, ANY_DUE_ALERT, CLAIM_ALERT, FINISH_ALERT];
        statements.extend(DUE_ALERTS.texts());
        dtx_sql::assert_literals_known(&statements, &[AlertKind::SPELLINGS, TxStatus::SPELLINGS]);
    }
}
