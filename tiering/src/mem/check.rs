//! End-of-run checks of a tiered memory: the bookkeeping against what the
//! kernel says (`check_consistency`), and every page's NUMA node against its
//! tier (`check_nodes`).

use super::page_map::{self, BUSY, PARKED};
use super::TieredMemory;
use crate::sys::{self, PAGE_SIZE};
use crate::vocab::TierId;

/// A page off its tier's node, or the query that failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeCheckError {
    /// Reading page tables or `move_pages(2)` failed.
    #[error("querying page nodes")]
    Query(#[source] std::io::Error),
    /// A page is present in guest RAM but tiervm never committed it.
    #[error("page {page} is present on node {node} but was never committed")]
    NeverCommitted {
        /// Guest page.
        page: usize,
        /// Its node.
        node: i32,
    },
    /// A page is on another node than its tier's.
    #[error("page {page} is on node {node} but its tier {tier} is on node {want}")]
    WrongNode {
        /// Guest page.
        page: usize,
        /// Its node.
        node: i32,
        /// Its tier's name.
        tier: String,
        /// The tier's node.
        want: i32,
    },
}

/// The first violation of the bookkeeping (see [`TieredMemory::check_consistency`]).
#[derive(Debug, thiserror::Error)]
pub enum ConsistencyError {
    /// Reading page tables failed.
    #[error("reading page tables")]
    Scan(#[source] std::io::Error),
    /// A page is still owned or parked.
    #[error("page {page} is still busy or parked (word {word:#x})")]
    BusyOrParked {
        /// Guest page.
        page: usize,
        /// Its page-map word.
        word: u64,
    },
    /// A page (or its shadow) is on a tier that does not exist.
    #[error("page {page} is on tier {tier} of {tiers}")]
    NoSuchTier {
        /// Guest page.
        page: usize,
        /// The tier.
        tier: TierId,
        /// How many tiers there are.
        tiers: usize,
    },
    /// Where a page should be (`what`), the kernel has nothing, or has a
    /// page where nothing should be.
    #[error("page {page}: {what}")]
    Residency {
        /// Guest page.
        page: usize,
        /// What disagrees.
        what: &'static str,
    },
    /// A tier's counts disagree with a recount of the page map.
    #[error("{tier}: counts say guest {guest} + shadows {shadows} but the page map has guest {map_guest} + shadows {map_shadows}")]
    Counts {
        /// Tier name.
        tier: String,
        /// Counted guest pages.
        guest: u64,
        /// Counted shadows.
        shadows: u64,
        /// Recounted guest pages.
        map_guest: u64,
        /// Recounted shadows.
        map_shadows: u64,
    },
    /// A pool slot the bookkeeping calls a hole holds a page (memory nobody
    /// accounts, and a move into it would fail).
    #[error("{tier}: pool slot {slot} is called a hole but holds a page")]
    PoolHole {
        /// Tier name.
        tier: String,
        /// The slot's index in the tier's pool area.
        slot: usize,
    },
    /// Capacity or pool slots are still reserved.
    #[error("{tier}: {what} still reserved ({n})")]
    Reserved {
        /// Tier name.
        tier: String,
        /// Capacity or pool slots.
        what: &'static str,
        /// How many.
        n: u64,
    },
}

/// Which of a page's slots the kernel has a page in.
struct Present {
    guest: Vec<u64>,
    shadow: Vec<u64>,
    park: Vec<u64>,
}

fn bit(v: &[u64], p: usize) -> bool {
    v[p / 64] >> (p % 64) & 1 != 0
}

impl TieredMemory {
    /// Checks that every present guest page sits on its tier's node
    /// (`move_pages` query). Meaningful only when the tiers are distinct
    /// nodes; with emulated tiers it checks that every page is on the node.
    /// Returns the number of pages checked, or the first mismatch.
    pub fn check_nodes(&self) -> Result<usize, NodeCheckError> {
        // Only present pages can be on a node: query the present ranges.
        let mut present = Vec::new();
        let g = self.layout.guest;
        self.scanner
            .scan(g, g + self.guest_len(), |s, e, _| present.push((s, e)))
            .map_err(NodeCheckError::Query)?;
        let mut checked = 0;
        for (s, e) in present {
            let pages: Vec<usize> = ((s - g) / PAGE_SIZE..(e - g) / PAGE_SIZE).collect();
            for batch in pages.chunks(1 << 16) {
                let addrs: Vec<usize> = batch.iter().map(|&p| self.guest_addr(p)).collect();
                let nodes = sys::query_nodes(&addrs).map_err(NodeCheckError::Query)?;
                for (&page, node) in batch.iter().zip(nodes) {
                    if node < 0 {
                        continue; // the shared zero page, or gone meanwhile
                    }
                    let Some(t) = page_map::tier_of(self.pages.load(page)) else {
                        return Err(NodeCheckError::NeverCommitted { page, node });
                    };
                    let want = self.node(t) as i32;
                    if node != want {
                        return Err(NodeCheckError::WrongNode {
                            page,
                            node,
                            tier: self.tiers[usize::from(t)].spec.name.clone(),
                            want,
                        });
                    }
                    checked += 1;
                }
            }
        }
        Ok(checked)
    }

    /// Checks, while no mover runs, that every page is accounted for exactly
    /// once: (1) every populated guest page is present in guest RAM, every
    /// shadow in its shadow slot, and nothing else is, and nothing is parked
    /// or owned; (2) the live per-tier counts equal a recount of the page map;
    /// (3) no capacity and no pool slot is reserved; (4) no pool slot called
    /// a hole holds a page (a cached slot may be empty: that costs a fresh
    /// page later, not a failed move). Returns the first violation. (Guest pages + shadows may exceed a tier's capacity: a
    /// shrink lowers the capacity first and converges after.)
    pub fn check_consistency(&self) -> Result<(), ConsistencyError> {
        let present = self.present_slots()?;
        let (guest, shadows) = self.recount_against(&present)?;
        self.check_accounts(&guest, &shadows)?;
        self.check_pool_holes()
    }

    /// Step 4: every slot a pool calls a hole is empty.
    fn check_pool_holes(&self) -> Result<(), ConsistencyError> {
        for (i, t) in self.tiers.iter().enumerate() {
            let bits = self.present_bits(self.layout.pools[i], self.layout.pool_slots[i])?;
            let stray = self
                .pool(i as TierId)
                .holes()
                .find(|s| bit(&bits, s.index()));
            if let Some(slot) = stray {
                return Err(ConsistencyError::PoolHole {
                    tier: t.spec.name.clone(),
                    slot: slot.index(),
                });
            }
        }
        Ok(())
    }

    /// Which of the `pages` pages from `base` the kernel has a page in, a
    /// bit each.
    fn present_bits(&self, base: usize, pages: usize) -> Result<Vec<u64>, ConsistencyError> {
        let mut bits = vec![0u64; pages.div_ceil(64)];
        self.scanner
            .scan(base, base + pages * PAGE_SIZE, |s, e, _| {
                for p in (s - base) / PAGE_SIZE..(e - base) / PAGE_SIZE {
                    bits[p / 64] |= 1 << (p % 64);
                }
            })
            .map_err(ConsistencyError::Scan)?;
        Ok(bits)
    }

    /// Step 0: the kernel's view of the guest, shadow and parking areas.
    fn present_slots(&self) -> Result<Present, ConsistencyError> {
        let scan = |base: usize| self.present_bits(base, self.guest_pages);
        Ok(Present {
            guest: scan(self.layout.guest)?,
            shadow: scan(self.layout.shadow)?,
            park: scan(self.layout.park)?,
        })
    }

    /// Steps 1 and 2: every page against the kernel; returns the recount
    /// (guest pages, shadows) per tier.
    fn recount_against(&self, k: &Present) -> Result<(Vec<u64>, Vec<u64>), ConsistencyError> {
        let n = self.tier_count();
        let (mut guest, mut shadows) = (vec![0u64; n], vec![0u64; n]);
        let residency = |page, what| Err(ConsistencyError::Residency { page, what });
        for page in 0..self.guest_pages {
            let word = self.pages.load(page);
            if word & (BUSY | PARKED) != 0 {
                return Err(ConsistencyError::BusyOrParked { page, word });
            }
            let no_tier = |tier| ConsistencyError::NoSuchTier {
                page,
                tier,
                tiers: n,
            };
            match page_map::tier_of(word) {
                Some(t) if usize::from(t) >= n => return Err(no_tier(t)),
                Some(_) if !bit(&k.guest, page) => {
                    return residency(page, "populated but not present in guest RAM")
                }
                Some(t) => guest[usize::from(t)] += 1,
                None if bit(&k.guest, page) => {
                    return residency(page, "present in guest RAM but never committed")
                }
                None => {}
            }
            match page_map::shadow_tier_of(word) {
                Some(t) if usize::from(t) >= n => return Err(no_tier(t)),
                Some(_) if !bit(&k.shadow, page) => {
                    return residency(page, "its shadow is not present")
                }
                Some(t) => shadows[usize::from(t)] += 1,
                None if bit(&k.shadow, page) => {
                    return residency(page, "its shadow slot holds a page but it has no shadow")
                }
                None => {}
            }
            if bit(&k.park, page) {
                return residency(page, "its parking slot holds a page");
            }
        }
        Ok((guest, shadows))
    }

    /// Steps 2 and 3: the live counts and reservations of every tier.
    fn check_accounts(&self, guest: &[u64], shadows: &[u64]) -> Result<(), ConsistencyError> {
        for (i, t) in self.tiers.iter().enumerate() {
            let tier = || t.spec.name.clone();
            if t.reserved() != 0 {
                return Err(ConsistencyError::Reserved {
                    tier: tier(),
                    what: "capacity pages",
                    n: t.reserved(),
                });
            }
            if t.guest() != guest[i] || t.shadows() != shadows[i] {
                return Err(ConsistencyError::Counts {
                    tier: tier(),
                    guest: t.guest(),
                    shadows: t.shadows(),
                    map_guest: guest[i],
                    map_shadows: shadows[i],
                });
            }
            let pool = self.pool(i as TierId);
            if pool.unreserved_slots() != pool.slots() {
                return Err(ConsistencyError::Reserved {
                    tier: tier(),
                    what: "pool slots",
                    n: (pool.slots() - pool.unreserved_slots()) as u64,
                });
            }
        }
        Ok(())
    }
}
