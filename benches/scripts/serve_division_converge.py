#!/usr/bin/env python3
"""Does the fast-tier division of `tiervm serve` converge? (issue 32 item 5;
docs/results.md §10, "A division that converges").

Tier latency is emulated in every guest (`"emulate_latency": "nomad-a"`:
150 ns fast, 407 ns slow), so a VM's operations per second depend on how much
of its working set the fast tier holds, on this one-node host too. Throughput
figures are MEASURED guest operations per second with the latency EMULATED.

Part 1, a hot and an idle VM on a fast pool too small for both (256M, mins
32M each): an idle memcheck (32M region, 10 writes/s) created first, a hot
gups (uniform updates over 256M) 3 s later.
  - Static splits (each a service of its own, min = max for both VMs):
    idle/hot = 32/224 (the idle VM's min, the rest to the hot one), 96/160
    and 128/128 (even). Each VM's throughput over a window once the hot VM
    filled its fast tier; the best static split is the one with the largest
    sum.
  - The division (mins 32M, maxes 256M, the service's default settings):
    the time from the hot VM's start until it holds (uses) at least 90% of
    the fast capacity the best static split gives it (target: within 30 s),
    and the VMs' summed throughput over the same window (target: at least
    1.2x the even split's).
Part 2, three VMs of different skew on a 256M pool (a Zipf VM with a small
hot set, a wide Zipf VM, a uniform gups VM): the targets over time, and
whether any target reversed within its dwell (target: never; a reversal is
a change in the direction opposite to the VM's last change).

Usage: benches/scripts/serve_division_converge.py [--binary target/release/tiervm]
       [--window 20] [--part2-duration 90] [--json out.json]
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
EMU = "nomad-a"
POOL = "256M"
IDLE = {"image": "memcheck", "mem": "256M", "args": ["region=32M", "write_rate=10"],
        "policy": "nomad", "emulate_latency": EMU}
HOT = {"image": "gups", "mem": "512M", "args": ["size=256M", "hot_size=256M", "hot_prob=1"],
       "policy": "nomad", "emulate_latency": EMU}
THREE = [
    {"image": "zipf", "mem": "256M", "args": ["rss=192M", "wss=32M", "theta=0.99"],
     "policy": "nomad", "emulate_latency": EMU, "fast": {"min": "32M", "max": "256M"}},
    {"image": "zipf", "mem": "256M", "args": ["rss=192M", "wss=160M", "theta=0.6"],
     "policy": "nomad", "emulate_latency": EMU, "fast": {"min": "32M", "max": "256M"}},
    {"image": "gups", "mem": "256M", "args": ["size=192M", "hot_size=192M", "hot_prob=1"],
     "policy": "nomad", "emulate_latency": EMU, "fast": {"min": "32M", "max": "256M"}},
]


class Service:
    def __init__(self, binary, name, extra=()):
        self.work = tempfile.mkdtemp(prefix=f"tiervm-converge-{name}-")
        self.sock = os.path.join(self.work, "api.sock")
        self.log = open(os.path.join(self.work, "serve.log"), "w")
        self.p = subprocess.Popen(
            [binary, "serve", "--socket", self.sock, "--state-dir", os.path.join(self.work, "state"),
             "--fast-pool", POOL, "--slow-pool", "2G"] + list(extra),
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        while not os.path.exists(self.sock):
            if self.p.poll() is not None:
                raise SystemExit(f"tiervm serve exited: see {self.work}/serve.log")
            time.sleep(0.05)
        self.api = Api(self.sock)
        _, h = self.api.call("GET", "/v1/host")
        self.rebalance = h["rebalance"]

    def create(self, body):
        st, v = self.api.call("POST", "/v1/vms", body)
        assert st == 201, (st, v)
        return v["id"]

    def vm(self, i):
        return self.api.call("GET", f"/v1/vms/{i}")[1]

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=120)


def with_share(body, fmin, fmax):
    b = dict(body)
    b["fast"] = {"min": fmin, "max": fmax}
    return b


class Ended(Exception):
    """A VM ended during a measurement (e.g. `stop_reason: stalled`)."""


def throughput(svc, ids, seconds):
    """Each VM's guest operations per second over `seconds` (ops deltas)."""
    a = {i: svc.vm(i) for i in ids}
    t0 = time.monotonic()
    time.sleep(seconds)
    b = {i: svc.vm(i) for i in ids}
    dt = time.monotonic() - t0
    for i in ids:
        if a[i]["state"] != "running" or b[i]["state"] != "running":
            raise Ended(f"{i} {b[i]['state']} ({b[i]['stop_reason']}): see {svc.work}")
    return {i: (b[i]["ops"] - a[i]["ops"]) / dt for i in ids}


RETRIES = []


def retried(f, *args):
    """Runs a measurement again (up to 3 times) when a VM ended during it."""
    for attempt in range(3):
        try:
            return f(*args)
        except Ended as e:
            RETRIES.append(f"{f.__name__}{args[1:]}: {e}")
            print(f"  (run again: {e})", flush=True)
    raise SystemExit("a VM ended in every attempt")


def wait_running(svc, ids, timeout=60):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(svc.vm(i)["state"] == "running" for i in ids):
            return
        time.sleep(0.2)
    raise SystemExit(f"VMs not running: {[svc.vm(i) for i in ids]}")


def static_split(binary, idle_mib, hot_mib, window, settle):
    svc = Service(binary, f"static-{idle_mib}-{hot_mib}")
    try:
        idle = svc.create(with_share(IDLE, f"{idle_mib}M", f"{idle_mib}M"))
        time.sleep(3)
        hot = svc.create(with_share(HOT, f"{hot_mib}M", f"{hot_mib}M"))
        wait_running(svc, [idle, hot])
        t0 = time.monotonic()
        while time.monotonic() - t0 < settle:
            f = svc.vm(hot)["fast"]
            if f["used_bytes"] >= 0.95 * f["target_bytes"] and time.monotonic() - t0 > 10:
                break
            time.sleep(1)
        ops = throughput(svc, [idle, hot], window)
        return {"idle_mib": idle_mib, "hot_mib": hot_mib, "idle_ops": ops[idle], "hot_ops": ops[hot],
                "sum_ops": ops[idle] + ops[hot], "hot_used_mib": svc.vm(hot)["fast"]["used_bytes"] // M}
    finally:
        svc.stop()


def divided(binary, best_hot_mib, window, fill_wait):
    svc = Service(binary, "divided")
    timeline = []
    try:
        idle = svc.create(with_share(IDLE, "32M", "256M"))
        time.sleep(3)
        hot = svc.create(with_share(HOT, "32M", "256M"))
        start = time.monotonic()
        held = filled = None
        while time.monotonic() - start < fill_wait:
            time.sleep(1)
            t = round(time.monotonic() - start, 1)
            vi, vh = svc.vm(idle), svc.vm(hot)
            fh = vh["fast"]
            row = {"t_s": t,
                   "idle": (vi["fast"]["target_bytes"] // M, vi["fast"]["used_bytes"] // M),
                   "hot": (fh["target_bytes"] // M, fh["used_bytes"] // M),
                   "hot_capacity_mib": fh["capacity_bytes"] // M,
                   "hot_next_share": (fh.get("gain") or {}).get("next_quantum_share")}
            timeline.append(row)
            if held is None and fh["capacity_bytes"] >= 0.9 * best_hot_mib * M:
                held = t
            if filled is None and fh["used_bytes"] >= 0.9 * best_hot_mib * M:
                filled = t
                break
        ops = throughput(svc, [idle, hot], window)
        return {"held_90pct_s": held, "filled_90pct_s": filled, "idle_ops": ops[idle], "hot_ops": ops[hot],
                "sum_ops": ops[idle] + ops[hot], "timeline": timeline,
                "window_from_s": round(time.monotonic() - start - window, 1),
                "final": {"idle": timeline[-1]["idle"], "hot": timeline[-1]["hot"]}}
    finally:
        svc.stop()


def three(binary, duration):
    svc = Service(binary, "three")
    dwell = svc.rebalance.get("dwell_s")
    ids = []
    created = []
    try:
        for body in THREE:
            ids.append(svc.create(body))
            created.append(time.time())
        wait_running(svc, ids)
        t0 = time.monotonic()
        timeline = []
        while time.monotonic() - t0 < duration:
            time.sleep(1)
            row = {"t_s": round(time.monotonic() - t0, 1)}
            for i in ids:
                v = svc.vm(i)
                row[i] = (v["fast"]["target_bytes"] // M, v["fast"]["used_bytes"] // M, round(v["ops_per_sec"]))
            timeline.append(row)
        _, ev = svc.api.call("GET", "/v1/events?since=0")
        states = {i: (svc.vm(i)["state"], svc.vm(i)["stop_reason"]) for i in ids}
    finally:
        svc.stop()
    # Reversals from the service's own division events (each target change,
    # timed by its sequence's poll): a change against the VM's last one.
    moves = {i: [] for i in ids}
    for e in ev["events"]:
        if e["kind"] == "division" and e["vm"] in moves:
            moves[e["vm"]].append((e["time_unix"],
                                   e["previous_target_bytes"], e["fast_target_bytes"]))
    # A move within 2 s of a VM's creation is admission's (a new VM's min
    # taken from capacity spread before it came), not the division's choice.
    def admission(t):
        return any(0 <= t - c < 2 for c in created)
    reversals, within_dwell, admission_reversals = {}, {}, {}
    for i, ms in moves.items():
        n = w = adm = 0
        for (t_a, p_a, n_a), (t_b, p_b, n_b) in zip(ms, ms[1:]):
            if (n_a > p_a) != (n_b > p_b):
                if admission(t_b):
                    adm += 1
                    continue
                n += 1
                if dwell is not None and t_b - t_a < dwell:
                    w += 1
        reversals[i], within_dwell[i], admission_reversals[i] = n, w, adm
    return {"timeline": timeline, "moves": moves, "reversals": reversals, "states": states,
            "admission_reversals": admission_reversals,
            "reversals_within_dwell": within_dwell, "dwell_s": dwell, "ids": ids}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/tiervm")
    ap.add_argument("--window", type=float, default=20)
    ap.add_argument("--fill-wait", type=float, default=240,
                    help="longest wait, from the hot VM's start, for it to use 90%% of the best static split's "
                         "fast capacity before the divided run's throughput window")
    ap.add_argument("--part2-duration", type=float, default=90)
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"emulate_latency": EMU, "pool": POOL}
    splits = [retried(static_split, a.binary, i, h, a.window, 40) for i, h in ((32, 224), (96, 160), (128, 128))]
    out["static"] = splits
    best = max(splits, key=lambda s: s["sum_ops"])
    even = next(s for s in splits if s["idle_mib"] == s["hot_mib"])
    print("static splits (idle/hot MiB: idle ops/s, hot ops/s, sum; latency EMULATED, ops MEASURED):")
    for s in splits:
        print(f"  {s['idle_mib']:>3}/{s['hot_mib']:<3}  {s['idle_ops']:>12.0f} {s['hot_ops']:>12.0f} "
              f"{s['sum_ops']:>12.0f}  (hot used {s['hot_used_mib']} MiB)")
    d = retried(divided, a.binary, best["hot_mib"], a.window, a.fill_wait)
    out["divided"] = d
    print("divided (targets / used MiB every 5 s after the hot VM's start):")
    for r in d["timeline"][::5] + [d["timeline"][-1]]:
        print(f"  t={r['t_s']:>5}  idle {r['idle'][0]:>4}/{r['idle'][1]:<4} hot {r['hot'][0]:>4}/{r['hot'][1]:<4}"
              f" next share {r['hot_next_share']}")
    ratio = d["sum_ops"] / even["sum_ops"] if even["sum_ops"] else float("nan")
    print(f"  hot VM holds (fast capacity) 90% of the best static split's {best['hot_mib']} MiB after "
          f"{d['held_90pct_s']} s (target <= 30 s); uses (its policy promoted) 90% after {d['filled_90pct_s']} s")
    print(f"  ops/s from {d['window_from_s']} s for {a.window:.0f} s: idle {d['idle_ops']:.0f} hot {d['hot_ops']:.0f} "
          f"sum {d['sum_ops']:.0f}: {ratio:.2f}x the even split (target >= 1.2x)")
    p2 = three(a.binary, a.part2_duration)
    out["three"] = p2
    print(f"three VMs (target / used MiB, ops/s), dwell {p2['dwell_s']} s:")
    for r in p2["timeline"][::10] + [p2["timeline"][-1]]:
        print(f"  t={r['t_s']:>5}  " + "  ".join(f"{i} {r[i][0]:>4}/{r[i][1]:<4} {r[i][2]:>9}" for i in p2["ids"]))
    print(f"  direction reversals {p2['reversals']}, within the dwell {p2['reversals_within_dwell']} (target: 0); "
          f"at admission (a new VM's min) {p2['admission_reversals']}")
    print(f"  states at the end: {p2['states']}")
    ok = (d["held_90pct_s"] is not None and d["held_90pct_s"] <= 30 and ratio >= 1.2
          and not any(p2["reversals_within_dwell"].values()))
    print("runs repeated because a VM ended:", RETRIES or "none")
    out["retries"] = RETRIES
    print("targets met" if ok else "TARGETS NOT MET")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
