//! The guest ABI as the VMM writes and reads it: the guest-physical RAM
//! limits one page-table tree allows, and [`Wire`], which lets vm-memory copy
//! the ABI's `repr(C)` structs in and out of guest RAM.

use std::mem::size_of;

use tiervm_guest::abi::{self, ArgEntry, BootInfo, Metric, StatusPage, VcpuStatus, MAX_ARGS};
use vm_memory::ByteValued;

/// Most RAM one page-table tree (one PDPT) maps with 2 MiB pages: 512 GiB.
pub const MAX_RAM: u64 = 512 << 30;
/// Least RAM tiervm accepts.
pub const MIN_RAM: u64 = 16 << 20;

/// A `repr(transparent)` wrapper that lets vm-memory copy ABI structs.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Wire<T>(pub T);

// The ABI structs have no padding: each is exactly the sum of its fields.
const _: () = assert!(size_of::<ArgEntry>() == abi::ARG_KEY_LEN + abi::ARG_VALUE_LEN);
const _: () = assert!(size_of::<BootInfo>() == 8 * 8 + 4 * 4 + MAX_ARGS * size_of::<ArgEntry>());
const _: () = assert!(size_of::<VcpuStatus>() == 8 * 8);
const _: () = assert!(size_of::<Metric>() == abi::METRIC_NAME_LEN + 8);
const _: () = assert!(
    size_of::<StatusPage>()
        == 8 * 8
            + abi::MAX_VCPUS * size_of::<VcpuStatus>()
            + abi::MAX_METRICS * size_of::<Metric>()
);

// SAFETY: `Wire` is `repr(transparent)` over BootInfo, which is `repr(C)`,
// holds no references, and is built only of integers and byte arrays (so
// every byte pattern is a valid value) with no padding (asserted above).
unsafe impl ByteValued for Wire<BootInfo> {}
// SAFETY: as above for StatusPage: `repr(C)` integers, byte arrays and
// arrays of such structs (VcpuStatus, Metric), no padding (asserted above).
unsafe impl ByteValued for Wire<StatusPage> {}
