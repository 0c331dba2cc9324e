//! Capacity accounting per tier: how many pages a VM may hold on a tier
//! (its capacity, changeable while the VM runs) and how many it holds.
//!
//! A tier's *used* pages are its guest pages, its shadows, and the pages
//! movers reserved for work in flight (staging of a migration into the tier,
//! a first touch being committed). Every increase of guest pages or shadows
//! is covered by a reservation made first, and the reservation is given back
//! only after the page counts moved, so `used <= capacity` holds at every
//! instant for growth (a transient double count is conservative). A shrink
//! only lowers the capacity: `used` may then exceed it until the resize
//! demotes pages ([`super::TieredMemory::resize`]).
//!
//! Guest-page and shadow counts change in exactly one place,
//! `TieredMemory::release_page`, from the old and new page-map words. A
//! release updates the word first and the counts after it, so two releases
//! of one page in a row can apply their counts in the other order: a count
//! may then dip one below its true value for that moment (below zero for
//! an empty tier). The counts are signed for that reason and read as at
//! least zero; every change is applied exactly once, so they settle on the
//! true values.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::vocab::TierId;

/// One tier of a VM: where it lives and what it may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSpec {
    /// Name for reports (`fast`, `slow`, `cxl`, ...).
    pub name: String,
    /// Host NUMA node backing the tier.
    pub node: u32,
    /// Capacity in 4 KiB pages at start.
    pub capacity_pages: usize,
    /// Largest capacity a resize may set (the tier's address-space
    /// reservation); at least `capacity_pages`.
    pub max_capacity_pages: usize,
}

/// Live counters of one tier.
#[derive(Debug)]
pub(crate) struct TierAccount {
    pub(crate) spec: TierSpec,
    capacity: AtomicU64,
    /// Signed: see the module docs (a transient dip below zero).
    guest: AtomicI64,
    shadows: AtomicI64,
    reserved: AtomicU64,
}

impl TierAccount {
    pub(crate) fn new(spec: TierSpec) -> Self {
        Self {
            capacity: AtomicU64::new(spec.capacity_pages as u64),
            spec,
            guest: AtomicI64::new(0),
            shadows: AtomicI64::new(0),
            reserved: AtomicU64::new(0),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }
    pub(crate) fn guest(&self) -> u64 {
        at_least_zero(self.guest.load(Ordering::Acquire))
    }
    pub(crate) fn shadows(&self) -> u64 {
        at_least_zero(self.shadows.load(Ordering::Acquire))
    }
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }
    /// Guest pages + shadows + reservations.
    pub(crate) fn used(&self) -> u64 {
        self.guest() + self.shadows() + self.reserved()
    }
    /// Pages that can still be reserved.
    pub(crate) fn free(&self) -> u64 {
        self.capacity().saturating_sub(self.used())
    }
    /// Pages above the capacity (after a shrink, before it converged).
    pub(crate) fn excess(&self) -> u64 {
        (self.guest() + self.shadows()).saturating_sub(self.capacity())
    }

    /// Reserves `n` pages if they fit under the capacity.
    pub(crate) fn try_reserve(&self, n: u64) -> bool {
        let mut cur = self.reserved.load(Ordering::Acquire);
        loop {
            let used = self.guest() + self.shadows() + cur;
            if used.saturating_add(n) > self.capacity() {
                return false;
            }
            match self.reserved.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// Gives back `n` reserved pages.
    pub(crate) fn unreserve(&self, n: u64) {
        let prev = self.reserved.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(prev >= n, "unreserve of {n} with {prev} reserved");
    }

    /// Sets the capacity (bounded by the reservation made at creation).
    pub(crate) fn set_capacity(&self, pages: u64) -> u64 {
        let p = pages.min(self.spec.max_capacity_pages as u64);
        self.capacity.store(p, Ordering::Release);
        p
    }

    pub(crate) fn add_guest(&self, delta: i64) {
        add(&self.guest, delta)
    }
    pub(crate) fn add_shadows(&self, delta: i64) {
        add(&self.shadows, delta)
    }
}

fn add(a: &AtomicI64, delta: i64) {
    a.fetch_add(delta, Ordering::AcqRel);
}

/// A signed count read as a page count: a transient dip below zero (module
/// docs) reads as zero.
fn at_least_zero(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Applies the change of one page's word to the tiers' counts.
pub(crate) fn apply_word_change(tiers: &[TierAccount], old: u64, new: u64) {
    use super::page_map::{shadow_tier_of, tier_of};
    let (ot, nt) = (tier_of(old), tier_of(new));
    if ot != nt {
        if let Some(t) = nt.and_then(|t| tiers.get(usize::from(t))) {
            t.add_guest(1);
        }
        if let Some(t) = ot.and_then(|t| tiers.get(usize::from(t))) {
            t.add_guest(-1);
        }
    }
    let (os, ns) = (shadow_tier_of(old), shadow_tier_of(new));
    if os != ns {
        if let Some(t) = ns.and_then(|t| tiers.get(usize::from(t))) {
            t.add_shadows(1);
        }
        if let Some(t) = os.and_then(|t| tiers.get(usize::from(t))) {
            t.add_shadows(-1);
        }
    }
}

/// Tier ids, fastest first.
pub(crate) fn tier_ids(n: usize) -> impl Iterator<Item = TierId> {
    (0..n).map(|t| t as TierId)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::page_map::{on_tier, shadow_on};

    fn tier(cap: usize) -> TierAccount {
        TierAccount::new(TierSpec {
            name: "t".into(),
            node: 0,
            capacity_pages: cap,
            max_capacity_pages: 2 * cap,
        })
    }

    #[test]
    fn reservations_stop_at_capacity_and_follow_resizes() {
        let t = tier(10);
        assert!(t.try_reserve(6));
        assert!(!t.try_reserve(5));
        assert!(t.try_reserve(4));
        assert_eq!(t.free(), 0);
        t.unreserve(10);
        assert_eq!(t.set_capacity(1000), 20, "bounded by the reservation");
        t.add_guest(15);
        assert_eq!(t.set_capacity(5), 5);
        assert_eq!(t.excess(), 10);
        assert!(!t.try_reserve(1));
    }

    #[test]
    fn word_changes_move_counts_between_tiers() {
        let tiers = [tier(10), tier(10)];
        apply_word_change(&tiers, 0, on_tier(1));
        assert_eq!((tiers[0].guest(), tiers[1].guest()), (0, 1));
        // Promotion keeping a shadow on tier 1.
        apply_word_change(&tiers, on_tier(1), on_tier(0) | shadow_on(1));
        assert_eq!((tiers[0].guest(), tiers[1].guest()), (1, 0));
        assert_eq!((tiers[0].shadows(), tiers[1].shadows()), (0, 1));
        // Shadow demotion.
        apply_word_change(&tiers, on_tier(0) | shadow_on(1), on_tier(1));
        assert_eq!((tiers[1].guest(), tiers[1].shadows()), (1, 0));
    }

    /// Two releases of one page, tier 1 -> 0 then 0 -> 1, whose count
    /// updates land in the other order: tier 0 dips below zero for a
    /// moment. It reads as 0 (not 2^64 - 1: no huge `used` or `excess`, no
    /// `free` of 0 from a wrapped count) and the counts settle exactly.
    #[test]
    fn counts_applied_out_of_order_read_as_zero_and_settle() {
        let tiers = [tier(10), tier(10)];
        apply_word_change(&tiers, 0, on_tier(1));
        apply_word_change(&tiers, on_tier(0), on_tier(1)); // the second release first
        assert_eq!(tiers[0].guest(), 0);
        assert_eq!(
            (tiers[0].used(), tiers[0].excess(), tiers[0].free()),
            (0, 0, 10)
        );
        assert_eq!(tiers[1].guest(), 2);
        apply_word_change(&tiers, on_tier(1), on_tier(0)); // then the first
        assert_eq!((tiers[0].guest(), tiers[1].guest()), (0, 1));
        // Shadows the same way.
        apply_word_change(&tiers, on_tier(0) | shadow_on(1), on_tier(0));
        assert_eq!(tiers[1].shadows(), 0);
        apply_word_change(&tiers, on_tier(0), on_tier(0) | shadow_on(1));
        assert_eq!(tiers[1].shadows(), 0);
    }

    #[test]
    fn used_free_and_excess_count_guest_pages_shadows_and_reservations() {
        let t = tier(10);
        t.add_guest(3);
        t.add_shadows(2);
        assert!(t.try_reserve(4));
        assert_eq!((t.guest(), t.shadows(), t.reserved()), (3, 2, 4));
        assert_eq!((t.used(), t.free(), t.excess()), (9, 1, 0));
        assert!(!t.try_reserve(2), "one page over");
        assert!(t.try_reserve(1), "exactly the last page");
        assert_eq!((t.used(), t.free()), (10, 0));
        assert_eq!(t.set_capacity(4), 4);
        assert_eq!(
            t.excess(),
            1,
            "guest 3 + shadows 2 over 4; reservations are not excess"
        );
        t.unreserve(5);
        assert_eq!((t.reserved(), t.used()), (0, 5));
        t.add_shadows(-2);
        t.add_guest(-1);
        assert_eq!((t.guest(), t.shadows(), t.capacity()), (2, 0, 4));
        assert_eq!(tier_ids(3).collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn word_changes_count_once_and_ignore_tiers_the_vm_does_not_have() {
        let tiers = [tier(10), tier(10)];
        // A shadow moved from tier 0 to tier 1, the page staying on tier 1.
        apply_word_change(&tiers, on_tier(1) | shadow_on(0), on_tier(1) | shadow_on(1));
        assert_eq!((tiers[0].guest(), tiers[1].guest()), (0, 0));
        assert_eq!((tiers[0].shadows(), tiers[1].shadows()), (0, 1));
        // No change: nothing counted.
        apply_word_change(&tiers, on_tier(1), on_tier(1));
        assert_eq!(tiers[1].guest(), 0);
        // A tier past the VM's (a corrupt word): ignored, no panic.
        apply_word_change(&tiers, 0, on_tier(5) | shadow_on(6));
        let counts: Vec<_> = tiers.iter().map(|t| (t.guest(), t.shadows())).collect();
        assert_eq!(counts, vec![(0, 0), (0, 1)]);
        apply_word_change(&tiers, on_tier(5), on_tier(0));
        assert_eq!((tiers[0].guest(), tiers[0].shadows()), (1, 0));
    }
}
