//! `gups`: Colloid's GUPS (§5.1). Each operation reads and updates one object
//! of `object` bytes, from a random hot set of `hot_size` bytes with
//! probability `hot_prob`, else from the whole buffer of `size` bytes. The
//! hot set is a seeded random subset of pages.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    data_words, touch_partition, Access, AffinePermutation, Env, OPS_ARG, PAGE_SIZE, PUBLISH_EVERY,
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
        }
    }

    /// Whether `page` belongs to the hot set (O(hot set) scan-free check is
    /// not possible with the permutation; this inverts by search, for tests
    /// and models only).
    pub fn hot_page(&self, i: u64) -> u64 {
        self.perm.apply(i % self.hot_pages.max(1))
    }

    /// Number of hot pages.
    pub fn hot_pages(&self) -> u64 {
        self.hot_pages
    }

    /// The next access (always a write: read + update).
    #[inline]
    pub fn next_access(&self, rng: &mut Rng) -> Access {
        let page = if rng.chance(self.hot_prob) {
            self.perm.apply(rng.below(self.hot_pages))
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
    let pattern = GupsPattern::new(&params, env.seed());
    let mut rng = Rng::for_stream(env.seed(), u64::from(env.vcpu()));
    let limit = env.args().u64("ops", 0);
    let object_words = (params.object / 8) as usize;
    env.barrier();
    env.set_phase(Phase::Run);
    let mut ops = 0u64;
    loop {
        for _ in 0..PUBLISH_EVERY {
            let a = pattern.next_access(&mut rng);
            let w = (a.addr / 8) as usize;
            if let Some(obj) = words.get(w..w + object_words) {
                for x in obj {
                    x.store(x.load(Relaxed) ^ ops.wrapping_add(1), Relaxed);
                }
            }
        }
        ops += PUBLISH_EVERY;
        env.set_ops(ops);
        if env.stop_requested() || (limit != 0 && ops >= limit) {
            break;
        }
    }
    env.set_phase(Phase::Done);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
