//! Brokers of a test's own - a NATS server with JetStream, or a RabbitMQ node - on free ports
//! with their stores in a temporary directory, so a test may SIGKILL and restart the broker
//! without touching the machine's shared ones. Killed when dropped.

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::db::in_ci;
use crate::net::free_addr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `nats-server -js`, file storage.
    Nats,
    /// A RabbitMQ node (durable queues, persistent messages survive its restart).
    RabbitMq,
}

pub struct OwnBroker {
    kind: Kind,
    binary: PathBuf,
    addr: std::net::SocketAddr,
    /// RabbitMQ's Erlang distribution port and node name.
    dist_port: u16,
    node: String,
    store: tempfile::TempDir,
    child: Option<Child>,
    /// Times the broker was started.
    pub starts: u32,
}

/// The broker's binary: `DTX_TEST_NATS_SERVER` / `DTX_TEST_RABBITMQ_SERVER`, else the usual
/// places.
fn binary(kind: Kind) -> Option<PathBuf> {
    let (var, name, places): (_, _, &[&str]) = match kind {
        Kind::Nats => (
            "DTX_TEST_NATS_SERVER",
            "nats-server",
            &["/usr/sbin", "/usr/local/sbin"],
        ),
        Kind::RabbitMq => (
            "DTX_TEST_RABBITMQ_SERVER",
            "rabbitmq-server",
            // The script itself: /usr/sbin's wrapper would switch to the rabbitmq user.
            &["/usr/lib/rabbitmq/bin"],
        ),
    };
    if let Ok(path) = std::env::var(var) {
        return Some(path.into());
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let on_path = std::env::split_paths(&path).filter(|_| kind == Kind::Nats);
    places
        .iter()
        .map(PathBuf::from)
        .chain(on_path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

impl OwnBroker {
    /// A running broker, or `None` (the test skipped with a message) when its binary is
    /// missing outside CI. Under `CI=true` a missing binary fails the test.
    pub async fn start(kind: Kind) -> Option<Self> {
        let Some(binary) = binary(kind) else {
            let message = format!("no {kind:?} server binary to start");
            assert!(
                !in_ci(),
                "{message} (CI=true: broker tests must not be skipped)"
            );
            eprintln!("SKIPPED: {message}");
            return None;
        };
        let mut broker = OwnBroker {
            kind,
            binary,
            addr: free_addr().await,
            dist_port: free_addr().await.port(),
            node: format!(
                "dtx{}@localhost",
                &uuid::Uuid::new_v4().simple().to_string()[..10]
            ),
            store: tempfile::tempdir().expect("a store directory"),
            child: None,
            starts: 0,
        };
        broker.run().await;
        Some(broker)
    }

    pub fn url(&self) -> String {
        match self.kind {
            Kind::Nats => format!("nats://{}", self.addr),
            Kind::RabbitMq => format!("amqp://guest:guest@{}/%2f", self.addr),
        }
    }

    /// SIGKILLs the broker (its store stays) and starts it again on the same port.
    pub async fn restart(&mut self, down_for: Duration) {
        self.kill().await;
        tokio::time::sleep(down_for).await;
        self.run().await;
    }

    /// SIGKILLs the broker's process group (RabbitMQ's script runs the Erlang VM in it).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let group = format!("-{pid}");
                let _ = Command::new("kill")
                    .args(["-9", "--", &group])
                    .status()
                    .await;
            }
            child.kill().await.ok();
            child.wait().await.ok();
        }
    }

    /// Starts the broker and waits until it takes connections (60 s at most).
    async fn run(&mut self) {
        let mut command = Command::new(&self.binary);
        let dir = self.store.path();
        match self.kind {
            Kind::Nats => {
                command
                    .args([
                        "-a",
                        "127.0.0.1",
                        "-p",
                        &self.addr.port().to_string(),
                        "-js",
                    ])
                    .arg("-sd")
                    .arg(dir);
            }
            Kind::RabbitMq => {
                std::fs::write(dir.join("plugins"), "[].").expect("the plugins file");
                command
                    .env("RABBITMQ_NODENAME", &self.node)
                    .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                    .env("RABBITMQ_NODE_PORT", self.addr.port().to_string())
                    .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
                    .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                    .env("RABBITMQ_LOG_BASE", dir.join("log"))
                    .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("plugins"))
                    .env("RABBITMQ_CONFIG_FILE", dir.join("no-config"))
                    .env("RABBITMQ_PID_FILE", dir.join("pid"));
            }
        }
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", self.binary));
        self.child = Some(child);
        self.starts += 1;
        for _ in 0..600 {
            if self.answers().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{:?} on {} did not start in 60 s", self.kind, self.addr);
    }

    /// Whether a client can connect now. NATS restores JetStream before it listens; RabbitMQ
    /// opens its port before it takes AMQP connections, so one is made.
    async fn answers(&self) -> bool {
        match self.kind {
            Kind::Nats => match async_nats::connect(self.url()).await {
                Ok(client) => client.flush().await.is_ok(),
                Err(_) => false,
            },
            Kind::RabbitMq => {
                let properties = lapin::ConnectionProperties::default();
                let url = self.url();
                let connect = lapin::Connection::connect(&url, properties);
                match tokio::time::timeout(Duration::from_secs(2), connect).await {
                    Ok(Ok(connection)) => {
                        connection.close(200, "ready").await.ok();
                        true
                    }
                    _ => false,
                }
            }
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let group = format!("-{pid}");
            let _ = std::process::Command::new("kill")
                .args(["-9", "--", &group])
                .status();
        }
    }
}
