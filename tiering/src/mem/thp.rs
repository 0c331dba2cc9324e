//! Huge pages in guest RAM: which 2 MiB ranges are (believed) mapped by one
//! huge page, which ones 4 KiB moves have broken into pages ("split"), and
//! putting a broken range back together ("collapse", `MADV_COLLAPSE`) once
//! every page of it is on one tier again.
//!
//! A range becomes huge when its first touch commits it whole, when a 2 MiB
//! unit moves in whole, and after a collapse. A 4 KiB move into or out of a
//! huge range splits it (the kernel splits the mapping and the folio; the
//! areas are locked, so no part of it becomes the shared zero page, see
//! `Mapping::lock_on_fault`). A collapse copies the range into a new huge page
//! on the node most of its pages are on: the tier's node, since every page
//! is on that tier. When the tiers are on different nodes, the kernel never
//! collapses guest RAM by itself (a split range is NOHUGEPAGE): it would
//! not know the tiers. When they share a node (emulated tiers) no VMA flag
//! is changed: each change takes the mmap lock for writing, which stalls
//! every vCPU's faults behind it (measured: up to 440 ms on a busy host).
//! A range is collapsed only when two scans 100 ms apart found it whole on
//! one tier (a range the sampler or a mover keeps splitting is left split).

use std::sync::atomic::{AtomicU8, Ordering};

use super::page_map::{self, BUSY, PARKED, POPULATED};
use super::pool::CHUNK_SLOTS;
use super::TieredMemory;
use crate::sys::{self, Advice, HUGE_PAGE_SIZE, PAGE_SIZE};

/// The range is mapped by one huge page (as far as tiervm knows).
const HUGE: u8 = 1;
/// 4 KiB moves touched the range since it was last whole.
const SPLIT: u8 = 2;
/// A split range the last collapse scan found whole on one tier: the next
/// scan collapses it if it still is (a range the sampler or a mover keeps
/// splitting is not collapsed again and again).
const WHOLE_ONCE: u8 = 3;

/// Per-2-MiB-range state of guest RAM.
#[derive(Debug)]
pub(crate) struct ChunkStates(Box<[AtomicU8]>);

impl ChunkStates {
    pub(crate) fn new(guest_pages: usize) -> std::io::Result<Self> {
        Ok(Self(sys::zeroed_atomics(
            guest_pages.div_ceil(CHUNK_SLOTS),
        )?))
    }
}

impl TieredMemory {
    /// The guest range `[first, first + pages)` is now mapped by huge pages
    /// (a whole commit or a whole 2 MiB move).
    pub(crate) fn note_huge(&self, first: usize, pages: usize) {
        if pages == CHUNK_SLOTS && first.is_multiple_of(CHUNK_SLOTS) {
            if let Some(c) = self.chunks.0.get(first / CHUNK_SLOTS) {
                c.store(HUGE, Ordering::Relaxed);
            }
        }
    }

    /// The whole 2 MiB range of guest RAM that `page` is in, as its first
    /// page, if tiervm believes one huge page maps it (never split since
    /// it was last whole) and huge pages are on.
    pub(crate) fn huge_range_of(&self, page: usize) -> Option<usize> {
        let first = page / CHUNK_SLOTS * CHUNK_SLOTS;
        let state = self.chunks.0.get(page / CHUNK_SLOTS)?;
        (self.huge_pages
            && first + CHUNK_SLOTS <= self.guest_pages
            && state.load(Ordering::Relaxed) == HUGE)
            .then_some(first)
    }

    /// A move of `len` bytes at guest address `addr` happened (in or out).
    /// A move of less than a whole aligned 2 MiB range splits it.
    pub(crate) fn note_guest_move(&self, addr: usize, len: usize) {
        let g = self.layout.guest;
        if addr < g || addr >= g + self.guest_len() {
            return;
        }
        let first = (addr - g) / PAGE_SIZE;
        let pages = len / PAGE_SIZE;
        if pages == CHUNK_SLOTS && first.is_multiple_of(CHUNK_SLOTS) {
            self.note_huge(first, pages);
            return;
        }
        let last = first + pages.max(1) - 1;
        for c in first / CHUNK_SLOTS..=last / CHUNK_SLOTS {
            let Some(state) = self.chunks.0.get(c) else {
                continue;
            };
            let old = state.swap(SPLIT, Ordering::Relaxed);
            if old == HUGE {
                self.counters.splits.fetch_add(1, Ordering::Relaxed);
            }
            // On tiers that share a node (emulated) a collapse by the kernel
            // cannot move a page off its tier's node: no VMA flag change,
            // whose mmap write lock would stall every vCPU's faults.
            if old != SPLIT && old != WHOLE_ONCE && self.huge_pages && !self.emulated() {
                // Broken into pages (or committed page by page): keep
                // khugepaged away from it (see `backing::set_up_areas`).
                let a = g + c * HUGE_PAGE_SIZE;
                if let Err(e) = self.mapping().advise(a, HUGE_PAGE_SIZE, Advice::NoHugePage) {
                    tracing::debug!("guest range {}: NOHUGEPAGE: {e}", c * CHUNK_SLOTS);
                }
            }
        }
    }

    /// Collapses up to `budget` split 2 MiB ranges whose pages are all
    /// present on one tier and free (nobody moving or sampling them) back
    /// into huge pages. Returns how many collapsed.
    pub fn collapse_split_ranges(&self, budget: usize) -> usize {
        if !self.huge_pages || budget == 0 {
            return 0;
        }
        let mut done = 0;
        for (c, state) in self.chunks.0.iter().enumerate() {
            if done >= budget {
                break;
            }
            let st = state.load(Ordering::Relaxed);
            if st != SPLIT && st != WHOLE_ONCE {
                continue;
            }
            let first = c * CHUNK_SLOTS;
            if first + CHUNK_SLOTS > self.guest_pages {
                continue;
            }
            let tier = page_map::tier_of(self.pages.load(first));
            let whole = tier.is_some()
                && (first..first + CHUNK_SLOTS).all(|p| {
                    let w = self.pages.load(p);
                    w & POPULATED != 0 && w & (BUSY | PARKED) == 0 && page_map::tier_of(w) == tier
                });
            if !whole {
                let _ =
                    state.compare_exchange(WHOLE_ONCE, SPLIT, Ordering::Relaxed, Ordering::Relaxed);
                continue;
            }
            if st == SPLIT {
                // Seen whole for the first time: collapse at the next scan
                // if it stays whole (and unsplit) until then.
                let _ =
                    state.compare_exchange(SPLIT, WHOLE_ONCE, Ordering::Relaxed, Ordering::Relaxed);
                continue;
            }
            crate::test_point::reached(crate::test_point::TestPoint::CollapseScanned);
            // Own every page so no mover or sampler races the collapse.
            let mut owned = 0;
            for p in first..first + CHUNK_SLOTS {
                match self.pages.try_acquire(p, false) {
                    // Parked since the scan above: not whole any more.
                    Some(w) if page_map::tier_of(w) == tier && w & PARKED == 0 => owned += 1,
                    Some(_) => {
                        owned += 1;
                        break;
                    }
                    None => break,
                }
            }
            if owned == CHUNK_SLOTS {
                match self.collapse_owned_range(first) {
                    Ok(()) => {
                        state.store(HUGE, Ordering::Relaxed);
                        self.counters.collapses.fetch_add(1, Ordering::Relaxed);
                        done += 1;
                    }
                    Err(e) => tracing::debug!("collapsing guest range {first}: {e}"),
                }
            }
            for p in first..first + owned {
                self.release_page(p, 0, 0);
            }
        }
        done
    }

    /// `MADV_COLLAPSE` of the 2 MiB guest range starting at page `first`,
    /// whose pages the caller owns.
    fn collapse_owned_range(&self, first: usize) -> std::io::Result<()> {
        // A split range is NOHUGEPAGE (see `backing::set_up_areas`), which
        // MADV_COLLAPSE refuses: eligible again for the collapse, and
        // staying so once it is huge.
        let a = self.guest_addr(first);
        let collapse = || {
            self.inject.io(crate::inject::FaultPoint::Collapse)?;
            self.mapping().advise(a, HUGE_PAGE_SIZE, Advice::Collapse)
        };
        let collapsed = if self.emulated() {
            // Never made NOHUGEPAGE (see `note_guest_move`).
            collapse()
        } else {
            self.mapping()
                .advise(a, HUGE_PAGE_SIZE, Advice::HugePage)
                .and_then(|()| collapse())
        };
        if collapsed.is_err() && !self.emulated() {
            if let Err(e) = self.mapping().advise(a, HUGE_PAGE_SIZE, Advice::NoHugePage) {
                tracing::warn!("guest range {first}: back to NOHUGEPAGE: {e}");
            }
        }
        collapsed
    }
}
