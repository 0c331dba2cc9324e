//! Flags more than one subcommand takes, with the same names, defaults and
//! meaning: the VM flags of `tiervm run` and `tiervm compare`, the report
//! format of `tiervm run` and `tiervm native`, and compare's repeat limit.

use std::time::Duration;

use crate::choice::choice;
use clap::{Args, ValueEnum};
use vmm_core::config::{VmRequest, DEFAULT_SAMPLE_MS};
use vmm_core::tiering_config::{
    MechanismArg, PlacementArg, PolicyArg, TieringRequest, TrackingArg, UnitArg,
};
use vmm_core::units::{parse_duration, parse_size};

/// Most runs per policy `tiervm compare --repeat` accepts.
pub const MAX_REPEAT: u32 = 1000;

/// Report format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// A readable summary on stdout.
    #[default]
    Human,
    /// One JSON object on stdout (schema: docs/report.md).
    Json,
}

/// VM flags shared by `tiervm run` and `tiervm compare` (same names, defaults and meaning).
#[derive(Clone, Debug, Args)]
pub struct VmFlags {
    /// Guest RAM size (multiple of 2M), e.g. 512M, 1G.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub mem: u64,
    /// Number of vCPUs (threads running the workload).
    #[arg(long, default_value_t = 1)]
    pub vcpus: u32,
    /// Run length (then the guest is asked to stop); 0 = until the guest exits.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Workload parameter key=value (repeatable); `tiervm images` lists them.
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// Seed of the guest's random generators (the same for every run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Status-page sampling period in milliseconds (timeline resolution).
    #[arg(long, default_value_t = DEFAULT_SAMPLE_MS)]
    pub sample_ms: u64,
    /// How long the guest gets to finish (e.g. memcheck's final check)
    /// after the stop request; it must acknowledge the stop (leave its
    /// Init and Run phases) within 0.5 s in any case, or the run is forced
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub stop_grace: Duration,
    /// Fast-tier capacity; default: half of --mem.
    #[arg(long, value_parser = parse_size, help_heading = "Tiering")]
    pub fast: Option<u64>,
    /// Slow-tier capacity; default: as much as --mem (the whole guest fits there).
    #[arg(long, value_parser = parse_size, help_heading = "Tiering")]
    pub slow: Option<u64>,
    /// Host NUMA node of the fast tier (default 0).
    #[arg(long, help_heading = "Tiering")]
    pub fast_node: Option<u32>,
    /// Host NUMA node of the slow tier (default: the next node with memory, else the fast node: emulated tiers).
    #[arg(long, help_heading = "Tiering")]
    pub slow_node: Option<u32>,
    /// Initial placement of guest pages (the same for every policy).
    #[arg(long, value_parser = choice::<PlacementArg>(), default_value_t = PlacementArg::FastFirst, help_heading = "Tiering")]
    pub placement: PlacementArg,
    /// Chaos policy only: units migrated per second.
    #[arg(long, help_heading = "Tiering")]
    pub chaos_rate: Option<f64>,
    /// Chaos policy only: promote:demote mix, e.g. 1:1.
    #[arg(long, help_heading = "Tiering")]
    pub chaos_mix: Option<String>,
    /// Chaos policy only: migration mechanism.
    #[arg(long, value_parser = choice::<MechanismArg>(), help_heading = "Tiering")]
    pub mechanism: Option<MechanismArg>,
    /// Chaos policy only: migration unit.
    #[arg(long, value_parser = choice::<UnitArg>(), help_heading = "Tiering")]
    pub chaos_unit: Option<UnitArg>,
    /// Access tracking for policies (hint faults need tiered memory).
    #[arg(long, value_parser = choice::<TrackingArg>(), help_heading = "Tiering")]
    pub tracking: Option<TrackingArg>,
    /// Hint faults: pages unmapped per scan window (adapted to the budget).
    #[arg(long, help_heading = "Tiering")]
    pub scan_pages: Option<usize>,
    /// Hint faults: time between scan windows, e.g. 1s, 200ms.
    #[arg(long, value_parser = parse_duration, help_heading = "Tiering")]
    pub scan_period: Option<Duration>,
    /// Hint faults: maximum share of vCPU time spent in hint faults, percent.
    #[arg(long, help_heading = "Tiering")]
    pub tracking_budget: Option<f64>,
    /// No seccomp filters (debugging only: every thread may make any system call).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Per-policy interval, e.g. mtm=2s,memtis=1s: the migration interval of
    /// memtis and mtm, colloid's quantum (defaults: the papers' 0.5 s, 10 s, 10 ms).
    #[arg(long, value_name = "POLICY=TIME,...", help_heading = "Tiering")]
    pub policy_interval: Option<String>,
    /// The fast tier's capacity over time, e.g. 256M@0s,32M@5s,256M@10s:
    /// a shrink demotes the coldest pages and gives the memory back.
    #[arg(long, value_name = "SIZE@TIME,...", help_heading = "Tiering")]
    pub fast_schedule: Option<String>,
    /// Emulate tier latency in the guest (docs/emulation.md): a preset
    /// (nomad-a, the default; colloid; mtm-pm) and/or fast=LAT,slow=LAT,
    /// fast-bw=GB/s,slow-bw=GB/s,antagonist=TIER:UTIL,queue-k=K,llc=SIZE|0,pay=LAT,sample=N,
    /// e.g. --emulate-latency fast=80ns,slow=250ns.
    #[arg(long, value_name = "SPEC", num_args = 0..=1, default_missing_value = "", help_heading = "Tiering")]
    pub emulate_latency: Option<String>,
    /// A tier, fastest first; repeat for each (any number up to 8), e.g.
    /// --tier fast:node=0:size=256M --tier cxl:node=1:size=1G. Replaces
    /// --fast/--slow/--fast-node/--slow-node.
    #[arg(
        long = "tier",
        value_name = "NAME:node=N:size=SIZE",
        help_heading = "Tiering"
    )]
    pub tiers: Vec<String>,
}

impl VmFlags {
    /// The tiering flags, with `policy`.
    pub fn tiering(&self, policy: Option<PolicyArg>) -> TieringRequest {
        TieringRequest {
            fast: self.fast,
            slow: self.slow,
            fast_node: self.fast_node,
            slow_node: self.slow_node,
            placement: self.placement,
            policy,
            chaos_rate: self.chaos_rate,
            chaos_mix: self.chaos_mix.clone(),
            mechanism: self.mechanism,
            chaos_unit: self.chaos_unit,
            tracking: self.tracking,
            scan_pages: self.scan_pages,
            scan_period: self.scan_period,
            tracking_budget_pct: self.tracking_budget,
            policy_interval: self.policy_interval.clone(),
            fast_schedule: self.fast_schedule.clone(),
            tiers: self.tiers.clone(),
            ..TieringRequest::default()
        }
    }

    /// The unvalidated VM request for `image` with `tiering`.
    pub fn request(&self, image: &str, tiering: TieringRequest) -> VmRequest {
        VmRequest {
            image: image.to_string(),
            args: self.args.clone(),
            mem_bytes: self.mem,
            vcpus: self.vcpus,
            duration: self.duration,
            sample_ms: self.sample_ms,
            seed: self.seed,
            stop_grace: self.stop_grace,
            tiering,
            emulate_latency: self.emulate_latency.clone(),
            seccomp: !self.no_seccomp,
        }
    }
}
