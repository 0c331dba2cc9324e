//! The validated configuration of one VM run, built from command-line
//! flags; every check names the problem and the fix.

use std::time::Duration;

use tiervm_guest::abi::{ArgEntry, GUEST_LARGE_PAGE, MAX_VCPUS};
use tiervm_guest::args::{ArgError, ArgKind, Args};
use tiervm_guest::workloads;

use crate::error::{Error, Result};
use crate::image::{self, ElfInfo, Image};
use crate::tiering_config::{TieringConfig, TieringRequest};
use crate::units::format_size;
use crate::vstate::memory::{Layout, MAX_RAM, MIN_RAM};

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
    pub layout: Layout,
    /// Tiered memory settings; `None` = untiered RAM.
    pub tiering: Option<TieringConfig>,
    /// The VM's threads install seccomp filters (docs/security.md).
    pub seccomp: bool,
    /// The calling (main) thread installs one too, once the VM's threads
    /// exist (`tiervm run`: it runs one VM, then prints and exits).
    pub seccomp_main: bool,
    /// TEST ONLY: vCPU threads make a forbidden system call.
    pub test_forbidden_syscall: bool,
}

/// Unvalidated inputs (what the CLI parsed).
#[derive(Clone, Debug)]
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
    pub duration: Duration,
    /// Sampling period in ms.
    pub sample_ms: u64,
    /// Seed.
    pub seed: u64,
    /// Stop grace.
    pub stop_grace: Duration,
    /// Tiering flags.
    pub tiering: TieringRequest,
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
            seccomp: true,
        }
    }
}

/// Splits `key=value` flags.
pub fn parse_kv(args: &[String]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(Error::Usage(format!(
                "--arg '{a}' is not key=value: write e.g. --arg wss=256M"
            ))),
        })
        .collect()
}

/// Checks `args` against a built-in image's spec.
pub fn check_args(
    image: &str,
    spec: &tiervm_guest::args::ImageSpec,
    args: &[(String, String)],
) -> Result<()> {
    for (k, v) in args {
        let Some(a) = spec.arg(k) else {
            let keys: Vec<_> = spec.args.iter().map(|a| a.key).collect();
            return Err(Error::Usage(format!(
                "unknown --arg key '{k}' for image {image}: valid keys are {}",
                keys.join(", ")
            )));
        };
        if let Err(e) = a.kind.check(v) {
            let expected = match a.kind {
                ArgKind::Size { min, max } => {
                    format!("a size from {} to {}", format_size(min), format_size(max))
                }
                ArgKind::Float { min, max } => format!("a number from {min} to {max}"),
                ArgKind::Int { min, max } => format!("an integer from {min} to {max}"),
                ArgKind::Choice(words) => format!("one of {}", words.join(", ")),
            };
            let why = match e {
                ArgError::OutOfRange => "out of range",
                ArgError::BadChoice => "not an allowed value",
                _ => "malformed",
            };
            return Err(Error::Usage(format!(
                "--arg {k}={v} for image {image} is {why}: give {expected}"
            )));
        }
    }
    Ok(())
}

/// Checks a `--sample-ms` value: 1 ms to [`MAX_SAMPLE_MS`].
pub fn check_sample_ms(ms: u64) -> Result<()> {
    if ms == 0 {
        return Err(Error::Usage(
            "--sample-ms 0: the sampling period must be at least 1 ms".into(),
        ));
    }
    if ms > MAX_SAMPLE_MS {
        return Err(Error::Usage(format!(
            "--sample-ms {ms} exceeds the {MAX_SAMPLE_MS} ms maximum: give a period of at most a minute, e.g. --sample-ms 1000"
        )));
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
        let (Some(d), Some(engine)) = (
            self.duration,
            self.tiering.as_ref().and_then(|t| t.engine.as_ref()),
        ) else {
            return out;
        };
        let interval = engine
            .interval("mtm")
            .unwrap_or(Duration::from_nanos(tiering::policy::mtm::INTERVAL_NS));
        // MTM picks its samples a third of an interval in, then scans for a
        // whole interval before its first migration.
        let first_migration = interval.mul_f64(4.0 / 3.0);
        if engine.runs("mtm") && d < first_migration {
            out.push(format!(
                "note: mtm's first migration comes {:.1} s into the run ({:.1} s profiling interval), after --duration {:.1}s ends; shorten the interval with --policy-interval mtm=2s",
                first_migration.as_secs_f64(),
                interval.as_secs_f64(),
                d.as_secs_f64()
            ));
        }
        out
    }

    /// Validates a request.
    pub fn from_request(req: &VmRequest) -> Result<Self> {
        if req.vcpus == 0 {
            return Err(Error::Usage(
                "--vcpus 0: a VM needs at least one vCPU; use --vcpus 1 or more".into(),
            ));
        }
        if req.vcpus as usize > MAX_VCPUS {
            return Err(Error::Usage(format!(
                "--vcpus {} exceeds the {MAX_VCPUS} vCPUs tiervm supports",
                req.vcpus
            )));
        }
        check_sample_ms(req.sample_ms)?;
        let mem = req.mem_bytes;
        if mem < MIN_RAM {
            return Err(Error::Usage(format!(
                "--mem {} is below the {} minimum",
                format_size(mem),
                format_size(MIN_RAM)
            )));
        }
        if mem > MAX_RAM {
            return Err(Error::Usage(format!(
                "--mem {} exceeds the {} maximum",
                format_size(mem),
                format_size(MAX_RAM)
            )));
        }
        if !mem.is_multiple_of(GUEST_LARGE_PAGE) {
            return Err(Error::Usage(format!(
                "--mem {} is not a multiple of 2M: use e.g. --mem {}",
                format_size(mem),
                format_size(mem.div_ceil(GUEST_LARGE_PAGE) * GUEST_LARGE_PAGE)
            )));
        }
        let image = Image::resolve(&req.image)?;
        let args = parse_kv(&req.args)?;
        if let Some(spec) = image.spec {
            check_args(&image.name, spec, &args)?;
        }
        let elf = image::validate_elf(&image.name, &image.bytes, mem)?;
        let layout = Layout::new(mem, elf.end, req.vcpus);
        if let Some(spec) = image.spec {
            let entries = to_entries(&args)?;
            let need =
                workloads::heap_need(spec.name, &Args::new(&entries, Some(spec))).unwrap_or(0);
            let ram_needed = layout.ram_needed(need);
            if ram_needed > mem {
                return Err(Error::Usage(format!(
                    "--mem {} is below what image {} needs with these arguments ({}): raise --mem to at least {} or shrink the data set",
                    format_size(mem),
                    spec.name,
                    format_size(ram_needed),
                    format_size(ram_needed)
                )));
            }
        } else if layout.heap_start > mem {
            return Err(Error::Usage(format!(
                "--mem {} leaves no room for {} vCPU stacks after the image: raise --mem",
                format_size(mem),
                req.vcpus
            )));
        }
        let nodes: Vec<u32> = tiering::host::numa_nodes()
            .map(|n| n.iter().map(|n| n.id).collect())
            .unwrap_or_default();
        let mut tiering = req.tiering.validate(mem, req.seed, &nodes)?;
        // Untiered RAM has no commit guard: it must fit the host. Tiered RAM
        // is committed lazily under a guard (see tiering::mem::commit), so a
        // guest larger than the host runs as long as it touches less.
        if let (None, Some(host)) = (&tiering, host_memory_bytes()) {
            if mem > host {
                return Err(Error::Usage(format!(
                    "--mem {} exceeds this host's memory ({}): lower --mem, or run it tiered \
                     (--fast SIZE): tiered memory is committed only where the guest touches it",
                    format_size(mem),
                    format_size(host)
                )));
            }
        }
        if req.tiering.chaos_heap_only {
            if let Some(chaos) = tiering.as_mut().and_then(|t| t.chaos.as_mut()) {
                let page = tiering::mem::PAGE_SIZE as u64;
                chaos.pages =
                    Some((layout.heap_start / page) as usize..(layout.heap_end / page) as usize);
            }
        }
        Ok(Self {
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

/// Converts `key=value` pairs to ABI entries.
pub fn to_entries(args: &[(String, String)]) -> Result<Vec<ArgEntry>> {
    args.iter()
        .map(|(k, v)| {
            Ok(ArgEntry {
                key: tiervm_guest::abi::to_fixed(k).ok_or_else(|| {
                    Error::Usage(format!(
                        "--arg key '{k}' is too long (max {} bytes)",
                        tiervm_guest::abi::ARG_KEY_LEN
                    ))
                })?,
                value: tiervm_guest::abi::to_fixed(v).ok_or_else(|| {
                    Error::Usage(format!(
                        "--arg value '{v}' is too long (max {} bytes)",
                        tiervm_guest::abi::ARG_VALUE_LEN
                    ))
                })?,
            })
        })
        .collect()
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
        assert_eq!(e.exit_code(), 2, "{e}");
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
    fn valid_request_builds() {
        let c = VmConfig::from_request(&req(|r| r.args = vec!["wss=16M".into(), "rss=32M".into()]))
            .unwrap();
        assert_eq!(c.effective_args()["wss"], "16M");
        assert_eq!(c.effective_args()["theta"], "0.99");
        assert!(c.layout.heap_bytes() >= 32 << 20);
    }
}
