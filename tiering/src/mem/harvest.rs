//! [`DirtyHarvester`]: the one owner of the dirty log's GET and CLEAR. Every
//! consumer is served from one harvest: transaction dirty checks (`DIRTY_SEEN`
//! on pages a mover owns), shadow invalidation on the first write after a
//! promotion, and per-page write counts. A bit is cleared only after it was
//! read and consumed, like QEMU's cached per-slot bitmap.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::backing::{lock, TieredMemory};
use super::dirty::DirtyLog;
use super::page_map::{Consumed, SHADOW};

/// Owns GET/CLEAR of a [`DirtyLog`] (and of the VMM-write log of the memory).
pub struct DirtyHarvester {
    log: Box<dyn DirtyLog>,
    scratch: Mutex<(Vec<u64>, Vec<u64>)>,
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
            scratch: Mutex::new((vec![0; log_words], vec![0; words])),
        })
    }

    /// One harvest: GET, consume every set bit, CLEAR exactly those bits.
    /// Returns the number of dirty pages consumed.
    pub fn harvest(&self, mem: &TieredMemory) -> io::Result<usize> {
        let mut g = lock(&self.scratch);
        self.harvest_locked(mem, &mut g)
    }

    /// Arms the given (owned) pages: harvests first so no unconsumed bit is
    /// cleared, then forgets earlier writes to these pages. After this, any
    /// write to them shows as `DIRTY_SEEN` at the next harvest.
    pub fn arm(&self, mem: &TieredMemory, pages: impl Iterator<Item = usize>) -> io::Result<()> {
        let mut g = lock(&self.scratch);
        self.harvest_locked(mem, &mut g)?;
        for p in pages {
            mem.pages.clear_dirty_seen(p);
        }
        Ok(())
    }

    fn harvest_locked(
        &self,
        mem: &TieredMemory,
        scratch: &mut (Vec<u64>, Vec<u64>),
    ) -> io::Result<usize> {
        let (kvm, soft) = scratch;
        self.log.get(kvm)?;
        mem.vmm_dirty_get(soft)?;
        let n = mem.guest_pages();
        let mut consumed = 0;
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for w in 0..soft.len() {
            let bits = kvm[w] | soft[w];
            soft[w] = bits;
            if bits == 0 {
                continue;
            }
            lo = lo.min(w);
            hi = w + 1;
            let mut b = bits;
            while b != 0 {
                let i = b.trailing_zeros() as usize;
                b &= b - 1;
                let page = w * 64 + i;
                if page >= n {
                    continue;
                }
                consumed += 1;
                if let Consumed::OwnedForInvalidation(word) = mem.pages.consume_dirty(page) {
                    // First write after promotion: the shadow is stale.
                    if word & SHADOW != 0 {
                        match mem.free_shadow_owned(page) {
                            Ok(()) => {
                                mem.release_page(page, 0, SHADOW);
                                mem.counters
                                    .shadow_invalidations
                                    .fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            Err(e) => tracing::error!("shadow invalidation of page {page}: {e}"),
                        }
                    }
                    mem.release_page(page, 0, 0);
                }
            }
        }
        if hi > lo {
            self.log.clear(lo * 64, &soft[lo..hi])?;
            mem.vmm_dirty_clear(lo * 64, &soft[lo..hi])?;
        }
        mem.counters.harvests.fetch_add(1, Ordering::Relaxed);
        Ok(consumed)
    }
}
