//! The VM: the KVM VM file descriptor, the guest RAM its memory slots map,
//! and the tiered-memory threads that use its dirty log.
//!
//! KVM maps guest RAM by its host address for as long as the VM exists,
//! and the VM exists while its fd or any of its vCPU fds is open. So the
//! RAM is shared ([`Arc<GuestRam>`]) by the [`Vm`] and by every [`Vcpu`]
//! created from it, and each of them drops its fd before its share of the
//! RAM (field order): the mapping outlives every fd through which KVM can
//! reach it, whatever order the runner ends in, even when a vCPU thread
//! never returns. That is what makes registering the memory slots safe.

use std::sync::Arc;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use tiering::mem::TieredMemory;
use vm_memory::{GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap, GuestMemoryRegion};

use crate::emulation::region::EmulationRegion;
use crate::emulation::Emulation;
use crate::vstate::kvm_caps::{KvmCaps, MissingCap, Needs};
use crate::vstate::memory::{self, MemoryError};
use crate::vstate::tiered::{TieredRam, TieredRamError};

type Result<T> = std::result::Result<T, VmError>;

/// First memory slot of guest RAM.
pub const RAM_SLOT: u32 = 0;
/// Tiered guest RAM is registered as memory slots of this size (the last
/// one may be shorter): the dirty log is switched on per slot, and KVM maps
/// a logged slot with 4 KiB pages only, so the slots where nothing is
/// tracked keep their huge-page mappings (issue 29, docs/mechanisms.md §2).
pub const RAM_SEGMENT_BYTES: u64 = 64 << 20;
/// Most memory slots of tiered guest RAM (larger guests get larger slots).
pub const MAX_RAM_SEGMENTS: u64 = 128;
/// Memory slot of the latency-emulation region (above RAM; never tiered,
/// never dirty-logged).
pub const EMULATION_SLOT: u32 = RAM_SLOT + MAX_RAM_SEGMENTS as u32;

/// The memory slots of tiered guest RAM at `gpa`, `len` bytes, mapped at
/// `host`: segments of [`RAM_SEGMENT_BYTES`] (or `len / MAX_RAM_SEGMENTS`
/// rounded up to 2 MiB, whichever is larger), unlogged, from [`RAM_SLOT`].
pub fn ram_segments(gpa: u64, len: u64, host: u64) -> Vec<kvm_userspace_memory_region> {
    const HUGE: u64 = tiervm_guest::abi::GUEST_LARGE_PAGE;
    let seg = RAM_SEGMENT_BYTES.max(len.div_ceil(MAX_RAM_SEGMENTS).div_ceil(HUGE) * HUGE);
    (0..len.div_ceil(seg))
        .map(|i| kvm_userspace_memory_region {
            slot: RAM_SLOT + i as u32,
            flags: 0,
            guest_phys_addr: gpa + i * seg,
            memory_size: seg.min(len - i * seg),
            userspace_addr: host + i * seg,
        })
        .collect()
}

/// KVM or the VM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// `KVM_CREATE_VM` failed.
    #[error("KVM_CREATE_VM")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// KVM lacks a capability the run needs.
    #[error(transparent)]
    MissingCapability(#[from] MissingCap),
    /// A guest RAM region has no host address.
    #[error("guest RAM host address")]
    HostAddress(#[source] GuestMemoryError),
    /// `KVM_SET_USER_MEMORY_REGION` failed.
    #[error("KVM_SET_USER_MEMORY_REGION")]
    SetMemoryRegion(#[source] kvm_ioctls::Error),
    /// Tiered guest RAM could not be set up or started.
    #[error(transparent)]
    Tiered(#[from] TieredRamError),
}

impl VmError {
    /// The fix, for errors whose cause comes from below.
    pub fn fix(&self) -> Option<&'static str> {
        match self {
            Self::OpenKvm(_) => Some(
                "load the kvm module and run as a user with read/write access to /dev/kvm \
                 (`tiervm info` shows what this host offers)",
            ),
            _ => None,
        }
    }

    /// Whether the user's input is at fault (exit code 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::MissingCapability(m) => m.is_usage(),
            Self::Tiered(e) => e.is_usage(),
            _ => false,
        }
    }
}

/// Opens `/dev/kvm` with a message that names the fix.
pub fn open_kvm() -> std::result::Result<Kvm, VmError> {
    Kvm::new().map_err(VmError::OpenKvm)
}

/// Guest RAM: vm-memory's view of it, and for tiered RAM the backing that
/// owns the mapping (vm-memory owns the mapping of plain RAM itself).
pub struct GuestRam {
    guest: GuestMemoryMmap,
    /// Dropped after `guest` (field order), which only borrows its mapping.
    backing: Option<Arc<TieredMemory>>,
    /// The latency-emulation region KVM maps in [`EMULATION_SLOT`]; kept
    /// mapped as long as the RAM (every fd through which KVM reaches it
    /// closes first, as for the RAM).
    emulation: Option<Arc<EmulationRegion>>,
}

impl GuestRam {
    /// Anonymous, private RAM of `size` bytes (transparent huge pages).
    pub fn anonymous(size: u64) -> std::result::Result<Self, MemoryError> {
        Ok(Self {
            guest: memory::create_ram(size, true)?,
            backing: None,
            emulation: None,
        })
    }

    /// The RAM of tiered memory.
    pub fn tiered(ram: &TieredRam) -> Self {
        Self {
            guest: ram.guest().clone(),
            backing: Some(ram.memory().clone()),
            emulation: None,
        }
    }

    /// The same RAM with the latency-emulation region mapped above it.
    pub fn with_emulation(mut self, region: Arc<EmulationRegion>) -> Self {
        self.emulation = Some(region);
        self
    }

    /// The latency-emulation region, if any.
    pub fn emulation(&self) -> Option<&Arc<EmulationRegion>> {
        self.emulation.as_ref()
    }

    /// vm-memory's view, for loading the image and the boot data.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.guest
    }

    /// The tiered backing, for tiered RAM.
    pub fn backing(&self) -> Option<&Arc<TieredMemory>> {
        self.backing.as_ref()
    }
}

/// A VM with its guest RAM registered. Fields drop in order: the tiering
/// threads stop and the migrator goes with its dirty log (which holds a
/// share of `fd`), then this share of the VM fd closes, then this share of
/// the RAM goes.
pub struct Vm {
    emulation: Option<Emulation>,
    tiered: Option<TieredRam>,
    fd: Arc<VmFd>,
    ram: Arc<GuestRam>,
}

impl Vm {
    /// Creates a VM of `vcpus` vCPUs over `ram`: checks that KVM offers
    /// what the run needs (manual-protect dirty logging for tiered RAM),
    /// enables the dirty log for `tiered` and registers the memory slots.
    pub fn new(
        kvm: &Kvm,
        ram: Arc<GuestRam>,
        tiered: Option<TieredRam>,
        vcpus: u32,
    ) -> Result<Self> {
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        KvmCaps::of_vm(kvm, &fd)
            .require(Needs {
                vcpus,
                manual_dirty_log: tiered.is_some(),
            })
            .map_err(VmError::from)?;
        if tiered.is_some() {
            TieredRam::prepare_vm(&fd)?;
        }
        let vm = Self {
            emulation: None,
            tiered,
            fd: Arc::new(fd),
            ram,
        };
        vm.register_ram()?;
        Ok(vm)
    }

    /// Registers each RAM region as a memory slot from [`RAM_SLOT`],
    /// unlogged: KVM maps them with huge pages. Tiered RAM's harvester
    /// switches logging on only while something is tracked (see
    /// `kvm_dirty_log`).
    fn register_ram(&self) -> std::result::Result<(), VmError> {
        let mem = self.ram.memory();
        let mut slots = Vec::new();
        for (i, region) in mem.iter().enumerate() {
            let host = mem
                .get_host_address(region.start_addr())
                .map_err(VmError::HostAddress)?;
            if self.tiered.is_some() {
                // Tiered RAM is one region: segments, so that the dirty log
                // is switched per segment (see `ram_segments`).
                slots.extend(ram_segments(
                    region.start_addr().0,
                    region.len(),
                    host as u64,
                ));
                continue;
            }
            slots.push(kvm_userspace_memory_region {
                slot: RAM_SLOT + i as u32,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: host as u64,
            });
        }
        for desc in slots {
            // SAFETY: `userspace_addr..+memory_size` lies in a region's own
            // mapping, as vm-memory reports it. It stays mapped while KVM can
            // use it: `self.ram` shares ownership of it with every vCPU
            // created from this VM, and both this VM and each vCPU close
            // their fd before they drop their share (field order), so no fd
            // through which KVM reaches the slot outlives the mapping.
            unsafe { self.fd.set_user_memory_region(desc) }.map_err(VmError::SetMemoryRegion)?;
        }
        if let Some(region) = self.ram.emulation() {
            let l = region.layout();
            let desc = kvm_userspace_memory_region {
                slot: EMULATION_SLOT,
                flags: 0,
                guest_phys_addr: l.base,
                memory_size: l.len,
                userspace_addr: region.host_addr(),
            };
            // SAFETY: the region's own mapping of `len` bytes; `self.ram`
            // holds it (the `Arc` in GuestRam) as long as the RAM, and as
            // for the RAM every fd closes before its share goes.
            unsafe { self.fd.set_user_memory_region(desc) }.map_err(VmError::SetMemoryRegion)?;
        }
        Ok(())
    }

    /// Hands latency emulation to the VM (its thread stops with the VM).
    pub fn set_emulation(&mut self, emulation: Emulation) {
        self.emulation = Some(emulation);
    }

    /// Latency emulation, while the VM has it.
    pub fn emulation_mut(&mut self) -> Option<&mut Emulation> {
        self.emulation.as_mut()
    }

    /// Takes latency emulation out of the VM, to report it.
    pub fn take_emulation(&mut self) -> Option<Emulation> {
        self.emulation.take()
    }

    /// The VM file descriptor.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// The guest RAM.
    pub fn ram(&self) -> &Arc<GuestRam> {
        &self.ram
    }

    /// Tiered RAM and its threads, while they run.
    pub fn tiered(&self) -> Option<&TieredRam> {
        self.tiered.as_ref()
    }

    /// Tiered RAM and its threads, mutable.
    pub fn tiered_mut(&mut self) -> Option<&mut TieredRam> {
        self.tiered.as_mut()
    }

    /// Starts the tiering threads that need the VM (migrator with KVM's
    /// dirty log, engine, sampler, chaos).
    pub fn start_tiering(&mut self) -> Result<()> {
        match &mut self.tiered {
            Some(t) => Ok(t.start(&self.fd)?),
            None => Ok(()),
        }
    }

    /// The placement policy's mode, when tiered RAM runs an engine.
    pub fn policy_mode(&self) -> Option<tiering::engine::ModeSlot> {
        self.tiered.as_ref().and_then(TieredRam::policy_mode)
    }

    /// Takes tiered RAM out of the VM, to finish it once the vCPUs stopped.
    pub fn take_tiered(&mut self) -> Option<TieredRam> {
        self.tiered.take()
    }

    /// A vCPU file descriptor of this VM, holding a share of its RAM.
    pub fn create_vcpu(&self, id: u32) -> std::result::Result<Vcpu, kvm_ioctls::Error> {
        Ok(Vcpu {
            fd: self.fd.create_vcpu(u64::from(id))?,
            _ram: self.ram.clone(),
        })
    }
}

/// A vCPU. Its fd closes before its share of the guest RAM goes (field
/// order), so a vCPU thread that outlives the runner keeps the RAM mapped.
pub struct Vcpu {
    fd: VcpuFd,
    _ram: Arc<GuestRam>,
}

impl Vcpu {
    /// The vCPU file descriptor.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// The vCPU file descriptor, for `KVM_RUN`.
    pub fn fd_mut(&mut self) -> &mut VcpuFd {
        &mut self.fd
    }
}
