//! Loaded latency: every [`WINDOW`] the VMM sums the guest's per-tier
//! access counters, turns them into each tier's bandwidth use and, with the
//! simulator's queueing model ([`TierModel::loaded_ns`]), into each tier's
//! loaded latency, which it republishes for the guest to charge and hands
//! to the engine (Colloid's input, labeled modeled).

use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tiering::engine::{TierLoad, TierLoadSource};
use tiering::sim::model::TierModel;
use tiervm_guest::abi::{EmulationVcpu, CACHE_LINE, EMULATION_MAX_TIERS};

use super::config::EmulationConfig;

/// How often the loaded latency is recomputed (issue 12: "every ~10 ms";
/// Colloid's quantum).
pub const WINDOW: Duration = Duration::from_millis(10);
/// Weight of the newest target in each window's latency, as in the
/// simulator's damped fixed-point step (`sim::engine::solve_latency`).
pub const DAMPING: f64 = 0.5;
/// What the engine's report calls this source.
pub const SOURCE: &str = "modeled: latency emulation (guest access counters, queueing model)";

/// The guest's counters summed over its vCPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Charged (cache-missing) accesses per tier.
    pub accesses: [u64; EMULATION_MAX_TIERS],
    /// Of which writes.
    pub writes: [u64; EMULATION_MAX_TIERS],
    /// Cache-model hits.
    pub cache_hits: u64,
    /// Charged accesses the host LLC model says the host's cache served.
    pub host_cache_hits: u64,
    /// Charged, TSC cycles.
    pub charged_cycles: u64,
    /// Paid, TSC cycles.
    pub paid_cycles: u64,
    /// Preempted during payments, TSC cycles.
    pub preempted_cycles: u64,
    /// Payments.
    pub payments: u64,
}

impl Totals {
    /// The sum of `vcpus` (saturating: the values are guest-written).
    pub fn sum(vcpus: impl IntoIterator<Item = EmulationVcpu>) -> Self {
        let mut t = Self::default();
        for v in vcpus {
            for i in 0..EMULATION_MAX_TIERS {
                t.accesses[i] = t.accesses[i].saturating_add(v.accesses[i]);
                t.writes[i] = t.writes[i].saturating_add(v.writes[i]);
            }
            t.cache_hits = t.cache_hits.saturating_add(v.cache_hits);
            t.host_cache_hits = t.host_cache_hits.saturating_add(v.host_cache_hits);
            t.charged_cycles = t.charged_cycles.saturating_add(v.charged_cycles);
            t.paid_cycles = t.paid_cycles.saturating_add(v.paid_cycles);
            t.preempted_cycles = t.preempted_cycles.saturating_add(v.preempted_cycles);
            t.payments = t.payments.saturating_add(v.payments);
        }
        t
    }
}

/// The queueing model of every tier and its current loaded latency.
#[derive(Clone, Debug)]
pub struct LoadModel {
    models: Vec<TierModel>,
    antagonist: Vec<f64>,
    latency_ns: Vec<f64>,
    utilization: Vec<f64>,
}

impl LoadModel {
    /// The model of `cfg`'s tiers, starting unloaded (plus the antagonist).
    pub fn new(cfg: &EmulationConfig) -> Self {
        let models = cfg.tier_models();
        let antagonist: Vec<f64> = cfg.tiers.iter().map(|t| t.antagonist).collect();
        let latency_ns = models
            .iter()
            .zip(&antagonist)
            .map(|(m, &a)| m.loaded_ns(a))
            .collect();
        Self {
            utilization: antagonist.clone(),
            models,
            antagonist,
            latency_ns,
        }
    }

    /// One window in which tier `t` served `bytes_per_sec[t]`: utilization
    /// (plus the antagonist's) and the damped step towards the curve.
    pub fn step(&mut self, bytes_per_sec: &[f64]) {
        for (t, m) in self.models.iter().enumerate() {
            let b = bytes_per_sec.get(t).copied().unwrap_or(0.0).max(0.0);
            let u = b / (m.bandwidth_gbps * 1e9) + self.antagonist[t];
            self.utilization[t] = u;
            let target = m.loaded_ns(u);
            self.latency_ns[t] = (1.0 - DAMPING) * self.latency_ns[t] + DAMPING * target;
        }
    }

    /// Each tier's emulated latency without load, ns.
    pub fn unloaded_ns(&self) -> impl Iterator<Item = f64> + '_ {
        self.models.iter().map(|m| m.unloaded_ns)
    }

    /// Each tier's loaded latency, ns.
    pub fn latency_ns(&self) -> &[f64] {
        &self.latency_ns
    }

    /// Each tier's utilization in the last window (fraction of its bandwidth).
    pub fn utilization(&self) -> &[f64] {
        &self.utilization
    }
}

/// Bytes each tier served in a window: one line per charged access, one
/// more per write (the write-back, as the simulator counts it), plus the
/// migration copies.
pub fn window_bytes(d_accesses: &[u64], d_writes: &[u64], d_moved: &[u64]) -> Vec<f64> {
    (0..d_accesses.len())
        .map(|t| {
            // Guest-written counters: any value, so no integer arithmetic.
            let lines = d_accesses[t] as f64 + d_writes.get(t).copied().unwrap_or(0) as f64;
            lines * CACHE_LINE as f64 + d_moved.get(t).copied().unwrap_or(0) as f64
        })
        .collect()
}

/// The latest window's loads, shared with the engine.
#[derive(Debug, Default)]
pub struct LiveLoads {
    loads: Mutex<Option<Vec<TierLoad>>>,
}

impl LiveLoads {
    /// Stores a window's loads.
    pub fn set(&self, loads: Vec<TierLoad>) {
        *self.loads.lock().unwrap_or_else(|p| p.into_inner()) = Some(loads);
    }
}

impl TierLoadSource for LiveLoads {
    fn tier_loads(&self) -> Option<Vec<TierLoad>> {
        self.loads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn describe(&self) -> &'static str {
        SOURCE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_rises_with_load_like_the_simulator() {
        let cfg = EmulationConfig::parse("colloid").unwrap();
        let mut m = LoadModel::new(&cfg);
        assert_eq!(m.latency_ns(), &[70.0, 135.0]);
        // The slow tier at 60% of its 75 GB/s for many windows converges
        // to the simulator's curve.
        for _ in 0..40 {
            m.step(&[0.0, 0.6 * 75e9]);
        }
        let want = cfg.tier_models()[1].loaded_ns(0.6);
        assert!(
            (m.latency_ns()[1] - want).abs() < 1e-6,
            "{:?}",
            m.latency_ns()
        );
        assert!(m.latency_ns()[1] > 135.0 * 2.0);
        assert_eq!(m.latency_ns()[0], 70.0);
        assert!((m.utilization()[1] - 0.6).abs() < 1e-12);
        // One window halves the way (the damping).
        let before = m.latency_ns()[1];
        m.step(&[0.0, 0.0]);
        assert!((m.latency_ns()[1] - (before + 135.0) / 2.0).abs() < 1e-9);
    }

    #[test]
    fn an_antagonist_loads_its_tier_from_the_start() {
        let cfg = EmulationConfig::parse("colloid,antagonist=fast:0.51,queue-k=1.44").unwrap();
        let m = LoadModel::new(&cfg);
        // Colloid's calibration: 1x antagonist = 2.5x local latency.
        assert!(
            (m.latency_ns()[0] / 70.0 - 2.5).abs() < 0.01,
            "{:?}",
            m.latency_ns()
        );
    }

    #[test]
    fn window_bytes_count_write_backs_and_migrations() {
        let b = window_bytes(&[100, 10], &[50, 0], &[0, 4096]);
        assert_eq!(b, vec![150.0 * 64.0, 640.0 + 4096.0]);
    }

    #[test]
    fn totals_saturate_on_garbage() {
        let mut v = EmulationVcpu::default();
        v.accesses[1] = u64::MAX;
        v.cache_hits = 3;
        let t = Totals::sum([v, v]);
        assert_eq!(t.accesses[1], u64::MAX);
        assert_eq!(t.cache_hits, 6);
    }
}
