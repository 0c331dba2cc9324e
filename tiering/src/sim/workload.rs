//! Access streams: the workloads the simulator replays, built on the same
//! generators the guest images use (`tiervm_guest::gen`).

use serde::{Deserialize, Serialize};
use tiervm_guest::gen::{Rng, Zipf};

/// One access: a page (in the modeled, scaled page space) and whether it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageAccess {
    /// Page index.
    pub page: u64,
    /// Store (or read-modify-write).
    pub write: bool,
}

/// A source of accesses.
pub trait AccessStream {
    /// The next access.
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess;
}

/// What a workload looks like (all sizes in real GiB; the simulator scales).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WorkloadSpec {
    /// Nomad's micro-benchmark: Zipfian (YCSB, scrambled so hot data is
    /// spread along the WSS) reads or writes over a WSS at the end of an RSS
    /// whose first `rss - wss` GiB are never touched.
    Zipf {
        /// Resident set (GiB).
        rss_gib: f64,
        /// Working set (GiB), the last part of the RSS.
        wss_gib: f64,
        /// Zipf skew.
        theta: f64,
    },
    /// Colloid's GUPS: `hot_prob` of accesses to a random hot set of
    /// `hot_gib`, the rest uniform over `size_gib`. Every access is a read
    /// plus an update unless `write_ratio` says otherwise.
    Gups {
        /// Buffer (GiB).
        size_gib: f64,
        /// Hot set (GiB).
        hot_gib: f64,
        /// Probability of a hot-set access.
        hot_prob: f64,
    },
    /// MTM's motivation workload: `hot_prob` of accesses to a hot set of
    /// `hot_fraction` of the buffer with Gaussian hotness (sd = a quarter of
    /// the hot set) centred in it, the rest uniform.
    GaussianHot {
        /// Buffer (GiB).
        size_gib: f64,
        /// Hot fraction of the buffer.
        hot_fraction: f64,
        /// Probability of a hot-set access.
        hot_prob: f64,
    },
}

impl WorkloadSpec {
    /// Footprint in GiB.
    pub fn footprint_gib(&self) -> f64 {
        match self {
            Self::Zipf { rss_gib, .. } => *rss_gib,
            Self::Gups { size_gib, .. } | Self::GaussianHot { size_gib, .. } => *size_gib,
        }
    }
}

/// Table-driven evaluation of `tiervm_guest::gen::Zipf`'s inverse transform.
///
/// `Zipf::next_rank` maps a uniform draw `u` to a rank with Gray's formula,
/// one `pow` per draw. The rank is a step function of `u`, so this
/// precomputes the `u` at which each rank starts (with the same parameters
/// and the guest's own `zeta`) and a guide table over `u`: the same `u`
/// gives the same rank (up to floating-point rounding at a step), in a few
/// nanoseconds. Items come from the guest's `item_of_rank` (the YCSB
/// scrambling), tabulated.
#[derive(Clone, Debug)]
pub struct TableZipf {
    /// `u` at which rank `k` starts (`starts[0] = 0`).
    starts: Vec<f64>,
    /// First rank for each of `guide.len()` equal slices of `[0, 1)`.
    guide: Vec<u32>,
    /// Item of each rank.
    items: Vec<u32>,
}

impl TableZipf {
    /// Items in `0..n` (`n <= 2^32 - 1`), skew `theta`, scrambled like the guest's.
    pub fn new(n: u64, theta: f64, scrambled: bool) -> Self {
        let z = Zipf::new(n.clamp(1, u64::from(u32::MAX)), theta, scrambled);
        let n = z.items();
        let theta = z.theta();
        let zetan = tiervm_guest::gen::zipf::zeta(n, theta);
        let zeta2 = tiervm_guest::gen::zipf::zeta(2.min(n), theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = if n > 1 {
            (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan)
        } else {
            0.0
        };
        let half_pow_theta = 1.0 + 0.5f64.powf(theta);
        // Rank 0 for u * zetan < 1, rank 1 below half_pow_theta, then Gray:
        // rank = floor(n * (eta*u - eta + 1)^alpha) >= k  <=>  u >= u_k.
        let mut starts = vec![0.0; n as usize];
        for k in 1..n as usize {
            let gray = if eta > 0.0 {
                (((k as f64) / n as f64).powf(1.0 / alpha) - 1.0 + eta) / eta
            } else {
                1.0
            };
            starts[k] = match k {
                1 => 1.0 / zetan,
                2 => (half_pow_theta / zetan).max(gray),
                _ => gray,
            }
            .clamp(starts[k - 1], 1.0);
        }
        let guide_len = (4 * n as usize).clamp(1024, 1 << 24);
        let mut guide = vec![0u32; guide_len];
        let mut r = 0usize;
        for (i, g) in guide.iter_mut().enumerate() {
            let u = i as f64 / guide_len as f64;
            while r + 1 < starts.len() && starts[r + 1] <= u {
                r += 1;
            }
            *g = r as u32;
        }
        let items = (0..n).map(|k| z.item_of_rank(k) as u32).collect();
        Self {
            starts,
            guide,
            items,
        }
    }

    /// The rank for uniform draw `u` in `[0, 1)`.
    #[inline]
    pub fn rank_of(&self, u: f64) -> u64 {
        let g = ((u * self.guide.len() as f64) as usize).min(self.guide.len() - 1);
        let mut r = self.guide[g] as usize;
        while r + 1 < self.starts.len() && self.starts[r + 1] <= u {
            r += 1;
        }
        r as u64
    }

    /// The next item.
    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        u64::from(self.items[self.rank_of(rng.next_f64()) as usize])
    }
}

/// Nomad's Zipf stream over pages `[first, first + n)`.
#[derive(Clone, Debug)]
pub struct ZipfStream {
    zipf: TableZipf,
    first: u64,
    write_ratio: f64,
}

impl ZipfStream {
    /// Scrambled Zipf over `n` pages starting at `first`.
    pub fn new(first: u64, n: u64, theta: f64, write_ratio: f64) -> Self {
        Self {
            zipf: TableZipf::new(n, theta, true),
            first,
            write_ratio,
        }
    }
}

impl AccessStream for ZipfStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let page = self.first + self.zipf.next(rng);
        let write =
            self.write_ratio >= 1.0 || (self.write_ratio > 0.0 && rng.chance(self.write_ratio));
        PageAccess { page, write }
    }
}

/// An affine permutation of `0..n` (`(a * i + b) mod n` with `gcd(a, n) = 1`),
/// to pick a random-looking hot set without a table.
#[derive(Clone, Copy, Debug)]
pub struct AffinePermutation {
    n: u64,
    a: u64,
    b: u64,
}

impl AffinePermutation {
    /// A permutation of `0..n` drawn from `rng`.
    pub fn new(n: u64, rng: &mut Rng) -> Self {
        let n = n.max(1);
        let mut a = (rng.below(n) | 1) % n.max(2);
        while gcd(a, n) != 1 {
            a = (a + 1) % n.max(2);
            if a == 0 {
                a = 1;
            }
        }
        Self {
            n,
            a,
            b: rng.below(n),
        }
    }

    /// Image of `i`.
    #[inline]
    pub fn apply(&self, i: u64) -> u64 {
        ((u128::from(self.a) * u128::from(i % self.n) + u128::from(self.b)) % u128::from(self.n))
            as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// GUPS over `n` pages.
#[derive(Clone, Debug)]
pub struct GupsStream {
    n: u64,
    hot: u64,
    hot_prob: f64,
    perm: AffinePermutation,
    hot_table: Vec<u64>,
    write_ratio: f64,
}

impl GupsStream {
    /// GUPS with `hot` hot pages out of `n`.
    pub fn new(n: u64, hot: u64, hot_prob: f64, write_ratio: f64, layout_rng: &mut Rng) -> Self {
        let perm = AffinePermutation::new(n, layout_rng);
        let hot = hot.clamp(1, n.max(1));
        let hot_table = (0..hot).map(|i| perm.apply(i)).collect();
        Self {
            n: n.max(1),
            hot,
            hot_prob,
            perm,
            hot_table,
            write_ratio,
        }
    }

    /// The hot pages.
    pub fn hot_pages(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.hot).map(|i| self.perm.apply(i))
    }
}

impl AccessStream for GupsStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let page = if rng.chance(self.hot_prob) {
            self.hot_table[rng.below(self.hot) as usize]
        } else {
            rng.below(self.n)
        };
        let write =
            self.write_ratio >= 1.0 || (self.write_ratio > 0.0 && rng.chance(self.write_ratio));
        PageAccess { page, write }
    }
}

/// Gaussian-hot stream over `n` pages.
#[derive(Clone, Debug)]
pub struct GaussianHotStream {
    n: u64,
    hot_prob: f64,
    write_ratio: f64,
    /// Pages at 2^16 equally likely quantiles of the hot-set Gaussian.
    quantile_pages: Vec<u64>,
}

/// Standard normal quantile (Acklam's rational approximation, |rel err| < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383_577_518_672_69e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

impl GaussianHotStream {
    /// Hot set of `hot` pages centred in `0..n`.
    pub fn new(n: u64, hot: u64, hot_prob: f64, write_ratio: f64) -> Self {
        let n = n.max(1);
        let hot = hot.clamp(1, n) as f64;
        let centre = n as f64 / 2.0;
        let quantile_pages = (0..1u32 << 16)
            .map(|i| {
                let z = normal_quantile((f64::from(i) + 0.5) / f64::from(1u32 << 16));
                ((centre + z * hot / 4.0).max(0.0) as u64).min(n - 1)
            })
            .collect();
        Self {
            n,
            hot_prob,
            write_ratio,
            quantile_pages,
        }
    }
}

impl AccessStream for GaussianHotStream {
    #[inline]
    fn next_access(&mut self, rng: &mut Rng) -> PageAccess {
        let page = if rng.chance(self.hot_prob) {
            self.quantile_pages[(rng.next_u64() >> 48) as usize]
        } else {
            rng.below(self.n)
        };
        let write =
            self.write_ratio >= 1.0 || (self.write_ratio > 0.0 && rng.chance(self.write_ratio));
        PageAccess { page, write }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_permutation_is_a_bijection() {
        let mut rng = Rng::new(1);
        for n in [1u64, 2, 10, 97, 1024] {
            let p = AffinePermutation::new(n, &mut rng);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i) as usize;
                assert!(!seen[j]);
                seen[j] = true;
            }
        }
    }

    #[test]
    fn table_zipf_matches_the_guest_generator() {
        for (n, theta) in [(1000u64, 0.99), (50_000, 0.99), (7, 0.5), (1, 0.99)] {
            let guest = Zipf::new(n, theta, true);
            let table = TableZipf::new(n, theta, true);
            let (mut a, mut b) = (Rng::new(5), Rng::new(5));
            let draws = 200_000;
            let same = (0..draws)
                .filter(|_| guest.next(&mut a) == table.next(&mut b))
                .count();
            // Identical up to rounding exactly at a rank boundary.
            assert!(
                same as f64 >= draws as f64 * 0.9999,
                "n {n}: {same} of {draws}"
            );
        }
    }

    #[test]
    fn normal_quantiles() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959964).abs() < 1e-5);
        assert!((normal_quantile(0.01) + 2.326348).abs() < 1e-5);
    }

    #[test]
    fn gups_hot_share() {
        let mut rng = Rng::new(2);
        let mut g = GupsStream::new(1000, 100, 0.9, 1.0, &mut rng);
        let hot: std::collections::HashSet<u64> = g.hot_pages().collect();
        let n = 100_000;
        let hits = (0..n)
            .filter(|_| hot.contains(&g.next_access(&mut rng).page))
            .count();
        // 0.9 + 0.1 * 0.1 = 0.91
        assert!((hits as f64 / n as f64 - 0.91).abs() < 0.01);
    }
}
