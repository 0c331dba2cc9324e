//! `pagerank`: the GAP benchmark suite's pull-direction PageRank (`pr`) on a
//! graph generated inside the guest.
//!
//! # Graph
//!
//! `vertices = 2^scale`, `edges = vertices * degree` directed edges, drawn
//! in chunks of [`EDGE_CHUNK`] from per-chunk random streams, so every edge
//! can be regenerated on demand and no edge list is stored:
//!
//! * `graph=uniform`: both endpoints uniform (GAP's `-u scale -k degree`);
//! * `graph=rmat`: R-MAT/Kronecker with GAP's Graph500 parameters
//!   a = 0.57, b = 0.19, c = 0.19 (GAP's `-g scale -k degree`), vertex ids
//!   then scrambled by a seeded bijection of `scale` bits (GAP shuffles them)
//!   so the hubs are spread over the id space.
//!
//! Unlike GAP's builder, duplicate edges and self-loops are kept (GAP removes
//! them), so the edge count is exactly `vertices * degree`; for uniform graphs
//! duplicates are rare (about `degree / vertices` of the edges).
//!
//! # Data structures (all in the heap, see [`PrLayout`])
//!
//! CSR of incoming edges (the pull direction): `offsets` (`vertices + 1`
//! words, like GAP's 64-bit index), `neighbors` (`edges` 32-bit source ids),
//! `out_degree` (64-bit), `scores` and `contrib` (32-bit floats, like GAP's
//! `ScoreT`). It is built without sorting: count in-degrees with atomic
//! increments while generating the edges, prefix-sum, then regenerate the
//! edges and place each with an atomic cursor (neighbor order within a vertex
//! therefore depends on the vCPU interleaving).
//!
//! # Iteration (GAP's `PageRankPull`)
//!
//! 1. `contrib[v] = score[v] / out_degree[v]` (vertices statically
//!    partitioned over the vCPUs); barrier.
//! 2. `score[u] = (1 - d) / n + d * sum(contrib[w] for w in in_neighbors(u))`
//!    with `d` = 0.85 (vertices handed out in chunks of [`VERTEX_CHUNK`] from a
//!    shared counter, like GAP's `schedule(dynamic)`); barrier.
//!
//! Dangling vertices (out-degree 0) are treated as GAP does: their score is
//! not redistributed (GAP's `contrib` for them is never read), so the rank sum
//! is 1 only if there are none; with dangling vertices it decays below 1. The
//! sanity check therefore verifies the mass-conservation identity every
//! iteration: `sum(new) = (1 - d) + d * sum(old score of non-dangling)`, to
//! within [`MASS_TOLERANCE`]; a violation (e.g. a corrupted out-degree,
//! neighbor or score) makes the exit code 1. A CSR whose edge count is not
//! `edges` makes it 2.
//!
//! Operations published to the VMM are in-edges processed in step 2, so the
//! timeline shows traversal throughput.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use super::{addr_of, data_words, partition, Access, Charge, Env, PAGE_SIZE};
use crate::abi::Phase;
use crate::args::{ArgKind, ArgSpec, Args, ImageSpec};
use crate::gen::rng::splitmix64;
use crate::gen::Rng;

/// Damping factor (GAP's `kDamp`).
pub const DAMPING: f32 = 0.85;
/// Edges per generation chunk (one random stream each).
pub const EDGE_CHUNK: u64 = 4096;
/// Vertices per dynamically scheduled chunk of step 2.
pub const VERTEX_CHUNK: u64 = 1024;
/// Largest allowed deviation of the rank sum from the conservation identity.
pub const MASS_TOLERANCE: f64 = 1e-3;
/// GAP's Graph500 R-MAT parameters.
pub const RMAT_A: f64 = 0.57;
/// See [`RMAT_A`].
pub const RMAT_B: f64 = 0.19;
/// See [`RMAT_A`].
pub const RMAT_C: f64 = 0.19;
/// Largest scale (vertex ids are 32-bit).
pub const MAX_SCALE: u64 = 31;

/// Exit code bit: the rank mass check failed.
pub const EXIT_MASS: u32 = 1;
/// Exit code bit: the CSR does not hold the generated edges.
pub const EXIT_CSR: u32 = 2;

/// The image's arguments.
pub static SPEC: ImageSpec = ImageSpec {
    name: "pagerank",
    about: "GAP pull PageRank on a generated uniform or R-MAT (Kronecker) graph",
    args: &[
        ArgSpec {
            key: "graph",
            kind: ArgKind::Choice(&["uniform", "rmat"]),
            default: "uniform",
            help: "uniform random endpoints (GAP -u) or R-MAT a=.57 b=.19 c=.19 (GAP -g)",
        },
        ArgSpec {
            key: "scale",
            kind: ArgKind::Int {
                min: 1,
                max: MAX_SCALE,
            },
            default: "20",
            help: "vertices = 2^scale",
        },
        ArgSpec {
            key: "degree",
            kind: ArgKind::Int { min: 1, max: 1024 },
            default: "16",
            help: "average out-degree: edges = vertices * degree",
        },
        ArgSpec {
            key: "iterations",
            kind: ArgKind::Int {
                min: 0,
                max: 1 << 32,
            },
            default: "20",
            help:
                "PageRank iterations (0 = until stopped); a stop request ends after the current one",
        },
    ],
};

/// Which generator draws the edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    /// Uniform random endpoints.
    Uniform,
    /// R-MAT / Kronecker.
    Rmat,
}

/// Parameters of the pagerank workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagerankParams {
    /// The generator.
    pub graph: GraphKind,
    /// log2 of the vertex count.
    pub scale: u32,
    /// Average out-degree.
    pub degree: u64,
    /// Iterations (0 = until stopped).
    pub iterations: u64,
}

impl PagerankParams {
    /// Reads the parameters from `args` (defaults from [`SPEC`]).
    pub fn from_args(args: &Args<'_>) -> Self {
        Self {
            graph: if args.str("graph", "uniform") == "rmat" {
                GraphKind::Rmat
            } else {
                GraphKind::Uniform
            },
            scale: args.u64("scale", 20).clamp(1, MAX_SCALE) as u32,
            degree: args.u64("degree", 16).clamp(1, 1024),
            iterations: args.u64("iterations", 20),
        }
    }

    /// Vertices.
    pub fn vertices(&self) -> u64 {
        1 << self.scale
    }

    /// Directed edges.
    pub fn edges(&self) -> u64 {
        self.vertices() * self.degree
    }

    /// Where the arrays live.
    pub fn layout(&self) -> PrLayout {
        PrLayout::new(self.vertices(), self.edges())
    }
}

fn page_up(b: u64) -> u64 {
    b.div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// Byte offsets of the arrays within the data region (each page aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrLayout {
    /// Vertices.
    pub vertices: u64,
    /// Edges.
    pub edges: u64,
    /// `vertices + 1` u64: start of each vertex's in-neighbors.
    pub offsets_off: u64,
    /// `vertices` u64 out-degrees.
    pub out_degree_off: u64,
    /// `edges` u32 in-neighbor (source) ids.
    pub neighbors_off: u64,
    /// `vertices` f32 scores.
    pub scores_off: u64,
    /// `vertices` f32 outgoing contributions.
    pub contrib_off: u64,
    /// Total bytes.
    pub bytes: u64,
}

impl PrLayout {
    /// The layout for a graph of `vertices` and `edges`.
    pub fn new(vertices: u64, edges: u64) -> Self {
        let offsets_off = 0;
        let out_degree_off = offsets_off + page_up((vertices + 1) * 8);
        let neighbors_off = out_degree_off + page_up(vertices * 8);
        let scores_off = neighbors_off + page_up(edges * 4);
        let contrib_off = scores_off + page_up(vertices * 4);
        let bytes = contrib_off + page_up(vertices * 4);
        Self {
            vertices,
            edges,
            offsets_off,
            out_degree_off,
            neighbors_off,
            scores_off,
            contrib_off,
            bytes,
        }
    }

    /// Offset of `offsets[v]`.
    pub fn offset_of(&self, v: u64) -> u64 {
        self.offsets_off + v * 8
    }
    /// Offset of `out_degree[v]`.
    pub fn out_degree_of(&self, v: u64) -> u64 {
        self.out_degree_off + v * 8
    }
    /// Offset of `neighbors[i]`.
    pub fn neighbor_of(&self, i: u64) -> u64 {
        self.neighbors_off + i * 4
    }
    /// Offset of `scores[v]`.
    pub fn score_of(&self, v: u64) -> u64 {
        self.scores_off + v * 4
    }
    /// Offset of `contrib[v]`.
    pub fn contrib_of(&self, v: u64) -> u64 {
        self.contrib_off + v * 4
    }
}

/// Views words as twice as many 32-bit atomics.
fn u32_view(words: &[AtomicU64]) -> &[AtomicU32] {
    // SAFETY: AtomicU32 has the size and bit validity of u32 and alignment 4,
    // which divides AtomicU64's alignment 8; the new slice covers exactly the
    // bytes of `words` and borrows them for the same lifetime. Each array of
    // the layout is accessed through one width only.
    unsafe { core::slice::from_raw_parts(words.as_ptr().cast::<AtomicU32>(), words.len() * 2) }
}

/// The CSR and score arrays over a data region.
pub struct Csr<'a> {
    /// `vertices + 1` offsets.
    pub offsets: &'a [AtomicU64],
    /// Out-degrees.
    pub out_degree: &'a [AtomicU64],
    /// In-neighbor ids.
    pub neighbors: &'a [AtomicU32],
    /// Scores (f32 bits).
    pub scores: &'a [AtomicU32],
    /// Contributions (f32 bits).
    pub contrib: &'a [AtomicU32],
}

impl<'a> Csr<'a> {
    /// The arrays of `l` in `data`; `None` if `data` is too small.
    pub fn new(l: &PrLayout, data: &'a [AtomicU64]) -> Option<Self> {
        if (data.len() as u64) < l.bytes / 8 {
            return None;
        }
        let w = |off: u64, words: u64| &data[(off / 8) as usize..(off / 8 + words) as usize];
        let n = l.vertices;
        Some(Self {
            offsets: w(l.offsets_off, n + 1),
            out_degree: w(l.out_degree_off, n),
            neighbors: &u32_view(w(l.neighbors_off, l.edges.div_ceil(2)))[..l.edges as usize],
            scores: &u32_view(w(l.scores_off, n.div_ceil(2)))[..n as usize],
            contrib: &u32_view(w(l.contrib_off, n.div_ceil(2)))[..n as usize],
        })
    }

    /// The in-neighbors of `v`.
    pub fn in_neighbors(&self, v: u64) -> &'a [AtomicU32] {
        let s = self.offsets[v as usize].load(Relaxed) as usize;
        let e = self.offsets[v as usize + 1].load(Relaxed) as usize;
        self.neighbors.get(s..e).unwrap_or(&[])
    }

    /// The score of `v`.
    pub fn score(&self, v: u64) -> f32 {
        f32::from_bits(self.scores[v as usize].load(Relaxed))
    }
}

/// The edge generator: edge `i` of chunk `c` is a pure function of the seed,
/// the parameters, `c` and `i`.
#[derive(Clone, Copy, Debug)]
pub struct EdgeGen {
    kind: GraphKind,
    scale: u32,
    edges: u64,
    seed: u64,
    perm_mul: [u64; 2],
    perm_add: u64,
}

impl EdgeGen {
    /// The generator of `p`'s graph for `seed`.
    pub fn new(p: &PagerankParams, seed: u64) -> Self {
        let mut s = seed ^ 0x7061_6765_7261_6e6b;
        Self {
            kind: p.graph,
            scale: p.scale,
            edges: p.edges(),
            seed: splitmix64(&mut s),
            perm_mul: [splitmix64(&mut s) | 1, splitmix64(&mut s) | 1],
            perm_add: splitmix64(&mut s),
        }
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.edges.div_ceil(EDGE_CHUNK)
    }

    /// The id scrambling of R-MAT graphs: a bijection of `0..2^scale`.
    pub fn scramble(&self, x: u64) -> u64 {
        let bits = self.scale;
        let mask = (1u64 << bits) - 1;
        let shift = bits / 2 + 1;
        let mut x = x.wrapping_add(self.perm_add) & mask;
        for m in self.perm_mul {
            x = x.wrapping_mul(m) & mask;
            x ^= x >> shift;
        }
        x
    }

    /// Calls `f(src, dst)` for every edge of chunk `c`.
    #[inline]
    pub fn for_each_edge(&self, c: u64, mut f: impl FnMut(u64, u64)) {
        let first = c * EDGE_CHUNK;
        let count = EDGE_CHUNK.min(self.edges.saturating_sub(first));
        let mut rng = Rng::for_stream(self.seed, c);
        let n = 1u64 << self.scale;
        for _ in 0..count {
            match self.kind {
                GraphKind::Uniform => {
                    let u = rng.below(n);
                    let v = rng.below(n);
                    f(u, v);
                }
                GraphKind::Rmat => {
                    let (mut u, mut v) = (0u64, 0u64);
                    for _ in 0..self.scale {
                        let r = rng.next_f64();
                        u <<= 1;
                        v <<= 1;
                        if r < RMAT_A + RMAT_B {
                            v += u64::from(r > RMAT_A);
                        } else {
                            u += 1;
                            v += u64::from(r > RMAT_A + RMAT_B + RMAT_C);
                        }
                    }
                    f(self.scramble(u), self.scramble(v));
                }
            }
        }
    }
}

/// Who runs a step: worker `vcpu` of `vcpus`, and the team barrier.
struct Team<'e> {
    vcpu: u32,
    vcpus: u32,
    barrier: &'e dyn Fn(),
    /// Whether to abandon the build (a stop request).
    stop: &'e dyn Fn() -> bool,
}

/// Where the edges come from.
trait EdgeSource {
    fn chunks(&self) -> u64;
    fn for_each_edge(&self, c: u64, f: &mut dyn FnMut(u64, u64));
}

impl EdgeSource for EdgeGen {
    fn chunks(&self) -> u64 {
        EdgeGen::chunks(self)
    }
    fn for_each_edge(&self, c: u64, f: &mut dyn FnMut(u64, u64)) {
        EdgeGen::for_each_edge(self, c, f)
    }
}

/// Edges buffered before their counters are touched.
const BATCH: usize = 32;

/// Hints the cache to load `x`'s line.
#[inline]
fn prefetch<T>(x: Option<&T>) {
    if let Some(x) = x {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is only a hint: it never faults and has no
        // architectural effect; SSE is part of the x86_64 baseline.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                (x as *const T).cast(),
            )
        };
    }
}

/// Feeds the edges of chunk `c` to `apply` in batches of [`BATCH`], so
/// `apply` can prefetch every counter of a batch before incrementing them:
/// lock-prefixed increments get no memory-level parallelism, and without
/// the prefetch each one waits for a full cache miss.
fn in_batches(edges: &dyn EdgeSource, c: u64, apply: impl Fn(&[(u64, u64)])) {
    let mut buf = [(0u64, 0u64); BATCH];
    let mut len = 0;
    edges.for_each_edge(c, &mut |u, v| {
        buf[len] = (u, v);
        len += 1;
        if len == BATCH {
            apply(&buf);
            len = 0;
        }
    });
    apply(&buf[..len]);
}

/// Builds the in-edge CSR and initial scores; returns `false` if the CSR
/// does not hold `edges` edges.
///
/// Its passes (degrees, offsets, edges, scores) are separated by team
/// barriers in one fixed order.
fn build(team: &Team<'_>, csr: &Csr<'_>, edges: &dyn EdgeSource, m: u64) -> bool {
    let n = csr.out_degree.len() as u64;
    let mine = partition(n, team.vcpus, team.vcpu);
    for v in mine.clone() {
        csr.offsets[v as usize + 1].store(0, Relaxed);
        csr.out_degree[v as usize].store(0, Relaxed);
    }
    if team.vcpu == 0 {
        csr.offsets[0].store(0, Relaxed);
    }
    (team.barrier)();
    let my_chunks = partition(edges.chunks(), team.vcpus, team.vcpu);
    count_degrees(team, csr, edges, my_chunks.clone());
    (team.barrier)();
    if team.vcpu == 0 {
        let mut sum = 0u64;
        for o in &csr.offsets[1..] {
            sum += o.load(Relaxed);
            o.store(sum, Relaxed);
        }
    }
    (team.barrier)();
    fill_neighbors(team, csr, edges, my_chunks);
    (team.barrier)();
    if team.vcpu == 0 {
        // offsets[v] now holds the end of v = the start of v + 1: shift back.
        for v in (1..=n as usize).rev() {
            csr.offsets[v].store(csr.offsets[v - 1].load(Relaxed), Relaxed);
        }
        csr.offsets[0].store(0, Relaxed);
    }
    let init = (1.0 / n as f64) as f32;
    for v in mine {
        csr.scores[v as usize].store(init.to_bits(), Relaxed);
    }
    (team.barrier)();
    csr.offsets[n as usize].load(Relaxed) == m
}

/// The degrees pass of [`build`] over the edge chunks `my_chunks`: each
/// edge `u -> v` counts in `u`'s out-degree and `v`'s in-degree (held in
/// `offsets[v + 1]`).
#[inline(always)]
fn count_degrees(
    team: &Team<'_>,
    csr: &Csr<'_>,
    edges: &dyn EdgeSource,
    my_chunks: core::ops::Range<u64>,
) {
    let count = |batch: &[(u64, u64)]| {
        for &(u, v) in batch {
            prefetch(csr.out_degree.get(u as usize));
            prefetch(csr.offsets.get(v as usize + 1));
        }
        for &(u, v) in batch {
            if let (Some(d), Some(o)) = (
                csr.out_degree.get(u as usize),
                csr.offsets.get(v as usize + 1),
            ) {
                d.fetch_add(1, Relaxed);
                o.fetch_add(1, Relaxed);
            }
        }
    };
    for c in my_chunks {
        in_batches(edges, c, count);
        if (team.stop)() {
            break;
        }
    }
}

/// The edges pass of [`build`] over the edge chunks `my_chunks`: each edge
/// `u -> v` claims the next slot of `v`'s in-neighbors (`offsets[v]`, the
/// start of `v` after the prefix sum) and stores `u` there.
#[inline(always)]
fn fill_neighbors(
    team: &Team<'_>,
    csr: &Csr<'_>,
    edges: &dyn EdgeSource,
    my_chunks: core::ops::Range<u64>,
) {
    let fill = |batch: &[(u64, u64)]| {
        for &(_, v) in batch {
            prefetch(csr.offsets.get(v as usize));
        }
        // Claim every position first, then store: a locked increment drains
        // the store buffer, so interleaving would serialise the store misses.
        let mut pos = [usize::MAX; BATCH];
        for (p, &(_, v)) in pos.iter_mut().zip(batch) {
            if let Some(o) = csr.offsets.get(v as usize) {
                *p = o.fetch_add(1, Relaxed) as usize;
                prefetch(csr.neighbors.get(*p));
            }
        }
        for (&p, &(u, _)) in pos.iter().zip(batch) {
            if let Some(slot) = csr.neighbors.get(p) {
                slot.store(u as u32, Relaxed);
            }
        }
    };
    for c in my_chunks {
        in_batches(edges, c, fill);
        if (team.stop)() {
            break;
        }
    }
}

/// Builds the graph of `p` for `seed` in `data` on the calling thread alone
/// (for the simulator and tests): the same CSR the workload builds, up to the
/// order of neighbors within a vertex. `false` if `data` is too small.
pub fn build_single(p: &PagerankParams, seed: u64, data: &[AtomicU64]) -> bool {
    let l = p.layout();
    let Some(csr) = Csr::new(&l, data) else {
        return false;
    };
    let team = Team {
        vcpu: 0,
        vcpus: 1,
        barrier: &|| {},
        stop: &|| false,
    };
    build(&team, &csr, &EdgeGen::new(p, seed), l.edges)
}

// Scratch words.
const S_CONTINUE: usize = 0;
const S_CHUNK: usize = 1;
const S_MASS: usize = 64;
const S_SUM: usize = 128;
const S_ERR: usize = 192;
const MAX_TEAM: usize = 64;

fn f64_slot(w: &AtomicU64) -> f64 {
    f64::from_bits(w.load(Relaxed))
}

/// Reports an element of an array walked in order to latency emulation:
/// only the element that starts a cache line, since the others share its
/// line (and a cache model would count them as hits anyway).
#[inline(always)]
fn stream_access<C: Charge + ?Sized, T>(c: &C, x: &T, write: bool) {
    let a = addr_of(x);
    if a.is_multiple_of(64) {
        c.access(a, write);
    }
}

/// Worker 0's bookkeeping of the iterations: their times and the rank mass
/// check.
struct IterStats {
    iters: u64,
    sum_ms: f64,
    min_ms: f64,
    max_ms: f64,
    /// The largest deviation of the rank sum from the conservation identity.
    worst_dev: f64,
    rank_sum: f64,
    expected: f64,
    err_last: f64,
}

impl IterStats {
    fn new() -> Self {
        Self {
            iters: 0,
            sum_ms: 0.0,
            min_ms: f64::MAX,
            max_ms: 0.0,
            worst_dev: 0.0,
            rank_sum: 1.0,
            expected: 1.0,
            err_last: 0.0,
        }
    }

    /// Adds an iteration of `ms` whose per-worker sums the `vcpus` workers
    /// left in the scratch words of `mem`.
    fn record(&mut self, mem: &[AtomicU64], vcpus: u32, ms: f64) {
        self.iters += 1;
        self.sum_ms += ms;
        self.min_ms = self.min_ms.min(ms);
        self.max_ms = self.max_ms.max(ms);
        let team = 0..vcpus as usize;
        let nd_mass: f64 = team.clone().map(|i| f64_slot(&mem[S_MASS + i])).sum();
        self.rank_sum = team.clone().map(|i| f64_slot(&mem[S_SUM + i])).sum();
        self.err_last = team.map(|i| f64_slot(&mem[S_ERR + i])).sum();
        self.expected = (1.0 - f64::from(DAMPING)) + f64::from(DAMPING) * nd_mass;
        let dev = (self.rank_sum - self.expected).abs();
        self.worst_dev = if dev.is_nan() {
            f64::MAX
        } else {
            self.worst_dev.max(dev)
        };
    }
}

/// Runs PageRank iterations on a built CSR; returns the exit code bits.
///
/// Each iteration's steps are separated by team barriers every worker must
/// reach in the same order.
fn iterate<E: Env>(env: &E, mem: &[AtomicU64], csr: &Csr<'_>, p: &PagerankParams) -> u32 {
    let n = csr.out_degree.len() as u64;
    let vcpus = env.vcpus().min(MAX_TEAM as u32);
    let me = env.vcpu() as usize;
    let mine = partition(n, vcpus, env.vcpu());
    let base = ((1.0 - f64::from(DAMPING)) / n as f64) as f32;
    let khz = env.tsc_khz().max(1);
    let chunk = &mem[S_CHUNK];
    let mut stats = IterStats::new();
    let mut edges_done = 0u64;
    if env.vcpu() == 0 {
        chunk.store(0, Relaxed);
        mem[S_CONTINUE].store(u64::from(!env.stop_requested()), Relaxed);
    }
    env.barrier();
    while mem[S_CONTINUE].load(Relaxed) == 1 {
        let t0 = env.cycles();
        // Step 1: outgoing contributions.
        let mass = contribute(env, csr, mine.clone());
        mem[S_MASS + me].store(mass.to_bits(), Relaxed);
        env.barrier();
        // Step 2: pull.
        let (sum, err) = pull(env, csr, chunk, base, &mut edges_done);
        mem[S_SUM + me].store(sum.to_bits(), Relaxed);
        mem[S_ERR + me].store(err.to_bits(), Relaxed);
        env.barrier();
        if env.vcpu() == 0 {
            let ms = env.cycles().wrapping_sub(t0) as f64 / khz as f64;
            // Every chunk claimed was pulled whole (a stop ends a worker's
            // pull between chunks): all claimed, the iteration is whole. One
            // a stop cut short is not counted (its mass check would fail).
            if chunk.load(Relaxed).saturating_mul(VERTEX_CHUNK) >= n {
                stats.record(mem, vcpus, ms);
            }
            chunk.store(0, Relaxed);
            let more = p.iterations == 0 || stats.iters < p.iterations;
            mem[S_CONTINUE].store(u64::from(more && !env.stop_requested()), Relaxed);
        }
        env.barrier();
    }
    if env.vcpu() != 0 {
        return 0;
    }
    report(env, csr, &stats)
}

/// Step 1 of an iteration: the outgoing contribution of each vertex of
/// `mine` (its score over its out-degree). Returns the score mass of those
/// with out-edges.
#[inline(always)]
fn contribute<E: Env>(env: &E, csr: &Csr<'_>, mine: core::ops::Range<u64>) -> f64 {
    let mut mass = 0.0f64;
    for v in mine {
        let s = f32::from_bits(csr.scores[v as usize].load(Relaxed));
        let d = csr.out_degree[v as usize].load(Relaxed);
        let c = if d == 0 {
            0.0
        } else {
            mass += f64::from(s);
            s / d as f32
        };
        csr.contrib[v as usize].store(c.to_bits(), Relaxed);
        stream_access(env, &csr.scores[v as usize], false);
        stream_access(env, &csr.out_degree[v as usize], false);
        stream_access(env, &csr.contrib[v as usize], true);
    }
    mass
}

/// Step 2 of an iteration: new scores pulled from the in-neighbors'
/// contributions, over vertex chunks claimed from `chunk` until none are
/// left; counts the edges into `edges_done`. Returns the sum of the new
/// scores and of their changes.
#[inline(always)]
fn pull<E: Env>(
    env: &E,
    csr: &Csr<'_>,
    chunk: &AtomicU64,
    base: f32,
    edges_done: &mut u64,
) -> (f64, f64) {
    let n = csr.out_degree.len() as u64;
    let (mut sum, mut err) = (0.0f64, 0.0f64);
    loop {
        let start = chunk.fetch_add(1, Relaxed) * VERTEX_CHUNK;
        if start >= n {
            break;
        }
        for u in start..(start + VERTEX_CHUNK).min(n) {
            let nbrs = csr.in_neighbors(u);
            stream_access(env, &csr.offsets[u as usize + 1], false);
            let mut incoming = 0.0f32;
            for w in nbrs {
                let c = csr.contrib.get(w.load(Relaxed) as usize);
                incoming += f32::from_bits(c.map_or(0, |c| c.load(Relaxed)));
                stream_access(env, w, false);
                if let Some(c) = c {
                    env.access(addr_of(c), false);
                }
            }
            let new = base + DAMPING * incoming;
            let old = f32::from_bits(csr.scores[u as usize].load(Relaxed));
            csr.scores[u as usize].store(new.to_bits(), Relaxed);
            stream_access(env, &csr.scores[u as usize], true);
            err += f64::from((new - old).abs());
            sum += f64::from(new);
            *edges_done += nbrs.len() as u64;
        }
        env.set_ops(*edges_done);
        // A stop ends the iteration at the next chunk: an iteration over a
        // large graph takes longer than the VMM waits for the guest to
        // acknowledge (500 ms; seen emulated at 192M, issue 29's matrix).
        if env.stop_requested() {
            break;
        }
    }
    (sum, err)
}

/// Worker 0, after the last iteration: the metrics; returns the exit code
/// bits.
fn report<E: Env>(env: &E, csr: &Csr<'_>, st: &IterStats) -> u32 {
    env.metric("iterations", st.iters as f64);
    if st.iters > 0 {
        env.metric("iteration_ms_avg", st.sum_ms / st.iters as f64);
        env.metric("iteration_ms_min", st.min_ms);
        env.metric("iteration_ms_max", st.max_ms);
    }
    env.metric("rank_sum", st.rank_sum);
    env.metric("rank_sum_expected", st.expected);
    env.metric("rank_sum_max_dev", st.worst_dev);
    env.metric("error_last", st.err_last);
    let dangling = csr
        .out_degree
        .iter()
        .filter(|d| d.load(Relaxed) == 0)
        .count();
    env.metric("dangling", dangling as f64);
    if st.worst_dev > MASS_TOLERANCE {
        env.log("pagerank: rank mass check failed (sum of ranks off the conservation identity)");
        EXIT_MASS
    } else {
        0
    }
}

/// Runs the workload on one worker; returns the exit code bits
/// ([`EXIT_MASS`], [`EXIT_CSR`]) on worker 0 and 0 elsewhere.
pub fn run<E: Env>(env: &E, mem: &[AtomicU64]) -> u32 {
    let p = PagerankParams::from_args(&env.args());
    let l = p.layout();
    let data = data_words(mem, l.bytes);
    let Some(csr) = Csr::new(&l, data) else {
        env.log("pagerank: heap too small for the graph; raise --mem or lower scale/degree");
        return u32::MAX;
    };
    if env.vcpus() as usize > MAX_TEAM {
        env.log("pagerank: at most 64 vCPUs");
        return u32::MAX;
    }
    env.set_phase(Phase::Init);
    let t0 = env.cycles();
    let team = Team {
        vcpu: env.vcpu(),
        vcpus: env.vcpus(),
        barrier: &|| env.barrier(),
        stop: &|| env.stop_requested(),
    };
    let csr_ok = build(&team, &csr, &EdgeGen::new(&p, env.seed()), l.edges);
    // A stop during the build may leave edges out (the stop flag is sticky):
    // then no iteration runs and the CSR is not judged.
    let csr_fine = csr_ok || env.stop_requested();
    let build_ms = env.cycles().wrapping_sub(t0) as f64 / env.tsc_khz().max(1) as f64;
    env.set_phase(Phase::Run);
    let mut code = iterate(env, mem, &csr, &p);
    if env.vcpu() == 0 {
        env.metric("vertices", l.vertices as f64);
        env.metric("edges", l.edges as f64);
        env.metric("build_ms", build_ms);
        env.metric("build_complete", f64::from(u8::from(csr_ok)));
        if !csr_fine {
            env.log("pagerank: the CSR does not hold every generated edge");
            code |= EXIT_CSR;
        }
    }
    env.set_phase(Phase::Done);
    code
}

/// The access pattern of one PageRank iteration over a built graph, in the
/// order a single worker issues it, as byte offsets within the data region
/// (see [`PrLayout`]). Step 1: for each vertex read `scores[v]`,
/// `out_degree[v]`, write `contrib[v]`. Step 2: for each vertex `u` read
/// `offsets[u]` and `offsets[u + 1]`, then per in-edge read `neighbors[i]`
/// and `contrib[neighbors[i]]`, then read and write `scores[u]`. One access
/// per element (sequential streams are not coalesced into lines).
pub struct PagerankPattern<'a> {
    layout: PrLayout,
    csr: Csr<'a>,
    step: u8,
    v: u64,
    edge: u64,
    end: u64,
    sub: u8,
}

impl<'a> PagerankPattern<'a> {
    /// The pattern over the graph in `data` (built with [`build_single`] or by
    /// the workload) for `p`; `None` if `data` is too small.
    pub fn new(p: &PagerankParams, data: &'a [AtomicU64]) -> Option<Self> {
        let layout = p.layout();
        Some(Self {
            csr: Csr::new(&layout, data)?,
            layout,
            step: 1,
            v: 0,
            edge: 0,
            end: 0,
            sub: 0,
        })
    }

    /// Accesses in one iteration: `7 * vertices + 2 * edges`.
    pub fn accesses_per_iteration(&self) -> u64 {
        7 * self.layout.vertices + 2 * self.layout.edges
    }

    /// Starts the iteration over.
    pub fn restart(&mut self) {
        (self.step, self.v, self.sub) = (1, 0, 0);
    }

    fn read(addr: u64) -> Access {
        Access { addr, write: false }
    }
}

impl Iterator for PagerankPattern<'_> {
    type Item = Access;

    fn next(&mut self) -> Option<Access> {
        let l = self.layout;
        let n = l.vertices;
        loop {
            if self.v >= n {
                if self.step == 1 {
                    (self.step, self.v, self.sub) = (2, 0, 0);
                    continue;
                }
                return None;
            }
            let v = self.v;
            let out = match (self.step, self.sub) {
                (1, 0) => Self::read(l.score_of(v)),
                (1, 1) => Self::read(l.out_degree_of(v)),
                (1, _) => {
                    self.v += 1;
                    self.sub = 0;
                    return Some(Access {
                        addr: l.contrib_of(v),
                        write: true,
                    });
                }
                (_, 0) => {
                    self.edge = self.csr.offsets[v as usize].load(Relaxed);
                    self.end = self.csr.offsets[v as usize + 1].load(Relaxed);
                    Self::read(l.offset_of(v))
                }
                (_, 1) => Self::read(l.offset_of(v + 1)),
                (_, 2) => {
                    if self.edge >= self.end {
                        self.sub = 4;
                        continue;
                    }
                    Self::read(l.neighbor_of(self.edge))
                }
                (_, 3) => {
                    let w = self
                        .csr
                        .neighbors
                        .get(self.edge as usize)
                        .map_or(0, |w| w.load(Relaxed));
                    self.edge += 1;
                    self.sub = 2;
                    return Some(Self::read(l.contrib_of(u64::from(w))));
                }
                (_, 4) => Self::read(l.score_of(v)),
                _ => {
                    self.v += 1;
                    self.sub = 0;
                    return Some(Access {
                        addr: l.score_of(v),
                        write: true,
                    });
                }
            };
            self.sub += 1;
            return Some(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::host_env::{zeroed, TestEnv};
    use super::super::SCRATCH_WORDS;
    use super::*;
    use std::vec::Vec;

    struct EdgeList<'a>(&'a [(u64, u64)]);

    impl EdgeSource for EdgeList<'_> {
        fn chunks(&self) -> u64 {
            1
        }
        fn for_each_edge(&self, _: u64, f: &mut dyn FnMut(u64, u64)) {
            for &(u, v) in self.0 {
                f(u, v);
            }
        }
    }

    /// GAP's algorithm in f64 on an edge list (dense, obviously correct).
    fn reference(n: usize, edges: &[(u64, u64)], iters: usize) -> Vec<f64> {
        let d = f64::from(DAMPING);
        let mut out = std::vec![0usize; n];
        for &(u, _) in edges {
            out[u as usize] += 1;
        }
        let mut s = std::vec![1.0 / n as f64; n];
        for _ in 0..iters {
            let mut next = std::vec![(1.0 - d) / n as f64; n];
            for &(u, v) in edges {
                next[v as usize] += d * s[u as usize] / out[u as usize] as f64;
            }
            s = next;
        }
        s
    }

    fn solo() -> Team<'static> {
        Team {
            vcpu: 0,
            vcpus: 1,
            barrier: &|| {},
            stop: &|| false,
        }
    }

    #[test]
    fn tiny_graph_matches_the_reference() {
        // Vertex 4 is dangling; 2 has a self-loop; 0 -> 1 appears twice.
        let edges = [
            (0, 1),
            (0, 1),
            (0, 2),
            (1, 2),
            (2, 0),
            (2, 2),
            (3, 2),
            (3, 4),
            (5, 3),
            (6, 5),
            (7, 6),
            (1, 7),
        ];
        let n = 8u64;
        let p = PagerankParams {
            graph: GraphKind::Uniform,
            scale: 3,
            degree: 1,
            iterations: 20,
        };
        let l = PrLayout::new(n, edges.len() as u64);
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        let csr = Csr::new(&l, &mem[SCRATCH_WORDS..]).unwrap();
        assert!(build(&solo(), &csr, &EdgeList(&edges), edges.len() as u64));
        let mut ins: Vec<u32> = csr
            .in_neighbors(2)
            .iter()
            .map(|w| w.load(Relaxed))
            .collect();
        ins.sort_unstable();
        assert_eq!(ins, [0, 1, 2, 3]);
        let env = TestEnv::new(&SPEC, &[], u64::MAX);
        assert_eq!(iterate(&env, &mem, &csr, &p), 0);
        let want = reference(n as usize, &edges, 20);
        for (v, w) in want.iter().enumerate() {
            let got = f64::from(csr.score(v as u64));
            assert!((got - w).abs() < 1e-6, "vertex {v}: {got} vs {w}");
        }
        let m = |k: &str| env.metric_value(k).unwrap();
        assert_eq!(m("iterations"), 20.0);
        assert_eq!(m("dangling"), 1.0);
        let ref_sum: f64 = want.iter().sum();
        assert!((m("rank_sum") - ref_sum).abs() < 1e-5);
        // The dangling vertex leaks mass: the sum is below 1, and the check
        // compares against the identity instead.
        assert!(ref_sum < 0.95, "{ref_sum}");
        assert!(m("rank_sum_max_dev") < 1e-6);
        assert_eq!(env.ops.get(), 20 * edges.len() as u64);
    }

    fn run_graph(
        graph: &str,
        scale: &str,
        degree: &str,
    ) -> (TestEnv<'static>, Vec<AtomicU64>, u32) {
        let env = TestEnv::new(
            &SPEC,
            &[
                ("graph", graph),
                ("scale", scale),
                ("degree", degree),
                ("iterations", "10"),
            ],
            u64::MAX,
        );
        let l = PagerankParams::from_args(&env.args()).layout();
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        let code = run(&env, &mem);
        (env, mem, code)
    }

    #[test]
    fn uniform_graph_has_the_requested_edges_and_rank_sum_one() {
        let (env, mem, code) = run_graph("uniform", "10", "16");
        assert_eq!(code, 0);
        let p = PagerankParams::from_args(&env.args());
        let csr = Csr::new(&p.layout(), &mem[SCRATCH_WORDS..]).unwrap();
        assert_eq!(p.edges(), 16 << 10);
        assert_eq!(csr.offsets[1024].load(Relaxed), 16 << 10);
        let out: u64 = csr.out_degree.iter().map(|d| d.load(Relaxed)).sum();
        assert_eq!(out, 16 << 10);
        // The CSR holds exactly the generated edges (as a multiset).
        let gen = EdgeGen::new(&p, env.seed());
        let mut want = Vec::new();
        for c in 0..gen.chunks() {
            gen.for_each_edge(c, |u, v| want.push((v, u)));
        }
        let mut got = Vec::new();
        for v in 0..1024 {
            for u in csr.in_neighbors(v) {
                got.push((v, u64::from(u.load(Relaxed))));
            }
        }
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
        // In-degrees of a uniform graph: mean 16, roughly Poisson.
        let max_in = (0..1024).map(|v| csr.in_neighbors(v).len()).max().unwrap();
        assert!((20..50).contains(&max_in), "max in-degree {max_in}");
        let m = |k: &str| env.metric_value(k).unwrap();
        assert_eq!(m("edges"), 16384.0);
        assert_eq!(m("vertices"), 1024.0);
        assert_eq!(m("iterations"), 10.0);
        assert_eq!(m("dangling"), 0.0);
        assert!((m("rank_sum") - 1.0).abs() < 1e-4, "{}", m("rank_sum"));
    }

    #[test]
    fn rmat_graph_is_skewed_and_passes_the_mass_check() {
        let (env, mem, code) = run_graph("rmat", "12", "8");
        assert_eq!(code, 0);
        let p = PagerankParams::from_args(&env.args());
        let csr = Csr::new(&p.layout(), &mem[SCRATCH_WORDS..]).unwrap();
        let n = p.vertices();
        let max_in = (0..n).map(|v| csr.in_neighbors(v).len()).max().unwrap();
        assert!(
            max_in > 200,
            "R-MAT should have hubs, max in-degree {max_in}"
        );
        let m = |k: &str| env.metric_value(k).unwrap();
        assert!(m("dangling") > n as f64 / 10.0);
        assert!(m("rank_sum") < 0.99);
        assert!(m("rank_sum_max_dev") < 1e-4);
        // The scramble is a bijection.
        let g = EdgeGen::new(&p, 5);
        let mut seen = std::vec![false; n as usize];
        for x in 0..n {
            let y = g.scramble(x) as usize;
            assert!(!seen[y]);
            seen[y] = true;
        }
    }

    #[test]
    fn corrupted_out_degree_fails_the_mass_check() {
        let args = [("scale", "10"), ("degree", "16"), ("iterations", "5")];
        let p = PagerankParams::from_args(&TestEnv::new(&SPEC, &args, 0).args());
        let l = p.layout();
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        // A vertex with out-degree 16+ claims 1: its contribution is counted 16x.
        // Corrupt the out-degree the first time ops are published.
        let word = &mem[SCRATCH_WORDS + (l.out_degree_of(7) / 8) as usize];
        let env = TestEnv::new(&SPEC, &args, u64::MAX).with_hook(|before, _| {
            if before == 0 {
                word.store(1, Relaxed);
            }
        });
        assert_eq!(run(&env, &mem), EXIT_MASS);
        assert!(env.metric_value("rank_sum_max_dev").unwrap() > MASS_TOLERANCE);
    }

    #[test]
    fn stop_request_ends_after_whole_iterations() {
        // Stop once 3 iterations' worth of edges were processed.
        let args = [("scale", "8"), ("degree", "4"), ("iterations", "0")];
        let env = TestEnv::new(&SPEC, &args, 3 * 1024);
        let l = PagerankParams::from_args(&env.args()).layout();
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        assert_eq!(run(&env, &mem), 0);
        assert_eq!(env.metric_value("iterations"), Some(3.0));
    }

    #[test]
    fn a_stop_within_an_iteration_ends_it_at_the_next_chunk() {
        // 4096 vertices in 4 chunks, 16384 edges an iteration: the stop
        // comes after the first chunk of the third iteration.
        let args = [("scale", "12"), ("degree", "4"), ("iterations", "0")];
        let env = TestEnv::new(&SPEC, &args, 2 * 16384 + 2000);
        let l = PagerankParams::from_args(&env.args()).layout();
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        assert_eq!(run(&env, &mem), 0, "the cut iteration is not mass-checked");
        assert_eq!(env.metric_value("iterations"), Some(2.0));
        let ops = env.ops.get();
        assert!(
            ops < 3 * 16384,
            "the third iteration ran whole: {ops} edges"
        );
    }

    #[test]
    fn stop_during_build_is_a_clean_exit() {
        let args = [("scale", "12"), ("degree", "8")];
        let env = TestEnv::new(&SPEC, &args, 0);
        let l = PagerankParams::from_args(&env.args()).layout();
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        assert_eq!(run(&env, &mem), 0);
        assert_eq!(env.metric_value("build_complete"), Some(0.0));
        assert_eq!(env.metric_value("iterations"), Some(0.0));
    }

    #[test]
    fn pattern_walks_one_iteration_in_csr_order() {
        let p = PagerankParams {
            graph: GraphKind::Rmat,
            scale: 8,
            degree: 4,
            iterations: 1,
        };
        let l = p.layout();
        let data = zeroed((l.bytes / 8) as usize);
        assert!(build_single(&p, 3, &data));
        let mut pat = PagerankPattern::new(&p, &data).unwrap();
        let all: Vec<Access> = pat.by_ref().collect();
        assert_eq!(all.len() as u64, pat.accesses_per_iteration());
        assert!(all.iter().all(|a| a.addr < l.bytes));
        let contrib_reads = all
            .iter()
            .filter(|a| !a.write && (l.contrib_off..l.bytes).contains(&a.addr))
            .count() as u64;
        assert_eq!(contrib_reads, l.edges);
        let writes = all.iter().filter(|a| a.write).count() as u64;
        assert_eq!(writes, 2 * l.vertices);
        // The contribution reads follow the neighbor ids.
        let csr = Csr::new(&l, &data).unwrap();
        let mut firsts = all
            .iter()
            .skip(3 * 256)
            .skip_while(|a| !(l.neighbors_off..l.scores_off).contains(&a.addr));
        let nb = firsts.next().unwrap();
        let i = (nb.addr - l.neighbors_off) / 4;
        let w = u64::from(csr.neighbors[i as usize].load(Relaxed));
        assert_eq!(firsts.next().unwrap().addr, l.contrib_of(w));
        pat.restart();
        assert_eq!(pat.count() as u64, 7 * 256 + 2 * l.edges);
    }

    #[test]
    fn threads_build_the_same_graph_and_ranks() {
        for graph in ["uniform", "rmat"] {
            let args = [
                ("graph", graph),
                ("scale", "11"),
                ("degree", "8"),
                ("iterations", "8"),
            ];
            let p = PagerankParams::from_args(&TestEnv::new(&SPEC, &args, 0).args());
            let l = p.layout();
            let words = SCRATCH_WORDS + (l.bytes / 8) as usize;
            let (code, metrics, mem) =
                super::super::kv::tests::run_threads(&SPEC, &args, 3, words, |e, m| run(e, m));
            assert_eq!(code, 0, "{graph}: {metrics:?}");
            let m = |n: &str| metrics.iter().find(|x| x.0 == n).unwrap().1;
            assert_eq!(m("iterations"), 8.0);
            // The same seed on one thread.
            let solo_mem = zeroed(words);
            assert_eq!(run(&TestEnv::new(&SPEC, &args, u64::MAX), &solo_mem), 0);
            let a = Csr::new(&l, &mem[SCRATCH_WORDS..]).unwrap();
            let b = Csr::new(&l, &solo_mem[SCRATCH_WORDS..]).unwrap();
            for v in 0..p.vertices() {
                let sorted = |c: &Csr<'_>| {
                    let mut x: Vec<u32> =
                        c.in_neighbors(v).iter().map(|w| w.load(Relaxed)).collect();
                    x.sort_unstable();
                    x
                };
                assert_eq!(sorted(&a), sorted(&b), "{graph}: in-neighbors of {v}");
                assert_eq!(
                    a.out_degree[v as usize].load(Relaxed),
                    b.out_degree[v as usize].load(Relaxed)
                );
                let (x, y) = (a.score(v), b.score(v));
                assert!(
                    (x - y).abs() <= 1e-6 * y.abs().max(1e-9),
                    "{graph} {v}: {x} vs {y}"
                );
            }
        }
    }
}
