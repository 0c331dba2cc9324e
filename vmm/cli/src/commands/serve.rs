//! `tiervm serve`: the host-side memory-expander service (docs/service.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::error::Result;
use vmm_core::units::{parse_duration, parse_size};
use vmm_service::config::{host_nodes, Overrides, ServeConfig, ServeFile};

/// Flags of `tiervm serve` (they override the config file).
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (docs/service.md lists the keys).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// API socket (created 0600; its directory 0700 when created).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Directory for VM logs and reports.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Also serve GET /metrics (only) on this TCP address, e.g. 127.0.0.1:9464
    /// (Prometheus scrapes TCP, not Unix sockets).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Fast capacity the service may hand out, e.g. 8G.
    #[arg(long, value_parser = parse_size)]
    pub fast_pool: Option<u64>,
    /// Slow capacity the service may hand out, e.g. 64G.
    #[arg(long, value_parser = parse_size)]
    pub slow_pool: Option<u64>,
    /// Host NUMA node of the fast tier.
    #[arg(long)]
    pub fast_node: Option<u32>,
    /// Host NUMA node of the slow tier.
    #[arg(long)]
    pub slow_node: Option<u32>,
    /// Default placement policy of new VMs.
    #[arg(long)]
    pub policy: Option<String>,
    /// Time between rebalancing rounds.
    #[arg(long, value_parser = parse_duration)]
    pub period: Option<Duration>,
    /// Step of the fast-tier division (a multiple of 2M).
    #[arg(long, value_parser = parse_size)]
    pub quantum: Option<u64>,
    /// Bytes per second rebalancing may move, e.g. 256M.
    #[arg(long, value_parser = parse_size)]
    pub max_move_rate: Option<u64>,
    /// Time a resized VM is left alone by optional moves.
    #[arg(long, value_parser = parse_duration)]
    pub dwell: Option<Duration>,
    /// Run the service's threads and the VMs' threads without seccomp
    /// filters (debugging only; docs/security.md).
    #[arg(long)]
    pub no_seccomp: bool,
}

/// Runs the service until SIGTERM/SIGINT.
pub fn run(args: &ServeArgs) -> Result<i32> {
    let file = match &args.config {
        Some(p) => ServeFile::load(p).map_err(vmm_service::ServeError::from)?,
        None => ServeFile::default(),
    };
    let flags = Overrides {
        socket: args.socket.clone(),
        state_dir: args.state_dir.clone(),
        metrics_listen: args.metrics_listen.clone(),
        fast_node: args.fast_node,
        slow_node: args.slow_node,
        fast_pool: args.fast_pool,
        slow_pool: args.slow_pool,
        policy: args.policy.clone(),
        period: args.period,
        quantum: args.quantum,
        max_move_rate: args.max_move_rate,
        dwell: args.dwell,
    };
    let nodes = host_nodes().map_err(vmm_service::ServeError::from)?;
    let exe = std::env::current_exe().map_err(|source| vmm_service::ServeError::Setup {
        what: "finding the tiervm executable",
        path: "/proc/self/exe".into(),
        source,
    })?;
    let cfg =
        ServeConfig::build(&file, &flags, &nodes, exe).map_err(vmm_service::ServeError::from)?;
    Ok(vmm_service::run(cfg, !args.no_seccomp)?)
}
