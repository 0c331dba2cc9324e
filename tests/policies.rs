//! Placement policies in live VMs: switching policies mid-run loses nothing,
//! and in a thrashing setup TPP's fault-path promotion stalls the guest more
//! than Nomad's asynchronous transactional migration.

mod common;

use std::time::Duration;

use common::{request, run, run_with, tiered_kvm_available};
use vmm_core::config::VmRequest;
use vmm_core::tiering_config::PolicyArg;

#[test]
fn policy_switch_mid_run_keeps_memcheck_clean() {
    if !tiered_kvm_available() {
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
    r.tiering.placement = vmm_core::tiering_config::PlacementArg::SlowFirst;
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
    if !tiered_kvm_available() {
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
    r.tiering.placement = vmm_core::tiering_config::PlacementArg::SlowFirst;
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
        Duration::from_secs(120),
        &["rss=192M", "wss=192M", "theta=0.6", "write_ratio=0"],
    );
    r.tiering.fast = Some(16 << 20);
    // Slow-tier headroom, so promoted pages keep their shadows instead of
    // having them reclaimed at once.
    r.tiering.slow = Some(640 << 20);
    // Everything starts slow (the seeds' pre-demoted runs), so promoted
    // pages carry shadows that a later demotion can remap.
    r.tiering.placement = vmm_core::tiering_config::PlacementArg::SlowFirst;
    r.tiering.policy = Some(policy);
    // A generous sampling budget so the fast tier fills and demotions start
    // within the run.
    r.tiering.tracking = Some(vmm_core::tiering_config::TrackingArg::HintFaults);
    r.tiering.tracking_budget_pct = Some(25.0);
    r
}

/// TPP promotes in the fault path by stop-and-copy; Nomad promotes
/// asynchronously by TPM and demotes clean pages by remapping shadows. Each
/// run lasts until its policy did so (event-based; the guest stall of one
/// against the other is a measurement: benches/scripts/tpp_vs_nomad_stall.sh).
#[test]
fn tpp_promotes_in_the_fault_path_and_nomad_transactionally() {
    if !tiered_kvm_available() {
        return;
    }
    let mut tpp_done = common::UntilEvents::new(|s: &tiering::mem::MemStats| {
        s.migration.promotions > 0 && s.migration.stop_copy > 0
    });
    let (tpp, _) = run_with(&thrash(PolicyArg::Tpp), &mut tpp_done);
    let mut nomad_done = common::UntilEvents::new(|s: &tiering::mem::MemStats| {
        s.migration.promotions > 0
            && s.migration.tpm_commits > 0
            && s.migration.shadow_demotions > 0
    });
    let (nomad, _) = run_with(&thrash(PolicyArg::Nomad), &mut nomad_done);
    let (t, n) = (
        tpp.migration.clone().unwrap(),
        nomad.migration.clone().unwrap(),
    );
    assert!(tpp_done.reached, "tpp: {t:?}");
    assert!(nomad_done.reached, "nomad: {n:?}");
    assert_eq!(tpp.exit_code, Some(0));
    assert_eq!(nomad.exit_code, Some(0));
    let fault_path = |r: &vmm_core::report::RunReport| {
        r.tiering
            .as_ref()
            .and_then(|t| t.engine.as_ref())
            .map(|e| e.fault_path_migrations)
    };
    assert!(
        fault_path(&tpp).is_some_and(|n| n > 0),
        "tpp promotes in the fault path"
    );
    assert_eq!(
        fault_path(&nomad),
        Some(0),
        "nomad never migrates in the fault path"
    );
    assert_eq!(t.tpm_commits, 0, "tpp copies exclusively: {t:?}");
    assert!(
        n.shadow_demotions > 0,
        "nomad demotes clean pages by remapping shadows: {n:?}"
    );
}
