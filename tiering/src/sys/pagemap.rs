//! What the page tables say about a range: residency (`mincore`) and
//! present / huge-mapped runs (`PAGEMAP_SCAN` on `/proc/self/pagemap`, with
//! `mincore` as the fallback).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::{ioc, last_err, IOC_READ, IOC_WRITE, PAGE_SIZE};

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
