#!/usr/bin/env bash
# `zerodp estimate` predicts, before training, exactly what `zerodp train --report` measures:
# rank 0's model-state bytes per category, comm bytes per step per collective, and (a GPT
# shape and micro-batch given) every transient category and the peak total, all exactly.
set -euo pipefail
zerodp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shape=(--layers 2 --heads 2 --embd 32 --seq-len 32)
fail=0
for case in "3 0 bf16 1 -" "3 1 fp16 2 -" "4 2 bf16 2 --checkpoint-activations" "3 3 fp32 1 -" \
  "2 3 bf16 2 --checkpoint-activations" "3 0 bf16 3 --invariant=on" "2 1 fp16 2 --invariant=on" "4 3 bf16 2 --node-ranks=2" \
  "6 0 fp32 1 --node-ranks=3" "6 3 bf16 2 --node-ranks=3,--collectives=two-level" \
  "6 0 fp16 1 --node-ranks=2,--collectives=two-level" "4 3 bf16 2 --node-ranks=2,--hpz" \
  "6 3 fp16 1 --node-ranks=3,--collectives=two-level,--hpz" \
  "4 3 bf16 2 --node-ranks=2,--collectives=two-level,--hpz,--qwz,--qwz-block=64" \
  "3 3 fp32 1 --qwz,--qwz-block=100" \
  "4 3 bf16 2 --node-ranks=2,--collectives=two-level,--hpz,--qwz,--qgz=int4,--qgz-block=64" \
  "6 2 fp16 1 --node-ranks=3,--qgz=int8,--qgz-block=7" "3 2 bf16 1 --qgz=int4"; do
  read -r n stage precision accum ckpt <<<"$case"
  extra=()
  [[ $ckpt != - ]] && IFS=, read -r -a extra <<<"$ckpt"
  "$zerodp" train --size tiny --data synthetic --steps 2 --micro-batch 2 --no-progress \
    --ranks "$n" --stage "$stage" --precision "$precision" --grad-accum "$accum" \
    "${extra[@]}" --report "$tmp/r.json" >/dev/null
  "$zerodp" estimate "${shape[@]}" --ranks "$n" --stage "$stage" --precision "$precision" \
    --grad-accum "$accum" --micro-batch 2 "${extra[@]}" --json >"$tmp/e.json"
  if /usr/bin/env python3 - "$tmp/r.json" "$tmp/e.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))[0]
rank0 = r["ranks"][0]
for k in ("params", "grads", "master", "adam_m", "adam_v"):
    assert rank0["model_state_bytes"][k] == e["model_state_bytes"][k], (k, rank0["model_state_bytes"][k], e["model_state_bytes"][k])
steps = len(r["steps"])
for k in ("all_reduce", "reduce_scatter", "all_gather"):
    assert rank0["comm"][k]["bytes"] == e["comm_bytes_per_step"][k] * steps, (k, rank0["comm"][k]["bytes"], e["comm_bytes_per_step"][k])
    cross = e["comm_bytes_per_step"]["cross_node"][k] * steps
    assert rank0["comm"][k]["cross_node_bytes"] == cross, (k, rank0["comm"][k]["cross_node_bytes"], cross)
for k in ("activations", "workspace", "gathered", "grad_buckets", "grad_accum", "comm_buffers", "hpz_params"):
    assert rank0["peak_bytes"][k] == e["transient_bytes"][k], (k, rank0["peak_bytes"][k], e["transient_bytes"][k])
assert rank0["peak_bytes"]["total"] == e["peak_bytes"], (rank0["peak_bytes"]["total"], e["peak_bytes"])
PY
  then echo "ok: N=$n stage $stage $precision A=$accum $ckpt: states, comm, transients, peak"
  else echo "FAIL: N=$n stage $stage $precision A=$accum $ckpt"; fail=1
  fi
done
exit $fail
