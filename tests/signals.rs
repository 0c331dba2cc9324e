//! SIGINT/SIGTERM: the first asks the guest to stop and the report is
//! written as at the end of --duration, exit 130/143; a second one ends
//! tiervm at once; compare stops after the current run and keeps what it has.

mod common;

use std::io::Read as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::kvm_available;

/// Starts tiervm with `args`, stdout and stderr collected.
fn start(
    args: &[&str],
) -> (
    Child,
    std::thread::JoinHandle<String>,
    std::thread::JoinHandle<String>,
) {
    let mut child = common::tiervm()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    (child, o, e)
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
}

/// Waits for the child within `limit`, else kills it and fails.
fn finish(
    mut child: Child,
    o: std::thread::JoinHandle<String>,
    e: std::thread::JoinHandle<String>,
    limit: Duration,
) -> (i32, String, String) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tiervm did not end within {limit:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        o.join().unwrap(),
        e.join().unwrap(),
    )
}

/// Stands in for "the run is under way": signals sent earlier must work
/// too, this only makes the test exercise a running guest.
const RUNNING: Duration = Duration::from_millis(1500);

#[test]
fn first_signal_stops_the_run_with_a_report() {
    if !kvm_available("first_signal_stops_the_run_with_a_report") {
        return;
    }
    for (sig, code, name) in [
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGTERM, 143, "SIGTERM"),
    ] {
        let (child, o, e) = start(&[
            "run",
            "--mem",
            "64M",
            "--duration",
            "120s",
            "--arg",
            "rss=8M",
            "--arg",
            "wss=4M",
            "--report",
            "json",
        ]);
        std::thread::sleep(RUNNING);
        signal(&child, sig);
        let (got, out, err) = finish(child, o, e, Duration::from_secs(60));
        assert_eq!(got, code, "{name}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("a report");
        assert_eq!(v["stop_reason"], "signal", "{v}");
        assert_eq!(v["signal"], name);
        assert_eq!(
            v["exit_code"], 0,
            "the guest finished after the stop request"
        );
        assert!(v["ops"].as_u64().unwrap() > 0);
        assert!(v["duration_s"].as_f64().unwrap() < 120.0);
    }
}

#[test]
fn second_signal_ends_tiervm_at_once() {
    if !kvm_available("second_signal_ends_tiervm_at_once") {
        return;
    }
    // jmp $ at the entry: the guest never reads the stop request, and
    // --stop-grace would keep tiervm waiting for two minutes.
    let img = common::image_with_entry_code("spin-signal", &[0xeb, 0xfe]);
    let (child, o, e) = start(&[
        "run",
        "--mem",
        "32M",
        "--duration",
        "120s",
        "--stop-grace",
        "120s",
        "--report",
        "json",
        img.to_str().unwrap(),
    ]);
    std::thread::sleep(RUNNING);
    signal(&child, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, libc::SIGINT);
    let (code, out, err) = finish(child, o, e, Duration::from_secs(30));
    assert_eq!(code, 130, "{err}");
    assert!(out.is_empty(), "no report after the second signal: {out}");
}

#[test]
fn compare_stops_after_the_current_run_and_keeps_it() {
    if !common::tiered_kvm_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tiervm-signal-{}", std::process::id()));
    let (child, o, e) = start(&[
        "compare",
        "zipf",
        "--policies",
        "static,nomad",
        "--repeat",
        "3",
        "--mem",
        "128M",
        "--fast",
        "64M",
        "--duration",
        "60s",
        "--arg",
        "rss=16M",
        "--arg",
        "wss=8M",
        "--report",
        "json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    std::thread::sleep(RUNNING * 2);
    signal(&child, libc::SIGTERM);
    let (code, out, err) = finish(child, o, e, Duration::from_secs(60));
    assert_eq!(code, 143, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("results");
    assert_eq!(v["interrupted_by"], "SIGTERM");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "only the run under way: {out}");
    assert_eq!(runs[0]["report"]["stop_reason"], "signal");
    assert!(err.contains("SIGTERM after 1 of 6 runs"), "{err}");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(written["runs"].as_array().unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGSTOP then SIGCONT (a debugger attaching, the cgroup freezer that
/// systemd and Kubernetes pause with) leaves a tiered run running: every
/// thread stopped in a sleep or a timed wait resumes it through
/// `restart_syscall`, which each seccomp allowlist must let through (issue
/// 32: the sampler's filter trapped it and the run ended with exit 159).
#[test]
fn stop_and_continue_leave_a_tiered_run_running() {
    if !common::tiered_kvm_available() {
        return;
    }
    let (child, o, e) = start(&[
        "run",
        "zipf",
        "--mem",
        "128M",
        "--fast",
        "64M",
        "--policy",
        "nomad",
        "--duration",
        "8s",
        "--arg",
        "rss=64M",
        "--arg",
        "wss=32M",
        "--report",
        "json",
    ]);
    std::thread::sleep(RUNNING);
    // Several pauses: each stops every thread wherever it is (sleeping,
    // waiting on a futex with a timeout, polling).
    for _ in 0..3 {
        signal(&child, libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(700));
        signal(&child, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(500));
    }
    let (code, out, err) = finish(child, o, e, Duration::from_secs(60));
    assert_eq!(code, 0, "stopped and continued: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("a report");
    assert_eq!(v["stop_reason"], "duration", "{v}");
}
