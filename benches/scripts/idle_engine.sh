#!/usr/bin/env bash
# Cost of the idle engine: the same tiered VM with policy static, hint-fault
# tracking on versus off, in alternating pairs. Prints ops/s and the ratio.
# Usage: benches/scripts/idle_engine.sh [pairs] [seconds]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=./target/release/tiervm
[ -x "$T" ] || cargo build --release -q
PAIRS=${1:-3}
SECS=${2:-5}
A=(zipf --mem 512M --fast 256M --policy static --duration "${SECS}s" --report json
   --arg rss=192M --arg wss=192M --arg write_ratio=0.2)
ops() { python3 -c "import json,sys; r=json.load(sys.stdin); print(r['ops_per_sec'], r['tracking']['hint_faults'], r['tracking']['tracking_overhead_pct'])"; }
for i in $(seq "$PAIRS"); do
  # Alternate which side runs first, so order effects cancel out.
  if [ $((i % 2)) -eq 1 ]; then
    off=$($T run "${A[@]}" --tracking off 2>/dev/null | ops)
    on=$($T run "${A[@]}" --tracking hint-faults 2>/dev/null | ops)
  else
    on=$($T run "${A[@]}" --tracking hint-faults 2>/dev/null | ops)
    off=$($T run "${A[@]}" --tracking off 2>/dev/null | ops)
  fi
  python3 - "$off" "$on" <<'PY'
import sys
off, on = sys.argv[1].split(), sys.argv[2].split()
print(f"off {float(off[0])/1e6:.3f} Mops/s | on {float(on[0])/1e6:.3f} Mops/s "
      f"({on[1]} hint faults, measured overhead {float(on[2]):.2f}%) | ratio on/off {float(on[0])/float(off[0]):.3f}")
PY
done
