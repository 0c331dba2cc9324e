//! `tiervm serve` settings: a TOML file and flags (flags win), validated
//! against the host (pools must fit their NUMA nodes).
//!
//! ```toml
//! socket = "/run/tiervm/api.sock"
//! state_dir = "/var/lib/tiervm"
//! socket_group = "tiervm"          # optional: the socket's group
//! socket_mode = "0660"             # optional: default 0600
//! image_dir = "/var/lib/tiervm/images"  # image files clients may name (optional)
//! metrics_listen = "127.0.0.1:9464"   # GET /metrics over TCP too (optional)
//! fast_node = 0
//! slow_node = 1
//! fast_pool = "8G"
//! slow_pool = "64G"
//!
//! [defaults]          # for POST /v1/vms fields left out
//! mem = "1G"
//! vcpus = 1
//! policy = "nomad"
//! fast_min = "0"
//! fast_max = "1G"     # or left out: the VM's mem
//! weight = 1.0
//! tracking = "hint-faults"
//! stop_grace = "10s"
//!
//! [division]
//! period = "5s"
//! quantum = "64M"
//! hysteresis = 0.2
//! significance = 2.0      # standard errors an exchange must gain by
//! min_share = 0.002
//! max_move_rate = "256M"   # bytes per second moved by rebalancing
//! dwell = "10s"
//! value = "host-accesses" # or "guest-ops": the guest's own ops/s (trusted guests only)
//!
//! [limits]
//! max_vms = 64
//! max_body = "64K"
//! request_timeout = "10s"
//! unresponsive_after = "5s"  # a VM process silent this long shows `unresponsive`
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::division::Valuation;
use super::placement_policy::check_policy;
use vmm_core::units::{format_size, parse_duration, parse_size};

/// Sizes are multiples of this (the guest's large page).
pub const SIZE_ALIGN: u64 = tiervm_guest::abi::GUEST_LARGE_PAGE;

/// A size in a TOML file: `"8G"` or a number of bytes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum SizeValue {
    /// Bytes.
    Bytes(u64),
    /// With a suffix.
    Text(String),
}

impl SizeValue {
    fn bytes(&self, key: &str) -> Result<u64, ServeConfigError> {
        match self {
            Self::Bytes(b) => Ok(*b),
            Self::Text(s) => parse_size(s).map_err(|_| ServeConfigError::BadValue {
                key: key.into(),
                value: s.clone(),
                expected: "a size such as 512M or 8G",
            }),
        }
    }
}

/// The TOML file (every key optional).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    /// API socket path.
    pub socket: Option<PathBuf>,
    /// Where reports and VM logs go.
    pub state_dir: Option<PathBuf>,
    /// Group of the API socket (a name or number): its members may
    /// connect when `socket_mode` lets the group in.
    pub socket_group: Option<String>,
    /// Mode of the API socket, octal text such as "0660" (default 0600).
    pub socket_mode: Option<String>,
    /// The directory of image files clients may name (by file name); without
    /// it the service runs built-in images only.
    pub image_dir: Option<PathBuf>,
    /// A TCP address that serves `GET /metrics` only (Prometheus cannot
    /// scrape a Unix socket), e.g. "127.0.0.1:9464".
    pub metrics_listen: Option<String>,
    /// Host node of the fast tier.
    pub fast_node: Option<u32>,
    /// Host node of the slow tier.
    pub slow_node: Option<u32>,
    /// Fast capacity the service may hand out.
    pub fast_pool: Option<SizeValue>,
    /// Slow capacity the service may hand out.
    pub slow_pool: Option<SizeValue>,
    /// Defaults of new VMs.
    #[serde(default)]
    pub defaults: DefaultsFile,
    /// The fast-tier division.
    #[serde(default)]
    pub division: DivisionFile,
    /// API limits.
    #[serde(default)]
    pub limits: LimitsFile,
}

/// `[defaults]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DefaultsFile {
    /// Guest RAM.
    pub mem: Option<SizeValue>,
    /// vCPUs.
    pub vcpus: Option<u32>,
    /// Placement policy.
    pub policy: Option<String>,
    /// Guaranteed fast bytes.
    pub fast_min: Option<SizeValue>,
    /// Most fast bytes (default: the VM's mem).
    pub fast_max: Option<SizeValue>,
    /// Weight.
    pub weight: Option<f64>,
    /// Access tracking.
    pub tracking: Option<String>,
    /// Stop grace.
    pub stop_grace: Option<String>,
}

/// `[division]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DivisionFile {
    /// Time between rebalancing rounds.
    pub period: Option<String>,
    /// Step of the division.
    pub quantum: Option<SizeValue>,
    /// Exchange threshold.
    pub hysteresis: Option<f64>,
    /// Standard errors an exchange's gain must exceed its loss by.
    pub significance: Option<f64>,
    /// Smallest worthwhile share.
    pub min_share: Option<f64>,
    /// Bytes per second rebalancing may move.
    pub max_move_rate: Option<SizeValue>,
    /// Time a resized VM is left alone.
    pub dwell: Option<String>,
    /// What a quantum is valued by: `host-accesses` or `guest-ops`.
    pub value: Option<String>,
}

/// `[limits]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// Most VMs at once.
    pub max_vms: Option<usize>,
    /// Largest request body.
    pub max_body: Option<SizeValue>,
    /// Longest request.
    pub request_timeout: Option<String>,
    /// Silence of a VM's process after which it shows `unresponsive`.
    pub unresponsive_after: Option<String>,
}

/// Defaults of new VMs, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct VmDefaults {
    /// Guest RAM, bytes.
    pub mem: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Placement policy.
    pub policy: String,
    /// Guaranteed fast bytes.
    pub fast_min: u64,
    /// Most fast bytes (`None`: the VM's mem).
    pub fast_max: Option<u64>,
    /// Weight.
    pub weight: f64,
    /// Access tracking.
    pub tracking: String,
    /// Stop grace.
    pub stop_grace: Duration,
}

/// The validated settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeConfig {
    /// API socket path.
    pub socket: PathBuf,
    /// Where reports and VM logs go.
    pub state_dir: PathBuf,
    /// Group of the API socket.
    pub socket_group: Option<String>,
    /// Mode of the API socket.
    pub socket_mode: u32,
    /// The directory of image files clients may name; `None`: built-in
    /// images only.
    pub image_dir: Option<PathBuf>,
    /// TCP address serving `GET /metrics` only.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Host node of the fast tier.
    pub fast_node: u32,
    /// Host node of the slow tier.
    pub slow_node: u32,
    /// Fast capacity the service may hand out, bytes.
    pub fast_pool: u64,
    /// Slow capacity the service may hand out, bytes.
    pub slow_pool: u64,
    /// Whether both tiers are one node (latencies emulated).
    pub emulated: bool,
    /// Defaults of new VMs.
    pub defaults: VmDefaults,
    /// The division's parameters.
    pub division: super::division::Params,
    /// Time between rebalancing rounds.
    pub period: Duration,
    /// Most VMs at once.
    pub max_vms: usize,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Longest request.
    pub request_timeout: Duration,
    /// Silence of a VM's process after which it shows `unresponsive`.
    pub unresponsive_after: Duration,
    /// The `tiervm` executable workers run.
    pub worker_exe: PathBuf,
}

/// A setting that cannot be used; each message names the fix.
#[derive(Debug, thiserror::Error)]
pub enum ServeConfigError {
    /// The file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{path}: {message}: see docs/service.md for the keys")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A value that does not parse.
    #[error("{key} = '{value}': give {expected}")]
    BadValue {
        /// The key or flag.
        key: String,
        /// The value.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// A pool is not given.
    #[error("{0} is not set: give --{0} SIZE or `{0} = \"SIZE\"` in the config file")]
    MissingPool(&'static str),
    /// A size not a multiple of 2 MiB.
    #[error("{key} {} is not a multiple of 2M", format_size(*.size))]
    NotAligned {
        /// The key.
        key: String,
        /// The size.
        size: u64,
    },
    /// A node the host does not have.
    #[error("{key} {node}: this host has NUMA nodes with memory {nodes} (see tiervm info)")]
    NoSuchNode {
        /// The key.
        key: &'static str,
        /// The node.
        node: u32,
        /// The host's nodes.
        nodes: String,
    },
    /// Pools larger than their nodes.
    #[error("{what} ({}) exceed{} NUMA node {node}'s memory ({}): lower {what}", format_size(*.size), if .what.contains(" + ") { "" } else { "s" }, format_size(*.total))]
    PoolExceedsNode {
        /// The pool(s).
        what: String,
        /// Their size.
        size: u64,
        /// The node.
        node: u32,
        /// The node's memory.
        total: u64,
    },
    /// A setting out of range.
    #[error("{0}")]
    OutOfRange(String),
    /// The host's nodes could not be read.
    #[error("reading the host's NUMA nodes")]
    Nodes(#[source] tiering::host::HostError),
}

/// Flags of `tiervm serve` that override the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// `--metrics-listen`.
    pub metrics_listen: Option<String>,
    /// `--fast-node`.
    pub fast_node: Option<u32>,
    /// `--slow-node`.
    pub slow_node: Option<u32>,
    /// `--fast-pool`.
    pub fast_pool: Option<u64>,
    /// `--slow-pool`.
    pub slow_pool: Option<u64>,
    /// `--policy`.
    pub policy: Option<String>,
    /// `--period`.
    pub period: Option<Duration>,
    /// `--quantum`.
    pub quantum: Option<u64>,
    /// `--max-move-rate`.
    pub max_move_rate: Option<u64>,
    /// `--dwell`.
    pub dwell: Option<Duration>,
}

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/tiervm/api.sock";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/tiervm";

fn duration(
    key: &str,
    v: Option<&String>,
    default: Duration,
) -> Result<Duration, ServeConfigError> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration(s).map_err(|_| ServeConfigError::BadValue {
            key: key.into(),
            value: s.clone(),
            expected: "a duration such as 500ms or 5s",
        }),
    }
}

fn size(key: &str, v: Option<&SizeValue>) -> Result<Option<u64>, ServeConfigError> {
    v.map(|s| s.bytes(key)).transpose()
}

fn aligned(key: &str, bytes: u64) -> Result<u64, ServeConfigError> {
    if bytes.is_multiple_of(SIZE_ALIGN) {
        Ok(bytes)
    } else {
        Err(ServeConfigError::NotAligned {
            key: key.into(),
            size: bytes,
        })
    }
}

impl ServeFile {
    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Self, ServeConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ServeConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses TOML text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ServeConfigError> {
        toml::from_str(text).map_err(|e| ServeConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })
    }
}

/// The host's NUMA nodes as (id, MemTotal).
pub fn host_nodes() -> Result<Vec<(u32, u64)>, ServeConfigError> {
    let nodes = tiering::host::numa_nodes().map_err(ServeConfigError::Nodes)?;
    Ok(nodes
        .into_iter()
        .filter(|n| n.mem_total_bytes > 0)
        .map(|n| (n.id, n.mem_total_bytes))
        .collect())
}

/// Checks that the pools fit their nodes (pools on one node together).
pub fn check_pools(
    fast_pool: u64,
    slow_pool: u64,
    fast_node: u32,
    slow_node: u32,
    nodes: &[(u32, u64)],
) -> Result<(), ServeConfigError> {
    let total = |n: u32| nodes.iter().find(|(id, _)| *id == n).map(|(_, t)| *t);
    let list = || {
        let v: Vec<String> = nodes.iter().map(|(id, _)| id.to_string()).collect();
        v.join(", ")
    };
    for (key, node) in [("fast_node", fast_node), ("slow_node", slow_node)] {
        if total(node).is_none() {
            return Err(ServeConfigError::NoSuchNode {
                key,
                node,
                nodes: list(),
            });
        }
    }
    let checks: Vec<(String, u64, u32)> = if fast_node == slow_node {
        vec![(
            "fast_pool + slow_pool".into(),
            fast_pool.saturating_add(slow_pool),
            fast_node,
        )]
    } else {
        vec![
            ("fast_pool".into(), fast_pool, fast_node),
            ("slow_pool".into(), slow_pool, slow_node),
        ]
    };
    for (what, size, node) in checks {
        let t = total(node).unwrap_or(0);
        if size > t {
            return Err(ServeConfigError::PoolExceedsNode {
                what,
                size,
                node,
                total: t,
            });
        }
    }
    Ok(())
}

impl VmDefaults {
    /// The `[defaults]` table, with `--policy` over its policy.
    fn build(d: &DefaultsFile, flags: &Overrides) -> Result<Self, ServeConfigError> {
        let policy = flags
            .policy
            .clone()
            .or(d.policy.clone())
            .unwrap_or_else(|| "nomad".into());
        check_policy(&policy)
            .map_err(|e| ServeConfigError::OutOfRange(format!("policy: {}", e.message)))?;
        let defaults = Self {
            mem: aligned(
                "defaults.mem",
                size("defaults.mem", d.mem.as_ref())?.unwrap_or(1 << 30),
            )?,
            vcpus: d.vcpus.unwrap_or(1),
            policy,
            fast_min: aligned(
                "defaults.fast_min",
                size("defaults.fast_min", d.fast_min.as_ref())?.unwrap_or(0),
            )?,
            fast_max: size("defaults.fast_max", d.fast_max.as_ref())?
                .map(|m| aligned("defaults.fast_max", m))
                .transpose()?,
            weight: d.weight.unwrap_or(1.0),
            tracking: d.tracking.clone().unwrap_or_else(|| "hint-faults".into()),
            stop_grace: duration(
                "defaults.stop_grace",
                d.stop_grace.as_ref(),
                Duration::from_secs(10),
            )?,
        };
        if !(defaults.weight > 0.0 && defaults.weight.is_finite()) {
            return Err(ServeConfigError::OutOfRange(format!(
                "defaults.weight {}: give a positive number",
                defaults.weight
            )));
        }
        Ok(defaults)
    }
}

/// The `[division]` table with the flags over it: the division's
/// parameters and its period.
fn division_params(
    v: &DivisionFile,
    flags: &Overrides,
) -> Result<(super::division::Params, Duration), ServeConfigError> {
    let period = match flags.period {
        Some(p) => p,
        None => duration("division.period", v.period.as_ref(), Duration::from_secs(5))?,
    };
    if period < Duration::from_millis(100) {
        return Err(ServeConfigError::OutOfRange(
            "division.period must be at least 100ms".into(),
        ));
    }
    let quantum = aligned(
        "division.quantum",
        flags
            .quantum
            .or(size("division.quantum", v.quantum.as_ref())?)
            .unwrap_or(64 << 20),
    )?;
    if quantum == 0 {
        return Err(ServeConfigError::OutOfRange(
            "division.quantum 0: give at least 2M".into(),
        ));
    }
    let rate = flags
        .max_move_rate
        .or(size("division.max_move_rate", v.max_move_rate.as_ref())?)
        .unwrap_or(256 << 20);
    let hysteresis = v.hysteresis.unwrap_or(0.2);
    let min_share = v.min_share.unwrap_or(0.002);
    let significance = v.significance.unwrap_or(2.0);
    for (k, x) in [
        ("division.hysteresis", hysteresis),
        ("division.min_share", min_share),
        ("division.significance", significance),
    ] {
        if !(x.is_finite() && x >= 0.0) {
            return Err(ServeConfigError::OutOfRange(format!(
                "{k} {x}: give a number >= 0"
            )));
        }
    }
    let dwell = match flags.dwell {
        Some(d) => d,
        None => duration("division.dwell", v.dwell.as_ref(), Duration::from_secs(10))?,
    };
    let value = match v.value.as_deref() {
        None => Valuation::default(),
        Some(name) => Valuation::from_name(name).ok_or_else(|| ServeConfigError::BadValue {
            key: "division.value".into(),
            value: name.into(),
            expected: "host-accesses (the VM's access rate measured by the host, the \
                           default) or guest-ops (the operations per second the guest \
                           reports: only for guests you trust)",
        })?,
    };
    let division = super::division::Params {
        quantum,
        hysteresis,
        min_share,
        budget_bytes: (rate as f64 * period.as_secs_f64()) as u64,
        dwell_s: dwell.as_secs_f64(),
        reverse_dwell_s: 3.0 * dwell.as_secs_f64(),
        significance,
        value,
        ..super::division::Params::default()
    };
    Ok((division, period))
}

/// The fast and slow nodes: the flags', else the file's, else the host's
/// first node and another (the same one when the host has one node).
fn nodes_of(file: &ServeFile, flags: &Overrides, nodes: &[(u32, u64)]) -> (u32, u32) {
    let fast_node = flags
        .fast_node
        .or(file.fast_node)
        .unwrap_or_else(|| nodes.first().map_or(0, |n| n.0));
    let slow_node = flags.slow_node.or(file.slow_node).unwrap_or_else(|| {
        nodes
            .iter()
            .map(|n| n.0)
            .find(|&n| n != fast_node)
            .unwrap_or(fast_node)
    });
    (fast_node, slow_node)
}

/// The fast and slow pools (both required), aligned.
fn pools_of(file: &ServeFile, flags: &Overrides) -> Result<(u64, u64), ServeConfigError> {
    let fast_pool = flags
        .fast_pool
        .or(size("fast_pool", file.fast_pool.as_ref())?)
        .ok_or(ServeConfigError::MissingPool("fast-pool"))?;
    let slow_pool = flags
        .slow_pool
        .or(size("slow_pool", file.slow_pool.as_ref())?)
        .ok_or(ServeConfigError::MissingPool("slow-pool"))?;
    let fast_pool = aligned("fast_pool", fast_pool)?;
    let slow_pool = aligned("slow_pool", slow_pool)?;
    Ok((fast_pool, slow_pool))
}

/// The metrics address, if the flags or the file give one.
fn metrics_listen_of(
    file: &ServeFile,
    flags: &Overrides,
) -> Result<Option<std::net::SocketAddr>, ServeConfigError> {
    match flags
        .metrics_listen
        .as_ref()
        .or(file.metrics_listen.as_ref())
    {
        None => Ok(None),
        Some(a) => Ok(Some(a.parse().map_err(|_| ServeConfigError::BadValue {
            key: "metrics_listen".into(),
            value: a.clone(),
            expected: "an address such as 127.0.0.1:9464",
        })?)),
    }
}

/// The socket's mode: 0600 by default, at most 0660.
fn socket_mode_of(file: &ServeFile) -> Result<u32, ServeConfigError> {
    let Some(m) = &file.socket_mode else {
        return Ok(0o600);
    };
    let bad = || ServeConfigError::BadValue {
        key: "socket_mode".into(),
        value: m.clone(),
        expected: "an octal mode such as \"0660\" (at most 0660: the owner and the socket_group)",
    };
    let mode = u32::from_str_radix(m.trim_start_matches("0o"), 8).map_err(|_| bad())?;
    if mode & !0o660 != 0 || mode & 0o600 != 0o600 {
        return Err(bad());
    }
    Ok(mode)
}

impl ServeConfig {
    /// Validates `file` with `flags` over it, against the host's `nodes`.
    pub fn build(
        file: &ServeFile,
        flags: &Overrides,
        nodes: &[(u32, u64)],
        worker_exe: PathBuf,
    ) -> Result<Self, ServeConfigError> {
        let (fast_node, slow_node) = nodes_of(file, flags, nodes);
        let (fast_pool, slow_pool) = pools_of(file, flags)?;
        check_pools(fast_pool, slow_pool, fast_node, slow_node, nodes)?;
        let defaults = VmDefaults::build(&file.defaults, flags)?;
        let (division, period) = division_params(&file.division, flags)?;
        let l = &file.limits;
        let max_body = size("limits.max_body", l.max_body.as_ref())?.unwrap_or(64 << 10);
        let request_timeout = duration(
            "limits.request_timeout",
            l.request_timeout.as_ref(),
            Duration::from_secs(10),
        )?;
        let metrics_listen = metrics_listen_of(file, flags)?;
        let socket_mode = socket_mode_of(file)?;
        Ok(Self {
            socket_group: file.socket_group.clone(),
            socket_mode,
            metrics_listen,
            socket: flags
                .socket
                .clone()
                .or(file.socket.clone())
                .unwrap_or_else(|| DEFAULT_SOCKET.into()),
            state_dir: flags
                .state_dir
                .clone()
                .or(file.state_dir.clone())
                .unwrap_or_else(|| DEFAULT_STATE_DIR.into()),
            image_dir: file.image_dir.clone(),
            fast_node,
            slow_node,
            fast_pool,
            slow_pool,
            emulated: fast_node == slow_node,
            defaults,
            division,
            period,
            max_vms: l.max_vms.unwrap_or(64).max(1),
            max_body: usize::try_from(max_body.clamp(1024, 16 << 20)).unwrap_or(64 << 10),
            request_timeout: request_timeout.max(Duration::from_millis(100)),
            unresponsive_after: duration(
                "limits.unresponsive_after",
                l.unresponsive_after.as_ref(),
                Duration::from_secs(5),
            )?
            .max(Duration::from_secs(2)),
            worker_exe,
        })
    }
}

impl ServeConfig {
    /// Settings for in-process tests: empty pools (every create is
    /// refused by admission, so no worker starts), a worker that does
    /// not exist, a temporary state directory.
    pub fn for_tests() -> Self {
        Self {
            socket: std::env::temp_dir().join("tiervm-test-unused.sock"),
            state_dir: std::env::temp_dir().join("tiervm-test-state"),
            socket_group: None,
            socket_mode: 0o600,
            image_dir: None,
            metrics_listen: None,
            fast_node: 0,
            slow_node: 0,
            fast_pool: 0,
            slow_pool: 0,
            emulated: true,
            defaults: VmDefaults {
                mem: 64 << 20,
                vcpus: 1,
                policy: "nomad".into(),
                fast_min: 0,
                fast_max: None,
                weight: 1.0,
                tracking: "hint-faults".into(),
                stop_grace: Duration::from_secs(1),
            },
            division: super::division::Params::default(),
            period: Duration::from_secs(1),
            max_vms: 4,
            max_body: 4096,
            request_timeout: Duration::from_secs(5),
            unresponsive_after: Duration::from_secs(5),
            worker_exe: "/nonexistent/tiervm".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn build(text: &str, flags: &Overrides, nodes: &[(u32, u64)]) -> Result<ServeConfig, String> {
        let f = ServeFile::parse(text, Path::new("t.toml")).map_err(|e| e.to_string())?;
        ServeConfig::build(&f, flags, nodes, "tiervm".into()).map_err(|e| vmm_core::exit::chain(&e))
    }

    #[test]
    fn file_and_flags_merge_with_flags_winning() {
        let c = build(
            "fast_pool = \"4G\"\nslow_pool = 8589934592\n[division]\nperiod = \"2s\"\n",
            &Overrides {
                fast_pool: Some(2 * G),
                ..Overrides::default()
            },
            &[(0, 16 * G), (1, 64 * G)],
        )
        .unwrap();
        assert_eq!(c.fast_pool, 2 * G);
        assert_eq!(c.slow_pool, 8 * G);
        assert_eq!((c.fast_node, c.slow_node), (0, 1));
        assert!(!c.emulated);
        assert_eq!(c.period, Duration::from_secs(2));
    }

    #[test]
    fn pools_larger_than_their_nodes_are_refused_with_the_fix() {
        let e = build(
            "fast_pool = \"20G\"\nslow_pool = \"8G\"",
            &Overrides::default(),
            &[(0, 24 * G)],
        )
        .unwrap_err();
        assert!(
            e.contains("fast_pool + slow_pool (28G) exceed NUMA node 0's memory (24G): lower"),
            "{e}"
        );
        let e = build(
            "fast_pool = \"20G\"\nslow_pool = \"8G\"",
            &Overrides::default(),
            &[(0, 16 * G), (1, 64 * G)],
        )
        .unwrap_err();
        assert!(
            e.contains("fast_pool (20G) exceeds NUMA node 0's memory"),
            "{e}"
        );
        let e = build(
            "fast_pool = \"1G\"\nslow_pool = \"1G\"\nslow_node = 3",
            &Overrides::default(),
            &[(0, 16 * G)],
        )
        .unwrap_err();
        assert!(
            e.contains("slow_node 3: this host has NUMA nodes with memory 0"),
            "{e}"
        );
    }

    #[test]
    fn bad_files_name_the_key() {
        let e = build(
            "fast_pool = \"1G\"\nfast_pol = 3",
            &Overrides::default(),
            &[(0, G)],
        )
        .unwrap_err();
        assert!(e.contains("unknown field `fast_pol`"), "{e}");
        let e = build("slow_pool = \"1G\"", &Overrides::default(), &[(0, 4 * G)]).unwrap_err();
        assert!(e.contains("fast-pool is not set"), "{e}");
        let e = build(
            "fast_pool = \"1G\"\nslow_pool = \"3M\"",
            &Overrides::default(),
            &[(0, 4 * G)],
        )
        .unwrap_err();
        assert!(e.contains("slow_pool 3M is not a multiple of 2M"), "{e}");
    }

    #[test]
    fn the_division_values_host_measured_accesses_unless_told_otherwise() {
        let nodes = [(0, 4 * G)];
        let with = |division: &str| {
            build(
                &format!("fast_pool = \"1G\"\nslow_pool = \"1G\"{division}"),
                &Overrides::default(),
                &nodes,
            )
        };
        let c = with("").unwrap();
        assert_eq!(c.division.value, Valuation::HostAccesses);
        let c = with("\n[division]\nvalue = \"guest-ops\"").unwrap();
        assert_eq!(c.division.value, Valuation::GuestOps);
        let e = with("\n[division]\nvalue = \"ops\"").unwrap_err();
        assert!(
            e.contains("division.value = 'ops': give host-accesses (")
                && e.contains("or guest-ops ("),
            "{e}"
        );
    }
}
