//! Pool operations on the mapping: reserving staging pages on a tier,
//! giving them back, and disposing of pages nobody needs any more (into the
//! pool's cache, or back to the kernel).
//!
//! Where the outcome of a failed move is uncertain, the slot bookkeeping is
//! rebuilt from what the kernel says is resident (`mincore`), so a failure
//! path cannot leave a page in a slot the bookkeeping calls a hole.

use std::sync::atomic::Ordering;

use super::backing::{Staging, TieredMemory};
use super::pool::{Holds, Slot, CHUNK_SLOTS};
use crate::sys::{self, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::vocab::TierId;

/// Attempts at finding a real hole before a disposal falls back to
/// discarding the page.
const HOLE_RETRIES: usize = 4;

impl TieredMemory {
    /// Reserves pool slots on `tier` for `count` pages: a whole huge chunk
    /// when `count` is a chunk, else page slots (`prefer`: which kind of slot
    /// to use first). `None` when the pool has no room (an accounting bug:
    /// pools are sized for every page a tier can take).
    pub(crate) fn reserve_staging(
        &self,
        tier: TierId,
        count: usize,
        prefer: Holds,
    ) -> Option<Staging> {
        let mut pool = self.pool(tier);
        if count == CHUNK_SLOTS && self.huge_pages {
            if let Some((slot, holds)) = pool.reserve_chunk(prefer) {
                return Some(Staging::Chunk(slot, holds));
            }
        }
        pool.reserve_pages(count, prefer).map(Staging::Pages)
    }

    /// Gives staging slots back, all holding `holds` now. `still_huge`: a
    /// chunk only ever held a whole huge page (its page table is empty).
    pub(crate) fn release_staging(
        &self,
        tier: TierId,
        staging: &Staging,
        holds: Holds,
        still_huge: bool,
    ) {
        let mut pool = self.pool(tier);
        match staging {
            Staging::Chunk(slot, _) => pool.release_chunk(*slot, holds, still_huge),
            Staging::Pages(v) => {
                let slots: Vec<Slot> = v.iter().map(|x| x.0).collect();
                pool.release_pages(&slots, holds);
            }
        }
    }

    /// Gives staging slots back after a failure, each as what the kernel
    /// says it holds now.
    pub(crate) fn release_staging_checked(&self, tier: TierId, staging: &Staging) {
        let slots: Vec<Slot> = match staging {
            Staging::Chunk(first, _) => {
                self.release_chunk_checked(tier, *first);
                return;
            }
            Staging::Pages(v) => v.iter().map(|x| x.0).collect(),
        };
        let mut cached = Vec::new();
        let mut holes = Vec::new();
        for s in slots {
            // Unknown residency counts as cached: a cached slot that is
            // empty costs a fresh page later, a hole that is not empty
            // would cost a failed move.
            if sys::resident(self.slot_addr(tier, s), 1)
                .map(|r| r[0])
                .unwrap_or(true)
            {
                cached.push(s);
            } else {
                holes.push(s);
            }
        }
        let mut pool = self.pool(tier);
        pool.release_pages(&cached, Holds::Cached);
        pool.release_pages(&holes, Holds::Hole);
    }

    /// Gives a huge chunk back after a failure. A chunk is used whole, so
    /// only a full one can be given back as it is (a cached page); any
    /// other is emptied and given back as a hole: its slots cannot be
    /// marked one by one, and a hole holding pages would fail every move
    /// into it (the callers have moved back what they needed). 4 KiB pages
    /// may have gone through it either way, so it is tainted.
    fn release_chunk_checked(&self, tier: TierId, first: Slot) {
        let a = self.slot_addr(tier, first);
        let holds = match sys::resident(a, CHUNK_SLOTS) {
            Ok(r) if r.iter().all(|&x| x) => Holds::Cached,
            // Some pages, or none (then the discard costs a system call on a
            // failure path, and keeps one way out).
            _ => {
                if let Err(e) = self.discard_retrying(a, HUGE_PAGE_SIZE) {
                    // A later move into it fails and comes back here.
                    tracing::error!("emptying a pool chunk after a failed move: {e}");
                }
                Holds::Hole
            }
        };
        self.pool(tier).release_chunk(first, holds, false);
    }

    /// Best effort: moves each (dst, src) pair whose source page is present
    /// (a rollback step; the callers check each page's outcome after).
    pub(crate) fn move_pairs_present(&self, pairs: &[(usize, usize)]) {
        for &(dst, src) in pairs {
            if sys::resident(src, 1).map(|r| r[0]).unwrap_or(false) {
                let _ = self.move_retrying(dst, src, PAGE_SIZE);
            }
        }
    }

    /// Disposes of pages of `tier` that nobody needs (freed shadows, the old
    /// copy of a migrated page), each at the given address of a MISSING
    /// area: into the tier's pool cache while it has room (they become
    /// staging pages later, saving an allocation), else back to the kernel
    /// (`MADV_DONTNEED`, coalesced into ranges). A 2 MiB aligned run given
    /// as one huge address moves into a huge chunk when one is free.
    pub(crate) fn dispose(&self, tier: TierId, addrs: &[usize]) {
        let mut discard = Vec::new();
        for &a in addrs {
            if !self.cache_one(tier, a) {
                discard.push(a);
            }
        }
        self.discard_coalesced(&discard);
    }

    /// Disposes of a whole 2 MiB run at `addr` (2 MiB aligned).
    pub(crate) fn dispose_huge(&self, tier: TierId, addr: usize) {
        let room = {
            let pool = self.pool(tier);
            pool.cached_pages() + CHUNK_SLOTS <= self.pool_cache_pages
        };
        if room {
            let chunk = self.pool(tier).reserve_chunk(Holds::Hole);
            if let Some((slot, Holds::Hole)) = chunk {
                let dst = self.slot_addr(tier, slot);
                match self.move_range(dst, addr, HUGE_PAGE_SIZE, false) {
                    Ok(()) => {
                        self.pool(tier).release_chunk(slot, Holds::Cached, true);
                        return;
                    }
                    Err(e) => {
                        if e.moved > 0 {
                            // Part moved: the chunk holds pages now; the rest
                            // is discarded below.
                            self.counters
                                .rollback_errors
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        self.release_staging_checked(tier, &Staging::Chunk(slot, Holds::Hole));
                    }
                }
            } else if let Some((slot, holds)) = chunk {
                self.pool(tier).release_chunk(slot, holds, true);
            }
        }
        if let Err(e) = self.discard_retrying(addr, HUGE_PAGE_SIZE) {
            // The run stays where it is; a later move into that slot finds it
            // and heals (discards it first).
            tracing::error!("discarding a 2 MiB run at {addr:#x}: {e}");
        }
    }

    /// Moves one page into a pool hole as a cached page. False: no room in
    /// the cache, or no real hole found (the caller discards the page).
    fn cache_one(&self, tier: TierId, addr: usize) -> bool {
        for _ in 0..HOLE_RETRIES {
            let slot = {
                let mut pool = self.pool(tier);
                if pool.cached_pages() >= self.pool_cache_pages {
                    return false;
                }
                match pool.reserve_pages(1, Holds::Hole) {
                    Some(v) if v[0].1 == Holds::Hole => v[0].0,
                    Some(v) => {
                        pool.release_pages(&[v[0].0], v[0].1);
                        return false;
                    }
                    None => return false,
                }
            };
            match self.move_range(self.slot_addr(tier, slot), addr, PAGE_SIZE, false) {
                Ok(()) => {
                    self.pool(tier).release_pages(&[slot], Holds::Cached);
                    return true;
                }
                Err(e) if e.dst_not_a_hole() => {
                    // The bookkeeping called an occupied slot a hole: heal it
                    // and try another.
                    self.pool(tier).found_occupied(slot);
                    self.counters.slot_heals.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.pool(tier).release_pages(&[slot], Holds::Hole);
                    if !e.src_missing() {
                        tracing::warn!("caching a freed page: {e}");
                    }
                    return false;
                }
            }
        }
        false
    }

    /// `MADV_DONTNEED` of a range, retried a few times: a page left behind
    /// would sit in a slot the bookkeeping calls empty (a later move into it
    /// heals it, but until then it is memory nobody accounts).
    fn discard_retrying(&self, addr: usize, len: usize) -> std::io::Result<()> {
        let mut last = Ok(());
        for _ in 0..4 {
            last = self
                .inject
                .io(crate::inject::FaultPoint::Discard)
                .and_then(|()| self.discard(addr, len));
            if last.is_ok() {
                break;
            }
        }
        last
    }

    /// `MADV_DONTNEED` of pages, one call per contiguous run.
    pub(crate) fn discard_coalesced(&self, addrs: &[usize]) {
        let mut sorted = addrs.to_vec();
        sorted.sort_unstable();
        let mut i = 0;
        while i < sorted.len() {
            let start = sorted[i];
            let mut j = i + 1;
            while j < sorted.len() && sorted[j] == start + (j - i) * PAGE_SIZE {
                j += 1;
            }
            if let Err(e) = self.discard_retrying(start, (j - i) * PAGE_SIZE) {
                tracing::error!("discarding {} pages at {start:#x}: {e}", j - i);
            }
            i = j;
        }
    }

    /// Gives cached pool pages beyond `keep` per tier back to the kernel.
    /// Returns the pages given back.
    pub fn trim_pool_caches(&self, keep: usize) -> usize {
        self.tier_ids().map(|t| self.trim_tier_cache(t, keep)).sum()
    }

    /// Gives cached pool pages of `tier` beyond `keep` back to the kernel.
    /// Returns the pages given back.
    pub fn trim_tier_cache(&self, tier: TierId, keep: usize) -> usize {
        let t = tier;
        {
            let (pages, chunks) = self.pool(t).take_excess_cache(keep);
            let addrs: Vec<usize> = pages.iter().map(|&s| self.slot_addr(t, s)).collect();
            self.discard_coalesced(&addrs);
            for &(c, _) in &chunks {
                if let Err(e) = self.discard(self.slot_addr(t, c), HUGE_PAGE_SIZE) {
                    tracing::error!("discarding a cached chunk: {e}");
                }
            }
            let mut pool = self.pool(t);
            pool.release_pages(&pages, Holds::Hole);
            for &(c, still_huge) in &chunks {
                pool.release_chunk(c, Holds::Hole, still_huge);
            }
            pages.len() + chunks.len() * CHUNK_SLOTS
        }
    }
}
