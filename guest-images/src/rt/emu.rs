//! The runtime's side of latency emulation: attaches each vCPU to the
//! region the VMM published ([`BootInfo::emulation_gpa`]), measures the host
//! DRAM latency once at boot (vCPU 0, a pointer chase; the others wait), and
//! keeps the vCPU's [`Charger`] and its published counters up to date.
//! The charging itself is [`crate::emulation`].

use core::cell::Cell;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::abi::{
    self, BootInfo, EmulationHeader, EmulationVcpu, EMULATION_MAX_TIERS, EMU_GUEST_CHARGING,
    EMU_GUEST_MEASURING, MAX_VCPUS,
};
use crate::emulation::{
    ab_median_ratio, build_chase, charge_base_ps, charge_fixed, chase, CacheModel, Charger,
    ChargingAb, AB_BINS, FRAC_BITS, LLC_HIT_IMPLAUSIBLE, LLC_HIT_PS_RANGE,
};

use super::{rdtsc, rdtsc_ordered};

/// A clock step this long inside a payment means the host did not run the
/// vCPU (a spin iteration takes tens of ns; a host interrupt a few us).
const PREEMPTION_GAP_US: u64 = 20;
/// Passes of the boot measurement (the fastest counts).
const CHASE_PASSES: u32 = 2;
/// Most loads one pass times: 2^21 lines (128 MiB of a larger buffer),
/// ~0.3 s at DRAM latency, so that a 512 MiB buffer (a host with a 300 MiB
/// LLC) does not take seconds of a run's time.
const CHASE_PASS_HOPS: u64 = 1 << 21;
/// Bounds on a plausible DRAM latency measurement, ps (10 ns .. 10 us).
const DRAM_PS_RANGE: core::ops::RangeInclusive<u64> = 10_000..=10_000_000;

/// One vCPU's emulation state.
pub(crate) struct GuestEmulation {
    header: *mut EmulationHeader,
    slot: *mut EmulationVcpu,
    charger: Charger<'static>,
    generation: Cell<u64>,
    /// What charges subtract: [`charge_base_ps`].
    base_ps: u64,
    tsc_khz: u64,
    tier_count: usize,
    /// Charging on and off within the run (`ab=on`).
    ab: Option<ChargingAb>,
}

/// The halves of `ab=on`, summed over vCPUs: operations and TSC cycles
/// charging, then not charging.
static AB_HALVES: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// The `ab=on` pairs per ratio bin, summed over vCPUs.
static AB_PAIRS: [AtomicU64; AB_BINS] = [const { AtomicU64::new(0) }; AB_BINS];

/// Reads a field of the header the VMM may write concurrently.
macro_rules! hread {
    ($h:expr, $($f:tt)+) => {
        // SAFETY: `$h` points at the VMM's emulation header (mapped guest
        // memory for the whole run); volatile because the VMM writes it.
        unsafe { core::ptr::addr_of!((*$h).$($f)+).read_volatile() }
    };
}

/// Writes a field of the header (one of the guest's).
macro_rules! hwrite {
    ($h:expr, $v:expr, $($f:tt)+) => {
        // SAFETY: as for `hread`; the guest owns the fields it writes.
        unsafe { core::ptr::addr_of_mut!((*$h).$($f)+).write_volatile($v) }
    };
}

impl GuestEmulation {
    /// Attaches vCPU `vcpu` to the region, if the VMM published one; vCPU 0
    /// measures host DRAM latency first while the others wait for it.
    /// `None`: no emulation (or a header this runtime does not understand).
    pub(crate) fn attach(boot: &'static BootInfo, vcpu: u32) -> Option<Self> {
        let (h, tier_count) = published_header(boot)?;
        measure_or_wait(h, boot, vcpu);
        let map = tier_map(h);
        let cache = cache_model(h, vcpu);
        let i = (vcpu as usize).min(MAX_VCPUS - 1);
        let tsc_khz = boot.tsc_khz.max(1);
        let dram_ps = match hread!(h, dram_fixed_ps) {
            0 => hread!(h, dram_ps),
            fixed => fixed,
        };
        let charger = Charger::new(map, hread!(h, tier_map_pages), cache, rdtsc_ordered);
        let charger = with_host_cache(charger, h, vcpu, dram_ps, tsc_khz);
        let e = Self {
            header: h,
            // SAFETY: in bounds of the header's vCPU slots.
            slot: unsafe { core::ptr::addr_of_mut!((*h).vcpus[i]) },
            charger,
            generation: Cell::new(u64::MAX),
            base_ps: charge_base_ps(dram_ps, hread!(h, unloaded_ps[0])),
            tsc_khz,
            tier_count,
            ab: match hread!(h, ab_phase_ops) {
                0 => None,
                n => Some(ChargingAb::new(n)),
            },
        };
        e.refresh();
        e.set_gap();
        e.charger
            .set_access_sampling(u32::try_from(hread!(h, access_sample_period)).unwrap_or(1));
        Some(e)
    }

    /// The charger (per access).
    #[inline(always)]
    pub(crate) fn charger(&self) -> &Charger<'static> {
        &self.charger
    }

    /// Publishes the counters and picks up new loaded latencies (every few
    /// hundred operations, `ops` done so far). Returns whether the vCPU
    /// charges until the next publication (`ab=on` switches it off and on).
    pub(crate) fn sync(&self, ops: u64) -> bool {
        self.publish();
        self.ab.as_ref().is_none_or(|ab| ab.at(ops, rdtsc()))
    }

    /// Publishes the counters and picks up new loaded latencies.
    pub(crate) fn publish(&self) {
        let c = self.charger.counters();
        // SAFETY: this vCPU's own slot of the header.
        unsafe { self.slot.write_volatile(c) };
        self.refresh();
    }

    /// Adds this vCPU's `ab=on` halves to the run's (at its end).
    pub(crate) fn add_ab_halves(&self) {
        if let Some(ab) = &self.ab {
            let ((on_ops, on_c), (off_ops, off_c)) = ab.halves();
            for (a, v) in AB_HALVES.iter().zip([on_ops, on_c, off_ops, off_c]) {
                a.fetch_add(v, Ordering::AcqRel);
            }
            for (a, v) in AB_PAIRS.iter().zip(ab.pair_bins()) {
                a.fetch_add(u64::from(v), Ordering::AcqRel);
            }
        }
    }

    /// Whether `ab=on` ran, and the run's halves as result metrics.
    pub(crate) fn ab_metrics(&self) -> Option<[(&'static str, f64); 6]> {
        self.ab.as_ref()?;
        let v = |i: usize| AB_HALVES[i].load(Ordering::Acquire) as f64;
        let mut bins = [0u64; AB_BINS];
        for (b, a) in bins.iter_mut().zip(&AB_PAIRS) {
            *b = a.load(Ordering::Acquire);
        }
        let (median, pairs) = ab_median_ratio(&bins).unwrap_or((0.0, 0));
        Some([
            ("emu_ab_on_ops", v(0)),
            ("emu_ab_on_cycles", v(1)),
            ("emu_ab_off_ops", v(2)),
            ("emu_ab_off_cycles", v(3)),
            ("emu_ab_pair_median", median),
            ("emu_ab_pairs", pairs as f64),
        ])
    }

    /// Recomputes the charges when the VMM published new loaded latencies.
    fn refresh(&self) {
        let h = self.header;
        let g = hread!(h, loaded_generation);
        if g == self.generation.get() {
            return;
        }
        self.generation.set(g);
        let mut charges = [0u64; EMULATION_MAX_TIERS];
        for (t, c) in charges.iter_mut().enumerate().take(self.tier_count) {
            *c = charge_fixed(hread!(h, loaded_ps[t]), self.base_ps, self.tsc_khz);
        }
        let threshold =
            charge_fixed(hread!(h, pay_threshold_ps), 0, self.tsc_khz).max(1 << FRAC_BITS);
        self.charger.set_charges(charges, threshold);
    }

    /// The clock step beyond which a payment's spin counts as preempted.
    fn set_gap(&self) {
        self.charger
            .set_preemption_gap(self.tsc_khz.saturating_mul(PREEMPTION_GAP_US) / 1000);
    }
}

/// The emulation header `boot` points at and its tier count, if the VMM
/// published one this runtime understands.
fn published_header(boot: &BootInfo) -> Option<(*mut EmulationHeader, usize)> {
    let gpa = boot.emulation_gpa;
    if gpa == 0 || !gpa.is_multiple_of(4096) || gpa < boot.ram_size {
        return None;
    }
    let h = gpa as *mut EmulationHeader;
    let tier_count = hread!(h, tier_count) as usize;
    if hread!(h, magic) != abi::EMULATION_MAGIC
        || hread!(h, version) != abi::EMULATION_VERSION
        || !(1..=EMULATION_MAX_TIERS).contains(&tier_count)
    {
        return None;
    }
    Some((h, tier_count))
}

/// vCPU 0 measures the host latencies (DRAM unless fixed, the LLC hit with
/// a host cache model) and starts charging; the others wait for it.
fn measure_or_wait(h: *mut EmulationHeader, boot: &BootInfo, vcpu: u32) {
    if vcpu == 0 {
        hwrite!(h, EMU_GUEST_MEASURING, guest_state);
        // With a fixed host DRAM latency (`host-dram=`, a comparison's
        // later runs) DRAM is not measured.
        if hread!(h, dram_fixed_ps) == 0 {
            measure_dram(h, boot.tsc_khz.max(1));
        }
        if hread!(h, host_cache_bytes) != 0 {
            measure_llc_hit(h, boot.tsc_khz.max(1));
        }
        core::sync::atomic::fence(Ordering::Release);
        hwrite!(h, EMU_GUEST_CHARGING, guest_state);
    } else {
        while hread!(h, guest_state) != EMU_GUEST_CHARGING {
            core::hint::spin_loop();
        }
    }
    core::sync::atomic::fence(Ordering::Acquire);
}

/// The tier map the header points at.
fn tier_map(h: *mut EmulationHeader) -> &'static [AtomicU64] {
    let words = abi::tier_map_bytes(hread!(h, tier_map_pages)) / 8;
    // SAFETY: the VMM maps the tier map (words x 8 bytes at
    // `tier_map_gpa`) for the whole run and only writes it atomically;
    // AtomicU64 has no invalid bit patterns.
    unsafe {
        core::slice::from_raw_parts(hread!(h, tier_map_gpa) as *const AtomicU64, words as usize)
    }
}

/// vCPU `vcpu`'s cache model, if the header has one.
fn cache_model(h: *mut EmulationHeader, vcpu: u32) -> Option<CacheModel<'static>> {
    let stride = hread!(h, cache_model_stride);
    if hread!(h, cache_bytes) == 0 || stride == 0 {
        None
    } else {
        let at = hread!(h, cache_model_gpa) + u64::from(vcpu) * stride;
        // SAFETY: the VMM reserved `stride` zeroed bytes per vCPU at
        // `cache_model_gpa`; only this vCPU touches its own array.
        let sets =
            unsafe { core::slice::from_raw_parts(at as *const AtomicU64, (stride / 8) as usize) };
        CacheModel::new(sets)
    }
}

/// `charger` with vCPU `vcpu`'s host-LLC model, if the header has one and
/// the measured LLC hit latency is plausible and below `dram_ps`.
fn with_host_cache(
    charger: Charger<'static>,
    h: *mut EmulationHeader,
    vcpu: u32,
    dram_ps: u64,
    tsc_khz: u64,
) -> Charger<'static> {
    let (host_bytes, host_stride) = (
        hread!(h, host_cache_bytes),
        hread!(h, host_cache_model_stride),
    );
    let llc_ps = hread!(h, llc_hit_ps);
    if host_bytes != 0 && host_stride != 0 && LLC_HIT_PS_RANGE.contains(&llc_ps) && dram_ps > llc_ps
    {
        let at = hread!(h, host_cache_model_gpa) + u64::from(vcpu) * host_stride;
        // SAFETY: the VMM reserved `host_cache_model_stride` zeroed bytes
        // per vCPU at `host_cache_model_gpa`; only this vCPU touches its
        // own array.
        let sets = unsafe {
            core::slice::from_raw_parts(at as *const AtomicU64, (host_stride / 8) as usize)
        };
        let host_sets = host_bytes / abi::CACHE_LINE / abi::CACHE_MODEL_WAYS;
        charger.with_host_cache(sets, host_sets, charge_fixed(dram_ps, llc_ps, tsc_khz))
    } else {
        charger
    }
}

/// vCPU 0 at boot: times dependent loads over the chase buffer (every line
/// once, in an order no prefetcher follows, larger than the caches) and
/// publishes the mean as the host DRAM latency.
fn measure_dram(h: *mut EmulationHeader, tsc_khz: u64) {
    let words = (hread!(h, chase_bytes) / 8) as usize;
    // SAFETY: the VMM reserved `chase_bytes` at `chase_gpa` for this
    // measurement; nothing else uses it while vCPU 0 measures.
    let buf =
        unsafe { core::slice::from_raw_parts(hread!(h, chase_gpa) as *const AtomicU64, words) };
    // The buffer is twice the LLC, so no pass hits lines of the previous.
    let (ps, hops) = fastest_chase_ps(buf, tsc_khz);
    // An implausible measurement charges the full tier latency (as if the
    // host's DRAM cost nothing) rather than a wrong difference.
    let ps = if DRAM_PS_RANGE.contains(&ps) { ps } else { 0 };
    hwrite!(h, ps, dram_ps);
    hwrite!(h, hops, chase_hops);
}

/// vCPU 0 at boot, when the VMM asks for a host LLC model: times dependent
/// loads over a quarter of the host's LLC (the start of the chase buffer),
/// which linking it brought into the cache, and publishes the fastest pass
/// as the host's LLC hit latency ([`LLC_HIT_IMPLAUSIBLE`] if implausible:
/// no host model).
fn measure_llc_hit(h: *mut EmulationHeader, tsc_khz: u64) {
    let bytes = (hread!(h, host_cache_bytes) / 4).min(hread!(h, chase_bytes));
    // SAFETY: as in `measure_dram`: the VMM's chase buffer, `chase_bytes`
    // long, used by vCPU 0 alone while it measures.
    let buf = unsafe {
        core::slice::from_raw_parts(
            hread!(h, chase_gpa) as *const AtomicU64,
            (bytes / 8) as usize,
        )
    };
    // Linking the cycle writes every line: the passes find them cached.
    let (ps, _) = fastest_chase_ps(buf, tsc_khz);
    let ps = if LLC_HIT_PS_RANGE.contains(&ps) {
        ps
    } else {
        LLC_HIT_IMPLAUSIBLE
    };
    hwrite!(h, ps, llc_hit_ps);
}

/// Links `buf` into one chase cycle and times [`CHASE_PASSES`] passes along
/// it, each over the whole cycle or [`CHASE_PASS_HOPS`] lines, whichever
/// is fewer, the next going on where the last ended (so a pass over part of
/// a large buffer never revisits the lines of the one before): the fastest
/// pass's picoseconds per load, the one least disturbed by the host
/// (`u64::MAX` for an empty buffer), and the loads timed.
fn fastest_chase_ps(buf: &[AtomicU64], tsc_khz: u64) -> (u64, u64) {
    let lines = build_chase(buf);
    let hops = lines.min(CHASE_PASS_HOPS);
    let (mut ps, mut at) = (u64::MAX, 0);
    for _ in 0..CHASE_PASSES {
        if hops == 0 {
            break;
        }
        let t0 = rdtsc();
        at = chase(buf, at, hops);
        let cycles = rdtsc().wrapping_sub(t0);
        core::hint::black_box(at);
        let pass = u128::from(cycles) * 1_000_000_000 / (u128::from(hops) * u128::from(tsc_khz));
        ps = ps.min(u64::try_from(pass).unwrap_or(u64::MAX));
    }
    (ps, hops * u64::from(CHASE_PASSES))
}
