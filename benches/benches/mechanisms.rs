//! Cost of the migration mechanisms on ordinary process memory with the
//! software dirty log (`tiering::mem`). Under KVM, each transaction batch adds
//! one `KVM_CLEAR_DIRTY_LOG` per armed 64-page chunk and two
//! `KVM_GET_DIRTY_LOG` calls (arm and check), which these numbers do not include.
//!
//! Throughput is reported in pages (elements) per second for one mover thread.
//! Run: `cargo bench -p tiervm-benches --bench mechanisms`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tiering::mem::{
    InitialPlacement, Mechanism, MemConfig, Migrator, MigratorConfig, SoftDirtyLog, TieredMemory,
    Unit, PAGE_SIZE,
};

const PAGES: usize = 16384; // 64 MiB guest

fn setup() -> Option<(Arc<TieredMemory>, Migrator)> {
    let mut cfg = MemConfig::new(PAGES * PAGE_SIZE, PAGES);
    cfg.placement = InitialPlacement::SlowFirst;
    cfg.tiers[1].capacity_pages = 2 * PAGES;
    cfg.tiers[1].max_capacity_pages = 2 * PAGES;
    let mem = match TieredMemory::new(&cfg) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("SKIP mechanisms bench: {e}");
            return None;
        }
    };
    // Every page committed (on the slow tier) before anything is timed.
    mem.prefault(0, PAGES).ok()?;
    let log = Box::new(SoftDirtyLog::new(PAGES));
    let m = Migrator::new(mem.clone(), log, MigratorConfig::default()).ok()?;
    Some((mem, m))
}

/// `batch` scattered single pages (every third page), shifted per round.
fn scattered(batch: usize, round: u64) -> Vec<Unit> {
    let base = (round as usize * 7919) % (PAGES - 3 * batch);
    (0..batch)
        .map(|i| Unit::page((base + 3 * i) as u64))
        .collect()
}

/// `runs` aligned 2 MiB runs, shifted per round.
fn runs(count: usize, round: u64) -> Vec<Unit> {
    let slots = PAGES / 512;
    (0..count)
        .map(|i| Unit::run((((round as usize + i * 3) % slots) * 512) as u64, 512))
        .collect()
}

/// Times `timed` over `iters` rounds; `before` and `after` run untimed.
fn measure(
    iters: u64,
    mut before: impl FnMut(u64),
    mut timed: impl FnMut(u64),
    mut after: impl FnMut(u64),
) -> Duration {
    let mut total = Duration::ZERO;
    for r in 0..iters {
        before(r);
        let t = Instant::now();
        timed(r);
        total += t.elapsed();
        after(r);
    }
    total
}

fn promote_benches(c: &mut Criterion) {
    let Some((_mem, m)) = setup() else { return };
    let mut g = c.benchmark_group("promote");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let cases: Vec<(&str, usize, bool)> = vec![
        ("4k", 1, false),
        ("4k", 64, false),
        ("4k", 512, false),
        ("2m", 1, true),
    ];
    for (mech_name, mech) in [
        ("tpm", Mechanism::TPM),
        ("stop_copy", Mechanism::StopAndCopy),
    ] {
        for &(unit, batch, is_run) in &cases {
            if mech == Mechanism::StopAndCopy && batch == 512 {
                continue;
            }
            let pages = if is_run { 512 * batch } else { batch };
            g.throughput(Throughput::Elements(pages as u64));
            g.bench_function(
                BenchmarkId::new(format!("{mech_name}_{unit}"), batch),
                |b| {
                    b.iter_custom(|iters| {
                        let units = |r| {
                            if is_run {
                                runs(batch, r)
                            } else {
                                scattered(batch, r)
                            }
                        };
                        measure(
                            iters,
                            |_| {},
                            |r| {
                                let o = m.promote(&units(r), mech).unwrap();
                                assert_eq!(o.migrated, pages, "{o:?}");
                                black_box(o);
                            },
                            |r| {
                                m.demote(&units(r), Mechanism::StopAndCopy).unwrap();
                            },
                        )
                    })
                },
            );
        }
    }
    g.finish();
}

fn demote_benches(c: &mut Criterion) {
    let Some((_mem, m)) = setup() else { return };
    let mut g = c.benchmark_group("demote");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for (unit, batch, is_run) in [("4k", 64usize, false), ("2m", 1, true)] {
        let pages = if is_run { 512 * batch } else { batch };
        let units = move |r| {
            if is_run {
                runs(batch, r)
            } else {
                scattered(batch, r)
            }
        };
        g.throughput(Throughput::Elements(pages as u64));
        // Shadow demotion: promoted with TPM, never written: remap, no copy.
        g.bench_function(BenchmarkId::new(format!("shadow_{unit}"), batch), |b| {
            b.iter_custom(|iters| {
                measure(
                    iters,
                    |r| {
                        m.promote(&units(r), Mechanism::TPM).unwrap();
                    },
                    |r| {
                        let o = m.demote(&units(r), Mechanism::TPM).unwrap();
                        assert_eq!(o.shadow_demoted, pages, "{o:?}");
                    },
                    |_| {},
                )
            })
        });
        // Copy demotion: promoted without a shadow, demoted with TPM.
        g.bench_function(BenchmarkId::new(format!("tpm_copy_{unit}"), batch), |b| {
            b.iter_custom(|iters| {
                measure(
                    iters,
                    |r| {
                        m.promote(&units(r), Mechanism::StopAndCopy).unwrap();
                    },
                    |r| {
                        let o = m.demote(&units(r), Mechanism::TPM).unwrap();
                        assert_eq!(o.committed, units(r).len(), "{o:?}");
                    },
                    |_| {},
                )
            })
        });
    }
    g.finish();
}

fn setup_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("setup");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(3));
    // 256 MiB guest with 64 MiB fast: reserving and registering only (lazy
    // commit: nothing is populated at creation).
    for (name, placement) in [
        ("fast_first", InitialPlacement::FastFirst),
        ("random", InitialPlacement::Random { seed: 1 }),
    ] {
        g.throughput(Throughput::Bytes(256 << 20));
        g.bench_function(BenchmarkId::new("256MiB", name), |b| {
            b.iter(|| {
                let mut cfg = MemConfig::new(256 << 20, 16384);
                cfg.placement = placement;
                black_box(TieredMemory::new(&cfg).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, promote_benches, demote_benches, setup_bench);
criterion_main!(benches);
