//! The errors of the subcommands that have their own: `compare`, `info`,
//! `native` and `sim`. [`super::Error`] gathers them with the rest.

use std::io;
use std::path::PathBuf;

use tiering::sim;
use tiervm_guest::abi::MAX_VCPUS;
use vmm_core::tiering_config::PolicyArg;

use super::Error;
use crate::flags::MAX_REPEAT;
use crate::presentation::plot;

/// `tiervm compare` cannot run or write what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// `--repeat 0`.
    #[error("--repeat 0: give at least 1 run per policy")]
    NoRepeat,
    /// `--repeat` beyond [`MAX_REPEAT`].
    #[error("--repeat {repeat} exceeds the {MAX_REPEAT} maximum: give at most {MAX_REPEAT} runs per policy")]
    TooManyRepeats {
        /// Runs asked for.
        repeat: u32,
    },
    /// `--policies` resolves to nothing.
    #[error("no policies to compare: name them with --policies, e.g. --policies static,chaos")]
    NoPolicies,
    /// `--policies` names something unknown.
    #[error("--policies: unknown policy '{name}': choose from {}", .known.join(", "))]
    UnknownPolicy {
        /// The name given.
        name: String,
        /// The valid names.
        known: Vec<String>,
    },
    /// `--policies` names a policy twice.
    #[error("--policies names '{0}' twice: list each policy once and use --repeat for more runs")]
    DuplicatePolicy(String),
    /// Chaos flags without the chaos policy.
    #[error("--chaos-rate/--chaos-mix/--mechanism/--chaos-unit only apply to the chaos policy: add chaos to --policies or drop them")]
    ChaosFlagsWithoutChaos,
    /// One policy's VM settings are invalid.
    #[error("policy {policy}")]
    Policy {
        /// The policy.
        policy: PolicyArg,
        /// What is wrong with its VM.
        #[source]
        source: Box<Error>,
    },
    /// `--out` cannot be created.
    #[error("creating --out {} (pick a writable directory)", .dir.display())]
    CreateOut {
        /// The directory.
        dir: PathBuf,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
    /// An output file cannot be written.
    #[error("writing {} (check --out and free space)", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
    /// A plot cannot be drawn.
    #[error("{file}")]
    Plot {
        /// The SVG file.
        file: &'static str,
        /// The reason.
        #[source]
        source: plot::PlotError,
    },
}

impl CompareError {
    /// The process exit code: 2 for bad input, 1 for the host.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Policy { source, .. } => source.exit_code(),
            Self::CreateOut { .. } | Self::Write { .. } | Self::Plot { .. } => super::EXIT_HOST,
            _ => super::EXIT_USAGE,
        }
    }
}

/// Why `tiervm info` could not print its report (probing itself never fails).
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// Writing to stdout failed (a closed pipe is not a failure).
    #[error("cannot write the report to stdout")]
    Stdout(#[source] io::Error),
    /// Serializing the JSON report failed.
    #[error("cannot serialize the report as JSON")]
    Json(#[from] serde_json::Error),
}

/// `tiervm native` cannot run what was asked.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// Not a built-in workload.
    #[error("tiervm native runs built-in workloads only; '{image}' is not one of {}", vmm_core::image::builtin_names().join(", "))]
    NotBuiltin {
        /// The image given.
        image: String,
    },
    /// `--threads 0`.
    #[error("--threads 0: use --threads 1 or more")]
    NoThreads,
    /// More threads than a VM has vCPUs.
    #[error("--threads {threads} exceeds the {MAX_VCPUS} maximum (the most vCPUs a VM run has): give at most {MAX_VCPUS}")]
    TooManyThreads {
        /// Threads asked for.
        threads: u32,
    },
    /// `--sample-ms` out of range.
    #[error(transparent)]
    SamplePeriod(#[from] vmm_core::config::ConfigError),
    /// The data set does not fit the address space.
    #[error("data set too large for this host")]
    TooLarge,
    /// The data set's mapping has no host address.
    #[error("native memory address")]
    HostAddress(#[source] vm_memory::GuestMemoryError),
}

impl NativeError {
    /// Whether the user's input is at fault (exit code 2).
    pub fn is_usage(&self) -> bool {
        !matches!(self, Self::HostAddress(_))
    }
}

/// Errors of `tiervm sim`.
#[derive(Debug, thiserror::Error)]
pub enum SimCmdError {
    /// No scenario named.
    #[error(
        "name a scenario (tiervm sim SCENARIO)\n{}",
        crate::presentation::sim::list()
    )]
    NoScenario,
    /// No such scenario.
    #[error("unknown scenario `{name}`; valid: {} (see tiervm sim --list)", sim::builtin_names().join(", "))]
    UnknownScenario {
        /// The name given.
        name: String,
    },
    /// A per-tier list of the wrong length.
    #[error("--{flag} needs {tiers} comma-separated values (one per tier), got {got}")]
    TierListLength {
        /// The flag.
        flag: &'static str,
        /// Tiers in the scenario.
        tiers: usize,
        /// Values given.
        got: usize,
    },
    /// A flag about the benchmark's initialization on a scenario without one.
    #[error("{0} needs a scenario with the benchmark's initialization (nomad-*), and no --no-bench-init")]
    NoBenchInit(&'static str),
    /// `--kv-workload` is not a YCSB mix.
    #[error("--kv-workload must be a, b, c or f, got `{0}`")]
    KvWorkload(String),
    /// `--graph` is not a generator.
    #[error("--graph must be uniform or rmat, got `{0}`")]
    Graph(String),
    /// `--free-reserve-bp` is not under the whole tier.
    #[error("--free-reserve-bp counts per 10,000 of the tier and must be under 10000, got {0}")]
    FreeReserve(u16),
    /// A policy name does not parse.
    #[error(transparent)]
    Policy(#[from] tiering::policy::PolicyError),
    /// The simulator refused the scenario or a policy.
    #[error(transparent)]
    Sim(#[from] sim::SimError),
    /// `--division-pool` or `--division-quantum` not a positive size.
    #[error("--division-pool {pool} and --division-quantum {quantum} must be positive GiB (e.g. --division-pool 4 --division-quantum 0.25)")]
    DivisionSizes {
        /// `--division-pool`.
        pool: f64,
        /// `--division-quantum`.
        quantum: f64,
    },
    /// JSON encoding failed.
    #[error("cannot encode the report as JSON")]
    Json(#[from] serde_json::Error),
}
