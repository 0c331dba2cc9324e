//! Where first-touch placement puts GAPBS PageRank's arrays.
//!
//! The `pagerank` guest builds only the arrays its iteration reads, but
//! GAPBS (`pr -u 26 -k 20`, the program Nomad §4.3 ran,
//! <https://github.com/sbeamer/gapbs>) builds far more first: an edge
//! list, a CSR in each direction, then squished copies of both, freeing the
//! intermediates as it goes. Pages are placed when first touched, in the
//! fast tier while it has room, and a freed array returns its pages to the
//! kernel (glibc serves allocations this large with `mmap` and frees them
//! with `munmap` [inferred: glibc's mmap threshold is at most 32 MiB]), so
//! later arrays reuse the fast memory the builder released. [`replay`]
//! walks that sequence (gapbs master, files and lines cited per step) and
//! reports which share of each array the pull iteration reads ends in the
//! fast tier.
//!
//! Sizes follow GAPBS's types (`src/benchmark.h:31`, `NodeID` = `int32_t`;
//! `SGOffset` = `int64_t`; an edge is two `NodeID`s; an index entry is a
//! pointer). Squishing removes self-loops and duplicate edges, which for
//! a uniform graph are about `degree / vertices` of the edges [inferred];
//! the squished arrays keep every edge here.

/// Shares (0..=1) of the pull iteration's arrays that first touch leaves
/// in the fast tier, named after the guest layout's arrays
/// (`tiervm_guest::workloads::pagerank::PrLayout`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GapFastShares {
    /// In-edge index (GAP's squished `in_index_`), the guest's `offsets`.
    pub offsets: f64,
    /// Out-edge index (GAP's squished `out_index_`, whose differences are
    /// the out-degrees, `src/graph.h:205-207`), the guest's `out_degree`.
    pub out_degree: f64,
    /// In-neighbors (GAP's squished `in_neighbors_`), the guest's `neighbors`.
    pub neighbors: f64,
    /// `scores` (`src/pr.cc:38`).
    pub scores: f64,
    /// `outgoing_contrib` (`src/pr.cc:39`), the guest's `contrib`.
    pub contrib: f64,
}

/// What first touch leaves where after GAPBS built the graph and
/// allocated PageRank's arrays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GapFirstTouch {
    /// Fast shares of the arrays the pull iteration reads.
    pub shares: GapFastShares,
    /// Fast-tier bytes held by resident arrays the pull iteration never
    /// reads (the squished out-neighbors): memory outside the modeled
    /// layout that no policy frees.
    pub fast_bytes_outside: f64,
    /// Largest resident size during the run, bytes.
    pub peak_rss_bytes: f64,
}

/// One allocation: its bytes in the fast and the slow tier.
#[derive(Clone, Copy, Debug, Default)]
struct Block {
    fast: f64,
    slow: f64,
}

impl Block {
    fn fast_share(self) -> f64 {
        let all = self.fast + self.slow;
        if all > 0.0 {
            self.fast / all
        } else {
            1.0
        }
    }
}

/// A process heap over a fast tier of fixed size, first touch.
struct Heap {
    free_fast: f64,
    rss: f64,
    peak: f64,
}

impl Heap {
    /// Touches `bytes` of a new allocation: fast while the tier has room.
    fn touch(&mut self, bytes: f64) -> Block {
        let fast = bytes.min(self.free_fast).max(0.0);
        self.free_fast -= fast;
        self.rss += bytes;
        self.peak = self.peak.max(self.rss);
        Block {
            fast,
            slow: bytes - fast,
        }
    }

    /// Frees `b`: its fast pages can take later allocations.
    fn free(&mut self, b: Block) {
        self.free_fast += b.fast;
        self.rss -= b.fast + b.slow;
    }
}

/// A CSR as GAPBS's builder makes it: its index and its neighbors.
struct Csr {
    index: Block,
    neighbors: Block,
}

/// Replays GAPBS's allocations for a graph of `vertices` and `edges`
/// with `fast_bytes` of fast tier free at start:
///
/// 1. the generator writes the edge list, 8 bytes an edge
///    (`src/generator.h:105-119`, `EdgeList el(num_edges_)`);
/// 2. `MakeCSR` builds the out-CSR, then again the in-CSR
///    (`src/builder.h:329-332`); each (`src/builder.h:300-315`) touches a
///    degree count (4 bytes a vertex, line 302), its prefix sum (8 bytes,
///    line 303), the index (8 bytes, `GenIndex`, `src/graph.h:242-249`,
///    written before any neighbor) and then the neighbors it scatters
///    (4 bytes an edge, lines 304-314); the count and prefix sum are freed
///    when `MakeCSR` returns;
/// 3. the edge list is freed when its scope closes (`src/builder.h:345`,
///    "extra scope to trigger earlier deletion of el");
/// 4. `SquishGraph` (`src/builder.h:172-186`, called at line 363) makes a
///    squished copy of the out-CSR, then of the in-CSR: each `SquishCSR`
///    (lines 141-170) touches `diffs` (4 bytes a vertex, line 143), a prefix
///    sum (line 159), the index (line 161) and the copied neighbors
///    (lines 160-169), freeing `diffs` and the prefix sum on return;
/// 5. the unsquished graph is freed once the squished one is returned
///    (`src/graph.h:119-129`);
/// 6. PageRank allocates and fills `scores` and `outgoing_contrib`
///    (`src/pr.cc:38-42`, 4 bytes a vertex each).
pub fn replay(vertices: f64, edges: f64, fast_bytes: f64) -> GapFirstTouch {
    let (n, e) = (vertices.max(0.0), edges.max(0.0));
    let mut h = Heap {
        free_fast: fast_bytes.max(0.0),
        rss: 0.0,
        peak: 0.0,
    };
    // Step 1.
    let edge_list = h.touch(8.0 * e);
    // Step 2.
    let make_csr = |h: &mut Heap| {
        let degrees = h.touch(4.0 * n);
        let prefix = h.touch(8.0 * (n + 1.0));
        let index = h.touch(8.0 * (n + 1.0));
        let neighbors = h.touch(4.0 * e);
        h.free(degrees);
        h.free(prefix);
        Csr { index, neighbors }
    };
    let out_csr = make_csr(&mut h);
    let in_csr = make_csr(&mut h);
    // Step 3.
    h.free(edge_list);
    // Step 4: the same shape as `MakeCSR` (diffs, prefix sum, index, neighbors).
    let sq_out = make_csr(&mut h);
    let sq_in = make_csr(&mut h);
    // Step 5.
    for c in [out_csr, in_csr] {
        h.free(c.index);
        h.free(c.neighbors);
    }
    // Step 6.
    let scores = h.touch(4.0 * n);
    let contrib = h.touch(4.0 * n);
    GapFirstTouch {
        shares: GapFastShares {
            offsets: sq_in.index.fast_share(),
            out_degree: sq_out.index.fast_share(),
            neighbors: sq_in.neighbors.fast_share(),
            scores: scores.fast_share(),
            contrib: contrib.fast_share(),
        },
        fast_bytes_outside: sq_out.neighbors.fast,
        peak_rss_bytes: h.peak,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    /// Nomad's run (`-u 26 -k 20`, 16 GB fast): the replay's peak is
    /// Nomad's reported 22 GB RSS, and every array the pull iteration
    /// reads at random (contributions) or per vertex ends in the fast tier
    /// in memory the builder freed; only part of the in-neighbors, read
    /// in sequence, spills to the slow tier.
    #[test]
    fn nomads_pagerank_run_keeps_the_gathered_arrays_fast() {
        let n = (1u64 << 26) as f64;
        let r = replay(n, 20.0 * n, 16.0 * GIB);
        let peak = r.peak_rss_bytes / GIB;
        assert!((21.0..23.0).contains(&peak), "peak {peak} GiB");
        let s = r.shares;
        assert_eq!(
            (s.offsets, s.out_degree, s.scores, s.contrib),
            (1.0, 1.0, 1.0, 1.0)
        );
        assert!((0.5..1.0).contains(&s.neighbors), "{}", s.neighbors);
        assert!((r.fast_bytes_outside / GIB - 5.0).abs() < 0.01);
    }

    /// A fast tier smaller than the edge list leaves everything built
    /// later slow; one larger than the peak leaves everything fast.
    #[test]
    fn the_fast_tier_size_decides_what_spills() {
        let n = 1e6;
        let tiny = replay(n, 20.0 * n, 1e6);
        assert_eq!(tiny.shares.contrib, 0.0);
        assert_eq!(tiny.shares.neighbors, 0.0);
        let huge = replay(n, 20.0 * n, 1e12);
        assert_eq!(huge.shares.neighbors, 1.0);
        assert_eq!(huge.fast_bytes_outside, 80e6);
    }
}
