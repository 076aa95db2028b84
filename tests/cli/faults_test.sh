#!/usr/bin/env bash
# Injected faults end the whole job, fast, naming the rank and the step, on the local
# backend and under mpirun, with no process left behind. Prints each detection time
# (docs/reliability.md quotes them). The bounds are loose on purpose (10 s local, 30 s MPI):
# they catch a hang, not a slow machine.
set -uo pipefail
zerodp=$1
mpirun=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(train --size tiny --data synthetic --micro-batch 4 --steps 6 --no-progress --stage 2
        --collective-timeout 2)
fail=0

# fault LABEL LIMIT_S NEEDLE LAUNCHER... -- ZERODP_ARGS...
fault() {
  local label=$1 limit=$2 needle=$3
  shift 3
  local launcher=()
  while [[ $1 != -- ]]; do launcher+=("$1"); shift; done
  shift
  local start end rc took
  start=$(date +%s.%N)
  timeout 120 "${launcher[@]}" "$zerodp" "${common[@]}" "$@" >"$tmp/out" 2>&1
  rc=$?
  end=$(date +%s.%N)
  took=$(printf '%.1f' "$(echo "$end - $start" | bc)")
  if [[ $rc == 0 || $rc == 124 ]]; then
    echo "FAIL: $label: exit $rc (0: the fault was ignored, 124: hung)"; fail=1; return
  fi
  if ! grep -q -- "$needle" "$tmp/out"; then
    echo "FAIL: $label: no '$needle' in:"; cat "$tmp/out"; fail=1; return
  fi
  if (( $(echo "$took > $limit" | bc) )); then
    echo "FAIL: $label: took ${took}s, over ${limit}s"; fail=1; return
  fi
  # Processes of a job mpirun ended may take a moment to be reaped on a loaded machine.
  local waited=0
  while pgrep -f -- "--collective-timeout 2 .*--inject" >/dev/null && ((waited < 20)); do
    sleep 0.5; waited=$((waited + 1))
  done
  if pgrep -f -- "--collective-timeout 2 .*--inject" >/dev/null; then
    echo "FAIL: $label: processes left 10 s after the job ended: $(pgrep -af -- '--inject')"
    fail=1
  fi
  echo "ok: $label: exit $rc after ${took}s: $(grep -m1 -- "$needle" "$tmp/out" | cut -c1-140)"
}

fault "local throw" 10 "rank 1 of 3, step 3: injected" -- --ranks 3 --inject throw@3:1
fault "local hang" 10 "waiting for rank(s) 2" -- --ranks 3 --inject hang@3:2
fault "local nan, --max-skips 1" 10 "unit head on rank 1" -- --ranks 2 --max-skips 1 \
  --inject nan@2:1
if [[ -n $mpirun ]]; then
  fault "mpi throw" 30 "step 3: injected" "$mpirun" -np 3 -- --backend mpi --inject throw@3:1
  fault "mpi hang" 30 "waiting for rank 2" "$mpirun" -np 3 -- --backend mpi --inject hang@3:2
  # Ranks as threads: a rank thread's failure ends its process's other ranks and the job.
  fault "mpi threads throw" 30 "rank 3 of 4" "$mpirun" -np 2 -- --backend mpi \
    --ranks-per-process 2 --inject throw@3:3
  fault "mpi threads hang" 30 "waiting for rank" "$mpirun" -np 2 -- --backend mpi \
    --ranks-per-process 2 --inject hang@3:1
  # Two programs, one job: the ranks disagree on --lr.
  cfg=("${common[@]}" --backend mpi)
  start=$(date +%s)
  timeout 60 "$mpirun" -np 1 "$zerodp" "${cfg[@]}" --lr 1e-3 : -np 1 "$zerodp" "${cfg[@]}" \
    --lr 2e-3 >"$tmp/out" 2>&1
  rc=$?
  if [[ $rc != 2 ]] || ! grep -q "rank(s) 1 run another configuration than rank 0: --lr differs" "$tmp/out"; then
    echo "FAIL: mpi config mismatch: exit $rc:"; cat "$tmp/out"; fail=1
  else
    echo "ok: mpi config mismatch: exit 2 after $(($(date +%s) - start))s"
  fi
  fault "mpi kill" 30 "rank 1 with PID" "$mpirun" -np 3 -- --backend mpi --inject kill@3:1
fi
exit $fail
