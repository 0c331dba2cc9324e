//! The ring-3 guest runtime: entry point, port I/O, serial console, status
//! page, barrier and exit. Linked into every guest image (feature `image`).
//!
//! Entry contract (set up by the VMM): 64-bit ring 3, identity-mapped RAM,
//! `rdi` = vCPU index, `rsi` = boot-info address, `rsp` = top of this vCPU's
//! stack, IOPL 3 (so `in`/`out` work), no IDT (any exception is a triple
//! fault the VMM reports as a crash).

use core::cell::Cell;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::abi::{self, BootInfo, Phase, StatusPage, MAX_ARGS, MAX_METRICS, MAX_VCPUS};
use crate::args::{Args, ImageSpec};
use crate::workloads::{Charge, Env};

mod emu;

/// Exit code the runtime uses when the boot info is not valid.
pub const EXIT_BAD_BOOT_INFO: u32 = 0xFFFF_FFF0;
/// Exit code the runtime uses after a panic in the workload.
pub const EXIT_PANIC: u32 = 0xFFFF_FFFE;

core::arch::global_asm!(
    ".section .text._start,\"ax\",@progbits",
    ".global _start",
    "_start:",
    "    mov dx, {booted}",
    "    out dx, al",
    "    and rsp, -16",
    "    call {main}",
    "    ud2",
    booted = const abi::PORT_BOOTED,
    main = sym rt_main,
);

/// Writes one byte to an I/O port.
#[inline]
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects; the VMM runs us with IOPL 3.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// Writes four bytes to an I/O port.
#[inline]
pub fn outl(port: u16, value: u32) {
    // SAFETY: as for `outb`.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads the time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc is allowed in ring 3 (CR4.TSD clear) and only reads.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Reads the time-stamp counter after every earlier instruction completed
/// (`lfence; rdtsc`): a payment's spin then starts only once the access it
/// pays for has finished, so the emulated latency adds to the real one
/// instead of overlapping it.
#[inline]
pub fn rdtsc_ordered() -> u64 {
    // SAFETY: lfence only orders execution; rdtsc is allowed in ring 3 and only reads.
    unsafe {
        core::arch::x86_64::_mm_lfence();
        core::arch::x86_64::_rdtsc()
    }
}

/// Ends this vCPU with `code`. Never returns.
pub fn exit(code: u32) -> ! {
    loop {
        outl(abi::PORT_EXIT, code);
        core::hint::spin_loop();
    }
}

/// The 16550 serial console (transmit only).
pub struct Serial;

impl Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            outb(abi::PORT_SERIAL, b);
        }
        Ok(())
    }
}

/// Prints to the serial console.
#[macro_export]
macro_rules! gprintln {
    ($($t:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($crate::rt::Serial, $($t)*);
    }};
}

static EXIT_SUM: AtomicU32 = AtomicU32::new(0);
static FINISHED: AtomicU32 = AtomicU32::new(0);
static BARRIER_COUNT: AtomicU32 = AtomicU32::new(0);
static BARRIER_GENERATION: AtomicU32 = AtomicU32::new(0);
static METRIC_LOCK: AtomicU64 = AtomicU64::new(0);

/// The guest side of [`Env`].
pub struct GuestEnv {
    vcpu: u32,
    boot: &'static BootInfo,
    status: *mut StatusPage,
    spec: &'static ImageSpec,
    /// Latency emulation, when the VMM published a region.
    emu: Option<emu::GuestEmulation>,
    /// Whether workload accesses are charged now: with emulation, except
    /// in the off phases of `ab=on` (the one test on every access).
    charging: Cell<bool>,
}

impl GuestEnv {
    fn slot(&self) -> *mut abi::VcpuStatus {
        let i = (self.vcpu as usize).min(MAX_VCPUS - 1);
        // SAFETY: `status` points at the VMM-provided status page (validated in
        // rt_main to lie inside RAM) and `i` is in bounds.
        unsafe { core::ptr::addr_of_mut!((*self.status).vcpus[i]) }
    }
}

impl Charge for GuestEnv {
    #[inline(always)]
    fn access(&self, addr: usize, write: bool) {
        if self.charging.get() {
            if let Some(e) = &self.emu {
                e.charger().access(addr as u64, write);
            }
        }
    }
    #[inline(always)]
    fn access_span(&self, addr: usize, lines: usize, write: bool) {
        if self.charging.get() {
            if let Some(e) = &self.emu {
                e.charger().access_span(addr as u64, lines as u64, write);
            }
        }
    }
    #[inline(always)]
    fn settle(&self) {
        if self.charging.get() {
            if let Some(e) = &self.emu {
                e.charger().settle();
            }
        }
    }
}

impl Env for GuestEnv {
    fn vcpu(&self) -> u32 {
        self.vcpu
    }
    fn vcpus(&self) -> u32 {
        self.boot.vcpu_count.clamp(1, MAX_VCPUS as u32)
    }
    fn seed(&self) -> u64 {
        self.boot.seed
    }
    fn args(&self) -> Args<'_> {
        let n = (self.boot.arg_count as usize).min(MAX_ARGS);
        Args::new(&self.boot.args[..n], Some(self.spec))
    }
    fn stop_requested(&self) -> bool {
        // SAFETY: reading a field of the status page, which the VMM writes concurrently: volatile.
        unsafe { core::ptr::addr_of!((*self.status).stop_request).read_volatile() != 0 }
    }
    fn set_ops(&self, ops: u64) {
        // SAFETY: our own slot of the status page.
        unsafe { core::ptr::addr_of_mut!((*self.slot()).ops).write_volatile(ops) }
        if let Some(e) = &self.emu {
            self.charging.set(e.sync(ops));
        }
    }
    fn set_phase(&self, phase: Phase) {
        // SAFETY: our own slot of the status page.
        unsafe { core::ptr::addr_of_mut!((*self.slot()).phase).write_volatile(phase as u64) }
    }
    fn cycles(&self) -> u64 {
        rdtsc()
    }
    fn tsc_khz(&self) -> u64 {
        self.boot.tsc_khz.max(1)
    }
    fn barrier(&self) {
        let n = self.vcpus();
        let generation = BARRIER_GENERATION.load(Ordering::Acquire);
        if BARRIER_COUNT.fetch_add(1, Ordering::AcqRel) + 1 == n {
            BARRIER_COUNT.store(0, Ordering::Relaxed);
            BARRIER_GENERATION.fetch_add(1, Ordering::Release);
        } else {
            while BARRIER_GENERATION.load(Ordering::Acquire) == generation {
                core::hint::spin_loop();
            }
        }
    }
    fn metric(&self, name: &str, value: f64) {
        let Some(fixed) = abi::to_fixed(name) else {
            return;
        };
        while METRIC_LOCK.swap(1, Ordering::Acquire) != 0 {
            core::hint::spin_loop();
        }
        // SAFETY: status page fields; the lock serialises writers among vCPUs.
        unsafe {
            let count = core::ptr::addr_of_mut!((*self.status).metric_count);
            let i = count.read_volatile() as usize;
            if i < MAX_METRICS {
                let m = core::ptr::addr_of_mut!((*self.status).metrics[i]);
                m.write_volatile(abi::Metric {
                    name: fixed,
                    value_bits: value.to_bits(),
                });
                count.write_volatile(i as u64 + 1);
            }
        }
        METRIC_LOCK.store(0, Ordering::Release);
    }
    fn log(&self, msg: &str) {
        gprintln!("[vcpu{}] {}", self.vcpu, msg);
    }
}

extern "Rust" {
    /// Defined by the image with [`image!`].
    fn __tiervm_workload(env: &GuestEnv, mem: &[AtomicU64]) -> u32;
    /// Defined by the image with [`image!`].
    fn __tiervm_spec() -> &'static ImageSpec;
}

extern "C" fn rt_main(vcpu: u64, boot: *const BootInfo) -> ! {
    if boot as u64 != abi::BOOT_INFO_GPA {
        exit(EXIT_BAD_BOOT_INFO);
    }
    // SAFETY: the VMM wrote a BootInfo at this fixed, mapped address before
    // starting any vCPU; it is never written again.
    let boot: &'static BootInfo = unsafe { &*boot };
    if boot.magic != abi::BOOT_MAGIC
        || boot.abi_version != abi::ABI_VERSION
        || boot.status_gpa != abi::STATUS_GPA
        || boot.heap_start > boot.heap_end
        || boot.heap_end > boot.ram_size
    {
        exit(EXIT_BAD_BOOT_INFO);
    }
    let env = GuestEnv {
        vcpu: vcpu as u32,
        boot,
        status: boot.status_gpa as *mut StatusPage,
        // SAFETY: provided by the image! macro in the same binary.
        spec: unsafe { __tiervm_spec() },
        emu: None,
        charging: Cell::new(false),
    };
    env.set_phase(Phase::Boot);
    let emu = emu::GuestEmulation::attach(boot, vcpu as u32);
    let env = GuestEnv {
        charging: Cell::new(emu.is_some()),
        emu,
        ..env
    };
    let words = ((boot.heap_end - boot.heap_start) / 8) as usize;
    // SAFETY: heap_start..heap_end is identity-mapped guest RAM reserved for
    // the workload (checked against ram_size above); AtomicU64 has no
    // invalid bit patterns and every vCPU accesses it only atomically.
    let mem = unsafe { core::slice::from_raw_parts(boot.heap_start as *const AtomicU64, words) };
    // SAFETY: provided by the image! macro in the same binary.
    let code = unsafe { __tiervm_workload(&env, mem) };
    if let Some(e) = &env.emu {
        e.charger().settle();
        e.publish();
        e.add_ab_halves();
    }
    let _ = EXIT_SUM.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
        Some(s.saturating_add(code))
    });
    FINISHED.fetch_add(1, Ordering::AcqRel);
    if env.vcpu != 0 {
        exit(code);
    }
    while FINISHED.load(Ordering::Acquire) < env.vcpus() {
        core::hint::spin_loop();
    }
    if let Some(m) = env.emu.as_ref().and_then(|e| e.ab_metrics()) {
        for (name, value) in m {
            env.metric(name, value);
        }
    }
    env.set_phase(Phase::Done);
    exit(EXIT_SUM.load(Ordering::Acquire))
}

/// Reports a panic on the console and exits with [`EXIT_PANIC`].
pub fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    gprintln!("guest panic: {}", info);
    exit(EXIT_PANIC)
}

/// Defines a guest image: `image!(workload_fn, &SPEC)`.
#[macro_export]
macro_rules! image {
    ($run:path, $spec:expr) => {
        #[no_mangle]
        fn __tiervm_workload(
            env: &$crate::rt::GuestEnv,
            mem: &[core::sync::atomic::AtomicU64],
        ) -> u32 {
            $run(env, mem)
        }
        #[no_mangle]
        fn __tiervm_spec() -> &'static $crate::args::ImageSpec {
            $spec
        }
        #[panic_handler]
        fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
            $crate::rt::panic(info)
        }
    };
}

/// The C memory primitives the compiler may call. The host target's
/// `compiler_builtins` leaves them to libc, which a guest image does not
/// link, so they are defined here with `rep movsb`/`rep stosb` (written in
/// assembly so the compiler cannot turn them back into calls to themselves).
pub mod mem {
    /// `memcpy(3)`.
    ///
    /// # Safety
    /// `dst` and `src` valid for `n` bytes and not overlapping.
    #[no_mangle]
    pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        // SAFETY: the caller guarantees both ranges are valid; DF is clear in our ABI.
        unsafe {
            core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _, options(nostack, preserves_flags));
        }
        dst
    }

    /// `memmove(3)`.
    ///
    /// # Safety
    /// `dst` and `src` valid for `n` bytes.
    #[no_mangle]
    pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
            // SAFETY: forward copy is correct when dst precedes src or they do not overlap.
            return unsafe { memcpy(dst, src, n) };
        }
        // SAFETY: backward copy with DF set, restored before returning; ranges valid per caller.
        unsafe {
            core::arch::asm!(
                "std", "rep movsb", "cld",
                inout("rcx") n => _,
                inout("rdi") dst.add(n - 1) => _,
                inout("rsi") src.add(n - 1) => _,
                options(nostack)
            );
        }
        dst
    }

    /// `memset(3)`.
    ///
    /// # Safety
    /// `dst` valid for `n` bytes.
    #[no_mangle]
    pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
        // SAFETY: the caller guarantees the range is valid.
        unsafe {
            core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8, options(nostack, preserves_flags));
        }
        dst
    }

    /// `memcmp(3)`.
    ///
    /// # Safety
    /// `a` and `b` valid for `n` bytes.
    #[no_mangle]
    pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        let mut i = 0;
        while i < n {
            // SAFETY: i < n and the caller guarantees n valid bytes.
            let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
            if x != y {
                return i32::from(x) - i32::from(y);
            }
            i += 1;
        }
        0
    }

    /// `bcmp(3)`.
    ///
    /// # Safety
    /// As for [`memcmp`].
    #[no_mangle]
    pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        // SAFETY: same contract.
        unsafe { memcmp(a, b, n) }
    }

    /// Referenced by the precompiled `core` even with `panic=abort`; never called.
    #[no_mangle]
    pub extern "C" fn rust_eh_personality() {}
}
