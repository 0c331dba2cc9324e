//! Accessed-bit probes: the stand-in for page-table accessed bits on hosts
//! without idle page tracking (`/sys/kernel/mm/page_idle`).
//!
//! A policy that scans accessed bits of chosen pages (MTM's sampled pages)
//! gets each tested page *armed*: parked like a hint-fault window page, so
//! the guest's next touch faults once, the fault handler records an
//! [`super::AccessSample`] and maps the page back. "Accessed since the last
//! test" is then "a touch was recorded since the last test". Unlike the
//! [`super::HintSampler`]'s windows, which walk the address space, probes
//! park exactly the pages the policy tests, and only until its next test.
//!
//! Cost: one hint fault per armed page the guest touches per scan (about
//! 65 us of guest time on the development host, [`MEASURED_HINT_FAULT_GUEST_NS`]),
//! counted in the tracking overhead like every hint fault.

use std::io;
use std::sync::Arc;

use super::backing::{Parker, TieredMemory};
use super::pool::CHUNK_SLOTS;

/// Guest cost of one hint fault measured on the development host (PVM,
/// 2 cores) with `--tracking-ab`: [`super::sampler::GUEST_COST_FACTOR`] times
/// the 8.5 us the fault handler observes. Policies that budget their
/// profiling (MTM's Eq. 1) use it as the cost of one accessed-bit test.
pub const MEASURED_HINT_FAULT_GUEST_NS: f64 = 65_000.0;

/// The pages currently armed as accessed-bit probes.
#[derive(Debug)]
pub struct AccessProbes {
    mem: Arc<TieredMemory>,
    armed: Vec<usize>,
    armed_total: u64,
}

impl AccessProbes {
    /// No probes armed yet.
    pub fn new(mem: Arc<TieredMemory>) -> Self {
        Self {
            mem,
            armed: Vec::new(),
            armed_total: 0,
        }
    }

    /// Arms `pages` (out-of-range, busy and already parked pages are
    /// skipped). A page in a 2 MiB range mapped by one huge page arms its
    /// whole range, parked as one huge page: like the accessed bit of a huge
    /// page table entry, a touch anywhere in it reads as a touch of every
    /// page of it, and the huge page is never split by a probe. Returns how
    /// many pages were armed.
    pub fn arm(&mut self, pages: &[usize]) -> io::Result<usize> {
        let mut wide: Vec<usize> = Vec::with_capacity(pages.len());
        for &p in pages {
            match self.mem.huge_range_of(p) {
                Some(first) => wide.extend(first..first + CHUNK_SLOTS),
                None => wide.push(p),
            }
        }
        wide.sort_unstable();
        wide.dedup();
        let got = self.mem.park_pages(&wide, Parker::Probe)?;
        self.armed_total += got.len() as u64;
        let n = got.len();
        self.armed.extend(got);
        Ok(n)
    }

    /// Maps back every armed page the guest has not touched. Returns how
    /// many were still armed. Pages busy right now are retried for a bounded
    /// time (see `unpark_pages_settled`).
    pub fn disarm_all(&mut self) -> io::Result<usize> {
        let armed = std::mem::take(&mut self.armed);
        self.mem.unpark_pages_settled(&armed, Parker::Probe)
    }

    /// Armings since creation (a page re-armed at every scan counts each time).
    pub fn armed_total(&self) -> u64 {
        self.armed_total
    }
}

impl Drop for AccessProbes {
    fn drop(&mut self) {
        if let Err(e) = self.disarm_all() {
            tracing::error!("disarming accessed-bit probes: {e}");
        }
    }
}
