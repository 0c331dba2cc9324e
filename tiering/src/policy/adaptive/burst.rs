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
}
