//! The coordinator's one HTTP/1.1 client (http and https: rustls on the ring provider, the
//! system's roots), for alert webhooks and HTTP/JSON participants.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioExecutor;

pub type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Largest answer body read; a longer one is an error (an HTTP participant's answer is a
/// `BranchResponse`, whose result is at most 64 KiB before base64).
const MAX_ANSWER_BYTES: usize = 1 << 20;

pub fn client() -> std::io::Result<Client> {
    // Installing fails only when a provider is already installed: either one serves.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https))
}

/// POSTs the JSON `body` to `url` with `headers`, all within `timeout`: the answer's status
/// and body, or why there is none.
pub async fn post_json(
    client: &Client,
    url: &str,
    headers: &[(&str, String)],
    body: Bytes,
    timeout: Duration,
) -> Result<(http::StatusCode, Bytes), String> {
    let mut request = http::Request::post(url)
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("dtx-coordinator/", env!("CARGO_PKG_VERSION")),
        );
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request = request
        .body(Full::new(body))
        // Without the error's text: it would repeat the URL, which often carries a token.
        .map_err(|_| "not a valid http(s) URL".to_string())?;
    let exchange = async {
        let answer = client.request(request).await.map_err(|e| e.to_string())?;
        let status = answer.status();
        let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
}
