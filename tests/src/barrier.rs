//! Direct barrier calls that carry their request (hashed), the way a service that embeds the
//! barrier in its own transaction checks repeated Trys; the ledger effect is the one the bank's
//! `transfer`/`debit` handlers have (account `acct`, amount 10).

use dtx_sdk::barrier::{self, Action, Answer, BranchKey, Reply};
use dtx_sdk::idempotency::RequestHash;
use dtx_sql::Backend;
use dtx_sql::sqlx::Pool;

use crate::ledger;
use crate::participant::Behave;

/// (balance, held) change of one executed `action` of amount 10.
pub fn effect(action: Action) -> (i64, i64) {
    match action {
        Action::Try => (-10, 10),
        Action::Confirm => (0, -10),
        Action::Cancel => (10, -10),
        Action::Action => (-10, 0),
        Action::Compensate => (10, 0),
        Action::CheckBack | Action::Message => (0, 0),
    }
}

/// One barrier call in its own transaction (see [`crate::participant::direct`]), with
/// `request` hashed into the key when given.
pub async fn call<DB: Backend>(
    pool: &Pool<DB>,
    xid: &str,
    branch: &str,
    action: Action,
    behave: Behave,
    tag: &str,
    request: Option<&[u8]>,
) -> Result<Answer, dtx_sdk::Error> {
    let mut key = BranchKey::new(xid, branch, action)?;
    if let Some(request) = request {
        key = key.with_request(RequestHash::of_bytes(request));
    }
    let (xid_owned, branch_owned, tag) = (xid.to_string(), branch.to_string(), tag.to_string());
    let mut tx = DB::begin(pool).await?;
    let answer = barrier::call(DB::conn(&mut tx), key, move |conn| {
        Box::pin(async move {
            let (delta, held) = effect(action);
            ledger::apply(
                conn,
                "acct",
                delta,
                held,
                &xid_owned,
                &branch_owned,
                action.as_str(),
            )
            .await?;
            match behave {
                Behave::Ok => Ok(Reply::Success(format!("{action}:{tag}").into_bytes())),
                Behave::Refuse => Ok(Reply::refuse(format!("refused:{tag}"))),
                Behave::Error => Err(format!("error:{tag}").into()),
            }
        })
    })
    .await;
    match answer {
        Ok(answer) => {
            tx.commit().await?;
            Ok(answer)
        }
        Err(e) => {
            tx.rollback().await.ok();
            Err(e)
        }
    }
}
