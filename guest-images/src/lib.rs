//! tiervm's guest side: the ABI shared with the VMM, the workload generators,
//! the workloads themselves (runnable in a guest and natively on the host),
//! and, with the `image` feature, the ring-3 runtime the guest images link.
#![cfg_attr(not(test), no_std)]

pub mod abi;
pub mod args;
pub mod emulation;
pub mod gen;
pub mod workloads;

#[cfg(feature = "image")]
pub mod rt;
