//! Placement policies as pure code: observations in, decisions out.
//!
//! A [`Policy`] never does I/O and never touches KVM. The engine that runs
//! it (live: `tiering::mem` plus the VMM; modeled: [`crate::sim`]) feeds it
//! hint faults one by one ([`Policy::on_hint_fault`], which may ask for a
//! migration before the faulting access resumes) and, every
//! [`Policy::tick_interval_ns`], the tick's [`Observations`]
//! ([`Policy::tick`]), and carries out the [`Decisions`] it returns.
//! Everything is deterministic: the same observations give the same decisions.
//!
//! Policies: [`static_placement`] (`static`), [`tpp`], [`nomad`], [`memtis`],
//! [`colloid`], [`mtm`], [`adaptive`], named by [`PolicyKind`]. Constants and their
//! sources: `docs/policies.md`.

pub mod adaptive;
pub mod colloid;
pub mod hotness;
pub mod kind;
pub mod memtis;
pub mod mtm;
pub mod nomad;
pub mod static_placement;
pub mod tpp;
pub mod types;

#[cfg(test)]
mod proptests;
#[cfg(test)]
pub(crate) mod testutil;

pub use kind::{IntervalKind, PolicyKind};
pub use types::*;

/// Errors from naming or building a policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// The name matches no policy.
    #[error("unknown policy `{name}`; valid policies: {} (variants: {})", PolicyKind::names(&PolicyKind::POLICIES), PolicyKind::names(&PolicyKind::VARIANTS))]
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// The memory to place is empty.
    #[error("invalid policy configuration: need at least one page and one tier (set pages and tier_capacity_pages)")]
    NoPagesOrTiers,
    /// More tiers than a [`TierId`] can name.
    #[error("invalid policy configuration: {tiers} tiers given, at most 255 are supported")]
    TooManyTiers {
        /// Tiers given.
        tiers: usize,
    },
}

/// A placement policy. See the module docs.
pub trait Policy: Send {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;

    /// The trackers this policy needs.
    fn trackers(&self) -> TrackerRequest;

    /// How often [`Policy::tick`] should run.
    fn tick_interval_ns(&self) -> u64;

    /// A hint fault on a protected page. Returning a migration with
    /// [`Urgency::BeforeFaultingAccessResumes`] asks the engine to move the
    /// page before the faulting access continues. The returned migration's
    /// destination must have a free page (see `TierStatus::free_pages` in
    /// `tiers`). Policies that ask for no hint faults keep the default:
    /// no migration.
    fn on_hint_fault(
        &mut self,
        _fault: &HintFault,
        _tiers: &[TierStatus],
        _view: &mut dyn MemoryView,
    ) -> Option<Migration> {
        None
    }

    /// Whether the hint fault [`Policy::on_hint_fault`] just handled, which
    /// returned no migration, left the page protected, so that the same
    /// access faults again at once. The TPP patch's 5.13 `do_numa_page`
    /// does this for an inactive slow page (`goto out` skips `out_map`,
    /// which alone makes the PTE present again); `tpp-lru` models it and
    /// the simulator honours it (the live engine maps the page back).
    /// Reading it clears it. Default: no, the fault maps the page back.
    fn take_refault(&mut self) -> bool {
        false
    }

    /// Periodic decision point.
    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions;

    /// Hotness state, for handing over to another policy at run time.
    fn export_state(&self) -> PolicyState;

    /// Seeds this policy's hotness state from another policy's export.
    fn import_state(&mut self, state: &PolicyState);

    /// The mode the policy is in and why, if it has modes.
    fn mode(&self) -> Option<PolicyMode> {
        None
    }

    /// Whether the policy needs access samples now (the live engine holds
    /// hint-fault sampling while it does not, so the guest pays nothing for
    /// tracking nobody reads).
    fn wants_samples(&self) -> bool {
        true
    }
}

/// Builds `kind` and seeds it with `state` exported from the policy in use.
pub fn switch_to(
    kind: PolicyKind,
    config: &PolicyConfig,
    state: &PolicyState,
) -> Result<Box<dyn Policy>, PolicyError> {
    let mut p = kind.build(config)?;
    p.import_state(state);
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_valid_names() {
        let err = "lru"
            .parse::<PolicyKind>()
            .expect_err("unknown name must fail");
        let msg = err.to_string();
        for k in PolicyKind::ALL {
            assert!(msg.contains(k.name()), "{msg}");
        }
        assert_eq!(
            PolicyKind::Tpp.build(&PolicyConfig::new(0, vec![1])).err(),
            Some(PolicyError::NoPagesOrTiers)
        );
    }

    #[test]
    fn switching_hands_hotness_over() {
        use testutil::{obs, VecView};
        let cfg = PolicyConfig::new(100, vec![20, 100]);
        let mut v = VecView::two_tier(100, 10);
        let caps = [20, 100];
        let st = v.status(&caps);
        // Memtis learns that slow page 70 is hot and 30 other slow pages are warm.
        let mut memtis = PolicyKind::Memtis.build(&cfg).unwrap();
        let mut samples: Vec<AccessSample> = (0..6)
            .map(|_| AccessSample {
                page: 70,
                tier: 1,
                write: false,
            })
            .collect();
        samples.extend((30..60).map(|page| AccessSample {
            page,
            tier: 1,
            write: false,
        }));
        memtis.tick(&obs(1, &st, &samples), &mut v);
        let state = memtis.export_state();
        assert_eq!(state.hot_pages.first().map(|h| h.0), Some(70));
        // Colloid built from that state promotes page 70 at its first quantum
        // (no samples of its own): the default tier is faster, so it packs it.
        let mut colloid = switch_to(PolicyKind::Colloid, &cfg, &state).unwrap();
        let mut st2 = v.status(&caps);
        st2[0].loaded_latency_ns = Some(80.0);
        st2[1].loaded_latency_ns = Some(140.0);
        st2[0].request_rate = Some(1e8);
        st2[1].request_rate = Some(1e8);
        let d = colloid.tick(&obs(2, &st2, &[]), &mut v);
        assert!(
            d.migrations.iter().any(|m| m.unit.page == 70 && m.to == 0),
            "{d:?}"
        );
        // A fresh Colloid knows nothing and moves nothing.
        let mut fresh = PolicyKind::Colloid.build(&cfg).unwrap();
        assert!(fresh.tick(&obs(2, &st2, &[]), &mut v).migrations.is_empty());
    }
}
