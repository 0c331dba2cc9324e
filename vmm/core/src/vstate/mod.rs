//! KVM state of a VM: guest memory, the VM file descriptor with its memory
//! slots, and the vCPUs (Firecracker's `vstate` layout).

pub mod kvm_caps;
pub mod memory;
pub mod tiered;
pub mod vcpu;
pub mod vm;
