//! Access streams: the workloads the simulator replays, built on the same
//! generators the guest images use (`tiervm_guest::gen`).

use std::sync::atomic::AtomicU64;

use serde::{Deserialize, Serialize};
use tiervm_guest::gen::{Rng, Zipf};
use tiervm_guest::workloads::gups::{GupsParams, GupsPattern};
use tiervm_guest::workloads::kv::{KvOps, KvParams, KvPattern, Mix, KV_MAX_ACCESSES};
use tiervm_guest::workloads::pagerank::{
    build_single, GraphKind, PagerankParams, PagerankPattern, PrLayout,
};
use tiervm_guest::workloads::zipf::{ZipfParams, ZipfPattern};
use tiervm_guest::workloads::Access;
use tiervm_guest::workloads::PAGE_SIZE;

use super::ScenarioError;

/// One access: a page (in the modeled, scaled page space) and whether it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageAccess {
    /// Page index.
    pub page: u64,
    /// Store (or read-modify-write).
    pub write: bool,
}

/// A source of accesses.
pub trait AccessStream {
    /// The next access.
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess;
}

/// What a workload looks like (all sizes in real GiB; the simulator scales).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WorkloadSpec {
    /// Nomad's micro-benchmark: Zipfian (YCSB, scrambled so hot data is
    /// spread along the WSS) reads or writes over a WSS at the end of an RSS
    /// whose first `rss - wss` GiB are never touched.
    Zipf {
        /// Resident set (GiB).
        rss_gib: f64,
        /// Working set (GiB), the last part of the RSS.
        wss_gib: f64,
        /// Zipf skew.
        theta: f64,
        /// Nomad's traces: the WSS's pages in the artifact's order and with
        /// YCSB's key distribution ([`YcsbTrace`]). `None`: the guest
        /// image's scrambled Zipf, hot pages spread along the WSS.
        #[serde(default)]
        ycsb_trace: Option<YcsbTrace>,
    },
    /// Colloid's GUPS: `hot_prob` of accesses to a random hot set of
    /// `hot_gib`, the rest uniform over `size_gib`. Every access is a read
    /// plus an update unless `write_ratio` says otherwise.
    Gups {
        /// Buffer (GiB).
        size_gib: f64,
        /// Hot set (GiB).
        hot_gib: f64,
        /// Probability of a hot-set access.
        hot_prob: f64,
    },
    /// MTM's motivation workload: `hot_prob` of accesses to a hot set of
    /// `hot_fraction` of the buffer with Gaussian hotness (sd = a quarter of
    /// the hot set) centred in it, the rest uniform.
    GaussianHot {
        /// Buffer (GiB).
        size_gib: f64,
        /// Hot fraction of the buffer.
        hot_fraction: f64,
        /// Probability of a hot-set access.
        hot_prob: f64,
    },
    /// A hot set that moves: `hot_prob` of accesses go uniformly to a window
    /// of `hot_gib` that jumps to the next `hot_gib` of the buffer every
    /// `move_every_s` (counted in accesses at the rate the run starts with,
    /// so "every few seconds" of modeled time), the rest uniform.
    MovingHot {
        /// Buffer (GiB).
        size_gib: f64,
        /// Hot window (GiB).
        hot_gib: f64,
        /// Probability of a hot-window access.
        hot_prob: f64,
        /// Modeled seconds between moves (approximate).
        move_every_s: f64,
    },
    /// The `kv` guest image (`tiervm_guest::workloads::kv`): a hash table
    /// plus value slab under a YCSB mix with scrambled Zipfian keys. The
    /// simulator runs it with `records / scale` records (same value size),
    /// so the modeled page space is the scaled-down store's own layout.
    Kv {
        /// Records (real).
        records: u64,
        /// Bytes per value (rounded up to 64 like the guest).
        value_size: u64,
        /// YCSB mix.
        mix: YcsbMix,
        /// Zipf skew of the key choice.
        theta: f64,
    },
    /// The `pagerank` guest image (`tiervm_guest::workloads::pagerank`):
    /// GAP pull PageRank over `2^scale` vertices of average in-degree
    /// `degree`. The simulator runs it on `2^(scale - log2(sim scale))`
    /// vertices (same degree), so the modeled page space is the smaller
    /// graph's own CSR layout.
    Pagerank {
        /// log2 of the vertex count (real).
        scale: u32,
        /// Average degree.
        degree: u64,
        /// Graph generator.
        graph: PrGraph,
    },
}

/// YCSB core workload mix of the `kv` workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum YcsbMix {
    /// 50% read, 50% update.
    A,
    /// 95% read, 5% update.
    B,
    /// Read only.
    C,
    /// 50% read, 50% read-modify-write.
    F,
}

impl YcsbMix {
    /// Parses `a`, `b`, `c` or `f` (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "a" => Some(Self::A),
            "b" => Some(Self::B),
            "c" => Some(Self::C),
            "f" => Some(Self::F),
            _ => None,
        }
    }

    fn guest(self) -> Mix {
        match self {
            Self::A => Mix::A,
            Self::B => Mix::B,
            Self::C => Mix::C,
            Self::F => Mix::F,
        }
    }
}

/// Graph generator of the `pagerank` workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrGraph {
    /// Uniform random endpoints (GAP `-u`).
    Uniform,
    /// R-MAT / Kronecker (GAP `-g`).
    Rmat,
}

impl PrGraph {
    /// Parses `uniform` or `rmat` (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "uniform" | "u" => Some(Self::Uniform),
            "rmat" | "g" | "kron" => Some(Self::Rmat),
            _ => None,
        }
    }
}

impl WorkloadSpec {
    /// Footprint in GiB.
    pub fn footprint_gib(&self) -> f64 {
        match self {
            Self::Zipf { rss_gib, .. } => *rss_gib,
            Self::Gups { size_gib, .. }
            | Self::GaussianHot { size_gib, .. }
            | Self::MovingHot { size_gib, .. } => *size_gib,
            Self::Kv {
                records,
                value_size,
                ..
            } => {
                kv_params(*records, *value_size, YcsbMix::A, 0.99)
                    .layout()
                    .bytes as f64
                    / GIB
            }
            Self::Pagerank { scale, degree, .. } => {
                let v = 2f64.powi((*scale).min(63) as i32);
                // PrLayout::new without overflow for any real size.
                (v * (8.0 + 8.0 + 4.0 + 4.0) + v * *degree as f64 * 4.0) / GIB
            }
        }
    }

    /// The real pages per modeled page the simulator uses for `scale`:
    /// pagerank divides the vertex count by a power of two, so its scale
    /// is `scale` rounded to one; every other workload uses `scale`.
    pub fn effective_scale(&self, scale: f64) -> f64 {
        match self {
            Self::Pagerank { scale: log_v, .. } => {
                let shift = scale
                    .max(1.0)
                    .log2()
                    .round()
                    .clamp(0.0, f64::from(*log_v) - 1.0);
                2f64.powi(shift as i32)
            }
            _ => scale,
        }
    }

    /// The guest parameters the simulator runs at `scale` real pages per
    /// modeled page (kv and pagerank only).
    pub fn kv_params_at(&self, scale: f64) -> Option<KvParams> {
        match *self {
            Self::Kv {
                records,
                value_size,
                mix,
                theta,
            } => Some(kv_params(
                ((records as f64 / scale.max(1.0)).round() as u64).max(1),
                value_size,
                mix,
                theta,
            )),
            _ => None,
        }
    }

    /// The pagerank parameters at `scale` real pages per modeled page: the
    /// vertex count divided by `scale` rounded to a power of two.
    pub fn pagerank_params_at(&self, scale: f64) -> Option<PagerankParams> {
        match *self {
            Self::Pagerank {
                scale: log_v,
                degree,
                graph,
            } => {
                let shift = self.effective_scale(scale).log2().round() as i64;
                Some(PagerankParams {
                    graph: match graph {
                        PrGraph::Uniform => GraphKind::Uniform,
                        PrGraph::Rmat => GraphKind::Rmat,
                    },
                    scale: (i64::from(log_v) - shift).clamp(1, 31) as u32,
                    degree: degree.clamp(1, 1024),
                    iterations: 0,
                })
            }
            _ => None,
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;

fn kv_params(records: u64, value_size: u64, mix: YcsbMix, theta: f64) -> KvParams {
    use tiervm_guest::workloads::kv::{MAX_RECORDS, MAX_VALUE_SIZE, MIN_VALUE_SIZE};
    KvParams {
        records: records.clamp(1, MAX_RECORDS),
        value_size: value_size
            .clamp(MIN_VALUE_SIZE, MAX_VALUE_SIZE)
            .div_ceil(64)
            * 64,
        mix: mix.guest(),
        theta: theta.clamp(0.0, 0.9999),
    }
}

/// Table-driven evaluation of `tiervm_guest::gen::Zipf`'s inverse transform.
///
/// `Zipf::next_rank` maps a uniform draw `u` to a rank with Gray's formula,
/// one `pow` per draw. The rank is a step function of `u`, so this
/// precomputes the `u` at which each rank starts (with the same parameters
/// and the guest's own `zeta`) and a guide table over `u`: the same `u`
/// gives the same rank (up to floating-point rounding at a step), in a few
/// nanoseconds. Items come from the guest's `item_of_rank` (the YCSB
/// scrambling), tabulated.
#[derive(Clone, Debug)]
pub struct TableZipf {
    /// `u` at which rank `k` starts (`starts[0] = 0`).
    starts: Vec<f64>,
    /// First rank for each of `guide.len()` equal slices of `[0, 1)`.
    guide: Vec<u32>,
    /// Item of each rank.
    items: Vec<u32>,
}

impl TableZipf {
    /// Items in `0..n` (`n <= 2^32 - 1`), skew `theta`, scrambled like the guest's.
    pub fn new(n: u64, theta: f64, scrambled: bool) -> Self {
        Self::from_zipf(&Zipf::new(
            n.clamp(1, u64::from(u32::MAX)),
            theta,
            scrambled,
        ))
    }

    /// The table for the guest generator `z` (at most 2^32 - 1 items).
    pub fn from_zipf(z: &Zipf) -> Self {
        let n = z.items().min(u64::from(u32::MAX));
        let theta = z.theta();
        let zetan = tiervm_guest::gen::zipf::zeta(n, theta);
        let zeta2 = tiervm_guest::gen::zipf::zeta(2.min(n), theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = if n > 1 {
            (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan)
        } else {
            0.0
        };
        let half_pow_theta = 1.0 + 0.5f64.powf(theta);
        // Rank 0 for u * zetan < 1, rank 1 below half_pow_theta, then Gray:
        // rank = floor(n * (eta*u - eta + 1)^alpha) >= k  <=>  u >= u_k.
        let mut starts = vec![0.0; n as usize];
        for k in 1..n as usize {
            let gray = if eta > 0.0 {
                (((k as f64) / n as f64).powf(1.0 / alpha) - 1.0 + eta) / eta
            } else {
                1.0
            };
            starts[k] = match k {
                1 => 1.0 / zetan,
                2 => (half_pow_theta / zetan).max(gray),
                _ => gray,
            }
            .clamp(starts[k - 1], 1.0);
        }
        let guide_len = (4 * n as usize).clamp(1024, 1 << 24);
        let mut guide = vec![0u32; guide_len];
        let mut r = 0usize;
        for (i, g) in guide.iter_mut().enumerate() {
            let u = i as f64 / guide_len as f64;
            while r + 1 < starts.len() && starts[r + 1] <= u {
                r += 1;
            }
            *g = r as u32;
        }
        let items = (0..n).map(|k| z.item_of_rank(k) as u32).collect();
        Self {
            starts,
            guide,
            items,
        }
    }

    /// The rank for uniform draw `u` in `[0, 1)`.
    #[inline]
    pub fn rank_of(&self, u: f64) -> u64 {
        let g = ((u * self.guide.len() as f64) as usize).min(self.guide.len() - 1);
        let mut r = self.guide[g] as usize;
        while r + 1 < self.starts.len() && self.starts[r + 1] <= u {
            r += 1;
        }
        r as u64
    }

    /// The next item.
    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        u64::from(self.items[self.rank_of(rng.next_f64()) as usize])
    }
}

/// Nomad's Zipf stream: `tiervm_guest::workloads::zipf::ZipfPattern` over
/// the modeled page space, with the guest's draw order (rank, slot within
/// the page, write) so the same seed gives the guest's page sequence; the
/// rank comes from [`TableZipf`].
#[derive(Clone, Debug)]
pub struct ZipfStream {
    zipf: TableZipf,
    first: u64,
    slots_per_page: u64,
    write_ratio: f64,
}

impl ZipfStream {
    /// From the guest workload's parameters (`rss`, `wss` in modeled bytes).
    pub fn from_params(p: &ZipfParams) -> Self {
        let pattern = ZipfPattern::new(p);
        Self {
            zipf: TableZipf::from_zipf(pattern.zipf()),
            first: (p.rss - p.wss) / PAGE_SIZE,
            slots_per_page: PAGE_SIZE / p.stride.max(1),
            write_ratio: p.write_ratio,
        }
    }

    /// Scrambled Zipf over `n` pages starting at `first`.
    pub fn new(first: u64, n: u64, theta: f64, write_ratio: f64) -> Self {
        Self::from_params(&ZipfParams {
            rss: (first + n.max(1)) * PAGE_SIZE,
            wss: n.max(1) * PAGE_SIZE,
            theta,
            write_ratio: write_ratio.clamp(0.0, 1.0),
            stride: 64,
            scrambled: true,
        })
    }
}

impl AccessStream for ZipfStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let page = self.first + self.zipf.next(rng);
        let _slot = rng.below(self.slots_per_page); // keeps the guest's draw order
        let write = self.write_ratio > 0.0 && rng.chance(self.write_ratio);
        PageAccess { page, write }
    }
}

/// Items YCSB 0.17's `ScrambledZipfianGenerator` draws a Zipfian rank
/// over before it folds the rank onto the records with an FNV hash
/// (`ITEM_COUNT`; its `ZETAN`, 26.46902820178302, is `zeta(ITEM_COUNT,
/// 0.99)`). `CoreWorkload` uses it for `requestdistribution=zipfian`.
pub const YCSB_ITEM_COUNT: u64 = 10_000_000_000;

/// Above this many expected accesses per round a record's count is taken
/// as its expectation (the Poisson spread, under 15%, does not change its
/// place in the order); below, the counts' distribution is summed.
const TRACE_EXACT_COUNT: f64 = 50.0;

/// Head ranks given a run each; beyond, ranks share 1%-wide bins.
const TRACE_EXACT_RANKS: u64 = 1 << 16;

/// Largest per-record count the summed distribution tracks (Poisson(50)
/// puts under 1e-12 above it).
const TRACE_MAX_COUNT: usize = 160;

/// Nomad's micro-benchmark traces (artifact github.com/lingfenghsiang/Nomad
/// at 0fafe0e, `src/testing_scripts/microbenchmark/`):
/// 1. `generate_ycsb.sh` runs YCSB 0.17 `workloada-10G` / `-13.5G` /
///    `-27G` (`requestdistribution=zipfian`, read-only) and keeps each
///    operation's key (`filter_access_pattern.py`). YCSB's scrambled
///    Zipfian draws a Zipf(0.99) rank over [`YCSB_ITEM_COUNT`] items and
///    hashes it onto the `recordcount` records, so the ranks beyond the
///    record count (a third of the draws) land uniformly on every record;
/// 2. `write_binary_data.py -p 0` ("hottest", the traces `nomad_run.sh`,
///    `tpp_run.sh` and the Memtis scripts replay, and the README's Figure
///    7 and 8 logs) gives each distinct key one 4 KiB page, sorted by its
///    count in that trace, the hottest first: the WSS is the keys touched
///    (9.9 / 13.5 / 27.2 GiB for the three cases) and its hottest pages
///    sit at its start, where first touch puts them in fast memory;
/// 3. every measured round replays that trace.
///
/// The papers' text calls the hot data "uniformly distributed along the
/// WSS" (Nomad §4.1); the artifact's traces order it, and this follows
/// the artifact. Modeled: a record's count is Poisson around its
/// expectation (its own rank's share plus the folded ranks' uniform
/// share; collisions of two head ranks on one record are ignored), the
/// records are sorted by those counts, and each modeled page gets the
/// accesses of the real pages it stands for; rounds draw from those
/// shares rather than replaying one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct YcsbTrace {
    /// YCSB `recordcount`.
    pub records: u64,
    /// YCSB `operationcount`: the accesses of one round.
    pub operations: u64,
    /// Pages sorted hottest first, as the artifact's traces are (`true`),
    /// or in a random order: the papers' "hot data uniformly distributed
    /// along the WSS" (`tiervm sim --spread-hot-pages`).
    #[serde(default = "hottest_first_default")]
    pub hottest_first: bool,
}

/// [`YcsbTrace::hottest_first`]' default: the artifact's order.
fn hottest_first_default() -> bool {
    true
}

impl YcsbTrace {
    /// The records the trace touches, hottest first, as runs of `(records,
    /// accesses per record)`; their lengths sum to the pages of the WSS.
    fn sorted_counts(&self, theta: f64) -> Vec<(f64, f64)> {
        // The guest generator's range of skews.
        let theta = Zipf::new(1, theta, false).theta();
        let n = self.records.max(1);
        let ops = self.operations as f64;
        let z_all = tiervm_guest::gen::zipf::zeta(YCSB_ITEM_COUNT, theta);
        let z_n = tiervm_guest::gen::zipf::zeta(n, theta);
        // Accesses each record gets from the ranks folded onto it.
        let folded = ops * ((z_all - z_n) / z_all).max(0.0) / n as f64;
        let expected = |rank: f64| ops * rank.powf(-theta) / z_all + folded;
        let mut runs = Vec::new();
        let mut records_with = [0.0f64; TRACE_MAX_COUNT + 1];
        let mut rank = 1u64;
        while rank <= n {
            // Head ranks (expectation above the cut) are runs of their
            // own, one rank each up to `TRACE_EXACT_RANKS`; every other
            // bin is 1% of ranks wide (bounded work for any record count).
            let head = expected(rank as f64) > TRACE_EXACT_COUNT;
            let width = if head && rank < TRACE_EXACT_RANKS {
                0
            } else {
                rank / 100
            };
            let last = rank.saturating_add(width).min(n);
            let records = (last - rank + 1) as f64;
            let mean = expected(rank as f64 / 2.0 + last as f64 / 2.0);
            if head {
                runs.push((records, mean));
            } else {
                // Sum each count's Poisson probability over the bin.
                let mut p = (-mean).exp();
                for (c, r) in records_with.iter_mut().enumerate().skip(1) {
                    p *= mean / c as f64;
                    *r += records * p;
                }
            }
            match last.checked_add(1) {
                Some(next) => rank = next,
                None => break,
            }
        }
        runs.extend(
            records_with
                .iter()
                .enumerate()
                .skip(1)
                .rev()
                .filter(|(_, &r)| r > 0.0)
                .map(|(c, &r)| (r, c as f64)),
        );
        // A record below the cut can draw more than one above it.
        runs.sort_by(|a, b| b.1.total_cmp(&a.1));
        runs
    }

    /// Real pages the trace touches (its WSS).
    pub fn touched_pages(&self, theta: f64) -> f64 {
        self.sorted_counts(theta).iter().map(|(r, _)| r).sum()
    }

    /// Each of `pages` modeled pages' share of a round's accesses in the
    /// trace's order: hottest first, modeled page `j` standing for the
    /// `j`-th `1/pages` of the touched records, or those shares shuffled
    /// (with a fixed seed) unless [`Self::hottest_first`].
    pub fn page_shares(&self, theta: f64, pages: u64) -> Vec<f64> {
        let pages = pages.max(1);
        let runs = self.sorted_counts(theta);
        let touched: f64 = runs.iter().map(|(r, _)| r).sum();
        let total: f64 = runs.iter().map(|(r, c)| r * c).sum();
        let mut shares = vec![0.0; pages as usize];
        if touched <= 0.0 || total <= 0.0 {
            shares.fill(1.0 / pages as f64);
            return shares;
        }
        let per_page = touched / pages as f64;
        let (mut page, mut room) = (0usize, per_page);
        for &(mut left, count) in &runs {
            while left > 0.0 && page < shares.len() {
                let take = left.min(room);
                shares[page] += take * count / total;
                left -= take;
                room -= take;
                if room <= per_page * 1e-12 {
                    page += 1;
                    room = per_page;
                }
            }
        }
        if !self.hottest_first {
            // Fisher-Yates.
            let mut rng = Rng::new(0x5EED_5A1E);
            for i in (1..shares.len()).rev() {
                shares.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        shares
    }
}

/// Accesses to `n` pages from `first` with fixed shares ([`YcsbTrace`]'s):
/// a uniform draw is looked up in the shares' running sum.
#[derive(Clone, Debug)]
pub struct TraceStream {
    cumulative: Vec<f64>,
    first: u64,
    write_ratio: f64,
}

impl TraceStream {
    /// Nomad's trace `trace` over `n` modeled pages from `first`.
    pub fn new(first: u64, n: u64, trace: &YcsbTrace, theta: f64, write_ratio: f64) -> Self {
        let mut sum = 0.0;
        let mut cumulative: Vec<f64> = trace
            .page_shares(theta, n)
            .iter()
            .map(|s| {
                sum += s;
                sum
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = f64::INFINITY;
        }
        Self {
            cumulative,
            first,
            write_ratio: write_ratio.clamp(0.0, 1.0),
        }
    }
}

impl AccessStream for TraceStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let u = rng.next_f64();
        let i = self.cumulative.partition_point(|&c| c <= u);
        let write = self.write_ratio > 0.0 && rng.chance(self.write_ratio);
        PageAccess {
            page: self.first + i.min(self.cumulative.len().saturating_sub(1)) as u64,
            write,
        }
    }
}

/// The stream over a Zipf scenario's WSS: the guest image's scrambled Zipf
/// or Nomad's trace.
#[derive(Clone, Debug)]
pub enum WssStream {
    /// [`ZipfStream`].
    Scrambled(ZipfStream),
    /// [`TraceStream`].
    Trace(TraceStream),
}

impl WssStream {
    /// The stream of a Zipf workload over `n` modeled pages from `first`.
    pub fn new(
        first: u64,
        n: u64,
        theta: f64,
        trace: Option<&YcsbTrace>,
        write_ratio: f64,
    ) -> Self {
        match trace {
            Some(t) => Self::Trace(TraceStream::new(first, n.max(1), t, theta, write_ratio)),
            None => Self::Scrambled(ZipfStream::new(first, n, theta, write_ratio)),
        }
    }
}

impl AccessStream for WssStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        match self {
            Self::Scrambled(s) => s.next_access(rng),
            Self::Trace(s) => s.next_access(rng),
        }
    }
}

/// Nomad's micro-benchmark before its measured rounds
/// ([`super::scenario::BenchInit`]): first the `memset`, every line of
/// every page once in address order, then the warm-up round's `memcpy`s,
/// over the warm-up trace's pages, every access a write.
#[derive(Clone, Debug)]
pub struct BenchInitStream {
    next_line: u64,
    memset_lines: u64,
    lines_per_page: u64,
    warmup: WssStream,
}

impl BenchInitStream {
    /// The memset of `pages` pages of `lines_per_page` lines each, then
    /// `warmup` (whose own write flag is ignored: every access writes).
    pub fn new(pages: u64, lines_per_page: u64, warmup: WssStream) -> Self {
        let lines_per_page = lines_per_page.max(1);
        Self {
            next_line: 0,
            memset_lines: pages * lines_per_page,
            lines_per_page,
            warmup,
        }
    }

    /// Whether the memset is over (the warm-up round has begun).
    pub fn memset_done(&self) -> bool {
        self.next_line >= self.memset_lines
    }
}

impl AccessStream for BenchInitStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        if self.next_line < self.memset_lines {
            let page = self.next_line / self.lines_per_page;
            self.next_line += 1;
            return PageAccess { page, write: true };
        }
        PageAccess {
            write: true,
            ..self.warmup.next_access(rng)
        }
    }
}

/// GUPS: `tiervm_guest::workloads::gups::GupsPattern` over `n` modeled
/// pages (its hot set, its draws). The guest always writes (read+update);
/// a `write_ratio` below 1 draws the write flag afterwards.
#[derive(Clone, Debug)]
pub struct GupsStream {
    pattern: GupsPattern,
    write_ratio: f64,
}

impl GupsStream {
    /// GUPS with `hot` hot pages out of `n`, hot set chosen by `seed`.
    pub fn new(n: u64, hot: u64, hot_prob: f64, write_ratio: f64, seed: u64) -> Self {
        let n = n.max(1);
        let params = GupsParams {
            size: n * PAGE_SIZE,
            hot_size: hot.clamp(1, n) * PAGE_SIZE,
            hot_prob: hot_prob.clamp(0.0, 1.0),
            object: 64,
        };
        Self {
            pattern: GupsPattern::new(&params, seed),
            write_ratio,
        }
    }

    /// The hot pages.
    pub fn hot_pages(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.pattern.hot_pages()).map(|i| self.pattern.hot_page(i))
    }
}

impl AccessStream for GupsStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let a = self.pattern.next_access(rng);
        let write =
            self.write_ratio >= 1.0 || (self.write_ratio > 0.0 && rng.chance(self.write_ratio));
        PageAccess {
            page: a.addr / PAGE_SIZE,
            write,
        }
    }
}

/// A hot window that moves every `period` accesses ([`WorkloadSpec::MovingHot`]).
#[derive(Clone, Debug)]
pub struct MovingHotStream {
    n: u64,
    hot: u64,
    hot_prob: f64,
    write_ratio: f64,
    period: u64,
    served: u64,
    offset: u64,
}

impl MovingHotStream {
    /// `hot` of `n` pages hot, the window moving every `period` accesses.
    pub fn new(n: u64, hot: u64, hot_prob: f64, write_ratio: f64, period: u64) -> Self {
        let n = n.max(1);
        Self {
            n,
            hot: hot.clamp(1, n),
            hot_prob: hot_prob.clamp(0.0, 1.0),
            write_ratio,
            period: period.max(1),
            served: 0,
            offset: 0,
        }
    }

    /// First page of the current hot window.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl AccessStream for MovingHotStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        self.served += 1;
        if self.served.is_multiple_of(self.period) {
            self.offset = (self.offset + self.hot) % self.n;
        }
        let page = if rng.chance(self.hot_prob) {
            (self.offset + rng.below(self.hot)) % self.n
        } else {
            rng.below(self.n)
        };
        let write =
            self.write_ratio >= 1.0 || (self.write_ratio > 0.0 && rng.chance(self.write_ratio));
        PageAccess { page, write }
    }
}

/// The `kv` workload: `tiervm_guest::workloads::kv::KvPattern`'s accesses
/// (home bucket, value pages, bucket write-back on updates) with the
/// guest's draw order (key, then the mix's coin), the key rank taken from
/// [`TableZipf`] instead of one `pow` per operation. Pages are the guest
/// layout's byte offsets / 4 KiB.
#[derive(Clone, Debug)]
pub struct KvStream {
    pattern: KvPattern,
    zipf: TableZipf,
    mix: Mix,
    buf: Vec<u64>,
    pos: usize,
}

/// Bit marking a write in a packed access (`page << 1 | write`).
const WRITE_BIT: u64 = 1;

impl KvStream {
    /// The stream for guest parameters `p`.
    pub fn new(p: &KvParams) -> Self {
        let ops = KvOps::new(p);
        Self {
            pattern: KvPattern::new(p),
            zipf: TableZipf::from_zipf(ops.zipf()),
            mix: p.mix,
            buf: Vec::with_capacity(KV_MAX_ACCESSES),
            pos: 0,
        }
    }

    /// Modeled pages: the layout's size.
    pub fn pages(&self) -> u64 {
        (self.pattern.layout().bytes / PAGE_SIZE).max(1)
    }

    /// The fraction of accesses that write (for the bandwidth model) and
    /// the accesses per operation (to spread a request's CPU time over its
    /// accesses), estimated over `ops` operations of a private generator.
    pub fn op_shape(&self, ops: u32) -> (f64, f64) {
        let mut rng = Rng::new(0x5EED);
        let mut out = [tiervm_guest::workloads::Access {
            addr: 0,
            write: false,
        }; KV_MAX_ACCESSES];
        let (mut all, mut writes) = (0usize, 0usize);
        for _ in 0..ops {
            let n = self.pattern.next_op(&mut rng, &mut out);
            all += n;
            writes += out[..n].iter().filter(|a| a.write).count();
        }
        (
            writes as f64 / all.max(1) as f64,
            all as f64 / f64::from(ops.max(1)),
        )
    }

    fn refill(&mut self, rng: &mut Rng) {
        // KvOps::next: the key, then the mix's coin.
        let key = self.zipf.next(rng);
        let (read, write) = match self.mix {
            Mix::A if rng.chance(0.5) => (false, true),
            Mix::B if rng.chance(0.05) => (false, true),
            Mix::F if rng.chance(0.5) => (true, true),
            _ => (true, false),
        };
        // KvPattern::next_op: bucket, value read pass, value write pass,
        // bucket write.
        let l = self.pattern.layout();
        let bucket = l.home_bucket_offset(key) / PAGE_SIZE;
        let first = l.value_offset(key) / PAGE_SIZE;
        let last = (l.value_offset(key) + l.value_size - 1) / PAGE_SIZE;
        self.buf.clear();
        self.buf.push(bucket << 1);
        if read {
            self.buf.extend((first..=last).map(|p| p << 1));
        }
        if write {
            self.buf.extend((first..=last).map(|p| p << 1 | WRITE_BIT));
            self.buf.push(bucket << 1 | WRITE_BIT);
        }
        self.pos = 0;
    }
}

impl AccessStream for KvStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        if self.pos >= self.buf.len() {
            self.refill(rng);
        }
        let a = self.buf[self.pos];
        self.pos += 1;
        PageAccess {
            page: a >> 1,
            write: a & WRITE_BIT != 0,
        }
    }
}

/// Most accesses per iteration [`PagerankStream`] precomputes (1 GiB of
/// packed accesses); larger graphs need a larger simulator scale.
pub const PAGERANK_MAX_TRACE: u64 = 1 << 28;

/// Bytes of a cache line: the unit the memory serves.
pub const CACHE_LINE: u64 = 64;

/// The `pagerank` workload: one iteration of
/// `tiervm_guest::workloads::pagerank::PagerankPattern` over a graph built
/// with the guest's `build_single` (same generator and seed), precomputed
/// once as packed pages (`page << 1 | write`, 4 bytes each) and replayed
/// iteration after iteration. The pattern draws nothing from the run's
/// random stream: PageRank's accesses depend only on the graph.
///
/// The guest's pattern names every 4- or 8-byte element it touches, but
/// memory serves 64-byte lines: an element in the line the same array
/// touched last is in the cache, so the trace keeps one access per line
/// of such a run ([`line_accesses`]). The in-neighbors (16 ids a line)
/// and the per-vertex arrays then cost a line each per 16 (or 8)
/// elements, while every contribution gather, at a random vertex, stays
/// an access of its own.
#[derive(Clone, Debug)]
pub struct PagerankStream {
    trace: Vec<u32>,
    pos: usize,
    pages: u64,
    layout: PrLayout,
}

/// The accesses of `pattern` that reach memory, as packed pages
/// (`page << 1 | write`):
/// 1. each access is assigned to its array of `l` (offsets, out-degrees,
///    neighbors, scores, contributions);
/// 2. an access to the same 64-byte line as the previous access to that
///    array hits the cache and is dropped; if it writes, the access that
///    brought the line in is marked as writing (the line is written back);
/// 3. any other access is kept and becomes its array's last line.
pub fn line_accesses(l: &PrLayout, pattern: impl Iterator<Item = Access>) -> Vec<u32> {
    let bounds = [
        l.out_degree_off,
        l.neighbors_off,
        l.scores_off,
        l.contrib_off,
    ];
    let mut last: [Option<(u64, usize)>; 5] = [None; 5];
    let mut trace = Vec::new();
    for a in pattern {
        let array = bounds.iter().take_while(|&&b| a.addr >= b).count();
        let line = a.addr / CACHE_LINE;
        let packed = ((a.addr / PAGE_SIZE) << 1 | u64::from(a.write)) as u32;
        match last[array] {
            Some((l, at)) if l == line => {
                if a.write {
                    if let Some(t) = trace.get_mut(at) {
                        *t |= 1;
                    }
                }
            }
            _ => {
                last[array] = Some((line, trace.len()));
                trace.push(packed);
            }
        }
    }
    trace
}

impl PagerankStream {
    /// Builds the graph of `p` for `seed` and records one iteration.
    pub fn new(p: &PagerankParams, seed: u64) -> Result<Self, ScenarioError> {
        let layout = p.layout();
        let pages = layout.bytes.div_ceil(PAGE_SIZE).max(1);
        let per_iteration = 7 * layout.vertices + 2 * layout.edges;
        if per_iteration > PAGERANK_MAX_TRACE || pages >= 1 << 31 {
            return Err(ScenarioError::PagerankTooLarge {
                scale: p.scale,
                degree: p.degree,
                accesses: per_iteration,
            });
        }
        let data: Vec<AtomicU64> = (0..layout.bytes / 8).map(|_| AtomicU64::new(0)).collect();
        if !build_single(p, seed, &data) {
            return Err(ScenarioError::PagerankBuild);
        }
        let pattern = PagerankPattern::new(p, &data).ok_or(ScenarioError::PagerankLayout)?;
        let mut trace = line_accesses(&layout, pattern);
        if trace.is_empty() {
            trace.push(0);
        }
        Ok(Self {
            trace,
            pos: 0,
            pages,
            layout,
        })
    }

    /// Where the arrays live (bytes; a page is `PAGE_SIZE` of them).
    pub fn layout(&self) -> PrLayout {
        self.layout
    }

    /// Modeled pages: the layout's size.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Accesses per iteration.
    pub fn accesses_per_iteration(&self) -> usize {
        self.trace.len()
    }

    /// Fraction of an iteration's accesses that write.
    pub fn write_fraction(&self) -> f64 {
        self.trace.iter().filter(|&&a| a & 1 != 0).count() as f64 / self.trace.len() as f64
    }
}

impl AccessStream for PagerankStream {
    #[inline]
    fn next_access(&mut self, _rng: &mut Rng) -> PageAccess {
        if self.pos >= self.trace.len() {
            self.pos = 0;
        }
        let a = self.trace[self.pos];
        self.pos += 1;
        PageAccess {
            page: u64::from(a >> 1),
            write: a & 1 != 0,
        }
    }
}

/// Gaussian-hot stream over `n` pages.
#[derive(Clone, Debug)]
pub struct GaussianHotStream {
    n: u64,
    hot_prob: f64,
    write_ratio: f64,
    /// Pages at 2^16 equally likely quantiles of the hot-set Gaussian.
    quantile_pages: Vec<u64>,
}

/// Standard normal quantile (Acklam's rational approximation, |rel err| < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383_577_518_672_69e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

impl GaussianHotStream {
    /// Hot set of `hot` pages centred in `0..n`.
    pub fn new(n: u64, hot: u64, hot_prob: f64, write_ratio: f64) -> Self {
        let n = n.max(1);
        let hot = hot.clamp(1, n) as f64;
        let centre = n as f64 / 2.0;
        let quantile_pages = (0..1u32 << 16)
            .map(|i| {
                let z = normal_quantile((f64::from(i) + 0.5) / f64::from(1u32 << 16));
                ((centre + z * hot / 4.0).max(0.0) as u64).min(n - 1)
            })
            .collect();
        Self {
            n,
            hot_prob,
            write_ratio,
            quantile_pages,
        }
    }
}

impl AccessStream for GaussianHotStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let page = if rng.chance(self.hot_prob) {
            self.quantile_pages[(rng.next_u64() >> 48) as usize]
        } else {
            rng.below(self.n)
        };
        let write =
            self.write_ratio >= 1.0 || (self.write_ratio > 0.0 && rng.chance(self.write_ratio));
        PageAccess { page, write }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_zipf_matches_the_guest_generator() {
        for (n, theta) in [(1000u64, 0.99), (50_000, 0.99), (7, 0.5), (1, 0.99)] {
            let guest = Zipf::new(n, theta, true);
            let table = TableZipf::new(n, theta, true);
            let (mut a, mut b) = (Rng::new(5), Rng::new(5));
            let draws = 200_000;
            let same = (0..draws)
                .filter(|_| guest.next(&mut a) == table.next(&mut b))
                .count();
            // Identical up to rounding exactly at a rank boundary.
            assert!(
                same as f64 >= draws as f64 * 0.9999,
                "n {n}: {same} of {draws}"
            );
        }
    }

    #[test]
    fn the_zeta_of_ycsbs_items_is_ycsbs_constant() {
        // YCSB's ScrambledZipfianGenerator.ZETAN for ITEM_COUNT at 0.99.
        let z = tiervm_guest::gen::zipf::zeta(YCSB_ITEM_COUNT, 0.99);
        assert!((z - 26.469_028_201_783_02).abs() < 1e-6, "{z}");
    }

    fn nomad_trace(round: &super::super::scenario::NomadRound) -> YcsbTrace {
        YcsbTrace {
            records: round.records,
            operations: round.copies as u64,
            hottest_first: true,
        }
    }

    #[test]
    fn nomads_traces_touch_the_papers_working_sets() {
        // The keys a trace touches are its WSS: 10 / 13.5 / 27 GB (Nomad
        // §4.1). A Zipf(0.99) over the records alone, without YCSB's fold
        // of 10^10 ranks, would leave a third to a half of them untouched.
        for round in &super::super::scenario::NOMAD_ROUNDS {
            let gib = nomad_trace(round).touched_pages(0.99) * 4096.0 / GIB;
            assert!(
                (gib / round.wss_gib - 1.0).abs() < 0.03,
                "{}: {gib:.2} GiB touched, WSS {} GiB",
                round.size,
                round.wss_gib
            );
        }
    }

    #[test]
    fn trace_shares_are_hottest_first_with_ycsbs_skew() {
        let medium = nomad_trace(&super::super::scenario::NOMAD_ROUNDS[1]);
        let pages = 4096;
        let shares = medium.page_shares(0.99, pages);
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(shares.windows(2).all(|w| w[0] >= w[1] - 1e-15));
        // Medium's first 2.5 of 13.5 GB start in fast memory: 66% of the
        // accesses (a Zipf(0.99) over the pages would put 88% there).
        let head = (pages as f64 * 2.5 / 13.5) as usize;
        let fast: f64 = shares[..head].iter().sum();
        assert!((0.62..0.70).contains(&fast), "{fast}");
        // The papers' order: the same shares, spread.
        let spread = YcsbTrace {
            hottest_first: false,
            ..medium
        }
        .page_shares(0.99, pages);
        let descending = spread.windows(2).filter(|w| w[0] >= w[1]).count();
        assert!(descending < spread.len() * 6 / 10, "{descending}");
        let mut sorted = spread.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(sorted, shares);
    }

    #[test]
    fn any_trace_parameters_give_shares_quickly() {
        for (records, operations, theta) in [
            (u64::MAX, u64::MAX, 0.99),
            (1, 0, 0.99),
            (0, 1, f64::NAN),
            (1 << 40, 1 << 50, -3.0),
            (1000, 1 << 40, 7.0),
        ] {
            let t = YcsbTrace {
                records,
                operations,
                hottest_first: true,
            };
            let shares = t.page_shares(theta, 100);
            assert_eq!(shares.len(), 100);
            let sum: f64 = shares.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-6,
                "{records} {operations} {theta}: {sum}"
            );
        }
    }

    #[test]
    fn a_trace_stream_draws_pages_at_their_shares() {
        let trace = nomad_trace(&super::super::scenario::NOMAD_ROUNDS[0]);
        let n = 64;
        let shares = trace.page_shares(0.99, n);
        let mut s = TraceStream::new(100, n, &trace, 0.99, 0.25);
        let mut rng = Rng::new(9);
        let draws = 200_000;
        let mut count = vec![0u32; n as usize];
        let mut writes = 0;
        for _ in 0..draws {
            let a = s.next_access(&mut rng);
            count[(a.page - 100) as usize] += 1;
            writes += u32::from(a.write);
        }
        for (c, share) in count.iter().zip(&shares) {
            let want = share * draws as f64;
            assert!(
                (f64::from(*c) - want).abs() < 5.0 * want.sqrt() + 5.0,
                "{c} vs {want}"
            );
        }
        assert!((f64::from(writes) / draws as f64 - 0.25).abs() < 0.01);
    }

    #[test]
    fn normal_quantiles() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959964).abs() < 1e-5);
        assert!((normal_quantile(0.01) + 2.326348).abs() < 1e-5);
    }

    #[test]
    fn streams_replay_the_guest_patterns() {
        let p = ZipfParams {
            rss: 3000 * PAGE_SIZE,
            wss: 2000 * PAGE_SIZE,
            theta: 0.99,
            write_ratio: 0.3,
            stride: 64,
            scrambled: true,
        };
        let guest = ZipfPattern::new(&p);
        let mut sim = ZipfStream::from_params(&p);
        let (mut a, mut b) = (Rng::new(11), Rng::new(11));
        let n = 100_000;
        let same = (0..n)
            .filter(|_| {
                let g = guest.next_access(&mut a);
                let s = sim.next_access(&mut b);
                g.addr / PAGE_SIZE == s.page && g.write == s.write
            })
            .count();
        assert!(same as f64 >= n as f64 * 0.9999, "{same}");
        let gp = GupsParams {
            size: 1000 * PAGE_SIZE,
            hot_size: 100 * PAGE_SIZE,
            hot_prob: 0.9,
            object: 64,
        };
        let guest = GupsPattern::new(&gp, 4);
        let mut sim = GupsStream::new(1000, 100, 0.9, 1.0, 4);
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        for _ in 0..10_000 {
            assert_eq!(
                guest.next_access(&mut a).addr / PAGE_SIZE,
                sim.next_access(&mut b).page
            );
        }
    }

    fn kv_params_small(mix: Mix, value_size: u64) -> KvParams {
        KvParams {
            records: 3000,
            value_size,
            mix,
            theta: 0.99,
        }
    }

    #[test]
    fn kv_stream_replays_the_guest_pattern_inside_its_region() {
        for (mix, vs) in [(Mix::A, 2048), (Mix::B, 64), (Mix::C, 5000), (Mix::F, 9000)] {
            let p = kv_params_small(mix, vs);
            let guest = KvPattern::new(&p);
            let mut sim = KvStream::new(&p);
            let pages = sim.pages();
            assert_eq!(pages, guest.layout().bytes / PAGE_SIZE);
            let (mut a, mut b) = (Rng::new(9), Rng::new(9));
            let mut out = [tiervm_guest::workloads::Access {
                addr: 0,
                write: false,
            }; KV_MAX_ACCESSES];
            let ops = 20_000;
            let mut same = 0;
            let mut writes = 0;
            for _ in 0..ops {
                let n = guest.next_op(&mut a, &mut out);
                let mine: Vec<PageAccess> = (0..n).map(|_| sim.next_access(&mut b)).collect();
                for m in &mine {
                    assert!(m.page < pages, "{mix:?}: page {} of {pages}", m.page);
                    writes += usize::from(m.write);
                }
                let theirs: Vec<PageAccess> = out[..n]
                    .iter()
                    .map(|g| PageAccess {
                        page: g.addr / PAGE_SIZE,
                        write: g.write,
                    })
                    .collect();
                same += usize::from(mine == theirs);
            }
            // Identical up to Zipf rounding exactly at a rank boundary.
            assert!(
                same as f64 >= ops as f64 * 0.999,
                "{mix:?}: {same} of {ops}"
            );
            assert_eq!(writes == 0, mix == Mix::C, "{mix:?}: writes {writes}");
        }
    }

    #[test]
    fn pagerank_stream_is_the_guest_iteration_inside_its_region() {
        let p = PagerankParams {
            graph: GraphKind::Uniform,
            scale: 10,
            degree: 8,
            iterations: 0,
        };
        let mut s = PagerankStream::new(&p, 3).unwrap();
        let l = p.layout();
        assert_eq!(s.pages(), l.bytes / PAGE_SIZE);
        let per = s.accesses_per_iteration();
        // Against the guest's own iterator over the same graph, one access
        // per line an array moves to.
        let data: Vec<AtomicU64> = (0..l.bytes / 8).map(|_| AtomicU64::new(0)).collect();
        assert!(build_single(&p, 3, &data));
        let guest: Vec<PageAccess> = line_accesses(&l, PagerankPattern::new(&p, &data).unwrap())
            .into_iter()
            .map(|a| PageAccess {
                page: u64::from(a >> 1),
                write: a & 1 != 0,
            })
            .collect();
        assert_eq!(per, guest.len());
        let mut rng = Rng::new(1);
        let mine: Vec<PageAccess> = (0..per).map(|_| s.next_access(&mut rng)).collect();
        assert_eq!(mine, guest);
        assert!(mine.iter().all(|a| a.page < s.pages()));
        // The contrib reads go to the contrib pages, spread over them.
        let contrib_pages: std::collections::HashSet<u64> = mine
            .iter()
            .filter(|a| !a.write && a.page >= l.contrib_off / PAGE_SIZE)
            .map(|a| a.page)
            .collect();
        assert_eq!(
            contrib_pages.len() as u64,
            (l.vertices * 4).div_ceil(PAGE_SIZE)
        );
        // The next iteration replays the first.
        assert_eq!(s.next_access(&mut rng), guest[0]);
        // Same seed, same graph; another seed, another graph.
        let again = PagerankStream::new(&p, 3).unwrap();
        assert_eq!(again.trace, s.trace);
        let other = PagerankStream::new(&p, 4).unwrap();
        assert_ne!(other.trace, s.trace);
    }

    /// Memory serves lines: of the guest's `7 n + 2 E` element accesses
    /// only the line changes of each array and the contribution gathers
    /// remain, the gathers about `E` of them; a score read and its write
    /// are one line, written back.
    #[test]
    fn pagerank_trace_counts_lines_not_elements() {
        let p = PagerankParams {
            graph: GraphKind::Uniform,
            scale: 14,
            degree: 20,
            iterations: 0,
        };
        let s = PagerankStream::new(&p, 1).unwrap();
        let l = p.layout();
        let (n, e) = (l.vertices as f64, l.edges as f64);
        let per = s.accesses_per_iteration() as f64;
        // Gathers (E, less the rare repeat of a line) plus neighbors (E/16,
        // plus a line split per vertex at most), offsets (n/8), out-degrees
        // (n/8), scores (2 x n/16), contributions written (n/16).
        assert!(per < e + e / 16.0 + n * 1.6, "{per} vs E {e}");
        assert!(per > 0.95 * e, "{per} vs E {e}");
        let contrib_page = l.contrib_off / PAGE_SIZE;
        let gathers = s
            .trace
            .iter()
            .filter(|&&a| a & 1 == 0 && u64::from(a >> 1) >= contrib_page)
            .count() as f64;
        assert!(gathers > 0.95 * e, "{gathers}");
        // Writes: the contributions and the scores, one per line each.
        let writes = s.trace.iter().filter(|&&a| a & 1 != 0).count() as f64;
        assert!((writes - 2.0 * n / 16.0).abs() < 8.0, "{writes}");
    }

    #[test]
    fn kv_same_seed_same_stream() {
        let p = kv_params_small(Mix::A, 2048);
        let run = |seed| {
            let mut s = KvStream::new(&p);
            let mut rng = Rng::new(seed);
            (0..5000)
                .map(|_| s.next_access(&mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn gups_hot_share() {
        let mut rng = Rng::new(2);
        let mut g = GupsStream::new(1000, 100, 0.9, 1.0, 7);
        let hot: std::collections::HashSet<u64> = g.hot_pages().collect();
        let n = 100_000;
        let hits = (0..n)
            .filter(|_| hot.contains(&g.next_access(&mut rng).page))
            .count();
        // 0.9 + 0.1 * 0.1 = 0.91
        assert!((hits as f64 / n as f64 - 0.91).abs() < 0.01);
    }
}
