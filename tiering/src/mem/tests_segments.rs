//! Per-segment dirty logging (issue 29): the harvester switches on only the
//! segments of the pages a mover arms, keeps a segment on while a page of it
//! has a shadow, and switches the others off after `LOGGING_IDLE_OFF`, so
//! KVM keeps huge-page mappings where nothing is tracked.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::tests::setup_with;
use super::*;

/// A switchable log of segments over the software log: records every
/// switch, and reads clean (and ignores clears) in segments that are off,
/// as KVM does for an unlogged memslot.
struct Segmented {
    soft: Arc<SoftDirtyLog>,
    seg_pages: usize,
    on: Vec<AtomicBool>,
    switches: Mutex<Vec<(usize, bool)>>,
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
        false
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
    let pages = 512;
    let mut cfg = MemConfig::new(pages * PAGE_SIZE, 256);
    cfg.placement = InitialPlacement::SlowFirst;
    cfg.tiers[1].capacity_pages = pages + 64;
    cfg.tiers[1].max_capacity_pages = pages + 64;
    let Some((mem, soft, _, _faults)) = setup_with(cfg) else {
        return;
    };
    let log = Arc::new(Segmented {
        soft,
        seg_pages: 128,
        on: (0..4).map(|_| AtomicBool::new(false)).collect(),
        switches: Mutex::new(Vec::new()),
    });
    let m = Migrator::new(
        mem.clone(),
        Box::new(log.clone()),
        MigratorConfig::default(),
    )
    .unwrap();
    // A transactional promotion of a page of segment 2 (pages 256..384)
    // switches that segment on, and only it.
    let out = m
        .promote(
            &[Unit::page(300)],
            Mechanism::Transactional { keep_shadow: true },
        )
        .unwrap();
    assert_eq!(out.committed, 1, "{out:?}");
    assert!(mem.has_shadow(300));
    assert_eq!(*log.switches.lock().unwrap(), vec![(2, true)]);
    assert_eq!(m.harvester_segments_on(), (1, 4));
    // The shadow keeps segment 2 on past the idle delay.
    m.harvest().unwrap();
    std::thread::sleep(harvest::LOGGING_IDLE_OFF + Duration::from_millis(50));
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
    std::thread::sleep(harvest::LOGGING_IDLE_OFF + Duration::from_millis(50));
    m.harvest().unwrap();
    assert_eq!(m.harvester_segments_on(), (0, 4));
    assert_eq!(log.switches.lock().unwrap().last(), Some(&(2, false)));
    mem.check_consistency().unwrap();
}
