//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use vmm_core::config::{VmConfig, VmRequest};
use vmm_core::devices::serial::Sink;
use vmm_core::report::RunReport;
use vmm_core::runner::{self, Console, NoHooks, RunHooks};

pub use tiering::host_support::{watchdog, HostFeature};

/// Bound of one VM test (a hang fails with a message instead of stalling CI).
pub const VM_TEST_LIMIT: Duration = Duration::from_secs(180);

/// `true` if KVM is usable; otherwise the test skips with the reason, or
/// fails in strict mode (`TIERVM_REQUIRE_KVM=1`). Arms nothing.
pub fn kvm_available(_test: &str) -> bool {
    tiering::host_support::require(&[HostFeature::Kvm])
}

/// `true` if KVM and tiered memory (userfaultfd with MOVE) are usable;
/// otherwise skips, or fails in strict mode.
pub fn tiered_kvm_available() -> bool {
    tiering::host_support::require(&[HostFeature::Kvm, HostFeature::UserfaultfdMove])
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
        seccomp: true,
    }
}

/// Runs a request with hooks; returns the report and the console output.
/// The run is bounded by a [`watchdog`] of [`VM_TEST_LIMIT`].
pub fn run_with(req: &VmRequest, hooks: &mut dyn RunHooks) -> (RunReport, String) {
    let _bound = watchdog(VM_TEST_LIMIT);
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

/// Bound of one `tiervm` process started by a test.
pub const PROCESS_LIMIT: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion within `limit`, else kills it and fails the
/// test with a message. Returns (exit code, stdout, stderr); the exit code
/// is `128 + signal` when a signal ended the process.
pub fn output_within(cmd: &mut std::process::Command, limit: Duration) -> (i32, String, String) {
    use std::io::Read as _;
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::Stdio;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning tiervm");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for tiervm") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} still running after {:.0} s: killed (a hang is a failure)",
                limit.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    (
        code,
        String::from_utf8_lossy(&out_t.join().unwrap()).into_owned(),
        String::from_utf8_lossy(&err_t.join().unwrap()).into_owned(),
    )
}

/// Runs tiervm with `args` within [`PROCESS_LIMIT`]; (exit code, stdout, stderr).
pub fn tv(args: &[&str]) -> (i32, String, String) {
    output_within(tiervm().args(args), PROCESS_LIMIT)
}

/// Writes a copy of the zipf image whose entry code is `code` to a
/// temporary file named `name`; returns its path.
pub fn image_with_entry_code(name: &str, code: &[u8]) -> std::path::PathBuf {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let mut b = vmm_core::image::builtin_bytes("zipf").unwrap().to_vec();
    let h = object::elf::FileHeader64::<object::Endianness>::parse(&b[..]).unwrap();
    let e = h.endian().unwrap();
    let entry = h.e_entry(e);
    let off = h
        .program_headers(e, &b[..])
        .unwrap()
        .iter()
        .find(|ph| {
            ph.p_type(e) == object::elf::PT_LOAD
                && entry >= ph.p_vaddr(e)
                && entry < ph.p_vaddr(e) + ph.p_filesz(e)
        })
        .map(|ph| (ph.p_offset(e) + entry - ph.p_vaddr(e)) as usize)
        .unwrap();
    b[off..off + code.len()].copy_from_slice(code);
    let dir = std::env::temp_dir().join(format!("tiervm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    p
}

/// A hook that stops the run once `done` holds for the tiered memory's
/// counters and the guest has reported operations: tests wait for events,
/// not for a fixed time (the run's `--duration` and the watchdog bound the
/// wait). A workload reports operations from its run phase on, after its
/// init; a stop asked for during init is forced after the runner's
/// `STOP_ACK_GRACE` (memcheck's init stamps its whole region without
/// looking at the stop flag), and a forced run has no exit code.
pub struct UntilEvents<F: FnMut(&tiering::mem::MemStats) -> bool> {
    mem: Option<std::sync::Arc<tiering::mem::TieredMemory>>,
    done: F,
    /// Whether a status sample has shown guest operations.
    guest_ran: bool,
    /// Whether `done` held when the run stopped.
    pub reached: bool,
}

impl<F: FnMut(&tiering::mem::MemStats) -> bool> UntilEvents<F> {
    /// Stops the run when `done(stats)` is true.
    pub fn new(done: F) -> Self {
        Self {
            mem: None,
            done,
            guest_ran: false,
            reached: false,
        }
    }
}

impl<F: FnMut(&tiering::mem::MemStats) -> bool> RunHooks for UntilEvents<F> {
    fn on_start(&mut self, tiered: Option<&std::sync::Arc<tiering::mem::TieredMemory>>) {
        self.mem = tiered.cloned();
    }

    fn on_sample(&mut self, ctx: &runner::SampleCtx<'_>) {
        self.guest_ran |= ctx.ops > 0;
    }

    fn wants_stop(&mut self) -> bool {
        if !self.reached && self.guest_ran {
            if let Some(m) = &self.mem {
                self.reached = (self.done)(&m.stats());
            }
        }
        self.reached
    }
}
