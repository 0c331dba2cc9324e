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
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::backing::{lock, TieredMemory};
use super::dirty::DirtyLog;
use super::page_map::{Consumed, BUSY, PARKED, SHADOW, SHADOW_BITS};

/// Owns GET/CLEAR of a [`DirtyLog`] (and of the VMM-write log of the memory).
pub struct DirtyHarvester {
    log: Box<dyn DirtyLog>,
    scratch: Mutex<Scratch>,
}

/// Bitmaps reused across harvests.
struct Scratch {
    /// The log's bitmap.
    kvm: Vec<u64>,
    /// The VMM-write bitmap (then the union of both).
    soft: Vec<u64>,
    /// Bits to clear (re-arm) in the log.
    rearm: Vec<u64>,
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
        Ok(Self {
            log,
            scratch: Mutex::new(Scratch {
                kvm: vec![0; log_words],
                soft: vec![0; words],
                rearm: vec![0; words],
            }),
        })
    }

    /// One harvest: GET, consume every set bit, CLEAR exactly those bits.
    /// Returns the number of dirty pages consumed.
    pub fn harvest(&self, mem: &TieredMemory) -> io::Result<usize> {
        let mut g = lock(&self.scratch);
        self.harvest_locked(mem, &mut g)
    }

    /// Arms the given (owned) pages: harvests first so no unconsumed bit is
    /// cleared, then re-arms exactly these pages in the log and forgets earlier
    /// writes to them. After this, any write to them shows as `DIRTY_SEEN` at
    /// the next harvest.
    pub fn arm(&self, mem: &TieredMemory, pages: impl Iterator<Item = usize>) -> io::Result<()> {
        let mut g = lock(&self.scratch);
        self.harvest_locked(mem, &mut g)?;
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
            mem.inject.io(crate::sys::FaultPoint::DirtyClear)?;
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
        if mem.inject.io(crate::sys::FaultPoint::DirtyClear).is_err()
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

    fn harvest_locked(&self, mem: &TieredMemory, scratch: &mut Scratch) -> io::Result<usize> {
        let Scratch { kvm, soft, rearm } = scratch;
        mem.inject.io(crate::sys::FaultPoint::DirtyGet)?;
        self.log.get(kvm)?;
        mem.vmm_dirty_get(soft)?;
        let n = mem.guest_pages();
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
                if mem.pages.load(page) & (BUSY | SHADOW) == 0 {
                    // Nobody tracks this page: count the write once and leave
                    // its bit set so the guest keeps writing without faults.
                    consumed += usize::from(mem.pages.mark_unarmed(page));
                    continue;
                }
                consumed += 1;
                rearm[w] |= 1 << i;
                if let Consumed::OwnedForInvalidation(word) = mem.pages.consume_dirty(page) {
                    if word & SHADOW != 0 && self.revalidate_shadow(mem, page) {
                        // Not really written (see revalidate_shadow): keep the
                        // shadow; the page is re-armed already.
                        rearm[w] &= !(1 << i);
                        mem.release_page(page, 0, 0);
                        continue;
                    }
                    rearm[w] &= !(1 << i);
                    // First write after promotion: the shadow is stale.
                    if word & SHADOW != 0 {
                        mem.free_shadow_owned(page);
                        mem.release_page(page, 0, SHADOW_BITS);
                        mem.counters
                            .shadow_invalidations
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    mem.release_page(page, 0, 0);
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
}
