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

use std::collections::{HashMap, VecDeque};
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
use super::pool::CHUNK_SLOTS;
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

/// Most 2 MiB chunks committed ahead of one sequential stream of first
/// touches (32 MiB): the most memory the guest may hold that it has not
/// touched yet, per stream.
pub(crate) const COMMIT_AHEAD_MAX_CHUNKS: usize = 16;
/// Sequential streams followed at once (one per faulting thread, oldest
/// forgotten first).
const COMMIT_AHEAD_STREAMS: usize = 8;

/// Commit-ahead of sequential first touches.
///
/// Every first touch of a 2 MiB range costs the guest a round trip through
/// this thread (the vCPU sleeps in the kernel until the range is moved in)
/// and, in a THP-eligible range, a 2 MiB huge page the kernel allocates and
/// zeroes in the vCPU's fault path before it hands the fault to us (and
/// then frees). On a host whose cores are busy each round trip waits for
/// two scheduler wake-ups: a guest initialising 768 MiB took 3-7 s instead
/// of 0.7 s under two busy loops. A thread whose first touches walk up
/// through guest RAM (a guest initialising its memory) is therefore served
/// like the kernel's readahead: each touch that continues its stream
/// doubles a window (up to [`COMMIT_AHEAD_MAX_CHUNKS`]) of whole untouched
/// chunks committed before the thread reaches them, between the handler's
/// other work. A chunk the guest touched meanwhile is skipped, and a
/// commit ahead never takes the host's reserve or reclaims shadows.
#[derive(Debug, Default)]
pub(crate) struct CommitAhead {
    /// Per faulting thread: (last faulted chunk, end of the window queued, window).
    streams: VecDeque<(u32, usize, usize, usize)>,
    queue: VecDeque<usize>,
}

impl CommitAhead {
    /// Thread `tid` first-touched chunk `chunk` (and it was committed).
    pub(crate) fn on_first_touch(&mut self, tid: u32, chunk: usize) {
        let i = match self.streams.iter().position(|s| s.0 == tid) {
            Some(i) => i,
            None => {
                if self.streams.len() == COMMIT_AHEAD_STREAMS {
                    self.streams.pop_front();
                }
                self.streams.push_back((tid, chunk, chunk, 0));
                return;
            }
        };
        let (_, last, end, window) = self.streams[i];
        // Sequential: the touch lands after the last one and at most one
        // chunk past what was queued (the guest outran us, or skipped a
        // chunk it had touched already).
        let (from, window) = if chunk > last && chunk <= end + 1 {
            (
                end.max(chunk),
                (window * 2).clamp(1, COMMIT_AHEAD_MAX_CHUNKS),
            )
        } else {
            (chunk, 0)
        };
        let to = chunk + window;
        for c in from + 1..=to {
            self.queue.push_back(c);
        }
        self.streams[i] = (tid, chunk, to.max(chunk), window);
    }

    /// The next chunk to commit ahead, if any.
    pub(crate) fn next(&mut self) -> Option<usize> {
        self.queue.pop_front()
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

fn run(mem: &TieredMemory, stop: &AtomicBool) -> io::Result<()> {
    crate::threads::started(crate::threads::ThreadRole::FaultHandler);
    let mut events = Vec::new();
    let mut pending: HashMap<usize, Pending> = HashMap::new();
    let mut ahead = CommitAhead::default();
    while !stop.load(Ordering::Relaxed) {
        let timeout = if !ahead.is_empty() {
            0
        } else if pending.is_empty() {
            50
        } else {
            1
        };
        let (_, _) = mem.uffd.poll2(mem.release_event.as_raw_fd(), timeout)?;
        let _ = mem.release_event.read();
        events.clear();
        mem.uffd.read_events(&mut events)?;
        for ev in &events {
            if let Some(chunk) = handle_event(mem, ev, &mut pending) {
                ahead.on_first_touch(ev.thread_id, chunk);
            }
        }
        // One chunk ahead per turn, so that faults never wait behind more
        // than one commit of ours.
        if events.is_empty() {
            if let Some(chunk) = ahead.next() {
                if mem.commit_ahead(chunk) {
                    mem.counters.ahead_commits.fetch_add(1, Ordering::Relaxed);
                }
            }
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
        let oldest = pending
            .iter()
            .min_by_key(|(_, p)| p.arrival)
            .map(|(&page, p)| (page, p.thread_id, p.arrival));
        mem.backlog.publish(pending.len(), oldest);
    }
    Ok(())
}

/// Serves one fault event. Returns the 2 MiB chunk index when the fault
/// was a first touch committed here as a whole huge chunk (commit-ahead
/// follows such touches).
fn handle_event(
    mem: &TieredMemory,
    ev: &FaultEvent,
    pending: &mut HashMap<usize, Pending>,
) -> Option<usize> {
    let arrival = Instant::now();
    mem.counters.faults_served.fetch_add(1, Ordering::Relaxed);
    let page_of = mem.guest_page_of(ev.address);
    if let Some(page) = page_of {
        mem.backlog.note_fault(ev.thread_id, page);
    }
    let Some(page) = page_of else {
        mem.counters
            .unexpected_faults
            .fetch_add(1, Ordering::Relaxed);
        if mem.owns_addr(ev.address) {
            tracing::warn!("fault outside guest RAM at {:#x} (a mover bug)", ev.address);
        }
        let _ = mem
            .uffd
            .wake(ev.address as usize & !(PAGE_SIZE - 1), PAGE_SIZE);
        return None;
    };
    let p = Pending {
        arrival,
        thread_id: ev.thread_id,
        write: ev.write,
    };
    if pending.contains_key(&page) {
        return None; // another thread faulted on the same page; one wake serves both
    }
    let untouched = mem.pages.load(page) & POPULATED == 0;
    if !evaluate(mem, page, p, None) {
        pending.insert(page, p);
        return None;
    }
    (untouched && mem.huge_pages).then_some(page / CHUNK_SLOTS)
}

/// [`handle_event`] for tests: serves one fault event as the handler
/// thread would.
#[cfg(test)]
pub(super) fn handle_event_for_test(
    mem: &TieredMemory,
    ev: &FaultEvent,
    pending: &mut HashMap<usize, Pending>,
) {
    let _ = handle_event(mem, ev, pending);
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
            // Tests: the page may be unparked between this look and the taking.
            crate::test_point::reached(crate::test_point::TestPoint::FaultSawParked);
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
    // A huge page parked whole goes back whole. Not with a fault-path
    // policy (TPP): it decides page by page in the fault, and a range per
    // hint fault made it churn (issue 29's matrix, fast-first cells: 19k
    // promotions and 19k demotions in 6 s, 0.57-0.70x static).
    let hook = mem.fault_path_hook();
    let range = match hook {
        None => mem.acquire_parked_range(page),
        Some(_) => None,
    };
    let sample = HintFaultRecord {
        page: page as u64,
        ns_since_park: since_park.as_nanos() as u64,
        thread_id: p.thread_id,
        write: p.write,
        huge: range.is_some(),
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
    match hook {
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
    if let Some(first) = range {
        map_back_range(mem, first, page);
        count_hint_stall(mem, &p);
        return;
    }
    if mem.inject.io(crate::inject::FaultPoint::Wake).is_err()
        && mem
            .move_range(mem.guest_addr(page), mem.park_addr(page), PAGE_SIZE, false)
            .is_ok()
    {
        // TEST ONLY (`--test-fault-inject wake`): the page is back, its
        // toucher is not woken. The stall watchdog must find and wake it.
        mem.release_page(page, 0, PARKED | PROBE);
        return;
    }
    let outcome = mem.map_back_touched(page);
    if !matches!(outcome, MapBack::Moved) {
        tracing::error!("unparking touched page {page}: {outcome}");
    }
    // A move that filled the hole woke the toucher; every other outcome
    // (the page was back already, a copy, a stop) needs the wake, or the
    // toucher would wait for an event that never comes.
    let _ = mem.uffd.wake(mem.guest_addr(page), PAGE_SIZE);
    count_hint_stall(mem, &p);
}

/// Maps back the owned, parked huge range at `first` after a touch of its
/// `page` (see [`TieredMemory::map_back_touched_range`]) and wakes every
/// toucher of the range.
fn map_back_range(mem: &TieredMemory, first: usize, page: usize) {
    let (guest, len) = (mem.guest_addr(first), crate::sys::HUGE_PAGE_SIZE);
    if mem.inject.io(crate::inject::FaultPoint::Wake).is_err()
        && mem
            .move_range(guest, mem.park_addr(first), len, false)
            .is_ok()
    {
        // TEST ONLY: as in `hint_fault`, back and not woken.
        for p in first..first + crate::mem::pool::CHUNK_SLOTS {
            mem.release_page(p, 0, PARKED | PROBE);
        }
        return;
    }
    let outcome = mem.map_back_touched_range(first, page);
    if !matches!(outcome, MapBack::Moved) {
        tracing::error!("unparking touched page {page} (its huge range): {outcome}");
    }
    let _ = mem.uffd.wake(guest, len);
}

/// A hint fault is tracking cost, not a migration stall: it is counted
/// apart (tracking overhead), so `guest_stall_ms` measures what the
/// mechanisms cost the guest.
fn count_hint_stall(mem: &TieredMemory, p: &Pending) {
    let stall = p.arrival.elapsed().as_nanos() as u64;
    mem.counters
        .hint_stall_ns
        .fetch_add(stall, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{MemConfig, TieredMemory};

    fn drain(a: &mut CommitAhead) -> Vec<usize> {
        std::iter::from_fn(|| a.next()).collect()
    }

    #[test]
    fn commit_ahead_follows_sequential_streams_and_doubles_its_window() {
        let mut a = CommitAhead::default();
        a.on_first_touch(7, 10);
        assert_eq!(drain(&mut a), Vec::<usize>::new(), "one touch is no stream");
        a.on_first_touch(7, 11);
        assert_eq!(drain(&mut a), vec![12]);
        // The guest reaches the end of the window: it doubles.
        a.on_first_touch(7, 13);
        assert_eq!(drain(&mut a), vec![14, 15]);
        a.on_first_touch(7, 16);
        assert_eq!(drain(&mut a), vec![17, 18, 19, 20]);
        // A second thread's stream does not break the first one's.
        a.on_first_touch(9, 100);
        a.on_first_touch(9, 101);
        assert_eq!(drain(&mut a), vec![102]);
        a.on_first_touch(7, 21);
        assert_eq!(drain(&mut a), (22..=29).collect::<Vec<_>>());
        // The window stops growing at the cap.
        for c in [30, 46, 62, 78] {
            a.on_first_touch(7, c);
        }
        let q = drain(&mut a);
        assert_eq!(q.last(), Some(&(78 + COMMIT_AHEAD_MAX_CHUNKS)));
        assert!(q.windows(2).all(|w| w[1] == w[0] + 1), "{q:?}");
        // A touch out of order resets the stream: nothing ahead.
        a.on_first_touch(7, 5);
        assert_eq!(drain(&mut a), Vec::<usize>::new());
        a.on_first_touch(7, 6);
        assert_eq!(drain(&mut a), vec![7]);
        // Another first touch in the same chunk (committed page by page)
        // is not a step of the stream: nothing queued, and the stream
        // starts over from that chunk.
        a.on_first_touch(7, 6);
        assert_eq!(drain(&mut a), Vec::<usize>::new());
        a.on_first_touch(7, 7);
        assert_eq!(drain(&mut a), vec![8]);
    }

    #[test]
    fn unknown_addresses_are_counted_not_fatal() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = Arc::new(
            TieredMemory::new(&MemConfig::new(16 * PAGE_SIZE, 16))
                .expect("TieredMemory::new on a capable host"),
        );
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
        assert_eq!(mem.stats().migration.unexpected_faults, 3);
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
        assert_eq!(
            (st.backing.committed_pages, st.backing.populated_pages),
            (1, 1)
        );
        assert_eq!(mem.tier_of(3), Some(0));
        assert_eq!(st.tiers[0].resident_bytes, Some(PAGE_SIZE as u64));
        // A fault on a present page (filled before the event was read)
        // resolves at once, counted as a stall.
        handle_event(&mem, &ev, &mut pending);
        assert!(pending.is_empty());
        assert_eq!(mem.stats().migration.guest_stalls, 1);
        mem.check_consistency().unwrap();
        a_thread_blocked_outside_guest_ram_is_woken(&mem);
        mem.check_consistency().unwrap();
    }

    /// A real thread blocked on a hole of ours outside guest RAM (the
    /// parking slot of a page that is not parked) is woken at its own
    /// address: it faults again until the test fills the hole quietly (no
    /// wake), then returns with the page's word. On a page whose address
    /// has bit 12 set, read at an offset, so that any wrong mask of the
    /// address (cargo-mutants: 5 mutants of `ev.address & !(PAGE_SIZE - 1)`)
    /// wakes another address and leaves the thread blocked.
    fn a_thread_blocked_outside_guest_ram_is_woken(mem: &Arc<TieredMemory>) {
        use std::sync::atomic::AtomicU64;
        use std::time::Duration;
        let faults = FaultHandler::spawn(mem.clone()).unwrap();
        let page = (0..2).find(|&p| mem.park_addr(p) & PAGE_SIZE != 0).unwrap();
        let slot = mem.park_addr(page);
        let before = mem.stats().migration.unexpected_faults;
        let (tx, rx) = std::sync::mpsc::channel();
        let m = mem.clone();
        let toucher = std::thread::spawn(move || {
            // SAFETY: an aligned word of the memory's mapping, which `m` keeps mapped
            // while this thread runs; all test accesses to it are atomic.
            let v = unsafe { &*((slot + 8) as *const AtomicU64) }.load(Ordering::SeqCst);
            drop(m);
            let _ = tx.send(v);
        });
        let t0 = Instant::now();
        while mem.stats().migration.unexpected_faults == before
            && t0.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            mem.stats().migration.unexpected_faults > before,
            "no fault seen"
        );
        // Fill the hole without waking anyone: a pool page, word 1 = 0xfeed.
        let st = mem
            .reserve_staging(1, 1, super::super::pool::Holds::Hole)
            .expect("a pool slot");
        let a = st.addr(mem, 1, 0);
        // SAFETY: `a` is a reserved pool slot of our mapping (a hole is allocated by the
        // write), 8-byte aligned; nobody else uses it while we hold the reservation.
        unsafe { (a as *mut u64).add(1).write_volatile(0xfeed) };
        mem.move_range(slot, a, PAGE_SIZE, false)
            .expect("fill the hole quietly");
        mem.release_staging(1, &st, super::super::pool::Holds::Hole, false);
        let got = rx.recv_timeout(Duration::from_secs(10)).ok();
        if got.is_none() {
            // Free the toucher (the hole is filled: a wake lets it read).
            let _ = mem.uffd.wake(slot, PAGE_SIZE);
            let _ = rx.recv_timeout(Duration::from_secs(5));
        } else {
            toucher.join().unwrap();
        }
        assert_eq!(got, Some(0xfeed), "the thread was not woken within 10 s");
        faults.stop().unwrap();
        mem.discard(slot, PAGE_SIZE).unwrap();
    }
}
