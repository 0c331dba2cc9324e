//! The `tiervm` command line.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use tiervm_cli::commands::{compare, ctl, emulation_check, info, native, run, serve, sim, worker};

/// tiervm: a KVM VMM that places guest memory on fast and slow host tiers.
#[derive(Parser, Debug)]
#[command(name = "tiervm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot a guest image and report its throughput.
    Run(run::RunArgs),
    /// Run one image under several policies and compare them (table, JSON/CSV, SVG plots).
    Compare(compare::CompareArgs),
    /// Show what this host offers (KVM, NUMA, userfaultfd, dirty log, THP).
    Info(info::InfoArgs),
    /// Run a built-in workload natively on host threads (the no-VM baseline).
    Native(native::NativeArgs),
    /// Compare policies in the deterministic simulator (modeled tiers).
    Sim(sim::SimArgs),
    /// List the built-in images and their arguments.
    Images,
    /// Run the host-side memory-expander service for many VMs (docs/service.md).
    Serve(serve::ServeArgs),
    /// Drive a running `tiervm serve` over its socket (every API route).
    Ctl(ctl::CtlArgs),
    /// One VM of `tiervm serve` (started by the service only).
    #[command(name = "__worker", hide = true)]
    Worker(worker::WorkerArgs),
    /// Validate latency emulation on this host: charge linearity, the cache
    /// model, the overhead (docs/emulation.md).
    EmulationCheck(emulation_check::EmulationCheckArgs),
}

fn main() -> ExitCode {
    let started = Instant::now();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TIERVM_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let result = match &cli.command {
        Command::Run(a) => run::run(a, started),
        Command::Compare(a) => compare::run(a, started),
        Command::Info(a) => info::run(a).map(|()| 0).map_err(Into::into),
        Command::Native(a) => native::run(a),
        Command::Sim(a) => sim::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Ctl(a) => ctl::run(a),
        Command::Worker(a) => worker::run(a, started),
        Command::EmulationCheck(a) => emulation_check::run(a, started),
        Command::Images => tiervm_cli::output::stdout(&images_text()).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            tiervm_cli::output::stderr_line(&format!("tiervm: error: {}", e.describe()));
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

fn images_text() -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for spec in tiervm_guest::workloads::IMAGES {
        let _ = writeln!(s, "{}: {}", spec.name, spec.about);
        for a in spec.args {
            let _ = writeln!(s, "    {:<13} default {:<7} {}", a.key, a.default, a.help);
        }
    }
    s
}
