//! The emulation region: guest memory the VMM maps above guest RAM, in its
//! own memory slot (never tiered, never tracked, so no policy sees or moves
//! it), holding the [`EmulationHeader`], the tier map, the guest's per-vCPU
//! cache models and the pointer-chase buffer of the boot measurement.
//!
//! ```text
//!  base (2 MiB aligned, = end of RAM)
//!  | header (16 KiB) | tier map | cache models (vCPUs x stride) | host LLC models | .. | chase buffer (2 MiB aligned) |
//! ```
//!
//! The guest writes parts of it at any time: everything the VMM reads back
//! goes through atomic loads and is validated by the caller.

use std::sync::atomic::{AtomicU64, Ordering};

use tiering::mem::PAGE_SIZE;
use tiering::sys::{self, Advice, Mapping};
use tiervm_guest::abi::{
    tier_map_bytes, EmulationHeader, EmulationVcpu, CACHE_MODEL_WAYS, EMULATION_HEADER_SIZE,
    EMULATION_MAGIC, EMULATION_MAX_TIERS, EMULATION_VERSION, EMU_GUEST_CHARGING, GUEST_LARGE_PAGE,
    MAX_VCPUS,
};

use super::config::EmulationConfig;
use super::EmulationError;

/// Pointer-chase buffer bounds (at least twice the host LLC, a power of two).
pub const CHASE_BYTES_RANGE: (u64, u64) = (64 << 20, 512 << 20);

/// Where everything lies in the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionLayout {
    /// Guest-physical address of the region (= guest RAM size).
    pub base: u64,
    /// Bytes of the region (a multiple of 2 MiB).
    pub len: u64,
    /// Guest pages the tier map covers.
    pub ram_pages: u64,
    /// Offset of the tier map.
    pub map_off: u64,
    /// Bytes of the tier map.
    pub map_bytes: u64,
    /// Offset of vCPU 0's cache model.
    pub cache_off: u64,
    /// Bytes of one vCPU's cache model (0: no model).
    pub cache_stride: u64,
    /// The host's LLC the guest models besides its cache model, bytes (0:
    /// none).
    pub host_cache_bytes: u64,
    /// Offset of vCPU 0's host LLC model.
    pub host_cache_off: u64,
    /// Bytes of one vCPU's host LLC model: its sampled sets (0: none).
    pub host_cache_stride: u64,
    /// Offset of the chase buffer (2 MiB aligned).
    pub chase_off: u64,
    /// Bytes of the chase buffer.
    pub chase_bytes: u64,
}

/// Bytes of a cache model of `llc_bytes` (4-way sets of 16-bit tags:
/// 8 bytes per 4 lines of 64 bytes).
pub fn cache_model_bytes(llc_bytes: u64) -> u64 {
    llc_bytes / 64 / CACHE_MODEL_WAYS * 8
}

/// The chase buffer for a host whose LLC is `host_llc` bytes.
pub fn chase_bytes_for(host_llc: u64) -> u64 {
    host_llc
        .saturating_mul(2)
        .next_power_of_two()
        .clamp(CHASE_BYTES_RANGE.0, CHASE_BYTES_RANGE.1)
}

impl RegionLayout {
    /// The layout above `ram_size` bytes of RAM for `vcpus` vCPUs, with a
    /// cache model of `llc_bytes` and, if `host_cache_bytes` is not 0, a
    /// model of the host's LLC of that size (only its sampled sets).
    pub fn new(
        ram_size: u64,
        vcpus: u32,
        llc_bytes: u64,
        chase_bytes: u64,
        host_cache_bytes: u64,
    ) -> Self {
        let page = PAGE_SIZE as u64;
        let ram_pages = ram_size / page;
        let map_off = EMULATION_HEADER_SIZE;
        let map_bytes = tier_map_bytes(ram_pages);
        let cache_off = (map_off + map_bytes).next_multiple_of(page);
        let cache_stride = cache_model_bytes(llc_bytes);
        let host_cache_off = (cache_off + u64::from(vcpus) * cache_stride).next_multiple_of(page);
        let host_cache_stride = cache_model_bytes(host_cache_bytes)
            .min(u64::from(tiervm_guest::emulation::SAMPLED_SETS_MAX) * 8);
        let chase_off = (host_cache_off + u64::from(vcpus) * host_cache_stride)
            .next_multiple_of(GUEST_LARGE_PAGE);
        let len = (chase_off + chase_bytes).next_multiple_of(GUEST_LARGE_PAGE);
        Self {
            base: ram_size.next_multiple_of(GUEST_LARGE_PAGE),
            len,
            ram_pages,
            map_off,
            map_bytes,
            cache_off,
            cache_stride,
            host_cache_bytes: if host_cache_stride == 0 {
                0
            } else {
                host_cache_bytes
            },
            host_cache_off,
            host_cache_stride,
            chase_off,
            chase_bytes,
        }
    }

    /// One past the region's last guest-physical byte.
    pub fn end(&self) -> u64 {
        self.base + self.len
    }
}

/// The region's host mapping and layout.
#[derive(Debug)]
pub struct EmulationRegion {
    layout: RegionLayout,
    /// The mapping every view below points into; lives as long as `self`.
    map: Mapping,
}

/// Operations per vCPU each phase of `ab=on` runs (charging, then not, in
/// turn): ~0.5 ms of gups, ~6 ms of kv on our hosts, so a 3 s run has
/// hundreds of phases of each kind.
pub const AB_PHASE_OPS: u64 = 16_384;

/// Byte offset of a field of the header.
macro_rules! off {
    ($($f:tt)+) => {
        core::mem::offset_of!(EmulationHeader, $($f)+) as u64
    };
}

impl EmulationRegion {
    /// Maps the region (nothing committed until touched; huge pages
    /// advised) and writes the header for `cfg` with `tiers` tiers.
    pub fn new(
        layout: RegionLayout,
        cfg: &EmulationConfig,
        tiers: usize,
    ) -> Result<Self, EmulationError> {
        let len = usize::try_from(layout.len)
            .map_err(|_| EmulationError::TooLarge { end: layout.end() })?;
        let map = Mapping::reserve(len).map_err(EmulationError::Map)?;
        // THP only matters for the chase's TLB behaviour; a refusal is fine.
        let _ = map.advise(map.addr(), map.len(), Advice::HugePage);
        let tiers = tiers.clamp(1, EMULATION_MAX_TIERS);
        let ps = |ns: f64| (ns * 1e3).round() as u64;
        let mut unloaded = [0u64; EMULATION_MAX_TIERS];
        for (u, t) in unloaded.iter_mut().zip(&cfg.tiers) {
            *u = ps(t.latency_ns);
        }
        // Tiers beyond the configured ones (none today) get the slowest latency.
        for i in cfg.tiers.len()..EMULATION_MAX_TIERS {
            unloaded[i] = unloaded[cfg.tiers.len().saturating_sub(1)];
        }
        let header = EmulationHeader {
            magic: EMULATION_MAGIC,
            version: EMULATION_VERSION,
            tier_count: tiers as u32,
            tier_map_gpa: layout.base + layout.map_off,
            tier_map_pages: layout.ram_pages,
            unloaded_ps: unloaded,
            loaded_ps: unloaded,
            loaded_generation: 0,
            pay_threshold_ps: ps(cfg.pay_ns),
            cache_bytes: if layout.cache_stride == 0 {
                0
            } else {
                cfg.llc_bytes
            },
            cache_model_gpa: layout.base + layout.cache_off,
            cache_model_stride: layout.cache_stride,
            chase_gpa: layout.base + layout.chase_off,
            chase_bytes: layout.chase_bytes,
            dram_ps: 0,
            guest_state: 0,
            chase_hops: 0,
            dram_fixed_ps: cfg.host_dram_ns.map_or(0, ps),
            access_sample_period: u64::from(cfg.sample_period),
            host_cache_bytes: layout.host_cache_bytes,
            host_cache_model_gpa: layout.base + layout.host_cache_off,
            host_cache_model_stride: layout.host_cache_stride,
            llc_hit_ps: 0,
            ab_phase_ops: if cfg.ab { AB_PHASE_OPS } else { 0 },
            _reserved: [0; 3],
            vcpus: [EmulationVcpu::default(); MAX_VCPUS],
        };
        // SAFETY: the mapping is fresh, ours, at least EMULATION_HEADER_SIZE
        // bytes and page aligned (so aligned for the header); no guest runs
        // on it yet.
        unsafe { (map.addr() as *mut EmulationHeader).write_volatile(header) };
        Ok(Self { layout, map })
    }

    /// The layout.
    pub fn layout(&self) -> &RegionLayout {
        &self.layout
    }

    /// The host address of the region (for the memory slot).
    pub fn host_addr(&self) -> u64 {
        self.map.addr() as u64
    }

    /// The 64-bit word at byte offset `off` (8-aligned, inside the region).
    fn word(&self, off: u64) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.layout.len,
            "emulation region offset {off}"
        );
        // SAFETY: in bounds and 8-aligned (checked above) inside our mapping,
        // which lives as long as `&self`. The guest shares the memory; the
        // VMM only ever accesses it atomically, and AtomicU64 has no invalid
        // bit patterns.
        unsafe { &*((self.map.addr() as u64 + off) as *const AtomicU64) }
    }

    /// The tier map, 32 pages per word.
    pub fn tier_map(&self) -> &[AtomicU64] {
        let words = (self.layout.map_bytes / 8) as usize;
        // SAFETY: as for `word`: the map lies inside the mapping (layout),
        // 8-aligned, and is accessed atomically only.
        unsafe {
            std::slice::from_raw_parts(
                (self.map.addr() as u64 + self.layout.map_off) as *const AtomicU64,
                words,
            )
        }
    }

    /// Publishes each tier's loaded latency (ps) and bumps the generation.
    pub fn publish_loaded(&self, loaded_ps: &[u64]) {
        for (t, ps) in loaded_ps.iter().take(EMULATION_MAX_TIERS).enumerate() {
            self.word(off!(loaded_ps) + 8 * t as u64)
                .store(*ps, Ordering::Relaxed);
        }
        self.word(off!(loaded_generation))
            .fetch_add(1, Ordering::Release);
    }

    /// Each tier's loaded latency as last published, ps.
    pub fn loaded_ps(&self, tier: usize) -> u64 {
        self.word(off!(loaded_ps) + 8 * tier.min(EMULATION_MAX_TIERS - 1) as u64)
            .load(Ordering::Relaxed)
    }

    /// vCPU `i`'s counters as the guest last published them (untrusted).
    pub fn vcpu_counters(&self, i: usize) -> EmulationVcpu {
        let base = off!(vcpus) + (i.min(MAX_VCPUS - 1) * size_of::<EmulationVcpu>()) as u64;
        let f = |o: usize| self.word(base + o as u64).load(Ordering::Relaxed);
        let mut v = EmulationVcpu::default();
        for t in 0..EMULATION_MAX_TIERS {
            v.accesses[t] = f(core::mem::offset_of!(EmulationVcpu, accesses) + 8 * t);
            v.writes[t] = f(core::mem::offset_of!(EmulationVcpu, writes) + 8 * t);
        }
        v.cache_hits = f(core::mem::offset_of!(EmulationVcpu, cache_hits));
        v.charged_cycles = f(core::mem::offset_of!(EmulationVcpu, charged_cycles));
        v.paid_cycles = f(core::mem::offset_of!(EmulationVcpu, paid_cycles));
        v.payments = f(core::mem::offset_of!(EmulationVcpu, payments));
        v.preempted_cycles = f(core::mem::offset_of!(EmulationVcpu, preempted_cycles));
        v.host_cache_hits = f(core::mem::offset_of!(EmulationVcpu, host_cache_hits));
        v
    }

    /// The host DRAM latency the guest measured, ps (0: not yet, or the
    /// guest does not charge; untrusted).
    pub fn dram_ps(&self) -> u64 {
        self.word(off!(dram_ps)).load(Ordering::Acquire)
    }

    /// The host LLC hit latency the guest measured, ps (0: not measured;
    /// untrusted).
    pub fn llc_hit_ps(&self) -> u64 {
        self.word(off!(llc_hit_ps)).load(Ordering::Acquire)
    }

    /// Dependent loads the guest's measurement timed (untrusted).
    pub fn chase_hops(&self) -> u64 {
        self.word(off!(chase_hops)).load(Ordering::Relaxed)
    }

    /// Whether the guest finished its boot measurement and charges.
    pub fn guest_charging(&self) -> bool {
        self.word(off!(guest_state)).load(Ordering::Acquire) == EMU_GUEST_CHARGING
    }

    /// Gives the chase buffer's host memory back (after the boot
    /// measurement; a later guest touch just sees zeros).
    pub fn release_chase(&self) -> std::io::Result<()> {
        let at = self.map.addr() + self.layout.chase_off as usize;
        let len = self.layout.chase_bytes as usize;
        if !self.map.contains_range(at, len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the chase buffer is not inside the emulation region's mapping",
            ));
        }
        // SAFETY: the chase buffer lies inside `self.map` (checked above), a private
        // anonymous mapping this region owns and keeps mapped while `&self` lives; the VMM holds no reference
        // into the chase buffer (only the header words and the tier map, elsewhere in
        // the region, are handed out, and only as atomics); and its content is the
        // guest's finished boot measurement, which nobody needs any more.
        unsafe { sys::discard(at, len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_above_ram() {
        let l = RegionLayout::new(1 << 30, 2, 32 << 20, 64 << 20, 0);
        assert_eq!(l.base, 1 << 30);
        assert_eq!(l.ram_pages, 262_144);
        assert_eq!(l.map_bytes, 262_144 / 32 * 8);
        assert_eq!(l.cache_stride, 1 << 20, "32 MiB model: 1 MiB of tags");
        assert_eq!(l.cache_off % 4096, 0);
        assert!(l.cache_off >= l.map_off + l.map_bytes);
        assert_eq!(l.chase_off % GUEST_LARGE_PAGE, 0);
        assert!(l.chase_off >= l.cache_off + 2 * l.cache_stride);
        assert_eq!(l.len % GUEST_LARGE_PAGE, 0);
        assert!(l.chase_off + l.chase_bytes <= l.len);
        assert_eq!(chase_bytes_for(32 << 20), 64 << 20);
        assert_eq!(chase_bytes_for(48 << 20), 128 << 20);
        assert_eq!(chase_bytes_for(1 << 40), 512 << 20);
        assert_eq!((l.host_cache_bytes, l.host_cache_stride), (0, 0));
        // A 256 KiB model on a 32 MiB host: the host model's 4096 sampled
        // sets (32 KiB) per vCPU, between the models and the chase buffer.
        let h = RegionLayout::new(1 << 30, 2, 256 << 10, 64 << 20, 32 << 20);
        assert_eq!(h.cache_stride, 8 << 10);
        assert_eq!(
            (h.host_cache_bytes, h.host_cache_stride),
            (32 << 20, 32 << 10)
        );
        assert_eq!(h.host_cache_off % 4096, 0);
        assert!(h.host_cache_off >= h.cache_off + 2 * h.cache_stride);
        assert!(h.chase_off >= h.host_cache_off + 2 * h.host_cache_stride);
    }

    #[test]
    fn header_is_written_and_loaded_latency_republished() {
        let cfg = EmulationConfig::parse("fast=80ns,slow=250ns").unwrap();
        let l = RegionLayout::new(64 << 20, 1, cfg.llc_bytes, 64 << 20, 0);
        let r = EmulationRegion::new(l, &cfg, 2).unwrap();
        // SAFETY: test: reading the header the region just wrote.
        let h = unsafe { (r.host_addr() as *const EmulationHeader).read_volatile() };
        assert_eq!(h.magic, EMULATION_MAGIC);
        assert_eq!(h.tier_count, 2);
        assert_eq!(h.unloaded_ps[..2], [80_000, 250_000]);
        assert_eq!(h.tier_map_gpa, (64 << 20) + EMULATION_HEADER_SIZE);
        assert_eq!(h.pay_threshold_ps, 1_000_000);
        r.publish_loaded(&[90_000, 300_000]);
        assert_eq!((r.loaded_ps(0), r.loaded_ps(1)), (90_000, 300_000));
        // SAFETY: as above.
        let h = unsafe { (r.host_addr() as *const EmulationHeader).read_volatile() };
        assert_eq!(h.loaded_generation, 1);
        assert_eq!(r.vcpu_counters(0).accesses, [0; 4]);
        assert!(!r.guest_charging());
        r.release_chase().unwrap();
    }
}
