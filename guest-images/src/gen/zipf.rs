//! YCSB's Zipfian generator (Gray et al., "Quickly generating billion-record
//! synthetic databases", SIGMOD'94), optionally scrambled like YCSB's
//! `ScrambledZipfianGenerator` so the hot items are spread over the key space.
//!
//! `zeta(n, theta)` is summed exactly for the first [`EXACT_TERMS`] terms and
//! completed with the Euler-Maclaurin tail for large `n`, so construction
//! stays O(1)-ish even for billions of items (relative error < 1e-9 for
//! theta in (0, 1)).

use super::rng::Rng;

/// YCSB's default skew.
pub const DEFAULT_THETA: f64 = 0.99;
/// Number of zeta terms summed exactly before the analytic tail.
pub const EXACT_TERMS: u64 = 4096;

/// Sum_{i=1..n} 1/i^theta.
pub fn zeta(n: u64, theta: f64) -> f64 {
    let m = n.min(EXACT_TERMS);
    let mut sum = 0.0;
    for i in 1..=m {
        sum += 1.0 / libm::pow(i as f64, theta);
    }
    if n > m {
        // Euler-Maclaurin: sum_{i=m+1}^{n} f(i) ~ int_m^n f + (f(n) - f(m))/2 + (f'(n) - f'(m))/12
        let f = |x: f64| libm::pow(x, -theta);
        let df = |x: f64| -theta * libm::pow(x, -theta - 1.0);
        let (a, b) = (m as f64, n as f64);
        let integral = if (theta - 1.0).abs() < 1e-12 {
            libm::log(b) - libm::log(a)
        } else {
            (libm::pow(b, 1.0 - theta) - libm::pow(a, 1.0 - theta)) / (1.0 - theta)
        };
        sum += integral + (f(b) - f(a)) / 2.0 + (df(b) - df(a)) / 12.0;
    }
    sum
}

/// FNV-1a over the 8 bytes of `x`: YCSB's scrambling hash.
#[inline]
pub fn fnv1a64(x: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for i in 0..8 {
        h ^= (x >> (i * 8)) & 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// Draws item ranks in `0..n` with P(rank k) proportional to 1/(k+1)^theta.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
    scrambled: bool,
}

impl Zipf {
    /// A generator over `n` items (`n >= 1`; 0 is treated as 1) with skew
    /// `theta` in `[0, 1)` (values outside are clamped to [0, 0.9999]).
    /// `scrambled` spreads the hot ranks over the item space with FNV.
    pub fn new(n: u64, theta: f64, scrambled: bool) -> Self {
        let n = n.max(1);
        let theta = if theta.is_nan() {
            DEFAULT_THETA
        } else {
            theta.clamp(0.0, 0.9999)
        };
        let zetan = zeta(n, theta);
        let zeta2 = zeta(2.min(n), theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = if n > 1 {
            (1.0 - libm::pow(2.0 / n as f64, 1.0 - theta)) / (1.0 - zeta2 / zetan)
        } else {
            0.0
        };
        Self {
            n,
            theta,
            alpha,
            zetan,
            eta,
            half_pow_theta: 1.0 + libm::pow(0.5, theta),
            scrambled,
        }
    }

    /// Number of items.
    pub fn items(&self) -> u64 {
        self.n
    }

    /// The skew in use.
    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// The rank (0 = hottest) of the next draw, before scrambling.
    #[inline]
    pub fn next_rank(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.half_pow_theta {
            return 1.min(self.n - 1);
        }
        let v = (self.n as f64) * libm::pow(self.eta * u - self.eta + 1.0, self.alpha);
        (v as u64).min(self.n - 1)
    }

    /// The item of rank `rank`: the identity, or FNV-scrambled.
    #[inline]
    pub fn item_of_rank(&self, rank: u64) -> u64 {
        if self.scrambled {
            fnv1a64(rank) % self.n
        } else {
            rank
        }
    }

    /// The next item in `0..n`.
    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        self.item_of_rank(self.next_rank(rng))
    }

    /// The probability of the item of rank `rank` (for tests and models).
    pub fn rank_probability(&self, rank: u64) -> f64 {
        1.0 / libm::pow((rank + 1) as f64, self.theta) / self.zetan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeta_tail_matches_exact_sum() {
        for &theta in &[0.5, 0.9, 0.99] {
            let n = 200_000u64;
            let exact: f64 = (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum();
            let approx = zeta(n, theta);
            assert!(
                ((exact - approx) / exact).abs() < 1e-9,
                "theta {theta}: {exact} vs {approx}"
            );
        }
    }

    #[test]
    fn rank_frequencies_follow_the_law() {
        // Gray's method is exact for ranks 0 and 1 and approximate beyond, so
        // check those two and the cumulative mass of the hottest 10% of items.
        let z = Zipf::new(1000, 0.99, false);
        let mut rng = Rng::new(3);
        let (mut r0, mut r1, mut top) = (0u32, 0u32, 0u32);
        let draws = 400_000;
        for _ in 0..draws {
            let r = z.next_rank(&mut rng);
            assert!(r < 1000);
            r0 += u32::from(r == 0);
            r1 += u32::from(r == 1);
            top += u32::from(r < 100);
        }
        let check = |got: u32, p: f64, tol: f64, what: &str| {
            let expected = p * draws as f64;
            let rel = (got as f64 - expected).abs() / expected;
            assert!(rel < tol, "{what}: {got} vs {expected:.0}");
        };
        check(r0, z.rank_probability(0), 0.03, "rank 0");
        check(r1, z.rank_probability(1), 0.05, "rank 1");
        let top_p: f64 = (0..100).map(|k| z.rank_probability(k)).sum();
        check(top, top_p, 0.05, "top 10%");
    }

    #[test]
    fn scrambled_stays_in_range_and_spreads_hot_items() {
        let z = Zipf::new(1 << 20, 0.99, true);
        let mut rng = Rng::new(9);
        let mut max = 0;
        for _ in 0..10_000 {
            max = max.max(z.next(&mut rng));
        }
        assert!(max < 1 << 20);
        // The hottest rank is not item 0 once scrambled.
        assert_ne!(z.item_of_rank(0), 0);
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let mut rng = Rng::new(0);
        for z in [
            Zipf::new(0, 0.99, false),
            Zipf::new(1, f64::NAN, true),
            Zipf::new(2, 5.0, false),
        ] {
            for _ in 0..100 {
                assert!(z.next(&mut rng) < z.items());
            }
        }
    }
}
