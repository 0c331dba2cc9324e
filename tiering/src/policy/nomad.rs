//! `nomad`: Nomad (OSDI'24) over TPP's hotness signal.
//!
//! - Every hint fault on a slow-tier page goes to the module
//!   (`queue_page_fault`; the kernel is the TPP patch on 5.13, whose
//!   `should_numa_migrate_memory` has no threshold or rate limit in
//!   tiering mode), which scans its **promotion candidate queue** (PCQ)
//!   from the newest entry (`decide_queue_page`, nomad_module
//!   async_promote_main.c at 0fafe0e) and then puts the page on it: an
//!   entry that left the slow tier is dropped; accessed and active -> moved
//!   to the **migration pending queue** (MPQ, [`MPQ_LEN`] entries, no
//!   duplicates); accessed but inactive -> `mark_page_accessed`; not
//!   accessed and beyond the look-back of [`PCQ_LOOKBACK`] -> dropped. The
//!   module never clears the accessed bit (its `pte_mkold` is commented
//!   out) and the fault left the PTE young, so every entry reads accessed:
//!   a faulted page is marked at the next two faults (referenced, active)
//!   and moved to the MPQ at the third.
//! - `kpromote` drains the MPQ asynchronously (each tick) with transactional
//!   migration, keeping the source page as a shadow. Aborted pages are
//!   re-queued ("retried the next time TPM is rescheduled"). No reclaim
//!   for promotion (`__GFP_NORETRY`): without room, kswapd is woken.
//! - kswapd demotes cold pages like TPP, by shadow demotion (remap, no copy)
//!   when the page still has its shadow. Under slow-tier pressure it asks to
//!   reclaim shadows first.

use std::collections::VecDeque;

use super::tpp::{
    Kswapd, LruFlags, PromotionGate, SCAN_PERIOD_MIN_NS, SCAN_SIZE_MB, TICK_INTERVAL_NS,
};
use super::types::*;
use super::{Policy, PolicyKind};

/// PCQ look-back distance `PG_FAULT_LOOKBACK_DIST` (Nomad artifact).
pub const PCQ_LOOKBACK: usize = 20;
/// MPQ ring length `PROMOTE_QUEUE_LEN` (Nomad artifact); also kpromote's batch.
pub const MPQ_LEN: usize = 512;

/// The `nomad` policy.
#[derive(Clone, Debug)]
pub struct Nomad {
    /// A cap the scenario imposes ([`PromotionGate::imposed_cap`]).
    cap: Option<PromotionGate>,
    kswapd: Kswapd,
    flags: Vec<LruFlags>,
    queued: Vec<bool>,
    pcq: VecDeque<u64>,
    mpq: VecDeque<u64>,
    tiers: usize,
}

impl Nomad {
    /// A Nomad instance for `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        let n = config.pages as usize;
        Self {
            cap: PromotionGate::imposed_cap(config),
            kswapd: Kswapd::with_demote_watermark(config),
            flags: vec![LruFlags::default(); n],
            queued: vec![false; n],
            pcq: VecDeque::new(),
            mpq: VecDeque::with_capacity(MPQ_LEN),
            tiers: config.tiers(),
        }
    }

    /// Pages waiting on the promotion candidate queue (newest first).
    pub fn pcq(&self) -> impl Iterator<Item = u64> + '_ {
        self.pcq.iter().copied()
    }

    /// Pages waiting on the migration pending queue (oldest first).
    pub fn mpq(&self) -> impl Iterator<Item = u64> + '_ {
        self.mpq.iter().copied()
    }

    fn enqueue_mpq(&mut self, page: u64) {
        let Some(q) = self.queued.get_mut(page as usize) else {
            return;
        };
        if *q || self.mpq.len() >= MPQ_LEN {
            return;
        }
        *q = true;
        self.mpq.push_back(page);
    }

    /// The PCQ scan done on every fault.
    fn scan_pcq(&mut self, view: &mut dyn MemoryView) {
        let mut kept = VecDeque::with_capacity(self.pcq.len().min(PCQ_LOOKBACK));
        let entries: Vec<u64> = self.pcq.drain(..).collect();
        for page in entries {
            if view.tier_of(page) == 0 {
                continue; // already promoted: its PTE points elsewhere
            }
            // Every entry's PTE reads young: the fault made it so and the
            // module never clears it (its `pte_mkold` is commented out). So
            // the look-back, which drops only entries not accessed, drops
            // none, and the accessed bit is not consulted.
            let f = &mut self.flags[page as usize];
            if f.active() {
                self.enqueue_mpq(page);
                continue;
            }
            f.mark_accessed();
            kept.push_back(page);
        }
        self.pcq = kept;
    }
}

impl Policy for Nomad {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Nomad
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            hint_fault_tiers: (1..self.tiers).map(|t| t as TierId).collect(),
            hint_scan_pages_per_sec: SCAN_SIZE_MB * 1024.0 * 1024.0
                / PAGE_SIZE as f64
                / (SCAN_PERIOD_MIN_NS as f64 / 1e9),
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
        view: &mut dyn MemoryView,
    ) -> Option<Migration> {
        if fault.tier == 0 || tiers.is_empty() || fault.page >= self.flags.len() as u64 {
            return None;
        }
        // The scan first, then the new entry (`list_add` after the loop).
        self.scan_pcq(view);
        let capped = PromotionGate::over_imposed_cap(&mut self.cap, fault.now_ns);
        if !capped && !self.queued[fault.page as usize] && !self.pcq.contains(&fault.page) {
            self.pcq.push_front(fault.page);
        }
        None
    }

    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        let mut out = Decisions::none();
        let mut budget = FreeBudget::from_tiers(obs.tiers);
        for o in obs.tpm_outcomes {
            if !o.committed && view.tier_of(o.page) != 0 {
                self.enqueue_mpq(o.page); // retry next time
            }
        }
        // Slow-tier pressure: reclaim shadows first (Nomad §3.2).
        for t in 1..obs.tiers.len() {
            let wm = self.kswapd.watermarks[t];
            let st = obs.tiers[t];
            if st.free_pages < wm.low && st.shadow_pages > 0 {
                out.reclaim_shadows
                    .push((t as TierId, (wm.promo - st.free_pages).min(st.shadow_pages)));
            }
        }
        self.kswapd.run(
            obs.tiers,
            view,
            &mut budget,
            true,
            &mut self.flags,
            &mut out,
        );
        // kpromote: drain the MPQ with TPM.
        let wm0 = self.kswapd.watermarks[0];
        while let Some(page) = self.mpq.pop_front() {
            self.queued[page as usize] = false;
            if view.tier_of(page) == 0 {
                continue;
            }
            if budget.free(0) <= wm0.min || !budget.take(0, 1) {
                self.kswapd.woken[0] = true;
                break; // no reclaim for promotion: drop the rest of this batch
            }
            // The source page stays allocated (it becomes the shadow).
            out.migrations.push(Migration {
                unit: Unit::page(page),
                to: 0,
                mechanism: Mechanism::Transactional { keep_shadow: true },
                urgency: Urgency::Background,
            });
        }
        for p in self.mpq.drain(..) {
            self.queued[p as usize] = false;
        }
        out
    }

    fn export_state(&self) -> PolicyState {
        let mut hot_pages: Vec<(u64, f32)> = self.mpq.iter().map(|&p| (p, 1.0)).collect();
        hot_pages.extend(self.flags.iter().enumerate().filter_map(|(p, f)| {
            if f.active() {
                Some((p as u64, 0.9))
            } else if f.referenced() {
                Some((p as u64, 0.5))
            } else {
                None
            }
        }));
        PolicyState {
            from: PolicyKind::Nomad,
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        for &(p, heat) in &state.hot_pages {
            let Some(f) = self.flags.get_mut(p as usize) else {
                continue;
            };
            if heat >= 0.75 {
                f.mark_accessed();
                f.mark_accessed();
            } else if heat >= 0.25 {
                f.mark_accessed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::tpp::Watermarks;
    use super::*;

    fn fault(page: u64, now_ms: u64) -> HintFault {
        HintFault {
            page,
            tier: 1,
            time_to_fault_ns: 1_000_000,
            write: false,
            now_ns: now_ms * 1_000_000,
            cpu: 0,
        }
    }

    fn setup() -> (Nomad, VecView, Vec<TierStatus>) {
        let cfg = PolicyConfig::new(1000, vec![100, 1000]);
        let v = VecView::two_tier(1000, 90);
        let st = v.status(&[100, 1000]);
        (Nomad::new(&cfg), v, st)
    }

    #[test]
    fn a_faulted_page_reaches_the_mpq_three_faults_later_and_promotes_with_tpm() {
        let (mut n, mut v, st) = setup();
        // No accessed bit is ever set here: the module reads every entry's
        // PTE as young (the fault made it so; nothing clears it).
        assert_eq!(
            n.on_hint_fault(&fault(500, 1), &st, &mut v),
            None,
            "never in the fault path"
        );
        n.on_hint_fault(&fault(501, 2), &st, &mut v); // 500: referenced
        n.on_hint_fault(&fault(502, 3), &st, &mut v); // 500: active
        assert!(n.mpq().next().is_none());
        n.on_hint_fault(&fault(503, 4), &st, &mut v); // 500: to the MPQ
        assert_eq!(n.mpq().collect::<Vec<_>>(), vec![500]);
        let d = n.tick(&obs(5_000_000, &st, &[]), &mut v);
        assert_eq!(d.migrations.len(), 1);
        assert_eq!(
            d.migrations[0].mechanism,
            Mechanism::Transactional { keep_shadow: true }
        );
        assert_eq!(d.migrations[0].urgency, Urgency::Background);
    }

    #[test]
    fn every_faulted_page_is_queued_and_the_pcq_stays_short() {
        let (mut n, mut v, st) = setup();
        let faults = 2 * PCQ_LOOKBACK as u64;
        for i in 0..faults {
            n.on_hint_fault(&fault(300 + i, 1 + i), &st, &mut v);
            assert!(n.pcq().count() <= 3, "{:?}", n.pcq().collect::<Vec<_>>());
        }
        // All but the last three faulted pages are on the MPQ, in order.
        let want: Vec<u64> = (300..300 + faults - 3).collect();
        assert_eq!(n.mpq().collect::<Vec<_>>(), want);
        assert!(v.accessed.iter().all(|&a| !a));
    }

    #[test]
    fn a_cap_the_scenario_imposes_limits_the_queued_pages() {
        let (mut n, mut v, st) = one_page_per_second(Nomad::new);
        // 40 faults in 40 ms: without the cap all but the last 3 queue.
        for i in 0..40u64 {
            n.on_hint_fault(&fault(300 + i, 1 + i), &st, &mut v);
        }
        assert!(n.mpq().count() <= 1, "{:?}", n.mpq().collect::<Vec<_>>());
    }

    #[test]
    fn aborted_tpm_is_retried_and_shadowed_pages_demote_by_remap() {
        let cfg = PolicyConfig::new(1000, vec![100, 1000]);
        let mut n = Nomad::new(&cfg);
        let mut v = VecView::two_tier(1000, 100);
        v.shadow[2] = true;
        let st = v.status(&[100, 1000]);
        let outcomes = [TpmOutcome {
            page: 700,
            committed: false,
        }];
        let o = Observations {
            now_ns: 1,
            tiers: &st,
            samples: &[],
            tpm_outcomes: &outcomes,
            dirty: &[],
        };
        let d = n.tick(&o, &mut v);
        // Fast tier full: kswapd demotes; page 2 goes by shadow remap.
        let m5 = d
            .migrations
            .iter()
            .find(|m| m.unit.page == 2)
            .expect("page 2 demoted");
        assert_eq!(m5.mechanism, Mechanism::ShadowDemotion);
        assert!(d
            .migrations
            .iter()
            .filter(|m| m.unit.page != 2 && m.to == 1)
            .all(|m| m.mechanism == Mechanism::StopAndCopy));
        // The aborted page is retried, with room freed by the demotions.
        assert!(d.migrations.iter().any(|m| m.unit.page == 700 && m.to == 0));
    }

    /// The PCQ, newest first, entry by entry (Nomad artifact
    /// `decide_queue_page`): each fault marks the older entries once, and
    /// the third mark moves an entry to the MPQ; a page that left the slow
    /// tier is dropped from it.
    #[test]
    fn the_pcq_keeps_the_newest_faults_first_and_drops_pages_already_fast() {
        let (mut n, mut v, st) = setup();
        let pcq = |n: &Nomad| n.pcq().collect::<Vec<_>>();
        n.on_hint_fault(&fault(500, 1), &st, &mut v);
        assert_eq!(pcq(&n), vec![500]);
        n.on_hint_fault(&fault(501, 2), &st, &mut v);
        assert_eq!(pcq(&n), vec![501, 500]);
        assert!(n.flags[500].referenced() && !n.flags[500].active());
        n.on_hint_fault(&fault(502, 3), &st, &mut v);
        assert_eq!(pcq(&n), vec![502, 501, 500]);
        assert!(n.flags[500].active());
        // 502 was promoted by someone else: the next scan drops it.
        v.tier[502] = 0;
        n.on_hint_fault(&fault(503, 4), &st, &mut v);
        assert_eq!(pcq(&n), vec![503, 501]);
        assert_eq!(n.mpq().collect::<Vec<_>>(), vec![500]);
    }

    /// Faults that are not a slow page's (a fast page, a page past the
    /// guest) are ignored; a page already queued is not queued twice.
    #[test]
    fn only_slow_pages_not_yet_queued_enter_the_pcq() {
        let (mut n, mut v, st) = setup();
        let fast = HintFault {
            tier: 0,
            ..fault(10, 1)
        };
        assert_eq!(n.on_hint_fault(&fast, &st, &mut v), None);
        assert_eq!(n.on_hint_fault(&fault(1000, 2), &st, &mut v), None);
        assert_eq!(n.on_hint_fault(&fault(u64::MAX, 3), &st, &mut v), None);
        assert_eq!(n.pcq().count(), 0, "{:?}", n.pcq().collect::<Vec<_>>());
        // The same page twice in a row: one entry (marked once by the scan).
        n.on_hint_fault(&fault(600, 4), &st, &mut v);
        n.on_hint_fault(&fault(600, 5), &st, &mut v);
        assert_eq!(n.pcq().collect::<Vec<_>>(), vec![600]);
        // 600 reaches the MPQ; its next fault does not put it back on the PCQ.
        n.on_hint_fault(&fault(601, 6), &st, &mut v);
        n.on_hint_fault(&fault(602, 7), &st, &mut v);
        assert_eq!(n.mpq().collect::<Vec<_>>(), vec![600]);
        n.on_hint_fault(&fault(600, 8), &st, &mut v);
        assert!(
            !n.pcq().any(|p| p == 600),
            "{:?}",
            n.pcq().collect::<Vec<_>>()
        );
        assert_eq!(n.mpq().collect::<Vec<_>>(), vec![600]);
    }

    /// The MPQ is a ring of `MPQ_LEN` entries: pages that find it full
    /// are dropped.
    #[test]
    fn the_mpq_holds_at_most_its_length() {
        let cfg = PolicyConfig::new(2000, vec![100, 2000]);
        let mut v = VecView::two_tier(2000, 90);
        let st = v.status(&[100, 2000]);
        let mut n = Nomad::new(&cfg);
        let faults = MPQ_LEN as u64 + 100;
        for i in 0..faults {
            n.on_hint_fault(&fault(300 + i, 1 + i), &st, &mut v);
        }
        let want: Vec<u64> = (300..300 + MPQ_LEN as u64).collect();
        assert_eq!(n.mpq().collect::<Vec<_>>(), want);
    }

    /// kpromote needs the fast tier above its min watermark: at the
    /// watermark it promotes nothing, wakes kswapd, and drops the batch
    /// (the pages can queue again); one page above it, it promotes one.
    #[test]
    fn kpromote_stops_at_the_min_watermark_and_drops_the_batch() {
        let cfg = PolicyConfig::new(1000, vec![100, 1000]);
        let min = Watermarks::for_capacity(100).min;
        for (free, promoted) in [(min, 0), (min + 1, 1)] {
            let mut n = Nomad::new(&cfg);
            let mut v = VecView::two_tier(1000, 90);
            for p in [700, 701] {
                n.enqueue_mpq(p);
            }
            let mut st = v.status(&[100, 1000]);
            st[0].free_pages = free;
            // kswapd demotes nothing here: its low watermark is the demote one.
            n.kswapd.watermarks[0].low = 0;
            let d = n.tick(&obs(5_000_000, &st, &[]), &mut v);
            assert_eq!(pages_moved_to(&d, 0).len(), promoted, "free {free}");
            assert!(n.kswapd.woken[0], "free {free}: no room left wakes kswapd");
            assert_eq!(n.mpq().count(), 0, "free {free}");
            assert!(
                n.queued.iter().all(|&q| !q),
                "free {free}: queued flags left"
            );
        }
    }

    /// A committed TPM is not retried; an aborted one is, once.
    #[test]
    fn only_aborted_tpm_is_retried() {
        let (mut n, mut v, st) = setup();
        let outcomes = [
            TpmOutcome {
                page: 700,
                committed: true,
            },
            TpmOutcome {
                page: 701,
                committed: false,
            },
        ];
        let o = Observations {
            tpm_outcomes: &outcomes,
            ..obs(1, &st, &[])
        };
        let d = n.tick(&o, &mut v);
        assert_eq!(pages_moved_to(&d, 0), vec![701]);
    }

    /// Slow-tier pressure (free below its low watermark) with shadows
    /// there: reclaim shadows up to the promotion watermark, at most as
    /// many as there are (Nomad §3.2). No pressure or no shadow: none.
    #[test]
    fn slow_tier_pressure_reclaims_shadows_up_to_the_promotion_watermark() {
        let cfg = PolicyConfig::new(1000, vec![100, 10_000]);
        let wm = Watermarks::for_capacity(10_000);
        let v = VecView::two_tier(1000, 10);
        let tiers = |free: u64, shadows: u64| {
            let mut st = v.status(&[100, 10_000]);
            st[1].free_pages = free;
            st[1].shadow_pages = shadows;
            st
        };
        for (free, shadows, want) in [
            (wm.low - 1, 1000, vec![(1, wm.promo - wm.low + 1)]),
            (wm.low - 1, 3, vec![(1, 3)]),
            (0, 1000, vec![(1, wm.promo)]),
            (wm.low, 1000, vec![]),
            (wm.low - 1, 0, vec![]),
        ] {
            let mut n = Nomad::new(&cfg);
            let mut v = v.clone();
            let st = tiers(free, shadows);
            let d = n.tick(&obs(1, &st, &[]), &mut v);
            assert_eq!(d.reclaim_shadows, want, "free {free}, shadows {shadows}");
        }
    }

    /// Nomad samples like TPP (256 MB per second of slow-tier hint faults)
    /// and asks for nothing else; it ticks every millisecond.
    #[test]
    fn nomad_asks_for_tpp_hint_faults_on_every_slow_tier() {
        let n = Nomad::new(&PolicyConfig::new(1000, vec![100, 400, 1000]));
        let t = n.trackers();
        assert_eq!(t.hint_fault_tiers, vec![1, 2]);
        assert_eq!(t.hint_scan_pages_per_sec, 65_536.0);
        assert!(!t.dirty_log && !t.accessed_bits && !t.hardware_samples);
        assert_eq!(n.tick_interval_ns(), 1_000_000);
        assert_eq!(n.kind(), PolicyKind::Nomad);
    }

    /// The hand-over: heat 0.75 and up is active, 0.25 and up referenced;
    /// exported, the MPQ is hottest (1.0), then active (0.9), referenced (0.5).
    #[test]
    fn state_hands_over_at_the_heat_boundaries() {
        let (mut n, _, _) = setup();
        n.import_state(&PolicyState {
            from: PolicyKind::Tpp,
            now_ns: 0,
            hot_pages: vec![
                (501, 0.75),
                (502, 0.74),
                (503, 0.25),
                (504, 0.24),
                (5000, 1.0),
            ],
        });
        let f = |n: &Nomad, p: usize| (n.flags[p].active(), n.flags[p].referenced());
        assert_eq!(
            [f(&n, 501), f(&n, 502), f(&n, 503), f(&n, 504)],
            [(true, false), (false, true), (false, true), (false, false)]
        );
        n.enqueue_mpq(700);
        let state = n.export_state();
        assert_eq!(state.from, PolicyKind::Nomad);
        let mut got = state.hot_pages;
        got.sort_by_key(|a| a.0);
        assert_eq!(got, vec![(501, 0.9), (502, 0.5), (503, 0.5), (700, 1.0)]);
    }
}
