//! Shadows (Nomad's non-exclusive tiering): when a page is promoted with
//! TPM, its old copy stays in the page's shadow slot, counted on the tier it
//! came from, so that demoting the page again while it is clean is a remap
//! instead of a copy. Shadows are the first thing given up under pressure:
//! oldest first, whenever a tier runs short of free pages.

use std::sync::atomic::Ordering;

use super::page_map::{self, SHADOW, SHADOW_BITS};
use super::TieredMemory;
use crate::vocab::TierId;

impl TieredMemory {
    /// Frees the shadow of an owned page (into its tier's pool cache, or
    /// back to the kernel). The caller clears [`SHADOW_BITS`] when it
    /// releases the page.
    pub(crate) fn free_shadow_owned(&self, page: usize) {
        if let Some(t) = page_map::shadow_tier_of(self.pages.load(page)) {
            self.dispose(t, &[self.shadow_addr(page)]);
        }
    }

    /// Reclaims shadows on `tier`, oldest first, until the tier has at least
    /// `want_free` free pages or no shadow of it is left. Returns the number
    /// reclaimed.
    pub fn reclaim_shadows(&self, tier: TierId, want_free: usize) -> usize {
        let Some(account) = self.tiers.get(usize::from(tier)) else {
            return 0;
        };
        if account.shadows() == 0 {
            return 0;
        }
        let mut reclaimed = 0;
        // Shadows of pages owned by a mover (possibly the caller itself) and
        // shadows of other tiers are passed over; stop after one full pass
        // without progress.
        let mut passed_in_a_row = 0usize;
        while (account.free() as usize) < want_free && account.shadows() > 0 {
            let (entry, queued) = self.pop_shadow_fifo();
            let Some((page, generation)) = entry else {
                break;
            };
            let page = page as usize;
            let w = self.pages.load(page);
            if w & SHADOW == 0 || page_map::generation_of(w) != generation {
                continue; // stale entry: the shadow was freed or replaced
            }
            if page_map::shadow_tier_of(w) != Some(tier)
                || self.pages.try_acquire(page, true).is_none()
            {
                self.push_shadow_fifo((page as u32, generation));
                passed_in_a_row += 1;
                if passed_in_a_row > queued {
                    break;
                }
                continue;
            }
            passed_in_a_row = 0;
            let w = self.pages.load(page);
            if page_map::shadow_tier_of(w) == Some(tier) && page_map::generation_of(w) == generation
            {
                self.free_shadow_owned(page);
                self.release_page(page, 0, SHADOW_BITS);
                self.counters
                    .shadow_reclaims
                    .fetch_add(1, Ordering::Relaxed);
                reclaimed += 1;
                continue;
            }
            self.release_page(page, 0, 0);
        }
        reclaimed
    }
}
