//! `tiervm native`: runs a built-in workload's own code on host threads,
//! with no VM, as the baseline for "how much does running inside tiervm
//! cost" (same generator, same loop, same arguments).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use tiervm_guest::abi::{ArgEntry, Phase};
use tiervm_guest::args::{Args as GuestArgs, ImageSpec};
use tiervm_guest::workloads::{self, Env};

use crate::error::{NativeError, OutputError, Result};
use crate::flags::ReportFormat;
use vmm_core::workload_args::{check_args, parse_kv, to_entries};

use tiervm_guest::abi::{GUEST_LARGE_PAGE, MAX_VCPUS};
use vm_memory::{GuestAddress, GuestMemoryBackend};
use vmm_core::status::{ops_per_sec, TimelinePoint};
use vmm_core::units::group;
use vmm_core::units::parse_duration;
use vmm_core::vstate::memory::create_ram;

/// Flags of `tiervm native`.
#[derive(Clone, Debug, Args)]
pub struct NativeArgs {
    /// Built-in image whose workload to run (zipf, gups, memcheck, kv, pagerank).
    #[arg(default_value = "zipf")]
    pub image: String,
    /// Worker threads (the vCPU count of the VM run to compare with).
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Run length.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Workload parameter key=value (repeatable).
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sampling period in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub sample_ms: u64,
    /// Report format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Human)]
    pub report: ReportFormat,
}

/// Result of a native run (a subset of the VM report's fields).
#[derive(Clone, Debug, Serialize)]
pub struct NativeReport {
    /// Image whose workload ran.
    pub image: String,
    /// Worker threads.
    pub threads: u32,
    /// Seconds.
    pub duration_s: f64,
    /// Sum of the workers' return values.
    pub exit_code: u32,
    /// Total operations.
    pub ops: u64,
    /// Operations per second while counting.
    pub ops_per_sec: f64,
    /// Throughput timeline.
    pub timeline: Vec<TimelinePoint>,
    /// Metrics the workload published (same names as in a VM run).
    pub guest_metrics: std::collections::BTreeMap<String, f64>,
}

struct HostEnv<'a> {
    vcpu: u32,
    vcpus: u32,
    seed: u64,
    entries: &'a [ArgEntry],
    spec: &'static ImageSpec,
    stop: &'a AtomicBool,
    ops: &'a AtomicU64,
    barrier: &'a Barrier,
    tsc_khz: u64,
    metrics: &'a Mutex<std::collections::BTreeMap<String, f64>>,
}

/// Host runs have no latency emulation: accesses cost what they cost.
impl tiervm_guest::workloads::Charge for HostEnv<'_> {}

impl Env for HostEnv<'_> {
    fn vcpu(&self) -> u32 {
        self.vcpu
    }
    fn vcpus(&self) -> u32 {
        self.vcpus
    }
    fn seed(&self) -> u64 {
        self.seed
    }
    fn args(&self) -> GuestArgs<'_> {
        GuestArgs::new(self.entries, Some(self.spec))
    }
    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn set_ops(&self, ops: u64) {
        self.ops.store(ops, Ordering::Relaxed)
    }
    fn set_phase(&self, _: Phase) {}
    fn cycles(&self) -> u64 {
        vmm_core::vstate::vcpu::read_tsc()
    }
    fn tsc_khz(&self) -> u64 {
        self.tsc_khz
    }
    fn barrier(&self) {
        self.barrier.wait();
    }
    fn metric(&self, name: &str, value: f64) {
        self.metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), value);
    }
    fn log(&self, msg: &str) {
        eprintln!("[native {}] {msg}", self.vcpu);
    }
}

/// Runs the workload natively; returns the process exit code: checks the
/// image and its arguments, maps the data set as a VM's RAM would be, runs
/// the workload on host threads for `--duration`, and prints the report.
pub fn run(args: &NativeArgs) -> Result<i32> {
    let spec = workloads::image_spec(&args.image).ok_or_else(|| NativeError::NotBuiltin {
        image: args.image.clone(),
    })?;
    if args.threads == 0 {
        return Err(NativeError::NoThreads.into());
    }
    if args.threads as usize > MAX_VCPUS {
        return Err(NativeError::TooManyThreads {
            threads: args.threads,
        }
        .into());
    }
    vmm_core::config::check_sample_ms(args.sample_ms).map_err(NativeError::SamplePeriod)?;
    vmm_core::signals::install()?;
    let kv = parse_kv(&args.args)?;
    check_args(spec.name, spec, &kv)?;
    let entries = to_entries(&kv)?;
    let need = workloads::heap_need(spec.name, &GuestArgs::new(&entries, Some(spec))).unwrap_or(0);
    // The same backing as a VM's RAM: anonymous, private, transparent huge pages.
    let bytes = need.div_ceil(GUEST_LARGE_PAGE) * GUEST_LARGE_PAGE;
    let ram = create_ram(bytes, true)?;
    let host = ram
        .get_host_address(GuestAddress(0))
        .map_err(NativeError::HostAddress)?;
    let words = usize::try_from(bytes / 8).map_err(|_| NativeError::TooLarge)?;
    // SAFETY: `ram` maps `bytes` bytes of zeroed, page-aligned anonymous
    // memory that lives until the end of this function, after
    // `run_workload` joined every worker thread; AtomicU64 has no invalid
    // bit patterns and the memory is only accessed through this slice.
    let mem: &[AtomicU64] = unsafe { std::slice::from_raw_parts(host.cast::<AtomicU64>(), words) };
    let report = run_workload(args, spec, &entries, mem);
    print_report(args, &report)?;
    if let Some(sig) = vmm_core::signals::received() {
        return Ok(vmm_core::signals::exit_code(sig));
    }
    Ok(if report.exit_code == 0 { 0 } else { 1 })
}

/// Runs `spec` on `args.threads` scoped host threads over `mem`, sampling
/// their operation counts every `--sample-ms` until `--duration`, then
/// asks them to stop and waits for them.
fn run_workload(
    args: &NativeArgs,
    spec: &'static ImageSpec,
    entries: &[ArgEntry],
    mem: &[AtomicU64],
) -> NativeReport {
    let stop = AtomicBool::new(false);
    let counters: Vec<AtomicU64> = (0..args.threads).map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(args.threads as usize);
    let exit_sum = AtomicU32::new(0);
    let tsc_khz = vmm_core::vstate::vcpu::measure_host_tsc_khz();
    let mut timeline = Vec::new();
    let metrics = Mutex::new(std::collections::BTreeMap::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for i in 0..args.threads {
            let env = HostEnv {
                vcpu: i,
                vcpus: args.threads,
                seed: args.seed,
                entries,
                spec,
                stop: &stop,
                ops: &counters[i as usize],
                barrier: &barrier,
                tsc_khz,
                metrics: &metrics,
            };
            let exit_sum = &exit_sum;
            s.spawn(move || {
                let code = workloads::run_by_name(spec.name, &env, mem).unwrap_or(u32::MAX);
                let _ = exit_sum.fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                    Some(x.saturating_add(code))
                });
            });
        }
        let sample = Duration::from_millis(args.sample_ms);
        let mut next = start + sample;
        // The deadline and signals are checked every 5 ms, not per sample.
        while start.elapsed() < args.duration && vmm_core::signals::received().is_none() {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(5)));
                continue;
            }
            next = now + sample;
            timeline.push(TimelinePoint {
                t_s: start.elapsed().as_secs_f64(),
                ops: counters.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
            });
        }
        stop.store(true, Ordering::Relaxed);
    });
    let ops = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    NativeReport {
        image: spec.name.into(),
        threads: args.threads,
        duration_s: start.elapsed().as_secs_f64(),
        exit_code: exit_sum.load(Ordering::Acquire),
        ops,
        ops_per_sec: ops_per_sec(&timeline),
        timeline,
        guest_metrics: metrics.into_inner().unwrap_or_else(|p| p.into_inner()),
    }
}

/// The report as JSON or one line, on stdout.
fn print_report(args: &NativeArgs, report: &NativeReport) -> Result<()> {
    let text = match args.report {
        ReportFormat::Json => format!(
            "{}\n",
            serde_json::to_string(report).map_err(|source| OutputError::Encode {
                what: "the report",
                source,
            })?
        ),
        ReportFormat::Human => format!(
            "tiervm native: {} on {} host thread(s): {} ops, {} ops/s, exit code {}\n",
            report.image,
            report.threads,
            group(report.ops),
            group(report.ops_per_sec as u64),
            report.exit_code
        ),
    };
    crate::output::stdout(&text)
}
