//! The `zipf` guest image: see [`tiervm_guest::workloads::zipf`].
#![no_std]
#![no_main]

tiervm_guest::image!(
    tiervm_guest::workloads::zipf::run,
    &tiervm_guest::workloads::zipf::SPEC
);
