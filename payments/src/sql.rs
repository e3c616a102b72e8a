//! Every statement the callbacks run on their own tables.

use dtx_sql::{Conn, SqlRow, args, insert_ignore};

use crate::Notification;

const PAYMENT: dtx_sql::Sql = insert_ignore!(
    "dtx_payments (provider, merchant, trade_no, order_no, amount, currency, event_type, \
     received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
);

const RECORDED: &str = "SELECT order_no, amount, currency FROM dtx_payments WHERE provider = ? \
     AND merchant = ? AND trade_no = ? AND event_type = ?";

const REPEAT_CONFLICT: &str = "UPDATE dtx_payment_conflicts SET repeats = repeats + 1, \
     last_at = ? WHERE provider = ? AND merchant = ? AND trade_no = ? AND body_hash = ?";

const NEW_CONFLICT: &str = "INSERT INTO dtx_payment_conflicts (provider, merchant, trade_no, \
     order_no, body_hash, reason, body, repeats, first_at, last_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?)";

pub(crate) const PARKED: &str = "SELECT id, provider, merchant, trade_no, order_no, reason, \
     repeats, first_at, last_at FROM dtx_payment_conflicts WHERE resolved_at IS NULL ORDER BY id";

pub(crate) const RESOLVE: &str =
    "UPDATE dtx_payment_conflicts SET resolved_at = ? WHERE id = ? AND resolved_at IS NULL";

/// Longest reason kept, and most of a parked body kept (both are for a person to read).
const MAX_REASON: usize = 512;
const MAX_BODY: usize = 16 * 1024;

/// Records the payment row; `None` if it is new, else the (order, amount, currency) recorded
/// for this trade and event before.
pub(crate) async fn record<C: Conn>(
    conn: &mut C,
    provider: &str,
    n: &Notification,
    now: i64,
) -> Result<Option<(String, i64, String)>, dtx_sql::sqlx::Error> {
    let inserted = conn
        .execute(
            PAYMENT.pick(C::DIALECT),
            args![
                provider,
                n.merchant.as_str(),
                n.trade_no.as_str(),
                n.order_no.as_str(),
                n.amount,
                n.currency.as_str(),
                n.event_type.as_str(),
                now
            ],
        )
        .await?;
    if inserted == 1 {
        return Ok(None);
    }
    let args = args![
        provider,
        n.merchant.as_str(),
        n.trade_no.as_str(),
        n.event_type.as_str()
    ];
    let row = conn.fetch_optional(RECORDED, args).await?;
    match row {
        Some(row) => Ok(Some((row.text(0)?, row.i64(1)?, row.text(2)?))),
        None => Err(dtx_sql::sqlx::Error::RowNotFound),
    }
}

/// Parks a callback for a person: a new row per distinct body, a repeat counted on its row.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn park<C: Conn>(
    conn: &mut C,
    provider: &str,
    merchant: &str,
    trade_no: &str,
    order_no: &str,
    body_hash: &str,
    reason: &str,
    body: &[u8],
    now: i64,
) -> Result<(), dtx_sql::sqlx::Error> {
    let key = args![now, provider, merchant, trade_no, body_hash];
    if conn.execute(REPEAT_CONFLICT, key).await? > 0 {
        return Ok(());
    }
    let reason = truncate(reason, MAX_REASON);
    let body = &body[..body.len().min(MAX_BODY)];
    let row = args![
        provider, merchant, trade_no, order_no, body_hash, reason, body, now, now
    ];
    match conn.execute(NEW_CONFLICT, row).await {
        // A concurrent repeat inserted it first: counted there.
        Err(e) if dtx_sql::is_unique_violation(&e) => Ok(()),
        other => other.map(drop),
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut cut = text.len().min(max);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}
