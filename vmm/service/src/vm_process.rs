//! The VM process (`tiervm __worker`, hidden): runs one VM for `tiervm
//! serve`, controlled over the private channel the service passed as an
//! inherited socket ([`crate::protocol`]); the service's handle to it is
//! [`crate::worker::WorkerLink`]. One process per VM: a VM that crashes or is killed
//! takes nothing else with it.
//!
//! Threads: the main thread runs the VM (`runner::run`) with hooks that
//! publish statistics once a second and execute policy switches; a control
//! thread reads commands and answers them (capacity changes go straight to
//! the resize driver's handle). End-of-file on the channel stops the VM.

use std::io::{BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tiering::engine::profile::{access_rate, gain_curve_covered, AccessProfile, GainCurve};
use tiering::mem::{MemStats, ResizeHandle, TieredMemory, PAGE_SIZE};
use tiering::policy::PolicyKind;

use vmm_core::config::{ConfigError, VmConfig};
use vmm_core::report::code_of as exit_code_of;
use vmm_core::runner::{self, Console, RunError, RunHooks, SampleCtx};
use vmm_core::seccomp::SeccompError;
use vmm_core::tiering_config::PolicyArg;

use crate::protocol::{
    encode, read_line, Command, FromWorker, Refusal, RefusalKind, Reply, TierNow, ToWorker,
    WorkerStart, WorkerStats,
};

/// How often the worker refreshes its statistics and gain curve.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// Half-lives between halvings of the access profile when no sampler pass
/// completes (probe or DAMON tracking).
const HALVE_WITHOUT_SCAN: u32 = 4;
/// How long a finished worker waits for the service's `exit`.
const EXIT_WAIT: Duration = Duration::from_secs(60);
/// Writes to the service give up after this long (the service reads
/// every worker's channel all the time; a stuck write means it is gone).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The worker could not talk to the service.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The channel fd is not a socket this process owns.
    #[error("--channel-fd {0} is not an open socket: this mode is started by tiervm serve only")]
    BadChannel(i32),
    /// Reading or writing the channel failed.
    #[error("the channel to the service")]
    Channel(#[source] std::io::Error),
    /// The first line was not a start message.
    #[error("the service's start message: {0}")]
    BadStart(String),
}

/// Why the VM of this process did not run to its end (reported to the
/// service, which shows it to the client).
#[derive(Debug, thiserror::Error)]
enum VmFailure {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
}

impl VmFailure {
    fn exit_code(&self) -> i32 {
        let usage = match self {
            Self::Config(_) => true,
            Self::Run(e) => e.is_usage(),
            Self::Seccomp(_) => false,
        };
        if usage {
            vmm_core::exit::EXIT_USAGE
        } else {
            vmm_core::exit::EXIT_HOST
        }
    }

    fn describe(&self) -> String {
        let fix = match self {
            Self::Config(e) => e.fix(),
            Self::Run(e) => e.fix(),
            Self::Seccomp(e) => e.fix(),
        };
        vmm_core::exit::describe(self, fix)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by the main thread (hooks) and the control thread.
struct Shared {
    writer: Mutex<UnixStream>,
    stop: AtomicBool,
    exit: AtomicBool,
    closed: AtomicBool,
    finished: AtomicBool,
    resize: Mutex<Option<ResizeHandle>>,
    stats: Mutex<Option<WorkerStats>>,
    /// Policy switches the main thread takes at its next sample (the
    /// service is answered as soon as one is queued; the stats show the
    /// policy that runs and the last switch that failed).
    switches: Mutex<Vec<PolicyKind>>,
    report: Mutex<Option<serde_json::Value>>,
}

impl Shared {
    /// Sends one line; a failure means the service is gone: stop.
    fn send(&self, msg: &FromWorker) {
        let ok = encode(msg)
            .map_err(std::io::Error::other)
            .and_then(|line| lock(&self.writer).write_all(&line));
        if ok.is_err() {
            self.closed.store(true, Ordering::Release);
            self.stop.store(true, Ordering::Release);
        }
    }
}

/// Runs the VM process on the inherited channel `channel_fd`; returns the
/// process exit code.
pub fn run(channel_fd: i32, started: Instant) -> Result<i32, WorkerError> {
    let stream = open_channel(channel_fd)?;
    stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(WorkerError::Channel)?;
    let mut reader = BufReader::new(stream.try_clone().map_err(WorkerError::Channel)?);
    let Some(spec) = read_start(&mut reader, &stream)? else {
        return Ok(0);
    };
    let shared = Arc::new(Shared {
        writer: Mutex::new(stream),
        stop: AtomicBool::new(false),
        exit: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        finished: AtomicBool::new(false),
        resize: Mutex::new(None),
        stats: Mutex::new(None),
        switches: Mutex::new(Vec::new()),
        report: Mutex::new(None),
    });
    let cfg = match VmConfig::from_request(&spec.vm) {
        Ok(c) => c,
        Err(e) => return Ok(fail(&shared, &e.into())),
    };
    // The control thread confines itself (seccomp role WorkerLink) as it
    // starts: filters are on from here, as in `tiervm run`.
    if let Err(e) = vmm_core::seccomp::set_enabled(cfg.seccomp) {
        return Ok(fail(&shared, &e.into()));
    }
    let control = {
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("worker-control".into())
            .spawn(move || {
                tiering::threads::started(tiering::threads::ThreadRole::WorkerLink);
                control_loop(reader, &sh)
            })
            .map_err(WorkerError::Channel)?
    };
    let mut hooks = WorkerHooks::new(shared.clone(), &spec, cfg.notes());
    let outcome = runner::run(&cfg, started, Console::Stderr, &mut hooks);
    let code = match outcome {
        Ok(report) => {
            let code = exit_code_of(&report);
            let stop_reason = serde_json::to_value(report.stop_reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            *lock(&shared.report) = serde_json::to_value(&report).ok();
            shared.finished.store(true, Ordering::Release);
            shared.send(&FromWorker::Finished {
                stop_reason,
                exit_code: report.exit_code,
                crash: report.crash.clone(),
                process_exit: code,
            });
            code
        }
        Err(e) => return Ok(fail(&shared, &e.into())),
    };
    // The VM and its memory are gone; wait (bounded) for the service to
    // fetch the report and say goodbye.
    let deadline = Instant::now() + EXIT_WAIT;
    while !shared.exit.load(Ordering::Acquire)
        && !shared.closed.load(Ordering::Acquire)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    if control.is_finished() {
        let _ = control.join();
    }
    Ok(code)
}

/// The service's start message (`None`: the channel closed first). One
/// that does not parse (a VM description with a value the request does
/// not know) is reported to the service as the VM's failure, naming the
/// problem, before the worker ends.
fn read_start(
    reader: &mut BufReader<UnixStream>,
    mut stream: &UnixStream,
) -> Result<Option<WorkerStart>, WorkerError> {
    let Some(line) = read_line(reader).map_err(WorkerError::Channel)? else {
        return Ok(None);
    };
    let (bad, usage) = match serde_json::from_slice::<ToWorker>(&line) {
        Ok(ToWorker::Start(start)) => return Ok(Some(*start)),
        Ok(other) => (WorkerError::BadStart(format!("{other:?}")), false),
        // Well-formed JSON with a value that is wrong: the request's fault.
        Err(e) => (WorkerError::BadStart(e.to_string()), e.is_data()),
    };
    let failed = FromWorker::Failed {
        error: bad.to_string(),
        usage,
    };
    if let Ok(line) = encode(&failed) {
        // Best effort: the error is returned either way.
        let _ = stream.write_all(&line);
    }
    Err(bad)
}

/// Reports a failure to the service and returns the exit code.
fn fail(shared: &Shared, e: &VmFailure) -> i32 {
    shared.send(&FromWorker::Failed {
        error: e.describe(),
        usage: e.exit_code() == vmm_core::exit::EXIT_USAGE,
    });
    e.exit_code()
}

/// Takes ownership of the inherited channel fd.
fn open_channel(fd: i32) -> std::result::Result<UnixStream, WorkerError> {
    if fd < 3 {
        return Err(WorkerError::BadChannel(fd));
    }
    // SAFETY: an all-zero `stat` is a valid value; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on any integer is safe; it fails for a closed fd.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(WorkerError::BadChannel(fd));
    }
    // SAFETY: the fd is an open socket (checked above) that the service
    // placed at this number for this process alone (dup2 before exec);
    // nothing else in this process refers to it, so the stream owns it.
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

/// Answers commands until the channel closes.
fn control_loop(mut reader: BufReader<UnixStream>, shared: &Shared) {
    while let Ok(Some(line)) = read_line(&mut reader) {
        let (id, command) = match serde_json::from_slice::<ToWorker>(&line) {
            Ok(ToWorker::Request { id, command }) => (id, command),
            Ok(ToWorker::Start(_)) | Err(_) => continue,
        };
        let result = answer(shared, command);
        shared.send(&FromWorker::Reply { id, result });
        if shared.exit.load(Ordering::Acquire) {
            return;
        }
    }
    // The service is gone: stop the VM (the main thread then exits).
    shared.closed.store(true, Ordering::Release);
    shared.stop.store(true, Ordering::Release);
}

fn answer(shared: &Shared, command: Command) -> std::result::Result<Reply, Refusal> {
    let starting = || {
        Refusal::new(
            RefusalKind::NotReady,
            "the VM is still starting: try again in a moment",
        )
    };
    let ended = || Refusal::new(RefusalKind::Ended, "the VM has ended");
    match command {
        Command::Stats => lock(&shared.stats)
            .clone()
            .map(|s| Reply::Stats(Box::new(s)))
            .ok_or_else(starting),
        Command::SetCapacity { tier, bytes } => {
            if shared.finished.load(Ordering::Acquire) {
                return Err(ended());
            }
            let guard = lock(&shared.resize);
            let h = guard.as_ref().ok_or_else(starting)?;
            let pages = usize::try_from(bytes / PAGE_SIZE as u64)
                .map_err(|e| Refusal::new(RefusalKind::Invalid, e.to_string()))?;
            h.set_capacity(tier, pages)
                .map(|p| Reply::Capacity {
                    bytes: p * PAGE_SIZE as u64,
                })
                .map_err(|e| Refusal::new(RefusalKind::Failed, e.to_string()))
        }
        Command::SwitchPolicy { policy } => {
            let kind: PolicyKind = policy
                .parse()
                .map_err(|e| Refusal::new(RefusalKind::Invalid, format!("{e}")))?;
            if shared.finished.load(Ordering::Acquire) {
                return Err(ended());
            }
            if lock(&shared.stats).is_none() {
                return Err(starting());
            }
            lock(&shared.switches).push(kind);
            Ok(Reply::Ok)
        }
        Command::Stop => {
            shared.stop.store(true, Ordering::Release);
            Ok(Reply::Ok)
        }
        Command::Report => lock(&shared.report)
            .clone()
            .map(|report| Reply::Report { report })
            .ok_or_else(|| {
                Refusal::new(
                    RefusalKind::NotReady,
                    "the VM is still running: its report is written when it ends",
                )
            }),
        Command::Exit => {
            if !shared.finished.load(Ordering::Acquire) {
                return Err(Refusal::new(
                    RefusalKind::NotReady,
                    "the VM is still running: stop it first",
                ));
            }
            shared.exit.store(true, Ordering::Release);
            Ok(Reply::Ok)
        }
    }
}

/// The hooks the runner calls on the main thread.
struct WorkerHooks {
    shared: Arc<Shared>,
    mem: Option<Arc<TieredMemory>>,
    profile: Option<Arc<AccessProfile>>,
    notes: Vec<String>,
    policy: PolicyKind,
    policy_error: Option<String>,
    quantum_pages: u64,
    curve_steps: usize,
    half_life: Duration,
    last_stats: Option<(Instant, f64, u64)>,
    last_halve: Instant,
    halve_cycles: u64,
}

impl WorkerHooks {
    fn new(shared: Arc<Shared>, spec: &WorkerStart, notes: Vec<String>) -> Self {
        let tiering = &spec.vm.tiering;
        let profile = &spec.profile;
        Self {
            shared,
            mem: None,
            profile: None,
            notes,
            policy: tiering
                .policy
                .and_then(PolicyArg::placement_policy)
                .unwrap_or(PolicyKind::Static),
            policy_error: None,
            quantum_pages: profile.quantum_pages.max(1),
            curve_steps: profile.curve_steps.clamp(1, 4096),
            half_life: Duration::try_from_secs_f64(profile.half_life_s.max(1.0))
                .unwrap_or(Duration::from_secs(20)),
            last_stats: None,
            last_halve: Instant::now(),
            halve_cycles: 0,
        }
    }

    /// Policy switches queued by the control thread; the stats show the
    /// outcome at once.
    fn switch_policies(&mut self, ctx: &SampleCtx<'_>) {
        let queued = std::mem::take(&mut *lock(&self.shared.switches));
        if queued.is_empty() {
            return;
        }
        for kind in queued {
            let r = match ctx.tiered {
                Some(t) => t.switch_policy(kind).map_err(|e| vmm_core::exit::chain(&e)),
                None => Err("this VM is untiered".to_string()),
            };
            match r {
                Ok(()) => {
                    self.policy = kind;
                    self.policy_error = None;
                }
                Err(e) => {
                    self.policy_error = Some(format!("switching to {}: {e}", kind.name()));
                }
            }
        }
        if let Some(st) = lock(&self.shared.stats).as_mut() {
            st.policy = self.policy.name().to_string();
            st.policy_error.clone_from(&self.policy_error);
        }
    }

    /// Statistics and the gain curve, once per [`STATS_PERIOD`].
    fn publish_stats(&mut self, ctx: &SampleCtx<'_>) {
        let now = Instant::now();
        if self
            .last_stats
            .is_some_and(|(at, _, _)| now.duration_since(at) < STATS_PERIOD)
        {
            return;
        }
        let Some(mem) = self.mem.clone() else {
            return;
        };
        let ops_per_sec = match self.last_stats {
            Some((_, t, ops)) if ctx.t_s > t => ctx.ops.saturating_sub(ops) as f64 / (ctx.t_s - t),
            _ => 0.0,
        };
        self.last_stats = Some((now, ctx.t_s, ctx.ops));
        let stats = mem.stats();
        let tiers = tiers_now(&stats);
        if self.profile.is_none() {
            self.profile = ctx.tiered.and_then(|t| t.access_profile());
        }
        let fast_capacity = stats.tiers.first().map_or(0, |t| t.capacity_pages);
        let account = mem.sampler_account();
        let accesses = access_rate(
            account.guest_pages,
            account.scanned_pages,
            account.weight,
            account.weight_sq,
        );
        // Before the sampler's first full pass, what it covered stands for
        // the whole (gain_curve_covered).
        let gain = self.gain_now(fast_capacity, accesses.map_or(1.0, |a| a.coverage));
        self.maybe_halve(now, mem.scan_cycles());
        let resize = lock(&self.shared.resize)
            .as_ref()
            .map(ResizeHandle::report)
            .unwrap_or_default();
        *lock(&self.shared.stats) = Some(WorkerStats {
            t_s: ctx.t_s,
            ops: ctx.ops,
            ops_per_sec,
            accesses,
            policy: self.policy.name().to_string(),
            policy_error: self.policy_error.clone(),
            tiers,
            emulated: mem.emulated(),
            mem: stats,
            resize,
            gain,
        });
    }

    /// The gain curve of the access profile with `fast_capacity` pages
    /// fast, its sampling `coverage` so far (flat without a profile).
    fn gain_now(&self, fast_capacity: u64, coverage: f64) -> GainCurve {
        let mut gain = match &self.profile {
            Some(p) => gain_curve_covered(
                &p.snapshot(),
                fast_capacity,
                self.quantum_pages,
                self.curve_steps,
                p.mean_weight(),
                coverage,
            ),
            None => Default::default(),
        };
        if self.policy == PolicyKind::Static {
            // Static never promotes: more fast capacity buys it nothing.
            gain.grow.iter_mut().for_each(|g| *g = 0.0);
        }
        gain
    }

    /// The profile's memory: halve once the sampler covered every page
    /// since the last halving (`cycles`: its full passes so far; so no
    /// page's count reflects only how recently the scan passed it), and at
    /// least a half-life apart; a VM without a sampler halves every
    /// HALVE_WITHOUT_SCAN half-lives.
    fn maybe_halve(&mut self, now: Instant, cycles: u64) {
        let since = now.duration_since(self.last_halve);
        if (cycles > self.halve_cycles && since >= self.half_life)
            || since >= self.half_life * HALVE_WITHOUT_SCAN
        {
            if let Some(p) = &self.profile {
                p.halve();
            }
            self.last_halve = now;
            self.halve_cycles = cycles;
        }
    }
}

/// The worker's view of each tier now, in bytes.
fn tiers_now(stats: &MemStats) -> Vec<TierNow> {
    let page = PAGE_SIZE as u64;
    stats
        .tiers
        .iter()
        .map(|t| TierNow {
            name: t.name.clone(),
            node: t.node,
            capacity_bytes: t.capacity_pages * page,
            used_bytes: t.pages * page,
            resident_bytes: t.resident_bytes,
        })
        .collect()
}

impl RunHooks for WorkerHooks {
    fn on_start(&mut self, tiered: Option<&Arc<TieredMemory>>) {
        self.mem = tiered.cloned();
        self.shared.send(&FromWorker::Started {
            pid: std::process::id(),
            notes: std::mem::take(&mut self.notes),
        });
    }

    fn on_sample(&mut self, ctx: &SampleCtx<'_>) {
        {
            let mut r = lock(&self.shared.resize);
            if r.is_none() {
                *r = ctx.tiered.and_then(|t| t.resize_handle());
            }
        }
        self.switch_policies(ctx);
        self.publish_stats(ctx);
    }

    fn wants_stop(&mut self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufRead;

    use super::*;

    #[test]
    fn a_start_that_does_not_parse_is_reported_as_the_vms_failure() {
        let (service, worker) = UnixStream::pair().unwrap();
        let mut reader = BufReader::new(worker.try_clone().unwrap());
        let line = r#"{"type":"start","id":"vm-1","vm":{"tiering":{"policy":"bogus"}},"profile":{"quantum_pages":1,"curve_steps":1,"half_life_s":1.0}}"#;
        (&service)
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let e = read_start(&mut reader, &worker).unwrap_err().to_string();
        assert!(
            e.contains("unknown policy 'bogus': valid values are"),
            "{e}"
        );
        let mut back = String::new();
        BufReader::new(&service).read_line(&mut back).unwrap();
        match serde_json::from_str::<FromWorker>(&back).unwrap() {
            FromWorker::Failed { error, usage } => {
                assert!(
                    error.starts_with("the service's start message: unknown policy 'bogus'"),
                    "{error}"
                );
                assert!(usage);
            }
            other => panic!("{other:?}"),
        }
        drop(service);
        assert!(read_start(&mut reader, &worker).unwrap().is_none());
    }
}
