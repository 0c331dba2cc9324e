//! `tiervm run`: boot a guest image and report what it did.

use std::time::{Duration, Instant};

use clap::Args;

use crate::choice::choice;
use crate::error::{OutputError, Result};
use crate::flags::{ReportFormat, VmFlags};
use crate::output;
use crate::presentation::progress::Progress;
use vmm_core::config::{VmConfig, VmRequest};
use vmm_core::report::RunReport;
use vmm_core::runner::{self, Console};
use vmm_core::tiering_config::PolicyArg;
use vmm_core::units::parse_duration;

/// Flags of `tiervm run`.
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// Built-in image (zipf, gups, memcheck, kv, pagerank) or path to a static x86_64 ELF.
    #[arg(default_value = "zipf")]
    pub image: String,
    /// VM settings.
    #[command(flatten)]
    pub vm: VmFlags,
    /// Placement policy (default: none, or static when --fast/--slow is given).
    #[arg(long, value_parser = choice::<PolicyArg>(), help_heading = "Tiering")]
    pub policy: Option<PolicyArg>,
    /// Switch policies while the VM runs, e.g. nomad@0s,tpp@20s.
    #[arg(long, help_heading = "Tiering")]
    pub policy_schedule: Option<String>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Human)]
    pub report: ReportFormat,
    /// No live progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Measure tracking's cost within this run: switch hint-fault tracking on
    /// and off every PERIOD and report both throughputs (`tracking_ab`).
    #[arg(long, value_parser = parse_duration, value_name = "PERIOD", help_heading = "Tiering")]
    pub tracking_ab: Option<Duration>,
    /// TEST ONLY: chaos migrates only the workload's heap.
    #[arg(long, hide = true)]
    pub test_chaos_heap_only: bool,
    /// TEST ONLY: each vCPU thread makes a forbidden system call once its
    /// seccomp filter is installed (proves the filter stops the run).
    #[arg(long, hide = true)]
    pub test_forbidden_syscall: bool,
    /// TEST ONLY: commit transactional migrations without the dirty check
    /// (loses writes; exists to prove the integrity test can fail).
    #[arg(long, hide = true)]
    pub test_skip_dirty_check: bool,
    /// TEST ONLY (cargo feature `fault-injection`): make system calls of the
    /// memory layer fail, e.g. move:every=7:errno=EBUSY,dirty-get:every=5.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true, value_name = "PLAN,...")]
    pub test_fault_inject: Option<String>,
}

impl RunArgs {
    /// The unvalidated VM request these flags describe.
    pub fn request(&self) -> VmRequest {
        let mut tiering = self.vm.tiering(self.policy);
        tiering.policy_schedule = self.policy_schedule.clone();
        tiering.skip_dirty_check = self.test_skip_dirty_check;
        tiering.chaos_heap_only = self.test_chaos_heap_only;
        tiering.tracking_ab = self.tracking_ab;
        #[cfg(feature = "fault-injection")]
        {
            tiering.test_fault_plans = self.test_fault_inject.clone();
        }
        self.vm.request(&self.image, tiering)
    }
}

/// Runs `tiervm run`; returns the process exit code.
pub fn run(args: &RunArgs, started: Instant) -> Result<i32> {
    let mut cfg = VmConfig::from_request(&args.request())?;
    cfg.seccomp_main = cfg.seccomp;
    cfg.test_forbidden_syscall = args.test_forbidden_syscall;
    vmm_core::signals::install()?;
    if !args.quiet {
        cfg.notes()
            .iter()
            .for_each(|n| output::stderr_line(&format!("tiervm: {n}")));
    }
    let mut progress = Progress::stderr("run", cfg.duration, args.quiet);
    let report = runner::run(&cfg, started, Console::Stderr, &mut progress)?;
    progress.finish();
    print_report(&report, args.report)?;
    if let Some(crash) = &report.crash {
        output::stderr_line(&format!("tiervm: guest crashed: {crash}"));
    }
    Ok(match vmm_core::signals::received() {
        Some(sig) => vmm_core::signals::exit_code(sig),
        None => vmm_core::report::code_of(&report),
    })
}

/// Prints a report in the chosen format.
pub fn print_report(report: &RunReport, format: ReportFormat) -> Result<()> {
    let text = match format {
        ReportFormat::Human => report.human(),
        ReportFormat::Json => {
            let mut s = serde_json::to_string(report).map_err(|source| OutputError::Encode {
                what: "the report",
                source,
            })?;
            s.push('\n');
            s
        }
    };
    output::stdout(&text)
}
