//! Steps 5-7 of `adaptive`: the ranking, the latency verdict, the room
//! made, each candidate's placement and mechanism, and the moves emitted.

use super::super::super::testutil::pages_moved_to;
use super::*;

#[test]
fn ranking_fills_each_tier_by_cumulative_capacity_hottest_first() {
    // Reserves of one page each: tier 0 holds 9 ranked pages, tiers 0-1 28.
    let mut a = adaptive(100, &[10, 20, 100]);
    for p in 0..9 {
        heat_up(&mut a, p, 10);
    }
    for p in 9..19 {
        heat_up(&mut a, p, 5);
    }
    for p in 19..39 {
        heat_up(&mut a, p, 2);
    }
    let r = a.rank();
    // The 9 pages of heat 10 fill tier 0 exactly; 19 of heat >= 5 fit tiers 0-1.
    assert_eq!(r.th, vec![6, 3, 0]);
    // Over all 100 pages: mean 1.8, E[h^2] 12.3.
    assert_close(r.mean, 1.8);
    assert_close(r.dispersion, (12.3 - 1.8 * 1.8) / 1.8);
    assert_eq!(
        [33, 6, 5, 4, 3, 2, 0].map(|h| r.target(h)),
        [0, 0, 1, 1, 1, 2, 2]
    );
    // One more hot page than tier 0 holds: none of them fits (heat 11 up
    // does, and no page has it).
    heat_up(&mut a, 50, 10);
    assert_eq!(a.rank().th[0], 11);

    // Nothing tracked: any heat from 1 fits.
    let empty = adaptive(100, &[10, 100]).rank();
    assert_eq!(empty.th, vec![1, 0]);
    assert_eq!((empty.mean, empty.dispersion), (0.0, 0.0));
}

#[test]
fn target_and_the_skew_gate_at_their_bounds() {
    let r = |th: Vec<u16>, dispersion: f64, mean: f64| Ranking {
        th,
        dispersion,
        mean,
    };
    // No tier reached: the slowest.
    assert_eq!(r(vec![6, 3], 0.0, 0.0).target(1), 1);
    assert_eq!(r(vec![], 0.0, 0.0).target(5), 0);
    assert!(r(vec![], 1.0, SKEW_MIN_MEAN_HEAT).no_skew());
    assert!(r(vec![], SKEW_MIN - 0.01, 5.0).no_skew());
    assert!(!r(vec![], SKEW_MIN, 5.0).no_skew());
    assert!(!r(vec![], 1.0, SKEW_MIN_MEAN_HEAT * 0.9).no_skew());
    assert!(skew_note(&r(vec![], 1.0, 1.0)).contains("dispersion 1.00 < 1.03"));
    assert_eq!(skew_note(&r(vec![], 2.0, 1.0)), "");
    assert_eq!(scout_note(0), "");
    assert!(scout_note(3).contains("scout found 3 touched"));
}

#[test]
fn the_latency_verdict_is_colloids_search_between_tiers_0_and_1() {
    let verdict = |tiers: &[TierStatus]| adaptive(100, &[10, 100]).latency_verdict(tiers);
    let no_signal = |v: LatencyVerdict| matches!(v, LatencyVerdict::NoSignal);
    assert!(no_signal(verdict(&[loaded(70.0, 1e6)])));
    assert!(no_signal(verdict(&[loaded(70.0, 1e6), tier(100, 50)])));
    assert!(no_signal(verdict(&[loaded(70.0, 0.0), loaded(135.0, 0.0)])));
    assert!(no_signal(verdict(&[
        loaded(70.0, -1e6),
        loaded(135.0, 0.0)
    ])));
    assert!(no_signal(verdict(&[
        loaded(f64::INFINITY, 1e6),
        loaded(135.0, 1e6)
    ])));
    assert!(no_signal(verdict(&[
        loaded(70.0, 1e6),
        loaded(f64::NAN, 1e6)
    ])));
    // Tier 0 faster, with a quarter of the requests: promote, by the shift
    // Colloid's search computes for that share.
    let want = ShiftSearch::default().compute_shift(0.25, 70.0, 135.0);
    match verdict(&[loaded(70.0, 25.0), loaded(135.0, 75.0)]) {
        LatencyVerdict::Promote(dp) => assert_close(dp, want),
        _ => panic!("tier 0 faster must promote"),
    }
    let want = ShiftSearch::default().compute_shift(0.75, 135.0, 70.0);
    match verdict(&[loaded(135.0, 75.0), loaded(70.0, 25.0)]) {
        LatencyVerdict::Demote(dp) => assert_close(dp, want),
        _ => panic!("tier 0 slower must demote"),
    }
    let mut a = adaptive(100, &[10, 100]).without_balance();
    assert!(no_signal(
        a.latency_verdict(&[loaded(135.0, 75.0), loaded(70.0, 25.0)])
    ));
    assert!(matches!(
        verdict(&[loaded(100.0, 50.0), loaded(103.0, 50.0)]),
        LatencyVerdict::Balanced
    ));
    // A gap of exactly DELTA is not within it (Colloid's strict test).
    assert!(matches!(
        verdict(&[loaded(100.0, 50.0), loaded(105.0, 50.0)]),
        LatencyVerdict::Promote(_)
    ));
    // The tolerance is relative: DELTA of tier 0's latency, at any scale.
    assert!(matches!(
        verdict(&[loaded(0.1, 50.0), loaded(0.5, 50.0)]),
        LatencyVerdict::Promote(_)
    ));
    // Every request in a faster tier 0 already: no shift is left to make.
    assert!(matches!(
        verdict(&[loaded(70.0, 100.0), loaded(135.0, 0.0)]),
        LatencyVerdict::Balanced
    ));
}

#[test]
fn colloids_dynamic_limit_is_the_shifted_requests_in_pages() {
    let a = adaptive(100, &[10, 100]);
    let tiers = [loaded(100.0, 1e6), loaded(200.0, 1e6), loaded(300.0, 5e9)];
    // 0.5 x 2e6 req/s x 20 ms x 64 B / 4 KiB = 312.5 pages, rounded up; a
    // third tier's requests are not Colloid's.
    assert_eq!(a.dynamic_limit(0.5, &tiers, TICK_NS), 313);
    let mut cfg = PolicyConfig::new(100, vec![10, 100]);
    cfg.scale = 2.0;
    assert_eq!(Adaptive::new(&cfg).dynamic_limit(0.5, &tiers, TICK_NS), 157);
    assert_eq!(a.dynamic_limit(0.5, &tiers[..1], 2 * TICK_NS), 313);
    let negative = [loaded(100.0, -5e6), loaded(200.0, 1e6)];
    assert_eq!(a.dynamic_limit(0.5, &negative, TICK_NS), 0);
}

#[test]
fn emit_marks_the_pages_moved_and_takes_the_room_its_mechanism_needs() {
    let mut a = adaptive(100, &[10, 100]);
    a.tick_no = 7;
    let st = [tier(10, 4), tier(100, 10)];
    let mut plan = Plan::new(&st, 100);
    // Page 20: sampled at tick 2, heat 10: after its first sample 9 hits in
    // 5 ticks, 3 at the rate's lower bound (9 - 2 x 3): 15 over EVAL_TICKS.
    heat_up(&mut a, 20, 10);
    a.since[20] = 2;
    a.hits[20] = 5;
    a.writes[20] = 2;
    plan.written = true;
    a.emit(&mut plan, Unit::page(20), 1, 0, Mechanism::TPM);
    assert_eq!((a.hits[20], a.writes[20], a.last_move[20]), (0, 0, 7));
    assert_eq!(a.flags[20] & DEMOTED_BEFORE, 0);
    assert_eq!(a.in_flight, vec![(20, 0, true)]);
    assert_eq!(
        (plan.budget.free(0), plan.budget.free(1)),
        (3, 10),
        "TPM keeps its source"
    );
    assert_eq!(a.thrash.recorded(), vec![(20, true, 7, 15.0)]);
    // A 2-page shadow demotion needs no destination page.
    a.emit(&mut plan, Unit::run(0, 2), 0, 1, Mechanism::ShadowDemotion);
    assert_eq!(a.flags[0] & a.flags[1] & DEMOTED_BEFORE, DEMOTED_BEFORE);
    assert_eq!((plan.budget.free(0), plan.budget.free(1)), (5, 10));
    assert_eq!(
        a.in_flight.len(),
        1,
        "only transactional moves are in flight"
    );
    // A page sampled 17 times this very tick: 16 - 2 x 4 = 8 hits in one tick.
    heat_up(&mut a, 30, 17);
    a.since[30] = 7;
    a.emit(&mut plan, Unit::page(30), 1, 0, Mechanism::StopAndCopy);
    assert_eq!((plan.budget.free(0), plan.budget.free(1)), (4, 11));
    let rec = a.thrash.recorded();
    assert_eq!(
        rec[1..],
        [(0, false, 7, 0.0), (1, false, 7, 0.0), (30, true, 7, 200.0)]
    );
    assert_eq!((a.stats.page_units, a.stats.region_units), (2, 1));
    assert_eq!(plan.moved, 4);
    let to: Vec<(Unit, TierId, Mechanism)> = plan
        .out
        .migrations
        .iter()
        .map(|m| (m.unit, m.to, m.mechanism))
        .collect();
    assert_eq!(
        to,
        vec![
            (Unit::page(20), 0, Mechanism::TPM),
            (Unit::run(0, 2), 1, Mechanism::ShadowDemotion),
            (Unit::page(30), 0, Mechanism::StopAndCopy),
        ]
    );
    assert!(plan
        .out
        .migrations
        .iter()
        .all(|m| m.urgency == Urgency::Background));
}

#[test]
fn demote_cold_pushes_pages_below_the_threshold_to_the_first_tier_with_room() {
    let mut a = adaptive(100, &[10, 5, 100]);
    let mut v = VecView::two_tier(100, 10);
    for p in 0..5 {
        heat_up(&mut a, p, 8);
    }
    heat_up(&mut a, 6, 3);
    v.shadow[7] = true;
    // Tier 1 is full: tier 2 takes them.
    let st = [tier(10, 0), tier(5, 0), tier(100, 90)];
    let mut plan = Plan::new(&st, 100);
    plan.chosen.insert(5);
    assert_eq!(a.demote_cold(&mut plan, 0, 0, 4, &mut v), 0);
    assert_eq!(
        a.demote_cold(&mut plan, 2, 3, 4, &mut v),
        0,
        "nothing below the slowest"
    );
    assert_eq!(a.demote_cold(&mut plan, 0, 3, 4, &mut v), 3);
    let moved = moves(&plan.out);
    // Page 5 was chosen already; 6 is colder than 4; 7 is shadowed, but
    // in tier 1, not 2.
    assert_eq!(
        moved,
        vec![
            (6, 2, Mechanism::StopAndCopy),
            (7, 2, Mechanism::StopAndCopy),
            (8, 2, Mechanism::StopAndCopy)
        ]
    );
    assert_eq!(a.stats.cold_copies, 3);
    assert!([6, 7, 8].iter().all(|p| plan.chosen.contains(p)));
    // No tier below with room: nothing.
    let full = [tier(10, 0), tier(5, 0), tier(100, 0)];
    let mut plan = Plan::new(&full, 100);
    assert_eq!(a.demote_cold(&mut plan, 0, 3, 4, &mut v), 0);
    assert!(plan.out.migrations.is_empty());
}

#[test]
fn a_cold_region_is_demoted_whole_and_by_copy_even_with_a_shadow() {
    // Scale 64: 8-page regions; pages 0-15 in tier 0, 8-15 all cold.
    let mut cfg = PolicyConfig::new(64, vec![16, 64]);
    cfg.scale = 64.0;
    let mut a = Adaptive::new(&cfg);
    let mut v = VecView::two_tier(64, 16);
    for p in 0..8 {
        heat_up(&mut a, p, 8);
    }
    v.shadow[8] = true;
    let st = [tier(16, 0), tier(64, 48)];
    let mut plan = Plan::new(&st, 100);
    assert_eq!(a.demote_cold(&mut plan, 0, 3, 4, &mut v), 8);
    let m = &plan.out.migrations;
    assert_eq!(m.len(), 1);
    assert_eq!(
        (m[0].unit, m[0].to, m[0].mechanism),
        (Unit::run(8, 8), 1, Mechanism::StopAndCopy)
    );
    // Counted as what it is: a copy.
    assert_eq!(
        (
            a.stats.region_units,
            a.stats.shadow_remaps,
            a.stats.cold_copies
        ),
        (1, 0, 1)
    );
    // A cold page of a mixed region with a shadow is remapped, alone.
    let mut a = Adaptive::new(&cfg);
    for p in (0..8).chain([9]) {
        heat_up(&mut a, p, 8);
    }
    let mut plan = Plan::new(&st, 100);
    assert_eq!(a.demote_cold(&mut plan, 0, 1, 4, &mut v), 1);
    let m = &plan.out.migrations;
    assert_eq!(
        (m[0].unit, m[0].mechanism),
        (Unit::page(8), Mechanism::ShadowDemotion)
    );
    assert_eq!(a.stats.shadow_remaps, 1);
}

#[test]
fn push_down_moves_tier_0s_hottest_pages_whose_share_fits_the_shift() {
    // Heat 16 in all: 8, 4, 2, 1 in tier 0 and 1 in tier 1; shares 1/2,
    // 1/4, 1/8 and 1/16.
    let setup = || {
        let mut a = adaptive(100, &[10, 100]);
        for (p, h) in [(0, 8), (1, 4), (2, 2), (3, 1), (50, 1)] {
            heat_up(&mut a, p, h);
        }
        a
    };
    let mut v = VecView::two_tier(100, 10);
    v.shadow[2] = true;
    let st = [tier(10, 6), tier(100, 90)];
    let mut a = setup();
    let mut plan = Plan::new(&st, 100);
    // 5/8: 1/2 and then 1/8 fit; 1/4 does not after 1/2.
    assert_eq!(a.push_down(&mut plan, 0.625, &mut v), 2);
    let moved = moves(&plan.out);
    assert_eq!(
        moved,
        vec![
            (0, 1, Mechanism::StopAndCopy),
            (2, 1, Mechanism::ShadowDemotion)
        ]
    );
    assert_eq!((a.stats.cold_copies, a.stats.shadow_remaps), (1, 1));
    assert!(plan.chosen.contains(&0) && plan.chosen.contains(&2));
    // The limit stops it; so does a full tier 1.
    let mut plan = Plan::new(&st, 1);
    assert_eq!(setup().push_down(&mut plan, 0.625, &mut v), 1);
    let full = [tier(10, 6), tier(100, 0)];
    let mut plan = Plan::new(&full, 100);
    assert_eq!(setup().push_down(&mut plan, 0.625, &mut v), 0);
}

#[test]
fn candidates_are_tracked_pages_slower_than_their_target_hottest_first() {
    let mut a = adaptive(100, &[10, 20, 100]);
    let mut tiers = vec![2; 100];
    tiers[5] = 0;
    tiers[60] = 1;
    let v = view_of(tiers);
    assert_eq!(a.total_heat(), 1.0, "at least 1");
    for (p, h) in [(51, 10), (50, 10), (60, 12), (5, 12), (70, 4), (80, 1)] {
        heat_up(&mut a, p, h);
    }
    assert_eq!(a.total_heat(), 49.0);
    let rank = Ranking {
        th: vec![10, 4, 0],
        dispersion: 2.0,
        mean: 1.0,
    };
    let got = |min_dst: TierId| -> Vec<(u64, u16, TierId)> {
        a.promotion_candidates(&rank, min_dst, &v)
            .iter()
            .map(|c| (c.page, c.heat, c.dst))
            .collect()
    };
    assert_eq!(
        got(0),
        vec![(60, 12, 0), (50, 10, 0), (51, 10, 0), (70, 4, 1)]
    );
    // Not above tier 1: page 60 is there already.
    assert_eq!(got(1), vec![(50, 10, 1), (51, 10, 1), (70, 4, 1)]);
}

#[test]
fn a_promotion_takes_its_mechanism_from_the_whole_units_writes_and_aborts() {
    let mut cfg = PolicyConfig::new(64, vec![16, 64]);
    cfg.scale = 64.0; // 8-page regions
    let mut a = Adaptive::new(&cfg);
    a.writes[18] = 2;
    a.aborts[20] = mechanism::ABORT_LIMIT;
    heat_up(&mut a, 16, 20);
    let st = [tier(16, 8), tier(64, 8)];
    let mut plan = Plan::new(&st, 100);
    let placed = Placement {
        src: 1,
        dst: 0,
        th: 4,
        unit: Unit::run(16, 8),
    };
    assert_eq!(a.promote(&mut plan, 16, &placed), 8);
    let m = &plan.out.migrations[0];
    assert_eq!(
        (m.unit, m.to, m.mechanism),
        (Unit::run(16, 8), 0, Mechanism::StopAndCopy)
    );
    assert_eq!(a.stats.write_hot_stop_copy, 1);
    assert!(plan.written, "the unit was written");
    assert!((16..24).all(|p| plan.chosen.contains(&p)));
    assert!(!plan.chosen.contains(&24));
    // The page alone: clean, well above the threshold: TPM without a shadow.
    let placed = Placement {
        unit: Unit::page(16),
        ..placed
    };
    let mut plan = Plan::new(&st, 100);
    plan.written = true;
    assert_eq!(a.promote(&mut plan, 16, &placed), 1);
    assert_eq!(
        plan.out.migrations[0].mechanism,
        Mechanism::Transactional { keep_shadow: false }
    );
    assert!(!plan.written);
    assert_eq!(a.stats.clean_tpm, 1);
    // A clean page keeps a shadow when its heat is marginal (below the
    // threshold plus SHADOW_MARGIN) or it was demoted before.
    heat_up(&mut a, 40, 5);
    heat_up(&mut a, 41, 20);
    a.flags[41] |= DEMOTED_BEFORE;
    heat_up(&mut a, 42, 6);
    let mechs: Vec<Mechanism> = [40, 41, 42]
        .iter()
        .map(|&p| {
            let mut plan = Plan::new(&st, 100);
            let placed = Placement {
                unit: Unit::page(p),
                ..placed
            };
            a.promote(&mut plan, p, &placed);
            plan.out.migrations[0].mechanism
        })
        .collect();
    let clean = Mechanism::Transactional { keep_shadow: false };
    assert_eq!(mechs, vec![Mechanism::TPM, Mechanism::TPM, clean]);
    assert_eq!((a.stats.shadowed_tpm, a.stats.clean_tpm), (2, 2));
}

#[test]
fn placement_takes_the_fastest_tier_with_room_that_the_page_may_displace_into() {
    // Reserves 4, 1 and 1; page 50 in tier 2.
    let mut a = adaptive(100, &[1000, 20, 100]);
    let v = view_of(vec![2; 100]);
    let rank = Ranking {
        th: vec![10, 4, 0],
        dispersion: 2.0,
        mean: 1.0,
    };
    let c = |heat: u16| Candidate {
        heat,
        page: 50,
        dst: 0,
    };
    let calm = [false; 3];
    let at = |a: &Adaptive, free0: u64, displaced: [bool; 3], tight: &[bool], heat: u16| {
        let st = [tier(1000, free0), tier(20, 10), tier(100, 50)];
        let mut plan = Plan::new(&st, 100);
        plan.displaced = displaced.to_vec();
        a.placement(&plan, &rank, tight, &c(heat), &v)
            .map(|p| (p.src, p.dst, p.th, p.unit))
    };
    // A page and half the reserve must fit: 1 + 2 pages.
    assert_eq!(
        at(&a, 3, [false; 3], &calm, 12),
        Some((2, 0, 10, Unit::page(50)))
    );
    assert_eq!(
        at(&a, 2, [false; 3], &calm, 12),
        Some((2, 1, 4, Unit::page(50)))
    );
    // Into a tier that displaced pages, the target needs twice its threshold.
    assert_eq!(
        at(&a, 9, [true, false, false], &calm, 19).map(|p| p.1),
        Some(1)
    );
    assert_eq!(
        at(&a, 9, [true, false, false], &calm, 20).map(|p| p.1),
        Some(0)
    );
    // A fallback tier only its threshold.
    assert_eq!(
        at(&a, 0, [false, true, false], &calm, 4).map(|p| p.1),
        Some(1)
    );
    assert_eq!(at(&a, 0, [false, true, false], &calm, 3).map(|p| p.1), None);
    // A bursty page does not displace: not into a tight tier either.
    a.flags[50] |= BURSTY;
    assert_eq!(
        at(&a, 9, [false; 3], &[true, false, false], 30).map(|p| p.1),
        Some(1)
    );
    assert_eq!(at(&a, 9, [false; 3], &calm, 30).map(|p| p.1), Some(0));
    a.flags[50] &= !BURSTY;
    assert_eq!(
        at(&a, 9, [false; 3], &[true, false, false], 30).map(|p| p.1),
        Some(0)
    );
    // Nor does any page while a stream is seen.
    stream_seen(&mut a);
    assert_eq!(
        at(&a, 9, [false; 3], &[true, false, false], 30).map(|p| p.1),
        Some(1)
    );
    // A page already at its target: nowhere.
    let v0 = view_of(vec![0; 100]);
    let st = [tier(1000, 9), tier(20, 10), tier(100, 50)];
    let plan = Plan::new(&st, 100);
    assert!(a.placement(&plan, &rank, &calm, &c(30), &v0).is_none());
}

#[test]
fn room_is_made_for_the_strong_candidates_the_reserve_and_the_spill_from_above() {
    // Reserves 4, 1 and 1; every page in tier 2 but page 60, in tier 1.
    let mut a = adaptive(100, &[1000, 20, 100]);
    let mut tiers = vec![2; 100];
    tiers[60] = 1;
    let v = view_of(tiers);
    let rank = Ranking {
        th: vec![10, 4, 0],
        dispersion: 2.0,
        mean: 1.0,
    };
    let cands: Vec<Candidate> = [
        (50, 25, 0),
        (51, 20, 0),
        (52, 12, 0),
        (60, 15, 0),
        (70, 5, 1),
    ]
    .into_iter()
    .map(|(page, heat, dst)| Candidate { heat, page, dst })
    .collect();
    let need = |a: &Adaptive, free: [u64; 2], limit: u64, dst: TierId| {
        let st = [tier(1000, free[0]), tier(20, free[1]), tier(100, 50)];
        let plan = Plan::new(&st, limit);
        a.room_needed(&plan, &rank, &cands, dst, &v)
    };
    // Tier 0: 4 candidates and the reserve less 2 free is 6; but only the
    // 2 of twice the threshold displace: 2 + 4 - 2.
    assert_eq!(need(&a, [2, 1], 100, 0), 4);
    // Half the budget left bounds the candidates counted: 1 + 4 - 2.
    assert_eq!(need(&a, [2, 1], 2, 0), 3);
    // Tier 1: its candidate and reserve, less 1 free, and the 3 tier-0
    // candidates below it that spill into it while tier 0 has no room
    // above its reserve (page 60 is in tier 1 already); 2 pages above it
    // take 2 of them; half the budget left bounds the spill.
    assert_eq!(need(&a, [2, 1], 100, 1), 4);
    assert_eq!(need(&a, [6, 1], 100, 1), 2);
    assert_eq!(need(&a, [2, 1], 2, 1), 2);
    // A bursty page does not displace, nor spill.
    a.flags[51] |= BURSTY;
    assert_eq!(need(&a, [2, 1], 100, 0), 3);
    assert_eq!(need(&a, [2, 1], 100, 1), 3);
    // While a stream is seen, no page does: the reserve only (tier 1's
    // free page is its reserve).
    stream_seen(&mut a);
    assert_eq!(need(&a, [2, 1], 100, 0), 2);
    assert_eq!(need(&a, [2, 1], 100, 1), 0);
}

#[test]
fn pack_promotes_hottest_first_within_the_limit_and_colloids_share() {
    // Tier 0 holds pages 0 and 1 of its 10; heat 16 in all.
    let setup = || {
        let mut a = adaptive(100, &[10, 100]);
        for (p, h) in [(50, 8), (51, 4), (52, 2), (53, 1), (1, 1)] {
            heat_up(&mut a, p, h);
        }
        a
    };
    let mut v = VecView::two_tier(100, 2);
    let st = v.status(&[10, 100]);
    let rank = Ranking {
        th: vec![1, 0],
        dispersion: 2.0,
        mean: 1.0,
    };
    let up = |share: Option<f64>, min_dst: TierId, limit: u64, chosen: &[u64], v: &mut VecView| {
        let mut a = setup();
        let mut plan = Plan::new(&st, limit);
        plan.chosen.extend(chosen);
        let n = a.pack(&mut plan, &rank, share, min_dst, v);
        let pages = pages_moved_to(&plan.out, 0);
        assert_eq!(n, pages.len() as u64);
        pages
    };
    assert_eq!(up(None, 0, 100, &[], &mut v), vec![50, 51, 52, 53]);
    // Shares 1/2, 1/4, 1/8, 1/16 of the requests: 5/8 takes the first and third.
    assert_eq!(up(Some(0.625), 0, 100, &[], &mut v), vec![50, 52]);
    assert_eq!(up(None, 0, 1, &[], &mut v), vec![50]);
    assert_eq!(up(None, 0, 100, &[50], &mut v), vec![51, 52, 53]);
    assert_eq!(up(None, 1, 100, &[], &mut v), Vec::<u64>::new());
}

#[test]
fn room_is_made_only_where_the_heat_is_skewed() {
    // Tier 0 full of cold pages; page 50 of heat 8 (twice tier 0's 4).
    let mut v = VecView::two_tier(100, 10);
    let st = v.status(&[10, 100]);
    let run = |dispersion: f64, v: &mut VecView| {
        let mut a = adaptive(100, &[10, 100]);
        heat_up(&mut a, 50, 8);
        let rank = Ranking {
            th: vec![4, 0],
            dispersion,
            mean: 1.0,
        };
        let mut plan = Plan::new(&st, 100);
        let n = a.pack(&mut plan, &rank, None, 0, v);
        (n, pages_moved_to(&plan.out, 1), plan.displaced[0])
    };
    // Room for it and the reserve: pages 0 and 1 down, then it goes up.
    assert_eq!(run(2.0, &mut v), (1, vec![0, 1], true));
    // No skew: nothing is displaced, and there is no room.
    assert_eq!(run(1.0, &mut v), (0, vec![], false));
}

#[test]
fn each_verdict_plans_its_moves_and_says_so() {
    // Page 0 (tier 0) and page 50 (tier 1), heat 8 each.
    let mut v = VecView::two_tier(100, 2);
    let mut st = v.status(&[10, 100]);
    for (t, l) in st.iter_mut().zip([135.0, 70.0]) {
        t.loaded_latency_ns = Some(l);
        t.request_rate = Some(1_000.0);
    }
    let rank = Ranking {
        th: vec![1, 0],
        dispersion: 2.0,
        mean: 1.0,
    };
    let mut plan_with = |verdict: LatencyVerdict| {
        let mut a = adaptive(100, &[10, 100]);
        heat_up(&mut a, 0, 8);
        heat_up(&mut a, 50, 8);
        let mut plan = Plan::new(&st, 100);
        let (mode, why) = a.plan_moves(&mut plan, &rank, verdict, &mut v);
        (
            mode,
            why,
            plan.limit,
            pages_moved_to(&plan.out, 0),
            pages_moved_to(&plan.out, 1),
        )
    };
    // Colloid's dynamic limit: 0.5 x 2000 req/s x 20 ms x 64 B is under a page: 1.
    let (mode, why, limit, up, down) = plan_with(LatencyVerdict::Demote(0.5));
    assert_eq!((mode, limit, up, down), (Mode::Balance, 1, vec![], vec![0]));
    assert_eq!(
        why,
        "tier 0 loaded latency 135 ns above tier 1's 70 ns: moving 50.0% of requests down (1 pages down, 0 packed below)"
    );
    let (mode, why, limit, up, down) = plan_with(LatencyVerdict::Balanced);
    assert_eq!(
        (mode, limit, up, down),
        (Mode::Balance, 100, vec![], vec![])
    );
    assert_eq!(
        why,
        "tiers 0 and 1 balanced (loaded latency 135 vs 70 ns, within 5%): 0 pages packed below"
    );
    let (mode, why, _, up, _) = plan_with(LatencyVerdict::Promote(0.5));
    assert_eq!((mode, up), (Mode::Promote, vec![50]));
    assert_eq!(
        why,
        "1 pages up (hot threshold heat 1 for tier 0; tier 0 faster: 135 vs 70 ns, up to 50.0% of requests)"
    );
    // Half the requests do not take page 50's share when it is more.
    let (_, _, _, up, _) = plan_with(LatencyVerdict::Promote(0.4));
    assert_eq!(up, Vec::<u64>::new());
    let (mode, why, _, up, _) = plan_with(LatencyVerdict::NoSignal);
    assert_eq!((mode, up), (Mode::Promote, vec![50]));
    assert_eq!(
        why,
        "1 pages up (hot threshold heat 1 for tier 0; no latency signal)"
    );
}

#[test]
fn demote_cold_stops_once_a_region_freed_what_was_wanted() {
    // Scale 64: 8-page regions. Tier 0 holds pages 0-31; page 0 is hot, so
    // region 0-7 moves page by page and regions 8-15 and 16-23 whole.
    let mut cfg = PolicyConfig::new(64, vec![32, 64]);
    cfg.scale = 64.0;
    let mut a = Adaptive::new(&cfg);
    let mut v = VecView::two_tier(64, 32);
    heat_up(&mut a, 0, 8);
    let st = [tier(32, 0), tier(64, 32)];
    // The clock hand stops at page 14, inside region 8-15.
    let mut plan = Plan::new(&st, 100);
    assert_eq!(a.demote_cold(&mut plan, 0, 13, 4, &mut v), 15);
    // From page 14 it finds 14, 15 and 16: region 8-15 frees 8 >= 3, so
    // region 16-23 stays.
    let mut plan = Plan::new(&st, 100);
    assert_eq!(a.demote_cold(&mut plan, 0, 3, 4, &mut v), 8);
    let units: Vec<Unit> = plan.out.migrations.iter().map(|m| m.unit).collect();
    assert_eq!(units, vec![Unit::run(8, 8)]);
}

#[test]
fn a_tier_near_its_reserve_takes_no_burst_even_without_displacing_this_tick() {
    // Reserves of 4: a tier 0 with 8 free (twice the reserve) or fewer is
    // tight. The heat shows no skew, so nothing is displaced this tick.
    let rank = Ranking {
        th: vec![1, 0],
        dispersion: 1.0,
        mean: 1.0,
    };
    let mut v = VecView::two_tier(100, 0);
    let up = |free0: u64, bursty: bool, v: &mut VecView| {
        let mut a = adaptive(100, &[1000, 1000]);
        heat_up(&mut a, 50, 8);
        if bursty {
            a.flags[50] |= BURSTY;
        }
        let st = [tier(1000, free0), tier(1000, 900)];
        let mut plan = Plan::new(&st, 100);
        a.pack(&mut plan, &rank, None, 0, v)
    };
    assert_eq!(up(8, true, &mut v), 0);
    assert_eq!(up(9, true, &mut v), 1);
    assert_eq!(up(8, false, &mut v), 1);
}
