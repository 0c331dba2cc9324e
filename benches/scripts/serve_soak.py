#!/usr/bin/env python3
"""Soak of `tiervm serve` (run by hand, outside CI; docs/results.md).

Keeps 8 to 10 VMs (a third of them memcheck) alive under the service for
--duration seconds while creating, resizing (PATCH fast), policy-switching
(PUT policy) and deleting them at random through the API, and checks:

- 0 lost writes: every memcheck VM's report has mismatched_pages == 0 and
  periodic_mismatches == 0, and every report's tiering consistency is "ok";
- the division's bounds at every poll: each VM's target within [0, max],
  the targets within the fast pool, no round's optional moves above the
  budget (max_round_optional_bytes <= budget_bytes);
- no leaked processes: no worker pid seen during the run is alive after the
  service stopped;
- memory back to its baseline: the service's RSS with no VM left, and the
  host's used memory (MemTotal - MemAvailable) after the service stopped,
  against their values before the first VM;
- API latency: p50 / p99 / max of every call, client side.

Usage: benches/scripts/serve_soak.py [--duration 600] [--binary target/release/tiervm]
Exit 0 when every check passed, 1 otherwise.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

M = 1 << 20


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Api:
    def __init__(self, path):
        self.path = path
        self.latencies = []
        self.by_route = {}
        self.codes = {}

    def call(self, method, url, body=None):
        t0 = time.monotonic()
        c = UnixHTTPConnection(self.path)
        try:
            data = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if data else {}
            c.request(method, url, body=data, headers=headers)
            r = c.getresponse()
            raw = r.read()
            status = r.status
        finally:
            c.close()
        dt = time.monotonic() - t0
        self.latencies.append(dt)
        route = method + " " + "/".join("{id}" if p.startswith("vm-") else p for p in url.split("/"))
        self.by_route.setdefault(route, []).append(dt)
        self.codes[status] = self.codes.get(status, 0) + 1
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")


def meminfo():
    d = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            d[k] = int(v.split()[0]) * 1024
    return d


def host_used():
    m = meminfo()
    return m["MemTotal"] - m["MemAvailable"]


def rss(pid, field="VmRSS"):
    """A resident-size line of /proc/PID/status, bytes: VmRSS (all),
    RssAnon (heap, stacks: what the service allocated), RssFile (pages of
    the binary and libraries read from disk: code paths run once stay
    resident until the kernel needs the memory; clean and shared)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except OSError:
        return False


def pct(xs, p):
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


POLICIES = ["static", "tpp", "nomad", "memtis", "colloid", "mtm"]


def vm_body(rng, i):
    kind = i % 3
    mem = rng.choice([128, 192, 256])
    if kind == 0:
        body = {"image": "memcheck", "args": ["region=32M", "pattern=hot"]}
    elif kind == 1:
        body = {"image": "zipf", "args": [f"rss={mem // 2}M", f"wss={mem // 4}M"]}
    else:
        body = {"image": "gups", "args": [f"size={mem // 2}M", f"hot_size={mem // 8}M"]}
    fmax = rng.choice([64, 96, 128, mem])
    body.update(
        {
            "mem": f"{mem}M",
            "policy": rng.choice(POLICIES),
            "fast": {
                "min": f"{rng.choice([0, 16, 32])}M",
                "max": f"{fmax}M",
                "weight": rng.choice([0.5, 1, 2, 4]),
            },
            "seed": i + 1,
        }
    )
    return body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--binary", default="target/release/tiervm")
    ap.add_argument("--fast-pool", default="1G")
    ap.add_argument("--slow-pool", default="8G")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stop-grace", default="60s")
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="tiervm-soak-")
    sock = os.path.join(work, "run", "api.sock")
    used_before = host_used()
    log = open(os.path.join(work, "serve.log"), "w")
    # A generous stop grace: under 8-10 busy VMs on 2 cores a guest's last
    # verification pass can take longer than the default 10 s.
    conf = os.path.join(work, "serve.toml")
    with open(conf, "w") as f:
        f.write('[defaults]\nstop_grace = "%s"\n' % a.stop_grace)
    svc = subprocess.Popen(
        [
            a.binary, "serve", "--config", conf, "--socket", sock, "--state-dir", os.path.join(work, "state"),
            "--fast-pool", a.fast_pool, "--slow-pool", a.slow_pool,
            "--period", "2s", "--max-move-rate", "128M", "--dwell", "4s",
        ],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        if time.monotonic() > deadline or svc.poll() is not None:
            print("the service did not start; log in", work)
            return 1
        time.sleep(0.05)
    api = Api(sock)
    time.sleep(0.5)
    rss_initial = rss(svc.pid)
    anon_initial = rss(svc.pid, "RssAnon")
    # Warm-up: one VM created and removed, so the baseline includes the
    # service's one-time allocations (runtime threads, buffers).
    st, v = api.call("POST", "/v1/vms", {"image": "zipf", "mem": "64M", "args": ["rss=32M", "wss=16M"]})
    if st == 201:
        time.sleep(2)
        api.call("DELETE", f"/v1/vms/{v['id']}")
        for _ in range(200):
            st, v2 = api.call("GET", f"/v1/vms/{v['id']}")
            if v2 and v2.get("report_ready"):
                break
            time.sleep(0.1)
        api.call("DELETE", f"/v1/vms/{v['id']}")
    time.sleep(1)
    rss_before = rss(svc.pid)
    anon_before = rss(svc.pid, "RssAnon")
    file_before = rss(svc.pid, "RssFile")
    api.latencies.clear()
    api.by_route.clear()
    api.codes.clear()
    failures = []
    pids = set()
    active = {}  # id -> body
    stopping = set()
    created = deleted = patches = switches = 0
    memcheck_checked = memcheck_writes = mismatches = 0
    reports = 0
    reasons = {}
    polls = 0
    budget = None
    i = 0
    t_end = time.monotonic() + a.duration

    def reap_stopped():
        nonlocal memcheck_checked, memcheck_writes, mismatches, reports, deleted
        for vid in list(stopping):
            st, v = api.call("GET", f"/v1/vms/{vid}")
            if st != 200 or v["state"] in ("starting", "running", "stopping"):
                continue
            if v["state"] != "stopped":
                failures.append(f"{vid} ended {v['state']}: {v.get('error')}")
            st, r = api.call("GET", f"/v1/vms/{vid}/report")
            if st == 409:
                continue  # being collected
            if st != 200:
                failures.append(f"{vid}: no report ({st} {r})")
            else:
                reports += 1
                reasons[r.get("stop_reason")] = reasons.get(r.get("stop_reason"), 0) + 1
                cons = (r.get("tiering") or {}).get("consistency")
                if cons != "ok":
                    failures.append(f"{vid}: consistency {cons}")
                if r.get("image") == "memcheck":
                    gm = r.get("guest_metrics", {})
                    if "mismatched_pages" not in gm:
                        failures.append(f"{vid}: memcheck did not verify (stop_reason {r.get('stop_reason')})")
                        stopping.discard(vid)
                        api.call("DELETE", f"/v1/vms/{vid}")
                        deleted += 1
                        continue
                    memcheck_checked += 1
                    memcheck_writes += int(gm.get("writes", 0))
                    bad = int(gm["mismatched_pages"]) + int(gm.get("periodic_mismatches", 0))
                    if bad != 0:
                        mismatches += max(bad, 1)
                        failures.append(f"{vid}: memcheck lost writes: {gm}")
            st, _ = api.call("DELETE", f"/v1/vms/{vid}")
            if st != 204:
                failures.append(f"{vid}: removing an ended VM answered {st}")
            stopping.discard(vid)
            deleted += 1

    def check_bounds():
        nonlocal polls, budget
        st, h = api.call("GET", "/v1/host")
        st2, vms = api.call("GET", "/v1/vms")
        if st != 200 or st2 != 200:
            failures.append(f"GET host/vms answered {st}/{st2}")
            return
        polls += 1
        pool = h["pools"][0]["capacity_bytes"]
        budget = h["rebalance"]["budget_bytes"]
        if h["rebalance"]["max_round_optional_bytes"] > budget:
            failures.append(f"a round moved {h['rebalance']['max_round_optional_bytes']} > budget {budget}")
        total = 0
        for v in vms:
            if v["state"] in ("starting", "running", "stopping"):
                f = v["fast"]
                total += f["target_bytes"]
                if f["target_bytes"] > f["max_bytes"]:
                    failures.append(f"{v['id']} target above max: {f}")
                if v.get("pid"):
                    pids.add(v["pid"])
        if total > pool:
            failures.append(f"targets {total} exceed the pool {pool}")

    while time.monotonic() < t_end:
        reap_stopped()
        n = len(active)
        if n < 8 or (n < 10 and rng.random() < 0.2):
            i += 1
            st, v = api.call("POST", "/v1/vms", vm_body(rng, i))
            if st == 201:
                active[v["id"]] = v
                created += 1
            elif st != 409:
                failures.append(f"create answered {st}: {v}")
            continue
        r = rng.random()
        vid = rng.choice(list(active))
        if r < 0.35:
            mem = active[vid]["mem_bytes"] // M
            mx = rng.choice([32, 64, 96, 128, mem])
            mx = min(mx, mem)
            mn = rng.choice([0, 16, 32])
            mn = min(mn, mx)
            st, f = api.call("PATCH", f"/v1/vms/{vid}/fast",
                             {"min": f"{mn}M", "max": f"{mx}M", "weight": rng.choice([0.5, 1, 2, 4])})
            if st == 202:
                patches += 1
            elif st not in (409,):
                failures.append(f"patch {vid} answered {st}: {f}")
        elif r < 0.6:
            st, v = api.call("PUT", f"/v1/vms/{vid}/policy", {"policy": rng.choice(POLICIES)})
            if st == 202:
                switches += 1
            elif st not in (409,):
                failures.append(f"policy {vid} answered {st}: {v}")
        elif r < 0.72:
            st, _ = api.call("DELETE", f"/v1/vms/{vid}")
            if st != 202:
                failures.append(f"delete {vid} answered {st}")
            del active[vid]
            stopping.add(vid)
        elif r < 0.85:
            api.call("GET", f"/v1/vms/{vid}")
        elif r < 0.95:
            check_bounds()
        else:
            st, _ = api.call("GET", "/metrics")
            if st != 200:
                failures.append(f"metrics answered {st}")
        time.sleep(0.05)

    # Wind down: stop everything, collect the reports.
    check_bounds()
    for vid in list(active):
        st, _ = api.call("DELETE", f"/v1/vms/{vid}")
        stopping.add(vid)
    active.clear()
    deadline = time.monotonic() + 120
    while stopping and time.monotonic() < deadline:
        reap_stopped()
        time.sleep(0.2)
    if stopping:
        failures.append(f"VMs did not stop: {sorted(stopping)}")
    # Idle long enough for the runtime's blocking threads to exit (10 s).
    time.sleep(15)
    rss_after = rss(svc.pid)
    anon_after = rss(svc.pid, "RssAnon")
    file_after = rss(svc.pid, "RssFile")
    threads_after = len(os.listdir(f"/proc/{svc.pid}/task")) if alive(svc.pid) else None
    st, metrics = api.call("GET", "/metrics")
    svc.send_signal(signal.SIGTERM)
    try:
        code = svc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        svc.kill()
        code = "killed"
        failures.append("the service did not stop within 120 s")
    if code != 0:
        failures.append(f"the service exited {code}")
    time.sleep(1)
    leaked = sorted(p for p in pids if alive(p))
    if leaked:
        failures.append(f"worker processes left: {leaked}")
    used_after = host_used()
    rss_growth = (rss_after or 0) - (rss_before or 0)
    if rss_growth > 64 * M:
        failures.append(f"service RSS grew {rss_growth / M:.1f} MiB")
    host_growth = used_after - used_before
    if host_growth > 256 * M:
        failures.append(f"host used memory grew {host_growth / M:.1f} MiB")
    lat = api.latencies
    summary = {
        "duration_s": a.duration,
        "vms_created": created,
        "vms_deleted": deleted,
        "reports_checked": reports,
        "stop_reasons": reasons,
        "fast_patches": patches,
        "policy_switches": switches,
        "bound_polls": polls,
        "budget_bytes_per_round": budget,
        "memcheck_vms_checked": memcheck_checked,
        "memcheck_writes": memcheck_writes,
        "lost_writes": mismatches,
        "worker_pids_seen": len(pids),
        "leaked_processes": len(leaked),
        "service_rss_initial_mib": round((rss_initial or 0) / M, 1),
        "service_rss_before_mib": round((rss_before or 0) / M, 1),
        "service_rss_after_mib": round((rss_after or 0) / M, 1),
        "service_rss_anon_mib": {"initial": round((anon_initial or 0) / M, 1),
                                 "before": round((anon_before or 0) / M, 1),
                                 "after": round((anon_after or 0) / M, 1)},
        "service_rss_file_mib": {"before": round((file_before or 0) / M, 1),
                                 "after": round((file_after or 0) / M, 1)},
        "service_threads_after": threads_after,
        "host_used_before_mib": round(used_before / M, 1),
        "host_used_after_mib": round(used_after / M, 1),
        "api_calls": len(lat),
        "api_status_counts": api.codes,
        "api_p50_ms": round(pct(lat, 50) * 1e3, 2),
        "api_p99_ms": round(pct(lat, 99) * 1e3, 2),
        "api_max_ms": round(max(lat) * 1e3 if lat else 0, 2),
        "api_p99_ms_by_route": {k: round(pct(v, 99) * 1e3, 2) for k, v in sorted(api.by_route.items())},
        "api_calls_by_route": {k: len(v) for k, v in sorted(api.by_route.items())},
        "failures": failures,
        "workdir": work,
    }
    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
