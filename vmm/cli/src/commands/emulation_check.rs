//! `tiervm emulation-check`: the validation of latency emulation
//! (issue 12, docs/emulation.md), measured side by side on this host:
//!
//! * **linearity**: GUPS with uniform accesses, every access charged (no
//!   cache model), with every page fast, every page slow, and half the
//!   pages slow by placement (interleave): the charge equals the slow
//!   accesses times (slow - host DRAM); the operation time grows by the
//!   charge; half slow lands halfway;
//! * **cache**: a 1 MiB hot set (cache-resident) placed on the slow tier
//!   is not slowed down with a 16 MiB cache model and is without it; a
//!   64 MiB hot set (larger than the model) is slowed down either way;
//! * **overhead**: zipf, gups and kv untiered, with emulation whose tiers
//!   cost exactly the host's DRAM latency (charge 0) and `ab=on`: charging
//!   switched off and on every 16,384 operations within each run, so the
//!   cost of the lookups and the cache model is measured side by side in
//!   one VM (the median over adjacent phase pairs); runs without emulation
//!   are shown beside them (between runs, where the host placed a guest's
//!   memory moves op times by more than that cost).
//!
//! Runs are interleaved (v1, v2, .., v1, v2, ..) so host noise hits every
//! variant alike; the table shows medians, the verdicts on time use each
//! variant's fastest run (noise on the shared host only ever slows a run). Every run is charged against the
//! first run's host DRAM measurement.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::error::{Error, OutputError, Result};
use crate::presentation::stats::median;
use crate::presentation::table::render_table;
use vmm_core::config::{VmConfig, VmRequest};
use vmm_core::devices::serial::Sink;
use vmm_core::report::RunReport;
use vmm_core::runner::{self, Console, NoHooks};
use vmm_core::tiering_config::{PlacementArg, PolicyArg, TieringRequest};
use vmm_core::units::parse_duration;

/// The cache model of the cache check, fixed so that its 1 MiB hot set
/// fits and its 64 MiB one does not on any host.
const CACHE_CHECK_LLC: &str = "llc=16M";

/// The checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// Charge accounting, op time against the charge, half slow halfway.
    Linearity,
    /// A cache-resident hot set on the slow tier is not slowed down.
    Cache,
    /// Cost of emulation with a zero charge.
    Overhead,
}

/// Output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CheckFormat {
    /// Tables and verdicts.
    #[default]
    Human,
    /// One JSON object.
    Json,
}

/// Flags of `tiervm emulation-check`.
#[derive(Clone, Debug, Args)]
pub struct EmulationCheckArgs {
    /// Checks to run, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub checks: Vec<Check>,
    /// Length of each run.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Runs per variant (interleaved), 1 to 1000.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// Emulated tiers of the linearity and cache checks (an --emulate-latency SPEC).
    #[arg(long, default_value = "nomad-a")]
    pub latency: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = CheckFormat::Human)]
    pub report: CheckFormat,
    /// No per-run lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// One configuration of a check.
struct Variant {
    check: Check,
    name: String,
    req: VmRequest,
}

/// One variant's medians.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VariantResult {
    /// The check.
    pub check: Option<Check>,
    /// The variant.
    pub name: String,
    /// Runs that finished with exit code 0.
    pub runs_ok: usize,
    /// Runs made.
    pub runs: usize,
    /// Median nanoseconds per operation per vCPU.
    pub ns_per_op: Option<f64>,
    /// The fastest run's nanoseconds per operation (the verdicts use it:
    /// host noise only ever slows a run down).
    pub ns_per_op_best: Option<f64>,
    /// Lowest and highest ns per op.
    pub ns_per_op_range: Option<(f64, f64)>,
    /// Median emulated latency charged per operation, ns.
    pub charged_ns_per_op: Option<f64>,
    /// Median of paid / charged.
    pub paid_over_charged: Option<f64>,
    /// Median share of charged accesses on the slow tier.
    pub slow_share: Option<f64>,
    /// Median of charged / (slow accesses x slow charge + fast accesses x fast charge).
    pub charge_accounting: Option<f64>,
    /// Median cache-model hit rate, percent.
    pub cache_hit_pct: Option<f64>,
    /// Median of the guest's p50_ns metric (kv).
    pub p50_ns: Option<f64>,
    /// Lowest p50_ns of the runs.
    pub p50_ns_best: Option<f64>,
    /// `ab=on` runs: the median over runs of each run's median phase-pair
    /// ratio (op time charging / not, within one run).
    pub ab_pair_median: Option<f64>,
    /// `ab=on` runs: the lowest and highest run's median pair ratio.
    pub ab_pair_median_range: Option<(f64, f64)>,
}

/// A verdict against the issue's tolerance.
#[derive(Clone, Debug, Serialize)]
pub struct CheckVerdict {
    /// The check.
    pub check: Check,
    /// What is compared.
    pub what: String,
    /// The measured value.
    pub value: Option<f64>,
    /// The accepted range.
    pub range: (f64, f64),
    /// Whether the value is in range.
    pub pass: bool,
}

/// Everything the command measured.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResults {
    /// Schema.
    pub schema: &'static str,
    /// The emulated tiers of the linearity and cache checks.
    pub latency: String,
    /// Host DRAM latency every run was charged against, ns.
    pub host_dram_ns: Option<f64>,
    /// Seconds per run.
    pub duration_s: f64,
    /// Runs per variant.
    pub repeat: u32,
    /// Per variant.
    pub variants: Vec<VariantResult>,
    /// Verdicts.
    pub verdicts: Vec<CheckVerdict>,
}

fn request(image: &str, mem: u64, args: &[&str], duration: Duration) -> VmRequest {
    VmRequest {
        image: image.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        mem_bytes: mem,
        vcpus: 1,
        duration,
        sample_ms: 50,
        seed: 1,
        stop_grace: Duration::from_secs(10),
        tiering: TieringRequest::default(),
        emulate_latency: None,
        seccomp: true,
    }
}

/// The variants of `check`.
fn variants(check: Check, a: &EmulationCheckArgs) -> Vec<Variant> {
    match check {
        Check::Linearity => linearity_variants(a),
        Check::Cache => cache_variants(a),
        Check::Overhead => overhead_variants(a),
    }
}

/// The check's `--latency` tiers with `extra` settings.
fn spec(a: &EmulationCheckArgs, extra: &str) -> Option<String> {
    Some(format!("{},{extra}", a.latency))
}

/// `r` on tiered RAM of `fast` bytes fast, static placement `placement`,
/// emulated as `emu`.
fn tiered(mut r: VmRequest, fast: u64, placement: PlacementArg, emu: Option<String>) -> VmRequest {
    r.tiering.fast = Some(fast);
    r.tiering.policy = Some(PolicyArg::Static);
    r.tiering.placement = placement;
    r.emulate_latency = emu;
    r
}

fn variant(check: Check, name: &str, req: VmRequest) -> Variant {
    Variant {
        check,
        name: name.into(),
        req,
    }
}

/// Linearity: uniform GUPS all fast, half slow and all slow; kv all fast
/// and all slow.
fn linearity_variants(a: &EmulationCheckArgs) -> Vec<Variant> {
    let d = a.duration;
    let v = |name: &str, req: VmRequest| variant(Check::Linearity, name, req);
    let kv = || {
        request(
            "kv",
            256 << 20,
            &["records=100000", "workload=c", "value_size=1024"],
            d,
        )
    };
    let gups = || {
        request(
            "gups",
            512 << 20,
            &["size=256M", "hot_prob=0", "object=64"],
            d,
        )
    };
    let llc0 = || spec(a, "llc=0");
    vec![
        v(
            "all fast",
            tiered(gups(), 512 << 20, PlacementArg::FastFirst, llc0()),
        ),
        v(
            "half slow",
            tiered(gups(), 256 << 20, PlacementArg::Interleave, llc0()),
        ),
        v(
            "all slow",
            tiered(gups(), 64 << 20, PlacementArg::SlowFirst, llc0()),
        ),
        // kv pays per operation: its median latency moves by the
        // charge of one operation (YCSB-C: a bucket and 16 value
        // lines, every one charged).
        v(
            "kv all fast",
            tiered(kv(), 256 << 20, PlacementArg::FastFirst, llc0()),
        ),
        v(
            "kv all slow",
            tiered(kv(), 64 << 20, PlacementArg::SlowFirst, llc0()),
        ),
    ]
}

/// Cache: a 1 MiB and a 64 MiB hot set, with and without the cache
/// model, all fast and all slow.
fn cache_variants(a: &EmulationCheckArgs) -> Vec<Variant> {
    let d = a.duration;
    let gups = |hot: &str| {
        request(
            "gups",
            512 << 20,
            &["size=256M", hot, "hot_prob=1", "object=64"],
            d,
        )
    };
    let mut out = Vec::new();
    // A fixed 16 MiB model, whatever this host's LLC (a 256 MiB
    // host-sized model would hold the 64 MiB set too): 1 MiB fits,
    // 64 MiB is four times beyond.
    for (hot, label) in [("hot_size=1M", "1M hot"), ("hot_size=64M", "64M hot")] {
        for (llc, model) in [(CACHE_CHECK_LLC, "model"), ("llc=0", "no model")] {
            let fast = tiered(gups(hot), 512 << 20, PlacementArg::FastFirst, spec(a, llc));
            let slow = tiered(gups(hot), 64 << 20, PlacementArg::SlowFirst, spec(a, llc));
            out.push(variant(
                Check::Cache,
                &format!("{label}, {model}, all fast"),
                fast,
            ));
            out.push(variant(
                Check::Cache,
                &format!("{label}, {model}, all slow"),
                slow,
            ));
        }
    }
    out
}

/// Overhead: zipf, gups and kv plain and emulated with a zero charge.
fn overhead_variants(a: &EmulationCheckArgs) -> Vec<Variant> {
    let d = a.duration;
    // Every tier costs exactly the host's DRAM latency, loaded or
    // not (queue-k=0: the queueing model adds nothing), so nothing
    // is charged and what remains is the cost of emulating.
    let zero = Some("fast=100ns,slow=100ns,host-dram=100ns,queue-k=0,ab=on".to_string());
    let images: [(&str, u64, &[&str]); 3] = [
        ("zipf", 512 << 20, &["rss=256M", "wss=128M"]),
        ("gups", 512 << 20, &["size=256M"]),
        ("kv", 512 << 20, &["records=100000", "workload=a"]),
    ];
    let mut out = Vec::new();
    for (image, mem, args) in images {
        out.push(variant(
            Check::Overhead,
            &format!("{image} plain"),
            request(image, mem, args, d),
        ));
        let mut r = request(image, mem, args, d);
        r.emulate_latency = zero.clone();
        out.push(variant(
            Check::Overhead,
            &format!("{image} emulated, charge 0, ab=on"),
            r,
        ));
    }
    out
}

/// Runs `tiervm emulation-check`; returns the exit code (1 if a run failed
/// or a verdict is out of range).
pub fn run(a: &EmulationCheckArgs, started: Instant) -> Result<i32> {
    let checks = if a.checks.is_empty() {
        vec![Check::Linearity, Check::Cache, Check::Overhead]
    } else {
        a.checks.clone()
    };
    let all: Vec<Variant> = checks.iter().flat_map(|&c| variants(c, a)).collect();
    // Validate every variant before the first run.
    let configs: Vec<VmConfig> = all
        .iter()
        .map(|v| VmConfig::from_request(&v.req).map_err(Error::from))
        .collect::<Result<_>>()?;
    let (reports, runs, dram) = run_interleaved(a, &all, configs, started);
    let variants: Vec<VariantResult> = all
        .iter()
        .zip(&reports)
        .zip(&runs)
        .map(|((v, r), &n)| summarize(v, r, n))
        .collect();
    let verdicts = verdicts(&variants);
    let res = CheckResults {
        schema: "tiervm-emulation-check/1",
        latency: vmm_core::emulation::EmulationConfig::parse(&a.latency)
            .map(|c| c.label())
            .unwrap_or_else(|_| a.latency.clone()),
        host_dram_ns: dram,
        duration_s: a.duration.as_secs_f64(),
        repeat: a.repeat,
        variants,
        verdicts,
    };
    match a.report {
        CheckFormat::Human => print!("{}", human(&res)),
        CheckFormat::Json => println!(
            "{}",
            serde_json::to_string(&res).map_err(|source| OutputError::Encode {
                what: "the check results",
                source,
            })?
        ),
    }
    let failed = res.variants.iter().any(|v| v.runs_ok < v.runs);
    Ok(i32::from(failed || res.verdicts.iter().any(|v| !v.pass)))
}

/// Runs every variant `a.repeat` times, interleaved: each variant's good
/// reports, its runs made, and the host DRAM latency the first run
/// measured (every later run is charged against it).
fn run_interleaved(
    a: &EmulationCheckArgs,
    all: &[Variant],
    mut configs: Vec<VmConfig>,
    started: Instant,
) -> (Vec<Vec<RunReport>>, Vec<usize>, Option<f64>) {
    let mut reports: Vec<Vec<RunReport>> = vec![Vec::new(); all.len()];
    let mut runs = vec![0usize; all.len()];
    let mut dram: Option<f64> = None;
    for rep in 1..=a.repeat.max(1) {
        for (i, v) in all.iter().enumerate() {
            let sink = Sink::memory();
            runs[i] += 1;
            let r = runner::run(&configs[i], started, Console::Memory(sink), &mut NoHooks);
            let Some(report) = counted(a, v, rep, r) else {
                continue;
            };
            let measured = report.emulation.as_ref().and_then(|e| e.host_dram_ns);
            if let (None, Some(d)) = (dram, measured) {
                dram = Some(d);
                for c in &mut configs {
                    if let Some(e) = c.emulation.as_mut() {
                        e.host_dram_ns.get_or_insert(d);
                    }
                }
            }
            reports[i].push(report);
        }
    }
    (reports, runs, dram)
}

/// Run `rep` of `v`'s report when it counts (guest exit 0, operations
/// done); says on stderr why it does not, or how fast it was.
fn counted(
    a: &EmulationCheckArgs,
    v: &Variant,
    rep: u32,
    r: std::result::Result<RunReport, runner::RunError>,
) -> Option<RunReport> {
    match r {
        Ok(report) if report.exit_code == Some(0) && report.ops_per_sec <= 0.0 => {
            // Nothing to time (e.g. the boot measurement took the
            // run): a failed run, not a number.
            eprintln!(
                "  {} {rep}/{}: no operation completed: not counted (the check fails; try a longer --duration)",
                v.name, a.repeat
            );
            None
        }
        Ok(report) if report.exit_code == Some(0) => {
            if !a.quiet {
                eprintln!(
                    "  {} {rep}/{}: {:.1} ns/op",
                    v.name,
                    a.repeat,
                    1e9 / report.ops_per_sec.max(1e-9)
                );
            }
            Some(report)
        }
        Ok(report) => {
            eprintln!(
                "  {} {rep}: guest exit {:?} ({:?})",
                v.name, report.exit_code, report.stop_reason
            );
            None
        }
        Err(e) => {
            eprintln!("  {} {rep}: FAILED: {}", v.name, Error::from(e).describe());
            None
        }
    }
}

fn summarize(v: &Variant, reports: &[RunReport], runs: usize) -> VariantResult {
    let pick = |f: &dyn Fn(&RunReport) -> Option<f64>| -> Option<f64> {
        median(&reports.iter().filter_map(f).collect::<Vec<_>>())
    };
    let ns: Vec<f64> = reports
        .iter()
        .filter(|r| r.ops_per_sec > 0.0)
        .map(|r| 1e9 * f64::from(r.vcpus) / r.ops_per_sec)
        .collect();
    let per_op = |r: &RunReport, x: f64| (r.ops > 0).then(|| x / r.ops as f64);
    let ab: Vec<f64> = reports
        .iter()
        .filter_map(|r| r.emulation.as_ref()?.ab.as_ref()?.pair_median_ratio)
        .collect();
    VariantResult {
        check: Some(v.check),
        name: v.name.clone(),
        runs_ok: reports.len(),
        runs,
        ns_per_op: median(&ns),
        ns_per_op_best: ns.iter().copied().reduce(f64::min),
        ns_per_op_range: ns
            .iter()
            .copied()
            .reduce(f64::min)
            .zip(ns.iter().copied().reduce(f64::max)),
        charged_ns_per_op: pick(&|r| {
            r.emulation
                .as_ref()
                .and_then(|e| per_op(r, e.charged_ms * 1e6))
        }),
        paid_over_charged: pick(&|r| {
            r.emulation
                .as_ref()
                .filter(|e| e.charged_ms > 0.0)
                .map(|e| e.paid_ms / e.charged_ms)
        }),
        slow_share: pick(&|r| {
            let e = r.emulation.as_ref()?;
            let all: u64 = e.accesses.iter().sum();
            (all > 0).then(|| e.accesses.get(1).copied().unwrap_or(0) as f64 / all as f64)
        }),
        charge_accounting: pick(&|r| {
            // Charges follow the loaded latency (the guest's own traffic
            // loads its tier a little): the run's mean per tier.
            let e = r.emulation.as_ref()?;
            let dram = e.charge_base_ns?;
            let expected_ms: f64 = e
                .accesses
                .iter()
                .zip(&e.loaded_latency_ns_charged)
                .map(|(&n, &l)| n as f64 * (l - dram).max(0.0) / 1e6)
                .sum();
            (expected_ms > 0.0).then(|| e.charged_ms / expected_ms)
        }),
        cache_hit_pct: pick(&|r| r.emulation.as_ref().map(|e| e.cache_hit_pct)),
        p50_ns: pick(&|r| r.guest_metrics.get("p50_ns").copied()),
        p50_ns_best: reports
            .iter()
            .filter_map(|r| r.guest_metrics.get("p50_ns").copied())
            .reduce(f64::min),
        ab_pair_median: median(&ab),
        ab_pair_median_range: ab
            .iter()
            .copied()
            .reduce(f64::min)
            .zip(ab.iter().copied().reduce(f64::max)),
    }
}

fn find<'a>(v: &'a [VariantResult], name: &str) -> Option<&'a VariantResult> {
    v.iter().find(|x| x.name == name)
}

fn verdicts(v: &[VariantResult]) -> Vec<CheckVerdict> {
    let mut out = Vec::new();
    linearity_verdicts(v, &mut out);
    cache_verdicts(v, &mut out);
    for image in ["zipf", "gups", "kv"] {
        if let Some(e) = find(v, &format!("{image} emulated, charge 0, ab=on")) {
            out.push(verdict(
                Check::Overhead,
                format!("{image}: op time charging / not (charge 0), alternating phases within each run, median pair"),
                e.ab_pair_median,
                (0.0, 1.05),
            ));
        }
    }
    out
}

/// `value` against `range` (a missing value fails).
fn verdict(check: Check, what: String, value: Option<f64>, range: (f64, f64)) -> CheckVerdict {
    let pass = value.is_some_and(|x| x >= range.0 && x <= range.1);
    CheckVerdict {
        check,
        what,
        value,
        range,
        pass,
    }
}

/// The linearity verdicts: GUPS's charge accounting, op time against the
/// charge and half slow halfway; kv's p50 shift against its charge.
fn linearity_verdicts(v: &[VariantResult], out: &mut Vec<CheckVerdict>) {
    let mut push = |what: &str, value: Option<f64>, range: (f64, f64)| {
        out.push(verdict(Check::Linearity, what.into(), value, range));
    };
    if let (Some(fast), Some(half), Some(slow)) = (
        find(v, "all fast"),
        find(v, "half slow"),
        find(v, "all slow"),
    ) {
        push(
            "all slow: charged / (slow accesses x (loaded slow latency - charge base))",
            slow.charge_accounting,
            (0.99, 1.01),
        );
        let dt = slow
            .ns_per_op_best
            .zip(fast.ns_per_op_best)
            .map(|(s, f)| s - f);
        let dc = slow
            .charged_ns_per_op
            .zip(Some(fast.charged_ns_per_op.unwrap_or(0.0)))
            .map(|(s, f)| s - f);
        push(
            "op time growth (all slow - all fast) / charge growth",
            dt.zip(dc).filter(|(_, c)| *c > 0.0).map(|(t, c)| t / c),
            (0.9, 1.1),
        );
        push(
            "half slow: (half - fast) / (slow - fast) op time",
            half.ns_per_op_best
                .zip(fast.ns_per_op_best)
                .zip(dt)
                .filter(|(_, d)| *d > 0.0)
                .map(|((h, f), d)| (h - f) / d),
            (0.45, 0.55),
        );
    }
    if let (Some(fast), Some(slow)) = (find(v, "kv all fast"), find(v, "kv all slow")) {
        let dp = slow.p50_ns_best.zip(fast.p50_ns_best).map(|(s, f)| s - f);
        let dc = slow
            .charged_ns_per_op
            .zip(fast.charged_ns_per_op)
            .map(|(s, f)| s - f);
        push(
            "kv (pays per operation): p50 shift / charge per operation",
            dp.zip(dc).filter(|(_, c)| *c > 0.0).map(|(p, c)| p / c),
            (0.85, 1.15),
        );
    }
}

/// The cache verdicts: the fastest runs' op time, all slow over all fast.
fn cache_verdicts(v: &[VariantResult], out: &mut Vec<CheckVerdict>) {
    if find(v, "1M hot, model, all slow").is_none() {
        return;
    }
    let ratio = |a: &str, b: &str| {
        find(v, a)
            .and_then(|x| x.ns_per_op_best)
            .zip(find(v, b).and_then(|x| x.ns_per_op_best))
            .map(|(x, y)| x / y)
    };
    for (what, slow, fast, range) in [
        (
            "1M hot set, cache model: all slow / all fast op time",
            "1M hot, model, all slow",
            "1M hot, model, all fast",
            (0.0, 1.05),
        ),
        (
            "1M hot set, no model (negative control): all slow / all fast op time",
            "1M hot, no model, all slow",
            "1M hot, no model, all fast",
            (1.5, f64::INFINITY),
        ),
        (
            "64M hot set (beyond the model), cache model: all slow / all fast op time",
            "64M hot, model, all slow",
            "64M hot, model, all fast",
            (1.5, f64::INFINITY),
        ),
    ] {
        out.push(verdict(Check::Cache, what.into(), ratio(slow, fast), range));
    }
}

fn human(res: &CheckResults) -> String {
    let mut s = String::new();
    let dram = res.host_dram_ns.map_or(
        "not measured (the overhead runs charge against host-dram=100ns)".to_string(),
        |d| {
            format!("{d:.0} ns, measured in the first run's guest and charged against in every run")
        },
    );
    let _ = writeln!(
        s,
        "tiervm emulation-check: {} (linearity and cache checks; host DRAM {dram}); {} run(s) of {:.1} s per variant, interleaved, 1 vCPU; medians (verdicts on time: each variant's fastest run)",
        res.latency,
        res.repeat,
        res.duration_s
    );
    let headers = [
        "variant",
        "ns/op",
        "best-worst",
        "charged ns/op",
        "paid/charged",
        "slow share",
        "cache hits %",
        "p50 ns",
        "runs",
    ];
    for check in [Check::Linearity, Check::Cache, Check::Overhead] {
        let rows = table_rows(res, check);
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n{check:?}");
        s.push_str(&render_table(&headers, &rows));
        if check == Check::Overhead {
            overhead_notes(res, &mut s);
        }
        for vd in res.verdicts.iter().filter(|x| x.check == check) {
            let _ = writeln!(
                s,
                "  {}: {} (accepted {}..{}): {}",
                vd.what,
                num(vd.value, 3),
                vd.range.0,
                vd.range.1,
                if vd.pass { "ok" } else { "OUT OF RANGE" }
            );
        }
    }
    s
}

/// `v` with `p` decimals, or "-".
fn num(v: Option<f64>, p: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.p$}"))
}

/// The table rows of `check`'s variants.
fn table_rows(res: &CheckResults, check: Check) -> Vec<Vec<String>> {
    res.variants
        .iter()
        .filter(|v| v.check == Some(check))
        .map(|v| {
            vec![
                v.name.clone(),
                num(v.ns_per_op, 1),
                v.ns_per_op_range
                    .map_or("-".into(), |(a, b)| format!("{a:.1}-{b:.1}")),
                num(v.charged_ns_per_op, 1),
                num(v.paid_over_charged, 3),
                num(v.slow_share, 3),
                num(v.cache_hit_pct, 1),
                num(v.p50_ns, 0),
                format!("{}/{}", v.runs_ok, v.runs),
            ]
        })
        .collect()
}

/// The overhead check's comparisons within and between runs, per image.
fn overhead_notes(res: &CheckResults, s: &mut String) {
    for image in ["zipf", "gups", "kv"] {
        let (Some(e), Some(p)) = (
            find(&res.variants, &format!("{image} emulated, charge 0, ab=on")),
            find(&res.variants, &format!("{image} plain")),
        ) else {
            continue;
        };
        let _ = writeln!(
            s,
            "  {image}: within runs (ab=on), median pair per run {}; between runs, fastest emulated / fastest plain {} (not a verdict: between runs the host moves op times by more)",
            e.ab_pair_median_range
                .map_or("-".into(), |(a, b)| format!("{a:.3}-{b:.3}")),
            num(e.ns_per_op_best.zip(p.ns_per_op_best).map(|(x, y)| x / y), 3)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vr(name: &str, ns: f64, charged: Option<f64>) -> VariantResult {
        VariantResult {
            name: name.into(),
            ns_per_op: Some(ns),
            ns_per_op_best: Some(ns),
            charged_ns_per_op: charged,
            charge_accounting: Some(1.0),
            ..VariantResult::default()
        }
    }

    #[test]
    fn verdicts_follow_the_issue_tolerances() {
        let v = vec![
            vr("all fast", 100.0, Some(0.0)),
            vr("half slow", 225.0, Some(125.0)),
            vr("all slow", 350.0, Some(250.0)),
        ];
        let d = verdicts(&v);
        assert_eq!(d.len(), 3, "no kv variants: no kv verdict");
        assert!(d.iter().all(|x| x.pass), "{d:?}");
        assert!((d[1].value.unwrap() - 1.0).abs() < 1e-9);
        assert!((d[2].value.unwrap() - 0.5).abs() < 1e-9);
        // Op time that grew by twice the charge fails.
        let v = vec![
            vr("all fast", 100.0, Some(0.0)),
            vr("half slow", 350.0, None),
            vr("all slow", 600.0, Some(250.0)),
        ];
        let d = verdicts(&v);
        assert!(!d[1].pass, "{d:?}");
        assert!(d[2].pass);
        // Overhead: the within-run median pair, not the between-run ratio.
        let ab = |name: &str, m: f64| VariantResult {
            ab_pair_median: Some(m),
            ..vr(name, 100.0, Some(0.0))
        };
        let v = vec![
            vr("gups plain", 50.0, None),
            ab("gups emulated, charge 0, ab=on", 1.03),
            vr("kv plain", 500.0, None),
            ab("kv emulated, charge 0, ab=on", 1.07),
        ];
        let d = verdicts(&v);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].pass && d[0].value == Some(1.03), "{d:?}");
        assert!(!d[1].pass, "{d:?}");
    }

    #[test]
    fn every_variant_validates() {
        let a = EmulationCheckArgs {
            checks: vec![],
            duration: Duration::from_secs(1),
            repeat: 1,
            latency: "nomad-a".into(),
            report: CheckFormat::Human,
            quiet: true,
        };
        for c in [Check::Linearity, Check::Cache, Check::Overhead] {
            for v in variants(c, &a) {
                VmConfig::from_request(&v.req).unwrap_or_else(|e| panic!("{}: {e}", v.name));
            }
        }
    }
}
