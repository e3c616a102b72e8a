//! Any Coordinator or Admin RPC by name, with a proto3 JSON body, over gRPC or HTTP/JSON: for
//! the tests that sweep every RPC (who may call, why a call failed).

use dtx_proto::http::Problem;
use dtx_proto::v1::admin_client::AdminClient;
use dtx_proto::v1::coordinator_client::CoordinatorClient;

/// Calls `rpc` (`dtx.v1.Coordinator/Begin`) over gRPC at `url` with `body` decoded into its
/// request type, and `token` as the bearer token: OK, or the status.
pub async fn grpc(
    url: &str,
    rpc: &str,
    body: serde_json::Value,
    token: Option<&str>,
) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("a gRPC URL")
        .connect()
        .await
        .expect("connect to the coordinator");
    let (mut c, mut a) = (
        CoordinatorClient::new(channel.clone()),
        AdminClient::new(channel),
    );
    macro_rules! call {
        ($client:ident . $method:ident) => {{
            let mut request = tonic::Request::new(
                serde_json::from_value(body).expect("the body is the request in proto3 JSON"),
            );
            if let Some(token) = token {
                request.metadata_mut().insert(
                    "authorization",
                    dtx_proto::auth::bearer_value(token).expect("a token header"),
                );
            }
            $client.$method(request).await.map(|_| ())
        }};
    }
    match rpc.rsplit_once('/').expect("Service/Method") {
        ("dtx.v1.Coordinator", "Begin") => call!(c.begin),
        ("dtx.v1.Coordinator", "RegisterBranch") => call!(c.register_branch),
        ("dtx.v1.Coordinator", "Commit") => call!(c.commit),
        ("dtx.v1.Coordinator", "Rollback") => call!(c.rollback),
        ("dtx.v1.Coordinator", "SubmitSaga") => call!(c.submit_saga),
        ("dtx.v1.Coordinator", "Get") => call!(c.get),
        ("dtx.v1.Coordinator", "Wait") => call!(c.wait),
        ("dtx.v1.Coordinator", "Resume") => call!(c.resume),
        ("dtx.v1.Coordinator", "PrepareMessage") => call!(c.prepare_message),
        ("dtx.v1.Coordinator", "SubmitMessage") => call!(c.submit_message),
        ("dtx.v1.Coordinator", "AbortMessage") => call!(c.abort_message),
        ("dtx.v1.Admin", "ListTransactions") => call!(a.list_transactions),
        ("dtx.v1.Admin", "DescribeTransaction") => call!(a.describe_transaction),
        ("dtx.v1.Admin", "Stats") => call!(a.stats),
        ("dtx.v1.Admin", "Resume") => call!(a.resume),
        ("dtx.v1.Admin", "ForceRollback") => call!(a.force_rollback),
        ("dtx.v1.Admin", "RetryNow") => call!(a.retry_now),
        _ => panic!("no call for {rpc}"),
    }
}

/// Calls `rpc` over HTTP/JSON at `base` (`http://host:port`): OK, or the problem body.
pub async fn http(
    base: &str,
    rpc: &str,
    body: serde_json::Value,
    token: Option<&str>,
) -> Result<(), Problem> {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/{rpc}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.expect("an HTTP answer");
    if answer.status().is_success() {
        return Ok(());
    }
    let bytes = answer.bytes().await.expect("the problem body");
    Err(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "not a problem body ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    }))
}
