//! `tiervm compare`: runs one image under several placement policies, each
//! in a fresh VM with the same arguments, seed and initial placement, and
//! prints a table of what was measured; `--out DIR` also writes
//! `results.json`, `results.csv`, `throughput.svg` and `migrations.svg`.
//!
//! Repeats are interleaved (p1, p2, .., p1, p2, ..) so that host noise hits
//! every policy alike. A run that fails is reported in its row and the
//! others continue; the exit code is 1 if any run failed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use vmm_core::choice::Choice;

use crate::error::{CompareError, Error, OutputError, Result};
use crate::flags::{VmFlags, MAX_REPEAT};
use crate::presentation::compare::{
    format_human, migrations_svg, summarize, throughput_svg, to_csv, CompareResults, RunRecord,
    Setup,
};
use crate::presentation::progress::{si, Progress};
use vmm_core::config::{VmConfig, VmRequest};
use vmm_core::devices::serial::Sink;
use vmm_core::runner::{self, Console};
use vmm_core::tiering_config::{PolicyArg, TieringRequest};

/// Policies left out of the default set: `none` is untiered and `chaos` is
/// a torture test, not a placement policy.
const NOT_DEFAULT: [PolicyArg; 2] = [PolicyArg::None, PolicyArg::Chaos];

/// What `tiervm compare` prints on stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CompareFormat {
    /// The table (and the failed runs).
    #[default]
    Human,
    /// The results.json object on one line (schema: docs/compare.md).
    Json,
}

/// Flags of `tiervm compare`.
#[derive(Clone, Debug, Args)]
pub struct CompareArgs {
    /// Built-in image (zipf, gups, memcheck, ...) or path to a static x86_64 ELF.
    pub image: String,
    /// Policies to compare, comma-separated (default: every placement policy,
    /// i.e. all but none and chaos). `none` runs untiered plain RAM.
    #[arg(long, value_delimiter = ',', value_name = "P1,P2,..")]
    pub policies: Vec<String>,
    /// Runs per policy (interleaved: p1, p2, .., p1, p2, ..).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Directory for results.json, results.csv, throughput.svg and migrations.svg.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Output on stdout: a table, or the results as one JSON object.
    #[arg(long, value_enum, default_value_t = CompareFormat::Human)]
    pub report: CompareFormat,
    /// No live progress line and no per-run lines on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// VM settings shared by every run.
    #[command(flatten)]
    pub vm: VmFlags,
}

/// The default policy set: every `PolicyArg` but `none` and `chaos`.
pub fn default_policies() -> Vec<PolicyArg> {
    PolicyArg::ALL
        .iter()
        .copied()
        .filter(|p| !NOT_DEFAULT.contains(p))
        .collect()
}

/// Parses `--policies` (case-insensitive names); empty = the default set.
pub fn parse_policies(names: &[String]) -> Result<Vec<PolicyArg>> {
    if names.is_empty() {
        return Ok(default_policies());
    }
    let known: Vec<String> = PolicyArg::ALL.iter().map(|p| p.name().into()).collect();
    let mut out: Vec<PolicyArg> = Vec::new();
    for raw in names {
        let name = raw.trim();
        let p = PolicyArg::from_name(name, true).ok_or_else(|| CompareError::UnknownPolicy {
            name: name.into(),
            known: known.clone(),
        })?;
        if out.contains(&p) {
            return Err(CompareError::DuplicatePolicy(p.name().into()).into());
        }
        out.push(p);
    }
    Ok(out)
}

impl CompareArgs {
    /// The VM request of one policy's runs. Chaos flags go to the chaos
    /// policy only; `none` gets no tiering flags at all (plain RAM).
    pub fn request(&self, policy: PolicyArg) -> VmRequest {
        let tiering = if policy == PolicyArg::None {
            TieringRequest {
                policy: Some(PolicyArg::None),
                ..TieringRequest::default()
            }
        } else {
            let mut t = self.vm.tiering(Some(policy));
            if policy != PolicyArg::Chaos {
                t.chaos_rate = None;
                t.chaos_mix = None;
                t.mechanism = None;
                t.chaos_unit = None;
            }
            t
        };
        self.vm.request(&self.image, tiering)
    }

    fn has_chaos_flags(&self) -> bool {
        let v = &self.vm;
        v.chaos_rate.is_some()
            || v.chaos_mix.is_some()
            || v.mechanism.is_some()
            || v.chaos_unit.is_some()
    }
}

/// Writes results.json, results.csv, throughput.svg and migrations.svg into `dir`.
pub fn write_outputs(dir: &Path, res: &CompareResults) -> Result<()> {
    let write = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, body).map_err(|source| CompareError::Write { path, source })
    };
    let json = serde_json::to_string_pretty(res).map_err(|source| OutputError::Encode {
        what: "results.json",
        source,
    })?;
    write("results.json", &json)?;
    write("results.csv", &to_csv(&res.runs))?;
    let svg = throughput_svg(res).map_err(|source| CompareError::Plot {
        file: "throughput.svg",
        source,
    })?;
    write("throughput.svg", &svg)?;
    let svg = migrations_svg(res).map_err(|source| CompareError::Plot {
        file: "migrations.svg",
        source,
    })?;
    write("migrations.svg", &svg)?;
    Ok(())
}

/// Whether tier latency is emulated: from the reports when any run was
/// tiered, else from the configured nodes.
fn emulated_tiers(configs: &[(PolicyArg, VmConfig)], runs: &[RunRecord]) -> bool {
    let from_reports: Vec<bool> = runs
        .iter()
        .filter_map(|r| r.report.as_ref()?.tiers.as_ref())
        .flat_map(|ts| ts.iter().map(|t| t.emulated))
        .collect();
    if !from_reports.is_empty() {
        return from_reports.iter().any(|e| *e);
    }
    let from_config: Vec<bool> = configs
        .iter()
        .filter_map(|(_, c)| c.tiering.as_ref())
        .map(|t| t.mem.tiers.iter().all(|x| x.node == t.mem.tiers[0].node))
        .collect();
    if !from_config.is_empty() {
        return from_config.iter().any(|e| *e);
    }
    tiering::host::numa_nodes().map_or(true, |n| n.len() <= 1)
}

/// Runs `tiervm compare`; returns the process exit code:
/// 1. check the flags and validate every policy's VM before the first run;
/// 2. run each policy's VM `--repeat` times, repeats interleaved;
/// 3. summarize, write the files, print the table or the JSON.
pub fn run(args: &CompareArgs, started: Instant) -> Result<i32> {
    let configs = validate(args)?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|source| CompareError::CreateOut {
            dir: dir.clone(),
            source,
        })?;
    }
    vmm_core::signals::install()?;
    let runs = run_all(args, &configs, started);
    let total = configs.len() * args.repeat as usize;
    if let (Some(sig), false) = (vmm_core::signals::received(), args.quiet) {
        crate::output::stderr_line(&format!(
            "tiervm compare: {} after {} of {total} runs: keeping what was measured",
            vmm_core::signals::name(sig),
            runs.len()
        ));
    }
    let results = results(args, &configs, runs);
    // Print what was measured even when writing the files fails.
    let written = args
        .out
        .as_deref()
        .map(|dir| write_outputs(dir, &results))
        .transpose();
    print_results(args, &results, written.as_ref().is_ok_and(Option::is_some))?;
    written?;
    if let Some(sig) = vmm_core::signals::received() {
        return Ok(vmm_core::signals::exit_code(sig));
    }
    Ok(if results.runs.iter().all(|r| r.ok) {
        0
    } else {
        1
    })
}

/// Step 1: the policies, and each one's validated VM (notes printed).
fn validate(args: &CompareArgs) -> Result<Vec<(PolicyArg, VmConfig)>> {
    if args.repeat == 0 {
        return Err(CompareError::NoRepeat.into());
    }
    if args.repeat > MAX_REPEAT {
        return Err(CompareError::TooManyRepeats {
            repeat: args.repeat,
        }
        .into());
    }
    let policies = parse_policies(&args.policies)?;
    if policies.is_empty() {
        return Err(CompareError::NoPolicies.into());
    }
    if args.has_chaos_flags() && !policies.contains(&PolicyArg::Chaos) {
        return Err(CompareError::ChaosFlagsWithoutChaos.into());
    }
    let configs: Vec<(PolicyArg, VmConfig)> = policies
        .iter()
        .map(|&p| {
            VmConfig::from_request(&args.request(p))
                .map(|c| (p, c))
                .map_err(|e| match Error::from(e) {
                    e @ (Error::Config(_) | Error::TieringConfig(_)) => CompareError::Policy {
                        policy: p,
                        source: Box::new(e),
                    }
                    .into(),
                    other => other,
                })
        })
        .collect::<Result<_>>()?;
    if !args.quiet {
        let mut notes: Vec<String> = configs.iter().flat_map(|(_, c)| c.notes()).collect();
        notes.dedup();
        notes.iter().for_each(|n| eprintln!("tiervm compare: {n}"));
    }
    Ok(configs)
}

/// Step 2: every run, in run order (p1, p2, .., p1, p2, ..).
fn run_all(
    args: &CompareArgs,
    configs: &[(PolicyArg, VmConfig)],
    started: Instant,
) -> Vec<RunRecord> {
    let names: Vec<String> = configs.iter().map(|(p, _)| p.name().to_string()).collect();
    let total = configs.len() * args.repeat as usize;
    if !args.quiet {
        let each = if args.vm.duration.is_zero() {
            "until the guest exits".to_string()
        } else {
            format!("{:.1} s", args.vm.duration.as_secs_f64())
        };
        eprintln!(
            "tiervm compare: {} under {} x {} repeat(s) = {total} runs, {each} each",
            args.image,
            names.join(", "),
            args.repeat
        );
    }
    let mut configs = configs.to_vec();
    let mut runs: Vec<RunRecord> = Vec::with_capacity(total);
    'runs: for rep in 1..=args.repeat {
        for i in 0..configs.len() {
            // A signal stops the comparison after the run it arrived in.
            if vmm_core::signals::received().is_some() {
                break 'runs;
            }
            let (policy, cfg) = &configs[i];
            let record = run_one(args, *policy, cfg, rep, started);
            if let Some(d) = measured_dram(&record) {
                share_dram(&mut configs, d);
            }
            runs.push(record);
        }
    }
    runs
}

/// The host DRAM latency a run's guest measured, if it charged.
fn measured_dram(record: &RunRecord) -> Option<f64> {
    record.report.as_ref()?.emulation.as_ref()?.host_dram_ns
}

/// A run's emulation report, if it had one.
fn emulation_of(record: &RunRecord) -> Option<&vmm_core::emulation::EmulationReport> {
    record.report.as_ref()?.emulation.as_ref()
}

/// The caveat a run's emulation report carries (a cache model smaller than
/// this host's LLC), the same for every run of a comparison.
fn emulation_caveat(record: &RunRecord) -> Option<String> {
    emulation_of(record)?.caveat.clone()
}

/// With latency emulation, the first measurement of the host's DRAM latency
/// becomes every later run's (`host-dram=`), so that all policies are
/// charged alike whatever the host's noise at each boot.
fn share_dram(configs: &mut [(PolicyArg, VmConfig)], dram_ns: f64) {
    for (_, c) in configs.iter_mut() {
        if let Some(e) = c.emulation.as_mut() {
            e.host_dram_ns.get_or_insert(dram_ns);
        }
    }
}

/// One VM run of the comparison, with its line on stderr.
fn run_one(
    args: &CompareArgs,
    policy: PolicyArg,
    cfg: &VmConfig,
    rep: u32,
    started: Instant,
) -> RunRecord {
    let label = format!("{policy} {rep}/{}", args.repeat);
    let mut progress = Progress::stderr(label.as_str(), cfg.duration, args.quiet);
    let sink = Sink::memory();
    let result = runner::run(cfg, started, Console::Memory(sink.clone()), &mut progress);
    progress.finish();
    let record = match result {
        Ok(report) => RunRecord::finished(policy, rep, report, &sink.contents()),
        Err(e) => {
            let e = Error::from(e);
            RunRecord::failed(policy, rep, e.exit_code(), e.describe())
        }
    };
    if !args.quiet {
        match (&record.report, &record.error) {
            (Some(r), None) => eprintln!(
                "  {label}: {} ops/s, exit {}",
                si(r.ops_per_sec),
                record.exit_code
            ),
            (_, Some(e)) => eprintln!("  {label}: FAILED: {e}"),
            (None, None) => {}
        }
    }
    record
}

/// Step 3: what the runs had in common, the summary and the runs.
fn results(
    args: &CompareArgs,
    configs: &[(PolicyArg, VmConfig)],
    runs: Vec<RunRecord>,
) -> CompareResults {
    let policies: Vec<PolicyArg> = configs.iter().map(|(p, _)| *p).collect();
    let tracked: Vec<bool> = configs
        .iter()
        .map(|(_, c)| c.tiering.as_ref().is_some_and(|t| t.tracks_accesses()))
        .collect();
    let first = &configs[0].1;
    let tiered = configs.iter().find_map(|(_, c)| c.tiering.as_ref());
    let page = tiering::mem::PAGE_SIZE as u64;
    let setup = Setup {
        image: first.image.name.clone(),
        args: first.effective_args(),
        mem_bytes: first.mem_bytes,
        vcpus: first.vcpus,
        duration_s: first.duration.map_or(0.0, |d| d.as_secs_f64()),
        seed: first.seed,
        sample_ms: args.vm.sample_ms,
        placement: args.vm.placement,
        fast_bytes: tiered.map(|t| t.mem.tiers[0].capacity_pages as u64 * page),
        slow_bytes: tiered.and_then(|t| t.mem.tiers.get(1).map(|x| x.capacity_pages as u64 * page)),
        repeat: args.repeat,
        emulated_tiers: emulated_tiers(configs, &runs),
        emulated_latency: first.emulation.as_ref().map(|e| e.label()),
        host_dram_ns: first
            .emulation
            .as_ref()
            .and_then(|e| e.host_dram_ns)
            .or_else(|| runs.iter().find_map(measured_dram)),
        emulated_costs_ns: None,
        emulation_caveat: runs.iter().find_map(emulation_caveat),
        emulation_host_cache: runs
            .iter()
            .find_map(|r| Some(emulation_of(r)?.host_cache.as_ref()?.human())),
    };
    let setup = Setup {
        emulated_costs_ns: first
            .emulation
            .as_ref()
            .zip(setup.host_dram_ns)
            .map(|(e, d)| e.effective_ns(d)),
        ..setup
    };
    CompareResults {
        interrupted_by: vmm_core::signals::received().map(vmm_core::signals::name),
        schema: "tiervm-compare/1",
        summary: summarize(&policies, &runs, &tracked),
        policies,
        setup,
        runs,
    }
}

/// The table (and where the files went) or the JSON, on stdout.
fn print_results(args: &CompareArgs, results: &CompareResults, wrote_files: bool) -> Result<()> {
    let text = match args.report {
        CompareFormat::Human => {
            let mut t = format_human(results);
            if let (Some(dir), true) = (&args.out, wrote_files) {
                let _ = writeln!(
                    t,
                    "\nWrote results.json, results.csv, throughput.svg, migrations.svg to {}",
                    dir.display()
                );
            }
            t
        }
        CompareFormat::Json => {
            let mut s = serde_json::to_string(results).map_err(|source| OutputError::Encode {
                what: "the results",
                source,
            })?;
            s.push('\n');
            s
        }
    };
    crate::output::stdout(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_case_insensitively_and_reject_unknown_or_twice() {
        let p = |v: &[&str]| parse_policies(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            p(&["Static", " chaos"]).unwrap(),
            vec![PolicyArg::Static, PolicyArg::Chaos]
        );
        let e = p(&["static", "bogus"]).unwrap_err().to_string();
        assert!(
            e.contains("unknown policy 'bogus'") && e.contains("static"),
            "{e}"
        );
        let e = p(&["static", "STATIC"]).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let d = p(&[]).unwrap();
        assert_eq!(d, default_policies());
        assert!(!d.contains(&PolicyArg::None) && !d.contains(&PolicyArg::Chaos));
        assert!(d.contains(&PolicyArg::Static));
        assert_eq!(d.len(), PolicyArg::ALL.len() - 2, "every other policy");
    }

    #[test]
    fn requests_give_chaos_flags_to_chaos_only_and_none_no_tiering() {
        use clap::Parser;
        use vmm_core::tiering_config::PlacementArg;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            c: CompareArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "zipf",
            "--policies",
            "static,chaos,none",
            "--fast",
            "64M",
            "--chaos-rate",
            "500",
            "--placement",
            "slow-first",
        ])
        .unwrap();
        let a = cli.c;
        assert_eq!(a.policies, vec!["static", "chaos", "none"]);
        let s = a.request(PolicyArg::Static).tiering;
        assert_eq!(s.chaos_rate, None);
        assert_eq!(s.fast, Some(64 << 20));
        assert_eq!(s.placement, PlacementArg::SlowFirst);
        let c = a.request(PolicyArg::Chaos).tiering;
        assert_eq!(c.chaos_rate, Some(500.0));
        assert_eq!(c.policy, Some(PolicyArg::Chaos));
        let n = a.request(PolicyArg::None).tiering;
        assert_eq!(n.fast, None);
        assert!(!n.wants_tiering());
    }
}
