//! Fuzzing tiervm's configuration input. tiervm reads no configuration file:
//! a run is configured entirely by its command line, so this suite fuzzes
//! that, end to end: arbitrary `tiervm run` / `tiervm compare` argument
//! lists go through clap (with tiervm's value parsers), the request builders
//! and `VmConfig::from_request` (every check, tiering and `--arg` validation
//! included), the way `main` does before it touches KVM.
//!
//! Properties: nothing panics; a rejected configuration is a usage error
//! (exit code 2) with a message; an accepted one keeps every invariant the
//! runner relies on (RAM size and alignment, vCPU count, a heap inside RAM,
//! tier capacities, chaos weights that cannot overflow), and every `--arg`
//! the VMM accepts for a built-in image is one the guest parses to a value
//! in range. Case counts: `tests/fuzzing/mod.rs`; inputs that once failed:
//! `tests/corpus/cli.txt`.

mod fuzzing;

use clap::Parser;
use proptest::prelude::*;
use tiervm_cli::commands::compare::{parse_policies, CompareArgs};
use tiervm_cli::commands::run::RunArgs;
use tiervm_guest::abi::{GUEST_LARGE_PAGE, MAX_VCPUS};
use tiervm_guest::args::{self, ArgKind, Args};
use tiervm_guest::workloads::IMAGES;
use vmm_core::config::VmConfig;
use vmm_core::guest_abi::{MAX_RAM, MIN_RAM};
use vmm_core::workload_args::to_entries;

const PERSIST: &str = regressions!("fuzz_config");

#[derive(Parser, Debug)]
#[command(name = "tiervm-run")]
struct RunCli {
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Parser, Debug)]
#[command(name = "tiervm-compare")]
struct CompareCli {
    #[command(flatten)]
    compare: CompareArgs,
}

// ---------------------------------------------------------------------------
// Generators: flag values that are valid, at the edges, past them, or junk
// ---------------------------------------------------------------------------

fn junk() -> BoxedStrategy<String> {
    prop_oneof![
        Just(String::new()),
        Just("-1".to_string()),
        Just("nan".to_string()),
        "[ -~]{0,12}",
        any::<String>(),
    ]
    .boxed()
}

fn size_val() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (1u64..2048, prop::sample::select(vec!["K", "M", "G", "T", ""]))
            .prop_map(|(n, s)| format!("{n}{s}")),
        2 => prop::sample::select(vec!["16M", "32M", "64M", "128M", "2M", "4K", "1G", "512G", "513G"])
            .prop_map(str::to_string),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec!["18446744073709551615", "18446744073709547520", "17179869183G", "16777215T", "1.5G", "0"])
            .prop_map(str::to_string),
        1 => junk(),
    ]
    .boxed()
}

fn int_val() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (0u64..100).prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec!["64", "65", "4294967295", "4294967296", "18446744073709551615", "100000"])
            .prop_map(str::to_string),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => junk(),
    ]
    .boxed()
}

fn dur_val() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (0u64..5000, prop::sample::select(vec!["ms", "s", ""]))
            .prop_map(|(n, s)| format!("{n}{s}")),
        1 => prop::sample::select(vec!["0", "1e9s", "1000000001s", "16666667m", "1e-9s", "0.5ms"])
            .prop_map(str::to_string),
        1 => junk(),
    ]
    .boxed()
}

fn float_val() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (0u32..100_000).prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|x| x.to_string()),
        1 => prop::sample::select(vec!["inf", "-inf", "1e308", "18446744073709551615", "0", "0.000001", "100", "100.1"])
            .prop_map(str::to_string),
        1 => junk(),
    ]
    .boxed()
}

fn word(words: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::sample::select(words).prop_map(str::to_string),
        1 => junk(),
    ]
    .boxed()
}

const POLICIES: &[&str] = &[
    "none", "static", "chaos", "tpp", "nomad", "memtis", "colloid", "mtm",
];

/// `--arg` values: keys of the built-in images with values of their kind
/// (in range, at the edges, past them), or junk.
fn kv_val() -> BoxedStrategy<String> {
    let specs: Vec<_> = IMAGES.iter().flat_map(|s| s.args.iter().copied()).collect();
    let typed = (
        prop::sample::select(specs),
        any::<u64>(),
        any::<f64>(),
        0usize..4,
    )
        .prop_map(|(a, n, x, pick)| {
            let v = match a.kind {
                ArgKind::Size { min, max } | ArgKind::Int { min, max } => [
                    min.to_string(),
                    max.to_string(),
                    max.saturating_add(1).to_string(),
                    n.to_string(),
                ][pick]
                    .clone(),
                ArgKind::Float { min, max } => [
                    min.to_string(),
                    max.to_string(),
                    (max * 2.0 + 1.0).to_string(),
                    x.to_string(),
                ][pick]
                    .clone(),
                ArgKind::Choice(words) => words
                    .get(pick)
                    .map_or_else(|| format!("{x}"), |w| w.to_string()),
            };
            format!("{}={v}", a.key)
        });
    prop_oneof![
        6 => typed,
        1 => ("[a-z_]{1,30}", "[ -~]{0,45}").prop_map(|(k, v)| format!("{k}={v}")),
        1 => junk(),
    ]
    .boxed()
}

fn schedule_val() -> BoxedStrategy<String> {
    prop_oneof![
        3 => proptest::collection::vec((prop::sample::select(POLICIES), 0u32..100), 1..4)
            .prop_map(|v| v.iter().map(|(p, t)| format!("{p}@{t}s")).collect::<Vec<_>>().join(",")),
        1 => junk(),
    ]
    .boxed()
}

fn interval_val() -> BoxedStrategy<String> {
    prop_oneof![
        3 => proptest::collection::vec((prop::sample::select(POLICIES), dur_val()), 1..3)
            .prop_map(|v| v.iter().map(|(p, t)| format!("{p}={t}")).collect::<Vec<_>>().join(",")),
        1 => junk(),
    ]
    .boxed()
}

/// One flag and its value(s) as argv words; `compare` picks compare's flags.
fn flag(compare: bool) -> BoxedStrategy<Vec<String>> {
    let with = |name: &'static str, v: BoxedStrategy<String>| {
        v.prop_map(move |v| vec![name.to_string(), v]).boxed()
    };
    let bare = |name: &'static str| Just(vec![name.to_string()]).boxed();
    let mut all = vec![
        with("--mem", size_val()),
        with("--vcpus", int_val()),
        with("--duration", dur_val()),
        with("--arg", kv_val()),
        with("--arg", kv_val()),
        with("--seed", int_val()),
        with("--sample-ms", int_val()),
        with("--stop-grace", dur_val()),
        with("--fast", size_val()),
        with("--slow", size_val()),
        with("--fast-node", int_val()),
        with("--slow-node", int_val()),
        with(
            "--placement",
            word(&["fast-first", "slow-first", "random", "interleave"]),
        ),
        with("--chaos-rate", float_val()),
        with(
            "--chaos-mix",
            prop_oneof![
                (int_val(), int_val()).prop_map(|(p, d)| format!("{p}:{d}")),
                junk(),
            ]
            .boxed(),
        ),
        with("--mechanism", word(&["tpm", "stop-copy"])),
        with("--chaos-unit", word(&["4k", "2m"])),
        with("--tracking", word(&["off", "hint-faults"])),
        with("--scan-pages", int_val()),
        with("--scan-period", dur_val()),
        with("--tracking-budget", float_val()),
        with("--policy-interval", interval_val()),
        bare("--quiet"),
    ];
    if compare {
        all.push(with(
            "--policies",
            prop_oneof![
                proptest::collection::vec(prop::sample::select(POLICIES), 0..4)
                    .prop_map(|v| v.join(",")),
                junk(),
            ]
            .boxed(),
        ));
        all.push(with("--repeat", int_val()));
    } else {
        all.push(with("--policy", word(POLICIES)));
        all.push(with("--policy", word(POLICIES)));
        all.push(with("--policy-schedule", schedule_val()));
        all.push(with("--tracking-ab", dur_val()));
        all.push(with("--report", word(&["human", "json"])));
    }
    prop::strategy::Union::new(all).boxed()
}

fn image_val() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::sample::select(vec!["zipf", "gups", "memcheck", "kv", "pagerank"]).prop_map(str::to_string),
        1 => Just("/nonexistent/tiervm-fuzz.elf".to_string()),
        1 => Just("/dev/null".to_string()),
        1 => Just("/".to_string()),
        1 => "[a-z]{1,8}",
    ]
    .boxed()
}

fn argv(compare: bool) -> impl Strategy<Value = Vec<String>> {
    (image_val(), proptest::collection::vec(flag(compare), 0..10)).prop_map(|(image, flags)| {
        let mut v = vec![image];
        v.extend(flags.into_iter().flatten());
        v
    })
}

// ---------------------------------------------------------------------------
// Property bodies
// ---------------------------------------------------------------------------

/// The invariants the runner relies on, for an accepted configuration.
fn check_config(cfg: &VmConfig, argv: &[String]) {
    let mem = cfg.mem_bytes;
    assert!((MIN_RAM..=MAX_RAM).contains(&mem), "{argv:?}: --mem {mem}");
    assert_eq!(mem % GUEST_LARGE_PAGE, 0, "{argv:?}");
    assert!((1..=MAX_VCPUS as u32).contains(&cfg.vcpus), "{argv:?}");
    assert!(!cfg.sample.is_zero(), "{argv:?}");
    let l = &cfg.layout;
    assert!(
        l.heap_start <= l.heap_end && l.heap_end <= mem,
        "{argv:?}: heap {:#x}..{:#x} in {mem:#x}",
        l.heap_start,
        l.heap_end
    );
    assert!(
        cfg.elf.end <= mem && cfg.elf.entry < cfg.elf.end,
        "{argv:?}"
    );
    if let Some(t) = &cfg.tiering {
        let fast = t
            .mem
            .tiers
            .first()
            .map_or(0, |f| f.capacity_pages as u128 * 4096);
        assert!(
            fast <= u128::from(mem),
            "{argv:?}: fast tier {fast} > {mem}"
        );
        if let Some(c) = &t.chaos {
            assert!(
                c.promote_weight.checked_add(c.demote_weight).is_some(),
                "{argv:?}: chaos weights {}+{} overflow",
                c.promote_weight,
                c.demote_weight
            );
            assert!(
                c.units_per_sec.is_finite() && c.units_per_sec > 0.0,
                "{argv:?}"
            );
        }
    }
    // Anything the VMM accepted for a built-in image, the guest parses in range.
    if let Some(spec) = cfg.image.spec {
        let entries = to_entries(&cfg.args).expect("accepted args encode");
        let guest = Args::new(&entries, Some(spec));
        for a in spec.args {
            let raw = guest.raw(a.key).expect("given or default");
            let ok = match a.kind {
                ArgKind::Size { min, max } => {
                    args::parse_size(raw).is_ok_and(|v| (min..=max).contains(&v))
                }
                ArgKind::Int { min, max } => {
                    args::parse_u64(raw).is_ok_and(|v| (min..=max).contains(&v))
                }
                ArgKind::Float { min, max } => {
                    args::parse_f64(raw).is_ok_and(|v| v >= min && v <= max)
                }
                ArgKind::Choice(words) => words.contains(&raw),
            };
            assert!(ok, "{argv:?}: the guest reads {}={raw} out of range", a.key);
        }
    }
}

fn check_run_argv(argv: &[String]) {
    let words = std::iter::once("tiervm-run".to_string()).chain(argv.iter().cloned());
    let Ok(cli) = RunCli::try_parse_from(words) else {
        return; // clap's own usage error (exit 2 in main)
    };
    match VmConfig::from_request(&cli.run.request()) {
        Ok(cfg) => {
            check_config(&cfg, argv);
            let _ = cfg.notes();
            let _ = cfg.effective_args();
        }
        Err(e) => {
            let e = tiervm_cli::error::Error::from(e);
            assert_eq!(e.exit_code(), 2, "{argv:?}: {e}");
            assert!(!e.to_string().is_empty());
        }
    }
}

fn check_compare_argv(argv: &[String]) {
    let words = std::iter::once("tiervm-compare".to_string()).chain(argv.iter().cloned());
    let Ok(cli) = CompareCli::try_parse_from(words) else {
        return;
    };
    let policies = match parse_policies(&cli.compare.policies) {
        Ok(p) => p,
        Err(e) => {
            assert_eq!(e.exit_code(), 2, "{argv:?}: {e}");
            return;
        }
    };
    for p in policies {
        match VmConfig::from_request(&cli.compare.request(p)) {
            Ok(cfg) => check_config(&cfg, argv),
            Err(e) => {
                let e = tiervm_cli::error::Error::from(e);
                assert_eq!(e.exit_code(), 2, "{argv:?}: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Corpus replay and properties
// ---------------------------------------------------------------------------

/// `tests/corpus/cli.txt`: `run|compare` then the argv words separated by
/// tabs (words may contain spaces).
#[test]
fn corpus_of_command_lines_replays() {
    let inputs = fuzzing::corpus_strings("cli");
    for line in &inputs {
        let mut words: Vec<String> = line.split('\t').map(str::to_string).collect();
        let cmd = words.remove(0);
        match cmd.as_str() {
            "run" => check_run_argv(&words),
            "compare" => check_compare_argv(&words),
            other => panic!("cli corpus: unknown command {other:?}"),
        }
    }
    eprintln!("replayed {} command lines", inputs.len());
}

proptest! {
    #![proptest_config(fuzzing::config(2000, PERSIST))]

    #[test]
    fn run_command_lines_validate_or_refuse(argv in argv(false)) {
        check_run_argv(&argv);
    }

    #[test]
    fn compare_command_lines_validate_or_refuse(argv in argv(true)) {
        check_compare_argv(&argv);
    }
}
