#!/usr/bin/env python3
"""Measures the simulator's unit costs with the live engine (#12 item 6).

Runs the zipf image live, every page slow first, 1 vCPU, under
  - tpp (every promotion on the fault path: stop-and-copy while the vCPU waits):
    guest_stall_ms / guest_stalls = one fault-path promotion as the vCPU sees it,
    hint fault included;
  - nomad (hint faults never migrate; promotions are TPM in the engine):
    hint_stall_ms / hint_faults = one hint fault as the vCPU sees it;
    guest_stall_ms / guest_stalls = one stall on a page in flight (an aborted
    transaction's put-back, when any);
  - chaos (random 4 KiB TPM promotions keeping shadows and demotions, 1:1, 10k
    pages/s; zipf write_ratio=0.5 over 200M of a 256M guest with 128M fast): the
    nomad run aborts and shadow-demotes only a handful of pages, this one some
    hundreds through the same engine paths, timed by the engine's own counters:
    tpm_abort_ms / tpm_aborted_pages = putting one aborted page back, mover side;
    shadow_demotion_ms / (shadow_demotions + shadow_demotions_copied) = demoting
    one page by remapping its shadow, mover side;
    both pooled over the runs (sum of times / sum of pages; aborts are rare);
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
CHAOS = ["zipf", "--mem", "256M", "--fast", "128M", "--arg", "rss=200M", "--arg", "wss=200M",
         "--arg", "write_ratio=0.5", "--vcpus", "1", "--chaos-rate", "10000", "--chaos-mix", "1:1",
         "--mechanism", "tpm", "--chaos-unit", "4k"]


def run(tiervm, policy, secs):
    setup = CHAOS if policy == "chaos" else ZIPF
    cmd = [tiervm, "run", *setup, "--policy", policy, "--duration", f"{secs}s", "--report", "json"]
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
    put_back, remap = [0.0, 0, 0.0, 0], [0.0, 0, 0.0, 0]  # chaos, nomad: ms, pages
    for i in range(a.runs):
        t = run(a.tiervm, "tpp", a.secs)["migration"]
        sync.append(per(t["guest_stall_ms"], t["guest_stalls"]))
        n = run(a.tiervm, "nomad", a.secs)
        hint.append(per(n["tracking"]["hint_stall_ms"], n["tracking"]["hint_faults"]))
        m = n["migration"]
        abort.append(per(m["guest_stall_ms"], m["guest_stalls"]))
        x = run(a.tiervm, "chaos", a.secs)["migration"]
        for j, r in ((0, x), (2, m)):
            put_back[j] += r["tpm_abort_ms"]
            put_back[j + 1] += r["tpm_aborted_pages"]
            remap[j] += r["shadow_demotion_ms"]
            remap[j + 1] += r["shadow_demotions"] + r["shadow_demotions_copied"]
        print(f"  run {i + 1}: tpp {t['guest_stalls']} fault-path promotions; "
              f"nomad {n['tracking']['hint_faults']} hint faults, {m['tpm_commits']} TPM commits, "
              f"{m['tpm_aborted_pages']} pages aborted ({m['tpm_abort_ms']:.3f} ms), "
              f"{m['shadow_demotions']} + {m['shadow_demotions_copied']} shadow demotions "
              f"({m['shadow_demotion_ms']:.2f} ms); chaos {x['tpm_commits']} TPM commits, "
              f"{x['tpm_aborted_pages']} pages aborted ({x['tpm_abort_ms']:.3f} ms), "
              f"{x['shadow_demotions']} + {x['shadow_demotions_copied']} shadow demotions "
              f"({x['shadow_demotion_ms']:.2f} ms)", file=sys.stderr)
    med = lambda xs: statistics.median([x for x in xs if x is not None]) if any(
        x is not None for x in xs) else None
    c = constants()
    rows = [
        ("hint fault (nomad: hint_stall_ms / hint_faults)", med(hint), c.get("MEASURED_HINT_FAULT_NS")),
        ("fault-path promotion incl. its hint fault (tpp: guest_stall_ms / guest_stalls)", med(sync),
         c.get("MEASURED_SYNC_PROMOTION_NS")),
        ("stall on a page in flight (nomad: guest_stall_ms / guest_stalls)", med(abort), None),
        (f"TPM abort put-back per page, mover side (chaos: tpm_abort_ms / tpm_aborted_pages, "
         f"{put_back[1]} pages)", per(put_back[0], put_back[1]), c.get("MEASURED_TPM_ABORT_NS")),
        (f"  same, nomad runs ({put_back[3]} pages)", per(put_back[2], put_back[3]), None),
        (f"shadow remap per page, mover side (chaos: shadow_demotion_ms / (shadow_demotions + "
         f"shadow_demotions_copied), {remap[1]} pages)", per(remap[0], remap[1]),
         c.get("MEASURED_SHADOW_REMAP_NS")),
        (f"  same, nomad runs ({remap[3]} pages)", per(remap[2], remap[3]), None),
    ]
    print(f"MEASURED live unit costs, median of {a.runs} run(s) of {a.secs} s "
          f"(zipf rss=108M wss=54M, slow first, 1 vCPU; chaos rows pooled):")
    for name, v, k in rows:
        got = "-" if v is None else f"{v / 1e3:.1f} us"
        use = "" if k is None else f"   (sim --costs measured uses {k / 1e3:.1f} us)"
        print(f"  {name}: {got}{use}")


if __name__ == "__main__":
    main()
