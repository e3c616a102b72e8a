//! `coordinator`: serves the dtx coordinator until SIGTERM or Ctrl-C.

use clap::Parser;
use dtx_coordinator::config::Config;

#[tokio::main]
async fn main() -> Result<(), dtx_coordinator::Error> {
    dtx_coordinator::server::main(Config::parse()).await
}
