//! Free-page pools: per tier, an area of `capacity` slots bound to the tier's
//! node. A slot holds a free page (`free`), is empty (`hole`), or is reserved
//! by a mover (neither). Allocation prefers contiguous slots so that runs move
//! with one range `UFFDIO_MOVE`.

/// Slot bitmap with run search.
#[derive(Debug, Clone)]
struct Bits {
    words: Vec<u64>,
    len: usize,
    count: usize,
}

impl Bits {
    fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(64)],
            len,
            count: 0,
        }
    }
    fn get(&self, i: usize) -> bool {
        self.words[i / 64] >> (i % 64) & 1 != 0
    }
    fn set(&mut self, i: usize) {
        debug_assert!(!self.get(i));
        self.words[i / 64] |= 1 << (i % 64);
        self.count += 1;
    }
    fn unset(&mut self, i: usize) {
        debug_assert!(self.get(i));
        self.words[i / 64] &= !(1 << (i % 64));
        self.count -= 1;
    }
    /// First index of a run of `n` set bits at or after `from` (wrapping once).
    fn find_run(&self, n: usize, from: usize) -> Option<usize> {
        self.find_run_in(n, from, self.len)
            .or_else(|| self.find_run_in(n, 0, from.min(self.len)))
    }
    fn find_run_in(&self, n: usize, from: usize, to: usize) -> Option<usize> {
        let mut i = from;
        let mut run_start = from;
        let mut run = 0usize;
        while i < to {
            let w = self.words[i / 64] >> (i % 64);
            if i.is_multiple_of(64) && w == u64::MAX && i + 64 <= to {
                if run == 0 {
                    run_start = i;
                }
                run += 64;
                i += 64;
            } else if i.is_multiple_of(64) && w == 0 {
                run = 0;
                i += 64;
            } else {
                if w & 1 != 0 {
                    if run == 0 {
                        run_start = i;
                    }
                    run += 1;
                } else {
                    run = 0;
                }
                i += 1;
            }
            if run >= n {
                return Some(run_start);
            }
        }
        None
    }
}

/// One tier's pool bookkeeping (the pages themselves live in the pool area).
#[derive(Debug, Clone)]
pub struct Pool {
    free: Bits,
    holes: Bits,
    cursor: usize,
}

/// What kind of slot to reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A slot holding a free page (a staging page or a page to map).
    Free,
    /// An empty slot (to receive a page).
    Hole,
}

impl Pool {
    /// A pool of `capacity` slots of which the first `free` hold pages.
    pub fn new(capacity: usize, free: usize) -> Self {
        let mut p = Self {
            free: Bits::new(capacity),
            holes: Bits::new(capacity),
            cursor: 0,
        };
        for i in 0..capacity {
            if i < free {
                p.free.set(i);
            } else {
                p.holes.set(i);
            }
        }
        p
    }

    /// Slots holding free pages.
    pub fn free_pages(&self) -> usize {
        self.free.count
    }

    /// Empty slots.
    pub fn holes(&self) -> usize {
        self.holes.count
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.free.len
    }

    /// Whether slot `i` holds a free page.
    pub fn is_free(&self, i: usize) -> bool {
        self.free.get(i)
    }

    /// Reserves `n` slots of `kind`, contiguous if possible. None if fewer than
    /// `n` are available (nothing is reserved then).
    pub fn reserve(&mut self, n: usize, kind: SlotKind) -> Option<Vec<u32>> {
        let bits = match kind {
            SlotKind::Free => &mut self.free,
            SlotKind::Hole => &mut self.holes,
        };
        if n == 0 {
            return Some(Vec::new());
        }
        if bits.count < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        if let Some(start) = bits.find_run(n, self.cursor.min(bits.len)) {
            for i in start..start + n {
                bits.unset(i);
                out.push(i as u32);
            }
            self.cursor = start + n;
            return Some(out);
        }
        let mut i = 0;
        while out.len() < n && i < bits.len {
            if bits.get(i) {
                bits.unset(i);
                out.push(i as u32);
            }
            i += 1;
        }
        Some(out)
    }

    /// Returns reserved slots as `kind` (what they hold now).
    pub fn release(&mut self, slots: &[u32], kind: SlotKind) {
        let bits = match kind {
            SlotKind::Free => &mut self.free,
            SlotKind::Hole => &mut self.holes,
        };
        for &s in slots {
            bits.set(s as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_prefers_runs_and_release_restores() {
        let mut p = Pool::new(200, 100);
        let a = p.reserve(3, SlotKind::Free).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        let h = p.reserve(64, SlotKind::Hole).unwrap();
        assert_eq!(h[0], 100);
        assert!(h.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(p.reserve(37, SlotKind::Hole).is_none());
        assert_eq!(p.holes(), 36);
        p.release(&a, SlotKind::Hole);
        p.release(&h, SlotKind::Free);
        assert_eq!(p.free_pages(), 97 + 64);
        assert_eq!(p.holes(), 39);
        // Fragmented: holes at 0..3 and 164..200; a 39-slot request still succeeds.
        let frag = p.reserve(39, SlotKind::Hole).unwrap();
        assert_eq!(frag.len(), 39);
        assert_eq!(p.holes(), 0);
    }
}
