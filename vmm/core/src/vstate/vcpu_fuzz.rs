//! Fuzzing the vCPU exit handler with what a hostile guest can cause: port
//! I/O of any size to any port (the exit and booted ports included), MMIO
//! reads and writes anywhere, and the KVM_RUN errors the host can return.
//! The handler must never panic, must fill every byte the guest will read,
//! and must decode the exit port exactly (little-endian, zero-extended).
//!
//! Cases: `TIERVM_FUZZ_CASES` (default 3000), like the suites in `tests/`.
//! Regressions are persisted to `tests/corpus/proptest-regressions/vcpu_exits.txt`.

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

use super::*;
use crate::devices::serial::{ConsoleWriter, Sink};
use tiervm_guest::abi::PORT_SERIAL;

fn config() -> Config {
    let cases = std::env::var("TIERVM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(3000);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/corpus/proptest-regressions/vcpu_exits.txt"
        )))),
        ..Config::default()
    }
}

fn shared() -> VcpuShared {
    VcpuShared::new(PortBus::new(ConsoleWriter::new(Sink::memory(), 4096)))
}

/// One thing a vCPU exit can carry.
#[derive(Clone, Debug)]
enum Exit {
    Out(u16, Vec<u8>),
    In(u16, usize),
    MmioRead(u64, usize),
    MmioWrite(u64, Vec<u8>),
    Hlt,
    Shutdown,
    Intr,
    Errno(i32),
}

fn exit() -> impl Strategy<Value = Exit> {
    let port = prop_oneof![
        Just(PORT_EXIT),
        Just(PORT_BOOTED),
        (0x3f8u16..0x400),
        any::<u16>()
    ];
    prop_oneof![
        4 => (port.clone(), proptest::collection::vec(any::<u8>(), 0..=8)).prop_map(|(p, d)| Exit::Out(p, d)),
        2 => (port, 0usize..=8).prop_map(|(p, n)| Exit::In(p, n)),
        1 => (any::<u64>(), 0usize..=16).prop_map(|(a, n)| Exit::MmioRead(a, n)),
        1 => (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..=16)).prop_map(|(a, d)| Exit::MmioWrite(a, d)),
        1 => Just(Exit::Hlt),
        1 => Just(Exit::Shutdown),
        1 => Just(Exit::Intr),
        1 => prop_oneof![Just(libc::EINTR), Just(libc::EAGAIN), Just(libc::EFAULT), 1i32..200].prop_map(Exit::Errno),
    ]
}

/// Feeds one exit to `handle_exit` and checks the result.
fn check(e: &Exit, sh: &VcpuShared) -> std::result::Result<Step, TestCaseError> {
    let step = match e {
        Exit::Out(port, data) => check_out(*port, data, sh)?,
        Exit::In(port, n) => check_in(*port, *n, sh)?,
        Exit::MmioRead(addr, n) => {
            let mut data = vec![0x5a; *n];
            let step = handle_exit(Ok(VcpuExit::MmioRead(*addr, &mut data)), sh);
            prop_assert_eq!(&step, &Step::Continue);
            prop_assert!(data.iter().all(|&b| b == 0xff));
            step
        }
        Exit::MmioWrite(addr, data) => {
            let step = handle_exit(Ok(VcpuExit::MmioWrite(*addr, data)), sh);
            prop_assert_eq!(&step, &Step::Continue);
            step
        }
        Exit::Hlt => {
            let step = handle_exit(Ok(VcpuExit::Hlt), sh);
            prop_assert!(
                matches!(&step, Step::Crash(m) if m.contains("0x501")),
                "{:?}",
                step
            );
            step
        }
        Exit::Shutdown => {
            let step = handle_exit(Ok(VcpuExit::Shutdown), sh);
            prop_assert!(
                matches!(&step, Step::Crash(m) if m.contains("triple fault")),
                "{:?}",
                step
            );
            step
        }
        Exit::Intr => {
            let step = handle_exit(Ok(VcpuExit::Intr), sh);
            prop_assert_eq!(&step, &Step::Continue);
            step
        }
        Exit::Errno(errno) => check_errno(*errno, sh)?,
    };
    Ok(step)
}

/// An OUT of `data` to `port`: the exit port ends the run with its code,
/// the boot port records the boot, any other port continues (counted as
/// unhandled unless the serial port claims it).
fn check_out(port: u16, data: &[u8], sh: &VcpuShared) -> std::result::Result<Step, TestCaseError> {
    let unhandled = sh.unhandled_io.load(Ordering::Relaxed);
    let step = handle_exit(Ok(VcpuExit::IoOut(port, data)), sh);
    match port {
        PORT_EXIT => {
            let mut b = [0u8; 4];
            let n = data.len().min(4);
            b[..n].copy_from_slice(&data[..n]);
            prop_assert_eq!(&step, &Step::Exited(u32::from_le_bytes(b)));
        }
        PORT_BOOTED => {
            prop_assert_eq!(&step, &Step::Continue);
            prop_assert!(sh.booted_at.get().is_some());
        }
        p => {
            prop_assert_eq!(&step, &Step::Continue);
            let claimed = (PORT_SERIAL..PORT_SERIAL + 8).contains(&p);
            prop_assert_eq!(
                sh.unhandled_io.load(Ordering::Relaxed),
                unhandled + u64::from(!claimed)
            );
        }
    }
    Ok(step)
}

/// An IN of `n` bytes from `port`: every byte the guest reads is written.
fn check_in(port: u16, n: usize, sh: &VcpuShared) -> std::result::Result<Step, TestCaseError> {
    // Poison the buffer: every byte the guest reads must be written.
    let mut data = vec![0x5a; n];
    let step = handle_exit(Ok(VcpuExit::IoIn(port, &mut data)), sh);
    prop_assert_eq!(&step, &Step::Continue);
    let claimed = (PORT_SERIAL..PORT_SERIAL + 8).contains(&port);
    if claimed {
        prop_assert!(data.iter().skip(1).all(|&b| b == 0), "{:?}", data);
    } else {
        prop_assert!(data.iter().all(|&b| b == 0xff), "{:?}", data);
    }
    Ok(step)
}

/// A failed KVM_RUN with `errno`: interrupted runs continue, EFAULT is a
/// guest crash, anything else a host error.
fn check_errno(errno: i32, sh: &VcpuShared) -> std::result::Result<Step, TestCaseError> {
    let step = handle_exit(Err(vmm_sys_util::errno::Error::new(errno)), sh);
    match errno {
        libc::EINTR | libc::EAGAIN => prop_assert_eq!(&step, &Step::Continue),
        libc::EFAULT => prop_assert!(matches!(step, Step::Crash(_)), "{:?}", step),
        _ => prop_assert!(matches!(step, Step::HostError(_)), "{:?}", step),
    }
    Ok(step)
}

proptest! {
    #![proptest_config(config())]

    /// Sequences of hostile exits: the handler's answer is the documented
    /// one for every exit, and the console stays within its cap.
    #[test]
    fn hostile_exits_are_handled(exits in proptest::collection::vec(exit(), 1..200)) {
        let sh = shared();
        for e in &exits {
            check(e, &sh)?;
        }
        let ports = lock(&sh.ports);
        prop_assert!(ports.console().written() <= 4096);
    }
}
