//! Liveness of a run: how each vCPU thread spent its time, how long the
//! guest went without progress, and stalls.
//!
//! The kernel's per-thread scheduler statistics
//! (`/proc/self/task/TID/schedstat`: time on a CPU, time runnable but
//! waiting for one) split each vCPU thread's wall time three ways:
//!
//! - **running**: guest code, KVM's exits, the VMM's exit handling;
//! - **waiting for a CPU**: runnable, but the host's cores were busy;
//! - **blocked**: asleep in the kernel. A vCPU thread of tiervm sleeps
//!   only where the guest touched a page that is not mapped (a first
//!   touch being committed, a parked page being sampled, a page in
//!   flight): the guest-visible cost of the memory engine's faults, as
//!   the guest pays it (the fault handler's own clock misses the kernel's
//!   delivery and the two scheduler wake-ups around it).
//!
//! The kernel adds a runnable thread's wait for a CPU to its statistics
//! only when it gets one, so an interval in which a vCPU neither ran nor
//! waited counts as blocked only if the thread is asleep at its end (its
//! state in `/proc/self/task/TID/stat`); the totals are exact at the end
//! of the run either way.
//!
//! A vCPU blocked for longer than [`STALL_BOUND`] is a **stall**: the
//! watchdog logs what the memory layer knows (the fault handler's oldest
//! waiting fault and its page state, what every mover is doing), does what
//! can safely be done for that page (`TieredMemory::unstick`: wake,
//! unpark, recover a hole; never take a page a mover owns), and records
//! it. A vCPU still blocked after [`FATAL_STALL`] ends the run as failed.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use tiering::mem::{TieredMemory, Unstick};

/// A vCPU blocked this long is a stall (logged, acted on, reported).
pub const STALL_BOUND: Duration = Duration::from_secs(1);
/// A vCPU blocked this long ends the run as failed.
pub const FATAL_STALL: Duration = Duration::from_secs(10);
/// An interval in which a vCPU ran or waited for a CPU less than this
/// share of the time counts as blocked.
const BLOCKED_SHARE: f64 = 0.02;

/// One stall, as the watchdog saw it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stall {
    /// When the vCPU became blocked, seconds into the run.
    pub t_s: f64,
    /// The vCPU.
    pub vcpu: u32,
    /// How long it stayed blocked (at least), seconds.
    pub blocked_s: f64,
    /// What the memory layer knew (the handler's waiting faults, movers).
    pub memory: Option<String>,
    /// What the watchdog did for the page the vCPU waited on.
    pub action: Option<String>,
    /// The vCPU thread's kernel stack when the stall was seen (top frames).
    pub kernel_stack: Vec<String>,
    /// Whether the vCPU ran again before the run ended.
    pub resolved: bool,
}

/// The liveness section of the run report.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LivenessReport {
    /// vCPU threads' time on a CPU (guest and VMM), summed, ms.
    pub vcpu_run_ms: f64,
    /// vCPU threads' time runnable but waiting for a CPU (host load), ms.
    pub vcpu_wait_cpu_ms: f64,
    /// vCPU threads' time asleep in the kernel: blocked on the memory
    /// engine's faults (first touches, hint faults, pages in flight), ms.
    pub vcpu_blocked_ms: f64,
    /// The longest a vCPU stayed blocked (sample resolution), ms.
    pub longest_block_ms: f64,
    /// The longest time without guest progress (ops unchanged) after the
    /// guest's first progress and before the stop request, seconds.
    pub longest_no_progress_s: f64,
    /// How long after the stop request the run ended, ms (`null`: the
    /// guest ended the run itself).
    pub stop_latency_ms: Option<f64>,
    /// vCPUs blocked longer than [`STALL_BOUND`].
    pub stalls: Vec<Stall>,
    /// Whether the statistics were read (a kernel without schedstat, or a
    /// thread that could not be read, leaves them at zero).
    pub measured: bool,
    /// Why the watchdog ended the run (a vCPU blocked past [`FATAL_STALL`]).
    pub fatal: Option<String>,
}

impl LivenessReport {
    /// One human line.
    pub fn human(&self) -> String {
        let mut s = if self.measured {
            format!(
                "vCPU time: running {:.0} ms, waiting for a CPU {:.0} ms, blocked on faults {:.0} ms \
                 (longest {:.0} ms)",
                self.vcpu_run_ms, self.vcpu_wait_cpu_ms, self.vcpu_blocked_ms, self.longest_block_ms
            )
        } else {
            "vCPU time not measured (no schedstat)".to_string()
        };
        s.push_str(&format!(
            "; longest without guest progress {:.1} s",
            self.longest_no_progress_s
        ));
        if let Some(l) = self.stop_latency_ms {
            s.push_str(&format!("; ended {l:.0} ms after the stop request"));
        }
        if !self.stalls.is_empty() {
            s.push_str(&format!("; {} STALL(S)", self.stalls.len()));
        }
        s
    }
}

/// `run_ns wait_ns` of a thread of this process.
pub fn schedstat(tid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let mut it = text.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

/// Whether a thread of this process is asleep now (`S` or `D` in
/// `/proc/self/task/TID/stat`). A runnable thread that waits for a CPU
/// is not: the kernel adds its run-queue delay to schedstat only when it
/// gets the CPU, so schedstat alone cannot tell it from a sleeper.
fn asleep(tid: u32) -> bool {
    matches!(
        proc_state(Path::new(&format!("/proc/self/task/{tid}/stat"))),
        Some('S' | 'D')
    )
}

/// The state letter of a `/proc` `stat` file (of a process or a thread):
/// the field after the command's closing parenthesis, which the command
/// itself may hold.
pub fn proc_state(stat: &Path) -> Option<char> {
    let text = std::fs::read_to_string(stat).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The top frames of a thread's kernel stack (root only; empty otherwise).
fn kernel_stack(tid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stack"))
        .map(|s| {
            s.lines()
                .take(6)
                .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Debug)]
struct VcpuWatch {
    id: u32,
    tid: u32,
    last: Option<(Instant, u64, u64)>,
    first: Option<(u64, u64)>,
    blocked_since: Option<Instant>,
    stall: Option<usize>,
    totals: (u64, u64, u64),
}

/// Watches a run's vCPU threads and progress (see the module docs).
#[derive(Debug)]
pub struct LivenessWatch {
    start: Instant,
    vcpus: Vec<VcpuWatch>,
    report: LivenessReport,
    last_ops: Option<(u64, Instant)>,
    progressed: bool,
    stop_at: Option<Instant>,
}

impl LivenessWatch {
    /// A watch over the run that started at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            vcpus: Vec::new(),
            report: LivenessReport::default(),
            last_ops: None,
            progressed: false,
            stop_at: None,
        }
    }

    /// vCPU `id` runs on thread `tid`.
    pub fn add_vcpu(&mut self, id: u32, tid: u32) {
        if self.vcpus.iter().all(|v| v.id != id) {
            self.vcpus.push(VcpuWatch {
                id,
                tid,
                last: None,
                first: None,
                blocked_since: None,
                stall: None,
                totals: (0, 0, 0),
            });
        }
    }

    /// The stop was requested now (progress is not judged after it).
    pub fn stop_requested(&mut self, now: Instant) {
        self.stop_at.get_or_insert(now);
    }

    /// One look at the threads and the guest's ops. `ended(id)` says
    /// whether vCPU `id`'s thread has ended. Returns a reason to end the
    /// run as failed (a vCPU blocked past [`FATAL_STALL`]).
    pub fn sample(
        &mut self,
        now: Instant,
        ops: u64,
        mem: Option<&TieredMemory>,
        ended: impl Fn(u32) -> bool,
    ) -> Option<String> {
        self.progress(now, ops);
        let mut fatal = None;
        for i in 0..self.vcpus.len() {
            if ended(self.vcpus[i].id) {
                self.vcpus[i].blocked_since = None;
                continue;
            }
            if let Some(reason) = self.look_at(i, now, mem) {
                fatal = Some(reason);
            }
        }
        fatal
    }

    fn progress(&mut self, now: Instant, ops: u64) {
        if self.stop_at.is_some() {
            return;
        }
        match self.last_ops {
            Some((o, _)) if o == ops => {}
            _ => {
                if self.last_ops.is_some() || ops > 0 {
                    self.progressed |= ops > 0;
                }
                self.last_ops = Some((ops, now));
            }
        }
        if let Some((_, since)) = self.last_ops {
            if self.progressed {
                let idle = now.duration_since(since).as_secs_f64();
                let r = &mut self.report.longest_no_progress_s;
                *r = r.max(idle);
            }
        }
    }

    fn look_at(&mut self, i: usize, now: Instant, mem: Option<&TieredMemory>) -> Option<String> {
        let start = self.start;
        let t_s = |at: Instant| at.duration_since(start).as_secs_f64();
        let v = &mut self.vcpus[i];
        let (run, wait) = schedstat(v.tid)?;
        self.report.measured = true;
        v.first.get_or_insert((run, wait));
        let (at, run0, wait0) = v.last.replace((now, run, wait))?;
        let dt = now.duration_since(at).as_nanos() as u64;
        let (dr, dw) = (run.saturating_sub(run0), wait.saturating_sub(wait0));
        let blocked = dt.saturating_sub(dr + dw);
        v.totals.0 += dr;
        v.totals.1 += dw;
        v.totals.2 += blocked;
        if (dr + dw) as f64 >= BLOCKED_SHARE * dt as f64 || !asleep(v.tid) {
            if let Some(k) = v.stall.take() {
                self.report.stalls[k].resolved = true;
            }
            v.blocked_since = None;
            return None;
        }
        let since = *v.blocked_since.get_or_insert(at);
        let held = now.duration_since(since);
        let r = &mut self.report.longest_block_ms;
        *r = r.max(held.as_secs_f64() * 1e3);
        if held < STALL_BOUND {
            return None;
        }
        let (id, tid) = (v.id, v.tid);
        match v.stall {
            Some(k) => {
                let st = &mut self.report.stalls[k];
                // Act again at every further bound the vCPU stays blocked.
                let bounds = |s: f64| (s / STALL_BOUND.as_secs_f64()) as u64;
                if let Some(m) = mem.filter(|_| bounds(held.as_secs_f64()) > bounds(st.blocked_s)) {
                    let (_, action) = act_on(m, tid);
                    st.action = Some(action);
                }
                st.blocked_s = held.as_secs_f64();
            }
            None => {
                v.stall = Some(self.report.stalls.len());
                let stall = open_stall(id, tid, t_s(since), held, mem);
                tracing::warn!(
                    "stall: vCPU {id} has been blocked in the kernel for {:.1} s: {}; {}",
                    held.as_secs_f64(),
                    stall.memory.as_deref().unwrap_or("untiered RAM"),
                    stall.action.as_deref().unwrap_or("no action")
                );
                self.report.stalls.push(stall);
            }
        }
        let fatal = (held >= FATAL_STALL).then(|| {
            format!(
                "vCPU {id} has been blocked in the kernel for {:.0} s (a stall): {}",
                held.as_secs_f64(),
                mem.map_or("untiered RAM".to_string(), |m| m
                    .stall_view(Some(tid))
                    .to_string())
            )
        });
        if fatal.is_some() {
            self.report.fatal.clone_from(&fatal);
        }
        fatal
    }

    /// The report, with the stop latency: the run ends now.
    pub fn finish(mut self, end: Instant) -> LivenessReport {
        for v in &self.vcpus {
            self.report.vcpu_run_ms += v.totals.0 as f64 / 1e6;
            self.report.vcpu_wait_cpu_ms += v.totals.1 as f64 / 1e6;
            self.report.vcpu_blocked_ms += v.totals.2 as f64 / 1e6;
        }
        self.report.stop_latency_ms = self
            .stop_at
            .map(|s| end.duration_since(s).as_secs_f64() * 1e3);
        self.report
    }
}

/// What the watchdog does for a vCPU blocked on tiered RAM: the page it
/// waits on gets what can safely be done for it (`unstick`), then every
/// waiter is woken (a waiter the handler has no record of retries its
/// access and faults again, which the handler then sees).
fn act_on(mem: &TieredMemory, tid: u32) -> (String, String) {
    let view = mem.stall_view(Some(tid));
    let mut action = match mem.page_waited_by(&view) {
        Some(page) => match mem.unstick(page) {
            Unstick::Woken => format!("guest page {page} is mapped: woke its waiters"),
            Unstick::Unparked => format!("guest page {page} was parked: mapped it back"),
            Unstick::Recovered => format!("guest page {page} was a hole: recovered it"),
            Unstick::OwnedByMover => {
                format!("guest page {page} is owned by a mover: left to it, woke its waiters")
            }
            Unstick::NoRoom => {
                format!("guest page {page} is untouched and no tier has room for it")
            }
        },
        None => "no page known".to_string(),
    };
    mem.wake_all();
    action.push_str("; woke every waiter on guest RAM");
    (view.to_string(), action)
}

/// A new stall of vCPU `id`: what the memory layer knows, and what was done.
fn open_stall(id: u32, tid: u32, t_s: f64, held: Duration, mem: Option<&TieredMemory>) -> Stall {
    let (memory, action) = match mem.map(|m| act_on(m, tid)) {
        Some((view, action)) => (Some(view), Some(action)),
        None => (None, None),
    };
    Stall {
        t_s,
        vcpu: id,
        blocked_s: held.as_secs_f64(),
        memory,
        action,
        kernel_stack: kernel_stack(tid),
        resolved: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_asleep_is_blocked_and_a_busy_one_is_not() {
        let start = Instant::now();
        let mut w = LivenessWatch::new(start);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            tid_tx.send(tid).expect("send tid");
            let _ = rx.recv_timeout(Duration::from_secs(30));
        });
        let tid = tid_rx.recv().expect("tid");
        w.add_vcpu(0, tid);
        // SAFETY: gettid has no preconditions.
        w.add_vcpu(1, unsafe { libc::gettid() } as u32);
        let t0 = Instant::now();
        let mut spin = 0u64;
        while t0.elapsed() < Duration::from_millis(1300) {
            // This thread stays busy (vCPU 1 is never blocked).
            for _ in 0..100_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
            if w.sample(Instant::now(), 1, None, |_| false).is_some() {
                panic!("no stall is fatal after 1.3 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tx.send(()).expect("wake");
        sleeper.join().expect("join");
        let r = w.finish(Instant::now());
        assert!(r.measured, "{r:?}");
        assert_eq!(r.stalls.len(), 1, "one stall, vCPU 0's: {r:?}");
        assert_eq!(r.stalls[0].vcpu, 0);
        assert!(r.stalls[0].blocked_s >= 1.0, "{r:?}");
        assert!(r.vcpu_blocked_ms > 1000.0, "{r:?}");
        assert!(r.longest_block_ms >= 1000.0, "{r:?}");
    }

    #[test]
    fn progress_windows_count_from_the_first_progress_until_the_stop() {
        let start = Instant::now();
        let mut w = LivenessWatch::new(start);
        let s = |ms: u64| start + Duration::from_millis(ms);
        // Set-up (no ops yet) does not count.
        w.progress(s(0), 0);
        w.progress(s(2000), 0);
        w.progress(s(2100), 256);
        w.progress(s(2600), 256);
        w.progress(s(2700), 512);
        w.progress(s(2800), 768);
        assert!((w.report.longest_no_progress_s - 0.5).abs() < 1e-9);
        w.stop_requested(s(2900));
        w.progress(s(9000), 768);
        assert!((w.report.longest_no_progress_s - 0.5).abs() < 1e-9);
    }
}
