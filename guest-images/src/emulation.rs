//! Latency emulation, the guest's side: what the runtime does on every
//! workload access when the VMM publishes an emulation region
//! (`--emulate-latency`; [`crate::abi::EmulationHeader`]).
//!
//! Both tiers are the same host DRAM, so a slow-tier access costs what a
//! fast one does. The runtime makes it cost more: after each access the
//! workload reports ([`crate::workloads::Env::access`]) it
//!
//! 1. asks a per-vCPU model of the last-level cache ([`CacheModel`]) whether
//!    the line was there; a hit is not charged (the access never reached
//!    memory, on this host or on the emulated one);
//! 2. otherwise looks the page's tier up in the VMM's tier map (2 bits per
//!    page) and adds the tier's charge, its loaded latency minus the host
//!    DRAM latency measured at boot, to the vCPU's debt ([`Charger`]);
//! 3. once the debt passes a threshold (1 us by default), pays it by
//!    spinning on the TSC ([`Charger::pay`]); kv pays at the end of every
//!    operation ([`Charger::settle`]) so each operation's latency holds its
//!    own charge.
//!
//! Everything here is pure and runs on the host in tests; the runtime
//! (`rt`, feature `image`) wires it to the region and the TSC.

use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::abi::{tier_map_get, EmulationVcpu, CACHE_LINE, EMULATION_MAX_TIERS};

/// Fixed-point fraction bits of charges and debt (1/1024 TSC cycle).
pub const FRAC_BITS: u32 = 10;
/// Preemption one payment excludes at most (~40 ms at 2.6 GHz), so a
/// clock that always jumps cannot stall a vCPU.
pub const MAX_PREEMPTED_CYCLES: u64 = 100_000_000;
/// Sets a cache model looks up at most (32 KiB of tags per model): a
/// larger model (a 32 MiB LLC has 128 Ki sets, 1 MiB of tags per vCPU,
/// which missed the L2 on random workloads and cost 16-25% of their op
/// time) samples one set in `sets / 4096`, as set-sampling cache monitors
/// do (Qureshi & Patt, UCP, MICRO 2006: 32 of 2048 sets estimate the miss
/// ratio). 8192 until 2026-11-26: halving it halved the sampled lookups,
/// each one or two cache misses under a random workload, and took gups'
/// in-run overhead from 1.049-1.056 to 1.044-1.046 (docs/results.md §9).
pub const SAMPLED_SETS_MAX: u32 = 4096;
/// Sampled lookups per tier the miss ratio averages over: each lookup
/// moves the tier's ratio `1 / SAMPLE_WINDOW` of the way to its outcome
/// (an exponential moving average; a few thousand accesses of the tier).
pub const SAMPLE_WINDOW: u32 = 256;
/// Fraction bits of the sampled miss ratio.
const RATIO_BITS: u32 = 24;
/// Lanes of 16 bits, each 1: broadcasts a tag to the four ways.
const LANES_ONE: u64 = 0x0001_0001_0001_0001;
/// The top bit of each 16-bit lane.
const LANES_TOP: u64 = 0x8000_8000_8000_8000;
/// Most accesses counted between two [`Charger::account`]s when no
/// payment is near (e.g. every charge 0).
const BUDGET_MAX: i64 = 1 << 16;
/// The largest charge per access (fixed point: 2^30 TSC cycles, ~0.4 s at
/// 2.6 GHz, far above any tier's): [`Charger::accrue`] adds at most a
/// page's 64 lines of it to a debt below the threshold without overflow.
const CHARGE_MAX: u64 = 1 << (30 + FRAC_BITS);
/// Longest period of access sampling ([`Charger::set_access_sampling`]).
pub const ACCESS_PERIOD_MAX: u32 = 64;
/// Multiplier of the hash that picks a sampled model's lines (and the set
/// and tag they take in it): `block x LINE_HASH` (mod 2^64), a bijection
/// whose top bits depend on every bit of the block (Fibonacci hashing,
/// Knuth TAOCP vol. 3 §6.4; 2^64 / the golden ratio, made odd), for
/// blocks of `2^`[`SAMPLE_BLOCK_BITS`] lines; the line's offset in its
/// block picks which of the block's lines a sampled block samples
/// ([`Charger::sampled_hash`]). So no alignment of a workload's
/// structures (every page's first line, a power-of-two stride) lines up
/// with the sampled lines, as it would with the line's low bits (hardware
/// LLCs hash addresses to slices and sets likewise), and a span of
/// consecutive lines is tested a block at a time, not a line at a time.
pub const LINE_HASH: u64 = 0x9e37_79b9_7f4a_7c15;
/// Lines of a set-sampling block (16 lines, 1 KiB; log2): a model
/// sampling one line in 16 or fewer samples at most one line of a block,
/// so a kv value's 16-line span costs one or two hashes, not 16.
pub const SAMPLE_BLOCK_BITS: u32 = 4;

/// The line a sampled model of `2^set_bits` sets looks up for a line whose
/// hash `h` has its top `drop` bits zero: the next `set_bits` bits of the
/// hash are its set, the 15 after them its tag ([`CacheModel::touch`]).
#[inline(always)]
fn hashed_line(h: u64, drop: u32, set_bits: u32) -> u64 {
    let y = h.checked_shl(drop).unwrap_or(0);
    let set = y.checked_shr(64 - set_bits).unwrap_or(0);
    let tag = (y >> (64 - set_bits.min(49) - 15)) & 0x7fff;
    set | (tag << set_bits)
}

/// The hash a sampled model looks `line` up by, if `line` is sampled
/// (`limit` = `2^(64 - sample_shift)`): the line rotated right by
/// [`SAMPLE_BLOCK_BITS`] (its block below, its offset in the block in the
/// top 4 bits) times [`LINE_HASH`], when the result is below `limit`. The
/// result is the block's hash (`block x LINE_HASH`) with `offset x
/// LINE_HASH (mod 16)` added to its top 4 bits, a bijection of the offset
/// (the multiplier is odd), and the block's lower 60 bits. So:
///
/// 1. with `sample_shift >= 4`, a block is sampled when its hash has bits
///    `64 - sample_shift..60` zero, and of its lines the one whose offset
///    cancels the hash's top 4 bits;
/// 2. with `sample_shift < 4`, every block is, and of its lines the
///    `2^(4 - sample_shift)` whose offsets clear the top `sample_shift`
///    bits.
///
/// Either way each line is sampled with probability `2^-sample_shift`, and
/// the result has its top `sample_shift` bits zero: [`Charger`]'s sample
/// takes the set and tag from the bits below them (two sampled lines of a
/// block differ there), and the host model samples the lines whose result
/// has more top bits zero. A rotate and a multiply.
#[inline(always)]
pub fn sampled_hash(line: u64, limit: u64) -> Option<u64> {
    let h = line.rotate_right(SAMPLE_BLOCK_BITS).wrapping_mul(LINE_HASH);
    (h < limit).then_some(h)
}

/// The inverse of [`LINE_HASH`] modulo 16 (`LINE_HASH = 5 (mod 16)`, and
/// `5 x 13 = 65 = 1 (mod 16)`).
const LINE_HASH_INV_MOD16: u64 = 13;
const _: () = assert!((LINE_HASH & 15) * LINE_HASH_INV_MOD16 % 16 == 1);

/// Calls `f(line, hash)` for every sampled line ([`sampled_hash`]) among
/// `lines` consecutive lines from `first`, block by block (one test per
/// block rather than one per line): the hashes of consecutive blocks are
/// `LINE_HASH` apart, a block holds sampled lines when its hash without
/// the top 4 bits is below `limit`, and a line whose offset is `o` has
/// the top 4 bits `top + o x LINE_HASH (mod 16)` (`top` the block's), so
/// the offsets that give a top `v` (the `v` below `16 >> sample_shift`
/// are sampled) are `(v - top) x LINE_HASH^-1 (mod 16)`.
#[inline(always)]
pub fn for_sampled_lines(
    first: u64,
    lines: u64,
    sample_shift: u32,
    limit: u64,
    mut f: impl FnMut(u64, u64),
) {
    if lines == 0 || sample_shift == 0 {
        return;
    }
    const LOW: u64 = u64::MAX >> SAMPLE_BLOCK_BITS;
    let last = first.saturating_add(lines - 1);
    let (mut block, last_block) = (first >> SAMPLE_BLOCK_BITS, last >> SAMPLE_BLOCK_BITS);
    let per_block = (1u64 << SAMPLE_BLOCK_BITS) >> sample_shift.min(SAMPLE_BLOCK_BITS);
    let mut hb = block.wrapping_mul(LINE_HASH);
    loop {
        if hb & LOW < limit {
            let top = hb >> (64 - SAMPLE_BLOCK_BITS);
            for v in 0..per_block {
                let o = (v.wrapping_sub(top).wrapping_mul(LINE_HASH_INV_MOD16)) & 15;
                let line = (block << SAMPLE_BLOCK_BITS) | o;
                if (first..=last).contains(&line) {
                    f(line, (hb & LOW) | (v << (64 - SAMPLE_BLOCK_BITS)));
                }
            }
        }
        if block >= last_block {
            return;
        }
        block += 1;
        hb = hb.wrapping_add(LINE_HASH);
    }
}

/// A set-associative LRU model of one vCPU's last-level cache: one `u64`
/// per set holding four 16-bit tags, most recently used first. A line's
/// set is its low bits, its tag the next 15 bits with the top bit set (so
/// an empty way, 0, matches no line, and lines alias only `2^15` cache
/// sizes apart: beyond 256 GiB of RAM for a 32 MiB model).
#[derive(Debug)]
pub struct CacheModel<'a> {
    sets: &'a [AtomicU64],
    mask: u64,
    set_bits: u32,
}

impl<'a> CacheModel<'a> {
    /// A model over `sets` (a power-of-two count, zeroed = empty); `None`
    /// for an empty or non-power-of-two array.
    pub fn new(sets: &'a [AtomicU64]) -> Option<Self> {
        let n = sets.len() as u64;
        if n == 0 || !n.is_power_of_two() {
            return None;
        }
        Some(Self {
            sets,
            mask: n - 1,
            set_bits: n.trailing_zeros(),
        })
    }

    /// Lines the model holds.
    pub fn lines(&self) -> u64 {
        (self.mask + 1) * crate::abi::CACHE_MODEL_WAYS
    }

    /// Looks cache line `line` (address / 64) up and makes it its set's most
    /// recently used line (inserting it, evicting the least recent, on a
    /// miss). Returns whether it hit.
    #[inline(always)]
    pub fn touch(&self, line: u64) -> bool {
        let tag = ((line >> self.set_bits) & 0x7fff) | 0x8000;
        let slot = &self.sets[(line & self.mask) as usize];
        let s = slot.load(Relaxed);
        let x = s ^ tag.wrapping_mul(LANES_ONE);
        // The lowest 16-bit lane of `x` that is zero is exact (borrows only
        // propagate upwards from it): that is the way holding `tag`.
        let zero = x.wrapping_sub(LANES_ONE) & !x & LANES_TOP;
        if zero == 0 {
            slot.store((s << 16) | tag, Relaxed);
            return false;
        }
        let shift = zero.trailing_zeros() & !15;
        if shift != 0 {
            let below = s & ((1u64 << shift) - 1);
            let above = if shift == 48 {
                0
            } else {
                s & !((1u64 << (shift + 16)) - 1)
            };
            slot.store(above | (below << 16) | tag, Relaxed);
        }
        true
    }
}

/// Plausible host LLC hit latencies, ps (1 ns .. 200 ns): a boot
/// measurement outside is not used (guest) and not reported (VMM).
pub const LLC_HIT_PS_RANGE: core::ops::RangeInclusive<u64> = 1_000..=200_000;

/// What the guest publishes as `llc_hit_ps` when its boot measurement fell
/// outside [`LLC_HIT_PS_RANGE`] (a loaded host can slow every pass): the
/// measurement ran, and is not used. 0 means it did not run.
pub const LLC_HIT_IMPLAUSIBLE: u64 = u64::MAX;

/// Moves a miss ratio (fixed point, [`RATIO_BITS`]) `1 / SAMPLE_WINDOW`
/// of the way towards one lookup's outcome (an exponential moving average).
fn ratio_towards(ratio: &Cell<u32>, missed: bool) {
    let target = i64::from(missed) << RATIO_BITS;
    let step = (target - i64::from(ratio.get())) >> SAMPLE_WINDOW.trailing_zeros();
    ratio.set((i64::from(ratio.get()) + step) as u32);
}

/// A tier's charge per access in fixed-point TSC cycles (`<< FRAC_BITS`):
/// `max(0, latency - dram)` picoseconds at `tsc_khz`.
pub fn charge_fixed(latency_ps: u64, dram_ps: u64, tsc_khz: u64) -> u64 {
    let extra = u128::from(latency_ps.saturating_sub(dram_ps));
    let c = (extra * u128::from(tsc_khz)) << FRAC_BITS;
    u64::try_from(c / 1_000_000_000).unwrap_or(u64::MAX >> 2)
}

/// What a charge subtracts from a tier's latency: the host's DRAM latency,
/// which every access already costs, unless the fastest tier is emulated
/// faster than that. Then the fastest tier costs the host's DRAM latency
/// (it cannot cost less) and every tier is charged its latency minus the
/// fastest tier's: the differences between tiers are kept, the absolute
/// latencies are offset by `dram - fastest`.
pub fn charge_base_ps(dram_ps: u64, fastest_unloaded_ps: u64) -> u64 {
    dram_ps.min(fastest_unloaded_ps)
}

/// One vCPU's charging state: the tier map, the cache model, the per-tier
/// charges, the debt and the counters it publishes. Not shared: each vCPU
/// has its own (interior mutability through `Cell`).
///
/// Laid out in order, cache-line aligned: what every access reads comes
/// first (one line: the map, the access-sampling state, the budget), then
/// the pending counts (the next line), then what only the cold paths use.
#[repr(C, align(64))]
pub struct Charger<'a> {
    /// The tier map's words covering the map's pages (32 per word; a page
    /// beyond them, or never placed, reads tier 0).
    map: &'a [AtomicU64],
    /// Set sampling: a line whose hash ([`Self::sampled_hash`]) is below
    /// this is looked up (`2^(64 - sample_shift)`; 0 with `sample_shift` 0).
    sample_limit: u64,
    /// Access sampling ([`Self::set_access_sampling`]): a line is looked
    /// up when `(line + 1) x salt <= pick_limit`, and charged `weight` accesses;
    /// `rng` draws the salts.
    salt: Cell<u64>,
    pick_limit: Cell<u64>,
    weight: Cell<u64>,
    /// Accesses left before the debt could reach the threshold (at the
    /// dearest tier's charge): [`Self::account`] runs when it reaches 0,
    /// so a payment starts at the access it would start at if every access
    /// added to the debt itself.
    budget: Cell<i64>,
    /// Set sampling of the cache model: only lines whose hash
    /// ([`LINE_HASH`]) has these top bits zero are looked up (one in
    /// `1 << sample_shift`); 0 = every line, by its low bits.
    sample_shift: u32,
    /// Charge by set sampling alone ([`Self::set_access_sampling`]): an
    /// access whose line is not sampled costs the hash and one compare.
    sets_only: Cell<bool>,
    /// Charged accesses not yet added to the debt, per tier and kind
    /// (index `2 * tier + write`): the hot path only counts, and
    /// [`Self::account`] multiplies by the tier's charge.
    pending: [Cell<u64>; 2 * EMULATION_MAX_TIERS],
    cache: Option<CacheModel<'a>>,
    /// Per tier, the miss ratio of its sampled lookups (fixed point,
    /// [`RATIO_BITS`]; 1 before the first).
    miss_ratio: [Cell<u32>; EMULATION_MAX_TIERS],
    /// A set-sampled model of the host's own LLC, when the cache model is
    /// smaller than it ([`Self::with_host_cache`]): of the accesses the
    /// model misses, those the host's cache serves cost this host less
    /// than its DRAM latency, and are charged the difference on top.
    host: Option<CacheModel<'a>>,
    /// Per tier, of the sampled model misses, the share the host's LLC
    /// model missed too (fixed point, [`RATIO_BITS`]; 1 before the first).
    host_miss_ratio: [Cell<u32>; EMULATION_MAX_TIERS],
    /// What a model miss that hits the host's LLC is charged on top:
    /// host DRAM latency minus LLC hit latency (fixed point).
    host_hit_extra: u64,
    host_hits: Cell<u64>,
    /// Lines whose hash has these top bits zero (or, with an exact model,
    /// whose line has these low bits zero) are looked up in `host`.
    host_shift: u32,
    /// Per tier, what a model miss is charged: the tier's charge plus the
    /// host-LLC extra times its hit share (fixed point).
    miss_charge: [Cell<u64>; EMULATION_MAX_TIERS],
    /// Per tier, the charge per access with sampling: the tier's charge
    /// times its sampled miss ratio (fixed point).
    expected: [Cell<u64>; EMULATION_MAX_TIERS],
    charge: [Cell<u64>; EMULATION_MAX_TIERS],
    threshold: Cell<u64>,
    debt: Cell<i64>,
    /// The dearest charge per access the budget was computed with.
    budget_rate: Cell<u64>,
    rng: Cell<u64>,
    clock: fn() -> u64,
    accesses: [Cell<u64>; EMULATION_MAX_TIERS],
    writes: [Cell<u64>; EMULATION_MAX_TIERS],
    hits: Cell<u64>,
    charged: Cell<u64>,
    paid: Cell<u64>,
    preempted: Cell<u64>,
    payments: Cell<u64>,
    gap: Cell<u64>,
}

// What every access reads fits the first cache line.
const _: () = assert!(core::mem::offset_of!(Charger<'static>, pending) == 64);

impl core::fmt::Debug for Charger<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Charger")
            .field("map_words", &self.map.len())
            .field("cache", &self.cache)
            .field("debt", &self.debt.get())
            .finish_non_exhaustive()
    }
}

impl<'a> Charger<'a> {
    /// A charger over a tier map of `map_pages` pages (`map` holds 32 per
    /// word), with an optional cache model; `clock` is the TSC. Charges
    /// start at 0 ([`Self::set_charges`]).
    pub fn new(
        map: &'a [AtomicU64],
        map_pages: u64,
        cache: Option<CacheModel<'a>>,
        clock: fn() -> u64,
    ) -> Self {
        // The words of the map's pages: a page of the last word beyond them
        // is never placed, so reads 0 like any page beyond the map.
        let words = map_pages.div_ceil(crate::abi::TIER_MAP_PAGES_PER_WORD);
        let map = &map[..usize::try_from(words).map_or(map.len(), |w| w.min(map.len()))];
        // Sample the sets of a model larger than SAMPLED_SETS_MAX, keeping
        // its set index and tags, over the first sets of its array.
        let (cache, sample_shift) = match cache {
            Some(c) => {
                let shift = c.set_bits.saturating_sub(SAMPLED_SETS_MAX.trailing_zeros());
                match CacheModel::new(&c.sets[..c.sets.len() >> shift]) {
                    // A line `l` of a sampled set is looked up as `l >>
                    // shift`: the same set-index bits above the sampled
                    // ones, the same tag bits.
                    Some(m) => (Some(m), shift),
                    None => (Some(c), 0),
                }
            }
            None => (None, 0),
        };
        Self {
            map,
            sample_limit: 1u64.checked_shl(64 - sample_shift).unwrap_or(0),
            cache,
            sample_shift,
            sets_only: Cell::new(false),
            miss_charge: Default::default(),
            miss_ratio: core::array::from_fn(|_| Cell::new(1 << RATIO_BITS)),
            host: None,
            host_shift: 0,
            host_miss_ratio: core::array::from_fn(|_| Cell::new(1 << RATIO_BITS)),
            host_hit_extra: 0,
            host_hits: Cell::new(0),
            expected: Default::default(),
            charge: Default::default(),
            threshold: Cell::new(0),
            debt: Cell::new(0),
            pending: Default::default(),
            budget: Cell::new(0),
            budget_rate: Cell::new(0),
            weight: Cell::new(1),
            pick_limit: Cell::new(u64::MAX),
            salt: Cell::new(1),
            rng: Cell::new(0x9e37_79b9_7f4a_7c15),
            clock,
            accesses: Default::default(),
            writes: Default::default(),
            hits: Cell::new(0),
            charged: Cell::new(0),
            paid: Cell::new(0),
            preempted: Cell::new(0),
            payments: Cell::new(0),
            gap: Cell::new(0),
        }
    }

    /// Adds a model of the host's own LLC, of `host_sets` sets (a power of
    /// two, `host_bytes / 256`), set-sampled like the cache model over the
    /// first sets of `sets` (at most [`SAMPLED_SETS_MAX`]). Use it when the
    /// cache model is smaller than the host's LLC (a scaled model for a
    /// scaled working set): an access the model misses may still hit the
    /// host's cache, and then costs this host its LLC hit latency, not its
    /// DRAM latency. Such accesses are charged `extra` (fixed point, host
    /// DRAM minus LLC hit latency, [`charge_fixed`]) on top of their tier's
    /// charge, in expectation: per tier, the share of the model's misses
    /// that the host model hits, over the sampled sets. Ignored (the
    /// charger is returned unchanged) for a host model not larger than the
    /// cache model or without a cache model.
    pub fn with_host_cache(mut self, sets: &'a [AtomicU64], host_sets: u64, extra: u64) -> Self {
        let Some(cache) = &self.cache else {
            return self;
        };
        let cache_sets_log2 = cache.set_bits + self.sample_shift;
        let usable = (sets.len() as u64).min(u64::from(SAMPLED_SETS_MAX));
        if !host_sets.is_power_of_two()
            || usable == 0
            || host_sets.trailing_zeros() <= cache_sets_log2
        {
            return self;
        }
        let used = (1u64 << (63 - usable.leading_zeros())).min(host_sets);
        let Some(m) = CacheModel::new(&sets[..used as usize]) else {
            return self;
        };
        self.host_shift = host_sets.trailing_zeros() - used.trailing_zeros();
        self.host = Some(m);
        self.host_hit_extra = extra;
        for t in 0..EMULATION_MAX_TIERS {
            self.update_expected(t);
        }
        self
    }

    /// Sets each tier's charge (fixed point, [`charge_fixed`]) and the debt
    /// at which [`Self::access`] pays (fixed point). Accesses counted
    /// before are charged at the charges they were made under.
    pub fn set_charges(&self, charges: [u64; EMULATION_MAX_TIERS], threshold: u64) {
        self.flush_pending();
        for (c, v) in self.charge.iter().zip(charges) {
            c.set(v);
        }
        for t in 0..EMULATION_MAX_TIERS {
            self.update_expected(t);
        }
        self.threshold.set(threshold.min(i64::MAX as u64 >> 1));
        self.account();
    }

    /// The tier the map gives for the page holding `addr` (0 outside the map).
    #[inline(always)]
    pub fn tier_of(&self, addr: u64) -> usize {
        let page = addr >> 12;
        let word = self
            .map
            .get((page / crate::abi::TIER_MAP_PAGES_PER_WORD) as usize)
            .map_or(0, |w| w.load(Relaxed));
        tier_map_get(word, page) as usize
    }

    /// Charges the access the workload just made to the line at `addr`:
    /// a cache-model hit is free; a miss costs its tier's charge, paid once
    /// the debt passes the threshold.
    ///
    /// With a sampled model (`sample_shift > 0`) one line in `2^shift` is
    /// looked up ([`Self::sampled_hash`]). When
    /// every access is charged (settling workloads), every access of a tier
    /// is charged the tier's charge times the miss ratio its sampled
    /// lookups show (the expected charge), looking its tier up; otherwise
    /// (`sets_only`, the default) only a sampled line's miss is charged,
    /// `2^shift` times (set sampling's estimate), and an access to any
    /// other line costs a multiply and a compare. The counters count each
    /// sampled hit and miss `2^shift` times.
    ///
    /// The every-access path looks the tier up and counts the access; the
    /// charge is added to the debt in [`Self::account`], before the debt
    /// could reach the threshold, at every [`Self::settle`] and before the
    /// counters are read.
    #[inline(always)]
    pub fn access(&self, addr: u64, write: bool) {
        let line = addr / CACHE_LINE;
        if self.sets_only.get() {
            if let Some(h) = self.sampled_hash(line) {
                self.sample(addr, h, write);
            }
            return;
        }
        if self.sample_shift == 0 {
            if let Some(c) = &self.cache {
                let hit = c.touch(line);
                if self.host.is_some() && line & ((1 << self.host_shift) - 1) == 0 {
                    self.host_lookup(addr, line, hit);
                }
                if hit {
                    self.hits.set(self.hits.get() + 1);
                    return;
                }
            }
        } else {
            // A sampled model charging every access (settling workloads,
            // `sample=1`): no access sampling (a period above 1 charges by
            // set sampling alone), so each access adds its tier's expected
            // charge to the debt itself.
            if let Some(h) = self.sampled_hash(line) {
                self.sample(addr, h, write);
            }
            self.accrue(self.tier_of(addr), 1);
            return;
        }
        // Access sampling: only lines the current hash picks are looked up
        // (all of them when every access is charged), each charged for
        // `weight` accesses. No store on the path of the others.
        if (line + 1).wrapping_mul(self.salt.get()) > self.pick_limit.get() {
            return;
        }
        self.count(self.tier_of(addr), write, self.weight.get());
    }

    /// Charges one access in `period` (a power of two, at most
    /// [`ACCESS_PERIOD_MAX`]; 1 charges every access): an access is looked
    /// up when a multiplicative hash of its line, `(line + 1) x salt` with
    /// a random odd `salt`, falls in the lowest `1 / period` of its range,
    /// and is then charged `period` accesses. For a random odd salt every
    /// line is picked with probability `1 / period` (the product is a
    /// uniform odd number shifted left by the trailing zeros of `line + 1`,
    /// fewer than 58), so every access's expected charge is its own,
    /// whatever the access pattern; the salt is redrawn at every
    /// [`Self::account`] and [`Self::counters`], so a line is not picked or
    /// skipped for long.
    ///
    /// With a set-sampled model a period above 1 charges by set sampling
    /// alone (`sets_only`, [`Self::access`]), which needs no access
    /// sampling: a miss of a sampled line stands for the `2^shift` lines of
    /// its kind, whatever the access pattern.
    pub fn set_access_sampling(&self, period: u32) {
        let p = period.clamp(1, ACCESS_PERIOD_MAX).next_power_of_two();
        self.weight.set(u64::from(p));
        self.pick_limit.set(if p == 1 {
            u64::MAX
        } else {
            u64::MAX / u64::from(p)
        });
        self.redraw_salt();
        // A set-sampled model charges by itself: only its sampled misses.
        self.flush_pending();
        self.sets_only
            .set(p > 1 && self.sample_shift > 0 && self.cache.is_some());
    }

    /// A new random odd salt for access sampling (xorshift64, Marsaglia
    /// 2003).
    fn redraw_salt(&self) {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        self.salt.set(x | 1);
    }

    /// Whether one access in several is charged ([`Self::set_access_sampling`]).
    pub fn samples_accesses(&self) -> bool {
        self.weight.get() > 1
    }

    /// [`Self::access`] of `lines` consecutive cache lines from `addr`
    /// (`addr`, `addr + 64`, ...): one tier lookup per page they span.
    /// Charges and counters are those of `lines` calls of
    /// [`Self::access`], except that a payment due within the span starts
    /// at its end.
    #[inline]
    pub fn access_span(&self, addr: u64, lines: u64, write: bool) {
        if self.sets_only.get() {
            self.sample_span(addr, lines, write);
            return;
        }
        if lines == 1 || (self.sample_shift == 0 && self.cache.is_some()) {
            // An exact model looks every line up.
            for i in 0..lines {
                self.access(addr.wrapping_add(i * CACHE_LINE), write);
            }
            return;
        }
        if self.sample_shift > 0 {
            self.sample_span(addr, lines, write);
        }
        let (mut a, mut left) = (addr, lines);
        while left > 0 {
            let in_page = ((a | 0xfff) - a) / CACHE_LINE + 1;
            let n = left.min(in_page);
            if self.sample_shift > 0 {
                self.accrue(self.tier_of(a), n);
            } else {
                self.count(self.tier_of(a), write, n);
            }
            a = a.wrapping_add(n * CACHE_LINE);
            left -= n;
        }
    }

    /// [`sampled_hash`] with this charger's limit.
    #[inline(always)]
    fn sampled_hash(&self, line: u64) -> Option<u64> {
        sampled_hash(line, self.sample_limit)
    }

    /// [`Self::sample`]s the sampled lines among `lines` consecutive ones
    /// from `addr` ([`for_sampled_lines`]).
    #[inline(always)]
    fn sample_span(&self, addr: u64, lines: u64, write: bool) {
        let first = addr / CACHE_LINE;
        if lines == 1 {
            if let Some(h) = self.sampled_hash(first) {
                self.sample(addr, h, write);
            }
            return;
        }
        for_sampled_lines(
            first,
            lines,
            self.sample_shift,
            self.sample_limit,
            |line, h| self.sample(line * CACHE_LINE, h, write),
        );
    }

    /// Counts `n` charged accesses of `tier`; accounts them once the
    /// budget is spent.
    #[inline(always)]
    fn count(&self, tier: usize, write: bool, n: u64) {
        let p = &self.pending[2 * tier + usize::from(write)];
        p.set(p.get() + n);
        let b = self.budget.get() - n as i64;
        self.budget.set(b);
        if b <= 0 {
            self.account();
        }
    }

    /// Adds `n` accesses of `tier` at its expected charge to the debt
    /// and pays past the threshold: the path of a sampled model charging
    /// every access, whose access counters [`Self::sample`] keeps (so
    /// nothing is left pending for [`Self::settle`] to flush).
    ///
    /// `n` is at most a page's lines (64) and a charge at most
    /// [`CHARGE_MAX`], so the product fits 2^46, and the debt, below
    /// the threshold (at most `i64::MAX / 2`) before, cannot overflow.
    #[inline(always)]
    fn accrue(&self, tier: usize, n: u64) {
        debug_assert!(n <= 4096 / CACHE_LINE);
        let c = n.min(4096 / CACHE_LINE) * self.expected[tier].get();
        self.charged.set(self.charged.get().wrapping_add(c));
        let d = self.debt.get().wrapping_add(c as i64);
        self.debt.set(d);
        if d >= self.threshold.get() as i64 {
            self.pay();
        }
    }

    /// One sampled lookup of the line at `addr`, whose hash is `h`: counts
    /// it (scaled), updates its tier's expected charge and, charging by set
    /// sampling alone, charges a miss `2^shift` times its tier's miss
    /// charge.
    #[cold]
    #[inline(never)]
    fn sample(&self, addr: u64, h: u64, write: bool) {
        let Some(c) = &self.cache else {
            return;
        };
        let tier = self.tier_of(addr);
        // Accesses counted but not yet accounted are charged at the
        // expected charge this lookup moves by at most 1/256: not flushed
        // first (it is the hot cold path of spans).
        let hit = c.touch(hashed_line(h, self.sample_shift, c.set_bits));
        // Host-sampled lines are a subset of the sampled ones (the host
        // model is the larger: more of the hash's top bits are zero).
        if let Some(hm) = &self.host {
            if h.checked_shr(64 - self.host_shift).unwrap_or(0) == 0 {
                let l = hashed_line(h, self.host_shift, hm.set_bits);
                self.host_touch(tier, l, hit);
            }
        }
        let scale = 1u64 << self.sample_shift;
        if hit {
            self.hits.set(self.hits.get() + scale);
        } else {
            self.accesses[tier].set(self.accesses[tier].get() + scale);
            if write {
                self.writes[tier].set(self.writes[tier].get() + scale);
            }
        }
        ratio_towards(&self.miss_ratio[tier], !hit);
        self.refresh_expected(tier);
        if !hit && self.sets_only.get() {
            let c = scale.saturating_mul(self.miss_charge[tier].get());
            self.charged.set(self.charged.get().wrapping_add(c));
            let c = i64::try_from(c).unwrap_or(i64::MAX);
            self.debt.set(self.debt.get().saturating_add(c));
            if self.debt.get() >= self.threshold.get() as i64 {
                self.pay();
            }
        }
    }

    /// [`Self::update_expected`] after a ratio of `tier` moved; the budget
    /// stays safe while no charge exceeds the one it was computed with.
    fn refresh_expected(&self, tier: usize) {
        self.update_expected(tier);
        if self.expected[tier].get() > self.budget_rate.get() {
            self.rebudget();
        }
    }

    /// The expected charge per access of `tier`: its charge times its
    /// sampled miss ratio (the full charge before any sample). With a host
    /// LLC model, a model miss that hits the host's cache costs
    /// [`Self::host_hit_extra`] more: the charge is `charge + extra x (1 -
    /// host miss ratio)`, times the model's miss ratio.
    fn update_expected(&self, tier: usize) {
        let one = 1u128 << RATIO_BITS;
        let host_hit = one - u128::from(self.host_miss_ratio[tier].get()).min(one);
        let extra = if self.host.is_some() {
            (u128::from(self.host_hit_extra) * host_hit) >> RATIO_BITS
        } else {
            0
        };
        let c = u128::from(self.charge[tier].get()) + extra;
        self.miss_charge[tier].set(u64::try_from(c).map_or(CHARGE_MAX, |c| c.min(CHARGE_MAX)));
        let e = (c * u128::from(self.miss_ratio[tier].get())) >> RATIO_BITS;
        self.expected[tier].set(u64::try_from(e).map_or(CHARGE_MAX, |e| e.min(CHARGE_MAX)));
    }

    /// [`Self::host_touch`] from the exact path, which knows the line but
    /// not yet its tier.
    #[cold]
    #[inline(never)]
    fn host_lookup(&self, addr: u64, line: u64, model_hit: bool) {
        let tier = if model_hit { 0 } else { self.tier_of(addr) };
        self.host_touch(tier, line >> self.host_shift, model_hit);
    }

    /// Looks a host-sampled line up in the host LLC model (`line` as that
    /// model indexes it); for a model miss, moves its tier's host miss
    /// ratio towards the outcome.
    fn host_touch(&self, tier: usize, line: u64, model_hit: bool) {
        let Some(h) = &self.host else {
            return;
        };
        let host_hit = h.touch(line);
        if model_hit {
            return;
        }
        if host_hit {
            self.host_hits
                .set(self.host_hits.get() + (1u64 << self.host_shift));
        }
        ratio_towards(&self.host_miss_ratio[tier], !host_hit);
        self.refresh_expected(tier);
    }

    /// Adds the counted accesses' charges to the debt (and, without a
    /// sampled model, to the access counters).
    fn flush_pending(&self) {
        for t in 0..EMULATION_MAX_TIERS {
            self.flush_tier(t);
        }
    }

    /// [`Self::flush_pending`] of one tier.
    #[inline(always)]
    fn flush_tier(&self, t: usize) {
        let (r, w) = (self.pending[2 * t].get(), self.pending[2 * t + 1].get());
        let n = r + w;
        if n == 0 {
            return;
        }
        self.pending[2 * t].set(0);
        self.pending[2 * t + 1].set(0);
        if self.sample_shift == 0 {
            self.accesses[t].set(self.accesses[t].get() + n);
            self.writes[t].set(self.writes[t].get() + w);
        }
        let c = n.saturating_mul(self.expected[t].get());
        self.charged.set(self.charged.get().wrapping_add(c));
        let c = i64::try_from(c).unwrap_or(i64::MAX);
        self.debt.set(self.debt.get().saturating_add(c));
    }

    /// Adds what was counted to the debt and pays past the threshold.
    #[cold]
    #[inline(never)]
    fn account(&self) {
        self.flush_pending();
        self.redraw_salt();
        if self.debt.get() >= self.threshold.get() as i64 {
            self.pay();
        }
        self.rebudget();
    }

    /// Accesses at the dearest tier's charge the debt can take before it
    /// reaches the threshold (at least 1, at most [`BUDGET_MAX`]).
    fn rebudget(&self) {
        let dearest = self.expected.iter().map(Cell::get).max().unwrap_or(0);
        self.budget_rate.set(dearest);
        let room = (self.threshold.get() as i64).saturating_sub(self.debt.get());
        let b = match (room, dearest) {
            (..=0, _) => 1,
            (_, 0) => BUDGET_MAX,
            (r, d) => (r as u64).div_ceil(d).min(BUDGET_MAX as u64) as i64,
        };
        self.budget.set(b);
    }

    /// Pays whatever is owed now (kv: at the end of every operation). A
    /// vCPU that settles pays per operation, so from then on every access
    /// is charged (access sampling would make each operation's charge
    /// lumpy, and its latency percentiles wrong).
    #[inline(always)]
    pub fn settle(&self) {
        if self.samples_accesses() {
            self.set_access_sampling(1);
        }
        // With a sampled model every access was added to the debt as it
        // was made ([`Self::accrue`]): nothing is pending.
        if self.sample_shift == 0 {
            self.flush_pending();
        }
        if self.debt.get() >= 1 << FRAC_BITS {
            self.pay();
            self.rebudget();
        }
    }

    /// Sets the longest clock step a payment counts (TSC cycles; 0 = any):
    /// a longer one means the vCPU did not run (the host preempted it).
    pub fn set_preemption_gap(&self, cycles: u64) {
        self.gap.set(cycles);
    }

    /// Spins on the clock until the whole debt is paid **in time the vCPU
    /// runs**: a clock step longer than the preemption gap (the host took
    /// the vCPU away) pays nothing and is counted as preempted, so a
    /// policy that spins more is not favoured by host noise landing in its
    /// spins. (Bounded: after [`MAX_PREEMPTED_CYCLES`] of preemption in
    /// one payment every step counts as paid.) The overshoot of the last step
    /// is credited against the next charges, up to one threshold.
    #[cold]
    #[inline(never)]
    fn pay(&self) {
        let debt = self.debt.get();
        if debt <= 0 {
            return;
        }
        let owed = (debt as u64) >> FRAC_BITS;
        let gap = match self.gap.get() {
            0 => u64::MAX,
            g => g,
        };
        let give_up = MAX_PREEMPTED_CYCLES;
        let (mut progress, mut lost) = (0u64, 0u64);
        let mut prev = (self.clock)();
        while progress < owed {
            core::hint::spin_loop();
            let now = (self.clock)();
            let step = now.wrapping_sub(prev);
            prev = now;
            if step > gap && lost < give_up {
                lost = lost.saturating_add(step);
            } else {
                progress = progress.saturating_add(step);
            }
        }
        self.paid.set(self.paid.get().wrapping_add(progress));
        self.preempted.set(self.preempted.get().wrapping_add(lost));
        self.payments.set(self.payments.get() + 1);
        let credit_floor = -(self.threshold.get() as i64);
        let left =
            debt.saturating_sub((progress.min(i64::MAX as u64 >> FRAC_BITS) << FRAC_BITS) as i64);
        self.debt.set(left.max(credit_floor));
    }

    /// The counters as the ABI publishes them (what was counted is
    /// charged first).
    pub fn counters(&self) -> EmulationVcpu {
        self.flush_pending();
        self.redraw_salt();
        let mut v = EmulationVcpu::default();
        for t in 0..EMULATION_MAX_TIERS {
            v.accesses[t] = self.accesses[t].get();
            v.writes[t] = self.writes[t].get();
        }
        v.cache_hits = self.hits.get();
        v.host_cache_hits = self.host_hits.get();
        v.charged_cycles = self.charged.get() >> FRAC_BITS;
        v.paid_cycles = self.paid.get();
        v.preempted_cycles = self.preempted.get();
        v.payments = self.payments.get();
        v
    }

    /// The debt not yet paid, fixed point (tests).
    pub fn debt(&self) -> i64 {
        self.flush_pending();
        self.debt.get()
    }
}

/// Charging switched on and off within one run (`ab=on`,
/// [`crate::abi::EmulationHeader::ab_phase_ops`]): what emulation costs a
/// workload, measured side by side in one VM. Between runs, where the host
/// placed a guest's memory and what else the host ran move op times by
/// more than the cost being measured; phases of a few thousand operations,
/// alternating, see the same host. Charging starts on; every `phase_ops`
/// operations it flips, and the phase's operations and TSC cycles are
/// added to its half.
#[derive(Debug)]
pub struct ChargingAb {
    phase_ops: u64,
    charging: Cell<bool>,
    /// Operations and TSC at the start of the current phase (`None` before
    /// the first publication).
    start: Cell<Option<(u64, u64)>>,
    on: Cell<(u64, u64)>,
    off: Cell<(u64, u64)>,
    /// The last charging phase's cycles per operation (fixed point
    /// [`AB_FRAC_BITS`]), for the pair it forms with the next phase.
    last_on: Cell<Option<u64>>,
    /// Per pair of adjacent phases (charging, then not), the ratio of their
    /// times per operation, binned ([`ab_ratio_bin`]): noise on a shared
    /// host comes in bursts that slow a few phases a lot, and the median
    /// pair is unmoved by them where sums are not.
    pairs: [Cell<u32>; AB_BINS],
}

/// Fraction bits of an `ab=on` phase's cycles per operation.
const AB_FRAC_BITS: u32 = 20;
/// Bins of `ab=on` pair ratios: 0.5 to 1.5 in steps of 0.25%, the first
/// and last also holding everything beyond.
pub const AB_BINS: usize = 400;
/// Width of an `ab=on` ratio bin.
pub const AB_BIN_WIDTH: f64 = 0.0025;
/// The ratio of the lowest `ab=on` bin.
pub const AB_BIN_LOW: f64 = 0.5;

/// The bin of an `ab=on` pair ratio `on / off` (cycles per operation,
/// fixed point).
pub fn ab_ratio_bin(on: u64, off: u64) -> usize {
    if off == 0 {
        return AB_BINS - 1;
    }
    // (ratio - 0.5) / 0.0025 = (400 on - 200 off) / off
    let x = (400 * u128::from(on)).saturating_sub(200 * u128::from(off)) / u128::from(off);
    usize::try_from(x).unwrap_or(AB_BINS - 1).min(AB_BINS - 1)
}

/// The ratio an `ab=on` bin stands for (its middle).
pub fn ab_bin_ratio(bin: usize) -> f64 {
    AB_BIN_LOW + (bin as f64 + 0.5) * AB_BIN_WIDTH
}

/// The median ratio of binned `ab=on` pairs (the middle of its bin), and
/// how many pairs there were; `None` without pairs.
pub fn ab_median_ratio(bins: &[u64]) -> Option<(f64, u64)> {
    let n: u64 = bins.iter().sum();
    if n == 0 {
        return None;
    }
    let mut seen = 0;
    for (i, b) in bins.iter().enumerate() {
        seen += b;
        if 2 * seen >= n {
            return Some((ab_bin_ratio(i), n));
        }
    }
    None
}

impl ChargingAb {
    /// Phases of `phase_ops` operations (at least 1), charging first.
    pub fn new(phase_ops: u64) -> Self {
        Self {
            phase_ops: phase_ops.max(1),
            charging: Cell::new(true),
            start: Cell::new(None),
            on: Cell::new((0, 0)),
            off: Cell::new((0, 0)),
            last_on: Cell::new(None),
            pairs: core::array::from_fn(|_| Cell::new(0)),
        }
    }

    /// Whether the current phase charges.
    #[inline(always)]
    pub fn charging(&self) -> bool {
        self.charging.get()
    }

    /// At a publication of the op counter: `ops` operations done, TSC
    /// `now`. Ends the phase once it has run `phase_ops` operations and
    /// returns whether the next one charges.
    pub fn at(&self, ops: u64, now: u64) -> bool {
        let Some((ops0, t0)) = self.start.get() else {
            self.start.set(Some((ops, now)));
            return self.charging.get();
        };
        let n = ops.saturating_sub(ops0);
        if n < self.phase_ops {
            return self.charging.get();
        }
        let half = if self.charging.get() {
            &self.on
        } else {
            &self.off
        };
        let (o, c) = half.get();
        let cycles = now.wrapping_sub(t0);
        half.set((o + n, c.wrapping_add(cycles)));
        let per_op =
            u64::try_from((u128::from(cycles) << AB_FRAC_BITS) / u128::from(n)).unwrap_or(u64::MAX);
        if self.charging.get() {
            self.last_on.set(Some(per_op));
        } else if let Some(on) = self.last_on.take() {
            let b = &self.pairs[ab_ratio_bin(on, per_op)];
            b.set(b.get().saturating_add(1));
        }
        self.start.set(Some((ops, now)));
        self.charging.set(!self.charging.get());
        self.charging.get()
    }

    /// Operations and TSC cycles of the completed charging phases, then of
    /// the completed phases without charging.
    pub fn halves(&self) -> ((u64, u64), (u64, u64)) {
        (self.on.get(), self.off.get())
    }

    /// Completed pairs per ratio bin ([`ab_ratio_bin`]).
    pub fn pair_bins(&self) -> impl Iterator<Item = u32> + '_ {
        self.pairs.iter().map(Cell::get)
    }
}

/// Multiplier and increment of the pointer chase's full-period LCG modulo a
/// power of two (Knuth's MMIX constants: `a % 4 == 1`, `c` odd).
const CHASE_A: u64 = 6_364_136_223_846_793_005;
const CHASE_C: u64 = 1_442_695_040_888_963_407;

/// Lines of a chase over `words` (the largest power of two that fits).
pub fn chase_lines(words: usize) -> u64 {
    let lines = (words as u64) / (CACHE_LINE / 8);
    if lines == 0 {
        0
    } else {
        1 << (63 - lines.leading_zeros())
    }
}

/// Links every cache line of `buf` into one cycle in a pseudo-random order
/// (a full-period LCG over the line indices, so no prefetcher can follow
/// it): the first word of each line holds the word index of the next.
/// Returns the number of lines in the cycle.
pub fn build_chase(buf: &[AtomicU64]) -> u64 {
    let lines = chase_lines(buf.len());
    let per = CACHE_LINE / 8;
    let mut x = 0u64;
    for _ in 0..lines {
        let next = x.wrapping_mul(CHASE_A).wrapping_add(CHASE_C) & (lines - 1);
        buf[(x * per) as usize].store(next * per, Relaxed);
        x = next;
    }
    lines
}

/// Follows the chase for `hops` dependent loads from word `from` (0: the
/// start; a previous chase's end to go on along the cycle); returns where
/// it ended (so the loads cannot be optimised away).
#[inline(never)]
pub fn chase(buf: &[AtomicU64], from: u64, hops: u64) -> u64 {
    let mut i = from;
    for _ in 0..hops {
        i = buf.get(i as usize).map_or(0, |w| w.load(Relaxed));
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn zeroed(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn cache_model_is_four_way_lru() {
        let sets = zeroed(8);
        let c = CacheModel::new(&sets).unwrap();
        assert_eq!(c.lines(), 32);
        // Lines 8 apart share set 0 (tags 1, 2, ...).
        let l = |i: u64| i * 8;
        for i in 1..=4 {
            assert!(!c.touch(l(i)), "cold miss {i}");
        }
        for i in 1..=4 {
            assert!(c.touch(l(i)), "four ways hold {i}");
        }
        // 1 is now the least recent: touching 5 evicts it.
        assert!(!c.touch(l(5)));
        assert!(!c.touch(l(1)), "the least recent line was evicted");
        // 1 evicted 2; 3, 4, 5 stay.
        assert!(c.touch(l(3)) && c.touch(l(4)) && c.touch(l(5)));
        assert!(!c.touch(l(2)));
        // Other sets are independent (line 9: set 1, tag 1).
        assert!(!c.touch(9) && c.touch(9));
        assert!(CacheModel::new(&sets[..6]).is_none());
    }

    #[test]
    fn a_set_sized_working_set_hits_and_a_bigger_one_misses() {
        let hits = |lines: u64, rounds: u64| {
            let sets = zeroed(1024);
            let c = CacheModel::new(&sets).unwrap();
            let mut h = 0;
            for _ in 0..rounds {
                for i in 0..lines {
                    h += u64::from(c.touch(i * 7919));
                }
            }
            h as f64 / (lines * rounds) as f64
        };
        // A quarter of the capacity (1024 lines) fits.
        assert!(hits(1024, 10) > 0.85);
        // A cyclic scan of 8x the capacity always misses under LRU.
        let big = hits(32 * 1024, 3);
        assert!(big < 0.01, "{big}");
    }

    fn fake_clock() -> u64 {
        use std::sync::atomic::AtomicU64;
        static NOW: AtomicU64 = AtomicU64::new(0);
        NOW.fetch_add(7, Relaxed)
    }

    #[test]
    fn charges_follow_the_tier_map_and_are_paid() {
        // 64 pages: 0..32 on tier 0, 32..64 on tier 1.
        let map = zeroed(2);
        map[1].store(0x5555_5555_5555_5555, Relaxed);
        let ch = Charger::new(&map, 64, None, fake_clock);
        // 1 GHz TSC: 1 cycle per ns. Tier 0: 100 ns (= DRAM, free), tier 1: 300 ns.
        let c = [
            charge_fixed(100_000, 100_000, 1_000_000),
            charge_fixed(300_000, 100_000, 1_000_000),
            0,
            0,
        ];
        assert_eq!(c[1] >> FRAC_BITS, 200);
        ch.set_charges(c, 1000 << FRAC_BITS);
        for i in 0..100 {
            let page = if i % 2 == 0 { 3 } else { 40 };
            ch.access(page * 4096 + 64 * (i % 64), i % 2 == 0);
        }
        let v = ch.counters();
        assert_eq!(v.accesses[0] + v.accesses[1], 100);
        assert_eq!(v.accesses[1], 50, "pages 32..64 are tier 1");
        assert_eq!(v.writes, [50, 0, 0, 0]);
        assert_eq!(v.charged_cycles, 50 * 200);
        // 200 cycles per slow access, 1000 to pay: a payment every 5 or 6
        // slow accesses (a payment's overshoot is credited).
        assert!((8..=10).contains(&v.payments), "{v:?}");
        ch.settle();
        let v = ch.counters();
        // Everything charged is paid, within one clock step per payment.
        assert!(v.paid_cycles >= v.charged_cycles);
        assert!(v.paid_cycles <= v.charged_cycles + 7 * v.payments);
        assert!(ch.debt() <= 0);
        // Outside the map: tier 0.
        assert_eq!(ch.tier_of(1 << 40), 0);
    }

    #[test]
    fn cache_hits_are_not_charged() {
        let map = zeroed(1);
        map[0].store(!0, Relaxed); // every page on tier 3
        let sets = zeroed(64);
        let ch = Charger::new(&map, 32, CacheModel::new(&sets), fake_clock);
        ch.set_charges([0, 0, 0, 500 << FRAC_BITS], u64::MAX);
        for _ in 0..10 {
            for line in 0..16u64 {
                ch.access(line * 64, false);
            }
        }
        let v = ch.counters();
        assert_eq!(v.accesses[3], 16, "only the cold misses");
        assert_eq!(v.cache_hits, 144);
        assert_eq!(v.charged_cycles, 16 * 500);
    }

    /// A 16 KiB cache model on a host with a 4 MiB LLC (4 x `SAMPLED_SETS_MAX` sets, its
    /// model sampled one set in four): charged accesses per tier-3 access
    /// over the second half of `accesses` random accesses to `lines` lines,
    /// and the host model's hit share among them.
    fn charge_with_host_model(lines: u64, host: bool) -> (f64, f64) {
        let map = zeroed(1024);
        for w in &map {
            w.store(!0, Relaxed);
        }
        let (sets, host_sets) = (zeroed(64), zeroed(SAMPLED_SETS_MAX as usize));
        let mut ch = Charger::new(&map, 32 * 1024, CacheModel::new(&sets), fake_clock);
        if host {
            ch = ch.with_host_cache(
                &host_sets,
                u64::from(SAMPLED_SETS_MAX) * 4,
                300 << FRAC_BITS,
            );
            assert_eq!(ch.host_shift, 2);
        }
        ch.set_charges([0, 0, 0, 500 << FRAC_BITS], u64::MAX);
        let mut x = 1;
        for _ in 0..300_000 {
            ch.access(lcg(&mut x, lines) * 64, false);
        }
        let a = ch.counters();
        for _ in 0..300_000 {
            ch.access(lcg(&mut x, lines) * 64, false);
        }
        let b = ch.counters();
        let n = (b.accesses[3] - a.accesses[3]) as f64;
        (
            (b.charged_cycles - a.charged_cycles) as f64 / n,
            (b.host_cache_hits - a.host_cache_hits) as f64 / n,
        )
    }

    /// A scaled cache model: a working set that misses the model but fits
    /// the host's LLC is charged the host's DRAM - LLC hit difference on
    /// top of the tier's charge (what its accesses cost this host less);
    /// one beyond both is charged about the tier's charge alone.
    #[test]
    fn a_host_llc_model_charges_what_the_host_cache_saved() {
        // 1 MiB: misses the 16 KiB model, fits the 4 MiB host LLC.
        let (fits, hit) = charge_with_host_model(1 << 14, true);
        assert!(hit > 0.95, "host hit share {hit}");
        assert!((fits - 800.0).abs() < 0.03 * 800.0, "{fits}");
        // Without the host model: the tier's charge only.
        let (plain, hit) = charge_with_host_model(1 << 14, false);
        assert_eq!(hit, 0.0);
        assert!((plain - 500.0).abs() < 0.01 * 500.0, "{plain}");
        // 64 MiB: the host LLC holds an eighth of it.
        let (big, hit) = charge_with_host_model(1 << 20, true);
        assert!(hit < 0.2, "host hit share {hit}");
        let want = 500.0 + 300.0 * hit;
        assert!((big - want).abs() < 0.03 * want, "{big} vs {want}");
        // A host model not larger than the cache model is refused.
        let (map, sets, host_sets) = (zeroed(1), zeroed(64), zeroed(64));
        let ch = Charger::new(&map, 32, CacheModel::new(&sets), fake_clock)
            .with_host_cache(&host_sets, 64, 1);
        assert!(ch.host.is_none());
    }

    /// A model of 4 x `SAMPLED_SETS_MAX` sets (4 MiB) is sampled one set in four; `charges`
    /// per tier (cycles).
    fn sampled_charger<'a>(
        map: &'a [AtomicU64],
        sets: &'a [AtomicU64],
        charges: [u64; 4],
    ) -> Charger<'a> {
        let ch = Charger::new(
            map,
            map.len() as u64 * 32,
            CacheModel::new(sets),
            fake_clock,
        );
        assert_eq!(ch.sample_shift, 2);
        ch.set_charges(charges.map(|c| c << FRAC_BITS), u64::MAX);
        ch
    }

    /// The charge of `n` random accesses to `lines` lines after `n` more
    /// that warm the model (cycles).
    fn charged_after_warming(ch: &Charger<'_>, x: &mut u64, lines: u64, n: u64) -> u64 {
        for _ in 0..n {
            ch.access(lcg(x, lines) * 64, false);
        }
        let warm = ch.counters().charged_cycles;
        for _ in 0..n {
            ch.access(lcg(x, lines) * 64, false);
        }
        ch.counters().charged_cycles - warm
    }

    /// A pseudo-random line of `lines` (an LCG walk).
    fn lcg(x: &mut u64, lines: u64) -> u64 {
        *x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*x >> 20) % lines
    }

    #[test]
    fn a_sampled_model_charges_the_expected_misses() {
        // 128 MiB of pages, every one on tier 3.
        let map = zeroed(1024);
        for w in &map {
            w.store(!0, Relaxed);
        }
        let sets = zeroed(SAMPLED_SETS_MAX as usize * 4);
        // A hot set of a quarter of the model, touched at random: after the
        // cold misses, free.
        let ch = sampled_charger(&map, &sets, [0, 0, 0, 500]);
        let mut x = 1;
        let n = 2_000_000u64;
        let hot = charged_after_warming(&ch, &mut x, 32 * 1024, n);
        assert!(
            hot < n * 500 / 50,
            "a cache-resident set charged {hot} of {}",
            n * 500
        );
        let hit = ch.counters().cache_hits;
        assert!(hit > n, "sampled hits are counted scaled: {hit}");
        // Sixteen times the model, at random: almost every access misses,
        // and the sampled charge is the exact model's within 3%.
        let sets2 = zeroed(SAMPLED_SETS_MAX as usize * 4);
        let ch = sampled_charger(&map, &sets2, [0, 0, 0, 500]);
        let exact_sets = zeroed(SAMPLED_SETS_MAX as usize * 4);
        let model = CacheModel::new(&exact_sets).unwrap();
        let mut misses = 0u64;
        for _ in 0..n {
            let line = lcg(&mut x, 2 << 20);
            ch.access(line * 64, false);
            if !model.touch(line) {
                misses += 1;
            }
        }
        let big = ch.counters().charged_cycles as f64;
        let want = (misses * 500) as f64;
        assert!(
            (big / want - 1.0).abs() < 0.03,
            "sampled {big} vs exact {want}"
        );
        assert!(misses > n * 9 / 10);
    }

    /// Charging by set sampling alone (`sets_only`, access sampling on):
    /// only sampled lines are looked up, and a miss of one is charged for
    /// the `2^shift` lines it stands for.
    #[test]
    fn a_span_samples_exactly_the_lines_sampled_one_by_one() {
        let mut x = 7u64;
        for shift in 1..=9u32 {
            let limit = 1u64 << (64 - shift);
            let (mut sampled, mut all) = (0u64, 0u64);
            for _ in 0..2000 {
                let first = lcg(&mut x, 1 << 40);
                let lines = 1 + lcg(&mut x, 100);
                let mut by_span = Vec::new();
                for_sampled_lines(first, lines, shift, limit, |l, h| by_span.push((l, h)));
                by_span.sort_unstable();
                let one_by_one: Vec<(u64, u64)> = (first..first + lines)
                    .filter_map(|l| sampled_hash(l, limit).map(|h| (l, h)))
                    .collect();
                assert_eq!(by_span, one_by_one, "shift {shift}, span {first}+{lines}");
                sampled += one_by_one.len() as u64;
                all += lines;
            }
            // One line in 2^shift, within 15% (~100k lines per shift).
            let rate = sampled as f64 * f64::from(1u32 << shift) / all as f64;
            assert!(
                (0.85..1.15).contains(&rate),
                "shift {shift}: rate x 2^shift {rate}"
            );
        }
    }

    #[test]
    fn set_sampling_alone_charges_the_misses_of_every_kind_of_line() {
        let map = every_eighth_page_slow(1 << 15);
        let charge = 500u64;
        fn sampled<'a>(map: &'a [AtomicU64], sets: &'a [AtomicU64]) -> Charger<'a> {
            let ch = sampled_charger(map, sets, [0, 500, 0, 0]);
            ch.set_access_sampling(8);
            assert!(ch.sets_only.get());
            ch
        }
        let n = 2_000_000u64;
        // A cache-resident set (half the 4 MiB model): after the
        // cold misses, free.
        let sets = zeroed(SAMPLED_SETS_MAX as usize * 4);
        let ch = sampled(&map, &sets);
        let mut x = 1;
        let hot = charged_after_warming(&ch, &mut x, 32 * 1024, n);
        assert!(hot < n * 500 / 8 / 50, "a cache-resident set charged {hot}");
        // Each kind of line is charged its own misses (against the full,
        // unsampled model of the same size): random lines over 16x the model, and
        // every page's first line only (a stride a low-bits set sampling
        // would pick every time: all multiples of 64 have their low bits
        // zero).
        for (name, stride) in [("random", 1u64), ("page-first lines", 64)] {
            let sets = zeroed(SAMPLED_SETS_MAX as usize * 4);
            let ch = sampled(&map, &sets);
            let exact_sets = zeroed(SAMPLED_SETS_MAX as usize * 4);
            let exact = CacheModel::new(&exact_sets).unwrap();
            let (mut slow_misses, mut misses) = (0u64, 0u64);
            for _ in 0..n {
                let line = lcg(&mut x, 2 << 20) * stride % (1 << 27);
                let addr = line * 64;
                ch.access(addr, false);
                // The full model, indexed by the same hash.
                if !exact.touch(hashed_line(line.wrapping_mul(LINE_HASH), 0, 15)) {
                    misses += 1;
                    slow_misses += u64::from(ch.tier_of(addr) == 1);
                }
            }
            let v = ch.counters();
            let want = (slow_misses * charge) as f64;
            let got = v.charged_cycles as f64;
            assert!(
                (got / want - 1.0).abs() < 0.05,
                "{name}: charged {got}, exact model's slow misses {want}"
            );
            let counted = (v.accesses[0] + v.accesses[1]) as f64;
            assert!(
                (counted / misses as f64 - 1.0).abs() < 0.05,
                "{name}: {counted} counted misses, {misses} exact"
            );
        }
        // Settling goes back to every access, at the expected charge.
        let sets = zeroed(SAMPLED_SETS_MAX as usize * 4);
        let ch = sampled(&map, &sets);
        ch.settle();
        assert!(!ch.sets_only.get() && !ch.samples_accesses());
    }

    #[test]
    fn charging_alternates_by_phase_and_each_half_gets_its_own_time() {
        let ab = ChargingAb::new(1000);
        assert!(ab.charging());
        // Publications every 256 operations; charging phases take 3
        // cycles per operation, the others 1.
        let (mut ops, mut now) = (0u64, 0u64);
        let mut flips = 0;
        for _ in 0..4000 {
            let was = ab.charging();
            now += 256 * if was { 3 } else { 1 };
            ops += 256;
            if ab.at(ops, now) != was {
                flips += 1;
            }
        }
        assert!(flips > 100, "{flips} flips");
        let ((on_ops, on_c), (off_ops, off_c)) = ab.halves();
        assert!(on_ops > 0 && off_ops > 0);
        assert!(on_ops.abs_diff(off_ops) <= 1024, "{on_ops} vs {off_ops}");
        // The first publication only starts the first phase.
        assert_eq!(on_ops + off_ops + 256 + (ops - 256) % 1024, ops);
        assert_eq!(on_c, 3 * on_ops, "charging phases' own time");
        assert_eq!(off_c, off_ops, "the other phases' own time");
        // Every pair is 3x: the median is 3 clamped to the last bin, 1.4988.
        let bins: std::vec::Vec<u64> = ab.pair_bins().map(u64::from).collect();
        let (m, n) = ab_median_ratio(&bins).unwrap();
        assert!(n >= 490, "{n} pairs");
        assert!((m - 1.49875).abs() < 1e-9, "{m}");
        // A pair 4% slower charging lands in the 1.04 bin; the median of
        // pairs ignores a burst that slows a few phases tenfold.
        assert!((ab_bin_ratio(ab_ratio_bin(1040, 1000)) - 1.04).abs() < 0.002);
        let mut bins = std::vec![0u64; AB_BINS];
        bins[ab_ratio_bin(1040, 1000)] += 90;
        bins[ab_ratio_bin(10_400, 1000)] += 5;
        bins[ab_ratio_bin(1040, 10_000)] += 5;
        let (m, n) = ab_median_ratio(&bins).unwrap();
        assert_eq!(n, 100);
        assert!((m - 1.04).abs() < 0.002, "{m}");
        assert_eq!(ab_median_ratio(&[0; 4]), None);
    }

    /// A map of `pages` pages where every page `p` with `p % 8 == 0` is on
    /// tier 1 (slow), the others on tier 0.
    fn every_eighth_page_slow(pages: u64) -> Vec<AtomicU64> {
        let map = zeroed((pages / 32) as usize);
        for p in (0..pages).step_by(8) {
            let w = &map[(p / 32) as usize];
            w.store(crate::abi::tier_map_set(w.load(Relaxed), p, 1), Relaxed);
        }
        map
    }

    #[test]
    fn access_sampling_charges_each_access_its_own_in_expectation() {
        let map = every_eighth_page_slow(1024);
        let charge = 300u64 << FRAC_BITS;
        let n = 3_200_000u64;
        // A pattern with the sampling period's own period: one line on
        // each of pages 0..8 in turn, so every eighth access is slow. A
        // sampler with a fixed phase or a fixed hash would charge all or
        // none of them.
        let periodic = |p: u64| (p % 8) * 4096 + 64;
        // And a random pattern over all 1024 pages.
        let mut x = 7;
        let random = |_: u64| lcg(&mut x, 1024 * 64) * 64;
        for (name, mut addr) in [
            (
                "periodic",
                std::boxed::Box::new(periodic) as std::boxed::Box<dyn FnMut(u64) -> u64>,
            ),
            ("random", std::boxed::Box::new(random)),
            // Line 0 too is picked one time in eight.
            (
                "periodic from line 0",
                std::boxed::Box::new(|p: u64| (p % 8) * 4096),
            ),
        ] {
            let ch = Charger::new(&map, 1024, None, fake_clock);
            ch.set_charges([0, charge, 0, 0], u64::MAX);
            ch.set_access_sampling(8);
            assert!(ch.samples_accesses());
            let mut slow = 0u64;
            for i in 0..n {
                let a = addr(i);
                slow += u64::from(ch.tier_of(a) == 1);
                ch.access(a, false);
                if i % 64 == 63 {
                    // The runtime reads the counters every few hundred
                    // operations, which redraws the salt.
                    ch.counters();
                }
            }
            let v = ch.counters();
            let want = slow * 300;
            let got = v.charged_cycles;
            assert!(
                (got as f64 / want as f64 - 1.0).abs() < 0.04,
                "{name}: sampled charge {got}, every access {want}"
            );
            // The counters estimate the accesses and are consistent with the
            // charge.
            assert_eq!(v.charged_cycles, v.accesses[1] * 300, "{name}");
            let all = v.accesses[0] + v.accesses[1];
            assert!((all as f64 / n as f64 - 1.0).abs() < 0.04, "{name}: {all}");
        }
        // Back to every access: exact.
        let ch = Charger::new(&map, 1024, None, fake_clock);
        ch.set_charges([0, charge, 0, 0], u64::MAX);
        ch.set_access_sampling(8);
        ch.set_access_sampling(1);
        for i in 0..800 {
            ch.access(periodic(i), false);
        }
        assert_eq!(ch.counters().accesses, [700, 100, 0, 0]);
    }

    #[test]
    fn a_span_is_charged_as_its_lines() {
        let map = every_eighth_page_slow(64);
        let charge = [100 << FRAC_BITS, 300 << FRAC_BITS, 0, 0];
        // 100 lines from the middle of page 6 to page 8: across two page
        // boundaries, the last page slow.
        let (addr, lines) = (6 * 4096 + 40 * 64, 100u64);
        let by_line = Charger::new(&map, 64, None, fake_clock);
        by_line.set_charges(charge, 5000 << FRAC_BITS);
        for i in 0..lines {
            by_line.access(addr + 64 * i, true);
        }
        let span = Charger::new(&map, 64, None, fake_clock);
        span.set_charges(charge, 5000 << FRAC_BITS);
        span.access_span(addr, lines, true);
        let (a, b) = (by_line.counters(), span.counters());
        assert_eq!(b.accesses, a.accesses);
        assert_eq!(
            b.accesses,
            [88, 12, 0, 0],
            "24 lines on page 6, 64 on 7, 12 on 8"
        );
        assert_eq!(b.writes, a.writes);
        assert_eq!(b.charged_cycles, a.charged_cycles);
        assert_eq!(
            b.payments, 1,
            "the span pays where a page ends past the threshold"
        );
        // With an exact cache model every line is looked up: a span seen
        // twice hits the second time.
        let sets = zeroed(256);
        let ch = Charger::new(&map, 64, CacheModel::new(&sets), fake_clock);
        ch.set_charges(charge, u64::MAX);
        ch.access_span(addr, lines, false);
        ch.access_span(addr, lines, false);
        let v = ch.counters();
        assert_eq!(
            (v.accesses[0] + v.accesses[1], v.cache_hits),
            (lines, lines)
        );
    }

    #[test]
    fn a_preempted_payment_pays_only_in_running_time() {
        // 10 cycles a step; every 8th step the host takes 1e6 cycles away.
        fn jumpy() -> u64 {
            use std::sync::atomic::AtomicU64;
            static STEP: AtomicU64 = AtomicU64::new(0);
            let s = STEP.fetch_add(1, Relaxed);
            s * 10 + (s / 8) * 1_000_000
        }
        let map = zeroed(1);
        let ch = Charger::new(&map, 32, None, jumpy);
        ch.set_charges([100 << FRAC_BITS, 0, 0, 0], 1000 << FRAC_BITS);
        ch.set_preemption_gap(1_000);
        for _ in 0..10 {
            ch.access(0, false);
        }
        let v = ch.counters();
        assert_eq!(v.payments, 1);
        // 1000 cycles paid in 10-cycle steps; the jumps are preempted time.
        assert_eq!(v.paid_cycles, 1000);
        assert!(v.preempted_cycles >= 12 * 1_000_000, "{v:?}");
        assert_eq!(ch.debt(), 0);
        // Without a gap every step pays: the jump is credited up to one
        // threshold only.
        let ch = Charger::new(&map, 32, None, jumpy);
        ch.set_charges([100 << FRAC_BITS, 0, 0, 0], 1000 << FRAC_BITS);
        for _ in 0..10 {
            ch.access(0, false);
        }
        assert_eq!(ch.debt(), -(1000 << FRAC_BITS));
        assert_eq!(ch.counters().preempted_cycles, 0);
    }

    #[test]
    fn chase_visits_every_line_once_per_cycle() {
        let buf = zeroed(8 * 1024 + 5);
        let lines = build_chase(&buf);
        assert_eq!(lines, 1024);
        let mut seen = std::vec![false; 1024];
        let mut i = 0u64;
        for _ in 0..1024 {
            let line = (i / 8) as usize;
            assert!(!seen[line], "line {line} twice");
            seen[line] = true;
            i = buf[i as usize].load(Relaxed);
        }
        assert_eq!(i, 0, "a single cycle");
        assert_eq!(chase(&buf, 0, 1024), 0);
        // Going on from where a chase ended visits the rest of the cycle.
        let half = chase(&buf, 0, 512);
        assert_ne!(half, 0);
        assert_eq!(chase(&buf, half, 512), 0);
        assert_eq!(chase_lines(7), 0);
    }

    #[test]
    fn a_host_slower_than_the_fast_tier_keeps_the_tiers_difference() {
        // Host DRAM 171 ns, Colloid's 70/135 ns: fast free, slow +65 ns.
        let base = charge_base_ps(171_000, 70_000);
        assert_eq!(base, 70_000);
        assert_eq!(charge_fixed(70_000, base, 1_000_000), 0);
        assert_eq!(charge_fixed(135_000, base, 1_000_000) >> FRAC_BITS, 65);
        // A loaded fast tier (antagonist) costs its load above the base.
        assert_eq!(charge_fixed(175_000, base, 1_000_000) >> FRAC_BITS, 105);
        // Host DRAM faster than the fast tier: charged against the host.
        assert_eq!(charge_base_ps(100_000, 150_000), 100_000);
    }

    #[test]
    fn charge_rounds_to_fixed_point_and_clamps_at_zero() {
        // 2.6 GHz: 150 ns over 100 ns DRAM = 130 cycles.
        assert_eq!(charge_fixed(250_000, 100_000, 2_600_000) >> FRAC_BITS, 390);
        assert_eq!(charge_fixed(80_000, 100_000, 2_600_000), 0);
        let c = charge_fixed(100_500, 100_000, 1_000_000);
        assert_eq!(c, 512, "half a cycle is kept");
    }
}
