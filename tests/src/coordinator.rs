//! Real coordinators for tests: in-process (a real gRPC server on port 0, fast to start) or as
//! a separate process of the coordinator binary, which tests SIGKILL and restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use clap::Parser;
use dtx_coordinator::config::Config;
use dtx_sdk::client::{ClientTls, Coordinator};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::net::free_addr;

/// Settings every test coordinator gets, short leases and polls so takeovers happen within a
/// test: each flag with its value, then its earlier spelling with the same value.
pub const FAST: [[&str; 4]; 3] = [
    ["--lease", "1s", "--lease-ms", "1000"],
    ["--poll", "100ms", "--poll-ms", "100"],
    ["--shutdown-grace", "500ms", "--shutdown-grace-ms", "500"],
];

/// [`FAST`] (except the flags `extra` sets itself, in either spelling) followed by `extra`. A
/// coordinator process gets the earlier spellings (`earlier`), which every build accepts: the
/// chaos harness runs binaries built before the current ones existed.
fn with_fast<'a>(extra: &[&'a str], earlier: bool) -> Vec<&'a str> {
    let mut args: Vec<&str> = FAST
        .iter()
        .filter(|[flag, _, old, _]| !extra.contains(flag) && !extra.contains(old))
        .flat_map(|[flag, value, old, old_value]| match earlier {
            true => [*old, *old_value],
            false => [*flag, *value],
        })
        .collect();
    args.extend_from_slice(extra);
    args
}

fn config(store: &str, extra: &[&str]) -> Config {
    let mut args = vec!["coordinator", "--store", store, "--listen", "127.0.0.1:0"];
    args.extend(with_fast(extra, false));
    Config::try_parse_from(args).expect("test coordinator flags")
}

/// A coordinator running in this process.
pub struct InProcess {
    pub url: String,
    /// How clients reach it over TLS (`None`: plain text).
    pub tls: Option<ClientTls>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl InProcess {
    /// Starts a coordinator on `store` (a database URL) with [`FAST`] settings plus `extra` flags.
    pub async fn start(store: &str, extra: &[&str]) -> InProcess {
        Self::start_with_tls(store, extra, None).await
    }

    /// Starts one whose `extra` flags turn TLS on (`--tls-cert` ...), reached with `tls`.
    pub async fn start_with_tls(store: &str, extra: &[&str], tls: Option<ClientTls>) -> InProcess {
        let config = config(store, extra);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            dtx_coordinator::server::run(config, listener, async {
                stopped.await.ok();
            })
            .await
            .expect("coordinator");
        });
        wait_until_serving(&url, tls.as_ref()).await;
        InProcess {
            url,
            tls,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn client(&self) -> Coordinator {
        connect(&self.url, self.tls.as_ref())
            .await
            .expect("connect to coordinator")
    }

    /// Graceful stop (drivers hand their transactions back to the store).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
    }
}

/// A coordinator process (the real binary); killed when dropped.
pub struct Process {
    pub url: String,
    pub addr: SocketAddr,
    /// How clients reach it over TLS (`None`: plain text).
    pub tls: Option<ClientTls>,
    child: Child,
}

impl Process {
    /// Starts `bin` (pass `env!("CARGO_BIN_EXE_test-coordinator")`) on `store`.
    pub async fn start(bin: &str, store: &str, extra: &[&str]) -> Process {
        Self::start_on(bin, store, free_addr().await, extra).await
    }

    /// Starts it with its wall clock shifted by `skew` (a libfaketime offset such as `"+30s"`).
    pub async fn start_skewed(bin: &str, store: &str, extra: &[&str], skew: &str) -> Process {
        Self::start_with(bin, store, free_addr().await, extra, Some(skew)).await
    }

    /// Starts it on a given address (to restart "the same" coordinator).
    pub async fn start_on(bin: &str, store: &str, addr: SocketAddr, extra: &[&str]) -> Process {
        Self::start_with(bin, store, addr, extra, None).await
    }

    /// Starts it on a given address, its wall clock shifted by `skew` (a libfaketime offset
    /// such as `"+30s"`; `None`: the host's clock).
    pub async fn start_with(
        bin: &str,
        store: &str,
        addr: SocketAddr,
        extra: &[&str],
        skew: Option<&str>,
    ) -> Process {
        Self::spawn(bin, store, addr, extra, skew, None, None).await
    }

    /// [`Process::start_with`] for a coordinator whose `extra` flags turn TLS on, reached with
    /// `tls`.
    pub async fn start_with_tls(
        bin: &str,
        store: &str,
        addr: SocketAddr,
        extra: &[&str],
        skew: Option<&str>,
        tls: ClientTls,
    ) -> Process {
        Self::spawn(bin, store, addr, extra, skew, None, Some(tls)).await
    }

    /// Starts it allowed to open at most `open_files` file descriptors (`ulimit -n`, soft and
    /// hard), as on a host with a low limit.
    pub async fn start_with_open_files(
        bin: &str,
        store: &str,
        extra: &[&str],
        open_files: u64,
    ) -> Process {
        Self::spawn(
            bin,
            store,
            free_addr().await,
            extra,
            None,
            Some(open_files),
            None,
        )
        .await
    }

    async fn spawn(
        bin: &str,
        store: &str,
        addr: SocketAddr,
        extra: &[&str],
        skew: Option<&str>,
        open_files: Option<u64>,
        tls: Option<ClientTls>,
    ) -> Process {
        let listen = addr.to_string();
        let mut args = vec!["--store", store, "--listen", listen.as_str()];
        args.extend(with_fast(extra, true));
        let log = std::env::var("DTX_TEST_COORDINATOR_LOG").ok();
        let mut command = match open_files {
            // `exec` keeps the pid: signals reach the coordinator itself.
            Some(n) => {
                let mut c = Command::new("bash");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
            None => Command::new(PathBuf::from(bin)),
        };
        if let Some(offset) = skew {
            // libfaketime preloaded into the coordinator itself (not the `faketime` wrapper,
            // which would stand between the SIGKILL and the coordinator): the wall clock only,
            // the monotonic clock stays the host's.
            command
                .env(
                    "LD_PRELOAD",
                    faketime_lib().expect("libfaketime is not installed (Debian package faketime)"),
                )
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = command
            .args(&args)
            .env("RUST_LOG", log.as_deref().unwrap_or("warn"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn coordinator process");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        wait_until_serving(&url, tls.as_ref()).await;
        Process {
            url,
            addr,
            tls,
            child,
        }
    }

    pub async fn client(&self) -> Coordinator {
        connect(&self.url, self.tls.as_ref())
            .await
            .expect("connect to coordinator")
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGKILL: no shutdown code runs, leases stay until they expire.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("reap");
    }

    /// SIGTERM: the graceful path.
    pub async fn terminate(self) -> std::process::ExitStatus {
        self.signal("TERM");
        self.exited().await
    }

    /// Sends the signal `name` (`TERM`, `STOP`, ...) without waiting for anything.
    pub fn signal(&self, name: &str) {
        // Safe: signals our own child.
        let _ = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status();
    }

    /// Waits for the process to exit.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        self.child.wait().await.expect("reap")
    }
}

/// libfaketime's preload library: `DTX_FAKETIME_LIB`, or where Debian and Ubuntu install it;
/// `None` if it is not there (Debian package `faketime`; `.ci/run` installs it).
pub fn faketime_lib() -> Option<String> {
    if let Ok(lib) = std::env::var("DTX_FAKETIME_LIB") {
        return Some(lib);
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .map(String::from)
}

/// Whether skewed-clock runs can happen here. Without libfaketime they are skipped with a
/// message, like the database tests - except under CI, where that fails: a preload of a
/// missing library is silently ignored, and a "skewed" instance would run on the host's clock.
pub fn faketime_or_skip(what: &str) -> bool {
    if faketime_lib().is_some() {
        return true;
    }
    let message = format!("{what}: libfaketime is not installed (Debian package faketime)");
    if crate::db::in_ci() {
        panic!("{message} (CI=true: skewed-clock tests must not be skipped)");
    }
    eprintln!("skipping {message}");
    false
}

/// A client of the coordinator at `url`, over TLS with `tls` if given.
pub async fn connect(url: &str, tls: Option<&ClientTls>) -> Result<Coordinator, dtx_sdk::Error> {
    match tls {
        Some(tls) => Coordinator::connect_tls(url, tls.clone()).await,
        None => Coordinator::connect(url).await,
    }
}

async fn wait_until_serving(url: &str, tls: Option<&ClientTls>) {
    for _ in 0..200 {
        if let Ok(c) = connect(url, tls).await {
            // Serving once an RPC gets an answer (NOT_FOUND is an answer).
            if c.get("probe")
                .await
                .is_err_and(|e| !matches!(e, dtx_sdk::Error::Transport(_)))
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("coordinator at {url} did not start");
}
