//! The scout of `adaptive`: while a faster tier has free room, it finds the
//! touched pages of the slower tiers by accessed bits, within what is left
//! of the profiling budget after the samples (MTM's bounded profiling, §5.3).
//!
//! Sparse samples find a hot page quickly but a warm one late: a page read
//! once a second is sampled about once every 199 s at one thread. TPP finds
//! such pages by hint-fault scanning; the scout does the same with accessed
//! bits, and only while promoting them displaces nothing:
//!
//! 1. The budget is the share of [`super::PROFILE_OVERHEAD`] of one core the
//!    samples did not use, at the cost of one accessed-bit test: what the
//!    run has measured (live: the hint fault of an armed probe, the mean the
//!    fault handler saw times the guest cost factor,
//!    [`MemoryView::accessed_test_cost_ns`]), else the configured figure
//!    (live: the host's measured constant), else [`ASSUMED_TEST_NS`].
//! 2. A cursor walks the pages in address order and tests the slower-tier
//!    pages no sample has made hot yet: a page touched since its last test
//!    (one pass ago; live, the first test of a page only arms it) is a hit.
//!    The test clears the bit for the next pass. Hits gain heat in
//!    `adaptive`, and rank as sampled pages do.

use super::super::types::{MemoryView, TierId};

/// Assumed cost of one accessed-bit test where none is measured, ns (MTM's
/// `ONE_SCAN_OVERHEAD_NS`, 1 us).
pub const ASSUMED_TEST_NS: f64 = 1_000.0;

/// Pages the walk may pass over per page tested (skipping fast or known
/// pages costs a lookup, not a test), and at least this many per tick.
pub const MAX_LOOK_PER_TEST: u64 = 64;
/// See [`MAX_LOOK_PER_TEST`].
pub const MIN_LOOK: u64 = 4096;

/// A cost that can divide a budget: finite and positive.
fn usable_cost(ns: Option<f64>) -> Option<f64> {
    ns.filter(|c| c.is_finite() && *c > 0.0)
}

/// The scout's state.
#[derive(Clone, Debug)]
pub struct Scout {
    /// Next page to arm.
    cursor: u64,
    /// Cost of one test, ns, where the run has not measured it.
    test_ns: f64,
    /// Tests carried between ticks (fractions of a test at large scales).
    carry: f64,
    /// Tests done (for the report).
    pub tests: u64,
    /// Hits reported.
    pub hits: u64,
    /// Switched off by tests (negative control).
    pub enabled: bool,
}

impl Scout {
    /// A scout whose tests cost `test_ns` each (`None`: [`ASSUMED_TEST_NS`]).
    pub fn new(test_ns: Option<f64>) -> Self {
        Self {
            cursor: 0,
            test_ns: usable_cost(test_ns).unwrap_or(ASSUMED_TEST_NS),
            carry: 0.0,
            tests: 0,
            hits: 0,
            enabled: true,
        }
    }

    /// Steps 1-2 with `budget_ns` of (modeled-scale) profiling time left:
    /// pages slower than `room_tier` (the fastest tier with free room;
    /// `None`: none has room, the scout rests) are tested; `is_known(p)`
    /// skips pages the samples already track. Touched pages are pushed to
    /// `hits`.
    pub fn run(
        &mut self,
        budget_ns: f64,
        room_tier: Option<TierId>,
        view: &mut dyn MemoryView,
        is_known: impl Fn(u64) -> bool,
        hits: &mut Vec<u64>,
    ) {
        let Some(room) = room_tier.filter(|_| self.enabled) else {
            self.carry = 0.0;
            return;
        };
        let test_ns = usable_cost(view.accessed_test_cost_ns()).unwrap_or(self.test_ns);
        let total = budget_ns.max(0.0) / test_ns + self.carry;
        let mut left = total.floor() as u64;
        self.carry = (total - left as f64).min(1.0);
        let n = view.pages();
        // Bounded walk: pages skipped (fast, or known) cost a lookup each.
        let max_look = n.min(left.saturating_mul(MAX_LOOK_PER_TEST).max(MIN_LOOK));
        let mut looked = 0u64;
        while left > 0 && looked < max_look {
            let p = self.cursor;
            self.cursor = (self.cursor + 1) % n.max(1);
            looked += 1;
            if view.tier_of(p) <= room || is_known(p) {
                continue;
            }
            left -= 1;
            self.tests += 1;
            if view.test_and_clear_accessed(p) {
                self.hits += 1;
                hits.push(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::testutil::VecView;
    use super::*;

    #[test]
    fn touched_slow_pages_are_found_within_the_budget() {
        let mut v = VecView::two_tier(100, 10);
        let mut s = Scout::new(Some(1_000.0));
        let mut hits = Vec::new();
        for p in [40usize, 41, 99, 5] {
            v.accessed[p] = true;
        }
        // 10 tests per tick: one pass over the 90 slow pages in 9 ticks.
        for _ in 0..9 {
            s.run(10_000.0, Some(0), &mut v, |p| p == 41, &mut hits);
        }
        // 89 slow pages not known (41 is), then the walk wraps to page 10.
        assert_eq!(s.tests, 90, "page 41 is known, fast page 5 not tested");
        assert_eq!(hits, vec![40, 99]);
        // The bits were cleared: the next pass finds only new touches.
        v.accessed[60] = true;
        for _ in 0..9 {
            s.run(10_000.0, Some(0), &mut v, |_| false, &mut hits);
        }
        // Page 41, no longer known, still carries its touch.
        assert_eq!(hits, vec![40, 99, 41, 60]);
        // A measured cost replaces the configured one: 5 us a test, 2 per tick.
        v.test_cost_ns = Some(5_000.0);
        let before = s.tests;
        s.run(10_000.0, Some(0), &mut v, |_| false, &mut hits);
        assert_eq!(
            s.tests - before,
            2,
            "the run's measured cost sets the budget"
        );
        // A measurement that is not a cost is ignored.
        v.test_cost_ns = Some(f64::NAN);
        s.run(10_000.0, Some(0), &mut v, |_| false, &mut hits);
        assert_eq!(s.tests - before, 12);
        // No room: nothing is tested.
        let before = s.tests;
        s.run(10_000.0, None, &mut v, |_| false, &mut hits);
        assert_eq!(s.tests, before);
    }

    /// A cost that is no number, or not positive, is no cost: the assumed
    /// one (1 us) is taken.
    #[test]
    fn a_configured_cost_that_is_no_cost_is_replaced_by_the_assumed_one() {
        assert_eq!(Scout::new(Some(2_000.0)).test_ns, 2_000.0);
        for no_cost in [
            None,
            Some(0.0),
            Some(-1.0),
            Some(f64::NAN),
            Some(f64::INFINITY),
        ] {
            assert_eq!(Scout::new(no_cost).test_ns, ASSUMED_TEST_NS, "{no_cost:?}");
        }
    }

    /// Fractions of a test carry to the next tick; a rest (no room, or
    /// switched off) drops them.
    #[test]
    fn fractions_of_a_test_carry_and_a_rest_drops_them() {
        let mut v = VecView::two_tier(100, 10);
        let mut s = Scout::new(None);
        let mut hits = Vec::new();
        let mut tests_of = |s: &mut Scout, room: Option<TierId>| {
            let before = s.tests;
            s.run(2_500.0, room, &mut v, |_| false, &mut hits);
            s.tests - before
        };
        assert_eq!(tests_of(&mut s, Some(0)), 2);
        assert_eq!(tests_of(&mut s, Some(0)), 3, "2.5 + 0.5");
        assert_eq!(tests_of(&mut s, Some(0)), 2);
        assert_eq!(tests_of(&mut s, None), 0);
        assert_eq!(tests_of(&mut s, Some(0)), 2, "the half carried was dropped");
        s.enabled = false;
        assert_eq!(tests_of(&mut s, Some(0)), 0);
        s.enabled = true;
        assert_eq!(tests_of(&mut s, Some(0)), 2, "dropped when off too");
    }

    /// The walk passes over at most 64 pages per test it may do, and at
    /// least 4,096, at most the whole guest; only pages slower than the
    /// tier with room are tested.
    #[test]
    fn the_walk_is_bounded_and_tests_only_pages_below_the_room() {
        // 10,000 pages, all fast: nothing to test, the walk is the bound.
        let mut v = VecView::two_tier(10_000, 10_000);
        let mut hits = Vec::new();
        let walked = |v: &mut VecView, budget_ns: f64| {
            let mut s = Scout::new(None);
            s.run(budget_ns, Some(0), v, |_| false, &mut Vec::new());
            s.cursor
        };
        assert_eq!(walked(&mut v, 1_000.0), MIN_LOOK);
        assert_eq!(walked(&mut v, 100_000.0), 100 * MAX_LOOK_PER_TEST);
        assert_eq!(walked(&mut v, 1e9), 0, "the whole guest, once: back at 0");
        // Three tiers, room in tier 1: only tier-2 pages are tested.
        let mut v = VecView::two_tier(30, 10);
        for p in 20..30 {
            v.tier[p] = 2;
        }
        v.accessed = vec![true; 30];
        let mut s = Scout::new(None);
        s.run(1e6, Some(1), &mut v, |_| false, &mut hits);
        assert_eq!(hits, (20..30).collect::<Vec<u64>>());
        assert_eq!((s.tests, s.hits), (10, 10));
    }
}
