//! The domain vocabulary shared by the memory layer, the policies, the live
//! engine, the simulator and the CLI: one name for one thing.
//!
//! - a **guest page** is a 4 KiB guest-physical page, named by its index from
//!   the start of guest RAM (its guest frame number);
//! - a **tier** ([`TierId`]) is a host memory tier, 0 the fastest;
//! - a **unit** ([`Unit`]) is what one migration moves: one guest page or an
//!   aligned 2 MiB run of 512;
//! - a **mechanism** ([`Mechanism`]) is how a unit is moved.
//!
//! The memory layer has one more index, the **host slot** (`mem::Slot`): a
//! page-sized place in a tier's pool area. It is a newtype so that a slot and
//! a guest page cannot be mixed up.

use serde::{Deserialize, Serialize};

/// Index of a memory tier: 0 is the fastest (the *default* tier), higher is slower.
pub type TierId = u8;

/// Most tiers one VM can use (3 bits of the page map word).
pub const MAX_TIERS: usize = 8;

/// Bytes in one page, a guest page and the host base page that backs it alike:
/// the guest ABI's 4 KiB [`tiervm_guest::abi::PAGE_SIZE`], the one page size
/// the memory layer, the policies, the simulator and the VMM import.
pub const PAGE_SIZE: usize = tiervm_guest::abi::PAGE_SIZE as usize;
/// Bytes in a transparent huge page (PMD size on x86_64): the guest's large
/// page, [`tiervm_guest::abi::GUEST_LARGE_PAGE`].
pub const HUGE_PAGE_SIZE: usize = tiervm_guest::abi::GUEST_LARGE_PAGE as usize;
/// Pages in a 2 MiB run.
pub const PAGES_PER_2M: u32 = (HUGE_PAGE_SIZE / PAGE_SIZE) as u32;

/// A run of guest pages: `pages` pages starting at guest page `page`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Unit {
    /// First guest page (guest-physical address / 4096).
    pub page: u64,
    /// Number of pages (1..=512).
    pub pages: u32,
}

impl Unit {
    /// A single 4 KiB page.
    pub fn page(page: u64) -> Self {
        Self { page, pages: 1 }
    }
    /// A run of `pages` pages from `page`.
    pub fn run(page: u64, pages: u32) -> Self {
        Self { page, pages }
    }
    /// The aligned 2 MiB run that contains `page`.
    pub fn huge_containing(page: u64) -> Self {
        let p = u64::from(PAGES_PER_2M);
        Self {
            page: page / p * p,
            pages: PAGES_PER_2M,
        }
    }
    /// Whether this is a whole, aligned 2 MiB run.
    pub fn is_huge(&self) -> bool {
        self.pages == PAGES_PER_2M && self.page.is_multiple_of(u64::from(PAGES_PER_2M))
    }
    /// One past the last page.
    pub fn end(&self) -> u64 {
        self.page.saturating_add(u64::from(self.pages))
    }
}

/// How a migration is carried out (the mechanisms live in `tiering::mem`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mechanism {
    /// Nomad's transactional migration: copy while mapped, commit only if
    /// the page was not written during the copy, else abort and keep it.
    /// `keep_shadow`: on commit, keep the source copy as a shadow.
    Transactional {
        /// Keep the source page as a shadow after commit (non-exclusive tiering).
        keep_shadow: bool,
    },
    /// Unmap, copy, remap (Linux `migrate_pages`). Always succeeds if the
    /// destination has room.
    StopAndCopy,
    /// Demote a page by remapping it to its shadow in the destination tier
    /// (no copy). If the shadow was lost (page written), the mechanism falls
    /// back to stop-and-copy.
    ShadowDemotion,
    /// The kernel's own `move_pages(2)` (exclusive; on a one-node host the
    /// node is already right and only the tier bookkeeping changes).
    KernelMovePages,
}

impl Mechanism {
    /// Nomad's TPM with shadows (the default of `--mechanism tpm`).
    pub const TPM: Mechanism = Mechanism::Transactional { keep_shadow: true };

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Transactional { keep_shadow: true } => "tpm",
            Mechanism::Transactional { keep_shadow: false } => "tpm-exclusive",
            Mechanism::StopAndCopy => "stop-copy",
            Mechanism::ShadowDemotion => "shadow-demotion",
            Mechanism::KernelMovePages => "move-pages",
        }
    }
}

/// A mechanism name tiervm does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mechanism '{0}': use tpm, tpm-exclusive, stop-copy or move-pages")]
pub struct UnknownMechanism(pub String);

impl std::str::FromStr for Mechanism {
    type Err = UnknownMechanism;
    /// Parses `tpm`, `tpm-exclusive`, `stop-copy` or `move-pages`.
    fn from_str(s: &str) -> Result<Self, UnknownMechanism> {
        match s {
            "tpm" | "transactional" => Ok(Mechanism::TPM),
            "tpm-exclusive" => Ok(Mechanism::Transactional { keep_shadow: false }),
            "stop-copy" | "stop-and-copy" => Ok(Mechanism::StopAndCopy),
            "move-pages" => Ok(Mechanism::KernelMovePages),
            _ => Err(UnknownMechanism(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_names_round_trip() {
        for m in [
            Mechanism::TPM,
            Mechanism::Transactional { keep_shadow: false },
            Mechanism::StopAndCopy,
            Mechanism::KernelMovePages,
        ] {
            assert_eq!(m.name().parse::<Mechanism>(), Ok(m));
        }
        assert!("x".parse::<Mechanism>().is_err());
    }

    #[test]
    fn huge_units() {
        assert_eq!(Unit::huge_containing(1000), Unit::run(512, 512));
        assert!(Unit::run(1024, 512).is_huge());
        assert!(!Unit::run(1000, 512).is_huge());
        assert_eq!(Unit::run(u64::MAX, 2).end(), u64::MAX);
    }
}
