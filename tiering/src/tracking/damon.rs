//! DAMON access tracking (`--tracking damon`).
//!
//! DAMON (Data Access MONitor, `mm/damon`) splits a monitored address range
//! into adaptive regions and, every sampling interval, checks one random
//! address per region: it clears the page's accessed bits and, one interval
//! later, tests them. For a process's virtual addresses the test covers the
//! host PTE *and* every secondary MMU attached to the process through MMU
//! notifiers (`mmu_notifier_clear_young` / `mmu_notifier_test_young`), so
//! for guest RAM it reads the accessed bits KVM's EPT/NPT entries collect
//! while the guest runs. Each aggregation interval it reports, per region,
//! `nr_accesses`: how many samples found the region accessed. No guest page
//! is unmapped and the guest takes no fault; the cost is the kernel thread
//! (kdamond) and our reader thread (both reported).
//!
//! # What the engine gets
//!
//! - Accessed bits ([`DamonTracker::merge_accessed_into`]): every page of a
//!   region with `nr_accesses > 0` in a snapshot since the last merge.
//!   Region-granular: DAMON assumes a region's pages are accessed alike and
//!   refines regions where they are not (split/merge between
//!   [`DamonConfig::min_regions`] and [`DamonConfig::max_regions`]).
//! - Access samples ([`DamonTracker::drain_sample_pages`]), for sample-based
//!   policies (Memtis): each positive DAMON check is one sampled access, to a
//!   page drawn uniformly from its region (DAMON checked one random address
//!   there and does not say which page).
//!
//! # The sysfs protocol (Linux 6.12, `Documentation/admin-guide/mm/damon/usage.rst`)
//!
//! 1. `kdamonds/nr_kdamonds` = 1 creates kdamond 0 (only when it was 0).
//! 2. `contexts/nr_contexts` = 1; `operations` = `fvaddr` (fixed virtual
//!    address ranges: `vaddr` would re-derive the regions from all of the
//!    process's mappings every update interval).
//! 3. Intervals (`sample_us`, `aggr_us`) and `nr_regions/{min,max}`.
//! 4. One target: `pid_target` = this process, one region = guest RAM.
//! 5. One scheme with action `stat` (does nothing but count) and an access
//!    pattern that matches every region (the defaults match none).
//! 6. `state` = `on`.
//! 7. Reader loop: `state` = `update_schemes_tried_regions` (the kernel
//!    fills `schemes/0/tried_regions/N/{start,end,nr_accesses,age}` at the
//!    scheme's next application, one aggregation interval later, and the
//!    write returns then), read the regions, repeat.
//! 8. Stop: `state` = `off`, `nr_kdamonds` = 0.
//!
//! # Never on someone else's DAMON
//!
//! DAMON's sysfs state is machine-wide. [`DamonTracker::start`] writes it
//! only when the caller passes `allowed` (tiervm: `--tracking damon` *and*
//! [`ALLOW_ENV`]`=1`) *and* no kdamond exists (`nr_kdamonds` reads 0: nobody
//! else is using DAMON); it then owns kdamond 0 and removes it when it stops
//! (also on drop). [`probe`] only reads. A crash of the VMM leaves kdamond 0
//! behind; it stops by itself when its target process is gone, and
//! `echo 0 > .../kdamonds/nr_kdamonds` removes it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{bounded, Receiver, RecvTimeoutError};
use serde::Serialize;

use crate::vocab::PAGE_SIZE;

/// DAMON's sysfs interface.
pub const SYSFS_ROOT: &str = "/sys/kernel/mm/damon/admin";
/// The opt-in: `--tracking damon` writes DAMON sysfs only when this is `1`.
pub const ALLOW_ENV: &str = "TIERVM_ALLOW_DAMON_WRITES";
/// `/proc/*/stat` CPU times are in USER_HZ ticks: 100 on every x86-64
/// Linux (the ABI value, independent of the kernel's HZ).
const USER_HZ: f64 = 100.0;
/// Snapshots kept in the report's timeline (then only counted).
pub const MAX_TIMELINE: usize = 2048;
/// Accessed page ranges kept per timeline snapshot.
pub const MAX_RANGES: usize = 64;
/// Samples kept between two drains (a policy that never drains them, like
/// mtm, must not grow memory without bound).
pub const MAX_PENDING_SAMPLES: usize = 1 << 20;
/// How long stopping waits for the reader thread (it is at most one
/// update request, about two aggregation intervals, from noticing).
const STOP_BOUND: Duration = Duration::from_secs(10);
/// How long stopping first waits for the reader's request to finish.
const READER_QUIET_BOUND: Duration = Duration::from_secs(3);
/// Retries of a sysfs write that failed with EBUSY, and the pause between.
const BUSY_RETRIES: u32 = 250;
const BUSY_PAUSE: Duration = Duration::from_millis(20);
/// Consecutive failed update requests after which the reader gives up.
const MAX_CONSECUTIVE_ERRORS: u32 = 20;

/// Monitoring settings. The defaults are DAMON's own (usage.rst: 5 ms
/// sampling, 100 ms aggregation, 10..1000 regions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DamonConfig {
    /// DAMON's sysfs root ([`SYSFS_ROOT`]; tests point it at a scratch
    /// tree, which is nobody's machine-wide state and needs no opt-in).
    pub sysfs_root: PathBuf,
    /// Sampling interval, us: one accessed-bit check per region per interval.
    pub sample_us: u64,
    /// Aggregation interval, us: `nr_accesses` counts the checks of one.
    pub aggr_us: u64,
    /// Fewest regions DAMON keeps.
    pub min_regions: u32,
    /// Most regions DAMON keeps (the resolution: guest RAM / max_regions).
    pub max_regions: u32,
}

impl Default for DamonConfig {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from(SYSFS_ROOT),
            sample_us: 5_000,
            aggr_us: 100_000,
            min_regions: 10,
            max_regions: 1000,
        }
    }
}

/// Why the tracker cannot start (each names the fix).
#[derive(Debug, thiserror::Error)]
pub enum DamonError {
    /// No sysfs interface.
    #[error("DAMON's sysfs interface is absent ({0} does not exist: kernel built without CONFIG_DAMON_SYSFS): use --tracking hint-faults")]
    Absent(String),
    /// Someone else's kdamonds exist.
    #[error("DAMON is in use on this host ({kdamonds} kdamond(s) configured, {running} running): tiervm never changes another user's DAMON state; use --tracking hint-faults, or remove those kdamonds first")]
    InUse {
        /// `nr_kdamonds`.
        kdamonds: u32,
        /// Of which `state` reads `on`.
        running: u32,
    },
    /// No opt-in.
    #[error("--tracking damon writes DAMON's machine-wide sysfs state ({SYSFS_ROOT}): set {ALLOW_ENV}=1 to confirm DAMON on this host is yours to use (a dedicated or test host), or use --tracking hint-faults")]
    NotAllowed,
    /// A sysfs file could not be read or written.
    #[error("DAMON sysfs {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer was not what the protocol expects.
    #[error("DAMON: {0}")]
    Protocol(String),
}

/// DAMON on this host, as [`probe`] finds it (read-only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DamonStatus {
    /// No sysfs interface.
    Absent,
    /// kdamonds exist: someone else's DAMON (tiervm will not touch it).
    InUse {
        /// `nr_kdamonds`.
        kdamonds: u32,
        /// Of which running.
        running: u32,
    },
    /// Present, no kdamond: usable with the opt-in.
    Idle,
    /// The files could not be read.
    Unreadable {
        /// Why.
        error: String,
    },
}

/// Whether the environment opts in to DAMON sysfs writes ([`ALLOW_ENV`]`=1`).
pub fn allowed_by_env() -> bool {
    std::env::var(ALLOW_ENV).is_ok_and(|v| v == "1")
}

/// Whether `root` is this machine's DAMON sysfs interface ([`SYSFS_ROOT`],
/// however spelled): writing it needs the opt-in.
pub fn is_machine_damon(root: &Path) -> bool {
    let machine = Path::new(SYSFS_ROOT);
    match (std::fs::canonicalize(root), std::fs::canonicalize(machine)) {
        (Ok(a), Ok(b)) => a == b,
        _ => root.components().eq(machine.components()),
    }
}

/// Reads DAMON's state under `root` (normally [`SYSFS_ROOT`]); writes nothing.
pub fn probe(root: &Path) -> DamonStatus {
    let fs = Sysfs::new(root);
    if !root.is_dir() {
        return DamonStatus::Absent;
    }
    let n = match fs.read_u64("kdamonds/nr_kdamonds") {
        Ok(n) => n as u32,
        Err(e) => {
            return DamonStatus::Unreadable {
                error: e.to_string(),
            }
        }
    };
    if n == 0 {
        return DamonStatus::Idle;
    }
    let running = (0..n)
        .filter(|i| {
            fs.read(&format!("kdamonds/{i}/state"))
                .is_ok_and(|s| s.trim() == "on")
        })
        .count() as u32;
    DamonStatus::InUse {
        kdamonds: n,
        running,
    }
}

/// Whether [`DamonTracker::start`] may write DAMON sysfs under `root`:
/// `Ok` only if `allowed`, the interface exists and no kdamond does.
pub fn check_can_start(root: &Path, allowed: bool) -> Result<(), DamonError> {
    match probe(root) {
        DamonStatus::Absent => Err(DamonError::Absent(root.display().to_string())),
        DamonStatus::InUse { kdamonds, running } => Err(DamonError::InUse { kdamonds, running }),
        DamonStatus::Unreadable { error } => Err(DamonError::Protocol(format!(
            "cannot read {}/kdamonds/nr_kdamonds: {error}",
            root.display()
        ))),
        DamonStatus::Idle if !allowed => Err(DamonError::NotAllowed),
        DamonStatus::Idle => Ok(()),
    }
}

/// Reads and writes files under the DAMON sysfs root.
#[derive(Clone, Debug)]
struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn io(&self, rel: &str, source: io::Error) -> DamonError {
        DamonError::Io {
            path: self.path(rel).display().to_string(),
            source,
        }
    }

    fn read(&self, rel: &str) -> Result<String, DamonError> {
        std::fs::read_to_string(self.path(rel)).map_err(|e| self.io(rel, e))
    }

    fn read_u64(&self, rel: &str) -> Result<u64, DamonError> {
        let s = self.read(rel)?;
        s.trim().parse().map_err(|_| {
            DamonError::Protocol(format!(
                "{} holds '{}', not a number",
                self.path(rel).display(),
                s.trim()
            ))
        })
    }

    fn write(&self, rel: &str, value: &str) -> Result<(), DamonError> {
        std::fs::write(self.path(rel), value).map_err(|e| self.io(rel, e))
    }
}

/// kdamond 0's files (the one this tracker creates and owns).
const KDAMOND: &str = "kdamonds/0";
const CTX: &str = "kdamonds/0/contexts/0";
const SCHEME: &str = "kdamonds/0/contexts/0/schemes/0";
const TRIED: &str = "kdamonds/0/contexts/0/schemes/0/tried_regions";

/// One region of a DAMON snapshot, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRegion {
    /// First byte (process virtual address).
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Positive accessed-bit checks in the aggregation interval.
    pub nr_accesses: u32,
    /// Aggregation intervals the region kept its access level.
    pub age: u32,
}

/// One snapshot in the report's timeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DamonSnapshot {
    /// Seconds since the tracker started.
    pub t_s: f64,
    /// Regions DAMON reported inside guest RAM.
    pub regions: u32,
    /// Of which with `nr_accesses > 0`.
    pub accessed_regions: u32,
    /// Guest pages in those regions.
    pub accessed_pages: u64,
    /// Those pages as merged `[first, end)` guest page ranges (at most
    /// [`MAX_RANGES`], the largest kept).
    pub accessed: Vec<[u64; 2]>,
    /// Whether ranges were left out.
    pub ranges_truncated: bool,
}

/// What the tracker did, for the run report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DamonReport {
    /// The monitoring settings.
    pub sample_us: u64,
    /// Aggregation interval, us.
    pub aggr_us: u64,
    /// Region bounds.
    pub min_regions: u32,
    /// Region bounds.
    pub max_regions: u32,
    /// Snapshots read.
    pub snapshots: u64,
    /// Mean regions per snapshot.
    pub regions_mean: f64,
    /// Mean guest pages found accessed per snapshot.
    pub accessed_pages_mean: f64,
    /// Access samples synthesized for sample-based policies.
    pub samples: u64,
    /// Samples dropped because nobody drained them ([`MAX_PENDING_SAMPLES`]).
    pub samples_dropped: u64,
    /// CPU time of the kernel's kdamond thread while we ran, ms (USER_HZ
    /// resolution: 10 ms).
    pub kdamond_cpu_ms: Option<f64>,
    /// CPU time of our reader thread (sysfs requests and reads), ms.
    pub reader_cpu_ms: Option<f64>,
    /// Seconds the tracker ran.
    pub elapsed_s: f64,
    /// (kdamond + reader CPU) / elapsed, percent of one CPU: the tracker's
    /// whole cost (the guest takes no fault for it).
    pub cpu_pct: Option<f64>,
    /// Update requests or reads that failed.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Stopping: "ok", or what failed (kdamond 0 may then be left behind).
    pub teardown: String,
    /// Snapshots over time (the first [`MAX_TIMELINE`]).
    pub timeline: Vec<DamonSnapshot>,
    /// Whether snapshots were left out of the timeline.
    pub timeline_truncated: bool,
}

/// State the reader thread fills and the engine drains.
#[derive(Debug)]
struct Shared {
    /// Guest pages seen accessed since the last merge (one bit each).
    accessed: Vec<u64>,
    /// Synthesized sample pages since the last drain.
    samples: Vec<u64>,
    rng: u64,
    report: DamonReport,
    regions_sum: u64,
    accessed_sum: u64,
}

/// Where guest RAM is in this process.
#[derive(Clone, Copy, Debug)]
struct GuestRange {
    base: u64,
    pages: u64,
}

impl Shared {
    fn new(pages: u64, cfg: &DamonConfig) -> Self {
        Self {
            accessed: vec![0; pages.div_ceil(64) as usize],
            samples: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
            report: DamonReport {
                sample_us: cfg.sample_us,
                aggr_us: cfg.aggr_us,
                min_regions: cfg.min_regions,
                max_regions: cfg.max_regions,
                teardown: "running".into(),
                ..Default::default()
            },
            regions_sum: 0,
            accessed_sum: 0,
        }
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: a cheap, deterministic choice of a page in a region.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn error(&mut self, e: &DamonError) {
        self.report.errors += 1;
        if self.report.first_error.is_none() {
            self.report.first_error = Some(e.to_string());
        }
    }

    /// Folds one snapshot in: accessed bits, samples, timeline, counts.
    fn apply(&mut self, regions: &[RawRegion], guest: GuestRange, t_s: f64) {
        let mut snap = DamonSnapshot {
            t_s,
            regions: 0,
            accessed_regions: 0,
            accessed_pages: 0,
            accessed: Vec::new(),
            ranges_truncated: false,
        };
        let mut ranges: Vec<[u64; 2]> = Vec::new();
        let guest_end = guest.base + guest.pages * PAGE_SIZE as u64;
        for r in regions {
            let (start, end) = (r.start.max(guest.base), r.end.min(guest_end));
            if start >= end {
                continue;
            }
            snap.regions += 1;
            if r.nr_accesses == 0 {
                continue;
            }
            let first = (start - guest.base) / PAGE_SIZE as u64;
            let last = (end - guest.base).div_ceil(PAGE_SIZE as u64);
            snap.accessed_regions += 1;
            snap.accessed_pages += last - first;
            for p in first..last {
                self.accessed[(p / 64) as usize] |= 1 << (p % 64);
            }
            for _ in 0..r.nr_accesses {
                if self.samples.len() >= MAX_PENDING_SAMPLES {
                    self.report.samples_dropped += 1;
                    continue;
                }
                let p = first + self.next_rand() % (last - first);
                self.samples.push(p);
                self.report.samples += 1;
            }
            match ranges.last_mut() {
                Some(prev) if prev[1] >= first => prev[1] = prev[1].max(last),
                _ => ranges.push([first, last]),
            }
        }
        if ranges.len() > MAX_RANGES {
            ranges.sort_by_key(|r| std::cmp::Reverse(r[1] - r[0]));
            ranges.truncate(MAX_RANGES);
            ranges.sort_unstable();
            snap.ranges_truncated = true;
        }
        snap.accessed = ranges;
        self.report.snapshots += 1;
        self.regions_sum += u64::from(snap.regions);
        self.accessed_sum += snap.accessed_pages;
        if self.report.timeline.len() < MAX_TIMELINE {
            self.report.timeline.push(snap);
        } else {
            self.report.timeline_truncated = true;
        }
    }
}

/// Reads the current snapshot (`tried_regions/N/...`), in address order.
fn read_regions(fs: &Sysfs) -> Result<Vec<RawRegion>, DamonError> {
    let dir = fs.path(TRIED);
    let mut idx: Vec<u32> = std::fs::read_dir(&dir)
        .map_err(|e| fs.io(TRIED, e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    idx.sort_unstable();
    let mut out = Vec::with_capacity(idx.len());
    for i in idx {
        let f = |name: &str| fs.read_u64(&format!("{TRIED}/{i}/{name}"));
        out.push(RawRegion {
            start: f("start")?,
            end: f("end")?,
            nr_accesses: f("nr_accesses")?.min(u64::from(u32::MAX)) as u32,
            age: f("age")?.min(u64::from(u32::MAX)) as u32,
        });
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// CPU seconds (user + system) of the task whose `/proc/.../stat` is `path`.
fn task_cpu_secs(path: &Path) -> Option<f64> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// A running DAMON tracker over this process's guest RAM.
pub struct DamonTracker {
    fs: Sysfs,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    /// The reader's CPU seconds, sent when it ends.
    done: Receiver<Option<f64>>,
    kdamond_stat: Option<PathBuf>,
    kdamond_cpu0: Option<f64>,
    started: Instant,
    torn_down: bool,
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DamonTracker {
    /// Starts DAMON on `guest_pages` pages at process address `guest_base`
    /// of process `pid` (steps 1-6 of the protocol) and the reader thread.
    /// Refuses (writing nothing) unless [`check_can_start`] passes.
    pub fn start(
        root: &Path,
        allowed: bool,
        cfg: &DamonConfig,
        pid: u32,
        guest_base: usize,
        guest_pages: usize,
    ) -> Result<Self, DamonError> {
        if cfg.sample_us == 0 || cfg.aggr_us < cfg.sample_us {
            return Err(DamonError::Protocol(format!(
                "sampling interval {} us must be positive and at most the aggregation interval {} us",
                cfg.sample_us, cfg.aggr_us
            )));
        }
        if cfg.min_regions < 3 || cfg.max_regions < cfg.min_regions {
            return Err(DamonError::Protocol(format!(
                "regions {}..{}: DAMON needs 3 <= min <= max",
                cfg.min_regions, cfg.max_regions
            )));
        }
        if guest_pages == 0 {
            return Err(DamonError::Protocol("no guest RAM to monitor".into()));
        }
        check_can_start(root, allowed)?;
        let fs = Sysfs::new(root);
        // Step 1: from here on kdamond 0 is ours; undo on any error.
        fs.write("kdamonds/nr_kdamonds", "1")?;
        let guest = GuestRange {
            base: guest_base as u64,
            pages: guest_pages as u64,
        };
        if let Err(e) = configure(&fs, cfg, pid, guest) {
            let _ = fs.write(&format!("{KDAMOND}/state"), "off");
            let _ = fs.write("kdamonds/nr_kdamonds", "0");
            return Err(e);
        }
        let kdamond_stat = fs
            .read_u64(&format!("{KDAMOND}/pid"))
            .ok()
            .map(|p| PathBuf::from(format!("/proc/{p}/stat")));
        let kdamond_cpu0 = kdamond_stat.as_deref().and_then(task_cpu_secs);
        let shared = Arc::new(Mutex::new(Shared::new(guest.pages, cfg)));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, done) = bounded(1);
        let started = Instant::now();
        let reader = {
            let (fs, shared, stop) = (fs.clone(), shared.clone(), stop.clone());
            let pace = Duration::from_micros(cfg.aggr_us / 2);
            std::thread::Builder::new()
                .name("damon-reader".into())
                .spawn(move || {
                    crate::threads::started(crate::threads::ThreadRole::DamonReader);
                    reader_loop(&fs, &shared, &stop, guest, pace, started);
                    let _ = tx.send(task_cpu_secs(Path::new("/proc/thread-self/stat")));
                })
        };
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                let _ = fs.write(&format!("{KDAMOND}/state"), "off");
                let _ = fs.write("kdamonds/nr_kdamonds", "0");
                return Err(DamonError::Protocol(format!(
                    "spawning the reader thread: {e}"
                )));
            }
        };
        Ok(Self {
            fs,
            shared,
            stop,
            reader: Some(reader),
            done,
            kdamond_stat,
            kdamond_cpu0,
            started,
            torn_down: false,
        })
    }

    /// ORs every page seen accessed since the last call into `bits` (one
    /// bit per guest page) and clears them here.
    pub fn merge_accessed_into(&self, bits: &mut [u64]) {
        let mut s = lock(&self.shared);
        for (dst, src) in bits.iter_mut().zip(s.accessed.iter_mut()) {
            *dst |= std::mem::take(src);
        }
    }

    /// Takes the sampled pages synthesized since the last call.
    pub fn drain_sample_pages(&self) -> Vec<u64> {
        std::mem::take(&mut lock(&self.shared).samples)
    }

    /// Snapshots read so far.
    pub fn snapshots(&self) -> u64 {
        lock(&self.shared).report.snapshots
    }

    /// Stops DAMON (step 8) and the reader, bounded, and reports.
    pub fn stop(mut self) -> DamonReport {
        self.teardown()
    }

    fn teardown(&mut self) -> DamonReport {
        let elapsed = self.started.elapsed().as_secs_f64();
        let kdamond_cpu = match (self.kdamond_stat.as_deref(), self.kdamond_cpu0) {
            (Some(p), Some(c0)) => task_cpu_secs(p).map(|c| (c - c0).max(0.0)),
            _ => None,
        };
        self.stop.store(true, Ordering::Relaxed);
        self.torn_down = true;
        let mut problems = Vec::new();
        // The kernel refuses sysfs writes with EBUSY while another one holds
        // its DAMON lock (our reader's update request takes it now and
        // then), so let the reader finish its request first (normally
        // within two aggregation intervals), then retry each write.
        let mut reader_cpu = self.wait_reader(READER_QUIET_BOUND);
        if let Err(e) = retry_busy(|| self.fs.write(&format!("{KDAMOND}/state"), "off")) {
            problems.push(format!("state off: {e}"));
        }
        if self.reader.is_some() {
            // Turning kdamond off also ends an update request still waiting.
            reader_cpu = self.wait_reader(STOP_BOUND);
            if self.reader.is_some() {
                problems.push(format!(
                    "the reader thread did not end within {STOP_BOUND:?} (left running)"
                ));
            }
        }
        if let Err(e) = retry_busy(|| self.fs.write("kdamonds/nr_kdamonds", "0")) {
            problems.push(format!("nr_kdamonds 0: {e} (kdamond 0 left behind)"));
        }
        let mut s = lock(&self.shared);
        let n = s.report.snapshots.max(1) as f64;
        let mut r = std::mem::take(&mut s.report);
        r.regions_mean = s.regions_sum as f64 / n;
        r.accessed_pages_mean = s.accessed_sum as f64 / n;
        r.elapsed_s = elapsed;
        r.kdamond_cpu_ms = kdamond_cpu.map(|c| c * 1e3);
        r.reader_cpu_ms = reader_cpu.map(|c| c * 1e3);
        r.cpu_pct = match (kdamond_cpu, reader_cpu) {
            (Some(k), Some(rd)) if elapsed > 0.0 => Some((k + rd) / elapsed * 100.0),
            _ => None,
        };
        r.teardown = if problems.is_empty() {
            "ok".into()
        } else {
            problems.join("; ")
        };
        r
    }
}

impl DamonTracker {
    /// Waits up to `bound` for the reader to end; its CPU seconds if it did.
    fn wait_reader(&mut self, bound: Duration) -> Option<f64> {
        self.reader.as_ref()?;
        match self.done.recv_timeout(bound) {
            Ok(cpu) => {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                cpu
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                None
            }
        }
    }
}

/// Runs a sysfs write until it stops failing with EBUSY (the kernel's
/// DAMON lock is taken with a trylock), at most [`BUSY_RETRIES`] times.
fn retry_busy(mut f: impl FnMut() -> Result<(), DamonError>) -> Result<(), DamonError> {
    let mut last = f();
    for _ in 0..BUSY_RETRIES {
        match &last {
            Err(DamonError::Io { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(BUSY_PAUSE);
                last = f();
            }
            _ => break,
        }
    }
    last
}

impl Drop for DamonTracker {
    fn drop(&mut self) {
        if !self.torn_down {
            let r = self.teardown();
            if r.teardown != "ok" {
                tracing::warn!("stopping DAMON: {}", r.teardown);
            }
        }
    }
}

/// Steps 2-6: one context, one fixed region, one `stat` scheme, on.
fn configure(fs: &Sysfs, cfg: &DamonConfig, pid: u32, guest: GuestRange) -> Result<(), DamonError> {
    fs.write(&format!("{KDAMOND}/contexts/nr_contexts"), "1")?;
    let ops = fs.read(&format!("{CTX}/avail_operations"))?;
    if !ops.split_whitespace().any(|o| o == "fvaddr") {
        return Err(DamonError::Protocol(format!(
            "the kernel offers operations [{}] but not fvaddr (fixed virtual address ranges)",
            ops.split_whitespace().collect::<Vec<_>>().join(" ")
        )));
    }
    fs.write(&format!("{CTX}/operations"), "fvaddr")?;
    let attrs = format!("{CTX}/monitoring_attrs");
    fs.write(
        &format!("{attrs}/intervals/sample_us"),
        &cfg.sample_us.to_string(),
    )?;
    fs.write(
        &format!("{attrs}/intervals/aggr_us"),
        &cfg.aggr_us.to_string(),
    )?;
    // Order matters to the kernel only at commit; max first keeps min <= max.
    fs.write(
        &format!("{attrs}/nr_regions/max"),
        &cfg.max_regions.to_string(),
    )?;
    fs.write(
        &format!("{attrs}/nr_regions/min"),
        &cfg.min_regions.to_string(),
    )?;
    fs.write(&format!("{CTX}/targets/nr_targets"), "1")?;
    fs.write(&format!("{CTX}/targets/0/pid_target"), &pid.to_string())?;
    fs.write(&format!("{CTX}/targets/0/regions/nr_regions"), "1")?;
    let end = guest.base + guest.pages * PAGE_SIZE as u64;
    fs.write(
        &format!("{CTX}/targets/0/regions/0/start"),
        &guest.base.to_string(),
    )?;
    fs.write(&format!("{CTX}/targets/0/regions/0/end"), &end.to_string())?;
    fs.write(&format!("{CTX}/schemes/nr_schemes"), "1")?;
    fs.write(&format!("{SCHEME}/action"), "stat")?;
    // The access pattern defaults to 0..0 (matches nothing): match all.
    let ap = format!("{SCHEME}/access_pattern");
    fs.write(&format!("{ap}/sz/max"), &u64::MAX.to_string())?;
    fs.write(&format!("{ap}/nr_accesses/max"), &u32::MAX.to_string())?;
    fs.write(&format!("{ap}/age/max"), &u32::MAX.to_string())?;
    fs.write(&format!("{KDAMOND}/state"), "on")?;
    let state = fs.read(&format!("{KDAMOND}/state"))?;
    if state.trim() != "on" {
        return Err(DamonError::Protocol(format!(
            "kdamond 0 reads '{}' after 'on'",
            state.trim()
        )));
    }
    Ok(())
}

/// Step 7 until `stop`: request a snapshot, read it, fold it in. Requests
/// are at least `pace` apart (the kernel's request blocks for about an
/// aggregation interval; a failing one must not spin).
fn reader_loop(
    fs: &Sysfs,
    shared: &Mutex<Shared>,
    stop: &AtomicBool,
    guest: GuestRange,
    pace: Duration,
    started: Instant,
) {
    let mut consecutive_errors = 0;
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let snapshot =
            retry_busy(|| fs.write(&format!("{KDAMOND}/state"), "update_schemes_tried_regions"))
                .and_then(|()| read_regions(fs));
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match snapshot {
            Ok(regions) => {
                consecutive_errors = 0;
                let t_s = started.elapsed().as_secs_f64();
                lock(shared).apply(&regions, guest, t_s);
            }
            Err(e) => {
                consecutive_errors += 1;
                let mut s = lock(shared);
                s.error(&e);
                if consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                    tracing::warn!(
                        "DAMON reader gives up after {consecutive_errors} failures: {e}"
                    );
                    break;
                }
            }
        }
        if let Some(rest) = pace.checked_sub(t0.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// A fake DAMON sysfs tree for tests (the engine's too).
#[cfg(test)]
pub(crate) mod fake {
    use super::*;

    /// A scratch directory laid out like DAMON's sysfs tree after the
    /// kernel created kdamond 0 (plain files: writes do not block, and
    /// `tried_regions` holds whatever the test put there).
    pub(crate) struct FakeSysfs {
        pub(crate) root: PathBuf,
    }

    impl FakeSysfs {
        pub(crate) fn new(name: &str, nr_kdamonds: u32) -> Self {
            let root = std::env::temp_dir().join(format!(
                "tiervm-damon-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&root);
            let mk = |rel: &str, v: &str| {
                let p = root.join(rel);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, v).unwrap();
            };
            mk("kdamonds/nr_kdamonds", &format!("{nr_kdamonds}\n"));
            mk(
                "kdamonds/0/state",
                if nr_kdamonds > 0 { "on\n" } else { "off\n" },
            );
            mk("kdamonds/0/pid", "-1\n");
            mk("kdamonds/0/contexts/nr_contexts", "0\n");
            mk(&format!("{CTX}/avail_operations"), "vaddr\nfvaddr\npaddr\n");
            for f in [
                "operations",
                "monitoring_attrs/intervals/sample_us",
                "monitoring_attrs/intervals/aggr_us",
                "monitoring_attrs/nr_regions/min",
                "monitoring_attrs/nr_regions/max",
                "targets/nr_targets",
                "targets/0/pid_target",
                "targets/0/regions/nr_regions",
                "targets/0/regions/0/start",
                "targets/0/regions/0/end",
                "schemes/nr_schemes",
                "schemes/0/action",
                "schemes/0/access_pattern/sz/max",
                "schemes/0/access_pattern/nr_accesses/max",
                "schemes/0/access_pattern/age/max",
            ] {
                mk(&format!("{CTX}/{f}"), "0\n");
            }
            std::fs::create_dir_all(root.join(TRIED)).unwrap();
            Self { root }
        }

        pub(crate) fn region(&self, i: u32, r: RawRegion) {
            let d = self.root.join(format!("{TRIED}/{i}"));
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in [
                ("start", r.start),
                ("end", r.end),
                ("nr_accesses", u64::from(r.nr_accesses)),
                ("age", u64::from(r.age)),
            ] {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }

        pub(crate) fn get(&self, rel: &str) -> String {
            std::fs::read_to_string(self.root.join(rel))
                .unwrap()
                .trim()
                .to_string()
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSysfs;
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    fn fast_cfg() -> DamonConfig {
        DamonConfig {
            sample_us: 1_000,
            aggr_us: 10_000,
            ..DamonConfig::default()
        }
    }

    #[test]
    fn probe_reads_without_writing() {
        let absent = std::env::temp_dir().join("tiervm-damon-no-such-dir");
        assert_eq!(probe(&absent), DamonStatus::Absent);
        let busy = FakeSysfs::new("busy", 1);
        assert_eq!(
            probe(&busy.root),
            DamonStatus::InUse {
                kdamonds: 1,
                running: 1
            }
        );
        let idle = FakeSysfs::new("idle", 0);
        assert_eq!(probe(&idle.root), DamonStatus::Idle);
        assert_eq!(idle.get("kdamonds/nr_kdamonds"), "0");
    }

    /// The three refusals write nothing: someone else's kdamond, no opt-in,
    /// no interface.
    #[test]
    fn refuses_without_opt_in_or_when_damon_is_in_use() {
        let busy = FakeSysfs::new("refuse-busy", 1);
        let e = DamonTracker::start(&busy.root, true, &fast_cfg(), 1, BASE as usize, 64)
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                DamonError::InUse {
                    kdamonds: 1,
                    running: 1
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("--tracking hint-faults"));
        assert_eq!(
            busy.get(&format!("{CTX}/operations")),
            "0",
            "nothing written"
        );

        let idle = FakeSysfs::new("refuse-idle", 0);
        let e = DamonTracker::start(&idle.root, false, &fast_cfg(), 1, BASE as usize, 64)
            .err()
            .unwrap();
        assert!(matches!(e, DamonError::NotAllowed), "{e}");
        assert!(e.to_string().contains(ALLOW_ENV));
        assert_eq!(idle.get("kdamonds/nr_kdamonds"), "0", "nothing written");

        let absent = std::env::temp_dir().join("tiervm-damon-no-such-dir");
        let e = DamonTracker::start(&absent, true, &fast_cfg(), 1, BASE as usize, 64)
            .err()
            .unwrap();
        assert!(matches!(e, DamonError::Absent(_)), "{e}");
    }

    /// With the opt-in on an idle DAMON: the protocol's files get the
    /// settings, snapshots become accessed bits and samples inside the
    /// accessed regions, and stopping turns kdamond 0 off and removes it.
    // Long (~95 lines) on purpose: one scenario through the whole sysfs
    // protocol, each assertion next to the step it checks.
    #[test]
    fn configures_reads_snapshots_and_tears_down() {
        let fake = FakeSysfs::new("run", 0);
        let pages = 1024u64;
        // Pages 0..16 idle, 16..48 accessed 5 times, 48..1024 idle; one
        // region outside guest RAM (ignored).
        fake.region(
            0,
            RawRegion {
                start: BASE,
                end: BASE + 16 * PAGE_SIZE as u64,
                nr_accesses: 0,
                age: 3,
            },
        );
        fake.region(
            1,
            RawRegion {
                start: BASE + 16 * PAGE_SIZE as u64,
                end: BASE + 48 * PAGE_SIZE as u64,
                nr_accesses: 5,
                age: 1,
            },
        );
        fake.region(
            2,
            RawRegion {
                start: BASE + 48 * PAGE_SIZE as u64,
                end: BASE + pages * PAGE_SIZE as u64,
                nr_accesses: 0,
                age: 9,
            },
        );
        fake.region(
            3,
            RawRegion {
                start: BASE - 4 * PAGE_SIZE as u64,
                end: BASE,
                nr_accesses: 7,
                age: 0,
            },
        );
        let t = DamonTracker::start(
            &fake.root,
            true,
            &fast_cfg(),
            4242,
            BASE as usize,
            pages as usize,
        )
        .unwrap();
        assert_eq!(fake.get(&format!("{CTX}/operations")), "fvaddr");
        assert_eq!(fake.get(&format!("{CTX}/targets/0/pid_target")), "4242");
        assert_eq!(
            fake.get(&format!("{CTX}/targets/0/regions/0/start")),
            BASE.to_string()
        );
        assert_eq!(
            fake.get(&format!("{CTX}/targets/0/regions/0/end")),
            (BASE + pages * PAGE_SIZE as u64).to_string()
        );
        assert_eq!(fake.get(&format!("{SCHEME}/action")), "stat");
        assert_eq!(
            fake.get(&format!("{SCHEME}/access_pattern/sz/max")),
            u64::MAX.to_string()
        );
        assert_eq!(fake.get("kdamonds/nr_kdamonds"), "1");
        let deadline = Instant::now() + Duration::from_secs(10);
        while t.snapshots() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t.snapshots() >= 2, "the reader read snapshots");
        let mut bits = vec![0u64; pages.div_ceil(64) as usize];
        t.merge_accessed_into(&mut bits);
        let accessed: Vec<u64> = (0..pages)
            .filter(|&p| bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
            .collect();
        assert_eq!(accessed, (16..48).collect::<Vec<_>>());
        let samples = t.drain_sample_pages();
        assert!(samples.len() >= 10, "5 per snapshot: {}", samples.len());
        assert!(samples.iter().all(|p| (16..48).contains(p)), "{samples:?}");
        // Merged bits were taken: a merge right after adds nothing new
        // unless a snapshot came in between (then the same pages).
        let r = t.stop();
        assert_eq!(r.teardown, "ok");
        assert_eq!(fake.get("kdamonds/0/state"), "off");
        assert_eq!(fake.get("kdamonds/nr_kdamonds"), "0");
        assert!(r.snapshots >= 2 && r.errors == 0, "{r:?}");
        let s = &r.timeline[0];
        assert_eq!(
            (s.regions, s.accessed_regions, s.accessed_pages),
            (3, 1, 32)
        );
        assert_eq!(s.accessed, vec![[16, 48]]);
        assert!(r.reader_cpu_ms.is_some());
    }

    /// Region snapshot to pages: clamped to guest RAM, adjacent accessed
    /// regions merge into one range, samples stay inside their regions.
    #[test]
    fn snapshots_map_to_guest_pages() {
        let cfg = DamonConfig::default();
        let mut s = Shared::new(100, &cfg);
        let g = GuestRange {
            base: BASE,
            pages: 100,
        };
        let r = |a: u64, b: u64, n: u32| RawRegion {
            start: BASE + a * PAGE_SIZE as u64,
            end: BASE + b * PAGE_SIZE as u64,
            nr_accesses: n,
            age: 0,
        };
        s.apply(
            &[r(0, 10, 2), r(10, 20, 1), r(30, 40, 0), r(90, 120, 3)],
            g,
            1.0,
        );
        let snap = &s.report.timeline[0];
        assert_eq!(snap.accessed, vec![[0, 20], [90, 100]]);
        assert_eq!(snap.accessed_pages, 30);
        assert_eq!(snap.regions, 4);
        assert_eq!(s.samples.len(), 6);
        assert!(s.samples[..2].iter().all(|&p| p < 10));
        assert!(s.samples[3..].iter().all(|&p| (90..100).contains(&p)));
        assert_eq!(s.accessed[1] >> (90 - 64), (1 << 10) - 1);
    }

    #[test]
    fn only_the_real_root_is_machine_state() {
        assert!(is_machine_damon(Path::new(SYSFS_ROOT)));
        assert!(is_machine_damon(Path::new("/sys/kernel/mm/damon/admin/")));
        assert!(!is_machine_damon(&std::env::temp_dir().join("damon")));
    }

    #[test]
    fn task_cpu_parses_proc_stat() {
        assert!(task_cpu_secs(Path::new("/proc/thread-self/stat")).is_some());
        assert!(task_cpu_secs(Path::new("/proc/no-such/stat")).is_none());
    }
}
