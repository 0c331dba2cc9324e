#!/usr/bin/env python3
"""Emulation overhead by cache-model size: zipf (rss 256M, wss 128M, untiered, 1 vCPU) without
emulation and with emulation at charge 0 (every tier = host DRAM = 100 ns) for llc=32M (the host
LLC, the default), llc=256K and llc=0 (no model); 3 s runs, 3 interleaved repeats. MEASURED.
Usage: python3 benches/scripts/emulation_overhead.py [path/to/tiervm]"""
import json, subprocess, statistics
import sys
T = sys.argv[1] if len(sys.argv) > 1 else 'target/release/tiervm'
V={'plain':[], 'llc=32M(default)':['--emulate-latency','fast=100ns,slow=100ns,host-dram=100ns'],
   'llc=256K':['--emulate-latency','fast=100ns,slow=100ns,host-dram=100ns,llc=256K'],
   'llc=0':['--emulate-latency','fast=100ns,slow=100ns,host-dram=100ns,llc=0']}
res={k:[] for k in V}
for rep in range(3):
    for k,extra in V.items():
        p=subprocess.run([T,'run','zipf','--mem','512M','--arg','rss=256M','--arg','wss=128M','--duration','3s','--report','json',*extra],capture_output=True,text=True)
        r=json.loads(p.stdout); res[k].append(1e9/r['ops_per_sec'])
for k,v in res.items():
    print(f"{k:18s} ns/op median {statistics.median(v):6.1f} best {min(v):6.1f}  ratio(median) {statistics.median(v)/statistics.median(res['plain']):.3f} ratio(best) {min(v)/min(res['plain']):.3f}")
