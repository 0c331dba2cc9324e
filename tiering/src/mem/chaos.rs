//! Chaos driver: migrates random units at a fixed rate regardless of
//! hotness, to stress the mechanisms and prove their integrity on a live
//! guest.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::migrate::{BatchOutcome, Migrator};
use crate::vocab::{Mechanism, TierId, Unit};

/// Most units one batch issues (bounds a batch's work whatever the rate).
pub const MAX_UNITS_PER_BATCH: usize = 1 << 14;
/// Most pages one migrate call of the driver moves (bounds how long a stop waits).
const MAX_BATCH_PAGES: usize = 16384;

/// Chaos settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChaosConfig {
    /// Units migrated per second.
    pub units_per_sec: f64,
    /// Promotion weight of the promote:demote mix (a promotion goes to the
    /// fastest tier).
    pub promote_weight: u32,
    /// Demotion weight of the promote:demote mix (a demotion goes to a
    /// random slower tier).
    pub demote_weight: u32,
    /// Mechanism for every migration.
    pub mechanism: Mechanism,
    /// Unit size in pages: 1 (4 KiB) or 512 (2 MiB, aligned runs).
    pub unit_pages: usize,
    /// Seed of the unit choice.
    pub seed: u64,
    /// Batching interval: units due in one interval go in one batch.
    pub interval: Duration,
    /// Only pick units in these guest pages (`None`: all of guest RAM).
    pub pages: Option<std::ops::Range<usize>>,
}

impl Default for ChaosConfig {
    fn default() -> Self {
        Self {
            units_per_sec: 1000.0,
            promote_weight: 1,
            demote_weight: 1,
            mechanism: Mechanism::TPM,
            unit_pages: 1,
            seed: 1,
            interval: Duration::from_millis(10),
            pages: None,
        }
    }
}

/// What a chaos run did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChaosReport {
    /// Batches issued.
    pub batches: u64,
    /// Units requested.
    pub units: u64,
    /// Summed batch outcomes (including retries).
    pub outcome: BatchOutcome,
    /// Errors seen (the driver keeps going).
    pub errors: u64,
    /// The first error's message.
    pub first_error: Option<String>,
    /// Wall time.
    pub elapsed_ms: f64,
}

/// A running chaos thread.
#[derive(Debug)]
pub struct ChaosDriver {
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<ChaosReport>>,
}

struct Rng(u64);
impl Rng {
    /// A generator from `seed` (made odd: xorshift's state must not be 0).
    fn seeded(seed: u64) -> Self {
        Self(seed | 1)
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl ChaosDriver {
    /// Starts the driver thread.
    pub fn spawn(migrator: Arc<Migrator>, cfg: ChaosConfig) -> io::Result<Self> {
        let n = migrator.memory().guest_pages();
        if cfg.unit_pages == 0 || cfg.unit_pages > n || cfg.unit_pages > super::MAX_UNIT_PAGES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "chaos unit of {} pages does not fit a guest of {n} pages (use 1 or 512)",
                    cfg.unit_pages
                ),
            ));
        }
        if u64::from(cfg.promote_weight) + u64::from(cfg.demote_weight) == 0
            || !cfg.units_per_sec.is_finite()
            || cfg.units_per_sec <= 0.0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "chaos needs a positive rate and a non-zero promote:demote mix",
            ));
        }
        if let Some(r) = &cfg.pages {
            if unit_slots(&cfg, n).1 == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "chaos range of pages {}..{} holds no whole aligned unit of {} pages \
                         in a guest of {n} pages: widen the range or use 4 KiB units",
                        r.start, r.end, cfg.unit_pages
                    ),
                ));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let join = std::thread::Builder::new()
            .name("tiervm-chaos".into())
            .spawn(move || run(&migrator, &cfg, &s))?;
        Ok(Self {
            stop,
            join: Some(join),
        })
    }

    /// Stops the driver and returns its report.
    pub fn stop(mut self) -> io::Result<ChaosReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.join
            .take()
            .ok_or_else(|| io::Error::other("chaos driver already stopped"))?
            .join()
            .map_err(|_| io::Error::other("chaos thread panicked"))
    }
}

impl Drop for ChaosDriver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn run(m: &Migrator, cfg: &ChaosConfig, stop: &AtomicBool) -> ChaosReport {
    crate::threads::started(crate::threads::ThreadRole::Chaos);
    let start = Instant::now();
    let mut rep = ChaosReport::default();
    let mut rng = Rng::seeded(cfg.seed);
    let (base_slot, slots) = unit_slots(cfg, m.memory().guest_pages());
    let mut owed = 0.0f64;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // A rate beyond what one interval can issue is capped: the debt
        // never grows past one batch, so any rate stops on time.
        owed =
            (owed + cfg.units_per_sec * cfg.interval.as_secs_f64()).min(MAX_UNITS_PER_BATCH as f64);
        let k = owed as usize;
        owed -= k as f64;
        let tiers = m.memory().tier_count().max(1);
        let batches = draw_batches(cfg, &mut rng, base_slot, slots, tiers, k);
        rep.units += k as u64;
        issue_batches(m, cfg, stop, &batches, &mut rep);
        upkeep(m, &mut rep);
        next += cfg.interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    rep.elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    rep
}

/// The units chaos draws from, as (first, count) in units: the whole
/// units inside `cfg.pages` (all of guest RAM's `n` pages by default).
/// `spawn` refuses a configuration with none.
fn unit_slots(cfg: &ChaosConfig, n: usize) -> (usize, usize) {
    let range = cfg
        .pages
        .clone()
        .map_or(0..n, |r| r.start.min(n)..r.end.min(n));
    let base_slot = range.start.div_ceil(cfg.unit_pages);
    let slots = (range.end / cfg.unit_pages).saturating_sub(base_slot);
    (base_slot, slots)
}

/// `k` random units of `cfg.unit_pages` pages, each at a random one of the
/// `slots` unit slots from `base_slot` (at least one), sorted by their
/// random destination: a batch per tier of `tiers`, promotions (to tier 0)
/// weighted against demotions by the configuration.
fn draw_batches(
    cfg: &ChaosConfig,
    rng: &mut Rng,
    base_slot: usize,
    slots: usize,
    tiers: usize,
    k: usize,
) -> Vec<Vec<Unit>> {
    let mut batches: Vec<Vec<Unit>> = vec![Vec::new(); tiers];
    let total_w = u64::from(cfg.promote_weight) + u64::from(cfg.demote_weight);
    for _ in 0..k {
        let u = Unit::run(
            ((base_slot + rng.next() as usize % slots) * cfg.unit_pages) as u64,
            cfg.unit_pages as u32,
        );
        let to = if rng.next() % total_w < u64::from(cfg.promote_weight) || tiers == 1 {
            0
        } else {
            1 + rng.next() as usize % (tiers - 1)
        };
        batches[to].push(u);
    }
    batches
}

/// Migrates each tier's batch to that tier, counting outcomes and errors
/// into `rep`.
fn issue_batches(
    m: &Migrator,
    cfg: &ChaosConfig,
    stop: &AtomicBool,
    batches: &[Vec<Unit>],
    rep: &mut ChaosReport,
) {
    // At most MAX_BATCH_PAGES per call, and a stop is honoured between
    // calls: a stop waits for one such batch whatever the unit size.
    let chunk = (MAX_BATCH_PAGES / cfg.unit_pages).max(1);
    let calls = batches
        .iter()
        .enumerate()
        .flat_map(|(to, units)| units.chunks(chunk).map(move |c| (to, c)));
    for (to, units) in calls {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        rep.batches += 1;
        let r = m.migrate(units, to as TierId, cfg.mechanism);
        match r {
            Ok(o) => rep.outcome.add(&o),
            Err(e) => {
                rep.errors += 1;
                tracing::warn!("chaos batch: {e}");
                rep.first_error.get_or_insert(e.to_string());
            }
        }
    }
}

/// What a mover does between batches: the due retries and a harvest,
/// counting outcomes and errors into `rep`.
fn upkeep(m: &Migrator, rep: &mut ChaosReport) {
    match m.run_due_retries() {
        Ok(o) => rep.outcome.add(&o),
        Err(e) => {
            rep.errors += 1;
            rep.first_error.get_or_insert(e.to_string());
        }
    }
    if let Err(e) = m.harvest() {
        rep.errors += 1;
        rep.first_error.get_or_insert(e.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(promote: u32, demote: u32, unit_pages: usize) -> ChaosConfig {
        ChaosConfig {
            promote_weight: promote,
            demote_weight: demote,
            unit_pages,
            ..ChaosConfig::default()
        }
    }

    /// A batch the migrator refuses (a tier it does not have) is counted as
    /// one batch and one error, its message kept; the batches of the real
    /// tiers go on.
    #[test]
    fn a_refused_batch_counts_one_error() {
        use crate::mem::tests::setup;
        use crate::mem::InitialPlacement;
        let Some((_mem, _log, m, _faults)) = setup(64, 64, InitialPlacement::SlowFirst) else {
            return;
        };
        let mut rep = ChaosReport::default();
        let stop = AtomicBool::new(false);
        let batches = vec![vec![Unit::page(3)], Vec::new(), vec![Unit::page(5)]];
        issue_batches(&m, &cfg(1, 1, 1), &stop, &batches, &mut rep);
        assert_eq!((rep.batches, rep.errors), (2, 1), "{rep:?}");
        assert_eq!(rep.outcome.committed, 1, "{rep:?}");
        assert!(rep.first_error.is_some(), "{rep:?}");
    }

    /// Upkeep counts a failed retry and a failed harvest as one error
    /// each: here a TPM aborted by a write in its copy window is retried
    /// while the dirty log cannot be read, so both fail.
    #[test]
    fn a_failed_retry_and_a_failed_harvest_count_one_error_each() {
        use crate::mem::tests::{guest_write, setup};
        use crate::mem::InitialPlacement;
        use crate::test_point::{with_action, TestPoint};
        let Some((mem, log, m, _faults)) = setup(64, 64, InitialPlacement::SlowFirst) else {
            return;
        };
        let fired = Arc::new(AtomicBool::new(false));
        let (mm, lg, f) = (mem.clone(), log.clone(), fired.clone());
        let out = with_action(
            move |point| {
                if point == TestPoint::TpmCopied && !f.swap(true, Ordering::SeqCst) {
                    guest_write(&mm, &lg, 7, 7);
                }
            },
            || m.promote(&[Unit::page(7)], Mechanism::TPM),
        )
        .unwrap();
        assert_eq!((out.aborted, m.pending_retries()), (1, 1), "{out:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        mem.injector().set(&[crate::inject::FaultPlan {
            point: crate::inject::FaultPoint::DirtyGet,
            every: 1,
            errno: libc::EIO,
            max: u64::MAX,
            moved_pages: 0,
        }]);
        let mut rep = ChaosReport::default();
        upkeep(&m, &mut rep);
        mem.injector().set(&[]);
        assert_eq!(m.pending_retries(), 0, "the due retry was run");
        assert_eq!(rep.errors, 2, "{rep:?}");
        assert!(rep.first_error.is_some(), "{rep:?}");
        let mut ok = ChaosReport::default();
        upkeep(&m, &mut ok);
        assert_eq!(ok.errors, 0, "{ok:?}");
    }

    /// Every drawn unit is a whole, aligned unit inside the slots given
    /// (`base_slot..base_slot+slots`, in units), `k` of them in all.
    #[test]
    fn drawn_units_are_whole_aligned_units_of_the_range() {
        for unit in [1usize, 512] {
            let c = cfg(1, 1, unit);
            let mut rng = Rng(7);
            let (base, slots) = (3, 5);
            let b = draw_batches(&c, &mut rng, base, slots, 2, 1000);
            assert_eq!(b.iter().map(Vec::len).sum::<usize>(), 1000);
            let mut seen = std::collections::BTreeSet::new();
            for u in b.iter().flatten() {
                assert_eq!(u.pages as usize, unit, "{u:?}");
                let first = u.page as usize;
                assert_eq!(first % unit, 0, "{u:?} not aligned");
                let slot = first / unit;
                assert!(
                    (base..base + slots).contains(&slot),
                    "{u:?} outside the range"
                );
                seen.insert(slot);
            }
            assert_eq!(seen.len(), slots, "every slot drawn in 1000 draws");
        }
    }

    /// The promote:demote mix sends units to the fastest tier in its share
    /// and the rest to the slower tiers, each of them; one tier takes all.
    #[test]
    fn the_mix_sends_units_to_the_tiers_by_its_weights() {
        let draw = |p, d, tiers| {
            let b = draw_batches(&cfg(p, d, 1), &mut Rng(11), 0, 1000, tiers, 4000);
            b.iter().map(Vec::len).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 0, 3), vec![4000, 0, 0]);
        let only_down = draw(0, 1, 3);
        assert_eq!(only_down[0], 0);
        assert!(only_down[1] > 1500 && only_down[2] > 1500, "{only_down:?}");
        let three_to_one = draw(3, 1, 2);
        assert!(
            (2800..3200).contains(&three_to_one[0]),
            "3:1 promote:demote gave {three_to_one:?}"
        );
        assert_eq!(draw(0, 1, 1), vec![4000], "one tier takes every unit");
    }

    /// The units drawn from: every whole unit of the range, of all guest
    /// RAM by default, clamped to it.
    #[test]
    fn the_units_drawn_from_are_the_whole_units_of_the_range() {
        let slots = |pages: Option<std::ops::Range<usize>>, unit| {
            unit_slots(
                &ChaosConfig {
                    pages,
                    ..cfg(1, 1, unit)
                },
                1024,
            )
        };
        assert_eq!(slots(None, 1), (0, 1024));
        assert_eq!(slots(None, 512), (0, 2));
        assert_eq!(slots(Some(100..700), 1), (100, 600));
        assert_eq!(slots(Some(100..2000), 4), (25, 231));
        assert_eq!(slots(Some(0..600), 512), (0, 1));
        // No whole unit: none (spawn refuses it), never one past the end.
        assert_eq!(slots(Some(100..700), 512), (1, 0));
        assert_eq!(slots(Some(1000..1030), 4), (250, 6));
        assert_eq!(slots(Some(2000..3000), 1), (1024, 0));
    }

    /// Any seed gives a live generator (an even one too: the state must not
    /// be 0, which xorshift never leaves).
    #[test]
    fn every_seed_gives_a_generator_that_moves() {
        for seed in [0, 1, 2, 1 << 40] {
            let mut r = Rng::seeded(seed);
            let (a, b) = (r.next(), r.next());
            assert!(a != 0 && a != b, "seed {seed}: {a} {b}");
        }
    }

    /// The generator is xorshift64*: a fixed sequence per seed, never stuck.
    #[test]
    fn the_generator_is_xorshift64_star() {
        let mut r = Rng(1);
        let first: Vec<u64> = (0..3).map(|_| r.next()).collect();
        // xorshift64* from state 1.
        let mut x: u64 = 1;
        let want: Vec<u64> = (0..3)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                x.wrapping_mul(0x2545_f491_4f6c_dd1d)
            })
            .collect();
        assert_eq!(first, want);
        assert_eq!(first[0], 5_180_492_295_206_395_165);
        assert_ne!(first[0], first[1]);
    }
}
