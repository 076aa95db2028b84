#!/usr/bin/env bash
# A SIGKILL at each boundary of the checkpoint commit protocol (checkpoint/store.h) leaves
# `latest` naming a fully committed checkpoint that loads and trains on. Local backend: the
# process dies; MPI: one rank dies and the job ends without hanging.
set -uo pipefail
zerodp=$1
mpirun=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(train --size tiny --data synthetic --micro-batch 4 --no-progress --collective-timeout 30
        --stage 2)
fail=0
say_fail() { echo "FAIL: $*"; fail=1; }

# After the crash: `latest` must be $2, a committed checkpoint that a continuation loads.
check_recovers() {
  local d=$1 want=$2 label=$3 launcher=("${@:4}")
  local got
  got=$(cat "$d/latest" 2>/dev/null || echo "(none)")
  [[ $got == "$want" ]] || { say_fail "$label: latest is $got, expected $want"; return; }
  [[ -f $d/$got/meta.json ]] || { say_fail "$label: $got has no meta.json"; return; }
  if ! timeout 120 "${launcher[@]}" "$zerodp" "${common[@]}" "${backend[@]}" --steps 5 \
      --checkpoint-dir "$d" --resume latest >"$tmp/out" 2>&1; then
    say_fail "$label: the continuation from $got failed:"; cat "$tmp/out"; return
  fi
  [[ $(cat "$d/latest") == step_00000005 ]] || say_fail "$label: continuation did not commit step 5"
  if compgen -G "$d/.tmp*" >/dev/null; then say_fail "$label: leftovers remain: $(ls -a "$d")"; fi
  echo "ok: $label: latest was $got and training continued to step 5"
}

backend=(--ranks 2)
for boundary in shard-written meta-written renamed latest-written; do
  d=$tmp/local-$boundary
  "$zerodp" "${common[@]}" "${backend[@]}" --steps 2 --checkpoint-dir "$d" >/dev/null
  ZERODP_FAILPOINT=$boundary timeout 120 "$zerodp" "${common[@]}" "${backend[@]}" --steps 4 \
    --checkpoint-dir "$d" --resume latest >/dev/null 2>&1
  rc=$?
  [[ $rc == 137 ]] || { say_fail "local $boundary: exit $rc, expected 137 (SIGKILL)"; continue; }
  want=step_00000002
  [[ $boundary == latest-written ]] && want=step_00000004
  check_recovers "$d" "$want" "local, killed at $boundary"
done

# Offloaded: the scratch files die with the process (unlinked at creation), and the last
# committed checkpoint continues, here in memory.
d=$tmp/offload
scratch=$tmp/offload-scratch
mkdir -p "$scratch"
offload=(--offload optimizer --offload-dir "$scratch" --offload-piece 1024)
"$zerodp" "${common[@]}" "${backend[@]}" "${offload[@]}" --steps 2 --checkpoint-dir "$d" >/dev/null
ZERODP_FAILPOINT=shard-written timeout 120 "$zerodp" "${common[@]}" "${backend[@]}" \
  "${offload[@]}" --steps 4 --checkpoint-dir "$d" --resume latest >/dev/null 2>&1
rc=$?
if [[ $rc != 137 ]]; then
  say_fail "offloaded, killed at shard-written: exit $rc, expected 137 (SIGKILL)"
elif [[ -n $(ls -A "$scratch") ]]; then
  say_fail "offloaded, killed: scratch files left behind: $(ls -A "$scratch")"
else
  check_recovers "$d" step_00000002 "offloaded, killed at shard-written"
fi

# Asynchronous saves: a kill in the writer thread after it wrote step 3's shard (not yet
# committed) leaves `latest` at step 2.
d=$tmp/async
"$zerodp" "${common[@]}" "${backend[@]}" --steps 2 --checkpoint-dir "$d" >/dev/null
ZERODP_FAILPOINT=shard-written timeout 120 "$zerodp" "${common[@]}" "${backend[@]}" --steps 4 \
  --checkpoint-dir "$d" --checkpoint-every 1 --checkpoint-async --resume latest >/dev/null 2>&1
rc=$?
if [[ $rc != 137 ]]; then
  say_fail "async, killed at shard-written: exit $rc, expected 137 (SIGKILL)"
else
  check_recovers "$d" step_00000002 "async, killed in the writer at shard-written"
fi

# Asynchronous saves are committed by rank 0's writer thread: a kill there at each of the
# commit's boundaries, step 3's commit being the run's first, leaves `latest` at step 2, or
# at step 3 once it was written.
for boundary in meta-written renamed latest-written; do
  d=$tmp/async-$boundary
  "$zerodp" "${common[@]}" "${backend[@]}" --steps 2 --checkpoint-dir "$d" >/dev/null
  ZERODP_FAILPOINT=$boundary timeout 120 "$zerodp" "${common[@]}" "${backend[@]}" --steps 4 \
    --checkpoint-dir "$d" --checkpoint-every 1 --checkpoint-async --resume latest >/dev/null 2>&1
  rc=$?
  [[ $rc == 137 ]] || { say_fail "async $boundary: exit $rc, expected 137 (SIGKILL)"; continue; }
  want=step_00000002
  [[ $boundary == latest-written ]] && want=step_00000003
  check_recovers "$d" "$want" "async, killed in the writer's commit at $boundary"
done

# Asynchronous and offloaded (the writer reads the states from the scratch file): the same.
d=$tmp/async-offload
"$zerodp" "${common[@]}" "${backend[@]}" "${offload[@]}" --steps 2 --checkpoint-dir "$d" >/dev/null
ZERODP_FAILPOINT=shard-written timeout 120 "$zerodp" "${common[@]}" "${backend[@]}" \
  "${offload[@]}" --steps 4 --checkpoint-dir "$d" --checkpoint-every 1 --checkpoint-async \
  --resume latest >/dev/null 2>&1
rc=$?
if [[ $rc != 137 ]]; then
  say_fail "async offloaded, killed at shard-written: exit $rc, expected 137 (SIGKILL)"
else
  check_recovers "$d" step_00000002 "async offloaded, killed in the writer at shard-written"
fi

# kill -9 at moments of an asynchronous run saving every step: `latest` always loads, and
# the continuation ends with the uninterrupted run's weights.
weights() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["final"]["weights_sha256"])' "$1"; }
"$zerodp" "${common[@]}" "${backend[@]}" --steps 40 --report "$tmp/whole.json" >/dev/null
for pause in 0.3 0.6 0.9; do
  d=$tmp/async-kill-$pause
  "$zerodp" "${common[@]}" "${backend[@]}" --steps 40 --checkpoint-dir "$d" --checkpoint-every 1 \
    --checkpoint-async >/dev/null 2>&1 &
  pid=$!
  sleep "$pause"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [[ ! -f $d/latest ]]; then echo "async kill after ${pause}s: no checkpoint yet"; continue; fi
  got=$(cat "$d/latest")
  if ! timeout 120 "$zerodp" "${common[@]}" "${backend[@]}" --steps 40 --checkpoint-dir "$d" \
      --resume latest --report "$tmp/cont.json" >"$tmp/out" 2>&1; then
    say_fail "async kill after ${pause}s: the continuation from $got failed:"; cat "$tmp/out"; continue
  fi
  if [[ $(weights "$tmp/cont.json") != "$(weights "$tmp/whole.json")" ]]; then
    say_fail "async kill after ${pause}s: the continuation from $got differs from the whole run"
  else
    echo "ok: async kill after ${pause}s: latest $got loaded and continued to the whole run's weights"
  fi
done

if [[ -n $mpirun ]]; then
  backend=(--backend mpi)
  for spec in shard-written:1 shard-written:0 meta-written:0; do
    d=$tmp/mpi-${spec/:/-}
    "$mpirun" -np 2 "$zerodp" "${common[@]}" "${backend[@]}" --steps 2 --checkpoint-dir "$d" \
      >/dev/null
    start=$(date +%s)
    ZERODP_FAILPOINT=$spec timeout 120 "$mpirun" -np 2 "$zerodp" "${common[@]}" "${backend[@]}" \
      --steps 4 --checkpoint-dir "$d" --resume latest >"$tmp/out" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    if [[ $rc == 0 || $rc == 124 ]]; then
      say_fail "mpi $spec: exit $rc (0 = the kill did not happen, 124 = hung)"; continue
    fi
    if pgrep -f "$d" >/dev/null; then say_fail "mpi $spec: orphan processes: $(pgrep -af "$d")"; fi
    echo "mpi $spec: the job ended with exit $rc after ${took}s"
    check_recovers "$d" step_00000002 "mpi, rank ${spec#*:} killed at ${spec%:*}" "$mpirun" -np 2
  done
fi
exit $fail
