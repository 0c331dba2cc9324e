#!/usr/bin/env python3
"""The live engine's matrix at realistic sizes (issue 29): every policy x
resident sets from 64 MiB to 2 GiB (8x a 256 MiB fast tier) x placements x
vCPUs x workloads, with and without tier-latency emulation.

For each cell it runs `tiervm run --report json` once per policy, static
first (side by side, so ratios compare runs made under the same host load),
and prints one row per policy:

- ops/s and the ratio to static (measured; with --emulate-latency the tiers'
  latency is emulated in the guest, otherwise both tiers are the same DRAM and
  the ratio is pure overhead), over the whole run and over its second half
  (once a policy had half the run to place pages);
- the ratio of guest ops per second of vCPU time spent running or blocked
  on the engine (time runnable but waiting for a CPU left out): an estimate
  of the ratio on an idle host, for hosts whose cores are shared;
- the worst one-second window of guest progress, as a share of the run's
  mean rate (from the 100 ms timeline, after set-up, before the stop);
- the engine's measured cost: the vCPUs' time blocked on the memory
  engine's faults (first touches, hint faults, pages in flight; the kernel's
  per-thread schedstat, `liveness.vcpu_blocked_ms`), as a share of vCPU time,
  and the time they waited for a CPU (host load, not the engine);
- stalls and how the run ended.

Static runs first and, with `--bracket` (the default), again after the
cell's last policy (`static-end`); ratios are to the mean of the two, so a
drift of the host over a cell's runs cancels to first order (the two
static rows' own ratios show that drift: an A/A control).

With `--ceiling`, static also runs with a fast tier as large as guest RAM
(`all-fast`): every page fast, the most any placement can gain in the cell.

Before each cell's runs a discarded static run (`--warmup S`, default 2 s;
0 for none) leaves the host's memory as a run of that size does, so the
cell's first measured run does not alone pay for making room (see the
comment at the warm-up).

It then checks issue 29's targets per cell and prints the misses, each with
its measured cause (the engine's extra vCPU time blocked and waiting for a
CPU against static's, migrations and hint faults; for a promoting policy,
how much of the fast tier it filled in the run).

Usage:
  benches/scripts/live_matrix.py [--quick | --preset issue29] [--duration S] [--fast SIZE]
      [--sizes 64M,192M,...] [--workloads zipf,zipf-uniform,gups,kv,pagerank]
      [--policies static,tpp,...] [--placements fast-first,slow-first]
      [--vcpus 1,2] [--emulate off,on] [--ceiling] [--workload-arg K=V ...] [--json FILE] [--md FILE]

--quick runs a small subset (two sizes, zipf skewed and uniform, slow-first,
2 vCPUs, no emulation) in a few minutes. The full default matrix is long
(hours on 2 cores): run subsets with the flags, or --preset issue29 (about
an hour), the subset recorded in docs/results.md.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIERVM = os.path.join(ROOT, "target", "release", "tiervm")
POLICIES = ["static", "tpp", "nomad", "memtis", "colloid", "mtm", "adaptive"]
SIZES = ["64M", "192M", "512M", "1G", "2G"]
WORKLOADS = ["zipf", "zipf-uniform", "gups", "kv", "pagerank"]
SKEWED = {"zipf", "gups", "kv"}
# Nomad's platform A (the emulation preset the project's live comparisons use).
EMULATION = "nomad-a"


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    if s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def fmt_size(b):
    if b % (1 << 30) == 0:
        return f"{b >> 30}G"
    return f"{b >> 20}M"


def workload_args(workload, rss):
    """Image and --arg list whose resident set is about `rss` bytes."""
    if workload == "zipf":
        return "zipf", [f"rss={fmt_size(rss)}", f"wss={fmt_size(rss)}", "theta=0.99"]
    if workload == "zipf-uniform":
        return "zipf", [f"rss={fmt_size(rss)}", f"wss={fmt_size(rss)}", "theta=0"]
    if workload == "gups":
        hot = max(2 << 20, rss // 3 // (2 << 20) * (2 << 20))
        return "gups", [f"size={fmt_size(rss)}", f"hot_size={fmt_size(hot)}"]
    if workload == "kv":
        # Heap ~ records * (value_size + 64..128 B), value 1 KiB.
        return "kv", [f"records={max(1000, rss // 1120)}", "workload=a"]
    if workload == "pagerank":
        # GAP pull with degree 16: ~ 90 B per vertex (edges x 4 B + vertex arrays).
        # floor: the graph stays within the resident set asked for.
        scale = max(10, math.floor(math.log2(max(1, rss / 90))))
        return "pagerank", [f"scale={scale}", "iterations=0"]
    raise ValueError(workload)


def guest_mem(rss):
    """Guest RAM for a resident set: room for the image, stacks and slack."""
    m = max(256 << 20, int(rss * 1.25) + (64 << 20))
    return (m + (2 << 20) - 1) // (2 << 20) * (2 << 20)


# Not a policy: static with a fast tier as large as guest RAM, so every
# page is fast (`--ceiling`). Its ratio to static is the most any placement
# can gain in the cell (with emulation; without, both tiers are one DRAM).
ALL_FAST = "all-fast"


def run_one(cell, policy, args):
    image, wargs = workload_args(cell["workload"], cell["rss"])
    mem = fmt_size(guest_mem(cell["rss"]))
    cmd = [
        TIERVM, "run", image,
        "--mem", mem,
        "--fast", mem if policy == ALL_FAST else args.fast,
        # All fast: fast-first (slow-first would fill the slow tier first).
        "--placement", "fast-first" if policy == ALL_FAST else cell["placement"],
        "--vcpus", str(cell["vcpus"]),
        "--policy", "static" if policy == ALL_FAST else policy,
        "--duration", f"{args.duration}s",
        "--seed", str(args.seed),
        "--quiet", "--report", "json",
    ]
    for a in wargs + args.workload_arg:
        cmd += ["--arg", a]
    if cell["emulate"] == "on":
        cmd += ["--emulate-latency", EMULATION]
    if policy == "mtm":
        cmd += ["--policy-interval", "mtm=2s"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration * 10 + 120)
    wall = time.time() - t0
    try:
        r = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"policy": policy, "error": (p.stderr or p.stdout)[-300:], "rc": p.returncode}
    return summarize(policy, r, p.returncode, wall)


def worst_window(timeline, stop_s):
    """Lowest ops over any 1 s window after the first progress and before
    `stop_s`, as a share of the mean rate over that span."""
    pts = [(p["t_s"], p["ops"]) for p in timeline]
    first = next((t for t, o in pts if o > 0), None)
    if first is None:
        return 0.0
    span = [(t, o) for t, o in pts if first <= t <= stop_s]
    if len(span) < 2 or span[-1][0] - span[0][0] < 1.0:
        return None
    mean = (span[-1][1] - span[0][1]) / (span[-1][0] - span[0][0])
    if mean <= 0:
        return 0.0
    worst = math.inf
    j = 0
    for i in range(len(span)):
        while j < len(span) and span[j][0] - span[i][0] < 1.0:
            j += 1
        if j == len(span):
            break
        rate = (span[j][1] - span[i][1]) / (span[j][0] - span[i][0])
        worst = min(worst, rate)
    return None if worst is math.inf else worst / mean


def late_rate(timeline, stop_s):
    """Ops per second over the second half of the span from the first
    progress to `stop_s`: the rate once a policy had half the run to place
    pages (the whole-run rate counts its start-up too)."""
    pts = [(p["t_s"], p["ops"]) for p in timeline]
    first = next((t for t, o in pts if o > 0), None)
    if first is None:
        return 0.0
    mid = first + (stop_s - first) / 2
    span = [(t, o) for t, o in pts if mid <= t <= stop_s]
    if len(span) < 2 or span[-1][0] <= span[0][0]:
        return None
    return (span[-1][1] - span[0][1]) / (span[-1][0] - span[0][0])


def summarize(policy, r, rc, wall):
    live = r.get("liveness", {})
    vcpu_ms = live.get("vcpu_run_ms", 0) + live.get("vcpu_wait_cpu_ms", 0) + live.get("vcpu_blocked_ms", 0)
    stop_s = r["duration_s"] - (live.get("stop_latency_ms") or 0) / 1e3
    mig = r.get("migration") or {}
    trk = r.get("tracking") or {}
    # Ops per second of vCPU time spent running or blocked on the engine,
    # leaving out time runnable but waiting for a CPU (host load): what the
    # rate would be on an idle host, as an estimate (not a measurement).
    busy_ms = live.get("vcpu_run_ms", 0) + live.get("vcpu_blocked_ms", 0)
    first = next((p["t_s"] for p in r["timeline"] if p["ops"] > 0), None)
    return {
        "policy": policy,
        "rc": rc,
        "ops_per_sec": r["ops_per_sec"],
        "late_ops_per_sec": late_rate(r["timeline"], stop_s),
        "ops_per_busy_vcpu_s": r["ops"] / (busy_ms / 1e3) if busy_ms else None,
        "stop_reason": r["stop_reason"],
        "worst_1s": worst_window(r["timeline"], stop_s),
        "blocked_pct": 100.0 * live.get("vcpu_blocked_ms", 0) / vcpu_ms if vcpu_ms else None,
        "wait_cpu_pct": 100.0 * live.get("vcpu_wait_cpu_ms", 0) / vcpu_ms if vcpu_ms else None,
        "stalls": len(live.get("stalls", [])),
        # The first few stall records as the report gives them (page, owner,
        # how long), so a stall seen in a long matrix can be looked into.
        "stall_records": live.get("stalls", [])[:3],
        "stop_latency_ms": live.get("stop_latency_ms"),
        "longest_no_progress_s": live.get("longest_no_progress_s"),
        "promotions": mig.get("promotions", 0),
        "demotions": mig.get("demotions", 0),
        "hint_faults": trk.get("hint_faults", 0),
        "first_progress_s": first,
        "wall_s": wall,
    }


# `--preset issue29`: the subset recorded in docs/results.md §13, about an
# hour on 2 cores at 6 s per run. Every workload, resident sets from 64 MiB
# to 2 GiB (8x the 256 MiB fast tier), slow-first with 1 and 2 vCPUs,
# fast-first with 2, with and without emulation. PageRank only up to 192M:
# building a larger graph takes longer than a run (scale 22, ~400 MiB,
# made no progress in 6 s).
PRESETS = {
    "issue29": [
        dict(workloads="zipf,zipf-uniform,gups,kv", sizes="64M,768M,2G",
             placements="slow-first", vcpus="1,2", emulate="off,on"),
        dict(workloads="pagerank", sizes="64M,192M", placements="slow-first",
             vcpus="2", emulate="off,on"),
        dict(workloads="zipf,gups", sizes="768M,2G", placements="fast-first",
             vcpus="2", emulate="off,on"),
    ],
}


def split(v, conv=str):
    return [conv(x) for x in v.split(",") if x] if isinstance(v, str) else v


def cells(args):
    groups = PRESETS[args.preset] if args.preset else [dict(
        workloads=args.workloads, sizes=args.sizes, placements=args.placements,
        vcpus=args.vcpus, emulate=args.emulate)]
    for g in groups:
        for w in split(g["workloads"]):
            for size in split(g["sizes"]):
                for pl in split(g["placements"]):
                    for v in split(g["vcpus"], int):
                        for e in split(g["emulate"]):
                            yield {"workload": w, "rss": parse_size(size), "size": size,
                                   "placement": pl, "vcpus": v, "emulate": e}


STATICS = ("static", "static-end")


def baseline(rows):
    """The cell's static baseline: with `--bracket`, static ran first and
    last (`static-end`), and the baseline's rates are the two runs' mean, so
    a drift over the cell's runs (measured: up to 15% down over three runs
    of a 2 GiB cell) cancels to first order for the runs between them."""
    st = [r for r in rows if r["policy"] in STATICS and "error" not in r]
    if not st:
        return None
    base = dict(st[0])
    base["ops_per_sec"] = sum(r["ops_per_sec"] for r in st) / len(st)
    late = [r["late_ops_per_sec"] for r in st if r.get("late_ops_per_sec")]
    base["late_ops_per_sec"] = sum(late) / len(late) if late else None
    busy = [r["ops_per_busy_vcpu_s"] for r in st if r.get("ops_per_busy_vcpu_s")]
    base["ops_per_busy_vcpu_s"] = sum(busy) / len(busy) if busy else None
    return base


def cost_vs_static(r, base):
    """The engine's measured cost in a row against static's, as text: what
    a miss is explained by (or not)."""
    def pct(x):
        return 0.0 if x is None else x
    extra = (pct(r["blocked_pct"]) - pct(base["blocked_pct"])) + (
        pct(r["wait_cpu_pct"]) - pct(base["wait_cpu_pct"]))
    fp, fs = r.get("first_progress_s"), base.get("first_progress_s")
    setup = "" if fp is None or fs is None else f"; first progress {fp:.1f} s (static {fs:.1f} s)"
    return (extra, f"vCPU time blocked {pct(r['blocked_pct']):.1f}% (static {pct(base['blocked_pct']):.1f}%), "
                   f"waiting for a CPU {pct(r['wait_cpu_pct']):.1f}% (static {pct(base['wait_cpu_pct']):.1f}%): "
                   f"{extra:+.1f} points of vCPU time; {r['promotions'] + r['demotions']} migrations, "
                   f"{r['hint_faults']} hint faults{setup}")


def late_ratio(r, base):
    """`r`'s second-half rate over the baseline's, if both are known."""
    a, b = r.get("late_ops_per_sec"), base.get("late_ops_per_sec")
    return a / b if a and b else None


def check_targets(cell, rows, fast_bytes, duration):
    """Issue 29's targets for one cell; returns the misses (strings), each
    with its measured cause."""
    misses = []
    base = baseline(rows)
    if base is None or base["ops_per_sec"] <= 0:
        return ["no static baseline"]
    ok = {r["policy"]: r for r in rows if "error" not in r}
    ratio = {p: r["ops_per_sec"] / base["ops_per_sec"] for p, r in ok.items()}
    for r in rows:
        if "error" in r:
            misses.append(f"{r['policy']}: failed ({r['error'][:80]})")
        elif r["stop_reason"] != "duration" or r["stalls"]:
            misses.append(f"{r['policy']}: ended {r['stop_reason']}, {r['stalls']} stall(s)")
    if cell["emulate"] == "off":
        for p, x in ratio.items():
            if p in STATICS or p == ALL_FAST:
                continue
            floor = 0.95 if p == "adaptive" else 0.8
            if x < floor:
                extra, why = cost_vs_static(ok[p], base)
                misses.append(f"{p} {x:.2f}x static < {floor} (loss {100 * (1 - x):.0f}%): {why}")
    elif cell["workload"] in SKEWED and cell["rss"] >= 3 * fast_bytes:
        promoting = {p: x for p, x in ratio.items() if p not in STATICS and p != ALL_FAST}
        best_p = max(promoting, key=promoting.get, default=None)
        best = promoting.get(best_p, 0)
        if best < 1.2 and best_p is not None:
            moved = ok[best_p]["promotions"] * 4096 / fast_bytes
            ceiling = f"; all pages fast: {ratio[ALL_FAST]:.2f}x" if ALL_FAST in ratio else ""
            late = late_ratio(ok[best_p], base)
            late = "" if late is None else f"; second half of the run {late:.2f}x"
            misses.append(f"best promoting policy {best_p} {best:.2f}x static < 1.2: it promoted "
                          f"{ok[best_p]['promotions']} pages ({100 * moved:.0f}% of the fast tier) "
                          f"in {duration:g} s{late}{ceiling}")
        a = ratio.get("adaptive")
        if a is not None and (a < 0.97 or a < 0.9 * best):
            extra, why = cost_vs_static(ok["adaptive"], base)
            misses.append(f"adaptive {a:.2f}x static (best {best:.2f}x): {why}")
    return misses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a fixed subset (see PRESETS)")
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--fast", default="256M")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--placements", default="fast-first,slow-first")
    ap.add_argument("--vcpus", default="1,2")
    ap.add_argument("--emulate", default="off,on")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--bracket", action=argparse.BooleanOptionalAction, default=True,
                    help="run static again after the cell's last policy; the baseline is the two "
                         "static runs' mean (--no-bracket: static first only)")
    ap.add_argument("--warmup", type=float, default=2,
                    help="seconds of a discarded static run before each cell (0: none)")
    ap.add_argument("--ceiling", action="store_true",
                    help="also run static with every page fast (`all-fast`, after static): the most "
                         "any placement can gain in the cell")
    ap.add_argument("--workload-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="one more --arg for every run's workload, after the cell's own (repeatable; "
                         "e.g. scramble=0: zipf's hot pages first, not spread)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.workloads, args.placements = "192M,1G", "zipf,zipf-uniform", "slow-first"
        args.vcpus, args.emulate, args.duration = "2", "off", min(args.duration, 5)
    for k in ("sizes", "workloads", "policies", "placements", "emulate"):
        setattr(args, k, [x for x in getattr(args, k).split(",") if x])
    args.vcpus = [int(x) for x in args.vcpus.split(",") if x]
    if "static" not in args.policies:
        args.policies.insert(0, "static")
    args.policies.sort(key=lambda p: p != "static")
    if args.ceiling and ALL_FAST not in args.policies:
        args.policies.insert(1, ALL_FAST)
    if not os.access(TIERVM, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    fast_bytes = parse_size(args.fast)
    results = []
    all_cells = list(cells(args))
    hdr = ("| workload | RSS | placement | vCPUs | emulated | policy | ops/s | x static "
           "| x static, 2nd half | x static per busy vCPU-s "
           "| worst 1 s | blocked % | wait CPU % | promotions | hint faults | end |")
    lines = [hdr, "|" + "---|" * 16]
    print(hdr, flush=True)
    print(lines[1], flush=True)
    misses_all = []
    started = time.time()
    for n, cell in enumerate(all_cells, 1):
        if n > 1:
            left = (time.time() - started) / (n - 1) * (len(all_cells) - n + 1)
            print(f"about {left / 60:.0f} min left", file=sys.stderr, flush=True)
        rows = []
        if args.warmup:
            # A discarded static run first, so the cell's first measured run
            # does not alone pay the host's making room for a resident set of
            # another size (the previous cell's): a 2 GiB cell's first run
            # after smaller ones spent 1.5 s more blocked in set-up, and the
            # ops/s of a run count from its first operation, so runs with
            # different set-up times are measured over different phases.
            print(f"[{n}/{len(all_cells)}] warm-up (static, {args.warmup:g} s, discarded) ...",
                  file=sys.stderr, flush=True)
            run_one(cell, "static", argparse.Namespace(**{**vars(args), "duration": args.warmup}))
        order = list(args.policies) + (["static"] if args.bracket and len(args.policies) > 1 else [])
        for i, p in enumerate(order):
            print(f"[{n}/{len(all_cells)}] {cell['workload']} {cell['size']} {cell['placement']} "
                  f"{cell['vcpus']}v emulate={cell['emulate']} {p} ...", file=sys.stderr, flush=True)
            r = run_one(cell, p, args)
            if i == len(args.policies):
                r["policy"] = "static-end"
            rows.append(r)
        base = baseline(rows)
        for r in rows:
            if "error" in r:
                line = (f"| {cell['workload']} | {cell['size']} | {cell['placement']} | {cell['vcpus']} "
                        f"| {cell['emulate']} | {r['policy']} | failed: {r['error'][:60]!r} |||||||||")
            else:
                ratio = r["ops_per_sec"] / base["ops_per_sec"] if base and base["ops_per_sec"] else float("nan")
                nb = base.get("ops_per_busy_vcpu_s") if base else None
                nr = r.get("ops_per_busy_vcpu_s")
                nratio = f"{nr / nb:.2f}" if nb and nr else "-"
                lr = late_ratio(r, base) if base else None
                late = "-" if lr is None else f"{lr:.2f}"
                w = "-" if r["worst_1s"] is None else f"{r['worst_1s']:.2f}"
                bp = "-" if r["blocked_pct"] is None else f"{r['blocked_pct']:.1f}"
                wp = "-" if r["wait_cpu_pct"] is None else f"{r['wait_cpu_pct']:.1f}"
                end = r["stop_reason"] + (f", {r['stalls']} stall(s)" if r["stalls"] else "")
                line = (f"| {cell['workload']} | {cell['size']} | {cell['placement']} | {cell['vcpus']} "
                        f"| {cell['emulate']} | {r['policy']} | {r['ops_per_sec'] / 1e6:.2f}M | {ratio:.2f} | {late} | {nratio} "
                        f"| {w} | {bp} | {wp} | {r['promotions']} | {r['hint_faults']} | {end} |")
            print(line, flush=True)
            lines.append(line)
        misses = check_targets(cell, rows, fast_bytes, args.duration)
        for m in misses:
            misses_all.append(f"{cell['workload']} {cell['size']} {cell['placement']} {cell['vcpus']}v "
                              f"emulate={cell['emulate']}: {m}")
        results.append({"cell": cell, "rows": rows, "misses": misses})
    print(f"\ntargets: {len(all_cells) - sum(1 for r in results if r['misses'])} of {len(all_cells)} cells meet them")
    for m in misses_all:
        print(f"  miss: {m}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
