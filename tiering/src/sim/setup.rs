//! Before a simulation runs: the scenario is checked, the modeled page
//! space and its access stream are built, and every page gets its first tier.

use tiervm_guest::gen::Rng;

use super::gap;
use super::scenario::Scenario;
use super::workload::{
    AccessStream, BenchInitStream, GaussianHotStream, GupsStream, KvStream, MovingHotStream,
    PageAccess, PagerankStream, WorkloadSpec, WssStream,
};
use super::{ScenarioError, SimError};
use crate::policy::{PolicyConfig, TierId, PAGE_SIZE};

/// Fraction of each tier left free at start (as Linux keeps watermarks).
pub const INITIAL_FREE_FRACTION: f64 = 0.004;

/// Where the simulator's pages start (the live backing's initial
/// placement is `mem::InitialPlacement`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SimPlacement {
    /// Fill tiers fastest first in address order (first touch), or slowest
    /// first when the scenario starts with every page demoted.
    FirstTouch,
    /// GUPS only: this share of the hot set in tier 0, the rest of tier 0
    /// filled with cold pages (Colloid's best-case static split).
    HotShare(f64),
}

/// The access stream of a run.
pub(super) enum Stream {
    Zipf(WssStream),
    Gups(GupsStream),
    Gauss(GaussianHotStream),
    Moving(MovingHotStream),
    Kv(Box<KvStream>),
    Pagerank(PagerankStream),
    /// The micro-benchmark's memset and warm-up round ([`BenchInitStream`]).
    Init(BenchInitStream),
}

impl Stream {
    #[inline]
    pub(super) fn next(&mut self, rng: &mut Rng) -> PageAccess {
        match self {
            Self::Zipf(s) => s.next_access(rng),
            Self::Gups(s) => s.next_access(rng),
            Self::Gauss(s) => s.next_access(rng),
            Self::Moving(s) => s.next_access(rng),
            Self::Kv(s) => s.next_access(rng),
            Self::Pagerank(s) => s.next_access(rng),
            Self::Init(s) => s.next_access(rng),
        }
    }
}

/// The modeled memory when the run starts.
pub(super) struct InitialState {
    /// Real pages per modeled page.
    pub scale: f64,
    /// Modeled pages.
    pub pages: u64,
    /// Share of accesses that write (they add a write-back to the traffic).
    pub write_share: f64,
    /// Accesses per operation of the workload (1 but for kv's requests).
    pub accesses_per_op: f64,
    /// Capacity of each tier, modeled pages.
    pub cap: Vec<u64>,
    /// Each page's tier.
    pub tier: Vec<TierId>,
    /// Pages per tier.
    pub used: Vec<u64>,
    /// The accesses.
    pub stream: Stream,
}

/// Checks every scenario parameter the loop relies on.
/// Most modeled threads: the work per quantum grows with threads x mlp.
pub const MAX_THREADS: u32 = 4096;
/// Most requests in flight per thread.
pub const MAX_MLP: f64 = 1024.0;

pub(super) fn validate(scn: &Scenario) -> Result<(), ScenarioError> {
    if scn.tiers.is_empty() || scn.tiers.len() > 64 {
        return Err(ScenarioError::TierCount);
    }
    if !(scn.scale.is_finite() && scn.scale >= 1.0) {
        return Err(ScenarioError::Scale);
    }
    if !(scn.duration_s.is_finite() && scn.duration_s > 0.0 && scn.duration_s <= 1e6) {
        return Err(ScenarioError::Duration);
    }
    if let Some(r) = &scn.rounds {
        if !(r.count >= 1 && r.ops.is_finite() && r.ops >= scn.scale && r.ops <= 1e12) {
            return Err(ScenarioError::Rounds);
        }
    }
    let parallelism_ok = (1..=MAX_THREADS).contains(&scn.threads)
        && scn.mlp.is_finite()
        && scn.mlp > 0.0
        && scn.mlp <= MAX_MLP;
    if !parallelism_ok {
        return Err(ScenarioError::Parallelism);
    }
    if !(64.0..=PAGE_SIZE as f64).contains(&scn.access_bytes) {
        return Err(ScenarioError::AccessBytes);
    }
    if !(scn.compute_ns_per_op.is_finite() && (0.0..=1e9).contains(&scn.compute_ns_per_op)) {
        return Err(ScenarioError::Compute);
    }
    if !(0.0..=1.0).contains(&scn.write_ratio) {
        return Err(ScenarioError::WriteRatio);
    }
    if let Some(init) = &scn.bench_init {
        let zipf = matches!(scn.workload, WorkloadSpec::Zipf { .. });
        let fraction_ok =
            init.warmup_fraction.is_finite() && (0.0..=1.0).contains(&init.warmup_fraction);
        let sleep_ok = init.sleep_s.is_finite() && (0.0..=1e6).contains(&init.sleep_s);
        if !(zipf && fraction_ok && sleep_ok) {
            return Err(ScenarioError::BenchInit);
        }
    }
    for t in &scn.tiers {
        if !(t.capacity_gib > 0.0
            && t.unloaded_ns > 0.0
            && t.bandwidth_gbps > 0.0
            && t.queue_k >= 0.0)
        {
            return Err(ScenarioError::TierModel);
        }
    }
    let pages = scn.workload.footprint_gib() * (1u64 << 30) as f64 / PAGE_SIZE as f64 / scn.scale;
    if !(1.0..=64e6).contains(&pages) {
        return Err(ScenarioError::Footprint);
    }
    if let Some(a) = &scn.antagonist {
        if usize::from(a.tier) >= scn.tiers.len() || !(0.0..1.0).contains(&a.utilization) {
            return Err(ScenarioError::Antagonist);
        }
    }
    Ok(())
}

/// Builds the page space, the stream and the first placement of `scn`.
pub(super) fn initial_state(
    scn: &Scenario,
    placement: SimPlacement,
) -> Result<InitialState, SimError> {
    let scale = scn.workload.effective_scale(scn.scale);
    let gib_pages = |g: f64| gib_to_pages(g, scale);
    // kv and pagerank run a scaled-down instance of the guest workload
    // whose own layout defines the modeled page space.
    let guest_stream = guest_stream(scn, scale)?;
    let pages = match &guest_stream {
        Some(Stream::Kv(k)) => k.pages(),
        Some(Stream::Pagerank(g)) => g.pages(),
        _ => gib_pages(scn.workload.footprint_gib()).max(1),
    };
    // Writes add a write-back to the bandwidth model: the guest workloads'
    // own write share, else the scenario's. An operation is one access but
    // in kv, whose requests take several.
    let (write_share, accesses_per_op) = match &guest_stream {
        Some(Stream::Kv(k)) => {
            let (writes, per_op) = k.op_shape(4096);
            (writes, per_op.max(1.0))
        }
        Some(Stream::Pagerank(g)) => (g.write_fraction(), 1.0),
        _ => (scn.write_ratio.clamp(0.0, 1.0), 1.0),
    };
    let mut cap: Vec<u64> = scn
        .tiers
        .iter()
        .map(|t| gib_pages(t.capacity_gib))
        .collect();
    // PageRank placed as GAPBS's build leaves it (first touch, freed
    // memory reused): which pages start fast, and the fast memory held by
    // GAP's arrays outside the modeled layout.
    let gap = match (&guest_stream, placement) {
        (Some(Stream::Pagerank(g)), SimPlacement::FirstTouch) if !scn.start_in_slow_tier => {
            gap_fast_pages(scn, g, scale)
        }
        _ => None,
    };
    if let (Some((_, outside)), Some(c0)) = (&gap, cap.first_mut()) {
        *c0 = c0.saturating_sub(*outside);
    }
    let mut fill: Vec<u64> = cap
        .iter()
        .map(|&c| c - ((c as f64 * INITIAL_FREE_FRACTION).ceil() as u64).min(c))
        .collect();
    if fill.iter().sum::<u64>() < pages {
        return Err(SimError::DoesNotFit {
            footprint_gib: scn.workload.footprint_gib(),
            tiers_gib: scn.tiers.iter().map(|t| t.capacity_gib).sum(),
        });
    }
    let stream = match guest_stream {
        Some(g) => g,
        None => synthetic_stream(scn, scale, pages)?,
    };
    let order = match &gap {
        Some((fast, _)) => {
            let n_fast = fast.iter().filter(|&&f| f).count() as u64;
            fill[0] = fill[0].min(n_fast);
            let pick = |want: bool| (0..pages).filter(move |&p| fast[p as usize] == want);
            pick(true).chain(pick(false)).collect()
        }
        None => placement_order(placement, &stream, pages, fill[0]),
    };
    let (tier, used) = fill_tiers(&order, &fill, pages, scn.start_in_slow_tier);
    Ok(InitialState {
        scale,
        pages,
        write_share,
        accesses_per_op,
        cap,
        tier,
        used,
        stream,
    })
}

/// The stream of the micro-benchmark's memset and warm-up round
/// ([`super::scenario::BenchInit`]) over the run's `pages` modeled pages, or
/// `None` if the scenario has none. The warm-up trace's pages are the
/// first `rss - wss` of the RSS (the measured trace's follow them), or the
/// WSS itself when the two are equal (27G: the measured trace is the
/// warm-up trace, the same pages with the same hotness).
pub(super) fn bench_init_stream(scn: &Scenario, scale: f64, pages: u64) -> Option<Stream> {
    scn.bench_init.as_ref()?;
    let WorkloadSpec::Zipf {
        rss_gib,
        wss_gib,
        theta,
        ref ycsb_trace,
    } = scn.workload
    else {
        return None;
    };
    let wss = gib_to_pages(wss_gib.min(rss_gib), scale).clamp(1, pages);
    let warmup_pages = if pages > wss { pages - wss } else { wss };
    let warmup = WssStream::new(0, warmup_pages, theta, ycsb_trace.as_ref(), 1.0);
    Some(Stream::Init(BenchInitStream::new(
        pages,
        // One access per `access_bytes` of each page (a 64-byte line, or
        // the whole page when an access is a 4 KiB `memcpy`).
        (PAGE_SIZE as f64 / scn.access_bytes).round().max(1.0) as u64,
        warmup,
    )))
}

/// The policy configuration of a run.
pub(super) fn policy_config(scn: &Scenario, start: &InitialState) -> PolicyConfig {
    PolicyConfig {
        pages: start.pages,
        tier_capacity_pages: start.cap.clone(),
        scale: start.scale,
        promote_rate_limit_mbps: scn.promote_rate_limit_mbps,
        interval_ns: None,
        accessed_test_cost_ns: None,
        huge_pages: scn.huge_pages,
        transparent_huge_pages: scn.transparent_huge_pages,
        free_reserve_fraction: scn.free_reserve_fraction,
        // The model charges TPM per page; no memslot-wide log cost.
        dirty_log_costly: false,
        // Nor the cost of a split huge mapping.
        huge_split_costly: false,
    }
}

/// Real GiB in modeled pages.
fn gib_to_pages(gib: f64, scale: f64) -> u64 {
    ((gib * (1u64 << 30) as f64 / PAGE_SIZE as f64) / scale).round() as u64
}

/// The kv or pagerank stream, for scenarios of a guest workload.
fn guest_stream(scn: &Scenario, scale: f64) -> Result<Option<Stream>, ScenarioError> {
    Ok(if let Some(p) = scn.workload.kv_params_at(scale) {
        Some(Stream::Kv(Box::new(KvStream::new(&p))))
    } else if let Some(p) = scn.workload.pagerank_params_at(scale) {
        Some(Stream::Pagerank(PagerankStream::new(&p, scn.seed)?))
    } else {
        None
    })
}

/// The zipf, GUPS or Gaussian stream over `pages` modeled pages.
fn synthetic_stream(scn: &Scenario, scale: f64, pages: u64) -> Result<Stream, ScenarioError> {
    let mut layout_rng = Rng::for_stream(scn.seed, 1);
    let gib_pages = |g: f64| gib_to_pages(g, scale);
    Ok(match scn.workload {
        WorkloadSpec::Kv { .. } | WorkloadSpec::Pagerank { .. } => {
            return Err(ScenarioError::GuestStream)
        }
        WorkloadSpec::Zipf {
            rss_gib,
            wss_gib,
            theta,
            ref ycsb_trace,
        } => {
            let wss = gib_pages(wss_gib.min(rss_gib)).clamp(1, pages);
            Stream::Zipf(WssStream::new(
                pages - wss,
                wss,
                theta,
                ycsb_trace.as_ref(),
                scn.write_ratio,
            ))
        }
        WorkloadSpec::Gups {
            hot_gib, hot_prob, ..
        } => Stream::Gups(GupsStream::new(
            pages,
            gib_pages(hot_gib),
            hot_prob,
            scn.write_ratio,
            layout_rng.next_u64(),
        )),
        WorkloadSpec::GaussianHot {
            hot_fraction,
            hot_prob,
            ..
        } => Stream::Gauss(GaussianHotStream::new(
            pages,
            ((pages as f64 * hot_fraction) as u64).max(1),
            hot_prob,
            scn.write_ratio,
        )),
        WorkloadSpec::MovingHot {
            hot_gib,
            hot_prob,
            move_every_s,
            ..
        } => {
            // Simulated accesses per modeled second at unloaded fast-tier
            // latency and half of it: the period is approximate.
            let fastest = scn
                .tiers
                .iter()
                .map(|t| t.unloaded_ns)
                .fold(f64::INFINITY, f64::min)
                .max(1.0);
            let rate = f64::from(scn.threads) * scn.mlp / (1.5 * fastest) * 1e9 / scale;
            Stream::Moving(MovingHotStream::new(
                pages,
                gib_pages(hot_gib),
                hot_prob,
                scn.write_ratio,
                (rate * move_every_s.max(0.0)).round() as u64,
            ))
        }
    })
}

/// The pages of a PageRank stream that start in the fast tier after
/// GAPBS's build ([`gap::replay`] on the real graph and fast tier), and
/// the modeled pages the resident arrays outside the layout hold there:
/// 1. replay GAPBS's allocations at the scenario's real size, giving each
///    array's fast share;
/// 2. an array's pages were first written by `threads` threads, each in
///    order through an equal contiguous block (OpenMP `parallel for`
///    without a schedule clause, as in `GenIndex` and `SquishCSR`'s copy,
///    gapbs `src/graph.h:245`, `src/builder.h:162`; [inferred] the static
///    schedule is libgomp's default), so the fast share of each block
///    is its first pages;
/// 3. the fast bytes outside the layout become modeled pages.
///
/// `None` unless the workload is PageRank.
fn gap_fast_pages(scn: &Scenario, g: &PagerankStream, scale: f64) -> Option<(Vec<bool>, u64)> {
    let WorkloadSpec::Pagerank {
        scale: log_v,
        degree,
        ..
    } = scn.workload
    else {
        return None;
    };
    let n = 2f64.powi(log_v.min(63) as i32);
    let fast_bytes = scn.tiers.first()?.capacity_gib * (1u64 << 30) as f64;
    let r = gap::replay(n, n * degree as f64, fast_bytes);
    let l = g.layout();
    let pg = |b: u64| b / PAGE_SIZE as u64;
    let arrays = [
        (l.offsets_off, l.out_degree_off, r.shares.offsets),
        (l.out_degree_off, l.neighbors_off, r.shares.out_degree),
        (l.neighbors_off, l.scores_off, r.shares.neighbors),
        (l.scores_off, l.contrib_off, r.shares.scores),
        (l.contrib_off, l.bytes, r.shares.contrib),
    ];
    let mut fast = vec![false; g.pages() as usize];
    let threads = u64::from(scn.threads.max(1));
    for (from, to, share) in arrays {
        let (from, to) = (pg(from), pg(to).min(g.pages()));
        let len = to.saturating_sub(from);
        for b in 0..threads {
            let (s, e) = (from + len * b / threads, from + len * (b + 1) / threads);
            let k = ((e - s) as f64 * share.clamp(0.0, 1.0)).round() as u64;
            for p in s..s + k {
                if let Some(f) = fast.get_mut(p as usize) {
                    *f = true;
                }
            }
        }
    }
    let outside = (r.fast_bytes_outside / PAGE_SIZE as f64 / scale).round() as u64;
    Some((fast, outside))
}

/// The order in which pages take the free slots of the tiers: address
/// order, or for [`SimPlacement::HotShare`] on GUPS the chosen hot
/// pages and cold filler for tier 0, then the remaining hot pages, then
/// the remaining cold pages.
fn placement_order(
    placement: SimPlacement,
    stream: &Stream,
    pages: u64,
    fast_fill: u64,
) -> Vec<u64> {
    let (SimPlacement::HotShare(share), Stream::Gups(g)) = (placement, stream) else {
        return (0..pages).collect();
    };
    let hot: Vec<u64> = g.hot_pages().collect();
    let k = ((hot.len() as f64 * share.clamp(0.0, 1.0)).round() as usize).min(fast_fill as usize);
    let mut is_hot = vec![false; pages as usize];
    for &h in &hot {
        is_hot[h as usize] = true;
    }
    let cold: Vec<u64> = (0..pages).filter(|&p| !is_hot[p as usize]).collect();
    let filler = (fast_fill as usize).saturating_sub(k).min(cold.len());
    let mut order = hot[..k].to_vec();
    order.extend_from_slice(&cold[..filler]);
    order.extend_from_slice(&hot[k..]);
    order.extend_from_slice(&cold[filler..]);
    order
}

/// Places pages in `order` into the tiers up to `fill` pages each:
/// fastest tier first, or slowest first when the scenario starts with every
/// page demoted (Nomad's Redis cases 1 and 2). Returns each page's tier and
/// the pages per tier.
fn fill_tiers(
    order: &[u64],
    fill: &[u64],
    pages: u64,
    slow_first: bool,
) -> (Vec<TierId>, Vec<u64>) {
    let n = fill.len();
    let mut tier = vec![0 as TierId; pages as usize];
    let mut used = vec![0u64; n];
    let tier_order: Vec<usize> = if slow_first {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    let mut ti = 0usize;
    for &p in order {
        while used[tier_order[ti]] >= fill[tier_order[ti]] {
            ti += 1;
        }
        let t = tier_order[ti];
        tier[p as usize] = t as TierId;
        used[t] += 1;
    }
    (tier, used)
}
