//! `kv`: a Redis-like in-memory key-value store driven by YCSB core
//! workloads A (50% read / 50% update), B (95/5), C (read only) and F (50%
//! read / 50% read-modify-write) with YCSB's scrambled Zipfian key choice.
//!
//! # Data structures (all inside the heap, laid out by [`KvLayout`])
//!
//! * **Bucket array**: `buckets` (a power of two) cache-line buckets of
//!   [`BUCKET_SLOTS`] slots. A slot is two words: the key tag (`key + 1`,
//!   0 = empty) and a meta word `value_index | seq << 32`, the index of the
//!   record's value in the arena and the (halved, truncated to 32 bits)
//!   version of its last completed update. A key lives in the first free slot
//!   at or after its home bucket `fmix64(key) & (buckets - 1)` (bucketised
//!   linear probing; load factor between 3/8 and 3/4). Like Redis's
//!   `dictEntry` pointing at the `robj`/`sds`, the slot holds a reference
//!   that a lookup must read before it can touch the value, so every operation
//!   chases bucket -> value (two dependent cache misses on a cold key).
//! * **Value arena** (slab): `records` fixed-size values of `value_size`
//!   bytes; record `k` is stored at slot `k` (load order, like an allocator
//!   filling a slab). A value is `[tag, version, checksum, payload...]`.
//!   `version` is a seqlock (odd while a writer holds it), `checksum` the
//!   wrapping sum of the payload words, and the payload words are derived from
//!   `(tag, version)`.
//!
//! # Operations
//!
//! * read: probe, read the meta word, read the whole value under the seqlock
//!   and verify it: the tag must be the key's (else a *miss*), the checksum
//!   must match (else *corrupt*), and the value's version must not be older
//!   than the one its slot recorded at the last update (else *stale*: a lost
//!   write).
//! * update: the whole value is rewritten in place, like a Redis string
//!   `SET` of a same-size value (YCSB's default update writes one of ten
//!   fields; here the unit is the value). Lock the seqlock, rewrite payload
//!   and checksum, publish the version in the slot, unlock.
//! * read-modify-write: a verified read followed by an update.
//!
//! Waits on a value's seqlock are bounded by [`STUCK_LOCK_CYCLES`]: a version
//! stuck odd counts as *corrupt* instead of hanging the vCPU. A legitimately
//! held lock whose writer vCPU is descheduled by the host makes readers of
//! that key spin: lock-holder preemption shows up in `p9999_ns`/`max_ns`.
//!
//! The load phase inserts every record, partitioned over the vCPUs; slots are
//! claimed with a compare-and-swap so concurrent inserts are safe. A stop
//! request during the load ends it early and skips the run (metric
//! `load_complete` = 0), so unloaded records are never counted as misses.
//!
//! Per-operation latency (lookup and value access, not key generation) is
//! measured with `rdtsc` into a per-vCPU [`LatencyHistogram`] (on the
//! stack), merged into the heap at the end; worker 0 publishes the
//! percentiles (bucket midpoints, within 1/16 of the true value) as
//! `p50_ns`, `p99_ns`, `p999_ns`, `p9999_ns`, plus `mean_ns` and `max_ns`
//! (exact), `reads`, `updates`, `rmws` (workload F's read-modify-writes, not
//! included in `reads`/`updates`), `records`, `misses`, `corrupt`, `stale`,
//! `load_failures`, `load_ms` and `load_complete`.
//!
//! The exit code is `misses + corrupt + stale + load_failures`: any
//! non-zero value means the store lost or damaged data.

use core::sync::atomic::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use super::{
    access_lines, addr_of, data_words, partition, Access, Charge, Env, OPS_ARG, PAGE_SIZE,
    PUBLISH_EVERY,
};
use crate::abi::Phase;
use crate::args::{ArgKind, ArgSpec, Args, ImageSpec};
use crate::gen::{Rng, Zipf};

/// Slots per bucket.
pub const BUCKET_SLOTS: u64 = 4;
/// Bytes per bucket (one cache line).
pub const BUCKET_BYTES: u64 = 64;
const BUCKET_WORDS: usize = (BUCKET_BYTES / 8) as usize;
/// Words of a value before its payload: tag, version, checksum.
pub const VALUE_HEADER_WORDS: usize = 3;
/// Smallest value size (bytes).
pub const MIN_VALUE_SIZE: u64 = 64;
/// Largest value size (bytes).
pub const MAX_VALUE_SIZE: u64 = 64 << 10;
/// Most records (value indices and tags must fit 32 bits).
pub const MAX_RECORDS: u64 = (1 << 32) - 2;
/// Default record count: with the default value size the heap is ~407 MiB,
/// so the defaults fit `--mem 512M`.
pub const DEFAULT_RECORDS: u64 = 400_000;
/// Default value size: YCSB's 10 fields of 100 bytes, rounded to 1 KiB.
pub const DEFAULT_VALUE_SIZE: u64 = 1024;

/// The image's arguments.
pub static SPEC: ImageSpec = ImageSpec {
    name: "kv",
    about: "Redis-like hash table + value slab under YCSB A/B/C/F with scrambled Zipfian keys",
    args: &[
        ArgSpec {
            key: "records",
            kind: ArgKind::Int {
                min: 1,
                max: MAX_RECORDS,
            },
            default: "400000",
            help: "records loaded before the run (heap ~ records * (value_size + 64..128 B))",
        },
        ArgSpec {
            key: "value_size",
            kind: ArgKind::Size {
                min: MIN_VALUE_SIZE,
                max: MAX_VALUE_SIZE,
            },
            default: "1024",
            help: "bytes per value, rounded up to 64 (YCSB: 10 fields x 100 B ~ 1K)",
        },
        ArgSpec {
            key: "workload",
            kind: ArgKind::Choice(&["a", "b", "c", "f"]),
            default: "a",
            help: "YCSB mix: a = 50% read/50% update, b = 95/5, c = read only, f = 50% read/50% read-modify-write",
        },
        ArgSpec {
            key: "theta",
            kind: ArgKind::Float {
                min: 0.0,
                max: 0.9999,
            },
            default: "0.99",
            help: "Zipf skew of the (scrambled) key choice",
        },
        OPS_ARG,
    ],
};

/// A YCSB core workload's operation mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// 50% read, 50% update.
    A,
    /// 95% read, 5% update.
    B,
    /// 100% read.
    C,
    /// 50% read, 50% read-modify-write.
    F,
}

/// The kind of one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Read and verify a whole value.
    Read,
    /// Rewrite a whole value.
    Update,
    /// Read (verified) then rewrite.
    ReadModifyWrite,
}

/// One operation: what and on which key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvOp {
    /// The kind.
    pub kind: OpKind,
    /// The key, `0..records`.
    pub key: u64,
}

/// Parameters of the kv workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvParams {
    /// Records loaded.
    pub records: u64,
    /// Bytes per value (multiple of 64).
    pub value_size: u64,
    /// Operation mix.
    pub mix: Mix,
    /// Zipf skew.
    pub theta: f64,
}

impl KvParams {
    /// Reads the parameters from `args` (defaults from [`SPEC`]).
    pub fn from_args(args: &Args<'_>) -> Self {
        let mix = match args.str("workload", "a") {
            "b" => Mix::B,
            "c" => Mix::C,
            "f" => Mix::F,
            _ => Mix::A,
        };
        let value_size = args
            .size("value_size", DEFAULT_VALUE_SIZE)
            .clamp(MIN_VALUE_SIZE, MAX_VALUE_SIZE)
            .div_ceil(64)
            * 64;
        Self {
            records: args.u64("records", DEFAULT_RECORDS).clamp(1, MAX_RECORDS),
            value_size,
            mix,
            theta: args.f64("theta", 0.99),
        }
    }

    /// Where everything lives in the data region.
    pub fn layout(&self) -> KvLayout {
        KvLayout::new(self.records, self.value_size)
    }
}

/// Byte offsets (within the data region after the scratch area) of the
/// merged latency histogram, the bucket array and the value arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Records.
    pub records: u64,
    /// Bytes per value.
    pub value_size: u64,
    /// Number of buckets (power of two, at least 64).
    pub buckets: u64,
    /// Offset of the merged histogram ([`HIST_BUCKETS`] words).
    pub hist_off: u64,
    /// Offset of the bucket array.
    pub buckets_off: u64,
    /// Offset of the value arena.
    pub values_off: u64,
    /// Total bytes (page multiple).
    pub bytes: u64,
}

impl KvLayout {
    /// The layout for `records` values of `value_size` bytes (a multiple of 8).
    pub fn new(records: u64, value_size: u64) -> Self {
        // At most 3/4 of the slots used: 4 slots per bucket, so records / 3 buckets.
        let buckets = records.div_ceil(3).max(64).next_power_of_two();
        let hist_off = 0;
        let buckets_off = (HIST_BUCKETS as u64 * 8).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let values_off = buckets_off + buckets * BUCKET_BYTES;
        let bytes = (values_off + records * value_size).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        Self {
            records,
            value_size,
            buckets,
            hist_off,
            buckets_off,
            values_off,
            bytes,
        }
    }

    /// Offset of `key`'s home bucket.
    #[inline]
    pub fn home_bucket_offset(&self, key: u64) -> u64 {
        self.buckets_off + (fmix64(key) & (self.buckets - 1)) * BUCKET_BYTES
    }

    /// Offset of value slot `index`.
    #[inline]
    pub fn value_offset(&self, index: u64) -> u64 {
        self.values_off + index * self.value_size
    }
}

/// MurmurHash3's 64-bit finalizer: the key hash.
#[inline]
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// Payload word `i` of the value with `tag` at `version`.
#[inline]
fn payload_word(tag: u64, version: u64, i: usize) -> u64 {
    tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.rotate_left(29) ^ (i as u64)
}

/// Cycles a reader or writer waits for a value's seqlock before it declares
/// the value corrupt (a version stuck odd): about a second, far above any
/// legitimate hold (a descheduled writer included), short of the stop grace.
pub const STUCK_LOCK_CYCLES: u64 = 1 << 32;

/// Bounded waiting on a seqlock.
struct Spin {
    spins: u32,
    start: u64,
}

impl Spin {
    fn new() -> Self {
        Self { spins: 0, start: 0 }
    }

    /// Pauses once; `false` once the wait exceeded [`STUCK_LOCK_CYCLES`].
    #[inline]
    fn wait(&mut self) -> bool {
        core::hint::spin_loop();
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(1024) {
            return true;
        }
        let now = rdtsc();
        if self.start == 0 {
            self.start = now;
        }
        now.wrapping_sub(self.start) < STUCK_LOCK_CYCLES
    }
}

#[inline]
fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter; it is allowed in
    // ring 3 (the guest runtime relies on it too).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The generator of operations (shared by the workload and [`KvPattern`], so
/// a host-side trace is the one a vCPU with the same `Rng` issues).
#[derive(Clone, Debug)]
pub struct KvOps {
    zipf: Zipf,
    mix: Mix,
}

impl KvOps {
    /// Operations for `p`: scrambled Zipfian keys over `0..records`.
    pub fn new(p: &KvParams) -> Self {
        Self {
            zipf: Zipf::new(p.records, p.theta, true),
            mix: p.mix,
        }
    }

    /// The key generator.
    pub fn zipf(&self) -> &Zipf {
        &self.zipf
    }

    /// The next operation.
    #[inline]
    pub fn next(&self, rng: &mut Rng) -> KvOp {
        let key = self.zipf.next(rng);
        let kind = match self.mix {
            Mix::A if rng.chance(0.5) => OpKind::Update,
            Mix::B if rng.chance(0.05) => OpKind::Update,
            Mix::F if rng.chance(0.5) => OpKind::ReadModifyWrite,
            _ => OpKind::Read,
        };
        KvOp { kind, key }
    }
}

/// What a verified read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The right record, consistent: its version and the sum of its payload.
    Ok {
        /// The value's (even) version.
        version: u64,
        /// Wrapping sum of the payload words.
        sum: u64,
    },
    /// The key is not in the table, or its value holds another key.
    Miss,
    /// The value's checksum does not match its payload.
    Corrupt,
    /// The value is older than its last completed update (a lost write).
    Stale,
}

/// The hash table and value arena over a data region (see the module docs).
pub struct KvTable<'a> {
    buckets: &'a [AtomicU64],
    values: &'a [AtomicU64],
    mask: u64,
    records: u64,
    value_words: usize,
}

impl<'a> KvTable<'a> {
    /// The table laid out by `layout` in `data` (the data region); `None` if
    /// `data` is too small.
    pub fn new(layout: &KvLayout, data: &'a [AtomicU64]) -> Option<Self> {
        let b0 = (layout.buckets_off / 8) as usize;
        let v0 = (layout.values_off / 8) as usize;
        let value_words = (layout.value_size / 8) as usize;
        let v1 = v0.checked_add(value_words.checked_mul(layout.records as usize)?)?;
        if value_words < VALUE_HEADER_WORDS + 1 || data.len() < v1 {
            return None;
        }
        Some(Self {
            buckets: &data[b0..v0],
            values: &data[v0..v1],
            mask: layout.buckets - 1,
            records: layout.records,
            value_words,
        })
    }

    fn value(&self, index: u64) -> &'a [AtomicU64] {
        let s = index as usize * self.value_words;
        &self.values[s..s + self.value_words]
    }

    /// Writes the value of `tag` at `version` (payload, then checksum).
    fn write_value(v: &[AtomicU64], tag: u64, version: u64) {
        let mut sum = 0u64;
        for (i, w) in v.iter().enumerate().skip(VALUE_HEADER_WORDS) {
            let x = payload_word(tag, version, i);
            sum = sum.wrapping_add(x);
            w.store(x, Relaxed);
        }
        v[0].store(tag, Relaxed);
        v[2].store(sum, Relaxed);
    }

    /// Loads record `key` into value slot `key` and inserts it; `false` if
    /// the key is already present or the table is full.
    pub fn insert(&self, key: u64) -> bool {
        if key >= self.records {
            return false;
        }
        let tag = key + 1;
        let v = self.value(key);
        Self::write_value(v, tag, 0);
        v[1].store(0, Release);
        let nb = self.mask + 1;
        let home = fmix64(key) & self.mask;
        for probe in 0..nb {
            let b = (((home + probe) & self.mask) as usize) * BUCKET_WORDS;
            for s in 0..BUCKET_SLOTS as usize {
                let slot = &self.buckets[b + 2 * s];
                match slot.compare_exchange(0, tag, Relaxed, Relaxed) {
                    Ok(_) => {
                        self.buckets[b + 2 * s + 1].store(key, Release);
                        return true;
                    }
                    Err(t) if t == tag => return false,
                    Err(_) => {}
                }
            }
        }
        false
    }

    /// The meta word of `key`'s slot.
    #[inline]
    pub fn find(&self, key: u64) -> Option<&'a AtomicU64> {
        self.find_with(key, &())
    }

    /// [`Self::find`], reporting each bucket (one cache line) it reads to `c`.
    #[inline]
    pub fn find_with<C: Charge + ?Sized>(&self, key: u64, c: &C) -> Option<&'a AtomicU64> {
        let tag = key.wrapping_add(1);
        let home = fmix64(key) & self.mask;
        for probe in 0..=self.mask {
            let b = (((home + probe) & self.mask) as usize) * BUCKET_WORDS;
            // The bucket is read first and reported after (the hook's
            // contract), so its charging does not delay the read.
            let mut found = None;
            for s in 0..BUCKET_SLOTS as usize {
                match self.buckets[b + 2 * s].load(Relaxed) {
                    0 => {
                        found = Some(None);
                        break;
                    }
                    t if t == tag => {
                        found = Some(Some(&self.buckets[b + 2 * s + 1]));
                        break;
                    }
                    _ => {}
                }
            }
            c.access(addr_of(&self.buckets[b]), false);
            if let Some(slot) = found {
                return slot;
            }
        }
        None
    }

    /// Reads and verifies `key`'s value.
    #[inline]
    pub fn read(&self, key: u64) -> ReadOutcome {
        self.read_with(key, &())
    }

    /// [`Self::read`], reporting every cache line it reads to `c`.
    #[inline]
    pub fn read_with<C: Charge + ?Sized>(&self, key: u64, c: &C) -> ReadOutcome {
        let Some(meta) = self.find_with(key, c) else {
            return ReadOutcome::Miss;
        };
        let m = meta.load(Acquire);
        let (index, seq) = (m & 0xffff_ffff, (m >> 32) as u32);
        if index >= self.records {
            return ReadOutcome::Miss;
        }
        let v = self.value(index);
        let mut spin = Spin::new();
        loop {
            let v1 = v[1].load(Acquire);
            if v1 & 1 == 1 {
                if !spin.wait() {
                    return ReadOutcome::Corrupt;
                }
                continue;
            }
            let tag = v[0].load(Relaxed);
            let check = v[2].load(Relaxed);
            let mut sum = 0u64;
            for w in &v[VALUE_HEADER_WORDS..] {
                sum = sum.wrapping_add(w.load(Relaxed));
            }
            fence(Acquire);
            access_lines(c, v, false);
            if v[1].load(Relaxed) != v1 {
                if !spin.wait() {
                    return ReadOutcome::Corrupt;
                }
                continue;
            }
            return if tag != key.wrapping_add(1) {
                ReadOutcome::Miss
            } else if sum != check {
                ReadOutcome::Corrupt
            } else if (((v1 >> 1) as u32).wrapping_sub(seq) as i32) < 0 {
                ReadOutcome::Stale
            } else {
                ReadOutcome::Ok { version: v1, sum }
            };
        }
    }

    /// Rewrites `key`'s whole value with its next version: `Ok` with the new
    /// version (and `sum` 0), `Miss` if the key is missing, `Corrupt` if the
    /// value's lock is stuck (see [`STUCK_LOCK_CYCLES`]).
    #[inline]
    pub fn update(&self, key: u64) -> ReadOutcome {
        self.update_with(key, &())
    }

    /// [`Self::update`], reporting every cache line it writes to `c`.
    #[inline]
    pub fn update_with<C: Charge + ?Sized>(&self, key: u64, c: &C) -> ReadOutcome {
        let Some(meta) = self.find_with(key, c) else {
            return ReadOutcome::Miss;
        };
        let index = meta.load(Relaxed) & 0xffff_ffff;
        if index >= self.records {
            return ReadOutcome::Miss;
        }
        let v = self.value(index);
        let mut spin = Spin::new();
        let version = loop {
            let cur = v[1].load(Relaxed);
            if cur & 1 == 0
                && v[1]
                    .compare_exchange(cur, cur + 1, Acquire, Relaxed)
                    .is_ok()
            {
                break cur;
            }
            if !spin.wait() {
                return ReadOutcome::Corrupt;
            }
        };
        fence(Release);
        let next = version + 2;
        Self::write_value(v, key + 1, next);
        // The slot records the version before the unlock, under the lock, so
        // it only grows and a reader that sees it also sees the lock taken.
        meta.store(index | ((next >> 1) & 0xffff_ffff) << 32, Release);
        v[1].store(next, Release);
        access_lines(c, v, true);
        c.access(addr_of(meta), true);
        ReadOutcome::Ok {
            version: next,
            sum: 0,
        }
    }
}

/// Buckets of the latency histogram: 16 exact ones for 0..16 cycles, then
/// 8 per power of two (1/8-octave resolution, <= 6.25% relative error of a
/// bucket's midpoint) up to 2^64.
pub const HIST_BUCKETS: usize = 16 + 60 * 8;

/// A log-linear latency histogram (counts of cycle values).
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    /// Count per bucket.
    pub counts: [u64; HIST_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: [0; HIST_BUCKETS],
        }
    }
}

impl LatencyHistogram {
    /// The bucket of `v`.
    #[inline]
    pub fn bucket_of(v: u64) -> usize {
        if v < 16 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros() as usize; // >= 4
        let sub = ((v >> (e - 3)) & 7) as usize;
        16 + (e - 4) * 8 + sub
    }

    /// The values `lo..=hi` bucket `b` holds.
    pub fn bucket_bounds(b: usize) -> (u64, u64) {
        if b < 16 {
            return (b as u64, b as u64);
        }
        let b = b.min(HIST_BUCKETS - 1);
        let e = 4 + (b - 16) / 8;
        let sub = ((b - 16) % 8) as u64;
        let lo = (8 + sub) << (e - 3);
        let width = 1u64 << (e - 3);
        (lo, lo + (width - 1))
    }

    /// Counts `v`.
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[Self::bucket_of(v)] += 1;
    }

    /// Number of values counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q`-quantile (`0 < q <= 1`): the midpoint of the bucket holding
    /// the value of rank `ceil(q * total)`; 0 if empty.
    pub fn percentile(&self, q: f64) -> u64 {
        let total = self.total();
        if total == 0 {
            return 0;
        }
        let rank = (libm::ceil(q.clamp(0.0, 1.0) * total as f64) as u64).clamp(1, total);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = Self::bucket_bounds(b);
                return lo + (hi - lo) / 2;
            }
        }
        Self::bucket_bounds(HIST_BUCKETS - 1).1
    }
}

/// Most accesses one operation of [`KvPattern`] yields.
pub const KV_MAX_ACCESSES: usize = 2 + 2 * ((MAX_VALUE_SIZE / PAGE_SIZE) as usize + 1);

/// The access pattern of the kv workload for the simulator: byte offsets
/// within the data region (see [`KvLayout`]).
///
/// Per operation, in order: the key's home bucket (read), then the value,
/// one access per 4 KiB page it spans (at the first byte it uses in that
/// page): a read pass for reads, a write pass for updates, both for
/// read-modify-writes; updates end with a write of the bucket (the slot's
/// version). Approximation: a key that overflowed its home bucket (rare at a
/// load factor <= 3/4) is charged to its home bucket, and the probe of
/// following buckets is not modeled.
#[derive(Clone, Debug)]
pub struct KvPattern {
    ops: KvOps,
    layout: KvLayout,
    buf: [Access; KV_MAX_ACCESSES],
    len: usize,
    pos: usize,
}

impl KvPattern {
    /// The pattern for `p`.
    pub fn new(p: &KvParams) -> Self {
        Self {
            ops: KvOps::new(p),
            layout: p.layout(),
            buf: [Access {
                addr: 0,
                write: false,
            }; KV_MAX_ACCESSES],
            len: 0,
            pos: 0,
        }
    }

    /// The layout the offsets refer to.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Writes the accesses of the next operation into `out` and returns how
    /// many (at most [`KV_MAX_ACCESSES`]).
    pub fn next_op(&self, rng: &mut Rng, out: &mut [Access; KV_MAX_ACCESSES]) -> usize {
        let op = self.ops.next(rng);
        let mut n = 0;
        let mut push = |addr: u64, write: bool| {
            if n < KV_MAX_ACCESSES {
                out[n] = Access { addr, write };
                n += 1;
            }
        };
        let bucket = self.layout.home_bucket_offset(op.key);
        push(bucket, false);
        let start = self.layout.value_offset(op.key);
        let end = start + self.layout.value_size;
        let value_pass = |write: bool, push: &mut dyn FnMut(u64, bool)| {
            let mut a = start;
            while a < end {
                push(a, write);
                a = (a / PAGE_SIZE + 1) * PAGE_SIZE;
            }
        };
        match op.kind {
            OpKind::Read => value_pass(false, &mut push),
            OpKind::Update => {
                value_pass(true, &mut push);
                push(bucket, true);
            }
            OpKind::ReadModifyWrite => {
                value_pass(false, &mut push);
                value_pass(true, &mut push);
                push(bucket, true);
            }
        }
        n
    }

    /// The next access (operations flattened, in the order of [`Self::next_op`]).
    pub fn next_access(&mut self, rng: &mut Rng) -> Access {
        if self.pos >= self.len {
            let mut buf = self.buf;
            self.len = self.next_op(rng, &mut buf);
            self.buf = buf;
            self.pos = 0;
        }
        let a = self.buf[self.pos];
        self.pos += 1;
        a
    }
}

// Scratch words used for cross-vCPU totals.
const S_READS: usize = 16;
const S_UPDATES: usize = 17;
const S_RMWS: usize = 18;
const S_MISSES: usize = 19;
const S_CORRUPT: usize = 20;
const S_STALE: usize = 21;
const S_LOAD_FAIL: usize = 22;
const S_CYCLES: usize = 23;
const S_MAX: usize = 24;

/// One worker's counts from the run phase.
#[derive(Default)]
struct RunTotals {
    reads: u64,
    updates: u64,
    rmws: u64,
    misses: u64,
    corrupt: u64,
    stale: u64,
    /// Cycles summed over the operations.
    cycles: u64,
    /// The slowest operation, cycles.
    max: u64,
    /// Keeps the value reads observable.
    sink: u64,
}

/// Runs the workload on one worker; returns this worker's
/// `misses + corrupt + stale + load failures` (0 = no data lost).
///
/// One worker's life, phases separated by team barriers every worker must
/// reach in the same order: load, run, verify (publish the totals), report.
pub fn run<E: Env>(env: &E, mem: &[AtomicU64]) -> u32 {
    let params = KvParams::from_args(&env.args());
    let layout = params.layout();
    let data = data_words(mem, layout.bytes);
    let Some(table) = KvTable::new(&layout, data) else {
        env.log("kv: heap too small for the records; raise --mem or lower records/value_size");
        return u32::MAX;
    };
    let merged = &data[(layout.hist_off / 8) as usize..][..HIST_BUCKETS];

    env.set_phase(Phase::Init);
    let (load_fail, load_cycles, loaded) = load(env, &table, &params);
    env.set_phase(Phase::Run);

    let mut hist = LatencyHistogram::default();
    let t = if loaded {
        run_ops(env, &table, &params, &mut hist)
    } else {
        RunTotals::default()
    };
    env.set_phase(Phase::Verify);
    publish_totals(env, mem, merged, &hist, &t, load_fail);
    env.barrier();
    if env.vcpu() == 0 {
        report(env, mem, merged, &params, load_cycles, loaded);
    }
    env.set_phase(Phase::Done);
    let bad = t.misses + t.corrupt + t.stale + load_fail;
    u32::try_from(bad).unwrap_or(u32::MAX)
}

/// The load phase: inserts this worker's share of the records, then waits
/// for the team. Returns the failed inserts, the phase's cycles and whether
/// the load completed.
fn load<E: Env>(env: &E, table: &KvTable<'_>, params: &KvParams) -> (u64, u64, bool) {
    let load_start = env.cycles();
    let mut load_fail = 0u64;
    for key in partition(params.records, env.vcpus(), env.vcpu()) {
        load_fail += u64::from(!table.insert(key));
        if key % 1024 == 0 && env.stop_requested() {
            break;
        }
    }
    env.barrier();
    let load_cycles = env.cycles().wrapping_sub(load_start);
    // A stop during the load left records out: skip the run (its reads
    // would count them as misses). The stop flag is sticky, so every worker
    // that gets here after the barrier sees it.
    let loaded = !env.stop_requested();
    (load_fail, load_cycles, loaded)
}

/// The run phase: operations until a stop or `ops=`, each timed into `hist`.
/// The operation loop is kept whole here (it is what the benchmark measures).
fn run_ops<E: Env>(
    env: &E,
    table: &KvTable<'_>,
    params: &KvParams,
    hist: &mut LatencyHistogram,
) -> RunTotals {
    let ops_gen = KvOps::new(params);
    let mut rng = Rng::for_stream(env.seed(), u64::from(env.vcpu()));
    let limit = env.args().u64("ops", 0);
    let (mut reads, mut updates, mut rmws) = (0u64, 0u64, 0u64);
    let (mut misses, mut corrupt, mut stale) = (0u64, 0u64, 0u64);
    let (mut ops, mut cycles, mut max, mut sink) = (0u64, 0u64, 0u64, 0u64);
    let mut tally = |o: ReadOutcome, sink: &mut u64| match o {
        ReadOutcome::Ok { sum, .. } => *sink = sink.wrapping_add(sum),
        ReadOutcome::Miss => misses += 1,
        ReadOutcome::Corrupt => corrupt += 1,
        ReadOutcome::Stale => stale += 1,
    };
    loop {
        for _ in 0..PUBLISH_EVERY {
            let op = ops_gen.next(&mut rng);
            let t0 = env.cycles();
            match op.kind {
                OpKind::Read => {
                    tally(table.read_with(op.key, env), &mut sink);
                    reads += 1;
                }
                OpKind::Update => {
                    tally(table.update_with(op.key, env), &mut sink);
                    updates += 1;
                }
                OpKind::ReadModifyWrite => {
                    let o = table.read_with(op.key, env);
                    let found = o != ReadOutcome::Miss;
                    tally(o, &mut sink);
                    if found {
                        tally(table.update_with(op.key, env), &mut sink);
                    }
                    rmws += 1;
                }
            }
            // The operation pays its own emulated latency, so the
            // percentiles hold it (not whichever operation crosses the
            // payment threshold).
            env.settle();
            let dt = env.cycles().wrapping_sub(t0);
            cycles = cycles.wrapping_add(dt);
            max = max.max(dt);
            hist.record(dt);
        }
        ops += PUBLISH_EVERY;
        env.set_ops(ops);
        if env.stop_requested() || (limit != 0 && ops >= limit) {
            break;
        }
    }
    RunTotals {
        reads,
        updates,
        rmws,
        misses,
        corrupt,
        stale,
        cycles,
        max,
        sink,
    }
}

/// Adds this worker's histogram and counts to the team totals (the
/// histogram in `merged`, the counts in the scratch words).
fn publish_totals<E: Env>(
    env: &E,
    mem: &[AtomicU64],
    merged: &[AtomicU64],
    hist: &LatencyHistogram,
    t: &RunTotals,
    load_fail: u64,
) {
    for (m, &c) in merged.iter().zip(hist.counts.iter()) {
        if c != 0 {
            m.fetch_add(c, Relaxed);
        }
    }
    for (i, v) in [
        (S_READS, t.reads),
        (S_UPDATES, t.updates),
        (S_RMWS, t.rmws),
        (S_MISSES, t.misses),
        (S_CORRUPT, t.corrupt),
        (S_STALE, t.stale),
        (S_LOAD_FAIL, load_fail),
        (S_CYCLES, t.cycles),
    ] {
        mem[i].fetch_add(v, Relaxed);
    }
    mem[S_MAX].fetch_max(t.max, Relaxed);
    // Keep the value reads observable.
    if let Some(s) = mem.get(64 + env.vcpu() as usize) {
        s.store(t.sink, Relaxed);
    }
}

/// Worker 0, after the team has published: the team's metrics.
fn report<E: Env>(
    env: &E,
    mem: &[AtomicU64],
    merged: &[AtomicU64],
    params: &KvParams,
    load_cycles: u64,
    loaded: bool,
) {
    let scratch = |i: usize| mem[i].load(Relaxed);
    let mut all = LatencyHistogram::default();
    for (c, m) in all.counts.iter_mut().zip(merged) {
        *c = m.load(Relaxed);
    }
    let khz = env.tsc_khz().max(1) as f64;
    let ns = |c: u64| c as f64 * 1e6 / khz;
    let total = all.total();
    env.metric("p50_ns", ns(all.percentile(0.50)));
    env.metric("p99_ns", ns(all.percentile(0.99)));
    env.metric("p999_ns", ns(all.percentile(0.999)));
    env.metric("p9999_ns", ns(all.percentile(0.9999)));
    env.metric("max_ns", ns(scratch(S_MAX)));
    env.metric(
        "mean_ns",
        if total == 0 {
            0.0
        } else {
            ns(scratch(S_CYCLES)) / total as f64
        },
    );
    env.metric("reads", scratch(S_READS) as f64);
    env.metric("updates", scratch(S_UPDATES) as f64);
    env.metric("rmws", scratch(S_RMWS) as f64);
    env.metric("records", params.records as f64);
    env.metric("misses", scratch(S_MISSES) as f64);
    env.metric("corrupt", scratch(S_CORRUPT) as f64);
    env.metric("stale", scratch(S_STALE) as f64);
    env.metric("load_failures", scratch(S_LOAD_FAIL) as f64);
    env.metric("load_ms", load_cycles as f64 / khz);
    env.metric("load_complete", f64::from(u8::from(loaded)));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::host_env::{zeroed, TestEnv};
    use super::super::SCRATCH_WORDS;
    use super::*;
    use std::vec::Vec;

    fn params(records: u64, value_size: u64) -> KvParams {
        KvParams {
            records,
            value_size,
            mix: Mix::A,
            theta: 0.99,
        }
    }

    fn loaded(p: &KvParams) -> Vec<AtomicU64> {
        let l = p.layout();
        let data = zeroed((l.bytes / 8) as usize);
        let t = KvTable::new(&l, &data).unwrap();
        for k in 0..p.records {
            assert!(t.insert(k), "insert {k}");
        }
        data
    }

    #[test]
    fn every_loaded_key_is_found_with_its_value() {
        let p = params(5_000, 128);
        let data = loaded(&p);
        let l = p.layout();
        let t = KvTable::new(&l, &data).unwrap();
        for k in 0..p.records {
            match t.read(k) {
                ReadOutcome::Ok { version, sum } => {
                    assert_eq!(version, 0);
                    let expect: u64 = (VALUE_HEADER_WORDS..16)
                        .map(|i| payload_word(k + 1, 0, i))
                        .fold(0, u64::wrapping_add);
                    assert_eq!(sum, expect, "key {k}");
                }
                o => panic!("key {k}: {o:?}"),
            }
            // The value slot really holds this key.
            let w = (l.value_offset(k) / 8) as usize;
            assert_eq!(data[w].load(Relaxed), k + 1);
        }
        assert_eq!(t.read(p.records), ReadOutcome::Miss);
        assert!(!t.insert(3), "duplicate insert must fail");
    }

    #[test]
    fn updates_are_visible() {
        let p = params(1_000, 64);
        let data = loaded(&p);
        let t = KvTable::new(&p.layout(), &data).unwrap();
        let before = t.read(7);
        assert!(matches!(t.update(7), ReadOutcome::Ok { version: 2, .. }));
        assert!(matches!(t.update(7), ReadOutcome::Ok { version: 4, .. }));
        match (before, t.read(7)) {
            (ReadOutcome::Ok { sum: s0, .. }, ReadOutcome::Ok { version, sum }) => {
                assert_eq!(version, 4);
                assert_ne!(sum, s0);
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(t.read(8), ReadOutcome::Ok { version: 0, .. }));
        assert_eq!(t.update(p.records + 5), ReadOutcome::Miss);
    }

    #[test]
    fn lost_write_and_corruption_are_detected() {
        let p = params(1_000, 128);
        let data = loaded(&p);
        let l = p.layout();
        let t = KvTable::new(&l, &data).unwrap();
        let w = (l.value_offset(9) / 8) as usize;
        let old: Vec<u64> = data[w..w + 16].iter().map(|x| x.load(Relaxed)).collect();
        assert!(matches!(t.update(9), ReadOutcome::Ok { .. }));
        // A lost write: the value reverts to its old, self-consistent state.
        for (x, v) in data[w..w + 16].iter().zip(&old) {
            x.store(*v, Relaxed);
        }
        assert_eq!(t.read(9), ReadOutcome::Stale);
        // A flipped payload bit.
        let w = (l.value_offset(10) / 8) as usize;
        data[w + 5].fetch_xor(1 << 20, Relaxed);
        assert_eq!(t.read(10), ReadOutcome::Corrupt);
        // A version stuck odd (a writer that never unlocks): reported, not a hang.
        let w = (l.value_offset(11) / 8) as usize;
        data[w + 1].store(7, Relaxed);
        assert_eq!(t.read(11), ReadOutcome::Corrupt);
    }

    #[test]
    fn runs_each_mix_without_misses() {
        for (w, reads_only) in [("a", false), ("b", false), ("c", true), ("f", false)] {
            let env = TestEnv::new(
                &SPEC,
                &[("records", "3000"), ("value_size", "256"), ("workload", w)],
                20_000,
            );
            let l = KvParams::from_args(&env.args()).layout();
            let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
            assert_eq!(run(&env, &mem), 0, "workload {w}");
            let m = |n: &str| env.metric_value(n).unwrap();
            assert_eq!(
                m("misses") + m("corrupt") + m("stale") + m("load_failures"),
                0.0
            );
            let ops = env.ops.get() as f64;
            assert_eq!(m("reads") + m("updates") + m("rmws"), ops);
            assert_eq!(m("records"), 3000.0);
            match w {
                "a" => assert!((m("updates") / ops - 0.5).abs() < 0.02),
                "b" => assert!((m("updates") / ops - 0.05).abs() < 0.01),
                "f" => assert!((m("rmws") / ops - 0.5).abs() < 0.02),
                _ => assert!(reads_only && m("reads") == ops),
            }
            // Latency emulation sees each operation's bucket and every line
            // of its value (256 B: 4 lines): reads read 5 lines, updates
            // read the bucket and write 4 value lines and the bucket.
            let a = env.accesses.get();
            let reads = m("reads") + m("rmws");
            let updates = m("updates") + m("rmws");
            let want_reads = 5.0 * reads + updates;
            assert!(
                a.reads as f64 >= want_reads && (a.reads as f64) < want_reads * 1.2,
                "{w}: {a:?} vs {want_reads} (+ overflow probes)"
            );
            assert_eq!(a.writes as f64, 5.0 * updates, "{w}");
            // After the run, every loaded key is still there and consistent.
            let data = &mem[SCRATCH_WORDS..];
            let t = KvTable::new(&l, data).unwrap();
            for k in 0..3000 {
                assert!(matches!(t.read(k), ReadOutcome::Ok { .. }), "{w}: key {k}");
            }
        }
    }

    #[test]
    fn corrupted_record_shows_in_metrics_and_exit_code() {
        let args = [
            ("records", "2000"),
            ("value_size", "128"),
            ("workload", "c"),
        ];
        let p = KvParams::from_args(&TestEnv::new(&SPEC, &args, 0).args());
        let l = p.layout();
        let hot = KvOps::new(&p).zipf().item_of_rank(0);
        let data_word = |off: u64| SCRATCH_WORDS + (off / 8) as usize;
        // The hottest key's payload (-> corrupt), then its value's tag (-> miss).
        for (word, metric) in [
            (data_word(l.value_offset(hot)) + 6, "corrupt"),
            (data_word(l.value_offset(hot)), "misses"),
        ] {
            let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
            // Corrupt the word once, after the first batch of operations.
            let done = core::cell::Cell::new(false);
            let env = TestEnv::new(&SPEC, &args, 20_000).with_hook(|before, _| {
                if before > 0 && !done.replace(true) {
                    mem[word].fetch_xor(0xff, Relaxed);
                }
            });
            let code = run(&env, &mem);
            let bad = env.metric_value(metric).unwrap();
            assert!(bad > 100.0, "{metric}: {bad}");
            assert_eq!(code as f64, bad);
        }
    }

    #[test]
    fn stop_during_load_skips_the_run_without_false_misses() {
        let env = TestEnv::new(&SPEC, &[("records", "5000"), ("value_size", "64")], 0);
        let l = KvParams::from_args(&env.args()).layout();
        let mem = zeroed(SCRATCH_WORDS + (l.bytes / 8) as usize);
        assert_eq!(run(&env, &mem), 0);
        assert_eq!(env.metric_value("load_complete"), Some(0.0));
        assert_eq!(env.metric_value("reads"), Some(0.0));
        assert_eq!(env.metric_value("misses"), Some(0.0));
    }

    #[test]
    fn histogram_buckets_and_percentiles() {
        for v in [
            0u64,
            1,
            15,
            16,
            17,
            100,
            1000,
            123_456,
            u64::MAX / 3,
            u64::MAX,
        ] {
            let b = LatencyHistogram::bucket_of(v);
            let (lo, hi) = LatencyHistogram::bucket_bounds(b);
            assert!(lo <= v && v <= hi, "{v} in bucket {b} = {lo}..={hi}");
            assert!(hi - lo <= lo / 8, "bucket {b} too wide");
        }
        let mut h = LatencyHistogram::default();
        for _ in 0..990 {
            h.record(100);
        }
        for _ in 0..10 {
            h.record(100_000);
        }
        // 100 lies in 96..=103 (midpoint 99), 100000 in 98304..=106495.
        assert_eq!(h.percentile(0.5), 99);
        assert_eq!(h.percentile(0.99), 99);
        assert_eq!(h.percentile(0.991), 102_399);
        assert_eq!(h.percentile(0.999), 102_399);
        let mut u = LatencyHistogram::default();
        for v in 1..=1000 {
            u.record(v);
        }
        // Rank 500 lies in 480..=511; rank 990 in 960..=1023.
        assert_eq!(u.percentile(0.5), 495);
        assert_eq!(u.percentile(0.99), 991);
        assert_eq!(LatencyHistogram::default().percentile(0.5), 0);
    }

    #[test]
    fn pattern_stays_in_layout_and_matches_mix() {
        let mut p = params(10_000, 1024);
        p.mix = Mix::F;
        let mut pat = KvPattern::new(&p);
        let l = *pat.layout();
        let mut rng = Rng::new(4);
        let mut out = [Access {
            addr: 0,
            write: false,
        }; KV_MAX_ACCESSES];
        let mut rmw = 0;
        for _ in 0..10_000 {
            let n = pat.next_op(&mut rng, &mut out);
            assert!(out[0].addr >= l.buckets_off && out[0].addr < l.values_off);
            assert!(!out[0].write);
            for a in &out[1..n] {
                assert!(a.addr < l.bytes);
            }
            // 1 KiB values aligned to 1 KiB: one page each.
            match n {
                2 => assert!(!out[1].write && out[1].addr >= l.values_off),
                4 => {
                    rmw += 1;
                    assert!(!out[1].write && out[2].write && out[3].write);
                    assert_eq!(out[3].addr, out[0].addr);
                }
                _ => panic!("{n} accesses"),
            }
        }
        assert!((4_700..5_300).contains(&rmw), "{rmw}");
        // The flattened form yields the same sequence.
        let mut rng2 = Rng::new(4);
        let n = KvPattern::new(&p).next_op(&mut rng2, &mut out);
        let mut rng3 = Rng::new(4);
        for a in &out[..n] {
            assert_eq!(pat.next_access(&mut rng3), *a);
        }
    }

    #[test]
    fn layout_is_what_the_table_needs() {
        let l = params(400_000, 1024).layout();
        assert_eq!(l.buckets, 1 << 18);
        assert_eq!(l.bytes, 4096 + (16 << 20) + 400_000 * 1024);
        let l = params(1_000, 192).layout();
        assert_eq!(l.bytes % PAGE_SIZE, 0);
        let mut data = zeroed((l.bytes / 8) as usize);
        assert!(KvTable::new(&l, &data).is_some());
        data.truncate(((l.values_off + 1_000 * 192) / 8) as usize);
        assert!(
            KvTable::new(&l, &data).is_some(),
            "needs the arena, not the rounding"
        );
        data.pop();
        assert!(KvTable::new(&l, &data).is_none());
    }

    /// A worker of a team of host threads (real concurrency, real barrier).
    pub(crate) struct ThreadEnv<'a> {
        pub vcpu: u32,
        pub vcpus: u32,
        pub entries: &'a [crate::abi::ArgEntry],
        pub spec: &'static ImageSpec,
        pub barrier: &'a std::sync::Barrier,
        pub metrics: &'a std::sync::Mutex<Vec<(std::string::String, f64)>>,
        pub ops: core::cell::Cell<u64>,
    }

    impl crate::workloads::Charge for ThreadEnv<'_> {}

    impl Env for ThreadEnv<'_> {
        fn vcpu(&self) -> u32 {
            self.vcpu
        }
        fn vcpus(&self) -> u32 {
            self.vcpus
        }
        fn seed(&self) -> u64 {
            // TestEnv's seed, so team and solo runs can be compared.
            1
        }
        fn args(&self) -> Args<'_> {
            Args::new(self.entries, Some(self.spec))
        }
        fn stop_requested(&self) -> bool {
            false
        }
        fn set_ops(&self, ops: u64) {
            self.ops.set(ops)
        }
        fn set_phase(&self, _: Phase) {}
        fn cycles(&self) -> u64 {
            // SAFETY: rdtsc only reads the time-stamp counter.
            unsafe { core::arch::x86_64::_rdtsc() }
        }
        fn tsc_khz(&self) -> u64 {
            1_000_000
        }
        fn barrier(&self) {
            self.barrier.wait();
        }
        fn metric(&self, name: &str, value: f64) {
            self.metrics.lock().unwrap().push((name.into(), value));
        }
        fn log(&self, _: &str) {}
    }

    /// Runs `run` on `threads` host threads; returns the summed exit code and
    /// worker 0's metrics.
    pub(crate) fn run_threads(
        spec: &'static ImageSpec,
        args: &[(&str, &str)],
        threads: u32,
        words: usize,
        run: fn(&ThreadEnv<'_>, &[AtomicU64]) -> u32,
    ) -> (u32, Vec<(std::string::String, f64)>, Vec<AtomicU64>) {
        let entries: Vec<_> = args
            .iter()
            .map(|(k, v)| crate::abi::ArgEntry {
                key: crate::abi::to_fixed(k).unwrap(),
                value: crate::abi::to_fixed(v).unwrap(),
            })
            .collect();
        let mem = zeroed(words);
        let barrier = std::sync::Barrier::new(threads as usize);
        let metrics = std::sync::Mutex::new(Vec::new());
        let code: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|vcpu| {
                    let (entries, barrier, metrics, mem) = (&entries, &barrier, &metrics, &mem);
                    s.spawn(move || {
                        let env = ThreadEnv {
                            vcpu,
                            vcpus: threads,
                            entries,
                            spec,
                            barrier,
                            metrics,
                            ops: Default::default(),
                        };
                        run(&env, mem)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        (code, metrics.into_inner().unwrap(), mem)
    }

    #[test]
    fn concurrent_load_and_hot_updates_lose_nothing() {
        // Four records: the threads fight over the same values.
        for w in ["a", "f"] {
            let args = [
                ("records", "4"),
                ("value_size", "1024"),
                ("workload", w),
                ("theta", "0.99"),
                ("ops", "40000"),
            ];
            let l = KvParams::from_args(&TestEnv::new(&SPEC, &args, 0).args()).layout();
            let words = SCRATCH_WORDS + (l.bytes / 8) as usize;
            let (code, metrics, mem) = run_threads(&SPEC, &args, 3, words, |e, m| run(e, m));
            let m = |n: &str| metrics.iter().find(|x| x.0 == n).unwrap().1;
            assert_eq!(code, 0, "{w}: {metrics:?}");
            assert_eq!(m("misses") + m("corrupt") + m("stale"), 0.0);
            let writes = m("updates") + m("rmws");
            assert!(writes > 50_000.0, "{w}: {writes}");
            // Every value's version counts its updates: the versions of all
            // records add up to twice the number of writes.
            let t = KvTable::new(&l, &mem[SCRATCH_WORDS..]).unwrap();
            let mut versions = 0u64;
            for k in 0..4 {
                match t.read(k) {
                    ReadOutcome::Ok { version, .. } => versions += version,
                    o => panic!("{w}: key {k}: {o:?}"),
                }
            }
            assert_eq!(versions as f64, 2.0 * writes, "{w}");
        }
    }
}
