//! [`TieredMemory`]: guest RAM as one private anonymous mapping whose every
//! 4 KiB page lives on one tier, plus per-tier free-page pools, a shadow area
//! and a parking area, all registered with one userfaultfd.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Receiver, Sender};

use super::dirty::SoftDirtyLog;
use super::page_map::{self, PageMap, BUSY, PARKED, PROBE, SHADOW, SLOW};
use super::pool::{Pool, SlotKind};
use super::stats::{Counters, MemStats, TierStats};
use super::sys::{self, EventFd, Mapping, Uffd, PAGE_SIZE};
use super::{AccessSample, MemError, Tier};

/// How guest pages are spread over the tiers at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Placement {
    /// Fill the fast tier first, the rest goes slow (Linux's default).
    FastFirst,
    /// Fill the slow tier first, the rest goes fast.
    SlowFirst,
    /// Each page picks a tier with equal odds (deterministic for a seed) while
    /// both have room.
    Random {
        /// Seed of the placement's random generator.
        seed: u64,
    },
    /// Alternate fast, slow, fast, ... while both have room.
    Interleave,
}

impl std::str::FromStr for Placement {
    type Err = String;
    /// Parses `fast-first`, `slow-first`, `interleave` or `random:SEED`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast-first" => Ok(Placement::FastFirst),
            "slow-first" => Ok(Placement::SlowFirst),
            "interleave" => Ok(Placement::Interleave),
            "random" => Ok(Placement::Random { seed: 0 }),
            _ => match s.strip_prefix("random:").map(str::parse::<u64>) {
                Some(Ok(seed)) => Ok(Placement::Random { seed }),
                _ => Err(format!(
                    "unknown placement '{s}': use fast-first, slow-first, interleave or random:SEED"
                )),
            },
        }
    }
}

/// Configuration of a [`TieredMemory`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MemConfig {
    /// Guest RAM size in bytes (multiple of 4 KiB).
    pub guest_bytes: usize,
    /// Host NUMA node of the fast tier.
    pub fast_node: u32,
    /// Host NUMA node of the slow tier.
    pub slow_node: u32,
    /// Fast tier capacity in 4 KiB pages (guest pages + free pool).
    pub fast_capacity_pages: usize,
    /// Slow tier capacity in pages (guest pages + shadows + free pool);
    /// `None`: as many as the guest has pages (the whole guest fits there).
    pub slow_capacity_pages: Option<usize>,
    /// Initial placement.
    pub placement: Placement,
    /// Reclaim shadows (oldest first) when the slow tier's free pages fall
    /// below this; `None`: 1/64 of the slow capacity (at least 16).
    pub shadow_low_watermark_pages: Option<usize>,
}

impl MemConfig {
    /// A config with slow capacity = guest size and fast-first placement.
    pub fn new(guest_bytes: usize, fast_capacity_pages: usize) -> Self {
        Self {
            guest_bytes,
            fast_node: 0,
            slow_node: 0,
            fast_capacity_pages,
            slow_capacity_pages: None,
            placement: Placement::FastFirst,
            shadow_low_watermark_pages: None,
        }
    }
}

/// Guest RAM on tiered host memory. Shared (`Arc`) by the mover, the fault
/// handler, the sampler and the VMM.
#[derive(Debug)]
pub struct TieredMemory {
    map: Mapping,
    guest_pages: usize,
    pool_base: [usize; 2],
    shadow_base: usize,
    park_base: usize,
    pub(crate) pages: PageMap,
    pools: [Mutex<Pool>; 2],
    pub(crate) uffd: Uffd,
    nodes: [u32; 2],
    capacities: [usize; 2],
    emulated: bool,
    shadow_low_watermark: usize,
    shadow_fifo: Mutex<VecDeque<(u32, u16)>>,
    shadow_gen: AtomicU32,
    pub(crate) counters: Counters,
    pub(crate) vmm_dirty: SoftDirtyLog,
    release_tx: Sender<(u32, Instant)>,
    pub(crate) release_rx: Receiver<(u32, Instant)>,
    pub(crate) release_event: EventFd,
    pub(crate) samples: Mutex<Vec<AccessSample>>,
    pub(crate) park_epoch: Mutex<Instant>,
    overhead_pct_bits: AtomicU64,
    setup_time: Duration,
    fault_path_hook: HookSlot,
}

/// Who parks a page for hint faults: each maps back only its own pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parker {
    /// The [`super::HintSampler`]'s scan windows.
    Sampler,
    /// [`super::AccessProbes`] (accessed bits of pages a policy tests).
    Probe,
}

/// Holder of the fault-path hook (a closure has no `Debug`).
#[derive(Default)]
struct HookSlot(std::sync::RwLock<Option<FaultPathHook>>);

impl std::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookSlot")
    }
}

/// Asked by the fault handler when the guest touches a parked slow page:
/// `true` = promote it now, before the faulting access resumes (TPP's
/// promotion in the NUMA-hint-fault path). The sample passed in is the hint
/// fault; when a hook is installed, hint faults are delivered through it
/// instead of [`TieredMemory::drain_samples`].
pub type FaultPathHook = std::sync::Arc<dyn Fn(&AccessSample) -> bool + Send + Sync>;

struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn initial_tiers(n: usize, fast_cap: usize, slow_cap: usize, placement: Placement) -> Vec<Tier> {
    let mut left = [fast_cap, slow_cap];
    let mut rng = SplitMix(match placement {
        Placement::Random { seed } => seed,
        _ => 0,
    });
    (0..n)
        .map(|i| {
            let want = match placement {
                Placement::FastFirst => Tier::Fast,
                Placement::SlowFirst => Tier::Slow,
                Placement::Interleave => {
                    if i % 2 == 0 {
                        Tier::Fast
                    } else {
                        Tier::Slow
                    }
                }
                Placement::Random { .. } => {
                    if rng.next() & 1 == 0 {
                        Tier::Fast
                    } else {
                        Tier::Slow
                    }
                }
            };
            let t = if left[want.index()] > 0 {
                want
            } else {
                want.other()
            };
            left[t.index()] -= 1;
            t
        })
        .collect()
}

/// A chunk of population work.
#[derive(Clone, Copy)]
enum PopulateJob {
    /// Guest pages `[first, end)`, each from its tier's node (thread mempolicy).
    Guest { first: usize, end: usize },
    /// A pool range (its VMA is already bound to the node).
    Pool { addr: usize, len: usize },
}

const POPULATE_CHUNK_PAGES: usize = 4096;

/// Faults in guest pages `[first, end)`, each on its tier's node, switching the
/// calling thread's memory policy only when the node changes.
fn populate_guest(
    base: usize,
    tiers: &[Tier],
    nodes: [u32; 2],
    first: usize,
    end: usize,
    cur_node: &mut Option<u32>,
) -> std::io::Result<()> {
    let mut i = first;
    while i < end {
        let t = tiers[i];
        let start = i;
        while i < end && tiers[i] == t {
            i += 1;
        }
        let node = nodes[t.index()];
        if *cur_node != Some(node) {
            sys::set_thread_mempolicy(Some(node))?;
            *cur_node = Some(node);
        }
        let len = i - start;
        if len >= 8 {
            sys::populate_write(base + start * PAGE_SIZE, len * PAGE_SIZE)?;
        } else {
            for p in start..i {
                // SAFETY: the page lies inside guest RAM, which only the populate threads
                // touch during setup; writing a zero to a fresh anonymous page faults it in.
                unsafe { ((base + p * PAGE_SIZE) as *mut u8).write_volatile(0) };
            }
        }
    }
    Ok(())
}

/// Runs the population jobs on all available cores.
fn populate_parallel(
    base: usize,
    tiers: &[Tier],
    nodes: [u32; 2],
    jobs: &[PopulateJob],
) -> Result<(), MemError> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<(), MemError> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> std::io::Result<()> {
                    let mut cur_node = None;
                    let res = (|| loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(j) else {
                            return Ok(());
                        };
                        match *job {
                            PopulateJob::Guest { first, end } => {
                                populate_guest(base, tiers, nodes, first, end, &mut cur_node)?
                            }
                            PopulateJob::Pool { addr, len } => sys::populate_write(addr, len)?,
                        }
                    })();
                    if cur_node.is_some() {
                        sys::set_thread_mempolicy(None)?;
                    }
                    res
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| MemError::Config("populate thread panicked".into()))??;
        }
        Ok(())
    })
}

impl TieredMemory {
    /// Creates and pre-populates tiered guest RAM. Every guest page and every
    /// free pool page is faulted in on its tier's node before the userfaultfd
    /// is registered, so neither the guest nor the VMM ever faults on a
    /// never-touched page.
    pub fn new(cfg: &MemConfig) -> Result<Self, MemError> {
        let t0 = Instant::now();
        if cfg.guest_bytes == 0 || !cfg.guest_bytes.is_multiple_of(PAGE_SIZE) {
            return Err(MemError::Config(format!(
                "guest size {} is not a positive multiple of 4 KiB",
                cfg.guest_bytes
            )));
        }
        let n = cfg.guest_bytes / PAGE_SIZE;
        if n > u32::MAX as usize {
            return Err(MemError::Config(
                "guest RAM above 16 TiB is not supported".into(),
            ));
        }
        let fast_cap = cfg.fast_capacity_pages;
        let slow_cap = cfg.slow_capacity_pages.unwrap_or(n);
        if fast_cap + slow_cap < n {
            return Err(MemError::Config(format!(
                "tier capacities ({fast_cap} fast + {slow_cap} slow pages) are smaller than the \
                 guest ({n} pages); raise the fast or slow capacity"
            )));
        }
        let tiers = initial_tiers(n, fast_cap, slow_cap, cfg.placement);
        let mut used = [0usize; 2];
        for t in &tiers {
            used[t.index()] += 1;
        }
        let caps = [fast_cap, slow_cap];
        let total = (n + fast_cap + slow_cap + 2 * n) * PAGE_SIZE;
        let map = Mapping::anonymous(total)?;
        let guest_base = map.addr();
        let pool_base = [
            guest_base + n * PAGE_SIZE,
            guest_base + (n + fast_cap) * PAGE_SIZE,
        ];
        let shadow_base = pool_base[1] + slow_cap * PAGE_SIZE;
        let park_base = shadow_base + n * PAGE_SIZE;
        let nodes = [cfg.fast_node, cfg.slow_node];
        let mut jobs = Vec::new();
        for t in [Tier::Fast, Tier::Slow] {
            let i = t.index();
            if caps[i] > 0 {
                sys::mbind(pool_base[i], caps[i] * PAGE_SIZE, nodes[i])?;
                let free = caps[i] - used[i];
                for c in (0..free).step_by(POPULATE_CHUNK_PAGES) {
                    let len = POPULATE_CHUNK_PAGES.min(free - c);
                    jobs.push(PopulateJob::Pool {
                        addr: pool_base[i] + c * PAGE_SIZE,
                        len: len * PAGE_SIZE,
                    });
                }
            }
        }
        // Guest RAM keeps a single VMA whatever the placement: each page is
        // faulted in under a thread memory policy for its tier's node.
        for c in (0..n).step_by(POPULATE_CHUNK_PAGES) {
            jobs.push(PopulateJob::Guest {
                first: c,
                end: (c + POPULATE_CHUNK_PAGES).min(n),
            });
        }
        populate_parallel(guest_base, &tiers, nodes, &jobs)?;
        let uffd = Uffd::new()?;
        uffd.register_missing(map.addr(), map.len())?;
        let (release_tx, release_rx) = unbounded();
        let low = cfg
            .shadow_low_watermark_pages
            .unwrap_or_else(|| (slow_cap / 64).max(16));
        let host_nodes = sys::host_memory_nodes();
        Ok(Self {
            pools: [
                Mutex::new(Pool::new(fast_cap, fast_cap - used[0])),
                Mutex::new(Pool::new(slow_cap, slow_cap - used[1])),
            ],
            pages: PageMap::new(&tiers),
            map,
            guest_pages: n,
            pool_base,
            shadow_base,
            park_base,
            uffd,
            nodes,
            capacities: caps,
            emulated: cfg.fast_node == cfg.slow_node || host_nodes < 2,
            shadow_low_watermark: low,
            shadow_fifo: Mutex::new(VecDeque::new()),
            shadow_gen: AtomicU32::new(0),
            counters: Counters::default(),
            vmm_dirty: SoftDirtyLog::new(n),
            release_tx,
            release_rx,
            release_event: EventFd::new()?,
            samples: Mutex::new(Vec::new()),
            park_epoch: Mutex::new(Instant::now()),
            overhead_pct_bits: AtomicU64::new(0),
            setup_time: t0.elapsed(),
            fault_path_hook: HookSlot::default(),
        })
    }

    /// Host address of guest RAM (for `MmapRegion::build_raw` and the KVM memslot).
    pub fn guest_ptr(&self) -> *mut u8 {
        self.map.addr() as *mut u8
    }

    /// Guest RAM length in bytes.
    pub fn guest_len(&self) -> usize {
        self.guest_pages * PAGE_SIZE
    }

    /// Number of 4 KiB guest pages.
    pub fn guest_pages(&self) -> usize {
        self.guest_pages
    }

    /// How long creation (mapping, binding, populating, registering) took.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// Whether the tiers are emulated (same node, or a one-node host).
    pub fn emulated(&self) -> bool {
        self.emulated
    }

    /// Host NUMA node of a tier.
    pub fn node(&self, tier: Tier) -> u32 {
        self.nodes[tier.index()]
    }

    /// Capacity of a tier in pages.
    pub fn capacity(&self, tier: Tier) -> usize {
        self.capacities[tier.index()]
    }

    /// Current tier of a guest page (None if out of range).
    pub fn tier_of(&self, page: usize) -> Option<Tier> {
        (page < self.guest_pages).then(|| page_map::tier_of(self.pages.load(page)))
    }

    /// Whether a guest page currently has a slow shadow.
    pub fn has_shadow(&self, page: usize) -> bool {
        page < self.guest_pages && self.pages.load(page) & SHADOW != 0
    }

    /// Guest pages per tier, counted from the page map: `[fast, slow]`.
    pub fn guest_pages_per_tier(&self) -> [usize; 2] {
        let mut c = [0usize; 2];
        for p in 0..self.guest_pages {
            c[page_map::tier_of(self.pages.load(p)).index()] += 1;
        }
        c
    }

    /// Number of shadows, from the page map.
    pub fn shadow_pages(&self) -> usize {
        (0..self.guest_pages)
            .filter(|&p| self.pages.load(p) & SHADOW != 0)
            .count()
    }

    /// Free pages in a tier's pool.
    pub fn free_pages(&self, tier: Tier) -> usize {
        self.pool(tier).free_pages()
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
    /// (`-ENOENT` for a page that is in flight or parked).
    pub fn query_guest_nodes(&self) -> std::io::Result<Vec<i32>> {
        let addrs: Vec<usize> = (0..self.guest_pages).map(|p| self.guest_addr(p)).collect();
        sys::query_nodes(&addrs)
    }

    /// Guest pages per tier counted from the host's view (`move_pages` query):
    /// `[pages on the fast node, pages on the slow node]`, with pages that are
    /// not present (in flight, parked) left out. On a host where the tiers are
    /// distinct nodes this matches [`guest_pages_per_tier`](Self::guest_pages_per_tier);
    /// with emulated tiers (one node) every page reports the same node.
    pub fn guest_pages_per_node(&self) -> std::io::Result<[usize; 2]> {
        let nodes = self.query_guest_nodes()?;
        let mut c = [0usize; 2];
        for n in nodes {
            if n == self.nodes[0] as i32 {
                c[0] += 1;
            } else if n == self.nodes[1] as i32 {
                c[1] += 1;
            }
        }
        Ok(c)
    }

    /// Checks that every present guest page sits on its tier's node
    /// (`move_pages` query). Meaningful only when the tiers are distinct nodes;
    /// with emulated tiers it checks that every page is on the shared node.
    pub fn check_nodes(&self) -> Result<(), String> {
        let nodes = self.query_guest_nodes().map_err(|e| e.to_string())?;
        for (p, n) in nodes.into_iter().enumerate() {
            if n < 0 {
                continue;
            }
            let want = self.nodes[page_map::tier_of(self.pages.load(p)).index()] as i32;
            if n != want {
                return Err(format!(
                    "page {p} is on node {n} but its tier's node is {want}"
                ));
            }
        }
        Ok(())
    }

    /// Software dirty log for writes the VMM itself makes to guest RAM (device
    /// emulation, loaders). Use [`SoftDirtyLog::write_guard`] around each write;
    /// the harvester ORs this log into every harvest.
    pub fn vmm_writes(&self) -> &SoftDirtyLog {
        &self.vmm_dirty
    }

    /// Drains the access samples recorded by the fault handler for parked pages.
    pub fn drain_samples(&self) -> Vec<AccessSample> {
        std::mem::take(&mut *lock(&self.samples))
    }

    /// Statistics snapshot.
    pub fn stats(&self) -> MemStats {
        let per_tier = self.guest_pages_per_tier();
        let shadows = self.shadow_pages();
        let mut s = self.counters.snapshot();
        s.tracking_overhead_pct = f64::from_bits(self.overhead_pct_bits.load(Ordering::Relaxed));
        s.shadow_pages = shadows as u64;
        s.tiers = [Tier::Fast, Tier::Slow]
            .into_iter()
            .map(|t| {
                let i = t.index();
                let sh = if t == Tier::Slow { shadows } else { 0 };
                TierStats {
                    name: t.name().to_string(),
                    node: self.nodes[i],
                    capacity_pages: self.capacities[i] as u64,
                    pages: (per_tier[i] + sh) as u64,
                    guest_pages: per_tier[i] as u64,
                    shadow_pages: sh as u64,
                    free_pages: self.free_pages(t) as u64,
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

    pub(crate) fn set_overhead_pct(&self, pct: f64) {
        self.overhead_pct_bits
            .store(pct.to_bits(), Ordering::Relaxed);
    }

    /// Checks, while no mover runs, that every page is accounted for exactly
    /// once: per tier, guest pages + shadows + free pool pages = capacity, and
    /// the residency of every slot of every area matches the page map and the
    /// pools (no page lost, none duplicated). Returns the first violation.
    pub fn check_consistency(&self) -> Result<(), String> {
        let per_tier = self.guest_pages_per_tier();
        let shadows = self.shadow_pages();
        for t in [Tier::Fast, Tier::Slow] {
            let i = t.index();
            let pool = self.pool(t);
            let reserved = pool.capacity() - pool.free_pages() - pool.holes();
            if reserved != 0 {
                return Err(format!("{} pool has {reserved} reserved slots", t.name()));
            }
            let sh = if t == Tier::Slow { shadows } else { 0 };
            if per_tier[i] + sh + pool.free_pages() != self.capacities[i] {
                return Err(format!(
                    "{}: guest {} + shadows {} + free {} != capacity {}",
                    t.name(),
                    per_tier[i],
                    sh,
                    pool.free_pages(),
                    self.capacities[i]
                ));
            }
            let res =
                sys::resident(self.pool_base[i], pool.capacity()).map_err(|e| e.to_string())?;
            for (s, r) in res.iter().enumerate() {
                if *r != pool.is_free(s) {
                    return Err(format!(
                        "{} pool slot {s}: resident={r} free={}",
                        t.name(),
                        !r
                    ));
                }
            }
        }
        let n = self.guest_pages;
        let g = sys::resident(self.guest_addr(0), n).map_err(|e| e.to_string())?;
        let sh = sys::resident(self.shadow_base, n).map_err(|e| e.to_string())?;
        let pk = sys::resident(self.park_base, n).map_err(|e| e.to_string())?;
        for p in 0..n {
            let w = self.pages.load(p);
            if w & BUSY != 0 {
                return Err(format!("page {p} still busy"));
            }
            let parked = w & PARKED != 0;
            if w & PROBE != 0 && !parked {
                return Err(format!("page {p}: probe bit without parked bit"));
            }
            if g[p] == parked || pk[p] != parked {
                return Err(format!(
                    "page {p}: in guest RAM={} in parking={} but parked={parked}",
                    g[p], pk[p]
                ));
            }
            if sh[p] != (w & SHADOW != 0) {
                return Err(format!(
                    "page {p}: shadow slot resident={} but shadow bit={}",
                    sh[p], !sh[p]
                ));
            }
            if w & SHADOW != 0 && w & SLOW != 0 {
                return Err(format!("page {p}: a slow page with a shadow"));
            }
        }
        Ok(())
    }

    // ---- internal helpers for the mechanisms ----

    pub(crate) fn guest_addr(&self, page: usize) -> usize {
        self.map.addr() + page * PAGE_SIZE
    }
    pub(crate) fn pool_addr(&self, tier: Tier, slot: u32) -> usize {
        self.pool_base[tier.index()] + slot as usize * PAGE_SIZE
    }
    pub(crate) fn shadow_addr(&self, page: usize) -> usize {
        self.shadow_base + page * PAGE_SIZE
    }
    pub(crate) fn park_addr(&self, page: usize) -> usize {
        self.park_base + page * PAGE_SIZE
    }
    pub(crate) fn shadow_low_watermark(&self) -> usize {
        self.shadow_low_watermark
    }

    /// Page index of a guest RAM address.
    pub(crate) fn guest_page_of(&self, addr: u64) -> Option<usize> {
        let a = addr as usize;
        let base = self.map.addr();
        (a >= base && a < base + self.guest_len()).then(|| (a - base) / PAGE_SIZE)
    }

    /// Whether the address lies in any area of this memory.
    pub(crate) fn owns_addr(&self, addr: u64) -> bool {
        let a = addr as usize;
        a >= self.map.addr() && a < self.map.addr() + self.map.len()
    }

    pub(crate) fn pool(&self, tier: Tier) -> MutexGuard<'_, Pool> {
        lock(&self.pools[tier.index()])
    }

    pub(crate) fn reserve(&self, tier: Tier, n: usize, kind: SlotKind) -> Option<Vec<u32>> {
        self.pool(tier).reserve(n, kind)
    }

    pub(crate) fn unreserve(&self, tier: Tier, slots: &[u32], kind: SlotKind) {
        self.pool(tier).release(slots, kind)
    }

    /// Moves pages given as (dst, src) address pairs, coalescing runs where
    /// both sides are contiguous into one range move each.
    pub(crate) fn move_pairs(&self, pairs: &[(usize, usize)]) -> std::io::Result<()> {
        let mut i = 0;
        while i < pairs.len() {
            let (d0, s0) = pairs[i];
            let mut j = i + 1;
            while j < pairs.len()
                && pairs[j].0 == d0 + (j - i) * PAGE_SIZE
                && pairs[j].1 == s0 + (j - i) * PAGE_SIZE
            {
                j += 1;
            }
            self.uffd.move_range(d0, s0, (j - i) * PAGE_SIZE, true)?;
            i = j;
        }
        Ok(())
    }

    /// Whether guest page `page` (mapped, possibly being written) currently
    /// holds the same bytes as its shadow. The caller owns the page.
    pub(crate) fn page_matches_shadow(&self, page: usize) -> bool {
        let g = self.guest_addr(page) as *const u64;
        let s = self.shadow_addr(page) as *const u64;
        (0..PAGE_SIZE / 8).all(|i| {
            // SAFETY: both are page-aligned, present pages of our mapping (the
            // guest page is owned by the caller and mapped; the shadow slot of an
            // owned page with SHADOW holds its shadow); volatile reads because
            // vCPUs may write the guest page concurrently.
            unsafe { g.add(i).read_volatile() == s.add(i).read_volatile() }
        })
    }

    /// Installs (or removes) the fault-path hook.
    pub fn set_fault_path_hook(&self, hook: Option<FaultPathHook>) {
        *self
            .fault_path_hook
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner()) = hook;
    }

    pub(crate) fn fault_path_hook(&self) -> Option<FaultPathHook> {
        self.fault_path_hook
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Promotes an owned, parked slow page exclusively (stop-and-copy) while
    /// the faulting vCPU waits: copies the parked page into a free fast pool
    /// page, maps that at the guest address (which wakes the vCPU) and returns
    /// the old slow page to its pool. No dirty check is needed: the page was
    /// unmapped for the whole copy. Returns `Ok(false)` (nothing changed)
    /// when the fast tier has no free page. The caller releases the page
    /// with `PARKED | SLOW` cleared on `Ok(true)`.
    pub(crate) fn promote_parked_owned(&self, page: usize) -> std::io::Result<bool> {
        let Some(fast) = self.reserve(Tier::Fast, 1, SlotKind::Free) else {
            self.counters
                .skipped_no_space
                .fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        };
        let Some(hole) = self.reserve(Tier::Slow, 1, SlotKind::Hole) else {
            self.unreserve(Tier::Fast, &fast, SlotKind::Free);
            return Err(std::io::Error::other(
                "no slow pool hole for a promoted page (accounting bug)",
            ));
        };
        let staging = self.pool_addr(Tier::Fast, fast[0]);
        // SAFETY: both are page-aligned pages of our mapping: the parked page
        // is present in the parking area (we own it) and the staging page is a
        // reserved free fast pool page; they do not overlap.
        unsafe { sys::copy_page(staging as *mut u8, self.park_addr(page) as *const u8) };
        if let Err(e) = self
            .uffd
            .move_range(self.guest_addr(page), staging, PAGE_SIZE, true)
        {
            self.unreserve(Tier::Fast, &fast, SlotKind::Free);
            self.unreserve(Tier::Slow, &hole, SlotKind::Hole);
            return Err(e);
        }
        self.unreserve(Tier::Fast, &fast, SlotKind::Hole);
        match self.uffd.move_range(
            self.pool_addr(Tier::Slow, hole[0]),
            self.park_addr(page),
            PAGE_SIZE,
            true,
        ) {
            Ok(()) => self.unreserve(Tier::Slow, &hole, SlotKind::Free),
            Err(e) => {
                self.unreserve(Tier::Slow, &hole, SlotKind::Hole);
                return Err(e);
            }
        }
        self.counters.promotions.fetch_add(1, Ordering::Relaxed);
        self.counters.stop_copy.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Parks `pages` for hint faults (zero-copy moves to the parking area;
    /// runs of consecutive pages move with one range move) on behalf of
    /// `parker`. Busy pages are skipped. A page already parked is skipped,
    /// except that a probe takes over a sampler window page (its touch will
    /// be recorded all the same; the probe now maps it back) and counts it
    /// as parked. Returns the pages parked. On a failed move every page of
    /// the call is put back and owned bits are released, so nothing is lost.
    pub(crate) fn park_pages(
        &self,
        pages: &[usize],
        parker: Parker,
    ) -> std::io::Result<Vec<usize>> {
        let probe = parker == Parker::Probe;
        let tag = if probe { PARKED | PROBE } else { PARKED };
        let mut taken_over = Vec::new();
        let mut owned = Vec::new();
        for &p in pages.iter().filter(|&&p| p < self.guest_pages) {
            let Some(w) = self.pages.try_acquire(p, probe) else {
                continue;
            };
            if w & PARKED == 0 {
                owned.push(p);
            } else if w & PROBE == 0 {
                self.release_page(p, PROBE, 0);
                taken_over.push(p);
            } else {
                self.release_page(p, 0, 0);
            }
        }
        let pairs: Vec<_> = owned
            .iter()
            .map(|&p| (self.park_addr(p), self.guest_addr(p)))
            .collect();
        if let Err(e) = self.move_pairs(&pairs) {
            // Put back whatever moved. A page that never moved fails with
            // ENOENT and stays mapped; one that moved but cannot move back
            // stays parked, and the fault handler maps it back on its touch.
            for &p in &owned {
                match self
                    .uffd
                    .move_range(self.guest_addr(p), self.park_addr(p), PAGE_SIZE, true)
                {
                    Err(b) if b.raw_os_error() != Some(libc::ENOENT) => {
                        self.release_page(p, tag, 0)
                    }
                    _ => self.release_page(p, 0, 0),
                }
            }
            return Err(e);
        }
        for &p in &owned {
            self.release_page(p, tag, 0);
        }
        owned.extend(taken_over);
        Ok(owned)
    }

    /// Maps back those of `pages` that are still parked by `parker` (the
    /// guest never touched them). Pages owned by someone else right now (the
    /// fault handler unparking them, a harvest, a shadow reclaim) are
    /// skipped and pushed to `busy`, for the caller to retry. Returns how
    /// many were unparked.
    pub(crate) fn unpark_pages(
        &self,
        pages: &[usize],
        parker: Parker,
        busy: &mut Vec<usize>,
    ) -> std::io::Result<usize> {
        let mut n = 0;
        let mut first_err = None;
        for &page in pages.iter().filter(|&&p| p < self.guest_pages) {
            let Some(w) = self.pages.try_acquire(page, true) else {
                busy.push(page);
                continue;
            };
            if w & PARKED == 0 || (w & PROBE != 0) != (parker == Parker::Probe) {
                // Touched and mapped back already, or parked by the other side.
                self.release_page(page, 0, 0);
                continue;
            }
            match self
                .uffd
                .move_range(self.guest_addr(page), self.park_addr(page), PAGE_SIZE, true)
            {
                Ok(()) => {
                    self.release_page(page, 0, PARKED | PROBE);
                    n += 1;
                }
                Err(e) => {
                    self.release_page(page, 0, 0);
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(n), Err)
    }

    /// [`Self::unpark_pages`], retrying pages that were busy for up to
    /// about 100 ms (owners hold a page for microseconds). A page still busy
    /// after that stays parked, and the fault handler maps it back on its
    /// next touch.
    pub(crate) fn unpark_pages_settled(
        &self,
        pages: &[usize],
        parker: Parker,
    ) -> std::io::Result<usize> {
        let mut busy = Vec::new();
        let mut n = self.unpark_pages(pages, parker, &mut busy)?;
        for _ in 0..100 {
            if busy.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            let retry = std::mem::take(&mut busy);
            n += self.unpark_pages(&retry, parker, &mut busy)?;
        }
        Ok(n)
    }

    /// Releases an owned page; tells the fault handler if it waits on it.
    pub(crate) fn release_page(&self, page: usize, set: u32, clear: u32) {
        if self.pages.release(page, set, clear) {
            let _ = self.release_tx.send((page as u32, Instant::now()));
            self.release_event.signal();
        }
    }

    /// Records a new shadow for an owned page (called at commit).
    pub(crate) fn note_new_shadow(&self, page: usize) {
        let g = self.shadow_gen.fetch_add(1, Ordering::Relaxed) as u16;
        self.pages.set_generation(page, g);
        lock(&self.shadow_fifo).push_back((page as u32, g));
    }

    /// Frees the shadow of an owned page (moves it to a slow pool hole).
    /// The caller clears `SHADOW` when it releases the page.
    pub(crate) fn free_shadow_owned(&self, page: usize) -> std::io::Result<()> {
        let Some(hole) = self.reserve(Tier::Slow, 1, SlotKind::Hole) else {
            return Err(std::io::Error::other(
                "no slow pool hole for a shadow (accounting bug)",
            ));
        };
        let r = self.uffd.move_range(
            self.pool_addr(Tier::Slow, hole[0]),
            self.shadow_addr(page),
            PAGE_SIZE,
            true,
        );
        match r {
            Ok(()) => {
                self.unreserve(Tier::Slow, &hole, SlotKind::Free);
                Ok(())
            }
            Err(e) => {
                self.unreserve(Tier::Slow, &hole, SlotKind::Hole);
                Err(e)
            }
        }
    }

    /// Reclaims shadows, oldest first, until the slow pool has at least
    /// `want_free` free pages or no shadow is left. Returns the number reclaimed.
    pub fn reclaim_shadows(&self, want_free: usize) -> usize {
        let mut reclaimed = 0;
        // Shadows of pages owned by a mover (possibly the caller itself) are
        // skipped; stop after one full pass without progress.
        let mut busy_in_a_row = 0usize;
        while self.free_pages(Tier::Slow) < want_free {
            let (entry, queued) = {
                let mut q = lock(&self.shadow_fifo);
                (q.pop_front(), q.len())
            };
            let Some((page, generation)) = entry else {
                break;
            };
            let page = page as usize;
            let w = self.pages.load(page);
            if w & SHADOW == 0 || page_map::generation_of(w) != generation {
                continue; // stale entry: the shadow was freed or replaced
            }
            if self.pages.try_acquire(page, true).is_none() {
                lock(&self.shadow_fifo).push_back((page as u32, generation));
                busy_in_a_row += 1;
                if busy_in_a_row > queued {
                    break;
                }
                continue;
            }
            busy_in_a_row = 0;
            let w = self.pages.load(page);
            if w & SHADOW != 0 && page_map::generation_of(w) == generation {
                match self.free_shadow_owned(page) {
                    Ok(()) => {
                        self.release_page(page, 0, SHADOW);
                        self.counters
                            .shadow_reclaims
                            .fetch_add(1, Ordering::Relaxed);
                        reclaimed += 1;
                        continue;
                    }
                    Err(e) => tracing::error!("shadow reclaim of page {page}: {e}"),
                }
            }
            self.release_page(page, 0, 0);
        }
        reclaimed
    }
}

/// Locks a mutex, ignoring poisoning (state stays consistent: every critical
/// section is a few non-panicking updates).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_parses() {
        assert_eq!("random:9".parse(), Ok(Placement::Random { seed: 9 }));
        assert_eq!("fast-first".parse(), Ok(Placement::FastFirst));
        assert!("random:x".parse::<Placement>().is_err());
    }

    #[test]
    fn placements_respect_capacities_exactly() {
        for p in [
            Placement::FastFirst,
            Placement::SlowFirst,
            Placement::Interleave,
            Placement::Random { seed: 7 },
        ] {
            let t = initial_tiers(1000, 300, 800, p);
            let fast = t.iter().filter(|t| **t == Tier::Fast).count();
            assert!(fast <= 300 && 1000 - fast <= 800, "{p:?}: {fast}");
            match p {
                Placement::FastFirst => assert_eq!(fast, 300),
                Placement::SlowFirst => assert_eq!(fast, 200),
                Placement::Interleave => assert_eq!(fast, 300),
                Placement::Random { .. } => assert!(fast > 250, "{fast}"),
            }
        }
        assert_eq!(
            initial_tiers(100, 50, 50, Placement::Random { seed: 1 }),
            initial_tiers(100, 50, 50, Placement::Random { seed: 1 })
        );
    }
}
