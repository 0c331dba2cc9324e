//! `mtm`: MTM (EuroSys'24) profiling and migration across N tiers.
//!
//! Profiling (§5): the address space is cut into regions (initially 2 MiB).
//! Each interval, each region's sampled pages have their accessed bit
//! scanned [`NUM_SCANS`] times; a region's hotness `HI` is the mean count
//! (0..=3). At the end of an interval, a region whose sampled counts differ
//! by more than `tau_s` ([`TAU_SPLIT`]) splits into two halves (samples
//! divided), adjacent regions whose `HI` differ by less than `tau_m`
//! ([`TAU_MERGE`]) merge (samples halved, the freed samples going to the
//! [`TOP_VARIANCE_REGIONS`] regions whose hotness changed most). The total
//! sample budget comes from the overhead target by MTM's Eq. 1; while there
//! are more regions than samples, `tau_m` is raised step by step.
//!
//! Policy (§6): `WHI = alpha * HI + (1 - alpha) * WHI_prev` (Eq. 2); one
//! ranking of all regions of all tiers; the hottest regions are placed
//! fastest-first ("fast promotion": straight to the fastest tier with room
//! left), regions of the lowest rank in a full tier are demoted one step
//! ("slow demotion"), at most [`MIGRATION_BUDGET_MB`] promoted (and at most
//! as much demoted) per interval.

use std::collections::HashSet;

use super::types::*;
use super::{Policy, PolicyKind};

/// Accessed-bit scans per sampled page per interval (`num_scans`, §5.1).
pub const NUM_SCANS: u32 = 3;
/// Merge threshold `tau_m = num_scans / 3` (§5.1).
pub const TAU_MERGE: f64 = NUM_SCANS as f64 / 3.0;
/// Split threshold `tau_s = 2 * num_scans / 3` (§5.1).
pub const TAU_SPLIT: f64 = 2.0 * NUM_SCANS as f64 / 3.0;
/// Profiling overhead target: 5% of execution time (§5.3, evaluation).
pub const OVERHEAD_TARGET: f64 = 0.05;
/// Profiling interval `t_mi` = 10 s (§8 settings).
pub const INTERVAL_NS: u64 = 10_000_000_000;
/// EMA weight alpha (Eq. 2, §6).
pub const EMA_ALPHA: f64 = 0.5;
/// Promotion budget per interval N = 200 MB (§6), i.e. 20 MB/s at the
/// 10 s interval; a configured shorter interval keeps the rate.
pub const MIGRATION_BUDGET_MB: f64 = 200.0;
/// Freed samples go to this many regions of highest hotness variance (§5.2).
pub const TOP_VARIANCE_REGIONS: usize = 5;
/// Initial region size: one last-level PDE = 2 MiB (§5.1).
pub const REGION_PAGES: u64 = PAGES_PER_2M as u64;
/// Cost of one sampled-page scan including the amortized hint fault. The
/// paper measures it offline and does not give it: ASSUMED 1 us.
pub const ONE_SCAN_OVERHEAD_NS: f64 = 1_000.0;
/// Step by which `tau_m` rises while regions exceed the sample budget. Not
/// given in the paper: ASSUMED a sixth of num_scans.
pub const TAU_MERGE_STEP: f64 = NUM_SCANS as f64 / 6.0;
/// Free pages kept in each non-slowest tier (0.4%, as for the others).
pub const FREE_RESERVE_FRACTION: f64 = 0.004;

/// The earliest first migration for a profiling interval of `interval`:
/// MTM picks its samples a third of an interval in, then scans for a whole
/// interval before it migrates.
pub fn first_migration_after(interval: std::time::Duration) -> std::time::Duration {
    interval.mul_f64(4.0 / 3.0)
}

/// MTM's Eq. 1: samples per interval for an overhead budget.
pub fn sample_budget(interval_ns: u64, overhead: f64, one_scan_ns: f64, num_scans: u32) -> f64 {
    interval_ns as f64 * overhead / (one_scan_ns * f64::from(num_scans))
}

/// A profiling region.
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    /// First page.
    pub start: u64,
    /// Pages.
    pub len: u64,
    /// Sampled pages per interval.
    pub samples: u32,
    /// Accessed counts of this interval's sampled pages.
    pub counts: Vec<u8>,
    /// This interval's sampled pages.
    pub sample_pages: Vec<u64>,
    /// Hotness of the last interval (0..=num_scans).
    pub hi: f64,
    /// Hotness of the interval before.
    pub hi_prev: f64,
    /// EMA hotness.
    pub whi: f64,
}

impl Region {
    fn new(start: u64, len: u64, samples: u32) -> Self {
        Self {
            start,
            len,
            samples: samples.max(1),
            counts: Vec::new(),
            sample_pages: Vec::new(),
            hi: 0.0,
            hi_prev: 0.0,
            whi: 0.0,
        }
    }
    fn variance(&self) -> f64 {
        (self.hi - self.hi_prev).powi(2)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut s = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    tiervm_guest::gen::rng::splitmix64(&mut s)
}

/// The `mtm` policy.
#[derive(Clone, Debug)]
pub struct Mtm {
    regions: Vec<Region>,
    unit: u64,
    tau_m: f64,
    tau_s: f64,
    num_ps: u64,
    budget: IntervalBudget,
    interval_ns: u64,
    scan_idx: u32,
    interval: u64,
    started: bool,
    caps: Vec<u64>,
    /// Fraction of each non-slowest tier kept free.
    reserve_fraction: f64,
    /// Splits and merges in the last interval.
    pub last_splits: u64,
    /// Merges in the last interval.
    pub last_merges: u64,
}

impl Mtm {
    /// MTM for `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        let unit = config.scaled_pages(REGION_PAGES as f64).max(1);
        let interval_ns = config.interval_ns.unwrap_or(INTERVAL_NS);
        // Eq. 1 with the measured cost of one scan where the host gives one
        // (live: a hint fault per touched probe), else the assumed 1 us.
        let one_scan_ns = config
            .accessed_test_cost_ns
            .filter(|c| c.is_finite() && *c > 0.0)
            .unwrap_or(ONE_SCAN_OVERHEAD_NS);
        let num_ps = config.scaled_pages(sample_budget(
            interval_ns,
            OVERHEAD_TARGET,
            one_scan_ns,
            NUM_SCANS,
        ));
        let mut regions = Vec::new();
        let mut start = 0;
        while start < config.pages {
            let len = unit.min(config.pages - start);
            regions.push(Region::new(start, len, 1));
            start += len;
        }
        // 200 MB per 10 s interval is a rate: a shorter interval moves less.
        let rate = config
            .promote_rate_limit_mbps
            .unwrap_or(MIGRATION_BUDGET_MB * 1e9 / INTERVAL_NS as f64)
            * interval_ns as f64
            / 1e9;
        Self {
            regions,
            unit,
            tau_m: TAU_MERGE,
            tau_s: TAU_SPLIT,
            num_ps,
            budget: IntervalBudget::new(config.mb_to_pages_f64(rate)),
            interval_ns,
            scan_idx: 0,
            interval: 0,
            started: false,
            caps: config.tier_capacity_pages.clone(),
            reserve_fraction: config.free_reserve_or(FREE_RESERVE_FRACTION),
            last_splits: 0,
            last_merges: 0,
        }
    }

    /// The current regions.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Sample budget per interval (Eq. 1, scaled).
    pub fn sample_budget(&self) -> u64 {
        self.num_ps
    }

    /// Samples over all regions (each region has at least one).
    pub fn total_samples(&self) -> u64 {
        self.regions.iter().map(|r| u64::from(r.samples)).sum()
    }

    /// Current merge and split thresholds.
    pub fn thresholds(&self) -> (f64, f64) {
        (self.tau_m, self.tau_s)
    }

    fn pick_samples(&mut self, view: &mut dyn MemoryView) {
        let interval = self.interval;
        for r in &mut self.regions {
            let n = u64::from(r.samples).min(r.len);
            // Distinct pages: a page drawn twice would read accessed at its
            // first test and not at its second, a spread that is not there.
            r.sample_pages = (0..n)
                .map(|k| r.start + mix(r.start ^ (interval << 40), k) % r.len)
                .collect();
            r.sample_pages.sort_unstable();
            r.sample_pages.dedup();
            r.counts = vec![0; r.sample_pages.len()];
            for &p in &r.sample_pages {
                view.test_and_clear_accessed(p);
            }
        }
    }

    fn scan(&mut self, view: &mut dyn MemoryView) {
        for r in &mut self.regions {
            for (c, &p) in r.counts.iter_mut().zip(&r.sample_pages) {
                if view.test_and_clear_accessed(p) {
                    *c += 1;
                }
            }
        }
    }

    /// End of interval. Public for tests that drive the profiler by hand.
    /// 1. Each region's hotness: the mean count of its samples, and its EMA.
    /// 2. Split regions whose samples differ by more than `tau_s`.
    /// 3. Merge chains of adjacent regions of similar hotness (`tau_m`).
    /// 4. Give the samples merging freed to the regions of highest variance.
    /// 5. Overhead control: more regions than samples raises `tau_m`.
    pub fn end_interval(&mut self) {
        self.update_hotness();
        let (split, splits) = self.split_regions();
        let (merged, merges, freed) = self.merge_regions(split);
        self.regions = merged;
        self.give_freed_samples(freed);
        self.adapt_thresholds();
        self.last_splits = splits;
        self.last_merges = merges;
        self.interval += 1;
    }

    /// Step 1.
    fn update_hotness(&mut self) {
        for r in &mut self.regions {
            r.hi_prev = r.hi;
            r.hi = if r.counts.is_empty() {
                0.0
            } else {
                r.counts.iter().map(|&c| f64::from(c)).sum::<f64>() / r.counts.len() as f64
            };
            r.whi = EMA_ALPHA * r.hi + (1.0 - EMA_ALPHA) * r.whi;
        }
    }

    /// Step 2: the regions after splitting, and how many split.
    fn split_regions(&mut self) -> (Vec<Region>, u64) {
        let mut splits = 0;
        let mut out = Vec::with_capacity(self.regions.len());
        for r in self.regions.drain(..) {
            let spread = match (r.counts.iter().max(), r.counts.iter().min()) {
                (Some(&mx), Some(&mn)) => f64::from(mx - mn),
                _ => 0.0,
            };
            let units = r.len / self.unit;
            if spread > self.tau_s && units >= 2 {
                let (a, b) = split_in_halves(r, (units / 2) * self.unit);
                out.push(a);
                out.push(b);
                splits += 1;
            } else {
                out.push(r);
            }
        }
        (out, splits)
    }

    /// Step 3: the regions after merging, how many merged, and the samples
    /// the merges freed.
    fn merge_regions(&self, regions: Vec<Region>) -> (Vec<Region>, u64, u32) {
        let mut merges = 0;
        let mut freed = 0u32;
        let mut merged: Vec<Region> = Vec::with_capacity(regions.len());
        for r in regions {
            if let Some(last) = merged.last_mut() {
                if (last.hi - r.hi).abs() < self.tau_m {
                    let total = last.len + r.len;
                    let both = last.samples + r.samples;
                    let kept = (both / 2).max(1);
                    freed += both - kept;
                    last.whi = (last.whi * last.len as f64 + r.whi * r.len as f64) / total as f64;
                    last.hi = (last.hi * last.len as f64 + r.hi * r.len as f64) / total as f64;
                    last.hi_prev =
                        (last.hi_prev * last.len as f64 + r.hi_prev * r.len as f64) / total as f64;
                    last.len = total;
                    last.samples = kept;
                    merges += 1;
                    continue;
                }
            }
            merged.push(r);
        }
        (merged, merges, freed)
    }

    /// Step 4: `freed` samples, one at a time, round-robin over the
    /// [`TOP_VARIANCE_REGIONS`] regions of highest hotness variance, as
    /// long as the total stays within Eq. 1's `num_ps` (§5.3: `num_ps` is
    /// the total of samples over all regions; samples freed beyond it are
    /// dropped, which is how a guest with more regions than `num_ps` comes
    /// back within the budget once its regions merge).
    fn give_freed_samples(&mut self, freed: u32) {
        let room = self.num_ps.saturating_sub(self.total_samples());
        let freed = u32::try_from(room).unwrap_or(u32::MAX).min(freed);
        if freed == 0 || self.regions.is_empty() {
            return;
        }
        let regions = &mut self.regions;
        let mut idx: Vec<usize> = (0..regions.len()).collect();
        idx.sort_by(|&a, &b| {
            regions[b]
                .variance()
                .total_cmp(&regions[a].variance())
                .then(a.cmp(&b))
        });
        let top = &idx[..TOP_VARIANCE_REGIONS.min(idx.len())];
        for k in 0..freed as usize {
            let r = &mut regions[top[k % top.len()]];
            r.samples = (r.samples + 1).min(u32::try_from(r.len).unwrap_or(u32::MAX));
        }
    }

    /// Step 5.
    fn adapt_thresholds(&mut self) {
        if self.regions.len() as u64 > self.num_ps {
            self.tau_m += TAU_MERGE_STEP;
            self.tau_s = self.tau_s.max(self.tau_m + TAU_MERGE_STEP);
        } else {
            self.tau_m = TAU_MERGE;
            self.tau_s = TAU_SPLIT;
        }
    }

    /// Migration at the end of an interval:
    /// 1. rank the regions hottest first and give each a target tier by
    ///    cumulative capacity (less a small free reserve);
    /// 2. for each region above zero hotness, while the interval's budget
    ///    lasts: make room in its target tier by demoting the coldest
    ///    regions one step down, then move its pages up.
    fn migrate(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        let n = obs.tiers.len();
        if n < 2 {
            return Decisions::none();
        }
        let reserve: Vec<u64> = self
            .caps
            .iter()
            .map(|&c| ((c as f64 * self.reserve_fraction) as u64).max(1))
            .collect();
        let (order, target) = self.rank_and_target(n, &reserve);
        let mut mover = Mover {
            out: Decisions::none(),
            budget: FreeBudget::from_tiers(obs.tiers),
            budget_pages: self.budget.next_interval(),
            reserve,
            cold_order: order.iter().rev().copied().collect(),
            cold_cursor: 0,
            rank: {
                let mut rank = vec![0; order.len()];
                for (place, &i) in order.iter().enumerate() {
                    rank[i] = place;
                }
                rank
            },
            demoted_pages: 0,
            promoted_pages: 0,
            moved_regions: HashSet::new(),
            tiers: n,
        };
        for &i in &order {
            if mover.promoted_pages >= mover.budget_pages || self.regions[i].whi <= 0.0 {
                break;
            }
            mover.promote(i, &self.regions, &target, view);
        }
        mover.out
    }

    /// Step 1 of [`Mtm::migrate`]: region indices hottest first, and each
    /// region's target tier.
    fn rank_and_target(&self, n: usize, reserve: &[u64]) -> (Vec<usize>, Vec<TierId>) {
        let mut order: Vec<usize> = (0..self.regions.len()).collect();
        order.sort_by(|&a, &b| {
            self.regions[b]
                .whi
                .total_cmp(&self.regions[a].whi)
                .then(a.cmp(&b))
        });
        let mut target = vec![(n - 1) as TierId; self.regions.len()];
        let (mut t, mut used) = (0usize, 0u64);
        for &i in &order {
            let len = self.regions[i].len;
            // A region that does not fit whole still targets the tier it
            // starts filling (its pages move as room and budget allow).
            while t < n - 1 && used >= self.caps[t].saturating_sub(reserve[t]) {
                t += 1;
                used = 0;
            }
            target[i] = t as TierId;
            used += len;
        }
        (order, target)
    }
}

/// Splits `r` at `left_len` pages; each half keeps the counts of the
/// samples that fall in it and half the samples (at least one).
fn split_in_halves(r: Region, left_len: u64) -> (Region, Region) {
    let (sl, sr) = (r.samples.div_ceil(2).max(1), (r.samples / 2).max(1));
    let mut a = Region::new(r.start, left_len, sl);
    let mut b = Region::new(r.start + left_len, r.len - left_len, sr);
    for x in [&mut a, &mut b] {
        x.hi = r.hi;
        x.hi_prev = r.hi_prev;
        x.whi = r.whi;
    }
    for (&p, &c) in r.sample_pages.iter().zip(&r.counts) {
        let x = if p < b.start { &mut a } else { &mut b };
        x.sample_pages.push(p);
        x.counts.push(c);
    }
    for x in [&mut a, &mut b] {
        if !x.counts.is_empty() {
            x.hi = x.counts.iter().map(|&c| f64::from(c)).sum::<f64>() / x.counts.len() as f64;
        }
    }
    (a, b)
}

/// Step 2 of [`Mtm::migrate`]: the decisions of one interval and what is
/// left of its budgets.
struct Mover {
    out: Decisions,
    budget: FreeBudget,
    /// Pages the interval may promote, and as many it may demote.
    budget_pages: u64,
    reserve: Vec<u64>,
    /// Region indices coldest first, and the next one to demote.
    cold_order: Vec<usize>,
    cold_cursor: usize,
    /// Each region's place in the ranking (0: hottest).
    rank: Vec<usize>,
    demoted_pages: u64,
    promoted_pages: u64,
    moved_regions: HashSet<usize>,
    tiers: usize,
}

impl Mover {
    /// Moves region `i`'s pages that sit below its target tier up (as many
    /// as the budget has left), after making room there.
    fn promote(
        &mut self,
        i: usize,
        regions: &[Region],
        target: &[TierId],
        view: &mut dyn MemoryView,
    ) {
        let dst = target[i];
        if self.moved_regions.contains(&i) {
            return; // demoted this interval to make room for a hotter one
        }
        let (start, len) = (regions[i].start, regions[i].len);
        let mut to_move: Vec<u64> = (start..start + len)
            .filter(|&p| view.tier_of(p) > dst)
            .collect();
        if to_move.is_empty() {
            return;
        }
        // A region larger than what is left of the budget moves in part
        // (the rest follows next interval).
        to_move.truncate((self.budget_pages - self.promoted_pages) as usize);
        let need = to_move.len() as u64;
        self.make_room(dst, need, i, regions, view);
        if self.budget.free(dst) < need {
            return;
        }
        self.move_runs(&to_move, dst, view);
        self.promoted_pages += need;
        self.moved_regions.insert(i);
    }

    /// Moves `pages` (sorted) to tier `to` in runs of consecutive pages,
    /// taking their room there and freeing it where they were.
    fn move_runs(&mut self, pages: &[u64], to: TierId, view: &dyn MemoryView) {
        for run in runs(pages, view) {
            let src = view.tier_of(run.page);
            self.budget.take(to, u64::from(run.pages));
            self.budget.release(src, u64::from(run.pages));
            self.out.migrations.push(Migration {
                unit: run,
                to,
                mechanism: Mechanism::StopAndCopy,
                urgency: Urgency::Background,
            });
        }
    }

    /// Demotes the coldest regions in `dst` one step down (to the first
    /// slower tier with room) until `dst` has `need` pages free plus its
    /// reserve, or the demotion budget is spent. Only regions ranked below
    /// region `hot` give up their room (MTM §6: the lowest-ranked regions
    /// of a full tier move down), whichever tier they target: a region too
    /// large for the room left in a tier targets that tier, but its pages
    /// beyond the room still make way for hotter regions.
    fn make_room(
        &mut self,
        dst: TierId,
        need: u64,
        hot: usize,
        regions: &[Region],
        view: &mut dyn MemoryView,
    ) {
        while self.budget.free(dst) < need + self.reserve[usize::from(dst)]
            && self.demoted_pages < self.budget_pages
        {
            let Some(&c) = self.cold_order.get(self.cold_cursor) else {
                break;
            };
            if self.rank[c] <= self.rank[hot] {
                break; // every region left is at least as hot as `hot`
            }
            self.cold_cursor += 1;
            if self.moved_regions.contains(&c) {
                continue;
            }
            let (cs, cl) = (regions[c].start, regions[c].len);
            let mut pages_in: Vec<u64> =
                (cs..cs + cl).filter(|&p| view.tier_of(p) == dst).collect();
            pages_in.truncate((self.budget_pages - self.demoted_pages) as usize);
            let Some(down) = ((usize::from(dst) + 1)..self.tiers)
                .map(|d| d as TierId)
                .find(|&d| self.budget.free(d) >= pages_in.len() as u64)
            else {
                continue;
            };
            self.move_runs(&pages_in, down, view);
            self.demoted_pages += pages_in.len() as u64;
            self.moved_regions.insert(c);
        }
    }
}

/// Coalesces sorted pages into runs of consecutive pages in the same tier.
fn runs(pages: &[u64], view: &dyn MemoryView) -> Vec<Unit> {
    let mut out: Vec<Unit> = Vec::new();
    let mut last_tier = None;
    for &p in pages {
        let t = view.tier_of(p);
        match out.last_mut() {
            Some(u)
                if u.page + u64::from(u.pages) == p
                    && last_tier == Some(t)
                    && u.pages < u32::MAX =>
            {
                u.pages += 1
            }
            _ => out.push(Unit::page(p)),
        }
        last_tier = Some(t);
    }
    out
}

impl Policy for Mtm {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Mtm
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            accessed_bits: true,
            ..TrackerRequest::none()
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        (self.interval_ns / u64::from(NUM_SCANS)).max(1)
    }

    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        if !self.started {
            self.started = true;
            self.pick_samples(view);
            return Decisions::none();
        }
        self.scan(view);
        self.scan_idx += 1;
        if self.scan_idx < NUM_SCANS {
            return Decisions::none();
        }
        self.scan_idx = 0;
        self.end_interval();
        let d = self.migrate(obs, view);
        self.pick_samples(view);
        d
    }

    fn export_state(&self) -> PolicyState {
        let mut hot_pages = Vec::new();
        for r in self.regions.iter().filter(|r| r.whi > 0.0) {
            let heat = (r.whi / f64::from(NUM_SCANS)) as f32;
            hot_pages.extend((r.start..r.start + r.len).map(|p| (p, heat)));
        }
        hot_pages.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        PolicyState {
            from: PolicyKind::Mtm,
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        let mut heat = vec![0f64; self.regions.len()];
        for &(p, h) in &state.hot_pages {
            if let Ok(i) = self.regions.binary_search_by(|r| {
                if p < r.start {
                    std::cmp::Ordering::Greater
                } else if p >= r.start + r.len {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Equal
                }
            }) {
                heat[i] += f64::from(h.clamp(0.0, 1.0)) * f64::from(NUM_SCANS);
            }
        }
        for (r, h) in self.regions.iter_mut().zip(heat) {
            r.whi = h / r.len as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// 8 regions of 4 pages each (scale 128: 512 / 128 = 4 pages per region).
    fn mtm() -> Mtm {
        let mut cfg = PolicyConfig::new(32, vec![8, 32]);
        cfg.scale = 128.0;
        Mtm::new(&cfg)
    }

    fn set_counts(m: &mut Mtm, counts: &[&[u8]]) {
        for (r, c) in m.regions.iter_mut().zip(counts) {
            r.counts = c.to_vec();
            r.sample_pages = (0..c.len() as u64).map(|k| r.start + k).collect();
        }
    }

    #[test]
    fn eq1_budget() {
        // 10 s * 5% / (1 us * 3) = 166,667 samples.
        assert_eq!(
            sample_budget(
                INTERVAL_NS,
                OVERHEAD_TARGET,
                ONE_SCAN_OVERHEAD_NS,
                NUM_SCANS
            )
            .round(),
            166_667.0
        );
    }

    #[test]
    fn merges_only_below_tau_m() {
        let mut m = mtm();
        assert_eq!(m.regions().len(), 8);
        // HI: 0.25, 0.75 (merge: diff < 1), 3, 2 (diff 1: no merge), 0, 1 (no),
        // 3, 3 (merge).
        set_counts(
            &mut m,
            &[
                &[1, 0, 0, 0],
                &[1, 1, 1, 0],
                &[3],
                &[2],
                &[0],
                &[1],
                &[3],
                &[3],
            ],
        );
        // HI of regions 0 and 1 are 0.25 and 0.75: they merge. Before:
        // HI 2 and 1, WHI 2 and 0.
        m.regions[0].whi = 2.0;
        m.regions[0].hi = 2.0;
        m.regions[1].hi = 1.0;
        m.end_interval();
        let starts: Vec<u64> = m.regions().iter().map(|r| r.start).collect();
        assert_eq!(starts, vec![0, 8, 12, 16, 20, 24], "{starts:?}");
        assert_eq!(m.last_merges, 2);
        let lens: Vec<u64> = m.regions().iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![8, 4, 4, 4, 4, 8]);
        // The merged region's HI, HI_prev and WHI: the pages' means.
        let r = &m.regions()[0];
        assert_eq!((r.hi, r.hi_prev), (0.5, 1.5));
        // 0.5 x 0.25 + 0.5 x 2 and 0.5 x 0.75 + 0.5 x 0.
        assert_eq!(r.whi, (1.125 + 0.375) / 2.0);
    }

    /// A merge keeps half the two regions' samples (at least one).
    #[test]
    fn a_merge_keeps_half_the_samples() {
        let mut m = mtm();
        m.num_ps = 0;
        for (r, samples) in m.regions.iter_mut().zip([2, 2, 3, 1, 1, 1, 4, 4]) {
            r.samples = samples;
        }
        set_counts(&mut m, &[&[0], &[0], &[3], &[3], &[0], &[3], &[0], &[0]]);
        m.end_interval();
        let samples: Vec<u32> = m.regions().iter().map(|r| r.samples).collect();
        assert_eq!(samples, vec![2, 2, 1, 1, 4]);
    }

    #[test]
    fn splits_only_above_tau_s() {
        let mut m = mtm();
        // Two merged regions of 2 units (8 pages) each, then two of 1 unit.
        let mk = |start: u64, len: u64, samples: &[u64], counts: &[u8]| {
            let mut r = Region::new(start, len, samples.len() as u32);
            r.sample_pages = samples.to_vec();
            r.counts = counts.to_vec();
            r
        };
        m.regions = vec![
            mk(0, 8, &[1, 5], &[0, 3]),    // spread 3 > 2: splits into HI 0 | HI 3
            mk(8, 8, &[9, 13], &[1, 3]),   // spread 2, not > 2: stays (HI 2)
            mk(16, 8, &[17, 21], &[0, 0]), // HI 0
            mk(24, 8, &[25, 29], &[3, 3]), // HI 3
        ];
        m.end_interval();
        let layout: Vec<(u64, u64)> = m.regions().iter().map(|r| (r.start, r.len)).collect();
        assert_eq!(m.last_splits, 1);
        // The HI-3 right half and the HI-2 region differ by exactly 1: no merge.
        assert_eq!(layout, vec![(0, 4), (4, 4), (8, 8), (16, 8), (24, 8)]);
        assert_eq!((m.regions()[0].samples, m.regions()[1].samples), (1, 1));
    }

    #[test]
    fn promotes_hot_regions_fastest_first_and_demotes_cold_ones() {
        let mut m = mtm();
        // Tier 0 holds pages 0..8 (regions 0 and 1); region 5 (pages 20..24) is hot.
        let mut v = VecView::two_tier(32, 8);
        for r in &mut m.regions {
            r.whi = 0.1;
        }
        m.regions[5].whi = 3.0;
        m.regions[0].whi = 0.0;
        let st = v.status(&[8, 32]);
        let d = m.migrate(&obs(0, &st, &[]), &mut v);
        v.apply(&d.migrations);
        assert!((20..24).all(|p| v.tier[p] == 0), "{:?}", d.migrations);
        assert!(
            (0..4).all(|p| v.tier[p] == 1),
            "coldest region demoted: {:?}",
            d.migrations
        );
    }

    /// A region larger than the room left in tier 0 targets tier 0 (it
    /// starts filling it), yet ranks below a hotter region on the slow
    /// tier: it gives up its tier-0 pages to that region. (Under the rule
    /// that only regions targeting a slower tier give up room, nothing
    /// moved at all: MTM stayed stuck with the WSS on CXL.)
    #[test]
    fn a_region_too_large_for_the_fast_tier_makes_way_for_a_hotter_one() {
        let mut m = mtm();
        // Region A: pages 0..28 (lukewarm, 8 of them in tier 0); region B:
        // pages 28..32 (hot, all slow). Tier 0 holds 8 pages, 7 above its
        // reserve: B fits with room left, so A targets tier 0 too.
        m.regions = vec![Region::new(0, 28, 1), Region::new(28, 4, 1)];
        m.regions[0].whi = 0.5;
        m.regions[1].whi = 3.0;
        let mut v = VecView::two_tier(32, 8);
        let st = v.status(&[8, 32]);
        let d = m.migrate(&obs(0, &st, &[]), &mut v);
        v.apply(&d.migrations);
        assert!(
            (28..32).all(|p| v.tier[p] == 0),
            "hot region in tier 0: {:?}",
            d.migrations
        );
        assert!(
            (0..8).filter(|&p| v.tier[p] == 1).count() >= 4,
            "the lukewarm region's tier-0 pages went down: {:?}",
            d.migrations
        );
    }

    /// Merges free samples; they go to the regions of highest variance
    /// only while the total stays within `num_ps` (§5.3).
    #[test]
    fn freed_samples_never_take_the_total_past_num_ps() {
        // 8 cold regions merge into one: 7 samples freed.
        let run = |num_ps: u64| {
            let mut m = mtm();
            m.num_ps = num_ps;
            set_counts(&mut m, &[&[0u8][..]; 8]);
            m.end_interval();
            (m.regions().len(), m.total_samples())
        };
        // Room for all of them: the 8 samples are kept.
        assert_eq!(run(8), (1, 8));
        assert_eq!(run(100), (1, 8));
        // Room for 2 more than the merged region's 1: 3 in all.
        assert_eq!(run(3), (1, 3));
        assert_eq!(run(1), (1, 1));
        // Four merges of pairs free 4 samples: room for 1 of them.
        let mut m = mtm();
        m.num_ps = 5;
        set_counts(&mut m, &[&[0], &[0], &[3], &[3], &[0], &[0], &[3], &[3]]);
        m.end_interval();
        assert_eq!(m.regions().len(), 4);
        assert_eq!(m.total_samples(), 5);
    }

    /// Eq. 1's budget, scaled to modeled pages, with the host's measured
    /// cost of one scan where it gives one, else the assumed 1 us; a cost
    /// that is no number or not positive is no measure.
    #[test]
    fn the_sample_budget_is_eq1_at_the_measured_scan_cost() {
        // 166,667 samples / scale 128 = 1302.
        assert_eq!(mtm().sample_budget(), 1302);
        let with_cost = |cost: Option<f64>| {
            let mut cfg = PolicyConfig::new(32, vec![8, 32]);
            cfg.scale = 128.0;
            cfg.accessed_test_cost_ns = cost;
            Mtm::new(&cfg).sample_budget()
        };
        // 2 us per scan: half as many samples.
        assert_eq!(with_cost(Some(2_000.0)), 651);
        for no_measure in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(with_cost(Some(no_measure)), 1302, "{no_measure}");
        }
    }

    /// Step 5 (§5.3): while there are more regions than samples, each
    /// interval raises `tau_m` by a step (a sixth of num_scans) and keeps
    /// `tau_s` a step above it; back within the budget, both return to
    /// their defaults.
    #[test]
    fn more_regions_than_samples_raise_tau_m_a_step_per_interval() {
        let mut m = mtm();
        assert_eq!(m.thresholds(), (TAU_MERGE, TAU_SPLIT));
        assert_eq!((TAU_MERGE, TAU_SPLIT, TAU_MERGE_STEP), (1.0, 2.0, 0.5));
        // HI 0, 3, 0, 3...: no two neighbours merge even at tau_m = 2.
        m.num_ps = 2;
        set_counts(&mut m, &[&[0], &[3], &[0], &[3], &[0], &[3], &[0], &[3]]);
        m.end_interval();
        assert_eq!(m.regions().len(), 8);
        assert_eq!(m.thresholds(), (1.5, 2.0));
        m.end_interval();
        assert_eq!(m.thresholds(), (2.0, 2.5));
        m.num_ps = 8;
        m.end_interval();
        assert_eq!(m.thresholds(), (TAU_MERGE, TAU_SPLIT));
    }

    /// Step 4 (§5.2): freed samples go to the regions whose hotness
    /// changed most since the last interval, `(HI - HI_prev)^2`.
    #[test]
    fn freed_samples_go_to_the_regions_whose_hotness_changed_most() {
        let mut m = mtm();
        // Regions 0 and 1 (HI 0) merge and free a sample; no other pair
        // merges. Every region's HI is as before but region 7's (3 -> 0)
        // and region 2's (2 -> 3).
        set_counts(&mut m, &[&[0], &[0], &[3], &[0], &[3], &[0], &[3], &[0]]);
        for (r, hi) in m
            .regions
            .iter_mut()
            .zip([0.0, 0.0, 2.0, 0.0, 3.0, 0.0, 3.0, 3.0])
        {
            r.hi = hi;
        }
        m.end_interval();
        let samples: Vec<u32> = m.regions().iter().map(|r| r.samples).collect();
        // Region 7 (now 6) changed by 3, region 2 (now 1) by 1.
        assert_eq!(samples, vec![1, 1, 1, 1, 1, 1, 2]);
    }

    /// The first tick picks each region's samples: distinct pages of the
    /// region, their accessed bits cleared (a scan counts accesses from
    /// then on), the other pages' bits left; the pick differs by region
    /// and by interval.
    #[test]
    fn samples_are_distinct_pages_of_their_region_drawn_anew_each_interval() {
        let mut m = mtm();
        for r in &mut m.regions {
            r.samples = 3;
        }
        let mut v = VecView::two_tier(32, 8);
        v.accessed = vec![true; 32];
        let st = v.status(&[8, 32]);
        assert!(m.tick(&obs(0, &st, &[]), &mut v).migrations.is_empty());
        let mut offsets = std::collections::BTreeSet::new();
        let mut sampled = 0;
        for r in m.regions() {
            assert!(!r.sample_pages.is_empty() && r.sample_pages.len() <= 3);
            assert!(r.sample_pages.windows(2).all(|w| w[0] < w[1]), "{r:?}");
            assert!(r
                .sample_pages
                .iter()
                .all(|&p| (r.start..r.start + r.len).contains(&p)));
            assert_eq!(r.counts, vec![0; r.sample_pages.len()]);
            offsets.extend(r.sample_pages.iter().map(|&p| p - r.start));
            sampled += r.sample_pages.len();
        }
        assert!(
            offsets.len() > 1,
            "every region sampled at the same offsets: {offsets:?}"
        );
        let first = &m.regions()[0];
        assert!(
            m.regions().iter().any(|r| r
                .sample_pages
                .iter()
                .zip(&first.sample_pages)
                .any(|(p, q)| p - r.start != *q)),
            "every region drew the same offsets"
        );
        assert_eq!(v.accessed.iter().filter(|&&a| !a).count(), sampled);
        // The next interval's draw (same regions) differs.
        let before: Vec<Vec<u64>> = m.regions().iter().map(|r| r.sample_pages.clone()).collect();
        // (An interval that merges nothing: HI 0, 3, 0, 3...)
        set_counts(&mut m, &[&[0], &[3], &[0], &[3], &[0], &[3], &[0], &[3]]);
        m.end_interval();
        assert_eq!(m.regions().len(), 8);
        m.pick_samples(&mut v);
        let after: Vec<Vec<u64>> = m.regions().iter().map(|r| r.sample_pages.clone()).collect();
        assert_ne!(before, after);
    }

    /// The sample draw's hash depends on both the region (and interval)
    /// and the draw's index, from 0 on: region 0's draws in interval 0
    /// are not all one page.
    #[test]
    fn the_sample_hash_depends_on_both_its_inputs() {
        let draws: std::collections::BTreeSet<u64> = (0..4).map(|k| mix(0, k)).collect();
        assert_eq!(draws.len(), 4);
        let regions: std::collections::BTreeSet<u64> = (0..4).map(|a| mix(a, 0)).collect();
        assert_eq!(regions.len(), 4);
        assert_ne!(mix(1, 2), mix(2, 1));
    }

    /// Each scan counts, per sample, whether its page was accessed since
    /// the last test; after `NUM_SCANS` scans the interval ends.
    #[test]
    fn scans_count_the_accessed_samples_and_the_interval_ends_after_num_scans() {
        let mut m = mtm();
        let mut v = VecView::two_tier(32, 8);
        let st = v.status(&[8, 32]);
        m.tick(&obs(0, &st, &[]), &mut v);
        let s0 = m.regions()[0].sample_pages[0];
        let s1 = m.regions()[1].sample_pages[0];
        for scan in 1..NUM_SCANS {
            v.accessed[s0 as usize] = true;
            v.accessed[s1 as usize] = scan == 1;
            m.tick(&obs(0, &st, &[]), &mut v);
            assert_eq!(m.regions()[0].counts, vec![scan as u8]);
        }
        assert_eq!(m.regions()[1].counts, vec![1]);
        assert!(m.regions()[2..].iter().all(|r| r.counts == vec![0]));
        // The last scan ends the interval: HI is the mean count (0..=3).
        v.accessed[s0 as usize] = true;
        m.tick(&obs(0, &st, &[]), &mut v);
        assert_eq!(m.regions()[0].hi, 3.0);
        assert_eq!(m.regions()[0].whi, 1.5);
    }

    /// Eq. 2: `WHI = alpha * HI + (1 - alpha) * WHI_prev`, alpha = 0.5.
    #[test]
    fn whi_is_the_moving_average_of_hi() {
        let mut m = mtm();
        let hot_and_cold = |m: &mut Mtm, hi: u8| {
            let cold = 3 - hi;
            set_counts(
                m,
                &[
                    &[hi],
                    &[cold],
                    &[hi],
                    &[cold],
                    &[hi],
                    &[cold],
                    &[hi],
                    &[cold],
                ],
            );
            m.end_interval();
            m.regions()[0].whi
        };
        assert_eq!(hot_and_cold(&mut m, 3), 1.5);
        assert_eq!(hot_and_cold(&mut m, 1), 0.5 + 0.75);
        assert_eq!(m.regions()[0].hi_prev, 3.0);
    }

    /// MTM places across N tiers: with three, a hot region in the slowest
    /// goes straight to the fastest with room ("fast promotion"), and a
    /// region of zero hotness stays where it is, room or not.
    #[test]
    fn on_three_tiers_a_hot_region_goes_straight_up_and_a_cold_one_stays() {
        let mut cfg = PolicyConfig::new(32, vec![16, 8, 32]);
        cfg.scale = 128.0;
        let mut m = Mtm::new(&cfg);
        // Pages 0-7 in tier 0 (8 free), 8-15 in tier 1, 16-31 in tier 2.
        let mut v = VecView::two_tier(32, 8);
        for p in 8..16 {
            v.tier[p] = 1;
        }
        for p in 16..32 {
            v.tier[p] = 2;
        }
        m.regions[6].whi = 3.0; // pages 24-27
        let st = v.status(&[16, 8, 32]);
        let d = m.migrate(&obs(0, &st, &[]), &mut v);
        assert_eq!(pages_moved_to(&d, 0), vec![24]);
        assert_eq!(d.migrations.len(), 1, "{:?}", d.migrations);
        assert_eq!(d.migrations[0].unit, Unit::run(24, 4));
    }

    /// Step 1 of the migration: regions hottest first, each targeting the
    /// fastest tier whose capacity less its reserve the hotter regions
    /// have not filled; the slowest tier takes the rest, full or not.
    #[test]
    fn regions_target_tiers_by_cumulative_capacity_hottest_first() {
        let mut cfg = PolicyConfig::new(32, vec![8, 8, 12]);
        cfg.scale = 128.0;
        let mut m = Mtm::new(&cfg);
        // Hotness 7, 6, ..., 0 for regions 7, 6, ..., 0.
        for (i, r) in m.regions.iter_mut().enumerate() {
            r.whi = i as f64;
        }
        let (order, target) = m.rank_and_target(3, &[1, 1, 1]);
        assert_eq!(order, vec![7, 6, 5, 4, 3, 2, 1, 0]);
        // 7 pages fit in tiers 0 and 1 (two regions each, the second
        // starting below 7), 11 in tier 2, which also takes what is left.
        assert_eq!(target, vec![2, 2, 2, 2, 1, 1, 0, 0]);
    }

    /// A split halves the samples: the left half the larger share.
    #[test]
    fn a_split_halves_the_samples() {
        let halves = |samples: u32| {
            let (a, b) = split_in_halves(Region::new(0, 8, samples), 4);
            (a.samples, b.samples, a.len, b.start, b.len)
        };
        assert_eq!(halves(5), (3, 2, 4, 4, 4));
        // Each half keeps its samples' counts; its HI is their mean.
        let mut r = Region::new(0, 8, 3);
        r.sample_pages = vec![1, 4, 6];
        r.counts = vec![0, 3, 1];
        let (a, b) = split_in_halves(r, 4);
        assert_eq!((a.sample_pages, a.counts, a.hi), (vec![1], vec![0], 0.0));
        assert_eq!(
            (b.sample_pages, b.counts, b.hi),
            (vec![4, 6], vec![3, 1], 2.0)
        );
        assert_eq!(halves(4), (2, 2, 4, 4, 4));
        assert_eq!(halves(1), (1, 1, 4, 4, 4));
    }

    /// A promotion moves only the region's pages below its target tier,
    /// as many as the interval's budget has left (the rest next interval),
    /// and into room that fits them exactly when nothing colder can make
    /// more.
    #[test]
    fn a_promotion_moves_the_slower_pages_within_the_budget_and_the_room() {
        let caps = [16, 32];
        let mut cfg = PolicyConfig::new(32, caps.to_vec());
        cfg.scale = 128.0;
        let run = |fast: u64, whi: &[(usize, f64)], budget: f64| {
            let mut m = Mtm::new(&cfg);
            m.budget = IntervalBudget::new(budget);
            for &(i, w) in whi {
                m.regions[i].whi = w;
            }
            let mut v = VecView::two_tier(32, fast);
            let st = v.status(&caps);
            let d = m.migrate(&obs(0, &st, &[]), &mut v);
            let moved: Vec<(Unit, TierId)> = d.migrations.iter().map(|x| (x.unit, x.to)).collect();
            moved
        };
        // Region 1 (pages 4-7) half fast: pages 6 and 7 move.
        assert_eq!(run(6, &[(1, 3.0)], 100.0), vec![(Unit::run(6, 2), 0)]);
        // A budget of 5 pages: region 5 whole, one page of region 6.
        assert_eq!(
            run(6, &[(5, 3.0), (6, 2.0)], 5.0),
            vec![(Unit::run(20, 4), 0), (Unit::run(24, 1), 0)]
        );
        // 4 pages free in tier 0, every region there hotter: region 7's
        // 4 pages fill them (the reserve cannot be made).
        assert_eq!(
            run(12, &[(0, 3.0), (1, 3.0), (2, 3.0), (7, 2.0)], 100.0),
            vec![(Unit::run(28, 4), 0)]
        );
    }

    /// Making room demotes the coldest regions of the target tier until it
    /// has the pages needed plus its reserve free, and no more.
    #[test]
    fn making_room_demotes_until_the_need_and_the_reserve_are_free() {
        let caps = [17, 32];
        let run = |reserve: f64| {
            let mut cfg = PolicyConfig::new(32, caps.to_vec());
            cfg.scale = 128.0;
            cfg.free_reserve_fraction = Some(reserve);
            let mut m = Mtm::new(&cfg);
            m.regions[7].whi = 3.0;
            // Regions 0-3 in tier 0, 1 page free.
            let mut v = VecView::two_tier(32, 16);
            let st = v.status(&caps);
            let d = m.migrate(&obs(0, &st, &[]), &mut v);
            (pages_moved_to(&d, 1), pages_moved_to(&d, 0))
        };
        // Reserve 1: 1 + 4 free covers 4 + 1.
        assert_eq!(run(0.0), (vec![12], vec![28]));
        // Reserve 3 (17 x 0.2): 5 free is short of 7, 9 is not.
        assert_eq!(run(0.2), (vec![12, 8], vec![28]));
        // A budget of 6 pages: region 3 (4 pages), then 2 of region 2's.
        let mut cfg = PolicyConfig::new(32, caps.to_vec());
        cfg.scale = 128.0;
        cfg.free_reserve_fraction = Some(0.2);
        let mut m = Mtm::new(&cfg);
        m.budget = IntervalBudget::new(6.0);
        m.regions[7].whi = 3.0;
        let mut v = VecView::two_tier(32, 16);
        let st = v.status(&caps);
        let d = m.migrate(&obs(0, &st, &[]), &mut v);
        let moved: Vec<(Unit, TierId)> = d.migrations.iter().map(|x| (x.unit, x.to)).collect();
        assert_eq!(
            moved,
            vec![
                (Unit::run(12, 4), 1),
                (Unit::run(8, 2), 1),
                (Unit::run(28, 4), 0)
            ]
        );
    }

    /// Moves go in runs of consecutive pages of one source tier.
    #[test]
    fn moves_coalesce_into_runs_of_consecutive_pages_of_one_tier() {
        let mut v = VecView::two_tier(16, 4);
        v.tier[6] = 0;
        let units = runs(&[2, 3, 4, 5, 6, 7, 9, 10], &v);
        assert_eq!(
            units,
            vec![
                Unit::run(2, 2),
                Unit::run(4, 2),
                Unit::page(6),
                Unit::page(7),
                Unit::run(9, 2)
            ]
        );
        assert!(runs(&[], &v).is_empty());
    }

    /// MTM asks for accessed bits only, and ticks `NUM_SCANS` times an
    /// interval: the first tick picks samples, each interval's last scan
    /// migrates.
    #[test]
    fn mtm_scans_num_scans_times_an_interval_and_migrates_at_its_end() {
        let m = mtm();
        let t = m.trackers();
        assert!(t.accessed_bits && !t.hardware_samples && !t.dirty_log);
        assert_eq!(m.tick_interval_ns(), INTERVAL_NS / u64::from(NUM_SCANS));
        let mut cfg = PolicyConfig::new(32, vec![8, 32]);
        cfg.interval_ns = Some(2);
        assert_eq!(Mtm::new(&cfg).tick_interval_ns(), 1, "at least 1 ns");
        // Region 6 (pages 24-27) touched at every scan: promoted at the
        // interval's end, not before.
        let mut m = mtm();
        let mut v = VecView::two_tier(32, 8);
        let st = v.status(&[8, 32]);
        assert!(m.tick(&obs(0, &st, &[]), &mut v).migrations.is_empty());
        for scan in 1..=NUM_SCANS {
            for p in 24..28 {
                v.accessed[p] = true;
            }
            let d = m.tick(&obs(0, &st, &[]), &mut v);
            assert_eq!(d.migrations.is_empty(), scan < NUM_SCANS, "scan {scan}");
        }
    }

    /// The exported state gives each page of a warm region its WHI over
    /// the most (`NUM_SCANS`), hottest first; imported, a region's WHI is
    /// its pages' heat over its length (clamped to 0..=1 each).
    #[test]
    fn state_exports_whi_per_page_and_imports_it_per_region() {
        let mut m = mtm();
        m.regions[2].whi = 1.5;
        m.regions[5].whi = 3.0;
        let st = m.export_state();
        assert_eq!(st.from, PolicyKind::Mtm);
        let expected: Vec<(u64, f32)> = (20..24)
            .map(|p| (p, 1.0))
            .chain((8..12).map(|p| (p, 0.5)))
            .collect();
        assert_eq!(st.hot_pages, expected);
        let mut n = mtm();
        n.import_state(&st);
        let whi: Vec<f64> = n.regions().iter().map(|r| r.whi).collect();
        assert_eq!(whi, vec![0.0, 0.0, 1.5, 0.0, 0.0, 3.0, 0.0, 0.0]);
        // Half a region's pages at heat 2 (clamped to 1), one out of range.
        let st = PolicyState {
            from: PolicyKind::Tpp,
            now_ns: 0,
            hot_pages: vec![(0, 2.0), (1, 2.0), (31, 0.5), (99, 1.0), (12, -1.0)],
        };
        let mut n = mtm();
        n.import_state(&st);
        let whi: Vec<f64> = n.regions().iter().map(|r| r.whi).collect();
        assert_eq!(whi, vec![1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.375]);
    }
}
