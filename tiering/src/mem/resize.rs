//! Live per-tier resize: a tier's capacity can grow and shrink while the VM
//! runs (the host-side service divides a node among VMs this way).
//!
//! A grow just raises the capacity the policy may use. A shrink lowers the
//! capacity at once (nothing new is placed above it) and then converges, in
//! bounded steps ([`Migrator::shrink_step`]), the way Linux reclaim would
//! but without losing data or running out of memory:
//!
//! 1. shadows on the tier are reclaimed (they are only copies);
//! 2. pages of the tier whose shadow on a slower tier is still valid are
//!    demoted by remapping the shadow (no copy);
//! 3. the coldest pages, in the order the policy gives (or a sweep of the
//!    tier when there is no policy), are demoted to the next slower tier
//!    with room, whole 2 MiB runs where a run is all on the tier;
//! 4. the freed host memory goes back to the kernel (the pool cache beyond
//!    what the tier can still use is discarded).
//!
//! When no slower tier has room (after its shadows were reclaimed), the
//! shrink stops where it is and says how far it got; nothing is lost.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use super::migrate::Migrator;
use super::page_map::{self, BUSY, PARKED};
use super::pool::CHUNK_SLOTS;
use super::{MemError, ResizeError, TieredMemory};
use crate::vocab::{Mechanism, TierId, Unit};

/// Pages a shrink step looks at (bounds the cost of one step).
const SCAN_WINDOW: usize = 1 << 16;

/// Where a resize stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeReport {
    /// The tier.
    pub tier: TierId,
    /// Target capacity, pages.
    pub target_pages: u64,
    /// Pages in use on the tier (guest pages + shadows) now.
    pub used_pages: u64,
    /// Shadows reclaimed by this step.
    pub shadows_reclaimed: u64,
    /// Pages demoted by remapping their shadow in this step.
    pub shadow_demoted: u64,
    /// Pages demoted by copying in this step.
    pub demoted: u64,
    /// Pages of pool cache given back to the kernel in this step.
    pub returned_pages: u64,
    /// The tier is at or below its target.
    pub complete: bool,
    /// Why the shrink cannot go on (slower tiers full), if so.
    pub stuck: Option<String>,
}

/// Sweep cursor per tier (victim search when no policy gives an order).
#[derive(Debug, Default)]
pub(crate) struct SweepCursor(AtomicUsize);

impl TieredMemory {
    /// Sets the capacity of `tier` to `pages` (a grow takes effect at once;
    /// a shrink converges with [`Migrator::shrink_step`]). Refused when the
    /// tiers together could no longer hold the guest, or beyond the tier's
    /// reservation.
    pub fn resize(&self, tier: TierId, pages: usize) -> Result<u64, MemError> {
        let Some(account) = self.tiers.get(usize::from(tier)) else {
            return Err(ResizeError::NoSuchTier {
                tier,
                tiers: self.tier_count(),
            }
            .into());
        };
        let max = account.spec.max_capacity_pages;
        if pages > max {
            return Err(ResizeError::AboveMaximum {
                tier: account.spec.name.clone(),
                pages,
                max,
            }
            .into());
        }
        let others: usize = self
            .tiers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != usize::from(tier))
            .map(|(_, t)| t.capacity() as usize)
            .sum();
        if others.saturating_add(pages) < self.guest_pages {
            return Err(ResizeError::CannotHoldGuest {
                tier: account.spec.name.clone(),
                pages,
                total: others + pages,
                guest: self.guest_pages,
            }
            .into());
        }
        let applied = account.set_capacity(pages as u64);
        self.counters.resizes.fetch_add(1, Ordering::Relaxed);
        Ok(applied)
    }

    /// Pages of `tier` above its capacity (a shrink not converged yet).
    pub fn excess_pages(&self, tier: TierId) -> usize {
        self.tiers
            .get(usize::from(tier))
            .map_or(0, |t| t.excess() as usize)
    }

    /// Up to `want` demotion victims on `tier` from a sweep: whole 2 MiB
    /// runs that are all on the tier first, then single pages; pages with a
    /// shadow are left to the shadow step.
    fn sweep_victims(&self, tier: TierId, want: usize) -> Vec<Unit> {
        let n = self.guest_pages;
        let cursor = &self.sweep[usize::from(tier)].0;
        let start = cursor.load(Ordering::Relaxed) % n.max(1);
        let mut out = Vec::new();
        let mut got = 0;
        let mut p = start / CHUNK_SLOTS * CHUNK_SLOTS;
        let mut scanned = 0;
        let on_tier = |w: u64| {
            page_map::tier_of(w) == Some(tier) && w & (BUSY | PARKED | page_map::SHADOW) == 0
        };
        while got < want && scanned < SCAN_WINDOW.min(n) {
            let end = (p + CHUNK_SLOTS).min(n);
            if self.huge_pages
                && end - p == CHUNK_SLOTS
                && want - got >= CHUNK_SLOTS
                && (p..end).all(|q| on_tier(self.pages.load(q)))
            {
                out.push(Unit::run(p as u64, CHUNK_SLOTS as u32));
                got += CHUNK_SLOTS;
            } else {
                for q in p..end {
                    if got >= want {
                        break;
                    }
                    if on_tier(self.pages.load(q)) {
                        out.push(Unit::page(q as u64));
                        got += 1;
                    }
                }
            }
            scanned += end - p;
            p = if end >= n { 0 } else { end };
        }
        cursor.store(p, Ordering::Relaxed);
        out
    }

    /// Pages of `tier` whose shadow (on a slower tier) is valid, up to `want`.
    fn shadowed_pages(&self, tier: TierId, want: usize) -> Vec<(TierId, Unit)> {
        let mut out = Vec::new();
        for p in 0..self.guest_pages {
            if out.len() >= want {
                break;
            }
            let w = self.pages.load(p);
            if page_map::tier_of(w) == Some(tier) && w & (BUSY | PARKED) == 0 {
                if let Some(s) = page_map::shadow_tier_of(w).filter(|&s| s > tier) {
                    out.push((s, Unit::page(p as u64)));
                }
            }
        }
        out
    }
}

impl Migrator {
    /// One bounded step of a shrink of `tier` (see the module docs):
    /// moves at most `budget_pages` pages. `order` is the policy's
    /// demotion order (coldest first; pages not on the tier are skipped);
    /// `None` sweeps the tier. Call it until the report says `complete` or
    /// `stuck`.
    pub fn shrink_step(
        &self,
        tier: TierId,
        budget_pages: usize,
        order: Option<&[Unit]>,
    ) -> std::io::Result<ResizeReport> {
        let mem = self.memory().clone();
        let _doing = mem.activities.begin(format!(
            "shrinking tier {tier} by up to {budget_pages} pages"
        ));
        let account = &mem.tiers[usize::from(tier)];
        let mut rep = ResizeReport {
            tier,
            target_pages: account.capacity(),
            ..ResizeReport::default()
        };
        let mut left = budget_pages.max(1);
        // 1. Shadows on this tier are copies: drop them first.
        if account.excess() > 0 && account.shadows() > 0 {
            // Until one page is free again (the excess is gone) or no shadow is left.
            rep.shadows_reclaimed = mem.reclaim_shadows(tier, 1) as u64;
        }
        // 2. Pages with a valid shadow below: remap, no copy.
        left = self.shrink_by_shadow_remap(&mem, tier, left, &mut rep)?;
        // 3. The coldest pages, to the next slower tier with room.
        self.shrink_by_demotion(&mem, tier, order, left, &mut rep)?;
        // 4. Give the freed memory back: keep only the cache the tier can use.
        let keep = (account.free() as usize).min(mem.pool_cache_pages);
        rep.returned_pages = mem.trim_tier_cache(tier, keep) as u64;
        rep.used_pages = account.guest() + account.shadows();
        rep.complete = account.excess() == 0;
        Ok(rep)
    }

    /// Step 2 of [`Self::shrink_step`]: pages of `tier` with a valid shadow
    /// on a slower tier are remapped onto it (no copy). Returns the budget
    /// `left` after it.
    fn shrink_by_shadow_remap(
        &self,
        mem: &TieredMemory,
        tier: TierId,
        mut left: usize,
        rep: &mut ResizeReport,
    ) -> std::io::Result<usize> {
        let account = &mem.tiers[usize::from(tier)];
        if account.excess() > 0 {
            let want = (account.excess() as usize).min(left);
            let mut by_tier: std::collections::BTreeMap<TierId, Vec<Unit>> = Default::default();
            for (s, u) in mem.shadowed_pages(tier, want) {
                by_tier.entry(s).or_default().push(u);
            }
            for (s, units) in by_tier {
                let o = self.migrate(&units, s, Mechanism::ShadowDemotion)?;
                rep.shadow_demoted += o.shadow_demoted as u64 + o.shadow_copied as u64;
                left = left.saturating_sub(o.migrated);
            }
        }
        Ok(left)
    }

    /// Step 3 of [`Self::shrink_step`]: the coldest pages of `tier` (in
    /// `order`, or swept) go to the next slower tier with room, within the
    /// budget `left`.
    fn shrink_by_demotion(
        &self,
        mem: &TieredMemory,
        tier: TierId,
        order: Option<&[Unit]>,
        mut left: usize,
        rep: &mut ResizeReport,
    ) -> std::io::Result<()> {
        let account = &mem.tiers[usize::from(tier)];
        while account.excess() > 0 && left > 0 {
            let want = (account.excess() as usize).min(left);
            let victims: Vec<Unit> = match order {
                Some(o) => o
                    .iter()
                    .copied()
                    .filter(|u| mem.tier_of(u.page as usize) == Some(tier))
                    .take(want)
                    .collect(),
                None => mem.sweep_victims(tier, want),
            };
            if victims.is_empty() {
                break;
            }
            let need: usize = victims.iter().map(|u| u.pages as usize).sum();
            let Some(dst) = self.slower_tier_with_room(tier, need.min(CHUNK_SLOTS)) else {
                rep.stuck = Some(format!(
                    "no slower tier has room for the {} pages above the target of tier {} (their \
                 shadows were reclaimed); the shrink stops at {} pages",
                    account.excess(),
                    account.spec.name,
                    account.guest() + account.shadows()
                ));
                break;
            };
            // TPM first (the guest keeps running); units it had to abort
            // (written during the copy) go by stop-and-copy, so a shrink
            // converges even under a write-hot guest.
            let mut o = self.migrate(
                &victims,
                dst,
                Mechanism::Transactional { keep_shadow: false },
            )?;
            if o.aborted > 0 {
                let again = self.migrate(&victims, dst, Mechanism::StopAndCopy)?;
                o.migrated += again.migrated;
            }
            let moved = o.migrated;
            rep.demoted += moved as u64;
            left = left.saturating_sub(need);
            if moved == 0 && o.aborted == 0 && order.is_some() {
                break; // the policy's victims are gone; sweep next time
            }
        }
        Ok(())
    }

    /// The first tier slower than `tier` with `pages` free (reclaiming its
    /// shadows when it is short).
    fn slower_tier_with_room(&self, tier: TierId, pages: usize) -> Option<TierId> {
        let mem = self.memory();
        let slower = (usize::from(tier) + 1..mem.tier_count()).map(|t| t as TierId);
        for t in slower.clone() {
            if mem.free_pages(t) >= pages {
                return Some(t);
            }
        }
        for t in slower {
            mem.reclaim_shadows(t, pages);
            if mem.free_pages(t) >= pages {
                return Some(t);
            }
        }
        None
    }
}

/// One step of a capacity schedule: at `at` into the run, set the tier's
/// capacity to `pages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityStep {
    /// When, from the driver's start.
    pub at: std::time::Duration,
    /// The capacity, pages.
    pub pages: usize,
}

/// Settings of a [`ResizeDriver`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResizeConfig {
    /// Capacity schedule per tier (`--fast-schedule` sets tier 0's).
    pub schedules: Vec<(TierId, Vec<CapacityStep>)>,
    /// Most pages one shrink step moves (bounds the migration bandwidth a
    /// shrink takes from the guest: pages per `period`).
    pub step_pages: usize,
    /// Time between steps.
    pub period: std::time::Duration,
    /// Split 2 MiB ranges collapsed back into huge pages per 100 ms (each
    /// copies 2 MiB while the range's pages are owned).
    pub collapse_per_100ms: usize,
}

impl Default for ResizeConfig {
    fn default() -> Self {
        Self {
            schedules: Vec::new(),
            // 4096 pages per 10 ms: at most 1.6 GB/s of demotion.
            step_pages: 4096,
            period: std::time::Duration::from_millis(10),
            collapse_per_100ms: 4,
        }
    }
}

/// Where a resize driver stands (for reports).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResizeDriverReport {
    /// Capacity changes applied: (seconds since start, tier, pages).
    pub applied: Vec<(f64, TierId, u64)>,
    /// Capacity changes refused, with why.
    pub refused: Vec<String>,
    /// Shrink steps run.
    pub steps: u64,
    /// Pages demoted by shrinks (copies) and by remapping shadows.
    pub demoted: u64,
    /// Shadows reclaimed by shrinks.
    pub shadows_reclaimed: u64,
    /// Pool pages given back to the kernel by shrinks.
    pub returned_pages: u64,
    /// The last time a shrink could not go on, and why.
    pub stuck: Option<String>,
}

/// A thread that applies capacity changes (a schedule, or
/// [`ResizeHandle::set_capacity`] calls from the VMM or the service) and
/// converges shrinks in bounded steps ([`Migrator::shrink_step`]).
#[derive(Debug)]
pub struct ResizeDriver {
    shared: Arc<ResizeShared>,
    join: Option<std::thread::JoinHandle<ResizeDriverReport>>,
}

#[derive(Debug)]
struct ResizeShared {
    stop: std::sync::atomic::AtomicBool,
    requests: std::sync::Mutex<Vec<(TierId, usize)>>,
    report: std::sync::Mutex<ResizeDriverReport>,
}

/// A cheap handle to ask a running [`ResizeDriver`] for a capacity change.
#[derive(Debug, Clone)]
pub struct ResizeHandle {
    shared: Arc<ResizeShared>,
    mem: Arc<TieredMemory>,
}

use std::sync::Arc;

impl ResizeHandle {
    /// Sets tier `tier`'s capacity to `pages` now (checked at once: the
    /// error says why it is refused); the driver converges a shrink.
    pub fn set_capacity(&self, tier: TierId, pages: usize) -> Result<u64, MemError> {
        let applied = self.mem.resize(tier, pages)?;
        super::backing::lock(&self.shared.requests).push((tier, pages));
        Ok(applied)
    }

    /// The driver's account so far.
    pub fn report(&self) -> ResizeDriverReport {
        super::backing::lock(&self.shared.report).clone()
    }
}

impl ResizeDriver {
    /// Starts the driver over `migrator`.
    pub fn spawn(migrator: Arc<Migrator>, cfg: ResizeConfig) -> std::io::Result<Self> {
        let shared = Arc::new(ResizeShared {
            stop: std::sync::atomic::AtomicBool::new(false),
            requests: std::sync::Mutex::new(Vec::new()),
            report: std::sync::Mutex::new(ResizeDriverReport::default()),
        });
        let s = shared.clone();
        let join = std::thread::Builder::new()
            .name("tiervm-resize".into())
            .spawn(move || run_driver(&migrator, &cfg, &s))?;
        Ok(Self {
            shared,
            join: Some(join),
        })
    }

    /// A handle for capacity changes while the driver runs.
    pub fn handle(&self, mem: Arc<TieredMemory>) -> ResizeHandle {
        ResizeHandle {
            shared: self.shared.clone(),
            mem,
        }
    }

    /// Stops the driver (bounded: at most one step) and returns its report.
    pub fn stop(mut self) -> ResizeDriverReport {
        self.shutdown()
    }

    fn shutdown(&mut self) -> ResizeDriverReport {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        match self.join.take().map(|j| j.join()) {
            Some(Ok(r)) => r,
            _ => super::backing::lock(&self.shared.report).clone(),
        }
    }
}

impl Drop for ResizeDriver {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run_driver(m: &Migrator, cfg: &ResizeConfig, shared: &ResizeShared) -> ResizeDriverReport {
    crate::threads::started(crate::threads::ThreadRole::Resize);
    use std::sync::atomic::Ordering as O;
    let mem = m.memory().clone();
    let start = std::time::Instant::now();
    let mut pending: Vec<(TierId, std::collections::VecDeque<CapacityStep>)> = cfg
        .schedules
        .iter()
        .map(|(t, s)| (*t, s.iter().copied().collect()))
        .collect();
    let mut next_collapse = std::time::Duration::ZERO;
    while !shared.stop.load(O::Relaxed) {
        let now = start.elapsed();
        // 0. Put split huge pages back together where a range is whole
        //    on one tier again.
        if now >= next_collapse {
            mem.collapse_split_ranges(cfg.collapse_per_100ms);
            next_collapse = now + std::time::Duration::from_millis(100);
        }
        // 1. Scheduled capacity changes that are due.
        for (tier, steps) in &mut pending {
            while steps.front().is_some_and(|s| s.at <= now) {
                let Some(s) = steps.pop_front() else { break };
                let mut rep = super::backing::lock(&shared.report);
                match mem.resize(*tier, s.pages) {
                    Ok(p) => rep.applied.push((now.as_secs_f64(), *tier, p)),
                    Err(e) => rep
                        .refused
                        .push(format!("at {:.1} s: {e}", now.as_secs_f64())),
                }
            }
        }
        // 2. Changes asked through handles (already applied: record them).
        for (tier, pages) in std::mem::take(&mut *super::backing::lock(&shared.requests)) {
            super::backing::lock(&shared.report).applied.push((
                now.as_secs_f64(),
                tier,
                mem.capacity(tier) as u64,
            ));
            let _ = pages;
        }
        // 3. One bounded step of every shrink not converged yet.
        for tier in mem.tier_ids() {
            if mem.excess_pages(tier) == 0 {
                continue;
            }
            match m.shrink_step(tier, cfg.step_pages, None) {
                Ok(r) => {
                    let mut rep = super::backing::lock(&shared.report);
                    rep.steps += 1;
                    rep.demoted += r.demoted + r.shadow_demoted;
                    rep.shadows_reclaimed += r.shadows_reclaimed;
                    rep.returned_pages += r.returned_pages;
                    if r.stuck.is_some() {
                        rep.stuck = r.stuck;
                    }
                }
                Err(e) => tracing::warn!("shrink step of tier {tier}: {e}"),
            }
        }
        std::thread::sleep(cfg.period);
    }
    super::backing::lock(&shared.report).clone()
}

/// A capacity schedule (`--fast-schedule`) that does not parse; each
/// message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityScheduleError {
    /// A step without `@`.
    #[error("'{0}' is not SIZE@TIME (e.g. 256M@0s)")]
    NotSizeAtTime(String),
    /// A size that does not parse.
    #[error("'{size}' in '{step}' is not a size (e.g. 256M)")]
    BadSize {
        /// The size.
        size: String,
        /// The step.
        step: String,
    },
    /// A size that is not page-aligned.
    #[error("'{size}' in '{step}' is not a multiple of 4K")]
    SizeNotPages {
        /// The size.
        size: String,
        /// The step.
        step: String,
    },
    /// A size too large for this host's address space.
    #[error("'{0}' is too large")]
    TooLarge(String),
    /// A time that does not parse.
    #[error("'{time}' in '{step}' is not a time (e.g. 5s)")]
    BadTime {
        /// The time.
        time: String,
        /// The step.
        step: String,
    },
    /// A step earlier than the one before it.
    #[error("times in '{0}' must not decrease")]
    TimesDecrease(String),
    /// No steps at all.
    #[error("an empty capacity schedule: give e.g. 256M@0s,32M@5s")]
    Empty,
}

/// Parses a capacity schedule `SIZE@TIME,...` (e.g. `256M@0s,32M@5s`)
/// into steps of pages; times must not decrease.
pub fn parse_capacity_schedule(s: &str) -> Result<Vec<CapacityStep>, CapacityScheduleError> {
    use CapacityScheduleError as E;
    let mut out: Vec<CapacityStep> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (size, at) = part
            .split_once('@')
            .ok_or_else(|| E::NotSizeAtTime(part.to_string()))?;
        let bytes = tiervm_guest::args::parse_size(size).map_err(|_| E::BadSize {
            size: size.to_string(),
            step: part.to_string(),
        })?;
        if !bytes.is_multiple_of(crate::sys::PAGE_SIZE as u64) {
            return Err(E::SizeNotPages {
                size: size.to_string(),
                step: part.to_string(),
            });
        }
        let at = crate::engine::parse_duration(at).ok_or_else(|| E::BadTime {
            time: at.to_string(),
            step: part.to_string(),
        })?;
        if out.last().is_some_and(|l| at < l.at) {
            return Err(E::TimesDecrease(s.to_string()));
        }
        let pages = usize::try_from(bytes / crate::sys::PAGE_SIZE as u64)
            .map_err(|_| E::TooLarge(size.to_string()))?;
        out.push(CapacityStep { at, pages });
    }
    if out.is_empty() {
        return Err(E::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::tests::{setup, setup_three_tiers};
    use crate::mem::InitialPlacement;

    /// A shrink below what the tier holds leaves an excess of exactly the
    /// difference, until a step moves it; a tier that does not exist has
    /// none.
    #[test]
    fn the_excess_is_what_the_tier_holds_above_its_capacity() {
        let Some((mem, _log, _m, _faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
            return;
        };
        assert_eq!(mem.excess_pages(0), 0);
        mem.resize(0, 700).unwrap();
        assert_eq!(mem.excess_pages(0), 1024 - 700);
        assert_eq!(mem.excess_pages(1), 0);
        assert_eq!(mem.excess_pages(7), 0);
    }

    /// The sweep goes on from where the last one stopped (the cursor is
    /// the end of the last 2 MiB range it scanned), not from page 0.
    #[test]
    fn a_sweep_goes_on_from_where_the_last_one_stopped() {
        let Some((mem, _log, _m, _faults)) = setup(2048, 2048, InitialPlacement::FastFirst) else {
            return;
        };
        let first = mem.sweep_victims(0, 10);
        assert_eq!(first, (0..10).map(Unit::page).collect::<Vec<_>>());
        let next = mem.sweep_victims(0, 10);
        assert_eq!(next, (512..522).map(Unit::page).collect::<Vec<_>>());
        // Resumed from a cursor inside a range: from that range's start.
        mem.sweep[0].0.store(1024 + 77, Ordering::Relaxed);
        let mid = mem.sweep_victims(0, 3);
        assert_eq!(mid, (1024..1027).map(Unit::page).collect::<Vec<_>>());
    }

    /// Pages with a valid shadow below are not sweep victims: the shrink's
    /// shadow step remaps them without a copy.
    #[test]
    fn a_sweep_leaves_pages_with_a_shadow_to_the_shadow_step() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let units = |r: std::ops::Range<u64>| r.map(Unit::page).collect::<Vec<_>>();
        m.promote(&units(0..20), Mechanism::TPM).unwrap();
        m.promote(
            &units(20..40),
            Mechanism::Transactional { keep_shadow: false },
        )
        .unwrap();
        assert_eq!(mem.shadowed_pages(0, 100).len(), 20);
        assert_eq!(mem.sweep_victims(0, 10), units(20..30));
        // Nor are parked pages (the parker owns their way back).
        let parked = mem
            .park_pages(&[40, 41], crate::mem::backing::Parker::Sampler)
            .unwrap();
        assert_eq!(parked, [40, 41]);
        mem.sweep[0].0.store(0, Ordering::Relaxed);
        assert_eq!(mem.sweep_victims(0, 3), units(20..23));
        // Asked for more than there is: the 20 pages without a shadow
        // (0..40 are the tier's; 40 and 41 are parked), after one scan.
        assert_eq!(mem.sweep_victims(0, 40), units(20..40));
        // Nor is a page a mover owns.
        assert!(mem.pages.try_acquire(25, false).is_some());
        let busy = mem.sweep_victims(0, 40);
        mem.release_page(25, 0, 0);
        assert_eq!(
            busy,
            units(20..25)
                .into_iter()
                .chain(units(26..40))
                .collect::<Vec<_>>()
        );
    }

    /// With huge pages, a sweep takes a whole 2 MiB range as one unit when
    /// every page of it is the tier's and the budget left holds it; else
    /// the range's pages one by one.
    #[test]
    fn a_sweep_takes_whole_ranges_while_they_fit_the_budget() {
        let Some((mem, _log, m, _faults)) = setup(2048, 2048, InitialPlacement::FastFirst) else {
            return;
        };
        let run = |p: u64| Unit::run(p, CHUNK_SLOTS as u32);
        let pages = |r: std::ops::Range<u64>| r.map(Unit::page).collect::<Vec<_>>();
        let want: Vec<Unit> = [run(0), run(512)]
            .into_iter()
            .chain(pages(1024..1100))
            .collect();
        assert_eq!(mem.sweep_victims(0, 1100), want);
        // A range with one page elsewhere goes page by page, without it.
        m.demote(&[Unit::page(1500)], Mechanism::StopAndCopy)
            .unwrap();
        mem.sweep[0].0.store(1024, Ordering::Relaxed);
        // ... and so does a whole range when less than 512 of the budget is
        // left (1536..2048, after 511 pages).
        let want = [pages(1024..1500), pages(1501..1536), pages(1536..2025)].concat();
        assert!(
            mem.sweep_victims(0, 1000) == want,
            "pages 1024..2025 but 1500"
        );
    }

    /// The shadow step's pages: the tier's pages with a shadow on a slower
    /// tier, up to the number asked, none owned by a mover.
    #[test]
    fn the_shadow_step_finds_the_tiers_shadowed_pages() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let units = |r: std::ops::Range<u64>| r.map(Unit::page).collect::<Vec<_>>();
        m.promote(&units(10..20), Mechanism::TPM).unwrap();
        let found = |want| mem.shadowed_pages(0, want);
        assert_eq!(
            found(4),
            units(10..14)
                .into_iter()
                .map(|u| (1, u))
                .collect::<Vec<_>>()
        );
        assert_eq!(found(100).len(), 10);
        assert!(
            mem.shadowed_pages(1, 100).is_empty(),
            "the slow tier's pages have none"
        );
        assert!(mem.pages.try_acquire(12, false).is_some());
        let busy = found(100);
        mem.release_page(12, 0, 0);
        assert_eq!(busy.len(), 9);
        assert!(busy.iter().all(|(_, u)| u.page != 12));
    }

    /// A shrink of a tier whose pages have shadows below remaps them (no
    /// copy; a page written since its promotion is copied) and needs no
    /// demotion; the report says so.
    #[test]
    fn a_shrink_remaps_shadowed_pages_onto_their_shadows() {
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let units: Vec<Unit> = (0..100).map(Unit::page).collect();
        m.promote(&units, Mechanism::TPM).unwrap();
        for p in 0..5 {
            crate::mem::tests::guest_write(&mem, &log, p, 9);
        }
        mem.resize(0, 60).unwrap();
        let rep = m.shrink_step(0, 1000, None).unwrap();
        assert!(rep.complete, "{rep:?}");
        assert_eq!(
            (rep.shadow_demoted, rep.demoted, rep.shadows_reclaimed),
            (40, 0, 0),
            "{rep:?}"
        );
        assert_eq!((rep.target_pages, rep.used_pages), (60, 60), "{rep:?}");
        assert!((0..5).all(|p| crate::mem::tests::word(&mem, p).load(Ordering::SeqCst) == 9));
        mem.check_consistency().unwrap();
    }

    /// A shrink of a tier that holds shadows drops shadows first, only
    /// while it is above its capacity; its used pages count both.
    #[test]
    fn a_shrink_of_a_tier_that_holds_shadows_drops_them_first() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let units: Vec<Unit> = (0..100).map(Unit::page).collect();
        m.promote(&units, Mechanism::TPM).unwrap();
        let slow = &mem.tiers[1];
        assert_eq!((slow.guest(), slow.shadows()), (924, 100));
        // Exactly full: nothing above the capacity, nothing dropped.
        mem.resize(1, 1024).unwrap();
        let rep = m.shrink_step(1, 1000, None).unwrap();
        assert_eq!(rep.shadows_reclaimed, 0, "{rep:?}");
        assert_eq!(rep.used_pages, 1024, "{rep:?}");
        // 24 above: 24 shadows dropped, and one more for a free page.
        mem.resize(1, 1000).unwrap();
        let rep = m.shrink_step(1, 1000, None).unwrap();
        assert!(rep.complete, "{rep:?}");
        assert_eq!((rep.shadows_reclaimed, rep.demoted), (25, 0), "{rep:?}");
        assert_eq!(rep.used_pages, 924 + 75, "{rep:?}");
        mem.check_consistency().unwrap();
    }

    /// Given the policy's order (coldest first), a shrink demotes the first
    /// of its units that are on the tier, and only as many as the excess.
    #[test]
    fn a_shrink_in_the_policys_order_demotes_its_first_units_on_the_tier() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
            return;
        };
        let units = |r: std::ops::Range<u64>| r.map(Unit::page).collect::<Vec<_>>();
        m.demote(&units(500..510), Mechanism::StopAndCopy).unwrap();
        mem.resize(0, 1004).unwrap();
        let order = [units(500..510), units(700..720)].concat();
        let rep = m.shrink_step(0, 1000, Some(&order)).unwrap();
        assert!(rep.complete, "{rep:?}");
        assert_eq!(rep.demoted, 10, "{rep:?}");
        assert!((700..710).all(|p| mem.tier_of(p) == Some(1)));
        assert!((710..720).all(|p| mem.tier_of(p) == Some(0)));
    }

    /// A shrink in the policy's order whose first victim is busy (owned by
    /// the test) moves the others of the round and tries the busy one again
    /// in the next round (here it was let go meanwhile); one whose victims
    /// are all busy gives up after a round that moved nothing, instead of
    /// retrying them for its whole budget.
    #[test]
    fn a_shrink_in_order_retries_a_busy_victim_and_stops_when_none_moves() {
        use crate::test_point::{with_action, TestPoint};
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
            return;
        };
        let units = |r: std::ops::Range<u64>| r.map(Unit::page).collect::<Vec<_>>();
        assert!(mem.pages.try_acquire(700, false).is_some());
        mem.resize(0, 1022).unwrap();
        // Page 700 is let go during the first round's copy of page 701.
        let (mm, once) = (mem.clone(), Arc::new(std::sync::Once::new()));
        let rep = with_action(
            move |point| {
                if point == TestPoint::TpmCopied {
                    once.call_once(|| mm.release_page(700, 0, 0));
                }
            },
            || m.shrink_step(0, 1000, Some(&units(700..703))),
        )
        .unwrap();
        assert!(rep.complete, "{rep:?}");
        assert_eq!(rep.demoted, 2, "{rep:?}");
        let tiers: Vec<_> = (700..703).map(|p| mem.tier_of(p)).collect();
        assert_eq!(tiers, [Some(1), Some(1), Some(0)]);
        // Only a busy page in the order: one round, one skip.
        assert!(mem.pages.try_acquire(702, false).is_some());
        mem.resize(0, 1020).unwrap();
        let skipped = mem.stats().migration.skipped_busy;
        let rep = m.shrink_step(0, 1000, Some(&units(702..703))).unwrap();
        assert!(!rep.complete, "{rep:?}");
        assert_eq!(rep.demoted, 0, "{rep:?}");
        assert_eq!(mem.stats().migration.skipped_busy, skipped + 1);
        mem.release_page(702, 0, 0);
        mem.check_consistency().unwrap();
    }

    /// A victim written during its TPM copy aborts; the shrink moves it by
    /// stop-and-copy in the same step and counts it with the others.
    #[test]
    fn a_shrink_moves_a_victim_written_during_its_copy_by_stop_and_copy() {
        use crate::test_point::{with_action, TestPoint};
        let Some((mem, log, m, _faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
            return;
        };
        mem.resize(0, 1014).unwrap();
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (mm, lg, f) = (mem.clone(), log.clone(), fired.clone());
        let order: Vec<Unit> = (300..310).map(Unit::page).collect();
        let rep = with_action(
            move |point| {
                if point == TestPoint::TpmCopied && !f.swap(true, Ordering::SeqCst) {
                    crate::mem::tests::guest_write(&mm, &lg, 303, 77);
                }
            },
            || m.shrink_step(0, 1000, Some(&order)),
        )
        .unwrap();
        assert!(fired.load(Ordering::SeqCst));
        assert!(rep.complete, "{rep:?}");
        assert_eq!(rep.demoted, 10, "{rep:?}");
        assert!((300..310).all(|p| mem.tier_of(p) == Some(1)));
        // By stop-and-copy in this round, not by TPM again in the next.
        assert_eq!(mem.stats().migration.stop_copy, 1);
        assert_eq!(
            crate::mem::tests::word(&mem, 303).load(Ordering::SeqCst),
            77
        );
        mem.check_consistency().unwrap();
    }

    fn pages_on(mem: &TieredMemory, tier: TierId) -> Vec<usize> {
        (0..mem.guest_pages())
            .filter(|&p| mem.tier_of(p) == Some(tier))
            .collect()
    }

    /// A shrink demotes to the first slower tier with room: past a full
    /// next tier to the one after it.
    #[test]
    fn a_shrink_demotes_past_a_full_tier_to_one_with_room() {
        let Some((mem, _log, m, _faults)) = setup_three_tiers() else {
            return;
        };
        mem.resize(1, 32).unwrap(); // tier 1 full
        mem.resize(0, 24).unwrap(); // 8 above
        let rep = m.shrink_step(0, 1000, None).unwrap();
        assert!(rep.complete, "{rep:?}");
        assert_eq!(rep.demoted, 8, "{rep:?}");
        assert_eq!(
            (
                pages_on(&mem, 0).len(),
                pages_on(&mem, 1).len(),
                pages_on(&mem, 2).len()
            ),
            (24, 32, 40)
        );
        mem.check_consistency().unwrap();
    }

    /// When no slower tier has room, a shrink reclaims a slower tier's
    /// shadows (here of pages promoted from it) to make some.
    #[test]
    fn a_shrink_makes_room_below_by_reclaiming_shadows() {
        let Some((mem, _log, m, _faults)) = setup_three_tiers() else {
            return;
        };
        let from_2: Vec<Unit> = pages_on(&mem, 2)[..16]
            .iter()
            .map(|&p| Unit::page(p as u64))
            .collect();
        m.promote(&from_2, Mechanism::TPM).unwrap();
        assert_eq!((mem.tiers[2].guest(), mem.tiers[2].shadows()), (16, 16));
        mem.resize(2, 32).unwrap(); // tier 2 full, half of it shadows
        mem.resize(1, 24).unwrap(); // 8 above
        let rep = m.shrink_step(1, 1000, None).unwrap();
        assert!(rep.complete, "{rep:?}");
        assert_eq!(rep.demoted, 8, "{rep:?}");
        assert_eq!((mem.tiers[2].guest(), mem.tiers[2].shadows()), (24, 8));
        mem.check_consistency().unwrap();
    }

    /// A driver's settings: tier 0 set to 600 pages at `at`, a step every
    /// 5 ms.
    fn fast_tier_to_600_pages_at(at: std::time::Duration) -> ResizeConfig {
        ResizeConfig {
            schedules: vec![(0, vec![CapacityStep { at, pages: 600 }])],
            period: std::time::Duration::from_millis(5),
            ..ResizeConfig::default()
        }
    }

    /// The resize driver applies a scheduled shrink and steps it until the
    /// tier holds no more than its new capacity.
    #[test]
    fn the_resize_driver_applies_a_schedule_and_converges() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
            return;
        };
        let cfg = fast_tier_to_600_pages_at(std::time::Duration::ZERO);
        let d = ResizeDriver::spawn(m.clone(), cfg).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (mem.capacity(0) != 600 || mem.excess_pages(0) > 0)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A change asked through a handle is applied at once and reported.
        let h = d.handle(mem.clone());
        assert_eq!(h.set_capacity(0, 900).unwrap(), 900);
        while h.report().applied.len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            h.report().applied.last().map(|a| (a.1, a.2)),
            Some((0, 900))
        );
        assert!(
            h.set_capacity(0, 1 << 30).is_err(),
            "above the tier's maximum"
        );
        let rep = d.stop();
        assert_eq!(mem.capacity(0), 900, "{rep:?}");
        assert_eq!(mem.excess_pages(0), 0, "{rep:?}");
        assert!(rep.steps > 0 && rep.demoted >= 1024 - 600, "{rep:?}");
        assert_eq!(rep.applied.len(), 2, "{rep:?}");
        mem.check_consistency().unwrap();
    }

    /// `--fast-schedule`'s parser: sizes to pages, times in order (equal
    /// times allowed), blanks and empty parts skipped, and each error.
    #[test]
    fn capacity_schedules_parse_to_pages_in_time_order() {
        use std::time::Duration as D;
        let steps = |s: &str| {
            parse_capacity_schedule(s)
                .map(|v| v.iter().map(|c| (c.pages, c.at)).collect::<Vec<_>>())
        };
        assert_eq!(
            steps(" 256M@0s, ,32M@5s,32K@5s,"),
            Ok(vec![
                (65536, D::ZERO),
                (8192, D::from_secs(5)),
                (8, D::from_secs(5))
            ])
        );
        use CapacityScheduleError as E;
        assert_eq!(steps("256M"), Err(E::NotSizeAtTime("256M".into())));
        assert!(matches!(steps("lots@0s"), Err(E::BadSize { .. })));
        assert!(matches!(steps("6000@0s"), Err(E::SizeNotPages { .. })));
        assert!(matches!(steps("4M@soon"), Err(E::BadTime { .. })));
        assert_eq!(
            steps("4M@2s,8M@1s"),
            Err(E::TimesDecrease("4M@2s,8M@1s".into()))
        );
        assert_eq!(steps(" , "), Err(E::Empty));
    }

    /// The resize driver's report adds up its steps: pages demoted by copy
    /// and by remapping their shadows, shadows dropped, pages given back.
    #[test]
    fn the_resize_drivers_report_adds_up_its_steps() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        let units: Vec<Unit> = (0..100).map(Unit::page).collect();
        m.promote(&units, Mechanism::TPM).unwrap();
        let run = |tier: TierId, pages: usize| {
            let d = ResizeDriver::spawn(
                m.clone(),
                ResizeConfig {
                    schedules: vec![(
                        tier,
                        vec![CapacityStep {
                            at: std::time::Duration::ZERO,
                            pages,
                        }],
                    )],
                    period: std::time::Duration::from_millis(5),
                    ..ResizeConfig::default()
                },
            )
            .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while (mem.capacity(tier) != pages || mem.excess_pages(tier) > 0)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            d.stop()
        };
        // The fast tier to 40 pages: 60 of its 100 pages go back onto their
        // shadows (no copy).
        let rep = run(0, 40);
        assert_eq!((rep.demoted, rep.shadows_reclaimed), (60, 0), "{rep:?}");
        assert_eq!(rep.returned_pages, 60, "{rep:?}");
        // The slow tier (984 guest pages, 40 shadows) to 1000: 24 shadows
        // go for the excess, and one more for a free page.
        let rep = run(1, 1000);
        assert_eq!(rep.demoted, 0, "{rep:?}");
        assert_eq!(rep.shadows_reclaimed, 25, "{rep:?}");
        assert_eq!(rep.returned_pages, 24, "{rep:?}");
        mem.check_consistency().unwrap();
    }

    /// The resize driver also puts split huge pages back together: a range
    /// split by a 4 KiB move and whole on one tier again is collapsed by the
    /// driver alone (its first scan notes the range, the next, 100 ms on,
    /// collapses it).
    #[test]
    fn the_resize_driver_collapses_a_range_whole_on_one_tier_again() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
            return;
        };
        m.promote(&[Unit::page(7)], Mechanism::StopAndCopy).unwrap();
        m.demote(&[Unit::page(7)], Mechanism::StopAndCopy).unwrap();
        assert_eq!(mem.stats().backing.splits, 1);
        let d = ResizeDriver::spawn(
            m.clone(),
            ResizeConfig {
                period: std::time::Duration::from_millis(5),
                ..ResizeConfig::default()
            },
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mem.stats().backing.collapses == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let rep = d.stop();
        assert_eq!(
            mem.stats().backing.collapses,
            1,
            "not collapsed by the driver within 10 s: {rep:?}"
        );
        mem.check_consistency().unwrap();
    }

    /// A resize driver dropped without `stop` stops too: a step scheduled
    /// after the drop is never applied.
    #[test]
    fn a_dropped_resize_driver_stops() {
        let Some((mem, _log, m, _faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
            return;
        };
        let cfg = fast_tier_to_600_pages_at(std::time::Duration::from_millis(300));
        drop(ResizeDriver::spawn(m.clone(), cfg).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert_eq!(mem.capacity(0), 1024);
    }
}
