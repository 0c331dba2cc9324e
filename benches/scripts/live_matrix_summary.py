#!/usr/bin/env python3
"""The per-cell summary of a live matrix run (docs/results.md §13), from the
JSON `live_matrix.py --json FILE` writes: one row per cell with static's
ops/s and every policy's ratio to it, the worst one-second window, the
vCPU time blocked, what the best promoting policy moved, and whether the
cell meets issue 29's targets; then each policy's min / median / max ratio
over the cells without emulation. Optionally, a second JSON (`--before`)
adds each policy's median before and after.

Usage: benches/scripts/live_matrix_summary.py m.json [--before old.json]
"""

import argparse
import json
import statistics
import sys

POLICIES = ["tpp", "nomad", "memtis", "colloid", "mtm", "adaptive"]


def ratios(res):
    """Static's baseline (the mean of `static` and, in a bracketed run,
    `static-end`) and every policy's ratio to it."""
    rows = {r["policy"]: r for r in res["rows"] if "error" not in r}
    st = [rows[p] for p in ("static", "static-end") if p in rows]
    if not st or st[0]["ops_per_sec"] <= 0:
        return None, {}
    base = dict(st[0])
    base["ops_per_sec"] = sum(r["ops_per_sec"] for r in st) / len(st)
    return base, {p: r["ops_per_sec"] / base["ops_per_sec"] for p, r in rows.items()}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def cell_row(res, fast_bytes):
    c = res["cell"]
    base, ratio = ratios(res)
    if base is None:
        return f"| {c['workload']} | {c['size']} | {c['placement']} | {c['vcpus']} | {c['emulate']} | no static baseline |"
    rows = [r for r in res["rows"] if "error" not in r]
    worst = min((r["worst_1s"] for r in rows if r["worst_1s"] is not None), default=None)
    prom = [r for r in rows if r["policy"] not in ("static", "static-end", "all-fast")]
    blocked = [r["blocked_pct"] for r in prom if r["blocked_pct"] is not None]
    best = max(prom, key=lambda r: r["promotions"], default=None)
    moved = (f"{best['policy']} {best['promotions']} ({100 * best['promotions'] * 4096 / fast_bytes:.0f}%)"
             if best else "-")
    n = len(res["misses"])
    target = "met" if n == 0 else f"{n} miss{'es' if n > 1 else ''}"
    cols = " | ".join(fmt(ratio.get(p), ".2f") for p in POLICIES)
    span = f"{min(blocked):.1f}-{max(blocked):.1f}" if blocked else "-"
    return (f"| {c['workload']} | {c['size']} | {c['placement']} | {c['vcpus']} | {c['emulate']} "
            f"| {base['ops_per_sec'] / 1e6:.2f}M | {cols} | {fmt(worst, '.2f')} "
            f"| {fmt(base['blocked_pct'], '.1f')} / {span} | {moved} | {target} |")


def per_policy(results):
    out = {}
    # static-end (bracketed runs): static run again last, the A/A control.
    for p in POLICIES + ["static-end"]:
        xs = [ratios(r)[1].get(p) for r in results if r["cell"]["emulate"] == "off"]
        xs = [x for x in xs if x is not None]
        if xs:
            floor = 0.95 if p == "adaptive" else 0.8
            out[p] = (min(xs), statistics.median(xs), max(xs), sum(x >= floor for x in xs), len(xs))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--before", help="an earlier run's JSON, for a before/after median column")
    ap.add_argument("--fast", default=None, help="fast tier (default: the run's)")
    a = ap.parse_args()
    with open(a.json) as f:
        m = json.load(f)
    fast = a.fast or m["args"].get("fast", "256M")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    fast_bytes = int(float(fast[:-1]) * units[fast[-1].upper()]) if fast[-1].isalpha() else int(fast)
    res = m["results"]
    print("| workload | RSS | placement | vCPUs | emulated | static ops/s | " + " | ".join(POLICIES)
          + " | worst 1 s (min) | blocked % static / promoting | promoted (most, % of fast tier) | targets |")
    print("|" + "---|" * (10 + len(POLICIES)))
    for r in res:
        print(cell_row(r, fast_bytes))
    met = sum(1 for r in res if not r["misses"])
    print(f"\n{met} of {len(res)} cells meet the targets.\n")
    before = None
    if a.before:
        with open(a.before) as f:
            before = per_policy(json.load(f)["results"])
    print("| policy | min | median | max | cells at target |" + (" median before |" if before else ""))
    print("|---|---|---|---|---|" + ("---|" if before else ""))
    for p, (lo, med, hi, ok, n) in per_policy(res).items():
        extra = f" {before[p][1]:.2f} |" if before and p in before else (" - |" if before else "")
        at = "A/A control" if p == "static-end" else f"{ok}/{n}{' (0.95x)' if p == 'adaptive' else ''}"
        print(f"| {p} | {lo:.2f} | {med:.2f} | {hi:.2f} | {at} |{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
