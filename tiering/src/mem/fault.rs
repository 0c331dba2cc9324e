//! The userfaultfd fault handler: one thread that serves guest (and VMM)
//! faults on pages that are in flight or parked.
//!
//! - A page in flight (owned by a mover): the mover's `UFFDIO_MOVE` that fills
//!   the hole wakes the waiter. The handler flags the page `WAITER` and learns
//!   the fill time from the release, to measure the stall. If the fill happened
//!   before the event was read, it just issues a (harmless) `UFFDIO_WAKE`.
//! - A parked page (hint-fault sampling): the handler records a
//!   [`HintFaultRecord`] and moves the page back, which wakes the waiter.
//! - A never-touched page: the handler commits it (lazy commit, see
//!   [`super::commit`]); the move that fills it wakes the waiter.
//! - Anything else (addresses outside guest RAM, pages that should be present):
//!   counted as unexpected and woken, never a panic.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::backing::{lock, TieredMemory};
use super::commit::CommitOutcome;
use super::page_map::{BUSY, PARKED, POPULATED, PROBE};
use super::park::MapBack;
use super::HintFaultRecord;
use crate::sys::{FaultEvent, PAGE_SIZE};

/// A running fault handler thread; stops on [`stop`](FaultHandler::stop) or drop.
#[derive(Debug)]
pub struct FaultHandler {
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<io::Result<()>>>,
}

#[derive(Clone, Copy)]
pub(super) struct Pending {
    arrival: Instant,
    thread_id: u32,
    write: bool,
}

impl FaultHandler {
    /// Starts the handler thread for `mem`.
    pub fn spawn(mem: Arc<TieredMemory>) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let join = std::thread::Builder::new()
            .name("tiervm-uffd".into())
            .spawn(move || run(&mem, &s))?;
        Ok(Self {
            stop,
            join: Some(join),
        })
    }

    /// Stops the thread and returns its result.
    pub fn stop(mut self) -> io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.join.take() {
            Some(j) => j
                .join()
                .map_err(|_| io::Error::other("fault handler thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for FaultHandler {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!("fault handler: {e}");
        }
    }
}

fn run(mem: &TieredMemory, stop: &AtomicBool) -> io::Result<()> {
    crate::threads::started(crate::threads::ThreadRole::FaultHandler);
    let mut events = Vec::new();
    let mut pending: HashMap<usize, Pending> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let timeout = if pending.is_empty() { 50 } else { 1 };
        let (_, _) = mem.uffd.poll2(mem.release_event.as_raw_fd(), timeout)?;
        let _ = mem.release_event.read();
        events.clear();
        mem.uffd.read_events(&mut events)?;
        for ev in &events {
            handle_event(mem, ev, &mut pending);
        }
        // Releases of pages the handler waits on, with their fill times.
        while let Ok((page, filled)) = mem.release_rx.try_recv() {
            if let Some(p) = pending.remove(&(page as usize)) {
                if !evaluate(mem, page as usize, p, Some(filled)) {
                    pending.insert(page as usize, p);
                }
            }
        }
        // Fallback re-check (a release notification may race with WAITER).
        if !pending.is_empty() {
            let pages: Vec<usize> = pending.keys().copied().collect();
            for page in pages {
                let p = pending[&page];
                if evaluate(mem, page, p, None) {
                    pending.remove(&page);
                }
            }
        }
    }
    Ok(())
}

fn handle_event(mem: &TieredMemory, ev: &FaultEvent, pending: &mut HashMap<usize, Pending>) {
    let arrival = Instant::now();
    let Some(page) = mem.guest_page_of(ev.address) else {
        mem.counters
            .unexpected_faults
            .fetch_add(1, Ordering::Relaxed);
        if mem.owns_addr(ev.address) {
            tracing::warn!("fault outside guest RAM at {:#x} (a mover bug)", ev.address);
        }
        let _ = mem
            .uffd
            .wake(ev.address as usize & !(PAGE_SIZE - 1), PAGE_SIZE);
        return;
    };
    let p = Pending {
        arrival,
        thread_id: ev.thread_id,
        write: ev.write,
    };
    if pending.contains_key(&page) {
        return; // another thread faulted on the same page; one wake serves both
    }
    if !evaluate(mem, page, p, None) {
        pending.insert(page, p);
    }
}

/// [`handle_event`] for tests: serves one fault event as the handler
/// thread would.
#[cfg(test)]
pub(super) fn handle_event_for_test(
    mem: &TieredMemory,
    ev: &FaultEvent,
    pending: &mut HashMap<usize, Pending>,
) {
    handle_event(mem, ev, pending)
}

/// Resolves a fault on `page` if possible. Returns false when the page is
/// still owned by a mover (the fault stays pending, `WAITER` set) or could
/// not be committed yet (no tier has room right now; retried).
fn evaluate(mem: &TieredMemory, page: usize, p: Pending, filled: Option<Instant>) -> bool {
    loop {
        let w = mem.pages.wait_if_busy(page);
        if w & BUSY != 0 {
            return false;
        }
        if w & PARKED != 0 {
            if mem.pages.try_acquire(page, true).is_none() {
                continue;
            }
            if mem.pages.load(page) & PARKED == 0 {
                mem.release_page(page, 0, 0);
                continue;
            }
            hint_fault(mem, page, p);
            return true;
        }
        if w & POPULATED == 0 {
            match mem.commit_first_touch(page) {
                CommitOutcome::Present => {
                    // The move that filled the page woke the waiter already.
                    return true;
                }
                CommitOutcome::Busy => continue,
                CommitOutcome::NoRoom => return false,
            }
        }
        // Present (filled before or while we looked): wake is harmless. But
        // if the bookkeeping says present and guest RAM has a hole, waking
        // would make the guest fault again forever: recover the page.
        if !crate::sys::resident(mem.guest_addr(page), 1)
            .map(|r| r[0])
            .unwrap_or(true)
            && mem.pages.load(page) & (BUSY | PARKED) == 0
        {
            if mem.pages.try_acquire(page, false).is_some() {
                mem.recover_hole(page);
            }
            continue;
        }
        let _ = mem.uffd.wake(mem.guest_addr(page), PAGE_SIZE);
        let end = filled.unwrap_or_else(Instant::now);
        let stall = end.saturating_duration_since(p.arrival).as_nanos() as u64;
        mem.counters.guest_stalls.fetch_add(1, Ordering::Relaxed);
        mem.counters
            .guest_stall_ns
            .fetch_add(stall, Ordering::Relaxed);
        return true;
    }
}

/// A touch of a parked page the handler owns now: record it (or let the
/// fault-path policy promote the page) and map the page back.
fn hint_fault(mem: &TieredMemory, page: usize, p: Pending) {
    // Record the sample before the move wakes the toucher, so that a drain
    // right after the touch sees it.
    let since_park = lock(&mem.park_epoch).elapsed();
    let sample = HintFaultRecord {
        page: page as u64,
        ns_since_park: since_park.as_nanos() as u64,
        thread_id: p.thread_id,
        write: p.write,
    };
    mem.counters.hint_faults.fetch_add(1, Ordering::Relaxed);
    if mem.pages.load(page) & PROBE == 0 {
        // A sampler window's page (the sampler parks every page in turn):
        // the host's measure of the guest's access rate. Probes park
        // pages a policy picked, which would bias it.
        let w = crate::engine::profile::hint_weight(sample.ns_since_park);
        mem.sampled_weights
            .record(page, u16::try_from(w).unwrap_or(u16::MAX));
    }
    match mem.fault_path_hook() {
        Some(hook) => {
            // The policy decides now; a promotion happens before the faulting
            // access resumes, and its whole duration is a migration stall.
            if hook(&sample) {
                match mem.promote_parked_owned(page) {
                    Ok(true) => {
                        let stall = p.arrival.elapsed().as_nanos() as u64;
                        mem.counters.guest_stalls.fetch_add(1, Ordering::Relaxed);
                        mem.counters
                            .guest_stall_ns
                            .fetch_add(stall, Ordering::Relaxed);
                        return;
                    }
                    Ok(false) => {}
                    Err(e) => tracing::error!("fault-path promotion of page {page}: {e}"),
                }
            }
        }
        None => lock(&mem.samples).push(sample),
    }
    let outcome = mem.map_back_touched(page);
    if !matches!(outcome, MapBack::Moved) {
        tracing::error!("unparking touched page {page}: {outcome}");
    }
    // A move that filled the hole woke the toucher; every other outcome
    // (the page was back already, a copy, a stop) needs the wake, or the
    // toucher would wait for an event that never comes.
    let _ = mem.uffd.wake(mem.guest_addr(page), PAGE_SIZE);
    let stall = p.arrival.elapsed().as_nanos() as u64;
    // A hint fault is tracking cost, not a migration stall: it is counted
    // apart (tracking overhead), so `guest_stall_ms` measures what the
    // mechanisms cost the guest.
    mem.counters
        .hint_stall_ns
        .fetch_add(stall, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{MemConfig, TieredMemory};

    #[test]
    fn unknown_addresses_are_counted_not_fatal() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = TieredMemory::new(&MemConfig::new(16 * PAGE_SIZE, 16))
            .expect("TieredMemory::new on a capable host");
        let mut pending = HashMap::new();
        for address in [
            0u64,
            u64::MAX,
            mem.guest_ptr() as u64 + mem.guest_len() as u64 + 5,
        ] {
            let ev = FaultEvent {
                address,
                thread_id: 1,
                write: true,
            };
            handle_event(&mem, &ev, &mut pending);
        }
        assert!(pending.is_empty());
        assert_eq!(mem.stats().unexpected_faults, 3);
        // A fault on a never-touched page commits it (16 pages: no whole
        // 2 MiB range, so one 4 KiB page on the fast tier).
        let ev = FaultEvent {
            address: mem.guest_ptr() as u64 + 3 * PAGE_SIZE as u64,
            thread_id: 1,
            write: false,
        };
        handle_event(&mem, &ev, &mut pending);
        assert!(pending.is_empty());
        let st = mem.stats();
        assert_eq!((st.committed_pages, st.populated_pages), (1, 1));
        assert_eq!(mem.tier_of(3), Some(0));
        assert_eq!(st.tiers[0].resident_bytes, Some(PAGE_SIZE as u64));
        // A fault on a present page (filled before the event was read)
        // resolves at once, counted as a stall.
        handle_event(&mem, &ev, &mut pending);
        assert!(pending.is_empty());
        assert_eq!(mem.stats().guest_stalls, 1);
        mem.check_consistency().unwrap();
    }
}
