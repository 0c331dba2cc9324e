//! seccomp: a syscall allowlist per thread, installed once the thread's
//! setup is done (rust-vmm's seccompiler compiles the BPF).
//!
//! - vCPU threads install theirs before their first `KVM_RUN`; the tiering
//!   threads (fault handler, engine, sampler, chaos driver) through
//!   [`tiering::threads`]' start hook; the main thread of `tiervm run`
//!   after every other thread exists (filters are inherited by threads
//!   created later). `tiervm compare`'s main thread builds one VM after
//!   another and keeps no filter; its VMs' threads do.
//! - A call outside the list traps (SIGSYS): the handler writes one line
//!   naming seccomp, the thread's role and the call, and ends the process
//!   with [`EXIT_SECCOMP`]. `--no-seccomp` turns all of it off (debugging).
//!
//! The lists are in [`allowlist`]; docs/security.md explains each entry.

pub mod allowlist;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use tiering::threads::ThreadRole;

/// Why seccomp could not confine a thread.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A role's allowlist did not compile to BPF.
    #[error("compiling the seccomp filters")]
    Compile(#[source] Arc<seccompiler::Error>),
    /// A filter was used before [`prepare`] compiled it.
    #[error("seccomp filters used before seccomp::prepare")]
    NotPrepared,
    /// The kernel refused a thread's filter.
    #[error("installing the {role} thread's seccomp filter")]
    Install {
        /// The thread's role.
        role: &'static str,
        /// The kernel's reason.
        #[source]
        source: seccompiler::Error,
    },
    /// A tiering thread could not install its filter (reported by the run).
    #[error("{0}")]
    Thread(String),
    /// The SIGSYS handler could not be installed.
    #[error("installing the SIGSYS handler")]
    SigsysHandler(#[source] std::io::Error),
}

impl SeccompError {
    /// What the user can do about it.
    pub fn fix(&self) -> Option<&'static str> {
        Some("run with --no-seccomp to go on without (debugging only)")
    }
}

type Result<T> = std::result::Result<T, SeccompError>;
use allowlist::{allowlist, ArgFilter};

/// Exit code after a forbidden system call: 128 + SIGSYS, as if the signal
/// had killed the process.
pub const EXIT_SECCOMP: i32 = 128 + libc::SIGSYS;

/// Whether threads of VMs started from now on install their filters.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The first failure to install a tiering thread's filter.
static HOOK_ERROR: Mutex<Option<String>> = Mutex::new(None);
/// A filter compilation's outcome, cached (shared: the error is not `Clone`).
type Compiled<T> = std::result::Result<T, Arc<seccompiler::Error>>;
static FILTERS: OnceLock<Compiled<HashMap<ThreadRole, BpfProgram>>> = OnceLock::new();

thread_local! {
    /// This thread's role, for the SIGSYS message (index into ThreadRole::ALL).
    static ROLE: std::cell::Cell<u8> = const { std::cell::Cell::new(u8::MAX) };
}

fn compile(role: ThreadRole) -> std::result::Result<BpfProgram, seccompiler::Error> {
    let cond = |i, op, v| SeccompCondition::new(i, SeccompCmpArgLen::Qword, op, v);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // An empty rule list allows any arguments; it wins over conditions.
    let mut unconditional = std::collections::BTreeSet::new();
    // Where the refusing filter is stacked, REFUSED calls pass this one and
    // that one answers them (EACCES); elsewhere the role's own rules decide.
    let refused: &[allowlist::Syscall] = if allowlist::opens_files(role) {
        &[]
    } else {
        allowlist::REFUSED
    };
    for s in allowlist(role).into_iter().chain(refused.iter().copied()) {
        let conditions: Vec<SeccompRule> = match s.args {
            ArgFilter::Any => Vec::new(),
            ArgFilter::Ioctl(list) => list
                .iter()
                .map(|i| SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, i.request)?]))
                .collect::<std::result::Result<_, _>>()?,
            ArgFilter::NoExec => vec![SeccompRule::new(vec![cond(
                2,
                SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
                0,
            )?])?],
            ArgFilter::ReadOnly => {
                let writes =
                    libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND;
                vec![SeccompRule::new(vec![cond(
                    2,
                    SeccompCmpOp::MaskedEq(writes as u64),
                    0,
                )?])?]
            }
        };
        if conditions.is_empty() {
            unconditional.insert(s.nr);
            rules.insert(s.nr, Vec::new());
        } else if !unconditional.contains(&s.nr) {
            rules.entry(s.nr).or_default().extend(conditions);
        }
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        std::env::consts::ARCH.try_into()?,
    )?;
    Ok(filter.try_into()?)
}

/// The filter stacked on every allowlist: REFUSED calls fail with EACCES.
fn compile_refusals() -> std::result::Result<BpfProgram, seccompiler::Error> {
    let filter = SeccompFilter::new(
        allowlist::REFUSED
            .iter()
            .map(|s| (s.nr, Vec::new()))
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        std::env::consts::ARCH.try_into()?,
    )?;
    Ok(filter.try_into()?)
}

static REFUSALS: OnceLock<Compiled<BpfProgram>> = OnceLock::new();

/// Compiles every role's filter (once) and installs the SIGSYS handler.
pub fn prepare() -> Result<()> {
    let filters = FILTERS.get_or_init(|| {
        ThreadRole::ALL
            .iter()
            .map(|&r| compile(r).map(|p| (r, p)))
            .collect::<std::result::Result<_, _>>()
            .map_err(Arc::new)
    });
    if let Err(e) = filters {
        return Err(SeccompError::Compile(e.clone()));
    }
    if let Err(e) = REFUSALS.get_or_init(|| compile_refusals().map_err(Arc::new)) {
        return Err(SeccompError::Compile(e.clone()));
    }
    install_sigsys_handler()
}

/// Turns filtering of VM threads on or off for the runs that follow, and
/// makes the tiering threads install theirs.
pub fn set_enabled(on: bool) -> Result<()> {
    if on {
        prepare()?;
        tiering::threads::set_thread_start_hook(Some(on_tiering_thread_start));
    }
    ENABLED.store(on, Ordering::SeqCst);
    Ok(())
}

/// Whether VM threads install filters.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// A compiled filter, or why there is none.
fn compiled<T>(f: Option<&Compiled<T>>) -> Result<&T> {
    match f {
        None => Err(SeccompError::NotPrepared),
        Some(Err(e)) => Err(SeccompError::Compile(e.clone())),
        Some(Ok(p)) => Ok(p),
    }
}

/// Installs `role`'s filter on the calling thread.
pub fn install(role: ThreadRole) -> Result<()> {
    let filters = compiled(FILTERS.get())?;
    let prog = filters.get(&role).ok_or(SeccompError::NotPrepared)?;
    let refusals = compiled(REFUSALS.get())?;
    let idx = ThreadRole::ALL.iter().position(|r| *r == role).unwrap_or(0);
    ROLE.with(|r| r.set(idx as u8));
    let refuse = if allowlist::opens_files(role) {
        Ok(())
    } else {
        seccompiler::apply_filter(refusals)
    };
    refuse
        .and_then(|()| seccompiler::apply_filter(prog))
        .map_err(|source| SeccompError::Install {
            role: role.name(),
            source,
        })
}

fn on_tiering_thread_start(role: ThreadRole) {
    if !enabled() {
        return;
    }
    if let Err(e) = install(role) {
        let line = crate::exit::chain(&e);
        tracing::error!("{line}");
        HOOK_ERROR
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(line);
    }
}

/// The first failure of a tiering thread to install its filter, if any.
pub fn take_hook_error() -> Option<SeccompError> {
    HOOK_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .map(SeccompError::Thread)
}

/// TEST ONLY: a system call no thread may make (the negative control).
pub fn forbidden_call() {
    let mut info = std::mem::MaybeUninit::<libc::sysinfo>::uninit();
    // SAFETY: sysinfo(2) writes one struct sysinfo into `info`, which is
    // large enough; the result is not read.
    unsafe { libc::sysinfo(info.as_mut_ptr()) };
}

/// Names of calls a report may need (the allowlists' and some forbidden ones).
fn syscall_name(nr: i64) -> &'static str {
    // Called from the SIGSYS handler: no allocation, no locks.
    for role in ThreadRole::ALL {
        for group in allowlist::groups(role) {
            if let Some(s) = group.iter().find(|s| s.nr == nr) {
                return s.name;
            }
        }
    }
    match nr {
        libc::SYS_sysinfo => "sysinfo",
        libc::SYS_execve => "execve",
        libc::SYS_execveat => "execveat",
        libc::SYS_fork => "fork",
        libc::SYS_vfork => "vfork",
        libc::SYS_clone => "clone",
        libc::SYS_clone3 => "clone3",
        libc::SYS_open => "open",
        libc::SYS_openat => "openat",
        libc::SYS_socket => "socket",
        libc::SYS_connect => "connect",
        libc::SYS_ptrace => "ptrace",
        libc::SYS_kill => "kill",
        libc::SYS_mount => "mount",
        libc::SYS_prctl => "prctl",
        libc::SYS_seccomp => "seccomp",
        _ => "?",
    }
}

/// Appends `s` to `buf` at `len`; returns the new length.
fn put(buf: &mut [u8], mut len: usize, s: &[u8]) -> usize {
    for &b in s {
        if len < buf.len() {
            buf[len] = b;
            len += 1;
        }
    }
    len
}

/// Appends `v` in hex (`0x...`).
fn put_hex(buf: &mut [u8], len: usize, v: u64) -> usize {
    let mut digits = [0u8; 16];
    let mut d = digits.len();
    let mut v = v;
    loop {
        d -= 1;
        digits[d] = b"0123456789abcdef"[(v & 0xf) as usize];
        v >>= 4;
        if v == 0 || d == 0 {
            break;
        }
    }
    let len = put(buf, len, b"0x");
    put(buf, len, &digits[d..])
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // siginfo_t for SIGSYS (x86_64): si_call_addr at byte 16, si_syscall
    // (int) at byte 24.
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler;
    // the read stays inside its 128 bytes.
    let nr = unsafe {
        info.cast::<u8>()
            .add(24)
            .cast::<libc::c_int>()
            .read_unaligned()
    };
    let role = ROLE
        .try_with(|r| r.get())
        .ok()
        .and_then(|i| ThreadRole::ALL.get(i as usize))
        .map_or("unfiltered", |r| r.name());
    let mut buf = [0u8; 256];
    let mut n = put(&mut buf, 0, b"tiervm: seccomp: the ");
    n = put(&mut buf, n, role.as_bytes());
    n = put(&mut buf, n, b" thread made the forbidden system call ");
    n = put(&mut buf, n, syscall_name(i64::from(nr)).as_bytes());
    n = put(&mut buf, n, b" (");
    let mut digits = [0u8; 12];
    let mut v = nr.unsigned_abs();
    let mut d = digits.len();
    loop {
        d -= 1;
        digits[d] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 || d == 0 {
            break;
        }
    }
    n = put(&mut buf, n, &digits[d..]);
    if i64::from(nr) == libc::SYS_ioctl && !ctx.is_null() {
        // SAFETY: for a SA_SIGINFO handler the kernel passes the interrupted
        // context as a ucontext_t; RSI held the ioctl's request argument.
        let request =
            unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RSI as usize] };
        n = put(&mut buf, n, b", request ");
        n = put_hex(&mut buf, n, request as u64);
    }
    n = put(
        &mut buf,
        n,
        b"); the run is stopped (allowlists: docs/security.md; --no-seccomp to debug)\n",
    );
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `buf[..n]` is
    // initialized.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
        libc::_exit(EXIT_SECCOMP);
    }
}

fn install_sigsys_handler() -> Result<()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler only calls
        // async-signal-safe functions (write, _exit) and reads a
        // const-initialized thread-local.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
                result = Err(SeccompError::SigsysHandler(std::io::Error::last_os_error()));
            }
        }
    });
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_compiles() {
        for role in ThreadRole::ALL {
            let p = compile(role).unwrap_or_else(|e| panic!("{}: {e}", role.name()));
            assert!(!p.is_empty());
        }
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_encoding() {
        use allowlist::*;
        let ioc =
            |dir: u64, nr: u64, size: usize| (dir << 30) | ((size as u64) << 16) | (0xae << 8) | nr;
        assert_eq!(KVM_RUN, ioc(0, 0x80, 0));
        assert_eq!(
            KVM_GET_REGS,
            ioc(2, 0x81, std::mem::size_of::<kvm_bindings::kvm_regs>())
        );
        assert_eq!(
            KVM_GET_SREGS,
            ioc(2, 0x83, std::mem::size_of::<kvm_bindings::kvm_sregs>())
        );
        assert_eq!(
            KVM_GET_DIRTY_LOG,
            ioc(1, 0x42, std::mem::size_of::<kvm_bindings::kvm_dirty_log>())
        );
        assert_eq!(
            KVM_CLEAR_DIRTY_LOG,
            ioc(
                3,
                0xc0,
                std::mem::size_of::<kvm_bindings::kvm_clear_dirty_log>()
            )
        );
    }

    /// Runs `f` on a new thread under `role`'s filter.
    fn under<T: Send + 'static>(role: ThreadRole, f: impl FnOnce() -> T + Send + 'static) -> T {
        prepare().unwrap();
        std::thread::spawn(move || {
            install(role).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// The vCPU thread gets EACCES for openat (glibc's malloc probe copes);
    /// threads that commit guest pages may open files read-only; the DAMON
    /// roles may also write (DAMON's sysfs). (A write-open by a read-only
    /// role traps, which ends the process: tests/security.rs covers traps.)
    #[test]
    fn file_access_per_role() {
        let dir = std::env::temp_dir().join(format!("tiervm-seccomp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("state");
        std::fs::write(&file, "on").unwrap();
        let f = file.clone();
        let refused = under(ThreadRole::Vcpu, move || {
            std::fs::read_to_string(&f).map_err(|e| e.raw_os_error())
        });
        assert_eq!(refused, Err(Some(libc::EACCES)));
        for role in [
            ThreadRole::FaultHandler,
            ThreadRole::Engine,
            ThreadRole::Main,
        ] {
            let f = file.clone();
            let back = under(role, move || std::fs::read_to_string(&f).unwrap());
            assert_eq!(back, "on", "{}", role.name());
        }
        for role in [ThreadRole::EngineDamon, ThreadRole::DamonReader] {
            let f = file.clone();
            let back = under(role, move || {
                std::fs::write(&f, "off").unwrap();
                let _ = std::fs::read_dir(f.parent().unwrap()).unwrap().count();
                std::fs::read_to_string(&f).unwrap()
            });
            assert_eq!(back, "off", "{}", role.name());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every `tiervm serve` thread role that may drop the last reference
    /// to a shared descriptor-owning object (a worker's channel, the
    /// state directory's descriptors, a log) may close it: the rebalancer
    /// (it holds clones of the channels it polls, and a VM killed meanwhile
    /// leaves it the last one), each channel's reader (it clears the VM's
    /// channel when it closes, and may hold the host's last reference at
    /// exit), the report collector (it holds an ended VM's channel).
    /// Before the fix the rebalancer could not, and a forced DELETE during
    /// a stats poll ended the service (issue 32 re-test). Each drops a
    /// socket under its filter: a trap would end this test process.
    #[test]
    fn serve_roles_may_close_what_they_drop() {
        let roles = [
            ThreadRole::ServeRebalance,
            ThreadRole::ServeReader,
            ThreadRole::ServeReports,
            ThreadRole::WorkerLink,
        ];
        for role in roles {
            for call in ["close", "fcntl"] {
                assert!(
                    allowlist(role).iter().any(|s| s.name == call),
                    "{} may drop a shared channel but cannot `{call}` it",
                    role.name()
                );
            }
        }
        for role in roles {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let shared = std::sync::Arc::new(a);
            let held = shared.clone();
            drop(shared);
            under(role, move || drop(held));
            drop(b);
        }
    }

    /// The SIGSYS report's pieces (written by the handler, which cannot
    /// allocate): bounded appends, hex, the call names it knows.
    #[test]
    fn the_report_helpers_write_bounded_bytes_hex_and_names() {
        let mut buf = [0u8; 6];
        assert_eq!(put(&mut buf, 0, b"abc"), 3);
        assert_eq!(put(&mut buf, 3, b"defgh"), 6, "stops at the end");
        assert_eq!(&buf, b"abcdef");
        assert_eq!(put(&mut buf, 6, b"x"), 6);
        let hex = |v: u64| {
            let mut b = [0u8; 32];
            let n = put_hex(&mut b, 0, v);
            String::from_utf8(b[..n].to_vec()).unwrap()
        };
        assert_eq!(hex(0), "0x0");
        assert_eq!(hex(0x1234_abcd), "0x1234abcd");
        assert_eq!(hex(0xf0), "0xf0");
        assert_eq!(hex(u64::MAX), "0xffffffffffffffff");
        let mut b = [0u8; 8];
        let n = put(&mut b, 0, b"<");
        assert_eq!(put_hex(&mut b, n, 0xab), 5);
        assert_eq!(&b[..5], b"<0xab");
        // Calls no list allows, by name; one a list allows; an unknown one.
        for (nr, name) in [
            (libc::SYS_sysinfo, "sysinfo"),
            (libc::SYS_execve, "execve"),
            (libc::SYS_execveat, "execveat"),
            (libc::SYS_fork, "fork"),
            (libc::SYS_vfork, "vfork"),
            (libc::SYS_clone, "clone"),
            (libc::SYS_clone3, "clone3"),
            (libc::SYS_open, "open"),
            (libc::SYS_openat, "openat"),
            (libc::SYS_socket, "socket"),
            (libc::SYS_connect, "connect"),
            (libc::SYS_ptrace, "ptrace"),
            (libc::SYS_kill, "kill"),
            (libc::SYS_mount, "mount"),
            (libc::SYS_prctl, "prctl"),
            (libc::SYS_seccomp, "seccomp"),
            (libc::SYS_ioctl, "ioctl"),
            (libc::SYS_read, "read"),
            (100_000, "?"),
        ] {
            assert_eq!(syscall_name(nr), name, "{nr}");
        }
        assert_eq!(EXIT_SECCOMP, 159);
        let fix = SeccompError::NotPrepared.fix().unwrap();
        assert!(fix.contains("--no-seccomp"), "{fix}");
    }

    /// Runs this test binary again, only `test`, with `TIERVM_SECCOMP_CHILD`
    /// set to `case`: for what ends a process (a trap) or needs one in
    /// which nothing was prepared.
    fn child(test: &str, case: &str) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("TIERVM_SECCOMP_CHILD", case)
            .output()
            .unwrap()
    }

    /// A call outside a thread's list ends the process with EXIT_SECCOMP
    /// and one line naming the role, the call, its number and, for an
    /// ioctl, the request; a read-only role's open with any flag that
    /// writes (O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND) traps too.
    #[test]
    fn a_forbidden_call_traps_with_the_role_call_and_request() {
        const TEST: &str = "seccomp::tests::a_forbidden_call_traps_with_the_role_call_and_request";
        if let Ok(case) = std::env::var("TIERVM_SECCOMP_CHILD") {
            prepare().unwrap();
            match case.as_str() {
                "sysinfo" => {
                    install(ThreadRole::Vcpu).unwrap();
                    forbidden_call();
                }
                "ioctl" => {
                    install(ThreadRole::Vcpu).unwrap();
                    // SAFETY: an ioctl on no descriptor; it traps first.
                    unsafe { libc::ioctl(-1, 0x1234_abcd as _) };
                }
                flags => {
                    // An open with one of the flags that write.
                    let flags: libc::c_int = flags.parse().unwrap();
                    let f = std::env::temp_dir()
                        .join(format!("tiervm-seccomp-w-{}", std::process::id()));
                    std::fs::write(&f, "x").unwrap();
                    let path = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
                    install(ThreadRole::FaultHandler).unwrap();
                    // SAFETY: a NUL-terminated path; the descriptor (were the
                    // call allowed) is left open: the process exits.
                    unsafe { libc::open(path.as_ptr(), flags, 0o600) };
                }
            }
            // Not trapped: a plain exit the parent tells apart.
            std::process::exit(0);
        }
        let open = "the fault-handler thread made the forbidden system call openat (257); ";
        let flags = [
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_RDONLY | libc::O_CREAT,
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_RDONLY | libc::O_APPEND,
        ]
        .map(|f| f.to_string());
        let cases = [
            (
                "sysinfo",
                "the vcpu thread made the forbidden system call sysinfo (99); ",
            ),
            (
                "ioctl",
                "the vcpu thread made the forbidden system call ioctl (16, request 0x1234abcd); ",
            ),
        ]
        .into_iter()
        .chain(flags.iter().map(|f| (f.as_str(), open)));
        for (case, line) in cases {
            let out = child(TEST, case);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(EXIT_SECCOMP), "{case}: {err}");
            let want = format!(
                "tiervm: seccomp: {line}the run is stopped (allowlists: docs/security.md; \
                 --no-seccomp to debug)\n"
            );
            assert!(err.contains(&want), "{case}: {err}");
        }
    }

    /// Tiering threads install their role's filter through the start hook
    /// once filtering is on; a failure is kept for the run to report.
    #[test]
    fn the_tiering_start_hook_installs_when_enabled_and_keeps_its_error() {
        const TEST: &str =
            "seccomp::tests::the_tiering_start_hook_installs_when_enabled_and_keeps_its_error";
        match std::env::var("TIERVM_SECCOMP_CHILD").as_deref() {
            Ok("unprepared") => {
                // Nothing prepared in this process: off, the hook does
                // nothing; on, it fails (not prepared) and keeps that.
                assert!(!enabled());
                on_tiering_thread_start(ThreadRole::Engine);
                assert!(take_hook_error().is_none());
                ENABLED.store(true, Ordering::SeqCst);
                on_tiering_thread_start(ThreadRole::Engine);
                let e = take_hook_error().expect("the hook's error");
                assert!(e.to_string().contains("before seccomp::prepare"), "{e}");
                assert!(take_hook_error().is_none(), "taken once");
                std::process::exit(0);
            }
            Ok("enabled") => {
                // On: a tiering thread's start installs its filter (the
                // engine may not call sysinfo: it traps).
                set_enabled(true).unwrap();
                assert!(enabled());
                let _ = std::thread::spawn(|| {
                    tiering::threads::started(ThreadRole::Engine);
                    forbidden_call();
                })
                .join();
                std::process::exit(0);
            }
            Ok(_) => unreachable!(),
            Err(_) => {}
        }
        let out = child(TEST, "unprepared");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        let out = child(TEST, "enabled");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_SECCOMP), "{err}");
        assert!(
            err.contains("the engine thread made the forbidden system call sysinfo (99)"),
            "{err}"
        );
    }

    /// docs/security.md lists every allowed call of every role.
    #[test]
    fn security_doc_lists_every_allowed_call() {
        let doc = include_str!("../../../../docs/security.md");
        for role in ThreadRole::ALL {
            for s in allowlist(role) {
                assert!(
                    doc.contains(&format!("`{}`", s.name)),
                    "docs/security.md lacks `{}`",
                    s.name
                );
                if let ArgFilter::Ioctl(list) = s.args {
                    for i in list {
                        assert!(doc.contains(i.name), "docs/security.md lacks {}", i.name);
                    }
                }
            }
        }
    }
}
