//! `memtis`: Memtis (SOSP'23), 4 KiB pages only.
//!
//! - Access samples (PEBS in Memtis; sampled accesses here) feed per-page
//!   counts and a log2 histogram ([`super::hotness::SampleCounts`]). Loads
//!   are sampled one in [`SAMPLE_PERIOD`], stores one in
//!   [`STORE_SAMPLE_PERIOD`] (two PEBS events with their own periods).
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
//!   per interval, by (background) stop-and-copy.

use super::hotness::{bin_of, ClockHand, SampleCounts};
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

/// The `memtis` policy.
#[derive(Clone, Debug)]
pub struct Memtis {
    counts: SampleCounts,
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
    /// Real samples one modeled sample stands for (the scale).
    sample_weight: u64,
    /// `memcg->nr_sampled`, real-equivalent.
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
        Self {
            counts: SampleCounts::new(config.pages),
            candidates: Vec::new(),
            is_candidate: vec![false; config.pages as usize],
            hand: ClockHand::default(),
            fast_capacity: fast,
            reserve: ((fast as f64 * FREE_RESERVE_FRACTION).round() as u64).max(1),
            budget: IntervalBudget::new(config.mb_to_pages_f64(rate * interval_ns as f64 / 1e9)),
            interval_ns,
            tiers: config.tiers(),
            threshold_bin: HOT_THRESHOLD_MIN,
            quick_cool: cooling_period_samples == QUICK_COOL_PERIOD_SAMPLES,
            sample_weight: config.scale.round().max(1.0) as u64,
            real_samples: 0,
            cooling_period_real: cooling_period_samples.max(1),
            cooled: false,
        }
    }

    /// Current hot threshold (histogram bin).
    pub fn threshold_bin(&self) -> usize {
        self.threshold_bin
    }

    /// Count of a page.
    pub fn count(&self, page: u64) -> u16 {
        self.counts.count(page)
    }

    /// Takes the tick's samples one at a time, as Memtis' `update_pginfo`
    /// does (Nomad's copy of Memtis, `src/linux-5.15.19/mm/htmm_core.c`
    /// l.1332-1437, identical to github.com/cosmoss-jigu/memtis'
    /// `linux/mm/htmm_core.c`):
    /// 1. the page's count rises (l.1366, `__update_pginfo`);
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
    /// adaptation (l.1299-1306: 4 KiB pages are never split).
    fn ingest(&mut self, samples: &[AccessSample]) {
        let c = self.cooling_period_real;
        let a = ADAPTATION_PERIOD_SAMPLES;
        let step = gcd(c, a);
        for s in samples {
            // Step 1.
            self.counts.add(s.page);
            // Step 2.
            let prev = self.real_samples;
            self.real_samples += self.sample_weight;
            let mut m = (prev / step + 1) * step;
            while m <= self.real_samples {
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
                if let Some(c) = self.is_candidate.get_mut(s.page as usize) {
                    if !*c {
                        *c = true;
                        self.candidates.push(s.page);
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
            .hot_threshold_bin(self.fast_capacity.saturating_sub(self.reserve))
            .max(HOT_THRESHOLD_MIN);
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
            sample_period: SAMPLE_PERIOD,
            store_sample_period: STORE_SAMPLE_PERIOD,
            // PEBS (Memtis §4.1).
            hardware_samples: true,
            ..TrackerRequest::none()
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        self.interval_ns
    }

    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        self.ingest(obs.samples);
        let th = self.threshold_bin;
        let mut out = Decisions::none();
        let mut budget = FreeBudget::from_tiers(obs.tiers);
        // Hot candidates in slower tiers, hottest first.
        let mut hot: Vec<u64> = Vec::new();
        let mut keep: Vec<u64> = Vec::new();
        for &p in &self.candidates {
            if view.tier_of(p) == 0 {
                self.is_candidate[p as usize] = false;
            } else if bin_of(self.counts.count(p)) >= th {
                hot.push(p);
            } else if self.counts.count(p) > 0 {
                keep.push(p);
            } else {
                self.is_candidate[p as usize] = false;
            }
        }
        hot.sort_by_key(|&p| (std::cmp::Reverse(self.counts.count(p)), p));
        let budget_pages = self.budget.next_interval();
        let promote_n = (hot.len() as u64).min(budget_pages);
        // Demote cold pages to make room for the promotions plus the reserve.
        let need = (promote_n + self.reserve).saturating_sub(budget.free(0));
        let mut moved = 0u64;
        if need > 0 && self.tiers > 1 {
            let counts = &self.counts;
            let max_scan = view.pages();
            let cold = self
                .hand
                .find(view, 0, need.min(budget_pages), max_scan, |p, _| {
                    bin_of(counts.count(p)) < th
                });
            for p in cold {
                let Some(dest) = (1..self.tiers)
                    .map(|d| d as TierId)
                    .find(|&d| budget.take(d, 1))
                else {
                    break;
                };
                budget.release(0, 1);
                moved += 1;
                out.migrations.push(Migration {
                    unit: Unit::page(p),
                    to: dest,
                    mechanism: Mechanism::StopAndCopy,
                    urgency: Urgency::Background,
                });
            }
        }
        let mut promoted = 0u64;
        for &p in &hot {
            if promoted >= promote_n || moved + promoted >= 2 * budget_pages {
                keep.push(p);
                continue;
            }
            if !budget.take(0, 1) {
                keep.push(p);
                continue;
            }
            budget.release(view.tier_of(p), 1);
            self.is_candidate[p as usize] = false;
            promoted += 1;
            out.migrations.push(Migration {
                unit: Unit::page(p),
                to: 0,
                mechanism: Mechanism::StopAndCopy,
                urgency: Urgency::Background,
            });
        }
        self.candidates = keep;
        out
    }

    fn export_state(&self) -> PolicyState {
        let max = f32::from((1u16 << (self.counts.max_bin().clamp(1, 16) - 1)).max(1));
        let mut hot_pages: Vec<(u64, f32)> = (0..self.counts.pages())
            .filter(|&p| self.counts.count(p) > 0)
            .map(|p| (p, (f32::from(self.counts.count(p)) / max).min(1.0)))
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
            self.counts
                .set(p, (heat.clamp(0.0, 1.0) * 16.0).round() as u16);
            if let Some(c) = self.is_candidate.get_mut(p as usize) {
                if !*c {
                    *c = true;
                    self.candidates.push(p);
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
        assert_eq!(m.count(51), 6, "cooling halves counts");
        assert_eq!(m.count(50), 2, "cooling halves counts");
    }

    /// Samples `from..to` (real sample numbers) of a skewed stream:
    /// pages 20-24 take three in four, pages 30-89 the rest (`light`), or
    /// pages 20-24 all of them (not `light`).
    fn skewed(from: usize, to: usize, light: bool) -> Vec<AccessSample> {
        (from..to)
            .map(|i| {
                if light && i % 4 == 0 {
                    sample(30 + (i / 4 % 60) as u64, 1)
                } else {
                    sample(20 + (i % 5) as u64, 1)
                }
            })
            .collect()
    }

    #[test]
    fn threshold_rises_only_at_the_adaptation_period_and_drops_by_one_after_cooling() {
        // Scale 1 (a modeled sample is a real one), Memtis-Default.
        let cfg = PolicyConfig::new(100, vec![10, 100]);
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        let caps = [10, 100];
        let mut k = 0;
        let mut tick = |m: &mut Memtis, s: &[AccessSample]| {
            let st = v.status(&caps);
            let d = m.tick(&obs(k, &st, s), &mut v);
            v.apply(&d.migrations);
            k += 1;
        };
        let a = ADAPTATION_PERIOD_SAMPLES as usize;
        tick(&mut m, &skewed(0, a - 1, true));
        let fit = m.counts.hot_threshold_bin(9);
        assert!(fit > 2, "the histogram asks for a high threshold ({fit})");
        assert_eq!(
            m.threshold_bin(),
            HOT_THRESHOLD_MIN,
            "not before sample 100,000"
        );
        tick(&mut m, &skewed(a - 1, a, true));
        assert_eq!(m.threshold_bin(), fit, "raised at sample 100,000");
        // Up to the cooling at sample 2,000,000: the light pages keep
        // their counts, so the threshold stays.
        let c = COOLING_PERIOD_SAMPLES as usize;
        for from in (a..c).step_by(a) {
            tick(&mut m, &skewed(from, from + a, false));
        }
        assert!(m.cooled, "sample 2,000,000 cooled");
        let lower = m.counts.hot_threshold_bin(9);
        assert!(lower < fit, "halved counts ask for less ({lower})");
        assert_eq!(m.threshold_bin(), fit, "a cooling alone moves nothing");
        // The next adaptation (2,100,000) after the cooling: down by one.
        tick(&mut m, &skewed(c, c + a, false));
        assert!(!m.cooled);
        assert_eq!(m.threshold_bin(), fit - 1, "one step down after a cooling");
    }

    #[test]
    fn quick_cool_never_adapts_its_threshold() {
        // 2,000 divides 100,000: every adaptation sample is a cooling
        // sample, which takes it (htmm_core.c l.1381, 1431).
        let cfg = PolicyConfig::new(100, vec![10, 100]);
        let mut m = Memtis::new(&cfg, QUICK_COOL_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        let st = v.status(&[10, 100]);
        let s = skewed(0, 3 * ADAPTATION_PERIOD_SAMPLES as usize, true);
        m.tick(&obs(0, &st, &s), &mut v);
        assert_eq!(m.threshold_bin(), HOT_THRESHOLD_MIN);
        // The same samples under Memtis-Default raise it.
        let mut d = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        d.tick(&obs(0, &st, &s), &mut v);
        assert!(d.threshold_bin() > HOT_THRESHOLD_MIN);
    }

    #[test]
    fn a_modeled_sample_covers_scale_real_samples() {
        // Scale 1,000: the 100th modeled sample is real sample 100,000.
        let mut cfg = PolicyConfig::new(100, vec![10, 100]);
        cfg.scale = 1000.0;
        let mut m = Memtis::new(&cfg, COOLING_PERIOD_SAMPLES);
        let mut v = VecView::two_tier(100, 10);
        let st = v.status(&[10, 100]);
        m.tick(&obs(0, &st, &skewed(0, 99, true)), &mut v);
        assert!(m.counts.hot_threshold_bin(9) > HOT_THRESHOLD_MIN);
        assert_eq!(m.threshold_bin(), HOT_THRESHOLD_MIN);
        m.tick(&obs(1, &st, &skewed(99, 100, true)), &mut v);
        assert!(m.threshold_bin() > HOT_THRESHOLD_MIN);
    }
}
