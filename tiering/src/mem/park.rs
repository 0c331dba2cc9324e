//! Parking: access sampling by unmapping pages. A parked page sits in its
//! parking slot (zero-copy `UFFDIO_MOVE`); the guest's next touch raises a
//! userfault, the fault handler records a hint fault and maps the page back.
//! The hint-fault sampler and the accessed-bit probes both park pages; each
//! maps back only its own ([`Parker`], the `PROBE` bit).
//!
//! Also here: the fault-path promotion of a parked page (TPP promotes in the
//! NUMA hint fault, while the faulting access waits).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::backing::{Parker, TieredMemory};
use super::page_map::{self, on_tier, PARKED, PLACEMENT_BITS, POPULATED, PROBE};
use super::pool::Holds;
use super::pool::CHUNK_SLOTS;
use crate::sys::{self, MoveError, HUGE_PAGE_SIZE, PAGE_SIZE};

/// What [`TieredMemory::map_back_touched`] did with a touched parked page.
#[derive(Debug)]
pub(crate) enum MapBack {
    /// Moved back from its parking slot (the normal case).
    Moved,
    /// The move failed, but the page was in guest RAM already and its
    /// parking slot empty: only the bookkeeping was updated.
    AlreadyBack(MoveError),
    /// Guest RAM and the parking slot held the same bytes: the parked
    /// duplicate was freed.
    Duplicate(MoveError),
    /// Guest RAM held different, non-zero data: kept (newest), the parked
    /// copy freed.
    KeptGuestCopy(MoveError),
    /// Guest RAM held a zero fill: replaced by the parked copy.
    ParkedCopyWon(MoveError),
    /// The parked copy could not be moved: copied into a fresh page.
    Copied(MoveError),
    /// No copy of the page was found (recovery or a stop followed).
    Lost(MoveError),
    /// Nothing could be put back: the VM is stopped.
    Stopped(MoveError),
}

impl std::fmt::Display for MapBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (done, e) = match self {
            MapBack::Moved => return f.write_str("moved back"),
            MapBack::AlreadyBack(e) => (
                "the page was in guest RAM already and its parking slot empty; marked unparked",
                e,
            ),
            MapBack::Duplicate(e) => (
                "guest RAM and the parking slot held the same bytes; the parked duplicate was freed",
                e,
            ),
            MapBack::KeptGuestCopy(e) => (
                "guest RAM held different data (the newest, accessed since it appeared); kept it \
                 and dropped the older parked copy",
                e,
            ),
            MapBack::ParkedCopyWon(e) => (
                "guest RAM held a zero fill; replaced it with the parked copy",
                e,
            ),
            MapBack::Copied(e) => (
                "copied the parked page into a fresh page and mapped that",
                e,
            ),
            MapBack::Lost(e) => ("no copy of the page was found; recovering it", e),
            MapBack::Stopped(e) => ("nothing could be put back; the VM is stopped", e),
        };
        write!(f, "{e}: {done}")
    }
}

/// How [`TieredMemory::park_pages`]'s one-by-one retry after `EBUSY` ended.
enum BusyParks {
    /// Every owned page is in its parking slot now.
    AllParked,
    /// The pages that stayed busy are in guest RAM and were released
    /// unparked; these were parked (and released tagged).
    BusySkipped(Vec<usize>),
    /// Some page is neither parked nor in guest RAM: roll the call back.
    Failed,
}

impl TieredMemory {
    /// Parks `pages` for hint faults on behalf of `parker` (runs of
    /// consecutive pages move with one range move). Busy and never-touched
    /// pages are skipped. A page already parked is skipped, except that a
    /// probe takes over a sampler window page (its touch will be recorded all
    /// the same; the probe now maps it back) and counts it as parked.
    /// Returns the pages parked. On a failed move every page of the call is
    /// put back where the kernel says it is, so nothing is lost.
    pub(crate) fn park_pages(
        &self,
        pages: &[usize],
        parker: Parker,
    ) -> std::io::Result<Vec<usize>> {
        let probe = parker == Parker::Probe;
        let tag = if probe { PARKED | PROBE } else { PARKED };
        let (mut owned, taken_over) = self.claim_for_parking(pages, probe);
        let pairs: Vec<_> = owned
            .iter()
            .map(|&p| (self.park_addr(p), self.guest_addr(p)))
            .collect();
        let mut moved = self.move_pairs(&pairs);
        if let Err(e) = moved {
            if e.errno == libc::EBUSY {
                match self.park_busy_one_by_one(&owned, tag, e) {
                    BusyParks::AllParked => moved = Ok(()),
                    BusyParks::BusySkipped(mut parked) => {
                        parked.extend(taken_over);
                        return Ok(parked);
                    }
                    BusyParks::Failed => {}
                }
            }
        }
        if let Err(e) = moved {
            self.put_back_after_failed_park(&owned, tag);
            return Err(e.into());
        }
        for &p in &owned {
            self.release_page(p, tag, 0);
        }
        owned.extend(taken_over);
        Ok(owned)
    }

    /// The first step of [`Self::park_pages`]: acquires each page of
    /// `pages` in guest RAM that is free to park. Returns the pages owned
    /// now (populated, not parked: to be moved) and the sampler window
    /// pages a probe took over (already released, tagged `PROBE`). Busy,
    /// never-touched and already probed pages are skipped (released as
    /// they were).
    fn claim_for_parking(&self, pages: &[usize], probe: bool) -> (Vec<usize>, Vec<usize>) {
        let mut taken_over = Vec::new();
        let mut owned = Vec::new();
        for &p in pages.iter().filter(|&&p| p < self.guest_pages) {
            let Some(w) = self.pages.try_acquire(p, probe) else {
                continue;
            };
            if w & POPULATED == 0 {
                self.release_page(p, 0, 0);
            } else if w & PARKED == 0 {
                owned.push(p);
            } else if w & PROBE == 0 {
                self.release_page(p, PROBE, 0);
                taken_over.push(p);
            } else {
                self.release_page(p, 0, 0);
            }
        }
        (owned, taken_over)
    }

    /// [`Self::park_pages`] after a batch move of `owned` failed with
    /// `EBUSY` (`e`): the kernel refused to move a page it sees as shared
    /// or pinned (not `PageAnonExclusive`, or pinned for DMA); under KVM a
    /// page it holds for an access is pinned for microseconds. Nothing moved
    /// for that page and nothing is lost: the pages still in guest RAM are
    /// retried one by one (bounded, `move_retrying`), and a page that stays
    /// busy is left unparked (skipped, like a page a mover owns) instead of
    /// failing the rest of the window.
    fn park_busy_one_by_one(&self, owned: &[usize], tag: u64, e: MoveError) -> BusyParks {
        self.counters
            .park_busy_retries
            .fetch_add(1, Ordering::Relaxed);
        let present = |a: usize| sys::resident(a, 1).map(|r| r[0]).unwrap_or(false);
        let mut parked = Vec::with_capacity(owned.len());
        for &p in owned {
            let (guest, park) = (self.guest_addr(p), self.park_addr(p));
            let in_park = if present(guest) {
                !present(park) && self.move_retrying(park, guest, PAGE_SIZE).is_ok()
            } else {
                present(park)
            };
            if in_park {
                parked.push(p);
            }
        }
        if parked.len() == owned.len() {
            return BusyParks::AllParked;
        }
        let still: Vec<usize> = owned
            .iter()
            .copied()
            .filter(|p| !parked.contains(p))
            .collect();
        if !still.iter().all(|&p| present(self.guest_addr(p))) {
            return BusyParks::Failed;
        }
        // The pages that stayed busy are in guest RAM: they simply are not
        // parked this time.
        tracing::debug!(
            "parking: {} of {} pages stayed busy ({e}); skipped",
            still.len(),
            owned.len()
        );
        for &p in &still {
            self.release_page(p, 0, 0);
        }
        for &p in &parked {
            self.release_page(p, tag, 0);
        }
        BusyParks::BusySkipped(parked)
    }

    /// The roll-back of a failed [`Self::park_pages`]: every page of
    /// `owned` is released where the kernel says it is. Pages that moved
    /// are put back; one that cannot move back stays parked (tagged `tag`),
    /// and the fault handler maps it back on its touch. Guest RAM decides
    /// which moved, not the parking slot: a slot that held a stale page (a
    /// failed discard) fails the move with EEXIST while the page stays in
    /// guest RAM, and reading the slot would tag a page the guest still has
    /// as parked (stuck: every unpark then fails with EEXIST). Such a slot
    /// is healed.
    fn put_back_after_failed_park(&self, owned: &[usize], tag: u64) {
        let resident = |a: usize| sys::resident(a, 1).map(|r| r[0]);
        for &p in owned {
            let (guest, park) = (self.guest_addr(p), self.park_addr(p));
            match resident(guest) {
                Ok(true) => {
                    if resident(park).unwrap_or(false) {
                        self.heal_park_slot(p);
                    }
                    self.release_page(p, 0, 0);
                }
                _ => {
                    if self.move_range(guest, park, PAGE_SIZE, true).is_err()
                        && resident(park).unwrap_or(true)
                    {
                        self.release_page(p, tag, 0);
                    } else {
                        self.release_page(p, 0, 0);
                    }
                }
            }
        }
    }

    /// Discards the stale page found in the parking slot of the owned,
    /// unparked `page` (the page itself is in guest RAM, so the slot's copy
    /// is no one's data), so the next park of `page` can use the slot.
    fn heal_park_slot(&self, page: usize) {
        self.counters.slot_heals.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.discard(self.park_addr(page), PAGE_SIZE) {
            tracing::warn!("discarding the stale parking slot of page {page}: {e}");
        }
    }

    /// Maps back those of `pages` that are still parked by `parker` (the
    /// guest never touched them). Pages owned by someone else right now (the
    /// fault handler unparking them, a harvest, a shadow reclaim) are
    /// skipped and pushed to `busy`, for the caller to retry. Returns how
    /// many were unparked.
    pub(crate) fn unpark_pages(
        &self,
        pages: &[usize],
        parker: Parker,
        busy: &mut Vec<usize>,
    ) -> std::io::Result<usize> {
        let mut n = 0;
        let mut first_err = None;
        for &page in pages.iter().filter(|&&p| p < self.guest_pages) {
            let Some(w) = self.pages.try_acquire(page, true) else {
                busy.push(page);
                continue;
            };
            if w & PARKED == 0 || (w & PROBE != 0) != (parker == Parker::Probe) {
                // Touched and mapped back already, or parked by the other side.
                self.release_page(page, 0, 0);
                continue;
            }
            // A huge range parked whole goes back whole (its other pages
            // are then found unparked below and skipped).
            let (outcome, pages) = match self.acquire_parked_range(page) {
                Some(first) => (self.map_back_touched_range(first, page), CHUNK_SLOTS),
                // The same settlement as a touch's (`map_back_touched`): a
                // failed move must not leave the page parked for good (the
                // stress test found parked pages already back in guest RAM,
                // whose every unpark then failed with EEXIST).
                None => (self.map_back_touched(page), 1),
            };
            match outcome {
                MapBack::Moved => n += pages,
                MapBack::Lost(e) | MapBack::Stopped(e) => {
                    tracing::error!(
                        "unparking page {page}: {e}: no copy could be put back (recovered or \
                         the VM stopped, see the fatal error)"
                    );
                    first_err.get_or_insert(e);
                }
                other => {
                    tracing::warn!("unparking page {page}: {other}");
                    n += 1;
                }
            }
        }
        first_err.map_or(Ok(n), |e| Err(e.into()))
    }

    /// [`Self::unpark_pages`], retrying pages that were busy for up to
    /// about 100 ms (owners hold a page for microseconds). A page still busy
    /// after that stays parked, and the fault handler maps it back on its
    /// next touch.
    pub(crate) fn unpark_pages_settled(
        &self,
        pages: &[usize],
        parker: Parker,
    ) -> std::io::Result<usize> {
        let mut busy = Vec::new();
        let mut n = self.unpark_pages(pages, parker, &mut busy)?;
        for _ in 0..100 {
            if busy.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            let retry = std::mem::take(&mut busy);
            n += self.unpark_pages(&retry, parker, &mut busy)?;
        }
        Ok(n)
    }

    /// After a touch of the owned, parked `page`: if its 2 MiB range was
    /// parked whole as one huge page, by the same parker, takes every other
    /// page of the range (all parked alike and free). Returns the first page
    /// of the range when all are owned now (the caller maps the range back
    /// with [`Self::map_back_touched_range`]); `None`, owning nothing more,
    /// otherwise (the page is mapped back alone).
    pub(crate) fn acquire_parked_range(&self, page: usize) -> Option<usize> {
        let first = self.huge_range_of(page)?;
        let tag = self.pages.load(page) & (PARKED | PROBE);
        let mut owned = Vec::with_capacity(CHUNK_SLOTS);
        for p in (first..first + CHUNK_SLOTS).filter(|&p| p != page) {
            match self.pages.try_acquire(p, true) {
                Some(w) if w & (PARKED | PROBE) == tag && w & POPULATED != 0 => owned.push(p),
                Some(_) => {
                    self.release_page(p, 0, 0);
                    break;
                }
                None => break,
            }
        }
        if owned.len() == CHUNK_SLOTS - 1 {
            return Some(first);
        }
        for p in owned {
            self.release_page(p, 0, 0);
        }
        None
    }

    /// Maps the owned, parked 2 MiB range at `first` (every page of it
    /// owned, [`Self::acquire_parked_range`]) back into guest RAM with one
    /// move, so the huge page stays whole (a 4 KiB move would split it:
    /// every page of it then refaults into the guest as a 4 KiB mapping),
    /// and releases its pages unparked. If the range move fails, each page
    /// is settled on its own ([`Self::map_back_touched`]). Returns what was
    /// done with `touched`.
    pub(crate) fn map_back_touched_range(&self, first: usize, touched: usize) -> MapBack {
        let (guest, park) = (self.guest_addr(first), self.park_addr(first));
        if self.move_retrying(guest, park, HUGE_PAGE_SIZE).is_ok() {
            for p in first..first + CHUNK_SLOTS {
                self.release_page(p, 0, PARKED | PROBE);
            }
            self.counters.range_unparks.fetch_add(1, Ordering::Relaxed);
            return MapBack::Moved;
        }
        for p in (first..first + CHUNK_SLOTS).filter(|&p| p != touched) {
            let outcome = self.map_back_touched(p);
            if !matches!(outcome, MapBack::Moved) {
                tracing::warn!("unparking page {p} of a huge range: {outcome}");
            }
        }
        self.map_back_touched(touched)
    }

    /// Maps the owned, parked `page` back into guest RAM after a touch and
    /// releases it unparked. Never leaves the page parked: a vCPU (or VMM
    /// thread) waits on it. Every branch is bounded (transient move errors
    /// are retried a few times, `move_retrying`), and the caller wakes the
    /// guest address whatever happened. Returns what was done, for the log.
    pub(crate) fn map_back_touched(&self, page: usize) -> MapBack {
        let (guest, park) = (self.guest_addr(page), self.park_addr(page));
        let err = match self.move_retrying(guest, park, PAGE_SIZE) {
            Ok(()) => {
                self.release_page(page, 0, PARKED | PROBE);
                return MapBack::Moved;
            }
            Err(e) => e,
        };
        self.counters
            .unpark_failures
            .fetch_add(1, Ordering::Relaxed);
        let present = |a: usize| sys::resident(a, 1).map(|r| r[0]).unwrap_or(false);
        match (present(guest), present(park)) {
            // The page is back in guest RAM already and its parking slot is
            // empty: it is the only copy, so it holds the guest's data (seen
            // when a move of another page brought it back, see
            // `docs/mechanisms.md` §6). Only the bookkeeping is behind.
            (true, false) => {
                self.counters
                    .unpark_conflicts
                    .fetch_add(1, Ordering::Relaxed);
                self.release_page(page, 0, PARKED | PROBE);
                MapBack::AlreadyBack(err)
            }
            (true, true) => self.resolve_two_copies(page, err),
            // Guest RAM still has the hole and the parked copy is there: the
            // move kept failing (e.g. EBUSY: the parked page is pinned or
            // shared right now). Copy it instead of moving it.
            (false, true) => self.copy_back_or_stop(page, err),
            // Neither: no copy to put back (a bookkeeping bug elsewhere).
            (false, false) => {
                self.release_page(page, 0, PARKED | PROBE);
                if self.pages.try_acquire(page, false).is_some() {
                    self.recover_hole(page);
                }
                MapBack::Lost(err)
            }
        }
    }

    /// [`Self::map_back_touched`] when the move back failed and the owned
    /// `page` has two copies, both resident: in guest RAM and in its parking
    /// slot. Which
    /// one is the guest's data:
    /// - equal bytes: either; the parked one is a duplicate, freed.
    /// - the guest RAM copy is all zeros and the parked one is not: the
    ///   guest RAM copy is a fresh fill (a zero page or a new page a path
    ///   mapped into the hole); nothing of the guest's is in it that the
    ///   parked copy lacks, except writes of zeros, so the parked copy (the
    ///   page's content when it was parked, and no write can reach a parked
    ///   page) is put back and the fill freed.
    /// - both hold different non-zero data: the guest RAM copy has been the
    ///   page for every access since it appeared (no access faults any
    ///   more), so it holds the newest writes and is kept; the parked copy
    ///   is older. It is dropped with an error naming the page, never
    ///   silently.
    fn resolve_two_copies(&self, page: usize, err: MoveError) -> MapBack {
        let (guest, park) = (self.guest_addr(page), self.park_addr(page));
        self.counters
            .unpark_conflicts
            .fetch_add(1, Ordering::Relaxed);
        let tier = page_map::tier_of(self.pages.load(page)).unwrap_or(0);
        // SAFETY: both are page-aligned present pages of our mapping (the caller,
        // `map_back_touched`, calls this only when it found both resident; we own the
        // page, so no mover unmaps either); volatile reads because a vCPU may write the
        // guest RAM copy.
        let (same, guest_zero) = unsafe {
            (
                sys::equal_volatile(guest as *const u8, park as *const u8, PAGE_SIZE),
                sys::is_zero_volatile(guest as *const u8, PAGE_SIZE),
            )
        };
        if same || !guest_zero {
            self.dispose(tier, &[park]);
            self.release_page(page, 0, PARKED | PROBE);
            return if same {
                MapBack::Duplicate(err)
            } else {
                MapBack::KeptGuestCopy(err)
            };
        }
        // The zero fill out, the parked copy in (the guest waits
        // on the hole in between: we own the page).
        self.dispose(tier, &[guest]);
        match self.move_retrying(guest, park, PAGE_SIZE) {
            Ok(()) => {
                self.release_page(page, 0, PARKED | PROBE);
                MapBack::ParkedCopyWon(err)
            }
            Err(e) => self.copy_back_or_stop(page, e),
        }
    }

    /// The parked copy of the owned `page` cannot be moved into guest RAM:
    /// copies it into a fresh page of its tier's pool, moves that in and
    /// frees the parked one; if even that fails, stops the VM (the guest
    /// must not run on a missing page) and keeps the page owned, so its
    /// toucher waits only until the VM is stopped.
    fn copy_back_or_stop(&self, page: usize, err: sys::MoveError) -> MapBack {
        let (guest, park) = (self.guest_addr(page), self.park_addr(page));
        let tier = page_map::tier_of(self.pages.load(page)).unwrap_or(0);
        if let Some(staging) = self.reserve_staging(tier, 1, Holds::Cached) {
            let dst = staging.addr(self, tier, 0);
            // SAFETY: both are page-aligned pages of our mapping: the parked page is
            // present in its parking slot (we own it) and the staging page is a reserved
            // pool slot (a hole is allocated by the write); they do not overlap.
            unsafe { sys::copy_volatile(dst as *mut u8, park as *const u8, PAGE_SIZE) };
            if self.move_retrying(guest, dst, PAGE_SIZE).is_ok() {
                self.release_staging(tier, &staging, Holds::Hole, false);
                self.dispose(tier, &[park]);
                self.release_page(page, 0, PARKED | PROBE);
                return MapBack::Copied(err);
            }
            self.release_staging_checked(tier, &staging);
        }
        self.set_fatal(format!(
            "guest page {page}: its parked copy could not be put back into guest RAM ({err}); \
             the VM is stopped to avoid running on a missing page"
        ));
        MapBack::Stopped(err)
    }

    /// Promotes an owned, parked page to the fastest tier (stop-and-copy)
    /// while the faulting vCPU waits: copies the parked page into a staging
    /// page of tier 0, maps that at the guest address (which wakes the
    /// vCPU), disposes of the old page and releases the page unparked on
    /// tier 0. Returns false (nothing changed, the page still owned and
    /// parked) when tier 0 has no room or the page is on it already. No
    /// dirty check is needed: the page was unmapped for the whole copy.
    pub(crate) fn promote_parked_owned(&self, page: usize) -> std::io::Result<bool> {
        let w = self.pages.load(page);
        let Some(from) = page_map::tier_of(w) else {
            return Ok(false);
        };
        let to = 0;
        if from == to {
            return Ok(false);
        }
        if !self.tiers[usize::from(to)].try_reserve(1) {
            self.counters
                .skipped_no_space
                .fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let Some(staging) = self.reserve_staging(to, 1, Holds::Cached) else {
            self.tiers[usize::from(to)].unreserve(1);
            return Err(std::io::Error::other(
                "no pool slot for a promotion (accounting bug)",
            ));
        };
        let dst = staging.addr(self, to, 0);
        // SAFETY: both are page-aligned pages of our mapping: the parked page is present
        // in its parking slot (we own it) and the staging page is a reserved pool slot
        // (a hole is allocated by the write); they do not overlap.
        unsafe { sys::copy_volatile(dst as *mut u8, self.park_addr(page) as *const u8, PAGE_SIZE) };
        self.publish_placement(page, 1, to);
        if let Err(e) = self.move_range(self.guest_addr(page), dst, PAGE_SIZE, true) {
            self.release_staging_checked(to, &staging);
            self.tiers[usize::from(to)].unreserve(1);
            self.publish_placement(page, 1, from);
            return Err(e.into());
        }
        self.release_staging(to, &staging, Holds::Hole, false);
        if w & page_map::SHADOW != 0 {
            self.free_shadow_owned(page);
        }
        self.dispose(from, &[self.park_addr(page)]);
        self.release_page(
            page,
            on_tier(to),
            PLACEMENT_BITS | PARKED | PROBE | page_map::SHADOW_BITS,
        );
        self.tiers[usize::from(to)].unreserve(1);
        self.counters.promotions.fetch_add(1, Ordering::Relaxed);
        self.counters.stop_copy.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}
