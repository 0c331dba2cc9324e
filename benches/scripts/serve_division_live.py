#!/usr/bin/env python3
"""Live fast-tier division under `tiervm serve` (docs/results.md §10).

Three VMs with different working sets share a small fast pool; the script
polls the API every second and checks at every poll that the division stays
within its bounds (each target in [min, max] once admitted, the targets
within the pool, no round's optional moves above the budget), and that
rebalancing happened (capacity moved between VMs after the start). It prints
a timeline of each VM's target and used fast bytes.

Tiers are emulated on a one-node host: the capacities, migrations and the
division are real; throughput differences between tiers are not, so this
run shows the mechanism, and the gain figure comes from the simulator
(`tiervm sim --division-pool`, modeled).

The division values a quantum by each VM's sampled access rate as the host
measures it (`fast.gain.accesses_per_sec`); `--value guest-ops` runs it on
the operations per second the guests report instead (`[division] value`).

Usage: benches/scripts/serve_division_live.py [--duration 90] [--binary target/release/tiervm]
       [--value host-accesses|guest-ops]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from serve_soak import Api  # noqa: E402

M = 1 << 20

VMS = [
    # A small hot set: needs little fast memory.
    {"image": "zipf", "mem": "256M", "args": ["rss=192M", "wss=16M"], "policy": "memtis",
     "fast": {"min": "16M", "max": "256M", "weight": 1}},
    # A large hot set: gains from every quantum up to ~128M.
    {"image": "gups", "mem": "256M", "args": ["size=192M", "hot_size=128M", "hot_prob=0.95"],
     "policy": "memtis", "fast": {"min": "16M", "max": "256M", "weight": 1}},
    # A wide Zipf working set: in between.
    {"image": "zipf", "mem": "256M", "args": ["rss=192M", "wss=160M", "theta=0.7"], "policy": "memtis",
     "fast": {"min": "16M", "max": "256M", "weight": 1}},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=90)
    ap.add_argument("--binary", default="target/release/tiervm")
    ap.add_argument("--json")
    ap.add_argument("--value", choices=["host-accesses", "guest-ops"],
                    help="what the division values a quantum by (default: the service's, host-accesses)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tiervm-division-")
    sock = os.path.join(work, "api.sock")
    log = open(os.path.join(work, "serve.log"), "w")
    config = []
    if a.value:
        path = os.path.join(work, "serve.toml")
        with open(path, "w") as f:
            f.write(f'[division]\nvalue = "{a.value}"\n')
        config = ["--config", path]
    svc = subprocess.Popen(
        [a.binary, "serve", "--socket", sock, "--state-dir", os.path.join(work, "state"),
         "--fast-pool", "192M", "--slow-pool", "1G", "--period", "2s", "--quantum", "16M",
         "--max-move-rate", "16M", "--dwell", "4s"] + config,
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    while not os.path.exists(sock):
        time.sleep(0.05)
    api = Api(sock)
    ids = []
    for body in VMS:
        st, v = api.call("POST", "/v1/vms", body)
        assert st == 201, (st, v)
        ids.append(v["id"])
    failures = []
    timeline = []
    t0 = time.monotonic()
    budget = None
    value = None
    while time.monotonic() - t0 < a.duration:
        time.sleep(1)
        st, h = api.call("GET", "/v1/host")
        _, vms = api.call("GET", "/v1/vms")
        pool = h["pools"][0]["capacity_bytes"]
        budget = h["rebalance"]["budget_bytes"]
        value = h["rebalance"].get("value", "guest-ops")
        t = round(time.monotonic() - t0, 1)
        row = {"t_s": t, "moved_bytes": h["rebalance"]["moved_bytes"],
               "optional_bytes": h["rebalance"]["optional_bytes"],
               "max_round_optional_bytes": h["rebalance"]["max_round_optional_bytes"], "vms": {}}
        total = 0
        for v in vms:
            f = v["fast"]
            total += f["target_bytes"]
            g = f.get("gain") or {}
            row["vms"][v["id"]] = {"target_mib": f["target_bytes"] // M, "used_mib": f["used_bytes"] // M,
                                   "ops_per_sec": round(v["ops_per_sec"]),
                                   "accesses_per_sec": g.get("accesses_per_sec"),
                                   "accesses_per_sec_se": g.get("accesses_per_sec_se"),
                                   "next_share": g.get("next_quantum_share"),
                                   "last_share": g.get("last_quantum_share")}
            if v["state"] == "running" and t > 10 and not (f["min_bytes"] <= f["target_bytes"] <= f["max_bytes"]):
                failures.append(f"t={t}: {v['id']} target outside [min, max]: {f}")
        if total > pool:
            failures.append(f"t={t}: targets {total} above the pool {pool}")
        if row["max_round_optional_bytes"] > budget:
            failures.append(f"t={t}: a round's optional moves {row['max_round_optional_bytes']} > budget {budget}")
        timeline.append(row)
    if timeline and timeline[-1]["optional_bytes"] == 0:
        failures.append("no rebalancing happened")
    # Flapping: a VM's target moving up then down (or down then up) again.
    reversals = {}
    for i in ids:
        last_dir, n = 0, 0
        prev = None
        for row in timeline:
            tgt = row["vms"].get(i, {}).get("target_mib")
            if prev is not None and tgt is not None and tgt != prev:
                d = 1 if tgt > prev else -1
                if last_dir and d != last_dir:
                    n += 1
                last_dir = d
            prev = tgt
        reversals[i] = n
    settled = [r for r in timeline if r["t_s"] >= a.duration / 2]
    unused = {i: max(r["vms"].get(i, {}).get("target_mib", 0) - r["vms"].get(i, {}).get("used_mib", 0)
                     for r in settled[-5:]) if settled else None for i in ids}
    for i in ids:
        api.call("DELETE", f"/v1/vms/{i}")
    svc.send_signal(signal.SIGTERM)
    svc.wait(timeout=120)
    print(f"fast pool 192M, budget {budget // M if budget else '?'}M per 2 s round, quantum 16M (tiers emulated), "
          f"valued by {value}")
    print("t_s   " + "  ".join(f"{i:>22}" for i in ids) + "   moved MiB (optional)")
    for row in timeline[::5] + ([timeline[-1]] if timeline else []):
        cells = "  ".join(
            f"{row['vms'].get(i, {}).get('target_mib', 0):>4}M tgt {row['vms'].get(i, {}).get('used_mib', 0):>4}M used"
            for i in ids)
        print(f"{row['t_s']:>5} {cells}   {row['moved_bytes'] // M} ({row['optional_bytes'] // M})")
    print("direction reversals of each target:", reversals)
    print("unused fast MiB (target - used, most over the last 5 polls):", unused)
    last = timeline[-1] if timeline else {"vms": {}}
    print("final gain shares (next quantum / last quantum):",
          {i: (last["vms"].get(i, {}).get("next_share"), last["vms"].get(i, {}).get("last_share")) for i in ids})
    print("final rates: guest-reported ops/s, host-measured accesses/s (+- se):",
          {i: tuple(last["vms"].get(i, {}).get(k) for k in ("ops_per_sec", "accesses_per_sec", "accesses_per_sec_se"))
           for i in ids})
    print("failures:", failures or "none")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"timeline": timeline, "failures": failures, "budget_bytes": budget, "value": value,
                       "reversals": reversals, "unused_mib": unused}, f, indent=1)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
