//! Property tests: corrupted and truncated ELF files never panic the
//! validator or the loader, and every rejection is a clear image error.

use std::io::Cursor;

use linux_loader::loader::{elf::Elf, KernelLoader};
use proptest::prelude::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm::image::{builtin_bytes, validate_elf};

const RAM: u64 = 32 << 20;

fn check(bytes: &[u8], mem: &GuestMemoryMmap) -> Result<(), TestCaseError> {
    match validate_elf("fuzz", bytes, RAM) {
        Ok(info) => {
            prop_assert!(info.end <= RAM);
            // Whatever validation accepts, the loader loads without panicking.
            let _ = Elf::load(mem, None, &mut Cursor::new(bytes), None);
        }
        Err(e) => {
            let e = vmm::error::Error::from(e);
            prop_assert_eq!(e.exit_code(), 2);
            let msg = e.describe();
            prop_assert!(msg.starts_with("image 'fuzz': "), "{}", msg);
            prop_assert!(!msg.contains('\n'));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn truncated_images_are_rejected_cleanly(cut in 0usize..20_000) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
        let zipf = builtin_bytes("zipf").unwrap();
        let cut = cut.min(zipf.len());
        check(&zipf[..cut], &mem)?;
        if cut < 64 {
            prop_assert!(validate_elf("fuzz", &zipf[..cut], RAM).is_err());
        }
    }

    #[test]
    fn corrupted_headers_never_panic(flips in proptest::collection::vec((0usize..512, any::<u8>()), 1..16)) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
        let mut bytes = builtin_bytes("zipf").unwrap().to_vec();
        for (i, v) in flips {
            bytes[i] = v;
        }
        check(&bytes, &mem)?;
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096), elf_magic in any::<bool>()) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
        let mut bytes = bytes;
        if elf_magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(b"\x7fELF");
        }
        check(&bytes, &mem)?;
    }
}
