#!/usr/bin/env python3
"""The simulator's policy table (MODELED): every scenario, every policy.

Runs `tiervm sim SCENARIO --report json` for each scenario and prints one
markdown row per scenario: each policy's whole-run throughput (Macc/s), the
best policy, and for `--focus` (default adaptive) its ratio to the best and to
static. Deterministic (seeded), so one run per cell.

    python3 benches/scripts/sim_table.py                  # all built-in scenarios
    python3 benches/scripts/sim_table.py --scenarios nomad-small-ro,kv-ycsb-a
    python3 benches/scripts/sim_table.py --metric stable  # last 25% of the run
"""

import argparse
import json
import os
import subprocess
import sys

ALL = "static,tpp,tpp-lru,nomad,memtis,memtis-quickcool,colloid,colloid-base,mtm,adaptive"


def scenarios(binary):
    out = subprocess.run([binary, "sim", "--list"], check=True, capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        if line.startswith("  "):
            names.append(line.split()[0])
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join("target", "release", "tiervm"))
    ap.add_argument("--scenarios", default="")
    ap.add_argument("--policies", default=ALL)
    ap.add_argument("--focus", default="adaptive")
    ap.add_argument("--metric", default="throughput", choices=["throughput", "stable", "progress"])
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--json-out", default="", help="also write every report here")
    ap.add_argument("extra", nargs="*", help="extra arguments for every `tiervm sim` run")
    a = ap.parse_args()
    names = [s for s in a.scenarios.split(",") if s] or scenarios(a.binary)
    pols = [p for p in a.policies.split(",") if p]
    key = {"throughput": "throughput_maps", "stable": "stable_maps", "progress": "in_progress_maps"}[a.metric]
    print(f"MODELED ({a.metric}, Macc/s); ratios are {a.focus} / best and {a.focus} / static")
    print("| scenario | " + " | ".join(pols) + f" | best | {a.focus}/best | {a.focus}/static |")
    print("|---" * (len(pols) + 4) + "|")
    everything = {}
    worst_best, worst_static = None, None
    for s in names:
        cmd = [a.binary, "sim", s, "--policies", ",".join(pols), "--report", "json", "--jobs", a.jobs] + a.extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"| {s} | failed: {r.stderr.strip()[:200]} |")
            continue
        d = json.loads(r.stdout)
        everything[s] = d
        tp = {rep["policy"]: rep[key] for rep in d["reports"]}
        best = max(tp, key=tp.get)
        # Three significant digits at least (kv runs at ~0.3 Macc/s).
        cells = [(f"{tp[p]:.1f}" if tp[p] >= 10 else f"{tp[p]:.3f}") if p in tp else "-" for p in pols]
        fb, fs = "-", "-"
        if a.focus in tp:
            rb = tp[a.focus] / tp[best]
            fb = f"{rb:.3f}"
            worst_best = rb if worst_best is None else min(worst_best, rb)
            if "static" in tp and tp["static"] > 0:
                rs = tp[a.focus] / tp["static"]
                fs = f"{rs:.3f}"
                worst_static = rs if worst_static is None else min(worst_static, rs)
        print(f"| {s} | " + " | ".join(cells) + f" | {best} | {fb} | {fs} |", flush=True)
    if worst_best is not None:
        print(f"\nworst {a.focus}/best {worst_best:.3f}; worst {a.focus}/static "
              f"{worst_static if worst_static is None else round(worst_static, 3)}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(everything, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
