//! A hand-driven [`MemoryView`] for policy unit tests.

use super::types::*;

/// Page map with explicit tiers, shadows and accessed bits.
#[derive(Clone, Debug)]
pub struct VecView {
    pub tier: Vec<TierId>,
    pub shadow: Vec<bool>,
    pub accessed: Vec<bool>,
    /// What [`MemoryView::accessed_test_cost_ns`] reports.
    pub test_cost_ns: Option<f64>,
}

impl VecView {
    /// `pages` pages, the first `fast` in tier 0 and the rest in tier 1.
    pub fn two_tier(pages: u64, fast: u64) -> Self {
        let tier = (0..pages).map(|p| if p < fast { 0 } else { 1 }).collect();
        Self {
            tier,
            shadow: vec![false; pages as usize],
            accessed: vec![false; pages as usize],
            test_cost_ns: None,
        }
    }

    /// Applies migrations as an engine would (no capacity checks).
    pub fn apply(&mut self, migrations: &[Migration]) {
        for m in migrations {
            for p in m.unit.page..m.unit.page + u64::from(m.unit.pages) {
                self.tier[p as usize] = m.to;
            }
        }
    }

    /// Per-tier status given capacities.
    pub fn status(&self, caps: &[u64]) -> Vec<TierStatus> {
        caps.iter()
            .enumerate()
            .map(|(t, &cap)| {
                let used = self.tier.iter().filter(|&&x| usize::from(x) == t).count() as u64;
                TierStatus {
                    capacity_pages: cap,
                    free_pages: cap.saturating_sub(used),
                    shadow_pages: 0,
                    loaded_latency_ns: None,
                    request_rate: None,
                    unloaded_latency_ns: None,
                }
            })
            .collect()
    }
}

impl MemoryView for VecView {
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
            .unwrap_or(false)
            .then_some(1)
    }
    fn test_and_clear_accessed(&mut self, page: u64) -> bool {
        match self.accessed.get_mut(page as usize) {
            Some(a) => std::mem::replace(a, false),
            None => false,
        }
    }
    fn accessed_test_cost_ns(&self) -> Option<f64> {
        self.test_cost_ns
    }
}

/// An observation set with only tiers and a clock.
pub fn obs<'a>(
    now_ns: u64,
    tiers: &'a [TierStatus],
    samples: &'a [AccessSample],
) -> Observations<'a> {
    Observations {
        now_ns,
        tiers,
        samples,
        tpm_outcomes: &[],
        dirty: &[],
    }
}

/// An access sample of `page` in `tier`, a write if `write`.
pub fn sample(page: u64, tier: TierId, write: bool) -> AccessSample {
    AccessSample { page, tier, write }
}

/// The first pages of the units `d` moves to `tier`, in order.
pub fn pages_moved_to(d: &Decisions, tier: TierId) -> Vec<u64> {
    d.migrations
        .iter()
        .filter(|m| m.to == tier)
        .map(|m| m.unit.page)
        .collect()
}

/// A policy built by `build` for 1000 pages over tiers of 100 and 1000
/// (90 fast pages used) with a promotion limit of one page per second, its
/// view and the tiers' status.
pub fn one_page_per_second<P>(
    build: impl FnOnce(&PolicyConfig) -> P,
) -> (P, VecView, Vec<TierStatus>) {
    let mut cfg = PolicyConfig::new(1000, vec![100, 1000]);
    cfg.promote_rate_limit_mbps = Some(0.004); // 1 page/s
    let v = VecView::two_tier(1000, 90);
    let st = v.status(&[100, 1000]);
    (build(&cfg), v, st)
}
