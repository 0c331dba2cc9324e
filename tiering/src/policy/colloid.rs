//! `colloid`: Colloid (SOSP'24) Algorithms 1-2 over a HeMem-style base tracker.
//!
//! Each quantum ([`QUANTUM_NS`], HeMem's 10 ms):
//! 1. read the loaded latencies `L_D`, `L_A` and request rates `R_D`, `R_A`
//!    of the default tier (0) and the alternate tier (1) from
//!    [`TierStatus`] (the latency source is the engine's business: modeled
//!    in the simulator, CHA counters where a host has them);
//!    `p = R_D / (R_D + R_A)`;
//! 2. mode = promotion if `L_D < L_A`, else demotion;
//! 3. `dp` = [`ShiftSearch::compute_shift`] (binary search with watermarks);
//! 4. FindPages, at most `min(dp * (R_D + R_A) * quantum * 64 B, M)` bytes,
//!    never more than the destination has free, with each page's access
//!    probability `count / total`:
//!    - on HeMem's 2 MiB pages ([`Grain::huge`]), as the public
//!      HeMem+Colloid code does: scan-and-sort and page-pair swaps, each
//!      swap the pair with the largest probability difference that fits
//!      in the remaining `dp` (see [`Colloid::swap_pages`]);
//!    - on 4 KiB pages, as the paper describes Colloid on HeMem (§4.1):
//!      hottest pages first (5 equal frequency bins over
//!      `[0, cooling threshold]`, the grain's [`Counting::cooling_threshold`]),
//!      each page's probability must fit in the remaining `dp`
//!      (see [`Colloid::move_pages`]);
//! 5. migrate (background stop-and-copy).
//!
//! The base tracker counts sampled accesses per page and halves all counts
//! when one passes the grain's cooling threshold (HeMem's
//! `PEBS_COOLING_THRESHOLD`: [`COOLING_THRESHOLD`] for 4 KiB pages,
//! [`HEMEM_COOLING_THRESHOLD`] for 2 MiB ones). On 4 KiB pages a promotion
//! into a full default tier first demotes a cold page to make room, and
//! the default tier keeps a small free reserve; on 2 MiB pages the pair
//! swaps do both, and there is no reserve (the public code keeps none).
//! Only tiers 0 and 1 take part (the paper evaluates two tiers).
//!
//! `colloid-base` ([`Colloid::base`]) is HeMem's own placement, the
//! baseline of Colloid's evaluation, on the same tracker: a page is hot
//! once its count reaches the grain's hot threshold (HeMem's
//! `HOT_READ_THRESHOLD`); each quantum hot alternate-tier pages are
//! promoted in the order they became hot, into a free default-tier page or
//! in place of a demoted default-tier page below the threshold, until none
//! is left, the hot list is empty or [`HEMEM_MIGRATE_RATE_MB`] is reached
//! (see [`Colloid::base`]).
//!
//! The tracker's page is HeMem's when the platform maps 2 MiB pages
//! ([`PolicyConfig::huge_pages`], the Colloid scenarios): HeMem samples,
//! counts and migrates 2 MiB pages ([`PAGES_PER_2M`]) at its own PEBS
//! period ([`HEMEM_SAMPLE_PERIOD`]); see [`Grain`]. Otherwise it tracks
//! 4 KiB pages with a 199-access period.

use std::collections::{HashSet, VecDeque};

use super::hotness::{ClockHand, SampleCounts};
use super::types::*;
use super::{Policy, PolicyKind};

/// Quantum: HeMem's 10 ms migration-thread period (Colloid §4.1).
pub const QUANTUM_NS: u64 = 10_000_000;
/// Watermark reset gap `epsilon` (Colloid §5, evaluation value).
pub const EPSILON: f64 = 0.01;
/// Latency balance tolerance `delta` (Colloid §5, evaluation value).
pub const DELTA: f64 = 0.05;
/// Static per-quantum migration limit M: 50 x 2 MB (webglider/hemem
/// branch sosp24ae, pebs.c `pebs_policy_thread`: `migrate_limit = (50 *
/// PAGE_SIZE)`, with `PAGE_SIZE` 2 MiB).
pub const STATIC_LIMIT_MB: f64 = 100.0;
/// Bytes per request (one cache line) for the dynamic limit (same pebs.c:
/// `dlimit = target_delta * (inserts_local + inserts_remote) *
/// NUM_CHA_BOXES * 64`).
pub const REQUEST_BYTES: f64 = 64.0;
/// HeMem `PEBS_COOLING_THRESHOLD` (cuhk-mass/hemem pebs.h): counts halve
/// when a page reaches it (4 KiB tracking). HeMem halves when a count
/// exceeds it (pebs.c `>`), as the 2 MiB grain does with
/// [`HEMEM_COOLING_THRESHOLD`]; the 4 KiB grain keeps `>=` (one sample
/// sooner), which its published tables were run with.
pub const COOLING_THRESHOLD: u16 = 10;
/// `PEBS_COOLING_THRESHOLD` of the HeMem Colloid evaluated (webglider/hemem
/// sosp24ae pebs.h): counts halve when a 2 MiB page's count exceeds it.
pub const HEMEM_COOLING_THRESHOLD: u16 = 18;
/// HeMem's hot threshold for 4 KiB tracking: `HOT_READ_THRESHOLD` (4, as
/// `HOT_WRITE_THRESHOLD`) in cuhk-mass/hemem pebs.h, the HeMem whose
/// [`COOLING_THRESHOLD`] the 4 KiB grain uses. A page with this many
/// samples is hot (`colloid-base` promotes it); below it, cold.
pub const HOT_THRESHOLD: u16 = 4;
/// `HOT_READ_THRESHOLD` of the HeMem Colloid evaluated (webglider/hemem
/// pebs.h, branch sosp24ae, and branch baseline-sosp24ae, the HeMem the
/// artifact runs as its baseline): a 2 MiB page with 8 sampled loads is
/// hot (pebs.c `pebs_scan_thread`: `accesses[DRAMREAD] +
/// accesses[NVMREAD] >= HOT_READ_THRESHOLD` makes a hot request, below it
/// a cold one).
pub const HEMEM_HOT_THRESHOLD: u16 = 8;
/// HeMem's per-quantum promotion limit: `PEBS_KSWAPD_MIGRATE_RATE`, 10 GB
/// per `PEBS_KSWAPD_INTERVAL` (10 ms) of promoted pages (pebs.h of
/// webglider/hemem sosp24ae and baseline-sosp24ae, and of cuhk-mass/hemem;
/// pebs.c `pebs_policy_thread` counts only promotions against it).
pub const HEMEM_MIGRATE_RATE_MB: f64 = 10.0 * 1024.0;
/// FindPages frequency bins over `[0, cooling threshold]` (Colloid §4.1),
/// for 4 KiB tracking ([`Colloid::move_pages`]). The public code on 2 MiB
/// pages has no bins (`HISTOGRAM` off, `SCAN_AND_SORT` on: pebs.h of
/// webglider/hemem sosp24ae).
pub const FIND_BINS: usize = 5;
/// Access sampling period (modeled PEBS stand-in; same as Memtis's 199),
/// for 4 KiB tracking.
pub const SAMPLE_PERIOD: u64 = 199;
/// HeMem's PEBS sample period (`SAMPLE_PERIOD` 5003, pebs.h of the same
/// HeMem): one load in 5003 is sampled, and its sample counts for the
/// 2 MiB page it falls in.
pub const HEMEM_SAMPLE_PERIOD: u64 = 5003;

/// How the tracker counts its tracked pages (the [`Grain`]): sampled once
/// per `sample_period` modeled accesses, counts halved when one reaches
/// `cools_at`.
///
/// A 2 MiB HeMem page is [`Grain`]'s `512 / scale` modeled pages, and it
/// must see the samples a real HeMem page sees (512 real pages' accesses,
/// one in [`HEMEM_SAMPLE_PERIOD`]), so the modeled period is
/// `unit_pages * 5003 / 512` (about 10 at scale >= 512, 5003 at scale 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counting {
    /// Engine sample period (modeled accesses per sample).
    pub sample_period: u64,
    /// The cooling threshold (FindPages' bins span `[0, cooling_threshold]`).
    pub cooling_threshold: u16,
    /// Counts halve when one reaches this.
    pub cools_at: u16,
    /// HeMem's hot threshold: a page with this count or more is hot
    /// (`colloid-base` promotes only hot pages and demotes only cold ones).
    pub hot_threshold: u16,
}

/// The grain and counting for `config`: HeMem's 2 MiB pages if the platform
/// maps them, else 4 KiB pages.
pub fn grain_for(config: &PolicyConfig) -> (Grain, Counting) {
    let grain = Grain::new(config, config.huge_pages);
    (grain, Counting::for_grain(config, grain))
}

impl Counting {
    /// The counting of tracked pages of `grain`.
    pub fn for_grain(config: &PolicyConfig, grain: Grain) -> Self {
        if !grain.huge {
            return Self {
                sample_period: SAMPLE_PERIOD,
                cooling_threshold: COOLING_THRESHOLD,
                // At the threshold, where HeMem halves above it (`>`, as
                // the 2 MiB grain does): kept because HeMem's `>` moves the
                // 4 KiB results tables (nomad-* colloid by up to 1.2%).
                cools_at: COOLING_THRESHOLD,
                hot_threshold: HOT_THRESHOLD,
            };
        }
        // HeMem's page: 2 MiB (`PAGE_SIZE = HUGEPAGE_SIZE`, hemem.h of the
        // HeMem Colloid evaluated, webglider/hemem branch sosp24ae).
        Self {
            sample_period: grain.sample_period(config, HEMEM_SAMPLE_PERIOD),
            cooling_threshold: HEMEM_COOLING_THRESHOLD,
            // pebs.c: `if (page->accesses[j] > PEBS_COOLING_THRESHOLD)`.
            cools_at: HEMEM_COOLING_THRESHOLD + 1,
            hot_threshold: HEMEM_HOT_THRESHOLD,
        }
    }
}
/// Free pages kept in the default tier (fraction; as Memtis/TPP's 0.4%).
pub const FREE_RESERVE_FRACTION: f64 = 0.004;

/// Algorithm 2: the binary search for the default tier's share `p`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShiftSearch {
    /// Low watermark.
    pub p_lo: f64,
    /// High watermark.
    pub p_hi: f64,
}

impl Default for ShiftSearch {
    fn default() -> Self {
        Self {
            p_lo: 0.0,
            p_hi: 1.0,
        }
    }
}

impl ShiftSearch {
    /// ComputeShift(p, L_D, L_A): the magnitude of the desired change of `p`.
    pub fn compute_shift(&mut self, p: f64, l_d: f64, l_a: f64) -> f64 {
        // Equal latencies are balanced even where `DELTA * l_d` is no
        // tolerance at all (both 0: tiers a latency source reports idle);
        // Algorithm 2's test alone would take them for a slower default
        // tier and demote.
        if l_d == l_a || (l_d - l_a).abs() < DELTA * l_d {
            return 0.0;
        }
        if l_d < l_a {
            self.p_lo = p;
        } else {
            self.p_hi = p;
        }
        if self.p_hi < self.p_lo + EPSILON {
            if l_d < l_a {
                self.p_hi = 1.0;
            } else {
                self.p_lo = 0.0;
            }
        }
        ((self.p_lo + self.p_hi) / 2.0 - p).abs()
    }
}

/// The `colloid` policy.
#[derive(Clone, Debug)]
pub struct Colloid {
    search: ShiftSearch,
    /// Sample counts per tracked page (index: first modeled page / grain).
    counts: SampleCounts,
    /// Tracked pages with a count, by index.
    tracked: Vec<u64>,
    is_tracked: Vec<bool>,
    grain: Grain,
    counting: Counting,
    pages: u64,
    hand: ClockHand,
    scale: f64,
    static_limit_pages: u64,
    reserve: u64,
    quantum_ns: u64,
    last_dp: f64,
    base_only: bool,
    limit_carry: f64,
    /// `colloid-base`: HeMem's `page->hot` per tracked page (on a hot list).
    hot: Vec<bool>,
    /// `colloid-base`: HeMem's hot requests in the order the pages became
    /// hot (its `nvm_hot_list`; entries that sit in the default tier are
    /// dropped when reached, as `pebs_policy_thread` does). HeMem's lists
    /// are intrusive, so a page is on one at most once: see `queued`.
    hot_queue: VecDeque<u64>,
    /// `colloid-base`: the tracked page is in `hot_queue`. A page that
    /// cools leaves the queue (HeMem moves it to a cold list), so one that
    /// heats again is queued once, at the back.
    queued: Vec<bool>,
    /// `colloid-base`: [`HEMEM_MIGRATE_RATE_MB`] in modeled pages.
    hemem_limit_pages: u64,
}

/// The quantum's shift: move `dp` of the requests (at `total_rate`
/// requests per second) from tier `src` to tier `dst`.
struct Shift {
    dp: f64,
    total_rate: f64,
    /// Towards the default tier.
    promote: bool,
    src: TierId,
    dst: TierId,
}

/// One side of a page pair in the scan-and-sort search
/// ([`Colloid::swap_pages`]): a tracked page with a count, or, with `unit`
/// `None`, the tier's pages with count 0 (pebs.c lists every mapped page,
/// so a tier holding an unsampled page offers count 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PairSide {
    /// Sampled accesses (HeMem's cooled `accesses`, the sort key).
    count: u16,
    /// The tracked page, or `None` for the tier's count-0 pages.
    unit: Option<u64>,
    /// Its modeled pages in this side's tier.
    pages: u64,
}

/// The scan-and-sort search under way ([`Colloid::swap_pages`]): its
/// candidates (moved ones `None`), the destination's count-0 pages left,
/// and the modeled pages moved (both directions).
struct PairSearch {
    top: Vec<Option<PairSide>>,
    bottom: Vec<Option<PairSide>>,
    zero_pages: u64,
    moved: u64,
}

/// The pair step 3 picked: indices in `top` and `bottom`, the count
/// difference, the sides, and the `top` side's tracked page.
struct Pair {
    i: usize,
    j: usize,
    diff: u64,
    top: PairSide,
    top_unit: u64,
    bottom: PairSide,
}

/// How a pair's swap went.
enum Swap {
    /// Both sides moved (or room made): the pair leaves the candidates.
    Done,
    /// No room made for the `top` page: try the next pair.
    Skipped,
    /// A destination is full: the search stops.
    Stopped,
}

impl PairSearch {
    /// Step 3: the pair that fits in the `remaining` shift ([`best_pair`]),
    /// or `None` when there is none.
    fn best(&self, remaining: u64) -> Option<Pair> {
        let (i, j, diff) = best_pair(&self.top, &self.bottom, remaining)?;
        let (Some(Some(t)), Some(Some(b))) =
            (self.top.get(i).copied(), self.bottom.get(j).copied())
        else {
            return None;
        };
        // `top` holds tracked pages only.
        let top_unit = t.unit?;
        Some(Pair {
            i,
            j,
            diff,
            top: t,
            top_unit,
            bottom: b,
        })
    }

    /// `bottom[j]` leaves the candidates.
    fn drop_bottom(&mut self, j: usize) {
        if let Some(e) = self.bottom.get_mut(j) {
            *e = None;
        }
    }
}

/// The pair with the largest count difference `top - bottom` that is
/// positive and at most `max_diff`, as (index in `top`, index in
/// `bottom`, difference); `None` when no pair fits.
///
/// Both sides are sorted by ascending count; taken entries are `None`
/// (pebs.c sets a moved page's entry to `NULL`). As pebs.c's two-pointer
/// scan (webglider/hemem sosp24ae, `pebs_policy_thread`, "Find best pair
/// of pages using two pointers"):
/// 1. for each `top` entry, coldest first, advance the `bottom` pointer
///    past entries the `top` entry exceeds by more than `max_diff` (the
///    pointer never moves back: a hotter `top` entry exceeds them too);
/// 2. the entry it stops at is the coldest `bottom` entry within
///    `max_diff`, so the largest difference for this `top` entry; keep it
///    if positive and larger than the best so far (the first pair found
///    wins a tie);
/// 3. the best over all `top` entries is the pair.
fn best_pair(
    top: &[Option<PairSide>],
    bottom: &[Option<PairSide>],
    max_diff: u64,
) -> Option<(usize, usize, u64)> {
    let mut best: Option<(usize, usize, u64)> = None;
    let max_diff = i64::try_from(max_diff).unwrap_or(i64::MAX);
    let mut j = 0;
    for (i, t) in top.iter().enumerate() {
        let Some(t) = t else {
            continue;
        };
        while let Some(b) = bottom.get(j) {
            let Some(b) = b else {
                j += 1;
                continue;
            };
            let diff = i64::from(t.count) - i64::from(b.count);
            if diff <= max_diff {
                if diff > 0 && best.is_none_or(|(_, _, d)| diff as u64 > d) {
                    best = Some((i, j, diff as u64));
                }
                break;
            }
            j += 1;
        }
    }
    best
}

/// The decisions of one quantum being built.
struct Moves<'a> {
    budget: &'a mut FreeBudget,
    out: &'a mut Decisions,
    /// Tracked pages (indices) already moved this quantum.
    chosen: &'a mut HashSet<u64>,
}

impl Colloid {
    /// Step 2: the share of requests to move, and where, or `None` when
    /// nothing should move (no requests, or the tiers are balanced).
    fn shift(&mut self, tiers: &[TierStatus]) -> Option<Shift> {
        let (d, a) = (tiers[0], tiers[1]);
        let rates = (
            d.request_rate.unwrap_or(0.0).max(0.0),
            a.request_rate.unwrap_or(1.0).max(0.0),
        );
        let (l_d, l_a, r_d, r_a) = match (d.loaded_latency_ns, a.loaded_latency_ns) {
            (Some(ld), Some(la)) => (ld, la, rates.0, rates.1),
            // No latency source: pack the default tier.
            _ => (0.0, 1.0, rates.0, rates.1),
        };
        let total = r_d + r_a;
        if total <= 0.0 {
            return None;
        }
        let p = r_d / total;
        let dp = self.search.compute_shift(p, l_d, l_a);
        self.last_dp = dp;
        if dp <= 0.0 {
            return None;
        }
        let promote = l_d < l_a;
        let (src, dst) = if promote { (1, 0) } else { (0, 1) };
        Some(Shift {
            dp,
            total_rate: total,
            promote,
            src,
            dst,
        })
    }

    /// Step 3: the dynamic limit in (scaled) pages; a fraction carries over
    /// so a low request rate still moves pages now and then.
    fn page_limit(&mut self, shift: &Shift) -> u64 {
        let dyn_pages =
            shift.dp * shift.total_rate * (self.quantum_ns as f64 / 1e9) * REQUEST_BYTES
                / PAGE_SIZE as f64
                / self.scale
                + self.limit_carry;
        if dyn_pages < 0.0 {
            // Still paying off an earlier quantum's excess (`swap_pages`).
            self.limit_carry = dyn_pages;
            return 0;
        }
        let limit = (dyn_pages.floor() as u64).min(self.static_limit_pages);
        self.limit_carry = if limit < self.static_limit_pages {
            dyn_pages - dyn_pages.floor()
        } else {
            0.0
        };
        limit
    }

    /// The tracked page holding modeled page `page`.
    fn unit_of(&self, page: u64) -> u64 {
        page / self.grain.unit_pages
    }

    /// The modeled pages of tracked page `unit` (the last one may be short).
    fn unit_run(&self, unit: u64) -> Unit {
        let start = unit * self.grain.unit_pages;
        let len = self.grain.unit_pages.min(self.pages.saturating_sub(start));
        Unit::run(start, len as u32)
    }

    /// The migration of tracked page `unit` to `to` (background stop-and-copy).
    fn migration(&self, unit: u64, to: TierId) -> Migration {
        Migration {
            unit: self.unit_run(unit),
            to,
            mechanism: Mechanism::StopAndCopy,
            urgency: Urgency::Background,
        }
    }

    /// Modeled pages of `unit` in `tier` (what moving it takes from `tier`).
    fn pages_in(&self, view: &dyn MemoryView, unit: u64, tier: TierId) -> u64 {
        let run = self.unit_run(unit);
        (run.page..run.end())
            .filter(|&p| view.tier_of(p) == tier)
            .count() as u64
    }

    /// Step 4: up to `limit` pages of the source tier, from the highest
    /// frequency bin down, each only if its access probability fits in
    /// what is left of the shift (promotions first make room in the
    /// default tier by demoting a cold page, as HeMem does).
    fn move_pages(
        &mut self,
        view: &mut dyn MemoryView,
        shift: &Shift,
        limit: u64,
        moves: &mut Moves<'_>,
    ) {
        let total_count = self.counts.total().max(1) as f64;
        // (tracked page, its modeled pages in the source tier): a 2 MiB
        // page split across the tiers is a candidate if any of it is in
        // the source tier, as in `hemem_placement` (the view does not
        // change during a tick).
        let mut bins: Vec<Vec<(u64, u64)>> = vec![Vec::new(); FIND_BINS];
        for &u in &self.tracked {
            if moves.chosen.contains(&u) {
                continue;
            }
            let n = self.pages_in(view, u, shift.src);
            if n > 0 {
                bins[self.freq_bin(self.counts.count(u))].push((u, n));
            }
        }
        let mut remaining = shift.dp;
        let mut moved = 0u64;
        'bins: for bin in bins.iter_mut().rev() {
            bin.sort_unstable();
            for &(u, n) in bin.iter() {
                // Tested before a page is added, so the last page may pass
                // the limit by up to one tracked page less a modeled page:
                // Colloid's HeMem (pebs.c, `for(migrated_bytes = 0;
                // migrated_bytes < migrate_limit;)`) moves a whole 2 MiB
                // page while under the limit, also when the limit is below
                // 2 MiB.
                if moved >= limit {
                    break 'bins;
                }
                let prob = f64::from(self.counts.count(u)) / total_count;
                if prob > remaining {
                    continue;
                }
                if shift.promote && !self.make_room(view, self.reserve + n, 1, moves) {
                    break 'bins;
                }
                if !moves.budget.take(shift.dst, n) {
                    break 'bins;
                }
                moves.budget.release(shift.src, n);
                moves.chosen.insert(u);
                remaining -= prob;
                moved += n;
                moves.out.migrations.push(self.migration(u, shift.dst));
            }
        }
    }

    /// Records migration of tracked page `unit` (`pages` of its modeled
    /// pages) from `from` to `to`; false, and nothing recorded, if `to`
    /// has no room for them.
    fn move_unit(
        &self,
        unit: u64,
        pages: u64,
        from: TierId,
        to: TierId,
        moves: &mut Moves<'_>,
    ) -> bool {
        if !moves.budget.take(to, pages) {
            return false;
        }
        moves.budget.release(from, pages);
        moves.chosen.insert(unit);
        moves.out.migrations.push(self.migration(unit, to));
        true
    }

    /// Step 4 on HeMem's 2 MiB pages: the public HeMem+Colloid code's
    /// FindPages (webglider/hemem branch sosp24ae, pebs.c
    /// `pebs_policy_thread` under `SCAN_AND_SORT`; `COLLOID_BINSEARCH` is
    /// off there, so only the page search follows it, not its `dp`).
    /// Moves pages until `limit` modeled pages have moved, counting both
    /// directions (a swap is two pages):
    /// 1. scan: every tracked page of the source tier is a `top`
    ///    candidate, every other tracked page of the destination tier a
    ///    `bottom` one, with its count; the destination's pages with count
    ///    0 are one more `bottom` candidate (pebs.c lists all mapped pages
    ///    of both tiers, sampled or not). Sort both by count;
    /// 2. the remaining shift in counts is `dp * total count`
    ///    (`target_delta`, probabilities `count / total`);
    /// 3. while under the limit: pick the pair with the largest count
    ///    difference `top - bottom` that is positive and fits in the
    ///    remaining shift ([`best_pair`]); stop if there is none;
    /// 4. promotion (`top` alternate, `bottom` default): a count-0 `bottom`
    ///    takes the `top` page into free default-tier space if there is
    ///    any, else is demoted first (pebs.c: "No point in swapping 0 freq
    ///    page if there are free pages"; here [`Colloid::make_room`]
    ///    demotes a count-0 page the CLOCK hand finds); any other `bottom`
    ///    page is demoted, then the `top` page promoted in its place;
    /// 5. demotion (`top` default, `bottom` alternate): the `top` page is
    ///    demoted; the `bottom` page, unless count 0, promoted in its place
    ///    ("No point in moving 0 freq page");
    /// 6. the moved pages leave the candidates; the pair's difference
    ///    comes off the remaining shift.
    ///
    /// So with `L_D < L_A` an alternate-tier page is promoted only in place
    /// of a default-tier page with a lower count: an unsampled page is
    /// never promoted, and a default tier whose pages all have higher
    /// counts than every alternate-tier page takes nothing. Deviations:
    /// the pebs.c loop may pass its byte limit by up to one pair per
    /// quantum; here the excess is carried into the next quanta's limit,
    /// so the modeled rate is the dynamic limit's (a modeled page can be
    /// many HeMem pages). Ties in count are broken by tracked page index
    /// (pebs.c: `qsort`'s order).
    fn swap_pages(
        &mut self,
        view: &mut dyn MemoryView,
        shift: &Shift,
        tiers: &[TierStatus],
        limit: u64,
        moves: &mut Moves<'_>,
    ) {
        let total = self.counts.total();
        if total == 0 {
            return; // pebs.c: "total_accesses=0 exit"
        }
        // Step 1.
        let mut pairs = self.pair_candidates(view, shift, tiers, moves);
        // Step 2.
        let mut remaining = (shift.dp * total as f64).floor().max(0.0) as u64;
        // Step 3.
        while pairs.moved < limit {
            let Some(pair) = pairs.best(remaining) else {
                break;
            };
            let swapped = if shift.promote {
                // Step 4.
                self.swap_up(view, &mut pairs, &pair, moves)
            } else {
                // Step 5.
                self.swap_down(&mut pairs, &pair, moves)
            };
            match swapped {
                Swap::Done => {}
                Swap::Skipped => continue,
                Swap::Stopped => break,
            }
            // Step 6.
            if let Some(e) = pairs.top.get_mut(pair.i) {
                *e = None;
            }
            remaining -= pair.diff;
        }
        // The excess over the limit comes off the next quanta's limits.
        if pairs.moved > limit {
            self.limit_carry -= (pairs.moved - limit) as f64;
        }
    }

    /// Step 1 of [`Self::swap_pages`]: the `top` and `bottom` candidates,
    /// sorted by count, and the destination's pages with count 0.
    fn pair_candidates(
        &self,
        view: &dyn MemoryView,
        shift: &Shift,
        tiers: &[TierStatus],
        moves: &Moves<'_>,
    ) -> PairSearch {
        let mut top = Vec::new();
        let mut bottom = Vec::new();
        let mut counted_in_dst = 0u64;
        for &u in &self.tracked {
            let count = self.counts.count(u);
            if count == 0 || moves.chosen.contains(&u) {
                continue;
            }
            let in_dst = self.pages_in(view, u, shift.dst);
            counted_in_dst += in_dst;
            let in_src = self.pages_in(view, u, shift.src);
            // A 2 MiB page split across the tiers is a candidate to move
            // (as in `move_pages`), not to make room.
            let (side, pages) = if in_src > 0 {
                (&mut top, in_src)
            } else {
                (&mut bottom, in_dst)
            };
            if pages > 0 {
                side.push(Some(PairSide {
                    count,
                    unit: Some(u),
                    pages,
                }));
            }
        }
        // The destination's pages with count 0: its resident pages less
        // those of counted tracked pages.
        let resident = tiers.get(usize::from(shift.dst)).map_or(0, |t| {
            t.capacity_pages
                .saturating_sub(t.free_pages)
                .saturating_sub(t.shadow_pages)
        });
        let zero_pages = resident.saturating_sub(counted_in_dst);
        if zero_pages > 0 {
            bottom.push(Some(PairSide {
                count: 0,
                unit: None,
                pages: 0,
            }));
        }
        top.sort_unstable();
        bottom.sort_unstable();
        PairSearch {
            top,
            bottom,
            zero_pages,
            moved: 0,
        }
    }

    /// Step 4 of [`Self::swap_pages`], promotion: `pair`'s `bottom` side
    /// demoted (or room made for a count-0 one), then its `top` page
    /// promoted in its place.
    fn swap_up(
        &mut self,
        view: &mut dyn MemoryView,
        pairs: &mut PairSearch,
        pair: &Pair,
        moves: &mut Moves<'_>,
    ) -> Swap {
        let (t, b) = (pair.top, pair.bottom);
        match b.unit {
            None => {
                let before = moves.out.migrations.len();
                let room = self.make_room(view, t.pages, 1, moves);
                let demoted: u64 = moves
                    .out
                    .migrations
                    .get(before..)
                    .map_or(0, |m| m.iter().map(|m| u64::from(m.unit.pages)).sum());
                pairs.moved += demoted;
                pairs.zero_pages = pairs.zero_pages.saturating_sub(demoted);
                if !room || pairs.zero_pages == 0 {
                    // No count-0 page left in the default tier.
                    pairs.drop_bottom(pair.j);
                }
                if !room {
                    return Swap::Skipped;
                }
            }
            Some(bu) => {
                if !self.move_unit(bu, b.pages, 0, 1, moves) {
                    return Swap::Stopped;
                }
                pairs.moved += b.pages;
                pairs.drop_bottom(pair.j);
            }
        }
        if !self.move_unit(pair.top_unit, t.pages, 1, 0, moves) {
            return Swap::Stopped;
        }
        pairs.moved += t.pages;
        Swap::Done
    }

    /// Step 5 of [`Self::swap_pages`], demotion: `pair`'s `top` page
    /// demoted, then its `bottom` page, unless count 0, promoted in its
    /// place.
    fn swap_down(&self, pairs: &mut PairSearch, pair: &Pair, moves: &mut Moves<'_>) -> Swap {
        let (t, b) = (pair.top, pair.bottom);
        if !self.move_unit(pair.top_unit, t.pages, 0, 1, moves) {
            return Swap::Stopped;
        }
        pairs.moved += t.pages;
        if let Some(bu) = b.unit {
            if !self.move_unit(bu, b.pages, 1, 0, moves) {
                return Swap::Stopped;
            }
            pairs.moved += b.pages;
            pairs.drop_bottom(pair.j);
        }
        Swap::Done
    }

    /// Colloid for `config`.
    pub fn new(config: &PolicyConfig) -> Self {
        let fast = config.tier_capacity_pages.first().copied().unwrap_or(0);
        let (grain, counting) = grain_for(config);
        let units = config.pages.div_ceil(grain.unit_pages);
        Self {
            search: ShiftSearch::default(),
            counts: SampleCounts::new(units),
            tracked: Vec::new(),
            is_tracked: vec![false; units as usize],
            grain,
            counting,
            pages: config.pages,
            hand: ClockHand::default(),
            scale: if config.scale > 0.0 && config.scale.is_finite() {
                config.scale
            } else {
                1.0
            },
            static_limit_pages: config.mb_to_pages(STATIC_LIMIT_MB),
            reserve: ((fast as f64 * config.free_reserve_or(FREE_RESERVE_FRACTION)).round() as u64)
                .max(1),
            quantum_ns: config.interval_ns.unwrap_or(QUANTUM_NS),
            last_dp: 0.0,
            base_only: false,
            limit_carry: 0.0,
            hot: Vec::new(),
            hot_queue: VecDeque::new(),
            queued: Vec::new(),
            hemem_limit_pages: config.mb_to_pages(HEMEM_MIGRATE_RATE_MB),
        }
    }

    /// The base system alone (`colloid-base`): HeMem's own placement on
    /// the same tracker, the baseline Colloid's gains are measured against
    /// (webglider/hemem branch baseline-sosp24ae, the HeMem the Colloid
    /// artifact runs as its baseline, whose pebs.c placement is also
    /// sosp24ae's without `COLLOID`):
    /// 1. `pebs_scan_thread`, per sample: a sample that brings a page's
    ///    count to the grain's hot threshold makes it hot (a hot request,
    ///    queued once, in the order pages become hot); a page below the
    ///    threshold is cold;
    /// 2. cooling: counts halve when one passes the cooling threshold;
    ///    hot pages halved below the hot threshold become cold and leave
    ///    the hot queue;
    /// 3. `pebs_policy_thread`, every 10 ms: take the hot queue's pages in
    ///    order, skipping those already in the default tier;
    /// 4. promote each into a free default-tier page, or else first demote
    ///    a cold default-tier page (count below the hot threshold);
    /// 5. when the default tier has no cold page left, requeue the page at
    ///    the back and stop until the next quantum (hot pages are never
    ///    demoted); stop also after [`HEMEM_MIGRATE_RATE_MB`] of promotions
    ///    in the quantum.
    ///
    /// No loaded latencies, no free reserve, no demotion otherwise.
    /// Deviations: hot/cold is read from the current (eagerly halved)
    /// count, without the lag of HeMem's request rings and its partial
    /// cooling of 8192 list entries per quantum; one combined count per
    /// page, where HeMem keeps one per tier the sampled load came from
    /// (`accesses[DRAMREAD]`, `accesses[NVMREAD]`): hotness is their sum
    /// in both, but HeMem cools when the sampled tier's count passes the
    /// cooling threshold and this tracker when the sum does (sooner for a
    /// page sampled in both tiers, i.e. one that just moved, or a 2 MiB
    /// page split across them); the cold page demoted is
    /// the next one a CLOCK hand finds, not the oldest on HeMem's
    /// `dram_cold_list`; every sample counts (HeMem samples loads only: in
    /// a read-modify-write such as GUPS's update the load is sampled).
    pub fn base(config: &PolicyConfig) -> Self {
        let c = Self::new(config);
        Self {
            base_only: true,
            hot: vec![false; c.is_tracked.len()],
            queued: vec![false; c.is_tracked.len()],
            ..c
        }
    }

    /// The search state.
    pub fn search(&self) -> ShiftSearch {
        self.search
    }

    /// The last computed shift.
    pub fn last_shift(&self) -> f64 {
        self.last_dp
    }

    /// What the tracker counts and moves.
    pub fn grain(&self) -> Grain {
        self.grain
    }

    /// How the tracker samples and cools.
    pub fn counting(&self) -> Counting {
        self.counting
    }

    /// Marks tracked page `unit` as having a count.
    fn track(&mut self, unit: u64) {
        if let Some(t) = self.is_tracked.get_mut(unit as usize) {
            if !*t {
                *t = true;
                self.tracked.push(unit);
            }
        }
    }

    fn ingest(&mut self, samples: &[AccessSample]) {
        for s in samples {
            let u = self.unit_of(s.page);
            self.counts.add(u);
            self.track(u);
            if self.base_only {
                self.hot_or_cold_request(u);
            }
            if self.counts.count(u) >= self.counting.cools_at {
                self.counts.cool();
                let counts = &self.counts;
                let is_tracked = &mut self.is_tracked;
                let hot = &mut self.hot;
                let hot_threshold = self.counting.hot_threshold;
                self.tracked.retain(|&p| {
                    // HeMem's cooling (`partial_cool`): a hot page halved
                    // below the threshold goes to the cold list.
                    if counts.count(p) < hot_threshold {
                        if let Some(h) = hot.get_mut(p as usize) {
                            *h = false;
                        }
                    }
                    let keep = counts.count(p) > 0;
                    if !keep {
                        if let Some(t) = is_tracked.get_mut(p as usize) {
                            *t = false;
                        }
                    }
                    keep
                });
                if self.base_only {
                    self.drop_cooled_from_queue();
                }
            }
        }
    }

    /// After a cooling: pages no longer hot leave the hot queue (HeMem's
    /// `partial_cool` moves them from the hot list to the cold list).
    fn drop_cooled_from_queue(&mut self) {
        let (hot, queued) = (&self.hot, &mut self.queued);
        self.hot_queue.retain(|&u| {
            let keep = hot.get(u as usize).copied().unwrap_or(false);
            if !keep {
                if let Some(q) = queued.get_mut(u as usize) {
                    *q = false;
                }
            }
            keep
        });
    }

    /// Puts tracked page `unit` at the back of the hot queue unless it is
    /// already in it.
    fn enqueue_hot(&mut self, unit: u64) {
        if let Some(q) = self.queued.get_mut(unit as usize) {
            if !*q {
                *q = true;
                self.hot_queue.push_back(unit);
            }
        }
    }

    /// Takes the first page off the hot queue.
    fn dequeue_hot(&mut self) -> Option<u64> {
        let u = self.hot_queue.pop_front()?;
        if let Some(q) = self.queued.get_mut(u as usize) {
            *q = false;
        }
        Some(u)
    }

    /// Demotes cold default-tier pages (count below `below`) until the
    /// default tier has `need` free pages; false if it runs out of them.
    fn make_room(
        &mut self,
        view: &mut dyn MemoryView,
        need: u64,
        below: u16,
        moves: &mut Moves<'_>,
    ) -> bool {
        while moves.budget.free(0) < need {
            if self.cold_demotions(view, 1, below, moves) == 0 {
                return false;
            }
        }
        true
    }

    /// HeMem's `pebs_scan_thread` after counting a sample of `unit`: a
    /// page at or above the hot threshold that is not hot yet becomes hot
    /// and joins the hot list; one below it stops being hot.
    fn hot_or_cold_request(&mut self, unit: u64) {
        let is_hot = self.counts.count(unit) >= self.counting.hot_threshold;
        let Some(h) = self.hot.get_mut(unit as usize) else {
            return;
        };
        if is_hot && !*h {
            *h = true;
            self.enqueue_hot(unit);
        } else if !is_hot {
            *h = false;
        }
    }

    /// HeMem's placement for one quantum (`colloid-base`; see
    /// [`Colloid::base`]).
    fn hemem_placement(&mut self, view: &mut dyn MemoryView, moves: &mut Moves<'_>) {
        let th = self.counting.hot_threshold;
        let mut promoted = 0u64;
        while promoted < self.hemem_limit_pages {
            let Some(u) = self.dequeue_hot() else {
                break;
            };
            if self.counts.count(u) < th {
                // "it has been cooled, need to move it into the cold list"
                // (cooling already takes cooled pages off the queue).
                if let Some(h) = self.hot.get_mut(u as usize) {
                    *h = false;
                }
                continue;
            }
            let n = self.pages_in(view, u, 1);
            if n == 0 || moves.chosen.contains(&u) {
                continue; // in the default tier: on its hot list, not this one
            }
            // A free default-tier page, or a cold one moved down first. If
            // there is no cold page left: "all dram pages are hot, so put
            // it back in list we got it from" (`enqueue_fifo`: at the
            // list's far end) and stop until the next quantum.
            if !(self.make_room(view, n, th, moves) && moves.budget.take(0, n)) {
                self.enqueue_hot(u);
                return;
            }
            moves.budget.release(1, n);
            moves.chosen.insert(u);
            promoted += n;
            moves.out.migrations.push(self.migration(u, 0));
        }
    }

    fn freq_bin(&self, count: u16) -> usize {
        let th = self.counting.cooling_threshold;
        (usize::from(count.min(th)) * FIND_BINS / (usize::from(th) + 1)).min(FIND_BINS - 1)
    }

    /// Demotes up to `want` tracked pages of the default tier whose count
    /// is below `below` (cold: `colloid` makes room with pages that have
    /// no count, `colloid-base` with pages under HeMem's hot threshold),
    /// found by a CLOCK hand; returns how many.
    fn cold_demotions(
        &mut self,
        view: &mut dyn MemoryView,
        want: u64,
        below: u16,
        moves: &mut Moves<'_>,
    ) -> u64 {
        let max_scan = view.pages();
        let mut n = 0;
        while n < want {
            let counts = &self.counts;
            let chosen = &*moves.chosen;
            let unit_pages = self.grain.unit_pages;
            // The hand may wrap within one tick: never pick a page twice
            // (nor a second modeled page of a tracked page already taken).
            let cold = self.hand.find(view, 0, 1, max_scan, |p, _| {
                let u = p / unit_pages;
                counts.count(u) < below && !chosen.contains(&u)
            });
            let Some(&p) = cold.first() else {
                break;
            };
            let u = self.unit_of(p);
            let pages = self.pages_in(view, u, 0);
            // A page past the policy's last (a view larger than `pages`)
            // has no modeled pages here: nothing found.
            if pages == 0 || !moves.budget.take(1, pages) {
                break;
            }
            moves.chosen.insert(u);
            moves.budget.release(0, pages);
            n += 1;
            moves.out.migrations.push(self.migration(u, 1));
        }
        n
    }
}

impl Policy for Colloid {
    fn kind(&self) -> PolicyKind {
        if self.base_only {
            PolicyKind::ColloidBase
        } else {
            PolicyKind::Colloid
        }
    }

    fn trackers(&self) -> TrackerRequest {
        TrackerRequest {
            sample_period: self.counting.sample_period,
            // Colloid on HeMem and Memtis samples with PEBS (Colloid §2.3
            // in the digest: the HeMem and MEMTIS integrations).
            hardware_samples: true,
            huge_pages: self.grain.huge,
            ..TrackerRequest::none()
        }
    }

    fn tick_interval_ns(&self) -> u64 {
        self.quantum_ns
    }

    /// Each quantum (`colloid-base`: HeMem's placement instead, see
    /// [`Colloid::base`]): 1. on 4 KiB pages, keep the default tier's free
    /// reserve; 2. compute the shift of request share between the tiers;
    /// 3. turn it into a page limit; 4. move pages whose access
    /// probability fits the shift: on 2 MiB pages by page-pair swaps
    /// ([`Colloid::swap_pages`]), on 4 KiB pages most frequently accessed
    /// first ([`Colloid::move_pages`]).
    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions {
        self.ingest(obs.samples);
        let mut out = Decisions::none();
        if obs.tiers.len() < 2 {
            return out;
        }
        let mut budget = FreeBudget::from_tiers(obs.tiers);
        let mut chosen = HashSet::new();
        let mut moves = Moves {
            budget: &mut budget,
            out: &mut out,
            chosen: &mut chosen,
        };
        if self.base_only {
            self.hemem_placement(view, &mut moves);
            return out;
        }
        if self.grain.huge {
            // The public HeMem+Colloid code keeps no free reserve.
            let Some(shift) = self.shift(obs.tiers) else {
                return out;
            };
            let limit = self.page_limit(&shift);
            if limit > 0 {
                self.swap_pages(view, &shift, obs.tiers, limit, &mut moves);
            }
            return out;
        }
        // Base system: keep a small free reserve in the default tier.
        if moves.budget.free(0) < self.reserve && moves.budget.free(1) > 0 {
            self.make_room(view, self.reserve, 1, &mut moves);
        }
        let Some(shift) = self.shift(obs.tiers) else {
            return out;
        };
        let room = moves.budget.free(shift.dst) > if shift.promote { self.reserve } else { 0 };
        if !(room || shift.promote && moves.budget.free(1) > 0) {
            return out; // nowhere to move pages to
        }
        let limit = self.page_limit(&shift);
        if limit == 0 {
            return out;
        }
        self.move_pages(view, &shift, limit, &mut moves);
        out
    }

    fn export_state(&self) -> PolicyState {
        let mut hot_pages: Vec<(u64, f32)> = Vec::new();
        for &u in &self.tracked {
            let heat = f32::from(self.counts.count(u)) / f32::from(self.counting.cooling_threshold);
            let run = self.unit_run(u);
            hot_pages.extend((run.page..run.end()).map(|p| (p, heat)));
        }
        hot_pages.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        PolicyState {
            from: PolicyKind::Colloid,
            now_ns: 0,
            hot_pages,
        }
    }

    fn import_state(&mut self, state: &PolicyState) {
        for &(p, heat) in &state.hot_pages {
            let c = (heat.clamp(0.0, 1.0) * f32::from(self.counting.cools_at - 1)).round() as u16;
            let u = self.unit_of(p);
            if c == 0 || u >= self.counts.pages() || self.counts.count(u) >= c {
                continue;
            }
            self.counts.set(u, c);
            self.track(u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

    /// Latencies on a fixed curve: L_D rises and L_A falls with p.
    fn curve(p: f64, contention: f64) -> (f64, f64) {
        (
            70.0 * (1.0 + contention * p * 4.0),
            135.0 * (1.0 + 0.5 * (1.0 - p)),
        )
    }

    fn run(search: &mut ShiftSearch, mut p: f64, contention: f64, quanta: usize) -> f64 {
        for _ in 0..quanta {
            let (ld, la) = curve(p, contention);
            let dp = search.compute_shift(p, ld, la);
            p = if ld < la {
                (p + dp).min(1.0)
            } else {
                (p - dp).max(0.0)
            };
        }
        p
    }

    /// Where the curve balances (bisection).
    fn p_star(contention: f64) -> f64 {
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..60 {
            let m = (lo + hi) / 2.0;
            let (ld, la) = curve(m, contention);
            if ld < la {
                lo = m;
            } else {
                hi = m;
            }
        }
        lo
    }

    fn balanced(p: f64, contention: f64) -> bool {
        let (ld, la) = curve(p, contention);
        (ld - la).abs() < DELTA * ld
    }

    #[test]
    fn search_converges_and_reopens_when_contention_changes() {
        let mut s = ShiftSearch::default();
        let p1 = run(&mut s, 1.0, 1.0, 30);
        let star1 = p_star(1.0);
        assert!(balanced(p1, 1.0), "p {p1} vs p* {star1}");
        assert!((p1 - star1).abs() < 0.05, "p {p1} vs p* {star1}");
        // Converged: the watermarks bracket p* closely.
        assert!(s.p_lo <= star1 + 0.05 && s.p_hi >= star1 - 0.05);
        // Contention triples: p* drops below the closed watermarks; the
        // search must re-open (p_lo reset to 0) and find the new p*.
        let star3 = p_star(3.0);
        assert!(
            star3 < s.p_lo - 0.05,
            "test needs p* to move out of the bracket"
        );
        let p3 = run(&mut s, p1, 3.0, 40);
        assert!(balanced(p3, 3.0), "p {p3} vs p* {star3}");
        assert!((p3 - star3).abs() < 0.05);
        // No contention at all: everything goes to the default tier.
        let p0 = run(&mut s, p3, 0.0, 40);
        assert!(p0 > 0.99, "{p0}");
    }

    /// HeMem counts a sample for the 2 MiB page it falls in and moves
    /// whole 2 MiB pages: samples spread over distinct 4 KiB pages of one
    /// huge page add up, and the base promotes that huge page (after
    /// demoting a cold one to make room) as one 512-page unit.
    #[test]
    fn hemem_grain_counts_and_moves_2m_pages() {
        let mut cfg = PolicyConfig::new(2048, vec![1028, 2048]);
        cfg.huge_pages = true;
        let (g, k) = grain_for(&cfg);
        assert_eq!((g.unit_pages, k.sample_period, g.huge), (512, 5003, true));
        assert_eq!(k.cools_at, HEMEM_COOLING_THRESHOLD + 1);
        // Scaled: one modeled page is 2 or 16 real huge pages' worth; the
        // period gives a tracked page one real 2 MiB page's samples.
        for (scale, unit, period) in [(256.0, 2, 20), (512.0, 1, 10), (8192.0, 1, 10)] {
            let (g, k) = grain_for(&PolicyConfig {
                scale,
                ..cfg.clone()
            });
            assert_eq!(
                (g.unit_pages, k.sample_period),
                (unit, period),
                "scale {scale}"
            );
        }
        let (four_k, k) = grain_for(&PolicyConfig::new(2048, vec![1028, 2048]));
        assert_eq!((four_k.unit_pages, k.sample_period), (1, SAMPLE_PERIOD));

        let mut c = Colloid::base(&cfg);
        let t = c.trackers();
        assert!(t.huge_pages && t.sample_period == HEMEM_SAMPLE_PERIOD);
        // Huge pages 0 and 1 fill the default tier but for its free
        // reserve (4 pages); 2 and 3 are alternate.
        let mut v = VecView::two_tier(2048, 1024);
        let mut st = v.status(&[1028, 2048]);
        st[0].request_rate = Some(0.0);
        st[1].request_rate = Some(1e9);
        let sample = |page| AccessSample {
            page,
            tier: 0,
            write: true,
        };
        // Nine samples on nine 4 KiB pages of huge page 0, eight on eight
        // of huge page 3: no 4 KiB page has more than one.
        let mut samples: Vec<AccessSample> = (0..9).map(|i| sample(i * 50)).collect();
        samples.extend((0..8).map(|i| sample(1536 + i * 60)));
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        let moved: Vec<(Unit, TierId)> = d.migrations.iter().map(|m| (m.unit, m.to)).collect();
        assert_eq!(
            moved,
            vec![(Unit::run(512, 512), 1), (Unit::run(1536, 512), 0)],
            "demote cold huge page 1, promote huge page 3"
        );
        assert!(d.migrations.iter().all(|m| m.unit.is_huge()));
        v.apply(&d.migrations);
        assert_eq!(v.tier_of(1536 + 511), 0);
    }

    /// HeMem's placement (`colloid-base`): a page is hot at
    /// `HOT_READ_THRESHOLD` samples. Only hot alternate-tier pages are
    /// promoted (one a sample short is not), only default-tier pages below
    /// the threshold are demoted to make room, and once the default tier
    /// holds only hot pages nothing moves.
    #[test]
    fn hemem_base_promotes_hot_pages_and_demotes_only_cold_ones() {
        let mut cfg = PolicyConfig::new(8, vec![4, 8]);
        cfg.huge_pages = true;
        // Scale 512: one modeled page is one HeMem 2 MiB page.
        cfg.scale = 512.0;
        let mut c = Colloid::base(&cfg);
        assert_eq!(c.grain().unit_pages, 1);
        assert_eq!(c.counting().hot_threshold, HEMEM_HOT_THRESHOLD);
        assert_eq!(HEMEM_HOT_THRESHOLD, 8);
        assert_eq!(
            grain_for(&PolicyConfig::new(8, vec![4, 8])).1.hot_threshold,
            HOT_THRESHOLD
        );
        // Default tier full: pages 0-3; alternate: 4-7.
        let mut v = VecView::two_tier(8, 4);
        let st = v.status(&[4, 8]);
        let samples = |counts: &[(u64, usize)]| -> Vec<AccessSample> {
            counts
                .iter()
                .flat_map(|&(page, n)| {
                    std::iter::repeat_n(
                        AccessSample {
                            page,
                            tier: u8::from(page >= 4),
                            write: false,
                        },
                        n,
                    )
                })
                .collect()
        };
        let moved = |d: &Decisions| -> Vec<(u64, TierId)> {
            d.migrations.iter().map(|m| (m.unit.page, m.to)).collect()
        };
        // Default tier: 0 and 2 hot (8, 9 samples), 1 warm (7, one short of
        // the threshold), 3 unseen. Alternate: 4 hot (8), 5 warm (7), 6
        // and 7 unseen. No count passes 18: no cooling.
        let s1 = samples(&[(0, 8), (1, 7), (2, 9), (4, 8), (5, 7)]);
        let d = c.tick(&obs(0, &st, &s1), &mut v);
        assert_eq!(
            moved(&d),
            vec![(1, 1), (4, 0)],
            "the hot page 4 replaces the first cold page the CLOCK hand finds \
             (1: below the threshold, 0 is hot); page 5 is not hot, so it \
             does not take cold page 3"
        );
        v.apply(&d.migrations);
        // Page 6 becomes hot, then page 5 (one more sample): 6 replaces the
        // last cold default-tier page (3); 5 finds only hot pages (0, 2, 4,
        // 6) and stays, as no hot page is demoted.
        let st = v.status(&[4, 8]);
        let d = c.tick(&obs(10_000_000, &st, &samples(&[(6, 8), (5, 1)])), &mut v);
        assert_eq!(moved(&d), vec![(3, 1), (6, 0)]);
        v.apply(&d.migrations);
        // Page 2 passes 18: a cooling halves every count and all but page
        // 2 fall below the threshold (cold, demotable; 5 is no longer
        // promotable). Page 5 gets back to 8 and replaces a default-tier
        // page that cooled (4: the hand resumes after page 3).
        let st = v.status(&[4, 8]);
        let d = c.tick(&obs(20_000_000, &st, &samples(&[(2, 10), (5, 4)])), &mut v);
        assert_eq!(
            (0..8).map(|p| c.counts.count(p)).collect::<Vec<_>>(),
            vec![4, 3, 9, 0, 4, 8, 4, 0]
        );
        assert_eq!(moved(&d), vec![(4, 1), (5, 0)]);
    }

    /// HeMem's base promotes at most `PEBS_KSWAPD_MIGRATE_RATE` (10 GB) per
    /// quantum: with a modeled page of 4 GiB (2,048 huge pages of equal
    /// heat), 2.5 pages, so 3 of 4 hot pages (the last may pass the limit).
    #[test]
    fn hemem_base_promotes_at_most_ten_gb_per_quantum() {
        let mut cfg = PolicyConfig::new(8, vec![4, 8]);
        cfg.huge_pages = true;
        cfg.scale = 512.0 * 2048.0;
        let mut c = Colloid::base(&cfg);
        assert_eq!(c.hemem_limit_pages, 3, "10,240 MB / 4,096 MB, rounded");
        let mut v = VecView::two_tier(8, 4);
        let st = v.status(&[4, 8]);
        let mut samples = Vec::new();
        for page in 4..8 {
            samples.extend(samples_of(page, 1, usize::from(HEMEM_HOT_THRESHOLD)));
        }
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        let promoted = d.migrations.iter().filter(|m| m.to == 0).count();
        assert_eq!(promoted, 3, "{:?}", moves(&d));
    }

    /// A cooling halves every count: a page halved to 0 is no longer
    /// tracked (nor a FindPages candidate of probability 0); the others are.
    #[test]
    fn a_page_cooled_to_zero_is_no_longer_tracked() {
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        let cools_at = usize::from(c.counting().cools_at);
        let mut samples = samples_of(0, 0, 1);
        samples.extend(samples_of(1, 0, cools_at));
        c.ingest(&samples);
        assert_eq!(c.tracked, vec![1]);
        assert_eq!(
            (c.counts.count(0), c.counts.count(1)),
            (0, (cools_at / 2) as u16)
        );
        assert!(!c.is_tracked[0] && c.is_tracked[1]);
    }

    /// HeMem's cooling (`partial_cool`) sends a hot page to the cold list
    /// only if halved *below* the hot threshold: one halved to it stays hot
    /// and is promoted.
    #[test]
    fn hemem_base_keeps_a_page_halved_to_the_hot_threshold_hot() {
        let mut c = base_8_pages();
        let th = c.counting().hot_threshold;
        assert_eq!(c.counting().cools_at, HEMEM_COOLING_THRESHOLD + 1);
        // Page 5 at twice the threshold, then page 6 to the cooling.
        let mut samples = repeat_samples(5, usize::from(2 * th));
        samples.extend(repeat_samples(6, usize::from(c.counting().cools_at)));
        let mut v = VecView::two_tier(8, 4);
        let st = v.status(&[4, 8]);
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert_eq!(c.counts.count(5), th, "halved to the threshold");
        let mut promoted: Vec<u64> = d
            .migrations
            .iter()
            .filter(|m| m.to == 0)
            .map(|m| m.unit.page)
            .collect();
        promoted.sort_unstable();
        assert_eq!(promoted, vec![5, 6]);
    }

    /// FindPages takes the highest frequency bin first: page 9 (4 samples,
    /// bin 1) before pages 1-6 (1 each, bin 0), though its index is higher.
    #[test]
    fn find_pages_takes_the_hottest_bin_first() {
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        let mut v = VecView::two_tier(100, 40);
        let mut samples = samples_of(9, 0, 4);
        for p in 1..7 {
            samples.extend(samples_of(p, 0, 1));
        }
        let st = loaded(&v, &[50, 100], (300.0, 140.0), (9e8, 1e8));
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert!((c.last_shift() - 0.45).abs() < 1e-9);
        // 0.4 of the 0.45: nothing else fits after it.
        assert_eq!(moves(&d), vec![(9, 1)]);
        // Five bins over [0, 10]: counts 3 and 4 share bin 1 (page order
        // within it), 1 is in bin 0. Page 2 (0.3) goes first, then page 7
        // (0.4) does not fit, then page 10 (0.1) does.
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        let mut v = VecView::two_tier(100, 40);
        let mut samples = samples_of(2, 0, 3);
        samples.extend(samples_of(7, 0, 4));
        for p in 10..13 {
            samples.extend(samples_of(p, 0, 1));
        }
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert_eq!(moves(&d), vec![(2, 1), (10, 1)]);
    }

    /// HeMem's hot list in the order pages became hot: a page sampled once
    /// while cold is not queued then; it joins behind one that got hot
    /// first, and with room for one promotion only the first goes up.
    #[test]
    fn hemem_base_queues_a_page_when_it_gets_hot_not_at_its_first_sample() {
        let mut c = base_8_pages();
        let th = usize::from(c.counting().hot_threshold);
        let mut v = VecView::two_tier(8, 4);
        let st = v.status(&[4, 8]);
        // Default tier: 0-2 hot, 3 cold (room for one). Alternate: 4 gets a
        // sample, then 5 gets hot, then 4 gets hot.
        let mut samples = Vec::new();
        for p in 0..3 {
            samples.extend(repeat_samples(p, th));
        }
        samples.extend(repeat_samples(4, 1));
        samples.extend(repeat_samples(5, th));
        samples.extend(repeat_samples(4, th - 1));
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert_eq!(moves(&d), vec![(3, 1), (5, 0)]);
    }

    /// Colloid samples with PEBS on HeMem and Memtis (hardware samples,
    /// stores as their own event), and on one tier it has nothing to
    /// balance: a tick moves nothing.
    #[test]
    fn colloid_asks_for_hardware_samples_and_needs_two_tiers() {
        let cfg = PolicyConfig::new(100, vec![50, 100]);
        let mut c = Colloid::new(&cfg);
        assert!(c.trackers().hardware_samples);
        let mut v = VecView::two_tier(100, 40);
        let st = loaded(&v, &[50, 100], (300.0, 140.0), (9e8, 1e8));
        let d = c.tick(&obs(0, &st[..1], &half_and_tenths()), &mut v);
        assert!(d.migrations.is_empty());
    }

    /// On 4 KiB pages Colloid keeps a free reserve in the default tier
    /// every quantum, balanced or not: a full default tier gives up one
    /// unsampled page (when the alternate tier has room for it).
    #[test]
    fn colloid_keeps_its_free_reserve_when_the_tiers_are_balanced() {
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        assert_eq!(c.reserve, 1);
        let mut v = VecView::two_tier(100, 50);
        let mut samples = Vec::new();
        for p in 1..50 {
            samples.extend(samples_of(p, 0, 1));
        }
        let st = loaded(&v, &[50, 100], (100.0, 100.0), (5e8, 5e8));
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert_eq!(c.last_shift(), 0.0, "balanced");
        assert_eq!(moves(&d), vec![(0, 1)]);
        // With no room in the alternate tier, nothing moves.
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 50]));
        let st = loaded(&v, &[50, 50], (100.0, 100.0), (5e8, 5e8));
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert!(d.migrations.is_empty());
    }

    /// The hand-over to another policy: heat is count over the cooling
    /// threshold, hottest first; an import sets counts from heat (to
    /// `cools_at - 1` at most), never lowers a count, and skips what rounds
    /// to 0 or lies past the policy's pages.
    #[test]
    fn colloid_hands_its_counts_over_as_heat_and_takes_them_back() {
        let cfg = PolicyConfig::new(100, vec![50, 100]);
        let mut c = Colloid::new(&cfg);
        let mut samples = samples_of(7, 0, 2);
        samples.extend(samples_of(3, 0, 5));
        c.ingest(&samples);
        let st = c.export_state();
        assert_eq!(st.from, PolicyKind::Colloid);
        assert_eq!(st.hot_pages, vec![(3, 0.5), (7, 0.2)]);
        let mut d = Colloid::new(&cfg);
        d.ingest(&samples_of(3, 0, 7));
        let mut state = st.clone();
        state.hot_pages.extend([(9, 0.01), (500, 1.0), (11, 2.0)]);
        d.import_state(&state);
        let counts: Vec<u16> = [3, 7, 9, 11].iter().map(|&p| d.counts.count(p)).collect();
        assert_eq!(counts, [7, 2, 0, 9], "kept, round(1.8), 0, clamped to 9");
        assert!(d.is_tracked[7] && d.is_tracked[11] && !d.is_tracked[9]);
    }

    /// One HeMem 2 MiB page per modeled page (scale 512), 8 pages, the
    /// default tier holding 0-3.
    fn base_8_pages() -> Colloid {
        let mut cfg = PolicyConfig::new(8, vec![4, 8]);
        cfg.huge_pages = true;
        cfg.scale = 512.0;
        let c = Colloid::base(&cfg);
        assert_eq!(c.grain().unit_pages, 1);
        c
    }

    fn repeat_samples(page: u64, n: usize) -> Vec<AccessSample> {
        let s = AccessSample {
            page,
            tier: u8::from(page >= 4),
            write: false,
        };
        vec![s; n]
    }

    /// HeMem's lists are intrusive: a page is on the hot list once. A hot
    /// page that cools leaves it; when it heats again it is queued once,
    /// at the back, and promoted in the order it became hot again, not
    /// from its old place.
    #[test]
    fn hemem_hot_queue_holds_each_page_once_in_reheat_order() {
        let mut c = base_8_pages();
        // 4 and 5 hot (8 samples each); 6 hot at 8 and its 19th sample
        // passes 18: a cooling halves 4 and 5 to 4 (cold), 6 to 9 (hot).
        c.ingest(&repeat_samples(4, 8));
        c.ingest(&repeat_samples(5, 8));
        c.ingest(&repeat_samples(6, 19));
        assert_eq!(
            (4..7).map(|p| c.counts.count(p)).collect::<Vec<_>>(),
            vec![4, 4, 9]
        );
        assert_eq!(Vec::from(c.hot_queue.clone()), vec![6]);
        // 5 heats again, then 4.
        c.ingest(&repeat_samples(5, 4));
        c.ingest(&repeat_samples(4, 4));
        assert_eq!(Vec::from(c.hot_queue.clone()), vec![6, 5, 4]);
        // Heat and cool cycles never grow the queue past one entry a page.
        for round in 0..20 {
            c.ingest(&repeat_samples(7, 19 + round % 3));
            c.ingest(&repeat_samples(4, 8));
            c.ingest(&repeat_samples(5, 8));
            assert!(c.hot_queue.len() <= 8, "{:?}", c.hot_queue);
            let mut seen = c.hot_queue.iter().copied().collect::<Vec<_>>();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), c.hot_queue.len(), "{:?}", c.hot_queue);
        }
        // Promotions follow the queue: the order the pages became hot.
        let mut c = base_8_pages();
        c.ingest(&repeat_samples(4, 8));
        c.ingest(&repeat_samples(5, 8));
        c.ingest(&repeat_samples(6, 19));
        c.ingest(&repeat_samples(5, 4));
        c.ingest(&repeat_samples(4, 4));
        let mut v = VecView::two_tier(8, 4);
        let st = v.status(&[4, 8]);
        let d = c.tick(&obs(0, &st, &[]), &mut v);
        assert_eq!(pages_moved_to(&d, 0), vec![6, 5, 4]);
    }

    /// A view with more pages than the policy was configured for: a cold
    /// default-tier page past the policy's last has no modeled pages in
    /// it, and must not count as room made (an empty migration).
    #[test]
    fn hemem_base_ignores_pages_past_its_own() {
        let mut c = base_8_pages();
        // Pages 0-3 (hot) and 8-15 (past the policy's 8) in the default
        // tier, which is over its capacity of 4; 4-7 alternate.
        let mut v = VecView::two_tier(16, 4);
        for p in 8..16 {
            v.tier[p] = 0;
        }
        let st = v.status(&[4, 8]);
        let mut samples = Vec::new();
        for p in 0..5 {
            samples.extend(repeat_samples(p, 8));
        }
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert!(
            d.migrations.iter().all(|m| m.unit.pages > 0),
            "{:?}",
            d.migrations
        );
        assert!(d.migrations.is_empty(), "{:?}", d.migrations);
        assert_eq!(Vec::from(c.hot_queue.clone()), vec![4], "requeued");
    }

    /// A 2 MiB page split across the tiers whose first 4 KiB page is
    /// already in the default tier is still a promotion candidate
    /// (`move_pages` and `hemem_placement` agree: any of it in the source
    /// tier).
    #[test]
    fn colloid_promotes_a_split_2m_page_whose_first_page_is_in_the_default_tier() {
        let mut cfg = PolicyConfig::new(2048, vec![2048, 2048]);
        cfg.huge_pages = true;
        let mut c = Colloid::new(&cfg);
        assert_eq!(c.grain().unit_pages, 512);
        // Huge pages 0-1 in the default tier, 2-3 alternate, but huge page
        // 2's first 4 KiB page sits in the default tier.
        let mut v = VecView::two_tier(2048, 1024);
        v.tier[1024] = 0;
        let mut st = v.status(&[2048, 2048]);
        st[0].loaded_latency_ns = Some(80.0);
        st[1].loaded_latency_ns = Some(200.0);
        st[0].request_rate = Some(1e8);
        st[1].request_rate = Some(9e8);
        // Huge page 2: 4 of 10 samples (probability 0.4, within the shift
        // of 0.45); the other 6 on huge page 0, already in the default tier.
        let samples: Vec<AccessSample> = (0..10)
            .map(|i| AccessSample {
                page: if i < 4 { 1024 + 100 + i } else { i },
                tier: u8::from(i < 4),
                write: false,
            })
            .collect();
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        let moved: Vec<(Unit, TierId)> = d.migrations.iter().map(|m| (m.unit, m.to)).collect();
        assert_eq!(moved, vec![(Unit::run(1024, 512), 0)]);
    }

    /// Each migration of `d` as (page, destination tier).
    fn moves(d: &Decisions) -> Vec<(u64, TierId)> {
        d.migrations.iter().map(|m| (m.unit.page, m.to)).collect()
    }

    /// Colloid on HeMem's 2 MiB pages, one per modeled page (scale 512),
    /// over `fast` default-tier and 8 alternate-tier pages, with `counts`
    /// samples per page (all counts below the cooling threshold).
    fn colloid_2m_with_counts(pages: u64, fast: u64, counts: &[(u64, usize)]) -> Colloid {
        let mut cfg = PolicyConfig::new(pages, vec![fast, 8]);
        cfg.huge_pages = true;
        cfg.scale = 512.0;
        let mut c = Colloid::new(&cfg);
        assert_eq!(c.grain().unit_pages, 1);
        for &(p, n) in counts {
            c.ingest(&repeat_samples(p, n));
        }
        c
    }

    /// Tier status for a view, with latencies and request rates.
    fn loaded(v: &VecView, caps: &[u64], lat: (f64, f64), rates: (f64, f64)) -> Vec<TierStatus> {
        let mut st = v.status(caps);
        st[0].loaded_latency_ns = Some(lat.0);
        st[1].loaded_latency_ns = Some(lat.1);
        st[0].request_rate = Some(rates.0);
        st[1].request_rate = Some(rates.1);
        st
    }

    /// One quantum of `colloid_2m_with_counts(8, fast, counts)` over 8
    /// pages, 0-3 in the default tier, with the tiers' loaded latencies
    /// `lat` and request rates `rates`: the policy after it and its moves.
    fn tick_2m(
        fast: u64,
        counts: &[(u64, usize)],
        lat: (f64, f64),
        rates: (f64, f64),
    ) -> (Colloid, Decisions) {
        let mut c = colloid_2m_with_counts(8, fast, counts);
        let mut v = VecView::two_tier(8, 4);
        let st = loaded(&v, &[fast, 8], lat, rates);
        let d = c.tick(&obs(0, &st, &[]), &mut v);
        (c, d)
    }

    /// `best_pair`: the largest positive difference within the bound, the
    /// first pair found on a tie, taken (`None`) entries skipped.
    #[test]
    fn best_pair_takes_the_largest_difference_within_the_bound() {
        let side = |count: u16, unit: u64| {
            Some(PairSide {
                count,
                unit: Some(unit),
                pages: 1,
            })
        };
        let zero = Some(PairSide {
            count: 0,
            unit: None,
            pages: 0,
        });
        let top = [side(1, 10), side(5, 11), None, side(9, 12)];
        let bottom = [zero, side(3, 20), None, side(4, 21)];
        // Within 4: 5 - 3 = 2 (5 - 0 and 9 - 4 exceed 4; 1 - 0 = 1 is less).
        assert_eq!(best_pair(&top, &bottom, 4), Some((1, 1, 2)));
        // Within 5: 5 - 0 = 5, found before 9 - 4 = 5.
        assert_eq!(best_pair(&top, &bottom, 5), Some((1, 0, 5)));
        // Within 100: 9 - 0.
        assert_eq!(best_pair(&top, &bottom, 100), Some((3, 0, 9)));
        assert_eq!(best_pair(&top, &bottom, 0), None);
        // No positive difference: nothing.
        assert_eq!(
            best_pair(&[side(3, 1)], &[side(3, 2), side(7, 3)], 10),
            None
        );
    }

    /// The public HeMem+Colloid code (webglider/hemem sosp24ae, pebs.c
    /// scan-and-sort) promotes an alternate-tier page only in place of a
    /// default-tier page with a lower count. With `L_D < L_A` and a
    /// default tier whose pages are all hotter than every alternate-tier
    /// page, nothing moves, even into the default tier's free space (the
    /// bin search promoted sampled page 4 into it).
    #[test]
    fn colloid_2m_promotes_nothing_when_every_default_page_is_hotter() {
        // Default tier: pages 0-3 (counts 5, 6, 7, 5) and 2 free pages;
        // alternate: 4 (3), 5 (1), 6 and 7 unsampled.
        let (c, d) = tick_2m(
            6,
            &[(0, 5), (1, 6), (2, 7), (3, 5), (4, 3), (5, 1)],
            (80.0, 200.0),
            (7e8, 3e8),
        );
        assert!(c.last_shift() > 0.1, "promotion mode with room to shift");
        assert!(d.migrations.is_empty(), "{:?}", d.migrations);
    }

    /// Each swap takes the pair with the largest count difference that
    /// fits in the remaining shift, demoting a sampled default-tier page
    /// (the bin search demoted only unsampled ones, so it moved nothing
    /// here), and the shift it used is gone for the next pair.
    #[test]
    fn colloid_2m_swaps_the_pair_with_the_largest_difference_within_the_shift() {
        // Default tier full: 0-3 (counts 9, 2, 8, 8); alternate: 4 (7),
        // 5 (4), 6 (1). Total 39.
        let counts = [(0, 9), (1, 2), (2, 8), (3, 8), (4, 7), (5, 4), (6, 1)];
        // p = 0.77, L_D < L_A: dp = (1 - p) / 2 = 0.115, 4 counts of 39.
        let (c, d) = tick_2m(4, &counts, (80.0, 200.0), (7.7e8, 2.3e8));
        assert!((c.last_shift() - 0.115).abs() < 1e-9);
        // 4 - 2 = 2 is the largest difference within 4 (7 - 2 = 5 is not):
        // page 1 goes down, page 5 up. 2 counts are left, and no other
        // alternate page beats a default one by 1-2 (7 vs 8, 1 vs 8).
        let moved = moves(&d);
        assert_eq!(moved, vec![(1, 1), (5, 0)]);

        // Demotion mode (L_D > L_A): a default-tier page goes down in
        // exchange for the coldest alternate page within the shift; paired
        // with an unsampled one (7), it goes down alone.
        // p = 0.77: dp = 0.77 / 2 = 0.385, 15 counts of 39.
        let (c, d) = tick_2m(4, &counts, (300.0, 140.0), (7.7e8, 2.3e8));
        assert!((c.last_shift() - 0.385).abs() < 1e-9);
        let moved = moves(&d);
        // Page 0 with a count-0 page: 9 - 0 = 9 first (page 2 or 3 with
        // one: 8); 6 left: page 2 for page 5, 8 - 4 = 4 (8 - 1 = 7 and
        // 8 - 0 exceed 6); 2 left: page 1 with a count-0 page, 2 - 0 = 2
        // (page 3 for page 4 would be 1); 0 left.
        assert_eq!(moved, vec![(0, 1), (2, 1), (5, 0), (1, 1)]);
    }

    /// A default-tier page swapped out leaves the candidates: the next pair
    /// takes another one (a page paired again would stop the search, its
    /// move refused as already chosen).
    #[test]
    fn colloid_2m_pairs_each_default_page_at_most_once_per_quantum() {
        // Default tier full: 0 (1), 1 (2), 2 and 3 (9); alternate: 4 (5),
        // 5 (4). Total 30.
        let counts = [(0, 1), (1, 2), (2, 9), (3, 9), (4, 5), (5, 4)];
        // p = 0.5, L_D < L_A: dp = 0.25, 7.5 counts of 30.
        let (c, d) = tick_2m(4, &counts, (80.0, 200.0), (5e8, 5e8));
        assert!((c.last_shift() - 0.25).abs() < 1e-9);
        // 5 - 1 = 4 first (page 0 for page 4); 3.5 left: page 5 (4) with
        // page 1 (2), not with page 0 again (4 - 1 = 3).
        assert_eq!(moves(&d), vec![(0, 1), (4, 0), (1, 1), (5, 0)]);
    }

    /// Swaps stop at the dynamic limit (in modeled pages, both pages of a
    /// swap counted), and a swap that passes it comes off the next quanta's
    /// limits (pebs.c lets the last page pass the limit).
    #[test]
    fn colloid_2m_swaps_stop_at_the_limit_and_carry_its_excess() {
        let counts = [(0, 1), (1, 2), (2, 9), (3, 9), (4, 5), (5, 4)];
        // p = 0.5, dp = 0.25 (two swaps fit the shift, as in the test above).
        // 0.25 x 32,768,000/s x 10 ms x 64 B / 4 KiB / 512 = 2.5 pages: one swap.
        let (c, d) = tick_2m(4, &counts, (80.0, 200.0), (16_384_000.0, 16_384_000.0));
        assert_eq!(moves(&d), vec![(0, 1), (4, 0)]);
        assert!((c.limit_carry - 0.5).abs() < 1e-9, "{}", c.limit_carry);
        assert_eq!(
            c.search(),
            ShiftSearch {
                p_lo: 0.5,
                p_hi: 1.0
            }
        );
        // 1.5 pages: the one swap passes the limit by a page, owed after.
        let (c, d) = tick_2m(4, &counts, (80.0, 200.0), (9_830_400.0, 9_830_400.0));
        assert_eq!(moves(&d), vec![(0, 1), (4, 0)]);
        assert!((c.limit_carry + 0.5).abs() < 1e-9, "{}", c.limit_carry);
        // A swap with an unsampled page (a count-0 page demoted to make
        // room) counts both pages too: at 2.5 pages, one swap of the two
        // that fit the shift (p = 0.1, dp = 0.45: 12 counts of 27).
        let (_, d) = tick_2m(
            4,
            &[(2, 9), (3, 9), (4, 5), (5, 4)],
            (80.0, 200.0),
            (1_820_444.0, 16_384_000.0),
        );
        assert_eq!(moves(&d), vec![(0, 1), (4, 0)]);
    }

    /// Demotion mode counts its pages against the limit too: at 2.5 pages,
    /// page 0 alone (1), then page 2 for page 5 (2 more, 1 past the limit,
    /// owed after); page 1 would have followed (the test above).
    #[test]
    fn colloid_2m_demotions_stop_at_the_limit_and_carry_its_excess() {
        let counts = [(0, 9), (1, 2), (2, 8), (3, 8), (4, 7), (5, 4), (6, 1)];
        // p = 0.77: dp = 0.385 x 21,277,922/s x 10 ms x 64 B / 4 KiB / 512 = 2.5.
        let (c, d) = tick_2m(4, &counts, (300.0, 140.0), (16_384_000.0, 4_893_922.0));
        assert_eq!(moves(&d), vec![(0, 1), (2, 1), (5, 0)]);
        assert!((c.limit_carry + 0.5).abs() < 1e-6, "{}", c.limit_carry);
    }

    /// Paired with a count-0 default-tier page, an alternate-tier page goes
    /// into free default-tier space without a swap; when there is no free
    /// space left, a count-0 page is demoted first.
    #[test]
    fn colloid_2m_fills_free_space_then_swaps_out_unsampled_pages() {
        // Default tier: 0-3 (0 and 1 unsampled, 2 and 3 at 9) and one
        // free page; alternate: 4 (5), 5 (4).
        // p = 0.3: dp = 0.35, 9 counts of 27.
        let (_, d) = tick_2m(
            5,
            &[(2, 9), (3, 9), (4, 5), (5, 4)],
            (80.0, 200.0),
            (3e8, 7e8),
        );
        let moved = moves(&d);
        // Page 4 (5 - 0) into the free page; 4 left: page 5 (4 - 0) in
        // place of unsampled page 0.
        assert_eq!(moved, vec![(4, 0), (0, 1), (5, 0)]);
    }

    #[test]
    fn find_pages_respects_shift_and_probabilities() {
        let cfg = PolicyConfig::new(100, vec![50, 100]);
        let mut c = Colloid::new(&cfg);
        let mut v = VecView::two_tier(100, 40);
        let mut st = v.status(&[50, 100]);
        // Default tier much slower (contended): demotion mode.
        st[0].loaded_latency_ns = Some(300.0);
        st[1].loaded_latency_ns = Some(140.0);
        st[0].request_rate = Some(9e8);
        st[1].request_rate = Some(1e8);
        // Page 0 has 5 of 10 samples (prob 0.5), pages 1..6 one each (0.1).
        let mut samples = vec![
            AccessSample {
                page: 0,
                tier: 0,
                write: false
            };
            5
        ];
        for p in 1..6 {
            samples.push(AccessSample {
                page: p,
                tier: 0,
                write: false,
            });
        }
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        // p = 0.9, search: p_hi = 0.9, target 0.45, dp = 0.45: page 0 (0.5)
        // does not fit; four 0.1 pages do.
        assert!((c.last_shift() - 0.45).abs() < 1e-9);
        let moved: Vec<u64> = d.migrations.iter().map(|m| m.unit.page).collect();
        assert_eq!(moved.len(), 4, "{moved:?}");
        assert!(!moved.contains(&0));
        assert!(d.migrations.iter().all(|m| m.to == 1));
    }

    /// Step 3's dynamic limit (Colloid §4.2): `dp x request rate x quantum x
    /// 64 B per request` in pages, the fraction carried to the next quantum,
    /// none carried past the static limit, and an earlier excess paid off
    /// first.
    #[test]
    fn the_dynamic_limit_carries_its_fraction_and_pays_off_an_excess() {
        let mut c = Colloid::new(&PolicyConfig::new(1 << 20, vec![1 << 19, 1 << 20]));
        assert_eq!((c.scale, c.quantum_ns), (1.0, 10_000_000));
        let shift = |dp: f64, total_rate: f64| Shift {
            dp,
            total_rate,
            promote: true,
            src: 1,
            dst: 0,
        };
        // 0.25 x 1e7/s x 10 ms x 64 B / 4 KiB = 390.625 pages.
        assert_eq!(c.page_limit(&shift(0.25, 1e7)), 390);
        assert_eq!(
            c.page_limit(&shift(0.25, 1e7)),
            391,
            "0.625 + 0.625 carried"
        );
        assert_eq!(c.page_limit(&shift(0.25, 1e7)), 390, "0.25 carried");
        // Past the static limit: the limit, nothing carried.
        let cap = c.static_limit_pages;
        let over = (cap as f64 + 1000.5) * 25_600.0;
        assert_eq!(c.page_limit(&shift(0.25, over)), cap);
        assert_eq!(
            c.page_limit(&shift(0.25, 1e7)),
            390,
            "0.875: nothing from the capped one"
        );
        // An excess of 500 pages (a swap past the limit) is paid off first.
        c.limit_carry = -500.0;
        assert_eq!(c.page_limit(&shift(0.25, 1e7)), 0);
        assert!((c.limit_carry + 109.375).abs() < 1e-6, "{}", c.limit_carry);
        assert_eq!(c.page_limit(&shift(0.25, 1e7)), 281, "390.625 - 109.375");
        // A modeled page standing for 2 real pages: half as many.
        let mut cfg = PolicyConfig::new(1 << 20, vec![1 << 19, 1 << 20]);
        cfg.scale = 2.0;
        let mut c = Colloid::new(&cfg);
        assert_eq!(c.page_limit(&shift(0.25, 1e7)), 195);
    }

    /// Samples: `n` of page `page` in `tier`.
    fn samples_of(page: u64, tier: TierId, n: usize) -> Vec<AccessSample> {
        vec![
            AccessSample {
                page,
                tier,
                write: false
            };
            n
        ]
    }

    /// Page 0 with 5 of 10 samples (probability 0.5), pages 1-5 with one
    /// each (0.1), all in the default tier.
    fn half_and_tenths() -> Vec<AccessSample> {
        let mut s = samples_of(0, 0, 5);
        for p in 1..6 {
            s.extend(samples_of(p, 0, 1));
        }
        s
    }

    /// FindPages (4 KiB): a page whose probability is exactly what is left
    /// of the shift fits (Algorithm 3 skips only a page above it).
    #[test]
    fn find_pages_takes_a_page_that_fits_the_shift_exactly() {
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        let mut v = VecView::two_tier(100, 40);
        // Every request to the default tier (p = 1), which is slower:
        // dp = 0.5, the probability of page 0.
        let st = loaded(&v, &[50, 100], (300.0, 140.0), (1e9, 0.0));
        let d = c.tick(&obs(0, &st, &half_and_tenths()), &mut v);
        assert_eq!(c.last_shift(), 0.5);
        assert_eq!(moves(&d), vec![(0, 1)]);
    }

    /// FindPages (4 KiB) stops at the dynamic limit: 2 pages here, where
    /// four would fit in the shift.
    #[test]
    fn find_pages_stops_at_the_dynamic_limit() {
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        let mut v = VecView::two_tier(100, 40);
        // p = 0.9, dp = 0.45: 0.45 x 36,000/s x 10 ms x 64 B / 4 KiB = 2.53 pages.
        let st = loaded(&v, &[50, 100], (300.0, 140.0), (32_400.0, 3_600.0));
        let d = c.tick(&obs(0, &st, &half_and_tenths()), &mut v);
        assert!((c.last_shift() - 0.45).abs() < 1e-9);
        assert_eq!(moves(&d), vec![(1, 1), (2, 1)]);
    }

    /// FindPages (4 KiB) promoting into a full default tier first demotes a
    /// cold page (as HeMem does), then promotes the hot one into its place.
    #[test]
    fn find_pages_promotes_into_a_full_default_tier_after_a_cold_demotion() {
        let mut c = Colloid::new(&PolicyConfig::new(100, vec![50, 100]));
        assert_eq!(c.reserve, 1);
        let mut v = VecView::two_tier(100, 50);
        let mut samples = samples_of(60, 1, 4);
        for p in 2..50 {
            samples.extend(samples_of(p, 0, 1));
        }
        // The default tier is faster and takes a tenth of the requests:
        // promotion mode, dp = 0.45.
        let st = loaded(&v, &[50, 100], (80.0, 200.0), (1e8, 9e8));
        let d = c.tick(&obs(0, &st, &samples), &mut v);
        assert!((c.last_shift() - 0.45).abs() < 1e-9);
        // Pages 0 and 1, the unsampled default pages, go down: room for 60
        // and the free reserve of 1; 60 comes up.
        assert_eq!(moves(&d), vec![(0, 1), (1, 1), (60, 0)]);
    }

    /// ShiftSearch when the window collapses (Algorithm 2, lines 7-11): the
    /// watermark on the side the search must move to is reset, never the
    /// other one, for both orders of the tiers' latencies. Planted bug: the
    /// wrong watermark reset (issue 34).
    #[test]
    fn a_collapsed_shift_window_reopens_towards_the_faster_tier() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // The default tier is faster (promotion mode): p becomes the low
        // watermark; the window [0.6, 0.605) collapses, the high watermark
        // reopens to 1 and the shift heads up, to the middle of [p, 1].
        let mut s = ShiftSearch {
            p_lo: 0.5,
            p_hi: 0.605,
        };
        let dp = s.compute_shift(0.6, 50.0, 100.0);
        assert_eq!((s.p_lo, s.p_hi), (0.6, 1.0), "{s:?}");
        assert!(close(dp, 0.2), "shift {dp}");
        // The alternate tier is faster (demotion mode): p becomes the high
        // watermark; the window [0.4, 0.405) collapses, the low watermark
        // reopens to 0 and the shift heads down, to the middle of [0, p].
        let mut s = ShiftSearch {
            p_lo: 0.4,
            p_hi: 0.5,
        };
        let dp = s.compute_shift(0.405, 100.0, 50.0);
        assert_eq!((s.p_lo, s.p_hi), (0.0, 0.405), "{s:?}");
        assert!(close(dp, 0.2025), "shift {dp}");
        // A window that stays open resets nothing: the other watermark is kept.
        let mut s = ShiftSearch {
            p_lo: 0.2,
            p_hi: 0.8,
        };
        let dp = s.compute_shift(0.5, 50.0, 100.0);
        assert_eq!((s.p_lo, s.p_hi), (0.5, 0.8), "{s:?}");
        assert!(close(dp, 0.15), "shift {dp}");
        let dp = s.compute_shift(0.7, 100.0, 50.0);
        assert_eq!((s.p_lo, s.p_hi), (0.5, 0.7), "{s:?}");
        assert!(close(dp, 0.1), "shift {dp}");
        // Latencies within DELTA of each other: balanced, no shift, nothing moves.
        let before = s;
        assert_eq!(s.compute_shift(0.3, 100.0, 102.0), 0.0);
        assert_eq!(s, before);
        // Equal latencies, even both 0 (idle tiers), are balanced.
        assert_eq!(s.compute_shift(0.3, 0.0, 0.0), 0.0);
        assert_eq!(s, before);
    }

    /// Algorithm 2's comparisons are strict: latencies exactly `DELTA` apart
    /// are not balanced, and a window exactly `EPSILON` wide is still open.
    #[test]
    fn the_shift_searchs_tolerances_are_strict_bounds() {
        let mut s = ShiftSearch::default();
        const { assert!(DELTA * 100.0 == 5.0, "the case below is exact") };
        let dp = s.compute_shift(0.5, 100.0, 105.0);
        assert_eq!(
            (s.p_lo, s.p_hi, dp),
            (0.5, 1.0, 0.25),
            "5 apart: not balanced"
        );
        let mut s = ShiftSearch {
            p_lo: 0.5,
            p_hi: 0.9,
        };
        let p = 0.5 + EPSILON;
        s.compute_shift(p, 100.0, 50.0);
        assert_eq!((s.p_lo, s.p_hi), (0.5, p), "EPSILON wide: still open");
    }
}
