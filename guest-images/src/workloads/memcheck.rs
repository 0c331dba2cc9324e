//! `memcheck`: the end-to-end integrity checker.
//!
//! It owns `region` bytes of pages, partitioned among the vCPUs. Every write
//! stamps a page with `version << 32 | page` in its first and last word and
//! records the version in a bookkeeping array after the region. Each vCPU
//! checks a page's current stamp before every write (so a lost write is
//! caught even if the page is rewritten soon after), verifies all its pages
//! every `verify_ms` and once more at the end (the
//! final pass checks every word of every page: the stamp words and zeros
//! elsewhere). A page that ever fails a check is flagged; the exit code is
//! the number of flagged pages (0 = nothing lost).

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    addr_of, data_words, partition, AffinePermutation, Charge, Env, OPS_ARG, PAGE_SIZE, PAGE_WORDS,
};
use crate::abi::Phase;
use crate::args::{ArgKind, ArgSpec, Args, ImageSpec};
use crate::gen::Rng;

const MAX_BYTES: u64 = 1 << 46;
/// Bookkeeping flag: this page failed a verification at least once.
const FLAG_MISMATCH: u64 = 1 << 63;

/// The image's arguments.
pub static SPEC: ImageSpec = ImageSpec {
    name: "memcheck",
    about: "integrity checker: versioned page stamps, periodic and final verification",
    args: &[
        ArgSpec {
            key: "region",
            kind: ArgKind::Size {
                min: PAGE_SIZE,
                max: MAX_BYTES,
            },
            default: "64M",
            help: "bytes of pages under check",
        },
        ArgSpec {
            key: "pattern",
            kind: ArgKind::Choice(&["random", "hot", "sequential"]),
            default: "random",
            help: "which page each write goes to",
        },
        ArgSpec {
            key: "write_rate",
            kind: ArgKind::Int {
                min: 0,
                max: 1 << 40,
            },
            default: "0",
            help: "page writes per second per vCPU (0 = as fast as possible)",
        },
        ArgSpec {
            key: "hot_fraction",
            kind: ArgKind::Float {
                min: 0.0001,
                max: 1.0,
            },
            default: "0.1",
            help: "pattern=hot: share of pages in the hot set",
        },
        ArgSpec {
            key: "hot_prob",
            kind: ArgKind::Float { min: 0.0, max: 1.0 },
            default: "0.9",
            help: "pattern=hot: share of writes to the hot set",
        },
        ArgSpec {
            key: "verify_ms",
            kind: ArgKind::Int {
                min: 1,
                max: 3_600_000,
            },
            default: "200",
            help: "period of the full verification pass",
        },
        OPS_ARG,
    ],
};

/// Which page each write goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Uniformly random page.
    Random,
    /// `hot_prob` of writes to a random `hot_fraction` of pages.
    Hot,
    /// Round-robin over pages.
    Sequential,
}

/// Parameters of memcheck.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemcheckParams {
    /// Pages under check.
    pub pages: u64,
    /// Write pattern.
    pub pattern: Pattern,
    /// Writes per second per vCPU (0 = unthrottled).
    pub write_rate: u64,
    /// Hot-set share (pattern=hot).
    pub hot_fraction: f64,
    /// Hot-set probability (pattern=hot).
    pub hot_prob: f64,
    /// Verification period.
    pub verify_ms: u64,
}

impl MemcheckParams {
    /// Reads the parameters from `args`.
    pub fn from_args(args: &Args<'_>) -> Self {
        let pattern = match args.str("pattern", "random") {
            "hot" => Pattern::Hot,
            "sequential" => Pattern::Sequential,
            _ => Pattern::Random,
        };
        Self {
            pages: (args.size("region", 64 << 20) / PAGE_SIZE).max(1),
            pattern,
            write_rate: args.u64("write_rate", 0),
            hot_fraction: args.f64("hot_fraction", 0.1).clamp(0.0001, 1.0),
            hot_prob: args.f64("hot_prob", 0.9).clamp(0.0, 1.0),
            verify_ms: args.u64("verify_ms", 200).max(1),
        }
    }

    /// Bytes of the region plus its bookkeeping array (page aligned).
    pub fn bytes_needed(&self) -> u64 {
        let book = (self.pages * 8).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        self.pages * PAGE_SIZE + book
    }
}

/// The stamp of `page` at `version`.
#[inline]
pub fn stamp(page: u64, version: u64) -> u64 {
    (version << 32) | (page & 0xffff_ffff)
}

/// Byte offset of page `page`'s stamp within the data region (for tests that
/// corrupt a page from outside).
pub fn page_offset(page: u64) -> u64 {
    page * PAGE_SIZE
}

struct Checker<'a> {
    pages: &'a [AtomicU64],
    book: &'a [AtomicU64],
}

impl Checker<'_> {
    /// Stamps `page` with its next version. The old stamp is checked first
    /// (a read-modify-write, as cheap as the write), so a lost write is
    /// caught even when the page is rewritten before the next full pass.
    #[inline]
    fn write<C: Charge + ?Sized>(&self, page: u64, c: &C) {
        let b = &self.book[page as usize];
        let mut entry = b.load(Relaxed);
        let base = page as usize * PAGE_WORDS;
        let old = (entry & !FLAG_MISMATCH) as u32;
        if old != 0 && self.pages[base].load(Relaxed) != stamp(page, u64::from(old)) {
            entry |= FLAG_MISMATCH;
        }
        let version = (entry & !FLAG_MISMATCH) + 1;
        let s = stamp(page, version);
        self.pages[base].store(s, Relaxed);
        self.pages[base + PAGE_WORDS - 1].store(s, Relaxed);
        b.store(version | (entry & FLAG_MISMATCH), Relaxed);
        c.access(addr_of(b), true);
        c.access(addr_of(&self.pages[base]), true);
        c.access(addr_of(&self.pages[base + PAGE_WORDS - 1]), true);
    }

    /// Checks `page`; `full` also checks every middle word is zero. Flags and
    /// returns `true` on a mismatch.
    fn verify(&self, page: u64, full: bool) -> bool {
        let b = &self.book[page as usize];
        let entry = b.load(Relaxed);
        let s = stamp(page, entry & !FLAG_MISMATCH);
        let base = page as usize * PAGE_WORDS;
        let mut bad = self.pages[base].load(Relaxed) != s
            || self.pages[base + PAGE_WORDS - 1].load(Relaxed) != s;
        if full && !bad {
            bad = self.pages[base + 1..base + PAGE_WORDS - 1]
                .iter()
                .any(|w| w.load(Relaxed) != 0);
        }
        if bad {
            b.store(entry | FLAG_MISMATCH, Relaxed);
        }
        bad
    }

    fn flagged(&self, page: u64) -> bool {
        self.book[page as usize].load(Relaxed) & FLAG_MISMATCH != 0
    }
}

/// One worker's counts from the run phase.
struct RunTotals {
    ops: u64,
    passes: u64,
    periodic_bad: u64,
}

/// Runs memcheck on one worker; returns the number of this worker's pages
/// that failed a verification.
///
/// One worker's life, phases separated by team barriers every worker must
/// reach in the same order: init (stamp every page), run, verify, report.
pub fn run<E: Env>(env: &E, mem: &[AtomicU64]) -> u32 {
    let params = MemcheckParams::from_args(&env.args());
    let all = data_words(mem, params.bytes_needed());
    let region_words = (params.pages as usize) * PAGE_WORDS;
    if all.len() < region_words + params.pages as usize {
        env.log("memcheck: heap too small for the region; raise --mem or lower region");
        return u32::MAX;
    }
    let (pages, rest) = all.split_at(region_words);
    let checker = Checker {
        pages,
        book: &rest[..params.pages as usize],
    };
    let mine = partition(params.pages, env.vcpus(), env.vcpu());
    env.set_phase(Phase::Init);
    for p in mine.clone() {
        checker.write(p, &());
    }
    env.barrier();
    env.set_phase(Phase::Run);
    let t = run_writes(env, &checker, &params, mine.clone());
    env.set_phase(Phase::Verify);
    let flagged = verify_and_report(env, mem, &checker, &params, mine, &t);
    env.set_phase(Phase::Done);
    u32::try_from(flagged).unwrap_or(u32::MAX)
}

/// The run phase: writes to this worker's pages `mine` until a stop or
/// `ops=`, verifying them every `verify_ms`. The write loop is kept whole
/// here (it is what the benchmark measures).
fn run_writes<E: Env>(
    env: &E,
    checker: &Checker<'_>,
    params: &MemcheckParams,
    mine: core::ops::Range<u64>,
) -> RunTotals {
    let n = mine.end - mine.start;
    let mut rng = Rng::for_stream(env.seed(), u64::from(env.vcpu()));
    let hot_n = ((n as f64 * params.hot_fraction) as u64).clamp(1, n.max(1));
    let perm = AffinePermutation::new(n, env.seed() ^ u64::from(env.vcpu()));
    let khz = env.tsc_khz().max(1);
    let verify_cycles = params.verify_ms.saturating_mul(khz);
    // 0 = unthrottled.
    let write_cycles = (khz * 1000)
        .checked_div(params.write_rate)
        .map_or(0, |c| c.max(1));
    let limit = env.args().u64("ops", 0);
    let (mut ops, mut seq, mut passes, mut periodic_bad) = (0u64, 0u64, 0u64, 0u64);
    let start = env.cycles();
    let mut next_verify = start.wrapping_add(verify_cycles);
    let mut next_write = start;
    if n > 0 {
        loop {
            for _ in 0..64 {
                let local = match params.pattern {
                    Pattern::Random => rng.below(n),
                    Pattern::Sequential => {
                        seq = (seq + 1) % n;
                        seq
                    }
                    Pattern::Hot => {
                        if rng.chance(params.hot_prob) {
                            perm.apply(rng.below(hot_n))
                        } else {
                            rng.below(n)
                        }
                    }
                };
                checker.write(mine.start + local, env);
                ops += 1;
                if write_cycles != 0 {
                    next_write = next_write.wrapping_add(write_cycles);
                    while (env.cycles().wrapping_sub(next_write) as i64) < 0
                        && !env.stop_requested()
                    {
                        core::hint::spin_loop();
                    }
                }
            }
            env.set_ops(ops);
            let now = env.cycles();
            if (now.wrapping_sub(next_verify) as i64) >= 0 {
                env.set_phase(Phase::Verify);
                periodic_bad += mine.clone().filter(|&p| checker.verify(p, false)).count() as u64;
                passes += 1;
                next_verify = env.cycles().wrapping_add(verify_cycles);
                env.set_phase(Phase::Run);
            }
            if env.stop_requested() || (limit != 0 && ops >= limit) {
                break;
            }
        }
    }
    RunTotals {
        ops,
        passes,
        periodic_bad,
    }
}

/// The final verification of this worker's pages `mine`, the team totals
/// (worker 0 reports them); returns this worker's flagged pages.
fn verify_and_report<E: Env>(
    env: &E,
    mem: &[AtomicU64],
    checker: &Checker<'_>,
    params: &MemcheckParams,
    mine: core::ops::Range<u64>,
    t: &RunTotals,
) -> u64 {
    for p in mine.clone() {
        checker.verify(p, true);
    }
    let flagged = mine.filter(|&p| checker.flagged(p)).count() as u64;
    // Cross-vCPU totals through the scratch area: words 8..12.
    let scratch = |i: usize| &mem[8 + i];
    scratch(0).fetch_add(flagged, Relaxed);
    scratch(1).fetch_add(t.ops, Relaxed);
    scratch(2).fetch_add(t.passes, Relaxed);
    scratch(3).fetch_add(t.periodic_bad, Relaxed);
    env.barrier();
    if env.vcpu() == 0 {
        env.metric("mismatched_pages", scratch(0).load(Relaxed) as f64);
        env.metric("pages", params.pages as f64);
        env.metric("writes", scratch(1).load(Relaxed) as f64);
        env.metric("verify_passes", scratch(2).load(Relaxed) as f64);
        env.metric("periodic_mismatches", scratch(3).load(Relaxed) as f64);
    }
    flagged
}

#[cfg(test)]
mod tests {
    use super::super::host_env::{zeroed, TestEnv};
    use super::super::SCRATCH_WORDS;
    use super::*;

    fn mem_for(region: u64) -> std::vec::Vec<AtomicU64> {
        let p = MemcheckParams {
            pages: region / PAGE_SIZE,
            pattern: Pattern::Random,
            write_rate: 0,
            hot_fraction: 0.1,
            hot_prob: 0.9,
            verify_ms: 1,
        };
        zeroed(SCRATCH_WORDS + (p.bytes_needed() / 8) as usize)
    }

    #[test]
    fn clean_run_reports_zero() {
        for pattern in ["random", "hot", "sequential"] {
            let env = TestEnv::new(
                &SPEC,
                &[("region", "256K"), ("pattern", pattern), ("verify_ms", "1")],
                5_000,
            );
            let mem = mem_for(256 << 10);
            assert_eq!(run(&env, &mem), 0, "{pattern}");
            assert_eq!(env.metric_value("mismatched_pages"), Some(0.0));
            assert!(env.metric_value("verify_passes").unwrap() > 0.0);
        }
    }

    #[test]
    fn detects_stale_stamp_and_garbage() {
        // Stale stamp in the first word of page 3, then garbage in the middle of page 5.
        for (word, value) in [(3 * PAGE_WORDS, stamp(3, 0)), (5 * PAGE_WORDS + 17, 0xdead)] {
            let mem = mem_for(256 << 10);
            // Corrupt the word once, when 640 operations are published.
            let env = TestEnv::new(
                &SPEC,
                &[("region", "256K"), ("pattern", "sequential")],
                5_000,
            )
            .with_hook(|_, after| {
                if after == 640 {
                    mem[SCRATCH_WORDS + word].store(value, Relaxed);
                }
            });
            // Sequential writes rewrite every page 78 times in 5000 ops, so
            // only the final full check or a periodic check can see this.
            let bad = run(&env, &mem);
            assert!(bad >= 1, "corruption at word {word} not detected");
        }
    }
}
