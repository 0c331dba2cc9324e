//! The workloads, written once and run both inside a guest (through the
//! ring-3 runtime) and natively on the host (through `tiervm native`), so the
//! two can be compared on the same code.
//!
//! A workload is a function `fn(&impl Env, &[AtomicU64]) -> u32` executed by
//! every vCPU. The memory slice is the guest heap, shared by all vCPUs; its
//! first [`SCRATCH_WORDS`] words are a scratch area for cross-vCPU
//! accumulators, the data set starts after it. The return value is the
//! vCPU's share of the exit code; the runtime sums them (saturating).

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::abi::Phase;
use crate::args::{ArgKind, ArgSpec, Args, ImageSpec};

pub mod gups;
pub mod kv;
pub mod memcheck;
pub mod pagerank;
pub mod zipf;

/// Words at the start of the heap reserved for cross-vCPU accumulators.
pub const SCRATCH_WORDS: usize = 512;
/// Bytes of the scratch area.
pub const SCRATCH_BYTES: u64 = (SCRATCH_WORDS * 8) as u64;
pub use crate::abi::PAGE_SIZE;
/// Words in a page.
pub const PAGE_WORDS: usize = (PAGE_SIZE / 8) as usize;
/// How many operations run between two publications of the op counter
/// (and checks of the stop request).
pub const PUBLISH_EVERY: u64 = 256;

/// Latency emulation's hook in the workloads (docs/emulation.md): every
/// access a workload makes to its data is reported here, once per cache
/// line touched, after the access. In a guest with `--emulate-latency` the
/// runtime charges it the emulated latency of its page's tier; everywhere
/// else (host runs, tests, guests without emulation) nothing happens.
pub trait Charge {
    /// The workload just read (`write` false) or wrote the cache line
    /// holding address `addr` (use [`addr_of`]).
    #[inline(always)]
    fn access(&self, _addr: usize, _write: bool) {}
    /// The workload just read or wrote `lines` consecutive cache lines,
    /// the first holding `addr` (the next `addr + 64`, ...): the same as
    /// that many [`Self::access`] calls, which an implementation may charge
    /// at once (one tier lookup per page).
    #[inline(always)]
    fn access_span(&self, addr: usize, lines: usize, write: bool) {
        for i in 0..lines {
            self.access(
                addr.wrapping_add(i * crate::abi::CACHE_LINE as usize),
                write,
            );
        }
    }
    /// Pays any emulated latency owed now, so that it lands in the
    /// operation being timed (kv: at the end of every operation).
    #[inline(always)]
    fn settle(&self) {}
}

/// No charging (tests, the simulator's pattern walkers).
impl Charge for () {}

/// The address of `x`, for [`Charge::access`].
#[inline(always)]
pub fn addr_of<T>(x: &T) -> usize {
    x as *const T as usize
}

/// Reports every cache line of `words` to `c` as accessed.
#[inline(always)]
pub fn access_lines<C: Charge + ?Sized>(c: &C, words: &[AtomicU64], write: bool) {
    if let Some(first) = words.first() {
        c.access_span(addr_of(first), words.len().div_ceil(LINE_WORDS), write);
    }
}

/// 64-bit words per 64-byte cache line.
pub const LINE_WORDS: usize = 8;

/// What a workload needs from where it runs (guest runtime or host).
pub trait Env: Charge {
    /// This worker's index, `0..vcpus()`.
    fn vcpu(&self) -> u32;
    /// Number of workers.
    fn vcpus(&self) -> u32;
    /// The run's seed.
    fn seed(&self) -> u64;
    /// The workload arguments.
    fn args(&self) -> Args<'_>;
    /// Whether the VMM (or host driver) asked the workload to stop.
    fn stop_requested(&self) -> bool;
    /// Publishes this worker's operation count.
    fn set_ops(&self, ops: u64);
    /// Publishes this worker's phase.
    fn set_phase(&self, phase: Phase);
    /// A cycle counter (`rdtsc`).
    fn cycles(&self) -> u64;
    /// Cycle counter frequency in kHz.
    fn tsc_khz(&self) -> u64;
    /// Waits until every worker reached the barrier.
    fn barrier(&self);
    /// Publishes a result metric (called by worker 0 only).
    fn metric(&self, name: &str, value: f64);
    /// Writes a line to the console.
    fn log(&self, msg: &str);
}

/// One memory access of a workload's pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Byte offset within the workload's data region.
    pub addr: u64,
    /// Whether the access writes.
    pub write: bool,
}

/// Common argument: stop after this many operations per worker (0 = until stopped).
pub const OPS_ARG: ArgSpec = ArgSpec {
    key: "ops",
    kind: ArgKind::Int {
        min: 0,
        max: u64::MAX,
    },
    default: "0",
    help: "operations per vCPU before the workload ends by itself (0 = run until stopped)",
};

/// The built-in images.
pub const IMAGES: &[&ImageSpec] = &[
    &zipf::SPEC,
    &gups::SPEC,
    &memcheck::SPEC,
    &kv::SPEC,
    &pagerank::SPEC,
];

/// The spec of built-in image `name`.
pub fn image_spec(name: &str) -> Option<&'static ImageSpec> {
    IMAGES.iter().copied().find(|s| s.name == name)
}

/// Heap bytes image `name` needs with `args` (scratch area included).
pub fn heap_need(name: &str, args: &Args<'_>) -> Option<u64> {
    let data = match name {
        "zipf" => zipf::ZipfParams::from_args(args).rss,
        "gups" => gups::GupsParams::from_args(args).size,
        "memcheck" => memcheck::MemcheckParams::from_args(args).bytes_needed(),
        "kv" => kv::KvParams::from_args(args).layout().bytes,
        "pagerank" => pagerank::PagerankParams::from_args(args).layout().bytes,
        _ => return None,
    };
    Some(SCRATCH_BYTES + data)
}

/// Runs built-in image `name` on this worker; `None` for an unknown name.
pub fn run_by_name<E: Env>(name: &str, env: &E, mem: &[AtomicU64]) -> Option<u32> {
    Some(match name {
        "zipf" => zipf::run(env, mem),
        "gups" => gups::run(env, mem),
        "memcheck" => memcheck::run(env, mem),
        "kv" => kv::run(env, mem),
        "pagerank" => pagerank::run(env, mem),
        _ => return None,
    })
}

/// Splits `0..n` into `parts` near-equal ranges and returns range `i`.
pub fn partition(n: u64, parts: u32, i: u32) -> core::ops::Range<u64> {
    let parts = u64::from(parts.max(1));
    let i = u64::from(i).min(parts - 1);
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    let len = base + u64::from(i < extra);
    start..start + len
}

/// Pages touched between two looks at the stop flag while setting up (2 MiB).
const TOUCH_STOP_EVERY: u64 = 512;

/// Touches (writes) every page of `words` owned by this worker, so the data
/// set is resident before the measured phase. A stop requested meanwhile
/// cuts it short (every 2 MiB): a large resident set on a loaded host can
/// take longer to touch than the run lasts, and the VMM forces a run whose
/// guest has not acknowledged its stop within 0.5 s. The caller's run loop
/// sees the same stop after its first batch.
pub fn touch_partition<E: Env>(env: &E, words: &[AtomicU64]) {
    let pages = words.len() as u64 / PAGE_WORDS as u64;
    for p in partition(pages, env.vcpus(), env.vcpu()) {
        if p % TOUCH_STOP_EVERY == 0 && env.stop_requested() {
            return;
        }
        let w = (p as usize) * PAGE_WORDS;
        words[w].store(p, Relaxed);
    }
}

/// The data words after the scratch area, at most `bytes` long.
pub fn data_words(mem: &[AtomicU64], bytes: u64) -> &[AtomicU64] {
    let data = mem.get(SCRATCH_WORDS..).unwrap_or(&[]);
    let n = ((bytes / 8) as usize).min(data.len());
    &data[..n]
}

/// A permutation of `0..n` (`i -> (a*i + b) mod n` with `gcd(a, n) = 1`),
/// used to pick a random-looking subset of pages that can be sampled in O(1).
#[derive(Clone, Copy, Debug)]
pub struct AffinePermutation {
    n: u64,
    a: u64,
    b: u64,
}

impl AffinePermutation {
    /// A permutation of `0..n` chosen by `seed`.
    pub fn new(n: u64, seed: u64) -> Self {
        let n = n.max(1);
        let mut s = seed;
        let mut a = (crate::gen::rng::splitmix64(&mut s) % n) | 1;
        while gcd(a, n) != 1 {
            a = (a + 2) % n.max(2);
            if a == 0 {
                a = 1;
            }
        }
        let b = crate::gen::rng::splitmix64(&mut s) % n;
        Self { n, a, b }
    }

    /// The image of `i` (`i < n`).
    #[inline]
    pub fn apply(&self, i: u64) -> u64 {
        ((u128::from(self.a) * u128::from(i) + u128::from(self.b)) % u128::from(self.n)) as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
pub(crate) mod host_env {
    //! A single-worker host environment for unit tests.
    use super::*;
    use crate::abi::ArgEntry;
    use core::cell::Cell;
    use std::string::String;
    use std::vec::Vec;

    /// Called on every `set_ops` with (ops before, ops after): lets a test
    /// inject a fault (a lost write, a flipped bit) at a chosen point.
    pub type ProgressHook<'a> = std::boxed::Box<dyn Fn(u64, u64) + 'a>;

    pub struct TestEnv<'a> {
        pub entries: Vec<ArgEntry>,
        pub spec: &'static ImageSpec,
        pub ops: Cell<u64>,
        pub stop_after_ops: u64,
        pub metrics: core::cell::RefCell<Vec<(String, f64)>>,
        pub on_progress: Option<ProgressHook<'a>>,
        /// What the workload reported through [`Charge::access`].
        pub accesses: Cell<Accesses>,
    }

    /// Accesses reported to a [`TestEnv`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Accesses {
        pub reads: u64,
        pub writes: u64,
        pub lowest: usize,
        pub highest: usize,
    }

    impl Default for Accesses {
        fn default() -> Self {
            Self {
                reads: 0,
                writes: 0,
                lowest: usize::MAX,
                highest: 0,
            }
        }
    }

    impl<'a> TestEnv<'a> {
        /// This env with `hook` called on every progress publication.
        pub fn with_hook(mut self, hook: impl Fn(u64, u64) + 'a) -> Self {
            self.on_progress = Some(std::boxed::Box::new(hook));
            self
        }

        pub fn new(spec: &'static ImageSpec, args: &[(&str, &str)], stop_after_ops: u64) -> Self {
            let entries = args
                .iter()
                .map(|(k, v)| ArgEntry {
                    key: crate::abi::to_fixed(k).unwrap(),
                    value: crate::abi::to_fixed(v).unwrap(),
                })
                .collect();
            Self {
                entries,
                spec,
                ops: Cell::new(0),
                stop_after_ops,
                metrics: Default::default(),
                on_progress: None,
                accesses: Default::default(),
            }
        }
        pub fn metric_value(&self, name: &str) -> Option<f64> {
            self.metrics
                .borrow()
                .iter()
                .find(|(n, _)| n == name)
                .map(|m| m.1)
        }
    }

    impl Charge for TestEnv<'_> {
        fn access(&self, addr: usize, write: bool) {
            let mut a = self.accesses.get();
            a.reads += u64::from(!write);
            a.writes += u64::from(write);
            a.lowest = a.lowest.min(addr);
            a.highest = a.highest.max(addr);
            self.accesses.set(a);
        }
    }

    impl Env for TestEnv<'_> {
        fn vcpu(&self) -> u32 {
            0
        }
        fn vcpus(&self) -> u32 {
            1
        }
        fn seed(&self) -> u64 {
            1
        }
        fn args(&self) -> Args<'_> {
            Args::new(&self.entries, Some(self.spec))
        }
        fn stop_requested(&self) -> bool {
            self.ops.get() >= self.stop_after_ops
        }
        fn set_ops(&self, ops: u64) {
            if let Some(hook) = &self.on_progress {
                hook(self.ops.get(), ops);
            }
            self.ops.set(ops)
        }
        fn set_phase(&self, _: Phase) {}
        fn cycles(&self) -> u64 {
            // A fake clock advancing with the ops so time-based logic runs.
            self.ops.get() * 1000
        }
        fn tsc_khz(&self) -> u64 {
            1_000_000
        }
        fn barrier(&self) {}
        fn metric(&self, name: &str, value: f64) {
            self.metrics.borrow_mut().push((name.into(), value));
        }
        fn log(&self, _: &str) {}
    }

    pub fn zeroed(words: usize) -> Vec<AtomicU64> {
        (0..words).map(|_| AtomicU64::new(0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_exactly() {
        for n in [0u64, 1, 7, 100, 513] {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let r = partition(n, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    /// A stop requested before or during set-up ends the touching within
    /// 2 MiB (the guest acknowledges the stop; the VMM would force it),
    /// and without a stop every page is touched.
    #[test]
    fn touching_stops_at_a_stop_request() {
        use super::host_env::{zeroed, TestEnv};
        let pages = 4 * TOUCH_STOP_EVERY as usize;
        let touched = |words: &[AtomicU64]| {
            (0..pages)
                .filter(|p| words[p * PAGE_WORDS].load(Relaxed) == *p as u64)
                .count()
        };
        let stopped = TestEnv::new(&super::zipf::SPEC, &[], 0);
        let words = zeroed(pages * PAGE_WORDS);
        words[0].store(u64::MAX, Relaxed);
        touch_partition(&stopped, &words);
        assert_eq!(touched(&words), 0, "stop requested: nothing touched");
        let running = TestEnv::new(&super::zipf::SPEC, &[], u64::MAX);
        touch_partition(&running, &words);
        assert_eq!(touched(&words), pages);
    }

    #[test]
    fn affine_permutation_is_a_bijection() {
        for n in [1u64, 2, 10, 97, 1000, 4096] {
            let p = AffinePermutation::new(n, 1234);
            let mut seen = std::vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i) as usize;
                assert!(!seen[j]);
                seen[j] = true;
            }
        }
    }
}
