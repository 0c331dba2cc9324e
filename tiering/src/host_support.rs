//! Test support for host features: the ONE place where a test decides to
//! skip because the host lacks KVM or userfaultfd, and the watchdog that
//! turns a hung test into a failure.
//!
//! - [`require`] checks host features; when one is missing it calls
//!   [`skip_or_fail`], which prints `SKIPPED <test>: <reason>` and lets the
//!   test return, or, with `TIERVM_REQUIRE_KVM=1` (CI on a KVM host), fails
//!   the test. Tests check features with [`require`] *before* constructing
//!   anything, so a construction error is never mistaken for a missing
//!   feature: it fails the test.
//! - [`watchdog`] aborts the test process with a message naming the test
//!   when a test runs longer than its bound (`cargo test` has no per-test
//!   timeout, so a hang would otherwise stall CI).
//!
//! For tests, `TIERVM_TEST_HIDE_KVM=1` makes [`HostFeature::Kvm`] read as
//! missing (to count what skips without KVM on a KVM host).

use std::io::Write as _;
use std::os::unix::fs::FileTypeExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Environment variable: `1` turns every skip for a missing host feature
/// into a test failure.
pub const REQUIRE_KVM_ENV: &str = "TIERVM_REQUIRE_KVM";
/// Environment variable: `1` makes KVM read as missing (for counting skips).
pub const HIDE_KVM_ENV: &str = "TIERVM_TEST_HIDE_KVM";

/// The KVM device's character-device number (misc major 10, minor 232).
const KVM_DEV: (u64, u64) = (10, 232);

/// A host facility a test may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFeature {
    /// `/dev/kvm`, opened read-write.
    Kvm,
    /// userfaultfd usable by this process, with `UFFD_FEATURE_MOVE`
    /// (what tiered memory needs).
    UserfaultfdMove,
}

/// Whether strict mode is on (`TIERVM_REQUIRE_KVM=1`).
pub fn strict() -> bool {
    std::env::var(REQUIRE_KVM_ENV).is_ok_and(|v| v.trim() == "1")
}

/// Why `feature` is missing on this host, or `None` when it is there.
pub fn missing(feature: HostFeature) -> Option<String> {
    match feature {
        HostFeature::Kvm => missing_kvm(std::env::var(HIDE_KVM_ENV).is_ok_and(|v| v.trim() == "1")),
        HostFeature::UserfaultfdMove => {
            let facts = crate::host::userfaultfd();
            if !facts.usable() {
                Some(format!("userfaultfd is not usable here ({facts:?})"))
            } else if !facts.has_move() {
                Some("userfaultfd lacks UFFD_FEATURE_MOVE (Linux >= 6.8 has it)".into())
            } else {
                None
            }
        }
    }
}

fn missing_kvm(hidden: bool) -> Option<String> {
    if hidden {
        return Some(format!("KVM hidden by {HIDE_KVM_ENV}=1"));
    }
    let meta = match std::fs::metadata("/dev/kvm") {
        Ok(m) => m,
        Err(e) => return Some(format!("/dev/kvm: {e}")),
    };
    let rdev = meta.rdev();
    // glibc's major()/minor() encoding.
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
    if !meta.file_type().is_char_device() || (major, minor) != KVM_DEV {
        return Some(format!(
            "/dev/kvm is not the KVM device (device {major}:{minor})"
        ));
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/kvm cannot be opened read-write: {e}")),
    }
}

/// The name of the running test (the test harness names its threads after
/// the tests), or `"test"`.
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("test")
        .to_string()
}

/// A test cannot run here for `reason`: prints `SKIPPED <test>: <reason>`
/// and returns (the caller then returns), or panics in strict mode
/// (`TIERVM_REQUIRE_KVM=1`), which fails the test.
#[track_caller]
pub fn skip_or_fail(reason: &str) {
    skip_with(strict(), reason);
}

#[track_caller]
fn skip_with(strict: bool, reason: &str) {
    let test = test_name();
    if strict {
        panic!("{test}: {reason}; {REQUIRE_KVM_ENV}=1 makes a missing host feature a failure");
    }
    eprintln!("SKIPPED {test}: {reason}");
}

/// `true` when every feature is there; otherwise [`skip_or_fail`] with the
/// first missing one and `false` (the test returns).
#[track_caller]
pub fn require(features: &[HostFeature]) -> bool {
    for f in features {
        if let Some(why) = missing(*f) {
            skip_or_fail(&why);
            return false;
        }
    }
    true
}

/// A running bound on a test; dropping it disarms it.
#[must_use = "the watchdog is disarmed when dropped"]
pub struct Watchdog {
    disarm: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Arms a watchdog for the calling test: after `limit`, the process prints
/// `WATCHDOG: <test> still running after <limit>` and aborts, so a hang
/// fails the run with a message instead of stalling it.
pub fn watchdog(limit: Duration) -> Watchdog {
    let test = test_name();
    let (tx, rx) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("watchdog {test}"))
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                // Straight to fd 2, past the test harness's output capture.
                let _ = writeln!(
                    std::io::stderr(),
                    "WATCHDOG: test {test} still running after {:.0} s: aborting (a hang is a failure)",
                    limit.as_secs_f64()
                );
                std::process::abort();
            }
        })
        .ok();
    Watchdog {
        disarm: Some(tx),
        thread,
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.disarm.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_mode_turns_a_skip_into_a_failure() {
        skip_with(false, "no reason");
        let r = std::panic::catch_unwind(|| skip_with(true, "/dev/kvm: gone"));
        let msg = r.expect_err("strict mode fails the test");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("TIERVM_REQUIRE_KVM=1"), "{msg}");
        assert!(msg.contains("/dev/kvm: gone"), "{msg}");
        assert!(
            msg.contains("strict_mode_turns_a_skip_into_a_failure"),
            "{msg}"
        );
    }

    #[test]
    fn hidden_kvm_reads_as_missing() {
        assert!(missing_kvm(true).is_some_and(|w| w.contains("hidden")));
    }

    #[test]
    fn a_disarmed_watchdog_never_fires() {
        let w = watchdog(Duration::from_millis(50));
        drop(w);
        std::thread::sleep(Duration::from_millis(100));
    }
}
