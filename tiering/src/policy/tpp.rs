//! `tpp`: Linux 6.3 NUMA-balancing memory tiering (TPP upstream).
//!
//! - Slow-tier pages are protected by the hint-fault scanner. On a hint
//!   fault, `should_numa_migrate_memory()` decides: promote at once if the
//!   top tier has plenty of free space (`pgdat_free_space_enough`); else the
//!   page is hot if its hint-fault latency (time from scan to fault) is
//!   below the threshold, which `numa_promotion_adjust_threshold()` moves in
//!   16 steps so that candidates match the promotion rate limit; and the
//!   promotion rate limit must not be exceeded.
//! - Upstream 6.3 promotes at the first qualifying fault. The TPP patch the
//!   Nomad paper ran as its baseline (TPP, ASPLOS'23; Nomad §2.2; the
//!   artifact's `tpp.patch` on 5.13-rc6) has no threshold or rate limit
//!   (`should_numa_migrate_memory` returns true for a slow-node page in
//!   tiering mode, tpp.patch l.611-616) but promotes only pages on the
//!   active LRU, and its kswapd keeps [`DEMOTE_SCALE_FACTOR`] of the top
//!   tier free. That variant is `tpp-lru` ([`Tpp::with_active_lru_check`]);
//!   its fault path is [`Tpp::on_hint_fault`]'s "refault train" below.
//!
//! The 5.13 fault path of `tpp-lru`, step by step (Nomad artifact
//! github.com/lingfenghsiang/Nomad at 0fafe0e; tpp.patch is
//! `src/implementation_patches/tpp.patch`, its memory.c line numbers are
//! those of `src/linux-5.13-rc6/mm/memory.c` with the patch applied; swap.c
//! and pagevec.h are the unpatched tree's, which tpp.patch leaves alone):
//! 1. a hint fault on a page of a non-top-tier node that is not
//!    `PageActive` calls `mark_page_accessed(page)` and `goto out`
//!    (tpp.patch l.879-889; memory.c l.4197-4207);
//! 2. `out:` only calls `task_numa_fault` and returns (memory.c
//!    l.4232-4235); only `out_map:` makes the PTE present again
//!    (l.4236-4249, `pte_modify` at l.4242). So the page stays PROT_NONE
//!    and the access that faulted faults again at once;
//! 3. `mark_page_accessed` (swap.c l.424-452) sets `PG_referenced` on a
//!    page without it (l.428-429); on a referenced inactive page it calls
//!    `activate_page` and clears `PG_referenced` (l.439-447). So every
//!    second fault of the train queues one request;
//! 4. `activate_page` (swap.c l.350-364) adds the page to this CPU's
//!    `lru_pvecs.activate_page` pagevec (`lru_pvecs` is a per-CPU
//!    variable, l.62-74; `this_cpu_ptr` at l.357: the CPU running
//!    `mark_page_accessed`, i.e. the faulting thread's) and drains it only
//!    when `pagevec_add_and_need_flush` says so (l.240-249): when the add
//!    fills it (`PAGEVEC_SIZE` 15, include/linux/pagevec.h l.15), for a
//!    compound page, or while the LRU caches are disabled. The page is
//!    still inactive while queued, so the train queues it again and again
//!    (the papers' "the 15 requests could be repeated requests for the
//!    same page", Matryoshka §3.1 fn. 2); the drain (`__activate_page`,
//!    l.320-334) sets `PageActive`. The model keeps one pagevec per CPU
//!    ([`HintFault::cpu`]; [`ActivatePagevec`]). The other drains of a
//!    CPU's pagevec are `lru_add_drain_cpu` (l.614-645, `activate_page_drain`
//!    at l.642) run on that CPU: `lru_add_drain` (l.721-726, the caller's
//!    own CPU) from reclaim (`shrink_inactive_list` and
//!    `shrink_active_list`, vmscan.c l.2260 and l.2358 with tpp.patch
//!    applied: kswapd's CPU, not the faulting threads'), `zap_page_range`
//!    (memory.c l.1540), compaction or swap readahead, and
//!    `lru_add_drain_all` (l.752-857, every CPU's, by a work item queued
//!    on each: compaction, khugepaged, memcg, `lru_cache_disable` before
//!    a `migrate_pages`/`mbind` migration). None is on the fault path
//!    (`migrate_misplaced_page`, migrate.c l.2191 with tpp.patch applied,
//!    calls none); a drain another CPU asks for could cut a train short
//!    now and then (not modeled). A train always ends in the drain of its
//!    own CPU's pagevec (the page activates only then), so each CPU's
//!    pagevec is empty when a train starts on it;
//! 5. the next fault finds the page active and goes on to
//!    `numa_migrate_prep` and `migrate_misplaced_page` (memory.c
//!    l.4209-4218): the synchronous promotion, which fails, mapping the
//!    page back (`out_map`), when the top tier is not above its high
//!    watermark (`migrate_balanced_pgdat` in `numamigrate_isolate_page`,
//!    tpp.patch l.1295-1304).
//!
//! So a page that the scanner protects while inactive and unreferenced
//! takes 2 x 15 = 30 faults that do not migrate, then a 31st that
//! promotes; one referenced already takes 29. (The papers count 15 faults
//! "in the worst case", Matryoshka §3.1 and Nomad §2.2: 15 is the
//! pagevec's requests; the code takes two faults per request.)
//! - Promotion is synchronous, in the fault path, by stop-and-copy, and
//!   needs free pages above the high watermark; otherwise kswapd is woken.
//! - kswapd demotes cold pages (second-chance over accessed bits, Linux's
//!   inactive list) one tier down when free pages fall below the low
//!   watermark, until free pages reach the promotion watermark.

use std::collections::BTreeMap;

use super::hotness::ClockHand;
use super::types::*;
use super::{Policy, PolicyKind};

/// `sysctl_numa_balancing_hot_threshold` = 1000 ms (kernel/sched/fair.c, 6.3).
pub const HOT_THRESHOLD_NS: u64 = 1_000_000_000;
/// `sysctl_numa_balancing_promote_rate_limit` = 65536 MB/s (fair.c, 6.3).
pub const PROMOTE_RATE_LIMIT_MBPS: f64 = 65536.0;
/// `NUMA_MIGRATION_ADJUST_STEPS` (fair.c, 6.3).
pub const ADJUST_STEPS: u64 = 16;
/// Threshold-adjust period = `sysctl_numa_balancing_scan_period_max` = 60 s.
pub const THRESHOLD_ADJUST_PERIOD_NS: u64 = 60_000_000_000;
/// Rate-limit window: one second (`numa_promotion_rate_limit`).
pub const RATE_LIMIT_WINDOW_NS: u64 = 1_000_000_000;
/// `sysctl_numa_balancing_scan_size` = 256 MB per scan period.
pub const SCAN_SIZE_MB: f64 = 256.0;
/// `sysctl_numa_balancing_scan_period_min` = 1000 ms. Also
/// `sysctl_numa_balancing_scan_delay`, the period a thread starts with
/// (`init_numa_balancing`), so a policy's hint-scan rate is 256 MB per
/// this period; the simulator then adapts it ([`ScanPeriod`]).
pub const SCAN_PERIOD_MIN_NS: u64 = 1_000_000_000;
/// `sysctl_numa_balancing_scan_period_max` = 60,000 ms.
pub const SCAN_PERIOD_MAX_MS: u64 = 60_000;
/// `MAX_SCAN_WINDOW` (fair.c): never scan more than 2560 MB/s of PTEs.
pub const MAX_SCAN_WINDOW_MB: u64 = 2560;

/// The NUMA-balancing scan period in memory-tiering mode, as Linux adapts
/// it (kernel/sched/fair.c, 6.3 and 5.13 alike):
/// 1. a thread starts at `sysctl_numa_balancing_scan_delay` (1000 ms);
/// 2. once per pass over the address space (`numa_scan_seq`), at its
///    next counted hint fault, `task_numa_placement` calls
///    `update_task_scan_period` with the faults since the last call;
/// 3. in tiering mode those faults are all private (a slow page's
///    `last_cpupid` is -1 in 6.3, which counts only faults that promoted;
///    in 5.13 every fault of a one-thread process matches its own pid) and
///    none is local (the slow node has no CPU), so `local + shared == 0`
///    and the period doubles, capped at `task_scan_max`;
/// 4. `task_scan_max` = max(`task_scan_min`, `scan_period_max` / windows),
///    `task_scan_min` = max(1000 ms / (`MAX_SCAN_WINDOW` / scan size),
///    `scan_period_min` / windows), windows = RSS / 256 MB rounded up: one
///    pass over the RSS per 60 s at most, at least 100 ms per 256 MB.
///
/// Not modeled: in 5.13 (tpp-lru, nomad) a multi-threaded process's faults
/// on pages another thread faulted last count as shared, which lowers the
/// period toward `task_scan_min`; and a failed promotion
/// (`TNF_MIGRATE_FAIL`) doubles it too, which changes nothing once at the cap.
#[derive(Clone, Debug, PartialEq)]
pub struct ScanPeriod {
    period_ms: u64,
    max_ms: u64,
    /// The pass (`numa_scan_seq`) the period was last updated in.
    seq_seen: u64,
}

impl ScanPeriod {
    /// A thread's starting period, ms (`scan_delay`, step 1).
    const START_MS: u64 = SCAN_PERIOD_MIN_NS / 1_000_000;

    /// The period of a process of `rss_bytes` resident bytes, at its start.
    pub fn new(rss_bytes: f64) -> Self {
        Self {
            period_ms: Self::START_MS,
            max_ms: Self::task_scan_max_ms(rss_bytes),
            seq_seen: 0,
        }
    }

    /// `task_scan_max` for `rss_bytes` resident bytes (step 4).
    pub fn task_scan_max_ms(rss_bytes: f64) -> u64 {
        let scan_bytes = SCAN_SIZE_MB * 1024.0 * 1024.0;
        let windows = ((rss_bytes / scan_bytes).ceil() as u64).max(1);
        let floor = 1000 / (MAX_SCAN_WINDOW_MB / SCAN_SIZE_MB as u64);
        let min = floor.max(SCAN_PERIOD_MIN_NS / 1_000_000 / windows); // scan_period_min
        min.max(SCAN_PERIOD_MAX_MS / windows)
    }

    /// A counted hint fault while the scanner is in pass `scan_seq`
    /// (steps 2 and 3).
    pub fn on_hint_fault(&mut self, scan_seq: u64) {
        if scan_seq != self.seq_seen {
            self.seq_seen = scan_seq;
            self.period_ms = (self.period_ms * 2).min(self.max_ms);
        }
    }

    /// The period now, ms.
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// How much faster than at the start the scanner runs now: a policy's
    /// hint-scan rate, set for the starting period, times this.
    pub fn rate_factor(&self) -> f64 {
        Self::START_MS as f64 / self.period_ms.max(1) as f64
    }
}

/// `pgdat_free_space_enough`: free above the promotion watermark by
/// max(1 GB, node/16) promotes without a hotness check.
pub const FREE_ENOUGH_MIN_MB: f64 = 1024.0;
/// Node fraction for `pgdat_free_space_enough` (node_present_pages >> 4).
pub const FREE_ENOUGH_NODE_SHIFT: u32 = 4;
/// `watermark_scale_factor` default 10 (per 10,000): the gap between the
/// min, low, high and promo watermarks as a fraction of the tier.
pub const WATERMARK_SCALE_FACTOR: f64 = 10.0 / 10_000.0;
/// `demote_scale_factor` (per 10,000) of the TPP patch the Nomad paper ran
/// (5.13, `tpp-lru`, and Nomad's kernel, built on it): kswapd keeps this
/// fraction of the top tier free (`WMARK_DEMOTE`, at least twice the high
/// watermark; `pgdat_toptier_balanced` wakes it below, `kswapd_shrink_node`
/// reclaims up to it). The patch's default is 200; the artifact's
/// `tpp_start_tiering.sh` and `nomad_start_tiering.sh` set 1000 (Nomad
/// artifact at 0fafe0e, `src/testing_scripts/setup_system/`).
pub const DEMOTE_SCALE_FACTOR: f64 = 1000.0 / 10_000.0;
/// kswapd and bookkeeping tick.
pub const TICK_INTERVAL_NS: u64 = 1_000_000;

/// Per-tier watermarks in pages (min < low < high < promo).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermarks {
    /// Below this, allocations stall (unused by policies).
    pub min: u64,
    /// kswapd wakes below this.
    pub low: u64,
    /// Promotion needs free pages above this (`migrate_balanced_pgdat`).
    pub high: u64,
    /// kswapd reclaims up to this in tiering mode (`WMARK_PROMO`, 6.3).
    pub promo: u64,
}

impl Watermarks {
    /// Watermarks for a tier of `capacity` pages.
    pub fn for_capacity(capacity: u64) -> Self {
        let gap = ((capacity as f64 * WATERMARK_SCALE_FACTOR).round() as u64).max(1);
        Self {
            min: gap,
            low: 2 * gap,
            high: 3 * gap,
            promo: 4 * gap,
        }
    }
}

/// Linux's LRU reference state of a page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LruFlags(u8);

impl LruFlags {
    const REFERENCED: u8 = 1;
    const ACTIVE: u8 = 2;
    pub(crate) fn active(self) -> bool {
        self.0 & Self::ACTIVE != 0
    }
    pub(crate) fn referenced(self) -> bool {
        self.0 & Self::REFERENCED != 0
    }
    /// `mark_page_accessed` with the activation at once (no pagevec):
    /// inactive,unreferenced -> referenced; inactive,referenced -> active.
    /// Nomad's PCQ scan uses it; `tpp-lru`'s fault path queues the
    /// activation instead ([`mark_page_accessed_513`]).
    pub(crate) fn mark_accessed(&mut self) {
        if self.active() {
            return;
        }
        if self.referenced() {
            self.0 = Self::ACTIVE;
        } else {
            self.0 |= Self::REFERENCED;
        }
    }
}

/// `PAGEVEC_SIZE` (5.13 include/linux/pagevec.h l.15): a per-CPU pagevec
/// holds 15 pages.
pub const PAGEVEC_SIZE: usize = 15;

/// A CPU's `lru_pvecs.activate_page` pagevec (5.13 mm/swap.c l.62-74, a
/// per-CPU variable; `activate_page` takes the running CPU's, l.357): the pages
/// `activate_page` queued for the active LRU, the same page as often as
/// it was queued (each entry holds a reference of its own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ActivatePagevec {
    pages: Vec<u64>,
}

impl ActivatePagevec {
    /// Entries queued.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    /// `activate_page` (swap.c l.350-364) on an inactive page: queues it;
    /// when the add fills the pagevec (`pagevec_add_and_need_flush`,
    /// l.240-249: `pagevec_add` returns the room left, 0 when full), drains
    /// it ([`Self::drain`]).
    pub(crate) fn activate(&mut self, page: u64, flags: &mut [LruFlags]) {
        self.pages.push(page);
        if self.pages.len() >= PAGEVEC_SIZE {
            self.drain(flags);
        }
    }

    /// `activate_page_drain` (l.337-343): `__activate_page` (l.320-334) on
    /// every entry: the page becomes active (its `PG_referenced` is left
    /// as it is).
    pub(crate) fn drain(&mut self, flags: &mut [LruFlags]) {
        for p in self.pages.drain(..) {
            if let Some(f) = flags.get_mut(p as usize) {
                f.0 |= LruFlags::ACTIVE;
            }
        }
    }
}

/// 5.13's `mark_page_accessed` (swap.c l.424-452) on `page`, whose
/// activation goes through `pvec`: an unreferenced page becomes
/// referenced (l.428-429); a referenced inactive one is queued for
/// activation ([`ActivatePagevec::activate`]) and loses `PG_referenced`
/// (l.439-447); an active one is left as it is.
pub(crate) fn mark_page_accessed_513(
    flags: &mut [LruFlags],
    pvec: &mut ActivatePagevec,
    page: u64,
) {
    let Some(f) = flags.get(page as usize).copied() else {
        return;
    };
    if !f.referenced() {
        if let Some(f) = flags.get_mut(page as usize) {
            f.0 |= LruFlags::REFERENCED;
        }
    } else if !f.active() {
        pvec.activate(page, flags);
        if let Some(f) = flags.get_mut(page as usize) {
            f.0 &= !LruFlags::REFERENCED;
        }
    }
}

/// kswapd: demotes cold pages one tier down under memory pressure. Shared
/// by `tpp` and `nomad` (which uses shadow demotion where it can).
#[derive(Clone, Debug)]
pub(crate) struct Kswapd {
    hand: ClockHand,
    pub(crate) woken: Vec<bool>,
    pub(crate) watermarks: Vec<Watermarks>,
}

impl Kswapd {
    /// The TPP patch's kswapd (5.13: `tpp-lru`, `nomad`): the top tier is
    /// kept [`DEMOTE_SCALE_FACTOR`] free: kswapd wakes below that and
    /// demotes up to it.
    pub(crate) fn with_demote_watermark(config: &PolicyConfig) -> Self {
        let mut k = Self::new(config);
        if let (Some(w), Some(&cap)) =
            (k.watermarks.first_mut(), config.tier_capacity_pages.first())
        {
            let demote = ((cap as f64 * DEMOTE_SCALE_FACTOR).round() as u64)
                .max(2 * w.high)
                .min(cap);
            w.low = w.low.max(demote);
            w.promo = w.promo.max(demote);
        }
        k
    }

    pub(crate) fn new(config: &PolicyConfig) -> Self {
        Self {
            hand: ClockHand::default(),
            woken: vec![false; config.tiers()],
            watermarks: config
                .tier_capacity_pages
                .iter()
                .map(|&c| Watermarks::for_capacity(c))
                .collect(),
        }
    }

    /// Demotes from every tier (but the slowest) below its low watermark or
    /// explicitly woken, until free pages reach the promotion watermark.
    /// `shadow_ok`: use shadow demotion for pages with a shadow.
    pub(crate) fn run(
        &mut self,
        tiers: &[TierStatus],
        view: &mut dyn MemoryView,
        budget: &mut FreeBudget,
        shadow_ok: bool,
        flags: &mut [LruFlags],
        out: &mut Decisions,
    ) {
        let n = tiers.len();
        for t in 0..n.saturating_sub(1) {
            let wm = self.watermarks[t];
            let tier = t as TierId;
            let free = budget.free(tier);
            if !(free < wm.low || self.woken[t]) {
                continue;
            }
            self.woken[t] = false;
            let want = wm.promo.saturating_sub(free);
            if want == 0 {
                continue;
            }
            let max_scan = view.pages();
            let cold = self
                .hand
                .find(view, tier, want, max_scan, |_, accessed| !accessed);
            for page in cold {
                let shadow = if shadow_ok {
                    view.shadow_tier(page).filter(|&s| usize::from(s) > t)
                } else {
                    None
                };
                let shadowed = shadow.is_some();
                let dest = match shadow {
                    Some(s) => Some(s),
                    None => ((t + 1)..n)
                        .map(|d| d as TierId)
                        .find(|&d| budget.take(d, 1)),
                };
                let Some(dest) = dest else {
                    // Nothing below has room: shadows there could be reclaimed.
                    if shadow_ok {
                        out.reclaim_shadows.push((tier + 1, wm.promo));
                    }
                    break;
                };
                budget.release(tier, 1);
                if let Some(f) = flags.get_mut(page as usize) {
                    *f = LruFlags::default();
                }
                out.migrations.push(Migration {
                    unit: Unit::page(page),
                    to: dest,
                    mechanism: if shadowed {
                        Mechanism::ShadowDemotion
                    } else {
                        Mechanism::StopAndCopy
                    },
                    urgency: Urgency::Background,
                });
            }
        }
    }
}

/// The hotness threshold and promotion rate limit of `should_numa_migrate_memory`.
#[derive(Clone, Debug)]
pub(crate) struct PromotionGate {
    /// Pages per second (scaled).
    rate_limit_pages: f64,
    free_enough_pages: u64,
    threshold_ns: u64,
    th_start_ns: u64,
    th_candidates: u64,
    rl_start_ns: u64,
    rl_candidates: u64,
    candidates: u64,
}

impl PromotionGate {
    pub(crate) fn new(config: &PolicyConfig) -> Self {
        let limit_mbps = config
            .promote_rate_limit_mbps
            .unwrap_or(PROMOTE_RATE_LIMIT_MBPS);
        let fast = config.tier_capacity_pages.first().copied().unwrap_or(0);
        Self {
            rate_limit_pages: config.mb_to_pages(limit_mbps) as f64,
            free_enough_pages: config
                .mb_to_pages(FREE_ENOUGH_MIN_MB)
                .max(fast >> FREE_ENOUGH_NODE_SHIFT),
            threshold_ns: 0,
            th_start_ns: 0,
            th_candidates: 0,
            rl_start_ns: 0,
            rl_candidates: 0,
            candidates: 0,
        }
    }

    /// Current hot threshold (0 means the default).
    pub(crate) fn threshold_ns(&self) -> u64 {
        if self.threshold_ns == 0 {
            HOT_THRESHOLD_NS
        } else {
            self.threshold_ns
        }
    }

    /// `numa_promotion_adjust_threshold`.
    fn adjust_threshold(&mut self, now: u64) {
        if now.saturating_sub(self.th_start_ns) <= THRESHOLD_ADJUST_PERIOD_NS {
            return;
        }
        self.th_start_ns = now;
        let ref_cand = self.rate_limit_pages * (THRESHOLD_ADJUST_PERIOD_NS as f64 / 1e9);
        let diff = (self.candidates - self.th_candidates) as f64;
        let unit = HOT_THRESHOLD_NS * 2 / ADJUST_STEPS;
        let mut th = self.threshold_ns();
        if diff > ref_cand * 1.1 {
            th = th.saturating_sub(unit).max(unit);
        } else if diff < ref_cand * 0.9 {
            th = (th + unit).min(HOT_THRESHOLD_NS * 2);
        }
        self.th_candidates = self.candidates;
        self.threshold_ns = th;
    }

    /// A promotion cap a scenario imposes on every policy
    /// ([`PolicyConfig::promote_rate_limit_mbps`], MTM's 200 MB per 10 s),
    /// for the 5.13 policies that have no rate limit of their own: `None`
    /// unless the configuration sets one.
    pub(crate) fn imposed_cap(config: &PolicyConfig) -> Option<Self> {
        config.promote_rate_limit_mbps.map(|_| Self::new(config))
    }

    /// Whether a promotion at `now` is over `cap`, an [`Self::imposed_cap`]
    /// (never without one).
    pub(crate) fn over_imposed_cap(cap: &mut Option<Self>, now: u64) -> bool {
        cap.as_mut().is_some_and(|c| c.rate_limited(now))
    }

    /// `numa_promotion_rate_limit`: true if over the limit.
    fn rate_limited(&mut self, now: u64) -> bool {
        self.candidates += 1;
        if now.saturating_sub(self.rl_start_ns) > RATE_LIMIT_WINDOW_NS {
            self.rl_start_ns = now;
            self.rl_candidates = self.candidates;
        }
        (self.candidates - self.rl_candidates) as f64 >= self.rate_limit_pages
    }

    /// `should_numa_migrate_memory` for a fault into the top tier: `Some(true)`
    /// = promote regardless of LRU state (free space enough), `Some(false)` =
    /// hot and within the rate limit, `None` = do not promote.
    pub(crate) fn check(
        &mut self,
        fault: &HintFault,
        top: &TierStatus,
        wm: &Watermarks,
    ) -> Option<bool> {
        if top.free_pages > wm.promo + self.free_enough_pages {
            self.threshold_ns = 0;
            return Some(true);
        }
        self.adjust_threshold(fault.now_ns);
        if fault.time_to_fault_ns >= self.threshold_ns() {
            return None;
        }
        if self.rate_limited(fault.now_ns) {
            return None;
        }
        Some(false)
    }
}

/// The `tpp` policy.
#[derive(Clone, Debug)]
pub struct Tpp {
    gate: PromotionGate,
    /// tpp-lru: a cap the scenario imposes ([`PromotionGate::imposed_cap`]).
    cap: Option<PromotionGate>,
    kswapd: Kswapd,
    flags: Vec<LruFlags>,
    /// tpp-lru: each CPU's activation pagevec ([`HintFault::cpu`]; swap.c
    /// `lru_pvecs` is per CPU), created at the CPU's first fault.
    pvecs: BTreeMap<u32, ActivatePagevec>,
    /// tpp-lru: the last hint fault left its page protected
    /// ([`Policy::take_refault`]).
    refault: bool,
    tiers: usize,
    scan_pages_per_sec: f64,
    require_active: bool,
}

impl Tpp {
    /// A TPP instance for `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        Self {
            gate: PromotionGate::new(config),
            cap: None,
            kswapd: Kswapd::new(config),
            flags: vec![LruFlags::default(); config.pages as usize],
            pvecs: BTreeMap::new(),
            refault: false,
            tiers: config.tiers(),
            scan_pages_per_sec: SCAN_SIZE_MB * 1024.0 * 1024.0
                / PAGE_SIZE as f64
                / (SCAN_PERIOD_MIN_NS as f64 / 1e9),
            require_active: false,
        }
    }

    /// The TPP-patch variant: promote only pages on the active LRU.
    pub fn with_active_lru_check(config: &PolicyConfig) -> Self {
        Self {
            require_active: true,
            cap: PromotionGate::imposed_cap(config),
            kswapd: Kswapd::with_demote_watermark(config),
            ..Self::new(config)
        }
    }

    /// The current hot threshold in ns.
    pub fn threshold_ns(&self) -> u64 {
        self.gate.threshold_ns()
    }
}

impl Policy for Tpp {
    fn kind(&self) -> PolicyKind {
        if self.require_active {
            PolicyKind::TppLru
        } else {
            PolicyKind::Tpp
        }
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            hint_fault_tiers: (1..self.tiers).map(|t| t as TierId).collect(),
            hint_scan_pages_per_sec: self.scan_pages_per_sec,
            sample_period: 0,
            store_sample_period: 0,
            hardware_samples: false,
            dirty_log: false,
            accessed_bits: false,
            huge_pages: false,
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        TICK_INTERVAL_NS
    }

    fn on_hint_fault(
        &mut self,
        fault: &HintFault,
        tiers: &[TierStatus],
        _view: &mut dyn MemoryView,
    ) -> Option<Migration> {
        self.refault = false;
        if fault.tier == 0 || tiers.is_empty() {
            return None;
        }
        let wm = self.kswapd.watermarks[0];
        if self.require_active {
            // The TPP patch (5.13, do_numa_page; steps 1-5 of the module
            // docs): a slow page not on the active LRU is only
            // `mark_page_accessed` and left PROT_NONE, so the access
            // faults again at once; an active one is promoted,
            // `should_numa_migrate_memory` returning true for any slow-node
            // page in tiering mode (no hotness threshold or rate limit:
            // those are 6.x's).
            let f = self.flags.get(fault.page as usize).copied()?;
            if !f.active() {
                let pvec = self.pvecs.entry(fault.cpu).or_default();
                mark_page_accessed_513(&mut self.flags, pvec, fault.page);
                self.refault = true;
                return None;
            }
            if PromotionGate::over_imposed_cap(&mut self.cap, fault.now_ns) {
                return None;
            }
        } else {
            self.gate.check(fault, &tiers[0], &wm)?;
        }
        // migrate_balanced_pgdat: room above the high watermark, else wake kswapd.
        if tiers[0].free_pages <= wm.high {
            self.kswapd.woken[0] = true;
            return None;
        }
        Some(Migration {
            unit: Unit::page(fault.page),
            to: 0,
            mechanism: Mechanism::StopAndCopy,
            urgency: Urgency::BeforeFaultingAccessResumes,
        })
    }

    fn take_refault(&mut self) -> bool {
        std::mem::take(&mut self.refault)
    }

    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        let mut out = Decisions::none();
        let mut budget = FreeBudget::from_tiers(obs.tiers);
        self.kswapd.run(
            obs.tiers,
            view,
            &mut budget,
            false,
            &mut self.flags,
            &mut out,
        );
        out
    }

    fn export_state(&self) -> PolicyState {
        let hot_pages = self
            .flags
            .iter()
            .enumerate()
            .filter_map(|(p, f)| {
                if f.active() {
                    Some((p as u64, 1.0))
                } else if f.referenced() {
                    Some((p as u64, 0.5))
                } else {
                    None
                }
            })
            .collect();
        PolicyState {
            from: self.kind(),
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        for &(p, heat) in &state.hot_pages {
            if let Some(f) = self.flags.get_mut(p as usize) {
                if heat >= 0.75 {
                    *f = LruFlags(LruFlags::ACTIVE);
                } else if heat >= 0.25 {
                    *f = LruFlags(LruFlags::REFERENCED);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    #[test]
    fn the_scan_period_caps_at_one_pass_over_the_rss_per_minute() {
        let gib = |g: f64| g * (1u64 << 30) as f64;
        // windows = RSS / 256 MB; task_scan_max = 60,000 ms / windows, at
        // least task_scan_min (100 ms, or 1000 ms / windows).
        assert_eq!(ScanPeriod::task_scan_max_ms(gib(27.0)), 555); // 108 windows
        assert_eq!(ScanPeriod::task_scan_max_ms(gib(20.0)), 750); // 80
        assert_eq!(ScanPeriod::task_scan_max_ms(gib(72.0)), 208); // 288
        assert_eq!(ScanPeriod::task_scan_max_ms(gib(512.0)), 100); // floor
        assert_eq!(ScanPeriod::task_scan_max_ms(0.0), 60_000); // one window
    }

    #[test]
    fn the_scan_period_doubles_once_per_pass_up_to_its_cap() {
        let mut p = ScanPeriod::new(1.5 * (1u64 << 30) as f64); // 6 windows: cap 10 s
        assert_eq!(p.period_ms(), 1000);
        assert!((p.rate_factor() - 1.0).abs() < 1e-12);
        p.on_hint_fault(0); // no pass completed yet
        assert_eq!(p.period_ms(), 1000);
        p.on_hint_fault(1);
        p.on_hint_fault(1); // the same pass: one update only
        assert_eq!(p.period_ms(), 2000);
        for seq in 2..10 {
            p.on_hint_fault(seq);
        }
        assert_eq!(p.period_ms(), 10_000);
        // A large RSS caps below the start: the first update speeds it up.
        let mut big = ScanPeriod::new(27.0 * (1u64 << 30) as f64);
        big.on_hint_fault(1);
        assert_eq!(big.period_ms(), 555);
        assert!((big.rate_factor() - 1000.0 / 555.0).abs() < 1e-12);
    }

    fn fault(page: u64, ttf_ms: u64, now_ms: u64) -> HintFault {
        HintFault {
            page,
            tier: 1,
            time_to_fault_ns: ttf_ms * 1_000_000,
            write: false,
            now_ns: now_ms * 1_000_000,
            cpu: 0,
        }
    }

    impl Tpp {
        /// Entries queued in `cpu`'s activation pagevec.
        fn queued(&self, cpu: u32) -> usize {
            self.pvecs.get(&cpu).map_or(0, ActivatePagevec::len)
        }
    }

    /// 1000 pages, 100 fast (90 used: too little free for the free-space shortcut).
    fn setup() -> (Tpp, VecView, Vec<u64>) {
        let cfg = PolicyConfig::new(1000, vec![100, 1000]);
        (Tpp::new(&cfg), VecView::two_tier(1000, 90), vec![100, 1000])
    }

    #[test]
    fn upstream_promotes_at_first_fault_within_threshold() {
        let (mut tpp, mut v, caps) = setup();
        let st = v.status(&caps);
        let m = tpp
            .on_hint_fault(&fault(500, 999, 1), &st, &mut v)
            .expect("hot fault promotes");
        assert_eq!(
            (m.unit, m.to, m.urgency),
            (Unit::page(500), 0, Urgency::BeforeFaultingAccessResumes)
        );
        assert_eq!(
            tpp.on_hint_fault(&fault(501, 1000, 2), &st, &mut v),
            None,
            "at the threshold: cold"
        );
    }

    fn lru_setup() -> (Tpp, VecView, Vec<u64>) {
        let cfg = PolicyConfig::new(1000, vec![100, 1000]);
        (
            Tpp::with_active_lru_check(&cfg),
            VecView::two_tier(1000, 90),
            vec![100, 1000],
        )
    }

    /// The TPP patch's 5.13 fault path (module docs, steps 1-5): an
    /// inactive, unreferenced slow page takes 30 faults that leave it
    /// protected (every second one queues it in the pagevec, which drains
    /// at its 15th entry), then a 31st that promotes it in the fault path.
    /// No threshold: 5 s from scan to fault is cold for 6.3, not for 5.13.
    #[test]
    fn lru_variant_takes_a_train_of_30_refaults_then_promotes() {
        let (mut tpp, mut v, caps) = lru_setup();
        let st = v.status(&caps);
        for k in 1..=30u64 {
            assert_eq!(
                tpp.on_hint_fault(&fault(500, 5000, k), &st, &mut v),
                None,
                "fault {k} does not migrate"
            );
            assert!(tpp.take_refault(), "fault {k} leaves the page PROT_NONE");
            assert!(!tpp.take_refault(), "reading the refault clears it");
            // Queued once per two faults, drained at the 15th entry.
            assert_eq!(tpp.queued(0) as u64, (k / 2) % 15, "after fault {k}");
            assert_eq!(tpp.flags[500].active(), k == 30, "after fault {k}");
        }
        let m = tpp
            .on_hint_fault(&fault(500, 5000, 31), &st, &mut v)
            .expect("the 31st fault promotes");
        assert!(!tpp.take_refault(), "the promoting fault maps the page");
        assert_eq!(
            (m.unit, m.to, m.urgency, m.mechanism),
            (
                Unit::page(500),
                0,
                Urgency::BeforeFaultingAccessResumes,
                Mechanism::StopAndCopy
            )
        );
    }

    /// The pagevec is the CPU's, not the page's: entries other pages left
    /// fill it, so a page queued as its 15th entry is active at once (two
    /// faults: referenced, then queued and drained).
    #[test]
    fn the_activation_pagevec_drains_at_its_15th_entry_whoever_queued_it() {
        let (mut tpp, mut v, caps) = lru_setup();
        let st = v.status(&caps);
        for p in 0..(PAGEVEC_SIZE as u64 - 1) {
            let page = 600 + p;
            tpp.on_hint_fault(&fault(page, 5, 1), &st, &mut v);
            tpp.on_hint_fault(&fault(page, 5, 2), &st, &mut v);
            assert!(!tpp.flags[page as usize].active());
        }
        assert_eq!(tpp.queued(0), PAGEVEC_SIZE - 1);
        assert_eq!(tpp.on_hint_fault(&fault(500, 5, 3), &st, &mut v), None);
        assert_eq!(tpp.on_hint_fault(&fault(500, 5, 4), &st, &mut v), None);
        assert_eq!(tpp.queued(0), 0, "the 15th entry drains it");
        // Every queued page is active now; each was left unreferenced.
        for page in (600..600 + PAGEVEC_SIZE as u64 - 1).chain([500]) {
            let f = tpp.flags[page as usize];
            assert!(f.active() && !f.referenced(), "page {page}");
        }
        assert!(tpp.on_hint_fault(&fault(500, 5, 5), &st, &mut v).is_some());
    }

    /// The pagevec is per CPU (5.13 swap.c: `lru_pvecs` is a per-CPU
    /// variable, `activate_page` queues on `this_cpu_ptr`): two threads on
    /// two CPUs running trains on two pages at once, their faults
    /// interleaved, each fill their own pagevec, so each page takes its
    /// full train of 30 faults. One pagevec shared by both would fill at
    /// its 15th entry from either: both pages active after 16 and 15
    /// faults.
    #[test]
    fn each_cpu_drains_its_own_pagevec_at_its_own_15th_entry() {
        let (mut tpp, mut v, caps) = lru_setup();
        let st = v.status(&caps);
        let on = |cpu: u32, page: u64, k: u64| HintFault {
            cpu,
            ..fault(page, 5, k)
        };
        for k in 1..=30u64 {
            for (cpu, page) in [(0, 500), (1, 501)] {
                assert_eq!(tpp.on_hint_fault(&on(cpu, page, k), &st, &mut v), None);
                assert!(tpp.take_refault(), "cpu {cpu}: fault {k} refaults");
                assert_eq!(
                    tpp.flags[page as usize].active(),
                    k == 30,
                    "page {page} after its fault {k}"
                );
            }
        }
        for (cpu, page) in [(0, 500), (1, 501)] {
            assert_eq!(tpp.queued(cpu), 0, "cpu {cpu} drained at its 15th entry");
            assert!(tpp.on_hint_fault(&on(cpu, page, 31), &st, &mut v).is_some());
        }
    }

    /// 6.x TPP (`tpp`) maps the page back after every fault.
    #[test]
    fn upstream_never_leaves_a_page_protected() {
        let (mut tpp, mut v, caps) = setup();
        let st = v.status(&caps);
        for k in 0..40 {
            tpp.on_hint_fault(&fault(501, 1500, k), &st, &mut v);
            assert!(!tpp.take_refault());
        }
    }

    #[test]
    fn slow_faults_never_promote() {
        let (mut tpp, mut v, caps) = setup();
        let st = v.status(&caps);
        for i in 0..5 {
            assert_eq!(tpp.on_hint_fault(&fault(501, 1500, i), &st, &mut v), None);
        }
    }

    #[test]
    fn no_room_wakes_kswapd_which_demotes_cold_pages() {
        let cfg = PolicyConfig::new(1000, vec![100, 1000]);
        let mut tpp = Tpp::with_active_lru_check(&cfg);
        let mut v = VecView::two_tier(1000, 100); // fast tier full
        let caps = [100, 1000];
        let st = v.status(&caps);
        for k in 1..=30 {
            tpp.on_hint_fault(&fault(600, 5, k), &st, &mut v);
        }
        assert!(tpp.flags[600].active());
        assert_eq!(tpp.on_hint_fault(&fault(600, 5, 31), &st, &mut v), None);
        assert!(!tpp.take_refault(), "a failed promotion maps the page back");
        // Pages 0..50 were accessed recently: second chance; 50.. are cold.
        for p in 0..50 {
            v.accessed[p] = true;
        }
        let d = tpp.tick(&obs(4_000_000, &st, &[]), &mut v);
        // The TPP patch's kswapd frees the top tier up to WMARK_DEMOTE.
        let demote = (100.0 * DEMOTE_SCALE_FACTOR).round() as u64;
        assert!(demote > Watermarks::for_capacity(100).promo);
        assert_eq!(d.migrations.len() as u64, demote);
        assert!(d
            .migrations
            .iter()
            .all(|m| m.to == 1 && m.unit.page >= 50 && m.unit.page < 100));
    }

    #[test]
    fn threshold_adapts_towards_rate_limit() {
        // A tiny rate limit: far more candidates than the limit, so the
        // threshold drops by one step per adjust period.
        let (mut tpp, mut v, st) = one_page_per_second(Tpp::new);
        let mut now = 0;
        for i in 0..10_000u64 {
            now = i * 10; // ms
            tpp.on_hint_fault(&fault(100 + i % 800, 1, now), &st, &mut v);
        }
        assert!(now > 61_000);
        assert_eq!(
            tpp.threshold_ns(),
            HOT_THRESHOLD_NS - HOT_THRESHOLD_NS * 2 / ADJUST_STEPS
        );
    }

    /// The watermarks are `watermark_scale_factor` (10 per 10,000) of the
    /// tier apart, at least one page; the TPP patch's kswapd keeps a tenth
    /// of the top tier free (at least twice its high watermark).
    #[test]
    fn watermarks_are_a_thousandth_of_the_tier_apart() {
        let w = |min, low, high, promo| Watermarks {
            min,
            low,
            high,
            promo,
        };
        assert_eq!(Watermarks::for_capacity(10_000), w(10, 20, 30, 40));
        assert_eq!(Watermarks::for_capacity(2_500), w(3, 6, 9, 12)); // 2.5 rounds up
        assert_eq!(Watermarks::for_capacity(100), w(1, 2, 3, 4)); // at least a page
        let k = Kswapd::with_demote_watermark(&PolicyConfig::new(100, vec![10_000, 20_000]));
        assert_eq!((k.watermarks[0].low, k.watermarks[0].promo), (1000, 1000));
        assert_eq!(k.watermarks[1], Watermarks::for_capacity(20_000));
        // A tiny top tier: a tenth (1) is less than twice the high mark (6).
        let k = Kswapd::with_demote_watermark(&PolicyConfig::new(100, vec![10, 100]));
        assert_eq!((k.watermarks[0].low, k.watermarks[0].promo), (6, 6));
    }

    /// `pgdat_free_space_enough`: more than max(1 GB, a sixteenth of the
    /// node) free above the promotion watermark promotes any slow page at
    /// its first fault, however cold; a page less and the threshold applies.
    #[test]
    fn plenty_of_free_fast_memory_promotes_whatever_the_hotness() {
        let fast = 1u64 << 20; // 4 GiB of pages: a sixteenth is 256 MB
        let cfg = PolicyConfig::new(2 * fast, vec![fast, 2 * fast]);
        let mut v = VecView::two_tier(1000, 0);
        let enough = (1u64 << 30) / PAGE_SIZE as u64;
        let promo = Watermarks::for_capacity(fast).promo;
        for (free, promotes) in [(promo + enough + 1, true), (promo + enough, false)] {
            let mut tpp = Tpp::new(&cfg);
            let mut st = v.status(&[fast, 2 * fast]);
            st[0].free_pages = free;
            let cold = fault(500, 5_000, 1);
            let m = tpp.on_hint_fault(&cold, &st, &mut v);
            assert_eq!(m.is_some(), promotes, "free {free}");
        }
    }

    /// `numa_promotion_adjust_threshold`, the other way: fewer candidates
    /// in a 60 s period than 90% of what the rate limit allows raise the
    /// threshold a step (2 x 1000 ms / 16), up to 2000 ms; from 90% to
    /// 110% it stays. A period ends only after 60 s.
    #[test]
    fn threshold_rises_when_candidates_fall_short_and_holds_in_the_band() {
        let step = HOT_THRESHOLD_NS * 2 / ADJUST_STEPS;
        let after_a_minute_of = |candidates: u64| {
            let (mut tpp, mut v, st) = one_page_per_second(Tpp::new);
            assert_eq!(tpp.gate.rate_limit_pages, 1.0, "60 per period");
            // The last candidate at exactly 60 s: the period is not over.
            for i in 0..candidates {
                let now = i * 60_000 / (candidates - 1);
                tpp.on_hint_fault(&fault(100 + i % 800, 1, now), &st, &mut v);
            }
            assert_eq!(
                tpp.threshold_ns(),
                HOT_THRESHOLD_NS,
                "{candidates}: within 60 s"
            );
            tpp.on_hint_fault(&fault(950, 1, 60_001), &st, &mut v);
            tpp.threshold_ns()
        };
        assert_eq!(after_a_minute_of(10), HOT_THRESHOLD_NS + step);
        assert_eq!(after_a_minute_of(53), HOT_THRESHOLD_NS + step);
        assert_eq!(after_a_minute_of(54), HOT_THRESHOLD_NS, "90%: holds");
        assert_eq!(after_a_minute_of(65), HOT_THRESHOLD_NS);
        assert_eq!(after_a_minute_of(66), HOT_THRESHOLD_NS, "110%: holds");
        assert_eq!(after_a_minute_of(67), HOT_THRESHOLD_NS - step);
        // Candidates count per period: 60 in the first (in the band), 10
        // in the next (short: it rises).
        let (mut tpp, mut v, st) = one_page_per_second(Tpp::new);
        for i in 0..60u64 {
            tpp.on_hint_fault(&fault(100 + i, 1, i * 1000), &st, &mut v);
        }
        tpp.on_hint_fault(&fault(300, 1, 60_001), &st, &mut v);
        assert_eq!(tpp.threshold_ns(), HOT_THRESHOLD_NS);
        for i in 0..9u64 {
            tpp.on_hint_fault(&fault(400 + i, 1, 61_000 + i * 1000), &st, &mut v);
        }
        tpp.on_hint_fault(&fault(500, 1, 121_000), &st, &mut v);
        assert_eq!(tpp.threshold_ns(), HOT_THRESHOLD_NS + step);
        // One candidate a period: it rises to twice the default and stays.
        let (mut tpp, mut v, st) = one_page_per_second(Tpp::new);
        for k in 0..12u64 {
            tpp.on_hint_fault(&fault(100 + k, 1, k * 61_000), &st, &mut v);
        }
        assert_eq!(tpp.threshold_ns(), 2 * HOT_THRESHOLD_NS);
    }

    /// `numa_promotion_rate_limit` at one page per second: the window's
    /// first candidate already reaches the limit; a new window opens only
    /// more than a second after the last one opened.
    #[test]
    fn the_rate_limit_window_opens_after_a_second() {
        let (mut tpp, mut v, st) = one_page_per_second(Tpp::new);
        let promotes = |tpp: &mut Tpp, v: &mut VecView, page, now_ms| {
            tpp.on_hint_fault(&fault(page, 1, now_ms), &st, v).is_some()
        };
        assert!(!promotes(&mut tpp, &mut v, 500, 0));
        assert!(!promotes(&mut tpp, &mut v, 501, 1000), "the same window");
        assert!(promotes(&mut tpp, &mut v, 502, 1001), "a new window");
        assert!(!promotes(&mut tpp, &mut v, 503, 1500), "its limit reached");
    }

    /// The 5.13 variant keeps a cap the scenario imposes: a page whose
    /// train activated it is not promoted over the cap, and is a second
    /// later.
    #[test]
    fn the_lru_variant_keeps_an_imposed_cap() {
        let (mut tpp, mut v, st) = one_page_per_second(Tpp::with_active_lru_check);
        assert_eq!(tpp.kind(), PolicyKind::TppLru);
        for k in 1..=30 {
            assert_eq!(tpp.on_hint_fault(&fault(500, 5000, k), &st, &mut v), None);
        }
        assert_eq!(
            tpp.on_hint_fault(&fault(500, 5000, 31), &st, &mut v),
            None,
            "capped"
        );
        assert!(!tpp.take_refault(), "over the cap the page is mapped back");
        assert!(tpp
            .on_hint_fault(&fault(500, 5000, 1100), &st, &mut v)
            .is_some());
    }

    /// A fault on a top-tier page (or with no tiers known) never migrates.
    #[test]
    fn faults_on_fast_pages_do_nothing() {
        let (mut tpp, mut v, caps) = setup();
        let st = v.status(&caps);
        let fast = HintFault {
            tier: 0,
            ..fault(5, 1, 1)
        };
        assert_eq!(tpp.on_hint_fault(&fast, &st, &mut v), None);
        assert_eq!(
            tpp.on_hint_fault(&fault(500, 1, 2), &[], &mut v),
            None,
            "no tiers"
        );
        assert!(tpp.on_hint_fault(&fault(500, 1, 3), &st, &mut v).is_some());
    }

    /// One kswapd run over `st` and `v` (`shadow_ok`: Nomad's shadow
    /// demotion), its decisions.
    fn demote(k: &mut Kswapd, st: &[TierStatus], v: &mut VecView, shadow_ok: bool) -> Decisions {
        let mut out = Decisions::none();
        let mut flags = vec![LruFlags::default(); v.tier.len()];
        k.run(
            st,
            v,
            &mut FreeBudget::from_tiers(st),
            shadow_ok,
            &mut flags,
            &mut out,
        );
        out
    }

    /// kswapd demotes each tier's cold pages into the next tier down with
    /// room (a full one is skipped, never the tier itself); a tier above
    /// its low watermark demotes only when woken, down to its promotion
    /// watermark; a page with a shadow below goes by shadow demotion when
    /// the policy allows it; with room nowhere below, Nomad's kswapd asks
    /// for the shadows there to be reclaimed.
    #[test]
    fn kswapd_demotes_to_the_next_tier_with_room() {
        let cfg = PolicyConfig::new(400, vec![100, 100, 1000]);
        let caps = [100, 100, 1000];
        // Tier 0: pages 0..99 (1 free), tier 1: 100..200 (full), tier 2: the rest.
        let mut v = VecView::two_tier(400, 99);
        for p in 99..400 {
            v.tier[p] = if (100..200).contains(&p) { 1 } else { 2 };
        }
        v.tier[99] = 2;
        v.shadow[101] = true; // VecView's shadows are in tier 1: not below tier 1
        let st = v.status(&caps);
        let out = demote(&mut Kswapd::new(&cfg), &st, &mut v, true);
        let moved: Vec<(u64, TierId, Mechanism)> = out
            .migrations
            .iter()
            .map(|m| (m.unit.page, m.to, m.mechanism))
            .collect();
        let sc = Mechanism::StopAndCopy;
        // Tier 0 wants promo (4) - free (1) = 3; tier 1 wants 4.
        assert_eq!(
            moved,
            vec![
                (0, 2, sc),
                (1, 2, sc),
                (2, 2, sc),
                (100, 2, sc),
                (101, 2, sc),
                (102, 2, sc),
                (103, 2, sc)
            ]
        );
        assert!(out.reclaim_shadows.is_empty());

        // Two tiers, the lower one full: a shadowed page goes by remap;
        // the rest has nowhere to go.
        let cfg = PolicyConfig::new(200, vec![100, 100]);
        let mut v = VecView::two_tier(200, 100);
        v.shadow[0] = true;
        let st = v.status(&[100, 100]);
        let out = demote(&mut Kswapd::new(&cfg), &st, &mut v, true);
        assert_eq!(pages_moved_to(&out, 1), vec![0]);
        assert_eq!(out.migrations[0].mechanism, Mechanism::ShadowDemotion);
        assert_eq!(out.reclaim_shadows, vec![(1, 4)]);

        // Above the low watermark: nothing, unless woken (then down to promo).
        let mut v = VecView::two_tier(200, 97); // 3 free: low 2, promo 4
        let st = v.status(&[100, 200]);
        let mut k = Kswapd::new(&cfg);
        for (woken, want) in [(false, 0), (true, 1)] {
            k.woken[0] = woken;
            let out = demote(&mut k, &st, &mut v, false);
            assert_eq!(out.migrations.len(), want, "woken {woken}");
            assert!(!k.woken[0], "a run clears the wake-up");
        }
        // At the low watermark exactly (2 free): not below it, nothing.
        let mut v = VecView::two_tier(200, 98);
        let st = v.status(&[100, 200]);
        let out = demote(&mut k, &st, &mut v, false);
        assert!(out.migrations.is_empty(), "{:?}", out.migrations);
    }

    /// TPP asks for hint faults on every slow tier at 256 MB per second,
    /// ticks every millisecond, and hands its LRU state over: heat 0.75
    /// and up is active (exported as 1.0), 0.25 and up referenced (0.5).
    #[test]
    fn tpp_samples_slow_tiers_and_hands_its_lru_state_over() {
        let cfg = PolicyConfig::new(1000, vec![100, 400, 1000]);
        let tpp = Tpp::new(&cfg);
        let t = tpp.trackers();
        assert_eq!(t.hint_fault_tiers, vec![1, 2]);
        assert_eq!(t.hint_scan_pages_per_sec, 65_536.0);
        assert!(!t.dirty_log && !t.accessed_bits && !t.hardware_samples);
        assert_eq!(tpp.tick_interval_ns(), 1_000_000);
        assert_eq!(tpp.kind(), PolicyKind::Tpp);
        let mut lru = Tpp::with_active_lru_check(&cfg);
        lru.import_state(&PolicyState {
            from: PolicyKind::Nomad,
            now_ns: 0,
            hot_pages: vec![(1, 0.75), (2, 0.74), (3, 0.25), (4, 0.24), (5000, 1.0)],
        });
        let state = lru.export_state();
        assert_eq!(state.from, PolicyKind::TppLru);
        let mut got = state.hot_pages;
        got.sort_by_key(|a| a.0);
        assert_eq!(got, vec![(1, 1.0), (2, 0.5), (3, 0.5)]);
    }
}
