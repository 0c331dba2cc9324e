//! The VM file descriptor and its memory slot.

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap, GuestMemoryRegion};

/// KVM or the VM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// `KVM_CREATE_VM` failed.
    #[error("KVM_CREATE_VM")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// A guest RAM region has no host address.
    #[error("guest RAM host address")]
    HostAddress(#[source] GuestMemoryError),
    /// `KVM_SET_USER_MEMORY_REGION` failed.
    #[error("KVM_SET_USER_MEMORY_REGION")]
    SetMemoryRegion(#[source] kvm_ioctls::Error),
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
}

type Result<T> = std::result::Result<T, VmError>;

/// Memory slot of guest RAM.
pub const RAM_SLOT: u32 = 0;

/// Opens `/dev/kvm` with a message that names the fix.
pub fn open_kvm() -> Result<Kvm> {
    Kvm::new().map_err(VmError::OpenKvm)
}

/// Creates an empty VM.
pub fn create_vm(kvm: &Kvm) -> Result<VmFd> {
    kvm.create_vm().map_err(VmError::CreateVm)
}

/// Registers guest RAM as slot [`RAM_SLOT`]; with `dirty_log` the slot logs
/// guest writes.
pub fn register_ram(vm: &VmFd, mem: &GuestMemoryMmap, dirty_log: bool) -> Result<()> {
    for (i, region) in mem.iter().enumerate() {
        let slot = RAM_SLOT + i as u32;
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(VmError::HostAddress)?;
        let desc = kvm_userspace_memory_region {
            slot,
            flags: if dirty_log {
                KVM_MEM_LOG_DIRTY_PAGES
            } else {
                0
            },
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region is a live mapping that the caller keeps alive for
        // as long as the VM exists (the runner drops the VM before the memory).
        unsafe { vm.set_user_memory_region(desc) }.map_err(VmError::SetMemoryRegion)?;
    }
    Ok(())
}
