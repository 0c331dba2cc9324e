//! Thrashing detection for `adaptive`: every migration is an investment
//! whose return is measured, and the migration budget follows the return.
//!
//! 1. Each migration is recorded ([`Thrash::record`]) with the tick it ran.
//! 2. [`EVAL_TICKS`] sampled ticks later (ticks in which the guest made a
//!    sampled access: an idle guest, e.g. a benchmark sleeping between
//!    rounds, shows no return and so none is judged) it is valued: a promotion earns the sampled
//!    accesses its page received in the faster tier since it moved, a
//!    demotion is charged the sampled accesses its page received in the
//!    slower tier (what the victim now costs). A page that moved again in
//!    between is a ping-pong: its migration earned nothing.
//! 3. Per evaluation window, the net sampled accesses are turned into
//!    nanoseconds saved (`net * sample_period * (L_slow - L_fast)`) and
//!    compared with what the migrations cost (`moves * MIGRATION_COST_NS`),
//!    both as exponential moving averages ([`EMA_WEIGHT`]).
//! 4. A gain not above [`CONFIDENCE_SIGMAS`] standard errors of sampling
//!    noise, or benefit below cost even at the optimistic end, raises the
//!    throttle one level (halving the
//!    migration budget, down to none at [`MAX_LEVEL`]); benefit above
//!    [`RECOVER_RATIO`] times cost lowers it. Fully throttled, a small probe
//!    runs every [`PROBE_EVERY_TICKS`] to measure again; a change of the
//!    access pattern ([`super::PHASE_JUMP`]) resets the throttle at once.

use std::collections::VecDeque;

use super::burst::Bursts;

/// Ticks after a migration before its benefit is valued (0.5 s at the
/// 20 ms tick): long enough for a hot page to be sampled several times.
pub const EVAL_TICKS: u32 = 25;
/// Assumed cost of one 4 KiB migration to the guest, ns: setup, copy and
/// a TLB shootdown with its IPIs (the simulator's default cost model sums
/// to 6-14 us depending on the thread count; Nomad §2 measures ~10 us).
pub const MIGRATION_COST_NS: f64 = 10_000.0;
/// A page that stays in place is assumed to keep its measured access rate
/// for this many ticks (30 s, the time-scale on which the seeds' hot sets
/// stay put): a migration's benefit is its rate over the evaluation window
/// extrapolated to this horizon. ASSUMED.
pub const HORIZON_TICKS: u32 = 1500;
/// Standard errors by which the measured gain must fall short of break-even
/// before the throttle rises (samples are Poisson: variance = count).
pub const CONFIDENCE_SIGMAS: f64 = 2.0;
/// Whether a gain lost in sampling noise alone raises the throttle.
/// Off: with sparse samples (large pages per sample) a real gain is often
/// not yet distinguishable, and the skew gate in `adaptive` already keeps
/// a pattern without skew from migrating.
pub const NO_GAIN_THROTTLES: bool = false;
/// Weight of the newest evaluation window in the moving averages.
pub const EMA_WEIGHT: f64 = 0.3;
/// Throttle levels: level `l` keeps `1 / 2^l` of the budget; the last is none.
pub const MAX_LEVEL: u8 = 5;
/// Benefit / cost above which the throttle is lowered a level.
pub const RECOVER_RATIO: f64 = 2.0;
/// At the last level, a probe of `1 / 2^(MAX_LEVEL - 1)` of the budget runs
/// once every this many ticks (2 s at the 20 ms tick).
pub const PROBE_EVERY_TICKS: u64 = 100;
/// Migrations valued per window before the averages are trusted.
pub const MIN_VALUED: f64 = 8.0;
/// Share of the valued migrations that must be demotions (or ping-pongs)
/// for thrashing to be possible at all: promotions into free room displace
/// nothing and cannot thrash.
pub const MIN_DISPLACING_SHARE: f64 = 0.25;
/// Most migrations remembered at once (older ones are valued early).
pub const MAX_RECORDED: usize = 1 << 16;

/// One remembered migration.
#[derive(Clone, Copy, Debug)]
struct Move {
    page: u64,
    promotion: bool,
    tick: u64,
    /// [`Thrash::sampled_ticks`] when it moved (its age counts those).
    sampled_at: u64,
    /// Hits expected over [`EVAL_TICKS`] at its rate when it moved (for
    /// [`Bursts`]).
    expected: f32,
}

/// The thrash detector's state.
#[derive(Clone, Debug)]
pub struct Thrash {
    moves: VecDeque<Move>,
    /// EMA of net sampled accesses gained per window.
    gain_ema: f64,
    /// EMA of migrations valued per window.
    moves_ema: f64,
    /// EMA of ping-pongs per window.
    pingpong_ema: f64,
    /// EMA of the variance of the gain (sum of the hits counted).
    var_ema: f64,
    level: u8,
    /// Net gain and count of the window being valued.
    window_gain: f64,
    window_moves: f64,
    window_pingpong: f64,
    window_displacing: f64,
    window_var: f64,
    window_start: u64,
    /// Ticks so far in which the guest made a sampled access.
    sampled_ticks: u64,
    /// Benefit / cost of the last window (for the explanation).
    pub last_ratio: Option<f64>,
    /// Whether throttling is enabled (tests disable it as a negative control).
    pub enabled: bool,
    /// Streaming pages from what promotions returned ([`Bursts`]).
    pub bursts: Bursts,
}

/// What [`Thrash::evaluate`] needs to know about one page.
pub trait PageHistory {
    /// Tick of the page's last migration.
    fn last_move_tick(&self, page: u64) -> u64;
    /// Sampled accesses of the page since its last migration.
    fn hits_since_move(&self, page: u64) -> u16;
}

impl Default for Thrash {
    fn default() -> Self {
        Self {
            moves: VecDeque::new(),
            gain_ema: 0.0,
            moves_ema: 0.0,
            pingpong_ema: 0.0,
            var_ema: 0.0,
            level: 0,
            window_gain: 0.0,
            window_moves: 0.0,
            window_pingpong: 0.0,
            window_displacing: 0.0,
            window_var: 0.0,
            window_start: 0,
            sampled_ticks: 0,
            last_ratio: None,
            enabled: true,
            bursts: Bursts::default(),
        }
    }
}

impl Thrash {
    /// Step 1: remember a migration done at `tick` of a page expected to
    /// earn `expected` sampled hits over [`EVAL_TICKS`].
    pub fn record(&mut self, page: u64, promotion: bool, tick: u64, expected: f32) {
        if self.moves.len() >= MAX_RECORDED {
            self.moves.pop_front();
        }
        self.moves.push_back(Move {
            page,
            promotion,
            tick,
            sampled_at: self.sampled_ticks,
            expected,
        });
    }

    /// Steps 2-4 at `tick`: values the migrations old enough, closes the
    /// window every [`EVAL_TICKS`] sampled ticks and moves the throttle.
    /// `saved_ns` is what one sampled access served fast instead of slow
    /// saves; `sampled`: whether the guest made a sampled access this tick
    /// (if not, nothing is valued: ages and windows count sampled ticks).
    pub fn evaluate(&mut self, tick: u64, hist: &dyn PageHistory, saved_ns: f64, sampled: bool) {
        if !sampled {
            return;
        }
        self.sampled_ticks += 1;
        let now = self.sampled_ticks;
        while let Some(m) = self.moves.front().copied() {
            if now < m.sampled_at + u64::from(EVAL_TICKS) && self.moves.len() < MAX_RECORDED {
                break;
            }
            self.moves.pop_front();
            self.window_moves += 1.0;
            if hist.last_move_tick(m.page) != m.tick {
                self.window_pingpong += 1.0;
                self.window_displacing += 1.0;
                continue;
            }
            if !m.promotion {
                self.window_displacing += 1.0;
            }
            let hits = f64::from(hist.hits_since_move(m.page));
            if m.promotion {
                self.bursts.valued(m.page, f64::from(m.expected), hits);
            }
            self.window_gain += if m.promotion { hits } else { -hits };
            self.window_var += hits;
        }
        if now < self.window_start + u64::from(EVAL_TICKS) {
            return;
        }
        self.window_start = now;
        self.bursts.close_window(tick);
        let w = EMA_WEIGHT;
        self.gain_ema = w * self.window_gain + (1.0 - w) * self.gain_ema;
        self.moves_ema = w * self.window_moves + (1.0 - w) * self.moves_ema;
        self.pingpong_ema = w * self.window_pingpong + (1.0 - w) * self.pingpong_ema;
        self.var_ema = w * self.window_var + (1.0 - w) * self.var_ema;
        let valued = self.window_moves;
        let displacing = self.window_displacing;
        self.window_gain = 0.0;
        self.window_moves = 0.0;
        self.window_pingpong = 0.0;
        self.window_displacing = 0.0;
        self.window_var = 0.0;
        if valued < MIN_VALUED || self.moves_ema <= 0.0 {
            return;
        }
        let horizon = f64::from(HORIZON_TICKS) / f64::from(EVAL_TICKS);
        let cost = self.moves_ema * MIGRATION_COST_NS;
        let worth = |gain: f64| gain.max(0.0) * horizon * saved_ns;
        let ratio = worth(self.gain_ema) / cost;
        self.last_ratio = Some(ratio);
        if !self.enabled {
            return;
        }
        // Throttle only when confident: even the optimistic gain is short.
        // The EMA of independent windows has w / (2 - w) of one window's variance.
        let ema_var = self.var_ema.max(0.0) * w / (2.0 - w);
        let optimistic = self.gain_ema + CONFIDENCE_SIGMAS * ema_var.sqrt();
        // Thrashing: no gain distinguishable from sampling noise, or even
        // the optimistic gain short of the cost.
        let noise = CONFIDENCE_SIGMAS * ema_var.sqrt();
        let no_gain = self.gain_ema <= noise && NO_GAIN_THROTTLES;
        if (no_gain || worth(optimistic) < cost) && displacing >= MIN_DISPLACING_SHARE * valued {
            self.level = (self.level + 1).min(MAX_LEVEL);
        } else if ratio > RECOVER_RATIO && !no_gain {
            self.level = self.level.saturating_sub(1);
        }
    }

    /// Forgets the throttle (the access pattern changed).
    pub fn reset(&mut self) {
        self.bursts.reset();
        self.level = 0;
        self.var_ema = 0.0;
        self.gain_ema = 0.0;
        self.moves_ema = 0.0;
        self.pingpong_ema = 0.0;
        self.last_ratio = None;
    }

    /// Current throttle level (0 = full budget, [`MAX_LEVEL`] = none).
    pub fn level(&self) -> u8 {
        self.level
    }

    /// Share of valued migrations that were ping-pongs (moving average).
    pub fn pingpong_share(&self) -> f64 {
        if self.moves_ema > 0.0 {
            self.pingpong_ema / self.moves_ema
        } else {
            0.0
        }
    }

    /// The share of the migration budget allowed at `tick`.
    pub fn budget_share(&self, tick: u64) -> f64 {
        if self.level >= MAX_LEVEL {
            if tick.is_multiple_of(PROBE_EVERY_TICKS) {
                1.0 / f64::from(1u32 << (MAX_LEVEL - 1))
            } else {
                0.0
            }
        } else {
            1.0 / f64::from(1u32 << self.level)
        }
    }
}

/// What the unit tests of the policy (`adaptive`'s `step_tests`) read back.
#[cfg(test)]
impl Thrash {
    /// The migrations recorded and not valued yet: page, promotion, tick
    /// and the hits expected of it.
    pub(crate) fn recorded(&self) -> Vec<(u64, bool, u64, f32)> {
        self.moves
            .iter()
            .map(|m| (m.page, m.promotion, m.tick, m.expected))
            .collect()
    }

    /// Sets the throttle level, as windows of unpaid migrations would.
    pub(crate) fn set_level(&mut self, level: u8) {
        self.level = level;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Hist {
        last: Vec<u64>,
        hits: Vec<u16>,
    }
    impl Hist {
        /// 40 pages, none moved, each with `hits`.
        fn new(hits: u16) -> Self {
            Self {
                last: vec![0; 40],
                hits: vec![hits; 40],
            }
        }
    }
    impl PageHistory for Hist {
        fn last_move_tick(&self, p: u64) -> u64 {
            self.last[p as usize]
        }
        fn hits_since_move(&self, p: u64) -> u16 {
            self.hits[p as usize]
        }
    }

    /// `EVAL_TICKS` ticks, each with (`sampled`) or without a sampled access.
    fn ticks(t: &mut Thrash, tick: &mut u64, h: &Hist, sampled: bool) {
        for _ in 0..EVAL_TICKS {
            *tick += 1;
            t.evaluate(*tick, h, 1_000.0, sampled);
        }
    }

    /// 20 promotions and 20 demotions at `tick`, promoted pages with
    /// `promoted_hits` and victims with `victim_hits` by valuation time.
    fn moves(t: &mut Thrash, tick: u64, h: &mut Hist, promoted_hits: u16, victim_hits: u16) {
        for p in 0..40 {
            h.last[p as usize] = tick;
            h.hits[p as usize] = if p < 20 { promoted_hits } else { victim_hits };
            t.record(p, p < 20, tick, 1.0);
        }
    }

    #[test]
    fn useless_migrations_throttle_and_useful_ones_recover() {
        let mut t = Thrash::default();
        let mut h = Hist::new(1);
        let mut tick = 0;
        // Promoted pages no hotter than the victims: no net gain.
        for _ in 0..6 {
            moves(&mut t, tick, &mut h, 1, 1);
            ticks(&mut t, &mut tick, &h, true);
        }
        assert!(t.level() >= 3, "level {}", t.level());
        // Now promoted pages are hot and victims cold.
        for _ in 0..12 {
            moves(&mut t, tick, &mut h, 5, 0);
            ticks(&mut t, &mut tick, &h, true);
        }
        assert_eq!(t.level(), 0);
        assert!(t.last_ratio.unwrap() > RECOVER_RATIO);
    }

    #[test]
    fn an_idle_guest_judges_no_migration() {
        let mut t = Thrash::default();
        let mut h = Hist::new(0);
        let mut tick = 0;
        // Migrations, then the guest sleeps (no sampled access): nothing
        // has earned anything yet, and nothing is judged for it.
        for _ in 0..6 {
            moves(&mut t, tick, &mut h, 0, 0);
            ticks(&mut t, &mut tick, &h, false);
        }
        assert_eq!(t.level(), 0, "an idle window throttled");
        assert_eq!(t.last_ratio, None);
        // Awake, the promoted pages turn out hot: still no throttle.
        for p in 0..20 {
            h.hits[p] = 5;
        }
        ticks(&mut t, &mut tick, &h, true);
        ticks(&mut t, &mut tick, &h, true);
        assert_eq!(t.level(), 0);
        assert!(t.last_ratio.unwrap() > RECOVER_RATIO, "{:?}", t.last_ratio);
    }

    /// One evaluation window: `moves` recorded now as (page, promotion,
    /// hits by valuation, moved again since), then `EVAL_TICKS` sampled
    /// ticks with `saved_ns` per sampled access.
    fn window(t: &mut Thrash, tick: &mut u64, moves: &[(u64, bool, u16, bool)], saved_ns: f64) {
        let mut h = Hist::new(0);
        for &(page, promotion, hits, again) in moves {
            t.record(page, promotion, *tick, 5.0);
            h.hits[page as usize] = hits;
            h.last[page as usize] = if again { *tick + 1 } else { *tick };
        }
        for _ in 0..EVAL_TICKS {
            *tick += 1;
            t.evaluate(*tick, &h, saved_ns, true);
        }
    }

    /// Six promotions (4 hits each), four demotions (1 hit each) and a
    /// ping-pong.
    const MIXED: [(u64, bool, u16, bool); 11] = [
        (0, true, 4, false),
        (1, true, 4, false),
        (2, true, 4, false),
        (3, true, 4, false),
        (4, true, 4, false),
        (5, true, 4, false),
        (6, false, 1, false),
        (7, false, 1, false),
        (8, false, 1, false),
        (9, false, 1, false),
        (10, true, 9, true),
    ];

    /// Steps 2-3: a promotion earns its hits, a demotion is charged its
    /// victim's, a ping-pong earns nothing; the window's sums enter the
    /// moving averages with weight 0.3; the ratio is the gain over the
    /// horizon (1,500 / 25 windows) against 10 us a migration.
    #[test]
    fn a_window_values_its_migrations_into_the_moving_averages() {
        let mut t = Thrash::default();
        let mut tick = 0;
        window(&mut t, &mut tick, &MIXED, 1_000.0);
        // Gain 6 x 4 - 4 = 20, variance 24 + 4 = 28, 11 moves, 1 ping-pong.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(t.gain_ema, 6.0), "{}", t.gain_ema);
        assert!(close(t.var_ema, 8.4), "{}", t.var_ema);
        assert!(close(t.moves_ema, 3.3), "{}", t.moves_ema);
        assert!(close(t.pingpong_share(), 0.3 / 3.3));
        // 6 x 60 x 1,000 ns against 3.3 x 10,000 ns.
        assert!(close(t.last_ratio.unwrap(), 360_000.0 / 33_000.0));
        assert_eq!(t.level(), 0);
        // The window's sums start again from zero; the averages decay.
        window(&mut t, &mut tick, &MIXED[..10], 1_000.0);
        assert!(close(t.gain_ema, 0.3 * 20.0 + 0.7 * 6.0), "{}", t.gain_ema);
        assert!(close(t.moves_ema, 0.3 * 10.0 + 0.7 * 3.3));
        assert!(close(t.var_ema, 0.3 * 28.0 + 0.7 * 8.4));
        assert!(close(t.pingpong_share(), 0.7 * 0.3 / (3.0 + 0.7 * 3.3)));
        // The promotions were judged by the burst detector (5 expected hits).
        assert_eq!(t.bursts.total, 0);
    }

    /// A migration is valued `EVAL_TICKS` sampled ticks after it moved,
    /// not before; the window closes every `EVAL_TICKS` sampled ticks.
    #[test]
    fn a_migration_is_valued_after_eval_ticks_sampled_ticks() {
        let mut t = Thrash::default();
        let h = Hist::new(3);
        t.record(0, true, 0, 1.0);
        for k in 1..EVAL_TICKS {
            t.evaluate(u64::from(k), &h, 1_000.0, true);
            t.evaluate(u64::from(k), &h, 1_000.0, false);
        }
        assert_eq!((t.moves.len(), t.window_moves), (1, 0.0));
        t.evaluate(100, &h, 1_000.0, true);
        assert!(t.moves.is_empty());
        assert_eq!(t.window_moves, 0.0, "valued, and its window closed");
        assert!((t.moves_ema - 0.3).abs() < 1e-12);
        assert!((t.gain_ema - 0.9).abs() < 1e-12);
        assert_eq!(t.last_ratio, None, "fewer than MIN_VALUED: no ratio");
    }

    /// Step 4: the throttle rises a level when even the optimistic gain
    /// is short of the cost and at least a quarter of the valued moves
    /// displaced a page; not when fewer displaced. Disabled, it only
    /// reports the ratio.
    #[test]
    fn the_throttle_rises_only_when_short_and_displacing() {
        // 8 moves; 2 demotions (a quarter): rises.
        let mut eight: Vec<(u64, bool, u16, bool)> = (0..8).map(|p| (p, true, 1, false)).collect();
        eight[6].1 = false;
        eight[7].1 = false;
        let mut t = Thrash::default();
        let mut tick = 0;
        window(&mut t, &mut tick, &eight, 1.0);
        assert_eq!(t.level(), 1);
        // 1 demotion of 8: promotions into room cannot thrash.
        eight[6].1 = true;
        let mut t = Thrash::default();
        window(&mut t, &mut tick, &eight, 1.0);
        assert_eq!(t.level(), 0);
        // ... but a ping-pong displaced a page too: 2 of 8 again.
        eight[5].3 = true;
        let mut t = Thrash::default();
        window(&mut t, &mut tick, &eight, 1.0);
        assert_eq!(t.level(), 1);
        eight[5].3 = false;
        // 7 moves: too few to judge at all.
        let mut t = Thrash::default();
        window(&mut t, &mut tick, &eight[..7], 1.0);
        assert_eq!((t.level(), t.last_ratio), (0, None));
        // Disabled: the ratio, no level.
        let mut t = Thrash {
            enabled: false,
            ..Thrash::default()
        };
        eight[6].1 = false;
        window(&mut t, &mut tick, &eight, 1.0);
        assert_eq!(t.level(), 0);
        assert!(t.last_ratio.is_some());
    }

    /// Step 4: the throttle falls a level only when the benefit is more
    /// than twice the cost; at exactly twice it stays.
    #[test]
    fn the_throttle_falls_only_above_twice_the_cost() {
        // 8 promotions of 1 hit: gain 0.3 x 8, cost 0.3 x 8 x 10 us; a
        // sampled access saving 10,000 / 60 ns makes the ratio 1 exactly.
        let eight: Vec<(u64, bool, u16, bool)> = (0..8).map(|p| (p, true, 1, false)).collect();
        let at_ratio = |r: f64| {
            let mut t = Thrash {
                level: 3,
                ..Thrash::default()
            };
            let mut tick = 0;
            window(&mut t, &mut tick, &eight, r * 10_000.0 / 60.0);
            (t.level(), t.last_ratio.unwrap())
        };
        let (level, ratio) = at_ratio(RECOVER_RATIO);
        assert!((ratio - RECOVER_RATIO).abs() < 1e-9, "{ratio}");
        assert_eq!(level, 3);
        assert_eq!(at_ratio(RECOVER_RATIO * 1.01).0, 2);
    }

    /// The budget halves per level; fully throttled, a probe of the last
    /// level's share runs every `PROBE_EVERY_TICKS`; a reset forgets all.
    #[test]
    fn the_budget_halves_per_level_and_probes_when_fully_throttled() {
        let mut t = Thrash::default();
        for (level, share) in [(0, 1.0), (1, 0.5), (2, 0.25), (4, 1.0 / 16.0)] {
            t.level = level;
            assert_eq!(t.budget_share(7), share);
        }
        t.level = MAX_LEVEL;
        assert_eq!(t.budget_share(PROBE_EVERY_TICKS - 1), 0.0);
        assert_eq!(t.budget_share(PROBE_EVERY_TICKS), 1.0 / 16.0);
        assert_eq!(t.budget_share(2 * PROBE_EVERY_TICKS), 1.0 / 16.0);
        let mut tick = 0;
        window(&mut t, &mut tick, &MIXED, 1_000.0);
        t.level = MAX_LEVEL;
        t.reset();
        assert_eq!(
            (t.level(), t.last_ratio, t.pingpong_share()),
            (0, None, 0.0)
        );
        assert_eq!((t.gain_ema, t.var_ema, t.moves_ema), (0.0, 0.0, 0.0));
    }

    /// At most `MAX_RECORDED` migrations are remembered: the oldest goes,
    /// and a full list is valued early.
    #[test]
    fn a_full_record_drops_the_oldest_and_values_early() {
        let mut t = Thrash::default();
        for p in 0..=MAX_RECORDED as u64 {
            t.record(p, true, 0, 1.0);
        }
        assert_eq!(t.moves.len(), MAX_RECORDED);
        assert_eq!(t.moves.front().map(|m| m.page), Some(1));
        t.evaluate(1, &Hist::new(0), 1_000.0, true);
        assert_eq!(t.moves.len(), MAX_RECORDED - 1, "one valued early");
    }

    /// Step 4's optimistic gain: the EMA's gain plus two standard errors,
    /// the EMA of independent windows having `w / (2 - w)` of one
    /// window's variance. A window with no net gain (6 promotions of 1
    /// hit, 2 demotions of 3) but a variance of 12 is short of its cost
    /// only if that variance is underrated.
    #[test]
    fn the_optimistic_gain_uses_the_emas_variance() {
        let mut moves: Vec<(u64, bool, u16, bool)> = (0..6).map(|p| (p, true, 1, false)).collect();
        moves.extend([(6, false, 3, false), (7, false, 3, false)]);
        // Optimistic gain 2 x sqrt(0.3 x 12 x 0.3 / 1.7) = 1.594 sampled
        // accesses; the cost 2.4 x 10 us is worth 1.481 at 270 ns each.
        let mut t = Thrash::default();
        let mut tick = 0;
        window(&mut t, &mut tick, &moves, 270.0);
        assert_eq!(t.level(), 0);
        assert_eq!(t.last_ratio, Some(0.0));
        // At 250 ns, the cost is worth 1.6: short.
        let mut t = Thrash::default();
        window(&mut t, &mut tick, &moves, 250.0);
        assert_eq!(t.level(), 1);
    }
}
