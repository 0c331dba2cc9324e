//! The `kv` guest image: see [`tiervm_guest::workloads::kv`].
#![no_std]
#![no_main]

tiervm_guest::image!(
    tiervm_guest::workloads::kv::run,
    &tiervm_guest::workloads::kv::SPEC
);
