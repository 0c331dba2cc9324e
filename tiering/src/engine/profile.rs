//! Access profile of one VM for dividing a host's fast tier among VMs
//! (`tiervm serve`): per-page sample counts from the samples the engine
//! already receives (hint faults, accessed-bit probes, DAMON), halved
//! periodically, and the marginal-gain curve they imply.
//!
//! The curve answers "what share of this VM's accesses would a k-th extra
//! quantum of fast capacity capture?" (the hottest slow-tier pages above
//! the current fast-tier cut) and "what share would the k-th quantum given
//! up lose?" (the coldest fast-tier pages). Both come from the same
//! ranking of pages by sampled accesses, so the grow curve is
//! non-increasing and the shrink curve non-decreasing (a concave utility,
//! which a greedy division maximizes). Shares are of all samples, so the
//! sampling rate (which the hint-fault budget adapts per VM) cancels out.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::vocab::TierId;

/// Sampled accesses per guest page, decayed by halving.
#[derive(Debug)]
pub struct AccessProfile {
    counts: Vec<AtomicU32>,
    recorded: AtomicU64,
}

impl AccessProfile {
    /// A profile of `pages` guest pages, all zero.
    pub fn new(pages: usize) -> Self {
        Self {
            counts: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            recorded: AtomicU64::new(0),
        }
    }

    /// Records one sampled access to `page` (out-of-range pages are ignored).
    pub fn record(&self, page: u64) {
        if let Some(c) = usize::try_from(page).ok().and_then(|p| self.counts.get(p)) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1));
            self.recorded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Halves every count (the profile's memory: a sample counts half after
    /// each call).
    pub fn halve(&self) {
        for c in &self.counts {
            let v = c.load(Ordering::Relaxed);
            if v != 0 {
                c.store(v / 2, Ordering::Relaxed);
            }
        }
    }

    /// Samples recorded since the profile was created (not decayed).
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    /// The current counts.
    pub fn snapshot(&self) -> Vec<u32> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// Marginal gain of fast capacity for one VM (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GainCurve {
    /// Pages per step.
    pub quantum_pages: u64,
    /// Share of sampled accesses the k-th extra quantum would capture.
    pub grow: Vec<f64>,
    /// Share of sampled accesses the k-th quantum given up would lose.
    pub shrink: Vec<f64>,
    /// Decayed samples behind the curve (0: no information).
    pub samples: f64,
}

impl GainCurve {
    /// Gain of growing by `quanta` steps (sum of the first `quanta` grow
    /// steps; beyond the curve, nothing).
    pub fn gain(&self, quanta: usize) -> f64 {
        self.grow.iter().take(quanta).sum()
    }

    /// Loss of shrinking by `quanta` steps; beyond the curve, the last
    /// step's loss repeats (conservative).
    pub fn loss(&self, quanta: usize) -> f64 {
        let last = self.shrink.last().copied().unwrap_or(0.0);
        (0..quanta)
            .map(|k| self.shrink.get(k).copied().unwrap_or(last))
            .sum()
    }
}

/// The gain curve of `counts` (per guest page), given each page's tier
/// (`None`: never touched), the fast tier's free pages (capacity above its
/// use: growing into them costs nothing, shrinking them loses nothing),
/// `quantum` pages per step and at most `steps` steps each way.
///
/// 1. Rank slow-tier pages hottest first and fast-tier pages coldest first.
/// 2. Skip `fast_free` pages of each ranking: the hottest slow pages fit the
///    free room already; the free room is the first to go in a shrink.
/// 3. Sum each quantum's counts, as a share of all counts.
pub fn gain_curve(
    counts: &[u32],
    tier_of: impl Fn(usize) -> Option<TierId>,
    fast_free: u64,
    quantum: u64,
    steps: usize,
) -> GainCurve {
    let quantum = quantum.max(1);
    let total: f64 = counts.iter().map(|&c| f64::from(c)).sum();
    let mut slow: Vec<u32> = Vec::new();
    let mut fast: Vec<u32> = Vec::new();
    for (p, &c) in counts.iter().enumerate() {
        match tier_of(p) {
            Some(0) => fast.push(c),
            Some(_) => slow.push(c),
            None => {}
        }
    }
    slow.sort_unstable_by(|a, b| b.cmp(a));
    fast.sort_unstable();
    let steps_of = |ranked: &[u32]| -> Vec<f64> {
        let skip = usize::try_from(fast_free).unwrap_or(usize::MAX);
        let q = usize::try_from(quantum).unwrap_or(usize::MAX);
        let rest = ranked.get(skip..).unwrap_or(&[]);
        rest.chunks(q)
            .take(steps)
            .map(|ch| {
                if total > 0.0 {
                    ch.iter().map(|&c| f64::from(c)).sum::<f64>() / total
                } else {
                    0.0
                }
            })
            .collect()
    };
    GainCurve {
        quantum_pages: quantum,
        grow: steps_of(&slow),
        shrink: steps_of(&fast),
        samples: total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_slow_pages_make_the_first_grow_step_worth_most() {
        // Pages 0..4 fast (cold), 4..8 slow: 4, 5 hot.
        let counts = [0, 1, 0, 0, 10, 8, 1, 1];
        let c = gain_curve(&counts, |p| Some(u8::from(p >= 4)), 0, 2, 8);
        assert_eq!(c.grow.len(), 2);
        assert!((c.grow[0] - 18.0 / 21.0).abs() < 1e-9);
        assert!((c.grow[1] - 2.0 / 21.0).abs() < 1e-9);
        assert!(c.grow[0] >= c.grow[1], "non-increasing");
        assert_eq!(c.shrink, vec![0.0, 1.0 / 21.0]);
        assert!((c.gain(5) - 20.0 / 21.0).abs() < 1e-9);
        assert!((c.loss(3) - 2.0 / 21.0).abs() < 1e-9, "last step repeats");
    }

    #[test]
    fn free_fast_room_is_used_first() {
        let counts = [0, 0, 10, 8];
        let c = gain_curve(&counts, |p| Some(u8::from(p >= 2)), 1, 1, 8);
        // The hottest slow page fits the free room: the first step buys page 3.
        assert!((c.grow[0] - 8.0 / 18.0).abs() < 1e-9);
        assert_eq!(c.shrink, vec![0.0]);
    }

    #[test]
    fn profile_counts_and_halves() {
        let p = AccessProfile::new(4);
        p.record(1);
        p.record(1);
        p.record(9); // ignored
        assert_eq!(p.snapshot(), vec![0, 2, 0, 0]);
        p.halve();
        assert_eq!(p.snapshot(), vec![0, 1, 0, 0]);
        assert_eq!(p.recorded(), 2);
    }
}
