//! The VM file descriptor and its memory slot.

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::error::{Error, Result};

/// Memory slot of guest RAM.
pub const RAM_SLOT: u32 = 0;

/// Opens `/dev/kvm` with a message that names the fix.
pub fn open_kvm() -> Result<Kvm> {
    Kvm::new().map_err(|e| {
        Error::Host(crate::permissions::kvm_open_error(
            &std::io::Error::from_raw_os_error(e.errno()),
        ))
    })
}

/// Creates an empty VM.
pub fn create_vm(kvm: &Kvm) -> Result<VmFd> {
    kvm.create_vm().map_err(|e| Error::host("KVM_CREATE_VM", e))
}

/// Registers guest RAM as slot [`RAM_SLOT`]; with `dirty_log` the slot logs
/// guest writes.
pub fn register_ram(vm: &VmFd, mem: &GuestMemoryMmap, dirty_log: bool) -> Result<()> {
    for (i, region) in mem.iter().enumerate() {
        let slot = RAM_SLOT + i as u32;
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|e| Error::host("guest RAM host address", e))?;
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
        unsafe { vm.set_user_memory_region(desc) }
            .map_err(|e| Error::host("KVM_SET_USER_MEMORY_REGION", e))?;
    }
    Ok(())
}
