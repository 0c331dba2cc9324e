//! tiervm: a KVM virtual machine monitor whose guest RAM lives on tiered host
//! memory. This crate holds everything KVM-specific: the VM and vCPUs, guest
//! loading, the port devices, the run loop and the `tiervm` subcommands. The
//! tiering itself lives in the `tiering` crate behind small traits.
//!
//! See `docs/architecture.md` for the threads and the data path.

pub mod ab;
pub mod commands;
pub mod config;
pub mod devices;
pub mod emulation;
pub mod error;
pub mod image;
pub mod kvm_dirty_log;
pub mod output;
pub mod permissions;
pub mod plot;
pub mod progress;
pub mod report;
pub mod runner;
pub mod seccomp;
pub mod serve;
pub mod signals;
pub mod status;
pub mod tiering_config;
pub mod units;
pub mod vstate;
