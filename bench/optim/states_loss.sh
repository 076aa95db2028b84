#!/usr/bin/env bash
# 8-bit Adam moments against fp32 ones on the same tokens (issue: 8-bit optimizer states):
# GPT on KJV, 2 ranks at stage 1, the same schedule; both on each seed (the fp32 seeds' spread
# is the yardstick for the loss). Prints per run the final validation loss, its difference
# from fp32's on the same seed, rank 0's Adam moment bytes (adam_m + adam_v, from the ledger)
# and their ratio to fp32's, the median step time and the wall time. The losses and bytes are
# the same on every run of one binary on one CPU; the times are this machine's.
#
#   bench/optim/states_loss.sh [ZERODP] [STEPS] [SIZE]      (defaults: build/release, 2000, small)
#   ZERODP_STATES_SEEDS="1337 7": the seeds.
set -euo pipefail
zerodp=${1:-build/release/cli/zerodp}
steps=${2:-2000}
size=${3:-small}
out=$(mktemp -d /tmp/zerodp-states.XXXXXX)
trap 'rm -rf "$out"' EXIT
common=(train --size "$size" --data kjv --steps "$steps" --ranks 2 --stage 1 --eval-batches 64
        --no-progress)

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $size, $steps steps, 2 ranks, stage 1"
printf '%-6s %6s %10s %9s %14s %8s %12s %9s\n' states seed val_loss "vs fp32" "adam m+v B" "÷ fp32" \
  "step median" seconds
runs=()
for seed in ${ZERODP_STATES_SEEDS:-1337 7}; do runs+=("fp32 $seed" "int8 $seed"); done
for run in "${runs[@]}"; do
  read -r states seed <<<"$run"
  report="$out/$states-$seed.json"
  start=$(date +%s%N)
  "$zerodp" "${common[@]}" --optimizer-states "$states" --seed "$seed" --report "$report" >/dev/null
  wall=$(( ($(date +%s%N) - start) / 1000000 ))
  /usr/bin/python3 - "$report" "$out/fp32-$seed.json" "$states" "$seed" "$wall" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); base = json.load(open(sys.argv[2]))
states, seed, wall = sys.argv[3], sys.argv[4], int(sys.argv[5]) / 1000
def moments(x):
    m = x["ranks"][0]["model_state_bytes"]
    return m["adam_m"] + m["adam_v"]
val, val0 = r["final"]["val_loss"], base["final"]["val_loss"]
print(f"{states:<6} {seed:>6} {val:10.4f} {100 * (val / val0 - 1):+8.2f}% {moments(r):14,} "
      f"{moments(r) / moments(base):8.3f} {r['throughput']['step_seconds_median']:11.4f}s {wall:9.1f}")
PY
done
# The yardstick: how far apart the fp32 seeds land.
/usr/bin/python3 - "$out"/fp32-*.json <<'PY'
import json, sys
vals = [json.load(open(p))["final"]["val_loss"] for p in sys.argv[1:]]
if len(vals) > 1:
    print(f"fp32 seeds' validation losses {min(vals):.4f}..{max(vals):.4f}: "
          f"spread {100 * (max(vals) / min(vals) - 1):.2f}%")
PY
