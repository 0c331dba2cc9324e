//! Steps 1-4 of `adaptive` and what it reports: the config, sampling
//! within the profiling budget, cooling, TPM outcomes, pattern changes,
//! the scout, the valuing of past migrations, the migration budget, the
//! hold over equally fast tiers, its modes, statistics and state.

use super::*;

#[test]
fn new_takes_rates_budgets_and_reserves_from_the_config() {
    let a = adaptive(1000, &[1000, 5000, 100]);
    // 0.4% of each tier, rounded, at least one page.
    assert_eq!(a.reserve, vec![4, 20, 1]);
    assert_eq!(a.caps, vec![1000, 5000, 100]);
    assert_eq!(a.hands.len(), 3);
    assert_eq!(a.region, 512);
    for len in [
        a.heat.len(),
        a.hits.len(),
        a.last_move.len(),
        a.since.len(),
        a.aborts.len(),
        a.writes.len(),
        a.flags.len(),
    ] {
        assert_eq!(len, 1000);
    }
    // 2048 MB/s over a 20 ms tick: 40.96 MB, 10 485.76 pages of 4 KiB.
    assert_close(a.rate_pages, 10_485.76);
    // 5% of a 20 ms tick at 20 ns a sample: 1 ms, 50 000 samples.
    assert_close(a.profile_ns, 1e6);
    assert_eq!(a.profile.clone().next_interval(), 50_000);
    assert!(!a.whole_ranges && !a.chooser.dirty_log_costly);
    assert_eq!(a.current_mode(), Mode::Warming);

    let mut cfg = PolicyConfig::new(1000, vec![1000, 5000]);
    cfg.scale = 4.0;
    cfg.interval_ns = Some(10_000_000);
    cfg.promote_rate_limit_mbps = Some(100.0);
    cfg.free_reserve_fraction = Some(0.01);
    cfg.huge_split_costly = true;
    cfg.dirty_log_costly = true;
    let a = Adaptive::new(&cfg);
    assert_eq!(a.reserve, vec![10, 50]);
    assert_eq!(a.region, 128);
    // 100 MB/s x 10 ms = 1 MB = 256 pages, a quarter of them at scale 4.
    assert_close(a.rate_pages, 64.0);
    // 5% of 10 ms, a quarter of it at scale 4.
    assert_close(a.profile_ns, 125_000.0);
    assert_eq!(a.profile.clone().next_interval(), 6_250);
    assert!(a.whole_ranges && a.chooser.dirty_log_costly);

    // A nonsense scale counts as 1; a zero interval as 1 ns.
    for scale in [f64::NAN, -2.0, 0.0] {
        let mut cfg = PolicyConfig::new(10, vec![10, 10]);
        cfg.scale = scale;
        assert_eq!(Adaptive::new(&cfg).scale, 1.0, "scale {scale}");
    }
    let mut cfg = PolicyConfig::new(10, vec![10, 10]);
    cfg.interval_ns = Some(0);
    assert_close(Adaptive::new(&cfg).profile_ns, 0.05);
}

#[test]
fn ingest_keeps_an_even_share_of_samples_within_the_profiling_budget() {
    // 4 us ticks: 5% of them at 20 ns a sample is 10 samples.
    let mut cfg = PolicyConfig::new(100, vec![10, 100]);
    cfg.interval_ns = Some(4_000);
    let mut a = Adaptive::new(&cfg);
    a.tick_no = 7;
    let samples: Vec<AccessSample> = (0..25)
        .map(|p| sample(p, (p % 2) as TierId, p % 4 == 0))
        .collect();
    assert_eq!(a.ingest(&samples), None, "25 samples are no phase window");
    // Every third sample (25 over 10 allowed): pages 0, 3, ..., 24.
    let kept: Vec<u64> = (0..25).step_by(3).collect();
    assert_eq!(a.tracked, kept);
    assert_eq!(a.kept, 9);
    assert_eq!(a.stats.samples_dropped, 16);
    for p in 0..25u64 {
        let i = p as usize;
        let k = u16::from(kept.contains(&p));
        assert_eq!((a.heat[i], a.hits[i]), (k, k), "page {p}");
        assert_eq!(a.flags[i] & TRACKED != 0, k == 1, "page {p}");
        let w = u8::from(k == 1 && p % 4 == 0);
        assert_eq!(a.writes[i], w, "page {p}");
    }
    assert_eq!(a.since[3], 7);
    // Of the kept pages, 3, 9, 15 and 21 were sampled in the slow tier.
    assert_eq!(a.phase_window, (9, 4));

    // A sample beyond the guest's pages is not kept.
    let mut a = adaptive(100, &[10, 100]);
    a.ingest(&[sample(100, 1, false), sample(5, 1, false)]);
    assert_eq!((a.kept, a.tracked.clone()), (1, vec![5]));
    assert_eq!(a.stats.samples_dropped, 0);
}

#[test]
fn the_slow_share_is_returned_once_a_phase_window_is_full() {
    let mut a = adaptive(1000, &[100, 1000]);
    let window: Vec<AccessSample> = (0..PHASE_WINDOW_SAMPLES)
        .map(|i| sample(i, TierId::from(i % 4 == 0), false))
        .collect();
    assert_eq!(a.ingest(&window), Some(0.25));
    assert_eq!(a.phase_window, (0, 0), "a full window starts a new one");
    let short = &window[..window.len() - 1];
    assert_eq!(a.ingest(short), None);
    assert_eq!(a.ingest(&[sample(0, 1, false)]), Some(65.0 / 256.0));
}

#[test]
fn a_page_reaching_cool_at_halves_every_tracked_page_and_forgets_zeros() {
    let mut a = adaptive(100, &[10, 100]);
    let mut s = vec![sample(2, 1, false)];
    s.extend((0..3).map(|_| sample(3, 1, false)));
    s.extend((0..COOL_AT - 1).map(|_| sample(1, 1, false)));
    a.ingest(&s);
    assert_eq!((a.heat(1), a.heat(2), a.heat(3)), (COOL_AT - 1, 1, 3));
    a.ingest(&[sample(1, 1, false)]);
    assert_eq!((a.heat(1), a.heat(2), a.heat(3)), (COOL_AT / 2, 0, 1));
    assert_eq!(a.tracked, vec![3, 1], "page 2 cooled to 0 is forgotten");
    assert_eq!(a.flags[2] & TRACKED, 0);
    a.tick_no = 4;
    a.ingest(&[sample(2, 1, false)]);
    assert_eq!(a.tracked, vec![3, 1, 2], "and tracked again when sampled");
    assert_eq!(a.since[2], 4);
}

#[test]
fn engine_outcomes_count_aborts_and_keep_the_write_evidence() {
    let mut a = adaptive(100, &[10, 100]);
    let v = VecView::two_tier(100, 10);
    a.in_flight = vec![(50, 0, true), (51, 0, false), (52, 0, true)];
    a.aborts[51] = 2;
    a.writes[50] = 3;
    let outcomes = [
        TpmOutcome {
            page: 50,
            committed: false,
        },
        TpmOutcome {
            page: 51,
            committed: true,
        },
        TpmOutcome {
            page: 53,
            committed: false,
        },
        TpmOutcome {
            page: 100,
            committed: false,
        },
    ];
    a.learn_outcomes(&outcomes, &v);
    assert!(a.in_flight.is_empty());
    assert_eq!((a.aborts(50), a.aborts(51), a.aborts(53)), (1, 0, 1));
    // Page 50's writes are kept; page 53 (not in flight as written) gets one.
    assert_eq!((a.writes[50], a.writes[51], a.writes[53]), (3, 0, 1));
    assert_eq!(a.stats.tpm_aborts, 2, "page 100 is beyond the guest");
    // One abort of a written page (50) fed the abort rate; 53 was not written.
    assert_close(a.chooser.write_abort_rate, 0.1);
}

#[test]
fn without_engine_outcomes_a_page_not_where_it_was_sent_aborted() {
    let mut a = adaptive(100, &[10, 100]);
    let v = VecView::two_tier(100, 10);
    // Page 15 is still in tier 1; page 5 reached tier 0.
    a.in_flight = vec![(15, 0, true), (5, 0, true)];
    a.aborts[5] = 1;
    a.learn_outcomes(&[], &v);
    assert_eq!((a.aborts(15), a.aborts(5)), (1, 0));
    assert_eq!((a.writes[15], a.writes[5]), (1, 0));
    assert_eq!(a.stats.tpm_aborts, 1);
    // 0.9 x (0.9 x 0 + 0.1) + 0.1 x 0 after an abort then a commit.
    assert_close(a.chooser.write_abort_rate, 0.09);
}

#[test]
fn a_slow_share_rising_beyond_the_jump_is_a_new_pattern() {
    let mut a = adaptive(100, &[10, 100]);
    heat_up(&mut a, 3, 8);
    a.flags[4] |= BURSTY;
    a.detect_phase(None);
    assert_eq!(a.slow_share_base, None);
    a.slow_share_base = Some(0.25);
    // A rise of exactly PHASE_JUMP is not beyond it: the baseline moves.
    a.detect_phase(Some(0.25 + PHASE_JUMP));
    assert_eq!(a.stats.phase_changes, 0);
    let base = a.slow_share_base.expect("a baseline");
    assert_close(base, 0.8 * 0.25 + 0.2 * 0.45);
    assert_eq!(a.heat(3), 8);
    // 0.29 + 0.2 < 0.5: a new pattern.
    a.detect_phase(Some(0.5));
    assert_eq!(a.stats.phase_changes, 1);
    assert_eq!(a.slow_share_base, Some(0.5));
    assert_eq!(a.heat(3), 2, "cooled twice");
    assert_eq!(a.flags[4] & BURSTY, 0, "streaming flags forgotten");
    assert!(
        a.why.contains("50% of samples hit slower tiers (was 29%)"),
        "{}",
        a.why
    );

    // The first window sets the baseline.
    let mut a = adaptive(100, &[10, 100]);
    a.detect_phase(Some(0.4));
    assert_eq!(a.stats.phase_changes, 0);
    assert_close(a.slow_share_base.unwrap_or(0.0), 0.4);
}

#[test]
fn the_jump_is_measured_against_the_baselines_sampling_noise() {
    // At a baseline of 0.5 four standard errors of a 256-sample window
    // are 0.125, under PHASE_JUMP: 0.71 is a new pattern.
    let mut a = adaptive(100, &[10, 100]);
    a.slow_share_base = Some(0.5);
    a.detect_phase(Some(0.71));
    assert_eq!(a.stats.phase_changes, 1);
    // Without detection nothing moves, not even the baseline.
    let mut a = adaptive(100, &[10, 100]).without_phase_detection();
    a.slow_share_base = Some(0.1);
    a.detect_phase(Some(0.9));
    assert_eq!((a.slow_share_base, a.stats.phase_changes), (Some(0.1), 0));
}

#[test]
fn the_scout_heats_touched_slower_pages_while_a_faster_tier_has_room() {
    let mut cfg = PolicyConfig::new(100, vec![10, 100]);
    cfg.accessed_test_cost_ns = Some(1_000.0);
    let mut v = VecView::two_tier(100, 10);
    v.accessed[50] = true;
    v.accessed[60] = true;
    v.accessed[5] = true;
    // Reserve 1: room means more than 2 free pages.
    let room = [tier(10, 3), tier(100, 10)];
    let mut a = Adaptive::new(&cfg);
    a.tick_no = 3;
    heat_up(&mut a, 70, 3);
    assert_eq!(a.scout(&room, &mut v), 2);
    assert_eq!(
        (a.heat(50), a.heat(60), a.heat(5), a.heat(70)),
        (1, 1, 0, 3)
    );
    assert_eq!(a.tracked, vec![70, 50, 60]);
    assert!([50, 60].iter().all(|&p| a.flags[p] & TRACKED != 0));
    assert_eq!((a.since[50], a.stats.scout_hits), (3, 2));
    let tests = a.scout.tests;
    assert_eq!(
        tests, 89,
        "1 ms of budget at 1 us a test covers tier 1 but page 70"
    );

    let mut v = VecView::two_tier(100, 10);
    v.accessed[50] = true;
    let no_room = [tier(10, 2), tier(100, 10)];
    let mut a = Adaptive::new(&cfg);
    assert_eq!(a.scout(&no_room, &mut v), 0);
    assert_eq!(a.scout.tests, 0);
    // Samples that used the whole budget leave the scout none.
    let mut a = Adaptive::new(&cfg);
    a.kept = 50_000;
    assert_eq!(a.scout(&room, &mut v), 0);
    // 50 us of the budget left: 50 tests.
    let mut a = Adaptive::new(&cfg);
    a.kept = 47_500;
    a.scout(&room, &mut v);
    assert_eq!(a.scout.tests, 50);
}

#[test]
fn migrations_are_valued_at_the_measured_latency_gap_and_streams_flagged() {
    // Eight promotions that earned 10 hits each, and page 30, sampled 20
    // times before its promotion and not once after: a burst.
    let run = |lat: Option<(f64, f64)>| {
        let mut a = adaptive(100, &[10, 100]);
        let mut st = [tier(10, 5), tier(100, 50)];
        if let Some((f, s)) = lat {
            st[0].loaded_latency_ns = Some(f);
            st[1].loaded_latency_ns = Some(s);
        }
        a.tick_no = 1;
        let mut plan = Plan::new(&st, 100);
        for p in (20..28).chain([30]) {
            heat_up(&mut a, p, if p == 30 { 20 } else { 1 });
            a.since[p as usize] = 1;
            a.emit(&mut plan, Unit::page(p), 1, 0, Mechanism::StopAndCopy);
        }
        for p in 20..28 {
            a.hits[p] = 10;
        }
        let s = [sample(0, 0, false)];
        let mut share = 0.0;
        for tick in 2..=(1 + u64::from(thrash::EVAL_TICKS)) {
            share = a.value_migrations(tick, &obs(0, &st, &s));
        }
        let ratio = a.thrash.last_ratio.expect("a window valued");
        (ratio, share, a.flags[30] & BURSTY != 0)
    };
    // The window's EMAs: gain 0.3 x 80, moves 0.3 x 9; a sampled access
    // saves SAMPLE_PERIOD x the gap, over HORIZON_TICKS / EVAL_TICKS windows.
    let want = |gap: f64| {
        let horizon = f64::from(thrash::HORIZON_TICKS) / f64::from(thrash::EVAL_TICKS);
        0.3 * 80.0 * horizon * SAMPLE_PERIOD as f64 * gap / (0.3 * 9.0 * thrash::MIGRATION_COST_NS)
    };
    let (measured, share, bursty) = run(Some((100.0, 300.0)));
    assert_close(measured, want(200.0));
    assert_eq!(share, 1.0, "migrations that pay keep the whole budget");
    assert!(bursty, "page 30 is flagged a burst");
    let (assumed, _, _) = run(None);
    assert_close(assumed, want(ASSUMED_GAP_NS));
    let (unmeasured, _, _) = run(Some((100.0, f64::INFINITY)));
    assert_close(unmeasured, want(ASSUMED_GAP_NS));
    // A tier 0 slower than tier 1: promotions gain nothing.
    assert_eq!(run(Some((300.0, 100.0))).0, 0.0);
}

#[test]
fn the_migration_limit_carries_fractions_of_the_throttled_rate() {
    let mut a = adaptive(100, &[10, 100]);
    a.rate_pages = 2.5;
    let got: Vec<u64> = [1.0, 1.0, 0.5, 0.0, 1.0]
        .iter()
        .map(|&s| a.migration_limit(s))
        .collect();
    // 2.5, 2.5 + 0.5, 1.25, 0.25, 2.75.
    assert_eq!(got, vec![2, 3, 1, 0, 2]);
    assert_close(a.rate_carry, 0.75);
    a.rate_pages = 0.3;
    a.rate_carry = 0.0;
    let got: Vec<u64> = (0..4).map(|_| a.migration_limit(1.0)).collect();
    assert_eq!(
        got,
        vec![0, 0, 0, 1],
        "a rate below a page a tick still moves"
    );
}

#[test]
fn equally_fast_needs_both_unloaded_latencies_known_and_within_delta() {
    assert_eq!(
        equally_fast(&[unloaded(100.0), unloaded(104.0)]),
        Some((100.0, 104.0))
    );
    assert_eq!(
        equally_fast(&[unloaded(104.0), unloaded(100.0)]),
        Some((104.0, 100.0))
    );
    // 5% of 200 ns is 10 ns: a 10 ns gap is not within it.
    assert_eq!(equally_fast(&[unloaded(200.0), unloaded(210.0)]), None);
    assert_eq!(
        equally_fast(&[unloaded(200.0), unloaded(209.0)]),
        Some((200.0, 209.0))
    );
    for (u0, u1) in [
        (0.0, 0.0),
        (100.0, 0.0),
        (f64::NAN, 100.0),
        (100.0, f64::INFINITY),
    ] {
        assert_eq!(
            equally_fast(&[unloaded(u0), unloaded(u1)]),
            None,
            "{u0} {u1}"
        );
    }
    assert_eq!(equally_fast(&[unloaded(100.0), tier(100, 50)]), None);
    assert_eq!(equally_fast(&[unloaded(100.0)]), None);
}

#[test]
fn a_tick_holds_over_equally_fast_tiers_and_warms_without_samples() {
    let mut a = adaptive(100, &[10, 100]);
    let mut v = VecView::two_tier(100, 10);
    let s = [sample(50, 1, false)];
    let equal = [unloaded(100.0), unloaded(102.0)];
    let d = a.tick(&obs(0, &equal, &s), &mut v);
    assert!(d.migrations.is_empty());
    assert_eq!(a.current_mode(), Mode::Hold);
    assert!(a.why.contains("100 vs 102 ns"), "{}", a.why);
    // Its samples were still taken in.
    assert_eq!(a.heat(50), 1);

    let mut a = adaptive(100, &[10, 100]);
    let st = v.status(&[10, 100]);
    a.mode = Mode::Promote;
    a.tick(&obs(0, &st, &[]), &mut v);
    assert_eq!(
        (a.current_mode(), a.why.as_str()),
        (Mode::Warming, "no samples yet")
    );
    assert_eq!(a.tick_no, 1);
    // One tier: nothing to place, the mode is left as it was.
    let mut a = adaptive(100, &[100]);
    a.mode = Mode::Promote;
    let one = [tier(100, 50)];
    assert!(a.tick(&obs(0, &one, &s), &mut v).migrations.is_empty());
    assert_eq!(a.current_mode(), Mode::Promote);
}

#[test]
fn the_mode_says_why_and_a_throttle_says_its_budget() {
    let mut a = adaptive(10, &[5, 10]);
    assert_eq!(a.stream_note(), "");
    a.set_mode(Mode::Promote, "3 pages up".into(), 1.0, 0);
    assert_eq!((a.mode, a.why.as_str()), (Mode::Promote, "3 pages up"));
    // A pattern change this tick keeps its note in front.
    a.why = "pattern changed".into();
    a.stats.phase_changes = 1;
    a.set_mode(Mode::Balance, "x".into(), 1.0, 0);
    assert_eq!(
        (a.mode, a.why.as_str()),
        (Mode::Balance, "pattern changed; x")
    );
    assert_eq!(a.stats.throttled_ticks, 0);
    a.thrash.set_level(2);
    assert_eq!(a.throttle_level(), 2);
    a.thrash.last_ratio = Some(0.5);
    a.set_mode(Mode::Promote, "y".into(), 0.25, 1);
    assert_eq!(a.mode, Mode::Throttled);
    assert_eq!(
        a.why,
        "migrations returned 0.50x their cost (0% ping-pong): budget 1/4; y"
    );
    a.set_mode(Mode::Promote, "z".into(), 0.0, 1);
    assert!(a.why.ends_with("no migration; z"), "{}", a.why);
    assert_eq!(a.stats.throttled_ticks, 2);
    stream_seen(&mut a);
    assert!(
        a.stream_note().contains("100% of promotions were bursts"),
        "{}",
        a.stream_note()
    );
}

#[test]
fn the_policy_says_what_it_tracks_and_which_mode_it_is_in() {
    let mut a = adaptive(10, &[5, 10]);
    assert_eq!(a.kind(), PolicyKind::Adaptive);
    assert_eq!(a.tick_interval_ns(), TICK_NS);
    assert_eq!(
        a.trackers(),
        TrackerRequest {
            sample_period: SAMPLE_PERIOD,
            accessed_bits: true,
            ..TrackerRequest::none()
        }
    );
    let names: Vec<&str> = [
        Mode::Warming,
        Mode::Promote,
        Mode::Balance,
        Mode::Throttled,
        Mode::Hold,
    ]
    .map(Mode::name)
    .to_vec();
    assert_eq!(
        names,
        [
            "warming",
            "promote",
            "balance",
            "throttled: thrashing",
            "hold: tiers equally fast"
        ]
    );
    assert!(a.wants_samples());
    let m = a.mode().expect("adaptive reports its mode");
    assert_eq!(
        (m.mode.as_str(), m.why.as_str()),
        ("warming", "no samples yet")
    );
    a.mode = Mode::Hold;
    assert!(!a.wants_samples(), "nothing is sampled in hold");
    assert_eq!(BYTES_PER_PAGE, 2 * 2 + 2 * 4 + 3);
}

#[test]
fn state_exports_heat_as_a_share_of_cool_at_and_imports_it_back() {
    let mut a = adaptive(100, &[10, 100]);
    heat_up(&mut a, 9, 16);
    heat_up(&mut a, 2, 32);
    heat_up(&mut a, 5, 16);
    let st = a.export_state();
    assert_eq!(st.from, PolicyKind::Adaptive);
    assert_eq!(st.now_ns, 0);
    assert_eq!(st.hot_pages, vec![(2, 1.0), (5, 0.5), (9, 0.5)]);

    let mut b = adaptive(100, &[10, 100]);
    let hot = vec![(3, 0.5), (4, 2.0), (6, -1.0), (7, 0.01), (100, 1.0)];
    let state = PolicyState {
        from: PolicyKind::Memtis,
        now_ns: 0,
        hot_pages: hot,
    };
    b.import_state(&state);
    // 0.5 x 31 = 15.5, rounded; shares are clamped to 0..1.
    assert_eq!(
        (b.heat(3), b.heat(4), b.heat(6), b.heat(7)),
        (16, COOL_AT - 1, 0, 0)
    );
    assert_eq!(b.tracked, vec![3, 4]);
    b.import_state(&state);
    assert_eq!(b.tracked, vec![3, 4], "a page is tracked once");
}

#[test]
fn each_reason_counts_in_its_own_stat() {
    let reasons = [
        Reason::CleanTpm,
        Reason::ShadowedTpm,
        Reason::WrittenTpm,
        Reason::WriteHotStopCopy,
        Reason::UnloggedStopCopy,
        Reason::ShadowRemap,
        Reason::ColdCopy,
    ];
    for (i, &r) in reasons.iter().enumerate() {
        let mut a = adaptive(10, &[5, 10]);
        for _ in 0..=i {
            a.count_reason(r);
        }
        let s = &a.stats;
        let counts = [
            s.clean_tpm,
            s.shadowed_tpm,
            s.written_tpm,
            s.write_hot_stop_copy,
            s.unlogged_stop_copy,
            s.shadow_remaps,
            s.cold_copies,
        ];
        let want: Vec<u64> = (0..reasons.len())
            .map(|j| if j == i { i as u64 + 1 } else { 0 })
            .collect();
        assert_eq!(counts.to_vec(), want, "{r:?}");
    }
}
