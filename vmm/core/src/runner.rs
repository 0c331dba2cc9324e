//! Builds and runs one VM: memory, image, page tables, boot info, vCPU
//! threads, the sampling loop and the stop protocol (Firecracker's
//! `builder.rs` + the VMM thread).
//!
//! Threads: one per vCPU (`KVM_RUN` loop, port I/O inline) and the caller's
//! thread, which samples the status page every `sample` and decides when to
//! stop. Stop protocol: write `stop_request` in the status page, wait up to
//! `stop_grace` for every vCPU to exit through the exit port, then kick the
//! vCPUs out of `KVM_RUN` with a signal and end them.

use std::io::Cursor;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::signal::Killable;

use crate::ab::AbDriver;
use crate::config::VmConfig;
use crate::devices::serial::{ConsoleWriter, Sink};
use crate::devices::PortBus;
use crate::emulation::{Emulation, EmulationError};
use crate::image::ImageError;
use crate::liveness::LivenessWatch;
use crate::permissions::PermissionError;
use crate::report::{RunReport, StopReason};
use crate::seccomp::SeccompError;
use crate::status::{self, TimelinePoint};
use crate::vstate::memory::MemoryError;
use crate::vstate::tiered::{TieredRam, TieredRamError, TieringReport};
use crate::vstate::vm::{GuestRam, Vcpu, Vm, VmError};
use crate::vstate::{memory, vcpu, vm};
use tiervm_guest::abi::{STATUS_GPA, STATUS_STOP_OFFSET};

/// Why a VM could not be built or run to its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The guest image cannot be loaded.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Guest memory could not be set up or written.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// This process lacks a host permission the run needs.
    #[error(transparent)]
    Permission(#[from] PermissionError),
    /// KVM or the VM failed.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// A vCPU could not be set up or failed while running.
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    /// Tiered guest RAM or one of its threads failed.
    #[error(transparent)]
    TieredRam(#[from] TieredRamError),
    /// Latency emulation could not be set up.
    #[error(transparent)]
    Emulation(#[from] EmulationError),
    /// A seccomp filter could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
}

impl RunError {
    /// Whether the user's input is at fault (exit code 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Image(_) => true,
            Self::Memory(e) => e.is_usage(),
            Self::TieredRam(e) => e.is_usage(),
            Self::Vm(e) => e.is_usage(),
            Self::Emulation(e) => matches!(e, EmulationError::TooLarge { .. }),
            Self::Permission(_) | Self::Vcpu(_) | Self::Seccomp(_) => false,
        }
    }

    /// What the user can do about it, when the message does not end with it.
    pub fn fix(&self) -> Option<&'static str> {
        match self {
            Self::Image(e) => e.fix(),
            Self::Vm(e) => e.fix(),
            Self::Seccomp(e) => e.fix(),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, RunError>;

/// How long vCPUs 1.. may keep running after vCPU 0 exited.
const SECONDARY_GRACE: Duration = Duration::from_secs(1);
/// How long the runner waits for kicked vCPU threads before giving up on
/// them (a thread left behind keeps its share of guest RAM mapped, and ends
/// with the process): a run ends on time whatever a vCPU is doing.
const KICK_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the guest has after the stop request to leave its Init and
/// Run phases (acknowledge the stop) before its vCPUs are stopped: a run
/// ends on time whatever the guest or the engine is doing. A guest that
/// acknowledged (Verify, Done) gets `--stop-grace` to finish.
pub const STOP_ACK_GRACE: Duration = Duration::from_millis(500);
/// Longest sleep of the runner between its checks of the run's deadlines
/// (--duration, --stop-grace), signals and vCPU exits, whatever --sample-ms is.
const POLL: Duration = Duration::from_millis(5);

/// What a run hook may look at and touch while the VM runs.
pub struct SampleCtx<'a> {
    /// Guest memory (the hook may read or write it, e.g. to inject faults).
    pub mem: &'a GuestMemoryMmap,
    /// The layout of the guest.
    pub layout: &'a memory::GuestLayout,
    /// Seconds since the vCPUs started.
    pub t_s: f64,
    /// Total guest operations so far.
    pub ops: u64,
    /// The VM's tiered RAM, if tiered (the service's worker resizes tiers
    /// and switches policies through it).
    pub tiered: Option<&'a TieredRam>,
}

/// Observers of a run (tests, progress display).
pub trait RunHooks {
    /// Called once the VM is about to run, with its tiered memory if any.
    fn on_start(&mut self, _tiered: Option<&std::sync::Arc<tiering::mem::TieredMemory>>) {}

    /// Called once the VM is about to run, with the placement policy's mode
    /// slot when its policy has modes to show (`adaptive`).
    fn on_policy_mode(&mut self, _mode: tiering::engine::ModeSlot) {}

    /// Called after every status sample.
    fn on_sample(&mut self, _ctx: &SampleCtx<'_>) {}

    /// Whether the run should stop now (checked every few ms): the guest is
    /// asked to stop as at the end of `--duration`. Lets a test run until
    /// the events it waits for happened instead of for a fixed time.
    fn wants_stop(&mut self) -> bool {
        false
    }
}

/// Hooks that do nothing.
pub struct NoHooks;
impl RunHooks for NoHooks {}

/// Where guest console output goes.
pub enum Console {
    /// stderr.
    Stderr,
    /// A buffer (tests).
    Memory(Sink),
}

/// Runs the VM described by `cfg`. `started` is when the VMM started (for `boot_ms`).
///
/// 1. Check the host permissions the run needs
///    ([`crate::permissions::check_run`]), then build the VM: RAM, image, page tables, KVM VM and vCPUs, boot info,
///    tiering threads ([`build_vm`]).
/// 2. Start one thread per vCPU.
/// 3. Watch the run: sample the status page, stop on a crash or when the
///    guest is done, ask the guest to stop at `--duration`, force it after
///    `--stop-grace` ([`watch`]).
/// 4. Kick the vCPUs that still run out of `KVM_RUN` and end them.
/// 5. Finish tiering and build the report ([`finish`]).
pub fn run(
    cfg: &VmConfig,
    started: Instant,
    console: Console,
    hooks: &mut dyn RunHooks,
) -> Result<RunReport> {
    // Name every missing host permission before setting anything up.
    crate::permissions::check_run(cfg.tiering.is_some())?;
    // Threads started from here on install their seccomp filters.
    crate::seccomp::set_enabled(cfg.seccomp)?;
    let (mut vm, vcpus) = build_vm(cfg)?;
    let sink = match console {
        Console::Stderr => Sink::Stderr,
        Console::Memory(s) => s,
    };
    let mut shared =
        vcpu::VcpuShared::new(PortBus::new(ConsoleWriter::new(sink, cfg.console_limit)));
    shared.seccomp = cfg.seccomp;
    shared.test_forbidden_syscall = cfg.test_forbidden_syscall;
    let shared = Arc::new(shared);
    hooks.on_start(vm.ram().backing());
    if let Some(mode) = vm.policy_mode() {
        hooks.on_policy_mode(mode);
    }
    let run_start = Instant::now();
    let mut threads = VcpuThreads::spawn(vcpus, &shared)?;
    if let Some(t) = vm.tiered() {
        // The sampler budgets hint faults against what they cost the vCPUs.
        let sh = shared.clone();
        t.memory()
            .set_guest_clock(Some(Arc::new(move || sh.blocked_ns())));
    }
    // Every thread of this VM exists now: the calling thread's own filter
    // (tiervm run only; it would outlive the run otherwise).
    if cfg.seccomp && cfg.seccomp_main {
        crate::seccomp::install(tiering::threads::ThreadRole::Main)?;
    }
    let watched = watch(cfg, &mut vm, &mut threads, &shared, hooks, run_start);
    threads.end(&shared, vm.tiered().map(|t| t.memory().as_ref()));
    finish(cfg, started, run_start, vm, &threads, &shared, watched)
}

/// Step 1: guest RAM (tiered or plain) with the image, page tables and
/// boot info written, a VM over it with its vCPUs at the image's entry,
/// and the tiering threads started.
fn build_vm(cfg: &VmConfig) -> Result<(Vm, Vec<Vcpu>)> {
    let mut tiered = cfg
        .tiering
        .as_ref()
        .map(|t| TieredRam::new(t, cfg.vcpus))
        .transpose()?;
    let emulation = emulation_for(cfg, tiered.as_mut())?;
    let mut ram = match &tiered {
        Some(t) => GuestRam::tiered(t),
        None => GuestRam::anonymous(cfg.mem_bytes)?,
    };
    if let Some(e) = &emulation {
        ram = ram.with_emulation(e.region().clone());
    }
    let ram = Arc::new(ram);
    let mem = ram.memory();
    let loaded = Elf::load(mem, None, &mut Cursor::new(cfg.image.bytes.as_ref()), None).map_err(
        |source| ImageError::Load {
            name: cfg.image.name.clone(),
            source,
        },
    )?;
    // The validator decided what to load; the loader must have agreed.
    if loaded.kernel_end != cfg.elf.loaded_end() {
        return Err(ImageError::LoaderDisagrees {
            name: cfg.image.name.clone(),
            loader_end: loaded.kernel_end,
            validated_end: cfg.elf.loaded_end(),
        }
        .into());
    }
    let region = emulation.as_ref().map(|e| {
        let l = e.region().layout();
        (l.base, l.len)
    });
    let cr3 = memory::write_page_tables(mem, cfg.mem_bytes, region)?;

    let kvm = vm::open_kvm()?;
    let mut vm = Vm::new(&kvm, ram.clone(), tiered, cfg.vcpus)?;
    let cpuid = vcpu::supported_cpuid(&kvm)?;
    let vcpus = (0..cfg.vcpus)
        .map(|id| {
            vcpu::create_vcpu(
                &vm,
                id,
                &cpuid,
                cr3,
                cfg.elf.entry,
                cfg.layout.stack_top(id),
            )
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let tsc_khz = vcpu::tsc_khz(vcpus[0].fd());
    let emulation_gpa = region.map_or(0, |(gpa, _)| gpa);
    memory::write_boot_info(
        mem,
        &cfg.layout,
        cfg.seed,
        tsc_khz,
        &cfg.args,
        emulation_gpa,
    )?;
    vcpu::install_kick_handler()?;
    if let Some(t) = vm.tiered() {
        // Everything the VMM wrote so far: boot info, status page, page
        // tables, the image.
        t.note_vmm_write(0, cfg.layout.stacks_base);
    }
    vm.start_tiering()?;
    if let Some(mut e) = emulation {
        e.start(tsc_khz)?;
        vm.set_emulation(e);
    }
    Ok((vm, vcpus))
}

/// Latency emulation (`--emulate-latency`): the region, and for tiered RAM
/// the tier map installed as the placement observer (it reports every page
/// already placed) and the live latency model handed to the engine.
fn emulation_for(cfg: &VmConfig, tiered: Option<&mut TieredRam>) -> Result<Option<Emulation>> {
    let Some(ec) = &cfg.emulation else {
        return Ok(None);
    };
    let tiers = tiered.as_ref().map_or(1, |t| t.memory().tier_count());
    let e = Emulation::new(ec, cfg.mem_bytes, cfg.vcpus, tiers)?;
    if let Some(t) = tiered {
        t.memory().set_placement_observer(Some(e.tier_map()));
        t.set_live_latency(e.loads());
    }
    Ok(Some(e))
}

/// The vCPU threads and how each ended.
struct VcpuThreads {
    running: Vec<Option<JoinHandle<vcpu::VcpuOutcome>>>,
    outcomes: Vec<Option<vcpu::VcpuOutcome>>,
}

impl VcpuThreads {
    /// Step 2: one thread per vCPU, in `KVM_RUN` until the guest exits.
    fn spawn(vcpus: Vec<Vcpu>, shared: &Arc<vcpu::VcpuShared>) -> Result<Self> {
        let mut running = Vec::with_capacity(vcpus.len());
        for (id, fd) in vcpus.into_iter().enumerate() {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || vcpu::run_vcpu(id as u32, fd, sh))
                .map_err(vcpu::VcpuError::Spawn)?;
            running.push(Some(h));
        }
        let outcomes = vec![None; running.len()];
        Ok(Self { running, outcomes })
    }

    /// Whether a thread ended that has not been reaped yet.
    fn any_finished(&self) -> bool {
        self.running
            .iter()
            .zip(&self.outcomes)
            .any(|(t, o)| o.is_none() && t.as_ref().is_some_and(JoinHandle::is_finished))
    }

    /// Collects the outcome of every thread that ended.
    fn reap(&mut self) {
        for (slot, out) in self.running.iter_mut().zip(self.outcomes.iter_mut()) {
            if slot.as_ref().is_some_and(JoinHandle::is_finished) {
                if let Some(h) = slot.take() {
                    *out = Some(
                        h.join()
                            .unwrap_or(vcpu::VcpuOutcome::HostError(vcpu::VcpuRunError::Panicked)),
                    );
                }
            }
        }
    }

    /// Whether a vCPU crashed or failed on the host side.
    fn any_failed(&self) -> bool {
        self.outcomes.iter().any(|o| {
            matches!(
                o,
                Some(vcpu::VcpuOutcome::Crashed(_) | vcpu::VcpuOutcome::HostError(_))
            )
        })
    }

    /// Whether vCPU `id`'s thread ended.
    fn ended(&self, id: u32) -> bool {
        self.outcomes.get(id as usize).is_some_and(Option::is_some)
            || self
                .running
                .get(id as usize)
                .is_some_and(|t| t.as_ref().is_none_or(JoinHandle::is_finished))
    }

    /// Whether every vCPU ended.
    fn all_ended(&self) -> bool {
        self.outcomes.iter().all(Option::is_some)
    }

    /// vCPU 0's exit code, once it wrote one.
    fn exit_code(&self) -> Option<u32> {
        match self.outcomes[0] {
            Some(vcpu::VcpuOutcome::Exited(c)) => Some(c),
            _ => None,
        }
    }

    /// Step 4: makes every vCPU leave its loop, kicks those in `KVM_RUN`
    /// with a signal, and waits for them up to [`KICK_TIMEOUT`]. A vCPU
    /// asleep on a guest page (a userfault) does not see the signal while
    /// its page is missing (KVM's own reads of guest memory retry a fault
    /// on a non-fatal signal): every such waiter on tiered RAM is woken at
    /// each kick, so it retries and leaves.
    fn end(&mut self, shared: &vcpu::VcpuShared, mem: Option<&tiering::mem::TieredMemory>) {
        shared.stop.store(true, Ordering::Release);
        let kick_deadline = Instant::now() + KICK_TIMEOUT;
        while self.running.iter().any(Option::is_some) && Instant::now() < kick_deadline {
            for h in self.running.iter().flatten() {
                let _ = h.kill(vcpu::kick_signal());
            }
            if let Some(m) = mem {
                m.wake_all();
            }
            std::thread::sleep(Duration::from_millis(2));
            self.reap();
        }
        for (id, t) in self.running.iter().enumerate() {
            if t.is_some() {
                tracing::warn!(
                    "vCPU {id} did not leave KVM_RUN within {} s of the stop; left behind",
                    KICK_TIMEOUT.as_secs_f64()
                );
            }
        }
    }

    /// The first crash description.
    fn crash(&self) -> Option<String> {
        self.outcomes.iter().find_map(|o| match o {
            Some(vcpu::VcpuOutcome::Crashed(c)) => Some(c.clone()),
            _ => None,
        })
    }

    /// The first host-side failure.
    fn host_error(&self) -> Option<vcpu::VcpuRunError> {
        self.outcomes.iter().find_map(|o| match o {
            Some(vcpu::VcpuOutcome::HostError(e)) => Some(e.clone()),
            _ => None,
        })
    }
}

/// What watching the run produced.
struct Watched {
    timelines: status::Timelines,
    stop_requested_at: Option<Instant>,
    reason: Option<StopReason>,
    ab: Option<AbDriver>,
    live: LivenessWatch,
}

/// Step 3: until the VM is done, every `--sample-ms` read the status page
/// (timeline, tiering samples, A/B switch, hooks), collect ended vCPU
/// threads, and enforce `--duration` and `--stop-grace`.
fn watch(
    cfg: &VmConfig,
    vm: &mut Vm,
    threads: &mut VcpuThreads,
    shared: &vcpu::VcpuShared,
    hooks: &mut dyn RunHooks,
    run_start: Instant,
) -> Watched {
    let mut w = Watched {
        timelines: status::Timelines::default(),
        stop_requested_at: None,
        reason: None,
        ab: cfg
            .tiering
            .as_ref()
            .and_then(|t| t.tracking_ab)
            .map(|p| AbDriver::new(p.as_secs_f64(), cfg.vcpus)),
        live: LivenessWatch::new(run_start),
    };
    let mut vcpu0_exited_at: Option<Instant> = None;
    let mut next = run_start + cfg.sample;
    loop {
        // Wait for the next sample, but never longer than POLL: the stop
        // checks below (duration, grace, signals, exits) run every POLL
        // whatever --sample-ms is.
        let now = Instant::now();
        if next > now && !threads.any_finished() {
            std::thread::sleep((next - now).min(POLL));
        }
        let now = Instant::now();
        if now >= next {
            next += cfg.sample;
            if next < now {
                next = now + cfg.sample;
            }
            let t_s = now.duration_since(run_start).as_secs_f64();
            sample(cfg, vm, hooks, &mut w, t_s);
            if watch_liveness(vm, threads, shared, &mut w, now) {
                return w;
            }
        }
        threads.reap();
        if threads.any_failed() {
            w.reason = Some(StopReason::Crashed);
            return w;
        }
        if threads.all_ended() {
            return w;
        }
        if threads.exit_code().is_some() {
            let at = *vcpu0_exited_at.get_or_insert(now);
            if now.duration_since(at) > SECONDARY_GRACE {
                return w;
            }
        }
        if enforce_stop(cfg, vm, hooks, &mut w, now, run_start) {
            return w;
        }
    }
}

/// One look of the stall watchdog (`crate::liveness`). Returns true when
/// a stall ends the run.
fn watch_liveness(
    vm: &Vm,
    threads: &VcpuThreads,
    shared: &vcpu::VcpuShared,
    w: &mut Watched,
    now: Instant,
) -> bool {
    for &(id, tid, _) in shared.tids.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        w.live.add_vcpu(id, tid);
    }
    let ops = w.timelines.ops.last().map_or(0, |p| p.ops);
    let mem = vm.tiered().map(|t| t.memory().as_ref());
    match w.live.sample(now, ops, mem, |id| threads.ended(id)) {
        Some(why) => {
            tracing::error!("{why}");
            w.reason = Some(StopReason::Stalled);
            true
        }
        None => false,
    }
}

/// Asks the guest to stop at `--duration` (or on a signal, or when a hook
/// wants it), and forces the stop when the guest has not acknowledged it
/// within [`STOP_ACK_GRACE`] or not ended within `--stop-grace`. Returns
/// true when the run must end now.
fn enforce_stop(
    cfg: &VmConfig,
    vm: &mut Vm,
    hooks: &mut dyn RunHooks,
    w: &mut Watched,
    now: Instant,
    run_start: Instant,
) -> bool {
    match w.stop_requested_at {
        None => {
            let signal = crate::signals::received();
            if signal.is_some() {
                w.reason = Some(StopReason::Signal);
            }
            let due = cfg
                .duration
                .is_some_and(|d| now.duration_since(run_start) >= d);
            if signal.is_some() || hooks.wants_stop() || due {
                request_stop(vm);
                w.stop_requested_at = Some(now);
                w.live.stop_requested(now);
            }
            false
        }
        Some(at) => {
            let waited = now.duration_since(at);
            if waited >= cfg.stop_grace
                || (waited >= STOP_ACK_GRACE
                    && !status::read(vm.ram().memory(), cfg.vcpus).acknowledged_stop())
            {
                w.reason = Some(StopReason::Forced);
                return true;
            }
            // Asserted again at every poll of the grace: the guest may
            // have overwritten the flag (it is untrusted), and a
            // migration that loses writes (`--test-skip-dirty-check`'s
            // negative control) may have put the page back as it was.
            request_stop(vm);
            false
        }
    }
}

/// Sets the guest's stop flag (a VMM write the dirty tracking must see).
fn request_stop(vm: &Vm) {
    if let Some(t) = vm.tiered() {
        t.note_vmm_write(STATUS_GPA + STATUS_STOP_OFFSET, 8);
    }
    status::request_stop(vm.ram().memory());
}

/// One status sample at `t_s` seconds into the run.
fn sample(cfg: &VmConfig, vm: &mut Vm, hooks: &mut dyn RunHooks, w: &mut Watched, t_s: f64) {
    let snap = status::read(vm.ram().memory(), cfg.vcpus);
    let record = w.timelines.record_next();
    if record {
        w.timelines.push_ops(TimelinePoint {
            t_s,
            ops: snap.total_ops(),
        });
    }
    if let Some(t) = vm.tiered_mut() {
        if record {
            w.timelines.push_tiers(crate::status::TierTimelinePoint {
                t_s,
                tiers: t.tier_samples(),
            });
        }
        t.drain_samples();
        if let Some(ab) = w.ab.as_mut() {
            let mem = t.memory();
            let switch = ab.on_sample(t_s, snap.total_ops(), mem.hint_stall_ns());
            // The sampler budgets with what this run measured a hint fault
            // to cost the guest, once the phases have enough to say.
            let r = ab.result();
            if let (true, Some(f)) = (r.calibrated, r.guest_cost_factor) {
                mem.set_guest_cost_factor(f);
            }
            if let Some(on) = switch {
                t.set_tracking_paused(!on);
            }
        }
    }
    hooks.on_sample(&SampleCtx {
        mem: vm.ram().memory(),
        layout: &cfg.layout,
        t_s,
        ops: snap.total_ops(),
        tiered: vm.tiered(),
    });
    w.timelines.thin_if_full();
}

/// Step 5: the last status sample, tiering's report, and the run report.
fn finish(
    cfg: &VmConfig,
    started: Instant,
    run_start: Instant,
    mut vm: Vm,
    threads: &VcpuThreads,
    shared: &vcpu::VcpuShared,
    mut w: Watched,
) -> Result<RunReport> {
    let end = Instant::now();
    let snap = status::read(vm.ram().memory(), cfg.vcpus);
    w.timelines.ops.push(TimelinePoint {
        t_s: end.duration_since(run_start).as_secs_f64(),
        ops: snap.total_ops(),
    });
    let emulation = vm.take_emulation().map(|e| e.finish(&snap.metrics));
    let tiering = match vm.take_tiered() {
        Some(t) => Some(t.finish(None)?),
        None => None,
    };
    if let Some(e) = crate::seccomp::take_hook_error() {
        return Err(e.into());
    }
    let crash = threads.crash();
    if let Some(e) = threads.host_error() {
        return Err(vcpu::VcpuError::Run(e).into());
    }
    // A forced stop or a crash says more than the signal that asked for it.
    let reason = w.reason.unwrap_or(if w.stop_requested_at.is_some() {
        StopReason::Duration
    } else {
        StopReason::GuestExited
    });
    let mut ports = shared.ports.lock().unwrap_or_else(|p| p.into_inner());
    ports.flush_console();
    let run_s = end.duration_since(run_start).as_secs_f64();
    Ok(RunReport {
        image: cfg.image.name.clone(),
        args: cfg.effective_args(),
        seed: cfg.seed,
        vcpus: cfg.vcpus,
        mem_bytes: cfg.mem_bytes,
        duration_s: run_s,
        exit_code: threads.exit_code(),
        stop_reason: reason,
        ops: snap.total_ops(),
        ops_per_sec: status::ops_per_sec(&w.timelines.ops),
        timeline: w.timelines.ops,
        tier_timeline: w.timelines.tiers,
        vm_exits: shared.exits.load(Ordering::Relaxed),
        boot_ms: shared
            .booted_at
            .get()
            .map(|t| t.duration_since(started).as_secs_f64() * 1e3),
        guest_metrics: snap.metrics,
        console_bytes: ports.console().written(),
        console_dropped: ports.console().dropped(),
        unhandled_io: shared.unhandled_io.load(Ordering::Relaxed),
        mmio_exits: shared.mmio_exits.load(Ordering::Relaxed),
        crash,
        tiers: tiering.as_ref().map(TieringReport::tiers),
        backing: tiering.as_ref().map(TieringReport::backing),
        migration: tiering.as_ref().map(TieringReport::migration),
        tracking: tiering.as_ref().map(|t| t.tracking(cfg.vcpus, run_s)),
        tiering,
        tracking_ab: w.ab.map(|a| a.result()),
        emulation,
        signal: crate::signals::received().map(crate::signals::name),
        liveness: w.live.finish(end),
    })
}
