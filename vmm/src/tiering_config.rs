//! Validated tiering settings of a VM (`--fast`, `--slow`, nodes, placement,
//! policy, chaos), built from command-line flags.

use clap::ValueEnum;
use std::time::Duration;

use tiering::engine::{parse_intervals, parse_schedule, EngineConfig, ModeledLatency};

use tiering::mem::{ChaosConfig, InitialPlacement, Mechanism, MemConfig, SamplerConfig, PAGE_SIZE};

use crate::error::{Error, Result};
use crate::units::format_size;

/// Hint-fault budget of placement policies (MTM's overhead target, §3.2).
pub const POLICY_TRACKING_BUDGET_PCT: f64 = 5.0;
/// Highest `--chaos-rate` in units per second: 40x what the mechanisms reach
/// here (about 250k pages/s, docs/results.md); higher rates only mean
/// "as fast as possible", which this already is.
pub const MAX_CHAOS_RATE: f64 = 10_000_000.0;
/// Largest weight of `--chaos-mix` (a ratio needs no more).
pub const MAX_CHAOS_WEIGHT: u32 = 1_000_000;

/// Initial placement of guest pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementArg {
    /// Fill the fast tier first (Linux's default).
    FastFirst,
    /// Everything starts slow (the seeds' pre-demoted runs), overflow fast.
    SlowFirst,
    /// Each page on a random tier (seeded).
    Random,
    /// Alternate fast and slow.
    Interleave,
}

/// Who moves pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyArg {
    /// Untiered: plain anonymous RAM (THP), no tracking, no migration.
    None,
    /// Tiered backing, pages never move.
    Static,
    /// Torture mode: random units migrate at --chaos-rate regardless of hotness.
    Chaos,
    /// Linux 6.3 TPP: hint faults on slow pages, promotion in the fault path.
    Tpp,
    /// Nomad: TPP's signal, candidate/pending queues, async TPM, shadows.
    Nomad,
    /// Memtis: access histogram, cooling, background migration.
    Memtis,
    /// Colloid: balances the tiers' loaded latencies (modeled here).
    Colloid,
    /// MTM: adaptive regions, one histogram, fast promotion / slow demotion.
    Mtm,
}

impl PolicyArg {
    /// The placement policy's name in `tiering::policy`, for policies run by the engine.
    pub fn engine_policy(self) -> Option<&'static str> {
        Some(match self {
            Self::None | Self::Chaos => return None,
            Self::Static => "static",
            Self::Tpp => "tpp",
            Self::Nomad => "nomad",
            Self::Memtis => "memtis",
            Self::Colloid => "colloid",
            Self::Mtm => "mtm",
        })
    }
}

/// Migration mechanism for chaos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MechanismArg {
    /// Transactional migration (copy while running, commit if clean).
    Tpm,
    /// Exclusive stop-and-copy.
    StopCopy,
}

/// Migration unit for chaos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum UnitArg {
    /// One 4 KiB page.
    #[value(name = "4k")]
    #[serde(rename = "4k")]
    Page4k,
    /// A 2 MiB aligned run of 512 pages.
    #[value(name = "2m")]
    #[serde(rename = "2m")]
    Run2m,
}

/// Tiering flags as parsed (unvalidated).
#[derive(Clone, Debug, PartialEq)]
pub struct TieringRequest {
    /// `--fast`.
    pub fast: Option<u64>,
    /// `--slow`.
    pub slow: Option<u64>,
    /// `--fast-node`.
    pub fast_node: Option<u32>,
    /// `--slow-node`.
    pub slow_node: Option<u32>,
    /// `--placement`.
    pub placement: PlacementArg,
    /// `--policy` (None = not given).
    pub policy: Option<PolicyArg>,
    /// `--chaos-rate` units per second.
    pub chaos_rate: Option<f64>,
    /// `--chaos-mix P:D`.
    pub chaos_mix: Option<String>,
    /// `--mechanism`.
    pub mechanism: Option<MechanismArg>,
    /// `--chaos-unit`.
    pub chaos_unit: Option<UnitArg>,
    /// Test-only: commit migrations without the dirty check.
    pub skip_dirty_check: bool,
    /// `--tracking`.
    pub tracking: Option<TrackingArg>,
    /// `--scan-pages`.
    pub scan_pages: Option<usize>,
    /// `--scan-period`.
    pub scan_period: Option<Duration>,
    /// `--tracking-budget` (percent of vCPU time).
    pub tracking_budget_pct: Option<f64>,
    /// `--policy-schedule` (e.g. `nomad@0s,tpp@20s`).
    pub policy_schedule: Option<String>,
    /// `--policy-interval` (e.g. `mtm=2s`).
    pub policy_interval: Option<String>,
    /// Test-only: chaos migrates only the workload's heap (not the image,
    /// stacks, page tables or status page).
    pub chaos_heap_only: bool,
    /// Measurement: switch hint-fault tracking on and off every this long.
    pub tracking_ab: Option<Duration>,
}

/// Access tracking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrackingArg {
    /// No access tracking.
    Off,
    /// Hint faults: unmap windows of pages and record the guest's touches.
    HintFaults,
    /// DAMON: the kernel samples guest RAM's accessed bits (KVM's too);
    /// needs TIERVM_ALLOW_DAMON_WRITES=1 and no other DAMON user.
    Damon,
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
            tracking: None,
            scan_pages: None,
            scan_period: None,
            tracking_budget_pct: None,
            policy_schedule: None,
            policy_interval: None,
            chaos_heap_only: false,
            tracking_ab: None,
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
    /// Hint-fault sampler settings when tracking is on.
    pub sampler: Option<SamplerConfig>,
    /// The policy engine, for the placement policies.
    pub engine: Option<EngineConfig>,
    /// Switch tracking on and off every this long (A/B measurement).
    pub tracking_ab: Option<Duration>,
}

/// Parses `P:D` with positive integer weights.
pub fn parse_mix(s: &str) -> Result<(u32, u32)> {
    let bad = || {
        Error::Usage(format!(
            "--chaos-mix '{s}' is not P:D with whole numbers, e.g. 1:1 or 3:1"
        ))
    };
    let (p, d) = s.split_once(':').ok_or_else(bad)?;
    let p: u32 = p.trim().parse().map_err(|_| bad())?;
    let d: u32 = d.trim().parse().map_err(|_| bad())?;
    if p > MAX_CHAOS_WEIGHT || d > MAX_CHAOS_WEIGHT {
        return Err(Error::Usage(format!(
            "--chaos-mix '{s}': weights go up to {MAX_CHAOS_WEIGHT}; give the ratio in small numbers, e.g. 3:1"
        )));
    }
    if p == 0 && d == 0 {
        return Err(Error::Usage(
            "--chaos-mix 0:0 migrates nothing: give at least one non-zero weight".into(),
        ));
    }
    Ok((p, d))
}

impl TieringRequest {
    /// Whether any tiering flag asks for tiered memory.
    pub fn wants_tiering(&self) -> bool {
        match self.policy {
            Some(PolicyArg::None) => false,
            Some(_) => true,
            None => self.fast.is_some() || self.slow.is_some(),
        }
    }

    /// Validates against a guest of `mem_bytes`; `None` = untiered.
    pub fn validate(
        &self,
        mem_bytes: u64,
        seed: u64,
        nodes: &[u32],
    ) -> Result<Option<TieringConfig>> {
        let policy = self.policy.unwrap_or(if self.wants_tiering() {
            PolicyArg::Static
        } else {
            PolicyArg::None
        });
        let chaos_flags = self.chaos_rate.is_some()
            || self.chaos_mix.is_some()
            || self.mechanism.is_some()
            || self.chaos_unit.is_some();
        if chaos_flags && policy != PolicyArg::Chaos {
            return Err(Error::Usage(
                "--chaos-rate/--chaos-mix/--mechanism/--chaos-unit only apply to --policy chaos: add --policy chaos or drop them".into(),
            ));
        }
        if policy == PolicyArg::None {
            if self.fast.is_some()
                || self.slow.is_some()
                || self.fast_node.is_some()
                || self.slow_node.is_some()
                || self.tracking.is_some_and(|t| t != TrackingArg::Off)
            {
                return Err(Error::Usage("--policy none runs untiered: drop --fast/--slow/--fast-node/--slow-node/--tracking or pick another policy".into()));
            }
            if self.policy_schedule.is_some() || self.policy_interval.is_some() {
                return Err(Error::Usage(
                    "--policy-schedule/--policy-interval need a placement policy: add --fast SIZE or --policy (static, tpp, nomad, memtis, colloid, mtm)".into(),
                ));
            }
            return Ok(None);
        }
        let page = PAGE_SIZE as u64;
        let fast = self.fast.unwrap_or(mem_bytes / 2 / page * page);
        if fast > mem_bytes {
            return Err(Error::Usage(format!(
                "--fast {} exceeds --mem {}: lower --fast",
                format_size(fast),
                format_size(mem_bytes)
            )));
        }
        if !fast.is_multiple_of(page) {
            return Err(Error::Usage(format!(
                "--fast {} is not a multiple of 4K",
                format_size(fast)
            )));
        }
        // Default: the slow tier can hold the whole guest (a large expander),
        // which leaves room for demotions and shadows.
        let slow = self.slow.unwrap_or(mem_bytes);
        if !slow.is_multiple_of(page) {
            return Err(Error::Usage(format!(
                "--slow {} is not a multiple of 4K",
                format_size(slow)
            )));
        }
        if fast.saturating_add(slow) < mem_bytes {
            return Err(Error::Usage(format!(
                "--fast {} + --slow {} cannot hold --mem {}: raise --fast or --slow (or drop --slow: it then holds the whole guest)",
                format_size(fast),
                format_size(slow),
                format_size(mem_bytes)
            )));
        }
        if let Ok(host) = tiering::host::host_memory_bytes() {
            if fast.saturating_add(slow) > host {
                return Err(Error::Usage(format!(
                    "--fast {} + --slow {} exceed this host's memory ({}): both tier pools are allocated when the VM starts; lower --slow (default: as much as --mem)",
                    format_size(fast),
                    format_size(slow),
                    format_size(host)
                )));
            }
        }
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
        for (flag, n) in [("--fast-node", fast_node), ("--slow-node", slow_node)] {
            if !nodes.is_empty() && !nodes.contains(&n) {
                let list: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
                return Err(Error::Usage(format!(
                    "{flag} {n}: this host has NUMA nodes with memory {} (see tiervm info)",
                    list.join(", ")
                )));
            }
        }
        // Lazy commit: a tier's capacity is a limit, not an allocation. A
        // tier the user sized explicitly must fit the node that backs it
        // (it could never be honoured otherwise); the default slow tier is
        // "whatever the guest needs" and may overcommit the host, guarded at
        // run time (a touch the host cannot back stops the run cleanly).
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
                    return Err(Error::Usage(format!(
                        "{flag} {} exceeds NUMA node {node}'s memory ({}): lower {flag}",
                        format_size(size),
                        format_size(total)
                    )));
                }
            }
        }
        let mut mem = MemConfig::two_tier(
            mem_bytes as usize,
            (fast / page) as usize,
            (slow / page) as usize,
            fast_node,
            slow_node,
        );
        mem.placement = match self.placement {
            PlacementArg::FastFirst => InitialPlacement::FastFirst,
            PlacementArg::SlowFirst => InitialPlacement::SlowFirst,
            PlacementArg::Random => InitialPlacement::Random { seed },
            PlacementArg::Interleave => InitialPlacement::Interleave,
        };
        let chaos = if policy == PolicyArg::Chaos {
            let (promote_weight, demote_weight) =
                parse_mix(self.chaos_mix.as_deref().unwrap_or("1:1"))?;
            let rate = self.chaos_rate.unwrap_or(1000.0);
            if !rate.is_finite() || rate <= 0.0 {
                return Err(Error::Usage(format!(
                    "--chaos-rate {rate}: give a positive number of units per second"
                )));
            }
            if rate > MAX_CHAOS_RATE {
                return Err(Error::Usage(format!(
                    "--chaos-rate {rate} exceeds the {MAX_CHAOS_RATE} units/s maximum (the mechanisms reach about 250k pages/s): lower --chaos-rate"
                )));
            }
            Some(ChaosConfig {
                units_per_sec: rate,
                promote_weight,
                demote_weight,
                mechanism: match self.mechanism.unwrap_or(MechanismArg::Tpm) {
                    MechanismArg::Tpm => Mechanism::TPM,
                    MechanismArg::StopCopy => Mechanism::StopAndCopy,
                },
                unit_pages: match self.chaos_unit.unwrap_or(UnitArg::Page4k) {
                    UnitArg::Page4k => 1,
                    UnitArg::Run2m => 512,
                },
                seed,
                ..ChaosConfig::default()
            })
        } else {
            None
        };
        let tracking_flags = self.scan_pages.is_some()
            || self.scan_period.is_some()
            || self.tracking_budget_pct.is_some();
        let engine = match (policy.engine_policy(), &self.policy_schedule) {
            (None, Some(_)) => {
                return Err(Error::Usage(
                    "--policy-schedule needs a placement policy (static, tpp, nomad, memtis, colloid, mtm)".into(),
                ))
            }
            (None, None) => None,
            (Some(first), sched) => {
                let schedule = match sched {
                    Some(s) => parse_schedule(s).map_err(|e| Error::Usage(format!("--policy-schedule: {e}")))?,
                    None => Vec::new(),
                };
                // A schedule starting at 0 names the first policy itself.
                let first = match schedule.first() {
                    Some(s) if s.at.is_zero() => s.policy.clone(),
                    _ => first.to_string(),
                };
                let intervals = match &self.policy_interval {
                    Some(s) => parse_intervals(s)
                        .map_err(|e| Error::Usage(format!("--policy-interval: {e}")))?,
                    None => Vec::new(),
                };
                Some(EngineConfig {
                    policy: first,
                    schedule,
                    modeled_latency: Some(ModeledLatency::default()),
                    intervals,
                    damon: None,
                })
            }
        };
        if engine.is_none() && self.policy_interval.is_some() {
            return Err(Error::Usage(
                "--policy-interval needs a placement policy (static, tpp, nomad, memtis, colloid, mtm)".into(),
            ));
        }
        // Policies that learn from access samples (all but static and mtm,
        // which probes the accessed bits of its own sampled pages) get
        // hint-fault windows unless --tracking says otherwise.
        let wants_samples = engine
            .as_ref()
            .and_then(schedule_trackers)
            .is_some_and(|t| !t.hint_fault_tiers.is_empty() || t.sample_period > 0);
        let default_tracking = if wants_samples {
            TrackingArg::HintFaults
        } else {
            TrackingArg::Off
        };
        let mut engine = engine;
        let sampler = match self.tracking.unwrap_or(default_tracking) {
            TrackingArg::Damon => {
                engine = Some(damon_engine(engine, tracking_flags)?);
                None
            }
            TrackingArg::Off if tracking_flags => {
                return Err(Error::Usage(
                    "--scan-pages/--scan-period/--tracking-budget need --tracking hint-faults"
                        .into(),
                ))
            }
            TrackingArg::Off => None,
            TrackingArg::HintFaults => {
                let mut c = SamplerConfig::default();
                if wants_samples {
                    // Placement policies get MTM's 5% profiling budget; an
                    // idle engine (static) keeps the 2% default.
                    c.budget_pct = POLICY_TRACKING_BUDGET_PCT;
                }
                if let Some(n) = self.scan_pages {
                    if n == 0 {
                        return Err(Error::Usage(
                            "--scan-pages 0: give at least 1 page per scan window".into(),
                        ));
                    }
                    let guest_pages = mem_bytes / page;
                    if n as u64 > guest_pages {
                        return Err(Error::Usage(format!(
                            "--scan-pages {n} exceeds the guest's {guest_pages} pages: give at most {guest_pages}"
                        )));
                    }
                    c.scan_pages = n;
                    c.max_scan_pages = c.max_scan_pages.max(n);
                    c.min_scan_pages = c.min_scan_pages.min(n);
                }
                if let Some(p) = self.scan_period {
                    if p < Duration::from_millis(1) {
                        return Err(Error::Usage("--scan-period must be at least 1ms".into()));
                    }
                    c.period = p;
                }
                if let Some(b) = self.tracking_budget_pct {
                    if !(b > 0.0 && b <= 100.0) {
                        return Err(Error::Usage(format!(
                            "--tracking-budget {b}: give a share of vCPU time in percent, 0 < budget <= 100"
                        )));
                    }
                    c.budget_pct = b;
                }
                Some(c)
            }
        };
        Ok(Some(TieringConfig {
            mem,
            policy,
            chaos,
            skip_dirty_check: self.skip_dirty_check,
            tracking_ab: match (self.tracking_ab, &sampler) {
                (Some(_), None) => {
                    return Err(Error::Usage(
                        "--tracking-ab needs --tracking hint-faults (or a policy that tracks)"
                            .into(),
                    ))
                }
                (Some(p), Some(_)) if p < Duration::from_millis(200) => {
                    return Err(Error::Usage("--tracking-ab must be at least 200ms".into()))
                }
                (ab, _) => ab,
            },
            sampler,
            engine,
        }))
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
fn damon_engine(engine: Option<EngineConfig>, tracking_flags: bool) -> Result<EngineConfig> {
    use tiering::tracking::damon;
    let Some(mut e) = engine else {
        return Err(Error::Usage(
            "--tracking damon feeds a placement policy: add --policy static, memtis, mtm or colloid"
                .into(),
        ));
    };
    if tracking_flags {
        return Err(Error::Usage(
            "--scan-pages/--scan-period/--tracking-budget set hint-fault windows: drop them with --tracking damon".into(),
        ));
    }
    if schedule_trackers(&e).is_some_and(|t| !t.hint_fault_tiers.is_empty()) {
        return Err(Error::Usage(
            "--tracking damon gives accessed bits and samples, not hint faults: tpp and nomad need --tracking hint-faults".into(),
        ));
    }
    damon::check_can_start(
        std::path::Path::new(damon::SYSFS_ROOT),
        damon::allowed_by_env(),
    )
    .map_err(|e| Error::Usage(e.to_string()))?;
    e.damon = Some(damon::DamonConfig::default());
    Ok(e)
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

    fn v(f: impl FnOnce(&mut TieringRequest)) -> Result<Option<TieringConfig>> {
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
        assert_eq!(
            e.intervals,
            vec![("mtm".to_string(), Duration::from_secs(2))]
        );
        let nomad = v(|r| {
            r.fast = Some(256 << 20);
            r.policy = Some(PolicyArg::Nomad);
        })
        .unwrap()
        .unwrap();
        assert!(nomad.sampler.is_some());
        let e = |f: fn(&mut TieringRequest)| v(f).unwrap_err().to_string();
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
