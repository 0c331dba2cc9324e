//! What no tiervm thread may ever be allowed to call, whatever its role:
//! the calls that start another program or process, reach into another
//! process, change the process's identity or privileges, or change the
//! host's mounts, modules or kernel. A guest (through a vCPU thread) or a
//! client (through the service's threads) that takes over a thread must
//! still be stuck inside it. And the vCPU thread, the guest's own, has an
//! exact list: any change to it is a reviewed change of this test
//! (docs/security.md has the reason for each entry).
//!
//! Planted bug caught (issue 34): `execve` added to the vCPU's list.

use std::collections::BTreeSet;

use tiering::threads::ThreadRole;
use vmm_core::seccomp::allowlist::{
    allowlist, ArgFilter, Ioctl, KVM_GET_REGS, KVM_GET_SREGS, KVM_RUN, TCGETS,
};

/// Never allowed, in any role.
const DENIED: &[(i64, &str)] = &[
    // Another program, another process.
    (libc::SYS_execve, "execve"),
    (libc::SYS_execveat, "execveat"),
    (libc::SYS_fork, "fork"),
    (libc::SYS_vfork, "vfork"),
    // Threads are started before the filters go on; an allowed `clone`
    // would need an argument filter requiring CLONE_THREAD (there is none:
    // teach this test when one is added), `clone3` cannot be filtered at all.
    (libc::SYS_clone, "clone"),
    (libc::SYS_clone3, "clone3"),
    // Into another process.
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_pidfd_open, "pidfd_open"),
    (libc::SYS_pidfd_getfd, "pidfd_getfd"),
    (libc::SYS_kcmp, "kcmp"),
    // Identity and privileges.
    (libc::SYS_setuid, "setuid"),
    (libc::SYS_setgid, "setgid"),
    (libc::SYS_setreuid, "setreuid"),
    (libc::SYS_setregid, "setregid"),
    (libc::SYS_setresuid, "setresuid"),
    (libc::SYS_setresgid, "setresgid"),
    (libc::SYS_setfsuid, "setfsuid"),
    (libc::SYS_setfsgid, "setfsgid"),
    (libc::SYS_setgroups, "setgroups"),
    (libc::SYS_capset, "capset"),
    (libc::SYS_prctl, "prctl"),
    (libc::SYS_seccomp, "seccomp"),
    (libc::SYS_unshare, "unshare"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_personality, "personality"),
    // The file system's shape.
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    // The kernel.
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_iopl, "iopl"),
    // Executable memory by another door (mmap and mprotect are filtered).
    (libc::SYS_pkey_mprotect, "pkey_mprotect"),
    (libc::SYS_ioperm, "ioperm"),
    // New ways out: sockets, new file descriptors onto other things.
    (libc::SYS_socket, "socket"),
    (libc::SYS_socketpair, "socketpair"),
    (libc::SYS_connect, "connect"),
    (libc::SYS_bind, "bind"),
    (libc::SYS_listen, "listen"),
    (libc::SYS_accept, "accept"),
    (libc::SYS_accept4, "accept4"),
    (libc::SYS_sendmsg, "sendmsg"),
    (libc::SYS_recvmsg, "recvmsg"),
    (libc::SYS_memfd_create, "memfd_create"),
    (libc::SYS_userfaultfd, "userfaultfd"),
];

#[test]
fn no_role_may_start_a_process_reach_another_or_change_privileges() {
    let mut violations = Vec::new();
    for role in ThreadRole::ALL {
        for s in allowlist(role) {
            if let Some((_, name)) = DENIED.iter().find(|(nr, _)| *nr == s.nr) {
                violations.push(format!("{}: {name} ({})", role.name(), s.name));
            }
            // Executable memory and unfiltered ioctls are ways out too.
            if [libc::SYS_mmap, libc::SYS_mprotect].contains(&s.nr)
                && !matches!(s.args, ArgFilter::NoExec)
            {
                violations.push(format!(
                    "{}: {} without the no-PROT_EXEC filter",
                    role.name(),
                    s.name
                ));
            }
            if s.nr == libc::SYS_ioctl && !matches!(s.args, ArgFilter::Ioctl(_)) {
                violations.push(format!("{}: ioctl with any request", role.name()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "seccomp allowlists allow forbidden calls:\n{}",
        violations.join("\n")
    );
}

/// The vCPU thread (the guest's) may make exactly these calls, and its
/// ioctls are exactly running the vCPU, reading its registers for a crash
/// report, and the console's isatty.
#[test]
fn the_vcpu_threads_list_is_exactly_the_reviewed_one() {
    let names: BTreeSet<&str> = allowlist(ThreadRole::Vcpu).iter().map(|s| s.name).collect();
    let want: BTreeSet<&str> = [
        // Every thread.
        "futex",
        "brk",
        "mmap",
        "mprotect",
        "mremap",
        "munmap",
        "madvise",
        "clock_nanosleep",
        "clock_gettime",
        "sched_yield",
        "getrandom",
        "write",
        "rt_sigprocmask",
        "rt_sigreturn",
        "sigaltstack",
        "getpid",
        "gettid",
        "tgkill",
        "exit",
        "exit_group",
        // A stopped and continued thread resumes its interrupted sleep
        // (SIGSTOP/SIGCONT, the cgroup freezer, a debugger: issue 32).
        "restart_syscall",
        // The vCPU's own.
        "ioctl",
        "fcntl",
        "close",
    ]
    .into_iter()
    .collect();
    assert_eq!(
        names, want,
        "the vCPU's seccomp allowlist changed: review it (docs/security.md)"
    );
    let ioctls: Vec<Ioctl> = allowlist(ThreadRole::Vcpu)
        .iter()
        .filter_map(|s| match s.args {
            ArgFilter::Ioctl(list) => Some(list.iter().copied()),
            _ => None,
        })
        .flatten()
        .collect();
    let requests: BTreeSet<u64> = ioctls.iter().map(|i| i.request).collect();
    assert_eq!(
        requests,
        [KVM_RUN, KVM_GET_REGS, KVM_GET_SREGS, TCGETS]
            .into_iter()
            .collect(),
        "{ioctls:?}"
    );
    // Every listed call number is the one its name says (a list may not
    // smuggle a call in under another name).
    for s in allowlist(ThreadRole::Vcpu) {
        let nr = match s.name {
            "futex" => libc::SYS_futex,
            "brk" => libc::SYS_brk,
            "mmap" => libc::SYS_mmap,
            "mprotect" => libc::SYS_mprotect,
            "mremap" => libc::SYS_mremap,
            "munmap" => libc::SYS_munmap,
            "madvise" => libc::SYS_madvise,
            "clock_nanosleep" => libc::SYS_clock_nanosleep,
            "clock_gettime" => libc::SYS_clock_gettime,
            "sched_yield" => libc::SYS_sched_yield,
            "getrandom" => libc::SYS_getrandom,
            "write" => libc::SYS_write,
            "rt_sigprocmask" => libc::SYS_rt_sigprocmask,
            "rt_sigreturn" => libc::SYS_rt_sigreturn,
            "sigaltstack" => libc::SYS_sigaltstack,
            "getpid" => libc::SYS_getpid,
            "gettid" => libc::SYS_gettid,
            "tgkill" => libc::SYS_tgkill,
            "exit" => libc::SYS_exit,
            "exit_group" => libc::SYS_exit_group,
            "restart_syscall" => libc::SYS_restart_syscall,
            "ioctl" => libc::SYS_ioctl,
            "fcntl" => libc::SYS_fcntl,
            "close" => libc::SYS_close,
            other => panic!("unexpected {other}"),
        };
        assert_eq!(s.nr, nr, "{}", s.name);
    }
}

/// A role that may open files may read them: glibc's malloc opens and
/// reads `/proc/sys/vm/overcommit_memory` on any thread the first time it
/// shrinks that thread's heap. Where the open is refused (EACCES, the
/// stacked filter) malloc copes; where it is allowed, the read must be too,
/// or the read traps and ends the process (the service's report collector
/// did, at a Kubernetes test's teardown).
#[test]
fn a_role_that_may_open_files_may_read_them() {
    for role in ThreadRole::ALL {
        let list = allowlist(role);
        let opens = list.iter().any(|s| s.nr == libc::SYS_openat);
        let reads = list.iter().any(|s| s.nr == libc::SYS_read);
        assert!(
            !opens || reads,
            "{}: may open files but not read them",
            role.name()
        );
    }
}
