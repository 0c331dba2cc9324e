//! Live tier-latency emulation (`--emulate-latency`, docs/emulation.md).
//!
//! On a host with one NUMA node both tiers are the same DRAM. With
//! emulation on, the guest's runtime charges every workload access that
//! misses its cache model the emulated latency of the page's tier, minus
//! the host DRAM latency it measured at boot. The VMM's part:
//!
//! 1. [`region`]: a guest region above RAM, in its own memory slot, with
//!    the configuration, the tier map and the guest's counters;
//! 2. [`tier_map`]: the memory layer's placement observer, which writes
//!    each page's tier before the guest can see the page there;
//! 3. [`load`]: every 10 ms, each tier's loaded latency from the guest's
//!    access counters through the simulator's queueing model, republished
//!    to the guest and handed to the engine (Colloid);
//! 4. [`EmulationReport`]: what every output says about it.
//!
//! Without the flag none of this exists: no region, no observer, no
//! thread, and placement stays invisible to the guest.

pub mod config;
pub mod load;
pub mod region;
pub mod tier_map;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use tiering::engine::TierLoad;
use tiervm_guest::abi::EMULATION_MAX_TIERS;

pub use config::{EmulationConfig, EmulationConfigError};
use load::{window_bytes, LiveLoads, LoadModel, Totals, WINDOW};
use region::{chase_bytes_for, EmulationRegion, RegionLayout};
use tier_map::TierMap;

/// Latency emulation could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EmulationError {
    /// The region does not fit below the page tables' reach.
    #[error("the latency-emulation region would end at {end:#x}, beyond the 512 GiB the guest page tables map: lower --mem")]
    TooLarge {
        /// Its end.
        end: u64,
    },
    /// Mapping the region failed.
    #[error("mapping the latency-emulation region")]
    Map(#[source] std::io::Error),
    /// The thread could not start.
    #[error("starting the latency-emulation thread")]
    Spawn(#[source] std::io::Error),
}

/// Latency emulation of one VM: the region, the tier map, the loaded
/// latency shared with the engine, and the thread that keeps it current.
pub struct Emulation {
    cfg: EmulationConfig,
    region: Arc<EmulationRegion>,
    tier_map: Arc<TierMap>,
    loads: Arc<LiveLoads>,
    vcpus: usize,
    tiers: usize,
    thread: Option<(Arc<AtomicBool>, JoinHandle<WindowStats>)>,
    stats: Option<WindowStats>,
    thread_failed: bool,
    tsc_khz: u64,
}

impl std::fmt::Debug for Emulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulation")
            .field("cfg", &self.cfg)
            .field("layout", self.region.layout())
            .finish_non_exhaustive()
    }
}

/// The region's layout for `cfg` above `ram_size` bytes of RAM and `vcpus`
/// vCPUs on this host.
pub fn layout_for(cfg: &EmulationConfig, ram_size: u64, vcpus: u32) -> RegionLayout {
    let host = config::host_llc_bytes();
    let host_llc = host.unwrap_or(config::FALLBACK_LLC_BYTES);
    RegionLayout::new(
        ram_size,
        vcpus,
        cfg.llc_bytes,
        chase_bytes_for(host_llc),
        cfg.host_cache_model_bytes(host).unwrap_or(0),
    )
}

impl Emulation {
    /// Maps the region above `ram_size` bytes of RAM for `vcpus` vCPUs and
    /// `tiers` tiers (1 for untiered RAM: every page on the fast tier).
    pub fn new(
        cfg: &EmulationConfig,
        ram_size: u64,
        vcpus: u32,
        tiers: usize,
    ) -> Result<Self, EmulationError> {
        let layout = layout_for(cfg, ram_size, vcpus);
        if layout.end() > crate::guest_abi::MAX_RAM {
            return Err(EmulationError::TooLarge { end: layout.end() });
        }
        let region = Arc::new(EmulationRegion::new(layout, cfg, tiers)?);
        Ok(Self {
            cfg: cfg.clone(),
            tier_map: Arc::new(TierMap::new(region.clone())),
            region,
            loads: Arc::new(LiveLoads::default()),
            vcpus: vcpus as usize,
            tiers: tiers.clamp(1, EMULATION_MAX_TIERS),
            thread: None,
            stats: None,
            thread_failed: false,
            tsc_khz: 0,
        })
    }

    /// The region (shared with the guest RAM that keeps it mapped for KVM).
    pub fn region(&self) -> &Arc<EmulationRegion> {
        &self.region
    }

    /// The placement observer to install in tiered memory.
    pub fn tier_map(&self) -> Arc<TierMap> {
        self.tier_map.clone()
    }

    /// The loaded latency the engine reads (Colloid).
    pub fn loads(&self) -> Arc<LiveLoads> {
        self.loads.clone()
    }

    /// The settings.
    pub fn config(&self) -> &EmulationConfig {
        &self.cfg
    }

    /// Starts the loaded-latency thread (the TSC runs at `tsc_khz`).
    pub fn start(&mut self, tsc_khz: u64) -> Result<(), EmulationError> {
        self.tsc_khz = tsc_khz.max(1);
        let stop = Arc::new(AtomicBool::new(false));
        let w = Window {
            region: self.region.clone(),
            tier_map: self.tier_map.clone(),
            loads: self.loads.clone(),
            model: LoadModel::new(&self.cfg),
            vcpus: self.vcpus,
            tiers: self.tiers,
            stop: stop.clone(),
        };
        let join = std::thread::Builder::new()
            .name("latency-emulation".into())
            .spawn(move || {
                tiering::threads::started(tiering::threads::ThreadRole::LatencyEmulation);
                w.run()
            })
            .map_err(EmulationError::Spawn)?;
        self.thread = Some((stop, join));
        Ok(())
    }

    /// Stops the thread; call once the vCPUs stopped.
    pub fn stop(&mut self) {
        if let Some((stop, join)) = self.thread.take() {
            stop.store(true, Ordering::Release);
            match join.join() {
                Ok(st) => self.stats = Some(st),
                Err(_) => {
                    tracing::error!("the latency-emulation thread panicked; its loaded-latency statistics are lost");
                    self.thread_failed = true;
                }
            }
        }
    }

    /// Stops the thread and reports (the guest's final counters, and the
    /// `ab=on` halves among its result metrics).
    pub fn finish(
        mut self,
        guest_metrics: &std::collections::BTreeMap<String, f64>,
    ) -> EmulationReport {
        self.stop();
        let totals = Totals::sum((0..self.vcpus).map(|i| self.region.vcpu_counters(i)));
        let mut report = EmulationReport::new(
            &self.cfg,
            &self.region,
            &self.tier_map,
            totals,
            self.stats.take().unwrap_or_default(),
            self.tiers,
            self.tsc_khz,
        );
        report.thread_failed = self.thread_failed;
        if self.cfg.ab {
            report.ab = ChargingAbReport::from_metrics(guest_metrics, self.tsc_khz);
        }
        report
    }
}

impl Drop for Emulation {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the thread saw over the run (time-weighted).
#[derive(Clone, Debug, Default)]
struct WindowStats {
    windows: u64,
    seconds: f64,
    latency_ns_sum: Vec<f64>,
    latency_ns_max: Vec<f64>,
    utilization_max: Vec<f64>,
    /// Sum over windows of (latency in force during the window x the
    /// window's charged accesses), per tier, and those accesses.
    charged_latency_sum: Vec<f64>,
    charged_accesses: Vec<u64>,
    chase_released: bool,
}

impl WindowStats {
    /// Per tier: the time-weighted mean loaded latency, and the mean
    /// latency the charged accesses saw (ns; 0 without time or accesses).
    fn loaded_latency_means(&self) -> (Vec<f64>, Vec<f64>) {
        let mean = self
            .latency_ns_sum
            .iter()
            .map(|s| {
                if self.seconds > 0.0 {
                    s / self.seconds
                } else {
                    0.0
                }
            })
            .collect();
        let charged = self
            .charged_latency_sum
            .iter()
            .zip(&self.charged_accesses)
            .zip(&self.latency_ns_sum)
            .map(|((s, &a), _)| if a > 0 { s / a as f64 } else { 0.0 })
            .collect();
        (mean, charged)
    }
}

/// The loaded-latency thread's state.
struct Window {
    region: Arc<EmulationRegion>,
    tier_map: Arc<TierMap>,
    loads: Arc<LiveLoads>,
    model: LoadModel,
    vcpus: usize,
    tiers: usize,
    stop: Arc<AtomicBool>,
}

impl Window {
    fn totals(&self) -> Totals {
        Totals::sum((0..self.vcpus).map(|i| self.region.vcpu_counters(i)))
    }

    fn moved(&self) -> Vec<u64> {
        (0..self.tiers)
            .map(|t| self.tier_map.moved_bytes(t))
            .collect()
    }

    /// Every [`WINDOW`]: read the counters, step the model, republish.
    fn run(mut self) -> WindowStats {
        let n = self.model.latency_ns().len();
        let mut st = WindowStats {
            latency_ns_sum: vec![0.0; n],
            latency_ns_max: vec![0.0; n],
            utilization_max: vec![0.0; n],
            charged_latency_sum: vec![0.0; n],
            charged_accesses: vec![0; n],
            ..WindowStats::default()
        };
        let (mut prev, mut prev_moved, mut prev_t) = (self.totals(), self.moved(), Instant::now());
        self.publish(&[0.0; EMULATION_MAX_TIERS][..n]);
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(WINDOW);
            let now = Instant::now();
            let dt = now.duration_since(prev_t).as_secs_f64().max(1e-6);
            let (cur, moved) = (self.totals(), self.moved());
            let d = |a: &[u64], b: &[u64]| -> Vec<u64> {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| x.saturating_sub(*y))
                    .take(n)
                    .collect()
            };
            let d_acc = d(&cur.accesses, &prev.accesses);
            // The guest charged this window's accesses at the latency
            // published before it (it refreshes every few hundred ops).
            for (t, &a) in d_acc.iter().enumerate().take(n) {
                st.charged_latency_sum[t] += self.model.latency_ns()[t] * a as f64;
                st.charged_accesses[t] = st.charged_accesses[t].saturating_add(a);
            }
            let bytes: Vec<f64> = window_bytes(
                &d_acc,
                &d(&cur.writes, &prev.writes),
                &d(&moved, &prev_moved),
            )
            .into_iter()
            .map(|b| b / dt)
            .collect();
            self.model.step(&bytes);
            let rates: Vec<f64> = d_acc.iter().map(|&a| a as f64 / dt).collect();
            self.publish(&rates);
            for t in 0..n {
                let l = self.model.latency_ns()[t];
                st.latency_ns_sum[t] += l * dt;
                st.latency_ns_max[t] = st.latency_ns_max[t].max(l);
                st.utilization_max[t] = st.utilization_max[t].max(self.model.utilization()[t]);
            }
            st.windows += 1;
            st.seconds += dt;
            if !st.chase_released && self.region.guest_charging() {
                if let Err(e) = self.region.release_chase() {
                    tracing::warn!("releasing the emulation's chase buffer: {e}");
                }
                st.chase_released = true;
            }
            (prev, prev_moved, prev_t) = (cur, moved, now);
        }
        st
    }

    /// Republishes the model's latencies to the guest and the engine.
    fn publish(&self, rates: &[f64]) {
        let lat = self.model.latency_ns();
        let ps: Vec<u64> = lat.iter().map(|l| (l * 1e3).round() as u64).collect();
        self.region.publish_loaded(&ps);
        self.loads.set(
            lat.iter()
                .zip(rates.iter().chain(std::iter::repeat(&0.0)))
                .zip(self.model.unloaded_ns())
                .map(|((&l, &r), u)| TierLoad {
                    loaded_latency_ns: l,
                    requests_per_sec: r,
                    unloaded_latency_ns: u,
                })
                .collect(),
        );
    }
}

/// The report's `emulation` object: what was emulated and what it cost.
#[derive(Clone, Debug, Serialize)]
pub struct EmulationReport {
    /// `emulated latency: fast 150 ns, slow 407 ns` (every output carries it).
    pub label: String,
    /// The settings (tiers, bandwidths, antagonist, cache model, threshold).
    pub config: EmulationConfig,
    /// Host DRAM latency the guest measured at boot (pointer chase), ns;
    /// `null` when the guest did not (an image that ignores emulation, or
    /// `host-dram=` gave it).
    pub host_dram_ns: Option<f64>,
    /// Dependent loads that measurement timed.
    pub host_dram_hops: u64,
    /// The host DRAM latency the run used, ns: the measurement, or
    /// `host-dram=` (a comparison's first measurement).
    pub host_dram_used_ns: Option<f64>,
    /// What charges subtract, ns: `min(host DRAM, fastest tier's latency)`
    /// (`tiervm_guest::emulation::charge_base_ps`).
    pub charge_base_ns: Option<f64>,
    /// Per tier, what a cache-missing access was charged unloaded:
    /// `max(0, latency - charge base)`, ns.
    pub charge_ns: Vec<f64>,
    /// Per tier, what a cache-missing access costs on this host unloaded:
    /// host DRAM + charge, ns.
    pub effective_latency_ns: Vec<f64>,
    /// The host's DRAM is slower than the fastest tier: the fastest tier
    /// costs the host's DRAM latency and the tiers' differences, not their
    /// absolute latencies, are emulated.
    pub differences_kept: bool,
    /// Charged accesses per tier (cache-model misses).
    pub accesses: Vec<u64>,
    /// Of which writes.
    pub writes: Vec<u64>,
    /// Accesses the cache model hit (not charged).
    pub cache_hits: u64,
    /// Cache-model hits among all reported accesses, percent.
    pub cache_hit_pct: f64,
    /// Emulated latency charged, vCPU milliseconds.
    pub charged_ms: f64,
    /// Time spent paying it (spinning on the TSC while the vCPU ran), vCPU
    /// milliseconds.
    pub paid_ms: f64,
    /// Time the host took the vCPU away in the middle of payments (not
    /// counted as paid: host noise), milliseconds.
    pub preempted_ms: f64,
    /// Payments.
    pub payments: u64,
    /// Time-weighted mean loaded latency per tier over the run, ns (modeled).
    pub loaded_latency_ns_mean: Vec<f64>,
    /// Highest loaded latency per tier, ns (modeled).
    pub loaded_latency_ns_max: Vec<f64>,
    /// Mean loaded latency per tier weighted by the charged accesses: the
    /// latency the charges were computed from, ns (modeled).
    pub loaded_latency_ns_charged: Vec<f64>,
    /// Highest utilization per tier (guest traffic + antagonist + migrations).
    pub utilization_max: Vec<f64>,
    /// Loaded-latency windows computed.
    pub windows: u64,
    /// Page placements written into the tier map.
    pub tier_map_updates: u64,
    /// Whether the loaded-latency thread ended by panicking (a bug: its
    /// statistics are lost; charges kept the last published latencies).
    pub thread_failed: bool,
    /// Migration traffic each tier served, bytes (loaded-latency input).
    pub migration_bytes: Vec<u64>,
    /// A cache model smaller than this host's LLC without the host LLC
    /// model, and what that does ([`EmulationConfig::cache_model_caveat`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
    /// The model of the host's own LLC the guest kept besides a smaller
    /// cache model (`host-cache=`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_cache: Option<HostCacheReport>,
    /// `ab=on`: op time with and without charging, in alternating phases
    /// of one run (measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ab: Option<ChargingAbReport>,
}

/// What `ab=on` measured: the run's completed phases with charging and
/// without, summed over vCPUs (docs/emulation.md, "Overhead").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChargingAbReport {
    /// Operations in the phases that charged.
    pub on_ops: u64,
    /// Operations in the phases that did not.
    pub off_ops: u64,
    /// vCPU time per operation charging, ns (measured).
    pub on_ns_per_op: f64,
    /// vCPU time per operation not charging, ns (measured).
    pub off_ns_per_op: f64,
    /// `on_ns_per_op / off_ns_per_op` over the whole run.
    pub ratio: f64,
    /// Pairs of adjacent phases (charging, then not) the run completed.
    pub pairs: u64,
    /// The median over those pairs of their time-per-operation ratio
    /// (within 0.25%): what charging costs (1.0 = nothing), unmoved by
    /// bursts of host noise that slow a few phases (`null`: no pair).
    pub pair_median_ratio: Option<f64>,
    /// The median pair landed in the first or last bin (ratios below 0.5025
    /// or from 1.4975 on are binned there): the true median is that far or
    /// beyond, not the value given.
    pub pair_median_at_bin_edge: bool,
}

impl ChargingAbReport {
    /// The halves the guest posted as result metrics (`emu_ab_*`), with
    /// the TSC at `tsc_khz`; `None` without both halves.
    pub fn from_metrics(m: &std::collections::BTreeMap<String, f64>, tsc_khz: u64) -> Option<Self> {
        let get = |k: &str| m.get(k).copied().filter(|v| v.is_finite() && *v > 0.0);
        let (on_ops, on_c) = (get("emu_ab_on_ops")?, get("emu_ab_on_cycles")?);
        let (off_ops, off_c) = (get("emu_ab_off_ops")?, get("emu_ab_off_cycles")?);
        let ns = |cycles: f64, ops: f64| cycles / (tsc_khz.max(1) as f64 / 1e6) / ops;
        let (on, off) = (ns(on_c, on_ops), ns(off_c, off_ops));
        let pairs = get("emu_ab_pairs").unwrap_or(0.0) as u64;
        let median = get("emu_ab_pair_median").filter(|_| pairs > 0);
        use tiervm_guest::emulation::{ab_bin_ratio as edge, AB_BINS, AB_BIN_WIDTH};
        let at_edge = median.is_some_and(|m| {
            (m - edge(0)).abs() < AB_BIN_WIDTH / 4.0
                || (m - edge(AB_BINS - 1)).abs() < AB_BIN_WIDTH / 4.0
        });
        Some(Self {
            on_ops: on_ops as u64,
            off_ops: off_ops as u64,
            on_ns_per_op: on,
            off_ns_per_op: off,
            ratio: on / off,
            pairs,
            pair_median_ratio: median,
            pair_median_at_bin_edge: at_edge,
        })
    }

    /// One line for the summaries.
    pub fn human(&self) -> String {
        format!(
            "ab=on: {:.1} ns/op charging vs {:.1} ns/op not (x{:.3}; median of {} adjacent phase pairs x{}), in alternating phases of one run ({} + {} ops, measured)",
            self.on_ns_per_op,
            self.off_ns_per_op,
            self.ratio,
            self.pairs,
            match (self.pair_median_ratio, self.pair_median_at_bin_edge) {
                (None, _) => "-".into(),
                (Some(m), true) if m > 1.0 => "1.50 or more".into(),
                (Some(_), true) => "0.50 or less".into(),
                (Some(m), false) => format!("{m:.3}"),
            },
            self.on_ops,
            self.off_ops
        )
    }
}

impl HostCacheReport {
    /// The host LLC model's part of the report, if `region` has one: `used`
    /// is the host DRAM latency charged against, `hits` the charged
    /// accesses that hit the host's cache of `charged`.
    fn new(region: &EmulationRegion, used: Option<f64>, hits: u64, charged: u64) -> Option<Self> {
        (region.layout().host_cache_bytes != 0).then(|| {
            let llc_ps = region.llc_hit_ps();
            let llc_hit_ns = tiervm_guest::emulation::LLC_HIT_PS_RANGE
                .contains(&llc_ps)
                .then_some(llc_ps as f64 / 1e3);
            Self {
                bytes: region.layout().host_cache_bytes,
                llc_hit_ns,
                llc_hit_measured: llc_ps != 0,
                applied: matches!((llc_hit_ns, used), (Some(l), Some(d)) if l < d),
                host_cache_hits: hits,
                // An estimate from sampled sets: it can pass 100 by a few
                // percent on patterns that favour the sampled lines.
                host_cache_hit_pct: if charged == 0 {
                    0.0
                } else {
                    (100.0 * hits as f64 / charged as f64).min(100.0)
                },
            }
        })
    }

    /// One line for the summaries.
    pub fn human(&self) -> String {
        let size = crate::units::format_size(self.bytes);
        match (self.applied, self.llc_hit_ns) {
            (true, Some(l)) => format!(
                "host LLC model {size} (LLC hit {l:.0} ns measured): {:.1}% of the charged accesses hit the host's cache and were charged the host's DRAM minus LLC hit latency on top",
                self.host_cache_hit_pct
            ),
            (_, Some(l)) => format!(
                "host LLC model {size} not used: the LLC hit latency measured ({l:.0} ns) is not below the host DRAM latency charged against"
            ),
            (_, None) if self.llc_hit_measured => format!("host LLC model {size} not used: the LLC hit latency measured at boot was implausible (outside 1-200 ns; a loaded host)"),
            (_, None) => format!("host LLC model {size} not used: the LLC hit latency was not measured"),
        }
    }
}

/// What the host LLC model did (a cache model smaller than the host's LLC:
/// docs/emulation.md, "Scaled cache models").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostCacheReport {
    /// The modeled host LLC, bytes.
    pub bytes: u64,
    /// The host's LLC hit latency the guest measured at boot, ns (`null`:
    /// not measured, or implausible, so the model was not used).
    pub llc_hit_ns: Option<f64>,
    /// The guest ran the boot measurement (its result may still have been
    /// implausible: `llc_hit_ns` null).
    pub llc_hit_measured: bool,
    /// Whether the guest used the model: the LLC hit latency was measured
    /// and is below the host DRAM latency charged against (else an LLC hit
    /// saves nothing to charge back).
    pub applied: bool,
    /// Charged accesses the model says the host's cache served: each was
    /// charged the host's DRAM minus LLC hit latency on top (estimated from
    /// sampled sets).
    pub host_cache_hits: u64,
    /// Of the charged accesses, percent.
    pub host_cache_hit_pct: f64,
}

impl EmulationReport {
    fn new(
        cfg: &EmulationConfig,
        region: &EmulationRegion,
        tier_map: &TierMap,
        t: Totals,
        st: WindowStats,
        tiers: usize,
        tsc_khz: u64,
    ) -> Self {
        // Guest-written: only a plausible latency (10 ns to 10 us) counts.
        let dram_ps = region.dram_ps();
        let host_dram_ns = (10_000..=10_000_000)
            .contains(&dram_ps)
            .then_some(dram_ps as f64 / 1e3);
        let used = cfg.host_dram_ns.or(host_dram_ns);
        let fastest = cfg.tiers.first().map_or(0.0, |t| t.latency_ns);
        let base = used.map(|d| d.min(fastest));
        let n = cfg.tiers.len().min(tiers.max(1));
        let charge_ns: Vec<f64> = cfg
            .tiers
            .iter()
            .map(|x| (x.latency_ns - base.unwrap_or(0.0)).max(0.0))
            .collect();
        let effective_latency_ns = charge_ns.iter().map(|c| used.unwrap_or(0.0) + c).collect();
        let ms = |cycles: u64| cycles as f64 / tsc_khz.max(1) as f64;
        let charged: u64 = t.accesses.iter().fold(0u64, |a, b| a.saturating_add(*b));
        let all = charged.saturating_add(t.cache_hits);
        let host_cache = HostCacheReport::new(region, used, t.host_cache_hits, charged);
        let (loaded_latency_ns_mean, loaded_latency_ns_charged) = st.loaded_latency_means();
        Self {
            label: cfg.label(),
            caveat: cfg.cache_model_caveat(config::host_llc_bytes()),
            host_cache,
            ab: None,
            config: cfg.clone(),
            host_dram_ns,
            host_dram_hops: region.chase_hops(),
            host_dram_used_ns: used,
            charge_base_ns: base,
            charge_ns,
            effective_latency_ns,
            differences_kept: used.is_some_and(|d| d > fastest),
            accesses: t.accesses[..n].to_vec(),
            writes: t.writes[..n].to_vec(),
            cache_hits: t.cache_hits,
            cache_hit_pct: if all == 0 {
                0.0
            } else {
                100.0 * t.cache_hits as f64 / all as f64
            },
            charged_ms: ms(t.charged_cycles),
            paid_ms: ms(t.paid_cycles),
            preempted_ms: ms(t.preempted_cycles),
            payments: t.payments,
            loaded_latency_ns_mean,
            loaded_latency_ns_max: st.latency_ns_max.clone(),
            loaded_latency_ns_charged,
            utilization_max: st.utilization_max,
            windows: st.windows,
            tier_map_updates: tier_map.updates(),
            thread_failed: false,
            migration_bytes: (0..n).map(|i| tier_map.moved_bytes(i)).collect(),
        }
    }

    /// The summary line of `tiervm run`.
    pub fn human(&self) -> String {
        let dram = match (self.host_dram_ns, self.config.host_dram_ns) {
            (_, Some(f)) => format!("host DRAM {f:.0} ns (given)"),
            (Some(d), None) => format!("host DRAM {d:.0} ns measured in the guest"),
            (None, None) => "host DRAM not measured: the image does not charge".to_string(),
        };
        let costs: Vec<String> = self
            .config
            .tiers
            .iter()
            .zip(self.effective_latency_ns.iter().zip(&self.charge_ns))
            .map(|(t, (e, c))| format!("{} {e:.0} ns (+{c:.0})", t.name))
            .collect();
        let kept = if self.differences_kept {
            ", above the fast tier's: the tiers' differences are kept"
        } else {
            ""
        };
        let mut s = format!(
            "{} ({dram}{kept}; a cache-missing access costs {})\n",
            self.label,
            costs.join(", ")
        );
        if let Some(c) = &self.caveat {
            s.push_str(&format!("             CAVEAT: {c}\n"));
        }
        if let Some(h) = &self.host_cache {
            s.push_str(&format!("             {}\n", h.human()));
        }
        if let Some(a) = &self.ab {
            s.push_str(&format!("             {}\n", a.human()));
        }
        let acc: Vec<String> = self
            .config
            .tiers
            .iter()
            .zip(&self.accesses)
            .map(|(t, a)| format!("{} {}", t.name, crate::units::group(*a)))
            .collect();
        s.push_str(&format!(
            "             charged accesses {}; cache-model hits {:.1}%; charged {:.1} ms, paid {:.1} ms of vCPU time ({:.1} ms preempted during payments)",
            acc.join(", "),
            self.cache_hit_pct,
            self.charged_ms,
            self.paid_ms,
            self.preempted_ms
        ));
        let loaded: Vec<String> = self
            .config
            .tiers
            .iter()
            .zip(&self.loaded_latency_ns_mean)
            .map(|(t, l)| format!("{} {l:.0} ns", t.name))
            .collect();
        s.push_str(&format!(
            "; loaded latency (modeled) mean {}",
            loaded.join(", ")
        ));
        s
    }
}

/// The label of an optional emulation, for outputs that may have none.
pub fn label_of(cfg: Option<&EmulationConfig>) -> Option<String> {
    cfg.map(EmulationConfig::label)
}
