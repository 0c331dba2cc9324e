//! SIGINT and SIGTERM: the first asks the run to stop (the guest gets the
//! stop request as at the end of `--duration`, the report is written as
//! usual) and the process then exits 128 + the signal number (130, 143); a
//! second one ends the process at once with that code.
//!
//! The handlers (signal-hook) only store to atomics and, for the second
//! signal, call `_exit`: nothing that is not async-signal-safe.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// The handlers could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("installing the SIGINT/SIGTERM handlers")]
pub struct SignalError(#[source] std::io::Error);

type Result<T> = std::result::Result<T, SignalError>;

/// The first stop signal received (0 = none).
static RECEIVED: AtomicUsize = AtomicUsize::new(0);
/// Set by the first signal: the next one exits at once.
static ARMED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// The signals that stop a run.
pub const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Installs the handlers (once per process).
pub fn install() -> Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| {
        for sig in STOP_SIGNALS {
            // Registration order is the order the actions run in: the
            // shutdown checks ARMED before this signal sets it, so only a
            // second signal exits.
            let r = signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, &ARMED)
                .and_then(|_| signal_hook::flag::register_usize(sig, &RECEIVED, sig as usize))
                .and_then(|_| signal_hook::flag::register(sig, &ARMED));
            if let Err(e) = r {
                result = Err(SignalError(e));
                return;
            }
        }
    });
    result
}

/// The stop signal received so far, if any.
pub fn received() -> Option<libc::c_int> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => libc::c_int::try_from(s).ok(),
    }
}

/// The exit code after stopping for `signal`: 128 + its number.
pub fn exit_code(signal: libc::c_int) -> i32 {
    128 + signal
}

/// The name of a stop signal (`SIGINT`, `SIGTERM`).
pub fn name(signal: libc::c_int) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}
