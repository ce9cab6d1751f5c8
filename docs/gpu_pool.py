#!/usr/bin/env python3
"""What GPU goodput per hour of makespan a trace allows, on an idealised fleet.

    python3 docs/gpu_pool.py s7.yaml [GPUS]

The fleet is one pool of interchangeable GPUs (2,000 by default, as in gen_scenario.py's 10 x 50
nodes): no clusters, no queues' cluster lists, no NUMA zones, no CPU or memory limit, so every
dispatcher on real workers does no better than this pool under the same order. Only the GPU Jobs
are run; a Job takes all its pods' GPUs at once, at its submission or later, for podStartDelay +
duration. Each order is list scheduling: at every arrival and end, the waiting Jobs are taken in
the order and every one that fits starts (backfill), or, strict, none after the first that does
not. Random orders show what luck alone moves. "longest first" knows every Job's duration, which neither the trace's Jobs nor any
dispatcher do: it shows what knowing runtimes would be worth.
"""
import heapq
import random
import re
import sys

JOB = re.compile(r'\{name: (\S+), queue: (\S+), submitAt: ([\d.]+)s, parallelism: (\d+), '
                 r'duration: (\d+)s, podStartDelay: (\d+)s, template: (.*)\}')


def gpu_jobs(text):
    jobs = []
    for m in JOB.finditer(text):
        g = re.search(r'nvidia.com/gpu: "(\d+)"', m.group(7))
        if g and int(g.group(1)):
            jobs.append(dict(submit=float(m.group(3)), gpus=int(m.group(4)) * int(g.group(1)),
                             run=int(m.group(6)) + int(m.group(5)), dur=int(m.group(5))))
    return jobs


def makespan(jobs, fleet, key, backfill):
    arrivals = sorted(jobs, key=lambda j: j['submit'])
    free, i, end = fleet, 0, 0.0
    running, waiting = [], []
    while i < len(arrivals) or running:
        next_times = [arrivals[i]['submit']] if i < len(arrivals) else []
        next_times += [running[0][0]] if running else []
        t = min(next_times)
        while running and running[0][0] <= t:
            free += heapq.heappop(running)[1]
        while i < len(arrivals) and arrivals[i]['submit'] <= t:
            waiting.append(arrivals[i])
            i += 1
        waiting.sort(key=key)
        left, blocked = [], False
        for j in waiting:
            if j['gpus'] <= free and (backfill or not blocked):
                free -= j['gpus']
                heapq.heappush(running, (t + j['run'], j['gpus']))
                end = max(end, t + j['run'])
            else:
                blocked = True
                left.append(j)
        waiting = left
        if any(j['gpus'] > fleet for j in waiting):
            sys.exit('a Job needs more GPUs than the fleet has')
    return end


def main():
    jobs = gpu_jobs(open(sys.argv[1]).read())
    fleet = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    work = sum(j['gpus'] * j['dur'] for j in jobs)
    print(f"{len(jobs)} GPU Jobs, {work / 1e6:.2f} M GPU-s of work, {fleet} GPUs: "
          f"makespan at least {work / fleet:.0f} s")
    orders = [("submission order, strict", lambda j: j['submit'], False),
              ("submission order, backfill", lambda j: j['submit'], True),
              ("most GPUs first, backfill", lambda j: (-j['gpus'], j['submit']), True),
              ("longest first (knows durations), backfill", lambda j: (-j['dur'], j['submit']), True)]
    for name, key, backfill in orders:
        end = makespan(jobs, fleet, key, backfill)
        print(f"{name:44} makespan {end:6.0f} s, GPU goodput per hour {work / end * 3600 / 1e6:.2f} M")
    # Orders blind to durations, at random: the spread luck alone gives.
    ends = []
    for seed in range(20):
        rng = random.Random(seed)
        rank = {id(j): rng.random() for j in jobs}
        ends.append(makespan(jobs, fleet, lambda j: rank[id(j)], True))
    print(f"{'20 random orders, backfill':44} makespan {min(ends):6.0f} - {max(ends):6.0f} s, "
          f"GPU goodput per hour {work / max(ends) * 3600 / 1e6:.2f} - {work / min(ends) * 3600 / 1e6:.2f} M")


if __name__ == '__main__':
    main()
