//! A private buffer on one NUMA node, for measuring how fast that node's
//! memory answers (`engine::unloaded_latency`): an anonymous [`Mapping`] of
//! its own, bound to the node, that no other code can reach, lent out as a
//! `&mut [u64]`.

use std::io;

use super::{Advice, Mapping};

/// An anonymous mapping bound to one NUMA node, owned by this value alone.
#[derive(Debug)]
pub struct NodeBuffer {
    map: Mapping,
}

impl NodeBuffer {
    /// Reserves `len` bytes (rounded up to 2 MiB) whose pages come from
    /// `node` when first written (`mbind(MPOL_BIND)`), eligible for huge
    /// pages where the host allows them.
    pub fn on_node(len: usize, node: u32) -> io::Result<Self> {
        let map = Mapping::reserve(len)?;
        map.mbind(map.addr(), map.len(), &[node])?;
        // Huge pages keep TLB misses out of a latency measurement; a host
        // without THP still gives a measurement (with page walks in it).
        let _ = map.advise(map.addr(), map.len(), Advice::HugePage);
        Ok(Self { map })
    }

    /// The buffer as words (zero until written).
    pub fn words_mut(&mut self) -> &mut [u64] {
        let words = self.map.len() / std::mem::size_of::<u64>();
        // SAFETY: `map` is a read/write anonymous mapping of `map.len()`
        // bytes, 2 MiB aligned (so aligned for u64), created by `on_node`
        // and reachable only through this value: no guest, device, other
        // thread or other handle can read or write it. It stays mapped
        // until `self` drops, and the slice borrows `self` mutably, so it is
        // the only reference while it lives. Untouched anonymous pages read
        // as zero, a valid u64.
        unsafe { std::slice::from_raw_parts_mut(self.map.addr() as *mut u64, words) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_buffer_reads_zero_and_keeps_what_is_written() {
        let mut b = NodeBuffer::on_node(3 << 20, 0).expect("node 0 exists");
        let w = b.words_mut();
        assert_eq!(w.len(), (4 << 20) / 8, "rounded up to 2 MiB");
        assert!(w.iter().step_by(4096).all(|&x| x == 0));
        let last = w.len() - 1;
        w[0] = 7;
        w[last] = 9;
        assert_eq!((b.words_mut()[0], b.words_mut()[last]), (7, 9));
    }

    #[test]
    fn a_node_that_does_not_exist_is_refused_with_its_number() {
        let e = NodeBuffer::on_node(2 << 20, 63).expect_err("node 63");
        assert!(e.to_string().contains("63"), "{e}");
    }
}
