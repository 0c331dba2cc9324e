#![no_std]
pub mod abi {}
#[cfg(feature = "image")]
pub mod rt {}
