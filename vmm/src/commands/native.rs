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

use crate::commands::run::ReportFormat;
use crate::config::{check_args, check_sample_ms, parse_kv, to_entries};
use crate::error::{Error, Result};
use crate::report::group;
use crate::status::{ops_per_sec, TimelinePoint};
use crate::units::parse_duration;
use crate::vstate::memory::create_ram;
use tiervm_guest::abi::{GUEST_LARGE_PAGE, MAX_VCPUS};
use vm_memory::{GuestAddress, GuestMemoryBackend};

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
        // SAFETY: rdtsc only reads the time-stamp counter.
        unsafe { core::arch::x86_64::_rdtsc() }
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

/// Runs the workload natively; returns the process exit code.
pub fn run(args: &NativeArgs) -> Result<i32> {
    let spec = workloads::image_spec(&args.image).ok_or_else(|| {
        Error::Usage(format!(
            "tiervm native runs built-in workloads only; '{}' is not one of {}",
            args.image,
            crate::image::builtin_names().join(", ")
        ))
    })?;
    if args.threads == 0 {
        return Err(Error::Usage("--threads 0: use --threads 1 or more".into()));
    }
    if args.threads as usize > MAX_VCPUS {
        return Err(Error::Usage(format!(
            "--threads {} exceeds the {MAX_VCPUS} maximum (the most vCPUs a VM run has): give at most {MAX_VCPUS}",
            args.threads
        )));
    }
    check_sample_ms(args.sample_ms)?;
    let kv = parse_kv(&args.args)?;
    check_args(spec.name, spec, &kv)?;
    crate::signals::install()?;
    let entries = to_entries(&kv)?;
    let need = workloads::heap_need(spec.name, &GuestArgs::new(&entries, Some(spec))).unwrap_or(0);
    // The same backing as a VM's RAM: anonymous, private, transparent huge pages.
    let bytes = need.div_ceil(GUEST_LARGE_PAGE) * GUEST_LARGE_PAGE;
    let ram = create_ram(bytes, true)?;
    let host = ram
        .get_host_address(GuestAddress(0))
        .map_err(|e| Error::host("native memory address", e))?;
    let words = usize::try_from(bytes / 8)
        .map_err(|_| Error::Usage("data set too large for this host".into()))?;
    // SAFETY: `ram` maps `bytes` bytes of zeroed, page-aligned anonymous
    // memory that lives until the end of this function (after every worker
    // thread joined); AtomicU64 has no invalid bit patterns and is only
    // accessed atomically.
    let mem: &[AtomicU64] = unsafe { std::slice::from_raw_parts(host.cast::<AtomicU64>(), words) };
    let stop = AtomicBool::new(false);
    let counters: Vec<AtomicU64> = (0..args.threads).map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(args.threads as usize);
    let exit_sum = AtomicU32::new(0);
    let tsc_khz = measure_tsc_khz();
    let timeline = Mutex::new(Vec::new());
    let metrics = Mutex::new(std::collections::BTreeMap::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for i in 0..args.threads {
            let env = HostEnv {
                vcpu: i,
                vcpus: args.threads,
                seed: args.seed,
                entries: &entries,
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
        while start.elapsed() < args.duration && crate::signals::received().is_none() {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(5)));
                continue;
            }
            next = now + sample;
            let ops = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            timeline
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(TimelinePoint {
                    t_s: start.elapsed().as_secs_f64(),
                    ops,
                });
        }
        stop.store(true, Ordering::Relaxed);
    });
    let timeline = timeline.into_inner().unwrap_or_else(|p| p.into_inner());
    let ops = counters.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let report = NativeReport {
        image: spec.name.into(),
        threads: args.threads,
        duration_s: start.elapsed().as_secs_f64(),
        exit_code: exit_sum.load(Ordering::Acquire),
        ops,
        ops_per_sec: ops_per_sec(&timeline),
        timeline,
        guest_metrics: metrics.into_inner().unwrap_or_else(|p| p.into_inner()),
    };
    let text = match args.report {
        ReportFormat::Json => format!(
            "{}\n",
            serde_json::to_string(&report).map_err(|e| Error::host("encoding the report", e))?
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
    crate::output::stdout(&text)?;
    if let Some(sig) = crate::signals::received() {
        return Ok(crate::signals::exit_code(sig));
    }
    Ok(if report.exit_code == 0 { 0 } else { 1 })
}

fn measure_tsc_khz() -> u64 {
    let t0 = Instant::now();
    // SAFETY: rdtsc only reads the time-stamp counter.
    let c0 = unsafe { core::arch::x86_64::_rdtsc() };
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: as above.
    let c1 = unsafe { core::arch::x86_64::_rdtsc() };
    (c1.wrapping_sub(c0) * 1000 / (t0.elapsed().as_micros().max(1) as u64)).max(1)
}
