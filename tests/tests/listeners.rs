//! Every listener of the coordinator as a careless or hostile client would try it: a huge
//! streamed body, connections that send half a request head and stay, more of them than the
//! process has file descriptors; a web page on another site driving the console; and SIGTERM
//! while calls are held on every listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dtx_tests::coordinator::{InProcess, Process};
use dtx_tests::net::free_addr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_test-coordinator");

/// A fresh SQLite store in `dir`.
fn store(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("c.db").display())
}

/// Reads one HTTP/1.1 response (head and a `content-length` body): its status and text.
async fn read_response(stream: &mut (impl AsyncReadExt + Unpin)) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let status = text.split(' ').nth(1)?.parse().ok()?;
                return Some((status, text));
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// One request on a fresh connection: its status and text.
async fn request(addr: SocketAddr, raw: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(raw.as_bytes()).await.ok()?;
    tokio::time::timeout(Duration::from_secs(10), read_response(&mut stream))
        .await
        .ok()?
}

fn post(path: &str, host: &str, extra: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// The peak resident memory of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Streams a chunked body of up to `total` bytes to an HTTP/JSON route; stops once the answer
/// is in. Returns the answer and how many body bytes were sent by then.
async fn stream_huge_body(addr: SocketAddr, total: usize) -> (Option<(u16, String)>, usize) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let answered = Arc::new(AtomicBool::new(false));
    let sending = tokio::spawn({
        let answered = answered.clone();
        async move {
            let head = "POST /dtx.v1.Coordinator/Begin HTTP/1.1\r\nhost: x\r\n\
                        content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            writer.write_all(head.as_bytes()).await.unwrap();
            let mut chunk = format!("{:x}\r\n", 64 << 10).into_bytes();
            chunk.extend(std::iter::repeat_n(b' ', 64 << 10));
            chunk.extend_from_slice(b"\r\n");
            let mut sent = 0;
            while sent < total && !answered.load(Ordering::SeqCst) {
                if writer.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += 64 << 10;
            }
            sent
        }
    });
    let answer = tokio::time::timeout(Duration::from_secs(120), read_response(&mut reader))
        .await
        .expect("an answer within 2 minutes");
    answered.store(true, Ordering::SeqCst);
    (answer, sending.await.unwrap())
}

/// Four 256 MiB chunked bodies at once: each is refused (413, problem+json naming the limit)
/// after about the limit was read, not at the end, and the coordinator's peak memory grows by
/// far less than one such body. (Before the body limit was enforced while reading, each was
/// read whole: +459 MB, then 400.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_streamed_bodies_are_refused_early_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let http = free_addr().await;
    let coordinator =
        Process::start(BIN, &store(&dir), &["--http-listen", &http.to_string()]).await;
    let (status, _) = request(http, &post("/dtx.v1.Coordinator/Get", "x", "", "{}"))
        .await
        .expect("HTTP/JSON answers");
    assert_eq!(status, 400);
    let before = peak_rss_kib(coordinator.pid());

    const HUGE: usize = 256 << 20;
    let sends: Vec<_> = (0..4)
        .map(|_| tokio::spawn(stream_huge_body(http, HUGE)))
        .collect();
    for send in sends {
        let (answer, sent) = send.await.unwrap();
        let (status, text) = answer.expect("an answer before the connection closed");
        assert_eq!(status, 413, "{text}");
        assert!(text.contains("application/problem+json"), "{text}");
        assert!(text.contains("larger than the limit of"), "{text}");
        // Early, not at the end: the sender only notices the answer after its writes drained
        // into socket buffers, which on a loaded machine is some way past the limit (32 MiB
        // was seen once), yet far from the 256 MiB body.
        assert!(
            sent < 64 << 20,
            "{} MiB were sent before the refusal",
            sent >> 20
        );
    }
    // Bounded, not tight: reading even one of the 256 MiB bodies would add 256 MiB, while
    // four bodies refused at the limit cost their limit-sized buffers (each collected buffer
    // may double while it grows) plus what the allocator keeps per thread: 64 MiB was reached
    // once in a clean CI run.
    let grown = peak_rss_kib(coordinator.pid()).saturating_sub(before);
    assert!(
        grown < 128 << 10,
        "peak memory grew by {} MiB for four refused bodies",
        grown >> 10
    );
    coordinator.kill().await;
}

/// More connections sending half a request head than the coordinator has file descriptors:
/// past the HTTP listener's cap they are refused at once (503 naming the cap), the ones held
/// are closed at the header timeout, gRPC answers all along, and both refusals are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_connections_past_the_cap_leave_grpc_answering() {
    let dir = tempfile::tempdir().unwrap();
    let (http, metrics) = (free_addr().await, free_addr().await);
    let flags = [
        "--http-listen",
        &http.to_string(),
        "--metrics-listen",
        &metrics.to_string(),
        "--http-max-connections",
        "50",
        "--header-timeout",
        "3s",
    ]
    .map(String::from);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let coordinator = Process::start_with_open_files(BIN, &store(&dir), &flags, 256).await;

    let mut slow = Vec::new();
    for _ in 0..400 {
        let mut stream = TcpStream::connect(http).await.expect("connect");
        stream
            .write_all(b"POST / HTTP/1.1\r\nhost: x\r\n")
            .await
            .ok();
        slow.push(stream);
    }
    // gRPC answers a new client while the HTTP port is flooded.
    let got = tokio::time::timeout(Duration::from_secs(2), async {
        let client = dtx_sdk::client::Coordinator::connect(&coordinator.url).await?;
        client.get("nothing-here").await
    })
    .await;
    let error = got
        .expect("gRPC answered a new client within 2 s")
        .expect_err("no such transaction");
    assert!(error.to_string().contains("nothing-here"), "{error}");
    // A new HTTP client is told why, at once.
    let (status, text) = request(http, &post("/dtx.v1.Coordinator/Get", "x", "", "{}"))
        .await
        .expect("an answer");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("--http-max-connections"), "{text}");

    // The held connections are closed at the header timeout (the others got their 503).
    let mut held = 0;
    for stream in &mut slow {
        let mut answer = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        assert!(closed.is_ok(), "a slow connection is still open");
        if answer.is_empty() {
            held += 1;
        } else {
            assert!(answer.starts_with(b"HTTP/1.1 503"), "{answer:?}");
        }
    }
    assert_eq!(held, 50, "connections held up to the cap");
    drop(slow);
    let (status, text) = request(http, &post("/dtx.v1.Coordinator/Get", "x", "", "{}"))
        .await
        .expect("HTTP answers again");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("xid"), "{text}");

    let scrape = request(metrics, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("metrics")
        .1;
    let count = |reason: &str| -> u64 {
        let series =
            format!("dtx_listener_refusals_total{{listener=\"http\",reason=\"{reason}\"}} ");
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.parse().unwrap())
    };
    assert!(count("connection_cap") >= 300, "{scrape}");
    assert!(count("header_timeout") >= 40, "{scrape}");
    coordinator.kill().await;
}

/// The console answers only under its own names, takes actions only from its own pages, and
/// sends the headers that keep other sites from framing it or injecting script.
#[tokio::test]
async fn the_console_refuses_foreign_hosts_and_posts_without_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let (console, http) = (free_addr().await, free_addr().await);
    let coordinator = InProcess::start(
        &store(&dir),
        &[
            "--admin-listen",
            &console.to_string(),
            "--http-listen",
            &http.to_string(),
            "--admin-host",
            "dtx.internal",
        ],
    )
    .await;
    let begin = post("/dtx.v1.Coordinator/Begin", "x", "", r#"{"xid":"open-1"}"#);
    assert_eq!(request(http, &begin).await.unwrap().0, 200);
    let client = coordinator.client().await;
    let status = || async { client.get("open-1").await.unwrap().status() };
    let port = console.port();
    let form = "reason=x&confirmed=yes";

    // A DNS-rebinding page: its own host name in Host and Origin.
    let evil = format!("evil.example:{port}");
    let origin =
        format!("origin: http://{evil}\r\ncontent-type: application/x-www-form-urlencoded\r\n");
    let (code, text) = request(console, &post("/tx/open-1/rollback", &evil, &origin, form))
        .await
        .unwrap();
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("--admin-host"), "{text}");
    let (code, _) = request(console, &format!("GET / HTTP/1.1\r\nhost: {evil}\r\n\r\n"))
        .await
        .unwrap();
    assert_eq!(code, 403, "a foreign host can read the console");

    // No Origin at all (not a form of the console).
    let own = format!("127.0.0.1:{port}");
    let form_type = "content-type: application/x-www-form-urlencoded\r\n";
    let (code, text) = request(console, &post("/tx/open-1/rollback", &own, form_type, form))
        .await
        .unwrap();
    assert_eq!(code, 403, "{text}");
    assert!(
        text.contains("did not come from a page of this console"),
        "{text}"
    );
    // Another origin with the console's Host.
    let other = format!("origin: http://evil.example\r\n{form_type}");
    let (code, _) = request(console, &post("/tx/open-1/rollback", &own, &other, form))
        .await
        .unwrap();
    assert_eq!(code, 403);
    assert_eq!(status().await, dtx_proto::v1::TxStatus::Trying);

    // The console's own page: under a configured name and under its address.
    for host in [
        format!("dtx.internal:{port}"),
        own.clone(),
        format!("localhost:{port}"),
    ] {
        let (code, text) = request(console, &format!("GET / HTTP/1.1\r\nhost: {host}\r\n\r\n"))
            .await
            .unwrap();
        assert_eq!(code, 200, "{host}: {text}");
        let head = text.to_ascii_lowercase();
        for header in [
            "content-security-policy: default-src 'none'; script-src 'self'",
            "x-frame-options: deny",
            "x-content-type-options: nosniff",
        ] {
            assert!(head.contains(header), "{header} missing:\n{text}");
        }
        assert!(
            !head.contains("<script>"),
            "inline script the CSP would block"
        );
    }
    let mine = format!("origin: http://{own}\r\n{form_type}");
    let (code, text) = request(console, &post("/tx/open-1/rollback", &own, &mine, form))
        .await
        .unwrap();
    assert_eq!(code, 303, "{text}");
    for _ in 0..100 {
        if status().await == dtx_proto::v1::TxStatus::RolledBack {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status().await, dtx_proto::v1::TxStatus::RolledBack);
    coordinator.stop().await;
}

/// SIGTERM while a call is held on each listener: every listener stops accepting at once, the
/// held calls are answered (a gRPC Wait, an HTTP/JSON request and a console form whose bodies
/// were still arriving), then the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_held_call_on_every_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (http, console, metrics) = (free_addr().await, free_addr().await, free_addr().await);
    let flags = [
        "--http-listen",
        &http.to_string(),
        "--admin-listen",
        &console.to_string(),
        "--metrics-listen",
        &metrics.to_string(),
        "--shutdown-grace",
        "10s",
    ]
    .map(String::from);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let coordinator = Process::start(BIN, &store(&dir), &flags).await;
    let begin = post("/dtx.v1.Coordinator/Begin", "x", "", r#"{"xid":"held"}"#);
    assert_eq!(request(http, &begin).await.unwrap().0, 200);
    let client = coordinator.client().await;
    let grpc = coordinator.addr;
    let wait = tokio::spawn(async move { client.wait("held", Duration::from_secs(2)).await });

    // Requests whose bodies are half sent: in flight on the HTTP and console listeners.
    let half = |addr: SocketAddr, raw: String| async move {
        let (head, rest) = raw.split_at(raw.len() - 4);
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        (stream, rest.to_string())
    };
    let get = post("/dtx.v1.Coordinator/Get", "x", "", r#"{"xid":"held"}"#);
    let (mut http_call, http_rest) = half(http, get).await;
    let own = format!("127.0.0.1:{}", console.port());
    let form_headers =
        format!("origin: http://{own}\r\ncontent-type: application/x-www-form-urlencoded\r\n");
    let form = post("/tx/held/retry", &own, &form_headers, "reason=abcd");
    let (mut console_call, console_rest) = half(console, form).await;
    let mut metrics_idle = TcpStream::connect(metrics).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    coordinator.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (name, addr) in [
        ("grpc", grpc),
        ("http", http),
        ("console", console),
        ("metrics", metrics),
    ] {
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "{name} still accepts connections after SIGTERM"
        );
    }
    // An idle connection is closed.
    let mut byte = [0u8; 1];
    let idle = tokio::time::timeout(Duration::from_secs(5), metrics_idle.read(&mut byte)).await;
    assert!(matches!(idle, Ok(Ok(0) | Err(_))), "{idle:?}");

    http_call.write_all(http_rest.as_bytes()).await.unwrap();
    let (code, text) = read_response(&mut http_call).await.expect("HTTP answer");
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"held\""), "{text}");
    console_call
        .write_all(console_rest.as_bytes())
        .await
        .unwrap();
    let (code, text) = read_response(&mut console_call)
        .await
        .expect("console answer");
    assert!(code == 200 || code == 409, "{code}: {text}");
    assert!(text.contains("held"), "{text}");
    let waited = wait.await.unwrap().expect("the held Wait is answered");
    assert_eq!(waited.xid, "held");

    let exit = tokio::time::timeout(Duration::from_secs(20), coordinator.exited())
        .await
        .expect("exits after draining");
    assert!(exit.success(), "{exit:?}");
}
