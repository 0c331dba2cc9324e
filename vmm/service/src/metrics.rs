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

use super::host::{Host, ServiceCounters, VmEntry, VmState};
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
    fn gauges(&mut self, name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, ApiError> {
        let g = GaugeVec::new(Opts::new(name, help), labels).map_err(metric_error)?;
        self.r.register(Box::new(g.clone())).map_err(metric_error)?;
        Ok(g)
    }

    fn counters(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<CounterVec, ApiError> {
        let c = CounterVec::new(Opts::new(name, help), labels).map_err(metric_error)?;
        self.r.register(Box::new(c.clone())).map_err(metric_error)?;
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
fn process_metrics(f: &mut Families) -> Result<(), ApiError> {
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
    let g = |f: &mut Families, name: &str, help: &str, v: f64| -> Result<(), ApiError> {
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

/// The connections of the API socket and the metrics listener
/// (`conn.rs`): open, accepted, idle ones closed to make room, refused.
fn connection_metrics(f: &mut Families) -> Result<(), ApiError> {
    use std::sync::atomic::Ordering::Relaxed;
    let open = f.gauges(
        "tiervm_api_connections",
        "Connections open now, per listener",
        &["listener"],
    )?;
    let accepted = f.counters(
        "tiervm_api_connections_accepted_total",
        "Connections accepted and served, per listener",
        &["listener"],
    )?;
    let evicted = f.counters(
        "tiervm_api_connections_evicted_total",
        "Idle connections closed to make room for a new one (a client over its bound, or a full listener)",
        &["listener"],
    )?;
    let refused = f.counters(
        "tiervm_api_connections_refused_total",
        "Connections refused: the client's connections (reason client) or all (full) were in requests",
        &["listener", "reason"],
    )?;
    for (l, s) in [
        ("api", &super::conn::API_CONNS),
        ("metrics", &super::conn::METRICS_CONNS),
    ] {
        set(&open, &[l], s.open.load(Relaxed) as f64);
        add(&accepted, &[l], s.accepted.load(Relaxed) as f64);
        add(&evicted, &[l], s.evicted.load(Relaxed) as f64);
        add(
            &refused,
            &[l, "client"],
            s.refused_client.load(Relaxed) as f64,
        );
        add(&refused, &[l, "full"], s.refused_full.load(Relaxed) as f64);
    }
    Ok(())
}

/// The whole exposition, from the service's state now. (The registry sorts
/// the families by name, so the order they are made in does not show.)
pub fn render(host: &Host, api: &ApiMetrics) -> Result<String, ApiError> {
    let mut f = Families { r: Registry::new() };
    host_gauges(&mut f, host)?;
    process_metrics(&mut f)?;
    connection_metrics(&mut f)?;
    let build = f.gauges(
        "tiervm_build_info",
        "1, labelled with the version of tiervm",
        &["version"],
    )?;
    set(&build, &[env!("CARGO_PKG_VERSION")], 1.0);
    let service = Service::new(&mut f)?;
    let vm_gauges = VmGauges::new(&mut f)?;
    let vm_counters = VmCounters::new(&mut f)?;
    {
        let s = host.fresh_state();
        service.record(&s.counters);
        for v in s.vms.values() {
            vm_gauges.record(v);
            vm_counters.record(v);
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

/// The host's gauges: emulation, the pools per tier, VMs per state, uptime.
fn host_gauges(f: &mut Families, host: &Host) -> Result<(), ApiError> {
    let info = host.host_info();
    let emulated = f.gauges(
        "tiervm_host_tiers_emulated",
        "1 when both tiers are one host NUMA node (capacities real, latency differences not)",
        &[],
    )?;
    set(&emulated, &[], f64::from(u8::from(info.emulated)));
    let tn = &["tier", "node"];
    let pool_cap = f.gauges(
        "tiervm_host_pool_capacity_bytes",
        "Capacity the service may hand out, per tier",
        tn,
    )?;
    let pool_res = f.gauges(
        "tiervm_host_pool_reserved_bytes",
        "Capacity reserved by admission (fast: VMs' mins; slow: their mem)",
        tn,
    )?;
    let pool_com = f.gauges(
        "tiervm_host_pool_committed_bytes",
        "Capacity handed out to VMs now",
        tn,
    )?;
    let pool_free = f.gauges("tiervm_host_pool_free_bytes", "Capacity not handed out", tn)?;
    let pool_rss = f.gauges(
        "tiervm_host_pool_resident_bytes",
        "Host memory the VMs' tiers hold, measured by the kernel",
        tn,
    )?;
    for p in &info.pools {
        let node = p.node.to_string();
        let lb = [p.tier.as_str(), node.as_str()];
        set(&pool_cap, &lb, p.capacity_bytes as f64);
        set(&pool_res, &lb, p.reserved_bytes as f64);
        set(&pool_com, &lb, p.committed_bytes as f64);
        set(&pool_free, &lb, p.free_bytes as f64);
        set(&pool_rss, &lb, p.resident_bytes as f64);
    }
    let vms_by_state = f.gauges("tiervm_host_vms", "VMs per state", &["state"])?;
    for (state, n) in &info.vms {
        set(&vms_by_state, &[state], *n as f64);
    }
    let uptime = f.gauges(
        "tiervm_service_uptime_seconds",
        "Seconds since the service started",
        &[],
    )?;
    set(&uptime, &[], host.uptime_s());
    Ok(())
}

/// The service's own counters: division rounds and moves, crashes, VMs made.
struct Service {
    rounds: CounterVec,
    moves: CounterVec,
    moved: CounterVec,
    optional: CounterVec,
    crashes: CounterVec,
    created: CounterVec,
}

impl Service {
    fn new(f: &mut Families) -> Result<Self, ApiError> {
        Ok(Self {
            rounds: f.counters("tiervm_rebalance_rounds_total", "Division rounds run", &[])?,
            moves: f.counters(
                "tiervm_rebalance_moves_total",
                "VM fast-capacity changes made by the division",
                &[],
            )?,
            moved: f.counters(
                "tiervm_rebalance_moved_bytes_total",
                "Fast capacity moved between VMs by the division, bytes",
                &[],
            )?,
            optional: f.counters(
                "tiervm_rebalance_optional_moved_bytes_total",
                "Fast capacity moved by optional moves (spare grants, exchanges), bytes",
                &[],
            )?,
            crashes: f.counters(
                "tiervm_vm_crashes_total",
                "VM processes that crashed or were killed",
                &[],
            )?,
            created: f.counters("tiervm_vms_created_total", "VMs created", &[])?,
        })
    }

    fn record(&self, c: &ServiceCounters) {
        add(&self.rounds, &[], c.rounds as f64);
        add(&self.moves, &[], c.moves as f64);
        add(&self.moved, &[], c.moved_bytes as f64);
        add(&self.optional, &[], c.optional_bytes as f64);
        add(&self.crashes, &[], c.crashes as f64);
        add(&self.created, &[], c.created as f64);
    }
}

/// Each VM's gauges: state, image and policy, tiers, its share of the
/// fast tier. Every per-VM series has `vm` and `uuid` (ids are never
/// reused on a state directory, UUIDs never at all: two VMs never share a
/// series).
struct VmGauges {
    state: GaugeVec,
    info: GaugeVec,
    cap: GaugeVec,
    used: GaugeVec,
    rss: GaugeVec,
    target: GaugeVec,
    fmin: GaugeVec,
    fmax: GaugeVec,
    weight: GaugeVec,
}

impl VmGauges {
    fn new(f: &mut Families) -> Result<Self, ApiError> {
        let vm = &["vm", "uuid"];
        let vtn = &["vm", "uuid", "tier", "node"];
        Ok(Self {
            state: f.gauges(
                "tiervm_vm_state",
                "1 for the VM's current state",
                &["vm", "uuid", "state"],
            )?,
            info: f.gauges(
                "tiervm_vm_info",
                "1 per VM, with its image, policy and the tier latency emulated in its guest (latency_emulation: off, or the create's emulate_latency)",
                &["vm", "uuid", "image", "policy", "latency_emulation"],
            )?,
            cap: f.gauges(
                "tiervm_vm_tier_capacity_bytes",
                "Tier capacity of a VM (its limit)",
                vtn,
            )?,
            used: f.gauges(
                "tiervm_vm_tier_used_bytes",
                "Guest pages and shadows on a tier of a VM",
                vtn,
            )?,
            rss: f.gauges(
                "tiervm_vm_tier_resident_bytes",
                "Kernel-measured host memory of a tier of a VM",
                vtn,
            )?,
            target: f.gauges(
                "tiervm_vm_fast_target_bytes",
                "Fast capacity the service decided for a VM",
                vm,
            )?,
            fmin: f.gauges(
                "tiervm_vm_fast_min_bytes",
                "Guaranteed fast bytes of a VM",
                vm,
            )?,
            fmax: f.gauges("tiervm_vm_fast_max_bytes", "Most fast bytes of a VM", vm)?,
            weight: f.gauges(
                "tiervm_vm_fast_weight",
                "Weight of a VM in the division",
                vm,
            )?,
        })
    }

    fn record(&self, v: &VmEntry) {
        let (id, uuid) = (v.id.as_str(), v.uuid.as_str());
        let vm = &[id, uuid][..];
        for st in VmState::ALL {
            set(
                &self.state,
                &[id, uuid, st.name()],
                f64::from(u8::from(st == v.state)),
            );
        }
        set(
            &self.info,
            &[
                id,
                uuid,
                &v.spec.vm.image,
                v.active_policy(),
                v.spec.vm.emulate_latency.as_deref().unwrap_or("off"),
            ],
            1.0,
        );
        set(&self.fmin, vm, v.min as f64);
        set(&self.fmax, vm, v.max as f64);
        set(&self.weight, vm, v.weight);
        set(&self.target, vm, v.target as f64);
        let Some(st) = &v.stats else { return };
        if !v.state.active() {
            return;
        }
        for t in &st.tiers {
            let node = t.node.to_string();
            let lb = [id, uuid, t.name.as_str(), node.as_str()];
            set(&self.cap, &lb, t.capacity_bytes as f64);
            set(&self.used, &lb, t.used_bytes as f64);
            if let Some(b) = t.resident_bytes {
                set(&self.rss, &lb, b as f64);
            }
        }
    }
}

/// Each VM's counters: operations, migrations, stalls, hint faults, policy
/// switches.
struct VmCounters {
    ops: CounterVec,
    promote: CounterVec,
    demote: CounterVec,
    tpm_commit: CounterVec,
    tpm_abort: CounterVec,
    shadow_demote: CounterVec,
    shadow_reclaim: CounterVec,
    stall: CounterVec,
    hint: CounterVec,
    switches: CounterVec,
    accesses: CounterVec,
}

impl VmCounters {
    fn new(f: &mut Families) -> Result<Self, ApiError> {
        let vm = &["vm", "uuid"];
        Ok(Self {
            ops: f.counters(
                "tiervm_vm_operations_total",
                "Guest operations, as the guest reports them (latency_emulation: the tier latency emulated in the guest, off or its spec)",
                &["vm", "uuid", "latency_emulation"],
            )?,
            promote: f.counters(
                "tiervm_vm_pgpromote_success_total",
                "Pages promoted to the fast tier (kernel: pgpromote_success)",
                vm,
            )?,
            demote: f.counters(
                "tiervm_vm_pgdemote_total",
                "Pages demoted from the fast tier (kernel: pgdemote_*)",
                vm,
            )?,
            tpm_commit: f.counters(
                "tiervm_vm_tpm_commits_total",
                "Committed transactional page migrations",
                vm,
            )?,
            tpm_abort: f.counters(
                "tiervm_vm_tpm_aborts_total",
                "Aborted transactional page migrations (page written during the copy)",
                vm,
            )?,
            shadow_demote: f.counters(
                "tiervm_vm_pgdemote_shadow_total",
                "Demotions that remapped a kept slow-tier shadow (no copy)",
                vm,
            )?,
            shadow_reclaim: f.counters(
                "tiervm_vm_shadow_reclaims_total",
                "Shadow pages reclaimed",
                vm,
            )?,
            stall: f.counters(
                "tiervm_vm_guest_stall_seconds_total",
                "vCPU time blocked in migration faults",
                vm,
            )?,
            hint: f.counters(
                "tiervm_vm_hint_faults_total",
                "Hint faults (sampled guest accesses)",
                vm,
            )?,
            switches: f.counters(
                "tiervm_vm_policy_switches_total",
                "Policy switches made through the API",
                vm,
            )?,
            accesses: f.counters(
                "tiervm_vm_sampled_accesses_total",
                "Sampled accesses of a VM as the host measures them (hint faults; rate() of it is the access rate the fast-tier division values capacity by)",
                vm,
            )?,
        })
    }

    fn record(&self, v: &VmEntry) {
        let vm = [v.id.as_str(), v.uuid.as_str()];
        add(&self.switches, &vm, v.policy_switches as f64);
        add(&self.accesses, &vm, v.sampled_accesses);
        let Some(st) = &v.stats else { return };
        let m = &st.mem.migration;
        let emu = v.spec.vm.emulate_latency.as_deref().unwrap_or("off");
        add(&self.ops, &[vm[0], vm[1], emu], st.ops as f64);
        add(&self.promote, &vm, m.promotions as f64);
        add(&self.demote, &vm, m.demotions as f64);
        add(&self.tpm_commit, &vm, m.tpm_commits as f64);
        add(&self.tpm_abort, &vm, m.tpm_aborts as f64);
        add(&self.shadow_demote, &vm, m.shadow_demotions as f64);
        add(&self.shadow_reclaim, &vm, m.shadow_reclaims as f64);
        add(&self.stall, &vm, m.guest_stall_ms / 1e3);
        add(&self.hint, &vm, st.mem.hint_faults as f64);
    }
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
