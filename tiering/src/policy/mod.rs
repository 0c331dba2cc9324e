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
//! [`colloid`], [`mtm`]. Constants and their sources: `docs/policies.md`.

pub mod colloid;
pub mod hotness;
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

pub use types::*;

/// Errors from policy construction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The name matches no policy.
    #[error("unknown policy `{name}`; valid policies: {}", NAMES.join(", "))]
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// The configuration cannot be used.
    #[error("invalid policy configuration: {0}")]
    InvalidConfig(String),
}

/// Names accepted by [`by_name`], in the order tables list them.
pub const NAMES: &[&str] = &["static", "tpp", "nomad", "memtis", "colloid", "mtm"];

/// A placement policy. See the module docs.
pub trait Policy: Send {
    /// The policy's name (one of [`NAMES`]).
    fn name(&self) -> &'static str;

    /// The trackers this policy needs.
    fn trackers(&self) -> TrackerRequest;

    /// How often [`Policy::tick`] should run.
    fn tick_interval_ns(&self) -> u64;

    /// A hint fault on a protected page. Returning a migration with
    /// [`Urgency::BeforeFaultingAccessResumes`] asks the engine to move the
    /// page before the faulting access continues. The returned migration's
    /// destination must have a free page (see `TierStatus::free_pages` in
    /// `tiers`).
    fn on_hint_fault(
        &mut self,
        fault: &HintFault,
        tiers: &[TierStatus],
        view: &mut dyn MemoryView,
    ) -> Option<Migration>;

    /// Periodic decision point.
    fn tick(&mut self, obs: &Observations<'_>, view: &mut dyn MemoryView) -> Decisions;

    /// Hotness state, for handing over to another policy at run time.
    fn export_state(&self) -> PolicyState;

    /// Seeds this policy's hotness state from another policy's export.
    fn import_state(&mut self, state: &PolicyState);
}

/// Builds the policy called `name` (see [`NAMES`]).
pub fn by_name(name: &str, config: &PolicyConfig) -> Result<Box<dyn Policy>, Error> {
    if config.pages == 0 || config.tier_capacity_pages.is_empty() {
        return Err(Error::InvalidConfig(
            "need at least one page and one tier (set pages and tier_capacity_pages)".into(),
        ));
    }
    if config.tier_capacity_pages.len() > usize::from(TierId::MAX) {
        return Err(Error::InvalidConfig(
            "at most 255 tiers are supported".into(),
        ));
    }
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "static" | "none" | "no-migration" => Box::new(static_placement::Static::new(config)),
        "tpp" => Box::new(tpp::Tpp::new(config)),
        "tpp-lru" => Box::new(tpp::Tpp::with_active_lru_check(config)),
        "nomad" => Box::new(nomad::Nomad::new(config)),
        "memtis" => Box::new(memtis::Memtis::new(config, memtis::COOLING_PERIOD_SAMPLES)),
        "memtis-quickcool" => Box::new(memtis::Memtis::new(
            config,
            memtis::QUICK_COOL_PERIOD_SAMPLES,
        )),
        "colloid" => Box::new(colloid::Colloid::new(config)),
        "colloid-base" => Box::new(colloid::Colloid::base(config)),
        "mtm" => Box::new(mtm::Mtm::new(config)),
        _ => {
            return Err(Error::UnknownPolicy {
                name: name.to_string(),
            })
        }
    })
}

/// Builds `name` and seeds it with `state` exported from the policy in use.
pub fn switch_to(
    name: &str,
    config: &PolicyConfig,
    state: &PolicyState,
) -> Result<Box<dyn Policy>, Error> {
    let mut p = by_name(name, config)?;
    p.import_state(state);
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_name_lists_valid_names_on_error() {
        let cfg = PolicyConfig::new(16, vec![8, 16]);
        let err = by_name("lru", &cfg).err().expect("unknown name must fail");
        let msg = err.to_string();
        for n in NAMES {
            assert!(msg.contains(n), "{msg}");
        }
        for n in NAMES {
            assert_eq!(by_name(n, &cfg).map(|p| p.name()).ok(), Some(*n));
        }
        assert!(by_name("tpp", &PolicyConfig::new(0, vec![1])).is_err());
    }
}
