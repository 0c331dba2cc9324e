#!/usr/bin/env python3
"""Measures the simulator's unit costs with the live engine (#12 item 6).

Runs the zipf image live, every page slow first, 1 vCPU, under
  - tpp (every promotion on the fault path: stop-and-copy while the vCPU waits):
    guest_stall_ms / guest_stalls = one fault-path promotion as the vCPU sees it,
    hint fault included;
  - nomad (hint faults never migrate; promotions are TPM in the engine):
    hint_stall_ms / hint_faults = one hint fault as the vCPU sees it;
    guest_stall_ms / guest_stalls = one TPM abort's put-back stall (when any);
and prints the medians next to the constants tiering/src/sim/model.rs uses for
`tiervm sim --costs measured` (MEASURED_*). The batched TPM page cost comes from
the criterion bench (`cargo bench -p tiervm-benches --bench mechanisms`), not from
here: the live report does not time the engine's copies.

Everything printed is MEASURED on this host (real KVM; under PVM a fault exits to
the host, which is why faults cost tens of microseconds here).

Usage: python3 benches/scripts/calibrate_sim.py [--runs 3] [--secs 4] [--tiervm PATH]
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ZIPF = ["zipf", "--mem", "512M", "--fast", "64M", "--arg", "rss=108M", "--arg", "wss=54M",
        "--placement", "slow-first", "--vcpus", "1"]


def run(tiervm, policy, secs):
    cmd = [tiervm, "run", *ZIPF, "--policy", policy, "--duration", f"{secs}s", "--report", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 120)
    if p.returncode != 0:
        sys.exit(f"calibrate_sim: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def per(total_ms, count):
    return total_ms * 1e6 / count if count else None


def constants():
    src = (ROOT / "tiering/src/sim/model.rs").read_text()
    return {m[0]: float(m[1].replace("_", "")) for m in
            re.findall(r"pub const (MEASURED_\w+): f64 = ([\d_.]+);", src)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--secs", type=int, default=4)
    ap.add_argument("--tiervm", default=str(ROOT / "target/release/tiervm"))
    a = ap.parse_args()
    sync, hint, abort = [], [], []
    for i in range(a.runs):
        t = run(a.tiervm, "tpp", a.secs)["migration"]
        sync.append(per(t["guest_stall_ms"], t["guest_stalls"]))
        n = run(a.tiervm, "nomad", a.secs)
        hint.append(per(n["tracking"]["hint_stall_ms"], n["tracking"]["hint_faults"]))
        m = n["migration"]
        abort.append(per(m["guest_stall_ms"], m["guest_stalls"]))
        print(f"  run {i + 1}: tpp {t['guest_stalls']} fault-path promotions, "
              f"nomad {n['tracking']['hint_faults']} hint faults, {m['tpm_commits']} TPM commits, "
              f"{m['tpm_aborts']} aborts", file=sys.stderr)
    med = lambda xs: statistics.median([x for x in xs if x is not None]) if any(
        x is not None for x in xs) else None
    c = constants()
    rows = [
        ("hint fault (nomad: hint_stall_ms / hint_faults)", med(hint), c.get("MEASURED_HINT_FAULT_NS")),
        ("fault-path promotion incl. its hint fault (tpp: guest_stall_ms / guest_stalls)", med(sync),
         c.get("MEASURED_SYNC_PROMOTION_NS")),
        ("TPM abort put-back stall (nomad: guest_stall_ms / guest_stalls)", med(abort), None),
    ]
    print(f"MEASURED live unit costs, median of {a.runs} run(s) of {a.secs} s "
          f"(zipf rss=108M wss=54M, slow first, 1 vCPU):")
    for name, v, k in rows:
        got = "-" if v is None else f"{v / 1e3:.1f} us"
        use = "" if k is None else f"   (sim --costs measured uses {k / 1e3:.1f} us)"
        print(f"  {name}: {got}{use}")


if __name__ == "__main__":
    main()
