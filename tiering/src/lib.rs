//! Tiered guest memory for tiervm.
//!
//! No KVM types appear in this crate's public API: the pieces that need KVM
//! (the dirty log, vCPU kicks) are small traits that the `vmm` crate
//! implements.
//!
//! - [`host`]: what the host offers (NUMA nodes, THP, userfaultfd, idle page tracking).
//! - [`host_support`]: for tests: skip (or, in strict mode, fail) without a host feature; watchdogs.
//! - [`inject`]: failure injection at the syscall layer (tests; `--test-fault-inject`).
//! - [`mem`]: tiered backing memory, dirty harvesting, access tracking and the
//!   migration mechanisms (transactional migration, stop-and-copy, shadows).
//! - [`policy`]: placement policies as pure code (observations in, decisions out).
//! - [`tracking`]: access trackers the kernel runs for us (DAMON).
//! - [`engine`]: the live per-VM loop that feeds observations to a policy and
//!   executes its decisions with the mechanisms.
//! - [`sys`]: the one audited module of raw system calls and ioctls.
//! - [`threads`]: the threads tiering runs and the hook each calls first (seccomp).
//! - [`test_point`]: where tests act deterministically inside a mechanism.
//! - [`vocab`]: the shared vocabulary (tiers, units, mechanisms).
//! - [`sim`]: a deterministic, trace-driven simulator that runs the same policies
//!   against modeled tiers.

pub mod engine;
pub mod host;
pub mod host_support;
pub mod inject;
pub mod mem;
pub mod policy;
pub mod sim;
pub mod sys;
pub mod test_point;
pub mod threads;
pub mod tracking;
pub mod vocab;
