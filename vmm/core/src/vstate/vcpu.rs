//! vCPUs: 64-bit ring-3 entry state, the run loop, exits, kicks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};
use tiervm_guest::abi::{BOOT_INFO_GPA, PORT_BOOTED, PORT_EXIT};

use crate::devices::PortBus;
use crate::vstate::vm::{Vcpu, Vm};

/// A vCPU that could not be set up, started or run.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// `KVM_CREATE_VCPU` failed.
    #[error("KVM_CREATE_VCPU")]
    Create(#[source] kvm_ioctls::Error),
    /// `KVM_SET_CPUID2` failed.
    #[error("KVM_SET_CPUID2")]
    SetCpuid(#[source] kvm_ioctls::Error),
    /// `KVM_GET_SREGS` failed.
    #[error("KVM_GET_SREGS")]
    GetSregs(#[source] kvm_ioctls::Error),
    /// `KVM_SET_SREGS` failed.
    #[error("KVM_SET_SREGS")]
    SetSregs(#[source] kvm_ioctls::Error),
    /// `KVM_SET_FPU` failed.
    #[error("KVM_SET_FPU")]
    SetFpu(#[source] kvm_ioctls::Error),
    /// `KVM_SET_REGS` failed.
    #[error("KVM_SET_REGS")]
    SetRegs(#[source] kvm_ioctls::Error),
    /// `KVM_GET_SUPPORTED_CPUID` failed.
    #[error("KVM_GET_SUPPORTED_CPUID")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    /// The kick signal's handler could not be installed.
    #[error("installing the vCPU kick signal handler")]
    KickHandler(#[source] vmm_sys_util::errno::Error),
    /// The vCPU thread could not be created.
    #[error("spawning a vCPU thread")]
    Spawn(#[source] std::io::Error),
    /// The vCPU failed while running.
    #[error(transparent)]
    Run(#[from] VcpuRunError),
}

/// How a running vCPU failed on the host side.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VcpuRunError {
    /// `KVM_RUN` returned an error that is not the guest's doing.
    #[error("vCPU {id}: KVM_RUN failed")]
    KvmRun {
        /// The vCPU.
        id: u32,
        /// The ioctl's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The vCPU thread panicked.
    #[error("vCPU thread panicked")]
    Panicked,
    /// The vCPU thread's seccomp filter could not be installed.
    #[error("vCPU {id}: {reason}")]
    Seccomp {
        /// The vCPU.
        id: u32,
        /// The seccomp error, described.
        reason: String,
    },
}

type Result<T> = std::result::Result<T, VcpuError>;

const CR0_PE: u64 = 1;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const RFLAGS_RESERVED: u64 = 1 << 1;
const RFLAGS_IOPL3: u64 = 3 << 12;
/// Ring-3 selectors (index | RPL 3), as Linux uses for user code and data.
const USER_CS: u16 = 0x33;
const USER_DS: u16 = 0x2b;
const TSS_SEL: u16 = 0x40;

/// Creates vCPU `id` of `vm` and puts it at `entry` in 64-bit ring 3.
pub fn create_vcpu(
    vm: &Vm,
    id: u32,
    cpuid: &CpuId,
    cr3: u64,
    entry: u64,
    stack_top: u64,
) -> Result<Vcpu> {
    let owned = vm.create_vcpu(id).map_err(VcpuError::Create)?;
    let vcpu = owned.fd();
    vcpu.set_cpuid2(cpuid).map_err(VcpuError::SetCpuid)?;

    let mut sregs = vcpu.get_sregs().map_err(VcpuError::GetSregs)?;
    let code = kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: USER_CS,
        type_: 0xb, // execute/read, accessed
        present: 1,
        dpl: 3,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    let data = kvm_segment {
        selector: USER_DS,
        type_: 0x3, // read/write, accessed
        l: 0,
        db: 1,
        ..code
    };
    sregs.cs = code;
    sregs.ss = data;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.tr = kvm_segment {
        selector: TSS_SEL,
        type_: 0xb, // busy 64-bit TSS
        s: 0,
        dpl: 0,
        db: 0,
        l: 0,
        limit: 0x67,
        ..code
    };
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = cr3;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(VcpuError::SetSregs)?;

    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(VcpuError::SetFpu)?;

    let regs = kvm_regs {
        rip: entry,
        rsp: stack_top,
        rdi: u64::from(id),
        rsi: BOOT_INFO_GPA,
        rflags: RFLAGS_RESERVED | RFLAGS_IOPL3,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(VcpuError::SetRegs)?;
    Ok(owned)
}

/// The host's supported CPUID, passed through to the guest.
pub fn supported_cpuid(kvm: &Kvm) -> Result<CpuId> {
    kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(VcpuError::SupportedCpuid)
}

/// TSC frequency of a vCPU in kHz, or the host's measured one.
pub fn tsc_khz(vcpu: &VcpuFd) -> u64 {
    match vcpu.get_tsc_khz() {
        Ok(khz) if khz > 0 => u64::from(khz),
        _ => measure_host_tsc_khz(),
    }
}

/// The host's time-stamp counter.
pub fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` is part of the x86_64 baseline, so every CPU this
    // binary runs on has it; it only reads the counter (no memory access).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The host's TSC frequency in kHz, measured over 20 ms.
pub fn measure_host_tsc_khz() -> u64 {
    let t0 = Instant::now();
    let c0 = read_tsc();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let c1 = read_tsc();
    let us = t0.elapsed().as_micros().max(1) as u64;
    (c1.wrapping_sub(c0) * 1000 / us).max(1)
}

/// State the vCPU threads share with the runner.
pub struct VcpuShared {
    /// Set by the runner to make vCPU threads leave their loop.
    pub stop: AtomicBool,
    /// KVM exits of all vCPUs.
    pub exits: AtomicU64,
    /// Port-I/O exits to ports no device claims.
    pub unhandled_io: AtomicU64,
    /// MMIO exits (no MMIO devices exist; reads return all ones).
    pub mmio_exits: AtomicU64,
    /// When the first guest instruction ran (first write to PORT_BOOTED).
    pub booted_at: OnceLock<Instant>,
    /// The port devices.
    pub ports: Mutex<PortBus>,
    /// Each vCPU thread installs its seccomp filter before its first KVM_RUN.
    pub seccomp: bool,
    /// TEST ONLY: after installing its filter, each vCPU thread makes a
    /// forbidden system call (the seccomp negative control).
    pub test_forbidden_syscall: bool,
    /// (vCPU id, thread id, start) of every vCPU thread that started (the
    /// liveness watch and the guest clock read their scheduler statistics).
    pub tids: Mutex<Vec<(u32, u32, Instant)>>,
}

/// How a vCPU thread ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuOutcome {
    /// The guest wrote its exit code to PORT_EXIT.
    Exited(u32),
    /// The runner stopped the vCPU.
    Stopped,
    /// The guest crashed; the message has the reason and registers.
    Crashed(String),
    /// KVM_RUN failed for a host reason.
    HostError(VcpuRunError),
}

/// What the run loop does after one exit.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Continue,
    Exited(u32),
    Crash(String),
    HostError(kvm_ioctls::Error),
}

/// Runs `vcpu` until the guest exits, crashes, or the runner stops it.
pub fn run_vcpu(id: u32, mut vcpu: Vcpu, shared: Arc<VcpuShared>) -> VcpuOutcome {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    lock(&shared.tids).push((id, tid as u32, Instant::now()));
    if shared.seccomp {
        if let Err(e) = crate::seccomp::install(tiering::threads::ThreadRole::Vcpu) {
            return VcpuOutcome::HostError(VcpuRunError::Seccomp {
                id,
                reason: crate::exit::describe(&e, e.fix()),
            });
        }
    }
    if shared.test_forbidden_syscall {
        crate::seccomp::forbidden_call();
    }
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return VcpuOutcome::Stopped;
        }
        let step = handle_exit(vcpu.fd_mut().run(), &shared);
        shared.exits.fetch_add(1, Ordering::Relaxed);
        match step {
            Step::Continue => {}
            Step::Exited(code) => return VcpuOutcome::Exited(code),
            Step::Crash(reason) => {
                return VcpuOutcome::Crashed(crash_report(id, vcpu.fd(), &reason))
            }
            Step::HostError(source) => {
                return VcpuOutcome::HostError(VcpuRunError::KvmRun { id, source })
            }
        }
    }
}

fn handle_exit(
    exit: std::result::Result<VcpuExit<'_>, vmm_sys_util::errno::Error>,
    shared: &VcpuShared,
) -> Step {
    match exit {
        Ok(VcpuExit::IoOut(port, data)) => match port {
            PORT_EXIT => {
                let mut b = [0u8; 4];
                let n = data.len().min(4);
                b[..n].copy_from_slice(&data[..n]);
                Step::Exited(u32::from_le_bytes(b))
            }
            PORT_BOOTED => {
                shared.booted_at.get_or_init(Instant::now);
                Step::Continue
            }
            _ => {
                if !lock(&shared.ports).io_out(port, data) {
                    shared.unhandled_io.fetch_add(1, Ordering::Relaxed);
                }
                Step::Continue
            }
        },
        Ok(VcpuExit::IoIn(port, data)) => {
            if !lock(&shared.ports).io_in(port, data) {
                data.fill(0xff);
                shared.unhandled_io.fetch_add(1, Ordering::Relaxed);
            }
            Step::Continue
        }
        Ok(VcpuExit::MmioRead(_, data)) => {
            data.fill(0xff);
            shared.mmio_exits.fetch_add(1, Ordering::Relaxed);
            Step::Continue
        }
        Ok(VcpuExit::MmioWrite(..)) => {
            shared.mmio_exits.fetch_add(1, Ordering::Relaxed);
            Step::Continue
        }
        Ok(VcpuExit::Intr) => Step::Continue,
        Ok(VcpuExit::Shutdown) => Step::Crash(
            "triple fault (KVM_EXIT_SHUTDOWN): the guest took an exception it could not handle"
                .into(),
        ),
        Ok(VcpuExit::InternalError) => {
            Step::Crash("KVM internal error (KVM_EXIT_INTERNAL_ERROR)".into())
        }
        Ok(VcpuExit::FailEntry(reason, cpu)) => Step::Crash(format!(
            "VM entry failed (KVM_EXIT_FAIL_ENTRY, reason {reason:#x}, host cpu {cpu})"
        )),
        Ok(VcpuExit::Hlt) => Step::Crash(
            "guest executed hlt: end a guest by writing its exit code to port 0x501".into(),
        ),
        Ok(other) => Step::Crash(format!("unexpected exit {other:?}")),
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Step::Continue,
        Err(e) if e.errno() == libc::EFAULT => Step::Crash(format!(
            "KVM_RUN failed with EFAULT ({e}): guest memory access failed"
        )),
        Err(e) => Step::HostError(e),
    }
}

impl VcpuShared {
    /// Shared state around the port devices `ports`.
    pub fn new(ports: PortBus) -> Self {
        Self {
            stop: AtomicBool::new(false),
            exits: AtomicU64::new(0),
            unhandled_io: AtomicU64::new(0),
            mmio_exits: AtomicU64::new(0),
            booted_at: OnceLock::new(),
            ports: Mutex::new(ports),
            seccomp: false,
            test_forbidden_syscall: false,
            tids: Mutex::new(Vec::new()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VcpuShared {
    /// The vCPU threads' time asleep in the kernel so far, summed, ns
    /// (wall time since each started, less its time on a CPU and waiting
    /// for one: `crate::liveness`). `None` if no thread could be read.
    pub fn blocked_ns(&self) -> Option<u64> {
        let tids = lock(&self.tids).clone();
        let mut total = None;
        for (_, tid, start) in tids {
            if let Some((run, wait)) = crate::liveness::schedstat(tid) {
                let wall = start.elapsed().as_nanos() as u64;
                *total.get_or_insert(0u64) += wall.saturating_sub(run + wait);
            }
        }
        total
    }
}

/// A one-paragraph description of a crashed vCPU with its registers.
pub fn crash_report(id: u32, vcpu: &VcpuFd, reason: &str) -> String {
    let mut s = format!("vCPU {id}: {reason}");
    if let Ok(r) = vcpu.get_regs() {
        s += &format!(
            "\n  rip={:#018x} rsp={:#018x} rflags={:#010x}\n  rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n  rsi={:#018x} rdi={:#018x} rbp={:#018x}\n  r8={:#018x} r9={:#018x} r10={:#018x} r11={:#018x}\n  r12={:#018x} r13={:#018x} r14={:#018x} r15={:#018x}",
            r.rip, r.rsp, r.rflags, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15
        );
    }
    if let Ok(sr) = vcpu.get_sregs() {
        s += &format!(
            "\n  cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x}(dpl {}) ss={:#x}",
            sr.cr0, sr.cr2, sr.cr3, sr.cr4, sr.efer, sr.cs.selector, sr.cs.dpl, sr.ss.selector
        );
    }
    s
}

/// Installs the (empty) handler of the signal used to kick vCPUs out of
/// `KVM_RUN`; the interrupted ioctl returns `EINTR`.
pub fn install_kick_handler() -> Result<()> {
    extern "C" fn noop(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
    match vmm_sys_util::signal::register_signal_handler(kick_signal(), noop) {
        Ok(()) => Ok(()),
        Err(e) => Err(VcpuError::KickHandler(e)),
    }
}

#[cfg(test)]
#[path = "vcpu_fuzz.rs"]
mod fuzz;

/// The signal that kicks a vCPU thread.
pub fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}
