//! Hotness bookkeeping shared by several policies: per-page sample counts
//! with a log2 histogram and cooling (Memtis, Colloid's base tracker), and a
//! CLOCK hand that finds cold pages in a tier (Linux's LRU aging, as kswapd
//! uses it for TPP and Nomad demotion).

use super::types::{MemoryView, TierId};

/// Number of histogram bins: bin 0 = count 0, bin b = counts in [2^(b-1), 2^b).
pub const BINS: usize = 17;

/// The histogram bin of an access count.
#[inline]
pub fn bin_of(count: u16) -> usize {
    if count == 0 {
        0
    } else {
        (16 - count.leading_zeros()) as usize
    }
}

/// Per-page access counts from samples, with a log2 histogram of the counts.
#[derive(Clone, Debug)]
pub struct SampleCounts {
    counts: Vec<u16>,
    hist: [u64; BINS],
    total: u64,
}

impl SampleCounts {
    /// Counts for `pages` pages, all zero.
    pub fn new(pages: u64) -> Self {
        let mut hist = [0u64; BINS];
        hist[0] = pages;
        Self {
            counts: vec![0; pages as usize],
            hist,
            total: 0,
        }
    }

    /// Records one sample of `page` (ignored if out of range).
    #[inline]
    pub fn add(&mut self, page: u64) {
        let Some(c) = self.counts.get_mut(page as usize) else {
            return;
        };
        let old = *c;
        let new = old.saturating_add(1);
        *c = new;
        self.hist[bin_of(old)] -= 1;
        self.hist[bin_of(new)] += 1;
        self.total += u64::from(new - old);
    }

    /// Count of `page`.
    #[inline]
    pub fn count(&self, page: u64) -> u16 {
        self.counts.get(page as usize).copied().unwrap_or(0)
    }

    /// Sum of all counts.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Halves every count (Memtis/HeMem cooling) and rebuilds the histogram.
    pub fn cool(&mut self) {
        self.hist = [0; BINS];
        self.total = 0;
        for c in &mut self.counts {
            *c >>= 1;
            self.hist[bin_of(*c)] += 1;
            self.total += u64::from(*c);
        }
    }

    /// Pages per histogram bin.
    pub fn histogram(&self) -> &[u64; BINS] {
        &self.hist
    }

    /// Memtis's hot threshold: the lowest bin `b >= 1` such that all pages
    /// in bins `>= b` fit in `capacity` pages.
    pub fn hot_threshold_bin(&self, capacity: u64) -> usize {
        let mut acc = 0u64;
        let mut th = BINS;
        for b in (1..BINS).rev() {
            acc += self.hist[b];
            if acc > capacity {
                break;
            }
            th = b;
        }
        th.max(1)
    }

    /// Sets a page's count (used when importing state).
    pub fn set(&mut self, page: u64, count: u16) {
        let Some(c) = self.counts.get_mut(page as usize) else {
            return;
        };
        let old = *c;
        *c = count;
        self.hist[bin_of(old)] -= 1;
        self.hist[bin_of(count)] += 1;
        self.total = self.total - u64::from(old) + u64::from(count);
    }

    /// Number of pages tracked.
    pub fn pages(&self) -> u64 {
        self.counts.len() as u64
    }
}

/// A CLOCK hand over guest pages, to find cold pages in one tier.
#[derive(Clone, Debug, Default)]
pub struct ClockHand {
    pos: u64,
}

impl ClockHand {
    /// Advances over at most `max_scan` pages and returns up to `want` pages
    /// in `tier` for which `is_cold(page, accessed)` holds, where `accessed`
    /// is the page's accessed bit (read and cleared): a second-chance scan.
    pub fn find(
        &mut self,
        view: &mut dyn MemoryView,
        tier: TierId,
        want: u64,
        max_scan: u64,
        mut is_cold: impl FnMut(u64, bool) -> bool,
    ) -> Vec<u64> {
        let n = view.pages();
        let mut out = Vec::new();
        if n == 0 || want == 0 {
            return out;
        }
        let mut scanned = 0u64;
        while scanned < max_scan.min(n) && (out.len() as u64) < want {
            let p = self.pos % n;
            self.pos = (p + 1) % n;
            scanned += 1;
            if view.tier_of(p) != tier {
                continue;
            }
            let accessed = view.test_and_clear_accessed(p);
            if is_cold(p, accessed) {
                out.push(p);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_threshold_and_cooling() {
        let mut c = SampleCounts::new(10);
        for _ in 0..8 {
            c.add(0);
        }
        for _ in 0..3 {
            c.add(1);
        }
        c.add(2);
        assert_eq!(bin_of(8), 4);
        assert_eq!(c.histogram()[4], 1);
        assert_eq!(c.total(), 12);
        // Capacity 1: only page 0 (bin 4) fits.
        assert_eq!(
            c.hot_threshold_bin(1),
            3,
            "bin 3 is empty: only page 0 is at or above it"
        );
        // Capacity 2: pages 0 and 1 (bins 4 and 2).
        assert_eq!(c.hot_threshold_bin(2), 2);
        assert_eq!(c.hot_threshold_bin(100), 1);
        c.cool();
        assert_eq!((c.count(0), c.count(1), c.count(2)), (4, 1, 0));
        assert_eq!(c.total(), 5);
        assert_eq!(c.histogram()[0], 8);
        // Imported counts (`set`) keep the histogram and the total.
        c.set(2, 5);
        c.set(0, 1);
        assert_eq!((c.count(0), c.count(2)), (1, 5));
        assert_eq!(c.total(), 7);
        let h = c.histogram();
        assert_eq!((h[0], h[1], h[2], h[3]), (7, 2, 0, 1));
    }
}
