#!/usr/bin/env bash
# Live policy comparison on this host (tier latency emulated on one NUMA node):
# zipf small/medium/large layouts scaled to a 64M fast tier, gups and kv.
# Usage: benches/scripts/live_compare.sh [seconds] [repeat] [outdir]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=./target/release/tiervm
[ -x "$T" ] || cargo build --release -q
SECS=${1:-6}
REP=${2:-1}
OUT=${3:-target/live-compare}
# mtm's profiling interval is 10 s in the paper; these runs last seconds, so
# it runs at 2 s (its migration budget keeps the paper's 20 MB/s rate).
C=(compare --duration "${SECS}s" --repeat "$REP" --quiet --placement slow-first --policy-interval mtm=2s)
# Nomad's layouts (WSS/RSS 10/20, 13.5/27, 27/27 GB over a 16 GB fast tier) scaled 1/256:
# 40/80, 54/108, 108/108 MB over a 64 MB fast tier; every page starts slow (slow-first), like the seeds' pre-demoted runs.
$T "${C[@]}" zipf --mem 256M --fast 64M --arg rss=80M --arg wss=40M --out "$OUT/zipf-small"
$T "${C[@]}" zipf --mem 256M --fast 64M --arg rss=108M --arg wss=54M --out "$OUT/zipf-medium"
$T "${C[@]}" zipf --mem 256M --fast 64M --arg rss=108M --arg wss=108M --out "$OUT/zipf-large"
# Colloid's GUPS scaled 1/512: 144 MB buffer, 48 MB hot at 90%, 64 MB default tier.
$T "${C[@]}" gups --mem 256M --fast 64M --arg size=144M --arg hot_size=48M --out "$OUT/gups"
$T "${C[@]}" kv --mem 512M --fast 64M --arg records=100000 --arg workload=a --out "$OUT/kv"
