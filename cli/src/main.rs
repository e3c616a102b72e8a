//! `dtx`: the operator's command line for a dtx coordinator, on the `dtx.v1.Admin` contract.
//!
//! Exit codes (for scripts): 0 done, 1 another error, 2 bad usage, 3 not found, 4 refused
//! (the action does not apply to the transaction's status), 5 invalid input, 6 the
//! coordinator is unreachable, unavailable or did not answer within `--timeout`, 7 not
//! authenticated or not allowed, 8 over a quota: each reason's code is in
//! `dtx_proto::reason::TABLE`.

mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use dtx_proto::duration;
use dtx_proto::reason::Reason;
use dtx_proto::tls::ClientTls;
use dtx_proto::v1 as wire;
use dtx_proto::v1::admin_client::AdminClient;
use tonic::Code;
use tonic::transport::Channel;

#[derive(Parser)]
#[command(
    name = "dtx",
    version,
    about = "Operate a dtx coordinator: find stuck transactions, see what happened, act on them"
)]
struct Cli {
    /// The coordinator's gRPC address.
    #[arg(
        long,
        env = "DTX_COORDINATOR",
        default_value = "http://127.0.0.1:50070",
        global = true
    )]
    coordinator: String,
    /// Give up (exit 6) when the coordinator has not answered within this long, connecting
    /// included (`500ms`, `10s`, `1m`): a coordinator that accepts and never answers must not
    /// hang a script or an operator during an incident.
    #[arg(
        long,
        env = "DTX_TIMEOUT",
        default_value = "10s",
        value_parser = duration::parse,
        global = true
    )]
    timeout: std::time::Duration,
    /// The CA (PEM) an `https://` coordinator's certificate must chain to (default: the
    /// system's roots).
    #[arg(long, env = "DTX_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for a coordinator that requires one (mTLS); with `--key`.
    #[arg(long, env = "DTX_CERT", global = true)]
    cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--cert`.
    #[arg(long, env = "DTX_KEY", global = true)]
    key: Option<std::path::PathBuf>,
    /// The bearer token sent with every call (a coordinator with auth on needs one; prefer the
    /// environment: flags show in process listings). With auth on, actions are recorded under
    /// the token's subject and `--operator` is ignored.
    #[arg(long, env = "DTX_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Transactions: list, show, and the operator actions.
    #[command(subcommand)]
    Tx(Tx),
    /// Counts by kind and status, parked count, oldest open transaction.
    Stats,
    /// Tokens for a coordinator's `--auth-tokens` file (no coordinator is called).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Prints a new random token (give it to the caller) and its line for the token file (which
    /// stores only the token's SHA-256).
    New {
        /// Who holds it (recorded as the operator of its actions).
        #[arg(long)]
        subject: String,
        /// Its tenant.
        #[arg(long, default_value = dtx_proto::limits::DEFAULT_TENANT)]
        tenant: String,
        /// Comma-separated: initiator, operator, reader.
        #[arg(long, value_delimiter = ',', value_parser = ["initiator", "operator", "reader"], required = true)]
        roles: Vec<String>,
    },
}

#[derive(Subcommand)]
enum Tx {
    /// Most recently changed first, one page (`--page-token` from the output for the next).
    List(ListArgs),
    /// A transaction, its branches and its history.
    Show { xid: String },
    /// Drive a parked (NEEDS_ATTENTION) transaction's decision again, after fixing its cause.
    Resume(ActionArgs),
    /// Roll back an undecided TCC transaction, or turn a running saga to compensation.
    Rollback(ActionArgs),
    /// Retry now what waits in backoff.
    Retry(ActionArgs),
}

#[derive(clap::Args)]
struct ListArgs {
    /// Only these statuses (repeatable), e.g. `--status needs_attention --status committing`.
    #[arg(long = "status", value_parser = parse_status)]
    statuses: Vec<wire::TxStatus>,
    /// Only `tcc`, `saga` or `message` transactions.
    #[arg(long, value_parser = parse_kind)]
    kind: Option<wire::TxKind>,
    /// Only xids starting with this.
    #[arg(long)]
    prefix: Option<String>,
    /// Only transactions unchanged for at least this long (`30s`, `10m`, `2h`, `1d`).
    #[arg(long, value_parser = duration::parse)]
    older_than: Option<std::time::Duration>,
    /// Shorthand for `--status needs_attention`.
    #[arg(long)]
    needs_attention: bool,
    /// Page size (at most 500).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    #[arg(long, default_value = "")]
    page_token: String,
}

#[derive(clap::Args)]
struct ActionArgs {
    xid: String,
    /// Why (kept in the transaction's history).
    #[arg(long)]
    reason: String,
    /// Who (kept in the history); defaults to `$DTX_OPERATOR`, then `$USER`.
    #[arg(long, env = "DTX_OPERATOR")]
    operator: Option<String>,
}

fn parse_kind(text: &str) -> Result<wire::TxKind, String> {
    wire::TxKind::from_str_name(&format!("TX_KIND_{}", text.to_ascii_uppercase()))
        .filter(|k| *k != wire::TxKind::Unspecified)
        .ok_or_else(|| format!("{text:?} is not a kind: tcc, saga or message"))
}

fn parse_status(text: &str) -> Result<wire::TxStatus, String> {
    let name = format!("TX_STATUS_{}", text.to_ascii_uppercase().replace('-', "_"));
    wire::TxStatus::from_str_name(&name)
        .filter(|s| *s != wire::TxStatus::Unspecified)
        .ok_or_else(|| {
            format!("{text:?} is not a status (e.g. needs_attention, committing, running)")
        })
}

/// Why the command failed, and the exit code that says so.
struct Failure {
    code: u8,
    message: String,
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Failure {
        // The reason's exit code (`dtx_proto::reason::TABLE`, the README's table of reasons).
        let code = match Reason::of_status(&s) {
            Some(reason) => reason.exit_code(),
            None => match s.code() {
                Code::OutOfRange => 5,
                Code::DeadlineExceeded | Code::Cancelled => 6,
                // The connection failed under the call (tonic reports it as UNKNOWN).
                _ if transport_failure(&s) => 6,
                _ => 1,
            },
        };
        // A connection closed under the call: over TLS, most often a refused certificate.
        let hint = if code == 6 && s.code() != Code::Unavailable {
            " (the coordinator closed the connection: if it requires client certificates, \
             give --cert and --key)"
        } else {
            ""
        };
        Failure {
            code,
            message: format!("{}{hint}", s.message()),
        }
    }
}

/// Whether a status stands for a failed connection rather than an answer of the coordinator.
fn transport_failure(status: &tonic::Status) -> bool {
    let mut next = std::error::Error::source(status);
    while let Some(e) = next {
        if e.is::<tonic::transport::Error>() {
            return true;
        }
        next = e.source();
    }
    false
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let (url, timeout) = (cli.coordinator.clone(), cli.timeout);
    let answered = tokio::time::timeout(timeout, run(cli))
        .await
        .unwrap_or_else(|_| {
            Err(Failure {
                code: 6,
                message: format!(
                    "the coordinator at {url} did not answer within {timeout:?} (--timeout): it \
                     may be stopped, overloaded or not a dtx coordinator"
                ),
            })
        });
    match answered {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("dtx: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// The coordinator's channel: `https://` is TLS (with `--ca`, `--cert`, `--key`), `http://`
/// plain text (and then TLS flags are a mistake, not something to ignore).
async fn connect(cli: &Cli) -> Result<Admin, Failure> {
    let url = cli.coordinator.as_str();
    let usage = |why: String| Failure {
        code: 2,
        message: format!("--coordinator {url:?} {why}"),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| usage(format!("is not a URL: {e} (e.g. http://127.0.0.1:50070)")))?;
    let tls = ClientTls::from_files(
        cli.ca.as_deref(),
        cli.cert.as_deref(),
        cli.key.as_deref(),
        ["--ca", "--cert", "--key"],
    )
    .map_err(|message| Failure { code: 2, message })?;
    match uri.scheme_str() {
        Some("https") if uri.authority().is_some() => {}
        Some("http") if uri.authority().is_some() => {
            if tls.is_configured() {
                return Err(usage(
                    "is plain text (http://) but --ca, --cert or --key was given: use https://"
                        .into(),
                ));
            }
        }
        _ => {
            return Err(usage(
                "is not an http:// or https:// URL (e.g. http://127.0.0.1:50070)".into(),
            ));
        }
    }
    let endpoint = dtx_proto::tls::endpoint(url, Some(&tls))
        .map_err(|message| Failure { code: 2, message })?;
    let channel = endpoint
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| Failure {
            code: 6,
            message: format!(
                "cannot reach the coordinator at {url}: {} (is it running? see --coordinator, \
                 and --ca/--cert/--key for TLS)",
                error_chain(&e)
            ),
        })?;
    let token = match &cli.token {
        Some(token) => Some(dtx_proto::auth::bearer_value(token).map_err(|e| Failure {
            code: 2,
            message: format!("--token: {e}"),
        })?),
        None => None,
    };
    Ok(AdminClient::with_interceptor(channel, Bearer(token)))
}

/// The Admin client, every call carrying the bearer token.
type Admin = AdminClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>` to every call, when a token is given.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert(dtx_proto::auth::AUTHORIZATION, token.clone());
        }
        Ok(request)
    }
}

/// An error and its causes (a TLS failure is several levels down).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

async fn run(cli: Cli) -> Result<String, Failure> {
    if let Command::Token(TokenCommand::New {
        subject,
        tenant,
        roles,
    }) = &cli.command
    {
        return new_token(subject, tenant, roles);
    }
    let mut admin = connect(&cli).await?;
    let json = cli.output == Output::Json;
    match cli.command {
        Command::Stats => {
            let stats = admin.stats(wire::StatsRequest {}).await?.into_inner();
            Ok(output::stats(&stats, json))
        }
        Command::Tx(Tx::List(args)) => {
            let request = wire::ListTransactionsRequest {
                statuses: args.statuses.iter().map(|s| *s as i32).collect(),
                kind: args.kind.unwrap_or(wire::TxKind::Unspecified) as i32,
                xid_prefix: args.prefix.unwrap_or_default(),
                needs_attention: args.needs_attention,
                older_than_ms: args.older_than.map_or(0, |d| d.as_millis() as u64),
                limit: args.limit,
                page_token: args.page_token,
                ..Default::default()
            };
            let page = admin.list_transactions(request).await?.into_inner();
            Ok(output::list(&page, json))
        }
        Command::Tx(Tx::Show { xid }) => {
            let request = wire::DescribeTransactionRequest { xid };
            let detail = admin.describe_transaction(request).await?.into_inner();
            Ok(output::detail(&detail, json))
        }
        Command::Tx(Tx::Resume(args)) => act(&mut admin, Act::Resume, args, json).await,
        Command::Tx(Tx::Rollback(args)) => act(&mut admin, Act::Rollback, args, json).await,
        Command::Tx(Tx::Retry(args)) => act(&mut admin, Act::Retry, args, json).await,
        Command::Token(_) => unreachable!("answered before connecting"),
    }
}

/// `dtx token new`: the token and its token-file line.
fn new_token(subject: &str, tenant: &str, roles: &[String]) -> Result<String, Failure> {
    let usage = |message: String| Failure { code: 2, message };
    dtx_proto::limits::check_operator("--subject", subject).map_err(|e| usage(e.0))?;
    dtx_proto::limits::check_tenant(tenant).map_err(|e| usage(format!("--tenant: {}", e.0)))?;
    let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
    let (token, line) = dtx_proto::auth::new_token(subject, tenant, &roles);
    Ok(format!(
        "token (give it to {subject}; it is not stored anywhere):\n{token}\n\nline for the \
         coordinator's --auth-tokens file:\n{line}"
    ))
}

async fn act(
    admin: &mut Admin,
    which: Act,
    args: ActionArgs,
    json: bool,
) -> Result<String, Failure> {
    let operator = args
        .operator
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "anonymous".into());
    let mut request = tonic::Request::new(wire::AdminActionRequest {
        xid: args.xid,
        reason: args.reason,
    });
    let value = operator.parse().map_err(|_| Failure {
        code: 5,
        message: format!("--operator {operator:?} is not valid metadata text"),
    })?;
    request
        .metadata_mut()
        .insert(dtx_proto::auth::OPERATOR, value);
    let detail = match which {
        Act::Resume => admin.resume(request).await,
        Act::Rollback => admin.force_rollback(request).await,
        Act::Retry => admin.retry_now(request).await,
    }?
    .into_inner();
    Ok(output::detail(&detail, json))
}

/// The operator actions, each an Admin RPC.
enum Act {
    Resume,
    Rollback,
    Retry,
}
