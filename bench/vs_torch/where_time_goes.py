"""Where a zerodp step's time goes, from `zerodp train --trace` files (docs/performance.md).

Usage: /usr/bin/python3 bench/vs_torch/where_time_goes.py [--skip N] LABEL=TRACE.json ...

Per trace, averaged over rank 0's steps after the first N (default 3): milliseconds per step
of forward and backward compute (unit spans; a unit's span includes waiting for its gathered
parameters at stage 3), the boundary reduction, the verdict (overflow and norm agreement),
the optimizer, and the rest of the step (data, conversions, waits outside those spans); then
the rank's communication thread's busy time per step, which overlaps the compute above.

It first prints this machine's CPU (machine.py): a trace does not record the CPU that made it,
so run this where the traces were made, as bench/vs_torch's figures are.
"""

import argparse
import json
import re
import statistics

import machine


def categorize(name):
    if name.startswith("forward"):
        return "forward"
    if name.startswith("backward"):
        return "backward"
    if name == "boundary reduce":
        return "boundary"
    if name == "verdict":
        return "verdict"
    if name == "optimizer":
        return "optimizer"
    return None


def analyse(path, skip):
    with open(path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    spans = [e for e in events if e.get("ph") == "X" and e.get("pid", 0) == 0]
    steps = sorted((e for e in spans if e.get("tid") == 0 and re.fullmatch(r"step \d+", e["name"])),
                   key=lambda e: e["ts"])[skip:]
    if not steps:
        raise SystemExit(f"{path}: no 'step N' spans after skipping {skip}; train longer")
    rows = []
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        row = dict(step=s["dur"], forward=0.0, backward=0.0, boundary=0.0, verdict=0.0, optimizer=0.0,
                   comm=0.0)
        for e in spans:
            if e["ts"] < lo or e["ts"] >= hi:
                continue
            if e.get("tid") == 0:
                c = categorize(e["name"])
                if c:
                    row[c] += e["dur"]
            else:
                row["comm"] += e["dur"]
        row["other"] = row["step"] - sum(row[k] for k in ("forward", "backward", "boundary", "verdict",
                                                           "optimizer"))
        rows.append(row)
    return {k: statistics.mean(r[k] for r in rows) / 1e3 for k in rows[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip", type=int, default=3, help="steps left out at the start")
    p.add_argument("traces", nargs="+", metavar="LABEL=TRACE.json")
    a = p.parse_args()
    print(machine.cpu_line(machine.cpu_info()) + " -- this machine; traces do not name theirs")
    print("| run | step ms | forward | backward | boundary reduce | verdict | optimizer | other "
          "| comm thread busy (overlapped) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for item in a.traces:
        label, _, path = item.rpartition("=")
        r = analyse(path, a.skip)
        print(f"| {label or path} | {r['step']:.1f} | {r['forward']:.1f} | {r['backward']:.1f} "
              f"| {r['boundary']:.1f} | {r['verdict']:.1f} | {r['optimizer']:.1f} | {r['other']:.1f} "
              f"| {r['comm']:.1f} |")


if __name__ == "__main__":
    main()
