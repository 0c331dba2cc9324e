//! userfaultfd: opening one (the syscall, or `/dev/userfaultfd`), the API
//! handshake, and the ioctls tiervm uses on it (`UFFDIO_REGISTER`,
//! `UFFDIO_MOVE`, `UFFDIO_ZEROPAGE`, `UFFDIO_WAKE`), plus reading its fault
//! messages.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use super::{ioc, last_err, IOC_NONE, IOC_READ, IOC_WRITE};
use crate::inject::{FaultPoint, Injector};

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
    ///
    /// # Safety
    /// Both `[src, src+len)` and `[dst, dst+len)` must lie in a private
    /// anonymous mapping the caller owns (a [`Mapping`](super::Mapping)) that
    /// stays mapped for the call, the destination registered with this
    /// userfaultfd, and no Rust reference may point into either range (their
    /// memory is accessed only through raw pointers). The kernel checks only
    /// that the destination is registered: a source anywhere else in the
    /// process (the heap, a stack) would be left a hole, its content gone
    /// from under the code that owns it. The caller must also be the one
    /// entitled to move these pages now: the source's content is afterwards
    /// only at the destination.
    pub unsafe fn move_range(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
    ) -> Result<(), MoveError> {
        if let Some(plan) = self.inject.check_plan(FaultPoint::Move) {
            // A failure part way: the first pages really move.
            let part = (plan.moved_pages as usize)
                .saturating_mul(super::PAGE_SIZE)
                .min(len.saturating_sub(super::PAGE_SIZE));
            if part > 0 {
                // SAFETY: a part of the caller's ranges, under its guarantees.
                unsafe { self.move_uninjected(dst, src, part, wake) }?;
            }
            return Err(MoveError {
                dst,
                src,
                len,
                moved: part,
                errno: plan.errno,
            });
        }
        // SAFETY: the caller's guarantees (above).
        unsafe { self.move_uninjected(dst, src, len, wake) }
    }

    /// [`Self::move_range`] without failure injection.
    ///
    /// # Safety
    /// As for [`Self::move_range`].
    unsafe fn move_uninjected(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
    ) -> Result<(), MoveError> {
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
            // SAFETY: `mv` is a valid uffdio_move that lives across the call; the caller
            // guarantees both ranges lie in a mapping it owns with no Rust reference into
            // them (see `# Safety`), and the kernel checks that both are anonymous memory
            // (the destination registered with this uffd) and only remaps page table
            // entries.
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
        self.inject.io(FaultPoint::FaultRead)?;
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
