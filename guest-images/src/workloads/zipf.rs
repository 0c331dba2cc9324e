//! `zipf`: Nomad's micro-benchmark. Zipfian reads or writes over a working set
//! (WSS) placed at the end of a larger resident set (RSS): the first
//! `rss - wss` bytes are touched once and then stay cold, like the paper's
//! small/medium/large layouts (Nomad §4.1, Fig. 6). Hot pages are spread over
//! the WSS (scrambled Zipf) unless `scramble=0`.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{addr_of, data_words, touch_partition, Access, Env, OPS_ARG, PAGE_SIZE, PUBLISH_EVERY};
use crate::abi::Phase;
use crate::args::{ArgKind, ArgSpec, Args, ImageSpec};
use crate::gen::{Rng, Zipf};

const MAX_BYTES: u64 = 1 << 46;

/// The image's arguments.
pub static SPEC: ImageSpec = ImageSpec {
    name: "zipf",
    about: "Nomad's Zipfian micro-benchmark over a working set inside a resident set",
    args: &[
        ArgSpec {
            key: "rss",
            kind: ArgKind::Size {
                min: PAGE_SIZE,
                max: MAX_BYTES,
            },
            default: "512M",
            help: "resident set: bytes touched at start",
        },
        ArgSpec {
            key: "wss",
            kind: ArgKind::Size {
                min: PAGE_SIZE,
                max: MAX_BYTES,
            },
            default: "256M",
            help: "working set: the last WSS bytes of the RSS get the Zipfian accesses (<= rss)",
        },
        ArgSpec {
            key: "theta",
            kind: ArgKind::Float {
                min: 0.0,
                max: 0.9999,
            },
            default: "0.99",
            help: "Zipf skew",
        },
        ArgSpec {
            key: "write_ratio",
            kind: ArgKind::Float { min: 0.0, max: 1.0 },
            default: "0",
            help: "share of operations that write (0 = read-only, 1 = write-only)",
        },
        ArgSpec {
            key: "stride",
            kind: ArgKind::Choice(&["8", "64"]),
            default: "64",
            help: "bytes touched per operation: one word (8) or one cache line (64)",
        },
        ArgSpec {
            key: "scramble",
            kind: ArgKind::Choice(&["0", "1"]),
            default: "1",
            help: "1 = spread hot pages over the WSS (YCSB scrambled Zipfian), 0 = hottest first",
        },
        OPS_ARG,
    ],
};

/// Parameters of the zipf workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZipfParams {
    /// Resident-set bytes (page multiple).
    pub rss: u64,
    /// Working-set bytes (page multiple, <= rss).
    pub wss: u64,
    /// Zipf skew.
    pub theta: f64,
    /// Share of writes.
    pub write_ratio: f64,
    /// Bytes per access (8 or 64).
    pub stride: u64,
    /// Scrambled Zipf.
    pub scrambled: bool,
}

impl ZipfParams {
    /// Reads the parameters from `args` (defaults from [`SPEC`]).
    pub fn from_args(args: &Args<'_>) -> Self {
        let rss = (args.size("rss", 512 << 20) / PAGE_SIZE).max(1) * PAGE_SIZE;
        let wss = ((args.size("wss", 256 << 20) / PAGE_SIZE).max(1) * PAGE_SIZE).min(rss);
        Self {
            rss,
            wss,
            theta: args.f64("theta", 0.99),
            write_ratio: args.f64("write_ratio", 0.0).clamp(0.0, 1.0),
            stride: if args.u64("stride", 64) == 8 { 8 } else { 64 },
            scrambled: args.u64("scramble", 1) != 0,
        }
    }
}

/// The access pattern: which byte of the RSS each operation touches.
#[derive(Clone, Debug)]
pub struct ZipfPattern {
    zipf: Zipf,
    wss_base: u64,
    slots_per_page: u64,
    stride: u64,
    write_ratio: f64,
}

impl ZipfPattern {
    /// The pattern for `p`.
    pub fn new(p: &ZipfParams) -> Self {
        Self {
            zipf: Zipf::new(p.wss / PAGE_SIZE, p.theta, p.scrambled),
            wss_base: p.rss - p.wss,
            slots_per_page: PAGE_SIZE / p.stride,
            stride: p.stride,
            write_ratio: p.write_ratio,
        }
    }

    /// The Zipf generator over WSS pages.
    pub fn zipf(&self) -> &Zipf {
        &self.zipf
    }

    /// The next access.
    #[inline]
    pub fn next_access(&self, rng: &mut Rng) -> Access {
        let page = self.zipf.next(rng);
        let slot = rng.below(self.slots_per_page);
        let write = self.write_ratio > 0.0 && rng.chance(self.write_ratio);
        Access {
            addr: self.wss_base + page * PAGE_SIZE + slot * self.stride,
            write,
        }
    }
}

/// Runs the workload on one worker; returns 0.
pub fn run<E: Env>(env: &E, mem: &[AtomicU64]) -> u32 {
    let params = ZipfParams::from_args(&env.args());
    let words = data_words(mem, params.rss);
    env.set_phase(Phase::Init);
    touch_partition(env, words);
    let pattern = ZipfPattern::new(&params);
    let mut rng = Rng::for_stream(env.seed(), u64::from(env.vcpu()));
    let limit = env.args().u64("ops", 0);
    let line_words = (params.stride / 8) as usize;
    env.barrier();
    env.set_phase(Phase::Run);
    let mut ops = 0u64;
    let mut sink = 0u64;
    'run: loop {
        // A stop that came during set-up ends the run before a batch whose
        // accesses would first-touch what the set-up left untouched.
        if env.stop_requested() {
            break 'run;
        }
        for _ in 0..PUBLISH_EVERY {
            let a = pattern.next_access(&mut rng);
            let w = (a.addr / 8) as usize;
            let Some(line) = words.get(w..w + line_words) else {
                continue;
            };
            if a.write {
                for x in line {
                    x.store(x.load(Relaxed).wrapping_add(1), Relaxed);
                }
            } else {
                for x in line {
                    sink = sink.wrapping_add(x.load(Relaxed));
                }
            }
            // One cache line (stride 64) or one word of it (stride 8).
            env.access(addr_of(&line[0]), a.write);
        }
        ops += PUBLISH_EVERY;
        env.set_ops(ops);
        if env.stop_requested() || (limit != 0 && ops >= limit) {
            break 'run;
        }
    }
    // Keep the reads observable so they are not optimised away.
    if let Some(s) = mem.get(env.vcpu() as usize) {
        s.store(sink, Relaxed);
    }
    env.set_phase(Phase::Done);
    0
}

#[cfg(test)]
mod tests {
    use super::super::host_env::{zeroed, TestEnv};
    use super::*;

    #[test]
    fn accesses_stay_in_the_working_set() {
        let p = ZipfParams {
            rss: 64 << 20,
            wss: 16 << 20,
            theta: 0.99,
            write_ratio: 0.3,
            stride: 64,
            scrambled: true,
        };
        let pat = ZipfPattern::new(&p);
        let mut rng = Rng::new(5);
        let mut writes = 0;
        for _ in 0..100_000 {
            let a = pat.next_access(&mut rng);
            assert!(a.addr >= 48 << 20 && a.addr + 64 <= 64 << 20, "{a:?}");
            assert_eq!(a.addr % 64, 0);
            writes += u32::from(a.write);
        }
        assert!((28_000..32_000).contains(&writes), "writes {writes}");
    }

    #[test]
    fn run_writes_only_the_working_set() {
        let env = TestEnv::new(
            &SPEC,
            &[
                ("rss", "256K"),
                ("wss", "64K"),
                ("write_ratio", "1"),
                ("stride", "8"),
            ],
            10_000,
        );
        let mem = zeroed(super::super::SCRATCH_WORDS + (256 << 10) / 8);
        assert_eq!(run(&env, &mem), 0);
        let data = &mem[super::super::SCRATCH_WORDS..];
        let cold: u64 = data[..(192 << 10) / 8]
            .iter()
            .map(|x| x.load(Relaxed))
            .sum();
        let hot: u64 = data[(192 << 10) / 8..]
            .iter()
            .map(|x| x.load(Relaxed))
            .sum();
        // Cold part only holds the touch marks (page numbers), the WSS got every write.
        let touch_marks: u64 = (0..48u64).sum();
        assert_eq!(cold, touch_marks);
        let hot_marks: u64 = (48..64u64).sum();
        assert_eq!(hot - hot_marks, env.ops.get());
        // Every operation reported its one line, inside the working set.
        let a = env.accesses.get();
        assert_eq!((a.reads, a.writes), (0, env.ops.get()));
        let wss = &data[(192 << 10) / 8..];
        assert!(a.lowest >= addr_of(&wss[0]) && a.highest <= addr_of(&wss[wss.len() - 1]));
    }
}
