//! How a run ends for the process: the exit codes (a finished run's report
//! maps to one with [`crate::report::code_of`]), and an error chain as the
//! one line the user reads ("what failed: why: fix"). The binary's error type and the service's VM
//! process both use these, so both exit and describe a failure alike.

use std::error::Error as StdError;

/// Exit code for bad user input (flags, images, arguments).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the guest crashed (triple fault, internal error).
pub const EXIT_GUEST_CRASH: i32 = 3;
/// Exit code for host-side failures (KVM or system calls failing).
pub const EXIT_HOST: i32 = 1;

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

/// [`chain`] followed by the fix, when there is one.
pub fn describe(err: &(dyn StdError + 'static), fix: Option<&str>) -> String {
    let mut line = chain(err);
    if let Some(fix) = fix {
        line.push_str(": ");
        line.push_str(fix);
    }
    line
}
