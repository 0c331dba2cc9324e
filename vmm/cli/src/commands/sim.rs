//! `tiervm sim`: run placement policies in the deterministic tiered-memory
//! simulator (`tiering::sim`). Every number it prints is MODELED.

use crate::error::SimCmdError;
use clap::{Args, ValueEnum};
use tiering::policy::PolicyKind;
use tiering::sim::{self, Scenario, SimReport};

/// Output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum SimFormat {
    /// A comparison table.
    #[default]
    Table,
    /// JSON (one object with the scenario and one report per policy).
    Json,
}

/// Which unit costs of faults and migrations the model starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CostsArg {
    /// Plausible bare-metal x86 values (the papers give none).
    #[default]
    Default,
    /// What the live engine measured on the development host (KVM under
    /// PVM: faults cost tens of microseconds); docs/results.md §9.
    Measured,
}

/// Arguments of `tiervm sim`.
#[derive(Clone, Debug, Default, Args)]
pub struct SimArgs {
    /// Scenario to run (see --list).
    pub scenario: Option<String>,
    /// List the built-in scenarios and exit.
    #[arg(long)]
    pub list: bool,
    /// Policies to compare, comma-separated (default: all six).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = SimFormat::Table)]
    pub report: SimFormat,
    /// Also print each run's throughput timeline and per-tier traffic.
    #[arg(long)]
    pub verbose: bool,
    /// Also sweep static placements with 0%, 10%, ..., 100% of the hot set
    /// in tier 0 (GUPS scenarios: Colloid's best case).
    #[arg(long)]
    pub sweep_static: bool,
    /// Parallel runs (default: available cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Divide a fast pool of this many GiB among the VMs of --mix with
    /// `tiervm serve`'s division and compare with an even split (MODELED).
    #[arg(long, value_name = "GIB")]
    pub division_pool: Option<f64>,
    /// With --division-pool: the VMs, as built-in scenario names
    /// (default: four 16 GiB VMs with different working sets).
    #[arg(long, value_delimiter = ',')]
    pub mix: Vec<String>,
    /// With --division-pool: the division's step, GiB.
    #[arg(long, default_value_t = 0.5)]
    pub division_quantum: f64,

    /// Modeled seconds. On a scenario run in rounds of fixed operations
    /// timed by the model (the nomad-* micro-benchmarks), a run of this
    /// fixed length instead, its phases the scenario's fractions of it.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Real pages per modeled page (larger = faster, coarser).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Fraction of accesses that write (0..1).
    #[arg(long)]
    pub write_ratio: Option<f64>,
    /// Application threads.
    #[arg(long)]
    pub threads: Option<u32>,
    /// Outstanding requests per thread, in accesses.
    #[arg(long)]
    pub mlp: Option<f64>,
    /// Bytes one access moves: 64 (a line; the guest images) up to 4096
    /// (a whole page: Nomad's micro-benchmark copies one per trace entry).
    #[arg(long, value_name = "BYTES")]
    pub access_bytes: Option<f64>,
    /// CPU time per operation besides its memory accesses, ns (an
    /// operation is one access; in kv, one request). kv-ycsb-* default
    /// to Redis' 8000.
    #[arg(long, value_name = "NS")]
    pub compute_ns_per_op: Option<f64>,
    /// Antagonist load on its tier as a fraction of its bandwidth (0 = none).
    #[arg(long)]
    pub antagonist: Option<f64>,
    /// Start with every page in the slowest tiers (as `tiervm run
    /// --placement slow-first`), to match a live comparison.
    #[arg(long)]
    pub start_slow: bool,
    /// Let PEBS-sampled policies (memtis, colloid) see every access even on
    /// a platform where PEBS is blind to slow-tier loads: to match a live
    /// run, whose samples come from hint faults, not PEBS.
    #[arg(long)]
    pub pebs_sees_all: bool,
    /// Track and migrate 4 KiB pages even where the scenario's system maps
    /// 2 MiB pages (colloid and colloid-base on HeMem in the colloid-gups
    /// scenarios; memtis and memtis-quickcool under THP in every scenario):
    /// to match a live run, which tracks and moves 4 KiB pages.
    #[arg(long)]
    pub small_pages: bool,
    /// Skip the benchmark's initialization before the measured run (the
    /// Nomad micro-benchmarks' memset, warm-up round and sleep): to match a
    /// live run of the zipf image, which has none.
    #[arg(long)]
    pub no_bench_init: bool,
    /// Keep the hint-fault scanner at its starting rate (256 MB/s), as
    /// tiervm's live sampler does, instead of adapting its period as
    /// Linux does (`task_scan_max`): to match a live run.
    #[arg(long)]
    pub fixed_scan_rate: bool,
    /// Zipf: spread the WSS's hot pages along it, as the zipf guest image
    /// does (a Zipf over the WSS's pages, YCSB-scrambled), instead of
    /// Nomad's traces (YCSB's key distribution, hottest pages first): to
    /// match a live run, or to run the papers' "uniformly distributed".
    #[arg(long)]
    pub scrambled_wss: bool,
    /// Zipf on Nomad's traces: put the WSS's pages in a random order
    /// (the papers' text: hot data "uniformly distributed along the WSS")
    /// instead of the artifact's traces' hottest-first order.
    #[arg(long)]
    pub spread_hot_pages: bool,
    /// Nomad's micro-benchmarks: also sleep between the measured rounds,
    /// as the benchmark does (10 s after each round; memory_access.cc
    /// l.191-192): migrations go on, no access is made, and neither the
    /// time nor the counts are in the rounds'.
    #[arg(long)]
    pub sleep_between_rounds: bool,
    /// Tier the antagonist loads.
    #[arg(long)]
    pub antagonist_tier: Option<u8>,
    /// Zipf: resident set GiB.
    #[arg(long)]
    pub rss_gib: Option<f64>,
    /// Zipf: working set GiB.
    #[arg(long)]
    pub wss_gib: Option<f64>,
    /// Zipf: skew theta.
    #[arg(long)]
    pub theta: Option<f64>,
    /// GUPS / Gaussian: buffer GiB.
    #[arg(long)]
    pub size_gib: Option<f64>,
    /// GUPS: hot set GiB.
    #[arg(long)]
    pub hot_gib: Option<f64>,
    /// GUPS / Gaussian: probability of a hot access.
    #[arg(long)]
    pub hot_prob: Option<f64>,
    /// Gaussian: hot fraction of the buffer.
    #[arg(long)]
    pub hot_fraction: Option<f64>,
    /// kv and pagerank parameters (boxed: keeps the subcommand enum small).
    #[command(flatten)]
    pub guest: Box<GuestWorkloadArgs>,
    /// Tier capacities in GiB, fastest first, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub tier_capacity_gib: Vec<f64>,
    /// Tier unloaded latencies in ns, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub tier_latency_ns: Vec<f64>,
    /// Tier peak bandwidths in GB/s, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub tier_bandwidth_gbps: Vec<f64>,
    /// Queueing coefficient k of every tier's latency curve.
    #[arg(long)]
    pub queue_k: Option<f64>,
    /// Promotion / migration rate limit for every policy, MB/s.
    #[arg(long)]
    pub rate_limit_mbps: Option<f64>,
    /// Free share of a tier kept by the policies that have no watermark of
    /// their own (memtis, colloid on 4 KiB pages, mtm, adaptive), per 10,000
    /// of the tier as Linux's `watermark_scale_factor` counts (default 40 =
    /// 0.4%, borrowed from Linux): a sensitivity knob.
    #[arg(long, value_name = "PER_10000")]
    pub free_reserve_bp: Option<u16>,
    /// Unit costs of faults and migrations to start from (the flags below
    /// override single ones).
    #[arg(long, value_enum, default_value_t = CostsArg::Default)]
    pub costs: CostsArg,
    /// Modeled fault cost, ns.
    #[arg(long)]
    pub fault_ns: Option<f64>,
    /// Modeled TLB shootdown cost (initiator), ns.
    #[arg(long)]
    pub shootdown_ns: Option<f64>,
    /// Modeled IPI cost per interrupted thread, ns.
    #[arg(long)]
    pub ipi_ns: Option<f64>,
    /// Modeled per-page migration bookkeeping, ns.
    #[arg(long)]
    pub migrate_setup_ns: Option<f64>,
    /// Modeled single-thread copy bandwidth, GB/s.
    #[arg(long)]
    pub copy_gbps: Option<f64>,
    /// Modeled mover time to put one aborted TPM page back, ns.
    #[arg(long)]
    pub tpm_abort_ns: Option<f64>,
    /// Modeled time a shadow remap (demotion without a copy) holds its page, ns.
    #[arg(long)]
    pub shadow_remap_ns: Option<f64>,
    /// NOT A TEST: per 1000 transactional migration attempts, how many fail
    /// for a reason other than a write during the copy (Nomad's -EAGAIN
    /// from a held page lock or an unexpected reference); no source gives
    /// a rate (docs/reproduction.md, "Read-only TPM aborts").
    #[arg(long, value_name = "PER_1000")]
    pub tpm_busy_abort_permille: Option<u8>,
}

/// Overrides of the guest-image workloads (`kv-*`, `pagerank-*` scenarios).
#[derive(Clone, Debug, Default, Args)]
pub struct GuestWorkloadArgs {
    /// kv: records (real; the simulator runs records / scale).
    #[arg(long)]
    pub records: Option<u64>,
    /// kv: bytes per value (rounded up to 64).
    #[arg(long)]
    pub value_size: Option<u64>,
    /// kv: YCSB mix a, b, c or f.
    #[arg(long)]
    pub kv_workload: Option<String>,
    /// pagerank: log2 of the vertex count (real; the simulator divides the
    /// vertex count by the scale rounded to a power of two).
    #[arg(long)]
    pub graph_scale: Option<u32>,
    /// pagerank: average degree.
    #[arg(long)]
    pub degree: Option<u64>,
    /// pagerank: graph generator, uniform or rmat.
    #[arg(long)]
    pub graph: Option<String>,
}

fn set_list(dst: &mut [f64], src: &[f64], flag: &'static str) -> Result<(), SimCmdError> {
    if src.is_empty() {
        return Ok(());
    }
    if src.len() != dst.len() {
        return Err(SimCmdError::TierListLength {
            flag,
            tiers: dst.len(),
            got: src.len(),
        });
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// Applies the command-line overrides to a scenario: the run's shape, the
/// workload's parameters, the tiers, the rate limit and the mechanism costs.
pub fn apply_overrides(scn: &mut Scenario, a: &SimArgs) -> Result<(), SimCmdError> {
    override_run(scn, a);
    if a.sleep_between_rounds {
        match scn.bench_init.as_mut() {
            Some(init) => init.sleep_between_rounds = true,
            None => return Err(SimCmdError::NoBenchInit("--sleep-between-rounds")),
        }
    }
    override_workload(scn, a)?;
    relabel_guest_workload(scn, a);
    override_tiers(scn, a)?;
    if let Some(v) = a.rate_limit_mbps {
        scn.promote_rate_limit_mbps = Some(v);
    }
    if let Some(v) = a.tpm_busy_abort_permille {
        scn.costs.tpm_busy_abort = f64::from(v) / 1000.0;
    }
    if let Some(v) = a.free_reserve_bp {
        if v >= 10_000 {
            return Err(SimCmdError::FreeReserve(v));
        }
        scn.free_reserve_fraction = Some(f64::from(v) / 10_000.0);
    }
    if a.costs == CostsArg::Measured {
        scn.costs = tiering::sim::model::CostModel::measured();
    }
    let c = &mut scn.costs;
    for (dst, src) in [
        (&mut c.fault_ns, a.fault_ns),
        (&mut c.shootdown_ns, a.shootdown_ns),
        (&mut c.ipi_receive_ns, a.ipi_ns),
        (&mut c.migrate_setup_ns, a.migrate_setup_ns),
        (&mut c.copy_gbps, a.copy_gbps),
        (&mut c.tpm_abort_ns, a.tpm_abort_ns),
        (&mut c.shadow_remap_ns, a.shadow_remap_ns),
    ] {
        if let Some(v) = src {
            *dst = v;
        }
    }
    Ok(())
}

/// Duration, seed, scale, write ratio, threads, MLP and the antagonist.
fn override_run(scn: &mut Scenario, a: &SimArgs) {
    if let Some(v) = a.duration {
        scn.duration_s = v;
        scn.rounds = None;
    }
    if let Some(v) = a.seed {
        scn.seed = v;
    }
    if let Some(v) = a.scale {
        scn.scale = v;
    }
    if let Some(v) = a.write_ratio {
        scn.write_ratio = v;
    }
    if let Some(v) = a.threads {
        scn.threads = v;
    }
    if let Some(v) = a.mlp {
        scn.mlp = v;
    }
    if let Some(v) = a.access_bytes {
        scn.access_bytes = v;
    }
    if let Some(v) = a.compute_ns_per_op {
        scn.compute_ns_per_op = v;
    }
    if a.start_slow {
        scn.start_in_slow_tier = true;
    }
    if a.pebs_sees_all {
        scn.pebs_blind_to_slow_loads = false;
    }
    if a.small_pages {
        scn.huge_pages = false;
        scn.transparent_huge_pages = false;
    }
    if a.fixed_scan_rate {
        scn.linux_scan_period = false;
    }
    if a.no_bench_init {
        scn.bench_init = None;
    }
    if let Some(v) = a.antagonist {
        let tier = a
            .antagonist_tier
            .or(scn.antagonist.as_ref().map(|x| x.tier))
            .unwrap_or(0);
        scn.antagonist = (v > 0.0).then_some(sim::scenario::Antagonist {
            tier,
            utilization: v,
        });
    } else if let (Some(t), Some(ant)) = (a.antagonist_tier, scn.antagonist.as_mut()) {
        ant.tier = t;
    }
}

fn set<T: Copy>(dst: &mut T, src: Option<T>) {
    if let Some(v) = src {
        *dst = v;
    }
}

/// The parameters of the scenario's workload that the flags name.
fn override_workload(scn: &mut Scenario, a: &SimArgs) -> Result<(), SimCmdError> {
    use tiering::sim::workload::{PrGraph, WorkloadSpec as W, YcsbMix};
    match &mut scn.workload {
        W::Zipf {
            rss_gib,
            wss_gib,
            theta,
            ycsb_trace,
        } => {
            set(rss_gib, a.rss_gib);
            set(wss_gib, a.wss_gib);
            set(theta, a.theta);
            if a.scrambled_wss {
                *ycsb_trace = None;
            }
            if let (true, Some(t)) = (a.spread_hot_pages, ycsb_trace.as_mut()) {
                t.hottest_first = false;
            }
        }
        W::Gups {
            size_gib,
            hot_gib,
            hot_prob,
        }
        | W::MovingHot {
            size_gib,
            hot_gib,
            hot_prob,
            ..
        } => {
            set(size_gib, a.size_gib);
            set(hot_gib, a.hot_gib);
            set(hot_prob, a.hot_prob);
        }
        W::GaussianHot {
            size_gib,
            hot_fraction,
            hot_prob,
        } => {
            set(size_gib, a.size_gib);
            set(hot_fraction, a.hot_fraction);
            set(hot_prob, a.hot_prob);
        }
        W::Kv {
            records,
            value_size,
            mix,
            theta,
        } => {
            set(records, a.guest.records);
            set(value_size, a.guest.value_size);
            set(theta, a.theta);
            if let Some(w) = &a.guest.kv_workload {
                *mix = YcsbMix::parse(w).ok_or_else(|| SimCmdError::KvWorkload(w.clone()))?;
                let letter = w.trim().to_ascii_lowercase();
                if scn.name.starts_with("kv-ycsb-") {
                    scn.name = format!("kv-ycsb-{letter}");
                    if let Some(i) = scn.about.find("YCSB-") {
                        scn.about
                            .replace_range(i + 5..i + 6, &letter.to_ascii_uppercase());
                    }
                }
            }
        }
        W::Pagerank {
            scale,
            degree,
            graph,
        } => {
            set(scale, a.guest.graph_scale);
            set(degree, a.guest.degree);
            if let Some(g) = &a.guest.graph {
                *graph = PrGraph::parse(g).ok_or_else(|| SimCmdError::Graph(g.clone()))?;
            }
        }
    }
    Ok(())
}

/// A kv or pagerank workload changed by flags says so in its description
/// (and pagerank scales Nomad's 16 GB fast tier with GAPBS's build peak
/// for the new graph, `pagerank_fast_tier_gib`; an
/// explicit --tier-capacity-gib still wins).
fn relabel_guest_workload(scn: &mut Scenario, a: &SimArgs) {
    use tiering::sim::workload::WorkloadSpec as W;
    let g = &a.guest;
    let guest_overridden = g.records.is_some()
        || g.value_size.is_some()
        || g.graph_scale.is_some()
        || g.degree.is_some()
        || g.graph.is_some()
        || (a.theta.is_some() && matches!(scn.workload, W::Kv { .. }));
    if !guest_overridden {
        return;
    }
    if matches!(scn.workload, W::Pagerank { .. }) && scn.name.starts_with("pagerank-") {
        if let Some(t) = scn.tiers.first_mut() {
            t.capacity_gib = sim::scenario::pagerank_fast_tier_gib(&scn.workload);
        }
    }
    scn.about = format!(
        "{} [overridden: {:?}, fast tier {} GiB]",
        scn.about,
        scn.workload,
        scn.tiers.first().map_or(0.0, |t| t.capacity_gib)
    );
}

/// Per-tier capacities, latencies and bandwidths, and every tier's `k`.
fn override_tiers(scn: &mut Scenario, a: &SimArgs) -> Result<(), SimCmdError> {
    let n = scn.tiers.len();
    let mut caps: Vec<f64> = scn.tiers.iter().map(|t| t.capacity_gib).collect();
    let mut lats: Vec<f64> = scn.tiers.iter().map(|t| t.unloaded_ns).collect();
    let mut bws: Vec<f64> = scn.tiers.iter().map(|t| t.bandwidth_gbps).collect();
    set_list(&mut caps, &a.tier_capacity_gib, "tier-capacity-gib")?;
    set_list(&mut lats, &a.tier_latency_ns, "tier-latency-ns")?;
    set_list(&mut bws, &a.tier_bandwidth_gbps, "tier-bandwidth-gbps")?;
    for i in 0..n {
        let t = &mut scn.tiers[i];
        t.capacity_gib = caps[i];
        t.unloaded_ns = lats[i];
        t.bandwidth_gbps = bws[i];
        if let Some(k) = a.queue_k {
            t.queue_k = k;
        }
    }
    Ok(())
}

/// Runs jobs over at most `jobs` threads (no more than there are items),
/// keeping the input order. The calling thread works too, so the jobs run
/// even when the system refuses to start another thread.
fn parallel<T: Send, R: Send>(items: Vec<T>, jobs: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let jobs = jobs.clamp(1, items.len().max(1));
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    let queue = std::sync::Mutex::new(items.into_iter().enumerate().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(&mut slots);
    let work = || loop {
        let next = queue.lock().map(|mut q| q.pop()).unwrap_or(None);
        let Some((i, item)) = next else { break };
        let r = f(item);
        if let Ok(mut out) = results.lock() {
            out[i] = Some(r);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..jobs {
            if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                break;
            }
        }
        work();
    });
    slots.into_iter().flatten().collect()
}

/// Runs `tiervm sim`. Returns the process exit code.
pub fn run(args: &SimArgs) -> crate::error::Result<i32> {
    if args.list {
        crate::output::stdout(&crate::presentation::sim::list())?;
        return Ok(0);
    }
    if let Some(pool) = args.division_pool {
        return run_division(args, pool);
    }
    let Some(name) = args.scenario.as_deref() else {
        return Err(SimCmdError::NoScenario.into());
    };
    let mut scn =
        sim::builtin(name).ok_or_else(|| SimCmdError::UnknownScenario { name: name.into() })?;
    apply_overrides(&mut scn, args)?;
    let policies: Vec<PolicyKind> = if args.policies.is_empty() {
        PolicyKind::POLICIES.to_vec()
    } else {
        args.policies
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.parse())
            .collect::<Result<_, _>>()
            .map_err(SimCmdError::from)?
    };
    let mut work: Vec<(PolicyKind, Option<f64>)> = policies.iter().map(|&p| (p, None)).collect();
    if args.sweep_static {
        work.extend((0..=10).map(|i| (PolicyKind::Static, Some(f64::from(i) / 10.0))));
    }
    // One thread per run at most (what `parallel` starts; the summary line
    // says this number).
    let jobs = args
        .jobs
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .clamp(1, work.len().max(1));
    let wall = std::time::Instant::now();
    let results: Vec<Result<SimReport, sim::SimError>> =
        parallel(work.clone(), jobs, |(p, share)| match share {
            None => sim::run(&scn, p),
            Some(s) => sim::run_with(&scn, p, sim::SimPlacement::HotShare(s)).map(|mut r| {
                r.policy = format!("split{:.0}", s * 100.0);
                r
            }),
        });
    let wall_s = wall.elapsed().as_secs_f64();
    let reports = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(SimCmdError::from)?;
    match args.report {
        SimFormat::Json => {
            let v = serde_json::json!({
                "modeled": true,
                "note": "all performance numbers come from the simulator's latency model",
                "scenario": scn,
                "reports": reports,
                "wall_s": wall_s,
            });
            let mut s = serde_json::to_string_pretty(&v).map_err(SimCmdError::from)?;
            s.push('\n');
            crate::output::stdout(&s)?;
        }
        SimFormat::Table => crate::output::stdout(&tables(args, &scn, &reports, wall_s, jobs))?,
    }
    Ok(0)
}

/// `--division-pool`: the service's fast-tier division against an even
/// split, modeled.
fn run_division(args: &SimArgs, pool: f64) -> crate::error::Result<i32> {
    let positive = |gib: f64| gib.is_finite() && gib > 0.0;
    if !(positive(pool) && positive(args.division_quantum)) {
        return Err(SimCmdError::DivisionSizes {
            pool,
            quantum: args.division_quantum,
        }
        .into());
    }
    let mut vms = if args.mix.is_empty() {
        vmm_service::modeled::default_mix()
    } else {
        args.mix
            .iter()
            .map(|n| {
                sim::builtin(n).ok_or_else(|| SimCmdError::UnknownScenario { name: n.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    for v in &mut vms {
        apply_overrides(v, args)?;
    }
    let policy: PolicyKind = match args.policies.first() {
        Some(p) => p.parse().map_err(SimCmdError::from)?,
        None => PolicyKind::Memtis,
    };
    let r = vmm_service::modeled::compare(&vms, pool, policy, args.division_quantum)
        .map_err(SimCmdError::from)?;
    match args.report {
        SimFormat::Json => crate::output::stdout(&format!(
            "{}\n",
            serde_json::to_string_pretty(&r).map_err(SimCmdError::from)?
        ))?,
        SimFormat::Table => crate::output::stdout(&vmm_service::modeled::table(&r))?,
    }
    Ok(0)
}

/// The comparison table, the simulator's speed and, with `--verbose`,
/// each run's per-tier traffic and timeline.
fn tables(
    args: &SimArgs,
    scn: &Scenario,
    reports: &[SimReport],
    wall_s: f64,
    jobs: usize,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{}", scn.about);
    let c = &scn.costs;
    // The abort and remap charges are 0 in the default set; they are shown
    // only when charged, so default-cost output keeps its published form.
    let mut extra = String::new();
    if c.tpm_abort_ns > 0.0 || c.shadow_remap_ns > 0.0 {
        extra = format!(
            ", TPM abort {:.1} us, shadow remap {:.1} us",
            c.tpm_abort_ns / 1e3,
            c.shadow_remap_ns / 1e3
        );
    }
    let _ = writeln!(
        out,
        "mechanism costs ({}): hint fault {:.1} us, fault-path promotion {:.1} us, TPM page {:.1} us{extra}",
        match args.costs {
            CostsArg::Default => "modeled defaults",
            CostsArg::Measured => "measured live on the development host, docs/results.md §9",
        },
        c.fault_ns / 1e3,
        (c.fault_ns + c.stop_and_copy_ns()) / 1e3,
        c.tpm_page_ns() / 1e3
    );
    if scn.pebs_blind_to_slow_loads {
        let _ = writeln!(
            out,
            "PEBS sampling (memtis, colloid) sees stores and fast-tier loads, no slow-tier load (CXL platform: Nomad §4; events of Nomad's Memtis, htmm_sampler.c)"
        );
    }
    let colloid_ran = reports.iter().any(|r| {
        r.policy == PolicyKind::Colloid.name() || r.policy == PolicyKind::ColloidBase.name()
    });
    if scn.huge_pages && colloid_ran {
        let _ = writeln!(
            out,
            "colloid and colloid-base sample, count and migrate HeMem's 2 MiB pages (Colloid §5; --small-pages: 4 KiB)"
        );
    }
    out.push_str(&sim::report::table(reports));
    let sim_acc: u64 = reports.iter().map(|r| r.simulated_accesses).sum();
    let cpu_s: f64 = reports.iter().map(|r| r.wall_s).sum();
    let _ = writeln!(
        out,
        "simulated {:.1}M accesses in {:.1} s wall ({} jobs); {:.1}M simulated accesses per core-second",
        sim_acc as f64 / 1e6,
        wall_s,
        jobs,
        sim_acc as f64 / cpu_s.max(1e-9) / 1e6
    );
    for r in reports {
        out.push_str(&sim::report::mode_table(r));
    }
    if args.verbose {
        write_timelines(&mut out, reports);
    }
    out
}

/// `--verbose`: each run's per-tier traffic, mode changes and timeline.
fn write_timelines(out: &mut String, reports: &[SimReport]) {
    use std::fmt::Write as _;
    for r in reports {
        out.push_str(&sim::report::tier_table(r));
        out.push_str(&sim::report::mode_changes(r));
        out.push_str("  t(s)  Macc/s  lat(ns)  fast%  mode\n");
        for p in &r.timeline {
            let _ = writeln!(
                out,
                "  {:>5.0} {:>7.1} {:>8.0} {:>6.1}  {}",
                p.t_s,
                p.throughput_maps,
                p.avg_latency_ns,
                100.0 * p.fast_share,
                p.mode.as_deref().unwrap_or("")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    /// Nomad's medium Zipf scaled as the live comparison runs it (6 modeled
    /// s would be slow in a test: 2 s, the in-progress phase).
    fn zipf_medium(costs: &str) -> Scenario {
        let cli = Cli::parse_from([
            "sim",
            "nomad-medium-ro",
            "--costs",
            costs,
            "--duration",
            "2",
            "--threads",
            "1",
            "--mlp",
            "1",
            "--access-bytes",
            "64",
            "--fixed-scan-rate",
            "--scale",
            "1",
            "--start-slow",
            "--rss-gib",
            "0.10546875",
            "--wss-gib",
            "0.052734375",
            "--tier-capacity-gib",
            "0.0625,0.25",
        ]);
        let mut scn = sim::builtin("nomad-medium-ro").unwrap();
        apply_overrides(&mut scn, &cli.sim).unwrap();
        scn
    }

    /// `--sleep-between-rounds` turns the sleeps on where the scenario has
    /// the benchmark's initialization, and is refused, naming the fix,
    /// where it has none.
    #[test]
    fn sleeps_between_rounds_need_the_benchmarks_initialization() {
        let cli = Cli::parse_from(["sim", "nomad-small-ro", "--sleep-between-rounds"]);
        let mut scn = sim::builtin("nomad-small-ro").unwrap();
        apply_overrides(&mut scn, &cli.sim).unwrap();
        assert!(scn.bench_init.as_ref().unwrap().sleep_between_rounds);
        for args in [
            &["sim", "colloid-gups-0x", "--sleep-between-rounds"][..],
            &[
                "sim",
                "nomad-small-ro",
                "--no-bench-init",
                "--sleep-between-rounds",
            ],
        ] {
            let cli = Cli::parse_from(args);
            let mut scn = sim::builtin(args[1]).unwrap();
            let err = apply_overrides(&mut scn, &cli.sim).unwrap_err().to_string();
            assert!(
                err.contains("needs a scenario with the benchmark's initialization"),
                "{err}"
            );
        }
    }

    /// The 2 MiB note is printed only when a policy it concerns ran.
    #[test]
    fn hemem_2m_note_only_with_colloid() {
        let cli = Cli::parse_from(["sim", "colloid-gups-0x", "--duration", "0.5"]);
        let mut scn = sim::builtin("colloid-gups-0x").unwrap();
        apply_overrides(&mut scn, &cli.sim).unwrap();
        assert!(scn.huge_pages);
        let note = "HeMem's 2 MiB pages";
        let static_run = sim::run(&scn, PolicyKind::Static).unwrap();
        let out = tables(&cli.sim, &scn, std::slice::from_ref(&static_run), 0.0, 1);
        assert!(!out.contains(note), "{out}");
        let base = sim::run(&scn, PolicyKind::ColloidBase).unwrap();
        let out = tables(&cli.sim, &scn, &[static_run, base], 0.0, 1);
        assert!(out.contains(note), "{out}");
    }

    /// `--costs measured` puts the live unit costs into the model, and they
    /// matter: TPP's fault-path promotions at ~31 us (measured) instead of
    /// 7.4 us (modeled default) slow its in-progress phase down.
    #[test]
    fn measured_costs_reach_the_model_and_slow_tpp_down() {
        let (d, m) = (zipf_medium("default"), zipf_medium("measured"));
        assert_eq!(d.costs, sim::model::CostModel::default());
        assert_eq!(m.costs, sim::model::CostModel::measured());
        let tpp = |s: &Scenario| sim::run(s, PolicyKind::Tpp).unwrap();
        let (rd, rm) = (tpp(&d), tpp(&m));
        assert!(rm.counters.sync_promotions > 1000.0, "{:?}", rm.counters);
        assert!(
            rm.in_progress_maps < 0.97 * rd.in_progress_maps,
            "measured {} vs default {} Macc/s in progress",
            rm.in_progress_maps,
            rd.in_progress_maps
        );
    }
}
