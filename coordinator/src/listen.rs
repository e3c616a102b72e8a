//! The one serving path of every listener: gRPC (`--listen`), HTTP/JSON (`--http-listen`), the
//! console (`--admin-listen`) and metrics (`--metrics-listen`).
//!
//! Each listener has a cap of its own on open connections, so a flood on one port cannot take
//! the file descriptors and tasks another needs (the gRPC port, which every initiator depends
//! on, keeps its capacity whatever happens on the others); HTTP/1 listeners close a connection
//! whose request head is not in within the header timeout; a request body must arrive within
//! the body timeout and is cut at the listener's limit while it is read, so a huge or trickled
//! body costs at most the limit and the timeout. On shutdown every listener stops accepting,
//! lets the requests in flight finish within the grace period and then closes what is left.
//! Every refusal is logged (at most every few seconds per listener) and counted.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dtx_proto::backoff::Backoff;
use http_body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::tls::{ServerTls, Shape};

type BoxError = Box<dyn StdError + Send + Sync>;

/// Calls in flight on one gRPC connection. An SDK client multiplexes all its calls - long
/// polls of Wait and Commit-and-wait included - over one connection, so hyper's default of 200
/// would queue a busy client's calls (and a burst above it on a fresh connection is refused).
const MAX_STREAMS_PER_CONNECTION: u32 = 16_384;

/// h2 closes a connection (ENHANCE_YOUR_CALM) when small unread DATA frames exceed half the
/// connection window; a burst of thousands of small requests is that, so the window (flow
/// control only: nothing is allocated for it) is sized for every stream's first frame.
const CONNECTION_WINDOW: u32 = 16 << 20;

/// How often one listener logs its refusals at most (the counter counts every one).
const LOG_EVERY: Duration = Duration::from_secs(5);

/// What a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 only, tuned for many multiplexed calls.
    Grpc,
    /// HTTP/1.1 (browsers, curl, scrapers, other languages' HTTP clients).
    Http,
}

/// What one listener tolerates.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections at most; further ones are refused at once (HTTP: a 503 answer).
    pub max_connections: usize,
    /// HTTP/1: the whole request head must arrive within this.
    pub header_timeout: Duration,
    /// A request body must arrive whole within this from the request's start (`None`: no
    /// limit, for gRPC streams such as reflection's).
    pub body_timeout: Option<Duration>,
    /// A request body larger than this is cut off (and refused) as it is read.
    pub max_body_bytes: Option<usize>,
}

/// Why a listener refused a connection or cut a request: the `reason` label of
/// `dtx_listener_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener had `max_connections` open.
    ConnectionCap,
    /// `accept` failed (e.g. the process is out of file descriptors).
    AcceptFailed,
    /// The request head did not arrive within the header timeout.
    HeaderTimeout,
    /// The body did not arrive within the body timeout.
    BodyTimeout,
    /// The body was larger than the listener's limit.
    BodyTooLarge,
    /// Still open when the shutdown grace period ended.
    CutAtShutdown,
    /// A connection to a TLS listener that did not complete the TLS handshake in time (plain
    /// text, a certificate the listener does not accept, a wrong CA, too slow).
    TlsHandshake,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ConnectionCap => "connection_cap",
            Refusal::AcceptFailed => "accept_failed",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::CutAtShutdown => "cut_at_shutdown",
            Refusal::TlsHandshake => "tls_handshake",
        }
    }

    /// Every reason, for describing the metric.
    pub const ALL: [Refusal; 7] = [
        Refusal::ConnectionCap,
        Refusal::AcceptFailed,
        Refusal::HeaderTimeout,
        Refusal::BodyTimeout,
        Refusal::BodyTooLarge,
        Refusal::CutAtShutdown,
        Refusal::TlsHandshake,
    ];
}

/// Where refusals are counted: `(listener name, reason)`.
pub type Report = Arc<dyn Fn(&'static str, Refusal) + Send + Sync>;

/// One listener: its socket, what it speaks and tolerates, and what it serves.
pub struct Listener {
    /// The `listener` label and log name: `grpc`, `http`, `console`, `metrics`.
    pub name: &'static str,
    /// The flag that sets its connection cap, named when the cap is hit.
    pub cap_flag: &'static str,
    pub socket: TcpListener,
    pub protocol: Protocol,
    pub limits: Limits,
    pub router: axum::Router,
    /// TLS for every connection (and whether this listener asks for client certificates);
    /// `None`: plain text.
    pub tls: Option<(Arc<ServerTls>, bool)>,
}

/// A request body that could not be read whole; the handler's answer says which limit.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the request body did not arrive within {}s (the body read timeout)", timeout.as_secs_f64())]
    TooSlow { timeout: Duration },
}

impl BodyError {
    /// The [`BodyError`] behind an error of a body read through a listener, if it is one
    /// (extractors wrap it).
    pub fn find<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a BodyError> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(found) = e.downcast_ref::<BodyError>() {
                return Some(found);
            }
            next = e.source();
        }
        None
    }
}

/// Logs and counts one listener's refusals; logs at most every [`LOG_EVERY`], with the number
/// left unlogged since.
struct Events {
    listener: &'static str,
    report: Report,
    last_log: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl Events {
    fn refused(&self, reason: Refusal, detail: &dyn std::fmt::Display) {
        (self.report)(self.listener, reason);
        let now = Instant::now();
        {
            let Ok(mut last) = self.last_log.lock() else {
                return;
            };
            if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
                self.unlogged.fetch_add(1, Ordering::Relaxed);
                return;
            }
            *last = Some(now);
        }
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            listener = self.listener,
            reason = reason.as_str(),
            unlogged_since_last = unlogged,
            "{detail}"
        );
    }
}

/// Serves `listener` until `stop` turns true; then stops accepting, waits up to `grace` for
/// the requests in flight and closes the connections still open.
pub async fn serve(
    listener: Listener,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
    report: Report,
) {
    let Listener {
        name,
        cap_flag,
        socket,
        protocol,
        limits,
        router,
        tls,
    } = listener;
    let tls = tls.map(|(tls, client_auth)| {
        let shape = Shape {
            h2: protocol == Protocol::Grpc,
            client_auth,
        };
        (tls, shape)
    });
    let events = Arc::new(Events {
        listener: name,
        report,
        last_log: Mutex::new(None),
        unlogged: AtomicU64::new(0),
    });
    let builder = Arc::new(builder(protocol, limits));
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let (draining, drain) = watch::channel(Phase::Serving);
    // A persistent accept error (out of file descriptors) must not spin a core.
    const ACCEPT_PAUSE: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
    let mut failures = 0;
    loop {
        let accepted = tokio::select! {
            _ = until(&mut stop, |stopping| *stopping) => break,
            accepted = socket.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                failures = 0;
                stream
            }
            // Back off, capped at a second, and say why.
            Err(e) => {
                events.refused(Refusal::AcceptFailed, &format_args!("cannot accept: {e}"));
                tokio::time::sleep(ACCEPT_PAUSE.delay(failures, 0.0)).await;
                failures += 1;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            events.refused(
                Refusal::ConnectionCap,
                &format_args!(
                    "{} connections open, the cap ({cap_flag}): refusing new ones until some close",
                    limits.max_connections
                ),
            );
            tokio::spawn(refuse(stream, protocol, limits.max_connections, cap_flag));
            continue;
        };
        stream.set_nodelay(true).ok();
        let service = TowerToHyperService::new(router.clone().map_request({
            let events = events.clone();
            move |request: http::Request<hyper::body::Incoming>| {
                let events = events.clone();
                request.map(|body| Bounded::new(body, limits, events))
            }
        }));
        let (builder, events, mut drain) = (builder.clone(), events.clone(), drain.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tls {
                None => Stream::Plain(stream),
                Some((tls, shape)) => {
                    let handshake = handshake(stream, &tls, shape, protocol, limits.header_timeout);
                    match handshake.await {
                        Ok(stream) => Stream::Tls(Box::new(stream)),
                        Err(why) => {
                            events.refused(
                                Refusal::TlsHandshake,
                                &format_args!("closed a connection without TLS: {why}"),
                            );
                            return;
                        }
                    }
                }
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                _ = until(&mut drain, |p| *p != Phase::Serving) => {
                    connection.as_mut().graceful_shutdown();
                    tokio::select! {
                        served = connection.as_mut() => served,
                        _ = until(&mut drain, |p| *p == Phase::Cut) => return,
                    }
                }
            };
            if let Err(e) = served
                && is_header_timeout(e.as_ref())
            {
                events.refused(
                    Refusal::HeaderTimeout,
                    &format_args!(
                        "closed a connection whose request head did not arrive within {}s \
                         (--header-timeout)",
                        limits.header_timeout.as_secs_f64()
                    ),
                );
            }
        });
    }
    // Stop accepting: new connections are refused by the kernel from here on.
    drop(socket);
    draining.send_replace(Phase::Draining);
    let everything = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, open.acquire_many(everything))
        .await
        .is_err()
    {
        let left = limits.max_connections - open.available_permits();
        for _ in 0..left {
            (events.report)(name, Refusal::CutAtShutdown);
        }
        tracing::warn!(
            listener = name,
            connections = left,
            "closing connections still busy at the end of the shutdown grace period"
        );
        draining.send_replace(Phase::Cut);
    }
}

/// Waits until `rx` holds a value `f` accepts (or its sender is gone), without keeping the
/// value borrowed across an await.
async fn until<T>(rx: &mut watch::Receiver<T>, f: impl FnMut(&T) -> bool) {
    let _ = rx.wait_for(f).await.map(drop);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Serving,
    Draining,
    Cut,
}

fn builder(protocol: Protocol, limits: Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    match protocol {
        Protocol::Grpc => {
            builder = builder.http2_only();
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
                .initial_connection_window_size(CONNECTION_WINDOW);
        }
        Protocol::Http => {
            builder = builder.http1_only();
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
        }
    }
    builder
}

/// The TLS handshake of a new connection, within `timeout`. A plain-text HTTP request to an
/// HTTP listener is answered with a 400 saying the listener speaks TLS.
async fn handshake(
    stream: TcpStream,
    tls: &ServerTls,
    shape: Shape,
    protocol: Protocol,
    timeout: Duration,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
    let mut stream = stream;
    let mut first = [0u8; 1];
    // A TLS connection opens with a handshake record (content type 22).
    let peeked = tokio::time::timeout(timeout, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) {
        return Err("nothing arrived within the header timeout".into());
    }
    if first[0] != 0x16 {
        if protocol == Protocol::Http && first[0].is_ascii_uppercase() {
            let body = "this listener speaks TLS only: use https://\n";
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            // Read what the client sent before closing: closing on unread data resets the
            // connection, and the client may never see the answer.
            let answer_then_close = async {
                stream.write_all(answer.as_bytes()).await?;
                stream.shutdown().await?;
                let mut sink = [0u8; 4096];
                while stream.read(&mut sink).await? > 0 {}
                Ok::<_, std::io::Error>(())
            };
            tokio::time::timeout(Duration::from_secs(1), answer_then_close)
                .await
                .ok();
        }
        return Err("the client spoke plain text".into());
    }
    let accept = TlsAcceptor::from(tls.config(shape)).accept(stream);
    match tokio::time::timeout(timeout, accept).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
        Err(_) => Err("the TLS handshake did not finish within the header timeout".into()),
    }
}

/// A served connection, plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Whether a connection ended because its request head did not arrive in time.
fn is_header_timeout(error: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// A connection over the cap: HTTP clients get a 503 saying so (a gRPC client sees the
/// connection close, which it reports as UNAVAILABLE).
async fn refuse(mut stream: TcpStream, protocol: Protocol, cap: usize, cap_flag: &str) {
    if protocol == Protocol::Http {
        let body = format!(
            "this listener has {cap} connections open, its cap ({cap_flag}); retry shortly\n"
        );
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\n\
             connection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let write = stream.write_all(answer.as_bytes());
        tokio::time::timeout(Duration::from_secs(1), write)
            .await
            .ok();
    }
}

/// A request body read through its listener's limits: cut at the size limit while it is read
/// (a declared length over it is refused before any byte), and failed when it has not arrived
/// whole by the deadline.
pub struct Bounded<B> {
    inner: B,
    read: usize,
    limit: Option<usize>,
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    events: Arc<Events>,
}

impl<B: Body> Bounded<B> {
    fn new(inner: B, limits: Limits, events: Arc<Events>) -> Self {
        let deadline = match limits.body_timeout {
            Some(timeout) if !inner.is_end_stream() => Some(Box::pin(tokio::time::sleep(timeout))),
            _ => None,
        };
        Bounded {
            inner,
            read: 0,
            limit: limits.max_body_bytes,
            deadline,
            timeout: limits.body_timeout.unwrap_or_default(),
            events,
        }
    }

    fn fail(&mut self, error: BodyError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let reason = match error {
            BodyError::TooLarge { .. } => Refusal::BodyTooLarge,
            BodyError::TooSlow { .. } => Refusal::BodyTimeout,
        };
        self.events
            .refused(reason, &format_args!("refused a request: {error}"));
        // One refusal per body: later polls end it.
        self.limit = None;
        self.deadline = None;
        self.read = usize::MAX;
        Poll::Ready(Some(Err(Box::new(error))))
    }
}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.read == usize::MAX {
            return Poll::Ready(None);
        }
        if let Some(limit) = this.limit
            && this.inner.size_hint().lower() > limit as u64
        {
            return this.fail(BodyError::TooLarge { limit });
        }
        if let Some(deadline) = this.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            let timeout = this.timeout;
            return this.fail(BodyError::TooSlow { timeout });
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.read += data.len();
                    if let Some(limit) = this.limit
                        && this.read > limit
                    {
                        return this.fail(BodyError::TooLarge { limit });
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.deadline = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read == usize::MAX || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
