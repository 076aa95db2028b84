#!/usr/bin/env bash
# The simulated link against the real one: each mode's median step on 2 hosts x 2 rank
# threads of scripts/vcluster shaped to RATE (real TCP through tbf), beside the local
# backend's run with --inter-node-bandwidth at the same rate (comm/link_model.h), both
# alternated, the best of 2; and each testbed run's step-time spread (max / min over steps
# 3..22). Usage: bench/cluster/link_model.sh ZERODP [RATE_MBIT] [SIZE]
set -uo pipefail
zerodp=$(realpath "$1")
mbit=${2:-50}
size=${3:-small}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
vcluster=$here/../../scripts/vcluster
export ZERODP_VCLUSTER_PREFIX=zdpb$$
tmp=$(mktemp -d)
trap '"$vcluster" down; rm -rf "$tmp"' EXIT
"$vcluster" up --hosts 2 --rate "${mbit}mbit" || exit $?
common=(--size "$size" --data synthetic --steps 22 --no-progress --stage 3 --node-ranks 2)
rate=$(awk -v m="$mbit" 'BEGIN {printf "%g", m * 1e6 / 8}')
median() {
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput"]["step_seconds_median"])' "$1"
}
# max / min of the step times past the first two (start-up): a steady link gives near 1.
spread() {
  /usr/bin/python3 -c 'import json,sys; t=[s["seconds"] for s in json.load(open(sys.argv[1]))["steps"]][2:]; print(round(max(t) / min(t), 2))' "$1"
}
best() { printf '%s\n' "$@" | sort -g | head -1; }
printf '%-42s %10s %10s %7s %8s\n' "mode ($size, ${mbit} Mbit per host)" "testbed s" "model s" \
  "ratio" "spread"
for mode in "--collectives two-level" "--collectives flat" "--shard-within-node" \
            "--collectives two-level --hpz --qwz --qgz int4"; do
  real=() sim=() spreads=()
  for _ in 1 2; do
    # shellcheck disable=SC2086
    "$vcluster" mpirun -np 2 "$zerodp" train --backend mpi --ranks-per-process 2 "${common[@]}" \
      $mode --report "$tmp/r.json" >/dev/null 2>&1 && real+=("$(median "$tmp/r.json")") &&
      spreads+=("$(spread "$tmp/r.json")")
    # shellcheck disable=SC2086
    "$zerodp" train --ranks 4 "${common[@]}" $mode --inter-node-bandwidth "$rate" \
      --report "$tmp/s.json" >/dev/null 2>&1 && sim+=("$(median "$tmp/s.json")")
  done
  r=$(best "${real[@]}") s=$(best "${sim[@]}")
  printf '%-42s %10.3f %10.3f %7.2f %8s\n' "$mode" "$r" "$s" \
    "$(awk -v a="$s" -v b="$r" 'BEGIN {print a / b}')" "$(IFS=/; echo "${spreads[*]}")"
done
