//! A real HTTP receiver for the coordinator's alert webhooks: it records every request (the
//! ones it never answers too) and can hang, to catch a coordinator mid-delivery.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use tokio::net::TcpListener;

/// One request as the receiver got it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The `dtx-event-id` header.
    pub id: String,
    pub signature: Option<String>,
    pub body: String,
    pub event: serde_json::Value,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    hang: AtomicBool,
}

/// The receiver; stops serving when dropped.
pub struct Receiver {
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// On a fresh loopback port.
    pub async fn start() -> Receiver {
        Self::start_on(crate::net::free_addr().await).await
    }

    /// On `addr` (a webhook URL configured before the receiver came up).
    pub async fn start_on(addr: SocketAddr) -> Receiver {
        let listener = TcpListener::bind(addr).await.expect("bind the receiver");
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/alerts", post(receive))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Receiver {
            url: url_of(addr),
            shared,
            task,
        }
    }

    /// On a fresh loopback port over TLS with `tls` (requiring client certificates when it has
    /// a client CA): its URL is `https://`. Serves until the process ends.
    pub async fn start_tls(tls: Arc<dtx_coordinator::tls::ServerTls>) -> Receiver {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/alerts", post(receive))
            .with_state(shared.clone());
        let addr = crate::net::serve_tls(app, tls).await;
        Receiver {
            url: url_of(addr).replace("http://", "https://"),
            shared,
            task: tokio::spawn(async {}),
        }
    }

    /// While set, requests are recorded and never answered.
    pub fn hang(&self, hang: bool) {
        self.shared.hang.store(hang, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// The distinct event ids received per xid.
    pub fn ids_by_xid(&self, kind: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut by_xid: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for r in self.received() {
            if r.event["type"] == kind {
                let xid = r.event["xid"].as_str().unwrap_or_default().to_string();
                by_xid.entry(xid).or_default().insert(r.id.clone());
            }
        }
        by_xid
    }

    /// Waits (up to `within`) until `done` holds of what was received; panics with it if not.
    pub async fn until(
        &self,
        within: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("the receiver did not get what was expected in {within:?}: {received:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The webhook URL of a receiver on `addr`.
pub fn url_of(addr: SocketAddr) -> String {
    format!("http://{addr}/alerts")
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let event = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    shared.received.lock().unwrap().push(Received {
        id: header("dtx-event-id").unwrap_or_default(),
        signature: header("dtx-signature"),
        body,
        event,
    });
    if shared.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    StatusCode::NO_CONTENT
}
