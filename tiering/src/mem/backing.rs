//! [`TieredMemory`]: guest RAM as one private anonymous mapping whose every
//! 4 KiB page lives on one tier once the guest touched it, plus one pool area
//! per tier, a shadow area and a parking area, all in one 2 MiB aligned
//! reservation. Nothing is committed at creation (lazy commit, see
//! [`super::commit`]); the areas are backed with transparent huge pages.
//!
//! ```text
//!  guest RAM | pool tier 0 | pool tier 1 | ... | shadow area | parking area
//!  MISSING   | WP, node 0  | WP, node 1  |     | MISSING     | MISSING
//! ```
//!
//! Guest RAM, the shadow area and the parking area are registered with the
//! userfaultfd in MISSING mode: a guest touch of a page that is not there
//! (never touched, in flight, parked) reaches the fault handler. The pools
//! are registered in write-protect mode only, so that a write into a pool
//! hole allocates a fresh page on the tier's node (the pool's `mbind`) and a
//! pool slot can still be a `UFFDIO_MOVE` destination.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Receiver, Sender};
use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::account::{apply_word_change, tier_ids, TierAccount, TierSpec};
use super::commit::HostGuard;
use super::dirty::SoftDirtyLog;
use super::page_map::{self, PageMap, SHADOW};
use super::pool::{Holds, Pool, Slot, CHUNK_SLOTS};
use super::stats::{Counters, MemStats, TierStats};
use super::{HintFaultRecord, MemConfigError, MemError};
use crate::inject::Injector;
use crate::sys::{self, Advice, Mapping, MoveError, RegisterMode, Uffd, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::vocab::{TierId, MAX_TIERS};

/// Where a guest page goes when the guest first touches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InitialPlacement {
    /// Fastest tier with room first (Linux's default).
    FastFirst,
    /// Slowest tier with room first.
    SlowFirst,
    /// Each placement unit picks a tier at random (deterministic for a seed).
    Random {
        /// Seed of the choice.
        seed: u64,
    },
    /// Round-robin over the tiers by placement unit.
    Interleave,
}

/// A placement name tiervm does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement '{0}': use fast-first, slow-first, interleave or random:SEED")]
pub struct UnknownPlacement(pub String);

impl std::str::FromStr for InitialPlacement {
    type Err = UnknownPlacement;
    /// Parses `fast-first`, `slow-first`, `interleave` or `random:SEED`.
    fn from_str(s: &str) -> Result<Self, UnknownPlacement> {
        match s {
            "fast-first" => Ok(InitialPlacement::FastFirst),
            "slow-first" => Ok(InitialPlacement::SlowFirst),
            "interleave" => Ok(InitialPlacement::Interleave),
            "random" => Ok(InitialPlacement::Random { seed: 0 }),
            _ => match s.strip_prefix("random:").map(str::parse::<u64>) {
                Some(Ok(seed)) => Ok(InitialPlacement::Random { seed }),
                _ => Err(UnknownPlacement(s.to_string())),
            },
        }
    }
}

/// Configuration of a [`TieredMemory`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemConfig {
    /// Guest RAM size in bytes (a positive multiple of 4 KiB).
    pub guest_bytes: usize,
    /// The tiers, fastest first (1..=8).
    pub tiers: Vec<TierSpec>,
    /// Where first-touched pages go.
    pub placement: InitialPlacement,
    /// Back the areas with transparent huge pages and commit first touches
    /// 2 MiB at a time (where a whole 2 MiB range is untouched).
    pub huge_pages: bool,
    /// Reclaim shadows (oldest first) when a tier's free pages fall below
    /// this; `None`: 1/64 of the tier's capacity (at least 16).
    pub shadow_low_watermark_pages: Option<usize>,
    /// Free pages each pool keeps resident for reuse as staging pages; the
    /// rest goes back to the kernel.
    pub pool_cache_pages: usize,
    /// Host memory that must stay free: a commit that would leave less on
    /// its node stops the VM with an out-of-memory error instead.
    pub host_reserve_bytes: u64,
}

/// Default host memory kept free by lazy commits (64 MiB).
pub const DEFAULT_HOST_RESERVE_BYTES: u64 = 64 << 20;
/// Default resident free pages per pool (8 MiB).
pub const DEFAULT_POOL_CACHE_PAGES: usize = 2048;

impl MemConfig {
    /// Two tiers on node 0: `fast_capacity_pages` fast, and a slow tier that
    /// holds the whole guest; fast-first placement, huge pages on.
    pub fn new(guest_bytes: usize, fast_capacity_pages: usize) -> Self {
        let pages = guest_bytes / PAGE_SIZE;
        Self::two_tier(guest_bytes, fast_capacity_pages, pages, 0, 0)
    }

    /// Two tiers: `fast` pages on `fast_node`, `slow` pages on `slow_node`.
    pub fn two_tier(
        guest_bytes: usize,
        fast: usize,
        slow: usize,
        fast_node: u32,
        slow_node: u32,
    ) -> Self {
        let pages = guest_bytes / PAGE_SIZE;
        Self {
            guest_bytes,
            tiers: vec![
                TierSpec {
                    name: "fast".into(),
                    node: fast_node,
                    capacity_pages: fast,
                    max_capacity_pages: fast.max(pages),
                },
                TierSpec {
                    name: "slow".into(),
                    node: slow_node,
                    capacity_pages: slow,
                    max_capacity_pages: slow.max(pages),
                },
            ],
            placement: InitialPlacement::FastFirst,
            huge_pages: true,
            shadow_low_watermark_pages: None,
            pool_cache_pages: DEFAULT_POOL_CACHE_PAGES,
            host_reserve_bytes: DEFAULT_HOST_RESERVE_BYTES,
        }
    }

    /// Checks the configuration; the error names the fix.
    pub fn validate(&self) -> Result<(), MemConfigError> {
        use MemConfigError as E;
        if self.guest_bytes == 0 || !self.guest_bytes.is_multiple_of(PAGE_SIZE) {
            return Err(E::GuestSizeNotPages(self.guest_bytes));
        }
        let n = self.guest_bytes / PAGE_SIZE;
        if n > u32::MAX as usize {
            return Err(E::GuestTooLarge);
        }
        if self.tiers.is_empty() || self.tiers.len() > MAX_TIERS {
            return Err(E::TierCount(self.tiers.len()));
        }
        let mut total: usize = 0;
        for t in &self.tiers {
            if t.max_capacity_pages < t.capacity_pages {
                return Err(E::MaxBelowCapacity {
                    tier: t.name.clone(),
                    max: t.max_capacity_pages,
                    capacity: t.capacity_pages,
                });
            }
            if t.max_capacity_pages > (u32::MAX as usize) {
                return Err(E::TierTooLarge(t.name.clone()));
            }
            if t.node as usize >= sys::MAX_NODES {
                return Err(E::NodeOutOfRange {
                    tier: t.name.clone(),
                    node: t.node,
                });
            }
            total = total.saturating_add(t.capacity_pages);
        }
        if total < n {
            return Err(E::CapacitiesTooSmall { total, guest: n });
        }
        Ok(())
    }
}

/// Who parks a page for hint faults: each maps back only its own pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parker {
    /// The [`super::HintSampler`]'s scan windows.
    Sampler,
    /// [`super::AccessProbes`] (accessed bits of pages a policy tests).
    Probe,
}

/// Asked by the fault handler when the guest touches a parked page that is
/// not on the fastest tier: `true` = promote it now, before the faulting
/// access resumes (TPP's promotion in the NUMA-hint-fault path). When a hook
/// is installed, hint faults are delivered through it instead of
/// [`TieredMemory::drain_samples`].
pub type FaultPathHook = Arc<dyn Fn(&HintFaultRecord) -> bool + Send + Sync>;

/// Told where guest pages are placed, for latency emulation: the VMM
/// publishes a tier map to the guest. `placed(first, pages, tier)` is called
/// before a placement change becomes visible to the guest (before the move
/// that maps the new pages), and again at release if the outcome differs
/// (a migration that aborted or failed); never while a page map lock is held.
pub trait PlacementObserver: Send + Sync {
    /// Guest pages `[first, first + pages)` are (about to be) on `tier`.
    fn placed(&self, first: usize, pages: usize, tier: TierId);
}

/// Called once when the memory cannot go on (the host ran out of memory for
/// a commit): the VMM stops the VM. Carries the message.
pub type FatalHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Holder of a hook (a closure has no `Debug`).
struct HookSlot<T>(RwLock<Option<T>>);

impl<T> Default for HookSlot<T> {
    fn default() -> Self {
        Self(RwLock::new(None))
    }
}

impl<T: Clone> HookSlot<T> {
    fn set(&self, v: Option<T>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = v;
    }
    fn get(&self) -> Option<T> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl<T> std::fmt::Debug for HookSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookSlot")
    }
}

/// The VMM's measure of the guest-visible cost of faults: the total time
/// the VM's vCPU threads spent asleep in the kernel so far, ns (a vCPU
/// thread sleeps only on a fault on a page that is not mapped: a first
/// touch, a parked page, a page in flight). `None` when it cannot be read.
pub type GuestClock = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// Addresses of the areas.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) guest: usize,
    pub(crate) pools: Vec<usize>,
    pub(crate) pool_slots: Vec<usize>,
    pub(crate) shadow: usize,
    pub(crate) park: usize,
    pub(crate) area_pages: usize,
}

fn round_chunk(pages: usize) -> usize {
    pages.div_ceil(CHUNK_SLOTS) * CHUNK_SLOTS
}

/// Hint faults served before [`TieredMemory::hint_fault_guest_cost_ns`]
/// gives a mean (fewer are one window's first touches of a cold range: the
/// mean would be noise).
pub const MIN_HINT_FAULTS_FOR_COST: u64 = 64;

/// Guest RAM on tiered host memory. Shared (`Arc`) by the movers, the fault
/// handler, the sampler and the VMM.
#[derive(Debug)]
pub struct TieredMemory {
    pub(crate) guest_pages: usize,
    pub(crate) layout: Layout,
    pub(crate) pages: PageMap,
    pub(crate) tiers: Vec<TierAccount>,
    pools: Vec<Mutex<Pool>>,
    pub(crate) uffd: Uffd,
    pub(crate) huge_pages: bool,
    pub(crate) placement: InitialPlacement,
    emulated: bool,
    shadow_low_watermark: Vec<usize>,
    pub(crate) pool_cache_pages: usize,
    shadow_fifo: Mutex<VecDeque<(u32, u32)>>,
    shadow_gen: AtomicU32,
    pub(crate) counters: Counters,
    pub(crate) vmm_dirty: SoftDirtyLog,
    release_tx: Sender<(u32, Instant)>,
    pub(crate) release_rx: Receiver<(u32, Instant)>,
    pub(crate) release_event: EventFd,
    /// The faults the handler holds (for the stall watchdog).
    pub(crate) backlog: super::watch::FaultBacklog,
    /// What movers do while they own pages (for the stall watchdog).
    pub(crate) activities: super::watch::Activities,
    pub(crate) samples: Mutex<Vec<HintFaultRecord>>,
    pub(crate) park_epoch: Mutex<Instant>,
    /// The latest weighted hint fault of every page in a sampler window.
    pub(crate) sampled_weights: super::sampler::SampledWeights,
    overhead_pct_bits: AtomicU64,
    guest_cost_factor_bits: AtomicU64,
    /// The policy needs no samples now: the hint-fault sampler parks
    /// nothing (see [`Self::hold_sampling`]).
    sampling_held: AtomicBool,
    setup_time: Duration,
    fault_path_hook: HookSlot<FaultPathHook>,
    fatal_hook: HookSlot<FatalHook>,
    guest_clock: HookSlot<GuestClock>,
    observer: HookSlot<Arc<dyn PlacementObserver>>,
    fatal: OnceLock<String>,
    pub(crate) host_guard: HostGuard,
    pub(crate) sweep: Vec<super::resize::SweepCursor>,
    pub(crate) chunks: super::thp::ChunkStates,
    pub(crate) scanner: sys::PageScanner,
    pub(crate) inject: Arc<Injector>,
    locked: bool,
    /// The reservation every area lives in. Declared last: it is unmapped
    /// only after everything above (which may hold addresses into it) is
    /// dropped, and nothing outside this struct may keep an address into it
    /// beyond the struct's lifetime (the VMM keeps the `Arc` alive as long
    /// as KVM maps guest RAM).
    map: Mapping,
}

/// Reserves one range for guest RAM, each tier's pool (a huge half and a
/// small half, see `pool`, each with a slot for every page the tier can
/// take plus its cache), the shadow area and the parking area; returns the
/// mapping, where each area starts, and each pool's half size in slots.
fn reserve_layout(cfg: &MemConfig, n: usize) -> Result<(Mapping, Layout, Vec<usize>), MemError> {
    let area_pages = round_chunk(n);
    let pool_halves: Vec<usize> = cfg
        .tiers
        .iter()
        .map(|t| round_chunk(t.max_capacity_pages.min(n) + cfg.pool_cache_pages) + CHUNK_SLOTS)
        .collect();
    let pool_slots: Vec<usize> = pool_halves.iter().map(|h| 2 * h).collect();
    let total_pages = 3 * area_pages + pool_slots.iter().sum::<usize>();
    let map = Mapping::reserve(total_pages * PAGE_SIZE)?;
    let guest = map.addr();
    let mut at = guest + area_pages * PAGE_SIZE;
    let mut pools = Vec::new();
    for &s in &pool_slots {
        pools.push(at);
        at += s * PAGE_SIZE;
    }
    let shadow = at;
    let park = shadow + area_pages * PAGE_SIZE;
    let layout = Layout {
        guest,
        pools,
        pool_slots,
        shadow,
        park,
        area_pages,
    };
    Ok((map, layout, pool_halves))
}

/// Locks the whole range on fault; false (with a warning naming the fix)
/// where the host does not allow it.
fn lock_or_warn(map: &Mapping) -> bool {
    // Locked on fault: see `Mapping::lock_on_fault`. Without CAP_IPC_LOCK or
    // a large RLIMIT_MEMLOCK this fails, and tiervm runs unlocked (the
    // run summary says so): a split huge page may then put the kernel's
    // zero page in guest RAM, and a write to it gets a page from the
    // kernel's choice of node.
    match map.lock_on_fault() {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "tiered memory is not locked ({e}); raise RLIMIT_MEMLOCK (e.g. systemd \
                 LimitMEMLOCK=infinity) or grant CAP_IPC_LOCK"
            );
            false
        }
    }
}

/// A userfaultfd over the areas: missing faults of guest RAM, shadows and
/// parking slots; write-protect faults of the pools.
fn register_areas(layout: &Layout, inject: Arc<Injector>) -> Result<Uffd, MemError> {
    let uffd = Uffd::new(inject)?;
    let area = layout.area_pages * PAGE_SIZE;
    uffd.register(layout.guest, area, RegisterMode::Missing)?;
    for (&p, &slots) in layout.pools.iter().zip(&layout.pool_slots) {
        uffd.register(p, slots * PAGE_SIZE, RegisterMode::WriteProtect)?;
    }
    uffd.register(layout.shadow, 2 * area, RegisterMode::Missing)?;
    Ok(uffd)
}

/// True when the tiers do not sit on distinct NUMA nodes of a host with
/// `host_nodes` nodes (their latencies are then emulated, not real).
fn tiers_are_emulated(nodes: &[u32], host_nodes: usize) -> bool {
    let distinct = nodes
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    distinct < nodes.len() || host_nodes < 2
}

/// This host's NUMA node count (1 when it cannot be read).
fn host_node_count() -> usize {
    crate::host::numa_nodes().map(|v| v.len()).unwrap_or(1)
}

impl TieredMemory {
    /// Reserves the areas and sets them up. Commits nothing: host memory is
    /// taken when the guest (or the VMM) first touches a page, or when a
    /// migration needs a staging page.
    pub fn new(cfg: &MemConfig) -> Result<Self, MemError> {
        let t0 = Instant::now();
        cfg.validate()?;
        let n = cfg.guest_bytes / PAGE_SIZE;
        let (map, layout, pool_halves) = reserve_layout(cfg, n)?;
        set_up_areas(&map, &layout, cfg)?;
        let locked = lock_or_warn(&map);
        let inject = Arc::new(Injector::default());
        let uffd = register_areas(&layout, inject.clone())?;
        let (release_tx, release_rx) = unbounded();
        let low = cfg
            .tiers
            .iter()
            .map(|t| {
                cfg.shadow_low_watermark_pages
                    .unwrap_or_else(|| (t.capacity_pages / 64).max(16))
            })
            .collect();
        let nodes: Vec<u32> = cfg.tiers.iter().map(|t| t.node).collect();
        Ok(Self {
            pools: pool_halves
                .iter()
                .map(|&h| Mutex::new(Pool::new(h)))
                .collect(),
            pages: PageMap::new(n)?,
            tiers: cfg.tiers.iter().cloned().map(TierAccount::new).collect(),
            guest_pages: n,
            layout,
            uffd,
            huge_pages: cfg.huge_pages,
            placement: cfg.placement,
            emulated: tiers_are_emulated(&nodes, host_node_count()),
            shadow_low_watermark: low,
            pool_cache_pages: cfg.pool_cache_pages,
            shadow_fifo: Mutex::new(VecDeque::new()),
            shadow_gen: AtomicU32::new(0),
            counters: Counters::default(),
            vmm_dirty: SoftDirtyLog::new(n),
            release_tx,
            release_rx,
            release_event: EventFd::new(EFD_NONBLOCK)?,
            backlog: Default::default(),
            activities: Default::default(),
            samples: Mutex::new(Vec::new()),
            park_epoch: Mutex::new(Instant::now()),
            sampled_weights: super::sampler::SampledWeights::new(n)?,
            overhead_pct_bits: AtomicU64::new(0),
            guest_cost_factor_bits: AtomicU64::new(super::sampler::GUEST_COST_FACTOR.to_bits()),
            sampling_held: AtomicBool::new(false),
            setup_time: t0.elapsed(),
            fault_path_hook: HookSlot::default(),
            fatal_hook: HookSlot::default(),
            guest_clock: HookSlot::default(),
            observer: HookSlot::default(),
            fatal: OnceLock::new(),
            host_guard: HostGuard::new(cfg.host_reserve_bytes),
            sweep: cfg.tiers.iter().map(|_| Default::default()).collect(),
            chunks: super::thp::ChunkStates::new(n)?,
            scanner: sys::PageScanner::open()?,
            inject,
            locked,
            map,
        })
    }

    /// Host address of guest RAM (for `MmapRegion::build_raw` and the KVM memslot).
    pub fn guest_ptr(&self) -> *mut u8 {
        self.layout.guest as *mut u8
    }

    /// Guest RAM length in bytes.
    pub fn guest_len(&self) -> usize {
        self.guest_pages * PAGE_SIZE
    }

    /// Number of 4 KiB guest pages.
    pub fn guest_pages(&self) -> usize {
        self.guest_pages
    }

    /// Number of tiers.
    pub fn tier_count(&self) -> usize {
        self.tiers.len()
    }

    /// How long creation (reserving, binding, registering) took.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// Whether the tiers are emulated (sharing a node, or a one-node host).
    pub fn emulated(&self) -> bool {
        self.emulated
    }

    /// Tests on a one-node host: act as if the tiers were on nodes of
    /// their own (what the memory does only on a multi-node host, e.g.
    /// the NOHUGEPAGE advice of a split range, `thp.rs`).
    #[cfg(test)]
    pub(crate) fn acting_on_separate_nodes(mut self) -> Self {
        self.emulated = false;
        self
    }

    /// Whether the areas are locked on fault (exempt from reclaim and from
    /// zero-page remapping of split huge pages).
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// Whether the areas are backed with transparent huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// A tier's configuration (name, node, capacity at start, maximum).
    pub fn tier_spec(&self, tier: TierId) -> Option<&TierSpec> {
        self.tiers.get(usize::from(tier)).map(|t| &t.spec)
    }

    /// Host NUMA node of a tier.
    pub fn node(&self, tier: TierId) -> u32 {
        self.tiers.get(usize::from(tier)).map_or(0, |t| t.spec.node)
    }

    /// Current capacity of a tier in pages.
    pub fn capacity(&self, tier: TierId) -> usize {
        self.tiers
            .get(usize::from(tier))
            .map_or(0, |t| t.capacity() as usize)
    }

    /// Pages a tier can still take (capacity minus guest pages, shadows and
    /// reservations).
    pub fn free_pages(&self, tier: TierId) -> usize {
        self.tiers
            .get(usize::from(tier))
            .map_or(0, |t| t.free() as usize)
    }

    /// Current tier of a guest page (`None`: out of range or never touched).
    pub fn tier_of(&self, page: usize) -> Option<TierId> {
        (page < self.guest_pages)
            .then(|| page_map::tier_of(self.pages.load(page)))
            .flatten()
    }

    /// Whether a guest page currently has a shadow.
    pub fn has_shadow(&self, page: usize) -> bool {
        page < self.guest_pages && self.pages.load(page) & SHADOW != 0
    }

    /// Tier of a guest page's shadow, if it has one.
    pub fn shadow_tier(&self, page: usize) -> Option<TierId> {
        (page < self.guest_pages)
            .then(|| page_map::shadow_tier_of(self.pages.load(page)))
            .flatten()
    }

    /// Guest pages per tier (from the live counts), fastest first.
    pub fn guest_pages_per_tier(&self) -> Vec<usize> {
        self.tiers.iter().map(|t| t.guest() as usize).collect()
    }

    /// (guest pages, shadows) per tier, fastest first.
    pub fn tier_counts(&self) -> Vec<(u64, u64)> {
        self.tiers
            .iter()
            .map(|t| (t.guest(), t.shadows()))
            .collect()
    }

    /// Guest pages that have host memory (touched at least once).
    pub fn populated_pages(&self) -> usize {
        self.tiers.iter().map(|t| t.guest() as usize).sum()
    }

    /// Number of shadows (all tiers).
    pub fn shadow_pages(&self) -> usize {
        self.tiers.iter().map(|t| t.shadows() as usize).sum()
    }

    /// Takes and resets the write counts the dirty harvester accumulated
    /// (one per harvest that saw the page dirty, saturating at 255).
    pub fn take_write_counts(&self) -> Vec<u8> {
        (0..self.guest_pages)
            .map(|p| self.pages.take_write_count(p))
            .collect()
    }

    /// Queries the host NUMA node of every guest page (`move_pages` with
    /// `nodes = NULL`). Entries are node ids or negative errno values
    /// (`-ENOENT` for a page that is not present: never touched, in flight,
    /// parked).
    pub fn query_guest_nodes(&self) -> std::io::Result<Vec<i32>> {
        // The kernel is asked 64 Ki pages at a time (bounded memory for
        // any guest size).
        const BATCH: usize = 1 << 16;
        let mut out = Vec::with_capacity(self.guest_pages);
        let mut first = 0;
        while first < self.guest_pages {
            let end = (first + BATCH).min(self.guest_pages);
            let addrs: Vec<usize> = (first..end).map(|p| self.guest_addr(p)).collect();
            out.extend(sys::query_nodes(&addrs)?);
            first = end;
        }
        Ok(out)
    }

    /// Software dirty log for writes the VMM itself makes to guest RAM (device
    /// emulation, loaders). Use [`SoftDirtyLog::write_guard`] around each write;
    /// the harvester ORs this log into every harvest.
    pub fn vmm_writes(&self) -> &SoftDirtyLog {
        &self.vmm_dirty
    }

    /// Drains the hint faults recorded by the fault handler for parked pages.
    pub fn drain_samples(&self) -> Vec<HintFaultRecord> {
        std::mem::take(&mut *lock(&self.samples))
    }

    /// Statistics snapshot, with each tier's resident memory measured from
    /// the kernel (see [`Self::residency`]).
    pub fn stats(&self) -> MemStats {
        let residency = self.residency().ok();
        let mut s = self.counters.snapshot();
        s.tracking_overhead_pct = f64::from_bits(self.overhead_pct_bits.load(Ordering::Relaxed));
        s.guest_cost_factor = self.guest_cost_factor();
        s.migration.shadow_pages = self.shadow_pages() as u64;
        s.backing.populated_pages = self.populated_pages() as u64;
        s.backing.locked = self.locked;
        s.tiers = self
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let r = residency.as_ref().map(|r| r.tiers[i]);
                TierStats {
                    name: t.spec.name.clone(),
                    node: t.spec.node,
                    capacity_pages: t.capacity(),
                    pages: t.guest() + t.shadows(),
                    guest_pages: t.guest(),
                    shadow_pages: t.shadows(),
                    free_pages: t.free(),
                    resident_bytes: r.map(|r| r.resident_bytes),
                    huge_bytes: r.map(|r| r.huge_bytes),
                    emulated: self.emulated,
                }
            })
            .collect();
        s
    }

    pub(crate) fn vmm_dirty_get(&self, bitmap: &mut [u64]) -> std::io::Result<()> {
        use super::dirty::DirtyLog;
        self.vmm_dirty.get(bitmap)
    }

    pub(crate) fn vmm_dirty_clear(&self, first: usize, mask: &[u64]) -> std::io::Result<()> {
        use super::dirty::DirtyLog;
        self.vmm_dirty.clear(first, mask)
    }

    /// Full passes the hint-fault sampler made over guest memory: every
    /// page was parked once per pass (the access profile's memory is
    /// measured in passes, `tiering::engine::profile`).
    pub fn scan_cycles(&self) -> u64 {
        self.counters.scan_cycles.load(Ordering::Relaxed)
    }

    /// What the hint-fault sampler covered and the census of its windows'
    /// weighted hint faults (`tiering::engine::profile::access_rate`).
    pub fn sampler_account(&self) -> super::SamplerAccount {
        let (weight, weight_sq) = self.sampled_weights.sums();
        super::SamplerAccount {
            guest_pages: self.guest_pages as u64,
            scanned_pages: self.counters.scanned_pages.load(Ordering::Relaxed),
            weight,
            weight_sq,
        }
    }

    pub(crate) fn set_overhead_pct(&self, pct: f64) {
        self.overhead_pct_bits
            .store(pct.to_bits(), Ordering::Relaxed);
    }

    /// The reservation every area lives in, for the `Mapping` methods that
    /// act on a range of it (madvise, mbind).
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// [`Uffd::move_range`] of `len` bytes from `src` to the hole at `dst`,
    /// both ranges of this memory's reservation. A range outside the
    /// reservation is refused (`EINVAL`, nothing moved) before any ioctl.
    /// Which pages may move is the caller's business (it owns them, see
    /// `account`): the content of `src` is afterwards only at `dst`.
    pub(crate) fn move_range(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
    ) -> Result<(), MoveError> {
        if !self.map.contains_range(dst, len) || !self.map.contains_range(src, len) {
            return Err(MoveError {
                dst,
                src,
                len,
                moved: 0,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: both ranges lie in `self.map` (checked above), the private anonymous
        // reservation this value owns and unmaps only on drop, after every `&self` is
        // gone; the areas moves go into are registered with `self.uffd`
        // (`register_areas`; the kernel refuses any other destination); and no Rust
        // reference points into the reservation except to atomics (this crate and the
        // VMM reach its memory only through raw pointers, volatile copies and atomics,
        // KVM through the guest's page tables).
        unsafe { self.uffd.move_range(dst, src, len, wake) }
    }

    /// [`sys::discard`] of `[addr, addr+len)`, a range of this memory's
    /// reservation: its pages are freed and it becomes a hole. A range
    /// outside the reservation is refused (`InvalidInput`) before any
    /// system call. The caller passes only ranges whose content nobody
    /// needs (pages it owns that are elsewhere, or free slots).
    pub(crate) fn discard(&self, addr: usize, len: usize) -> std::io::Result<()> {
        if !self.map.contains_range(addr, len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "discard of {addr:#x}+{len:#x}: not inside the tiered memory's reservation"
                ),
            ));
        }
        // SAFETY: the range lies in `self.map` (checked above), the private anonymous
        // reservation this value owns, mapped until drop; no Rust reference points into it
        // except to atomics (see `move_range`), which read the hole as zero; the content is
        // no one's by the caller's contract above (a lost page is a bug of the page
        // ownership, not a memory-safety one).
        unsafe { sys::discard(addr, len) }
    }

    pub(crate) fn guest_addr(&self, page: usize) -> usize {
        self.layout.guest + page * PAGE_SIZE
    }
    pub(crate) fn shadow_addr(&self, page: usize) -> usize {
        self.layout.shadow + page * PAGE_SIZE
    }
    pub(crate) fn park_addr(&self, page: usize) -> usize {
        self.layout.park + page * PAGE_SIZE
    }
    pub(crate) fn slot_addr(&self, tier: TierId, slot: Slot) -> usize {
        self.layout.pools[usize::from(tier)] + slot.offset()
    }
    pub(crate) fn shadow_low_watermark(&self, tier: TierId) -> usize {
        self.shadow_low_watermark
            .get(usize::from(tier))
            .copied()
            .unwrap_or(16)
    }

    /// Page index of a guest RAM address.
    pub(crate) fn guest_page_of(&self, addr: u64) -> Option<usize> {
        let a = addr as usize;
        let base = self.layout.guest;
        (a >= base && a < base + self.guest_len()).then(|| (a - base) / PAGE_SIZE)
    }

    /// Whether the address lies in any area of this memory.
    pub(crate) fn owns_addr(&self, addr: u64) -> bool {
        let a = addr as usize;
        a >= self.map.addr() && a < self.map.addr() + self.map.len()
    }

    pub(crate) fn pool(&self, tier: TierId) -> MutexGuard<'_, Pool> {
        lock(&self.pools[usize::from(tier)])
    }

    /// Moves pages given as (dst, src) address pairs: sorted by destination
    /// and coalesced where both sides are contiguous, so contiguous pages of
    /// a batch move with one range move (one MMU-notifier invalidation per
    /// range instead of per page). Stops at the first failure.
    pub(crate) fn move_pairs(&self, pairs: &[(usize, usize)]) -> Result<(), MoveError> {
        let mut sorted: Vec<(usize, usize)> = pairs.to_vec();
        sorted.sort_unstable();
        let mut i = 0;
        while i < sorted.len() {
            let (d0, s0) = sorted[i];
            let mut j = i + 1;
            // A run stops at 2 MiB boundaries: areas are split into VMAs at
            // them (huge and split guest ranges differ in THP advice) and
            // one UFFDIO_MOVE must stay within one VMA on each side.
            let boundary = |a: usize| a.is_multiple_of(HUGE_PAGE_SIZE);
            while j < sorted.len()
                && sorted[j].0 == d0 + (j - i) * PAGE_SIZE
                && sorted[j].1 == s0 + (j - i) * PAGE_SIZE
                && !boundary(sorted[j].0)
                && !boundary(sorted[j].1)
            {
                j += 1;
            }
            let len = (j - i) * PAGE_SIZE;
            self.move_range(d0, s0, len, true)?;
            self.note_guest_move(d0, len);
            self.note_guest_move(s0, len);
            i = j;
        }
        Ok(())
    }

    /// [`Self::move_pairs`], and after a failure, the pairs that did not move
    /// one by one with retries (`move_retrying`): a transient failure of one
    /// range does not undo a whole batch. Returns the first failure that
    /// retries could not overcome.
    pub(crate) fn move_pairs_finishing(&self, pairs: &[(usize, usize)]) -> Result<(), MoveError> {
        let Err(first) = self.move_pairs(pairs) else {
            return Ok(());
        };
        self.counters
            .rollback_errors
            .fetch_add(1, Ordering::Relaxed);
        let present = |a: usize| sys::resident(a, 1).map(|r| r[0]).unwrap_or(false);
        let mut last = Ok(());
        for &(dst, src) in pairs {
            if present(src) && !present(dst) {
                if let Err(e) = self.move_retrying(dst, src, PAGE_SIZE) {
                    last = Err(e);
                }
            } else if present(src) && present(dst) {
                // Neither moved nor free to move: the original failure.
                last = Err(first);
            }
        }
        last
    }

    /// A rollback move: like `uffd.move_range`, but a failure that may be
    /// transient is retried a few times (a rollback that gives up leaves a
    /// page out of guest RAM). `EEXIST` and `ENOENT` are final.
    pub(crate) fn move_retrying(
        &self,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<(), MoveError> {
        let mut last = None;
        for attempt in 0..ROLLBACK_ATTEMPTS {
            match self.move_range(dst, src, len, true) {
                Ok(()) => {
                    self.note_guest_move(dst, len);
                    self.note_guest_move(src, len);
                    return Ok(());
                }
                Err(e) if e.dst_not_a_hole() || e.src_missing() => return Err(e),
                Err(e) if e.moved > 0 => {
                    // Part moved: finish the rest.
                    return self.move_retrying(dst + e.moved, src + e.moved, len - e.moved);
                }
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_micros(50 << attempt.min(6)));
                }
            }
        }
        Err(last.unwrap_or(MoveError {
            dst,
            src,
            len,
            moved: 0,
            errno: libc::EIO,
        }))
    }

    /// A populated, owned page whose guest RAM slot is a hole (a failure
    /// path left it out): puts back the copy it finds (parking slot, then
    /// shadow slot) and releases the page; with no copy anywhere, stops the
    /// VM and keeps the page owned (a touch waits while the VM stops).
    ///
    /// The caller saw the hole before it owned the page; a mover may have
    /// filled it in between (take, unmap, fill, release), so the hole is
    /// checked again under ownership, and a filled page is just released.
    pub(crate) fn recover_hole(&self, page: usize) {
        let present = |a: usize| sys::resident(a, 1).map(|r| r[0]).unwrap_or(false);
        if present(self.guest_addr(page)) {
            self.release_page(page, 0, 0);
            return;
        }
        self.counters
            .unexpected_faults
            .fetch_add(1, Ordering::Relaxed);
        for (src, clear) in [
            (self.park_addr(page), page_map::PARKED | page_map::PROBE),
            (self.shadow_addr(page), page_map::SHADOW_BITS),
        ] {
            if present(src)
                && self
                    .move_retrying(self.guest_addr(page), src, PAGE_SIZE)
                    .is_ok()
            {
                tracing::warn!("guest page {page} was out of guest RAM; its copy was put back");
                self.release_page(page, 0, clear);
                return;
            }
        }
        self.set_fatal(format!(
            "guest page {page} is missing from guest RAM and no copy of it was found; the VM is \
             stopped to avoid running on lost data"
        ));
    }

    /// Whether guest page `page` (mapped, possibly being written) holds the
    /// same bytes as its shadow. The caller owns the page.
    pub(crate) fn page_matches_shadow(&self, page: usize) -> bool {
        // SAFETY: both are page-aligned, present pages of our mapping: the guest page is
        // owned by the caller and mapped, and the shadow slot of an owned page with SHADOW
        // holds its shadow; volatile reads because vCPUs may write the guest page.
        unsafe {
            sys::equal_volatile(
                self.guest_addr(page) as *const u8,
                self.shadow_addr(page) as *const u8,
                PAGE_SIZE,
            )
        }
    }

    /// Failure injection into this memory's system calls (tests: see
    /// [`Injector`]; nothing fires unless plans are set).
    pub fn injector(&self) -> &Injector {
        &self.inject
    }

    /// Installs (or removes) the fault-path hook.
    pub fn set_fault_path_hook(&self, hook: Option<FaultPathHook>) {
        self.fault_path_hook.set(hook);
    }

    pub(crate) fn fault_path_hook(&self) -> Option<FaultPathHook> {
        self.fault_path_hook.get()
    }

    /// Installs (or removes) the guest clock: the VMM's measure of the
    /// time its vCPU threads spent blocked in the kernel so far (see
    /// [`GuestClock`]). With it, the sampler budgets the guest's real cost of
    /// hint faults instead of an estimate from the handler's own clock.
    pub fn set_guest_clock(&self, clock: Option<GuestClock>) {
        self.guest_clock.set(clock);
    }

    /// vCPU time blocked in the kernel so far, ns (summed over vCPUs), if
    /// the VMM measures it.
    pub fn guest_blocked_ns(&self) -> Option<u64> {
        self.guest_clock.get().and_then(|c| c())
    }

    /// The stall of every hint fault so far as the fault handler saw it
    /// (event read to wake-up), ns.
    pub fn hint_stall_ns(&self) -> u64 {
        self.counters.hint_stall_ns.load(Ordering::Relaxed)
    }

    /// What one hint fault has cost the guest so far in this run, ns: the
    /// handler's mean stall per hint fault times [`Self::guest_cost_factor`]
    /// (the sampler's estimate, [`super::sampler`]); `None` before
    /// [`MIN_HINT_FAULTS_FOR_COST`] hint faults were served.
    pub fn hint_fault_guest_cost_ns(&self) -> Option<f64> {
        let faults = self.counters.hint_faults.load(Ordering::Relaxed);
        (faults >= MIN_HINT_FAULTS_FOR_COST)
            .then(|| self.hint_stall_ns() as f64 / faults as f64 * self.guest_cost_factor())
    }

    /// What one hint fault costs the guest, as a multiple of the stall the
    /// fault handler observes (starts at
    /// [`super::sampler::GUEST_COST_FACTOR`]; a run that measures it, with
    /// `--tracking-ab`, sets its own).
    pub fn guest_cost_factor(&self) -> f64 {
        f64::from_bits(self.guest_cost_factor_bits.load(Ordering::Relaxed))
    }

    /// Sets the guest cost factor of hint faults (see
    /// [`Self::guest_cost_factor`]), clamped to
    /// [`super::sampler::GUEST_COST_FACTOR_RANGE`]; a value that is not a
    /// number is ignored.
    pub fn set_guest_cost_factor(&self, factor: f64) {
        if factor.is_nan() {
            return;
        }
        let (lo, hi) = super::sampler::GUEST_COST_FACTOR_RANGE;
        self.guest_cost_factor_bits
            .store(factor.clamp(lo, hi).to_bits(), Ordering::Relaxed);
    }

    /// Holds (or resumes) hint-fault sampling for the policy: while held,
    /// the sampler unparks its window and parks nothing, as when paused (the
    /// engine holds it while its policy needs no samples: `adaptive` over
    /// equally fast tiers).
    pub fn hold_sampling(&self, held: bool) {
        self.sampling_held.store(held, Ordering::Relaxed);
    }

    /// Whether the policy holds sampling (see [`Self::hold_sampling`]).
    pub fn sampling_held(&self) -> bool {
        self.sampling_held.load(Ordering::Relaxed)
    }

    /// Installs (or removes) the placement observer (latency emulation's
    /// tier map). Pages placed before it is installed are reported to it
    /// at once.
    pub fn set_placement_observer(&self, observer: Option<Arc<dyn PlacementObserver>>) {
        self.observer.set(observer.clone());
        if let Some(o) = observer {
            for p in 0..self.guest_pages {
                if let Some(t) = page_map::tier_of(self.pages.load(p)) {
                    o.placed(p, 1, t);
                }
            }
        }
    }

    /// Tells the placement observer, if any, that pages
    /// `[first, first + pages)` are about to be mapped on `tier`.
    pub(crate) fn publish_placement(&self, first: usize, pages: usize, tier: TierId) {
        if let Some(o) = self.observer.get() {
            o.placed(first, pages, tier);
        }
    }

    /// Installs the hook called (once) when the memory cannot go on.
    pub fn set_fatal_hook(&self, hook: Option<FatalHook>) {
        self.fatal_hook.set(hook);
        if let (Some(msg), Some(h)) = (self.fatal.get(), self.fatal_hook.get()) {
            h(msg);
        }
    }

    /// The error that stopped this memory, if any (e.g. the host ran out of
    /// memory for a commit).
    pub fn fatal_error(&self) -> Option<&str> {
        self.fatal.get().map(String::as_str)
    }

    /// Records a fatal error (the first one wins) and tells the VMM.
    pub(crate) fn set_fatal(&self, msg: String) {
        if self.fatal.set(msg).is_ok() {
            if let (Some(m), Some(h)) = (self.fatal.get(), self.fatal_hook.get()) {
                tracing::error!("{m}");
                h(m);
            }
        }
    }

    /// Releases an owned page, applying `set`/`clear` to its word; keeps the
    /// tiers' counts in step and tells the fault handler if it waits on it.
    pub(crate) fn release_page(&self, page: usize, set: u64, clear: u64) {
        let (old, new) = self.release_dropping_stale_shadow(page, set, clear);
        if (old ^ new) & (page_map::PLACEMENT_BITS | page_map::SHADOW_BITS) != 0 {
            apply_word_change(&self.tiers, old, new);
            // The safety net of `publish_placement`: the final word wins.
            if let (Some(t), Some(o)) = (page_map::tier_of(new), self.observer.get()) {
                if page_map::tier_of(old) != Some(t) {
                    o.placed(page, 1, t);
                }
            }
        }
        if old & page_map::WAITER != 0 {
            let _ = self.release_tx.send((page as u32, Instant::now()));
            let _ = self.release_event.write(1);
        }
    }

    /// Releases an owned page; if it was written while owned (a harvest
    /// noted `DIRTY_SEEN`) and would keep a shadow (an old one, or one
    /// `set` gives it), the shadow is stale: it is freed and the page is
    /// released without it (a shadow is only a copy; the page holds the
    /// data). Without this, an owner that does not check `DIRTY_SEEN` (a
    /// collapse, a skipped unit, a commit whose page was written right
    /// after it was mapped) would leave a stale shadow valid, and a later
    /// shadow demotion would map it: a lost write.
    fn release_dropping_stale_shadow(&self, page: usize, set: u64, clear: u64) -> (u64, u64) {
        let (mut set, mut clear) = (set, clear);
        loop {
            match self.pages.release_unless_stale_shadow(page, set, clear) {
                Ok(words) => return words,
                Err(word) => {
                    if let Some(t) = page_map::shadow_tier_of((word & !clear) | set) {
                        self.dispose(t, &[self.shadow_addr(page)]);
                    }
                    set &= !page_map::SHADOW_BITS;
                    clear |= page_map::SHADOW_BITS;
                    self.counters
                        .shadow_invalidations
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Records a new shadow for an owned page (called before releasing it
    /// with `shadow_on(tier)`).
    pub(crate) fn note_new_shadow(&self, page: usize) {
        let g = self.shadow_gen.fetch_add(1, Ordering::Relaxed);
        self.pages.set_generation(page, g);
        lock(&self.shadow_fifo).push_back((page as u32, g));
    }

    pub(crate) fn pop_shadow_fifo(&self) -> (Option<(u32, u32)>, usize) {
        let mut q = lock(&self.shadow_fifo);
        (q.pop_front(), q.len())
    }

    pub(crate) fn push_shadow_fifo(&self, entry: (u32, u32)) {
        lock(&self.shadow_fifo).push_back(entry);
    }

    /// Tier ids, fastest first.
    pub fn tier_ids(&self) -> impl Iterator<Item = TierId> {
        tier_ids(self.tier_count())
    }
}

/// Binds, advises and prepares each area (nothing is committed).
fn set_up_areas(map: &Mapping, l: &Layout, cfg: &MemConfig) -> Result<(), MemError> {
    // Huge pages are made only in the pools' huge halves (a first touch or a
    // staging chunk populated there, on the tier's node) and moved whole
    // into guest RAM. Guest RAM stays THP-eligible where it is untouched or
    // huge: a guest fault on an untouched range then leaves its page table
    // empty for the huge page to move in (an ineligible range gets a PTE
    // table at the fault, and a 2 MiB move into it splits the huge page).
    // A 2 MiB guest range broken into pages becomes NOHUGEPAGE (`thp`), so
    // khugepaged never collapses pages of different tiers into one huge page
    // on one node; tiervm collapses a range itself when all of it is on one
    // tier. Shadow and parking areas, and the pools' small halves, never
    // get huge pages from the kernel.
    let guest_len = l.area_pages * PAGE_SIZE;
    map.advise(map.addr(), map.len(), Advice::NoHugePage)?;
    if cfg.huge_pages {
        map.advise(l.guest, guest_len, Advice::HugePage)?;
        for (t, &p) in l.pools.iter().enumerate() {
            let half = l.pool_slots[t] / 2 * PAGE_SIZE;
            map.advise(p, half, Advice::HugePage)?;
        }
    }
    let nodes: Vec<u32> = {
        let mut v: Vec<u32> = cfg.tiers.iter().map(|t| t.node).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    // An explicit policy on every area keeps NUMA balancing's scanner away
    // (it only scans ranges with the default policy), so the kernel does not
    // unmap guest pages for hint faults or migrate them behind our back.
    map.mbind(l.guest, l.area_pages * PAGE_SIZE, &nodes)?;
    map.mbind(l.shadow, 2 * l.area_pages * PAGE_SIZE, &nodes)?;
    for (t, spec) in cfg.tiers.iter().enumerate() {
        map.mbind(l.pools[t], l.pool_slots[t] * PAGE_SIZE, &[spec.node])?;
    }
    debug_assert!(l.guest.is_multiple_of(HUGE_PAGE_SIZE));
    Ok(())
}

/// Attempts of a rollback move before it gives up.
const ROLLBACK_ATTEMPTS: u32 = 8;

/// Locks a mutex, ignoring poisoning (state stays consistent: every critical
/// section is a few non-panicking updates).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a pool slot reservation for `pages` guest pages gave: one whole
/// chunk (a 2 MiB run moves as a huge page) or separate page slots.
#[derive(Debug, Clone)]
pub(crate) enum Staging {
    /// A whole huge chunk (its first slot) and what it held.
    Chunk(Slot, Holds),
    /// Page slots, each with what it held.
    Pages(Vec<(Slot, Holds)>),
}

impl Staging {
    /// Address of the `i`-th page.
    pub(crate) fn addr(&self, mem: &TieredMemory, tier: TierId, i: usize) -> usize {
        match self {
            Staging::Chunk(first, _) => mem.slot_addr(tier, *first) + i * PAGE_SIZE,
            Staging::Pages(v) => mem.slot_addr(tier, v[i].0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_parses() {
        assert_eq!("random:9".parse(), Ok(InitialPlacement::Random { seed: 9 }));
        assert_eq!("random".parse(), Ok(InitialPlacement::Random { seed: 0 }));
        assert_eq!("fast-first".parse(), Ok(InitialPlacement::FastFirst));
        assert_eq!("slow-first".parse(), Ok(InitialPlacement::SlowFirst));
        assert_eq!("interleave".parse(), Ok(InitialPlacement::Interleave));
        assert!("random:x".parse::<InitialPlacement>().is_err());
        assert!("Fast-first".parse::<InitialPlacement>().is_err());
    }

    /// The documented default host reserve (64 MiB).
    #[test]
    fn the_default_host_reserve_is_64_mib() {
        assert_eq!(DEFAULT_HOST_RESERVE_BYTES, 64 * 1024 * 1024);
        assert_eq!(
            MemConfig::new(PAGE_SIZE, 1).host_reserve_bytes,
            64 * 1024 * 1024
        );
    }

    /// Each limit of `validate` at its boundary: the largest value passes,
    /// one more is refused with its own error. (Nothing is allocated.)
    #[test]
    fn config_limits_hold_at_their_boundaries() {
        use MemConfigError as E;
        let max = u32::MAX as usize;
        let guest = |pages: usize| {
            let mut c = MemConfig::new(pages * PAGE_SIZE, 1);
            c.tiers[1].capacity_pages = max;
            c.tiers[1].max_capacity_pages = max;
            c.validate()
        };
        assert_eq!(guest(max), Ok(()));
        assert!(matches!(guest(max + 1), Err(E::GuestTooLarge)));
        let tiers = |count: usize| {
            let mut c = MemConfig::new(64 * PAGE_SIZE, 64);
            c.tiers = vec![c.tiers[0].clone(); count];
            c.validate()
        };
        assert_eq!(tiers(MAX_TIERS), Ok(()));
        assert!(matches!(tiers(MAX_TIERS + 1), Err(E::TierCount(n)) if n == MAX_TIERS + 1));
        let mut c = MemConfig::new(64 * PAGE_SIZE, 64);
        c.tiers.clear();
        assert!(matches!(c.validate(), Err(E::TierCount(0))));
        let tier_max = |pages: usize| {
            let mut c = MemConfig::new(64 * PAGE_SIZE, 64);
            c.tiers[1].max_capacity_pages = pages;
            c.validate()
        };
        assert_eq!(tier_max(max), Ok(()));
        assert!(matches!(tier_max(max + 1), Err(E::TierTooLarge(t)) if t == "slow"));
        let holding = |slow: usize| {
            let mut c = MemConfig::new(64 * PAGE_SIZE, 16);
            c.tiers[1].capacity_pages = slow;
            c.validate()
        };
        assert_eq!(holding(48), Ok(()));
        assert!(matches!(
            holding(47),
            Err(E::CapacitiesTooSmall {
                total: 63,
                guest: 64
            })
        ));
    }

    #[test]
    fn configs_that_cannot_hold_the_guest_are_refused() {
        let mut c = MemConfig::new(64 * PAGE_SIZE, 16);
        c.tiers[1].capacity_pages = 10;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("smaller than the guest"), "{e}");
        let mut c = MemConfig::new(64 * PAGE_SIZE, 16);
        c.tiers.clear();
        assert!(c.validate().is_err());
        let mut c = MemConfig::new(64 * PAGE_SIZE, 16);
        c.tiers[0].max_capacity_pages = 1;
        assert!(c.validate().is_err());
        let mut c = MemConfig::new(64 * PAGE_SIZE, 16);
        c.tiers[0].node = 99;
        assert!(c.validate().is_err());
        assert!(MemConfig::new(3, 1).validate().is_err());
    }

    /// The reservation is guest RAM, each tier's pool (two halves), the
    /// shadow area and the parking area back to back, and nothing more;
    /// each pool half has a slot for every page its tier can take plus its
    /// cache, with less than two chunks of rounding on top.
    #[test]
    fn the_layout_is_its_areas_back_to_back_with_pools_sized_to_their_tiers() {
        let n = 3000;
        let mut cfg = MemConfig::new(n * PAGE_SIZE, 1000);
        cfg.tiers[0].max_capacity_pages = 1000;
        cfg.pool_cache_pages = 100;
        let (map, l, halves) = reserve_layout(&cfg, n).unwrap();
        assert_eq!(l.area_pages, round_chunk(n));
        assert_eq!(l.guest, map.addr());
        let mut at = l.guest + l.area_pages * PAGE_SIZE;
        for (i, t) in cfg.tiers.iter().enumerate() {
            let need = t.max_capacity_pages.min(n) + cfg.pool_cache_pages;
            assert!(
                halves[i] >= need && halves[i] < need + 2 * CHUNK_SLOTS,
                "tier {i}: half of {} slots for {need} pages",
                halves[i]
            );
            assert_eq!(l.pool_slots[i], 2 * halves[i]);
            assert_eq!(l.pools[i], at, "tier {i}'s pool");
            at += l.pool_slots[i] * PAGE_SIZE;
        }
        assert_eq!((l.shadow, l.park), (at, at + l.area_pages * PAGE_SIZE));
        assert_eq!(map.addr() + map.len(), l.park + l.area_pages * PAGE_SIZE);
    }

    /// Tiers are real only on distinct nodes of a multi-node host.
    #[test]
    fn tiers_are_emulated_unless_on_distinct_nodes_of_a_multi_node_host() {
        for (nodes, host, emulated) in [
            (&[0, 1][..], 2, false),
            (&[1, 0], 2, false),
            (&[0, 1, 2], 3, false),
            (&[0, 1], 4, false),
            (&[0, 0], 2, true),
            (&[0, 1, 1], 3, true),
            (&[0, 1], 1, true),
            (&[0], 1, true),
        ] {
            assert_eq!(
                tiers_are_emulated(nodes, host),
                emulated,
                "{nodes:?} on {host} nodes"
            );
        }
    }

    /// A memory reports what it was configured with (and how long its
    /// set-up took).
    #[test]
    fn a_memory_reports_its_configuration() {
        use crate::host_support::{require, HostFeature};
        if !require(&[HostFeature::UserfaultfdMove]) {
            return;
        }
        let mut cfg = MemConfig::new(64 * PAGE_SIZE, 16);
        cfg.huge_pages = false;
        cfg.tiers[1].name = "cxl".into();
        let mem = TieredMemory::new(&cfg).unwrap();
        assert!(!mem.huge_pages());
        assert_eq!(mem.tier_spec(1).map(|t| t.name.as_str()), Some("cxl"));
        assert!(mem.tier_spec(2).is_none());
        assert!(mem.setup_time() > Duration::ZERO);
        // Page lookups end at the guest's last page.
        mem.prefault(0, 64).unwrap();
        assert_eq!((mem.tier_of(0), mem.tier_of(63)), (Some(0), Some(1)));
        assert_eq!((mem.tier_of(64), mem.shadow_tier(64)), (None, None));
        assert!(!mem.has_shadow(64));
        // Both tiers on node 0: emulated whatever the host.
        assert!(mem.emulated());
        assert_eq!(
            mem.emulated(),
            tiers_are_emulated(&[0, 0], host_node_count())
        );
    }

    /// The host's node count is that of its NUMA nodes with memory, and at
    /// least 1 (a host whose nodes cannot be read is one node): what decides
    /// whether tiers on distinct nodes are real or emulated. cargo-mutants:
    /// `host_node_count` returning 0 (and returning 1, which only a host
    /// with two nodes or more can tell apart).
    #[test]
    fn the_host_node_count_is_its_nodes_with_memory() {
        let nodes = crate::host::numa_nodes().map(|v| v.len()).unwrap_or(0);
        assert_eq!(host_node_count(), nodes.max(1));
    }

    /// Address lookups end where their areas end; the shadow low
    /// watermark defaults to 1/64 of a tier's capacity, at least 16 pages
    /// (16 for a tier that does not exist).
    #[test]
    fn addresses_and_watermarks_of_a_memory() {
        use crate::host_support::{require, HostFeature};
        if !require(&[HostFeature::UserfaultfdMove]) {
            return;
        }
        let mut cfg = MemConfig::new(4096 * PAGE_SIZE, 512);
        cfg.tiers[1].capacity_pages = 4096;
        let mem = TieredMemory::new(&cfg).unwrap();
        let base = mem.guest_addr(0) as u64;
        let end = base + (4096 * PAGE_SIZE) as u64;
        assert_eq!(mem.guest_page_of(base), Some(0));
        assert_eq!(mem.guest_page_of(base + PAGE_SIZE as u64 + 5), Some(1));
        assert_eq!(mem.guest_page_of(end - 1), Some(4095));
        assert_eq!(
            (mem.guest_page_of(end), mem.guest_page_of(base - 1)),
            (None, None)
        );
        let (start, len) = (mem.mapping().addr() as u64, mem.mapping().len() as u64);
        assert!(mem.owns_addr(start) && mem.owns_addr(start + len - 1));
        assert!(!mem.owns_addr(start - 1) && !mem.owns_addr(start + len));
        assert!(mem.owns_addr(mem.park_addr(4095) as u64));
        assert_eq!(mem.shadow_addr(3) - mem.shadow_addr(2), PAGE_SIZE);
        assert_eq!(
            mem.slot_addr(1, Slot(2)) - mem.slot_addr(1, Slot(0)),
            2 * PAGE_SIZE
        );
        assert_eq!(
            (0..3)
                .map(|t| mem.shadow_low_watermark(t))
                .collect::<Vec<_>>(),
            [16, 64, 16]
        );
    }

    /// Each page's node is queried in batches of 64 Ki pages: a guest of
    /// more than one batch gets an answer for every page, in order (here
    /// -ENOENT for every page but the last, the only one touched).
    #[test]
    fn node_queries_cover_a_guest_larger_than_one_batch() {
        use crate::host_support::{require, HostFeature};
        if !require(&[HostFeature::UserfaultfdMove]) {
            return;
        }
        let n = (1 << 16) + 100;
        let mut cfg = MemConfig::new(n * PAGE_SIZE, 64);
        cfg.huge_pages = false;
        let mem = TieredMemory::new(&cfg).unwrap();
        mem.prefault(n - 1, 1).unwrap();
        let nodes = mem.query_guest_nodes().unwrap();
        assert_eq!(nodes.len(), n);
        assert_eq!(nodes[n - 1], 0);
        assert!(nodes[..n - 1].iter().all(|&x| x == -libc::ENOENT));
    }

    /// A move with either end outside the memory's own areas is refused
    /// before the kernel sees it, and nothing moves.
    #[test]
    fn a_move_with_an_end_outside_the_memory_is_refused() {
        use crate::host_support::{require, HostFeature};
        if !require(&[HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = TieredMemory::new(&MemConfig::new(64 * PAGE_SIZE, 64)).unwrap();
        // Outside: a mapping like the memory's own (locked on fault when
        // the memory is, so the kernel's checks alone would let a move
        // through), with a page holding 7.
        let other = Mapping::reserve(PAGE_SIZE).unwrap();
        if mem.locked() {
            other.lock_on_fault().unwrap();
        }
        let outside = other.addr();
        // SAFETY: the first page of `other`, a read/write private mapping
        // this test owns, reached only through raw pointers.
        unsafe { (outside as *mut u64).write_volatile(7) };
        let inside = mem.guest_addr(0);
        for (dst, src) in [(inside, outside), (outside, inside)] {
            let e = mem.move_range(dst, src, PAGE_SIZE, false).unwrap_err();
            assert_eq!((e.errno, e.moved), (libc::EINVAL, 0));
        }
        // SAFETY: as above; the page is still there (nothing moved it).
        assert_eq!(unsafe { (outside as *const u64).read_volatile() }, 7);
    }

    /// A memory of `pages` pages, all committed, with no fault handler
    /// (the tests below never touch a hole they make).
    fn committed(pages: usize) -> Option<TieredMemory> {
        use crate::host_support::{require, HostFeature};
        if !require(&[HostFeature::UserfaultfdMove]) {
            return None;
        }
        let mem = TieredMemory::new(&MemConfig::new(pages * PAGE_SIZE, pages)).unwrap();
        mem.prefault(0, pages).unwrap();
        for p in 0..pages {
            // SAFETY: a committed page of guest RAM, reached only through
            // raw pointers (no vCPU runs).
            unsafe { (mem.guest_addr(p) as *mut u64).write_volatile(0x100 + p as u64) };
        }
        Some(mem)
    }

    fn present(a: usize) -> bool {
        sys::resident(a, 1).unwrap()[0]
    }

    /// After a batch move fails part way, the finishing moves what the
    /// batch left: a transient failure of one range is overcome (Ok, every
    /// page moved), and a pair whose destination is taken returns the
    /// batch's own failure (the range the kernel refused, not the retry's).
    #[test]
    fn finishing_moves_what_a_batch_left_and_returns_what_it_could_not() {
        use crate::inject::FaultPlan;
        let Some(mem) = committed(64) else {
            return;
        };
        let out = |p: usize| (mem.shadow_addr(p), mem.guest_addr(p));
        // Pages 2 and 4 (two ranges): the second range's move fails once.
        mem.injector()
            .set(&[FaultPlan::parse("move:every=2:max=1:errno=EIO").unwrap()]);
        let r = mem.move_pairs_finishing(&[out(2), out(4)]);
        mem.injector().set(&[]);
        assert!(r.is_ok(), "{r:?}");
        for p in [2, 4] {
            assert!(
                present(mem.shadow_addr(p)) && !present(mem.guest_addr(p)),
                "page {p}"
            );
            // SAFETY: the page's shadow slot, present (checked above).
            let v = unsafe { (mem.shadow_addr(p) as *const u64).read_volatile() };
            assert_eq!(v, 0x100 + p as u64);
        }
        assert_eq!(mem.stats().migration.rollback_errors, 1);
        // Pages 8 and 9 (one range) with page 9's slot taken: the kernel
        // moves page 8 and refuses page 9; page 9 stays, and the error is
        // the range's.
        crate::mem::tests_planted::plant_page(&mem, mem.shadow_addr(9));
        let e = mem.move_pairs_finishing(&[out(8), out(9)]).unwrap_err();
        assert_eq!(
            (e.dst, e.len, e.moved, e.errno),
            (mem.shadow_addr(8), 2 * PAGE_SIZE, PAGE_SIZE, libc::EEXIST)
        );
        assert!(present(mem.guest_addr(9)) && !present(mem.guest_addr(8)));
    }

    /// A page found missing from guest RAM with its copy in its parking
    /// slot is put back and released unflagged (neither parked nor a
    /// probe's).
    #[test]
    fn a_recovered_hole_is_released_unparked() {
        let Some(mem) = committed(64) else {
            return;
        };
        assert!(mem.pages.try_acquire(5, false).is_some());
        mem.move_range(mem.park_addr(5), mem.guest_addr(5), PAGE_SIZE, false)
            .unwrap();
        mem.release_page(5, page_map::PARKED | page_map::PROBE, 0);
        assert!(mem.pages.try_acquire(5, true).is_some());
        mem.recover_hole(5);
        let w = mem.pages.load(5);
        assert_eq!(w & (page_map::PARKED | page_map::PROBE | page_map::BUSY), 0);
        assert!(present(mem.guest_addr(5)) && !present(mem.park_addr(5)));
        assert_eq!(mem.fatal_error(), None);
    }

    /// A rollback move the kernel stops part way (injected: 2 of 4 pages
    /// moved, then EBUSY) finishes the rest of the range: each page once, in
    /// its place.
    #[test]
    fn a_rollback_move_stopped_part_way_finishes_the_rest() {
        use crate::inject::{FaultPlan, FaultPoint};
        let Some(mem) = committed(64) else {
            return;
        };
        mem.injector()
            .set(&[FaultPlan::parse("move:max=1:errno=EBUSY:moved=2").unwrap()]);
        let r = mem.move_retrying(mem.shadow_addr(8), mem.guest_addr(8), 4 * PAGE_SIZE);
        let fired = mem.injector().fired(FaultPoint::Move);
        mem.injector().set(&[]);
        assert!(r.is_ok() && fired == 1, "{r:?}, {fired} injected");
        for p in 6..14 {
            let moved = (8..12).contains(&p);
            assert_eq!(present(mem.shadow_addr(p)), moved, "page {p}'s slot");
            assert_eq!(present(mem.guest_addr(p)), !moved, "page {p}");
        }
        for p in 8..12 {
            // SAFETY: the page's shadow slot, present (checked above).
            let v = unsafe { (mem.shadow_addr(p) as *const u64).read_volatile() };
            assert_eq!(v, 0x100 + p as u64);
        }
    }

    /// Every area has its explicit memory policy (`bind`, as
    /// /proc/self/numa_maps shows it): the guest, shadow and parking areas
    /// on the tiers' nodes, each pool on its tier's. A range left with the
    /// default policy would be NUMA balancing's to scan and move.
    #[test]
    fn every_area_is_bound_to_its_nodes() {
        use crate::host_support::{require, HostFeature};
        if !require(&[HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = TieredMemory::new(&MemConfig::new(1024 * PAGE_SIZE, 512)).unwrap();
        let l = &mem.layout;
        let pools_end = l.pools[1] + l.pool_slots[1] * PAGE_SIZE;
        let areas = [
            ("guest", l.guest, l.guest + l.area_pages * PAGE_SIZE),
            ("shadow", l.shadow, l.shadow + l.area_pages * PAGE_SIZE),
            ("parking", l.park, l.park + l.area_pages * PAGE_SIZE),
            ("pools", l.pools[0], pools_end),
        ];
        let maps = std::fs::read_to_string("/proc/self/numa_maps").unwrap();
        let vmas: Vec<(usize, &str)> = maps
            .lines()
            .filter_map(|line| {
                let (start, policy) = line.split_once(' ')?;
                Some((usize::from_str_radix(start, 16).ok()?, policy))
            })
            .collect();
        for (name, start, end) in areas {
            // The mapping that holds the area's start, and any that start
            // inside it (madvise splits areas into several).
            let first = vmas.iter().rposition(|(a, _)| *a <= start);
            let inside: Vec<_> = vmas
                .iter()
                .enumerate()
                .filter(|(i, (a, _))| Some(*i) == first || (start..end).contains(a))
                .map(|(_, v)| v)
                .collect();
            assert!(first.is_some(), "{name}: no mapping at {start:#x}");
            for (a, policy) in inside {
                assert!(policy.starts_with("bind:"), "{name} at {a:#x}: {policy}");
            }
        }
    }
}
