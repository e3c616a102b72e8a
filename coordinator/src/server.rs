//! Runs the coordinator: store, engine, gRPC server (with health and v1 and v1alpha
//! reflection), metrics.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::AdminService;
use crate::auth::Auth;
use crate::config::Config;
use crate::engine::Engine;
use crate::grpc::CoordinatorService;
use crate::listen::{self, Limits, Listener, Protocol};
use crate::startup;
use crate::startup::Result;

/// Largest form the console accepts (a reason and an operator name).
const CONSOLE_MAX_BODY: usize = 16 << 10;

/// Serves on `listener` (gRPC) and the configured HTTP listeners until `shutdown` completes;
/// then every listener stops accepting and drains, and the drivers hand their transactions
/// back to the store (so another instance, or the next start, continues them at once).
pub async fn run(
    mut config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    for line in config.apply_old_spellings() {
        tracing::warn!("{line}");
    }
    // Every flag is checked before the store is opened: a bad value touches nothing.
    let mut engine_config = config.engine();
    engine_config.participant_tls = startup::participant_tls(&config)?;
    engine_config.allow = std::sync::Arc::new(startup::allowlist(&config)?);
    let call_signer = startup::call_signer(&config)?;
    let auth = startup::auth(&config)?;
    let tls = startup::tls(&config)?;
    let (store, _sqlite_lock) = startup::open_store(&config.store, config.store_options()).await?;
    let engine = Engine::new(store, engine_config);
    engine.set_call_signer(call_signer);
    engine.start_background();
    tracing::info!(
        addr = %listener.local_addr()?,
        store = %startup::redact(&config.store),
        instance = %engine.config().instance,
        "coordinator serving"
    );

    let quotas = Arc::new(crate::quota::Quotas::new(config.quota_limits()));
    report_auth(&auth, &config);
    if let Some(tls) = &tls {
        tracing::info!(
            mtls = tls.requires_client_certificates(),
            "TLS on every listener (client certificates required on gRPC and HTTP/JSON: {})",
            tls.requires_client_certificates()
        );
    }
    // Client certificates are asked for on the APIs, not on the console and metrics (browsers
    // and scrapers).
    let tls_for = |client_auth: bool| tls.clone().map(|tls| (tls, client_auth));
    let http = |max_connections, max_body_bytes| Limits {
        max_connections,
        header_timeout: config.header_timeout.0,
        body_timeout: Some(config.body_timeout.0),
        max_body_bytes: Some(max_body_bytes),
    };
    let mut listeners = vec![Listener {
        name: "grpc",
        cap_flag: "--grpc-max-connections",
        socket: listener,
        protocol: Protocol::Grpc,
        // gRPC bodies are streams (reflection's is long-lived); tonic limits each message.
        limits: Limits {
            max_connections: config.grpc_max_connections,
            header_timeout: config.header_timeout.0,
            body_timeout: None,
            max_body_bytes: None,
        },
        router: grpc_router(&engine, &auth, &quotas).await?,
        tls: tls_for(true),
    }];
    if let Some(addr) = config.http_listen {
        let socket = startup::bind(addr, "--http-listen").await?;
        tracing::info!(addr = %socket.local_addr()?, "HTTP/JSON interface serving");
        listeners.push(Listener {
            name: "http",
            cap_flag: "--http-max-connections",
            socket,
            protocol: Protocol::Http,
            limits: http(config.http_max_connections, crate::http_api::MAX_BODY_BYTES),
            router: crate::http_api::router(engine.clone(), auth.clone(), quotas.clone()),
            tls: tls_for(true),
        });
    }
    if let Some(addr) = config.admin_listen {
        let socket = startup::bind(addr, "--admin-listen").await?;
        tracing::info!(
            addr = %socket.local_addr()?,
            hosts = ?config.console_hosts(),
            "web console serving (to IP addresses, localhost and these host names)"
        );
        listeners.push(Listener {
            name: "console",
            cap_flag: "--admin-max-connections",
            socket,
            protocol: Protocol::Http,
            limits: http(config.admin_max_connections, CONSOLE_MAX_BODY),
            router: crate::console::router(
                engine.clone(),
                config.console_hosts(),
                auth.clone(),
                tls.is_some(),
            ),
            tls: tls_for(false),
        });
    }
    if let Some(addr) = config.metrics_listen {
        let socket = startup::bind(addr, "--metrics-listen").await?;
        listeners.push(Listener {
            name: "metrics",
            cap_flag: "--metrics-max-connections",
            socket,
            protocol: Protocol::Http,
            limits: http(config.metrics_max_connections, 0),
            router: metrics_router(engine.clone()),
            tls: tls_for(false),
        });
    }
    check_descriptor_budget(&listeners, config.db_connections);

    let grace = config.shutdown_grace.0;
    let (stop, stopped) = watch::channel(false);
    let report: listen::Report = {
        let engine = engine.clone();
        Arc::new(move |listener, reason| {
            engine.metrics().listener_refused(listener, reason.as_str())
        })
    };
    let reasons = listen::Refusal::ALL.map(listen::Refusal::as_str);
    for listener in &listeners {
        engine.metrics().listener_serving(listener.name, &reasons);
    }
    engine.metrics().quotas_serving(&crate::quota::QUOTA_NAMES);
    if let Some(tls) = tls {
        let files = tls.files();
        let reload = move || tls.reload();
        tokio::spawn(crate::tls::watch(
            "the listeners' TLS certificate",
            files,
            stopped.clone(),
            reload,
        ));
    }
    if auth.enabled() {
        let files = auth.files().paths();
        let auth = auth.clone();
        let reload = move || auth.reload();
        let what = "the callers' keys (--auth-jwks, --auth-tokens)";
        tokio::spawn(crate::tls::watch(what, files, stopped.clone(), reload));
    }
    if let Some(path) = config.call_signing_key.clone() {
        let (engine, config) = (engine.clone(), config.clone());
        let reload = move || {
            let signer = startup::call_signer(&config).map_err(|e| e.to_string())?;
            engine.set_call_signer(signer);
            Ok(())
        };
        let what = "the branch-call signing key (--call-signing-key)";
        tokio::spawn(crate::tls::watch(what, vec![path], stopped.clone(), reload));
    }
    let participant_files = config.participant_tls_files();
    if !participant_files.is_empty() {
        let (engine, config) = (engine.clone(), config.clone());
        let reload = move || {
            let tls = startup::participant_tls(&config).map_err(|e| e.to_string())?;
            engine.set_participant_tls(tls);
            Ok(())
        };
        let what = "the participant TLS (--participant-ca, --participant-client-cert)";
        tokio::spawn(crate::tls::watch(
            what,
            participant_files,
            stopped.clone(),
            reload,
        ));
    }
    let served: Vec<_> = listeners
        .into_iter()
        .map(|l| tokio::spawn(listen::serve(l, stopped.clone(), grace, report.clone())))
        .collect();
    shutdown.await;
    tracing::info!("shutting down: no new connections; draining the requests in flight");
    stop.send_replace(true);
    for listener in served {
        listener.await.ok();
    }
    engine.shutdown(grace).await;
    Ok(())
}

/// The gRPC services: Coordinator, Admin, health (both named) and reflection v1 and v1alpha.
async fn grpc_router(
    engine: &Engine,
    auth: &Auth,
    quotas: &Arc<crate::quota::Quotas>,
) -> Result<axum::Router> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<dtx_proto::v1::coordinator_server::CoordinatorServer<CoordinatorService>>()
        .await;
    health
        .set_serving::<dtx_proto::v1::admin_server::AdminServer<AdminService>>()
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
    let routes = tonic::service::Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(CoordinatorService::new(
            engine.clone(),
            auth.clone(),
            quotas.clone(),
        ))
        .add_service(AdminService::new(engine.clone(), auth.clone()));
    Ok(routes.prepare().into_axum_router())
}

/// Says at start-up whether callers are checked, loudly when they are not and a listener is
/// reachable from other hosts.
fn report_auth(auth: &Auth, config: &Config) {
    if auth.enabled() {
        let files = auth.files();
        tracing::info!(
            jwks = ?files.jwks,
            tokens = ?files.tokens,
            issuer = ?files.issuer,
            audience = %files.audience,
            "auth on: every Coordinator and Admin call and the console need a bearer token"
        );
        return;
    }
    let exposed: Vec<String> = [Some(config.listen), config.http_listen, config.admin_listen]
        .into_iter()
        .flatten()
        .filter(|a| !a.ip().is_loopback())
        .map(|a| a.to_string())
        .collect();
    if exposed.is_empty() {
        tracing::info!(
            "auth off: anyone who reaches the (loopback) listeners may call everything; turn              it on with --auth-jwks or --auth-tokens"
        );
    } else {
        tracing::warn!(
            listeners = ?exposed,
            "AUTH OFF ON A NETWORK LISTENER: anyone who reaches {} may begin, commit, roll              back and read every transaction; turn it on with --auth-jwks or --auth-tokens",
            exposed.join(", ")
        );
    }
}

/// `/metrics` (and any other path, for scrapers configured with another) answers GET with the
/// Prometheus text.
fn metrics_router(engine: Engine) -> axum::Router {
    let scrape = axum::routing::get(
        |axum::extract::State(engine): axum::extract::State<Engine>| async move {
            (
                [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                engine.render_metrics().await,
            )
        },
    );
    axum::Router::new()
        .route("/", scrape.clone())
        .route("/{*path}", scrape)
        .with_state(engine)
}

/// Raises the open-file limit to its hard limit and warns when the listeners' caps (plus the
/// store's pool and some headroom) do not fit in it: past it, `accept` fails on every
/// listener alike, the gRPC one included.
fn check_descriptor_budget(listeners: &[Listener], db_connections: u32) {
    let Some(limit) = raise_open_files_limit() else {
        return;
    };
    let caps: usize = listeners.iter().map(|l| l.limits.max_connections).sum();
    let needed = caps as u64 + u64::from(db_connections) + 64;
    if needed > limit {
        tracing::warn!(
            open_files_limit = limit,
            connection_caps = caps,
            "the listeners' connection caps (--*-max-connections) and the store's pool need \
             up to {needed} file descriptors, more than this process may open ({limit}): \
             raise `ulimit -n` or lower the caps, or connections past the limit will fail on \
             every listener"
        );
    }
}

/// The soft open-files limit after raising it to the hard one (as Go and most servers do).
#[cfg(unix)]
#[allow(unsafe_code)]
fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by reference.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}

#[cfg(not(unix))]
fn raise_open_files_limit() -> Option<u64> {
    None
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
                .map_err(|e| {
                    startup::StartFailure::Config.error(format!(
                        "cannot export spans to {endpoint:?} (--otlp-endpoint): {e}. Give the \
                         collector's gRPC URL, e.g. http://127.0.0.1:4317."
                    ))
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
