#!/usr/bin/env bash
# zerodp over a real network stack: hosts as network namespaces (scripts/vcluster), one MPI
# process per host over TCP, against the local backend at the same ranks and --node-ranks.
# Usage: cluster_test.sh ZERODP. Skips (77) where the machine cannot host the cluster.
set -uo pipefail
zerodp=$(realpath "$1")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
vcluster=$here/../../scripts/vcluster
# A prefix of this run's own: a user's cluster, or a parallel test's, is never touched.
export ZERODP_VCLUSTER_PREFIX=zdpt$$
"$vcluster" check >/dev/null 2>&1
case $? in
  0) ;;
  77) echo "skipped: $("$vcluster" check 2>&1)"; exit 77 ;;
  *) echo "FAIL: vcluster check: $("$vcluster" check 2>&1)"; exit 1 ;;
esac
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
tmp=$(mktemp -d)
nl=/var/tmp/${ZERODP_VCLUSTER_PREFIX}-node  # each host's own disk, in the node-local section
trap '"$vcluster" down; rm -rf "$tmp"; rmdir "$nl" 2>/dev/null' EXIT
fail=0
common=(--size tiny --data synthetic --steps 3 --no-progress --micro-batch 2)

weights() { grep -o 'weights sha256 [0-9a-f]*' "$1" | awk '{print $3}'; }

# compare LABEL NP RPP NODE_RANKS FLAGS...: the cluster's run against the local backend's.
compare() {
  local label=$1 np=$2 rpp=$3 t=$4
  shift 4
  local ranks=$((np * rpp))
  "$zerodp" train "${common[@]}" --ranks "$ranks" --node-ranks "$t" "$@" >"$tmp/local" 2>&1
  "$vcluster" mpirun -np "$np" timeout 120 "$zerodp" train --backend mpi "${common[@]}" \
    --ranks-per-process "$rpp" --node-ranks "$t" "$@" >"$tmp/mpi" 2>&1
  local want got
  want=$(weights "$tmp/local")
  got=$(weights "$tmp/mpi")
  if [[ -z $want || $want != "$got" ]]; then
    echo "FAIL: $label: cluster $got, local $want"
    tail -5 "$tmp/mpi"
    fail=1
  else
    echo "ok: $label: the local backend's weights ($got)"
  fi
}

# Two hosts, two rank threads each (a process per node): every stage and mode over nodes.
"$vcluster" up --hosts 2 || exit 1
for stage in 0 1 2 3; do
  compare "2 hosts x 2, stage $stage, flat" 2 2 2 --stage "$stage"
done
compare "2 hosts x 2, two-level" 2 2 2 --stage 2 --collectives two-level
compare "2 hosts x 2, hpZ + qwZ + qgZ int4" 2 2 2 --stage 3 --collectives two-level --hpz \
  --qwz --qgz int4
compare "2 hosts x 2, HSDP" 2 2 2 --stage 3 --shard-within-node
compare "2 hosts x 2, invariant, 2 micro-batches" 2 2 2 --stage 1 --invariant on --grad-accum 2

# Hostnames are the hosts': a rank's error names the host it ran on, not the launcher's.
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi "${common[@]}" \
  --ranks-per-process 2 --node-ranks 2 --inject throw@2:3 >"$tmp/throw" 2>&1
if grep -q "${ZERODP_VCLUSTER_PREFIX}-h2" "$tmp/throw" && ! grep -q "$(hostname)" "$tmp/throw"; then
  echo "ok: a failure on host 2 is named with host 2's name"
else
  echo "FAIL: the failure on host 2 does not name it: $(tail -3 "$tmp/throw")"
  fail=1
fi

# A process killed on host 2 is named by zerodp, with its ranks and host, within seconds
# (mpirun alone names "rank 1 ... on node 10.231.77.2").
start=$(date +%s%N)
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi "${common[@]}" --steps 6 \
  --ranks-per-process 2 --node-ranks 2 --inject kill@3:2 >"$tmp/kill" 2>&1
code=$?
took_ms=$((($(date +%s%N) - start) / 1000000))
if [[ $code -ne 0 ]] && grep -q "zerodp: lost process 1 (ranks 2..3) on host ${ZERODP_VCLUSTER_PREFIX}-h2" "$tmp/kill" &&
   ((took_ms < 20000)); then
  echo "ok: a killed process on host 2 is named with its ranks and host; the job ended in ${took_ms} ms"
else
  echo "FAIL: a killed process on host 2 (exit $code, ${took_ms} ms): $(grep -v '^\[' "$tmp/kill" | head -5)"
  fail=1
fi

# A checkpoint written across two hosts resumes on another host count (shared /tmp here:
# the namespaces share the filesystem), to the bits of a run that never stopped.
ck=$tmp/ck
"$zerodp" train "${common[@]}" --steps 4 --ranks 4 --stage 3 >"$tmp/whole" 2>&1
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi "${common[@]}" --steps 4 \
  --ranks-per-process 2 --stage 3 --checkpoint-dir "$ck" --stop-after 2 >/dev/null 2>&1
"$vcluster" down
"$vcluster" up --hosts 3 || exit 1
for stage in 0 3; do
  compare "3 hosts x 1, stage $stage" 3 1 1 --stage "$stage"
done
# Without model flags or --micro-batch the resume takes the checkpoint's (tiny, 2). 4 ranks
# x 2 samples = 8 per step: 3 hosts cannot split it, 2 of them can (A = 2).
"$vcluster" mpirun -np 3 timeout 60 "$zerodp" train --backend mpi --data synthetic --steps 4 \
  --no-progress --checkpoint-dir "$ck" --resume latest >"$tmp/three" 2>&1
if grep -q "which 3 ranks of --micro-batch 2 cannot split evenly; use --ranks 1, 2, 4," \
  "$tmp/three"; then
  echo "ok: 3 hosts are refused naming the rank counts that split the checkpoint's batch"
else
  echo "FAIL: 3 hosts on a batch of 8: $(tail -2 "$tmp/three")"; fail=1
fi
ZERODP_VCLUSTER_SLOTS=1 "$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi \
  --data synthetic --steps 4 --no-progress --stage 3 --checkpoint-dir "$ck" --resume latest \
  >"$tmp/resumed" 2>&1
if [[ -n $(weights "$tmp/whole") && $(weights "$tmp/resumed") == $(weights "$tmp/whole") ]]; then
  echo "ok: written on 2 hosts x 2 ranks, resumed on 2 hosts x 1: the uninterrupted weights"
else
  echo "FAIL: resume on another host count: $(weights "$tmp/resumed") vs $(weights "$tmp/whole")"
  tail -3 "$tmp/resumed"
  fail=1
fi

# Node-local checkpoints: $nl is each host's own directory (a mount namespace per host). Each
# host keeps its ranks' shards, and both commit the step.
"$vcluster" down
"$vcluster" up --hosts 2 --node-local "$nl" || exit 1
local_ck=(--checkpoint-dir "$nl/ck" --checkpoint-storage node-local)
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi "${common[@]}" --steps 4 \
  --ranks-per-process 2 --stage 3 "${local_ck[@]}" --stop-after 2 >"$tmp/nl1" 2>&1
h1=$("$vcluster" exec 1 ls "$nl/ck/step_00000002" 2>&1 | tr '\n' ' ')
h2=$("$vcluster" exec 2 ls "$nl/ck/step_00000002" 2>&1 | tr '\n' ' ')
if [[ $h1 == *rank_00001* && $h1 != *rank_00002* && $h2 == *rank_00002* && $h2 == *meta.json* &&
      $h2 != *rank_00000* ]]; then
  echo "ok: node-local: host 1 holds ranks 0-1's shards, host 2 ranks 2-3's, each a meta.json"
else
  echo "FAIL: node-local shards: host 1 '$h1', host 2 '$h2'"; tail -3 "$tmp/nl1"; fail=1
fi
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi --data synthetic --steps 4 \
  --no-progress --ranks-per-process 2 --stage 3 "${local_ck[@]}" --resume latest \
  >"$tmp/nl2" 2>&1
if [[ -n $(weights "$tmp/whole") && $(weights "$tmp/nl2") == $(weights "$tmp/whole") ]]; then
  echo "ok: node-local: resumed on the same hosts, the uninterrupted weights"
else
  echo "FAIL: node-local resume: $(weights "$tmp/nl2") vs $(weights "$tmp/whole")"
  tail -3 "$tmp/nl2"; fail=1
fi
# A crash between the hosts' commits: host 2 never committed step 4. --resume latest takes
# the newest step both hold, 2.
"$vcluster" exec 2 sh -c "rm -rf '$nl/ck/step_00000004' && echo step_00000002 >'$nl/ck/latest'"
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi --data synthetic --steps 4 \
  --no-progress --ranks-per-process 2 --stage 3 "${local_ck[@]}" --resume latest \
  >"$tmp/nl3" 2>&1
if grep -q "continued from .*step_00000002" "$tmp/nl3" &&
  [[ $(weights "$tmp/nl3") == $(weights "$tmp/whole") ]]; then
  echo "ok: node-local: hosts that disagree on latest resume from the newest step both hold"
else
  echo "FAIL: node-local disagreement: $(grep continued "$tmp/nl3"; tail -2 "$tmp/nl3")"; fail=1
fi
# --keep 1 across hosts: each host prunes its own disk once both committed, so each keeps the
# newest step only, and the run resumes from it.
"$vcluster" mpirun -np 2 timeout 60 "$zerodp" train --backend mpi "${common[@]}" --steps 3 \
  --ranks-per-process 2 --stage 3 --checkpoint-dir "$nl/keep" --checkpoint-storage node-local \
  --checkpoint-every 1 --keep 1 >"$tmp/nl5" 2>&1
k1=$("$vcluster" exec 1 ls "$nl/keep" 2>&1 | grep step_ | tr '\n' ' ')
k2=$("$vcluster" exec 2 ls "$nl/keep" 2>&1 | grep step_ | tr '\n' ' ')
if [[ $k1 == "step_00000003 " && $k2 == "step_00000003 " ]]; then
  echo "ok: node-local --keep 1: each host keeps step 3 only"
else
  echo "FAIL: node-local --keep 1: host 1 '$k1', host 2 '$k2'"; tail -3 "$tmp/nl5"; fail=1
fi
# On one host, ranks 2-3's shards are on host 2's disk: refused, naming it.
"$vcluster" mpirun -np 1 timeout 60 "$zerodp" train --backend mpi --data synthetic --steps 6 \
  --no-progress --ranks-per-process 4 --stage 3 "${local_ck[@]}" --resume latest \
  >"$tmp/nl4" 2>&1
if grep -q "rank_00002.safetensors is not on this host: host ${ZERODP_VCLUSTER_PREFIX}-h2 wrote it" \
  "$tmp/nl4"; then
  echo "ok: node-local: a shard on another host's disk is named with that host"
else
  echo "FAIL: node-local on one host: $(tail -3 "$tmp/nl4")"; fail=1
fi
exit $fail
