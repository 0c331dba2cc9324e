//! Hint-fault access sampler: parks a window of guest pages (zero-copy
//! `UFFDIO_MOVE` to the parking area), lets the fault handler record the
//! touches, and unparks the rest at the next period. Scan size and period
//! work like Linux NUMA balancing (`numa_balancing_scan_size_mb`,
//! `scan_period_*`), and an overhead budget (MTM-style: a maximum share of
//! vCPU time spent in hint faults) sizes the scan windows.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::backing::{lock, Parker, TieredMemory};
use super::pool::CHUNK_SLOTS;

/// What one hint fault costs the guest, relative to the stall the fault
/// handler observes (event read to wake-up). The handler does not see the
/// vCPU's exit, the userfault delivery, the re-entry and the refill of the
/// shadow/EPT entry. Measured on the development host (PVM, 2 cores) with
/// `tiervm run ... --tracking hint-faults --tracking-ab 1s`, which switches
/// sampling on and off within one run: the guest lost about 65 us per hint
/// fault while the handler saw about 8.5 us, a factor of 7.5. Measured again
/// on 2026-11-28 (zipf 768M over a 256M fast tier, a busy host): about 240 us
/// lost per hint fault against 28 us seen, a factor of 8.6. The vCPUs' blocked
/// time (the guest clock) sees no more than the handler does: the rest is
/// spent running (the exit, the userfault delivery, the shadow MMU's
/// refault), so only an on/off comparison of the guest's progress finds it.
/// A run with `--tracking-ab` measures its own factor and the sampler uses
/// that ([`TieredMemory::set_guest_cost_factor`]).
pub const GUEST_COST_FACTOR: f64 = 7.5;
/// The factors a run may measure for itself: at least the stall the handler
/// sees, at most 100x it (a measurement outside is noise, clamped).
pub const GUEST_COST_FACTOR_RANGE: (f64, f64) = (1.0, 100.0);
/// Assumed guest cost of one hint fault before anything was measured (the
/// platform notes measured about 100 us on this host); sizes the first window.
pub const ASSUMED_HINT_FAULT_NS: f64 = 100_000.0;

/// Sampler settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// Pages parked per period at first (Linux scans 256 MiB = 65536 pages).
    pub scan_pages: usize,
    /// Lower bound of the adapted scan size.
    pub min_scan_pages: usize,
    /// Upper bound of the adapted scan size.
    pub max_scan_pages: usize,
    /// Time between windows (Linux: 1 s minimum scan period).
    pub period: Duration,
    /// Maximum share of vCPU time spent in hint faults, percent.
    pub budget_pct: f64,
    /// vCPUs of the guest (the budget is a share of their time).
    pub vcpus: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            scan_pages: 65536,
            min_scan_pages: 64,
            max_scan_pages: 262_144,
            period: Duration::from_secs(1),
            budget_pct: 2.0,
            vcpus: 1,
        }
    }
}

/// What the hint-fault sampler has seen, for the host's estimate of the
/// guest's access rate (`tiering::engine::profile::access_rate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplerAccount {
    /// Guest pages (one pass of the sampler covers them all).
    pub guest_pages: u64,
    /// Pages the sampler's windows covered, all passes.
    pub scanned_pages: u64,
    /// Sum over guest pages of the weight of the page's latest hint fault
    /// in a sampler window ([`SampledWeights`]).
    pub weight: u64,
    /// The same weights squared, summed.
    pub weight_sq: u64,
}

/// The weight (`engine::profile::hint_weight`: about `1 s / time to
/// fault`) of every guest page's latest hint fault in a sampler window (0:
/// scanned and not touched in its window, or not scanned yet), and their
/// sums: a census of the guest's accesses with one sample per page, which
/// the sampler renews a window at a time. Accessed-bit probes are left
/// out: they park pages a policy picked.
#[derive(Debug)]
pub(crate) struct SampledWeights {
    last: Box<[AtomicU16]>,
    sum: AtomicU64,
    sum_sq: AtomicU64,
}

impl SampledWeights {
    /// A census of `pages` pages, none sampled.
    pub(crate) fn new(pages: usize) -> io::Result<Self> {
        Ok(Self {
            last: crate::sys::zeroed_atomics(pages)?,
            sum: AtomicU64::new(0),
            sum_sq: AtomicU64::new(0),
        })
    }

    /// The sampler parks `page` again: its old sample leaves the census.
    pub(crate) fn rescan(&self, page: usize) {
        if let Some(c) = self.last.get(page) {
            let old = u64::from(c.swap(0, Ordering::Relaxed));
            // Subtracts only what a `record` added before its swap: the
            // sums never go below the census, even in a race.
            self.sum.fetch_sub(old, Ordering::Relaxed);
            self.sum_sq.fetch_sub(old * old, Ordering::Relaxed);
        }
    }

    /// A hint fault of a sampler window on `page`, weighing `weight`.
    pub(crate) fn record(&self, page: usize, weight: u16) {
        if let Some(c) = self.last.get(page) {
            let w = u64::from(weight);
            self.sum.fetch_add(w, Ordering::Relaxed);
            self.sum_sq.fetch_add(w * w, Ordering::Relaxed);
            let old = u64::from(c.swap(weight, Ordering::Relaxed));
            self.sum.fetch_sub(old, Ordering::Relaxed);
            self.sum_sq.fetch_sub(old * old, Ordering::Relaxed);
        }
    }

    /// The sums of the weights and of their squares.
    pub(crate) fn sums(&self) -> (u64, u64) {
        (
            self.sum.load(Ordering::Relaxed),
            self.sum_sq.load(Ordering::Relaxed),
        )
    }
}

/// What one sampler period did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplerTick {
    /// Pages parked for the new window.
    pub parked: usize,
    /// Pages of the previous window that were never touched (unparked).
    pub untouched: usize,
    /// Hint-fault overhead measured over the previous period, percent.
    pub overhead_pct: f64,
    /// Scan size for the next window.
    pub scan_pages: usize,
}

/// The sampler state (drive it with [`tick`](HintSampler::tick) or
/// [`spawn`](HintSampler::spawn)).
#[derive(Debug)]
pub struct HintSampler {
    mem: Arc<TieredMemory>,
    cfg: SamplerConfig,
    cursor: usize,
    scan_pages: usize,
    window: Vec<usize>,
    last_tick: Instant,
    last_hint_ns: u64,
    /// (vCPU blocked ns, faults served, hint faults) at the last tick.
    last_guest: Option<(u64, u64, u64)>,
}

impl HintSampler {
    /// A sampler over `mem`.
    pub fn new(mem: Arc<TieredMemory>, cfg: SamplerConfig) -> Self {
        // Start from what the budget affords if every parked page faulted
        // once, and let the measurement grow it from there.
        let affordable =
            cfg.budget_pct / 100.0 * cfg.period.as_nanos() as f64 * cfg.vcpus.max(1) as f64
                / ASSUMED_HINT_FAULT_NS;
        let scan_pages = cfg
            .scan_pages
            .min(affordable.max(1.0) as usize)
            .clamp(cfg.min_scan_pages.max(1), cfg.max_scan_pages.max(1));
        let last_hint_ns = mem.counters.hint_stall_ns.load(Ordering::Relaxed);
        Self {
            mem,
            cfg,
            cursor: 0,
            scan_pages,
            window: Vec::new(),
            last_tick: Instant::now(),
            last_hint_ns,
            last_guest: None,
        }
    }

    /// Current scan size in pages.
    pub fn scan_pages(&self) -> usize {
        self.scan_pages
    }

    /// Unparks every page still parked by this sampler (pages busy right
    /// now are retried for a bounded time, then left to the fault handler).
    pub fn unpark_all(&mut self) -> io::Result<usize> {
        let window = std::mem::take(&mut self.window);
        self.mem.unpark_pages_settled(&window, Parker::Sampler)
    }

    /// One period: unpark the previous window's untouched pages, measure the
    /// overhead and adapt the scan size, park the next window.
    pub fn tick(&mut self) -> io::Result<SamplerTick> {
        let mem = self.mem.clone();
        let _doing = mem.activities.begin(format!(
            "unparking and parking a window of up to {} pages",
            self.scan_pages
        ));
        let had_window = !self.window.is_empty();
        let untouched = self.unpark_all()?;
        let overhead_pct = self.measure_overhead(&mem);
        if had_window {
            self.adapt_scan_pages(overhead_pct);
        } // else nothing was sampled over the last period: keep the scan size.
        let parked = self.park_window(&mem)?;
        Ok(SamplerTick {
            parked,
            untouched,
            overhead_pct,
            scan_pages: self.scan_pages,
        })
    }

    /// The hint faults' cost to the guest since the last tick, percent of
    /// vCPU time: the hint stall the handler saw times the guest cost factor
    /// ([`TieredMemory::guest_cost_factor`]), or the vCPUs' blocked time in
    /// faults by the hint faults' share (the guest clock) if that is more
    /// (it also sees waits on busy pages). Published to `mem` (this
    /// sampler's memory).
    fn measure_overhead(&mut self, mem: &TieredMemory) -> f64 {
        let now = Instant::now();
        let hint_ns = mem.counters.hint_stall_ns.load(Ordering::Relaxed);
        let wall_ns = now.duration_since(self.last_tick).as_nanos().max(1) as f64;
        let vcpu_ns = wall_ns * self.cfg.vcpus.max(1) as f64;
        let stall_ns = hint_ns.saturating_sub(self.last_hint_ns) as f64;
        let estimated = mem.guest_cost_factor() * stall_ns / vcpu_ns * 100.0;
        let overhead_pct = self
            .measured_overhead_pct(vcpu_ns)
            .map_or(estimated, |blocked| blocked.max(estimated));
        self.last_tick = now;
        self.last_hint_ns = hint_ns;
        mem.set_overhead_pct(overhead_pct);
        overhead_pct
    }

    /// Proportional control of the scan size towards the budget, at most
    /// 4x down or up per period (the first window was sized pessimistically).
    fn adapt_scan_pages(&mut self, overhead_pct: f64) {
        let ratio = if overhead_pct > 0.0 {
            self.cfg.budget_pct / overhead_pct
        } else {
            4.0
        };
        let next = (self.scan_pages as f64 * ratio.clamp(0.25, 4.0)).round() as usize;
        self.scan_pages = next.clamp(
            self.cfg.min_scan_pages.max(1),
            self.cfg.max_scan_pages.max(1),
        );
    }

    /// Parks the next window of `mem` (this sampler's memory), up to
    /// `scan_pages` pages from the cursor:
    /// runs of pages we own move with one range move. Returns the pages
    /// parked.
    fn park_window(&mut self, mem: &TieredMemory) -> io::Result<usize> {
        *lock(&mem.park_epoch) = Instant::now();
        let n = mem.guest_pages();
        let mut want = self.scan_pages.min(n);
        // A window never ends inside a huge page: parked whole, it is mapped
        // back whole on its first touch (one hint fault, the huge page
        // kept), where a window ending inside it would split it.
        let end = self.cursor + want;
        if want > 0 && end < n {
            if let Some(first) = mem.huge_range_of(end - 1) {
                want = (first + CHUNK_SLOTS).min(n) - self.cursor;
            }
        }
        let mut parked = 0;
        let mut scanned = 0;
        while scanned < want {
            let start = self.cursor;
            let mut run = Vec::new();
            while scanned < want && self.cursor < n {
                let p = self.cursor;
                self.cursor += 1;
                scanned += 1;
                run.push(p);
            }
            if self.cursor >= n {
                self.cursor = 0;
                mem.counters.scan_cycles.fetch_add(1, Ordering::Relaxed);
            }
            for &p in &run {
                mem.sampled_weights.rescan(p);
            }
            let got = match mem.park_pages(&run, Parker::Sampler) {
                Ok(got) => got,
                Err(e) => {
                    // A page that could not be moved back stays parked (the
                    // fault handler maps it back on a touch): keep the run
                    // in the window, so the next unpark maps it back if the
                    // guest never touches it (unparking skips pages the
                    // sampler does not hold parked). Seen in a 10-minute
                    // serve soak: UFFDIO_MOVE EBUSY left a page parked to
                    // the end of the run. EBUSY alone no longer gets here:
                    // `park_pages` retries busy pages (bounded) and skips
                    // those that stay busy (they are in guest RAM).
                    self.window.extend(run);
                    return Err(e);
                }
            };
            parked += got.len();
            self.window.extend(got);
            // Every page of the run was looked at: parked, or skipped as
            // never touched (no access to sample) or busy.
            mem.counters
                .scanned_pages
                .fetch_add(run.len() as u64, Ordering::Relaxed);
            if start == self.cursor {
                break;
            }
        }
        Ok(parked)
    }

    /// The guest's measured cost of hint faults since the last tick, percent
    /// of vCPU time: the vCPUs' blocked time (the VMM's guest clock) times
    /// the hint faults' share of the faults the handler served (blocked
    /// time is not labelled by cause; faults of other kinds, first touches
    /// and pages in flight, take their share by count). `None` without a
    /// guest clock, or on the first tick.
    fn measured_overhead_pct(&mut self, vcpu_ns: f64) -> Option<f64> {
        let c = &self.mem.counters;
        let now = (
            self.mem.guest_blocked_ns()?,
            c.faults_served.load(Ordering::Relaxed),
            c.hint_faults.load(Ordering::Relaxed),
        );
        let (b0, f0, h0) = self.last_guest.replace(now)?;
        let (db, df, dh) = (
            now.0.saturating_sub(b0),
            now.1.saturating_sub(f0),
            now.2.saturating_sub(h0),
        );
        let share = if df == 0 {
            0.0
        } else {
            dh.min(df) as f64 / df as f64
        };
        Some(db as f64 * share / vcpu_ns * 100.0)
    }

    /// Runs `tick` every period on its own thread until stopped.
    pub fn spawn(mut self) -> io::Result<SamplerHandle> {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let (s, p) = (stop.clone(), paused.clone());
        let join = std::thread::Builder::new()
            .name("tiervm-sampler".into())
            .spawn(move || {
                crate::threads::started(crate::threads::ThreadRole::Sampler);
                let paused = |mem: &TieredMemory| p.load(Ordering::Relaxed) || mem.sampling_held();
                while !s.load(Ordering::Relaxed) {
                    if paused(&self.mem) {
                        // Paused (A/B) or held (the policy needs no
                        // samples): nothing parked, nothing sampled.
                        if !self.window.is_empty() {
                            if let Err(e) = self.unpark_all() {
                                tracing::error!("hint sampler: {e}");
                            }
                        }
                        self.last_tick = Instant::now();
                        self.last_hint_ns = self.mem.counters.hint_stall_ns.load(Ordering::Relaxed);
                    } else if let Err(e) = self.tick() {
                        tracing::error!("hint sampler: {e}");
                    }
                    let until = Instant::now() + self.cfg.period;
                    let was_paused = paused(&self.mem);
                    while !s.load(Ordering::Relaxed)
                        && Instant::now() < until
                        && paused(&self.mem) == was_paused
                    {
                        std::thread::sleep(Duration::from_millis(5).min(self.cfg.period));
                    }
                }
                let _ = self.unpark_all();
                self
            })?;
        Ok(SamplerHandle {
            stop,
            paused,
            join: Some(join),
        })
    }
}

/// A running sampler thread.
#[derive(Debug)]
pub struct SamplerHandle {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    join: Option<JoinHandle<HintSampler>>,
}

impl SamplerHandle {
    /// Pauses (unparks everything and stops sampling) or resumes the sampler
    /// at its next period.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Stops the thread (unparking every page) and returns the sampler.
    pub fn stop(mut self) -> io::Result<HintSampler> {
        self.stop.store(true, Ordering::Relaxed);
        self.join
            .take()
            .ok_or_else(|| io::Error::other("sampler already stopped"))?
            .join()
            .map_err(|_| io::Error::other("sampler thread panicked"))
    }
}

impl Drop for SamplerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_census_holds_each_pages_latest_weight() {
        let c = SampledWeights::new(4).unwrap();
        c.record(1, 100);
        c.record(2, 3);
        assert_eq!(c.sums(), (103, 10_009));
        // Faulted again in a later window: the new weight replaces the old.
        c.record(1, 10);
        assert_eq!(c.sums(), (13, 109));
        // Scanned again and not touched: it leaves the census.
        c.rescan(2);
        c.rescan(3);
        assert_eq!(c.sums(), (10, 100));
        // Out-of-range pages are ignored.
        c.record(9, 1000);
        c.rescan(9);
        assert_eq!(c.sums(), (10, 100));
    }
}
