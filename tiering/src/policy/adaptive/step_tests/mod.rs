//! Unit tests of `adaptive`'s steps, one function at a time: the numbers
//! each step computes from the config, the samples, the outcomes and the
//! tiers' status. `tests.rs` holds the behaviour tests (scenarios and
//! negative controls); these pin what those scenarios only pass through
//! (issue 34: cargo-mutants showed which). `observe`: steps 1-4 (profile,
//! outcomes, pattern changes, the scout, the valuing of past migrations,
//! the budget) and what the policy reports; `plan`: steps 5-7 (ranking,
//! the latency verdict, room, placement and the moves).

mod observe;
mod plan;

use super::super::testutil::{obs, sample, VecView};
use super::*;

/// `adaptive` for `pages` pages over tiers of `caps` pages, unscaled.
fn adaptive(pages: u64, caps: &[u64]) -> Adaptive {
    Adaptive::new(&PolicyConfig::new(pages, caps.to_vec()))
}

/// Gives `page` heat `h` and tracks it, as sampling would.
fn heat_up(a: &mut Adaptive, page: u64, h: u16) {
    let i = page as usize;
    a.heat[i] = h;
    if a.flags[i] & TRACKED == 0 {
        a.flags[i] |= TRACKED;
        a.tracked.push(page);
    }
}

/// A tier of `cap` pages with `free` free, without latency signals.
fn tier(cap: u64, free: u64) -> TierStatus {
    TierStatus {
        capacity_pages: cap,
        free_pages: free,
        shadow_pages: 0,
        loaded_latency_ns: None,
        request_rate: None,
        unloaded_latency_ns: None,
    }
}

/// A tier with a loaded latency `l` ns at `r` requests/s.
fn loaded(l: f64, r: f64) -> TierStatus {
    TierStatus {
        loaded_latency_ns: Some(l),
        request_rate: Some(r),
        ..tier(100, 50)
    }
}

/// A tier with an unloaded latency `u` ns.
fn unloaded(u: f64) -> TierStatus {
    TierStatus {
        unloaded_latency_ns: Some(u),
        ..tier(100, 50)
    }
}

/// Asserts that `got` is `want` within rounding (relative 1e-9, absolute
/// near 0).
#[track_caller]
fn assert_close(got: f64, want: f64) {
    assert!(
        (got - want).abs() < 1e-9 * want.abs().max(1.0),
        "{got} is not {want}"
    );
}

/// The first page, destination and mechanism of each migration of `d`.
fn moves(d: &Decisions) -> Vec<(u64, TierId, Mechanism)> {
    d.migrations
        .iter()
        .map(|m| (m.unit.page, m.to, m.mechanism))
        .collect()
}

/// A view whose pages sit in `tiers[page]`.
fn view_of(tiers: Vec<TierId>) -> VecView {
    let n = tiers.len();
    VecView {
        tier: tiers,
        shadow: vec![false; n],
        accessed: vec![false; n],
        test_cost_ns: None,
    }
}

/// Bursts that judged a stream: promotions stop displacing pages.
fn stream_seen(a: &mut Adaptive) {
    for p in 0..30 {
        a.thrash.bursts.valued(p, 5.0, 0.0);
    }
    a.thrash.bursts.close_window(100);
    assert!(!a.thrash.bursts.displacing_allowed());
}
