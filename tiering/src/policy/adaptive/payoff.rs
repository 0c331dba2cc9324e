//! What a promotion returns, by the heat it had when it moved: `adaptive`
//! stops displacing pages for heat classes whose promoted pages earn no more
//! than the pages they displace.
//!
//! The thrash throttle ([`super::thrash`]) judges all migrations together;
//! a workload with a small hot set and a large uniformly warm one (PageRank:
//! the score arrays, and the CSR streamed once per iteration) measures a
//! good return overall while most migrations trade warm pages for warm
//! pages. Per class:
//!
//! 1. Each valued promotion adds its sampled hits since it moved to the
//!    class of its heat at promotion ([`class_of`]); each valued demotion
//!    adds its victim's hits in the slower tier to the victims' account.
//! 2. Per evaluation window, both become moving averages ([`EMA_WEIGHT`]).
//! 3. A class with [`MIN_VALUED`] promotions valued pays when its mean hits
//!    exceed the victims' by [`SIGMAS`] standard errors (Poisson counts):
//!    otherwise a promotion of that heat may not displace a page, only fill
//!    free room. A blocked class is let through again after [`RETRY_TICKS`]
//!    and judged on its next window; a pattern change forgets every account.

/// Heat classes: heat 1, 2, ... up to this (and above, in the last).
pub const CLASSES: usize = 8;
/// Weight of the newest window in the moving averages (as the throttle's).
pub const EMA_WEIGHT: f64 = super::thrash::EMA_WEIGHT;
/// Promotions (moving average per window) a class needs before it is judged.
/// (As the throttle's `MIN_VALUED`.)
pub const MIN_VALUED: f64 = super::thrash::MIN_VALUED;
/// Standard errors by which a class's mean hits must beat the victims'.
pub const SIGMAS: f64 = 2.0;
/// Ticks a blocked class waits before it is measured again (10 s at the
/// 20 ms tick: one probe's worth of promotions in twenty windows).
pub const RETRY_TICKS: u64 = 500;

/// The class of a page promoted with `heat`.
pub fn class_of(heat: u16) -> usize {
    usize::from(heat.max(1)).min(CLASSES) - 1
}

/// Hits and count, per window and as moving averages.
#[derive(Clone, Copy, Debug, Default)]
struct Account {
    window_hits: f64,
    window_n: f64,
    hits: f64,
    n: f64,
}

impl Account {
    fn add(&mut self, hits: f64) {
        self.window_hits += hits;
        self.window_n += 1.0;
    }
    fn close(&mut self) {
        if self.window_n > 0.0 {
            self.hits = EMA_WEIGHT * self.window_hits + (1.0 - EMA_WEIGHT) * self.hits;
            self.n = EMA_WEIGHT * self.window_n + (1.0 - EMA_WEIGHT) * self.n;
        }
        self.window_hits = 0.0;
        self.window_n = 0.0;
    }
    fn mean(&self) -> f64 {
        if self.n > 0.0 {
            self.hits / self.n
        } else {
            0.0
        }
    }
    /// Variance of the mean (Poisson hits).
    fn var_of_mean(&self) -> f64 {
        if self.n > 0.0 {
            self.hits.max(0.0) / (self.n * self.n)
        } else {
            0.0
        }
    }
}

/// Per-class returns of promotions against their victims.
#[derive(Clone, Debug)]
pub struct Payoff {
    classes: [Account; CLASSES],
    victims: Account,
    /// Tick from which each class is blocked (`None`: allowed).
    blocked_since: [Option<u64>; CLASSES],
    /// Switched off by tests (negative control): every class pays.
    pub enabled: bool,
}

impl Default for Payoff {
    fn default() -> Self {
        Self {
            classes: [Account::default(); CLASSES],
            victims: Account::default(),
            blocked_since: [None; CLASSES],
            enabled: true,
        }
    }
}

impl Payoff {
    /// Step 1: a valued promotion of a page moved with `heat`.
    pub fn promoted(&mut self, heat: u16, hits: f64) {
        self.classes[class_of(heat)].add(hits);
    }

    /// Step 1: a valued demotion.
    pub fn demoted(&mut self, hits: f64) {
        self.victims.add(hits);
    }

    /// Steps 2-3 at the end of an evaluation window at `tick`.
    pub fn close_window(&mut self, tick: u64) {
        self.victims.close();
        if std::env::var_os("PAYOFF_DEBUG").is_some() && tick % 1000 < 25 {
            eprintln!(
                "t{tick} victims n {:.0} mean {:.3}; classes {:?}",
                self.victims.n,
                self.victims.mean(),
                self.classes
                    .iter()
                    .map(|a| (a.n.round(), (a.mean() * 1000.0).round() / 1000.0))
                    .collect::<Vec<_>>()
            );
        }
        for c in 0..CLASSES {
            self.classes[c].close();
            if let Some(since) = self.blocked_since[c] {
                // Retried: the next window's promotions are judged with
                // the account so far (the moving average forgets it).
                if tick >= since + RETRY_TICKS {
                    self.blocked_since[c] = None;
                }
                continue;
            }
            let a = self.classes[c];
            if a.n < MIN_VALUED || self.victims.n < MIN_VALUED {
                continue;
            }
            let se = (a.var_of_mean() + self.victims.var_of_mean()).sqrt();
            if a.mean() <= self.victims.mean() + SIGMAS * se {
                self.blocked_since[c] = Some(tick);
            }
        }
    }

    /// Whether a promotion with `heat` may displace a page.
    pub fn pays(&self, heat: u16) -> bool {
        !self.enabled || self.blocked_since[class_of(heat)].is_none()
    }

    /// The blocked heat classes, for the explanation (`"1, 2, 8+"`).
    pub fn blocked_heats(&self) -> String {
        if !self.enabled {
            return String::new();
        }
        (0..CLASSES)
            .filter(|&c| self.blocked_since[c].is_some())
            .map(|c| {
                if c + 1 == CLASSES {
                    format!("{CLASSES}+")
                } else {
                    (c + 1).to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Forgets every account (the access pattern changed).
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
    fn classes_that_earn_no_more_than_their_victims_are_blocked() {
        let mut p = Payoff::default();
        for w in 0..6u64 {
            for i in 0..50 {
                // Heat-1 promotions earn what victims earn; heat-5 ones 10x.
                p.promoted(1, f64::from(i % 2));
                p.promoted(5, 5.0);
                p.demoted(f64::from(i % 2));
            }
            p.close_window(w * 25);
        }
        assert!(!p.pays(1));
        assert!(p.pays(5));
        assert_eq!(p.blocked_heats(), "1");
        // Retried after RETRY_TICKS.
        p.close_window(5 * 25 + RETRY_TICKS);
        assert!(p.pays(1));
        p.enabled = false;
        p.blocked_since[0] = Some(0);
        assert!(p.pays(1), "negative control: disabled, every class pays");
    }
}
