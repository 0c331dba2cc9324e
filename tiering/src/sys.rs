//! The one audited place for the raw system calls and ioctls of the tiering
//! crate: userfaultfd (open, API, REGISTER, MOVE, ZEROPAGE, WAKE), `mmap`,
//! `madvise`, `mbind`, `move_pages`, `mincore`, `PAGEMAP_SCAN`, and the
//! zeroed allocation of atomic arrays. Everything else in the crate is safe
//! code on top of these wrappers.
//!
//! The Debian kernel headers on the build machines are older than
//! `UFFDIO_MOVE` (Linux 6.8) and `PAGEMAP_SCAN` (6.7), so their structures and
//! ioctl numbers are defined here by hand and checked against their known
//! values at compile time.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::vocab::{HUGE_PAGE_SIZE, PAGE_SIZE};

const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)` (generic layout: x86_64, aarch64, riscv64).
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}

const UFFDIO: u32 = 0xAA;
/// `UFFD_API`: the only userfaultfd API version.
const UFFD_API: u64 = 0xAA;

/// `UFFD_FEATURE_THREAD_ID`: the fault message carries the faulting thread id.
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
/// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` is available (Linux 6.8+).
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFDIO_REGISTER_MODE_WP: u64 = 2;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
/// Flags of every userfaultfd tiervm creates: NOT `UFFD_USER_MODE_ONLY`, so
/// that kernel-mode faults (KVM's get_user_pages on guest RAM) arrive too.
const UFFD_FLAGS: libc::c_int = libc::O_CLOEXEC | libc::O_NONBLOCK;
/// Where the userfaultfd device lives.
pub const DEV_USERFAULTFD: &str = "/dev/userfaultfd";

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

/// `struct uffd_msg` (32 bytes); only the page fault variant is decoded.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    ptid: u32,
    pad: u32,
}

const UFFDIO_API: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x3F,
    std::mem::size_of::<UffdioApi>(),
);
const UFFDIO_REGISTER: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x00,
    std::mem::size_of::<UffdioRegister>(),
);
const UFFDIO_WAKE: u32 = ioc(IOC_READ, UFFDIO, 0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_ZEROPAGE: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x04,
    std::mem::size_of::<UffdioZeropage>(),
);
const UFFDIO_MOVE: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x05,
    std::mem::size_of::<UffdioMove>(),
);
/// `USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00)`, on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: u32 = ioc(IOC_NONE, UFFDIO, 0x00, 0);

// The numbers the kernel headers define (checked against linux/userfaultfd.h).
const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
const _: () = assert!(UFFDIO_WAKE == 0x8010_aa02);
const _: () = assert!(UFFDIO_ZEROPAGE == 0xc020_aa04);
const _: () = assert!(UFFDIO_MOVE == 0xc028_aa05);
const _: () = assert!(USERFAULTFD_IOC_NEW == 0xaa00);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// How a userfaultfd was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdSource {
    /// The `userfaultfd(2)` system call.
    Syscall,
    /// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`.
    Device,
}

/// `userfaultfd(O_CLOEXEC | O_NONBLOCK)`.
pub fn userfaultfd_syscall() -> io::Result<OwnedFd> {
    // SAFETY: the userfaultfd syscall takes one int flags argument and
    // touches no user memory.
    let ret = unsafe { libc::syscall(libc::SYS_userfaultfd, UFFD_FLAGS) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(ret)
        .map_err(|_| io::Error::other(format!("userfaultfd returned fd {ret}")))?;
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `/dev/userfaultfd` and asks it for a new userfaultfd.
pub fn userfaultfd_from_device() -> io::Result<OwnedFd> {
    // The device fd is closed when `dev` drops; the new uffd is independent.
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEV_USERFAULTFD)?;
    // SAFETY: USERFAULTFD_IOC_NEW takes an int flags argument by value and
    // touches no user memory; `dev` is a valid open fd for the call's duration.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, UFFD_FLAGS) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Features and ioctls words from `UFFDIO_API`.
#[derive(Debug, Clone, Copy)]
pub struct UffdApi {
    /// Supported (or granted) feature bits.
    pub features: u64,
    /// Supported ioctl bits.
    pub ioctls: u64,
}

/// `UFFDIO_API` asking for `features` (0: the kernel answers with every
/// feature it supports). Can be done once per fd.
pub fn uffdio_api(fd: &OwnedFd, features: u64) -> io::Result<UffdApi> {
    let mut api = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: `api` is a properly sized, initialized `struct uffdio_api`
    // that lives across the call; the kernel reads and writes only it.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UffdApi {
        features: api.features,
        ioctls: api.ioctls,
    })
}

/// `sysconf(_SC_PAGESIZE)`, 4096 if sysconf fails.
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant and has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// One page fault read from the userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// Faulting address (page aligned by the kernel unless EXACT_ADDRESS).
    pub address: u64,
    /// Faulting thread id (0 when the kernel did not report it).
    pub thread_id: u32,
    /// Whether the access was a write.
    pub write: bool,
}

/// How a range is registered with the userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterMode {
    /// Faults on missing pages are delivered to the handler (guest RAM and
    /// the areas guest pages move through).
    Missing,
    /// Write-protect mode only: missing pages are allocated by the kernel as
    /// usual (the tier pools, which are populated on demand), and the range
    /// can be a `UFFDIO_MOVE` destination.
    WriteProtect,
}

/// A userfaultfd handle with `UFFD_FEATURE_MOVE | UFFD_FEATURE_THREAD_ID`.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    inject: Arc<Injector>,
}

impl Uffd {
    /// Creates the userfaultfd (syscall first, `/dev/userfaultfd` as the
    /// fallback) and negotiates `UFFD_FEATURE_MOVE | UFFD_FEATURE_THREAD_ID`.
    pub fn new(inject: Arc<Injector>) -> io::Result<Self> {
        let fd = match userfaultfd_syscall() {
            Ok(fd) => fd,
            Err(sys_err) => userfaultfd_from_device().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "userfaultfd: the syscall failed ({sys_err}) and {DEV_USERFAULTFD} could \
                         not be used ({e}); give this user read/write access to \
                         {DEV_USERFAULTFD} (e.g. a group that owns it), or run as root"
                    ),
                )
            })?,
        };
        uffdio_api(&fd, UFFD_FEATURE_MOVE | UFFD_FEATURE_THREAD_ID).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("UFFDIO_API with UFFD_FEATURE_MOVE: {e} (needs Linux 6.8 or newer)"),
            )
        })?;
        Ok(Self { fd, inject })
    }

    /// Raw fd, for polling.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start+len)` in `mode`.
    pub fn register(&self, start: usize, len: usize, mode: RegisterMode) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: match mode {
                RegisterMode::Missing => UFFDIO_REGISTER_MODE_MISSING,
                RegisterMode::WriteProtect => UFFDIO_REGISTER_MODE_WP,
            },
            ioctls: 0,
        };
        // SAFETY: `reg` is a valid uffdio_register; the kernel validates the range.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER as _, &mut reg) };
        if r < 0 {
            return Err(last_err(&format!("UFFDIO_REGISTER ({mode:?})")));
        }
        Ok(())
    }

    /// Moves `len` bytes of present anonymous pages from `src` to the hole at
    /// `dst` (zero copy; a 2 MiB aligned run of a PMD-mapped huge page moves
    /// as one huge page when the destination's page table is empty),
    /// retrying partial moves. Wakes threads waiting on the destination
    /// unless `wake` is false. On failure the error says how far it got: the
    /// first `moved` bytes did move.
    pub fn move_range(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
    ) -> Result<(), MoveError> {
        if let Some(errno) = self.inject.check(FaultPoint::Move) {
            return Err(MoveError {
                dst,
                src,
                len,
                moved: 0,
                errno,
            });
        }
        let mut done = 0usize;
        // Consecutive EAGAIN / EINTR answers without progress.
        let mut stalled = 0u32;
        while done < len {
            let mut mv = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode: if wake { 0 } else { UFFDIO_MOVE_MODE_DONTWAKE },
                moved: 0,
            };
            // SAFETY: `mv` is a valid uffdio_move; the kernel checks that both ranges are
            // anonymous memory (the destination registered with this uffd) and only remaps
            // page table entries; no memory of this process changes meaning for Rust code.
            let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_MOVE as _, &mut mv) };
            if r == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if mv.moved > 0 {
                done += mv.moved as usize;
                stalled = 0;
                continue;
            }
            let transient = matches!(err.raw_os_error(), Some(libc::EAGAIN | libc::EINTR));
            if transient && stalled < MOVE_TRANSIENT_RETRIES {
                // Bounded: a range that stays busy is the caller's error to
                // handle, not a spin for ever.
                stalled += 1;
                std::thread::yield_now();
                continue;
            }
            return Err(MoveError {
                dst,
                src,
                len,
                moved: done,
                errno: err.raw_os_error().unwrap_or(0),
            });
        }
        Ok(())
    }

    /// Maps the shared zero page at the hole `[dst, dst+len)` (used only to
    /// release a faulting thread when no memory can be committed: reads see
    /// zeros, a write allocates through the kernel).
    pub fn zero_page(&self, dst: usize, len: usize) -> io::Result<()> {
        self.inject.io(FaultPoint::ZeroPage)?;
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: dst as u64,
                len: len as u64,
            },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `z` is a valid uffdio_zeropage; the kernel maps the zero page into holes
        // of our registered range only.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_ZEROPAGE as _, &mut z) };
        if r < 0 {
            return Err(last_err("UFFDIO_ZEROPAGE"));
        }
        Ok(())
    }

    /// Wakes threads waiting on faults in `[start, start+len)`.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: `range` is a valid uffdio_range for the duration of the call.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WAKE as _, &mut range) };
        if r < 0 {
            return Err(last_err("UFFDIO_WAKE"));
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` for the uffd or `extra_fd` to become readable.
    /// Returns (uffd readable, extra readable).
    pub fn poll2(&self, extra_fd: RawFd, timeout_ms: i32) -> io::Result<(bool, bool)> {
        let mut fds = [
            libc::pollfd {
                fd: self.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: extra_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd structures.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok((false, false));
            }
            return Err(e);
        }
        Ok((fds[0].revents != 0, fds[1].revents != 0))
    }

    /// Reads pending page-fault events without blocking (the fd is non-blocking).
    pub fn read_events(&self, out: &mut Vec<FaultEvent>) -> io::Result<()> {
        let mut msgs = [UffdMsg::default(); 16];
        loop {
            // SAFETY: `msgs` is a writable buffer of exactly the length passed.
            let n = unsafe {
                libc::read(
                    self.raw_fd(),
                    msgs.as_mut_ptr().cast(),
                    std::mem::size_of_val(&msgs),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            let count = n as usize / std::mem::size_of::<UffdMsg>();
            for m in &msgs[..count] {
                if m.event == UFFD_EVENT_PAGEFAULT {
                    out.push(FaultEvent {
                        address: m.address,
                        thread_id: m.ptid,
                        write: m.flags & 1 != 0,
                    });
                }
            }
            if count < msgs.len() {
                return Ok(());
            }
        }
    }
}

/// Consecutive EAGAIN / EINTR answers (no page moved) a
/// [`Uffd::move_range`] retries before it returns the error.
pub const MOVE_TRANSIENT_RETRIES: u32 = 1000;

/// A failed `UFFDIO_MOVE`: which range, how far it got, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveError {
    /// Destination of the whole request.
    pub dst: usize,
    /// Source of the whole request.
    pub src: usize,
    /// Length of the whole request.
    pub len: usize,
    /// Bytes that did move (from the start) before the failure.
    pub moved: usize,
    /// The errno of the failure.
    pub errno: i32,
}

impl MoveError {
    /// The destination was not a hole (something is mapped there).
    pub fn dst_not_a_hole(&self) -> bool {
        self.errno == libc::EEXIST
    }
    /// The source page was not present.
    pub fn src_missing(&self) -> bool {
        self.errno == libc::ENOENT
    }
}

impl std::fmt::Display for MoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = io::Error::from_raw_os_error(self.errno);
        write!(
            f,
            "UFFDIO_MOVE dst={:#x} src={:#x} len={:#x} (moved {:#x}): {e}",
            self.dst + self.moved,
            self.src + self.moved,
            self.len - self.moved,
            self.moved
        )?;
        match self.errno {
            libc::EEXIST => write!(f, " (destination not a hole)"),
            libc::ENOENT => write!(f, " (source not present)"),
            libc::EBUSY => write!(f, " (source page shared or pinned)"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for MoveError {}

impl From<MoveError> for io::Error {
    fn from(e: MoveError) -> io::Error {
        io::Error::new(io::Error::from_raw_os_error(e.errno).kind(), e.to_string())
    }
}

/// An anonymous private mapping, `HUGE_PAGE_SIZE` aligned, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    /// What mmap returned (unmapped on drop).
    raw: usize,
    raw_len: usize,
    /// The aligned start and length handed out.
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Reserves `len` bytes (rounded up to 2 MiB) `MAP_PRIVATE |
    /// MAP_ANONYMOUS | MAP_NORESERVE`, read/write, 2 MiB aligned, not copied
    /// on fork. Nothing is committed: pages come when first touched.
    pub fn reserve(len: usize) -> io::Result<Self> {
        let len = len
            .checked_next_multiple_of(HUGE_PAGE_SIZE)
            .ok_or_else(|| io::Error::other("mapping size overflows"))?;
        let raw_len = len
            .checked_add(HUGE_PAGE_SIZE)
            .ok_or_else(|| io::Error::other("mapping size overflows"))?;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address; no existing memory
        // is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_err("mmap of the tiered memory areas"));
        }
        let raw = p as usize;
        let addr = raw.next_multiple_of(HUGE_PAGE_SIZE);
        let m = Self {
            raw,
            raw_len,
            addr,
            len,
        };
        advise(m.addr, len, Advice::DontFork)?;
        Ok(m)
    }
    /// Start address (2 MiB aligned).
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)] // a mapping is never empty
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value created and owns; every
        // borrower of its memory (TieredMemory and what it hands out) is gone by then.
        unsafe { libc::munmap(self.raw as *mut libc::c_void, self.raw_len) };
    }
}

/// `madvise` advice that keeps every byte's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Back with transparent huge pages where possible.
    HugePage,
    /// Do not back with transparent huge pages.
    NoHugePage,
    /// Do not copy into a child on fork (UFFDIO_MOVE needs exclusive pages).
    DontFork,
    /// Fault every page in for writing now (allocates per the range's policy).
    PopulateWrite,
    /// Collapse present 4 KiB pages into a huge page now (copies, keeps content).
    Collapse,
}

const MADV_COLLAPSE: i32 = 25;

/// `madvise` with an advice that keeps content (see [`Advice`]).
pub fn advise(addr: usize, len: usize, advice: Advice) -> io::Result<()> {
    let (raw, name) = match advice {
        Advice::HugePage => (libc::MADV_HUGEPAGE, "MADV_HUGEPAGE"),
        Advice::NoHugePage => (libc::MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE"),
        Advice::DontFork => (libc::MADV_DONTFORK, "MADV_DONTFORK"),
        Advice::PopulateWrite => (
            libc::MADV_POPULATE_WRITE,
            "MADV_POPULATE_WRITE (Linux 5.14+)",
        ),
        Advice::Collapse => (MADV_COLLAPSE, "MADV_COLLAPSE (Linux 6.1+)"),
    };
    // SAFETY: these advice values change only how a range of our own anonymous
    // mapping is backed (THP eligibility, fork behaviour, faulting pages in,
    // collapsing present pages into a huge page); every byte keeps its value.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, raw) };
    if r < 0 {
        return Err(last_err(name));
    }
    Ok(())
}

const MLOCK_ONFAULT: libc::c_uint = 1;
const MADV_DONTNEED_LOCKED: i32 = 24;

/// Locks `[addr, addr+len)` on fault (`mlock2(MLOCK_ONFAULT)`): nothing is
/// populated, pages are locked as they come. Locked ranges are exempt from
/// reclaim (and the kernel's reclaim-time demotion) and from the remapping
/// of zero-filled parts of a split huge page to the shared zero page.
/// Needs `CAP_IPC_LOCK` or a large enough `RLIMIT_MEMLOCK`.
pub fn lock_on_fault(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: mlock2 changes only the locking of our own mapping's range.
    let r = unsafe { libc::syscall(libc::SYS_mlock2, addr, len, MLOCK_ONFAULT) };
    if r < 0 {
        return Err(last_err("mlock2(MLOCK_ONFAULT)"));
    }
    Ok(())
}

/// Frees the pages of `[addr, addr+len)` (`MADV_DONTNEED`): the range becomes
/// a hole (a later touch sees zeros, or a userfault in a MISSING-registered
/// range). Memory-safe (the mapping stays valid), but the content is gone:
/// callers pass only ranges whose content nobody needs.
pub fn discard(addr: usize, len: usize) -> io::Result<()> {
    // MADV_DONTNEED_LOCKED (Linux 5.18+) also works on locked ranges;
    // older kernels refuse it (EINVAL) and get MADV_DONTNEED.
    for advice in [MADV_DONTNEED_LOCKED, libc::MADV_DONTNEED] {
        // SAFETY: MADV_DONTNEED(_LOCKED) on a range of our own private anonymous mapping
        // drops its pages; the mapping stays valid, so no Rust reference is invalidated
        // (nobody holds references into these areas; all access is through raw volatile
        // copies).
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) || advice == libc::MADV_DONTNEED {
            return Err(io::Error::new(
                e.kind(),
                format!("madvise(MADV_DONTNEED): {e}"),
            ));
        }
    }
    Ok(())
}

const MPOL_BIND: i32 = 2;
const MPOL_MF_MOVE: i32 = 1 << 1;
/// Node ids tiervm supports (the nodemask is one u64).
pub const MAX_NODES: usize = 64;

fn nodemask(nodes: &[u32]) -> io::Result<[u64; 1]> {
    let mut mask = 0u64;
    for &node in nodes {
        if node as usize >= MAX_NODES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "NUMA node {node} is out of range (tiervm supports node ids below {MAX_NODES})"
                ),
            ));
        }
        mask |= 1 << node;
    }
    Ok([mask])
}

/// Binds `[addr, addr+len)` to `nodes` (`mbind(MPOL_BIND)`): pages faulted
/// in there later come from those nodes, and NUMA balancing leaves the range
/// alone (it scans only ranges without an explicit policy).
pub fn mbind(addr: usize, len: usize, nodes: &[u32]) -> io::Result<()> {
    let mask = nodemask(nodes)?;
    // SAFETY: mbind reads `mask` (one u64, maxnode = 65 bits as the kernel expects
    // maxnode-1 significant bits) and changes only the policy of our own range.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            MAX_NODES + 1,
            0u32,
        )
    };
    if r < 0 {
        return Err(last_err(&format!(
            "mbind(MPOL_BIND, nodes {nodes:?}) (does the node exist? see /sys/devices/system/node)"
        )));
    }
    Ok(())
}

/// `move_pages(2)` on our own process: with `to_node` the kernel migrates
/// each page there, without it only reports where each page is. Returns
/// the per-page status (node or negative errno).
fn move_pages(addrs: &[usize], to_node: Option<u32>) -> io::Result<Vec<i32>> {
    let mut status = vec![0i32; addrs.len()];
    if addrs.is_empty() {
        return Ok(status);
    }
    let nodes: Option<Vec<i32>> = to_node.map(|n| vec![n as i32; addrs.len()]);
    let (nodes_ptr, flags) = match &nodes {
        Some(n) => (n.as_ptr(), MPOL_MF_MOVE),
        None => (std::ptr::null::<i32>(), 0),
    };
    // SAFETY: `addrs`, `status` and (when given) `nodes` have `addrs.len()`
    // elements. With nodes == NULL the kernel only reports each page's node;
    // otherwise it migrates our own pages, keeping addresses and contents.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            addrs.len(),
            addrs.as_ptr(),
            nodes_ptr,
            status.as_mut_ptr(),
            flags,
        )
    };
    if r < 0 {
        return Err(match to_node {
            Some(n) => last_err(&format!("move_pages to node {n}")),
            None => last_err("move_pages (query)"),
        });
    }
    Ok(status)
}

/// Queries the NUMA node of each page (`move_pages` with `nodes = NULL`).
/// Entries are the node id, or a negative errno (`-ENOENT`: not present).
pub fn query_nodes(addrs: &[usize]) -> io::Result<Vec<i32>> {
    move_pages(addrs, None)
}

/// Migrates each page to `node` with the kernel's own (exclusive) migration,
/// `move_pages(2)`. Returns the per-page status (node or negative errno).
pub fn move_pages_to(addrs: &[usize], node: u32) -> io::Result<Vec<i32>> {
    move_pages(addrs, Some(node))
}

/// Residency of each page of `[addr, addr+pages*4K)` (`mincore`).
pub fn resident(addr: usize, pages: usize) -> io::Result<Vec<bool>> {
    let mut v = vec![0u8; pages];
    // SAFETY: `v` has one byte per page of the range, which lies in our own mapping.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, pages * PAGE_SIZE, v.as_mut_ptr()) };
    if r < 0 {
        return Err(last_err("mincore"));
    }
    Ok(v.into_iter().map(|b| b & 1 != 0).collect())
}

/// `struct page_region` of `PAGEMAP_SCAN`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg` of `PAGEMAP_SCAN`.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const PAGEMAP_SCAN: u32 = ioc(
    IOC_READ | IOC_WRITE,
    b'f' as u32,
    16,
    std::mem::size_of::<PmScanArg>(),
);
const _: () = assert!(PAGEMAP_SCAN == 0xc060_6610);
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_HUGE: u64 = 1 << 6;

/// Present bytes of a range, as the kernel's page tables say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Presence {
    /// Bytes mapped (present) in the range.
    pub present: u64,
    /// Of those, bytes mapped by huge (PMD) entries.
    pub huge: u64,
}

/// `/proc/self/pagemap`, opened once, for [`PageScanner::scan`].
#[derive(Debug)]
pub struct PageScanner {
    fd: OwnedFd,
}

impl PageScanner {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> io::Result<Self> {
        let f = std::fs::File::open("/proc/self/pagemap")
            .map_err(|e| io::Error::new(e.kind(), format!("/proc/self/pagemap: {e}")))?;
        Ok(Self { fd: f.into() })
    }

    /// Present and huge-mapped bytes of `[start, end)` (`PAGEMAP_SCAN`, Linux
    /// 6.7+; `mincore` when the ioctl is missing, which cannot tell huge
    /// mappings apart: `huge` is then 0). Also calls `each(start, end, huge)`
    /// for every present range.
    pub fn scan(
        &self,
        start: usize,
        end: usize,
        mut each: impl FnMut(usize, usize, bool),
    ) -> io::Result<Presence> {
        let mut out = Presence::default();
        let mut regions = [PageRegion::default(); 256];
        let mut at = start as u64;
        while at < end as u64 {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: 0,
                start: at,
                end: end as u64,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: PAGE_IS_PRESENT,
                category_anyof_mask: 0,
                return_mask: PAGE_IS_PRESENT | PAGE_IS_HUGE,
            };
            // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points to `regions`, a
            // writable array of `vec_len` page_region structs that outlives the call; the
            // kernel only reads page tables of our own address range.
            let n = unsafe { libc::ioctl(self.fd.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) {
                    return scan_with_mincore(start, end, each);
                }
                return Err(io::Error::new(e.kind(), format!("PAGEMAP_SCAN: {e}")));
            }
            for r in &regions[..n as usize] {
                let len = r.end.saturating_sub(r.start);
                let huge = r.categories & PAGE_IS_HUGE != 0;
                out.present += len;
                if huge {
                    out.huge += len;
                }
                each(r.start as usize, r.end as usize, huge);
            }
            if arg.walk_end <= at {
                break;
            }
            at = arg.walk_end;
        }
        Ok(out)
    }
}

fn scan_with_mincore(
    start: usize,
    end: usize,
    mut each: impl FnMut(usize, usize, bool),
) -> io::Result<Presence> {
    let mut out = Presence::default();
    let step = 1 << 30;
    let mut at = start;
    while at < end {
        let len = step.min(end - at);
        let res = resident(at, len / PAGE_SIZE)?;
        let mut i = 0;
        while i < res.len() {
            if !res[i] {
                i += 1;
                continue;
            }
            let s = i;
            while i < res.len() && res[i] {
                i += 1;
            }
            out.present += ((i - s) * PAGE_SIZE) as u64;
            each(at + s * PAGE_SIZE, at + i * PAGE_SIZE, false);
        }
        at += len;
    }
    Ok(out)
}

/// Calling thread's id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// A boxed slice of `n` zeroed atomics, allocated with `alloc_zeroed` so
/// that its pages are only committed when written (a 64 GiB guest's page map
/// must not cost its size at start-up).
pub fn zeroed_atomics<T: ZeroableAtomic>(n: usize) -> io::Result<Box<[T]>> {
    if n == 0 {
        return Ok(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<T>(n)
        .map_err(|_| io::Error::other(format!("a map of {n} entries does not fit in memory")))?;
    // SAFETY: the layout is non-zero-sized (n > 0 and T is not a ZST); the allocation is
    // checked for null below; the all-zero bit pattern is a valid `T` (the trait's
    // contract: only std atomic integers implement it), so the slice is initialized; the
    // box takes ownership of exactly that allocation with the same layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Ok(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)))
    }
}

/// Types for which all-zero bytes are a valid value (std atomic integers).
///
/// # Safety
/// Implement only for types whose all-zero bit pattern is a valid value and
/// that are not zero-sized.
pub unsafe trait ZeroableAtomic {}
// SAFETY: an AtomicU64 of all-zero bytes is the value 0 (same layout as u64).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU64 {}
// SAFETY: an AtomicU32 of all-zero bytes is the value 0 (same layout as u32).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU32 {}
// SAFETY: an AtomicU16 of all-zero bytes is the value 0 (same layout as u16).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU16 {}
// SAFETY: an AtomicU8 of all-zero bytes is the value 0 (same layout as u8).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU8 {}

/// Copies `len` bytes (a multiple of 8) with volatile 8-byte loads and
/// stores (guest memory may be written concurrently by vCPUs, like
/// vm-memory's volatile copies).
///
/// # Safety
/// `src` and `dst` must be 8-byte aligned, valid for `len` bytes, and not overlap.
pub unsafe fn copy_volatile(dst: *mut u8, src: *const u8, len: usize) {
    let s = src as *const u64;
    let d = dst as *mut u64;
    for i in 0..len / 8 {
        // SAFETY: the caller guarantees both pointers are valid and aligned for `len`.
        unsafe { d.add(i).write_volatile(s.add(i).read_volatile()) };
    }
}

/// Whether two ranges of `len` bytes hold the same bytes (volatile reads).
///
/// # Safety
/// `a` and `b` must be 8-byte aligned and valid for reads of `len` bytes.
pub unsafe fn equal_volatile(a: *const u8, b: *const u8, len: usize) -> bool {
    let a = a as *const u64;
    let b = b as *const u64;
    // SAFETY: the caller guarantees both pointers are valid and aligned for `len`.
    (0..len / 8).all(|i| unsafe { a.add(i).read_volatile() == b.add(i).read_volatile() })
}

/// Whether `len` bytes (a multiple of 8) at `a` are all zero, read with
/// volatile loads (another thread may write them).
///
/// # Safety
/// `a` must be valid for reads of `len` bytes and 8-byte aligned.
pub unsafe fn is_zero_volatile(a: *const u8, len: usize) -> bool {
    let a = a as *const u64;
    // SAFETY: the caller guarantees the pointer is valid and aligned for `len`.
    (0..len / 8).all(|i| unsafe { a.add(i).read_volatile() == 0 })
}

/// Zeroes `len` bytes (a multiple of 8) with volatile stores.
///
/// # Safety
/// `dst` must be 8-byte aligned and valid for writes of `len` bytes.
pub unsafe fn zero_volatile(dst: *mut u8, len: usize) {
    let d = dst as *mut u64;
    for i in 0..len / 8 {
        // SAFETY: the caller guarantees the pointer is valid and aligned for `len`.
        unsafe { d.add(i).write_volatile(0) };
    }
}

/// A point of the syscall layer where a failure can be injected (tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FaultPoint {
    /// `UFFDIO_MOVE`.
    Move,
    /// `UFFDIO_ZEROPAGE`.
    ZeroPage,
    /// Making a page (`MADV_POPULATE_WRITE`, a first touch's allocation).
    Populate,
    /// `MADV_DONTNEED` of freed pages.
    Discard,
    /// `move_pages(2)` migration.
    MovePages,
    /// The dirty log's GET.
    DirtyGet,
    /// The dirty log's CLEAR.
    DirtyClear,
    /// The wake-up of a thread that touched a parked page (the map-back
    /// move does not wake and the explicit `UFFDIO_WAKE` is skipped): a
    /// lost wake-up, for the stall watchdog's tests.
    Wake,
}

impl std::str::FromStr for FaultPoint {
    type Err = FaultPlanError;
    fn from_str(s: &str) -> Result<Self, FaultPlanError> {
        Ok(match s {
            "move" => FaultPoint::Move,
            "zero-page" => FaultPoint::ZeroPage,
            "populate" => FaultPoint::Populate,
            "discard" => FaultPoint::Discard,
            "move-pages" => FaultPoint::MovePages,
            "dirty-get" => FaultPoint::DirtyGet,
            "dirty-clear" => FaultPoint::DirtyClear,
            "wake" => FaultPoint::Wake,
            _ => return Err(FaultPlanError::UnknownPoint(s.to_string())),
        })
    }
}

/// A fault plan (`--test-fault-inject`) that does not parse; each message
/// names what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultPlanError {
    /// Not one of the fault points.
    #[error(
        "unknown fault point '{0}': use move, zero-page, populate, discard, move-pages, \
         dirty-get, dirty-clear or wake"
    )]
    UnknownPoint(String),
    /// A part after the point that is not `key=value`.
    #[error("'{part}' in fault plan '{plan}' is not key=value (every=N, errno=NAME, max=N)")]
    NotKeyValue {
        /// The part.
        part: String,
        /// The whole plan.
        plan: String,
    },
    /// `every=` or `max=` with a value that is not a number.
    #[error("'{value}' in fault plan '{plan}' is not a number")]
    NotANumber {
        /// The value.
        value: String,
        /// The whole plan.
        plan: String,
    },
    /// An errno that is neither a known name nor a number.
    #[error(
        "unknown errno '{value}' in fault plan '{plan}': use EIO, EBUSY, EAGAIN, ENOMEM, \
         EEXIST, ENOENT, EFAULT or a number"
    )]
    UnknownErrno {
        /// The value.
        value: String,
        /// The whole plan.
        plan: String,
    },
    /// A key other than every, errno and max.
    #[error("unknown key '{key}' in fault plan '{plan}' (every, errno, max)")]
    UnknownKey {
        /// The key.
        key: String,
        /// The whole plan.
        plan: String,
    },
}

/// One injected failure: every `every`-th call of `point` fails with
/// `errno`, at most `max` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// Where.
    pub point: FaultPoint,
    /// Fail one call in this many (1: every call).
    pub every: u64,
    /// The errno of the failure.
    pub errno: i32,
    /// Failures after which the plan stops firing.
    pub max: u64,
}

impl FaultPlan {
    /// Parses `POINT[:every=N][:errno=NAME|N][:max=N]`, e.g.
    /// `move:every=50:errno=EBUSY`.
    pub fn parse(s: &str) -> Result<Self, FaultPlanError> {
        let mut parts = s.split(':');
        let point = parts.next().unwrap_or_default().parse()?;
        let mut plan = FaultPlan {
            point,
            every: 1,
            errno: libc::EIO,
            max: u64::MAX,
        };
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| FaultPlanError::NotKeyValue {
                    part: kv.to_string(),
                    plan: s.to_string(),
                })?;
            let num = |v: &str| {
                v.parse::<u64>().map_err(|_| FaultPlanError::NotANumber {
                    value: v.to_string(),
                    plan: s.to_string(),
                })
            };
            match k {
                "every" => plan.every = num(v)?.max(1),
                "max" => plan.max = num(v)?,
                "errno" => {
                    plan.errno = parse_errno(v).ok_or_else(|| FaultPlanError::UnknownErrno {
                        value: v.to_string(),
                        plan: s.to_string(),
                    })?
                }
                _ => {
                    return Err(FaultPlanError::UnknownKey {
                        key: k.to_string(),
                        plan: s.to_string(),
                    })
                }
            }
        }
        Ok(plan)
    }
}

/// An errno by name (the ones fault plans use) or number.
fn parse_errno(v: &str) -> Option<i32> {
    Some(match v {
        "EIO" => libc::EIO,
        "EBUSY" => libc::EBUSY,
        "EAGAIN" => libc::EAGAIN,
        "ENOMEM" => libc::ENOMEM,
        "EEXIST" => libc::EEXIST,
        "ENOENT" => libc::ENOENT,
        "EFAULT" => libc::EFAULT,
        _ => return v.parse().ok(),
    })
}

/// Failure injection for one tiered memory (tests only: nothing fires
/// unless plans were set). Scoped to an instance, so tests running in
/// parallel do not disturb each other.
#[derive(Debug, Default)]
pub struct Injector {
    armed: std::sync::atomic::AtomicBool,
    plans: std::sync::Mutex<Vec<(FaultPlan, u64, u64)>>,
}

impl Injector {
    /// Replaces the plans (an empty list disarms).
    pub fn set(&self, plans: &[FaultPlan]) {
        let mut g = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        *g = plans.iter().map(|p| (*p, 0, 0)).collect();
        self.armed
            .store(!plans.is_empty(), std::sync::atomic::Ordering::Release);
    }

    /// Failures injected so far at `point`.
    pub fn fired(&self, point: FaultPoint) -> u64 {
        let g = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .filter(|(p, _, _)| p.point == point)
            .map(|x| x.2)
            .sum()
    }

    /// Whether a call at `point` must fail now (and with which errno).
    pub fn check(&self, point: FaultPoint) -> Option<i32> {
        if !self.armed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut g = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        for (plan, calls, fired) in g.iter_mut().filter(|x| x.0.point == point) {
            *calls += 1;
            if *fired < plan.max && (*calls).is_multiple_of(plan.every) {
                *fired += 1;
                return Some(plan.errno);
            }
        }
        None
    }

    /// `Err` with the injected errno, if a call at `point` must fail now.
    pub fn io(&self, point: FaultPoint) -> io::Result<()> {
        match self.check(point) {
            Some(errno) => Err(io::Error::new(
                io::Error::from_raw_os_error(errno).kind(),
                format!(
                    "{point:?}: injected failure: {}",
                    io::Error::from_raw_os_error(errno)
                ),
            )),
            None => Ok(()),
        }
    }
}
