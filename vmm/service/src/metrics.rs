//! `GET /metrics`: Prometheus metrics in the text exposition format
//! (version 0.0.4), encoded by the `prometheus` crate.
//!
//! Naming: `tiervm_` prefix, units as suffixes (`_bytes`, `_seconds`),
//! `_total` on counters only; VM, tier, node, policy and state are labels.
//! Migration counters are named after the kernel's `/proc/vmstat` ones
//! (`pgpromote_success`, `pgdemote`). The list is in docs/service.md.

use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry, TextEncoder,
};

use super::host::{Host, VmState};
use super::types::ApiError;

/// API request counters and latencies (kept across scrapes).
pub struct ApiMetrics {
    requests: CounterVec,
    latency: HistogramVec,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        let requests = CounterVec::new(
            Opts::new(
                "tiervm_api_requests_total",
                "API requests by method, route and status code",
            ),
            &["method", "route", "code"],
        );
        let latency = HistogramVec::new(
            HistogramOpts::new("tiervm_api_request_duration_seconds", "API request latency")
                // 100 us .. ~6.5 s.
                .buckets(prometheus::exponential_buckets(1e-4, 2.0, 17).unwrap_or_default()),
            &["method", "route"],
        );
        // The names and labels above are constant and valid: these
        // cannot fail (the metrics test encodes them).
        #[allow(clippy::expect_used)]
        Self {
            requests: requests.expect("a valid constant metric"),
            latency: latency.expect("a valid constant metric"),
        }
    }
}

impl ApiMetrics {
    /// Records one request.
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        // A client may send any method name: only the standard ones get a
        // label of their own, so clients cannot grow the series without end.
        let method = match method {
            "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" => method,
            _ => "other",
        };
        let code = status.to_string();
        self.requests
            .with_label_values(&[method, route, code.as_str()])
            .inc();
        self.latency
            .with_label_values(&[method, route])
            .observe(seconds);
    }
}

/// The registry of one scrape.
struct Families {
    r: Registry,
}

fn metric_error(e: prometheus::Error) -> ApiError {
    ApiError::internal(format!("building the metrics: {e}"))
}

impl Families {
    fn gauges(&mut self, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
        let g = GaugeVec::new(Opts::new(name, help), labels)?;
        self.r.register(Box::new(g.clone()))?;
        Ok(g)
    }

    fn counters(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<CounterVec> {
        let c = CounterVec::new(Opts::new(name, help), labels)?;
        self.r.register(Box::new(c.clone()))?;
        Ok(c)
    }
}

fn set(f: &GaugeVec, labels: &[&str], v: f64) {
    f.with_label_values(labels).set(v);
}

fn add(f: &CounterVec, labels: &[&str], v: f64) {
    f.with_label_values(labels).inc_by(v.max(0.0));
}

/// `process_*`: the service process's CPU, memory, descriptors, threads
/// and start time (the Prometheus client conventions), from `/proc/self`.
fn process_metrics(f: &mut Families) -> prometheus::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces), from field 3.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let cpu = f.counters(
        "process_cpu_seconds_total",
        "User and system CPU time of the service process",
        &[],
    )?;
    add(
        &cpu,
        &[],
        (field(14).unwrap_or(0.0) + field(15).unwrap_or(0.0)) / ticks,
    );
    let g = |f: &mut Families, name: &str, help: &str, v: f64| -> prometheus::Result<()> {
        let x = f.gauges(name, help, &[])?;
        set(&x, &[], v);
        Ok(())
    };
    g(
        f,
        "process_resident_memory_bytes",
        "Resident memory of the service process",
        field(24).unwrap_or(0.0) * page,
    )?;
    g(
        f,
        "process_virtual_memory_bytes",
        "Virtual memory of the service process",
        field(23).unwrap_or(0.0),
    )?;
    g(
        f,
        "process_threads",
        "Threads of the service process",
        field(20).unwrap_or(0.0),
    )?;
    g(
        f,
        "process_start_time_seconds",
        "Start of the service process, Unix seconds",
        boot + field(22).unwrap_or(0.0) / ticks,
    )?;
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    g(
        f,
        "process_open_fds",
        "Open descriptors of the service process",
        fds as f64,
    )?;
    // SAFETY: an all-zero rlimit is valid; getrlimit writes it.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes into `rl`, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        g(
            f,
            "process_max_fds",
            "Most descriptors the service process may open",
            rl.rlim_cur as f64,
        )?;
    }
    Ok(())
}

/// The whole exposition, from the service's state now.
pub fn render(host: &Host, api: &ApiMetrics) -> Result<String, ApiError> {
    let mut f = Families { r: Registry::new() };
    let info = host.host_info();
    // Host.
    let emulated = f
        .gauges(
            "tiervm_host_tiers_emulated",
            "1 when both tiers are one host NUMA node (capacities real, latency differences not)",
            &[],
        )
        .map_err(metric_error)?;
    set(&emulated, &[], f64::from(u8::from(info.emulated)));
    let tn = &["tier", "node"];
    let pool_cap = f
        .gauges(
            "tiervm_host_pool_capacity_bytes",
            "Capacity the service may hand out, per tier",
            tn,
        )
        .map_err(metric_error)?;
    let pool_res = f
        .gauges(
            "tiervm_host_pool_reserved_bytes",
            "Capacity reserved by admission (fast: VMs' mins; slow: their mem)",
            tn,
        )
        .map_err(metric_error)?;
    let pool_com = f
        .gauges(
            "tiervm_host_pool_committed_bytes",
            "Capacity handed out to VMs now",
            tn,
        )
        .map_err(metric_error)?;
    let pool_free = f
        .gauges("tiervm_host_pool_free_bytes", "Capacity not handed out", tn)
        .map_err(metric_error)?;
    let pool_rss = f
        .gauges(
            "tiervm_host_pool_resident_bytes",
            "Host memory the VMs' tiers hold, measured by the kernel",
            tn,
        )
        .map_err(metric_error)?;
    for p in &info.pools {
        let node = p.node.to_string();
        let lb = [p.tier.as_str(), node.as_str()];
        set(&pool_cap, &lb, p.capacity_bytes as f64);
        set(&pool_res, &lb, p.reserved_bytes as f64);
        set(&pool_com, &lb, p.committed_bytes as f64);
        set(&pool_free, &lb, p.free_bytes as f64);
        set(&pool_rss, &lb, p.resident_bytes as f64);
    }
    let vms_by_state = f
        .gauges("tiervm_host_vms", "VMs per state", &["state"])
        .map_err(metric_error)?;
    for (state, n) in &info.vms {
        set(&vms_by_state, &[state], *n as f64);
    }
    let rounds = f
        .counters("tiervm_rebalance_rounds_total", "Division rounds run", &[])
        .map_err(metric_error)?;
    let moves = f
        .counters(
            "tiervm_rebalance_moves_total",
            "VM fast-capacity changes made by the division",
            &[],
        )
        .map_err(metric_error)?;
    let moved = f
        .counters(
            "tiervm_rebalance_moved_bytes_total",
            "Fast capacity moved between VMs by the division, bytes",
            &[],
        )
        .map_err(metric_error)?;
    let optional = f
        .counters(
            "tiervm_rebalance_optional_moved_bytes_total",
            "Fast capacity moved by optional moves (spare grants, exchanges), bytes",
            &[],
        )
        .map_err(metric_error)?;
    let crashes = f
        .counters(
            "tiervm_vm_crashes_total",
            "VM processes that crashed or were killed",
            &[],
        )
        .map_err(metric_error)?;
    let created = f
        .counters("tiervm_vms_created_total", "VMs created", &[])
        .map_err(metric_error)?;
    let uptime = f
        .gauges(
            "tiervm_service_uptime_seconds",
            "Seconds since the service started",
            &[],
        )
        .map_err(metric_error)?;
    set(&uptime, &[], host.uptime_s());
    process_metrics(&mut f).map_err(metric_error)?;
    let build = f
        .gauges(
            "tiervm_build_info",
            "1, labelled with the version of tiervm",
            &["version"],
        )
        .map_err(metric_error)?;
    set(&build, &[env!("CARGO_PKG_VERSION")], 1.0);
    // Per VM: `vm` and `uuid` (ids are never reused on a state directory,
    // UUIDs never at all: two VMs never share a series).
    let vm_l = &["vm", "uuid"];
    let vtn = &["vm", "uuid", "tier", "node"];
    let state = f
        .gauges(
            "tiervm_vm_state",
            "1 for the VM's current state",
            &["vm", "uuid", "state"],
        )
        .map_err(metric_error)?;
    let vm_info = f
        .gauges(
            "tiervm_vm_info",
            "1 per VM, with its image and policy",
            &["vm", "uuid", "image", "policy"],
        )
        .map_err(metric_error)?;
    let cap = f
        .gauges(
            "tiervm_vm_tier_capacity_bytes",
            "Tier capacity of a VM (its limit)",
            vtn,
        )
        .map_err(metric_error)?;
    let used = f
        .gauges(
            "tiervm_vm_tier_used_bytes",
            "Guest pages and shadows on a tier of a VM",
            vtn,
        )
        .map_err(metric_error)?;
    let rss = f
        .gauges(
            "tiervm_vm_tier_resident_bytes",
            "Kernel-measured host memory of a tier of a VM",
            vtn,
        )
        .map_err(metric_error)?;
    let target = f
        .gauges(
            "tiervm_vm_fast_target_bytes",
            "Fast capacity the service decided for a VM",
            vm_l,
        )
        .map_err(metric_error)?;
    let fmin = f
        .gauges(
            "tiervm_vm_fast_min_bytes",
            "Guaranteed fast bytes of a VM",
            vm_l,
        )
        .map_err(metric_error)?;
    let fmax = f
        .gauges("tiervm_vm_fast_max_bytes", "Most fast bytes of a VM", vm_l)
        .map_err(metric_error)?;
    let weight = f
        .gauges(
            "tiervm_vm_fast_weight",
            "Weight of a VM in the division",
            vm_l,
        )
        .map_err(metric_error)?;
    let accesses = f
        .counters(
            "tiervm_vm_sampled_accesses_total",
            "Sampled accesses of a VM as the host measures them (hint faults; rate() of it is the access rate the fast-tier division values capacity by)",
            vm_l,
        )
        .map_err(metric_error)?;
    let ops = f
        .counters("tiervm_vm_operations_total", "Guest operations", vm_l)
        .map_err(metric_error)?;
    let promote = f
        .counters(
            "tiervm_vm_pgpromote_success_total",
            "Pages promoted to the fast tier (kernel: pgpromote_success)",
            vm_l,
        )
        .map_err(metric_error)?;
    let demote = f
        .counters(
            "tiervm_vm_pgdemote_total",
            "Pages demoted from the fast tier (kernel: pgdemote_*)",
            vm_l,
        )
        .map_err(metric_error)?;
    let tpm_commit = f
        .counters(
            "tiervm_vm_tpm_commits_total",
            "Committed transactional page migrations",
            vm_l,
        )
        .map_err(metric_error)?;
    let tpm_abort = f
        .counters(
            "tiervm_vm_tpm_aborts_total",
            "Aborted transactional page migrations (page written during the copy)",
            vm_l,
        )
        .map_err(metric_error)?;
    let shadow_demote = f
        .counters(
            "tiervm_vm_pgdemote_shadow_total",
            "Demotions that remapped a kept slow-tier shadow (no copy)",
            vm_l,
        )
        .map_err(metric_error)?;
    let shadow_reclaim = f
        .counters(
            "tiervm_vm_shadow_reclaims_total",
            "Shadow pages reclaimed",
            vm_l,
        )
        .map_err(metric_error)?;
    let stall = f
        .counters(
            "tiervm_vm_guest_stall_seconds_total",
            "vCPU time blocked in migration faults",
            vm_l,
        )
        .map_err(metric_error)?;
    let hint = f
        .counters(
            "tiervm_vm_hint_faults_total",
            "Hint faults (sampled guest accesses)",
            vm_l,
        )
        .map_err(metric_error)?;
    let switches = f
        .counters(
            "tiervm_vm_policy_switches_total",
            "Policy switches made through the API",
            vm_l,
        )
        .map_err(metric_error)?;
    {
        let s = host.state();
        add(&rounds, &[], s.counters.rounds as f64);
        add(&moves, &[], s.counters.moves as f64);
        add(&moved, &[], s.counters.moved_bytes as f64);
        add(&optional, &[], s.counters.optional_bytes as f64);
        add(&crashes, &[], s.counters.crashes as f64);
        add(&created, &[], s.counters.created as f64);
        for v in s.vms.values() {
            let (vm, uuid) = (v.id.as_str(), v.uuid.as_str());
            let ids = [vm, uuid];
            let vm = &ids[..];
            for st in VmState::ALL {
                set(
                    &state,
                    &[ids[0], ids[1], st.name()],
                    f64::from(u8::from(st == v.state)),
                );
            }
            set(
                &vm_info,
                &[ids[0], ids[1], &v.spec.image, v.active_policy()],
                1.0,
            );
            set(&fmin, vm, v.min as f64);
            set(&fmax, vm, v.max as f64);
            set(&weight, vm, v.weight);
            set(&target, vm, v.target as f64);
            add(&switches, vm, v.policy_switches as f64);
            add(&accesses, vm, v.sampled_accesses);
            let Some(st) = &v.stats else { continue };
            if v.state.active() {
                for t in &st.tiers {
                    let node = t.node.to_string();
                    let lb = [ids[0], ids[1], t.name.as_str(), node.as_str()];
                    set(&cap, &lb, t.capacity_bytes as f64);
                    set(&used, &lb, t.used_bytes as f64);
                    if let Some(b) = t.resident_bytes {
                        set(&rss, &lb, b as f64);
                    }
                }
            }
            let m = &st.mem;
            add(&ops, vm, st.ops as f64);
            add(&promote, vm, m.promotions as f64);
            add(&demote, vm, m.demotions as f64);
            add(&tpm_commit, vm, m.tpm_commits as f64);
            add(&tpm_abort, vm, m.tpm_aborts as f64);
            add(&shadow_demote, vm, m.shadow_demotions as f64);
            add(&shadow_reclaim, vm, m.shadow_reclaims as f64);
            add(&stall, vm, m.guest_stall_ms / 1e3);
            add(&hint, vm, m.hint_faults as f64);
        }
    }
    for c in [
        Box::new(api.requests.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(api.latency.clone()),
    ] {
        f.r.register(c).map_err(metric_error)?;
    }
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&f.r.gather(), &mut out)
        .map_err(|e| ApiError::internal(format!("encoding the metrics: {e}")))?;
    String::from_utf8(out).map_err(|e| ApiError::internal(format!("encoding the metrics: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    #[test]
    fn unknown_methods_share_one_label() {
        let m = ApiMetrics::default();
        for i in 0..100 {
            m.observe(&format!("XXX{i}"), "/v1/host", 405, 0.001);
        }
        m.observe("GET", "/v1/host", 200, 0.001);
        let series = m.requests.collect()[0].get_metric().len();
        assert_eq!(series, 2, "one series for GET, one for every other method");
        assert_eq!(
            m.requests
                .with_label_values(&["other", "/v1/host", "405"])
                .get(),
            100.0
        );
    }
}
