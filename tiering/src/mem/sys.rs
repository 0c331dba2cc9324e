//! The one audited place for the raw system calls and ioctls the tiered
//! memory needs: userfaultfd (API, REGISTER, MOVE, WAKE), `mbind`,
//! `set_mempolicy`, `move_pages`, `madvise`, `mmap`, `mincore`.
//!
//! The Debian kernel headers on the build machines are older than
//! `UFFDIO_MOVE` (Linux 6.8), so the userfaultfd structures and ioctl numbers
//! are defined here by hand and checked against their known values at
//! compile time.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Base page size the tiered memory works in.
pub const PAGE_SIZE: usize = 4096;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}

const UFFDIO: u32 = 0xAA;
const UFFD_API: u64 = 0xAA;

/// `UFFD_FEATURE_THREAD_ID`: the fault message carries the faulting thread id.
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
/// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` is available (Linux 6.8+).
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
const UFFD_USER_MODE_ONLY: i32 = 1;

#[repr(C)]
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
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
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
const UFFDIO_MOVE: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x05,
    std::mem::size_of::<UffdioMove>(),
);
const UFFDIO_COPY: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x03,
    std::mem::size_of::<UffdioCopy>(),
);
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: u32 = ioc(0, UFFDIO, 0x00, 0);

// The numbers the kernel headers define (checked against linux/userfaultfd.h).
const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
const _: () = assert!(UFFDIO_WAKE == 0x8010_aa02);
const _: () = assert!(UFFDIO_MOVE == 0xc028_aa05);
const _: () = assert!(UFFDIO_COPY == 0xc028_aa03);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

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

/// A userfaultfd handle, created WITHOUT `UFFD_USER_MODE_ONLY` so that kernel
/// mode faults (KVM's get_user_pages on guest RAM) are delivered too.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl Uffd {
    /// Creates the userfaultfd (syscall first, `/dev/userfaultfd` as the
    /// fallback) and negotiates `UFFD_FEATURE_MOVE | UFFD_FEATURE_THREAD_ID`.
    pub fn new() -> io::Result<Self> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        debug_assert_eq!(flags & UFFD_USER_MODE_ONLY, 0);
        // SAFETY: the userfaultfd syscall takes only a flags word and returns a new fd or -1.
        let mut raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
        if raw < 0 {
            let dev = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/userfaultfd")
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "userfaultfd: the syscall failed ({}) and /dev/userfaultfd could not be \
                             opened ({e}); run as root or set vm.unprivileged_userfaultfd=1",
                            io::Error::last_os_error()
                        ),
                    )
                })?;
            // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its integer argument and
            // returns a new userfaultfd or -1; `dev` is a valid open fd.
            raw = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if raw < 0 {
                return Err(last_err("USERFAULTFD_IOC_NEW"));
            }
        }
        // SAFETY: `raw` is a freshly created fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_MOVE | UFFD_FEATURE_THREAD_ID,
            ioctls: 0,
        };
        // SAFETY: `api` is a valid, writable uffdio_api for the duration of the call.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) };
        if r < 0 {
            return Err(last_err(
                "UFFDIO_API with UFFD_FEATURE_MOVE (needs Linux 6.8 or newer)",
            ));
        }
        Ok(Self { fd })
    }

    /// Raw fd, for polling.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start+len)` in MISSING mode.
    pub fn register_missing(&self, start: usize, len: usize) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: `reg` is a valid uffdio_register; the kernel validates the range.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER as _, &mut reg) };
        if r < 0 {
            return Err(last_err("UFFDIO_REGISTER (MISSING)"));
        }
        Ok(())
    }

    /// Moves `len` bytes of present anonymous pages from `src` to the hole at
    /// `dst` (zero copy), retrying partial moves. Wakes threads waiting on the
    /// destination unless `wake` is false.
    pub fn move_range(&self, dst: usize, src: usize, len: usize, wake: bool) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            let mut mv = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode: if wake { 0 } else { UFFDIO_MOVE_MODE_DONTWAKE },
                moved: 0,
            };
            // SAFETY: `mv` is a valid uffdio_move; the kernel checks that both ranges are
            // registered anonymous memory of this uffd and only remaps page table entries.
            let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_MOVE as _, &mut mv) };
            if r == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if mv.moved > 0 {
                done += mv.moved as usize;
                continue;
            }
            if err.raw_os_error() == Some(libc::EAGAIN) || err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(io::Error::new(
                err.kind(),
                format!(
                    "UFFDIO_MOVE dst={:#x} src={:#x} len={:#x}: {err} (EEXIST: destination not a \
                     hole; ENOENT: source not present; EBUSY: source page shared, e.g. after fork)",
                    dst + done,
                    src + done,
                    len - done
                ),
            ));
        }
        Ok(())
    }

    /// Fills the hole at `dst` with a freshly allocated zeroed page
    /// (`UFFDIO_COPY`; the page comes from the area's memory policy node).
    pub fn copy_zero_page(&self, dst: usize) -> io::Result<()> {
        #[repr(align(4096))]
        struct ZeroPage([u8; PAGE_SIZE]);
        static ZERO: ZeroPage = ZeroPage([0; PAGE_SIZE]);
        let mut cp = UffdioCopy {
            dst: dst as u64,
            src: ZERO.0.as_ptr() as u64,
            len: PAGE_SIZE as u64,
            mode: 0,
            copy: 0,
        };
        // SAFETY: `cp` is a valid uffdio_copy; the kernel reads 4 KiB from our static zero
        // page and installs a new page at `dst`, a hole in our registered area.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_COPY as _, &mut cp) };
        if r < 0 {
            return Err(last_err("UFFDIO_COPY"));
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

/// An eventfd used to wake the fault handler.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates a non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes two integers and returns a new fd or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(last_err("eventfd"));
        }
        // SAFETY: `raw` is a freshly created fd owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd })
    }
    /// Raw fd, for polling.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// Adds one to the counter (wakes pollers).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd; failure (counter overflow)
        // is harmless because the fd is already readable then.
        unsafe { libc::write(self.raw_fd(), (&one as *const u64).cast(), 8) };
    }
    /// Resets the counter.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN when already zero is fine.
        unsafe { libc::read(self.raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// An anonymous private mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes `MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`, read/write,
    /// with THP and fork copying disabled (UFFDIO_MOVE needs exclusive 4 KiB pages).
    pub fn anonymous(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address; no existing memory
        // is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_err("mmap of the tiered memory areas"));
        }
        let m = Self {
            addr: p as usize,
            len,
        };
        madvise(m.addr, len, libc::MADV_NOHUGEPAGE)?;
        madvise(m.addr, len, libc::MADV_DONTFORK)?;
        Ok(m)
    }
    /// Start address.
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
        // SAFETY: unmaps exactly the mapping this value created and owns.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// `madvise(addr, len, advice)`.
pub fn madvise(addr: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: callers pass ranges inside mappings this module created; madvise with the
    // advice values used here (NOHUGEPAGE, DONTFORK, POPULATE_WRITE) does not free memory.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r < 0 {
        return Err(last_err("madvise"));
    }
    Ok(())
}

/// Faults in `[addr, addr+len)` for writing (`MADV_POPULATE_WRITE`).
pub fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    madvise(addr, len, libc::MADV_POPULATE_WRITE).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{e} (MADV_POPULATE_WRITE needs Linux 5.14)"),
        )
    })
}

const MPOL_DEFAULT: i32 = 0;
const MPOL_BIND: i32 = 2;
const MPOL_MF_MOVE: i32 = 1 << 1;
const MAX_NODES: usize = 64;

fn nodemask(node: u32) -> io::Result<[u64; 1]> {
    if node as usize >= MAX_NODES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "NUMA node {node} is out of range (tiervm supports node ids below {MAX_NODES})"
            ),
        ));
    }
    Ok([1u64 << node])
}

/// Binds `[addr, addr+len)` to `node` (`mbind(MPOL_BIND)`): pages faulted in
/// there later come from that node.
pub fn mbind(addr: usize, len: usize, node: u32) -> io::Result<()> {
    let mask = nodemask(node)?;
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
            "mbind(MPOL_BIND, node {node}) (does the node exist? see /sys/devices/system/node)"
        )));
    }
    Ok(())
}

/// Sets the calling thread's memory policy to `MPOL_BIND` on `node`, or back to
/// the default with `None`.
pub fn set_thread_mempolicy(node: Option<u32>) -> io::Result<()> {
    let r = match node {
        Some(n) => {
            let mask = nodemask(n)?;
            // SAFETY: set_mempolicy reads `mask` (one u64) and changes only this thread's policy.
            unsafe {
                libc::syscall(
                    libc::SYS_set_mempolicy,
                    MPOL_BIND,
                    mask.as_ptr(),
                    MAX_NODES + 1,
                )
            }
        }
        // SAFETY: MPOL_DEFAULT with a null mask resets this thread's policy.
        None => unsafe { libc::syscall(libc::SYS_set_mempolicy, MPOL_DEFAULT, 0usize, 0usize) },
    };
    if r < 0 {
        return Err(last_err(&format!("set_mempolicy(node {node:?})")));
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

/// Number of NUMA nodes with memory the host has (from sysfs; 1 when unknown).
pub fn host_memory_nodes() -> usize {
    std::fs::read_to_string("/sys/devices/system/node/has_memory")
        .ok()
        .map(|s| {
            s.trim()
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('-') {
                    Some((a, b)) => {
                        b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0)
                    }
                    None => 1,
                })
                .sum::<usize>()
        })
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// Calling thread's id (tests compare it with fault samples).
#[cfg(test)]
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Copies one 4 KiB page with volatile 8-byte loads and stores (guest memory
/// may be written concurrently by vCPUs, like vm-memory's volatile copies).
///
/// # Safety
/// `src` and `dst` must be 8-byte aligned, valid for 4096 bytes, and not overlap.
pub unsafe fn copy_page(dst: *mut u8, src: *const u8) {
    let s = src as *const u64;
    let d = dst as *mut u64;
    for i in 0..PAGE_SIZE / 8 {
        // SAFETY: the caller guarantees both pointers are valid and aligned for the page.
        unsafe { d.add(i).write_volatile(s.add(i).read_volatile()) };
    }
}
