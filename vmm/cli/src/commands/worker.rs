//! `tiervm __worker` (hidden): one VM of `tiervm serve`, started by the
//! service only ([`vmm_service::vm_process`]).

use std::time::Instant;

use clap::Args;

use crate::error::Result;

/// Flags of the hidden worker mode.
#[derive(Clone, Debug, Args)]
pub struct WorkerArgs {
    /// The inherited socket to the service.
    #[arg(long)]
    pub channel_fd: i32,
}

/// Runs the VM process; returns the process exit code.
pub fn run(args: &WorkerArgs, started: Instant) -> Result<i32> {
    Ok(vmm_service::vm_process::run(args.channel_fd, started)?)
}
