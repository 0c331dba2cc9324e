//! [`DirtyHarvester`]: the one owner of the dirty log's GET and CLEAR. Every
//! consumer is served from one harvest: transaction dirty checks (`DIRTY_SEEN`
//! on pages a mover owns), shadow invalidation on the first write after a
//! promotion, and per-page write counts. A bit is cleared only after it was
//! read and consumed, like QEMU's cached per-slot bitmap.
//!
//! Only pages someone tracks are re-armed (cleared, hence write-protected
//! again): pages a mover owns and pages with a shadow. Every other dirty bit
//! is consumed once and then left set (`UNARMED`), so the page stays
//! writable: re-arming every written page at every harvest would cost the
//! guest one write-protect fault per page per harvest (about 12 us each under
//! PVM, measured: a 20x throughput loss for a write-heavy guest). A mover
//! re-arms the pages it takes in [`DirtyHarvester::arm`].

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::backing::{lock, TieredMemory};
use super::dirty::DirtyLog;
use super::page_map::{Consumed, BUSY, PARKED, SHADOW, SHADOW_BITS};

/// How long logging must be unneeded before a harvest switches it off.
pub const LOGGING_IDLE_OFF: Duration = Duration::from_secs(1);

/// Owns GET/CLEAR of a [`DirtyLog`] (and of the VMM-write log of the memory).
pub struct DirtyHarvester {
    log: Box<dyn DirtyLog>,
    scratch: Mutex<Scratch>,
    /// Transactions between `arm` and their commit or abort.
    in_flight: AtomicUsize,
    /// A policy wants write counts: keep logging on.
    required: AtomicBool,
}

/// Bitmaps reused across harvests.
struct Scratch {
    /// The log's bitmap.
    kvm: Vec<u64>,
    /// The VMM-write bitmap (then the union of both).
    soft: Vec<u64>,
    /// Bits to clear (re-arm) in the log.
    rearm: Vec<u64>,
    /// Per segment of the log (`DirtyLog::segment_pages`): whether it is on,
    /// whether the next harvest is its first since it went on (every bit
    /// set by `INITIALLY_SET`, not by a write), since when it has been
    /// unneeded.
    segs: Vec<Segment>,
    /// Pages per segment.
    seg_pages: usize,
    /// Times logging was switched on and off.
    switches: u64,
    /// Shadowed pages whose dirty bit a deferring harvest consumed (owned,
    /// waiting for revalidation or invalidation).
    deferred: Vec<(usize, u64)>,
}

/// One segment's logging state.
#[derive(Clone, Copy, Debug, Default)]
struct Segment {
    on: bool,
    fresh: bool,
    idle_since: Option<Instant>,
}

impl Scratch {
    fn logging(&self) -> bool {
        self.segs.iter().any(|s| s.on)
    }
}

impl std::fmt::Debug for DirtyHarvester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyHarvester")
            .field("pages", &self.log.pages())
            .finish()
    }
}

impl DirtyHarvester {
    /// A harvester for `log`, which must cover all guest pages of `mem`.
    pub fn new(log: Box<dyn DirtyLog>, mem: &TieredMemory) -> io::Result<Self> {
        if log.pages() < mem.guest_pages() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "dirty log covers {} pages but guest RAM has {}; log the whole memslot",
                    log.pages(),
                    mem.guest_pages()
                ),
            ));
        }
        let words = mem.guest_pages().div_ceil(64);
        let log_words = log.pages().div_ceil(64);
        // One segment of any size, or several of a whole number of bitmap
        // words each.
        let seg_pages = log.segment_pages().clamp(1, log.pages().max(1));
        if seg_pages < log.pages() && !seg_pages.is_multiple_of(64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("dirty log segments of {seg_pages} pages: must be a multiple of 64"),
            ));
        }
        let on = log.starts_on();
        let segs = vec![
            Segment {
                on,
                ..Segment::default()
            };
            log.pages().div_ceil(seg_pages)
        ];
        Ok(Self {
            log,
            scratch: Mutex::new(Scratch {
                kvm: vec![0; log_words],
                soft: vec![0; words],
                rearm: vec![0; words],
                segs,
                seg_pages,
                switches: 0,
                deferred: Vec::new(),
            }),
            in_flight: AtomicUsize::new(0),
            required: AtomicBool::new(false),
        })
    }

    /// Keeps logging on (a policy reads write counts) or lets it go off
    /// when nothing needs it.
    pub fn set_required(&self, required: bool) {
        self.required.store(required, Ordering::Release);
    }

    /// Whether the dirty log is on now.
    pub fn logging(&self) -> bool {
        lock(&self.scratch).logging()
    }

    /// How many segments of the log are on, of how many.
    pub fn segments_on(&self) -> (usize, usize) {
        let g = lock(&self.scratch);
        (g.segs.iter().filter(|s| s.on).count(), g.segs.len())
    }

    /// How many times logging was switched on or off.
    pub fn switches(&self) -> u64 {
        lock(&self.scratch).switches
    }

    /// A mover starts a transaction (logging must stay on until it ends).
    pub(crate) fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A mover's transaction ended.
    pub(crate) fn end(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Switches every segment on (a policy reads write counts).
    fn switch_on(&self, mem: &TieredMemory, g: &mut Scratch) -> io::Result<()> {
        for seg in 0..g.segs.len() {
            self.switch_segment_on(mem, g, seg)?;
        }
        Ok(())
    }

    /// Switches on the segments holding `pages` (a mover is about to arm them).
    fn switch_on_for(
        &self,
        mem: &TieredMemory,
        g: &mut Scratch,
        pages: &[usize],
    ) -> io::Result<()> {
        let mut last = usize::MAX;
        for &p in pages {
            let seg = p / g.seg_pages;
            if seg != last && seg < g.segs.len() {
                self.switch_segment_on(mem, g, seg)?;
                last = seg;
            }
        }
        Ok(())
    }

    fn switch_segment_on(&self, mem: &TieredMemory, g: &mut Scratch, seg: usize) -> io::Result<()> {
        let s = &mut g.segs[seg];
        if !s.on {
            self.log.set_segment_logging(seg, true)?;
            s.on = true;
            s.fresh = true;
            g.switches += 1;
            mem.counters
                .dirty_log_switches
                .fetch_add(1, Ordering::Relaxed);
        }
        g.segs[seg].idle_since = None;
        Ok(())
    }

    /// Switches off each segment that has been unneeded for a while: no
    /// policy reads write counts, no transaction is in flight, and no page
    /// of the segment has a shadow (a shadow needs its page's writes).
    fn maybe_switch_off(&self, mem: &TieredMemory, g: &mut Scratch) {
        let needed =
            self.required.load(Ordering::Acquire) || self.in_flight.load(Ordering::Acquire) > 0;
        if !g.logging() || self.log.starts_on() {
            return;
        }
        let now = Instant::now();
        let seg_pages = g.seg_pages;
        for seg in 0..g.segs.len() {
            let s = &mut g.segs[seg];
            if !s.on {
                continue;
            }
            if needed {
                s.idle_since = None;
                continue;
            }
            match s.idle_since {
                None => s.idle_since = Some(now),
                Some(t) if now.duration_since(t) >= LOGGING_IDLE_OFF => {
                    let first = seg * seg_pages;
                    let end = (first + seg_pages).min(mem.guest_pages());
                    if (first..end).any(|p| mem.pages.load(p) & SHADOW != 0) {
                        s.idle_since = None;
                        continue;
                    }
                    match self.log.set_segment_logging(seg, false) {
                        Ok(()) => {
                            s.on = false;
                            s.idle_since = None;
                            g.switches += 1;
                            mem.counters
                                .dirty_log_switches
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            tracing::warn!("switching the dirty log off (segment {seg}): {e}")
                        }
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// One harvest: GET, consume every set bit, CLEAR exactly those bits.
    /// Returns the number of dirty pages consumed.
    pub fn harvest(&self, mem: &TieredMemory) -> io::Result<usize> {
        let mut g = lock(&self.scratch);
        if self.required.load(Ordering::Acquire) {
            self.switch_on(mem, &mut g)?;
        }
        let n = self.harvest_locked(mem, &mut g, false)?;
        self.maybe_switch_off(mem, &mut g);
        Ok(n)
    }

    /// A harvest for a mover whose pages are unmapped right now (the guest
    /// waits for them): dirty bits of the mover's pages are consumed as
    /// usual, but the slower work on other shadowed pages (comparing with
    /// the shadow, invalidating it) is deferred to
    /// [`finish_deferred`](Self::finish_deferred), so the guest's wait is
    /// not spent on pages it does not wait for.
    pub fn harvest_deferring(&self, mem: &TieredMemory) -> io::Result<usize> {
        let mut g = lock(&self.scratch);
        self.harvest_locked(mem, &mut g, true)
    }

    /// Revalidates or invalidates the shadows a deferring harvest set aside
    /// (also done at the start of every harvest, so nothing stays owned).
    pub fn finish_deferred(&self, mem: &TieredMemory) {
        let mut g = lock(&self.scratch);
        self.process_deferred(mem, &mut g);
    }

    fn process_deferred(&self, mem: &TieredMemory, g: &mut Scratch) {
        for (page, word) in std::mem::take(&mut g.deferred) {
            self.invalidate_or_keep(mem, page, word);
        }
    }

    /// A shadowed page whose dirty bit was consumed (the caller owns it):
    /// keep the shadow if the page still equals it (re-armed), else free
    /// the shadow; releases the page.
    fn invalidate_or_keep(&self, mem: &TieredMemory, page: usize, word: u64) {
        if word & SHADOW != 0 && self.revalidate_shadow(mem, page) {
            // Not really written (see revalidate_shadow): keep the shadow;
            // the page is re-armed already.
            mem.release_page(page, 0, 0);
            return;
        }
        // First write after promotion: the shadow is stale.
        if word & SHADOW != 0 {
            mem.free_shadow_owned(page);
            mem.release_page(page, 0, SHADOW_BITS);
            mem.counters
                .shadow_invalidations
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        mem.release_page(page, 0, 0);
    }

    /// Arms the given (owned) pages: harvests first so no unconsumed bit is
    /// cleared, then re-arms exactly these pages in the log and forgets earlier
    /// writes to them. After this, any write to them shows as `DIRTY_SEEN` at
    /// the next harvest.
    pub fn arm(&self, mem: &TieredMemory, pages: impl Iterator<Item = usize>) -> io::Result<()> {
        let pages: Vec<usize> = pages.collect();
        let mut g = lock(&self.scratch);
        self.switch_on_for(mem, &mut g, &pages)?;
        self.harvest_locked(mem, &mut g, false)?;
        crate::test_point::reached(crate::test_point::TestPoint::ArmHarvested);
        let Scratch { rearm, .. } = &mut *g;
        rearm.iter_mut().for_each(|w| *w = 0);
        for p in pages {
            mem.pages.clear_dirty_seen(p);
            mem.pages.clear_unarmed(p);
            if let Some(w) = rearm.get_mut(p / 64) {
                *w |= 1 << (p % 64);
            }
        }
        self.clear_ranges(mem, rearm)
    }

    /// Clears the set bits of `mask` in both logs, one call per run of
    /// non-zero words.
    fn clear_ranges(&self, mem: &TieredMemory, mask: &[u64]) -> io::Result<()> {
        let mut w = 0;
        while w < mask.len() {
            if mask[w] == 0 {
                w += 1;
                continue;
            }
            let start = w;
            while w < mask.len() && mask[w] != 0 {
                w += 1;
            }
            mem.inject.io(crate::inject::FaultPoint::DirtyClear)?;
            self.log.clear(start * 64, &mask[start..w])?;
            mem.vmm_dirty_clear(start * 64, &mask[start..w])?;
        }
        Ok(())
    }

    /// A dirty bit on a shadowed page does not always mean a write: under
    /// shadow paging (PVM) KVM maps a page writable, and logs it dirty, on a
    /// read when the guest's own PTE is already dirty. So before dropping a
    /// shadow, re-arm the page (a write from now on shows at the next
    /// harvest) and compare it with its shadow: equal content keeps the
    /// shadow valid. Returns true if the shadow stays. The caller owns the
    /// page and must not re-arm it again in this harvest (that could erase a
    /// write made after this re-arm).
    fn revalidate_shadow(&self, mem: &TieredMemory, page: usize) -> bool {
        // A parked page is not mapped at its guest address: reading it here
        // would fault on this thread while we own the page. Treat it as written.
        if mem.pages.load(page) & PARKED != 0 {
            return false;
        }
        let first = page / 64 * 64;
        let mask = [1u64 << (page % 64)];
        if mem
            .inject
            .io(crate::inject::FaultPoint::DirtyClear)
            .is_err()
            || self.log.clear(first, &mask).is_err()
            || mem.vmm_dirty_clear(first, &mask).is_err()
        {
            return false;
        }
        let same = mem.page_matches_shadow(page);
        if same {
            mem.counters
                .shadow_revalidations
                .fetch_add(1, Ordering::Relaxed);
        }
        same
    }

    fn harvest_locked(
        &self,
        mem: &TieredMemory,
        scratch: &mut Scratch,
        defer: bool,
    ) -> io::Result<usize> {
        if !defer {
            self.process_deferred(mem, scratch);
        }
        if !scratch.logging() {
            // Nothing is tracked while logging is off (no transaction, no
            // shadow); the VMM-write log only matters for tracked pages.
            return Ok(0);
        }
        // Segments switched on since the last harvest read all dirty once.
        let fresh_segs: Vec<bool> = scratch
            .segs
            .iter_mut()
            .map(|s| std::mem::take(&mut s.fresh))
            .collect();
        let seg_pages = scratch.seg_pages;
        let Scratch {
            kvm,
            soft,
            rearm,
            deferred,
            ..
        } = scratch;
        mem.inject.io(crate::inject::FaultPoint::DirtyGet)?;
        self.log.get(kvm)?;
        mem.vmm_dirty_get(soft)?;
        crate::test_point::reached(crate::test_point::TestPoint::HarvestRead);
        let n = mem.guest_pages();
        let is_fresh = |page: usize| fresh_segs.get(page / seg_pages).copied().unwrap_or(false);
        let mut consumed = 0;
        for w in 0..soft.len() {
            let bits = kvm[w] | soft[w];
            rearm[w] = 0;
            if bits == 0 {
                continue;
            }
            let mut b = bits;
            while b != 0 {
                let i = b.trailing_zeros() as usize;
                b &= b - 1;
                let page = w * 64 + i;
                if page >= n {
                    continue;
                }
                let (taken, keep_armed) = self.harvest_page(mem, page, &is_fresh, defer, deferred);
                consumed += taken;
                if keep_armed {
                    rearm[w] |= 1 << i;
                }
            }
        }
        // The VMM-write log costs nothing to re-arm: clear everything it
        // showed (re-armed bits are cleared with the log's below).
        for (i, (s, r)) in soft.iter().zip(rearm.iter()).enumerate() {
            let only_soft = *s & !*r;
            if only_soft != 0 {
                mem.vmm_dirty_clear(i * 64, &[only_soft])?;
            }
        }
        self.clear_ranges(mem, rearm)?;
        mem.counters.harvests.fetch_add(1, Ordering::Relaxed);
        Ok(consumed)
    }

    /// One dirty `page` of [`Self::harvest_locked`]'s logs. Returns the
    /// writes it consumed (0 or 1) and whether its bit is re-armed
    /// (cleared in the log, so the next write is seen again): a tracked
    /// page that stays tracked. `is_fresh` says whether the page's segment
    /// was switched on since the last harvest.
    fn harvest_page(
        &self,
        mem: &TieredMemory,
        page: usize,
        is_fresh: &dyn Fn(usize) -> bool,
        defer: bool,
        deferred: &mut Vec<(usize, u64)>,
    ) -> (usize, bool) {
        if mem.pages.load(page) & (BUSY | SHADOW) == 0 {
            // Nobody tracks this page: count the write once and leave
            // its bit set so the guest keeps writing without faults
            // (the first harvest after switching on counts nothing:
            // every bit was set by the switch).
            if is_fresh(page) {
                mem.pages.mark_unarmed_uncounted(page);
                return (0, false);
            }
            return (usize::from(mem.pages.mark_unarmed(page)), false);
        }
        let word = mem.pages.load(page);
        if word & (BUSY | PARKED | SHADOW) == PARKED | SHADOW {
            // A parked shadowed page cannot be written while parked;
            // its bit predates the parking. Leave it set (unconsumed)
            // for the harvest after its touch maps it back: taking
            // the page now would make that touch wait for us.
            return (0, false);
        }
        if let Consumed::OwnedForInvalidation(word) = mem.pages.consume_dirty(page) {
            // Revalidation re-arms the page itself (see there);
            // invalidation leaves it unarmed (no shadow to protect).
            if defer {
                deferred.push((page, word));
            } else {
                self.invalidate_or_keep(mem, page, word);
            }
            return (1, false);
        }
        (1, true)
    }
}
