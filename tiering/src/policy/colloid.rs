//! `colloid`: Colloid (SOSP'24) Algorithms 1-2 over a HeMem-style base tracker.
//!
//! Each quantum ([`QUANTUM_NS`], HeMem's 10 ms):
//! 1. read the loaded latencies `L_D`, `L_A` and request rates `R_D`, `R_A`
//!    of the default tier (0) and the alternate tier (1) from
//!    [`TierStatus`] (the latency source is the engine's business: modeled
//!    in the simulator, CHA counters where a host has them);
//!    `p = R_D / (R_D + R_A)`;
//! 2. mode = promotion if `L_D < L_A`, else demotion;
//! 3. `dp` = [`ShiftSearch::compute_shift`] (binary search with watermarks);
//! 4. FindPages: hottest pages first (5 equal frequency bins over
//!    `[0, COOLING_THRESHOLD]`), each page's access probability
//!    `count / total` must fit in the remaining `dp`, at most
//!    `min(dp * (R_D + R_A) * quantum * 64 B, M)` bytes, and never more than
//!    the destination has free;
//! 5. migrate (background stop-and-copy).
//!
//! The base tracker counts sampled accesses per page and halves all counts
//! when one reaches [`COOLING_THRESHOLD`] (HeMem). As in HeMem, a promotion
//! into a full default tier first demotes a cold page to make room, and
//! the default tier keeps a small free reserve. Only tiers 0 and 1 take
//! part (the paper evaluates two tiers).

use std::collections::HashSet;

use super::hotness::{ClockHand, SampleCounts};
use super::types::*;
use super::{Policy, PolicyKind};

/// Quantum: HeMem's 10 ms migration-thread period (Colloid §4.1).
pub const QUANTUM_NS: u64 = 10_000_000;
/// Watermark reset gap `epsilon` (Colloid §5, evaluation value).
pub const EPSILON: f64 = 0.01;
/// Latency balance tolerance `delta` (Colloid §5, evaluation value).
pub const DELTA: f64 = 0.05;
/// Static per-quantum migration limit M: 50 x 2 MB (Colloid HeMem code).
pub const STATIC_LIMIT_MB: f64 = 100.0;
/// Bytes per request (one cache line) for the dynamic limit.
pub const REQUEST_BYTES: f64 = 64.0;
/// HeMem `PEBS_COOLING_THRESHOLD` (cuhk-mass/hemem pebs.h): counts halve
/// when a page reaches it.
pub const COOLING_THRESHOLD: u16 = 10;
/// FindPages frequency bins over `[0, COOLING_THRESHOLD]` (Colloid §4.1).
pub const FIND_BINS: usize = 5;
/// Access sampling period (modeled PEBS stand-in; same as Memtis's 199).
pub const SAMPLE_PERIOD: u64 = 199;
/// Free pages kept in the default tier (fraction; as Memtis/TPP's 0.4%).
pub const FREE_RESERVE_FRACTION: f64 = 0.004;

/// Algorithm 2: the binary search for the default tier's share `p`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShiftSearch {
    /// Low watermark.
    pub p_lo: f64,
    /// High watermark.
    pub p_hi: f64,
}

impl Default for ShiftSearch {
    fn default() -> Self {
        Self {
            p_lo: 0.0,
            p_hi: 1.0,
        }
    }
}

impl ShiftSearch {
    /// ComputeShift(p, L_D, L_A): the magnitude of the desired change of `p`.
    pub fn compute_shift(&mut self, p: f64, l_d: f64, l_a: f64) -> f64 {
        if (l_d - l_a).abs() < DELTA * l_d {
            return 0.0;
        }
        if l_d < l_a {
            self.p_lo = p;
        } else {
            self.p_hi = p;
        }
        if self.p_hi < self.p_lo + EPSILON {
            if l_d < l_a {
                self.p_hi = 1.0;
            } else {
                self.p_lo = 0.0;
            }
        }
        ((self.p_lo + self.p_hi) / 2.0 - p).abs()
    }
}

/// The `colloid` policy.
#[derive(Clone, Debug)]
pub struct Colloid {
    search: ShiftSearch,
    counts: SampleCounts,
    tracked: Vec<u64>,
    is_tracked: Vec<bool>,
    hand: ClockHand,
    scale: f64,
    static_limit_pages: u64,
    reserve: u64,
    quantum_ns: u64,
    last_dp: f64,
    base_only: bool,
    limit_carry: f64,
}

/// The quantum's shift: move `dp` of the requests (at `total_rate`
/// requests per second) from tier `src` to tier `dst`.
struct Shift {
    dp: f64,
    total_rate: f64,
    /// Towards the default tier.
    promote: bool,
    src: TierId,
    dst: TierId,
}

/// The decisions of one quantum being built.
struct Moves<'a> {
    budget: &'a mut FreeBudget,
    out: &'a mut Decisions,
    chosen: &'a mut HashSet<u64>,
}

impl Colloid {
    /// Step 2: the share of requests to move, and where, or `None` when
    /// nothing should move (no requests, or the tiers are balanced).
    fn shift(&mut self, tiers: &[TierStatus]) -> Option<Shift> {
        let (d, a) = (tiers[0], tiers[1]);
        let rates = (
            d.request_rate.unwrap_or(0.0).max(0.0),
            a.request_rate.unwrap_or(1.0).max(0.0),
        );
        let (l_d, l_a, r_d, r_a) = match (d.loaded_latency_ns, a.loaded_latency_ns) {
            (Some(ld), Some(la)) if !self.base_only => (ld, la, rates.0, rates.1),
            // Base system, or no latency source: pack the default tier.
            _ => (0.0, 1.0, rates.0, rates.1),
        };
        let total = r_d + r_a;
        if total <= 0.0 {
            return None;
        }
        let p = r_d / total;
        let dp = self.search.compute_shift(p, l_d, l_a);
        self.last_dp = dp;
        if dp <= 0.0 {
            return None;
        }
        let promote = l_d < l_a;
        let (src, dst) = if promote { (1, 0) } else { (0, 1) };
        Some(Shift {
            dp,
            total_rate: total,
            promote,
            src,
            dst,
        })
    }

    /// Step 3: the dynamic limit in (scaled) pages; a fraction carries over
    /// so a low request rate still moves pages now and then.
    fn page_limit(&mut self, shift: &Shift) -> u64 {
        let dyn_pages =
            shift.dp * shift.total_rate * (self.quantum_ns as f64 / 1e9) * REQUEST_BYTES
                / PAGE_BYTES as f64
                / self.scale
                + self.limit_carry;
        let limit = (dyn_pages.floor() as u64).min(self.static_limit_pages);
        self.limit_carry = if limit < self.static_limit_pages {
            dyn_pages - dyn_pages.floor()
        } else {
            0.0
        };
        limit
    }

    /// Step 4: up to `limit` pages of the source tier, from the highest
    /// frequency bin down, each only if its access probability fits in
    /// what is left of the shift (promotions first make room in the
    /// default tier by demoting a cold page, as HeMem does).
    fn move_pages(
        &mut self,
        view: &mut dyn MemoryView,
        shift: &Shift,
        limit: u64,
        moves: &mut Moves<'_>,
    ) {
        let total_count = self.counts.total().max(1) as f64;
        let mut bins: Vec<Vec<u64>> = vec![Vec::new(); FIND_BINS];
        for &pg in &self.tracked {
            if view.tier_of(pg) == shift.src {
                bins[Self::freq_bin(self.counts.count(pg))].push(pg);
            }
        }
        let mut remaining = shift.dp;
        let mut moved = 0u64;
        'bins: for bin in bins.iter_mut().rev() {
            bin.sort_unstable();
            for &pg in bin.iter() {
                if moved >= limit {
                    break 'bins;
                }
                let prob = f64::from(self.counts.count(pg)) / total_count;
                if prob > remaining {
                    continue;
                }
                if shift.promote
                    && moves.budget.free(0) <= self.reserve
                    && self.cold_demotions(view, 1, moves.budget, moves.out, moves.chosen) == 0
                {
                    break 'bins;
                }
                if !moves.budget.take(shift.dst, 1) {
                    break 'bins;
                }
                moves.budget.release(shift.src, 1);
                remaining -= prob;
                moved += 1;
                moves.out.migrations.push(Migration {
                    unit: Unit::page(pg),
                    to: shift.dst,
                    mechanism: Mechanism::StopAndCopy,
                    urgency: Urgency::Background,
                });
            }
        }
    }

    /// Colloid for `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        let fast = config.tier_capacity_pages.first().copied().unwrap_or(0);
        Self {
            search: ShiftSearch::default(),
            counts: SampleCounts::new(config.pages),
            tracked: Vec::new(),
            is_tracked: vec![false; config.pages as usize],
            hand: ClockHand::default(),
            scale: if config.scale > 0.0 && config.scale.is_finite() {
                config.scale
            } else {
                1.0
            },
            static_limit_pages: config.mb_to_pages(STATIC_LIMIT_MB),
            reserve: ((fast as f64 * FREE_RESERVE_FRACTION).round() as u64).max(1),
            quantum_ns: config.interval_ns.unwrap_or(QUANTUM_NS),
            last_dp: 0.0,
            base_only: false,
            limit_carry: 0.0,
        }
    }

    /// The base system alone (`colloid-base`): the same tracker and
    /// FindPages, but latencies ignored, so it packs the hottest pages into
    /// the default tier like HeMem. The reference Colloid's gains are
    /// measured against.
    pub fn base(config: &PolicyConfig) -> Self {
        Self {
            base_only: true,
            ..Self::new(config)
        }
    }

    /// The search state.
    pub fn search(&self) -> ShiftSearch {
        self.search
    }

    /// The last computed shift.
    pub fn last_shift(&self) -> f64 {
        self.last_dp
    }

    fn ingest(&mut self, samples: &[AccessSample]) {
        for s in samples {
            self.counts.add(s.page);
            if let Some(t) = self.is_tracked.get_mut(s.page as usize) {
                if !*t {
                    *t = true;
                    self.tracked.push(s.page);
                }
            }
            if self.counts.count(s.page) >= COOLING_THRESHOLD {
                self.counts.cool();
                let counts = &self.counts;
                let is_tracked = &mut self.is_tracked;
                self.tracked.retain(|&p| {
                    let keep = counts.count(p) > 0;
                    if !keep {
                        is_tracked[p as usize] = false;
                    }
                    keep
                });
            }
        }
    }

    fn freq_bin(count: u16) -> usize {
        (usize::from(count.min(COOLING_THRESHOLD)) * FIND_BINS
            / (usize::from(COOLING_THRESHOLD) + 1))
            .min(FIND_BINS - 1)
    }

    fn cold_demotions(
        &mut self,
        view: &mut dyn MemoryView,
        want: u64,
        budget: &mut FreeBudget,
        out: &mut Decisions,
        chosen: &mut HashSet<u64>,
    ) -> u64 {
        let counts = &self.counts;
        let max_scan = view.pages();
        // The hand may wrap within one tick: never pick a page twice.
        let cold = self.hand.find(view, 0, want, max_scan, |p, _| {
            counts.count(p) == 0 && !chosen.contains(&p)
        });
        let mut n = 0;
        for p in cold {
            if !budget.take(1, 1) {
                break;
            }
            chosen.insert(p);
            budget.release(0, 1);
            n += 1;
            out.migrations.push(Migration {
                unit: Unit::page(p),
                to: 1,
                mechanism: Mechanism::StopAndCopy,
                urgency: Urgency::Background,
            });
        }
        n
    }
}

impl Policy for Colloid {
    fn kind(&self) -> PolicyKind {
        if self.base_only {
            PolicyKind::ColloidBase
        } else {
            PolicyKind::Colloid
        }
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            sample_period: SAMPLE_PERIOD,
            // Colloid on HeMem and Memtis samples with PEBS (Colloid §2.3
            // in the digest: the HeMem and MEMTIS integrations).
            hardware_samples: true,
            ..TrackerRequest::none()
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        self.quantum_ns
    }

    /// Each quantum: 1. keep the default tier's free reserve; 2. compute
    /// the shift of request share between the tiers; 3. turn it into a
    /// page limit; 4. move the pages whose access probability fits the
    /// shift, most frequently accessed first.
    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        self.ingest(obs.samples);
        let mut out = Decisions::none();
        if obs.tiers.len() < 2 {
            return out;
        }
        let mut budget = FreeBudget::from_tiers(obs.tiers);
        let mut chosen = HashSet::new();
        // Base system: keep a small free reserve in the default tier.
        if budget.free(0) < self.reserve && budget.free(1) > 0 {
            let want = self.reserve - budget.free(0);
            self.cold_demotions(view, want, &mut budget, &mut out, &mut chosen);
        }
        let Some(shift) = self.shift(obs.tiers) else {
            return out;
        };
        let room = budget.free(shift.dst) > if shift.promote { self.reserve } else { 0 };
        if !(room || shift.promote && budget.free(1) > 0) {
            return out; // nowhere to move pages to
        }
        let limit = self.page_limit(&shift);
        if limit == 0 {
            return out;
        }
        let mut moves = Moves {
            budget: &mut budget,
            out: &mut out,
            chosen: &mut chosen,
        };
        self.move_pages(view, &shift, limit, &mut moves);
        out
    }

    fn export_state(&self) -> PolicyState {
        let mut hot_pages: Vec<(u64, f32)> = self
            .tracked
            .iter()
            .map(|&p| {
                (
                    p,
                    f32::from(self.counts.count(p)) / f32::from(COOLING_THRESHOLD),
                )
            })
            .collect();
        hot_pages.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        PolicyState {
            from: PolicyKind::Colloid,
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        for &(p, heat) in &state.hot_pages {
            let c = (heat.clamp(0.0, 1.0) * f32::from(COOLING_THRESHOLD - 1)).round() as u16;
            if c == 0 {
                continue;
            }
            self.counts.set(p, c);
            if let Some(t) = self.is_tracked.get_mut(p as usize) {
                if !*t {
                    *t = true;
                    self.tracked.push(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// Latencies on a fixed curve: L_D rises and L_A falls with p.
    fn curve(p: f64, contention: f64) -> (f64, f64) {
        (
            70.0 * (1.0 + contention * p * 4.0),
            135.0 * (1.0 + 0.5 * (1.0 - p)),
        )
    }

    fn run(search: &mut ShiftSearch, mut p: f64, contention: f64, quanta: usize) -> f64 {
        for _ in 0..quanta {
            let (ld, la) = curve(p, contention);
            let dp = search.compute_shift(p, ld, la);
            p = if ld < la {
                (p + dp).min(1.0)
            } else {
                (p - dp).max(0.0)
            };
        }
        p
    }

    /// Where the curve balances (bisection).
    fn p_star(contention: f64) -> f64 {
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..60 {
            let m = (lo + hi) / 2.0;
            let (ld, la) = curve(m, contention);
            if ld < la {
                lo = m;
            } else {
                hi = m;
            }
        }
        lo
    }

    fn balanced(p: f64, contention: f64) -> bool {
        let (ld, la) = curve(p, contention);
        (ld - la).abs() < DELTA * ld
    }

    #[test]
    fn search_converges_and_reopens_when_contention_changes() {
        let mut s = ShiftSearch::default();
        let p1 = run(&mut s, 1.0, 1.0, 30);
        let star1 = p_star(1.0);
        assert!(balanced(p1, 1.0), "p {p1} vs p* {star1}");
        assert!((p1 - star1).abs() < 0.05, "p {p1} vs p* {star1}");
        // Converged: the watermarks bracket p* closely.
        assert!(s.p_lo <= star1 + 0.05 && s.p_hi >= star1 - 0.05);
        // Contention triples: p* drops below the closed watermarks; the
        // search must re-open (p_lo reset to 0) and find the new p*.
        let star3 = p_star(3.0);
        assert!(
            star3 < s.p_lo - 0.05,
            "test needs p* to move out of the bracket"
        );
        let p3 = run(&mut s, p1, 3.0, 40);
        assert!(balanced(p3, 3.0), "p {p3} vs p* {star3}");
        assert!((p3 - star3).abs() < 0.05);
        // No contention at all: everything goes to the default tier.
        let p0 = run(&mut s, p3, 0.0, 40);
        assert!(p0 > 0.99, "{p0}");
    }

    #[test]
    fn find_pages_respects_shift_and_probabilities() {
        let cfg = PolicyConfig::new(100, vec![50, 100]);
        let mut c = Colloid::new(&cfg);
        let mut v = VecView::two_tier(100, 40);
        let mut st = v.status(&[50, 100]);
        // Default tier much slower (contended): demotion mode.
        st[0].loaded_latency_ns = Some(300.0);
        st[1].loaded_latency_ns = Some(140.0);
        st[0].request_rate = Some(9e8);
        st[1].request_rate = Some(1e8);
        // Page 0 has 5 of 10 samples (prob 0.5), pages 1..6 one each (0.1).
        let mut samples = vec![
            AccessSample {
                page: 0,
                tier: 0,
                write: false
            };
            5
        ];
        for p in 1..6 {
            samples.push(AccessSample {
                page: p,
                tier: 0,
                write: false,
            });
        }
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        // p = 0.9, search: p_hi = 0.9, target 0.45, dp = 0.45: page 0 (0.5)
        // does not fit; four 0.1 pages do.
        assert!((c.last_shift() - 0.45).abs() < 1e-9);
        let moved: Vec<u64> = d.migrations.iter().map(|m| m.unit.page).collect();
        assert_eq!(moved.len(), 4, "{moved:?}");
        assert!(!moved.contains(&0));
        assert!(d.migrations.iter().all(|m| m.to == 1));
    }
}
