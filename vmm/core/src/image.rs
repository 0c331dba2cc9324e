//! Guest images: the built-in ones (embedded at build time) and ELF files
//! given by path, validated before anything is loaded.

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;
use tiervm_guest::abi::IMAGE_BASE_GPA;
use tiervm_guest::args::ImageSpec;
use tiervm_guest::workloads;

/// Largest image file tiervm reads.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

/// A guest image that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Neither a built-in name nor a file.
    #[error("image '{name}' is neither a built-in image ({}) nor a readable file", builtin_names().join(", "))]
    NotFound {
        /// The name or path given.
        name: String,
        /// Why the file could not be found.
        #[source]
        source: std::io::Error,
    },
    /// A directory or device.
    #[error("image '{name}' is not a regular file: give the path of a static x86_64 ELF")]
    NotAFile {
        /// The path.
        name: String,
    },
    /// A file of no bytes (or a procfs/sysfs file, which says 0).
    #[error("image '{name}' is empty (0 bytes): give the path of a static x86_64 ELF")]
    Empty {
        /// The path.
        name: String,
    },
    /// Larger than [`MAX_IMAGE_BYTES`].
    #[error("image '{name}' is {bytes} bytes, more than the {MAX_IMAGE_BYTES} byte limit: strip it or give a smaller image")]
    TooLarge {
        /// The path.
        name: String,
        /// Its size.
        bytes: u64,
    },
    /// Reading the file failed.
    #[error("cannot read image '{name}'")]
    Read {
        /// The path.
        name: String,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an ELF tiervm can load.
    #[error("image '{name}'")]
    Elf {
        /// The name or path.
        name: String,
        /// What is wrong with it.
        #[source]
        problem: ElfError,
    },
    /// Copying the segments into guest RAM failed.
    #[error("image '{name}': loading failed")]
    Load {
        /// The name or path.
        name: String,
        /// The loader's reason.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// The loader did not load what the validator described (an ambiguous
    /// file the validator should have refused).
    #[error("image '{name}': the loader ended at {loader_end:#x} where validation expected {validated_end:#x}: the ELF file is ambiguous; relink it")]
    LoaderDisagrees {
        /// The image.
        name: String,
        /// Where linux-loader's last file-backed segment ended.
        loader_end: u64,
        /// Where the validated segments end.
        validated_end: u64,
    },
}

impl ImageError {
    /// The fix, for errors whose cause comes from below.
    pub fn fix(&self) -> Option<&'static str> {
        match self {
            Self::NotFound { .. } => {
                Some("give a built-in name or the path of a static x86_64 ELF")
            }
            Self::Elf { problem, .. } => problem.fix(),
            _ => None,
        }
    }
}

/// Why an ELF file cannot be a tiervm guest.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// No ELF magic.
    #[error("not an ELF file (bad magic): give a static x86_64 ELF executable")]
    NotElf,
    /// The header does not parse.
    #[error("not a valid 64-bit ELF")]
    Invalid(#[source] object::read::Error),
    /// Neither little nor big endian.
    #[error("unsupported ELF byte order")]
    ByteOrder(#[source] object::read::Error),
    /// Another architecture.
    #[error("built for machine {0} not x86_64 (62): rebuild it for x86_64")]
    WrongMachine(u16),
    /// PIE or shared object.
    #[error("is position-independent or a shared object (ET_DYN): link it static and non-PIE (-static -no-pie)")]
    PositionIndependent,
    /// Relocatable or core file.
    #[error("is not an executable (e_type {0}): give a linked executable")]
    NotExecutable(u16),
    /// Program headers out of the file.
    #[error("has unreadable program headers")]
    ProgramHeaders(#[source] object::read::Error),
    /// Has an interpreter or a dynamic section.
    #[error("is dynamically linked: link it statically (-static, no interpreter)")]
    Dynamic,
    /// `p_filesz > p_memsz`.
    #[error("segment at {addr:#x} has file size {file_size} > memory size {mem_size}: corrupt")]
    SegmentFileSize {
        /// Load address.
        addr: u64,
        /// Bytes in the file.
        file_size: u64,
        /// Bytes in memory.
        mem_size: u64,
    },
    /// The segment's bytes run past the end of the file.
    #[error("segment at {0:#x} extends past the end of the file: the file is truncated")]
    SegmentPastEof(u64),
    /// Address plus size overflows.
    #[error("segment at {0:#x} wraps around the address space")]
    SegmentWraps(u64),
    /// Below the image base, where tiervm's own pages are.
    #[error("segment at {0:#x} lies below {IMAGE_BASE_GPA:#x}, where tiervm keeps boot info, status page and page tables: link the image at {IMAGE_BASE_GPA:#x} or higher")]
    SegmentBelowBase(u64),
    /// Beyond guest RAM.
    #[error("segment {addr:#x}..{end:#x} lies outside guest RAM (0..{ram_size:#x}): raise --mem or link the image lower")]
    SegmentOutsideRam {
        /// Load address.
        addr: u64,
        /// One past its end.
        end: u64,
        /// Guest RAM bytes.
        ram_size: u64,
    },
    /// Not identity-linked.
    #[error("segment virtual address {vaddr:#x} differs from its physical address {addr:#x}: tiervm identity-maps RAM, link with equal virtual and physical addresses")]
    VirtualNotPhysical {
        /// `p_vaddr`.
        vaddr: u64,
        /// `p_paddr`.
        addr: u64,
    },
    /// No `PT_LOAD`.
    #[error("has no loadable segment: give a linked executable")]
    NoLoadableSegment,
    /// The entry point is not in executable code.
    #[error("entry point {0:#x} is not inside an executable segment: the file is corrupt")]
    EntryOutsideCode(u64),
    /// Big-endian file (the loader reads little-endian only).
    #[error("is big-endian: x86_64 images are little-endian; rebuild it for x86_64")]
    BigEndian,
    /// `e_phnum = PN_XNUM`: the loader would read 65535 program headers.
    #[error("uses an extended program-header count (e_phnum = 0xffff, PN_XNUM, the real count in section 0): tiervm's loader reads e_phnum as the count; link it with fewer than 65535 program headers")]
    ExtendedPhnum,
    /// Program headers inside the ELF header.
    #[error("program headers at offset {0} overlap the ELF header: the file is corrupt")]
    PhdrsOverlapHeader(u64),
    /// Program-header entries of another size.
    #[error("program header size {0} is not 56: the file is corrupt")]
    PhentSize(u16),
    /// A note header lies past the end of the file.
    #[error("note segment at file offset {0:#x} has a note header past the end of the file: the file is corrupt")]
    NotePastEof(u64),
    /// A note's size overflows (the loader refuses it).
    #[error(
        "note segment at file offset {0:#x} has a note size that overflows: the file is corrupt"
    )]
    NoteSizeOverflow(u64),
    /// A Xen PVH entry note (the loader would parse it as a boot protocol).
    #[error("has a Xen PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): tiervm starts images at e_entry in ring 3; drop the note")]
    XenPvhNote,
}

impl ElfError {
    /// The fix, for errors whose cause comes from below.
    pub fn fix(&self) -> Option<&'static str> {
        match self {
            Self::Invalid(_) => {
                Some("build it for x86_64-unknown-linux-gnu (or -none) as a static executable")
            }
            Self::ProgramHeaders(_) => Some("the file is truncated or corrupt"),
            _ => None,
        }
    }
}

/// Embedded bytes aligned to 8: `object` parses ELF headers in place and
/// rejects a misaligned buffer, and `include_bytes!` alone only guarantees 1.
#[repr(C, align(8))]
struct Aligned<B: ?Sized>(B);

static ZIPF: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("TIERVM_IMAGE_ZIPF")));
static GUPS: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("TIERVM_IMAGE_GUPS")));
static MEMCHECK: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("TIERVM_IMAGE_MEMCHECK")));
static KV: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("TIERVM_IMAGE_KV")));
static PAGERANK: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("TIERVM_IMAGE_PAGERANK")));

/// The ELF bytes of built-in image `name`.
pub fn builtin_bytes(name: &str) -> Option<&'static [u8]> {
    Some(match name {
        "zipf" => &ZIPF.0,
        "gups" => &GUPS.0,
        "memcheck" => &MEMCHECK.0,
        "kv" => &KV.0,
        "pagerank" => &PAGERANK.0,
        _ => return None,
    })
}

/// Names of the built-in images.
pub fn builtin_names() -> Vec<&'static str> {
    workloads::IMAGES.iter().map(|s| s.name).collect()
}

/// A guest image ready to be validated and loaded.
#[derive(Clone, Debug)]
pub struct Image {
    /// Built-in name, or the file path.
    pub name: String,
    /// The argument spec, for built-in images.
    pub spec: Option<&'static ImageSpec>,
    /// The ELF file.
    pub bytes: std::borrow::Cow<'static, [u8]>,
}

impl Image {
    /// Resolves `name_or_path`: a built-in image name, else a file path.
    pub fn resolve(name_or_path: &str) -> Result<Self, ImageError> {
        if let (Some(spec), Some(bytes)) = (
            workloads::image_spec(name_or_path),
            builtin_bytes(name_or_path),
        ) {
            return Ok(Self {
                name: name_or_path.to_string(),
                spec: Some(spec),
                bytes: bytes.into(),
            });
        }
        let bytes = read_image_file(name_or_path)?;
        Ok(Self {
            name: name_or_path.to_string(),
            spec: None,
            bytes: bytes.into(),
        })
    }
}

/// Reads an image file, bounded: opened without blocking (a FIFO or a
/// procfs file such as `/proc/kmsg` would otherwise block the reader for
/// ever), checked on the open descriptor (no race with a rename), and read
/// no further than [`MAX_IMAGE_BYTES`] whatever the size it reports.
fn read_image_file(path: &str) -> Result<Vec<u8>, ImageError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let name = || path.to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| ImageError::NotFound {
            name: name(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| ImageError::Read {
        name: name(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ImageError::NotAFile { name: name() });
    }
    if meta.len() == 0 {
        // procfs and sysfs files say 0 bytes; so does an empty file.
        return Err(ImageError::Empty { name: name() });
    }
    if meta.len() > MAX_IMAGE_BYTES {
        return Err(ImageError::TooLarge {
            name: name(),
            bytes: meta.len(),
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_IMAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ImageError::Read {
            name: name(),
            source,
        })?;
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return Err(ImageError::TooLarge {
            name: name(),
            bytes: bytes.len() as u64,
        });
    }
    Ok(bytes)
}

/// A loadable segment of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical load address.
    pub addr: u64,
    /// Offset of its bytes in the file.
    pub offset: u64,
    /// Bytes in the file.
    pub file_size: u64,
    /// Bytes in memory (>= file_size; the rest is zero).
    pub mem_size: u64,
    /// Executable.
    pub exec: bool,
}

/// Walks a `PT_NOTE` segment the way the loader does (it looks for a Xen
/// PVH entry note: 12-byte headers, name and descriptor 4-byte aligned, read
/// from the file), so that the loader never refuses an image accepted here.
fn check_notes(bytes: &[u8], offset: u64, size: u64) -> std::result::Result<(), ElfError> {
    const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
    let mut read = 0u64;
    while read < size {
        let at = offset
            .checked_add(read)
            .and_then(|a| usize::try_from(a).ok())
            .ok_or(ElfError::NotePastEof(offset))?;
        let header = bytes
            .get(at..)
            .and_then(|b| b.get(..12))
            .ok_or(ElfError::NotePastEof(offset))?;
        let word =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (namesz, descsz, kind) = (word(0), word(4), word(8));
        if kind == XEN_ELFNOTE_PHYS32_ENTRY && namesz == 4 {
            return Err(ElfError::XenPvhNote);
        }
        let name = u64::from(namesz).next_multiple_of(4);
        let desc = u64::from(descsz).next_multiple_of(4);
        if name > u64::from(u32::MAX) || desc > u64::from(u32::MAX) {
            return Err(ElfError::NoteSizeOverflow(offset));
        }
        read += 12 + name + desc;
    }
    Ok(())
}

impl ElfInfo {
    /// One past the highest byte of a segment with file content: what the
    /// loader reports as the end of what it loaded (it writes only file
    /// bytes; the rest of a segment is guest RAM's zeros).
    pub fn loaded_end(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.file_size > 0)
            .map(|s| s.addr + s.mem_size)
            .max()
            .unwrap_or(0)
    }
}

/// What validation learned about an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfInfo {
    /// Entry point.
    pub entry: u64,
    /// `PT_LOAD` segments.
    pub segments: Vec<Segment>,
    /// One past the highest loaded byte.
    pub end: u64,
}

/// Checks that `bytes` is a static x86_64 executable whose segments fit in
/// `IMAGE_BASE_GPA..ram_size`, and describes it. Every failure is an
/// [`ImageError::Elf`] naming the problem and the fix.
pub fn validate_elf(name: &str, bytes: &[u8], ram_size: u64) -> Result<ElfInfo, ImageError> {
    elf_info(bytes, ram_size).map_err(|problem| ImageError::Elf {
        name: name.to_string(),
        problem,
    })
}

/// [`validate_elf`]'s steps: 1. the header, 2. each program header (notes
/// checked, `PT_LOAD` segments kept), 3. the entry point in code, 4. the
/// program-header size (last: an earlier problem names the fix better).
fn elf_info(bytes: &[u8], ram_size: u64) -> Result<ElfInfo, ElfError> {
    let (header, endian) = check_header(bytes)?;
    let phdrs = header
        .program_headers(endian, bytes)
        .map_err(ElfError::ProgramHeaders)?;
    let mut segments = Vec::new();
    for ph in phdrs {
        match ph.p_type(endian) {
            elf::PT_INTERP | elf::PT_DYNAMIC => return Err(ElfError::Dynamic),
            elf::PT_LOAD => segments.push(check_load_segment(ph, endian, bytes, ram_size)?),
            elf::PT_NOTE => check_notes(bytes, ph.p_offset(endian), ph.p_filesz(endian))?,
            _ => {}
        }
    }
    if segments.is_empty() {
        return Err(ElfError::NoLoadableSegment);
    }
    let entry = header.e_entry(endian);
    if !segments
        .iter()
        .any(|s| s.exec && entry >= s.addr && entry < s.addr + s.mem_size)
    {
        return Err(ElfError::EntryOutsideCode(entry));
    }
    let end = segments
        .iter()
        .map(|s| s.addr + s.mem_size)
        .max()
        .unwrap_or(IMAGE_BASE_GPA);
    if header.e_phentsize(endian) as usize
        != std::mem::size_of::<elf::ProgramHeader64<Endianness>>()
    {
        return Err(ElfError::PhentSize(header.e_phentsize(endian)));
    }
    Ok(ElfInfo {
        entry,
        segments,
        end,
    })
}

/// Step 1: a little-endian static x86_64 executable header that the loader
/// (linux-loader, which reads the header itself) reads the same way; every
/// header it would read differently is refused, so that what is validated
/// is what is loaded (tests/elf_props.rs checks this on random and mutated
/// files).
fn check_header(bytes: &[u8]) -> Result<(&elf::FileHeader64<Endianness>, Endianness), ElfError> {
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    let header = elf::FileHeader64::<Endianness>::parse(bytes).map_err(ElfError::Invalid)?;
    let endian = header.endian().map_err(ElfError::ByteOrder)?;
    if endian != Endianness::Little {
        return Err(ElfError::BigEndian);
    }
    if header.e_phnum(endian) == elf::PN_XNUM {
        return Err(ElfError::ExtendedPhnum);
    }
    let phoff = header.e_phoff(endian);
    if phoff != 0 && phoff < std::mem::size_of::<elf::FileHeader64<Endianness>>() as u64 {
        return Err(ElfError::PhdrsOverlapHeader(phoff));
    }
    if header.e_machine(endian) != elf::EM_X86_64 {
        return Err(ElfError::WrongMachine(header.e_machine(endian)));
    }
    match header.e_type(endian) {
        elf::ET_EXEC => Ok((header, endian)),
        elf::ET_DYN => Err(ElfError::PositionIndependent),
        t => Err(ElfError::NotExecutable(t)),
    }
}

/// Step 2 for a `PT_LOAD`: its file part inside the file, its memory part
/// inside `IMAGE_BASE_GPA..ram_size` without wrapping, identity-mapped.
fn check_load_segment(
    ph: &elf::ProgramHeader64<Endianness>,
    endian: Endianness,
    bytes: &[u8],
    ram_size: u64,
) -> Result<Segment, ElfError> {
    let addr = ph.p_paddr(endian);
    let file_size = ph.p_filesz(endian);
    let mem_size = ph.p_memsz(endian);
    let offset = ph.p_offset(endian);
    if file_size > mem_size {
        return Err(ElfError::SegmentFileSize {
            addr,
            file_size,
            mem_size,
        });
    }
    if offset
        .checked_add(file_size)
        .is_none_or(|end| end > bytes.len() as u64)
    {
        return Err(ElfError::SegmentPastEof(addr));
    }
    let end = addr
        .checked_add(mem_size)
        .ok_or(ElfError::SegmentWraps(addr))?;
    if addr < IMAGE_BASE_GPA {
        return Err(ElfError::SegmentBelowBase(addr));
    }
    if end > ram_size {
        return Err(ElfError::SegmentOutsideRam {
            addr,
            end,
            ram_size,
        });
    }
    if ph.p_vaddr(endian) != addr {
        return Err(ElfError::VirtualNotPhysical {
            vaddr: ph.p_vaddr(endian),
            addr,
        });
    }
    Ok(Segment {
        addr,
        offset,
        file_size,
        mem_size,
        exec: ph.p_flags(endian) & elf::PF_X != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn describe(e: ImageError) -> String {
        crate::exit::describe(&e, e.fix())
    }

    #[test]
    fn builtins_validate() {
        for name in builtin_names() {
            let img = Image::resolve(name).unwrap();
            let info = validate_elf(name, &img.bytes, 64 << 20).unwrap();
            assert!(info.entry >= IMAGE_BASE_GPA && info.end > info.entry);
        }
    }

    #[test]
    fn rejects_with_clear_messages() {
        let zipf = builtin_bytes("zipf").unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"hello world".to_vec(), "bad magic"),
            (zipf[..40].to_vec(), "not a valid 64-bit ELF"),
            (
                {
                    let mut b = zipf.to_vec();
                    b[18] = 183; // EM_AARCH64
                    b
                },
                "not x86_64",
            ),
            (
                {
                    let mut b = zipf.to_vec();
                    b[16] = 3; // ET_DYN
                    b
                },
                "position-independent",
            ),
        ];
        for (bytes, expect) in cases {
            let err = describe(validate_elf("t", &bytes, 64 << 20).unwrap_err());
            assert!(err.contains(expect), "{err} should contain {expect}");
        }
        let err = describe(validate_elf("t", zipf, 0x400100).unwrap_err());
        assert!(err.contains("outside guest RAM"), "{err}");
        let err = describe(Image::resolve("/nonexistent/image").unwrap_err());
        assert!(err.contains("neither a built-in image"), "{err}");
    }

    #[test]
    fn rejects_dynamic_elf() {
        // /bin/true on this host is dynamically linked (or PIE): either way rejected.
        if let Ok(bytes) = std::fs::read("/bin/true") {
            let err = describe(validate_elf("true", &bytes, 1 << 30).unwrap_err());
            assert!(
                err.contains("dynamically linked") || err.contains("position-independent"),
                "{err}"
            );
        }
    }

    #[test]
    fn files_that_would_block_or_say_zero_bytes_are_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("tiervm-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A FIFO with no writer: a blocking open or read would wait for ever.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        let cases = [
            (fifo.to_str().unwrap(), "not a regular file"),
            (empty.to_str().unwrap(), "is empty"),
            // procfs says 0 bytes (and /proc/kmsg's read blocks).
            ("/proc/self/status", "is empty"),
        ];
        for (path, want) in cases {
            let e = Image::resolve(path).expect_err(path);
            let msg = describe(e);
            assert!(msg.contains(want), "{path}: {msg}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
