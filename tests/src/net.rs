//! Real gRPC servers on port 0.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::transport::server::Router;
use tonic::transport::server::TcpIncoming;

/// A server running in the background; stops when dropped.
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    /// `http://127.0.0.1:<port>`, what a client or the coordinator dials.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected channel to this server.
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Channel::from_shared(self.url())
            .expect("a valid url")
            .connect()
            .await
            .expect("connect to the test server")
    }

    /// Stops accepting, lets in-flight calls finish, and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
    }
}

/// Serves `router` on a fresh loopback port.
pub async fn serve(router: Router) -> RunningServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    serve_on(listener, router)
}

/// Serves `router` on `listener` (bound first when the server must know its own URL).
pub fn serve_on(listener: TcpListener, router: Router) -> RunningServer {
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    stopped.await.ok();
                },
            )
            .await
            .expect("grpc server");
    });
    RunningServer {
        addr,
        stop: Some(stop),
        task: Some(task),
    }
}

/// How a misbehaving proxy in front of a participant answers one call instead of the
/// participant: what a rolling deploy or a misrouted gateway looks like to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misroute {
    /// A plain HTTP 404 without `grpc-status`; the call never reaches the participant.
    Http404Before,
    /// The participant runs the call (its effect commits); its answer becomes a plain 404.
    Http404After,
    /// The participant runs the call; its answer becomes gRPC `UNIMPLEMENTED`.
    UnimplementedAfter,
}

/// Marks a response the service behind a [`MisrouteProxy`] wants replaced by a plain HTTP 404
/// (the participant's own fault injector decides, after the effect).
#[derive(Debug, Clone, Copy)]
pub struct Replace404;

/// Decides, per call, whether the proxy misroutes it.
pub type MisroutePolicy = Arc<dyn Fn() -> Option<Misroute> + Send + Sync>;

/// A proxy in front of a gRPC service: a call the policy picks (or whose answer carries
/// [`Replace404`]) gets a status-only answer instead of the service's.
#[derive(Clone)]
pub struct MisrouteProxy<S> {
    inner: S,
    policy: MisroutePolicy,
}

impl<S> MisrouteProxy<S> {
    pub fn new(inner: S, policy: MisroutePolicy) -> Self {
        MisrouteProxy { inner, policy }
    }

    /// Only answers marked with [`Replace404`] are replaced.
    pub fn marked(inner: S) -> Self {
        MisrouteProxy::new(inner, Arc::new(|| None))
    }
}

impl<S: NamedService> NamedService for MisrouteProxy<S> {
    const NAME: &'static str = S::NAME;
}

fn plain_404() -> http::Response<Body> {
    http::Response::builder()
        .status(404)
        .body(Body::empty())
        .unwrap()
}

impl<S> Service<http::Request<Body>> for MisrouteProxy<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let how = (self.policy)();
        if how == Some(Misroute::Http404Before) {
            return Box::pin(async { Ok(plain_404()) });
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await?;
            Ok(match how {
                Some(Misroute::UnimplementedAfter) => {
                    tonic::Status::unimplemented("dtx.v1.Participant is not served here")
                        .into_http()
                }
                Some(_) => plain_404(),
                None if answer.extensions().get::<Replace404>().is_some() => plain_404(),
                None => answer,
            })
        })
    }
}

/// A free loopback address for a server the caller starts right after. Taken below the
/// kernel's ephemeral range: a port handed out for `:0` and released would be the next one
/// another `:0` listener or an outgoing connection of this process gets (a coordinator's own
/// gRPC listener took its `--admin-listen` port that way), where a port outside the range is
/// only ever taken by name.
pub async fn free_addr() -> std::net::SocketAddr {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000.min(ephemeral_low / 2);
    for _ in 0..1000 {
        let port = rand::random_range(low..ephemeral_low);
        if let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            return listener.local_addr().unwrap();
        }
    }
    panic!("no free port in {low}..{ephemeral_low}");
}

/// A `dtx.v1.Participant` served the way a service without gRPC would: `POST /dtx/branch`
/// with the `BranchRequest` in proto3 JSON, answered with the `BranchResponse` in JSON, or a
/// problem body carrying the gRPC code of an error. HTTP headers become the call's metadata
/// (`traceparent`). Answers the participant's URL; serves until the test ends.
pub async fn serve_http_json<P>(participant: P) -> String
where
    P: dtx_proto::v1::participant_server::Participant,
{
    let app = http_json_router(participant);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let url = format!("http://{}/dtx/branch", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// [`serve_http_json`] over TLS with `tls` (requiring client certificates when it has a client
/// CA): its `https://` URL.
pub async fn serve_https_json<P>(
    participant: P,
    tls: Arc<dtx_coordinator::tls::ServerTls>,
) -> String
where
    P: dtx_proto::v1::participant_server::Participant,
{
    let addr = serve_tls(http_json_router(participant), tls).await;
    format!("https://{addr}/dtx/branch")
}

/// Serves `router` over TLS on a fresh loopback port, on the coordinator's own serving path
/// (client certificates required when `tls` has a client CA); runs until the process ends.
pub async fn serve_tls(
    router: axum::Router,
    tls: Arc<dtx_coordinator::tls::ServerTls>,
) -> SocketAddr {
    use dtx_coordinator::listen::{self, Limits, Listener, Protocol};
    let socket = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = socket.local_addr().unwrap();
    let listener = Listener {
        name: "test",
        cap_flag: "none",
        socket,
        protocol: Protocol::Http,
        limits: Limits {
            max_connections: 100,
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: None,
            max_body_bytes: None,
        },
        router,
        tls: Some((tls, true)),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _serving = stop;
        let report: listen::Report = Arc::new(|_, _| {});
        listen::serve(listener, stopped, std::time::Duration::ZERO, report).await
    });
    addr
}

/// The participant's `Branch` as `POST /dtx/branch` with JSON.
fn http_json_router<P>(participant: P) -> axum::Router
where
    P: dtx_proto::v1::participant_server::Participant,
{
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use dtx_proto::http::{PROBLEM_JSON, Problem};
    let participant = Arc::new(participant);
    axum::Router::new().route(
        "/dtx/branch",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let participant = participant.clone();
            async move {
                let answer = match serde_json::from_slice(&body) {
                    Ok(request) => {
                        let request = tonic::Request::from_parts(
                            tonic::metadata::MetadataMap::from_headers(headers),
                            tonic::Extensions::default(),
                            request,
                        );
                        participant.branch(request).await
                    }
                    Err(e) => Err(tonic::Status::invalid_argument(format!("not JSON: {e}"))),
                };
                match answer {
                    Ok(response) => (
                        [(header::CONTENT_TYPE, "application/json")],
                        serde_json::to_vec(response.get_ref()).unwrap(),
                    )
                        .into_response(),
                    Err(status) => {
                        let problem = Problem::of_status(&status);
                        (
                            StatusCode::from_u16(problem.status).unwrap(),
                            [(header::CONTENT_TYPE, PROBLEM_JSON)],
                            serde_json::to_vec(&problem).unwrap(),
                        )
                            .into_response()
                    }
                }
            }
        }),
    )
}

/// A TCP link to `upstream` (a database) on which every answer arrives in two pieces: its first
/// four bytes, then the rest `gap` later - a congested network's segments. A client reading a
/// packet header and then waiting for the body is suspended in between far more often than on
/// loopback, which is where a request dropped mid-read hurts. Stops when dropped.
pub struct SplitLink {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl SplitLink {
    pub async fn start(upstream: SocketAddr, gap: std::time::Duration) -> SplitLink {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let mut links = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                links.spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let requests = tokio::io::copy(&mut client_read, &mut server_write);
                    let answers = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let split = n.min(4);
                            if client_write.write_all(&buf[..split]).await.is_err() {
                                break;
                            }
                            tokio::time::sleep(gap).await;
                            if client_write.write_all(&buf[split..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        () = answers => {}
                    }
                });
            }
        });
        SplitLink { addr, task }
    }
}

impl SplitLink {
    /// A link (answers split 2 ms apart) to the database of `url`, and the same URL through it.
    pub async fn to_database(url: &str) -> (String, SplitLink) {
        let scheme_end = url.find("://").expect("a database URL") + 3;
        let host_start = scheme_end + url[scheme_end..].find('@').map_or(0, |at| at + 1);
        let host_end = host_start
            + url[host_start..]
                .find('/')
                .unwrap_or(url.len() - host_start);
        let upstream = tokio::net::lookup_host(&url[host_start..host_end])
            .await
            .expect("the database's address")
            .next()
            .expect("an address");
        let link = SplitLink::start(upstream, std::time::Duration::from_millis(2)).await;
        let through = format!("{}{}{}", &url[..host_start], link.addr, &url[host_end..]);
        (through, link)
    }
}

impl Drop for SplitLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
