//! Plain-data observations a policy reads and decisions it returns.
//!
//! Units: a *page* is a 4 KiB guest-physical page, named by its index from
//! the start of guest RAM. A [`Unit`] is a run of pages (one page, or 512
//! pages for a 2 MiB run). Tier 0 is the fastest tier; higher ids are slower.

use serde::{Deserialize, Serialize};

pub use crate::vocab::{Mechanism, TierId, Unit, PAGES_PER_2M, PAGE_SIZE};

/// When the migration must happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Urgency {
    /// In the fault path: the faulting access waits until the page moved.
    BeforeFaultingAccessResumes,
    /// In the background (a migration thread); the guest keeps running.
    Background,
}

/// One decision: move `unit` to tier `to` with `mechanism`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// Pages to move.
    pub unit: Unit,
    /// Destination tier.
    pub to: TierId,
    /// Mechanism to use.
    pub mechanism: Mechanism,
    /// Fault path or background.
    pub urgency: Urgency,
}

impl Migration {
    /// Whether this migration moves towards a faster tier than `from`.
    pub fn is_promotion_from(&self, from: TierId) -> bool {
        self.to < from
    }
}

/// What a policy asks the engine to do after a tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    /// Migrations, in the order the policy wants them done.
    pub migrations: Vec<Migration>,
    /// Shadows to drop, per tier (`(tier, pages)`), to relieve pressure there.
    /// The mechanism picks which shadows (oldest first).
    pub reclaim_shadows: Vec<(TierId, u64)>,
}

impl Decisions {
    /// No action.
    pub fn none() -> Self {
        Self::default()
    }
}

/// A NUMA-hint-style fault on a protected page.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HintFault {
    /// Faulting page.
    pub page: u64,
    /// Tier the page sits in.
    pub tier: TierId,
    /// Nanoseconds from the scan that protected the page to this fault
    /// (Linux's `numa_hint_fault_latency`).
    pub time_to_fault_ns: u64,
    /// The faulting access is a write.
    pub write: bool,
    /// Clock at the fault.
    pub now_ns: u64,
    /// The CPU that took the fault, whose per-CPU state the fault path
    /// uses (5.13 `tpp-lru`'s activation pagevec). The simulator runs
    /// thread `i` on CPU `i` (docs/simulator.md, "Threads and CPUs"); the
    /// live engine passes the faulting thread's id (a vCPU thread under
    /// KVM; 0 if unknown).
    #[serde(default)]
    pub cpu: u32,
}

/// One sampled access (PEBS-like; in a VM, sampled hint faults stand in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessSample {
    /// Accessed page.
    pub page: u64,
    /// Tier it sits in.
    pub tier: TierId,
    /// The access is a store.
    pub write: bool,
}

/// Outcome of a transactional migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpmOutcome {
    /// The page.
    pub page: u64,
    /// `true` = committed; `false` = aborted (written during the copy).
    pub committed: bool,
}

/// Per-tier state at tick time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierStatus {
    /// Capacity in pages available to this VM.
    pub capacity_pages: u64,
    /// Free pages (not holding a master copy or a shadow).
    pub free_pages: u64,
    /// Pages holding shadows (reclaimable).
    pub shadow_pages: u64,
    /// Average loaded read latency over the last interval, if measured.
    pub loaded_latency_ns: Option<f64>,
    /// Requests per second to this tier over the last interval, if measured.
    pub request_rate: Option<f64>,
    /// The tier's latency without load, ns, if known: live, measured at
    /// engine start (a pointer chase on the tier's NUMA node) or emulated;
    /// in the simulator, the tier model's.
    #[serde(default)]
    pub unloaded_latency_ns: Option<f64>,
}

/// Everything a policy observes at a tick (besides the [`MemoryView`]).
#[derive(Clone, Copy, Debug)]
pub struct Observations<'a> {
    /// Clock in nanoseconds.
    pub now_ns: u64,
    /// Per-tier status, indexed by tier id.
    pub tiers: &'a [TierStatus],
    /// Access samples since the last tick (if requested).
    pub samples: &'a [AccessSample],
    /// Transactional-migration outcomes since the last tick.
    pub tpm_outcomes: &'a [TpmOutcome],
    /// Pages found dirty since the last tick (if requested).
    pub dirty: &'a [u64],
}

/// The per-page state a policy can query and the accessed-bit tracker.
///
/// The simulator implements this over its page map; the live engine over the
/// tiered backing memory and its trackers.
pub trait MemoryView {
    /// Number of guest pages.
    fn pages(&self) -> u64;
    /// Tier holding the page's master copy.
    fn tier_of(&self, page: u64) -> TierId;
    /// The slower tier holding the page's clean shadow, if it has one.
    fn shadow_tier(&self, page: u64) -> Option<TierId>;
    /// Whether the page still has a clean shadow in a slower tier.
    fn has_shadow(&self, page: u64) -> bool {
        self.shadow_tier(page).is_some()
    }
    /// Reads and clears the page's accessed bit (accessed since the last call).
    fn test_and_clear_accessed(&mut self, page: u64) -> bool;
    /// What one [`Self::test_and_clear_accessed`] that finds the page
    /// touched has cost the guest so far in this run, ns, where it was
    /// measured (live: the hint faults' mean stall in the fault handler
    /// times the guest cost factor, `tiering::mem::GUEST_COST_FACTOR` or the
    /// run's own `--tracking-ab` figure); `None` where it was not (the
    /// simulator, or too few hint faults yet): policies then budget with
    /// [`PolicyConfig::accessed_test_cost_ns`] or their own assumed cost.
    fn accessed_test_cost_ns(&self) -> Option<f64> {
        None
    }
}

/// Which trackers a policy needs the engine to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackerRequest {
    /// Protect pages of these tiers for hint faults (empty = no hint faults).
    pub hint_fault_tiers: Vec<TierId>,
    /// Hint-fault scan rate in pages per second (real pages, before scaling).
    pub hint_scan_pages_per_sec: f64,
    /// Take one access sample every this many accesses (0 = no sampling).
    pub sample_period: u64,
    /// With `hardware_samples`, stores are a PEBS event of their own,
    /// sampled once every this many stores, while `sample_period` counts
    /// loads (Memtis opens `ALL_STORES` with `htmm_inst_sample_period`).
    /// 0: a store counts toward `sample_period` like a load. The live
    /// engine, whose samples come from hint faults, ignores this.
    #[serde(default)]
    pub store_sample_period: u64,
    /// The samples stand for the CPU's PEBS sampling, as in the policy's
    /// paper (Memtis; Colloid on HeMem/Memtis): the simulator then applies
    /// the platform's PEBS blind spots (`Scenario::pebs_blind_to_slow_loads`).
    /// Live samples come from hint faults and have none; the live engine
    /// ignores this.
    #[serde(default)]
    pub hardware_samples: bool,
    /// Report dirty pages at each tick.
    pub dirty_log: bool,
    /// [`MemoryView::test_and_clear_accessed`] must see every access since
    /// the page's last test (MTM's accessed-bit scans). Live, without idle
    /// page tracking, each tested page is armed as a probe that hint-faults
    /// once on its next touch.
    pub accessed_bits: bool,
    /// The policy maps and migrates 2 MiB pages ([`PolicyConfig::huge_pages`]):
    /// the simulator charges one TLB shootdown per 2 MiB moved (not per
    /// 4 KiB) and holds the page for a 2 MiB copy. Live, `memtis` asks
    /// for it under [`PolicyConfig::transparent_huge_pages`]; the live
    /// engine does not act on it (its movers take the policy's units as
    /// they come, and guest RAM is mapped in 2 MiB ranges anyway).
    #[serde(default)]
    pub huge_pages: bool,
}

impl TrackerRequest {
    /// No tracking at all.
    pub fn none() -> Self {
        Self {
            hint_fault_tiers: Vec::new(),
            hint_scan_pages_per_sec: 0.0,
            sample_period: 0,
            store_sample_period: 0,
            hardware_samples: false,
            dirty_log: false,
            accessed_bits: false,
            huge_pages: false,
        }
    }
}

/// A policy-neutral hotness snapshot, for switching policies at run time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    /// The policy that exported the state.
    pub from: super::PolicyKind,
    /// Clock at export.
    pub now_ns: u64,
    /// Pages believed hot, with a heat in [0, 1] (1 = hottest), hottest first.
    pub hot_pages: Vec<(u64, f32)>,
}

/// The mode a policy is in and why, for reports and the live line
/// (policies that have modes: `adaptive`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyMode {
    /// Short name (`promote`, `balance`, `throttled: thrashing`, ...).
    pub mode: String,
    /// Why, with the numbers that decided it.
    pub why: String,
}

/// Construction-time configuration shared by all policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyConfig {
    /// Guest pages.
    pub pages: u64,
    /// Capacity of each tier in pages, fastest first.
    pub tier_capacity_pages: Vec<u64>,
    /// Real pages one modeled page stands for (1 live; N in a scaled
    /// simulation). Constants that count pages or bytes in total (rate
    /// limits, cooling periods, sample budgets) are divided by it.
    pub scale: f64,
    /// Overrides the policy's promotion rate limit (MB/s, real units).
    pub promote_rate_limit_mbps: Option<f64>,
    /// Overrides the policy's migration interval (ns).
    pub interval_ns: Option<u64>,
    /// Measured cost to the guest of one accessed-bit test that finds the
    /// page touched (live: one hint fault). Policies that budget their
    /// profiling (MTM's Eq. 1) use it instead of their assumed cost.
    pub accessed_test_cost_ns: Option<f64>,
    /// The system under test maps the workload's memory with 2 MiB pages
    /// and tracks and migrates those where its paper does: HeMem, the base
    /// of Colloid's evaluation, manages 2 MiB pages (`PAGE_SIZE =
    /// HUGEPAGE_SIZE`, hemem.h; Colloid §5). Policies modeling such a
    /// system (`colloid`, `colloid-base`) then count samples and move pages
    /// per 2 MiB; the others ignore it. Off (4 KiB) unless a scenario sets
    /// it; the live engine leaves it off.
    #[serde(default)]
    pub huge_pages: bool,
    /// Transparent huge pages are on (`enabled = always`), as every Memtis
    /// setup in the seeds runs them (Nomad's Memtis scripts set
    /// `thp_setting=always`; Memtis is built around them): `memtis` and
    /// `memtis-quickcool` then count samples and move pages per 2 MiB
    /// ([`Grain`]); the others ignore it. The simulator sets it; the live
    /// engine sets it when guest RAM is backed by 2 MiB ranges (the
    /// default), which is what THP gives a process.
    #[serde(default)]
    pub transparent_huge_pages: bool,
    /// Overrides the free fraction of a tier that policies without a
    /// watermark of their own keep (`memtis`, `colloid`, `mtm`, `adaptive`:
    /// 0.4%, borrowed from Linux's watermarks, not from their papers). For
    /// sensitivity runs (`tiervm sim --free-reserve-bp`); `None` keeps each
    /// policy's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_reserve_fraction: Option<f64>,
    /// The dirty log that a transactional migration needs costs the guest
    /// beyond the pages in flight: live under KVM, where switching logging
    /// on for a memslot segment (64 MiB) makes KVM map it with 4 KiB pages
    /// and every harvest write-protects the pages it re-arms, for as long
    /// as a transaction or a shadow lives in the segment. MEASURED here
    /// (docs/results.md §13, "TPM's dirty log"): at the same promotion
    /// rate, TPM cost the guest 8-20% more throughput than stop-and-copy.
    /// `adaptive` then promotes by stop-and-copy ([`Mechanism`] choice);
    /// the paper baselines keep their own mechanisms. Off in the
    /// simulator, whose TPM model charges per page.
    #[serde(default)]
    pub dirty_log_costly: bool,
    /// Guest memory is mapped in 2 MiB pages, and moving a 4 KiB page out
    /// of a 2 MiB range that sits whole in one tier costs the guest that
    /// range's huge mapping (live: the range is split into 4 KiB pages in
    /// the host and in KVM, and stays split while its pages are in two
    /// tiers), as Linux splits a THP to migrate part of it. MEASURED here
    /// (docs/results.md §13, "whole ranges"): with scattered hot pages,
    /// `adaptive` moving single pages out of whole ranges gained nothing
    /// in 30 s runs, moving the ranges whole gained 1.08-1.36x. `adaptive`
    /// then promotes such a range whole; the paper baselines keep their
    /// own units. Off in the simulator, which does not model the cost of
    /// a split mapping.
    #[serde(default)]
    pub huge_split_costly: bool,
}

impl PolicyConfig {
    /// A config for `pages` guest pages over tiers of the given capacities, unscaled.
    pub fn new(pages: u64, tier_capacity_pages: Vec<u64>) -> Self {
        Self {
            pages,
            tier_capacity_pages,
            scale: 1.0,
            promote_rate_limit_mbps: None,
            interval_ns: None,
            accessed_test_cost_ns: None,
            huge_pages: false,
            transparent_huge_pages: false,
            free_reserve_fraction: None,
            dirty_log_costly: false,
            huge_split_costly: false,
        }
    }

    /// The free fraction a policy without its own watermark keeps: the
    /// override if set (and in `0..1`), else `default`.
    pub fn free_reserve_or(&self, default: f64) -> f64 {
        match self.free_reserve_fraction {
            Some(f) if (0.0..1.0).contains(&f) => f,
            _ => default,
        }
    }

    /// Number of tiers.
    pub fn tiers(&self) -> usize {
        self.tier_capacity_pages.len()
    }

    /// Real pages per modeled page, at least 1 (a nonsense scale counts as 1).
    pub fn scale_at_least_one(&self) -> f64 {
        if self.scale.is_finite() && self.scale >= 1.0 {
            self.scale
        } else {
            1.0
        }
    }

    /// Modeled pages per 2 MiB page: `512 / scale`, 1..=512 (at scale >=
    /// 512 one modeled page holds `scale / 512` 2 MiB pages of equal heat).
    pub fn pages_per_2m(&self) -> u64 {
        let huge = u64::from(PAGES_PER_2M);
        ((huge as f64 / self.scale_at_least_one()).round() as u64).clamp(1, huge)
    }

    /// The modeled sample period that gives a tracked 2 MiB page the
    /// samples a real one gets at `real_period`, one at a time: a modeled
    /// page has one real page's access rate, so `real_period x
    /// pages_per_2m / 512`, at least 1.
    pub fn huge_page_sample_period(&self, real_period: u64) -> u64 {
        ((real_period * self.pages_per_2m()) as f64 / f64::from(PAGES_PER_2M))
            .round()
            .max(1.0) as u64
    }

    /// `real_pages` (a page count from a paper) in modeled pages (at least 1).
    pub fn scaled_pages(&self, real_pages: f64) -> u64 {
        let s = if self.scale.is_finite() && self.scale > 0.0 {
            self.scale
        } else {
            1.0
        };
        ((real_pages / s).round() as u64).max(1)
    }

    /// Megabytes in real units to modeled pages, unrounded.
    pub fn mb_to_pages_f64(&self, mb: f64) -> f64 {
        let s = if self.scale.is_finite() && self.scale > 0.0 {
            self.scale
        } else {
            1.0
        };
        (mb * 1024.0 * 1024.0 / PAGE_SIZE as f64 / s).max(0.0)
    }

    /// Megabytes in real units to modeled pages.
    pub fn mb_to_pages(&self, mb: f64) -> u64 {
        self.scaled_pages(mb * 1024.0 * 1024.0 / PAGE_SIZE as f64)
    }
}

/// What a sampling policy (`colloid`, `memtis`) counts and moves: a tracked
/// page of `unit_pages` modeled pages, one base page or one 2 MiB page.
///
/// A modeled page stands for `scale` real 4 KiB pages with one real page's
/// access rate, so a 2 MiB page is `512 / scale` modeled pages (at least 1;
/// at scale >= 512 one modeled page holds `scale / 512` huge pages of equal
/// heat, and its count is one of theirs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grain {
    /// Modeled pages per tracked page (1..=512).
    pub unit_pages: u64,
    /// The tracked page is a 2 MiB mapping.
    pub huge: bool,
}

impl Grain {
    /// 2 MiB pages ([`PolicyConfig::pages_per_2m`] modeled pages each) if
    /// `huge`, else single modeled pages.
    pub fn new(config: &PolicyConfig, huge: bool) -> Self {
        Self {
            unit_pages: if huge { config.pages_per_2m() } else { 1 },
            huge,
        }
    }

    /// The modeled sample period for a policy's real `period`: at the
    /// 2 MiB grain the one that gives a tracked page the samples of a real
    /// huge page ([`PolicyConfig::huge_page_sample_period`]), else `period`.
    pub fn sample_period(&self, config: &PolicyConfig, period: u64) -> u64 {
        if self.huge {
            config.huge_page_sample_period(period)
        } else {
            period
        }
    }
}

/// Tracks free pages per tier while a policy builds its decision list, so
/// it never asks for more pages than a destination has free. Decisions run
/// in order, so pages freed by an earlier migration in the list may be
/// used by a later one ([`FreeBudget::release`]); shadow demotions need no
/// destination page (the shadow is already there).
#[derive(Clone, Debug)]
pub struct FreeBudget {
    free: Vec<u64>,
}

impl FreeBudget {
    /// From the tick's tier status.
    pub fn from_tiers(tiers: &[TierStatus]) -> Self {
        Self {
            free: tiers.iter().map(|t| t.free_pages).collect(),
        }
    }

    /// Free pages left in `tier`.
    pub fn free(&self, tier: TierId) -> u64 {
        self.free.get(usize::from(tier)).copied().unwrap_or(0)
    }

    /// Reserves `pages` in `tier`; false (and nothing reserved) if they do not fit.
    pub fn take(&mut self, tier: TierId, pages: u64) -> bool {
        match self.free.get_mut(usize::from(tier)) {
            Some(f) if *f >= pages => {
                *f -= pages;
                true
            }
            _ => false,
        }
    }

    /// Returns `pages` to `tier` (a demotion earlier in the same decision
    /// list frees its source pages before later migrations run).
    pub fn release(&mut self, tier: TierId, pages: u64) {
        if let Some(f) = self.free.get_mut(usize::from(tier)) {
            *f += pages;
        }
    }
}

/// A per-interval page budget that may be fractional (a rate limit scaled
/// down by the simulator): each interval grants the whole pages of
/// `per_interval` plus the fraction left over from earlier intervals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IntervalBudget {
    per_interval: f64,
    carry: f64,
}

impl IntervalBudget {
    /// `per_interval` pages per interval.
    pub fn new(per_interval: f64) -> Self {
        Self {
            per_interval: per_interval.max(0.0),
            carry: 0.0,
        }
    }

    /// The pages granted for the next interval.
    pub fn next_interval(&mut self) -> u64 {
        let total = self.per_interval + self.carry;
        let whole = total.floor();
        self.carry = total - whole;
        whole as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view of pages all on tier 0, with page 1 shadowed on tier 1, that
    /// keeps the trait's defaults.
    struct Plain;

    impl MemoryView for Plain {
        fn pages(&self) -> u64 {
            4
        }
        fn tier_of(&self, _: u64) -> TierId {
            0
        }
        fn shadow_tier(&self, page: u64) -> Option<TierId> {
            (page == 1).then_some(1)
        }
        fn test_and_clear_accessed(&mut self, _: u64) -> bool {
            false
        }
    }

    #[test]
    fn a_views_defaults_read_its_shadows_and_claim_no_measured_cost() {
        let v = Plain;
        assert!(v.has_shadow(1));
        assert!(!v.has_shadow(2));
        assert_eq!(v.accessed_test_cost_ns(), None);
    }

    #[test]
    fn a_promotion_moves_to_a_faster_tier_than_the_source() {
        let to = |to: TierId| Migration {
            unit: Unit::page(0),
            to,
            mechanism: Mechanism::StopAndCopy,
            urgency: Urgency::Background,
        };
        assert!(to(0).is_promotion_from(1));
        assert!(!to(1).is_promotion_from(1));
        assert!(!to(2).is_promotion_from(1));
    }

    /// A fractional rate limit grants whole pages, the fraction carried.
    #[test]
    fn an_interval_budget_carries_its_fraction() {
        let mut b = IntervalBudget::new(2.5);
        let got: Vec<u64> = (0..4).map(|_| b.next_interval()).collect();
        assert_eq!(got, [2, 3, 2, 3]);
        let mut b = IntervalBudget::new(0.25);
        let got: Vec<u64> = (0..8).map(|_| b.next_interval()).collect();
        assert_eq!(got, [0, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(IntervalBudget::new(-1.0).next_interval(), 0);
    }

    #[test]
    fn config_overrides_out_of_range_fall_back() {
        let mut c = PolicyConfig::new(8, vec![4, 8]);
        let reserve = |c: &PolicyConfig| c.free_reserve_or(0.004);
        assert_eq!(reserve(&c), 0.004);
        for (set, want) in [(0.0, 0.0), (0.01, 0.01), (1.0, 0.004), (-0.1, 0.004)] {
            c.free_reserve_fraction = Some(set);
            assert_eq!(reserve(&c), want, "{set}");
        }
        for (scale, want) in [
            (4.0, 4.0),
            (0.5, 1.0),
            (f64::NAN, 1.0),
            (f64::INFINITY, 1.0),
        ] {
            c.scale = scale;
            assert_eq!(c.scale_at_least_one(), want, "{scale}");
        }
        // A paper's page counts in modeled pages: a nonsense scale (0,
        // negative, not finite) counts as 1.
        for (scale, pages, per_mb) in [
            (4.0, 25, 64.0),
            (0.0, 100, 256.0),
            (-2.0, 100, 256.0),
            (f64::INFINITY, 100, 256.0),
        ] {
            c.scale = scale;
            assert_eq!(c.scaled_pages(100.0), pages, "{scale}");
            assert_eq!(c.mb_to_pages_f64(1.0), per_mb, "{scale}");
        }
    }
}
