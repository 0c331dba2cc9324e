//! Validated tiering settings of a VM (`--fast`, `--slow`, nodes, placement,
//! policy, chaos), built from command-line flags.

use std::time::Duration;

use tiering::engine::{
    parse_intervals, parse_schedule, EngineConfig, IntervalError, ModeledLatency, ScheduleError,
};

use tiering::mem::{
    parse_capacity_schedule, ChaosConfig, InitialPlacement, Mechanism, MemConfig, ResizeConfig,
    SamplerConfig, PAGE_SIZE,
};
use tiering::policy::PolicyKind;

use crate::choice::choices;
use crate::units::format_size;

/// Hint-fault budget of placement policies (MTM's overhead target, §3.2).
pub const POLICY_TRACKING_BUDGET_PCT: f64 = 5.0;
/// Highest `--chaos-rate` in units per second: 40x what the mechanisms reach
/// here (about 250k pages/s, docs/results.md); higher rates only mean
/// "as fast as possible", which this already is.
pub const MAX_CHAOS_RATE: f64 = 10_000_000.0;
/// Largest weight of `--chaos-mix` (a ratio needs no more).
pub const MAX_CHAOS_WEIGHT: u32 = 1_000_000;

choices! {
    /// Initial placement of guest pages.
    pub enum PlacementArg ("placement") {
        FastFirst = "fast-first": "Fill the fast tier first (Linux's default)",
        SlowFirst = "slow-first": "Everything starts slow (the seeds' pre-demoted runs), overflow fast",
        Random = "random": "Each page on a random tier (seeded)",
        Interleave = "interleave": "Alternate fast and slow",
    }

    /// Who moves pages.
    pub enum PolicyArg ("policy") {
        None = "none": "Untiered: plain anonymous RAM (THP), no tracking, no migration",
        Static = "static": "Tiered backing, pages never move",
        Chaos = "chaos": "Torture mode: random units migrate at --chaos-rate regardless of hotness",
        Tpp = "tpp": "Linux 6.3 TPP: hint faults on slow pages, promotion in the fault path",
        Nomad = "nomad": "Nomad: TPP's signal, candidate/pending queues, async TPM, shadows",
        Memtis = "memtis": "Memtis: access histogram, cooling, background migration",
        Colloid = "colloid": "Colloid: balances the tiers' loaded latencies (modeled here)",
        Mtm = "mtm": "MTM: adaptive regions, one histogram, fast promotion / slow demotion",
        Adaptive = "adaptive": "tiervm's own: budgeted profiling, per-migration mechanism choice, \
            thrash throttling, Colloid balancing; its mode shown live",
    }
}

impl PolicyArg {
    /// The placement policy the engine runs for this choice (`none` and
    /// `chaos` are not placement policies). The one place the CLI's policy
    /// names map to the tiering crate's.
    pub fn placement_policy(self) -> Option<PolicyKind> {
        Some(match self {
            Self::None | Self::Chaos => return None,
            Self::Static => PolicyKind::Static,
            Self::Tpp => PolicyKind::Tpp,
            Self::Nomad => PolicyKind::Nomad,
            Self::Memtis => PolicyKind::Memtis,
            Self::Colloid => PolicyKind::Colloid,
            Self::Mtm => PolicyKind::Mtm,
            Self::Adaptive => PolicyKind::Adaptive,
        })
    }
}

impl PlacementArg {
    /// The backing's placement (`Random` draws from `seed`).
    pub fn to_placement(self, seed: u64) -> InitialPlacement {
        match self {
            Self::FastFirst => InitialPlacement::FastFirst,
            Self::SlowFirst => InitialPlacement::SlowFirst,
            Self::Random => InitialPlacement::Random { seed },
            Self::Interleave => InitialPlacement::Interleave,
        }
    }
}

choices! {
    /// Migration mechanism for chaos.
    pub enum MechanismArg ("mechanism") {
        Tpm = "tpm": "Transactional migration (copy while running, commit if clean)",
        StopCopy = "stop-copy": "Exclusive stop-and-copy",
    }
}

impl MechanismArg {
    /// The mechanism it names.
    pub fn to_mechanism(self) -> Mechanism {
        match self {
            Self::Tpm => Mechanism::TPM,
            Self::StopCopy => Mechanism::StopAndCopy,
        }
    }
}

choices! {
    /// Migration unit for chaos.
    pub enum UnitArg ("unit") {
        Page4k = "4k": "One 4 KiB page",
        Run2m = "2m": "A 2 MiB aligned run of 512 pages",
    }
}

impl UnitArg {
    /// Pages per unit.
    pub fn pages(self) -> usize {
        match self {
            Self::Page4k => 1,
            Self::Run2m => 512,
        }
    }
}

/// Tiering flags as parsed (unvalidated).
///
/// Also the tiering part of a VM's description on the wire (the service
/// to its VM processes, its VM records): flag names as field names,
/// choices as their flag values, durations as float seconds (`_s`),
/// fields left out (or `null`) taking their defaults.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TieringRequest {
    /// `--fast`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast: Option<u64>,
    /// `--slow`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow: Option<u64>,
    /// `--fast-node`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_node: Option<u32>,
    /// `--slow-node`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_node: Option<u32>,
    /// `--placement`.
    pub placement: PlacementArg,
    /// `--policy` (None = not given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyArg>,
    /// `--chaos-rate` units per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chaos_rate: Option<f64>,
    /// `--chaos-mix P:D`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chaos_mix: Option<String>,
    /// `--mechanism`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<MechanismArg>,
    /// `--chaos-unit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chaos_unit: Option<UnitArg>,
    /// Test-only: commit migrations without the dirty check.
    #[serde(skip_serializing_if = "is_false")]
    pub skip_dirty_check: bool,
    /// Test-only: failures to inject into the memory layer's system calls
    /// (`tiering::inject::FaultPlan` specs, comma-separated). Set by tests in
    /// process, or by `--test-fault-inject` in builds with the
    /// `fault-injection` feature.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_fault_plans: Option<String>,
    /// `--tracking`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingArg>,
    /// `--scan-pages`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scan_pages: Option<usize>,
    /// `--scan-period`.
    #[serde(
        rename = "scan_period_s",
        with = "crate::units::opt_secs",
        skip_serializing_if = "Option::is_none"
    )]
    pub scan_period: Option<Duration>,
    /// `--tracking-budget` (percent of vCPU time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracking_budget_pct: Option<f64>,
    /// `--policy-schedule` (e.g. `nomad@0s,tpp@20s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_schedule: Option<String>,
    /// `--policy-interval` (e.g. `mtm=2s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_interval: Option<String>,
    /// Test-only: chaos migrates only the workload's heap (not the image,
    /// stacks, page tables or status page).
    #[serde(skip_serializing_if = "is_false")]
    pub chaos_heap_only: bool,
    /// Measurement: switch hint-fault tracking on and off every this long.
    #[serde(
        rename = "tracking_ab_s",
        with = "crate::units::opt_secs",
        skip_serializing_if = "Option::is_none"
    )]
    pub tracking_ab: Option<Duration>,
    /// `--fast-schedule` (e.g. `256M@0s,32M@5s,256M@10s`): the fast tier's
    /// capacity over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_schedule: Option<String>,
    /// `--tier NAME:node=N:size=SIZE`, repeated, fastest first (instead of
    /// `--fast`/`--slow`/`--fast-node`/`--slow-node`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<String>,
}

/// Whether `b` is false (test-only switches are left out of the wire
/// format while off).
fn is_false(b: &bool) -> bool {
    !*b
}

choices! {
    /// Access tracking.
    pub enum TrackingArg ("tracking") {
        Off = "off": "No access tracking",
        HintFaults = "hint-faults": "Hint faults: unmap windows of pages and record the guest's touches",
        Damon = "damon": "DAMON: the kernel samples guest RAM's accessed bits (KVM's too); \
            needs TIERVM_ALLOW_DAMON_WRITES=1 and no other DAMON user",
    }
}

impl Default for TieringRequest {
    fn default() -> Self {
        Self {
            fast: None,
            slow: None,
            fast_node: None,
            slow_node: None,
            placement: PlacementArg::FastFirst,
            policy: None,
            chaos_rate: None,
            chaos_mix: None,
            mechanism: None,
            chaos_unit: None,
            skip_dirty_check: false,
            test_fault_plans: None,
            tracking: None,
            scan_pages: None,
            scan_period: None,
            tracking_budget_pct: None,
            policy_schedule: None,
            policy_interval: None,
            chaos_heap_only: false,
            tracking_ab: None,
            fast_schedule: None,
            tiers: Vec::new(),
        }
    }
}

/// Validated tiering settings.
#[derive(Clone, Debug)]
pub struct TieringConfig {
    /// The backing's configuration.
    pub mem: MemConfig,
    /// The policy.
    pub policy: PolicyArg,
    /// Chaos settings when `policy == Chaos`.
    pub chaos: Option<ChaosConfig>,
    /// Test-only switch.
    pub skip_dirty_check: bool,
    /// Test-only: injected system-call failures.
    pub fault_plans: Vec<tiering::inject::FaultPlan>,
    /// Hint-fault sampler settings when tracking is on.
    pub sampler: Option<SamplerConfig>,
    /// The policy engine, for the placement policies.
    pub engine: Option<EngineConfig>,
    /// Switch tracking on and off every this long (A/B measurement).
    pub tracking_ab: Option<Duration>,
    /// Capacity changes while the VM runs (`--fast-schedule`) and the
    /// settings of the driver that converges them.
    pub resize: ResizeConfig,
}

/// The policies `--policy-schedule` and `--policy-interval` accept, for messages.
fn placement_policies() -> String {
    PolicyKind::names(&PolicyKind::POLICIES)
}

/// A tiering setting that cannot be used; each message names the fix.
#[derive(Debug, thiserror::Error)]
pub enum TieringConfigError {
    /// A test fault plan that does not parse.
    #[error("--test-fault-inject")]
    BadFaultPlan(#[source] tiering::inject::FaultPlanError),
    /// `--tier` together with `--fast`/`--slow`/`--fast-node`/`--slow-node`.
    #[error(
        "--tier describes every tier: drop --fast/--slow/--fast-node/--slow-node, or drop --tier"
    )]
    TierFlagsMixed,
    /// A `--tier` that does not parse.
    #[error("--tier {spec}")]
    BadTier {
        /// What was given.
        spec: String,
        /// Why it is wrong (names the fix).
        #[source]
        why: TierFlagError,
    },
    /// More tiers than tiervm supports.
    #[error(
        "{n} --tier flags: tiervm supports at most {} tiers",
        tiering::vocab::MAX_TIERS
    )]
    TooManyTiers {
        /// How many were given.
        n: usize,
    },
    /// `--tier` sizes that cannot hold the guest.
    #[error("the --tier sizes ({}) cannot hold --mem {}: raise a tier's size (the slowest, usually)", format_size(*.total), format_size(*.mem))]
    TierFlagsCannotHoldMem {
        /// Their sum.
        total: u64,
        /// `--mem`.
        mem: u64,
    },
    /// A `--fast-schedule` that does not parse.
    #[error("--fast-schedule")]
    BadFastSchedule(#[source] tiering::mem::CapacityScheduleError),
    /// A `--fast-schedule` size the tiers could not honour.
    #[error("--fast-schedule {} at {at:.1} s: {why}", format_size(*.size))]
    FastScheduleDoesNotFit {
        /// The scheduled size.
        size: u64,
        /// When, seconds.
        at: f64,
        /// Why (names the fix).
        why: String,
    },
    /// `--tracking damon` without a placement policy.
    #[error(
        "--tracking damon feeds a placement policy: add --policy static, memtis, mtm or colloid"
    )]
    DamonWithoutPolicy,
    /// `--tracking damon` with hint-fault window flags.
    #[error("--scan-pages/--scan-period/--tracking-budget set hint-fault windows: drop them with --tracking damon")]
    DamonWithWindowFlags,
    /// `--tracking damon` with a policy that needs hint faults.
    #[error("--tracking damon gives accessed bits and samples, not hint faults: tpp and nomad need --tracking hint-faults")]
    DamonWithHintFaultPolicy,
    /// DAMON cannot be used on this host.
    #[error("--tracking damon")]
    Damon(#[source] tiering::tracking::damon::DamonError),
    /// Chaos flags without `--policy chaos`.
    #[error("--chaos-rate/--chaos-mix/--mechanism/--chaos-unit only apply to --policy chaos: add --policy chaos or drop them")]
    ChaosFlagsWithoutChaos,
    /// Tier flags with `--policy none`.
    #[error("--policy none runs untiered: drop --fast/--slow/--fast-node/--slow-node/--tracking or pick another policy")]
    UntieredWithTierFlags,
    /// Schedule or interval flags with `--policy none`.
    #[error("--policy-schedule/--policy-interval need a placement policy: add --fast SIZE or --policy ({})", placement_policies())]
    UntieredWithSchedule,
    /// `--fast` above `--mem`.
    #[error("--fast {} exceeds --mem {}: lower --fast", format_size(*.fast), format_size(*.mem))]
    FastExceedsMem {
        /// Fast-tier bytes.
        fast: u64,
        /// Guest RAM bytes.
        mem: u64,
    },
    /// `--fast` not page-aligned.
    #[error("--fast {} is not a multiple of 4K", format_size(*.fast))]
    FastNotPageMultiple {
        /// Fast-tier bytes.
        fast: u64,
    },
    /// `--slow` not page-aligned.
    #[error("--slow {} is not a multiple of 4K", format_size(*.slow))]
    SlowNotPageMultiple {
        /// Slow-tier bytes.
        slow: u64,
    },
    /// The tiers together are smaller than the guest.
    #[error("--fast {} + --slow {} cannot hold --mem {}: raise --fast or --slow (or drop --slow: it then holds the whole guest)", format_size(*.fast), format_size(*.slow), format_size(*.mem))]
    TiersCannotHoldMem {
        /// Fast-tier bytes.
        fast: u64,
        /// Slow-tier bytes.
        slow: u64,
        /// Guest RAM bytes.
        mem: u64,
    },
    /// An explicitly sized tier larger than the NUMA node backing it.
    #[error("{flag} {} exceeds NUMA node {node}'s memory ({}): lower {flag}", format_size(*.size), format_size(*.total))]
    TierExceedsNode {
        /// `--fast` or `--slow`.
        flag: &'static str,
        /// The size asked for.
        size: u64,
        /// The node.
        node: u32,
        /// The node's memory.
        total: u64,
    },
    /// A tier node the host does not have.
    #[error("{flag} {node}: this host has NUMA nodes with memory {} (see tiervm info)", join(.nodes))]
    NoSuchNode {
        /// `--fast-node` or `--slow-node`.
        flag: &'static str,
        /// The node asked for.
        node: u32,
        /// The host's nodes with memory.
        nodes: Vec<u32>,
    },
    /// `--chaos-mix` not `P:D`.
    #[error("--chaos-mix '{mix}' is not P:D with whole numbers, e.g. 1:1 or 3:1")]
    BadChaosMix {
        /// The flag's value.
        mix: String,
    },
    /// `--chaos-mix 0:0`.
    #[error("--chaos-mix 0:0 migrates nothing: give at least one non-zero weight")]
    EmptyChaosMix,
    /// `--chaos-mix` weights whose sum does not fit a u32.
    #[error(
        "--chaos-mix '{mix}': the weights must add up to at most 4294967295: give a ratio like 3:1"
    )]
    ChaosMixOverflow {
        /// The flag's value.
        mix: String,
    },
    /// `--chaos-rate` not positive.
    #[error("--chaos-rate {rate}: give a positive number of units per second")]
    BadChaosRate {
        /// The flag's value.
        rate: f64,
    },
    /// `--chaos-rate` beyond [`MAX_CHAOS_RATE`].
    #[error("--chaos-rate {rate} exceeds the {MAX_CHAOS_RATE} units/s maximum (the mechanisms reach about 250k pages/s): lower --chaos-rate")]
    ChaosRateTooHigh {
        /// The flag's value.
        rate: f64,
    },
    /// A `--chaos-mix` weight beyond [`MAX_CHAOS_WEIGHT`].
    #[error("--chaos-mix '{mix}': weights go up to {MAX_CHAOS_WEIGHT}; give the ratio in small numbers, e.g. 3:1")]
    ChaosWeightTooLarge {
        /// The flag's value.
        mix: String,
    },
    /// `--scan-pages` beyond the guest's pages.
    #[error(
        "--scan-pages {n} exceeds the guest's {guest_pages} pages: give at most {guest_pages}"
    )]
    TooManyScanPages {
        /// The flag's value.
        n: usize,
        /// Pages of guest RAM.
        guest_pages: u64,
    },
    /// `--policy-schedule` with a policy the engine does not run (chaos).
    #[error(
        "--policy-schedule needs a placement policy ({})",
        placement_policies()
    )]
    ScheduleWithoutPlacementPolicy,
    /// `--policy-interval` with a policy the engine does not run (chaos).
    #[error(
        "--policy-interval needs a placement policy ({})",
        placement_policies()
    )]
    IntervalWithoutPlacementPolicy,
    /// `--policy-schedule` does not parse.
    #[error("--policy-schedule")]
    Schedule(#[source] ScheduleError),
    /// `--policy-interval` does not parse.
    #[error("--policy-interval")]
    Interval(#[source] IntervalError),
    /// Sampler flags with tracking off.
    #[error("--scan-pages/--scan-period/--tracking-budget need --tracking hint-faults")]
    TrackingFlagsWithoutTracking,
    /// `--scan-pages 0`.
    #[error("--scan-pages 0: give at least 1 page per scan window")]
    NoScanPages,
    /// `--scan-period` below 1 ms.
    #[error("--scan-period must be at least 1ms")]
    ScanPeriodTooShort,
    /// `--tracking-budget` outside (0, 100].
    #[error("--tracking-budget {budget}: give a share of vCPU time in percent, 0 < budget <= 100")]
    BadTrackingBudget {
        /// The flag's value.
        budget: f64,
    },
    /// `--tracking-ab` without tracking.
    #[error("--tracking-ab needs --tracking hint-faults (or a policy that tracks)")]
    TrackingAbWithoutTracking,
    /// `--tracking-ab` below 200 ms.
    #[error("--tracking-ab must be at least 200ms")]
    TrackingAbTooShort,
}

fn join(nodes: &[u32]) -> String {
    let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
    list.join(", ")
}

type Checked<T> = std::result::Result<T, TieringConfigError>;

/// Parses `P:D` with positive integer weights.
pub fn parse_mix(s: &str) -> Checked<(u32, u32)> {
    let bad = || TieringConfigError::BadChaosMix { mix: s.into() };
    let (p, d) = s.split_once(':').ok_or_else(bad)?;
    let p: u32 = p.trim().parse().map_err(|_| bad())?;
    let d: u32 = d.trim().parse().map_err(|_| bad())?;
    if p > MAX_CHAOS_WEIGHT || d > MAX_CHAOS_WEIGHT {
        return Err(TieringConfigError::ChaosWeightTooLarge { mix: s.into() });
    }
    if p == 0 && d == 0 {
        return Err(TieringConfigError::EmptyChaosMix);
    }
    // The chaos driver draws from p + d (a u32).
    if p.checked_add(d).is_none() {
        return Err(TieringConfigError::ChaosMixOverflow { mix: s.into() });
    }
    Ok((p, d))
}

impl TieringRequest {
    /// Whether any tiering flag asks for tiered memory.
    pub fn wants_tiering(&self) -> bool {
        match self.policy {
            Some(PolicyArg::None) => false,
            Some(_) => true,
            None => self.fast.is_some() || self.slow.is_some() || !self.tiers.is_empty(),
        }
    }

    /// Validates against a guest of `mem_bytes`; `None` = untiered. The
    /// steps: which policy, the flags it allows, the backing (tier sizes,
    /// nodes, placement), chaos, the engine, the sampler, A/B tracking.
    pub fn validate(
        &self,
        mem_bytes: u64,
        seed: u64,
        nodes: &[u32],
    ) -> Checked<Option<TieringConfig>> {
        let policy = self.effective_policy();
        if self.has_chaos_flags() && policy != PolicyArg::Chaos {
            return Err(TieringConfigError::ChaosFlagsWithoutChaos);
        }
        if policy == PolicyArg::None {
            self.check_untiered()?;
            return Ok(None);
        }
        let mem = self.backing(mem_bytes, seed, nodes)?;
        let guest_pages = mem_bytes / PAGE_SIZE as u64;
        if let Some(n) = self.scan_pages.filter(|&n| n as u64 > guest_pages) {
            return Err(TieringConfigError::TooManyScanPages { n, guest_pages });
        }
        let chaos = self.chaos(policy, seed)?;
        let mut engine = self.engine(policy)?;
        let sampler = self.sampler(engine.as_ref())?;
        if self.tracking == Some(TrackingArg::Damon) {
            engine = Some(damon_engine(engine, self.tracking_flags())?);
        }
        let tracking_ab = self.tracking_ab(sampler.is_some())?;
        let resize = self.resize(&mem)?;
        Ok(Some(TieringConfig {
            resize,
            mem,
            policy,
            chaos,
            skip_dirty_check: self.skip_dirty_check,
            fault_plans: match &self.test_fault_plans {
                Some(s) => s
                    .split(',')
                    .map(tiering::inject::FaultPlan::parse)
                    .collect::<Result<_, _>>()
                    .map_err(TieringConfigError::BadFaultPlan)?,
                None => Vec::new(),
            },
            tracking_ab,
            sampler,
            engine,
        }))
    }

    /// `--policy`, or its default: static when a tier size is given, else none.
    fn effective_policy(&self) -> PolicyArg {
        self.policy.unwrap_or(if self.wants_tiering() {
            PolicyArg::Static
        } else {
            PolicyArg::None
        })
    }

    fn has_chaos_flags(&self) -> bool {
        self.chaos_rate.is_some()
            || self.chaos_mix.is_some()
            || self.mechanism.is_some()
            || self.chaos_unit.is_some()
    }

    /// `--policy none` takes no tiering flag.
    fn check_untiered(&self) -> Checked<()> {
        if self.fast.is_some()
            || self.slow.is_some()
            || self.fast_node.is_some()
            || self.slow_node.is_some()
            || !self.tiers.is_empty()
            || self.fast_schedule.is_some()
            || self.tracking.is_some_and(|t| t != TrackingArg::Off)
        {
            return Err(TieringConfigError::UntieredWithTierFlags);
        }
        if self.policy_schedule.is_some() || self.policy_interval.is_some() {
            return Err(TieringConfigError::UntieredWithSchedule);
        }
        Ok(())
    }

    /// Tier sizes (default: half the guest fast, the whole guest slow),
    /// their host nodes and the initial placement.
    fn backing(&self, mem_bytes: u64, seed: u64, nodes: &[u32]) -> Checked<MemConfig> {
        if !self.tiers.is_empty() {
            return self.backing_from_tier_flags(mem_bytes, seed, nodes);
        }
        let page = PAGE_SIZE as u64;
        let fast = self.fast.unwrap_or(mem_bytes / 2 / page * page);
        if fast > mem_bytes {
            return Err(TieringConfigError::FastExceedsMem {
                fast,
                mem: mem_bytes,
            });
        }
        if !fast.is_multiple_of(page) {
            return Err(TieringConfigError::FastNotPageMultiple { fast });
        }
        // Default: the slow tier can hold the whole guest (a large expander),
        // which leaves room for demotions and shadows.
        let slow = self.slow.unwrap_or(mem_bytes);
        if !slow.is_multiple_of(page) {
            return Err(TieringConfigError::SlowNotPageMultiple { slow });
        }
        // Summed wide: sizes near u64::MAX must not wrap (or panic).
        if u128::from(fast) + u128::from(slow) < u128::from(mem_bytes) {
            return Err(TieringConfigError::TiersCannotHoldMem {
                fast,
                slow,
                mem: mem_bytes,
            });
        }
        let (fast_node, slow_node) = self.tier_nodes(nodes)?;
        self.check_tiers_fit_nodes(fast, fast_node, slow_node)?;
        let mut mem = MemConfig::two_tier(
            mem_bytes as usize,
            (fast / page) as usize,
            (slow / page) as usize,
            fast_node,
            slow_node,
        );
        mem.placement = self.placement.to_placement(seed);
        Ok(mem)
    }

    /// `--tier NAME:node=N:size=SIZE ...`: any number of tiers, fastest
    /// first. Each must fit its node; together they must hold the guest.
    fn backing_from_tier_flags(
        &self,
        mem_bytes: u64,
        seed: u64,
        nodes: &[u32],
    ) -> Checked<MemConfig> {
        if self.fast.is_some()
            || self.slow.is_some()
            || self.fast_node.is_some()
            || self.slow_node.is_some()
        {
            return Err(TieringConfigError::TierFlagsMixed);
        }
        let page = PAGE_SIZE as u64;
        let mut tiers = Vec::new();
        let mut total: u128 = 0;
        for spec in &self.tiers {
            let t = parse_tier(spec).map_err(|why| TieringConfigError::BadTier {
                spec: spec.clone(),
                why,
            })?;
            if !nodes.is_empty() && !nodes.contains(&t.node) {
                return Err(TieringConfigError::NoSuchNode {
                    flag: "--tier",
                    node: t.node,
                    nodes: nodes.to_vec(),
                });
            }
            if let Some(total) = tiering::host::numa_nodes()
                .ok()
                .and_then(|v| v.into_iter().find(|x| x.id == t.node))
                .map(|x| x.mem_total_bytes)
            {
                if t.size > total {
                    return Err(TieringConfigError::TierExceedsNode {
                        flag: "--tier",
                        size: t.size,
                        node: t.node,
                        total,
                    });
                }
            }
            total += u128::from(t.size);
            let pages = (t.size / page) as usize;
            tiers.push(tiering::mem::TierSpec {
                name: t.name,
                node: t.node,
                capacity_pages: pages,
                max_capacity_pages: pages.max((mem_bytes / page) as usize),
            });
        }
        if tiers.len() > tiering::vocab::MAX_TIERS {
            return Err(TieringConfigError::TooManyTiers { n: tiers.len() });
        }
        if total < u128::from(mem_bytes) {
            return Err(TieringConfigError::TierFlagsCannotHoldMem {
                total: total.min(u128::from(u64::MAX)) as u64,
                mem: mem_bytes,
            });
        }
        let mut mem = MemConfig::two_tier(mem_bytes as usize, 0, 0, 0, 0);
        mem.tiers = tiers;
        mem.placement = self.placement.to_placement(seed);
        Ok(mem)
    }

    /// The fast tier's node (default: the first node with memory) and the
    /// slow tier's (default: another node, else the same: emulated tiers).
    fn tier_nodes(&self, nodes: &[u32]) -> Checked<(u32, u32)> {
        let fast_node = self
            .fast_node
            .unwrap_or_else(|| nodes.first().copied().unwrap_or(0));
        let slow_node = self.slow_node.unwrap_or_else(|| {
            nodes
                .iter()
                .copied()
                .find(|&n| n != fast_node)
                .unwrap_or(fast_node)
        });
        for (flag, node) in [("--fast-node", fast_node), ("--slow-node", slow_node)] {
            if !nodes.is_empty() && !nodes.contains(&node) {
                return Err(TieringConfigError::NoSuchNode {
                    flag,
                    node,
                    nodes: nodes.to_vec(),
                });
            }
        }
        Ok((fast_node, slow_node))
    }

    /// Lazy commit: a tier's capacity is a limit, not an allocation. A tier
    /// the user sized explicitly must fit the node that backs it (it could
    /// never be honoured otherwise); the default slow tier is "whatever the
    /// guest needs" and may overcommit the host, guarded at run time (a
    /// touch the host cannot back stops the run cleanly).
    fn check_tiers_fit_nodes(&self, fast: u64, fast_node: u32, slow_node: u32) -> Checked<()> {
        let node_total = |n: u32| {
            tiering::host::numa_nodes()
                .ok()
                .and_then(|v| v.into_iter().find(|x| x.id == n))
                .map(|x| x.mem_total_bytes)
        };
        let explicit = [
            ("--fast", Some(fast), fast_node),
            ("--slow", self.slow, slow_node),
        ];
        for (flag, size, node) in explicit {
            if let (Some(size), Some(total)) = (size, node_total(node)) {
                if size > total {
                    return Err(TieringConfigError::TierExceedsNode {
                        flag,
                        size,
                        node,
                        total,
                    });
                }
            }
        }
        Ok(())
    }

    /// The chaos driver's settings, for `--policy chaos`.
    fn chaos(&self, policy: PolicyArg, seed: u64) -> Checked<Option<ChaosConfig>> {
        if policy != PolicyArg::Chaos {
            return Ok(None);
        }
        let (promote_weight, demote_weight) =
            parse_mix(self.chaos_mix.as_deref().unwrap_or("1:1"))?;
        let rate = self.chaos_rate.unwrap_or(1000.0);
        if !rate.is_finite() || rate <= 0.0 {
            return Err(TieringConfigError::BadChaosRate { rate });
        }
        if rate > MAX_CHAOS_RATE {
            return Err(TieringConfigError::ChaosRateTooHigh { rate });
        }
        Ok(Some(ChaosConfig {
            units_per_sec: rate,
            promote_weight,
            demote_weight,
            mechanism: self.mechanism.unwrap_or(MechanismArg::Tpm).to_mechanism(),
            unit_pages: self.chaos_unit.unwrap_or(UnitArg::Page4k).pages(),
            seed,
            ..ChaosConfig::default()
        }))
    }

    /// The policy engine, for placement policies: the first policy (or the
    /// schedule's, when it starts at 0), the schedule and interval overrides.
    fn engine(&self, policy: PolicyArg) -> Checked<Option<EngineConfig>> {
        let Some(first) = policy.placement_policy() else {
            if self.policy_schedule.is_some() {
                return Err(TieringConfigError::ScheduleWithoutPlacementPolicy);
            }
            if self.policy_interval.is_some() {
                return Err(TieringConfigError::IntervalWithoutPlacementPolicy);
            }
            return Ok(None);
        };
        let schedule = match &self.policy_schedule {
            Some(s) => parse_schedule(s).map_err(TieringConfigError::Schedule)?,
            None => Vec::new(),
        };
        // A schedule starting at 0 names the first policy itself.
        let first = match schedule.first() {
            Some(s) if s.at.is_zero() => s.policy,
            _ => first,
        };
        let intervals = match &self.policy_interval {
            Some(s) => parse_intervals(s).map_err(TieringConfigError::Interval)?,
            None => Vec::new(),
        };
        Ok(Some(EngineConfig {
            policy: first,
            schedule,
            modeled_latency: Some(ModeledLatency::default()),
            live_latency: None,
            intervals,
            damon: None,
        }))
    }

    /// The hint-fault sampler. Policies that learn from access samples
    /// (all but static and mtm, which probes the accessed bits of its own
    /// sampled pages) get hint-fault windows unless --tracking says
    /// otherwise, with MTM's 5% profiling budget.
    fn sampler(&self, engine: Option<&EngineConfig>) -> Checked<Option<SamplerConfig>> {
        let wants_samples = engine
            .and_then(schedule_trackers)
            .is_some_and(|t| !t.hint_fault_tiers.is_empty() || t.sample_period > 0);
        let default_tracking = if wants_samples {
            TrackingArg::HintFaults
        } else {
            TrackingArg::Off
        };
        let tracking_flags = self.tracking_flags();
        match self.tracking.unwrap_or(default_tracking) {
            // DAMON replaces the sampler (see `damon_engine`).
            TrackingArg::Damon => Ok(None),
            TrackingArg::Off if tracking_flags => {
                Err(TieringConfigError::TrackingFlagsWithoutTracking)
            }
            TrackingArg::Off => Ok(None),
            TrackingArg::HintFaults => {
                let mut c = SamplerConfig::default();
                if wants_samples {
                    // An idle engine (static) keeps the 2% default.
                    c.budget_pct = POLICY_TRACKING_BUDGET_PCT;
                }
                self.apply_sampler_flags(&mut c)?;
                Ok(Some(c))
            }
        }
    }

    /// `--fast-schedule`: each size must keep the tiers able to hold the
    /// guest and fit the fast tier's reservation (the whole guest).
    fn resize(&self, mem: &MemConfig) -> Checked<ResizeConfig> {
        let mut cfg = ResizeConfig::default();
        let Some(s) = &self.fast_schedule else {
            return Ok(cfg);
        };
        let steps = parse_capacity_schedule(s).map_err(TieringConfigError::BadFastSchedule)?;
        let page = PAGE_SIZE as u64;
        let guest = mem.guest_bytes / PAGE_SIZE;
        let others: usize = mem.tiers.iter().skip(1).map(|t| t.capacity_pages).sum();
        for st in &steps {
            let size = st.pages as u64 * page;
            let at = st.at.as_secs_f64();
            if st.pages > mem.tiers[0].max_capacity_pages {
                return Err(TieringConfigError::FastScheduleDoesNotFit {
                    size,
                    at,
                    why: format!(
                        "exceeds the fast tier's maximum ({}): lower it",
                        format_size(mem.tiers[0].max_capacity_pages as u64 * page)
                    ),
                });
            }
            if st.pages.saturating_add(others) < guest {
                return Err(TieringConfigError::FastScheduleDoesNotFit {
                    size,
                    at,
                    why: format!(
                        "with --slow {} the tiers could not hold --mem {}: raise it or --slow",
                        format_size(others as u64 * page),
                        format_size(guest as u64 * page)
                    ),
                });
            }
        }
        cfg.schedules.push((0, steps));
        Ok(cfg)
    }

    /// Whether any hint-fault window flag was given.
    fn tracking_flags(&self) -> bool {
        self.scan_pages.is_some()
            || self.scan_period.is_some()
            || self.tracking_budget_pct.is_some()
    }

    /// `--scan-pages`, `--scan-period` and `--tracking-budget`.
    fn apply_sampler_flags(&self, c: &mut SamplerConfig) -> Checked<()> {
        if let Some(n) = self.scan_pages {
            if n == 0 {
                return Err(TieringConfigError::NoScanPages);
            }
            c.scan_pages = n;
            c.max_scan_pages = c.max_scan_pages.max(n);
            c.min_scan_pages = c.min_scan_pages.min(n);
        }
        if let Some(p) = self.scan_period {
            if p < Duration::from_millis(1) {
                return Err(TieringConfigError::ScanPeriodTooShort);
            }
            c.period = p;
        }
        if let Some(b) = self.tracking_budget_pct {
            if !(b > 0.0 && b <= 100.0) {
                return Err(TieringConfigError::BadTrackingBudget { budget: b });
            }
            c.budget_pct = b;
        }
        Ok(())
    }

    /// `--tracking-ab`: needs a sampler to switch, and periods of at least 200 ms.
    fn tracking_ab(&self, sampling: bool) -> Checked<Option<Duration>> {
        match (self.tracking_ab, sampling) {
            (Some(_), false) => Err(TieringConfigError::TrackingAbWithoutTracking),
            (Some(p), true) if p < Duration::from_millis(200) => {
                Err(TieringConfigError::TrackingAbTooShort)
            }
            (ab, _) => Ok(ab),
        }
    }
}

impl TieringConfig {
    /// Whether this run tracks accesses at all: hint-fault windows, or a
    /// policy that probes accessed bits (mtm).
    pub fn tracks_accesses(&self) -> bool {
        self.sampler.is_some()
            || self.engine.as_ref().is_some_and(|e| e.damon.is_some())
            || self
                .engine
                .as_ref()
                .and_then(schedule_trackers)
                .is_some_and(|t| t.accessed_bits)
    }
}

/// The engine for `--tracking damon`: policies that read accessed bits or
/// samples (static, memtis, mtm, colloid), never hint faults, and a host
/// whose DAMON tiervm may use (checked now, read-only, so the run is
/// refused before the VM starts).
fn damon_engine(engine: Option<EngineConfig>, tracking_flags: bool) -> Checked<EngineConfig> {
    use tiering::tracking::damon;
    let Some(mut e) = engine else {
        return Err(TieringConfigError::DamonWithoutPolicy);
    };
    if tracking_flags {
        return Err(TieringConfigError::DamonWithWindowFlags);
    }
    if schedule_trackers(&e).is_some_and(|t| !t.hint_fault_tiers.is_empty()) {
        return Err(TieringConfigError::DamonWithHintFaultPolicy);
    }
    damon::check_can_start(
        std::path::Path::new(damon::SYSFS_ROOT),
        damon::allowed_by_env(),
    )
    .map_err(TieringConfigError::Damon)?;
    e.damon = Some(damon::DamonConfig::default());
    Ok(e)
}

/// One parsed `--tier`.
struct TierFlag {
    name: String,
    node: u32,
    size: u64,
}

/// A `--tier` that does not parse; each message names the fix.
#[derive(Debug, thiserror::Error)]
pub enum TierFlagError {
    /// No name, or one with characters other than letters, digits, - and _.
    #[error(
        "give NAME:node=N:size=SIZE with a name of letters, digits, - or _ (e.g. cxl:node=1:size=1G)"
    )]
    BadName,
    /// `node=` with something that is not a node id.
    #[error("node '{0}' is not a node id (see tiervm info)")]
    BadNode(String),
    /// `size=` with something that is not a size.
    #[error("size '{0}' is not a size (e.g. 1G)")]
    BadSize(String),
    /// A size of 0 or one that is not page-aligned.
    #[error("size '{0}' must be a positive multiple of 4K")]
    SizeNotPages(String),
    /// A part other than node=N and size=SIZE.
    #[error("'{0}' is not node=N or size=SIZE")]
    UnknownPart(String),
    /// No `size=`.
    #[error("missing size=SIZE (e.g. size=256M)")]
    MissingSize,
}

/// Parses `NAME:node=N:size=SIZE` (`node` defaults to 0).
fn parse_tier(s: &str) -> Result<TierFlag, TierFlagError> {
    let mut parts = s.split(':');
    let name = parts.next().unwrap_or_default().trim().to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(TierFlagError::BadName);
    }
    let (mut node, mut size) = (0u32, None);
    for kv in parts {
        match kv.split_once('=') {
            Some(("node", v)) => {
                node = v
                    .parse()
                    .map_err(|_| TierFlagError::BadNode(v.to_string()))?
            }
            Some(("size", v)) => {
                let b = tiervm_guest::args::parse_size(v)
                    .map_err(|_| TierFlagError::BadSize(v.to_string()))?;
                if b == 0 || !b.is_multiple_of(PAGE_SIZE as u64) {
                    return Err(TierFlagError::SizeNotPages(v.to_string()));
                }
                size = Some(b);
            }
            _ => return Err(TierFlagError::UnknownPart(kv.to_string())),
        }
    }
    let size = size.ok_or(TierFlagError::MissingSize)?;
    Ok(TierFlag { name, node, size })
}

/// The trackers the policies of `engine`'s schedule ask for, together.
fn schedule_trackers(engine: &EngineConfig) -> Option<tiering::policy::TrackerRequest> {
    // What a policy tracks does not depend on the memory's size.
    let any_size = tiering::policy::PolicyConfig::new(1024, vec![512, 1024]);
    tiering::engine::Engine::trackers(engine, &any_size).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(f: impl FnOnce(&mut TieringRequest)) -> Checked<Option<TieringConfig>> {
        let mut r = TieringRequest::default();
        f(&mut r);
        r.validate(1 << 30, 1, &[0])
    }

    #[test]
    fn untiered_by_default() {
        assert!(v(|_| {}).unwrap().is_none());
    }

    #[test]
    fn fast_alone_enables_static_tiering_with_the_rest_slow() {
        let c = v(|r| r.fast = Some(256 << 20)).unwrap().unwrap();
        assert_eq!(c.policy, PolicyArg::Static);
        assert_eq!(c.mem.tiers[0].capacity_pages, 65536);
        assert_eq!(c.mem.tiers[1].capacity_pages, 262144);
    }

    #[test]
    fn mtm_probes_instead_of_sampling_and_takes_an_interval() {
        let c = v(|r| {
            r.fast = Some(256 << 20);
            r.policy = Some(PolicyArg::Mtm);
            r.policy_interval = Some("mtm=2s".into());
        })
        .unwrap()
        .unwrap();
        assert!(c.sampler.is_none(), "mtm needs no hint-fault windows");
        assert!(c.tracks_accesses(), "but it tracks accesses");
        let e = c.engine.unwrap();
        assert_eq!(e.intervals, vec![(PolicyKind::Mtm, Duration::from_secs(2))]);
        let nomad = v(|r| {
            r.fast = Some(256 << 20);
            r.policy = Some(PolicyArg::Nomad);
        })
        .unwrap()
        .unwrap();
        assert!(nomad.sampler.is_some());
        let e = |f: fn(&mut TieringRequest)| crate::exit::chain(&v(f).unwrap_err());
        assert!(e(|r| {
            r.fast = Some(256 << 20);
            r.policy_interval = Some("mtm=fast".into());
        })
        .contains("--policy-interval: 'fast'"));
        assert!(e(|r| r.policy_interval = Some("mtm=2s".into()))
            .contains("--policy-interval need a placement policy"));
    }

    #[test]
    fn errors_name_the_fix() {
        let e = |f: fn(&mut TieringRequest)| v(f).unwrap_err().to_string();
        assert!(e(|r| r.fast = Some(8 << 30)).contains("--fast 8G exceeds --mem 1G"));
        assert!(e(|r| {
            r.fast = Some(256 << 20);
            r.slow = Some(256 << 20);
        })
        .contains("cannot hold --mem 1G"));
        assert!(e(|r| r.chaos_rate = Some(5.0)).contains("only apply to --policy chaos"));
        assert!(e(|r| {
            r.policy = Some(PolicyArg::Chaos);
            r.chaos_mix = Some("x".into());
        })
        .contains("not P:D"));
        assert!(e(|r| {
            r.policy = Some(PolicyArg::Static);
            r.slow_node = Some(3);
        })
        .contains("--slow-node 3: this host has NUMA nodes with memory 0"));
        assert!(e(|r| {
            r.policy = Some(PolicyArg::None);
            r.fast = Some(1 << 20);
        })
        .contains("runs untiered"));
    }

    #[test]
    fn chaos_settings_map() {
        let c = v(|r| {
            r.policy = Some(PolicyArg::Chaos);
            r.chaos_rate = Some(5000.0);
            r.chaos_mix = Some("3:1".into());
            r.mechanism = Some(MechanismArg::StopCopy);
            r.chaos_unit = Some(UnitArg::Run2m);
        })
        .unwrap()
        .unwrap();
        let ch = c.chaos.unwrap();
        assert_eq!((ch.promote_weight, ch.demote_weight), (3, 1));
        assert_eq!(ch.unit_pages, 512);
        assert_eq!(ch.mechanism, Mechanism::StopAndCopy);
    }
}
