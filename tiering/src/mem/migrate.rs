//! [`Migrator`]: the migration mechanisms, usable by any policy.
//!
//! - Transactional migration (TPM), batched: arm the dirty log, copy while
//!   the guest runs, unmap, one harvest, commit clean units / abort dirty ones
//!   (aborted units go to a retry queue with exponential back-off). A
//!   promotion keeps the old slow page as the shadow.
//! - Stop-and-copy (exclusive, like Linux/TPP): unmap, copy, map.
//! - Kernel `move_pages(2)` (on a one-node host it moves nothing: the node
//!   is already right; only the emulated tier bookkeeping changes).
//! - Shadow demotion: unmap the fast page, map the shadow back if the page was
//!   not written since promotion, else copy into the shadow first.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::backing::{lock, TieredMemory};
use super::dirty::DirtyLog;
use super::harvest::DirtyHarvester;
use super::page_map::{self, DIRTY_SEEN, SHADOW, SLOW};
use super::pool::SlotKind;
use super::sys::{self, PAGE_SIZE};
use super::Tier;

/// Largest unit: a 2 MiB run of 512 pages.
pub const MAX_UNIT_PAGES: usize = 512;

/// A migration unit: one 4 KiB page or a contiguous run of up to 512 pages
/// moved with range moves and one dirty check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Unit {
    /// First guest page (guest-physical address / 4096).
    pub first_page: usize,
    /// Number of pages (1..=512).
    pub pages: usize,
}

impl Unit {
    /// A single 4 KiB page.
    pub fn page(page: usize) -> Self {
        Self {
            first_page: page,
            pages: 1,
        }
    }
    /// A run of `pages` pages from `first_page`.
    pub fn run(first_page: usize, pages: usize) -> Self {
        Self { first_page, pages }
    }
}

/// Direction of a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// Slow to fast.
    Promote,
    /// Fast to slow.
    Demote,
}

impl Direction {
    fn tiers(self) -> (Tier, Tier) {
        match self {
            Direction::Promote => (Tier::Slow, Tier::Fast),
            Direction::Demote => (Tier::Fast, Tier::Slow),
        }
    }
}

/// How pages are moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mechanism {
    /// Transactional migration (Nomad's TPM): copy while the guest runs,
    /// commit only if not written meanwhile. Promotions keep a shadow.
    Transactional,
    /// Exclusive stop-and-copy: a guest touch waits for the whole unit's copy.
    StopAndCopy,
    /// The kernel's own `move_pages(2)` (exclusive; a no-op on a one-node host).
    KernelMovePages,
}

impl std::str::FromStr for Mechanism {
    type Err = String;
    /// Parses `tpm`, `stop-copy` or `move-pages`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tpm" | "transactional" => Ok(Mechanism::Transactional),
            "stop-copy" | "stop-and-copy" => Ok(Mechanism::StopAndCopy),
            "move-pages" => Ok(Mechanism::KernelMovePages),
            _ => Err(format!(
                "unknown mechanism '{s}': use tpm, stop-copy or move-pages"
            )),
        }
    }
}

/// What one batch did. Page counts unless noted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome {
    /// Pages that changed tier.
    pub migrated: usize,
    /// Committed transactions (runs).
    pub committed: usize,
    /// Aborted transactions (runs).
    pub aborted: usize,
    /// Pages of aborted transactions.
    pub aborted_pages: usize,
    /// Aborted runs queued for a retry.
    pub retries_queued: usize,
    /// Demoted by remapping their clean shadow.
    pub shadow_demoted: usize,
    /// Demoted by copying into their (stale) shadow.
    pub shadow_copied: usize,
    /// Skipped: no free page on the destination tier.
    pub skipped_no_space: usize,
    /// Skipped: owned by another mover or parked.
    pub skipped_busy: usize,
    /// Already on the destination tier.
    pub already_placed: usize,
}

impl BatchOutcome {
    /// Adds another outcome into this one.
    pub fn add(&mut self, o: &BatchOutcome) {
        self.migrated += o.migrated;
        self.committed += o.committed;
        self.aborted += o.aborted;
        self.aborted_pages += o.aborted_pages;
        self.retries_queued += o.retries_queued;
        self.shadow_demoted += o.shadow_demoted;
        self.shadow_copied += o.shadow_copied;
        self.skipped_no_space += o.skipped_no_space;
        self.skipped_busy += o.skipped_busy;
        self.already_placed += o.already_placed;
    }
}

/// Retry policy of aborted transactions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigratorConfig {
    /// Delay before the first retry; doubles with each further abort.
    pub retry_base: Duration,
    /// Aborts after which a unit is dropped.
    pub retry_max_attempts: u32,
}

impl Default for MigratorConfig {
    fn default() -> Self {
        Self {
            retry_base: Duration::from_millis(1),
            retry_max_attempts: 6,
        }
    }
}

#[derive(Debug, Clone)]
struct Retry {
    unit: Unit,
    dir: Direction,
    attempts: u32,
    due: Instant,
}

/// A run of owned pages on the same tier.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    len: usize,
}

impl Run {
    fn pages(self) -> std::ops::Range<usize> {
        self.first..self.first + self.len
    }
}

/// A prepared transaction.
struct Txn {
    run: Run,
    staging: Vec<u32>,
    /// Fast pool holes receiving the old pages (demotion); promotions park
    /// the old page in the shadow slot instead.
    old_slots: Option<Vec<u32>>,
}

/// The migration mechanisms over one [`TieredMemory`]. Thread-safe: several
/// movers may run at once (pages are owned one mover at a time).
pub struct Migrator {
    mem: Arc<TieredMemory>,
    harvester: DirtyHarvester,
    cfg: MigratorConfig,
    retries: Mutex<Vec<Retry>>,
    skip_dirty_check: AtomicBool,
}

impl std::fmt::Debug for Migrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migrator").field("cfg", &self.cfg).finish()
    }
}

impl Migrator {
    /// Mechanisms over `mem`, with `log` as the guest's dirty log (KVM's in
    /// `vmm`, a [`SoftDirtyLog`](super::SoftDirtyLog) in tests).
    pub fn new(
        mem: Arc<TieredMemory>,
        log: Box<dyn DirtyLog>,
        cfg: MigratorConfig,
    ) -> io::Result<Self> {
        let harvester = DirtyHarvester::new(log, &mem)?;
        Ok(Self {
            mem,
            harvester,
            cfg,
            retries: Mutex::new(Vec::new()),
            skip_dirty_check: AtomicBool::new(false),
        })
    }

    /// The memory this migrator moves.
    pub fn memory(&self) -> &Arc<TieredMemory> {
        &self.mem
    }

    /// TEST ONLY: commit transactions (and shadow demotions) without the dirty
    /// check. Exists to prove that the integrity tests detect lost writes.
    pub fn set_skip_dirty_check(&self, skip: bool) {
        self.skip_dirty_check.store(skip, Ordering::Relaxed);
    }

    /// Harvests the dirty log once: invalidates the shadows of pages written
    /// since promotion and updates write counts. Call it periodically (every
    /// policy tick). Returns the number of dirty pages seen.
    pub fn harvest(&self) -> io::Result<usize> {
        self.harvester.harvest(&self.mem)
    }

    /// Promotes units (slow to fast).
    pub fn promote(&self, units: &[Unit], mech: Mechanism) -> io::Result<BatchOutcome> {
        self.migrate(units, Direction::Promote, mech)
    }

    /// Demotes units (fast to slow); pages with a shadow use shadow demotion.
    pub fn demote(&self, units: &[Unit], mech: Mechanism) -> io::Result<BatchOutcome> {
        self.migrate(units, Direction::Demote, mech)
    }

    /// Migrates units in one batch.
    pub fn migrate(
        &self,
        units: &[Unit],
        dir: Direction,
        mech: Mechanism,
    ) -> io::Result<BatchOutcome> {
        self.migrate_attempt(units, dir, mech, 0)
    }

    /// Number of aborted units waiting for a retry.
    pub fn pending_retries(&self) -> usize {
        lock(&self.retries).len()
    }

    /// Retries the aborted units whose back-off has expired (as one batch per
    /// direction).
    pub fn run_due_retries(&self) -> io::Result<BatchOutcome> {
        let now = Instant::now();
        let due: Vec<Retry> = {
            let mut q = lock(&self.retries);
            let (due, keep): (Vec<_>, Vec<_>) = q.drain(..).partition(|r| r.due <= now);
            *q = keep;
            due
        };
        let mut out = BatchOutcome::default();
        for r in due {
            self.mem
                .counters
                .tpm_retries
                .fetch_add(1, Ordering::Relaxed);
            let o = self.migrate_attempt(&[r.unit], r.dir, Mechanism::Transactional, r.attempts)?;
            out.add(&o);
        }
        Ok(out)
    }

    fn validate(&self, units: &[Unit]) -> io::Result<()> {
        for u in units {
            if u.pages == 0
                || u.pages > MAX_UNIT_PAGES
                || u.first_page
                    .checked_add(u.pages)
                    .is_none_or(|e| e > self.mem.guest_pages())
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "migration unit {u:?} is invalid: it needs 1..={MAX_UNIT_PAGES} pages \
                         inside guest RAM ({} pages)",
                        self.mem.guest_pages()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn migrate_attempt(
        &self,
        units: &[Unit],
        dir: Direction,
        mech: Mechanism,
        attempts: u32,
    ) -> io::Result<BatchOutcome> {
        self.validate(units)?;
        let mem = &*self.mem;
        let (src, _) = dir.tiers();
        let mut out = BatchOutcome::default();
        let mut copy_runs = Vec::new();
        let mut shadow_runs = Vec::new();
        for u in units {
            let mut words = Vec::with_capacity(u.pages);
            for p in u.first_page..u.first_page + u.pages {
                match mem.pages.try_acquire(p, false) {
                    Some(w) => words.push(w),
                    None => break,
                }
            }
            if words.len() < u.pages {
                for p in u.first_page..u.first_page + words.len() {
                    mem.release_page(p, 0, 0);
                }
                out.skipped_busy += u.pages;
                mem.counters
                    .skipped_busy
                    .fetch_add(u.pages as u64, Ordering::Relaxed);
                continue;
            }
            // Classify: 0 = already placed, 1 = copy, 2 = shadow demotion.
            let class = |w: u32| {
                if page_map::tier_of(w) != src {
                    0
                } else if dir == Direction::Demote && w & SHADOW != 0 {
                    2
                } else {
                    1
                }
            };
            let mut i = 0;
            while i < u.pages {
                let c = class(words[i]);
                let start = i;
                while i < u.pages && class(words[i]) == c {
                    i += 1;
                }
                let run = Run {
                    first: u.first_page + start,
                    len: i - start,
                };
                match c {
                    0 => {
                        for p in run.pages() {
                            mem.release_page(p, 0, 0);
                        }
                        out.already_placed += run.len;
                    }
                    1 => copy_runs.push(run),
                    _ => shadow_runs.push(run),
                }
            }
        }
        let r1 = match mech {
            Mechanism::Transactional => self.tpm(&copy_runs, dir, attempts, &mut out),
            Mechanism::StopAndCopy => self.stop_and_copy(&copy_runs, dir, &mut out),
            Mechanism::KernelMovePages => self.kernel_move_pages(&copy_runs, dir, &mut out),
        };
        let r2 = self.shadow_demote(&shadow_runs, &mut out);
        let low = mem.shadow_low_watermark();
        if mem.free_pages(Tier::Slow) < low {
            mem.reclaim_shadows(2 * low);
        }
        r1?;
        r2?;
        Ok(out)
    }

    /// Reserves `len` free pages on `dst` (reclaiming shadows first for the
    /// slow tier). None: no space (counted and the run's pages released).
    fn reserve_destination(&self, dst: Tier, run: Run, out: &mut BatchOutcome) -> Option<Vec<u32>> {
        let mem = &*self.mem;
        if dst == Tier::Slow {
            let want = run.len + mem.shadow_low_watermark();
            if mem.free_pages(Tier::Slow) < want {
                mem.reclaim_shadows(want);
            }
        }
        let r = mem.reserve(dst, run.len, SlotKind::Free);
        if r.is_none() {
            for p in run.pages() {
                mem.release_page(p, 0, 0);
            }
            out.skipped_no_space += run.len;
            mem.counters
                .skipped_no_space
                .fetch_add(run.len as u64, Ordering::Relaxed);
        }
        r
    }

    /// Rollback for an owned `run` whose pages sit (or may sit) in the pool
    /// slots `slots` of `tier`: moves each back into guest RAM (a page already
    /// back makes its move fail harmlessly) and releases it.
    fn put_back(&self, run: Run, tier: Tier, slots: &[u32]) {
        let mem = &*self.mem;
        for (i, p) in run.pages().enumerate() {
            let _ = mem.uffd.move_range(
                mem.guest_addr(p),
                mem.pool_addr(tier, slots[i]),
                PAGE_SIZE,
                true,
            );
            mem.release_page(p, 0, 0);
        }
    }

    /// Reserves, for an owned `run`, free destination pages in `dst` and
    /// holes for the old pages in `src`. On failure every reservation and the
    /// pages are released: `Ok(None)` = no room (counted as skipped), `Err` =
    /// an accounting failure.
    fn reserve_exchange(
        &self,
        src: Tier,
        dst: Tier,
        run: Run,
        out: &mut BatchOutcome,
    ) -> io::Result<Option<(Vec<u32>, Vec<u32>)>> {
        let Some(fresh) = self.reserve_destination(dst, run, out) else {
            return Ok(None);
        };
        match self.reserve_holes(src, run.len) {
            Ok(holes) => Ok(Some((fresh, holes))),
            Err(e) => {
                self.mem.unreserve(dst, &fresh, SlotKind::Free);
                for p in run.pages() {
                    self.mem.release_page(p, 0, 0);
                }
                Err(e)
            }
        }
    }

    /// Reserves holes for old pages in `tier`'s pool; they always exist while
    /// the accounting holds (the pool has a slot for every page of the tier).
    fn reserve_holes(&self, tier: Tier, n: usize) -> io::Result<Vec<u32>> {
        self.mem.reserve(tier, n, SlotKind::Hole).ok_or_else(|| {
            io::Error::other(format!(
                "{} pool has fewer than {n} empty slots: page accounting is broken",
                tier.name()
            ))
        })
    }

    fn tpm(
        &self,
        runs: &[Run],
        dir: Direction,
        attempts: u32,
        out: &mut BatchOutcome,
    ) -> io::Result<()> {
        let mem = &*self.mem;
        let (_, dst) = dir.tiers();
        let skip = self.skip_dirty_check.load(Ordering::Relaxed);
        let mut first_err = None;
        let mut txns = Vec::new();
        for &run in runs {
            let Some(staging) = self.reserve_destination(dst, run, out) else {
                continue;
            };
            let old_slots = if dir == Direction::Demote {
                match self.reserve_holes(Tier::Fast, run.len) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        mem.unreserve(dst, &staging, SlotKind::Free);
                        for p in run.pages() {
                            mem.release_page(p, 0, 0);
                        }
                        first_err.get_or_insert(e);
                        continue;
                    }
                }
            } else {
                None
            };
            txns.push(Txn {
                run,
                staging,
                old_slots,
            });
        }
        if txns.is_empty() {
            return first_err.map_or(Ok(()), Err);
        }
        let old_addr = |t: &Txn, i: usize| match &t.old_slots {
            Some(s) => mem.pool_addr(Tier::Fast, s[i]),
            None => mem.shadow_addr(t.run.first + i),
        };
        // 1. Arm: from now on a write to these pages shows up as DIRTY_SEEN.
        if !skip {
            self.harvester
                .arm(mem, txns.iter().flat_map(|t| t.run.pages()))?;
        }
        // 2. Copy while the guest keeps running.
        for t in &txns {
            for (i, p) in t.run.pages().enumerate() {
                // SAFETY: both addresses are page-aligned pages of our mapping: the guest
                // page is present (we own it, nobody else moves it) and the staging page is
                // a reserved free pool page.
                unsafe {
                    sys::copy_page(
                        mem.pool_addr(dst, t.staging[i]) as *mut u8,
                        mem.guest_addr(p) as *const u8,
                    )
                };
            }
        }
        crate::test_point::reached(crate::test_point::TestPoint::TpmCopied);
        // 3. Unmap: move the old pages out of guest RAM (zero copy). Guest
        //    accesses now fault and wait.
        let mut live = Vec::with_capacity(txns.len());
        for t in txns {
            let pairs: Vec<_> = t
                .run
                .pages()
                .enumerate()
                .map(|(i, p)| (old_addr(&t, i), mem.guest_addr(p)))
                .collect();
            match mem.move_pairs(&pairs) {
                Ok(()) => live.push(t),
                Err(e) => {
                    self.restore_guest(&t, &old_addr, dst);
                    first_err.get_or_insert(e);
                }
            }
        }
        // 4. One harvest decides every transaction of the batch.
        if !skip {
            if let Err(e) = self.harvester.harvest(mem) {
                // Without a verdict, abort everything.
                for t in &live {
                    self.abort(t, &old_addr, dst, dir, attempts, out);
                }
                return Err(e);
            }
        }
        for t in &live {
            let dirty = !skip && t.run.pages().any(|p| mem.pages.load(p) & DIRTY_SEEN != 0);
            if dirty {
                self.abort(t, &old_addr, dst, dir, attempts, out);
                continue;
            }
            // 5. Commit: map the staging pages (this wakes waiting faults).
            let pairs: Vec<_> = t
                .run
                .pages()
                .enumerate()
                .map(|(i, p)| (mem.guest_addr(p), mem.pool_addr(dst, t.staging[i])))
                .collect();
            if let Err(e) = mem.move_pairs(&pairs) {
                self.restore_guest(t, &old_addr, dst);
                first_err.get_or_insert(e);
                continue;
            }
            mem.unreserve(dst, &t.staging, SlotKind::Hole);
            match dir {
                Direction::Promote => {
                    for p in t.run.pages() {
                        mem.note_new_shadow(p);
                        mem.release_page(p, SHADOW, SLOW);
                    }
                    mem.counters
                        .promotions
                        .fetch_add(t.run.len as u64, Ordering::Relaxed);
                }
                Direction::Demote => {
                    if let Some(s) = &t.old_slots {
                        mem.unreserve(Tier::Fast, s, SlotKind::Free);
                    }
                    for p in t.run.pages() {
                        mem.release_page(p, SLOW, 0);
                    }
                    mem.counters
                        .demotions
                        .fetch_add(t.run.len as u64, Ordering::Relaxed);
                }
            }
            mem.counters.tpm_commits.fetch_add(1, Ordering::Relaxed);
            out.committed += 1;
            out.migrated += t.run.len;
        }
        first_err.map_or(Ok(()), Err)
    }

    fn abort(
        &self,
        t: &Txn,
        old_addr: &dyn Fn(&Txn, usize) -> usize,
        dst: Tier,
        dir: Direction,
        attempts: u32,
        out: &mut BatchOutcome,
    ) {
        let mem = &*self.mem;
        let pairs: Vec<_> = t
            .run
            .pages()
            .enumerate()
            .map(|(i, p)| (mem.guest_addr(p), old_addr(t, i)))
            .collect();
        if let Err(e) = mem.move_pairs(&pairs) {
            tracing::error!("TPM abort of {:?}: {e}", t.run);
            self.restore_guest(t, old_addr, dst);
            return;
        }
        mem.unreserve(dst, &t.staging, SlotKind::Free);
        if let Some(s) = &t.old_slots {
            mem.unreserve(Tier::Fast, s, SlotKind::Hole);
        }
        for p in t.run.pages() {
            mem.release_page(p, 0, 0);
        }
        mem.counters.tpm_aborts.fetch_add(1, Ordering::Relaxed);
        out.aborted += 1;
        out.aborted_pages += t.run.len;
        let attempts = attempts + 1;
        if attempts > self.cfg.retry_max_attempts {
            mem.counters.tpm_gave_up.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let delay = self.cfg.retry_base * 2u32.saturating_pow(attempts - 1);
        lock(&self.retries).push(Retry {
            unit: Unit::run(t.run.first, t.run.len),
            dir,
            attempts,
            due: Instant::now() + delay,
        });
        out.retries_queued += 1;
    }

    /// Error path: puts the old page back wherever guest RAM has a hole,
    /// using residency to find where each page is, and releases everything.
    fn restore_guest(&self, t: &Txn, old_addr: &dyn Fn(&Txn, usize) -> usize, dst: Tier) {
        let mem = &*self.mem;
        let guest = sys::resident(mem.guest_addr(t.run.first), t.run.len).unwrap_or_default();
        let mut staging_used = Vec::new();
        let mut staging_free = Vec::new();
        let mut old_used = Vec::new();
        let mut old_holes = Vec::new();
        for (i, p) in t.run.pages().enumerate() {
            let old = old_addr(t, i);
            let staging = mem.pool_addr(dst, t.staging[i]);
            let in_guest = guest.get(i).copied().unwrap_or(true);
            let mut new_tier = false;
            if !in_guest
                && mem
                    .uffd
                    .move_range(mem.guest_addr(p), old, PAGE_SIZE, true)
                    .is_err()
            {
                // Old page gone: the staging copy is the best content left.
                if mem
                    .uffd
                    .move_range(mem.guest_addr(p), staging, PAGE_SIZE, true)
                    .is_ok()
                {
                    new_tier = true;
                } else {
                    tracing::error!("page {p}: could not be restored into guest RAM");
                }
            }
            if new_tier {
                staging_used.push(t.staging[i]);
            } else {
                staging_free.push(t.staging[i]);
            }
            if let Some(s) = &t.old_slots {
                if sys::resident(old, 1).map(|r| r[0]).unwrap_or(false) {
                    old_used.push(s[i]);
                } else {
                    old_holes.push(s[i]);
                }
            }
            let (set, clear) = match (new_tier, dst) {
                (false, _) => (0, 0),
                (true, Tier::Fast) => (0, SLOW),
                (true, Tier::Slow) => (SLOW, 0),
            };
            mem.release_page(p, set, clear);
        }
        mem.unreserve(dst, &staging_free, SlotKind::Free);
        mem.unreserve(dst, &staging_used, SlotKind::Hole);
        mem.unreserve(Tier::Fast, &old_used, SlotKind::Free);
        mem.unreserve(Tier::Fast, &old_holes, SlotKind::Hole);
    }

    fn stop_and_copy(
        &self,
        runs: &[Run],
        dir: Direction,
        out: &mut BatchOutcome,
    ) -> io::Result<()> {
        let mem = &*self.mem;
        let (src, dst) = dir.tiers();
        let mut first_err = None;
        for &run in runs {
            let (staging, old) = match self.reserve_exchange(src, dst, run, out) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            let unmap: Vec<_> = run
                .pages()
                .enumerate()
                .map(|(i, p)| (mem.pool_addr(src, old[i]), mem.guest_addr(p)))
                .collect();
            if let Err(e) = mem.move_pairs(&unmap) {
                // Put back whatever moved.
                self.put_back(run, src, &old);
                mem.unreserve(dst, &staging, SlotKind::Free);
                mem.unreserve(src, &old, SlotKind::Hole);
                first_err.get_or_insert(e);
                continue;
            }
            for i in 0..run.len {
                // SAFETY: the old page now sits in a reserved pool slot no one else uses and
                // the staging page is a reserved free pool page; both are page-aligned.
                unsafe {
                    sys::copy_page(
                        mem.pool_addr(dst, staging[i]) as *mut u8,
                        mem.pool_addr(src, old[i]) as *const u8,
                    )
                };
            }
            let map: Vec<_> = run
                .pages()
                .enumerate()
                .map(|(i, p)| (mem.guest_addr(p), mem.pool_addr(dst, staging[i])))
                .collect();
            if let Err(e) = mem.move_pairs(&map) {
                self.put_back(run, src, &old);
                mem.unreserve(dst, &staging, SlotKind::Free);
                mem.unreserve(src, &old, SlotKind::Hole);
                first_err.get_or_insert(e);
                continue;
            }
            mem.unreserve(src, &old, SlotKind::Free);
            mem.unreserve(dst, &staging, SlotKind::Hole);
            let (set, clear) = if dst == Tier::Slow {
                (SLOW, 0)
            } else {
                (0, SLOW)
            };
            for p in run.pages() {
                mem.release_page(p, set, clear);
            }
            self.count_moved(dir, run.len);
            mem.counters
                .stop_copy
                .fetch_add(run.len as u64, Ordering::Relaxed);
            out.migrated += run.len;
        }
        first_err.map_or(Ok(()), Err)
    }

    /// `move_pages(2)`: the kernel migrates the guest page in place (its own
    /// exclusive unmap-copy-remap). To keep capacities exact, one free page of
    /// the destination pool is given back to the kernel and one fresh page is
    /// allocated into a hole of the source pool (the kernel freed the old one).
    fn kernel_move_pages(
        &self,
        runs: &[Run],
        dir: Direction,
        out: &mut BatchOutcome,
    ) -> io::Result<()> {
        let mem = &*self.mem;
        let (src, dst) = dir.tiers();
        let mut first_err = None;
        for &run in runs {
            let (give_back, refill) = match self.reserve_exchange(src, dst, run, out) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            let addrs: Vec<usize> = run.pages().map(|p| mem.guest_addr(p)).collect();
            let node = mem.node(dst) as i32;
            let status = sys::move_pages_to(&addrs, node as u32).unwrap_or_else(|e| {
                tracing::warn!("move_pages: {e}");
                vec![-1; addrs.len()]
            });
            let (mut gb_used, mut gb_keep, mut rf_used, mut rf_keep) =
                (vec![], vec![], vec![], vec![]);
            let (set, clear) = if dst == Tier::Slow {
                (SLOW, 0)
            } else {
                (0, SLOW)
            };
            let mut moved = 0;
            for (i, p) in run.pages().enumerate() {
                let ok = status[i] == node
                    && sys::madvise(
                        mem.pool_addr(dst, give_back[i]),
                        PAGE_SIZE,
                        libc::MADV_DONTNEED,
                    )
                    .is_ok()
                    && mem
                        .uffd
                        .copy_zero_page(mem.pool_addr(src, refill[i]))
                        .is_ok();
                if ok {
                    gb_used.push(give_back[i]);
                    rf_used.push(refill[i]);
                    mem.release_page(p, set, clear);
                    moved += 1;
                } else {
                    gb_keep.push(give_back[i]);
                    rf_keep.push(refill[i]);
                    mem.release_page(p, 0, 0);
                }
            }
            mem.unreserve(dst, &gb_used, SlotKind::Hole);
            mem.unreserve(dst, &gb_keep, SlotKind::Free);
            mem.unreserve(src, &rf_used, SlotKind::Free);
            mem.unreserve(src, &rf_keep, SlotKind::Hole);
            self.count_moved(dir, moved);
            mem.counters
                .kernel_move_pages
                .fetch_add(moved as u64, Ordering::Relaxed);
            out.migrated += moved;
        }
        first_err.map_or(Ok(()), Err)
    }

    fn count_moved(&self, dir: Direction, n: usize) {
        let c = &self.mem.counters;
        match dir {
            Direction::Promote => c.promotions.fetch_add(n as u64, Ordering::Relaxed),
            Direction::Demote => c.demotions.fetch_add(n as u64, Ordering::Relaxed),
        };
    }

    fn shadow_demote(&self, runs: &[Run], out: &mut BatchOutcome) -> io::Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let mem = &*self.mem;
        let skip = self.skip_dirty_check.load(Ordering::Relaxed);
        // 1. Unmap every fast page into a fast pool hole.
        let mut live: Vec<(Run, Vec<u32>)> = Vec::new();
        let mut first_err = None;
        for &run in runs {
            let holes = match self.reserve_holes(Tier::Fast, run.len) {
                Ok(h) => h,
                Err(e) => {
                    for p in run.pages() {
                        mem.release_page(p, 0, 0);
                    }
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            let pairs: Vec<_> = run
                .pages()
                .enumerate()
                .map(|(i, p)| (mem.pool_addr(Tier::Fast, holes[i]), mem.guest_addr(p)))
                .collect();
            if let Err(e) = mem.move_pairs(&pairs) {
                self.put_back(run, Tier::Fast, &holes);
                mem.unreserve(Tier::Fast, &holes, SlotKind::Hole);
                first_err.get_or_insert(e);
                continue;
            }
            live.push((run, holes));
        }
        // 2. One harvest: was any page written since its promotion?
        let verdict = if skip {
            Ok(0)
        } else {
            self.harvester.harvest(mem)
        };
        for (run, holes) in &live {
            let mut copied = 0;
            for (i, p) in run.pages().enumerate() {
                let w = mem.pages.load(p);
                let dirty = verdict.is_err() || (!skip && w & DIRTY_SEEN != 0);
                if dirty {
                    // SAFETY: the fast page sits in a reserved pool slot and the shadow in
                    // this page's shadow slot; both are present, page-aligned, and owned by us.
                    unsafe {
                        sys::copy_page(
                            mem.shadow_addr(p) as *mut u8,
                            mem.pool_addr(Tier::Fast, holes[i]) as *const u8,
                        )
                    };
                    copied += 1;
                }
            }
            // 3. Map the shadows (a clean one is the page's content already).
            let pairs: Vec<_> = run
                .pages()
                .map(|p| (mem.guest_addr(p), mem.shadow_addr(p)))
                .collect();
            if let Err(e) = mem.move_pairs(&pairs) {
                self.put_back(*run, Tier::Fast, holes);
                mem.unreserve(Tier::Fast, holes, SlotKind::Hole);
                first_err.get_or_insert(e);
                continue;
            }
            mem.unreserve(Tier::Fast, holes, SlotKind::Free);
            for p in run.pages() {
                mem.release_page(p, SLOW, SHADOW);
            }
            let c = &mem.counters;
            c.demotions.fetch_add(run.len as u64, Ordering::Relaxed);
            c.shadow_demotions
                .fetch_add((run.len - copied) as u64, Ordering::Relaxed);
            c.shadow_demotions_copied
                .fetch_add(copied as u64, Ordering::Relaxed);
            out.shadow_demoted += run.len - copied;
            out.shadow_copied += copied;
            out.migrated += run.len;
        }
        if let Err(e) = verdict {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }
}
