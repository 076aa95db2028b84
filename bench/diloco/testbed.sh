#!/usr/bin/env bash
# DiLoCo's speed on the virtual cluster (scripts/vcluster: 2 hosts of one core each, 2 rank
# threads per host, real TCP shaped by tbf): tokens/s of the synchronous modes (two-level
# stage 3, and the mode estimate advises at slow links) against DiLoCo's islands (an island
# per host) and Streaming DiLoCo, shaped and unshaped, alternated, the best of 2. A synchronous
# run's figure is its median step (steps past the first two); an island run's is its tokens
# over its seconds from step 3 to the one before last, outer steps included: the rounds that
# end at 50 and 100 (H = 50), at 100 (H = 100), and streaming's four exchanges of a round. The
# last step, which ends every round at once, is a one-off of the run's end and left out.
#
#   bench/diloco/testbed.sh ZERODP [RATE] [SIZE]      (defaults: 10mbit, small; as root)
#   ZERODP_TESTBED_ONLY="2 3 4 5" runs those modes only (0-based, in the table's order).
set -uo pipefail
zerodp=$(realpath "$1")
rate=${2:-10mbit}
size=${3:-small}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
vcluster=$here/../../scripts/vcluster
export ZERODP_VCLUSTER_PREFIX=zdpd$$
tmp=$(mktemp -d)
trap '"$vcluster" down; rm -rf "$tmp"' EXIT
cpus=0,1
[[ $(nproc) -ge 2 ]] || cpus=0,0
"$vcluster" up --hosts 2 --cpus "$cpus" || exit $?
py=/usr/bin/python3
common=(--size "$size" --data synthetic --no-progress --stage 3 --node-ranks 2)

# tokens/s of a report: synchronous runs by their median step, island runs over all steps.
rate_of() {
  "$py" - "$1" "$2" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
steps = r["steps"][2:]
if sys.argv[2] == "median":
    print(steps[0]["tokens"] / statistics.median(s["seconds"] for s in steps))
else:
    steps = steps[:-1]
    print(sum(s["tokens"] for s in steps) / sum(s["seconds"] for s in steps))
PY
}
run() {  # run RATE STEPS HOW FLAGS...: tokens/s
  local shape=$1 steps=$2 how=$3
  shift 3
  "$vcluster" rate "$shape"
  if "$vcluster" mpirun -np 2 "$zerodp" train --backend mpi --ranks-per-process 2 "${common[@]}" \
    --steps "$steps" "$@" --report "$tmp/r.json" >"$tmp/log" 2>&1; then
    rate_of "$tmp/r.json" "$how"
  else
    echo "run failed: $* at $shape" >&2
    tail -3 "$tmp/log" >&2
    echo nan
  fi
}
best() { printf '%s\n' "$@" | sort -g | tail -1; }

tl="--collectives two-level"
names=("two-level" "two-level + hpZ + qwZ + qgZ int4" "DiLoCo H=50" "DiLoCo H=100"
       "Streaming H=100 F=4 tau=5" "Streaming H=100 F=4 tau=20" "DiLoCo H=50 int4"
       "Streaming H=100 F=4 tau=5 int4")
flags=("$tl" "$tl --hpz --qwz --qgz int4" "--islands 2 --outer-every 50"
       "--islands 2 --outer-every 100" "--islands 2 --outer-every 100 --fragments 4 --outer-delay 5"
       "--islands 2 --outer-every 100 --fragments 4 --outer-delay 20"
       "--islands 2 --outer-every 50 --outer-quant int4"
       "--islands 2 --outer-every 100 --fragments 4 --outer-delay 5 --outer-quant int4")
steps=(22 22 102 102 102 102 102 102)
hows=(median median all all all all all all)
declare -A shaped unshaped
only=${ZERODP_TESTBED_ONLY:-${!names[*]}}
for i in $only; do
  s=() u=()
  for _ in 1 2; do
    # shellcheck disable=SC2086 # flags are a word list
    u+=("$(run none "${steps[$i]}" "${hows[$i]}" ${flags[$i]})")
    # shellcheck disable=SC2086
    s+=("$(run "$rate" "${steps[$i]}" "${hows[$i]}" ${flags[$i]})")
  done
  unshaped[$i]=$(best "${u[@]}")
  shaped[$i]=$(best "${s[@]}")
done
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $size, 2 hosts x 2 rank threads, one core per host, link $rate"
printf '%-32s %12s %12s %9s\n' mode "unshaped" "$rate" "shaped/unshaped"
for i in $only; do
  printf '%-32s %12.0f %12.0f %9.2f\n' "${names[$i]}" "${unshaped[$i]}" "${shaped[$i]}" \
    "$(awk -v a="${shaped[$i]}" -v b="${unshaped[$i]}" 'BEGIN {print a / b}')"
done
