//! A one-line live progress display on stderr while a VM runs: elapsed and
//! remaining time, guest ops/s over the last sample, and (when a tiering
//! probe is given) migrations/s and pages per tier.
//!
//! The line is redrawn in place with `\r` and cleared when the run ends. It
//! is drawn only when stderr is a terminal and the user did not ask for
//! `--quiet`, so logs and pipes never see it.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use tiering::mem::TieredMemory;

use vmm_core::runner::{RunHooks, SampleCtx};
use vmm_core::units::group;

/// Reads the tiering layer's live counters: total migrations so far
/// (promotions + demotions) and pages resident per tier `[fast, slow]`.
pub type TierProbe = Arc<dyn Fn() -> (u64, Vec<TierLine>) + Send + Sync>;

/// One tier on the progress line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierLine {
    /// Tier name.
    pub name: String,
    /// Guest pages + shadows on it.
    pub pages: u64,
    /// Its capacity (target), pages.
    pub capacity_pages: u64,
    /// Host memory it holds, measured from the kernel.
    pub resident_bytes: Option<u64>,
}

/// A probe on tiered memory: migrations = promotions + demotions so far,
/// and every tier's use, capacity and kernel-measured resident memory (a
/// page-table walk of the present parts of the areas); it is only called
/// when the line is drawn.
pub fn tiered_probe(mem: Arc<TieredMemory>) -> TierProbe {
    Arc::new(move || {
        let s = mem.stats();
        let tiers = s
            .tiers
            .iter()
            .map(|t| TierLine {
                name: t.name.clone(),
                pages: t.pages,
                capacity_pages: t.capacity_pages,
                resident_bytes: t.resident_bytes,
            })
            .collect();
        let m = &s.migration;
        (m.promotions.saturating_add(m.demotions), tiers)
    })
}

/// ANSI "erase to the end of the line".
const CLEAR_TO_EOL: &str = "\x1b[K";

/// The numbers one progress line shows.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressLine {
    /// Seconds since the vCPUs started.
    pub elapsed_s: f64,
    /// Requested run length, when there is one.
    pub duration_s: Option<f64>,
    /// Guest ops/s over the last sample interval (`None` before the second sample).
    pub ops_per_sec: Option<f64>,
    /// Migrations/s over the last sample interval (`None` without a probe or before the second sample).
    pub migrations_per_sec: Option<f64>,
    /// Pages per tier `[fast, slow]`, when a probe is given.
    pub tiers: Option<Vec<TierLine>>,
    /// The placement policy's mode, for policies with modes (`adaptive`).
    pub mode: Option<String>,
}

impl ProgressLine {
    /// The text of the line (without `\r` or terminal control codes).
    pub fn render(&self, label: &str) -> String {
        let mut s = String::new();
        if !label.is_empty() {
            s.push_str(&format!("[{label}] "));
        }
        s.push_str(&format!("{:.1} s", self.elapsed_s));
        if let Some(d) = self.duration_s {
            let left = d - self.elapsed_s;
            if left > 0.0 {
                s.push_str(&format!(" of {d:.1} s ({left:.1} s left)"));
            } else {
                s.push_str(&format!(" of {d:.1} s (stopping)"));
            }
        }
        match self.ops_per_sec {
            Some(r) => s.push_str(&format!("  {} ops/s", si(r))),
            None => s.push_str("  - ops/s"),
        }
        if let Some(m) = self.migrations_per_sec {
            s.push_str(&format!("  {} migrations/s", si(m)));
        }
        for t in self.tiers.iter().flatten() {
            let resident = t
                .resident_bytes
                .map_or(String::new(), |b| format!(" {}B", si(b as f64)));
            s.push_str(&format!(
                "  {} {}/{}p{resident}",
                t.name,
                group(t.pages),
                group(t.capacity_pages)
            ));
        }
        if let Some(m) = &self.mode {
            s.push_str(&format!("  mode: {m}"));
        }
        s
    }
}

/// `1234567.0` -> `1.23M`; small numbers keep one decimal.
pub fn si(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.1}")
    }
}

/// The live progress display: a [`RunHooks`] that redraws one stderr line
/// per sample.
pub struct Progress {
    label: String,
    duration: Option<Duration>,
    probe: Option<TierProbe>,
    mode: Option<tiering::engine::ModeSlot>,
    out: Option<Box<dyn Write + Send>>,
    last: Option<(f64, u64, Option<u64>)>,
    drawn: bool,
}

impl Progress {
    /// A display on stderr, labelled `label` (e.g. `tpp 2/3`), for a run of
    /// `duration` (`None` = until the guest exits). Silent when `quiet` or
    /// when stderr is not a terminal.
    pub fn stderr(label: impl Into<String>, duration: Option<Duration>, quiet: bool) -> Self {
        let out: Option<Box<dyn Write + Send>> = if !quiet && std::io::stderr().is_terminal() {
            Some(Box::new(std::io::stderr()))
        } else {
            None
        };
        Self::new(label, duration, out)
    }

    /// A display on `out` (`None` = silent). Used by tests.
    pub fn new(
        label: impl Into<String>,
        duration: Option<Duration>,
        out: Option<Box<dyn Write + Send>>,
    ) -> Self {
        Self {
            label: label.into(),
            duration,
            probe: None,
            mode: None,
            out,
            last: None,
            drawn: false,
        }
    }

    /// Adds the tiering probe (migrations/s and pages per tier).
    pub fn with_probe(mut self, probe: TierProbe) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Sets the tiering probe once the tiered memory exists (e.g. from a
    /// hook called when the run starts).
    pub fn set_probe(&mut self, probe: TierProbe) {
        self.probe = Some(probe);
    }

    /// Whether anything is drawn.
    pub fn is_enabled(&self) -> bool {
        self.out.is_some()
    }

    /// The line for a sample at `t_s` with `ops` total operations; updates
    /// the rates' reference point.
    pub fn update(&mut self, t_s: f64, ops: u64) -> ProgressLine {
        let probed = self.probe.as_ref().map(|p| p());
        let migrations = probed.as_ref().map(|(m, _)| *m);
        let (ops_rate, mig_rate) = match self.last {
            Some((t0, ops0, mig0)) if t_s > t0 => {
                let dt = t_s - t0;
                let ops_rate = ops.saturating_sub(ops0) as f64 / dt;
                let mig_rate = match (migrations, mig0) {
                    (Some(m), Some(m0)) => Some(m.saturating_sub(m0) as f64 / dt),
                    _ => None,
                };
                (Some(ops_rate), mig_rate)
            }
            _ => (None, None),
        };
        self.last = Some((t_s, ops, migrations));
        ProgressLine {
            elapsed_s: t_s,
            duration_s: self.duration.map(|d| d.as_secs_f64()),
            ops_per_sec: ops_rate,
            migrations_per_sec: mig_rate,
            tiers: probed.map(|(_, p)| p),
            mode: self.mode.as_ref().and_then(|m| {
                m.lock()
                    .ok()
                    .and_then(|g| g.as_ref().map(|m| m.mode.clone()))
            }),
        }
    }

    /// Redraws the line for a sample (what the hook does).
    pub fn draw(&mut self, t_s: f64, ops: u64) {
        if self.out.is_none() {
            return;
        }
        let line = self.update(t_s, ops).render(&self.label);
        if let Some(out) = self.out.as_mut() {
            let _ = write!(out, "\r{line}{CLEAR_TO_EOL}");
            let _ = out.flush();
            self.drawn = true;
        }
    }

    /// Clears the line (call when the run ends; also done on drop).
    pub fn finish(&mut self) {
        if !self.drawn {
            return;
        }
        if let Some(out) = self.out.as_mut() {
            let _ = write!(out, "\r{CLEAR_TO_EOL}");
            let _ = out.flush();
        }
        self.drawn = false;
    }
}

impl RunHooks for Progress {
    fn on_start(&mut self, tiered: Option<&Arc<TieredMemory>>) {
        if let Some(m) = tiered {
            self.set_probe(tiered_probe(m.clone()));
        }
    }

    fn on_policy_mode(&mut self, mode: tiering::engine::ModeSlot) {
        self.mode = Some(mode);
    }

    fn on_sample(&mut self, ctx: &SampleCtx<'_>) {
        self.draw(ctx.t_s, ctx.ops);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn rates_come_from_the_last_interval() {
        let migs = Arc::new(AtomicU64::new(0));
        let m2 = migs.clone();
        let tier = |name: &str, pages, capacity_pages| TierLine {
            name: name.into(),
            pages,
            capacity_pages,
            resident_bytes: Some(pages * 4096),
        };
        let lines = vec![tier("fast", 10, 16), tier("slow", 20, 64)];
        let l2 = lines.clone();
        let probe: TierProbe = Arc::new(move || (m2.load(Ordering::Relaxed), l2.clone()));
        let mut p = Progress::new("tpp 1/2", Some(Duration::from_secs(3)), None).with_probe(probe);
        let first = p.update(0.5, 1000);
        assert_eq!(first.ops_per_sec, None);
        assert_eq!(first.migrations_per_sec, None);
        migs.store(300, Ordering::Relaxed);
        let second = p.update(1.0, 6000);
        assert_eq!(second.ops_per_sec, Some(10_000.0));
        assert_eq!(second.migrations_per_sec, Some(600.0));
        assert_eq!(second.tiers, Some(lines));
        assert_eq!(
            second.render("tpp 1/2"),
            "[tpp 1/2] 1.0 s of 3.0 s (2.0 s left)  10.0k ops/s  600.0 migrations/s  fast 10/16p 41.0kB  slow 20/64p 81.9kB"
        );
    }

    #[test]
    fn without_probe_or_duration_the_line_is_shorter() {
        let mut p = Progress::new("", None, None);
        p.update(1.0, 0);
        let l = p.update(2.0, 2_500_000);
        assert_eq!(l.render(""), "2.0 s  2.50M ops/s");
        let mut p = Progress::new("", Some(Duration::from_secs(1)), None);
        assert_eq!(
            p.update(1.5, 0).render("a"),
            "[a] 1.5 s of 1.0 s (stopping)  - ops/s"
        );
    }

    #[test]
    fn draws_in_place_and_clears_at_the_end() {
        let buf = Buf::default();
        let mut p = Progress::new("x", None, Some(Box::new(buf.clone())));
        assert!(p.is_enabled());
        p.draw(0.0, 0);
        p.draw(1.0, 100);
        p.finish();
        let s = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            s,
            "\r[x] 0.0 s  - ops/s\x1b[K\r[x] 1.0 s  100.0 ops/s\x1b[K\r\x1b[K"
        );
        // Finishing twice writes nothing more.
        p.finish();
        assert_eq!(buf.0.lock().unwrap().len(), s.len());
    }

    #[test]
    fn silent_display_draws_nothing() {
        let mut p = Progress::new("x", None, None);
        assert!(!p.is_enabled());
        p.draw(1.0, 10);
        assert!(!p.drawn);
        assert!(p.last.is_none(), "a silent display does not even sample");
    }

    #[test]
    fn tiered_probe_counts_pages_per_tier() {
        let mut cfg = tiering::mem::MemConfig::new(64 * tiering::mem::PAGE_SIZE, 16);
        cfg.placement = tiering::mem::InitialPlacement::FastFirst;
        if !tiering::host_support::require(&[tiering::host_support::HostFeature::UserfaultfdMove]) {
            return;
        }
        let mem = Arc::new(TieredMemory::new(&cfg).expect("tiered memory"));
        let probe = tiered_probe(mem.clone());
        let pages = |p: (u64, Vec<TierLine>)| p.1.iter().map(|t| t.pages).collect::<Vec<_>>();
        assert_eq!(
            pages(probe()),
            vec![0, 0],
            "nothing touched, nothing placed"
        );
        mem.prefault(0, 64).unwrap();
        let (migrations, tiers) = probe();
        assert_eq!(migrations, 0);
        assert_eq!(
            tiers.iter().map(|t| t.pages).collect::<Vec<_>>(),
            vec![16, 48]
        );
        assert_eq!(
            tiers[0].resident_bytes,
            Some(16 * 4096),
            "measured from the kernel"
        );
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(999.0), "999.0");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(2_345_678.0), "2.35M");
        assert_eq!(si(3e9), "3.00G");
        assert_eq!(si(f64::NAN), "-");
    }
}
