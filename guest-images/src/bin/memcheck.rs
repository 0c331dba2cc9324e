//! The `memcheck` guest image: see [`tiervm_guest::workloads::memcheck`].
#![no_std]
#![no_main]

tiervm_guest::image!(
    tiervm_guest::workloads::memcheck::run,
    &tiervm_guest::workloads::memcheck::SPEC
);
