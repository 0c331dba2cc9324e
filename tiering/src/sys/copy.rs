//! Volatile copies, compares and zeroing of raw memory that other threads
//! (vCPUs, the kernel on their behalf) may write concurrently, like
//! vm-memory's volatile accessors. No system call; raw pointer access only.

/// Copies `len` bytes (a multiple of 8) with volatile 8-byte loads and
/// stores (guest memory may be written concurrently by vCPUs, like
/// vm-memory's volatile copies).
///
/// # Safety
/// `src` and `dst` must be 8-byte aligned, valid for `len` bytes, and not overlap.
pub unsafe fn copy_volatile(dst: *mut u8, src: *const u8, len: usize) {
    let s = src as *const u64;
    let d = dst as *mut u64;
    for i in 0..len / 8 {
        // SAFETY: the caller guarantees both pointers are valid and aligned for `len`.
        unsafe { d.add(i).write_volatile(s.add(i).read_volatile()) };
    }
}

/// Whether two ranges of `len` bytes hold the same bytes (volatile reads).
///
/// # Safety
/// `a` and `b` must be 8-byte aligned and valid for reads of `len` bytes.
pub unsafe fn equal_volatile(a: *const u8, b: *const u8, len: usize) -> bool {
    let a = a as *const u64;
    let b = b as *const u64;
    // SAFETY: the caller guarantees both pointers are valid and aligned for `len`.
    (0..len / 8).all(|i| unsafe { a.add(i).read_volatile() == b.add(i).read_volatile() })
}

/// Whether `len` bytes (a multiple of 8) at `a` are all zero, read with
/// volatile loads (another thread may write them).
///
/// # Safety
/// `a` must be valid for reads of `len` bytes and 8-byte aligned.
pub unsafe fn is_zero_volatile(a: *const u8, len: usize) -> bool {
    let a = a as *const u64;
    // SAFETY: the caller guarantees the pointer is valid and aligned for `len`.
    (0..len / 8).all(|i| unsafe { a.add(i).read_volatile() == 0 })
}

/// Zeroes `len` bytes (a multiple of 8) with volatile stores.
///
/// # Safety
/// `dst` must be 8-byte aligned and valid for writes of `len` bytes.
pub unsafe fn zero_volatile(dst: *mut u8, len: usize) {
    let d = dst as *mut u64;
    for i in 0..len / 8 {
        // SAFETY: the caller guarantees the pointer is valid and aligned for `len`.
        unsafe { d.add(i).write_volatile(0) };
    }
}
