//! Latency emulation in live VMs (`--emulate-latency`, docs/emulation.md):
//! the guest charges each access by the tier the VMM's map gives its page,
//! the map follows migrations, Colloid reads the emulation's model, nothing
//! of it exists without the flag, and a guest that ignores or scribbles
//! over the region cannot hurt the VMM.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{kvm_available, request, run, run_with};
use tiervm_guest::abi::{BootInfo, BOOT_INFO_GPA};
use vm_memory::{Bytes, GuestAddress};
use vmm_core::config::VmRequest;
use vmm_core::runner::{RunHooks, SampleCtx};
use vmm_core::tiering_config::{PlacementArg, PolicyArg};

const MEM: u64 = 64 << 20;

/// zipf over 16 MiB, every access charged (no cache model): +100 ns on a
/// fast page, +500 ns on a slow one.
fn zipf(placement: PlacementArg, fast: u64, policy: PolicyArg, secs: u64) -> VmRequest {
    let mut r = request(
        "zipf",
        MEM,
        1,
        Duration::from_secs(secs),
        &["rss=16M", "wss=16M"],
    );
    r.tiering.fast = Some(fast);
    r.tiering.policy = Some(policy);
    r.tiering.placement = placement;
    // Charged against a fixed host DRAM latency (the guest still measures
    // it): a loaded host's measurement must not zero the charges.
    r.emulate_latency = Some("fast=200ns,slow=600ns,llc=0,host-dram=100ns".into());
    r
}

/// Every access is charged on the tier its page is on: all slow when every
/// page starts slow, all fast when the fast tier holds the guest. (Fails
/// if the tier map is not written: every page would read tier 0.)
#[test]
fn accesses_are_charged_on_their_pages_tier() {
    if !kvm_available("accesses_are_charged_on_their_pages_tier") {
        return;
    }
    let (slow, _) = run(&zipf(
        PlacementArg::SlowFirst,
        16 << 20,
        PolicyArg::Static,
        2,
    ));
    let e = slow.emulation.as_ref().expect("an emulation report");
    assert_eq!(e.label, "emulated latency: fast 200 ns, slow 600 ns");
    assert_eq!(e.charge_ns, vec![100.0, 500.0]);
    assert_eq!(e.accesses[0], 0, "no page is fast: {e:?}");
    assert!(e.accesses[1] > 1_000, "{e:?}");
    assert_eq!(e.cache_hits, 0, "llc=0: no cache model");
    assert_eq!(e.host_dram_ns, None, "host-dram= given: not measured");
    assert!(
        e.charged_ms > 0.0 && e.paid_ms >= 0.9 * e.charged_ms,
        "{e:?}"
    );
    assert!(e.tier_map_updates > 0);

    let (fast, _) = run(&zipf(PlacementArg::FastFirst, MEM, PolicyArg::Static, 2));
    let e = fast.emulation.as_ref().unwrap();
    assert_eq!(e.accesses[1], 0, "no page is slow: {e:?}");
    assert!(e.accesses[0] > 1_000, "{e:?}");
    // Per charged access: 500 ns against 100 ns.
    let per_access = |r: &vmm_core::report::RunReport| {
        let e = r.emulation.as_ref().unwrap();
        e.charged_ms / e.accesses.iter().sum::<u64>() as f64 * 1e6
    };
    let (s, f) = (per_access(&slow), per_access(&fast));
    assert!(
        (s / 500.0 - 1.0).abs() < 0.05 && (f / 100.0 - 1.0).abs() < 0.05,
        "{s} {f}"
    );
}

/// A cache model smaller than the host's LLC comes with a model of the
/// host's LLC (docs/emulation.md, "Scaled cache models"): the guest
/// measures the LLC hit latency at boot and the report says what the model
/// did; with `host-cache=off` the run carries the caveat instead. (Fails if
/// the VMM does not reserve the model or the guest does not measure.)
#[test]
fn a_scaled_cache_model_comes_with_a_host_llc_model() {
    if !kvm_available("a_scaled_cache_model_comes_with_a_host_llc_model") {
        return;
    }
    let host = vmm_core::emulation::config::host_llc_bytes();
    let mut on = zipf(PlacementArg::SlowFirst, 16 << 20, PolicyArg::Static, 2);
    on.emulate_latency = Some("fast=200ns,slow=600ns,llc=64K".into());
    let mut off = on.clone();
    off.emulate_latency = Some("fast=200ns,slow=600ns,llc=64K,host-cache=off".into());
    let (r, _) = run(&on);
    let e = r.emulation.as_ref().expect("an emulation report");
    let (r_off, _) = run(&off);
    let e_off = r_off.emulation.as_ref().expect("an emulation report");
    assert!(e_off.host_cache.is_none(), "{e_off:?}");
    match host {
        // sysfs gives no LLC size: nothing to model, nothing to warn about.
        None => {
            println!("this host's sysfs gives no LLC size: no host LLC model to check");
            assert!(e.host_cache.is_none() && e_off.caveat.is_none());
        }
        Some(bytes) if bytes > 64 << 10 => {
            let h = e.host_cache.as_ref().expect("a host LLC model");
            assert_eq!(h.bytes, 1 << (63 - bytes.leading_zeros()), "{h:?}");
            assert!(
                h.llc_hit_measured,
                "the guest measured the LLC hit latency: {h:?}"
            );
            match h.llc_hit_ns {
                Some(llc) => assert!((1.0..=200.0).contains(&llc), "{h:?}"),
                // A loaded host can slow every pass past 200 ns: measured,
                // reported as implausible, not used.
                None => {
                    assert!(!h.applied, "{h:?}");
                    println!("the boot LLC measurement was implausible on this host: {h:?}");
                }
            }
            assert!(h.host_cache_hit_pct <= 100.0);
            assert!(e.caveat.is_none(), "{e:?}");
            assert!(e_off.caveat.as_ref().is_some_and(|c| c.contains("64K")));
        }
        Some(_) => assert!(e.host_cache.is_none()),
    }
}

/// `ab=on` switches charging off and on within the run and reports each
/// half: with every page slow (+500 ns per access, every access charged),
/// the charging phases are far slower than the others, pair by pair.
/// (Fails if the off phases still charge, or the halves are not posted.)
#[test]
fn ab_on_times_charging_and_not_in_one_run() {
    if !kvm_available("ab_on_times_charging_and_not_in_one_run") {
        return;
    }
    let mut req = zipf(PlacementArg::SlowFirst, 16 << 20, PolicyArg::Static, 2);
    req.emulate_latency = Some("fast=200ns,slow=600ns,llc=0,host-dram=100ns,ab=on".into());
    let (r, _) = run(&req);
    let e = r.emulation.as_ref().expect("an emulation report");
    assert!(e.label.contains("ab=on"), "{}", e.label);
    let ab = e.ab.as_ref().expect("both halves reported");
    assert!(ab.pairs >= 5 && ab.on_ops > 0 && ab.off_ops > 0, "{ab:?}");
    // zipf over 16 MiB costs tens of ns per operation; charging adds ~500,
    // beyond the pair bins (up to 1.5).
    let m = ab.pair_median_ratio.expect("a median pair");
    assert!(
        m > 1.49 && ab.pair_median_at_bin_edge && ab.ratio > 2.0,
        "{ab:?}"
    );
    assert!(ab.on_ns_per_op - ab.off_ns_per_op > 250.0, "{ab:?}");
    // Without `ab=on` there is no such report.
    let (r, _) = run(&zipf(
        PlacementArg::SlowFirst,
        16 << 20,
        PolicyArg::Static,
        1,
    ));
    assert!(r.emulation.as_ref().unwrap().ab.is_none());
}

/// Promotions reach the guest's map before the promoted page is mapped:
/// with every page starting slow, chaos promotions (transactional, 5000
/// pages/s) make accesses fast. Colloid reads the emulation's
/// loaded-latency model.
#[test]
fn migrations_reach_the_map_and_colloid_reads_the_model() {
    if !kvm_available("migrations_reach_the_map_and_colloid_reads_the_model") {
        return;
    }
    let mut req = zipf(PlacementArg::SlowFirst, 32 << 20, PolicyArg::Chaos, 2);
    req.tiering.chaos_rate = Some(5000.0);
    req.tiering.chaos_mix = Some("1:0".into());
    let (r, _) = run(&req);
    let e = r.emulation.as_ref().unwrap();
    let m = r.migration.as_ref().unwrap();
    assert!(m.promotions > 500, "{m:?}");
    assert!(
        e.accesses[0] > 0 && e.accesses[1] > 0,
        "promoted pages are charged as fast: {e:?}"
    );
    assert!(e.migration_bytes[0] > 0 && e.migration_bytes[1] > 0);
    assert_eq!(r.exit_code, Some(0));

    let (r, _) = run(&zipf(
        PlacementArg::FastFirst,
        32 << 20,
        PolicyArg::Colloid,
        1,
    ));
    let engine = r.tiering.as_ref().unwrap().engine.as_ref().unwrap();
    assert_eq!(
        engine.latency_source,
        Some(vmm_core::emulation::load::SOURCE),
        "{engine:?}"
    );
    assert!(r.emulation.as_ref().unwrap().windows > 10);
}

/// Reads the boot info's emulation field once the guest runs.
struct BootInfoProbe(Option<u64>);

impl RunHooks for BootInfoProbe {
    fn on_sample(&mut self, ctx: &SampleCtx<'_>) {
        if self.0.is_none() {
            let off = std::mem::offset_of!(BootInfo, emulation_gpa) as u64;
            let gpa: u64 = ctx.mem.read_obj(GuestAddress(BOOT_INFO_GPA + off)).unwrap();
            self.0 = Some(gpa);
        }
    }
}

/// Without the flag there is no region, no report section and the guest
/// sees no emulation address; with it, the region lies above RAM.
#[test]
fn without_the_flag_nothing_of_it_exists() {
    if !kvm_available("without_the_flag_nothing_of_it_exists") {
        return;
    }
    let mut req = zipf(PlacementArg::FastFirst, 32 << 20, PolicyArg::Static, 1);
    req.emulate_latency = None;
    let mut probe = BootInfoProbe(None);
    let (r, _) = run_with(&req, &mut probe);
    assert!(r.emulation.is_none());
    assert_eq!(probe.0, Some(0), "the guest sees no emulation region");
    let engine = r.tiering.as_ref().unwrap().engine.as_ref().unwrap();
    assert_ne!(
        engine.latency_source,
        Some(vmm_core::emulation::load::SOURCE)
    );

    let mut probe = BootInfoProbe(None);
    req.emulate_latency = Some(String::new());
    let (r, _) = run_with(&req, &mut probe);
    assert_eq!(probe.0, Some(MEM), "the region starts where RAM ends");
    let e = r.emulation.as_ref().expect("an emulation report");
    let dram = e.host_dram_ns.expect("the guest measured host DRAM");
    assert!((20.0..5_000.0).contains(&dram), "host DRAM {dram} ns");
    assert_eq!(e.host_dram_used_ns, Some(dram));
    // nomad-a's fast tier is 150 ns: charges subtract the lower of it and
    // the host's DRAM latency.
    assert_eq!(
        e.charge_base_ns,
        Some(dram.min(e.config.tiers[0].latency_ns))
    );
}

fn write_tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiervm-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The zipf image with its entry code replaced by `code`.
fn with_entry_code(code: &[u8]) -> Vec<u8> {
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::{elf, Endianness};
    let mut b = vmm_core::image::builtin_bytes("zipf").unwrap().to_vec();
    let h = elf::FileHeader64::<Endianness>::parse(&b[..]).unwrap();
    let e = h.endian().unwrap();
    let entry = h.e_entry(e);
    let mut off = 0;
    for ph in h.program_headers(e, &b[..]).unwrap() {
        let (va, sz) = (ph.p_vaddr(e), ph.p_filesz(e));
        if ph.p_type(e) == elf::PT_LOAD && entry >= va && entry < va + sz {
            off = (ph.p_offset(e) + entry - va) as usize;
        }
    }
    b[off..off + code.len()].copy_from_slice(code);
    b
}

/// A guest that knows nothing of emulation runs unchanged with it on (the
/// ABI addition is backward compatible), and one that fills the region's
/// header and counters with 0xff gets a report with sane numbers.
#[test]
fn guests_that_ignore_or_scribble_over_the_region_are_contained() {
    if !kvm_available("guests_that_ignore_or_scribble_over_the_region_are_contained") {
        return;
    }
    // rdi = 0x2000000 (--mem 32M: the region's start), 16 KiB of 0xff, exit 0.
    let scribble = [
        0x48, 0xc7, 0xc7, 0x00, 0x00, 0x00, 0x02, // mov rdi, 0x2000000
        0x48, 0xc7, 0xc1, 0x00, 0x40, 0x00, 0x00, // mov rcx, 0x4000
        0xb0, 0xff, // mov al, 0xff
        0xf3, 0xaa, // rep stosb
        0x31, 0xc0, // xor eax, eax
        0xba, 0x01, 0x05, 0x00, 0x00, // mov edx, 0x501
        0xef, // out dx, eax
        0xeb, 0xfe, // jmp $
    ];
    // The same exit without touching the region.
    let ignore = &scribble[18..];
    for (name, code) in [("ignore", ignore), ("scribble", &scribble[..])] {
        let img = write_tmp(name, &with_entry_code(code));
        let mut req = request(
            img.to_str().unwrap(),
            32 << 20,
            1,
            Duration::from_secs(1),
            &[],
        );
        req.tiering.fast = Some(16 << 20);
        req.emulate_latency = Some(String::new());
        let (r, _) = run(&req);
        assert_eq!(r.exit_code, Some(0), "{name}");
        let e = r.emulation.as_ref().expect("an emulation report");
        assert_eq!(e.host_dram_ns, None, "{name}: no (plausible) measurement");
        let json = serde_json::to_string(&r).expect("the report encodes");
        assert!(!json.contains("NaN") && !json.contains("inf"), "{name}");
        assert!(e.cache_hit_pct.is_finite() && e.charged_ms.is_finite());
        // The loaded-latency thread survived the guest's counters.
        assert!(
            !e.thread_failed,
            "{name}: the loaded-latency thread panicked"
        );
        assert!(
            e.loaded_latency_ns_max.iter().all(|l| l.is_finite()),
            "{name}"
        );
    }
}
