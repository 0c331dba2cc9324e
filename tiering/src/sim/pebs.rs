//! Which accesses the CPU's PEBS can sample, for policies whose samples
//! stand for it (`TrackerRequest::hardware_samples`: Memtis, Colloid on
//! HeMem/Memtis) on a platform where it is blind to slow-tier loads
//! (`Scenario::pebs_blind_to_slow_loads`).
//!
//! On Nomad's CXL platforms an LLC miss to CXL memory is an uncore event
//! PEBS cannot capture, so Memtis there samples only retired stores and
//! loads that miss the STLB; loads that miss to local DRAM stay visible
//! (Nomad §4, baselines; /work/shared/reference/nomad-matryoshka.md §2).
//! A page whose translation stays in the STLB, which is what a hot page's
//! does, is then never sampled by its loads: the reason Nomad's Table 2
//! shows Memtis promoting almost nothing on platform A (0 read promotions
//! for the medium and large working sets).
//!
//! The STLB is modeled as a 4-way LRU over 2 MiB translations (Memtis
//! backs memory with huge pages) with [`STLB_ENTRIES`] entries, fed by the
//! modeled access stream (every thread's stream has the same distribution,
//! so one model stands for each core's STLB).

use core::sync::atomic::AtomicU64;

use tiervm_guest::abi::CACHE_MODEL_WAYS;
use tiervm_guest::emulation::CacheModel;

use crate::policy::TierId;

/// Second-level TLB entries, shared by 4 KiB and 2 MiB translations
/// (Intel Golden Cove, Nomad platform A's Sapphire Rapids: 2048).
pub const STLB_ENTRIES: u64 = 2048;
/// Bytes one translation covers (a transparent huge page).
pub const TRANSLATION_BYTES: f64 = 2.0 * 1024.0 * 1024.0;
/// Bytes of a real page.
const PAGE_BYTES: f64 = 4096.0;

/// The STLB model that decides which slow-tier loads PEBS sees.
#[derive(Debug)]
pub struct PebsFilter {
    sets: Vec<AtomicU64>,
    /// Modeled pages one translation covers (1 when a modeled page is at
    /// least a huge page).
    pages_per_entry: u64,
}

impl PebsFilter {
    /// A filter for modeled pages of `scale` real pages each: the STLB
    /// holds [`STLB_ENTRIES`] translations of [`TRANSLATION_BYTES`], i.e.
    /// that many modeled pages' worth of them.
    pub fn new(scale: f64) -> Self {
        let modeled = scale.max(1.0) * PAGE_BYTES;
        let pages_per_entry = (TRANSLATION_BYTES / modeled).floor().max(1.0) as u64;
        // A modeled page larger than a translation takes several entries.
        let per_page = (modeled / TRANSLATION_BYTES).max(1.0);
        let entries = ((STLB_ENTRIES as f64 / per_page) as u64).max(CACHE_MODEL_WAYS);
        let sets = (entries / CACHE_MODEL_WAYS).next_power_of_two();
        Self {
            sets: (0..sets).map(|_| AtomicU64::new(0)).collect(),
            pages_per_entry,
        }
    }

    /// Whether PEBS can sample this access (made to modeled page `page`,
    /// served by `tier`): stores and the fastest tier's loads always; a
    /// slower tier's load only when its translation missed the STLB. Every
    /// access updates the STLB model.
    #[inline]
    pub fn sees(&self, page: u64, tier: TierId, write: bool) -> bool {
        let hit = CacheModel::new(&self.sets).is_some_and(|m| m.touch(page / self.pages_per_entry));
        write || tier == 0 || !hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_slow_loads_are_invisible_and_cold_ones_and_stores_are_seen() {
        // Scale 256: 1 MiB modeled pages, two per translation, 4096 pages
        // of reach.
        let f = PebsFilter::new(256.0);
        assert_eq!(f.pages_per_entry, 2);
        // A hot set of 1000 pages on the slow tier, touched over and over:
        // after the first touch of each translation, invisible.
        let mut seen = 0;
        for round in 0..10 {
            for p in 0..1000u64 {
                let s = f.sees(p, 1, false);
                if round > 0 {
                    seen += u32::from(s);
                }
            }
        }
        assert_eq!(seen, 0, "hot slow-tier loads hit the STLB");
        // Their stores, and fast-tier loads, are seen.
        assert!(f.sees(3, 1, true));
        assert!(f.sees(3, 0, false));
        // A scan over 100x the reach misses the STLB on every translation.
        let mut missed = 0;
        for p in (0..409_600u64).step_by(2) {
            missed += u32::from(f.sees(p, 1, false));
        }
        assert!(missed > 200_000, "{missed}");
    }

    #[test]
    fn modeled_pages_larger_than_a_translation_take_several_entries() {
        // Scale 8192: 32 MiB modeled pages, 16 translations each: 128
        // modeled pages of reach.
        let f = PebsFilter::new(8192.0);
        assert_eq!(f.pages_per_entry, 1);
        assert_eq!(f.sets.len() as u64 * CACHE_MODEL_WAYS, 128);
    }
}
