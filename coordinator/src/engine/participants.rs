//! Calls to participant services, reduced to what the engine needs to know.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::time::Duration;

use dtx_proto::answer::Answer;
use dtx_proto::v1::participant_client::ParticipantClient;
use dtx_proto::v1::{BranchAction, BranchRequest};
use tonic::transport::{Channel, Endpoint};

use crate::domain::job::CallOutcome;

/// One branch call.
#[derive(Debug, Clone)]
pub struct Call {
    pub target: String,
    pub xid: String,
    pub branch_id: String,
    pub action: BranchAction,
    pub handler: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// Connections to participants, one lazily connected HTTP/2 channel per target (channels
/// multiplex concurrent calls, so one per target is enough).
#[derive(Default)]
pub struct Participants {
    clients: RwLock<HashMap<String, ParticipantClient<Channel>>>,
}

impl Participants {
    fn client(&self, target: &str) -> Result<ParticipantClient<Channel>, String> {
        if let Some(client) = self.clients.read().expect("participants lock").get(target) {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::from_shared(target.to_string())
            .map_err(|e| format!("target {target:?} is not a valid endpoint: {e}"))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(false);
        let client = ParticipantClient::new(endpoint.connect_lazy());
        self.clients
            .write()
            .expect("participants lock")
            .insert(target.to_string(), client.clone());
        Ok(client)
    }

    /// Makes one call, bounded by its timeout.
    pub async fn call(&self, call: Call) -> CallOutcome {
        let mut client = match self.client(&call.target) {
            Ok(client) => client,
            Err(e) => return CallOutcome::NotSent(e),
        };
        let mut request = tonic::Request::new(BranchRequest {
            xid: call.xid,
            branch_id: call.branch_id,
            action: call.action as i32,
            handler: call.handler,
            payload: call.payload,
            headers: call.headers,
        });
        request.set_timeout(call.timeout);
        // The grpc-timeout header asks the server to give up; this bounds our own wait too,
        // including connection setup.
        match tokio::time::timeout(call.timeout, client.branch(request)).await {
            Err(_) => {
                CallOutcome::Unknown(format!("no answer within {} ms", call.timeout.as_millis()))
            }
            Ok(result) => match Answer::of_result(result) {
                Answer::Success(result) => CallOutcome::Success(result),
                Answer::Refused(reason) => CallOutcome::Failure(reason),
                Answer::Unknown(seen) => CallOutcome::Unknown(seen),
            },
        }
    }
}
