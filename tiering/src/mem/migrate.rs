//! [`Migrator`]: the migration mechanisms, usable by any policy.
//!
//! - Transactional migration (TPM, Nomad §3.2), batched: reserve capacity
//!   and staging on the destination tier, arm the dirty log, copy while the
//!   guest runs, unmap (the old page moves to the page's shadow slot), one
//!   harvest, then commit clean units (map the staging page) or abort dirty
//!   ones (map the old page back; retried later with exponential back-off).
//!   A promotion may keep the old page as the shadow (non-exclusive tiering).
//! - Stop-and-copy (exclusive, like Linux/TPP): unmap, copy, map.
//! - Kernel `move_pages(2)` (exclusive, in place; on a one-node host only
//!   the tier bookkeeping changes).
//! - Shadow demotion (Nomad §3.3): unmap the page, map its shadow back in
//!   its place if the page was not written since its promotion, else copy
//!   into the shadow first.
//!
//! Pages of one batch that are contiguous move with one range move (a
//! 2 MiB aligned run of a huge page moves as one huge page). Every step that
//! can fail leaves each page where the kernel says it is: the outcome of a
//! failed move is settled page by page from residency ([`Migrator`]'s
//! `settle`), so a failure never loses a page or corrupts the bookkeeping,
//! and a page whose content cannot be found stops the VM with an error
//! (never silently).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::backing::{lock, Staging, TieredMemory};
use super::dirty::DirtyLog;
use super::harvest::DirtyHarvester;
use super::page_map::{self, on_tier, shadow_on, DIRTY_SEEN, PLACEMENT_BITS, SHADOW, SHADOW_BITS};
use super::pool::{Holds, CHUNK_SLOTS};
use crate::sys::{self, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::vocab::{Mechanism, TierId, Unit, PAGES_PER_2M};

/// Largest unit: a 2 MiB run of 512 pages.
pub const MAX_UNIT_PAGES: usize = PAGES_PER_2M as usize;

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
    /// Skipped: no room on the destination tier.
    pub skipped_no_space: usize,
    /// Skipped: owned by another mover or parked.
    pub skipped_busy: usize,
    /// Skipped: never touched by the guest (nothing to move).
    pub skipped_untouched: usize,
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
        self.skipped_untouched += o.skipped_untouched;
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
    to: TierId,
    keep_shadow: bool,
    attempts: u32,
    due: Instant,
}

/// A run of owned guest pages on one tier, moving together.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    len: usize,
    from: TierId,
}

impl Run {
    fn pages(self) -> std::ops::Range<usize> {
        self.first..self.first + self.len
    }
    /// A whole 2 MiB aligned run (can move as one huge page).
    fn is_huge(self) -> bool {
        self.len == CHUNK_SLOTS && self.first.is_multiple_of(CHUNK_SLOTS)
    }
}

/// A run with its destination reservation and staging pages.
struct Txn {
    run: Run,
    staging: Staging,
}

/// Ends a harvester transaction when dropped (on every return path).
struct EndOnDrop<'a>(&'a DirtyHarvester);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// How a page of a failed step ended up, from residency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// The new copy is in guest RAM, the old one in the shadow slot.
    Committed,
    /// The old page is (back) in guest RAM.
    Restored,
    /// Only the staging copy was left; it is in guest RAM now.
    Staged,
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

    /// Keeps the dirty log on (a policy reads write counts), or lets it go
    /// off while nothing needs it (huge-page mappings in KVM).
    pub fn set_dirty_log_required(&self, required: bool) {
        self.harvester.set_required(required);
    }

    /// How many segments of the dirty log are on, of how many.
    pub fn harvester_segments_on(&self) -> (usize, usize) {
        self.harvester.segments_on()
    }

    /// Whether the dirty log is on, and how many times it was switched.
    pub fn dirty_log_state(&self) -> (bool, u64) {
        (self.harvester.logging(), self.harvester.switches())
    }

    /// Promotes units to the fastest tier.
    pub fn promote(&self, units: &[Unit], mech: Mechanism) -> io::Result<BatchOutcome> {
        self.migrate(units, 0, mech)
    }

    /// Demotes units to the slowest tier; pages with a shadow there use
    /// shadow demotion.
    pub fn demote(&self, units: &[Unit], mech: Mechanism) -> io::Result<BatchOutcome> {
        let slowest = (self.mem.tier_count() - 1) as TierId;
        self.migrate(units, slowest, mech)
    }

    /// Migrates units to tier `to` in one batch.
    pub fn migrate(&self, units: &[Unit], to: TierId, mech: Mechanism) -> io::Result<BatchOutcome> {
        let pages: usize = units.iter().map(|u| u.pages as usize).sum();
        let _doing = self.mem.activities.begin(format!(
            "migrating {} unit(s), {pages} page(s), to tier {to} ({mech:?})",
            units.len()
        ));
        self.migrate_attempt(units, to, mech, 0)
    }

    /// Number of aborted units waiting for a retry.
    pub fn pending_retries(&self) -> usize {
        lock(&self.retries).len()
    }

    /// Retries the aborted units whose back-off has expired.
    pub fn run_due_retries(&self) -> io::Result<BatchOutcome> {
        let now = Instant::now();
        let due: Vec<Retry> = {
            let mut q = lock(&self.retries);
            let (due, keep): (Vec<_>, Vec<_>) = q.drain(..).partition(|r| r.due <= now);
            *q = keep;
            due
        };
        let mut out = BatchOutcome::default();
        let mut first_err = None;
        for r in due {
            self.mem
                .counters
                .tpm_retries
                .fetch_add(1, Ordering::Relaxed);
            let mech = Mechanism::Transactional {
                keep_shadow: r.keep_shadow,
            };
            match self.migrate_attempt(&[r.unit], r.to, mech, r.attempts) {
                Ok(o) => out.add(&o),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(out), Err)
    }

    fn validate(&self, units: &[Unit], to: TierId) -> io::Result<()> {
        if usize::from(to) >= self.mem.tier_count() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "migration to tier {to}: this memory has {} tiers",
                    self.mem.tier_count()
                ),
            ));
        }
        for u in units {
            if u.pages == 0
                || u.pages as usize > MAX_UNIT_PAGES
                || u.page
                    .checked_add(u64::from(u.pages))
                    .is_none_or(|e| e > self.mem.guest_pages() as u64)
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
        to: TierId,
        mech: Mechanism,
        attempts: u32,
    ) -> io::Result<BatchOutcome> {
        self.validate(units, to)?;
        let mut out = BatchOutcome::default();
        let (copy_runs, shadow_runs) = self.acquire_and_classify(units, to, &mut out);
        let r1 = match mech {
            Mechanism::Transactional { keep_shadow } => {
                self.tpm(&copy_runs, to, keep_shadow, attempts, &mut out)
            }
            Mechanism::StopAndCopy | Mechanism::ShadowDemotion => {
                self.stop_and_copy(&copy_runs, to, &mut out)
            }
            Mechanism::KernelMovePages => self.kernel_move_pages(&copy_runs, to, &mut out),
        };
        let r2 = self.shadow_demote(&shadow_runs, to, &mut out);
        for t in self.mem.tier_ids() {
            let low = self.mem.shadow_low_watermark(t);
            if self.mem.free_pages(t) < low {
                self.mem.reclaim_shadows(t, 2 * low);
            }
        }
        r1?;
        r2?;
        Ok(out)
    }

    /// Step 0: takes every page of each unit (a unit is skipped whole if
    /// one of its pages is owned or parked), and sorts the pages into runs:
    /// pages to copy (grouped by source tier) and pages whose shadow is on
    /// the destination (shadow demotion). Pages already there, or never
    /// touched, are released at once.
    fn acquire_and_classify(
        &self,
        units: &[Unit],
        to: TierId,
        out: &mut BatchOutcome,
    ) -> (Vec<Run>, Vec<Run>) {
        let mem = &*self.mem;
        let mut copy_runs = Vec::new();
        let mut shadow_runs = Vec::new();
        for u in units {
            let (first, len) = (u.page as usize, u.pages as usize);
            let mut words = Vec::with_capacity(len);
            for p in first..first + len {
                match mem.pages.try_acquire(p, false) {
                    Some(w) => words.push(w),
                    None => break,
                }
            }
            if words.len() < len {
                for p in first..first + words.len() {
                    mem.release_page(p, 0, 0);
                }
                out.skipped_busy += len;
                mem.counters
                    .skipped_busy
                    .fetch_add(len as u64, Ordering::Relaxed);
                continue;
            }
            // Class: None = release now, Some((shadow?, from)).
            let class = |w: u64| -> Option<(bool, TierId)> {
                let from = page_map::tier_of(w)?;
                if from == to {
                    return None;
                }
                Some((page_map::shadow_tier_of(w) == Some(to), from))
            };
            let mut i = 0;
            while i < len {
                let c = class(words[i]);
                let start = i;
                while i < len && class(words[i]) == c {
                    i += 1;
                }
                let run_pages = first + start..first + i;
                match c {
                    None => {
                        for p in run_pages {
                            if page_map::tier_of(mem.pages.load(p)).is_none() {
                                out.skipped_untouched += 1;
                            } else {
                                out.already_placed += 1;
                            }
                            mem.release_page(p, 0, 0);
                        }
                    }
                    Some((shadow, from)) => {
                        let run = Run {
                            first: first + start,
                            len: i - start,
                            from,
                        };
                        if shadow {
                            shadow_runs.push(run);
                        } else {
                            copy_runs.push(run);
                        }
                    }
                }
            }
        }
        (copy_runs, shadow_runs)
    }

    /// Reserves capacity and staging on `to` for each run (reclaiming
    /// shadows on `to` first when it is short). Runs without room are
    /// released and counted as skipped.
    fn prepare(&self, runs: &[Run], to: TierId, out: &mut BatchOutcome) -> Vec<Txn> {
        let mem = &*self.mem;
        let account = &mem.tiers[usize::from(to)];
        let mut txns = Vec::with_capacity(runs.len());
        for &run in runs {
            let mut ok = account.try_reserve(run.len as u64);
            if !ok {
                mem.reclaim_shadows(to, run.len + mem.shadow_low_watermark(to));
                ok = account.try_reserve(run.len as u64);
            }
            let staging = if ok {
                let prefer = Holds::Cached;
                let s = if run.is_huge() {
                    mem.reserve_staging(to, CHUNK_SLOTS, prefer)
                } else {
                    mem.pool(to)
                        .reserve_pages(run.len, prefer)
                        .map(Staging::Pages)
                };
                if s.is_none() {
                    account.unreserve(run.len as u64);
                    tracing::error!(
                        "tier {to} pool has no slot for {} pages (accounting bug)",
                        run.len
                    );
                }
                s
            } else {
                None
            };
            let Some(staging) = staging else {
                for p in run.pages() {
                    mem.release_page(p, 0, 0);
                }
                out.skipped_no_space += run.len;
                mem.counters
                    .skipped_no_space
                    .fetch_add(run.len as u64, Ordering::Relaxed);
                continue;
            };
            // A page with a shadow elsewhere gives it up: its shadow slot
            // receives the old page during the move.
            for p in run.pages() {
                if mem.pages.load(p) & SHADOW != 0 {
                    mem.free_shadow_owned(p);
                }
            }
            txns.push(Txn { run, staging });
        }
        txns
    }

    /// Moves the old pages of `txns` out of guest RAM into their shadow
    /// slots. Returns the transactions whose pages all moved; the others are
    /// settled and finished as aborted (nothing changed for them).
    fn unmap(
        &self,
        txns: Vec<Txn>,
        to: TierId,
        out: &mut BatchOutcome,
        first_err: &mut Option<io::Error>,
    ) -> Vec<Txn> {
        let mem = &*self.mem;
        let pairs: Vec<_> = txns
            .iter()
            .flat_map(|t| {
                t.run
                    .pages()
                    .map(|p| (mem.shadow_addr(p), mem.guest_addr(p)))
            })
            .collect();
        match self.move_healing(&pairs) {
            Ok(()) => txns,
            Err(e) => {
                first_err.get_or_insert(e);
                for t in &txns {
                    self.settle_and_finish(t, to, false, false, out);
                }
                Vec::new()
            }
        }
    }

    /// `move_pairs`, but a destination slot in the shadow or parking area
    /// that holds a stray page (no page owns it: the page is ours and its
    /// shadow was freed) is discarded and the move retried once.
    fn move_healing(&self, pairs: &[(usize, usize)]) -> io::Result<()> {
        match self.mem.move_pairs_finishing(pairs) {
            Ok(()) => Ok(()),
            Err(e) if e.dst_not_a_hole() => {
                let mem = &*self.mem;
                let mut healed = 0;
                for &(dst, src) in pairs {
                    let dst_full = sys::resident(dst, 1).map(|r| r[0]).unwrap_or(false);
                    let src_full = sys::resident(src, 1).map(|r| r[0]).unwrap_or(false);
                    if dst_full && src_full {
                        let _ = mem.discard(dst, PAGE_SIZE);
                        healed += 1;
                    }
                }
                mem.counters.slot_heals.fetch_add(healed, Ordering::Relaxed);
                tracing::warn!("{e}: {healed} stray slot pages discarded, retrying");
                let rest: Vec<_> = pairs
                    .iter()
                    .copied()
                    .filter(|&(_, src)| sys::resident(src, 1).map(|r| r[0]).unwrap_or(false))
                    .collect();
                mem.move_pairs_finishing(&rest).map_err(io::Error::from)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Copies the old pages (at `src_of(page)`) into the staging pages.
    fn copy_into_staging(&self, t: &Txn, to: TierId, src_of: impl Fn(usize) -> usize) {
        let mem = &*self.mem;
        for (i, p) in t.run.pages().enumerate() {
            // SAFETY: both addresses are page-aligned pages of our mapping: the source is
            // present (we own the page, nobody else moves it) and the staging page is a
            // reserved pool slot (a hole is allocated on the tier's node by the write).
            unsafe {
                sys::copy_volatile(
                    t.staging.addr(mem, to, i) as *mut u8,
                    src_of(p) as *const u8,
                    PAGE_SIZE,
                )
            };
        }
    }

    fn tpm(
        &self,
        runs: &[Run],
        to: TierId,
        keep_shadow: bool,
        attempts: u32,
        out: &mut BatchOutcome,
    ) -> io::Result<()> {
        let mem = &*self.mem;
        let skip = self.skip_dirty_check.load(Ordering::Relaxed);
        let mut first_err = None;
        // 1. Reserve capacity and staging pages on the destination.
        let txns = self.prepare(runs, to, out);
        if txns.is_empty() {
            return Ok(());
        }
        // 2. Arm: from now on a write to these pages shows up as DIRTY_SEEN.
        //    (Logging stays on until the batch ends.)
        self.harvester.begin();
        let _end = EndOnDrop(&self.harvester);
        if !skip {
            if let Err(e) = self
                .harvester
                .arm(mem, txns.iter().flat_map(|t| t.run.pages()))
            {
                // Nothing moved yet: give everything back.
                for t in &txns {
                    self.finish_aborted(t, to, out);
                }
                return Err(e);
            }
        }
        // 3. Copy while the guest keeps running.
        for t in &txns {
            self.copy_into_staging(t, to, |p| mem.guest_addr(p));
        }
        crate::test_point::reached(crate::test_point::TestPoint::TpmCopied);
        // 4. Unmap: move the old pages out of guest RAM (zero copy). Guest
        //    accesses now fault and wait.
        let live = self.unmap(txns, to, out, &mut first_err);
        // 5. One harvest decides every transaction of the batch.
        let verdict = if skip {
            Ok(0)
        } else {
            // The slow work on other shadowed pages waits until the guest
            // has these pages back (see `harvest_deferring`).
            self.harvester.harvest_deferring(mem)
        };
        let mut commits = Vec::new();
        for t in live {
            let dirty = verdict.is_err()
                || (!skip && t.run.pages().any(|p| mem.pages.load(p) & DIRTY_SEEN != 0));
            if dirty {
                self.abort(&t, to, keep_shadow, attempts, out, &mut first_err);
            } else {
                commits.push(t);
            }
        }
        if let Err(e) = verdict {
            first_err.get_or_insert(e);
        }
        // 6. Commit: map the staging pages (this wakes waiting faults).
        self.commit(commits, to, keep_shadow, true, out, &mut first_err);
        self.harvester.finish_deferred(mem);
        first_err.map_or(Ok(()), Err)
    }

    /// Maps each transaction's staging pages into guest RAM and finishes
    /// it: the old page becomes the shadow (a promotion with `keep_shadow`)
    /// or is disposed of.
    fn commit(
        &self,
        txns: Vec<Txn>,
        to: TierId,
        keep_shadow: bool,
        tpm: bool,
        out: &mut BatchOutcome,
        first_err: &mut Option<io::Error>,
    ) {
        let mem = &*self.mem;
        let huge: Vec<bool> = txns.iter().map(|t| self.staging_is_huge(t, to)).collect();
        let pairs: Vec<_> = txns
            .iter()
            .flat_map(|t| {
                t.run
                    .pages()
                    .enumerate()
                    .map(move |(i, p)| (mem.guest_addr(p), t.staging.addr(mem, to, i)))
            })
            .collect();
        for t in &txns {
            mem.publish_placement(t.run.first, t.run.len, to);
        }
        let moved_all = match mem.move_pairs_finishing(&pairs) {
            Ok(()) => true,
            Err(e) => {
                first_err.get_or_insert(e.into());
                false
            }
        };
        for (t, huge) in txns.iter().zip(huge) {
            if moved_all {
                mem.release_staging(to, &t.staging, Holds::Hole, huge);
                self.finish_committed(t.run, to, keep_shadow, tpm, out);
            } else {
                self.settle_and_finish(t, to, keep_shadow, tpm, out);
            }
        }
    }

    /// Whether a staging chunk holds one whole huge page (so the chunk
    /// stays page-table free once it moved out).
    fn staging_is_huge(&self, t: &Txn, to: TierId) -> bool {
        let Staging::Chunk(slot, _) = t.staging else {
            return false;
        };
        let a = self.mem.slot_addr(to, slot);
        self.mem
            .scanner
            .scan(a, a + HUGE_PAGE_SIZE, |_, _, _| {})
            .map(|p| p.huge == HUGE_PAGE_SIZE as u64)
            .unwrap_or(false)
    }

    /// The new pages are in guest RAM and the old ones in the shadow slots:
    /// keep the old ones as shadows (a promotion with `keep_shadow`) or
    /// dispose of them, and release the pages on `to`.
    fn finish_committed(
        &self,
        run: Run,
        to: TierId,
        keep_shadow: bool,
        tpm: bool,
        out: &mut BatchOutcome,
    ) {
        let mem = &*self.mem;
        let keep = keep_shadow && to < run.from;
        if keep {
            for p in run.pages() {
                mem.note_new_shadow(p);
                mem.release_page(
                    p,
                    on_tier(to) | shadow_on(run.from),
                    PLACEMENT_BITS | SHADOW_BITS,
                );
            }
        } else {
            if run.is_huge() {
                mem.dispose_huge(run.from, mem.shadow_addr(run.first));
            } else {
                let old: Vec<usize> = run.pages().map(|p| mem.shadow_addr(p)).collect();
                mem.dispose(run.from, &old);
            }
            for p in run.pages() {
                mem.release_page(p, on_tier(to), PLACEMENT_BITS | SHADOW_BITS);
            }
        }
        mem.tiers[usize::from(to)].unreserve(run.len as u64);
        self.count_moved(run.from, to, run.len);
        if tpm {
            mem.counters.tpm_commits.fetch_add(1, Ordering::Relaxed);
            out.committed += 1;
        } else {
            mem.counters
                .stop_copy
                .fetch_add(run.len as u64, Ordering::Relaxed);
        }
        out.migrated += run.len;
    }

    /// A dirty transaction: map the old pages back and queue a retry.
    fn abort(
        &self,
        t: &Txn,
        to: TierId,
        keep_shadow: bool,
        attempts: u32,
        out: &mut BatchOutcome,
        first_err: &mut Option<io::Error>,
    ) {
        let mem = &*self.mem;
        let start = Instant::now();
        let pairs: Vec<_> = t
            .run
            .pages()
            .map(|p| (mem.guest_addr(p), mem.shadow_addr(p)))
            .collect();
        let moved = mem
            .move_pairs(&pairs)
            .or_else(|_| mem.move_retrying(pairs[0].0, pairs[0].1, t.run.len * PAGE_SIZE));
        if let Err(e) = moved {
            tracing::error!("TPM abort of {:?}: {e}", t.run);
            first_err.get_or_insert(e.into());
            self.settle_and_finish(t, to, keep_shadow, true, out);
            return;
        }
        self.finish_aborted(t, to, out);
        let c = &mem.counters;
        c.tpm_abort_ns
            .fetch_add(elapsed_ns(start), Ordering::Relaxed);
        c.tpm_aborted_pages
            .fetch_add(t.run.len as u64, Ordering::Relaxed);
        c.tpm_aborts.fetch_add(1, Ordering::Relaxed);
        out.aborted += 1;
        out.aborted_pages += t.run.len;
        let attempts = attempts + 1;
        if attempts > self.cfg.retry_max_attempts {
            mem.counters.tpm_gave_up.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let delay = self.cfg.retry_base * 2u32.saturating_pow(attempts - 1);
        lock(&self.retries).push(Retry {
            unit: Unit::run(t.run.first as u64, t.run.len as u32),
            to,
            keep_shadow,
            attempts,
            due: Instant::now() + delay,
        });
        out.retries_queued += 1;
    }

    /// The old pages are in guest RAM: give the staging pages and the
    /// reservation back and release the pages unchanged (a shadow freed in
    /// `prepare` stays freed).
    fn finish_aborted(&self, t: &Txn, to: TierId, _out: &mut BatchOutcome) {
        let mem = &*self.mem;
        let huge = self.staging_is_huge(t, to);
        mem.release_staging(to, &t.staging, Holds::Cached, huge);
        for p in t.run.pages() {
            mem.release_page(p, 0, SHADOW_BITS);
        }
        mem.tiers[usize::from(to)].unreserve(t.run.len as u64);
    }

    /// After a failed step: finds, page by page, where the old and the new
    /// copy are, puts the best one into guest RAM, and finishes the
    /// transaction accordingly. A page with neither copy left stops the VM.
    fn settle_and_finish(
        &self,
        t: &Txn,
        to: TierId,
        keep_shadow: bool,
        tpm: bool,
        out: &mut BatchOutcome,
    ) {
        let mem = &*self.mem;
        mem.counters.rollback_errors.fetch_add(1, Ordering::Relaxed);
        let mut committed = Vec::new();
        let mut restored = Vec::new();
        let mut staged = Vec::new();
        let mut stuck = 0;
        for (i, p) in t.run.pages().enumerate() {
            match self.settle(p, t.staging.addr(mem, to, i)) {
                Some(Settled::Committed) => committed.push(p),
                Some(Settled::Restored) => restored.push(p),
                Some(Settled::Staged) => staged.push(p),
                None => {
                    // Its content is still in the shadow slot or the staging
                    // page, but guest RAM has a hole: keep the page owned, so
                    // a guest touch waits (and the stopping VM is kicked out
                    // of the wait) instead of running on wrong data.
                    mem.set_fatal(format!(
                        "guest page {p}: neither its old nor its new copy could be put back into \
                         guest RAM after a failed migration; the VM is stopped to avoid running on \
                         lost data"
                    ));
                    stuck += 1;
                }
            }
        }
        mem.release_staging_checked(to, &t.staging);
        for &p in &restored {
            // The map may already say `to` (published before the move).
            mem.publish_placement(p, 1, t.run.from);
            mem.release_page(p, 0, SHADOW_BITS);
        }
        // The staging copy was all that was left: the page is on `to` now
        // (its reservation becomes the page; nothing to dispose of).
        for &p in &staged {
            mem.release_page(p, on_tier(to), PLACEMENT_BITS | SHADOW_BITS);
            mem.tiers[usize::from(to)].unreserve(1);
        }
        // Finish the committed pages one by one (they may not be
        // contiguous); each gives back its page of the reservation.
        for p in committed.iter().copied() {
            let run = Run {
                first: p,
                len: 1,
                from: t.run.from,
            };
            self.finish_committed(run, to, keep_shadow, tpm, out);
        }
        mem.tiers[usize::from(to)]
            .unreserve((t.run.len - committed.len() - staged.len() - stuck) as u64);
    }

    /// Where is page `p` now? Old page in the shadow slot, new one at
    /// `staging`. Puts a copy into guest RAM if guest RAM has none.
    fn settle(&self, p: usize, staging: usize) -> Option<Settled> {
        let mem = &*self.mem;
        let present = |a: usize| sys::resident(a, 1).map(|r| r[0]).unwrap_or(false);
        let (guest, old) = (present(mem.guest_addr(p)), present(mem.shadow_addr(p)));
        match (guest, old) {
            (true, true) => Some(Settled::Committed),
            (true, false) => Some(Settled::Restored),
            (false, true) => mem
                .move_retrying(mem.guest_addr(p), mem.shadow_addr(p), PAGE_SIZE)
                .ok()
                .map(|()| Settled::Restored),
            (false, false) => {
                // The old page is gone: the staging copy is the best content
                // (the page is then on the destination tier, no old copy).
                tracing::error!("page {p}: old copy missing, mapping the staging copy");
                (present(staging)
                    && mem
                        .move_retrying(mem.guest_addr(p), staging, PAGE_SIZE)
                        .is_ok())
                .then_some(Settled::Staged)
            }
        }
    }

    fn stop_and_copy(&self, runs: &[Run], to: TierId, out: &mut BatchOutcome) -> io::Result<()> {
        let mem = &*self.mem;
        let mut first_err = None;
        let txns = self.prepare(runs, to, out);
        if txns.is_empty() {
            return Ok(());
        }
        // 1. Unmap: the guest faults and waits from here on.
        let live = self.unmap(txns, to, out, &mut first_err);
        // 2. Copy the old pages into the staging pages.
        for t in &live {
            self.copy_into_staging(t, to, |p| mem.shadow_addr(p));
        }
        // 3. Map the copies and dispose of the old pages.
        self.commit(live, to, false, false, out, &mut first_err);
        first_err.map_or(Ok(()), Err)
    }

    /// `move_pages(2)`: the kernel migrates each page in place (its own
    /// exclusive unmap-copy-remap) to the destination's node; only pages the
    /// kernel reports on that node change tier.
    fn kernel_move_pages(
        &self,
        runs: &[Run],
        to: TierId,
        out: &mut BatchOutcome,
    ) -> io::Result<()> {
        let mem = &*self.mem;
        let account = &mem.tiers[usize::from(to)];
        for &run in runs {
            if !account.try_reserve(run.len as u64) {
                for p in run.pages() {
                    mem.release_page(p, 0, 0);
                }
                out.skipped_no_space += run.len;
                continue;
            }
            let addrs: Vec<usize> = run.pages().map(|p| mem.guest_addr(p)).collect();
            let node = mem.node(to) as i32;
            let status = mem
                .inject
                .io(crate::inject::FaultPoint::MovePages)
                .and_then(|()| sys::move_pages_to(&addrs, node as u32))
                .unwrap_or_else(|e| {
                    tracing::warn!("move_pages: {e}");
                    vec![-1; addrs.len()]
                });
            let mut moved = 0;
            for (i, p) in run.pages().enumerate() {
                if status[i] == node {
                    if mem.pages.load(p) & SHADOW != 0 {
                        mem.free_shadow_owned(p);
                    }
                    mem.release_page(p, on_tier(to), PLACEMENT_BITS | SHADOW_BITS);
                    moved += 1;
                } else {
                    mem.release_page(p, 0, 0);
                }
            }
            account.unreserve(run.len as u64);
            self.count_moved(run.from, to, moved);
            mem.counters
                .kernel_move_pages
                .fetch_add(moved as u64, Ordering::Relaxed);
            out.migrated += moved;
        }
        Ok(())
    }

    fn count_moved(&self, from: TierId, to: TierId, n: usize) {
        let c = &self.mem.counters;
        if to < from {
            c.promotions.fetch_add(n as u64, Ordering::Relaxed);
        } else {
            c.demotions.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Shadow demotion of runs whose pages have their shadow on `to`.
    fn shadow_demote(&self, runs: &[Run], to: TierId, out: &mut BatchOutcome) -> io::Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let mem = &*self.mem;
        let start = Instant::now();
        let skip = self.skip_dirty_check.load(Ordering::Relaxed);
        // 1. Unmap every page into its parking slot.
        self.park_runs(runs)?;
        // 2. One harvest: was any page written since its promotion?
        let verdict = if skip {
            Ok(0)
        } else {
            // The slow work on other shadowed pages waits until the guest
            // has these pages back (see `harvest_deferring`).
            self.harvester.harvest_deferring(mem)
        };
        let copied = copy_written_into_shadows(mem, runs, verdict.is_err(), skip);
        // 3. Map the shadows (a clean one is the page's content already).
        self.map_shadows(runs, to)?;
        // 4. Dispose of the old pages and release the pages on `to`.
        let moved = self.dispose_parked(runs, to);
        let c = &mem.counters;
        c.shadow_demotion_ns
            .fetch_add(elapsed_ns(start), Ordering::Relaxed);
        c.shadow_demotions
            .fetch_add((moved - copied) as u64, Ordering::Relaxed);
        c.shadow_demotions_copied
            .fetch_add(copied as u64, Ordering::Relaxed);
        out.shadow_demoted += moved - copied;
        out.shadow_copied += copied;
        out.migrated += moved;
        self.harvester.finish_deferred(mem);
        verdict.map(|_| ())
    }

    /// Shadow demotion step 1: every page of `runs` into its parking slot
    /// (empty: the page is owned, not parked). On failure, whatever moved
    /// goes back and nothing else changed.
    fn park_runs(&self, runs: &[Run]) -> io::Result<()> {
        let mem = &*self.mem;
        let pairs: Vec<_> = runs
            .iter()
            .flat_map(|r| r.pages().map(|p| (mem.park_addr(p), mem.guest_addr(p))))
            .collect();
        let Err(e) = self.move_healing(&pairs) else {
            return Ok(());
        };
        let back: Vec<_> = pairs.iter().map(|&(park, guest)| (guest, park)).collect();
        mem.move_pairs_present(&back);
        for p in runs.iter().flat_map(|r| r.pages()) {
            // A page that could not move back stays parked: the fault
            // handler maps it back on its next touch.
            let in_guest = sys::resident(mem.guest_addr(p), 1)
                .map(|x| x[0])
                .unwrap_or(true);
            mem.release_page(p, if in_guest { 0 } else { page_map::PARKED }, 0);
        }
        Err(e)
    }

    /// Shadow demotion step 3: publish `to` and map each page's shadow in.
    /// On failure, finishes page by page: the shadow in (retried), or else
    /// the page back from its parking slot; either holds the page's content
    /// (a written page was copied into its shadow in step 2).
    fn map_shadows(&self, runs: &[Run], to: TierId) -> io::Result<()> {
        let mem = &*self.mem;
        for r in runs {
            mem.publish_placement(r.first, r.len, to);
        }
        let map: Vec<_> = runs
            .iter()
            .flat_map(|r| r.pages().map(|p| (mem.guest_addr(p), mem.shadow_addr(p))))
            .collect();
        let Err(e) = mem.move_pairs_finishing(&map) else {
            return Ok(());
        };
        for r in runs {
            for p in r.pages() {
                let in_guest = sys::resident(mem.guest_addr(p), 1)
                    .map(|x| x[0])
                    .unwrap_or(false);
                let shadow_in = in_guest
                    || mem
                        .move_retrying(mem.guest_addr(p), mem.shadow_addr(p), PAGE_SIZE)
                        .is_ok();
                if shadow_in {
                    mem.dispose(r.from, &[mem.park_addr(p)]);
                    mem.release_page(p, on_tier(to), PLACEMENT_BITS | SHADOW_BITS);
                    self.count_moved(r.from, to, 1);
                } else if mem
                    .move_retrying(mem.guest_addr(p), mem.park_addr(p), PAGE_SIZE)
                    .is_ok()
                {
                    mem.publish_placement(p, 1, r.from);
                    mem.release_page(p, 0, 0);
                } else {
                    // Kept owned: a touch waits while the VM stops.
                    mem.set_fatal(format!(
                        "guest page {p} could not be put back after a failed shadow demotion"
                    ));
                }
            }
        }
        mem.counters.rollback_errors.fetch_add(1, Ordering::Relaxed);
        Err(e.into())
    }

    /// Shadow demotion step 4: frees the parked old pages and releases the
    /// pages on `to`; returns how many pages were demoted.
    fn dispose_parked(&self, runs: &[Run], to: TierId) -> usize {
        let mem = &*self.mem;
        let mut moved = 0;
        for r in runs {
            if r.is_huge() {
                mem.dispose_huge(r.from, mem.park_addr(r.first));
            } else {
                let old: Vec<usize> = r.pages().map(|p| mem.park_addr(p)).collect();
                mem.dispose(r.from, &old);
            }
            for p in r.pages() {
                mem.release_page(p, on_tier(to), PLACEMENT_BITS | SHADOW_BITS);
            }
            self.count_moved(r.from, to, r.len);
            moved += r.len;
        }
        moved
    }
}

/// Nanoseconds since `start` (saturating; a mechanism's time for the
/// counters).
fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Shadow demotion step 2: copies each parked page that was written since
/// its promotion (or every page when the harvest failed) into its shadow;
/// returns how many were copied.
fn copy_written_into_shadows(
    mem: &TieredMemory,
    runs: &[Run],
    harvest_failed: bool,
    skip_dirty_check: bool,
) -> usize {
    let mut copied = 0;
    for p in runs.iter().flat_map(|r| r.pages()) {
        let dirty = harvest_failed || (!skip_dirty_check && mem.pages.load(p) & DIRTY_SEEN != 0);
        if dirty {
            // SAFETY: the page sits in its parking slot and its shadow in its
            // shadow slot; both present, page-aligned, and owned by us.
            unsafe {
                sys::copy_volatile(
                    mem.shadow_addr(p) as *mut u8,
                    mem.park_addr(p) as *const u8,
                    PAGE_SIZE,
                )
            };
            copied += 1;
        }
    }
    copied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::tests::setup;
    use crate::mem::InitialPlacement;

    /// Adding an outcome adds every one of its counts.
    #[test]
    fn adding_outcomes_adds_every_count() {
        let one = |k: usize| BatchOutcome {
            migrated: k,
            committed: 2 * k,
            aborted: 3 * k,
            aborted_pages: 4 * k,
            retries_queued: 5 * k,
            shadow_demoted: 6 * k,
            shadow_copied: 7 * k,
            skipped_no_space: 8 * k,
            skipped_busy: 9 * k,
            skipped_untouched: 10 * k,
            already_placed: 11 * k,
        };
        let mut sum = one(1);
        sum.add(&one(2));
        assert_eq!(format!("{sum:?}"), format!("{:?}", one(3)));
    }

    /// A unit with a page a mover owns is skipped whole, and counted by its
    /// pages; a page already on the destination is counted as placed.
    #[test]
    fn units_with_a_busy_page_are_skipped_whole_and_counted() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        m.promote(&[Unit::page(20)], Mechanism::StopAndCopy)
            .unwrap();
        assert!(mem.pages.try_acquire(5, false).is_some());
        assert!(mem.pages.try_acquire(9, false).is_some());
        let units = [
            Unit::page(5),
            Unit::run(8, 4),
            Unit::page(20),
            Unit::page(30),
        ];
        let out = m.promote(&units, Mechanism::StopAndCopy).unwrap();
        mem.release_page(5, 0, 0);
        mem.release_page(9, 0, 0);
        assert_eq!(
            (out.skipped_busy, out.already_placed, out.migrated),
            (5, 1, 1),
            "{out:?}"
        );
        assert!((8..12).all(|p| mem.tier_of(p) == Some(1)));
        assert_eq!(mem.tier_of(30), Some(0));
    }

    /// A move to a full tier reclaims that tier's shadows: enough for the
    /// run and the low watermark (4 pages here), no more.
    #[test]
    fn a_move_to_a_full_tier_reclaims_shadows_for_the_run_and_the_watermark() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let units: Vec<Unit> = (0..10).map(Unit::page).collect();
        m.promote(&units, Mechanism::TPM).unwrap();
        m.promote(&[Unit::page(20)], Mechanism::StopAndCopy)
            .unwrap();
        mem.resize(1, 1023).unwrap(); // 1013 guest pages and 10 shadows: full
        let out = m.demote(&[Unit::page(20)], Mechanism::StopAndCopy).unwrap();
        assert_eq!(out.migrated, 1, "{out:?}");
        assert_eq!((mem.tiers[1].shadows(), mem.free_pages(1)), (5, 4));
    }

    /// Three tiers, page 2 (on tier 2) promoted by TPM: it has a shadow on
    /// tier 2, the one shadow there.
    fn page_2_promoted_with_its_shadow_on_tier_2() -> Option<crate::mem::tests::Env> {
        let env = crate::mem::tests::setup_three_tiers()?;
        env.2.promote(&[Unit::page(2)], Mechanism::TPM).unwrap();
        assert_eq!(env.0.tiers[2].shadows(), 1);
        Some(env)
    }

    /// A page copied to a third tier gives up its shadow on the other
    /// slower tier (the shadow would be stale).
    #[test]
    fn a_copied_page_gives_up_its_shadow_elsewhere() {
        let Some((mem, _log, m, _faults)) = page_2_promoted_with_its_shadow_on_tier_2() else {
            return;
        };
        // Then copied to tier 1.
        assert_eq!((mem.shadow_tier(2), mem.has_shadow(2)), (Some(2), true));
        assert_eq!((mem.shadow_tier(1), mem.has_shadow(1)), (None, false));
        // 96 pages: 32 a tier, page 2 now on tier 0 with its shadow on 2.
        assert_eq!(mem.tier_counts(), [(33, 0), (32, 0), (31, 1)]);
        let out = m
            .migrate(
                &[Unit::page(2)],
                1,
                Mechanism::Transactional { keep_shadow: false },
            )
            .unwrap();
        assert_eq!(out.migrated, 1, "{out:?}");
        assert_eq!(mem.tier_of(2), Some(1));
        assert_eq!(mem.tiers[2].shadows(), 0);
        // Its shadow slot was emptied before the move, not healed by it
        // (cargo-mutants: the shadow test of `prepare` inverted).
        assert_eq!(mem.counters.slot_heals.load(Ordering::Relaxed), 0);
        assert_eq!(
            crate::mem::page_map::shadow_tier_of(mem.pages.load(2)),
            None
        );
        mem.check_consistency().unwrap();
    }

    /// After a batch, a tier whose free pages fell below its shadows' low
    /// watermark (4 pages here) gets shadows reclaimed up to twice it; at or
    /// above the watermark none is.
    #[test]
    fn a_batch_reclaims_shadows_below_the_low_watermark_up_to_twice_it() {
        for (capacity, shadows_left) in [(1030, 10), (1028, 10), (1026, 4)] {
            let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst)
            else {
                return;
            };
            assert_eq!(mem.shadow_low_watermark(1), 4);
            mem.resize(1, capacity).unwrap();
            let units: Vec<Unit> = (0..10).map(Unit::page).collect();
            m.promote(&units, Mechanism::TPM).unwrap();
            assert_eq!(
                mem.tiers[1].shadows(),
                shadows_left,
                "slow tier of {capacity} pages: {} free after the batch",
                mem.free_pages(1)
            );
        }
    }

    /// A page never touched is released and counted as untouched, not
    /// moved: here a run of 8 touched pages (the end of the first 2 MiB,
    /// which the first touch commits whole) and 8 untouched ones.
    #[test]
    fn untouched_pages_of_a_run_are_counted_and_not_moved() {
        let mut cfg = crate::mem::MemConfig::new(1024 * PAGE_SIZE, 1024);
        cfg.placement = InitialPlacement::SlowFirst;
        cfg.tiers[1].capacity_pages = 1088;
        cfg.tiers[1].max_capacity_pages = 1088;
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = Arc::new(TieredMemory::new(&cfg).expect("TieredMemory::new on a capable host"));
        let _faults = crate::mem::FaultHandler::spawn(mem.clone()).unwrap();
        mem.prefault(0, 1).unwrap();
        let log = Arc::new(crate::mem::SoftDirtyLog::new(mem.guest_pages()));
        let m = Migrator::new(mem.clone(), Box::new(log), MigratorConfig::default()).unwrap();
        let out = m
            .promote(&[Unit::run(504, 16)], Mechanism::StopAndCopy)
            .unwrap();
        assert_eq!((out.migrated, out.skipped_untouched), (8, 8), "{out:?}");
        assert!((504..512).all(|p| mem.tier_of(p) == Some(0)));
        assert!((512..520).all(|p| mem.tier_of(p).is_none()));
        mem.check_consistency().unwrap();
    }

    /// A destination slot holding a stray page (no page owns it) is
    /// discarded and the move retried, for that slot only: the batch moves
    /// whole, one heal is counted, and the guest's data is intact.
    #[test]
    fn a_stray_page_in_a_destination_slot_is_healed_once() {
        for mech in [Mechanism::StopAndCopy, Mechanism::TPM] {
            let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst)
            else {
                return;
            };
            for p in 2..5 {
                crate::mem::tests::guest_write(&mem, &log, p, 0x1000 + p as u64);
            }
            crate::mem::tests_planted::plant_page(&mem, mem.shadow_addr(3));
            let units: Vec<Unit> = (2..5).map(Unit::page).collect();
            let out = m.promote(&units, mech).unwrap();
            assert_eq!(out.migrated, 3, "{mech:?}: {out:?}");
            assert_eq!(
                mem.counters.slot_heals.load(Ordering::Relaxed),
                1,
                "{mech:?}"
            );
            for p in 2..5 {
                assert_eq!(mem.tier_of(p), Some(0), "{mech:?}: page {p}");
                let v = crate::mem::tests::word(&mem, p).load(Ordering::SeqCst);
                assert_eq!(v, 0x1000 + p as u64, "{mech:?}: page {p}");
            }
            mem.check_consistency().unwrap();
        }
    }

    /// A TPM aborted by a write in its copy window is retried after
    /// `retry_base`, then twice that, and given up after
    /// `retry_max_attempts` retries; the write survives every abort. (The
    /// test moves each retry's due time to now instead of waiting for it.)
    #[test]
    fn aborted_tpms_are_retried_with_a_doubling_back_off_then_given_up() {
        let Some((mem, log, _m, _faults)) = setup(256, 256, InitialPlacement::SlowFirst) else {
            return;
        };
        let cfg = MigratorConfig {
            retry_base: Duration::from_secs(10),
            retry_max_attempts: 2,
        };
        let m = Migrator::new(mem.clone(), Box::new(log.clone()), cfg).unwrap();
        let page = 40usize;
        let write_in_copy_window = |value: u64, f: &dyn Fn() -> io::Result<BatchOutcome>| {
            let (mm, lg) = (mem.clone(), log.clone());
            let out = crate::test_point::with_action(
                move |point| {
                    if point == crate::test_point::TestPoint::TpmCopied {
                        crate::mem::tests::guest_write(&mm, &lg, page, value);
                    }
                },
                f,
            )
            .unwrap();
            assert_eq!(out.aborted, 1, "{out:?}");
            assert_eq!(
                crate::mem::tests::word(&mem, page).load(Ordering::SeqCst),
                value
            );
            assert_eq!(mem.tier_of(page), Some(1));
            out
        };
        // The queued retry: its attempt count and how far off it is due.
        let queued = || {
            let q = lock(&m.retries);
            q.iter()
                .map(|r| (r.attempts, r.due.saturating_duration_since(Instant::now())))
                .collect::<Vec<_>>()
        };
        let make_due = || {
            lock(&m.retries)
                .iter_mut()
                .for_each(|r| r.due = Instant::now())
        };
        let out =
            write_in_copy_window(1, &|| m.promote(&[Unit::page(page as u64)], Mechanism::TPM));
        assert_eq!(out.retries_queued, 1, "{out:?}");
        let q = queued();
        assert!(q.len() == 1 && q[0].0 == 1, "{q:?}");
        assert!(
            q[0].1 > Duration::from_secs(9) && q[0].1 <= Duration::from_secs(10),
            "{q:?}"
        );
        make_due();
        write_in_copy_window(2, &|| m.run_due_retries());
        let q = queued();
        assert!(q.len() == 1 && q[0].0 == 2, "{q:?}");
        assert!(
            q[0].1 > Duration::from_secs(19) && q[0].1 <= Duration::from_secs(20),
            "{q:?}"
        );
        make_due();
        let out = write_in_copy_window(3, &|| m.run_due_retries());
        assert_eq!((out.retries_queued, m.pending_retries()), (0, 0), "{out:?}");
        let c = mem.stats().migration;
        assert_eq!((c.tpm_aborts, c.tpm_retries, c.tpm_gave_up), (3, 2, 1));
        mem.check_consistency().unwrap();
    }

    /// A stop-and-copy whose commit fails part way (the second of three
    /// single-page moves into guest RAM, injected): each page ends with
    /// one good copy in guest RAM, the committed one on the fast tier and
    /// the others restored on the slow tier; every page is released and
    /// the fast tier's reservation given back exactly.
    #[test]
    fn a_commit_that_fails_part_way_settles_every_page() {
        use crate::inject::FaultPlan;
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let pages = [2usize, 4, 6];
        for p in pages {
            crate::mem::tests::guest_write(&mem, &log, p, 0x5000 + p as u64);
        }
        let free_before = mem.free_pages(0);
        // Three unmap moves, then the commit's: its second fails, and so
        // does the retry of that page's move (EEXIST is final). The second
        // plan counts only the calls the first one let through.
        mem.injector().set(&[
            FaultPlan::parse("move:every=5:max=1:errno=EIO").unwrap(),
            FaultPlan::parse("move:every=5:max=1:errno=EEXIST").unwrap(),
        ]);
        let units: Vec<Unit> = pages.iter().map(|&p| Unit::page(p as u64)).collect();
        let res = m.promote(&units, Mechanism::StopAndCopy);
        mem.injector().set(&[]);
        let tiers: Vec<_> = pages.iter().map(|&p| mem.tier_of(p)).collect();
        assert!(res.is_err(), "{res:?} {tiers:?}");
        for p in pages {
            // Bounded: a page left out of guest RAM would block its reader.
            let v = crate::mem::tests::touch_bounded(&mem, p, "a page of the failed commit");
            assert_eq!(v, 0x5000 + p as u64, "page {p} ({tiers:?})");
        }
        // Page 2 moved before the failure, page 6 in the commit's finishing
        // of it; page 4's move failed twice and its old page went back.
        assert_eq!(tiers, [Some(0), Some(1), Some(0)]);
        let on_fast = 2;
        assert_eq!(mem.free_pages(0), free_before - on_fast);
        // The commit's failure, and each of the three transactions settled.
        assert_eq!(mem.stats().migration.rollback_errors, 4);
        mem.check_consistency().unwrap();
        // Nothing is left owned: the restored pages move now.
        let out = m.promote(&units, Mechanism::StopAndCopy).unwrap();
        assert_eq!(
            (out.migrated, out.already_placed),
            (3 - on_fast, on_fast),
            "{out:?}"
        );
        assert_eq!(mem.free_pages(0), free_before - 3);
    }

    /// `move_pages(2)` (here both nodes are node 0, so the kernel reports
    /// every page on the destination): a page with a shadow on a third tier
    /// gives it up, the move counts as a demotion, and a run that does not
    /// fit the destination is released and counted as skipped.
    #[test]
    fn kernel_moves_free_a_shadow_elsewhere_and_skip_a_full_tier() {
        let Some((mem, _log, m, _faults)) = page_2_promoted_with_its_shadow_on_tier_2() else {
            return;
        };
        // Then moved to tier 1.
        let demotions = mem.stats().migration.demotions;
        let out = m
            .migrate(&[Unit::page(2)], 1, Mechanism::KernelMovePages)
            .unwrap();
        assert_eq!(out.migrated, 1, "{out:?}");
        assert_eq!(mem.tier_of(2), Some(1));
        assert_eq!(mem.tiers[2].shadows(), 0);
        assert_eq!(page_map::shadow_tier_of(mem.pages.load(2)), None);
        assert_eq!(mem.stats().migration.demotions, demotions + 1);
        mem.check_consistency().unwrap();
        // Tier 1 made exactly full: two pages of tier 2 do not fit.
        let used = mem.tiers[1].capacity() as usize - mem.free_pages(1);
        mem.resize(1, used).unwrap();
        let out = m
            .migrate(
                &[Unit::page(5), Unit::page(8)],
                1,
                Mechanism::KernelMovePages,
            )
            .unwrap();
        assert_eq!((out.migrated, out.skipped_no_space), (0, 2), "{out:?}");
        assert_eq!((mem.tier_of(5), mem.tier_of(8)), (Some(2), Some(2)));
        mem.check_consistency().unwrap();
    }

    /// Every free chunk of the fast tier's pool, reserved; each a hole.
    fn free_hole_chunks(mem: &TieredMemory) -> Vec<crate::mem::pool::Slot> {
        let chunks = crate::mem::tests::take_free_chunks(mem, 0);
        assert!(chunks.iter().all(|&(_, h)| h == Holds::Hole), "{chunks:?}");
        chunks.into_iter().map(|(c, _)| c).collect()
    }

    /// A 2 MiB run moved through a staging chunk that already had a page
    /// table (so the copy fills it 4 KiB at a time) leaves that table in
    /// the chunk: the pool gets the chunk back tainted, never as a clean
    /// huge hole that a later whole 2 MiB move would split.
    #[test]
    fn a_staging_chunk_filled_4k_at_a_time_comes_back_tainted() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        // Every chunk of the fast tier's pool tainted: a 4 KiB page moved
        // in (the kernel makes a page table for it), then discarded.
        let chunks = free_hole_chunks(&mem);
        for &c in &chunks {
            let a = mem.slot_addr(0, c);
            crate::mem::tests_planted::plant_page(&mem, a);
            mem.discard(a, PAGE_SIZE).unwrap();
            mem.pool(0).release_chunk(c, Holds::Hole, false);
        }
        let tainted = || {
            let pool = mem.pool(0);
            chunks
                .iter()
                .filter(|&&c| pool.chunk_tainted(c) == Some(true))
                .count()
        };
        assert_eq!(tainted(), chunks.len());
        let out = m
            .promote(&[Unit::run(512, 512)], Mechanism::StopAndCopy)
            .unwrap();
        assert_eq!(out.migrated, 512, "{out:?}");
        assert_eq!(tainted(), chunks.len(), "a chunk came back clean");
        mem.check_consistency().unwrap();
    }

    /// A TPM abort whose move of the old pages back fails once (an injected
    /// EIO) falls back to one retried move of the whole run: the abort
    /// completes as an abort (retry queued, no rollback error, the write
    /// kept) instead of being settled page by page as a failure.
    #[test]
    fn an_aborts_failed_move_back_falls_back_to_one_move_of_the_run() {
        use crate::inject::FaultPlan;
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        for p in 8..12 {
            crate::mem::tests::guest_write(&mem, &log, p, 0x700 + p as u64);
        }
        // The unmap's move of the run, then the abort's: it fails.
        mem.injector()
            .set(&[FaultPlan::parse("move:every=2:max=1:errno=EIO").unwrap()]);
        let (mm, lg) = (mem.clone(), log.clone());
        let res = crate::test_point::with_action(
            move |point| {
                if point == crate::test_point::TestPoint::TpmCopied {
                    crate::mem::tests::guest_write(&mm, &lg, 9, 0xabc);
                }
            },
            || m.promote(&[Unit::run(8, 4)], Mechanism::TPM),
        );
        mem.injector().set(&[]);
        let out = res.unwrap();
        assert_eq!(
            (out.aborted, out.aborted_pages, out.retries_queued),
            (1, 4, 1),
            "{out:?}"
        );
        assert_eq!(mem.stats().migration.rollback_errors, 0);
        for p in 8..12 {
            let want = if p == 9 { 0xabc } else { 0x700 + p as u64 };
            let v = crate::mem::tests::touch_bounded(&mem, p, "a page of the aborted run");
            assert_eq!((v, mem.tier_of(p)), (want, Some(1)), "page {p}");
        }
        mem.check_consistency().unwrap();
    }

    /// A TPM whose commit fails for pages whose old copy is gone too (the
    /// test discards it after the unmap): the settle maps the staging copy
    /// of one (it is on the destination now, its reservation its page) and
    /// stops the VM for the other, whose staging copy could not be mapped
    /// either (its reservation stays: the page is still being moved).
    #[test]
    fn a_failed_commit_of_pages_without_their_old_copy_maps_the_staging_copy_or_stops_the_vm() {
        use crate::inject::FaultPlan;
        use crate::test_point::TestPoint;
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        for p in [4usize, 6] {
            crate::mem::tests::guest_write(&mem, &log, p, 0x900 + p as u64);
        }
        let free_before = mem.free_pages(0);
        let copied = Arc::new(AtomicBool::new(false));
        let mm = mem.clone();
        let res = crate::test_point::with_action(
            move |point| match point {
                TestPoint::TpmCopied => copied.store(true, Ordering::SeqCst),
                // The TPM's own harvest: the pages are unmapped, in their
                // shadow slots. Their old copies go, and the commit's moves
                // fail: the batch's move, then each page's retry; then the
                // settle's move of page 6's staging copy (the 2nd after).
                TestPoint::HarvestRead if copied.swap(false, Ordering::SeqCst) => {
                    for p in [4, 6] {
                        mm.discard(mm.shadow_addr(p), PAGE_SIZE).unwrap();
                    }
                    mm.injector().set(&[
                        FaultPlan::parse("move:every=1:max=3:errno=EEXIST").unwrap(),
                        FaultPlan::parse("move:every=2:max=1:errno=EEXIST").unwrap(),
                    ]);
                }
                _ => {}
            },
            || m.promote(&[Unit::page(4), Unit::page(6)], Mechanism::TPM),
        );
        mem.injector().set(&[]);
        assert!(res.is_err(), "{res:?}");
        // Page 4: its staging copy mapped; on the fast tier, no shadow.
        assert!(sys::resident(mem.guest_addr(4), 1).unwrap()[0]);
        let w = mem.pages.load(4);
        assert_eq!((page_map::tier_of(w), w & SHADOW), (Some(0), 0));
        assert_eq!(
            crate::mem::tests::word(&mem, 4).load(Ordering::SeqCst),
            0x904
        );
        // Page 6: no copy could be mapped; the VM is stopped for it, the
        // page stays owned (a touch would wait) and keeps its reservation.
        assert!(!sys::resident(mem.guest_addr(6), 1).unwrap()[0]);
        let fatal = mem.fatal_error().unwrap_or_default().to_string();
        assert!(fatal.contains("guest page 6:"), "{fatal:?}");
        assert_eq!(mem.free_pages(0), free_before - 2);
        assert_eq!(mem.stats().migration.rollback_errors, 3);
    }

    /// A shadow demotion whose mapping of the shadows fails for one page
    /// (its batch move and its retry: injected) finishes page by page: the
    /// page mapped already stays, the other's shadow goes in on the next
    /// try; both end on the slow tier without a shadow, nothing is fatal.
    #[test]
    fn a_shadow_demotion_whose_map_fails_part_way_finishes_page_by_page() {
        use crate::inject::FaultPlan;
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        for p in [2usize, 4] {
            crate::mem::tests::guest_write(&mem, &log, p, 0x300 + p as u64);
        }
        let units = [Unit::page(2), Unit::page(4)];
        m.promote(&units, Mechanism::TPM).unwrap();
        assert_eq!(mem.shadow_pages(), 2);
        // Moves: the two parkings, the batch map (page 2 moves, page 4
        // fails), then page 4's retry fails too; the settle's move of page
        // 4's shadow succeeds.
        mem.injector().set(&[
            FaultPlan::parse("move:every=4:max=1:errno=EEXIST").unwrap(),
            FaultPlan::parse("move:every=4:max=1:errno=EEXIST").unwrap(),
        ]);
        let res = m.demote(&units, Mechanism::TPM);
        mem.injector().set(&[]);
        assert!(res.is_err(), "{res:?}");
        assert_eq!(mem.fatal_error(), None);
        assert_eq!(mem.stats().migration.rollback_errors, 2);
        for p in [2usize, 4] {
            let v = crate::mem::tests::touch_bounded(&mem, p, "a page of the demotion");
            let w = mem.pages.load(p);
            assert_eq!(
                (v, page_map::tier_of(w), page_map::shadow_tier_of(w)),
                (0x300 + p as u64, Some(1), None),
                "page {p}"
            );
        }
        assert_eq!(mem.shadow_pages(), 0);
        mem.check_consistency().unwrap();
    }

    /// The other side of the test above: a staging chunk that held one
    /// whole huge page (the kernel's THP at the copy's first touch, or the
    /// test's `MADV_COLLAPSE` of it after the copy, so that it does not
    /// depend on the host's THP settings) moved out whole and comes back
    /// clean: a later 2 MiB move may use it without splitting.
    #[test]
    fn a_staging_chunk_that_held_a_huge_page_comes_back_clean() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let mut chunks = free_hole_chunks(&mem);
        // One chunk left to the move, so the test knows its staging chunk.
        let staging = chunks.pop().unwrap();
        mem.pool(0).release_chunk(staging, Holds::Hole, true);
        assert_eq!(mem.pool(0).chunk_tainted(staging), Some(false));
        let a = mem.slot_addr(0, staging);
        let collapsed = Arc::new(Mutex::new(None));
        let seen = collapsed.clone();
        let mem2 = mem.clone();
        let out = crate::test_point::with_action(
            move |p| {
                if p == crate::test_point::TestPoint::TpmCopied {
                    let r = mem2
                        .mapping()
                        .advise(a, HUGE_PAGE_SIZE, sys::Advice::Collapse);
                    *seen.lock().unwrap() = Some(r.map_err(|e| e.to_string()));
                }
            },
            || m.promote(&[Unit::run(512, 512)], Mechanism::TPM),
        )
        .unwrap();
        assert_eq!(out.migrated, 512, "{out:?}");
        assert_eq!(
            *collapsed.lock().unwrap(),
            Some(Ok(())),
            "MADV_COLLAPSE of the staging chunk after the copy"
        );
        assert_eq!(
            mem.pool(0).chunk_tainted(staging),
            Some(false),
            "a staging chunk that held a huge page came back tainted"
        );
        for p in 512..1024 {
            assert_eq!(page_map::tier_of(mem.pages.load(p)), Some(0), "page {p}");
        }
        crate::mem::tests::give_back_chunks(&mem, 0, &chunks);
        mem.check_consistency().unwrap();
    }

    /// What the memory reports after a TPM promotion that kept a shadow
    /// and a write a harvest then saw: its counts and per-tier stats, the
    /// write counts (taken once), and each page's host node.
    #[test]
    fn the_memory_reports_its_pages_shadows_writes_and_nodes() {
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        m.promote(&[Unit::page(7), Unit::page(9)], Mechanism::TPM)
            .unwrap();
        assert_eq!((mem.populated_pages(), mem.shadow_pages()), (1024, 2));
        let s = mem.stats();
        assert_eq!(
            (s.backing.populated_pages, s.migration.shadow_pages),
            (1024, 2)
        );
        let tiers: Vec<_> = s
            .tiers
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.node,
                    t.capacity_pages,
                    t.pages,
                    t.guest_pages,
                    t.shadow_pages,
                    t.free_pages,
                    t.emulated,
                )
            })
            .collect();
        assert_eq!(
            tiers,
            [
                ("fast", 0, 1024, 2, 2, 0, 1022, true),
                ("slow", 0, 1088, 1024, 1022, 2, 64, true),
            ]
        );
        crate::mem::tests::guest_write(&mem, &log, 9, 99);
        m.harvest().unwrap();
        let counts = mem.take_write_counts();
        assert_eq!(counts.len(), 1024);
        assert_eq!(counts[9], 1, "{:?}", &counts[..16]);
        assert!(mem.take_write_counts().iter().all(|&c| c == 0));
        let nodes = mem.query_guest_nodes().unwrap();
        assert_eq!(nodes.len(), 1024);
        assert!(nodes.iter().all(|&n| n == 0), "{:?}", &nodes[..16]);
    }
}
