//! seccomp's negative control: a vCPU thread that makes a forbidden system
//! call (test-only flag) ends the run with one line naming seccomp, the
//! thread and the call, exit 159; without the filters the same run is fine.

mod common;

use common::{kvm_available, tv};

#[test]
fn a_forbidden_system_call_stops_the_run_with_a_clear_message() {
    if !kvm_available("a_forbidden_system_call_stops_the_run_with_a_clear_message") {
        return;
    }
    let run = [
        "run",
        "--mem",
        "64M",
        "--duration",
        "1s",
        "--arg",
        "rss=8M",
        "--arg",
        "wss=4M",
        "--test-forbidden-syscall",
    ];
    let (code, out, err) = tv(&run);
    assert_eq!(code, 159, "{err}");
    assert!(out.is_empty(), "no report: {out}");
    let line = err
        .lines()
        .find(|l| l.contains("seccomp"))
        .unwrap_or_else(|| panic!("no seccomp line: {err}"));
    assert!(
        line.contains("the vcpu thread made the forbidden system call sysinfo (99)"),
        "{line}"
    );
    let mut off = run.to_vec();
    off.push("--no-seccomp");
    let (code, _, err) = tv(&off);
    assert_eq!(code, 0, "without filters the call is harmless: {err}");
}

/// Every thread of a tiered VM runs under its filter through a whole run
/// (chaos migrations, sampler, engine, fault handler): nothing traps.
#[test]
fn tiered_runs_stay_within_their_allowlists() {
    if !common::tiered_kvm_available() {
        return;
    }
    for policy in [
        &["--policy", "nomad"][..],
        &["--policy", "tpp"],
        &["--policy", "chaos", "--mechanism", "tpm"],
    ] {
        let mut args = vec![
            "run",
            "memcheck",
            "--mem",
            "128M",
            "--fast",
            "32M",
            "--placement",
            "slow-first",
            "--duration",
            "2s",
            "--arg",
            "region=64M",
        ];
        args.extend_from_slice(policy);
        let (code, _, err) = tv(&args);
        assert_eq!(code, 0, "{policy:?}: {err}");
        assert!(!err.contains("seccomp"), "{policy:?}: {err}");
    }
}
