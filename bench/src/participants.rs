//! The participant services the bench drives, served in the bench process on port 0.
//!
//! * [`NoopParticipant`]: answers at once without touching a database - what the coordinator
//!   costs on its own. Handler `fail` refuses its Try/Action; handler `hold` holds a saga Action or a
//!   TCC Confirm until the gate opens (the memory test's "participants holding their answers").
//! * [`rows_participant`]: the real SDK participant server with the barrier, whose handlers
//!   write two business rows per branch in the same local transaction; it also answers the
//!   check-backs of the message workload, whose local transactions run on its database.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dtx_proto::auth::{Call, CallVerifier};
use dtx_proto::codec::SizeGuard;
use dtx_proto::limits::MAX_REQUEST_BYTES;
use dtx_proto::v1::participant_server::{Participant, ParticipantServer as WireServer};
use dtx_proto::v1::{
    BranchAction, BranchBatchAnswer, BranchBatchRequest, BranchBatchResponse, BranchRequest,
    BranchResponse, Outcome,
};
use dtx_sdk::barrier::HandlerError;
use dtx_sdk::barrier::Reply;
use dtx_sdk::server::{BranchCall, HandlerFn, ParticipantServer};
use dtx_sdk::sql::{Arg, Conn};
use dtx_sdk::{Backend, sql::sqlx::Pool};
use futures::future::BoxFuture;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::Error;
use crate::security::Security;

/// Handler names the workloads address.
pub const NOOP: &str = "noop";
pub const FAIL: &str = "fail";
pub const HOLD: &str = "hold";
pub const ROWS_TCC: &str = "rows-tcc";
pub const ROWS_SAGA: &str = "rows-saga";
/// The rows participant's check-back handler of the message workload.
pub const CHECK_BACK: &str = "check-back";

/// Answers every call at once (see the module docs for `fail` and `hold`), after checking its
/// call token when auth is on (as the SDK's participant server would).
#[derive(Clone)]
pub struct NoopParticipant {
    gate: watch::Receiver<bool>,
    held: Arc<AtomicU64>,
    calls: Option<CallVerifier>,
}

/// Opens the gate `hold` calls wait at.
pub struct Gate {
    open: watch::Sender<bool>,
    held: Arc<AtomicU64>,
}

impl Gate {
    /// Calls waiting at the gate right now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }

    pub fn close(&self) {
        self.open.send_replace(false);
    }
}

impl NoopParticipant {
    pub fn new(calls: Option<CallVerifier>) -> (Self, Gate) {
        let (open, gate) = watch::channel(false);
        let held = Arc::new(AtomicU64::new(0));
        let gate_handle = Gate {
            open,
            held: held.clone(),
        };
        (NoopParticipant { gate, held, calls }, gate_handle)
    }
}

impl NoopParticipant {
    /// The answer to one checked call: at once, or once the gate opens for a held one.
    async fn answer(&self, request: BranchRequest) -> BranchResponse {
        let first_phase = matches!(request.action(), BranchAction::Try | BranchAction::Action);
        let holds = matches!(
            request.action(),
            BranchAction::Confirm | BranchAction::Action
        );
        if request.handler == HOLD && holds {
            self.held.fetch_add(1, Ordering::Relaxed);
            let mut gate = self.gate.clone();
            let _ = gate.wait_for(|open| *open).await;
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        let outcome = if request.handler == FAIL && first_phase {
            Outcome::Failure
        } else {
            Outcome::Success
        };
        BranchResponse {
            outcome: outcome as i32,
            ..Default::default()
        }
    }
}

#[tonic::async_trait]
impl Participant for NoopParticipant {
    async fn branch(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        if let Some(calls) = &self.calls {
            calls
                .verify_request(request.metadata(), request.get_ref())
                .map_err(|e| Status::unauthenticated(e.0))?;
        }
        Ok(Response::new(self.answer(request.into_inner()).await))
    }

    async fn branch_batch(
        &self,
        request: Request<BranchBatchRequest>,
    ) -> Result<Response<BranchBatchResponse>, Status> {
        let answers = request
            .into_inner()
            .items
            .into_iter()
            .map(|item| async move {
                let request = item.request.unwrap_or_default();
                if let Some(calls) = &self.calls
                    && let Err(e) = calls.verify(&item.call_token, Call::of(&request))
                {
                    return BranchBatchAnswer {
                        code: tonic::Code::Unauthenticated as i32,
                        message: e.0,
                        response: None,
                    };
                }
                BranchBatchAnswer {
                    response: Some(self.answer(request).await),
                    ..Default::default()
                }
            });
        Ok(Response::new(BranchBatchResponse {
            answers: futures::future::join_all(answers).await,
        }))
    }
}

/// Serves the service `make` builds (with the call verifier for its URL, when auth is on) on a
/// fresh loopback port; returns its URL. Concurrent streams are not capped (the memory test
/// holds 10,000 calls open on one connection).
pub async fn serve<S: Participant>(
    make: impl FnOnce(Option<CallVerifier>) -> SizeGuard<WireServer<S>>,
    security: &Security,
) -> Result<String, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("{}://{}", security.scheme(), listener.local_addr()?);
    let service = make(security.verifier(&url));
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &security.tls {
        builder = builder
            .tls_config(tls.participant())
            .map_err(|e| Error::Setup(format!("participant TLS: {e}")))?;
    }
    tokio::spawn(
        builder
            .max_concurrent_streams(Some(1 << 20))
            // As the coordinator's server: room for a burst of small requests.
            .initial_connection_window_size(Some(16 << 20))
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    Ok(url)
}

pub async fn serve_noop(security: &Security) -> Result<(String, Gate), Error> {
    let mut gate = None;
    let make = |calls| {
        let (participant, opener) = NoopParticipant::new(calls);
        gate = Some(opener);
        SizeGuard::new(WireServer::new(participant).max_decoding_message_size(MAX_REQUEST_BYTES))
    };
    let url = serve(make, security).await?;
    Ok((url, gate.expect("the service was made")))
}

/// The business table of [`rows_participant`].
pub const ROWS_TABLE: &str = "CREATE TABLE IF NOT EXISTS dtx_bench_rows (\
    xid VARCHAR(128) NOT NULL, branch VARCHAR(64) NOT NULL, n INT NOT NULL, \
    state VARCHAR(16) NOT NULL, PRIMARY KEY (xid, branch, n))";

/// Try/Action insert two rows; Confirm marks them; Cancel/Compensate deletes them - each in
/// the barrier's local transaction.
pub fn rows_participant<DB: Backend>(pool: Pool<DB>) -> ParticipantServer<DB> {
    const INSERT: &str = "INSERT INTO dtx_bench_rows (xid, branch, n, state) \
        VALUES (?, ?, 1, 'tried'), (?, ?, 2, 'tried')";
    const CONFIRM: &str =
        "UPDATE dtx_bench_rows SET state = 'confirmed' WHERE xid = ? AND branch = ?";
    const DELETE: &str = "DELETE FROM dtx_bench_rows WHERE xid = ? AND branch = ?";
    ParticipantServer::new(pool)
        .tcc(
            ROWS_TCC,
            write::<DB::Conn>(INSERT),
            write::<DB::Conn>(CONFIRM),
            write::<DB::Conn>(DELETE),
        )
        .saga(
            ROWS_SAGA,
            write::<DB::Conn>(INSERT),
            write::<DB::Conn>(DELETE),
        )
        .message_check_back(CHECK_BACK)
}

/// A handler running `sql`, whose placeholders are (xid, branch id) pairs.
fn write<C: Conn>(sql: &'static str) -> impl HandlerFn<C> {
    let pairs = sql.matches('?').count() / 2;
    move |conn: &mut C, call: BranchCall| -> BoxFuture<'_, Result<Reply, HandlerError>> {
        Box::pin(async move {
            let one = [Arg::from(&call.xid), Arg::from(&call.branch_id)];
            let args: Vec<Arg> = one.iter().copied().cycle().take(2 * pairs).collect();
            conn.execute(sql, &args).await?;
            Ok(Reply::ok())
        })
    }
}
