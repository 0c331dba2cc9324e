//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use vmm::config::{VmConfig, VmRequest};
use vmm::devices::serial::Sink;
use vmm::report::RunReport;
use vmm::runner::{self, Console, NoHooks, RunHooks};

/// `true` if KVM is usable; otherwise prints why the test is skipped.
pub fn kvm_available(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIPPED {test}: /dev/kvm is not usable here ({e}); run on a host with KVM");
            false
        }
    }
}

/// A request for `image` with `args`, small defaults.
pub fn request(image: &str, mem: u64, vcpus: u32, duration: Duration, args: &[&str]) -> VmRequest {
    VmRequest {
        image: image.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        mem_bytes: mem,
        vcpus,
        duration,
        sample_ms: 50,
        seed: 7,
        stop_grace: Duration::from_secs(10),
        tiering: Default::default(),
        emulate_latency: None,
    }
}

/// Runs a request with hooks; returns the report and the console output.
pub fn run_with(req: &VmRequest, hooks: &mut dyn RunHooks) -> (RunReport, String) {
    let cfg = VmConfig::from_request(req).expect("valid request");
    let sink = Sink::memory();
    let report =
        runner::run(&cfg, Instant::now(), Console::Memory(sink.clone()), hooks).expect("run");
    (report, sink.contents())
}

/// Runs a request.
pub fn run(req: &VmRequest) -> (RunReport, String) {
    run_with(req, &mut NoHooks)
}

/// The tiervm binary.
pub fn tiervm() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_tiervm"))
}
