//! Access trackers that the kernel runs for us.
//!
//! The trackers in [`crate::mem`] (hint-fault sampling, accessed-bit probes)
//! unmap guest pages and record the guest's next touch: each observation
//! costs the guest a fault. The kernel can read the accessed bits of the
//! secondary MMU (KVM's EPT/NPT) instead, through KVM's MMU notifiers,
//! without a fault:
//!
//! - [`damon`]: DAMON virtual-address monitoring of the guest-RAM mapping
//!   (`--tracking damon`).
//!
//! Idle page tracking (`/sys/kernel/mm/page_idle`) would be the other way in;
//! neither the development host nor the Debian 6.12 kernel of the two-node
//! test host has it, so no tracker is built on it.

pub mod damon;
