//! Side-by-side cost of access tracking inside one run: hint-fault sampling
//! is switched on and off every `period`, and the guest's throughput is
//! accumulated separately for the two phases (the interval that contains a
//! switch is left out, as is everything before the guest's first
//! operation and a warm-up of two periods). Alternating within one VM cancels
//! the machine noise that separate runs suffer from.

use serde::Serialize;

/// The result of an A/B run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrackingAb {
    /// Seconds per phase.
    pub period_s: f64,
    /// Seconds measured with tracking on / off.
    pub on_s: f64,
    /// Seconds measured with tracking off.
    pub off_s: f64,
    /// Guest ops/s with tracking on.
    pub on_ops_per_sec: f64,
    /// Guest ops/s with tracking off.
    pub off_ops_per_sec: f64,
    /// on / off.
    pub ratio: f64,
    /// Hint-fault stall the fault handler saw in the measured on phases,
    /// seconds (summed over vCPUs).
    pub hint_stall_s: f64,
    /// What a hint fault cost the guest, as a multiple of the stall the
    /// handler saw: the vCPU time lost with tracking on (from `ratio`)
    /// over `hint_stall_s`. `None` until both phases have
    /// [`MIN_PHASE_PERIODS`] periods measured and some hint stall.
    pub guest_cost_factor: Option<f64>,
    /// Standard error of `guest_cost_factor`, from the spread of the
    /// phases' throughputs (one per phase).
    pub guest_cost_factor_stderr: Option<f64>,
    /// The factor differs from `tiering::mem::GUEST_COST_FACTOR` by more
    /// than [`SIGNIFICANT_SIGMAS`] standard errors: the run hands it to the
    /// sampler, which budgets with it from then on (else the default stays:
    /// the measurement does not contradict it).
    pub calibrated: bool,
}

/// Periods each phase must have measured before a guest cost factor is
/// computed (fewer are too noisy: one 1 s period of zipf varies by ~3%).
pub const MIN_PHASE_PERIODS: f64 = 2.0;
/// How many standard errors a measured guest cost factor must be from the
/// default before the run uses it (two: a 5% chance of acting on noise).
pub const SIGNIFICANT_SIGMAS: f64 = 2.0;

/// Drives the phases from the runner's samples.
#[derive(Debug)]
pub struct AbDriver {
    period_s: f64,
    tracking_on: bool,
    last_switch_s: f64,
    prev: Option<(f64, u64)>,
    skip_next: bool,
    started_s: Option<f64>,
    acc: [(f64, u64); 2],
    prev_stall_ns: Option<u64>,
    on_stall_ns: u64,
    vcpus: u32,
    /// The current phase so far: seconds, ops.
    segment: (f64, u64),
    /// Throughput of each finished phase, off then on.
    rates: [Vec<f64>; 2],
}

impl AbDriver {
    /// Phases of `period_s`, starting with tracking on, for a guest of
    /// `vcpus` vCPUs.
    pub fn new(period_s: f64, vcpus: u32) -> Self {
        Self {
            period_s,
            tracking_on: true,
            last_switch_s: 0.0,
            prev: None,
            skip_next: true,
            started_s: None,
            acc: [(0.0, 0); 2],
            prev_stall_ns: None,
            on_stall_ns: 0,
            vcpus: vcpus.max(1),
            segment: (0.0, 0),
            rates: [Vec::new(), Vec::new()],
        }
    }

    /// Feeds a sample (the guest's ops and the handler's hint stall so
    /// far); returns `Some(on)` when tracking must be switched.
    pub fn on_sample(&mut self, t_s: f64, ops: u64, hint_stall_ns: u64) -> Option<bool> {
        if self.started_s.is_none() && ops > 0 {
            self.started_s = Some(t_s);
        }
        let stall = hint_stall_ns.saturating_sub(self.prev_stall_ns.unwrap_or(hint_stall_ns));
        if let Some((pt, pops)) = self.prev {
            let warm = self
                .started_s
                .is_some_and(|s| t_s > s + 2.0 * self.period_s);
            // The guest writes the counter: one that goes backwards is
            // not a measurement, and the sum saturates.
            if warm && !self.skip_next && pops > 0 && ops >= pops {
                let a = &mut self.acc[usize::from(self.tracking_on)];
                a.0 += t_s - pt;
                a.1 = a.1.saturating_add(ops - pops);
                self.segment.0 += t_s - pt;
                self.segment.1 = self.segment.1.saturating_add(ops - pops);
                if self.tracking_on {
                    self.on_stall_ns = self.on_stall_ns.saturating_add(stall);
                }
            }
        }
        self.prev = Some((t_s, ops));
        self.prev_stall_ns = Some(hint_stall_ns);
        self.skip_next = false;
        if t_s - self.last_switch_s >= self.period_s {
            let (secs, ops) = std::mem::take(&mut self.segment);
            if secs >= 0.5 * self.period_s {
                self.rates[usize::from(self.tracking_on)].push(ops as f64 / secs);
            }
            self.tracking_on = !self.tracking_on;
            self.last_switch_s = t_s;
            self.skip_next = true;
            return Some(self.tracking_on);
        }
        None
    }

    /// The result so far.
    pub fn result(&self) -> TrackingAb {
        let rate = |(s, o): (f64, u64)| if s > 0.0 { o as f64 / s } else { 0.0 };
        let (on, off) = (rate(self.acc[1]), rate(self.acc[0]));
        let ratio = if off > 0.0 { on / off } else { 0.0 };
        TrackingAb {
            period_s: self.period_s,
            on_s: self.acc[1].0,
            off_s: self.acc[0].0,
            on_ops_per_sec: on,
            off_ops_per_sec: off,
            ratio,
            hint_stall_s: self.on_stall_ns as f64 / 1e9,
            guest_cost_factor: None,
            guest_cost_factor_stderr: None,
            calibrated: false,
        }
        .with_factor(self.factor(ratio))
    }

    /// The vCPU time lost in the on phases over the hint stall seen in
    /// them (see [`TrackingAb::guest_cost_factor`]; a ratio of 1 or more,
    /// no loss measured, gives the least factor, 1), and its standard error.
    fn factor(&self, ratio: f64) -> Option<(f64, f64)> {
        let enough = MIN_PHASE_PERIODS * self.period_s;
        let stall_s = self.on_stall_ns as f64 / 1e9;
        if self.acc[1].0 < enough || self.acc[0].0 < enough || stall_s <= 0.0 || ratio <= 0.0 {
            return None;
        }
        // vCPU-seconds of guest time per unit of (1 - ratio).
        let scale = self.acc[1].0 * f64::from(self.vcpus) / stall_s;
        let (lo, hi) = tiering::mem::GUEST_COST_FACTOR_RANGE;
        let factor = ((1.0 - ratio).max(0.0) * scale).clamp(lo, hi);
        let rel = |v: &[f64]| mean_stderr(v).map(|(m, se)| if m > 0.0 { se / m } else { 0.0 });
        let (on_rel, off_rel) = (rel(&self.rates[1])?, rel(&self.rates[0])?);
        let ratio_se = ratio * on_rel.hypot(off_rel);
        Some((factor, ratio_se * scale))
    }
}

impl TrackingAb {
    fn with_factor(mut self, f: Option<(f64, f64)>) -> Self {
        if let Some((factor, se)) = f {
            self.guest_cost_factor = Some(factor);
            self.guest_cost_factor_stderr = Some(se);
            self.calibrated =
                (factor - tiering::mem::GUEST_COST_FACTOR).abs() > SIGNIFICANT_SIGMAS * se;
        }
        self
    }
}

/// Mean and standard error of the mean of at least two values.
fn mean_stderr(v: &[f64]) -> Option<(f64, f64)> {
    if v.len() < 2 {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, (var / n).sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_alternate_and_rates_split() {
        let mut d = AbDriver::new(1.0, 1);
        let mut ops = 0u64;
        let mut switches = 0;
        let mut on = true;
        for i in 1..=100 {
            let t = i as f64 * 0.1;
            // 1000 ops/s with tracking on, 2000 with it off.
            ops += if on { 100 } else { 200 };
            if let Some(s) = d.on_sample(t, ops, 0) {
                on = s;
                switches += 1;
            }
        }
        assert!(switches >= 9);
        let r = d.result();
        assert!((r.on_ops_per_sec - 1000.0).abs() < 1.0, "{r:?}");
        assert!((r.off_ops_per_sec - 2000.0).abs() < 1.0, "{r:?}");
        assert!((r.ratio - 0.5).abs() < 0.01);
        assert!(r.on_s > 2.0 && r.off_s > 2.0);
    }

    #[test]
    fn a_counter_that_goes_backwards_is_not_counted() {
        let mut d = AbDriver::new(1.0, 1);
        // A guest alternating its counter between small and huge values.
        for i in 1..=100u64 {
            let ops = if i % 2 == 0 { u64::MAX - i } else { i };
            let _ = d.on_sample(i as f64 * 0.1, ops, 0);
        }
        let r = d.result();
        assert!(r.on_ops_per_sec.is_finite() && r.off_ops_per_sec.is_finite());
        // Only the forward steps count: each is below u64::MAX, and the
        // sums saturate instead of wrapping (or panicking in debug builds).
        assert!(r.on_ops_per_sec > 0.0 || r.off_ops_per_sec > 0.0, "{r:?}");
    }

    #[test]
    fn the_guest_cost_factor_is_the_lost_time_over_the_stall_seen() {
        // 2 vCPUs, tracking on: 900 ops/s and 10 ms of hint stall per
        // second; off: 1000 ops/s. Lost with tracking on: 10% of 2 vCPU-s
        // per second = 200 ms per 10 ms seen: a factor of 20.
        let mut d = AbDriver::new(1.0, 2);
        let (mut ops, mut stall, mut on) = (0u64, 0u64, true);
        let mut last = None;
        for i in 1..=200 {
            let t = i as f64 * 0.1;
            ops += if on { 90 } else { 100 };
            if on {
                stall += 1_000_000;
            }
            if let Some(s) = d.on_sample(t, ops, stall) {
                on = s;
            }
            last = Some(d.result());
        }
        let r = last.unwrap();
        let f = r.guest_cost_factor.unwrap();
        assert!((f - 20.0).abs() < 1.0, "{r:?}");
        // No noise at all: far from the default in standard errors.
        assert!(r.calibrated, "{r:?}");
        // With no loss measured, the factor is the least: 1.
        let mut d = AbDriver::new(1.0, 1);
        let (mut stall, mut on) = (0u64, true);
        for i in 1..=100u64 {
            if on {
                stall += 1_000_000;
            }
            if let Some(s) = d.on_sample(i as f64 * 0.1, i * 100, stall) {
                on = s;
            }
        }
        assert_eq!(d.result().guest_cost_factor, Some(1.0));
    }

    #[test]
    fn a_factor_within_the_noise_is_not_used() {
        // Throughput alternating 1000 and 1300 ops/s per phase whatever
        // tracking does: a 2% mean loss would say a factor near the
        // default, but the spread makes it no measurement.
        let mut d = AbDriver::new(1.0, 1);
        let (mut ops, mut stall, mut on, mut phase) = (0u64, 0u64, true, 0u64);
        for i in 1..=200 {
            let fast = (phase / 2) % 2 == 0;
            ops += if fast { 130 } else { 100 };
            if on {
                stall += 1_000_000;
            }
            if let Some(s) = d.on_sample(i as f64 * 0.1, ops, stall) {
                on = s;
                phase += 1;
            }
        }
        let r = d.result();
        assert!(r.guest_cost_factor.is_some(), "{r:?}");
        assert!(!r.calibrated, "{r:?}");
    }

    #[test]
    fn no_factor_before_both_phases_have_two_periods() {
        let mut d = AbDriver::new(1.0, 1);
        for i in 1..=35u64 {
            let _ = d.on_sample(i as f64 * 0.1, i * 100, i * 1_000_000);
        }
        // Warm-up (2 s after the first op) leaves too little of each phase.
        assert_eq!(d.result().guest_cost_factor, None, "{:?}", d.result());
    }
}
