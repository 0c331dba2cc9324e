//! The `gups` guest image: see [`tiervm_guest::workloads::gups`].
#![no_std]
#![no_main]

tiervm_guest::image!(
    tiervm_guest::workloads::gups::run,
    &tiervm_guest::workloads::gups::SPEC
);
