#!/usr/bin/env bash
# What a checkpoint costs the steps (issue: asynchronous checkpoints): the same run with no
# checkpoints, with a synchronous save every K steps and with --checkpoint-async (--keep 2),
# alternated, the best of 2. Prints tokens/s (the steps' own, from the report), their ratio
# to the run without checkpoints (over the steps' seconds and the saves' stalls), and the mean stall per save (the training thread's time in
# it; the run's last save, synchronous in every mode, left out) and, asynchronous, the
# writer's mean time per save and its CPU time in it.
#
#   bench/checkpoint/async.sh [ZERODP] [SIZE] [STEPS] [RANKS]   (defaults: build/release, small, 20, 2)
#   ZERODP_CKBENCH_FLAGS="--offload optimizer --offload-dir /var/tmp" ...: more train flags
#   ZERODP_CKBENCH_EVERY=K: a save every K steps (default 1)
#   ZERODP_CKBENCH_DIR=/dev/shm: where the checkpoints go (default /tmp): a tmpfs there has
#     no disk behind it, which leaves the saves' own cost to the CPU and memory
set -euo pipefail
zerodp=${1:-build/release/cli/zerodp}
size=${2:-small}
steps=${3:-20}
ranks=${4:-2}
every=${ZERODP_CKBENCH_EVERY:-1}
out=$(mktemp -d "${ZERODP_CKBENCH_DIR:-/tmp}/zerodp-ckbench.XXXXXX")
trap 'rm -rf "$out"' EXIT
read -r -a extra <<<"${ZERODP_CKBENCH_FLAGS:-}"
common=(train --size "$size" --data synthetic --steps "$steps" --ranks "$ranks" --stage 2
        --no-progress "${extra[@]}")

# tokens/s, mean stall, mean write of one run
measure() {
  local mode=$1 dir=$out/ck-$1
  rm -rf "$dir"
  local flags=()
  case $mode in
    sync) flags=(--checkpoint-dir "$dir" --checkpoint-every "$every" --keep 2) ;;
    async) flags=(--checkpoint-dir "$dir" --checkpoint-every "$every" --keep 2 --checkpoint-async) ;;
  esac
  "$zerodp" "${common[@]}" "${flags[@]}" --report "$out/r.json" >/dev/null
  /usr/bin/python3 - "$out/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = r["steps"][1:]  # the first step warms up
ck = r.get("checkpoints")
# A step's seconds leave its save out: the saves' stalls after steps 2..N-1 are added (the
# last save, synchronous in every mode, is not).
stalls = sum(ck["stall_seconds"][1:-1]) if ck else 0.0
tps = sum(s["tokens"] for s in steps) / (sum(s["seconds"] for s in steps) + stalls)
stall = write = cpu = float("nan")
if ck and len(ck["stall_seconds"]) > 1:
    s = ck["stall_seconds"][:-1]
    stall = sum(s) / len(s)
if ck and ck["write_seconds"]:
    write = sum(ck["write_seconds"]) / len(ck["write_seconds"])
    c = ck.get("write_cpu_seconds")  # absent from the reports of older builds
    cpu = sum(c) / len(c) if c else float("nan")
print(tps, stall, write, cpu)
PY
}

declare -A tps stall write cpu
for mode in none sync async; do tps[$mode]=0; done
for _ in 1 2; do
  for mode in none sync async; do
    read -r t s w c < <(measure "$mode")
    if /usr/bin/python3 -c "import sys; sys.exit(0 if $t > ${tps[$mode]} else 1)"; then
      tps[$mode]=$t stall[$mode]=$s write[$mode]=$w cpu[$mode]=$c
    fi
  done
done
shard=$(du -sb "$out/ck-sync/$(cat "$out/ck-sync/latest")" | cut -f1)
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $size, $ranks ranks, stage 2, $steps steps, a checkpoint of $shard bytes every $every step(s) on $(df --output=fstype "$out" | tail -1) ($(dirname "$out"))${extra[*]:+; ${extra[*]}}"
printf '%-6s %12s %10s %14s %14s %14s\n' mode tokens/s "÷ none" "stall/save s" "write/save s" \
  "writer CPU s"
for mode in none sync async; do
  printf '%-6s %12.0f %10.3f %14.4f %14.4f %14.4f\n' "$mode" "${tps[$mode]}" \
    "$(/usr/bin/python3 -c "print(${tps[$mode]} / ${tps[none]})")" "${stall[$mode]}" \
    "${write[$mode]}" "${cpu[$mode]}"
done
/usr/bin/python3 -c "print(f'async stall / sync stall: {${stall[async]} / ${stall[sync]}:.3f}')"
