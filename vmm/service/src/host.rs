//! The service's state: the pools, the VMs and their worker processes,
//! admission control, and the rebalancing loop that divides the fast pool
//! (`division`). Every operation is synchronous and bounded; the HTTP
//! layer calls them from blocking tasks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::config::{check_pools, host_nodes, ServeConfig, SIZE_ALIGN};
use super::division::{self, Share, Valuation};
use super::host_error::{HostError, HostErrorKind};
use super::placement_policy::check_policy;
use super::protocol::{Command, FromWorker, ProfileSettings, Reply, WorkerStart, WorkerStats};
use super::protocol::{Refusal, RefusalKind};
use super::types::*;
use super::worker::{ExitInfo, WorkerLink, WorkerLinkError};
use tiering::vocab::PAGE_SIZE;
use vmm_core::config::VmRequest;
use vmm_core::tiering_config::{PolicyArg, TieringRequest, TrackingArg};
use vmm_core::units::format_size;

/// How long a stats request may take.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the rebalancer's stats poll waits for the answers in all: a
/// later answer is dropped (the next poll asks again). It bounds how long
/// the rebalancer goes without checking every VM's silence, so the
/// `unresponsive` event comes within about a second of the setting.
const POLL_WAIT: Duration = Duration::from_secs(1);
/// How often running VMs' statistics are refreshed.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// Decayed samples below which a VM's gain curve is not trusted.
const MIN_SAMPLES: f64 = 32.0;
/// Time constant of a VM's smoothed guest-reported throughput, seconds: a
/// shared host's ops/s vary several-fold from one second to the next. (The
/// host-measured access rate needs no smoothing: the worker's census holds
/// one sample per page, a pass of the sampler.)
const OPS_TAU_S: f64 = 20.0;

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A random (version 4) UUID.
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 16 {
        // No entropy (not expected): time and a counter keep it unique here.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = (unix_now() * 1e9) as u128;
        let c = u128::from(N.fetch_add(1, Ordering::Relaxed));
        b = (t ^ (c << 64) ^ u128::from(std::process::id())).to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a VM stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum VmState {
    /// Its worker builds the VM.
    Starting,
    /// Running.
    Running,
    /// Asked to stop.
    Stopping,
    /// Ended (guest exited or was stopped); the report is kept.
    Stopped,
    /// The guest crashed, or the worker process died without a report.
    Crashed,
    /// The VM could not be built.
    Failed,
    /// Its process has been silent beyond `limits.unresponsive_after`
    /// (stopped, frozen, or stuck): it holds its capacity, nothing can be
    /// delivered to it; `DELETE ?force=true` kills it.
    Unresponsive,
    /// Recorded by an earlier run of the service that ended without
    /// recording the VM's end (killed, crashed): its worker stopped when
    /// that service went away.
    Lost,
}

impl VmState {
    /// The name the API uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Crashed => "crashed",
            Self::Failed => "failed",
            Self::Unresponsive => "unresponsive",
            Self::Lost => "lost",
        }
    }

    /// Every state.
    pub const ALL: [Self; 8] = [
        Self::Starting,
        Self::Running,
        Self::Unresponsive,
        Self::Stopping,
        Self::Stopped,
        Self::Crashed,
        Self::Failed,
        Self::Lost,
    ];

    /// Whether the VM's process is (or may still be) alive.
    pub fn active(self) -> bool {
        matches!(
            self,
            Self::Starting | Self::Running | Self::Unresponsive | Self::Stopping
        )
    }

    /// Whether the VM holds pool capacity: a VM asked to stop releases
    /// its reservations at once (its process ends within its stop grace).
    pub fn holds_capacity(self) -> bool {
        matches!(self, Self::Starting | Self::Running | Self::Unresponsive)
    }
}

/// One VM.
#[derive(Debug)]
pub struct VmEntry {
    /// Id: a name the client chose (`PUT /v1/vms/{name}`) or `vm-N`
    /// (`POST`, never reused across restarts of the service).
    pub id: String,
    /// A UUID the service generated (unique across every VM ever run).
    pub uuid: String,
    /// The orchestrator's labels.
    pub labels: BTreeMap<String, String>,
    /// The boot id of the service that created the VM.
    pub boot_id: String,
    /// Unix time of the creation.
    pub created_unix: f64,
    /// Unix time of the end.
    pub ended_unix: Option<f64>,
    /// The request that created it (a repeated `PUT` of the same request
    /// is answered with the VM; `None`: loaded from an older record).
    pub request: Option<CreateVm>,
    /// The exit code the guest wrote, once it ended.
    pub guest_exit_code: Option<u32>,
    /// Sampled accesses so far as the host measures them: the access
    /// rate integrated over the statistics' time (`rate()` of the metric
    /// gives the rate back).
    pub sampled_accesses: f64,
    /// Who asked the VM to stop: `deleted`, `force_deleted`,
    /// `service_stopped`.
    pub stop_cause: Option<&'static str>,
    /// What its worker runs.
    pub spec: WorkerStart,
    /// Guaranteed fast bytes.
    pub min: u64,
    /// Most fast bytes.
    pub max: u64,
    /// Weight.
    pub weight: f64,
    /// The fast capacity decided.
    pub target: u64,
    /// The fast capacity the worker applied.
    pub applied: u64,
    /// State.
    pub state: VmState,
    link: Option<Arc<WorkerLink>>,
    /// Worker pid.
    pub pid: Option<u32>,
    /// Latest statistics.
    pub stats: Option<WorkerStats>,
    /// The run report, once it ended.
    pub report: Option<serde_json::Value>,
    /// How the process ended.
    pub exit: Option<ExitInfo>,
    /// The crash or failure.
    pub error: Option<String>,
    /// stop_reason once ended.
    pub stop_reason: Option<String>,
    /// Advice.
    pub notes: Vec<String>,
    /// The policy the VM was created with (until its stats say what runs).
    pub policy: String,
    /// The policy the API asked for last.
    pub policy_requested: String,
    /// Switches through the API.
    pub policy_switches: u64,
    /// When the target last changed.
    pub last_resize: Option<Instant>,
    /// Whether that change was a grow.
    pub last_grew: Option<bool>,
    /// When the VM was created.
    pub created: Instant,
    finished_event: bool,
    /// Smoothed ops/s (exponentially weighted, [`OPS_TAU_S`]), its
    /// variance, and the worker sample time it last took.
    ops_smooth: Option<(f64, f64, f64)>,
}

impl VmEntry {
    /// A VM just admitted: `share` is its fast (min, max, weight), `start`
    /// the fast bytes it starts with.
    fn starting(
        id: String,
        spec: WorkerStart,
        (min, max, weight): (u64, u64, f64),
        start: u64,
        policy: String,
    ) -> Self {
        Self {
            id,
            uuid: new_uuid(),
            labels: BTreeMap::new(),
            boot_id: String::new(),
            created_unix: unix_now(),
            ended_unix: None,
            request: None,
            guest_exit_code: None,
            sampled_accesses: 0.0,
            stop_cause: None,
            spec,
            min,
            max,
            weight,
            target: start,
            applied: start,
            state: VmState::Starting,
            link: None,
            pid: None,
            stats: None,
            report: None,
            exit: None,
            error: None,
            stop_reason: None,
            notes: Vec::new(),
            policy_requested: policy.clone(),
            policy,
            policy_switches: 0,
            last_resize: None,
            last_grew: None,
            created: Instant::now(),
            finished_event: false,
            ops_smooth: None,
        }
    }

    /// A VM of an earlier run of the service, from its record: one that
    /// was still alive then is `lost` (its worker ended with that service).
    fn from_record(r: super::records::VmRecord) -> Self {
        let state = VmState::ALL
            .into_iter()
            .find(|s| s.name() == r.state)
            .unwrap_or(VmState::Lost);
        let mut v = Self::starting(r.id, r.spec, (r.min, r.max, r.weight), 0, r.policy.clone());
        v.uuid = r.uuid;
        v.labels = r.labels;
        v.boot_id = r.boot_id;
        v.created_unix = r.created_unix;
        v.ended_unix = r.ended_unix;
        v.request = r.request;
        v.guest_exit_code = r.guest_exit_code;
        v.stop_reason = r.stop_reason;
        v.error = r.error;
        v.exit = (r.exit_code.is_some() || r.exit_signal.is_some()).then_some(ExitInfo {
            code: r.exit_code,
            signal: r.exit_signal,
        });
        v.finished_event = true;
        if state.active() {
            v.state = VmState::Lost;
            v.error = Some(format!(
                "the service run {} ended without recording this VM's end (killed or crashed); \
                 its VM process stopped when that service went away",
                v.boot_id
            ));
            v.stop_reason = Some("service_lost".into());
        } else {
            v.state = state;
        }
        v
    }

    /// What is persisted of the VM.
    fn record(&self) -> super::records::VmRecord {
        super::records::VmRecord {
            id: self.id.clone(),
            uuid: self.uuid.clone(),
            labels: self.labels.clone(),
            boot_id: self.boot_id.clone(),
            created_unix: self.created_unix,
            ended_unix: self.ended_unix,
            state: self.state.name().into(),
            stop_reason: self.stop_reason.clone(),
            exit_code: self.exit.as_ref().and_then(|e| e.code),
            exit_signal: self.exit.as_ref().and_then(|e| e.signal),
            guest_exit_code: self.guest_exit_code,
            error: self.error.clone(),
            spec: self.spec.clone(),
            min: self.min,
            max: self.max,
            weight: self.weight,
            policy: self.active_policy().to_string(),
            request: self.request.clone(),
        }
    }

    /// Takes a fresh statistics sample into the smoothed throughput.
    fn smooth_ops(&mut self) {
        let Some(st) = &self.stats else { return };
        let (x, t) = (st.ops_per_sec, st.t_s);
        self.ops_smooth = Some(match self.ops_smooth {
            None => (x, 0.0, t),
            Some((m, v, t0)) if t > t0 => {
                let a = 1.0 - (-(t - t0) / OPS_TAU_S).exp();
                let d = x - m;
                (m + a * d, (1.0 - a) * (v + a * d * d), t)
            }
            Some(same) => same,
        });
    }

    /// The VM's sampled access rate as the host measures it, and its
    /// standard error (the worker's estimate: `None` before its sampler
    /// covered any memory).
    fn access_estimate(&self) -> Option<(f64, f64)> {
        let a = self.stats.as_ref()?.accesses?;
        (a.per_sec.is_finite() && a.se.is_finite()).then_some((a.per_sec, a.se))
    }

    /// The smoothed guest-reported ops/s and its standard error (the
    /// variance of an exponentially weighted mean of independent samples:
    /// `var a / (2 - a)` with `a` = 1 s / [`OPS_TAU_S`]).
    fn ops_estimate(&self) -> (f64, f64) {
        match self.ops_smooth {
            Some((m, v, _)) => {
                let a = 1.0 / OPS_TAU_S;
                (m, (v * a / (2.0 - a)).sqrt())
            }
            None => (0.0, 0.0),
        }
    }
}

/// Counters of the service (for the metrics).
#[derive(Clone, Debug, Default)]
pub struct ServiceCounters {
    /// Rebalancing rounds.
    pub rounds: u64,
    /// Capacity changes.
    pub moves: u64,
    /// Bytes moved.
    pub moved_bytes: u64,
    /// Bytes moved by optional moves (grants, exchanges), all rounds.
    pub optional_bytes: u64,
    /// The most bytes optional moves changed in one round.
    pub max_round_optional_bytes: u64,
    /// VM processes that died without a report or whose guest crashed.
    pub crashes: u64,
    /// VMs created.
    pub created: u64,
}

/// The mutable state.
#[derive(Debug)]
pub struct HostState {
    /// Fast pool, bytes.
    pub fast_pool: u64,
    /// Slow pool, bytes.
    pub slow_pool: u64,
    /// VMs by internal key (creation order).
    pub vms: BTreeMap<u64, VmEntry>,
    /// The number of the next generated id (`vm-N`): persisted in
    /// `STATE_DIR/service.json`, never reused.
    next_id: u64,
    next_key: u64,
    /// Counters.
    pub counters: ServiceCounters,
}

impl HostState {
    /// The VMs that hold capacity.
    fn active(&self) -> impl Iterator<Item = &VmEntry> {
        self.vms.values().filter(|v| v.state.holds_capacity())
    }

    /// Fast bytes reserved by admission (the mins of active VMs).
    pub fn fast_reserved(&self) -> u64 {
        self.active().map(|v| v.min).sum()
    }

    /// Slow bytes reserved (the slow capacity of active VMs).
    pub fn slow_reserved(&self) -> u64 {
        self.active().map(|v| v.spec.slow_bytes()).sum()
    }

    /// Fast bytes handed out: each VM's target, or its use while a shrink converges.
    pub fn fast_committed(&self) -> u64 {
        self.active().map(|v| v.target.max(fast_used(v))).sum()
    }

    fn find(&self, id: &str) -> Option<u64> {
        self.vms.iter().find(|(_, v)| v.id == id).map(|(k, _)| *k)
    }

    /// Forgets the oldest ended VMs (their reports collected) beyond
    /// `keep`; their logs and reports stay in the state directory.
    fn forget_oldest_ended(&mut self, keep: usize) {
        let forgettable = |v: &VmEntry| !v.state.active() && !v.report_on_its_way();
        let ended: Vec<u64> = (self.vms.iter())
            .filter(|(_, v)| forgettable(v))
            .map(|(&k, _)| k)
            .collect();
        for k in ended.iter().take(ended.len().saturating_sub(keep)) {
            self.vms.remove(k);
        }
    }
}

/// Time a `PATCH .../fast` spends sending resizes itself before it leaves
/// the rest to the rebalancer (each resize may wait up to its own timeout).
const INLINE_RESIZE_BUDGET: Duration = Duration::from_secs(1);

/// Ended VMs the service keeps in memory (state, last stats, report) for
/// GET; older ones are forgotten at the next create, their files kept.
pub const MAX_ENDED_VMS_KEPT: usize = 256;

fn fast_used(v: &VmEntry) -> u64 {
    v.stats
        .as_ref()
        .and_then(|s| s.tiers.first())
        .map_or(v.applied, |t| t.used_bytes)
}

/// Work for the collector thread (`serve-reports`, the one filtered
/// thread allowed to write files): an ended VM's report, a VM record.
enum ReportJob {
    /// Fetch the report of VM `key` and let its worker go.
    Report(u64, Option<Arc<WorkerLink>>),
    /// Write (`Some`) or remove (`None`) `vms/NAME.json`.
    Record(String, Option<Vec<u8>>),
}

/// One change the event stream reports (`GET /v1/events`).
pub type Event = super::types::EventInfo;

/// The recent events (a bounded ring) and the next sequence number.
#[derive(Default)]
struct EventLog {
    next: u64,
    ring: std::collections::VecDeque<Event>,
}

/// Events kept for `GET /v1/events?since=`.
const EVENTS_KEPT: usize = 4096;

/// The service.
pub struct Host {
    /// Settings.
    pub cfg: ServeConfig,
    state: Mutex<HostState>,
    wake: (Mutex<bool>, Condvar),
    shutting_down: AtomicBool,
    started: Instant,
    /// Ended VMs for the report collector ([`Host::run_report_collector`]).
    reports_tx: Mutex<mpsc::Sender<ReportJob>>,
    reports_rx: Mutex<Option<mpsc::Receiver<ReportJob>>>,
    /// Tells the report collector to end once its queue is empty.
    collector_stop: AtomicBool,
    /// The checked state directories (`None`: tests of the host alone,
    /// which write no file).
    dirs: Option<super::StateDirs>,
    /// This run of the service.
    pub boot_id: String,
    /// The run before, from `STATE_DIR/service.json`.
    pub previous_boot_id: Option<String>,
    events: Mutex<EventLog>,
    /// The latest event's sequence number (the long-poll waits on it).
    events_tx: tokio::sync::watch::Sender<u64>,
    /// When the rebalancer last went round its loop (`/readyz`).
    heartbeat: Mutex<Instant>,
}

fn unresponsive(v: &VmEntry) -> HostError {
    let silent = v
        .link
        .as_ref()
        .map_or(0.0, |l| l.silent_for().as_secs_f64());
    let why = v
        .link
        .as_ref()
        .and_then(|l| l.condition())
        .unwrap_or_else(|| "stopped, frozen or stuck".into());
    HostError::new(
        HostErrorKind::Unresponsive,
        format!(
            "VM {} is unresponsive: its process has not answered for {silent:.0} s ({why}); nothing was changed",
            v.id
        ),
        format!(
            "wait for it to answer again (GET /v1/vms/{} shows `running`), or DELETE /v1/vms/{}?force=true to kill it",
            v.id, v.id
        ),
    )
}

/// The state directory's `vms/NAME` (a VM's log) could not be created: a
/// link or another file planted there (the service never writes through a
/// link), or the directory was changed under the service. The operator's
/// to fix, not the client's.
fn log_error(name: &str, e: &std::io::Error) -> HostError {
    let what = match e.raw_os_error() {
        Some(libc::ELOOP) => {
            "is a symbolic link (the service never writes through a link)".to_string()
        }
        Some(libc::EISDIR) => "is a directory".to_string(),
        _ => format!("could not be created or opened for appending ({e})"),
    };
    HostError::new(
        HostErrorKind::StateDir,
        format!("the VM's log vms/{name} in the service's state directory {what}; no VM was created"),
        format!("the service's operator: remove vms/{name} from the state directory (something other than the service put it there), then retry"),
    )
}

fn not_found(id: &str) -> HostError {
    HostError::not_found(format!("no VM '{id}'"), "GET /v1/vms lists the VMs")
}

fn link_error(id: &str, e: &WorkerLinkError) -> HostError {
    match e {
        WorkerLinkError::Refused(Refusal { kind, message }) => {
            let (k, fix) = match kind {
                RefusalKind::NotReady => (
                    HostErrorKind::NotReady,
                    format!("retry in a moment (GET /v1/vms/{id} shows the state)"),
                ),
                RefusalKind::Ended => (HostErrorKind::Conflict, format!("the VM has ended: GET /v1/vms/{id} shows how")),
                RefusalKind::Invalid => (HostErrorKind::Invalid, "fix the request".to_string()),
                RefusalKind::Failed => (HostErrorKind::Worker, format!("GET /v1/vms/{id}; the VM's log is in the state directory")),
            };
            HostError::new(k, format!("VM {id}: {message}"), fix)
        }
        WorkerLinkError::Timeout(t) => HostError::new(
            HostErrorKind::WorkerTimeout,
            format!("VM {id}'s process did not answer within {:.1} s", t.as_secs_f64()),
            format!("retry; GET /v1/vms/{id} shows `unresponsive` once its process has been silent too long"),
        ),
        e => HostError::new(
            HostErrorKind::Worker,
            format!("VM {id}: {}", vmm_core::exit::chain(e)),
            "GET the VM to see its state; its log is in the state directory",
        ),
    }
}

fn aligned(what: &str, bytes: u64) -> Result<u64, HostError> {
    if bytes.is_multiple_of(SIZE_ALIGN) {
        Ok(bytes)
    } else {
        Err(HostError::bad_request(
            format!("{what} {} is not a multiple of 2M", format_size(bytes)),
            format!(
                "use e.g. {}",
                format_size(
                    bytes
                        .checked_next_multiple_of(SIZE_ALIGN)
                        .unwrap_or(bytes - bytes % SIZE_ALIGN)
                )
            ),
        ))
    }
}

/// The largest seed (2^53 - 1: every JSON parser reads it exactly).
pub const MAX_SEED: u64 = (1 << 53) - 1;

fn tiervm_guest_max_vcpus() -> usize {
    tiervm_guest::abi::MAX_VCPUS
}

/// A VM name a client may choose: 1 to 63 characters of `a-z`, `0-9`,
/// `.`, `_`, `-`, starting and ending with a letter or digit; `vm-N` is
/// the service's own (generated ids).
pub fn check_name(name: &str) -> Result<(), HostError> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let valid = (1..=63).contains(&name.len())
        && name.chars().all(ok_char)
        && alnum(name.chars().next())
        && alnum(name.chars().last());
    if !valid {
        return Err(HostError::bad_request(
            format!("'{name}' is not a VM name"),
            "give 1 to 63 characters of a-z, 0-9, '.', '_', '-', starting and ending with a letter or digit",
        ));
    }
    let generated = name
        .strip_prefix("vm-")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if generated {
        return Err(HostError::bad_request(
            format!("'{name}' is the form of the ids the service generates (vm-N)"),
            "choose another name, or POST /v1/vms for a generated id",
        ));
    }
    Ok(())
}

/// Labels: at most 32, keys of 1 to 63 characters of `A-Za-z0-9._/-`,
/// values of at most 256 printable characters.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), HostError> {
    let fix = "at most 32 labels; keys 1 to 63 characters of A-Z, a-z, 0-9, '.', '_', '/', '-'; values up to 256 printable characters";
    if labels.len() > 32 {
        return Err(HostError::bad_request(
            format!("{} labels", labels.len()),
            fix,
        ));
    }
    for (k, v) in labels {
        let key_ok = (1..=63).contains(&k.len())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
        if !key_ok {
            return Err(HostError::bad_request(
                format!("label key '{k}' is not valid"),
                fix,
            ));
        }
        if v.chars().count() > 256 || v.chars().any(char::is_control) {
            return Err(HostError::bad_request(
                format!("label '{k}': the value is not valid"),
                fix,
            ));
        }
    }
    Ok(())
}

/// A message of the VM's validation (written for `tiervm run`'s flags)
/// in the API's words: fields instead of flags, the image's name
/// instead of its host path.
fn api_words(message: &str, image_path: &str, image_name: &str) -> String {
    let mut m = message.to_string();
    if image_path != image_name {
        // The image's name, never its host path, and quoted once
        // (`image '/dir/f'` and `'/dir/f'` as well as a bare path).
        let named = format!("image '{image_name}'");
        m = m
            .replace(&format!("image '{image_path}'"), &named)
            .replace(&format!("'{image_path}'"), &named)
            .replace(image_path, &named);
    }
    for (flag, field) in [
        ("--vcpus", "vcpus"),
        ("--mem", "mem"),
        ("--arg", "args"),
        ("--fast", "fast.min"),
        ("--slow", "mem"),
        ("--duration", "duration"),
        ("--seed", "seed"),
        ("--policy", "policy"),
        ("--tracking", "tracking"),
        ("--stop-grace", "the service's defaults.stop_grace"),
        ("--emulate-latency", "emulate_latency"),
    ] {
        m = m.replace(flag, field);
    }
    m
}

/// A create request's fields, defaulted and checked.
struct CheckedCreate {
    vcpus: u32,
    mem: u64,
    /// The fast tier's min, max and weight.
    min: u64,
    max: u64,
    weight: f64,
    policy: String,
    tracking: String,
    /// Run length (zero: until the guest exits or the VM is stopped).
    duration: Duration,
}

fn check_weight(w: f64) -> Result<f64, HostError> {
    if w.is_finite() && w > 0.0 && w <= 1e6 {
        Ok(w)
    } else {
        Err(HostError::bad_request(
            format!("weight {w} is out of range"),
            "give a positive number up to 1e6",
        ))
    }
}

impl Host {
    /// A service with no VMs and no state directory (tests).
    pub fn new(cfg: ServeConfig) -> Arc<Self> {
        Self::build(cfg, None)
    }

    /// A service with no VMs writing into its checked state directories.
    pub fn with_dirs(cfg: ServeConfig, dirs: super::StateDirs) -> Arc<Self> {
        Self::build(cfg, Some(dirs))
    }

    fn build(cfg: ServeConfig, dirs: Option<super::StateDirs>) -> Arc<Self> {
        let (reports_tx, reports_rx) = mpsc::channel();
        let (events_tx, _) = tokio::sync::watch::channel(0);
        let previous = dirs
            .as_ref()
            .and_then(|d| super::records::load_service(&d.root));
        let boot_id = new_uuid();
        let mut vms = BTreeMap::new();
        let mut next_id = previous.as_ref().map_or(1, |p| p.next_id.max(1));
        if let Some(d) = &dirs {
            for (k, r) in super::records::load_vms(&cfg.state_dir, &d.vms, MAX_ENDED_VMS_KEPT)
                .into_iter()
                .enumerate()
            {
                if let Some(n) = r.id.strip_prefix("vm-").and_then(|n| n.parse::<u64>().ok()) {
                    next_id = next_id.max(n + 1);
                }
                vms.insert(k as u64 + 1, VmEntry::from_record(r));
            }
        }
        let next_key = vms.len() as u64 + 1;
        Arc::new(Self {
            previous_boot_id: previous.map(|p| p.boot_id),
            boot_id,
            events: Mutex::new(EventLog::default()),
            events_tx,
            heartbeat: Mutex::new(Instant::now()),
            dirs,
            reports_tx: Mutex::new(reports_tx),
            reports_rx: Mutex::new(Some(reports_rx)),
            collector_stop: AtomicBool::new(false),
            state: Mutex::new(HostState {
                fast_pool: cfg.fast_pool,
                slow_pool: cfg.slow_pool,
                vms,
                next_id,
                next_key,
                counters: ServiceCounters::default(),
            }),
            cfg,
            wake: (Mutex::new(false), Condvar::new()),
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
        })
    }

    /// Locks the state (metrics read it).
    pub fn state(&self) -> MutexGuard<'_, HostState> {
        lock(&self.state)
    }

    /// Locks the state with every VM's liveness brought up to date: a
    /// VM whose process has been silent beyond `limits.unresponsive_after`
    /// is `unresponsive` in every answer from that moment, whenever the
    /// rebalancer last looked (and `running` again once it spoke).
    pub fn fresh_state(&self) -> MutexGuard<'_, HostState> {
        let mut s = self.state();
        for v in s.vms.values_mut() {
            self.check_silence(v);
        }
        s
    }

    /// Moves a running VM silent beyond the setting to `unresponsive`, an
    /// unresponsive one that spoke since back to `running` (with events).
    fn check_silence(&self, v: &mut VmEntry) {
        let Some(silent) = v.link.as_ref().map(|l| l.silent_for()) else {
            return;
        };
        let silent = silent > self.cfg.unresponsive_after;
        match v.state {
            VmState::Running if silent => {
                self.set_state(v, VmState::Unresponsive);
                self.persist(v);
            }
            VmState::Unresponsive if !silent => {
                self.set_state(v, VmState::Running);
                self.persist(v);
            }
            _ => {}
        }
    }

    /// Whether the service is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Seconds since the service started.
    pub fn uptime_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn wake_rebalancer(&self) {
        *lock(&self.wake.0) = true;
        self.wake.1.notify_all();
    }

    /// Records `v` in `STATE_DIR/vms/ID.json` (through the collector
    /// thread, the one filtered thread that writes files).
    fn persist(&self, v: &VmEntry) {
        if self.dirs.is_none() {
            return;
        }
        match serde_json::to_vec_pretty(&v.record()) {
            Ok(b) => self.job(ReportJob::Record(v.id.clone(), Some(b))),
            Err(e) => tracing::warn!("recording VM {}: {e}", v.id),
        }
    }

    fn job(&self, job: ReportJob) {
        if let Err(mpsc::SendError(job)) = lock(&self.reports_tx).send(job) {
            // No collector (it ended): write here.
            self.run_job(job);
        }
    }

    /// Writes `STATE_DIR/service.json` (this run's boot id, the next
    /// generated id).
    fn persist_service(&self, next_id: u64) {
        if let Some(d) = &self.dirs {
            let r = super::records::ServiceRecord {
                boot_id: self.boot_id.clone(),
                started_unix: unix_now() - self.uptime_s(),
                next_id,
                pid: std::process::id(),
            };
            if let Err(e) = super::records::save_service(&d.root, &r) {
                tracing::warn!("writing service.json: {e}");
            }
        }
    }

    /// Called once at start-up: this run's record, and the records of
    /// VMs an earlier run lost.
    pub fn start_records(&self) {
        let s = self.state();
        self.persist_service(s.next_id);
        for v in s.vms.values().filter(|v| v.state == VmState::Lost) {
            self.persist(v);
        }
    }

    /// Appends an event (state lock may be held: the event log is only
    /// ever locked after it).
    fn emit(&self, mut ev: Event) {
        let mut log = lock(&self.events);
        log.next += 1;
        ev.seq = log.next;
        ev.time_unix = unix_now();
        log.ring.push_back(ev);
        while log.ring.len() > EVENTS_KEPT {
            log.ring.pop_front();
        }
        let seq = log.next;
        drop(log);
        self.events_tx.send_replace(seq);
    }

    /// Moves `v` to `to`, with an event.
    fn set_state(&self, v: &mut VmEntry, to: VmState) {
        if v.state == to {
            return;
        }
        let from = v.state;
        v.state = to;
        if !to.active() && v.ended_unix.is_none() {
            v.ended_unix = Some(unix_now());
        }
        self.emit(Event {
            kind: "vm_state".into(),
            vm: v.id.clone(),
            uuid: v.uuid.clone(),
            state: Some(to.name().into()),
            previous_state: Some(from.name().into()),
            ..Event::default()
        });
    }

    /// Events after `since`, and the latest sequence number.
    pub fn events_since(&self, since: u64) -> (Vec<Event>, u64) {
        let log = lock(&self.events);
        let evs = log.ring.iter().filter(|e| e.seq > since).cloned().collect();
        (evs, log.next)
    }

    /// A receiver woken at every event.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.events_tx.subscribe()
    }

    /// Seconds since the rebalancer last went round (`/readyz`).
    pub fn heartbeat_age_s(&self) -> f64 {
        lock(&self.heartbeat).elapsed().as_secs_f64()
    }

    fn refuse_if_shutting_down(&self) -> Result<(), HostError> {
        if self.shutting_down() {
            Err(HostError::shutting_down())
        } else {
            Ok(())
        }
    }

    // ---- host ----

    /// `GET /v1/host`.
    pub fn host_info(&self) -> HostInfo {
        let s = self.fresh_state();
        let mut vms: BTreeMap<String, u64> = VmState::ALL
            .iter()
            .map(|st| (st.name().to_string(), 0))
            .collect();
        for v in s.vms.values() {
            *vms.entry(v.state.name().into()).or_default() += 1;
        }
        let resident = |tier: usize| -> u64 {
            s.active()
                .filter_map(|v| v.stats.as_ref())
                .filter_map(|st| st.tiers.get(tier).and_then(|t| t.resident_bytes))
                .sum()
        };
        let fast_committed = s.fast_committed();
        let slow_reserved = s.slow_reserved();
        HostInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            emulated: self.cfg.emulated,
            pools: vec![
                PoolInfo {
                    tier: "fast".into(),
                    node: self.cfg.fast_node,
                    capacity_bytes: s.fast_pool,
                    reserved_bytes: s.fast_reserved(),
                    committed_bytes: fast_committed,
                    free_bytes: s.fast_pool.saturating_sub(fast_committed),
                    resident_bytes: resident(0),
                },
                PoolInfo {
                    tier: "slow".into(),
                    node: self.cfg.slow_node,
                    capacity_bytes: s.slow_pool,
                    reserved_bytes: slow_reserved,
                    committed_bytes: slow_reserved,
                    free_bytes: s.slow_pool.saturating_sub(slow_reserved),
                    resident_bytes: resident(1),
                },
            ],
            vms,
            vm_ids: s.vms.values().map(|v| v.id.clone()).collect(),
            boot_id: self.boot_id.clone(),
            previous_boot_id: self.previous_boot_id.clone(),
            shutting_down: self.shutting_down(),
            rebalance: RebalanceInfo {
                rounds: s.counters.rounds,
                moves: s.counters.moves,
                moved_bytes: s.counters.moved_bytes,
                optional_bytes: s.counters.optional_bytes,
                max_round_optional_bytes: s.counters.max_round_optional_bytes,
                period_s: self.cfg.period.as_secs_f64(),
                budget_bytes: self.cfg.division.budget_bytes,
                dwell_s: self.cfg.division.dwell_s,
                reverse_dwell_s: self.cfg.division.reverse_dwell_s,
                value: self.cfg.division.value.name().into(),
            },
        }
    }

    /// `PATCH /v1/host`.
    pub fn patch_host(&self, p: &PatchHost) -> Result<HostInfo, HostError> {
        self.refuse_if_shutting_down()?;
        {
            let mut s = self.state();
            let fast = p
                .fast_pool
                .map(|x| aligned("fast_pool", x.0))
                .transpose()?
                .unwrap_or(s.fast_pool);
            let slow = p
                .slow_pool
                .map(|x| aligned("slow_pool", x.0))
                .transpose()?
                .unwrap_or(s.slow_pool);
            let nodes = host_nodes().map_err(|e| HostError::internal(vmm_core::exit::chain(&e)))?;
            check_pools(fast, slow, self.cfg.fast_node, self.cfg.slow_node, &nodes)
                .map_err(|e| HostError::bad_request(vmm_core::exit::chain(&e), "lower the pool"))?;
            if fast < s.fast_reserved() {
                return Err(HostError::conflict(
                    format!(
                        "fast_pool {} is below the {} the VMs' mins reserve",
                        format_size(fast),
                        format_size(s.fast_reserved())
                    ),
                    "lower VMs' fast min (PATCH /v1/vms/{id}/fast) or delete VMs first",
                ));
            }
            if slow < s.slow_reserved() {
                return Err(HostError::conflict(
                    format!(
                        "slow_pool {} is below the {} the VMs reserve",
                        format_size(slow),
                        format_size(s.slow_reserved())
                    ),
                    "delete VMs first",
                ));
            }
            s.fast_pool = fast;
            s.slow_pool = slow;
        }
        self.wake_rebalancer();
        Ok(self.host_info())
    }

    // ---- VMs ----

    /// What a request's `image` names: a built-in image, or a file in the
    /// configured `image_dir` given by its file name. API clients are
    /// untrusted, and the service may run as root: no other host path is
    /// opened on their behalf.
    pub(super) fn image_of(&self, name: &str) -> Result<String, HostError> {
        let builtins = vmm_core::image::builtin_names();
        if builtins.contains(&name) {
            return Ok(name.to_string());
        }
        let builtins = builtins.join(", ");
        let Some(dir) = &self.cfg.image_dir else {
            return Err(HostError::bad_request(
                format!("image '{name}' is not a built-in image ({builtins}), and this service has no image_dir"),
                "name a built-in image, or set image_dir in the service's config file and name a file in it",
            ));
        };
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains('/')
            && !name.contains('\0');
        if !plain {
            return Err(HostError::bad_request(
                format!("image '{name}' is not a built-in image ({builtins}) nor a file name"),
                "name a built-in image, or a file of the service's image directory by its file name (no '/')",
            ));
        }
        // Opened as the service will see it, never through a link: a
        // link in the image directory is refused whatever it points to
        // (the answer says nothing of its target), a missing file names
        // no host path.
        let fix = "name a built-in image or a regular file in the service's image directory";
        let opened = std::fs::File::open(dir)
            .map(std::os::fd::OwnedFd::from)
            .and_then(|d| super::paths::open_read_at(&d, name));
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(HostError::bad_request(
                    format!("image '{name}' is not a built-in image ({builtins}) nor a file in the image directory"),
                    fix,
                ))
            }
            Err(_) => {
                return Err(HostError::bad_request(
                    format!("image '{name}' in the image directory is not a regular file the service may open (links are not followed)"),
                    fix,
                ))
            }
        };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Err(HostError::bad_request(
                format!("image '{name}' in the image directory is not a regular file the service may open (links are not followed)"),
                fix,
            ));
        }
        Ok(dir.join(name).to_string_lossy().into_owned())
    }

    /// `POST /v1/vms` (waits up to [`START_WAIT`] for the VM to start).
    pub fn create(self: &Arc<Self>, req: &CreateVm) -> Result<VmInfo, HostError> {
        self.create_named(req, None).map(|(_, v)| v)
    }

    /// `PUT /v1/vms/{name}`: creates the VM `name` (`Ok((true, _))`), or,
    /// when a VM of that name exists from the same request, answers it
    /// unchanged (`Ok((false, _))`: idempotent); a different request for
    /// an existing name is a conflict.
    pub fn put_vm(
        self: &Arc<Self>,
        name: &str,
        req: &CreateVm,
    ) -> Result<(bool, VmInfo), HostError> {
        check_name(name)?;
        {
            let s = self.state();
            if let Some(key) = s.find(name) {
                let v = &s.vms[&key];
                if v.request.as_ref() == Some(req) {
                    return Ok((false, info_of(v, self.cfg.emulated)));
                }
                return Err(HostError::conflict(
                    format!("VM '{name}' exists ({}) with a different request", v.state.name()),
                    "PUT the same request again, or DELETE the VM (twice once it ended: stop, then remove) first",
                ));
            }
        }
        self.create_named(req, Some(name))
    }

    fn create_named(
        self: &Arc<Self>,
        req: &CreateVm,
        name: Option<&str>,
    ) -> Result<(bool, VmInfo), HostError> {
        self.refuse_if_shutting_down()?;
        check_labels(&req.labels)?;
        let c = self.checked_create(req)?;
        // Admission first (read-only here; again under the lock below): a
        // VM that does not fit is a 409 whatever else the host would say.
        let image = self.image_of(&req.image)?;
        {
            let s = self.state();
            self.admit(&s, c.min, c.mem)?;
        }
        // The same validation as `tiervm run` (image, arguments, sizes),
        // here, so a bad request is a 400 before any process starts.
        let mut spec = self
            .spec_of(req, &c, image.clone())
            .and_then(|s| vmm_core::config::VmConfig::from_request(&s.vm).map(|_| s))
            .map_err(|e| {
                HostError::bad_request(
                    api_words(&vmm_core::exit::chain(&e), &image, &req.image),
                    "fix the request's field named above (GET /v1/openapi.json: the CreateVm schema)",
                )
            })?;
        let (key, id) = self.admit_new(req, name, c, &mut spec)?;
        if let Err(e) = self.spawn_worker(key, &spec) {
            if let Some(v) = self.state().vms.remove(&key) {
                self.job(ReportJob::Record(v.id, None));
            }
            return Err(e);
        }
        self.wake_rebalancer();
        // Answered at once: the VM shows `starting` until its worker built
        // it (GET /v1/vms/{id} shows `running`, or `failed` and why).
        self.vm_info(&id, false).map(|v| (true, v))
    }

    /// The fields of a create request, defaulted and checked (a 400 names
    /// the first one out of range).
    fn checked_create(&self, req: &CreateVm) -> Result<CheckedCreate, HostError> {
        let d = &self.cfg.defaults;
        let vcpus = req.vcpus.unwrap_or(d.vcpus);
        let max_vcpus = tiervm_guest_max_vcpus();
        if vcpus == 0 || vcpus as usize > max_vcpus {
            return Err(HostError::bad_request(
                format!("vcpus {vcpus} is out of range"),
                format!("give 1 to {max_vcpus}"),
            ));
        }
        if req.seed.is_some_and(|x| x > MAX_SEED) {
            return Err(HostError::bad_request(
                format!("seed {} is out of range", req.seed.unwrap_or(0)),
                format!("give 0 to {MAX_SEED} (2^53 - 1: exact in every JSON parser)"),
            ));
        }
        let mem = aligned("mem", req.mem.map_or(d.mem, |s| s.0))?;
        let fast = req.fast.clone().unwrap_or_default();
        let min = aligned("fast.min", fast.min.map_or(d.fast_min, |s| s.0))?;
        let max = aligned(
            "fast.max",
            fast.max.map_or(d.fast_max.unwrap_or(mem).min(mem), |s| s.0),
        )?;
        let weight = check_weight(fast.weight.unwrap_or(d.weight))?;
        if min > max || max > mem {
            return Err(HostError::bad_request(
                format!(
                    "fast min {} / max {} with mem {}: need min <= max <= mem",
                    format_size(min),
                    format_size(max),
                    format_size(mem)
                ),
                "lower fast.min or raise fast.max",
            ));
        }
        let policy = req.policy.clone().unwrap_or_else(|| d.policy.clone());
        check_policy(&policy)?;
        let tracking = req.tracking.clone().unwrap_or_else(|| d.tracking.clone());
        if !["hint-faults", "off"].contains(&tracking.as_str()) {
            return Err(HostError::bad_request(
                format!("tracking '{tracking}' is not hint-faults or off"),
                "use \"hint-faults\" (default) or \"off\"",
            ));
        }
        let duration = match &req.duration {
            None => Duration::ZERO,
            Some(t) => vmm_core::units::parse_duration(t)
                .map_err(|e| HostError::bad_request(e.to_string(), "e.g. \"60s\""))?,
        };
        Ok(CheckedCreate {
            vcpus,
            mem,
            min,
            max,
            weight,
            policy,
            tracking,
            duration,
        })
    }

    /// The worker's start of a checked request on `image` (no id yet; fast
    /// tier at the min until admission says what is free). A policy or
    /// tracking name the VM request does not know is the request's error.
    fn spec_of(
        &self,
        req: &CreateVm,
        c: &CheckedCreate,
        image: String,
    ) -> Result<WorkerStart, vmm_core::config::ConfigError> {
        let d = &self.cfg.defaults;
        let vm = VmRequest {
            image,
            args: req.args.clone(),
            mem_bytes: c.mem,
            vcpus: c.vcpus,
            seed: req.seed.unwrap_or(1),
            duration: c.duration,
            stop_grace: d.stop_grace,
            tiering: TieringRequest {
                fast: Some(c.min),
                // The slow tier holds the whole guest: a short fast tier never
                // fails a launch (the VM starts slow and is promoted later).
                slow: Some(c.mem),
                fast_node: Some(self.cfg.fast_node),
                slow_node: Some(self.cfg.slow_node),
                policy: Some(c.policy.parse::<PolicyArg>()?),
                tracking: Some(c.tracking.parse::<TrackingArg>()?),
                ..TieringRequest::default()
            },
            seccomp: super::seccomp_on(),
            // "" is the default preset: named, so answers and metrics say which.
            emulate_latency: req.emulate_latency.as_ref().map(|e| {
                if e.trim().is_empty() {
                    vmm_core::emulation::config::DEFAULT_PRESET.to_string()
                } else {
                    e.clone()
                }
            }),
            ..VmRequest::default()
        };
        Ok(WorkerStart {
            id: String::new(),
            vm,
            profile: ProfileSettings {
                quantum_pages: self.cfg.division.quantum / PAGE_SIZE as u64,
                curve_steps: 64,
                half_life_s: 20.0,
            },
        })
    }

    /// Admission under the lock: admits the VM, names it (`name`, or the
    /// next `vm-N`), sets `spec`'s id and starting fast size, and records
    /// it as starting. Returns its key and id.
    fn admit_new(
        &self,
        req: &CreateVm,
        name: Option<&str>,
        c: CheckedCreate,
        spec: &mut WorkerStart,
    ) -> Result<(u64, String), HostError> {
        let mut s = self.state();
        self.admit(&s, c.min, c.mem)?;
        if let Some(n) = name {
            if s.find(n).is_some() {
                return Err(HostError::conflict(
                    format!("VM '{n}' was created meanwhile"),
                    format!("GET /v1/vms/{n}"),
                ));
            }
        }
        // Start with the min if it is free now; else with what is free
        // (others give their spare back; the VM is promoted later).
        let free = s.fast_pool.saturating_sub(s.fast_committed());
        let start = c.min.min(free / SIZE_ALIGN * SIZE_ALIGN);
        spec.vm.tiering.fast = Some(start);
        s.forget_oldest_ended(MAX_ENDED_VMS_KEPT);
        let key = s.next_key;
        s.next_key += 1;
        let id = match name {
            Some(n) => n.to_string(),
            None => {
                let n = s.next_id;
                s.next_id += 1;
                // Persisted before the id is handed out: a restarted
                // service never generates it again.
                self.persist_service(s.next_id);
                format!("vm-{n}")
            }
        };
        spec.id = id.clone();
        s.counters.created += 1;
        let mut v = VmEntry::starting(
            id.clone(),
            spec.clone(),
            (c.min, c.max, c.weight),
            start,
            c.policy,
        );
        v.labels = req.labels.clone();
        v.boot_id = self.boot_id.clone();
        v.request = Some(req.clone());
        self.persist(&v);
        self.emit(Event {
            kind: "vm_state".into(),
            vm: v.id.clone(),
            uuid: v.uuid.clone(),
            state: Some(v.state.name().into()),
            ..Event::default()
        });
        s.vms.insert(key, v);
        Ok((key, id))
    }

    /// Admission of a VM with fast `min` and `mem` (docs/service.md).
    fn admit(&self, s: &HostState, min: u64, mem: u64) -> Result<(), HostError> {
        {
            if s.active().count() >= self.cfg.max_vms {
                return Err(HostError::conflict(
                    format!("{} VMs run: the service's limit", self.cfg.max_vms),
                    "delete a VM or raise limits.max_vms",
                ));
            }
            if s.fast_reserved() + min > s.fast_pool {
                return Err(HostError::conflict(
                    format!(
                        "fast min {} does not fit: {} of the {} fast pool are reserved by other VMs' mins",
                        format_size(min),
                        format_size(s.fast_reserved()),
                        format_size(s.fast_pool)
                    ),
                    "lower fast.min, lower other VMs' mins, or grow the pool (PATCH /v1/host)",
                ));
            }
            if s.slow_reserved() + mem > s.slow_pool {
                return Err(HostError::conflict(
                    format!(
                        "mem {} does not fit the slow pool: {} of {} reserved",
                        format_size(mem),
                        format_size(s.slow_reserved()),
                        format_size(s.slow_pool)
                    ),
                    "lower mem, delete VMs, or grow slow_pool (PATCH /v1/host)",
                ));
            }
        }
        Ok(())
    }

    fn spawn_worker(self: &Arc<Self>, key: u64, spec: &WorkerStart) -> Result<(), HostError> {
        // The log, opened in the checked directory, never through a link.
        let name = format!("{}.log", spec.id);
        let log = match &self.dirs {
            Some(d) => super::paths::create_file_at(&d.vms, &name, true, 0o600),
            None => std::fs::OpenOptions::new().write(true).open("/dev/null"),
        }
        .map_err(|e| log_error(&name, &e))?;
        let (h1, h2) = (Arc::downgrade(self), Arc::downgrade(self));
        let link = WorkerLink::spawn(
            &self.cfg.worker_exe,
            spec,
            log,
            move |ev| {
                if let Some(h) = h1.upgrade() {
                    h.on_event(key, ev);
                }
            },
            move || {
                if let Some(h) = h2.upgrade() {
                    h.on_channel_closed(key);
                }
            },
        )
        .map_err(|e| HostError::internal(vmm_core::exit::chain(&e)))?;
        let mut s = self.state();
        if let Some(v) = s.vms.get_mut(&key) {
            v.pid = Some(link.pid());
            v.link = Some(link);
        }
        Ok(())
    }

    /// An event from a worker (on its reader thread: never blocks on it).
    fn on_event(self: &Arc<Self>, key: u64, ev: FromWorker) {
        let mut s = self.state();
        let Some(v) = s.vms.get_mut(&key) else { return };
        match ev {
            FromWorker::Started { pid, notes } => {
                if v.state == VmState::Starting {
                    self.set_state(v, VmState::Running);
                }
                v.pid = Some(pid);
                v.notes = notes;
                self.persist(v);
            }
            FromWorker::Failed { error, .. } => {
                self.set_state(v, VmState::Failed);
                v.error = Some(error);
                self.persist(v);
            }
            FromWorker::Finished {
                stop_reason,
                crash,
                exit_code,
                ..
            } => {
                v.finished_event = true;
                let crashed = crash.is_some() || stop_reason == "crashed";
                self.set_state(
                    v,
                    if crashed {
                        VmState::Crashed
                    } else {
                        VmState::Stopped
                    },
                );
                v.error = crash;
                v.guest_exit_code = exit_code;
                // Who stopped it: a stop the service asked for (DELETE,
                // its own shutdown) ends as the end of a duration does
                // in the run's report; the VM says who asked.
                v.stop_reason = Some(match v.stop_cause {
                    Some(cause) if !crashed && stop_reason != "guest_exited" => cause.to_string(),
                    _ => stop_reason,
                });
                if v.error.is_none() && exit_code.is_some_and(|c| c != 0) {
                    v.error = Some(format!(
                        "the guest exited with code {:#x}",
                        exit_code.unwrap_or(0)
                    ));
                }
                self.persist(v);
                let link = v.link.clone();
                if crashed {
                    s.counters.crashes += 1;
                }
                drop(s);
                // Fetch the report and let the worker go, off this thread
                // (the reply arrives on it): the collector does.
                self.job(ReportJob::Report(key, link));
                return;
            }
            FromWorker::Reply { .. } => {}
        }
        drop(s);
        self.wake_rebalancer();
    }

    /// The report collector (its own thread, `serve-reports`): fetches the
    /// reports of ended VMs and writes VM records until
    /// [`Host::stop_report_collector`].
    pub fn run_report_collector(self: &Arc<Self>) {
        let Some(rx) = lock(&self.reports_rx).take() else {
            return;
        };
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(job) => self.run_job(job),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if self.collector_stop.load(Ordering::Acquire) {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn run_job(&self, job: ReportJob) {
        match job {
            ReportJob::Report(key, link) => self.collect(key, link),
            ReportJob::Record(id, bytes) => {
                let Some(d) = &self.dirs else { return };
                let name = format!("{id}.json");
                let r = match bytes {
                    Some(b) => super::paths::write_file_at(&d.vms, &name, &b),
                    None => super::paths::remove_at(&d.vms, &name),
                };
                if let Err(e) = r {
                    tracing::warn!("vms/{name}: {e}");
                }
            }
        }
    }

    /// Ends the report collector once its queue is empty.
    pub fn stop_report_collector(&self) {
        self.collector_stop.store(true, Ordering::Release);
    }

    /// After a VM ended: its report, written to the state directory, then
    /// the worker's exit.
    fn collect(&self, key: u64, link: Option<Arc<WorkerLink>>) {
        let Some(link) = link else { return };
        let report = match link.request(Command::Report, Duration::from_secs(10)) {
            Ok(Reply::Report { report }) => Some(report),
            _ => None,
        };
        let _ = link.request(Command::Exit, Duration::from_secs(5));
        let mut report = report;
        let mut s = self.state();
        if let Some(v) = s.vms.get_mut(&key) {
            // The worker ends a stop the service asked for as the end of a
            // duration (its run knows no more); the service knows who asked
            // and records it in the report it writes and serves, so that
            // the report and GET /v1/vms/{id} agree.
            if let (Some(cause), Some(serde_json::Value::Object(r))) = (v.stop_cause, &mut report) {
                if v.stop_reason.as_deref() == Some(cause) {
                    r.insert("stop_reason".into(), cause.into());
                }
            }
            if let (Some(r), Some(d)) = (&report, &self.dirs) {
                // Replaced atomically, never written through a link.
                let name = format!("{}.json", v.id);
                if let Err(e) =
                    super::paths::write_file_at(&d.reports, &name, r.to_string().as_bytes())
                {
                    tracing::warn!("writing reports/{name}: {e}");
                }
            }
            v.report = report;
        }
    }

    /// The worker's channel closed: the process ended (or is ending).
    fn on_channel_closed(self: &Arc<Self>, key: u64) {
        let link = self.state().vms.get(&key).and_then(|v| v.link.clone());
        let exit = link.as_ref().and_then(|l| l.reap(Duration::from_secs(5)));
        {
            let mut s = self.state();
            let mut crashed = false;
            if let Some(v) = s.vms.get_mut(&key) {
                v.exit = exit.clone();
                if v.stop_cause == Some("force_deleted") && !v.finished_event {
                    // Killed on request: stopped, not crashed.
                    self.set_state(v, VmState::Stopped);
                    v.stop_reason = Some("force_deleted".into());
                } else if v.state.active() && !v.finished_event {
                    // Died without saying why: killed or crashed.
                    self.set_state(v, VmState::Crashed);
                    v.stop_reason = Some("crashed".into());
                    v.error = Some(match &exit {
                        Some(ExitInfo {
                            signal: Some(sig), ..
                        }) => format!("the VM process was killed by signal {sig}"),
                        Some(ExitInfo { code: Some(c), .. }) => {
                            format!("the VM process exited with status {c} without a report")
                        }
                        _ => "the VM process ended without a report".into(),
                    });
                    crashed = true;
                } else if v.state.active() {
                    self.set_state(v, VmState::Stopped);
                }
                v.link = None;
                v.pid = None;
                self.persist(v);
            }
            if crashed {
                s.counters.crashes += 1;
            }
        }
        super::worker::release_free_heap();
        self.wake_rebalancer();
    }

    fn key_of(&self, id: &str) -> Result<u64, HostError> {
        self.state().find(id).ok_or_else(|| not_found(id))
    }

    fn link_of(&self, id: &str) -> Result<(u64, Arc<WorkerLink>), HostError> {
        let s = self.fresh_state();
        let key = s.find(id).ok_or_else(|| not_found(id))?;
        let v = &s.vms[&key];
        match (&v.link, v.state) {
            (Some(_), VmState::Unresponsive) => Err(unresponsive(v)),
            (Some(l), VmState::Running | VmState::Starting | VmState::Stopping) => {
                Ok((key, l.clone()))
            }
            _ => Err(HostError::conflict(
                format!("VM {id} is {}", v.state.name()),
                "this works on a running VM only",
            )),
        }
    }

    /// `GET /v1/vms`.
    pub fn list(&self) -> Vec<VmInfo> {
        let s = self.fresh_state();
        s.vms
            .values()
            .map(|v| info_of(v, self.cfg.emulated))
            .collect()
    }

    /// `GET /v1/vms/{id}`: never waits for the VM's process (the
    /// statistics are the rebalancer's, at most a second old; `live` is
    /// kept for callers and ignored).
    pub fn vm_info(&self, id: &str, _live: bool) -> Result<VmInfo, HostError> {
        let s = self.fresh_state();
        let key = s.find(id).ok_or_else(|| not_found(id))?;
        Ok(info_of(&s.vms[&key], self.cfg.emulated))
    }

    /// `DELETE /v1/vms/{id}`: `Ok(true)` when the VM was asked to stop
    /// (202; `force`: its process is killed), `Ok(false)` when an ended VM
    /// was removed (204, its record too). A VM asked to stop releases its
    /// capacity at once.
    pub fn delete(&self, id: &str, force: bool) -> Result<bool, HostError> {
        let key = self.key_of(id)?;
        let (state, link) = {
            let s = self.fresh_state();
            // Another DELETE may have removed it since.
            let v = s.vms.get(&key).ok_or_else(|| not_found(id))?;
            (v.state, v.link.clone())
        };
        if !state.active() {
            if let Some(v) = self.state().vms.remove(&key) {
                self.job(ReportJob::Record(v.id.clone(), None));
                self.emit(Event {
                    kind: "vm_removed".into(),
                    vm: v.id.clone(),
                    uuid: v.uuid.clone(),
                    ..Event::default()
                });
            }
            super::worker::release_free_heap();
            return Ok(false);
        }
        if force {
            if let Some(v) = self.state().vms.get_mut(&key) {
                v.stop_cause = Some("force_deleted");
                self.set_state(v, VmState::Stopping);
                self.persist(v);
            }
            if let Some(l) = link {
                l.kill();
            }
            self.wake_rebalancer();
            return Ok(true);
        }
        if state == VmState::Unresponsive {
            let s = self.state();
            return Err(s.vms.get(&key).map_or_else(|| not_found(id), unresponsive));
        }
        // Who asks is recorded before the stop is sent: the worker's
        // `finished` may arrive (on the reader thread) before the answer.
        let asked_first = self.state().vms.get_mut(&key).is_some_and(|v| {
            let first = v.stop_cause.is_none();
            if first {
                v.stop_cause = Some("deleted");
            }
            first
        });
        if let Some(l) = link {
            if let Err(e) = l.request(Command::Stop, STATS_TIMEOUT) {
                // Not asked after all (the VM runs on): forget who asked.
                if let Some(v) = self.state().vms.get_mut(&key) {
                    if asked_first && v.state.active() {
                        v.stop_cause = None;
                    }
                }
                return Err(link_error(id, &e));
            }
        }
        if let Some(v) = self.state().vms.get_mut(&key) {
            if v.state.active() {
                self.set_state(v, VmState::Stopping);
                self.persist(v);
            }
        }
        self.wake_rebalancer();
        Ok(true)
    }

    /// `PATCH /v1/vms/{id}/fast`.
    pub fn patch_fast(&self, id: &str, p: &FastRequest) -> Result<FastInfo, HostError> {
        self.refuse_if_shutting_down()?;
        {
            let mut s = self.fresh_state();
            let key = s.find(id).ok_or_else(|| not_found(id))?;
            let reserved_others = s.fast_reserved() - {
                let v = &s.vms[&key];
                if v.state.holds_capacity() {
                    v.min
                } else {
                    0
                }
            };
            let pool = s.fast_pool;
            let v = s.vms.get_mut(&key).expect("found above");
            if v.state == VmState::Unresponsive {
                return Err(unresponsive(v));
            }
            if !v.state.holds_capacity() {
                return Err(HostError::conflict(
                    format!("VM {id} is {}", v.state.name()),
                    "only a running VM's share can change",
                ));
            }
            let min = p
                .min
                .map(|x| aligned("min", x.0))
                .transpose()?
                .unwrap_or(v.min);
            let max = p
                .max
                .map(|x| aligned("max", x.0))
                .transpose()?
                .unwrap_or(v.max);
            let weight = p.weight.map(check_weight).transpose()?.unwrap_or(v.weight);
            if min > max || max > v.spec.vm.mem_bytes {
                return Err(HostError::bad_request(
                    format!(
                        "min {} / max {} with mem {}: need min <= max <= mem",
                        format_size(min),
                        format_size(max),
                        format_size(v.spec.vm.mem_bytes)
                    ),
                    "lower min or raise max",
                ));
            }
            if reserved_others + min > pool {
                return Err(HostError::conflict(
                    format!(
                        "min {} does not fit: {} of the {} fast pool are reserved by other VMs' mins",
                        format_size(min),
                        format_size(reserved_others),
                        format_size(pool)
                    ),
                    "lower min, lower other VMs' mins, or grow the pool (PATCH /v1/host)",
                ));
            }
            v.min = min;
            v.max = max;
            v.weight = weight;
        }
        self.wake_rebalancer();
        // Apply the mandatory part at once (the rebalancer also runs now),
        // within the request's time: resizes not sent by then are the
        // rebalancer's (the targets are set).
        self.rebalance_until(Some(Instant::now() + INLINE_RESIZE_BUDGET));
        let s = self.state();
        let key = s.find(id).ok_or_else(|| not_found(id))?;
        Ok(info_of(&s.vms[&key], self.cfg.emulated).fast)
    }

    /// `PUT /v1/vms/{id}/policy`: answered once the VM's worker queued the
    /// switch; its main thread takes it at its next sample (milliseconds),
    /// and `GET` shows `policy` (running) next to `policy_requested`.
    pub fn put_policy(&self, id: &str, p: &PutPolicy) -> Result<VmInfo, HostError> {
        self.refuse_if_shutting_down()?;
        check_policy(&p.policy)?;
        let (key, link) = self.link_of(id)?;
        let state = self.state().vms.get(&key).map(|v| v.state);
        if state != Some(VmState::Running) {
            return Err(HostError::conflict(
                format!("VM {id} is {}", state.map_or("gone", VmState::name)),
                "switch the policy of a running VM (GET shows its state)",
            ));
        }
        link.request(
            Command::SwitchPolicy {
                policy: p.policy.clone(),
            },
            STATS_TIMEOUT,
        )
        .map_err(|e| link_error(id, &e))?;
        if let Some(v) = self.state().vms.get_mut(&key) {
            v.policy_requested = p.policy.clone();
            v.policy_switches += 1;
        }
        self.vm_info(id, false)
    }

    /// `GET /v1/vms/{id}/report`.
    pub fn report(&self, id: &str) -> Result<serde_json::Value, HostError> {
        let s = self.state();
        let key = s.find(id).ok_or_else(|| not_found(id))?;
        let v = &s.vms[&key];
        match (&v.report, v.state) {
            (Some(r), _) => Ok(r.clone()),
            (None, st) if st.active() => Err(HostError::conflict(
                format!(
                    "VM {id} is {}: its report is written when it ends",
                    st.name()
                ),
                "DELETE the VM (it stops and writes its report), then GET the report",
            )),
            (None, _) if v.report_on_its_way() => Err(HostError::conflict(
                format!("VM {id}'s report is being collected"),
                "retry in a moment",
            )),
            (None, st) => Err(HostError::not_found(
                format!("VM {id} is {} and left no report", st.name()),
                format!("GET /v1/vms/{id} shows why (error, exit)"),
            )),
        }
    }

    // ---- rebalancing ----

    /// Runs the stats poller and the rebalancer until shutdown.
    pub fn run_rebalancer(self: &Arc<Self>) {
        let mut next_round = Instant::now() + self.cfg.period;
        while !self.shutting_down() {
            *lock(&self.heartbeat) = Instant::now();
            self.poll_stats();
            let now = Instant::now();
            let woken = std::mem::take(&mut *lock(&self.wake.0));
            if woken || now >= next_round {
                self.rebalance_until(None);
                if now >= next_round {
                    next_round = now + self.cfg.period;
                }
            }
            let g = lock(&self.wake.0);
            if !*g {
                let _ = self.wake.1.wait_timeout(g, STATS_PERIOD);
            }
        }
    }

    /// Asks every running VM for its statistics at once and waits (at
    /// most [`POLL_WAIT`] in all) for the answers; a VM whose process
    /// has been silent beyond `limits.unresponsive_after` becomes
    /// `unresponsive` (checked before and after the wait: within about a
    /// second of the setting), and `running` again once it answers.
    fn poll_stats(&self) {
        let links: Vec<(u64, Arc<WorkerLink>)> = self
            .fresh_state()
            .vms
            .iter()
            .filter(|(_, v)| matches!(v.state, VmState::Running | VmState::Unresponsive))
            .filter_map(|(k, v)| v.link.clone().map(|l| (*k, l)))
            .collect();
        let pending: Vec<_> = links
            .iter()
            .map(|(key, link)| (*key, link.start(Command::Stats)))
            .collect();
        let deadline = Instant::now() + POLL_WAIT;
        for (key, p) in pending {
            let got = p.ok().and_then(|p| {
                p.wait(deadline.saturating_duration_since(Instant::now()))
                    .ok()
            });
            let mut s = self.state();
            let Some(v) = s.vms.get_mut(&key) else {
                continue;
            };
            if let Some(Reply::Stats(st)) = got {
                let dt = v
                    .stats
                    .as_ref()
                    .map_or(0.0, |old| (st.t_s - old.t_s).max(0.0));
                if let Some(a) = st.accesses.filter(|a| a.per_sec.is_finite()) {
                    v.sampled_accesses += a.per_sec.max(0.0) * dt;
                }
                v.stats = Some(*st);
                v.smooth_ops();
            }
            self.check_silence(v);
        }
    }

    /// One division round: plan, then apply the capacity changes, sending
    /// no resize after `deadline` (those stay pending: a VM whose target
    /// differs from what it applied is resized at the next round).
    pub fn rebalance_until(&self, deadline: Option<Instant>) {
        let (keys, plan, shares) = {
            let s = self.state();
            let now = Instant::now();
            let (keys, shares): (Vec<u64>, Vec<Share>) = s
                .vms
                .iter()
                .filter(|(_, v)| v.state.holds_capacity())
                .map(|(k, v)| (*k, share_of(v, now, self.cfg.division.value)))
                .unzip();
            let plan = division::plan(s.fast_pool, &shares, &self.cfg.division);
            (keys, plan, shares)
        };
        let mut to_apply = Vec::new();
        {
            let mut s = self.state();
            s.counters.rounds += 1;
            s.counters.optional_bytes += plan.optional_bytes;
            s.counters.max_round_optional_bytes =
                s.counters.max_round_optional_bytes.max(plan.optional_bytes);
            for ((key, target), share) in keys.iter().zip(&plan.targets).zip(&shares) {
                let Some(v) = s.vms.get_mut(key) else {
                    continue;
                };
                if *target != share.target {
                    v.last_grew = Some(*target > share.target);
                    v.target = *target;
                    v.last_resize = Some(Instant::now());
                    self.emit(Event {
                        kind: "division".into(),
                        vm: v.id.clone(),
                        uuid: v.uuid.clone(),
                        fast_target_bytes: Some(*target),
                        previous_target_bytes: Some(share.target),
                        ..Event::default()
                    });
                    let moved = target.abs_diff(share.target);
                    s.counters.moves += 1;
                    s.counters.moved_bytes += moved;
                }
                let v = s.vms.get_mut(key).expect("present");
                if v.target != v.applied && v.state == VmState::Running {
                    if let Some(l) = v.link.clone() {
                        to_apply.push((*key, l, v.target));
                    }
                }
            }
        }
        for (key, link, target) in to_apply {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            match link.request(
                Command::SetCapacity {
                    tier: 0,
                    bytes: target,
                },
                STATS_TIMEOUT,
            ) {
                Ok(Reply::Capacity { bytes }) => {
                    if let Some(v) = self.state().vms.get_mut(&key) {
                        v.applied = bytes;
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("resizing VM {key}: {e}"),
            }
        }
    }

    // ---- shutdown ----

    /// Stops every VM (bounded), collects their reports, ends the workers.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.wake_rebalancer();
        let links: Vec<Arc<WorkerLink>> = self
            .state()
            .vms
            .values()
            .filter(|v| v.state.active())
            .filter_map(|v| v.link.clone())
            .collect();
        {
            let mut s = self.state();
            for v in s.vms.values_mut().filter(|v| v.state.active()) {
                if v.stop_cause.is_none() {
                    v.stop_cause = Some("service_stopped");
                }
            }
        }
        for l in &links {
            let _ = l.request(Command::Stop, STATS_TIMEOUT);
        }
        let grace = self.cfg.defaults.stop_grace + Duration::from_secs(20);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            let waiting = self
                .state()
                .vms
                .values()
                .any(|v| v.state.active() || v.report_on_its_way());
            if !waiting {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever is still alive is killed and reaped.
        for l in &links {
            if l.exited().is_none() {
                let _ = l.reap(Duration::from_millis(100));
            }
        }
    }
}

impl VmEntry {
    /// Whether the VM ended and the collector may still fetch its report
    /// (its end was reported and its worker is still linked).
    fn report_on_its_way(&self) -> bool {
        self.finished_event && self.report.is_none() && self.link.is_some()
    }

    /// The policy that runs (the worker's last word), else the one the VM
    /// was created with.
    pub fn active_policy(&self) -> &str {
        self.stats
            .as_ref()
            .map_or(self.policy.as_str(), |s| s.policy.as_str())
    }
}

/// What the division reads of a VM: its curves and, by `value`, the rate a
/// share is multiplied by (the host-measured access rate, or the guest's
/// own ops/s). Without a host-measured rate the VM is not valued (it keeps
/// its min and shares free capacity nobody values).
fn share_of(v: &VmEntry, now: Instant, value: Valuation) -> Share {
    let st = v.stats.as_ref();
    let gain = st.map(|s| &s.gain);
    let measured = match value {
        Valuation::HostAccesses => v.access_estimate(),
        Valuation::GuestOps => Some(v.ops_estimate()),
    };
    let (rate, rate_se) = measured.map_or((0.0, 0.0), |(r, se)| (r.max(0.0), se.max(0.0)));
    Share {
        min: v.min,
        max: v.max,
        weight: v.weight,
        target: v.target,
        used: st.and_then(|s| s.tiers.first()).map_or(0, |t| t.used_bytes),
        rate,
        rate_se,
        grow: gain.map(|g| g.grow.clone()).unwrap_or_default(),
        shrink: gain.map(|g| g.shrink.clone()).unwrap_or_default(),
        grow_se: gain.map(|g| g.grow_se.clone()).unwrap_or_default(),
        shrink_se: gain.map(|g| g.shrink_se.clone()).unwrap_or_default(),
        informed: measured.is_some() && gain.is_some_and(|g| g.samples >= MIN_SAMPLES),
        since_resize_s: v.last_resize.map(|t| now.duration_since(t).as_secs_f64()),
        last_grew: v.last_grew,
    }
}

/// The API view of a VM.
pub fn info_of(v: &VmEntry, emulated: bool) -> VmInfo {
    let st = v.stats.as_ref();
    VmInfo {
        id: v.id.clone(),
        uuid: v.uuid.clone(),
        labels: v.labels.clone(),
        boot_id: v.boot_id.clone(),
        created_unix: v.created_unix,
        ended_unix: v.ended_unix,
        state: v.state.name().into(),
        silent_s: v
            .link
            .as_ref()
            .filter(|_| v.state.active())
            .map(|l| l.silent_for().as_secs_f64()),
        process_condition: v
            .link
            .as_ref()
            .filter(|_| v.state == VmState::Unresponsive)
            .and_then(|l| l.condition()),
        pid: v.pid,
        image: v.spec.vm.image.clone(),
        args: v.spec.vm.args.clone(),
        mem_bytes: v.spec.vm.mem_bytes,
        vcpus: v.spec.vm.vcpus,
        policy: v.active_policy().to_string(),
        policy_requested: v.policy_requested.clone(),
        policy_error: st.and_then(|s| s.policy_error.clone()),
        policy_switches: v.policy_switches,
        fast: fast_info_of(v),
        tiers: tiers_of(v),
        uptime_s: v.created.elapsed().as_secs_f64(),
        ops: st.map_or(0, |s| s.ops),
        ops_per_sec: if v.state.active() {
            st.map_or(0.0, |s| s.ops_per_sec)
        } else {
            0.0
        },
        migration: migration_of(st),
        emulated,
        emulate_latency: v.spec.vm.emulate_latency.clone(),
        exit: v.exit.as_ref().map(|e| ExitInfoBody {
            code: e.code,
            signal: e.signal,
        }),
        stop_reason: v.stop_reason.clone(),
        guest_exit_code: v.guest_exit_code,
        error: v.error.clone(),
        notes: v.notes.clone(),
        report_ready: v.report.is_some(),
    }
}

/// A VM's fast-tier view: its share and what the worker reports.
fn fast_info_of(v: &VmEntry) -> FastInfo {
    let st = v.stats.as_ref();
    let fast_tier = st.and_then(|s| s.tiers.first());
    let used = fast_tier.map_or(0, |t| t.used_bytes);
    FastInfo {
        min_bytes: v.min,
        max_bytes: v.max,
        weight: v.weight,
        target_bytes: v.target,
        // The worker's answer to the last set-capacity (fresher than
        // the stats, which refresh once a second).
        capacity_bytes: v.applied,
        used_bytes: used,
        resident_bytes: fast_tier.and_then(|t| t.resident_bytes),
        converged: used <= v.target,
        gain: st
            .map(|s| &s.gain)
            .filter(|g| g.samples >= MIN_SAMPLES)
            .map(|g| {
                let accesses = v.access_estimate();
                GainInfo {
                    next_quantum_share: g.grow.first().copied().unwrap_or(0.0),
                    last_quantum_share: g.shrink.first().copied().unwrap_or(0.0),
                    samples: g.samples,
                    accesses_per_sec: accesses.map(|a| a.0),
                    accesses_per_sec_se: accesses.map(|a| a.1),
                }
            }),
    }
}

/// A running VM's tiers (none once it ended).
fn tiers_of(v: &VmEntry) -> Vec<VmTierInfo> {
    let st = v.stats.as_ref();
    if v.state.active() {
        st.map(|s| {
            s.tiers
                .iter()
                .map(|t| VmTierInfo {
                    name: t.name.clone(),
                    node: t.node,
                    capacity_bytes: t.capacity_bytes,
                    used_bytes: t.used_bytes,
                    resident_bytes: t.resident_bytes,
                })
                .collect()
        })
        .unwrap_or_default()
    } else {
        Vec::new()
    }
}

/// A VM's migration counters (zero before its first stats).
fn migration_of(st: Option<&WorkerStats>) -> MigrationInfo {
    st.map(|s| &s.mem)
        .map(|m| (&m.migration, m.hint_faults))
        .map(|(m, hint_faults)| MigrationInfo {
            promotions: m.promotions,
            demotions: m.demotions,
            tpm_commits: m.tpm_commits,
            tpm_aborts: m.tpm_aborts,
            shadow_demotions: m.shadow_demotions,
            shadow_reclaims: m.shadow_reclaims,
            guest_stall_seconds: m.guest_stall_ms / 1e3,
            hint_faults,
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, state: VmState) -> VmEntry {
        let spec = WorkerStart {
            id: id.into(),
            vm: VmRequest {
                image: "zipf".into(),
                mem_bytes: 64 << 20,
                vcpus: 1,
                seed: 1,
                duration: Duration::ZERO,
                stop_grace: Duration::from_secs(1),
                tiering: TieringRequest {
                    fast: Some(0),
                    slow: Some(64 << 20),
                    fast_node: Some(0),
                    slow_node: Some(0),
                    policy: Some(PolicyArg::Nomad),
                    ..TieringRequest::default()
                },
                seccomp: false,
                ..VmRequest::default()
            },
            profile: ProfileSettings {
                quantum_pages: 1,
                curve_steps: 1,
                half_life_s: 1.0,
            },
        };
        let mut v = VmEntry::starting(id.into(), spec, (0, 64 << 20, 1.0), 0, "nomad".into());
        v.state = state;
        v
    }

    const M: u64 = 1 << 20;

    /// A running VM whose worker reported `ops_per_sec` from its guest, and
    /// a host-measured access rate (`None`: the sampler covered nothing
    /// yet), with the same gain curve as every other.
    fn running(id: &str, ops_per_sec: f64, accesses: Option<f64>) -> VmEntry {
        let mut v = entry(id, VmState::Running);
        v.spec.vm.mem_bytes = 1 << 30;
        v.max = 1 << 30;
        let stats = |t_s: f64| WorkerStats {
            t_s,
            ops: (ops_per_sec * t_s) as u64,
            ops_per_sec,
            accesses: accesses.map(|per_sec| tiering::engine::profile::AccessRate {
                per_sec,
                se: 0.01 * per_sec,
                coverage: 1.0,
            }),
            gain: tiering::engine::profile::GainCurve {
                quantum_pages: 64 * M / PAGE_SIZE as u64,
                grow: vec![0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.02, 0.01],
                shrink: vec![0.4],
                samples: 10_000.0,
                grow_se: vec![0.001; 8],
                shrink_se: vec![0.001],
            },
            ..WorkerStats::default()
        };
        // Polled for a minute: the smoothed ops/s settle.
        for t in 1..=60 {
            v.stats = Some(stats(f64::from(t)));
            v.smooth_ops();
        }
        v
    }

    /// The fast targets division rounds give `vms` sharing `pool`, each VM
    /// filling its target between rounds (a receiver gets capacity at the
    /// rate it fills it), once they no longer change.
    fn divide(pool: u64, value: Valuation, vms: Vec<VmEntry>) -> Vec<u64> {
        let mut cfg = ServeConfig::for_tests();
        cfg.division.value = value;
        let host = Host::new(cfg);
        {
            let mut s = host.state();
            s.fast_pool = pool;
            for (k, v) in vms.into_iter().enumerate() {
                s.vms.insert(k as u64 + 1, v);
            }
        }
        let mut last = Vec::new();
        for _ in 0..32 {
            host.rebalance_until(None);
            let mut s = host.state();
            for v in s.vms.values_mut() {
                let target = v.target;
                if let Some(st) = v.stats.as_mut() {
                    st.tiers = vec![crate::protocol::TierNow {
                        capacity_bytes: target,
                        used_bytes: target,
                        ..crate::protocol::TierNow::default()
                    }];
                }
            }
            let now: Vec<u64> = s.vms.values().map(|v| v.target).collect();
            if now == last {
                break;
            }
            last = now;
        }
        last
    }

    #[test]
    fn a_guest_that_inflates_its_ops_counter_gets_no_more_fast_capacity() {
        // Two identical VMs (the same accesses seen by the host, the same
        // gain curves); one guest reports 100x the operations per second.
        for inflated_first in [false, true] {
            let honest = running("vm-1", 1_000.0, Some(50_000.0));
            let inflated = running("vm-2", 100_000.0, Some(50_000.0));
            let vms = if inflated_first {
                vec![inflated, honest]
            } else {
                vec![honest, inflated]
            };
            let t = divide(512 * M, Valuation::HostAccesses, vms);
            assert_eq!(
                t,
                vec![256 * M, 256 * M],
                "the spare splits evenly (inflated first: {inflated_first})"
            );
        }
    }

    #[test]
    fn guest_ops_valuation_believes_the_guest_and_host_accesses_follow_real_accesses() {
        // The opt-in for trusted guests reads the counter: the inflated
        // guest draws the spare (what `host-accesses` closes).
        let t = divide(
            512 * M,
            Valuation::GuestOps,
            vec![
                running("vm-1", 1_000.0, Some(50_000.0)),
                running("vm-2", 100_000.0, Some(50_000.0)),
            ],
        );
        assert!(t[1] > t[0], "{t:?}");
        // A VM that really accesses its memory 100x as often is worth more.
        let t = divide(
            512 * M,
            Valuation::HostAccesses,
            vec![
                running("vm-1", 1_000.0, Some(500.0)),
                running("vm-2", 1_000.0, Some(50_000.0)),
            ],
        );
        assert!(t[1] > t[0], "{t:?}");
        // No host-measured rate yet (no sampler pass): not valued, however
        // much the guest reports; the other VM's accesses are.
        let t = divide(
            512 * M,
            Valuation::HostAccesses,
            vec![
                running("vm-1", 1e9, None),
                running("vm-2", 1_000.0, Some(50_000.0)),
            ],
        );
        assert_eq!(t[1], 512 * M, "{t:?}");
    }

    /// A VM's UUID is a random version 4 UUID: the layout, version and
    /// variant of RFC 9562, and every other byte random (not a counter or a
    /// clock: those leave bytes that never change).
    #[test]
    fn new_uuids_are_random_version_4_uuids() {
        let ids: Vec<String> = (0..32).map(|_| new_uuid()).collect();
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        for id in &ids {
            let parts: Vec<&str> = id.split('-').collect();
            let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            assert_eq!(lens, vec![8, 4, 4, 4, 12], "{id}");
            let hex: String = parts.concat();
            let b: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            assert_eq!(b[6] >> 4, 4, "version 4: {id}");
            assert_eq!(b[8] >> 6, 0b10, "variant: {id}");
            bytes.push(b);
        }
        let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for i in 0..16 {
            let seen: std::collections::BTreeSet<u8> = bytes.iter().map(|b| b[i]).collect();
            assert!(seen.len() > 1, "byte {i} never changes: {ids:?}");
        }
    }

    /// Timestamps are the real time (seconds since the epoch).
    #[test]
    fn unix_now_is_the_real_time() {
        let sys = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs_f64();
        assert!((unix_now() - sys).abs() < 60.0, "{} vs {sys}", unix_now());
    }

    /// The API's state names (docs/service.md), and which states hold pool
    /// capacity: a VM asked to stop releases its reservations at once.
    #[test]
    fn states_have_their_api_names_and_only_live_ones_hold_capacity() {
        let names: Vec<&str> = VmState::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "starting",
                "running",
                "unresponsive",
                "stopping",
                "stopped",
                "crashed",
                "failed",
                "lost"
            ]
        );
        let holding: Vec<&str> = VmState::ALL
            .iter()
            .filter(|s| s.holds_capacity())
            .map(|s| s.name())
            .collect();
        assert_eq!(holding, ["starting", "running", "unresponsive"]);
    }

    /// A record read back at the service's start: an ended VM keeps its
    /// state and how it ended; one that was alive is `lost`.
    #[test]
    fn records_of_an_earlier_run_come_back_ended_or_lost() {
        let mut r = entry("vm-1", VmState::Stopped).record();
        r.exit_code = Some(3);
        let v = VmEntry::from_record(r.clone());
        assert_eq!(v.state, VmState::Stopped);
        assert_eq!(
            v.exit.as_ref().map(|e| (e.code, e.signal)),
            Some((Some(3), None))
        );
        r.exit_code = None;
        r.exit_signal = Some(9);
        r.state = "crashed".into();
        let v = VmEntry::from_record(r.clone());
        assert_eq!(v.state, VmState::Crashed);
        assert_eq!(
            v.exit.as_ref().map(|e| (e.code, e.signal)),
            Some((None, Some(9)))
        );
        r.exit_signal = None;
        r.state = "running".into();
        let v = VmEntry::from_record(r);
        assert_eq!(v.state, VmState::Lost);
        assert!(v.exit.is_none());
        assert_eq!(v.stop_reason.as_deref(), Some("service_lost"));
    }

    /// The guest's ops/s smoothed over `OPS_TAU_S` (an exponentially
    /// weighted mean and variance, by the time between samples), and the
    /// standard error the division reads.
    #[test]
    fn guest_ops_are_smoothed_by_the_time_between_samples() {
        let mut v = entry("vm-1", VmState::Running);
        assert_eq!(v.ops_estimate(), (0.0, 0.0));
        let sample = |ops_per_sec: f64, t_s: f64| WorkerStats {
            t_s,
            ops_per_sec,
            ..WorkerStats::default()
        };
        v.stats = Some(sample(100.0, 10.0));
        v.smooth_ops();
        assert_eq!(v.ops_smooth, Some((100.0, 0.0, 10.0)));
        v.stats = Some(sample(200.0, 10.0 + OPS_TAU_S));
        v.smooth_ops();
        let a = 1.0 - (-1.0f64).exp();
        let (m, var) = (100.0 + a * 100.0, (1.0 - a) * a * 100.0 * 100.0);
        let Some((m2, v2, t2)) = v.ops_smooth else {
            panic!("smoothed")
        };
        assert!(
            (m2 - m).abs() < 1e-9 && (v2 - var).abs() < 1e-6,
            "{m2} {v2}"
        );
        assert_eq!(t2, 10.0 + OPS_TAU_S);
        // A sample no newer than the last changes nothing.
        v.stats = Some(sample(1e6, 10.0));
        v.smooth_ops();
        assert_eq!(v.ops_smooth, Some((m2, v2, t2)));
        let k = 1.0 / OPS_TAU_S;
        let (em, ese) = v.ops_estimate();
        assert_eq!(em, m2);
        assert!((ese - (v2 * k / (2.0 - k)).sqrt()).abs() < 1e-9, "{ese}");
    }

    /// The host-measured access rate is read only when both it and its
    /// error are numbers.
    #[test]
    fn an_access_rate_or_error_that_is_no_number_is_no_estimate() {
        let mut v = entry("vm-1", VmState::Running);
        assert_eq!(v.access_estimate(), None);
        for (per_sec, se, want) in [
            (5.0, 0.5, Some((5.0, 0.5))),
            (5.0, f64::NAN, None),
            (f64::INFINITY, 0.5, None),
        ] {
            v.stats = Some(WorkerStats {
                accesses: Some(tiering::engine::profile::AccessRate {
                    per_sec,
                    se,
                    coverage: 1.0,
                }),
                ..WorkerStats::default()
            });
            assert_eq!(v.access_estimate(), want, "{per_sec} {se}");
        }
    }

    /// What admission counts as reserved: the mins (fast) and slow sizes of
    /// the VMs that hold capacity, not of those stopping or ended.
    #[test]
    fn reservations_count_the_vms_that_hold_capacity() {
        let host = Host::new(ServeConfig::for_tests());
        let mut s = host.state();
        for (k, st) in VmState::ALL.into_iter().enumerate() {
            let mut v = entry(&format!("vm-{k}"), st);
            v.min = (k as u64 + 1) * M;
            s.vms.insert(k as u64 + 1, v);
        }
        // starting (1), running (2), unresponsive (3).
        assert_eq!(s.fast_reserved(), 6 * M);
        assert_eq!(s.slow_reserved(), 3 * 64 * M);
    }

    #[test]
    fn the_oldest_ended_vms_are_forgotten_and_running_ones_never() {
        let host = Host::new(ServeConfig::for_tests());
        let mut s = host.state();
        for k in 1..=10u64 {
            let st = if k % 3 == 0 {
                VmState::Running
            } else {
                VmState::Stopped
            };
            let mut e = entry(&format!("vm-{k}"), st);
            // Ended with their `finished` seen but no report and no worker
            // left to fetch it from: nothing is on its way.
            e.finished_event = k <= 2;
            s.vms.insert(k, e);
        }
        s.forget_oldest_ended(3);
        let left: Vec<u64> = s.vms.keys().copied().collect();
        // Ended: 1, 2, 4, 5, 7, 8, 10; the newest 3 stay.
        assert_eq!(left, vec![3, 6, 7, 8, 9, 10]);
        assert_eq!(s.find("vm-7"), Some(7));
        assert_eq!(s.find("vm-2"), None);
        assert_eq!(s.find("vm-x"), None);
        assert_eq!(s.find("7"), None);
    }

    #[test]
    fn the_event_log_keeps_the_latest_events_only() {
        // Creates whose worker cannot start: one event each (`starting`),
        // nothing else left behind.
        let mut cfg = ServeConfig::for_tests();
        cfg.fast_pool = 64 << 20;
        cfg.slow_pool = 1 << 30;
        let host = Host::new(cfg);
        let req: CreateVm = serde_json::from_str(r#"{"image":"zipf","args":["rss=16M"]}"#).unwrap();
        let n = EVENTS_KEPT as u64 + 5;
        for _ in 0..n {
            let e = host.create(&req).expect_err("no worker program");
            assert_eq!(e.kind, HostErrorKind::Internal);
        }
        let (events, last) = host.events_since(0);
        assert_eq!(last, n);
        assert_eq!(events.len(), EVENTS_KEPT);
        assert_eq!(
            events.first().map(|e| e.seq),
            Some(n - EVENTS_KEPT as u64 + 1)
        );
        assert!(host.state().vms.is_empty());
    }

    #[test]
    fn an_ended_vm_is_kept_only_while_its_report_is_on_its_way() {
        use std::os::unix::fs::PermissionsExt;
        // A worker that holds its channel until the service's end closes.
        let dir = std::env::temp_dir().join(format!("tiervm-forget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("worker.sh");
        let body = format!(
            "#!/bin/sh\nexec cat <&{} >/dev/null\n",
            super::super::worker::CHANNEL_FD
        );
        std::fs::write(&exe, body).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = || {
            let log = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .unwrap();
            let spec = entry("w", VmState::Stopped).spec;
            WorkerLink::spawn(&exe, &spec, log, |_| {}, || {}).expect("a stand-in worker")
        };
        let host = Host::new(ServeConfig::for_tests());
        let mut s = host.state();
        // (finished seen, report collected, worker still linked)
        let cases = [
            (true, false, true), // its report is on its way: kept
            (false, false, true),
            (true, true, true),
            (true, false, false),
            (false, false, false),
        ];
        for (k, (finished, report, linked)) in cases.into_iter().enumerate() {
            let mut e = entry(&format!("vm-{k}"), VmState::Stopped);
            e.finished_event = finished;
            e.report = report.then(|| serde_json::json!({}));
            e.link = linked.then(link);
            s.vms.insert(k as u64, e);
        }
        s.forget_oldest_ended(0);
        let left: Vec<u64> = s.vms.keys().copied().collect();
        assert_eq!(left, vec![0]);
        for v in s.vms.values() {
            if let Some(l) = &v.link {
                l.kill();
            }
        }
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
