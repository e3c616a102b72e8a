//! Get and Wait: from the driver's live view while this instance drives the transaction,
//! from the store otherwise.

use std::time::Duration;

use dtx_proto::backoff::Backoff;
use dtx_proto::limits;

use super::Engine;
use crate::domain::TxRecord;
use crate::error::{Error, Result};

impl Engine {
    /// The transaction as stored, overlaid with the live view of its driver if it runs here.
    pub async fn get(&self, xid: &str) -> Result<TxRecord> {
        limits::check_scoped_xid(xid)?;
        // While this instance drives it, its driver holds the lease: memory is the truth.
        if let Some(record) = self.active(xid).and_then(|a| a.record()) {
            return Ok(record);
        }
        self.inner
            .store
            .get(xid)
            .await?
            .ok_or_else(|| Error::UnknownXid(xid.to_string()))
    }

    /// Waits until the transaction is settled (terminal or parked) or `timeout` elapsed, and
    /// returns it as [`Engine::get`] does.
    pub async fn wait(&self, xid: &str, timeout: Duration) -> Result<TxRecord> {
        limits::check_scoped_xid(xid)?;
        let until = tokio::time::Instant::now() + timeout;
        const POLL: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        let mut polls = 0;
        loop {
            // Driven here: wait for the driver's view, no store reads.
            if let Some(active) = self.active(xid) {
                let mut rx = active.view.subscribe();
                let settled = rx.wait_for(|v| v.status.is_settled() || v.ended.is_some());
                let _ = tokio::time::timeout_at(until, settled).await;
                if let Some(record) = active.record()
                    && (record.global.status.is_settled() || tokio::time::Instant::now() >= until)
                {
                    return Ok(record);
                }
            }
            // Driven elsewhere (or handed off): poll the store with backoff.
            let record = self.get(xid).await?;
            if record.global.status.is_settled() || tokio::time::Instant::now() >= until {
                return Ok(record);
            }
            if self.active(xid).is_none() {
                let poll = POLL.delay(polls, 0.0);
                tokio::time::sleep_until(until.min(tokio::time::Instant::now() + poll)).await;
                polls += 1;
            }
        }
    }
}
