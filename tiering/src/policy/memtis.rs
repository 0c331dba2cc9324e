//! `memtis`: Memtis (SOSP'23).
//!
//! - Memtis tracks what the process maps: 2 MiB pages under transparent
//!   huge pages, which every Memtis setup in the seeds enables (Nomad's
//!   Memtis scripts: `thp_setting=always`), base pages otherwise
//!   ([`Grain`]; [`PolicyConfig::transparent_huge_pages`]: the simulator
//!   sets it, and the live engine over guest RAM backed by 2 MiB ranges).
//! - Access samples (PEBS in Memtis; sampled accesses here) feed per-page
//!   counts and Memtis' log2 histogram ([`AccessCounts`]): a huge page's
//!   count rises by one per sample, a base page's by 512. Loads are sampled
//!   one in [`SAMPLE_PERIOD`], stores one in [`STORE_SAMPLE_PERIOD`] (two
//!   PEBS events with their own periods).
//! - Cooling halves every count each [`COOLING_PERIOD_SAMPLES`] samples
//!   (Memtis-Default) or [`QUICK_COOL_PERIOD_SAMPLES`] (Memtis-QuickCool).
//! - The hot threshold follows Memtis' own cadence ([`Memtis::ingest`]):
//!   it starts at `htmm_thres_hot` (1), rises to the histogram's bin (the
//!   lowest bin such that every page at or above it fits in the fast tier)
//!   only every [`ADAPTATION_PERIOD_SAMPLES`] samples, and after a cooling
//!   drops by one at the next adaptation. A sample that lands on a cooling
//!   is not an adaptation, so with QuickCool's 2,000 (which divides
//!   100,000) the threshold never moves.
//! - `kmigraterd` runs every [`INTERVAL_NS`]: it demotes cold pages (below
//!   the threshold) from the fast tier to make room, and promotes sampled
//!   hot pages from slower tiers, at most [`MAX_MIGRATION_RATE_MBPS`] worth
//!   per interval, by (background) stop-and-copy, a whole 2 MiB page at a
//!   time under THP.
//!
//! Not modeled: Memtis' splitting of skewed huge pages (`check_split_huge_page`,
//! the estimated base-page histogram `ebp_hotness_hg`), and its warm set.

use super::hotness::ClockHand;
use super::types::*;
use super::{Policy, PolicyKind};

/// `htmm_sample_period` = 199 (memtis mempolicy.c defaults): the period
/// of the load events (LLC misses).
pub const SAMPLE_PERIOD: u64 = 199;
/// `htmm_inst_sample_period` = 100,007 (memtis mempolicy.c defaults; Nomad's
/// Memtis scripts set the same): the period of `ALL_STORES`, which
/// htmm_sampler.c `__perf_event_open` opens with it instead of
/// `htmm_sample_period`. One store in 100,007 is sampled, against one
/// LLC-missing load in 199.
pub const STORE_SAMPLE_PERIOD: u64 = 100_007;
/// `htmm_cooling_period` = 2,000,000 samples (Memtis-Default).
pub const COOLING_PERIOD_SAMPLES: u64 = 2_000_000;
/// Memtis-QuickCool: 2,000 samples (Nomad §4, Memtis-QuickCool).
pub const QUICK_COOL_PERIOD_SAMPLES: u64 = 2_000;
/// `htmm_adaptation_period` = 100,000 samples (memtis mempolicy.c
/// defaults, l.3035 in Nomad's copy `src/linux-5.15.19/mm/mempolicy.c`;
/// Nomad's Memtis scripts, e.g. `memtis_commands/hottest_10G_read.sh`
/// l.30, set the same): the hot threshold is adapted to the histogram
/// once per this many samples.
pub const ADAPTATION_PERIOD_SAMPLES: u64 = 100_000;
/// `htmm_thres_hot` = 1 (mempolicy.c l.3033; the scripts set 1): the
/// initial and the lowest hot threshold (memcontrol.c l.5247,
/// htmm_core.c l.1265-1266).
pub const HOT_THRESHOLD_MIN: usize = 1;
/// kmigraterd promote/demote period = 500 ms.
pub const INTERVAL_NS: u64 = 500_000_000;
/// `MAX_MIGRATION_RATE_IN_MBPS` = 2048 (htmm.h).
pub const MAX_MIGRATION_RATE_MBPS: f64 = 2048.0;
/// Free pages kept in the fast tier, as a fraction of it (room for new
/// hot pages; Memtis demotes ahead of promotion). Not a Memtis constant:
/// the same 0.4% as TPP's promotion watermark.
pub const FREE_RESERVE_FRACTION: f64 = 0.004;

/// Histogram bins: [`bin_of`] is 0..=15.
pub const BINS: usize = 16;

/// What one sample adds to a base page's count: `HPAGE_PMD_NR` (512;
/// htmm_core.c `update_base_page`, l.865), so that base and huge pages
/// share one histogram. A huge page's count rises by one per sample
/// (`update_huge_page`, l.921).
pub const BASE_PAGE_SAMPLE_WEIGHT: u32 = PAGES_PER_2M;

/// Memtis' bin of an access count, `get_idx` (htmm_core.c l.541-557):
/// `floor(log2(count + 1))`, at most 15.
#[inline]
pub fn bin_of(count: u32) -> usize {
    ((u64::from(count) + 1).ilog2() as usize).min(BINS - 1)
}

/// Fixed-point scale of counts and of the real-sample clock: a modeled
/// sample may stand for a fraction of a real one more or less.
const FIXED_ONE: u64 = 1 << 10;

/// The whole part of a fixed-point count.
fn whole(fixed: u64) -> u32 {
    u32::try_from(fixed / FIXED_ONE).unwrap_or(u32::MAX)
}

/// What Memtis counts and moves, and how the model samples for it: one
/// tracked page is the [`Grain`]'s `unit_pages` modeled pages, sampled once per
/// `load_period` (`store_period`) modeled load (store) events.
///
/// A modeled page stands for `scale` real 4 KiB pages with one real page's
/// access rate. Without THP a tracked page is a modeled page, sampled at
/// Memtis' own periods: a modeled sample is one real sample on each of its
/// real pages, adding [`BASE_PAGE_SAMPLE_WEIGHT`] to its count. Under THP a
/// tracked page is one 2 MiB page: `512 / scale` modeled pages (at least 1;
/// at scale >= 512 one modeled page holds `scale / 512` huge pages of equal
/// heat and its count is one of theirs). It must see the samples a real
/// huge page sees, one by one (each adds one, and QuickCool cools every
/// 2,000), not `scale` at once, so its periods are Memtis' times
/// `unit_pages / 512` (at least 1): at scale 256 every load event and one
/// store in 391 is sampled, each sample standing for 1.29 and 1.00 real
/// ones ([`Sampling::real_per_sample`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// What is counted and moved.
    pub grain: Grain,
    /// Modeled load events per sample.
    pub load_period: u64,
    /// Modeled store events per sample.
    pub store_period: u64,
    /// Real pages per modeled page.
    pub scale: f64,
}

impl Sampling {
    /// The grain and periods for `config`: 2 MiB pages under THP.
    pub fn for_config(config: &PolicyConfig) -> Self {
        let grain = Grain::new(config, config.transparent_huge_pages);
        Self {
            grain,
            load_period: grain.sample_period(config, SAMPLE_PERIOD),
            store_period: grain.sample_period(config, STORE_SAMPLE_PERIOD),
            scale: config.scale_at_least_one(),
        }
    }

    /// Real samples one modeled sample stands for: on its tracked page
    /// (`512 x period / (Memtis' period x unit_pages)` under THP, 1 on a
    /// base page), and in all (`scale x period / Memtis' period`, the
    /// `nr_sampled` clock).
    pub fn real_per_sample(&self, store: bool) -> (f64, f64) {
        let (model, real) = if store {
            (self.store_period, STORE_SAMPLE_PERIOD)
        } else {
            (self.load_period, SAMPLE_PERIOD)
        };
        let ratio = model as f64 / real as f64;
        let on_page = if self.grain.huge {
            f64::from(PAGES_PER_2M) * ratio / self.grain.unit_pages as f64
        } else {
            ratio
        };
        (on_page, self.scale * ratio)
    }

    /// What one modeled sample adds to its tracked page's count, and to
    /// the real-sample clock, in [`FIXED_ONE`] units.
    fn fixed_weights(&self, store: bool) -> (u64, u64) {
        let (on_page, clock) = self.real_per_sample(store);
        let per_real = if self.grain.huge {
            1.0
        } else {
            f64::from(BASE_PAGE_SAMPLE_WEIGHT)
        };
        let fixed = |x: f64| (x * FIXED_ONE as f64).round().max(1.0) as u64;
        (fixed(on_page * per_real), fixed(clock))
    }
}

/// Memtis' access counts per tracked page (`meta_page->total_accesses` or
/// `pginfo->total_accesses`, 32 bits as in Memtis) and its histogram
/// `hotness_hg`, in modeled pages (a huge page adds its 512 base pages,
/// l.963-967).
///
/// A cooling halves every count. As Memtis does it lazily (a page's count
/// is halved once per cooling it missed, when it is next looked at:
/// `check_transhuge_cooling`, `check_base_cooling`), a cooling here only
/// advances a clock, and each count is brought up to date when read; the
/// histogram is built when the threshold needs it. The result is that of
/// halving every count at once.
#[derive(Clone, Debug)]
pub struct AccessCounts {
    grain: Grain,
    pages: u64,
    /// In [`FIXED_ONE`] units, as of `stamps`.
    counts: Vec<u64>,
    /// The cooling clock each count was last brought up to.
    stamps: Vec<u32>,
    /// `memcg->cooling_clock`.
    clock: u32,
}

impl AccessCounts {
    /// All counts zero.
    pub fn new(pages: u64, grain: Grain) -> Self {
        let units = pages.div_ceil(grain.unit_pages) as usize;
        Self {
            grain,
            pages,
            counts: vec![0; units],
            stamps: vec![0; units],
            clock: 0,
        }
    }

    /// Tracked pages.
    pub fn units(&self) -> u64 {
        self.counts.len() as u64
    }

    /// The tracked page holding modeled page `page`.
    pub fn unit_of(&self, page: u64) -> u64 {
        page / self.grain.unit_pages
    }

    /// The modeled pages of tracked page `unit`.
    pub fn pages_of(&self, unit: u64) -> std::ops::Range<u64> {
        let first = unit.saturating_mul(self.grain.unit_pages).min(self.pages);
        first..first.saturating_add(self.grain.unit_pages).min(self.pages)
    }

    /// Count of tracked page `unit` (Memtis' integer count).
    pub fn count(&self, unit: u64) -> u32 {
        whole(self.fixed(unit))
    }

    fn fixed(&self, unit: u64) -> u64 {
        let u = unit as usize;
        let (Some(&c), Some(&stamp)) = (self.counts.get(u), self.stamps.get(u)) else {
            return 0;
        };
        // One halving per cooling missed.
        c.checked_shr(self.clock.wrapping_sub(stamp)).unwrap_or(0)
    }

    /// Bin of tracked page `unit`.
    pub fn bin(&self, unit: u64) -> usize {
        bin_of(self.count(unit))
    }

    fn set_fixed(&mut self, unit: u64, fixed: u64) {
        let u = unit as usize;
        if let (Some(c), Some(stamp)) = (self.counts.get_mut(u), self.stamps.get_mut(u)) {
            // 32-bit counts, as Memtis': saturate at u32::MAX.
            *c = fixed.min(u64::from(u32::MAX) * FIXED_ONE);
            *stamp = self.clock;
        }
    }

    /// One modeled sample of tracked page `unit`, adding `fixed`
    /// ([`FIXED_ONE`] units; ignored if out of range).
    fn add(&mut self, unit: u64, fixed: u64) {
        let c = self.fixed(unit).saturating_add(fixed);
        self.set_fixed(unit, c);
    }

    /// Halves every count (`__cooling`).
    pub fn cool(&mut self) {
        self.clock = self.clock.wrapping_add(1);
    }

    /// The histogram: modeled pages per bin.
    pub fn histogram(&self) -> [u64; BINS] {
        let mut hist = [0u64; BINS];
        for u in 0..self.units() {
            hist[self.bin(u)] += self.pages_of(u).count() as u64;
        }
        hist
    }

    /// `__adjust_active_threshold` step 1 (l.1239-1246): from the top bin
    /// down, the bins whose pages all fit in `capacity` pages; the lowest
    /// such bin (the top bin if even it does not fit), at least
    /// [`HOT_THRESHOLD_MIN`].
    pub fn hot_threshold_bin(&self, capacity: u64) -> usize {
        let hist = self.histogram();
        let mut active = 0u64;
        let mut idx = BINS;
        for b in (0..BINS).rev() {
            if active + hist[b] > capacity {
                break;
            }
            active += hist[b];
            idx = b;
        }
        idx.clamp(HOT_THRESHOLD_MIN, BINS - 1)
    }
}

/// The `memtis` policy.
#[derive(Clone, Debug)]
pub struct Memtis {
    counts: AccessCounts,
    /// Tracked pages sampled in a slower tier.
    candidates: Vec<u64>,
    is_candidate: Vec<bool>,
    hand: ClockHand,
    fast_capacity: u64,
    reserve: u64,
    budget: IntervalBudget,
    interval_ns: u64,
    tiers: usize,
    threshold_bin: usize,
    quick_cool: bool,
    sampling: Sampling,
    /// What a modeled (load, store) sample adds to its page's count and to
    /// the real-sample clock ([`Sampling::fixed_weights`]).
    weights: [(u64, u64); 2],
    /// `memcg->nr_sampled`, real-equivalent, in [`FIXED_ONE`] units.
    real_samples: u64,
    /// The cooling period in real samples.
    cooling_period_real: u64,
    /// `memcg->cooled`: a cooling happened since the last adaptation.
    cooled: bool,
}

impl Memtis {
    /// Memtis with the given cooling period in (real) samples.
    pub fn new(config: &PolicyConfig, cooling_period_samples: u64) -> Self {
        let interval_ns = config.interval_ns.unwrap_or(INTERVAL_NS);
        let rate = config
            .promote_rate_limit_mbps
            .unwrap_or(MAX_MIGRATION_RATE_MBPS);
        let fast = config.tier_capacity_pages.first().copied().unwrap_or(0);
        let sampling = Sampling::for_config(config);
        let counts = AccessCounts::new(config.pages, sampling.grain);
        Self {
            is_candidate: vec![false; counts.units() as usize],
            counts,
            candidates: Vec::new(),
            hand: ClockHand::default(),
            fast_capacity: fast,
            reserve: ((fast as f64 * config.free_reserve_or(FREE_RESERVE_FRACTION)).round() as u64)
                .max(1),
            budget: IntervalBudget::new(config.mb_to_pages_f64(rate * interval_ns as f64 / 1e9)),
            interval_ns,
            tiers: config.tiers(),
            threshold_bin: HOT_THRESHOLD_MIN,
            quick_cool: cooling_period_samples == QUICK_COOL_PERIOD_SAMPLES,
            sampling,
            weights: [sampling.fixed_weights(false), sampling.fixed_weights(true)],
            real_samples: 0,
            cooling_period_real: cooling_period_samples.max(1),
            cooled: false,
        }
    }

    /// Current hot threshold (histogram bin).
    pub fn threshold_bin(&self) -> usize {
        self.threshold_bin
    }

    /// What Memtis tracks and moves.
    pub fn grain(&self) -> Grain {
        self.counts.grain
    }

    /// How the model samples for Memtis.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// Count of the tracked page holding `page`.
    pub fn count(&self, page: u64) -> u32 {
        self.counts.count(self.counts.unit_of(page))
    }

    /// Takes the tick's samples one at a time, as Memtis' `update_pginfo`
    /// does (Nomad's copy of Memtis, `src/linux-5.15.19/mm/htmm_core.c`
    /// l.1332-1437, identical to github.com/cosmoss-jigu/memtis'
    /// `linux/mm/htmm_core.c`):
    /// 1. the tracked page's count rises (l.1366, `__update_pginfo`:
    ///    `update_huge_page` or `update_base_page`; [`Grain`]);
    /// 2. `nr_sampled` rises (l.1368/1374); one modeled sample stands for
    ///    `scale` real ones, so every real sample number it covers is
    ///    checked in order;
    /// 3. at a multiple of the cooling period the counts are halved and
    ///    `cooled` is set (l.1381-1385, `__cooling` l.1197-1223);
    /// 4. otherwise, at a multiple of `htmm_adaptation_period`, the
    ///    threshold is adapted (l.1431-1432; [`Self::adjust_threshold`]).
    ///    A cooling takes the sample number first (`else if`), so when the
    ///    cooling period divides the adaptation period (QuickCool: 2,000
    ///    and 100,000) no adaptation ever happens.
    ///
    /// Not modeled: the cooling `need_memcg_cooling` (l.1322-1330) adds
    /// each time the cgroup's usage has grown by `htmm_thres_cooling_alloc`
    /// (10 GB) since the last one, and the huge-page split branch of the
    /// adaptation (l.1299-1306).
    fn ingest(&mut self, samples: &[AccessSample]) {
        let c = self.cooling_period_real;
        let a = ADAPTATION_PERIOD_SAMPLES;
        let step = gcd(c, a);
        for s in samples {
            let unit = self.counts.unit_of(s.page);
            let (count, clock) = self.weights[usize::from(s.write)];
            // Step 1.
            self.counts.add(unit, count);
            // Step 2.
            let prev = self.real_samples / FIXED_ONE;
            self.real_samples += clock;
            let now = self.real_samples / FIXED_ONE;
            let mut m = (prev / step + 1) * step;
            while m <= now {
                if m.is_multiple_of(c) {
                    // Step 3.
                    self.counts.cool();
                    self.cooled = true;
                } else if m.is_multiple_of(a) {
                    // Step 4.
                    self.adjust_threshold();
                }
                m += step;
            }
            if s.tier != 0 {
                if let Some(c) = self.is_candidate.get_mut(unit as usize) {
                    if !*c {
                        *c = true;
                        self.candidates.push(unit);
                    }
                }
            }
        }
    }

    /// `__adjust_active_threshold` (htmm_core.c l.1225-1320):
    /// 1. the histogram's bin: the lowest bin such that every page at or
    ///    above it fits in the fast tier less its reserve (l.1239-1246),
    ///    at least `htmm_thres_hot` (l.1265-1266);
    /// 2. after a cooling, the threshold drops by one if that bin is lower
    ///    and the threshold is above 1 (l.1271-1279), and `cooled` clears;
    /// 3. otherwise it rises to the bin if the bin is higher (l.1293-1297);
    ///    it never falls here (the fall at l.1299-1306 needs a huge-page
    ///    split).
    fn adjust_threshold(&mut self) {
        // Step 1.
        let idx_hot = self
            .counts
            .hot_threshold_bin(self.fast_capacity.saturating_sub(self.reserve));
        if self.cooled {
            // Step 2.
            if idx_hot < self.threshold_bin && self.threshold_bin > 1 {
                self.threshold_bin -= 1;
            }
            self.cooled = false;
        } else if idx_hot > self.threshold_bin {
            // Step 3.
            self.threshold_bin = idx_hot;
        }
    }

    /// Step 1 of [`Policy::tick`]: the candidates with pages in slower
    /// tiers whose bin is at or above the threshold, hottest first, with
    /// their pages per tier; and the colder ones sampled since, which stay
    /// candidates. The others leave the list.
    fn hot_units(&mut self, view: &dyn MemoryView) -> (Vec<(u64, PerTier)>, Vec<u64>) {
        let th = self.threshold_bin;
        let mut hot: Vec<(u64, PerTier)> = Vec::new();
        let mut keep: Vec<u64> = Vec::new();
        for &u in &self.candidates {
            let placed = self.placement(u, view);
            let slow: u64 = placed[1..].iter().sum();
            if slow == 0 {
                self.is_candidate[u as usize] = false;
            } else if self.counts.bin(u) >= th {
                hot.push((u, placed));
            } else if self.counts.count(u) > 0 {
                keep.push(u);
            } else {
                self.is_candidate[u as usize] = false;
            }
        }
        hot.sort_by_key(|&(u, _)| (std::cmp::Reverse(self.counts.count(u)), u));
        (hot, keep)
    }

    /// Step 2 of [`Policy::tick`]: cold tracked pages (below the
    /// threshold) wholly in the fast tier demoted to make room for the
    /// period's promotions and the reserve.
    fn demote_cold(&mut self, period: &mut Period, view: &mut dyn MemoryView) {
        let th = self.threshold_bin;
        let need = (period.want + self.reserve).saturating_sub(period.budget.free(0));
        if need == 0 || self.tiers <= 1 {
            return;
        }
        let counts = &self.counts;
        let max_scan = view.pages();
        let unit_pages = counts.grain.unit_pages;
        // The hand stops at the first page of each cold tracked page.
        let cold_units: Vec<u64> = self
            .hand
            .find(
                view,
                0,
                need.min(period.budget_pages).div_ceil(unit_pages),
                max_scan,
                |p, _| p.is_multiple_of(unit_pages) && counts.bin(counts.unit_of(p)) < th,
            )
            .into_iter()
            .map(|p| counts.unit_of(p))
            .collect();
        for u in cold_units {
            let placed = self.placement(u, view);
            let len = placed[0];
            let Some(dest) = (1..self.tiers)
                .map(|d| d as TierId)
                .find(|&d| period.budget.take(d, len))
            else {
                break;
            };
            period.budget.release(0, len);
            period.demoted += len;
            period.out.migrations.push(self.migration(u, dest));
        }
    }

    /// Step 3 of [`Policy::tick`]: the `hot` pages promoted whole, within
    /// the period's budget; those left over stay candidates (`keep`).
    fn promote_hot(&mut self, period: &mut Period, hot: Vec<(u64, PerTier)>, keep: &mut Vec<u64>) {
        let mut promoted = 0u64;
        for (u, placed) in hot {
            let len: u64 = placed[1..].iter().sum();
            // A huge page may overshoot the budget by one (the first).
            if (promoted > 0 && promoted + len > period.want)
                || period.demoted + promoted + len > 2 * period.budget_pages
                || !period.budget.take(0, len)
            {
                keep.push(u);
                continue;
            }
            for (t, &n) in placed.iter().enumerate().skip(1) {
                period.budget.release(t as TierId, n);
            }
            self.is_candidate[u as usize] = false;
            promoted += len;
            period.out.migrations.push(self.migration(u, 0));
        }
    }

    /// The background stop-and-copy migration of tracked page `unit` to
    /// `to`.
    fn migration(&self, unit: u64, to: TierId) -> Migration {
        let r = self.counts.pages_of(unit);
        Migration {
            unit: Unit::run(r.start, (r.end - r.start) as u32),
            to,
            mechanism: Mechanism::StopAndCopy,
            urgency: Urgency::Background,
        }
    }

    /// Pages of tracked page `unit` per tier (index = tier).
    fn placement(&self, unit: u64, view: &dyn MemoryView) -> PerTier {
        let mut per_tier = [0u64; crate::vocab::MAX_TIERS];
        for p in self.counts.pages_of(unit) {
            if let Some(n) = per_tier.get_mut(usize::from(view.tier_of(p))) {
                *n += 1;
            }
        }
        per_tier
    }
}

/// Pages of a tracked page per tier (index = tier).
type PerTier = [u64; crate::vocab::MAX_TIERS];

/// One kmigraterd period being planned ([`Policy::tick`]).
struct Period {
    out: Decisions,
    budget: FreeBudget,
    /// Pages the interval's migration budget allows.
    budget_pages: u64,
    /// Pages the hot tracked pages promote, within `budget_pages`.
    want: u64,
    /// Pages demoted to make room.
    demoted: u64,
}

/// Pages the `hot` tracked pages (hottest first) would promote, taken
/// whole until they reach `budget_pages`; at most `budget_pages`.
fn promotion_want(hot: &[(u64, PerTier)], budget_pages: u64) -> u64 {
    let mut want = 0u64;
    for (_, placed) in hot {
        if want >= budget_pages {
            break;
        }
        want += placed[1..].iter().sum::<u64>();
    }
    want.min(budget_pages)
}

/// Greatest common divisor (both > 0).
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

impl Policy for Memtis {
    fn kind(&self) -> PolicyKind {
        if self.quick_cool {
            PolicyKind::MemtisQuickcool
        } else {
            PolicyKind::Memtis
        }
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            sample_period: self.sampling.load_period,
            store_sample_period: self.sampling.store_period,
            // PEBS (Memtis §4.1).
            hardware_samples: true,
            huge_pages: self.counts.grain.huge,
            ..TrackerRequest::none()
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// kmigraterd's period, on tracked pages:
    /// 1. sampled tracked pages with pages in slower tiers whose bin is at
    ///    or above the threshold are hot, hottest first; the others keep
    ///    their place in the list while their count is above zero;
    /// 2. cold tracked pages (below the threshold) wholly in the fast tier
    ///    are demoted to make room for the promotions and the reserve;
    /// 3. hot ones are promoted whole, within the interval's budget.
    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        self.ingest(obs.samples);
        // Step 1.
        let (hot, mut keep) = self.hot_units(view);
        let budget_pages = self.budget.next_interval();
        let mut period = Period {
            out: Decisions::none(),
            budget: FreeBudget::from_tiers(obs.tiers),
            budget_pages,
            want: promotion_want(&hot, budget_pages),
            demoted: 0,
        };
        // Step 2.
        self.demote_cold(&mut period, view);
        // Step 3.
        self.promote_hot(&mut period, hot, &mut keep);
        self.candidates = keep;
        period.out
    }

    fn export_state(&self) -> PolicyState {
        let top = self.counts.histogram().iter().rposition(|&n| n > 0);
        let max = (1u64 << top.unwrap_or(0)) as f32;
        let mut hot_pages: Vec<(u64, f32)> = (0..self.counts.units())
            .filter(|&u| self.counts.count(u) > 0)
            .flat_map(|u| {
                let heat = (self.counts.count(u) as f32 / max).min(1.0);
                self.counts.pages_of(u).map(move |p| (p, heat))
            })
            .collect();
        hot_pages.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        PolicyState {
            from: PolicyKind::Memtis,
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        for &(p, heat) in &state.hot_pages {
            let u = self.counts.unit_of(p);
            // Sixteen load samples' worth for the hottest page.
            let samples = (heat.clamp(0.0, 1.0) * 16.0).round() as u64;
            let c = samples.saturating_mul(self.weights[0].0);
            if c > self.counts.fixed(u) {
                self.counts.set_fixed(u, c);
            }
            if let Some(c) = self.is_candidate.get_mut(u as usize) {
                if !*c {
                    *c = true;
                    self.candidates.push(u);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    fn sample(page: u64, tier: TierId) -> AccessSample {
        AccessSample {
            page,
            tier,
            write: false,
        }
    }

    #[test]
    fn promotes_hot_pages_demotes_cold_and_cools() {
        let cfg = PolicyConfig::new(100, vec![10, 100]);
        let mut m = Memtis::new(&cfg, 40);
        let mut v = VecView::two_tier(100, 10); // fast tier full with pages 0..10
        let caps = [10, 100];
        let mut samples = Vec::new();
        // Page 51 is three times as hot as page 50: hottest first means 51
        // before 50 (equal heats would let a coldest-first order pass).
        for i in 0..16 {
            samples.push(sample(if i % 4 == 0 { 50 } else { 51 }, 1));
        }
        samples.push(sample(3, 0));
        let st = v.status(&caps);
        let d = m.tick(&obs(0, &st, &samples), &mut v);
        let promoted = pages_moved_to(&d, 0);
        let demoted = pages_moved_to(&d, 1);
        assert_eq!(promoted, vec![51, 50], "hottest first");
        assert!(!demoted.contains(&3), "sampled page 3 is not cold");
        assert_eq!(demoted.len(), 3, "two promotions plus a one-page reserve");
        // 17 samples so far; 23 more reach the cooling period of 40.
        let more: Vec<_> = (0..23).map(|_| sample(52, 1)).collect();
        v.apply(&d.migrations);
        let st = v.status(&caps);
        m.tick(&obs(1, &st, &more), &mut v);
        // A base page's sample counts 512 (update_base_page).
        assert_eq!(
            m.count(51),
            6 * BASE_PAGE_SAMPLE_WEIGHT,
            "cooling halves counts"
        );
        assert_eq!(
            m.count(50),
            2 * BASE_PAGE_SAMPLE_WEIGHT,
            "cooling halves counts"
        );
    }

    /// Samples `from..to` (real sample numbers) of a skewed stream over
    /// huge pages: huge pages 20-24 take three in four, 30-89 the rest
    /// (`light`), or 20-24 all of them (not `light`).
    fn skewed(from: usize, to: usize, light: bool) -> Vec<AccessSample> {
        let huge = u64::from(PAGES_PER_2M);
        (from..to)
            .map(|i| {
                if light && i % 4 == 0 {
                    sample((30 + (i / 4 % 60) as u64) * huge, 1)
                } else {
                    sample((20 + (i % 5) as u64) * huge, 1)
                }
            })
            .collect()
    }

    /// 100 huge pages at scale 1 under THP, ten of them fit in the fast tier
    /// (which holds the first ten): one sample adds one.
    fn thp_config() -> (PolicyConfig, [u64; 2]) {
        let huge = u64::from(PAGES_PER_2M);
        let caps = [10 * huge, 100 * huge];
        let mut cfg = PolicyConfig::new(100 * huge, caps.to_vec());
        cfg.transparent_huge_pages = true;
        (cfg, caps)
    }

    /// The histogram's bin for the fast tier less its reserve.
    fn fit(m: &Memtis) -> usize {
        m.counts.hot_threshold_bin(m.fast_capacity - m.reserve)
    }

    #[test]
    fn threshold_rises_only_at_the_adaptation_period_and_drops_by_one_after_cooling() {
        // Scale 1 (a modeled sample is a real one), Memtis-Default.
        let (cfg, caps) = thp_config();
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(cfg.pages, caps[0]);
        let mut k = 0;
        let mut tick = |m: &mut Memtis, s: &[AccessSample]| {
            let st = v.status(&caps);
            let d = m.tick(&obs(k, &st, s), &mut v);
            v.apply(&d.migrations);
            k += 1;
        };
        let a = ADAPTATION_PERIOD_SAMPLES as usize;
        tick(&mut m, &skewed(0, a - 1, true));
        let high = fit(&m);
        assert!(high > 2, "the histogram asks for a high threshold ({high})");
        assert_eq!(
            m.threshold_bin(),
            HOT_THRESHOLD_MIN,
            "not before sample 100,000"
        );
        tick(&mut m, &skewed(a - 1, a, true));
        assert_eq!(m.threshold_bin(), high, "raised at sample 100,000");
        // Up to the cooling at sample 2,000,000: the light pages keep
        // their counts, so the threshold stays.
        let c = COOLING_PERIOD_SAMPLES as usize;
        for from in (a..c).step_by(a) {
            tick(&mut m, &skewed(from, from + a, false));
        }
        assert!(m.cooled, "sample 2,000,000 cooled");
        let lower = fit(&m);
        assert!(lower < high, "halved counts ask for less ({lower})");
        assert_eq!(m.threshold_bin(), high, "a cooling alone moves nothing");
        // The next adaptation (2,100,000) after the cooling: down by one.
        tick(&mut m, &skewed(c, c + a, false));
        assert!(!m.cooled);
        assert_eq!(m.threshold_bin(), high - 1, "one step down after a cooling");
    }

    #[test]
    fn quick_cool_never_adapts_its_threshold() {
        // 2,000 divides 100,000: every adaptation sample is a cooling
        // sample, which takes it (htmm_core.c l.1381, 1431).
        let (cfg, caps) = thp_config();
        let mut m = Memtis::new(&cfg, QUICK_COOL_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(cfg.pages, caps[0]);
        let st = v.status(&caps);
        let s = skewed(0, 3 * ADAPTATION_PERIOD_SAMPLES as usize, true);
        m.tick(&obs(0, &st, &s), &mut v);
        assert_eq!(m.threshold_bin(), HOT_THRESHOLD_MIN);
        // The same samples under Memtis-Default raise it.
        let mut d = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(cfg.pages, caps[0]);
        d.tick(&obs(0, &st, &s), &mut v);
        assert!(d.threshold_bin() > HOT_THRESHOLD_MIN);
    }

    /// `get_idx`: floor(log2(count + 1)), at most 15.
    #[test]
    fn bins_are_memtis_get_idx() {
        let cases = [
            (0, 0),
            (1, 1),
            (2, 1),
            (3, 2),
            (511, 9),
            (512, 9),
            (32_767, 15),
        ];
        for (count, bin) in cases {
            assert_eq!(bin_of(count), bin, "count {count}");
        }
        assert_eq!(bin_of(u32::MAX), 15);
    }

    /// Under THP at scale 256 a huge page is two modeled pages, sampled
    /// at every load event (Memtis' 199 x 2 / 512, at least 1): a load
    /// sample on one adds 1.29 real samples to the huge page (the rest is
    /// kept as a fraction), the pair is promoted together, and the engine is
    /// asked to charge 2 MiB moves.
    #[test]
    fn under_thp_a_huge_page_is_counted_and_promoted_whole() {
        let caps = [8, 64];
        let mut cfg = PolicyConfig::new(64, caps.to_vec());
        cfg.scale = 256.0;
        cfg.transparent_huge_pages = true;
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let (g, s) = (m.grain(), m.sampling());
        assert_eq!(
            (g.unit_pages, g.huge, s.load_period, s.store_period),
            (2, true, 1, 391)
        );
        let (on_page, clock) = s.real_per_sample(false);
        assert!((on_page - 512.0 / 398.0).abs() < 1e-9 && (clock - 256.0 / 199.0).abs() < 1e-9);
        let t = m.trackers();
        assert!(t.huge_pages && t.sample_period == 1 && t.store_sample_period == 391);
        assert!(
            t.hardware_samples && !t.accessed_bits && !t.dirty_log,
            "PEBS"
        );
        let mut v = VecView::two_tier(64, 4); // pages 0-3 fast, room for 4
        let st = v.status(&caps);
        let d = m.tick(&obs(0, &st, &[sample(41, 1)]), &mut v);
        assert_eq!(m.count(40), 1, "page 40 shares page 41's huge page");
        m.tick(&obs(1, &st, &[sample(40, 1), sample(41, 1)]), &mut v);
        assert_eq!(m.count(41), 3, "three samples of 1.29 real ones each");
        let promoted: Vec<Unit> = d
            .migrations
            .iter()
            .filter(|x| x.to == 0)
            .map(|x| x.unit)
            .collect();
        assert_eq!(promoted, vec![Unit::run(40, 2)]);
        // Without THP the same sample counts 512 for page 41 alone.
        cfg.transparent_huge_pages = false;
        let mut b = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        assert!(!b.trackers().huge_pages);
        let mut v = VecView::two_tier(64, 4);
        let d = b.tick(&obs(0, &st, &[sample(41, 1)]), &mut v);
        assert_eq!((b.count(40), b.count(41)), (0, BASE_PAGE_SAMPLE_WEIGHT));
        assert_eq!(pages_moved_to(&d, 0), vec![41]);
    }

    #[test]
    fn a_modeled_sample_covers_scale_real_samples() {
        // Scale 1,000: the 100th modeled sample is real sample 100,000.
        let mut cfg = PolicyConfig::new(100, vec![10, 100]);
        cfg.scale = 1000.0;
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        let st = v.status(&[10, 100]);
        let skewed = |from: usize, to: usize, light: bool| -> Vec<AccessSample> {
            skewed(from, to, light)
                .into_iter()
                .map(|s| sample(s.page / u64::from(PAGES_PER_2M), s.tier))
                .collect()
        };
        m.tick(&obs(0, &st, &skewed(0, 99, true)), &mut v);
        assert!(m.counts.hot_threshold_bin(9) > HOT_THRESHOLD_MIN);
        assert_eq!(m.threshold_bin(), HOT_THRESHOLD_MIN);
        m.tick(&obs(1, &st, &skewed(99, 100, true)), &mut v);
        assert!(m.threshold_bin() > HOT_THRESHOLD_MIN);
    }

    /// Memtis-Default over 100 base pages at scale 1, a fast tier of 10
    /// holding pages 0-9 (full): the policy, the view and its status.
    fn memtis_on_100_pages() -> (Memtis, VecView, Vec<TierStatus>) {
        let cfg = PolicyConfig::new(100, vec![10, 100]);
        let v = VecView::two_tier(100, 10);
        let st = v.status(&[10, 100]);
        (Memtis::new(&cfg, COOLING_PERIOD_SAMPLES), v, st)
    }

    /// Counts at base-page grain over `pages` pages.
    fn base_counts(pages: u64) -> AccessCounts {
        AccessCounts::new(
            pages,
            Grain {
                unit_pages: 1,
                huge: false,
            },
        )
    }

    /// Counts are Memtis' 32-bit counts: they saturate at `u32::MAX`.
    #[test]
    fn counts_saturate_at_u32_max() {
        let mut c = base_counts(4);
        c.add(1, u64::MAX);
        assert_eq!(c.count(1), u32::MAX);
        c.add(1, FIXED_ONE);
        assert_eq!(c.count(1), u32::MAX);
        assert_eq!(c.bin(1), BINS - 1);
    }

    /// `__adjust_active_threshold` step 1: from the top bin down, the bins
    /// whose pages together fit in the capacity; the lowest of them, at
    /// least `htmm_thres_hot`, at most the top bin (even when the top
    /// bin's pages alone do not fit).
    #[test]
    fn the_hot_bin_is_the_lowest_whose_pages_all_fit() {
        // 2 pages in bin 3 (count 7), 3 in bin 2 (count 3), 4 in bin 1
        // (count 1), 1 in bin 0.
        let mut c = base_counts(10);
        for (unit, count) in [
            (0, 7),
            (1, 7),
            (2, 3),
            (3, 3),
            (4, 3),
            (5, 1),
            (6, 1),
            (7, 1),
            (8, 1),
        ] {
            c.add(unit, count * FIXED_ONE);
        }
        assert_eq!(c.histogram()[..4], [1, 4, 3, 2]);
        // Bins 3 and 2 hold 5 pages: they fit in 5 (not 4), bin 1 too in 9.
        assert_eq!(c.hot_threshold_bin(5), 2);
        assert_eq!(c.hot_threshold_bin(4), 3);
        assert_eq!(c.hot_threshold_bin(9), 1);
        // Bin 0 fits in 10, but the threshold is at least 1.
        assert_eq!(c.hot_threshold_bin(10), HOT_THRESHOLD_MIN);
        // Not even the top bin fits: the top bin.
        let mut top = base_counts(3);
        for unit in 0..3 {
            top.add(unit, u64::from(u32::MAX) * FIXED_ONE);
        }
        assert_eq!(top.hot_threshold_bin(2), BINS - 1);
        assert_eq!(top.hot_threshold_bin(0), BINS - 1);
    }

    /// Step 2 after a cooling: the threshold drops by one only when the
    /// histogram asks for a lower bin; asked for the same bin, it stays
    /// (and `cooled` clears either way).
    #[test]
    fn after_a_cooling_the_threshold_drops_only_when_the_histogram_asks_lower() {
        // Fast tier of 10 pages, reserve 1: 9 pages fit.
        let cfg = PolicyConfig::new(20, vec![10, 20]);
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        assert_eq!(m.reserve, 1);
        // 9 pages in bin 2, 1 in bin 1 and 10 in bin 0: the histogram's
        // bin is 2.
        for unit in 0..9 {
            m.counts.add(unit, 3 * FIXED_ONE);
        }
        m.counts.add(9, FIXED_ONE);
        assert_eq!(fit(&m), 2);
        for (threshold, after) in [(2, 2), (3, 2), (5, 4)] {
            m.threshold_bin = threshold;
            m.cooled = true;
            m.adjust_threshold();
            assert_eq!(m.threshold_bin(), after, "from {threshold}");
            assert!(!m.cooled);
        }
        // Without a cooling it only rises, to the histogram's bin.
        m.threshold_bin = 1;
        m.adjust_threshold();
        assert_eq!(m.threshold_bin(), 2);
        m.threshold_bin = 5;
        m.adjust_threshold();
        assert_eq!(m.threshold_bin(), 5);
    }

    /// A modeled sample that stands for more real samples than a cooling
    /// period cools once per period it covers (QuickCool, 2,000 samples,
    /// at scale 5,000: one modeled sample covers real samples 1 to 5,000,
    /// two coolings).
    #[test]
    fn one_modeled_sample_cools_once_per_period_it_covers() {
        let mut cfg = PolicyConfig::new(100, vec![10, 100]);
        cfg.scale = 5000.0;
        let mut m = Memtis::new(&cfg, QUICK_COOL_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        let st = v.status(&[10, 100]);
        m.tick(&obs(0, &st, &[sample(50, 1)]), &mut v);
        assert_eq!(m.count(50), BASE_PAGE_SAMPLE_WEIGHT / 4);
        // Real samples 5,001 to 10,000: 6,000, 8,000 and 10,000.
        m.tick(&obs(1, &st, &[sample(60, 1)]), &mut v);
        assert_eq!(m.count(50), BASE_PAGE_SAMPLE_WEIGHT / 32);
        assert_eq!(m.count(60), BASE_PAGE_SAMPLE_WEIGHT / 8);
    }

    /// A candidate below the threshold stays on the list while its count
    /// is above zero: when the threshold later falls to its bin, it is
    /// promoted without another sample. Cooled to zero, it leaves.
    #[test]
    fn a_colder_candidate_waits_on_the_list_until_its_count_cools_to_zero() {
        let (mut m, mut v, _) = memtis_on_100_pages();
        let mut tick = |m: &mut Memtis, k: u64, s: &[AccessSample]| {
            let st = v.status(&[10, 100]);
            let d = m.tick(&obs(k, &st, s), &mut v);
            v.apply(&d.migrations);
            pages_moved_to(&d, 0)
        };
        m.threshold_bin = 10;
        assert!(tick(&mut m, 0, &[sample(50, 1)]).is_empty());
        assert_eq!(m.candidates, vec![50], "bin 9 < 10: kept");
        // The threshold falls to page 50's bin: promoted, unsampled.
        m.threshold_bin = 9;
        assert_eq!(tick(&mut m, 1, &[]), vec![50]);
        // Another candidate, then cooled to zero: off the list.
        m.threshold_bin = 10;
        tick(&mut m, 2, &[sample(60, 1)]);
        assert_eq!(m.candidates, vec![60]);
        for _ in 0..10 {
            m.counts.cool();
        }
        assert_eq!(m.count(60), 0);
        tick(&mut m, 3, &[]);
        assert!(m.candidates.is_empty(), "{:?}", m.candidates);
        assert!(!m.is_candidate[60]);
    }

    /// A period moves at most twice its budget, demotions and promotions
    /// together: with a budget of half a huge page, demoting one cold huge
    /// page leaves no room to promote the hot one in the same period; it
    /// goes up in the next, into the room made.
    #[test]
    fn demotions_and_promotions_together_stay_within_twice_the_budget() {
        let huge = u64::from(PAGES_PER_2M);
        let caps = [2 * huge, 4 * huge];
        let mut cfg = PolicyConfig::new(4 * huge, caps.to_vec());
        cfg.transparent_huge_pages = true;
        // 2 MB/s x 0.5 s = 256 pages a period.
        cfg.promote_rate_limit_mbps = Some(2.0);
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(4 * huge, 2 * huge);
        let mut tick = |m: &mut Memtis, k: u64, s: &[AccessSample]| {
            let st = v.status(&caps);
            let d = m.tick(&obs(k, &st, s), &mut v);
            v.apply(&d.migrations);
            (pages_moved_to(&d, 0), pages_moved_to(&d, 1))
        };
        // (Huge pages moved up, and down, by their first page.)
        assert_eq!(tick(&mut m, 0, &[sample(3 * huge, 1)]), (vec![], vec![0]));
        assert_eq!(tick(&mut m, 1, &[]), (vec![3 * huge], vec![]));
    }

    /// Promotions stop at the period's budget (after the first, which may
    /// overshoot it by one tracked page), hottest first.
    #[test]
    fn promotions_stop_at_the_periods_budget_hottest_first() {
        let mut cfg = PolicyConfig::new(100, vec![20, 100]);
        // 3 pages a period: 3 x 4 KiB / 0.5 s.
        cfg.promote_rate_limit_mbps = Some(3.0 * 4096.0 / 1048576.0 / 0.5);
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        let st = v.status(&[20, 100]);
        let samples: Vec<AccessSample> = [50, 51, 52, 53, 54, 54, 53]
            .into_iter()
            .map(|p| sample(p, 1))
            .collect();
        let d = m.tick(&obs(0, &st, &samples), &mut v);
        let mut up = pages_moved_to(&d, 0);
        up.sort_unstable();
        assert_eq!(up, vec![50, 53, 54]);
        assert!(pages_moved_to(&d, 1).is_empty(), "room enough: no demotion");
        assert_eq!(m.candidates, vec![51, 52]);
    }

    /// Step 2 under THP: the hand stops at the first page of each cold
    /// huge page wholly in the fast tier, each huge page once; the room
    /// made takes the hot ones.
    #[test]
    fn under_thp_each_cold_huge_page_is_demoted_once() {
        let huge = u64::from(PAGES_PER_2M);
        let caps = [2 * huge, 4 * huge];
        let mut cfg = PolicyConfig::new(4 * huge, caps.to_vec());
        cfg.transparent_huge_pages = true;
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(4 * huge, 2 * huge);
        let st = v.status(&caps);
        let s = [sample(2 * huge, 1), sample(3 * huge + 7, 1)];
        let d = m.tick(&obs(0, &st, &s), &mut v);
        assert_eq!(pages_moved_to(&d, 1), vec![0, huge]);
        assert_eq!(pages_moved_to(&d, 0), vec![2 * huge, 3 * huge]);
    }

    /// A tracked page at the threshold's bin is hot: it is not demoted to
    /// make room (only those below are).
    #[test]
    fn a_fast_page_at_the_threshold_is_not_cold() {
        let (mut m, mut v, st) = memtis_on_100_pages();
        m.threshold_bin = 9;
        // Fast pages 0-8 sampled once (512, bin 9), page 9 never; slow
        // page 50 sampled once: hot. Room for it and the reserve: 2 pages.
        let mut s: Vec<AccessSample> = (0..9).map(|p| sample(p, 0)).collect();
        s.push(sample(50, 1));
        let d = m.tick(&obs(0, &st, &s), &mut v);
        assert_eq!(pages_moved_to(&d, 1), vec![9]);
        assert_eq!(pages_moved_to(&d, 0), vec![50]);
    }

    /// The exported heat is a page's count over the top bin's lower bound
    /// (at most 1): the hottest page exports 1.
    #[test]
    fn exported_heat_is_relative_to_the_top_bin() {
        let (mut m, mut v, st) = memtis_on_100_pages();
        m.threshold_bin = 15;
        m.tick(
            &obs(0, &st, &[sample(50, 1), sample(50, 1), sample(60, 1)]),
            &mut v,
        );
        // Counts 1024 (bin 10) and 512.
        let state = m.export_state();
        assert_eq!(state.hot_pages, vec![(50, 1.0), (60, 0.5)]);
    }

    /// Imported heat becomes counts (the hottest page: sixteen load
    /// samples' worth, 16 x 512 on a base page), never lowering a count,
    /// and every imported page becomes a candidate once.
    #[test]
    fn imported_heat_becomes_counts_and_candidates() {
        let (mut m, mut v, st) = memtis_on_100_pages();
        m.threshold_bin = 15;
        // Page 40 sampled 20 times: 10,240, above what heat 1 gives.
        let s: Vec<AccessSample> = (0..20).map(|_| sample(40, 1)).collect();
        m.tick(&obs(0, &st, &s), &mut v);
        let state = PolicyState {
            from: PolicyKind::Tpp,
            now_ns: 0,
            hot_pages: vec![
                (50, 1.0),
                (60, 0.25),
                (70, 2.0),
                (40, 1.0),
                (50, 0.5),
                (999, 1.0),
            ],
        };
        m.import_state(&state);
        assert_eq!(m.count(50), 16 * BASE_PAGE_SAMPLE_WEIGHT);
        assert_eq!(m.count(60), 4 * BASE_PAGE_SAMPLE_WEIGHT);
        assert_eq!(
            m.count(70),
            16 * BASE_PAGE_SAMPLE_WEIGHT,
            "heat clamped to 1"
        );
        assert_eq!(m.count(40), 20 * BASE_PAGE_SAMPLE_WEIGHT, "never lowered");
        assert_eq!(m.candidates, vec![40, 50, 60, 70]);
    }
}
