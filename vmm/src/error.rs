//! Errors of the VMM and the process exit codes they map to.

use thiserror::Error;

/// Exit code for bad user input (flags, images, arguments).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the guest crashed (triple fault, internal error).
pub const EXIT_GUEST_CRASH: i32 = 3;
/// Exit code for host-side failures (KVM or system calls failing).
pub const EXIT_HOST: i32 = 1;

/// Everything that can end a tiervm command early.
#[derive(Debug, Error)]
pub enum Error {
    /// The user asked for something invalid; the message names the fix.
    #[error("{0}")]
    Usage(String),
    /// The guest image cannot be used; the message names the problem.
    #[error("{0}")]
    Image(String),
    /// The guest crashed; the message carries the vCPU state.
    #[error("guest crashed: {0}")]
    GuestCrash(String),
    /// A host facility (KVM, memory, threads) failed.
    #[error("{0}")]
    Host(String),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Usage(_) | Self::Image(_) => EXIT_USAGE,
            Self::GuestCrash(_) => EXIT_GUEST_CRASH,
            Self::Host(_) => EXIT_HOST,
        }
    }

    /// A host error with context.
    pub fn host(what: &str, err: impl std::fmt::Display) -> Self {
        Self::Host(format!("{what}: {err}"))
    }
}

/// Result alias of the VMM.
pub type Result<T> = std::result::Result<T, Error>;
