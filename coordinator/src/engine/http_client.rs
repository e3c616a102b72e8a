//! The coordinator's one HTTP/1.1 client (http and https: rustls on the ring provider, the
//! system's roots), for alert webhooks and HTTP/JSON participants.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use dtx_proto::tls::ClientTls;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::domain::allow::Allowlist;

pub type Client =
    hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<Connector>, Full<Bytes>>;

/// TCP connections to addresses the allowlist allows: the name is resolved here and every
/// address checked ([`Allowlist::check_host_addresses`]), so the address connected to is the
/// address checked (no second resolution for a rebinding DNS server to answer differently).
pub type Connector = HttpConnector<AllowedResolver>;

/// Resolves names for [`Connector`], refusing any that resolve outside the allowlist.
#[derive(Clone)]
pub struct AllowedResolver {
    allow: Arc<Allowlist>,
}

impl tower::Service<Name> for AllowedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let allow = self.allow.clone();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let ips: Vec<_> = addrs.iter().map(SocketAddr::ip).collect();
            allow
                .check_host_addresses(name.as_str(), &ips)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
            Ok(addrs.into_iter())
        })
    }
}

/// A plain TCP connector that resolves through the allowlist (TLS goes on top of it).
pub fn connector(allow: Arc<Allowlist>) -> Connector {
    let mut http = HttpConnector::new_with_resolver(AllowedResolver { allow });
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(3)));
    http
}

/// Largest answer body read; a longer one is an error (an HTTP participant's answer is a
/// `BranchResponse`, whose result is at most 64 KiB before base64).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// The client of alert webhooks: the system's roots, the allowlist's addresses.
pub fn client(allow: Arc<Allowlist>) -> std::io::Result<Client> {
    // Installing fails only when a provider is already installed: either one serves.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector(allow));
    Ok(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https))
}

/// The client of HTTP/JSON participants: `tls`'s roots and client certificate (the system's
/// roots when `None`; `https://` targets are refused before a call without roots anyway).
pub fn client_with(tls: Option<&ClientTls>, allow: Arc<Allowlist>) -> std::io::Result<Client> {
    let Some(tls) = tls else {
        return client(allow);
    };
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &tls.ca_pem {
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| invalid(format!("the participant CA: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| invalid(format!("the participant CA: {e}")))?;
        }
    }
    if tls.system_roots {
        for cert in rustls_native_certs::load_native_certs().certs {
            roots.add(cert).ok();
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots);
    let config = match &tls.identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("the participant client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| invalid(format!("the participant client key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(format!("the participant client certificate: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector(allow));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    use tower::ServiceExt;

    /// The connection's own check: a name allowed by a name rule that resolves to loopback
    /// (no loopback network allowed) is not connected to; with the network allowed it is.
    #[tokio::test]
    async fn the_connection_resolves_through_the_allowlist() {
        let name_only = Arc::new(Allowlist::parse(&["http://localhost"]).unwrap());
        let resolver = AllowedResolver { allow: name_only };
        let refused = resolver
            .oneshot(Name::from_str("localhost").unwrap())
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(
            refused.to_string().contains("outside the rules"),
            "{refused}"
        );

        let resolver = AllowedResolver {
            allow: Arc::new(Allowlist::default()),
        };
        let addrs: Vec<_> = resolver
            .oneshot(Name::from_str("localhost").unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
