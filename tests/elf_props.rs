//! Property tests of the ELF validator against the loader: one parser
//! decides. For random, corrupted and truncated ELF files:
//!
//! - the validator never panics, and each rejection is one clear line;
//! - whatever the validator accepts, the loader (linux-loader) loads exactly
//!   the segments the validator saw, at the same addresses, and touches no
//!   other byte of guest RAM (checked against a sentinel fill).
//!
//! `tests/corpus/elf/` holds inputs that once broke this (each must now be
//! rejected or agree). Cases: 1000 per property, `PROPTEST_CASES=N` for more.

use std::io::Cursor;
use std::path::Path;

use linux_loader::loader::{elf::Elf, KernelLoader};
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_core::image::{builtin_bytes, validate_elf};

/// Guest RAM of the checks: the image base (4 MiB) plus room.
const RAM: u64 = 8 << 20;
/// What guest RAM holds before loading, so a stray write shows.
const SENTINEL: u8 = 0xa5;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Checks one input; `Err` names the disagreement.
fn check(bytes: &[u8]) -> Result<(), String> {
    let info = match validate_elf("fuzz", bytes, RAM) {
        Ok(info) => info,
        Err(e) => {
            let e = tiervm_cli::error::Error::from(e);
            let msg = e.describe();
            if e.exit_code() != 2 || !msg.starts_with("image 'fuzz': ") || msg.contains('\n') {
                return Err(format!("bad rejection (exit {}): {msg}", e.exit_code()));
            }
            return Ok(());
        }
    };
    if info.end > RAM {
        return Err(format!("accepted an image ending at {:#x}", info.end));
    }
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    let mut expected = vec![SENTINEL; RAM as usize];
    mem.write_slice(&expected, GuestAddress(0)).unwrap();
    for s in &info.segments {
        let (a, o, n) = (s.addr as usize, s.offset as usize, s.file_size as usize);
        expected[a..a + n].copy_from_slice(&bytes[o..o + n]);
    }
    let loaded = Elf::load(&mem, None, &mut Cursor::new(bytes), None).map_err(|e| {
        format!(
            "the validator accepted {:?} but the loader refused: {e}",
            info.segments
        )
    })?;
    if loaded.kernel_end != info.loaded_end() {
        return Err(format!(
            "loader ended at {:#x}, validator expected {:#x}",
            loaded.kernel_end,
            info.loaded_end()
        ));
    }
    let mut got = vec![0u8; RAM as usize];
    mem.read_slice(&mut got, GuestAddress(0)).unwrap();
    if got == expected {
        return Ok(());
    }
    if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        return Err(format!(
            "guest byte {i:#x} is {:#x}, expected {:#x}: the loader wrote outside the validated segments {:?}",
            got[i], expected[i], info.segments
        ));
    }
    Ok(())
}

/// One program header of a synthetic image.
#[derive(Clone, Debug)]
struct Ph {
    p_type: u32,
    flags: u32,
    offset: u64,
    vaddr: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

impl Ph {
    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(56);
        b.extend_from_slice(&self.p_type.to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        for v in [
            self.offset,
            self.vaddr,
            self.paddr,
            self.filesz,
            self.memsz,
            0x1000,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// A synthetic image: `phs` are the program headers the section-0 count
/// (PN_XNUM) or e_phnum announces; `hidden` follow them in the table.
#[derive(Clone, Debug)]
struct Synth {
    entry: u64,
    phs: Vec<Ph>,
    hidden: Vec<Ph>,
    xnum: bool,
    /// Pad the table with PT_NULL entries to 65535 (what a PN_XNUM count
    /// makes the loader read).
    pad_to_xnum: bool,
    data_len: usize,
}

const EHDR: usize = 64;
const SHDR: usize = 64;
const PHDR: usize = 56;

impl Synth {
    /// File layout: ELF header, section header 0, program headers, data.
    fn data_offset(&self) -> usize {
        let table = if self.pad_to_xnum {
            0xffff
        } else {
            self.phs.len() + self.hidden.len()
        };
        (EHDR + SHDR + table * PHDR).div_ceil(0x1000) * 0x1000
    }

    fn build(&self) -> Vec<u8> {
        let data_off = self.data_offset();
        let mut b = vec![0u8; data_off + self.data_len];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // little-endian
        b[6] = 1; // EV_CURRENT
        b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        b[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        b[20..24].copy_from_slice(&1u32.to_le_bytes());
        b[24..32].copy_from_slice(&self.entry.to_le_bytes());
        b[32..40].copy_from_slice(&((EHDR + SHDR) as u64).to_le_bytes()); // e_phoff
        b[40..48].copy_from_slice(&(EHDR as u64).to_le_bytes()); // e_shoff
        b[52..54].copy_from_slice(&(EHDR as u16).to_le_bytes());
        b[54..56].copy_from_slice(&(PHDR as u16).to_le_bytes());
        let phnum: u16 = if self.xnum {
            0xffff
        } else {
            self.phs.len() as u16
        };
        b[56..58].copy_from_slice(&phnum.to_le_bytes());
        b[58..60].copy_from_slice(&(SHDR as u16).to_le_bytes());
        b[60..62].copy_from_slice(&1u16.to_le_bytes()); // e_shnum
                                                        // Section 0: sh_info holds the real program-header count (PN_XNUM).
        b[EHDR + 44..EHDR + 48].copy_from_slice(&(self.phs.len() as u32).to_le_bytes());
        let mut at = EHDR + SHDR;
        for ph in self.phs.iter().chain(&self.hidden) {
            b[at..at + PHDR].copy_from_slice(&ph.bytes());
            at += PHDR;
        }
        for (i, byte) in b[data_off..].iter_mut().enumerate() {
            *byte = (i % 251) as u8 ^ 0x5c;
        }
        b
    }
}

fn ph_strategy(data_off: u64, data_len: u64) -> impl Strategy<Value = Ph> {
    let addr = prop_oneof![
        4 => (0x40_0000u64..RAM).prop_map(|a| a & !0xfff),
        1 => 0u64..RAM,
        1 => any::<u64>(),
    ];
    (
        prop_oneof![6 => Just(1u32), 1 => Just(4u32), 1 => Just(0u32), 1 => any::<u32>()],
        prop_oneof![Just(5u32), Just(6u32), Just(4u32)],
        prop_oneof![
            4 => (0..data_len).prop_map(move |o| data_off + o),
            1 => any::<u64>(),
        ],
        addr,
        prop_oneof![8 => Just(true), 1 => Just(false)],
        prop_oneof![4 => 0u64..0x3000, 1 => Just(0u64), 1 => any::<u64>()],
        prop_oneof![4 => 0u64..0x4000, 1 => any::<u64>()],
    )
        .prop_map(|(p_type, flags, offset, vaddr, same, filesz, extra)| Ph {
            p_type,
            flags,
            offset,
            vaddr,
            paddr: if same { vaddr } else { vaddr ^ 0x1000 },
            filesz,
            memsz: filesz.saturating_add(extra),
        })
}

fn synth_strategy() -> impl Strategy<Value = Synth> {
    let data_len = 0x4000u64;
    (any::<bool>(), any::<bool>(), prop::bool::weighted(0.1)).prop_flat_map(
        move |(xnum, hide, pad)| {
            let s = Synth {
                entry: 0x40_0010,
                phs: Vec::new(),
                hidden: Vec::new(),
                xnum,
                pad_to_xnum: pad && xnum,
                data_len: data_len as usize,
            };
            let data_off = s.data_offset() as u64;
            // A valid executable segment holding the entry, so that many
            // images pass validation and the loader has work to check.
            let text = Ph {
                p_type: 1,
                flags: 5,
                offset: data_off,
                vaddr: 0x40_0000,
                paddr: 0x40_0000,
                filesz: 0x1000,
                memsz: 0x2000,
            };
            (
                prop::collection::vec(ph_strategy(data_off, data_len), 0..4),
                prop::collection::vec(
                    ph_strategy(data_off, data_len),
                    if hide { 1..3 } else { 0..1 },
                ),
                prop::bool::weighted(0.2),
                ph_strategy(data_off, data_len),
                0usize..4,
            )
                .prop_map(move |(extra, hidden, mutate_text, other, at)| {
                    let mut phs = extra;
                    let text = if mutate_text { other } else { text.clone() };
                    phs.insert(at.min(phs.len()), text);
                    Synth {
                        phs,
                        hidden,
                        ..s.clone()
                    }
                })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Synthetic images, including extended (PN_XNUM) program-header counts
    /// with hidden segments after the announced ones.
    #[test]
    fn validator_and_loader_agree_on_synthetic_images(s in synth_strategy()) {
        let bytes = s.build();
        if let Err(e) = check(&bytes) {
            return Err(TestCaseError::fail(format!("{e}\n{s:?}")));
        }
    }

    #[test]
    fn truncated_images_are_rejected_or_agree(cut in 0usize..20_000) {
        let zipf = builtin_bytes("zipf").unwrap();
        let cut = cut.min(zipf.len());
        check(&zipf[..cut]).map_err(TestCaseError::fail)?;
        if cut < 64 {
            prop_assert!(validate_elf("fuzz", &zipf[..cut], RAM).is_err());
        }
    }

    #[test]
    fn corrupted_headers_are_rejected_or_agree(flips in prop::collection::vec((0usize..512, any::<u8>()), 1..16)) {
        let mut bytes = builtin_bytes("zipf").unwrap().to_vec();
        for (i, v) in flips {
            bytes[i] = v;
        }
        check(&bytes).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096), elf_magic in any::<bool>()) {
        let mut bytes = bytes;
        if elf_magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(b"\x7fELF");
        }
        check(&bytes).map_err(TestCaseError::fail)?;
    }
}

/// The corpus of inputs that once broke agreement: each is now rejected or
/// loads exactly what was validated.
#[test]
fn corpus_inputs_are_rejected_or_agree() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/elf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        if let Err(e) = check(&bytes) {
            panic!("{}: {e}", path.display());
        }
        n += 1;
    }
    assert!(n > 0, "no corpus files in {}", dir.display());
}

/// The PN_XNUM file of issue #13: e_phnum = 0xffff and section 0 announces
/// one segment, while the table the loader reads (65535 entries) also holds
/// a segment the validator never saw, at another address. Rejected now.
#[test]
fn extended_program_header_count_is_rejected() {
    let bytes = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus/elf/pn-xnum-hidden-segment.elf"),
    )
    .unwrap();
    let err =
        tiervm_cli::error::Error::from(validate_elf("x", &bytes, RAM).unwrap_err()).describe();
    assert!(err.contains("PN_XNUM"), "{err}");
}

/// Writes the corpus files (run with `--ignored write_corpus` to
/// regenerate them).
#[test]
#[ignore]
fn write_corpus() {
    let seg = |addr: u64, offset: u64| Ph {
        p_type: 1,
        flags: 5,
        offset,
        vaddr: addr,
        paddr: addr,
        filesz: 0x100,
        memsz: 0x1000,
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/elf");
    std::fs::create_dir_all(&dir).unwrap();
    // Issue #13: e_phnum = PN_XNUM, one announced segment, a hidden one.
    let mut s = Synth {
        entry: 0x40_0000,
        phs: vec![],
        hidden: vec![],
        xnum: true,
        pad_to_xnum: true,
        data_len: 0x2000,
    };
    let off = s.data_offset() as u64;
    s.phs = vec![seg(0x40_0000, off)];
    s.hidden = vec![seg(0x60_0000, off + 0x1000)];
    std::fs::write(dir.join("pn-xnum-hidden-segment.elf"), s.build()).unwrap();
    // Found by the synthetic property: a PT_NOTE whose header lies past the
    // end of the file; the validator ignored notes, the loader refused.
    let mut s = Synth {
        entry: 0x40_0010,
        phs: vec![],
        hidden: vec![],
        xnum: false,
        pad_to_xnum: false,
        data_len: 0x4000,
    };
    let off = s.data_offset() as u64;
    let mut text = seg(0x40_0000, off);
    text.filesz = 0x1000;
    text.memsz = 0x2000;
    let mut note = seg(0x40_0000, off + 0x3ff5);
    note.p_type = 4;
    note.filesz = 1;
    note.memsz = 1;
    s.phs = vec![text, note];
    std::fs::write(dir.join("note-header-past-eof.elf"), s.build()).unwrap();
}
