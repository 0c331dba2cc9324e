//! Built-in scenarios named after the seeds' experiments, and overrides.

use serde::{Deserialize, Serialize};

use super::model::{CostModel, TierModel, DEFAULT_QUEUE_K};
use super::workload::{PrGraph, WorkloadSpec, YcsbMix, YcsbTrace};

/// Extra load on one tier (Colloid's antagonist), as a fraction of that
/// tier's peak bandwidth, present the whole run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Antagonist {
    /// Loaded tier.
    pub tier: u8,
    /// Fraction of the tier's bandwidth it consumes.
    pub utilization: f64,
}

/// Everything a simulation run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// One-line description with its source.
    pub about: String,
    /// Tiers, fastest first.
    pub tiers: Vec<TierModel>,
    /// Workload.
    pub workload: WorkloadSpec,
    /// Fraction of accesses that write.
    pub write_ratio: f64,
    /// Application threads.
    pub threads: u32,
    /// Outstanding memory requests per thread (memory-level parallelism).
    pub mlp: f64,
    /// Bytes moved per access (a cache line; a write adds a write-back).
    pub access_bytes: f64,
    /// Antagonist, if any.
    pub antagonist: Option<Antagonist>,
    /// Modeled seconds.
    pub duration_s: f64,
    /// Real pages per modeled page.
    pub scale: f64,
    /// Seed.
    pub seed: u64,
    /// Mechanism costs.
    pub costs: CostModel,
    /// Promotion / migration rate limit handed to every policy (MB/s), as
    /// when a paper gives all systems the same cap.
    pub promote_rate_limit_mbps: Option<f64>,
    /// Fraction of the run counted as "in progress" (start) and "stable" (end).
    pub phase_fraction: f64,
    /// Start with every page in the slowest tiers (filled slowest first),
    /// as when the pages were demoted before the run (Nomad's Redis cases).
    #[serde(default)]
    pub start_in_slow_tier: bool,
    /// The CPU's PEBS cannot sample loads served by the slower tiers: on
    /// Nomad's CXL platforms (A and B) an LLC miss to CXL is an uncore
    /// event (Nomad §4, baselines), and the Memtis Nomad ran opens no
    /// TLB-miss event, so it samples only stores and fast-tier loads
    /// ([`super::pebs`]). Applies to policies whose samples stand for PEBS
    /// (`TrackerRequest::hardware_samples`).
    #[serde(default)]
    pub pebs_blind_to_slow_loads: bool,
    /// The workload's writes are stores alone, with no load of the line
    /// first: Nomad's micro-benchmark writes a page with one `memcpy` from
    /// a buffer (Nomad artifact, `src/userspace_programs/tpp/memory_access.cc`,
    /// `-work=0` in the Memtis write scripts). Otherwise a write is a
    /// read-modify-write (GUPS' update), whose load PEBS counts like any
    /// load. Matters only to a policy that samples stores apart
    /// (`TrackerRequest::store_sample_period`: Memtis).
    #[serde(default)]
    pub pebs_writes_are_stores: bool,
    /// CPU time an operation spends besides its memory accesses, ns per
    /// thread. An operation is one access, except in `kv`, where it is a
    /// request (a bucket and its value). 0: every access goes back to
    /// back, as in the micro-benchmarks.
    #[serde(default)]
    pub compute_ns_per_op: f64,
    /// The system under test maps memory with 2 MiB pages where its paper
    /// does: Colloid's evaluation runs on HeMem, which manages 2 MiB pages
    /// (`PAGE_SIZE = HUGEPAGE_SIZE`, hemem.h; Colloid §5), so `colloid`
    /// and `colloid-base` sample, count and migrate 2 MiB pages
    /// ([`crate::policy::PolicyConfig::huge_pages`]). The other policies
    /// keep 4 KiB pages.
    #[serde(default)]
    pub huge_pages: bool,
    /// Transparent huge pages are on where the system under test runs
    /// them: every Memtis setup in the seeds (Nomad's Memtis scripts set
    /// `thp_setting=always`), so `memtis` and `memtis-quickcool` count and
    /// move 2 MiB pages
    /// ([`crate::policy::PolicyConfig::transparent_huge_pages`]). On by
    /// default; `tiervm sim --small-pages` turns it off.
    #[serde(default = "thp_default")]
    pub transparent_huge_pages: bool,
    /// What the benchmark does before its measured rounds, run before the
    /// measured `duration_s` and left out of its throughput and counts
    /// (Nomad's micro-benchmark: [`BenchInit`]).
    #[serde(default)]
    pub bench_init: Option<BenchInit>,
    /// The hint-fault scanner's period adapts as Linux's does
    /// ([`crate::policy::tpp::ScanPeriod`]: it doubles once per pass, up to
    /// `task_scan_max`), as in every kernel the seeds ran. Off: it keeps
    /// its starting rate, as tiervm's live sampler does (`tiervm sim
    /// --fixed-scan-rate`). On by default.
    #[serde(default = "linux_scan_period_default")]
    pub linux_scan_period: bool,
    /// The measured run is rounds of a fixed number of operations, timed
    /// by the model: each policy's round lasts as long as its own
    /// operations take (Nomad's micro-benchmark replays its trace once a
    /// round, memory_access.cc). `duration_s` is then only a cap: a run
    /// still short of its rounds stops there, its last round cut short.
    /// In progress is round 1, stable the last round. None: the run lasts
    /// `duration_s` and its phases are `phase_fraction` of it.
    #[serde(default)]
    pub rounds: Option<Rounds>,
    /// Overrides the free fraction of a tier that policies without a
    /// watermark of their own keep (`PolicyConfig::free_reserve_fraction`;
    /// `--free-reserve-bp`, a sensitivity knob). `None`: each policy's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_reserve_fraction: Option<f64>,
}

/// [`Scenario::rounds`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rounds {
    /// Measured rounds.
    pub count: u32,
    /// Operations per round (real; the model serves `ops / scale`).
    pub ops: f64,
}

/// [`Scenario::linux_scan_period`]' default: on.
fn linux_scan_period_default() -> bool {
    true
}

/// [`Scenario::transparent_huge_pages`]' default: on.
fn thp_default() -> bool {
    true
}

/// Nomad's micro-benchmark before its measured rounds (Nomad artifact,
/// github.com/lingfenghsiang/Nomad at 0fafe0e,
/// `src/userspace_programs/tpp/memory_access.cc`):
/// 1. `Setup` `memset`s the whole heap, every page of the RSS once, in
///    address order (l.327); this allocates the pages (first touch) and is
///    not timed;
/// 2. round "0", the warm-up, `memcpy`s a page-sized buffer into each page
///    of the warm-up trace in trace order (l.152, `warm_with_write`,
///    l.387-388), whatever `-work` says. The warm-up trace is a YCSB
///    Zipfian run of its own (`generate_ycsb.sh`), as long as a measured
///    round; `write_binary_data.py -o` puts the measured trace's pages
///    after the warm-up trace's, so for the 10G and 13.5G cases the
///    warm-up writes the first half of the RSS, which the measured rounds
///    never touch. For 27G the measured trace *is* the warm-up trace
///    (`nomad_run.sh` l.19, `-frun=...warmup_zipfan_hottest_27G.bin`), so
///    the warm-up writes the WSS with the measured rounds' hot pages;
/// 3. the program sleeps `-sleep=10` seconds (l.180-181) before round "1".
///
/// The artifact README ("Figure 7", "Table 2") takes "in progress" from
/// round 1 and "stable" from round 4, and Table 2 subtracts counters read
/// at each round's start and end (l.372, 446): the memset, the warm-up and
/// the sleep are in neither. The simulator runs them before the measured
/// run and leaves them out of its throughput, phases and counts. The
/// program also sleeps as long after every measured round (l.191-192);
/// the model runs those sleeps only with [`BenchInit::sleep_between_rounds`]
/// (`tiervm sim --sleep-between-rounds`), off by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchInit {
    /// The warm-up round's length as a fraction of the measured run: one
    /// of its four rounds (memory_access.cc l.182), the share of the run
    /// `phase_fraction` reports as one phase.
    pub warmup_fraction: f64,
    /// Modeled seconds of the sleep before the measured rounds (`-sleep=10`
    /// in nomad_run.sh, tpp_run.sh and the Memtis scripts).
    pub sleep_s: f64,
    /// The same sleep after each measured round but the last (the rounds
    /// are the run's phases, `phase_fraction` of it each): no access, the
    /// policy's ticks and migrations go on, and neither the sleep's time
    /// nor its counts are in the run's throughput, phases or counts.
    #[serde(default)]
    pub sleep_between_rounds: bool,
}

/// Bytes one access of Nomad's micro-benchmark moves: its trace runs in
/// one thread, one `memcpy` of a whole 4 KiB page per entry (Nomad
/// artifact, `memory_access.cc`: `MemAccess::Run` calls `MemAccessExec`,
/// one loop over the trace in `main`'s thread; the warm-up round too).
/// The model serves an entry as one access of 64 lines (PEBS counts its
/// 64 lines as 64 events).
pub const NOMAD_ENTRY_BYTES: f64 = 4096.0;

/// Entries in flight for Nomad's micro-benchmark (one thread, one 4 KiB
/// page per entry, [`NOMAD_ENTRY_BYTES`]). Nomad Table 1, platform A: one
/// thread reads 12 GB/s from DDR5 at 316 cycles (2.1 GHz) and 4.5 GB/s
/// from CXL at 854 cycles, i.e. bandwidth x unloaded latency / 64 B =
/// 28.2 and 28.6 lines in flight; the model takes DDR5's, 28.2 lines =
/// 0.44 of a 4 KiB entry.
pub const NOMAD_A_ONE_THREAD_MLP: f64 = 12.0 * (316.0 / 2.1) / NOMAD_ENTRY_BYTES;

/// Real pages per modeled page in the Nomad micro-benchmarks: one thread
/// copying whole pages makes about 1-2M accesses a second, so at scale 64
/// a run of four rounds simulates 1-3M accesses per policy (the 16 threads of
/// 64-byte accesses modeled before made 60x more, hence scale 256 then);
/// a finer grain keeps the PCQ's 20-fault look-back and the scanner's
/// 2 MiB ranges closer to the real ones ("Scale matters for Nomad",
/// docs/reproduction.md). Finer still costs the policies that walk every
/// page each tick (colloid: 7 s per run at 64, over 2 min at 16).
pub const NOMAD_SCALE: f64 = 64.0;

/// The Nomad micro-benchmark's initialization ([`BenchInit`]).
pub const NOMAD_BENCH_INIT: BenchInit = BenchInit {
    warmup_fraction: 0.25,
    sleep_s: 10.0,
    sleep_between_rounds: false,
};

/// CPU time of one Redis request in the server thread, ns: Redis serves
/// about 100-150k requests/s per thread without pipelining
/// (redis-benchmark, <https://redis.io/docs/latest/operate/oss_and_stack/management/optimization/benchmarks/>),
/// i.e. 7-10 us each, nearly all of it protocol and event-loop work, not
/// the hash table's memory accesses. Nomad's Redis runs (§4.3) are these.
pub const REDIS_REQUEST_CPU_NS: f64 = 8_000.0;

fn tier(name: &str, gib: f64, ns: f64, gbps: f64) -> TierModel {
    TierModel {
        name: name.into(),
        capacity_gib: gib,
        unloaded_ns: ns,
        bandwidth_gbps: gbps,
        queue_k: DEFAULT_QUEUE_K,
        full_duplex: false,
    }
}

/// Nomad platform A (Table 1): 2.1 GHz, fast 316 cycles, slow 854 cycles;
/// peak read bandwidth 31.45 / 21.7 GB/s; both tiers 16 GB for micro-benchmarks.
fn nomad_platform_a() -> Vec<TierModel> {
    vec![
        tier("DDR5", 16.0, 316.0 / 2.1, 31.45),
        tier("CXL", 16.0, 854.0 / 2.1, 21.7),
    ]
}

/// A platform-A run as Nomad §4 runs its applications: 16 threads, one
/// outstanding 64-byte access each, no antagonist, 200 modeled s at scale
/// 256, pages placed first-touch; read-only unless the caller says
/// otherwise. (The micro-benchmarks run one thread copying whole pages:
/// [`NOMAD_ENTRY_BYTES`].)
pub fn nomad_platform_a_run(name: String, about: String, workload: WorkloadSpec) -> Scenario {
    Scenario {
        name,
        about,
        tiers: nomad_platform_a(),
        workload,
        write_ratio: 0.0,
        threads: 16,
        mlp: 1.0,
        access_bytes: 64.0,
        antagonist: None,
        duration_s: 200.0,
        scale: 256.0,
        seed: 1,
        costs: CostModel::default(),
        promote_rate_limit_mbps: None,
        phase_fraction: 0.25,
        start_in_slow_tier: false,
        pebs_blind_to_slow_loads: true,
        pebs_writes_are_stores: false,
        compute_ns_per_op: 0.0,
        huge_pages: false,
        transparent_huge_pages: true,
        bench_init: None,
        linux_scan_period: true,
        rounds: None,
        free_reserve_fraction: None,
    }
}

/// One round of Nomad's micro-benchmark: the page copies of its trace
/// (YCSB `operationcount` in the artifact's `workloada-10G`, `-13.5G` and
/// `-27G`: 18M, 30M and 40M; the warm-up trace is as long). The run is
/// four rounds of that many copies ([`Scenario::rounds`]: in progress =
/// round 1, stable = round 4, as the artifact's README takes them), each
/// as long as the policy's own copies take, and the warm-up round one
/// more.
pub const NOMAD_ROUNDS: [NomadRound; 3] = [
    NomadRound {
        size: "small",
        rss_gib: 20.0,
        wss_gib: 10.0,
        records: 2_700_000,
        copies: 18e6,
    },
    NomadRound {
        size: "medium",
        rss_gib: 27.0,
        wss_gib: 13.5,
        records: 3_600_000,
        copies: 30e6,
    },
    NomadRound {
        size: "large",
        rss_gib: 27.0,
        wss_gib: 27.0,
        records: 8_000_000,
        copies: 40e6,
    },
];

/// See [`NOMAD_ROUNDS`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NomadRound {
    /// `small`, `medium` or `large`.
    pub size: &'static str,
    /// Resident set, GB (Nomad §4.1: 20 / 27 / 27).
    pub rss_gib: f64,
    /// Working set at the end of it, GB (10 / 13.5 / 27).
    pub wss_gib: f64,
    /// YCSB `recordcount` of the trace (2.7M / 3.6M / 8M; [`YcsbTrace`]).
    pub records: u64,
    /// Page copies per round (YCSB `operationcount`).
    pub copies: f64,
}

/// The cap on a micro-benchmark's measured run ([`Scenario::rounds`]),
/// modeled seconds: far above any policy's four rounds.
pub const NOMAD_RUN_CAP_S: f64 = 3600.0;

fn nomad(round: &NomadRound, write_only: bool) -> Scenario {
    let (rss, wss) = (round.rss_gib, round.wss_gib);
    let (suffix, mode, write_ratio) = if write_only {
        ("wo", "write-only", 1.0)
    } else {
        ("ro", "read-only", 0.0)
    };
    let name = format!("nomad-{}-{suffix}", round.size);
    Scenario {
        write_ratio,
        duration_s: NOMAD_RUN_CAP_S,
        rounds: Some(Rounds {
            count: 4,
            ops: round.copies,
        }),
        pebs_writes_are_stores: true,
        bench_init: Some(NOMAD_BENCH_INIT),
        threads: 1,
        mlp: NOMAD_A_ONE_THREAD_MLP,
        access_bytes: NOMAD_ENTRY_BYTES,
        scale: NOMAD_SCALE,
        ..nomad_platform_a_run(
            name,
            format!("Nomad §4.1 micro-benchmark: Zipf {mode}, WSS {wss} GB / RSS {rss} GB over 16 GB fast, platform A; one thread copying 4 KiB pages, 4 rounds of {:.0}M copies each, timed by the model", round.copies / 1e6),
            WorkloadSpec::Zipf {
                rss_gib: rss,
                wss_gib: wss,
                theta: 0.99,
                ycsb_trace: Some(YcsbTrace {
                    records: round.records,
                    operations: round.copies as u64,
                    hottest_first: true,
                }),
            },
        )
    }
}

fn colloid(level: u32) -> Scenario {
    let utilization = [0.0, 0.51, 0.65, 0.70][level.min(3) as usize];
    Scenario {
        name: format!("colloid-gups-{level}x"),
        about: format!(
            "Colloid §5.1 GUPS: 72 GB, 24 GB hot at 90%, 1:1 read/update, 15 threads; antagonist {level}x ({:.0}% of local bandwidth)",
            utilization * 100.0
        ),
        // The remote socket's memory is reached over UPI, 75 GB/s in each
        // direction (Colloid §5 testbed).
        tiers: vec![
            tier("local", 32.0, 70.0, 205.0),
            TierModel {
                full_duplex: true,
                ..tier("remote", 96.0, 135.0, 75.0)
            },
        ],
        workload: WorkloadSpec::Gups { size_gib: 72.0, hot_gib: 24.0, hot_prob: 0.9 },
        write_ratio: 1.0,
        threads: 15,
        mlp: 3.0,
        access_bytes: 64.0,
        antagonist: (level > 0).then_some(Antagonist { tier: 0, utilization }),
        duration_s: 300.0,
        scale: 8192.0,
        seed: 1,
        costs: CostModel::default(),
        promote_rate_limit_mbps: None,
        phase_fraction: 0.25,
        start_in_slow_tier: false,
        pebs_blind_to_slow_loads: false,
        pebs_writes_are_stores: false,
        compute_ns_per_op: 0.0,
        huge_pages: true,
        transparent_huge_pages: true,
        bench_init: None,
        linux_scan_period: true,
        rounds: None,
        free_reserve_fraction: None,
    }
}

fn mtm_4tier() -> Scenario {
    Scenario {
        name: "mtm-4tier".into(),
        about: "MTM Table 1 four tiers (90/145/275/340 ns), GUPS-like 512 GB with a 20% Gaussian hot set at 80%, 8 threads, 200 MB per 10 s migration cap for all".into(),
        tiers: vec![
            tier("local DRAM", 96.0, 90.0, 95.0),
            tier("remote DRAM", 96.0, 145.0, 35.0),
            tier("local PM", 756.0, 275.0, 35.0),
            tier("remote PM", 756.0, 340.0, 1.0),
        ],
        workload: WorkloadSpec::GaussianHot { size_gib: 512.0, hot_fraction: 0.2, hot_prob: 0.8 },
        write_ratio: 0.5,
        threads: 8,
        mlp: 1.0,
        access_bytes: 64.0,
        antagonist: None,
        duration_s: 4000.0,
        scale: 4096.0,
        seed: 1,
        costs: CostModel::default(),
        promote_rate_limit_mbps: Some(20.0),
        phase_fraction: 0.25,
        start_in_slow_tier: false,
        pebs_blind_to_slow_loads: false,
        pebs_writes_are_stores: false,
        compute_ns_per_op: 0.0,
        huge_pages: false,
        transparent_huge_pages: true,
        bench_init: None,
        linux_scan_period: true,
        rounds: None,
        free_reserve_fraction: None,
    }
}

/// Nomad §4.3 Redis case 1 on platform A: YCSB over 6M records, RSS ~13
/// GB (2 KiB values: 11.9 GiB), every page demoted to the slow tier before
/// the run; one server thread doing dependent bucket -> value loads, each
/// request with Redis' CPU time ([`REDIS_REQUEST_CPU_NS`]).
fn kv_ycsb(mix: YcsbMix, letter: &str) -> Scenario {
    Scenario {
        threads: 1,
        start_in_slow_tier: true,
        compute_ns_per_op: REDIS_REQUEST_CPU_NS,
        ..nomad_platform_a_run(
            format!("kv-ycsb-{letter}"),
            format!("Nomad §4.3 Redis case 1: kv image, YCSB-{} over 6M records x 2 KiB (RSS ~12 GiB), all pages demoted to slow first, 1 thread with Redis' 8 us of CPU per request, platform A (16 GB fast)", letter.to_ascii_uppercase()),
            WorkloadSpec::Kv { records: 6_000_000, value_size: 2048, mix, theta: 0.99 },
        )
    }
}

/// Nomad §4.3 PageRank on platform A: GAP `-u 26 -k 20`, 16 threads, 16 GB
/// fast tier. The guest's CSR holds only the arrays the pull iteration
/// reads (6.5 GiB); GAPBS builds an edge list and both directions' CSRs
/// first and squishes copies of them, peaking at 22.75 GiB (Nomad: "RSS
/// 22 GB"). Pages start where GAPBS's build leaves them under first touch
/// ([`super::gap`]): the arrays built last (scores, contributions) reuse
/// the fast memory the builder freed, 1 GiB of the in-neighbors spills to
/// the slow tier, and the out-neighbors GAP keeps but PageRank never
/// reads hold 5 GiB of the fast tier.
fn pagerank_u() -> Scenario {
    let workload = WorkloadSpec::Pagerank {
        scale: 26,
        degree: 20,
        graph: PrGraph::Uniform,
    };
    let fast = pagerank_fast_tier_gib(&workload);
    let about = format!("Nomad §4.3 PageRank: pagerank image, GAP pull PR on a uniform graph 2^26 vertices x degree 20 ({:.1} GiB CSR), 16 threads, platform A with fast tier {fast} GiB, pages placed as GAP's build leaves them (first touch)", workload.footprint_gib());
    let mut s = nomad_platform_a_run("pagerank-u".into(), about, workload);
    s.tiers[0].capacity_gib = fast;
    s
}

/// GAPBS's peak resident size building `workload`'s graph
/// ([`super::gap::replay`]), GiB.
fn gap_peak_gib(workload: &WorkloadSpec) -> f64 {
    match *workload {
        WorkloadSpec::Pagerank { scale, degree, .. } => {
            let n = 2f64.powi(scale.min(63) as i32);
            super::gap::replay(n, n * degree as f64, 0.0).peak_rss_bytes / (1u64 << 30) as f64
        }
        _ => workload.footprint_gib(),
    }
}

/// The fast tier `pagerank-*` scenarios use for `workload`: Nomad's 16 GB
/// for Nomad's graph (`-u 26 -k 20`), in proportion to GAPBS's build peak
/// for another graph (GiB, two decimals).
pub fn pagerank_fast_tier_gib(workload: &WorkloadSpec) -> f64 {
    let nomads = WorkloadSpec::Pagerank {
        scale: 26,
        degree: 20,
        graph: PrGraph::Uniform,
    };
    (16.0 * gap_peak_gib(workload) / gap_peak_gib(&nomads) * 100.0).round() / 100.0
}

/// Platform A with a 4 GiB fast tier: the stress scenarios' machine.
fn stress(name: &str, about: &str, workload: WorkloadSpec, write_ratio: f64) -> Scenario {
    let mut s = nomad_platform_a_run(name.into(), about.into(), workload);
    s.tiers[0].capacity_gib = 4.0;
    s.write_ratio = write_ratio;
    s.duration_s = 60.0;
    s.scale = 128.0;
    s
}

/// The stress scenarios of `adaptive`'s weak points (#15): a working set
/// 2-4x the fast tier, a hot set that moves every few seconds, write-hot
/// pages.
fn stress_scenarios() -> Vec<Scenario> {
    vec![
        stress(
            "stress-uniform-3x",
            "stress: uniform accesses over 12 GiB, 3x a 4 GiB fast tier (nothing to gain from migration: thrashing bait), 16 threads, platform A",
            WorkloadSpec::Gups { size_gib: 12.0, hot_gib: 12.0, hot_prob: 1.0 },
            0.0,
        ),
        stress(
            "stress-zipf-2x",
            "stress: Zipf 0.99 reads over a WSS of 8 GiB, 2x a 4 GiB fast tier, 16 threads, platform A",
            WorkloadSpec::Zipf { rss_gib: 8.0, wss_gib: 8.0, theta: 0.99, ycsb_trace: None },
            0.0,
        ),
        stress(
            "stress-hot-4x",
            "stress: 16 GiB buffer (4x a 4 GiB fast tier) with a 3 GiB hot set at 70%, 16 threads, 30% writes, platform A",
            WorkloadSpec::Gups { size_gib: 16.0, hot_gib: 3.0, hot_prob: 0.7 },
            0.3,
        ),
        stress(
            "stress-moving-hot",
            "stress: 12 GiB buffer, a 2 GiB hot window at 90% that jumps to the next 2 GiB about every 5 s, 4 GiB fast tier, 16 threads, platform A",
            WorkloadSpec::MovingHot { size_gib: 12.0, hot_gib: 2.0, hot_prob: 0.9, move_every_s: 5.0 },
            0.0,
        ),
        Scenario {
            start_in_slow_tier: true,
            ..stress(
                "stress-write-hot",
                "stress: 8 GiB buffer with a 1 GiB write-hot set at 90% (every access writes), all pages demoted first, 4 GiB fast tier, 16 threads, platform A",
                WorkloadSpec::Gups { size_gib: 8.0, hot_gib: 1.0, hot_prob: 0.9 },
                1.0,
            )
        },
    ]
}

/// Names of the built-in scenarios.
pub fn builtin_names() -> Vec<String> {
    builtins().into_iter().map(|s| s.name).collect()
}

/// All built-in scenarios.
pub fn builtins() -> Vec<Scenario> {
    let mut v = Vec::new();
    for round in &NOMAD_ROUNDS {
        v.push(nomad(round, false));
        v.push(nomad(round, true));
    }
    for level in 0..=3 {
        v.push(colloid(level));
    }
    v.push(mtm_4tier());
    for (mix, letter) in [
        (YcsbMix::A, "a"),
        (YcsbMix::B, "b"),
        (YcsbMix::C, "c"),
        (YcsbMix::F, "f"),
    ] {
        v.push(kv_ycsb(mix, letter));
    }
    v.push(pagerank_u());
    v.extend(stress_scenarios());
    v
}

/// The built-in scenario `name`. `nomad-small` (no suffix) means read-only.
pub fn builtin(name: &str) -> Option<Scenario> {
    let name = name.trim().to_ascii_lowercase();
    let name = match name.as_str() {
        "nomad-small" | "nomad-medium" | "nomad-large" => format!("{name}-ro"),
        _ => name,
    };
    builtins().into_iter().find(|s| s.name == name)
}
