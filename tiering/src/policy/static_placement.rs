//! `static`: pages stay where they were first placed (the "no migration"
//! baseline of Nomad §4 and MTM's first-touch).

use super::types::*;
use super::{Policy, PolicyKind};

/// Tick interval (nothing happens at a tick; one second keeps engines idle).
pub const TICK_INTERVAL_NS: u64 = 1_000_000_000;

/// Never migrates.
#[derive(Clone, Debug, Default)]
pub struct Static;

impl Static {
    /// The policy (the configuration is not needed).
    pub fn new(_config: &PolicyConfig) -> Self {
        Self
    }
}

impl Policy for Static {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Static
    }
    fn trackers(&self) -> TrackerRequest {
        TrackerRequest::none()
    }
    fn tick_interval_ns(&self) -> u64 {
        TICK_INTERVAL_NS
    }
    fn tick(&mut self, _: &Observations<'_>, _: &mut dyn MemoryView) -> Decisions {
        Decisions::none()
    }
    fn export_state(&self) -> PolicyState {
        PolicyState {
            from: PolicyKind::Static,
            ..PolicyState::default()
        }
    }
    fn import_state(&mut self, _: &PolicyState) {}
}
