//! Guest RAM on tiered memory: builds `tiering::mem::TieredMemory`, exposes
//! it to vm-memory and KVM, and runs the tiering threads (userfaultfd fault
//! handler, migrator with KVM's dirty log, chaos driver) for one VM.

use std::sync::Arc;

use kvm_ioctls::VmFd;
use serde::Serialize;
use tiering::mem::{
    BackingCounters, ChaosDriver, ChaosReport, FaultHandler, HintSampler, MemStats,
    MigrationCounters, Migrator, MigratorConfig, ResizeDriver, ResizeDriverReport, ResizeHandle,
    SamplerHandle, TierStats, TieredMemory, PAGE_SIZE,
};

use crate::status::TierSample;
use vm_memory::mmap::MmapRegion;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use crate::kvm_dirty_log::{enable_manual_dirty_log_protect_initially_set, KvmDirtyLog};
use crate::tiering_config::TieringConfig;
use crate::vstate::vm::ram_segments;

type Result<T> = std::result::Result<T, TieredRamError>;
use tiering::engine::{Engine, EngineError, EngineReport};

/// Tiered guest RAM, or one of the threads that manage it, failed.
#[derive(Debug, thiserror::Error)]
pub enum TieredRamError {
    /// The resize driver thread could not start.
    #[error("starting the resize driver")]
    StartResize(#[source] std::io::Error),
    /// Allocating and placing the tier pools failed.
    #[error("setting up tiered guest RAM")]
    Setup(#[source] tiering::mem::MemError),
    /// vm-memory refused the backing's mapping.
    #[error("wrapping tiered guest RAM")]
    WrapRegion(#[source] vm_memory::mmap::MmapRegionError),
    /// The mapping does not fit at guest-physical 0.
    #[error("tiered guest RAM region overflows the address space")]
    RegionOverflow,
    /// vm-memory refused the region list.
    #[error("tiered guest RAM")]
    Regions(#[source] vm_memory::GuestRegionCollectionError),
    /// KVM's manual-protect dirty log could not be enabled.
    #[error("enabling KVM dirty logging")]
    DirtyLog(#[source] std::io::Error),
    /// The userfaultfd handler could not start.
    #[error("starting the userfaultfd handler")]
    StartFaultHandler(#[source] std::io::Error),
    /// The migrator could not start.
    #[error("starting the migrator")]
    StartMigrator(#[source] std::io::Error),
    /// The chaos driver could not start.
    #[error("starting the chaos driver")]
    StartChaos(#[source] std::io::Error),
    /// The policy engine could not start.
    #[error("starting the tiering engine")]
    StartEngine(#[source] EngineError),
    /// The hint-fault sampler could not start.
    #[error("starting the hint-fault sampler")]
    StartSampler(#[source] std::io::Error),
    /// The policy engine did not stop cleanly.
    #[error("stopping the tiering engine")]
    StopEngine(#[source] EngineError),
    /// The hint-fault sampler did not stop cleanly.
    #[error("stopping the hint-fault sampler")]
    StopSampler(#[source] std::io::Error),
    /// Parked pages could not be mapped back.
    #[error("unparking sampled pages")]
    Unpark(#[source] std::io::Error),
    /// The chaos driver did not stop cleanly.
    #[error("stopping the chaos driver")]
    StopChaos(#[source] std::io::Error),
    /// The userfaultfd handler did not stop cleanly.
    #[error("stopping the userfaultfd handler")]
    StopFaultHandler(#[source] std::io::Error),
    /// A policy switch for a VM that runs no policy engine.
    #[error("this VM runs no placement policy engine (chaos or untiered): its policy cannot be switched")]
    NoEngine,
}

impl TieredRamError {
    /// Whether the user's input is at fault (exit code 2): a policy the
    /// engine cannot build.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::StartEngine(EngineError::Policy(_)))
    }
}

/// What the report says about tiering.
///
/// The run report has one section per thing reported: per-tier page
/// counts (`tiers`), how host memory was committed (`backing`), migration
/// mechanism counters (`migration`), access tracking (`tracking`) and this
/// one, the tiering setup and its threads. The first four are built from
/// `stats` and `samples` ([`Self::tiers`], [`Self::backing`],
/// [`Self::migration`], [`Self::tracking`]), which are therefore left out
/// of this section's JSON.
#[derive(Clone, Debug, Serialize)]
pub struct TieringReport {
    /// The policy that ran.
    pub policy: String,
    /// Whether tier latencies are emulated (both tiers on one host node).
    pub emulated: bool,
    /// Milliseconds the backing took to set up (allocation and placement).
    pub setup_ms: f64,
    /// Mechanism counters and per-tier page counts at the end of the run.
    #[serde(skip)]
    pub stats: MemStats,
    /// The chaos driver's own account, when chaos ran.
    pub chaos: Option<ChaosReport>,
    /// Capacity changes while the VM ran (`--fast-schedule`, the service)
    /// and what converging them did.
    pub resize: Option<ResizeDriverReport>,
    /// Access samples (hint faults) recorded.
    #[serde(skip)]
    pub samples: u64,
    /// What the policy engine did (placement policies only).
    pub engine: Option<EngineReport>,
    /// Bookkeeping check at the end of the run: "ok", or "inconsistent: "
    /// and the first violation (the run then exits 1, after the report).
    pub consistency: String,
    /// The error that stopped the VM from the memory side (e.g. the host ran
    /// out of memory for a lazy commit), if any.
    pub fatal: Option<String>,
    /// `move_pages(2)` check at the end of the run: "ok" when every present
    /// guest page sits on its tier's host node (trivially true with emulated
    /// tiers), else the first mismatch.
    pub node_check: String,
    /// Present guest pages `node_check` compared with their tier's node.
    pub node_checked_pages: u64,
    /// Present guest pages the kernel (`move_pages` query, right after
    /// `node_check`) finds on each tier's node, in tier order (a node shared
    /// by several tiers counts for the first); pages not present (never
    /// touched, in flight, parked) are not counted. With real tiers and
    /// `node_check` ok, their sum equals `node_checked_pages`, and a tier
    /// with a non-zero count really has pages on its node. `None` if the
    /// query failed.
    pub node_pages: Option<Vec<u64>>,
}

/// The report's `tracking` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TrackingReport {
    /// Hint faults taken (sampled guest accesses).
    pub hint_faults: u64,
    /// vCPU time blocked in hint faults, ms.
    pub hint_stall_ms: f64,
    /// Share of vCPU time spent in hint faults over the whole run, percent
    /// (hint_stall_ms / (vCPUs x run time)): what the fault handler sees.
    pub tracking_overhead_pct: f64,
    /// What one hint fault cost the guest as a multiple of the stall the
    /// handler saw: measured by this run with `--tracking-ab`, else
    /// `tiering::mem::GUEST_COST_FACTOR` (measured on the development host).
    pub guest_cost_factor: f64,
    /// What the hint faults cost the guest over the whole run, percent of
    /// vCPU time: `tracking_overhead_pct` x `guest_cost_factor` (MODELED
    /// from the factor; the sampler budgets against this figure).
    pub guest_cost_pct: f64,
    /// Access samples the fault handler recorded.
    pub samples: u64,
}

impl TieringReport {
    /// The `tiers` list.
    pub fn tiers(&self) -> Vec<TierStats> {
        self.stats.tiers.clone()
    }

    /// The `migration` object.
    pub fn migration(&self) -> MigrationCounters {
        self.stats.migration.clone()
    }

    /// The `backing` object.
    pub fn backing(&self) -> BackingCounters {
        self.stats.backing.clone()
    }

    /// The `tracking` object for a run of `vcpus` vCPUs lasting `run_s` seconds.
    pub fn tracking(&self, vcpus: u32, run_s: f64) -> TrackingReport {
        let vcpu_ms = f64::from(vcpus.max(1)) * run_s.max(1e-9) * 1e3;
        TrackingReport {
            hint_faults: self.stats.hint_faults,
            hint_stall_ms: self.stats.hint_stall_ms,
            tracking_overhead_pct: 100.0 * self.stats.hint_stall_ms / vcpu_ms,
            guest_cost_factor: self.stats.guest_cost_factor,
            guest_cost_pct: 100.0 * self.stats.hint_stall_ms * self.stats.guest_cost_factor
                / vcpu_ms,
            samples: self.samples,
        }
    }
}

/// Tiered guest RAM and the threads that manage it.
pub struct TieredRam {
    mem: Arc<TieredMemory>,
    guest: GuestMemoryMmap,
    faults: Option<FaultHandler>,
    migrator: Option<Arc<Migrator>>,
    chaos: Option<ChaosDriver>,
    sampler: Option<SamplerHandle>,
    samples: u64,
    vcpus: usize,
    engine: Option<Engine>,
    engine_report: Option<EngineReport>,
    resize: Option<ResizeDriver>,
    resize_report: Option<ResizeDriverReport>,
    cfg: TieringConfig,
}

impl TieredRam {
    /// Allocates and places guest RAM per `cfg` and starts the fault handler
    /// (needed before anything touches guest memory: pages may be in flight).
    pub fn new(cfg: &TieringConfig, vcpus: u32) -> Result<Self> {
        let mem = Arc::new(TieredMemory::new(&cfg.mem).map_err(TieredRamError::Setup)?);
        mem.injector().set(&cfg.fault_plans);
        // SAFETY: the range is TieredMemory's guest mapping, which stays mapped
        // for the life of `mem`. Every holder of this region keeps `mem`
        // alive longer: `TieredRam` drops `guest` before `mem` (field
        // order), and its only clone, `GuestRam::tiered`'s, sits beside an
        // `Arc` of `mem` dropped after it (even a vCPU thread left running
        // past the kick timeout holds that `GuestRam`). vm-memory does not
        // unmap a raw region.
        let region = unsafe {
            MmapRegion::build_raw(
                mem.guest_ptr(),
                mem.guest_len(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            )
        }
        .map_err(TieredRamError::WrapRegion)?;
        let region =
            GuestRegionMmap::new(region, GuestAddress(0)).ok_or(TieredRamError::RegionOverflow)?;
        let guest = GuestMemoryMmap::from_regions(vec![region]).map_err(TieredRamError::Regions)?;
        let faults = FaultHandler::spawn(mem.clone()).map_err(TieredRamError::StartFaultHandler)?;
        Ok(Self {
            mem,
            guest,
            faults: Some(faults),
            migrator: None,
            chaos: None,
            sampler: None,
            samples: 0,
            vcpus: vcpus as usize,
            engine: None,
            engine_report: None,
            resize: None,
            resize_report: None,
            cfg: cfg.clone(),
        })
    }

    /// Guest memory for loading, page tables and the status page.
    pub fn guest(&self) -> &GuestMemoryMmap {
        &self.guest
    }

    /// The backing.
    pub fn memory(&self) -> &Arc<TieredMemory> {
        &self.mem
    }

    /// Feeds the engine's latency-reading policies (Colloid) from latency
    /// emulation's live model instead of the hint-fault share model; call
    /// before [`Self::start`].
    pub fn set_live_latency(&mut self, source: Arc<dyn tiering::engine::TierLoadSource>) {
        if let Some(e) = &mut self.cfg.engine {
            e.live_latency = Some(source);
        }
    }

    /// Records that the VMM wrote `len` bytes at `gpa` (so shadows and
    /// transactions see VMM writes as well as guest writes).
    pub fn note_vmm_write(&self, gpa: u64, len: u64) {
        let first = (gpa / PAGE_SIZE as u64) as usize;
        let last = ((gpa + len.max(1) - 1) / PAGE_SIZE as u64) as usize;
        if first < self.mem.guest_pages() {
            let count = (last + 1).min(self.mem.guest_pages()) - first;
            self.mem.vmm_writes().mark(first, count);
        }
    }

    /// Turns on manual-protect dirty logging (with INITIALLY_SET, so the
    /// harvester can switch a memslot's logging on without write-protecting
    /// it); call before the memslot exists. The memslot is registered
    /// without logging: KVM maps guest RAM with huge pages until the first
    /// migration switches logging on.
    pub fn prepare_vm(vm: &VmFd) -> Result<()> {
        enable_manual_dirty_log_protect_initially_set(vm).map_err(TieredRamError::DirtyLog)
    }

    /// The placement policy's mode, once the engine runs.
    pub fn policy_mode(&self) -> Option<tiering::engine::ModeSlot> {
        self.engine.as_ref().map(Engine::mode_slot)
    }

    /// Starts the migrator (and chaos) once the VM's memslot exists; the
    /// migrator's dirty log keeps a share of `vm`.
    pub fn start(&mut self, vm: &Arc<VmFd>) -> Result<()> {
        // The memory slots `Vm::register_ram` registered for guest RAM.
        let slots = ram_segments(0, self.mem.guest_len() as u64, self.mem.guest_ptr() as u64);
        let log = KvmDirtyLog::segmented(Arc::clone(vm), slots);
        let migrator = Arc::new(
            Migrator::new(self.mem.clone(), Box::new(log), MigratorConfig::default())
                .map_err(TieredRamError::StartMigrator)?,
        );
        migrator.set_skip_dirty_check(self.cfg.skip_dirty_check);
        if let Some(chaos) = &self.cfg.chaos {
            self.chaos = Some(
                ChaosDriver::spawn(migrator.clone(), chaos.clone())
                    .map_err(TieredRamError::StartChaos)?,
            );
        }
        if let Some(e) = &self.cfg.engine {
            self.engine = Some(
                Engine::spawn(migrator.clone(), e.clone()).map_err(TieredRamError::StartEngine)?,
            );
        }
        self.resize = Some(
            ResizeDriver::spawn(migrator.clone(), self.cfg.resize.clone())
                .map_err(TieredRamError::StartResize)?,
        );
        self.migrator = Some(migrator);
        if let Some(sc) = &self.cfg.sampler {
            let mut sc = sc.clone();
            sc.vcpus = self.vcpus.max(1);
            self.sampler = Some(
                HintSampler::new(self.mem.clone(), sc)
                    .spawn()
                    .map_err(TieredRamError::StartSampler)?,
            );
        }
        Ok(())
    }

    /// A handle to change a tier's capacity while the VM runs (the
    /// host-side service's operation; `None` before [`Self::start`]).
    pub fn resize_handle(&self) -> Option<ResizeHandle> {
        self.resize.as_ref().map(|r| r.handle(self.mem.clone()))
    }

    /// Every tier's capacity, use and kernel-measured resident memory now.
    pub fn tier_samples(&self) -> Vec<TierSample> {
        let residency = self.mem.residency().ok();
        let counts = self.mem.tier_counts();
        self.mem
            .tier_ids()
            .map(|t| {
                let i = usize::from(t);
                TierSample {
                    capacity_pages: self.mem.capacity(t) as u64,
                    pages: counts[i].0 + counts[i].1,
                    resident_bytes: residency.as_ref().map(|r| r.tiers[i].resident_bytes),
                }
            })
            .collect()
    }

    /// Pauses or resumes hint-fault sampling (A/B measurements).
    pub fn set_tracking_paused(&self, paused: bool) {
        if let Some(s) = &self.sampler {
            s.set_paused(paused);
        }
    }

    /// Drains the access samples recorded since the last call (the policy
    /// engine will consume them; for now they are counted).
    pub fn drain_samples(&mut self) -> Vec<tiering::mem::HintFaultRecord> {
        if self.engine.is_some() {
            // The engine consumes them.
            return Vec::new();
        }
        let s = self.mem.drain_samples();
        self.samples += s.len() as u64;
        s
    }

    /// Stops migration and sampling (the guest may still be running).
    pub fn stop_migration(&mut self) -> Result<Option<ChaosReport>> {
        if let Some(r) = self.resize.take() {
            self.resize_report = Some(r.stop());
        }
        if let Some(e) = self.engine.take() {
            self.engine_report = Some(e.stop().map_err(TieredRamError::StopEngine)?);
        }
        if let Some(s) = self.sampler.take() {
            let mut sampler = s.stop().map_err(TieredRamError::StopSampler)?;
            sampler.unpark_all().map_err(TieredRamError::Unpark)?;
        }
        match self.chaos.take() {
            Some(c) => c.stop().map(Some).map_err(TieredRamError::StopChaos),
            None => Ok(None),
        }
    }

    /// Stops everything and reports; call after the vCPUs are gone.
    pub fn finish(mut self, chaos: Option<ChaosReport>) -> Result<TieringReport> {
        self.drain_samples();
        let chaos = match chaos {
            Some(c) => Some(c),
            None => self.stop_migration()?,
        };
        if let Some(m) = &self.migrator {
            // A last harvest so write counts and invalidations are complete.
            let _ = m.harvest();
        }
        if let Some(f) = self.faults.take() {
            f.stop().map_err(TieredRamError::StopFaultHandler)?;
        }
        // An inconsistency is reported, not raised: the report (with the
        // guest's own verdict) must never be lost.
        let consistency = match self.mem.check_consistency() {
            Ok(()) => "ok".to_string(),
            Err(e) => {
                tracing::error!("tiered memory inconsistent after the run: {e}");
                format!("inconsistent: {e}")
            }
        };
        let (node_check, node_checked_pages) = match self.mem.check_nodes() {
            Ok(n) => ("ok".to_string(), n as u64),
            Err(e) => (e.to_string(), 0),
        };
        let node_pages = self.node_pages();
        Ok(TieringReport {
            resize: self.resize_report.take(),
            consistency,
            fatal: self.mem.fatal_error().map(str::to_string),
            node_check,
            node_checked_pages,
            node_pages,
            policy: self.cfg.policy.to_string(),
            emulated: self.mem.emulated(),
            setup_ms: self.mem.setup_time().as_secs_f64() * 1e3,
            stats: self.mem.stats(),
            chaos,
            samples: self.samples + self.engine_report.as_ref().map_or(0, |e| e.samples),
            engine: self.engine_report.take(),
        })
    }
}

impl TieredRam {
    /// Present guest pages per tier's node, from the kernel's view
    /// ([`TieringReport::node_pages`]).
    fn node_pages(&self) -> Option<Vec<u64>> {
        let nodes = self.mem.query_guest_nodes().ok()?;
        let tier_nodes: Vec<i32> = self
            .mem
            .tier_ids()
            .map(|t| self.mem.node(t) as i32)
            .collect();
        let mut counts = vec![0u64; tier_nodes.len()];
        for n in nodes.into_iter().filter(|&n| n >= 0) {
            if let Some(i) = tier_nodes.iter().position(|&tn| tn == n) {
                counts[i] += 1;
            }
        }
        Some(counts)
    }
}

impl Drop for TieredRam {
    /// On an early return (an error after `start`), stop the engine, the
    /// sampler and chaos first, so no page is parked or in flight while
    /// the fault handler (a field dropped before them) goes away.
    fn drop(&mut self) {
        if let Err(e) = self.stop_migration() {
            tracing::warn!("stopping tiering on drop: {e}");
        }
    }
}

/// For the host-side service's worker (`tiervm serve`): live policy switch
/// and the access profile the fast-tier division reads.
impl TieredRam {
    /// Switches the placement policy now (the engine hands its state over).
    /// Refused when this VM runs no engine (chaos).
    pub fn switch_policy(&self, kind: tiering::policy::PolicyKind) -> Result<()> {
        match &self.engine {
            Some(e) => Ok(e.switch(kind).map_err(TieredRamError::StartEngine)?),
            None => Err(TieredRamError::NoEngine),
        }
    }

    /// The engine's per-page sampled accesses, if an engine runs.
    pub fn access_profile(&self) -> Option<Arc<tiering::engine::profile::AccessProfile>> {
        self.engine.as_ref().map(Engine::access_profile)
    }
}
