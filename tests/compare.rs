//! `tiervm compare`: one row per policy, one run per policy and repeat in
//! interleaved order, and output files that parse back (JSON, CSV, SVG).
//! A failing guest is reported in its row, the other runs still happen and
//! the exit code is non-zero.

mod common;

use std::path::{Path, PathBuf};

use common::tv;
use object::read::elf::FileHeader;
use object::{elf, Endianness};
use serde_json::Value;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tiervm-compare-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Parses RFC 4180 CSV (quoted fields may hold commas, quotes, newlines).
fn parse_csv(s: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(!quoted, "unterminated quoted field");
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

/// Well-formedness check without an XML crate: one `<svg` root, a final
/// `</svg>`, and every opened element closed in order.
fn check_svg(path: &Path, must_contain: &[&str]) {
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.starts_with("<svg"), "{}: no <svg root", path.display());
    assert!(svg.trim_end().ends_with("</svg>"), "{}", path.display());
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg.as_str();
    while let Some(i) = rest.find('<') {
        rest = &rest[i..];
        let end = rest.find('>').expect("unterminated tag");
        let tag = &rest[1..end];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched close"
            );
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            let name = tag.split_whitespace().next().unwrap_or("");
            stack.push(name.to_string());
        }
        rest = &rest[end + 1..];
    }
    assert!(stack.is_empty(), "unclosed elements {stack:?}");
    assert_eq!(svg.matches("<svg").count(), 1);
    for s in must_contain {
        assert!(
            svg.lines().any(|l| l.trim() == *s),
            "{} lacks the text '{s}'",
            path.display()
        );
    }
}

#[test]
fn two_policies_two_repeats_write_rows_and_valid_files() {
    if !common::tiered_kvm_available() {
        return;
    }
    let dir = tmp_dir("ok");
    let (code, out, err) = tv(&[
        "compare",
        "memcheck",
        "--policies",
        "static,chaos",
        "--repeat",
        "2",
        "--mem",
        "128M",
        "--fast",
        "64M",
        "--duration",
        "1s",
        "--arg",
        "region=32M",
        "--chaos-rate",
        "20000",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(err.is_empty(), "--quiet prints nothing on stderr: {err}");

    // The table: a row per policy, the header says what is measured.
    assert!(out.contains("Measured on this host"), "{out}");
    let one_node = tiering::host::numa_nodes()
        .map(|n| n.len() == 1)
        .unwrap_or(true);
    // Without --emulate-latency a one-node host says placement does not
    // change latency here (and never that latency is emulated).
    assert_eq!(
        out.contains("Tier latency is NOT emulated"),
        one_node,
        "{out}"
    );
    assert!(!out.contains("EMULATED in the guest"), "{out}");
    let table: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("policy"))
        .collect();
    assert!(
        table[2].starts_with("static ") && table[2].contains("1.00x"),
        "{out}"
    );
    assert!(table[3].starts_with("chaos "), "{out}");

    // results.json: 2 policies x 2 repeats, interleaved, with reports.
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 2);
    let order: Vec<(String, u64)> = runs
        .iter()
        .map(|r| {
            (
                r["policy"].as_str().unwrap().to_string(),
                r["repeat"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![
            ("static".to_string(), 1),
            ("chaos".to_string(), 1),
            ("static".to_string(), 2),
            ("chaos".to_string(), 2)
        ]
    );
    for r in runs {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["report"]["exit_code"], 0);
        assert_eq!(r["report"]["seed"], 1, "every run gets the same seed");
        let promotions = r["report"]["migration"]["promotions"].as_u64().unwrap();
        match r["policy"].as_str().unwrap() {
            "static" => assert_eq!(promotions, 0, "static never migrates"),
            _ => assert!(promotions > 0, "chaos migrates: {r}"),
        }
    }
    let summary = json["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2);
    assert_eq!(summary[0]["ratio_to_static"], 1.0);
    let median_chaos = summary[1]["ops_per_sec_median"].as_f64().unwrap();
    let chaos_ops: Vec<f64> = runs
        .iter()
        .filter(|r| r["policy"] == "chaos")
        .map(|r| r["report"]["ops_per_sec"].as_f64().unwrap())
        .collect();
    assert!((median_chaos - (chaos_ops[0] + chaos_ops[1]) / 2.0).abs() < 1e-6);

    // results.csv parses back: header + one row per run, same numbers.
    let csv = parse_csv(&std::fs::read_to_string(dir.join("results.csv")).unwrap());
    assert_eq!(csv.len(), 1 + 4);
    let col = |name: &str| csv[0].iter().position(|h| h == name).unwrap();
    for (row, run) in csv[1..].iter().zip(runs) {
        assert_eq!(row.len(), csv[0].len());
        assert_eq!(row[col("policy")], run["policy"].as_str().unwrap());
        assert_eq!(
            row[col("ops")].parse::<u64>().unwrap(),
            run["report"]["ops"].as_u64().unwrap()
        );
        assert_eq!(
            row[col("promotions")].parse::<u64>().unwrap(),
            run["report"]["migration"]["promotions"].as_u64().unwrap()
        );
        assert_eq!(row[col("ok")], "true");
    }

    check_svg(&dir.join("throughput.svg"), &["static", "chaos"]);
    check_svg(
        &dir.join("migrations.svg"),
        &["static", "chaos", "promotions", "TPM aborts"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The zipf image with its entry code replaced by `code`.
fn with_entry_code(code: &[u8]) -> Vec<u8> {
    let mut b = vmm_core::image::builtin_bytes("zipf").unwrap().to_vec();
    let h = elf::FileHeader64::<Endianness>::parse(&*b).unwrap();
    let e = h.endian().unwrap();
    let entry = h.e_entry(e);
    let mut off = None;
    for ph in h.program_headers(e, &*b).unwrap() {
        use object::read::elf::ProgramHeader;
        let (va, sz) = (ph.p_vaddr(e), ph.p_filesz(e));
        if ph.p_type(e) == elf::PT_LOAD && entry >= va && entry < va + sz {
            off = Some((ph.p_offset(e) + entry - va) as usize);
        }
    }
    let off = off.expect("entry inside a PT_LOAD segment");
    b[off..off + code.len()].copy_from_slice(code);
    b
}

#[test]
fn failing_runs_are_reported_in_their_rows_and_the_rest_still_runs() {
    if !common::tiered_kvm_available() {
        return;
    }
    let dir = tmp_dir("fail");
    std::fs::create_dir_all(&dir).unwrap();
    // out 0x501 <- 1: "this vCPU finished with exit code 1".
    let code = [
        0xba, 0x01, 0x05, 0x00, 0x00, // mov edx, 0x501
        0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1
        0xef, // out dx, eax
        0xeb, 0xfe, // jmp $
    ];
    let img = dir.join("exit1");
    std::fs::write(&img, with_entry_code(&code)).unwrap();
    let out_dir = dir.join("out");
    let (code, out, err) = tv(&[
        "compare",
        img.to_str().unwrap(),
        "--policies",
        "static,chaos",
        "--mem",
        "64M",
        "--duration",
        "1s",
        "--quiet",
        "--report",
        "json",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    let json: Value = serde_json::from_str(out.trim()).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(
        runs.len(),
        2,
        "the second policy ran after the first failed"
    );
    for r in runs {
        assert_eq!(r["ok"], false);
        assert!(
            r["error"].as_str().unwrap().contains("exited with code 1"),
            "{r}"
        );
    }
    for s in json["summary"].as_array().unwrap() {
        assert_eq!(s["failed"], 1);
        assert_eq!(s["ops_per_sec_median"], Value::Null);
    }
    assert!(
        out_dir.join("results.csv").exists(),
        "files are written anyway"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_compare_flags_exit_2_naming_the_fix() {
    for (args, expect) in [
        (
            &["compare", "zipf", "--policies", "static,bogus"][..],
            "unknown policy 'bogus'",
        ),
        (
            &["compare", "zipf", "--policies", "static,static"][..],
            "twice",
        ),
        (&["compare", "zipf", "--repeat", "0"][..], "--repeat 0"),
        (
            &[
                "compare",
                "zipf",
                "--policies",
                "static",
                "--chaos-rate",
                "5",
            ][..],
            "add chaos to --policies",
        ),
        (
            &["compare", "zipf", "--fast", "2G"][..],
            "policy static: --fast 2G exceeds --mem 1G",
        ),
    ] {
        let (code, _, err) = tv(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: '{err}' lacks '{expect}'");
    }
}

/// With `--emulate-latency` every output says so: the summary, results.json,
/// results.csv and both SVG titles. (Fails if one output drops the label.)
#[test]
fn emulated_latency_is_labeled_in_every_output() {
    if !common::tiered_kvm_available() {
        return;
    }
    let label = "emulated latency: fast 80 ns, slow 250 ns";
    let dir = tmp_dir("emulated");
    let (code, out, err) = tv(&[
        "compare",
        "zipf",
        "--policies",
        "static",
        "--mem",
        "128M",
        "--fast",
        "64M",
        "--arg",
        "rss=32M",
        "--arg",
        "wss=16M",
        "--duration",
        "1s",
        "--emulate-latency",
        "fast=80ns,slow=250ns",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("Tier latency is EMULATED in the guest"),
        "{out}"
    );
    assert!(out.contains(label), "{out}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["setup"]["emulated_latency"], label);
    assert_eq!(json["runs"][0]["report"]["emulation"]["label"], label);
    let csv = parse_csv(&std::fs::read_to_string(dir.join("results.csv")).unwrap());
    let col = csv[0].iter().position(|h| h == "emulated_latency").unwrap();
    assert_eq!(csv[1][col], label);
    for svg in ["throughput.svg", "migrations.svg"] {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(text.contains(label), "{svg} title lacks the label");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
