//! What the host offers for tiered guest memory, probed read-only.
//!
//! This module answers: which NUMA nodes hold memory (and which of them have
//! no CPUs, the usual shape of a CXL or other slow tier), whether
//! userfaultfd is usable and which features it offers (`UFFD_FEATURE_MOVE`
//! is what transactional migration and hint-fault sampling are built on),
//! whether idle page tracking exists, the transparent huge page mode,
//! `vm.max_map_count`, total memory and the page size.
//!
//! Everything here only *reads* `/sys` and `/proc`; nothing writes a kernel
//! setting. The userfaultfd probe creates a userfaultfd, asks `UFFDIO_API`
//! for the feature bits and closes it again.
//!
//! Parsers for the text files are public and pure ([`parse_node_meminfo`],
//! [`parse_meminfo_total`], [`parse_thp_enabled`], [`parse_cpulist`],
//! [`UffdFeatures::from_bits`]) so they are tested on fixed strings.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Directory holding one `nodeN` subdirectory per NUMA node.
pub const SYSFS_NODE_DIR: &str = "/sys/devices/system/node";
/// System-wide memory counters; `MemTotal` is the host's usable RAM.
pub const PROC_MEMINFO: &str = "/proc/meminfo";
/// Transparent huge page mode; the active value is in brackets.
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// `vm.max_map_count`: how many VMAs one process may have.
pub const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";
/// Idle page tracking bitmap (`CONFIG_IDLE_PAGE_TRACKING`).
pub const PAGE_IDLE_BITMAP: &str = "/sys/kernel/mm/page_idle/bitmap";
/// The userfaultfd device node (Linux 6.1+).
pub use crate::sys::DEV_USERFAULTFD;
/// `vm.unprivileged_userfaultfd`: 0 means the syscall needs `CAP_SYS_PTRACE`.
pub const UNPRIVILEGED_USERFAULTFD: &str = "/proc/sys/vm/unprivileged_userfaultfd";
/// Reclaim-time demotion to slower nodes (memory tiers).
pub const DEMOTION_ENABLED: &str = "/sys/kernel/mm/numa/demotion_enabled";

/// Whether reclaim-time demotion is on (`None`: the kernel has no such knob).
pub fn demotion_enabled() -> Option<bool> {
    std::fs::read_to_string(DEMOTION_ENABLED)
        .ok()
        .map(|s| matches!(s.trim(), "true" | "1" | "Y" | "y"))
}

/// What the kernel's own tiering would do to tiervm's memory, for a note at
/// run start; `None` when none of it is on.
pub fn kernel_tiering_note(numa_balancing: Option<u64>, demotion: Option<bool>) -> Option<String> {
    let mut on = Vec::new();
    match numa_balancing {
        Some(0) | None => {}
        Some(1) => on.push("NUMA balancing (kernel.numa_balancing=1)".to_string()),
        Some(2) => {
            on.push("NUMA balancing in memory-tiering mode (kernel.numa_balancing=2)".to_string())
        }
        Some(n) => on.push(format!("NUMA balancing (kernel.numa_balancing={n})")),
    }
    if demotion == Some(true) {
        on.push("reclaim-time demotion (/sys/kernel/mm/numa/demotion_enabled)".into());
    }
    (!on.is_empty()).then(|| {
        format!(
            "note: {} is on: tiervm binds its memory with an explicit policy (the NUMA-balancing \
             scanner skips such ranges, so it takes no hint faults on guest pages) and locks it on \
             fault (reclaim neither swaps nor demotes it); the kernel tiers the rest of this host",
            on.join(" and ")
        )
    })
}

/// `kernel.numa_balancing`: the kernel's own NUMA/tier page migration.
pub const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";
/// Kernel release string.
pub const OSRELEASE: &str = "/proc/sys/kernel/osrelease";

/// Largest CPU id span accepted from a cpulist, so a corrupt file cannot
/// make the parser allocate without bound.
const MAX_CPU_SPAN: u32 = 1 << 16;

/// Why a host fact could not be probed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file could not be read.
    #[error("cannot read {path}: {source} (is /sys or /proc mounted and readable?)")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A file's contents did not have the expected format.
    #[error("unexpected contents in {path}: {reason}")]
    Malformed {
        /// The file (or a description of the input for string parsers).
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// No NUMA node reports any memory.
    #[error("no NUMA node with memory under {0} (is sysfs mounted?)")]
    NoMemoryNodes(PathBuf),
}

/// Error from a pure parser: says what was wrong with the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl ParseError {
    fn at(self, path: &Path) -> HostError {
        HostError::Malformed {
            path: path.to_path_buf(),
            reason: self.0,
        }
    }
}

fn read_text(path: &Path) -> Result<String, HostError> {
    fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })
}

// ---------------------------------------------------------------------------
// Pure parsers
// ---------------------------------------------------------------------------

/// Finds `key:` followed by a number and `kB` in meminfo-style text and returns
/// the value in bytes. Works for both `/proc/meminfo` (`MemTotal: 123 kB`) and
/// per-node files (`Node 0 MemTotal: 123 kB`).
fn meminfo_field_bytes(text: &str, key: &str) -> Result<u64, ParseError> {
    for line in text.lines() {
        let mut tokens = line.split_whitespace();
        let found = tokens.by_ref().any(|t| t.strip_suffix(':') == Some(key));
        if !found {
            continue;
        }
        let value = tokens
            .next()
            .ok_or_else(|| ParseError(format!("`{key}:` has no value")))?;
        let kib: u64 = value
            .parse()
            .map_err(|_| ParseError(format!("`{key}:` value `{value}` is not a number")))?;
        match tokens.next() {
            Some("kB") => {}
            other => {
                return Err(ParseError(format!(
                    "`{key}:` unit is {other:?}, expected \"kB\""
                )))
            }
        }
        return kib
            .checked_mul(1024)
            .ok_or_else(|| ParseError(format!("`{key}:` value {kib} kB overflows u64 bytes")));
    }
    Err(ParseError(format!("no `{key}:` line")))
}

/// `MemTotal` and `MemFree` of one NUMA node, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NodeMeminfo {
    /// `MemTotal` of the node, bytes.
    pub mem_total_bytes: u64,
    /// `MemFree` of the node, bytes.
    pub mem_free_bytes: u64,
}

/// Parses `/sys/devices/system/node/nodeN/meminfo`
/// (`Node 0 MemTotal:  5333572 kB` ...).
pub fn parse_node_meminfo(text: &str) -> Result<NodeMeminfo, ParseError> {
    Ok(NodeMeminfo {
        mem_total_bytes: meminfo_field_bytes(text, "MemTotal")?,
        mem_free_bytes: meminfo_field_bytes(text, "MemFree")?,
    })
}

/// Parses `MemTotal` from `/proc/meminfo`, in bytes.
pub fn parse_meminfo_total(text: &str) -> Result<u64, ParseError> {
    meminfo_field_bytes(text, "MemTotal")
}

/// Parses `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn parse_meminfo_available(text: &str) -> Result<u64, ParseError> {
    meminfo_field_bytes(text, "MemAvailable")
}

/// Memory a new allocation on `node` can still get without reclaiming
/// anonymous memory, in bytes: `MemAvailable` of the host when it has one
/// NUMA node, else the node's `MemFree` plus its inactive file pages.
pub fn available_bytes_on(node: u32) -> Result<u64, HostError> {
    let node_file = Path::new(SYSFS_NODE_DIR)
        .join(format!("node{node}"))
        .join("meminfo");
    let one_node = numa_nodes().map(|n| n.len() <= 1).unwrap_or(true);
    if one_node || !node_file.exists() {
        let path = Path::new(PROC_MEMINFO);
        let text = read_text(path)?;
        return parse_meminfo_available(&text).map_err(|e| e.at(path));
    }
    let text = read_text(&node_file)?;
    let free = meminfo_field_bytes(&text, "MemFree").map_err(|e| e.at(&node_file))?;
    let inactive_file = meminfo_field_bytes(&text, "Inactive(file)").unwrap_or(0);
    Ok(free.saturating_add(inactive_file))
}

/// Parses a kernel cpulist (`0-3,8,10-11`; empty for a CPU-less node) into
/// sorted CPU ids.
pub fn parse_cpulist(text: &str) -> Result<Vec<u32>, ParseError> {
    let text = text.trim();
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Ok(cpus);
    }
    let id = |s: &str| -> Result<u32, ParseError> {
        s.trim()
            .parse::<u32>()
            .map_err(|_| ParseError(format!("cpulist item `{s}` is not a CPU number")))
    };
    for item in text.split(',') {
        match item.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (id(lo)?, id(hi)?);
                if lo > hi {
                    return Err(ParseError(format!("cpulist range `{item}` is reversed")));
                }
                if hi - lo >= MAX_CPU_SPAN {
                    return Err(ParseError(format!(
                        "cpulist range `{item}` spans more than {MAX_CPU_SPAN} CPUs"
                    )));
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(id(item)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Parses a node `distance` file (`10 21`): distance to node 0, 1, ...
pub fn parse_distances(text: &str) -> Result<Vec<u32>, ParseError> {
    text.split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| ParseError(format!("distance `{t}` is not a number")))
        })
        .collect()
}

/// Transparent huge page mode (the bracketed value of
/// `/sys/kernel/mm/transparent_hugepage/enabled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThpMode {
    /// THP for every anonymous mapping.
    Always,
    /// THP only where `madvise(MADV_HUGEPAGE)` asks for it.
    Madvise,
    /// THP disabled.
    Never,
    /// A mode this code does not know (kept verbatim).
    Other(String),
}

impl ThpMode {
    /// The kernel's spelling of the mode.
    pub fn as_str(&self) -> &str {
        match self {
            ThpMode::Always => "always",
            ThpMode::Madvise => "madvise",
            ThpMode::Never => "never",
            ThpMode::Other(s) => s,
        }
    }
}

/// Parses `always [madvise] never` into the bracketed mode. Exactly one
/// bracketed word is required.
pub fn parse_thp_enabled(text: &str) -> Result<ThpMode, ParseError> {
    let mut selected = None;
    for word in text.split_whitespace() {
        if let Some(inner) = word.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| ParseError(format!("unterminated bracket in `{word}`")))?;
            if inner.is_empty() {
                return Err(ParseError("empty brackets".into()));
            }
            if selected.is_some() {
                return Err(ParseError(format!(
                    "more than one bracketed mode in `{}`",
                    text.trim()
                )));
            }
            selected = Some(inner);
        }
    }
    let mode = selected
        .ok_or_else(|| ParseError(format!("no bracketed (active) mode in `{}`", text.trim())))?;
    Ok(match mode {
        "always" => ThpMode::Always,
        "madvise" => ThpMode::Madvise,
        "never" => ThpMode::Never,
        other => ThpMode::Other(other.to_string()),
    })
}

fn parse_u64(text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    t.parse()
        .map_err(|_| ParseError(format!("`{t}` is not an unsigned number")))
}

// ---------------------------------------------------------------------------
// NUMA nodes
// ---------------------------------------------------------------------------

/// One NUMA node that holds memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// Node id (`N` of `nodeN`).
    pub id: u32,
    /// `MemTotal` of the node, bytes.
    pub mem_total_bytes: u64,
    /// `MemFree` of the node, bytes.
    pub mem_free_bytes: u64,
    /// CPUs on the node (from `cpulist`), sorted.
    pub cpus: Vec<u32>,
    /// True when the node has memory but no CPUs: the usual shape of a CXL
    /// memory expander or another slow tier.
    pub cpu_less: bool,
    /// SLIT distances from this node to node 0, 1, ... (empty if unreadable).
    pub distances: Vec<u32>,
}

/// Reads every `nodeN` under `node_dir` and returns the nodes with memory
/// (`MemTotal` > 0), sorted by id. Fails if none has memory.
pub fn numa_nodes_in(node_dir: &Path) -> Result<Vec<NumaNode>, HostError> {
    let entries = fs::read_dir(node_dir).map_err(|source| HostError::Read {
        path: node_dir.to_path_buf(),
        source,
    })?;
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| HostError::Read {
            path: node_dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue; // has_memory, online, possible, power, ...
        };
        let dir = entry.path();
        let meminfo_path = dir.join("meminfo");
        let meminfo =
            parse_node_meminfo(&read_text(&meminfo_path)?).map_err(|e| e.at(&meminfo_path))?;
        if meminfo.mem_total_bytes == 0 {
            continue;
        }
        let cpulist_path = dir.join("cpulist");
        let cpus = parse_cpulist(&read_text(&cpulist_path)?).map_err(|e| e.at(&cpulist_path))?;
        let distance_path = dir.join("distance");
        let distances = match fs::read_to_string(&distance_path) {
            Ok(text) => parse_distances(&text).map_err(|e| e.at(&distance_path))?,
            Err(_) => Vec::new(),
        };
        nodes.push(NumaNode {
            id,
            mem_total_bytes: meminfo.mem_total_bytes,
            mem_free_bytes: meminfo.mem_free_bytes,
            cpu_less: cpus.is_empty(),
            cpus,
            distances,
        });
    }
    if nodes.is_empty() {
        return Err(HostError::NoMemoryNodes(node_dir.to_path_buf()));
    }
    nodes.sort_by_key(|n| n.id);
    Ok(nodes)
}

/// The host's NUMA nodes that hold memory, sorted by id.
pub fn numa_nodes() -> Result<Vec<NumaNode>, HostError> {
    numa_nodes_in(Path::new(SYSFS_NODE_DIR))
}

/// Default host nodes for the fast and slow tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TierNodes {
    /// Node backing the fast tier: node 0 if it has memory, else the
    /// lowest-numbered node with memory.
    pub fast: u32,
    /// Node backing the slow tier, `None` on a one-node host (tiers are then
    /// emulated on the fast node: capacities enforced, latency not real).
    pub slow: Option<u32>,
}

impl TierNodes {
    /// True when fast and slow tiers sit on different host nodes.
    pub fn real_tiers(&self) -> bool {
        self.slow.is_some()
    }
}

/// Picks default tier nodes from [`numa_nodes`]: fast = node 0 (or the first
/// node with memory); slow = the first CPU-less node with memory (a likely
/// CXL tier) if there is one, else the next node with memory after the fast
/// one. Returns `None` for an empty list.
pub fn default_tier_nodes(nodes: &[NumaNode]) -> Option<TierNodes> {
    let fast = nodes
        .iter()
        .find(|n| n.id == 0)
        .or_else(|| nodes.iter().min_by_key(|n| n.id))?
        .id;
    let others = || nodes.iter().filter(move |n| n.id != fast);
    let slow = others()
        .filter(|n| n.cpu_less)
        .min_by_key(|n| n.id)
        .or_else(|| others().filter(|n| n.id > fast).min_by_key(|n| n.id))
        .or_else(|| others().min_by_key(|n| n.id))
        .map(|n| n.id);
    Some(TierNodes { fast, slow })
}

// ---------------------------------------------------------------------------
// Scalar facts
// ---------------------------------------------------------------------------

/// Host memory in bytes (`MemTotal` of `/proc/meminfo`). The run command
/// rejects a guest `--mem` above this.
pub fn host_memory_bytes() -> Result<u64, HostError> {
    let path = Path::new(PROC_MEMINFO);
    parse_meminfo_total(&read_text(path)?).map_err(|e| e.at(path))
}

/// The host page size in bytes.
pub fn page_size_bytes() -> u64 {
    crate::sys::page_size()
}

/// The active transparent huge page mode.
pub fn thp_mode() -> Result<ThpMode, HostError> {
    let path = Path::new(THP_ENABLED);
    parse_thp_enabled(&read_text(path)?).map_err(|e| e.at(path))
}

/// `vm.max_map_count`.
pub fn max_map_count() -> Result<u64, HostError> {
    read_u64(Path::new(MAX_MAP_COUNT))
}

fn read_u64(path: &Path) -> Result<u64, HostError> {
    parse_u64(&read_text(path)?).map_err(|e| e.at(path))
}

// ---------------------------------------------------------------------------
// Device / syscall access
// ---------------------------------------------------------------------------

/// How an attempt to open a device or use a syscall went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Availability {
    /// It worked.
    Ok,
    /// The device node or syscall does not exist (`ENOENT`, `ENODEV`, `ENOSYS`).
    Absent,
    /// It exists but this process may not use it (`EACCES`, `EPERM`).
    PermissionDenied,
    /// Any other failure.
    Failed {
        /// The error as the OS describes it.
        message: String,
    },
}

impl Availability {
    /// Classifies an OS error.
    pub fn from_io_error(err: &io::Error) -> Availability {
        match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) | Some(libc::ENOSYS) => {
                Availability::Absent
            }
            Some(libc::EACCES) | Some(libc::EPERM) => Availability::PermissionDenied,
            _ => Availability::Failed {
                message: err.to_string(),
            },
        }
    }

    /// True for [`Availability::Ok`].
    pub fn is_ok(&self) -> bool {
        matches!(self, Availability::Ok)
    }

    /// Short human description.
    pub fn describe(&self) -> String {
        match self {
            Availability::Ok => "ok".into(),
            Availability::Absent => "absent".into(),
            Availability::PermissionDenied => "permission denied".into(),
            Availability::Failed { message } => format!("failed: {message}"),
        }
    }
}

// ---------------------------------------------------------------------------
// userfaultfd
// ---------------------------------------------------------------------------

/// Names of the `UFFD_FEATURE_*` bits, index = bit number (uapi
/// `linux/userfaultfd.h` as of Linux 6.8+).
pub const UFFD_FEATURE_NAMES: [&str; 17] = [
    "PAGEFAULT_FLAG_WP",
    "EVENT_FORK",
    "EVENT_REMAP",
    "EVENT_REMOVE",
    "MISSING_HUGETLBFS",
    "MISSING_SHMEM",
    "EVENT_UNMAP",
    "SIGBUS",
    "THREAD_ID",
    "MINOR_HUGETLBFS",
    "MINOR_SHMEM",
    "EXACT_ADDRESS",
    "WP_HUGETLBFS_SHMEM",
    "WP_UNPOPULATED",
    "POISON",
    "WP_ASYNC",
    "MOVE",
];

/// `UFFD_FEATURE_MINOR_SHMEM` (bit 10).
pub const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
/// `UFFD_FEATURE_WP_UNPOPULATED` (bit 13).
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
/// `UFFD_FEATURE_WP_ASYNC` (bit 15).
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// `UFFD_FEATURE_MOVE` (bit 16): `UFFDIO_MOVE`, Linux 6.8+.
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;

/// The userfaultfd feature bits tiervm cares about, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UffdFeatures {
    /// The raw `features` word returned by `UFFDIO_API`.
    pub raw: u64,
    /// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` exists (zero-copy page moves;
    /// basis of transactional migration and hint-fault sampling).
    pub moves: bool,
    /// `UFFD_FEATURE_WP_ASYNC`: asynchronous write-protect (kernel resolves
    /// the fault, dirty state is read with `PAGEMAP_SCAN`).
    pub wp_async: bool,
    /// `UFFD_FEATURE_WP_UNPOPULATED`: write-protect also covers unpopulated PTEs.
    pub wp_unpopulated: bool,
    /// `UFFD_FEATURE_MINOR_SHMEM`: minor faults on shmem (for shared-memory backing).
    pub minor_shmem: bool,
    /// Names of every known bit that is set, in bit order.
    pub names: Vec<&'static str>,
    /// Set bits this code has no name for (newer kernels).
    pub unknown_bits: u64,
}

impl UffdFeatures {
    /// Decodes a `features` word.
    pub fn from_bits(raw: u64) -> UffdFeatures {
        let names = UFFD_FEATURE_NAMES
            .iter()
            .enumerate()
            .filter(|(bit, _)| raw & (1u64 << bit) != 0)
            .map(|(_, name)| *name)
            .collect();
        let known_mask = (1u64 << UFFD_FEATURE_NAMES.len()) - 1;
        UffdFeatures {
            raw,
            moves: raw & UFFD_FEATURE_MOVE != 0,
            wp_async: raw & UFFD_FEATURE_WP_ASYNC != 0,
            wp_unpopulated: raw & UFFD_FEATURE_WP_UNPOPULATED != 0,
            minor_shmem: raw & UFFD_FEATURE_MINOR_SHMEM != 0,
            names,
            unknown_bits: raw & !known_mask,
        }
    }
}

/// The answer of `UFFDIO_API`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UffdApiAnswer {
    /// Which path produced the userfaultfd that was asked: `"/dev/userfaultfd"`
    /// or `"syscall"`.
    pub via: &'static str,
    /// Decoded feature bits.
    pub features: UffdFeatures,
    /// Raw `ioctls` word (bit n = ioctl number n is available on the fd).
    pub ioctls_raw: u64,
}

/// What userfaultfd offers on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserfaultfdFacts {
    /// Opening `/dev/userfaultfd` and `USERFAULTFD_IOC_NEW`.
    pub dev_userfaultfd: Availability,
    /// The `userfaultfd(2)` system call (kernel-mode faults included, which
    /// KVM's guest-memory accesses need).
    pub syscall: Availability,
    /// `vm.unprivileged_userfaultfd` (0: the syscall needs `CAP_SYS_PTRACE`);
    /// `None` if unreadable.
    pub unprivileged_userfaultfd: Option<u64>,
    /// `UFFDIO_API` result from the first path that produced an fd.
    pub api: Option<UffdApiAnswer>,
    /// Why `api` is missing, if it is.
    pub api_error: Option<String>,
}

impl UserfaultfdFacts {
    /// True when some path produced a userfaultfd that answered `UFFDIO_API`.
    pub fn usable(&self) -> bool {
        self.api.is_some()
    }

    /// True when `UFFDIO_MOVE` is offered.
    pub fn has_move(&self) -> bool {
        self.api.as_ref().is_some_and(|a| a.features.moves)
    }
}

/// Explains why neither path produced a userfaultfd, with the fix.
fn no_userfaultfd_reason(dev: &Availability, syscall: &Availability) -> String {
    let both = format!(
        "no userfaultfd (/dev/userfaultfd: {}, syscall: {})",
        dev.describe(),
        syscall.describe()
    );
    if *dev == Availability::PermissionDenied || *syscall == Availability::PermissionDenied {
        format!(
            "{both}: run as root, give this user read-write access to {DEV_USERFAULTFD}, \
             or set vm.unprivileged_userfaultfd=1"
        )
    } else if *dev == Availability::Absent && *syscall == Availability::Absent {
        format!(
            "{both}: kernel built without CONFIG_USERFAULTFD (needs Linux >= 6.8 for UFFDIO_MOVE)"
        )
    } else {
        both
    }
}

/// Probes userfaultfd: tries `/dev/userfaultfd` and the syscall, and asks
/// `UFFDIO_API` on the first fd obtained. All fds are closed on return.
pub fn userfaultfd() -> UserfaultfdFacts {
    let dev = crate::sys::userfaultfd_from_device();
    let syscall = crate::sys::userfaultfd_syscall();
    let dev_userfaultfd = match &dev {
        Ok(_) => Availability::Ok,
        Err(e) => Availability::from_io_error(e),
    };
    let syscall_access = match &syscall {
        Ok(_) => Availability::Ok,
        Err(e) => Availability::from_io_error(e),
    };
    let source = match (dev, syscall) {
        (Ok(fd), _) => Some((DEV_USERFAULTFD, fd)),
        (Err(_), Ok(fd)) => Some(("syscall", fd)),
        (Err(_), Err(_)) => None,
    };
    let (api, api_error) = match source {
        None => (
            None,
            Some(no_userfaultfd_reason(&dev_userfaultfd, &syscall_access)),
        ),
        Some((via, fd)) => match crate::sys::uffdio_api(&fd, 0) {
            Ok(raw) => (
                Some(UffdApiAnswer {
                    via,
                    features: UffdFeatures::from_bits(raw.features),
                    ioctls_raw: raw.ioctls,
                }),
                None,
            ),
            Err(e) => (
                None,
                Some(format!("UFFDIO_API on the {via} fd failed: {e}")),
            ),
        },
    };
    UserfaultfdFacts {
        dev_userfaultfd,
        syscall: syscall_access,
        unprivileged_userfaultfd: read_u64(Path::new(UNPRIVILEGED_USERFAULTFD)).ok(),
        api,
        api_error,
    }
}

// ---------------------------------------------------------------------------
// Idle page tracking
// ---------------------------------------------------------------------------

/// Whether the idle page tracking bitmap can be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum IdlePageTracking {
    /// `/sys/kernel/mm/page_idle/bitmap` exists and opens for reading.
    Readable,
    /// It exists but cannot be opened for reading.
    NotReadable {
        /// The OS error.
        reason: String,
    },
    /// No bitmap: kernel built without `CONFIG_IDLE_PAGE_TRACKING`.
    Absent,
}

impl IdlePageTracking {
    /// Short human description.
    pub fn describe(&self) -> String {
        match self {
            IdlePageTracking::Readable => format!("{PAGE_IDLE_BITMAP} readable"),
            IdlePageTracking::NotReadable { reason } => {
                format!("{PAGE_IDLE_BITMAP} present but not readable ({reason}); needs root")
            }
            IdlePageTracking::Absent => {
                "absent: kernel built without CONFIG_IDLE_PAGE_TRACKING".into()
            }
        }
    }
}

/// Checks the idle page bitmap by opening it read-only (it is not read:
/// reading it has side effects on accessed bits).
pub fn idle_page_tracking() -> IdlePageTracking {
    match fs::File::open(PAGE_IDLE_BITMAP) {
        Ok(_) => IdlePageTracking::Readable,
        Err(e) if e.kind() == io::ErrorKind::NotFound => IdlePageTracking::Absent,
        Err(e) => IdlePageTracking::NotReadable {
            reason: e.to_string(),
        },
    }
}

// ---------------------------------------------------------------------------
// Everything at once
// ---------------------------------------------------------------------------

/// All host memory facts. Fields that could not be probed are `None` and
/// the reason is in `problems`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostFacts {
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel_release: Option<String>,
    /// Page size in bytes.
    pub page_size_bytes: u64,
    /// `MemTotal` of `/proc/meminfo`, bytes.
    pub mem_total_bytes: Option<u64>,
    /// NUMA nodes with memory, sorted by id.
    pub numa_nodes: Option<Vec<NumaNode>>,
    /// Sum of the nodes' `MemTotal`, bytes. Can be below `mem_total_bytes`
    /// on kernels whose per-node counters cover only part of RAM.
    pub numa_mem_total_bytes: Option<u64>,
    /// Default fast/slow tier nodes.
    pub tier_nodes: Option<TierNodes>,
    /// Transparent huge page mode.
    pub thp: Option<ThpMode>,
    /// `vm.max_map_count`.
    pub max_map_count: Option<u64>,
    /// `kernel.numa_balancing` (0 off; non-zero: the kernel migrates pages
    /// itself); `None` when the file is absent (kernel without NUMA balancing).
    pub numa_balancing: Option<u64>,
    /// `/sys/kernel/mm/numa/demotion_enabled`: reclaim moves cold pages to
    /// a slower node itself; `None` when the file is absent.
    pub demotion_enabled: Option<bool>,
    /// userfaultfd availability and features.
    pub userfaultfd: UserfaultfdFacts,
    /// Idle page tracking availability.
    pub idle_page_tracking: IdlePageTracking,
    /// DAMON's sysfs interface (read only; `--tracking damon`).
    pub damon: DamonFacts,
    /// One line per fact that could not be probed.
    pub problems: Vec<String>,
}

fn keep<T>(problems: &mut Vec<String>, result: Result<T, HostError>) -> Option<T> {
    result.map_err(|e| problems.push(e.to_string())).ok()
}

/// Probes every host memory fact. Never fails: what could not be read is
/// reported in [`HostFacts::problems`].
pub fn probe() -> HostFacts {
    let mut problems = Vec::new();
    let mem_total_bytes = keep(&mut problems, host_memory_bytes());
    let numa_nodes = keep(&mut problems, numa_nodes());
    let thp = keep(&mut problems, thp_mode());
    let max_map_count = keep(&mut problems, max_map_count());
    let numa_mem_total_bytes = numa_nodes
        .as_ref()
        .map(|nodes| nodes.iter().map(|n| n.mem_total_bytes).sum());
    let tier_nodes = numa_nodes.as_deref().and_then(default_tier_nodes);
    HostFacts {
        kernel_release: fs::read_to_string(OSRELEASE)
            .ok()
            .map(|s| s.trim().to_string()),
        page_size_bytes: page_size_bytes(),
        mem_total_bytes,
        numa_nodes,
        numa_mem_total_bytes,
        tier_nodes,
        thp,
        max_map_count,
        numa_balancing: read_u64(Path::new(NUMA_BALANCING)).ok(),
        demotion_enabled: demotion_enabled(),
        userfaultfd: userfaultfd(),
        idle_page_tracking: idle_page_tracking(),
        damon: DamonFacts {
            sysfs: crate::tracking::damon::probe(Path::new(crate::tracking::damon::SYSFS_ROOT)),
            opted_in: crate::tracking::damon::allowed_by_env(),
        },
        problems,
    }
}

/// DAMON as `--tracking damon` would find it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DamonFacts {
    /// The sysfs interface's state (`status`: absent, in_use, idle, unreadable).
    pub sysfs: crate::tracking::damon::DamonStatus,
    /// Whether `TIERVM_ALLOW_DAMON_WRITES=1` is set (the opt-in to write it).
    pub opted_in: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_MEMINFO: &str = "Node 0 MemTotal:        5333572 kB\n\
        Node 0 MemFree:         3504520 kB\n\
        Node 0 MemUsed:         1829052 kB\n";

    #[test]
    fn node_meminfo_parses_total_and_free() {
        let m = parse_node_meminfo(NODE_MEMINFO).unwrap();
        assert_eq!(m.mem_total_bytes, 5_333_572 * 1024);
        assert_eq!(m.mem_free_bytes, 3_504_520 * 1024);
    }

    #[test]
    fn proc_meminfo_total() {
        let text = "MemTotal:       24682416 kB\nMemFree:        22694840 kB\n";
        assert_eq!(parse_meminfo_total(text).unwrap(), 24_682_416 * 1024);
        // MemFree must not be mistaken for MemTotal when MemTotal comes later.
        let text = "MemFree: 1 kB\nMemTotal: 2 kB\n";
        assert_eq!(parse_meminfo_total(text).unwrap(), 2048);
    }

    #[test]
    fn meminfo_malformed_is_an_error() {
        let cases = [
            ("", "no `MemTotal:` line"),
            ("MemTotal:\n", "has no value"),
            ("MemTotal: lots kB\n", "not a number"),
            ("MemTotal: 12 MB\n", "unit"),
            ("MemTotal: 18446744073709551615 kB\n", "overflows"),
            ("Node 0 MemTotal: 5 kB\n", "no `MemFree:` line"),
        ];
        for (text, want) in cases {
            let err = parse_node_meminfo(text).unwrap_err();
            assert!(err.0.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn thp_bracket() {
        assert_eq!(
            parse_thp_enabled("always [madvise] never\n").unwrap(),
            ThpMode::Madvise
        );
        assert_eq!(
            parse_thp_enabled("[always] madvise never").unwrap(),
            ThpMode::Always
        );
        assert_eq!(
            parse_thp_enabled("always madvise [never]").unwrap(),
            ThpMode::Never
        );
        assert_eq!(
            parse_thp_enabled("always [inherit] never").unwrap(),
            ThpMode::Other("inherit".into())
        );
    }

    #[test]
    fn thp_malformed_is_an_error() {
        for (text, want) in [
            ("always madvise never", "no bracketed"),
            ("", "no bracketed"),
            ("[always] [never]", "more than one"),
            ("always [madvise never", "unterminated"),
            ("[] never", "empty"),
        ] {
            let err = parse_thp_enabled(text).unwrap_err();
            assert!(err.0.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn cpulist_forms() {
        assert_eq!(parse_cpulist("0-1\n").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpulist("0,2-4,7").unwrap(), vec![0, 2, 3, 4, 7]);
        assert_eq!(parse_cpulist("5").unwrap(), vec![5]);
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpulist("").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn cpulist_malformed_is_an_error() {
        for (text, want) in [
            ("3-1", "reversed"),
            ("a", "not a CPU number"),
            ("0-", "not a CPU number"),
            ("0,,1", "not a CPU number"),
            ("-1", "not a CPU number"),
            ("0-4294967295", "spans more than"),
        ] {
            let err = parse_cpulist(text).unwrap_err();
            assert!(err.0.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn feature_bits_decode() {
        let f = UffdFeatures::from_bits(0x1ffff);
        assert!(f.moves && f.wp_async && f.wp_unpopulated && f.minor_shmem);
        assert_eq!(f.names.len(), 17);
        assert_eq!(f.names.last(), Some(&"MOVE"));
        assert_eq!(f.unknown_bits, 0);

        // A 6.6-era kernel: everything up to WP_ASYNC, no MOVE.
        let f = UffdFeatures::from_bits(0xffff);
        assert!(!f.moves);
        assert!(f.wp_async);
        assert!(!f.names.contains(&"MOVE"));

        let f = UffdFeatures::from_bits(UFFD_FEATURE_MOVE | (1 << 17) | (1 << 40));
        assert!(f.moves && !f.wp_async && !f.minor_shmem);
        assert_eq!(f.names, vec!["MOVE"]);
        assert_eq!(f.unknown_bits, (1 << 17) | (1 << 40));

        let f = UffdFeatures::from_bits(UFFD_FEATURE_MINOR_SHMEM);
        assert_eq!(f.names, vec!["MINOR_SHMEM"]);
        assert!(f.minor_shmem && !f.moves);
    }

    #[test]
    fn no_userfaultfd_reason_names_the_fix() {
        let denied = no_userfaultfd_reason(
            &Availability::PermissionDenied,
            &Availability::PermissionDenied,
        );
        assert!(denied.contains("unprivileged_userfaultfd=1"), "{denied}");
        let absent = no_userfaultfd_reason(&Availability::Absent, &Availability::Absent);
        assert!(absent.contains("CONFIG_USERFAULTFD"), "{absent}");
        let err = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(
            Availability::from_io_error(&err),
            Availability::PermissionDenied
        );
        let err = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(Availability::from_io_error(&err), Availability::Absent);
        let err = io::Error::from_raw_os_error(libc::EMFILE);
        assert!(matches!(
            Availability::from_io_error(&err),
            Availability::Failed { .. }
        ));
    }

    fn node(id: u32, cpus: &[u32]) -> NumaNode {
        NumaNode {
            id,
            mem_total_bytes: 1 << 30,
            mem_free_bytes: 1 << 29,
            cpus: cpus.to_vec(),
            cpu_less: cpus.is_empty(),
            distances: Vec::new(),
        }
    }

    #[test]
    fn tier_node_choice() {
        assert_eq!(default_tier_nodes(&[]), None);
        let one = default_tier_nodes(&[node(0, &[0, 1])]).unwrap();
        assert_eq!(
            one,
            TierNodes {
                fast: 0,
                slow: None
            }
        );
        assert!(!one.real_tiers());
        // Two sockets: slow is the other socket.
        let two = default_tier_nodes(&[node(0, &[0]), node(1, &[1])]).unwrap();
        assert_eq!(
            two,
            TierNodes {
                fast: 0,
                slow: Some(1)
            }
        );
        // Two sockets plus a CPU-less CXL node: slow is the CXL node.
        let cxl = default_tier_nodes(&[node(0, &[0]), node(1, &[1]), node(2, &[])]).unwrap();
        assert_eq!(
            cxl,
            TierNodes {
                fast: 0,
                slow: Some(2)
            }
        );
        // Node 0 without memory (not listed): fast is the first memory node.
        let no0 = default_tier_nodes(&[node(1, &[0]), node(3, &[])]).unwrap();
        assert_eq!(
            no0,
            TierNodes {
                fast: 1,
                slow: Some(3)
            }
        );
    }

    /// A throwaway directory for fake sysfs trees, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "tiervm-host-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
        fn node(&self, id: u32, meminfo: &str, cpulist: &str) {
            let d = self.0.join(format!("node{id}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("meminfo"), meminfo).unwrap();
            fs::write(d.join("cpulist"), cpulist).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn fake_sysfs_tree() {
        let t = TempDir::new("nodes");
        fs::write(t.0.join("has_memory"), "0,2\n").unwrap();
        t.node(0, NODE_MEMINFO, "0-1\n");
        t.node(1, "Node 1 MemTotal: 0 kB\nNode 1 MemFree: 0 kB\n", "\n");
        t.node(
            2,
            "Node 2 MemTotal: 1048576 kB\nNode 2 MemFree: 1000 kB\n",
            "\n",
        );
        fs::write(t.0.join("node2/distance"), "20 30 10\n").unwrap();
        let nodes = numa_nodes_in(&t.0).unwrap();
        assert_eq!(nodes.len(), 2, "memoryless node1 must be skipped");
        assert_eq!(nodes[0].id, 0);
        assert_eq!(nodes[0].cpus, vec![0, 1]);
        assert!(!nodes[0].cpu_less);
        assert_eq!(nodes[1].id, 2);
        assert!(nodes[1].cpu_less);
        assert_eq!(nodes[1].mem_total_bytes, 1 << 30);
        assert_eq!(nodes[1].distances, vec![20, 30, 10]);
        assert_eq!(
            default_tier_nodes(&nodes),
            Some(TierNodes {
                fast: 0,
                slow: Some(2)
            })
        );
    }

    #[test]
    fn fake_sysfs_malformed_names_the_file() {
        let t = TempDir::new("bad");
        t.node(0, "Node 0 MemTotal: x kB\n", "0\n");
        let err = numa_nodes_in(&t.0).unwrap_err().to_string();
        assert!(
            err.contains("node0/meminfo") && err.contains("not a number"),
            "{err}"
        );

        let t = TempDir::new("nomem");
        t.node(0, "Node 0 MemTotal: 0 kB\nNode 0 MemFree: 0 kB\n", "0\n");
        assert!(matches!(
            numa_nodes_in(&t.0),
            Err(HostError::NoMemoryNodes(_))
        ));

        let missing = numa_nodes_in(Path::new("/nonexistent/tiervm/node")).unwrap_err();
        assert!(matches!(missing, HostError::Read { .. }), "{missing}");
    }

    #[test]
    fn this_host_has_a_memory_node() {
        let nodes = numa_nodes().expect("NUMA nodes readable on this host");
        assert!(!nodes.is_empty());
        assert!(nodes.iter().all(|n| n.mem_total_bytes > 0));
        let total = host_memory_bytes().unwrap();
        assert!(total > 0);
        let tiers = default_tier_nodes(&nodes).unwrap();
        assert_eq!(tiers.fast, nodes[0].id);
        assert!(page_size_bytes().is_power_of_two());
    }

    #[test]
    fn this_host_userfaultfd_api() {
        let facts = userfaultfd();
        if !Path::new(DEV_USERFAULTFD).exists() && !facts.syscall.is_ok() {
            eprintln!("skip: no userfaultfd on this host ({facts:?})");
            return;
        }
        if !facts.usable() {
            eprintln!("skip: userfaultfd not usable by this user: {facts:?}");
            return;
        }
        let api = facts.api.as_ref().unwrap();
        // Every kernel with UFFDIO_API reports the three API ioctls
        // (REGISTER=0, UNREGISTER=1, API=0x3F).
        assert_eq!(api.ioctls_raw & 0b11, 0b11, "{api:?}");
        assert_ne!(api.ioctls_raw & (1 << 0x3F), 0, "{api:?}");
        // MOVE is decoded from the real answer; Linux >= 6.8 must offer it.
        let release = fs::read_to_string(OSRELEASE).unwrap_or_default();
        let mut parts = release.trim().split(['.', '-']);
        let major: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let minor: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if (major, minor) >= (6, 8) {
            assert!(
                facts.has_move(),
                "Linux {release} without UFFD_FEATURE_MOVE: {api:?}"
            );
        }
        eprintln!("uffd via {}: features {:#x}", api.via, api.features.raw);
    }

    #[test]
    fn probe_reports_this_host_consistently() {
        let facts = probe();
        assert!(facts.problems.is_empty(), "{:?}", facts.problems);
        let nodes = facts.numa_nodes.as_ref().unwrap();
        assert_eq!(
            facts.numa_mem_total_bytes,
            Some(nodes.iter().map(|n| n.mem_total_bytes).sum())
        );
        assert_eq!(facts.tier_nodes, default_tier_nodes(nodes));
        let value = serde_json::to_value(&facts).unwrap();
        assert_eq!(
            value["numa_nodes"][0]["id"].as_u64(),
            Some(u64::from(nodes[0].id))
        );
        assert_eq!(value["mem_total_bytes"].as_u64(), facts.mem_total_bytes);
        assert_eq!(
            value["userfaultfd"]["api"]["features"]["moves"].as_bool(),
            facts.userfaultfd.api.as_ref().map(|a| a.features.moves)
        );
        assert!(value["idle_page_tracking"]["status"].is_string());
    }
}

#[cfg(test)]
mod kernel_tiering_tests {
    use super::kernel_tiering_note;

    #[test]
    fn the_note_names_what_is_on() {
        assert_eq!(kernel_tiering_note(Some(0), Some(false)), None);
        assert_eq!(kernel_tiering_note(None, None), None);
        let n = kernel_tiering_note(Some(2), Some(true)).unwrap();
        assert!(
            n.contains("memory-tiering mode") && n.contains("demotion"),
            "{n}"
        );
    }
}
