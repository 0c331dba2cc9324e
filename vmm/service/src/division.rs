//! Dividing a host's fast tier among VMs (pure: the service feeds it what
//! the workers measured and applies the plan).
//!
//! Every VM has a guaranteed `min` (admission control keeps the mins
//! within the pool), a `max` it never exceeds (cgroup v2's `memory.min` /
//! `memory.max`, per tier), and a `weight`. The spare capacity goes where
//! it buys the most: each VM's worker estimates from its access profile
//! what share of its accesses the next quantum of fast capacity would
//! capture (grow curve) and the last quantum would lose (shrink curve)
//! (`tiering::engine::profile`); the value of a quantum is
//! `weight x rate x share`, where `rate` is, by default
//! ([`Valuation::HostAccesses`]), the VM's sampled access rate as the host
//! measures it (`tiering::engine::profile::access_rate`): weighted
//! accesses per second served fast instead of slow. A guest cannot raise
//! it without touching its memory; the operations per second a guest
//! reports about itself are only read with [`Valuation::GuestOps`].
//!
//! One round ([`plan`]):
//! 1. Mandatory moves (not subject to hysteresis or the budget): VMs above
//!    `max` shrink to it; VMs below `min` grow to it, from free capacity
//!    first, then from the spare of others, cheapest loss first; if the
//!    targets exceed the pool (it shrank), spare is taken back the same way.
//! 2. Free capacity (pool minus what VMs hold: the larger of their target
//!    and their actual use, so a shrink that has not converged yet is still
//!    counted) goes, a quantum at a time, to the VM whose next quantum is
//!    worth most, while it is worth more than nothing.
//! 3. Exchanges: the quantum worth most to some VM is taken from the VM
//!    that loses least (on a tie, the one with most unused capacity), only
//!    when it is worth `1 + hysteresis` times the loss, at least
//!    `min_share` of the receiver's weighted throughput, and when the
//!    difference is significant: above `significance` standard errors of
//!    the two estimates (the profile's sampling noise and the rate's;
//!    two VMs whose gains are within noise of each other do not trade
//!    quanta back and forth); a quantum the donor loses nothing by (nothing
//!    sampled in it, or capacity it holds and does not use: the loss is
//!    scaled by the share of the quantum the donor fills, and nothing when
//!    it fills at most an eighth) needs no test.
//! 4. Steps 2 and 3 move at most `budget_bytes` per round (an exchange
//!    counts twice: a demotion and a promotion). A VM resized within
//!    `dwell_s` is moved again only the same way (a VM that just grew may
//!    grow on, one that just shrank may give more); it is moved back the
//!    other way only after `reverse_dwell_s`, except capacity it holds and
//!    does not use, which may go back after `dwell_s` (no target reverses
//!    within its dwell). A receiver gets capacity only while it holds at
//!    most `fill_ahead` quanta more than it uses: capacity goes at the
//!    rate a VM fills it, not ahead of it.
//! 5. Free capacity nobody values (no samples yet, idle VMs) is split by
//!    weight among VMs below their max, so the pool is used (not while the
//!    VM that values it most is still filling what it got: it waits for it).

/// One VM as the division sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Share {
    /// Guaranteed fast bytes.
    pub min: u64,
    /// Most fast bytes.
    pub max: u64,
    /// Relative weight (> 0).
    pub weight: f64,
    /// The fast capacity the service asked for last.
    pub target: u64,
    /// Fast bytes in use now (converging towards a lower target).
    pub used: u64,
    /// What a VM's accesses are worth per second ([`Valuation`]: its
    /// sampled accesses per second as the host measures them, or the
    /// operations per second its guest reports).
    pub rate: f64,
    /// Standard error of `rate`.
    pub rate_se: f64,
    /// Share of accesses the k-th extra quantum would capture.
    pub grow: Vec<f64>,
    /// Share of accesses the k-th quantum given up would lose.
    pub shrink: Vec<f64>,
    /// Standard error of each `grow` step.
    pub grow_se: Vec<f64>,
    /// Standard error of each `shrink` step.
    pub shrink_se: Vec<f64>,
    /// Whether the curves carry information (enough samples).
    pub informed: bool,
    /// Seconds since the VM's target last changed (`None`: never).
    pub since_resize_s: Option<f64>,
    /// Whether that change was a grow (`Some(true)`) or a shrink.
    pub last_grew: Option<bool>,
}

/// What the division values a VM's fast capacity by: `weight x rate x
/// share`, with `rate` one of these.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Valuation {
    /// The VM's sampled access rate as the host measures it (the sum over
    /// guest pages of the weight of each page's latest hint fault in a
    /// sampler window): a guest can only raise it by touching its memory.
    #[default]
    HostAccesses,
    /// The operations per second the guest reports on its status page
    /// (smoothed): the guest's own word, for operators who trust their
    /// guests (one that inflates its counter draws spare capacity).
    GuestOps,
}

impl Valuation {
    /// Every valuation.
    pub const ALL: [Self; 2] = [Self::HostAccesses, Self::GuestOps];

    /// The name in the config file and the API.
    pub fn name(self) -> &'static str {
        match self {
            Self::HostAccesses => "host-accesses",
            Self::GuestOps => "guest-ops",
        }
    }

    /// The valuation called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// Settings of the division.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// Bytes per step (a multiple of 4 KiB).
    pub quantum: u64,
    /// An exchange must gain this much more than it loses (0.2 = 20%).
    pub hysteresis: f64,
    /// An exchange or grant must be worth at least this share of the
    /// receiver's weighted throughput.
    pub min_share: f64,
    /// Most bytes moved per round by optional moves.
    pub budget_bytes: u64,
    /// A VM resized less than this long ago is not moved by optional moves.
    pub dwell_s: f64,
    /// A VM is not moved back the other way (grown after a shrink, shrunk
    /// after a grow) by optional moves for this long: no flapping.
    pub reverse_dwell_s: f64,
    /// An exchange's gain minus its loss must exceed this many standard
    /// errors of the difference (2: about 98% one-sided confidence).
    pub significance: f64,
    /// What a quantum's share of accesses is multiplied by (the service
    /// fills [`Share::rate`] with it).
    pub value: Valuation,
    /// A receiver gets optional capacity only while its target is less
    /// than its use plus this many quanta (it fills what it gets first).
    pub fill_ahead: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            quantum: 64 << 20,
            hysteresis: 0.2,
            min_share: 0.002,
            budget_bytes: 512 << 20,
            dwell_s: 10.0,
            reverse_dwell_s: 30.0,
            significance: 2.0,
            value: Valuation::HostAccesses,
            fill_ahead: 2,
        }
    }
}

/// What one round decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// New target per VM (same order as the input).
    pub targets: Vec<u64>,
    /// Bytes moved by mandatory moves.
    pub mandatory_bytes: u64,
    /// Bytes moved by optional moves (grants, exchanges).
    pub optional_bytes: u64,
    /// Estimated weighted accesses per second gained by the optional moves.
    pub gain: f64,
}

/// Marginal values of a VM's quanta around its current target.
struct Curve<'a> {
    s: &'a Share,
    scale: f64,
    /// Standard error of `scale`.
    scale_se: f64,
    q: u64,
}

impl Curve<'_> {
    /// Value of the quantum from `at` to `at + q`, and its standard error.
    fn up_se(&self, at: u64) -> (f64, f64) {
        if !self.s.informed {
            return (0.0, 0.0);
        }
        let pick = |v: &[f64], k: usize, repeat_last: bool| -> f64 {
            let last = if repeat_last {
                v.last().copied().unwrap_or(0.0)
            } else {
                0.0
            };
            v.get(k).copied().unwrap_or(last)
        };
        let (v, se) = if at >= self.s.target {
            let k = ((at - self.s.target) / self.q) as usize;
            (
                pick(&self.s.grow, k, false),
                pick(&self.s.grow_se, k, false),
            )
        } else {
            // Taking back a quantum given up: what losing it would cost,
            // times the share of it the VM fills (a shrink into capacity it
            // holds and does not use demotes nothing); nothing when it
            // fills at most FREE_ENOUGH of it.
            let k = (((self.s.target - at) / self.q) as usize).saturating_sub(1);
            let filled = self.filled(at + self.q);
            let filled = if filled <= FREE_ENOUGH { 0.0 } else { filled };
            (
                pick(&self.s.shrink, k, true) * filled,
                pick(&self.s.shrink_se, k, true) * filled,
            )
        };
        // The product of two estimates (share x rate), taken as
        // independent (conservative: the share's noise is part of the
        // rate's).
        let value_se = (v * self.scale_se).hypot(se * self.scale);
        (v * self.scale, value_se)
    }

    /// Value of the quantum from `at` to `at + q`.
    fn up(&self, at: u64) -> f64 {
        self.up_se(at).0
    }

    /// Loss of the quantum from `at - q` to `at`.
    fn down(&self, at: u64) -> f64 {
        self.down_se(at).0
    }

    /// Loss of the quantum from `at - q` to `at`, and its standard error
    /// (scaled by the share of it the VM fills: [`Curve::up_se`]).
    fn down_se(&self, at: u64) -> (f64, f64) {
        self.up_se(at.saturating_sub(self.q))
    }

    /// The share of the quantum from `at - q` to `at` the VM fills
    /// (capacity granted this round, above its target, counts as filled:
    /// it was granted to be used).
    fn filled(&self, at: u64) -> f64 {
        let from = at.saturating_sub(self.q);
        let used = self.s.used.saturating_add(at.saturating_sub(self.s.target));
        used.clamp(from, at).saturating_sub(from) as f64 / self.q.max(1) as f64
    }

    /// Capacity the VM holds but does not use.
    fn unused(&self, at: u64) -> u64 {
        at.saturating_sub(self.s.used)
    }
}

/// A quantum the VM fills at most this share of counts as capacity it does
/// not use: giving it up loses nothing (an eighth: the last pages a guest
/// touched on the way, not a working set).
const FREE_ENOUGH: f64 = 0.125;

/// One round of the division of a pool of `pool` bytes (see the module docs).
pub fn plan(pool: u64, shares: &[Share], p: &Params) -> Plan {
    let q = p.quantum.max(tiering::vocab::PAGE_SIZE as u64);
    let curves: Vec<Curve<'_>> = shares
        .iter()
        .map(|s| Curve {
            s,
            scale: s.weight.max(0.0) * s.rate.max(0.0),
            scale_se: s.weight.max(0.0) * s.rate_se.max(0.0),
            q,
        })
        .collect();
    let mut r = Round {
        pool,
        shares,
        curves,
        q,
        p,
        t: shares.iter().map(|s| s.target).collect(),
        out: Plan::default(),
    };
    // 1. Mandatory: max, then the pool, then min.
    r.fit_max_and_pool();
    r.raise_to_min();
    // 2-4. Optional moves within the budget.
    let waiting = r.optional_moves();
    // 5. Unvalued free capacity, split by weight.
    if !waiting {
        let held = |t: &[u64]| held(shares, t);
        spread_free(pool, shares, &mut r.t, q, &held);
    }
    r.out.targets = r.t;
    r.out
}

/// What VMs hold: their target, or more while a shrink converges.
fn held(shares: &[Share], t: &[u64]) -> u64 {
    t.iter().zip(shares).map(|(ti, s)| (*ti).max(s.used)).sum()
}

/// One round of [`plan`] under way: the targets `t` so far and the plan.
struct Round<'a> {
    pool: u64,
    shares: &'a [Share],
    curves: Vec<Curve<'a>>,
    q: u64,
    p: &'a Params,
    t: Vec<u64>,
    out: Plan,
}

impl Round<'_> {
    /// Mandatory: no target above its max, then none over the pool.
    fn fit_max_and_pool(&mut self) {
        let (shares, t, out) = (self.shares, &mut self.t, &mut self.out);
        for (ti, s) in t.iter_mut().zip(shares) {
            if *ti > s.max {
                out.mandatory_bytes += *ti - s.max;
                *ti = s.max;
            }
        }
        while t.iter().sum::<u64>() > self.pool {
            let over = t.iter().sum::<u64>() - self.pool;
            let Some(i) = cheapest_shrink(&self.curves, t, None, false, self.p) else {
                break;
            };
            let step = (t[i] - shares[i].min).min(self.q).min(over);
            t[i] -= step;
            out.mandatory_bytes += step;
        }
    }

    /// Mandatory: every VM up to its min, from free capacity, then from the
    /// spare of others.
    fn raise_to_min(&mut self) {
        let (pool, shares, q, p) = (self.pool, self.shares, self.q, self.p);
        let (t, out) = (&mut self.t, &mut self.out);
        // Capacity that frees up as shrinks converge, promised to VMs below min.
        let mut promised = 0u64;
        for i in 0..shares.len() {
            if t[i] >= shares[i].min {
                continue;
            }
            // Free capacity first.
            let free = pool.saturating_sub(held(shares, t));
            let step = (shares[i].min - t[i]).min(free);
            t[i] += step;
            out.mandatory_bytes += step;
            // Then the spare of others (their capacity drops at once; the
            // grant follows in a later round, as their shrinks free it).
            let free_after = pool
                .saturating_sub(t.iter().sum::<u64>())
                .saturating_sub(promised);
            let short = shares[i].min - t[i];
            promised += short.min(free_after);
            let mut need = short.saturating_sub(free_after);
            while need > 0 {
                let Some(j) = cheapest_shrink(&self.curves, t, Some(i), false, p) else {
                    break;
                };
                let step = (t[j] - shares[j].min).min(q).min(need);
                t[j] -= step;
                out.mandatory_bytes += step;
                promised += step;
                need -= step;
            }
        }
    }

    /// Optional moves within the budget: grants of free capacity, then
    /// exchanges. True when the VM that values capacity most has not filled
    /// what it holds: the capacity waits for it (not handed to a lesser VM,
    /// nor spread).
    fn optional_moves(&mut self) -> bool {
        let (pool, shares, q, p) = (self.pool, self.shares, self.q, self.p);
        let (curves, t, out) = (&self.curves, &mut self.t, &mut self.out);
        let mut budget = p.budget_bytes;
        loop {
            let free = pool.saturating_sub(held(shares, t));
            let Some((g, value)) = best_grow(curves, t, p) else {
                return false;
            };
            let floor = p.min_share * curves[g].scale;
            if value <= 0.0 || value < floor {
                return false;
            }
            if t[g]
                >= shares[g]
                    .used
                    .saturating_add(p.fill_ahead.saturating_mul(q))
            {
                return true;
            }
            if free >= q {
                if budget < q {
                    return false;
                }
                t[g] += q;
                budget -= q;
                out.optional_bytes += q;
                out.gain += value;
                continue;
            }
            // 3. An exchange.
            let Some(s) = cheapest_shrink(curves, t, Some(g), true, p) else {
                return false;
            };
            let (loss, loss_se) = curves[s].down_se(t[s]);
            let value_se = curves[g].up_se(t[g]).1;
            // A donor whose quantum nothing was sampled in loses nothing for
            // sure: there is no noise to beat (however uncertain the gain, it
            // is not negative), only the floor above.
            let noise = if loss == 0.0 && loss_se == 0.0 {
                0.0
            } else {
                p.significance * value_se.hypot(loss_se)
            };
            if value <= (1.0 + p.hysteresis) * loss || value - loss <= noise || budget < 2 * q {
                return false;
            }
            t[s] -= q;
            t[g] += q;
            budget -= 2 * q;
            out.optional_bytes += 2 * q;
            out.gain += value - loss;
        }
    }
}

/// The VM (other than `except`) whose quantum at its target is worth least,
/// among those above their min; `optional` also skips VMs within their dwell.
fn cheapest_shrink(
    curves: &[Curve<'_>],
    t: &[u64],
    except: Option<usize>,
    optional: bool,
    p: &Params,
) -> Option<usize> {
    (0..curves.len())
        .filter(|&j| Some(j) != except && t[j] > curves[j].s.min)
        .filter(|&j| {
            !optional || may_move(curves[j].s, false, curves[j].filled(t[j]) <= FREE_ENOUGH, p)
        })
        .filter(|&j| !optional || t[j] - curves[j].s.min >= curves[j].q)
        .min_by(|&a, &b| {
            curves[a]
                .down(t[a])
                .total_cmp(&curves[b].down(t[b]))
                .then(curves[b].unused(t[b]).cmp(&curves[a].unused(t[a])))
                .then(b.cmp(&a))
        })
}

/// The VM below its max whose next quantum is worth most, and the value.
fn best_grow(curves: &[Curve<'_>], t: &[u64], p: &Params) -> Option<(usize, f64)> {
    (0..curves.len())
        .filter(|&i| {
            let s = curves[i].s;
            let q = curves[i].q;
            t[i] + q <= s.max && may_move(s, true, false, p)
        })
        .map(|i| (i, curves[i].up(t[i])))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
}

/// Whether an optional move may `grow` (else shrink) `s` now (module docs,
/// step 4): the same way as its last move at any time; the other way after
/// `dwell_s` for capacity it does not use (`unused`), after
/// `reverse_dwell_s` otherwise; a VM resized in an unknown direction is
/// left alone for `dwell_s`.
fn may_move(s: &Share, grow: bool, unused: bool, p: &Params) -> bool {
    let Some(since) = s.since_resize_s else {
        return true;
    };
    match s.last_grew {
        Some(g) if g == grow => true,
        Some(_) if unused && !grow => since >= p.dwell_s,
        Some(_) => since >= p.reverse_dwell_s.max(p.dwell_s),
        None => since >= p.dwell_s,
    }
}

/// Step 5: whole quanta of free capacity to VMs below max, the one with
/// the least target per weight first.
fn spread_free(pool: u64, shares: &[Share], t: &mut [u64], q: u64, held: &dyn Fn(&[u64]) -> u64) {
    loop {
        let free = pool.saturating_sub(held(t));
        if free < q {
            return;
        }
        let pick = (0..shares.len())
            .filter(|&i| t[i] + q <= shares[i].max && !shares[i].informed)
            .min_by(|&a, &b| {
                let pa = t[a] as f64 / shares[a].weight.max(1e-9);
                let pb = t[b] as f64 / shares[b].weight.max(1e-9);
                pa.total_cmp(&pb).then(a.cmp(&b))
            });
        match pick {
            Some(i) => t[i] += q,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const M: u64 = 1 << 20;

    fn share(min: u64, max: u64, target: u64) -> Share {
        Share {
            min,
            max,
            weight: 1.0,
            target,
            used: target,
            rate: 1e6,
            informed: true,
            ..Share::default()
        }
    }

    fn params() -> Params {
        Params {
            quantum: 64 * M,
            budget_bytes: 1 << 40,
            dwell_s: 0.0,
            reverse_dwell_s: 0.0,
            fill_ahead: 1 << 20,
            ..Params::default()
        }
    }

    #[test]
    fn spare_goes_to_the_vm_with_hot_slow_pages() {
        let mut a = share(64 * M, 1024 * M, 64 * M);
        a.grow = vec![0.3, 0.2, 0.1];
        let mut b = share(64 * M, 1024 * M, 64 * M);
        b.grow = vec![0.01];
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(
            pl.targets[0],
            64 * M + 3 * 64 * M,
            "a takes its three valuable quanta"
        );
        assert_eq!(pl.targets[1], 128 * M, "b its one");
        assert_eq!(pl.optional_bytes, 4 * 64 * M);
        assert!(pl.gain > 0.0);
    }

    #[test]
    fn hysteresis_blocks_small_exchanges_and_allows_large_ones() {
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.10];
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.11];
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        assert_eq!(
            pl.targets,
            vec![256 * M, 256 * M],
            "0.11 < 1.2 x 0.10: no churn"
        );
        b.grow = vec![0.5];
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M]);
    }

    #[test]
    fn budget_and_dwell_bound_the_moves() {
        let mut a = share(0, 1024 * M, 64 * M);
        a.grow = vec![0.5; 16];
        let mut p = params();
        p.budget_bytes = 128 * M;
        let pl = plan(1024 * M, &[a.clone()], &p);
        assert_eq!(pl.targets[0], 192 * M, "two quanta within the budget");
        a.since_resize_s = Some(1.0);
        p.dwell_s = 10.0;
        let pl = plan(1024 * M, &[a], &p);
        assert_eq!(pl.targets[0], 64 * M, "resized a second ago: left alone");
    }

    #[test]
    fn exchanges_within_sampling_noise_are_refused() {
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.10];
        a.shrink_se = vec![0.02];
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.13];
        b.grow_se = vec![0.02];
        // 0.13 > 1.2 x 0.10, but 0.03 < 2 x hypot(0.02, 0.02) = 0.057.
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        assert_eq!(pl.targets, vec![256 * M, 256 * M], "within noise: no trade");
        b.grow_se = vec![0.002];
        a.shrink_se = vec![0.002];
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M], "significant: traded");
        // The same shares, but b's rate is uncertain by 20%.
        b.rate_se = 0.2 * b.rate;
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![256 * M, 256 * M], "rate noise: no trade");
    }

    #[test]
    fn a_quantum_worth_nothing_goes_to_an_uncertain_receiver() {
        // b's gain is uncertain (its rate is extrapolated from a partial
        // pass of the sampler), a's last quantum holds nothing sampled.
        let a = share(0, 1024 * M, 256 * M);
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.1];
        b.rate_se = 0.9 * b.rate;
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M], "a loses nothing");
        // If a's quantum is worth something, b's noise must be beaten.
        let mut a = a;
        a.shrink = vec![0.01];
        a.shrink_se = vec![0.001];
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![256 * M, 256 * M], "within b's noise");
    }

    #[test]
    fn unused_capacity_is_taken_first_on_a_tie() {
        // a and b would both lose nothing; a uses all of its target, b
        // holds 128M it does not use: b gives.
        let a = share(0, 1024 * M, 256 * M);
        let mut b = share(0, 1024 * M, 256 * M);
        b.used = 128 * M;
        let mut c = share(0, 1024 * M, 0);
        c.grow = vec![0.5];
        let pl = plan(512 * M, &[a, b, c], &params());
        assert_eq!(pl.targets, vec![256 * M, 192 * M, 64 * M]);
    }

    #[test]
    fn a_vm_is_not_moved_back_within_the_reverse_dwell() {
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.01];
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.5];
        let mut p = params();
        p.reverse_dwell_s = 30.0;
        // a just grew 20 s ago: it may not give the quantum back yet.
        a.since_resize_s = Some(20.0);
        a.last_grew = Some(true);
        let pl = plan(512 * M, &[a.clone(), b.clone()], &p);
        assert_eq!(pl.targets, vec![256 * M, 256 * M]);
        // After the reverse dwell it may.
        a.since_resize_s = Some(31.0);
        let pl = plan(512 * M, &[a, b], &p);
        assert_eq!(pl.targets, vec![192 * M, 320 * M]);
    }

    /// Issue 32 item 5: an idle VM holds the spare (it got it first), a hot
    /// VM arrived later. The idle VM's unused capacity goes back after the
    /// dwell although it grew within the reverse dwell; the hot VM, which
    /// just grew, may grow on (the same way) as fast as it fills.
    #[test]
    fn unused_capacity_goes_back_after_the_dwell_at_the_rate_it_is_filled() {
        let mut p = params();
        p.dwell_s = 10.0;
        p.reverse_dwell_s = 30.0;
        p.fill_ahead = 2;
        let mut idle = share(32 * M, 1024 * M, 224 * M);
        idle.used = 29 * M;
        idle.since_resize_s = Some(12.0);
        idle.last_grew = Some(true);
        let mut hot = share(32 * M, 1024 * M, 32 * M);
        hot.grow = vec![0.2, 0.2, 0.2, 0.2];
        hot.since_resize_s = Some(2.0);
        hot.last_grew = Some(true);
        let pl = plan(256 * M, &[idle.clone(), hot.clone()], &p);
        assert_eq!(
            pl.targets,
            vec![96 * M, 160 * M],
            "two quanta ahead of what the hot VM uses"
        );
        // Within the dwell, the idle VM keeps it.
        idle.since_resize_s = Some(5.0);
        let pl = plan(256 * M, &[idle.clone(), hot.clone()], &p);
        assert_eq!(pl.targets, vec![224 * M, 32 * M]);
        // Capacity the idle VM uses is not taken back within the reverse dwell.
        idle.since_resize_s = Some(12.0);
        idle.used = 224 * M;
        idle.shrink = vec![0.0001];
        let pl = plan(256 * M, &[idle, hot.clone()], &p);
        assert_eq!(pl.targets, vec![224 * M, 32 * M]);
        // A VM that just shrank may not grow back within the dwell.
        let mut shrunk = hot;
        shrunk.last_grew = Some(false);
        let free = plan(512 * M, &[shrunk.clone()], &p);
        assert_eq!(free.targets, vec![32 * M]);
        shrunk.since_resize_s = Some(40.0);
        let free = plan(512 * M, &[shrunk], &p);
        assert_eq!(free.targets, vec![160 * M]);
    }

    /// A donor that fills 3 MiB of its last 64 MiB quantum loses (almost)
    /// nothing by it, however its ranking values the quantum: the quantum
    /// goes to an uncertain receiver without waiting for the noise to fall.
    #[test]
    fn a_quantum_the_donor_barely_fills_goes_without_a_test() {
        let mut idle = share(32 * M, 1024 * M, 96 * M);
        idle.used = 35 * M;
        idle.shrink = vec![0.3];
        idle.shrink_se = vec![0.05];
        let mut hot = share(32 * M, 1024 * M, 160 * M);
        hot.grow = vec![0.1];
        hot.rate_se = 0.8 * hot.rate;
        let pl = plan(256 * M, &[idle.clone(), hot.clone()], &params());
        assert_eq!(pl.targets, vec![32 * M, 224 * M]);
        // Filled by half, the loss counts half and the noise must be beaten.
        idle.used = 64 * M;
        let pl = plan(256 * M, &[idle, hot], &params());
        assert_eq!(pl.targets, vec![96 * M, 160 * M]);
    }

    #[test]
    fn a_new_vm_gets_its_min_back_from_the_spare_of_others() {
        let mut a = share(64 * M, 1024 * M, 448 * M);
        a.shrink = vec![0.01; 8];
        let b = share(128 * M, 512 * M, 0);
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        // b gets the 64M free now; a gives up what b still lacks (64M),
        // no more; b gets that in the next round, as a's shrink frees it.
        assert_eq!(pl.targets, vec![384 * M, 64 * M]);
        assert_eq!(pl.mandatory_bytes, 128 * M);
        let (mut a, mut b) = (a, b);
        (a.target, a.used, b.target, b.used) = (384 * M, 384 * M, 64 * M, 64 * M);
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![384 * M, 128 * M]);
    }

    /// A donor's quanta are valued one by one down from its target: the
    /// k-th quantum given up loses `shrink[k]`, times the share of that
    /// quantum (not the top one) the donor fills.
    #[test]
    fn a_donors_quanta_are_valued_one_by_one_down_from_its_target() {
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.5, 0.5];
        // The first quantum loses nothing, the second much.
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.0, 0.9];
        let pl = plan(512 * M, &[a, b.clone()], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M], "the second is kept");
        // Equally valued quanta, the top one unused, the next one full.
        let mut a = share(0, 1024 * M, 256 * M);
        a.used = 192 * M;
        a.shrink = vec![0.5, 0.5];
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M], "the full one is kept");
    }

    /// Of two donors, the one that loses least gives, whatever their order;
    /// on equal losses, the one holding most unused capacity.
    #[test]
    fn the_donor_that_loses_least_gives_in_either_order() {
        let mut cheap = share(0, 1024 * M, 256 * M);
        cheap.shrink = vec![0.01];
        let mut dear = share(0, 1024 * M, 256 * M);
        dear.shrink = vec![0.05];
        let mut c = share(0, 1024 * M, 0);
        c.grow = vec![0.5];
        let pl = plan(
            512 * M,
            &[cheap.clone(), dear.clone(), c.clone()],
            &params(),
        );
        assert_eq!(pl.targets, vec![192 * M, 256 * M, 64 * M]);
        let pl = plan(512 * M, &[dear, cheap, c.clone()], &params());
        assert_eq!(pl.targets, vec![256 * M, 192 * M, 64 * M]);
        // Equal (zero) losses: b holds 128M unused and gives, first or not.
        let a = share(0, 1024 * M, 256 * M);
        let mut b = share(0, 1024 * M, 256 * M);
        b.used = 128 * M;
        let pl = plan(512 * M, &[b, a, c], &params());
        assert_eq!(pl.targets, vec![192 * M, 256 * M, 64 * M]);
    }

    /// A quantum's value is weight x rate x share: a heavier VM's smaller
    /// share can outbid a lighter VM's larger one, and the rate's noise
    /// scales with the weight too.
    #[test]
    fn weight_scales_a_vms_value_and_its_noise() {
        let mut heavy = share(0, 1024 * M, 0);
        heavy.weight = 3.0;
        heavy.grow = vec![0.1];
        let mut light = share(0, 1024 * M, 0);
        light.grow = vec![0.2];
        let pl = plan(64 * M, &[heavy, light], &params());
        assert_eq!(pl.targets, vec![64 * M, 0], "3 x 0.1 > 1 x 0.2");
        // An exchange worth 2 x 0.2 - 0.1 = 0.3 (x 1e6) against noise of
        // 2 x 0.2 x weight x rate_se: refused at weight 2, rate_se 5e5
        // (0.4 x 1e6); taken with that noise halved.
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.1];
        let mut b = share(0, 1024 * M, 256 * M);
        b.weight = 2.0;
        b.grow = vec![0.2];
        b.rate_se = 5e5;
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        assert_eq!(pl.targets, vec![256 * M, 256 * M], "within b's noise");
        b.rate_se = 2.5e5;
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M], "beyond it");
    }

    /// The receiver's share noise and its rate noise add up: a rate known
    /// to 5% lets a clear gain through (the share times the rate's error,
    /// not the rate's error alone).
    #[test]
    fn a_rate_known_to_five_percent_lets_a_clear_exchange_through() {
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.10];
        a.shrink_se = vec![0.002];
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.13];
        b.grow_se = vec![0.002];
        b.rate_se = 0.05 * b.rate;
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M]);
    }

    /// A VM above its max is cut to it at once, counted as mandatory.
    #[test]
    fn a_vm_above_its_max_is_cut_to_it_as_a_mandatory_move() {
        let a = share(0, 128 * M, 320 * M);
        let b = share(0, 512 * M, 128 * M);
        let mut p = params();
        p.budget_bytes = 0;
        let pl = plan(512 * M, &[a, b], &p);
        assert_eq!(pl.targets, vec![128 * M, 128 * M]);
        assert_eq!(pl.mandatory_bytes, 192 * M);
        assert_eq!(pl.optional_bytes, 0);
    }

    /// A pool that shrank takes back exactly its excess (half a quantum
    /// here, not a whole one), cheapest loss first, and no VM below its min.
    #[test]
    fn a_shrunk_pool_takes_back_its_excess_and_no_more_than_a_vm_has_above_min() {
        let a = share(0, 1024 * M, 256 * M);
        let b = share(0, 1024 * M, 256 * M);
        let pl = plan(480 * M, &[a, b], &params());
        assert_eq!(pl.targets.iter().sum::<u64>(), 480 * M, "{:?}", pl.targets);
        assert_eq!(pl.mandatory_bytes, 32 * M);
        // a loses least but has only 32M above its min: b gives the rest.
        let mut a = share(224 * M, 1024 * M, 256 * M);
        a.shrink = vec![0.01];
        let mut b = share(0, 1024 * M, 256 * M);
        b.shrink = vec![0.5];
        let pl = plan(448 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![224 * M, 224 * M]);
        assert_eq!(pl.mandatory_bytes, 64 * M);
    }

    /// A new VM's min comes from the cheapest donors, none taken below its
    /// own min: a has only 32M above its min, c gives the rest.
    #[test]
    fn a_min_is_raised_without_taking_a_donor_below_its_own() {
        let mut a = share(224 * M, 1024 * M, 256 * M);
        a.shrink = vec![0.01];
        let new = share(64 * M, 1024 * M, 0);
        let mut c = share(0, 1024 * M, 256 * M);
        c.shrink = vec![0.5];
        let pl = plan(512 * M, &[a, new, c], &params());
        assert_eq!(pl.targets, vec![224 * M, 0, 224 * M]);
        assert_eq!(pl.mandatory_bytes, 64 * M);
    }

    /// A grant must be worth `min_share` of the receiver's weighted
    /// throughput: at it, granted; below it, not (however much is free).
    #[test]
    fn a_grant_worth_less_than_min_share_is_not_made() {
        let mut a = share(0, 1024 * M, 64 * M);
        let p = params();
        a.grow = vec![p.min_share];
        let pl = plan(512 * M, &[a.clone()], &p);
        assert_eq!(pl.targets, vec![128 * M], "worth min_share exactly");
        assert_eq!(pl.optional_bytes, 64 * M);
        a.grow = vec![p.min_share / 2.0];
        let pl = plan(512 * M, &[a], &p);
        assert_eq!(pl.targets, vec![64 * M], "worth half of it");
        assert_eq!(pl.optional_bytes, 0);
    }

    /// A donor whose estimate is zero but uncertain is not a sure zero: the
    /// receiver's gain must beat that noise.
    #[test]
    fn a_donors_zero_loss_with_noise_must_be_beaten() {
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.0];
        a.shrink_se = vec![0.1];
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.1];
        let pl = plan(512 * M, &[a.clone(), b.clone()], &params());
        assert_eq!(pl.targets, vec![256 * M, 256 * M], "0.1 within 2 x 0.1");
        a.shrink_se = vec![0.01];
        let pl = plan(512 * M, &[a, b], &params());
        assert_eq!(pl.targets, vec![192 * M, 320 * M], "0.1 beyond 2 x 0.01");
        assert_eq!(pl.optional_bytes, 128 * M, "an exchange counts twice");
    }

    /// An exchange costs two quanta of the budget: made with exactly that
    /// left, not with less; its gain is the receiver's value less the
    /// donor's loss.
    #[test]
    fn an_exchange_needs_two_quanta_of_budget_and_gains_value_less_loss() {
        let mut a = share(0, 1024 * M, 256 * M);
        a.shrink = vec![0.1];
        let mut b = share(0, 1024 * M, 256 * M);
        b.grow = vec![0.5];
        let mut p = params();
        p.budget_bytes = 128 * M;
        let pl = plan(512 * M, &[a.clone(), b.clone()], &p);
        assert_eq!(pl.targets, vec![192 * M, 320 * M]);
        assert!((pl.gain - 0.4e6).abs() < 1e-6, "gain {}", pl.gain);
        p.budget_bytes = 96 * M;
        let pl = plan(512 * M, &[a.clone(), b.clone()], &p);
        assert_eq!(pl.targets, vec![256 * M, 256 * M], "a quantum and a half");
        assert_eq!(pl.gain, 0.0);
        // Five quanta of budget: two exchanges, not a third.
        (a.shrink, b.grow) = (vec![0.1; 4], vec![0.5; 4]);
        p.budget_bytes = 320 * M;
        let pl = plan(512 * M, &[a, b], &p);
        assert_eq!(pl.targets, vec![128 * M, 384 * M]);
    }

    /// An exchange never takes a donor below its min: one with less than a
    /// quantum above it is passed over however little it would lose.
    #[test]
    fn an_exchange_passes_over_a_donor_within_a_quantum_of_its_min() {
        let mut a = share(224 * M, 1024 * M, 256 * M);
        a.shrink = vec![0.0];
        let mut c = share(0, 1024 * M, 256 * M);
        c.shrink = vec![0.05];
        let mut b = share(0, 1024 * M, 0);
        b.grow = vec![0.5];
        let pl = plan(512 * M, &[a, c, b], &params());
        assert_eq!(pl.targets, vec![256 * M, 192 * M, 64 * M]);
    }

    /// Free capacity nobody values goes, a whole quantum at a time and all
    /// of it, to the VMs without information, least target per weight
    /// first (not to an informed VM that values nothing).
    #[test]
    fn unvalued_free_capacity_is_spread_by_weight() {
        let mut a = share(0, 1024 * M, 0);
        a.informed = false;
        a.weight = 2.0;
        let mut b = share(0, 1024 * M, 0);
        b.informed = false;
        b.weight = 6.0;
        let c = share(0, 1024 * M, 0);
        let pl = plan(512 * M, &[a.clone(), b.clone(), c.clone()], &params());
        assert_eq!(pl.targets, vec![128 * M, 384 * M, 0]);
        // A part of a quantum stays free.
        let pl = plan(560 * M, &[a, b, c], &params());
        assert_eq!(pl.targets, vec![128 * M, 384 * M, 0]);
    }

    proptest! {
        #[test]
        fn plans_respect_min_max_pool_and_budget(
            pool_q in 0u64..64,
            vms in proptest::collection::vec(
                (0u64..8, 0u64..16, 0u64..24, 0.1f64..4.0, 0.0f64..1e6,
                 proptest::collection::vec(0.0f64..0.5, 0..8),
                 proptest::collection::vec(0.0f64..0.5, 0..8), any::<bool>()), 0..6),
            budget_q in 0u64..8,
        ) {
            let q = 64 * M;
            let mut shares = Vec::new();
            let mut mins = 0;
            for (min, extra, target, weight, ops, grow, shrink, informed) in vms {
                let min = min * q;
                let max = min + extra * q;
                mins += min;
                shares.push(Share {
                    min, max, weight, target: target * q, used: target * q,
                    rate: ops, grow, shrink, informed, since_resize_s: None, last_grew: None,
                    ..Share::default()
                });
            }
            let pool = mins + pool_q * q; // admission keeps the mins within the pool
            let p = Params { quantum: q, budget_bytes: budget_q * q, dwell_s: 0.0, reverse_dwell_s: 0.0, ..Params::default() };
            let pl = plan(pool, &shares, &p);
            prop_assert!(pl.optional_bytes <= p.budget_bytes, "budget");
            prop_assert!(pl.targets.iter().sum::<u64>() <= pool, "pool");
            for (t, s) in pl.targets.iter().zip(&shares) {
                prop_assert!(*t <= s.max, "max");
            }
            // The shrinks converge; the next round grants every min.
            for (s, t) in shares.iter_mut().zip(&pl.targets) {
                s.target = *t;
                s.used = *t;
            }
            let pl = plan(pool, &shares, &p);
            prop_assert!(pl.targets.iter().sum::<u64>() <= pool, "pool, round 2");
            for (t, s) in pl.targets.iter().zip(&shares) {
                prop_assert!(*t >= s.min && *t <= s.max, "min {} <= {} <= max {}", s.min, t, s.max);
            }
        }
    }
}
