//! The per-page map: one `AtomicU32` per guest page, the single source of
//! truth for where each page lives and who may touch it.
//!
//! Layout of a word:
//! - bit 0: tier (0 fast, 1 slow);
//! - bit 1: `SHADOW`, a slow copy of this (fast) page sits in the shadow area;
//! - bit 2: `BUSY`, a mover owns the page (it may be unmapped right now);
//! - bit 3: `PARKED`, the sampler moved the page to the parking area;
//! - bit 4: `DIRTY_SEEN`, the harvester consumed a dirty bit while `BUSY`;
//! - bit 5: `WAITER`, the fault handler waits for the owner to release;
//! - bit 6: `UNARMED`, the page's dirty bit is left set in the log on purpose
//!   (nobody tracks its writes, so it stays writable without faults);
//! - bit 7: `PROBE`, a parked page is an accessed-bit probe, not a sampler
//!   window page (each side maps back only its own pages);
//! - bits 8..16: saturating write count (dirty harvests that saw the page);
//! - bits 16..32: shadow generation (orders shadows for oldest-first reclaim).

use std::sync::atomic::{AtomicU32, Ordering};

use super::Tier;

/// Tier bit (set: slow).
pub const SLOW: u32 = 1 << 0;
/// The page has a slow shadow copy.
pub const SHADOW: u32 = 1 << 1;
/// A mover owns the page.
pub const BUSY: u32 = 1 << 2;
/// The page sits in the parking area (hint-fault sampling).
pub const PARKED: u32 = 1 << 3;
/// A dirty bit was consumed while the page was `BUSY`.
pub const DIRTY_SEEN: u32 = 1 << 4;
/// The fault handler waits for the page's release.
pub const WAITER: u32 = 1 << 5;
/// The page's dirty bit is deliberately left set (not re-armed).
pub const UNARMED: u32 = 1 << 6;
/// With `PARKED`: parked as an accessed-bit probe.
pub const PROBE: u32 = 1 << 7;
const WCOUNT_SHIFT: u32 = 8;
const WCOUNT_MASK: u32 = 0xff << WCOUNT_SHIFT;
const GEN_SHIFT: u32 = 16;

/// What consuming a dirty bit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// Counted (and noted as `DIRTY_SEEN` if the page had an owner).
    Noted,
    /// The page had a shadow and no owner: the caller now owns it and must
    /// invalidate the shadow and release it. Carries the new word.
    OwnedForInvalidation(u32),
}

/// Per-page state words.
#[derive(Debug)]
pub struct PageMap {
    words: Box<[AtomicU32]>,
}

/// Tier encoded in a state word.
pub fn tier_of(word: u32) -> Tier {
    if word & SLOW != 0 {
        Tier::Slow
    } else {
        Tier::Fast
    }
}

/// Write count encoded in a state word.
pub fn write_count_of(word: u32) -> u8 {
    ((word & WCOUNT_MASK) >> WCOUNT_SHIFT) as u8
}

/// Shadow generation encoded in a state word.
pub fn generation_of(word: u32) -> u16 {
    (word >> GEN_SHIFT) as u16
}

impl PageMap {
    /// A map with every page on the given tiers.
    pub fn new(tiers: &[Tier]) -> Self {
        Self {
            words: tiers
                .iter()
                .map(|t| AtomicU32::new(if *t == Tier::Slow { SLOW } else { 0 }))
                .collect(),
        }
    }

    /// Current word of `page`.
    pub fn load(&self, page: usize) -> u32 {
        self.words[page].load(Ordering::Acquire)
    }

    /// Tries to take ownership of `page`: succeeds if neither `BUSY` nor
    /// (unless `allow_parked`) `PARKED`. Clears `DIRTY_SEEN`. Returns the word
    /// before the change.
    pub fn try_acquire(&self, page: usize, allow_parked: bool) -> Option<u32> {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur & BUSY != 0 || (!allow_parked && cur & PARKED != 0) {
                return None;
            }
            let new = (cur | BUSY) & !DIRTY_SEEN;
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(cur),
                Err(c) => cur = c,
            }
        }
    }

    /// Replaces the owner-controlled bits and releases `BUSY`. `set`/`clear`
    /// are applied atomically with the release. Returns true if the fault
    /// handler was waiting for this release.
    pub fn release(&self, page: usize, set: u32, clear: u32) -> bool {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            debug_assert!(cur & BUSY != 0, "release of page {page} not owned");
            let new = ((cur | set) & !clear) & !(BUSY | WAITER | DIRTY_SEEN);
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return cur & WAITER != 0,
                Err(c) => cur = c,
            }
        }
    }

    /// Sets the shadow generation of an owned page.
    pub fn set_generation(&self, page: usize, generation: u16) {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let new = (cur & 0xffff) | ((generation as u32) << GEN_SHIFT);
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(c) => cur = c,
            }
        }
    }

    /// Consumes one harvested dirty bit: bumps the saturating write count and
    /// either notes `DIRTY_SEEN` for the page's owner, or, if the page is free
    /// and has a shadow, takes ownership so the harvester can invalidate it.
    pub fn consume_dirty(&self, page: usize) -> Consumed {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let mut new = cur;
            if write_count_of(cur) < u8::MAX {
                new += 1 << WCOUNT_SHIFT;
            }
            let owned = cur & BUSY == 0 && cur & SHADOW != 0;
            if cur & BUSY != 0 {
                new |= DIRTY_SEEN;
            } else if owned {
                new |= BUSY;
                new &= !DIRTY_SEEN;
            }
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if owned => return Consumed::OwnedForInvalidation(new),
                Ok(_) => return Consumed::Noted,
                Err(c) => cur = c,
            }
        }
    }

    /// Marks `page` as left unarmed; returns true if it was armed before
    /// (the dirty bit seen now is a new write), counting that write.
    pub fn mark_unarmed(&self, page: usize) -> bool {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur & UNARMED != 0 {
                return false;
            }
            let mut new = cur | UNARMED;
            if write_count_of(cur) < u8::MAX {
                new += 1 << WCOUNT_SHIFT;
            }
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// Notes that `page`'s dirty bit was re-armed.
    pub fn clear_unarmed(&self, page: usize) {
        self.words[page].fetch_and(!UNARMED, Ordering::AcqRel);
    }

    /// Forgets writes consumed so far for an owned page.
    pub fn clear_dirty_seen(&self, page: usize) {
        self.words[page].fetch_and(!DIRTY_SEEN, Ordering::AcqRel);
    }

    /// Sets `WAITER` if the page is `BUSY`. Returns the word seen (check its
    /// `BUSY` bit to know whether the flag was set).
    pub fn wait_if_busy(&self, page: usize) -> u32 {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur & BUSY == 0 {
                return cur;
            }
            match w.compare_exchange_weak(cur, cur | WAITER, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return cur,
                Err(c) => cur = c,
            }
        }
    }

    /// Takes (and resets) the write count of `page`.
    pub fn take_write_count(&self, page: usize) -> u8 {
        let old = self.words[page].fetch_and(!WCOUNT_MASK, Ordering::AcqRel);
        write_count_of(old)
    }
}
