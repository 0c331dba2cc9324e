//! Mechanism choice for `adaptive`, per migration, from what was measured
//! about the page and the mechanisms:
//!
//! - a **demotion** of a page whose clean shadow sits in the destination is
//!   a remap ([`Mechanism::ShadowDemotion`], no copy); any other demotion
//!   is stop-and-copy (a cold page is not being touched, so unmapping it
//!   costs the guest nothing, and it needs no second copy);
//! - a **promotion** is transactional (Nomad's TPM: the guest keeps
//!   accessing the page during the copy) unless the page is write-hot and
//!   TPM keeps failing on it: after [`ABORT_LIMIT`] aborts of its own, or
//!   once the measured abort rate of write-sampled pages is above
//!   [`WRITE_ABORT_RATE`], it is moved by stop-and-copy;
//! - where the dirty log TPM needs costs the guest more than the stalls it
//!   saves ([`PolicyConfig::dirty_log_costly`](super::super::PolicyConfig):
//!   live under KVM, measured), every promotion is stop-and-copy: the
//!   guest waits only if it touches the page in its copy window (a 4 KiB
//!   page: tens of microseconds), while TPM keeps a 64 MiB segment logged
//!   for as long as the transaction or its shadow lives;
//! - a transactional promotion **keeps its shadow** when the page is likely
//!   to come back down (its heat is within [`SHADOW_MARGIN`] of the fast
//!   tier's threshold, or it was demoted before), it was not written
//!   recently (a write drops the shadow anyway) and the source tier keeps
//!   [`SHADOW_FREE_FRACTION`] of its capacity free after it.

use super::super::types::{Mechanism, TierStatus};

/// TPM aborts of one page after which it moves by stop-and-copy.
pub const ABORT_LIMIT: u8 = 2;
/// Abort rate of TPM on write-sampled pages above which write-sampled pages
/// skip TPM altogether (measured over all such attempts, moving average).
pub const WRITE_ABORT_RATE: f64 = 0.5;
/// Heat (sample count) above the promotion threshold within which a page
/// counts as marginal: likely to be demoted again.
pub const SHADOW_MARGIN: u16 = 2;
/// Free share of the source tier a kept shadow must leave.
pub const SHADOW_FREE_FRACTION: f64 = 0.05;

/// What the choice knows about one page.
#[derive(Clone, Copy, Debug, Default)]
pub struct PageFacts {
    /// TPM aborts since its last committed migration.
    pub aborts: u8,
    /// Sampled writes since its last migration.
    pub writes: u8,
    /// Its heat and the destination's promotion threshold.
    pub heat: u16,
    /// Heat at which pages belong in the destination.
    pub threshold: u16,
    /// The page was demoted before.
    pub was_demoted: bool,
}

/// Why a mechanism was chosen (counted in the policy's explanation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Demotion onto the page's shadow.
    ShadowRemap,
    /// Demotion by copy.
    ColdCopy,
    /// Clean page: TPM, exclusive.
    CleanTpm,
    /// Marginal clean page: TPM keeping a shadow.
    ShadowedTpm,
    /// Written but TPM has not failed on it yet: TPM.
    WrittenTpm,
    /// Write-hot page on which TPM keeps aborting: stop-and-copy.
    WriteHotStopCopy,
    /// The dirty log TPM needs costs the guest more than a copy's stall:
    /// stop-and-copy.
    UnloggedStopCopy,
}

/// Per-migration mechanism choice, with the measured abort rate.
#[derive(Clone, Debug, Default)]
pub struct Chooser {
    /// Moving average of TPM's abort rate on write-sampled pages.
    pub write_abort_rate: f64,
    /// Disabled: every promotion is TPM with a shadow (Nomad's choice), as
    /// a negative control in tests.
    pub fixed: bool,
    /// The dirty log costs the guest more than a copy's stall
    /// ([`PolicyConfig::dirty_log_costly`](super::super::PolicyConfig)):
    /// promotions skip TPM.
    pub dirty_log_costly: bool,
}

impl Chooser {
    /// Records one TPM outcome of a page that was (`written`) or was not
    /// write-sampled before it moved.
    pub fn learn(&mut self, written: bool, aborted: bool) {
        if written {
            let x = if aborted { 1.0 } else { 0.0 };
            self.write_abort_rate = 0.9 * self.write_abort_rate + 0.1 * x;
        }
    }

    /// The mechanism to promote a page with `facts` out of `src`.
    pub fn promotion(&self, f: &PageFacts, src: &TierStatus) -> (Mechanism, Reason) {
        if self.fixed {
            return (Mechanism::TPM, Reason::ShadowedTpm);
        }
        if self.dirty_log_costly {
            return (Mechanism::StopAndCopy, Reason::UnloggedStopCopy);
        }
        if f.writes > 0 {
            if f.aborts >= ABORT_LIMIT || self.write_abort_rate > WRITE_ABORT_RATE {
                return (Mechanism::StopAndCopy, Reason::WriteHotStopCopy);
            }
            return (
                Mechanism::Transactional { keep_shadow: false },
                Reason::WrittenTpm,
            );
        }
        let marginal = f.heat < f.threshold.saturating_add(SHADOW_MARGIN) || f.was_demoted;
        let room = src.free_pages as f64 > SHADOW_FREE_FRACTION * src.capacity_pages as f64;
        if marginal && room {
            (Mechanism::TPM, Reason::ShadowedTpm)
        } else {
            (
                Mechanism::Transactional { keep_shadow: false },
                Reason::CleanTpm,
            )
        }
    }

    /// The mechanism to demote a page whose shadow (if any) is in `shadow`
    /// to tier `to`.
    pub fn demotion(&self, shadow: Option<u8>, to: u8) -> (Mechanism, Reason) {
        if shadow == Some(to) {
            (Mechanism::ShadowDemotion, Reason::ShadowRemap)
        } else {
            (Mechanism::StopAndCopy, Reason::ColdCopy)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(free: u64) -> TierStatus {
        TierStatus {
            capacity_pages: 1000,
            free_pages: free,
            shadow_pages: 0,
            loaded_latency_ns: None,
            request_rate: None,
            unloaded_latency_ns: None,
        }
    }

    #[test]
    fn each_page_gets_its_mechanism() {
        let c = Chooser::default();
        let hot_clean = PageFacts {
            heat: 20,
            threshold: 4,
            ..Default::default()
        };
        let marginal = PageFacts {
            heat: 4,
            threshold: 4,
            ..Default::default()
        };
        let written = PageFacts {
            writes: 3,
            heat: 20,
            threshold: 4,
            ..Default::default()
        };
        let write_hot = PageFacts {
            aborts: ABORT_LIMIT,
            ..written
        };
        assert_eq!(c.promotion(&hot_clean, &tier(500)).1, Reason::CleanTpm);
        assert_eq!(c.promotion(&marginal, &tier(500)).0, Mechanism::TPM);
        assert_eq!(
            c.promotion(&marginal, &tier(10)).1,
            Reason::CleanTpm,
            "no shadow without slow-tier room"
        );
        assert_eq!(c.promotion(&written, &tier(500)).1, Reason::WrittenTpm);
        assert_eq!(
            c.promotion(&write_hot, &tier(500)).0,
            Mechanism::StopAndCopy
        );
        assert_eq!(c.demotion(Some(1), 1).0, Mechanism::ShadowDemotion);
        assert_eq!(c.demotion(None, 1).0, Mechanism::StopAndCopy);
        // A costly dirty log: every promotion by stop-and-copy, whatever
        // the page; demotions unchanged.
        let unlogged = Chooser {
            dirty_log_costly: true,
            ..Chooser::default()
        };
        for f in [&hot_clean, &marginal, &written, &write_hot] {
            assert_eq!(
                unlogged.promotion(f, &tier(500)),
                (Mechanism::StopAndCopy, Reason::UnloggedStopCopy),
                "{f:?}"
            );
        }
        assert_eq!(unlogged.demotion(Some(1), 1).0, Mechanism::ShadowDemotion);
        let mut learned = Chooser::default();
        for _ in 0..20 {
            learned.learn(true, true);
        }
        assert_eq!(
            learned.promotion(&written, &tier(500)).0,
            Mechanism::StopAndCopy,
            "measured aborts skip TPM for written pages"
        );
    }

    /// Each threshold of the choice, exactly at its boundary (cargo-mutants
    /// missed `>` to `>=` and `<` to `<=` here: results §12).
    #[test]
    fn the_choice_thresholds_hold_at_their_boundaries() {
        let written = PageFacts {
            writes: 1,
            heat: 20,
            threshold: 4,
            ..Default::default()
        };
        // An abort rate of exactly WRITE_ABORT_RATE still tries TPM.
        let at_rate = Chooser {
            write_abort_rate: WRITE_ABORT_RATE,
            ..Chooser::default()
        };
        assert_eq!(
            at_rate.promotion(&written, &tier(500)).1,
            Reason::WrittenTpm
        );
        // Heat threshold + SHADOW_MARGIN is no longer marginal; one less is.
        let at = |heat| PageFacts {
            heat,
            threshold: 4,
            ..Default::default()
        };
        let c = Chooser::default();
        let margin = 4 + SHADOW_MARGIN;
        assert_eq!(c.promotion(&at(margin), &tier(500)).1, Reason::CleanTpm);
        assert_eq!(
            c.promotion(&at(margin - 1), &tier(500)).1,
            Reason::ShadowedTpm
        );
        // A shadow needs more than SHADOW_FREE_FRACTION of the source free:
        // exactly that fraction (50 of 1000 pages) keeps none, one more does.
        let exact = (SHADOW_FREE_FRACTION * 1000.0) as u64;
        assert_eq!(c.promotion(&at(4), &tier(exact)).1, Reason::CleanTpm);
        assert_eq!(c.promotion(&at(4), &tier(exact + 1)).1, Reason::ShadowedTpm);
    }
}
