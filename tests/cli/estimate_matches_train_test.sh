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
  "6 2 fp16 1 --node-ranks=3,--qgz=int8,--qgz-block=7" "3 2 bf16 1 --qgz=int4" \
  "4 1 bf16 2 --node-ranks=2,--qgz=int8" "3 1 fp32 1 --qgz=int4"; do
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
# Over nodes, estimate sets ZeRO++'s modes side by side at stage 3: each row's cross-node
# bytes are what --json says for that mode on its own.
"$zerodp" estimate "${shape[@]}" --ranks 6 --stage 3 --node-ranks 3 >"$tmp/modes.txt"
for mode in "flat|" "two-level|--collectives two-level" "two-level + hpZ|--collectives two-level --hpz" \
  "two-level + hpZ + qwZ + qgZ int4|--collectives two-level --hpz --qwz --qgz int4"; do
  name=${mode%%|*}
  read -r -a flags <<<"${mode#*|}"
  "$zerodp" estimate "${shape[@]}" --ranks 6 --stage 3 --node-ranks 3 "${flags[@]}" --json >"$tmp/m.json"
  if /usr/bin/env python3 - "$tmp/modes.txt" "$tmp/m.json" "$name" <<'PY'
import json, sys
text = open(sys.argv[1]).read().splitlines()
want = json.load(open(sys.argv[2]))[0]["comm_bytes_per_step"]["cross_node"]["total"]
def gb(b):
    return f"{b/1e9:.2f} GB" if b >= 1e9 else f"{b/1e6:.2f} MB" if b >= 1e6 else f"{b/1e3:.2f} KB"
rows = [l for l in text if l.strip().startswith(sys.argv[3] + "  ")]
assert len(rows) == 1, rows
assert rows[0][len("    ") + 34:].split()[0:2] == gb(want).split(), (rows[0], gb(want))
PY
  then echo "ok: estimate's modes table, $name: the cross-node bytes of --json"
  else echo "FAIL: estimate's modes table, $name"; fail=1
  fi
done
exit $fail
