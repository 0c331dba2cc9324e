//! Fuzzing what a hostile guest controls: the status page it writes and the
//! port I/O it performs (the 16550 console and the port bus). The VMM must
//! never panic, must keep its output bounded (console cap, line length,
//! printable text only) and must decode exactly the clean values an
//! independent reading of the ABI finds. vCPU exit handling (exit and
//! booted ports, MMIO, KVM_RUN errors) is fuzzed in
//! `vmm/core/src/vstate/vcpu_fuzz.rs`.
//!
//! Case counts: `tests/fuzzing/mod.rs` (`TIERVM_FUZZ_CASES`); inputs that
//! once failed: `tests/corpus/status_pages.txt`, `tests/corpus/port_io.txt`.

mod fuzzing;

use std::collections::BTreeMap;
use std::io::Write;

use proptest::prelude::*;
use tiervm_guest::abi::{
    Phase, StatusPage, MAX_METRICS, MAX_VCPUS, METRIC_NAME_LEN, PORT_SERIAL, STATUS_GPA,
    STATUS_SIZE, STATUS_STOP_OFFSET,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_core::devices::serial::{ConsoleWriter, Sink};
use vmm_core::devices::PortBus;
use vmm_core::guest_abi::Wire;
use vmm_core::status::{self, StatusSnapshot};

const PERSIST: &str = regressions!("fuzz_guest_inputs");
const PAGE_BYTES: usize = std::mem::size_of::<StatusPage>();
/// Longest console line the VMM emits (vmm/core/src/devices/serial.rs).
const MAX_LINE: usize = 1024;
const PREFIX: &str = "[guest] ";

// ---------------------------------------------------------------------------
// Status page
// ---------------------------------------------------------------------------

/// Reads a little-endian u64 at `off` of a zero-extended page image.
fn le64(bytes: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = bytes.get(off + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

/// The status page as the ABI defines it, read byte by byte from `bytes`
/// (zero-extended), independently of the VMM's decoder: what a correct
/// decoder must report for `vcpus` vCPUs.
fn oracle(bytes: &[u8], vcpus: u32) -> StatusSnapshot {
    let n = (vcpus as usize).min(MAX_VCPUS);
    let slot = |i: usize, field: usize| le64(bytes, 64 + i * 64 + field * 8);
    let count = le64(bytes, 16).min(MAX_METRICS as u64) as usize;
    let mut metrics = BTreeMap::new();
    let mut rejected = 0;
    for m in 0..count {
        let base = 64 + MAX_VCPUS * 64 + m * 32;
        let name: Vec<u8> = (0..METRIC_NAME_LEN)
            .map(|i| bytes.get(base + i).copied().unwrap_or(0))
            .take_while(|&c| c != 0)
            .collect();
        let value = f64::from_bits(le64(bytes, base + 24));
        let clean = !name.is_empty()
            && name
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(c))
            && value.is_finite();
        if clean {
            metrics.insert(String::from_utf8(name).expect("ascii"), value);
        } else {
            rejected += 1;
        }
    }
    StatusSnapshot {
        ops: (0..n).map(|i| slot(i, 0)).collect(),
        phases: (0..n).map(|i| Phase::from_u64(slot(i, 1))).collect(),
        metrics,
        rejected_metrics: rejected,
    }
}

/// `bytes` (zero-extended or cut to size) as a StatusPage, through the
/// VMM's own wire type (no unsafe here).
fn page_from_bytes(bytes: &[u8]) -> StatusPage {
    let mut page = vec![0u8; PAGE_BYTES];
    let n = bytes.len().min(PAGE_BYTES);
    page[..n].copy_from_slice(&bytes[..n]);
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x4000)]).expect("mmap");
    mem.write_slice(&page, GuestAddress(0)).expect("write");
    let Wire(p) = mem
        .read_obj::<Wire<StatusPage>>(GuestAddress(0))
        .expect("read");
    p
}

/// Decodes `bytes` as a status page both directly and through guest memory
/// (`status::read`), and compares both with the oracle.
fn check_status_page(bytes: &[u8], vcpus: u32) {
    let want = oracle(bytes, vcpus);
    let direct = status::decode(&page_from_bytes(bytes), vcpus);
    assert_eq!(direct, want, "decode disagrees with the ABI reading");
    assert!(direct.ops.len() <= MAX_VCPUS && direct.metrics.len() <= MAX_METRICS);
    assert!(direct.metrics.values().all(|v| v.is_finite()));
    assert_eq!(
        direct.total_ops(),
        direct.ops.iter().fold(0u64, |a, &b| a.saturating_add(b))
    );

    let mem = GuestMemoryMmap::<()>::from_ranges(&[(
        GuestAddress(0),
        (STATUS_GPA + STATUS_SIZE) as usize,
    )])
    .expect("mmap");
    let n = bytes.len().min(PAGE_BYTES);
    mem.write_slice(&bytes[..n], GuestAddress(STATUS_GPA))
        .expect("write");
    assert_eq!(status::read(&mem, vcpus), want, "status::read");
    assert!(status::request_stop(&mem));
    let stop: u64 = mem
        .read_obj(GuestAddress(STATUS_GPA + STATUS_STOP_OFFSET))
        .expect("read");
    assert_eq!(stop, 1);
}

/// A status page a hostile guest might write: structured enough to reach
/// valid metrics, hostile enough to hit every rejection.
fn hostile_page() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        "[A-Za-z0-9_.-]{1,24}".prop_map(String::into_bytes),
        "[ -~]{0,24}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..=24),
    ];
    let value = prop_oneof![
        any::<f64>().prop_map(f64::to_bits),
        any::<u64>(),
        Just(f64::NAN.to_bits()),
        Just(f64::INFINITY.to_bits()),
        Just(f64::NEG_INFINITY.to_bits()),
        Just(0x7ff0_0000_0000_0001), // signalling NaN
    ];
    let count = prop_oneof![0u64..=70, any::<u64>(), Just(u64::MAX)];
    let slot = (
        prop_oneof![any::<u64>(), Just(u64::MAX), 0u64..100],
        prop_oneof![0u64..8, any::<u64>()],
    );
    (
        count,
        proptest::collection::vec(slot, 0..=MAX_VCPUS),
        proptest::collection::vec((name, value), 0..=MAX_METRICS),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(count, slots, metrics, noise)| {
            let mut b = vec![0u8; PAGE_BYTES];
            b[16..24].copy_from_slice(&count.to_le_bytes());
            for (i, (ops, phase)) in slots.iter().enumerate() {
                let o = 64 + i * 64;
                b[o..o + 8].copy_from_slice(&ops.to_le_bytes());
                b[o + 8..o + 16].copy_from_slice(&phase.to_le_bytes());
            }
            for (i, (name, value)) in metrics.iter().enumerate() {
                let o = 64 + MAX_VCPUS * 64 + i * 32;
                b[o..o + name.len()].copy_from_slice(name);
                b[o + 24..o + 32].copy_from_slice(&value.to_le_bytes());
            }
            // Some random bytes anywhere (reserved fields, padding, names).
            for pair in noise.chunks_exact(2) {
                let at = (usize::from(pair[0]) * 97 + usize::from(pair[1]) * 31) % PAGE_BYTES;
                b[at] = pair[1];
            }
            b
        })
}

// ---------------------------------------------------------------------------
// Port I/O
// ---------------------------------------------------------------------------

/// One guest port access: (`out`?, port, data).
type PortOp = (bool, u16, Vec<u8>);

fn port_op() -> impl Strategy<Value = PortOp> {
    (
        any::<bool>(),
        prop_oneof![
            4 => (0u16..8).prop_map(|o| PORT_SERIAL + o),
            1 => any::<u16>(),
        ],
        prop_oneof![
            4 => proptest::collection::vec(any::<u8>(), 1..=1),
            1 => proptest::collection::vec(any::<u8>(), 0..=8),
        ],
    )
}

/// Runs guest port accesses against a bus whose console forwards at most
/// `limit` bytes, and checks the bus's promises.
fn check_port_io(ops: &[PortOp], limit: u64) {
    let sink = Sink::memory();
    let mut bus = PortBus::new(ConsoleWriter::new(sink.clone(), limit));
    let mut outs_to_serial = 0u64;
    for (out, port, data) in ops {
        let serial = (PORT_SERIAL..PORT_SERIAL + 8).contains(port);
        if *out {
            assert_eq!(bus.io_out(*port, data), serial, "port {port:#x} claimed?");
            outs_to_serial += u64::from(serial && !data.is_empty());
        } else {
            let mut d = data.clone();
            assert_eq!(bus.io_in(*port, &mut d), serial, "port {port:#x} claimed?");
            if serial {
                assert!(
                    d.iter().skip(1).all(|&b| b == 0),
                    "in beyond byte 0 is zero: {d:?}"
                );
            }
        }
    }
    bus.flush_console();
    let c = bus.console();
    assert!(
        c.written() <= limit,
        "console cap: {} > {limit}",
        c.written()
    );
    assert!(
        c.written() + c.dropped() <= outs_to_serial,
        "console counted more bytes than the guest sent"
    );
    check_console_text(&sink.contents(), c.written());
}

/// Console output is `[guest] ` lines of printable ASCII (or tab), at most
/// MAX_LINE long, and no more text than was forwarded.
fn check_console_text(text: &str, written: u64) {
    let mut body_bytes = 0u64;
    for line in text.split_inclusive('\n') {
        let body = line
            .strip_prefix(PREFIX)
            .and_then(|l| l.strip_suffix('\n'))
            .unwrap_or_else(|| panic!("malformed console line {line:?}"));
        assert!(body.len() <= MAX_LINE, "line of {} bytes", body.len());
        assert!(
            body.bytes()
                .all(|b| b == b'\t' || (0x20..=0x7e).contains(&b)),
            "unsafe bytes in {body:?}"
        );
        body_bytes += body.len() as u64;
    }
    assert!(
        body_bytes <= written,
        "{body_bytes} bytes shown, {written} forwarded"
    );
}

/// Writes `chunks` straight into a console writer: exactly `limit` bytes
/// are forwarded, the rest counted as dropped.
fn check_console_writer(chunks: &[Vec<u8>], limit: u64) {
    let sink = Sink::memory();
    let mut w = ConsoleWriter::new(sink.clone(), limit);
    let mut total = 0u64;
    for c in chunks {
        assert_eq!(w.write(c).expect("console write"), c.len());
        total += c.len() as u64;
    }
    w.flush_line();
    assert_eq!(w.written(), total.min(limit));
    assert_eq!(w.dropped(), total - total.min(limit));
    check_console_text(&sink.contents(), w.written());
}

// ---------------------------------------------------------------------------
// Corpus replay
// ---------------------------------------------------------------------------

/// `tests/corpus/status_pages.txt`: `VCPUS HEX...` per line (the page's first
/// bytes; the rest is zero).
#[test]
fn corpus_of_status_pages_replays() {
    let inputs = fuzzing::corpus("status_pages");
    for line in &inputs {
        let text = String::from_utf8_lossy(line);
        let (vcpus, hex) = text.split_once(' ').unwrap_or((&text, ""));
        check_status_page(
            &fuzzing::hex_bytes(hex.as_bytes()),
            vcpus.parse().expect("vcpus"),
        );
    }
    eprintln!("replayed {} status pages", inputs.len());
}

/// `tests/corpus/port_io.txt`: `LIMIT op op ...` per line, each op
/// `o:PORT:HEX` or `i:PORT:HEX` (port in hex).
#[test]
fn corpus_of_port_io_replays() {
    let inputs = fuzzing::corpus("port_io");
    for line in &inputs {
        let text = String::from_utf8_lossy(line);
        let mut words = text.split_whitespace();
        let limit: u64 = words.next().expect("limit").parse().expect("limit");
        let ops: Vec<PortOp> = words
            .map(|w| {
                let mut f = w.splitn(3, ':');
                let dir = f.next().expect("dir");
                let port = u16::from_str_radix(f.next().expect("port"), 16).expect("port");
                let data = fuzzing::hex_bytes(f.next().unwrap_or("").as_bytes());
                (dir == "o", port, data)
            })
            .collect();
        check_port_io(&ops, limit);
        let chunks: Vec<Vec<u8>> = ops.into_iter().map(|o| o.2).collect();
        check_console_writer(&chunks, limit);
    }
    eprintln!("replayed {} port-I/O sequences", inputs.len());
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(fuzzing::config(3000, PERSIST))]

    /// Structured hostile status pages decode to exactly the clean values.
    #[test]
    fn hostile_status_pages_decode_to_the_abi_reading(page in hostile_page(), vcpus in prop_oneof![1u32..=64, any::<u32>()]) {
        check_status_page(&page, vcpus);
    }

    /// Raw random bytes (any length) as a status page.
    #[test]
    fn random_status_bytes_decode_safely(bytes in proptest::collection::vec(any::<u8>(), 0..PAGE_BYTES + 64), vcpus in any::<u32>()) {
        check_status_page(&bytes, vcpus);
    }

    /// Random port I/O sequences keep the console bounded and clean.
    #[test]
    fn port_io_is_contained(ops in proptest::collection::vec(port_op(), 0..400), limit in prop_oneof![0u64..64, 0u64..4096, Just(1u64 << 20)]) {
        check_port_io(&ops, limit);
    }

    /// A console flood (long lines, control bytes, escapes) is capped exactly.
    #[test]
    fn console_floods_are_capped(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 0..8), limit in prop_oneof![0u64..16, 0u64..10_000]) {
        check_console_writer(&chunks, limit);
    }
}
