//! What `tiervm compare` shows: each run's record, the per-policy summary
//! (medians and ratios), the human table, `results.csv`, `results.json`'s
//! shape and the two SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::presentation::plot::{self, BarGroup, Series};
use crate::presentation::progress::si;
use crate::presentation::stats::{median, ratio};
use crate::presentation::table::render_table;
use vmm_core::report::RunReport;
use vmm_core::tiering_config::{PlacementArg, PolicyArg};
use vmm_core::units::format_size;
use vmm_core::units::group;

/// Guest console lines kept in a failed run's error message.
const CONSOLE_TAIL_LINES: usize = 3;

/// One VM run of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    /// The policy.
    pub policy: PolicyArg,
    /// Repeat number, from 1.
    pub repeat: u32,
    /// The run finished and the guest exited 0.
    pub ok: bool,
    /// What `tiervm run` would have exited with (0 ok, 1 guest failure, 3 crash, other: VMM error).
    pub exit_code: i32,
    /// Why the run failed, when it did.
    pub error: Option<String>,
    /// The run's report (absent when the VMM failed before finishing).
    pub report: Option<RunReport>,
}

impl RunRecord {
    /// A finished run.
    pub fn finished(policy: PolicyArg, repeat: u32, report: RunReport, console: &str) -> Self {
        let exit_code = vmm_core::report::code_of(&report);
        let error = (exit_code != 0).then(|| {
            let mut e = match (&report.crash, report.exit_code) {
                (Some(c), _) => format!("guest crashed: {c}"),
                (None, Some(c)) => format!("guest exited with code {c}"),
                (None, None) => format!(
                    "guest never exited ({:?}: it ignored the stop request)",
                    report.stop_reason
                ),
            };
            let tail = console_tail(console, CONSOLE_TAIL_LINES);
            if !tail.is_empty() {
                let _ = write!(e, "; console: {tail}");
            }
            e
        });
        Self {
            policy,
            repeat,
            ok: exit_code == 0,
            exit_code,
            error,
            report: Some(report),
        }
    }

    /// A run the VMM could not finish: the process exit code and the
    /// error line it would have ended with.
    pub fn failed(policy: PolicyArg, repeat: u32, exit_code: i32, error: String) -> Self {
        Self {
            policy,
            repeat,
            ok: false,
            exit_code,
            error: Some(error),
            report: None,
        }
    }

    fn p99_ns(&self) -> Option<f64> {
        self.report
            .as_ref()
            .and_then(|r| r.guest_metrics.get("p99_ns").copied())
    }
}

/// The last `n` non-empty console lines, joined with " | ".
fn console_tail(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// One policy's line of the table (medians over its successful runs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryRow {
    /// The policy.
    pub policy: PolicyArg,
    /// Runs made.
    pub runs: usize,
    /// Runs that failed (not counted in the statistics).
    pub failed: usize,
    /// Median ops/s.
    pub ops_per_sec_median: Option<f64>,
    /// Lowest ops/s.
    pub ops_per_sec_min: Option<f64>,
    /// Highest ops/s.
    pub ops_per_sec_max: Option<f64>,
    /// Median ops/s divided by static's median ops/s.
    pub ratio_to_static: Option<f64>,
    /// Median of the guest's `p99_ns` metric, when the image reports it.
    pub p99_ns_median: Option<f64>,
    /// Median pages promoted.
    pub promotions: Option<f64>,
    /// Median pages demoted.
    pub demotions: Option<f64>,
    /// Median aborted transactional migrations.
    pub tpm_aborts: Option<f64>,
    /// Median demotions done by remapping a shadow.
    pub shadow_demotions: Option<f64>,
    /// Median vCPU time blocked in migration faults, ms.
    pub guest_stall_ms: Option<f64>,
    /// Median share of vCPU time spent in hint faults, percent.
    pub tracking_overhead_pct: Option<f64>,
    /// Distinct exit codes of the runs, ascending.
    pub exit_codes: Vec<i32>,
}

/// Summarizes the runs per policy, in `policies` order. `tracked[i]`:
/// whether access tracking ran under `policies[i]` (else its overhead is
/// left empty rather than shown as 0). A guest's `p99_ns` counts only from
/// runs that completed operations.
pub fn summarize(policies: &[PolicyArg], runs: &[RunRecord], tracked: &[bool]) -> Vec<SummaryRow> {
    let mut rows: Vec<SummaryRow> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tracking_on = tracked.get(i).copied().unwrap_or(false);
            let mine: Vec<&RunRecord> = runs.iter().filter(|r| r.policy == *p).collect();
            let ok: Vec<&RunReport> = mine
                .iter()
                .filter(|r| r.ok)
                .filter_map(|r| r.report.as_ref())
                .collect();
            let pick = |f: &dyn Fn(&RunReport) -> Option<f64>| -> Option<f64> {
                let v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
                median(&v)
            };
            let ops: Vec<f64> = ok.iter().map(|r| r.ops_per_sec).collect();
            let mut exit_codes: Vec<i32> = mine.iter().map(|r| r.exit_code).collect();
            exit_codes.sort_unstable();
            exit_codes.dedup();
            SummaryRow {
                policy: *p,
                runs: mine.len(),
                failed: mine.iter().filter(|r| !r.ok).count(),
                ops_per_sec_median: median(&ops),
                ops_per_sec_min: ops.iter().copied().reduce(f64::min),
                ops_per_sec_max: ops.iter().copied().reduce(f64::max),
                ratio_to_static: None,
                p99_ns_median: pick(&|r| {
                    r.guest_metrics.get("p99_ns").copied().filter(|_| r.ops > 0)
                }),
                promotions: pick(&|r| r.migration.as_ref().map(|m| m.promotions as f64)),
                demotions: pick(&|r| r.migration.as_ref().map(|m| m.demotions as f64)),
                tpm_aborts: pick(&|r| r.migration.as_ref().map(|m| m.tpm_aborts as f64)),
                shadow_demotions: pick(&|r| {
                    r.migration.as_ref().map(|m| m.shadow_demotions as f64)
                }),
                guest_stall_ms: pick(&|r| r.migration.as_ref().map(|m| m.guest_stall_ms)),
                tracking_overhead_pct: pick(&|r| {
                    r.tracking
                        .as_ref()
                        .filter(|_| tracking_on)
                        .map(|t| t.tracking_overhead_pct)
                }),
                exit_codes,
            }
        })
        .collect();
    let baseline = rows
        .iter()
        .find(|r| r.policy == PolicyArg::Static)
        .and_then(|r| r.ops_per_sec_median);
    for r in &mut rows {
        r.ratio_to_static = ratio(r.ops_per_sec_median, baseline);
    }
    rows
}

/// What the runs had in common (the table header and results.json).
#[derive(Clone, Debug, Serialize)]
pub struct Setup {
    /// Image name or path.
    pub image: String,
    /// Effective workload arguments.
    pub args: BTreeMap<String, String>,
    /// Guest RAM bytes.
    pub mem_bytes: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Requested run length per VM, seconds (0 = until the guest exits).
    pub duration_s: f64,
    /// Guest seed.
    pub seed: u64,
    /// Sampling period of the timelines, ms.
    pub sample_ms: u64,
    /// Initial placement.
    pub placement: PlacementArg,
    /// Fast-tier capacity in bytes (tiered runs).
    pub fast_bytes: Option<u64>,
    /// Slow-tier capacity in bytes (tiered runs).
    pub slow_bytes: Option<u64>,
    /// Runs per policy.
    pub repeat: u32,
    /// Both tiers are the same host DRAM: tier latency is not real (it is
    /// emulated in the guest with `--emulate-latency`, else placement does
    /// not change it).
    pub emulated_tiers: bool,
    /// `--emulate-latency`: `emulated latency: fast 150 ns, slow 407 ns`.
    pub emulated_latency: Option<String>,
    /// With emulation: the host DRAM latency every run was charged against
    /// (the first run's boot measurement, or `host-dram=`), ns.
    pub host_dram_ns: Option<f64>,
    /// With emulation: what a cache-missing access cost per tier on this
    /// host, unloaded (the configured latencies, or, on a host whose DRAM is
    /// slower than the fast tier, the host's latency plus the tiers'
    /// differences), ns.
    pub emulated_costs_ns: Option<Vec<f64>>,
    /// With emulation and a cache model smaller than this host's LLC: what
    /// that does to the comparison ([`EmulationConfig::cache_model_caveat`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulation_caveat: Option<String>,
    /// What the first run's host LLC model did, when the cache model is
    /// smaller than the host's LLC (`EmulationReport::host_cache`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulation_host_cache: Option<String>,
}

/// Everything `results.json` holds.
#[derive(Clone, Debug, Serialize)]
pub struct CompareResults {
    /// Schema name and version.
    pub schema: &'static str,
    /// The common settings.
    pub setup: Setup,
    /// Policies in run order.
    pub policies: Vec<PolicyArg>,
    /// One row per policy.
    pub summary: Vec<SummaryRow>,
    /// Every run, in the order they ran.
    pub runs: Vec<RunRecord>,
    /// The signal (`SIGINT`, `SIGTERM`) that stopped the comparison early:
    /// the run it arrived in ended as at `--duration`, no later run started.
    pub interrupted_by: Option<String>,
}

/// A latency in nanoseconds, readable (`850 ns`, `1.25 us`, `3.40 ms`).
pub fn format_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "-".into()
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// The table's column headers.
pub const TABLE_HEADERS: [&str; 12] = [
    "policy",
    "ops/s",
    "min-max",
    "vs static",
    "p99",
    "promotions",
    "demotions",
    "TPM aborts",
    "shadow dem.",
    "stall ms",
    "tracking %",
    "exit",
];

/// One table row's cells.
pub fn table_cells(r: &SummaryRow) -> Vec<String> {
    let count = |v: f64| group(v.round() as u64);
    let min_max = match (r.ops_per_sec_min, r.ops_per_sec_max) {
        (Some(a), Some(b)) if r.runs - r.failed > 1 => format!("{}-{}", si(a), si(b)),
        _ => "-".into(),
    };
    let exit = if r.failed == 0 {
        r.exit_codes
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    } else {
        let codes: Vec<String> = r.exit_codes.iter().map(i32::to_string).collect();
        format!("{} FAILED ({}/{})", codes.join(","), r.failed, r.runs)
    };
    vec![
        r.policy.to_string(),
        opt(r.ops_per_sec_median, si),
        min_max,
        opt(r.ratio_to_static, |v| format!("{v:.2}x")),
        opt(r.p99_ns_median, format_ns),
        opt(r.promotions, count),
        opt(r.demotions, count),
        opt(r.tpm_aborts, count),
        opt(r.shadow_demotions, count),
        opt(r.guest_stall_ms, |v| format!("{v:.1}")),
        opt(r.tracking_overhead_pct, |v| format!("{v:.2}")),
        exit,
    ]
}

/// The human report: header lines, the table and the failures.
pub fn format_human(res: &CompareResults) -> String {
    let mut out = String::new();
    write_setup(&mut out, res);
    write_emulation(&mut out, &res.setup);
    if let Some(sig) = &res.interrupted_by {
        let _ = writeln!(
            out,
            "  INTERRUPTED by {sig}: {} run(s) made; the last one was stopped early",
            res.runs.len()
        );
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = res.summary.iter().map(table_cells).collect();
    out.push_str(&render_table(&TABLE_HEADERS, &rows));
    write_failures(&mut out, &res.runs);
    out
}

/// The header's setup lines: image, VM, tiers and what was run.
fn write_setup(out: &mut String, res: &CompareResults) {
    let s = &res.setup;
    let args: Vec<String> = s.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = write!(out, "tiervm compare: image {}", s.image);
    if !args.is_empty() {
        let _ = write!(out, " ({})", args.join(" "));
    }
    let _ = writeln!(
        out,
        ", {} vCPU(s), {} RAM, seed {}",
        s.vcpus,
        format_size(s.mem_bytes),
        s.seed
    );
    if let (Some(f), Some(sl)) = (s.fast_bytes, s.slow_bytes) {
        let _ = writeln!(
            out,
            "  tiers: fast {} + slow {}, initial placement {}",
            format_size(f),
            format_size(sl),
            s.placement
        );
    }
    let length = if s.duration_s > 0.0 {
        format!("{:.1} s each", s.duration_s)
    } else {
        "each until the guest exits".into()
    };
    let _ = writeln!(
        out,
        "  {} policies x {} repeat(s), {length}, fresh VM per run, repeats interleaved",
        res.policies.len(),
        s.repeat
    );
    let _ = writeln!(
        out,
        "  Measured on this host: guest throughput (ops/s: median of repeats, min-max) and mechanism costs (migrations, TPM aborts, guest stall, tracking overhead); counters are medians."
    );
}

/// The header's lines on tier latency: emulated (and how), or not.
fn write_emulation(out: &mut String, s: &Setup) {
    if let Some(label) = &s.emulated_latency {
        let costs = s.emulated_costs_ns.as_ref().map_or(String::new(), |c| {
            let c: Vec<String> = c.iter().map(|x| format!("{x:.0}")).collect();
            format!(", a cache-missing access costs {} ns", c.join("/"))
        });
        let dram = s.host_dram_ns.map_or_else(
            || "host DRAM latency not measured (the image does not charge)".to_string(),
            |d| format!("host DRAM {d:.0} ns, measured by the first run{costs}"),
        );
        let _ = writeln!(
            out,
            "  Tier latency is EMULATED in the guest: {label} ({dram}); placement changes what an access costs, as modeled (docs/emulation.md: no memory-level parallelism or prefetching of a real link)."
        );
        if let Some(c) = &s.emulation_caveat {
            let _ = writeln!(out, "  CAVEAT: {c}.");
        }
        if let Some(h) = &s.emulation_host_cache {
            let _ = writeln!(out, "  First run's {h}.");
        }
    } else if s.emulated_tiers {
        let _ = writeln!(
            out,
            "  Tier latency is NOT emulated (no --emulate-latency): this host has one NUMA node, so both tiers are the same DRAM and placement does not change access latency here; differences come from mechanism costs."
        );
    }
}

/// The failed runs, if any, after the table.
fn write_failures(out: &mut String, runs: &[RunRecord]) {
    let failures: Vec<&RunRecord> = runs.iter().filter(|r| !r.ok).collect();
    if !failures.is_empty() {
        out.push_str("\nFailed runs:\n");
        for r in failures {
            let _ = writeln!(
                out,
                "  {} repeat {}: {}",
                r.policy,
                r.repeat,
                r.error.as_deref().unwrap_or("failed")
            );
        }
    }
}

/// The CSV header of `results.csv`.
pub const CSV_HEADER: [&str; 28] = [
    "policy",
    "repeat",
    "ok",
    "exit_code",
    "error",
    "stop_reason",
    "duration_s",
    "ops",
    "ops_per_sec",
    "p99_ns",
    "promotions",
    "demotions",
    "tpm_commits",
    "tpm_aborts",
    "tpm_retries",
    "stop_copy",
    "shadow_demotions",
    "shadow_invalidations",
    "shadow_reclaims",
    "skipped_no_space",
    "guest_stall_ms",
    "hint_faults",
    "tracking_overhead_pct",
    "fast_pages",
    "slow_pages",
    "emulated_latency",
    "host_dram_ns",
    "emulation_charged_ms",
];

/// Quotes a CSV field when it holds a comma, quote or line break (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// `results.csv`: a header and one row per run; empty cells where a value does not apply.
pub fn to_csv(runs: &[RunRecord]) -> String {
    let mut out = CSV_HEADER.join(",");
    out.push('\n');
    for run in runs {
        let r = run.report.as_ref();
        let m = r.and_then(|r| r.migration.as_ref());
        let t = r.and_then(|r| r.tracking.as_ref());
        let tier = |name: &str| {
            r.and_then(|r| r.tiers.as_ref())
                .and_then(|ts| ts.iter().find(|x| x.name == name))
                .map(|x| x.pages.to_string())
                .unwrap_or_default()
        };
        let u = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let f = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        let emu = r.and_then(|r| r.emulation.as_ref());
        let stop = r
            .and_then(|r| serde_json::to_value(r.stop_reason).ok())
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let cells = [
            run.policy.to_string(),
            run.repeat.to_string(),
            run.ok.to_string(),
            run.exit_code.to_string(),
            run.error.clone().unwrap_or_default(),
            stop,
            f(r.map(|r| r.duration_s)),
            u(r.map(|r| r.ops)),
            f(r.map(|r| r.ops_per_sec)),
            f(run.p99_ns()),
            u(m.map(|m| m.promotions)),
            u(m.map(|m| m.demotions)),
            u(m.map(|m| m.tpm_commits)),
            u(m.map(|m| m.tpm_aborts)),
            u(m.map(|m| m.tpm_retries)),
            u(m.map(|m| m.stop_copy)),
            u(m.map(|m| m.shadow_demotions)),
            u(m.map(|m| m.shadow_invalidations)),
            u(m.map(|m| m.shadow_reclaims)),
            u(m.map(|m| m.skipped_no_space)),
            f(m.map(|m| m.guest_stall_ms)),
            u(t.map(|t| t.hint_faults)),
            f(t.map(|t| t.tracking_overhead_pct)),
            tier("fast"),
            tier("slow"),
            emu.map(|e| e.label.clone()).unwrap_or_default(),
            f(emu.and_then(|e| e.host_dram_used_ns)),
            f(emu.map(|e| e.charged_ms)),
        ];
        let line: Vec<String> = cells.iter().map(|c| csv_field(c)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// The throughput plot's window in seconds: a whole number of sampling
/// periods, about 1/40 of the run (at least one period).
pub fn plot_window_s(sample_ms: u64, duration_s: f64) -> f64 {
    let sample_s = sample_ms.max(1) as f64 / 1e3;
    let k = if duration_s > 0.0 {
        (duration_s / 40.0 / sample_s).round().max(1.0)
    } else {
        1.0
    };
    k * sample_s
}

/// `throughput.svg`: ops/s per window over time, one line per
/// policy (its first run that produced a report).
pub fn throughput_svg(res: &CompareResults) -> std::result::Result<String, plot::PlotError> {
    let window_s = plot_window_s(res.setup.sample_ms, res.setup.duration_s);
    // Samples come a little late or early; accept windows 10% short.
    let min_window_s = window_s * 0.9;
    let series: Vec<Series> = res
        .policies
        .iter()
        .filter_map(|p| {
            let run = res
                .runs
                .iter()
                .filter(|r| r.policy == *p)
                .find_map(|r| r.report.as_ref().map(|rep| (r.repeat, rep)))?;
            let name = if run.0 == 1 {
                p.to_string()
            } else {
                format!("{p} (repeat {})", run.0)
            };
            Some(Series {
                name,
                points: plot::rates_from_timeline(&run.1.timeline, min_window_s),
            })
        })
        .collect();
    let emu = match &res.setup.emulated_latency {
        Some(label) => format!("; {label}"),
        None if res.setup.emulated_tiers => ", tiers on one node, latency not emulated".into(),
        None => String::new(),
    };
    plot::line_chart_svg(
        &format!(
            "Guest throughput per policy: {} (first repeat, measured{emu})",
            res.setup.image
        ),
        "time since vCPU start (s)",
        &format!("guest ops/s (per {window_s:.2} s window)"),
        &series,
    )
}

/// `migrations.svg`: medians of promotions, demotions, shadow demotions
/// and TPM aborts per policy.
pub fn migrations_svg(res: &CompareResults) -> std::result::Result<String, plot::PlotError> {
    let nan = f64::NAN;
    let groups: Vec<BarGroup> = res
        .summary
        .iter()
        .map(|r| BarGroup {
            name: r.policy.to_string(),
            values: vec![
                r.promotions.unwrap_or(nan),
                r.demotions.unwrap_or(nan),
                r.shadow_demotions.unwrap_or(nan),
                r.tpm_aborts.unwrap_or(nan),
            ],
        })
        .collect();
    plot::grouped_bars_svg(
        &format!(
            "Migration activity per policy: {} (median of {} repeat(s), measured{})",
            res.setup.image,
            res.setup.repeat,
            res.setup
                .emulated_latency
                .as_ref()
                .map_or(String::new(), |l| format!("; {l}"))
        ),
        "count (pages; aborts: transactions)",
        &["promotions", "demotions", "shadow demotions", "TPM aborts"],
        &groups,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiering::mem::MigrationCounters;
    use vmm_core::report::StopReason;
    use vmm_core::status::TimelinePoint;
    use vmm_core::vstate::tiered::TrackingReport;

    fn report(ops_per_sec: f64, promotions: u64, p99: Option<f64>) -> RunReport {
        let mut guest_metrics = BTreeMap::new();
        if let Some(p) = p99 {
            guest_metrics.insert("p99_ns".to_string(), p);
        }
        RunReport {
            image: "zipf".into(),
            args: BTreeMap::new(),
            seed: 1,
            vcpus: 1,
            mem_bytes: 128 << 20,
            duration_s: 1.0,
            exit_code: Some(0),
            stop_reason: StopReason::Duration,
            ops: ops_per_sec as u64,
            ops_per_sec,
            tier_timeline: Vec::new(),
            timeline: vec![
                TimelinePoint { t_s: 0.1, ops: 0 },
                TimelinePoint {
                    t_s: 1.1,
                    ops: ops_per_sec as u64,
                },
            ],
            vm_exits: 0,
            boot_ms: None,
            guest_metrics,
            console_bytes: 0,
            console_dropped: 0,
            unhandled_io: 0,
            mmio_exits: 0,
            crash: None,
            tiers: None,
            backing: None,
            migration: Some(MigrationCounters {
                promotions,
                demotions: promotions / 2,
                tpm_commits: promotions,
                tpm_aborts: 3,
                shadow_demotions: 1,
                guest_stall_ms: 2.5,
                ..MigrationCounters::default()
            }),
            tracking: Some(TrackingReport {
                hint_faults: 10,
                hint_stall_ms: 5.0,
                tracking_overhead_pct: 0.25,
                guest_cost_factor: 7.5,
                guest_cost_pct: 1.875,
                samples: 10,
            }),
            tiering: None,
            tracking_ab: None,
            emulation: None,
            signal: None,
            liveness: Default::default(),
        }
    }

    fn ok(policy: &str, repeat: u32, r: RunReport) -> RunRecord {
        let policy = policy.parse().expect("a policy name");
        RunRecord::finished(policy, repeat, r, "")
    }

    #[test]
    fn summary_uses_medians_of_successful_runs_and_ratios_to_static() {
        let mut bad = report(1.0, 0, None);
        bad.exit_code = Some(1);
        let runs = vec![
            ok("static", 1, report(100.0, 0, Some(900.0))),
            ok("tpp", 1, report(60.0, 10, Some(2000.0))),
            ok("static", 2, report(300.0, 0, Some(1100.0))),
            ok("tpp", 2, report(90.0, 30, None)),
            ok("static", 3, report(200.0, 0, Some(1000.0))),
            RunRecord::finished(PolicyArg::Tpp, 3, bad, "[guest] mismatch at page 7\n"),
        ];
        let names = vec![PolicyArg::Static, PolicyArg::Tpp];
        let rows = summarize(&names, &runs, &[true, true]);
        let s = &rows[0];
        assert_eq!((s.runs, s.failed), (3, 0));
        assert_eq!(s.ops_per_sec_median, Some(200.0));
        assert_eq!(
            (s.ops_per_sec_min, s.ops_per_sec_max),
            (Some(100.0), Some(300.0))
        );
        assert_eq!(s.ratio_to_static, Some(1.0));
        assert_eq!(s.p99_ns_median, Some(1000.0));
        let t = &rows[1];
        assert_eq!((t.runs, t.failed), (3, 1));
        assert_eq!(
            t.ops_per_sec_median,
            Some(75.0),
            "the failed run is left out"
        );
        assert_eq!(t.ratio_to_static, Some(0.375));
        assert_eq!(t.promotions, Some(20.0));
        assert_eq!(
            t.p99_ns_median,
            Some(2000.0),
            "only runs reporting p99 count"
        );
        assert_eq!(t.exit_codes, vec![0, 1]);
        let fail = runs[5].error.as_deref().unwrap();
        assert!(
            fail.contains("code 1") && fail.contains("mismatch at page 7"),
            "{fail}"
        );
        let untracked = summarize(&names, &runs, &[false, true]);
        assert_eq!(untracked[0].tracking_overhead_pct, None);
        assert_eq!(untracked[1].tracking_overhead_pct, Some(0.25));
        assert_eq!(rows[0].tracking_overhead_pct, Some(0.25));
    }

    #[test]
    fn p99_of_a_run_without_operations_is_not_a_latency() {
        let runs = vec![
            ok("mtm", 1, report(0.0, 0, Some(0.0))),
            ok("mtm", 2, report(10.0, 0, Some(700.0))),
        ];
        let rows = summarize(&[PolicyArg::Mtm], &runs, &[false]);
        assert_eq!(rows[0].p99_ns_median, Some(700.0));
        let rows = summarize(&[PolicyArg::Mtm], &runs[..1], &[false]);
        assert_eq!(rows[0].p99_ns_median, None);
        assert_eq!(table_cells(&rows[0])[4], "-");
    }

    #[test]
    fn no_ratio_without_static() {
        let runs = vec![ok("chaos", 1, report(5.0, 1, None))];
        let rows = summarize(&[PolicyArg::Chaos], &runs, &[false]);
        assert_eq!(rows[0].ratio_to_static, None);
        assert_eq!(table_cells(&rows[0])[3], "-");
    }

    #[test]
    fn table_cells_and_alignment() {
        let runs = vec![
            ok("static", 1, report(2_000_000.0, 0, None)),
            ok("static", 2, report(4_000_000.0, 0, None)),
            ok("chaos", 1, report(1_500_000.0, 12_345, Some(1500.0))),
            RunRecord::failed(PolicyArg::Chaos, 2, 1, "vCPU thread panicked".into()),
        ];
        let rows = summarize(&[PolicyArg::Static, PolicyArg::Chaos], &runs, &[true, true]);
        let a = table_cells(&rows[0]);
        assert_eq!(a[1], "3.00M");
        assert_eq!(a[2], "2.00M-4.00M");
        assert_eq!(a[3], "1.00x");
        assert_eq!(a[4], "-");
        assert_eq!(a[11], "0");
        let b = table_cells(&rows[1]);
        assert_eq!(b[2], "-", "one successful run has no spread");
        assert_eq!(b[3], "0.50x");
        assert_eq!(b[4], "1.50 us");
        assert_eq!(b[5], "12,345");
        assert_eq!(b[9], "2.5");
        assert_eq!(b[10], "0.25");
        assert_eq!(b[11], "0,1 FAILED (1/2)");
        let t = render_table(&TABLE_HEADERS, &[a, b]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("policy  "));
        assert!(lines[1].starts_with("------"));
        // Right-aligned numeric columns end at the same offset.
        let end = |l: &str, needle: &str| l.find(needle).map(|i| i + needle.len());
        assert_eq!(end(lines[0], "promotions"), end(lines[3], "12,345"));
        assert_eq!(end(lines[2], "3.00M"), end(lines[3], "1.50M"));
    }

    #[test]
    fn human_report_states_what_is_measured_and_emulation() {
        let runs = vec![ok("static", 1, report(10.0, 0, None))];
        let mut res = CompareResults {
            schema: "tiervm-compare/1",
            setup: Setup {
                image: "zipf".into(),
                args: BTreeMap::new(),
                mem_bytes: 128 << 20,
                vcpus: 1,
                duration_s: 1.0,
                seed: 1,
                sample_ms: 100,
                placement: PlacementArg::FastFirst,
                fast_bytes: Some(64 << 20),
                slow_bytes: Some(128 << 20),
                repeat: 1,
                emulated_tiers: true,
                emulated_latency: None,
                host_dram_ns: None,
                emulated_costs_ns: None,
                emulation_caveat: None,
                emulation_host_cache: None,
            },
            policies: vec![PolicyArg::Static],
            interrupted_by: None,
            summary: summarize(&[PolicyArg::Static], &runs, &[false]),
            runs,
        };
        let h = format_human(&res);
        assert!(h.contains("Measured on this host"), "{h}");
        assert!(h.contains("Tier latency is NOT emulated"), "{h}");
        assert!(h.contains("fast 64M + slow 128M"), "{h}");
        assert!(!h.contains("Failed runs"));
        res.setup.emulated_latency = Some("emulated latency: fast 80 ns, slow 250 ns".into());
        res.setup.host_dram_ns = Some(165.0);
        res.setup.emulated_costs_ns = Some(vec![165.0, 335.0]);
        let h = format_human(&res);
        assert!(
            h.contains("Tier latency is EMULATED in the guest: emulated latency: fast 80 ns, slow 250 ns (host DRAM 165 ns, measured by the first run, a cache-missing access costs 165/335 ns)"),
            "{h}"
        );
        let svg = throughput_svg(&res).unwrap();
        assert!(
            svg.contains("emulated latency: fast 80 ns, slow 250 ns"),
            "{svg}"
        );
        let svg = migrations_svg(&res).unwrap();
        assert!(
            svg.contains("emulated latency: fast 80 ns, slow 250 ns"),
            "{svg}"
        );
        res.setup.emulated_latency = None;
        res.setup.emulated_tiers = false;
        res.runs.push(RunRecord::failed(
            PolicyArg::Static,
            2,
            1,
            "vCPU thread panicked".into(),
        ));
        let h = format_human(&res);
        assert!(!h.contains("EMULATED") && !h.contains("emulated"), "{h}");
        assert!(h.contains("static repeat 2: vCPU thread panicked"), "{h}");
    }

    #[test]
    fn csv_quotes_fields_that_need_it() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
        let runs = vec![
            ok("static", 1, report(10.0, 0, Some(5.0))),
            RunRecord::failed(
                PolicyArg::Tpp,
                1,
                1,
                "writing x, \"y\" (check --out and free space): disk full".into(),
            ),
        ];
        let csv = to_csv(&runs);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].split(',').count(), CSV_HEADER.len());
        assert_eq!(lines[1].split(',').count(), CSV_HEADER.len());
        assert!(lines[1].starts_with("static,1,true,0,,duration,1,10,10,5,0,0,0,3,"));
        assert!(lines[2].starts_with(
            "tpp,1,false,1,\"writing x, \"\"y\"\" (check --out and free space): disk full\",,"
        ));
    }

    #[test]
    fn plot_window_is_a_sample_or_a_fortieth_of_the_run() {
        assert!((plot_window_s(100, 1.0) - 0.1).abs() < 1e-9);
        assert!((plot_window_s(100, 8.0) - 0.2).abs() < 1e-9);
        assert!((plot_window_s(100, 60.0) - 1.5).abs() < 1e-9);
        assert!((plot_window_s(50, 0.0) - 0.05).abs() < 1e-9);
    }

    #[test]
    fn console_tail_keeps_the_last_lines() {
        assert_eq!(console_tail("a\n\nb\nc\nd\n", 3), "b | c | d");
        assert_eq!(console_tail("", 3), "");
    }
}
