//! Runs the coordinator: store, engine, gRPC server (with health and v1 and v1alpha
//! reflection), metrics.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::admin::AdminService;
use crate::config::Config;
use crate::engine::Engine;
use crate::error::Result;
use crate::grpc::CoordinatorService;
use crate::startup;

/// Calls in flight on one client connection. An SDK client multiplexes all its calls - long
/// polls of Wait and Commit-and-wait included - over one connection, so hyper's default of 200
/// would queue a busy client's calls (and a burst above it on a fresh connection is refused).
const MAX_STREAMS_PER_CONNECTION: u32 = 16_384;

/// h2 closes a connection (ENHANCE_YOUR_CALM) when small unread DATA frames exceed half the
/// connection window; a burst of thousands of small requests is that, so the window (flow
/// control only: nothing is allocated for it) is sized for every stream's first frame.
const CONNECTION_WINDOW: u32 = 16 << 20;

/// Serves on `listener` until `shutdown` completes, then stops accepting calls and lets the
/// drivers hand their transactions back to the store (so another instance, or the next start,
/// continues them at once).
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let (store, _sqlite_lock) = startup::open_store(&config.store, config.store_options()).await?;
    let engine = Engine::new(store, config.engine());
    engine.start_background();
    tracing::info!(
        addr = %listener.local_addr()?,
        store = %startup::redact(&config.store),
        instance = %engine.config().instance,
        "coordinator serving"
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<dtx_proto::v1::coordinator_server::CoordinatorServer<CoordinatorService>>()
        .await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(dtx_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_error = |e| crate::Error::Corrupt(format!("reflection: {e}"));
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    // Older grpcurl and grpcio-reflection clients speak only v1alpha.
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;

    if let Some(addr) = config.metrics_listen {
        let metrics_listener = startup::bind(addr, "--metrics-listen").await?;
        tokio::spawn(serve_metrics(metrics_listener, engine.clone()));
    }

    if let Some(addr) = config.http_listen {
        let http = startup::bind(addr, "--http-listen").await?;
        tracing::info!(addr = %http.local_addr()?, "HTTP/JSON interface serving");
        tokio::spawn(crate::http_api::serve(http, engine.clone()));
    }

    if let Some(addr) = config.admin_listen {
        let console = startup::bind(addr, "--admin-listen").await?;
        tracing::info!(addr = %console.local_addr()?, "web console serving");
        tokio::spawn(crate::console::serve(console, engine.clone()));
    }

    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let stopping = engine.clone();
    let stop = async move {
        shutdown.await;
        tracing::info!("shutting down");
        stopping.shutdown(grace).await;
    };
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(CoordinatorService::new(engine.clone()))
        .add_service(AdminService::new(engine.clone()))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), stop)
        .await
        .map_err(|e| crate::Error::Io(std::io::Error::other(e)))?;
    Ok(())
}

/// What the `coordinator` binary does: set up logging (and span export), serve until SIGTERM
/// or Ctrl-C, flush the spans.
pub async fn main(config: Config) -> Result<()> {
    let tracing = init_logging(config.otlp_endpoint.as_deref())?;
    let served = run_until_signal(config).await;
    tracing.shutdown();
    served
}

/// Binds `config.listen` and serves until SIGTERM or Ctrl-C.
pub async fn run_until_signal(config: Config) -> Result<()> {
    let listener = startup::bind(config.listen, "--listen").await?;
    run(config, listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.ok();
}

/// Logs to stderr with `RUST_LOG` filtering (default `info`); with `otlp_endpoint`, also
/// exports spans (one per branch attempt, in the transaction's trace) to that OpenTelemetry
/// collector over gRPC. Shut the returned handle down before exiting to flush them.
pub fn init_logging(otlp_endpoint: Option<&str>) -> Result<Tracing> {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let provider = match otlp_endpoint {
        Some(endpoint) => {
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| crate::Error::Start {
                    failure: startup::StartFailure::Config,
                    message: format!(
                        "cannot export spans to {endpoint:?} (--otlp-endpoint): {e}. Give \
                             the collector's gRPC URL, e.g. http://127.0.0.1:4317."
                    ),
                })?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name("dtx-coordinator")
                .build();
            Some(
                opentelemetry_sdk::trace::SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };
    // RUST_LOG filters the log lines only: spans are exported whatever the log level.
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("dtx-coordinator"))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .init();
    Ok(Tracing { provider })
}

/// The span exporter, if any; [`Tracing::shutdown`] flushes it.
pub struct Tracing {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Tracing {
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "could not flush spans to the OTLP collector");
        }
    }
}

/// A minimal HTTP endpoint answering every request with the Prometheus text of the metrics.
async fn serve_metrics(listener: TcpListener, engine: Engine) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut pause = Duration::from_millis(10);
    loop {
        let mut socket = match listener.accept().await {
            Ok((socket, _)) => {
                pause = Duration::from_millis(10);
                socket
            }
            // A persistent error (e.g. out of file descriptors) must not spin a core: back
            // off, capped at a second, and say why.
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener cannot accept; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let engine = engine.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            let body = engine.render_metrics().await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
        });
    }
}
