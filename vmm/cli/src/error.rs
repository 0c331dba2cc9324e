//! The VMM's error type, the process exit codes it maps to, and the one
//! place that turns an error chain into the line the user reads.
//!
//! Every module has its own error enum (Cloud Hypervisor style): a caller
//! can match on the cause, and a cause from below (an ioctl, a file, a
//! parser) travels as the variant's `source`, never flattened into a
//! string. [`Error`] only gathers them. [`Error::describe`] prints the chain
//! as "what failed: why: fix".

use std::error::Error as StdError;

use thiserror::Error;

use crate::commands::compare::CompareError;
use crate::commands::info::InfoError;
use crate::commands::native::NativeError;
use crate::commands::sim::SimCmdError;
use crate::config::{ConfigError, WorkloadArgError};
use crate::emulation::EmulationError;
use crate::image::ImageError;
use crate::permissions::PermissionError;
use crate::tiering_config::TieringConfigError;
use crate::vstate::memory::MemoryError;
use crate::vstate::tiered::TieredRamError;
use crate::vstate::vcpu::VcpuError;
use crate::vstate::vm::VmError;

/// Exit code for bad user input (flags, images, arguments).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the guest crashed (triple fault, internal error).
pub const EXIT_GUEST_CRASH: i32 = 3;
/// Exit code for host-side failures (KVM or system calls failing).
pub const EXIT_HOST: i32 = 1;

/// Everything that can end a tiervm command early.
#[derive(Debug, Error)]
pub enum Error {
    /// The VM settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The tiering settings are invalid.
    #[error(transparent)]
    TieringConfig(#[from] TieringConfigError),
    /// The guest image cannot be used.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Guest memory could not be set up or written.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// This process lacks a host permission the run needs.
    #[error(transparent)]
    Permission(#[from] PermissionError),
    /// KVM or the VM failed.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// A vCPU could not be set up or failed while running.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// Tiered guest RAM or one of its threads failed.
    #[error(transparent)]
    TieredRam(#[from] TieredRamError),
    /// `tiervm compare` failed.
    #[error(transparent)]
    Compare(#[from] CompareError),
    /// `tiervm native` failed.
    #[error(transparent)]
    Native(#[from] NativeError),
    /// `tiervm sim` failed.
    #[error(transparent)]
    Sim(#[from] SimCmdError),
    /// `tiervm info` failed.
    #[error(transparent)]
    Info(#[from] InfoError),
    /// A report could not be encoded or written.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// `tiervm serve`, its worker mode or `tiervm ctl` failed.
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    /// Latency emulation could not be set up.
    #[error(transparent)]
    Emulation(#[from] EmulationError),
    /// A seccomp filter could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    /// The SIGINT/SIGTERM handlers could not be installed.
    #[error(transparent)]
    Signals(#[from] crate::signals::SignalError),
}

/// Writing a result (report, JSON, file) failed.
#[derive(Debug, Error)]
pub enum OutputError {
    /// Serializing to JSON failed.
    #[error("encoding {what}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The serializer's reason.
        #[source]
        source: serde_json::Error,
    },
    /// Writing to stdout failed (a reader that went away is not a failure).
    #[error("writing the output to stdout failed")]
    Write(#[source] std::io::Error),
}

impl From<WorkloadArgError> for Error {
    fn from(e: WorkloadArgError) -> Self {
        Self::Config(ConfigError::Arg(e))
    }
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        let usage = match self {
            Self::Config(_) | Self::TieringConfig(_) | Self::Image(_) | Self::Sim(_) => true,
            Self::Memory(e) => e.is_usage(),
            Self::TieredRam(e) => e.is_usage(),
            Self::Compare(e) => return e.exit_code(),
            Self::Native(e) => e.is_usage(),
            Self::Vm(e) => e.is_usage(),
            Self::Serve(e) => e.is_usage(),
            Self::Emulation(e) => matches!(e, EmulationError::TooLarge { .. }),
            Self::Permission(_) | Self::Vcpu(_) | Self::Info(_) | Self::Output(_) => false,
            Self::Seccomp(_) | Self::Signals(_) => false,
        };
        if usage {
            EXIT_USAGE
        } else {
            EXIT_HOST
        }
    }

    /// What the user can do about it, when the fix does not already end
    /// the message (errors whose cause comes from below name the fix after
    /// the cause).
    pub fn fix(&self) -> Option<&'static str> {
        match self {
            Self::Image(e) => e.fix(),
            Self::Vm(e) => e.fix(),
            Self::Compare(CompareError::Policy { source, .. }) => source.fix(),
            Self::Output(OutputError::Write(_)) => {
                Some("free space where stdout goes or redirect it elsewhere")
            }
            Self::Seccomp(_) => Some("run with --no-seccomp to go on without (debugging only)"),
            _ => None,
        }
    }

    /// The one line the user reads: "what failed: why: fix", from the
    /// chain of sources.
    pub fn describe(&self) -> String {
        let mut line = chain(self);
        if let Some(fix) = self.fix() {
            line.push_str(": ");
            line.push_str(fix);
        }
        line
    }
}

/// `err` and each of its sources, joined with ": ".
pub fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut line = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let msg = cause.to_string();
        if !msg.is_empty() {
            line.push_str(": ");
            line.push_str(&msg);
        }
        next = cause.source();
    }
    line
}

/// Result alias of the VMM.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_walks_the_chain_and_ends_with_the_fix() {
        let e = Error::Vm(VmError::OpenKvm(vmm_sys_util::errno::Error::new(
            libc::EACCES,
        )));
        let line = e.describe();
        assert!(
            line.starts_with("cannot open /dev/kvm: Permission denied"),
            "{line}"
        );
        assert!(
            line.ends_with("(`tiervm info` shows what this host offers)"),
            "{line}"
        );
        assert_eq!(e.exit_code(), EXIT_HOST);
    }
}
