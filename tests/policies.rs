//! Placement policies in live VMs: switching policies mid-run loses nothing,
//! and in a thrashing setup TPP's fault-path promotion stalls the guest more
//! than Nomad's asynchronous transactional migration.

mod common;

use std::time::Duration;

use common::{kvm_available, request, run};
use vmm::config::VmRequest;
use vmm::tiering_config::PolicyArg;

#[test]
fn policy_switch_mid_run_keeps_memcheck_clean() {
    if !kvm_available("policy_switch_mid_run_keeps_memcheck_clean") {
        return;
    }
    let mut r = request(
        "memcheck",
        256 << 20,
        2,
        Duration::from_secs(4),
        &["region=96M", "pattern=hot"],
    );
    r.tiering.fast = Some(48 << 20);
    r.tiering.policy = Some(PolicyArg::Nomad);
    r.tiering.placement = vmm::tiering_config::PlacementArg::SlowFirst;
    // mtm in the middle: its armed probes must be handed back intact.
    r.tiering.policy_schedule = Some("nomad@0s,mtm@1s,tpp@2200ms,memtis@3s".into());
    r.tiering.policy_interval = Some("mtm=300ms".into());
    let (rep, console) = run(&r);
    assert_eq!(rep.exit_code, Some(0), "{console}");
    assert_eq!(rep.guest_metrics.get("mismatched_pages"), Some(&0.0));
    let engine = rep
        .tiering
        .as_ref()
        .and_then(|t| t.engine.as_ref())
        .expect("engine report");
    let names: Vec<&str> = engine.policies.iter().map(|(n, _)| n.name()).collect();
    assert_eq!(
        names,
        ["nomad", "mtm", "tpp", "memtis"],
        "all switches happened"
    );
    assert!(engine.probes_armed > 0, "mtm armed probes: {engine:?}");
    let m = rep.migration.as_ref().unwrap();
    assert!(m.promotions > 0, "policies moved pages: {m:?}");
}

#[test]
fn mtm_promotes_hot_regions_in_a_live_vm() {
    if !kvm_available("mtm_promotes_hot_regions_in_a_live_vm") {
        return;
    }
    let mut r = request(
        "memcheck",
        256 << 20,
        1,
        Duration::from_secs(5),
        &["region=96M", "pattern=hot"],
    );
    r.tiering.fast = Some(48 << 20);
    r.tiering.policy = Some(PolicyArg::Mtm);
    r.tiering.placement = vmm::tiering_config::PlacementArg::SlowFirst;
    r.tiering.policy_interval = Some("mtm=600ms".into());
    let (rep, console) = run(&r);
    assert_eq!(rep.exit_code, Some(0), "{console}");
    assert_eq!(rep.guest_metrics.get("mismatched_pages"), Some(&0.0));
    let t = rep.tiering.as_ref().expect("tiering report");
    let engine = t.engine.as_ref().expect("engine report");
    assert!(engine.probes_armed > 0, "{engine:?}");
    let tracking = rep.tracking.as_ref().expect("tracking report");
    assert!(tracking.hint_faults > 0, "probes saw touches: {tracking:?}");
    let m = rep.migration.as_ref().unwrap();
    assert!(m.promotions > 0, "mtm promoted: {m:?} {engine:?}");
    let human = rep.human();
    assert!(
        human.contains("engine     mtm@0.0s") && human.contains("accessed-bit probes armed"),
        "{human}"
    );
}

fn thrash(policy: PolicyArg) -> VmRequest {
    // Working set (192M) twelve times the fast tier (16M), read-only.
    let mut r = request(
        "zipf",
        512 << 20,
        1,
        Duration::from_secs(6),
        &["rss=192M", "wss=192M", "theta=0.6", "write_ratio=0"],
    );
    r.tiering.fast = Some(16 << 20);
    // Slow-tier headroom, so promoted pages keep their shadows instead of
    // having them reclaimed at once.
    r.tiering.slow = Some(640 << 20);
    // Everything starts slow (the seeds' pre-demoted runs), so promoted
    // pages carry shadows that a later demotion can remap.
    r.tiering.placement = vmm::tiering_config::PlacementArg::SlowFirst;
    r.tiering.policy = Some(policy);
    // A generous sampling budget so the fast tier fills and demotions start
    // within the run.
    r.tiering.tracking = Some(vmm::tiering_config::TrackingArg::HintFaults);
    r.tiering.tracking_budget_pct = Some(25.0);
    r
}

#[test]
fn tpp_stalls_the_guest_more_than_nomad_when_thrashing() {
    if !kvm_available("tpp_stalls_the_guest_more_than_nomad_when_thrashing") {
        return;
    }
    let (tpp, _) = run(&thrash(PolicyArg::Tpp));
    let (nomad, _) = run(&thrash(PolicyArg::Nomad));
    let (t, n) = (tpp.migration.unwrap(), nomad.migration.unwrap());
    assert_eq!(tpp.exit_code, Some(0));
    assert_eq!(nomad.exit_code, Some(0));
    assert!(
        t.promotions > 0 && n.promotions > 0,
        "both promote: tpp {t:?} nomad {n:?}"
    );
    assert!(
        t.stop_copy > 0 && n.tpm_commits > 0,
        "tpp copies exclusively, nomad transactionally"
    );
    assert!(
        t.guest_stall_ms > n.guest_stall_ms,
        "tpp stall {} ms should exceed nomad's {} ms",
        t.guest_stall_ms,
        n.guest_stall_ms
    );
    assert!(
        n.shadow_demotions > 0,
        "nomad demotes clean pages by remapping shadows: {n:?}"
    );
}
