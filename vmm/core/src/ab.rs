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
}

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
}

impl AbDriver {
    /// Phases of `period_s`, starting with tracking on.
    pub fn new(period_s: f64) -> Self {
        Self {
            period_s,
            tracking_on: true,
            last_switch_s: 0.0,
            prev: None,
            skip_next: true,
            started_s: None,
            acc: [(0.0, 0); 2],
        }
    }

    /// Feeds a sample; returns `Some(on)` when tracking must be switched.
    pub fn on_sample(&mut self, t_s: f64, ops: u64) -> Option<bool> {
        if self.started_s.is_none() && ops > 0 {
            self.started_s = Some(t_s);
        }
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
            }
        }
        self.prev = Some((t_s, ops));
        self.skip_next = false;
        if t_s - self.last_switch_s >= self.period_s {
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
        TrackingAb {
            period_s: self.period_s,
            on_s: self.acc[1].0,
            off_s: self.acc[0].0,
            on_ops_per_sec: on,
            off_ops_per_sec: off,
            ratio: if off > 0.0 { on / off } else { 0.0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_alternate_and_rates_split() {
        let mut d = AbDriver::new(1.0);
        let mut ops = 0u64;
        let mut switches = 0;
        let mut on = true;
        for i in 1..=100 {
            let t = i as f64 * 0.1;
            // 1000 ops/s with tracking on, 2000 with it off.
            ops += if on { 100 } else { 200 };
            if let Some(s) = d.on_sample(t, ops) {
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
        let mut d = AbDriver::new(1.0);
        // A guest alternating its counter between small and huge values.
        for i in 1..=100u64 {
            let ops = if i % 2 == 0 { u64::MAX - i } else { i };
            let _ = d.on_sample(i as f64 * 0.1, ops);
        }
        let r = d.result();
        assert!(r.on_ops_per_sec.is_finite() && r.off_ops_per_sec.is_finite());
        // Only the forward steps count: each is below u64::MAX, and the
        // sums saturate instead of wrapping (or panicking in debug builds).
        assert!(r.on_ops_per_sec > 0.0 || r.off_ops_per_sec > 0.0, "{r:?}");
    }
}
