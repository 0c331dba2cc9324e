//! Cost of latency emulation's per-access path in the guest runtime
//! (`tiervm_guest::emulation`), on the host: every access charged (the
//! path of workloads that pay per operation, kv): the tier-map lookup
//! alone, with the cache model (32 MiB, 4-way, set-sampled) missing and
//! hitting; the default path (set sampling alone) with a 32 MiB and a
//! 256 MiB model; and the loop alone. No
//! charge is paid (charges 0), so this is what every workload access pays
//! on top of the access itself. The live, side-by-side overhead on whole
//! workloads is `tiervm emulation-check --checks overhead` (docs/results.md
//! §9).
//!
//! Run: `cargo bench -p tiervm-benches --bench emulation`.

use std::hint::black_box;
use std::sync::atomic::AtomicU64;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use tiervm_guest::abi::tier_map_set;
use tiervm_guest::emulation::{CacheModel, Charger, FRAC_BITS};
use tiervm_guest::gen::Rng;

/// Guest pages the map covers (1 GiB).
const PAGES: u64 = 1 << 18;
/// Accesses per iteration.
const N: usize = 1 << 16;

fn clock() -> u64 {
    0
}

fn zeroed(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// Random line addresses within the first `bytes` of guest memory.
fn addresses(bytes: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..N).map(|_| rng.below(bytes / 64) * 64).collect()
}

/// Charges 0 and a 1 us threshold at 2.6 GHz, as a run with both tiers at
/// DRAM latency has (without a threshold the charger would account after
/// every access).
fn ready(ch: Charger<'_>) -> Charger<'_> {
    ch.set_charges([0; 4], 2_600 << FRAC_BITS);
    ch
}

/// A map of [`PAGES`] with every other page slow.
fn alternating_map() -> Vec<AtomicU64> {
    let map = zeroed((PAGES / 32) as usize);
    for (w, word) in map.iter().enumerate() {
        let mut v = 0;
        for p in 0..32 {
            v = tier_map_set(v, p, (w as u64 * 32 + p) % 2);
        }
        word.store(v, std::sync::atomic::Ordering::Relaxed);
    }
    map
}

/// Every access of `addrs` through `ch`.
fn accesses(ch: &Charger<'_>, addrs: &[u64]) {
    for &a in addrs {
        ch.access(black_box(a), false);
    }
}

/// Every access charged: the tier lookup alone, then with the sampled
/// 32 MiB model missing (1 GiB random) and hitting (a 256 KiB hot set);
/// then the default path (set sampling alone).
fn per_access(g: &mut BenchmarkGroup<'_, WallTime>, map: &[AtomicU64], wide: &[u64]) {
    let sets = zeroed((32 << 20) / 256); // a 32 MiB model: 1 MiB of sets
    let hot = addresses(256 << 10, 2);
    let lookup = ready(Charger::new(map, PAGES, None, clock));
    g.bench_function("tier lookup (no cache model)", |b| {
        b.iter(|| accesses(&lookup, wide))
    });
    let model = ready(Charger::new(map, PAGES, CacheModel::new(&sets), clock));
    g.bench_function(
        "every access charged: sampled 32 MiB model + tier lookup (1 GiB random)",
        |b| b.iter(|| accesses(&model, wide)),
    );
    g.bench_function(
        "every access charged: 256 KiB hot set hitting the model",
        |b| b.iter(|| accesses(&model, &hot)),
    );
    // What a default run pays per access: the sampled model charging by
    // set sampling alone (`sample=8`, the default): a 32 MiB LLC's model
    // looks one line in 16 up, a 256 MiB one's one in 128.
    let dflt = ready(Charger::new(map, PAGES, CacheModel::new(&sets), clock));
    dflt.set_access_sampling(8);
    g.bench_function(
        "default path: 32 MiB model, set sampling alone (1 GiB random)",
        |b| b.iter(|| accesses(&dflt, wide)),
    );
    let big_sets = zeroed((256 << 20) / 256);
    let big = ready(Charger::new(map, PAGES, CacheModel::new(&big_sets), clock));
    big.set_access_sampling(8);
    g.bench_function(
        "default path: 256 MiB model, set sampling alone (1 GiB random)",
        |b| b.iter(|| accesses(&big, wide)),
    );
    black_box(lookup.counters());
    black_box(model.counters());
    black_box(dflt.counters());
    black_box(big.counters());
}

/// What kv pays per operation (it settles, so every access is charged):
/// a bucket line, a 1 KiB value (16 lines, one span), the slot's meta
/// line, then the settle; 256 MiB model (the host's LLC here), with
/// the host-LLC model off. Element = one operation.
fn per_kv_op(g: &mut BenchmarkGroup<'_, WallTime>, map: &[AtomicU64], wide: &[u64]) {
    let kv_sets = zeroed((256 << 20) / 256);
    let kv = ready(Charger::new(map, PAGES, CacheModel::new(&kv_sets), clock));
    kv.set_access_sampling(8);
    let values = addresses(PAGES * 4096 / 2, 3);
    g.throughput(Throughput::Elements(N as u64 / 4));
    g.bench_function(
        "kv operation: bucket + 16-line value + meta, settled",
        |b| {
            b.iter(|| {
                for i in (0..N).step_by(4) {
                    kv.access(black_box(wide[i]), false);
                    let v = values[i] & !1023;
                    kv.access_span(black_box(PAGES * 2048 + v), 16, i & 4 == 0);
                    kv.access(black_box(wide[i + 1]), i & 4 == 0);
                    kv.settle();
                }
            })
        },
    );
    g.bench_function("kv operation: the loop alone", |b| {
        b.iter(|| {
            for i in (0..N).step_by(4) {
                black_box(wide[i]);
                black_box(PAGES * 2048 + (values[i] & !1023));
                black_box(wide[i + 1]);
            }
        })
    });
    black_box(kv.counters());
}

fn bench(c: &mut Criterion) {
    let map = alternating_map();
    let mut g = c.benchmark_group("emulation_access");
    g.throughput(Throughput::Elements(N as u64));
    let wide = addresses(PAGES * 4096, 1);
    per_access(&mut g, &map, &wide);
    per_kv_op(&mut g, &map, &wide);
    g.throughput(Throughput::Elements(N as u64));
    // The loop alone, to subtract.
    g.bench_function("loop without a charger (1 GiB random)", |b| {
        b.iter(|| {
            for &a in &wide {
                black_box(a);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
