//! Simulator throughput: simulated accesses per second on one core.
//!
//! Each iteration runs one short scenario with one policy; the element
//! count is the number of simulated accesses, so criterion reports
//! accesses per second. The performance goal is >= 10 M/s.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tiering::policy::PolicyKind;
use tiering::sim;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim");
    group.sample_size(10);
    for (scenario, policy) in [
        ("nomad-medium-ro", PolicyKind::Static),
        ("nomad-medium-ro", PolicyKind::Nomad),
        ("colloid-gups-1x", PolicyKind::Colloid),
        ("mtm-4tier", PolicyKind::Mtm),
    ] {
        let mut scn = sim::builtin(scenario).expect("built-in scenario");
        scn.duration_s = if scenario == "mtm-4tier" { 400.0 } else { 20.0 };
        let accesses = sim::run(&scn, policy).expect("runs").simulated_accesses;
        group.throughput(Throughput::Elements(accesses));
        group.bench_function(format!("{scenario}/{policy}"), |b| {
            b.iter(|| sim::run(&scn, policy).expect("runs").simulated_accesses)
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
