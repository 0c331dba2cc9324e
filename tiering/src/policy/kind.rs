//! [`PolicyKind`]: every placement policy by name, and what the engine, the
//! simulator and the command line need to know about one without building
//! it. Adding a policy means adding a variant here; the compiler then
//! points at every `match` that must handle it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{adaptive, colloid, memtis, mtm, nomad, static_placement, tpp};
use super::{Policy, PolicyConfig, PolicyError, TierId, TrackerRequest};

/// A placement policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// No migration: pages stay where they were placed.
    #[default]
    Static,
    /// Linux 6.3 TPP: hint faults on slow pages, promotion in the fault path.
    Tpp,
    /// Nomad: TPP's signal, candidate/pending queues, async TPM, shadows.
    Nomad,
    /// Memtis: access histogram, cooling, background migration.
    Memtis,
    /// Colloid: balances the tiers' loaded latencies.
    Colloid,
    /// MTM: adaptive regions, one histogram, fast promotion / slow demotion.
    Mtm,
    /// tiervm's own: budgeted profiling, per-migration mechanism choice,
    /// thrash throttling and Colloid balancing, with its mode explained.
    Adaptive,
    /// TPP with the active-LRU check the Nomad paper's TPP had.
    TppLru,
    /// Memtis with a short cooling period.
    MemtisQuickcool,
    /// Colloid's base tracker alone.
    ColloidBase,
}

/// Which period of a policy `--policy-interval` sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntervalKind {
    /// The migration interval (memtis' `kmigraterd`, MTM's profiling interval).
    Migration,
    /// Colloid's quantum.
    Quantum,
}

impl PolicyKind {
    /// The seven policies, in the order tables list them.
    pub const POLICIES: [Self; 7] = [
        Self::Static,
        Self::Tpp,
        Self::Nomad,
        Self::Memtis,
        Self::Colloid,
        Self::Mtm,
        Self::Adaptive,
    ];

    /// Variants of them the simulator also runs.
    pub const VARIANTS: [Self; 3] = [Self::TppLru, Self::MemtisQuickcool, Self::ColloidBase];

    /// Every kind: the policies, then the variants.
    pub const ALL: [Self; 10] = {
        let mut all = [Self::Static; 10];
        let mut i = 0;
        while i < all.len() {
            all[i] = if i < Self::POLICIES.len() {
                Self::POLICIES[i]
            } else {
                Self::VARIANTS[i - Self::POLICIES.len()]
            };
            i += 1;
        }
        all
    };

    /// The policy's name (what `--policy` and reports say).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Tpp => "tpp",
            Self::Nomad => "nomad",
            Self::Memtis => "memtis",
            Self::Colloid => "colloid",
            Self::Mtm => "mtm",
            Self::Adaptive => "adaptive",
            Self::TppLru => "tpp-lru",
            Self::MemtisQuickcool => "memtis-quickcool",
            Self::ColloidBase => "colloid-base",
        }
    }

    /// The kind whose [`name`](Self::name) is exactly `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The names of `kinds`, comma-separated (for messages).
    pub fn names(kinds: &[Self]) -> String {
        let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        names.join(", ")
    }

    /// Whether this is a variant of one of the policies.
    pub fn is_variant(self) -> bool {
        Self::VARIANTS.contains(&self)
    }

    /// Builds the policy for `config`.
    pub fn build(self, config: &PolicyConfig) -> Result<Box<dyn Policy>, PolicyError> {
        if config.pages == 0 || config.tier_capacity_pages.is_empty() {
            return Err(PolicyError::NoPagesOrTiers);
        }
        if config.tier_capacity_pages.len() > usize::from(TierId::MAX) {
            return Err(PolicyError::TooManyTiers {
                tiers: config.tier_capacity_pages.len(),
            });
        }
        Ok(match self {
            Self::Static => Box::new(static_placement::Static::new(config)),
            Self::Tpp => Box::new(tpp::Tpp::new(config)),
            Self::TppLru => Box::new(tpp::Tpp::with_active_lru_check(config)),
            Self::Nomad => Box::new(nomad::Nomad::new(config)),
            Self::Memtis => Box::new(memtis::Memtis::new(config, memtis::COOLING_PERIOD_SAMPLES)),
            Self::MemtisQuickcool => Box::new(memtis::Memtis::new(
                config,
                memtis::QUICK_COOL_PERIOD_SAMPLES,
            )),
            Self::Colloid => Box::new(colloid::Colloid::new(config)),
            Self::ColloidBase => Box::new(colloid::Colloid::base(config)),
            Self::Mtm => Box::new(mtm::Mtm::new(config)),
            Self::Adaptive => Box::new(adaptive::Adaptive::new(config)),
        })
    }

    /// The trackers the policy needs over memory shaped like `config`.
    pub fn trackers(self, config: &PolicyConfig) -> Result<TrackerRequest, PolicyError> {
        Ok(self.build(config)?.trackers())
    }

    /// Whether the policy decides its hint faults in the fault path: the
    /// faulting access waits for the decision and the copy, as in Linux.
    pub fn promotes_in_fault_path(self) -> bool {
        matches!(self, Self::Tpp | Self::TppLru)
    }

    /// The period `--policy-interval` sets, if the policy has one.
    pub fn interval_kind(self) -> Option<IntervalKind> {
        match self {
            Self::Memtis | Self::MemtisQuickcool | Self::Mtm => Some(IntervalKind::Migration),
            Self::Colloid | Self::ColloidBase => Some(IntervalKind::Quantum),
            Self::Static | Self::Tpp | Self::TppLru | Self::Nomad | Self::Adaptive => None,
        }
    }

    /// The papers' value of that period (memtis 0.5 s, MTM 10 s, Colloid 10 ms).
    pub fn default_interval(self) -> Option<Duration> {
        let ns = match self {
            Self::Memtis | Self::MemtisQuickcool => memtis::INTERVAL_NS,
            Self::Mtm => mtm::INTERVAL_NS,
            Self::Colloid | Self::ColloidBase => colloid::QUANTUM_NS,
            Self::Static | Self::Tpp | Self::TppLru | Self::Nomad | Self::Adaptive => return None,
        };
        Some(Duration::from_nanos(ns))
    }

    /// When the policy's first migration can come at the earliest, for a
    /// migration interval of `interval` (default: the paper's), if that is
    /// much later than the start (MTM profiles for a whole interval first).
    pub fn first_migration_after(self, interval: Option<Duration>) -> Option<Duration> {
        match self {
            Self::Mtm => Some(mtm::first_migration_after(
                interval.unwrap_or(Duration::from_nanos(mtm::INTERVAL_NS)),
            )),
            _ => None,
        }
    }

    /// Whether the policy reads the tiers' loaded latency (live, on hosts
    /// without latency counters, that latency is modeled).
    pub fn reads_loaded_latency(self) -> bool {
        matches!(self, Self::Colloid | Self::ColloidBase | Self::Adaptive)
    }

    /// Whether the policy reads the tiers' unloaded latency (live, measured
    /// at engine start unless latency emulation gives it).
    pub fn reads_unloaded_latency(self) -> bool {
        matches!(self, Self::Adaptive)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses a name, case-insensitively; `none` and `no-migration` mean `static`.
impl FromStr for PolicyKind {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let name = s.trim().to_ascii_lowercase();
        match name.as_str() {
            "none" | "no-migration" => Ok(Self::Static),
            n => Self::from_name(n).ok_or_else(|| PolicyError::UnknownPolicy { name: s.into() }),
        }
    }
}

impl Serialize for PolicyKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for PolicyKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(PolicyError::UnknownPolicy { name }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_parse_leniently() {
        for k in PolicyKind::ALL {
            assert_eq!(PolicyKind::from_name(k.name()), Some(k));
            assert_eq!(k.name().parse::<PolicyKind>().ok(), Some(k));
            assert_eq!(
                k.to_string().to_uppercase().parse::<PolicyKind>().ok(),
                Some(k)
            );
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
            assert_eq!(serde_json::from_str::<PolicyKind>(&json).unwrap(), k);
        }
        assert_eq!(
            " None ".parse::<PolicyKind>().ok(),
            Some(PolicyKind::Static)
        );
        assert!(matches!(
            "lru".parse::<PolicyKind>(),
            Err(PolicyError::UnknownPolicy { .. })
        ));
        assert_eq!(PolicyKind::from_name("Tpp"), None, "exact names only");
    }

    #[test]
    fn kinds_describe_the_policies_they_build() {
        let cfg = PolicyConfig::new(4096, vec![1024, 4096]);
        for k in PolicyKind::ALL {
            let p = k.build(&cfg).unwrap();
            assert_eq!(p.kind(), k);
            assert_eq!(k.is_variant(), !PolicyKind::POLICIES.contains(&k));
            // A policy with a settable interval ticks at it (MTM thrice per interval).
            if let Some(d) = k.default_interval() {
                let ticks = if k == PolicyKind::Mtm {
                    u64::from(mtm::NUM_SCANS)
                } else {
                    1
                };
                let ticked = p.tick_interval_ns() * ticks;
                assert!(
                    ticked.abs_diff(d.as_nanos() as u64) < ticks,
                    "{k}: {ticked}"
                );
            }
            assert_eq!(k.interval_kind().is_some(), k.default_interval().is_some());
        }
        assert!(PolicyKind::Tpp.promotes_in_fault_path());
        assert!(!PolicyKind::Nomad.promotes_in_fault_path());
    }

    /// What the engines ask of each kind besides its decisions: the trait's
    /// defaults (no refault, no mode, samples wanted) for every policy that
    /// does not change them; static's idle tick; MTM's profiling interval
    /// before its first migration; who reads which latency.
    #[test]
    fn kinds_answer_the_engines_questions() {
        let cfg = PolicyConfig::new(4096, vec![1024, 4096]);
        for k in PolicyKind::ALL {
            let mut p = k.build(&cfg).unwrap();
            assert!(!p.take_refault(), "{k}");
            if k != PolicyKind::Adaptive {
                assert!(p.mode().is_none(), "{k}");
                assert!(p.wants_samples(), "{k}");
            }
            assert!(p.tick_interval_ns() > 0, "{k}");
        }
        let st = PolicyKind::Static.build(&cfg).unwrap();
        assert_eq!(st.tick_interval_ns(), 1_000_000_000);
        let secs = Duration::from_secs;
        let mtm_default = Duration::from_nanos(mtm::INTERVAL_NS).mul_f64(4.0 / 3.0);
        assert_eq!(
            PolicyKind::Mtm.first_migration_after(None),
            Some(mtm_default)
        );
        assert_eq!(
            PolicyKind::Mtm.first_migration_after(Some(secs(3))),
            Some(secs(4))
        );
        let pick = |f: fn(PolicyKind) -> bool| -> Vec<&str> {
            PolicyKind::ALL
                .into_iter()
                .filter(|k| f(*k))
                .map(|k| k.name())
                .collect()
        };
        assert_eq!(
            pick(|k| k
                .first_migration_after(Some(Duration::from_secs(3)))
                .is_some()),
            ["mtm"]
        );
        assert_eq!(
            pick(PolicyKind::reads_loaded_latency),
            ["colloid", "adaptive", "colloid-base"]
        );
        assert_eq!(pick(PolicyKind::reads_unloaded_latency), ["adaptive"]);
    }

    /// Every kind once: the policies in order, then the variants.
    #[test]
    fn all_kinds_are_the_policies_then_the_variants() {
        let n = PolicyKind::POLICIES.len();
        assert_eq!(PolicyKind::ALL[..n], PolicyKind::POLICIES);
        assert_eq!(PolicyKind::ALL[n..], PolicyKind::VARIANTS);
    }

    /// A tier id is a `u8`: 255 tiers build, 256 are refused by name.
    #[test]
    fn the_most_tiers_a_policy_takes_is_the_largest_tier_id() {
        let tiers = |n: usize| PolicyConfig::new(4096, vec![16; n]);
        assert!(PolicyKind::Static.build(&tiers(255)).is_ok());
        assert!(matches!(
            PolicyKind::Static.build(&tiers(256)),
            Err(PolicyError::TooManyTiers { tiers: 256 })
        ));
    }
}
