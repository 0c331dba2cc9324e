//! Test points: places in the mechanisms where a test can act
//! deterministically instead of racing (e.g. make the guest write between a
//! transactional migration's copy and its unmap). A point fires only on the
//! thread that armed it; unarmed, it costs one relaxed atomic load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// A place where a test may act.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestPoint {
    /// Transactional migration: the pages were copied to staging, the old
    /// pages are still mapped (step 2 done, step 3 not begun).
    TpmCopied,
    /// The fault handler's evaluation of a fault saw the page parked and
    /// has not taken it yet (a mover may unpark it here). Reached on the
    /// thread that serves the event: in tests, one that calls the
    /// handler's event function itself instead of the handler thread.
    FaultSawParked,
    /// The dirty harvester's `arm`: its harvest is done, the armed pages'
    /// bits are not cleared yet (a guest write here is one the re-arm
    /// forgets for those pages, and must keep for every other page).
    ArmHarvested,
    /// A harvest has read both dirty logs and consumed nothing yet (a
    /// write here is not in what it read: it must stay for the next).
    HarvestRead,
    /// A first-touch commit saw its page neither present nor owned and has
    /// not claimed it yet (another commit of the page, the fault handler's
    /// or `prefault`'s, may land here).
    FirstTouchChecked,
    /// The soft dirty log's `get` has read a word's dirty bits and not yet
    /// its count of writes in flight (a write ending here must still be
    /// in what it returns).
    DirtyBitsRead,
    /// `collapse_split_ranges` found a split 2 MiB range whole on one tier
    /// for the second scan in a row and has not taken its pages yet (a
    /// mover may move one of them here).
    CollapseScanned,
}

type Action = Arc<dyn Fn(TestPoint) + Send + Sync>;

static ARMED: AtomicUsize = AtomicUsize::new(0);
static ACTIONS: Mutex<Vec<(ThreadId, Action)>> = Mutex::new(Vec::new());

/// Runs `f` with `action` called at every test point reached on this
/// thread while `f` runs.
pub fn with_action<R>(
    action: impl Fn(TestPoint) + Send + Sync + 'static,
    f: impl FnOnce() -> R,
) -> R {
    let me = std::thread::current().id();
    ACTIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((me, Arc::new(action)));
    ARMED.fetch_add(1, Ordering::SeqCst);
    struct Disarm(ThreadId);
    impl Drop for Disarm {
        fn drop(&mut self) {
            ACTIONS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(t, _)| *t != self.0);
            ARMED.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _disarm = Disarm(me);
    f()
}

/// Marks `point`: runs this thread's action, if a test armed one.
pub fn reached(point: TestPoint) {
    if ARMED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let me = std::thread::current().id();
    let action = ACTIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(t, _)| *t == me)
        .map(|(_, a)| a.clone());
    if let Some(a) = action {
        a(point);
    }
}
