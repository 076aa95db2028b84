#!/usr/bin/env bash
# A damaged checkpoint is refused on every rank with exit code 3 and a message naming the
# file, on the local backend and under mpirun, and within seconds (no rank waits on another).
# Damage its checksums cannot see is refused too: a state no run saves (a NaN or infinite
# weight or moment, a negative second moment or 8-bit scale), at whatever rank count, stage or
# moment precision the resume has, offloaded or not; a meta.json entry with two digests; and a
# data cursor no run leaves.
set -uo pipefail
zerodp=$1
mpirun=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
edit=(python3 "$here/edit_checkpoint.py")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(train --size tiny --data synthetic --micro-batch 4 --no-progress --collective-timeout 30
        --stage 3)
fail=0
"$zerodp" "${common[@]}" --ranks 2 --steps 2 --checkpoint-dir "$tmp/ck" >/dev/null
shard=$tmp/ck/step_00000002/rank_00001.safetensors
# Flip one bit near the end of rank 1's shard: its data, not its header.
size=$(stat -c %s "$shard")
byte=$(od -An -tu1 -j $((size - 7)) -N1 "$shard" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 4)))" | dd of="$shard" bs=1 seek=$((size - 7)) conv=notrunc \
  status=none

run_case() {
  local label=$1; shift
  local start rc took
  start=$(date +%s)
  timeout 60 "$@" "$zerodp" "${common[@]}" "${ranks[@]}" --steps 4 --resume "$tmp/ck" \
    --checkpoint-dir "$tmp/out-$label" >"$tmp/out" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  if [[ $rc != 3 ]]; then
    echo "FAIL: $label: exit $rc, expected 3"; cat "$tmp/out"; fail=1; return
  fi
  if ! grep -q "rank_00001.safetensors: crc32c" "$tmp/out"; then
    echo "FAIL: $label: the message does not name the file and the checksum:"; cat "$tmp/out"
    fail=1; return
  fi
  if [[ -e $tmp/out-$label/latest ]]; then echo "FAIL: $label: something was committed"; fail=1; fi
  echo "ok: $label: exit 3 after ${took}s: $(grep -m1 crc32c "$tmp/out" | cut -c1-120)"
}

ranks=(--ranks 3)
run_case local
if [[ -n $mpirun ]]; then
  ranks=(--backend mpi)
  run_case mpi "$mpirun" -np 2
fi

# Checkpoints at steps 1 and 2 (bf16 params, fp32 master; fp32 moments, and 8-bit ones), each
# changed below with its checksum recomputed: only the values, or meta.json's fields, tell.
"$zerodp" "${common[@]}" --precision bf16 --ranks 2 --steps 2 --checkpoint-every 1 \
  --checkpoint-dir "$tmp/fp32" >/dev/null || { echo "FAIL: the fp32-moment run"; exit 1; }
"$zerodp" "${common[@]}" --precision bf16 --optimizer-states int8 --ranks 2 --steps 2 \
  --checkpoint-every 1 --checkpoint-dir "$tmp/int8" >/dev/null \
  || { echo "FAIL: the int8-moment run"; exit 1; }

# refused LABEL SOURCE EXPECTED RESUME_FLAGS... -- EDIT...: a copy of SOURCE's step 2, changed
# by edit_checkpoint.py EDIT, is refused with exit 3, a message holding EXPECTED and naming
# step 1 as what to continue from, and nothing committed.
refused() {
  local label=$1 source=$2 expected=$3; shift 3
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  local ck=$tmp/case-$label
  rm -rf "$ck"
  cp -r "$tmp/$source" "$ck"
  "${edit[@]}" "$1" "$ck/step_00000002" "${@:2}" || { echo "FAIL: $label: edit"; fail=1; return; }
  timeout 60 "${launch[@]}" "$zerodp" "${common[@]}" --steps 4 "${flags[@]}" --resume "$ck" \
    --checkpoint-dir "$tmp/out-$label" >"$tmp/out" 2>&1
  local rc=$?
  if [[ $rc != 3 ]]; then
    echo "FAIL: $label: exit $rc, expected 3"; cat "$tmp/out"; fail=1; return
  fi
  if ! grep -qF -- "$expected" "$tmp/out"; then
    echo "FAIL: $label: the message does not say '$expected':"; cat "$tmp/out"; fail=1; return
  fi
  if [[ $expected == *holds* ]] && ! grep -qF -- "--resume $ck/step_00000001" "$tmp/out"; then
    echo "FAIL: $label: the message does not name the earlier checkpoint:"; cat "$tmp/out"
    fail=1; return
  fi
  if [[ -e $tmp/out-$label/latest ]]; then echo "FAIL: $label: something was committed"; fail=1; fi
  echo "ok: $label: exit 3: $(grep -m1 -F -- "$expected" "$tmp/out" | cut -c1-150)"
}

f1=rank_00001.safetensors f0=rank_00000.safetensors
launch=()
refused nan-master fp32 "$f1: tensor h.0.master holds nan at element 17" --ranks 2 \
  -- set 1 h.0.master 17 nan
refused inf-master fp32 "$f0: tensor embedding.master holds inf at element 5" --ranks 4 \
  --micro-batch 2 --stage 1 -- set 0 embedding.master 5 inf
refused nan-params fp32 "$f1: tensor h.1.params holds nan at element 3" --ranks 1 --stage 0 \
  -- set 1 h.1.params 3 nan
refused nan-adam-m fp32 "$f0: tensor h.0.adam_m holds nan at element 100" --ranks 2 \
  --offload optimizer --offload-dir "$tmp" -- set 0 h.0.adam_m 100 nan
refused inf-adam-m fp32 "$f1: tensor h.1.adam_m holds -inf at element 9" --ranks 2 \
  --optimizer-states int8 -- set 1 h.1.adam_m 9 -inf
refused neg-adam-v fp32 "$f1: tensor h.0.adam_v holds -1 at element 7" --ranks 2 \
  -- set 1 h.0.adam_v 7 -1
refused nan-adam-v fp32 "$f0: tensor h.1.adam_v holds nan at element 0" --ranks 1 --stage 2 \
  -- set 0 h.1.adam_v 0 nan
refused nan-scale int8 "$f0: tensor h.0.adam_m8_scale holds nan at element 0" --ranks 2 \
  --optimizer-states int8 -- set 0 h.0.adam_m8_scale 0 nan
refused neg-scale int8 "$f1: tensor h.0.adam_v8_scale holds -0.5 at element 1" --ranks 1 \
  --optimizer-states int8 --offload optimizer --offload-dir "$tmp" \
  -- set 1 h.0.adam_v8_scale 1 -0.5
refused neg-fp32-part int8 "$f0: tensor h.0.adam_v holds -2 at element 2" --ranks 2 \
  -- set 0 h.0.adam_v 2 -2
# Only rank 1 reads the damaged range: rank 0 stops too, at once, with the same message.
if [[ -n $mpirun ]]; then
  launch=("$mpirun" -np 2)
  refused mpi-nan-master fp32 "$f1: tensor h.1.master holds nan at element 4" --backend mpi \
    -- set 1 h.1.master 4 nan
  launch=()
fi
# meta.json: one digest per file, and a data cursor a sampler leaves.
refused two-digests fp32 'field "files[0]" has both "crc32c" and "sha256"' --ranks 2 \
  -- meta files.0.sha256 "\"$(printf '0%.0s' {1..64})\""
refused zero-batch fp32 'field "data.samples_per_step" is 0; a step takes 1 sample or more' \
  --ranks 2 -- meta data.samples_per_step 0
refused negative-batch fp32 'field "data.samples_per_step" is -8, expected a non-negative' \
  --ranks 2 -- meta data.samples_per_step -8
refused huge-batch fp32 'field "data.samples_per_step" is 1000000000000, more than the' \
  --ranks 2 -- meta data.samples_per_step 1000000000000
exit $fail
