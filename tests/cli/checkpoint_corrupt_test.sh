#!/usr/bin/env bash
# A damaged checkpoint is refused on every rank with exit code 3 and a message naming the
# file, on the local backend and under mpirun, and within seconds (no rank waits on another).
set -uo pipefail
zerodp=$1
mpirun=${2:-}
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
exit $fail
