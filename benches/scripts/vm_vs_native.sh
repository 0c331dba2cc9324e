#!/usr/bin/env bash
# Zipf ops/s inside a tiervm VM versus the same workload code on a host thread,
# measured in alternating pairs (VM, native, VM, native, ...) so machine noise
# hits both sides alike. Usage: benches/scripts/vm_vs_native.sh [pairs] [seconds]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=./target/release/tiervm
[ -x "$T" ] || cargo build --release -q
PAIRS=${1:-3}
SECS=${2:-5}
ops() { python3 -c "import json,sys; print(json.load(sys.stdin)['ops_per_sec'])"; }
for ws in 2M 512M; do
  args=(--arg rss=$ws --arg wss=$ws --arg theta=0.99 --arg write_ratio=0.5 --arg stride=8)
  mem=$([ "$ws" = 2M ] && echo 64M || echo 1G)
  vm=(); nat=()
  for _ in $(seq "$PAIRS"); do
    vm+=("$($T run zipf --mem "$mem" --duration "${SECS}s" --report json "${args[@]}" 2>/dev/null | ops)")
    nat+=("$($T native zipf --duration "${SECS}s" --report json "${args[@]}" 2>/dev/null | ops)")
  done
  python3 - "$ws" "${vm[*]}" "${nat[*]}" <<'PY'
import sys, statistics as st
ws, vm, nat = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ratios = [v / n for v, n in zip(vm, nat)]
print(f"wss={ws}: vm {st.median(vm)/1e6:.2f} Mops/s, native {st.median(nat)/1e6:.2f} Mops/s, "
      f"ratio median {st.median(ratios):.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)})")
PY
done
