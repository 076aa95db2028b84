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
  "4 1 bf16 2 --node-ranks=2,--qgz=int8" "3 1 fp32 1 --qgz=int4" \
  "4 0 bf16 2 --node-ranks=2,--qgz=int4,--qgz-block=64" "3 0 fp16 1 --qgz=int8,--accumulate=local" \
  "4 1 bf16 2 --node-ranks=2,--shard-within-node" "6 3 fp16 1 --node-ranks=3,--shard-within-node" \
  "6 2 bf16 2 --node-ranks=2,--shard-within-node,--accumulate=local" \
  "3 1 bf16 1 --optimizer-states=int8" "3 0 fp16 2 --optimizer-states=int8,--invariant=on" \
  "4 3 bf16 2 --optimizer-states=int8,--node-ranks=2,--collectives=two-level,--hpz,--qgz=int4" \
  "4 2 bf16 1 --optimizer-states=int8,--node-ranks=2,--shard-within-node" \
  "3 1 bf16 1 --offload=optimizer" "3 3 fp16 2 --optimizer-states=int8,--offload=optimizer"; do
  read -r n stage precision accum ckpt <<<"$case"
  extra=()
  [[ $ckpt != - ]] && IFS=, read -r -a extra <<<"$ckpt"
  # Where the offload file goes is train's alone.
  scratch=()
  [[ $ckpt == *--offload* ]] && scratch=(--offload-dir "$tmp")
  "$zerodp" train --size tiny --data synthetic --steps 2 --micro-batch 2 --no-progress \
    --ranks "$n" --stage "$stage" --precision "$precision" --grad-accum "$accum" \
    "${extra[@]}" "${scratch[@]}" --report "$tmp/r.json" >/dev/null
  "$zerodp" estimate "${shape[@]}" --ranks "$n" --stage "$stage" --precision "$precision" \
    --grad-accum "$accum" --micro-batch 2 "${extra[@]}" --json >"$tmp/e.json"
  if /usr/bin/env python3 - "$tmp/r.json" "$tmp/e.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))[0]
rank0 = r["ranks"][0]
for k in ("params", "grads", "master", "adam_m", "adam_v"):
    assert rank0["model_state_bytes"][k] == e["model_state_bytes"][k], (k, rank0["model_state_bytes"][k], e["model_state_bytes"][k])
# --offload: the file's bytes (the offload staging is in the peak below).
assert rank0.get("nvme_bytes", 0) == e["model_state_bytes"].get("nvme", 0), (rank0.get("nvme_bytes"), e["model_state_bytes"].get("nvme"))
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
# --checkpoint-async: each rank's staging of its shard, in estimate's peak as in train's.
for case in "3 1 bf16 -" "4 3 fp32 -" "3 2 bf16 --optimizer-states=int8"; do
  read -r n stage precision more <<<"$case"
  extra=()
  [[ $more != - ]] && extra=("$more")
  rm -rf "$tmp/ck"
  "$zerodp" train --size tiny --data synthetic --steps 2 --micro-batch 2 --no-progress \
    --ranks "$n" --stage "$stage" --precision "$precision" --checkpoint-dir "$tmp/ck" \
    --checkpoint-every 1 --checkpoint-async "${extra[@]}" --report "$tmp/r.json" >/dev/null
  "$zerodp" estimate "${shape[@]}" --ranks "$n" --stage "$stage" --precision "$precision" \
    --micro-batch 2 --checkpoint-async "${extra[@]}" --json >"$tmp/e.json"
  if /usr/bin/env python3 - "$tmp/r.json" "$tmp/e.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))[0]
rank0 = r["ranks"][0]
assert rank0["peak_bytes"]["checkpoint_staging"] == e["checkpoint_staging_bytes"] > 0, (rank0["peak_bytes"]["checkpoint_staging"], e["checkpoint_staging_bytes"])
assert rank0["peak_bytes"]["total"] == e["peak_bytes"], (rank0["peak_bytes"]["total"], e["peak_bytes"])
PY
  then echo "ok: N=$n stage $stage $precision $more --checkpoint-async: staging and peak"
  else echo "FAIL: N=$n stage $stage $precision --checkpoint-async"; fail=1
  fi
done
# Over nodes, estimate sets ZeRO++'s modes side by side at stage 3: each row of the table and
# of --json's node_modes is what estimate says for that mode's flags on their own (cross-node
# and total bytes, and need_bytes the peak of the stage-3 row; A = 2 so flat keeps the
# canonical order's fp32 accumulator and the two-level modes do not).
modes_shape=("${shape[@]}" --ranks 6 --stage 3 --node-ranks 3 --grad-accum 2 --micro-batch 2)
"$zerodp" estimate "${modes_shape[@]}" >"$tmp/modes.txt"
"$zerodp" estimate "${modes_shape[@]}" --json >"$tmp/modes.json"
nmodes=$(/usr/bin/python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))[0]["node_modes"]))' "$tmp/modes.json")
if [[ $nmodes -lt 9 ]]; then echo "FAIL: estimate --json gives $nmodes node modes, want 9 or more"; fail=1; fi
for ((i = 0; i < nmodes; i++)); do
  read -r -a flags < <(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[0]["node_modes"][int(sys.argv[2])]["flags"])' "$tmp/modes.json" "$i")
  "$zerodp" estimate "${modes_shape[@]}" "${flags[@]}" --json >"$tmp/m.json"
  # The same collectives and qgZ without hpZ's copy and qwZ's staging: what they add.
  # HSDP adds states (1/T of them instead of 1/N): against two-level ZeRO, in the same order.
  bare=()
  for x in "${flags[@]}"; do [[ $x == --hpz || $x == --qwz ]] || bare+=("$x"); done
  [[ " ${flags[*]} " == *" --shard-within-node "* ]] && bare=(--collectives two-level)
  "$zerodp" estimate "${modes_shape[@]}" "${bare[@]}" --json >"$tmp/b.json"
  if /usr/bin/python3 - "$tmp/modes.txt" "$tmp/modes.json" "$tmp/m.json" "$i" "$tmp/b.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read().splitlines()
mode = json.load(open(sys.argv[2]))[0]["node_modes"][int(sys.argv[4])]
alone = json.load(open(sys.argv[3]))[0]
bare = json.load(open(sys.argv[5]))[0]
def gb(b):
    return f"{b/1e9:.2f} GB" if b >= 1e9 else f"{b/1e6:.2f} MB" if b >= 1e6 else f"{b/1e3:.2f} KB"
c = alone["comm_bytes_per_step"]
assert mode["cross_node_bytes"] == c["cross_node"]["total"], (mode, c)
assert mode["comm_bytes"] == c["total"], (mode, c)
assert mode["need_bytes"] == alone["peak_bytes"], (mode, alone["peak_bytes"])
t = alone["transient_bytes"]
assert mode["extra_bytes"] == alone["peak_bytes"] - bare["peak_bytes"], (mode, t, bare["transient_bytes"])
if "--shard-within-node" in mode["flags"]:
    # States at 1/T instead of 1/N, and comm buffers for the larger shards.
    assert alone["model_state_bytes"]["total"] > bare["model_state_bytes"]["total"], (alone, bare)
    assert t["hpz_params"] == 0 and mode["extra_bytes"] > 0, (mode, t)
else:
    assert mode["extra_bytes"] == t["hpz_params"] + t["comm_buffers"] - bare["transient_bytes"]["comm_buffers"], (mode, t)
assert ("--hpz" in mode["flags"]) == (t["hpz_params"] > 0), (mode, t)
assert mode["seconds"] is None and mode["fits"] is None, mode
rows = [l for l in text if l.strip().startswith(mode["mode"] + "  ")]
assert len(rows) == 1, rows
assert rows[0][len("    ") + 34:].split()[0:2] == gb(mode["cross_node_bytes"]).split(), (rows[0], mode)
PY
  then echo "ok: estimate's modes, ${flags[*]:-flat}: table and --json are the mode's own estimate"
  else echo "FAIL: estimate's modes, ${flags[*]:-flat}"; fail=1
  fi
done

# The advice under the table. `check NAME WANT_FLAGS ESTIMATE_ARGS...`: the advice line of the
# text output names WANT_FLAGS, and --json's node_mode_choice is the same mode.
all_three="--collectives two-level --hpz --qwz --qgz int4"
check() {
  local name=$1 want=$2
  shift 2
  "$zerodp" estimate "${modes_shape[@]}" "$@" >"$tmp/a.txt"
  "$zerodp" estimate "${modes_shape[@]}" "$@" --json >"$tmp/a.json"
  local line
  line=$(grep -- '  -> ' "$tmp/a.txt" | tail -1)
  local said=${want:---collectives flat, the default}
  if [[ $line == *": $said ("* ]] &&
    /usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))[0]["node_mode_choice"]; assert c["flags"] == sys.argv[2], c' \
      "$tmp/a.json" "$want"; then
    echo "ok: estimate's advice, $name: ${want:-flat}"
  else
    echo "FAIL: estimate's advice, $name: want '${want}', got: $line"
    fail=1
  fi
}
links=(--link-bandwidth 10GB/s --inter-node-bandwidth 1MB/s)
# (a) A slow link between nodes and room to spare: all three, said to be lossy.
check "slow inter-node link, roomy budget" "$all_three" "${links[@]}" --memory-per-rank 10GB
if ! grep -- '  -> ' "$tmp/a.txt" | grep -q 'quantize: check the loss'; then
  echo "FAIL: estimate's advice picks quantized modes without saying they are lossy"; fail=1
fi
/usr/bin/python3 - "$tmp/a.json" <<'PY' || { echo "FAIL: (a)'s JSON choice"; fail=1; }
import json, sys
row = json.load(open(sys.argv[1]))[0]
c, modes = row["node_mode_choice"], row["node_modes"]
assert c["by"] == "seconds" and c["fits"] is True and c["quantized"] is True and c["over_bytes"] == 0, c
assert all(m["fits"] is True and isinstance(m["seconds"], float) for m in modes), modes
assert min(modes, key=lambda m: m["seconds"])["flags"] == c["flags"], (c, modes)
PY
# (b) A budget from the table's own figures that fits the states but none of hpZ's modes: the
# fastest mode of those without --hpz, and the figures say hpZ would have been faster.
read -r budget want < <(/usr/bin/python3 - "$tmp/a.json" <<'PY'
import json, sys
modes = json.load(open(sys.argv[1]))[0]["node_modes"]
budget = min(m["need_bytes"] for m in modes if "--hpz" in m["flags"]) - 1
fit = [m for m in modes if m["need_bytes"] <= budget]
assert fit and all("--hpz" not in m["flags"] for m in fit), modes
assert min(m["seconds"] for m in modes) < min(m["seconds"] for m in fit), modes
best = min(fit, key=lambda m: (m["seconds"], m["flags"].count("--")))
print(budget, best["flags"])
PY
)
check "budget short of hpZ's copy (${budget} bytes)" "$want" "${links[@]}" --memory-per-rank "$budget"
if [[ $want == *--hpz* ]] || ! grep -- '  -> ' "$tmp/a.txt" | grep -q 'hpZ.* would take'; then
  echo "FAIL: estimate's advice under ${budget} bytes: want no --hpz and the faster hpZ mode named"
  fail=1
fi
# (b') A budget one byte short of the least need: no mode fits, the closest is named, 1 byte over.
least=$(/usr/bin/python3 -c 'import json, sys; print(min(m["need_bytes"] for m in json.load(open(sys.argv[1]))[0]["node_modes"]))' "$tmp/a.json")
"$zerodp" estimate "${modes_shape[@]}" "${links[@]}" --memory-per-rank $((least - 1)) >"$tmp/a.txt"
"$zerodp" estimate "${modes_shape[@]}" "${links[@]}" --memory-per-rank $((least - 1)) --json >"$tmp/a.json"
if grep -q -- '  -> no mode fits' "$tmp/a.txt" &&
  /usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))[0]["node_mode_choice"]; assert c["fits"] is False and c["over_bytes"] == 1, c' "$tmp/a.json"; then
  echo "ok: estimate's advice, budget 1 byte short of every mode: none fits, 1 byte over"
else
  echo "FAIL: estimate's advice, budget 1 byte short: $(grep -- '  -> ' "$tmp/a.txt" | tail -1)"
  fail=1
fi
# (c) No links: the fewest cross-node bytes, ties to the fewer flags, from --json's own table.
"$zerodp" estimate "${modes_shape[@]}" --json >"$tmp/c.json"
want=$(/usr/bin/python3 - "$tmp/c.json" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))[0]
modes, c = row["node_modes"], row["node_mode_choice"]
assert c["by"] == "cross_node_bytes" and c["fits"] is None, c
assert all(m["seconds"] is None for m in modes), modes
print(min(modes, key=lambda m: (m["cross_node_bytes"], m["flags"].count("--")))["flags"])
PY
) || { echo "FAIL: (c)'s JSON"; fail=1; }
check "no links" "$want"
if ! grep -q -- '  -> fewest cross-node bytes' "$tmp/a.txt"; then
  echo "FAIL: estimate's advice without links does not say it weighs cross-node bytes"; fail=1
fi
# --invariant on refuses two-level collectives and qgZ: the advice keeps flat, and says why.
check "--invariant on" "" "${links[@]}" --invariant on
if ! grep -- '  -> ' "$tmp/a.txt" | grep -q -- '--invariant on keeps flat collectives' ||
  ! /usr/bin/python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))[0]["node_modes"]; assert [x["allowed"] for x in m] == [x["flags"] == "" for x in m], m' "$tmp/a.json"; then
  echo "FAIL: estimate's advice under --invariant on does not say flat only"; fail=1
fi
# (d) --json stays an array of rows; only the stage-3 row over nodes gains node_modes and the
# choice, one of them, with every field.
"$zerodp" estimate "${shape[@]}" --ranks 2,6 --stage all --node-ranks 2 "${links[@]}" --json >"$tmp/d.json"
if /usr/bin/python3 - "$tmp/d.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list) and len(rows) == 8, len(rows)
for r in rows:
    over_nodes = r["ranks"] == 6 and r["stage"] == 3
    assert ("node_modes" in r) == over_nodes and ("node_mode_choice" in r) == over_nodes, r.keys()
    assert "comm_bytes_per_step" in r and "peak_bytes" in r, r.keys()
r = [r for r in rows if "node_modes" in r][0]
fields = {"mode", "flags", "cross_node_bytes", "comm_bytes", "extra_bytes", "seconds", "fits"}
assert all(fields <= set(m) for m in r["node_modes"]), r["node_modes"]
names = [m["mode"] for m in r["node_modes"]]
assert len(set(names)) == len(names) and len({m["flags"] for m in r["node_modes"]}) == len(names), names
c = r["node_mode_choice"]
assert [m for m in r["node_modes"] if m["mode"] == c["mode"] and m["flags"] == c["flags"]], c
PY
then echo "ok: estimate --json: rows as before, node_modes and the choice on the stage-3 row over nodes"
else echo "FAIL: estimate --json's node modes"; fail=1
fi
exit $fail
