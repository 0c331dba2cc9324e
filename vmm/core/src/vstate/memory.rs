//! Guest memory: the RAM mapping, the guest-physical layout of the guest ABI,
//! the ring-3 page tables and the boot-info block.

use tiering::mem::PAGE_SIZE;
use tiervm_guest::abi::{
    self, ArgEntry, BootInfo, BOOT_INFO_GPA, GUEST_LARGE_PAGE, MAX_ARGS, PAGE_TABLES_GPA,
    STACK_SIZE, STATUS_GPA,
};
use vm_memory::mmap::FromRangesError;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap};

use crate::guest_abi::{Wire, MAX_RAM};
use crate::workload_args::{to_entries, WorkloadArgError};

/// Guest memory that cannot be set up or written.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The size does not fit this host's address space.
    #[error("--mem {0} does not fit this host")]
    TooLarge(u64),
    /// More RAM than one page-table tree maps.
    #[error("--mem above {} GiB is not supported", MAX_RAM >> 30)]
    AboveMaxRam,
    /// `mmap` of guest RAM failed.
    #[error("mapping guest RAM")]
    Map(#[source] FromRangesError),
    /// Guest RAM has no host address at guest-physical 0.
    #[error("guest RAM address")]
    HostAddress(#[source] GuestMemoryError),
    /// Writing the page tables failed.
    #[error("writing page tables")]
    PageTables(#[source] GuestMemoryError),
    /// Writing the boot info failed.
    #[error("writing boot info")]
    BootInfo(#[source] GuestMemoryError),
    /// Writing the status page failed.
    #[error("writing status page")]
    StatusPage(#[source] GuestMemoryError),
    /// The workload arguments do not fit the boot info.
    #[error(transparent)]
    Arg(#[from] WorkloadArgError),
}

impl MemoryError {
    /// Whether the user's input is at fault (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::TooLarge(_) | Self::AboveMaxRam | Self::Arg(_))
    }
}

type Result<T> = std::result::Result<T, MemoryError>;

/// Where everything lives in guest-physical memory for one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestLayout {
    /// Guest RAM bytes.
    pub ram_size: u64,
    /// One past the image's last byte.
    pub image_end: u64,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Lowest stack byte (stacks grow down from `stacks_base + (i+1)*STACK_SIZE`).
    pub stacks_base: u64,
    /// First heap byte (2 MiB aligned).
    pub heap_start: u64,
    /// One past the last heap byte.
    pub heap_end: u64,
}

impl GuestLayout {
    /// The layout for an image ending at `image_end` with `vcpus` vCPUs.
    pub fn new(ram_size: u64, image_end: u64, vcpus: u32) -> Self {
        let stacks_base = image_end.next_multiple_of(PAGE_SIZE as u64);
        let stacks_end = stacks_base + u64::from(vcpus) * STACK_SIZE;
        let heap_start = stacks_end.div_ceil(GUEST_LARGE_PAGE) * GUEST_LARGE_PAGE;
        Self {
            ram_size,
            image_end,
            vcpus,
            stacks_base,
            heap_start,
            heap_end: ram_size.max(heap_start),
        }
    }

    /// Heap bytes available.
    pub fn heap_bytes(&self) -> u64 {
        self.heap_end - self.heap_start
    }

    /// Initial stack pointer of vCPU `i`.
    pub fn stack_top(&self, i: u32) -> u64 {
        self.stacks_base + (u64::from(i) + 1) * STACK_SIZE - 8
    }

    /// RAM needed for a heap of `heap` bytes with this image and vCPU count.
    pub fn ram_needed(&self, heap: u64) -> u64 {
        (self.heap_start + heap).div_ceil(GUEST_LARGE_PAGE) * GUEST_LARGE_PAGE
    }
}

/// Anonymous, private guest RAM of `size` bytes at guest-physical 0. With
/// `huge_pages` the host is asked to back it with transparent huge pages
/// (`MADV_HUGEPAGE`), which the untiered VM uses; tiered RAM stays 4 KiB.
pub fn create_ram(size: u64, huge_pages: bool) -> Result<GuestMemoryMmap> {
    let len = usize::try_from(size).map_err(|_| MemoryError::TooLarge(size))?;
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), len)]).map_err(MemoryError::Map)?;
    if huge_pages {
        let host = mem
            .get_host_address(GuestAddress(0))
            .map_err(MemoryError::HostAddress)?;
        // SAFETY: `host..host + len` is exactly the one mapping vm-memory
        // created above and `mem` still owns; MADV_HUGEPAGE only changes how
        // the kernel backs it (no content changes, nothing freed).
        let rc = unsafe { libc::madvise(host.cast(), len, libc::MADV_HUGEPAGE) };
        if rc != 0 {
            tracing::debug!(
                "MADV_HUGEPAGE on guest RAM failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(mem)
}

/// Page-table entry bits.
const PTE_PRESENT: u64 = 1;
const PTE_WRITABLE: u64 = 1 << 1;
const PTE_USER: u64 = 1 << 2;
const PTE_LARGE: u64 = 1 << 7;
const PTE_TABLE: u64 = PTE_PRESENT | PTE_WRITABLE | PTE_USER;

/// Builds a 4-level tree at [`PAGE_TABLES_GPA`] identity-mapping all of RAM
/// and, if given, the `extra` range `(gpa, len)` above it (the
/// latency-emulation region) with user-accessible, writable 2 MiB pages.
/// Returns the CR3 value.
pub fn write_page_tables(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    extra: Option<(u64, u64)>,
) -> Result<u64> {
    let end = extra.map_or(ram_size, |(gpa, len)| ram_size.max(gpa + len));
    if end > MAX_RAM {
        return Err(MemoryError::AboveMaxRam);
    }
    let mapped = |addr: u64| {
        addr < ram_size || extra.is_some_and(|(gpa, len)| (gpa..gpa + len).contains(&addr))
    };
    let pml4 = PAGE_TABLES_GPA;
    let pdpt = pml4 + 0x1000;
    let pd_base = pdpt + 0x1000;
    let gib = end.div_ceil(1 << 30);
    let w = |gpa: u64, val: u64| {
        mem.write_obj(val, GuestAddress(gpa))
            .map_err(MemoryError::PageTables)
    };
    w(pml4, pdpt | PTE_TABLE)?;
    for g in 0..gib {
        let pd = pd_base + g * 0x1000;
        w(pdpt + g * 8, pd | PTE_TABLE)?;
        for i in 0..512u64 {
            let addr = (g << 30) | (i << 21);
            if addr >= end {
                break;
            }
            if mapped(addr) {
                w(
                    pd + i * 8,
                    addr | PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_LARGE,
                )?;
            }
        }
    }
    Ok(pml4)
}

/// Writes the boot-info block and an initialised status page.
pub fn write_boot_info(
    mem: &GuestMemoryMmap,
    layout: &GuestLayout,
    seed: u64,
    tsc_khz: u64,
    args: &[(String, String)],
    emulation_gpa: u64,
) -> Result<()> {
    let mut entries = [ArgEntry::EMPTY; MAX_ARGS];
    for (slot, entry) in entries.iter_mut().zip(to_entries(args)?) {
        *slot = entry;
    }
    let info = BootInfo {
        magic: abi::BOOT_MAGIC,
        abi_version: abi::ABI_VERSION,
        vcpu_count: layout.vcpus,
        ram_size: layout.ram_size,
        tsc_khz,
        seed,
        heap_start: layout.heap_start,
        heap_end: layout.heap_end,
        status_gpa: STATUS_GPA,
        arg_count: args.len() as u32,
        _reserved: 0,
        args: entries,
        emulation_gpa,
    };
    mem.write_obj(Wire(info), GuestAddress(BOOT_INFO_GPA))
        .map_err(MemoryError::BootInfo)?;
    mem.write_obj(abi::STATUS_MAGIC, GuestAddress(STATUS_GPA))
        .map_err(MemoryError::StatusPage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_ordered() {
        let l = GuestLayout::new(1 << 30, 0x40c1e0, 4);
        assert_eq!(l.stacks_base, 0x40d000);
        assert_eq!(l.heap_start % GUEST_LARGE_PAGE, 0);
        assert!(l.heap_start >= l.stacks_base + 4 * STACK_SIZE);
        assert_eq!(l.stack_top(0) % 8, 0);
        assert!(l.stack_top(3) < l.heap_start);
        assert_eq!(l.heap_end, 1 << 30);
    }

    #[test]
    fn page_tables_map_ram_identity() {
        let mem = create_ram(64 << 20, false).unwrap();
        let cr3 = write_page_tables(&mem, 64 << 20, None).unwrap();
        let pml4e: u64 = mem.read_obj(GuestAddress(cr3)).unwrap();
        let pdpt = pml4e & !0xfff;
        let pdpte: u64 = mem.read_obj(GuestAddress(pdpt)).unwrap();
        let pd = pdpte & !0xfff;
        for i in 0..32u64 {
            let pde: u64 = mem.read_obj(GuestAddress(pd + i * 8)).unwrap();
            assert_eq!(pde & !0xfff, i << 21);
            assert_eq!(
                pde & 0xff,
                PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_LARGE
            );
        }
        let beyond: u64 = mem.read_obj(GuestAddress(pd + 32 * 8)).unwrap();
        assert_eq!(beyond, 0, "no mapping beyond RAM");
    }

    #[test]
    fn page_tables_map_the_emulation_region_above_ram() {
        let mem = create_ram(64 << 20, false).unwrap();
        // A region at 64 MiB + 4 MiB (a hole between), 4 MiB long.
        let cr3 = write_page_tables(&mem, 64 << 20, Some((68 << 20, 4 << 20))).unwrap();
        let pd = PAGE_TABLES_GPA + 0x2000;
        assert_eq!(cr3, PAGE_TABLES_GPA);
        let pde = |i: u64| -> u64 { mem.read_obj(GuestAddress(pd + i * 8)).unwrap() };
        assert_eq!(pde(31) & !0xfff, 31 << 21);
        assert_eq!(pde(32), 0, "the hole is not mapped");
        assert_eq!(pde(33), 0);
        assert_eq!(pde(34) & !0xfff, 34 << 21);
        assert_eq!(pde(35) & !0xfff, 35 << 21);
        assert_eq!(pde(36), 0);
        assert!(write_page_tables(&mem, 64 << 20, Some((MAX_RAM, 2 << 20))).is_err());
    }
}
