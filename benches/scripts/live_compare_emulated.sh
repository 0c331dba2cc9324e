#!/usr/bin/env bash
# Live policy comparisons with tier latency emulated in the guest
# (--emulate-latency, docs/emulation.md), each followed by the simulator on
# the same setup (sizes, tiers, one thread, run length, every page slow first).
# Working sets are the seeds' scaled down (Nomad 1/256, Colloid 1/512), and
# so is the cache model (llc=): a scaled working set must not fit a full-size
# last-level cache when the seeds' did not.
# Usage: [TIERVM=path] benches/scripts/live_compare_emulated.sh [seconds] [repeat] [outdir]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${TIERVM:-./target/release/tiervm}
[ -x "$T" ] || cargo build --release -q
SECS=${1:-6}
REP=${2:-3}
OUT=${3:-target/live-compare-emulated}
C=(compare --duration "${SECS}s" --repeat "$REP" --quiet --placement slow-first --policy-interval mtm=2s)
# Live samples come from hint faults, which see every page: the model's PEBS
# blind spot (Nomad's CXL platform) is off next to a live run. The live
# engine tracks and moves 4 KiB pages: so does colloid in the model here
# (--small-pages; the Colloid scenarios otherwise run HeMem's 2 MiB pages).
# The zipf image has no memset / warm-up round / sleep before it counts
# (the Nomad benchmark's initialization): --no-bench-init. The guest is one
# vCPU making 64-byte accesses, where the nomad-* scenarios model the
# micro-benchmark's one thread copying whole 4 KiB pages: --threads 1 --mlp 1
# --access-bytes 64. tiervm's sampler scans at a fixed rate, where Linux adapts
# its period: --fixed-scan-rate. The zipf image spreads its hot pages along
# the WSS, where the nomad-* scenarios replay Nomad's traces (hottest pages
# first): --scrambled-wss.
S=(sim --duration "$SECS" --threads 1 --mlp 1 --access-bytes 64 --fixed-scan-rate --scrambled-wss --scale 1 --start-slow --pebs-sees-all --small-pages --no-bench-init)
NOMAD=nomad-a,llc=256K
run() { # name, then the compare arguments
  local name=$1
  shift
  echo "== live: $name"
  $T "${C[@]}" "$@" --out "$OUT/$name"
}
sim() { # name, then the sim arguments
  echo "== sim: $1"
  shift
  $T "${S[@]}" "$@"
}
# Nomad's Zipf layouts (WSS/RSS 10/20, 13.5/27, 27/27 GB over 16 GB fast) scaled 1/256.
run zipf-small zipf --mem 256M --fast 64M --arg rss=80M --arg wss=40M --emulate-latency "$NOMAD"
sim zipf-small nomad-small-ro --rss-gib 0.078125 --wss-gib 0.0390625 --tier-capacity-gib 0.0625,0.25
run zipf-medium zipf --mem 256M --fast 64M --arg rss=108M --arg wss=54M --emulate-latency "$NOMAD"
sim zipf-medium nomad-medium-ro --rss-gib 0.10546875 --wss-gib 0.052734375 --tier-capacity-gib 0.0625,0.25
run zipf-large zipf --mem 256M --fast 64M --arg rss=108M --arg wss=108M --emulate-latency "$NOMAD"
sim zipf-large nomad-large-ro --rss-gib 0.10546875 --wss-gib 0.10546875 --tier-capacity-gib 0.0625,0.25
# Colloid's GUPS (72 GB, 24 GB hot at 90%, 32 GB default tier) scaled 1/512, on
# Colloid's testbed latencies, without and with the 1x antagonist (51% of the
# default tier's bandwidth).
run gups-0x gups --mem 256M --fast 64M --arg size=144M --arg hot_size=48M --emulate-latency colloid,llc=64K
sim gups-0x colloid-gups-0x --size-gib 0.140625 --hot-gib 0.046875 --tier-capacity-gib 0.0625,0.25
run gups-1x gups --mem 256M --fast 64M --arg size=144M --arg hot_size=48M --emulate-latency colloid,llc=64K,antagonist=fast:0.51
sim gups-1x colloid-gups-1x --size-gib 0.140625 --hot-gib 0.046875 --tier-capacity-gib 0.0625,0.25
# Nomad's Redis case 1 (YCSB-A, every page demoted first), kv scaled.
run kv kv --mem 512M --fast 64M --arg records=100000 --arg workload=a --emulate-latency "$NOMAD"
# The kv image does no protocol work: no Redis CPU time per request.
sim kv kv-ycsb-a --records 100000 --value-size 1024 --tier-capacity-gib 0.0625,0.5 --compute-ns-per-op 0
# Nomad's PageRank (2^26 vertices x 20, fast:RSS 16:22) scaled 1/256.
run pagerank pagerank --mem 512M --fast 20M --arg scale=18 --arg degree=20 --arg iterations=0 --emulate-latency "$NOMAD"
sim pagerank pagerank-u --graph-scale 18 --degree 20 --tier-capacity-gib 0.01953125,0.5
