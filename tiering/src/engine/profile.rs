//! Access profile of one VM for dividing a host's fast tier among VMs
//! (`tiervm serve`): per-page sample counts from the samples the engine
//! already receives (hint faults, accessed-bit probes, DAMON), halved
//! periodically, and the marginal-gain curve they imply.
//!
//! A hint fault says a page was touched within a scan window, which a warm
//! page does as surely as a hot one; how soon after the page was parked it
//! faulted tells them apart (the hint-fault latency Linux's memory tiering
//! uses as its hot threshold, `numa_balancing_hot_threshold_ms`, 1 s by
//! default). A hint-fault sample therefore counts [`hint_weight`]: about
//! `1 s / time to fault` (a page touched λ times a second faults after
//! about 1/λ), between 1 and [`MAX_HINT_WEIGHT`].
//!
//! The curve answers "what share of this VM's accesses would a k-th extra
//! quantum of fast capacity capture?" (the hottest pages below the
//! fast-tier cut) and "what share would the k-th quantum given up lose?"
//! (the coldest pages above it). Both come from one ranking of pages by
//! sampled accesses, so the grow curve is non-increasing and the shrink
//! curve non-decreasing (a concave utility, which a greedy division
//! maximizes). Shares are of all samples, so the
//! sampling rate (which the hint-fault budget adapts per VM) cancels out.
//!
//! What a share is worth in absolute terms comes from [`access_rate`]: the
//! VM's sampled access rate as the host measures it. The hint-fault sampler
//! parks every guest page in turn, and a page touched λ times a second
//! faults with a weight of about λ, so the latest weight of every page sums
//! to about the VM's accesses per second. The guest cannot raise it without
//! touching its memory.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Sampled accesses per guest page, decayed by halving.
#[derive(Debug)]
pub struct AccessProfile {
    counts: Vec<AtomicU32>,
    recorded: AtomicU64,
    weight: AtomicU64,
}

/// The time to fault that counts one (Linux's default hot threshold,
/// `numa_balancing_hot_threshold_ms` = 1000, and the sampler's period).
pub const HINT_WEIGHT_REF_NS: u64 = 1_000_000_000;
/// Most a hint-fault sample counts: faults within 1 ms of parking are all
/// "hot" (a vCPU sharing a core waits that long to run at all).
pub const MAX_HINT_WEIGHT: u32 = 1000;

/// What a hint-fault sample of a page that faulted `ns_since_park` after
/// it was parked counts (see the module docs).
pub fn hint_weight(ns_since_park: u64) -> u32 {
    let w = HINT_WEIGHT_REF_NS / ns_since_park.max(1);
    u32::try_from(w)
        .unwrap_or(u32::MAX)
        .clamp(1, MAX_HINT_WEIGHT)
}

impl AccessProfile {
    /// A profile of `pages` guest pages, all zero.
    pub fn new(pages: usize) -> Self {
        Self {
            counts: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            recorded: AtomicU64::new(0),
            weight: AtomicU64::new(0),
        }
    }

    /// Records one sampled access to `page` (out-of-range pages are ignored).
    pub fn record(&self, page: u64) {
        self.record_weighted(page, 1);
    }

    /// Records one sampled access to `page` that counts `weight` (see
    /// [`hint_weight`]); counts saturate.
    pub fn record_weighted(&self, page: u64, weight: u32) {
        if let Some(c) = usize::try_from(page).ok().and_then(|p| self.counts.get(p)) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(weight))
            });
            self.recorded.fetch_add(1, Ordering::Relaxed);
            self.weight.fetch_add(u64::from(weight), Ordering::Relaxed);
        }
    }

    /// What a sample counts on average (1 without weights): the counts'
    /// noise scales with it.
    pub fn mean_weight(&self) -> f64 {
        let n = self.recorded.load(Ordering::Relaxed);
        if n == 0 {
            1.0
        } else {
            (self.weight.load(Ordering::Relaxed) as f64 / n as f64).max(1.0)
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

/// A VM's access rate as the host measures it (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AccessRate {
    /// Sampled accesses per second.
    pub per_sec: f64,
    /// Its standard error.
    pub se: f64,
    /// Share of guest memory the sampler has covered (1 once it made a
    /// full pass; below, the rate is extrapolated from what it covered).
    pub coverage: f64,
}

/// The host's estimate of a VM's access rate from the hint-fault sampler's
/// census (`tiering::mem::SamplerAccount`): `weight` is the sum over guest
/// pages of the weight of each page's latest hint fault in a sampler
/// window, `weight_sq` the sum of their squares, `scanned` the pages the
/// sampler's windows covered so far, of `guest_pages`.
///
/// 1. A page touched λ times a second faults with a weight of about λ, so
///    once the sampler made a full pass, `weight` (one sample per page,
///    the latest) is the rate, whatever part of memory the scan is in now.
/// 2. Its standard error is `sqrt(weight_sq)`: each page's weight taken as
///    an independent draw.
/// 3. Before the first full pass, the rate is extrapolated from the
///    covered share `f`: `weight / f`, with the error `sqrt(weight_sq) / f`
///    and, in quadrature, `rate x (1 - f)` for the part not seen (the scan
///    goes through memory in order, and a hot region may lie ahead or
///    behind).
///
/// It is an index more than a count: a weight is `1 s / time to fault`,
/// which for a page touched λ times a second averages about
/// `λ (1 + ln(1000 / λ))` (the first touch of a window comes early by
/// chance), capped at [`MAX_HINT_WEIGHT`]; pages touched less than once a
/// window count little or nothing, and a window's hint faults are served
/// one at a time, so a VM whose pages all fault at once counts less than
/// it touches. The same holds for every VM.
///
/// `None` before the sampler covered any memory.
pub fn access_rate(
    guest_pages: u64,
    scanned: u64,
    weight: u64,
    weight_sq: u64,
) -> Option<AccessRate> {
    if guest_pages == 0 || scanned == 0 {
        return None;
    }
    let f = (scanned as f64 / guest_pages as f64).min(1.0);
    let per_sec = weight as f64 / f;
    let se = ((weight_sq as f64).sqrt() / f).hypot(per_sec * (1.0 - f));
    Some(AccessRate {
        per_sec,
        se,
        coverage: f,
    })
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
    /// Standard error of each grow step (sampling noise: a page's count is
    /// taken as a Poisson count of samples of the mean weight).
    #[serde(default)]
    pub grow_se: Vec<f64>,
    /// Standard error of each shrink step.
    #[serde(default)]
    pub shrink_se: Vec<f64>,
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

/// The gain curve of `counts` (per guest page) around a fast tier of
/// `capacity` pages: `quantum` pages per step, at most `steps` steps each
/// way; `mean_weight` is what a sample counts on average (for the
/// standard errors).
///
/// 1. Rank every page by its count, hottest first: the fast-tier cut a
///    converged policy reaches holds the first `capacity` pages.
/// 2. Growing by a quantum captures the next `quantum` pages below the cut;
///    shrinking loses the last `quantum` pages above it (capacity the VM
///    holds but nothing hot would fill is worth nothing).
/// 3. Sum each quantum's counts, as a share of all counts, with its
///    standard error `sqrt(sum x mean_weight) / total` (a page's count
///    taken as a Poisson count of samples of the mean weight).
///
/// Both sides come from one ranking, so the curve is concave at the cut:
/// the next quantum is never worth more than the last (a VM is never at
/// once the best receiver and the cheapest donor, whatever its policy
/// placed where so far).
pub fn gain_curve(
    counts: &[u32],
    capacity: u64,
    quantum: u64,
    steps: usize,
    mean_weight: f64,
) -> GainCurve {
    let q = usize::try_from(quantum.max(1)).unwrap_or(usize::MAX);
    let total: f64 = counts.iter().map(|&c| f64::from(c)).sum();
    let mut ranked: Vec<u32> = counts.to_vec();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    let cut = usize::try_from(capacity)
        .unwrap_or(usize::MAX)
        .min(ranked.len());
    let w = mean_weight.max(1.0);
    let step = |ch: &[u32]| -> (f64, f64) {
        let sum = ch.iter().map(|&c| f64::from(c)).sum::<f64>();
        if total > 0.0 {
            (sum / total, (sum * w).sqrt() / total)
        } else {
            (0.0, 0.0)
        }
    };
    let (grow, grow_se): (Vec<f64>, Vec<f64>) =
        ranked[cut..].chunks(q).take(steps).map(step).unzip();
    let (shrink, shrink_se): (Vec<f64>, Vec<f64>) =
        ranked[..cut].rchunks(q).take(steps).map(step).unzip();
    GainCurve {
        quantum_pages: q as u64,
        grow,
        shrink,
        samples: total,
        grow_se,
        shrink_se,
    }
}

/// [`gain_curve`] before the sampler's first full pass: `coverage` (the
/// share of guest memory its windows covered so far, as in
/// [`AccessRate::coverage`]) of the pages have been looked at, so each
/// page with a count stands for `1 / coverage` pages of its kind (the
/// covered part taken as a sample of the whole). The cut and the quantum
/// are scaled down by `coverage` in the ranking: a VM whose first 10% of
/// memory is all hot is valued for the hot pages it will most likely show
/// beyond the cut, instead of nothing until the sampler has seen more
/// pages than its fast tier holds (issue 32: a hot VM's next quantum read
/// 0 for 20 s while an idle VM held capacity it did not use).
/// `quantum_pages` stays the real quantum.
pub fn gain_curve_covered(
    counts: &[u32],
    capacity: u64,
    quantum: u64,
    steps: usize,
    mean_weight: f64,
    coverage: f64,
) -> GainCurve {
    let f = if coverage.is_finite() {
        coverage.clamp(0.0, 1.0)
    } else {
        1.0
    };
    if f >= 1.0 || f <= 0.0 {
        return gain_curve(counts, capacity, quantum, steps, mean_weight);
    }
    let scale = |n: u64| ((n as f64 * f).round() as u64).max(1);
    let mut c = gain_curve(
        counts,
        (capacity as f64 * f).round() as u64,
        scale(quantum),
        steps,
        mean_weight,
    );
    c.quantum_pages = quantum.max(1);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partly_covered_vm_is_valued_for_the_pages_it_will_show() {
        // 10% of 1000 pages covered, all 100 of them hot; a fast tier of
        // 200 pages, quanta of 100: the plain curve sees every counted
        // page inside the cut (grows nothing), the covered one values the
        // next quantum at the hot share it will most likely show.
        let mut counts = vec![0u32; 1000];
        counts[..100].iter_mut().for_each(|c| *c = 10);
        let plain = gain_curve(&counts, 200, 100, 4, 1.0);
        assert_eq!(plain.grow[0], 0.0);
        let covered = gain_curve_covered(&counts, 200, 100, 4, 1.0, 0.1);
        assert!((covered.grow[0] - 0.1).abs() < 1e-9, "{covered:?}");
        assert_eq!(covered.quantum_pages, 100);
        assert_eq!(gain_curve_covered(&counts, 200, 100, 4, 1.0, 1.0), plain);
    }

    #[test]
    fn steps_follow_the_ranking_around_the_cut() {
        // Ranked: 10 8 1 1 1 0 0 0 (total 21); a fast tier of 4 pages.
        let counts = [0, 1, 0, 0, 10, 8, 1, 1];
        let c = gain_curve(&counts, 4, 2, 8, 1.0);
        assert_eq!(c.grow.len(), 2);
        assert!(
            (c.grow[0] - 1.0 / 21.0).abs() < 1e-9,
            "pages 5-6 of the ranking"
        );
        assert_eq!(c.grow[1], 0.0);
        assert!((c.shrink[0] - 2.0 / 21.0).abs() < 1e-9, "pages 3-4");
        assert!((c.shrink[1] - 18.0 / 21.0).abs() < 1e-9, "pages 1-2");
        assert!((c.shrink_se[1] - 18f64.sqrt() / 21.0).abs() < 1e-9);
        assert!(c.grow[0] <= c.shrink[0], "concave at the cut");
        assert!((c.gain(5) - 1.0 / 21.0).abs() < 1e-9);
        assert!((c.loss(3) - 38.0 / 21.0).abs() < 1e-9, "last step repeats");
    }

    #[test]
    fn capacity_nothing_hot_would_fill_loses_nothing() {
        // Two hot pages, a fast tier of five.
        let counts = [9, 9, 0, 0, 0, 0];
        let c = gain_curve(&counts, 5, 1, 8, 1.0);
        assert_eq!(c.grow, vec![0.0]);
        assert_eq!(c.shrink[..3], [0.0, 0.0, 0.0]);
        assert!(c.shrink[3] > 0.0);
    }

    #[test]
    fn a_sample_counts_by_its_time_to_fault() {
        assert_eq!(hint_weight(1_000_000_000), 1);
        assert_eq!(hint_weight(10_000_000), 100);
        assert_eq!(hint_weight(5_000_000_000), 1, "at least one");
        assert_eq!(hint_weight(0), MAX_HINT_WEIGHT);
        let p = AccessProfile::new(2);
        p.record_weighted(0, 100);
        p.record(1);
        assert_eq!(p.snapshot(), vec![100, 1]);
        assert!((p.mean_weight() - 50.5).abs() < 1e-9);
    }

    #[test]
    fn the_access_rate_is_the_census_once_the_sampler_covered_memory() {
        assert_eq!(access_rate(1000, 0, 0, 0), None, "nothing scanned yet");
        assert_eq!(access_rate(0, 10, 10, 10), None);
        // A full pass (and more): the census is the rate.
        let r = access_rate(1000, 2500, 5000, 1_000_000).unwrap();
        assert_eq!((r.per_sec, r.se, r.coverage), (5000.0, 1000.0, 1.0));
        // A quarter of memory covered: extrapolated, and uncertain by the
        // three quarters not seen.
        let r = access_rate(1000, 250, 500, 10_000).unwrap();
        assert_eq!(r.per_sec, 2000.0);
        assert!((r.se - 400f64.hypot(1500.0)).abs() < 1e-9, "{r:?}");
        assert_eq!(r.coverage, 0.25);
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
