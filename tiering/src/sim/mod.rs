//! A deterministic, seeded, trace-driven simulator of tiered memory that
//! runs the same [`crate::policy`] code against modeled tiers.
//!
//! Everything it reports is **modeled**: tier latencies come from a
//! queueing curve calibrated to Colloid's measurements, mechanism costs
//! from [`model::CostModel`]. See `docs/simulator.md`.
//!
//! - [`scenario`]: built-in scenarios named after the seeds' experiments.
//! - [`workload`]: access streams over the shared guest generators.
//! - [`engine`]: the simulation loop ([`run`], [`run_with`]).
//! - [`report`]: per-policy results, a comparison table, JSON.

pub mod engine;
pub mod model;
pub mod report;
pub mod scenario;
pub mod workload;

pub use engine::{run, run_with, Placement};
pub use report::RunReport;
pub use scenario::{builtin, builtin_names, builtins, Scenario};

/// Simulator errors.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A scenario parameter is out of range.
    #[error("invalid scenario: {0}")]
    InvalidScenario(String),
    /// The footprint exceeds the tiers.
    #[error("footprint {footprint_gib} GiB does not fit in the tiers ({tiers_gib} GiB); raise a tier capacity or shrink the workload")]
    DoesNotFit {
        /// Workload footprint.
        footprint_gib: f64,
        /// Sum of tier capacities.
        tiers_gib: f64,
    },
    /// Policy construction failed.
    #[error(transparent)]
    Policy(#[from] crate::policy::Error),
}

/// Runs each policy in `policies` on `scn` (first-touch placement).
pub fn run_all(scn: &Scenario, policies: &[&str]) -> Result<Vec<RunReport>, SimError> {
    policies.iter().map(|p| run(scn, p)).collect()
}

/// Colloid's best case: `static` with `share` of the hot set in tier 0,
/// for each share in 0.0, 0.1, ..., 1.0 (GUPS scenarios). Returns
/// `(share, report)` pairs.
pub fn static_split_sweep(scn: &Scenario) -> Result<Vec<(f64, RunReport)>, SimError> {
    (0..=10)
        .map(|i| {
            let share = f64::from(i) / 10.0;
            run_with(scn, "static", Placement::HotShare(share)).map(|r| (share, r))
        })
        .collect()
}
