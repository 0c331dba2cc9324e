//! Workload generators shared by the guest images and the host-side simulator.
//!
//! Everything here is `no_std`, allocation-free and deterministic for a given
//! seed, so a trace generated on the host is the one the guest would issue.

pub mod rng;
pub mod zipf;

pub use rng::Rng;
pub use zipf::Zipf;
