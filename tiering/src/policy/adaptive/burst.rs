//! Streaming (one-touch) pages, from what promotions returned: `adaptive`
//! stops displacing pages for pages that are sampled in a burst and then
//! not again.
//!
//! A scan larger than the fast tier (PageRank's CSR edge array, streamed
//! once per iteration) defeats hotness packing the way a loop defeats LRU:
//! the page being streamed is sampled, promoted after its burst, and the
//! victim is the page the stream reaches next, so the stream always finds
//! its pages in the slow tier while the fast tier churns. The thrash
//! throttle does not see it (over its window, a promoted page earned its
//! burst's tail, a victim nothing yet). Per promotion:
//!
//! 1. At the move, the page's sampled rate is its heat over the ticks since
//!    it was first sampled, taken at its lower bound (Poisson, two standard
//!    errors: a page sampled a few times promises nothing); the **expected**
//!    hits over the evaluation window ([`super::thrash::EVAL_TICKS`]) follow.
//! 2. When it is valued, a promotion expected to earn at least
//!    [`MIN_EXPECTED`] hits that earned none is a **burst** (Poisson: no
//!    hit at 3 expected happens 5% of the time); its page is flagged and
//!    may no longer displace a page, only fill free room.
//! 3. Per evaluation window, the share of judged promotions that were bursts
//!    is a moving average; above [`MAX_SHARE`] no promotion may displace a
//!    page (the pattern is a stream), until [`RETRY_TICKS`] later, when the
//!    next window is judged again. A pattern change forgets it all.

/// Expected hits a promotion needs for its outcome to be judged.
pub const MIN_EXPECTED: f64 = 3.0;
/// Share of judged promotions that were bursts above which displacing
/// promotions stop (half: most promotions did not pay at all).
pub const MAX_SHARE: f64 = 0.5;
/// Judged promotions (moving average per window) before the share counts
/// (as the throttle's `MIN_VALUED`).
pub const MIN_JUDGED: f64 = super::thrash::MIN_VALUED;
/// Ticks displacement stays stopped before the next window is judged (10 s
/// at the 20 ms tick).
pub const RETRY_TICKS: u64 = 500;
/// Weight of the newest window in the moving average (as the throttle's).
pub const EMA_WEIGHT: f64 = super::thrash::EMA_WEIGHT;

/// The burst detector's state.
#[derive(Clone, Debug)]
pub struct Bursts {
    window_judged: f64,
    window_bursts: f64,
    judged: f64,
    bursts: f64,
    stopped_since: Option<u64>,
    /// Pages found bursty since the policy last took them.
    pub found: Vec<u64>,
    /// Promotions judged bursts (for the report).
    pub total: u64,
    /// Switched off by tests (negative control).
    pub enabled: bool,
}

impl Default for Bursts {
    fn default() -> Self {
        Self {
            window_judged: 0.0,
            window_bursts: 0.0,
            judged: 0.0,
            bursts: 0.0,
            stopped_since: None,
            found: Vec::new(),
            total: 0,
            enabled: true,
        }
    }
}

impl Bursts {
    /// Step 2: a valued promotion of `page`, expected to earn `expected`
    /// hits, that earned `hits`.
    pub fn valued(&mut self, page: u64, expected: f64, hits: f64) {
        if !self.enabled || expected < MIN_EXPECTED {
            return;
        }
        self.window_judged += 1.0;
        if hits <= 0.0 {
            self.window_bursts += 1.0;
            self.total += 1;
            self.found.push(page);
        }
    }

    /// Step 3 at the end of an evaluation window at `tick`.
    pub fn close_window(&mut self, tick: u64) {
        if self.window_judged > 0.0 {
            let w = EMA_WEIGHT;
            self.judged = w * self.window_judged + (1.0 - w) * self.judged;
            self.bursts = w * self.window_bursts + (1.0 - w) * self.bursts;
        }
        self.window_judged = 0.0;
        self.window_bursts = 0.0;
        match self.stopped_since {
            Some(since) if tick >= since + RETRY_TICKS => self.stopped_since = None,
            Some(_) => {}
            None if self.judged >= MIN_JUDGED && self.share() > MAX_SHARE => {
                self.stopped_since = Some(tick);
            }
            None => {}
        }
    }

    /// Share of judged promotions that were bursts (moving average).
    pub fn share(&self) -> f64 {
        if self.judged > 0.0 {
            self.bursts / self.judged
        } else {
            0.0
        }
    }

    /// Whether promotions may displace pages (no stream detected).
    pub fn displacing_allowed(&self) -> bool {
        !self.enabled || self.stopped_since.is_none()
    }

    /// Forgets the share (the access pattern changed); flagged pages stay
    /// flagged in the policy until they are sampled steadily.
    pub fn reset(&mut self) {
        let enabled = self.enabled;
        *self = Self {
            enabled,
            ..Self::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_of_bursts_stops_displacement_and_is_retried() {
        let mut b = Bursts::default();
        for w in 0..4u64 {
            for p in 0..20 {
                // Steady pages earn what was expected; thin ones are not judged.
                b.valued(p, 5.0, if p < 15 { 0.0 } else { 4.0 });
                b.valued(100 + p, 0.5, 0.0);
            }
            b.close_window(w * 25);
        }
        assert!(!b.displacing_allowed(), "share {}", b.share());
        assert_eq!(b.found.len(), 4 * 15, "only judged bursts are flagged");
        b.close_window(3 * 25 + RETRY_TICKS);
        assert!(b.displacing_allowed(), "retried");
        let mut off = Bursts {
            enabled: false,
            ..Bursts::default()
        };
        for p in 0..40 {
            off.valued(p, 5.0, 0.0);
        }
        off.close_window(25);
        assert!(off.displacing_allowed() && off.found.is_empty());
    }

    /// Step 2's bounds: a promotion expected to earn exactly
    /// [`MIN_EXPECTED`] hits is judged, one expected to earn less is not;
    /// no hit at all is a burst, any hit is not.
    #[test]
    fn a_promotion_is_judged_from_min_expected_hits_and_a_burst_at_zero_hits() {
        let mut b = Bursts::default();
        b.valued(1, MIN_EXPECTED, 0.0);
        b.valued(2, MIN_EXPECTED - 0.01, 0.0);
        b.valued(3, 10.0, 0.1);
        b.valued(4, 10.0, -1.0);
        assert_eq!((b.window_judged, b.window_bursts), (3.0, 2.0));
        assert_eq!((b.found.clone(), b.total), (vec![1, 4], 2));
    }

    /// Step 3's moving average: the newest window weighs `EMA_WEIGHT`; a
    /// window with nothing judged leaves the averages; each window starts
    /// from zero.
    #[test]
    fn the_burst_share_is_a_moving_average_of_the_windows() {
        let mut b = Bursts::default();
        assert_eq!(b.share(), 0.0, "nothing judged: no share");
        for p in 0..10 {
            b.valued(p, 5.0, if p < 4 { 0.0 } else { 1.0 });
        }
        b.close_window(25);
        assert!((b.judged - 3.0).abs() < 1e-12 && (b.bursts - 1.2).abs() < 1e-12);
        assert!((b.share() - 0.4).abs() < 1e-12);
        assert_eq!((b.window_judged, b.window_bursts), (0.0, 0.0));
        b.close_window(50);
        assert!(
            (b.share() - 0.4).abs() < 1e-12,
            "an empty window changes nothing"
        );
        for p in 0..10 {
            b.valued(p, 5.0, 0.0);
        }
        b.close_window(75);
        // 0.3 x 10 + 0.7 x 3 and 0.3 x 10 + 0.7 x 1.2.
        assert!((b.judged - 5.1).abs() < 1e-12 && (b.bursts - 3.84).abs() < 1e-12);
        assert!((b.share() - 3.84 / 5.1).abs() < 1e-12);
    }

    /// Displacement stops when at least `MIN_JUDGED` promotions (moving
    /// average) were judged and more than half of them were bursts; it is
    /// retried exactly `RETRY_TICKS` after, and stops again at the next
    /// window if the share is still above.
    #[test]
    fn displacement_stops_above_half_bursts_of_enough_judged_and_retries_on_time() {
        let at = |judged: f64, bursts: f64| {
            let mut b = Bursts {
                judged,
                bursts,
                ..Bursts::default()
            };
            b.close_window(100);
            b
        };
        assert!(at(MIN_JUDGED, MIN_JUDGED * MAX_SHARE).displacing_allowed());
        assert!(at(MIN_JUDGED - 0.01, MIN_JUDGED - 0.01).displacing_allowed());
        let mut b = at(MIN_JUDGED, MIN_JUDGED * MAX_SHARE + 0.01);
        assert!(!b.displacing_allowed());
        b.close_window(100 + RETRY_TICKS - 1);
        assert!(!b.displacing_allowed());
        b.close_window(100 + RETRY_TICKS);
        assert!(b.displacing_allowed(), "retried");
        b.close_window(100 + RETRY_TICKS + 25);
        assert!(!b.displacing_allowed(), "still a stream");
    }

    /// A pattern change forgets the share, the stop and the found pages,
    /// but not whether the detector is switched off.
    #[test]
    fn a_reset_forgets_everything_but_the_switch() {
        let mut b = Bursts {
            judged: 20.0,
            bursts: 20.0,
            ..Bursts::default()
        };
        b.valued(7, 5.0, 0.0);
        b.close_window(25);
        assert!(!b.displacing_allowed());
        b.reset();
        assert!(b.displacing_allowed() && b.enabled);
        assert_eq!((b.share(), b.total, b.found.len()), (0.0, 0, 0));
        let mut off = Bursts {
            enabled: false,
            judged: 10.0,
            ..Bursts::default()
        };
        off.reset();
        assert!(!off.enabled);
        assert_eq!(off.judged, 0.0);
    }
}
