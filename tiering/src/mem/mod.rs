//! Tiered guest memory and the migration mechanisms.
//!
//! Guest RAM is ONE private anonymous mapping; every 4 KiB guest page the
//! guest touched lives on one tier (a host NUMA node with a capacity in
//! pages, resizable while the VM runs). Nothing is committed up front:
//! a page gets host memory on its first touch, 2 MiB at a time where the
//! range is untouched, from the tier the placement picks ([`commit`]).
//! Each tier has a pool area bound to its node where staging pages are made
//! and freed pages are cached; a shadow area holds old copies of promoted
//! pages (Nomad's non-exclusive tiering) and a parking area holds pages
//! unmapped for hint-fault sampling. All areas share one userfaultfd, so
//! `UFFDIO_MOVE` can move pages between them with zero copy (a 2 MiB run as
//! one huge page). A per-page [`AtomicU64`](std::sync::atomic::AtomicU64)
//! word is the single source of truth for where a page is and who owns it.
//!
//! No KVM type appears here: the dirty log is the [`DirtyLog`] trait, which
//! `vmm` implements with `KVM_GET_DIRTY_LOG`/`KVM_CLEAR_DIRTY_LOG`.
//!
//! # Usage (from `vmm`)
//!
//! ```no_run
//! use std::sync::Arc;
//! use tiering::mem::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut cfg = MemConfig::new(1 << 30, 65536); // 1 GiB guest, 256 MiB fast
//! cfg.placement = InitialPlacement::Random { seed: 42 };
//! let mem = Arc::new(TieredMemory::new(&cfg)?);
//! // vmm: wrap (mem.guest_ptr(), mem.guest_len()) with MmapRegion::build_raw,
//! // create the memslot with KVM_MEM_LOG_DIRTY_PAGES after enabling
//! // KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, then hand in the KVM dirty log:
//! let log: Box<dyn DirtyLog> = Box::new(SoftDirtyLog::new(mem.guest_pages())); // KvmDirtyLog in vmm
//! let faults = FaultHandler::spawn(mem.clone())?; // serves first touches too
//! let migrator = Arc::new(Migrator::new(mem.clone(), log, MigratorConfig::default())?);
//! let chaos = ChaosDriver::spawn(migrator.clone(), ChaosConfig::default())?;
//! // ... run the guest; VMM writes to guest RAM go through
//! // mem.vmm_writes().write_guard(page, pages) ...
//! mem.resize(0, 16384)?; // the fast tier shrinks to 64 MiB while the guest runs
//! let report = chaos.stop()?;
//! faults.stop()?;
//! println!("{:?} {:?}", mem.stats(), report); // MemStats is serde-serializable
//! # Ok(()) }
//! ```

mod account;
mod backing;
mod chaos;
mod check;
pub mod commit;
mod dirty;
mod fault;
mod harvest;
mod migrate;
mod page_map;
mod park;
mod pool;
mod probe;
mod residency;
mod resize;
mod sampler;
mod shadow;
mod staging;
mod stats;
mod thp;
mod watch;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_planted;
#[cfg(test)]
mod tests_segments;

pub use crate::sys::PAGE_SIZE;
pub use crate::vocab::{Mechanism, TierId, Unit};
pub use account::TierSpec;
pub use backing::{
    FatalHook, FaultPathHook, GuestClock, InitialPlacement, MemConfig, PlacementObserver,
    TieredMemory, UnknownPlacement, DEFAULT_HOST_RESERVE_BYTES, DEFAULT_POOL_CACHE_PAGES,
};
pub use chaos::{ChaosConfig, ChaosDriver, ChaosReport, MAX_UNITS_PER_BATCH};
pub use check::{ConsistencyError, NodeCheckError};
pub use dirty::{DirtyLog, SoftDirtyLog, WriteGuard};
pub use fault::FaultHandler;
pub use harvest::DirtyHarvester;
pub use migrate::{BatchOutcome, Migrator, MigratorConfig, MAX_UNIT_PAGES};
pub use pool::Slot;
pub use probe::{AccessProbes, MEASURED_HINT_FAULT_GUEST_NS};
pub use residency::{Residency, TierResidency};
pub use resize::{
    parse_capacity_schedule, CapacityScheduleError, CapacityStep, ResizeConfig, ResizeDriver,
    ResizeDriverReport, ResizeHandle, ResizeReport,
};
pub use sampler::{
    HintSampler, SamplerAccount, SamplerConfig, SamplerHandle, SamplerTick, GUEST_COST_FACTOR,
    GUEST_COST_FACTOR_RANGE,
};
pub use stats::{BackingCounters, MemStats, MigrationCounters, TierStats};
pub use watch::{Activity, StallView, Unstick, WaitingFault};

/// One hint fault the fault handler recorded: the guest touched a parked
/// page. Raw data; the engine turns it into a policy's
/// [`HintFault`](crate::policy::HintFault) (adding the page's tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HintFaultRecord {
    /// Guest page touched.
    pub page: u64,
    /// Time from parking the window to the touch, ns.
    pub ns_since_park: u64,
    /// Faulting thread id (a vCPU thread under KVM; 0 if unknown).
    pub thread_id: u32,
    /// Whether the touch was a write.
    pub write: bool,
    /// The touch mapped back the page's whole 2 MiB range, parked as one
    /// huge page: like the accessed bit of a huge page table entry, it
    /// stands for every page of the range (which page of it was touched
    /// first is `page`).
    #[serde(default)]
    pub huge: bool,
}

/// Errors of the tiered memory.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Invalid configuration (the message names the fix).
    #[error(transparent)]
    Config(#[from] MemConfigError),
    /// A system call failed (the message names it).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A resize request that cannot be honoured (the message names the fix).
    #[error(transparent)]
    Resize(#[from] ResizeError),
}

/// A [`MemConfig`] that cannot be set up; each message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemConfigError {
    /// A guest size of 0 or one that is not page-aligned.
    #[error("guest size {0} is not a positive multiple of 4 KiB")]
    GuestSizeNotPages(usize),
    /// More guest pages than a 32-bit page index holds.
    #[error("guest RAM above 16 TiB is not supported")]
    GuestTooLarge,
    /// No tiers, or more than [`MAX_TIERS`].
    #[error("{0} tiers: tiervm supports 1 to {max}", max = crate::vocab::MAX_TIERS)]
    TierCount(usize),
    /// A tier whose maximum is below its capacity.
    #[error("tier {tier}: maximum capacity {max} pages is below its capacity {capacity} pages")]
    MaxBelowCapacity {
        /// The tier's name.
        tier: String,
        /// Its maximum capacity, pages.
        max: usize,
        /// Its capacity, pages.
        capacity: usize,
    },
    /// A tier larger than a 32-bit page count holds.
    #[error("tier {0}: capacity above 16 TiB")]
    TierTooLarge(String),
    /// A NUMA node id beyond what `mbind` takes.
    #[error(
        "tier {tier}: NUMA node {node} is out of range (below {})",
        crate::sys::MAX_NODES
    )]
    NodeOutOfRange {
        /// The tier's name.
        tier: String,
        /// The node.
        node: u32,
    },
    /// Tiers that together cannot hold the guest.
    #[error(
        "tier capacities ({total} pages together) are smaller than the guest ({guest} pages); \
         raise a tier's capacity (e.g. the slow tier's)"
    )]
    CapacitiesTooSmall {
        /// Their sum, pages.
        total: usize,
        /// The guest, pages.
        guest: usize,
    },
}

/// A resize the tiers cannot honour; each message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResizeError {
    /// No such tier.
    #[error("tier {tier} does not exist (this VM has {tiers} tiers)")]
    NoSuchTier {
        /// The tier asked for.
        tier: TierId,
        /// How many tiers the VM has.
        tiers: usize,
    },
    /// Beyond the tier's reservation.
    #[error("{pages} pages for tier {tier} exceed its maximum of {max} pages (set at creation)")]
    AboveMaximum {
        /// The tier's name.
        tier: String,
        /// Pages asked for.
        pages: usize,
        /// Its maximum.
        max: usize,
    },
    /// The tiers together could no longer hold the guest.
    #[error(
        "tier {tier} at {pages} pages would leave the tiers {total} pages together, fewer than \
         the guest's {guest} pages; grow another tier first"
    )]
    CannotHoldGuest {
        /// The tier's name.
        tier: String,
        /// Pages asked for.
        pages: usize,
        /// The tiers' sum after the resize.
        total: usize,
        /// The guest, pages.
        guest: usize,
    },
}
