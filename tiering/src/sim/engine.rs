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
use super::report::{Counters, RunReport, TierTraffic, TimelinePoint};
use super::scenario::Scenario;
use super::workload::{
    AccessStream, GaussianHotStream, GupsStream, KvStream, PageAccess, PagerankStream,
    WorkloadSpec, ZipfStream,
};
use super::SimError;
use crate::policy::{
    AccessSample, HintFault, Mechanism, MemoryView, Migration, Observations, Policy, PolicyConfig,
    PolicyKind, TierId, TierStatus, TpmOutcome, TrackerRequest, Urgency, PAGE_BYTES,
};

/// Shortest simulation quantum: 1 ms of modeled time.
pub const MIN_QUANTUM_NS: u64 = 1_000_000;
/// Longest simulation quantum: 10 ms (Colloid's quantum).
pub const MAX_QUANTUM_NS: u64 = 10_000_000;
/// The quantum is sized for about this many simulated accesses (per-quantum
/// work is then amortized), within [MIN_QUANTUM_NS, MAX_QUANTUM_NS].
pub const ACCESSES_PER_QUANTUM: f64 = 512.0;
/// Timeline buckets per run.
pub const TIMELINE_POINTS: usize = 40;
/// Fraction of each tier left free at start (as Linux keeps watermarks).
pub const INITIAL_FREE_FRACTION: f64 = 0.004;
/// On an allocation failure, shadows are freed up to this many times the
/// request (Nomad §3.2).
pub const SHADOW_RECLAIM_FACTOR: u64 = 10;

const ACCESSED: u8 = 1;
const DIRTY: u8 = 2;
const PROTECTED: u8 = 4;
const IN_TPM: u8 = 8;
const TPM_ABORT: u8 = 16;
const NO_SHADOW: u8 = u8::MAX;

/// Initial placement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Placement {
    /// Fill tiers fastest first in address order (first touch).
    FirstTouch,
    /// GUPS only: this share of the hot set in tier 0, the rest of tier 0
    /// filled with cold pages (Colloid's best-case static split).
    HotShare(f64),
}

/// The page map: the simulator's [`MemoryView`].
struct PageMap {
    tier: Vec<TierId>,
    flags: Vec<u8>,
    shadow: Vec<TierId>,
    scan_time: Vec<u64>,
}

impl MemoryView for PageMap {
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

enum Stream {
    Zipf(ZipfStream),
    Gups(GupsStream),
    Gauss(GaussianHotStream),
    Kv(Box<KvStream>),
    Pagerank(PagerankStream),
}

impl Stream {
    #[inline]
    fn next(&mut self, rng: &mut Rng) -> PageAccess {
        match self {
            Self::Zipf(s) => s.next_access(rng),
            Self::Gups(s) => s.next_access(rng),
            Self::Gauss(s) => s.next_access(rng),
            Self::Kv(s) => s.next_access(rng),
            Self::Pagerank(s) => s.next_access(rng),
        }
    }
}

struct TpmInFlight {
    page: u64,
    from: TierId,
    to: TierId,
    keep_shadow: bool,
}

/// Raw (modeled-unit) counters.
#[derive(Default)]
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
    sync_promotions: u64,
    rejected: u64,
}

struct Sim {
    scale: f64,
    threads: f64,
    mlp: f64,
    costs: CostModel,
    bw: Vec<f64>,
    ant_u: Vec<f64>,
    cap: Vec<u64>,
    used: Vec<u64>,
    shadows: Vec<u64>,
    map: PageMap,
    shadow_fifo: VecDeque<u64>,
    stream: Stream,
    rng: Rng,
    trackers: TrackerRequest,
    hint_mask: u64,
    scan_cursor: u64,
    scan_carry: f64,
    sample_countdown: u64,
    samples: Vec<AccessSample>,
    outcomes: Vec<TpmOutcome>,
    dirty: Vec<u64>,
    tpm: Vec<TpmInFlight>,
    tpm_end_ns: u64,
    lat: Vec<f64>,
    mix: Vec<f64>,
    mig_bytes_q: Vec<f64>,
    pending_stall_slots: f64,
    now: u64,
    raw: Raw,
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
    tiers_model: Vec<TierModel>,
    quantum_ns: u64,
    mig_u: Vec<f64>,
}

impl Sim {
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
            };
        }
    }

    fn solve_latency(&mut self) {
        let n = self.cap.len();
        let q_s = self.quantum_ns as f64 / 1e9;
        for t in 0..n {
            self.mig_u[t] = self.mig_bytes_q[t] * self.scale / q_s / (self.bw[t] * 1e9);
        }
        for _ in 0..12 {
            let lbar: f64 = (0..n)
                .map(|t| self.mix[t] * self.lat[t])
                .sum::<f64>()
                .max(1.0);
            let rate = self.threads * self.mlp / lbar * 1e9; // accesses per second
            for t in 0..n {
                let u = rate * self.mix[t] * self.access_bytes / (self.bw[t] * 1e9)
                    + self.ant_u[t]
                    + self.mig_u[t];
                let target = self.tiers_model[t].loaded_ns(u);
                self.lat[t] = 0.5 * self.lat[t] + 0.5 * target;
            }
        }
    }
}

// The tier models live beside the Sim (kept out of the hot struct fields above).
impl Sim {
    #[allow(clippy::too_many_lines)]
    fn apply(&mut self, m: &Migration, policy_name: &str) -> f64 {
        // Returns stall slot-ns charged to the application (IPIs).
        let mut stall_slots = 0.0;
        let n = self.cap.len();
        let to = m.to;
        if usize::from(to) >= n {
            self.raw.rejected += u64::from(m.unit.pages);
            return 0.0;
        }
        let ipi = self.scale * self.threads * self.mlp * self.costs.ipi_receive_ns;
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
                    self.map.tier[pi] = to;
                    self.map.shadow[pi] = NO_SHADOW;
                    self.shadows[usize::from(to)] -= 1;
                    self.used[usize::from(to)] += 1;
                    self.used[usize::from(from)] -= 1;
                    self.raw.shadow_demotions += 1;
                    self.raw.demotions += 1;
                    stall_slots += ipi;
                    continue;
                }
                self.raw.shadow_misses += 1;
                mech = Mechanism::StopAndCopy;
            }
            if self.free(usize::from(to)) < 1 && !self.reclaim_for_allocation(to, 1) {
                self.raw.rejected += 1;
                if self.raw.rejected == 1 {
                    tracing::debug!(policy_name, page = p, to, "destination full");
                }
                continue;
            }
            let copy = PAGE_BYTES as f64;
            self.mig_bytes_q[usize::from(from)] += copy;
            self.mig_bytes_q[usize::from(to)] += copy;
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
                    self.tpm_end_ns =
                        self.tpm_end_ns.max(self.now) + self.costs.tpm_page_ns() as u64;
                    stall_slots += 2.0 * ipi;
                }
                _ => {
                    self.move_page(pi, from, to);
                    stall_slots += ipi;
                }
            }
        }
        stall_slots
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
        for f in std::mem::take(&mut self.tpm) {
            let pi = f.page as usize;
            let aborted = self.map.flags[pi] & TPM_ABORT != 0;
            self.map.flags[pi] &= !(IN_TPM | TPM_ABORT);
            self.used[usize::from(f.to)] -= 1;
            if aborted || self.map.tier[pi] != f.from {
                self.raw.tpm_aborts += u64::from(aborted);
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
    }

    fn scan_hint(&mut self) {
        if self.hint_mask == 0 {
            return;
        }
        let n = self.map.tier.len() as u64;
        let want = self.trackers.hint_scan_pages_per_sec * (self.quantum_ns as f64 / 1e9)
            / self.scale
            + self.scan_carry;
        let whole = want.floor();
        self.scan_carry = want - whole;
        for _ in 0..(whole as u64).min(n) {
            let p = self.scan_cursor as usize;
            self.scan_cursor = (self.scan_cursor + 1) % n;
            if self.hint_mask & (1 << self.map.tier[p]) != 0 && self.map.flags[p] & PROTECTED == 0 {
                self.map.flags[p] |= PROTECTED;
                self.map.scan_time[p] = self.now;
            }
        }
    }
}

/// Runs `policy` on `scn` with first-touch placement.
pub fn run(scn: &Scenario, policy: PolicyKind) -> Result<RunReport, SimError> {
    run_with(scn, policy, Placement::FirstTouch)
}

/// Runs `policy` on `scn` with the given initial placement.
#[allow(clippy::too_many_lines)]
pub fn run_with(
    scn: &Scenario,
    policy_kind: PolicyKind,
    placement: Placement,
) -> Result<RunReport, SimError> {
    validate(scn)?;
    let started = Instant::now();
    let s = scn.workload.effective_scale(scn.scale);
    let gib_pages = |g: f64| ((g * (1u64 << 30) as f64 / PAGE_BYTES as f64) / s).round() as u64;
    // kv and pagerank run a scaled-down instance of the guest workload
    // whose own layout defines the modeled page space.
    let guest_stream = if let Some(p) = scn.workload.kv_params_at(s) {
        Some(Stream::Kv(Box::new(KvStream::new(&p))))
    } else if let Some(p) = scn.workload.pagerank_params_at(s) {
        Some(Stream::Pagerank(
            PagerankStream::new(&p, scn.seed).map_err(SimError::InvalidScenario)?,
        ))
    } else {
        None
    };
    let pages = match &guest_stream {
        Some(Stream::Kv(k)) => k.pages(),
        Some(Stream::Pagerank(g)) => g.pages(),
        _ => gib_pages(scn.workload.footprint_gib()).max(1),
    };
    // Writes add a write-back to the bandwidth model: the guest workloads'
    // own write share, else the scenario's.
    let write_share = match &guest_stream {
        Some(Stream::Kv(k)) => k.write_fraction(4096),
        Some(Stream::Pagerank(g)) => g.write_fraction(),
        _ => scn.write_ratio.clamp(0.0, 1.0),
    };
    let cap: Vec<u64> = scn
        .tiers
        .iter()
        .map(|t| gib_pages(t.capacity_gib))
        .collect();
    let n = cap.len();
    let fill: Vec<u64> = cap
        .iter()
        .map(|&c| c - ((c as f64 * INITIAL_FREE_FRACTION).ceil() as u64).min(c))
        .collect();
    if fill.iter().sum::<u64>() < pages {
        return Err(SimError::DoesNotFit {
            footprint_gib: scn.workload.footprint_gib(),
            tiers_gib: scn.tiers.iter().map(|t| t.capacity_gib).sum(),
        });
    }
    let mut layout_rng = Rng::for_stream(scn.seed, 1);
    let stream = match (guest_stream, &scn.workload) {
        (Some(g), _) => g,
        (None, WorkloadSpec::Kv { .. } | WorkloadSpec::Pagerank { .. }) => {
            return Err(SimError::InvalidScenario(
                "kv/pagerank stream could not be built".into(),
            ))
        }
        (
            None,
            &WorkloadSpec::Zipf {
                rss_gib,
                wss_gib,
                theta,
            },
        ) => {
            let wss = gib_pages(wss_gib.min(rss_gib)).clamp(1, pages);
            Stream::Zipf(ZipfStream::new(pages - wss, wss, theta, scn.write_ratio))
        }
        (
            None,
            &WorkloadSpec::Gups {
                hot_gib, hot_prob, ..
            },
        ) => Stream::Gups(GupsStream::new(
            pages,
            gib_pages(hot_gib),
            hot_prob,
            scn.write_ratio,
            layout_rng.next_u64(),
        )),
        (
            None,
            &WorkloadSpec::GaussianHot {
                hot_fraction,
                hot_prob,
                ..
            },
        ) => Stream::Gauss(GaussianHotStream::new(
            pages,
            ((pages as f64 * hot_fraction) as u64).max(1),
            hot_prob,
            scn.write_ratio,
        )),
    };
    // Initial placement.
    let mut tier = vec![0 as TierId; pages as usize];
    let mut used = vec![0u64; n];
    let mut order: Vec<u64> = (0..pages).collect();
    if let (Placement::HotShare(share), Stream::Gups(g)) = (placement, &stream) {
        let hot: Vec<u64> = g.hot_pages().collect();
        let k = ((hot.len() as f64 * share.clamp(0.0, 1.0)).round() as usize).min(fill[0] as usize);
        let mut is_hot = vec![false; pages as usize];
        for &h in &hot {
            is_hot[h as usize] = true;
        }
        let chosen: Vec<u64> = hot[..k].to_vec();
        let rest_hot = hot[k..].to_vec();
        let cold: Vec<u64> = (0..pages).filter(|&p| !is_hot[p as usize]).collect();
        // Tier 0: chosen hot + cold filler; then the remaining hot pages
        // go first into the slower tiers, then the remaining cold pages.
        let filler = (fill[0] as usize).saturating_sub(k).min(cold.len());
        order = chosen;
        order.extend_from_slice(&cold[..filler]);
        order.extend(rest_hot);
        order.extend_from_slice(&cold[filler..]);
    }
    {
        // Fastest tier first, or slowest first when the scenario starts with
        // every page demoted (Nomad's Redis cases 1 and 2).
        let tier_order: Vec<usize> = if scn.start_in_slow_tier {
            (0..n).rev().collect()
        } else {
            (0..n).collect()
        };
        let mut ti = 0usize;
        for &p in &order {
            while used[tier_order[ti]] >= fill[tier_order[ti]] {
                ti += 1;
            }
            let t = tier_order[ti];
            tier[p as usize] = t as TierId;
            used[t] += 1;
        }
    }
    let config = PolicyConfig {
        pages,
        tier_capacity_pages: cap.clone(),
        scale: s,
        promote_rate_limit_mbps: scn.promote_rate_limit_mbps,
        interval_ns: None,
        accessed_test_cost_ns: None,
    };
    let mut policy: Box<dyn Policy> = policy_kind.build(&config)?;
    let trackers = policy.trackers();
    let hint_mask = trackers
        .hint_fault_tiers
        .iter()
        .filter(|&&t| usize::from(t) < n)
        .fold(0u64, |m, &t| m | 1 << t);
    let mut ant_u = vec![0.0; n];
    if let Some(a) = &scn.antagonist {
        if let Some(u) = ant_u.get_mut(usize::from(a.tier)) {
            *u = a.utilization;
        }
    }
    let mix: Vec<f64> = {
        let tot = pages as f64;
        used.iter().map(|&u| u as f64 / tot).collect()
    };
    let mut sim = Sim {
        scale: s,
        threads: f64::from(scn.threads),
        mlp: scn.mlp,
        costs: scn.costs.clone(),
        bw: scn.tiers.iter().map(|t| t.bandwidth_gbps).collect(),
        ant_u,
        cap: cap.clone(),
        used,
        shadows: vec![0; n],
        map: PageMap {
            tier,
            flags: vec![0; pages as usize],
            shadow: vec![NO_SHADOW; pages as usize],
            scan_time: vec![0; pages as usize],
        },
        shadow_fifo: VecDeque::new(),
        stream,
        rng: Rng::for_stream(scn.seed, 0),
        trackers: trackers.clone(),
        hint_mask,
        scan_cursor: 0,
        scan_carry: 0.0,
        sample_countdown: trackers.sample_period,
        samples: Vec::new(),
        outcomes: Vec::new(),
        dirty: Vec::new(),
        tpm: Vec::new(),
        tpm_end_ns: 0,
        lat: scn.tiers.iter().map(|t| t.unloaded_ns).collect(),
        mix,
        mig_bytes_q: vec![0.0; n],
        pending_stall_slots: 0.0,
        now: 0,
        raw: Raw::default(),
        win_acc: vec![0; n],
        win_lat: vec![0.0; n],
        win_start: 0,
        status: vec![
            TierStatus {
                capacity_pages: 0,
                free_pages: 0,
                shadow_pages: 0,
                loaded_latency_ns: None,
                request_rate: None
            };
            n
        ],
        tot_acc: vec![0; n],
        tot_lat: vec![0.0; n],
        tot_bytes: vec![0.0; n],
        tot_mig_bytes: vec![0.0; n],
        tot_ant_bytes: vec![0.0; n],
        access_bytes: scn.access_bytes * (1.0 + write_share),
        tiers_model: scn.tiers.clone(),
        quantum_ns: MIN_QUANTUM_NS,
        mig_u: vec![0.0; n],
    };
    // Quantum: about ACCESSES_PER_QUANTUM simulated accesses at unloaded speed.
    let fastest = scn
        .tiers
        .iter()
        .map(|t| t.unloaded_ns)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let sim_rate = sim.threads * sim.mlp / fastest * 1e9 / s;
    let quantum_ns = ((ACCESSES_PER_QUANTUM / sim_rate * 1e9 / MIN_QUANTUM_NS as f64).floor()
        as u64
        * MIN_QUANTUM_NS)
        .clamp(MIN_QUANTUM_NS, MAX_QUANTUM_NS);
    sim.quantum_ns = quantum_ns;
    let quanta = ((scn.duration_s * 1e9) / quantum_ns as f64).ceil().max(1.0) as u64;
    let tick_ns = policy.tick_interval_ns().max(1);
    let mut next_tick = tick_ns;
    let per_point = quanta.div_ceil(TIMELINE_POINTS as u64).max(1);
    let mut timeline = Vec::new();
    let (mut pt_acc, mut pt_lat, mut pt_fast, mut pt_q) = (0u64, 0.0f64, 0u64, 0u64);
    let phase_q = ((quanta as f64 * scn.phase_fraction.clamp(0.01, 0.5)).round() as u64).max(1);
    let (mut first_acc, mut last_acc) = (0u64, 0u64);
    let mut sim_accesses = 0u64;
    let slots_per_q = sim.threads * sim.mlp * quantum_ns as f64;
    let mut carry = 0.0f64;
    let fault_slots = s * sim.costs.fault_ns * sim.mlp;
    let ipi_others = s * (sim.threads - 1.0).max(0.0) * sim.mlp * sim.costs.ipi_receive_ns;
    let sync_slots = s * sim.costs.stop_and_copy_ns() * sim.mlp;
    let name = policy.kind().name();
    let mut q_acc = vec![0u64; n];
    let mut q_lat = vec![0.0f64; n];
    let mut q_bytes = vec![0.0f64; n];
    let mut lat_scaled = vec![0.0f64; n];
    for q in 0..quanta {
        let q_start = q * quantum_ns;
        sim.now = q_start;
        sim.solve_latency();
        sim.mig_bytes_q.iter_mut().for_each(|b| *b = 0.0);
        for (l, &lat) in lat_scaled.iter_mut().zip(&sim.lat) {
            *l = lat * s;
        }
        let budget = slots_per_q + carry - sim.pending_stall_slots;
        sim.pending_stall_slots = 0.0;
        let mut slots = budget;
        q_acc.iter_mut().for_each(|x| *x = 0);
        q_lat.iter_mut().for_each(|x| *x = 0.0);
        q_bytes.iter_mut().for_each(|x| *x = 0.0);
        let slot_rate = slots_per_q / quantum_ns as f64; // slot-ns per ns
        while slots > 0.0 {
            let a = sim.stream.next(&mut sim.rng);
            let pi = a.page as usize;
            let mut fl = sim.map.flags[pi];
            let mut t = sim.map.tier[pi];
            let mut stall = 0.0;
            if fl & (PROTECTED | IN_TPM) != 0 || (a.write && sim.map.shadow[pi] != NO_SHADOW) {
                let now = q_start + ((budget - slots) / slot_rate).max(0.0) as u64;
                if fl & PROTECTED != 0 {
                    fl &= !PROTECTED;
                    sim.map.flags[pi] = fl;
                    sim.raw.hint_faults += 1;
                    stall += fault_slots;
                    let fault = HintFault {
                        page: a.page,
                        tier: t,
                        time_to_fault_ns: now.saturating_sub(sim.map.scan_time[pi]),
                        write: a.write,
                        now_ns: now,
                    };
                    sim.now = now;
                    sim.refresh_status();
                    if let Some(m) = policy.on_hint_fault(&fault, &sim.status, &mut sim.map) {
                        if m.urgency == Urgency::BeforeFaultingAccessResumes
                            && m.unit.page == a.page
                        {
                            let before = sim.raw.promotions;
                            let stop = Migration {
                                mechanism: Mechanism::StopAndCopy,
                                ..m
                            };
                            sim.apply(&stop, name);
                            if sim.raw.promotions > before {
                                sim.raw.sync_promotions += 1;
                            }
                            stall += sync_slots + ipi_others;
                        } else {
                            sim.pending_stall_slots += sim.apply(&m, name);
                        }
                        t = sim.map.tier[pi];
                    }
                    fl = sim.map.flags[pi];
                }
                if a.write && sim.map.shadow[pi] != NO_SHADOW {
                    // Shadowed masters are read-only: a write faults and drops the shadow.
                    sim.drop_shadow(pi);
                    sim.raw.shadow_write_faults += 1;
                    stall += fault_slots;
                }
                if a.write && fl & IN_TPM != 0 && now < sim.tpm_end_ns {
                    fl |= TPM_ABORT;
                }
            }
            if a.write {
                if fl & DIRTY == 0 && sim.trackers.dirty_log {
                    sim.dirty.push(a.page);
                }
                fl |= DIRTY;
            }
            sim.map.flags[pi] = fl | ACCESSED;
            if sim.sample_countdown > 0 {
                sim.sample_countdown -= 1;
                if sim.sample_countdown == 0 {
                    sim.sample_countdown = sim.trackers.sample_period;
                    sim.samples.push(AccessSample {
                        page: a.page,
                        tier: t,
                        write: a.write,
                    });
                }
            }
            let ti = usize::from(t);
            q_acc[ti] += 1;
            q_lat[ti] += sim.lat[ti];
            q_bytes[ti] += if a.write { 2.0 } else { 1.0 };
            slots -= lat_scaled[ti] + stall;
            sim_accesses += 1;
        }
        carry = slots;
        sim.now = q_start + quantum_ns;
        // Bookkeeping.
        let tot_q: u64 = q_acc.iter().sum();
        for t in 0..n {
            sim.win_acc[t] += q_acc[t];
            sim.win_lat[t] += q_lat[t];
            sim.tot_acc[t] += q_acc[t];
            sim.tot_lat[t] += q_lat[t];
            sim.tot_bytes[t] += q_bytes[t] * scn.access_bytes * s;
            sim.tot_ant_bytes[t] += sim.ant_u[t] * sim.bw[t] * 1e9 * quantum_ns as f64 / 1e9;
            if tot_q > 0 {
                sim.mix[t] = q_acc[t] as f64 / tot_q as f64;
            }
        }
        pt_acc += tot_q;
        pt_lat += q_lat.iter().sum::<f64>();
        pt_fast += q_acc[0];
        pt_q += 1;
        if q < phase_q {
            first_acc += tot_q;
        }
        if q >= quanta - phase_q {
            last_acc += tot_q;
        }
        if pt_q == per_point || q + 1 == quanta {
            let secs = pt_q as f64 * quantum_ns as f64 / 1e9;
            timeline.push(TimelinePoint {
                t_s: sim.now as f64 / 1e9,
                throughput_maps: pt_acc as f64 * s / secs / 1e6,
                avg_latency_ns: if pt_acc > 0 {
                    pt_lat / pt_acc as f64
                } else {
                    0.0
                },
                fast_share: if pt_acc > 0 {
                    pt_fast as f64 / pt_acc as f64
                } else {
                    0.0
                },
            });
            (pt_acc, pt_lat, pt_fast, pt_q) = (0, 0.0, 0, 0);
        }
        // Mechanisms and trackers.
        if !sim.tpm.is_empty() && sim.now >= sim.tpm_end_ns {
            sim.complete_tpm();
        }
        sim.scan_hint();
        if sim.now >= next_tick {
            next_tick += tick_ns * ((sim.now - next_tick) / tick_ns + 1);
            sim.refresh_status();
            let samples = std::mem::take(&mut sim.samples);
            let outcomes = std::mem::take(&mut sim.outcomes);
            let dirty = std::mem::take(&mut sim.dirty);
            for &p in &dirty {
                sim.map.flags[p as usize] &= !DIRTY;
            }
            let status = sim.status.clone();
            let obs = Observations {
                now_ns: sim.now,
                tiers: &status,
                samples: &samples,
                tpm_outcomes: &outcomes,
                dirty: &dirty,
            };
            let d = policy.tick(&obs, &mut sim.map);
            for (t, k) in &d.reclaim_shadows {
                if usize::from(*t) < n {
                    sim.reclaim_shadows(*t, *k);
                }
            }
            for m in &d.migrations {
                sim.pending_stall_slots += sim.apply(m, name);
            }
            sim.win_acc.iter_mut().for_each(|x| *x = 0);
            sim.win_lat.iter_mut().for_each(|x| *x = 0.0);
            sim.win_start = sim.now;
        }
        for t in 0..n {
            sim.tot_mig_bytes[t] += sim.mig_bytes_q[t] * s;
        }
    }
    let dur = quanta as f64 * quantum_ns as f64 / 1e9;
    let phase_s = phase_q as f64 * quantum_ns as f64 / 1e9;
    let total_acc: u64 = sim.tot_acc.iter().sum();
    let total_lat: f64 = sim.tot_lat.iter().sum();
    let r = &sim.raw;
    let c = |x: u64| x as f64 * s;
    let counters = Counters {
        promotions: c(r.promotions),
        demotions: c(r.demotions),
        shadow_demotions: c(r.shadow_demotions),
        shadow_misses: c(r.shadow_misses),
        tpm_commits: c(r.tpm_commits),
        tpm_aborts: c(r.tpm_aborts),
        shadow_write_faults: c(r.shadow_write_faults),
        shadows_reclaimed: c(r.shadows_reclaimed),
        hint_faults: c(r.hint_faults),
        sync_promotions: c(r.sync_promotions),
        rejected: c(r.rejected),
    };
    let tiers = (0..n)
        .map(|t| TierTraffic {
            name: scn.tiers[t].name.clone(),
            accesses: c(sim.tot_acc[t]),
            app_gb: sim.tot_bytes[t] / 1e9,
            migration_gb: sim.tot_mig_bytes[t] / 1e9,
            antagonist_gb: sim.tot_ant_bytes[t] / 1e9,
            avg_loaded_latency_ns: if sim.tot_acc[t] > 0 {
                sim.tot_lat[t] / sim.tot_acc[t] as f64
            } else {
                0.0
            },
            pages_at_end: sim.used[t] as f64 * s,
        })
        .collect();
    Ok(RunReport {
        modeled: true,
        scenario: scn.name.clone(),
        policy: name.to_string(),
        duration_s: dur,
        throughput_maps: total_acc as f64 * s / dur / 1e6,
        in_progress_maps: first_acc as f64 * s / phase_s / 1e6,
        stable_maps: last_acc as f64 * s / phase_s / 1e6,
        avg_latency_ns: if total_acc > 0 {
            total_lat / total_acc as f64
        } else {
            0.0
        },
        counters,
        tiers,
        timeline,
        simulated_accesses: sim_accesses,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

fn validate(scn: &Scenario) -> Result<(), SimError> {
    let bad = |what: &str| Err(SimError::InvalidScenario(what.to_string()));
    if scn.tiers.is_empty() || scn.tiers.len() > 64 {
        return bad("need 1 to 64 tiers");
    }
    if !(scn.scale.is_finite() && scn.scale >= 1.0) {
        return bad("scale must be >= 1 (real pages per modeled page)");
    }
    if !(scn.duration_s.is_finite() && scn.duration_s > 0.0 && scn.duration_s <= 1e6) {
        return bad("duration must be in (0, 1e6] seconds");
    }
    if scn.threads == 0 || !(scn.mlp.is_finite() && scn.mlp > 0.0) {
        return bad("threads and mlp must be positive");
    }
    if !(0.0..=1.0).contains(&scn.write_ratio) {
        return bad("write ratio must be in [0, 1]");
    }
    for t in &scn.tiers {
        if !(t.capacity_gib > 0.0
            && t.unloaded_ns > 0.0
            && t.bandwidth_gbps > 0.0
            && t.queue_k >= 0.0)
        {
            return bad("every tier needs positive capacity, latency and bandwidth");
        }
    }
    let pages = scn.workload.footprint_gib() * (1u64 << 30) as f64 / PAGE_BYTES as f64 / scn.scale;
    if !(1.0..=64e6).contains(&pages) {
        return bad("footprint / scale must be between 1 and 64M modeled pages (raise --scale)");
    }
    if let Some(a) = &scn.antagonist {
        if usize::from(a.tier) >= scn.tiers.len() || !(0.0..1.0).contains(&a.utilization) {
            return bad("antagonist tier must exist and its utilization be in [0, 1)");
        }
    }
    Ok(())
}
