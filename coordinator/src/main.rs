//! `coordinator`: serves the dtx coordinator until SIGTERM or Ctrl-C.

use clap::Parser;
use dtx_coordinator::config::Config;

#[tokio::main]
async fn main() -> Result<(), dtx_coordinator::Error> {
    dtx_coordinator::server::init_logging();
    dtx_coordinator::server::run_until_signal(Config::parse()).await
}
