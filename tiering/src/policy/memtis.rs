//! `memtis`: Memtis (SOSP'23), 4 KiB pages only.
//!
//! - Access samples (PEBS in Memtis; sampled accesses here) feed per-page
//!   counts and a log2 histogram ([`super::hotness::SampleCounts`]). Loads
//!   are sampled one in [`SAMPLE_PERIOD`], stores one in
//!   [`STORE_SAMPLE_PERIOD`] (two PEBS events with their own periods).
//! - Cooling halves every count each [`COOLING_PERIOD_SAMPLES`] samples
//!   (Memtis-Default) or [`QUICK_COOL_PERIOD_SAMPLES`] (Memtis-QuickCool).
//! - The hot threshold is the lowest histogram bin such that every page at
//!   or above it fits in the fast tier.
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
    cooling_period: u64,
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
            cooling_period: config.scaled_pages(cooling_period_samples as f64),
            candidates: Vec::new(),
            is_candidate: vec![false; config.pages as usize],
            hand: ClockHand::default(),
            fast_capacity: fast,
            reserve: ((fast as f64 * FREE_RESERVE_FRACTION).round() as u64).max(1),
            budget: IntervalBudget::new(config.mb_to_pages_f64(rate * interval_ns as f64 / 1e9)),
            interval_ns,
            tiers: config.tiers(),
            threshold_bin: 1,
            quick_cool: cooling_period_samples == QUICK_COOL_PERIOD_SAMPLES,
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

    fn ingest(&mut self, samples: &[AccessSample]) {
        for s in samples {
            self.counts.add(s.page);
            if self.counts.samples_since_cooling() >= self.cooling_period {
                self.counts.cool();
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
        self.threshold_bin = self
            .counts
            .hot_threshold_bin(self.fast_capacity.saturating_sub(self.reserve));
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
}
