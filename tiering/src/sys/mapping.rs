//! The anonymous reservation tiered memory lives in (`mmap`, `munmap` on
//! drop) and what is done to ranges of it: `madvise` (content-keeping
//! advice, and `MADV_DONTNEED` to free pages) and `mlock2(MLOCK_ONFAULT)`.

use std::io;

use super::{last_err, HUGE_PAGE_SIZE};

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
        m.advise(m.addr, len, Advice::DontFork)?;
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

    /// Whether `[addr, addr+len)` lies inside this mapping.
    pub fn contains_range(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }

    /// `Ok` if `[addr, addr+len)` lies inside this mapping; an
    /// `InvalidInput` error naming `what` otherwise. The methods that take a
    /// range of the mapping check it with this, so that they cannot reach
    /// memory the mapping does not own.
    pub(super) fn check_range(&self, addr: usize, len: usize, what: &str) -> io::Result<()> {
        if self.contains_range(addr, len) {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{what}: range {addr:#x}+{len:#x} is not inside the mapping {:#x}+{:#x}",
                self.addr, self.len
            ),
        ))
    }

    /// `madvise` of `[addr, addr+len)`, a range of this mapping, with an
    /// advice that keeps content (see [`Advice`]). A range outside the
    /// mapping is refused (`InvalidInput`) before any system call.
    pub fn advise(&self, addr: usize, len: usize, advice: Advice) -> io::Result<()> {
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
        self.check_range(addr, len, name)?;
        // SAFETY: the range lies in this anonymous mapping (checked above), which stays
        // mapped while `self` is borrowed; these advice values change only how it is
        // backed (THP eligibility, fork behaviour, faulting pages in, collapsing present
        // pages into a huge page); every byte keeps its value.
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, raw) };
        if r < 0 {
            return Err(last_err(name));
        }
        Ok(())
    }

    /// Locks the whole mapping on fault (`mlock2(MLOCK_ONFAULT)`): nothing
    /// is populated, pages are locked as they come. Locked ranges are exempt
    /// from reclaim (and the kernel's reclaim-time demotion) and from the
    /// remapping of zero-filled parts of a split huge page to the shared
    /// zero page. Needs `CAP_IPC_LOCK` or a large enough `RLIMIT_MEMLOCK`.
    pub fn lock_on_fault(&self) -> io::Result<()> {
        // SAFETY: mlock2 changes only the locking of this mapping's own range, which
        // stays mapped while `self` is borrowed; no byte changes.
        let r = unsafe { libc::syscall(libc::SYS_mlock2, self.addr, self.len, MLOCK_ONFAULT) };
        if r < 0 {
            return Err(last_err("mlock2(MLOCK_ONFAULT)"));
        }
        Ok(())
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

const MLOCK_ONFAULT: libc::c_uint = 1;
const MADV_DONTNEED_LOCKED: i32 = 24;

/// Frees the pages of `[addr, addr+len)` (`MADV_DONTNEED`): the range becomes
/// a hole (a later touch sees zeros, or a userfault in a MISSING-registered
/// range). The mapping stays valid, but the content is gone.
///
/// # Safety
/// `[addr, addr+len)` must lie in a private anonymous mapping the caller
/// owns (a [`Mapping`]) and that stays mapped for the call; no Rust
/// reference may point into the range (its memory is accessed only through
/// raw pointers: volatile copies, atomics the kernel may zero); and nobody
/// may need its content. Any other memory of the process (the heap, a
/// stack) would be zeroed under the code that owns it.
pub unsafe fn discard(addr: usize, len: usize) -> io::Result<()> {
    // MADV_DONTNEED_LOCKED (Linux 5.18+) also works on locked ranges;
    // older kernels refuse it (EINVAL) and get MADV_DONTNEED.
    for advice in [MADV_DONTNEED_LOCKED, libc::MADV_DONTNEED] {
        // SAFETY: the caller guarantees the range lies in a private anonymous mapping it
        // owns, with no Rust reference into it and no content anyone needs;
        // MADV_DONTNEED(_LOCKED) drops its pages and the mapping stays valid.
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
