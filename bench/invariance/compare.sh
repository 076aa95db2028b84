#!/usr/bin/env bash
# docs/performance.md's canonical-order table: step time, bytes per step and peak memory of
# the canonical gradient order (--invariant on) against the order it replaces (--invariant
# off: at stages 0-1 with A > 1 the local pre-sum, elsewhere a rounding per micro-batch),
# for small and medium, A = 1 and 4, stages 0 and 3, 2 local ranks, bf16. The two modes
# alternate and each figure is the best of --repeats runs (the host's speed drifts).
#   bench/invariance/compare.sh [--zerodp BIN] [--baseline BIN] [--repeats R] [--sizes "small medium"]
# --baseline: another binary run as a third column with its defaults (e.g. a build from
# before the canonical order), to compare A = 1 against it.
set -euo pipefail
zerodp=build/release/cli/zerodp
baseline=""
repeats=2
sizes="small medium"
while [[ $# -gt 0 ]]; do
  case $1 in
    --zerodp) zerodp=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lscpu | grep -E "^Model name" | sed 's/  */ /g'
for size in $sizes; do
  steps=6; [[ $size == medium ]] && steps=3
  for a in 1 4; do
    for stage in 0 3; do
      for r in $(seq "$repeats"); do
        modes="off on"; [[ -n $baseline ]] && modes="off on base"
        for mode in $modes; do
          bin=$zerodp; flags=(--invariant "$mode")
          [[ $mode == base ]] && { bin=$baseline; flags=(); }
          "$bin" train --size "$size" --ranks 2 --stage "$stage" --grad-accum "$a" \
            --precision bf16 --steps "$steps" --eval-batches 0 --no-progress "${flags[@]}" \
            --report "$tmp/$size-$a-$stage-$mode-$r.json" >/dev/null
        done
      done
    done
  done
done
/usr/bin/env python3 - "$tmp" "$repeats" "$baseline" <<'PY'
import glob, json, os, sys
d, repeats, baseline = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def best(size, a, stage, mode):
    runs = [json.load(open(f)) for f in glob.glob(os.path.join(d, f"{size}-{a}-{stage}-{mode}-*.json"))]
    r = min(runs, key=lambda r: r["throughput"]["step_seconds_median"])
    rank = r["ranks"][0]
    steps = len(r["steps"])
    comm = sum(v["bytes"] for k, v in rank["comm"].items() if k != "control") / steps
    return {"s": r["throughput"]["step_seconds_median"], "comm": comm,
            "peak": rank["peak_bytes"]["total"], "acc": rank["peak_bytes"].get("grad_accum", 0),
            "policy": r["config"]["accumulate"]}
mib = lambda b: f"{b / 2**20:.1f}"
head = "| size | A | stage | off: policy | off s/step | on s/step | on / off |"
if baseline:
    head += " before s/step | on / before |"
head += " comm MiB/step off → on | peak MiB off → on | grad_accum MiB |"
print(head)
print("|" + "---|" * (head.count("|") - 1))
for size in ["small", "medium"]:
    for a in (1, 4):
        for stage in (0, 3):
            if not glob.glob(os.path.join(d, f"{size}-{a}-{stage}-on-*.json")):
                continue
            off, on = best(size, a, stage, "off"), best(size, a, stage, "on")
            row = f"| {size} | {a} | {stage} | {off['policy']} | {off['s']:.3f} | {on['s']:.3f} | {on['s'] / off['s']:.2f} |"
            if baseline:
                base = best(size, a, stage, "base")
                row += f" {base['s']:.3f} | {on['s'] / base['s']:.2f} |"
            row += (f" {mib(off['comm'])} → {mib(on['comm'])} | {mib(off['peak'])} → {mib(on['peak'])} |"
                    f" {mib(on['acc'])} |")
            print(row)
PY
