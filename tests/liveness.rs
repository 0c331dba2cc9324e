//! Liveness of the live engine at sizes several times the fast tier, on a
//! host whose cores are busy (issue 29): with two competing threads
//! spinning on the test machine's cores, every policy runs a skewed zipf
//! whose resident set is 3x the fast tier on 2 vCPUs, and
//!
//! - the guest never goes one second without progress after set-up
//!   (`liveness.longest_no_progress_s`),
//! - no vCPU stalls on the memory engine (`liveness.stalls`),
//! - the run ends on time (`stop_latency_ms` under a second, stop reason
//!   `duration`),
//! - and, for the migrating mechanisms, memcheck loses no write.
//!
//! Liveness only: speed is the benchmark's (`benches/scripts/live_matrix.py`).
//! A lost wake-up planted in the fault handler (the map-back's wake
//! dropped) fails the first assertion within a minute: the watchdog wakes
//! the vCPU after a second, which is a one-second gap.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{request, run, tiered_kvm_available};
use vmm_core::config::VmRequest;
use vmm_core::report::{RunReport, StopReason};
use vmm_core::tiering_config::{PolicyArg, TrackingArg};

const MEM: u64 = 256 << 20;
/// One test at a time: each keeps the host's two cores busy by itself.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
const FAST: u64 = 32 << 20;

/// Two threads spinning until dropped: the host's cores are shared.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..2)
            .map(|_| {
                let s = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !s.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                        }
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn zipf(policy: PolicyArg) -> VmRequest {
    let mut r = request(
        "zipf",
        MEM,
        2,
        Duration::from_secs(4),
        &["rss=96M", "wss=96M", "theta=0.99"],
    );
    r.sample_ms = 100;
    r.tiering.fast = Some(FAST);
    r.tiering.policy = Some(policy);
    r.tiering.placement = vmm_core::tiering_config::PlacementArg::SlowFirst;
    r
}

fn assert_live(what: &str, r: &RunReport, console: &str) {
    let l = &r.liveness;
    assert!(l.measured, "{what}: the vCPU times were read: {l:?}");
    assert!(
        l.stalls.is_empty(),
        "{what}: a vCPU stalled on the memory engine: {:?}",
        l.stalls
    );
    assert!(
        l.longest_no_progress_s < 1.0,
        "{what}: the guest went {:.2} s without progress after set-up (timeline {:?})",
        l.longest_no_progress_s,
        r.timeline
    );
    assert_eq!(
        r.stop_reason,
        StopReason::Duration,
        "{what}: the run must end at --duration: {l:?} {console}"
    );
    assert!(
        l.stop_latency_ms.is_some_and(|ms| ms < 1000.0),
        "{what}: ended {:?} ms after the stop request",
        l.stop_latency_ms
    );
    assert_eq!(r.exit_code, Some(0), "{what}: {console}");
}

#[test]
fn every_policy_keeps_a_busy_host_guest_progressing_at_three_times_the_fast_tier() {
    if !tiered_kvm_available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let _busy = Busy::start();
    for policy in [
        PolicyArg::Static,
        PolicyArg::Tpp,
        PolicyArg::Nomad,
        PolicyArg::Memtis,
        PolicyArg::Colloid,
        PolicyArg::Mtm,
        PolicyArg::Adaptive,
    ] {
        let req = zipf(policy);
        let (r, console) = run(&req);
        assert!(
            r.ops > 0,
            "{policy:?}: the guest ran: {:?} {:?} {console}",
            r.stop_reason,
            r.liveness
        );
        assert_live(&format!("{policy:?}"), &r, &console);
    }
}

#[test]
fn migrating_policies_lose_no_write_on_a_busy_host() {
    if !tiered_kvm_available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let _busy = Busy::start();
    for policy in [PolicyArg::Nomad, PolicyArg::Tpp, PolicyArg::Adaptive] {
        let mut r = request(
            "memcheck",
            MEM,
            2,
            Duration::from_secs(4),
            &["region=96M", "pattern=hot", "verify_ms=200"],
        );
        r.tiering.fast = Some(FAST);
        r.tiering.policy = Some(policy);
        r.tiering.tracking = Some(TrackingArg::HintFaults);
        let (rep, console) = run(&r);
        assert_eq!(
            rep.guest_metrics.get("mismatched_pages"),
            Some(&0.0),
            "{policy:?}: {console}"
        );
        assert_live(&format!("memcheck {policy:?}"), &rep, &console);
    }
}

/// A run whose `--duration` ends while the guest is still touching its
/// resident set (a 768M zipf and gups on a busy host, stopped after 0.2 s)
/// ends on time and cleanly: the workloads look at the stop flag while
/// they set up and skip the run loop, so the guest acknowledges the stop
/// instead of first-touching the rest in its first batch and being forced
/// 0.5 s later (exit code none, `forced`, as before the fix).
#[test]
fn a_stop_during_set_up_is_acknowledged_on_time() {
    if !tiered_kvm_available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let _busy = Busy::start();
    for (image, args) in [
        ("zipf", &["rss=768M", "wss=768M", "theta=0"][..]),
        ("gups", &["size=768M"][..]),
    ] {
        let mut req = request(image, 1024 << 20, 2, Duration::from_millis(200), args);
        req.tiering.fast = Some(128 << 20);
        req.tiering.policy = Some(PolicyArg::Static);
        req.tiering.placement = vmm_core::tiering_config::PlacementArg::SlowFirst;
        let (r, console) = run(&req);
        let l = &r.liveness;
        assert_eq!(
            r.stop_reason,
            StopReason::Duration,
            "{image}: a stop during set-up is acknowledged: {l:?} {console}"
        );
        assert!(
            l.stop_latency_ms.is_some_and(|ms| ms < 500.0),
            "{image}: ended {:?} ms after the stop request",
            l.stop_latency_ms
        );
        assert_eq!(r.exit_code, Some(0), "{image}: {console}");
    }
}
