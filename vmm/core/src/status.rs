//! Reading what the guest publishes in its status page. Everything here is
//! guest-controlled and untrusted: counts are clamped, names validated,
//! non-finite values dropped; nothing can panic.

use std::collections::BTreeMap;

use serde::Serialize;
use tiervm_guest::abi::{
    self, Phase, StatusPage, MAX_METRICS, MAX_VCPUS, STATUS_GPA, STATUS_STOP_OFFSET,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest_abi::Wire;

/// One reading of the status page.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusSnapshot {
    /// Per-vCPU operation counters.
    pub ops: Vec<u64>,
    /// Per-vCPU phases (`None` = a value the ABI does not define).
    pub phases: Vec<Option<Phase>>,
    /// Result metrics with valid names and finite values.
    pub metrics: BTreeMap<String, f64>,
    /// Metric entries rejected (bad name or value).
    pub rejected_metrics: u32,
}

impl StatusSnapshot {
    /// Total operations (saturating).
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Whether the guest acknowledged a stop request: no vCPU is still
    /// setting up or running its workload (`Init`, `Run`). A guest that
    /// never publishes phases (`Boot`) cannot say, and counts as having
    /// acknowledged (its stop is bounded by `--stop-grace` alone).
    pub fn acknowledged_stop(&self) -> bool {
        !self
            .phases
            .iter()
            .any(|p| matches!(p, Some(Phase::Init | Phase::Run)))
    }
}

/// Decodes a status page for `vcpus` vCPUs.
pub fn decode(page: &StatusPage, vcpus: u32) -> StatusSnapshot {
    let n = (vcpus as usize).min(MAX_VCPUS);
    let ops = page.vcpus[..n].iter().map(|v| v.ops).collect();
    let phases = page.vcpus[..n]
        .iter()
        .map(|v| Phase::from_u64(v.phase))
        .collect();
    let count = usize::try_from(page.metric_count)
        .unwrap_or(usize::MAX)
        .min(MAX_METRICS);
    let mut metrics = BTreeMap::new();
    let mut rejected = 0;
    for m in &page.metrics[..count] {
        let value = f64::from_bits(m.value_bits);
        match abi::from_fixed(&m.name) {
            Some(name) if valid_metric_name(name) && value.is_finite() => {
                metrics.insert(name.to_string(), value);
            }
            _ => rejected += 1,
        }
    }
    StatusSnapshot {
        ops,
        phases,
        metrics,
        rejected_metrics: rejected,
    }
}

fn valid_metric_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Reads and decodes the status page from guest memory.
pub fn read(mem: &GuestMemoryMmap, vcpus: u32) -> StatusSnapshot {
    match mem.read_obj::<Wire<StatusPage>>(GuestAddress(STATUS_GPA)) {
        Ok(Wire(page)) => decode(&page, vcpus),
        Err(_) => StatusSnapshot::default(),
    }
}

/// Asks the guest to stop.
pub fn request_stop(mem: &GuestMemoryMmap) -> bool {
    mem.write_obj(1u64, GuestAddress(STATUS_GPA + STATUS_STOP_OFFSET))
        .is_ok()
}

/// One point of the throughput timeline.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct TimelinePoint {
    /// Seconds since the VM started running.
    pub t_s: f64,
    /// Total operations so far.
    pub ops: u64,
}

/// Tiered runs: every tier at one sample (the report's `tier_timeline`,
/// one entry per timeline sample).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TierTimelinePoint {
    /// Seconds since the VM started running.
    pub t_s: f64,
    /// Per tier, fastest first.
    pub tiers: Vec<TierSample>,
}

/// One tier at one timeline point.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TierSample {
    /// Capacity (the target after a resize), pages.
    pub capacity_pages: u64,
    /// Guest pages + shadows on the tier (the actual size), pages.
    pub pages: u64,
    /// Host memory of the tier, measured from the kernel; `None` if the
    /// measurement failed.
    pub resident_bytes: Option<u64>,
}

/// Operations per second over the samples taken while operations were
/// counting: from the first sample with a non-zero count to the last one,
/// so neither the set-up phase nor a partial first interval biases it.
pub fn ops_per_sec(timeline: &[TimelinePoint]) -> f64 {
    let Some(first) = timeline.iter().position(|p| p.ops > 0) else {
        return 0.0;
    };
    let a = timeline[first];
    let b = timeline[timeline.len() - 1];
    let dt = b.t_s - a.t_s;
    if dt <= 0.0 {
        return 0.0;
    }
    b.ops.saturating_sub(a.ops) as f64 / dt
}

/// Most points a run's timelines keep: an hour at the default 100 ms
/// sample. Beyond it [`Timelines`] drops every other point and halves its
/// rate, so a report stays bounded (about 7 MB of JSON) however long the run,
/// with evenly spaced points.
pub const MAX_TIMELINE_POINTS: usize = 36_000;

/// A run's throughput and per-tier timelines, bounded by
/// [`MAX_TIMELINE_POINTS`].
#[derive(Debug)]
pub struct Timelines {
    /// Throughput.
    pub ops: Vec<TimelinePoint>,
    /// Tiers (tiered runs).
    pub tiers: Vec<TierTimelinePoint>,
    /// Samples seen.
    seen: u64,
    /// The sample number of each point of `ops` and of `tiers`.
    ops_seen: Vec<u64>,
    tiers_seen: Vec<u64>,
    /// One sample in `stride` is recorded.
    stride: u64,
    /// Most points kept (tests lower it).
    max_points: usize,
}

impl Default for Timelines {
    fn default() -> Self {
        Self::with_max_points(MAX_TIMELINE_POINTS)
    }
}

impl Timelines {
    /// Timelines keeping at most `max_points` points each (at least 4).
    pub fn with_max_points(max_points: usize) -> Self {
        Self {
            ops: Vec::new(),
            tiers: Vec::new(),
            seen: 0,
            ops_seen: Vec::new(),
            tiers_seen: Vec::new(),
            stride: 1,
            max_points: max_points.max(4),
        }
    }

    /// Whether the next sample is recorded (call once per sample, then
    /// push with [`Self::push_ops`] / [`Self::push_tiers`] when it says so).
    pub fn record_next(&mut self) -> bool {
        self.seen += 1;
        self.seen.is_multiple_of(self.stride)
    }

    /// Records the throughput point of the current sample.
    pub fn push_ops(&mut self, p: TimelinePoint) {
        self.ops.push(p);
        self.ops_seen.push(self.seen);
    }

    /// Records the tiers' point of the current sample.
    pub fn push_tiers(&mut self, p: TierTimelinePoint) {
        self.tiers.push(p);
        self.tiers_seen.push(self.seen);
    }

    /// Halves both timelines when one is full: only the samples whose
    /// number is a multiple of the doubled stride stay (so the points stay
    /// evenly spaced), and the first that counted an operation
    /// ([`ops_per_sec`] starts there); later samples are recorded half as
    /// often.
    pub fn thin_if_full(&mut self) {
        if self.ops.len() <= self.max_points && self.tiers.len() <= self.max_points {
            return;
        }
        self.stride = self.stride.saturating_mul(2);
        let first_op = self.ops.iter().position(|p| p.ops > 0);
        let keep: Vec<bool> = (self.ops_seen.iter().enumerate())
            .map(|(i, n)| n.is_multiple_of(self.stride) || Some(i) == first_op)
            .collect();
        retain_marked(&mut self.ops, &keep);
        retain_marked(&mut self.ops_seen, &keep);
        let keep: Vec<bool> = self
            .tiers_seen
            .iter()
            .map(|n| n % self.stride == 0)
            .collect();
        retain_marked(&mut self.tiers, &keep);
        retain_marked(&mut self.tiers_seen, &keep);
    }
}

/// Keeps the items whose mark is true (an item without a mark stays).
fn retain_marked<T>(v: &mut Vec<T>, keep: &[bool]) {
    let mut i = 0;
    v.retain(|_| {
        let k = keep.get(i).copied().unwrap_or(true);
        i += 1;
        k
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page_from_bytes(bytes: &[u8]) -> StatusPage {
        let mut page = std::mem::MaybeUninit::<StatusPage>::zeroed();
        let n = bytes.len().min(std::mem::size_of::<StatusPage>());
        // SAFETY: StatusPage is plain integers and byte arrays (any bit pattern
        // is valid); we copy at most its size into zeroed storage.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), page.as_mut_ptr().cast::<u8>(), n);
            page.assume_init()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Hostile status pages decode without panicking, never yield more
        /// entries than the ABI allows, and keep only clean metrics.
        #[test]
        fn hostile_status_pages_decode_safely(bytes in proptest::collection::vec(any::<u8>(), 0..7000), vcpus in 0u32..200) {
            let snap = decode(&page_from_bytes(&bytes), vcpus);
            prop_assert!(snap.ops.len() <= MAX_VCPUS);
            prop_assert!(snap.metrics.len() <= MAX_METRICS);
            for (k, v) in &snap.metrics {
                prop_assert!(valid_metric_name(k));
                prop_assert!(v.is_finite());
            }
            let _ = snap.total_ops();
        }

        #[test]
        fn ops_per_sec_never_panics(points in proptest::collection::vec((0.0f64..1e6, any::<u64>()), 0..50)) {
            let tl: Vec<_> = points.into_iter().map(|(t_s, ops)| TimelinePoint { t_s, ops }).collect();
            let r = ops_per_sec(&tl);
            prop_assert!(r.is_finite() && r >= 0.0);
        }
    }

    #[test]
    fn decodes_metrics_and_rejects_bad_ones() {
        let mut page = page_from_bytes(&[]);
        page.metric_count = u64::MAX;
        page.metrics[0].name = abi::to_fixed("p99_ns").unwrap();
        page.metrics[0].value_bits = 123.0f64.to_bits();
        page.metrics[1].name = abi::to_fixed("bad name").unwrap();
        page.metrics[2].name = abi::to_fixed("nan").unwrap();
        page.metrics[2].value_bits = f64::NAN.to_bits();
        page.vcpus[0].ops = 5;
        page.vcpus[1].ops = u64::MAX;
        page.vcpus[1].phase = 99;
        let s = decode(&page, 2);
        assert_eq!(s.metrics.get("p99_ns"), Some(&123.0));
        assert_eq!(s.metrics.len(), 1);
        assert_eq!(s.rejected_metrics as usize, MAX_METRICS - 1);
        assert_eq!(s.total_ops(), u64::MAX);
        assert_eq!(s.phases, vec![Some(Phase::Boot), None]);
    }

    #[test]
    fn ops_per_sec_skips_setup() {
        let tl = [
            TimelinePoint { t_s: 0.1, ops: 0 },
            TimelinePoint { t_s: 0.2, ops: 0 },
            TimelinePoint { t_s: 0.3, ops: 50 },
            TimelinePoint {
                t_s: 1.3,
                ops: 1050,
            },
        ];
        assert!((ops_per_sec(&tl) - 1000.0).abs() < 1e-6);
        assert_eq!(ops_per_sec(&[]), 0.0);
    }

    #[test]
    fn long_runs_keep_bounded_evenly_spaced_timelines() {
        let mut t = Timelines::with_max_points(100);
        // 10,000 samples at 0.1 s, no operation in the first 3.
        for i in 0..10_000u64 {
            if t.record_next() {
                t.push_ops(TimelinePoint {
                    t_s: i as f64 * 0.1,
                    ops: i.saturating_sub(3) * 50,
                });
                t.push_tiers(TierTimelinePoint {
                    t_s: i as f64 * 0.1,
                    tiers: Vec::new(),
                });
            }
            t.thin_if_full();
        }
        assert!(t.ops.len() <= 100 && t.ops.len() >= 40, "{}", t.ops.len());
        assert!(t.tiers.len() <= 100, "{}", t.tiers.len());
        // The first point with an operation survives: the rate is exact.
        let rate = ops_per_sec(&t.ops);
        assert!((rate - 500.0).abs() < 1e-6, "{rate}");
        // Points after the first operation are evenly spaced.
        let first = t.ops.iter().position(|p| p.ops > 0).unwrap();
        let gaps: Vec<f64> = t.ops[first + 1..]
            .windows(2)
            .map(|w| w[1].t_s - w[0].t_s)
            .collect();
        let (lo, hi) = gaps
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &g| (lo.min(g), hi.max(g)));
        assert!(hi - lo < 1e-6, "gaps {lo}..{hi}");
    }
}
