//! KVM implementation of `tiering::mem::DirtyLog` for one memslot, with
//! `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`: `KVM_GET_DIRTY_LOG` reads the bitmap
//! without clearing it and `KVM_CLEAR_DIRTY_LOG` re-arms (write-protects)
//! exactly the pages the harvester consumed.
//!
//! Order of setup (the lead wires it in `vmm`):
//! 1. [`enable_manual_dirty_log_protect`] on the VM, before the memslot exists;
//! 2. create the memslot over `TieredMemory::guest_ptr()/guest_len()` with
//!    `KVM_MEM_LOG_DIRTY_PAGES`;
//! 3. hand `Box::new(KvmDirtyLog::new(vm.clone(), slot, pages))` (`vm`: the
//!    VM's `Arc<VmFd>`) to `tiering::mem::Migrator::new`.
//!
//! The log holds a share of the VM fd (`Arc<VmFd>`), so the fd its ioctls
//! use is open for as long as the log exists, whatever order it drops in.
//!
//! Two ways to use it:
//! - [`KvmDirtyLog::new`]: the memslot is logged from its creation, without
//!   `KVM_DIRTY_LOG_INITIALLY_SET` (KVM write-protects the whole slot once
//!   and the bitmap starts clean: one write-protect fault per page on the
//!   guest's first write). Unit tests use this.
//! - [`KvmDirtyLog::switchable`] (tiered VMs): the memslot starts unlogged,
//!   so KVM maps guest RAM with huge pages, and the harvester switches
//!   logging on only while something is tracked. With
//!   `KVM_DIRTY_LOG_INITIALLY_SET` ([`enable_manual_dirty_log_protect_initially_set`])
//!   switching on costs no write-protection: every page reads dirty once
//!   (the harvester consumes that without counting writes) and only the
//!   pages it clears are protected.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_dirty_log, kvm_enable_cap, kvm_userspace_memory_region,
    KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, KVM_DIRTY_LOG_INITIALLY_SET,
    KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE, KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::VmFd;
use tiering::mem::DirtyLog;
use vmm_sys_util::{ioctl_iow_nr, ioctl_iowr_nr};

const KVMIO: u32 = 0xAE;
ioctl_iow_nr!(KVM_GET_DIRTY_LOG, KVMIO, 0x42, kvm_dirty_log);
ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);
ioctl_iow_nr!(
    KVM_SET_USER_MEMORY_REGION,
    KVMIO,
    0x46,
    kvm_userspace_memory_region
);

/// Enables `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` (manual protect, without
/// `INITIALLY_SET`). Call before creating the logged memslot.
pub fn enable_manual_dirty_log_protect(vm: &VmFd) -> io::Result<()> {
    let supported = vm.check_extension_raw(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 as u64);
    if supported & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE as i32 == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 is not supported by this kernel (needs Linux 5.8+); \
             transactional migration needs it to re-arm single pages",
        ));
    }
    let cap = kvm_enable_cap {
        cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
        args: [KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE as u64, 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap)
        .map_err(|e| io::Error::other(format!("KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2): {e}")))
}

/// Enables `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` with
/// `KVM_DIRTY_LOG_INITIALLY_SET`: switching logging on for a memslot
/// write-protects nothing and reports every page dirty once.
pub fn enable_manual_dirty_log_protect_initially_set(vm: &VmFd) -> io::Result<()> {
    let want = KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET;
    let supported = vm.check_extension_raw(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 as u64);
    if supported & want as i32 != want as i32 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with INITIALLY_SET is not supported by this \
                 kernel (it reports {supported:#x}; needs Linux 5.8+): transactional migration \
                 needs it"
            ),
        ));
    }
    let cap = kvm_enable_cap {
        cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
        args: [u64::from(want), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap).map_err(|e| {
        io::Error::other(format!(
            "KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2 | INITIALLY_SET): {e}"
        ))
    })
}

/// The dirty log of guest RAM over one or more KVM memslots (segments).
#[derive(Debug)]
pub struct KvmDirtyLog {
    /// A share of the VM fd: it stays open while this log exists.
    vm: Arc<VmFd>,
    slots: Vec<SlotLog>,
    pages: usize,
    /// Whether logging is switched (false: every slot logged from creation).
    switchable: bool,
}

/// One memslot of the log.
#[derive(Debug)]
struct SlotLog {
    /// The memslot as registered (its flags are what logging switches).
    region: kvm_userspace_memory_region,
    /// Its first page in the log.
    first_page: usize,
    pages: usize,
    /// Whether `KVM_MEM_LOG_DIRTY_PAGES` is set now.
    on: AtomicBool,
}

impl KvmDirtyLog {
    /// A dirty log of `pages` 4 KiB pages of memslot `slot` of `vm`, created
    /// with `KVM_MEM_LOG_DIRTY_PAGES`. The log keeps its share of `vm`.
    pub fn new(vm: Arc<VmFd>, slot: u32, pages: usize) -> Self {
        let region = kvm_userspace_memory_region {
            slot,
            flags: KVM_MEM_LOG_DIRTY_PAGES,
            memory_size: (pages * tiering::mem::PAGE_SIZE) as u64,
            ..Default::default()
        };
        Self {
            vm,
            slots: vec![SlotLog {
                region,
                first_page: 0,
                pages,
                on: AtomicBool::new(true),
            }],
            pages,
            switchable: false,
        }
    }

    /// A dirty log whose logging the harvester switches on and off by
    /// re-registering `region` (the memslot exactly as it was created,
    /// without `KVM_MEM_LOG_DIRTY_PAGES`) with only its flags changed.
    pub fn switchable(vm: Arc<VmFd>, region: kvm_userspace_memory_region) -> Self {
        Self::segmented(vm, vec![region])
    }

    /// A dirty log over consecutive memslots `regions` (guest RAM split in
    /// segments, each registered without `KVM_MEM_LOG_DIRTY_PAGES`), whose
    /// logging the harvester switches per segment: KVM maps a logged slot
    /// with 4 KiB pages only, so the segments where nothing is tracked keep
    /// their huge-page mappings. Every region but the last must hold a
    /// multiple of 64 pages (the bitmap's words). The log keeps its share of
    /// `vm`.
    pub fn segmented(vm: Arc<VmFd>, regions: Vec<kvm_userspace_memory_region>) -> Self {
        let mut first_page = 0;
        let slots = regions
            .into_iter()
            .map(|region| {
                let pages = (region.memory_size / tiering::mem::PAGE_SIZE as u64) as usize;
                let s = SlotLog {
                    region,
                    first_page,
                    pages,
                    on: AtomicBool::new(false),
                };
                first_page += pages;
                s
            })
            .collect();
        Self {
            vm,
            slots,
            pages: first_page,
            switchable: true,
        }
    }

    /// `KVM_GET_DIRTY_LOG` of one slot into `bitmap` (its own words).
    fn get_slot(&self, s: &SlotLog, bitmap: &mut [u64]) -> io::Result<()> {
        let mut log = kvm_dirty_log {
            slot: s.region.slot,
            ..Default::default()
        };
        log.__bindgen_anon_1.dirty_bitmap = bitmap.as_mut_ptr().cast();
        // SAFETY: the fd is open: `self.vm` is this log's own share of the VM fd. `log`
        // points at `bitmap`, which holds at least one bit per page of the slot (the
        // caller passes the slot's words); the kernel writes at most that many bits.
        let r = unsafe { libc::ioctl(self.vm.as_raw_fd(), KVM_GET_DIRTY_LOG() as _, &log) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("KVM_GET_DIRTY_LOG(slot {}): {e} (was the memslot created with KVM_MEM_LOG_DIRTY_PAGES?)", s.region.slot),
            ));
        }
        Ok(())
    }

    /// `KVM_CLEAR_DIRTY_LOG` of `mask` from `first` (slot-relative, a
    /// multiple of 64) in one slot.
    fn clear_slot(&self, s: &SlotLog, first: usize, mask: &[u64]) -> io::Result<()> {
        // num_pages must be a multiple of 64 unless the range ends at the slot's end.
        let num_pages = (mask.len() * 64).min(s.pages - first);
        if num_pages == 0 {
            return Ok(());
        }
        let mut clear = kvm_clear_dirty_log {
            slot: s.region.slot,
            num_pages: num_pages as u32,
            first_page: first as u64,
            ..Default::default()
        };
        clear.__bindgen_anon_1.dirty_bitmap = mask.as_ptr() as *mut _;
        // SAFETY: the fd is open: `self.vm` is this log's own share of the VM fd. `clear`
        // points at `mask`, which holds at least `num_pages` bits; the kernel only reads it.
        let r = unsafe { libc::ioctl(self.vm.as_raw_fd(), KVM_CLEAR_DIRTY_LOG() as _, &clear) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "KVM_CLEAR_DIRTY_LOG(slot {}, pages {first}+{num_pages}): {e} \
                     (is KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 enabled?)",
                    s.region.slot
                ),
            ));
        }
        Ok(())
    }
}

impl DirtyLog for KvmDirtyLog {
    fn pages(&self) -> usize {
        self.pages
    }

    fn get(&self, bitmap: &mut [u64]) -> io::Result<()> {
        if bitmap.len() < self.pages.div_ceil(64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "dirty bitmap buffer shorter than the memslot",
            ));
        }
        for s in &self.slots {
            let words = &mut bitmap[s.first_page / 64..(s.first_page + s.pages).div_ceil(64)];
            if s.on.load(Ordering::Acquire) {
                self.get_slot(s, words)?;
            } else {
                // An unlogged slot reads clean.
                words.iter_mut().for_each(|w| *w = 0);
            }
        }
        Ok(())
    }

    fn clear(&self, first_page: usize, mask: &[u64]) -> io::Result<()> {
        if !first_page.is_multiple_of(64) || first_page >= self.pages {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("KVM_CLEAR_DIRTY_LOG: first page {first_page} must be a multiple of 64 inside the slot"),
            ));
        }
        let end = (first_page + mask.len() * 64).min(self.pages);
        for s in &self.slots {
            let (lo, hi) = (
                s.first_page.max(first_page),
                (s.first_page + s.pages).min(end),
            );
            if lo >= hi || !s.on.load(Ordering::Acquire) {
                // Not in this slot, or the slot is unlogged (nothing to re-arm).
                continue;
            }
            let words = &mask[(lo - first_page) / 64..(hi - first_page).div_ceil(64)];
            self.clear_slot(s, lo - s.first_page, words)?;
        }
        Ok(())
    }

    fn starts_on(&self) -> bool {
        !self.switchable
    }

    fn segment_pages(&self) -> usize {
        self.slots.first().map_or(self.pages, |s| s.pages)
    }

    fn set_logging(&self, on: bool) -> io::Result<()> {
        for seg in 0..self.slots.len() {
            self.set_segment_logging(seg, on)?;
        }
        Ok(())
    }

    fn set_segment_logging(&self, seg: usize, on: bool) -> io::Result<()> {
        let Some(s) = self.slots.get(seg).filter(|_| self.switchable) else {
            return Ok(());
        };
        let mut region = s.region;
        region.flags = if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 };
        // SAFETY: the fd is open: `self.vm` is this log's own share of the VM fd. `region`
        // is the memslot exactly as it was registered (same slot, guest address, size and
        // host mapping); only its flags change, which KVM_SET_USER_MEMORY_REGION allows on
        // a live slot, so the mapping KVM reaches is the one it already reached, kept
        // mapped past every share of the VM fd by whoever registered it (`vstate::Vm`:
        // the RAM is its last field, after the tiered RAM whose migrator owns this log).
        // The kernel only reads `region`.
        let r = unsafe {
            libc::ioctl(
                self.vm.as_raw_fd(),
                KVM_SET_USER_MEMORY_REGION() as _,
                &region,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "switching dirty logging {} on memslot {}: {e}",
                    if on { "on" } else { "off" },
                    s.region.slot
                ),
            ));
        }
        s.on.store(on, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
    use kvm_ioctls::{Kvm, VcpuExit};
    use std::sync::Arc;
    use tiering::host_support::HostFeature;
    use tiering::mem::{MemConfig, TieredMemory, PAGE_SIZE};

    /// Puts a fresh vCPU at the real-mode test program at 0x1000 (flat segments).
    fn enter_real_mode(vcpu: &mut kvm_ioctls::VcpuFd) {
        let mut sregs = vcpu.get_sregs().unwrap();
        sregs.cs.base = 0;
        sregs.cs.selector = 0;
        sregs.ds.base = 0;
        sregs.ds.selector = 0;
        vcpu.set_sregs(&sregs).unwrap();
        let mut regs = vcpu.get_regs().unwrap();
        regs.rip = 0x1000;
        regs.rflags = 2;
        vcpu.set_regs(&regs).unwrap();
    }

    /// Runs the test program from its start until it halts.
    /// Copies `code` to guest address 0x1000 and maps `mem`'s guest RAM as
    /// memslot 0 of `vm` with `flags`.
    fn install(vm: &kvm_ioctls::VmFd, mem: &TieredMemory, code: &[u8], flags: u32) {
        assert!(
            0x1000 + code.len() <= mem.guest_len(),
            "code fits in guest RAM"
        );
        // Commit every page now (lazy commit would otherwise need a fault
        // handler for this write, and the tests want every page placed).
        mem.prefault(0, mem.guest_pages()).unwrap();
        // SAFETY: the destination lies inside guest RAM (asserted above), which
        // `mem` keeps mapped; `code` is a separate slice.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), mem.guest_ptr().add(0x1000), code.len())
        };
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags,
            guest_phys_addr: 0,
            memory_size: mem.guest_len() as u64,
            userspace_addr: mem.guest_ptr() as u64,
        };
        // SAFETY: the region is the caller's live guest RAM mapping; every caller
        // keeps `mem` alive until after the VM is dropped.
        unsafe { vm.set_user_memory_region(region).unwrap() };
    }

    fn run_until_hlt(vcpu: &mut kvm_ioctls::VcpuFd) {
        enter_real_mode(vcpu);
        loop {
            match vcpu.run().unwrap() {
                VcpuExit::Hlt => break,
                VcpuExit::Shutdown | VcpuExit::FailEntry(..) | VcpuExit::InternalError => {
                    panic!("guest failed")
                }
                _ => {}
            }
        }
    }

    /// A real-mode guest on tiered memory writes one byte to page 5; the KVM
    /// dirty log shows page 5 (and not the code page it only read), a CLEAR
    /// re-arms it, and a second run dirties it again.
    #[test]
    fn kvm_dirty_log_reports_guest_writes_and_clear_rearms() {
        if !tiering::host_support::require(&[HostFeature::Kvm, HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
        let kvm = Kvm::new().expect("KVM");
        // `mem` first: it drops after `vm` (and the log's share of it).
        let mem = Arc::new(
            TieredMemory::new(&MemConfig::new(64 * PAGE_SIZE, 32)).expect("tiered memory"),
        );
        let vm = Arc::new(kvm.create_vm().unwrap());
        enable_manual_dirty_log_protect(&vm).unwrap();
        // Code at 0x1000: mov byte [0x5000], 1 ; hlt
        let code = [0xc6u8, 0x06, 0x00, 0x50, 0x01, 0xf4];
        install(&vm, &mem, &code, KVM_MEM_LOG_DIRTY_PAGES);
        let log = KvmDirtyLog::new(vm.clone(), 0, mem.guest_pages());
        let mut bm = vec![0u64; 1];
        log.get(&mut bm).unwrap();
        assert_eq!(bm[0], 0, "no INITIALLY_SET: the log starts clean");
        let mut vcpu = vm.create_vcpu(0).unwrap();
        run_until_hlt(&mut vcpu);
        // SAFETY: 0x5000 lies inside guest RAM.
        assert_eq!(unsafe { *mem.guest_ptr().add(0x5000) }, 1);
        log.get(&mut bm).unwrap();
        assert_eq!(
            bm[0] & (1 << 5),
            1 << 5,
            "the written page is dirty: {:#x}",
            bm[0]
        );
        log.get(&mut bm).unwrap();
        assert_ne!(bm[0] & (1 << 5), 0, "GET does not clear");
        log.clear(0, &[1 << 5]).unwrap();
        log.get(&mut bm).unwrap();
        assert_eq!(bm[0] & (1 << 5), 0, "CLEAR re-arms the page");
        run_until_hlt(&mut vcpu);
        log.get(&mut bm).unwrap();
        assert_ne!(
            bm[0] & (1 << 5),
            0,
            "a re-armed page is logged again on the next write"
        );
        assert!(log.clear(3, &[1]).is_err());
    }

    /// A VM whose real-mode guest adds 1 to the counter at 0x5000 and then
    /// exits to the VMM (port 0x10) each time it runs: the test decides
    /// exactly when every guest write happens. Tiered RAM of 64 pages, 32
    /// fast, all starting slow, with slow headroom for shadows; the
    /// migrator uses KVM's dirty log. `mem` is the last field, so guest RAM
    /// stays mapped until every share of the VM fd (`_vm`, the log's in
    /// `migrator`) and the vCPU fd are closed.
    struct SteppedGuest {
        migrator: Arc<tiering::mem::Migrator>,
        vcpu: Arc<std::sync::Mutex<kvm_ioctls::VcpuFd>>,
        faults: Option<tiering::mem::FaultHandler>,
        writes: Arc<std::sync::atomic::AtomicU32>,
        _vm: Arc<kvm_ioctls::VmFd>,
        mem: Arc<TieredMemory>,
    }

    impl SteppedGuest {
        fn new(skip_dirty_check: bool) -> Self {
            use tiering::mem::{FaultHandler, InitialPlacement, Migrator, MigratorConfig};
            let kvm = Kvm::new().expect("KVM");
            let vm = Arc::new(kvm.create_vm().unwrap());
            enable_manual_dirty_log_protect(&vm).unwrap();
            let mut cfg = MemConfig::two_tier(64 * PAGE_SIZE, 32, 64 + 16, 0, 0);
            cfg.placement = InitialPlacement::SlowFirst;
            let mem = Arc::new(TieredMemory::new(&cfg).expect("tiered memory"));
            // l: inc dword [0x5000] ; out 0x10, al ; jmp l
            let code = [0x66u8, 0xff, 0x06, 0x00, 0x50, 0xe6, 0x10, 0xeb, 0xf7];
            install(&vm, &mem, &code, KVM_MEM_LOG_DIRTY_PAGES);
            let log = KvmDirtyLog::new(vm.clone(), 0, mem.guest_pages());
            let m = Migrator::new(mem.clone(), Box::new(log), MigratorConfig::default()).unwrap();
            m.set_skip_dirty_check(skip_dirty_check);
            let faults = FaultHandler::spawn(mem.clone()).unwrap();
            let mut vcpu = vm.create_vcpu(0).unwrap();
            enter_real_mode(&mut vcpu);
            Self {
                mem,
                migrator: Arc::new(m),
                vcpu: Arc::new(std::sync::Mutex::new(vcpu)),
                faults: Some(faults),
                writes: Arc::new(std::sync::atomic::AtomicU32::new(0)),
                _vm: vm,
            }
        }

        /// Lets the guest write once (one increment, then its port exit).
        fn step(
            vcpu: &std::sync::Mutex<kvm_ioctls::VcpuFd>,
            writes: &std::sync::atomic::AtomicU32,
        ) {
            let mut v = vcpu.lock().unwrap();
            loop {
                match v.run().expect("KVM_RUN") {
                    VcpuExit::IoOut(0x10, _) => break,
                    VcpuExit::Shutdown | VcpuExit::FailEntry(..) | VcpuExit::InternalError => {
                        panic!("guest failed")
                    }
                    _ => {}
                }
            }
            writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }

        fn write_now(&self) {
            Self::step(&self.vcpu, &self.writes);
        }

        /// Migrates page 5 with `mech`; with `write_in_window`, the guest
        /// writes once between the copy and the unmap of the first TPM
        /// transaction (the write a dirty check must catch).
        fn migrate(&self, promote: bool, mech: tiering::mem::Mechanism, write_in_window: bool) {
            use tiering::mem::Unit;
            let go = || {
                if promote {
                    self.migrator.promote(&[Unit::page(5)], mech).unwrap()
                } else {
                    self.migrator.demote(&[Unit::page(5)], mech).unwrap()
                }
            };
            if !write_in_window {
                go();
                return;
            }
            let (vcpu, writes) = (self.vcpu.clone(), self.writes.clone());
            let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let f = fired.clone();
            tiering::test_point::with_action(
                move |point| {
                    if point == tiering::test_point::TestPoint::TpmCopied
                        && !f.swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        Self::step(&vcpu, &writes);
                    }
                },
                go,
            );
            assert!(
                fired.load(std::sync::atomic::Ordering::SeqCst),
                "the TPM copy-window test point never fired (tiering::test_point::TestPoint::TpmCopied)"
            );
        }

        fn counter(&self) -> u32 {
            // SAFETY: 0x5000 lies inside guest RAM; the guest runs only
            // inside step(), never concurrently with this read.
            unsafe { (self.mem.guest_ptr().add(0x5000) as *const u32).read_volatile() }
        }

        fn finish(mut self) -> tiering::mem::MemStats {
            if let Some(f) = self.faults.take() {
                f.stop().unwrap();
            }
            self.mem.check_consistency().unwrap();
            self.mem.stats()
        }
    }

    const ROUNDS: u32 = 20;

    /// Each round: the guest writes, page 5 is promoted with TPM while the
    /// guest writes once inside the copy window, the guest writes again,
    /// page 5 is demoted by stop-and-copy. Returns (counter, writes, stats).
    fn tpm_with_a_write_in_every_copy_window(
        skip_dirty_check: bool,
    ) -> (u32, u32, tiering::mem::MemStats) {
        use tiering::mem::Mechanism;
        let g = SteppedGuest::new(skip_dirty_check);
        for _ in 0..ROUNDS {
            g.write_now();
            g.migrate(true, Mechanism::TPM, true);
            g.write_now();
            g.migrate(false, Mechanism::StopAndCopy, false);
            g.migrator.harvest().unwrap();
        }
        let (v, w) = (
            g.counter(),
            g.writes.load(std::sync::atomic::Ordering::SeqCst),
        );
        (v, w, g.finish())
    }

    /// With the KVM dirty check, a guest write between the copy and the
    /// unmap aborts the transaction: no write is lost, every window write
    /// aborted one.
    #[test]
    fn tpm_with_kvm_dirty_log_loses_no_guest_write() {
        if !tiering::host_support::require(&[HostFeature::Kvm, HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
        let (v, writes, st) = tpm_with_a_write_in_every_copy_window(false);
        assert_eq!(writes, 3 * ROUNDS);
        assert_eq!(v, writes, "lost guest writes: {st:?}");
        assert_eq!(st.migration.tpm_aborts, u64::from(ROUNDS), "{st:?}");
    }

    /// The negative control: without the dirty check exactly the writes
    /// made inside the copy windows are lost (one per round), every run.
    #[test]
    fn tpm_without_the_dirty_check_loses_guest_writes() {
        if !tiering::host_support::require(&[HostFeature::Kvm, HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
        let (v, writes, st) = tpm_with_a_write_in_every_copy_window(true);
        assert_eq!(writes, 3 * ROUNDS);
        assert_eq!(v, 2 * ROUNDS, "exactly the window writes are lost: {st:?}");
        assert_eq!(st.migration.tpm_commits, u64::from(ROUNDS), "{st:?}");
    }

    /// Shadow demotion on real KVM: a page promoted with TPM keeps its slow
    /// copy; demoted while clean, the shadow is remapped (no copy); written
    /// after promotion, the shadow is dropped and the demotion copies, so
    /// the write survives.
    #[test]
    fn tpm_shadow_demotion_with_kvm_dirty_log() {
        use tiering::mem::Mechanism;
        if !tiering::host_support::require(&[HostFeature::Kvm, HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
        let g = SteppedGuest::new(false);
        g.write_now();
        // Clean shadow: promote, no write, demote by remapping the shadow.
        g.migrate(true, Mechanism::TPM, false);
        g.migrator.harvest().unwrap();
        let before = g.mem.stats();
        assert_eq!(before.migration.promotions, 1, "{before:?}");
        assert!(
            before.migration.shadow_pages > 0 || before.tiers[1].shadow_pages > 0,
            "{before:?}"
        );
        g.migrate(false, Mechanism::TPM, false);
        let clean = g.mem.stats();
        assert_eq!(
            clean.migration.shadow_demotions, 1,
            "clean page demoted by remap: {clean:?}"
        );
        assert_eq!(g.counter(), 1);
        // Stale shadow: promote, the guest writes, the harvest sees it.
        g.migrate(true, Mechanism::TPM, false);
        g.write_now();
        g.migrator.harvest().unwrap();
        let dirty = g.mem.stats();
        assert_eq!(
            dirty.migration.shadow_invalidations,
            clean.migration.shadow_invalidations + 1,
            "{dirty:?}"
        );
        g.migrate(false, Mechanism::TPM, false);
        assert_eq!(
            g.counter(),
            2,
            "the write after promotion survived the demotion"
        );
        let st = g.finish();
        assert_eq!(
            st.migration.shadow_demotions, 1,
            "the stale shadow was not remapped: {st:?}"
        );
        assert_eq!(st.migration.demotions, 2, "{st:?}");
    }

    /// Hint-fault sampling on a live guest: parked pages are touched by KVM
    /// (kernel-mode faults), the fault handler records samples for exactly
    /// the pages the guest uses (code page 1, data page 5) and unparks them.
    #[test]
    fn hint_faults_from_a_live_guest_are_sampled() {
        use tiering::mem::{FaultHandler, HintSampler, SamplerConfig};
        if !tiering::host_support::require(&[HostFeature::Kvm, HostFeature::UserfaultfdMove]) {
            return;
        }
        let _bound = tiering::host_support::watchdog(std::time::Duration::from_secs(60));
        let kvm = Kvm::new().expect("KVM");
        // `mem` first: it drops after `vm`.
        let mem = Arc::new(
            TieredMemory::new(&MemConfig::new(64 * PAGE_SIZE, 32)).expect("tiered memory"),
        );
        let vm = kvm.create_vm().unwrap();
        // mov ecx, 3000 ; l: mov eax, [0x5000] ; dec ecx ; jnz l ; hlt
        let code = [
            0x66u8, 0xb9, 0xb8, 0x0b, 0x00, 0x00, 0x66, 0xa1, 0x00, 0x50, 0x66, 0x49, 0x75, 0xf8,
            0xf4,
        ];
        install(&vm, &mem, &code, 0);
        let faults = FaultHandler::spawn(mem.clone()).unwrap();
        let mut sampler = HintSampler::new(
            mem.clone(),
            SamplerConfig {
                scan_pages: 8,
                min_scan_pages: 8,
                max_scan_pages: 8,
                budget_pct: 100.0,
                ..SamplerConfig::default()
            },
        );
        // Park pages 0..8 before the guest starts: its first fetch faults.
        assert_eq!(sampler.tick().unwrap().parked, 8);
        let mut vcpu = vm.create_vcpu(0).unwrap();
        run_until_hlt(&mut vcpu);
        let tick = sampler.tick().unwrap();
        sampler.unpark_all().unwrap();
        faults.stop().unwrap();
        let mut pages: Vec<u64> = mem.drain_samples().iter().map(|s| s.page).collect();
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages, vec![1, 5], "pages the guest touched");
        assert_eq!(tick.untouched, 6);
        let st = mem.stats();
        assert!(st.hint_faults >= 2, "{st:?}");
        assert_eq!(st.migration.unexpected_faults, 0);
        mem.check_consistency().unwrap();
    }
}
