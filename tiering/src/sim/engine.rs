//! The simulation loop.
//!
//! Time advances in quanta of 1 to 10 ms ([`MIN_QUANTUM_NS`], [`MAX_QUANTUM_NS`]). At the start of a quantum the
//! loaded latency of every tier is solved as a fixed point of the closed
//! loop (threads x MLP requests in flight; utilization from the access mix
//! of the last quantum, migration traffic and the antagonist). The quantum
//! then has `threads * mlp * quantum` request-slot nanoseconds to spend:
//! each simulated access spends `scale * latency(tier)`, each stall of a
//! thread (a fault, a fault-path migration, a TLB-shootdown IPI) spends
//! `scale * stall * mlp`. Accesses are drawn from the workload stream until
//! the budget is spent, so throughput falls when latency or stalls rise.
//!
//! One modeled page stands for `scale` real pages and one simulated access
//! for `scale` real accesses, so per-page access rates (and hence
//! time-to-fault, TPM abort odds, accessed-bit statistics) are the real
//! ones; counts are reported multiplied back by `scale`.

use std::collections::VecDeque;
use std::time::Instant;

use tiervm_guest::gen::Rng;

use super::model::{CostModel, TierModel};
use super::pebs;
use super::report::{
    EventCounts, ModeChange, ModeTicks, SimReport, TierTraffic, TimelineBucket, MAX_MODE_CHANGES,
};
use super::scenario::Scenario;
use super::setup::{self, InitialState, Stream};
use super::workload::PageAccess;
use super::SimError;
use crate::policy::tpp::ScanPeriod;
use crate::policy::{
    AccessSample, HintFault, Mechanism, MemoryView, Migration, Observations, Policy, PolicyKind,
    TierId, TierStatus, TpmOutcome, TrackerRequest, Urgency, PAGES_PER_2M, PAGE_SIZE,
};

pub use super::setup::{SimPlacement, INITIAL_FREE_FRACTION};

/// Shortest simulation quantum: 1 ms of modeled time.
pub const MIN_QUANTUM_NS: u64 = 1_000_000;
/// Longest simulation quantum: 10 ms (Colloid's quantum).
pub const MAX_QUANTUM_NS: u64 = 10_000_000;
/// The quantum is sized for about this many simulated accesses (per-quantum
/// work is then amortized), within [MIN_QUANTUM_NS, MAX_QUANTUM_NS].
pub const ACCESSES_PER_QUANTUM: f64 = 512.0;
/// Timeline buckets per run.
pub const TIMELINE_POINTS: usize = 40;
/// On an allocation failure, shadows are freed up to this many times the
/// request (Nomad §3.2).
pub const SHADOW_RECLAIM_FACTOR: u64 = 10;
/// The hint-fault scanner walks address space in ranges of this size
/// (Linux `task_numa_work` aligns its ranges to `HPAGE_SIZE`).
pub const SCAN_RANGE_BYTES: u64 = crate::vocab::HUGE_PAGE_SIZE as u64;
/// The scanner's virtual budget in multiples of its scan budget: ranges
/// in which it changes no PTE cost only this one (Linux `task_numa_work`:
/// `virtpages = pages * 8`).
pub const SCAN_VIRTUAL_FACTOR: f64 = 8.0;

/// The most hint faults one access takes in a row when the policy leaves
/// the page protected after each ([`Policy::take_refault`]): a guard
/// against a policy that never lets go. 5.13 TPP's train is at most
/// 2 x [`crate::policy::tpp::PAGEVEC_SIZE`] + 1 = 31.
pub const MAX_REFAULT_TRAIN: u32 = 64;

/// The line PEBS counts a load or store event for.
const PEBS_LINE_BYTES: f64 = 64.0;

const ACCESSED: u8 = 1;
const DIRTY: u8 = 2;
const PROTECTED: u8 = 4;
const IN_TPM: u8 = 8;
const TPM_ABORT: u8 = 16;
/// A stop-and-copy migration holds the page (unmapped) until
/// `ModeledPages::locked_until`.
const LOCKED: u8 = 32;
const NO_SHADOW: u8 = u8::MAX;

/// The state of every modeled page: the simulator's [`MemoryView`].
struct ModeledPages {
    tier: Vec<TierId>,
    flags: Vec<u8>,
    shadow: Vec<TierId>,
    scan_time: Vec<u64>,
    /// When the stop-and-copy migration holding a `LOCKED` page maps it
    /// again (modeled ns).
    locked_until: Vec<u64>,
    /// When the transactional copy of an `IN_TPM` page begins (modeled ns):
    /// the mover cleans its PTE, copies it and checks the PTE, page by page
    /// ([`Self::in_tpm_copy`]).
    tpm_copy_start: Vec<u64>,
}

impl ModeledPages {
    /// `pages` pages in tiers `tier`, with no flags, shadows or history.
    fn new(tier: Vec<TierId>, pages: usize) -> Self {
        Self {
            tier,
            flags: vec![0; pages],
            shadow: vec![NO_SHADOW; pages],
            scan_time: vec![0; pages],
            locked_until: vec![0; pages],
            tpm_copy_start: vec![0; pages],
        }
    }
}

impl MemoryView for ModeledPages {
    fn pages(&self) -> u64 {
        self.tier.len() as u64
    }
    fn tier_of(&self, page: u64) -> TierId {
        self.tier.get(page as usize).copied().unwrap_or(0)
    }
    fn shadow_tier(&self, page: u64) -> Option<TierId> {
        self.shadow
            .get(page as usize)
            .copied()
            .filter(|&s| s != NO_SHADOW)
    }
    fn test_and_clear_accessed(&mut self, page: u64) -> bool {
        match self.flags.get_mut(page as usize) {
            Some(f) => {
                let a = *f & ACCESSED != 0;
                *f &= !ACCESSED;
                a
            }
            None => false,
        }
    }
}

/// What moving one modeled page costs the application
/// ([`Sim::shootdown`]).
struct Shootdown {
    /// The IPIs of its TLB shootdowns (slot-ns).
    ipi: f64,
    /// How long the page is held (unmapped) for its copy, ns.
    hold_ns: f64,
}

struct TpmInFlight {
    page: u64,
    from: TierId,
    to: TierId,
    keep_shadow: bool,
}

/// A quantum's request slots: its own and those carried from the last.
#[derive(Clone, Copy)]
struct Slots {
    per_quantum: f64,
    carry: f64,
}

/// Raw (modeled-unit) counters.
#[derive(Clone, Default)]
struct Raw {
    promotions: u64,
    demotions: u64,
    shadow_demotions: u64,
    shadow_misses: u64,
    tpm_commits: u64,
    tpm_aborts: u64,
    shadow_write_faults: u64,
    shadows_reclaimed: u64,
    hint_faults: u64,
    /// Hint faults that left the page protected, so that the same access
    /// faulted again at once (5.13 TPP's train).
    refaults: u64,
    sync_promotions: u64,
    page_lock_waits: u64,
    rejected: u64,
}

impl Raw {
    /// Each count of `self` and `other` combined by `f`.
    fn combine(&self, other: &Raw, f: impl Fn(u64, u64) -> u64) -> Raw {
        Raw {
            promotions: f(self.promotions, other.promotions),
            demotions: f(self.demotions, other.demotions),
            shadow_demotions: f(self.shadow_demotions, other.shadow_demotions),
            shadow_misses: f(self.shadow_misses, other.shadow_misses),
            tpm_commits: f(self.tpm_commits, other.tpm_commits),
            tpm_aborts: f(self.tpm_aborts, other.tpm_aborts),
            shadow_write_faults: f(self.shadow_write_faults, other.shadow_write_faults),
            shadows_reclaimed: f(self.shadows_reclaimed, other.shadows_reclaimed),
            hint_faults: f(self.hint_faults, other.hint_faults),
            refaults: f(self.refaults, other.refaults),
            sync_promotions: f(self.sync_promotions, other.sync_promotions),
            page_lock_waits: f(self.page_lock_waits, other.page_lock_waits),
            rejected: f(self.rejected, other.rejected),
        }
    }

    /// The counts since `earlier`.
    fn since(&self, earlier: &Raw) -> Raw {
        self.combine(earlier, u64::saturating_sub)
    }

    /// The counts of both.
    fn plus(&self, other: &Raw) -> Raw {
        self.combine(other, u64::saturating_add)
    }
}

/// What stalls cost the application, in request-slot nanoseconds.
struct StallCosts {
    /// A fault taken by the accessing thread.
    fault: f64,
    /// The IPIs a fault-path migration sends to the other threads.
    ipi_others: f64,
    /// A stop-and-copy migration in the fault path.
    sync_migration: f64,
    /// A thread waiting on a page, per modeled ns of the wait.
    wait_per_ns: f64,
}

/// The clock of a quantum: when it starts and how fast its budget of
/// request slots turns into time.
struct QuantumClock {
    start_ns: u64,
    budget: f64,
    slot_rate: f64,
}

impl QuantumClock {
    /// Modeled time once `slots` of the budget are left.
    fn now(&self, slots: f64) -> u64 {
        self.start_ns + ((self.budget - slots) / self.slot_rate).max(0.0) as u64
    }
}

/// Accesses served in one quantum, per tier.
struct QuantumTally {
    accesses: Vec<u64>,
    latency: Vec<f64>,
    /// Cache lines moved (a write moves two).
    lines: Vec<f64>,
}

impl QuantumTally {
    fn new(n: usize) -> Self {
        Self {
            accesses: vec![0; n],
            latency: vec![0.0; n],
            lines: vec![0.0; n],
        }
    }

    fn clear(&mut self) {
        self.accesses.iter_mut().for_each(|x| *x = 0);
        self.latency.iter_mut().for_each(|x| *x = 0.0);
        self.lines.iter_mut().for_each(|x| *x = 0.0);
    }
}

/// The run's schedule of quanta, ticks and report phases.
struct RunClock {
    quantum_ns: u64,
    quanta: u64,
    tick_ns: u64,
    next_tick: u64,
    /// Quanta in the "in progress" and in the "stable" phase.
    phase_quanta: u64,
}

impl RunClock {
    /// A quantum of about [`ACCESSES_PER_QUANTUM`] simulated accesses at
    /// unloaded speed, quanta to cover the duration, the policy's tick.
    fn new(scn: &Scenario, sim: &Sim, tick_interval_ns: u64) -> Self {
        let fastest = scn
            .tiers
            .iter()
            .map(|t| t.unloaded_ns)
            .fold(f64::INFINITY, f64::min)
            .max(1.0);
        let sim_rate =
            sim.threads * sim.mlp / (fastest + sim.mlp * sim.compute_ns) * 1e9 / sim.scale;
        let quantum_ns = ((ACCESSES_PER_QUANTUM / sim_rate * 1e9 / MIN_QUANTUM_NS as f64).floor()
            as u64
            * MIN_QUANTUM_NS)
            .clamp(MIN_QUANTUM_NS, MAX_QUANTUM_NS);
        let quanta = ((scn.duration_s * 1e9) / quantum_ns as f64).ceil().max(1.0) as u64;
        let tick_ns = tick_interval_ns.max(1);
        let phase_quanta =
            ((quanta as f64 * scn.phase_fraction.clamp(0.01, 0.5)).round() as u64).max(1);
        Self {
            quantum_ns,
            quanta,
            tick_ns,
            next_tick: tick_ns,
            phase_quanta,
        }
    }

    /// Whether the policy ticks at `now`; if so, schedules the next tick.
    fn tick_due(&mut self, now: u64) -> bool {
        if now < self.next_tick {
            return false;
        }
        self.next_tick += self.tick_ns * ((now - self.next_tick) / self.tick_ns + 1);
        true
    }
}

/// One timeline bucket being filled: accesses, their latency sum, fast
/// accesses, quanta, and its end (measured-run ns).
#[derive(Clone, Copy, Default)]
struct RawBucket {
    accesses: u64,
    latency: f64,
    fast: u64,
    quanta: u64,
    end_ns: u64,
}

impl RawBucket {
    fn merge(self, later: RawBucket) -> RawBucket {
        RawBucket {
            accesses: self.accesses + later.accesses,
            latency: self.latency + later.latency,
            fast: self.fast + later.fast,
            quanta: self.quanta + later.quanta,
            end_ns: later.end_ns,
        }
    }
}

/// Throughput over the run: the timeline buckets and the two phases.
struct Throughput {
    per_bucket: u64,
    bucket: RawBucket,
    buckets: Vec<RawBucket>,
    first_phase_accesses: u64,
    last_phase_accesses: u64,
    accesses: u64,
}

impl Throughput {
    fn new(clock: &RunClock) -> Self {
        Self {
            per_bucket: clock.quanta.div_ceil(TIMELINE_POINTS as u64).max(1),
            bucket: RawBucket::default(),
            buckets: Vec::new(),
            first_phase_accesses: 0,
            last_phase_accesses: 0,
            accesses: 0,
        }
    }

    /// Adds quantum `q` (ending at `now`) and closes a bucket when it is
    /// full. A run longer than its clock planned (rounds timed by the
    /// model) halves its timeline's resolution whenever it reaches twice
    /// [`TIMELINE_POINTS`].
    fn add_quantum(&mut self, q: u64, now: u64, tally: &QuantumTally, clock: &RunClock) {
        let tot_q: u64 = tally.accesses.iter().sum();
        let b = &mut self.bucket;
        b.accesses += tot_q;
        b.latency += tally.latency.iter().sum::<f64>();
        b.fast += tally.accesses[0];
        b.quanta += 1;
        b.end_ns = now;
        if q < clock.phase_quanta {
            self.first_phase_accesses += tot_q;
        }
        if q >= clock.quanta.saturating_sub(clock.phase_quanta) {
            self.last_phase_accesses += tot_q;
        }
        if b.quanta == self.per_bucket {
            self.buckets.push(std::mem::take(&mut self.bucket));
            if self.buckets.len() >= 2 * TIMELINE_POINTS {
                self.buckets = self
                    .buckets
                    .chunks(2)
                    .map(|c| {
                        c.iter()
                            .copied()
                            .reduce(RawBucket::merge)
                            .unwrap_or_default()
                    })
                    .collect();
                self.per_bucket *= 2;
            }
        }
    }

    /// The timeline, the bucket being filled closed; `s` is the scale.
    fn timeline(&self, s: f64, quantum_ns: u64) -> Vec<TimelineBucket> {
        let last = (self.bucket.quanta > 0).then_some(self.bucket);
        self.buckets
            .iter()
            .chain(last.iter())
            .map(|b| {
                let secs = b.quanta as f64 * quantum_ns as f64 / 1e9;
                let acc = b.accesses as f64;
                TimelineBucket {
                    t_s: b.end_ns as f64 / 1e9,
                    throughput_maps: acc * s / secs / 1e6,
                    avg_latency_ns: if b.accesses > 0 { b.latency / acc } else { 0.0 },
                    fast_share: if b.accesses > 0 {
                        b.fast as f64 / acc
                    } else {
                        0.0
                    },
                    mode: None,
                }
            })
            .collect()
    }
}

/// The rounds of a run timed by the model ([`Scenario::rounds`]).
struct RoundClock {
    count: u32,
    /// Modeled accesses per round.
    accesses: u64,
    /// Rounds completed.
    done: u32,
    /// Accesses served in the round under way.
    served: u64,
    /// When the round under way began (measured-run ns).
    start_ns: u64,
    /// Each completed round's accesses and length (ns).
    rounds: Vec<(u64, u64)>,
}

impl RoundClock {
    fn new(r: &super::scenario::Rounds, scale: f64) -> Self {
        Self {
            count: r.count,
            accesses: ((r.ops / scale).round() as u64).max(1),
            done: 0,
            served: 0,
            start_ns: 0,
            rounds: Vec::new(),
        }
    }

    /// Accesses left in the round under way.
    fn left(&self) -> u64 {
        self.accesses.saturating_sub(self.served)
    }

    fn finished(&self) -> bool {
        self.done >= self.count
    }
}

struct Sim {
    scale: f64,
    threads: f64,
    mlp: f64,
    /// CPU time per access besides the access, ns (the scenario's per
    /// operation, spread over the operation's accesses).
    compute_ns: f64,
    costs: CostModel,
    bw: Vec<f64>,
    ant_u: Vec<f64>,
    cap: Vec<u64>,
    used: Vec<u64>,
    shadows: Vec<u64>,
    map: ModeledPages,
    shadow_fifo: VecDeque<u64>,
    stream: Stream,
    rng: Rng,
    /// Draws [`CostModel::tpm_busy_abort`] (its own stream: the access
    /// stream is the same with it on or off).
    busy_abort_rng: Rng,
    trackers: TrackerRequest,
    hint_mask: u64,
    /// The scanner's period, adapted as Linux does ([`ScanPeriod`]), unless
    /// the scenario keeps it fixed (`Scenario::linux_scan_period`).
    scan_period: Option<ScanPeriod>,
    /// Passes the scanner has completed over the address space
    /// (`numa_scan_seq`).
    scan_seq: u64,
    scan_cursor: u64,
    scan_carry: f64,
    scan_virt_carry: f64,
    /// The thread (and CPU: thread `i` runs on CPU `i`) that issues the
    /// next access; the threads take turns ([`HintFault::cpu`]).
    next_cpu: u32,
    /// Application threads, one per CPU.
    cpus: u32,
    sample_countdown: u64,
    /// Stores left to the next store sample, when stores have a period of
    /// their own (`TrackerRequest::store_sample_period`).
    store_countdown: u64,
    /// The workload's writes are stores alone (`Scenario::pebs_writes_are_stores`).
    writes_are_stores: bool,
    /// The platform's PEBS cannot sample slow-tier loads and the policy's
    /// samples stand for PEBS ([`pebs::sees`]).
    pebs_blind: bool,
    samples: Vec<AccessSample>,
    outcomes: Vec<TpmOutcome>,
    dirty: Vec<u64>,
    tpm: Vec<TpmInFlight>,
    tpm_end_ns: u64,
    lat: Vec<f64>,
    /// `lat` times the scale: slot-ns one access to each tier spends.
    lat_scaled: Vec<f64>,
    mix: Vec<f64>,
    /// This quantum's migration bytes out of / into each tier (the two
    /// directions of a full-duplex link; their sum is the tier's traffic).
    mig_out_q: Vec<f64>,
    mig_in_q: Vec<f64>,
    pending_stall_slots: f64,
    now: u64,
    raw: Raw,
    policy_name: &'static str,
    // tick-window accounting for TierStatus
    win_acc: Vec<u64>,
    win_lat: Vec<f64>,
    win_start: u64,
    status: Vec<TierStatus>,
    // run totals
    tot_acc: Vec<u64>,
    tot_lat: Vec<f64>,
    tot_bytes: Vec<f64>,
    tot_mig_bytes: Vec<f64>,
    tot_ant_bytes: Vec<f64>,
    access_bytes: f64,
    /// Bytes an access reads (a line; `access_bytes` adds the write-backs).
    line_bytes: f64,
    /// PEBS events one access makes: one per 64-byte line it moves (a
    /// 4 KiB `memcpy` is 64 loads or stores).
    events_per_access: u64,
    tiers_model: Vec<TierModel>,
    quantum_ns: u64,
    mig_u: Vec<f64>,
    modes: Modes,
    /// When the measured run began (after the benchmark's initialization).
    t0: u64,
    /// Accesses the benchmark's initialization simulated.
    init_accesses: u64,
}

/// The policy's modes over the run (policies with modes).
#[derive(Default)]
struct Modes {
    ticks: Vec<ModeTicks>,
    changes: Vec<ModeChange>,
    last: Option<crate::policy::PolicyMode>,
}

impl Modes {
    /// Records the mode after a tick at `now_ns`.
    fn record(&mut self, now_ns: u64, policy: &dyn Policy) {
        let Some(m) = policy.mode() else { return };
        match self.ticks.iter_mut().find(|t| t.mode == m.mode) {
            Some(t) => t.ticks += 1,
            None => self.ticks.push(ModeTicks {
                mode: m.mode.clone(),
                ticks: 1,
            }),
        }
        if self.last.as_ref().map(|l| &l.mode) != Some(&m.mode) {
            let change = ModeChange {
                t_s: now_ns as f64 / 1e9,
                mode: m.mode.clone(),
                why: m.why.clone(),
            };
            if self.changes.len() < MAX_MODE_CHANGES {
                self.changes.push(change);
            } else if let Some(l) = self.changes.last_mut() {
                *l = change;
            }
        }
        self.last = Some(m);
    }

    /// The mode in effect at `t_s`.
    fn at(&self, t_s: f64) -> Option<String> {
        self.changes
            .iter()
            .take_while(|c| c.t_s <= t_s)
            .last()
            .map(|c| c.mode.clone())
    }
}

/// A tier's status before the first tick measures it.
const UNKNOWN_STATUS: TierStatus = TierStatus {
    capacity_pages: 0,
    free_pages: 0,
    shadow_pages: 0,
    loaded_latency_ns: None,
    request_rate: None,
    unloaded_latency_ns: None,
};

/// The tiers (of `n`) whose hint faults the policy asks for, as a bit mask.
fn hint_mask(trackers: &TrackerRequest, n: usize) -> u64 {
    trackers
        .hint_fault_tiers
        .iter()
        .filter(|&&t| usize::from(t) < n)
        .fold(0u64, |m, &t| m | 1 << t)
}

/// The antagonist's utilization of each of the `n` tiers.
fn antagonist_utilization(scn: &Scenario, n: usize) -> Vec<f64> {
    let mut ant_u = vec![0.0; n];
    if let Some(a) = &scn.antagonist {
        if let Some(u) = ant_u.get_mut(usize::from(a.tier)) {
            *u = a.utilization;
        }
    }
    ant_u
}

/// Runs `policy` on `scn` with first-touch placement.
pub fn run(scn: &Scenario, policy: PolicyKind) -> Result<SimReport, SimError> {
    run_with(scn, policy, SimPlacement::FirstTouch)
}

/// Runs `policy` on `scn` with the given initial placement:
/// 1. check the scenario and lay out the modeled pages;
/// 2. build the policy and the simulator with the trackers it asks for;
/// 3. for every quantum: solve the tiers' latency, serve accesses until the
///    quantum's request slots are spent (hint faults reach the policy as
///    they happen), account the quantum, complete transactional migrations,
///    scan for hint faults and, when its interval is over, tick the policy;
/// 4. report.
pub fn run_with(
    scn: &Scenario,
    policy: PolicyKind,
    placement: SimPlacement,
) -> Result<SimReport, SimError> {
    run_built(scn, placement, |cfg| policy.build(cfg))
}

/// Runs the policy `build` makes for the scenario's memory (tests use it
/// to run a policy with a feature switched off).
pub fn run_built(
    scn: &Scenario,
    placement: SimPlacement,
    build: impl FnOnce(
        &crate::policy::PolicyConfig,
    ) -> Result<Box<dyn Policy>, crate::policy::PolicyError>,
) -> Result<SimReport, SimError> {
    setup::validate(scn)?;
    let started = Instant::now();
    let start = setup::initial_state(scn, placement)?;
    let mut policy = build(&setup::policy_config(scn, &start))?;
    let mut sim = Sim::new(scn, start, policy.as_ref());
    let mut clock = RunClock::new(scn, &sim, policy.tick_interval_ns());
    sim.quantum_ns = clock.quantum_ns;
    let costs = sim.stall_costs();
    let slots_per_q = sim.threads * sim.mlp * clock.quantum_ns as f64;
    // 3a. The benchmark's initialization, if any, before the measured run
    //     and outside its throughput and counts.
    let warmup = match (
        &scn.bench_init,
        setup::bench_init_stream(scn, sim.scale, sim.map.tier.len() as u64),
    ) {
        (Some(init), Some(stream)) => Some(sim.run_bench_init(
            init,
            stream,
            scn.duration_s,
            policy.as_mut(),
            &mut clock,
            &costs,
            slots_per_q,
            scn.rounds.as_ref(),
        )),
        _ => None,
    };
    let mut run = MeasuredRun::new(scn, &sim, &clock, slots_per_q, warmup.is_some());
    for q in 0..clock.quanta {
        if run.rounds.as_ref().is_some_and(RoundClock::finished) {
            break;
        }
        run.quantum(q, &mut sim, &mut clock, policy.as_mut(), &costs);
    }
    run.cut_short(&sim);
    Ok(run.report(scn, &sim, &clock, started, warmup))
}

/// The measured run under way (step 3 after the benchmark's
/// initialization): its throughput, the counts where its phases begin
/// and end, its rounds and the sleeps between them.
struct MeasuredRun {
    /// When it began (modeled ns).
    t0: u64,
    slots_per_q: f64,
    access_bytes: f64,
    throughput: Throughput,
    tally: QuantumTally,
    /// Request slots carried to the next quantum.
    carry: f64,
    first_phase_end: Raw,
    last_phase_start: Raw,
    rounds: Option<RoundClock>,
    /// The sleeps between rounds, if run: their time is off the run's clock.
    between: Option<f64>,
    slept_ns: u64,
    slept: Raw,
}

impl MeasuredRun {
    /// The run starting where `sim`'s initialization (`warmed_up`, if run)
    /// left it.
    fn new(scn: &Scenario, sim: &Sim, clock: &RunClock, slots_per_q: f64, warmed_up: bool) -> Self {
        let mut throughput = Throughput::new(clock);
        // The simulator's work counts the initialization's accesses too.
        throughput.accesses = sim.init_accesses;
        Self {
            t0: sim.t0,
            slots_per_q,
            access_bytes: scn.access_bytes,
            throughput,
            tally: QuantumTally::new(sim.cap.len()),
            carry: 0.0,
            first_phase_end: Raw::default(),
            last_phase_start: Raw::default(),
            rounds: scn.rounds.as_ref().map(|r| RoundClock::new(r, sim.scale)),
            between: scn
                .bench_init
                .as_ref()
                .filter(|i| i.sleep_between_rounds && warmed_up)
                .map(|i| i.sleep_s),
            slept_ns: 0,
            slept: Raw::default(),
        }
    }

    /// Quantum `q`: served and ended, its phase and round marks taken, and
    /// the sleep between rounds run after a round it ends.
    fn quantum(
        &mut self,
        q: u64,
        sim: &mut Sim,
        clock: &mut RunClock,
        policy: &mut dyn Policy,
        costs: &StallCosts,
    ) {
        if self.rounds.is_none() && q == clock.quanta - clock.phase_quanta {
            self.last_phase_start = sim.raw.clone();
        }
        let q_start = self.t0 + self.slept_ns + q * clock.quantum_ns;
        let slots = Slots {
            per_quantum: self.slots_per_q,
            carry: self.carry,
        };
        let served_before = self.throughput.accesses;
        let (c, ended) = sim.serve_quantum(
            q_start,
            clock,
            slots,
            policy,
            costs,
            &mut self.tally,
            &mut self.throughput,
            self.rounds.as_ref().map(RoundClock::left),
        );
        self.carry = c;
        sim.end_quantum(&self.tally, self.access_bytes, clock, policy);
        self.throughput
            .add_quantum(q, sim.now - self.t0 - self.slept_ns, &self.tally, clock);
        let round_ends = self.mark_phases(q, ended, served_before, sim, clock);
        let more = match self.rounds.as_ref() {
            Some(r) => !r.finished(),
            None => q + 1 < clock.quanta,
        };
        if let (Some(s), true) = (self.between, round_ends && more) {
            self.sleep_between_rounds(s, sim, clock, policy);
        }
    }

    /// After quantum `q` (which reached the round's accesses at `ended`,
    /// if it did): the round's accesses, and the counts where the phases
    /// end and begin. Returns whether a round ended (without rounds: a
    /// phase's length of quanta).
    fn mark_phases(
        &mut self,
        q: u64,
        ended: Option<u64>,
        served_before: u64,
        sim: &Sim,
        clock: &RunClock,
    ) -> bool {
        let (t0, slept_ns) = (self.t0, self.slept_ns);
        match self.rounds.as_mut() {
            Some(r) => {
                r.served += self.throughput.accesses - served_before;
                match ended {
                    Some(end) => {
                        let end = end.saturating_sub(t0 + slept_ns);
                        r.rounds.push((r.served, end.saturating_sub(r.start_ns)));
                        r.done += 1;
                        r.served = 0;
                        r.start_ns = sim.now - t0 - slept_ns;
                        if r.done == 1 {
                            self.first_phase_end = sim.raw.clone();
                        }
                        if r.done + 1 == r.count {
                            self.last_phase_start = sim.raw.clone();
                        }
                        true
                    }
                    None => false,
                }
            }
            None => {
                if q + 1 == clock.phase_quanta {
                    self.first_phase_end = sim.raw.clone();
                }
                clock.phase_quanta > 0 && (q + 1).is_multiple_of(clock.phase_quanta)
            }
        }
    }

    /// The benchmark's sleep of `sleep_s` between two rounds, off the
    /// run's clock and counts.
    fn sleep_between_rounds(
        &mut self,
        sleep_s: f64,
        sim: &mut Sim,
        clock: &mut RunClock,
        policy: &mut dyn Policy,
    ) {
        let (before, mig_bytes) = (sim.raw.clone(), sim.tot_mig_bytes.clone());
        let start = sim.now;
        let end = sim.sleep(start, sleep_s, clock, policy);
        self.slept_ns += end - start;
        // A round's counts are read at its start and end (Table 2):
        // the sleep's are in none of them (nor is its migration
        // traffic in the tiers'), but reported on their own.
        self.slept = self.slept.plus(&sim.raw.since(&before));
        sim.raw = before;
        sim.tot_mig_bytes = mig_bytes;
    }

    /// A run its cap stopped short of its rounds: the round under way counts
    /// as its last, cut short.
    fn cut_short(&mut self, sim: &Sim) {
        let (t0, slept_ns) = (self.t0, self.slept_ns);
        if let Some(r) = self.rounds.as_mut() {
            if !r.finished() && r.served > 0 {
                let now = sim.now - t0 - slept_ns;
                r.rounds.push((r.served, now.saturating_sub(r.start_ns)));
                if r.rounds.len() == 1 {
                    self.first_phase_end = sim.raw.clone();
                }
            }
        }
    }

    /// Step 4: the report, with the phases' and rounds' throughput and
    /// counts and the initialization's (`warmup`).
    fn report(
        self,
        scn: &Scenario,
        sim: &Sim,
        clock: &RunClock,
        started: Instant,
        warmup: Option<EventCounts>,
    ) -> SimReport {
        let measured_ns = sim.now.saturating_sub(self.t0 + self.slept_ns);
        let mut report = sim.report(scn, clock, self.throughput, started, measured_ns);
        if let Some(r) = &self.rounds {
            let rate = |&(acc, ns): &(u64, u64)| {
                if ns > 0 {
                    acc as f64 * sim.scale / (ns as f64 / 1e9) / 1e6
                } else {
                    0.0
                }
            };
            report.in_progress_maps = r.rounds.first().map_or(0.0, rate);
            report.stable_maps = r.rounds.last().map_or(0.0, rate);
            report.round_s = r.rounds.iter().map(|&(_, ns)| ns as f64 / 1e9).collect();
        }
        report.in_progress_counters = sim.counts_of(&self.first_phase_end);
        report.stable_counters = sim.counts_of(&sim.raw.since(&self.last_phase_start));
        report.warmup_counters = warmup;
        report.between_rounds_counters = self.between.map(|_| sim.counts_of(&self.slept));
        report
    }
}

impl Sim {
    fn new(scn: &Scenario, start: InitialState, policy: &dyn Policy) -> Self {
        let n = start.cap.len();
        let pages = start.pages;
        let trackers = policy.trackers();
        let hint_mask = hint_mask(&trackers, n);
        let ant_u = antagonist_utilization(scn, n);
        let mix: Vec<f64> = {
            let tot = pages as f64;
            start.used.iter().map(|&u| u as f64 / tot).collect()
        };
        Self {
            scale: start.scale,
            threads: f64::from(scn.threads),
            mlp: scn.mlp,
            compute_ns: scn.compute_ns_per_op / start.accesses_per_op,
            costs: scn.costs.clone(),
            bw: scn.tiers.iter().map(|t| t.bandwidth_gbps).collect(),
            ant_u,
            cap: start.cap,
            used: start.used,
            shadows: vec![0; n],
            map: ModeledPages::new(start.tier, pages as usize),
            shadow_fifo: VecDeque::new(),
            stream: start.stream,
            rng: Rng::for_stream(scn.seed, 0),
            busy_abort_rng: Rng::for_stream(scn.seed, 5),
            sample_countdown: trackers.sample_period,
            store_countdown: trackers.store_sample_period,
            writes_are_stores: scn.pebs_writes_are_stores,
            pebs_blind: scn.pebs_blind_to_slow_loads && trackers.hardware_samples,
            trackers,
            hint_mask,
            scan_period: scn
                .linux_scan_period
                .then(|| ScanPeriod::new(pages as f64 * start.scale * PAGE_SIZE as f64)),
            scan_seq: 0,
            scan_cursor: 0,
            scan_carry: 0.0,
            scan_virt_carry: 0.0,
            next_cpu: 0,
            cpus: scn.threads.max(1),
            samples: Vec::new(),
            outcomes: Vec::new(),
            dirty: Vec::new(),
            tpm: Vec::new(),
            tpm_end_ns: 0,
            lat: scn.tiers.iter().map(|t| t.unloaded_ns).collect(),
            lat_scaled: vec![0.0; n],
            mix,
            mig_out_q: vec![0.0; n],
            mig_in_q: vec![0.0; n],
            pending_stall_slots: 0.0,
            now: 0,
            raw: Raw::default(),
            policy_name: policy.kind().name(),
            win_acc: vec![0; n],
            win_lat: vec![0.0; n],
            win_start: 0,
            status: vec![UNKNOWN_STATUS; n],
            tot_acc: vec![0; n],
            tot_lat: vec![0.0; n],
            tot_bytes: vec![0.0; n],
            tot_mig_bytes: vec![0.0; n],
            tot_ant_bytes: vec![0.0; n],
            access_bytes: scn.access_bytes * (1.0 + start.write_share),
            line_bytes: scn.access_bytes,
            events_per_access: (scn.access_bytes / PEBS_LINE_BYTES).round().max(1.0) as u64,
            tiers_model: scn.tiers.clone(),
            quantum_ns: MIN_QUANTUM_NS,
            mig_u: vec![0.0; n],
            modes: Modes::default(),
            t0: 0,
            init_accesses: 0,
        }
    }

    fn stall_costs(&self) -> StallCosts {
        let s = self.scale;
        StallCosts {
            fault: s * self.costs.fault_ns * self.mlp,
            ipi_others: s * (self.threads - 1.0).max(0.0) * self.mlp * self.costs.ipi_receive_ns,
            sync_migration: s * self.costs.stop_and_copy_ns() * self.mlp,
            wait_per_ns: s * self.mlp,
        }
    }

    fn free(&self, t: usize) -> u64 {
        self.cap[t].saturating_sub(self.used[t] + self.shadows[t])
    }

    fn refresh_status(&mut self) {
        let secs = (self.now.saturating_sub(self.win_start)) as f64 / 1e9;
        for t in 0..self.cap.len() {
            let acc = self.win_acc[t];
            let lat = if acc > 0 {
                self.win_lat[t] / acc as f64
            } else {
                self.lat[t]
            };
            self.status[t] = TierStatus {
                capacity_pages: self.cap[t],
                free_pages: self.free(t),
                shadow_pages: self.shadows[t],
                loaded_latency_ns: Some(lat),
                request_rate: Some(if secs > 0.0 {
                    acc as f64 * self.scale / secs
                } else {
                    0.0
                }),
                unloaded_latency_ns: self.tiers_model.get(t).map(|m| m.unloaded_ns),
            };
        }
    }

    fn solve_latency(&mut self) {
        let n = self.cap.len();
        let q_s = self.quantum_ns as f64 / 1e9;
        let scale = self.scale;
        let per_s = |bytes: f64| bytes * scale / q_s;
        for t in 0..n {
            self.mig_u[t] = per_s(self.mig_out_q[t] + self.mig_in_q[t]) / (self.bw[t] * 1e9);
        }
        // A full-duplex link's two directions: reads and migrations out of
        // the tier, write-backs and migrations into it.
        let read_bytes = self.line_bytes;
        let write_bytes = self.access_bytes - self.line_bytes;
        for _ in 0..12 {
            let lbar: f64 = (0..n)
                .map(|t| self.mix[t] * self.lat[t])
                .sum::<f64>()
                .max(1.0);
            // Accesses per second: each thread keeps `mlp` in flight and
            // computes between them.
            let rate = self.threads * self.mlp / (lbar + self.mlp * self.compute_ns) * 1e9;
            for t in 0..n {
                let bw = self.bw[t] * 1e9;
                let app = rate * self.mix[t];
                let traffic_u = if self.tiers_model[t].full_duplex {
                    let out = app * read_bytes + per_s(self.mig_out_q[t]);
                    out.max(app * write_bytes + per_s(self.mig_in_q[t])) / bw
                } else {
                    app * self.access_bytes / bw + self.mig_u[t]
                };
                let u = traffic_u + self.ant_u[t];
                let target = self.tiers_model[t].loaded_ns(u);
                self.lat[t] = 0.5 * self.lat[t] + 0.5 * target;
            }
        }
    }

    /// Step 3 begins: the clock, the tiers' loaded latency for the quantum.
    fn begin_quantum(&mut self, q_start: u64) {
        self.now = q_start;
        self.solve_latency();
        self.mig_out_q.iter_mut().for_each(|b| *b = 0.0);
        self.mig_in_q.iter_mut().for_each(|b| *b = 0.0);
        for (l, &lat) in self.lat_scaled.iter_mut().zip(&self.lat) {
            *l = lat * self.scale;
        }
    }

    /// One quantum's accesses, from `start` (the measured run's and the
    /// benchmark initialization's): the quantum begins, accesses are served
    /// with `slots` less the stalls pending from the last quantum, at most
    /// `limit` of them, and the clock moves to its end. Returns the slots
    /// carried to the next one and, if the limit was reached, when.
    #[allow(clippy::too_many_arguments)]
    fn serve_quantum(
        &mut self,
        start: u64,
        clock: &RunClock,
        slots: Slots,
        policy: &mut dyn Policy,
        costs: &StallCosts,
        tally: &mut QuantumTally,
        throughput: &mut Throughput,
        limit: Option<u64>,
    ) -> (f64, Option<u64>) {
        self.begin_quantum(start);
        let quantum = QuantumClock {
            start_ns: start,
            budget: slots.per_quantum + slots.carry - self.pending_stall_slots,
            slot_rate: slots.per_quantum / clock.quantum_ns as f64,
        };
        self.pending_stall_slots = 0.0;
        tally.clear();
        let (carry, ended) = self.serve_accesses(&quantum, policy, costs, tally, throughput, limit);
        self.now = start + clock.quantum_ns;
        (carry, ended)
    }

    /// The rest of a served quantum: its traffic (`access_bytes` per
    /// access), the mechanisms, the policy's tick when due, and the
    /// migrations' traffic.
    fn end_quantum(
        &mut self,
        tally: &QuantumTally,
        access_bytes: f64,
        clock: &mut RunClock,
        policy: &mut dyn Policy,
    ) {
        self.account_quantum(tally, access_bytes);
        self.run_mechanisms();
        if clock.tick_due(self.now) {
            self.tick_policy(policy);
        }
        self.account_migration_traffic();
    }

    /// Serves accesses until the quantum's request slots are spent or
    /// `limit` accesses are served; returns the slots left over (negative:
    /// overdrawn), carried to the next quantum (none left idle once the
    /// limit is reached), and when the limit was reached.
    fn serve_accesses(
        &mut self,
        quantum: &QuantumClock,
        policy: &mut dyn Policy,
        costs: &StallCosts,
        tally: &mut QuantumTally,
        throughput: &mut Throughput,
        limit: Option<u64>,
    ) -> (f64, Option<u64>) {
        let mut slots = quantum.budget;
        let mut left = limit.unwrap_or(u64::MAX);
        // A thread computing holds its `mlp` request slots.
        let compute_slots = self.compute_ns * self.mlp * self.scale;
        while slots > 0.0 && left > 0 {
            left -= 1;
            let a = self.stream.next(&mut self.rng);
            let (t, stall) = self.access(a, || quantum.now(slots), policy, costs);
            let ti = usize::from(t);
            tally.accesses[ti] += 1;
            tally.latency[ti] += self.lat[ti];
            tally.lines[ti] += if a.write { 2.0 } else { 1.0 };
            slots -= self.lat_scaled[ti] + compute_slots + stall;
            throughput.accesses += 1;
        }
        match limit {
            Some(_) if left == 0 => (slots.min(0.0), Some(quantum.now(slots))),
            _ => (slots, None),
        }
    }

    /// One access: the faults it takes (a hint fault on a protected page, a
    /// write to a shadowed master, a write during a transactional copy), its
    /// dirty and accessed bits, and its sample. Returns the tier that served
    /// it and the stall (slot-ns) it cost.
    #[inline]
    fn access(
        &mut self,
        a: PageAccess,
        now: impl Fn() -> u64,
        policy: &mut dyn Policy,
        costs: &StallCosts,
    ) -> (TierId, f64) {
        let pi = a.page as usize;
        let mut fl = self.map.flags[pi];
        let mut t = self.map.tier[pi];
        let mut stall = 0.0;
        // The threads issue the stream's accesses in turn.
        let cpu = self.next_cpu;
        self.next_cpu = if cpu + 1 >= self.cpus { 0 } else { cpu + 1 };
        if fl & (PROTECTED | IN_TPM | LOCKED) != 0 || (a.write && self.map.shadow[pi] != NO_SHADOW)
        {
            (t, fl, stall) = self.access_faults(a, cpu, now(), policy, costs);
        }
        if a.write {
            if fl & DIRTY == 0 && self.trackers.dirty_log {
                self.dirty.push(a.page);
            }
            fl |= DIRTY;
        }
        self.map.flags[pi] = fl | ACCESSED;
        self.sample_access(a, t);
        (t, stall)
    }

    /// The faults access `a` by the thread on `cpu` takes at `now`: a wait
    /// on a page a stop-and-copy migration holds, a hint fault on a
    /// protected page, a write to a shadowed master, a write during a
    /// transactional copy. Returns the page's tier and flags after them,
    /// and the stall (slot-ns) they cost.
    #[inline]
    fn access_faults(
        &mut self,
        a: PageAccess,
        cpu: u32,
        now: u64,
        policy: &mut dyn Policy,
        costs: &StallCosts,
    ) -> (TierId, u8, f64) {
        let pi = a.page as usize;
        let mut fl = self.map.flags[pi];
        let mut t = self.map.tier[pi];
        let mut stall = 0.0;
        if fl & LOCKED != 0 {
            // Matryoshka §2.2: a thread touching a page that a
            // stop-and-copy migration holds (locked, unmapped) busy-waits
            // until it is mapped again.
            let until = self.map.locked_until[pi];
            if now < until {
                stall += (until - now) as f64 * costs.wait_per_ns;
                self.raw.page_lock_waits += 1;
            }
            fl &= !LOCKED;
            self.map.flags[pi] = fl;
        }
        if fl & PROTECTED != 0 {
            stall += self.hint_fault(a, cpu, t, now, policy, costs);
            t = self.map.tier[pi];
            fl = self.map.flags[pi];
        }
        if a.write && self.map.shadow[pi] != NO_SHADOW {
            // Shadowed masters are read-only: a write faults and drops the shadow.
            self.drop_shadow(pi);
            self.raw.shadow_write_faults += 1;
            stall += costs.fault;
        }
        if a.write && fl & IN_TPM != 0 && self.in_tpm_copy(pi, now) {
            fl |= TPM_ABORT;
        }
        (t, fl, stall)
    }

    /// Access `a`'s samples, served from tier `t`, as PEBS counts events:
    /// only those it can see, one sample per period of them.
    /// 1. Stores with a period of their own (Memtis' `ALL_STORES`): a
    ///    write is a store event on `store_sample_period`, and also a
    ///    load event unless the workload's writes are stores alone
    ///    (a read-modify-write loads the line first).
    /// 2. Otherwise every access is one event on `sample_period`.
    ///
    /// A load event from a slow tier is invisible on a platform whose
    /// PEBS is blind to slow-tier loads (`sim::pebs`).
    #[inline]
    fn sample_access(&mut self, a: PageAccess, t: TierId) {
        let blind = self.pebs_blind;
        let visible = |write: bool| !blind || pebs::sees(t, write);
        let sample = AccessSample {
            page: a.page,
            tier: t,
            write: a.write,
        };
        if self.trackers.store_sample_period > 0 {
            if a.write {
                count_event(
                    &mut self.store_countdown,
                    self.trackers.store_sample_period,
                    self.events_per_access,
                    &mut self.samples,
                    sample,
                );
            }
            if (!a.write || !self.writes_are_stores) && visible(false) {
                count_event(
                    &mut self.sample_countdown,
                    self.trackers.sample_period,
                    self.events_per_access,
                    &mut self.samples,
                    AccessSample {
                        write: false,
                        ..sample
                    },
                );
            }
        } else if visible(a.write) {
            count_event(
                &mut self.sample_countdown,
                self.trackers.sample_period,
                self.events_per_access,
                &mut self.samples,
                sample,
            );
        }
    }

    /// A hint fault on a protected page, in tier `t`, taken by the thread
    /// on `cpu`: the policy decides at once; a fault-path migration runs before the access resumes (as
    /// stop-and-copy), any other is carried out in the background. Returns
    /// the stall (slot-ns) of the faulting thread.
    ///
    /// A fault the policy leaves protected ([`Policy::take_refault`]: 5.13
    /// TPP's `goto out`) is taken again at once by the same access, each
    /// time a fault's cost and [`CostModel::fault_ns`] later, until one
    /// migrates the page or maps it back (at most [`MAX_REFAULT_TRAIN`]
    /// faults: a guard; 5.13's train ends by itself within 31).
    fn hint_fault(
        &mut self,
        a: PageAccess,
        cpu: u32,
        t: TierId,
        now: u64,
        policy: &mut dyn Policy,
        costs: &StallCosts,
    ) -> f64 {
        let pi = a.page as usize;
        self.map.flags[pi] &= !PROTECTED;
        let mut stall = 0.0;
        let mut at = now;
        for taken in 1..=MAX_REFAULT_TRAIN {
            self.raw.hint_faults += 1;
            if let Some(p) = &mut self.scan_period {
                p.on_hint_fault(self.scan_seq);
            }
            stall += costs.fault;
            let fault = HintFault {
                page: a.page,
                tier: t,
                time_to_fault_ns: at.saturating_sub(self.map.scan_time[pi]),
                write: a.write,
                now_ns: at,
                cpu,
            };
            self.now = at;
            self.refresh_status();
            if let Some(m) = policy.on_hint_fault(&fault, &self.status, &mut self.map) {
                if m.urgency == Urgency::BeforeFaultingAccessResumes && m.unit.page == a.page {
                    let before = self.raw.promotions;
                    let stop = Migration {
                        mechanism: Mechanism::StopAndCopy,
                        ..m
                    };
                    self.apply(&stop);
                    if self.raw.promotions > before {
                        self.raw.sync_promotions += 1;
                    }
                    stall += costs.sync_migration + costs.ipi_others;
                } else {
                    self.pending_stall_slots += self.apply(&m);
                }
                break;
            }
            if !policy.take_refault() || taken == MAX_REFAULT_TRAIN {
                break;
            }
            // Still PROT_NONE: the access faults again at once.
            self.raw.refaults += 1;
            // `as` saturates: any cost is safe.
            at = at.saturating_add(self.costs.fault_ns as u64);
        }
        stall
    }

    /// Adds the quantum's accesses to the tick window and the run totals,
    /// and makes its access mix the next quantum's latency input.
    fn account_quantum(&mut self, tally: &QuantumTally, line_bytes: f64) {
        let tot_q: u64 = tally.accesses.iter().sum();
        let q_s = self.quantum_ns as f64;
        for t in 0..self.cap.len() {
            self.win_acc[t] += tally.accesses[t];
            self.win_lat[t] += tally.latency[t];
            self.tot_acc[t] += tally.accesses[t];
            self.tot_lat[t] += tally.latency[t];
            self.tot_bytes[t] += tally.lines[t] * line_bytes * self.scale;
            self.tot_ant_bytes[t] += self.ant_u[t] * self.bw[t] * 1e9 * q_s / 1e9;
            if tot_q > 0 {
                self.mix[t] = tally.accesses[t] as f64 / tot_q as f64;
            }
        }
    }

    /// Completes the transactional migrations whose copy is over and
    /// protects the next pages for hint faults.
    fn run_mechanisms(&mut self) {
        self.complete_due_tpm();
        self.scan_hint();
    }

    /// Completes the transactional migrations whose copy is over.
    fn complete_due_tpm(&mut self) {
        if !self.tpm.is_empty() && self.now >= self.tpm_end_ns {
            self.complete_tpm();
        }
    }

    /// Step 3a: the benchmark's initialization
    /// ([`super::scenario::BenchInit`]), before the measured run:
    /// 1. the memset and the warm-up round (`stream`), served and sampled
    ///    like the run's accesses, with the policy ticking as in the run;
    ///    the warm-up lasts `warmup_fraction` of the measured `measured_s`
    ///    from the end of the memset;
    /// 2. the sleep: no thread runs, so no access, no stall charged and no
    ///    hint-fault scan (Linux scans in the task's own context,
    ///    `task_numa_work`), while the policy's ticks and migrations go on;
    /// 3. the run's stream back, the counts and totals so far returned
    ///    (real-equivalent) and cleared, the measured run starting at the
    ///    clock's time (`t0`).
    #[allow(clippy::too_many_arguments)]
    fn run_bench_init(
        &mut self,
        init: &super::scenario::BenchInit,
        stream: Stream,
        measured_s: f64,
        policy: &mut dyn Policy,
        clock: &mut RunClock,
        costs: &StallCosts,
        slots_per_q: f64,
        rounds: Option<&super::scenario::Rounds>,
    ) -> EventCounts {
        let run_stream = std::mem::replace(&mut self.stream, stream);
        let q_ns = clock.quantum_ns;
        let warmup_ns = (measured_s * init.warmup_fraction * 1e9) as u64;
        let mut scratch = Throughput::new(clock);
        let mut tally = QuantumTally::new(self.cap.len());
        let mut carry = 0.0f64;
        let mut now = 0u64;
        let mut warmup_end: Option<u64> = None;
        // Step 1. With rounds timed by the model the warm-up is
        // `warmup_fraction` of the measured rounds' operations (Nomad: one
        // round), counted from the quantum after the memset's end.
        let warmup_ops = rounds.map(|r| {
            ((init.warmup_fraction * f64::from(r.count) * r.ops / self.scale).round() as u64).max(1)
        });
        let mut ops_left: Option<u64> = None;
        while warmup_end.is_none_or(|end| now < end) && ops_left != Some(0) {
            let slots = Slots {
                per_quantum: slots_per_q,
                carry,
            };
            let before = scratch.accesses;
            (carry, _) = self.serve_quantum(
                now,
                clock,
                slots,
                policy,
                costs,
                &mut tally,
                &mut scratch,
                ops_left,
            );
            if let Some(left) = ops_left.as_mut() {
                *left = left.saturating_sub(scratch.accesses - before);
            }
            now += q_ns;
            self.end_quantum(&tally, self.line_bytes, clock, policy);
            let memset_over = matches!(&self.stream, Stream::Init(s) if s.memset_done());
            if memset_over && warmup_end.is_none() && ops_left.is_none() {
                match warmup_ops {
                    Some(n) => ops_left = Some(n),
                    None => warmup_end = Some(now + warmup_ns),
                }
            }
        }
        // Step 2.
        let now = self.sleep(now, init.sleep_s, clock, policy);
        // Step 3.
        self.stream = run_stream;
        let counts = self.event_counts();
        self.raw = Raw::default();
        for v in [
            &mut self.tot_lat,
            &mut self.tot_bytes,
            &mut self.tot_mig_bytes,
            &mut self.tot_ant_bytes,
        ] {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
        self.tot_acc.iter_mut().for_each(|x| *x = 0);
        self.t0 = now;
        self.init_accesses = scratch.accesses;
        counts
    }

    /// The benchmark sleeping `sleep_s` from `now`: no thread runs, so no
    /// access, no stall charged and no hint-fault scan (Linux scans in the
    /// task's own context, `task_numa_work`), while the policy's ticks and
    /// migrations go on. Returns the clock at its end.
    fn sleep(
        &mut self,
        mut now: u64,
        sleep_s: f64,
        clock: &mut RunClock,
        policy: &mut dyn Policy,
    ) -> u64 {
        // `as` saturates: a NaN or negative length is no sleep.
        let end = now.saturating_add((sleep_s * 1e9) as u64);
        while now < end {
            self.begin_quantum(now);
            now += clock.quantum_ns;
            self.now = now;
            self.complete_due_tpm();
            if clock.tick_due(now) {
                self.tick_policy(policy);
            }
            self.account_migration_traffic();
            self.pending_stall_slots = 0.0;
        }
        now
    }

    /// Hands the tick's observations to the policy and carries out its
    /// decisions: shadow reclaims, then migrations in order.
    fn tick_policy(&mut self, policy: &mut dyn Policy) {
        self.refresh_status();
        let samples = std::mem::take(&mut self.samples);
        let outcomes = std::mem::take(&mut self.outcomes);
        let dirty = std::mem::take(&mut self.dirty);
        for &p in &dirty {
            self.map.flags[p as usize] &= !DIRTY;
        }
        let status = self.status.clone();
        let obs = Observations {
            now_ns: self.now,
            tiers: &status,
            samples: &samples,
            tpm_outcomes: &outcomes,
            dirty: &dirty,
        };
        let d = policy.tick(&obs, &mut self.map);
        self.modes.record(self.now.saturating_sub(self.t0), policy);
        let n = self.cap.len();
        for (t, k) in &d.reclaim_shadows {
            if usize::from(*t) < n {
                self.reclaim_shadows(*t, *k);
            }
        }
        for m in &d.migrations {
            self.pending_stall_slots += self.apply(m);
        }
        self.win_acc.iter_mut().for_each(|x| *x = 0);
        self.win_lat.iter_mut().for_each(|x| *x = 0.0);
        self.win_start = self.now;
    }

    /// Adds the quantum's migration copies to the run totals.
    fn account_migration_traffic(&mut self) {
        for t in 0..self.cap.len() {
            self.tot_mig_bytes[t] += (self.mig_out_q[t] + self.mig_in_q[t]) * self.scale;
        }
    }

    /// Step 4: the run's report, counts in real-equivalent units.
    fn report(
        &self,
        scn: &Scenario,
        clock: &RunClock,
        throughput: Throughput,
        started: Instant,
        measured_ns: u64,
    ) -> SimReport {
        let s = self.scale;
        let dur = measured_ns as f64 / 1e9;
        let phase_s = clock.phase_quanta as f64 * clock.quantum_ns as f64 / 1e9;
        let total_acc: u64 = self.tot_acc.iter().sum();
        let total_lat: f64 = self.tot_lat.iter().sum();
        let c = |x: u64| x as f64 * s;
        let mut timeline = throughput.timeline(s, clock.quantum_ns);
        for b in &mut timeline {
            b.mode = self.modes.at(b.t_s);
        }
        SimReport {
            modeled: true,
            scenario: scn.name.clone(),
            policy: self.policy_name.to_string(),
            duration_s: dur,
            throughput_maps: total_acc as f64 * s / dur / 1e6,
            in_progress_maps: throughput.first_phase_accesses as f64 * s / phase_s / 1e6,
            stable_maps: throughput.last_phase_accesses as f64 * s / phase_s / 1e6,
            avg_latency_ns: if total_acc > 0 {
                total_lat / total_acc as f64
            } else {
                0.0
            },
            counters: self.event_counts(),
            in_progress_counters: EventCounts::default(),
            stable_counters: EventCounts::default(),
            warmup_counters: None,
            between_rounds_counters: None,
            round_s: Vec::new(),
            tiers: (0..self.cap.len())
                .map(|t| TierTraffic {
                    name: scn.tiers[t].name.clone(),
                    accesses: c(self.tot_acc[t]),
                    app_gb: self.tot_bytes[t] / 1e9,
                    migration_gb: self.tot_mig_bytes[t] / 1e9,
                    antagonist_gb: self.tot_ant_bytes[t] / 1e9,
                    avg_loaded_latency_ns: if self.tot_acc[t] > 0 {
                        self.tot_lat[t] / self.tot_acc[t] as f64
                    } else {
                        0.0
                    },
                    pages_at_end: self.used[t] as f64 * s,
                })
                .collect(),
            timeline,
            simulated_accesses: throughput.accesses,
            wall_s: started.elapsed().as_secs_f64(),
            modes: self.modes.ticks.clone(),
            mode_changes: self.modes.changes.clone(),
            final_mode: self.modes.last.clone(),
        }
    }

    fn event_counts(&self) -> EventCounts {
        self.counts_of(&self.raw)
    }

    /// `r` in real-equivalent units.
    fn counts_of(&self, r: &Raw) -> EventCounts {
        let c = |x: u64| x as f64 * self.scale;
        EventCounts {
            promotions: c(r.promotions),
            demotions: c(r.demotions),
            shadow_demotions: c(r.shadow_demotions),
            shadow_misses: c(r.shadow_misses),
            tpm_commits: c(r.tpm_commits),
            tpm_aborts: c(r.tpm_aborts),
            shadow_write_faults: c(r.shadow_write_faults),
            shadows_reclaimed: c(r.shadows_reclaimed),
            hint_faults: c(r.hint_faults),
            refaults: c(r.refaults),
            sync_promotions: c(r.sync_promotions),
            page_lock_waits: c(r.page_lock_waits),
            rejected: c(r.rejected),
        }
    }
}

// The mechanisms: migrations page by page, shadows, transactional commits,
// the hint-fault scanner.
impl Sim {
    /// Carries out one migration page by page; returns the stall (slot-ns)
    /// charged to the application (IPIs).
    fn apply(&mut self, m: &Migration) -> f64 {
        let mut stall_slots = 0.0;
        let n = self.cap.len();
        let to = m.to;
        if usize::from(to) >= n {
            self.raw.rejected += u64::from(m.unit.pages);
            return 0.0;
        }
        let shootdown = self.shootdown();
        let end = (m.unit.page + u64::from(m.unit.pages)).min(self.map.tier.len() as u64);
        for p in m.unit.page..end {
            let pi = p as usize;
            let from = self.map.tier[pi];
            if from == to || self.map.flags[pi] & IN_TPM != 0 {
                continue;
            }
            let mut mech = m.mechanism;
            if mech == Mechanism::ShadowDemotion {
                if self.map.shadow[pi] == to {
                    stall_slots += self.remap_to_shadow(pi, from, to, shootdown.ipi);
                    continue;
                }
                self.raw.shadow_misses += 1;
                mech = Mechanism::StopAndCopy;
            }
            if !self.has_room_for(p, to) {
                continue;
            }
            stall_slots += self.copy_page(p, from, to, mech, &shootdown);
        }
        stall_slots
    }

    /// What moving a modeled page costs the application. One shootdown per
    /// mapping moved: a modeled page stands for `scale` 4 KiB mappings, or
    /// `scale / 512` 2 MiB ones when the policy maps huge pages (HeMem),
    /// each held for a 2 MiB copy.
    fn shootdown(&self) -> Shootdown {
        let (mappings, hold_ns) = if self.trackers.huge_pages {
            (
                self.scale / f64::from(PAGES_PER_2M),
                self.costs.stop_and_copy_2m_ns(),
            )
        } else {
            (self.scale, self.costs.stop_and_copy_ns())
        };
        Shootdown {
            ipi: mappings * self.threads * self.mlp * self.costs.ipi_receive_ns,
            hold_ns,
        }
    }

    /// A shadow demotion of page `pi` from `from` onto its shadow in `to`;
    /// returns the stall (slot-ns) charged (`ipi`).
    fn remap_to_shadow(&mut self, pi: usize, from: TierId, to: TierId, ipi: f64) -> f64 {
        self.map.tier[pi] = to;
        self.map.shadow[pi] = NO_SHADOW;
        self.shadows[usize::from(to)] -= 1;
        self.used[usize::from(to)] += 1;
        self.used[usize::from(from)] -= 1;
        self.raw.shadow_demotions += 1;
        self.raw.demotions += 1;
        if self.costs.shadow_remap_ns > 0.0 {
            // Unmapped while its shadow is mapped in.
            self.map.flags[pi] |= LOCKED;
            // `as` saturates, so any finite or infinite setting is safe.
            self.map.locked_until[pi] = self.now.saturating_add(self.costs.shadow_remap_ns as u64);
        }
        ipi
    }

    /// Whether tier `to` has a free page for page `p`, shadows reclaimed
    /// if need be; if not, the page is rejected.
    fn has_room_for(&mut self, p: u64, to: TierId) -> bool {
        if self.free(usize::from(to)) < 1 && !self.reclaim_for_allocation(to, 1) {
            self.raw.rejected += 1;
            if self.raw.rejected == 1 {
                let policy_name = self.policy_name;
                tracing::debug!(policy_name, page = p, to, "destination full");
            }
            return false;
        }
        true
    }

    /// Copies page `p` from `from` to `to` by `mech`: a transactional copy
    /// starts (committed or aborted later), any other moves the page now.
    /// Returns the stall (slot-ns) charged to the application.
    fn copy_page(
        &mut self,
        p: u64,
        from: TierId,
        to: TierId,
        mech: Mechanism,
        shootdown: &Shootdown,
    ) -> f64 {
        let pi = p as usize;
        let copy = PAGE_SIZE as f64;
        self.mig_out_q[usize::from(from)] += copy;
        self.mig_in_q[usize::from(to)] += copy;
        match mech {
            Mechanism::Transactional { keep_shadow } => {
                self.used[usize::from(to)] += 1; // reserved until commit/abort
                self.map.flags[pi] = (self.map.flags[pi] | IN_TPM) & !TPM_ABORT;
                self.tpm.push(TpmInFlight {
                    page: p,
                    from,
                    to,
                    keep_shadow,
                });
                // The mover copies its batch page by page: this page's
                // copy begins when the one before it ends.
                let start = self.tpm_end_ns.max(self.now);
                self.map.tpm_copy_start[pi] = start;
                // `as` saturates: any finite or infinite cost is safe.
                self.tpm_end_ns = start.saturating_add(self.costs.tpm_page_ns() as u64);
                2.0 * shootdown.ipi
            }
            _ => {
                self.move_page(pi, from, to);
                // Held from now until its copy is mapped (the
                // faulting thread itself pays this as its stall).
                self.map.flags[pi] |= LOCKED;
                self.map.locked_until[pi] = self.now + shootdown.hold_ns as u64;
                shootdown.ipi
            }
        }
    }

    /// Whether `now` falls in the transactional copy of page `pi`, from
    /// the cleaning of its PTE to the check of its dirty bit (Nomad's
    /// `migrate_pages` moves a batch one page at a time: a write to a page
    /// before its own copy begins is cleaned away, one after the check
    /// finds the page moved).
    fn in_tpm_copy(&self, pi: usize, now: u64) -> bool {
        let start = self.map.tpm_copy_start[pi];
        now >= start && now < start.saturating_add(self.costs.tpm_page_ns() as u64)
    }

    fn move_page(&mut self, pi: usize, from: TierId, to: TierId) {
        self.drop_shadow(pi);
        self.map.tier[pi] = to;
        self.used[usize::from(from)] -= 1;
        self.used[usize::from(to)] += 1;
        if to < from {
            self.raw.promotions += 1;
        } else {
            self.raw.demotions += 1;
        }
    }

    fn drop_shadow(&mut self, pi: usize) {
        let s = self.map.shadow[pi];
        if s != NO_SHADOW {
            self.shadows[usize::from(s)] -= 1;
            self.map.shadow[pi] = NO_SHADOW;
        }
    }

    /// Drops up to `want` shadows held in `tier`, oldest first.
    fn reclaim_shadows(&mut self, tier: TierId, want: u64) -> u64 {
        let mut freed = 0;
        let mut keep = VecDeque::new();
        while freed < want {
            let Some(p) = self.shadow_fifo.pop_front() else {
                break;
            };
            let pi = p as usize;
            if self.map.shadow[pi] == tier {
                self.drop_shadow(pi);
                freed += 1;
            } else if self.map.shadow[pi] != NO_SHADOW {
                keep.push_back(p);
            }
        }
        while let Some(p) = keep.pop_back() {
            self.shadow_fifo.push_front(p);
        }
        self.raw.shadows_reclaimed += freed;
        freed
    }

    fn reclaim_for_allocation(&mut self, tier: TierId, pages: u64) -> bool {
        if self.shadows[usize::from(tier)] == 0 {
            return false;
        }
        self.reclaim_shadows(tier, pages * SHADOW_RECLAIM_FACTOR);
        self.free(usize::from(tier)) >= pages
    }

    fn complete_tpm(&mut self) {
        let mut put_back_ns = 0.0;
        for f in std::mem::take(&mut self.tpm) {
            let pi = f.page as usize;
            let mut aborted = self.map.flags[pi] & TPM_ABORT != 0;
            // NOT A TEST: an -EAGAIN other than a dirty PTE, at a chosen rate.
            if !aborted
                && self.map.tier[pi] == f.from
                && self.costs.tpm_busy_abort > 0.0
                && self.busy_abort_rng.chance(self.costs.tpm_busy_abort)
            {
                aborted = true;
            }
            self.map.flags[pi] &= !(IN_TPM | TPM_ABORT);
            self.used[usize::from(f.to)] -= 1;
            if aborted || self.map.tier[pi] != f.from {
                if aborted {
                    self.raw.tpm_aborts += 1;
                    put_back_ns += self.costs.tpm_abort_ns;
                }
                self.outcomes.push(TpmOutcome {
                    page: f.page,
                    committed: false,
                });
                continue;
            }
            self.raw.tpm_commits += 1;
            self.move_page(pi, f.from, f.to);
            if f.keep_shadow && f.to < f.from {
                // The old page stays allocated as the shadow.
                self.shadows[usize::from(f.from)] += 1;
                self.map.shadow[pi] = f.from;
                self.shadow_fifo.push_back(f.page);
            }
            self.outcomes.push(TpmOutcome {
                page: f.page,
                committed: true,
            });
        }
        if put_back_ns > 0.0 {
            // The mover puts the aborted pages back before it copies more.
            self.tpm_end_ns = self
                .tpm_end_ns
                .max(self.now)
                .saturating_add(put_back_ns as u64);
        }
    }

    /// Protects the next pages for hint faults, as Linux's NUMA-balancing
    /// scanner does in memory-tiering mode (`task_numa_work`,
    /// kernel/sched/fair.c; TPP, Nomad):
    /// 1. the address space is walked in 2 MiB ranges ([`SCAN_RANGE_BYTES`])
    ///    from where the last walk stopped, wrapping at the end;
    /// 2. in a range, the pages of the tracked tiers that are not protected
    ///    yet are protected (top-tier pages are skipped: `change_prot_numa`
    ///    changes no PTE there);
    /// 3. a range in which some PTE changed costs its whole length of the
    ///    scan budget (`pages -= (end - start) >> PAGE_SHIFT` when
    ///    `nr_pte_updates`); every range costs its length of the virtual
    ///    budget, [`SCAN_VIRTUAL_FACTOR`] times the scan budget, so address
    ///    space with nothing to protect is crossed 8x faster;
    /// 4. the walk stops when either budget is spent; what is over- or
    ///    under-spent carries to the next quantum;
    /// 5. the budget is the policy's scan rate times
    ///    [`ScanPeriod::rate_factor`]: the period starts at 1000 ms and
    ///    doubles, up to `task_scan_max`, at the first hint fault of each
    ///    new pass (every hint fault counts here; in 6.3 only one that
    ///    promotes does, and one comes within a pass).
    fn scan_hint(&mut self) {
        let n = self.map.tier.len() as u64;
        if self.hint_mask == 0 || n == 0 {
            return;
        }
        let per_quantum = self.trackers.hint_scan_pages_per_sec
            * self
                .scan_period
                .as_ref()
                .map_or(1.0, ScanPeriod::rate_factor)
            * (self.quantum_ns as f64 / 1e9)
            / self.scale;
        let range = ((SCAN_RANGE_BYTES / PAGE_SIZE as u64) as f64 / self.scale).max(1.0) as u64;
        let mut pages_left = per_quantum + self.scan_carry;
        let mut virt_left = SCAN_VIRTUAL_FACTOR * per_quantum + self.scan_virt_carry;
        while pages_left > 0.0 && virt_left > 0.0 {
            let start = self.scan_cursor;
            let end = (start + range).min(n);
            let mut changed = false;
            for p in start as usize..end as usize {
                if self.hint_mask & (1 << self.map.tier[p]) != 0
                    && self.map.flags[p] & PROTECTED == 0
                {
                    self.map.flags[p] |= PROTECTED;
                    self.map.scan_time[p] = self.now;
                    changed = true;
                }
            }
            let len = (end - start) as f64;
            if changed {
                pages_left -= len;
            }
            virt_left -= len;
            self.scan_cursor = if end >= n {
                self.scan_seq += 1;
                0
            } else {
                end
            };
        }
        // A budget that ran out carries its overdraft; the other one is
        // not saved up (Linux starts each period afresh).
        self.scan_carry = pages_left.min(0.0);
        self.scan_virt_carry = virt_left.min(0.0);
    }
}

/// `events` sampled-event occurrences on `countdown` (events left to the
/// next sample; 0 = this event is not sampled): each time it runs out,
/// `sample` is taken and the countdown restarts at `period`.
fn count_event(
    countdown: &mut u64,
    period: u64,
    events: u64,
    samples: &mut Vec<AccessSample>,
    sample: AccessSample,
) {
    if *countdown == 0 {
        return;
    }
    let mut left = events;
    while left >= *countdown {
        left -= *countdown;
        *countdown = period.max(1);
        samples.push(sample);
    }
    *countdown -= left;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_of_many_lines_counts_one_event_per_line() {
        let sample = AccessSample {
            page: 7,
            tier: 1,
            write: false,
        };
        let mut samples = Vec::new();
        let mut countdown = 3;
        // A 4 KiB copy is 64 line events: one sample every 3 events.
        count_event(&mut countdown, 3, 64, &mut samples, sample);
        assert_eq!(samples.len(), 21);
        assert_eq!(countdown, 2); // 64 = 21 x 3 + 1
        count_event(&mut countdown, 3, 2, &mut samples, sample);
        assert_eq!((samples.len(), countdown), (22, 3));
        // Events that are not sampled (countdown 0) stay unsampled.
        let mut off = 0;
        count_event(&mut off, 3, 64, &mut samples, sample);
        assert_eq!((samples.len(), off), (22, 0));
    }
}
