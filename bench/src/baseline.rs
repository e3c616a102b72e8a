//! The two baselines every workload is measured against at the same client count, in the
//! same run: the raw single-insert commit (what one durable write costs) and the no-op unary
//! tonic call (what one gRPC round trip costs, client and server both in this process, as
//! they are for the bench's clients and participants). Together they give each workload's
//! CPU floor for today's protocol: `calls × no-op call + writes × raw insert`.

use std::time::Duration;

use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{BranchAction, BranchRequest};
use dtx_sdk::sql::sqlx;

use crate::database::{RawInserts, Store};
use crate::load::{self, Measured};
use crate::participants::NOOP;
use crate::{Error, MAX_POOL};

/// The raw single-insert rate at `clients` (pools capped at [`MAX_POOL`] connections).
pub async fn raw_inserts(
    store: Store,
    url: &str,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> Result<Measured, Error> {
    macro_rules! measure {
        ($db:ty) => {{
            let raw = RawInserts::<$db>::open(url, clients.min(MAX_POOL)).await?;
            load::closed_loop(clients, warmup, window, move || {
                let raw = raw.clone();
                async move { raw.insert_one().await }
            })
            .await
        }};
    }
    Ok(match store {
        Store::Sqlite => measure!(sqlx::Sqlite),
        Store::Postgres => measure!(sqlx::Postgres),
        Store::Mysql => measure!(sqlx::MySql),
    })
}

/// No-op unary calls to the no-op participant at `target` over one HTTP/2 connection (as the
/// SDK and the coordinator each hold one per peer), with a request the size of a bench
/// branch call.
pub async fn noop_calls(
    target: &str,
    clients: usize,
    warmup: Duration,
    window: Duration,
) -> Result<Measured, Error> {
    let channel = tonic::transport::Endpoint::from_shared(target.to_string())
        .map_err(|e| Error::Setup(format!("{target}: {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| Error::Setup(format!("{target}: {e}")))?;
    let client = ParticipantClient::new(channel);
    Ok(load::closed_loop(clients, warmup, window, move || {
        let mut client = client.clone();
        async move {
            let request = BranchRequest {
                xid: uuid::Uuid::new_v4().to_string(),
                branch_id: "b1".to_string(),
                action: BranchAction::Try as i32,
                handler: NOOP.to_string(),
                payload: b"bench".to_vec(),
                headers: Default::default(),
            };
            client
                .branch(request)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await)
}
