//! A stand-in worker that speaks the worker protocol (`protocol.rs`), and
//! a service (`host::Host` with its rebalancer and report collector
//! threads) that runs its VMs on it: in process, no KVM, no guest. The
//! service's lifecycle, requests and division are tested here against a
//! worker that answers at once; the real worker and real VMs are
//! `tests/serve.rs`' (minutes of this host per run).
//!
//! The stand-in is this test binary itself: the service runs a wrapper
//! script (the config's `worker_exe`) that starts the binary again with
//! only its `stand_in_worker` test selected and `TIERVM_STAND_IN_WORKER`
//! set; that test then serves the channel the service placed at
//! `CHANNEL_FD` and exits. Run any other way, that test does nothing.
//!
//! What the stand-in does follows its VM's id (its name's first word):
//! - `fail-…`: reports that the VM could not be built, and exits;
//! - `starting-…`: never reports the VM started, refuses every request
//!   as not ready;
//! - `crash-…`: a stop ends in a guest crash; `exit3-…`: the guest exits
//!   with code 3 when stopped;
//! - `oops-…`: a stop ends in a crash the worker cannot describe;
//! - `noreport-…`: has no report to give when its VM ended;
//! - `slowreport-…`: gives its report only after [`REPORT_TIME`];
//! - `slowstop-…`: never ends once asked to stop, and refuses a second
//!   stop as not ready;
//! - `refuse-…`: refuses policy switches ([`refusal_for`] says how);
//! - `die-…`: exits with status 3 when asked to stop, saying nothing;
//! - `quick-…`: says the VM ended at once when asked to stop (the others
//!   after [`STOP_TIME`], as a guest takes a moment to stop);
//! - `hot-…`: a host-measured access rate ten times the others';
//! - `unmeasured-…`: no host-measured access rate (its sampler has not
//!   covered memory yet), a gain curve all the same;
//! - `sticky-…`: a shrink of its fast tier never converges (its use
//!   stays where it was);
//! - anything else (`vm-N` too): a VM that runs until it is stopped.
//!
//! Each stand-in appends the capacity of each `set-capacity` it gets to
//! `DIR/resizes-ID`. While the file `DIR/mute-ID` exists it answers
//! nothing (a stopped or stuck worker, alive but silent). Its numbers
//! (statistics, gain curves) are made up: the tests check what the
//! service does with them, never a placement.

#![allow(dead_code)] // each test file uses part of the harness

use std::io::{BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tiering::engine::profile::{AccessRate, GainCurve};
use tiering::mem::MemStats;
use vmm_service::config::ServeConfig;
use vmm_service::host::Host;
use vmm_service::host_error::HostError;
use vmm_service::protocol::{
    encode, read_line, Command, FromWorker, Refusal, RefusalKind, Reply, TierNow, ToWorker,
    WorkerStats,
};
use vmm_service::types::{CreateVm, VmInfo};
use vmm_service::worker::CHANNEL_FD;

/// Set (to the harness' directory) in the stand-in's environment.
const STAND_IN: &str = "TIERVM_STAND_IN_WORKER";

pub const M: u64 = 1 << 20;

/// Guest ops per second every stand-in reports.
pub const OPS_PER_SEC: f64 = 1000.0;

/// The host-measured access rate of a stand-in (`hot-…`: ten times).
pub fn accesses_per_sec(id: &str) -> f64 {
    if id.starts_with("hot-") {
        50_000.0
    } else {
        5_000.0
    }
}

/// How long a stand-in's guest takes to stop (but `quick-…`'s).
pub const STOP_TIME: Duration = Duration::from_millis(500);

/// How long a `slowreport-…` stand-in takes to give its report.
pub const REPORT_TIME: Duration = Duration::from_secs(2);

/// Promotions every stand-in reports (its other migration counters are 8
/// to 13, its guest stall 2.5 s).
pub const PROMOTIONS: u64 = 7;

/// The test binary's entry as a worker: serves the channel and exits
/// when started by the wrapper script; does nothing otherwise.
pub fn worker_main() {
    let Ok(dir) = std::env::var(STAND_IN) else {
        return;
    };
    std::process::exit(match serve_channel(Path::new(&dir)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("stand-in worker: {e}");
            1
        }
    });
}

struct Worker {
    id: String,
    dir: PathBuf,
    out: UnixStream,
    capacity: u64,
    /// The fast tier's use (the capacity but for `sticky-…`).
    used: u64,
    slow: u64,
    policy: String,
    /// Pages per step of the gain curve (the service's quantum).
    quantum_pages: u64,
    started: Instant,
    ended: bool,
}

fn serve_channel(dir: &Path) -> std::io::Result<()> {
    // SAFETY: the service placed its end of the channel at CHANNEL_FD
    // (dup2 in its pre_exec, kept through the wrapper's exec); this
    // process opens nothing else there and this is its only owner.
    let chan = unsafe { UnixStream::from_raw_fd(CHANNEL_FD) };
    let out = chan.try_clone()?;
    let mut lines = BufReader::new(chan);
    let Some(first) = read_line(&mut lines)? else {
        return Ok(());
    };
    let Ok(ToWorker::Start(spec)) = serde_json::from_slice(&first) else {
        return Err(std::io::Error::other("the first line is no start"));
    };
    let policy = serde_json::to_value(spec.vm.tiering.policy)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut w = Worker {
        id: spec.id.clone(),
        dir: dir.to_path_buf(),
        out,
        capacity: spec.vm.tiering.fast.unwrap_or(0),
        used: spec.vm.tiering.fast.unwrap_or(0),
        slow: spec.slow_bytes(),
        policy,
        quantum_pages: spec.profile.quantum_pages,
        started: Instant::now(),
        ended: false,
    };
    if w.id.starts_with("fail-") {
        return w.send(&FromWorker::Failed {
            error: "stand-in: the VM could not be built".into(),
            usage: false,
        });
    }
    if !w.id.starts_with("starting-") {
        w.send(&FromWorker::Started {
            pid: std::process::id(),
            notes: vec!["stand-in worker".into()],
        })?;
    }
    while let Some(line) = read_line(&mut lines)? {
        let Ok(ToWorker::Request { id, command }) = serde_json::from_slice(&line) else {
            continue;
        };
        if w.dir.join(format!("mute-{}", w.id)).exists() {
            continue;
        }
        if !w.answer(id, command)? {
            return Ok(());
        }
    }
    Ok(())
}

impl Worker {
    fn send(&mut self, m: &FromWorker) -> std::io::Result<()> {
        self.out
            .write_all(&encode(m).map_err(std::io::Error::other)?)
    }

    fn reply(&mut self, id: u64, result: Result<Reply, Refusal>) -> std::io::Result<()> {
        self.send(&FromWorker::Reply { id, result })
    }

    /// Answers one command; `false`: exit.
    fn answer(&mut self, id: u64, command: Command) -> std::io::Result<bool> {
        if self.id.starts_with("starting-") {
            let no = Refusal::new(RefusalKind::NotReady, "the VM is still starting");
            self.reply(id, Err(no))?;
            return Ok(true);
        }
        let result = match command {
            Command::Stats => Ok(Reply::Stats(Box::new(self.stats()))),
            Command::SetCapacity { tier: 0, bytes } => {
                self.log_resize(bytes)?;
                self.capacity = bytes;
                if !self.id.starts_with("sticky-") || bytes > self.used {
                    self.used = bytes;
                }
                Ok(Reply::Capacity { bytes })
            }
            Command::SetCapacity { tier, .. } => Err(Refusal::new(
                RefusalKind::Invalid,
                format!("no tier {tier} to resize"),
            )),
            Command::SwitchPolicy { policy } if self.id.starts_with("refuse-") => {
                Err(Refusal::new(
                    refusal_for(&policy),
                    format!("{policy}: refused by the stand-in"),
                ))
            }
            Command::SwitchPolicy { policy } => {
                self.policy = policy;
                Ok(Reply::Ok)
            }
            Command::Report if self.id.starts_with("noreport-") => {
                Err(Refusal::new(RefusalKind::Failed, "the report was lost"))
            }
            Command::Report if self.ended => {
                if self.id.starts_with("slowreport-") {
                    std::thread::sleep(REPORT_TIME);
                }
                Ok(Reply::Report {
                    report: serde_json::json!({ "id": self.id, "stop_reason": "duration" }),
                })
            }
            Command::Report => Err(Refusal::new(RefusalKind::NotReady, "still running")),
            Command::Stop => return self.stop(id).map(|()| true),
            Command::Exit => {
                self.reply(id, Ok(Reply::Ok))?;
                return Ok(false);
            }
        };
        self.reply(id, result).map(|()| true)
    }

    /// Answers a stop and, but for `slowstop-…` and `die-…`, reports the
    /// VM's end.
    fn stop(&mut self, id: u64) -> std::io::Result<()> {
        if self.id.starts_with("slowstop-") {
            let result = if self.ended {
                Err(Refusal::new(
                    RefusalKind::NotReady,
                    "the VM is stopping already",
                ))
            } else {
                Ok(Reply::Ok)
            };
            self.ended = true;
            return self.reply(id, result);
        }
        self.reply(id, Ok(Reply::Ok))?;
        if self.id.starts_with("die-") {
            std::process::exit(3);
        }
        self.ended = true;
        // A guest takes a moment to stop; `quick-…` ends at once.
        if !self.id.starts_with("quick-") {
            std::thread::sleep(STOP_TIME);
        }
        self.send(&self.finished())
    }

    /// Appends `bytes` to `DIR/resizes-ID` (what the service asked).
    fn log_resize(&self, bytes: u64) -> std::io::Result<()> {
        let path = self.dir.join(format!("resizes-{}", self.id));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(f, "{bytes}")
    }

    fn finished(&self) -> FromWorker {
        let (stop_reason, exit_code, crash) = match self.id.split('-').next() {
            Some("crash") => ("crashed", None, Some("stand-in: the guest crashed".into())),
            Some("exit3") => ("guest_exited", Some(3), None),
            Some("oops") => ("crashed", None, None),
            _ => ("duration", Some(0), None),
        };
        FromWorker::Finished {
            stop_reason: stop_reason.into(),
            exit_code,
            crash,
            process_exit: 0,
        }
    }

    fn stats(&self) -> WorkerStats {
        let t_s = self.started.elapsed().as_secs_f64();
        let mut mem = MemStats::default();
        let m = &mut mem.migration;
        (m.promotions, m.demotions, m.tpm_commits, m.tpm_aborts) = (PROMOTIONS, 8, 9, 10);
        (m.shadow_demotions, m.shadow_reclaims, m.guest_stall_ms) = (12, 13, 2500.0);
        mem.hint_faults = 11;
        let per_sec = accesses_per_sec(&self.id);
        let measured = !self.id.starts_with("unmeasured-");
        WorkerStats {
            t_s,
            ops: (t_s * OPS_PER_SEC) as u64,
            ops_per_sec: OPS_PER_SEC,
            accesses: measured.then_some(AccessRate {
                per_sec,
                se: per_sec / 100.0,
                coverage: 1.0,
            }),
            policy: self.policy.clone(),
            tiers: vec![
                tier_now("fast", self.capacity, self.used),
                tier_now("slow", self.slow, self.slow / 2),
            ],
            mem,
            gain: GainCurve {
                quantum_pages: self.quantum_pages,
                // Each quantum more is worth less (a skewed working set).
                grow: vec![0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.02, 0.01],
                shrink: vec![0.4],
                samples: 1000.0,
                grow_se: vec![0.001; 8],
                shrink_se: vec![0.001],
            },
            emulated: true,
            ..WorkerStats::default()
        }
    }
}

/// How a `refuse-…` stand-in refuses a switch to `policy`.
pub fn refusal_for(policy: &str) -> RefusalKind {
    match policy {
        "memtis" => RefusalKind::Ended,
        "colloid" => RefusalKind::Failed,
        "mtm" => RefusalKind::NotReady,
        _ => RefusalKind::Invalid,
    }
}

fn tier_now(name: &str, capacity: u64, used: u64) -> TierNow {
    TierNow {
        name: name.into(),
        node: 0,
        capacity_bytes: capacity,
        used_bytes: used,
        resident_bytes: Some(used),
    }
}

/// A service on stand-in workers, with its rebalancer and report
/// collector running; shut down (its VMs stopped) when dropped.
pub struct Service {
    pub host: Arc<Host>,
    pub dir: PathBuf,
    threads: Vec<JoinHandle<()>>,
    /// Whether dropping it leaves its directory (for a restart).
    keep_dir: bool,
}

/// `cfg` for a service in a fresh directory named after `test` (its
/// `state` subdirectory and the stand-in's wrapper script): fast pool
/// 256M, slow pool 1G, the rest `ServeConfig::for_tests`.
pub fn config(test: &str) -> (ServeConfig, PathBuf) {
    let dir = std::env::temp_dir().join(format!("tiervm-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the test's directory");
    let exe = std::env::current_exe().expect("the test binary");
    let script = dir.join("worker.sh");
    let body = format!(
        "#!/bin/sh\n{STAND_IN}='{}' exec '{}' --exact stand_in_worker --nocapture --test-threads=1 -q\n",
        dir.display(),
        exe.display()
    );
    std::fs::write(&script, body).expect("the wrapper script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut cfg = ServeConfig::for_tests();
    cfg.state_dir = dir.join("state");
    cfg.worker_exe = script;
    cfg.fast_pool = 256 * M;
    cfg.slow_pool = 1024 * M;
    (cfg, dir)
}

impl Service {
    /// Starts a service on `cfg` (from [`config`]) writing its state
    /// directory.
    pub fn start(cfg: ServeConfig, dir: PathBuf) -> Self {
        let dirs = vmm_service::open_state_dirs(&cfg.state_dir).expect("the state directory");
        let host = Host::with_dirs(cfg, dirs);
        host.start_records();
        let (h1, h2) = (host.clone(), host.clone());
        let threads = vec![
            std::thread::spawn(move || h1.run_rebalancer()),
            std::thread::spawn(move || h2.run_report_collector()),
        ];
        Self {
            host,
            dir,
            threads,
            keep_dir: false,
        }
    }

    /// A service as [`config`] makes it.
    pub fn new(test: &str) -> Self {
        Self::with(test, |_| {})
    }

    /// A service as [`config`] makes it, its config changed by `tweak`.
    pub fn with(test: &str, tweak: impl FnOnce(&mut ServeConfig)) -> Self {
        let (mut cfg, dir) = config(test);
        tweak(&mut cfg);
        Self::start(cfg, dir)
    }

    pub fn info(&self, id: &str) -> VmInfo {
        self.host.vm_info(id, false).expect("the VM is listed")
    }

    /// Waits (at most 20 s) until `f` holds of VM `id`'s answer; the
    /// answer that held.
    pub fn wait_vm(&self, id: &str, what: &str, f: impl Fn(&VmInfo) -> bool) -> VmInfo {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.info(id);
            if f(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "VM {id}: not {what} in 20 s: {v:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn wait_state(&self, id: &str, state: &str) -> VmInfo {
        self.wait_vm(id, state, |v| v.state == state)
    }

    /// Creates a VM (`json`: a `CreateVm`) and waits until it runs.
    pub fn running(&self, name: Option<&str>, json: &str) -> VmInfo {
        let v = create(&self.host, name, json).expect("the VM is admitted");
        self.wait_state(&v.id, "running")
    }

    /// Shuts the service down as dropping it does, its state directory
    /// kept (a service started on it next is a restart).
    pub fn stop_for_restart(mut self) {
        self.keep_dir = true;
    }

    /// The fast capacities VM `id`'s stand-in was asked to set, in order.
    pub fn resizes(&self, id: &str) -> Vec<u64> {
        let text = std::fs::read_to_string(self.dir.join(format!("resizes-{id}")));
        let text = text.unwrap_or_default();
        text.lines().filter_map(|l| l.parse().ok()).collect()
    }

    /// Creates a VM as [`Service::running`] does and waits until its
    /// statistics have been polled.
    pub fn polled(&self, name: Option<&str>, json: &str) -> VmInfo {
        let v = self.running(name, json);
        self.wait_vm(&v.id, "polled", |v| v.ops_per_sec > 0.0)
    }

    /// `DELETE ?force=true` of VM `id`, answered 202, and its answer once
    /// it has stopped.
    pub fn force_delete(&self, id: &str) -> VmInfo {
        assert_eq!(self.host.delete(id, true), Ok(true), "{id}");
        self.wait_state(id, "stopped")
    }

    /// Mutes (`true`) or unmutes VM `id`'s stand-in.
    pub fn mute(&self, id: &str, on: bool) {
        let f = self.dir.join(format!("mute-{id}"));
        if on {
            std::fs::write(f, b"").expect("the mute file");
        } else {
            std::fs::remove_file(f).expect("the mute file");
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.host.shutdown();
        self.host.stop_report_collector();
        // The rebalancer and the collector end within a second or so of
        // the shutdown; a test that failed already does not wait for them.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::thread::panicking() && self.threads.iter().any(|t| !t.is_finished()) {
            assert!(
                Instant::now() < deadline,
                "the service's threads did not end in 20 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in self.threads.drain(..).filter(|t| t.is_finished()) {
            let _ = t.join();
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `POST /v1/vms` (`name`: `PUT /v1/vms/{name}`) of `json`.
pub fn create(host: &Arc<Host>, name: Option<&str>, json: &str) -> Result<VmInfo, HostError> {
    let req: CreateVm = serde_json::from_str(json).expect("a valid CreateVm");
    match name {
        Some(n) => host.put_vm(n, &req).map(|(_, v)| v),
        None => host.create(&req),
    }
}

/// A zipf VM of `mem` MiB with fast `min` and `max` MiB.
pub fn zipf(mem: u64, min: u64, max: u64) -> String {
    format!(
        r#"{{"image":"zipf","mem":"{mem}M","args":["rss=16M","wss=8M"],"fast":{{"min":"{min}M","max":"{max}M"}}}}"#
    )
}
