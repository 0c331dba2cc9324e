#!/usr/bin/env bash
# Guest stall of TPP (fault-path stop-and-copy promotion) against Nomad
# (asynchronous transactional promotion) when thrashing: a 192M read-only
# zipf working set over a 16M fast tier, every page starting slow. This was
# a timed test (tests/policies.rs); it is a measurement, so it lives here.
# Usage: benches/scripts/tpp_vs_nomad_stall.sh [seconds] [repeat] [outdir]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=./target/release/tiervm
[ -x "$T" ] || cargo build --release -q
SECS=${1:-6}
REP=${2:-3}
OUT=${3:-target/tpp-vs-nomad}
$T compare zipf --policies tpp,nomad --repeat "$REP" --duration "${SECS}s" --quiet \
  --mem 512M --fast 16M --slow 640M --placement slow-first \
  --tracking hint-faults --tracking-budget 25 \
  --arg rss=192M --arg wss=192M --arg theta=0.6 --arg write_ratio=0 --out "$OUT"
