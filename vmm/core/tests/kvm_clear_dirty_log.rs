//! `KVM_CLEAR_DIRTY_LOG` on a real KVM memslot beyond its first bitmap
//! word: `KvmDirtyLog::clear(first_page, mask)` must re-arm exactly the
//! masked pages counted from `first_page`. A wrong `first_page` re-arms
//! other pages (a write to those is then missed by the next harvest: a
//! lost guest write) and leaves the masked ones dirty; only a two-minute
//! live test noticed it before, as "no migrations happened".
//!
//! Planted bug caught (issue 34): `first_page` passed to the kernel as 0.

use std::os::fd::AsRawFd;

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
    let vm = kvm.create_vm().unwrap();
    enable_manual_dirty_log_protect_initially_set(&vm).unwrap();
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: KVM_MEM_LOG_DIRTY_PAGES,
        guest_phys_addr: 0,
        memory_size: ram.len as u64,
        userspace_addr: ram.addr as u64,
    };
    // SAFETY: `ram` is a live anonymous mapping that outlives `vm` (declared
    // before it, so dropped after it).
    unsafe { vm.set_user_memory_region(region).unwrap() };
    let log = KvmDirtyLog::new(vm.as_raw_fd(), 0, pages);
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
