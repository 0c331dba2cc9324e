//! External guests in C: `guest-images/include/tiervm.h` must describe the
//! same ABI as `guest-images/src/abi.rs`, and a small C guest built with the
//! system C compiler must boot under `tiervm run` and report what it did.
//!
//! Both tests need a C compiler (`$CC`, else `cc`) and skip with a printed
//! reason without one; the boot test also needs KVM (and fails instead of
//! skipping under `TIERVM_REQUIRE_KVM=1`).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tiervm_guest::abi::{
    ArgEntry, BootInfo, EmulationHeader, EmulationVcpu, Metric, Phase, StatusPage, VcpuStatus,
    ABI_VERSION, ARG_KEY_LEN, ARG_VALUE_LEN, BOOT_INFO_GPA, BOOT_MAGIC, CACHE_LINE,
    CACHE_MODEL_WAYS, EMULATION_HEADER_SIZE, EMULATION_MAGIC, EMULATION_MAX_TIERS,
    EMULATION_VERSION, EMU_GUEST_CHARGING, EMU_GUEST_IDLE, EMU_GUEST_MEASURING, GUEST_LARGE_PAGE,
    IMAGE_BASE_GPA, MAX_ARGS, MAX_METRICS, MAX_VCPUS, METRIC_NAME_LEN, PAGE_SIZE, PAGE_TABLES_GPA,
    PORT_BOOTED, PORT_EXIT, PORT_SERIAL, STACK_SIZE, STATUS_GPA, STATUS_MAGIC, STATUS_SIZE,
    STATUS_STOP_OFFSET, STATUS_VCPUS_OFFSET, TIER_MAP_PAGES_PER_WORD,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn include_dir() -> PathBuf {
    repo().join("guest-images/include")
}

/// The C compiler, or `None` (with the reason printed) if there is none.
fn c_compiler(test: &str) -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc).arg("--version").output() {
        Ok(o) if o.status.success() => Some(cc),
        Ok(o) => {
            eprintln!(
                "SKIPPED {test}: C compiler '{cc}' failed to run ({}); install gcc or clang, or set CC",
                o.status
            );
            None
        }
        Err(e) => {
            eprintln!(
                "SKIPPED {test}: no C compiler '{cc}' ({e}); install gcc or clang, or set CC"
            );
            None
        }
    }
}

/// `true` if KVM is usable; otherwise prints why the test is skipped, or
/// panics when `TIERVM_REQUIRE_KVM=1` says KVM must be there.
fn kvm_or_skip(test: &str) -> bool {
    if common::kvm_available(test) {
        return true;
    }
    assert!(
        std::env::var("TIERVM_REQUIRE_KVM").as_deref() != Ok("1"),
        "{test}: TIERVM_REQUIRE_KVM=1 but /dev/kvm is not usable"
    );
    false
}

/// A temporary directory removed when dropped, also when the test fails.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("tiervm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    TempDir(d)
}

fn checked(what: &str, out: Output) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

// ---------------------------------------------------------------------------
// The header against the Rust definitions
// ---------------------------------------------------------------------------

/// Size of a field, from a projection closure (no unsafe, no instance).
fn field_size<T, F>(_: fn(&T) -> &F) -> u64 {
    std::mem::size_of::<F>() as u64
}

/// One field of a C struct and its Rust counterpart: (C name, offset, size).
type Field = (&'static str, u64, u64);

macro_rules! fields {
    ($rust:ty, $( $c:literal => $f:ident ),* $(,)?) => {
        vec![$( ($c, std::mem::offset_of!($rust, $f) as u64, field_size(|s: &$rust| &s.$f)) ),*]
    };
}

/// Every ABI struct: Rust name, C name, size, fields.
fn structs() -> Vec<(&'static str, &'static str, u64, Vec<Field>)> {
    use std::mem::size_of;
    vec![
        (
            "ArgEntry",
            "tiervm_arg",
            size_of::<ArgEntry>() as u64,
            fields!(ArgEntry, "key" => key, "value" => value),
        ),
        (
            "BootInfo",
            "tiervm_boot_info",
            size_of::<BootInfo>() as u64,
            fields!(BootInfo,
                "magic" => magic, "abi_version" => abi_version, "vcpu_count" => vcpu_count,
                "ram_size" => ram_size, "tsc_khz" => tsc_khz, "seed" => seed,
                "heap_start" => heap_start, "heap_end" => heap_end, "status_gpa" => status_gpa,
                "arg_count" => arg_count, "reserved" => _reserved, "args" => args,
                "emulation_gpa" => emulation_gpa),
        ),
        (
            "EmulationVcpu",
            "tiervm_emulation_vcpu",
            size_of::<EmulationVcpu>() as u64,
            fields!(EmulationVcpu,
                "accesses" => accesses, "writes" => writes, "cache_hits" => cache_hits,
                "charged_cycles" => charged_cycles, "paid_cycles" => paid_cycles,
                "payments" => payments, "preempted_cycles" => preempted_cycles,
                "host_cache_hits" => host_cache_hits, "reserved" => _reserved),
        ),
        (
            "EmulationHeader",
            "tiervm_emulation_header",
            size_of::<EmulationHeader>() as u64,
            fields!(EmulationHeader,
                "magic" => magic, "version" => version, "tier_count" => tier_count,
                "tier_map_gpa" => tier_map_gpa, "tier_map_pages" => tier_map_pages,
                "unloaded_ps" => unloaded_ps, "loaded_ps" => loaded_ps,
                "loaded_generation" => loaded_generation, "pay_threshold_ps" => pay_threshold_ps,
                "cache_bytes" => cache_bytes, "cache_model_gpa" => cache_model_gpa,
                "cache_model_stride" => cache_model_stride, "chase_gpa" => chase_gpa,
                "chase_bytes" => chase_bytes, "dram_ps" => dram_ps, "guest_state" => guest_state,
                "chase_hops" => chase_hops, "dram_fixed_ps" => dram_fixed_ps,
                "access_sample_period" => access_sample_period,
                "host_cache_bytes" => host_cache_bytes,
                "host_cache_model_gpa" => host_cache_model_gpa,
                "host_cache_model_stride" => host_cache_model_stride,
                "llc_hit_ps" => llc_hit_ps, "ab_phase_ops" => ab_phase_ops,
                "reserved" => _reserved, "vcpus" => vcpus),
        ),
        (
            "VcpuStatus",
            "tiervm_vcpu_status",
            size_of::<VcpuStatus>() as u64,
            fields!(VcpuStatus, "ops" => ops, "phase" => phase, "heartbeat" => heartbeat, "pad" => _pad),
        ),
        (
            "Metric",
            "tiervm_metric",
            size_of::<Metric>() as u64,
            fields!(Metric, "name" => name, "value_bits" => value_bits),
        ),
        (
            "StatusPage",
            "tiervm_status_page",
            size_of::<StatusPage>() as u64,
            fields!(StatusPage,
                "magic" => magic, "stop_request" => stop_request, "metric_count" => metric_count,
                "reserved" => _reserved, "vcpus" => vcpus, "metrics" => metrics),
        ),
    ]
}

/// Every ABI constant: Rust name, C macro, value.
fn constants() -> Vec<(&'static str, &'static str, u64)> {
    vec![
        ("BOOT_MAGIC", "TIERVM_BOOT_MAGIC", BOOT_MAGIC),
        ("STATUS_MAGIC", "TIERVM_STATUS_MAGIC", STATUS_MAGIC),
        ("ABI_VERSION", "TIERVM_ABI_VERSION", u64::from(ABI_VERSION)),
        ("BOOT_INFO_GPA", "TIERVM_BOOT_INFO_GPA", BOOT_INFO_GPA),
        ("STATUS_GPA", "TIERVM_STATUS_GPA", STATUS_GPA),
        ("STATUS_SIZE", "TIERVM_STATUS_SIZE", STATUS_SIZE),
        ("PAGE_TABLES_GPA", "TIERVM_PAGE_TABLES_GPA", PAGE_TABLES_GPA),
        ("IMAGE_BASE_GPA", "TIERVM_IMAGE_BASE_GPA", IMAGE_BASE_GPA),
        ("STACK_SIZE", "TIERVM_STACK_SIZE", STACK_SIZE),
        ("PAGE_SIZE", "TIERVM_PAGE_SIZE", PAGE_SIZE),
        (
            "GUEST_LARGE_PAGE",
            "TIERVM_GUEST_LARGE_PAGE",
            GUEST_LARGE_PAGE,
        ),
        ("MAX_VCPUS", "TIERVM_MAX_VCPUS", MAX_VCPUS as u64),
        ("MAX_ARGS", "TIERVM_MAX_ARGS", MAX_ARGS as u64),
        ("ARG_KEY_LEN", "TIERVM_ARG_KEY_LEN", ARG_KEY_LEN as u64),
        (
            "ARG_VALUE_LEN",
            "TIERVM_ARG_VALUE_LEN",
            ARG_VALUE_LEN as u64,
        ),
        ("MAX_METRICS", "TIERVM_MAX_METRICS", MAX_METRICS as u64),
        (
            "METRIC_NAME_LEN",
            "TIERVM_METRIC_NAME_LEN",
            METRIC_NAME_LEN as u64,
        ),
        ("PORT_EXIT", "TIERVM_PORT_EXIT", u64::from(PORT_EXIT)),
        ("PORT_BOOTED", "TIERVM_PORT_BOOTED", u64::from(PORT_BOOTED)),
        ("PORT_SERIAL", "TIERVM_PORT_SERIAL", u64::from(PORT_SERIAL)),
        (
            "STATUS_STOP_OFFSET",
            "TIERVM_STATUS_STOP_OFFSET",
            STATUS_STOP_OFFSET,
        ),
        (
            "STATUS_VCPUS_OFFSET",
            "TIERVM_STATUS_VCPUS_OFFSET",
            STATUS_VCPUS_OFFSET,
        ),
        ("EMULATION_MAGIC", "TIERVM_EMULATION_MAGIC", EMULATION_MAGIC),
        (
            "EMULATION_VERSION",
            "TIERVM_EMULATION_VERSION",
            u64::from(EMULATION_VERSION),
        ),
        (
            "EMULATION_MAX_TIERS",
            "TIERVM_EMULATION_MAX_TIERS",
            EMULATION_MAX_TIERS as u64,
        ),
        (
            "TIER_MAP_PAGES_PER_WORD",
            "TIERVM_TIER_MAP_PAGES_PER_WORD",
            TIER_MAP_PAGES_PER_WORD,
        ),
        (
            "EMULATION_HEADER_SIZE",
            "TIERVM_EMULATION_HEADER_SIZE",
            EMULATION_HEADER_SIZE,
        ),
        (
            "CACHE_MODEL_WAYS",
            "TIERVM_CACHE_MODEL_WAYS",
            CACHE_MODEL_WAYS,
        ),
        ("CACHE_LINE", "TIERVM_CACHE_LINE", CACHE_LINE),
        ("EMU_GUEST_IDLE", "TIERVM_EMU_GUEST_IDLE", EMU_GUEST_IDLE),
        (
            "EMU_GUEST_MEASURING",
            "TIERVM_EMU_GUEST_MEASURING",
            EMU_GUEST_MEASURING,
        ),
        (
            "EMU_GUEST_CHARGING",
            "TIERVM_EMU_GUEST_CHARGING",
            EMU_GUEST_CHARGING,
        ),
    ]
}

/// Every [`Phase`] (found by decoding, so a new phase is picked up here).
fn phases() -> Vec<(String, u64)> {
    (0..256u64)
        .filter_map(|v| Phase::from_u64(v).map(|p| (p, v)))
        .map(|(p, v)| {
            assert_eq!(p as u64, v, "Phase::from_u64 and the discriminant agree");
            (format!("TIERVM_PHASE_{}", p.name().to_uppercase()), v)
        })
        .collect()
}

/// `(C expression, expected value)` for everything the header must get right.
fn expectations() -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = constants()
        .into_iter()
        .map(|(_, c, v)| (c.to_string(), v))
        .collect();
    out.extend(phases());
    for (_, c, size, fields) in structs() {
        out.push((format!("sizeof(struct {c})"), size));
        out.push((format!("_Alignof(struct {c})"), 0)); // filled below
        for (f, off, sz) in fields {
            out.push((format!("offsetof(struct {c}, {f})"), off));
            out.push((format!("sizeof(((struct {c} *)0)->{f})"), sz));
        }
    }
    // Alignment: the Rust structs are repr(C); compare too.
    let aligns: BTreeMap<&str, u64> = [
        ("tiervm_arg", std::mem::align_of::<ArgEntry>() as u64),
        ("tiervm_boot_info", std::mem::align_of::<BootInfo>() as u64),
        (
            "tiervm_vcpu_status",
            std::mem::align_of::<VcpuStatus>() as u64,
        ),
        ("tiervm_metric", std::mem::align_of::<Metric>() as u64),
        (
            "tiervm_status_page",
            std::mem::align_of::<StatusPage>() as u64,
        ),
        (
            "tiervm_emulation_vcpu",
            std::mem::align_of::<EmulationVcpu>() as u64,
        ),
        (
            "tiervm_emulation_header",
            std::mem::align_of::<EmulationHeader>() as u64,
        ),
    ]
    .into_iter()
    .collect();
    for (expr, v) in &mut out {
        if let Some(name) = expr
            .strip_prefix("_Alignof(struct ")
            .and_then(|s| s.strip_suffix(')'))
        {
            *v = aligns[name];
        }
    }
    out
}

/// Names declared `pub const` / `pub struct` at the top level of abi.rs (so
/// a new one must be added to the tables above, and with it to the header).
fn declared(kind: &str) -> Vec<String> {
    let src = include_str!("../guest-images/src/abi.rs");
    let prefix = format!("pub {kind} ");
    src.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn rust_tables_cover_the_whole_abi() {
    let consts: Vec<&str> = constants().iter().map(|c| c.0).collect();
    for name in declared("const") {
        assert!(
            consts.contains(&name.as_str()),
            "abi.rs declares `{name}` but tests/c_guest.rs (and so tiervm.h) does not cover it: \
             add it to guest-images/include/tiervm.h and to constants() here"
        );
    }
    let structs = structs();
    for name in declared("struct") {
        assert!(
            structs.iter().any(|s| s.0 == name),
            "abi.rs declares struct `{name}` but tiervm.h/structs() do not cover it"
        );
    }
    // The listed fields tile each struct exactly: a Rust field missing from a
    // list leaves a gap (or changes the size) and fails here.
    for (rust, _, size, mut fields) in structs {
        fields.sort_by_key(|f| f.1);
        let mut at = 0;
        for (f, off, sz) in &fields {
            assert_eq!(
                *off, at,
                "{rust}: field for C `{f}` at {off}, expected {at}: a Rust field is not listed"
            );
            at = off + sz;
        }
        assert_eq!(
            at, size,
            "{rust}: listed fields end at {at}, struct is {size} bytes"
        );
    }
}

#[test]
fn c_header_matches_the_rust_abi() {
    let Some(cc) = c_compiler("c_header_matches_the_rust_abi") else {
        return;
    };
    let dir = temp_dir("abi-header");
    let exps = expectations();
    let mut prog = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"tiervm.h\"\nint main(void)\n{\n",
    );
    for (expr, _) in &exps {
        prog += &format!("    printf(\"%s=%llu\\n\", \"{expr}\", (unsigned long long)({expr}));\n");
    }
    prog += "    return 0;\n}\n";
    let src = dir.0.join("abi_check.c");
    std::fs::write(&src, prog).unwrap();
    let exe = dir.0.join("abi_check");
    checked(
        "compiling the header check",
        Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(include_dir())
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("run the C compiler"),
    );
    let out = checked(
        "the header check",
        Command::new(&exe).output().expect("run the header check"),
    );
    let got: BTreeMap<String, u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.rsplit_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().expect("a number")))
        .collect();
    let mut wrong = Vec::new();
    for (expr, want) in &exps {
        match got.get(expr) {
            Some(v) if v == want => {}
            Some(v) => wrong.push(format!("{expr}: header {v:#x}, abi.rs {want:#x}")),
            None => wrong.push(format!("{expr}: not printed")),
        }
    }
    assert!(
        wrong.is_empty(),
        "guest-images/include/tiervm.h disagrees with guest-images/src/abi.rs:\n  {}",
        wrong.join("\n  ")
    );
    assert!(exps.len() > 60, "{} checks", exps.len());
}

// ---------------------------------------------------------------------------
// A C guest booted by tiervm
// ---------------------------------------------------------------------------

/// The compiler flags docs/guest-abi.md gives for a C guest.
const GUEST_CFLAGS: &[&str] = &[
    "-std=c11",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-pie",
    "-no-pie",
    "-static",
    "-nostdlib",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-fcf-protection=none",
    "-Wl,--build-id=none",
];

fn build_c_guest(cc: &str, dir: &Path) -> PathBuf {
    let elf = dir.join("hello.elf");
    let c_dir = repo().join("tests/c-guest");
    checked(
        "building tests/c-guest/hello.c",
        Command::new(cc)
            .args(GUEST_CFLAGS)
            .arg("-I")
            .arg(include_dir())
            .arg("-T")
            .arg(c_dir.join("link.ld"))
            .arg("-o")
            .arg(&elf)
            .arg(c_dir.join("hello.c"))
            .output()
            .expect("run the C compiler"),
    );
    elf
}

/// Runs `tiervm run` with a bound on its wall time.
fn tiervm_run(args: &[&str], bound: Duration) -> Output {
    let mut child = common::tiervm()
        .arg("run")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tiervm");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait for tiervm").is_some() {
            return child.wait_with_output().expect("collect tiervm output");
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect tiervm output");
            panic!(
                "tiervm run {args:?} still running after {bound:?} (killed):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What hello.c stores in one word (the same splitmix64 finaliser).
fn word_value(seed: u64, vcpu: u64, page: u64, word: u64, round: u64) -> u64 {
    let mut z = seed.wrapping_mul(0xD134_2543_DE82_EF95);
    z ^= (vcpu << 48) ^ (round << 40) ^ (page << 12) ^ word;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn expected_checksum(seed: u64, vcpus: u64, pages: u64, rounds: u64) -> u64 {
    let mut sum = 0u64;
    for v in 0..vcpus {
        for r in 0..rounds {
            for p in 0..pages {
                for w in 0..512 {
                    sum = sum.wrapping_add(word_value(seed, v, p, w, r));
                }
            }
        }
    }
    sum & ((1 << 52) - 1)
}

fn report_of(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "tiervm printed no JSON report ({e}):\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn c_guest_boots_and_reports() {
    let test = "c_guest_boots_and_reports";
    let Some(cc) = c_compiler(test) else {
        return;
    };
    let dir = temp_dir("c-guest");
    let elf = build_c_guest(&cc, &dir.0);
    if !kvm_or_skip(test) {
        return;
    }
    let elf = elf.to_str().expect("utf-8 temp path");
    let (seed, vcpus, pages, rounds) = (12345u64, 2u64, 256u64, 3u64);

    // 1. The guest runs its rounds and exits by itself with --arg exit=42.
    let out = tiervm_run(
        &[
            elf,
            "--duration",
            "0",
            "--mem",
            "64M",
            "--vcpus",
            "2",
            "--seed",
            "12345",
            "--arg",
            "pages=256",
            "--arg",
            "rounds=3",
            "--arg",
            "exit=42",
            "--report",
            "json",
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    let r = report_of(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(r["stop_reason"], "guest_exited", "{r}");
    assert_eq!(r["exit_code"], 42, "{r}");
    assert!(
        !out.status.success(),
        "a guest exit code of 42 is not success"
    );
    assert!(r["crash"].is_null(), "{r}");
    let m = &r["guest_metrics"];
    assert_eq!(
        m["c_checksum"].as_f64(),
        Some(expected_checksum(seed, vcpus, pages, rounds) as f64),
        "the guest read seed, vCPU count and args from boot info: {r}"
    );
    assert_eq!(m["c_mismatches"].as_f64(), Some(0.0), "{r}");
    assert_eq!(m["c_pages"].as_f64(), Some((vcpus * pages) as f64), "{r}");
    assert_eq!(m["c_rounds"].as_f64(), Some(rounds as f64), "{r}");
    assert_eq!(m["c_vcpus"].as_f64(), Some(vcpus as f64), "{r}");
    assert_eq!(
        r["ops"].as_u64(),
        Some(vcpus * pages * rounds),
        "ops from the status page: {r}"
    );
    assert!(r["boot_ms"].as_f64().is_some(), "booted port seen: {r}");
    assert_eq!(r["unhandled_io"], 0, "{r}");
    assert!(
        stderr.contains("[guest] hello from a C guest: 2 vCPU(s), seed 12345, heap 0x"),
        "{stderr}"
    );

    // 2. Until stopped: rounds=0 loops until --duration sets stop_request.
    let out = tiervm_run(
        &[
            elf,
            "--duration",
            "1s",
            "--mem",
            "64M",
            "--arg",
            "rounds=0",
            "--report",
            "json",
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    let r = report_of(&out);
    assert!(out.status.success(), "{r}");
    assert_eq!(r["stop_reason"], "duration", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["guest_metrics"]["c_mismatches"].as_f64(), Some(0.0));
    assert!(
        r["guest_metrics"]["c_rounds"].as_f64() >= Some(1.0),
        "it ran until stopped: {r}"
    );
    assert!(r["ops"].as_u64() >= Some(64), "{r}");

    // 4. Latency emulation on (tiered): this guest knows nothing of it (it
    //    never reads boot_info.emulation_gpa) and runs unchanged, uncharged.
    let out = tiervm_run(
        &[
            elf,
            "--duration",
            "0",
            "--mem",
            "64M",
            "--fast",
            "32M",
            "--seed",
            "12345",
            "--arg",
            "pages=64",
            "--arg",
            "rounds=2",
            "--emulate-latency",
            "fast=80ns,slow=250ns",
            "--report",
            "json",
            "--quiet",
        ],
        Duration::from_secs(60),
    );
    let r = report_of(&out);
    assert!(out.status.success(), "{r}");
    assert_eq!(
        r["guest_metrics"]["c_mismatches"].as_f64(),
        Some(0.0),
        "{r}"
    );
    assert_eq!(
        r["guest_metrics"]["c_checksum"].as_f64(),
        Some(expected_checksum(seed, 1, 64, 2) as f64),
        "{r}"
    );
    let e = &r["emulation"];
    assert_eq!(
        e["label"], "emulated latency: fast 80 ns, slow 250 ns",
        "{r}"
    );
    assert!(
        e["host_dram_ns"].is_null(),
        "the guest measured nothing: {r}"
    );
    assert_eq!(e["charged_ms"].as_f64(), Some(0.0), "{r}");
}
