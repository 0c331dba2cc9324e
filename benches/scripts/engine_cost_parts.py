#!/usr/bin/env python3
"""Where the live engine's overhead goes (issue 29, docs/results.md §13):
one matrix cell run four ways, interleaved, so a policy's loss against
static splits into what tracking alone costs and what moving pages alone
costs:

- `static`: nothing tracked, nothing moved (the baseline);
- `tracking`: static with hint-fault sampling on (the policies' default
  budget), nothing moved;
- `moving`: the chaos driver moving 4 KiB pages at the policy's measured
  promotion rate (`--chaos-mix 1:1`, TPM, no tracking);
- the policy itself (tracking and moving).

Without --emulate-latency both tiers are the same DRAM, so every ratio is
overhead. Per run it prints ops/s (MEASURED), the vCPU time blocked on the
engine's faults, 2 MiB ranges split into 4 KiB pages (`backing.splits`),
and, when `perf` can read the `kvmmmu:kvm_mmu_set_spte` tracepoint, the
shadow-MMU entries KVM installed (on PVM every moved or parked page is
re-faulted through the shadow MMU: each install is one such refault).

Usage: benches/scripts/engine_cost_parts.py [--policy nomad] [--rss 768M]
    [--fast 256M] [--vcpus 1] [--duration 6] [--repeat 3] [--workload zipf]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIERVM = os.path.join(ROOT, "target", "release", "tiervm")
sys.path.insert(0, os.path.dirname(__file__))
from live_matrix import fmt_size, guest_mem, parse_size, workload_args  # noqa: E402


def base_cmd(a, policy):
    image, wargs = workload_args(a.workload, parse_size(a.rss))
    cmd = [TIERVM, "run", image, "--mem", fmt_size(guest_mem(parse_size(a.rss))),
           "--fast", a.fast, "--placement", "slow-first", "--vcpus", str(a.vcpus),
           "--policy", policy, "--duration", f"{a.duration}s", "--seed", str(a.seed),
           "--quiet", "--report", "json"]
    for w in wargs:
        cmd += ["--arg", w]
    return cmd


def run(cmd, perf):
    spte = None
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        full = cmd
        if perf:
            full = ["perf", "stat", "-x,", "-e", "kvmmmu:kvm_mmu_set_spte", "--"] + cmd
        p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120 + 10 * float(cmd[cmd.index("--duration") + 1][:-1]))
        if perf:
            m = re.search(r"^(\d+),,kvmmmu:kvm_mmu_set_spte", p.stderr, re.M)
            spte = int(m.group(1)) if m else None
        try:
            r = json.loads(p.stdout)
        except json.JSONDecodeError:
            return {"error": p.stderr[-300:]}
    live = r.get("liveness", {})
    vcpu_ms = sum(live.get(k, 0) for k in ("vcpu_run_ms", "vcpu_wait_cpu_ms", "vcpu_blocked_ms"))
    mig, back = r.get("migration") or {}, r.get("backing") or {}
    return {
        "ops_per_sec": r["ops_per_sec"],
        "blocked_pct": 100 * live.get("vcpu_blocked_ms", 0) / vcpu_ms if vcpu_ms else None,
        "wait_pct": 100 * live.get("vcpu_wait_cpu_ms", 0) / vcpu_ms if vcpu_ms else None,
        "moved": mig.get("promotions", 0) + mig.get("demotions", 0),
        "hint_faults": (r.get("tracking") or {}).get("hint_faults", 0),
        "splits": back.get("splits", 0),
        "spte": spte,
        "end": r["stop_reason"],
    }


def perf_works():
    if not shutil.which("perf"):
        return False
    p = subprocess.run(["perf", "stat", "-x,", "-e", "kvmmmu:kvm_mmu_set_spte", "--", "true"],
                       capture_output=True, text=True)
    return p.returncode == 0 and "kvm_mmu_set_spte" in p.stderr and "not supported" not in p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="nomad")
    ap.add_argument("--workload", default="zipf")
    ap.add_argument("--rss", default="768M")
    ap.add_argument("--fast", default="256M")
    ap.add_argument("--vcpus", type=int, default=1)
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    if not os.access(TIERVM, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    perf = perf_works()
    print(f"# {a.workload} RSS {a.rss} over a {a.fast} fast tier, slow-first, {a.vcpus} vCPU(s), "
          f"{a.duration:g} s, no latency emulation (both tiers the same DRAM): MEASURED overhead; "
          f"shadow-MMU installs {'from perf' if perf else 'not read (perf cannot)'}")
    print("| round | run | ops/s | x static | blocked % | wait CPU % | pages moved | hint faults "
          "| 2 MiB splits | SPTE installs | end |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for rnd in range(1, a.repeat + 1):
        rows = {}
        rows["static"] = run(base_cmd(a, "static"), perf)
        rows["tracking"] = run(base_cmd(a, "static") + ["--tracking", "hint-faults"], perf)
        rows[a.policy] = run(base_cmd(a, a.policy), perf)
        moved = rows[a.policy].get("moved", 0)
        rate = max(1, round(moved / a.duration))
        rows[f"moving ({rate}/s)"] = run(
            base_cmd(a, "chaos") + ["--chaos-rate", str(rate), "--chaos-mix", "1:1",
                                    "--mechanism", "tpm", "--chaos-unit", "4k"], perf)
        s = rows["static"].get("ops_per_sec") or 0
        for name, r in rows.items():
            if "error" in r:
                print(f"| {rnd} | {name} | failed: {r['error'][:80]!r} ||||||||")
                continue
            x = r["ops_per_sec"] / s if s else float("nan")
            print(f"| {rnd} | {name} | {r['ops_per_sec'] / 1e6:.2f}M | {x:.2f} | {r['blocked_pct']:.1f} "
                  f"| {r['wait_pct']:.1f} | {r['moved']} | {r['hint_faults']} | {r['splits']} "
                  f"| {'-' if r['spte'] is None else r['spte']} | {r['end']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
