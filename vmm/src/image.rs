//! Guest images: the built-in ones (embedded at build time) and ELF files
//! given by path, validated before anything is loaded.

use std::path::Path;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;
use tiervm_guest::abi::IMAGE_BASE_GPA;
use tiervm_guest::args::ImageSpec;
use tiervm_guest::workloads;

use crate::error::{Error, Result};

/// Largest image file tiervm reads.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

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
    pub fn resolve(name_or_path: &str) -> Result<Self> {
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
        let path = Path::new(name_or_path);
        let meta = std::fs::metadata(path).map_err(|e| {
            Error::Image(format!(
                "image '{name_or_path}' is neither a built-in image ({}) nor a readable file ({e}): \
                 give a built-in name or the path of a static x86_64 ELF",
                builtin_names().join(", ")
            ))
        })?;
        if !meta.is_file() {
            return Err(Error::Image(format!("image '{name_or_path}' is not a regular file: give the path of a static x86_64 ELF")));
        }
        if meta.len() > MAX_IMAGE_BYTES {
            return Err(Error::Image(format!(
                "image '{name_or_path}' is {} bytes, more than the {} byte limit: strip it or give a smaller image",
                meta.len(),
                MAX_IMAGE_BYTES
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Image(format!("cannot read image '{name_or_path}': {e}")))?;
        Ok(Self {
            name: name_or_path.to_string(),
            spec: None,
            bytes: bytes.into(),
        })
    }
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
fn check_notes(bytes: &[u8], offset: u64, size: u64) -> std::result::Result<(), String> {
    const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
    let corrupt =
        |what: &str| format!("note segment at file offset {offset:#x} {what}: the file is corrupt");
    let mut read = 0u64;
    while read < size {
        let at = offset
            .checked_add(read)
            .and_then(|a| usize::try_from(a).ok())
            .ok_or_else(|| corrupt("lies past the end of the file"))?;
        let header = bytes
            .get(at..)
            .and_then(|b| b.get(..12))
            .ok_or_else(|| corrupt("has a note header past the end of the file"))?;
        let word =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (namesz, descsz, kind) = (word(0), word(4), word(8));
        if kind == XEN_ELFNOTE_PHYS32_ENTRY && namesz == 4 {
            return Err(
                "has a Xen PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): tiervm starts images at e_entry in ring 3; drop the note"
                    .into(),
            );
        }
        let name = u64::from(namesz).next_multiple_of(4);
        let desc = u64::from(descsz).next_multiple_of(4);
        if name > u64::from(u32::MAX) || desc > u64::from(u32::MAX) {
            return Err(corrupt("has a note size that overflows"));
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
/// [`Error::Image`] naming the problem and the fix.
pub fn validate_elf(name: &str, bytes: &[u8], ram_size: u64) -> Result<ElfInfo> {
    let fail = |what: String| Error::Image(format!("image '{name}': {what}"));
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(fail(
            "not an ELF file (bad magic): give a static x86_64 ELF executable".into(),
        ));
    }
    let header = elf::FileHeader64::<Endianness>::parse(bytes).map_err(|e| {
        fail(format!(
            "not a valid 64-bit ELF ({e}): build it for x86_64-unknown-linux-gnu (or -none) as a static executable"
        ))
    })?;
    let endian = header
        .endian()
        .map_err(|e| fail(format!("unsupported ELF byte order ({e})")))?;
    // The loader (linux-loader) reads the header itself; refuse every header
    // it would read differently, so that what is validated here is what is
    // loaded (tests/elf_props.rs checks this on random and mutated files).
    if endian != Endianness::Little {
        return Err(fail(
            "is big-endian: x86_64 images are little-endian; rebuild it for x86_64".into(),
        ));
    }
    if header.e_phnum(endian) == elf::PN_XNUM {
        return Err(fail(format!(
            "uses an extended program-header count (e_phnum = {:#x}, PN_XNUM, the real count in section 0): \
             tiervm's loader reads e_phnum as the count; link it with fewer than 65535 program headers",
            elf::PN_XNUM
        )));
    }
    let phoff = header.e_phoff(endian);
    if phoff != 0 && phoff < std::mem::size_of::<elf::FileHeader64<Endianness>>() as u64 {
        return Err(fail(format!(
            "program headers at offset {phoff} overlap the ELF header: the file is corrupt"
        )));
    }
    if header.e_machine(endian) != elf::EM_X86_64 {
        return Err(fail(format!(
            "built for machine {} not x86_64 (62): rebuild it for x86_64",
            header.e_machine(endian)
        )));
    }
    match header.e_type(endian) {
        elf::ET_EXEC => {}
        elf::ET_DYN => {
            return Err(fail(
                "is position-independent or a shared object (ET_DYN): link it static and non-PIE (-static -no-pie)".into(),
            ))
        }
        t => return Err(fail(format!("is not an executable (e_type {t}): give a linked executable"))),
    }
    let phdrs = header.program_headers(endian, bytes).map_err(|e| {
        fail(format!(
            "has unreadable program headers ({e}): the file is truncated or corrupt"
        ))
    })?;
    let mut segments = Vec::new();
    for ph in phdrs {
        match ph.p_type(endian) {
            elf::PT_INTERP | elf::PT_DYNAMIC => {
                return Err(fail(
                    "is dynamically linked: link it statically (-static, no interpreter)".into(),
                ));
            }
            elf::PT_LOAD => {}
            elf::PT_NOTE => {
                check_notes(bytes, ph.p_offset(endian), ph.p_filesz(endian)).map_err(fail)?;
                continue;
            }
            _ => continue,
        }
        let addr = ph.p_paddr(endian);
        let file_size = ph.p_filesz(endian);
        let mem_size = ph.p_memsz(endian);
        let offset = ph.p_offset(endian);
        if file_size > mem_size {
            return Err(fail(format!(
                "segment at {addr:#x} has file size {file_size} > memory size {mem_size}: corrupt"
            )));
        }
        if offset
            .checked_add(file_size)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(fail(format!(
                "segment at {addr:#x} extends past the end of the file: the file is truncated"
            )));
        }
        let end = addr.checked_add(mem_size).ok_or_else(|| {
            fail(format!(
                "segment at {addr:#x} wraps around the address space"
            ))
        })?;
        if addr < IMAGE_BASE_GPA {
            return Err(fail(format!(
                "segment at {addr:#x} lies below {IMAGE_BASE_GPA:#x}, where tiervm keeps boot info, status page and page tables: \
                 link the image at {IMAGE_BASE_GPA:#x} or higher"
            )));
        }
        if end > ram_size {
            return Err(fail(format!(
                "segment {addr:#x}..{end:#x} lies outside guest RAM (0..{ram_size:#x}): raise --mem or link the image lower"
            )));
        }
        if ph.p_vaddr(endian) != addr {
            return Err(fail(format!(
                "segment virtual address {:#x} differs from its physical address {addr:#x}: tiervm identity-maps RAM, \
                 link with equal virtual and physical addresses",
                ph.p_vaddr(endian)
            )));
        }
        segments.push(Segment {
            addr,
            offset,
            file_size,
            mem_size,
            exec: ph.p_flags(endian) & elf::PF_X != 0,
        });
    }
    if segments.is_empty() {
        return Err(fail(
            "has no loadable segment: give a linked executable".into(),
        ));
    }
    let entry = header.e_entry(endian);
    if !segments
        .iter()
        .any(|s| s.exec && entry >= s.addr && entry < s.addr + s.mem_size)
    {
        return Err(fail(format!(
            "entry point {entry:#x} is not inside an executable segment: the file is corrupt"
        )));
    }
    let end = segments
        .iter()
        .map(|s| s.addr + s.mem_size)
        .max()
        .unwrap_or(IMAGE_BASE_GPA);
    if header.e_phentsize(endian) as usize
        != std::mem::size_of::<elf::ProgramHeader64<Endianness>>()
    {
        return Err(fail(format!(
            "program header size {} is not 56: the file is corrupt",
            header.e_phentsize(endian)
        )));
    }
    Ok(ElfInfo {
        entry,
        segments,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let err = validate_elf("t", &bytes, 64 << 20).unwrap_err().to_string();
            assert!(err.contains(expect), "{err} should contain {expect}");
        }
        let err = validate_elf("t", zipf, 0x400100).unwrap_err().to_string();
        assert!(err.contains("outside guest RAM"), "{err}");
        let err = Image::resolve("/nonexistent/image")
            .unwrap_err()
            .to_string();
        assert!(err.contains("neither a built-in image"), "{err}");
    }

    #[test]
    fn rejects_dynamic_elf() {
        // /bin/true on this host is dynamically linked (or PIE): either way rejected.
        if let Ok(bytes) = std::fs::read("/bin/true") {
            let err = validate_elf("true", &bytes, 1 << 30)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("dynamically linked") || err.contains("position-independent"),
                "{err}"
            );
        }
    }
}
