//! Fuzzing the text parsers tiervm applies to user input: sizes, durations,
//! workload argument values, `--policy-schedule`, `--policy-interval`,
//! `--chaos-mix` and `compare --policies`.
//!
//! For each: arbitrary strings never panic and every error names the input;
//! valid inputs built from their grammar parse to the value they were built
//! from (round trip); values past the type's range give an error, never a
//! wrap or a panic. Case counts: see `tests/fuzzing/mod.rs`
//! (`TIERVM_FUZZ_CASES`); inputs that once failed: `tests/corpus/*.txt`.

mod fuzzing;

use std::time::Duration;

use proptest::prelude::*;
use tiering::engine::{parse_intervals, parse_schedule};
use tiering::policy::PolicyKind;
use tiervm_cli::commands::compare::parse_policies;
use tiervm_guest::abi::{from_fixed, ArgEntry, ARG_VALUE_LEN};
use tiervm_guest::args::{self, ArgError, ArgKind, Args};
use tiervm_guest::workloads::IMAGES;
use vmm_core::tiering_config::parse_mix;
use vmm_core::units::{format_size, parse_duration, parse_size};

const PERSIST: &str = regressions!("fuzz_parsers");

/// Binary size suffixes and their shifts, as `args::parse_size` accepts them.
const SUFFIXES: &[(&str, u32)] = &[
    ("", 0),
    ("B", 0),
    ("b", 0),
    ("K", 10),
    ("k", 10),
    ("KB", 10),
    ("KiB", 10),
    ("kB", 10),
    ("M", 20),
    ("m", 20),
    ("MB", 20),
    ("MiB", 20),
    ("G", 30),
    ("g", 30),
    ("GB", 30),
    ("GiB", 30),
    ("T", 40),
    ("t", 40),
    ("TB", 40),
    ("TiB", 40),
];

/// Strings that look like the grammar more often than `any::<String>()`.
fn near_grammar() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ \t]{0,2}[-+]?[0-9]{0,24}(\\.[0-9]{0,6})?(e[-+]?[0-9]{1,3})?(K|M|G|T|B|KiB|MB|ms|s|m|h|x|inf|nan|NaN|µs)?[ \t]{0,2}",
        "[0-9a-zA-Z:@=,. _-]{0,40}",
    ]
}

// ---------------------------------------------------------------------------
// Property bodies (shared by the proptests and the corpus replay)
// ---------------------------------------------------------------------------

fn check_size(s: &str) {
    let guest = args::parse_size(s);
    match parse_size(s) {
        Ok(v) => assert_eq!(guest, Ok(v), "VMM and guest parse {s:?} alike"),
        Err(msg) => {
            assert!(guest.is_err());
            let msg = msg.to_string();
            assert!(msg.contains(s), "error {msg:?} names the input {s:?}");
        }
    }
}

fn check_duration(s: &str) {
    match parse_duration(s) {
        Ok(d) => assert!(d <= Duration::from_secs(1_000_000_000), "{s:?} -> {d:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(s), "error {msg:?} names the input {s:?}");
        }
    }
}

fn check_arg_value(s: &str) {
    if let Ok(v) = args::parse_f64(s) {
        assert!(v.is_finite(), "{s:?} -> {v}");
    }
    let _ = args::parse_u64(s);
    for spec in IMAGES {
        for a in spec.args {
            let _ = a.kind.check(s);
        }
    }
}

fn check_schedule(s: &str) {
    match parse_schedule(s) {
        Ok(sched) => {
            assert!(!sched.is_empty(), "{s:?}");
            assert!(sched.windows(2).all(|w| w[0].at <= w[1].at), "{s:?}");
            for sw in &sched {
                assert!(PolicyKind::POLICIES.contains(&sw.policy), "{s:?}");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn check_intervals(s: &str) {
    match parse_intervals(s) {
        Ok(list) => {
            assert!(!list.is_empty(), "{s:?}");
            for (i, (name, d)) in list.iter().enumerate() {
                assert!(*d >= Duration::from_millis(1), "{s:?}");
                assert!(
                    !list[..i].iter().any(|(n, _)| n == name),
                    "{name} twice in {s:?}"
                );
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn check_mix(s: &str) {
    match parse_mix(s) {
        Ok((p, d)) => {
            assert!(p > 0 || d > 0, "{s:?}");
            // The chaos driver draws from p + d: the sum must fit its u32.
            assert!(
                p.checked_add(d).is_some(),
                "{s:?} -> {p} + {d} overflows u32"
            );
        }
        Err(e) => assert_eq!(tiervm_cli::error::Error::from(e).exit_code(), 2),
    }
}

fn check_policies(s: &str) {
    let names: Vec<String> = s.split(',').map(str::to_string).collect();
    match parse_policies(&names) {
        Ok(list) => {
            for (i, p) in list.iter().enumerate() {
                assert!(!list[..i].contains(p), "{s:?} lists a policy twice");
            }
        }
        Err(e) => assert_eq!(e.exit_code(), 2, "{e}"),
    }
}

/// What `format_size(b)` prints parses back: exactly when it printed a
/// whole number, within its one decimal (< 5%) otherwise; only a value that
/// the decimal rounded up to 2^64 or more may fail, as OutOfRange.
fn check_format_round_trip(b: u64) {
    let text = format_size(b);
    match args::parse_size(&text) {
        Ok(back) if text.contains('.') => {
            let rel = (back as f64 - b as f64).abs() / b as f64;
            assert!(rel < 0.05, "{b} -> {text} -> {back}");
        }
        Ok(back) => assert_eq!(back, b, "{b} -> {text}"),
        Err(e) => {
            let (num, unit) = text.split_at(text.len() - 1);
            let shown = num.parse::<f64>().expect("a number") * (1u64 << 40) as f64;
            assert!(
                unit == "T" && e == ArgError::OutOfRange && shown >= u64::MAX as f64,
                "{b} -> {text} does not parse back: {e:?}"
            );
        }
    }
}

/// Every property on one string.
fn check_all(s: &str) {
    check_size(s);
    check_duration(s);
    check_arg_value(s);
    check_schedule(s);
    check_intervals(s);
    check_mix(s);
    check_policies(s);
    if let Ok(b) = s.trim().parse::<u64>() {
        check_format_round_trip(b);
    }
}

// ---------------------------------------------------------------------------
// Corpus replay
// ---------------------------------------------------------------------------

#[test]
fn corpus_of_parser_inputs_replays() {
    let inputs = fuzzing::corpus_strings("parsers");
    for s in &inputs {
        check_all(s);
    }
    eprintln!("replayed {} corpus inputs", inputs.len());
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(fuzzing::config(3000, PERSIST))]

    /// Arbitrary strings: no parser panics, errors name the input.
    #[test]
    fn arbitrary_strings_never_panic(s in near_grammar()) {
        check_all(&s);
    }

    /// `N<suffix>` parses to N << shift, or OutOfRange past u64.
    #[test]
    fn sizes_round_trip_or_overflow(n in prop_oneof![any::<u64>(), 0u64..100_000], i in 0..SUFFIXES.len(), pad in "[ ]{0,2}") {
        let (suffix, shift) = SUFFIXES[i];
        let s = format!("{pad}{n}{suffix}{pad}");
        let want = (u128::from(n) << shift).try_into().ok();
        match want {
            Some(v) => prop_assert_eq!(args::parse_size(&s), Ok(v)),
            None => prop_assert_eq!(args::parse_size(&s), Err(ArgError::OutOfRange)),
        }
        check_size(&s);
    }

    /// What `format_size` prints parses back.
    #[test]
    fn formatted_sizes_parse_back(b in prop_oneof![any::<u64>(), 0u64..(1 << 42), (0u64..(1 << 22)).prop_map(|k| k << 20), (u64::MAX - (1 << 44))..=u64::MAX]) {
        check_format_round_trip(b);
    }

    /// `N<unit>` parses to N units (within float rounding), and past 10^9 s
    /// (about 31 years) it is an error.
    #[test]
    fn durations_round_trip_or_error(n in prop_oneof![0u64..10_000, any::<u64>(), 0u64..2_000_000_000], unit in 0usize..5) {
        let (suffix, secs_per) = [("ms", 1e-3), ("s", 1.0), ("", 1.0), ("m", 60.0), ("h", 3600.0)][unit];
        let s = format!("{n}{suffix}");
        let secs = n as f64 * secs_per;
        match parse_duration(&s) {
            Ok(d) => {
                prop_assert!(secs <= 1e9, "{s} accepted");
                prop_assert!((d.as_secs_f64() - secs).abs() <= secs * 1e-12 + 1e-9, "{} -> {:?}", s, d);
            }
            Err(_) => prop_assert!(secs > 1e9, "{s} rejected"),
        }
    }

    /// Integers round-trip in decimal and hex; floats in Rust's shortest form.
    #[test]
    fn numbers_round_trip(n in any::<u64>(), x in any::<f64>()) {
        prop_assert_eq!(args::parse_u64(&n.to_string()), Ok(n));
        prop_assert_eq!(args::parse_u64(&format!("{n:#x}")), Ok(n));
        let text = x.to_string();
        match args::parse_f64(&text) {
            Ok(y) => prop_assert_eq!(y.to_bits(), x.to_bits()),
            Err(_) => prop_assert!(!x.is_finite()),
        }
    }

    /// Whatever bytes sit in the boot info's argument slots, the guest-side
    /// lookup returns valid UTF-8 of at most ARG_VALUE_LEN bytes, or nothing.
    #[test]
    fn guest_arg_lookup_survives_garbage(raw in proptest::collection::vec(any::<u8>(), 0..2048), key in "[a-z_]{0,24}") {
        let entries: Vec<ArgEntry> = raw
            .chunks_exact(64)
            .map(|c| {
                let mut e = ArgEntry::EMPTY;
                e.key.copy_from_slice(&c[..24]);
                e.value.copy_from_slice(&c[24..]);
                e
            })
            .collect();
        for spec in IMAGES {
            let args = Args::new(&entries, Some(spec));
            if let Some(v) = args.raw(&key) {
                prop_assert!(v.len() <= ARG_VALUE_LEN || spec.arg(&key).is_some_and(|a| a.default == v));
            }
            for a in spec.args {
                let _ = (args.size(a.key, 0), args.u64(a.key, 0), args.f64(a.key, 0.0), args.str(a.key, ""));
            }
        }
        for e in &entries {
            let _ = (from_fixed(&e.key), from_fixed(&e.value));
        }
    }

    /// A non-decreasing schedule of known policies parses back to itself.
    #[test]
    fn schedules_round_trip(steps in proptest::collection::vec((0..PolicyKind::POLICIES.len(), 0u64..10_000_000), 1..8), unit_ms in any::<bool>()) {
        let mut steps = steps;
        steps.sort_by_key(|s| s.1);
        let text: Vec<String> = steps
            .iter()
            .map(|&(p, ms)| if unit_ms { format!("{}@{ms}ms", PolicyKind::POLICIES[p].name()) } else { format!(" {}@{}s ", PolicyKind::POLICIES[p].name(), ms / 1000) })
            .collect();
        let text = text.join(",");
        let parsed = parse_schedule(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed.len(), steps.len());
        for (sw, &(p, ms)) in parsed.iter().zip(&steps) {
            prop_assert_eq!(sw.policy, PolicyKind::POLICIES[p]);
            let want = if unit_ms { ms as f64 / 1e3 } else { (ms / 1000) as f64 };
            prop_assert!((sw.at.as_secs_f64() - want).abs() < 1e-6, "{} -> {:?}", text, sw.at);
        }
        // Reversed, a schedule with distinct times must be refused.
        if steps.first().map(|s| s.1 / 1000) != steps.last().map(|s| s.1 / 1000) {
            let rev: Vec<String> = steps.iter().rev().map(|&(p, ms)| format!("{}@{}s", PolicyKind::POLICIES[p].name(), ms / 1000)).collect();
            prop_assert!(parse_schedule(&rev.join(",")).is_err());
        }
    }

    /// `--chaos-mix P:D` round-trips for ordinary weights; 0:0 and weights
    /// whose sum overflows are refused (a tighter documented bound may refuse
    /// more, never accept a different value).
    #[test]
    fn mixes_round_trip_or_error(p in prop_oneof![any::<u32>(), 0u32..10], d in prop_oneof![any::<u32>(), 0u32..10]) {
        let r = parse_mix(&format!("{p}:{d}"));
        if (p == 0 && d == 0) || p.checked_add(d).is_none() {
            prop_assert!(r.is_err(), "{p}:{d} accepted");
        } else if p <= 1000 && d <= 1000 {
            prop_assert_eq!(r.ok(), Some((p, d)));
        } else if let Ok(v) = r {
            prop_assert_eq!(v, (p, d));
        }
    }

    /// Every built-in argument kind: valid values in range pass, out of
    /// range ones are OutOfRange, never a panic.
    #[test]
    fn arg_kinds_check_ranges(i in 0usize..64, v in any::<u64>(), x in any::<f64>()) {
        let all: Vec<_> = IMAGES.iter().flat_map(|s| s.args.iter()).collect();
        let a = all[i % all.len()];
        match a.kind {
            ArgKind::Int { min, max } => {
                let r = a.kind.check(&v.to_string());
                prop_assert_eq!(r.is_ok(), (min..=max).contains(&v));
            }
            ArgKind::Size { min, max } => {
                let r = a.kind.check(&v.to_string());
                prop_assert_eq!(r.is_ok(), (min..=max).contains(&v));
            }
            ArgKind::Float { min, max } => {
                let r = a.kind.check(&x.to_string());
                prop_assert_eq!(r.is_ok(), x.is_finite() && x >= min && x <= max);
            }
            ArgKind::Choice(words) => {
                for w in words {
                    prop_assert!(a.kind.check(w).is_ok());
                }
                prop_assert_eq!(a.kind.check(&x.to_string()).is_ok(), words.contains(&x.to_string().as_str()));
            }
        }
    }
}

/// The defaults of every built-in image pass their own checks (the guest
/// falls back to them, so they must be valid).
#[test]
fn every_default_passes_its_own_check() {
    for spec in IMAGES {
        for a in spec.args {
            assert_eq!(
                a.kind.check(a.default),
                Ok(()),
                "{}: default {}={} fails its own check",
                spec.name,
                a.key,
                a.default
            );
        }
    }
}
