//! The one audited place for the raw system calls and ioctls of the tiering
//! crate. Everything else in the crate is safe code on top of these
//! wrappers; every `unsafe` block of the crate that talks to the kernel is
//! in one of the files below:
//!
//! - `uffd`: userfaultfd (open, API, REGISTER, MOVE, ZEROPAGE, WAKE, reading
//!   fault messages).
//! - `mapping`: the anonymous reservation (`mmap`/`munmap`) and what is done
//!   to ranges of it (`madvise`, `mlock2`).
//! - `numa`: `mbind` and `move_pages`.
//! - `node_buffer`: a private buffer bound to one NUMA node, lent out as words
//!   (the engine's latency measurement of a tier's node).
//! - `pagemap`: residency and page-table queries (`mincore`, `PAGEMAP_SCAN`).
//! - `copy`: volatile copies and compares of memory other threads (vCPUs)
//!   may write concurrently.
//! - `alloc`: the zeroed allocation of atomic arrays.
//!
//! This file holds what they share: the ioctl number layout and error
//! wording, and two calls without arguments worth a file of their own
//! (`sysconf`, `gettid`).
//!
//! The Debian kernel headers on the build machines are older than
//! `UFFDIO_MOVE` (Linux 6.8) and `PAGEMAP_SCAN` (6.7), so their structures and
//! ioctl numbers are defined here by hand and checked against their known
//! values at compile time.

use std::io;

pub use crate::vocab::{HUGE_PAGE_SIZE, PAGE_SIZE};

mod alloc;
mod copy;
mod mapping;
mod node_buffer;
mod numa;
mod pagemap;
mod uffd;

pub use alloc::{zeroed_atomics, ZeroableAtomic};
pub use copy::{copy_volatile, equal_volatile, is_zero_volatile, zero_volatile};
pub use mapping::{discard, Advice, Mapping};
pub use node_buffer::NodeBuffer;
pub use numa::{move_pages_to, query_nodes, MAX_NODES};
pub use pagemap::{resident, PageScanner, Presence};
pub use uffd::{
    uffdio_api, userfaultfd_from_device, userfaultfd_syscall, FaultEvent, MoveError, RegisterMode,
    Uffd, UffdApi, UffdSource, DEV_USERFAULTFD, MOVE_TRANSIENT_RETRIES, UFFD_FEATURE_MOVE,
    UFFD_FEATURE_THREAD_ID,
};

const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)` (generic layout: x86_64, aarch64, riscv64).
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (ty << 8) | nr
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// `sysconf(_SC_PAGESIZE)`, 4096 if sysconf fails.
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant and has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// Calling thread's id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}
