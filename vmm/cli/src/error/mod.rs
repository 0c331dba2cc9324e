//! The `tiervm` error type: every error a subcommand can end with, the
//! process exit code it maps to, and the line the user reads.
//!
//! Every module has its own error enum (Cloud Hypervisor style): a caller
//! can match on the cause, and a cause from below (an ioctl, a file, a
//! parser) travels as the variant's `source`, never flattened into a
//! string. [`Error`] only gathers them. [`Error::describe`] prints the chain
//! as "what failed: why: fix".

use thiserror::Error;

use vmm_core::config::ConfigError;
use vmm_core::emulation::EmulationError;
use vmm_core::image::ImageError;
use vmm_core::permissions::PermissionError;
use vmm_core::runner::RunError;
use vmm_core::tiering_config::TieringConfigError;
use vmm_core::vstate::memory::MemoryError;
use vmm_core::vstate::tiered::TieredRamError;
use vmm_core::vstate::vcpu::VcpuError;
use vmm_core::vstate::vm::VmError;
use vmm_core::workload_args::WorkloadArgError;

pub use vmm_core::exit::{chain, EXIT_GUEST_CRASH, EXIT_HOST, EXIT_USAGE};

mod subcommands;
pub use subcommands::{CompareError, InfoError, NativeError, SimCmdError};

/// Everything that can end a tiervm command early.
#[derive(Debug, Error)]
pub enum Error {
    /// The VM settings are invalid.
    #[error(transparent)]
    Config(ConfigError),
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
    Serve(#[from] vmm_service::ServeError),
    /// Latency emulation could not be set up.
    #[error(transparent)]
    Emulation(#[from] EmulationError),
    /// A seccomp filter could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] vmm_core::seccomp::SeccompError),
    /// The SIGINT/SIGTERM handlers could not be installed.
    #[error(transparent)]
    Signals(#[from] vmm_core::signals::SignalError),
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

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        match e {
            ConfigError::Image(e) => Self::Image(e),
            ConfigError::Tiering(e) => Self::TieringConfig(e),
            e => Self::Config(e),
        }
    }
}

impl From<RunError> for Error {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Image(e) => Self::Image(e),
            RunError::Memory(e) => Self::Memory(e),
            RunError::Permission(e) => Self::Permission(e),
            RunError::Vm(VmError::Tiered(e)) => Self::TieredRam(e),
            RunError::Vm(e) => Self::Vm(e),
            RunError::Vcpu(e) => Self::Vcpu(e),
            RunError::TieredRam(e) => Self::TieredRam(e),
            RunError::Emulation(e) => Self::Emulation(e),
            RunError::Seccomp(e) => Self::Seccomp(e),
        }
    }
}

impl From<vmm_service::vm_process::WorkerError> for Error {
    fn from(e: vmm_service::vm_process::WorkerError) -> Self {
        Self::Serve(e.into())
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
