#!/usr/bin/env bash
# Re-runs the rows of issue 29's table (the live engine at realistic sizes)
# and prints, per run: ops, ops/s, wall time, how the run ended, when the
# guest first progressed, and the vCPU time split (running / waiting for a
# CPU / blocked on the engine's faults, from the report's liveness section).
#
# Usage: benches/scripts/issue29_rows.sh [runs per row] [tiervm binary]
# The binary defaults to target/release/tiervm; pass another (an older
# build) to compare. Rows marked "busy" run with two busy loops on the
# host's cores, as the issue did. Timing depends on the host's load:
# compare binaries side by side in one invocation each, on an idle host.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-3}
T=${2:-target/release/tiervm}
[ -x "$T" ] || cargo build --release -q

busy_pids=()
busy_on() { for _ in 1 2; do sh -c 'while :; do :; done' & busy_pids+=($!); done; }
busy_off() { kill "${busy_pids[@]}" 2>/dev/null || true; wait "${busy_pids[@]}" 2>/dev/null || true; busy_pids=(); }
trap busy_off EXIT

row() {
  local name=$1 busy=$2; shift 2
  echo "== $name${busy:+ (busy host)}"
  [ -n "$busy" ] && busy_on
  for i in $(seq 1 "$N"); do
    local s e rc=0
    s=$(date +%s.%N)
    timeout 180 "$T" run "$@" --quiet --report json > /tmp/issue29_row.json 2>/tmp/issue29_row.err || rc=$?
    e=$(date +%s.%N)
    python3 - "$rc" "$s" "$e" <<'PY'
import json, sys
rc, s, e = sys.argv[1:]
try:
    d = json.load(open("/tmp/issue29_row.json"))
except Exception:
    print(f"  rc {rc}: {open('/tmp/issue29_row.err').read()[-200:]!r}")
    sys.exit()
tl = d["timeline"]
first = next((p["t_s"] for p in tl if p["ops"] > 0), None)
l = d.get("liveness")
live = ""
if l:
    live = (f" run/wait/blocked {l['vcpu_run_ms']:.0f}/{l['vcpu_wait_cpu_ms']:.0f}/{l['vcpu_blocked_ms']:.0f} ms"
            f" stalls {len(l['stalls'])}")
first_s = f"{first:.1f}" if first is not None else "never"
print(f"  rc {rc} ops {d['ops']:>11,} ({d['ops_per_sec'] / 1e6:.2f}M/s) wall {float(e) - float(s):.2f} s "
      f"{d['stop_reason']} first progress {first_s} s{live}")
PY
  done
  [ -n "$busy" ] && busy_off
  return 0
}

Z=(zipf --duration 3s --seed 5)
row "nomad, RSS 192M WSS 96M over 128M fast" busy "${Z[@]}" --mem 512M --fast 128M --placement slow-first --arg rss=192M --arg wss=96M --policy nomad
row "nomad, same, no busy loops" "" "${Z[@]}" --mem 512M --fast 128M --placement slow-first --arg rss=192M --arg wss=96M --policy nomad
row "adaptive, same, no busy loops" "" "${Z[@]}" --mem 512M --fast 128M --placement slow-first --arg rss=192M --arg wss=96M --policy adaptive
row "nomad, RSS 384M over 256M fast" "" "${Z[@]}" --mem 512M --fast 256M --placement slow-first --arg rss=384M --arg wss=384M --policy nomad
for p in static tpp nomad memtis colloid mtm adaptive; do
  row "$p, 1G RSS 192M over 128M fast" "" "${Z[@]}" --mem 1G --fast 128M --placement slow-first --arg rss=192M --arg wss=192M --policy "$p"
done
for p in static tpp nomad memtis colloid mtm adaptive; do
  row "$p, 1G RSS 768M over 128M fast" "" "${Z[@]}" --mem 1G --fast 128M --placement slow-first --arg rss=768M --arg wss=768M --policy "$p"
done
row "TPM chaos at the top rate, RSS 256M" "" zipf --mem 512M --fast 192M --arg rss=256M --arg wss=256M --arg theta=0 --policy chaos --chaos-rate 10000000 --chaos-mix 1:1 --mechanism tpm --chaos-unit 4k --duration 5s --seed 5
row "no migration, uniform 128M" "" zipf --mem 160M --fast 64M --arg rss=128M --arg wss=128M --arg theta=0 --duration 5s --seed 5
row "TPM chaos 10k 4 KiB pages/s, uniform 128M" "" zipf --mem 160M --fast 64M --arg rss=128M --arg wss=128M --arg theta=0 --policy chaos --chaos-rate 10000 --chaos-mix 1:1 --mechanism tpm --chaos-unit 4k --duration 5s --seed 5
