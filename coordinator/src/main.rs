//! `coordinator`: serves the dtx coordinator until SIGTERM or Ctrl-C.
//!
//! Exit codes: 0 stopped by a signal, 1 failed while serving, 2 bad command line or flag
//! value, 3 a listen address cannot be bound, 4 the store cannot be opened (README, "Exit
//! codes").

use std::process::ExitCode;

use clap::Parser;
use dtx_coordinator::config::Config;

#[tokio::main]
async fn main() -> ExitCode {
    match dtx_coordinator::server::main(Config::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coordinator: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
