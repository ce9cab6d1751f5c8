#!/usr/bin/env python3
"""Cut a scenario written by `cargo bench --bench simulate -- ... --write-scenario FILE` down to
its first CLUSTERS clusters and every EVERY-th Job, the queues' cluster lists cut to match.

The load per cluster stays about the same when EVERY is the ratio of the clusters kept (50 / 10:
every 5th Job), so the cut file asks the dispatcher the same kind of questions, fewer of them:
small enough to count its instructions under valgrind in minutes, which, unlike time on a
machine whose speed drifts, compares two builds exactly.

    python3 docs/cut_scenario.py big.yaml 10 5 > small.yaml
    valgrind --tool=cachegrind --cache-sim=no switchyard simulate --scenario small.yaml --output json
"""
import re
import sys


def cut(lines, clusters, every):
    section, keep, job = None, True, 0
    for line in lines:
        if line in ("clusters:", "queues:", "jobs:"):
            section = line
            yield line
        elif section == "clusters:":
            m = re.match(r"  - name: c(\d+)$", line)
            if m:
                keep = int(m.group(1)) < clusters
            if keep:
                yield line
        elif section == "queues:" and "clusters: [" in line:
            names = [c for c in re.findall(r"c(\d+)", line) if int(c) < clusters]
            yield "    clusters: [" + ", ".join("c" + c for c in names) + "]"
        elif section == "jobs:" and line.startswith("  - "):
            if job % every == 0:
                yield line
            job += 1
        else:
            yield line


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: cut_scenario.py SCENARIO.yaml CLUSTERS EVERY > CUT.yaml")
    path, clusters, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(path) as f:
        lines = f.read().split("\n")
    sys.stdout.write("\n".join(cut(lines, clusters, every)))


if __name__ == "__main__":
    main()
