//! The tiers' unloaded latency, measured: a dependent pointer chase over a
//! buffer on each tier's NUMA node, larger than the host's last-level
//! cache, once at engine start. Tiers on one node share one measurement,
//! so their gap is exactly zero: the same DRAM is the same speed.
//!
//! Policies that value a move by the latency it saves (`adaptive`) read it
//! through [`crate::policy::TierStatus::unloaded_latency_ns`]; with latency
//! emulation the emulated tiers' latencies replace it.

use std::io;
use std::time::Instant;

use serde::Serialize;

use crate::sys::NodeBuffer;

/// Bytes chased per node: twice the 32 MiB last-level cache of our hosts,
/// so most loads miss it.
pub const CHASE_BYTES: usize = 64 << 20;
/// One load per cache line.
const LINE_WORDS: usize = 64 / std::mem::size_of::<u64>();
/// Loads per round, and rounds (the median is kept): 5 x 40k loads, about
/// 60 ms per node at the 296 ns a load takes under PVM here, plus filling
/// the buffer.
const ROUND_LOADS: usize = 40_000;
const ROUNDS: usize = 5;

/// Where a run's unloaded tier latencies came from, for reports.
pub const MEASURED_SOURCE: &str =
    "measured: pointer chase over 64 MiB on each tier's NUMA node at engine start";

/// The unloaded latency of every tier, measured once per distinct node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnloadedLatency {
    /// Per tier (fastest first), ns.
    pub per_tier_ns: Vec<f64>,
    /// Per tier, its NUMA node.
    pub nodes: Vec<u32>,
    /// How they were obtained ([`MEASURED_SOURCE`]).
    pub source: &'static str,
}

/// Measures the nodes of the tiers (`nodes[t]` is tier `t`'s node).
pub fn measure(nodes: &[u32]) -> io::Result<UnloadedLatency> {
    let mut seen: Vec<(u32, f64)> = Vec::new();
    let mut per_tier_ns = Vec::with_capacity(nodes.len());
    for &node in nodes {
        let ns = match seen.iter().find(|(n, _)| *n == node) {
            Some(&(_, ns)) => ns,
            None => {
                let ns = measure_node(node)?;
                seen.push((node, ns));
                ns
            }
        };
        per_tier_ns.push(ns);
    }
    Ok(UnloadedLatency {
        per_tier_ns,
        nodes: nodes.to_vec(),
        source: MEASURED_SOURCE,
    })
}

/// Nanoseconds per dependent load from memory of `node` (median of rounds).
pub fn measure_node(node: u32) -> io::Result<f64> {
    let mut buf = NodeBuffer::on_node(CHASE_BYTES, node)
        .map_err(|e| io::Error::new(e.kind(), format!("a latency probe on node {node}: {e}")))?;
    let words = buf.words_mut();
    link_random_cycle(words, 0x9e37_79b9_7f4a_7c15);
    let mut at = 0usize;
    at = chase(words, at, ROUND_LOADS / 4); // warm the TLB and the walk
    let mut rounds = [0.0f64; ROUNDS];
    for r in &mut rounds {
        let t = Instant::now();
        at = chase(words, at, ROUND_LOADS);
        *r = t.elapsed().as_nanos() as f64 / ROUND_LOADS as f64;
    }
    std::hint::black_box(at);
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[ROUNDS / 2])
}

/// Links the first word of every cache line into one cycle in a random
/// order (Sattolo's shuffle), each holding the index of the next.
fn link_random_cycle(words: &mut [u64], seed: u64) {
    let lines = words.len() / LINE_WORDS;
    if lines == 0 {
        return;
    }
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut x = seed | 1;
    for i in (1..lines).rev() {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % i as u64) as usize;
        order.swap(i, j);
    }
    // Sattolo's shuffle gives a single cycle: line l's successor is order[l].
    for (l, &next) in order.iter().enumerate() {
        if let Some(w) = words.get_mut(l * LINE_WORDS) {
            *w = u64::from(next) * LINE_WORDS as u64;
        }
    }
}

/// Follows `loads` links from word `at`; returns where it ended.
fn chase(words: &[u64], mut at: usize, loads: usize) -> usize {
    for _ in 0..loads {
        at = words.get(at).map_or(0, |&w| w as usize);
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_links_form_one_cycle_through_every_line() {
        let mut w = vec![0u64; 1000 * LINE_WORDS];
        link_random_cycle(&mut w, 42);
        let mut at = 0usize;
        let mut seen = vec![false; 1000];
        for _ in 0..1000 {
            assert!(
                !seen[at / LINE_WORDS],
                "line {} visited twice",
                at / LINE_WORDS
            );
            seen[at / LINE_WORDS] = true;
            at = chase(&w, at, 1);
            assert_eq!(at % LINE_WORDS, 0);
        }
        assert_eq!(at, 0, "back at the start after every line");
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn tiers_on_one_node_share_one_measurement_and_a_zero_gap() {
        let u = measure(&[0, 0]).expect("node 0");
        assert_eq!(u.per_tier_ns[0], u.per_tier_ns[1]);
        // A DRAM load missing every cache: tens to hundreds of ns (a
        // cache-resident chase would read 1-5 ns).
        assert!(
            (10.0..2000.0).contains(&u.per_tier_ns[0]),
            "{:?}",
            u.per_tier_ns
        );
    }
}
