//! `KVM_CLEAR_DIRTY_LOG` on a real KVM memslot beyond its first bitmap
//! word: `KvmDirtyLog::clear(first_page, mask)` must re-arm exactly the
//! masked pages counted from `first_page`. A wrong `first_page` re-arms
//! other pages (a write to those is then missed by the next harvest: a
//! lost guest write) and leaves the masked ones dirty; only a two-minute
//! live test noticed it before, as "no migrations happened".
//!
//! Planted bug caught (issue 34): `first_page` passed to the kernel as 0.
//! The segmented log (tiered VMs) and the plain one are covered too:
//! cargo-mutants left their slot numbers, segment offsets, switching and
//! error paths untested before.

use std::sync::Arc;

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::Kvm;
use tiering::host_support::HostFeature;
use tiering::mem::{DirtyLog, PAGE_SIZE};
use vmm_core::kvm_dirty_log::{enable_manual_dirty_log_protect_initially_set, KvmDirtyLog};

/// An anonymous mapping of `pages` pages (guest RAM of the memslot).
struct Ram {
    addr: *mut libc::c_void,
    len: usize,
}

impl Ram {
    fn new(pages: usize) -> Self {
        let len = pages * PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap");
        Self { addr, len }
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once (the VM using it is dropped first).
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

fn bit(bm: &[u64], p: usize) -> bool {
    bm[p / 64] >> (p % 64) & 1 != 0
}

/// With `KVM_DIRTY_LOG_INITIALLY_SET` every page of a newly logged memslot
/// reads dirty; clearing single pages at index 64 and above must clear
/// exactly those pages and no other: in a slot of 100 pages (the last word
/// is partial, the range ends at the slot's end: a wrong `first_page` is
/// refused by KVM) and of 256 pages (a wrong `first_page` that is a
/// multiple of 64 is accepted, and silently clears other pages).
#[test]
fn clearing_pages_past_the_first_bitmap_word_clears_exactly_them() {
    if !tiering::host_support::require(&[HostFeature::Kvm]) {
        return;
    }
    let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
    for pages in [256, 100] {
        clear_in_a_slot_of(pages);
    }
}

fn clear_in_a_slot_of(pages: usize) {
    let ram = Ram::new(pages);
    let kvm = Kvm::new().expect("KVM");
    let vm = Arc::new(kvm.create_vm().unwrap());
    enable_manual_dirty_log_protect_initially_set(&vm).unwrap();
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: KVM_MEM_LOG_DIRTY_PAGES,
        guest_phys_addr: 0,
        memory_size: ram.len as u64,
        userspace_addr: ram.addr as u64,
    };
    // SAFETY: `ram` is a live anonymous mapping that outlives `vm` and the
    // log's share of it (declared before both, so dropped after them).
    unsafe { vm.set_user_memory_region(region).unwrap() };
    let log = KvmDirtyLog::new(vm.clone(), 0, pages);
    let mut bm = vec![0u64; pages.div_ceil(64)];
    log.get(&mut bm).unwrap();
    let all: Vec<usize> = (0..pages).collect();
    assert!(
        all.iter().all(|&p| bit(&bm, p)),
        "{pages} pages: INITIALLY_SET: every page starts dirty: {bm:#x?}"
    );
    let dirty_but = |bm: &[u64], clean: &[usize]| {
        let dirty: Vec<usize> = all.iter().copied().filter(|&p| bit(bm, p)).collect();
        let want: Vec<usize> = all.iter().copied().filter(|p| !clean.contains(p)).collect();
        assert_eq!(dirty, want, "{pages} pages: only {clean:?} clean: {bm:#x?}");
    };
    // Page 70 (bit 6 of the second word).
    log.clear(64, &[1 << 6]).unwrap();
    log.get(&mut bm).unwrap();
    dirty_but(&bm, &[70]);
    // Pages 64 and 99 (the last page of the 100-page slot).
    log.clear(64, &[1 | 1 << 35]).unwrap();
    log.get(&mut bm).unwrap();
    dirty_but(&bm, &[64, 70, 99]);
    // Clearing in the first word works too, and touches only it.
    log.clear(0, &[1 << 6]).unwrap();
    log.get(&mut bm).unwrap();
    dirty_but(&bm, &[6, 64, 70, 99]);
    drop(vm);
}

/// The log of a tiered VM: guest RAM in two memslots (segments of 128 and
/// 100 pages) registered without logging, switched per segment. A segment
/// that is off reads clean and ignores clears; one switched on reads every
/// page dirty (`INITIALLY_SET`) until cleared; a clear spanning both
/// segments re-arms exactly its pages in each (counted from each slot's
/// own first page); switched off again, the segment reads clean.
#[test]
fn a_segmented_log_switches_reads_and_clears_each_segment() {
    if !tiering::host_support::require(&[HostFeature::Kvm]) {
        return;
    }
    let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
    const SEG: usize = 128;
    const PAGES: usize = SEG + 100;
    let ram = Ram::new(PAGES);
    let kvm = Kvm::new().expect("KVM");
    let vm = Arc::new(kvm.create_vm().unwrap());
    enable_manual_dirty_log_protect_initially_set(&vm).unwrap();
    let regions: Vec<kvm_userspace_memory_region> = [(0usize, SEG), (SEG, PAGES - SEG)]
        .iter()
        .enumerate()
        .map(|(slot, &(first, pages))| kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: (first * PAGE_SIZE) as u64,
            memory_size: (pages * PAGE_SIZE) as u64,
            userspace_addr: ram.addr as u64 + (first * PAGE_SIZE) as u64,
        })
        .collect();
    for r in &regions {
        // SAFETY: `ram` is a live anonymous mapping that outlives `vm` and the
        // log's share of it (declared before both); the two regions are
        // disjoint parts of it.
        unsafe { vm.set_user_memory_region(*r).unwrap() };
    }
    let log = KvmDirtyLog::segmented(vm.clone(), regions);
    assert_eq!(log.pages(), PAGES);
    assert_eq!(log.segment_pages(), SEG);
    assert!(!log.starts_on(), "a segmented log starts off");

    let mut bm = vec![u64::MAX; PAGES.div_ceil(64)];
    let dirty = |bm: &[u64]| -> Vec<usize> { (0..PAGES).filter(|&p| bit(bm, p)).collect() };
    let range = |lo: usize, hi: usize, but: &[usize]| -> Vec<usize> {
        (lo..hi).filter(|p| !but.contains(p)).collect()
    };
    // Both segments off: everything reads clean.
    log.get(&mut bm).unwrap();
    assert_eq!(dirty(&bm), Vec::<usize>::new(), "both segments off");

    // The second segment on: its pages (only) read dirty.
    log.set_segment_logging(1, true).unwrap();
    log.get(&mut bm).unwrap();
    assert_eq!(dirty(&bm), range(SEG, PAGES, &[]), "segment 1 on");

    // A clear from page 64 over three words: the first word is in the
    // unlogged segment 0 (ignored), the next two are segment 1's pages
    // 128..192 and 192..228 (pages 130, 200 and the last, 227).
    log.clear(64, &[u64::MAX, 1 << 2, 1 << 8 | 1 << 35])
        .unwrap();
    log.get(&mut bm).unwrap();
    assert_eq!(
        dirty(&bm),
        range(SEG, PAGES, &[130, 200, 227]),
        "segment 1 after a clear across both"
    );

    // Both on (segment 0 now reads dirty in full), then a clear inside
    // segment 0 only.
    log.set_logging(true).unwrap();
    log.clear(0, &[1 << 5, 1 << 63]).unwrap();
    log.get(&mut bm).unwrap();
    assert_eq!(
        dirty(&bm),
        range(0, PAGES, &[5, 127, 130, 200, 227]),
        "both segments on"
    );

    // Segment 0 off again: it reads clean, a clear there is ignored, and
    // segment 1 keeps its state.
    log.set_segment_logging(0, false).unwrap();
    log.clear(0, &[u64::MAX]).unwrap();
    log.get(&mut bm).unwrap();
    assert_eq!(
        dirty(&bm),
        range(SEG, PAGES, &[130, 200, 227]),
        "segment 0 off again"
    );
    // Out of the log's range: refused, nothing cleared.
    assert!(
        log.set_segment_logging(2, true).is_ok(),
        "no such segment: a no-op"
    );
    assert!(
        log.clear(32, &[1]).is_err(),
        "first page not a multiple of 64"
    );
    assert!(log.clear(256, &[1]).is_err(), "first page past the log");
    assert!(
        log.get(&mut bm[..3]).is_err(),
        "a bitmap shorter than the log"
    );
    log.set_logging(false).unwrap();
    log.get(&mut bm).unwrap();
    assert_eq!(dirty(&bm), Vec::<usize>::new(), "both off at the end");
    // A switch KVM refuses (a host address that is not page-aligned) is an
    // error, not a silent "logging on" that reads clean forever.
    let bad = KvmDirtyLog::switchable(
        vm.clone(),
        kvm_userspace_memory_region {
            slot: 9,
            flags: 0,
            guest_phys_addr: (1 << 30) as u64,
            memory_size: PAGE_SIZE as u64,
            userspace_addr: ram.addr as u64 + 1,
        },
    );
    assert!(!bad.starts_on());
    assert!(bad.set_logging(true).is_err(), "KVM refuses the memslot");
    drop(vm);
}

/// Manual protect without `INITIALLY_SET` (plain VMs): a memslot created
/// logged starts clean, a guest write (here: none) is what dirties it, and
/// clearing works (KVM refuses `KVM_CLEAR_DIRTY_LOG` unless manual protect
/// was enabled). A log made with `new` is on from the start and cannot be
/// switched (`set_logging` is a no-op).
#[test]
fn manual_protect_without_initially_set_starts_clean_and_clears() {
    if !tiering::host_support::require(&[HostFeature::Kvm]) {
        return;
    }
    let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
    const PAGES: usize = 100;
    let ram = Ram::new(PAGES);
    let kvm = Kvm::new().expect("KVM");
    let vm = Arc::new(kvm.create_vm().unwrap());
    vmm_core::kvm_dirty_log::enable_manual_dirty_log_protect(&vm).unwrap();
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: KVM_MEM_LOG_DIRTY_PAGES,
        guest_phys_addr: 0,
        memory_size: ram.len as u64,
        userspace_addr: ram.addr as u64,
    };
    // SAFETY: `ram` is a live anonymous mapping that outlives `vm` and the
    // logs' shares of it (declared before them all).
    unsafe { vm.set_user_memory_region(region).unwrap() };
    let log = KvmDirtyLog::new(vm.clone(), 0, PAGES);
    assert_eq!(log.pages(), PAGES);
    assert_eq!(log.segment_pages(), PAGES);
    assert!(log.starts_on(), "a plain log is on from the start");
    log.set_logging(false).unwrap();
    let mut bm = vec![u64::MAX; 2];
    log.get(&mut bm).unwrap();
    assert_eq!(
        bm,
        [0, 0],
        "no INITIALLY_SET: a new logged slot reads clean"
    );
    log.clear(64, &[1 << 35]).unwrap();
    log.clear(0, &[u64::MAX]).unwrap();
    // A memslot KVM does not have: both calls fail (not a silent success
    // that leaves the bitmap as it was, or re-arms nothing).
    let none = KvmDirtyLog::new(vm.clone(), 7, 64);
    let mut one = [u64::MAX; 1];
    assert!(none.get(&mut one).is_err(), "KVM_GET_DIRTY_LOG of slot 7");
    assert!(
        none.clear(0, &[1]).is_err(),
        "KVM_CLEAR_DIRTY_LOG of slot 7"
    );
    drop(vm);
}
