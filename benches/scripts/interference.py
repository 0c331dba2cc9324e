#!/usr/bin/env python3
"""Guest throughput and stall under chaos migration, side by side in one run.

For each workload (zipf read-only, zipf write-heavy, memcheck) it runs the
guest on tiered memory with no migration (policy static) and under chaos at
several page rates, with TPM and stop-and-copy, 4 KiB pages and 2 MiB runs,
and prints a markdown table: ops/s, the ratio to the no-migration run of the
same round, guest_stall_ms, commits/aborts. Rounds are interleaved so noise
hits every configuration alike; the median over rounds is reported.

Usage: benches/scripts/interference.py [--secs 3] [--rounds 2] [--rates 0,1000,10000,50000]
"""
import argparse, json, os, statistics, subprocess, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
T = os.path.join(ROOT, "target", "release", "tiervm")

WORKLOADS = {
    # The working set covers ~80% of guest RAM, so most migrated pages are in it.
    "zipf-ro": ["zipf", "--arg", "rss=200M", "--arg", "wss=200M", "--arg", "write_ratio=0"],
    "zipf-wh": ["zipf", "--arg", "rss=200M", "--arg", "wss=200M", "--arg", "write_ratio=0.5"],
    "memcheck": ["memcheck", "--arg", "region=192M", "--arg", "pattern=random"],
}
BASE = ["--mem", "256M", "--fast", "128M", "--vcpus", "1", "--report", "json"]


def run(workload, rate, mech, unit, secs):
    args = [T, "run"] + WORKLOADS[workload] + BASE + ["--duration", f"{secs}s"]
    if rate == 0:
        args += ["--policy", "static"]
    else:
        units = rate if unit == "4k" else max(1.0, rate / 512.0)
        args += ["--policy", "chaos", "--chaos-rate", str(units), "--chaos-mix", "1:1",
                 "--mechanism", mech, "--chaos-unit", unit]
    out = subprocess.run(args, capture_output=True, text=True, timeout=secs + 120)
    if out.returncode not in (0,):
        sys.exit(f"failed ({out.returncode}): {' '.join(args)}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rates", default="0,1000,10000,50000")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    a = ap.parse_args()
    if not os.path.exists(T):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    rates = [int(r) for r in a.rates.split(",")]
    configs = [(0, "-", "-")] + [(r, m, u) for r in rates if r > 0 for m in ("tpm", "stop-copy") for u in ("4k", "2m")]
    results = {}
    for rnd in range(a.rounds):
        for w in a.workloads.split(","):
            for c in configs:
                r = run(w, *c, a.secs)
                results.setdefault((w, c), []).append(r)
                print(f"round {rnd} {w} {c}: {r['ops_per_sec']:.0f} ops/s", file=sys.stderr)
    print("| workload | pages/s | mechanism | unit | ops/s (median) | vs no migration | guest stall ms | migrated pages | TPM commits:aborts | memcheck lost |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in a.workloads.split(","):
        base = statistics.median(r["ops_per_sec"] for r in results[(w, configs[0])])
        for c in configs:
            rs = results[(w, c)]
            ops = statistics.median(r["ops_per_sec"] for r in rs)
            stall = statistics.median(r["migration"]["guest_stall_ms"] for r in rs)
            moved = statistics.median(r["migration"]["promotions"] + r["migration"]["demotions"] for r in rs)
            com = statistics.median(r["migration"]["tpm_commits"] for r in rs)
            ab = statistics.median(r["migration"]["tpm_aborts"] for r in rs)
            lost = max(r["guest_metrics"].get("mismatched_pages", 0) for r in rs) if w == "memcheck" else "-"
            print(f"| {w} | {c[0]} | {c[1]} | {c[2]} | {ops:,.0f} | {ops / base:.3f} | {stall:.1f} | {moved:,.0f} | {com:,.0f}:{ab:,.0f} | {lost} |")


if __name__ == "__main__":
    main()
