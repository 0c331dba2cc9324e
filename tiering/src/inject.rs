//! Failure injection for tests: the points of the syscall layer where a
//! failure can be injected ([`FaultPoint`]), the `--test-fault-inject` plan
//! parser ([`FaultPlan`]), and the per-memory [`Injector`] the wrappers in
//! [`crate::sys`] consult. Not a syscall wrapper itself: plain data and a
//! parser.

use std::io;

use serde::{Deserialize, Serialize};

/// A point of the syscall layer where a failure can be injected (tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FaultPoint {
    /// `UFFDIO_MOVE`.
    Move,
    /// `UFFDIO_ZEROPAGE`.
    ZeroPage,
    /// Making a page (`MADV_POPULATE_WRITE`, a first touch's allocation).
    Populate,
    /// `MADV_DONTNEED` of freed pages.
    Discard,
    /// `move_pages(2)` migration.
    MovePages,
    /// The dirty log's GET.
    DirtyGet,
    /// The dirty log's CLEAR.
    DirtyClear,
    /// The wake-up of a thread that touched a parked page (the map-back
    /// move does not wake and the explicit `UFFDIO_WAKE` is skipped): a
    /// lost wake-up, for the stall watchdog's tests.
    Wake,
    /// The fault handler's read of userfaultfd events: the handler thread
    /// ends with the error, which its `stop` returns (tests of that path).
    FaultRead,
    /// `MADV_COLLAPSE` of a split 2 MiB guest range back into a huge page
    /// (the kernel refuses when it cannot allocate one).
    Collapse,
}

impl std::str::FromStr for FaultPoint {
    type Err = FaultPlanError;
    fn from_str(s: &str) -> Result<Self, FaultPlanError> {
        Ok(match s {
            "move" => FaultPoint::Move,
            "zero-page" => FaultPoint::ZeroPage,
            "populate" => FaultPoint::Populate,
            "discard" => FaultPoint::Discard,
            "move-pages" => FaultPoint::MovePages,
            "dirty-get" => FaultPoint::DirtyGet,
            "dirty-clear" => FaultPoint::DirtyClear,
            "wake" => FaultPoint::Wake,
            "fault-read" => FaultPoint::FaultRead,
            "collapse" => FaultPoint::Collapse,
            _ => return Err(FaultPlanError::UnknownPoint(s.to_string())),
        })
    }
}

/// A fault plan (`--test-fault-inject`) that does not parse; each message
/// names what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultPlanError {
    /// Not one of the fault points.
    #[error(
        "unknown fault point '{0}': use move, zero-page, populate, discard, move-pages, \
         dirty-get, dirty-clear, wake, fault-read or collapse"
    )]
    UnknownPoint(String),
    /// A part after the point that is not `key=value`.
    #[error(
        "'{part}' in fault plan '{plan}' is not key=value (every=N, errno=NAME, max=N, moved=PAGES)"
    )]
    NotKeyValue {
        /// The part.
        part: String,
        /// The whole plan.
        plan: String,
    },
    /// `every=` or `max=` with a value that is not a number.
    #[error("'{value}' in fault plan '{plan}' is not a number")]
    NotANumber {
        /// The value.
        value: String,
        /// The whole plan.
        plan: String,
    },
    /// An errno that is neither a known name nor a number.
    #[error(
        "unknown errno '{value}' in fault plan '{plan}': use EIO, EBUSY, EAGAIN, ENOMEM, \
         EEXIST, ENOENT, EFAULT or a number"
    )]
    UnknownErrno {
        /// The value.
        value: String,
        /// The whole plan.
        plan: String,
    },
    /// A key other than every, errno and max.
    #[error("unknown key '{key}' in fault plan '{plan}' (every, errno, max, moved)")]
    UnknownKey {
        /// The key.
        key: String,
        /// The whole plan.
        plan: String,
    },
}

/// One injected failure: every `every`-th call of `point` fails with
/// `errno`, at most `max` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// Where.
    pub point: FaultPoint,
    /// Fail one call in this many (1: every call).
    pub every: u64,
    /// The errno of the failure.
    pub errno: i32,
    /// Failures after which the plan stops firing.
    pub max: u64,
    /// `move` only: the failure comes after this many pages of the range
    /// moved (at most all but one), as when the kernel stops part way.
    #[serde(default)]
    pub moved_pages: u64,
}

impl FaultPlan {
    /// Parses `POINT[:every=N][:errno=NAME|N][:max=N][:moved=PAGES]`, e.g.
    /// `move:every=50:errno=EBUSY`.
    pub fn parse(s: &str) -> Result<Self, FaultPlanError> {
        let mut parts = s.split(':');
        let point = parts.next().unwrap_or_default().parse()?;
        let mut plan = FaultPlan {
            point,
            every: 1,
            errno: libc::EIO,
            max: u64::MAX,
            moved_pages: 0,
        };
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| FaultPlanError::NotKeyValue {
                    part: kv.to_string(),
                    plan: s.to_string(),
                })?;
            let num = |v: &str| {
                v.parse::<u64>().map_err(|_| FaultPlanError::NotANumber {
                    value: v.to_string(),
                    plan: s.to_string(),
                })
            };
            match k {
                "every" => plan.every = num(v)?.max(1),
                "max" => plan.max = num(v)?,
                "moved" => plan.moved_pages = num(v)?,
                "errno" => {
                    plan.errno = parse_errno(v).ok_or_else(|| FaultPlanError::UnknownErrno {
                        value: v.to_string(),
                        plan: s.to_string(),
                    })?
                }
                _ => {
                    return Err(FaultPlanError::UnknownKey {
                        key: k.to_string(),
                        plan: s.to_string(),
                    })
                }
            }
        }
        Ok(plan)
    }
}

/// An errno by name (the ones fault plans use) or number.
fn parse_errno(v: &str) -> Option<i32> {
    Some(match v {
        "EIO" => libc::EIO,
        "EBUSY" => libc::EBUSY,
        "EAGAIN" => libc::EAGAIN,
        "ENOMEM" => libc::ENOMEM,
        "EEXIST" => libc::EEXIST,
        "ENOENT" => libc::ENOENT,
        "EFAULT" => libc::EFAULT,
        _ => return v.parse().ok(),
    })
}

/// Failure injection for one tiered memory (tests only: nothing fires
/// unless plans were set). Scoped to an instance, so tests running in
/// parallel do not disturb each other.
#[derive(Debug, Default)]
pub struct Injector {
    armed: std::sync::atomic::AtomicBool,
    plans: std::sync::Mutex<Vec<(FaultPlan, u64, u64)>>,
}

impl Injector {
    /// Replaces the plans (an empty list disarms).
    pub fn set(&self, plans: &[FaultPlan]) {
        let mut g = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        *g = plans.iter().map(|p| (*p, 0, 0)).collect();
        self.armed
            .store(!plans.is_empty(), std::sync::atomic::Ordering::Release);
    }

    /// Failures injected so far at `point`.
    pub fn fired(&self, point: FaultPoint) -> u64 {
        let g = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .filter(|(p, _, _)| p.point == point)
            .map(|x| x.2)
            .sum()
    }

    /// Whether a call at `point` must fail now (and with which errno).
    pub fn check(&self, point: FaultPoint) -> Option<i32> {
        self.check_plan(point).map(|p| p.errno)
    }

    /// Like [`Self::check`], with the whole plan that fired (a move's
    /// failure may come part way: [`FaultPlan::moved_pages`]).
    pub fn check_plan(&self, point: FaultPoint) -> Option<FaultPlan> {
        if !self.armed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut g = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        for (plan, calls, fired) in g.iter_mut().filter(|x| x.0.point == point) {
            *calls += 1;
            if *fired < plan.max && (*calls).is_multiple_of(plan.every) {
                *fired += 1;
                return Some(*plan);
            }
        }
        None
    }

    /// `Err` with the injected errno, if a call at `point` must fail now.
    pub fn io(&self, point: FaultPoint) -> io::Result<()> {
        match self.check(point) {
            Some(errno) => Err(io::Error::new(
                io::Error::from_raw_os_error(errno).kind(),
                format!(
                    "{point:?}: injected failure: {}",
                    io::Error::from_raw_os_error(errno)
                ),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_plans_parse_with_their_defaults_and_refuse_what_is_not_a_plan() {
        let p = FaultPlan::parse("move:every=3:errno=EBUSY:max=2:moved=5").unwrap();
        assert_eq!(
            (p.point, p.every, p.errno, p.max, p.moved_pages),
            (FaultPoint::Move, 3, libc::EBUSY, 2, 5)
        );
        let p = FaultPlan::parse("collapse").unwrap();
        assert_eq!(
            (p.point, p.every, p.errno, p.max, p.moved_pages),
            (FaultPoint::Collapse, 1, libc::EIO, u64::MAX, 0)
        );
        assert!(matches!(
            FaultPlan::parse("moves"),
            Err(FaultPlanError::UnknownPoint(_))
        ));
        assert!(matches!(
            FaultPlan::parse("move:moved"),
            Err(FaultPlanError::NotKeyValue { .. })
        ));
        assert!(matches!(
            FaultPlan::parse("move:moved=x"),
            Err(FaultPlanError::NotANumber { .. })
        ));
        assert!(matches!(
            FaultPlan::parse("move:errno=EWHAT"),
            Err(FaultPlanError::UnknownErrno { .. })
        ));
        assert!(matches!(
            FaultPlan::parse("move:often=2"),
            Err(FaultPlanError::UnknownKey { .. })
        ));
    }
}
