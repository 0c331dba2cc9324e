//! The validated configuration of one VM run, built from command-line
//! flags; every check names the problem and the fix.

use std::time::Duration;

use tiering::policy::PolicyKind;
use tiervm_guest::abi::{GUEST_LARGE_PAGE, MAX_VCPUS};
use tiervm_guest::args::Args;
use tiervm_guest::workloads;

use crate::choice::UnknownChoice;
use crate::emulation::{self, EmulationConfig, EmulationConfigError};
use crate::guest_abi::{MAX_RAM, MIN_RAM};
use crate::image::{self, ElfInfo, Image, ImageError};
use crate::tiering_config::{TieringConfig, TieringConfigError, TieringRequest};
use crate::units::format_size;
use crate::vstate::memory::GuestLayout;
use crate::workload_args::{check_args, parse_kv, to_entries, WorkloadArgError};

/// Default guest RAM.
pub const DEFAULT_MEM: u64 = 1 << 30;
/// Default run length.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(5);
/// Default status sampling period.
pub const DEFAULT_SAMPLE_MS: u64 = 100;
/// Longest status sampling period (`--sample-ms`): one timeline point a minute.
pub const MAX_SAMPLE_MS: u64 = 60_000;
/// Default time the guest gets to report after a stop request.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
/// Default cap on guest console bytes forwarded.
pub const DEFAULT_CONSOLE_LIMIT: u64 = 1 << 20;

/// A VM setting that cannot be used; each message names the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--vcpus 0`.
    #[error("--vcpus 0: a VM needs at least one vCPU; use --vcpus 1 or more")]
    NoVcpus,
    /// More vCPUs than the guest ABI has room for.
    #[error("--vcpus {vcpus} exceeds the {MAX_VCPUS} vCPUs tiervm supports")]
    TooManyVcpus {
        /// vCPUs asked for.
        vcpus: u32,
    },
    /// `--sample-ms 0`.
    #[error("--sample-ms 0: the sampling period must be at least 1 ms")]
    NoSamplePeriod,
    /// `--sample-ms` beyond [`MAX_SAMPLE_MS`].
    #[error("--sample-ms {ms} exceeds the {MAX_SAMPLE_MS} ms maximum: give a period of at most a minute, e.g. --sample-ms 1000")]
    SamplePeriodTooLong {
        /// The period asked for.
        ms: u64,
    },
    /// `--mem` below [`MIN_RAM`].
    #[error("--mem {} is below the {} minimum", format_size(*.mem), format_size(MIN_RAM))]
    MemBelowMinimum {
        /// Guest RAM asked for.
        mem: u64,
    },
    /// `--mem` above [`MAX_RAM`].
    #[error("--mem {} exceeds the {} maximum", format_size(*.mem), format_size(MAX_RAM))]
    MemAboveMaximum {
        /// Guest RAM asked for.
        mem: u64,
    },
    /// `--mem` not a multiple of the guest's 2 MiB pages.
    #[error("--mem {} is not a multiple of 2M: use e.g. --mem {}", format_size(*.mem), format_size(.mem.div_ceil(GUEST_LARGE_PAGE) * GUEST_LARGE_PAGE))]
    MemNotAligned {
        /// Guest RAM asked for.
        mem: u64,
    },
    /// Untiered `--mem` above the host's memory.
    #[error("--mem {} exceeds this host's memory ({}): lower --mem, or run it tiered (--fast SIZE): tiered memory is committed only where the guest touches it", format_size(*.mem), format_size(*.host))]
    MemExceedsHost {
        /// Guest RAM asked for.
        mem: u64,
        /// The host's MemTotal.
        host: u64,
    },
    /// The image's data set with these arguments does not fit in `--mem`.
    #[error("--mem {} is below what image {image} needs with these arguments ({}): raise --mem to at least {} or shrink the data set", format_size(*.mem), format_size(*.needed), format_size(*.needed))]
    MemTooSmallForImage {
        /// Guest RAM asked for.
        mem: u64,
        /// The built-in image.
        image: &'static str,
        /// RAM the image needs.
        needed: u64,
    },
    /// An image given by path leaves no room for the vCPU stacks.
    #[error("--mem {} leaves no room for {vcpus} vCPU stacks after the image: raise --mem", format_size(*.mem))]
    NoRoomForStacks {
        /// Guest RAM asked for.
        mem: u64,
        /// vCPUs asked for.
        vcpus: u32,
    },
    /// A workload argument is invalid.
    #[error(transparent)]
    Arg(#[from] WorkloadArgError),
    /// A named setting (a policy, a tracking) is none of its names.
    #[error(transparent)]
    Choice(#[from] UnknownChoice),
    /// `--emulate-latency` is invalid.
    #[error(transparent)]
    Emulation(#[from] EmulationConfigError),
    /// The guest image cannot be used.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The tiering settings are invalid.
    #[error(transparent)]
    Tiering(#[from] TieringConfigError),
    /// The emulation region does not fit below the page tables' reach.
    #[error("--mem {} leaves no room for the latency-emulation region below {}: lower --mem or drop --emulate-latency", format_size(*.mem), format_size(MAX_RAM))]
    NoRoomForEmulation {
        /// Guest RAM asked for.
        mem: u64,
    },
}

impl ConfigError {
    /// What the user can do about it, when the message does not end with
    /// it already (an unusable image names its fix after the cause).
    pub fn fix(&self) -> Option<&'static str> {
        match self {
            Self::Image(e) => e.fix(),
            _ => None,
        }
    }
}

/// Everything needed to run one VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// The image.
    pub image: Image,
    /// Its validated ELF description.
    pub elf: ElfInfo,
    /// Workload arguments as given (in order).
    pub args: Vec<(String, String)>,
    /// Guest RAM bytes.
    pub mem_bytes: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Run length; `None` = until the guest exits.
    pub duration: Option<Duration>,
    /// Status sampling period.
    pub sample: Duration,
    /// Seed passed to the guest.
    pub seed: u64,
    /// How long the guest gets to finish after a stop request.
    pub stop_grace: Duration,
    /// Guest console bytes forwarded before dropping.
    pub console_limit: u64,
    /// The guest-physical layout.
    pub layout: GuestLayout,
    /// Tiered memory settings; `None` = untiered RAM.
    pub tiering: Option<TieringConfig>,
    /// Latency emulation (`--emulate-latency`); `None` = off.
    pub emulation: Option<EmulationConfig>,
    /// The VM's threads install seccomp filters (docs/security.md).
    pub seccomp: bool,
    /// The calling (main) thread installs one too, once the VM's threads
    /// exist (`tiervm run`: it runs one VM, then prints and exits).
    pub seccomp_main: bool,
    /// TEST ONLY: vCPU threads make a forbidden system call.
    pub test_forbidden_syscall: bool,
}

/// Unvalidated inputs: what the CLI parsed, and the description of a VM
/// the service sends its VM process and keeps in the VM's record.
///
/// On the wire (JSON): the fields by name, durations as float seconds
/// (`duration_s`, `stop_grace_s`), choices as their flag values; fields
/// left out take their defaults (`{"image": "gups"}` is a request), `None`
/// fields are left out.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct VmRequest {
    /// Built-in name or path.
    pub image: String,
    /// `key=value` strings.
    pub args: Vec<String>,
    /// Guest RAM bytes.
    pub mem_bytes: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Run length (zero = until the guest exits).
    #[serde(rename = "duration_s", with = "crate::units::secs")]
    pub duration: Duration,
    /// Sampling period in ms.
    pub sample_ms: u64,
    /// Seed.
    pub seed: u64,
    /// Stop grace.
    #[serde(rename = "stop_grace_s", with = "crate::units::secs")]
    pub stop_grace: Duration,
    /// Tiering flags.
    pub tiering: TieringRequest,
    /// `--emulate-latency SPEC` (`Some("")`: the defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulate_latency: Option<String>,
    /// Per-thread seccomp filters (`--no-seccomp` turns them off).
    pub seccomp: bool,
}

impl Default for VmRequest {
    fn default() -> Self {
        Self {
            image: "zipf".into(),
            args: Vec::new(),
            mem_bytes: DEFAULT_MEM,
            vcpus: 1,
            duration: DEFAULT_DURATION,
            sample_ms: DEFAULT_SAMPLE_MS,
            seed: 1,
            stop_grace: DEFAULT_STOP_GRACE,
            tiering: TieringRequest::default(),
            emulate_latency: None,
            seccomp: true,
        }
    }
}

/// Checks a `--sample-ms` value: 1 ms to [`MAX_SAMPLE_MS`].
pub fn check_sample_ms(ms: u64) -> std::result::Result<(), ConfigError> {
    if ms == 0 {
        return Err(ConfigError::NoSamplePeriod);
    }
    if ms > MAX_SAMPLE_MS {
        return Err(ConfigError::SamplePeriodTooLong { ms });
    }
    Ok(())
}

/// MemTotal of this host in bytes, if /proc/meminfo says.
pub fn host_memory_bytes() -> Option<u64> {
    tiering::host::host_memory_bytes().ok()
}

impl VmConfig {
    /// Advice about settings that are valid but will not do what the user
    /// probably wants (printed on stderr before the run).
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.tiering.is_some() {
            let nb = std::fs::read_to_string(tiering::host::NUMA_BALANCING)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            out.extend(tiering::host::kernel_tiering_note(
                nb,
                tiering::host::demotion_enabled(),
            ));
        }
        let (Some(d), Some(engine)) = (
            self.duration,
            self.tiering.as_ref().and_then(|t| t.engine.as_ref()),
        ) else {
            return out;
        };
        let mut kinds: Vec<PolicyKind> = engine.policies().collect();
        kinds.sort_unstable();
        kinds.dedup();
        for kind in kinds {
            let interval = engine.interval(kind).or(kind.default_interval());
            let Some(first_migration) = kind.first_migration_after(interval) else {
                continue;
            };
            if d < first_migration {
                out.push(format!(
                    "note: {kind}'s first migration comes {:.1} s into the run ({:.1} s profiling interval), after --duration {:.1}s ends; shorten the interval with --policy-interval {kind}=2s",
                    first_migration.as_secs_f64(),
                    interval.unwrap_or_default().as_secs_f64(),
                    d.as_secs_f64()
                ));
            }
        }
        out
    }

    /// Validates a request: the VM's shape, its RAM, the image and its
    /// arguments, then the tiering settings.
    pub fn from_request(req: &VmRequest) -> Result<Self, ConfigError> {
        check_shape(req)?;
        let mem = req.mem_bytes;
        check_mem(mem)?;
        let image = Image::resolve(&req.image)?;
        let args = parse_kv(&req.args)?;
        if let Some(spec) = image.spec {
            check_args(&image.name, spec, &args)?;
        }
        let elf = image::validate_elf(&image.name, &image.bytes, mem)?;
        let layout = GuestLayout::new(mem, elf.end, req.vcpus);
        check_image_fits(&image, &args, &layout, req.vcpus)?;
        let tiering = tiering_for(req, &layout)?;
        check_untiered_fits_host(mem, tiering.as_ref())?;
        let emulation = emulation_for(req, tiering.as_ref())?;
        Ok(Self {
            emulation,
            tiering,
            image,
            elf,
            args,
            mem_bytes: mem,
            vcpus: req.vcpus,
            duration: (!req.duration.is_zero()).then_some(req.duration),
            sample: Duration::from_millis(req.sample_ms),
            seed: req.seed,
            stop_grace: req.stop_grace,
            console_limit: DEFAULT_CONSOLE_LIMIT,
            layout,
            seccomp: req.seccomp,
            seccomp_main: false,
            test_forbidden_syscall: false,
        })
    }

    /// The arguments with the image's defaults filled in (for reports).
    pub fn effective_args(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(spec) = self.image.spec {
            for a in spec.args {
                out.insert(a.key.to_string(), a.default.to_string());
            }
        }
        for (k, v) in &self.args {
            out.insert(k.clone(), v.clone());
        }
        out
    }
}

/// vCPU count and sampling period.
fn check_shape(req: &VmRequest) -> std::result::Result<(), ConfigError> {
    if req.vcpus == 0 {
        return Err(ConfigError::NoVcpus);
    }
    if req.vcpus as usize > MAX_VCPUS {
        return Err(ConfigError::TooManyVcpus { vcpus: req.vcpus });
    }
    check_sample_ms(req.sample_ms)
}

/// Guest RAM: within tiervm's bounds and 2 MiB aligned.
fn check_mem(mem: u64) -> std::result::Result<(), ConfigError> {
    if mem < MIN_RAM {
        return Err(ConfigError::MemBelowMinimum { mem });
    }
    if mem > MAX_RAM {
        return Err(ConfigError::MemAboveMaximum { mem });
    }
    if !mem.is_multiple_of(GUEST_LARGE_PAGE) {
        return Err(ConfigError::MemNotAligned { mem });
    }
    Ok(())
}

/// Untiered RAM has no commit guard: it must fit the host. Tiered RAM is
/// committed lazily under a guard (see `tiering::mem`), so a guest larger
/// than the host runs as long as it touches less.
fn check_untiered_fits_host(
    mem: u64,
    tiering: Option<&TieringConfig>,
) -> std::result::Result<(), ConfigError> {
    match (tiering, host_memory_bytes()) {
        (None, Some(host)) if mem > host => Err(ConfigError::MemExceedsHost { mem, host }),
        _ => Ok(()),
    }
}

/// The image, its stacks and (for built-in images) the data set its
/// arguments ask for fit in guest RAM.
fn check_image_fits(
    image: &Image,
    args: &[(String, String)],
    layout: &GuestLayout,
    vcpus: u32,
) -> std::result::Result<(), ConfigError> {
    let mem = layout.ram_size;
    if let Some(spec) = image.spec {
        let entries = to_entries(args)?;
        let need = workloads::heap_need(spec.name, &Args::new(&entries, Some(spec))).unwrap_or(0);
        let needed = layout.ram_needed(need);
        if needed > mem {
            return Err(ConfigError::MemTooSmallForImage {
                mem,
                image: spec.name,
                needed,
            });
        }
    } else if layout.heap_start > mem {
        return Err(ConfigError::NoRoomForStacks { mem, vcpus });
    }
    Ok(())
}

/// The validated tiering settings (chaos limited to the heap when the
/// test-only flag asks for it).
fn tiering_for(
    req: &VmRequest,
    layout: &GuestLayout,
) -> Result<Option<TieringConfig>, ConfigError> {
    let nodes: Vec<u32> = tiering::host::numa_nodes()
        .map(|n| n.iter().map(|n| n.id).collect())
        .unwrap_or_default();
    let mut tiering = req.tiering.validate(layout.ram_size, req.seed, &nodes)?;
    if req.tiering.chaos_heap_only {
        if let Some(chaos) = tiering.as_mut().and_then(|t| t.chaos.as_mut()) {
            let page = tiering::mem::PAGE_SIZE as u64;
            chaos.pages =
                Some((layout.heap_start / page) as usize..(layout.heap_end / page) as usize);
        }
    }
    Ok(tiering)
}

/// `--emulate-latency`: the settings, for a VM whose tiers the 2-bit map
/// can name and whose region fits below the page tables' reach.
fn emulation_for(
    req: &VmRequest,
    tiering: Option<&TieringConfig>,
) -> std::result::Result<Option<EmulationConfig>, ConfigError> {
    let Some(spec) = &req.emulate_latency else {
        return Ok(None);
    };
    let cfg = EmulationConfig::parse(spec)?;
    cfg.check_tiers(tiering.map_or(1, |t| t.mem.tiers.len()))?;
    if emulation::layout_for(&cfg, req.mem_bytes, req.vcpus).end() > MAX_RAM {
        return Err(ConfigError::NoRoomForEmulation { mem: req.mem_bytes });
    }
    Ok(Some(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(f: impl FnOnce(&mut VmRequest)) -> VmRequest {
        let mut r = VmRequest::default();
        f(&mut r);
        r
    }

    fn err(r: VmRequest) -> String {
        let e = VmConfig::from_request(&r).unwrap_err();
        e.to_string()
    }

    #[test]
    fn notes_warn_when_mtm_cannot_migrate_within_the_run() {
        let mtm = |interval: Option<&str>, secs: u64| {
            let r = req(|r| {
                r.duration = Duration::from_secs(secs);
                r.tiering.fast = Some(256 << 20);
                r.tiering.policy = Some(crate::tiering_config::PolicyArg::Mtm);
                r.tiering.policy_interval = interval.map(str::to_string);
            });
            VmConfig::from_request(&r).unwrap().notes()
        };
        let n = mtm(None, 6);
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].contains("13.3 s into the run"), "{n:?}");
        assert!(mtm(Some("mtm=2s"), 6).is_empty());
        assert_eq!(mtm(Some("mtm=6s"), 6).len(), 1);
        assert!(mtm(None, 20).is_empty());
    }

    #[test]
    fn usage_errors_name_the_fix() {
        assert!(err(req(|r| r.vcpus = 0)).contains("--vcpus 0"));
        assert!(err(req(|r| r.mem_bytes = 1 << 20)).contains("below the 16M minimum"));
        assert!(err(req(|r| r.mem_bytes = (64 << 20) + 4096)).contains("multiple of 2M"));
        assert!(err(req(|r| r.mem_bytes = 64 << 20)).contains("raise --mem to at least"));
        assert!(err(req(|r| r.args = vec!["bogus=1".into()]))
            .contains("unknown --arg key 'bogus' for image zipf"));
        assert!(err(req(|r| r.args = vec!["theta=2".into()])).contains("out of range"));
        assert!(err(req(|r| r.args = vec!["theta".into()])).contains("not key=value"));
        assert!(err(req(|r| r.image = "nope".into())).contains("neither a built-in image"));
        if let Some(host) = host_memory_bytes() {
            let over = (host / GUEST_LARGE_PAGE + 1) * GUEST_LARGE_PAGE;
            if over <= MAX_RAM {
                assert!(err(req(|r| r.mem_bytes = over)).contains("exceeds this host's memory"));
            }
        }
    }

    #[test]
    fn emulation_is_off_unless_asked_and_checked_when_asked() {
        let off = VmConfig::from_request(&req(|_| {})).unwrap();
        assert!(off.emulation.is_none());
        let on = VmConfig::from_request(&req(|r| r.emulate_latency = Some(String::new()))).unwrap();
        assert_eq!(on.emulation.unwrap().preset, "nomad-a");
        assert!(err(req(|r| r.emulate_latency = Some("fast=abc".into())))
            .contains("--emulate-latency fast=abc"));
        assert!(err(req(|r| {
            // Tiered (committed lazily), so the host's size does not matter.
            r.mem_bytes = MAX_RAM;
            r.tiering.fast = Some(1 << 30);
            r.emulate_latency = Some(String::new());
        }))
        .contains("no room for the latency-emulation region"));
    }

    #[test]
    fn requests_round_trip_as_json_and_sparse_json_takes_the_defaults() {
        use crate::tiering_config::{MechanismArg, PlacementArg, PolicyArg, TrackingArg, UnitArg};
        let r = req(|r| {
            r.image = "gups".into();
            r.args = vec!["wss=64M".into()];
            r.mem_bytes = 512 << 20;
            r.vcpus = 2;
            r.duration = Duration::from_millis(2500);
            r.sample_ms = 50;
            r.seed = 42;
            r.stop_grace = Duration::from_secs(3);
            r.emulate_latency = Some("nomad-a".into());
            r.seccomp = false;
            let t = &mut r.tiering;
            t.fast = Some(128 << 20);
            t.slow = Some(512 << 20);
            t.fast_node = Some(0);
            t.slow_node = Some(1);
            t.placement = PlacementArg::SlowFirst;
            t.policy = Some(PolicyArg::Chaos);
            t.chaos_rate = Some(2000.0);
            t.chaos_mix = Some("3:1".into());
            t.mechanism = Some(MechanismArg::StopCopy);
            t.chaos_unit = Some(UnitArg::Run2m);
            t.skip_dirty_check = true;
            t.tracking = Some(TrackingArg::HintFaults);
            t.scan_pages = Some(4096);
            t.scan_period = Some(Duration::from_millis(250));
            t.tracking_budget_pct = Some(3.5);
            t.chaos_heap_only = true;
            t.tracking_ab = Some(Duration::from_secs(1));
            t.fast_schedule = Some("64M@0s,128M@5s".into());
        });
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["duration_s"], 2.5);
        assert_eq!(j["tiering"]["placement"], "slow-first");
        assert_eq!(j["tiering"]["mechanism"], "stop-copy");
        assert_eq!(j["tiering"]["chaos_unit"], "2m");
        assert_eq!(j["tiering"]["scan_period_s"], 0.25);
        assert_eq!(serde_json::from_value::<VmRequest>(j).unwrap(), r);
        // Defaults are left out or written as they are, and read back.
        let d = serde_json::to_value(VmRequest::default()).unwrap();
        assert_eq!(d["tiering"], serde_json::json!({"placement": "fast-first"}));
        assert!(d.get("emulate_latency").is_none());
        assert_eq!(
            serde_json::from_value::<VmRequest>(d).unwrap(),
            VmRequest::default()
        );
        let sparse: VmRequest =
            serde_json::from_str(r#"{"image": "gups", "tiering": {"policy": "tpp"}}"#).unwrap();
        assert_eq!(
            sparse,
            req(|r| {
                r.image = "gups".into();
                r.tiering.policy = Some(PolicyArg::Tpp);
            })
        );
    }

    #[test]
    fn bad_json_requests_are_refused_with_the_problem_named() {
        let e = |j: &str| {
            serde_json::from_str::<VmRequest>(j)
                .unwrap_err()
                .to_string()
        };
        assert!(e(r#"{"tiering": {"policy": "bogus"}}"#)
            .starts_with("unknown policy 'bogus': valid values are none, static"));
        assert!(e(r#"{"tiering": {"tracking": "x"}}"#).starts_with("unknown tracking 'x'"));
        assert!(e(r#"{"duration_s": -1}"#).contains("-1 is not a duration in seconds"));
        assert!(e(r#"{"stop_grace_s": 1e300}"#).contains("is not a duration in seconds"));
        assert!(e(r#"{"tiering": {"scan_period_s": -2}}"#).contains("not a duration"));
        assert!(e(r#"{"vcpus": -1}"#).contains("invalid value"));
        assert!(e(r#"[1]"#).contains("invalid type"));
    }

    #[test]
    fn valid_request_builds() {
        let c = VmConfig::from_request(&req(|r| r.args = vec!["wss=16M".into(), "rss=32M".into()]))
            .unwrap();
        assert_eq!(c.effective_args()["wss"], "16M");
        assert_eq!(c.effective_args()["theta"], "0.99");
        assert!(c.layout.heap_bytes() >= 32 << 20);
    }
}
