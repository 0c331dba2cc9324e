//! Tiered guest memory on KVM: memcheck under chaos migration never loses a
//! write, and the same run without the transactional dirty check does.

mod common;

use std::time::Duration;

use common::{request, run, run_with, tiered_kvm_available};
use vmm_core::config::VmRequest;
use vmm_core::report::RunReport;
use vmm_core::tiering_config::{MechanismArg, PolicyArg, UnitArg};

const MEM: u64 = 256 << 20;
const REGION: u64 = 64 << 20;

fn chaos(
    secs: u64,
    rate: f64,
    mech: MechanismArg,
    unit: UnitArg,
    skip_dirty_check: bool,
) -> VmRequest {
    let mut r = request(
        "memcheck",
        MEM,
        2,
        Duration::from_secs(secs),
        &["region=64M", "pattern=hot", "verify_ms=100"],
    );
    r.tiering.fast = Some(96 << 20);
    r.tiering.policy = Some(PolicyArg::Chaos);
    r.tiering.chaos_rate = Some(rate);
    r.tiering.chaos_mix = Some("1:1".into());
    r.tiering.mechanism = Some(mech);
    r.tiering.chaos_unit = Some(unit);
    r.tiering.skip_dirty_check = skip_dirty_check;
    r
}

fn check_accounting(r: &RunReport) {
    let tiers = r.tiers.as_ref().expect("tiers reported");
    assert_eq!(tiers.len(), 2);
    // Lazy commit: only what the guest touched is on a tier (memcheck's
    // 64 MiB region at least, never more than the guest).
    let guest_pages: u64 = tiers.iter().map(|t| t.guest_pages).sum();
    assert!(
        (REGION / 4096..=MEM / 4096).contains(&guest_pages),
        "every touched guest page on exactly one tier: {guest_pages}"
    );
    for t in tiers {
        assert!(t.pages <= t.capacity_pages, "{t:?}");
    }
    let t = r.tiering.as_ref().expect("tiering report");
    assert_eq!(
        t.node_check, "ok",
        "every page on its tier's node (move_pages)"
    );
    let one_node = tiering::host::numa_nodes()
        .map(|n| n.len() == 1)
        .unwrap_or(true);
    if one_node {
        assert!(tiers.iter().all(|t| t.emulated));
    }
}

#[test]
fn memcheck_under_tpm_chaos_loses_nothing() {
    if !tiered_kvm_available() {
        return;
    }
    // Runs until the events happened (a thousand commits, an abort, a
    // shadow demotion, both directions), however long that takes here; the
    // 120 s run length and the watchdog bound it.
    let mut until = common::UntilEvents::new(|s: &tiering::mem::MemStats| {
        s.tpm_commits >= 1000
            && s.tpm_aborts > 0
            && s.shadow_demotions > 0
            && s.promotions > 0
            && s.demotions > 0
    });
    let (r, console) = run_with(
        &chaos(120, 50_000.0, MechanismArg::Tpm, UnitArg::Page4k, false),
        &mut until,
    );
    let m = r.migration.as_ref().expect("migration counters");
    assert!(until.reached, "the events never happened: {m:?}");
    assert_eq!(r.exit_code, Some(0), "lost writes: {console} {m:?}");
    assert_eq!(r.guest_metrics.get("mismatched_pages"), Some(&0.0));
    assert!(m.tpm_commits >= 1000, "{m:?}");
    assert!(
        m.tpm_aborts > 0,
        "a write-heavy guest must abort some transactions: {m:?}"
    );
    assert!(m.shadow_demotions > 0, "{m:?}");
    // The mechanisms' own time is measured (the simulator's unit costs).
    assert!(
        m.tpm_abort_ms > 0.0 && m.tpm_aborted_pages >= m.tpm_aborts,
        "{m:?}"
    );
    assert!(m.shadow_demotion_ms > 0.0, "{m:?}");
    assert!(m.promotions > 0 && m.demotions > 0, "{m:?}");
    check_accounting(&r);
}

#[test]
fn without_the_dirty_check_writes_are_lost() {
    if !tiered_kvm_available() {
        return;
    }
    // Every page of a region that fills most of a small guest is written
    // thousands of times a second, so the random units chaos picks are
    // usually being written while they are copied.
    let mut req = request(
        "memcheck",
        128 << 20,
        2,
        Duration::from_secs(5),
        &["region=48M", "pattern=random", "verify_ms=100"],
    );
    req.tiering.fast = Some(48 << 20);
    req.tiering.policy = Some(PolicyArg::Chaos);
    req.tiering.chaos_rate = Some(50_000.0);
    req.tiering.mechanism = Some(MechanismArg::Tpm);
    req.tiering.skip_dirty_check = true;
    // Lost writes in the guest's own runtime data (its barrier counters)
    // can hang it before memcheck reports; keep chaos on memcheck's pages.
    req.tiering.chaos_heap_only = true;
    let (r, _) = run(&req);
    let lost = r
        .guest_metrics
        .get("mismatched_pages")
        .copied()
        .unwrap_or(0.0);
    assert!(
        lost > 0.0,
        "skipping the dirty check must lose writes: {:?}",
        r.migration
    );
    assert_eq!(r.exit_code, Some(lost as u32));
}

#[test]
fn memcheck_under_stop_and_copy_of_2m_runs_loses_nothing() {
    if !tiered_kvm_available() {
        return;
    }
    let mut until = common::UntilEvents::new(|s: &tiering::mem::MemStats| {
        s.stop_copy >= 8 && s.promotions > 0 && s.demotions > 0
    });
    let (r, console) = run_with(
        &chaos(60, 200.0, MechanismArg::StopCopy, UnitArg::Run2m, false),
        &mut until,
    );
    let m = r.migration.as_ref().unwrap();
    assert!(until.reached, "{m:?}");
    assert_eq!(r.exit_code, Some(0), "{console} {m:?}");
    assert!(m.stop_copy > 0, "{m:?}");
    check_accounting(&r);
}

#[test]
fn memcheck_under_tpm_of_2m_runs_loses_nothing() {
    if !tiered_kvm_available() {
        return;
    }
    let mut until = common::UntilEvents::new(|s: &tiering::mem::MemStats| {
        s.tpm_commits >= 8 && s.promotions > 0 && s.demotions > 0
    });
    let (r, console) = run_with(
        &chaos(60, 200.0, MechanismArg::Tpm, UnitArg::Run2m, false),
        &mut until,
    );
    let m = r.migration.as_ref().unwrap();
    assert!(until.reached, "{m:?}");
    assert_eq!(r.exit_code, Some(0), "{console} {m:?}");
    assert!(m.tpm_commits > 0, "{m:?}");
    check_accounting(&r);
}

/// A live shrink and grow of the fast tier (`--fast-schedule`) under chaos
/// migration: memcheck loses nothing, the report shows each capacity change,
/// and the fast tier's host memory, measured from the kernel per timeline
/// sample, goes down to the shrunk capacity and back up is allowed.
#[test]
fn fast_tier_resize_under_chaos_loses_nothing_and_returns_memory() {
    if !tiered_kvm_available() {
        return;
    }
    for (mech, unit) in [
        (MechanismArg::Tpm, UnitArg::Page4k),
        (MechanismArg::StopCopy, UnitArg::Run2m),
    ] {
        let mut req = chaos(5, 2000.0, mech, unit, false);
        req.tiering.fast_schedule = Some("96M@0s,8M@1s,96M@4s".into());
        let (r, console) = run(&req);
        let m = r.migration.as_ref().unwrap();
        assert_eq!(r.exit_code, Some(0), "{mech:?} {unit:?}: {console} {m:?}");
        assert_eq!(r.guest_metrics.get("mismatched_pages"), Some(&0.0));
        let t = r.tiering.as_ref().unwrap();
        assert_eq!(t.consistency, "ok");
        let resize = t.resize.as_ref().expect("resize report");
        let sizes: Vec<u64> = resize.applied.iter().map(|a| a.2).collect();
        assert_eq!(sizes, vec![24576, 2048, 24576], "{resize:?}");
        // Before the grow (3.5 s to 3.9 s), the shrink has converged: the
        // fast tier holds at most its capacity, and the kernel says its
        // memory went back (at most the 8 MiB capacity plus pages in flight
        // and its small pool cache).
        let shrunk: Vec<_> = r
            .tier_timeline
            .iter()
            .filter(|p| p.t_s > 3.5 && p.t_s < 3.9)
            .collect();
        assert!(!shrunk.is_empty(), "samples while shrunk");
        for p in shrunk {
            let fast = p.tiers[0];
            assert_eq!(fast.capacity_pages, 2048, "{p:?}");
            assert!(fast.pages <= 2048 + 512, "converged to the capacity: {p:?}");
            let res = fast.resident_bytes.expect("measured");
            assert!(
                res <= 24 << 20,
                "fast tier resident {res} bytes while shrunk to 8 MiB: {p:?}"
            );
        }
        let before = r.tier_timeline.iter().find(|p| p.t_s > 0.8 && p.t_s < 1.0);
        if let Some(p) = before {
            assert!(p.tiers[0].resident_bytes.unwrap_or(0) > 32 << 20, "{p:?}");
        }
    }
}

/// Injected system-call failures under chaos migration in a live VM (the
/// test-only fault plans of `tiering::sys::Injector`): the VM carries on,
/// memcheck loses nothing, the bookkeeping ends consistent, and the run ends
/// on time (the whole run is bounded by the common watchdog of `run`).
#[test]
fn injected_failures_in_a_live_vm_lose_nothing() {
    if !tiered_kvm_available() {
        return;
    }
    for (plan, mech, unit) in [
        (
            "move:every=7:errno=EBUSY,dirty-get:every=9",
            MechanismArg::Tpm,
            UnitArg::Page4k,
        ),
        (
            "move:every=5:errno=EAGAIN,discard:every=2",
            MechanismArg::Tpm,
            UnitArg::Run2m,
        ),
        (
            "dirty-clear:every=40,populate:every=4",
            MechanismArg::Tpm,
            UnitArg::Page4k,
        ),
        (
            "move:every=6:errno=EBUSY",
            MechanismArg::StopCopy,
            UnitArg::Page4k,
        ),
    ] {
        let mut req = chaos(
            3,
            if unit == UnitArg::Run2m {
                300.0
            } else {
                20_000.0
            },
            mech,
            unit,
            false,
        );
        req.tiering.test_fault_plans = Some(plan.into());
        let (r, console) = run(&req);
        let t = r.tiering.as_ref().unwrap();
        assert_eq!(r.exit_code, Some(0), "{plan}: {console} {:?}", r.migration);
        assert_eq!(
            r.guest_metrics.get("mismatched_pages"),
            Some(&0.0),
            "{plan}"
        );
        assert_eq!(t.consistency, "ok", "{plan}");
        assert_eq!(
            t.fatal, None,
            "{plan}: transient failures must not stop the VM"
        );
        let m = r.migration.as_ref().unwrap();
        assert!(m.promotions + m.demotions > 0, "{plan}: chaos ran: {m:?}");
    }
}

/// A lost wake-up (the test-only `wake` fault point: the first hint faults'
/// toucher is never woken after its page is mapped back) leaves a vCPU
/// asleep in the kernel. The stall watchdog sees the vCPU blocked past its
/// bound, finds the page from the handler's record of the thread's last
/// fault, wakes it, and the guest runs on: the run ends on time, exit 0,
/// with the stall in its report (resolved). Without the watchdog's wake
/// the vCPU sleeps to the end and the run is forced (checked once by
/// disabling `act_on`).
#[test]
fn a_lost_wake_up_is_found_and_woken_by_the_stall_watchdog() {
    if !tiered_kvm_available() {
        return;
    }
    let mut req = request(
        "zipf",
        256 << 20,
        1,
        Duration::from_secs(5),
        &["rss=96M", "wss=32M"],
    );
    req.tiering.fast = Some(64 << 20);
    req.tiering.policy = Some(PolicyArg::Nomad);
    // The window covers the working set at once, so hint faults come early.
    req.tiering.scan_pages = Some(32768);
    req.tiering.test_fault_plans = Some("wake:every=1:max=1".into());
    let (r, console) = run(&req);
    let l = &r.liveness;
    assert!(
        !l.stalls.is_empty(),
        "the lost wake-up stalls a vCPU: {l:?} {console}"
    );
    assert!(
        l.stalls.iter().all(|s| s.resolved),
        "every stall resolved by the watchdog: {l:?}"
    );
    assert!(
        l.stalls[0]
            .action
            .as_deref()
            .is_some_and(|a| a.contains("woke")),
        "{l:?}"
    );
    assert_eq!(r.exit_code, Some(0), "{:?} {console}", r.stop_reason);
    let last = r.timeline.last().map_or(0, |p| p.ops);
    let at_stall_end = r
        .timeline
        .iter()
        .filter(|p| p.t_s <= l.stalls[0].t_s + l.stalls[0].blocked_s)
        .map(|p| p.ops)
        .max()
        .unwrap_or(0);
    assert!(
        last > at_stall_end,
        "the guest progressed after the stall: {:?}",
        r.timeline
    );
}
