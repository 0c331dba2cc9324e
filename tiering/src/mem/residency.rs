//! Resident memory as the kernel sees it: which bytes of each area are
//! really backed by host pages (`PAGEMAP_SCAN`, falling back to `mincore`),
//! and which of those are mapped by huge pages. Presence comes from the
//! kernel; the page map only says which tier a present page belongs to.

use serde::{Deserialize, Serialize};

use super::page_map;
use super::TieredMemory;
use crate::sys::PAGE_SIZE;

/// One tier's resident memory, measured from the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierResidency {
    /// Host bytes backing this tier's pages (guest pages, shadows, pages in
    /// flight, pool cache).
    pub resident_bytes: u64,
    /// Of those, bytes mapped by 2 MiB huge pages.
    pub huge_bytes: u64,
}

/// The whole VM's resident memory, measured from the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residency {
    /// Per tier, fastest first.
    pub tiers: Vec<TierResidency>,
    /// Present bytes of guest RAM.
    pub guest_bytes: u64,
    /// Of those, bytes mapped by huge pages.
    pub guest_huge_bytes: u64,
    /// Present bytes of every area (guest RAM, pools, shadows, parking).
    pub total_bytes: u64,
}

impl TieredMemory {
    /// Measures resident memory per tier (see the module docs). Costs one
    /// page-table walk of the present parts of the areas.
    pub fn residency(&self) -> std::io::Result<Residency> {
        let mut r = Residency {
            tiers: vec![TierResidency::default(); self.tier_count()],
            ..Residency::default()
        };
        let area = self.layout.area_pages * PAGE_SIZE;
        // Guest RAM: each present page by its tier (a huge mapping is one
        // folio, all of one tier: look at its first page).
        let g = self.layout.guest;
        let guest = self.scanner.scan(g, g + area, |s, e, huge| {
            self.attribute(&mut r.tiers, g, s, e, huge, page_map::tier_of);
        })?;
        r.guest_bytes = guest.present;
        r.guest_huge_bytes = guest.huge;
        // Shadow slots: shadows by their tier; an old page in flight by the
        // page's tier.
        let sh = self.layout.shadow;
        let shadows = self.scanner.scan(sh, sh + area, |s, e, huge| {
            self.attribute(&mut r.tiers, sh, s, e, huge, |w| {
                page_map::shadow_tier_of(w).or_else(|| page_map::tier_of(w))
            });
        })?;
        let pk = self.layout.park;
        let parked = self.scanner.scan(pk, pk + area, |s, e, huge| {
            self.attribute(&mut r.tiers, pk, s, e, huge, page_map::tier_of);
        })?;
        let mut pools = 0;
        for (t, &base) in self.layout.pools.iter().enumerate() {
            let len = self.layout.pool_slots[t] * PAGE_SIZE;
            let p = self.scanner.scan(base, base + len, |_, _, _| {})?;
            r.tiers[t].resident_bytes += p.present;
            r.tiers[t].huge_bytes += p.huge;
            pools += p.present;
        }
        r.total_bytes = guest.present + shadows.present + parked.present + pools;
        Ok(r)
    }

    /// Adds the present range `[s, e)` of the area at `base` (indexed by
    /// guest page) to the tier `tier_of_word` names for each page.
    fn attribute(
        &self,
        tiers: &mut [TierResidency],
        base: usize,
        s: usize,
        e: usize,
        huge: bool,
        tier_of_word: impl Fn(u64) -> Option<crate::vocab::TierId>,
    ) {
        let step = if huge { 512 } else { 1 };
        let mut p = (s - base) / PAGE_SIZE;
        let end = ((e - base) / PAGE_SIZE).min(self.guest_pages);
        while p < end {
            let n = step.min(end - p);
            if let Some(t) = tier_of_word(self.pages.load(p)) {
                if let Some(tr) = tiers.get_mut(usize::from(t)) {
                    let bytes = (n * PAGE_SIZE) as u64;
                    tr.resident_bytes += bytes;
                    if huge {
                        tr.huge_bytes += bytes;
                    }
                }
            }
            p += n;
        }
    }
}
