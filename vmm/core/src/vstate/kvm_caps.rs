//! KVM capabilities: what `/dev/kvm` (or a VM) offers, asked once, and
//! what tiervm needs of it. `tiervm info` prints them; VM creation
//! ([`crate::vstate::vm::Vm::new`]) refuses to go on without the ones a run
//! needs, naming the missing one.

use std::os::raw::c_ulong;

use kvm_bindings::{
    KVM_CAP_DIRTY_LOG_RING, KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
    KVM_CAP_MEMORY_FAULT_INFO, KVM_CAP_READONLY_MEM, KVM_CAP_USER_MEMORY,
};
use kvm_ioctls::{Kvm, VmFd};
use serde::Serialize;

/// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ManualDirtyLogProtect {
    /// Raw `KVM_CHECK_EXTENSION` answer (a bitmask; 0 = absent).
    pub raw: i32,
    /// Bit 0, `KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE`: `KVM_GET_DIRTY_LOG` no
    /// longer clears, `KVM_CLEAR_DIRTY_LOG` re-protects chosen pages.
    pub manual_protect_enable: bool,
    /// Bit 1, `KVM_DIRTY_LOG_INITIALLY_SET`: the log starts all-dirty.
    pub initially_set: bool,
}

impl ManualDirtyLogProtect {
    /// Decodes the bitmask.
    pub fn from_raw(raw: i32) -> ManualDirtyLogProtect {
        let bits = raw.max(0);
        ManualDirtyLogProtect {
            raw,
            manual_protect_enable: bits & 1 != 0,
            initially_set: bits & 2 != 0,
        }
    }
}

/// Capabilities and limits of `/dev/kvm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvmCaps {
    /// Where the capabilities were asked: `"vm"` (a VM; most precise) or
    /// `"system"` (`/dev/kvm`, if VM creation failed).
    pub asked_on: &'static str,
    /// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`.
    pub manual_dirty_log_protect: ManualDirtyLogProtect,
    /// `KVM_CAP_DIRTY_LOG_RING`: maximum ring size in bytes (0 = absent).
    pub dirty_log_ring_bytes: i32,
    /// `KVM_CAP_DIRTY_LOG_RING_ACQ_REL`: maximum ring size in bytes (0 = absent).
    pub dirty_log_ring_acq_rel_bytes: i32,
    /// `KVM_CAP_MEMORY_FAULT_INFO`: failed guest memory accesses exit with
    /// `KVM_EXIT_MEMORY_FAULT` and the faulting guest address.
    pub memory_fault_info: bool,
    /// `KVM_CAP_READONLY_MEM`: read-only memslots.
    pub readonly_mem: bool,
    /// `KVM_CAP_USER_MEMORY`: memslots backed by process memory.
    pub user_memory: bool,
    /// `KVM_CAP_MAX_VCPUS`.
    pub max_vcpus: usize,
    /// `KVM_CAP_NR_VCPUS` (recommended maximum).
    pub recommended_vcpus: usize,
    /// `KVM_CAP_NR_MEMSLOTS`.
    pub max_memslots: usize,
}

/// What a run needs of KVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// vCPUs the VM will have.
    pub vcpus: u32,
    /// Manual-protect dirty logging (tiered memory's transactional migration
    /// re-arms single pages).
    pub manual_dirty_log: bool,
}

/// A capability a run needs that this KVM lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MissingCap {
    /// No memslots backed by process memory.
    #[error("KVM lacks KVM_CAP_USER_MEMORY, which every tiervm VM needs for its RAM: use a kernel with standard KVM (`tiervm info` lists what this host offers)")]
    UserMemory,
    /// No manual-protect dirty log.
    #[error("KVM lacks KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 (manual protect), which tiered memory needs to re-arm single pages in the dirty log: use Linux 5.8 or later, or run untiered (--policy none) (`tiervm info` lists what this host offers)")]
    ManualDirtyLog,
    /// Fewer vCPUs than asked for.
    #[error("--vcpus {vcpus} exceeds the {max} vCPUs this KVM allows (KVM_CAP_MAX_VCPUS): lower --vcpus")]
    Vcpus {
        /// vCPUs asked for.
        vcpus: u32,
        /// KVM's limit.
        max: usize,
    },
}

impl MissingCap {
    /// Whether the user can fix it with a flag (exit code 2) rather than
    /// with another host.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Vcpus { .. })
    }
}

fn cap(raw: &impl Fn(c_ulong) -> i32, cap: u32) -> i32 {
    raw(c_ulong::from(cap))
}

impl KvmCaps {
    /// The capabilities of the VM `vm` (the most precise answer).
    pub fn of_vm(kvm: &Kvm, vm: &VmFd) -> Self {
        Self::probe(|c| vm.check_extension_raw(c), kvm, "vm")
    }

    /// The capabilities `/dev/kvm` reports before any VM exists.
    pub fn of_system(kvm: &Kvm) -> Self {
        Self::probe(|c| kvm.check_extension_raw(c), kvm, "system")
    }

    fn probe(raw: impl Fn(c_ulong) -> i32, kvm: &Kvm, asked_on: &'static str) -> Self {
        KvmCaps {
            asked_on,
            manual_dirty_log_protect: ManualDirtyLogProtect::from_raw(cap(
                &raw,
                KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
            )),
            dirty_log_ring_bytes: cap(&raw, KVM_CAP_DIRTY_LOG_RING).max(0),
            dirty_log_ring_acq_rel_bytes: cap(&raw, KVM_CAP_DIRTY_LOG_RING_ACQ_REL).max(0),
            memory_fault_info: cap(&raw, KVM_CAP_MEMORY_FAULT_INFO) > 0,
            readonly_mem: cap(&raw, KVM_CAP_READONLY_MEM) > 0,
            user_memory: cap(&raw, KVM_CAP_USER_MEMORY) > 0,
            max_vcpus: kvm.get_max_vcpus(),
            recommended_vcpus: kvm.get_nr_vcpus(),
            max_memslots: kvm.get_nr_memslots(),
        }
    }

    /// The first capability of `needs` this KVM lacks.
    pub fn require(&self, needs: Needs) -> Result<(), MissingCap> {
        if !self.user_memory {
            return Err(MissingCap::UserMemory);
        }
        if needs.manual_dirty_log && !self.manual_dirty_log_protect.manual_protect_enable {
            return Err(MissingCap::ManualDirtyLog);
        }
        if needs.vcpus as usize > self.max_vcpus {
            return Err(MissingCap::Vcpus {
                vcpus: needs.vcpus,
                max: self.max_vcpus,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(user_memory: bool, manual_protect: i32, max_vcpus: usize) -> KvmCaps {
        KvmCaps {
            asked_on: "vm",
            manual_dirty_log_protect: ManualDirtyLogProtect::from_raw(manual_protect),
            dirty_log_ring_bytes: 0,
            dirty_log_ring_acq_rel_bytes: 0,
            memory_fault_info: false,
            readonly_mem: false,
            user_memory,
            max_vcpus,
            recommended_vcpus: max_vcpus,
            max_memslots: 32,
        }
    }

    #[test]
    fn requirements_name_the_missing_capability() {
        let tiered = Needs {
            vcpus: 2,
            manual_dirty_log: true,
        };
        let plain = Needs {
            manual_dirty_log: false,
            ..tiered
        };
        assert_eq!(caps(true, 3, 8).require(tiered), Ok(()));
        assert_eq!(
            caps(true, 0, 8).require(tiered),
            Err(MissingCap::ManualDirtyLog)
        );
        assert_eq!(caps(true, 0, 8).require(plain), Ok(()));
        assert_eq!(
            caps(false, 3, 8).require(plain),
            Err(MissingCap::UserMemory)
        );
        let e = caps(true, 3, 1).require(plain).unwrap_err();
        assert!(e.is_usage());
        assert!(
            e.to_string().contains("--vcpus 2 exceeds the 1 vCPUs"),
            "{e}"
        );
        assert!(MissingCap::ManualDirtyLog
            .to_string()
            .contains("KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2"));
    }

    #[test]
    fn manual_protect_mask_decodes() {
        let m = ManualDirtyLogProtect::from_raw(3);
        assert!(m.manual_protect_enable && m.initially_set);
        let m = ManualDirtyLogProtect::from_raw(1);
        assert!(m.manual_protect_enable && !m.initially_set);
        let m = ManualDirtyLogProtect::from_raw(0);
        assert!(!m.manual_protect_enable && !m.initially_set);
        let m = ManualDirtyLogProtect::from_raw(-22);
        assert!(!m.manual_protect_enable && !m.initially_set);
    }
}
