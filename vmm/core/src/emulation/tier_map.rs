//! The tier map the guest charges by: the memory layer's placement
//! observer writes each page's tier (2 bits) into the emulation region
//! before the placement becomes visible to the guest, and counts the
//! migration traffic each tier serves for the loaded-latency model.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tiering::mem::{PlacementObserver, PAGE_SIZE};
use tiering::vocab::TierId;
use tiervm_guest::abi::{tier_map_get, tier_map_set, EMULATION_MAX_TIERS, TIER_MAP_PAGES_PER_WORD};

use super::region::EmulationRegion;

/// The tier map of one VM (a [`PlacementObserver`]).
#[derive(Debug)]
pub struct TierMap {
    region: Arc<EmulationRegion>,
    /// Pages placed at least once (host-only: the guest's map says 0 for
    /// "never placed" and for "fast").
    placed: Vec<AtomicU64>,
    /// Bytes copied into or out of each tier by placement changes.
    moved_bytes: [AtomicU64; EMULATION_MAX_TIERS],
    /// Placement changes published (pages).
    updates: AtomicU64,
}

impl TierMap {
    /// The map in `region` (all pages tier 0 until placed).
    pub fn new(region: Arc<EmulationRegion>) -> Self {
        let pages = region.layout().ram_pages as usize;
        Self {
            region,
            placed: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            moved_bytes: Default::default(),
            updates: AtomicU64::new(0),
        }
    }

    /// The tier the map gives page `page`.
    pub fn tier(&self, page: usize) -> u64 {
        let map = self.region.tier_map();
        map.get(page / TIER_MAP_PAGES_PER_WORD as usize)
            .map_or(0, |w| tier_map_get(w.load(Ordering::Acquire), page as u64))
    }

    /// Bytes of migration traffic tier `tier` served so far (a placement
    /// change of a placed page counts a page on both tiers; a rollback
    /// counts again, a remap without a copy counts too: an upper bound).
    pub fn moved_bytes(&self, tier: usize) -> u64 {
        self.moved_bytes
            .get(tier)
            .map_or(0, |b| b.load(Ordering::Relaxed))
    }

    /// Page placements published.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Sets pages `[p, stop)`, all inside one map word, to `tier`; counts
    /// the traffic of those that were placed elsewhere before.
    fn set_word(&self, p: usize, stop: usize, tier: u64) {
        let map = self.region.tier_map();
        let Some(word) = map.get(p / TIER_MAP_PAGES_PER_WORD as usize) else {
            return;
        };
        let mut old = word.load(Ordering::Relaxed);
        loop {
            let new = (p..stop).fold(old, |w, q| tier_map_set(w, q as u64, tier));
            match word.compare_exchange_weak(old, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(cur) => old = cur,
            }
        }
        // [p, stop) lies in one 32-page map word, so in one 64-page word here.
        let bits = ((1u64 << (stop - p)) - 1) << (p % 64);
        let before = self.placed[p / 64].fetch_or(bits, Ordering::Relaxed);
        // A page placed before and now on another tier was copied: count
        // it on its old tier and on the new one.
        for q in (p..stop).filter(|&q| before & (1 << (q % 64)) != 0) {
            let from = tier_map_get(old, q as u64);
            if from != tier {
                self.moved_bytes[from as usize].fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
                self.moved_bytes[tier as usize].fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
            }
        }
        self.updates.fetch_add((stop - p) as u64, Ordering::Relaxed);
    }
}

impl PlacementObserver for TierMap {
    fn placed(&self, first: usize, pages: usize, tier: TierId) {
        let tier = u64::from(tier).min(EMULATION_MAX_TIERS as u64 - 1);
        let end = first
            .saturating_add(pages)
            .min(self.region.layout().ram_pages as usize);
        let per = TIER_MAP_PAGES_PER_WORD as usize;
        let mut p = first;
        while p < end {
            let stop = ((p / per + 1) * per).min(end);
            self.set_word(p, stop, tier);
            p = stop;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulation::config::EmulationConfig;
    use crate::emulation::region::RegionLayout;

    fn map(pages: u64) -> TierMap {
        let cfg = EmulationConfig::parse("llc=0").unwrap();
        let l = RegionLayout::new(pages * 4096, 1, 0, 64 << 20, 0);
        TierMap::new(Arc::new(EmulationRegion::new(l, &cfg, 2).unwrap()))
    }

    #[test]
    fn placements_land_in_the_map_and_moves_count_traffic() {
        let m = map(4096);
        m.placed(10, 100, 1);
        assert!((10..110).all(|p| m.tier(p) == 1));
        assert_eq!((m.tier(9), m.tier(110)), (0, 0));
        assert_eq!(
            m.moved_bytes(0) + m.moved_bytes(1),
            0,
            "first placements move nothing"
        );
        m.placed(50, 20, 0);
        assert!((50..70).all(|p| m.tier(p) == 0));
        assert_eq!(m.tier(49), 1);
        assert_eq!(m.moved_bytes(0), 20 * 4096);
        assert_eq!(m.moved_bytes(1), 20 * 4096);
        // Out of range: clamped, no panic.
        m.placed(4090, 100, 1);
        assert_eq!(m.tier(4095), 1);
        assert_eq!(m.updates(), 100 + 20 + 6);
    }

    #[test]
    fn concurrent_observers_lose_no_update() {
        let m = Arc::new(map(64 * 32));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    // Thread t owns every page p with p % 4 == t: all share words.
                    for round in 0..50u8 {
                        for p in (t..64 * 32).step_by(4) {
                            m.placed(p, 1, (round + t as u8) % 2);
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        for p in 0..64 * 32 {
            let t = (p % 4) as u64;
            assert_eq!(m.tier(p), (49 + t) % 2, "page {p}");
        }
    }
}
