//! Which accesses the CPU's PEBS can sample, for policies whose samples
//! stand for it (`TrackerRequest::hardware_samples`: Memtis, Colloid on
//! HeMem/Memtis) on a platform where it is blind to slow-tier loads
//! (`Scenario::pebs_blind_to_slow_loads`).
//!
//! The events are those the Memtis Nomad ran opens (Nomad's artifact,
//! github.com/lingfenghsiang/Nomad, `src/linux-5.15.19/mm/htmm_sampler.c`
//! `get_pebs_event`, with `htmm_cxl_mode` on, which its README says to use
//! on every machine; the constants are in `include/linux/htmm.h`):
//!
//! 1. `DRAM_LLC_LOAD_MISS` 0x1d3 (`MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM`):
//!    loads served by local DRAM, the fast tier. Visible.
//! 2. `REMOTE_DRAM_LLC_LOAD_MISS` 0x2d3 and `NVM_LLC_LOAD_MISS` 0x80d1
//!    (remote DRAM, Optane): neither counts a load served by CXL memory,
//!    which is an uncore event PEBS cannot capture (Nomad §4, baselines).
//!    Slow-tier loads are invisible.
//! 3. `ALL_STORES` 0x82d0: every store, whichever tier. Visible.
//!
//! `STLB_MISS_LOADS` (0x11d0) and `STLB_MISS_STORES` (0x12d0) are defined
//! but never opened: `get_pebs_event` maps `TLB_MISS_LOADS` and
//! `TLB_MISS_STORES` to `N_HTMMEVENTS`, the "no event" value, in Nomad's
//! copy and in Memtis' own artifact (github.com/cosmoss-jigu/memtis) alike.
//! Nomad's text says Memtis on A and B "relies solely on TLB misses and
//! retired store instructions"; the code it ran samples no TLB miss, so a
//! CXL page's loads are never sampled, hot or cold. (This model used to
//! sample CXL loads that missed a modeled STLB; with 2 MiB translations
//! over Nomad's 10-27 GB working sets most of them did, and Memtis promoted
//! 0.8-3.1M pages on read-only runs where Nomad's Table 2 has 15.9K, 0
//! and 0.)

use crate::policy::TierId;

/// Whether PEBS on a CXL platform can sample an access served by `tier`
/// (0 = the fastest): a store always, a load only from the fastest tier.
#[inline]
pub fn sees(tier: TierId, write: bool) -> bool {
    write || tier == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_tier_loads_are_never_seen_stores_and_fast_loads_are() {
        // No TLB-miss event is open: a slow-tier load is invisible whether
        // its page is hot or cold (the STLB model this replaced saw cold
        // ones).
        assert!(!sees(1, false));
        assert!(!sees(3, false));
        // LOCAL_DRAM loads and ALL_STORES.
        assert!(sees(0, false));
        assert!(sees(0, true));
        assert!(sees(1, true));
    }
}
