//! `GET /metrics`: Prometheus metrics in the OpenMetrics text format,
//! encoded by `prometheus-client`.
//!
//! Naming: `tiervm_` prefix, units as suffixes (`_bytes`, `_seconds`),
//! `_total` on counters only; VM, tier, node, policy and state are labels.
//! Migration counters are named after the kernel's `/proc/vmstat` ones
//! (`pgpromote_success`, `pgdemote`). The list is in docs/service.md.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::host::{Host, VmState};
use super::types::ApiError;

type Labels = Vec<(String, String)>;
type GaugeF = Gauge<f64, AtomicU64>;
type CounterF = Counter<f64, AtomicU64>;

/// API request counters and latencies (kept across scrapes).
pub struct ApiMetrics {
    requests: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    lock: Mutex<()>,
}

fn latency_histogram() -> Histogram {
    // 100 us .. ~6.5 s.
    Histogram::new(exponential_buckets(1e-4, 2.0, 17))
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            lock: Mutex::new(()),
        }
    }
}

impl ApiMetrics {
    /// Records one request.
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let labels = vec![
            ("method".to_string(), method.to_string()),
            ("route".to_string(), route.to_string()),
            ("code".to_string(), status.to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
        let labels = vec![
            ("method".to_string(), method.to_string()),
            ("route".to_string(), route.to_string()),
        ];
        self.latency.get_or_create(&labels).observe(seconds);
    }
}

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// A gauge family registered under `name`.
fn gauges(r: &mut Registry, name: &str, help: &str) -> Family<Labels, GaugeF> {
    let f = Family::<Labels, GaugeF>::default();
    r.register(name, help, f.clone());
    f
}

/// A counter family registered under `name` (exposed as `name_total`).
fn counters(r: &mut Registry, name: &str, help: &str) -> Family<Labels, CounterF> {
    let f = Family::<Labels, CounterF>::default();
    r.register(name, help, f.clone());
    f
}

fn set(f: &Family<Labels, GaugeF>, labels: &[(&str, &str)], v: f64) {
    f.get_or_create(&l(labels)).set(v);
}

fn add(f: &Family<Labels, CounterF>, labels: &[(&str, &str)], v: f64) {
    f.get_or_create(&l(labels)).inc_by(v.max(0.0));
}

/// The whole exposition, from the service's state now.
pub fn render(host: &Host, api: &ApiMetrics) -> Result<String, ApiError> {
    let _serial = api.lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut r = Registry::default();
    let info = host.host_info();
    // Host.
    let emulated = gauges(
        &mut r,
        "tiervm_host_tiers_emulated",
        "1 when both tiers are one host NUMA node (capacities real, latency differences not)",
    );
    set(&emulated, &[], f64::from(u8::from(info.emulated)));
    let pool_cap = gauges(
        &mut r,
        "tiervm_host_pool_capacity_bytes",
        "Capacity the service may hand out, per tier",
    );
    let pool_res = gauges(
        &mut r,
        "tiervm_host_pool_reserved_bytes",
        "Capacity reserved by admission (fast: VMs' mins; slow: their mem)",
    );
    let pool_com = gauges(
        &mut r,
        "tiervm_host_pool_committed_bytes",
        "Capacity handed out to VMs now",
    );
    let pool_free = gauges(
        &mut r,
        "tiervm_host_pool_free_bytes",
        "Capacity not handed out",
    );
    let pool_rss = gauges(
        &mut r,
        "tiervm_host_pool_resident_bytes",
        "Host memory the VMs' tiers hold, measured by the kernel",
    );
    for p in &info.pools {
        let node = p.node.to_string();
        let lb = [("tier", p.tier.as_str()), ("node", node.as_str())];
        set(&pool_cap, &lb, p.capacity_bytes as f64);
        set(&pool_res, &lb, p.reserved_bytes as f64);
        set(&pool_com, &lb, p.committed_bytes as f64);
        set(&pool_free, &lb, p.free_bytes as f64);
        set(&pool_rss, &lb, p.resident_bytes as f64);
    }
    let vms_by_state = gauges(&mut r, "tiervm_host_vms", "VMs per state");
    for (state, n) in &info.vms {
        set(&vms_by_state, &[("state", state)], *n as f64);
    }
    let rounds = counters(&mut r, "tiervm_rebalance_rounds", "Division rounds run");
    let moves = counters(
        &mut r,
        "tiervm_rebalance_moves",
        "VM fast-capacity changes made by the division",
    );
    let moved = counters(
        &mut r,
        "tiervm_rebalance_moved_bytes",
        "Fast capacity moved between VMs by the division, bytes",
    );
    let crashes = counters(
        &mut r,
        "tiervm_vm_crashes",
        "VM processes that crashed or were killed",
    );
    let created = counters(&mut r, "tiervm_vms_created", "VMs created");
    let uptime = gauges(
        &mut r,
        "tiervm_service_uptime_seconds",
        "Seconds since the service started",
    );
    set(&uptime, &[], host.uptime_s());
    // Per VM.
    let state = gauges(&mut r, "tiervm_vm_state", "1 for the VM's current state");
    let vm_info = gauges(
        &mut r,
        "tiervm_vm_info",
        "1 per VM, with its image and policy",
    );
    let cap = gauges(
        &mut r,
        "tiervm_vm_tier_capacity_bytes",
        "Tier capacity of a VM (its limit)",
    );
    let used = gauges(
        &mut r,
        "tiervm_vm_tier_used_bytes",
        "Guest pages and shadows on a tier of a VM",
    );
    let rss = gauges(
        &mut r,
        "tiervm_vm_tier_resident_bytes",
        "Kernel-measured host memory of a tier of a VM",
    );
    let target = gauges(
        &mut r,
        "tiervm_vm_fast_target_bytes",
        "Fast capacity the service decided for a VM",
    );
    let fmin = gauges(
        &mut r,
        "tiervm_vm_fast_min_bytes",
        "Guaranteed fast bytes of a VM",
    );
    let fmax = gauges(
        &mut r,
        "tiervm_vm_fast_max_bytes",
        "Most fast bytes of a VM",
    );
    let weight = gauges(
        &mut r,
        "tiervm_vm_fast_weight",
        "Weight of a VM in the division",
    );
    let ops_rate = gauges(
        &mut r,
        "tiervm_vm_operations_per_second",
        "Guest operations per second (throughput)",
    );
    let ops = counters(&mut r, "tiervm_vm_operations", "Guest operations");
    let promote = counters(
        &mut r,
        "tiervm_vm_pgpromote_success",
        "Pages promoted to the fast tier (kernel: pgpromote_success)",
    );
    let demote = counters(
        &mut r,
        "tiervm_vm_pgdemote",
        "Pages demoted from the fast tier (kernel: pgdemote_*)",
    );
    let tpm_commit = counters(
        &mut r,
        "tiervm_vm_tpm_commits",
        "Committed transactional page migrations",
    );
    let tpm_abort = counters(
        &mut r,
        "tiervm_vm_tpm_aborts",
        "Aborted transactional page migrations (page written during the copy)",
    );
    let shadow_demote = counters(
        &mut r,
        "tiervm_vm_pgdemote_shadow",
        "Demotions that remapped a kept slow-tier shadow (no copy)",
    );
    let shadow_reclaim = counters(
        &mut r,
        "tiervm_vm_shadow_reclaims",
        "Shadow pages reclaimed",
    );
    let stall = counters(
        &mut r,
        "tiervm_vm_guest_stall_seconds",
        "vCPU time blocked in migration faults",
    );
    let hint = counters(
        &mut r,
        "tiervm_vm_hint_faults",
        "Hint faults (sampled guest accesses)",
    );
    let switches = counters(
        &mut r,
        "tiervm_vm_policy_switches",
        "Policy switches made through the API",
    );
    {
        let s = host.state();
        add(&rounds, &[], s.counters.rounds as f64);
        add(&moves, &[], s.counters.moves as f64);
        add(&moved, &[], s.counters.moved_bytes as f64);
        add(&crashes, &[], s.counters.crashes as f64);
        add(&created, &[], s.counters.created as f64);
        for v in s.vms.values() {
            let vm = v.id.as_str();
            for st in VmState::ALL {
                set(
                    &state,
                    &[("vm", vm), ("state", st.name())],
                    f64::from(u8::from(st == v.state)),
                );
            }
            set(
                &vm_info,
                &[("vm", vm), ("image", &v.spec.image), ("policy", &v.policy)],
                1.0,
            );
            set(&fmin, &[("vm", vm)], v.min as f64);
            set(&fmax, &[("vm", vm)], v.max as f64);
            set(&weight, &[("vm", vm)], v.weight);
            set(&target, &[("vm", vm)], v.target as f64);
            add(&switches, &[("vm", vm)], v.policy_switches as f64);
            let Some(st) = &v.stats else { continue };
            if v.state.active() {
                for t in &st.tiers {
                    let node = t.node.to_string();
                    let lb = [
                        ("vm", vm),
                        ("tier", t.name.as_str()),
                        ("node", node.as_str()),
                    ];
                    set(&cap, &lb, t.capacity_bytes as f64);
                    set(&used, &lb, t.used_bytes as f64);
                    if let Some(b) = t.resident_bytes {
                        set(&rss, &lb, b as f64);
                    }
                }
                set(&ops_rate, &[("vm", vm)], st.ops_per_sec);
            }
            let m = &st.mem;
            add(&ops, &[("vm", vm)], st.ops as f64);
            add(&promote, &[("vm", vm)], m.promotions as f64);
            add(&demote, &[("vm", vm)], m.demotions as f64);
            add(&tpm_commit, &[("vm", vm)], m.tpm_commits as f64);
            add(&tpm_abort, &[("vm", vm)], m.tpm_aborts as f64);
            add(&shadow_demote, &[("vm", vm)], m.shadow_demotions as f64);
            add(&shadow_reclaim, &[("vm", vm)], m.shadow_reclaims as f64);
            add(&stall, &[("vm", vm)], m.guest_stall_ms / 1e3);
            add(&hint, &[("vm", vm)], m.hint_faults as f64);
        }
    }
    r.register(
        "tiervm_api_requests",
        "API requests by method, route and status code",
        api.requests.clone(),
    );
    r.register(
        "tiervm_api_request_duration_seconds",
        "API request latency",
        api.latency.clone(),
    );
    let mut out = String::new();
    encode(&mut out, &r).map_err(|e| ApiError::internal(format!("encoding the metrics: {e}")))?;
    Ok(out)
}
