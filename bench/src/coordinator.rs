//! The coordinator under test, as a separate process (`dtx-bench coordinator <flags>` runs the
//! real server code with the coordinator's own flags), so its resident memory is its own and
//! can be read from `/proc`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use dtx_sdk::client::{ClientTls, Coordinator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use crate::Error;
use crate::security::Security;
use crate::tls::BenchTls;

/// A running coordinator process; killed if dropped without [`CoordinatorProcess::stop`].
pub struct CoordinatorProcess {
    pub url: String,
    client_tls: Option<ClientTls>,
    token: Option<String>,
    scrape_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    metrics: SocketAddr,
    child: Child,
}

/// The store's own counters, scraped from the coordinator's metrics endpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreCounters {
    pub commits: u64,
    pub writes: u64,
}

async fn free_addr() -> Result<SocketAddr, Error> {
    Ok(TcpListener::bind("127.0.0.1:0").await?.local_addr()?)
}

impl CoordinatorProcess {
    /// Starts this executable's `coordinator` mode on `store` with default settings and the
    /// sweep's `security`.
    pub async fn start(store: &str, security: &Security) -> Result<Self, Error> {
        let tls = security.tls.as_ref();
        let (listen, metrics) = (free_addr().await?, free_addr().await?);
        let child = Command::new(std::env::current_exe()?)
            .args(["coordinator", "--store", store])
            .args(security.coordinator_flags())
            .args(["--listen", &listen.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .env(
                "RUST_LOG",
                std::env::var("DTX_BENCH_COORDINATOR_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let process = CoordinatorProcess {
            url: format!("{}://{listen}", security.scheme()),
            client_tls: tls.map(BenchTls::client),
            token: security.token().map(String::from),
            scrape_tls: tls.map(BenchTls::scraper),
            metrics,
            child,
        };
        process.wait_until_serving().await?;
        Ok(process)
    }

    async fn wait_until_serving(&self) -> Result<(), Error> {
        for _ in 0..200 {
            if let Ok(client) = self.client().await {
                // Serving once an RPC gets an answer (NOT_FOUND is one).
                if client
                    .get("probe")
                    .await
                    .is_err_and(|e| !matches!(e, dtx_sdk::Error::Transport(_)))
                {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::Setup(format!(
            "coordinator at {} did not start",
            self.url
        )))
    }

    /// A client of it (over mTLS if it serves TLS, with the token if auth is on).
    pub async fn client(&self) -> Result<Coordinator, dtx_sdk::Error> {
        let client = match &self.client_tls {
            Some(tls) => Coordinator::connect_tls(&self.url, tls.clone()).await?,
            None => Coordinator::connect(&self.url).await?,
        };
        match &self.token {
            Some(token) => client.with_token(token),
            None => Ok(client),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Store commits and writes so far.
    pub async fn counters(&self) -> Result<StoreCounters, Error> {
        let socket = TcpStream::connect(self.metrics).await?;
        // The metrics listener serves TLS too when the coordinator does.
        let text = match &self.scrape_tls {
            None => scrape(socket).await?,
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
                    .map_err(|e| Error::Setup(e.to_string()))?;
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                scrape(connector.connect(name, socket).await?).await?
            }
        };
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
                .ok_or_else(|| Error::Setup(format!("metric {name} missing")))
        };
        Ok(StoreCounters {
            commits: value("dtx_store_commits_total ")?,
            writes: value("dtx_store_writes_total ")?,
        })
    }

    /// Peak resident memory since start or the last [`reset_peak`](Self::reset_peak), in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64, Error> {
        proc_status_kib(self.pid(), "VmHWM:")
    }

    pub fn rss_kib(&self) -> Result<u64, Error> {
        proc_status_kib(self.pid(), "VmRSS:")
    }

    /// Resets the peak to the current resident size (Linux `clear_refs` 5), so a later peak
    /// belongs to what ran in between.
    pub fn reset_peak(&self) -> Result<(), Error> {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5")?;
        Ok(())
    }

    /// SIGTERM and wait (graceful: drivers hand their work back to the store).
    pub async fn stop(mut self) -> Result<(), Error> {
        let pid = self.pid().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()?;
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(status) => {
                status?;
            }
            Err(_) => self.child.start_kill()?,
        }
        Ok(())
    }
}

/// `GET /metrics` on a connection: the answer's text.
async fn scrape(
    mut socket: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
) -> std::io::Result<String> {
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    socket.read_to_string(&mut text).await?;
    Ok(text)
}

fn proc_status_kib(pid: u32, field: &str) -> Result<u64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| Error::Setup(format!("{field} missing from /proc/{pid}/status")))
}

/// What `dtx-bench coordinator <flags>` runs: the coordinator binary's own `main`.
pub fn serve(args: impl Iterator<Item = String>) -> Result<(), Error> {
    use clap::Parser;
    let config = dtx_coordinator::config::Config::parse_from(args);
    // Written when the coordinator stops (SIGTERM): the heap at its peak, by allocation site.
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::builder()
        .file_name(format!("dhat-heap-{}.json", std::process::id()))
        .build();
    tokio::runtime::Runtime::new()?
        .block_on(dtx_coordinator::server::main(config))
        .map_err(|e| Error::Setup(format!("coordinator: {e}")))
}
