//! Zeroed allocation of atomic arrays (`alloc_zeroed`), so that a large
//! map's pages are committed only when written.

use std::io;

/// A boxed slice of `n` zeroed atomics, allocated with `alloc_zeroed` so
/// that its pages are only committed when written (a 64 GiB guest's page map
/// must not cost its size at start-up).
pub fn zeroed_atomics<T: ZeroableAtomic>(n: usize) -> io::Result<Box<[T]>> {
    if n == 0 {
        return Ok(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<T>(n)
        .map_err(|_| io::Error::other(format!("a map of {n} entries does not fit in memory")))?;
    // SAFETY: the layout is non-zero-sized (n > 0 and T is not a ZST); the allocation is
    // checked for null below; the all-zero bit pattern is a valid `T` (the trait's
    // contract: only std atomic integers implement it), so the slice is initialized; the
    // box takes ownership of exactly that allocation with the same layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Ok(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)))
    }
}

/// Types for which all-zero bytes are a valid value (std atomic integers).
///
/// # Safety
/// Implement only for types whose all-zero bit pattern is a valid value and
/// that are not zero-sized.
pub unsafe trait ZeroableAtomic {}
// SAFETY: an AtomicU64 of all-zero bytes is the value 0 (same layout as u64).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU64 {}
// SAFETY: an AtomicU32 of all-zero bytes is the value 0 (same layout as u32).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU32 {}
// SAFETY: an AtomicU16 of all-zero bytes is the value 0 (same layout as u16).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU16 {}
// SAFETY: an AtomicU8 of all-zero bytes is the value 0 (same layout as u8).
unsafe impl ZeroableAtomic for std::sync::atomic::AtomicU8 {}
