//! Tests that catch the planted bugs of issue 34 (one test per bug that
//! survived the suite): each was run once with its bug planted and seen to
//! fail (the closing note says how).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::backing::{Parker, Staging};
use super::pool::Holds;
use super::tests::{setup, wait_until};
use super::*;
use crate::inject::{FaultPlan, FaultPoint};

fn word(mem: &TieredMemory, page: usize) -> &AtomicU64 {
    // SAFETY: page < guest_pages (callers), guest RAM is mapped for the memory's lifetime
    // and 8-byte aligned; all test accesses to it are atomic.
    unsafe { &*((mem.guest_ptr() as usize + page * PAGE_SIZE) as *const AtomicU64) }
}

fn fill(mem: &TieredMemory) {
    for p in 0..mem.guest_pages() {
        word(mem, p).store(p as u64 * 1000, Ordering::SeqCst);
    }
}

/// Tiered memory without a fault handler and without any page committed;
/// `None` (the test skips, or fails under `TIERVM_REQUIRE_KVM=1`) when
/// userfaultfd with UFFDIO_MOVE is unavailable.
fn bare(cfg: &MemConfig) -> Option<Arc<TieredMemory>> {
    if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
        return None;
    }
    Some(Arc::new(
        TieredMemory::new(cfg).expect("TieredMemory::new on a capable host"),
    ))
}

// ---- 1. The wake after a touched parked page is mapped back ----

/// What the test does to a parked page after its toucher faulted and
/// before the fault handler maps it back (from inside the handler, through
/// the fault-path hook, so the toucher is really blocked in the kernel).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Before {
    /// Nothing: the move back succeeds (`MapBack::Moved`).
    Nothing,
    /// The parked page is moved back without waking anyone: the move back
    /// fails, guest RAM has the page and the slot is empty (`AlreadyBack`).
    MoveBackQuietly,
    /// A copy with the same bytes appears in guest RAM (`Duplicate`).
    SameCopy,
    /// Other, non-zero bytes appear in guest RAM (`KeptGuestCopy`).
    OtherCopy(u64),
    /// A zero-filled page appears in guest RAM (`ParkedCopyWon`).
    ZeroFill,
    /// Every move back fails with EBUSY (an error: `Copied`).
    MovesFail,
    /// The fault-path policy promotes the page, and the promotion's move
    /// fails (an error; then the usual map-back).
    PromotionFails,
    /// The fault-path policy promotes the page (its move wakes the toucher).
    Promote,
}

/// A fresh page holding the bytes of `src` (zeros if `None`), its first
/// word replaced by `word0` if given, moved into the hole at `dst` without
/// waking its waiters.
fn fill_hole_quietly(mem: &TieredMemory, dst: usize, src: Option<usize>, word0: Option<u64>) {
    let tier = 1;
    let st = mem
        .reserve_staging(tier, 1, Holds::Hole)
        .expect("a pool slot");
    let a = st.addr(mem, tier, 0);
    match src {
        // SAFETY: `a` is a reserved pool slot of our mapping (a hole is allocated by the
        // write); `src` is a present page of our mapping the caller owns; no overlap.
        Some(src) => unsafe {
            crate::sys::copy_volatile(a as *mut u8, src as *const u8, PAGE_SIZE)
        },
        // SAFETY: as above.
        None => unsafe { crate::sys::zero_volatile(a as *mut u8, PAGE_SIZE) },
    }
    if let Some(w) = word0 {
        // SAFETY: `a` is the page just written, 8-byte aligned.
        unsafe { (a as *mut u64).write_volatile(w) };
    }
    mem.move_range(dst, a, PAGE_SIZE, false)
        .expect("fill the hole");
    mem.release_staging(tier, &st, Holds::Hole, false);
}

fn act(mem: &TieredMemory, page: usize, before: Before) -> bool {
    let (guest, park) = (mem.guest_addr(page), mem.park_addr(page));
    match before {
        Before::Nothing => {}
        Before::MoveBackQuietly => mem
            .move_range(guest, park, PAGE_SIZE, false)
            .expect("move the parked page back quietly"),
        Before::SameCopy => fill_hole_quietly(mem, guest, Some(park), None),
        Before::OtherCopy(w) => fill_hole_quietly(mem, guest, Some(park), Some(w)),
        Before::ZeroFill => fill_hole_quietly(mem, guest, None, None),
        Before::MovesFail => mem
            .injector()
            .set(&[FaultPlan::parse("move:errno=EBUSY:max=8").unwrap()]),
        Before::PromotionFails => {
            mem.injector()
                .set(&[FaultPlan::parse("move:errno=EIO:max=1").unwrap()]);
            return true;
        }
        Before::Promote => return true,
    }
    false
}

/// Touches `page` on a thread of its own, as a vCPU would, and returns the
/// word it read, or `Err` if the toucher was not woken within 10 s (the
/// test then wakes it itself so that nothing stays blocked).
fn touch_parked(mem: &Arc<TieredMemory>, page: usize, what: &str) -> Result<u64, String> {
    let addr = mem.guest_addr(page);
    let (tx, rx) = std::sync::mpsc::channel();
    let toucher = std::thread::spawn(move || {
        // SAFETY: `addr` is an aligned word of guest RAM, which the test's
        // memory keeps mapped until after this thread ended (joined below, or
        // woken and waited for on failure).
        let v = unsafe { &*(addr as *const AtomicU64) }.load(Ordering::SeqCst);
        let _ = tx.send(v);
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(v) => {
            toucher.join().unwrap();
            Ok(v)
        }
        Err(_) => {
            // Free the toucher (it sleeps in the kernel on its userfault).
            let _ = mem.uffd.wake(addr, PAGE_SIZE);
            let _ = rx.recv_timeout(Duration::from_secs(5));
            Err(format!(
                "{what}: the thread touching parked page {page} was not woken within 10 s \
                 (the fault handler mapped the page back and never woke it)"
            ))
        }
    }
}

/// A real thread blocked on a parked page (its touch raised a userfault the
/// real fault handler thread serves) returns in bounded time whatever the
/// map-back ends in: moved back, already back, a duplicate, the guest's
/// copy kept, the parked copy winning over a zero fill, copied after the
/// moves failed, and with a fault-path promotion that succeeds or fails.
/// Planted bug: the `UFFDIO_WAKE` after `map_back_touched` dropped (the
/// toucher then sleeps for ever on AlreadyBack, Duplicate, KeptGuestCopy).
#[test]
fn a_thread_blocked_on_a_parked_page_returns_whatever_the_map_back_does() {
    let Some((mem, _log, _m, faults)) = setup(1024, 1024, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    let next: Arc<Mutex<Option<(usize, Before)>>> = Arc::new(Mutex::new(None));
    let weak: Weak<TieredMemory> = Arc::downgrade(&mem);
    let n = next.clone();
    mem.set_fault_path_hook(Some(Arc::new(move |rec: &HintFaultRecord| {
        let Some(mem) = weak.upgrade() else {
            return false;
        };
        let page = rec.page as usize;
        // (Never a panic here: it would end the fault handler thread.)
        let mut n = n.lock().unwrap_or_else(|p| p.into_inner());
        match *n {
            Some((p, before)) if p == page => {
                *n = None;
                act(&mem, page, before)
            }
            _ => false,
        }
    })));
    let cases = [
        (Before::Nothing, None),
        (Before::MoveBackQuietly, None),
        (Before::SameCopy, None),
        (Before::OtherCopy(4242), Some(4242)),
        (Before::ZeroFill, None),
        (Before::MovesFail, None),
        (Before::PromotionFails, None),
        (Before::Promote, None),
    ];
    let mut hung = Vec::new();
    for (i, (before, want)) in cases.into_iter().enumerate() {
        let page = 100 + 2 * i;
        assert_eq!(
            mem.park_pages(&[page], Parker::Sampler).unwrap(),
            vec![page]
        );
        let counters = |m: &TieredMemory| {
            (
                m.counters.unpark_failures.load(Ordering::Relaxed),
                m.counters.unpark_conflicts.load(Ordering::Relaxed),
                m.counters.promotions.load(Ordering::Relaxed),
            )
        };
        let (failures, conflicts, promotions) = counters(&mem);
        *next.lock().unwrap() = Some((page, before));
        let what = format!("{before:?}");
        let got = match touch_parked(&mem, page, &what) {
            Ok(v) => v,
            Err(e) => {
                // Go on with the other outcomes: the failure lists all.
                hung.push(e);
                mem.injector().set(&[]);
                continue;
            }
        };
        let fired = mem.injector().fired(FaultPoint::Move);
        mem.injector().set(&[]);
        assert_eq!(got, want.unwrap_or(page as u64 * 1000), "{what}");
        assert!(next.lock().unwrap().is_none(), "{what}: the hook never ran");
        // The move that woke the toucher comes before the handler's release
        // of the page: wait (bounded) for the release.
        let t0 = std::time::Instant::now();
        while mem.pages.load(page) & (page_map::BUSY | page_map::PARKED) != 0
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            mem.pages.load(page) & (page_map::BUSY | page_map::PARKED),
            0,
            "{what}: still owned or parked"
        );
        // The map-back took the path the case is about.
        let (f, c, p) = counters(&mem);
        let expect = match before {
            Before::Nothing | Before::PromotionFails => (0, 0, 0),
            Before::MoveBackQuietly
            | Before::SameCopy
            | Before::OtherCopy(_)
            | Before::ZeroFill => (1, 1, 0),
            Before::MovesFail => (1, 0, 0),
            Before::Promote => (0, 0, 1),
        };
        assert_eq!(
            (f - failures, c - conflicts, p - promotions),
            expect,
            "{what}: (unpark failures, conflicts, promotions)"
        );
        let want_fired = match before {
            Before::MovesFail => 8,
            Before::PromotionFails => 1,
            _ => 0,
        };
        assert_eq!(fired, want_fired, "{what}: injected move failures");
        word(&mem, page).store(page as u64 * 1000, Ordering::SeqCst);
    }
    mem.set_fault_path_hook(None);
    assert!(hung.is_empty(), "{}", hung.join("\n"));
    assert_eq!(mem.fatal_error(), None);
    faults.stop().unwrap();
    for p in 0..mem.guest_pages() {
        assert_eq!(word(&mem, p).load(Ordering::SeqCst), p as u64 * 1000, "{p}");
    }
    mem.check_consistency().unwrap();
}

// ---- 2. First touches draw from the pool of the tier they are placed on ----

/// Takes every slot of `tier`'s pool (a pool nothing can draw from) and
/// returns the pool as it was, to put back.
fn drain_pool(mem: &TieredMemory, tier: TierId) -> super::pool::Pool {
    let mut p = mem.pool(tier);
    let saved = p.clone();
    while p.reserve_chunk(Holds::Hole).is_some() {}
    let left = p.unreserved_slots();
    assert!(p.reserve_pages(left, Holds::Hole).is_some());
    assert_eq!(p.unreserved_slots(), 0);
    saved
}

/// Two tiers (on the host's one node: faked nodes, each with its own pool
/// area), interleaved placement: 2 MiB chunks and single pages go to tier
/// 0 and tier 1 in turn. Each first touch must draw its fresh page from its
/// own tier's pool: with the other tier's pool emptied, every commit still
/// succeeds, on the tier the placement chose. Planted bug: the commit fills
/// from tier 0's pool whatever the target tier.
#[test]
fn first_touches_draw_from_the_pool_of_their_tier() {
    // Two whole chunks and 8 pages that cannot form a chunk.
    let pages = 2 * 512 + 8;
    let mut cfg = MemConfig::two_tier(pages * PAGE_SIZE, pages, pages, 0, 0);
    cfg.placement = InitialPlacement::Interleave;
    let Some(mem) = bare(&cfg) else {
        return;
    };
    for tier in [0 as TierId, 1] {
        let other = 1 - tier;
        let saved = drain_pool(&mem, other);
        // Chunk `tier` (pages tier*512..) and the tail pages of this tier.
        let chunk = tier as usize * 512;
        let r = mem.prefault(chunk, 512).and_then(|()| {
            (1024..pages)
                .filter(|p| p % 2 == tier as usize)
                .try_for_each(|p| mem.prefault(p, 1))
        });
        *mem.pool(other) = saved;
        r.unwrap_or_else(|e| {
            panic!("first touches on tier {tier} with tier {other}'s pool empty: {e}")
        });
        assert_eq!(mem.fatal_error(), None, "tier {tier}");
        for p in (chunk..chunk + 512).chain((1024..pages).filter(|p| p % 2 == tier as usize)) {
            assert_eq!(mem.tier_of(p), Some(tier), "page {p}");
        }
    }
    let st = mem.stats();
    assert_eq!(st.backing.committed_pages, pages as u64, "{st:?}");
    assert_eq!(st.backing.huge_commits, 2, "{st:?}");
    mem.check_consistency().unwrap();
}

/// A first-touch commit whose move into guest RAM fails part way puts
/// back only what it moved, from its own pages: a page committed before
/// (page 0, the test's word in it) stays in guest RAM with its content.
/// The failing commit is of the second 2 MiB range with no huge pool chunk
/// left, from 4 KiB pool pages that cross a 2 MiB boundary of the pool:
/// two moves, the second injected to fail.
#[test]
fn a_failed_first_touch_commit_takes_back_only_its_own_pages() {
    let mut cfg = MemConfig::two_tier(1024 * PAGE_SIZE, 1024, 1024, 0, 0);
    cfg.placement = InitialPlacement::FastFirst;
    let Some(mem) = bare(&cfg) else {
        return;
    };
    mem.prefault(0, 1).unwrap();
    let word0 = || super::tests::word(&mem, 0);
    word0().store(0x1234, Ordering::SeqCst);
    let chunks: Vec<Slot> = super::tests::take_free_chunks(&mem, 0)
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let first_page = mem.pool(0).reserve_pages(1, Holds::Hole).unwrap();
    mem.injector()
        .set(&[FaultPlan::parse("move:every=2:max=1:errno=EEXIST").unwrap()]);
    let r = mem.prefault(512, 1);
    let fired = mem.injector().fired(FaultPoint::Move);
    mem.injector().set(&[]);
    assert_eq!(fired, 1, "the commit's second move did not fail ({r:?})");
    let resident = |p: usize| crate::sys::resident(mem.guest_addr(p), 1).unwrap()[0];
    assert!(resident(0), "page 0 taken out of guest RAM ({r:?})");
    assert_eq!(word0().load(Ordering::SeqCst), 0x1234);
    assert_eq!((mem.tier_of(0), mem.tier_of(512)), (Some(0), Some(0)));
    mem.pool(0).release_pages(&[first_page[0].0], Holds::Hole);
    super::tests::give_back_chunks(&mem, 0, &chunks);
    mem.check_consistency().unwrap();
}

// ---- 5. The dirty harvest covers the last guest page ----

/// TPM of the last page of a guest whose size is not a multiple of 64
/// pages (the last bitmap word is partial), with a write between the copy
/// and the unmap: the harvest must see it, so the transaction aborts and
/// the write survives. Also the first page of the partial word. Planted
/// bug: the harvest skips the last guest page.
#[test]
fn tpm_of_the_last_page_with_a_write_in_the_copy_window_keeps_the_write() {
    let Some((mem, log, m, _faults)) = setup(100, 100, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    for page in [99, 64] {
        let before = mem.stats().migration.tpm_aborts;
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (mm, lg, f) = (mem.clone(), log.clone(), fired.clone());
        let out = crate::test_point::with_action(
            move |point| {
                if point == crate::test_point::TestPoint::TpmCopied
                    && !f.swap(true, Ordering::SeqCst)
                {
                    let _g = lg.write_guard(page, 1);
                    word(&mm, page).store(777_000 + page as u64, Ordering::SeqCst);
                }
            },
            || m.promote(&[Unit::page(page as u64)], Mechanism::TPM),
        )
        .unwrap();
        assert!(fired.load(Ordering::SeqCst), "the copy-window point fired");
        assert_eq!(
            word(&mem, page).load(Ordering::SeqCst),
            777_000 + page as u64,
            "page {page}: the write in the copy window was lost ({out:?})"
        );
        assert_eq!(out.aborted, 1, "page {page}: {out:?}");
        assert_eq!(mem.stats().migration.tpm_aborts, before + 1, "page {page}");
        // Not promoted by this transaction: still on the slow tier.
        assert_eq!(mem.tier_of(page), Some(1), "page {page}");
    }
    m.harvest().unwrap();
    mem.check_consistency().unwrap();
}

/// A page written in the copy window through both dirty logs at once (a
/// guest write, in KVM's log, and a VMM write such as a device's DMA into
/// guest RAM, in the VMM-write log) is dirty: the TPM aborts and the write
/// survives. (The two logs' bits are joined with `|`; `^` would cancel
/// them and commit a copy without the write.)
#[test]
fn a_write_in_both_dirty_logs_in_the_copy_window_aborts_the_tpm() {
    let Some((mem, log, m, _faults)) = setup(256, 128, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    let page = 70usize;
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (mm, lg, f) = (mem.clone(), log.clone(), fired.clone());
    let out = crate::test_point::with_action(
        move |point| {
            if point == crate::test_point::TestPoint::TpmCopied && !f.swap(true, Ordering::SeqCst) {
                let _guest = lg.write_guard(page, 1);
                let _vmm = mm.vmm_writes().write_guard(page, 1);
                word(&mm, page).store(555, Ordering::SeqCst);
            }
        },
        || m.promote(&[Unit::page(page as u64)], Mechanism::TPM),
    )
    .unwrap();
    assert!(fired.load(Ordering::SeqCst), "the copy-window point fired");
    assert_eq!(out.aborted, 1, "{out:?}");
    assert_eq!(word(&mem, page).load(Ordering::SeqCst), 555, "{out:?}");
    assert_eq!(mem.tier_of(page), Some(1));
    m.harvest().unwrap();
    mem.check_consistency().unwrap();
}

// ---- 7. The sampler's scan size shrinks when the overhead is above budget ----

/// Hint-fault overhead far above the budget shrinks the scan window (by at
/// most 4x per period, down to the lower bound). Planted bug: the scan
/// size never shrinks.
#[test]
fn overhead_above_the_budget_shrinks_the_scan_window() {
    let Some((mem, _log, _m, faults)) = setup(4096, 2048, InitialPlacement::Interleave) else {
        return;
    };
    let mut s = HintSampler::new(
        mem.clone(),
        SamplerConfig {
            scan_pages: 1024,
            min_scan_pages: 32,
            max_scan_pages: 4096,
            period: Duration::from_secs(1),
            budget_pct: 20.0,
            vcpus: 1,
        },
    );
    assert_eq!(s.scan_pages(), 1024);
    // The first window: nothing measured yet, the size stays.
    let t = s.tick().unwrap();
    assert_eq!((t.parked, t.scan_pages), (1024, 1024));
    let mut sizes = Vec::new();
    for _ in 0..4 {
        // 100 s of hint-fault stalls since the last tick: far above a 20 %
        // budget whatever the wall time between the ticks (up to minutes).
        mem.counters
            .hint_stall_ns
            .fetch_add(100_000_000_000, Ordering::Relaxed);
        let t = s.tick().unwrap();
        assert!(t.overhead_pct > 20.0 * 4.0, "{t:?}");
        assert_eq!(t.scan_pages, s.scan_pages());
        sizes.push(t.scan_pages);
    }
    assert_eq!(
        sizes,
        vec![256, 64, 32, 32],
        "4x down per period, to the minimum"
    );
    // No overhead at all: it grows again (4x up per period).
    let t = s.tick().unwrap();
    assert_eq!(t.scan_pages, 128, "{t:?}");
    s.unpark_all().unwrap();
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

/// The sampler budgets what hint faults cost the guest, not only what the
/// vCPUs are seen blocked: the handler's stall times the guest cost factor.
/// A guest clock that sees no blocked time (as on PVM, where most of a hint
/// fault's cost is spent running) must not hide the stall. Planted bug:
/// the budget counts the blocked time alone (the scan then grows, 4x).
#[test]
fn the_scan_budgets_the_guest_cost_of_hint_faults() {
    let Some((mem, _log, _m, faults)) = setup(4096, 2048, InitialPlacement::Interleave) else {
        return;
    };
    mem.set_guest_clock(Some(Arc::new(|| Some(0))));
    let cfg = SamplerConfig {
        scan_pages: 256,
        min_scan_pages: 32,
        max_scan_pages: 65536,
        period: Duration::from_secs(1),
        budget_pct: 100.0,
        vcpus: 1,
    };
    let tick_with = |factor: f64| {
        mem.set_guest_cost_factor(factor);
        let mut s = HintSampler::new(mem.clone(), cfg.clone());
        s.tick().unwrap();
        s.tick().unwrap(); // the guest clock's first reading
        std::thread::sleep(Duration::from_millis(100));
        // 50 ms of hint stall seen in about 100 ms: at most 50 % of the
        // vCPU's time as the handler saw it.
        mem.counters
            .hint_stall_ns
            .fetch_add(50_000_000, Ordering::Relaxed);
        let before = s.scan_pages();
        let t = s.tick().unwrap();
        s.unpark_all().unwrap();
        (t, before)
    };
    // Factor 1: what the handler saw, under the 100 % budget: the scan grows.
    let (t, before) = tick_with(1.0);
    assert!(t.overhead_pct <= 50.0 && t.overhead_pct > 0.0, "{t:?}");
    assert!(t.scan_pages > before, "{t:?} (was {before})");
    // Factor 100: far over the budget (unless ticks were 5 s apart): shrinks.
    let (t, before) = tick_with(100.0);
    assert!(t.overhead_pct > 100.0, "{t:?}");
    assert!(t.scan_pages < before, "{t:?} (was {before})");
    assert_eq!(mem.stats().guest_cost_factor, 100.0);
    // Out of range or not a number: clamped, or ignored.
    mem.set_guest_cost_factor(1e9);
    assert_eq!(mem.guest_cost_factor(), GUEST_COST_FACTOR_RANGE.1);
    mem.set_guest_cost_factor(f64::NAN);
    assert_eq!(mem.guest_cost_factor(), GUEST_COST_FACTOR_RANGE.1);
    mem.set_guest_cost_factor(0.0);
    assert_eq!(mem.guest_cost_factor(), GUEST_COST_FACTOR_RANGE.0);
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

/// What a hint fault cost the guest, for the policies' budgets (the scout
/// of `adaptive`): the handler's mean stall times the guest cost factor,
/// and nothing before enough faults were served for a mean.
#[test]
fn a_hint_faults_guest_cost_is_its_mean_stall_times_the_factor() {
    let Some((mem, _log, _m, faults)) = setup(1024, 512, InitialPlacement::Interleave) else {
        return;
    };
    mem.set_guest_cost_factor(7.5);
    let n = super::backing::MIN_HINT_FAULTS_FOR_COST;
    mem.counters.hint_faults.store(n - 1, Ordering::Relaxed);
    mem.counters
        .hint_stall_ns
        .store((n - 1) * 8_000, Ordering::Relaxed);
    assert_eq!(mem.hint_fault_guest_cost_ns(), None, "too few faults");
    mem.counters.hint_faults.store(n, Ordering::Relaxed);
    mem.counters
        .hint_stall_ns
        .store(n * 8_000, Ordering::Relaxed);
    assert_eq!(mem.hint_fault_guest_cost_ns(), Some(60_000.0));
    mem.set_guest_cost_factor(2.0);
    assert_eq!(mem.hint_fault_guest_cost_ns(), Some(16_000.0));
    faults.stop().unwrap();
}

// ---- 8. Resize at the exact boundaries ----

/// A resize that leaves the tiers exactly the guest's size is accepted;
/// one page less is refused, for either tier; the tier's maximum is
/// accepted, one page more refused. Planted bug: a size one page short of
/// holding the guest accepted.
#[test]
fn resize_accepts_exactly_what_holds_the_guest_and_not_a_page_less() {
    let guest = 1000;
    let cfg = MemConfig::two_tier(guest * PAGE_SIZE, 500, 600, 0, 0);
    let Some(mem) = bare(&cfg) else {
        return;
    };
    let cannot = |r: Result<u64, MemError>, want_total: usize| match r {
        Err(MemError::Resize(ResizeError::CannotHoldGuest {
            total, guest: g, ..
        })) => {
            assert_eq!((total, g), (want_total, guest));
        }
        other => panic!("expected CannotHoldGuest, got {other:?}"),
    };
    // Fast: 600 slow pages leave room for exactly 400.
    mem.resize(0, 400)
        .expect("400 + 600 hold the guest exactly");
    assert_eq!(mem.capacity(0), 400);
    cannot(mem.resize(0, 399), 999);
    assert_eq!(mem.capacity(0), 400, "a refused resize changes nothing");
    // Slow: with 400 fast pages, 600 is the least.
    mem.resize(1, 600)
        .expect("600 + 400 hold the guest exactly");
    cannot(mem.resize(1, 599), 999);
    assert_eq!(mem.capacity(1), 600);
    // The maximum (the whole guest by default) and one page above it.
    mem.resize(0, guest).expect("up to the maximum");
    assert_eq!(mem.capacity(0), guest);
    match mem.resize(0, guest + 1) {
        Err(MemError::Resize(ResizeError::AboveMaximum { pages, max, .. })) => {
            assert_eq!((pages, max), (guest + 1, guest));
        }
        other => panic!("expected AboveMaximum, got {other:?}"),
    }
    // With the fast tier at the whole guest, the slow tier may go to 0.
    mem.resize(1, 0)
        .expect("the fast tier holds the guest alone");
    cannot(mem.resize(0, guest - 1), guest - 1);
    assert!(matches!(
        mem.resize(2, 1),
        Err(MemError::Resize(ResizeError::NoSuchTier {
            tier: 2,
            tiers: 2
        }))
    ));
}

// ---- 10. The consistency checker sees a stray page in every area ----

/// Writes `value` into the first word of each of the `pages` pool slots
/// of `tier` from `first` (a hole gets a fresh page). For slots the test
/// reserved, or holes nothing else uses.
fn write_slots(mem: &TieredMemory, tier: TierId, first: Slot, pages: usize, value: u64) {
    let a = mem.slot_addr(tier, first);
    assert!(mem.mapping().contains_range(a, pages * PAGE_SIZE));
    for i in 0..pages {
        // SAFETY: inside the memory's mapping (checked above), which `mem` keeps mapped;
        // pool memory is reached only through raw pointers and moves, never references.
        unsafe { ((a + i * PAGE_SIZE) as *mut u64).write_volatile(value) };
    }
}

/// Moves a fresh page (first word `0xdead`) into the hole at `dst`.
pub(super) fn plant_page(mem: &TieredMemory, dst: usize) {
    let st: Staging = mem.reserve_staging(1, 1, Holds::Hole).expect("a pool slot");
    let a = st.addr(mem, 1, 0);
    // SAFETY: `a` is a reserved pool slot of our mapping (a hole is allocated by the write).
    unsafe { (a as *mut u64).write_volatile(0xdead) };
    mem.move_range(dst, a, PAGE_SIZE, true)
        .expect("plant a page");
    mem.release_staging(1, &st, Holds::Hole, false);
}

/// The checker against planted faults, one area at a time: a populated
/// guest page missing from guest RAM, a page in guest RAM never committed,
/// a page in the shadow slot of a page without a shadow, a page in the
/// parking slot of a page that is not parked. Each is reported with its
/// page and area; removed, the check passes again. Planted bug: the checker
/// skips the parking area.
#[test]
fn the_consistency_checker_reports_a_stray_page_in_every_area() {
    let pages = 128;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    // Every page but the last committed.
    mem.prefault(0, pages - 1).unwrap();
    mem.check_consistency().unwrap();
    let expect = |page: usize, what: &str| match mem.check_consistency() {
        Err(ConsistencyError::Residency { page: p, what: w }) => {
            assert_eq!((p, w), (page, what));
        }
        other => panic!("page {page}: expected '{what}', got {other:?}"),
    };
    let discard = |a: usize| mem.discard(a, PAGE_SIZE).unwrap();
    // Guest RAM: a committed page gone (moved to its parking slot, its
    // word not parked).
    let (g3, p3) = (mem.guest_addr(3), mem.park_addr(3));
    mem.move_range(p3, g3, PAGE_SIZE, false).unwrap();
    expect(3, "populated but not present in guest RAM");
    mem.move_range(g3, p3, PAGE_SIZE, false).unwrap();
    mem.check_consistency().unwrap();
    // Guest RAM: a page where nothing was committed.
    let last = pages - 1;
    plant_page(&mem, mem.guest_addr(last));
    expect(last, "present in guest RAM but never committed");
    discard(mem.guest_addr(last));
    mem.check_consistency().unwrap();
    // The shadow area.
    plant_page(&mem, mem.shadow_addr(5));
    expect(5, "its shadow slot holds a page but it has no shadow");
    discard(mem.shadow_addr(5));
    mem.check_consistency().unwrap();
    // The parking area.
    plant_page(&mem, mem.park_addr(7));
    expect(7, "its parking slot holds a page");
    discard(mem.park_addr(7));
    mem.check_consistency().unwrap();
}

/// Dropping the fault handler ends its thread, which holds a share of the
/// memory: a handler left running after its VM (cargo-mutants: `Drop for
/// FaultHandler` emptied) keeps guest RAM mapped and its userfaultfd polled
/// until the process exits. `stop` ends it too, and returns its result.
#[test]
fn stopping_or_dropping_the_fault_handler_ends_its_thread() {
    for stop in [true, false] {
        let Some((mem, _log, _m, faults)) = setup(64, 32, InitialPlacement::FastFirst) else {
            return;
        };
        let before = Arc::strong_count(&mem);
        if stop {
            faults.stop().expect("the handler thread ends cleanly");
        } else {
            drop(faults);
        }
        assert_eq!(
            Arc::strong_count(&mem),
            before - 1,
            "stop={stop}: the handler thread still holds the memory"
        );
    }
}

// ---- cargo-mutants of fault.rs: the handler's waiters, its end, its idle poll ----

/// A thread that reads the word at `addr` (a hole of the memory's areas) as
/// a vCPU would: it sleeps in the kernel on its userfault until the handler
/// (or the test) wakes it with the page there.
struct Toucher {
    addr: usize,
    rx: std::sync::mpsc::Receiver<u64>,
    join: std::thread::JoinHandle<()>,
}

impl Toucher {
    fn spawn(mem: &Arc<TieredMemory>, addr: usize) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let m = mem.clone();
        let join = std::thread::spawn(move || {
            // SAFETY: `addr` is an aligned word of the memory's mapping, which `m` keeps
            // mapped while this thread runs; all test accesses to it are atomic.
            let v = unsafe { &*(addr as *const AtomicU64) }.load(Ordering::SeqCst);
            drop(m);
            let _ = tx.send(v);
        });
        Self { addr, rx, join }
    }

    /// The word read, or `Err` if the thread did not return within 10 s;
    /// then the test frees it itself (a zero page into its hole, which
    /// wakes it, or a plain wake), so that nothing stays blocked.
    fn returned(self, mem: &TieredMemory, what: &str) -> Result<u64, String> {
        match self.rx.recv_timeout(Duration::from_secs(10)) {
            Ok(v) => {
                self.join.join().unwrap();
                Ok(v)
            }
            Err(_) => {
                let page = self.addr & !(PAGE_SIZE - 1);
                let _ = mem.uffd.zero_page(page, PAGE_SIZE);
                let _ = mem.uffd.wake(page, PAGE_SIZE);
                if self.rx.recv_timeout(Duration::from_secs(5)).is_ok() {
                    self.join.join().unwrap();
                }
                Err(format!(
                    "{what}: the blocked thread was not woken within 10 s"
                ))
            }
        }
    }
}

/// A memory of 64 pages, its first 32 committed, with a fault handler.
fn handled() -> Option<(Arc<TieredMemory>, FaultHandler)> {
    let mem = bare(&MemConfig::new(64 * PAGE_SIZE, 64))?;
    let faults = FaultHandler::spawn(mem.clone()).unwrap();
    mem.prefault(0, 32).unwrap();
    Some((mem, faults))
}

/// A mover releases a page a thread is blocked on, and takes it again
/// before the handler reads the release: the handler must keep waiting (the
/// page is still owned), and the next release must wake the thread.
/// Ordered from inside the handler: the release and the new acquisition
/// happen in the fault-path hook of another page's hint fault, so the
/// handler reads that release in the same turn, with the page owned.
fn release_and_take_again(mem: &Arc<TieredMemory>, a: usize, b: usize) -> Result<u64, String> {
    assert!(mem.pages.try_acquire(a, false).is_some(), "own page {a}");
    let t = Toucher::spawn(mem, mem.guest_addr(a));
    let waits = || mem.pages.load(a) & page_map::WAITER != 0;
    assert!(wait_until(waits), "the handler never waited on page {a}");
    let taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (weak, tk) = (Arc::downgrade(mem), taken.clone());
    mem.set_fault_path_hook(Some(Arc::new(move |rec: &HintFaultRecord| {
        // (Never a panic here: it would end the fault handler thread.)
        if let Some(m) = weak.upgrade() {
            if rec.page as usize == b && !tk.load(Ordering::SeqCst) {
                m.release_page(a, 0, 0);
                tk.store(m.pages.try_acquire(a, false).is_some(), Ordering::SeqCst);
            }
        }
        false
    })));
    assert_eq!(mem.park_pages(&[b], Parker::Sampler).unwrap(), vec![b]);
    let got_b = touch_parked(mem, b, "the parked page");
    mem.set_fault_path_hook(None);
    assert_eq!(got_b, Ok(0), "page {b} (never written)");
    assert!(
        taken.load(Ordering::SeqCst),
        "the hook released and took page {a}"
    );
    // The handler read the release and waits again (WAITER set anew).
    assert!(
        wait_until(waits),
        "the handler dropped its wait on page {a}"
    );
    mem.release_page(a, 0, 0);
    t.returned(mem, "released, taken again, released")
}

/// The first touch of a page finds no room on any tier: the handler holds
/// the fault and retries it every turn (no release will come for it); room
/// appears, and the thread must be woken with its page committed.
fn no_room_then_room(mem: &Arc<TieredMemory>, c: usize) -> Result<u64, String> {
    let held: Vec<u64> = mem
        .tiers
        .iter()
        .map(|t| {
            let n = t.free();
            assert!(t.try_reserve(n));
            n
        })
        .collect();
    let t = Toucher::spawn(mem, mem.guest_addr(c));
    let holds = wait_until(|| mem.stall_view(None).waiting_faults == 1);
    for (t, n) in mem.tiers.iter().zip(held) {
        t.unreserve(n);
    }
    assert!(holds, "the handler never held the fault on page {c}");
    t.returned(mem, "no room, then room")
}

/// Real threads blocked on pages the fault handler waits on are woken in
/// bounded time when the wait ends: a release notification that arrives
/// while the page is owned again (the handler must wait on, then see the
/// next release), and a first touch with no room at first (only the
/// handler's re-check of held faults sees room come back). cargo-mutants:
/// `!` deleted in `if !evaluate(..)` (the first: the waiter is dropped, a
/// lost wake-up) and in `if !pending.is_empty()` (the second: no re-check).
#[test]
fn threads_blocked_on_pages_the_fault_handler_waits_on_are_woken() {
    let Some((mem, faults)) = handled() else {
        return;
    };
    let mut hung = Vec::new();
    match release_and_take_again(&mem, 40, 10) {
        Ok(v) => assert_eq!(v, 0, "a fresh page"),
        Err(e) => hung.push(e),
    }
    match no_room_then_room(&mem, 50) {
        Ok(v) => assert_eq!(v, 0, "a fresh page"),
        Err(e) => hung.push(e),
    }
    assert!(hung.is_empty(), "{}", hung.join("\n"));
    faults.stop().unwrap();
    assert_eq!(mem.fatal_error(), None);
    for p in [40, 50] {
        assert_ne!(
            mem.pages.load(p) & page_map::POPULATED,
            0,
            "page {p} committed"
        );
    }
    mem.check_consistency().unwrap();
}

/// A handler thread that ends in an error (its read of userfaultfd events
/// fails, injected) hands the error to `stop`. cargo-mutants:
/// `FaultHandler::stop` returning `Ok(())` (the error only logged by `Drop`).
#[test]
fn stop_returns_the_error_the_fault_handler_thread_ended_with() {
    let Some(mem) = bare(&MemConfig::new(64 * PAGE_SIZE, 64)) else {
        return;
    };
    mem.injector()
        .set(&[FaultPlan::parse("fault-read:errno=EIO:max=1").unwrap()]);
    let faults = FaultHandler::spawn(mem.clone()).unwrap();
    assert!(wait_until(
        || mem.injector().fired(FaultPoint::FaultRead) == 1
    ));
    let err = faults
        .stop()
        .expect_err("stop returns the error the handler thread ended with");
    assert!(
        err.to_string().contains("FaultRead: injected failure"),
        "{err}"
    );
}

/// The idle fault handler sleeps in its poll (50 ms a turn) instead of
/// spinning: over 300 ms with nothing to do it makes a few turns, not
/// thousands. cargo-mutants: `!` deleted in `if !ahead.is_empty()` (an idle
/// handler polls with timeout 0: a host core burnt per VM).
#[test]
fn the_idle_fault_handler_does_not_spin() {
    let Some((mem, faults)) = handled() else {
        return;
    };
    std::thread::sleep(Duration::from_millis(100));
    let before = mem.backlog.turns();
    std::thread::sleep(Duration::from_millis(300));
    let turns = mem.backlog.turns() - before;
    assert!(turns > 0, "the handler made no turn in 300 ms");
    assert!(
        turns <= 30,
        "{turns} turns in 300 ms idle (a 50 ms poll makes about 6)"
    );
    faults.stop().unwrap();
}

/// Commit-ahead runs between the handler's turns without waiting for its
/// poll: after a thread's second sequential first touch of a 2 MiB chunk,
/// the chunk after it is committed ahead at once (the next turn polls with
/// timeout 0), not an idle poll (50 ms) later. The least delay of 5 streams
/// counts, and it must stay under 40 ms, so that a busy host's scheduling
/// does not decide (30 ms was seen with two cargo-mutants runs sharing the
/// 2 cores; the idle poll the bound tells apart waits 50 ms). cargo-mutants:
/// `CommitAhead::is_empty` returning true (one chunk ahead per 50 ms: a
/// guest initialising its memory outruns the window), and the handler's
/// report of a first touch's chunk (`untouched` or the chunk index wrong:
/// nothing ahead; any resolved fault reported: hint faults start streams).
#[test]
fn commit_ahead_follows_first_touches_at_once_and_only_them() {
    use super::pool::CHUNK_SLOTS;
    let trials = 5;
    let pages = 4 * trials * CHUNK_SLOTS;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    assert!(mem.huge_pages(), "commit-ahead follows whole-chunk commits");
    let faults = FaultHandler::spawn(mem.clone()).unwrap();
    let ahead = || mem.counters.ahead_commits.load(Ordering::Relaxed);
    let mut least = Duration::MAX;
    for t in 0..trials {
        let first = 4 * t * CHUNK_SLOTS;
        let before = ahead();
        // First touches of chunks 4t and 4t+1 by this thread: a stream
        // (the one before ended two chunks back), chunk 4t+2 queued.
        word(&mem, first).load(Ordering::SeqCst);
        word(&mem, first + CHUNK_SLOTS).load(Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        assert!(
            wait_until(|| ahead() > before),
            "stream {t}: nothing committed ahead"
        );
        least = least.min(t0.elapsed());
        let next = first + 2 * CHUNK_SLOTS;
        assert_ne!(mem.pages.load(next) & page_map::POPULATED, 0, "stream {t}");
    }
    // Faults that are not first touches (hint faults on parked pages of the
    // last stream's chunks 4t+1 and 4t+2) start no stream: chunk 4t+3 stays
    // untouched. cargo-mutants: `&&` to `||` in `untouched && huge_pages`.
    let c = 4 * (trials - 1) + 1;
    let parked = vec![c * CHUNK_SLOTS + 7, (c + 1) * CHUNK_SLOTS + 7];
    assert_eq!(mem.park_pages(&parked, Parker::Sampler).unwrap(), parked);
    let before = ahead();
    for &p in &parked {
        word(&mem, p).load(Ordering::SeqCst);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ahead(), before, "hint faults started a stream");
    let untouched = (c + 2) * CHUNK_SLOTS;
    assert_eq!(mem.pages.load(untouched) & page_map::POPULATED, 0);
    faults.stop().unwrap();
    assert!(
        least < Duration::from_millis(40),
        "the least delay of a commit ahead was {least:?} (an idle poll is 50 ms)"
    );
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of fault.rs: the wake injection, hole recovery, the unpark race ----

/// `--test-fault-inject wake` (a lost wake-up planted for the stall
/// watchdog): the handler maps the touched parked page back without waking
/// its toucher. Only the wake may be lost: the page must be back and
/// unflagged (not `PARKED`, not `PROBE`, not owned), for a sampler's page
/// and a probe's; the watchdog's way then finds the page the thread waits
/// on, sees it present and only wakes it (`Unstick::Woken`), and the thread
/// reads the page's word. cargo-mutants: `|` to `&` in
/// `release_page(page, 0, PARKED | PROBE)` (the page stays flagged parked
/// after it was moved back).
#[test]
fn the_wake_injection_maps_the_page_back_unflagged_and_loses_only_the_wake() {
    let Some((mem, faults)) = handled() else {
        return;
    };
    for p in 0..32 {
        word(&mem, p).store(p as u64 * 1000, Ordering::SeqCst);
    }
    for (page, parker) in [(10, Parker::Sampler), (11, Parker::Probe)] {
        let what = format!("{parker:?}'s page {page}");
        mem.injector()
            .set(&[FaultPlan::parse("wake:every=1:max=1").unwrap()]);
        assert_eq!(mem.park_pages(&[page], parker).unwrap(), vec![page]);
        let t = Toucher::spawn(&mem, mem.guest_addr(page));
        assert!(
            wait_until(|| mem.injector().fired(FaultPoint::Wake) == 1),
            "{what}: the handler never mapped the touched page back"
        );
        // The release comes right after the map-back's move.
        assert!(
            wait_until(|| mem.pages.load(page) & page_map::BUSY == 0),
            "{what}: still owned"
        );
        let w = mem.pages.load(page);
        assert_eq!(
            w & (page_map::PARKED | page_map::PROBE),
            0,
            "{what}: moved back but still flagged {}",
            super::watch::describe_word(w)
        );
        assert_ne!(w & page_map::POPULATED, 0, "{what}");
        mem.check_consistency()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // The wake was lost: the thread still sleeps on its userfault.
        assert!(
            t.rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "{what}: the toucher was woken (the injection lost no wake-up)"
        );
        // What the stall watchdog does: the thread's last fault names the
        // page; the page is present, so a wake is all it needs.
        let samples = mem.drain_samples();
        assert_eq!(samples.len(), 1, "{what}: {samples:?}");
        assert_eq!(samples[0].page, page as u64, "{what}");
        let view = mem.stall_view(Some(samples[0].thread_id));
        assert_eq!(mem.page_waited_by(&view), Some(page), "{what}: {view}");
        assert_eq!(mem.unstick(page), Unstick::Woken, "{what}");
        assert_eq!(
            t.returned(&mem, &what),
            Ok(page as u64 * 1000),
            "{what}: the page's word"
        );
    }
    mem.injector().set(&[]);
    faults.stop().unwrap();
    assert_eq!(mem.fatal_error(), None);
    mem.check_consistency().unwrap();
}

/// A page the bookkeeping calls present (committed, not parked, nobody
/// owns it) whose guest copy went away quietly (a bug elsewhere): waking
/// its toucher would only make it fault again, for ever (a vCPU that never
/// resumes). The handler must recover it (`recover_hole`): a copy in the
/// page's parking slot or shadow slot is put back and the thread reads the
/// page's word; with no copy anywhere the VM is stopped (a fatal error),
/// never run on lost data. cargo-mutants: `==` to `!=` and `&` to `^` in
/// `... & (BUSY | PARKED) == 0` (no recovery: the toucher is woken into the
/// same fault again and again, and no fatal error).
#[test]
fn a_thread_touching_a_present_page_missing_from_guest_ram_gets_it_back() {
    let Some((mem, faults)) = handled() else {
        return;
    };
    for p in 0..32 {
        word(&mem, p).store(p as u64 * 1000, Ordering::SeqCst);
    }
    let unexpected = || mem.stats().migration.unexpected_faults;
    let mut hung = Vec::new();
    for (page, slot, area) in [
        (12, mem.park_addr(12), "its parking slot"),
        (13, mem.shadow_addr(13), "its shadow slot"),
    ] {
        let what = format!("page {page}, its guest copy moved to {area}");
        let before = unexpected();
        mem.move_range(slot, mem.guest_addr(page), PAGE_SIZE, false)
            .expect("move the guest copy away quietly");
        match Toucher::spawn(&mem, mem.guest_addr(page)).returned(&mem, &what) {
            Ok(v) => assert_eq!(v, page as u64 * 1000, "{what}: the page's word"),
            Err(e) => {
                hung.push(e);
                // The test's zero fill freed the thread: put the copy back.
                let _ = mem.discard(mem.guest_addr(page), PAGE_SIZE);
                let _ = mem.move_range(mem.guest_addr(page), slot, PAGE_SIZE, false);
                continue;
            }
        }
        assert!(
            wait_until(|| mem.pages.load(page) & page_map::BUSY == 0),
            "{what}: still owned"
        );
        let w = mem.pages.load(page);
        assert_eq!(
            w & (page_map::PARKED | page_map::POPULATED),
            page_map::POPULATED,
            "{what}: {}",
            super::watch::describe_word(w)
        );
        assert_eq!(unexpected(), before + 1, "{what}: one hole recovered");
    }
    assert!(hung.is_empty(), "{}", hung.join("\n"));
    assert_eq!(mem.fatal_error(), None);
    mem.check_consistency().unwrap();
    // No copy anywhere: the VM is stopped. The thread stays blocked (its
    // vCPU would be stopped); the test frees it with a zero page.
    let page = 14;
    mem.discard(mem.guest_addr(page), PAGE_SIZE).unwrap();
    let t = Toucher::spawn(&mem, mem.guest_addr(page));
    let stopped = wait_until(|| mem.fatal_error().is_some());
    let _ = mem.uffd.zero_page(mem.guest_addr(page), PAGE_SIZE);
    let _ = mem.uffd.wake(mem.guest_addr(page), PAGE_SIZE);
    let freed = t.rx.recv_timeout(Duration::from_secs(5)).is_ok();
    if freed {
        t.join.join().unwrap();
    }
    assert!(
        stopped,
        "page {page}, discarded: no fatal error within 10 s (the hole was never recovered)"
    );
    let fatal = mem.fatal_error().unwrap();
    assert!(
        fatal.contains("guest page 14 is missing from guest RAM"),
        "{fatal}"
    );
    assert!(freed, "page {page}: the test's zero page freed the thread");
    faults.stop().unwrap();
}

/// A page unparked (by its parker) between the handler's look at a fault
/// (the page parked) and its taking the page is a present page, not a hint
/// fault: no sample, no map-back of a page already back, the toucher woken
/// with the page's word. Ordered with the `FaultSawParked` test point: the
/// test reads the real toucher's fault event itself (no handler thread)
/// and serves it as the handler would, on its own thread, unparking the
/// page at the point. cargo-mutants: `&` to `|` or `^` in
/// `mem.pages.load(page) & PARKED == 0` (the page served as a hint fault:
/// a bogus sample and a failed map-back).
#[test]
fn a_page_unparked_between_the_handlers_look_and_its_taking_is_no_hint_fault() {
    use crate::test_point::{with_action, TestPoint};
    use std::os::fd::AsRawFd;
    let Some(mem) = bare(&MemConfig::new(64 * PAGE_SIZE, 64)) else {
        return;
    };
    mem.prefault(0, 32).unwrap();
    let page = 20;
    word(&mem, page).store(20_000, Ordering::SeqCst);
    assert_eq!(
        mem.park_pages(&[page], Parker::Sampler).unwrap(),
        vec![page]
    );
    let t = Toucher::spawn(&mem, mem.guest_addr(page));
    let mut events = Vec::new();
    let t0 = std::time::Instant::now();
    while events.is_empty() && t0.elapsed() < Duration::from_secs(10) {
        let _ = mem.uffd.poll2(mem.release_event.as_raw_fd(), 10).unwrap();
        mem.uffd.read_events(&mut events).unwrap();
    }
    assert_eq!(events.len(), 1, "the toucher's fault: {events:?}");
    let ev = events[0];
    assert_eq!(mem.guest_page_of(ev.address), Some(page));
    let counters = |m: &TieredMemory| {
        (
            m.counters.hint_faults.load(Ordering::Relaxed),
            m.counters.unpark_failures.load(Ordering::Relaxed),
            m.counters.guest_stalls.load(Ordering::Relaxed),
        )
    };
    let before = counters(&mem);
    let unparked = Arc::new(AtomicU64::new(u64::MAX));
    let (m, u) = (mem.clone(), unparked.clone());
    let mut pending = std::collections::HashMap::new();
    with_action(
        move |point| {
            if point == TestPoint::FaultSawParked && u.load(Ordering::SeqCst) == u64::MAX {
                let n = m.unpark_pages_settled(&[page], Parker::Sampler);
                u.store(n.map_or(0, |n| n as u64), Ordering::SeqCst);
            }
        },
        || fault::handle_event_for_test(&mem, &ev, &mut pending),
    );
    assert_eq!(
        unparked.load(Ordering::SeqCst),
        1,
        "the test point fired and unparked the page"
    );
    assert!(pending.is_empty(), "the fault was resolved");
    let after = counters(&mem);
    assert_eq!(
        mem.drain_samples(),
        vec![],
        "a page unparked before the handler took it was recorded as a hint fault"
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (0, 0, 1),
        "(hint faults, failed map-backs, stalls served as a present page)"
    );
    assert_eq!(t.returned(&mem, "unparked"), Ok(20_000));
    assert_eq!(
        mem.pages.load(page) & (page_map::BUSY | page_map::PARKED | page_map::PROBE),
        0
    );
    assert_eq!(mem.fatal_error(), None);
    mem.check_consistency().unwrap();
}

/// The `wake` injection on a huge range parked whole (`map_back_range`'s
/// test-only path, issue 29's range map-back): the range goes back whole,
/// every one of its 512 pages is released, unowned and neither `PARKED`
/// nor `PROBE`, and only the toucher's wake is lost (the stall watchdog's
/// wake frees it). cargo-mutants: `+` to `-` or `*` in the release loop's
/// bound (pages left owned), `|` to `&` in `PARKED | PROBE` (pages left
/// flagged parked).
#[test]
fn the_wake_injection_on_a_huge_range_releases_every_page_of_it_unflagged() {
    let Some((mem, _log, _m, faults)) = setup(2048, 2048, InitialPlacement::SlowFirst) else {
        return;
    };
    let first = 512;
    let range: Vec<usize> = (first..first + 512).collect();
    for &p in &range {
        word(&mem, p).store(p as u64 * 1000, Ordering::SeqCst);
    }
    assert_eq!(mem.huge_range_of(first), Some(first), "first-touched whole");
    mem.injector()
        .set(&[FaultPlan::parse("wake:every=1:max=1").unwrap()]);
    assert_eq!(mem.park_pages(&range, Parker::Sampler).unwrap().len(), 512);
    let touched = first + 300;
    let t = Toucher::spawn(&mem, mem.guest_addr(touched));
    assert!(
        wait_until(|| mem.injector().fired(FaultPoint::Wake) == 1),
        "the handler never mapped the touched range back"
    );
    let owned = || {
        range
            .iter()
            .filter(|&&p| mem.pages.load(p) & page_map::BUSY != 0)
            .count()
    };
    assert!(wait_until(|| owned() == 0), "{} pages still owned", owned());
    let flagged: Vec<usize> = range
        .iter()
        .copied()
        .filter(|&p| mem.pages.load(p) & (page_map::PARKED | page_map::PROBE) != 0)
        .collect();
    assert!(
        flagged.is_empty(),
        "moved back but {} pages still flagged, the first {:?}",
        flagged.len(),
        flagged.first()
    );
    assert!(
        t.rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "the toucher was woken (the injection lost no wake-up)"
    );
    // The stall watchdog's part: the page is present, a wake frees it.
    let _ = mem.uffd.wake(mem.guest_addr(touched), PAGE_SIZE);
    assert_eq!(
        t.returned(&mem, "the range's toucher"),
        Ok(touched as u64 * 1000)
    );
    mem.injector().set(&[]);
    faults.stop().unwrap();
    assert_eq!(mem.fatal_error(), None);
    mem.check_consistency().unwrap();
}

/// Unparking counts every page it put back, however the map-back went: a
/// plain move, a page found back in guest RAM already (`AlreadyBack`), a
/// parked copy copied in after every move failed (`Copied`). Issue 34:
/// cargo-mutants' `+=` to `-=` of that count (l. 296 of `park.rs`).
#[test]
fn unparking_counts_the_pages_put_back_whatever_the_map_back_did() {
    let Some((mem, _log, _m, faults)) = setup(256, 128, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    let pages = [5, 6, 7];
    assert_eq!(
        mem.park_pages(&pages, Parker::Sampler).unwrap(),
        pages.to_vec()
    );
    act(&mem, 6, Before::MoveBackQuietly);
    let mut busy = Vec::new();
    assert_eq!(
        mem.unpark_pages(&[5, 6], Parker::Sampler, &mut busy)
            .unwrap(),
        2
    );
    act(&mem, 7, Before::MovesFail);
    assert_eq!(
        mem.unpark_pages(&[7], Parker::Sampler, &mut busy).unwrap(),
        1
    );
    mem.injector().set(&[]);
    assert!(busy.is_empty());
    let failures = mem.counters.unpark_failures.load(Ordering::Relaxed);
    assert_eq!(failures, 2, "6 and 7 did not move back");
    for p in pages {
        assert_eq!(word(&mem, p).load(Ordering::SeqCst), p as u64 * 1000);
    }
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

/// A page someone else owns when unparking starts is retried until it is
/// released, and counted with the rest (issue 34: cargo-mutants' `+=` of
/// the retried pages' count in `unpark_pages_settled`, l. 320 of `park.rs`).
#[test]
fn settled_unparking_retries_a_busy_page_and_counts_it() {
    let Some((mem, _log, _m, faults)) = setup(256, 128, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    assert_eq!(
        mem.park_pages(&[5, 6], Parker::Sampler).unwrap(),
        vec![5, 6]
    );
    assert!(
        mem.pages.try_acquire(6, true).is_some(),
        "the test owns page 6"
    );
    let owner = super::tests::release_later(&mem, 6, Duration::from_millis(20));
    assert_eq!(
        mem.unpark_pages_settled(&[5, 6], Parker::Sampler).unwrap(),
        2
    );
    owner.join().unwrap();
    for p in [5, 6] {
        assert_eq!(mem.pages.load(p) & page_map::PARKED, 0, "page {p} unparked");
        assert_eq!(word(&mem, p).load(Ordering::SeqCst), p as u64 * 1000);
    }
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

/// A huge range parked whole whose move back fails (every attempt) is put
/// back page by page, and every page of it ends unowned and unparked, not
/// only the touched one (issue 34: cargo-mutants' `+` to `-` and `*` of the
/// fallback's page range in `map_back_touched_range`, l. 370 of `park.rs`:
/// 511 pages left owned for ever, each a stalled vCPU on its next touch).
#[test]
fn a_huge_range_whose_move_back_fails_is_put_back_page_by_page() {
    let Some((mem, _log, _m, faults)) = setup(2048, 2048, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    let first = 512;
    assert_eq!(mem.huge_range_of(first), Some(first), "first-touched whole");
    let range: Vec<usize> = (first..first + 512).collect();
    assert_eq!(mem.park_pages(&range, Parker::Sampler).unwrap().len(), 512);
    mem.injector()
        .set(&[FaultPlan::parse("move:errno=EBUSY:max=8").unwrap()]);
    let mut busy = Vec::new();
    let n = mem.unpark_pages(&[first + 7], Parker::Sampler, &mut busy);
    mem.injector().set(&[]);
    assert_eq!(n.unwrap(), 512);
    let held = range
        .iter()
        .filter(|&&p| mem.pages.load(p) & (page_map::BUSY | page_map::PARKED) != 0)
        .count();
    assert_eq!(held, 0, "pages of the range still owned or parked");
    for p in [first, first + 7, first + 511] {
        assert_eq!(word(&mem, p).load(Ordering::SeqCst), p as u64 * 1000);
    }
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

/// A parked page with no copy left anywhere (its parking slot discarded: a
/// bookkeeping bug elsewhere) is unparked and recovered, which stops the
/// VM with an error naming the page (the page kept owned meanwhile); it must not stay flagged
/// parked, where every touch would find it parked and missing again (issue
/// 34: cargo-mutants' `|` to `&` of `PARKED | PROBE` in the `Lost` branch of
/// `map_back_touched`, l. 416 of `park.rs`).
#[test]
fn a_parked_page_with_no_copy_left_is_unparked_and_stops_the_vm() {
    let Some((mem, _log, _m, faults)) = setup(256, 128, InitialPlacement::SlowFirst) else {
        return;
    };
    fill(&mem);
    assert_eq!(mem.park_pages(&[9], Parker::Probe).unwrap(), vec![9]);
    mem.discard(mem.park_addr(9), PAGE_SIZE).unwrap();
    let mut busy = Vec::new();
    assert!(mem.unpark_pages(&[9], Parker::Probe, &mut busy).is_err());
    // Unparked, and kept owned while the VM stops (`recover_hole`).
    let w = mem.pages.load(9);
    assert_eq!(
        w & (page_map::BUSY | page_map::PARKED | page_map::PROBE),
        page_map::BUSY,
        "{w:#x}"
    );
    let fatal = mem.fatal_error().map(str::to_owned).unwrap_or_default();
    assert!(
        fatal.contains("page 9"),
        "the VM is stopped naming the page: {fatal:?}"
    );
    faults.stop().unwrap();
}

// ---- cargo-mutants of staging.rs: a huge chunk given back after a failure ----

/// A huge pool chunk given back after a failed move goes back as the kernel
/// says it is: empty, a hole; full (one huge page or 512 small ones), a
/// cached chunk; holding some pages, emptied and then a hole. Before, a
/// chunk holding pages went back as a hole with its pages still in it (each
/// slot was "marked occupied", which only the small half knows): every
/// later move into it failed, and its pages were memory nobody accounted
/// (cargo-mutants: the marks' slot arithmetic mutated was missed, because
/// the marks did nothing). The consistency checker reports such a hole.
#[test]
fn a_chunk_given_back_after_a_failure_is_a_hole_only_when_empty() {
    use super::pool::{Slot, CHUNK_SLOTS};
    let pages = 4096;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    let tier = 1;
    let reserve = || match mem.reserve_staging(tier, CHUNK_SLOTS, Holds::Hole) {
        Some(Staging::Chunk(first, Holds::Hole)) => first,
        other => panic!("expected an empty huge chunk, got {other:?}"),
    };
    let slot = |c: Slot, i: usize| mem.slot_addr(tier, Slot(c.0 + i as u32));
    let resident = |c: Slot| crate::sys::resident(slot(c, 0), CHUNK_SLOTS).unwrap();
    let fill = |c: Slot| write_slots(&mem, tier, c, CHUNK_SLOTS, 1);
    let give_back = |c: Slot| mem.release_staging_checked(tier, &Staging::Chunk(c, Holds::Hole));

    // Empty: a hole.
    let c = reserve();
    give_back(c);
    assert!(!mem.pool(tier).is_cached(c), "an empty chunk is a hole");
    mem.check_consistency().unwrap();

    // Full: cached, its pages kept.
    let c = reserve();
    fill(c);
    give_back(c);
    assert!(mem.pool(tier).is_cached(c), "a full chunk is a cached one");
    assert!(resident(c).iter().all(|&r| r));
    mem.check_consistency().unwrap();

    // Some pages (a 4 KiB discard splits a huge page): emptied, a hole.
    let c = reserve();
    fill(c);
    mem.discard(slot(c, 1), 300 * PAGE_SIZE).unwrap();
    assert_eq!(
        resident(c).iter().filter(|&&r| r).count(),
        CHUNK_SLOTS - 300
    );
    give_back(c);
    assert!(!mem.pool(tier).is_cached(c), "a mixed chunk is a hole");
    assert!(
        resident(c).iter().all(|&r| !r),
        "a chunk given back as a hole was not emptied"
    );
    mem.check_consistency().unwrap();

    // The checker: a page in a hole chunk, then in a small hole.
    let c = reserve();
    mem.pool(tier).release_chunk(c, Holds::Hole, false);
    // SAFETY: a slot of an unreserved hole chunk of our mapping; this test is
    // the only user of the memory.
    unsafe { (slot(c, 7) as *mut u64).write_volatile(1) };
    match mem.check_consistency() {
        // (The write may have faulted in a whole huge page.)
        Err(ConsistencyError::PoolHole { slot: s, .. }) => {
            assert!((c.index()..c.index() + CHUNK_SLOTS).contains(&s), "{s}")
        }
        other => panic!("a page in a hole chunk: expected PoolHole, got {other:?}"),
    }
    mem.discard(slot(c, 0), CHUNK_SLOTS * PAGE_SIZE).unwrap();
    mem.check_consistency().unwrap();
    // (The third slot: the first is at a multiple of 64, a bit's word start.)
    let Some(Staging::Pages(v)) = mem.reserve_staging(tier, 3, Holds::Hole) else {
        panic!("small holes");
    };
    let s = v[2].0;
    assert_ne!(s.index() % 64, 0);
    let all: Vec<_> = v.iter().map(|x| x.0).collect();
    mem.pool(tier).release_pages(&all, Holds::Hole);
    let a = mem.slot_addr(tier, s);
    // SAFETY: an unreserved small hole of our mapping; this test is the only user.
    unsafe { (a as *mut u64).write_volatile(1) };
    match mem.check_consistency() {
        Err(ConsistencyError::PoolHole { slot: got, .. }) => assert_eq!(got, s.index()),
        other => panic!("a page in a small hole: expected PoolHole, got {other:?}"),
    }
    mem.discard(a, PAGE_SIZE).unwrap();
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of watch.rs: what the stall watchdog does for a page ----

/// `unstick` for each state a waited-on page can be in, against a real
/// memory and fault handler: a page past the guest is left alone; a page a
/// mover owns stays owned (taking it would race the mover); a parked page
/// is mapped back; a committed page whose guest copy went missing is
/// recovered from its copy; an untouched page is released, untouched; a
/// present page is only woken. The page's word survives each, no page
/// stays owned, and only the cases that acted count as unsticks.
#[test]
fn unstick_acts_on_each_state_of_a_waited_on_page() {
    let Some((mem, faults)) = handled() else {
        return;
    };
    for p in 0..32 {
        word(&mem, p).store(p as u64 * 1000 + 1, Ordering::SeqCst);
    }
    let unsticks = || mem.stats().backing.watchdog_unsticks;
    let flags = |p: usize| mem.pages.load(p) & (page_map::BUSY | page_map::PARKED);
    let present = |p: usize| crate::sys::resident(mem.guest_addr(p), 1).unwrap()[0];

    assert_eq!(mem.unstick(mem.guest_pages()), Unstick::Woken);
    assert_eq!(unsticks(), 0, "a page past the guest counts nothing");

    assert!(mem.pages.try_acquire(3, false).is_some());
    assert_eq!(mem.unstick(3), Unstick::OwnedByMover);
    assert_ne!(flags(3), 0, "a mover's page was taken from it");
    mem.release_page(3, 0, 0);
    assert_eq!(unsticks(), 0);

    assert_eq!(mem.park_pages(&[4], Parker::Sampler).unwrap(), vec![4]);
    assert!(!present(4));
    assert_eq!(mem.unstick(4), Unstick::Unparked);
    assert!(present(4), "the parked page was not mapped back");
    assert_eq!(flags(4), 0);
    assert_eq!(word(&mem, 4).load(Ordering::SeqCst), 4001);
    assert_eq!(unsticks(), 1);

    mem.move_range(mem.park_addr(5), mem.guest_addr(5), PAGE_SIZE, false)
        .expect("move the guest copy away quietly");
    assert_eq!(mem.unstick(5), Unstick::Recovered);
    assert!(present(5), "the missing page was not recovered");
    assert_eq!(flags(5), 0);
    assert_eq!(word(&mem, 5).load(Ordering::SeqCst), 5001);

    let untouched = 40;
    assert_eq!(mem.unstick(untouched), Unstick::NoRoom);
    assert_eq!(
        mem.pages.load(untouched) & (page_map::BUSY | page_map::POPULATED),
        0
    );

    let before = unsticks();
    assert_eq!(mem.unstick(6), Unstick::Woken);
    assert_eq!(flags(6), 0);
    assert_eq!(unsticks(), before + 1, "a present page's wake counts");

    faults.stop().unwrap();
    assert_eq!(mem.fatal_error(), None);
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of check.rs: the checker's other violations ----

/// The checker against planted bookkeeping faults other than a stray page:
/// an owned page and a parked page's word, a page (and a shadow) on a tier
/// that does not exist, a tier's count off by one, capacity and a pool
/// slot left reserved. Each is reported as what it is; undone, the check
/// passes again. The node check counts every present guest page and names
/// a present page that was never committed.
#[test]
fn the_consistency_checker_reports_each_kind_of_violation() {
    let pages = 128;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    mem.prefault(0, pages - 1).unwrap();
    mem.check_consistency().unwrap();
    assert_eq!(
        mem.check_nodes().unwrap(),
        pages - 1,
        "every present page checked"
    );

    // Owned, then parked (the word only).
    assert!(mem.pages.try_acquire(9, false).is_some());
    match mem.check_consistency() {
        Err(ConsistencyError::BusyOrParked { page: 9, word }) => {
            assert_ne!(word & page_map::BUSY, 0)
        }
        other => panic!("an owned page: got {other:?}"),
    }
    mem.pages.release(9, page_map::PARKED, 0);
    assert!(matches!(
        mem.check_consistency(),
        Err(ConsistencyError::BusyOrParked { page: 9, .. })
    ));
    mem.pages.try_acquire(9, true).unwrap();
    mem.pages.release(9, 0, page_map::PARKED);
    mem.check_consistency().unwrap();

    // A tier that does not exist, for the page and for its shadow.
    let tiers = mem.tier_count();
    let t = mem.tier_of(10).unwrap();
    for (set, clear) in [
        (page_map::on_tier(5), page_map::PLACEMENT_BITS),
        (page_map::shadow_on(6), page_map::SHADOW_BITS),
    ] {
        mem.pages.try_acquire(10, false).unwrap();
        mem.pages.release(10, set, clear);
        match mem.check_consistency() {
            Err(ConsistencyError::NoSuchTier {
                page: 10,
                tier,
                tiers: n,
            }) => {
                assert!(tier == 5 || tier == 6);
                assert_eq!(n, tiers);
            }
            other => panic!("a page on tier 5 or a shadow on tier 6: got {other:?}"),
        }
        mem.pages.try_acquire(10, false).unwrap();
        mem.pages.release(
            10,
            page_map::on_tier(t),
            page_map::PLACEMENT_BITS | page_map::SHADOW_BITS,
        );
        mem.check_consistency().unwrap();
    }

    // A shadow the word names but its slot does not hold.
    mem.pages.try_acquire(11, false).unwrap();
    mem.pages
        .release(11, page_map::shadow_on(0), page_map::SHADOW_BITS);
    match mem.check_consistency() {
        Err(ConsistencyError::Residency { page: 11, what }) => {
            assert_eq!(what, "its shadow is not present")
        }
        other => panic!("a missing shadow: got {other:?}"),
    }
    mem.pages.try_acquire(11, false).unwrap();
    mem.pages.release(11, 0, page_map::SHADOW_BITS);
    mem.check_consistency().unwrap();

    // A count off by one, each way, each tier.
    for i in 0..tiers {
        for delta in [1i64, -1] {
            if delta < 0 && mem.tiers[i].guest() == 0 {
                continue; // the counts saturate at 0
            }
            mem.tiers[i].add_guest(delta);
            match mem.check_consistency() {
                Err(ConsistencyError::Counts {
                    guest, map_guest, ..
                }) => {
                    assert_eq!(guest as i64 - map_guest as i64, delta)
                }
                other => panic!("tier {i} guest count {delta:+}: got {other:?}"),
            }
            mem.tiers[i].add_guest(-delta);
            mem.tiers[i].add_shadows(1);
            assert!(matches!(
                mem.check_consistency(),
                Err(ConsistencyError::Counts { shadows: s, map_shadows: 0, .. }) if s == 1
            ));
            mem.tiers[i].add_shadows(-1);
            mem.check_consistency().unwrap();
        }
    }

    // Capacity, then a pool slot, left reserved.
    assert!(mem.tiers[1].try_reserve(3));
    match mem.check_consistency() {
        Err(ConsistencyError::Reserved { what, n, .. }) => {
            assert_eq!((what, n), ("capacity pages", 3))
        }
        other => panic!("capacity reserved: got {other:?}"),
    }
    mem.tiers[1].unreserve(3);
    let st = mem.reserve_staging(1, 2, Holds::Hole).expect("pool slots");
    match mem.check_consistency() {
        Err(ConsistencyError::Reserved { what, n, .. }) => assert_eq!((what, n), ("pool slots", 2)),
        other => panic!("pool slots reserved: got {other:?}"),
    }
    mem.release_staging(1, &st, Holds::Hole, false);
    mem.check_consistency().unwrap();

    // The node check: a present page never committed.
    let last = pages - 1;
    plant_page(&mem, mem.guest_addr(last));
    match mem.check_nodes() {
        Err(NodeCheckError::NeverCommitted { page, .. }) => assert_eq!(page, last),
        other => panic!("a page never committed: got {other:?}"),
    }
    mem.discard(mem.guest_addr(last), PAGE_SIZE).unwrap();
    assert_eq!(mem.check_nodes().unwrap(), pages - 1);
    // The shared zero page (no node) at the uncommitted page: not checked.
    mem.uffd.zero_page(mem.guest_addr(last), PAGE_SIZE).unwrap();
    assert_eq!(
        mem.check_nodes().unwrap(),
        pages - 1,
        "the zero page was checked"
    );
    mem.discard(mem.guest_addr(last), PAGE_SIZE).unwrap();
    // A present range that starts past page 0 (pages 0..16 moved to their
    // parking slots): its pages are counted from its start.
    mem.move_range(mem.park_addr(0), mem.guest_addr(0), 16 * PAGE_SIZE, false)
        .unwrap();
    assert_eq!(mem.check_nodes().unwrap(), pages - 1 - 16);
    mem.move_range(mem.guest_addr(0), mem.park_addr(0), 16 * PAGE_SIZE, false)
        .unwrap();
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of staging.rs: the rollback of a failed commit ----

/// A first touch committed from scattered pool pages (no huge chunk free,
/// the small half fragmented) whose move into guest RAM fails after its
/// first page: the pages that reached guest RAM are moved back to the pool
/// (`move_pairs_present`), so the retry finds guest RAM empty and the
/// commit goes through. Without the rollback every retry fails on the page
/// left behind and the VM stops (cargo-mutants: `move_pairs_present`
/// emptied was missed).
#[test]
fn a_commit_whose_move_fails_midway_is_rolled_back_and_retried() {
    use super::pool::{Slot, CHUNK_SLOTS};
    let pages = 2048;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    // Every huge chunk held; every other small slot held.
    let mut held_chunks: Vec<(TierId, Slot)> = Vec::new();
    let mut held_pages: Vec<(TierId, Vec<Slot>)> = Vec::new();
    for t in 0..mem.tier_count() as TierId {
        let mut pool = mem.pool(t);
        while let Some((c, _)) = pool.reserve_chunk(Holds::Hole) {
            held_chunks.push((t, c));
        }
        let n = pool.half_slots();
        let all: Vec<Slot> = pool
            .reserve_pages(n, Holds::Hole)
            .expect("the small half")
            .into_iter()
            .map(|x| x.0)
            .collect();
        let (free, held): (Vec<Slot>, Vec<Slot>) = all.iter().partition(|s| s.0 % 2 == 0);
        pool.release_pages(&free, Holds::Hole);
        held_pages.push((t, held));
    }
    mem.injector()
        .set(&[FaultPlan::parse("move:every=2:max=1").unwrap()]);
    mem.prefault(0, 1).unwrap();
    assert_eq!(
        mem.injector().fired(FaultPoint::Move),
        1,
        "the failure fired"
    );
    mem.injector().set(&[]);
    assert_eq!(mem.fatal_error(), None, "the retried commit failed");
    for p in 0..CHUNK_SLOTS {
        assert!(mem.tier_of(p).is_some(), "page {p} not committed");
        assert_eq!(word(&mem, p).load(Ordering::SeqCst), 0, "page {p} not zero");
    }
    for (t, c) in held_chunks {
        mem.pool(t).release_chunk(c, Holds::Hole, true);
    }
    for (t, v) in held_pages {
        mem.pool(t).release_pages(&v, Holds::Hole);
    }
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of staging.rs: disposing of a whole 2 MiB run ----

/// A freed 2 MiB run goes into the pool's cache as one huge chunk while
/// the cache has room for it (its bound: `pool_cache_pages`), and back to
/// the kernel once it has not; a failed move into the chunk (nothing
/// moved) discards the run, gives the chunk back empty and counts no
/// rollback error. Each way the run's old place ends up empty.
#[test]
fn a_disposed_2mib_run_is_cached_while_the_pool_has_room_else_discarded() {
    use super::pool::CHUNK_SLOTS;
    let pages = 2048;
    let mut cfg = MemConfig::new(pages * PAGE_SIZE, pages);
    cfg.pool_cache_pages = 1100; // room for two chunks, not three
    let Some(mem) = bare(&cfg) else {
        return;
    };
    let tier = 0;
    // A 2 MiB run present at the parking slots of pages 0..512.
    let run = mem.park_addr(0);
    let plant = || {
        let Some(Staging::Chunk(c, _)) = mem.reserve_staging(tier, CHUNK_SLOTS, Holds::Hole) else {
            panic!("a huge chunk");
        };
        let a = mem.slot_addr(tier, c);
        write_slots(&mem, tier, c, CHUNK_SLOTS, 7);
        mem.move_range(run, a, crate::sys::HUGE_PAGE_SIZE, false)
            .unwrap();
        mem.pool(tier).release_chunk(c, Holds::Hole, true);
    };
    let gone = || {
        crate::sys::resident(run, CHUNK_SLOTS)
            .unwrap()
            .iter()
            .all(|&r| !r)
    };
    let cached = || mem.pool(tier).cached_pages();
    for want in [CHUNK_SLOTS, 2 * CHUNK_SLOTS, 2 * CHUNK_SLOTS] {
        plant();
        mem.dispose_huge(tier, run);
        assert!(gone(), "the run is still at its old place");
        assert_eq!(cached(), want, "cached pages after a disposal");
    }
    mem.trim_pool_caches(0);
    assert_eq!(cached(), 0);
    // A failed move into the chunk: discarded, nothing cached, no rollback error.
    plant();
    mem.injector()
        .set(&[FaultPlan::parse("move:every=1:max=1").unwrap()]);
    mem.dispose_huge(tier, run);
    assert_eq!(mem.injector().fired(FaultPoint::Move), 1);
    mem.injector().set(&[]);
    assert!(gone(), "a run whose move failed was not discarded");
    assert_eq!(cached(), 0);
    assert_eq!(
        mem.stats().migration.rollback_errors,
        0,
        "nothing moved: no rollback"
    );
    mem.check_consistency().unwrap();

    // A move that fails part way (a stray page in the chunk's 6th slot, the
    // run of 4 KiB pages): the 5 moved pages and the rest are discarded, the
    // chunk given back empty, and the partial move counted.
    let v = mem
        .pool(tier)
        .reserve_pages(CHUNK_SLOTS, Holds::Hole)
        .expect("small slots");
    let small = mem.slot_addr(tier, v[0].0);
    assert!(
        v.windows(2).all(|w| w[1].0 .0 == w[0].0 .0 + 1),
        "one run of slots"
    );
    write_slots(&mem, tier, v[0].0, CHUNK_SLOTS, 9);
    mem.move_range(run, small, crate::sys::HUGE_PAGE_SIZE, false)
        .unwrap();
    mem.release_staging(tier, &Staging::Pages(v), Holds::Hole, false);
    let Some(Staging::Chunk(c, _)) = mem.reserve_staging(tier, CHUNK_SLOTS, Holds::Hole) else {
        panic!("a huge chunk");
    };
    let chunk = mem.slot_addr(tier, c);
    // SAFETY: a reserved chunk of our pool (a hole is allocated by the write).
    unsafe { ((chunk + 5 * PAGE_SIZE) as *mut u64).write_volatile(1) };
    mem.discard(chunk, 5 * PAGE_SIZE).unwrap();
    mem.discard(chunk + 6 * PAGE_SIZE, (CHUNK_SLOTS - 6) * PAGE_SIZE)
        .unwrap();
    mem.pool(tier).release_chunk(c, Holds::Hole, true); // the next chunk handed out
    mem.dispose_huge(tier, run);
    assert!(gone(), "a run whose move failed part way was not discarded");
    let chunk_empty = crate::sys::resident(chunk, CHUNK_SLOTS)
        .unwrap()
        .iter()
        .all(|&r| !r);
    assert!(chunk_empty, "the chunk was given back holding pages");
    assert_eq!(
        mem.stats().migration.rollback_errors,
        1,
        "the partial move is counted"
    );
    assert_eq!(cached(), 0);
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of sampler.rs: the first window, the guest clock, the window's end ----

/// The first window is what the budget affords if every parked page
/// faulted once at the assumed cost (`ASSUMED_HINT_FAULT_NS`), bounded by
/// the configured scan size and the limits: 2 % of one vCPU-second at
/// 100 us a fault is 200 pages; four vCPUs afford four times as many.
#[test]
fn the_first_window_is_what_the_budget_affords() {
    let Some(mem) = bare(&MemConfig::new(256 * PAGE_SIZE, 256)) else {
        return;
    };
    let base = SamplerConfig {
        scan_pages: 65536,
        min_scan_pages: 16,
        max_scan_pages: 100_000,
        period: Duration::from_secs(1),
        budget_pct: 2.0,
        vcpus: 1,
    };
    let first = |c: SamplerConfig| HintSampler::new(mem.clone(), c).scan_pages();
    assert_eq!(first(base.clone()), 200);
    assert_eq!(
        first(SamplerConfig {
            vcpus: 4,
            ..base.clone()
        }),
        800
    );
    assert_eq!(
        first(SamplerConfig {
            vcpus: 0,
            ..base.clone()
        }),
        200,
        "0 vCPUs count as 1"
    );
    let half_second = SamplerConfig {
        period: Duration::from_millis(500),
        ..base.clone()
    };
    assert_eq!(first(half_second), 100);
    assert_eq!(
        first(SamplerConfig {
            budget_pct: 5.0,
            ..base.clone()
        }),
        500
    );
    assert_eq!(
        first(SamplerConfig {
            scan_pages: 150,
            ..base.clone()
        }),
        150
    );
    assert_eq!(
        first(SamplerConfig {
            max_scan_pages: 120,
            ..base.clone()
        }),
        120
    );
    assert_eq!(
        first(SamplerConfig {
            min_scan_pages: 300,
            ..base.clone()
        }),
        300
    );
    let nothing = SamplerConfig {
        budget_pct: 0.0,
        min_scan_pages: 0,
        ..base
    };
    assert_eq!(first(nothing), 1, "at least one page");
}

/// With a guest clock, the overhead is at least the vCPUs' blocked time
/// times the hint faults' share of the faults served (the estimate from
/// the handler's stall is 0 here); a second vCPU halves it.
#[test]
fn the_guest_clock_counts_the_hint_faults_share_of_the_blocked_time() {
    let Some((mem, _log, _m, faults)) = setup(1024, 512, InitialPlacement::Interleave) else {
        return;
    };
    let blocked = Arc::new(AtomicU64::new(0));
    let b = blocked.clone();
    mem.set_guest_clock(Some(Arc::new(move || Some(b.load(Ordering::SeqCst)))));
    let overhead = |vcpus: usize| {
        let mut s = HintSampler::new(
            mem.clone(),
            SamplerConfig {
                scan_pages: 64,
                min_scan_pages: 8,
                max_scan_pages: 1024,
                period: Duration::from_secs(1),
                budget_pct: 1000.0,
                vcpus,
            },
        );
        s.tick().unwrap(); // the guest clock's first reading
        let t0 = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(100));
        // 50 ms blocked; 10 faults served, 4 of them hint faults: 20 ms.
        blocked.fetch_add(50_000_000, Ordering::SeqCst);
        mem.counters.faults_served.fetch_add(10, Ordering::SeqCst);
        mem.counters.hint_faults.fetch_add(4, Ordering::SeqCst);
        let t = s.tick().unwrap();
        let wall = t0.elapsed().as_secs_f64();
        s.unpark_all().unwrap();
        (t.overhead_pct, wall)
    };
    let (one, wall) = overhead(1);
    let want = 0.020 / wall * 100.0;
    assert!(
        one <= 20.0 + 1e-9 && one >= want * 0.9,
        "1 vCPU: {one} % (20 ms of {wall:.3} s is {want:.1} %)"
    );
    let (two, wall) = overhead(2);
    let want = 0.020 / (2.0 * wall) * 100.0;
    assert!(
        two <= 10.0 + 1e-9 && two >= want * 0.9,
        "2 vCPUs: {two} % (20 ms of 2 x {wall:.3} s is {want:.1} %)"
    );
    mem.set_guest_clock(None);
    faults.stop().unwrap();
}

/// A window never ends inside a huge range (it takes the rest of it), and
/// the cursor wraps at the end of guest RAM, counting a cycle; every page
/// looked at is counted as scanned.
#[test]
fn a_window_ends_at_a_huge_range_and_wraps_at_the_end_of_guest_ram() {
    let Some((mem, _log, _m, faults)) = setup(1024, 1024, InitialPlacement::FastFirst) else {
        return;
    };
    assert!(mem.huge_range_of(0).is_some(), "the first range is huge");
    let mut s = HintSampler::new(
        mem.clone(),
        SamplerConfig {
            scan_pages: 300,
            min_scan_pages: 300,
            max_scan_pages: 300,
            period: Duration::from_secs(1),
            budget_pct: 1000.0,
            vcpus: 1,
        },
    );
    let scanned = || mem.sampler_account().scanned_pages;
    let t = s.tick().unwrap();
    assert_eq!(t.parked, 512, "the window takes the rest of the huge range");
    assert_eq!((scanned(), mem.scan_cycles()), (512, 0));
    let t = s.tick().unwrap();
    assert_eq!(t.untouched, 512);
    assert_eq!(t.parked, 512);
    assert_eq!((scanned(), mem.scan_cycles()), (1024, 1), "wrapped once");
    s.unpark_all().unwrap();
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

/// Disposing of a page that is not there (its move into the cache finds
/// no source) leaves the pool as it was: the hole it reserved is a hole
/// again, not "healed" into a cached page (an empty cached slot), and no
/// heal is counted. Then a page that is there goes into the cache.
#[test]
fn disposing_of_a_missing_page_leaves_the_pool_as_it_was() {
    let pages = 256;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    let tier = 0;
    let cached = || mem.pool(tier).cached_pages();
    let holes = || mem.pool(tier).holes().count();
    let (c0, h0) = (cached(), holes());
    mem.dispose(tier, &[mem.park_addr(3)]);
    assert_eq!((cached(), holes()), (c0, h0), "the pool changed");
    assert_eq!(
        mem.stats().backing.slot_heals,
        0,
        "a missing source is not an occupied slot"
    );
    plant_page(&mem, mem.park_addr(3));
    mem.dispose(tier, &[mem.park_addr(3)]);
    assert_eq!(
        (cached(), holes()),
        (c0 + 1, h0 - 1),
        "the page was not cached"
    );
    assert!(!crate::sys::resident(mem.park_addr(3), 1).unwrap()[0]);
    mem.check_consistency().unwrap();
}

/// `discard_coalesced` discards exactly the pages given, a run at a time
/// (pages between and after the runs stay), and trimming a pool's cache
/// returns what it gave back: single pages and whole chunks.
#[test]
fn discards_take_exactly_the_pages_given_and_trims_count_what_they_gave_back() {
    use super::pool::CHUNK_SLOTS;
    let pages = 1024;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    let tier = 0;
    let v = mem.pool(tier).reserve_pages(8, Holds::Hole).expect("slots");
    let slots: Vec<usize> = v.iter().map(|x| mem.slot_addr(tier, x.0)).collect();
    assert!(
        slots.windows(2).all(|w| w[1] == w[0] + PAGE_SIZE),
        "one run"
    );
    for &a in &slots {
        // SAFETY: reserved small slots of our pool (a hole is allocated by the write).
        unsafe { (a as *mut u64).write_volatile(1) };
    }
    mem.discard_coalesced(&[slots[5], slots[0], slots[3], slots[2]]);
    let resident: Vec<bool> = slots
        .iter()
        .map(|&a| crate::sys::resident(a, 1).unwrap()[0])
        .collect();
    assert_eq!(
        resident,
        [false, true, false, false, true, false, true, true],
        "pages 0, 2, 3 and 5 of 8 discarded"
    );
    mem.discard_coalesced(&slots);
    mem.pool(tier)
        .release_pages(&v.iter().map(|x| x.0).collect::<Vec<_>>(), Holds::Hole);

    // Three cached pages and one cached chunk.
    for p in [3, 4, 9] {
        plant_page(&mem, mem.park_addr(p));
    }
    mem.dispose(
        tier,
        &[mem.park_addr(3), mem.park_addr(4), mem.park_addr(9)],
    );
    let Some(Staging::Chunk(c, _)) = mem.reserve_staging(tier, CHUNK_SLOTS, Holds::Hole) else {
        panic!("a huge chunk");
    };
    write_slots(&mem, tier, c, CHUNK_SLOTS, 2);
    // Given back tainted (split: a page table in the pool area).
    mem.release_staging(tier, &Staging::Chunk(c, Holds::Hole), Holds::Cached, false);
    assert_eq!(mem.pool(tier).cached_pages(), 3 + CHUNK_SLOTS);
    assert_eq!(
        mem.trim_tier_cache(tier, 2),
        CHUNK_SLOTS + 1,
        "the chunk and one page"
    );
    // The discard left its page table: the chunk is a hole, still tainted.
    assert_eq!(mem.pool(tier).chunk_tainted(c), Some(true));
    assert_eq!(mem.pool(tier).cached_pages(), 2);
    assert_eq!(mem.trim_pool_caches(0), 2);
    assert_eq!(mem.pool(tier).cached_pages(), 0);
    mem.check_consistency().unwrap();
}

/// The watchdog's last resort: `wake_all` wakes a thread blocked on a guest
/// page that became present without a wake-up (a lost wake), and it reads
/// the page. cargo-mutants: `wake_all` emptied was missed.
#[test]
fn wake_all_wakes_a_thread_whose_page_came_without_a_wake() {
    let pages = 64;
    let Some(mem) = bare(&MemConfig::new(pages * PAGE_SIZE, pages)) else {
        return;
    };
    let page = 20;
    let t = Toucher::spawn(&mem, mem.guest_addr(page));
    // The thread is in its userfault (no handler runs): give it time to get there.
    std::thread::sleep(Duration::from_millis(50));
    let st: Staging = mem.reserve_staging(0, 1, Holds::Hole).expect("a pool slot");
    let a = st.addr(&mem, 0, 0);
    // SAFETY: `a` is a reserved pool slot of our mapping (a hole is allocated by the write).
    unsafe { (a as *mut u64).write_volatile(0xbeef) };
    mem.move_range(mem.guest_addr(page), a, PAGE_SIZE, false)
        .expect("the page into guest RAM, no wake");
    mem.release_staging(0, &st, Holds::Hole, false);
    assert!(
        t.rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "the thread returned without a wake"
    );
    mem.wake_all();
    assert_eq!(t.returned(&mem, "wake_all"), Ok(0xbeef));
    mem.discard(mem.guest_addr(page), PAGE_SIZE).unwrap();
    mem.check_consistency().unwrap();
}

/// A window that reaches the end of guest RAM goes on from page 0 (4 KiB
/// pages: no huge range stretches it): every window of a 1000-page guest
/// parks its 300 pages, the fourth from page 900 through the end and on
/// from page 0, and the cursor wraps once. cargo-mutants: the window cut
/// at the end of guest RAM, and a page past it taken, were missed.
#[test]
fn a_window_that_reaches_the_end_of_guest_ram_goes_on_from_page_0() {
    let mut cfg = MemConfig::new(1000 * PAGE_SIZE, 1000);
    cfg.huge_pages = false;
    let Some((mem, _log, _m, faults)) = super::tests::setup_with(cfg) else {
        return;
    };
    let mut s = HintSampler::new(
        mem.clone(),
        SamplerConfig {
            scan_pages: 300,
            min_scan_pages: 300,
            max_scan_pages: 300,
            period: Duration::from_secs(1),
            budget_pct: 1000.0,
            vcpus: 1,
        },
    );
    for (tick, cycles) in [(1, 0), (2, 0), (3, 0), (4, 1)] {
        let t = s.tick().unwrap();
        assert_eq!(t.parked, 300, "window {tick}: {t:?}");
        assert_eq!(mem.scan_cycles(), cycles, "window {tick}");
    }
    // The fourth window holds pages 900..1000 and 0..200.
    for (p, parked) in [
        (899, false),
        (900, true),
        (999, true),
        (0, true),
        (199, true),
        (200, false),
    ] {
        let w = mem.pages.load(p);
        assert_eq!(w & page_map::PARKED != 0, parked, "page {p}");
    }
    s.unpark_all().unwrap();
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}

// ---- cargo-mutants of sampler.rs: the sampler's thread ----

/// The sampler's thread ticks once a period, not once and not without
/// pause; pausing it (or the policy holding sampling) unparks every page
/// and parks none until resumed; stopping or dropping its handle ends the
/// thread with no page left parked. cargo-mutants: 13 mutants of `spawn`,
/// `set_paused` and the handle's `Drop` were missed (no memory-layer test
/// ran the thread).
#[test]
fn the_sampler_thread_ticks_each_period_pauses_and_stops() {
    let Some((mem, _log, _m, faults)) = setup(1024, 512, InitialPlacement::Interleave) else {
        return;
    };
    let parked = || {
        (0..mem.guest_pages())
            .filter(|&p| mem.pages.load(p) & page_map::PARKED != 0)
            .count()
    };
    let scanned = || mem.sampler_account().scanned_pages;
    let period = Duration::from_millis(50);
    let cfg = SamplerConfig {
        scan_pages: 512,
        min_scan_pages: 512,
        max_scan_pages: 512,
        period,
        budget_pct: 1000.0,
        vcpus: 1,
    };
    let before = Arc::strong_count(&mem);
    let h = HintSampler::new(mem.clone(), cfg.clone()).spawn().unwrap();
    assert!(wait_until(|| parked() > 0), "no window parked");
    let s0 = scanned();
    assert!(wait_until(|| scanned() > s0), "the thread ticked only once");
    // Once a period: at most 300 ms / 50 ms + 2 windows of 512 pages.
    let (s1, t1) = (scanned(), std::time::Instant::now());
    std::thread::sleep(Duration::from_millis(300));
    let windows = (scanned() - s1) as f64 / 512.0;
    let most = t1.elapsed().as_secs_f64() / period.as_secs_f64() + 2.0;
    assert!(windows <= most, "{windows} windows in {:?}", t1.elapsed());

    for (what, pause, resume) in [
        (
            "paused",
            &(|| h.set_paused(true)) as &dyn Fn(),
            &(|| h.set_paused(false)) as &dyn Fn(),
        ),
        (
            "held",
            &(|| mem.hold_sampling(true)),
            &(|| mem.hold_sampling(false)),
        ),
    ] {
        pause();
        assert!(wait_until(|| parked() == 0), "{what}: pages still parked");
        // A tick under way when the pause came unparks its old window
        // before it parks the next (none parked for a moment), then the
        // thread sees the pause and unparks that one: look again after
        // two periods, so that only a sample taken while paused can fail.
        std::thread::sleep(2 * period);
        assert!(wait_until(|| parked() == 0), "{what}: pages still parked");
        let s = scanned();
        std::thread::sleep(3 * period);
        assert_eq!(
            (parked(), scanned()),
            (0, s),
            "{what}: sampled while {what}"
        );
        resume();
        assert!(wait_until(|| parked() > 0), "{what}: not resumed");
    }

    drop(h);
    assert_eq!(parked(), 0, "dropped with pages parked");
    assert_eq!(
        Arc::strong_count(&mem),
        before,
        "the thread outlived its handle"
    );
    let h = HintSampler::new(mem.clone(), cfg).spawn().unwrap();
    assert!(wait_until(|| parked() > 0));
    let s = h.stop().unwrap();
    assert_eq!(parked(), 0, "stopped with pages parked");
    drop(s);
    assert_eq!(Arc::strong_count(&mem), before);
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}
