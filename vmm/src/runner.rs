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
use crate::error::{Error, Result};
use crate::report::{RunReport, StopReason};
use crate::status::{self, TimelinePoint};
use crate::vstate::tiered::{TieredRam, TieringReport};
use crate::vstate::{memory, vcpu, vm};
use tiervm_guest::abi::{STATUS_GPA, STATUS_STOP_OFFSET};

/// How long vCPUs 1.. may keep running after vCPU 0 exited.
const SECONDARY_GRACE: Duration = Duration::from_secs(1);
/// How long the runner waits for kicked vCPU threads before giving up on them.
const KICK_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest sleep of the runner between its checks of the run's deadlines
/// (--duration, --stop-grace) and of vCPU exits, independent of --sample-ms.
const POLL: Duration = Duration::from_millis(5);

/// What a run hook may look at and touch while the VM runs.
pub struct SampleCtx<'a> {
    /// Guest memory (the hook may read or write it, e.g. to inject faults).
    pub mem: &'a GuestMemoryMmap,
    /// The layout of the guest.
    pub layout: &'a memory::Layout,
    /// Seconds since the vCPUs started.
    pub t_s: f64,
    /// Total guest operations so far.
    pub ops: u64,
}

/// Observers of a run (tests, progress display).
pub trait RunHooks {
    /// Called once the VM is about to run, with its tiered memory if any.
    fn on_start(&mut self, _tiered: Option<&std::sync::Arc<tiering::mem::TieredMemory>>) {}

    /// Called after every status sample.
    fn on_sample(&mut self, _ctx: &SampleCtx<'_>) {}

    /// Whether the run should stop now (checked every few ms): the
    /// guest is asked to stop as at the end of `--duration`. Lets a test
    /// run until the events it waits for happened instead of for a fixed time.
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
pub fn run(
    cfg: &VmConfig,
    started: Instant,
    console: Console,
    hooks: &mut dyn RunHooks,
) -> Result<RunReport> {
    // Threads started from here on install their seccomp filters.
    crate::seccomp::set_enabled(cfg.seccomp)?;
    let mut tiered = cfg
        .tiering
        .as_ref()
        .map(|t| TieredRam::new(t, cfg.vcpus))
        .transpose()?;
    // Keeps the tiered backing mapped until everything below is gone.
    let _backing = tiered.as_ref().map(|t| t.memory().clone());
    let mem = match &tiered {
        Some(t) => t.guest().clone(),
        None => memory::create_ram(cfg.mem_bytes, true)?,
    };
    let loaded = Elf::load(&mem, None, &mut Cursor::new(cfg.image.bytes.as_ref()), None)
        .map_err(|e| Error::Image(format!("image '{}': loading failed: {e}", cfg.image.name)))?;
    // The validator decided what to load; the loader must have agreed.
    if loaded.kernel_end != cfg.elf.loaded_end() {
        return Err(Error::Image(format!(
            "image '{}': the loader ended at {:#x} where validation expected {:#x}: the ELF file is ambiguous; relink it",
            cfg.image.name,
            loaded.kernel_end,
            cfg.elf.loaded_end()
        )));
    }
    let cr3 = memory::write_page_tables(&mem, cfg.mem_bytes)?;

    let kvm = vm::open_kvm()?;
    let vm_fd = vm::create_vm(&kvm)?;
    if tiered.is_some() {
        TieredRam::prepare_vm(&vm_fd)?;
    }
    // Tiered RAM starts unlogged too: its harvester switches logging on
    // only while something is tracked (see kvm_dirty_log).
    vm::register_ram(&vm_fd, &mem, false)?;
    let cpuid = vcpu::supported_cpuid(&kvm)?;
    let mut vcpus = Vec::with_capacity(cfg.vcpus as usize);
    for id in 0..cfg.vcpus {
        vcpus.push(vcpu::create_vcpu(
            &kvm,
            &vm_fd,
            id,
            &cpuid,
            cr3,
            cfg.elf.entry,
            cfg.layout.stack_top(id),
        )?);
    }
    let tsc_khz = vcpu::tsc_khz(&vcpus[0]);
    memory::write_boot_info(&mem, &cfg.layout, cfg.seed, tsc_khz, &cfg.args)?;
    vcpu::install_kick_handler()?;
    if let Some(t) = tiered.as_mut() {
        // Everything the VMM wrote so far: boot info, status page, page
        // tables, the image.
        t.note_vmm_write(0, cfg.layout.stacks_base);
        t.start(&vm_fd)?;
    }

    let sink = match console {
        Console::Stderr => Sink::Stderr,
        Console::Memory(s) => s,
    };
    let mut shared =
        vcpu::VcpuShared::new(PortBus::new(ConsoleWriter::new(sink, cfg.console_limit)));
    shared.seccomp = cfg.seccomp;
    shared.test_forbidden_syscall = cfg.test_forbidden_syscall;
    let shared = Arc::new(shared);

    hooks.on_start(_backing.as_ref());
    let run_start = Instant::now();
    let mut threads: Vec<Option<JoinHandle<vcpu::VcpuOutcome>>> = Vec::new();
    for (id, fd) in vcpus.into_iter().enumerate() {
        let sh = shared.clone();
        let h = std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || vcpu::run_vcpu(id as u32, fd, sh))
            .map_err(|e| Error::host("spawning a vCPU thread", e))?;
        threads.push(Some(h));
    }

    // Every thread of this VM exists now: the calling thread's own filter
    // (tiervm run only; it would outlive the run otherwise).
    if cfg.seccomp && cfg.seccomp_main {
        crate::seccomp::install(tiering::threads::ThreadRole::Main)?;
    }
    let mut outcomes: Vec<Option<vcpu::VcpuOutcome>> = vec![None; threads.len()];
    let mut timeline = Vec::new();
    let mut stop_requested_at: Option<Instant> = None;
    let mut vcpu0_exited_at: Option<Instant> = None;
    let mut reason = None;
    let mut next = run_start + cfg.sample;
    let mut ab = cfg
        .tiering
        .as_ref()
        .and_then(|t| t.tracking_ab)
        .map(|p| AbDriver::new(p.as_secs_f64()));
    loop {
        // Wait for the next sample, but never longer than POLL: the stop
        // checks below (duration, grace, exits) run every POLL whatever
        // --sample-ms is.
        let now = Instant::now();
        if next > now && !any_finished(&threads, &outcomes) {
            std::thread::sleep((next - now).min(POLL));
        }
        let now = Instant::now();
        if now >= next {
            next += cfg.sample;
            if next < now {
                next = now + cfg.sample;
            }
            let snap = status::read(&mem, cfg.vcpus);
            let t_s = now.duration_since(run_start).as_secs_f64();
            timeline.push(TimelinePoint {
                t_s,
                ops: snap.total_ops(),
            });
            if let Some(t) = tiered.as_mut() {
                t.drain_samples();
                if let Some(on) = ab.as_mut().and_then(|a| a.on_sample(t_s, snap.total_ops())) {
                    t.set_tracking_paused(!on);
                }
            }
            hooks.on_sample(&SampleCtx {
                mem: &mem,
                layout: &cfg.layout,
                t_s,
                ops: snap.total_ops(),
            });
        }
        reap(&mut threads, &mut outcomes);
        if outcomes.iter().any(|o| {
            matches!(
                o,
                Some(vcpu::VcpuOutcome::Crashed(_) | vcpu::VcpuOutcome::HostError(_))
            )
        }) {
            reason = Some(StopReason::Crashed);
            break;
        }
        if outcomes.iter().all(Option::is_some) {
            break;
        }
        if matches!(outcomes[0], Some(vcpu::VcpuOutcome::Exited(_))) {
            let at = *vcpu0_exited_at.get_or_insert(now);
            if now.duration_since(at) > SECONDARY_GRACE {
                break;
            }
        }
        match stop_requested_at {
            None => {
                let signal = crate::signals::received();
                if signal.is_some() {
                    reason = Some(StopReason::Signal);
                }
                if signal.is_some()
                    || hooks.wants_stop()
                    || cfg
                        .duration
                        .is_some_and(|d| now.duration_since(run_start) >= d)
                {
                    if let Some(t) = &tiered {
                        t.note_vmm_write(STATUS_GPA + STATUS_STOP_OFFSET, 8);
                    }
                    status::request_stop(&mem);
                    stop_requested_at = Some(now);
                }
            }
            Some(at) => {
                if now.duration_since(at) >= cfg.stop_grace {
                    reason = Some(StopReason::Forced);
                    break;
                }
            }
        }
    }

    // End whatever still runs.
    shared.stop.store(true, Ordering::Release);
    let kick_deadline = Instant::now() + KICK_TIMEOUT;
    while threads.iter().any(Option::is_some) && Instant::now() < kick_deadline {
        for h in threads.iter().flatten() {
            let _ = h.kill(vcpu::kick_signal());
        }
        std::thread::sleep(Duration::from_millis(2));
        reap(&mut threads, &mut outcomes);
    }
    let end = Instant::now();
    let snap = status::read(&mem, cfg.vcpus);
    timeline.push(TimelinePoint {
        t_s: end.duration_since(run_start).as_secs_f64(),
        ops: snap.total_ops(),
    });
    let tiering = match tiered.take() {
        Some(t) => Some(t.finish(None)?),
        None => None,
    };
    if let Some(e) = crate::seccomp::take_hook_error() {
        return Err(Error::Host(e));
    }
    let crash = outcomes.iter().find_map(|o| match o {
        Some(vcpu::VcpuOutcome::Crashed(c)) => Some(c.clone()),
        _ => None,
    });
    if let Some(Some(vcpu::VcpuOutcome::HostError(e))) = outcomes
        .iter()
        .find(|o| matches!(o, Some(vcpu::VcpuOutcome::HostError(_))))
    {
        return Err(Error::Host(e.clone()));
    }
    let exit_code = match outcomes[0] {
        Some(vcpu::VcpuOutcome::Exited(c)) => Some(c),
        _ => None,
    };
    // A forced stop or a crash says more than the signal that asked for it.
    let reason = reason.unwrap_or(if stop_requested_at.is_some() {
        StopReason::Duration
    } else {
        StopReason::GuestExited
    });
    let mut ports = shared.ports.lock().unwrap_or_else(|p| p.into_inner());
    ports.flush_console();
    Ok(RunReport {
        image: cfg.image.name.clone(),
        args: cfg.effective_args(),
        seed: cfg.seed,
        vcpus: cfg.vcpus,
        mem_bytes: cfg.mem_bytes,
        duration_s: end.duration_since(run_start).as_secs_f64(),
        exit_code,
        stop_reason: reason,
        ops: snap.total_ops(),
        ops_per_sec: status::ops_per_sec(&timeline),
        timeline,
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
        tiers: tiering.as_ref().map(|t| t.stats.tiers.clone()),
        migration: tiering.as_ref().map(TieringReport::migration),
        tracking: tiering
            .as_ref()
            .map(|t| t.tracking(cfg.vcpus, end.duration_since(run_start).as_secs_f64())),
        tiering,
        tracking_ab: ab.map(|a| a.result()),
        signal: crate::signals::received().map(crate::signals::name),
    })
}

fn any_finished(
    threads: &[Option<JoinHandle<vcpu::VcpuOutcome>>],
    outcomes: &[Option<vcpu::VcpuOutcome>],
) -> bool {
    threads
        .iter()
        .zip(outcomes)
        .any(|(t, o)| o.is_none() && t.as_ref().is_some_and(JoinHandle::is_finished))
}

fn reap(
    threads: &mut [Option<JoinHandle<vcpu::VcpuOutcome>>],
    outcomes: &mut [Option<vcpu::VcpuOutcome>],
) {
    for (slot, out) in threads.iter_mut().zip(outcomes.iter_mut()) {
        if slot.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Some(h) = slot.take() {
                *out = Some(h.join().unwrap_or_else(|_| {
                    vcpu::VcpuOutcome::HostError("vCPU thread panicked".into())
                }));
            }
        }
    }
}
