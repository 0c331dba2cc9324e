//! `--emulate-latency SPEC`: the emulated tiers (latency, bandwidth), the
//! queueing model's settings, an antagonist, the guest's cache model and
//! its payment threshold. Presets are the seeds' testbeds.

use serde::Serialize;

use tiering::sim::model::{TierModel, DEFAULT_QUEUE_K, MAX_UTILIZATION};
use tiervm_guest::abi::EMULATION_MAX_TIERS;

use crate::units::{format_size, parse_size};

/// The default preset.
pub const DEFAULT_PRESET: &str = "nomad-a";
/// Debt at which a vCPU pays, ns (issue 12: "e.g. 1 us").
pub const DEFAULT_PAY_NS: f64 = 1_000.0;
/// Default `sample=`: above 1, so a set-sampled cache model charges by set
/// sampling alone, and without one, one cache-missing access in 8 is
/// looked up and charged 8 times (measured: docs/results.md §9).
pub const DEFAULT_SAMPLE_PERIOD: u32 = 8;
/// Longest access-sampling period (the guest's `ACCESS_PERIOD_MAX`).
pub const MAX_SAMPLE_PERIOD: u32 = tiervm_guest::emulation::ACCESS_PERIOD_MAX;
/// Cache model size when the host does not say (`/sys/.../cache`).
pub const FALLBACK_LLC_BYTES: u64 = 32 << 20;
/// Smallest and largest cache model (a power of two in between).
pub const LLC_RANGE: (u64, u64) = (64 << 10, 1 << 30);

/// A testbed from the seeds: per tier (fast, slow) unloaded latency and peak
/// bandwidth, and where the numbers come from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    /// Name on the command line.
    pub name: &'static str,
    /// Unloaded latency per tier, ns.
    pub latency_ns: [f64; 2],
    /// Peak bandwidth per tier, GB/s.
    pub bandwidth_gbps: [f64; 2],
    /// The source.
    pub cite: &'static str,
}

/// The seeds' testbeds (docs/emulation.md, /work/shared/reference/*.md).
pub const PRESETS: [Preset; 3] = [
    Preset {
        name: "nomad-a",
        // 316 and 854 cycles at 2.1 GHz.
        latency_ns: [316.0 / 2.1, 854.0 / 2.1],
        bandwidth_gbps: [31.45, 21.7],
        cite: "Nomad Table 1, platform A: DDR5 316 cycles, CXL (Agilex-7 FPGA) 854 cycles at 2.1 GHz; peak read 31.45 / 21.7 GB/s",
    },
    Preset {
        name: "colloid",
        latency_ns: [70.0, 135.0],
        bandwidth_gbps: [205.0, 75.0],
        cite: "Colloid section 5 testbed: local DDR4 70 ns, 205 GB/s; remote socket (CXL-like) 135 ns, UPI 75 GB/s",
    },
    Preset {
        name: "mtm-pm",
        latency_ns: [90.0, 275.0],
        bandwidth_gbps: [95.0, 35.0],
        cite: "MTM Table 1: local DRAM 90 ns, 95 GB/s; local Optane PM 275 ns, 35 GB/s",
    },
];

/// One emulated tier.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EmulatedTier {
    /// "fast" or "slow".
    pub name: String,
    /// Unloaded latency, ns.
    pub latency_ns: f64,
    /// Peak bandwidth, GB/s (the queueing model's capacity).
    pub bandwidth_gbps: f64,
    /// Utilization an antagonist adds on this tier (0 = none).
    pub antagonist: f64,
}

/// The validated `--emulate-latency` settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EmulationConfig {
    /// The preset the settings started from.
    pub preset: &'static str,
    /// Where the preset's numbers come from.
    pub cite: &'static str,
    /// Fast tier first.
    pub tiers: Vec<EmulatedTier>,
    /// Queueing coefficient `k` of `L(u) = L0 (1 + k u / (1 - u))`.
    pub queue_k: f64,
    /// Modeled last-level cache per vCPU, bytes (0: every access is charged).
    pub llc_bytes: u64,
    /// Whether `llc_bytes` came from this host's cache (else the fallback or the flag).
    pub llc_from_host: bool,
    /// Debt at which a vCPU pays, ns.
    pub pay_ns: f64,
    /// Access sampling: one cache-missing access in this many is looked up
    /// and charged this many times (1: every access; docs/emulation.md).
    pub sample_period: u32,
    /// Host DRAM latency to charge against, ns, instead of the guest's
    /// boot measurement (`host-dram=`; `compare` sets its first run's
    /// measurement for the others, so every policy is charged alike).
    pub host_dram_ns: Option<f64>,
    /// Keep a second, set-sampled model of the host's own LLC when the
    /// cache model is smaller than it (`host-cache=on|off`, on by default;
    /// docs/emulation.md, "Scaled cache models").
    pub host_cache: bool,
    /// Switch charging off and on within the run (`ab=on`; off by
    /// default): measures what emulation costs the workload side by side in
    /// one VM ([`super::region::AB_PHASE_OPS`], docs/emulation.md). The
    /// off halves are not charged, so such a run's op time is not the
    /// emulated one.
    pub ab: bool,
}

/// A `--emulate-latency` value that cannot be used; each message names the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmulationConfigError {
    /// An item that is neither a preset nor `key=value`.
    #[error("--emulate-latency: '{item}' is neither a preset ({}) nor key=value: write e.g. --emulate-latency fast=80ns,slow=250ns", preset_names())]
    BadItem {
        /// The item.
        item: String,
    },
    /// An unknown key.
    #[error("--emulate-latency: unknown key '{key}': use fast, slow, fast-bw, slow-bw, antagonist, queue-k, llc, pay, sample, host-dram, host-cache or ab")]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A latency that does not parse or is out of range.
    #[error(
        "--emulate-latency {key}={value}: give a latency from 1ns to 100us, e.g. 250ns or 1.2us"
    )]
    BadLatency {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// A bandwidth that does not parse or is out of range.
    #[error("--emulate-latency {key}={value}: give a bandwidth in GB/s above 0.001, e.g. 21.7")]
    BadBandwidth {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// An antagonist that is not `TIER:UTIL`.
    #[error("--emulate-latency antagonist={0}: write TIER:UTILIZATION with TIER fast or slow and 0 <= UTILIZATION < {MAX_UTILIZATION}, e.g. antagonist=fast:0.51 (Colloid's 1x)")]
    BadAntagonist(String),
    /// A queueing coefficient out of range.
    #[error("--emulate-latency queue-k={0}: give a number from 0 to 100 (the simulator uses 0.9)")]
    BadQueueK(String),
    /// A cache model size out of range.
    #[error("--emulate-latency llc={0}: give 0 (no cache model) or a power of two from {min} to {max}, e.g. llc=32M", min = format_size(LLC_RANGE.0), max = format_size(LLC_RANGE.1))]
    BadLlc(String),
    /// An access-sampling period that is not a power of two up to 64.
    #[error("--emulate-latency sample={0}: give a power of two from 1 (charge every access) to 64, e.g. sample=8")]
    BadSample(String),
    /// A `host-cache=` that is neither on nor off.
    #[error(
        "--emulate-latency host-cache={0}: write host-cache=on (the default) or host-cache=off"
    )]
    BadHostCache(String),
    /// An `ab=` that is neither on nor off.
    #[error("--emulate-latency ab={0}: write ab=on (charging switched off and on within the run, to measure what emulation costs) or ab=off (the default)")]
    BadAb(String),
    /// A payment threshold out of range.
    #[error("--emulate-latency pay={0}: give a threshold from 100ns to 1ms, e.g. pay=1us")]
    BadPay(String),
    /// More tiers than the tier map can name.
    #[error("--emulate-latency supports at most {EMULATION_MAX_TIERS} tiers (2-bit tier map); this VM has {0}: give at most {EMULATION_MAX_TIERS} --tier flags")]
    TooManyTiers(usize),
}

fn preset_names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a latency: `250ns`, `1.2us`, or a bare number of ns.
fn parse_latency_ns(v: &str) -> Option<f64> {
    let v = v.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e3)
    } else {
        (v, 1.0)
    };
    let ns = num.trim().parse::<f64>().ok()? * scale;
    (ns.is_finite() && (1.0..=100_000.0).contains(&ns)).then_some(ns)
}

/// Parses a bandwidth in GB/s: `21.7`, `21.7GB/s`, `21.7G`.
fn parse_gbps(v: &str) -> Option<f64> {
    let v = v.trim();
    let v = v
        .strip_suffix("GB/s")
        .or_else(|| v.strip_suffix('G'))
        .unwrap_or(v);
    let g = v.trim().parse::<f64>().ok()?;
    (g.is_finite() && g > 1e-3).then_some(g)
}

/// The host's last-level cache size, if sysfs says (the highest cache level
/// of cpu0).
pub fn host_llc_bytes() -> Option<u64> {
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, u64)> = None;
    for entry in std::fs::read_dir(base).ok()?.flatten() {
        let p = entry.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
        let (Some(level), Some(size), Some(kind)) = (read("level"), read("size"), read("type"))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let (Ok(level), Ok(size)) = (level.trim().parse::<u32>(), parse_size(size.trim())) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, s)| s)
}

/// A cache size rounded down to a power of two within [`LLC_RANGE`].
fn model_size(bytes: u64) -> u64 {
    let p = if bytes == 0 {
        0
    } else {
        1u64 << (63 - bytes.leading_zeros())
    };
    p.clamp(LLC_RANGE.0, LLC_RANGE.1)
}

impl EmulationConfig {
    /// The defaults of `preset`, the cache model sized to this host's LLC.
    pub fn preset(p: &Preset) -> Self {
        let host = host_llc_bytes();
        Self {
            preset: p.name,
            cite: p.cite,
            tiers: ["fast", "slow"]
                .iter()
                .enumerate()
                .map(|(i, name)| EmulatedTier {
                    name: (*name).into(),
                    latency_ns: p.latency_ns[i],
                    bandwidth_gbps: p.bandwidth_gbps[i],
                    antagonist: 0.0,
                })
                .collect(),
            queue_k: DEFAULT_QUEUE_K,
            llc_bytes: model_size(host.unwrap_or(FALLBACK_LLC_BYTES)),
            llc_from_host: host.is_some(),
            pay_ns: DEFAULT_PAY_NS,
            sample_period: DEFAULT_SAMPLE_PERIOD,
            host_dram_ns: None,
            host_cache: true,
            ab: false,
        }
    }

    /// Parses `SPEC`: comma-separated items, each a preset name (first) or
    /// `key=value` (`fast=`, `slow=` latency; `fast-bw=`, `slow-bw=` GB/s;
    /// `antagonist=TIER:UTIL`; `queue-k=`; `llc=SIZE|0`; `pay=LATENCY`;
    /// `sample=N`;
    /// `host-dram=LATENCY`; `host-cache=on|off`).
    /// An empty spec is the default preset.
    pub fn parse(spec: &str) -> Result<Self, EmulationConfigError> {
        let default = PRESETS
            .iter()
            .find(|p| p.name == DEFAULT_PRESET)
            .copied()
            .unwrap_or(PRESETS[0]);
        let mut cfg = Self::preset(&default);
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                match PRESETS.iter().find(|p| p.name == item) {
                    Some(p) => {
                        cfg = Self::preset(p);
                        continue;
                    }
                    None => return Err(EmulationConfigError::BadItem { item: item.into() }),
                }
            };
            cfg.apply(key.trim(), value.trim())?;
        }
        Ok(cfg)
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), EmulationConfigError> {
        let tier = |name: &str| usize::from(name != "fast");
        let bad_lat = || EmulationConfigError::BadLatency {
            key: key.into(),
            value: value.into(),
        };
        match key {
            "fast" | "slow" => {
                self.tiers[tier(key)].latency_ns = parse_latency_ns(value).ok_or_else(bad_lat)?;
            }
            "fast-bw" | "slow-bw" => {
                let t = tier(key.trim_end_matches("-bw"));
                self.tiers[t].bandwidth_gbps =
                    parse_gbps(value).ok_or_else(|| EmulationConfigError::BadBandwidth {
                        key: key.into(),
                        value: value.into(),
                    })?;
            }
            "antagonist" => {
                let (t, u) = parse_antagonist(value)
                    .ok_or_else(|| EmulationConfigError::BadAntagonist(value.into()))?;
                self.tiers[t].antagonist = u;
            }
            "queue-k" => {
                let k: f64 = value
                    .parse()
                    .ok()
                    .filter(|k: &f64| (0.0..=100.0).contains(k))
                    .ok_or_else(|| EmulationConfigError::BadQueueK(value.into()))?;
                self.queue_k = k;
            }
            "llc" => {
                self.llc_bytes =
                    parse_llc(value).ok_or_else(|| EmulationConfigError::BadLlc(value.into()))?;
                self.llc_from_host = false;
            }
            "sample" => {
                self.sample_period = value
                    .parse::<u32>()
                    .ok()
                    .filter(|p| p.is_power_of_two() && *p <= MAX_SAMPLE_PERIOD)
                    .ok_or_else(|| EmulationConfigError::BadSample(value.into()))?;
            }
            "host-cache" => {
                self.host_cache = parse_on_off(value)
                    .ok_or_else(|| EmulationConfigError::BadHostCache(value.into()))?;
            }
            "ab" => {
                self.ab =
                    parse_on_off(value).ok_or_else(|| EmulationConfigError::BadAb(value.into()))?;
            }
            "host-dram" => {
                self.host_dram_ns = Some(parse_latency_ns(value).ok_or_else(bad_lat)?);
            }
            "pay" => {
                self.pay_ns = parse_pay_ns(value)
                    .ok_or_else(|| EmulationConfigError::BadPay(value.into()))?;
            }
            _ => return Err(EmulationConfigError::UnknownKey { key: key.into() }),
        }
        Ok(())
    }

    /// The label every output carries: `emulated latency: fast 80 ns, slow 250 ns`.
    pub fn label(&self) -> String {
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .map(|t| format!("{} {:.0} ns", t.name, t.latency_ns))
            .collect();
        let mut s = format!("emulated latency: {}", tiers.join(", "));
        for t in self.tiers.iter().filter(|t| t.antagonist > 0.0) {
            s.push_str(&format!(
                " (antagonist {:.0}% of {} bandwidth)",
                t.antagonist * 100.0,
                t.name
            ));
        }
        if self.ab {
            s.push_str(" (ab=on: charging switched off and on within the run)");
        }
        s
    }

    /// The cache model is smaller than this host's last-level cache
    /// (`host_llc`, bytes; a scaled model, e.g. `llc=256K` for a scaled
    /// working set) and `host-cache=off`: then an access that misses the
    /// model but hits the host's cache is charged as if it had cost host
    /// DRAM, so for data that fits the host's cache the fast tier runs
    /// faster than emulated and a promotion can gain more than the tiers'
    /// gap (docs/results.md §9). `None` when the model is the host's size,
    /// there is none, or the host LLC model corrects the charge.
    pub fn cache_model_caveat(&self, host_llc: Option<u64>) -> Option<String> {
        let host = host_llc?;
        (!self.host_cache && self.llc_bytes > 0 && self.llc_bytes < host).then(|| {
            format!(
                "cache model {} is smaller than this host's {} LLC: an access that misses the model but hits the host's cache is charged as if it cost host DRAM, so data that fits the host's cache runs faster than emulated on the fast tier and promotions can gain more than the tiers' gap",
                format_size(self.llc_bytes),
                format_size(host)
            )
        })
    }

    /// The host LLC model the guest keeps (bytes: the host's LLC rounded
    /// down to a power of two), when `host-cache` is on and the cache model
    /// is smaller than that. Then an access the cache model misses but the
    /// host's cache serves is charged the host's DRAM minus LLC hit
    /// latency on top, so it costs what a cache-missing access costs.
    pub fn host_cache_model_bytes(&self, host_llc: Option<u64>) -> Option<u64> {
        let host = model_size(host_llc?);
        (self.host_cache && self.llc_bytes > 0 && self.llc_bytes < host).then_some(host)
    }

    /// What a cache-missing access costs on a host whose DRAM latency is
    /// `dram_ns`, per tier, unloaded: the host's latency plus the charge
    /// (`tiervm_guest::emulation::charge_base_ps`). Equal to the tiers'
    /// latencies when the host's DRAM is at most the fastest tier's.
    pub fn effective_ns(&self, dram_ns: f64) -> Vec<f64> {
        let fastest = self.tiers.first().map_or(0.0, |t| t.latency_ns);
        let base = dram_ns.min(fastest);
        self.tiers
            .iter()
            .map(|t| dram_ns + (t.latency_ns - base).max(0.0))
            .collect()
    }

    /// The queueing model of each tier (the simulator's [`TierModel`]).
    pub fn tier_models(&self) -> Vec<TierModel> {
        self.tiers
            .iter()
            .map(|t| TierModel {
                name: t.name.clone(),
                capacity_gib: 0.0,
                unloaded_ns: t.latency_ns,
                bandwidth_gbps: t.bandwidth_gbps,
                queue_k: self.queue_k,
                // The emulation's loaded latency counts both directions
                // against one bandwidth (docs/emulation.md).
                full_duplex: false,
            })
            .collect()
    }

    /// Checks the tier count of the VM against the 2-bit map.
    pub fn check_tiers(&self, tiers: usize) -> Result<(), EmulationConfigError> {
        if tiers > EMULATION_MAX_TIERS {
            return Err(EmulationConfigError::TooManyTiers(tiers));
        }
        Ok(())
    }
}

/// `antagonist=TIER:U`: the tier (0 fast, 1 slow) and its utilization
/// (`0 <= U < MAX_UTILIZATION`).
fn parse_antagonist(value: &str) -> Option<(usize, f64)> {
    let (t, u) = value.split_once(':')?;
    let t = match t.trim() {
        "fast" => 0,
        "slow" => 1,
        _ => return None,
    };
    let u: f64 = u.trim().parse().ok()?;
    (0.0..MAX_UTILIZATION).contains(&u).then_some((t, u))
}

/// `llc=SIZE|off`: 0 for off (or 0), else a power of two within [`LLC_RANGE`].
fn parse_llc(value: &str) -> Option<u64> {
    if value == "off" {
        return Some(0);
    }
    let b = parse_size(value).ok()?;
    (b == 0 || (b.is_power_of_two() && (LLC_RANGE.0..=LLC_RANGE.1).contains(&b))).then_some(b)
}

/// `on` or `off`.
fn parse_on_off(value: &str) -> Option<bool> {
    match value {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

/// `pay=LATENCY|DURATION` in ns, 100 ns to 1 ms.
fn parse_pay_ns(value: &str) -> Option<f64> {
    parse_latency_ns(value)
        .or_else(|| {
            crate::units::parse_duration(value)
                .ok()
                .map(|d| d.as_secs_f64() * 1e9)
        })
        .filter(|ns| (100.0..=1e6).contains(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_nomad_platform_a() {
        let c = EmulationConfig::parse("").unwrap();
        assert_eq!(c.preset, "nomad-a");
        assert!((c.tiers[0].latency_ns - 150.476).abs() < 0.01);
        assert!((c.tiers[1].latency_ns - 406.667).abs() < 0.01);
        assert_eq!(c.label(), "emulated latency: fast 150 ns, slow 407 ns");
        assert!(c.llc_bytes.is_power_of_two());
        assert_eq!(c.pay_ns, 1000.0);
    }

    #[test]
    fn a_model_below_the_host_llc_carries_a_caveat_and_sample_parses() {
        let scaled = EmulationConfig::parse("llc=256K").unwrap();
        // With the host LLC model (the default) there is nothing to warn
        // about: the model corrects the charge.
        assert_eq!(scaled.cache_model_caveat(Some(32 << 20)), None);
        assert_eq!(
            scaled.host_cache_model_bytes(Some(32 << 20)),
            Some(32 << 20)
        );
        assert_eq!(
            scaled.host_cache_model_bytes(Some(36 << 20)),
            Some(32 << 20)
        );
        assert_eq!(scaled.host_cache_model_bytes(None), None);
        let off = EmulationConfig::parse("llc=256K,host-cache=off").unwrap();
        assert_eq!(off.host_cache_model_bytes(Some(32 << 20)), None);
        let c = off.cache_model_caveat(Some(32 << 20)).unwrap();
        assert!(c.contains("256K") && c.contains("32M"), "{c}");
        assert!(matches!(
            EmulationConfig::parse("host-cache=maybe"),
            Err(EmulationConfigError::BadHostCache(_))
        ));
        assert!(EmulationConfig::parse("ab=on").unwrap().ab);
        assert!(EmulationConfig::parse("ab=on")
            .unwrap()
            .label()
            .contains("ab=on"));
        assert!(!EmulationConfig::parse("nomad-a").unwrap().ab);
        assert!(matches!(
            EmulationConfig::parse("ab=1"),
            Err(EmulationConfigError::BadAb(_))
        ));
        // The host's size, no model, or an unknown host: nothing to say.
        let full = EmulationConfig::parse("llc=32M").unwrap();
        assert_eq!(full.cache_model_caveat(Some(32 << 20)), None);
        assert_eq!(
            EmulationConfig::parse("llc=0")
                .unwrap()
                .cache_model_caveat(Some(32 << 20)),
            None
        );
        assert_eq!(scaled.cache_model_caveat(None), None);
        assert_eq!(scaled.sample_period, DEFAULT_SAMPLE_PERIOD);
        assert_eq!(EmulationConfig::parse("sample=1").unwrap().sample_period, 1);
        for bad in ["sample=3", "sample=0", "sample=128", "sample=x"] {
            assert!(
                matches!(
                    EmulationConfig::parse(bad),
                    Err(EmulationConfigError::BadSample(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn keys_override_the_preset() {
        let c = EmulationConfig::parse("colloid,fast=80ns,slow=0.25us,slow-bw=10,antagonist=fast:0.51,llc=0,pay=2us,queue-k=1.44")
            .unwrap();
        assert_eq!(c.preset, "colloid");
        assert_eq!(
            (c.tiers[0].latency_ns, c.tiers[1].latency_ns),
            (80.0, 250.0)
        );
        assert_eq!(c.tiers[0].bandwidth_gbps, 205.0);
        assert_eq!(c.tiers[1].bandwidth_gbps, 10.0);
        assert_eq!(c.tiers[0].antagonist, 0.51);
        assert_eq!(c.llc_bytes, 0);
        assert_eq!(c.pay_ns, 2000.0);
        assert_eq!(c.queue_k, 1.44);
        assert_eq!(
            c.label(),
            "emulated latency: fast 80 ns, slow 250 ns (antagonist 51% of fast bandwidth)"
        );
        assert_eq!(EmulationConfig::parse("llc=8M").unwrap().llc_bytes, 8 << 20);
        assert_eq!(
            EmulationConfig::parse("host-dram=165ns")
                .unwrap()
                .host_dram_ns,
            Some(165.0)
        );
    }

    #[test]
    fn bad_values_name_the_fix() {
        let e = |s: &str| EmulationConfig::parse(s).unwrap_err().to_string();
        assert!(e("bogus").contains("neither a preset"), "{}", e("bogus"));
        assert!(e("fast=0ns").contains("from 1ns to 100us"));
        assert!(e("slow=abc").contains("slow=abc"));
        assert!(e("fast-bw=0").contains("GB/s"));
        assert!(e("antagonist=fast:1.5").contains("TIER:UTILIZATION"));
        assert!(e("antagonist=mid:0.5").contains("TIER:UTILIZATION"));
        assert!(e("llc=3M").contains("power of two"));
        assert!(e("pay=1ns").contains("100ns to 1ms"));
        assert!(e("queue-k=-1").contains("0 to 100"));
        assert!(e("color=red").contains("unknown key 'color'"));
        assert!(EmulationConfig::parse("fast=80ns")
            .unwrap()
            .check_tiers(5)
            .is_err());
    }

    #[test]
    fn effective_costs_keep_the_differences_on_a_slow_host() {
        let c = EmulationConfig::parse("colloid").unwrap();
        assert_eq!(c.effective_ns(171.0), vec![171.0, 236.0]);
        assert_eq!(c.effective_ns(60.0), vec![70.0, 135.0]);
    }

    #[test]
    fn cache_sizes_round_to_a_power_of_two_in_range() {
        assert_eq!(model_size(48 << 20), 32 << 20);
        assert_eq!(model_size(1 << 10), 64 << 10);
        assert_eq!(model_size(8 << 30), 1 << 30);
    }
}
