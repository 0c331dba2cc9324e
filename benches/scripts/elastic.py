#!/usr/bin/env python3
"""Elastic tiered memory (issue #10), measured with the release binary.

1. Start-up and host memory: VMM start to guest entry (boot_ms) and the
   process's peak RSS (getrusage of the child) for tiered VMs of growing
   size whose guest touches little, against the issue's targets
   (boot <= 50 ms; RSS <= touched + 0.5% of guest RAM + 64 MiB).
2. Huge-page coverage of a static tiered VM: the share of each tier's
   resident memory that the kernel maps with 2 MiB pages (from the report,
   measured with PAGEMAP_SCAN).
3. Tiered (static) versus untiered throughput, interleaved pairs, median of
   the per-pair ratios (gups uniform over 1G with 2 vCPUs, and zipf defaults).

Numbers are real on this host; tiers are emulated (one NUMA node). Prints
markdown for docs/results.md.

Usage: benches/scripts/elastic.py [--pairs 5] [--secs 5] [--repeat 3]
"""
import argparse, json, os, resource, statistics, subprocess, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
T = os.path.join(ROOT, "target", "release", "tiervm")
MIB = 1 << 20


def run(args, timeout=600):
    """Runs tiervm; returns (report, peak RSS bytes of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run([T, "run"] + args + ["--report", "json", "--quiet"],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(args)}\n{out.stderr[-2000:]}")
    # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: run the
    # biggest configurations last, or measure each in its own process.
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return json.loads(out.stdout), max(before, after) * 1024


def peak_rss(args):
    """Peak RSS of one tiervm run, measured in a fresh helper process."""
    code = ("import resource,subprocess,sys;"
            "r=subprocess.run(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL);"
            "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024)+'\\n');"
            "sys.stdout.write(r.stdout.decode())")
    out = subprocess.run([sys.executable, "-c", code, T, "run"] + args + ["--report", "json", "--quiet"],
                         capture_output=True, text=True, timeout=900)
    first, _, rest = out.stdout.partition("\n")
    return json.loads(rest), int(first)


def boot_and_rss(repeat):
    rows = []
    cases = [
        ("1G, fast 256M", ["zipf", "--mem", "1G", "--fast", "256M", "--arg", "rss=256M"]),
        ("4G, fast 1G", ["zipf", "--mem", "4G", "--fast", "1G", "--arg", "rss=256M"]),
        ("8G, fast 1G", ["zipf", "--mem", "8G", "--fast", "1G", "--arg", "rss=256M"]),
        ("64G, fast 8G", ["zipf", "--mem", "64G", "--fast", "8G", "--arg", "rss=256M"]),
        ("128M, slow 8G", ["zipf", "--mem", "128M", "--slow", "8G", "--arg", "rss=64M", "--arg", "wss=64M"]),
    ]
    for name, args in cases:
        boots, rss, touched, guest = [], [], 0, 0
        for _ in range(repeat):
            r, peak = peak_rss(args + ["--duration", "1s"])
            boots.append(r["boot_ms"])
            rss.append(peak)
            touched = r["backing"]["populated_pages"] * 4096
            guest = r["mem_bytes"]
        limit = touched + guest * 0.005 + 64 * MIB
        rows.append((name, statistics.median(boots), min(boots), max(boots), max(rss), touched, limit))
    print("| guest | boot_ms median (min-max) | peak RSS | guest touched | RSS target | |")
    print("|---|---|---|---|---|---|")
    for name, med, lo, hi, rss, touched, limit in rows:
        ok = "ok" if rss <= limit else f"over by {(rss - limit) / MIB:.0f} MiB"
        bok = "" if med <= 50 else " (boot over 50 ms)"
        print(f"| {name} | {med:.1f} ({lo:.1f}-{hi:.1f}) | {rss / MIB:.0f} MiB | {touched / MIB:.0f} MiB |"
              f" {limit / MIB:.0f} MiB | {ok}{bok} |")


def thp_coverage():
    r, _ = run(["gups", "--mem", "1280M", "--vcpus", "2", "--fast", "640M", "--arg", "size=1G",
                "--arg", "hot_size=1G", "--arg", "hot_prob=0", "--arg", "object=8", "--duration", "3s"])
    print("| tier | resident | huge-mapped | share |")
    print("|---|---|---|---|")
    tot_r = tot_h = 0
    for t in r["tiers"]:
        res, huge = t["resident_bytes"] or 0, t["huge_bytes"] or 0
        tot_r += res
        tot_h += huge
        share = huge / res if res else 0
        print(f"| {t['name']} | {res / MIB:.0f} MiB | {huge / MIB:.0f} MiB | {share:.3f} |")
    print(f"| all | {tot_r / MIB:.0f} MiB | {tot_h / MIB:.0f} MiB | {tot_h / max(tot_r, 1):.3f} |")


def pairs(n, secs):
    workloads = {
        "gups uniform 1G, 2 vCPUs": (["gups", "--mem", "1280M", "--vcpus", "2", "--arg", "size=1G",
                                       "--arg", "hot_size=1G", "--arg", "hot_prob=0", "--arg", "object=8"],
                                      ["--fast", "640M"]),
        "zipf defaults": (["zipf", "--mem", "1G"], ["--fast", "256M"]),
        "gups defaults": (["gups", "--mem", "1G"], ["--fast", "256M"]),
    }
    print("| workload | untiered ops/s (median) | tiered static ops/s (median) | per-pair ratios | median ratio |")
    print("|---|---|---|---|---|")
    for name, (base, tier) in workloads.items():
        ratios, un, ti = [], [], []
        for i in range(n):
            order = [False, True] if i % 2 == 0 else [True, False]
            got = {}
            for tiered in order:
                args = base + (tier + ["--policy", "static"] if tiered else []) + ["--duration", f"{secs}s"]
                r, _ = run(args)
                got[tiered] = r["ops_per_sec"]
            un.append(got[False])
            ti.append(got[True])
            ratios.append(got[True] / got[False] if got[False] else 0)
        print(f"| {name} | {statistics.median(un):,.0f} | {statistics.median(ti):,.0f} |"
              f" {', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.3f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--secs", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", choices=["boot", "thp", "pairs"])
    a = p.parse_args()
    if a.only in (None, "boot"):
        print("### Start-up and host memory (tiered, guest touches little)\n")
        boot_and_rss(a.repeat)
        print()
    if a.only in (None, "thp"):
        print("### Huge-page coverage of a static tiered VM (gups over 1G)\n")
        thp_coverage()
        print()
    if a.only in (None, "pairs"):
        print(f"### Tiered static versus untiered, {a.pairs} interleaved pairs of {a.secs} s\n")
        pairs(a.pairs, a.secs)


if __name__ == "__main__":
    main()
