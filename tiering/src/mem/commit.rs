//! Lazy commit: host memory is taken when the guest (or the VMM) first
//! touches a guest page, never before.
//!
//! Every guest page starts as a hole in guest RAM, which is registered with
//! the userfaultfd in MISSING mode, so the first touch reaches the fault
//! handler. The handler places the page by the VM's [`InitialPlacement`]
//! on the first tier with room (capacity is accounted before anything is
//! allocated), makes a fresh page in that tier's pool (a write into a pool
//! hole allocates on the pool's `mbind` node) and moves it into guest RAM
//! with `UFFDIO_MOVE`. Where the whole 2 MiB range around the page is
//! untouched, the range is committed at once as one transparent huge page
//! (populated in a huge pool chunk, moved as one PMD), so a tiered VM gets
//! the TLB reach of THP-backed untiered memory.
//!
//! Before memory is taken from a node, [`HostGuard`] checks that the node
//! keeps `host_reserve_bytes` free. If it would not, the VM is stopped with
//! a clear out-of-memory error (the fatal hook), instead of the kernel's
//! OOM killer ending the VMM or a SIGBUS ending the guest; the faults that
//! arrive while the VM stops are still served (from the reserve) so that
//! nothing hangs.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::backing::{lock, InitialPlacement, Staging, TieredMemory};
use super::page_map::{self, on_tier, BUSY, PARKED, POPULATED};
use super::pool::{Holds, CHUNK_SLOTS};
use crate::sys::{self, Advice, HUGE_PAGE_SIZE, PAGE_SIZE};
use crate::vocab::TierId;

/// Attempts of a failed commit (other than out of memory) before the VM
/// stops, with a backoff from 100 us doubling up to 1.6 ms (about 8 ms in
/// all): a multi-page fill that meets a transient failure on one of its
/// pages starts over, and under CPU contention the failing condition may
/// outlast a few 100 us retries (the injected `populate:every=2` case of
/// `injected_move_and_populate_failures_lose_nothing_and_never_hang` failed so on a
/// loaded host with 4 retries of 100 us).
const COMMIT_RETRIES: u32 = 8;

/// Runs `attempt` until it succeeds, fails with out of memory (final), or
/// [`COMMIT_RETRIES`] retries failed, sleeping between tries from 100 us
/// doubling to 1.6 ms plus a jitter from the clock and `seed`: two threads
/// retrying in lockstep must not keep drawing the failing turn of a shared
/// cause (seen in CI in the injected populate failure tests).
fn retry_transient(
    seed: u64,
    mut attempt: impl FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut result = attempt();
    for n in 0..COMMIT_RETRIES {
        match &result {
            Err(e) if e.raw_os_error() != Some(libc::ENOMEM) => {
                let clock = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                std::thread::sleep(retry_delay(n, clock, seed));
                result = attempt();
            }
            _ => break,
        }
    }
    result
}

/// The sleep before retry `n` (from 0) of [`retry_transient`]: 100 us
/// doubling up to 1.6 ms, plus a jitter of under 97 us from `clock` (the
/// clock's nanoseconds) and under 53 us from `seed`.
fn retry_delay(n: u32, clock: u32, seed: u64) -> Duration {
    let jitter = u64::from(clock % 97) + seed % 53;
    Duration::from_micros((100 << n.min(4)) + jitter)
}

/// How often the guard re-reads the node's free memory at most.
const GUARD_RECHECK: Duration = Duration::from_millis(100);
/// Bytes committed after which the guard re-reads at once.
const GUARD_RECHECK_BYTES: u64 = 32 << 20;

/// Keeps commits from exhausting a node (see the module docs).
#[derive(Debug)]
pub(crate) struct HostGuard {
    reserve: u64,
    /// Reads a node's available bytes: the host's meminfo ([`host_available`];
    /// tests give a fake).
    available_on: fn(u32) -> u64,
    state: Mutex<HashMap<u32, NodeView>>,
}

/// A node's available bytes as the host reports them; a node whose figure
/// cannot be read is not guarded (`u64::MAX`).
fn host_available(node: u32) -> u64 {
    crate::host::available_bytes_on(node).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, Copy)]
struct NodeView {
    read_at: Instant,
    available: u64,
    taken_since: u64,
}

/// A first touch the host cannot back without going below its reserve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "host out of memory on NUMA node {node}: committing {} KiB more would leave {} MiB \
     available, below the {} MiB reserve; the guest touched more memory than the host can give \
     (lower --mem or the tier capacities, free host memory, or lower --host-reserve)",
    .bytes >> 10,
    .available.saturating_sub(*.bytes) >> 20,
    .reserve >> 20
)]
pub struct OutOfHostMemory {
    /// The NUMA node.
    pub node: u32,
    /// What the touch would commit, bytes.
    pub bytes: u64,
    /// What the node had available (as last read, less what was taken since).
    pub available: u64,
    /// The reserve kept free, bytes.
    pub reserve: u64,
}

impl HostGuard {
    pub(crate) fn new(reserve: u64) -> Self {
        Self::reading(reserve, host_available)
    }

    fn reading(reserve: u64, available_on: fn(u32) -> u64) -> Self {
        Self {
            reserve,
            available_on,
            state: Mutex::new(HashMap::new()),
        }
    }

    /// May `bytes` more be taken from `node`?
    pub(crate) fn admit(&self, node: u32, bytes: u64) -> Result<(), OutOfHostMemory> {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let stale = |v: &NodeView| {
            now.duration_since(v.read_at) >= GUARD_RECHECK || v.taken_since >= GUARD_RECHECK_BYTES
        };
        let view = match st.get(&node) {
            Some(v) if !stale(v) => *v,
            _ => {
                let available = (self.available_on)(node);
                let v = NodeView {
                    read_at: now,
                    available,
                    taken_since: 0,
                };
                st.insert(node, v);
                v
            }
        };
        let left = view
            .available
            .saturating_sub(view.taken_since)
            .saturating_sub(bytes);
        if left < self.reserve {
            return Err(OutOfHostMemory {
                node,
                bytes,
                available: view.available.saturating_sub(view.taken_since),
                reserve: self.reserve,
            });
        }
        if let Some(v) = st.get_mut(&node) {
            v.taken_since += bytes;
        }
        Ok(())
    }
}

/// How long [`TieredMemory::prefault`] waits for a page another thread owns
/// (a mover's transaction holds a page for milliseconds).
pub const PREFAULT_WAIT: Duration = Duration::from_secs(10);

/// What [`TieredMemory::commit_first_touch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitOutcome {
    /// The page is present now (committed here or by someone else).
    Present,
    /// A mover owns the page (or one of its chunk): wait for its release.
    Busy,
    /// No tier has room right now (reservations in flight); try again.
    NoRoom,
}

impl TieredMemory {
    /// The tiers in the order the placement tries them for placement unit
    /// `unit` (a 2 MiB chunk index, or a page index without huge pages).
    pub(crate) fn placement_order(&self, unit: usize) -> Vec<TierId> {
        let n = self.tier_count();
        let first = match self.placement {
            InitialPlacement::FastFirst => 0,
            InitialPlacement::SlowFirst => n - 1,
            InitialPlacement::Interleave => unit % n,
            InitialPlacement::Random { seed } => {
                (split_mix(seed ^ unit as u64) % n as u64) as usize
            }
        };
        let mut order: Vec<TierId> = vec![first as TierId];
        match self.placement {
            InitialPlacement::SlowFirst => {
                order.extend((0..n).rev().filter(|&t| t != first).map(|t| t as TierId))
            }
            _ => order.extend((0..n).filter(|&t| t != first).map(|t| t as TierId)),
        }
        order
    }

    /// Commits the never-touched guest page `page` (and, with huge pages,
    /// its whole untouched 2 MiB range) on the first tier with room. Called
    /// by the fault handler for a missing fault on a page that is not
    /// `POPULATED`, and by [`Self::prefault`].
    pub(crate) fn commit_first_touch(&self, page: usize) -> CommitOutcome {
        let w = self.pages.load(page);
        if w & POPULATED != 0 {
            return CommitOutcome::Present;
        }
        if w & (BUSY | PARKED) != 0 {
            return CommitOutcome::Busy;
        }
        crate::test_point::reached(crate::test_point::TestPoint::FirstTouchChecked);
        let (first, count) = match self.acquire_untouched_chunk(page) {
            Some(r) => r,
            None => match self.pages.try_acquire(page, false) {
                None => return CommitOutcome::Busy,
                Some(w) if w & POPULATED != 0 => {
                    self.release_page(page, 0, 0);
                    return CommitOutcome::Present;
                }
                Some(_) => (page, 1),
            },
        };
        self.commit_owned(page, first, count, false)
    }

    /// Commits 2 MiB chunk `chunk` ahead of the guest when every page of it
    /// is still untouched and free (a sequential stream of first touches is
    /// about to reach it, see `fault::CommitAhead`). Returns whether it did;
    /// a chunk the guest touched meanwhile, or one with no room, is left to
    /// the guest's own fault.
    pub(crate) fn commit_ahead(&self, chunk: usize) -> bool {
        let first = chunk.saturating_mul(CHUNK_SLOTS);
        if first >= self.guest_pages || self.fatal_error().is_some() {
            return false;
        }
        match self.acquire_untouched_chunk(first) {
            Some((first, count)) => {
                self.commit_owned(first, first, count, true) == CommitOutcome::Present
                    && self.pages.load(first) & POPULATED != 0
            }
            None => false,
        }
    }

    /// Commits the owned, untouched pages `[first, first+count)` (`page`,
    /// one of them, names the fault in errors) on the first tier of the
    /// placement order with room, and releases them. A commit `ahead` of
    /// the guest is never made from the host reserve: it gives up instead.
    fn commit_owned(&self, page: usize, first: usize, count: usize, ahead: bool) -> CommitOutcome {
        let unit = if count == CHUNK_SLOTS {
            first / CHUNK_SLOTS
        } else {
            first
        };
        let release_all = |mem: &Self| {
            for p in first..first + count {
                mem.release_page(p, 0, 0);
            }
        };
        let Some(tier) = self.reserve_for_commit(unit, count, !ahead) else {
            release_all(self);
            return CommitOutcome::NoRoom;
        };
        let node = self.node(tier);
        if let Err(e) = self.host_guard.admit(node, (count * PAGE_SIZE) as u64) {
            if ahead {
                self.tiers[usize::from(tier)].unreserve(count as u64);
                release_all(self);
                return CommitOutcome::NoRoom;
            }
            // Stop the VM; keep serving this fault from the reserve so that
            // the faulting thread (a vCPU, the VMM) is not left hanging.
            self.set_fatal(e.to_string());
            self.counters
                .emergency_commits
                .fetch_add(count as u64, Ordering::Relaxed);
        }
        match retry_transient(first as u64, || self.fill_from_pool(tier, first, count)) {
            Ok(()) => {
                for p in first..first + count {
                    self.release_page(p, on_tier(tier), page_map::PLACEMENT_BITS);
                }
                self.tiers[usize::from(tier)].unreserve(count as u64);
                self.counters
                    .committed_pages
                    .fetch_add(count as u64, Ordering::Relaxed);
                if count == CHUNK_SLOTS {
                    self.counters.huge_commits.fetch_add(1, Ordering::Relaxed);
                }
                CommitOutcome::Present
            }
            Err(e) => {
                self.tiers[usize::from(tier)].unreserve(count as u64);
                release_all(self);
                self.set_fatal(format!(
                    "committing guest page {page} on tier {} (node {node}) failed: {e}",
                    self.tiers[usize::from(tier)].spec.name
                ));
                // Release the faulting thread with the zero page: it reads
                // zeros, and the VM is being stopped.
                let _ = self.uffd.zero_page(self.guest_addr(page), PAGE_SIZE);
                CommitOutcome::Present
            }
        }
    }

    /// Commits every guest page of `[first, first+pages)` that is still
    /// untouched (loaders and tests; the guest never needs it), waiting up
    /// to [`PREFAULT_WAIT`] for a page another thread owns.
    pub fn prefault(&self, first: usize, pages: usize) -> std::io::Result<()> {
        self.prefault_within(first, pages, PREFAULT_WAIT)
    }

    /// [`Self::prefault`], giving up after `wait` on a page owned elsewhere.
    fn prefault_within(&self, first: usize, pages: usize, wait: Duration) -> std::io::Result<()> {
        let end = first.saturating_add(pages).min(self.guest_pages);
        let mut p = first;
        let deadline = Instant::now() + wait;
        while p < end {
            match self.commit_first_touch(p) {
                CommitOutcome::Present => p += 1,
                CommitOutcome::Busy | CommitOutcome::NoRoom if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                o => {
                    return Err(std::io::Error::other(format!(
                        "prefault of guest page {p}: {o:?} for {wait:?}"
                    )))
                }
            }
            if let Some(e) = self.fatal_error() {
                return Err(std::io::Error::other(e.to_string()));
            }
        }
        Ok(())
    }

    /// With huge pages, acquires the whole 2 MiB chunk of `page` if every
    /// page of it is untouched and free. Returns (first page, 512).
    fn acquire_untouched_chunk(&self, page: usize) -> Option<(usize, usize)> {
        if !self.huge_pages {
            return None;
        }
        let first = page / CHUNK_SLOTS * CHUNK_SLOTS;
        if first + CHUNK_SLOTS > self.guest_pages {
            return None;
        }
        let untouched = |w: u64| w & (POPULATED | BUSY | PARKED) == 0;
        if !(first..first + CHUNK_SLOTS).all(|p| untouched(self.pages.load(p))) {
            return None;
        }
        for p in first..first + CHUNK_SLOTS {
            match self.pages.try_acquire(p, false) {
                Some(w) if untouched(w) => {}
                Some(_) => {
                    for q in first..=p {
                        self.release_page(q, 0, 0);
                    }
                    return None;
                }
                None => {
                    for q in first..p {
                        self.release_page(q, 0, 0);
                    }
                    return None;
                }
            }
        }
        Some((first, CHUNK_SLOTS))
    }

    /// Reserves `count` pages on the first tier of the placement order with
    /// room, reclaiming shadows once if none has (and `reclaim`).
    fn reserve_for_commit(&self, unit: usize, count: usize, reclaim: bool) -> Option<TierId> {
        let order = self.placement_order(unit);
        for round in 0..1 + usize::from(reclaim) {
            for &t in &order {
                if self.tiers[usize::from(t)].try_reserve(count as u64) {
                    return Some(t);
                }
            }
            if round == 0 {
                for &t in &order {
                    self.reclaim_shadows(t, count + self.shadow_low_watermark(t));
                }
            }
        }
        None
    }

    /// `MADV_POPULATE_WRITE` of `len` bytes of our pool at `a`, retried on
    /// its own ([`retry_transient`]), so a fill of many pages does not start
    /// over for one page's failure (a fill that needs two populates in a row
    /// never got through `populate:every=2`).
    fn populate_retrying(&self, a: usize, len: usize) -> std::io::Result<()> {
        retry_transient(a as u64 >> 12, || {
            self.inject.io(crate::inject::FaultPoint::Populate)?;
            self.mapping().advise(a, len, Advice::PopulateWrite)
        })
    }

    /// Makes `count` fresh zeroed pages on `tier` and moves them into guest
    /// RAM at `first` (one huge page when `count` is a whole chunk and a
    /// huge pool chunk is free).
    fn fill_from_pool(&self, tier: TierId, first: usize, count: usize) -> std::io::Result<()> {
        let staging = self
            .reserve_staging(tier, count, Holds::Hole)
            .ok_or_else(|| {
                std::io::Error::other(format!("no pool slot left on tier {tier} (accounting bug)"))
            })?;
        let len = count * PAGE_SIZE;
        let result = (|| -> std::io::Result<bool> {
            match &staging {
                Staging::Chunk(slot, holds) => {
                    let a = self.slot_addr(tier, *slot);
                    if *holds == Holds::Cached {
                        // SAFETY: a reserved, resident huge chunk of our pool; nobody else
                        // uses it while we hold the reservation.
                        unsafe { sys::zero_volatile(a as *mut u8, HUGE_PAGE_SIZE) };
                    } else {
                        self.populate_retrying(a, HUGE_PAGE_SIZE)?;
                    }
                    let huge = self
                        .scanner
                        .scan(a, a + HUGE_PAGE_SIZE, |_, _, _| {})
                        .map(|p| p.huge == HUGE_PAGE_SIZE as u64)
                        .unwrap_or(false);
                    self.publish_placement(first, count, tier);
                    self.move_range(self.guest_addr(first), a, len, true)?;
                    if huge {
                        self.note_huge(first, count);
                    }
                    Ok(huge)
                }
                Staging::Pages(slots) => {
                    for (i, (slot, holds)) in slots.iter().enumerate() {
                        let a = self.slot_addr(tier, *slot);
                        if *holds == Holds::Cached {
                            // SAFETY: a reserved, resident pool page nobody else uses.
                            unsafe { sys::zero_volatile(a as *mut u8, PAGE_SIZE) };
                        } else {
                            self.populate_retrying(a, PAGE_SIZE)?;
                        }
                        let _ = i;
                    }
                    let pairs: Vec<_> = slots
                        .iter()
                        .enumerate()
                        .map(|(i, (s, _))| (self.guest_addr(first + i), self.slot_addr(tier, *s)))
                        .collect();
                    self.publish_placement(first, count, tier);
                    self.move_pairs(&pairs)?;
                    Ok(false)
                }
            }
        })();
        match result {
            Ok(huge) => {
                self.release_staging(tier, &staging, Holds::Hole, huge);
                Ok(())
            }
            Err(e) => {
                // Nothing reached guest RAM if the move failed before it
                // moved anything; what did move is put back into the pool.
                let back: Vec<_> = (0..count)
                    .map(|i| (staging.addr(self, tier, i), self.guest_addr(first + i)))
                    .collect();
                self.move_pairs_present(&back);
                self.release_staging_checked(tier, &staging);
                Err(e)
            }
        }
    }
}

fn split_mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::mem::account::TierSpec;
    use crate::mem::MemConfig;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_guard_counts_what_it_admitted_until_it_reads_the_node_again() {
        // Node 0 has 1 GiB, node 1 100 MiB (a fake read: exact figures).
        fn read(node: u32) -> u64 {
            if node == 0 {
                GIB
            } else {
                100 * MIB
            }
        }
        // The calls are microseconds apart; a run preempted past the
        // 100 ms re-read window reads again and is retried.
        for attempt in 0.. {
            let g = HostGuard::reading(GIB - 10 * MIB, read);
            let start = Instant::now();
            let r = [4 * MIB, 4 * MIB, 2 * MIB, 1].map(|b| g.admit(0, b));
            if start.elapsed() > GUARD_RECHECK / 2 && attempt < 5 {
                continue;
            }
            assert_eq!(
                r[..3],
                [Ok(()), Ok(()), Ok(())],
                "exactly down to the reserve"
            );
            let want = OutOfHostMemory {
                node: 0,
                bytes: 1,
                available: GIB - 10 * MIB,
                reserve: GIB - 10 * MIB,
            };
            assert_eq!(r[3], Err(want), "one byte past the reserve");
            // Each node has its own view.
            let e = g.admit(1, 4096).unwrap_err();
            assert_eq!((e.node, e.available), (1, 100 * MIB));
            break;
        }
    }

    #[test]
    fn the_guard_reads_again_after_32_mib_taken() {
        static READS: AtomicUsize = AtomicUsize::new(0);
        fn read(_: u32) -> u64 {
            READS.fetch_add(1, Ordering::SeqCst);
            GIB
        }
        let g = HostGuard::reading(GIB - 40 * MIB, read);
        g.admit(0, 31 * MIB).unwrap();
        g.admit(0, MIB).unwrap();
        assert_eq!(READS.load(Ordering::SeqCst), 1);
        // 32 MiB taken since the read: the next admission reads the node
        // again (nothing was allocated, so it has its 1 GiB).
        g.admit(0, 16 * MIB).unwrap();
        assert_eq!(READS.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_guard_reads_again_after_100_ms() {
        static READS: AtomicUsize = AtomicUsize::new(0);
        fn read(_: u32) -> u64 {
            READS.fetch_add(1, Ordering::SeqCst);
            GIB
        }
        let g = HostGuard::reading(GIB - 10 * MIB, read);
        g.admit(0, 8 * MIB).unwrap();
        std::thread::sleep(GUARD_RECHECK + Duration::from_millis(10));
        g.admit(0, 8 * MIB).unwrap();
        assert_eq!(READS.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn transient_failures_are_retried_with_a_growing_backoff_and_enomem_is_final() {
        let eio = || std::io::Error::from_raw_os_error(libc::EIO);
        let mut n = 0;
        let r = retry_transient(7, || {
            n += 1;
            if n < 4 {
                Err(eio())
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok());
        assert_eq!(n, 4);
        let mut n = 0;
        let r = retry_transient(7, || {
            n += 1;
            Err(std::io::Error::from_raw_os_error(libc::ENOMEM))
        });
        assert_eq!((n, r.unwrap_err().raw_os_error()), (1, Some(libc::ENOMEM)));
        // Always failing: 1 + COMMIT_RETRIES attempts, sleeping 100, 200,
        // 400, 800 us and then 1.6 ms (plus jitter under 150 us each).
        let mut n = 0;
        let start = Instant::now();
        let r = retry_transient(u64::MAX, || {
            n += 1;
            Err(eio())
        });
        let took = start.elapsed();
        assert_eq!((n, r.unwrap_err().raw_os_error()), (9, Some(libc::EIO)));
        assert!(took >= Duration::from_micros(7900), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn the_retry_delay_doubles_to_1_6_ms_with_a_bounded_jitter() {
        let us = |n, clock, seed| retry_delay(n, clock, seed).as_micros();
        let base: Vec<_> = (0..8).map(|n| us(n, 0, 0)).collect();
        assert_eq!(base, [100, 200, 400, 800, 1600, 1600, 1600, 1600]);
        assert_eq!(us(0, 96, 52), 100 + 96 + 52, "the largest jitter");
        assert_eq!(us(2, 97, 53), 400, "the jitter wraps");
        assert_eq!(us(7, 1000, 1000), 1600 + 1000 % 97 + 1000 % 53);
    }

    /// Commit-ahead takes a whole untouched chunk of guest RAM, and nothing
    /// once the VM is stopping (a fatal error) or past guest RAM.
    #[test]
    fn commit_ahead_stops_with_the_vm_and_at_the_end_of_guest_ram() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = TieredMemory::new(&MemConfig::new(8 << 20, 1024)).unwrap();
        assert!(mem.commit_ahead(1), "chunk 1 of 4, untouched");
        assert!(!mem.commit_ahead(1), "committed already");
        assert!(!mem.commit_ahead(4), "past guest RAM");
        mem.set_fatal("the test stops the VM".into());
        assert!(!mem.commit_ahead(2), "the VM is stopping");
        let committed =
            |r: std::ops::Range<usize>| r.filter(|&p| mem.pages.load(p) & POPULATED != 0).count();
        assert_eq!((committed(512..1024), committed(1024..2048)), (512, 0));
    }

    /// A commit ahead whose fill fails (every populate refused) reports
    /// nothing committed; the failure stops the VM.
    #[test]
    fn a_failed_commit_ahead_reports_nothing_committed() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = TieredMemory::new(&MemConfig::new(8 << 20, 1024)).unwrap();
        let plan = crate::inject::FaultPlan::parse("populate:errno=EIO").unwrap();
        mem.injector().set(&[plan]);
        assert!(!mem.commit_ahead(1));
        mem.injector().set(&[]);
        assert!(mem
            .fatal_error()
            .is_some_and(|e| e.contains("committing guest page 512")));
        assert_eq!(mem.pages.load(512) & POPULATED, 0);
    }

    /// A commit charges the host guard its bytes: a 2 MiB chunk, 2 MiB.
    #[test]
    fn a_commit_charges_the_host_guard_its_bytes() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = TieredMemory::new(&MemConfig::new(8 << 20, 1024)).unwrap();
        assert!(mem.commit_ahead(1));
        let taken = lock(&mem.host_guard.state).get(&0).map(|v| v.taken_since);
        assert_eq!(taken, Some(2 << 20));
    }

    /// Prefault waits (bounded) for a page another thread owns and commits
    /// it once released, instead of failing at the first busy page.
    #[test]
    fn prefault_waits_for_a_busy_page() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = std::sync::Arc::new(TieredMemory::new(&MemConfig::new(1 << 20, 256)).unwrap());
        assert!(
            mem.pages.try_acquire(3, false).is_some(),
            "the test owns page 3"
        );
        let owner = crate::mem::tests::release_later(&mem, 3, Duration::from_millis(50));
        mem.prefault(0, 8).unwrap();
        owner.join().unwrap();
        assert!((0..8).all(|p| mem.pages.load(p) & POPULATED != 0));
    }

    /// ... and gives up once its bound has passed, naming the page, instead
    /// of waiting for an owner that may never let go. Planted bug: the
    /// bound's guard made `true` (a cargo-mutants miss): prefault waited
    /// until the owner let go after 1 s and succeeded.
    #[test]
    fn prefault_gives_up_on_a_page_held_past_its_bound() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = std::sync::Arc::new(TieredMemory::new(&MemConfig::new(1 << 20, 256)).unwrap());
        assert!(mem.pages.try_acquire(3, false).is_some());
        let owner = crate::mem::tests::release_later(&mem, 3, Duration::from_secs(1));
        let e = mem
            .prefault_within(0, 8, Duration::from_millis(50))
            .unwrap_err();
        assert!(e.to_string().contains("guest page 3: Busy"), "{e}");
        owner.join().unwrap();
        assert_eq!(mem.pages.load(3) & POPULATED, 0);
    }

    #[test]
    fn split_mix_is_splitmix64() {
        // The first output of SplitMix64 seeded with 0 and with 1.
        assert_eq!(split_mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(split_mix(1), 0x910a_2dec_8902_5cc1);
    }

    #[test]
    fn the_placement_order_starts_where_the_placement_says_and_tries_every_tier() {
        if !crate::host_support::require(&[crate::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let order = |placement: InitialPlacement, unit: usize| {
            let mut cfg = MemConfig::new(4 << 20, 256);
            cfg.tiers.push(TierSpec {
                name: "cxl".into(),
                node: 0,
                capacity_pages: 1024,
                max_capacity_pages: 1024,
            });
            cfg.placement = placement;
            TieredMemory::new(&cfg).unwrap().placement_order(unit)
        };
        assert_eq!(order(InitialPlacement::FastFirst, 5), vec![0, 1, 2]);
        assert_eq!(order(InitialPlacement::SlowFirst, 5), vec![2, 1, 0]);
        assert_eq!(order(InitialPlacement::Interleave, 4), vec![1, 0, 2]);
        assert_eq!(order(InitialPlacement::Interleave, 5), vec![2, 0, 1]);
        for unit in 0..6 {
            let seed = 11;
            let first = (split_mix(seed ^ unit as u64) % 3) as TierId;
            let mut want = vec![first];
            want.extend((0..3).filter(|&t| t != first));
            assert_eq!(order(InitialPlacement::Random { seed }, unit), want);
        }
    }
}
