//! How much of a skewed workload's memory traffic a fast tier can hold, by
//! placement unit (MODELED from the guest's own generators; no VM is run).
//!
//! `docs/results.md` §13 uses it to say why no policy reaches 1.2x static in
//! some skewed cells of the live matrix: the fast tier holds whole 2 MiB
//! ranges there, and the workloads spread their hot pages over every range
//! (`zipf`: YCSB's FNV scramble, the guest's [`Zipf::item_of_rank`]; `gups`:
//! a seeded random subset of pages, [`GupsPattern::hot_page`]).
//!
//! For each resident set it prints the share of the accesses that miss the
//! last-level cache which the fast tier holds
//! - by address (fast-first static: a placement blind to accesses),
//! - with the best whole 2 MiB ranges (a perfect range-granular policy),
//! - with the best 4 KiB pages (a perfect page-granular policy),
//!
//! and the speed-up over slow-first static each share bounds,
//! `1 / ((1 - f) + f / ceiling)`, for the measured `all-fast` ceilings given
//! on the command line (an access that misses the cache costs its tier's
//! latency; one that hits costs nothing more on either tier).
//!
//! The cache model: the last-level cache holds the hottest pages whole
//! (`--llc`, default 32 MiB, this host's L3), so it absorbs the most traffic
//! any cache of that size could. That is optimistic about hits and so leaves
//! the misses as spread out as they can be; with `--llc 0` nothing is cached.
//! Guest-physical alignment of the workload's buffer is taken as 2 MiB.
//!
//! Run: `cargo run --release -p tiervm-benches --example placement_bound --
//! [--workload zipf|gups] [--rss 768,2048] [--fast 256] [--llc 32] [--theta 0.99]
//! [--scramble 1] [--ceiling 1.56,1.8,1.98]` (sizes in MiB; gups with the live
//! matrix's arguments: a hot set of a third of the buffer, 90% of the
//! operations, the matrix's seed 5).

use std::process::ExitCode;

use tiervm_guest::gen::Zipf;
use tiervm_guest::workloads::gups::{GupsParams, GupsPattern};

const PAGE: u64 = 4096;
const RANGE_PAGES: usize = 512;
/// Largest size the options take, MiB (64 GiB: 256 MiB of model).
const MAX_MIB: u64 = 64 << 10;

struct Args {
    gups: bool,
    rss_mib: Vec<u64>,
    fast_mib: u64,
    llc_mib: u64,
    theta: f64,
    scrambled: bool,
    ceilings: Vec<f64>,
}

fn parse_list<T: std::str::FromStr>(flag: &str, v: &str) -> Result<Vec<T>, String> {
    v.split(',')
        .map(|s| {
            s.trim().parse::<T>().map_err(|_| {
                format!("{flag} {v}: `{s}` is not a number: give a comma-separated list such as 768,2048")
            })
        })
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        gups: false,
        rss_mib: vec![768, 2048],
        fast_mib: 256,
        llc_mib: 32,
        theta: 0.99,
        scrambled: true,
        ceilings: vec![1.56, 1.8, 1.98],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| format!("{flag}: missing value: give it one, e.g. `{flag} 256`"))?;
        let one = |f: &str| -> Result<u64, String> {
            parse_list::<u64>(f, v)?
                .first()
                .copied()
                .ok_or_else(|| format!("{f}: empty"))
        };
        match flag.as_str() {
            "--workload" => {
                a.gups = match v.as_str() {
                    "zipf" => false,
                    "gups" => true,
                    _ => return Err(format!("--workload {v}: unknown: give zipf or gups")),
                }
            }
            "--rss" => a.rss_mib = parse_list(flag, v)?,
            "--fast" => a.fast_mib = one(flag)?,
            "--llc" => a.llc_mib = one(flag)?,
            "--theta" => a.theta = parse_list::<f64>(flag, v)?.first().copied().unwrap_or(0.99),
            "--ceiling" => a.ceilings = parse_list(flag, v)?,
            "--scramble" => a.scrambled = one(flag)? != 0,
            _ => {
                return Err(format!(
                    "unknown option {flag}: the options are --workload, --rss, --fast, --llc, --theta, --scramble, --ceiling"
                ))
            }
        }
    }
    if a.fast_mib < 2 || a.rss_mib.iter().any(|&r| r < 2) {
        return Err("--rss and --fast: give at least 2 MiB (one 2 MiB range)".into());
    }
    if a.rss_mib.iter().any(|&r| r > MAX_MIB) || a.fast_mib > MAX_MIB || a.llc_mib > MAX_MIB {
        return Err(format!(
            "--rss, --fast and --llc: at most {MAX_MIB} MiB (the model holds 16 bytes per page)"
        ));
    }
    if a.ceilings.iter().any(|c| !(c.is_finite() && *c > 0.0)) {
        return Err("--ceiling: give positive ratios such as 1.8,2.1".into());
    }
    Ok(a)
}

/// The share of `mass` held by its `k` largest entries.
fn top_share(mass: &[f64], k: usize) -> f64 {
    let mut m = mass.to_vec();
    m.sort_by(|a, b| b.total_cmp(a));
    m.iter().take(k).sum()
}

/// Per-page access probability of Zipf over `pages` pages (the guest's
/// `zipf` workload draws a page, then a line of it).
fn page_mass(pages: u64, theta: f64, scrambled: bool) -> Vec<f64> {
    let zipf = Zipf::new(pages, theta, scrambled);
    let mut mass = vec![0.0; pages as usize];
    for rank in 0..pages {
        let item = zipf.item_of_rank(rank) as usize;
        if let Some(m) = mass.get_mut(item) {
            *m += zipf.rank_probability(rank);
        }
    }
    mass
}

/// Per-page access probability of GUPS over `pages` pages with the live
/// matrix's arguments (`benches/scripts/live_matrix.py`: a hot set of a
/// third of the buffer in whole 2 MiB units, `hot_prob` 0.9, seed 5).
fn gups_mass(pages: u64) -> Vec<f64> {
    let size = pages * PAGE;
    let hot_size = (size / 3 / (2 << 20)).max(1) * (2 << 20);
    let p = GupsParams {
        size,
        hot_size,
        hot_prob: 0.9,
        object: 64,
    };
    let pattern = GupsPattern::new(&p, 5);
    let hot = pattern.hot_pages().max(1);
    let mut mass = vec![(1.0 - p.hot_prob) / pages as f64; pages as usize];
    for i in 0..hot {
        if let Some(m) = mass.get_mut(pattern.hot_page(i) as usize) {
            *m += p.hot_prob / hot as f64;
        }
    }
    mass
}

fn bound(f: f64, ceiling: f64) -> f64 {
    1.0 / ((1.0 - f) + f / ceiling)
}

/// One resident set's shares and bounds, printed.
fn report(args: &Args, rss: u64) {
    let pages = rss * (1 << 20) / PAGE;
    let mut mass = if args.gups {
        gups_mass(pages)
    } else {
        page_mass(pages, args.theta, args.scrambled)
    };
    // The cache takes the hottest pages' traffic.
    let cached_pages = (args.llc_mib * (1 << 20) / PAGE) as usize;
    let mut order: Vec<usize> = (0..mass.len()).collect();
    order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
    let hit = order
        .iter()
        .take(cached_pages)
        .fold(0.0, |sum, &i| sum + mass[i]);
    for &i in order.iter().take(cached_pages) {
        mass[i] = 0.0;
    }
    let miss = 1.0 - hit;
    if miss <= 0.0 {
        println!("rss {rss} MiB: the cache holds every access; no placement matters");
        return;
    }
    mass.iter_mut().for_each(|m| *m /= miss);
    let fast_pages = (args.fast_mib * (1 << 20) / PAGE) as usize;
    let by_address = (fast_pages as f64 / pages as f64).min(1.0);
    let ranges: Vec<f64> = mass.chunks(RANGE_PAGES).map(|c| c.iter().sum()).collect();
    let best_ranges = top_share(&ranges, fast_pages / RANGE_PAGES);
    let best_pages = top_share(&mass, fast_pages);
    println!(
        "rss {rss} MiB: cache hits {:.1}% of accesses; of the misses the fast tier holds {:.1}% by address, {:.1}% with the best 2 MiB ranges, {:.1}% with the best 4 KiB pages",
        100.0 * hit,
        100.0 * by_address,
        100.0 * best_ranges,
        100.0 * best_pages
    );
    for &c in &args.ceilings {
        println!(
            "  all-fast {c:.2}x static: bound by address {:.2}x, best ranges {:.2}x, best pages {:.2}x",
            bound(by_address, c),
            bound(best_ranges, c),
            bound(best_pages, c)
        );
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("placement_bound: {e}");
            return ExitCode::from(2);
        }
    };
    let what = if args.gups {
        "GUPS (hot set a third of the buffer, 90% of operations)".to_string()
    } else {
        let order = if args.scrambled {
            "scrambled"
        } else {
            "not scrambled: hottest pages first"
        };
        format!("Zipf (theta {}, {order})", args.theta)
    };
    println!(
        "MODELED from the guest's {what} generator, LLC {} MiB holding the hottest pages, fast tier {} MiB",
        args.llc_mib, args.fast_mib
    );
    for &rss in &args.rss_mib {
        report(&args, rss);
    }
    ExitCode::SUCCESS
}
