//! The `tiervm` binary on bad input: one-line messages naming the problem
//! and the fix, exit code 2; guest crashes exit 3 with registers; hostile
//! guests cannot hang or crash the VMM.

mod common;

use std::path::PathBuf;

use common::{kvm_available, tv};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{elf, Endianness};

fn zipf_bytes() -> Vec<u8> {
    vmm_core::image::builtin_bytes("zipf").unwrap().to_vec()
}

fn write_tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiervm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// File offset of the entry point and of each program header.
fn layout(bytes: &[u8]) -> (usize, Vec<usize>) {
    let h = elf::FileHeader64::<Endianness>::parse(bytes).unwrap();
    let e = h.endian().unwrap();
    let entry = h.e_entry(e);
    let phoff = h.e_phoff(e) as usize;
    let mut entry_off = 0;
    let mut phs = Vec::new();
    for (i, ph) in h.program_headers(e, bytes).unwrap().iter().enumerate() {
        phs.push(phoff + i * 56);
        let (va, sz) = (ph.p_vaddr(e), ph.p_filesz(e));
        if ph.p_type(e) == elf::PT_LOAD && entry >= va && entry < va + sz {
            entry_off = (ph.p_offset(e) + entry - va) as usize;
        }
    }
    (entry_off, phs)
}

/// The zipf image with its entry code replaced by `code`.
fn with_entry_code(code: &[u8]) -> Vec<u8> {
    let mut b = zipf_bytes();
    let (off, _) = layout(&b);
    b[off..off + code.len()].copy_from_slice(code);
    b
}

fn usage_error(args: &[&str], expect: &str) {
    let (code, _, err) = tv(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(err.contains(expect), "{args:?}: '{err}' lacks '{expect}'");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
}

#[test]
fn bad_flags_and_images_exit_2_with_one_line() {
    usage_error(&["run", "--vcpus", "0"], "--vcpus 0");
    usage_error(&["run", "--mem", "16M"], "raise --mem to at least");
    usage_error(&["run", "--mem", "100G"], "exceeds this host's memory");
    usage_error(&["run", "--mem", "65M"], "multiple of 2M");
    usage_error(
        &["run", "--arg", "colour=blue"],
        "unknown --arg key 'colour' for image zipf",
    );
    usage_error(&["run", "--arg", "write_ratio=3"], "out of range");
    usage_error(&["run", "no-such-image"], "neither a built-in image");
    usage_error(
        &["run", "--emulate-latency", "fast=abc"],
        "--emulate-latency fast=abc: give a latency from 1ns to 100us",
    );
    usage_error(
        &["compare", "zipf", "--emulate-latency", "llc=3M"],
        "--emulate-latency llc=3M: give 0 (no cache model) or a power of two",
    );
    usage_error(
        &[
            "run", "--mem", "640M", "--tier", "a:node=0:size=128M", "--tier",
            "b:node=0:size=128M", "--tier", "c:node=0:size=128M", "--tier",
            "d:node=0:size=128M", "--tier", "e:node=0:size=128M", "--emulate-latency",
        ],
        "--emulate-latency supports at most 4 tiers (2-bit tier map); this VM has 5: give at most 4 --tier flags",
    );
    usage_error(
        &["run", "--fast", "256M", "--policy-interval", "mtm=2x"],
        "'2x' in 'mtm=2x' is not a time",
    );
    usage_error(
        &["run", "--fast", "256M", "--policy-interval", "lru=2s"],
        "'lru' has no interval to set",
    );
    let text = write_tmp("text", b"#!/bin/sh\necho hi\n");
    usage_error(&["run", text.to_str().unwrap()], "not an ELF file");
    let truncated = write_tmp("truncated", &zipf_bytes()[..100]);
    usage_error(&["run", truncated.to_str().unwrap()], "truncated");
    let mut arm = zipf_bytes();
    arm[18] = 183;
    let arm = write_tmp("arm", &arm);
    usage_error(&["run", arm.to_str().unwrap()], "not x86_64");
    let mut outside = zipf_bytes();
    let (_, phs) = layout(&outside);
    // Move the first PT_LOAD (vaddr and paddr) to 1 TiB.
    for field in [16usize, 24] {
        outside[phs[0] + field..phs[0] + field + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    }
    let outside = write_tmp("outside", &outside);
    usage_error(
        &["run", "--mem", "64M", outside.to_str().unwrap()],
        "outside guest RAM",
    );
    if std::path::Path::new("/bin/sh").exists() {
        usage_error(&["run", "/bin/sh"], "link it");
    }
}

#[test]
fn guest_triple_fault_exits_3_with_registers() {
    if !kvm_available("guest_triple_fault_exits_3_with_registers") {
        return;
    }
    // ud2 at the entry point: #UD with no IDT -> triple fault.
    let img = write_tmp("ud2", &with_entry_code(&[0x0f, 0x0b]));
    let (code, _, err) = tv(&[
        "run",
        "--mem",
        "32M",
        "--duration",
        "5s",
        img.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("triple fault"), "{err}");
    assert!(
        err.contains("rip=0x0000000000400000"),
        "registers printed: {err}"
    );
}

#[test]
fn guest_ignoring_stop_is_forced_off_in_bounded_time() {
    if !kvm_available("guest_ignoring_stop_is_forced_off_in_bounded_time") {
        return;
    }
    // jmp $ : spins forever in ring 3 without a single exit.
    let img = write_tmp("spin", &with_entry_code(&[0xeb, 0xfe]));
    let t = std::time::Instant::now();
    let (code, out, err) = tv(&[
        "run",
        "--mem",
        "32M",
        "--duration",
        "300ms",
        "--stop-grace",
        "300ms",
        "--report",
        "json",
        img.to_str().unwrap(),
    ]);
    assert!(t.elapsed().as_secs() < 10, "took {:?}", t.elapsed());
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stop_reason"], "forced");
    assert!(v["exit_code"].is_null());
}

#[test]
fn hostile_status_page_and_console_flood_are_contained() {
    if !kvm_available("hostile_status_page_and_console_flood_are_contained") {
        return;
    }
    // Fill the status page (0x4000..0x8000) with 0xff, then flood the serial port forever.
    let code = [
        0x48, 0xc7, 0xc7, 0x00, 0x40, 0x00, 0x00, // mov rdi, 0x4000
        0x48, 0xc7, 0xc1, 0x00, 0x40, 0x00, 0x00, // mov rcx, 0x4000
        0xb0, 0xff, // mov al, 0xff
        0xf3, 0xaa, // rep stosb
        0xba, 0xf8, 0x03, 0x00, 0x00, // mov edx, 0x3f8
        0xee, // out dx, al
        0xeb, 0xfd, // jmp back to out
    ];
    let img = write_tmp("hostile", &with_entry_code(&code));
    let (code, out, err) = tv(&[
        "run",
        "--mem",
        "32M",
        "--duration",
        "1s",
        "--stop-grace",
        "200ms",
        "--report",
        "json",
        img.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&out).expect("a valid report despite the garbage");
    assert_eq!(v["stop_reason"], "forced");
    assert!(
        v["guest_metrics"].as_object().unwrap().is_empty(),
        "garbage metrics rejected"
    );
    assert_eq!(v["ops"], u64::MAX, "ops saturate instead of overflowing");
    assert!(v["console_bytes"].as_u64().unwrap() <= 1 << 20);
    assert!(err.len() < (1 << 20) * 3, "console output capped");
}

/// Numeric flags are bounded: a value past the limit is a usage error naming
/// the limit, never an abort (exit 134), a panic (101) or a hang.
#[test]
fn unbounded_numbers_are_usage_errors_naming_the_limit() {
    usage_error(
        &["run", "--sample-ms", "18446744073709551615"],
        "--sample-ms 18446744073709551615 exceeds the 60000 ms maximum",
    );
    usage_error(
        &[
            "run",
            "--policy",
            "chaos",
            "--chaos-rate",
            "18446744073709551615",
        ],
        "units/s maximum",
    );
    usage_error(
        &[
            "run",
            "--policy",
            "chaos",
            "--chaos-mix",
            "4294967295:4294967295",
        ],
        "weights go up to 1000000",
    );
    usage_error(
        &["compare", "zipf", "--repeat", "4000000000"],
        "--repeat 4000000000 exceeds the 1000 maximum",
    );
    usage_error(
        &["native", "--threads", "100000"],
        "--threads 100000 exceeds the 64 maximum",
    );
    usage_error(
        &["native", "--sample-ms", "99999999"],
        "exceeds the 60000 ms maximum",
    );
    usage_error(
        &[
            "run",
            "--mem",
            "64M",
            "--arg",
            "rss=8M",
            "--arg",
            "wss=4M",
            "--scan-pages",
            "99999999999",
            "--policy",
            "nomad",
        ],
        "--scan-pages 99999999999 exceeds the guest's 16384 pages",
    );
    // --fast + --slow near u64::MAX: overflowed (debug panic, exit 101).
    usage_error(
        &[
            "run",
            "--mem",
            "64M",
            "--fast",
            "32M",
            "--slow",
            "18446744073709547520",
            "--arg",
            "rss=8M",
            "--arg",
            "wss=4M",
        ],
        "exceeds NUMA node 0's memory",
    );
}

/// `--duration` ends the run whatever the sampling period: a 1 s run with a
/// one-minute sampling period ended after 60 s before the deadline was
/// checked between samples.
#[test]
fn duration_does_not_wait_for_a_sample_tick() {
    if !kvm_available("duration_does_not_wait_for_a_sample_tick") {
        return;
    }
    let (code, out, err) = tv(&[
        "run",
        "--mem",
        "64M",
        "--duration",
        "1s",
        "--sample-ms",
        "60000",
        "--arg",
        "rss=8M",
        "--arg",
        "wss=4M",
        "--report",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stop_reason"], "duration");
    let secs = v["duration_s"].as_f64().unwrap();
    assert!(
        secs < 30.0,
        "a 1 s run took {secs} s (the sample period is 60 s)"
    );
}

/// The highest chaos rate still stops with the run: the driver migrates in
/// batches of at most 16384 pages and checks for the stop between them
/// (before, one interval's batch at this rate was 100,000 2 MiB units).
#[test]
fn the_highest_chaos_rate_stops_with_the_run() {
    if !common::tiered_kvm_available() {
        return;
    }
    let (code, out, err) = tv(&[
        "run",
        "memcheck",
        "--mem",
        "256M",
        "--fast",
        "96M",
        "--policy",
        "chaos",
        "--chaos-rate",
        "10000000",
        "--chaos-unit",
        "2m",
        "--duration",
        "1s",
        "--arg",
        "region=64M",
        "--report",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["guest_metrics"]["mismatched_pages"], 0.0);
    let chaos = &v["tiering"]["chaos"];
    assert!(chaos["units"].as_u64().unwrap() > 0, "{chaos}");
    // How long the driver ran past the end of the run: one batch at most
    // (well under a second here); 10 s means the stop waited for the rate.
    let late_ms = chaos["elapsed_ms"].as_f64().unwrap() - v["duration_s"].as_f64().unwrap() * 1e3;
    assert!(
        late_ms < 10_000.0,
        "chaos stopped {late_ms} ms after the run: {chaos}"
    );
}

/// Runs tiervm with `args` and stdout either closed before it writes
/// (`closed`, like `| head -0`) or on /dev/full; returns (exit code, stderr).
fn with_bad_stdout(args: &[&str], closed: bool) -> (i32, String) {
    use std::io::Read as _;
    use std::process::Stdio;
    let stdout = if closed {
        Stdio::piped()
    } else {
        Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
    };
    let mut child = common::tiervm()
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before tiervm writes anything.
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let deadline = std::time::Instant::now() + common::PROCESS_LIMIT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s.code().unwrap_or(-1), err);
        }
        assert!(std::time::Instant::now() < deadline, "{args:?} hung");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A closed stdout ends quietly with the command's own exit code; a full
/// disk is one error line and exit 1. Both used to panic (exit 101).
#[test]
fn closed_or_full_stdout_never_panics() {
    for args in [&["images"][..], &["sim", "--list"], &["info"]] {
        let (code, err) = with_bad_stdout(args, true);
        assert_eq!(code, 0, "{args:?} on a closed pipe: {err}");
        assert!(err.is_empty(), "{args:?} on a closed pipe: {err}");
        let (code, err) = with_bad_stdout(args, false);
        assert_eq!(code, 1, "{args:?} on /dev/full: {err}");
        assert!(
            err.contains("No space left on device") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    if !kvm_available("closed_or_full_stdout_never_panics") {
        return;
    }
    let run = [
        "run",
        "--mem",
        "64M",
        "--duration",
        "300ms",
        "--arg",
        "rss=8M",
        "--arg",
        "wss=4M",
    ];
    let (code, err) = with_bad_stdout(&run, true);
    assert_eq!(code, 0, "exit as the run would: {err}");
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    let (code, err) = with_bad_stdout(&run, false);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("writing the output to stdout failed: No space left on device"),
        "{err}"
    );
}

/// `--tracking damon` on a host where it must not write DAMON's
/// machine-wide sysfs state (no opt-in here, whatever the host's DAMON
/// state): refused with exit 2 before a VM starts, and DAMON's state is
/// what it was. Policies that need hint faults are refused too.
#[test]
fn tracking_damon_is_refused_without_opt_in() {
    use tiering::tracking::damon::{probe, ALLOW_ENV, SYSFS_ROOT};
    let root = std::path::Path::new(SYSFS_ROOT);
    let before = probe(root);
    let out = common::tiervm()
        .env_remove(ALLOW_ENV)
        .args([
            "run",
            "--fast",
            "256M",
            "--policy",
            "mtm",
            "--tracking",
            "damon",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("DAMON"), "{err}");
    assert!(
        err.contains(ALLOW_ENV) || err.contains("in use") || err.contains("absent"),
        "the message names why: {err}"
    );
    assert_eq!(probe(root), before, "DAMON's state unchanged");
    usage_error(
        &[
            "run",
            "--fast",
            "256M",
            "--policy",
            "nomad",
            "--tracking",
            "damon",
        ],
        "tpp and nomad need --tracking hint-faults",
    );
    usage_error(
        &["run", "--policy", "chaos", "--tracking", "damon"],
        "--tracking damon feeds a placement policy",
    );
}

#[test]
fn fast_schedule_errors_name_the_fix() {
    for (args, want) in [
        (
            vec![
                "--mem",
                "256M",
                "--fast",
                "64M",
                "--fast-schedule",
                "64M@1s,32M@0s",
            ],
            "must not decrease",
        ),
        (
            vec![
                "--mem",
                "256M",
                "--fast",
                "64M",
                "--fast-schedule",
                "lots@1s",
            ],
            "is not a size",
        ),
        (
            vec![
                "--mem",
                "256M",
                "--fast",
                "64M",
                "--slow",
                "200M",
                "--fast-schedule",
                "64M@0s,16M@1s",
            ],
            "could not hold --mem",
        ),
        (
            vec!["--mem", "256M", "--fast", "64M", "--fast-schedule", "1G@1s"],
            "exceeds the fast tier's maximum",
        ),
    ] {
        let out = common::tiervm()
            .arg("run")
            .args(&args)
            .args([
                "--duration",
                "1s",
                "zipf",
                "--arg",
                "rss=16M",
                "--arg",
                "wss=16M",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
