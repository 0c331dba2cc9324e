//! The `pagerank` guest image: see [`tiervm_guest::workloads::pagerank`].
#![no_std]
#![no_main]

tiervm_guest::image!(
    tiervm_guest::workloads::pagerank::run,
    &tiervm_guest::workloads::pagerank::SPEC
);
