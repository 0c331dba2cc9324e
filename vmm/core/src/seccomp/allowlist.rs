//! The system calls each tiervm thread may make once its seccomp filter is
//! installed: ONE list per [`ThreadRole`], measured with `strace -f` on runs
//! of every mechanism and policy (docs/security.md has the method and the
//! reason for each entry). Anything else traps (SIGSYS) and ends the run
//! with a message naming the call.
//!
//! To allow a call, add it to the role's list here with the reason, and to
//! docs/security.md (a test checks the two agree).

use tiering::threads::ThreadRole;

/// One allowed system call.
#[derive(Clone, Copy, Debug)]
pub struct Syscall {
    /// Its number (`libc::SYS_*`).
    pub nr: i64,
    /// Its name, as in docs/security.md.
    pub name: &'static str,
    /// What it may be called with.
    pub args: ArgFilter,
}

/// Argument restrictions of an allowed call.
#[derive(Clone, Copy, Debug)]
pub enum ArgFilter {
    /// Any arguments.
    Any,
    /// `ioctl` with one of these requests (argument 1).
    Ioctl(&'static [Ioctl]),
    /// `mmap`/`mprotect`: never with `PROT_EXEC` (argument 2).
    NoExec,
    /// `openat` for reading only: no write, create, truncate or append
    /// flag (argument 2).
    ReadOnly,
}

/// An allowed ioctl request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ioctl {
    /// The request number.
    pub request: u64,
    /// Its name.
    pub name: &'static str,
}

const fn sys(nr: i64, name: &'static str) -> Syscall {
    filtered(nr, name, ArgFilter::Any)
}

const fn filtered(nr: i64, name: &'static str, args: ArgFilter) -> Syscall {
    Syscall { nr, name, args }
}

const fn ioctls(list: &'static [Ioctl]) -> Syscall {
    filtered(libc::SYS_ioctl, "ioctl", ArgFilter::Ioctl(list))
}

const fn io(request: u64, name: &'static str) -> Ioctl {
    Ioctl { request, name }
}

// ioctl requests (checked against the kernel's encoding in the tests).
/// `KVM_RUN`.
pub const KVM_RUN: u64 = 0xae80;
/// `KVM_GET_REGS` (crash reports).
pub const KVM_GET_REGS: u64 = 0x8090_ae81;
/// `KVM_GET_SREGS` (crash reports).
pub const KVM_GET_SREGS: u64 = 0x8138_ae83;
/// `KVM_SET_USER_MEMORY_REGION` (dirty logging switched on and off with
/// the memslot's `KVM_MEM_LOG_DIRTY_PAGES` flag).
pub const KVM_SET_USER_MEMORY_REGION: u64 = 0x4020_ae46;
/// `PAGEMAP_SCAN` on `/proc/self/pagemap` (which pages are resident).
pub const PAGEMAP_SCAN: u64 = 0xc060_6610;
/// `KVM_GET_DIRTY_LOG`.
pub const KVM_GET_DIRTY_LOG: u64 = 0x4010_ae42;
/// `KVM_CLEAR_DIRTY_LOG`.
pub const KVM_CLEAR_DIRTY_LOG: u64 = 0xc018_aec0;
/// `TCGETS` (isatty on stderr).
pub const TCGETS: u64 = 0x5401;

/// Every thread: memory allocation, locks, sleeping, logging to stderr,
/// thread exit (the alternate signal stack and the stack are released),
/// signal delivery (the vCPU kick, SIGINT/SIGTERM handlers that may run on
/// any thread, the SIGSYS report), and the abort path of a panic.
const EVERY_THREAD: &[Syscall] = &[
    sys(libc::SYS_futex, "futex"),
    sys(libc::SYS_brk, "brk"),
    filtered(libc::SYS_mmap, "mmap", ArgFilter::NoExec),
    filtered(libc::SYS_mprotect, "mprotect", ArgFilter::NoExec),
    sys(libc::SYS_mremap, "mremap"),
    sys(libc::SYS_munmap, "munmap"),
    sys(libc::SYS_madvise, "madvise"),
    sys(libc::SYS_clock_nanosleep, "clock_nanosleep"),
    sys(libc::SYS_clock_gettime, "clock_gettime"),
    sys(libc::SYS_sched_yield, "sched_yield"),
    sys(libc::SYS_getrandom, "getrandom"),
    sys(libc::SYS_write, "write"),
    sys(libc::SYS_rt_sigprocmask, "rt_sigprocmask"),
    sys(libc::SYS_rt_sigreturn, "rt_sigreturn"),
    sys(libc::SYS_sigaltstack, "sigaltstack"),
    sys(libc::SYS_getpid, "getpid"),
    sys(libc::SYS_gettid, "gettid"),
    sys(libc::SYS_tgkill, "tgkill"),
    sys(libc::SYS_exit, "exit"),
    sys(libc::SYS_exit_group, "exit_group"),
    // A thread stopped (SIGSTOP, a debugger, the cgroup freezer) in a
    // sleep or a timed wait resumes it through `restart_syscall` on
    // SIGCONT: every thread sleeps or waits with a timeout.
    sys(libc::SYS_restart_syscall, "restart_syscall"),
];

/// Calls refused with `EACCES` instead of trapping, in every thread (a
/// second filter stacked on the allowlist; the stricter answer wins). glibc's
/// malloc opens `/proc/sys/vm/overcommit_memory` the first time it shrinks a
/// thread's heap, whenever that happens, and copes with a refusal (it then
/// keeps shrinking heaps with `madvise`): trapping it would end runs at
/// random. No thread opens a file once its filter is on.
pub const REFUSED: &[Syscall] = &[sys(libc::SYS_openat, "openat"), sys(libc::SYS_open, "open")];

/// userfaultfd ioctls: what the tiered memory's movers, the fault handler
/// and the sampler issue, and what the memory layer's rewrite will
/// (copy, zero page, write-protect, continue, (un)register).
const UFFD_IOCTLS: &[Ioctl] = &[
    io(PAGEMAP_SCAN, "PAGEMAP_SCAN"),
    io(0xc028_aa05, "UFFDIO_MOVE"),
    io(0x8010_aa02, "UFFDIO_WAKE"),
    io(0xc028_aa03, "UFFDIO_COPY"),
    io(0xc020_aa04, "UFFDIO_ZEROPAGE"),
    io(0xc018_aa06, "UFFDIO_WRITEPROTECT"),
    io(0xc020_aa07, "UFFDIO_CONTINUE"),
    io(0xc020_aa00, "UFFDIO_REGISTER"),
    io(0x8010_aa01, "UFFDIO_UNREGISTER"),
];

/// Memory placement calls of the tiered backing (mechanisms and checks).
const PLACEMENT: &[Syscall] = &[
    sys(libc::SYS_move_pages, "move_pages"),
    sys(libc::SYS_mbind, "mbind"),
    sys(libc::SYS_set_mempolicy, "set_mempolicy"),
    sys(libc::SYS_get_mempolicy, "get_mempolicy"),
    sys(libc::SYS_mincore, "mincore"),
];

const VCPU_IOCTLS: &[Ioctl] = &[
    io(KVM_RUN, "KVM_RUN"),
    io(KVM_GET_REGS, "KVM_GET_REGS"),
    io(KVM_GET_SREGS, "KVM_GET_SREGS"),
    io(TCGETS, "TCGETS"),
];

const MIGRATOR_IOCTLS: &[Ioctl] = &[
    io(KVM_GET_DIRTY_LOG, "KVM_GET_DIRTY_LOG"),
    io(KVM_CLEAR_DIRTY_LOG, "KVM_CLEAR_DIRTY_LOG"),
    io(KVM_SET_USER_MEMORY_REGION, "KVM_SET_USER_MEMORY_REGION"),
    io(PAGEMAP_SCAN, "PAGEMAP_SCAN"),
    io(0xc028_aa05, "UFFDIO_MOVE"),
    io(0x8010_aa02, "UFFDIO_WAKE"),
    io(0xc028_aa03, "UFFDIO_COPY"),
    io(0xc020_aa04, "UFFDIO_ZEROPAGE"),
    io(0xc018_aa06, "UFFDIO_WRITEPROTECT"),
    io(0xc020_aa07, "UFFDIO_CONTINUE"),
    io(0xc020_aa00, "UFFDIO_REGISTER"),
    io(0x8010_aa01, "UFFDIO_UNREGISTER"),
    io(TCGETS, "TCGETS"),
];

const VCPU: &[Syscall] = &[
    ioctls(VCPU_IOCTLS),
    // vm-superio / vmm-sys-util check the console's descriptor.
    sys(libc::SYS_fcntl, "fcntl"),
    // The vCPU's own descriptors when the thread ends.
    sys(libc::SYS_close, "close"),
];

const FAULT_HANDLER: &[Syscall] = &[
    // The fault path of tpp runs the migrator here (dirty log included).
    ioctls(MIGRATOR_IOCTLS),
    sys(libc::SYS_read, "read"),
    sys(libc::SYS_poll, "poll"),
];

/// Reading host facts (read-only opens): lazy commits check the free memory
/// of the page's node (`/sys/devices/system/node/*`, `/proc/meminfo`).
const HOST_FACTS: &[Syscall] = &[
    filtered(libc::SYS_openat, "openat", ArgFilter::ReadOnly),
    sys(libc::SYS_read, "read"),
    sys(libc::SYS_close, "close"),
    sys(libc::SYS_statx, "statx"),
    sys(libc::SYS_newfstatat, "newfstatat"),
    sys(libc::SYS_getdents64, "getdents64"),
];

const MIGRATOR: &[Syscall] = &[ioctls(MIGRATOR_IOCTLS)];

const SAMPLER: &[Syscall] = &[ioctls(UFFD_IOCTLS)];

const MAIN: &[Syscall] = &[
    ioctls(MIGRATOR_IOCTLS),
    sys(libc::SYS_close, "close"),
    sys(libc::SYS_fcntl, "fcntl"),
];

/// Reading and writing DAMON's sysfs files (`--tracking damon` only):
/// measured with `strace -f` on the engine's DAMON test (a fake sysfs tree).
const DAMON_SYSFS: &[Syscall] = &[
    sys(libc::SYS_openat, "openat"),
    sys(libc::SYS_read, "read"),
    sys(libc::SYS_close, "close"),
    sys(libc::SYS_statx, "statx"),
    sys(libc::SYS_newfstatat, "newfstatat"),
    sys(libc::SYS_getdents64, "getdents64"),
];

/// A `tiervm serve` worker's link to the service: the socketpair's
/// commands in and answers out (`recvfrom`, `sendto`: std reads and writes
/// sockets with `recv` and `send`), the reader dropped at the end (`close`). Measured with `strace -f` on the service's
/// integration tests (docs/security.md).
const WORKER_LINK: &[Syscall] = &[
    sys(libc::SYS_recvfrom, "recvfrom"),
    sys(libc::SYS_sendto, "sendto"),
    sys(libc::SYS_close, "close"),
    // std checks a descriptor is open before closing it (`F_GETFD`,
    // debug builds), as for the service's threads.
    sys(libc::SYS_fcntl, "fcntl"),
];

/// `tiervm serve`'s rebalancer: requests to the workers over their
/// channels (the replies come through each channel's reader). It holds a
/// clone of each polled VM's channel while it waits for the answers, so
/// when a VM is killed meanwhile (`DELETE ?force=true`: its reader drops
/// the VM's own reference) the rebalancer drops the last one and closes
/// the channel's descriptor (`close`; `fcntl(F_GETFD)`: std checks the
/// descriptor is open first in debug builds). Without them a forced
/// DELETE during a stats poll ended the whole service (issue 32 re-test).
/// Every serve role that handles a channel may close it
/// (`seccomp::tests::serve_roles_may_close_what_they_drop`).
const SERVE_REBALANCE: &[Syscall] = &[
    sys(libc::SYS_sendto, "sendto"),
    sys(libc::SYS_close, "close"),
    sys(libc::SYS_fcntl, "fcntl"),
];

/// `tiervm serve`'s reader of a worker's channel: the replies and events,
/// and when the channel closes the process's exit (reaped, killed if it
/// lingers) and the channel's descriptor.
const SERVE_READER: &[Syscall] = &[
    sys(libc::SYS_recvfrom, "recvfrom"),
    sys(libc::SYS_wait4, "wait4"),
    sys(libc::SYS_kill, "kill"),
    sys(libc::SYS_close, "close"),
    sys(libc::SYS_fcntl, "fcntl"),
];

/// `tiervm serve`'s report collector: asks the ended VM's worker for its
/// report and to exit, writes the report file and the VM's record. It may hold the last
/// reference to an ended VM's channel and then closes its descriptor, and
/// std checks a descriptor is open before closing it (`fcntl(F_GETFD)`,
/// debug builds), as for the readers: a debug service in a fresh-clone CI
/// run ended on this call from this thread (2026-11-26).
const SERVE_REPORTS: &[Syscall] = &[
    sys(libc::SYS_sendto, "sendto"),
    sys(libc::SYS_openat, "openat"),
    sys(libc::SYS_close, "close"),
    sys(libc::SYS_fcntl, "fcntl"),
    // Reports and VM records replace their old file atomically (a
    // temporary file renamed over it, never written through a link).
    sys(libc::SYS_renameat, "renameat"),
    // A removed VM's record (`DELETE` of an ended VM) is unlinked.
    sys(libc::SYS_unlinkat, "unlinkat"),
    // glibc's malloc reads `/proc/sys/vm/overcommit_memory` the first time
    // it shrinks this thread's heap; the open is allowed here (the thread
    // writes files), so the read must be too (a Kubernetes end-to-end run
    // ended the service on it at teardown, 2026-11-28).
    sys(libc::SYS_read, "read"),
];

/// Whether `role` may open files (then no call is refused with EACCES).
pub fn opens_files(role: ThreadRole) -> bool {
    groups(role)
        .iter()
        .any(|g| g.iter().any(|s| s.nr == libc::SYS_openat))
}

/// The groups of calls `role` may make (no allocation: the SIGSYS
/// handler looks names up here).
pub fn groups(role: ThreadRole) -> &'static [&'static [Syscall]] {
    match role {
        ThreadRole::Vcpu => &[EVERY_THREAD, VCPU],
        // Every thread that may commit guest pages (faults, migrations,
        // unparking) reads the node's free memory first.
        ThreadRole::FaultHandler => &[EVERY_THREAD, FAULT_HANDLER, PLACEMENT, HOST_FACTS],
        ThreadRole::Engine | ThreadRole::Chaos | ThreadRole::Resize => {
            &[EVERY_THREAD, MIGRATOR, PLACEMENT, HOST_FACTS]
        }
        ThreadRole::Sampler => &[EVERY_THREAD, SAMPLER, PLACEMENT, HOST_FACTS],
        ThreadRole::Main => &[EVERY_THREAD, MAIN, PLACEMENT, HOST_FACTS],
        ThreadRole::EngineDamon => &[EVERY_THREAD, MIGRATOR, PLACEMENT, DAMON_SYSFS],
        ThreadRole::DamonReader => &[EVERY_THREAD, DAMON_SYSFS],
        ThreadRole::WorkerLink => &[EVERY_THREAD, WORKER_LINK],
        ThreadRole::ServeRebalance => &[EVERY_THREAD, SERVE_REBALANCE],
        ThreadRole::ServeReader => &[EVERY_THREAD, SERVE_READER],
        ThreadRole::ServeReports => &[EVERY_THREAD, SERVE_REPORTS],
        // Sleeps, reads and writes the shared emulation region (plain
        // memory), `madvise`s the boot measurement's buffer away.
        ThreadRole::LatencyEmulation => &[EVERY_THREAD],
    }
}

/// The calls `role` may make once its filter is installed.
pub fn allowlist(role: ThreadRole) -> Vec<Syscall> {
    groups(role)
        .iter()
        .flat_map(|p| p.iter().copied())
        .collect()
}
