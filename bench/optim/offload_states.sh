#!/usr/bin/env bash
# 8-bit Adam moments on the offloaded run (issue: 8-bit optimizer states): the same training
# with --offload optimizer, fp32 moments then int8 (alternated when repeated), one rank at
# stage 0. Prints per run the offload file's bytes, the moments' bytes left in memory
# (adam_m + adam_v: the 8-bit run's block scales and small tensors), the bytes the updates
# read and wrote and their wall time (all updates but the first, whose reads of never-written
# blocks the file system answers without the disk), the median step and the final loss.
#
#   bench/optim/offload_states.sh ZERODP DIR [STEPS] [REPEAT]   (defaults: 4 steps, 1 repeat)
#   ZERODP_OFFLOAD_FIRST=int8: start with int8 (the order alternates on every repeat).
#   ZERODP_OFFLOAD_SHAPE: the model flags (default: the 2.0-billion-parameter GPT of
#   docs/offload.md, --layers 40 --embd 2048 --heads 16 --seq-len 128: 24 GB of file at fp32).
set -euo pipefail
zerodp=${1:?usage: offload_states.sh ZERODP DIR [STEPS] [REPEAT]}
dir=${2:?usage: offload_states.sh ZERODP DIR [STEPS] [REPEAT]}
steps=${3:-4}
repeat=${4:-1}
read -r -a shape <<<"${ZERODP_OFFLOAD_SHAPE:---layers 40 --embd 2048 --heads 16 --seq-len 128}"
out=$(mktemp -d /tmp/zerodp-offload-states.XXXXXX)
trap 'rm -rf "$out"' EXIT

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); ${shape[*]}, $steps steps, 1 rank, stage 0, --offload-dir $dir"
printf '%-6s %14s %14s %16s %10s %10s %10s\n' states "file B" "moments mem B" "update B (2..)" \
  "update s" "step med" loss
swap=0
[[ ${ZERODP_OFFLOAD_FIRST:-fp32} == int8 ]] && swap=1
for ((k = 0; k < repeat; k++)); do
  # Alternated: the host's disk rate drifts, so neither precision always runs first.
  order=(fp32 int8)
  if (((k + swap) % 2 == 1)); then order=(int8 fp32); fi
  for states in "${order[@]}"; do
    report="$out/$states-$k.json"
    "$zerodp" train "${shape[@]}" --micro-batch 1 --ranks 1 --stage 0 --steps "$steps" \
      --lr 3e-4 --eval-batches 1 --no-progress --offload optimizer --offload-dir "$dir" \
      --optimizer-states "$states" --report "$report" --trace "$out/$states-$k.trace.json" \
      >/dev/null
    /usr/bin/python3 - "$report" "$out/$states-$k.trace.json" "$states" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
trace = json.load(open(sys.argv[2]))
rank = r["ranks"][0]
states = rank["model_state_bytes"]
io = rank["offload_io"]
# The trace's optimizer spans (the updates), in step order: all but the first.
events = trace["traceEvents"] if isinstance(trace, dict) else trace
updates = sorted((e["ts"], e["dur"]) for e in events
                 if e.get("ph") == "X" and e.get("name") == "optimizer")
later = [d / 1e6 for _, d in updates[1:]]
steps = [s["seconds"] for s in r["steps"]]
per_update = io["update_bytes"] / max(len(updates), 1)
print(f'{sys.argv[3]:<6} {rank["nvme_bytes"]:>14,} {states["adam_m"] + states["adam_v"]:>14,} '
      f'{int(per_update * len(later)):>16,} {sum(later):>10.3f} {statistics.median(steps):>10.2f} '
      f'{r["steps"][-1]["loss"]:>10.4f}')
PY
  done
done
