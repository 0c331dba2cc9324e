//! tiervm's VMM core: the KVM VM and its vCPUs (`vstate`), the KVM dirty
//! log, guest loading (`image`), the port devices, latency emulation,
//! seccomp, signals, host permissions, the guest's status page, the run
//! loop (`runner`), the validated VM configuration and the report data.
//! The tiering itself lives in the `tiering` crate behind small traits.
//!
//! No command line, no service: `tiervm-service` and the `tiervm` binary
//! build on this crate, never the other way round (docs/architecture.md).

pub mod ab;
pub mod choice;
pub mod config;
pub mod devices;
pub mod emulation;
pub mod exit;
pub mod guest_abi;
pub mod image;
pub mod kvm_dirty_log;
pub mod liveness;
pub mod permissions;
pub mod report;
pub mod runner;
pub mod seccomp;
pub mod signals;
pub mod status;
pub mod tiering_config;
pub mod units;
pub mod vstate;
pub mod workload_args;
