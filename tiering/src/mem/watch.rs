//! What the memory layer tells a stall watchdog: the faults the handler is
//! holding (a vCPU waits on each), who owns the pages movers hold, and
//! what can safely be done for a page a vCPU has waited on too long.
//!
//! The fault handler publishes its oldest waiting fault at every turn
//! ([`FaultBacklog`]); every mover names what it is doing while it owns
//! pages ([`Activities`]). The VMM's watchdog (`vmm_core::liveness`) reads
//! both when a vCPU stays blocked, logs them, and calls
//! [`TieredMemory::unstick`] on the page.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::backing::{lock, TieredMemory};
use super::page_map::{BUSY, PARKED, POPULATED, PROBE, SHADOW, WAITER};
use crate::sys::PAGE_SIZE;

/// The handler's oldest waiting fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingFault {
    /// The guest page.
    pub page: usize,
    /// The faulting thread.
    pub thread_id: u32,
    /// How long it has waited (since the handler read the event).
    pub waited: Duration,
}

/// The faults the handler holds, as it last published them.
#[derive(Debug, Default)]
pub(crate) struct FaultBacklog {
    state: Mutex<Backlog>,
    /// Turns of the handler's loop (one publish each): an idle handler
    /// makes one per poll timeout, not one per spin.
    turns: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Backlog {
    waiting: usize,
    oldest: Option<(usize, u32, Instant)>,
    /// The last fault the handler read from each thread (page, when): a
    /// thread that stays blocked after its fault was served waits on
    /// that page (a lost wake-up).
    last_by_thread: std::collections::HashMap<u32, (usize, Instant)>,
}

/// Threads whose last fault is remembered (vCPUs and VMM threads).
const REMEMBERED_THREADS: usize = 1024;

impl FaultBacklog {
    /// The handler's view after a turn: `waiting` faults held, the oldest one.
    pub(crate) fn publish(&self, waiting: usize, oldest: Option<(usize, u32, Instant)>) {
        let mut s = lock(&self.state);
        s.waiting = waiting;
        s.oldest = oldest;
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    /// Turns the handler has made so far.
    #[cfg(test)]
    pub(crate) fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }

    /// The handler read a fault on `page` from thread `tid`.
    pub(crate) fn note_fault(&self, tid: u32, page: usize) {
        let mut s = lock(&self.state);
        if s.last_by_thread.len() >= REMEMBERED_THREADS && !s.last_by_thread.contains_key(&tid) {
            s.last_by_thread.clear();
        }
        s.last_by_thread.insert(tid, (page, Instant::now()));
    }

    fn last_of(&self, tid: u32) -> Option<WaitingFault> {
        let s = lock(&self.state);
        s.last_by_thread.get(&tid).map(|&(page, at)| WaitingFault {
            page,
            thread_id: tid,
            waited: at.elapsed(),
        })
    }

    fn read(&self) -> (usize, Option<WaitingFault>) {
        let s = lock(&self.state);
        let oldest = s.oldest.map(|(page, thread_id, since)| WaitingFault {
            page,
            thread_id,
            waited: since.elapsed(),
        });
        (s.waiting, oldest)
    }
}

/// What one mover thread does while it owns pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activity {
    /// The thread's name (`tiering-engine`, `tiervm-chaos`, ...).
    pub thread: String,
    /// What it does (`migrating 512 pages to tier 0`).
    pub what: String,
    /// For how long.
    pub since: Duration,
}

/// Movers' current activities (one entry per thread at most).
#[derive(Debug, Default)]
pub(crate) struct Activities {
    list: Mutex<Vec<(String, String, Instant)>>,
}

/// Ends an activity when dropped.
pub(crate) struct ActivityGuard<'a> {
    acts: &'a Activities,
    thread: String,
}

impl Activities {
    /// The calling thread starts `what` (until the guard drops).
    pub(crate) fn begin(&self, what: String) -> ActivityGuard<'_> {
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        let mut l = lock(&self.list);
        l.retain(|(t, _, _)| *t != thread);
        l.push((thread.clone(), what, Instant::now()));
        ActivityGuard { acts: self, thread }
    }

    fn snapshot(&self) -> Vec<Activity> {
        lock(&self.list)
            .iter()
            .map(|(thread, what, since)| Activity {
                thread: thread.clone(),
                what: what.clone(),
                since: since.elapsed(),
            })
            .collect()
    }
}

impl Drop for ActivityGuard<'_> {
    fn drop(&mut self) {
        lock(&self.acts.list).retain(|(t, _, _)| *t != self.thread);
    }
}

/// What the memory layer knows when a vCPU has been blocked too long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StallView {
    /// Faults the handler holds (each one a thread waiting).
    pub waiting_faults: usize,
    /// The oldest of them.
    pub oldest: Option<WaitingFault>,
    /// The last fault the handler read from the blocked thread (served or
    /// not): the page it most likely waits on.
    pub last_of_thread: Option<WaitingFault>,
    /// The oldest fault's page state (`BUSY PARKED ...`), if any.
    pub page_state: Option<String>,
    /// What the movers are doing.
    pub activities: Vec<Activity>,
}

impl std::fmt::Display for StallView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.oldest {
            Some(w) => write!(
                f,
                "the fault handler holds {} fault(s); the oldest, on guest page {} by thread {}, \
                 has waited {:.1} s (page state: {})",
                self.waiting_faults,
                w.page,
                w.thread_id,
                w.waited.as_secs_f64(),
                self.page_state.as_deref().unwrap_or("?")
            )?,
            None => f.write_str("the fault handler holds no fault")?,
        }
        match &self.last_of_thread {
            Some(w) => write!(
                f,
                "; the blocked thread's last fault read by the handler was on guest page {}, \
                 {:.1} s ago",
                w.page,
                w.waited.as_secs_f64()
            )?,
            None => f.write_str("; the handler never read a fault of the blocked thread")?,
        }
        if self.activities.is_empty() {
            f.write_str("; no mover is busy")
        } else {
            for a in &self.activities {
                write!(
                    f,
                    "; {} is {} (for {:.1} s)",
                    a.thread,
                    a.what,
                    a.since.as_secs_f64()
                )?;
            }
            Ok(())
        }
    }
}

/// What [`TieredMemory::unstick`] did for a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unstick {
    /// The page is in guest RAM: its waiters were woken (a lost wake-up
    /// cannot keep them).
    Woken,
    /// The page was parked: it was mapped back and its waiters woken.
    Unparked,
    /// The page was a hole nobody owned: recovered from its copy and woken.
    Recovered,
    /// A mover owns the page: nothing can be done safely but wait for it.
    OwnedByMover,
    /// The page was never touched and no tier has room for its first touch
    /// (capacity in flight, or a tier shrunk below what the guest uses).
    NoRoom,
}

/// See [`TieredMemory::page_waited_by`].
fn waited_page(view: &StallView) -> Option<usize> {
    match (view.oldest, view.last_of_thread) {
        (Some(o), Some(l)) if o.thread_id == l.thread_id => Some(o.page),
        (_, Some(l)) => Some(l.page),
        (Some(o), None) => Some(o.page),
        (None, None) => None,
    }
}

/// Names the flags of a page-map word.
pub(crate) fn describe_word(w: u64) -> String {
    let mut out = Vec::new();
    for (bit, name) in [
        (POPULATED, "POPULATED"),
        (BUSY, "BUSY (a mover owns it)"),
        (PARKED, "PARKED"),
        (PROBE, "PROBE"),
        (SHADOW, "SHADOW"),
        (WAITER, "WAITER"),
    ] {
        if w & bit != 0 {
            out.push(name);
        }
    }
    if out.is_empty() {
        "untouched".into()
    } else {
        out.join(" ")
    }
}

impl TieredMemory {
    /// The faults the handler holds, the last one thread `tid` (a blocked
    /// vCPU) raised, and what movers are doing.
    pub fn stall_view(&self, tid: Option<u32>) -> StallView {
        let (waiting_faults, oldest) = self.backlog.read();
        StallView {
            waiting_faults,
            page_state: oldest.map(|w| describe_word(self.pages.load(w.page))),
            oldest,
            last_of_thread: tid.and_then(|t| self.backlog.last_of(t)),
            activities: self.activities.snapshot(),
        }
    }

    /// The page thread `tid` most likely waits on: its fault the handler
    /// still holds, else the last fault the handler read from it.
    pub fn page_waited_by(&self, view: &StallView) -> Option<usize> {
        waited_page(view)
    }

    /// Wakes every thread waiting on any guest page: each one retries its
    /// access, and one whose page is still missing faults again (the
    /// handler then sees it). Harmless; the last resort for a waiter the
    /// handler has no record of.
    pub fn wake_all(&self) {
        let _ = self.uffd.wake(self.guest_addr(0), self.guest_len());
    }

    /// Does what can safely be done for guest page `page`, on which a
    /// thread has waited too long: a present page's waiters are woken; a
    /// parked page nobody else owns is mapped back; a hole nobody owns is
    /// recovered from its copy. A page a mover owns is left to the mover
    /// (taking it would race the mover's moves). Every case also wakes the
    /// address: waking a thread whose page is still missing only makes it
    /// fault again, which the handler then sees.
    pub fn unstick(&self, page: usize) -> Unstick {
        if page >= self.guest_pages() {
            return Unstick::Woken;
        }
        let wake = || {
            let _ = self.uffd.wake(self.guest_addr(page), PAGE_SIZE);
        };
        let present = || {
            crate::sys::resident(self.guest_addr(page), 1)
                .map(|r| r[0])
                .unwrap_or(false)
        };
        let w = self.pages.load(page);
        if w & BUSY != 0 {
            wake();
            return Unstick::OwnedByMover;
        }
        let Some(w) = self.pages.try_acquire(page, true) else {
            wake();
            return Unstick::OwnedByMover;
        };
        let outcome = if w & POPULATED == 0 {
            self.release_page(page, 0, 0);
            wake();
            return Unstick::NoRoom;
        } else if w & PARKED != 0 {
            let back = self.map_back_touched(page);
            tracing::warn!("watchdog: guest page {page} was parked: {back}");
            Unstick::Unparked
        } else if !present() {
            // (Populated: the first case took the untouched page.)
            // recover_hole releases the page (or stops the VM).
            self.recover_hole(page);
            wake();
            return Unstick::Recovered;
        } else {
            self.release_page(page, 0, 0);
            Unstick::Woken
        };
        wake();
        self.counters
            .watchdog_unsticks
            .fetch_add(1, Ordering::Relaxed);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(page: usize, thread_id: u32) -> WaitingFault {
        WaitingFault {
            page,
            thread_id,
            waited: Duration::ZERO,
        }
    }

    /// The page a blocked thread waits on: its own fault the handler holds,
    /// else its last fault read, else the handler's oldest (a thread the
    /// handler never heard of may still wait behind it), else none.
    #[test]
    fn the_page_waited_on_is_the_blocked_threads_own_fault_first() {
        let page = |oldest: Option<WaitingFault>, last_of_thread: Option<WaitingFault>| {
            let v = StallView {
                waiting_faults: usize::from(oldest.is_some()),
                oldest,
                last_of_thread,
                page_state: None,
                activities: Vec::new(),
            };
            waited_page(&v)
        };
        assert_eq!(page(Some(fault(1, 7)), Some(fault(2, 7))), Some(1));
        assert_eq!(page(Some(fault(1, 8)), Some(fault(2, 7))), Some(2));
        assert_eq!(page(None, Some(fault(2, 7))), Some(2));
        assert_eq!(page(Some(fault(1, 8)), None), Some(1));
        assert_eq!(page(None, None), None);
    }

    #[test]
    fn a_word_is_described_by_each_of_its_flags_in_order() {
        assert_eq!(describe_word(0), "untouched");
        assert_eq!(describe_word(POPULATED), "POPULATED");
        assert_eq!(describe_word(BUSY), "BUSY (a mover owns it)");
        assert_eq!(describe_word(PARKED), "PARKED");
        assert_eq!(describe_word(PROBE), "PROBE");
        assert_eq!(describe_word(SHADOW), "SHADOW");
        assert_eq!(describe_word(WAITER), "WAITER");
        assert_eq!(
            describe_word(POPULATED | PARKED | WAITER),
            "POPULATED PARKED WAITER"
        );
    }

    /// The handler's published view is what a reader gets; each thread's
    /// last fault is remembered, and the memory of threads is bounded: a
    /// new thread past the bound starts it over, a known one does not.
    #[test]
    fn the_backlog_keeps_the_published_view_and_a_bounded_last_fault_per_thread() {
        let b = FaultBacklog::default();
        assert_eq!(b.read(), (0, None));
        b.publish(3, Some((7, 42, Instant::now())));
        let (waiting, oldest) = b.read();
        assert_eq!(waiting, 3);
        let o = oldest.expect("the oldest fault");
        assert_eq!((o.page, o.thread_id), (7, 42));
        assert_eq!(b.turns(), 1);
        b.publish(0, None);
        assert_eq!(b.read(), (0, None));
        assert_eq!(b.turns(), 2);

        b.note_fault(5, 9);
        b.note_fault(5, 10);
        assert_eq!(b.last_of(5).map(|w| (w.page, w.thread_id)), Some((10, 5)));
        assert!(b.last_of(6).is_none());
        let b = FaultBacklog::default();
        let full = REMEMBERED_THREADS as u32;
        for t in 0..full {
            b.note_fault(1000 + t, t as usize);
        }
        // Full: a known thread is updated in place.
        b.note_fault(1000, 77);
        assert_eq!(b.last_of(1000).map(|w| w.page), Some(77));
        assert!(
            b.last_of(1001).is_some(),
            "a known thread cleared the others"
        );
        // A new one starts over.
        b.note_fault(1000 + full, 1);
        assert!(
            b.last_of(1001).is_none(),
            "the memory of threads is unbounded"
        );
        assert_eq!(b.last_of(1000 + full).map(|w| w.page), Some(1));
    }

    /// One activity per thread: a second `begin` replaces the first; a
    /// guard's drop ends only its own thread's.
    #[test]
    fn each_thread_has_one_activity_until_its_guard_drops() {
        let acts = Activities::default();
        let names = |a: &Activities| {
            let mut v: Vec<(String, String)> = a
                .snapshot()
                .into_iter()
                .map(|x| (x.thread, x.what))
                .collect();
            v.sort();
            v
        };
        let pair = |t: &str, w: &str| (t.to_string(), w.to_string());
        let acts = &acts;
        std::thread::scope(|s| {
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let (held, started) = std::sync::mpsc::channel::<()>();
            let other = std::thread::Builder::new()
                .name("mover-b".into())
                .spawn_scoped(s, move || {
                    let _g = acts.begin("demoting".into());
                    held.send(()).unwrap();
                    wait.recv().unwrap();
                })
                .unwrap();
            started.recv().unwrap();
            std::thread::Builder::new()
                .name("mover-a".into())
                .spawn_scoped(s, || {
                    let g1 = acts.begin("promoting".into());
                    let g2 = acts.begin("parking".into());
                    assert_eq!(
                        names(acts),
                        [pair("mover-a", "parking"), pair("mover-b", "demoting")]
                    );
                    drop(g2);
                    drop(g1);
                    assert_eq!(names(acts), [pair("mover-b", "demoting")]);
                })
                .unwrap()
                .join()
                .unwrap();
            go.send(()).unwrap();
            other.join().unwrap();
        });
        assert!(names(acts).is_empty());
    }
}
