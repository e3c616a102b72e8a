//! A NATS server with JetStream of a test's own (the `nats-server` binary on a free port, its
//! store in a temporary directory), so a test may SIGKILL and restart the broker without
//! touching the machine's shared one. Killed when dropped.

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::db::in_ci;
use crate::net::free_addr;

pub struct NatsServer {
    binary: PathBuf,
    addr: std::net::SocketAddr,
    store: tempfile::TempDir,
    child: Option<Child>,
    /// Times the server was started.
    pub starts: u32,
}

/// The `nats-server` binary: `DTX_TEST_NATS_SERVER`, else the first on `PATH` or in `/usr/sbin`.
fn binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("DTX_TEST_NATS_SERVER") {
        return Some(path.into());
    }
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
}

impl NatsServer {
    /// A running server, or `None` (the test skipped with a message) when there is no
    /// `nats-server` outside CI. Under `CI=true` a missing binary fails the test.
    pub async fn start() -> Option<Self> {
        let Some(binary) = binary() else {
            let message = "no nats-server binary (set DTX_TEST_NATS_SERVER)";
            assert!(
                !in_ci(),
                "{message} (CI=true: NATS tests must not be skipped)"
            );
            eprintln!("SKIPPED: {message}");
            return None;
        };
        let mut server = NatsServer {
            binary,
            addr: free_addr().await,
            store: tempfile::tempdir().expect("a store directory"),
            child: None,
            starts: 0,
        };
        server.run().await;
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// SIGKILLs the server (its store stays) and starts it again on the same port.
    pub async fn restart(&mut self, down_for: Duration) {
        self.kill().await;
        tokio::time::sleep(down_for).await;
        self.run().await;
    }

    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("SIGKILL nats-server");
        }
    }

    /// Starts the server and waits until it takes connections (10 s at most).
    async fn run(&mut self) {
        let child = Command::new(&self.binary)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.addr.port().to_string(),
                "-js",
            ])
            .arg("-sd")
            .arg(self.store.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        self.starts += 1;
        for _ in 0..100 {
            // The server restores JetStream (streams, consumers) before it listens.
            if let Ok(client) = async_nats::connect(self.url()).await
                && client.flush().await.is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "nats-server on {} did not start JetStream in 10 s",
            self.addr
        );
    }
}
