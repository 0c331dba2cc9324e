//! Results of simulation runs: per-policy reports, a comparison table and JSON.

use serde::{Deserialize, Serialize};

/// One bucket of the throughput / latency timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineBucket {
    /// End of the bucket, modeled seconds.
    pub t_s: f64,
    /// Modeled application throughput, million accesses per second.
    pub throughput_maps: f64,
    /// Modeled average access latency (loaded tier latency, without stalls), ns.
    pub avg_latency_ns: f64,
    /// Share of accesses served by tier 0.
    pub fast_share: f64,
    /// The policy's mode at the end of the bucket (policies with modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// A change of the policy's mode (policies with modes: `adaptive`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModeChange {
    /// Modeled seconds.
    pub t_s: f64,
    /// The new mode.
    pub mode: String,
    /// Why, as the policy explained it.
    pub why: String,
}

/// Ticks a policy spent in one mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModeTicks {
    /// Mode.
    pub mode: String,
    /// Ticks in it.
    pub ticks: u64,
}

/// Most mode changes a report keeps (the first ones, then the last one).
pub const MAX_MODE_CHANGES: usize = 64;

/// Per-tier traffic over the run, GB (real units).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierTraffic {
    /// Tier name.
    pub name: String,
    /// Application accesses served (real-equivalent count).
    pub accesses: f64,
    /// Application bytes read and written back, GB.
    pub app_gb: f64,
    /// Migration copy bytes read or written here, GB.
    pub migration_gb: f64,
    /// Antagonist bytes, GB.
    pub antagonist_gb: f64,
    /// Access-weighted average loaded latency, ns.
    pub avg_loaded_latency_ns: f64,
    /// Pages (real-equivalent) holding master copies at the end.
    pub pages_at_end: f64,
}

/// Event counts, in real-equivalent units (modeled counts times the scale).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EventCounts {
    /// Pages moved to a faster tier (committed).
    pub promotions: f64,
    /// Pages moved to a slower tier (any mechanism).
    pub demotions: f64,
    /// Demotions done by remapping to a shadow (no copy): shadow hits.
    pub shadow_demotions: f64,
    /// Shadow demotions that found the shadow gone and copied instead.
    pub shadow_misses: f64,
    /// Transactional migrations committed.
    pub tpm_commits: f64,
    /// Transactional migrations aborted (written during the copy).
    pub tpm_aborts: f64,
    /// Write faults on shadowed masters (shadow dropped).
    pub shadow_write_faults: f64,
    /// Shadows dropped to relieve memory pressure.
    pub shadows_reclaimed: f64,
    /// Hint faults taken.
    pub hint_faults: f64,
    /// Of them, faults that left the page protected, so that the same
    /// access faulted again at once (5.13 TPP: an inactive slow page is
    /// only `mark_page_accessed`, its PTE left PROT_NONE).
    #[serde(default)]
    pub refaults: f64,
    /// Promotions done in the fault path.
    pub sync_promotions: f64,
    /// Accesses that waited for a page a stop-and-copy migration held
    /// (other threads busy-waiting on it, Matryoshka §2.2).
    #[serde(default)]
    pub page_lock_waits: f64,
    /// Decisions the engine refused (destination full): should stay 0.
    pub rejected: f64,
}

/// The result of running one policy on one scenario. All performance
/// numbers are **modeled**.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// Always true: these numbers come from a latency model.
    pub modeled: bool,
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Modeled seconds.
    pub duration_s: f64,
    /// Whole-run throughput, million accesses per second.
    pub throughput_maps: f64,
    /// Throughput over the first phase ("in progress").
    pub in_progress_maps: f64,
    /// Throughput over the last phase ("stable").
    pub stable_maps: f64,
    /// Average loaded latency per access over the run, ns.
    pub avg_latency_ns: f64,
    /// Event counts.
    pub counters: EventCounts,
    /// Event counts over the first phase ("in progress").
    #[serde(default)]
    pub in_progress_counters: EventCounts,
    /// Event counts over the last phase ("stable").
    #[serde(default)]
    pub stable_counters: EventCounts,
    /// Event counts of the benchmark's initialization (memset, warm-up
    /// round, sleep), which `counters` leaves out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_counters: Option<EventCounts>,
    /// Event counts of the sleeps between the measured rounds, when run
    /// (`BenchInit::sleep_between_rounds`), which `counters` leaves out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between_rounds_counters: Option<EventCounts>,
    /// The length of each measured round, modeled seconds, when the run is
    /// rounds of fixed operations timed by the model (`Scenario::rounds`;
    /// in progress is round 1's throughput, stable the last round's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_s: Vec<f64>,
    /// Per-tier traffic.
    pub tiers: Vec<TierTraffic>,
    /// Timeline.
    pub timeline: Vec<TimelineBucket>,
    /// Simulated (scaled) accesses, the benchmark's initialization's
    /// included (the simulator's work, not the measured throughput).
    pub simulated_accesses: u64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// Ticks per mode (policies with modes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modes: Vec<ModeTicks>,
    /// Mode changes with their reasons (at most [`MAX_MODE_CHANGES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mode_changes: Vec<ModeChange>,
    /// The mode at the end of the run and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_mode: Option<crate::policy::PolicyMode>,
}

impl SimReport {
    /// Simulated accesses per wall-clock second.
    pub fn sim_rate(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.simulated_accesses as f64 / self.wall_s
        } else {
            0.0
        }
    }
}

fn si(x: f64) -> String {
    let a = x.abs();
    if a >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}K", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A throughput in Macc/s: one decimal from 10 up, three below (an access
/// of Nomad's micro-benchmark is a whole 4 KiB page, about 1-2 M/s).
fn maps(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// A comparison table of several runs of one scenario.
pub fn table(reports: &[SimReport]) -> String {
    let mut s = String::new();
    if let Some(r) = reports.first() {
        s.push_str(&format!(
            "scenario {} ({} modeled s) -- MODELED results from a latency model, not measurements\n",
            r.scenario, r.duration_s
        ));
    }
    s.push_str(&format!(
        "{:<8} {:>9} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "policy",
        "Macc/s",
        "progress",
        "stable",
        "lat ns",
        "fast%",
        "promo",
        "demo",
        "shadowDm",
        "tpm ok",
        "tpm abrt",
        "hintflt",
        "refault",
        "sim Ma/s"
    ));
    for r in reports {
        let total: f64 = r.tiers.iter().map(|t| t.accesses).sum();
        let fast = r.tiers.first().map(|t| t.accesses).unwrap_or(0.0);
        let c = &r.counters;
        s.push_str(&format!(
            "{:<8} {:>9} {:>9} {:>9} {:>8.0} {:>6.1}% {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.1}\n",
            r.policy,
            maps(r.throughput_maps),
            maps(r.in_progress_maps),
            maps(r.stable_maps),
            r.avg_latency_ns,
            if total > 0.0 { 100.0 * fast / total } else { 0.0 },
            si(c.promotions),
            si(c.demotions),
            si(c.shadow_demotions),
            si(c.tpm_commits),
            si(c.tpm_aborts),
            si(c.hint_faults),
            si(c.refaults),
            r.sim_rate() / 1e6,
        ));
    }
    // Runs of rounds timed by the model: each policy's own round lengths
    // (progress = round 1, stable = the last round).
    for r in reports.iter().filter(|r| !r.round_s.is_empty()) {
        let rounds: Vec<String> = r.round_s.iter().map(|x| format!("{x:.1}")).collect();
        s.push_str(&format!(
            "{:<8} rounds (modeled s): {}\n",
            r.policy,
            rounds.join(" / ")
        ));
    }
    s
}

/// The modes of one run as text (empty for policies without modes).
pub fn mode_table(r: &SimReport) -> String {
    if r.modes.is_empty() {
        return String::new();
    }
    let total: u64 = r.modes.iter().map(|m| m.ticks).sum::<u64>().max(1);
    let mut s = format!("{} / {} modes (share of ticks):", r.scenario, r.policy);
    for m in &r.modes {
        s.push_str(&format!(
            " {} {:.0}%",
            m.mode,
            100.0 * m.ticks as f64 / total as f64
        ));
    }
    s.push('\n');
    if let Some(f) = &r.final_mode {
        s.push_str(&format!("  at the end: {} -- {}\n", f.mode, f.why));
    }
    s
}

/// Mode changes of one run as text.
pub fn mode_changes(r: &SimReport) -> String {
    let mut s = String::new();
    for c in &r.mode_changes {
        s.push_str(&format!("  {:>7.2}s {:<22} {}\n", c.t_s, c.mode, c.why));
    }
    s
}

/// Per-tier traffic of one run as text.
pub fn tier_table(r: &SimReport) -> String {
    let mut s = format!("{} / {} per-tier traffic (modeled)\n", r.scenario, r.policy);
    s.push_str(&format!(
        "{:<12} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
        "tier", "accesses", "app GB", "migr GB", "antag GB", "lat ns"
    ));
    for t in &r.tiers {
        s.push_str(&format!(
            "{:<12} {:>10} {:>9.1} {:>9.2} {:>9.1} {:>9.0}\n",
            t.name,
            si(t.accesses),
            t.app_gb,
            t.migration_gb,
            t.antagonist_gb,
            t.avg_loaded_latency_ns
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(policy: &str, round_s: Vec<f64>, refaults: f64) -> SimReport {
        SimReport {
            modeled: true,
            scenario: "s".into(),
            policy: policy.into(),
            duration_s: 1.0,
            throughput_maps: 1.0,
            in_progress_maps: 1.0,
            stable_maps: 1.0,
            avg_latency_ns: 100.0,
            counters: EventCounts {
                refaults,
                ..EventCounts::default()
            },
            in_progress_counters: EventCounts::default(),
            stable_counters: EventCounts::default(),
            warmup_counters: None,
            between_rounds_counters: None,
            round_s,
            tiers: Vec::new(),
            timeline: Vec::new(),
            simulated_accesses: 0,
            wall_s: 0.0,
            modes: Vec::new(),
            mode_changes: Vec::new(),
            final_mode: None,
        }
    }

    /// The text table shows refaults and, for runs of rounds, each
    /// policy's round lengths (runs without rounds print no such line).
    #[test]
    fn the_table_shows_refaults_and_round_lengths() {
        let t = table(&[
            report("tpp-lru", vec![189.4, 23.1, 15.6, 14.4], 99.5e6),
            report("static", Vec::new(), 0.0),
        ]);
        assert!(t.contains("refault"), "{t}");
        assert!(t.contains("99.50M"), "{t}");
        assert!(
            t.contains("tpp-lru  rounds (modeled s): 189.4 / 23.1 / 15.6 / 14.4"),
            "{t}"
        );
        assert!(!t.contains("static   rounds"), "{t}");
    }
}
