//! Behaviour tests of `adaptive`, each with a scenario built to trigger it.
//! The thrash-throttling and mechanism-choice scenarios are checks that
//! return an error; each runs once with the feature and once with it
//! switched off (negative control), which must fail the check.

use super::super::testutil::{obs, sample, VecView};
use super::*;
use crate::sim::{self, SimPlacement, SimReport};

fn caps_status(v: &VecView, caps: &[u64]) -> Vec<TierStatus> {
    v.status(caps)
}

/// Mechanism choice on a two-tier page map: a clean hot page is promoted
/// by TPM, a marginal clean one by TPM with a shadow, a write-hot page by
/// TPM until it has aborted [`mechanism::ABORT_LIMIT`] times and then by
/// stop-and-copy, a shadowed page demoted by remap.
fn mechanism_scenario(mut a: Adaptive) -> Result<(), String> {
    let caps = [40u64, 200];
    let mut v = VecView::two_tier(200, 20);
    let mut mechs: Vec<(u64, Mechanism)> = Vec::new();
    for round in 0..3u64 {
        let mut s = Vec::new();
        for _ in 0..6 {
            s.push(sample(100, 1, false)); // clean and hot
            s.push(sample(120, 1, true)); // written and hot
        }
        if round == 0 {
            s.push(sample(110, 1, false)); // clean, just above the threshold
        }
        let st = caps_status(&v, &caps);
        let outcomes: Vec<TpmOutcome> = a
            .in_flight
            .iter()
            .map(|&(p, _, _)| TpmOutcome {
                page: p,
                // The write-hot page's transactions abort.
                committed: p != 120,
            })
            .collect();
        let o = Observations {
            now_ns: round * TICK_NS,
            tiers: &st,
            samples: &s,
            tpm_outcomes: &outcomes,
            dirty: &[],
        };
        let d = a.tick(&o, &mut v);
        for m in &d.migrations {
            mechs.push((m.unit.page, m.mechanism));
            // Only committed moves land; page 120 aborts while on TPM.
            if m.unit.page == 120 && matches!(m.mechanism, Mechanism::Transactional { .. }) {
                continue;
            }
            v.apply(std::slice::from_ref(m));
        }
    }
    let of =
        |p: u64| -> Vec<Mechanism> { mechs.iter().filter(|m| m.0 == p).map(|m| m.1).collect() };
    if of(100) != vec![Mechanism::Transactional { keep_shadow: false }] {
        return Err(format!("clean hot page 100: {:?}", of(100)));
    }
    if of(110) != vec![Mechanism::TPM] {
        return Err(format!(
            "marginal page 110 should keep a shadow: {:?}",
            of(110)
        ));
    }
    let w = of(120);
    let expect = vec![
        Mechanism::Transactional { keep_shadow: false },
        Mechanism::Transactional { keep_shadow: false },
        Mechanism::StopAndCopy,
    ];
    if w != expect {
        return Err(format!(
            "write-hot page 120: {w:?}, want TPM twice then stop-and-copy"
        ));
    }
    if a.stats.write_hot_stop_copy != 1 || a.aborts(120) != mechanism::ABORT_LIMIT {
        return Err(format!("stats {:?}", a.stats));
    }
    // A shadowed cold page in the fast tier is demoted by remap.
    let (m, _) = a.chooser.demotion(Some(1), 1);
    if m != Mechanism::ShadowDemotion {
        return Err(format!("shadowed demotion: {m:?}"));
    }
    Ok(())
}

#[test]
fn mechanism_is_chosen_per_page() {
    let cfg = PolicyConfig::new(200, vec![40, 200]);
    mechanism_scenario(Adaptive::new(&cfg)).unwrap();
}

#[test]
fn mechanism_check_fails_with_a_fixed_mechanism() {
    let cfg = PolicyConfig::new(200, vec![40, 200]);
    let err = mechanism_scenario(Adaptive::new(&cfg).with_fixed_mechanism())
        .expect_err("negative control: a fixed mechanism must fail the check");
    assert!(
        err.contains("page 100") || err.contains("page 120"),
        "{err}"
    );
}

fn quick(name: &str, duration_s: f64, scale: f64) -> sim::Scenario {
    let mut s = sim::builtin(name).expect("built-in");
    s.duration_s = duration_s;
    s.scale = scale;
    s
}

fn run(scn: &sim::Scenario, build: impl FnOnce(&PolicyConfig) -> Adaptive) -> SimReport {
    sim::run_built(scn, SimPlacement::FirstTouch, |cfg| {
        Ok(Box::new(build(cfg)) as Box<dyn Policy>)
    })
    .expect("runs")
}

fn share(r: &SimReport, mode: &str) -> f64 {
    let total: u64 = r.modes.iter().map(|m| m.ticks).sum::<u64>().max(1);
    r.modes
        .iter()
        .filter(|m| m.mode == mode)
        .map(|m| m.ticks)
        .sum::<u64>() as f64
        / total as f64
}

/// Thrashing: Colloid's GUPS without antagonist, where a 24 GiB hot set
/// in a 32 GiB fast tier leaves sampled heat so sparse that packing keeps
/// trading pages whose return cannot be told from noise (Colloid and
/// Memtis move ~40M pages each way). The policy must detect it, spend
/// most ticks throttled and lose nothing against the same policy without
/// the throttle. (With the skew gate and hysteresis in place, the throttle
/// no longer changes how many pages move here: docs/results.md §11.)
fn thrash_scenario(r: &SimReport, unthrottled: &SimReport) -> Result<(), String> {
    let throttled = share(r, Mode::Throttled.name());
    if throttled < 0.5 {
        return Err(format!(
            "throttled {:.0}% of ticks; modes {:?}",
            throttled * 100.0,
            r.modes
        ));
    }
    if r.throughput_maps < 0.99 * unthrottled.throughput_maps {
        return Err(format!(
            "throughput {} below unthrottled {}",
            r.throughput_maps, unthrottled.throughput_maps
        ));
    }
    Ok(())
}

#[test]
fn thrashing_is_detected_and_throttled_and_not_without_the_control() {
    let scn = quick("colloid-gups-0x", 60.0, 8192.0);
    let on = run(&scn, Adaptive::new);
    let off = run(&scn, |c| Adaptive::new(c).without_thrash_control());
    thrash_scenario(&on, &off).unwrap();
    // Negative control: the same check on the run without the control fails.
    let err = thrash_scenario(&off, &on).expect_err("without thrash control the check must fail");
    assert!(err.contains("throttled 0%"), "{err}");
    let why = on
        .final_mode
        .as_ref()
        .map(|m| m.why.clone())
        .unwrap_or_default();
    assert!(why.contains("their cost"), "explained: {why}");
}

/// The throttle's cut pays: a 1 GiB hot window that jumps every 0.2 s over
/// 12 GiB (stress-moving-hot, faster): a promoted page is cold again before
/// it has earned its copy, with real skew (the skew gate is open) and no
/// burst pattern the stream detector judges. Static placement is the
/// best one can do; the check wants adaptive at least at static's level,
/// which it reaches only by cutting its budget.
fn thrash_pays_scenario(r: &SimReport, st: &SimReport) -> Result<(), String> {
    if r.throughput_maps < st.throughput_maps {
        return Err(format!(
            "throughput {} below static {} ({} promotions)",
            r.throughput_maps, st.throughput_maps, r.counters.promotions
        ));
    }
    if share(r, Mode::Throttled.name()) < 0.1 {
        return Err(format!("throttled on few ticks: {:?}", r.modes));
    }
    Ok(())
}

#[test]
fn the_throttle_cut_pays_where_hot_pages_cool_before_they_earn_their_copy() {
    let mut scn = quick("stress-moving-hot", 60.0, 1024.0);
    scn.workload = sim::workload::WorkloadSpec::MovingHot {
        size_gib: 12.0,
        hot_gib: 1.0,
        hot_prob: 0.9,
        move_every_s: 0.2,
    };
    let st = sim::run(&scn, PolicyKind::Static).unwrap();
    let on = run(&scn, Adaptive::new);
    let off = run(&scn, |c| Adaptive::new(c).without_thrash_control());
    thrash_pays_scenario(&on, &st).unwrap();
    assert!(
        on.throughput_maps > off.throughput_maps
            && on.counters.promotions < 0.8 * off.counters.promotions,
        "throttled {} ({} promotions) vs unthrottled {} ({})",
        on.throughput_maps,
        on.counters.promotions,
        off.throughput_maps,
        off.counters.promotions
    );
    // Negative control: without the throttle it falls below static.
    let err = thrash_pays_scenario(&off, &st).expect_err("without the throttle the check fails");
    assert!(err.contains("below static"), "{err}");
}

/// Phase change: hot set A (pages 50..60) for 40 ticks, then hot set B
/// (70..80) for 40. Returns the ticks B took to be all in the fast tier
/// (`None`: not within the 40) and the pattern changes detected.
fn phase_scenario(mut a: Adaptive) -> Result<(Option<u64>, u64), String> {
    let caps = [20u64, 100];
    let mut v = VecView::two_tier(100, 18);
    let mut followed = None;
    let step = |a: &mut Adaptive, v: &mut VecView, hot: std::ops::Range<u64>, t: u64| {
        let s: Vec<AccessSample> = (0..4)
            .flat_map(|_| hot.clone())
            .map(|p| sample(p, v.tier[p as usize], false))
            .collect();
        let st = v.status(&caps);
        let d = a.tick(&obs(t * TICK_NS, &st, &s), v);
        v.apply(&d.migrations);
    };
    for t in 0..40u64 {
        step(&mut a, &mut v, 50..60, t);
    }
    if !(50..60).all(|p| v.tier[p] == 0) {
        return Err(format!("hot set A not in tier 0: {:?}", &v.tier[50..60]));
    }
    for t in 0..40u64 {
        step(&mut a, &mut v, 70..80, 40 + t);
        if followed.is_none() && (70..80).all(|p| v.tier[p] == 0) {
            followed = Some(t + 1);
        }
    }
    Ok((followed, a.stats.phase_changes))
}

/// The detected change cools A's heat and lifts the throttle, so B is in
/// within 6 ticks (4 on this code); without detection B waits for A's heat
/// to fall below its own (9 ticks on this code): the negative control
/// fails on the time, not only on the count of changes.
#[test]
fn a_moved_hot_set_is_followed() {
    let cfg = PolicyConfig::new(100, vec![20, 100]);
    let (on, changes) = phase_scenario(Adaptive::new(&cfg)).unwrap();
    assert!(on.is_some_and(|n| n <= 6), "followed after {on:?} ticks");
    assert!(changes >= 1);
    let (off, changes) = phase_scenario(Adaptive::new(&cfg).without_phase_detection()).unwrap();
    assert_eq!(changes, 0);
    assert!(
        off.is_none_or(|n| n > 6),
        "negative control: without detection followed after {off:?} ticks"
    );
}

/// Two tiers (Nomad's small read-only Zipf) and three tiers (Nomad's
/// medium read-only Zipf, a 13.5 GiB working set, over a 4 GiB fast tier,
/// an 8 GiB middle tier at 250 ns and the slow tier): better than no
/// migration, every decision carried out, every tier serves and migrates,
/// and the hottest data fastest. With three tiers first touch fills the
/// fast and middle tiers in address order; pages ranked for the full fast
/// tier must fall back to the middle one (MTM §6), or the middle tier
/// keeps colder pages than the slowest (accesses per page held: 1978 / 129
/// / 99 with the fallback; 714 / 4 / 298 without it, and 0.71x the
/// throughput; results §11).
#[test]
fn two_and_three_tier_runs_place_hot_data_fastest() {
    // Hot pages spread along the WSS (the zipf image's scrambled Zipf, not
    // Nomad's hottest-first traces, where first touch already puts most of
    // the hot set in fast memory).
    let spread = |mut scn: sim::Scenario| {
        if let sim::workload::WorkloadSpec::Zipf { ycsb_trace, .. } = &mut scn.workload {
            *ycsb_trace = None;
        }
        scn
    };
    let two = spread(quick("nomad-small-ro", 40.0, 1024.0));
    let mut three = spread(quick("nomad-medium-ro", 40.0, 128.0));
    let mut mid = three.tiers[1].clone();
    mid.name = "CXL-near".into();
    mid.capacity_gib = 8.0;
    mid.unloaded_ns = 250.0;
    three.tiers[0].capacity_gib = 4.0;
    three.tiers.insert(1, mid);
    for scn in [&two, &three] {
        let st = sim::run(scn, PolicyKind::Static).unwrap();
        let ad = sim::run(scn, PolicyKind::Adaptive).unwrap();
        let n = scn.tiers.len();
        assert_eq!(ad.counters.rejected, 0.0, "{n} tiers");
        assert!(
            ad.throughput_maps > 1.1 * st.throughput_maps,
            "{n} tiers: adaptive {} vs static {}",
            ad.throughput_maps,
            st.throughput_maps
        );
        assert!(
            ad.tiers
                .iter()
                .all(|t| t.accesses > 0.0 && t.migration_gb > 0.0),
            "{n} tiers: every tier serves accesses and takes part in migration"
        );
        // Accesses per page held fall from the fastest tier to the slowest.
        let density: Vec<f64> = ad
            .tiers
            .iter()
            .map(|t| t.accesses / t.pages_at_end.max(1.0))
            .collect();
        assert!(
            density.windows(2).all(|w| w[0] > w[1]),
            "{n} tiers: {density:?}"
        );
        assert!(ad.final_mode.is_some());
    }
}

/// Loaded-latency balancing: with Colloid's 3x antagonist on the fast
/// tier, adaptive enters `balance` on the latency signal and does at least
/// as well as leaving pages where they are, and better than itself
/// without `balance`.
fn balance_scenario(r: &SimReport, st: &SimReport) -> Result<(), String> {
    if r.throughput_maps < st.throughput_maps {
        return Err(format!(
            "throughput {} below static {}",
            r.throughput_maps, st.throughput_maps
        ));
    }
    let balanced = r
        .mode_changes
        .iter()
        .any(|c| c.mode == Mode::Balance.name() && c.why.contains("loaded latency"));
    if !balanced {
        return Err(format!("never balanced: {:?}", r.mode_changes));
    }
    Ok(())
}

#[test]
fn a_loaded_fast_tier_is_balanced() {
    let scn = quick("colloid-gups-3x", 60.0, 8192.0);
    let ad = run(&scn, Adaptive::new);
    let off = run(&scn, |c| Adaptive::new(c).without_balance());
    let st = sim::run(&scn, PolicyKind::Static).unwrap();
    balance_scenario(&ad, &st).unwrap();
    assert!(
        ad.throughput_maps > off.throughput_maps,
        "balance {} vs without {}",
        ad.throughput_maps,
        off.throughput_maps
    );
    // Negative control: without `balance` it loses to static (206.7 vs
    // 212.9 Macc/s on this code; with it 213.8).
    let err = balance_scenario(&off, &st).expect_err("negative control: without balance");
    assert!(err.contains("below static"), "{err}");
}

/// The scout: YCSB-A over a key-value store demoted to the slow tier, with
/// room for all of it in the fast tier. Sparse samples find the warm keys
/// late; the scout's accessed-bit tests find them while there is room. The
/// negative control (no scout) must do worse.
#[test]
fn the_scout_fills_free_room_faster_than_samples() {
    let mut scn = quick("kv-ycsb-a", 100.0, 256.0);
    // The store's memory behaviour alone (Redis' CPU time per request
    // would hide any placement's effect).
    scn.compute_ns_per_op = 0.0;
    let on = run(&scn, Adaptive::new);
    let off = run(&scn, |c| Adaptive::new(c).without_scout());
    assert!(
        on.throughput_maps > 1.03 * off.throughput_maps,
        "scout {} vs none {}",
        on.throughput_maps,
        off.throughput_maps
    );
    let why = on
        .mode_changes
        .iter()
        .any(|c| c.why.contains("scout found"));
    assert!(why, "explained: {:?}", on.final_mode);
}

/// Streams: PageRank's CSR edges are streamed through a fast tier too small
/// for them; without the burst detector adaptive keeps promoting the page
/// the stream just left and demoting the one it reaches next.
///
/// Ignored since `pagerank-u` starts where GAPBS's build leaves its pages
/// and its trace counts cache lines (one access per 16 neighbor ids, not
/// one per id): the contributions start fast, and an edge page gets 64
/// accesses a pass instead of 1024, so no promotion looks like a burst.
/// With the fast tier at 1-4.73 GiB and every page starting slow, the
/// detector changed nothing (same throughput and promotions with and
/// without it). The test needs a scenario whose stream is still a burst.
#[test]
#[ignore = "pagerank-u no longer streams through a small fast tier (see doc comment)"]
fn a_stream_stops_displacing_promotions() {
    let scn = quick("pagerank-u", 100.0, 256.0);
    let on = run(&scn, Adaptive::new);
    let off = run(&scn, |c| Adaptive::new(c).without_burst_detection());
    assert!(
        on.throughput_maps > 1.05 * off.throughput_maps
            && on.counters.promotions < 0.5 * off.counters.promotions,
        "bursts {} ({} promotions) vs none {} ({})",
        on.throughput_maps,
        on.counters.promotions,
        off.throughput_maps,
        off.counters.promotions
    );
}

/// Hot pages on the slow tier, sampled for a few ticks, with the tiers'
/// unloaded latencies `u`: the pages `adaptive` moved and its final mode.
fn moves_with_unloaded(u: Option<(f64, f64)>) -> (usize, Mode, String) {
    let caps = [40u64, 200];
    let mut v = VecView::two_tier(200, 20);
    let mut a = Adaptive::new(&PolicyConfig::new(200, caps.to_vec()));
    let mut moved = 0;
    for round in 0..5u64 {
        let s: Vec<AccessSample> = (0..10)
            .flat_map(|_| (100..110).map(|p| sample(p, 1, false)))
            .collect();
        let mut st = caps_status(&v, &caps);
        if let Some((u0, u1)) = u {
            st[0].unloaded_latency_ns = Some(u0);
            st[1].unloaded_latency_ns = Some(u1);
        }
        let o = Observations {
            now_ns: round * TICK_NS,
            tiers: &st,
            samples: &s,
            tpm_outcomes: &[],
            dirty: &[],
        };
        let d = a.tick(&o, &mut v);
        moved += d.migrations.len();
        v.apply(&d.migrations);
    }
    (moved, a.current_mode(), a.why.clone())
}

#[test]
fn equally_fast_tiers_hold_and_a_measured_gap_promotes() {
    // The same DRAM under both tiers (one NUMA node, no emulation).
    let (moved, mode, why) = moves_with_unloaded(Some((296.0, 296.0)));
    assert_eq!((moved, mode), (0, Mode::Hold), "{why}");
    assert!(why.contains("296 vs 296 ns"), "{why}");
    // Within Colloid's 5% still holds; 6% apart does not.
    assert_eq!(moves_with_unloaded(Some((100.0, 104.9))).1, Mode::Hold);
    // Negative controls: a measured gap, and no measurement at all, promote.
    for u in [Some((100.0, 106.0)), Some((80.0, 135.0)), None] {
        let (moved, mode, why) = moves_with_unloaded(u);
        assert!(moved > 0, "{u:?}: nothing moved ({mode:?}: {why})");
        assert_ne!(mode, Mode::Hold, "{u:?}");
    }
}

/// Hot pages 700 and 1500 on the slow tier of a 2048-page guest (two
/// tiers of 1024 and 2048 pages), page 600 already promoted alone, so
/// region 1 (pages 512-1023) is split and region 2 (1024-1535) whole:
/// the units `adaptive` promotes, with `huge_split_costly` or without.
fn promoted_units(huge_split_costly: bool) -> Vec<Unit> {
    let caps = [1024u64, 2048];
    let mut v = VecView::two_tier(2048, 0);
    v.apply(&[Migration {
        unit: Unit::page(600),
        to: 0,
        mechanism: Mechanism::StopAndCopy,
        urgency: Urgency::Background,
    }]);
    let mut cfg = PolicyConfig::new(2048, caps.to_vec());
    cfg.huge_split_costly = huge_split_costly;
    let s: Vec<AccessSample> = (0..10)
        .flat_map(|_| [sample(700, 1, false), sample(1500, 1, false)])
        .collect();
    promoted_in_five_ticks(&mut Adaptive::new(&cfg), &mut v, &caps, &s)
}

/// Five ticks of `a` over `v`, each with the samples `s`: the units it
/// promoted into tier 0, by first page.
fn promoted_in_five_ticks(
    a: &mut Adaptive,
    v: &mut VecView,
    caps: &[u64],
    s: &[AccessSample],
) -> Vec<Unit> {
    let mut units = Vec::new();
    for round in 0..5u64 {
        let st = caps_status(v, caps);
        let o = Observations {
            now_ns: round * TICK_NS,
            tiers: &st,
            samples: s,
            tpm_outcomes: &[],
            dirty: &[],
        };
        let d = a.tick(&o, v);
        units.extend(d.migrations.iter().filter(|m| m.to == 0).map(|m| m.unit));
        v.apply(&d.migrations);
    }
    units.sort_by_key(|u| u.page);
    units
}

#[test]
fn a_hot_page_of_a_whole_range_promotes_the_range_where_splits_cost() {
    // Live: region 2 sits whole on the slow tier and moves whole; region 1
    // is split already (page 600 is fast), so page 700 moves alone.
    assert_eq!(
        promoted_units(true),
        vec![Unit::page(700), Unit::run(1024, 512)]
    );
    // Negative control (the simulator's rule): mixed heat, pages alone.
    assert_eq!(
        promoted_units(false),
        vec![Unit::page(700), Unit::page(1500)]
    );
}

/// At scale 4 (a region is 128 modeled pages) on a 1024-page guest over
/// tiers of 512 and 1024 pages, all on the slow tier: every page of the
/// last region (896-1023) sampled hot, and page 300 alone. The simulator's
/// rule (`huge_split_costly` off) moves the uniformly hot region whole and
/// the lone page alone (cargo-mutants missed the region rule's `==`, `>=`
/// and bounds: results §12).
#[test]
fn a_uniformly_hot_region_moves_whole_and_a_lone_hot_page_alone() {
    let caps = [512u64, 1024];
    let mut v = VecView::two_tier(1024, 0);
    let cfg = PolicyConfig {
        scale: 4.0,
        ..PolicyConfig::new(1024, caps.to_vec())
    };
    let mut a = Adaptive::new(&cfg);
    assert!(a.trackers().accessed_bits, "the scout tests accessed bits");
    let s: Vec<AccessSample> = (0..4)
        .flat_map(|_| (896..1024).chain([300]).map(|p| sample(p, 1, false)))
        .collect();
    assert_eq!(
        promoted_in_five_ticks(&mut a, &mut v, &caps, &s),
        vec![Unit::page(300), Unit::run(896, 128)]
    );
}
