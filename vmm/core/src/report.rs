//! The report of a run: JSON (`--report json`, schema in `docs/report.md`)
//! and a human summary.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use crate::exit::EXIT_GUEST_CRASH;
use crate::status::TimelinePoint;
use crate::units::{format_size, group};
use crate::vstate::tiered::{TieringReport, TrackingReport};
use tiering::engine::EngineReport;
use tiering::mem::{BackingCounters, MigrationCounters, TierStats};

/// Why the VM stopped.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Every vCPU wrote its exit code.
    GuestExited,
    /// `--duration` ended and the guest exited after the stop request.
    Duration,
    /// The guest did not exit within the stop grace period; vCPUs were stopped.
    Forced,
    /// A vCPU crashed.
    Crashed,
    /// SIGINT or SIGTERM asked the run to stop and the guest exited after
    /// the stop request (as at the end of `--duration`).
    Signal,
    /// A vCPU stayed blocked on the memory engine past the watchdog's
    /// bound (`liveness.stalls` says where); the run failed.
    Stalled,
}

/// One run of one VM.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Image name or path.
    pub image: String,
    /// Effective workload arguments (defaults filled in for built-in images).
    pub args: BTreeMap<String, String>,
    /// Seed passed to the guest.
    pub seed: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM bytes.
    pub mem_bytes: u64,
    /// Wall time from the first vCPU start to the VM's end, seconds.
    pub duration_s: f64,
    /// The guest's exit code (vCPU 0's), `null` if it never exited.
    pub exit_code: Option<u32>,
    /// Why the VM stopped.
    pub stop_reason: StopReason,
    /// Total operations the guest reported.
    pub ops: u64,
    /// Operations per second while operations were counting.
    pub ops_per_sec: f64,
    /// Throughput timeline, one point per sample (per 2^k samples after
    /// [`crate::status::MAX_TIMELINE_POINTS`] points: a long run is thinned).
    pub timeline: Vec<TimelinePoint>,
    /// Tiered runs: every tier's capacity, use and kernel-measured host
    /// memory, one point per sample (empty when untiered).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tier_timeline: Vec<crate::status::TierTimelinePoint>,
    /// KVM exits of all vCPUs.
    pub vm_exits: u64,
    /// Milliseconds from VMM start to the first guest instruction.
    pub boot_ms: Option<f64>,
    /// Result metrics the guest published (validated).
    pub guest_metrics: BTreeMap<String, f64>,
    /// Guest console bytes forwarded and dropped over the cap.
    pub console_bytes: u64,
    /// Console bytes dropped.
    pub console_dropped: u64,
    /// Port-I/O exits to unclaimed ports.
    pub unhandled_io: u64,
    /// MMIO exits (no MMIO devices exist).
    pub mmio_exits: u64,
    /// Crash description, when a vCPU crashed.
    pub crash: Option<String>,
    /// Per-tier page counts (tiered runs only).
    pub tiers: Option<Vec<TierStats>>,
    /// How the tiers' host memory was committed (tiered runs only).
    pub backing: Option<BackingCounters>,
    /// Migration counters (tiered runs only).
    pub migration: Option<MigrationCounters>,
    /// Access-tracking counters (tiered runs only).
    pub tracking: Option<TrackingReport>,
    /// The tiering setup, its threads and its checks (tiered runs only).
    pub tiering: Option<TieringReport>,
    /// Tracking on/off throughput within this run (`--tracking-ab` only).
    pub tracking_ab: Option<crate::ab::TrackingAb>,
    /// Latency emulation (`--emulate-latency` only): what was emulated,
    /// the host DRAM latency measured at boot, what was charged.
    pub emulation: Option<crate::emulation::EmulationReport>,
    /// The stop signal received during the run (`SIGINT`, `SIGTERM`), if any.
    pub signal: Option<String>,
    /// How the vCPU threads spent their time (running, waiting for a CPU,
    /// blocked on the memory engine's faults), progress gaps and stalls
    /// (`crate::liveness`).
    pub liveness: crate::liveness::LivenessReport,
}

impl RunReport {
    /// A readable multi-line summary: the run, then (tiered runs) the
    /// tiers, migration, tracking and engine lines, then a crash.
    pub fn human(&self) -> String {
        let mut s = String::new();
        self.write_run(&mut s);
        if let Some(e) = &self.emulation {
            let _ = writeln!(s, "  emulation  {}", e.human());
        }
        if let Some(t) = &self.tiering {
            self.write_tiering(&mut s, t);
        }
        let _ = writeln!(s, "  liveness   {}", self.liveness.human());
        for st in &self.liveness.stalls {
            let _ = writeln!(
                s,
                "  STALL      vCPU {} blocked {:.1} s from {:.1} s{}: {}; {}",
                st.vcpu,
                st.blocked_s,
                st.t_s,
                if st.resolved { " (then ran again)" } else { "" },
                st.memory.as_deref().unwrap_or("untiered RAM"),
                st.action.as_deref().unwrap_or("nothing to do")
            );
        }
        if let Some(c) = &self.crash {
            let _ = writeln!(s, "  crash      {c}");
        }
        s
    }

    /// The image, the result, throughput, exits, metrics and console.
    fn write_run(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "tiervm run: image {} on {} vCPU(s), {} RAM, seed {}",
            self.image,
            self.vcpus,
            format_size(self.mem_bytes),
            self.seed
        );
        let args: Vec<String> = self.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !args.is_empty() {
            let _ = writeln!(s, "  args       {}", args.join(" "));
        }
        let how = match self.stop_reason {
            StopReason::GuestExited => "the guest exited",
            StopReason::Duration => "stopped at --duration",
            StopReason::Forced => {
                "FORCED: the guest did not acknowledge the stop request in time (Init or Run \
                 phase 0.5 s after it, or not ended within --stop-grace)"
            }
            StopReason::Crashed => "CRASHED",
            StopReason::Signal => "stopped by a signal",
            StopReason::Stalled => "STALLED: a vCPU stayed blocked on the memory engine",
        };
        let code = self.exit_code.map_or("none".to_string(), |c| c.to_string());
        let _ = writeln!(
            s,
            "  result     exit code {code} ({how}) after {:.2} s",
            self.duration_s
        );
        if let Some(sig) = &self.signal {
            let _ = writeln!(
                s,
                "  signal     {sig}: the guest was asked to stop; a second signal ends tiervm at once"
            );
        }
        if let Some(b) = self.boot_ms {
            let _ = writeln!(s, "  boot       {b:.1} ms to the first guest instruction");
        }
        let _ = writeln!(
            s,
            "  ops        {} total, {} ops/s while running",
            group(self.ops),
            group(self.ops_per_sec as u64)
        );
        let _ = writeln!(
            s,
            "  vm exits   {} ({} samples in the timeline)",
            group(self.vm_exits),
            self.timeline.len()
        );
        if !self.guest_metrics.is_empty() {
            let m: Vec<String> = self
                .guest_metrics
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(s, "  guest      {}", m.join(" "));
        }
        if let Some(line) = self.integrity_line() {
            let _ = writeln!(s, "  integrity  {line}");
        }
        if self.console_dropped > 0 {
            let _ = writeln!(
                s,
                "  console    {} bytes dropped over the cap",
                self.console_dropped
            );
        }
    }

    /// The tiers, migration, shadow, tracking and engine lines.
    fn write_tiering(&self, s: &mut String, t: &TieringReport) {
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .flatten()
            .map(|x| {
                let resident = x
                    .resident_bytes
                    .map_or(String::new(), |b| format!(" ({} MiB resident)", b >> 20));
                format!(
                    "{} node{} {}/{} pages{resident}",
                    x.name,
                    x.node,
                    group(x.pages),
                    group(x.capacity_pages)
                )
            })
            .collect();
        let emu = if t.emulated {
            " (emulated: both tiers on one host node)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "  tiers      policy {}: {}{emu}",
            t.policy,
            tiers.join(", ")
        );
        if self.backing.as_ref().is_some_and(|b| !b.locked) {
            let _ = writeln!(
                s,
                "  memory     NOT locked on fault: raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK \
                 (docs/host-requirements.md)"
            );
        }
        if let Some(m) = &self.migration {
            write_migration(s, m);
        }
        if let Some(tr) = self.tracking.as_ref().filter(|tr| tr.hint_faults > 0) {
            let _ = writeln!(
                s,
                "  tracking   hint faults {} ({:.1} ms, {:.2}% of vCPU time as the fault handler sees it)",
                group(tr.hint_faults),
                tr.hint_stall_ms,
                tr.tracking_overhead_pct
            );
        }
        if let Some(e) = &t.engine {
            write_engine(s, e);
        }
    }
}

/// The migration and shadow lines.
fn write_migration(s: &mut String, m: &MigrationCounters) {
    let _ = writeln!(
        s,
        "  migration  promotions {} demotions {} tpm commits {} aborts {} retries {} stop-copy {}",
        group(m.promotions),
        group(m.demotions),
        group(m.tpm_commits),
        group(m.tpm_aborts),
        group(m.tpm_retries),
        group(m.stop_copy),
    );
    let _ = writeln!(
        s,
        "  shadows    demotions {} invalidations {} reclaims {}; skipped (no space) {}; guest stall {:.1} ms",
        group(m.shadow_demotions),
        group(m.shadow_invalidations),
        group(m.shadow_reclaims),
        group(m.skipped_no_space),
        m.guest_stall_ms
    );
}

/// The engine line: policies with their start times, ticks, migrations.
fn write_engine(s: &mut String, e: &EngineReport) {
    let policies: Vec<String> = e
        .policies
        .iter()
        .map(|(p, at)| format!("{p}@{at:.1}s"))
        .collect();
    let probes = if e.probes_armed > 0 {
        format!("; accessed-bit probes armed {}", group(e.probes_armed))
    } else {
        String::new()
    };
    let readers: Vec<&str> = e
        .policies
        .iter()
        .filter(|(p, _)| p.reads_loaded_latency())
        .map(|(p, _)| p.name())
        .collect();
    let modeled = if e.latency_modeled && !readers.is_empty() {
        format!(" (tier latency for {}: modeled)", readers.join(", "))
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  engine     {}; ticks {}; migrations asked {} (fault path {}), pages moved {}{probes}{modeled}",
        policies.join(" -> "),
        group(e.ticks),
        group(e.migrations_requested),
        group(e.fault_path_migrations),
        group(e.pages_migrated)
    );
    if let Some(m) = &e.final_mode {
        let total: u64 = e.modes.iter().map(|(_, t)| *t).sum::<u64>().max(1);
        let shares: Vec<String> = e
            .modes
            .iter()
            .map(|(n, t)| format!("{n} {:.0}%", 100.0 * *t as f64 / total as f64))
            .collect();
        let _ = writeln!(
            s,
            "  mode       {} at the end ({}); ticks: {}",
            m.mode,
            m.why,
            shares.join(", ")
        );
    }
    if let Some(d) = &e.damon {
        let cpu = d
            .cpu_pct
            .map_or("n/a".to_string(), |p| format!("{p:.2}% of one CPU"));
        let _ = writeln!(
            s,
            "  damon      {} snapshots ({} us sampling, {} us aggregation), {:.0} regions and {:.0} accessed pages on average; cost {cpu} (kdamond + reader, real), no guest faults; errors {}; teardown {}",
            group(d.snapshots),
            d.sample_us,
            d.aggr_us,
            d.regions_mean,
            d.accessed_pages_mean,
            group(d.errors),
            d.teardown
        );
    }
}

impl RunReport {
    /// memcheck's verdict for the summary: how many pages lost a write,
    /// from the guest's `mismatched_pages` metric (`None` for other images).
    pub fn integrity_line(&self) -> Option<String> {
        let lost = *self.guest_metrics.get("mismatched_pages")?;
        let of = self
            .guest_metrics
            .get("pages")
            .map(|p| format!(" of {}", group(*p as u64)))
            .unwrap_or_default();
        Some(if lost == 0.0 {
            format!("no page lost a write (0{of} pages)")
        } else {
            format!(
                "LOST WRITES: {}{of} pages lost a write (tiervm exits 1)",
                group(lost as u64)
            )
        })
    }
}

/// The process exit code of a finished run: 0 when the guest reported
/// success, [`EXIT_GUEST_CRASH`] when it crashed, 1 otherwise.
pub fn code_of(report: &RunReport) -> i32 {
    match (report.stop_reason, report.exit_code) {
        (StopReason::Crashed, _) => EXIT_GUEST_CRASH,
        (_, Some(0)) => 0,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memcheck_report(lost: f64) -> RunReport {
        RunReport {
            image: "memcheck".into(),
            args: BTreeMap::new(),
            seed: 1,
            vcpus: 2,
            mem_bytes: 64 << 20,
            duration_s: 1.0,
            exit_code: Some(lost as u32),
            stop_reason: StopReason::Duration,
            ops: 10,
            ops_per_sec: 10.0,
            timeline: Vec::new(),
            vm_exits: 4,
            boot_ms: None,
            guest_metrics: [("mismatched_pages", lost), ("pages", 4096.0)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            console_bytes: 0,
            console_dropped: 0,
            unhandled_io: 0,
            mmio_exits: 0,
            crash: None,
            tiers: None,
            migration: None,
            tracking: None,
            tiering: None,
            tracking_ab: None,
            signal: None,
            liveness: Default::default(),
            emulation: None,
            backing: None,
            tier_timeline: Vec::new(),
        }
    }

    #[test]
    fn the_summary_counts_lost_pages_and_the_exit_code_is_1() {
        let bad = memcheck_report(1234.0);
        assert!(
            bad.human()
                .contains("integrity  LOST WRITES: 1,234 of 4,096 pages lost a write"),
            "{}",
            bad.human()
        );
        assert_eq!(code_of(&bad), 1);
        let good = memcheck_report(0.0);
        assert!(good
            .human()
            .contains("integrity  no page lost a write (0 of 4,096 pages)"));
        assert_eq!(code_of(&good), 0);
    }

    /// README and the guest ABI say what the code does (they once said the
    /// exit code was the number of lost pages).
    #[test]
    fn docs_state_the_memcheck_exit_code() {
        let promise = "tiervm exits 1 when any page lost a write";
        assert!(include_str!("../../../README.md").contains(promise));
        assert!(include_str!("../../../docs/guest-abi.md").contains(promise));
    }

    use crate::vstate::tiered::TieringReport;
    use tiering::mem::MemStats;

    /// Every mechanism counter is in exactly one report section, and the
    /// `tiering` section repeats none of them.
    #[test]
    fn each_counter_is_reported_once() {
        let t = TieringReport {
            policy: "static".into(),
            emulated: true,
            setup_ms: 0.0,
            stats: MemStats::default(),
            chaos: None,
            resize: None,
            samples: 0,
            engine: None,
            consistency: "ok".into(),
            fatal: None,
            node_check: "ok".into(),
            node_checked_pages: 0,
            node_pages: None,
        };
        let section = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        let migration = section(serde_json::to_value(t.migration()).unwrap());
        let backing = section(serde_json::to_value(t.backing()).unwrap());
        let tracking = section(serde_json::to_value(t.tracking(1, 1.0)).unwrap());
        let tiering = section(serde_json::to_value(&t).unwrap());
        let stats = section(serde_json::to_value(&t.stats).unwrap());
        for key in stats.keys() {
            // The per-tier list is the report's `tiers`; the sampler's
            // last-period overhead is superseded by the whole run's.
            if key == "tiers" || key == "tracking_overhead_pct" {
                continue;
            }
            let places = [&migration, &backing, &tracking, &tiering]
                .iter()
                .filter(|s| s.contains_key(key))
                .count();
            assert_eq!(places, 1, "counter `{key}` is reported {places} times");
        }
        assert!(!tiering.contains_key("stats") && !tiering.contains_key("samples"));
        assert!(tracking.contains_key("tracking_overhead_pct"));
    }
}
