#!/usr/bin/env bash
# DiLoCo against synchronous training on the same tokens (issue: low-communication training):
# GPT on KJV, 2 islands x 2 ranks (4 ranks, nodes of 2), the same global batch and schedule.
# Prints, per mode, the final validation loss, the cross-node bytes per step of rank 0 and
# their ratio to two-level stage 3's, and the wall time. Deterministic but for the time: the
# losses and bytes are the same on every run of one binary on one CPU.
#
#   bench/diloco/loss_vs_bytes.sh [ZERODP] [STEPS] [SIZE]      (defaults: build/release, 2000, small)
#   ZERODP_DILOCO_MODES="sync hsdp h10 h50 h100 s100f4d5" selects modes (hH: DiLoCo at H;
#   sHfFdD: Streaming DiLoCo, F fragments, each merged D steps after it starts; a q4 or q8
#   suffix sends the outer gradients as int4 or int8 blocks, --outer-quant);
#   ZERODP_DILOCO_SEEDS="1337 7" the seeds of the synchronous run (their spread is the
#   yardstick for the loss target); ZERODP_DILOCO_EVERY_SEED=1 runs every mode at every seed;
#   ZERODP_DILOCO_EXTRA="--outer-momentum 0.8" adds flags to the island modes.
set -euo pipefail
zerodp=${1:-build/release/cli/zerodp}
steps=${2:-2000}
size=${3:-small}
modes=${ZERODP_DILOCO_MODES:-"sync hsdp h10 h50 h100 s100f4d5"}
seeds=${ZERODP_DILOCO_SEEDS:-"1337 7"}
out=$(mktemp -d /tmp/zerodp-diloco.XXXXXX)
trap 'rm -rf "$out"' EXIT

common=(--size "$size" --data kjv --steps "$steps" --ranks 4 --node-ranks 2 --stage 3
        --eval-batches 64 --no-progress)
flags_of() {
  case "$1" in
    *q4) echo "$(flags_of "${1%q4}") --outer-quant int4" ;;
    *q8) echo "$(flags_of "${1%q8}") --outer-quant int8" ;;
    sync) echo "--collectives two-level" ;;
    hsdp) echo "--shard-within-node" ;;
    h*) echo "--islands 2 --outer-every ${1#h}" ;;
    s*)  # sHfFdD: Streaming DiLoCo, H, F fragments, merged D steps after each exchange starts
      local spec=${1#s} fragments
      fragments=${spec#*f}
      echo "--islands 2 --outer-every ${spec%%f*} --fragments ${fragments%%d*}" \
        "--outer-delay ${spec##*d}" ;;
  esac
}

printf '%-10s %6s %10s %16s %10s %9s\n' mode seed val_loss "cross-node B/step" "÷ sync" seconds
sync_bytes=""
for mode in $modes; do
  for seed in $seeds; do
    # One seed for the DiLoCo and HSDP modes unless asked; the synchronous run's spread needs
    # two.
    [[ "$mode" != sync && "$seed" != "${seeds%% *}" && -z "${ZERODP_DILOCO_EVERY_SEED:-}" ]] &&
      continue
    extra=()
    [[ "$mode" == h[0-9]* || "$mode" == s[0-9]* ]] && read -r -a extra <<<"${ZERODP_DILOCO_EXTRA:-}"
    report="$out/$mode-$seed.json"
    start=$(date +%s%N)
    # shellcheck disable=SC2046
    "$zerodp" train "${common[@]}" --seed "$seed" $(flags_of "$mode") "${extra[@]}" \
      --report "$report" >/dev/null
    end=$(date +%s%N)
    read -r val bytes < <(/usr/bin/python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = len(r["steps"])
cross = sum(v["cross_node_bytes"] for k, v in r["ranks"][0]["comm"].items() if k != "control")
print(r["final"]["val_loss"], cross / steps)
PY
)
    [[ "$mode" == sync && -z "$sync_bytes" ]] && sync_bytes=$bytes
    ratio=$(/usr/bin/python3 -c "print(f'{float(\"${sync_bytes:-0}\") / $bytes:.1f}' if $bytes > 0 and '${sync_bytes}' else '-')")
    printf '%-10s %6s %10.4f %16.0f %10s %9.1f\n' "$mode" "$seed" "$val" "$bytes" "$ratio" \
      "$(((end - start) / 1000000))e-3"
  done
done
