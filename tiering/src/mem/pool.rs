//! A tier's pool area: page-sized [`Slot`]s bound to the tier's NUMA node,
//! where staging pages are made (a write into a hole allocates a fresh page
//! on the node) and where freed pages are cached for reuse, up to a bound.
//!
//! The pool is bookkeeping only; capacity accounting is separate
//! ([`super::account`]). A slot is a *hole* (no page), *cached* (a free
//! resident page with stale content), or reserved by a mover. The area has
//! two halves:
//! - the **huge half** (`MADV_HUGEPAGE`) is cut into 2 MiB chunks that are
//!   only ever used whole, so their page tables stay empty and a 2 MiB run
//!   moves in and out as one transparent huge page. A chunk through which 4
//!   KiB pages went (a huge page could not be allocated) is *tainted*: still
//!   usable whole, but used last;
//! - the **small half** (`MADV_NOHUGEPAGE`) holds single pages. It must not
//!   get huge pages: splitting one would make the kernel (Linux 6.12+) map
//!   its zero-filled parts to the shared zero page, which a move would then
//!   carry into guest RAM.
//!
//! The bookkeeping is a hint the kernel has the last word on: a move into a
//! slot believed to be a hole that fails with `EEXIST` marks the slot cached
//! (see [`Pool::found_occupied`]), so a wrong entry costs a retry, never a
//! page.

use crate::sys::PAGE_SIZE;

/// Slots in one 2 MiB chunk.
pub const CHUNK_SLOTS: usize = 512;

/// A page-sized place in one tier's pool area (an index into it). Not a
/// guest page: the two cannot be mixed up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub(crate) u32);

impl Slot {
    /// Index in the pool area.
    pub fn index(self) -> usize {
        self.0 as usize
    }
    /// Byte offset in the pool area.
    pub fn offset(self) -> usize {
        self.index() * PAGE_SIZE
    }
}

/// What a slot holds when it is not reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// No page (a move destination, or a fresh page once written).
    Hole,
    /// A free resident page with stale content (reusable as staging).
    Cached,
}

/// Bitmap with run search.
#[derive(Debug, Clone)]
struct Bits {
    words: Vec<u64>,
    count: usize,
}

impl Bits {
    fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(64)],
            count: 0,
        }
    }
    /// `len` (a multiple of 64) bits, all set.
    fn full(len: usize) -> Self {
        debug_assert!(len.is_multiple_of(64));
        Self {
            words: vec![u64::MAX; len / 64],
            count: len,
        }
    }
    fn get(&self, i: usize) -> bool {
        self.words[i / 64] >> (i % 64) & 1 != 0
    }
    fn set(&mut self, i: usize) {
        if !self.get(i) {
            self.words[i / 64] |= 1 << (i % 64);
            self.count += 1;
        }
    }
    fn unset(&mut self, i: usize) {
        if self.get(i) {
            self.words[i / 64] &= !(1 << (i % 64));
            self.count -= 1;
        }
    }
    /// Up to `n` set bits, taken (unset): the first contiguous run of `n`
    /// at or after `from` (wrapping to the runs before it) when there is
    /// one, else the lowest set bits in ascending order.
    fn take(&mut self, n: usize, from: usize) -> Vec<usize> {
        let len = self.words.len() * 64;
        let mut out = Vec::with_capacity(n);
        if n == 0 || self.count == 0 {
            return out;
        }
        if let Some(start) = self.find_run(n, from % len.max(1)) {
            for i in start..start + n {
                self.unset(i);
                out.push(i);
            }
            return out;
        }
        let mut i = 0;
        while out.len() < n && i < len {
            let w = self.words[i / 64];
            if i % 64 == 0 && w == 0 {
                i += 64;
                continue;
            }
            if self.get(i) {
                self.unset(i);
                out.push(i);
            }
            i += 1;
        }
        out
    }
    fn find_run(&self, n: usize, from: usize) -> Option<usize> {
        let len = self.words.len() * 64;
        self.find_run_in(n, from, len)
            .or_else(|| self.find_run_in(n, 0, from.min(len)))
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
    /// Chunks in the huge half (the small half has as many chunks' worth of slots).
    chunks: usize,
    /// Holes of the small half (slot indices from `chunks * CHUNK_SLOTS`).
    small_holes: Bits,
    /// Cached pages of the small half.
    small_cached: Bits,
    /// Empty huge chunks, clean (page table empty) and tainted.
    huge_holes: [Vec<u32>; 2],
    /// Huge chunks holding one cached 2 MiB page, clean and tainted.
    huge_cached: [Vec<u32>; 2],
    cursor: usize,
}

impl Pool {
    /// A pool with a huge half of at least `slots` slots (whole chunks) and
    /// a small half of as many; all holes.
    pub fn new(slots: usize) -> Self {
        let chunks = slots.div_ceil(CHUNK_SLOTS).max(1);
        Self {
            chunks,
            small_holes: Bits::full(chunks * CHUNK_SLOTS),
            small_cached: Bits::new(chunks * CHUNK_SLOTS),
            huge_holes: [(0..chunks as u32).rev().collect(), Vec::new()],
            huge_cached: [Vec::new(), Vec::new()],
            cursor: 0,
        }
    }

    /// Slots of the huge half (the area is twice this long).
    pub fn half_slots(&self) -> usize {
        self.chunks * CHUNK_SLOTS
    }

    /// Total slots (both halves).
    pub fn slots(&self) -> usize {
        2 * self.half_slots()
    }

    /// Cached (free, resident) pages.
    pub fn cached_pages(&self) -> usize {
        self.small_cached.count
            + (self.huge_cached[0].len() + self.huge_cached[1].len()) * CHUNK_SLOTS
    }

    /// Huge chunks not reserved.
    pub fn huge_chunks(&self) -> usize {
        self.huge_holes
            .iter()
            .chain(&self.huge_cached)
            .map(Vec::len)
            .sum()
    }

    fn small_slot(&self, i: usize) -> Slot {
        Slot((self.half_slots() + i) as u32)
    }

    fn small_index(&self, s: Slot) -> Option<usize> {
        s.index().checked_sub(self.half_slots())
    }

    /// Reserves `n` single-page slots of the small half, cached pages first
    /// when `prefer` is `Cached`, holes first when it is `Hole`, the other
    /// kind after that. Returns the slots with what each holds, or `None`
    /// (nothing reserved) when fewer than `n` are left.
    pub fn reserve_pages(&mut self, n: usize, prefer: Holds) -> Option<Vec<(Slot, Holds)>> {
        if self.small_holes.count + self.small_cached.count < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        let order = match prefer {
            Holds::Cached => [Holds::Cached, Holds::Hole],
            Holds::Hole => [Holds::Hole, Holds::Cached],
        };
        for kind in order {
            let want = n - out.len();
            let bits = match kind {
                Holds::Hole => &mut self.small_holes,
                Holds::Cached => &mut self.small_cached,
            };
            let got = bits.take(want, self.cursor);
            if let Some(&last) = got.last() {
                self.cursor = last + 1;
            }
            let half = self.half_slots();
            out.extend(got.into_iter().map(|i| (Slot((half + i) as u32), kind)));
        }
        Some(out)
    }

    /// Reserves a whole huge chunk (its first slot), a cached one first when
    /// `prefer` is `Cached`, clean chunks before tainted ones. `None` when no
    /// huge chunk is left.
    pub fn reserve_chunk(&mut self, prefer: Holds) -> Option<(Slot, Holds)> {
        let kinds = match prefer {
            Holds::Cached => [Holds::Cached, Holds::Hole],
            Holds::Hole => [Holds::Hole, Holds::Cached],
        };
        for taint in 0..2 {
            for kind in kinds {
                let list = match kind {
                    Holds::Hole => &mut self.huge_holes[taint],
                    Holds::Cached => &mut self.huge_cached[taint],
                };
                if let Some(c) = list.pop() {
                    return Some((Slot(c * CHUNK_SLOTS as u32), kind));
                }
            }
        }
        None
    }

    /// Returns reserved single-page slots, each holding what `holds` says now.
    pub fn release_pages(&mut self, slots: &[Slot], holds: Holds) {
        for &s in slots {
            let Some(i) = self.small_index(s) else {
                debug_assert!(false, "page slot {s:?} in the huge half");
                continue;
            };
            match holds {
                Holds::Hole => {
                    self.small_cached.unset(i);
                    self.small_holes.set(i)
                }
                Holds::Cached => {
                    self.small_holes.unset(i);
                    self.small_cached.set(i)
                }
            }
        }
    }

    /// Returns a reserved huge chunk (by its first slot), holding `holds`
    /// in every slot. `still_huge`: only whole huge pages went through it
    /// (its page table is still empty); otherwise it is tainted from now on.
    pub fn release_chunk(&mut self, first: Slot, holds: Holds, still_huge: bool) {
        let c = (first.index() / CHUNK_SLOTS) as u32;
        let taint = usize::from(!still_huge);
        match holds {
            Holds::Hole => self.huge_holes[taint].push(c),
            Holds::Cached => self.huge_cached[taint].push(c),
        }
    }

    /// A move into `slot` (a reserved single-page slot, believed a hole)
    /// failed because a page is there: from now on it counts as cached.
    /// Self-healing of the bookkeeping; the caller picks another hole.
    pub fn found_occupied(&mut self, slot: Slot) {
        if let Some(i) = self.small_index(slot) {
            self.small_holes.unset(i);
            self.small_cached.set(i);
        }
    }

    /// Reserves cached pages beyond `keep` for the caller to discard:
    /// single-page slots, and huge chunks with whether each is still huge
    /// (clean). Release them as holes after discarding, each chunk with its
    /// flag: a discard empties a tainted chunk's page table but does not
    /// free it, so the chunk stays tainted.
    pub fn take_excess_cache(&mut self, keep: usize) -> (Vec<Slot>, Vec<(Slot, bool)>) {
        let mut chunks = Vec::new();
        for taint in [1, 0] {
            while self.cached_pages() > keep {
                let Some(c) = self.huge_cached[taint].pop() else {
                    break;
                };
                chunks.push((Slot(c * CHUNK_SLOTS as u32), taint == 0));
            }
        }
        let excess = self.cached_pages().saturating_sub(keep);
        let pages = self
            .small_cached
            .take(excess, 0)
            .into_iter()
            .map(|i| self.small_slot(i))
            .collect();
        (pages, chunks)
    }

    /// Whether unreserved huge chunk `first` (its first slot) is tainted;
    /// `None` when it is reserved or not a chunk's first slot.
    #[cfg(test)]
    pub fn chunk_tainted(&self, first: Slot) -> Option<bool> {
        if !first.index().is_multiple_of(CHUNK_SLOTS) || first.index() >= self.half_slots() {
            return None;
        }
        let c = (first.index() / CHUNK_SLOTS) as u32;
        (0..2)
            .find(|&t| self.huge_holes[t].contains(&c) || self.huge_cached[t].contains(&c))
            .map(|t| t == 1)
    }

    /// Whether unreserved slot `slot` holds a cached page per the bookkeeping.
    #[cfg(test)]
    pub fn is_cached(&self, slot: Slot) -> bool {
        match self.small_index(slot) {
            Some(i) => self.small_cached.get(i),
            None => {
                let c = (slot.index() / CHUNK_SLOTS) as u32;
                self.huge_cached.iter().any(|l| l.contains(&c))
            }
        }
    }

    /// The slots the bookkeeping calls holes (both halves, a hole chunk as
    /// its 512 slots), in no particular order.
    pub fn holes(&self) -> impl Iterator<Item = Slot> + '_ {
        let small = (0..self.half_slots())
            .filter(|&i| self.small_holes.get(i))
            .map(|i| self.small_slot(i));
        let chunks = self.huge_holes.iter().flatten().flat_map(|&c| {
            let first = c * CHUNK_SLOTS as u32;
            (first..first + CHUNK_SLOTS as u32).map(Slot)
        });
        small.chain(chunks)
    }

    /// Slots not reserved right now (holes + cached, both halves).
    pub fn unreserved_slots(&self) -> usize {
        self.small_holes.count + self.small_cached.count + self.huge_chunks() * CHUNK_SLOTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `Bits::take` as its contract says, on a plain vector: the first run
    /// of `n` set bits at or after `from` (wrapping to the runs before
    /// it), else the lowest set bits; what it returns is unset.
    fn model_take(bits: &mut [bool], n: usize, from: usize) -> Vec<usize> {
        let len = bits.len();
        if n == 0 || !bits.contains(&true) {
            return Vec::new();
        }
        let f = from % len;
        let run_in = |lo: usize, hi: usize| {
            (lo..hi).find(|&s| s + n <= hi && bits[s..s + n].iter().all(|&b| b))
        };
        let out: Vec<usize> = match run_in(f, len).or_else(|| run_in(0, f)) {
            Some(s) => (s..s + n).collect(),
            None => (0..len).filter(|&i| bits[i]).take(n).collect(),
        };
        for &i in &out {
            bits[i] = false;
        }
        out
    }

    /// Words of bits that hold whole-word runs, empty words and scattered
    /// bits (the three paths of `find_run_in` and of `take`'s fallback).
    fn words() -> impl Strategy<Value = Vec<u64>> {
        let word = prop_oneof![
            Just(0u64),
            Just(u64::MAX),
            any::<u64>(),
            (0u32..64, 1u32..64).prop_map(|(a, k)| (u64::MAX >> (64 - k)) << a),
        ];
        proptest::collection::vec(word, 1..5)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, max_shrink_iters: 256, .. ProptestConfig::default() })]
        /// A sequence of takes from one bitmap matches the model: the same
        /// bits, in the same order, and the same count left.
        #[test]
        fn bits_take_matches_its_model(
            w in words(),
            takes in proptest::collection::vec((0usize..200, 0usize..600), 1..6),
        ) {
            let mut bits = Bits::new(w.len() * 64);
            let mut model = vec![false; w.len() * 64];
            for (i, m) in model.iter_mut().enumerate() {
                if w[i / 64] >> (i % 64) & 1 != 0 {
                    bits.set(i);
                    *m = true;
                }
            }
            for (n, from) in takes {
                let want = model_take(&mut model, n, from);
                let got = bits.take(n, from);
                prop_assert_eq!(&got, &want, "take({}, {})", n, from);
                prop_assert_eq!(bits.count, model.iter().filter(|&&b| b).count());
            }
        }
    }

    /// A take with no run of `n` that empties a word part way keeps going
    /// into the next word (an emptied word is skipped only from its start).
    #[test]
    fn a_take_without_a_run_goes_on_past_a_word_it_emptied() {
        let mut bits = Bits::new(256);
        for i in [0, 1, 2, 3, 64, 65, 66, 67, 200] {
            bits.set(i);
        }
        assert_eq!(bits.take(9, 100), vec![0, 1, 2, 3, 64, 65, 66, 67, 200]);
        assert_eq!(bits.count, 0);
    }

    #[test]
    fn pages_come_from_the_small_half_and_prefer_runs() {
        let mut p = Pool::new(3 * CHUNK_SLOTS);
        assert_eq!(p.huge_chunks(), 3);
        let a = p.reserve_pages(3, Holds::Cached).unwrap();
        assert_eq!(p.huge_chunks(), 3, "pages never take huge chunks");
        assert!(a
            .iter()
            .all(|(s, h)| *h == Holds::Hole && s.index() >= p.half_slots()));
        assert!(a.windows(2).all(|w| w[1].0 .0 == w[0].0 .0 + 1));
        p.release_pages(&a.iter().map(|x| x.0).collect::<Vec<_>>(), Holds::Cached);
        assert_eq!(p.cached_pages(), 3);
        let b = p.reserve_pages(2, Holds::Cached).unwrap();
        assert!(b.iter().all(|(_, h)| *h == Holds::Cached));
        let c = p.reserve_pages(2, Holds::Hole).unwrap();
        assert!(c.iter().all(|(_, h)| *h == Holds::Hole));
        assert!(p.reserve_pages(3 * CHUNK_SLOTS, Holds::Hole).is_none());
    }

    #[test]
    fn chunks_are_used_whole_and_tainted_ones_last() {
        let mut p = Pool::new(2 * CHUNK_SLOTS);
        let (c0, h) = p.reserve_chunk(Holds::Cached).unwrap();
        assert_eq!(h, Holds::Hole);
        p.release_chunk(c0, Holds::Cached, true);
        assert_eq!(p.cached_pages(), CHUNK_SLOTS);
        let (c1, h) = p.reserve_chunk(Holds::Cached).unwrap();
        assert_eq!((c1, h), (c0, Holds::Cached));
        // A 4 KiB fallback went through it: tainted, handed out last.
        p.release_chunk(c1, Holds::Hole, false);
        let (c2, _) = p.reserve_chunk(Holds::Hole).unwrap();
        assert_ne!(c2, c1, "the clean chunk first");
        let (c3, _) = p.reserve_chunk(Holds::Hole).unwrap();
        assert_eq!(c3, c1);
        assert!(p.reserve_chunk(Holds::Hole).is_none());
        assert_eq!(p.unreserved_slots(), 2 * CHUNK_SLOTS, "the small half");
    }

    #[test]
    fn an_occupied_hole_heals_into_a_cached_page() {
        let mut p = Pool::new(CHUNK_SLOTS);
        let s = p.reserve_pages(1, Holds::Hole).unwrap()[0].0;
        p.found_occupied(s);
        assert!(p.is_cached(s));
        assert_eq!(p.cached_pages(), 1);
        assert_eq!(p.unreserved_slots(), p.slots());
    }

    #[test]
    fn excess_cache_is_handed_out_for_discard() {
        let mut p = Pool::new(2 * CHUNK_SLOTS);
        let (c, _) = p.reserve_chunk(Holds::Hole).unwrap();
        p.release_chunk(c, Holds::Cached, true);
        let pages: Vec<Slot> = p
            .reserve_pages(10, Holds::Hole)
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect();
        p.release_pages(&pages, Holds::Cached);
        assert_eq!(p.cached_pages(), CHUNK_SLOTS + 10);
        let (small, huge) = p.take_excess_cache(4);
        assert_eq!(huge, [(c, true)]);
        assert_eq!(small.len(), 6);
        assert_eq!(p.cached_pages(), 4);
        // Exactly what is kept: nothing taken, not even a chunk.
        p.release_chunk(c, Holds::Cached, false);
        assert_eq!(p.take_excess_cache(CHUNK_SLOTS + 4), (vec![], vec![]));
        // A tainted chunk is taken (before a clean one) with its taint.
        let (d, _) = p.reserve_chunk(Holds::Hole).unwrap();
        p.release_chunk(d, Holds::Cached, true);
        let (_, huge) = p.take_excess_cache(4 + CHUNK_SLOTS);
        assert_eq!(huge, [(c, false)]);
        p.release_chunk(c, Holds::Hole, false);
        assert_eq!(p.chunk_tainted(c), Some(true));
        assert_eq!(p.chunk_tainted(d), Some(false));
    }

    /// Pages are handed out next-fit: the search starts after the last
    /// slot handed out, so a slot just given back is not the next one while
    /// others are free.
    #[test]
    fn pages_are_handed_out_next_fit() {
        let mut p = Pool::new(CHUNK_SLOTS);
        let a = p.reserve_pages(1, Holds::Hole).unwrap()[0].0;
        p.release_pages(&[a], Holds::Hole);
        let b = p.reserve_pages(1, Holds::Hole).unwrap()[0].0;
        assert_eq!(b.index(), a.index() + 1);
    }

    #[test]
    fn holes_are_the_unreserved_empty_slots_of_both_halves() {
        let mut p = Pool::new(2 * CHUNK_SLOTS);
        let count = |p: &Pool| p.holes().count();
        assert_eq!(count(&p), p.slots(), "a new pool is all holes");
        let (c, _) = p.reserve_chunk(Holds::Hole).unwrap();
        let pages: Vec<Slot> = p
            .reserve_pages(3, Holds::Hole)
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect();
        assert_eq!(count(&p), p.slots() - CHUNK_SLOTS - 3);
        assert!(p.holes().all(|h| h != c && !pages.contains(&h)));
        p.release_pages(&pages[..1], Holds::Cached);
        p.release_pages(&pages[1..], Holds::Hole);
        p.release_chunk(c, Holds::Cached, true);
        assert_eq!(count(&p), p.slots() - CHUNK_SLOTS - 1);
        assert!(p
            .holes()
            .all(|h| h != pages[0] && h.index() / CHUNK_SLOTS != c.index() / CHUNK_SLOTS));
        let mut seen: Vec<Slot> = p.holes().collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), count(&p), "each hole once");
    }
}
