#!/usr/bin/env python3
"""What users feel on the mixed trace (scenarios written by gen_scenario.py, one Job per line),
from `switchyard simulate --output json` reports (one report, or the array of --strategy all):
mean start wait (submitted -> all pods Ready) of CPU-only Jobs, of GPU Jobs and of the largest
gangs (8 pods x 4 GPUs), GPU-seconds of Succeeded Jobs, failed Jobs, TopologyAffinityErrors,
makespan, GPU-seconds per hour of makespan, and Jobs that never started. With the three
strategies of `--strategy all`, a last line checks the starvation rule's targets against the
better baseline (the one with the more GPU goodput per hour).
usage: python3 docs/feel.py scenario.yaml report.json [report.json ...]"""
import json, re, sys
scen = open(sys.argv[1]).read()
jobs = {}
for m in re.finditer(r"- \{name: (\S+), queue: (\S+), submitAt: ([\d.]+)s, parallelism: (\d+), duration: (\d+)s.*?requests: \{([^}]*)\}", scen):
    name, q, at, par, dur, req = m.groups()
    gpu = re.search(r'nvidia.com/gpu: "(\d+)"', req)
    jobs[name] = dict(queue=q, par=int(par), dur=int(dur), gpu=int(gpu.group(1)) if gpu else 0)
def mean(xs): return sum(xs)/len(xs) if xs else float('nan')
rows = []
for path in sys.argv[2:]:
    d = json.load(open(path))
    out = d if isinstance(d, list) else [d]
    for run in out:
        s = run['summary']; js = run['jobs']
        cpu = [j['started']-j['submitted'] for j in js if j.get('started') is not None and jobs[j['name']]['gpu']==0]
        gpu = [j['started']-j['submitted'] for j in js if j.get('started') is not None and jobs[j['name']]['gpu']>0]
        big = [j['started']-j['submitted'] for j in js if j.get('started') is not None and jobs[j['name']]['par']==8 and jobs[j['name']]['gpu']>=4]
        gsec = sum(jobs[j['name']]['gpu']*jobs[j['name']]['par']*jobs[j['name']]['dur'] for j in js if j.get('result')=='Succeeded')
        never = sum(1 for j in js if j.get('started') is None)
        rows.append((run.get('strategy', path), mean(cpu), mean(gpu), mean(big), gsec/1e6, s['failed'], s['topologyAffinityErrors'], s['makespan'], gsec/ s['makespan']*3600/1e6 if s['makespan'] else 0, never))
print(f"{'strategy':14} {'cpuWait':>9} {'gpuWait':>9} {'bigGpuWait':>10} {'GPU-Ms':>7} {'failed':>6} {'TAE':>6} {'makespan':>8} {'GPUMs/h':>8} {'unstarted':>9}")
for r in rows:
    print(f"{r[0]:14} {r[1]:9.0f} {r[2]:9.0f} {r[3]:10.0f} {r[4]:7.2f} {r[5]:6} {r[6]:6} {r[7]:8} {r[8]:8.2f} {r[9]:9}")
by = {r[0]: r for r in rows}
if {'switchyard', 'all-at-once', 'sum-aggregate'} <= by.keys():
    sw = by['switchyard']
    base = max((by['all-at-once'], by['sum-aggregate']), key=lambda r: r[8])
    gain = sw[8] / base[8] if base[8] else float('inf')
    print(f"against {base[0]}: CPU-only wait {sw[1]:.0f} s (target <= {2 * base[1] + 60:.0f} s), "
          f"GPU goodput per hour {gain:.3f} x (target >= 1.2 x), "
          f"failed {sw[5]} (target <= {base[5] // 2})")
