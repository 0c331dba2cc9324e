//! CPU cost of one policy decision (`Policy::tick`), real (measured on this
//! host), for `adaptive` and the policies it borrows from.
//!
//! The memory: 1 Mi guest pages (4 GiB) over a 256 Ki-page fast tier and a
//! slow tier, the fast tier full. Each tick receives 1,000 access samples
//! (Zipf-like: a quarter of them to 256 hot slow-tier pages, the rest spread
//! over the guest), so every tick has misplaced hot pages to promote and
//! cold pages to demote. Decisions are not applied, so every iteration
//! decides on the same placement. Criterion's element count is one tick.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tiering::policy::{
    AccessSample, MemoryView, Observations, PolicyConfig, PolicyKind, TierId, TierStatus,
};

const PAGES: u64 = 1 << 20;
const FAST: u64 = 1 << 18;

struct View {
    tier: Vec<TierId>,
    accessed: Vec<bool>,
}

impl MemoryView for View {
    fn pages(&self) -> u64 {
        self.tier.len() as u64
    }
    fn tier_of(&self, page: u64) -> TierId {
        self.tier[page as usize]
    }
    fn shadow_tier(&self, _page: u64) -> Option<TierId> {
        None
    }
    fn test_and_clear_accessed(&mut self, page: u64) -> bool {
        std::mem::replace(&mut self.accessed[page as usize], false)
    }
}

fn samples() -> Vec<AccessSample> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..1000u64)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let page = if i % 4 == 0 {
                FAST + 1000 + x % 256
            } else {
                x % PAGES
            };
            AccessSample {
                page,
                tier: if page < FAST { 0 } else { 1 },
                write: i % 8 == 0,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy_tick");
    group.sample_size(20);
    group.throughput(Throughput::Elements(1));
    let cfg = PolicyConfig::new(PAGES, vec![FAST, PAGES]);
    let tiers = [
        TierStatus {
            capacity_pages: FAST,
            free_pages: 0,
            shadow_pages: 0,
            loaded_latency_ns: Some(90.0),
            request_rate: Some(5e7),
            unloaded_latency_ns: Some(80.0),
        },
        TierStatus {
            capacity_pages: PAGES,
            free_pages: PAGES - (PAGES - FAST),
            shadow_pages: 0,
            loaded_latency_ns: Some(200.0),
            request_rate: Some(5e7),
            unloaded_latency_ns: Some(135.0),
        },
    ];
    let s = samples();
    for kind in [
        PolicyKind::Adaptive,
        PolicyKind::Memtis,
        PolicyKind::Colloid,
        PolicyKind::Mtm,
    ] {
        let mut policy = kind.build(&cfg).expect("builds");
        let mut view = View {
            tier: (0..PAGES).map(|p| if p < FAST { 0 } else { 1 }).collect(),
            accessed: vec![true; PAGES as usize],
        };
        let mut now = 0u64;
        group.bench_function(kind.name(), |b| {
            b.iter(|| {
                now += policy.tick_interval_ns();
                let o = Observations {
                    now_ns: now,
                    tiers: &tiers,
                    samples: &s,
                    tpm_outcomes: &[],
                    dirty: &[],
                };
                policy.tick(&o, &mut view).migrations.len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
