//! The guest ABI: the contract between the tiervm VMM and a guest image.
//!
//! Documented for humans in `docs/guest-abi.md`; this module is the single
//! source of truth both sides compile against. All structures are `repr(C)`,
//! made of fixed-width integers and byte arrays only, so any bit pattern is a
//! valid value: the VMM reads guest-written memory with plain copies and
//! validates every field (the guest is untrusted).
//!
//! Guest-physical layout (identity-mapped at the same virtual addresses, user
//! accessible, 2 MiB pages):
//!
//! | GPA range                 | what                                   |
//! |---------------------------|----------------------------------------|
//! | `0x0000..0x1000`          | unused                                 |
//! | [`BOOT_INFO_GPA`]         | [`BootInfo`] (VMM writes, guest reads) |
//! | [`STATUS_GPA`]            | [`StatusPage`] (both; see fields)      |
//! | [`PAGE_TABLES_GPA`]..     | page tables built by the VMM           |
//! | [`IMAGE_BASE_GPA`]..      | the ELF image's `PT_LOAD` segments      |
//! | after the image           | per-vCPU stacks of [`STACK_SIZE`]       |
//! | `heap_start..heap_end`    | free memory for the workload           |
//! | `emulation_gpa..` (opt.)  | latency emulation region (own memslot,  |
//! |                           | above RAM; see [`EmulationHeader`])    |

/// Magic in [`BootInfo::magic`]: "TIERVM01".
pub const BOOT_MAGIC: u64 = u64::from_le_bytes(*b"TIERVM01");
/// Magic in [`StatusPage::magic`]: "TVSTATUS".
pub const STATUS_MAGIC: u64 = u64::from_le_bytes(*b"TVSTATUS");
/// ABI version; bumped on any incompatible change.
pub const ABI_VERSION: u32 = 1;

/// Guest-physical address of the boot-info block.
pub const BOOT_INFO_GPA: u64 = 0x1000;
/// Guest-physical address of the status page (16 KiB).
pub const STATUS_GPA: u64 = 0x4000;
/// Size reserved for the status page.
pub const STATUS_SIZE: u64 = 0x4000;
/// Guest-physical address of the page tables (PML4 first).
pub const PAGE_TABLES_GPA: u64 = 0x10_0000;
/// Lowest address an image may load at (linker scripts use this base).
pub const IMAGE_BASE_GPA: u64 = 0x40_0000;
/// Stack bytes per vCPU.
pub const STACK_SIZE: u64 = 256 * 1024;
/// Bytes in a base page, guest-physical and host alike: the one definition
/// of the 4 KiB page size (the host side imports it as `tiering::vocab::PAGE_SIZE`).
pub const PAGE_SIZE: u64 = 4096;
/// Guest page-table granule: the VMM maps guest RAM with 2 MiB pages. The one
/// definition of the 2 MiB size (the host side imports it as
/// `tiering::vocab::HUGE_PAGE_SIZE`, the transparent huge page of x86_64).
pub const GUEST_LARGE_PAGE: u64 = 2 * 1024 * 1024;

/// Most vCPUs the ABI supports (status slots).
pub const MAX_VCPUS: usize = 64;
/// Most workload arguments passed in [`BootInfo`].
pub const MAX_ARGS: usize = 32;
/// Bytes of an argument key (NUL padded).
pub const ARG_KEY_LEN: usize = 24;
/// Bytes of an argument value (NUL padded).
pub const ARG_VALUE_LEN: usize = 40;
/// Most result metrics a guest can publish.
pub const MAX_METRICS: usize = 64;
/// Bytes of a metric name (NUL padded).
pub const METRIC_NAME_LEN: usize = 24;

/// Port: a 32-bit `out` here ends the writing vCPU with that exit code.
/// The VM ends when every vCPU has exited; the VM's exit code is vCPU 0's
/// (the runtime makes vCPU 0 wait for the others and report the aggregate).
pub const PORT_EXIT: u16 = 0x501;
/// Port: any `out` here marks "first guest instruction" (for `boot_ms`).
pub const PORT_BOOTED: u16 = 0x502;
/// COM1, a 16550 UART (write-only use by guests).
pub const PORT_SERIAL: u16 = 0x3f8;

/// One `key=value` workload argument, both NUL-padded UTF-8.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ArgEntry {
    /// The key, NUL padded.
    pub key: [u8; ARG_KEY_LEN],
    /// The value, NUL padded.
    pub value: [u8; ARG_VALUE_LEN],
}

impl ArgEntry {
    /// An all-zero (absent) entry.
    pub const EMPTY: Self = Self {
        key: [0; ARG_KEY_LEN],
        value: [0; ARG_VALUE_LEN],
    };
}

/// Written by the VMM before the first vCPU runs; read-only for the guest.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BootInfo {
    /// [`BOOT_MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// Number of vCPUs running this image.
    pub vcpu_count: u32,
    /// Guest RAM size in bytes (RAM spans GPA `0..ram_size`).
    pub ram_size: u64,
    /// TSC frequency in kHz (for turning `rdtsc` deltas into time).
    pub tsc_khz: u64,
    /// The run's seed (`--seed`).
    pub seed: u64,
    /// First byte of free memory for the workload (2 MiB aligned).
    pub heap_start: u64,
    /// One past the last byte of free memory.
    pub heap_end: u64,
    /// Guest-physical address of the [`StatusPage`].
    pub status_gpa: u64,
    /// Number of valid entries in `args`.
    pub arg_count: u32,
    /// Reserved, zero.
    pub _reserved: u32,
    /// Workload arguments.
    pub args: [ArgEntry; MAX_ARGS],
    /// Guest-physical address of the latency-emulation region (its
    /// [`EmulationHeader`] first), or 0: no emulation (`--emulate-latency`
    /// not given). Added within ABI version 1: a VMM that predates it leaves
    /// the (zeroed) field 0, and a guest that ignores it runs uncharged.
    pub emulation_gpa: u64,
}

/// Per-vCPU slot in the status page: one cache line, written only by its vCPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VcpuStatus {
    /// Operations completed so far (monotonic).
    pub ops: u64,
    /// The vCPU's [`Phase`] as a `u64`.
    pub phase: u64,
    /// Reserved for the guest's use (e.g. a heartbeat).
    pub heartbeat: u64,
    /// Padding to 64 bytes.
    pub _pad: [u64; 5],
}

/// One result metric a guest publishes before exiting.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Name, NUL padded ASCII (e.g. `p99_ns`).
    pub name: [u8; METRIC_NAME_LEN],
    /// The value as `f64::to_bits`.
    pub value_bits: u64,
}

/// Shared page the guest updates without VM exits and the VMM samples.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StatusPage {
    /// [`STATUS_MAGIC`], written by the VMM.
    pub magic: u64,
    /// Non-zero once the VMM asks the guest to stop (written by the VMM).
    pub stop_request: u64,
    /// Guest: number of valid entries in `metrics` (clamped by the VMM).
    pub metric_count: u64,
    /// Reserved.
    pub _reserved: [u64; 5],
    /// Per-vCPU progress.
    pub vcpus: [VcpuStatus; MAX_VCPUS],
    /// Results published by the guest (vCPU 0) before it exits.
    pub metrics: [Metric; MAX_METRICS],
}

/// Magic in [`EmulationHeader::magic`]: "TVEMUL01".
pub const EMULATION_MAGIC: u64 = u64::from_le_bytes(*b"TVEMUL01");
/// Version of the emulation region's layout.
pub const EMULATION_VERSION: u32 = 1;
/// Most tiers the emulation's 2-bit tier map can name.
pub const EMULATION_MAX_TIERS: usize = 4;
/// Guest pages per 64-bit word of the tier map (2 bits each).
pub const TIER_MAP_PAGES_PER_WORD: u64 = 32;
/// Bytes reserved for the [`EmulationHeader`] (with its per-vCPU slots).
pub const EMULATION_HEADER_SIZE: u64 = 0x4000;
/// Ways of each set of the guest's cache model (16-bit tags, one `u64` per set).
pub const CACHE_MODEL_WAYS: u64 = 4;
/// Bytes of one cache line (the unit the guest charges).
pub const CACHE_LINE: u64 = 64;
/// [`EmulationHeader::guest_state`]: the guest has not looked at the region.
pub const EMU_GUEST_IDLE: u64 = 0;
/// [`EmulationHeader::guest_state`]: vCPU 0 is measuring host DRAM latency.
pub const EMU_GUEST_MEASURING: u64 = 1;
/// [`EmulationHeader::guest_state`]: `dram_ps` is set and the guest charges.
pub const EMU_GUEST_CHARGING: u64 = 2;

/// Per-vCPU counters of latency emulation: two cache lines, written only by
/// their vCPU (plain stores, every few hundred operations), read by the VMM
/// every ~10 ms. Untrusted for the VMM.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EmulationVcpu {
    /// Charged accesses per tier: accesses the cache model missed, by the
    /// tier the tier map gave for their page.
    pub accesses: [u64; EMULATION_MAX_TIERS],
    /// Of `accesses`, those that wrote.
    pub writes: [u64; EMULATION_MAX_TIERS],
    /// Accesses the cache model hit (not charged).
    pub cache_hits: u64,
    /// Emulated latency charged so far, TSC cycles.
    pub charged_cycles: u64,
    /// TSC cycles spent spinning to pay the charge.
    pub paid_cycles: u64,
    /// Payments (spins).
    pub payments: u64,
    /// TSC cycles the host took the vCPU away during payments (not paid).
    pub preempted_cycles: u64,
    /// Of the charged accesses, those a model of the host's own LLC says
    /// it served (charged the host's DRAM minus LLC hit latency on top;
    /// only with `EmulationHeader::host_cache_bytes`), estimated from
    /// sampled sets.
    pub host_cache_hits: u64,
    /// Reserved, zero.
    pub _reserved: [u64; 2],
}

/// The latency-emulation region's header, at [`BootInfo::emulation_gpa`].
/// A charged access costs `max(0, loaded_ps[tier] - base)` with
/// `base = min(host DRAM latency, unloaded_ps[0])` (see
/// `emulation::charge_base_ps`).
/// The VMM writes the configuration and, every ~10 ms, each tier's loaded
/// latency; the guest writes `dram_ps`, `guest_state` and its `vcpus` slot.
///
/// The tier map at `tier_map_gpa` has 2 bits per guest page (page `p` is
/// bits `2 * (p % 32)` of `u64` word `p / 32`), the index of the tier the
/// page is on, updated by the VMM before a placement change becomes visible
/// to the guest. A page never placed reads 0; the runtime reads the map
/// after the access, when the fault that placed the page has published it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EmulationHeader {
    /// [`EMULATION_MAGIC`] (VMM).
    pub magic: u64,
    /// [`EMULATION_VERSION`] (VMM).
    pub version: u32,
    /// Tiers in use, 1..=[`EMULATION_MAX_TIERS`] (VMM).
    pub tier_count: u32,
    /// Guest-physical address of the tier map (VMM).
    pub tier_map_gpa: u64,
    /// Guest pages the map covers: guest RAM, `0..ram_size / 4096` (VMM).
    pub tier_map_pages: u64,
    /// Each tier's emulated unloaded latency, picoseconds (VMM).
    pub unloaded_ps: [u64; EMULATION_MAX_TIERS],
    /// Each tier's emulated loaded latency, picoseconds (VMM, every ~10 ms).
    pub loaded_ps: [u64; EMULATION_MAX_TIERS],
    /// Incremented by the VMM after every update of `loaded_ps`.
    pub loaded_generation: u64,
    /// A vCPU pays its accumulated charge once it exceeds this, ps (VMM).
    pub pay_threshold_ps: u64,
    /// Modeled cache capacity per vCPU in bytes, a power of two (0: no
    /// model, every access is charged) (VMM).
    pub cache_bytes: u64,
    /// Guest-physical address of the per-vCPU cache-model arrays, zeroed (VMM).
    pub cache_model_gpa: u64,
    /// Bytes of one vCPU's cache-model array, `cache_bytes / 16` (VMM).
    pub cache_model_stride: u64,
    /// Guest-physical address of the pointer-chase buffer, 2 MiB aligned (VMM).
    pub chase_gpa: u64,
    /// Bytes of the pointer-chase buffer, a power of two (VMM).
    pub chase_bytes: u64,
    /// Host DRAM latency the guest measured at boot, picoseconds (guest).
    pub dram_ps: u64,
    /// [`EMU_GUEST_IDLE`], [`EMU_GUEST_MEASURING`] or [`EMU_GUEST_CHARGING`] (guest).
    pub guest_state: u64,
    /// Dependent loads the DRAM measurement timed (guest).
    pub chase_hops: u64,
    /// Host DRAM latency to charge against, ps; the guest then does not
    /// measure (0: measure into `dram_ps` and charge against that) (VMM:
    /// `host-dram=`, or a comparison's first measurement).
    pub dram_fixed_ps: u64,
    /// 0 or 1: every access is charged (VMM: `sample=`). Above 1 (a power
    /// of two up to 64): a set-sampled cache model charges by set sampling
    /// alone; without one, the guest looks up and charges one cache-missing
    /// access in this many, each for this many. A vCPU whose workload pays
    /// per operation charges every access regardless.
    pub access_sample_period: u64,
    /// The host's LLC in bytes, a power of two, when the cache model is
    /// smaller (0: no host model). The guest then keeps a set-sampled model
    /// of it per vCPU and charges a cache-model miss that hits the host's
    /// LLC the host's DRAM minus LLC hit latency on top (VMM).
    pub host_cache_bytes: u64,
    /// Guest-physical address of the per-vCPU host LLC models, zeroed (VMM).
    pub host_cache_model_gpa: u64,
    /// Bytes of one vCPU's host LLC model (at most 64 KiB: its sampled
    /// sets) (VMM).
    pub host_cache_model_stride: u64,
    /// Host LLC hit latency the guest measured at boot, picoseconds (guest;
    /// only with `host_cache_bytes`).
    pub llc_hit_ps: u64,
    /// Charging on and off within the run (`ab=on`): the guest switches
    /// charging on and off every this many operations per vCPU and reports
    /// each half's operations and TSC cycles as result metrics
    /// (`emu_ab_on_ops`, `emu_ab_on_cycles`, `emu_ab_off_ops`,
    /// `emu_ab_off_cycles`), with the median over adjacent phase pairs of
    /// their op-time ratio (`emu_ab_pair_median`, `emu_ab_pairs`); 0: charge
    /// throughout (VMM).
    pub ab_phase_ops: u64,
    /// Reserved, zero.
    pub _reserved: [u64; 3],
    /// Per-vCPU counters (guest).
    pub vcpus: [EmulationVcpu; MAX_VCPUS],
}

/// The tier of guest page `page` in a tier map word array.
#[inline(always)]
pub fn tier_map_get(word: u64, page: u64) -> u64 {
    (word >> ((page % TIER_MAP_PAGES_PER_WORD) * 2)) & 3
}

/// `word` with guest page `page` set to `tier` (0..4).
#[inline]
pub fn tier_map_set(word: u64, page: u64, tier: u64) -> u64 {
    let shift = (page % TIER_MAP_PAGES_PER_WORD) * 2;
    (word & !(3 << shift)) | ((tier & 3) << shift)
}

/// Bytes of the tier map for `pages` guest pages.
pub fn tier_map_bytes(pages: u64) -> u64 {
    pages.div_ceil(TIER_MAP_PAGES_PER_WORD) * 8
}

const _: () = assert!(core::mem::size_of::<EmulationVcpu>() == 128);
const _: () = assert!(core::mem::size_of::<EmulationHeader>() as u64 <= EMULATION_HEADER_SIZE);
const _: () = assert!(core::mem::offset_of!(EmulationHeader, vcpus) == 256);
const _: () = assert!(core::mem::size_of::<StatusPage>() as u64 <= STATUS_SIZE);
const _: () = assert!(core::mem::size_of::<BootInfo>() <= 4096);
const _: () = assert!(core::mem::size_of::<VcpuStatus>() == 64);
const _: () = assert!(STATUS_GPA + STATUS_SIZE <= PAGE_TABLES_GPA);
const _: () = assert!(BOOT_INFO_GPA + 4096 <= STATUS_GPA);

/// Where a vCPU is in its workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Phase {
    /// Entered, not yet set up.
    Boot = 0,
    /// Building the data set (not counted in throughput).
    Init = 1,
    /// Running the measured workload.
    Run = 2,
    /// Verifying results (memcheck).
    Verify = 3,
    /// Finished; about to exit.
    Done = 4,
}

impl Phase {
    /// Decodes a guest-written value; unknown values are `None`.
    pub fn from_u64(v: u64) -> Option<Self> {
        Some(match v {
            0 => Self::Boot,
            1 => Self::Init,
            2 => Self::Run,
            3 => Self::Verify,
            4 => Self::Done,
            _ => return None,
        })
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Boot => "boot",
            Self::Init => "init",
            Self::Run => "run",
            Self::Verify => "verify",
            Self::Done => "done",
        }
    }
}

/// Offset of the `stop_request` field within [`StatusPage`].
pub const STATUS_STOP_OFFSET: u64 = 8;
/// Offset of `vcpus[0]` within [`StatusPage`].
pub const STATUS_VCPUS_OFFSET: u64 = 64;

/// Copies `s` into a NUL-padded fixed buffer; `None` if it does not fit.
pub fn to_fixed<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() > N || b.contains(&0) {
        return None;
    }
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// The text of a NUL-padded buffer, if it is valid UTF-8 up to its first NUL.
pub fn from_fixed(buf: &[u8]) -> Option<&str> {
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    core::str::from_utf8(&buf[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_match_constants() {
        assert_eq!(
            core::mem::offset_of!(StatusPage, stop_request) as u64,
            STATUS_STOP_OFFSET
        );
        assert_eq!(
            core::mem::offset_of!(StatusPage, vcpus) as u64,
            STATUS_VCPUS_OFFSET
        );
    }

    #[test]
    fn tier_map_words_hold_32_pages_of_2_bits() {
        let mut w = 0u64;
        for p in 0..32 {
            w = tier_map_set(w, p, p % 4);
        }
        for p in 0..32 {
            assert_eq!(tier_map_get(w, p), p % 4);
            assert_eq!(tier_map_get(w, p + 32), p % 4, "page index wraps per word");
        }
        let w2 = tier_map_set(w, 5, 0);
        assert_eq!(tier_map_get(w2, 5), 0);
        assert_eq!(w2 ^ w, 1 << 10, "only page 5's bits change");
        assert_eq!(tier_map_bytes(33), 16);
        assert_eq!(tier_map_bytes(32), 8);
    }

    #[test]
    fn fixed_strings_round_trip_and_reject() {
        let f: [u8; 8] = to_fixed("wss").unwrap();
        assert_eq!(from_fixed(&f), Some("wss"));
        assert!(to_fixed::<2>("wss").is_none());
        assert!(to_fixed::<8>("a\0b").is_none());
        assert_eq!(from_fixed(&[0xff, 0xfe]), None);
        assert_eq!(from_fixed(b"ab"), Some("ab"));
    }
}
