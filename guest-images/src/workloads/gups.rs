//! `gups`: Colloid's GUPS (§5.1). Each operation reads and updates one object
//! of `object` bytes, from a random hot set of `hot_size` bytes with
//! probability `hot_prob`, else from the whole buffer of `size` bytes. The
//! hot set is a seeded random subset of pages, or (`hot_layout=block`) one
//! contiguous run of pages at the start of the buffer. With `hot_move_s`,
//! the hot set moves once, that many seconds into the run, by half the
//! buffer (to the pages half a permutation further on, or to the block that
//! starts half the buffer further on): a disjoint set when
//! `2 * hot_size <= size`, and for the block layout one that is not
//! adjacent either unless `2 * hot_size == size`. Access trackers are tested against this
//! known move; worker 0 publishes where the set was and went
//! (`hot_first_page`, `hot_next_page`: guest-physical page numbers of the
//! block in a VM, whose RAM is identity-mapped) and when it moved
//! (`hot_moved_s`, seconds after the run phase started; -1 = not reached).

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    access_lines, data_words, touch_partition, Access, AffinePermutation, Env, OPS_ARG, PAGE_SIZE,
    PUBLISH_EVERY,
};
use crate::abi::Phase;
use crate::args::{ArgKind, ArgSpec, Args, ImageSpec};
use crate::gen::Rng;

const MAX_BYTES: u64 = 1 << 46;

/// The image's arguments.
pub static SPEC: ImageSpec = ImageSpec {
    name: "gups",
    about: "Colloid's GUPS: read+update of objects, hot set with probability hot_prob",
    args: &[
        ArgSpec {
            key: "size",
            kind: ArgKind::Size {
                min: PAGE_SIZE,
                max: MAX_BYTES,
            },
            default: "512M",
            help: "buffer bytes",
        },
        ArgSpec {
            key: "hot_size",
            kind: ArgKind::Size {
                min: PAGE_SIZE,
                max: MAX_BYTES,
            },
            default: "160M",
            help: "hot-set bytes (<= size), a random subset of pages",
        },
        ArgSpec {
            key: "hot_prob",
            kind: ArgKind::Float { min: 0.0, max: 1.0 },
            default: "0.9",
            help: "probability an operation targets the hot set",
        },
        ArgSpec {
            key: "hot_layout",
            kind: ArgKind::Choice(&["random", "block"]),
            default: "random",
            help:
                "hot set: a random subset of pages, or one contiguous block at the buffer's start",
        },
        ArgSpec {
            key: "hot_move_s",
            kind: ArgKind::Float { min: 0.0, max: 1e6 },
            default: "0",
            help: "seconds into the run at which the hot set moves by half the buffer (0 = never)",
        },
        ArgSpec {
            key: "object",
            kind: ArgKind::Choice(&[
                "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096",
            ]),
            default: "64",
            help: "object bytes read and updated per operation",
        },
        OPS_ARG,
    ],
};

/// Parameters of the GUPS workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GupsParams {
    /// Buffer bytes (page multiple).
    pub size: u64,
    /// Hot-set bytes (page multiple, <= size).
    pub hot_size: u64,
    /// Probability of a hot-set operation.
    pub hot_prob: f64,
    /// Object bytes (power of two, 8..=4096).
    pub object: u64,
}

impl GupsParams {
    /// Reads the parameters from `args`.
    pub fn from_args(args: &Args<'_>) -> Self {
        let size = (args.size("size", 512 << 20) / PAGE_SIZE).max(1) * PAGE_SIZE;
        let hot_size =
            ((args.size("hot_size", 160 << 20) / PAGE_SIZE).max(1) * PAGE_SIZE).min(size);
        let object = args.u64("object", 64);
        let object = if object.is_power_of_two() && (8..=PAGE_SIZE).contains(&object) {
            object
        } else {
            64
        };
        Self {
            size,
            hot_size,
            hot_prob: args.f64("hot_prob", 0.9).clamp(0.0, 1.0),
            object,
        }
    }
}

/// The access pattern (each operation is one read-modify-write access).
#[derive(Clone, Debug)]
pub struct GupsPattern {
    pages: u64,
    hot_pages: u64,
    hot_prob: f64,
    object: u64,
    perm: AffinePermutation,
    /// The hot set is the contiguous run `hot_base..hot_base + hot_pages`.
    block: bool,
    /// First index of the hot set (into the permutation, or the block's page).
    hot_base: u64,
}

impl GupsPattern {
    /// The pattern for `p`; `seed` chooses the hot set.
    pub fn new(p: &GupsParams, seed: u64) -> Self {
        let pages = p.size / PAGE_SIZE;
        Self {
            pages,
            hot_pages: p.hot_size / PAGE_SIZE,
            hot_prob: p.hot_prob,
            object: p.object,
            perm: AffinePermutation::new(pages, seed ^ 0x6775_7073),
            block: false,
            hot_base: 0,
        }
    }

    /// The same pattern with the hot set as one contiguous block of pages
    /// (at the buffer's start until [`move_hot_set`](Self::move_hot_set)).
    pub fn with_block_layout(mut self) -> Self {
        self.block = true;
        self
    }

    /// Moves the hot set by half the buffer (disjoint from the current set
    /// when `2 * hot_pages <= pages`; it wraps at the buffer's end).
    pub fn move_hot_set(&mut self) {
        self.hot_base = (self.hot_base + self.pages / 2) % self.pages.max(1);
    }

    /// First page of the hot block (with the block layout).
    pub fn hot_block_start(&self) -> u64 {
        self.hot_base
    }

    fn hot_index(&self, i: u64) -> u64 {
        let j = (self.hot_base + i) % self.pages.max(1);
        if self.block {
            j
        } else {
            self.perm.apply(j)
        }
    }

    /// Whether `page` belongs to the hot set (O(hot set) scan-free check is
    /// not possible with the permutation; this inverts by search, for tests
    /// and models only).
    pub fn hot_page(&self, i: u64) -> u64 {
        self.hot_index(i % self.hot_pages.max(1))
    }

    /// Number of hot pages.
    pub fn hot_pages(&self) -> u64 {
        self.hot_pages
    }

    /// The next access (always a write: read + update).
    #[inline]
    pub fn next_access(&self, rng: &mut Rng) -> Access {
        let page = if rng.chance(self.hot_prob) {
            self.hot_index(rng.below(self.hot_pages))
        } else {
            rng.below(self.pages)
        };
        let slot = rng.below(PAGE_SIZE / self.object);
        Access {
            addr: page * PAGE_SIZE + slot * self.object,
            write: true,
        }
    }
}

/// Runs the workload on one worker; returns 0.
pub fn run<E: Env>(env: &E, mem: &[AtomicU64]) -> u32 {
    let params = GupsParams::from_args(&env.args());
    let words = data_words(mem, params.size);
    env.set_phase(Phase::Init);
    touch_partition(env, words);
    let mut pattern = GupsPattern::new(&params, env.seed());
    if env.args().str("hot_layout", "random") == "block" {
        pattern = pattern.with_block_layout();
    }
    let first_block = pattern.hot_block_start();
    let mut rng = Rng::for_stream(env.seed(), u64::from(env.vcpu()));
    let limit = env.args().u64("ops", 0);
    let object_words = (params.object / 8) as usize;
    // The move's time in cycles after the run starts (0 = never).
    let move_s = env.args().f64("hot_move_s", 0.0);
    let move_cycles = (move_s * env.tsc_khz() as f64 * 1e3) as u64;
    let mut moved_s = -1.0;
    env.barrier();
    env.set_phase(Phase::Run);
    let start = env.cycles();
    let mut ops = 0u64;
    loop {
        // A stop that came during set-up ends the run before a batch whose
        // accesses would first-touch what the set-up left untouched.
        if env.stop_requested() {
            break;
        }
        if move_cycles > 0 && moved_s < 0.0 {
            let now = env.cycles().wrapping_sub(start);
            if now >= move_cycles {
                pattern.move_hot_set();
                moved_s = now as f64 / (env.tsc_khz().max(1) as f64 * 1e3);
            }
        }
        for _ in 0..PUBLISH_EVERY {
            let a = pattern.next_access(&mut rng);
            let w = (a.addr / 8) as usize;
            if let Some(obj) = words.get(w..w + object_words) {
                for x in obj {
                    x.store(x.load(Relaxed) ^ ops.wrapping_add(1), Relaxed);
                }
                access_lines(env, obj, true);
            }
        }
        ops += PUBLISH_EVERY;
        env.set_ops(ops);
        if env.stop_requested() || (limit != 0 && ops >= limit) {
            break;
        }
    }
    if env.vcpu() == 0 && (move_cycles > 0 || pattern.block) {
        // Page numbers of the buffer (guest-physical in a VM: RAM is
        // identity-mapped), so a host-side tracker can be checked.
        let base_page = words.as_ptr() as u64 / PAGE_SIZE;
        let mut next = pattern.clone();
        if moved_s < 0.0 {
            next.move_hot_set();
        }
        env.metric("hot_pages", params.hot_size as f64 / PAGE_SIZE as f64);
        env.metric("hot_first_page", (base_page + first_block) as f64);
        env.metric("hot_next_page", (base_page + next.hot_block_start()) as f64);
        env.metric("hot_moved_s", moved_s);
    }
    env.set_phase(Phase::Done);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each operation reports every cache line of its object, as a write.
    #[test]
    fn run_reports_each_line_of_each_object() {
        use super::super::host_env::{zeroed, TestEnv};
        for (object, lines) in [("8", 1), ("64", 1), ("256", 4)] {
            let env = TestEnv::new(
                &SPEC,
                &[("size", "1M"), ("hot_size", "64K"), ("object", object)],
                2_560,
            );
            let mem = zeroed(super::super::SCRATCH_WORDS + (1 << 20) / 8);
            assert_eq!(run(&env, &mem), 0);
            let a = env.accesses.get();
            assert_eq!(
                (a.reads, a.writes),
                (0, lines * env.ops.get()),
                "object {object}"
            );
        }
    }

    #[test]
    fn hot_set_gets_its_share() {
        let p = GupsParams {
            size: 64 << 20,
            hot_size: 16 << 20,
            hot_prob: 0.9,
            object: 64,
        };
        let pat = GupsPattern::new(&p, 3);
        let hot: std::collections::HashSet<u64> =
            (0..pat.hot_pages()).map(|i| pat.hot_page(i)).collect();
        assert_eq!(hot.len() as u64, pat.hot_pages());
        let mut rng = Rng::new(1);
        let n = 200_000;
        let mut in_hot = 0;
        for _ in 0..n {
            let a = pat.next_access(&mut rng);
            assert!(a.addr + 64 <= p.size && a.write);
            in_hot += u32::from(hot.contains(&(a.addr / PAGE_SIZE)));
        }
        // 0.9 directly + 0.1 * (hot share of the whole buffer = 0.25).
        let expected = 0.9 + 0.1 * 0.25;
        let got = f64::from(in_hot) / f64::from(n);
        assert!((got - expected).abs() < 0.01, "{got} vs {expected}");
    }

    /// The block layout's hot set is one run of pages, and a move takes
    /// every hot access to the run half the buffer further on.
    #[test]
    fn block_hot_set_moves_to_the_next_block() {
        let p = GupsParams {
            size: 64 << 20,
            hot_size: 4 << 20,
            hot_prob: 1.0,
            object: 64,
        };
        let mut pat = GupsPattern::new(&p, 3).with_block_layout();
        let hot = pat.hot_pages();
        let mut rng = Rng::new(1);
        for _ in 0..10_000 {
            let page = pat.next_access(&mut rng).addr / PAGE_SIZE;
            assert!(page < hot, "page {page} outside the first block");
        }
        pat.move_hot_set();
        let half = (64 << 20) / PAGE_SIZE / 2;
        assert_eq!(pat.hot_block_start(), half);
        for _ in 0..10_000 {
            let page = pat.next_access(&mut rng).addr / PAGE_SIZE;
            assert!(
                (half..half + hot).contains(&page),
                "page {page} outside the moved block"
            );
        }
        // The random layout moves to a disjoint subset too.
        let mut r = GupsPattern::new(&p, 3);
        let before: std::collections::HashSet<u64> = (0..hot).map(|i| r.hot_page(i)).collect();
        r.move_hot_set();
        assert!((0..hot).all(|i| !before.contains(&r.hot_page(i))));
    }
}
