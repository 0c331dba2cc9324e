//! `adaptive`: takes the right idea from each published policy, from what
//! it measures, and says at every tick which mode it is in and why.
//!
//! Each tick ([`TICK_NS`]):
//! 1. **Profile within a budget** (MTM's idea, §5.3): access samples (PEBS
//!    in a real system; sampled accesses here) feed per-page heat, at most
//!    [`PROFILE_OVERHEAD`] of one core at [`SAMPLE_COST_NS`] per sample;
//!    samples beyond the budget are dropped evenly. Heat halves when a page
//!    reaches [`COOL_AT`] (HeMem/Colloid cooling), so a moved hot set is
//!    followed within seconds. While a faster tier has free room, the
//!    budget the samples leave goes to the [`scout`]: accessed-bit tests of
//!    slower pages (one pass of a cursor, as TPP's scan), each page found touched
//!    gaining one heat, so warm pages fill free room as fast as TPP's
//!    hint-fault scan finds them.
//! 2. **Learn the mechanisms' outcomes**: a transactional promotion that
//!    did not land is an abort of that page ([`mechanism`]).
//! 3. **Detect a pattern change**: the share of samples that hit slower
//!    tiers jumping by [`PHASE_JUMP`] resets the throttle and cools heat.
//! 4. **Value past migrations** ([`thrash`]) and set the migration budget:
//!    a rate limit ([`RATE_LIMIT_MBPS`]) times the throttle's share.
//! 5. **Rank** pages by heat and give each a target tier by cumulative
//!    capacity, fastest first, over any number of tiers (MTM §6); a 2 MiB
//!    region whose pages are all hot (or all cold) moves as one unit, a
//!    mixed one page by page. Where a 4 KiB move costs a huge mapping
//!    (live), a hot page's region is promoted whole while every page of it
//!    sits in one tier ([`PolicyConfig::huge_split_costly`]).
//! 6. **Choose the mode**: with a loaded-latency signal, tier 0 versus tier
//!    1 is Colloid's search (Algorithm 2): promotions into tier 0 only
//!    while tier 0 is the faster, limited to the shift of request share
//!    Colloid computes (`promote`), hot pages pushed down when tier 0 is
//!    the slower (`balance`), nothing moved between them when balanced.
//!    Without a signal: pack the fastest tiers (`promote`).
//! 7. **Plan** the migrations within budget and free room, each with its
//!    mechanism ([`mechanism::Chooser`]), and record them for step 4.
//!
//! Before steps 1b-7: when tiers 0 and 1 are known to be equally fast
//! unloaded (within Colloid's [`DELTA`]: live, measured by a pointer chase
//! on each tier's node at start, or emulated), no placement can gain, and
//! every move, sample and scout test costs the guest: `adaptive` holds
//! (`hold`), moving and scouting nothing. It does not balance load between
//! such tiers on the engine's share model (a model, not a measurement);
//! with a measured gap, or latency emulation's, it runs as above.

pub mod burst;
pub mod mechanism;
pub mod scout;
pub mod thrash;

use std::collections::HashSet;

use super::colloid::{ShiftSearch, DELTA};
use super::hotness::ClockHand;
use super::types::*;
use super::{Policy, PolicyKind};
use mechanism::{Chooser, PageFacts, Reason};
use scout::Scout;
use thrash::{PageHistory, Thrash};

/// Tick period: 20 ms (between Colloid's 10 ms quantum and Memtis's 500 ms).
pub const TICK_NS: u64 = 20_000_000;
/// Access sampling period, as Memtis (`htmm_sample_period` = 199).
pub const SAMPLE_PERIOD: u64 = 199;
/// Heat at which every page's heat halves (HeMem's cooling threshold is
/// 10; 32 keeps more resolution for Zipfian sets; ASSUMED).
pub const COOL_AT: u16 = 32;
/// Profiling budget: share of one core spent on samples (MTM's 5%).
pub const PROFILE_OVERHEAD: f64 = 0.05;
/// Cost to process one sample, ns (ASSUMED: a PEBS record is tens of ns).
pub const SAMPLE_COST_NS: f64 = 20.0;
/// Migration rate limit, MB/s (Memtis's `MAX_MIGRATION_RATE_IN_MBPS`).
pub const RATE_LIMIT_MBPS: f64 = 2048.0;
/// Free pages kept in every non-slowest tier (0.4%, as the others).
pub const FREE_RESERVE_FRACTION: f64 = 0.004;
/// Rise of the slow-tier sample share that counts as a new access pattern.
pub const PHASE_JUMP: f64 = 0.2;
/// Samples gathered (over as many ticks as it takes) before the slow share
/// is compared with its baseline.
pub const PHASE_WINDOW_SAMPLES: u64 = 256;
/// The jump must also exceed this many standard errors of the window's
/// share (binomial), so sampling noise is not a new pattern.
pub const PHASE_SIGMAS: f64 = 4.0;
/// Latency gap assumed when no latency is measured, ns (Colloid's 70 vs 135 ns).
pub const ASSUMED_GAP_NS: f64 = 65.0;
/// A 2 MiB region in pages (before scaling).
pub const REGION_PAGES: u64 = PAGES_PER_2M as u64;
/// Hysteresis: a promotion that must displace a page needs this many times
/// the destination's heat threshold (victims are below the threshold), so
/// pages of similar heat do not trade places on sampling noise.
pub const DISPLACE_FACTOR: u16 = 2;
/// Index of dispersion (variance / mean) of the pages' heat below which the
/// heat shows no skew: sampling a uniform pattern gives Poisson counts,
/// dispersion 1, and then no page is hotter than another, so no promotion
/// may displace a page (it would trade equals: thrashing by construction).
/// Skewed patterns measure 1.5 and up within seconds.
pub const SKEW_MIN: f64 = 1.03;
/// Mean heat per page the skew gate needs before it may block: with
/// thinner samples a dispersion near 1 says nothing (a skewed pattern's
/// excess over 1 grows with the mean heat; at 0.1 a skew of CV 1 would
/// already show as 1.1), so the gate stays open.
pub const SKEW_MIN_MEAN_HEAT: f64 = 0.1;
/// Bytes per request for Colloid's dynamic limit (one cache line).
pub const REQUEST_BYTES: f64 = 64.0;

const TRACKED: u8 = 1;
const DEMOTED_BEFORE: u8 = 2;
/// Sampled in a burst and not after its promotion ([`burst`]).
const BURSTY: u8 = 4;

/// The mode `adaptive` is in, as reports and the live line show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// No samples yet.
    Warming,
    /// Packing hot pages into faster tiers.
    Promote,
    /// Shifting load off a tier whose loaded latency is the higher.
    Balance,
    /// Migration budget cut because migrations do not pay for themselves.
    Throttled,
    /// Tiers 0 and 1 are equally fast unloaded: no move can gain, none is
    /// made.
    Hold,
}

impl Mode {
    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Warming => "warming",
            Mode::Promote => "promote",
            Mode::Balance => "balance",
            Mode::Throttled => "throttled: thrashing",
            Mode::Hold => "hold: tiers equally fast",
        }
    }
}

/// Counts of what `adaptive` did, by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdaptiveStats {
    /// Promotions by TPM without a shadow (clean pages).
    pub clean_tpm: u64,
    /// Promotions by TPM keeping a shadow (marginal pages).
    pub shadowed_tpm: u64,
    /// Promotions by TPM of written pages that have not aborted yet.
    pub written_tpm: u64,
    /// Promotions of write-hot pages by stop-and-copy.
    pub write_hot_stop_copy: u64,
    /// Promotions by stop-and-copy because the dirty log is costly.
    pub unlogged_stop_copy: u64,
    /// Demotions onto a shadow.
    pub shadow_remaps: u64,
    /// Demotions by copy.
    pub cold_copies: u64,
    /// Units moved whole as 2 MiB regions.
    pub region_units: u64,
    /// Units moved as single pages.
    pub page_units: u64,
    /// TPM aborts seen.
    pub tpm_aborts: u64,
    /// Pattern changes detected.
    pub phase_changes: u64,
    /// Ticks spent throttled.
    pub throttled_ticks: u64,
    /// Samples dropped by the profiling budget.
    pub samples_dropped: u64,
    /// Slower-tier pages the scout found touched.
    pub scout_hits: u64,
}

/// The `adaptive` policy.
#[derive(Clone, Debug)]
pub struct Adaptive {
    heat: Vec<u16>,
    hits: Vec<u16>,
    last_move: Vec<u32>,
    /// Tick the page was last first sampled (its heat rose from zero).
    since: Vec<u32>,
    aborts: Vec<u8>,
    writes: Vec<u8>,
    flags: Vec<u8>,
    tracked: Vec<u64>,
    hands: Vec<ClockHand>,
    caps: Vec<u64>,
    reserve: Vec<u64>,
    scale: f64,
    region: u64,
    /// Promote an intact region whole ([`PolicyConfig::huge_split_costly`]).
    whole_ranges: bool,
    /// Pages per tick the rate limit allows, and the fraction carried.
    rate_pages: f64,
    rate_carry: f64,
    profile: IntervalBudget,
    /// Samples kept by the last [`Self::ingest`] (they use the budget first).
    kept: u64,
    /// Profiling time per tick, ns of modeled (scaled) work.
    profile_ns: f64,
    scout: Scout,
    search: ShiftSearch,
    thrash: Thrash,
    chooser: Chooser,
    in_flight: Vec<(u64, TierId, bool)>,
    tick_no: u64,
    slow_share_base: Option<f64>,
    /// Samples and slow-tier samples of the phase window being gathered.
    phase_window: (u64, u64),
    mode: Mode,
    why: String,
    /// Pattern-change detection on (tests switch it off as a negative control).
    phase_detection: bool,
    /// Balance mode on (tests switch it off as a negative control).
    balancing: bool,
    /// What it did, by reason.
    pub stats: AdaptiveStats,
}

/// How much hotter than `tier`'s threshold a page must be to displace
/// pages out of it: [`DISPLACE_FACTOR`] into the fastest tier, where
/// ping-pong is the costliest (thrashing bait); into a slower tier the
/// rank alone (pages below its threshold make room for pages at or above
/// it), or a full middle tier keeps its first-touch cold pages while warm
/// ones wait in the slowest (MTM §6: the next buckets fill the next tier).
fn displace_factor(tier: TierId) -> u16 {
    if tier == 0 {
        DISPLACE_FACTOR
    } else {
        1
    }
}

/// Per-tier heat thresholds: pages of heat `>= th[t]` belong in tiers `<= t`.
struct Ranking {
    th: Vec<u16>,
    /// Index of dispersion of the heat over all pages (variance / mean).
    dispersion: f64,
    /// Mean heat per page.
    mean: f64,
}

impl Ranking {
    /// The skew gate: the heat is thick enough to judge and shows no skew.
    fn no_skew(&self) -> bool {
        self.mean >= SKEW_MIN_MEAN_HEAT && self.dispersion < SKEW_MIN
    }
}

impl Ranking {
    fn target(&self, heat: u16) -> TierId {
        self.th
            .iter()
            .position(|&t| heat >= t)
            .unwrap_or(self.th.len().saturating_sub(1)) as TierId
    }
}

impl PageHistory for Adaptive {
    fn last_move_tick(&self, page: u64) -> u64 {
        u64::from(self.last_move.get(page as usize).copied().unwrap_or(0))
    }
    fn hits_since_move(&self, page: u64) -> u16 {
        self.hits.get(page as usize).copied().unwrap_or(0)
    }
}

/// The Colloid step for tiers 0 and 1 (step 6).
enum LatencyVerdict {
    /// No signal: pack.
    NoSignal,
    /// Tier 0 is faster: promote, at most this share of requests.
    Promote(f64),
    /// Tier 0 is slower: move this share of requests down.
    Demote(f64),
    /// Within Colloid's tolerance: leave tiers 0 and 1 alone.
    Balanced,
}

impl Adaptive {
    /// `adaptive` for `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        let n = config.pages as usize;
        let scale = if config.scale.is_finite() && config.scale > 0.0 {
            config.scale
        } else {
            1.0
        };
        let tick_ns = config.interval_ns.unwrap_or(TICK_NS).max(1);
        let rate = config.promote_rate_limit_mbps.unwrap_or(RATE_LIMIT_MBPS) * tick_ns as f64 / 1e9;
        let samples_per_tick = tick_ns as f64 * PROFILE_OVERHEAD / SAMPLE_COST_NS / scale;
        Self {
            heat: vec![0; n],
            hits: vec![0; n],
            last_move: vec![0; n],
            since: vec![0; n],
            aborts: vec![0; n],
            writes: vec![0; n],
            flags: vec![0; n],
            tracked: Vec::new(),
            hands: vec![ClockHand::default(); config.tiers()],
            caps: config.tier_capacity_pages.clone(),
            reserve: config
                .tier_capacity_pages
                .iter()
                .map(|&c| {
                    ((c as f64 * config.free_reserve_or(FREE_RESERVE_FRACTION)).round() as u64)
                        .max(1)
                })
                .collect(),
            scale,
            region: config.scaled_pages(REGION_PAGES as f64),
            whole_ranges: config.huge_split_costly,
            rate_pages: config.mb_to_pages_f64(rate),
            rate_carry: 0.0,
            profile: IntervalBudget::new(samples_per_tick),
            kept: 0,
            profile_ns: tick_ns as f64 * PROFILE_OVERHEAD / scale,
            scout: Scout::new(config.accessed_test_cost_ns),
            search: ShiftSearch::default(),
            thrash: Thrash::default(),
            chooser: Chooser {
                dirty_log_costly: config.dirty_log_costly,
                ..Chooser::default()
            },
            in_flight: Vec::new(),
            tick_no: 0,
            slow_share_base: None,
            phase_window: (0, 0),
            mode: Mode::Warming,
            why: "no samples yet".into(),
            phase_detection: true,
            balancing: true,
            stats: AdaptiveStats::default(),
        }
    }

    /// Negative control for tests: never throttle.
    pub fn without_thrash_control(mut self) -> Self {
        self.thrash.enabled = false;
        self
    }

    /// Negative control for tests: no pattern-change detection.
    pub fn without_phase_detection(mut self) -> Self {
        self.phase_detection = false;
        self
    }

    /// Negative control for tests: no `balance` mode (a slower tier 0 is
    /// treated as no latency signal: pack).
    pub fn without_balance(mut self) -> Self {
        self.balancing = false;
        self
    }

    /// Negative control for tests: no streaming-page detection.
    pub fn without_burst_detection(mut self) -> Self {
        self.thrash.bursts.enabled = false;
        self
    }

    /// Negative control for tests: no accessed-bit scout.
    pub fn without_scout(mut self) -> Self {
        self.scout.enabled = false;
        self
    }

    /// Negative control for tests: always TPM with a shadow (Nomad's choice).
    pub fn with_fixed_mechanism(mut self) -> Self {
        self.chooser.fixed = true;
        self
    }

    /// The current mode.
    pub fn current_mode(&self) -> Mode {
        self.mode
    }

    /// The current throttle level (0 = none).
    pub fn throttle_level(&self) -> u8 {
        self.thrash.level()
    }

    /// A page's heat.
    pub fn heat(&self, page: u64) -> u16 {
        self.heat.get(page as usize).copied().unwrap_or(0)
    }

    /// A page's TPM aborts since its last commit.
    pub fn aborts(&self, page: u64) -> u8 {
        self.aborts.get(page as usize).copied().unwrap_or(0)
    }

    /// Step 1. Returns the share of kept samples that hit slower tiers.
    fn ingest(&mut self, samples: &[AccessSample]) -> Option<f64> {
        let allowed = self.profile.next_interval().max(1) as usize;
        let stride = samples.len().div_ceil(allowed).max(1);
        self.stats.samples_dropped += (samples.len() - samples.len().div_ceil(stride)) as u64;
        let (mut kept, mut slow) = (0usize, 0usize);
        for s in samples.iter().step_by(stride) {
            let i = s.page as usize;
            if i >= self.heat.len() {
                continue;
            }
            kept += 1;
            slow += usize::from(s.tier > 0);
            self.hits[i] = self.hits[i].saturating_add(1);
            if s.write {
                self.writes[i] = self.writes[i].saturating_add(1);
            }
            if self.flags[i] & TRACKED == 0 {
                self.flags[i] |= TRACKED;
                self.tracked.push(s.page);
                self.since[i] = self.tick_no as u32;
            }
            self.heat[i] = self.heat[i].saturating_add(1);
            if self.heat[i] >= COOL_AT {
                self.cool();
            }
        }
        self.kept = kept as u64;
        self.phase_window.0 += kept as u64;
        self.phase_window.1 += slow as u64;
        let (n, k) = self.phase_window;
        if n < PHASE_WINDOW_SAMPLES {
            return None;
        }
        self.phase_window = (0, 0);
        Some(k as f64 / n as f64)
    }

    /// Halves every tracked page's heat and forgets pages at zero.
    fn cool(&mut self) {
        let (heat, flags) = (&mut self.heat, &mut self.flags);
        self.tracked.retain(|&p| {
            let i = p as usize;
            heat[i] /= 2;
            let keep = heat[i] > 0;
            if !keep {
                flags[i] &= !TRACKED;
            }
            keep
        });
    }

    /// Step 2: aborts from the engine's outcomes, or, where it reports
    /// none (live), from where last tick's transactional pages are now.
    fn learn_outcomes(&mut self, outcomes: &[TpmOutcome], view: &dyn MemoryView) {
        let flights = std::mem::take(&mut self.in_flight);
        let explicit = !outcomes.is_empty();
        let mut results: Vec<(u64, bool, bool)> = Vec::new();
        if explicit {
            let written: HashSet<u64> = flights.iter().filter(|f| f.2).map(|f| f.0).collect();
            for o in outcomes {
                results.push((o.page, written.contains(&o.page), !o.committed));
            }
        } else {
            for (p, to, written) in flights {
                results.push((p, written, view.tier_of(p) != to));
            }
        }
        for (p, written, aborted) in results {
            let Some(a) = self.aborts.get_mut(p as usize) else {
                continue;
            };
            if aborted {
                *a = a.saturating_add(1);
                self.stats.tpm_aborts += 1;
                // Keep the write evidence for the retry.
                self.writes[p as usize] = self.writes[p as usize].max(1);
            } else {
                *a = 0;
            }
            self.chooser.learn(written, aborted);
        }
    }

    /// Step 3: the slow-tier share of samples against its moving
    /// baseline; a jump is a new pattern: the throttle is lifted and the
    /// old heat cooled twice so the new hot set outranks the old one.
    fn detect_phase(&mut self, slow_share: Option<f64>) {
        let Some(s) = slow_share.filter(|_| self.phase_detection) else {
            return;
        };
        let base = *self.slow_share_base.get_or_insert(s);
        let sigma = (base * (1.0 - base) / PHASE_WINDOW_SAMPLES as f64).sqrt();
        if s > base + PHASE_JUMP.max(PHASE_SIGMAS * sigma) {
            self.thrash.reset();
            self.flags.iter_mut().for_each(|f| *f &= !BURSTY);
            self.cool();
            self.cool();
            self.stats.phase_changes += 1;
            self.slow_share_base = Some(s);
            self.why = format!(
                "pattern changed: {:.0}% of samples hit slower tiers (was {:.0}%): heat cooled, throttle lifted",
                s * 100.0,
                base * 100.0
            );
        } else {
            self.slow_share_base = Some(0.8 * base + 0.2 * s);
        }
    }

    /// Step 1b: with free room in a faster tier, the scout spends the
    /// budget the samples left on accessed-bit tests of slower pages; a page
    /// found touched gains one heat, as a sample would give it. Returns the
    /// pages found.
    fn scout(&mut self, tiers: &[TierStatus], view: &mut dyn MemoryView) -> u64 {
        let n = tiers.len().min(self.reserve.len());
        let room = (0..n.saturating_sub(1))
            .find(|&t| tiers[t].free_pages > 2 * self.reserve[t])
            .map(|t| t as TierId);
        let left = self.profile_ns - self.kept as f64 * SAMPLE_COST_NS;
        let mut found = Vec::new();
        let heat = &self.heat;
        self.scout.run(
            left,
            room,
            view,
            |p| heat.get(p as usize).is_some_and(|&h| h > 0),
            &mut found,
        );
        for &p in &found {
            let i = p as usize;
            self.heat[i] = self.heat[i].saturating_add(1);
            if self.flags[i] & TRACKED == 0 {
                self.flags[i] |= TRACKED;
                self.tracked.push(p);
                self.since[i] = self.tick_no as u32;
            }
        }
        self.stats.scout_hits += found.len() as u64;
        found.len() as u64
    }

    /// Step 5: each tier's heat threshold by cumulative capacity.
    fn rank(&self) -> Ranking {
        let mut hist = vec![0u64; usize::from(COOL_AT) + 1];
        let (mut sum, mut sq) = (0f64, 0f64);
        for &p in &self.tracked {
            let h = self.heat[p as usize];
            hist[usize::from(h.min(COOL_AT))] += 1;
            sum += f64::from(h);
            sq += f64::from(h) * f64::from(h);
        }
        let pages = self.heat.len().max(1) as f64;
        let mean = sum / pages;
        let dispersion = if mean > 0.0 {
            (sq / pages - mean * mean) / mean
        } else {
            0.0
        };
        let n = self.caps.len();
        let mut th = vec![COOL_AT + 1; n];
        let mut cum = 0u64;
        for (t, th_t) in th.iter_mut().enumerate() {
            cum += self.caps[t].saturating_sub(self.reserve[t]);
            if t == n - 1 {
                *th_t = 0;
                break;
            }
            let mut acc = 0u64;
            for c in (1..=COOL_AT).rev() {
                acc += hist[usize::from(c)];
                if acc > cum {
                    break;
                }
                *th_t = c;
            }
        }
        Ranking {
            th,
            dispersion,
            mean,
        }
    }

    /// Step 6 for tiers 0 and 1.
    fn latency_verdict(&mut self, tiers: &[TierStatus]) -> LatencyVerdict {
        if tiers.len() < 2 {
            return LatencyVerdict::NoSignal;
        }
        let (d, a) = (tiers[0], tiers[1]);
        let (Some(l_d), Some(l_a), Some(r_d), Some(r_a)) = (
            d.loaded_latency_ns,
            a.loaded_latency_ns,
            d.request_rate,
            a.request_rate,
        ) else {
            return LatencyVerdict::NoSignal;
        };
        let total = r_d.max(0.0) + r_a.max(0.0);
        if total <= 0.0 || !(l_d.is_finite() && l_a.is_finite()) {
            return LatencyVerdict::NoSignal;
        }
        let dp = self.search.compute_shift(r_d.max(0.0) / total, l_d, l_a);
        if dp <= 0.0 || (l_d - l_a).abs() < DELTA * l_d {
            LatencyVerdict::Balanced
        } else if l_d < l_a {
            LatencyVerdict::Promote(dp)
        } else if self.balancing {
            LatencyVerdict::Demote(dp)
        } else {
            LatencyVerdict::NoSignal
        }
    }

    fn facts(&self, page: u64, threshold: u16) -> PageFacts {
        let i = page as usize;
        PageFacts {
            aborts: self.aborts[i],
            writes: self.writes[i],
            heat: self.heat[i],
            threshold,
            was_demoted: self.flags[i] & DEMOTED_BEFORE != 0,
        }
    }

    fn count_reason(&mut self, r: Reason) {
        let s = &mut self.stats;
        match r {
            Reason::CleanTpm => s.clean_tpm += 1,
            Reason::ShadowedTpm => s.shadowed_tpm += 1,
            Reason::WrittenTpm => s.written_tpm += 1,
            Reason::WriteHotStopCopy => s.write_hot_stop_copy += 1,
            Reason::UnloggedStopCopy => s.unlogged_stop_copy += 1,
            Reason::ShadowRemap => s.shadow_remaps += 1,
            Reason::ColdCopy => s.cold_copies += 1,
        }
    }

    /// Marks a unit moved at this tick (for step 4) and emits it.
    fn emit(&mut self, plan: &mut Plan, unit: Unit, from: TierId, to: TierId, mech: Mechanism) {
        let tick = self.tick_no;
        for p in unit.page..unit.end() {
            let i = p as usize;
            self.hits[i] = 0;
            self.writes[i] = 0;
            self.last_move[i] = tick as u32;
            if to > from {
                self.flags[i] |= DEMOTED_BEFORE;
            }
            // Step 4's burst test: the hits its sampled rate promises, at
            // the rate's lower bound (the first sample starts the clock;
            // Poisson, two standard errors), so that the few samples of a
            // lukewarm page promise nothing.
            let age = tick.saturating_sub(u64::from(self.since[i])).max(1);
            let after_first = f64::from(self.heat[i].saturating_sub(1));
            let low = (after_first - 2.0 * after_first.sqrt()).max(0.0);
            let expected = low / age as f64 * f64::from(thrash::EVAL_TICKS);
            self.thrash.record(p, to < from, tick, expected as f32);
        }
        if matches!(mech, Mechanism::Transactional { .. }) {
            let written = plan.written;
            for p in unit.page..unit.end() {
                self.in_flight.push((p, to, written));
            }
        }
        if unit.pages > 1 {
            self.stats.region_units += 1;
        } else {
            self.stats.page_units += 1;
        }
        // The capacity rule: a transactional source stays allocated until
        // commit; a shadow demotion needs no destination page.
        let pages = u64::from(unit.pages);
        match mech {
            Mechanism::Transactional { .. } => {
                plan.budget.take(to, pages);
            }
            Mechanism::ShadowDemotion => plan.budget.release(from, pages),
            _ => {
                plan.budget.take(to, pages);
                plan.budget.release(from, pages);
            }
        }
        plan.moved += u64::from(unit.pages);
        plan.out.migrations.push(Migration {
            unit,
            to,
            mechanism: mech,
            urgency: Urgency::Background,
        });
    }

    /// The unit to move for `page` going from `src` to `dst`: its whole
    /// 2 MiB region when every page of it sits in `src` and is on the same
    /// side of the heat threshold `th` (`hot`), else the page alone. Where
    /// a 4 KiB move costs a huge mapping (`whole_ranges`), a promotion
    /// moves the region whole whenever every page of it sits in `src`:
    /// the range stays mapped huge, and one decision moves 512 pages.
    fn unit_for(&self, page: u64, src: TierId, th: u16, hot: bool, view: &dyn MemoryView) -> Unit {
        let r = self.region;
        if r <= 1 || r > u64::from(PAGES_PER_2M) {
            return Unit::page(page);
        }
        let start = page / r * r;
        let end = start + r;
        if end > self.heat.len() as u64 {
            return Unit::page(page);
        }
        if hot && self.whole_ranges && (start..end).all(|p| view.tier_of(p) == src) {
            return Unit::run(start, r as u32);
        }
        let uniform = (start..end)
            .all(|p| view.tier_of(p) == src && (self.heat[p as usize] >= th.max(1)) == hot);
        if uniform {
            Unit::run(start, r as u32)
        } else {
            Unit::page(page)
        }
    }

    /// Demotes up to `want` pages colder than `th` out of `tier` to the
    /// first slower tier with room.
    fn demote_cold(
        &mut self,
        plan: &mut Plan,
        tier: TierId,
        want: u64,
        th: u16,
        view: &mut dyn MemoryView,
    ) -> u64 {
        let n = self.caps.len();
        if want == 0 || usize::from(tier) + 1 >= n {
            return 0;
        }
        let heat = &self.heat;
        let chosen = &plan.chosen;
        let max_scan = view.pages();
        let cold = self.hands[usize::from(tier)].find(view, tier, want, max_scan, |p, _| {
            heat[p as usize] < th && !chosen.contains(&p)
        });
        let mut freed = 0;
        for p in cold {
            if freed >= want || plan.chosen.contains(&p) {
                continue;
            }
            let unit = self.unit_for(p, tier, th, false, view);
            let pages = u64::from(unit.pages);
            let Some(down) = ((usize::from(tier) + 1)..n)
                .map(|d| d as TierId)
                .find(|&d| plan.budget.free(d) >= pages)
            else {
                break;
            };
            let (mech, why) = self.chooser.demotion(view.shadow_tier(p), down);
            let (mech, why) = if unit.pages > 1 && mech == Mechanism::ShadowDemotion {
                (Mechanism::StopAndCopy, Reason::ColdCopy)
            } else {
                (mech, why)
            };
            self.count_reason(why);
            plan.written = false;
            for q in unit.page..unit.end() {
                plan.chosen.insert(q);
            }
            self.emit(plan, unit, tier, down, mech);
            freed += pages;
        }
        freed
    }

    /// Step 7 in `promote` mode: the hottest misplaced pages up to their
    /// target tier, making room by demoting colder ones; promotions into
    /// tier 0 stop at `share_limit` of the requests (Colloid) if given.
    fn pack(
        &mut self,
        plan: &mut Plan,
        rank: &Ranking,
        share_limit: Option<f64>,
        min_dst: TierId,
        view: &mut dyn MemoryView,
    ) -> u64 {
        let cands = self.promotion_candidates(rank, min_dst, view);
        let total_heat = self.total_heat();
        let mut share_left = share_limit.unwrap_or(f64::INFINITY);
        let mut promoted = 0u64;
        // A tier near its reserve got its free pages by displacing others
        // (this tick or the last ones): promotions into it displace.
        let tight: Vec<bool> = (0..self.caps.len())
            .map(|t| plan.budget.free(t as TierId) <= 2 * self.reserve[t])
            .collect();
        // Room first: per destination, the cold pages to push down.
        self.make_room(plan, rank, &cands, view);
        for c in &cands {
            if plan.moved >= plan.limit {
                break;
            }
            if plan.chosen.contains(&c.page) {
                continue;
            }
            let Some(placed) = self.placement(plan, rank, &tight, c, view) else {
                continue;
            };
            if placed.dst == 0 {
                let prob = f64::from(c.heat) / total_heat;
                if prob > share_left {
                    continue;
                }
                share_left -= prob;
            }
            promoted += self.promote(plan, c.page, &placed);
        }
        promoted
    }

    /// Step 7's candidates: tracked pages slower than their target tier
    /// (at least `min_dst`), hottest first.
    fn promotion_candidates(
        &self,
        rank: &Ranking,
        min_dst: TierId,
        view: &dyn MemoryView,
    ) -> Vec<Candidate> {
        let mut cands: Vec<Candidate> = self
            .tracked
            .iter()
            .filter_map(|&p| {
                let h = self.heat[p as usize];
                let dst = rank.target(h).max(min_dst);
                (view.tier_of(p) > dst).then_some(Candidate {
                    heat: h,
                    page: p,
                    dst,
                })
            })
            .collect();
        cands.sort_unstable_by(|a, b| b.heat.cmp(&a.heat).then(a.page.cmp(&b.page)));
        cands
    }

    /// The heat of all tracked pages (at least 1): each page's share of
    /// it is its share of the requests.
    fn total_heat(&self) -> f64 {
        self.tracked
            .iter()
            .map(|&p| f64::from(self.heat[p as usize]))
            .sum::<f64>()
            .max(1.0)
    }

    /// Makes room for `cands` in every non-slowest tier by demoting pages
    /// below its threshold; marks the tiers where this displaced pages.
    fn make_room(
        &mut self,
        plan: &mut Plan,
        rank: &Ranking,
        cands: &[Candidate],
        view: &mut dyn MemoryView,
    ) {
        if rank.no_skew() {
            return; // no skew: promote into free room only
        }
        for dst in 0..self.caps.len().saturating_sub(1) {
            let dst = dst as TierId;
            let need = self.room_needed(plan, rank, cands, dst, view);
            let th = rank.th[usize::from(dst)];
            if self.demote_cold(plan, dst, need, th, view) > 0 {
                plan.displaced[usize::from(dst)] = true;
            }
        }
    }

    /// Pages to free in `dst` for the candidates that may displace pages
    /// there, and its reserve.
    fn room_needed(
        &self,
        plan: &Plan,
        rank: &Ranking,
        cands: &[Candidate],
        dst: TierId,
        view: &dyn MemoryView,
    ) -> u64 {
        let want = cands
            .iter()
            .filter(|c| c.dst == dst)
            .count()
            .min(plan.limit.saturating_sub(plan.moved) as usize / 2) as u64;
        let need = (want + self.reserve[usize::from(dst)]).saturating_sub(plan.budget.free(dst));
        let th = rank.th[usize::from(dst)];
        // Only pages clearly hotter than the threshold displace others.
        // and none of a stream's ([`burst`]).
        let stream = !self.thrash.bursts.displacing_allowed();
        let flags = &self.flags;
        let strong = cands
            .iter()
            .filter(|c| {
                c.dst == dst
                    && c.heat >= th.saturating_mul(displace_factor(dst))
                    && !stream
                    && flags[c.page as usize] & BURSTY == 0
            })
            .count() as u64;
        // Pages ranked for a faster tier that has no room fall back to
        // this one (MTM §6: the next bucket goes to the next tier), and
        // displace its pages below its threshold: they are hotter by
        // rank, so no factor is needed for them.
        let room_above: u64 = (0..usize::from(dst))
            .map(|t| {
                plan.budget
                    .free(t as TierId)
                    .saturating_sub(self.reserve[t])
            })
            .sum();
        let spill = if dst > 0 {
            (cands
                .iter()
                .filter(|c| {
                    c.dst < dst
                        && view.tier_of(c.page) > dst
                        && !stream
                        && flags[c.page as usize] & BURSTY == 0
                })
                .count() as u64)
                .saturating_sub(room_above)
                .min(plan.limit.saturating_sub(plan.moved) / 2)
        } else {
            0
        };
        // Room for the strong ones and the reserve, less what is free.
        (need + spill).min(
            (strong + spill + self.reserve[usize::from(dst)]).saturating_sub(plan.budget.free(dst)),
        )
    }

    /// Where candidate `c` goes: its target tier, else the fastest tier
    /// between it and the page's own that takes it (MTM §6); `None` when
    /// none does.
    fn placement(
        &self,
        plan: &Plan,
        rank: &Ranking,
        tight: &[bool],
        c: &Candidate,
        view: &dyn MemoryView,
    ) -> Option<Placement> {
        let (h, p) = (c.heat, c.page);
        let src = view.tier_of(p);
        if src <= c.dst {
            return None;
        }
        for d in c.dst..src {
            let th = rank.th[usize::from(d)];
            let unit = self.unit_for(p, src, th, true, view);
            let pages = u64::from(unit.pages);
            if plan.budget.free(d) < pages + self.reserve[usize::from(d)] / 2 {
                continue;
            }
            // Into the target only clearly hotter pages displace; a
            // fallback page is hotter by rank than what it displaced.
            let factor = if d == c.dst { displace_factor(d) } else { 1 };
            if plan.displaced[usize::from(d)] && h < th.saturating_mul(factor) {
                continue;
            }
            let displacing = plan.displaced[usize::from(d)] || tight[usize::from(d)];
            if displacing
                && (self.flags[p as usize] & BURSTY != 0
                    || !self.thrash.bursts.displacing_allowed())
            {
                continue;
            }
            return Some(Placement {
                src,
                dst: d,
                th,
                unit,
            });
        }
        None
    }

    /// Promotes `page`'s unit as `placed` says, with the mechanism its
    /// facts call for; returns the pages moved.
    fn promote(&mut self, plan: &mut Plan, page: u64, placed: &Placement) -> u64 {
        let Placement { src, dst, th, unit } = *placed;
        let pages = u64::from(unit.pages);
        let mut facts = self.facts(page, th);
        facts.writes = (unit.page..unit.end())
            .map(|q| self.writes[q as usize])
            .max()
            .unwrap_or(0);
        facts.aborts = (unit.page..unit.end())
            .map(|q| self.aborts[q as usize])
            .max()
            .unwrap_or(0);
        let (mech, why) = self
            .chooser
            .promotion(&facts, &plan.tiers[usize::from(src)]);
        self.count_reason(why);
        plan.written = facts.writes > 0;
        for q in unit.page..unit.end() {
            plan.chosen.insert(q);
        }
        self.emit(plan, unit, src, dst, mech);
        pages
    }

    /// Step 7 in `balance` mode: Colloid's demotion of tier 0's hottest
    /// pages whose request share fits in `dp`.
    fn push_down(&mut self, plan: &mut Plan, dp: f64, view: &mut dyn MemoryView) -> u64 {
        let total_heat = self.total_heat();
        let mut hot: Vec<(u16, u64)> = self
            .tracked
            .iter()
            .filter(|&&p| view.tier_of(p) == 0)
            .map(|&p| (self.heat[p as usize], p))
            .collect();
        hot.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut left = dp;
        let mut moved = 0;
        for (h, p) in hot {
            if plan.moved >= plan.limit {
                break;
            }
            let prob = f64::from(h) / total_heat;
            if prob > left || !plan.budget.take(1, 1) {
                continue;
            }
            plan.budget.release(1, 1);
            left -= prob;
            let (mech, why) = self.chooser.demotion(view.shadow_tier(p), 1);
            self.count_reason(why);
            plan.written = false;
            plan.chosen.insert(p);
            self.emit(plan, Unit::page(p), 0, 1, mech);
            moved += 1;
        }
        moved
    }

    /// Colloid's dynamic limit: pages that carry `dp` of `total` requests/s
    /// over one tick.
    fn dynamic_limit(&self, dp: f64, tiers: &[TierStatus], tick_ns: u64) -> u64 {
        let total: f64 = tiers
            .iter()
            .take(2)
            .filter_map(|t| t.request_rate)
            .sum::<f64>()
            .max(0.0);
        (dp * total * tick_ns as f64 / 1e9 * REQUEST_BYTES / PAGE_SIZE as f64 / self.scale).ceil()
            as u64
    }

    /// Step 4: values past migrations against the loaded-latency gap
    /// between tiers 0 and 1 (or [`ASSUMED_GAP_NS`]), flags the streaming
    /// pages found, and returns the share of the migration budget allowed.
    fn value_migrations(&mut self, tick: u64, obs: &Observations<'_>) -> f64 {
        let gap = match (
            obs.tiers.first().and_then(|t| t.loaded_latency_ns),
            obs.tiers.get(1).and_then(|t| t.loaded_latency_ns),
        ) {
            (Some(f), Some(s)) if s.is_finite() && f.is_finite() => (s - f).max(0.0),
            _ => ASSUMED_GAP_NS,
        };
        let mut thrash = std::mem::take(&mut self.thrash);
        thrash.evaluate(
            tick,
            &*self,
            SAMPLE_PERIOD as f64 * gap,
            !obs.samples.is_empty(),
        );
        for p in thrash.bursts.found.drain(..) {
            if let Some(f) = self.flags.get_mut(p as usize) {
                *f |= BURSTY;
            }
        }
        self.thrash = thrash;
        self.thrash.budget_share(tick)
    }

    /// Pages this tick may move: the rate limit times the throttle's
    /// `share`.
    fn migration_limit(&mut self, share: f64) -> u64 {
        // The throttle scales the rate, fractions carried: a small budget
        // (a low rate limit, a large simulation scale) is not rounded away.
        let allowed = self.rate_pages * share + self.rate_carry;
        let limit = allowed.floor() as u64;
        self.rate_carry = (allowed - limit as f64).min(self.rate_pages.max(1.0));
        limit
    }

    /// Steps 6-7: plans the moves the latency verdict calls for; returns
    /// the mode and what was done.
    fn plan_moves(
        &mut self,
        plan: &mut Plan,
        rank: &Ranking,
        verdict: LatencyVerdict,
        view: &mut dyn MemoryView,
    ) -> (Mode, String) {
        let tiers = plan.tiers;
        let latency = |t: usize| {
            tiers
                .get(t)
                .and_then(|x| x.loaded_latency_ns)
                .unwrap_or(0.0)
        };
        let (l0, l1) = (latency(0), latency(1));
        match verdict {
            LatencyVerdict::Demote(dp) => {
                plan.limit = plan.limit.min(self.dynamic_limit(dp, tiers, TICK_NS));
                let n = self.push_down(plan, dp, view);
                // Lower tiers still pack among themselves.
                let m = self.pack(plan, rank, None, 1, view);
                (
                    Mode::Balance,
                    format!(
                        "tier 0 loaded latency {:.0} ns above tier 1's {:.0} ns: moving {:.1}% of requests down ({n} pages down, {m} packed below)",
                        l0,
                        l1,
                        dp * 100.0
                    ),
                )
            }
            LatencyVerdict::Balanced => {
                let m = self.pack(plan, rank, None, 1, view);
                (
                    Mode::Balance,
                    format!(
                        "tiers 0 and 1 balanced (loaded latency {:.0} vs {:.0} ns, within {:.0}%): {m} pages packed below",
                        l0,
                        l1,
                        DELTA * 100.0
                    ),
                )
            }
            LatencyVerdict::Promote(dp) => {
                let m = self.pack(plan, rank, Some(dp), 0, view);
                (
                    Mode::Promote,
                    format!(
                        "{m} pages up (hot threshold heat {} for tier 0; tier 0 faster: {:.0} vs {:.0} ns, up to {:.1}% of requests)",
                        rank.th[0],
                        l0,
                        l1,
                        dp * 100.0
                    ),
                )
            }
            LatencyVerdict::NoSignal => {
                let m = self.pack(plan, rank, None, 0, view);
                (
                    Mode::Promote,
                    format!(
                        "{m} pages up (hot threshold heat {} for tier 0; no latency signal)",
                        rank.th[0]
                    ),
                )
            }
        }
    }

    /// The note on a stream gating promotions ([`burst`]), if it does.
    fn stream_note(&self) -> String {
        if self.thrash.bursts.displacing_allowed() {
            String::new()
        } else {
            format!(
                "; {:.0}% of promotions were bursts (sampled, then untouched): a stream, promotions only fill free room",
                self.thrash.bursts.share() * 100.0
            )
        }
    }

    /// Sets the mode and why from what the tick did: throttled when the
    /// throttle is on, else `mode`; a pattern change this tick keeps its
    /// note in front.
    fn set_mode(&mut self, mode: Mode, what: String, share: f64, phase_before: u64) {
        if self.thrash.level() > 0 {
            self.stats.throttled_ticks += 1;
            self.mode = Mode::Throttled;
            let budget = if share == 0.0 {
                "no migration".to_string()
            } else {
                format!("budget 1/{:.0}", 1.0 / share)
            };
            self.why = format!(
                "migrations returned {:.2}x their cost ({:.0}% ping-pong): {budget}; {what}",
                self.thrash.last_ratio.unwrap_or(0.0),
                self.thrash.pingpong_share() * 100.0
            );
        } else {
            self.mode = mode;
            if self.stats.phase_changes == phase_before {
                self.why = what;
            } else {
                self.why = format!("{}; {what}", self.why);
            }
        }
    }
}

/// Tiers 0 and 1's unloaded latencies, if both are known and within
/// Colloid's [`DELTA`] of each other.
fn equally_fast(tiers: &[TierStatus]) -> Option<(f64, f64)> {
    let u0 = tiers.first()?.unloaded_latency_ns?;
    let u1 = tiers.get(1)?.unloaded_latency_ns?;
    let known = u0.is_finite() && u1.is_finite() && u0 > 0.0 && u1 > 0.0;
    (known && (u1 - u0).abs() < DELTA * u0).then_some((u0, u1))
}

/// The note on heat without skew (no page displaced), if so.
fn skew_note(rank: &Ranking) -> String {
    if rank.no_skew() {
        format!(
            "; heat shows no skew (dispersion {:.2} < {SKEW_MIN}): no page displaced",
            rank.dispersion
        )
    } else {
        String::new()
    }
}

/// The note on pages the scout found, if any.
fn scout_note(scouted: u64) -> String {
    if scouted > 0 {
        format!("; scout found {scouted} touched slower pages while a faster tier has room")
    } else {
        String::new()
    }
}

/// A page `pack` may promote: its heat and target tier.
struct Candidate {
    heat: u16,
    page: u64,
    dst: TierId,
}

/// Where `pack` promotes a candidate: the unit to move from `src` to
/// `dst`, and `dst`'s heat threshold.
#[derive(Clone, Copy)]
struct Placement {
    src: TierId,
    dst: TierId,
    th: u16,
    unit: Unit,
}

/// The decisions of one tick being built.
struct Plan<'a> {
    out: Decisions,
    budget: FreeBudget,
    tiers: &'a [TierStatus],
    chosen: HashSet<u64>,
    limit: u64,
    moved: u64,
    written: bool,
    /// Per tier: promotions into it displaced pages this tick.
    displaced: Vec<bool>,
}

impl<'a> Plan<'a> {
    /// An empty plan over `tiers` that may move `limit` pages.
    fn new(tiers: &'a [TierStatus], limit: u64) -> Self {
        Self {
            out: Decisions::none(),
            budget: FreeBudget::from_tiers(tiers),
            tiers,
            chosen: HashSet::new(),
            limit,
            moved: 0,
            written: false,
            displaced: vec![false; tiers.len()],
        }
    }
}

impl Policy for Adaptive {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Adaptive
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            sample_period: SAMPLE_PERIOD,
            // The scout's tests (step 1b).
            accessed_bits: true,
            ..TrackerRequest::none()
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        TICK_NS
    }

    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        self.tick_no += 1;
        let tick = self.tick_no;
        // Steps 1-3.
        let slow_share = self.ingest(obs.samples);
        self.learn_outcomes(obs.tpm_outcomes, view);
        let phase_before = self.stats.phase_changes;
        self.detect_phase(slow_share);
        if let Some((u0, u1)) = equally_fast(obs.tiers) {
            self.mode = Mode::Hold;
            self.why = format!(
                "tiers 0 and 1 equally fast without load ({u0:.0} vs {u1:.0} ns, within {:.0}%): no move can gain, none made",
                DELTA * 100.0
            );
            return Decisions::none();
        }
        let scouted = self.scout(obs.tiers, view);
        // Step 4.
        let share = self.value_migrations(tick, obs);
        let limit = self.migration_limit(share);
        if obs.tiers.len() < 2 || self.tracked.is_empty() {
            if self.tracked.is_empty() {
                self.mode = Mode::Warming;
                self.why = "no samples yet".into();
            }
            return Decisions::none();
        }
        // Steps 5-7.
        let rank = self.rank();
        let verdict = self.latency_verdict(obs.tiers);
        let skew = skew_note(&rank);
        let mut plan = Plan::new(obs.tiers, limit);
        let (mode, what) = self.plan_moves(&mut plan, &rank, verdict, view);
        let scouted = scout_note(scouted);
        let gated = self.stream_note();
        let what = format!("{what}{skew}{gated}{scouted}");
        self.set_mode(mode, what, share, phase_before);
        plan.out
    }

    fn export_state(&self) -> PolicyState {
        let mut hot_pages: Vec<(u64, f32)> = self
            .tracked
            .iter()
            .map(|&p| (p, f32::from(self.heat[p as usize]) / f32::from(COOL_AT)))
            .collect();
        hot_pages.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        PolicyState {
            from: PolicyKind::Adaptive,
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        for &(p, h) in &state.hot_pages {
            let i = p as usize;
            if i >= self.heat.len() {
                continue;
            }
            let heat = (h.clamp(0.0, 1.0) * f32::from(COOL_AT - 1)).round() as u16;
            if heat == 0 {
                continue;
            }
            self.heat[i] = heat;
            if self.flags[i] & TRACKED == 0 {
                self.flags[i] |= TRACKED;
                self.tracked.push(p);
            }
        }
    }

    /// Over equally fast tiers (`hold`) nothing is moved, so nothing needs
    /// sampling.
    fn wants_samples(&self) -> bool {
        self.mode != Mode::Hold
    }

    fn mode(&self) -> Option<PolicyMode> {
        Some(PolicyMode {
            mode: self.mode.name().to_string(),
            why: self.why.clone(),
        })
    }
}

/// Bytes `adaptive` keeps per guest page: heat and hits (2 + 2), last move
/// and first-sampled ticks (4 + 4), aborts, writes and flags (1 + 1 + 1),
/// and the tracked list entry (8) for a tracked page.
pub const BYTES_PER_PAGE: usize = 2 + 2 + 4 + 4 + 1 + 1 + 1;
/// Extra bytes per tracked (recently sampled) page.
pub const BYTES_PER_TRACKED_PAGE: usize = 8;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod step_tests;
