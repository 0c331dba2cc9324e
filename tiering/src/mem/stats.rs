//! Mechanism statistics: atomic counters and a serde snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Per-tier numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TierStats {
    /// The tier's name ("fast", "slow", ...).
    pub name: String,
    /// Host NUMA node.
    pub node: u32,
    /// Capacity in 4 KiB pages (the target after a resize).
    pub capacity_pages: u64,
    /// Pages in use on this tier (guest pages + shadows): the actual size,
    /// which follows a resize's target as it converges.
    pub pages: u64,
    /// Guest pages on this tier.
    pub guest_pages: u64,
    /// Shadow pages on this tier.
    pub shadow_pages: u64,
    /// Pages the tier can still take (capacity - used).
    pub free_pages: u64,
    /// Host memory committed for this tier, measured from the kernel
    /// (page tables of the areas), not from the bookkeeping. `None` when
    /// the measurement failed.
    pub resident_bytes: Option<u64>,
    /// Of `resident_bytes`, bytes mapped by 2 MiB huge pages.
    pub huge_bytes: Option<u64>,
    /// True when both tiers share one host node (capacities still enforced).
    pub emulated: bool,
}

/// Snapshot of the mechanism counters. Page counts unless noted.
///
/// The counters come in groups the run report shows as they are (its
/// `migration` and `backing` objects); in the serde form the groups are
/// flattened, so a snapshot is one flat object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemStats {
    /// Migration-mechanism counters.
    #[serde(flatten)]
    pub migration: MigrationCounters,
    /// How the tiers' host memory was committed.
    #[serde(flatten)]
    pub backing: BackingCounters,
    /// Hint faults (parked pages touched).
    pub hint_faults: u64,
    /// Total stall of hint faults (parked pages touched), ms: tracking cost.
    pub hint_stall_ms: f64,
    /// What hint faults cost the guest over the last sampler period,
    /// percent of vCPU time (what the sampler budgets against; see
    /// `guest_cost_factor`).
    pub tracking_overhead_pct: f64,
    /// What one hint fault costs the guest as a multiple of the stall the
    /// fault handler sees (`tiering::mem::GUEST_COST_FACTOR`, or what the
    /// run measured with `--tracking-ab`).
    #[serde(default)]
    pub guest_cost_factor: f64,
    /// Per tier, fastest first.
    pub tiers: Vec<TierStats>,
}

/// Migration-mechanism counters (the run report's `migration` object).
/// Page counts unless noted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigrationCounters {
    /// Pages promoted (slow to fast), all mechanisms.
    pub promotions: u64,
    /// Pages demoted (fast to slow), all mechanisms.
    pub demotions: u64,
    /// Committed transactions (one per unit run).
    pub tpm_commits: u64,
    /// Aborted transactions (the unit was written during the copy).
    pub tpm_aborts: u64,
    /// Pages of those aborted transactions.
    pub tpm_aborted_pages: u64,
    /// Mover time spent putting aborted transactions back (the old pages
    /// moved back into guest RAM, the staging pages and the reservation
    /// given back), ms. The copy, arming and harvest an aborted transaction
    /// shares with the committed ones are not in it.
    pub tpm_abort_ms: f64,
    /// Transactions retried from the back-off queue.
    pub tpm_retries: u64,
    /// Aborted units dropped after the last retry.
    pub tpm_gave_up: u64,
    /// Pages moved with exclusive stop-and-copy.
    pub stop_copy: u64,
    /// Pages moved with the kernel's `move_pages(2)`.
    pub kernel_move_pages: u64,
    /// Demotions that remapped a clean shadow (no copy).
    pub shadow_demotions: u64,
    /// Demotions of shadowed pages that were written meanwhile (copied into the shadow).
    pub shadow_demotions_copied: u64,
    /// Mover time spent in completed shadow demotions (park, harvest, copy of
    /// the written pages, shadows mapped in, old pages freed), ms: over
    /// `shadow_demotions + shadow_demotions_copied` pages.
    pub shadow_demotion_ms: f64,
    /// Shadows freed on the first write after promotion.
    pub shadow_invalidations: u64,
    /// Shadows kept after a dirty bit because the page still equals its
    /// shadow (dirty-on-read under shadow paging).
    pub shadow_revalidations: u64,
    /// Shadows reclaimed under slow-tier pressure (oldest first).
    pub shadow_reclaims: u64,
    /// Shadows currently held.
    pub shadow_pages: u64,
    /// Pages not migrated because the destination tier had no free page.
    pub skipped_no_space: u64,
    /// Pages not migrated because another mover or the sampler owned them.
    pub skipped_busy: u64,
    /// Guest faults on pages in flight (migration) that the fault handler saw.
    pub guest_stalls: u64,
    /// Total stall of those faults (handler's read of the event to the wake), ms.
    pub guest_stall_ms: f64,
    /// Dirty-log harvests (GET + CLEAR rounds).
    pub harvests: u64,
    /// Faults on addresses no mechanism explains (a bug indicator; woken and counted).
    pub unexpected_faults: u64,
    /// Rollback steps that failed (each one logged; the page stays where
    /// the kernel says it is).
    pub rollback_errors: u64,
}

/// How the tiers' host memory was committed (the run report's `backing`
/// object). Page counts unless noted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackingCounters {
    /// Guest pages with host memory (touched at least once).
    pub populated_pages: u64,
    /// Guest pages committed on first touch (lazy commit).
    pub committed_pages: u64,
    /// First touches committed as a whole 2 MiB huge page.
    pub huge_commits: u64,
    /// 2 MiB chunks committed ahead of a sequential stream of first
    /// touches (`fault::CommitAhead`), before the guest reached them.
    pub ahead_commits: u64,
    /// Pages a stall watchdog released for a thread that waited too long
    /// on them ([`TieredMemory::unstick`](super::TieredMemory::unstick)).
    pub watchdog_unsticks: u64,
    /// Pages committed after the host ran short of memory, while the VM stopped.
    pub emergency_commits: u64,
    /// Pool slots the bookkeeping called holes that held a page (healed).
    pub slot_heals: u64,
    /// Split 2 MiB guest ranges collapsed back into a huge page once whole
    /// on one tier again.
    pub collapses: u64,
    /// Capacity changes (resizes) applied.
    pub resizes: u64,
    /// 2 MiB guest ranges broken into 4 KiB pages by a page-sized move
    /// (placement inside a huge page, hint-fault sampling).
    pub splits: u64,
    /// Touched parked 2 MiB ranges mapped back whole (parked as one huge
    /// page; the huge page stays whole, see `map_back_touched_range`).
    #[serde(default)]
    pub huge_range_unparks: u64,
    /// Times the dirty log was switched on or off (it is on only while
    /// something is tracked: KVM maps an unlogged memslot with huge pages).
    pub dirty_log_switches: u64,
    /// Whether the areas are locked on fault (false: `RLIMIT_MEMLOCK` too
    /// low and no `CAP_IPC_LOCK`; docs/host-requirements.md).
    pub locked: bool,
}

/// Live counters.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) promotions: AtomicU64,
    pub(crate) demotions: AtomicU64,
    pub(crate) tpm_commits: AtomicU64,
    pub(crate) tpm_aborts: AtomicU64,
    pub(crate) tpm_aborted_pages: AtomicU64,
    pub(crate) tpm_abort_ns: AtomicU64,
    pub(crate) tpm_retries: AtomicU64,
    pub(crate) tpm_gave_up: AtomicU64,
    pub(crate) stop_copy: AtomicU64,
    pub(crate) kernel_move_pages: AtomicU64,
    pub(crate) shadow_demotions: AtomicU64,
    pub(crate) shadow_demotions_copied: AtomicU64,
    pub(crate) shadow_demotion_ns: AtomicU64,
    pub(crate) shadow_invalidations: AtomicU64,
    pub(crate) shadow_reclaims: AtomicU64,
    pub(crate) skipped_no_space: AtomicU64,
    pub(crate) skipped_busy: AtomicU64,
    pub(crate) guest_stalls: AtomicU64,
    pub(crate) guest_stall_ns: AtomicU64,
    pub(crate) hint_faults: AtomicU64,
    pub(crate) hint_stall_ns: AtomicU64,
    pub(crate) shadow_revalidations: AtomicU64,
    pub(crate) unexpected_faults: AtomicU64,
    pub(crate) harvests: AtomicU64,
    pub(crate) committed_pages: AtomicU64,
    pub(crate) huge_commits: AtomicU64,
    pub(crate) ahead_commits: AtomicU64,
    pub(crate) watchdog_unsticks: AtomicU64,
    /// Fault events the handler served (every kind).
    pub(crate) faults_served: AtomicU64,
    pub(crate) emergency_commits: AtomicU64,
    pub(crate) slot_heals: AtomicU64,
    pub(crate) rollback_errors: AtomicU64,
    pub(crate) collapses: AtomicU64,
    pub(crate) splits: AtomicU64,
    pub(crate) range_unparks: AtomicU64,
    pub(crate) resizes: AtomicU64,
    pub(crate) dirty_log_switches: AtomicU64,
    /// Full passes of the hint-fault sampler over guest memory (not in the
    /// report; `TieredMemory::scan_cycles`).
    pub(crate) scan_cycles: AtomicU64,
    /// Pages the hint-fault sampler's windows covered (parked or skipped
    /// as never touched), all passes (not in the report;
    /// `TieredMemory::sampler_account`).
    pub(crate) scanned_pages: AtomicU64,
    /// The fault handler's moves of a touched parked page back into guest
    /// RAM that failed (each retried or resolved; not in the report).
    pub(crate) unpark_failures: AtomicU64,
    /// Touched parked pages whose guest RAM slot was found mapped (EEXIST)
    /// and resolved by comparing the two copies (not in the report).
    pub(crate) unpark_conflicts: AtomicU64,
    /// Park moves refused with EBUSY and retried (not in the report).
    pub(crate) park_busy_retries: AtomicU64,
}

impl Counters {
    /// Snapshot (tier fields left empty).
    pub fn snapshot(&self) -> MemStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ms = |a: &AtomicU64| g(a) as f64 / 1e6;
        MemStats {
            migration: MigrationCounters {
                promotions: g(&self.promotions),
                demotions: g(&self.demotions),
                tpm_commits: g(&self.tpm_commits),
                tpm_aborts: g(&self.tpm_aborts),
                tpm_aborted_pages: g(&self.tpm_aborted_pages),
                tpm_abort_ms: ms(&self.tpm_abort_ns),
                tpm_retries: g(&self.tpm_retries),
                tpm_gave_up: g(&self.tpm_gave_up),
                stop_copy: g(&self.stop_copy),
                kernel_move_pages: g(&self.kernel_move_pages),
                shadow_demotions: g(&self.shadow_demotions),
                shadow_demotions_copied: g(&self.shadow_demotions_copied),
                shadow_demotion_ms: ms(&self.shadow_demotion_ns),
                shadow_invalidations: g(&self.shadow_invalidations),
                shadow_revalidations: g(&self.shadow_revalidations),
                shadow_reclaims: g(&self.shadow_reclaims),
                shadow_pages: 0,
                skipped_no_space: g(&self.skipped_no_space),
                skipped_busy: g(&self.skipped_busy),
                guest_stalls: g(&self.guest_stalls),
                guest_stall_ms: ms(&self.guest_stall_ns),
                harvests: g(&self.harvests),
                unexpected_faults: g(&self.unexpected_faults),
                rollback_errors: g(&self.rollback_errors),
            },
            backing: BackingCounters {
                populated_pages: 0,
                committed_pages: g(&self.committed_pages),
                huge_commits: g(&self.huge_commits),
                ahead_commits: g(&self.ahead_commits),
                watchdog_unsticks: g(&self.watchdog_unsticks),
                emergency_commits: g(&self.emergency_commits),
                slot_heals: g(&self.slot_heals),
                collapses: g(&self.collapses),
                resizes: g(&self.resizes),
                splits: g(&self.splits),
                huge_range_unparks: g(&self.range_unparks),
                dirty_log_switches: g(&self.dirty_log_switches),
                locked: false,
            },
            hint_faults: g(&self.hint_faults),
            hint_stall_ms: ms(&self.hint_stall_ns),
            tracking_overhead_pct: 0.0,
            guest_cost_factor: 0.0,
            tiers: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The serde form stays one flat object (the worker channel carries
    /// it): the groups add no keys, and it reads back whole.
    #[test]
    fn serde_form_is_flat_and_round_trips() {
        let mut s = MemStats::default();
        s.migration.promotions = 3;
        s.migration.tpm_abort_ms = 1.5;
        s.backing.locked = true;
        s.backing.splits = 7;
        s.hint_faults = 9;
        let v = serde_json::to_value(&s).unwrap();
        let obj = v.as_object().unwrap();
        assert!(!obj.contains_key("migration") && !obj.contains_key("backing"));
        assert_eq!(obj.len(), 24 + 13 + 5);
        assert_eq!(obj["promotions"], 3);
        assert_eq!(obj["locked"], true);
        assert_eq!(serde_json::from_value::<MemStats>(v).unwrap(), s);
    }
}
