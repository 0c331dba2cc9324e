//! Per-segment dirty logging (issue 29): the harvester switches on only the
//! segments of the pages a mover arms, keeps a segment on while a page of it
//! has a shadow, and switches the others off after `LOGGING_IDLE_OFF`, so
//! KVM keeps huge-page mappings where nothing is tracked.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backing::Parker;
use super::page_map::{self, BUSY, DIRTY_SEEN, PARKED};
use super::tests::{guest_write, setup_with, word, Env};
use super::*;

/// A switchable log of segments over the software log: records every
/// switch, and reads clean (and ignores clears) in segments that are off,
/// as KVM does for an unlogged memslot.
struct Segmented {
    soft: Arc<SoftDirtyLog>,
    seg_pages: usize,
    on: Vec<AtomicBool>,
    switches: Mutex<Vec<(usize, bool)>>,
    /// Logging is on from the start (a log that is never switched).
    starts_on: bool,
}

impl Segmented {
    /// Four segments of 128 pages over `soft`, all off (or all on).
    fn four(soft: Arc<SoftDirtyLog>, starts_on: bool) -> Arc<Self> {
        Arc::new(Self {
            soft,
            seg_pages: 128,
            on: (0..4).map(|_| AtomicBool::new(starts_on)).collect(),
            switches: Mutex::new(Vec::new()),
            starts_on,
        })
    }
}

impl DirtyLog for Segmented {
    fn pages(&self) -> usize {
        self.soft.pages()
    }
    fn get(&self, bitmap: &mut [u64]) -> io::Result<()> {
        self.soft.get(bitmap)?;
        for (w, word) in bitmap.iter_mut().enumerate() {
            if !self.on[w * 64 / self.seg_pages].load(Ordering::SeqCst) {
                *word = 0;
            }
        }
        Ok(())
    }
    fn clear(&self, first_page: usize, mask: &[u64]) -> io::Result<()> {
        self.soft.clear(first_page, mask)
    }
    fn starts_on(&self) -> bool {
        self.starts_on
    }
    fn segment_pages(&self) -> usize {
        self.seg_pages
    }
    fn set_segment_logging(&self, seg: usize, on: bool) -> io::Result<()> {
        self.on[seg].store(on, Ordering::SeqCst);
        self.switches.lock().unwrap().push((seg, on));
        Ok(())
    }
}

#[test]
fn only_the_segments_of_tracked_pages_are_logged() {
    let Some((mem, soft, _, _faults)) = segmented_env() else {
        return;
    };
    let log = Segmented::four(soft, false);
    let m = migrator_over(&mem, &log);
    // A transactional promotion of a page of segment 2 (pages 256..384)
    // switches that segment on, and only it.
    promote_keeping_shadow(&m, &mem, 300);
    assert_eq!(*log.switches.lock().unwrap(), vec![(2, true)]);
    assert_eq!(m.harvester_segments_on(), (1, 4));
    // The shadow keeps segment 2 on past the idle delay.
    m.harvest().unwrap();
    idle();
    m.harvest().unwrap();
    assert_eq!(
        m.harvester_segments_on(),
        (1, 4),
        "a shadow needs its page's writes"
    );
    // Demoted back (the shadow is used and gone): the segment goes off
    // once it has been idle for the delay.
    let out = m
        .demote(&[Unit::page(300)], Mechanism::StopAndCopy)
        .unwrap();
    assert_eq!(out.shadow_demoted, 1, "{out:?}");
    assert!(!mem.has_shadow(300));
    m.harvest().unwrap();
    idle();
    m.harvest().unwrap();
    assert_eq!(m.harvester_segments_on(), (0, 4));
    assert_eq!(log.switches.lock().unwrap().last(), Some(&(2, false)));
    mem.check_consistency().unwrap();
}

/// A policy that reads write counts (`set_dirty_log_required`) has every
/// segment logged from the next harvest on, past the idle delay; once it
/// no longer does, they go off after the delay. `dirty_log_state` says
/// whether logging is on.
#[test]
fn required_logging_switches_every_segment_on_until_released() {
    let Some((mem, soft, _, _faults)) = segmented_env() else {
        return;
    };
    let log = Segmented::four(soft, false);
    let m = migrator_over(&mem, &log);
    assert_eq!(m.dirty_log_state(), (false, 0), "nothing tracked: off");
    m.harvest().unwrap();
    assert_eq!(m.harvester_segments_on(), (0, 4));
    m.set_dirty_log_required(true);
    m.harvest().unwrap();
    assert_eq!(m.harvester_segments_on(), (4, 4));
    assert_eq!(m.dirty_log_state(), (true, 4));
    // Required: no segment goes off, however long it is idle.
    idle();
    m.harvest().unwrap();
    idle();
    m.harvest().unwrap();
    assert_eq!(m.dirty_log_state(), (true, 4), "required logging held");
    // Released: off once idle for the delay, and not before.
    m.set_dirty_log_required(false);
    m.harvest().unwrap();
    m.harvest().unwrap();
    assert_eq!(
        m.harvester_segments_on(),
        (4, 4),
        "not idle long enough yet"
    );
    idle();
    m.harvest().unwrap();
    assert_eq!(m.dirty_log_state(), (false, 8));
    let off: Vec<(usize, bool)> = log.switches.lock().unwrap()[4..].to_vec();
    assert_eq!(off, vec![(0, false), (1, false), (2, false), (3, false)]);
    mem.check_consistency().unwrap();
}

/// 512 pages, half fast, every page slow first, with the test's soft log.
fn segmented_env() -> Option<Env> {
    let pages = 512;
    let mut cfg = MemConfig::new(pages * PAGE_SIZE, 256);
    cfg.placement = InitialPlacement::SlowFirst;
    cfg.tiers[1].capacity_pages = pages + 64;
    cfg.tiers[1].max_capacity_pages = pages + 64;
    setup_with(cfg)
}

fn idle() {
    std::thread::sleep(harvest::LOGGING_IDLE_OFF + Duration::from_millis(50));
}

/// A migrator of `mem` over the test's segmented `log`.
fn migrator_over(mem: &Arc<TieredMemory>, log: &Arc<Segmented>) -> Migrator {
    Migrator::new(
        mem.clone(),
        Box::new(log.clone()),
        MigratorConfig::default(),
    )
    .unwrap()
}

/// Promotes `page` by TPM keeping its shadow (committed, shadowed).
fn promote_keeping_shadow(m: &Migrator, mem: &TieredMemory, page: u64) {
    let out = m
        .promote(
            &[Unit::page(page)],
            Mechanism::Transactional { keep_shadow: true },
        )
        .unwrap();
    assert_eq!(out.committed, 1, "{out:?}");
    assert!(mem.has_shadow(page as usize));
}

/// A transaction in flight keeps its segment logged however long the
/// harvests find nothing else to track (switched off mid-transaction, a
/// write to the page would be missed: a lost write at commit); after it
/// ends, the segment goes off once idle. A log that starts on (one that is
/// never switched) is never switched off.
#[test]
fn a_transaction_in_flight_keeps_its_segment_logged_and_an_always_on_log_stays_on() {
    let Some((mem, soft, _, _faults)) = segmented_env() else {
        return;
    };
    let log = Segmented::four(soft.clone(), false);
    let h = harvest::DirtyHarvester::new(Box::new(log.clone()), &mem).unwrap();
    h.begin();
    h.arm(&mem, [10usize].into_iter()).unwrap();
    assert_eq!(h.segments_on(), (1, 4));
    h.harvest(&mem).unwrap();
    idle();
    h.harvest(&mem).unwrap();
    assert_eq!(h.segments_on(), (1, 4), "in flight: logged");
    h.end();
    h.harvest(&mem).unwrap();
    idle();
    h.harvest(&mem).unwrap();
    assert_eq!(h.segments_on(), (0, 4), "ended and idle: off");

    let always = Segmented::four(soft, true);
    let h = harvest::DirtyHarvester::new(Box::new(always.clone()), &mem).unwrap();
    assert_eq!(h.segments_on(), (4, 4));
    h.harvest(&mem).unwrap();
    idle();
    h.harvest(&mem).unwrap();
    assert_eq!(h.segments_on(), (4, 4), "a log that starts on stays on");
    assert!(always.switches.lock().unwrap().is_empty());
}

/// A shadow keeps its segment logged, in the first segment as in any
/// other (the segment's pages are looked up from its first page).
#[test]
fn a_shadow_in_the_first_segment_keeps_it_logged() {
    let Some((mem, soft, _, _faults)) = segmented_env() else {
        return;
    };
    let log = Segmented::four(soft, false);
    let m = migrator_over(&mem, &log);
    promote_keeping_shadow(&m, &mem, 10);
    m.harvest().unwrap();
    idle();
    m.harvest().unwrap();
    assert_eq!(
        m.harvester_segments_on(),
        (1, 4),
        "page 10's shadow needs its writes"
    );
    mem.check_consistency().unwrap();
}

/// A deferring harvest takes a written shadowed page and sets its shadow
/// aside; `finish_deferred` invalidates the shadow and gives the page back
/// at once (a guest touching it waits until then), not at the next harvest.
#[test]
fn finish_deferred_invalidates_set_aside_shadows_and_releases_their_pages() {
    let Some((mem, soft, m, _faults)) = segmented_env() else {
        return;
    };
    promote_keeping_shadow(&m, &mem, 3);
    let h = harvest::DirtyHarvester::new(Box::new(soft.clone()), &mem).unwrap();
    guest_write(&mem, &soft, 3, 0x5a);
    assert_eq!(h.harvest_deferring(&mem).unwrap(), 1);
    assert_ne!(mem.pages.load(3) & BUSY, 0, "set aside: owned");
    assert!(mem.has_shadow(3));
    h.finish_deferred(&mem);
    assert_eq!(mem.pages.load(3) & BUSY, 0, "given back");
    assert!(!mem.has_shadow(3), "written: the shadow is stale");
    mem.check_consistency().unwrap();
}

/// `arm` re-arms exactly its pages. A write that lands between its harvest
/// and its re-arm is forgotten for the armed page (the copy that follows
/// reads it), and kept for every other page: pages 65 and 390, another
/// transaction's in its copy window, must show it at the next harvest, or
/// that transaction would commit a copy without the write. 65 shares page
/// 70's bitmap word (bit 1), 390 is bit 6 of word 6.
#[test]
fn arm_re_arms_exactly_its_pages_and_keeps_other_pages_writes() {
    let Some((mem, soft, _, _faults)) = segmented_env() else {
        return;
    };
    let h = harvest::DirtyHarvester::new(Box::new(soft.clone()), &mem).unwrap();
    let others = [65usize, 390];
    for p in others.into_iter().chain([70]) {
        assert!(mem.pages.try_acquire(p, false).is_some(), "page {p} owned");
    }
    h.arm(&mem, others.into_iter()).unwrap();
    let (m2, s2) = (mem.clone(), soft.clone());
    crate::test_point::with_action(
        move |point| {
            if point == crate::test_point::TestPoint::ArmHarvested {
                for p in [70, 65, 390] {
                    let _g = s2.write_guard(p, 1);
                    word(&m2, p).store(p as u64 + 7, Ordering::SeqCst);
                }
            }
        },
        || h.arm(&mem, [70usize].into_iter()),
    )
    .unwrap();
    h.harvest(&mem).unwrap();
    let seen = |p: usize| mem.pages.load(p) & DIRTY_SEEN != 0;
    assert!(seen(65) && seen(390), "another transaction's write kept");
    assert!(!seen(70), "the armed page's earlier write forgotten");
    for p in others.into_iter().chain([70]) {
        mem.pages.release(p, 0, DIRTY_SEEN);
    }
}

/// A segment switched on reads every page dirty at its first harvest (KVM's
/// `INITIALLY_SET`): that harvest counts no write for untracked pages, in
/// whichever segment it is; the write counts are a policy input.
#[test]
fn the_first_harvest_of_a_segment_counts_no_writes() {
    let Some((mem, soft, _, _faults)) = segmented_env() else {
        return;
    };
    let log = Segmented::four(soft.clone(), false);
    let m = migrator_over(&mem, &log);
    // Page 300 (segment 2) written while its segment is off: its bit
    // shows once the segment is on, as every bit does on KVM.
    guest_write(&mem, &soft, 300, 1);
    let out = m
        .promote(
            &[Unit::page(260)],
            Mechanism::Transactional { keep_shadow: false },
        )
        .unwrap();
    assert_eq!(out.committed, 1, "{out:?}");
    assert_eq!(m.harvester_segments_on(), (1, 4));
    m.harvest().unwrap();
    assert_eq!(
        page_map::write_count_of(mem.pages.load(300)),
        0,
        "a fresh segment's bits are no writes"
    );
    mem.check_consistency().unwrap();
}

/// A VMM write (a device's DMA into guest RAM) to a shadowed page made
/// after a harvest read the logs is not in what it read, so that harvest
/// must leave its bit for the next one, which invalidates the stale
/// shadow (kept, a later demotion would remap the shadow and lose the
/// write).
#[test]
fn a_vmm_write_after_the_harvests_read_is_left_for_the_next_harvest() {
    let Some((mem, _, m, _faults)) = segmented_env() else {
        return;
    };
    promote_keeping_shadow(&m, &mem, 70);
    let mm = mem.clone();
    crate::test_point::with_action(
        move |point| {
            if point == crate::test_point::TestPoint::HarvestRead {
                let _vmm = mm.vmm_writes().write_guard(70, 1);
                word(&mm, 70).store(4242, Ordering::SeqCst);
            }
        },
        || m.harvest(),
    )
    .unwrap();
    assert!(mem.has_shadow(70), "not in what the harvest read");
    m.harvest().unwrap();
    assert!(!mem.has_shadow(70), "the next harvest sees the VMM write");
    mem.check_consistency().unwrap();
}

/// A mover's re-arm clears its own pages' bits in the VMM-write log, not
/// another word's: page 70 (word 1, bit 6) armed for a TPM while a VMM write
/// lands on shadowed page 6 (word 0, bit 6) between the arm's harvest and its
/// clear. That write must reach the next harvest (a bit cleared at the wrong
/// word loses it: page 6's shadow kept stale, a later demotion by remap
/// would map the old content back).
#[test]
fn a_movers_rearm_leaves_another_words_vmm_write_for_the_next_harvest() {
    let Some((mem, _, m, _faults)) = segmented_env() else {
        return;
    };
    promote_keeping_shadow(&m, &mem, 6);
    let mm = mem.clone();
    let wrote = Arc::new(AtomicBool::new(false));
    let w2 = wrote.clone();
    crate::test_point::with_action(
        move |point| {
            if point == crate::test_point::TestPoint::ArmHarvested
                && !w2.swap(true, Ordering::SeqCst)
            {
                let _vmm = mm.vmm_writes().write_guard(6, 1);
                word(&mm, 6).store(4242, Ordering::SeqCst);
            }
        },
        || promote_keeping_shadow(&m, &mem, 70),
    );
    assert!(
        wrote.load(Ordering::SeqCst),
        "the arm's harvest was reached"
    );
    m.harvest().unwrap();
    assert!(
        !mem.has_shadow(6),
        "the next harvest sees the VMM write to page 6"
    );
    assert_eq!(word(&mem, 6).load(Ordering::SeqCst), 4242);
    mem.check_consistency().unwrap();
}

/// What a harvest leaves in the logs: an untracked page's bit stays set in
/// the guest's log (left unarmed: the guest writes on without faults) and
/// is gone from the VMM-write log (which costs nothing to re-arm); a
/// shadowed page that is parked keeps its bit and its shadow for the
/// harvest after its touch (the bit predates the parking).
#[test]
fn a_harvest_leaves_untracked_bits_set_and_parked_shadowed_pages_for_later() {
    let Some((mem, soft, m, faults)) = segmented_env() else {
        return;
    };
    promote_keeping_shadow(&m, &mem, 70);
    for p in [5usize, 69, 70] {
        let _g = soft.write_guard(p, 1);
        let _v = mem.vmm_writes().write_guard(p, 1);
        word(&mem, p).store(word(&mem, p).load(Ordering::SeqCst), Ordering::SeqCst);
    }
    assert_eq!(mem.park_pages(&[70], Parker::Sampler).unwrap(), vec![70]);
    m.harvest().unwrap();
    let bits = |log: &SoftDirtyLog| {
        let mut b = vec![0u64; 8];
        log.get(&mut b).unwrap();
        (b[0] >> 5 & 1, b[1] >> 5 & 1, b[1] >> 6 & 1)
    };
    assert_eq!(
        bits(&soft),
        (1, 1, 1),
        "pages 5 and 69 left unarmed; parked page 70 left for later"
    );
    let vmm = bits(mem.vmm_writes());
    assert_eq!((vmm.0, vmm.1), (0, 0), "the VMM-write log's bits consumed");
    assert!(
        mem.has_shadow(70),
        "a parked shadowed page keeps its shadow"
    );
    assert_ne!(mem.pages.load(70) & PARKED, 0);
    mem.unpark_pages_settled(&[70], Parker::Sampler).unwrap();
    faults.stop().unwrap();
    mem.check_consistency().unwrap();
}
