//! The per-page map: one `AtomicU64` per guest page, the single source of
//! truth for where each guest page lives and who may touch it.
//!
//! An all-zero word is a guest page that was never touched: it has no host
//! page and no tier (lazy commit). The map is allocated zeroed, so a 64 GiB
//! guest's map costs nothing until pages are used.
//!
//! Layout of a word:
//! - bits 0..3: tier of the guest page (valid with `POPULATED`);
//! - bit 3: `POPULATED`, the guest page has a host page (on its tier);
//! - bit 4: `SHADOW`, a copy of this page sits in its shadow slot;
//! - bits 5..8: tier of that shadow (valid with `SHADOW`);
//! - bit 8: `BUSY`, a mover owns the page (it may be unmapped right now);
//! - bit 9: `PARKED`, the page sits in its parking slot (hint-fault sampling);
//! - bit 10: `DIRTY_SEEN`, the harvester consumed a dirty bit while `BUSY`;
//! - bit 11: `WAITER`, the fault handler waits for the owner to release;
//! - bit 12: `UNARMED`, the page's dirty bit is left set in the log on purpose
//!   (nobody tracks its writes, so it stays writable without faults);
//! - bit 13: `PROBE`, a parked page is an accessed-bit probe, not a sampler
//!   window page (each side maps back only its own pages);
//! - bits 16..24: saturating write count (dirty harvests that saw the page);
//! - bits 32..64: shadow generation (orders shadows for oldest-first reclaim).
//!
//! Only an owner (`BUSY`) changes the tier, `POPULATED` and shadow fields, and
//! it does so in [`PageMap::release`], which returns the old and new words so
//! that the per-tier counts can follow every change in one place
//! (`TieredMemory::release_page`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::vocab::TierId;

const TIER_MASK: u64 = 0b111;
/// The guest page has a host page (on the tier in bits 0..3).
pub const POPULATED: u64 = 1 << 3;
/// A copy of the page sits in its shadow slot.
pub const SHADOW: u64 = 1 << 4;
const SHADOW_TIER_SHIFT: u32 = 5;
const SHADOW_TIER_MASK: u64 = 0b111 << SHADOW_TIER_SHIFT;
/// A mover owns the page.
pub const BUSY: u64 = 1 << 8;
/// The page sits in the parking area (hint-fault sampling).
pub const PARKED: u64 = 1 << 9;
/// A dirty bit was consumed while the page was `BUSY`.
pub const DIRTY_SEEN: u64 = 1 << 10;
/// The fault handler waits for the page's release.
pub const WAITER: u64 = 1 << 11;
/// The page's dirty bit is deliberately left set (not re-armed).
pub const UNARMED: u64 = 1 << 12;
/// With `PARKED`: parked as an accessed-bit probe.
pub const PROBE: u64 = 1 << 13;
const WCOUNT_SHIFT: u32 = 16;
const WCOUNT_MASK: u64 = 0xff << WCOUNT_SHIFT;
const GEN_SHIFT: u32 = 32;

/// Bits that place a guest page on `tier` (to `set` on release; `clear`
/// [`PLACEMENT_BITS`] at the same time).
pub fn on_tier(tier: TierId) -> u64 {
    POPULATED | (u64::from(tier) & TIER_MASK)
}

/// Bits that give a page a shadow on `tier` (clear [`SHADOW_BITS`] with them).
pub fn shadow_on(tier: TierId) -> u64 {
    SHADOW | ((u64::from(tier) << SHADOW_TIER_SHIFT) & SHADOW_TIER_MASK)
}

/// The tier and `POPULATED` bits.
pub const PLACEMENT_BITS: u64 = TIER_MASK | POPULATED;
/// The shadow flag and shadow tier bits.
pub const SHADOW_BITS: u64 = SHADOW | SHADOW_TIER_MASK;

/// Tier of the guest page in a word (`None`: never touched).
pub fn tier_of(word: u64) -> Option<TierId> {
    (word & POPULATED != 0).then_some((word & TIER_MASK) as TierId)
}

/// Tier of the page's shadow (`None`: no shadow).
pub fn shadow_tier_of(word: u64) -> Option<TierId> {
    (word & SHADOW != 0).then_some(((word & SHADOW_TIER_MASK) >> SHADOW_TIER_SHIFT) as TierId)
}

/// Write count encoded in a state word.
pub fn write_count_of(word: u64) -> u8 {
    ((word & WCOUNT_MASK) >> WCOUNT_SHIFT) as u8
}

/// Shadow generation encoded in a state word.
pub fn generation_of(word: u64) -> u32 {
    (word >> GEN_SHIFT) as u32
}

/// What consuming a dirty bit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// Counted (and noted as `DIRTY_SEEN` if the page had an owner).
    Noted,
    /// The page had a shadow and no owner: the caller now owns it and must
    /// invalidate the shadow and release it. Carries the new word.
    OwnedForInvalidation(u64),
}

/// Per-page state words.
#[derive(Debug)]
pub struct PageMap {
    words: Box<[AtomicU64]>,
}

impl PageMap {
    /// A map of `pages` never-touched pages. The memory comes zeroed from
    /// the allocator (`calloc`), so untouched parts of the map cost nothing.
    pub fn new(pages: usize) -> std::io::Result<Self> {
        Ok(Self {
            words: crate::sys::zeroed_atomics(pages)?,
        })
    }

    /// Current word of `page`.
    pub fn load(&self, page: usize) -> u64 {
        self.words[page].load(Ordering::Acquire)
    }

    /// Tries to take ownership of `page`: succeeds if neither `BUSY` nor
    /// (unless `allow_parked`) `PARKED`. Clears `DIRTY_SEEN`. Returns the word
    /// before the change.
    pub fn try_acquire(&self, page: usize, allow_parked: bool) -> Option<u64> {
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

    /// Like [`release`](Self::release), but refuses (returning the current
    /// word) when the page would keep a shadow although a harvest noted a
    /// write while it was owned (`DIRTY_SEEN`): that shadow is stale, and
    /// releasing would hide the write from the shadow's dirty tracking (the
    /// write's dirty bit was consumed for the owner, who may not look).
    pub fn release_unless_stale_shadow(
        &self,
        page: usize,
        set: u64,
        clear: u64,
    ) -> Result<(u64, u64), u64> {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            debug_assert!(cur & BUSY != 0, "release of page {page} not owned");
            let kept = (cur & !clear) | set;
            if cur & DIRTY_SEEN != 0 && kept & SHADOW != 0 {
                return Err(cur);
            }
            let new = kept & !(BUSY | WAITER | DIRTY_SEEN);
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok((cur, new)),
                Err(c) => cur = c,
            }
        }
    }

    /// Applies `set`/`clear` and releases `BUSY`, atomically. Returns the
    /// words before and after (`WAITER` in the old word: the fault handler
    /// was waiting for this release).
    #[cfg(test)]
    pub fn release(&self, page: usize, set: u64, clear: u64) -> (u64, u64) {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            debug_assert!(cur & BUSY != 0, "release of page {page} not owned");
            let new = ((cur & !clear) | set) & !(BUSY | WAITER | DIRTY_SEEN);
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (cur, new),
                Err(c) => cur = c,
            }
        }
    }

    /// Sets the shadow generation of an owned page.
    pub fn set_generation(&self, page: usize, generation: u32) {
        let w = &self.words[page];
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let new = (cur & 0xffff_ffff) | (u64::from(generation) << GEN_SHIFT);
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

    /// Marks `page` as left unarmed without counting a write.
    pub fn mark_unarmed_uncounted(&self, page: usize) {
        self.words[page].fetch_or(UNARMED, Ordering::AcqRel);
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
    pub fn wait_if_busy(&self, page: usize) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_page_is_untouched_and_placement_round_trips() {
        let m = PageMap::new(4).unwrap();
        assert_eq!(tier_of(m.load(0)), None);
        assert_eq!(shadow_tier_of(m.load(0)), None);
        m.try_acquire(0, false).unwrap();
        let (old, new) = m.release(0, on_tier(5) | shadow_on(7), PLACEMENT_BITS | SHADOW_BITS);
        assert_eq!(tier_of(old), None);
        assert_eq!(tier_of(new), Some(5));
        assert_eq!(shadow_tier_of(new), Some(7));
        m.try_acquire(0, false).unwrap();
        let (_, new) = m.release(0, on_tier(2), PLACEMENT_BITS | SHADOW_BITS);
        assert_eq!((tier_of(new), shadow_tier_of(new)), (Some(2), None));
    }

    #[test]
    fn ownership_excludes_and_release_reports_waiters() {
        let m = PageMap::new(2).unwrap();
        assert!(m.try_acquire(1, false).is_some());
        assert!(m.try_acquire(1, true).is_none());
        assert_ne!(m.wait_if_busy(1) & BUSY, 0);
        let (old, new) = m.release(1, 0, 0);
        assert_ne!(old & WAITER, 0);
        assert_eq!(new & (BUSY | WAITER), 0);
    }

    #[test]
    fn generation_and_write_count_do_not_touch_placement() {
        let m = PageMap::new(1).unwrap();
        m.try_acquire(0, false).unwrap();
        m.release(0, on_tier(1) | shadow_on(3), 0);
        m.set_generation(0, u32::MAX);
        for _ in 0..300 {
            m.mark_unarmed(0);
            m.clear_unarmed(0);
        }
        let w = m.load(0);
        assert_eq!(generation_of(w), u32::MAX);
        assert_eq!(write_count_of(w), 255);
        assert_eq!((tier_of(w), shadow_tier_of(w)), (Some(1), Some(3)));
    }

    #[test]
    fn field_helpers_read_and_write_exactly_their_bits() {
        for t in 0..8u8 {
            assert_eq!(on_tier(t), POPULATED | u64::from(t));
            assert_eq!(shadow_on(t), SHADOW | (u64::from(t) << 5));
            assert_eq!(tier_of(on_tier(t)), Some(t));
            assert_eq!(shadow_tier_of(shadow_on(t)), Some(t));
        }
        // A tier past 3 bits wraps inside its field, never into a flag.
        assert_eq!(on_tier(9), POPULATED | 1);
        assert_eq!(shadow_on(9), SHADOW | (1 << 5));
        // Every other bit set: each reader sees only its own field.
        let all = u64::MAX;
        assert_eq!(tier_of(all), Some(7));
        assert_eq!(shadow_tier_of(all), Some(7));
        assert_eq!(write_count_of(all), 255);
        assert_eq!(generation_of(all), u32::MAX);
        let none = !(POPULATED | SHADOW);
        assert_eq!((tier_of(none), shadow_tier_of(none)), (None, None));
        let w = (5u64 << 16) | (3u64 << 32) | POPULATED | 2 | shadow_on(6);
        assert_eq!(write_count_of(w), 5);
        assert_eq!(generation_of(w), 3);
        assert_eq!((tier_of(w), shadow_tier_of(w)), (Some(2), Some(6)));
        assert_eq!(PLACEMENT_BITS, 0b1111);
        assert_eq!(SHADOW_BITS, 0b1111 << 4);
    }

    /// A map of two pages whose page 0 holds `word`.
    fn map_with(word: u64) -> PageMap {
        let m = PageMap::new(2).unwrap();
        m.words[0].store(word, Ordering::Release);
        m
    }

    #[test]
    fn acquire_takes_free_pages_and_parked_ones_only_when_allowed() {
        let base = on_tier(1) | shadow_on(2) | (4 << 16) | (9 << 32);
        let m = map_with(base | DIRTY_SEEN | WAITER);
        assert_eq!(m.try_acquire(0, false), Some(base | DIRTY_SEEN | WAITER));
        assert_eq!(m.load(0), base | WAITER | BUSY);
        assert_eq!(m.try_acquire(0, true), None);
        assert_eq!(m.try_acquire(0, false), None);
        assert_eq!(m.load(0), base | WAITER | BUSY);
        let m = map_with(base | PARKED);
        assert_eq!(m.try_acquire(0, false), None);
        assert_eq!(m.load(0), base | PARKED);
        assert_eq!(m.try_acquire(0, true), Some(base | PARKED));
        assert_eq!(m.load(0), base | PARKED | BUSY);
        assert_eq!(m.load(1), 0);
    }

    #[test]
    fn release_refuses_only_a_kept_shadow_with_a_write_seen() {
        let base = on_tier(1) | shadow_on(2) | (4 << 16);
        let owned = base | BUSY | WAITER;
        // No write seen: released, `set` applied after `clear`.
        let m = map_with(owned);
        let r = m.release_unless_stale_shadow(0, on_tier(3), PLACEMENT_BITS);
        assert_eq!(r, Ok((owned, on_tier(3) | shadow_on(2) | (4 << 16))));
        assert_eq!(m.load(0), on_tier(3) | shadow_on(2) | (4 << 16));
        // A write seen and the shadow kept: refused, the word unchanged.
        let m = map_with(owned | DIRTY_SEEN);
        let r = m.release_unless_stale_shadow(0, 0, 0);
        assert_eq!(r, Err(owned | DIRTY_SEEN));
        assert_eq!(m.load(0), owned | DIRTY_SEEN);
        // A write seen, the shadow dropped: released, the flags cleared.
        let r = m.release_unless_stale_shadow(0, 0, SHADOW_BITS);
        assert_eq!(r, Ok((owned | DIRTY_SEEN, on_tier(1) | (4 << 16))));
        // A write seen, no shadow before, one set now: refused.
        let m = map_with(on_tier(1) | BUSY | DIRTY_SEEN);
        assert!(m.release_unless_stale_shadow(0, shadow_on(0), 0).is_err());
        // A write seen and no shadow at all: released.
        let r = m.release_unless_stale_shadow(0, 0, 0);
        assert_eq!(r, Ok((on_tier(1) | BUSY | DIRTY_SEEN, on_tier(1))));
        // Bits `set` that the word has already stay set.
        let m = map_with(on_tier(1) | PARKED | BUSY);
        let r = m.release_unless_stale_shadow(0, on_tier(1) | PARKED, 0);
        assert_eq!(r, Ok((on_tier(1) | PARKED | BUSY, on_tier(1) | PARKED)));
    }

    #[test]
    fn generation_keeps_the_low_half_of_the_word() {
        let low = 0xdead_beefu64;
        let m = map_with(low | (7 << 32));
        m.set_generation(0, 0x8000_0001);
        assert_eq!(m.load(0), low | (0x8000_0001u64 << 32));
        m.set_generation(0, 0);
        assert_eq!(m.load(0), low);
    }

    #[test]
    fn a_consumed_dirty_bit_counts_and_goes_to_the_owner_or_takes_a_shadow() {
        let base = on_tier(1) | (254 << 16);
        // Owned: counted, noted as seen by the owner.
        let m = map_with(base | BUSY | shadow_on(2));
        assert_eq!(m.consume_dirty(0), Consumed::Noted);
        assert_eq!(
            m.load(0),
            on_tier(1) | (255 << 16) | BUSY | shadow_on(2) | DIRTY_SEEN
        );
        // Saturated: the count stays, no carry into the generation.
        assert_eq!(m.consume_dirty(0), Consumed::Noted);
        assert_eq!(
            m.load(0),
            on_tier(1) | (255 << 16) | BUSY | shadow_on(2) | DIRTY_SEEN
        );
        // Free with a shadow: taken for invalidation, the new word returned.
        let m = map_with(base | shadow_on(2) | DIRTY_SEEN);
        let want = on_tier(1) | (255 << 16) | shadow_on(2) | BUSY;
        assert_eq!(m.consume_dirty(0), Consumed::OwnedForInvalidation(want));
        assert_eq!(m.load(0), want);
        // Free without a shadow: counted only.
        let m = map_with(on_tier(1));
        assert_eq!(m.consume_dirty(0), Consumed::Noted);
        assert_eq!(m.load(0), on_tier(1) | (1 << 16));
    }

    #[test]
    fn unarmed_marks_count_once_and_flag_helpers_touch_one_bit() {
        let m = map_with(on_tier(1) | (254 << 16));
        assert!(m.mark_unarmed(0));
        assert_eq!(m.load(0), on_tier(1) | (255 << 16) | UNARMED);
        assert!(!m.mark_unarmed(0));
        assert_eq!(m.load(0), on_tier(1) | (255 << 16) | UNARMED);
        m.clear_unarmed(0);
        assert!(m.mark_unarmed(0), "saturated: flagged, not counted");
        assert_eq!(m.load(0), on_tier(1) | (255 << 16) | UNARMED);
        m.clear_unarmed(0);
        assert_eq!(m.load(0), on_tier(1) | (255 << 16));
        m.mark_unarmed_uncounted(0);
        assert_eq!(m.load(0), on_tier(1) | (255 << 16) | UNARMED);
        assert_eq!(m.take_write_count(0), 255);
        assert_eq!(m.load(0), on_tier(1) | UNARMED);
        assert_eq!(m.take_write_count(0), 0);
        let m = map_with(on_tier(1) | BUSY | DIRTY_SEEN | WAITER);
        m.clear_dirty_seen(0);
        assert_eq!(m.load(0), on_tier(1) | BUSY | WAITER);
    }

    #[test]
    fn wait_if_busy_flags_only_an_owned_page() {
        let m = map_with(on_tier(1) | PARKED);
        assert_eq!(m.wait_if_busy(0), on_tier(1) | PARKED);
        assert_eq!(m.load(0), on_tier(1) | PARKED);
        let m = map_with(on_tier(1) | BUSY);
        assert_eq!(m.wait_if_busy(0), on_tier(1) | BUSY);
        assert_eq!(m.load(0), on_tier(1) | BUSY | WAITER);
        // A second waiter (the handler waits again) keeps the flag.
        assert_eq!(m.wait_if_busy(0), on_tier(1) | BUSY | WAITER);
        assert_eq!(m.load(0), on_tier(1) | BUSY | WAITER);
    }
}
