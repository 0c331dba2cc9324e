//! Tiered guest memory and the migration mechanisms.
//!
//! Guest RAM is ONE private anonymous mapping whose every 4 KiB page lives
//! on one tier (a host NUMA node with a capacity in pages). Free pages of each
//! tier sit in a pool area bound to the tier's node; a shadow area holds slow
//! copies of promoted pages (Nomad's non-exclusive tiering) and a parking area
//! holds pages unmapped for hint-fault sampling. All areas share one
//! userfaultfd (MISSING mode, kernel faults included) so `UFFDIO_MOVE` can
//! move pages between them with zero copy. A per-page [`AtomicU32`] map is the
//! single source of truth (tier, shadow, owner, parked).
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
//! cfg.placement = Placement::Random { seed: 42 };
//! let mem = Arc::new(TieredMemory::new(&cfg)?);
//! // vmm: wrap (mem.guest_ptr(), mem.guest_len()) with MmapRegion::build_raw,
//! // create the memslot with KVM_MEM_LOG_DIRTY_PAGES after enabling
//! // KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, then hand in the KVM dirty log:
//! let log: Box<dyn DirtyLog> = Box::new(SoftDirtyLog::new(mem.guest_pages())); // KvmDirtyLog in vmm
//! let faults = FaultHandler::spawn(mem.clone())?;
//! let migrator = Arc::new(Migrator::new(mem.clone(), log, MigratorConfig::default())?);
//! let chaos = ChaosDriver::spawn(migrator.clone(), ChaosConfig::default())?;
//! // ... run the guest; VMM writes to guest RAM go through
//! // mem.vmm_writes().write_guard(page, pages) ...
//! let report = chaos.stop()?;
//! faults.stop()?;
//! println!("{:?} {:?}", mem.stats(), report); // MemStats is serde-serializable
//! # Ok(()) }
//! ```

mod backing;
mod chaos;
mod dirty;
mod fault;
mod harvest;
mod migrate;
mod page_map;
mod pool;
mod probe;
mod sampler;
mod stats;
mod sys;

#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU32;

pub use backing::{FaultPathHook, MemConfig, Placement, TieredMemory};
pub use chaos::{ChaosConfig, ChaosDriver, ChaosReport};
pub use dirty::{DirtyLog, SoftDirtyLog, WriteGuard};
pub use fault::FaultHandler;
pub use harvest::DirtyHarvester;
pub use migrate::{
    BatchOutcome, Direction, Mechanism, Migrator, MigratorConfig, Unit, MAX_UNIT_PAGES,
};
pub use probe::{AccessProbes, MEASURED_HINT_FAULT_GUEST_NS};
pub use sampler::{HintSampler, SamplerConfig, SamplerHandle, SamplerTick};
pub use stats::{MemStats, TierStats};
pub use sys::PAGE_SIZE;

/// A memory tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Tier {
    /// The fast tier (DRAM).
    Fast,
    /// The slow tier (CXL, PMem, remote socket).
    Slow,
}

impl Tier {
    /// 0 for fast, 1 for slow.
    pub fn index(self) -> usize {
        match self {
            Tier::Fast => 0,
            Tier::Slow => 1,
        }
    }
    /// The other tier.
    pub fn other(self) -> Tier {
        match self {
            Tier::Fast => Tier::Slow,
            Tier::Slow => Tier::Fast,
        }
    }
    /// "fast" or "slow".
    pub fn name(self) -> &'static str {
        match self {
            Tier::Fast => "fast",
            Tier::Slow => "slow",
        }
    }
}

/// One hint-fault access sample, plain data for policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AccessSample {
    /// Guest page touched.
    pub page: u64,
    /// Time from parking the window to the touch, ns.
    pub ns_since_park: u64,
    /// Faulting thread id (a vCPU thread under KVM; 0 if unknown).
    pub thread_id: u32,
    /// Whether the touch was a write.
    pub write: bool,
}

/// Errors creating tiered memory.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Invalid configuration.
    #[error("tiered memory config: {0}")]
    Config(String),
    /// A system call failed (the message names it).
    #[error("tiered memory: {0}")]
    Io(#[from] std::io::Error),
}

#[allow(dead_code)]
fn _assert_word_size() {
    const _: () = assert!(std::mem::size_of::<AtomicU32>() == 4);
}
