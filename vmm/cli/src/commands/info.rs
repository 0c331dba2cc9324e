//! `tiervm info`: what this host offers and what tiervm uses it for.
//!
//! Collects two groups of facts and prints them, each with the job it does
//! in tiervm, followed by a verdict:
//!
//! - KVM (this module; capabilities from [`vmm_core::vstate::kvm_caps`], which
//!   VM creation checks too): `/dev/kvm`, API version, flavour (PVM, VMX,
//!   SVM), dirty-log capabilities, vCPU and memslot limits, TSC frequency.
//! - Host memory ([`tiering::host`]): NUMA nodes, userfaultfd features,
//!   idle page tracking, THP, `vm.max_map_count`.
//!
//! Everything is read-only: nothing in `/sys` or `/proc` is written. A
//! throwaway VM with one vCPU is created (and closed) to ask VM-level
//! capabilities and the TSC frequency. A missing or forbidden `/dev/kvm` is
//! reported as a fact with its fix, never a panic.
//!
//! `--json` prints one [`InfoReport`] object; its field names are the Rust
//! field names documented below.

use crate::error::InfoError;
use std::fs;
use std::io;
use std::path::Path;

use kvm_ioctls::{Kvm, VmFd};
use serde::Serialize;
use tiering::host::{self, Availability, HostFacts, IdlePageTracking};

pub use vmm_core::vstate::kvm_caps::{KvmCaps, ManualDirtyLogProtect};

/// Arguments of `tiervm info`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct InfoArgs {
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tiervm info`: probes the host and prints the report to stdout.
pub fn run(args: &InfoArgs) -> Result<(), InfoError> {
    let report = collect();
    let text = if args.json {
        let mut s = serde_json::to_string_pretty(&report)?;
        s.push('\n');
        s
    } else {
        render_human(&report)
    };
    // A closed pipe ends quietly; other write errors are reported.
    crate::output::write_stdout(&text).map_err(InfoError::Stdout)
}

/// Everything `tiervm info` reports (the `--json` object).
#[derive(Debug, Clone, Serialize)]
pub struct InfoReport {
    /// KVM facts.
    pub kvm: KvmFacts,
    /// Host memory facts (see [`tiering::host::HostFacts`]).
    pub host: HostFacts,
    /// What tiervm can do on this host.
    pub verdict: Verdict,
}

/// Probes KVM and the host and derives the verdict.
pub fn collect() -> InfoReport {
    let kvm = probe_kvm();
    let host = host::probe();
    let verdict = Verdict::from_facts(&kvm, &host);
    InfoReport { kvm, host, verdict }
}

// ---------------------------------------------------------------------------
// KVM flavour
// ---------------------------------------------------------------------------

/// Which implementation sits behind `/dev/kvm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvmFlavour {
    /// PVM (`kvm_pvm`): pagetable-based virtualization without hardware
    /// support; guest ring 3 runs natively, guest ring 0 is emulated.
    Pvm,
    /// Intel VT-x (`kvm_intel`).
    Vmx,
    /// AMD-V (`kvm_amd`).
    Svm,
    /// No evidence either way.
    Unknown,
}

impl KvmFlavour {
    fn label(self) -> &'static str {
        match self {
            KvmFlavour::Pvm => "PVM",
            KvmFlavour::Vmx => "VMX (Intel VT-x)",
            KvmFlavour::Svm => "SVM (AMD-V)",
            KvmFlavour::Unknown => "unknown",
        }
    }

    fn consequence(self) -> &'static str {
        match self {
            KvmFlavour::Pvm => {
                "guest ring 3 runs natively, ring 0 is emulated (~1000x slower): \
                 tiervm guests run their workload in ring 3; shadow paging"
            }
            KvmFlavour::Vmx | KvmFlavour::Svm => {
                "hardware virtualization: guest ring 0 and ring 3 both run natively"
            }
            KvmFlavour::Unknown => "guest speed unknown; ring-3 guests run on every flavour",
        }
    }
}

/// What the flavour decision was based on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FlavourEvidence {
    /// KVM vendor modules present under `/sys/module` (built in or loaded):
    /// any of `kvm_pvm`, `kvm_intel`, `kvm_amd`.
    pub sys_module: Vec<String>,
    /// KVM vendor modules listed in `/proc/modules` (loadable modules only;
    /// built-in ones never appear there).
    pub proc_modules: Vec<String>,
    /// `vmx` CPU flag in `/proc/cpuinfo`.
    pub cpu_vmx: bool,
    /// `svm` CPU flag in `/proc/cpuinfo`.
    pub cpu_svm: bool,
    /// `hypervisor` CPU flag: this host is itself a guest.
    pub cpu_hypervisor: bool,
}

const VENDOR_MODULES: [&str; 3] = ["kvm_pvm", "kvm_intel", "kvm_amd"];

/// Names of loaded modules in `/proc/modules` text (first word of each line).
pub fn parse_proc_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The CPU flags of the first `flags` line of `/proc/cpuinfo` text (empty if
/// there is none).
pub fn parse_cpu_flags(cpuinfo: &str) -> Vec<String> {
    cpuinfo
        .lines()
        .find(|l| l.split(':').next().map(str::trim) == Some("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, flags)| flags.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Gathers flavour evidence from `/sys/module`, `/proc/modules` and
/// `/proc/cpuinfo`.
///
/// Why these sources: a vendor module shows up in `/sys/module/<name>`
/// whether it is built in or loaded, as long as it has parameters (all three
/// do); `/proc/modules` lists only loadable modules, so it misses built-in
/// KVM. On the machines this project runs on, `/sys/module` shows `kvm` and
/// `kvm_pvm` (with PVM parameters such as `pvm_native`, `hb_mask`), no
/// `kvm_intel`/`kvm_amd`, `/proc/modules` lists no KVM module (all built
/// in), and `/proc/cpuinfo` has the `hypervisor` flag but neither `vmx` nor
/// `svm`: a guest without nested hardware virtualization, running KVM on
/// PVM. The CPU flags are the fallback when sysfs says nothing.
pub fn flavour_evidence() -> FlavourEvidence {
    let sys_module = VENDOR_MODULES
        .iter()
        .filter(|m| Path::new("/sys/module").join(m).exists())
        .map(|m| m.to_string())
        .collect();
    let proc_modules = fs::read_to_string("/proc/modules")
        .map(|t| {
            parse_proc_modules(&t)
                .into_iter()
                .filter(|m| VENDOR_MODULES.contains(&m.as_str()))
                .collect()
        })
        .unwrap_or_default();
    let flags = fs::read_to_string("/proc/cpuinfo")
        .map(|t| parse_cpu_flags(&t))
        .unwrap_or_default();
    let has = |f: &str| flags.iter().any(|x| x == f);
    FlavourEvidence {
        sys_module,
        proc_modules,
        cpu_vmx: has("vmx"),
        cpu_svm: has("svm"),
        cpu_hypervisor: has("hypervisor"),
    }
}

/// Decides the flavour from the evidence. Vendor modules win over CPU
/// flags. Only one vendor module can drive `/dev/kvm`; if several are
/// present (built-in modules show up even when their init failed), the one
/// the CPU can support wins: `kvm_intel` needs `vmx`, `kvm_amd` needs `svm`,
/// `kvm_pvm` needs nothing.
pub fn decide_flavour(e: &FlavourEvidence) -> KvmFlavour {
    let present =
        |m: &str| e.sys_module.iter().any(|x| x == m) || e.proc_modules.iter().any(|x| x == m);
    if present("kvm_intel") && e.cpu_vmx {
        KvmFlavour::Vmx
    } else if present("kvm_amd") && e.cpu_svm {
        KvmFlavour::Svm
    } else if present("kvm_pvm") {
        KvmFlavour::Pvm
    } else if present("kvm_intel") {
        KvmFlavour::Vmx
    } else if present("kvm_amd") {
        KvmFlavour::Svm
    } else if e.cpu_vmx {
        KvmFlavour::Vmx
    } else if e.cpu_svm {
        KvmFlavour::Svm
    } else {
        KvmFlavour::Unknown
    }
}

// ---------------------------------------------------------------------------
// KVM capabilities
// ---------------------------------------------------------------------------

/// Result of creating a throwaway VM and vCPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmProbe {
    /// `KVM_CREATE_VM` succeeded.
    pub vm_created: bool,
    /// `KVM_CREATE_VCPU` succeeded.
    pub vcpu_created: bool,
    /// The first failure, if any.
    pub error: Option<String>,
    /// `KVM_GET_TSC_KHZ` of the vCPU, kHz.
    pub tsc_khz: Option<u32>,
}

/// Everything about KVM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvmFacts {
    /// Opening `/dev/kvm`.
    pub dev_kvm: Availability,
    /// What to do when `dev_kvm` is not ok.
    pub fix: Option<String>,
    /// `KVM_GET_API_VERSION` (12 on every supported kernel).
    pub api_version: Option<i32>,
    /// Implementation behind `/dev/kvm`.
    pub flavour: KvmFlavour,
    /// What `flavour` was decided from.
    pub flavour_evidence: FlavourEvidence,
    /// Capabilities, when `/dev/kvm` opened.
    pub caps: Option<KvmCaps>,
    /// The throwaway VM, when `/dev/kvm` opened.
    pub vm: Option<VmProbe>,
}

/// The API version tiervm (through kvm-ioctls) is written against.
pub const KVM_API_VERSION: i32 = 12;

fn dev_kvm_fix(access: &Availability) -> Option<String> {
    match access {
        Availability::Ok => None,
        Availability::Absent => Some(
            "load the KVM module (modprobe kvm_intel, kvm_amd or kvm_pvm) \
             or enable virtualization in the firmware"
                .into(),
        ),
        Availability::PermissionDenied => Some(
            vmm_core::permissions::NodeAccess::of(vmm_core::permissions::DEV_KVM).map_or_else(
                || {
                    "run as a user in group kvm (usermod -aG kvm $USER, then log in again) or as root"
                        .into()
                },
                |n| format!("{}; or run as root", n.grant_fix("kvm")),
            ),
        ),
        Availability::Failed { .. } => Some("check dmesg for KVM errors".into()),
    }
}

fn probe_vm(kvm: &Kvm) -> (VmProbe, Option<VmFd>) {
    let vm = match kvm.create_vm() {
        Ok(vm) => vm,
        Err(e) => {
            let probe = VmProbe {
                vm_created: false,
                vcpu_created: false,
                error: Some(format!("KVM_CREATE_VM failed: {e}")),
                tsc_khz: None,
            };
            return (probe, None);
        }
    };
    let probe = match vm.create_vcpu(0) {
        Ok(vcpu) => {
            let (tsc_khz, error) = match vcpu.get_tsc_khz() {
                Ok(khz) if khz > 0 => (Some(khz), None),
                Ok(_) => (None, Some("KVM_GET_TSC_KHZ returned 0".to_string())),
                Err(e) => (None, Some(format!("KVM_GET_TSC_KHZ failed: {e}"))),
            };
            VmProbe {
                vm_created: true,
                vcpu_created: true,
                error,
                tsc_khz,
            }
        }
        Err(e) => VmProbe {
            vm_created: true,
            vcpu_created: false,
            error: Some(format!("KVM_CREATE_VCPU failed: {e}")),
            tsc_khz: None,
        },
    };
    (probe, Some(vm))
}

/// Probes `/dev/kvm`. Never fails: problems become facts.
pub fn probe_kvm() -> KvmFacts {
    let flavour_evidence = flavour_evidence();
    let flavour = decide_flavour(&flavour_evidence);
    let kvm = match Kvm::new() {
        Ok(kvm) => kvm,
        Err(e) => {
            let dev_kvm = Availability::from_io_error(&io::Error::from_raw_os_error(e.errno()));
            return KvmFacts {
                fix: dev_kvm_fix(&dev_kvm),
                dev_kvm,
                api_version: None,
                flavour,
                flavour_evidence,
                caps: None,
                vm: None,
            };
        }
    };
    let (vm_probe, vm) = probe_vm(&kvm);
    let caps = match &vm {
        Some(vm) => KvmCaps::of_vm(&kvm, vm),
        None => KvmCaps::of_system(&kvm),
    };
    KvmFacts {
        dev_kvm: Availability::Ok,
        fix: None,
        api_version: Some(kvm.get_api_version()),
        flavour,
        flavour_evidence,
        caps: Some(caps),
        vm: Some(vm_probe),
    }
}

// ---------------------------------------------------------------------------
// Verdict
// ---------------------------------------------------------------------------

/// How guest page accesses can be observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessTracking {
    /// Hint faults: unmap sampled pages with `UFFDIO_MOVE`, catch the touch.
    HintFaults,
    /// Neither is available.
    None,
}

/// Which migration mechanism tiervm can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationSupport {
    /// Copy while the guest runs, commit only if the page stayed clean
    /// (`UFFDIO_MOVE` + manual-protect dirty log).
    Transactional,
    /// `UFFDIO_MOVE` without the manual-protect dirty log: no per-page dirty
    /// check, so pages move only while the vCPUs are paused.
    StopAndCopy,
    /// No `UFFDIO_MOVE` (or no VMs): tiervm's migration mechanisms are
    /// unavailable; only the no-migration baseline runs.
    None,
}

/// Whether the fast and slow tiers are distinct host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Tiers {
    /// Fast and slow tiers on different NUMA nodes.
    Real {
        /// Fast-tier node.
        fast_node: u32,
        /// Slow-tier node.
        slow_node: u32,
    },
    /// Both tiers on one node: capacities enforced, latency not real
    /// (latencies in reports are modeled).
    Emulated {
        /// The node holding both tiers.
        node: u32,
    },
    /// NUMA topology unreadable.
    Unknown,
}

/// What tiervm can do on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// `/dev/kvm` usable, API 12, and a VM with a vCPU could be created.
    pub run_vms: bool,
    /// Migration mechanism available.
    pub migration: MigrationSupport,
    /// Access tracking mechanism available.
    pub access_tracking: AccessTracking,
    /// Real or emulated tiers.
    pub tiers: Tiers,
    /// One line summarizing the above.
    pub summary: String,
}

impl Verdict {
    /// Derives the verdict from the facts (pure).
    pub fn from_facts(kvm: &KvmFacts, host: &HostFacts) -> Verdict {
        let run_vms = kvm.dev_kvm.is_ok()
            && kvm.api_version == Some(KVM_API_VERSION)
            && kvm.vm.as_ref().is_some_and(|v| v.vcpu_created);
        let moves = host.userfaultfd.has_move();
        let manual_protect = kvm
            .caps
            .as_ref()
            .is_some_and(|c| c.manual_dirty_log_protect.manual_protect_enable);
        let migration = match (run_vms && moves, manual_protect) {
            (true, true) => MigrationSupport::Transactional,
            (true, false) => MigrationSupport::StopAndCopy,
            (false, _) => MigrationSupport::None,
        };
        // page_idle is detected but not used (no tracker for it is built:
        // the development host lacks it, so it could not be tested).
        let access_tracking = if moves {
            AccessTracking::HintFaults
        } else {
            AccessTracking::None
        };
        let tiers = match host.tier_nodes {
            Some(host::TierNodes {
                fast,
                slow: Some(slow),
            }) => Tiers::Real {
                fast_node: fast,
                slow_node: slow,
            },
            Some(host::TierNodes { fast, slow: None }) => Tiers::Emulated { node: fast },
            None => Tiers::Unknown,
        };
        let summary = format!(
            "run VMs: {}; migration: {}; access tracking: {}; tiers: {}",
            yes_no(run_vms),
            match migration {
                MigrationSupport::Transactional => "transactional",
                MigrationSupport::StopAndCopy => "stop-and-copy only",
                MigrationSupport::None => "none (needs UFFDIO_MOVE; no-migration baseline only)",
            },
            match access_tracking {
                AccessTracking::HintFaults => "hint-fault sampling",
                AccessTracking::None => "none",
            },
            match tiers {
                Tiers::Real {
                    fast_node,
                    slow_node,
                } => format!("real (fast node{fast_node}, slow node{slow_node})"),
                Tiers::Emulated { node } => {
                    format!("emulated on node{node} (capacities real, latencies modeled)")
                }
                Tiers::Unknown => "unknown".to_string(),
            }
        );
        Verdict {
            run_vms,
            migration,
            access_tracking,
            tiers,
            summary,
        }
    }
}

// ---------------------------------------------------------------------------
// Human rendering
// ---------------------------------------------------------------------------

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

struct Lines(String);

impl Lines {
    fn fact(&mut self, label: &str, value: impl AsRef<str>, use_: impl AsRef<str>) {
        let (value, use_) = (value.as_ref(), use_.as_ref());
        if use_.is_empty() {
            self.0.push_str(&format!("  {label}: {value}\n"));
        } else {
            self.0.push_str(&format!("  {label}: {value} -> {use_}\n"));
        }
    }
    fn heading(&mut self, h: &str) {
        self.0.push_str(h);
        self.0.push('\n');
    }
}

fn render_kvm(l: &mut Lines, kvm: &KvmFacts) {
    l.heading("KVM");
    let e = &kvm.flavour_evidence;
    let evidence = format!(
        "/sys/module: [{}], /proc/modules: [{}], cpu flags: vmx={} svm={} hypervisor={}",
        e.sys_module.join(" "),
        e.proc_modules.join(" "),
        yes_no(e.cpu_vmx),
        yes_no(e.cpu_svm),
        yes_no(e.cpu_hypervisor)
    );
    match &kvm.fix {
        Some(fix) => l.fact(
            "/dev/kvm",
            kvm.dev_kvm.describe(),
            format!("cannot run VMs; fix: {fix}"),
        ),
        None => l.fact("/dev/kvm", kvm.dev_kvm.describe(), "runs guests"),
    }
    if let Some(v) = kvm.api_version {
        let use_ = if v == KVM_API_VERSION {
            "matches the API tiervm is written for".to_string()
        } else {
            format!("tiervm needs {KVM_API_VERSION}")
        };
        l.fact("API version", v.to_string(), use_);
    }
    l.fact(
        "flavour",
        format!("{} ({evidence})", kvm.flavour.label()),
        kvm.flavour.consequence(),
    );
    if let Some(vm) = &kvm.vm {
        let value = match (&vm.error, vm.vcpu_created) {
            (_, true) => "created VM + vCPU".to_string(),
            (Some(err), false) => err.clone(),
            (None, false) => "failed".to_string(),
        };
        l.fact("test VM", value, "");
        match (vm.tsc_khz, &vm.error) {
            (Some(khz), _) => l.fact(
                "TSC frequency",
                format!("{:.3} GHz", f64::from(khz) / 1e6),
                "converts guest rdtsc readings to time",
            ),
            (None, Some(err)) if vm.vcpu_created => l.fact("TSC frequency", err, ""),
            _ => {}
        }
    }
    if let Some(c) = &kvm.caps {
        render_kvm_caps(l, c);
    }
}

/// The capabilities tiervm uses or reports.
fn render_kvm_caps(l: &mut Lines, c: &KvmCaps) {
    let mp = c.manual_dirty_log_protect;
    l.fact(
        "dirty log manual protect",
        format!(
            "{} (mask {:#x}: enable={} initially_set={})",
            yes_no(mp.manual_protect_enable),
            mp.raw,
            yes_no(mp.manual_protect_enable),
            yes_no(mp.initially_set)
        ),
        if mp.manual_protect_enable {
            "transactional dirty check (KVM_CLEAR_DIRTY_LOG re-arms single pages)"
        } else {
            "no per-page re-arm: transactional migration unavailable"
        },
    );
    let ring = |bytes: i32| {
        if bytes > 0 {
            format!("yes (up to {} entries)", bytes / 16)
        } else {
            "no".to_string()
        }
    };
    l.fact(
        "dirty ring",
        format!(
            "{}; acq_rel: {}",
            ring(c.dirty_log_ring_bytes),
            ring(c.dirty_log_ring_acq_rel_bytes)
        ),
        "not used (tiervm reads the dirty bitmap)",
    );
    l.fact(
        "memory fault info",
        yes_no(c.memory_fault_info),
        "not used (would name the guest address of a failed access)",
    );
    l.fact(
        "user memory slots",
        yes_no(c.user_memory),
        if c.user_memory {
            "guest RAM is tiered process memory"
        } else {
            "required: tiervm cannot map guest RAM"
        },
    );
    l.fact(
        "read-only memslots",
        yes_no(c.readonly_mem),
        "not required (no ROM regions)",
    );
    l.fact(
        "vCPUs",
        format!("max {}, recommended {}", c.max_vcpus, c.recommended_vcpus),
        "upper bound for --vcpus",
    );
    l.fact(
        "memslots",
        c.max_memslots.to_string(),
        "one slot per guest RAM region",
    );
    l.fact("capabilities asked on", c.asked_on, "");
}

fn render_host(l: &mut Lines, h: &HostFacts) {
    l.heading("Host memory");
    render_memory(l, h);
    render_userfaultfd(l, &h.userfaultfd);
    render_tracking_and_knobs(l, h);
}

/// Kernel, page size, memory and NUMA nodes.
fn render_memory(l: &mut Lines, h: &HostFacts) {
    if let Some(k) = &h.kernel_release {
        l.fact("kernel", k, "");
    }
    l.fact(
        "page size",
        format!("{} bytes", h.page_size_bytes),
        "tiering granularity is 4 KiB guest pages",
    );
    if let Some(total) = h.mem_total_bytes {
        l.fact("memory (MemTotal)", gib(total), "upper bound for --mem");
    }
    if let Some(nodes) = &h.numa_nodes {
        let list: Vec<String> = nodes
            .iter()
            .map(|n| {
                format!(
                    "node{} {} total, {} free, {}",
                    n.id,
                    gib(n.mem_total_bytes),
                    gib(n.mem_free_bytes),
                    if n.cpu_less {
                        "CPU-less (likely CXL/slow)".to_string()
                    } else {
                        format!("{} CPUs", n.cpus.len())
                    }
                )
            })
            .collect();
        let use_ = match h.tier_nodes {
            Some(host::TierNodes {
                fast,
                slow: Some(slow),
            }) => format!("real tiers: fast = node{fast}, slow = node{slow}"),
            Some(host::TierNodes { fast, slow: None }) => format!(
                "tiers are emulated on node{fast}: capacities enforced, latency not real \
                 (slow-tier latencies are modeled)"
            ),
            None => String::new(),
        };
        l.fact(
            "NUMA nodes with memory",
            format!("{} ({})", nodes.len(), list.join("; ")),
            use_,
        );
        if let (Some(sum), Some(total)) = (h.numa_mem_total_bytes, h.mem_total_bytes) {
            if sum < total - total / 10 {
                l.fact(
                    "note",
                    format!(
                        "per-node MemTotal sums to {} but /proc/meminfo says {}",
                        gib(sum),
                        gib(total)
                    ),
                    "this kernel's per-node counters cover only part of RAM; \
                     --mem is checked against /proc/meminfo",
                );
            }
        }
    }
}

/// userfaultfd and the features tiervm's mechanisms need.
fn render_userfaultfd(l: &mut Lines, u: &host::UserfaultfdFacts) {
    l.fact(
        "userfaultfd",
        format!(
            "/dev/userfaultfd {}, syscall {}{}",
            u.dev_userfaultfd.describe(),
            u.syscall.describe(),
            match u.unprivileged_userfaultfd {
                Some(v) => format!(", vm.unprivileged_userfaultfd={v}"),
                None => String::new(),
            }
        ),
        if u.usable() {
            "guest RAM registered for missing faults"
        } else {
            "no userfaultfd: no migration, no hint faults"
        },
    );
    match &u.api {
        Some(api) => {
            let f = &api.features;
            l.fact(
                "UFFDIO_API features",
                format!(
                    "{:#x} via {} [{}]{}",
                    f.raw,
                    api.via,
                    f.names.join(" "),
                    if f.unknown_bits != 0 {
                        format!(" + unknown bits {:#x}", f.unknown_bits)
                    } else {
                        String::new()
                    }
                ),
                "",
            );
            l.fact(
                "UFFDIO_MOVE",
                yes_no(f.moves),
                if f.moves {
                    "transactional migration and hint-fault sampling"
                } else {
                    "needs Linux >= 6.8: no zero-copy page moves, so no migration"
                },
            );
            l.fact(
                "WP_ASYNC",
                yes_no(f.wp_async),
                "not used (KVM's dirty log tracks guest writes)",
            );
            l.fact(
                "MINOR_SHMEM",
                yes_no(f.minor_shmem),
                "not used (guest RAM is private anonymous memory)",
            );
        }
        None => {
            if let Some(err) = &u.api_error {
                l.fact("UFFDIO_API", err, "");
            }
        }
    }
}

/// Access tracking and the kernel settings that bear on tiering.
fn render_tracking_and_knobs(l: &mut Lines, h: &HostFacts) {
    l.fact(
        "page_idle",
        h.idle_page_tracking.describe(),
        match (&h.idle_page_tracking, h.userfaultfd.has_move()) {
            (IdlePageTracking::Readable, true) => {
                "present but not used: tiervm tracks accesses with hint faults (mtm's accessed bits come from hint-fault probes)"
            }
            (_, true) => {
                "accessed-bit tracking unavailable; tiervm falls back to hint-fault sampling (mtm's accessed bits come from hint-fault probes)"
            }
            (_, false) => {
                "no access tracking: hint faults need UFFDIO_MOVE (tiervm does not use page_idle)"
            }
        },
    );
    render_damon(l, h);
    render_kernel_knobs(l, h);
    for p in &h.problems {
        l.fact("problem", p, "");
    }
}

/// DAMON's state and whether `--tracking damon` can use it.
fn render_damon(l: &mut Lines, h: &HostFacts) {
    use tiering::tracking::damon::{DamonStatus, ALLOW_ENV};
    let (what, why) = match (&h.damon.sysfs, h.damon.opted_in) {
        (DamonStatus::Absent, _) => (
            "absent".to_string(),
            "--tracking damon unavailable: kernel built without CONFIG_DAMON_SYSFS".to_string(),
        ),
        (DamonStatus::InUse { kdamonds, running }, _) => (
            format!("in use ({kdamonds} kdamond(s), {running} running)"),
            "--tracking damon refused: DAMON's sysfs state is machine-wide and someone else's here; tiervm never writes it".to_string(),
        ),
        (DamonStatus::Idle, true) => (
            format!("idle, {ALLOW_ENV}=1"),
            "--tracking damon available: the kernel samples guest RAM's accessed bits (KVM's EPT/NPT bits too), no faults".to_string(),
        ),
        (DamonStatus::Idle, false) => (
            "idle".to_string(),
            format!("--tracking damon needs {ALLOW_ENV}=1: it writes DAMON's machine-wide sysfs state"),
        ),
        (DamonStatus::Unreadable { error }, _) => (
            format!("unreadable ({error})"),
            "--tracking damon unavailable".to_string(),
        ),
    };
    l.fact("DAMON", what, why);
}

/// Kernel settings that bear on tiering: THP, mapping count, NUMA
/// balancing, reclaim-time demotion.
fn render_kernel_knobs(l: &mut Lines, h: &HostFacts) {
    if let Some(thp) = &h.thp {
        l.fact(
            "transparent huge pages",
            thp.as_str(),
            match thp {
                host::ThpMode::Never => {
                    "tiered and untiered guest RAM stay on 4 KiB pages (no huge-page TLB reach)"
                }
                _ => {
                    "tiered guest RAM is committed 2 MiB at a time as huge pages (MADV_HUGEPAGE \
                      pools); ranges split into pages are NOHUGEPAGE until tiervm collapses them"
                }
            },
        );
    }
    if let Some(n) = h.max_map_count {
        l.fact(
            "vm.max_map_count",
            n.to_string(),
            "caps the number of mappings: tiervm moves pages inside a few large mappings, never one VMA per page",
        );
    }
    if let Some(nb) = h.numa_balancing {
        l.fact(
            "kernel.numa_balancing",
            match nb {
                0 => "0 (off)".to_string(),
                1 => "1 (NUMA balancing)".to_string(),
                2 => "2 (memory tiering mode)".to_string(),
                3 => "3 (NUMA balancing and memory tiering)".to_string(),
                n => n.to_string(),
            },
            if nb == 0 {
                "off: the kernel will not migrate guest pages behind tiervm's back"
            } else {
                "on: tiervm's memory has an explicit policy, which the scanner skips (no hint \
                 faults, no migrations of guest pages); other processes are still balanced"
            },
        );
    }
    if let Some(d) = h.demotion_enabled {
        l.fact(
            "reclaim-time demotion",
            if d { "on" } else { "off" },
            if d {
                "tiervm's memory is locked on fault: reclaim neither demotes nor swaps it"
            } else {
                "off: reclaim does not move pages between tiers"
            },
        );
    }
}

/// Renders the human report.
pub fn render_human(r: &InfoReport) -> String {
    let mut l = Lines(String::new());
    l.heading("tiervm info: what this host offers and what tiervm uses it for");
    render_kvm(&mut l, &r.kvm);
    render_host(&mut l, &r.host);
    l.heading(&format!("Verdict: {}", r.verdict.summary));
    l.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(sys: &[&str], vmx: bool, svm: bool) -> FlavourEvidence {
        FlavourEvidence {
            sys_module: sys.iter().map(|s| s.to_string()).collect(),
            proc_modules: Vec::new(),
            cpu_vmx: vmx,
            cpu_svm: svm,
            cpu_hypervisor: false,
        }
    }

    #[test]
    fn flavour_decision() {
        assert_eq!(
            decide_flavour(&evidence(&["kvm_pvm"], false, false)),
            KvmFlavour::Pvm
        );
        assert_eq!(
            decide_flavour(&evidence(&["kvm_intel"], true, false)),
            KvmFlavour::Vmx
        );
        assert_eq!(
            decide_flavour(&evidence(&["kvm_amd"], false, true)),
            KvmFlavour::Svm
        );
        // Built-in kvm_intel without vmx cannot drive /dev/kvm: PVM does.
        assert_eq!(
            decide_flavour(&evidence(&["kvm_intel", "kvm_pvm"], false, false)),
            KvmFlavour::Pvm
        );
        assert_eq!(
            decide_flavour(&evidence(&["kvm_intel", "kvm_pvm"], true, false)),
            KvmFlavour::Vmx
        );
        // Sysfs silent: CPU flags decide.
        assert_eq!(decide_flavour(&evidence(&[], false, true)), KvmFlavour::Svm);
        assert_eq!(
            decide_flavour(&evidence(&[], false, false)),
            KvmFlavour::Unknown
        );
        // A loadable module seen only in /proc/modules counts.
        let mut e = evidence(&[], false, false);
        e.proc_modules = vec!["kvm_pvm".into()];
        assert_eq!(decide_flavour(&e), KvmFlavour::Pvm);
    }

    #[test]
    fn proc_modules_and_cpu_flags_parse() {
        let modules = "kvm_intel 401408 0 - Live 0x0\nkvm 1327104 1 kvm_intel, Live 0x0\n\n";
        assert_eq!(parse_proc_modules(modules), vec!["kvm_intel", "kvm"]);
        let cpuinfo = "processor\t: 0\nflags\t\t: fpu vme svm hypervisor\nbugs\t\t: x\n\
                       processor\t: 1\nflags\t\t: fpu\n";
        assert_eq!(
            parse_cpu_flags(cpuinfo),
            vec!["fpu", "vme", "svm", "hypervisor"]
        );
        assert!(parse_cpu_flags("garbage without colon\nflags\n").is_empty());
        assert!(parse_cpu_flags("").is_empty());
        // "vmx flags" line (newer kernels) must not be taken for "flags".
        assert_eq!(
            parse_cpu_flags("vmx flags\t: ept\nflags\t: vmx\n"),
            vec!["vmx"]
        );
    }

    fn host_facts(move_bit: bool, nodes: &[(u32, bool)]) -> HostFacts {
        let numa: Vec<host::NumaNode> = nodes
            .iter()
            .map(|&(id, cpu_less)| host::NumaNode {
                id,
                mem_total_bytes: 8 << 30,
                mem_free_bytes: 4 << 30,
                cpus: if cpu_less { vec![] } else { vec![id] },
                cpu_less,
                distances: vec![],
            })
            .collect();
        let features = if move_bit { 0x1ffff } else { 0xffff };
        HostFacts {
            kernel_release: Some("6.18.0".into()),
            page_size_bytes: 4096,
            mem_total_bytes: Some(16 << 30),
            numa_mem_total_bytes: Some(numa.iter().map(|n| n.mem_total_bytes).sum()),
            tier_nodes: host::default_tier_nodes(&numa),
            numa_nodes: Some(numa),
            thp: Some(host::ThpMode::Madvise),
            max_map_count: Some(65530),
            numa_balancing: Some(0),
            demotion_enabled: Some(false),
            userfaultfd: host::UserfaultfdFacts {
                dev_userfaultfd: Availability::Ok,
                syscall: Availability::Ok,
                unprivileged_userfaultfd: Some(0),
                api: Some(host::UffdApiAnswer {
                    via: host::DEV_USERFAULTFD,
                    features: host::UffdFeatures::from_bits(features),
                    ioctls_raw: 0x8000_0000_0000_0003,
                }),
                api_error: None,
            },
            idle_page_tracking: IdlePageTracking::Absent,
            damon: host::DamonFacts {
                sysfs: tiering::tracking::damon::DamonStatus::InUse {
                    kdamonds: 1,
                    running: 1,
                },
                opted_in: false,
            },
            problems: vec![],
        }
    }

    fn kvm_facts(dev: Availability, manual_protect: i32) -> KvmFacts {
        let ok = dev.is_ok();
        KvmFacts {
            fix: dev_kvm_fix(&dev),
            dev_kvm: dev,
            api_version: ok.then_some(12),
            flavour: KvmFlavour::Pvm,
            flavour_evidence: evidence(&["kvm_pvm"], false, false),
            caps: ok.then_some(KvmCaps {
                asked_on: "vm",
                manual_dirty_log_protect: ManualDirtyLogProtect::from_raw(manual_protect),
                dirty_log_ring_bytes: 65536 * 16,
                dirty_log_ring_acq_rel_bytes: 0,
                memory_fault_info: true,
                readonly_mem: false,
                user_memory: true,
                max_vcpus: 1024,
                recommended_vcpus: 2,
                max_memslots: 32764,
            }),
            vm: ok.then_some(VmProbe {
                vm_created: true,
                vcpu_created: true,
                error: None,
                tsc_khz: Some(2_100_000),
            }),
        }
    }

    #[test]
    fn verdict_follows_the_facts() {
        let v = Verdict::from_facts(
            &kvm_facts(Availability::Ok, 3),
            &host_facts(true, &[(0, false)]),
        );
        assert!(v.run_vms);
        assert_eq!(v.migration, MigrationSupport::Transactional);
        assert_eq!(v.access_tracking, AccessTracking::HintFaults);
        assert_eq!(v.tiers, Tiers::Emulated { node: 0 });

        let v = Verdict::from_facts(
            &kvm_facts(Availability::Ok, 0),
            &host_facts(true, &[(0, false), (1, true)]),
        );
        assert_eq!(v.migration, MigrationSupport::StopAndCopy);
        assert_eq!(
            v.tiers,
            Tiers::Real {
                fast_node: 0,
                slow_node: 1
            }
        );

        let v = Verdict::from_facts(
            &kvm_facts(Availability::Ok, 3),
            &host_facts(false, &[(0, false)]),
        );
        assert_eq!(v.migration, MigrationSupport::None);
        assert_eq!(v.access_tracking, AccessTracking::None);

        let v = Verdict::from_facts(
            &kvm_facts(Availability::PermissionDenied, 0),
            &host_facts(true, &[(0, false)]),
        );
        assert!(!v.run_vms);
        assert_eq!(v.migration, MigrationSupport::None);
        assert!(v.summary.starts_with("run VMs: no"), "{}", v.summary);
    }

    #[test]
    fn human_report_explains_missing_kvm_and_emulated_tiers() {
        let kvm = kvm_facts(Availability::Absent, 0);
        let host = host_facts(true, &[(0, false)]);
        let verdict = Verdict::from_facts(&kvm, &host);
        let text = render_human(&InfoReport { kvm, host, verdict });
        assert!(
            text.contains("/dev/kvm: absent -> cannot run VMs; fix: load the KVM module"),
            "{text}"
        );
        assert!(text.contains("tiers are emulated on node0"), "{text}");
        assert!(
            text.contains("UFFDIO_MOVE: yes -> transactional migration"),
            "{text}"
        );
        assert!(text.contains("page_idle: absent"), "{text}");
        assert!(text.contains("falls back to hint-fault sampling"), "{text}");
        assert!(text.contains("Verdict: run VMs: no"), "{text}");

        let kvm = kvm_facts(Availability::PermissionDenied, 0);
        let host = host_facts(false, &[(0, false), (2, true)]);
        let verdict = Verdict::from_facts(&kvm, &host);
        let text = render_human(&InfoReport { kvm, host, verdict });
        assert!(text.contains("group kvm"), "{text}");
        assert!(
            text.contains("UFFDIO_MOVE: no -> needs Linux >= 6.8"),
            "{text}"
        );
        assert!(
            text.contains("real tiers: fast = node0, slow = node2"),
            "{text}"
        );
    }

    #[test]
    fn json_report_has_documented_fields() {
        let kvm = kvm_facts(Availability::Ok, 3);
        let host = host_facts(true, &[(0, false)]);
        let verdict = Verdict::from_facts(&kvm, &host);
        let v = serde_json::to_value(InfoReport { kvm, host, verdict }).unwrap();
        assert_eq!(v["kvm"]["dev_kvm"]["status"], "ok");
        assert_eq!(v["kvm"]["flavour"], "pvm");
        assert_eq!(v["kvm"]["caps"]["manual_dirty_log_protect"]["raw"], 3);
        assert_eq!(v["host"]["userfaultfd"]["api"]["features"]["moves"], true);
        assert_eq!(v["verdict"]["migration"], "transactional");
        assert_eq!(v["verdict"]["tiers"]["kind"], "emulated");
        assert_eq!(v["verdict"]["tiers"]["node"], 0);
    }

    /// The real probe on this host: must not panic, and its verdict must
    /// agree with what the facts say.
    #[test]
    fn this_host_report() {
        let r = collect();
        let text = render_human(&r);
        eprintln!("{text}");
        eprintln!("{}", serde_json::to_string_pretty(&r).unwrap());
        if !r.kvm.dev_kvm.is_ok() {
            assert!(r.kvm.fix.is_some());
            tiering::host_support::skip_or_fail(&format!(
                "KVM assertions: /dev/kvm {}",
                r.kvm.dev_kvm.describe()
            ));
            return;
        }
        assert_eq!(r.kvm.api_version, Some(KVM_API_VERSION));
        assert!(r.kvm.caps.as_ref().unwrap().user_memory);
        assert!(text.contains("Verdict: run VMs: "));
    }
}
