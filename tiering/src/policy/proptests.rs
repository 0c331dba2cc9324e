//! Property tests over all policies: no decision asks for more pages than
//! the destination has free, whatever the observations.

use proptest::prelude::*;

use super::testutil::VecView;
use super::*;

/// Replays decisions in order against the view and checks capacity the
/// way an engine would: a move needs a free destination page, except a
/// shadow demotion to the shadow's tier; a stop-and-copy frees its source
/// at once, a transactional migration only on commit (not here).
fn check_and_apply(
    view: &mut VecView,
    free: &mut [u64],
    migrations: &[Migration],
) -> Result<(), String> {
    for m in migrations {
        let to = usize::from(m.to);
        if to >= free.len() {
            return Err(format!("tier {to} does not exist"));
        }
        for p in m.unit.page..m.unit.page + u64::from(m.unit.pages) {
            let from = usize::from(view.tier_of(p));
            if from == to {
                continue;
            }
            let via_shadow =
                m.mechanism == Mechanism::ShadowDemotion && view.shadow_tier(p) == Some(m.to);
            if !via_shadow {
                if free[to] == 0 {
                    return Err(format!("{m:?}: tier {to} has no free page for page {p}"));
                }
                free[to] -= 1;
            }
            if !matches!(m.mechanism, Mechanism::Transactional { .. }) {
                free[from] += 1;
                view.tier[p as usize] = m.to;
                view.shadow[p as usize] = false;
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Event {
    Fault {
        page: u64,
        ttf_ms: u64,
        write: bool,
    },
    Tick {
        samples: Vec<(u64, bool)>,
        aborts: Vec<u64>,
        lat_d: f64,
        lat_a: f64,
        rate_d: f64,
        rate_a: f64,
    },
    Access(u64),
}

fn event(pages: u64) -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..pages, 0u64..3000, any::<bool>()).prop_map(|(page, ttf_ms, write)| Event::Fault {
            page,
            ttf_ms,
            write
        }),
        (
            prop::collection::vec((0..pages, any::<bool>()), 0..40),
            prop::collection::vec(0..pages, 0..4),
            50.0f64..400.0,
            50.0f64..400.0,
            0.0f64..1e9,
            0.0f64..1e9,
        )
            .prop_map(
                |(samples, aborts, lat_d, lat_a, rate_d, rate_a)| Event::Tick {
                    samples,
                    aborts,
                    lat_d,
                    lat_a,
                    rate_d,
                    rate_a
                }
            ),
        (0..pages).prop_map(Event::Access),
    ]
}

fn scenario() -> impl Strategy<Value = (u64, Vec<u64>, Vec<u8>, Vec<bool>, Vec<Event>)> {
    (40u64..160, 2usize..4).prop_flat_map(|(pages, tiers)| {
        let caps = prop::collection::vec(10u64..120, tiers);
        let placement = prop::collection::vec(0u8..tiers as u8, pages as usize);
        let shadows = prop::collection::vec(any::<bool>(), pages as usize);
        let events = prop::collection::vec(event(pages), 1..60);
        (Just(pages), caps, placement, shadows, events)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_policy_overfills_a_tier((pages, mut caps, placement, shadows, events) in scenario()) {
        // Make the placement fit: raise capacities to at least the pages placed.
        for (t, cap) in caps.iter_mut().enumerate() {
            let used = placement.iter().filter(|&&x| usize::from(x) == t).count() as u64;
            *cap = (*cap).max(used);
        }
        for kind in PolicyKind::ALL {
            let mut cfg = PolicyConfig::new(pages, caps.clone());
            cfg.scale = 64.0; // small regions for mtm, small budgets
            let mut policy = kind.build(&cfg).unwrap();
            let mut view = VecView { tier: placement.clone(), shadow: vec![false; pages as usize], accessed: vec![false; pages as usize], test_cost_ns: None };
            // Shadows only for pages in tier 0 (promoted pages keep their slow copy in tier 1).
            for ((sh, &want), &t) in view.shadow.iter_mut().zip(&shadows).zip(&placement) {
                *sh = want && t == 0;
            }
            let mut now = 0u64;
            for ev in &events {
                now += 7_000_000;
                let status = view.status(&caps);
                let mut free: Vec<u64> = status.iter().map(|s| s.free_pages).collect();
                match ev {
                    Event::Access(p) => view.accessed[*p as usize] = true,
                    Event::Fault { page, ttf_ms, write } => {
                        let fault = HintFault { page: *page, tier: view.tier_of(*page), time_to_fault_ns: ttf_ms * 1_000_000, write: *write, now_ns: now, cpu: 0 };
                        if let Some(m) = policy.on_hint_fault(&fault, &status, &mut view) {
                            check_and_apply(&mut view, &mut free, &[m]).map_err(|e| TestCaseError::fail(format!("{kind} fault: {e}")))?;
                        }
                    }
                    Event::Tick { samples, aborts, lat_d, lat_a, rate_d, rate_a } => {
                        let mut status = status.clone();
                        status[0].loaded_latency_ns = Some(*lat_d);
                        status[1].loaded_latency_ns = Some(*lat_a);
                        status[0].request_rate = Some(*rate_d);
                        status[1].request_rate = Some(*rate_a);
                        let samples: Vec<AccessSample> = samples.iter().map(|&(page, write)| AccessSample { page, tier: view.tier_of(page), write }).collect();
                        let outcomes: Vec<TpmOutcome> = aborts.iter().map(|&page| TpmOutcome { page, committed: false }).collect();
                        // Enough ticks for mtm to reach the end of an interval.
                        for k in 0..4 {
                            let obs = Observations { now_ns: now + k, tiers: &status, samples: &samples, tpm_outcomes: &outcomes, dirty: &[] };
                            let d = policy.tick(&obs, &mut view);
                            check_and_apply(&mut view, &mut free, &d.migrations).map_err(|e| TestCaseError::fail(format!("{kind} tick: {e} in {:?} free {:?}", d.migrations.iter().map(|m| (m.unit.page, m.to)).collect::<Vec<_>>(), status.iter().map(|s| s.free_pages).collect::<Vec<_>>())))?;
                            status = view.status(&caps);
                            status[0].loaded_latency_ns = Some(*lat_d);
                            status[1].loaded_latency_ns = Some(*lat_a);
                            status[0].request_rate = Some(*rate_d);
                            status[1].request_rate = Some(*rate_a);
                            free = status.iter().map(|s| s.free_pages).collect();
                        }
                    }
                }
            }
        }
    }
}
