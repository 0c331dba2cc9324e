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
}
