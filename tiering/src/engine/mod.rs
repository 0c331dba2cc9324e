//! The live tiering engine of one VM: feeds tracker observations to the
//! selected [`Policy`] and carries out its decisions with the mechanisms of
//! [`crate::mem`]. The same policy code runs in the simulator ([`crate::sim`]).
//!
//! Data path: the hint-fault sampler parks windows of guest pages; the fault
//! handler records each guest touch as an [`mem::HintFaultRecord`]. Every
//! [`POLL_INTERVAL`] the engine drains them: a touch on a page of a tier the
//! policy protects becomes a [`HintFault`] for [`Policy::on_hint_fault`] (a
//! returned migration runs at once), and every touch is also an
//! [`policy::AccessSample`] for the next [`Policy::tick`] (sampled faults
//! stand in for PEBS). Every policy interval the engine calls
//! [`Policy::tick`] and executes the [`Decisions`] in order, batching
//! consecutive migrations of the same direction and mechanism.
//!
//! Per-tier loaded latency for Colloid is **modeled** on hosts without
//! hardware counters: from the hint-fault access shares ([`ModeledLatency`]),
//! or, with latency emulation, from the guest's own per-tier access counters
//! through the simulator's queueing model (a [`TierLoadSource`] the VMM
//! provides).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::mem::{self, Migrator, TieredMemory};
pub mod profile;
pub mod schedule;
pub mod unloaded_latency;

pub use schedule::{
    parse_duration, parse_intervals, parse_schedule, policies_with_interval, IntervalError,
    ScheduleError, ScheduledSwitch,
};

use crate::policy::{
    self, AccessSample, Decisions, HintFault, MemoryView, Migration, Policy, PolicyConfig,
    PolicyKind, PolicyMode, PolicyState, TierId, TierStatus, TrackerRequest, Urgency,
};

/// The policy's current mode, shared with whoever shows it (the live line).
pub type ModeSlot = Arc<Mutex<Option<PolicyMode>>>;
use crate::tracking::damon::{self, DamonConfig, DamonReport, DamonTracker};

/// How often the engine drains hint-fault samples.
pub const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// The fastest tier's id (the only one fault-path promotions go to).
pub const FAST_TIER: TierId = 0;

/// Modeled total memory request rate of a VM (64-byte requests per second,
/// about 6.4 GB/s), split over the tiers by the measured access shares.
pub const MODELED_REQUESTS_PER_SEC: f64 = 100e6;

/// Modeled per-tier loaded latency for hosts without latency counters:
/// `latency_t = unloaded_t * (1 + LOAD_SENSITIVITY * share_t)`, where
/// `share_t` is the share of sampled guest accesses that hit tier `t` over
/// the last interval. Unloaded latencies are Colloid's measured 70 ns (local
/// DRAM) and 135 ns (remote/CXL-like); `LOAD_SENSITIVITY = 1.5` makes a tier
/// that serves every access 2.5x its unloaded latency, Colloid's local-DRAM
/// figure under 1x antagonist load. Per-tier request rates are the measured
/// shares times a modeled total of [`MODELED_REQUESTS_PER_SEC`] (the hint
/// faults see a sample of the accesses, not their number). This is a model,
/// labeled as such in reports; it is not a measurement.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModeledLatency {
    /// Unloaded latency per tier, ns.
    pub unloaded_ns: [f64; 2],
    /// Latency growth at a 100% share of accesses.
    pub load_sensitivity: f64,
}

/// [`EngineReport::latency_source`] of [`ModeledLatency`].
pub const MODELED_SHARES_SOURCE: &str = "modeled: hint-fault access shares";

impl Default for ModeledLatency {
    fn default() -> Self {
        Self {
            unloaded_ns: [70.0, 135.0],
            load_sensitivity: 1.5,
        }
    }
}

impl ModeledLatency {
    /// Modeled latencies for per-tier access counts.
    pub fn latencies(&self, accesses: [u64; 2]) -> [f64; 2] {
        let total = (accesses[0] + accesses[1]).max(1) as f64;
        let mut out = [0.0; 2];
        for t in 0..2 {
            out[t] =
                self.unloaded_ns[t] * (1.0 + self.load_sensitivity * accesses[t] as f64 / total);
        }
        out
    }
}

/// One tier's load as a live latency model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TierLoad {
    /// Loaded latency, ns.
    pub loaded_latency_ns: f64,
    /// Memory requests served per second.
    pub requests_per_sec: f64,
    /// The tier's latency without load, ns.
    pub unloaded_latency_ns: f64,
}

/// A live source of per-tier loaded latency and request rate: the VMM's
/// latency emulation, which models them every ~10 ms from the guest's own
/// per-tier access counters with the simulator's queueing model. Modeled,
/// not measured: reports label it so.
pub trait TierLoadSource: Send + Sync + std::fmt::Debug {
    /// Per tier (fastest first), the latest window's load; `None` before the
    /// first window.
    fn tier_loads(&self) -> Option<Vec<TierLoad>>;
    /// What the numbers are, for reports (e.g. "modeled: latency emulation").
    fn describe(&self) -> &'static str;
}

/// Why an engine could not start, take a command or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A policy could not be built.
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    /// The engine thread could not be created.
    #[error("spawning the engine thread")]
    Spawn(#[source] io::Error),
    /// The command queue's lock was poisoned by a panic.
    #[error("engine command queue poisoned")]
    QueuePoisoned,
    /// [`Engine::stop`] ran twice.
    #[error("engine already stopped")]
    AlreadyStopped,
    /// The engine thread panicked.
    #[error("engine thread panicked")]
    Panicked,
    /// The DAMON tracker could not start (`--tracking damon`).
    #[error("--tracking damon")]
    Damon(#[from] crate::tracking::damon::DamonError),
}

/// What the engine did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EngineReport {
    /// Policies in the order they ran, with their start times (s).
    pub policies: Vec<(PolicyKind, f64)>,
    /// Hint faults delivered to policies.
    pub hint_faults: u64,
    /// Access samples delivered at ticks.
    pub samples: u64,
    /// Policy ticks.
    pub ticks: u64,
    /// Migrations the policies asked for (units).
    pub migrations_requested: u64,
    /// Of which in the fault path.
    pub fault_path_migrations: u64,
    /// Pages moved by the engine's requests.
    pub pages_migrated: u64,
    /// Migration batches that failed (I/O errors; the engine keeps going).
    pub errors: u64,
    /// Whether latencies fed to the policy were modeled.
    pub latency_modeled: bool,
    /// Where the latencies fed to policies came from: the hint-fault share
    /// model, or latency emulation's live model (both modeled).
    pub latency_source: Option<&'static str>,
    /// Accessed-bit probe armings (policies that scan accessed bits: each
    /// tested page is armed and hint-faults once on its next touch; a page
    /// re-armed at every scan counts each time).
    pub probes_armed: u64,
    /// The DAMON tracker's account (`--tracking damon`).
    pub damon: Option<DamonReport>,
    /// Ticks per mode, for policies with modes (`adaptive`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modes: Vec<(String, u64)>,
    /// The policy's mode at the end and why (policies with modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_mode: Option<PolicyMode>,
    /// Times the policy was rebuilt for changed tier capacities (live resize).
    pub capacity_rebuilds: u64,
    /// The tiers' unloaded latency as measured at start, for policies that
    /// read it (`adaptive`); see [`unloaded_latency::MEASURED_SOURCE`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unloaded_latency: Option<unloaded_latency::UnloadedLatency>,
}

impl EngineReport {
    /// The empty report of an engine set up as `cfg` says: where its
    /// latencies come from.
    fn for_config(cfg: &EngineConfig) -> Self {
        Self {
            latency_modeled: cfg.modeled_latency.is_some() || cfg.live_latency.is_some(),
            latency_source: match (&cfg.live_latency, &cfg.modeled_latency) {
                (Some(l), _) => Some(l.describe()),
                (None, Some(_)) => Some(MODELED_SHARES_SOURCE),
                (None, None) => None,
            },
            ..Default::default()
        }
    }
}

/// How long a hint-fault touch counts as the page's accessed bit.
pub const ACCESSED_WINDOW: Duration = Duration::from_secs(1);

/// The [`MemoryView`] of live tiered memory. Accessed bits come from the
/// hint-fault samples, because this host has no idle page tracking: a page
/// touched in the last [`ACCESSED_WINDOW`] reads as accessed. Reading does not
/// clear the bit (a sampled page is mapped back after its first touch, so a
/// second touch in the same window cannot be seen); the engine clears all
/// bits at the end of each window. Documented deviation: policies that test
/// a page twice (Nomad's candidate queue, TPP's LRU check) see "touched in
/// this window" rather than "touched since the last test".
///
/// Policies that ask for accessed bits ([`TrackerRequest::accessed_bits`],
/// MTM) get exact ones instead: every page they test is armed as an
/// [`mem::AccessProbes`] probe, so a touch after the test is recorded, and
/// the test reads and clears "touched since the last test".
///
/// With DAMON ([`EngineConfig::damon`]) every policy's tests read the bits
/// DAMON found since the page's last test (region-granular; see
/// [`crate::tracking::damon`]), and no page is armed.
struct LiveView<'a> {
    mem: &'a TieredMemory,
    touched: &'a mut [u64],
    probe: Option<Probing<'a>>,
}

/// Accessed bits kept exactly for the pages a policy tests.
struct Probing<'a> {
    /// Touched since the page's last test.
    touched: &'a mut [u64],
    /// Pages tested in this call, to arm afterwards.
    to_arm: &'a mut Vec<usize>,
}

fn test_and_clear_bit(bits: &mut [u64], page: u64) -> bool {
    let (w, b) = ((page / 64) as usize, page % 64);
    bits.get_mut(w).is_some_and(|word| {
        let hit = *word & (1 << b) != 0;
        *word &= !(1 << b);
        hit
    })
}

impl MemoryView for LiveView<'_> {
    fn pages(&self) -> u64 {
        self.mem.guest_pages() as u64
    }
    fn tier_of(&self, page: u64) -> TierId {
        // A never-touched page has no tier yet; policies see it where the
        // first touch would most likely put it: the slowest tier (it is
        // neither hot nor worth a fast-tier page).
        self.mem
            .tier_of(page as usize)
            .unwrap_or((self.mem.tier_count() - 1) as TierId)
    }
    fn shadow_tier(&self, page: u64) -> Option<TierId> {
        self.mem.shadow_tier(page as usize)
    }
    fn test_and_clear_accessed(&mut self, page: u64) -> bool {
        if let Some(p) = &mut self.probe {
            p.to_arm.push(page as usize);
            return test_and_clear_bit(p.touched, page);
        }
        let (w, b) = ((page / 64) as usize, page % 64);
        self.touched.get(w).is_some_and(|word| word & (1 << b) != 0)
    }
    fn accessed_test_cost_ns(&self) -> Option<f64> {
        // A probe's test is paid by the hint fault of its next touch; with
        // DAMON a test costs the guest no fault (the policy's own figure).
        self.probe.as_ref()?;
        self.mem.hint_fault_guest_cost_ns()
    }
}

struct EngineState {
    /// Where the policy's mode is published after every tick.
    mode: ModeSlot,
    policy: Box<dyn Policy>,
    cfg: PolicyConfig,
    /// Per-policy interval overrides.
    intervals: Vec<(PolicyKind, Duration)>,
    migrator: Arc<Migrator>,
    touched: Vec<u64>,
    /// Armed accessed-bit probes, while the policy asks for accessed bits.
    probes: Option<mem::AccessProbes>,
    probe_touched: Vec<u64>,
    to_arm: Vec<usize>,
    /// Accessed bits and samples from DAMON instead of probes and hint
    /// faults (`--tracking damon`).
    damon: Option<DamonTracker>,
    samples: Vec<AccessSample>,
    tier_hits: Vec<u64>,
    hint_tiers: Vec<TierId>,
    latency: Option<ModeledLatency>,
    /// Latency emulation's live model; takes precedence over `latency`.
    live_latency: Option<Arc<dyn TierLoadSource>>,
    report: EngineReport,
    /// Sampled accesses per page, for the service's division of the fast tier.
    profile: Arc<profile::AccessProfile>,
}

impl EngineState {
    /// The policy configuration for `kind` (its interval override applied).
    fn config_for(&self, kind: PolicyKind) -> PolicyConfig {
        config_for(&self.cfg, &self.intervals, kind)
    }

    /// Starts or stops the accessed-bit probes, and holds or resumes
    /// hint-fault sampling, for the current policy (after every change of
    /// policy; the hold is also followed at every tick).
    fn follow_policy_trackers(&mut self) {
        self.migrator
            .memory()
            .hold_sampling(!self.policy.wants_samples());
        // DAMON supplies the accessed bits: no probes.
        let wants = self.policy.trackers().accessed_bits && self.damon.is_none();
        if wants && self.probes.is_none() {
            self.probe_touched.iter_mut().for_each(|w| *w = 0);
            self.probes = Some(mem::AccessProbes::new(self.migrator.memory().clone()));
        } else if !wants {
            self.stop_probing();
        }
    }

    /// Arms `pages` as accessed-bit probes, if probing.
    fn arm_probes(&mut self, pages: &[usize]) {
        if pages.is_empty() {
            return;
        }
        if let Some(p) = &mut self.probes {
            if let Err(e) = p.arm(pages) {
                self.report.errors += 1;
                tracing::warn!("arming {} accessed-bit probes: {e}", pages.len());
            }
        }
    }

    /// Disarms every probe (the pages map back) and stops probing.
    fn stop_probing(&mut self) {
        if let Some(mut p) = self.probes.take() {
            if let Err(e) = p.disarm_all() {
                tracing::warn!("disarming accessed-bit probes: {e}");
            }
            self.report.probes_armed += p.armed_total();
        }
    }

    fn tiers(&self, latencies: Option<[f64; 2]>) -> Vec<TierStatus> {
        let mem = self.migrator.memory();
        let stats = mem.tier_counts();
        mem.tier_ids()
            .map(|t| {
                let i = usize::from(t);
                TierStatus {
                    capacity_pages: mem.capacity(t) as u64,
                    free_pages: mem.free_pages(t) as u64,
                    shadow_pages: stats[i].1,
                    // The latency model has a fast and a slow class: tier 0
                    // is fast, every other tier slow.
                    loaded_latency_ns: latencies.map(|l| l[i.min(1)]),
                    request_rate: None,
                    unloaded_latency_ns: self
                        .report
                        .unloaded_latency
                        .as_ref()
                        .and_then(|u| u.per_tier_ns.get(i).copied()),
                }
            })
            .collect()
    }

    /// Hits of the fast tier and of all slower tiers together.
    fn class_hits(&self) -> [u64; 2] {
        [
            self.tier_hits.first().copied().unwrap_or(0),
            self.tier_hits.iter().skip(1).sum(),
        ]
    }

    /// One hint-fault sample: accessed bit, per-tier hits, tick sample, and
    /// the policy's hint-fault decision.
    fn observe(
        &mut self,
        s: &mem::HintFaultRecord,
        now_ns: u64,
        tiers: &[TierStatus],
    ) -> Option<Migration> {
        let mem = self.migrator.memory().clone();
        let tier_id = mem.tier_of(s.page as usize)?;
        self.profile
            .record_weighted(s.page, profile::hint_weight(s.ns_since_park));
        // A huge range mapped back whole: every page of it reads as
        // touched, as with the accessed bit of a huge page table entry.
        // (A 2 MiB range is 8 whole words of the bitmaps.)
        let n = u64::from(crate::vocab::PAGES_PER_2M);
        for bits in [&mut self.touched, &mut self.probe_touched] {
            if s.huge {
                let w = (s.page / n * n / 64) as usize;
                if let Some(words) = bits.get_mut(w..w + (n / 64) as usize) {
                    words.fill(u64::MAX);
                }
            } else if let Some(w) = bits.get_mut((s.page / 64) as usize) {
                *w |= 1 << (s.page % 64);
            }
        }
        if let Some(h) = self.tier_hits.get_mut(usize::from(tier_id)) {
            *h += 1;
        }
        self.samples.push(AccessSample {
            page: s.page,
            tier: tier_id,
            write: s.write,
        });
        if !self.hint_tiers.contains(&tier_id) {
            return None;
        }
        self.report.hint_faults += 1;
        let fault = HintFault {
            page: s.page,
            tier: tier_id,
            time_to_fault_ns: s.ns_since_park,
            write: s.write,
            now_ns,
            cpu: s.thread_id,
        };
        let mut view = LiveView {
            mem: &mem,
            touched: &mut self.touched,
            probe: None,
        };
        self.policy.on_hint_fault(&fault, tiers, &mut view)
    }

    /// Feeds drained samples; runs their migrations at once.
    fn feed(&mut self, drained: Vec<mem::HintFaultRecord>, now_ns: u64) {
        if drained.is_empty() {
            return;
        }
        let tiers = self.tiers(None);
        let mut now = Vec::new();
        for s in drained {
            if let Some(m) = self.observe(&s, now_ns, &tiers) {
                now.push(m);
            }
        }
        self.execute(&now);
    }

    /// A hint fault delivered through the fault-path hook: `true` asks the
    /// fault handler to promote the page before the access resumes.
    fn fault_path(&mut self, s: &mem::HintFaultRecord, now_ns: u64) -> bool {
        let tiers = self.tiers(None);
        match self.observe(s, now_ns, &tiers) {
            Some(m)
                if m.urgency == Urgency::BeforeFaultingAccessResumes
                    && m.to == FAST_TIER
                    && m.unit.pages == 1 =>
            {
                self.report.migrations_requested += 1;
                self.report.fault_path_migrations += 1;
                true
            }
            Some(m) => {
                self.execute(&[m]);
                false
            }
            None => false,
        }
    }

    /// One policy tick: the tiers' status and the accesses since the last
    /// tick go to the policy, and its decisions are carried out.
    fn tick(&mut self, now_ns: u64) {
        let tiers = self.tick_tiers();
        let mem = self.migrator.memory().clone();
        self.gather_accesses(&mem, now_ns);
        let samples = std::mem::take(&mut self.samples);
        self.report.samples += samples.len() as u64;
        let obs = policy::Observations {
            now_ns,
            tiers: &tiers,
            samples: &samples,
            tpm_outcomes: &[],
            dirty: &[],
        };
        self.to_arm.clear();
        let mut view = LiveView {
            mem: &mem,
            touched: &mut self.touched,
            probe: (self.probes.is_some() || self.damon.is_some()).then_some(Probing {
                touched: &mut self.probe_touched,
                to_arm: &mut self.to_arm,
            }),
        };
        let d: Decisions = self.policy.tick(&obs, &mut view);
        self.report.ticks += 1;
        self.publish_mode();
        mem.hold_sampling(!self.policy.wants_samples());
        self.tier_hits.iter_mut().for_each(|h| *h = 0);
        self.carry_out(&d, &mem);
        let _ = self.migrator.run_due_retries();
    }

    /// The tiers' status for a tick, with the loaded latency and request
    /// rate of the live model, else of the share model, if either runs.
    fn tick_tiers(&self) -> Vec<TierStatus> {
        let live = self.live_latency.as_ref().and_then(|s| s.tier_loads());
        let latencies = self.latency.map(|l| l.latencies(self.class_hits()));
        let mut tiers = self.tiers(latencies);
        if let Some(loads) = live {
            for (status, load) in tiers.iter_mut().zip(&loads) {
                status.loaded_latency_ns = Some(load.loaded_latency_ns);
                status.request_rate = Some(load.requests_per_sec);
                status.unloaded_latency_ns = Some(load.unloaded_latency_ns);
            }
        } else if self.live_latency.is_some() {
            // No window yet: no latency rather than the share model's (nor
            // the host's unloaded one, which emulation replaces).
            for status in &mut tiers {
                status.loaded_latency_ns = None;
                status.request_rate = None;
                status.unloaded_latency_ns = None;
            }
        } else if self.latency.is_some() {
            let total = self.tier_hits.iter().sum::<u64>().max(1) as f64;
            for (t, status) in tiers.iter_mut().enumerate() {
                status.request_rate =
                    Some(MODELED_REQUESTS_PER_SEC * self.tier_hits[t] as f64 / total);
            }
        }
        tiers
    }

    /// The accesses since the last tick that the probes or DAMON saw, into
    /// the touched bits, the profile and the tick's samples.
    fn gather_accesses(&mut self, mem: &TieredMemory, now_ns: u64) {
        if let Some(p) = &mut self.probes {
            // Map back the probes the guest did not touch, then record every
            // touch up to now: the policy re-arms what it tests.
            if let Err(e) = p.disarm_all() {
                tracing::warn!("disarming accessed-bit probes: {e}");
            }
            self.feed(mem.drain_samples(), now_ns);
        }
        if let Some(d) = &self.damon {
            // DAMON's accessed bits since the last tick become the bits the
            // policy tests; its samples join the tick's samples.
            d.merge_accessed_into(&mut self.probe_touched);
            for page in d.drain_sample_pages() {
                if let Some(tier) = mem.tier_of(page as usize) {
                    self.profile.record(page);
                    if let Some(h) = self.tier_hits.get_mut(usize::from(tier)) {
                        *h += 1;
                    }
                    self.samples.push(AccessSample {
                        page,
                        tier,
                        write: false,
                    });
                }
            }
        }
    }

    /// Carries out a tick's decisions `d`: the tested pages armed around
    /// the migrations, then the shadow reclaims.
    fn carry_out(&mut self, d: &Decisions, mem: &TieredMemory) {
        // Arm the tested pages (none unless probing) at once, so touches
        // during the migrations count; pages about to migrate are armed
        // after (the migrator skips parked pages).
        self.to_arm.sort_unstable();
        self.to_arm.dedup();
        let moving = |p: usize| {
            d.migrations.iter().any(|m| {
                let (s, n) = (m.unit.page as usize, m.unit.pages as usize);
                (s..s.saturating_add(n)).contains(&p)
            })
        };
        let (now, later): (Vec<usize>, Vec<usize>) = self.to_arm.iter().partition(|&&p| !moving(p));
        self.arm_probes(&now);
        self.execute(&d.migrations);
        self.arm_probes(&later);
        for &(tier, pages) in &d.reclaim_shadows {
            let want = mem.free_pages(tier) + pages as usize;
            mem.reclaim_shadows(tier, want);
        }
    }

    /// Publishes the policy's mode (if it has modes) and counts its ticks.
    fn publish_mode(&mut self) {
        let Some(m) = self.policy.mode() else { return };
        match self.report.modes.iter_mut().find(|(n, _)| *n == m.mode) {
            Some((_, t)) => *t += 1,
            None => self.report.modes.push((m.mode.clone(), 1)),
        }
        if let Ok(mut slot) = self.mode.lock() {
            *slot = Some(m.clone());
        }
        self.report.final_mode = Some(m);
    }

    /// Executes migrations in order, batching runs of the same direction and mechanism.
    fn execute(&mut self, migrations: &[Migration]) {
        self.report.migrations_requested += migrations.len() as u64;
        let mem = self.migrator.memory().clone();
        let mut i = 0;
        while i < migrations.len() {
            let key = batch_key(&mem, &migrations[i]);
            let mut units = Vec::new();
            while i < migrations.len() && batch_key(&mem, &migrations[i]) == key {
                let u = migrations[i].unit;
                push_split(&mut units, u.page as usize, u.pages as usize);
                i += 1;
            }
            let Some((to, mech)) = key else { continue };
            match self.migrator.migrate(&units, to, mech) {
                Ok(o) => self.report.pages_migrated += o.migrated as u64,
                Err(e) => {
                    self.report.errors += 1;
                    tracing::warn!("engine batch of {} units: {e}", units.len());
                }
            }
        }
    }
}

/// Pushes the run `first..first + pages` as mechanism units of at most
/// [`mem::MAX_UNIT_PAGES`] pages, cut at 2 MiB boundaries (a policy's unit
/// may be a whole region of many huge pages).
fn push_split(units: &mut Vec<mem::Unit>, first: usize, pages: usize) {
    let (mut p, end) = (first, first.saturating_add(pages));
    while p < end {
        let next = ((p / mem::MAX_UNIT_PAGES + 1) * mem::MAX_UNIT_PAGES).min(end);
        units.push(mem::Unit::run(p as u64, (next - p) as u32));
        p = next;
    }
}

/// Destination and mechanism of a migration; `None` if it is a no-op (the
/// page is already on the destination tier, never touched, or out of range).
/// Demotion remaps the shadow when there is one (the mechanism checks per
/// page); without one it copies (stop-and-copy for `ShadowDemotion`).
fn batch_key(mem: &TieredMemory, m: &Migration) -> Option<(TierId, mem::Mechanism)> {
    let from = mem.tier_of(m.unit.page as usize)?;
    (from != m.to && usize::from(m.to) < mem.tier_count()).then_some((m.to, m.mechanism))
}

/// `base` with `kind`'s interval override applied.
fn config_for(
    base: &PolicyConfig,
    intervals: &[(PolicyKind, Duration)],
    kind: PolicyKind,
) -> PolicyConfig {
    let mut cfg = base.clone();
    if let Some(d) = interval_override(intervals, kind) {
        cfg.interval_ns = Some(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }
    cfg
}

fn interval_override(intervals: &[(PolicyKind, Duration)], kind: PolicyKind) -> Option<Duration> {
    intervals.iter().find(|(k, _)| *k == kind).map(|(_, d)| *d)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The policy's tick period, at least 1 ms.
fn tick_period(policy: &dyn Policy) -> Duration {
    Duration::from_nanos(policy.tick_interval_ns().max(1_000_000))
}

/// Starts DAMON on the guest memory `mem` if `cfg` tracks with it.
fn start_damon(
    cfg: &EngineConfig,
    mem: &TieredMemory,
) -> Result<Option<DamonTracker>, EngineError> {
    let Some(dc) = &cfg.damon else {
        return Ok(None);
    };
    Ok(Some(DamonTracker::start(
        &dc.sysfs_root,
        !damon::is_machine_damon(&dc.sysfs_root) || damon::allowed_by_env(),
        dc,
        std::process::id(),
        mem.guest_ptr() as usize,
        mem.guest_pages(),
    )?))
}

/// A command to a running engine.
enum Command {
    Switch(PolicyKind),
}

/// A running engine thread.
pub struct Engine {
    mode: ModeSlot,
    profile: Arc<profile::AccessProfile>,
    stop: Arc<AtomicBool>,
    commands: Arc<Mutex<VecDeque<Command>>>,
    join: Option<JoinHandle<EngineReport>>,
}

/// Settings of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The first policy.
    pub policy: PolicyKind,
    /// Later switches.
    pub schedule: Vec<ScheduledSwitch>,
    /// Use the modeled latency for policies that read loaded latency.
    pub modeled_latency: Option<ModeledLatency>,
    /// Latency emulation's live per-tier model, which replaces
    /// `modeled_latency` when set (the VMM sets it before the engine starts).
    pub live_latency: Option<Arc<dyn TierLoadSource>>,
    /// Per-policy interval overrides (`--policy-interval mtm=2s`): the
    /// policy's migration interval (memtis, mtm) or quantum (colloid).
    pub intervals: Vec<(PolicyKind, Duration)>,
    /// Track accesses with DAMON (`--tracking damon`): accessed bits and
    /// samples come from the kernel instead of probes and hint faults.
    pub damon: Option<DamonConfig>,
}

impl EngineConfig {
    /// The policies that run, in order (the first, then the schedule's).
    pub fn policies(&self) -> impl Iterator<Item = PolicyKind> + '_ {
        std::iter::once(self.policy).chain(self.schedule.iter().map(|s| s.policy))
    }

    /// Whether `kind` runs at some point (first or scheduled).
    pub fn runs(&self, kind: PolicyKind) -> bool {
        self.policies().any(|k| k == kind)
    }

    /// `kind`'s interval override, if `--policy-interval` set one.
    pub fn interval(&self, kind: PolicyKind) -> Option<Duration> {
        interval_override(&self.intervals, kind)
    }
}

impl Engine {
    /// The trackers the policies of `cfg` need (the union over the schedule).
    pub fn trackers(
        cfg: &EngineConfig,
        pcfg: &PolicyConfig,
    ) -> Result<TrackerRequest, policy::PolicyError> {
        let mut req = cfg.policy.trackers(pcfg)?;
        for s in &cfg.schedule {
            let t = s.policy.trackers(pcfg)?;
            for tier in t.hint_fault_tiers {
                if !req.hint_fault_tiers.contains(&tier) {
                    req.hint_fault_tiers.push(tier);
                }
            }
            req.hint_scan_pages_per_sec =
                req.hint_scan_pages_per_sec.max(t.hint_scan_pages_per_sec);
            req.sample_period = if req.sample_period == 0 {
                t.sample_period
            } else {
                req.sample_period
            };
            req.dirty_log |= t.dirty_log;
            req.hardware_samples |= t.hardware_samples;
            req.accessed_bits |= t.accessed_bits;
            req.huge_pages |= t.huge_pages;
        }
        Ok(req)
    }

    /// The policy configuration for `mem`.
    pub fn policy_config(mem: &TieredMemory) -> PolicyConfig {
        let mut cfg = PolicyConfig::new(
            mem.guest_pages() as u64,
            mem.tier_ids().map(|t| mem.capacity(t) as u64).collect(),
        );
        // An accessed-bit test costs the guest one hint fault here.
        cfg.accessed_test_cost_ns = Some(mem::MEASURED_HINT_FAULT_GUEST_NS);
        // TPM's dirty log is KVM's, per memslot segment (results §13).
        cfg.dirty_log_costly = true;
        // Guest RAM backed by 2 MiB ranges: a 4 KiB move splits one.
        cfg.huge_split_costly = mem.huge_pages();
        // ... which is what transparent huge pages give a process: Memtis
        // tracks and moves 2 MiB pages, as in every Memtis setup of the
        // seeds (results §13, "whole ranges").
        cfg.transparent_huge_pages = mem.huge_pages();
        cfg
    }

    /// [`Self::policy_config`] for `mem` tracked as `cfg` says.
    fn tracked_policy_config(mem: &TieredMemory, cfg: &EngineConfig) -> PolicyConfig {
        let mut pcfg = Self::policy_config(mem);
        if cfg.damon.is_some() {
            // With DAMON a test costs the guest no hint fault: policies
            // budget with their own assumed cost (MTM: 1 us per scan).
            pcfg.accessed_test_cost_ns = None;
        }
        pcfg
    }

    /// Starts the engine over `migrator`: builds the first policy, installs
    /// the fault-path hook if it decides in the fault path, and spawns the
    /// engine thread ([`EngineThread::run`]).
    pub fn spawn(migrator: Arc<Migrator>, cfg: EngineConfig) -> Result<Self, EngineError> {
        let pcfg = Self::tracked_policy_config(migrator.memory(), &cfg);
        let first = cfg
            .policy
            .build(&config_for(&pcfg, &cfg.intervals, cfg.policy))?;
        let trackers = Self::trackers(&cfg, &pcfg)?;
        // Policies that read write counts keep the dirty log on; the others
        // let it go off while nothing is migrating (huge-page mappings).
        migrator.set_dirty_log_required(trackers.dirty_log);
        let damon = start_damon(&cfg, migrator.memory())?;
        let words = migrator.memory().guest_pages().div_ceil(64);
        let mode: ModeSlot = Arc::new(Mutex::new(None));
        let profile = Arc::new(profile::AccessProfile::new(migrator.memory().guest_pages()));
        let state = Arc::new(Mutex::new(EngineState {
            mode: mode.clone(),
            policy: first,
            cfg: pcfg,
            intervals: cfg.intervals.clone(),
            migrator: migrator.clone(),
            touched: vec![0; words],
            probes: None,
            probe_touched: vec![0; words],
            to_arm: Vec::new(),
            damon,
            samples: Vec::new(),
            tier_hits: vec![0; migrator.memory().tier_count()],
            hint_tiers: trackers.hint_fault_tiers.clone(),
            latency: cfg.modeled_latency,
            live_latency: cfg.live_latency.clone(),
            report: EngineReport::for_config(&cfg),
            profile: profile.clone(),
        }));
        let start = Instant::now();
        let hooks = FaultPathHooks {
            mem: migrator.memory().clone(),
            state: state.clone(),
            start,
        };
        hooks.install_for(Some(cfg.policy));
        let stop = Arc::new(AtomicBool::new(false));
        let commands = Arc::new(Mutex::new(VecDeque::new()));
        let thread = EngineThread {
            state,
            migrator,
            hooks,
            start,
            stop: stop.clone(),
            commands: commands.clone(),
            // Latency emulation gives the emulated tiers' own latencies.
            measure_unloaded: cfg.live_latency.is_none()
                && cfg.policies().any(PolicyKind::reads_unloaded_latency),
            schedule: cfg.schedule.into_iter().collect(),
            next_tick: Duration::ZERO,
            next_window: ACCESSED_WINDOW,
            next_capacity_check: CAPACITY_CHECK,
        };
        let join = std::thread::Builder::new()
            .name("tiering-engine".into())
            .spawn(move || thread.run())
            .map_err(EngineError::Spawn)?;
        Ok(Self {
            mode,
            profile,
            stop,
            commands,
            join: Some(join),
        })
    }

    /// The policy's current mode, updated after every tick (`None` until
    /// the first tick, and always for policies without modes).
    pub fn mode_slot(&self) -> ModeSlot {
        self.mode.clone()
    }

    /// The sampled accesses per page the engine has seen (shared, live).
    pub fn access_profile(&self) -> Arc<profile::AccessProfile> {
        self.profile.clone()
    }

    /// Asks the engine to switch to `kind` (state handed over).
    pub fn switch(&self, kind: PolicyKind) -> Result<(), EngineError> {
        self.commands
            .lock()
            .map_err(|_| EngineError::QueuePoisoned)?
            .push_back(Command::Switch(kind));
        Ok(())
    }

    /// Stops the engine and returns its report.
    pub fn stop(mut self) -> Result<EngineReport, EngineError> {
        self.stop.store(true, Ordering::Relaxed);
        self.join
            .take()
            .ok_or(EngineError::AlreadyStopped)?
            .join()
            .map_err(|_| EngineError::Panicked)
    }
}

/// The fault handler's hook into the engine: for policies that promote in
/// the fault path the handler calls the policy itself (under the engine
/// lock), so the faulting vCPU waits exactly for the decision and the copy,
/// as in Linux.
struct FaultPathHooks {
    mem: Arc<TieredMemory>,
    state: Arc<Mutex<EngineState>>,
    start: Instant,
}

impl FaultPathHooks {
    /// Installs the hook if `kind` decides in the fault path, else removes it.
    fn install_for(&self, kind: Option<PolicyKind>) {
        let hook = kind.filter(|k| k.promotes_in_fault_path()).map(|_| {
            let (state, start) = (self.state.clone(), self.start);
            let hook: mem::FaultPathHook = Arc::new(move |sample: &mem::HintFaultRecord| {
                let now_ns = start.elapsed().as_nanos() as u64;
                lock(&state).fault_path(sample, now_ns)
            });
            hook
        });
        self.mem.set_fault_path_hook(hook);
    }
}

/// The engine thread's state.
struct EngineThread {
    state: Arc<Mutex<EngineState>>,
    migrator: Arc<Migrator>,
    hooks: FaultPathHooks,
    start: Instant,
    stop: Arc<AtomicBool>,
    commands: Arc<Mutex<VecDeque<Command>>>,
    schedule: VecDeque<ScheduledSwitch>,
    /// Measure the tiers' unloaded latency before the first tick.
    measure_unloaded: bool,
    next_tick: Duration,
    next_window: Duration,
    /// When tier capacities were last compared with the policy's.
    next_capacity_check: Duration,
}

/// How often the engine compares tier capacities with the policy's (a live
/// resize, `--fast-schedule` or the service, changes them).
const CAPACITY_CHECK: Duration = Duration::from_millis(500);

impl EngineThread {
    /// The engine loop. Every [`POLL_INTERVAL`] until stopped:
    /// 1. switch policies as commanded or scheduled;
    /// 2. feed the drained hint-fault samples to the policy;
    /// 3. end the accessed-bit window when it is over;
    /// 4. tick the policy when its interval is over.
    ///
    /// Then remove the fault-path hook, disarm the probes and report.
    fn run(mut self) -> EngineReport {
        let damon = lock(&self.state).damon.is_some();
        crate::threads::started(if damon {
            crate::threads::ThreadRole::EngineDamon
        } else {
            crate::threads::ThreadRole::Engine
        });
        self.begin();
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.start.elapsed();
            for kind in self.due_switches(now) {
                self.switch(kind, now);
            }
            if now >= self.next_capacity_check {
                self.next_capacity_check = now + CAPACITY_CHECK;
                self.follow_capacities();
            }
            self.poll(now);
            std::thread::sleep(POLL_INTERVAL);
        }
        self.hooks.install_for(None);
        let mut st = lock(&self.state);
        st.stop_probing();
        st.report.damon = st.damon.take().map(DamonTracker::stop);
        st.report.clone()
    }

    /// Records the first policy and starts its probes; measures the tiers'
    /// unloaded latency first if a policy of the run reads it.
    fn begin(&mut self) {
        if self.measure_unloaded {
            let nodes: Vec<u32> = {
                let mem = self.migrator.memory();
                mem.tier_ids().map(|t| mem.node(t)).collect()
            };
            // The guest runs meanwhile; the first tick waits for this.
            match unloaded_latency::measure(&nodes) {
                Ok(u) => lock(&self.state).report.unloaded_latency = Some(u),
                Err(e) => tracing::warn!(
                    "measuring the tiers' unloaded latency: {e}; adaptive values moves by the modeled latency instead"
                ),
            }
        }
        let mut st = lock(&self.state);
        let kind = st.policy.kind();
        st.report.policies.push((kind, 0.0));
        st.follow_policy_trackers();
        self.next_tick = tick_period(st.policy.as_ref());
    }

    /// Switches commanded since the last poll, then those scheduled by now.
    fn due_switches(&mut self, now: Duration) -> Vec<PolicyKind> {
        let mut switches: Vec<PolicyKind> = self
            .commands
            .lock()
            .map(|mut q| q.drain(..).map(|Command::Switch(k)| k).collect())
            .unwrap_or_default();
        while self.schedule.front().is_some_and(|x| x.at <= now) {
            if let Some(x) = self.schedule.pop_front() {
                switches.push(x.policy);
            }
        }
        switches
    }

    /// Policies size themselves by the tier capacities they were built with
    /// (memtis' hot threshold, tpp's watermarks, mtm's targets). After a
    /// live resize the policy is rebuilt with the new capacities, its
    /// hotness handed over as in a switch (the tick keeps its phase).
    fn follow_capacities(&mut self) {
        let mut st = lock(&self.state);
        let mem = self.migrator.memory().clone();
        let caps: Vec<u64> = mem.tier_ids().map(|t| mem.capacity(t) as u64).collect();
        if caps == st.cfg.tier_capacity_pages {
            return;
        }
        st.cfg.tier_capacity_pages = caps;
        let kind = st.policy.kind();
        let exported: PolicyState = st.policy.export_state();
        let pcfg = st.config_for(kind);
        match policy::switch_to(kind, &pcfg, &exported) {
            Ok(p) => {
                st.policy = p;
                st.follow_policy_trackers();
                st.report.capacity_rebuilds += 1;
            }
            Err(e) => tracing::warn!("rebuilding {kind} for new tier capacities: {e}"),
        }
    }

    /// Hands the policy's hotness over to a new `kind` and restarts the tick.
    fn switch(&mut self, kind: PolicyKind, now: Duration) {
        let mut st = lock(&self.state);
        if kind == st.policy.kind() {
            return;
        }
        let exported: PolicyState = st.policy.export_state();
        let pcfg = st.config_for(kind);
        match policy::switch_to(kind, &pcfg, &exported) {
            Ok(p) => {
                st.policy = p;
                st.follow_policy_trackers();
                self.next_tick = now + tick_period(st.policy.as_ref());
                st.report.policies.push((kind, now.as_secs_f64()));
                drop(st);
                self.hooks.install_for(Some(kind));
            }
            Err(e) => tracing::warn!("policy switch to {kind}: {e}"),
        }
    }

    /// Steps 2 to 4 of [`EngineThread::run`].
    fn poll(&mut self, now: Duration) {
        let drained = self.migrator.memory().drain_samples();
        let mut st = lock(&self.state);
        st.feed(drained, now.as_nanos() as u64);
        if now >= self.next_window {
            st.touched.iter_mut().for_each(|w| *w = 0);
            self.next_window = now + ACCESSED_WINDOW;
        }
        if now >= self.next_tick {
            st.tick(now.as_nanos() as u64);
            self.next_tick = now + tick_period(st.policy.as_ref());
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MTM live: with accessed bits from probes, the one region a thread
    /// keeps touching is promoted whole, and no untouched page moves.
    #[test]
    fn mtm_promotes_the_region_it_sees_touched() {
        use std::sync::atomic::AtomicU64;
        const PAGES: usize = 2048;
        const HOT: std::ops::Range<usize> = 1024..1536;
        let mut mc = mem::MemConfig::new(PAGES * mem::PAGE_SIZE, 600);
        mc.placement = mem::InitialPlacement::SlowFirst;
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = crate::host_support::watchdog(std::time::Duration::from_secs(120));
        let m = Arc::new(TieredMemory::new(&mc).expect("tiered memory"));
        let faults = mem::FaultHandler::spawn(m.clone()).unwrap();
        let log = Box::new(mem::SoftDirtyLog::new(PAGES));
        let migrator = Arc::new(Migrator::new(m.clone(), log, Default::default()).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let base = m.guest_ptr() as usize;
        let toucher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for p in HOT {
                        // SAFETY: page p < PAGES lies in guest RAM, mapped and
                        // 8-byte aligned until `m` drops after this thread
                        // joins; every access to it here is atomic.
                        let w = unsafe { &*((base + p * mem::PAGE_SIZE) as *const AtomicU64) };
                        w.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let engine = Engine::spawn(
            migrator,
            EngineConfig {
                policy: PolicyKind::Mtm,
                schedule: Vec::new(),
                modeled_latency: None,
                live_latency: None,
                intervals: vec![(PolicyKind::Mtm, Duration::from_millis(300))],
                damon: None,
            },
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while HOT.clone().any(|p| m.tier_of(p) != Some(0)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let report = engine.stop().unwrap();
        stop.store(true, Ordering::Relaxed);
        toucher.join().unwrap();
        faults.stop().unwrap();
        assert!(report.probes_armed > 0, "{report:?}");
        let fast: Vec<usize> = (0..PAGES).filter(|&p| m.tier_of(p) == Some(0)).collect();
        assert_eq!(fast, HOT.collect::<Vec<_>>(), "{report:?}");
        m.check_consistency().unwrap();
    }

    /// `adaptive` live over tiers on one NUMA node, without emulation: the
    /// engine measures one unloaded latency for both, the policy holds,
    /// moves nothing, and hint-fault sampling is held. With emulated tiers
    /// 80 and 135 ns apart (a live source), it does not hold.
    #[test]
    fn adaptive_holds_and_stops_sampling_over_equally_fast_tiers() {
        #[derive(Debug)]
        struct Emulated;
        impl TierLoadSource for Emulated {
            fn tier_loads(&self) -> Option<Vec<TierLoad>> {
                Some(
                    [(80.0, 135.0), (135.0, 80.0)]
                        .map(|(u, _)| TierLoad {
                            loaded_latency_ns: u * 1.5,
                            requests_per_sec: 1e7,
                            unloaded_latency_ns: u,
                        })
                        .to_vec(),
                )
            }
            fn describe(&self) -> &'static str {
                "test: emulated tiers"
            }
        }
        const PAGES: usize = 2048;
        let mut mc = mem::MemConfig::new(PAGES * mem::PAGE_SIZE, 600);
        mc.placement = mem::InitialPlacement::SlowFirst;
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = crate::host_support::watchdog(std::time::Duration::from_secs(120));
        for live in [None, Some(Arc::new(Emulated) as Arc<dyn TierLoadSource>)] {
            let m = Arc::new(TieredMemory::new(&mc).expect("tiered memory"));
            let faults = mem::FaultHandler::spawn(m.clone()).unwrap();
            let log = Box::new(mem::SoftDirtyLog::new(PAGES));
            let migrator = Arc::new(Migrator::new(m.clone(), log, Default::default()).unwrap());
            let emulated = live.is_some();
            let engine = Engine::spawn(
                migrator,
                EngineConfig {
                    policy: PolicyKind::Adaptive,
                    schedule: Vec::new(),
                    modeled_latency: Some(ModeledLatency::default()),
                    live_latency: live,
                    intervals: Vec::new(),
                    damon: None,
                },
            )
            .unwrap();
            // Emulated: a second of ticks in which it must not hold.
            let wait = Duration::from_secs(if emulated { 1 } else { 10 });
            let deadline = Instant::now() + wait;
            while !m.sampling_held() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(200));
            let held = m.sampling_held();
            let report = engine.stop().unwrap();
            faults.stop().unwrap();
            let mode = report.final_mode.clone().map(|m| m.mode);
            if emulated {
                assert!(!held, "emulated tiers apart: sampling held ({mode:?})");
                assert_ne!(mode.as_deref(), Some("hold: tiers equally fast"));
                assert!(report.unloaded_latency.is_none(), "emulation gives them");
            } else {
                assert!(held, "one node: sampling not held ({mode:?})");
                assert_eq!(mode.as_deref(), Some("hold: tiers equally fast"));
                let u = report.unloaded_latency.clone().expect("measured");
                assert_eq!(u.per_tier_ns[0], u.per_tier_ns[1], "{u:?}");
                assert_eq!(report.pages_migrated, 0, "{report:?}");
            }
            m.check_consistency().unwrap();
        }
    }

    /// A live resize rebuilds the policy with the new capacities: MTM
    /// gives regions target tiers by the capacities it was built with (the
    /// hottest region targets the fast tier even if it does not fit whole,
    /// the next ones the slow tier once that capacity is spent). Two hot
    /// regions apart, a 128-page fast tier: the second targets the slow
    /// tier. After the tier grows to 1200 pages both are promoted, each
    /// page about once, because the engine rebuilt MTM (without the rebuild
    /// MTM keeps planning for the old capacity and churns the second region
    /// up and down; checked by removing `follow_capacities`).
    #[test]
    fn a_live_resize_rebuilds_the_policy_for_the_new_capacity() {
        use std::sync::atomic::AtomicU64;
        const PAGES: usize = 2048;
        const FIRST: std::ops::Range<usize> = 512..768;
        const SECOND: std::ops::Range<usize> = 1280..1536;
        let hot = || FIRST.chain(SECOND);
        let mut mc = mem::MemConfig::new(PAGES * mem::PAGE_SIZE, 128);
        mc.placement = mem::InitialPlacement::SlowFirst;
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = crate::host_support::watchdog(std::time::Duration::from_secs(120));
        let m = Arc::new(TieredMemory::new(&mc).expect("tiered memory"));
        let faults = mem::FaultHandler::spawn(m.clone()).unwrap();
        let log = Box::new(mem::SoftDirtyLog::new(PAGES));
        let migrator = Arc::new(Migrator::new(m.clone(), log, Default::default()).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let base = m.guest_ptr() as usize;
        let toucher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for p in FIRST.chain(SECOND) {
                        // SAFETY: page p < PAGES lies in guest RAM, mapped and
                        // 8-byte aligned until `m` drops after this thread
                        // joins; every access to it here is atomic.
                        let w = unsafe { &*((base + p * mem::PAGE_SIZE) as *const AtomicU64) };
                        w.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let engine = Engine::spawn(
            migrator,
            EngineConfig {
                policy: PolicyKind::Mtm,
                schedule: Vec::new(),
                modeled_latency: None,
                live_latency: None,
                intervals: vec![(PolicyKind::Mtm, Duration::from_millis(300))],
                damon: None,
            },
        )
        .unwrap();
        let fast_in = |r: std::ops::Range<usize>| r.filter(|&p| m.tier_of(p) == Some(0)).count();
        // Ten MTM intervals with the small tier: the second region is slow.
        std::thread::sleep(Duration::from_secs(3));
        let before = fast_in(SECOND);
        m.resize(0, 1200).expect("grow the fast tier");
        let deadline = Instant::now() + Duration::from_secs(20);
        while hot().filter(|&p| m.tier_of(p) != Some(0)).count() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let after = (fast_in(FIRST), fast_in(SECOND));
        let report = engine.stop().unwrap();
        stop.store(true, Ordering::Relaxed);
        toucher.join().unwrap();
        faults.stop().unwrap();
        assert_eq!(
            before, 0,
            "the second region targets the slow tier at first"
        );
        assert_eq!(
            after,
            (FIRST.len(), SECOND.len()),
            "the grown tier holds both hot regions: {report:?}"
        );
        // Without the rebuild MTM plans for 128 pages in a 1200-page tier:
        // it moves the second region up into the free room and back down,
        // again and again (5120 pages migrated in the run that checked it,
        // against 1024 with the rebuild).
        assert!(
            report.pages_migrated <= 4 * (FIRST.len() + SECOND.len()) as u64,
            "each hot page moves about once: {report:?}"
        );
        assert_eq!(report.capacity_rebuilds, 1, "{report:?}");
        m.check_consistency().unwrap();
    }

    /// MTM live on DAMON's accessed bits (a fake DAMON sysfs tree that
    /// reports one region accessed, nothing touching the memory): that
    /// region is promoted whole, nothing else moves, no probe is armed,
    /// and the tracker removes its kdamond when the engine stops.
    // Long (~90 lines) on purpose: one live scenario, set up, run and
    // checked step by step.
    #[test]
    fn mtm_on_damon_bits_promotes_the_region_damon_reports() {
        use crate::tracking::damon::{fake::FakeSysfs, RawRegion};
        const PAGES: usize = 2048;
        const HOT: std::ops::Range<usize> = 1024..1536;
        let mut mc = mem::MemConfig::new(PAGES * mem::PAGE_SIZE, 600);
        mc.placement = mem::InitialPlacement::SlowFirst;
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = crate::host_support::watchdog(std::time::Duration::from_secs(120));
        let m = Arc::new(TieredMemory::new(&mc).expect("tiered memory"));
        let faults = mem::FaultHandler::spawn(m.clone()).unwrap();
        let log = Box::new(mem::SoftDirtyLog::new(PAGES));
        let migrator = Arc::new(Migrator::new(m.clone(), log, Default::default()).unwrap());
        // Commit every page once (lazily backed memory has no page to move
        // until it is touched); from then on nothing touches the memory.
        for p in 0..PAGES {
            // SAFETY: page p < PAGES lies in guest RAM, mapped and 8-byte
            // aligned while `m` lives; the fault handler serves the first
            // touch; nothing else accesses these words.
            let w = unsafe {
                &*((m.guest_ptr() as usize + p * mem::PAGE_SIZE)
                    as *const std::sync::atomic::AtomicU64)
            };
            w.fetch_add(1, Ordering::Relaxed);
        }
        let fake = FakeSysfs::new("engine-mtm", 0);
        let base = m.guest_ptr() as u64;
        let page = mem::PAGE_SIZE as u64;
        let at = |p: usize| base + p as u64 * page;
        for (i, (a, b, n)) in [
            (0, HOT.start, 0),
            (HOT.start, HOT.end, 12),
            (HOT.end, PAGES, 0),
        ]
        .into_iter()
        .enumerate()
        {
            fake.region(
                i as u32,
                RawRegion {
                    start: at(a),
                    end: at(b),
                    nr_accesses: n,
                    age: 1,
                },
            );
        }
        let engine = Engine::spawn(
            migrator,
            EngineConfig {
                policy: PolicyKind::Mtm,
                schedule: Vec::new(),
                modeled_latency: None,
                live_latency: None,
                intervals: vec![(PolicyKind::Mtm, Duration::from_millis(300))],
                damon: Some(DamonConfig {
                    sysfs_root: fake.root.clone(),
                    sample_us: 1_000,
                    aggr_us: 10_000,
                    ..DamonConfig::default()
                }),
            },
        )
        .unwrap();
        assert_eq!(fake.get("kdamonds/nr_kdamonds"), "1", "kdamond 0 created");
        let deadline = Instant::now() + Duration::from_secs(20);
        while HOT.clone().any(|p| m.tier_of(p) != Some(0)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let report = engine.stop().unwrap();
        faults.stop().unwrap();
        assert_eq!(report.probes_armed, 0, "no probes with DAMON");
        let d = report.damon.as_ref().expect("damon report");
        assert!(
            d.snapshots > 0 && d.teardown == "ok",
            "snapshots {}, teardown {}",
            d.snapshots,
            d.teardown
        );
        assert_eq!(fake.get("kdamonds/nr_kdamonds"), "0", "kdamond 0 removed");
        let fast: Vec<usize> = (0..PAGES).filter(|&p| m.tier_of(p) == Some(0)).collect();
        assert_eq!(
            fast,
            HOT.collect::<Vec<_>>(),
            "ticks {}, migrations asked {}, DAMON snapshots {}",
            report.ticks,
            report.migrations_requested,
            d.snapshots
        );
        m.check_consistency().unwrap();
    }

    #[test]
    fn long_runs_split_at_huge_page_boundaries() {
        let mut u = Vec::new();
        push_split(&mut u, 500, 1100);
        let got: Vec<(u64, u32)> = u.iter().map(|x| (x.page, x.pages)).collect();
        assert_eq!(got, vec![(500, 12), (512, 512), (1024, 512), (1536, 64)]);
        u.clear();
        push_split(&mut u, 7, 1);
        assert_eq!((u[0].page, u[0].pages), (7, 1));
    }

    #[test]
    fn modeled_latency_rises_with_share() {
        let m = ModeledLatency::default();
        let l = m.latencies([100, 0]);
        assert!((l[0] - 175.0).abs() < 1e-9, "{l:?}");
        assert!((l[1] - 135.0).abs() < 1e-9);
        let even = m.latencies([50, 50]);
        assert!(even[0] < l[0]);
    }
}
