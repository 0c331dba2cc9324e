//! The threads tiering runs, and one process-wide hook called first thing
//! in each of them (the VMM installs the thread's seccomp filter there).
//!
//! Every thread this crate spawns for a VM calls [`started`] with its role
//! before doing anything else; a thread spawned without it would run
//! unconfined, so new threads must call it too.

use std::sync::RwLock;

/// What a thread does (and so which system calls it needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadRole {
    /// The VMM's main thread (setup, sampling the status page, the report).
    Main,
    /// A vCPU thread (`KVM_RUN`, port I/O).
    Vcpu,
    /// The userfaultfd fault handler (`tiervm-uffd`).
    FaultHandler,
    /// The policy engine: ticks, migrations, harvests (`tiering-engine`).
    Engine,
    /// The hint-fault sampler (`tiervm-sampler`).
    Sampler,
    /// The chaos driver: migrations and harvests (`tiervm-chaos`).
    Chaos,
    /// The policy engine when DAMON tracks accesses: it also starts and
    /// tears down DAMON through sysfs (`--tracking damon`).
    EngineDamon,
    /// The DAMON reader: reads DAMON's sysfs results (`damon-reader`).
    DamonReader,
    /// The tier resize and maintenance driver (`tiervm-resize`): shrink
    /// steps (migrations), huge-page collapses.
    Resize,
    /// The link of a `tiervm serve` worker to its service
    /// (`worker-control`): reads commands from the service's socketpair,
    /// answers on it, changes tier capacities (accounting only) and hands
    /// policy switches to the main thread.
    WorkerLink,
    /// The latency-emulation thread (`latency-emulation`, `--emulate-latency`
    /// only): every 10 ms reads the guest's access counters, recomputes the
    /// tiers' loaded latency and republishes it; gives the boot
    /// measurement's buffer back (`madvise`).
    LatencyEmulation,
    /// `tiervm serve`'s rebalancer (`serve-rebalance`): asks every worker
    /// for its statistics over its channel, divides the fast pool, sends
    /// the new capacities.
    ServeRebalance,
    /// `tiervm serve`'s reader of one worker's channel (`serve-vm-N`):
    /// reads replies and events, reaps the process when the channel
    /// closes, gives free heap back.
    ServeReader,
    /// `tiervm serve`'s report collector (`serve-reports`): asks an ended
    /// VM's worker for its report and writes it to the state directory.
    ServeReports,
}

impl ThreadRole {
    /// Every role.
    pub const ALL: [ThreadRole; 14] = [
        ThreadRole::Main,
        ThreadRole::Vcpu,
        ThreadRole::FaultHandler,
        ThreadRole::Engine,
        ThreadRole::Sampler,
        ThreadRole::Chaos,
        ThreadRole::EngineDamon,
        ThreadRole::DamonReader,
        ThreadRole::Resize,
        ThreadRole::WorkerLink,
        ThreadRole::LatencyEmulation,
        ThreadRole::ServeRebalance,
        ThreadRole::ServeReader,
        ThreadRole::ServeReports,
    ];

    /// A short name (`vcpu`, `fault-handler`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ThreadRole::Main => "main",
            ThreadRole::Vcpu => "vcpu",
            ThreadRole::FaultHandler => "fault-handler",
            ThreadRole::Engine => "engine",
            ThreadRole::Sampler => "sampler",
            ThreadRole::Chaos => "chaos",
            ThreadRole::EngineDamon => "engine (DAMON)",
            ThreadRole::DamonReader => "damon-reader",
            ThreadRole::Resize => "resize",
            ThreadRole::WorkerLink => "worker-link",
            ThreadRole::LatencyEmulation => "latency-emulation",
            ThreadRole::ServeRebalance => "serve-rebalance",
            ThreadRole::ServeReader => "serve-reader",
            ThreadRole::ServeReports => "serve-reports",
        }
    }
}

static HOOK: RwLock<Option<fn(ThreadRole)>> = RwLock::new(None);

/// Sets (or with `None` clears) the hook every tiering thread calls first.
pub fn set_thread_start_hook(hook: Option<fn(ThreadRole)>) {
    *HOOK.write().unwrap_or_else(|p| p.into_inner()) = hook;
}

/// Called first thing in each thread, with its role.
pub fn started(role: ThreadRole) {
    let hook = *HOOK.read().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = hook {
        h(role);
    }
}
