#!/usr/bin/env bash
# estimate against the testbed: for each mode over nodes, the median step of a run on 2 hosts of
# scripts/vcluster (one core each, 2 rank threads per host, real TCP shaped by tbf) at two link
# rates, beside `zerodp estimate`'s step for the same run with --compute-seconds set to the
# run's own unshaped median step and --inter-node-bandwidth set two ways: the shaped (nominal)
# rate, and the host rate `zerodp bench-comm --node-ranks 2` measures on the testbed at that
# rate (bf16 all-gathers and reduce-scatters of 256 KiB and 1 MiB, the sizes of the model's
# per-unit collectives, averaged): what a user of a real cluster can measure and give. Then
# the mode estimate advises at each rate, measured, against the fastest mode measured there. Shaped and unshaped runs alternate on the same hosts (vcluster
# rate), each figure the best of 2 medians of 20 steps; the spread is max/min over those steps.
#
#   bench/cluster/estimate_vs_testbed.sh ZERODP [SIZE] [STEPS]
#
# Rates per mode are where the link bounds the step (the quantized mode moves a quarter of the
# bytes, so it is measured at lower rates).
set -uo pipefail
zerodp=$(realpath "$1")
size=${2:-small}
steps=${3:-22}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
vcluster=$here/../../scripts/vcluster
export ZERODP_VCLUSTER_PREFIX=zdpe$$
tmp=$(mktemp -d)
trap '"$vcluster" down; rm -rf "$tmp"' EXIT
cores=$(nproc)
cpus=0,1
[[ $cores -ge 2 ]] || cpus=0,0
"$vcluster" up --hosts 2 --cpus "$cpus" || exit $?
common=(--size "$size" --data synthetic --steps "$steps" --no-progress --stage 3 --node-ranks 2)
py=/usr/bin/python3

# median and spread of the steps past the first two (start-up), from a report.
median() { "$py" -c 'import json,sys,statistics as s; t=[x["seconds"] for x in json.load(open(sys.argv[1]))["steps"]][2:]; print(s.median(t))' "$1"; }
spread() { "$py" -c 'import json,sys; t=[x["seconds"] for x in json.load(open(sys.argv[1]))["steps"]][2:]; print(round(max(t)/min(t), 2))' "$1"; }
best() { printf '%s\n' "$@" | sort -g | head -1; }

# One testbed run of MODE at RATE (none: unshaped); prints "median spread".
testbed() {
  local mode=$1 rate=$2
  "$vcluster" rate "$rate"
  # shellcheck disable=SC2086 # a mode is a word list
  if "$vcluster" mpirun -np 2 "$zerodp" train --backend mpi --ranks-per-process 2 "${common[@]}" \
    $mode --report "$tmp/r.json" >"$tmp/log" 2>&1; then
    echo "$(median "$tmp/r.json") $(spread "$tmp/r.json")"
  else
    echo "testbed run failed: $mode at $rate" >&2
    tail -3 "$tmp/log" >&2
    echo "nan nan"
  fi
}

# The model's shape and micro-batch as train resolves the preset, for estimate.
"$zerodp" train "${common[@]}" --steps 1 --ranks 4 --report "$tmp/shape.json" >/dev/null 2>&1
read -r layers heads embd seq mb < <("$py" -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]; print(c["layers"], c["heads"], c["embd"], c["seq_len"], c["micro_batch"])' "$tmp/shape.json")
shape=(--layers "$layers" --heads "$heads" --embd "$embd" --seq-len "$seq" --vocab 256 --micro-batch "$mb")

bytes_per_s() { awk -v m="${1%mbit}" 'BEGIN {printf "%g", m * 1e6 / 8}'; }
# The host rate bench-comm measures at RATE, in bytes per second.
declare -A measured
measure_link() {
  local rate=$1
  "$vcluster" rate "$rate"
  measured[$rate]=$("$vcluster" mpirun -np 2 "$zerodp" bench-comm --backend mpi \
    --ranks-per-process 2 --node-ranks 2 --ops all_gather,reduce_scatter --dtypes bf16 \
    --min-bytes 256KiB --max-bytes 1MiB --seconds-per-row 2 --json 2>/dev/null |
    "$py" -c 'import json,sys,statistics as s; print(s.mean(json.loads(l)["host_bytes_per_s"] for l in sys.stdin))')
}
# estimate's step for MODE given the compute and the link in bytes/s: "overlapped serial".
estimated() {
  local mode=$1 link=$2 compute=$3
  # shellcheck disable=SC2086
  "$zerodp" estimate "${shape[@]}" --ranks 4 --stage 3 --node-ranks 2 $mode \
    --compute-seconds "$compute" --inter-node-bandwidth "$link" --json |
    "$py" -c 'import json,sys; s=json.load(sys.stdin)[0]["step_seconds"]; print(s["overlapped"], s["serial"])'
}
# The flags estimate advises at RATE (the links alone decide).
advised() {
  "$zerodp" estimate "${shape[@]}" --ranks 4 --stage 3 --node-ranks 2 \
    --inter-node-bandwidth "$1" --json |
    "$py" -c 'import json,sys; print(json.load(sys.stdin)[0]["node_mode_choice"]["flags"] or "--collectives flat")'
}

# Flat, two-level, HSDP and every ZeRO++ combination (hpZ, qwZ, qgZ int8/int4, over two-level
# collectives). ZERODP_TESTBED_MODES=short keeps the first four (about a quarter of the time).
tl="--collectives two-level"
declare -A rates=(
  ["$tl"]="25mbit 50mbit"
  ["--collectives flat"]="25mbit 50mbit"
  ["--shard-within-node"]="25mbit 50mbit"
  ["$tl --hpz --qwz --qgz int4"]="10mbit 20mbit"
  ["$tl --hpz"]="25mbit 50mbit"
  ["$tl --qwz"]="20mbit 25mbit"
  ["$tl --qgz int8"]="20mbit 25mbit"
  ["$tl --qgz int4"]="20mbit 25mbit"
  ["$tl --hpz --qwz"]="10mbit 20mbit"
  ["$tl --hpz --qgz int8"]="10mbit 20mbit"
  ["$tl --hpz --qgz int4"]="10mbit 20mbit"
  ["$tl --qwz --qgz int8"]="10mbit 20mbit"
  ["$tl --qwz --qgz int4"]="10mbit 20mbit"
  ["$tl --hpz --qwz --qgz int8"]="10mbit 20mbit"
)
modes=("$tl" "--collectives flat" "--shard-within-node" "$tl --hpz --qwz --qgz int4")
if [[ ${ZERODP_TESTBED_MODES:-all} != short ]]; then
  modes+=("$tl --hpz" "$tl --qwz" "$tl --qgz int8" "$tl --qgz int4" "$tl --hpz --qwz"
          "$tl --hpz --qgz int8" "$tl --hpz --qgz int4" "$tl --qwz --qgz int8"
          "$tl --qwz --qgz int4" "$tl --hpz --qwz --qgz int8")
fi
declare -A unshaped shaped spreads
measure() {
  local mode=$1 rate
  local u=() s1=() s2=() sp1=() sp2=()
  read -r -a rs <<<"${rates[$mode]}"
  for _ in 1 2; do
    read -r m _ < <(testbed "$mode" none) && u+=("$m")
    read -r m sp < <(testbed "$mode" "${rs[0]}") && s1+=("$m") && sp1+=("$sp")
    read -r m sp < <(testbed "$mode" "${rs[1]}") && s2+=("$m") && sp2+=("$sp")
  done
  unshaped[$mode]=$(best "${u[@]}")
  shaped["$mode@${rs[0]}"]=$(best "${s1[@]}")
  shaped["$mode@${rs[1]}"]=$(best "${s2[@]}")
  spreads["$mode@${rs[0]}"]=$(IFS=/; echo "${sp1[*]}")
  spreads["$mode@${rs[1]}"]=$(IFS=/; echo "${sp2[*]}")
}
for mode in "${modes[@]}"; do measure "$mode"; done
for rate in 10mbit 20mbit 25mbit 50mbit; do measure_link "$rate"; done

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $size, 2 hosts x 2 rank threads, one core per host"
echo "host rate bench-comm measures: $(for r in 10mbit 20mbit 25mbit 50mbit; do
  awk -v r="$r" -v m="${measured[$r]}" -v n="$(bytes_per_s "$r")" \
    'BEGIN {printf "%s %.2f MB/s (%.0f%%); ", r, m / 1e6, 100 * m / n}'; done)"
printf '%-44s %7s %9s %9s %10s %7s %10s %7s %7s %10s\n' "mode" "rate" "unshaped" "testbed" \
  "nominal" "ratio" "measured" "ratio" "serial" "spread"
for mode in "${modes[@]}"; do
  for rate in ${rates[$mode]}; do
    t=${shaped["$mode@$rate"]}
    read -r nominal _ < <(estimated "$mode" "$(bytes_per_s "$rate")" "${unshaped[$mode]}")
    read -r over serial < <(estimated "$mode" "${measured[$rate]}" "${unshaped[$mode]}")
    printf '%-44s %7s %9.3f %9.3f %10.3f %7.2f %10.3f %7.2f %7.2f %10s\n' "$mode" "$rate" \
      "${unshaped[$mode]}" "$t" "$nominal" "$(awk -v a="$nominal" -v b="$t" 'BEGIN {print a / b}')" \
      "$over" "$(awk -v a="$over" -v b="$t" 'BEGIN {print a / b}')" \
      "$(awk -v a="$serial" -v b="$t" 'BEGIN {print a / b}')" "${spreads["$mode@$rate"]}"
  done
done

# The advice: at each rate every mode measured there, and the one estimate names.
for rate in 10mbit 20mbit 25mbit 50mbit; do
  pick=$(advised "${measured[$rate]}")
  fastest="" tf=""
  for mode in "${modes[@]}"; do
    t=${shaped["$mode@$rate"]:-}
    [[ -n $t ]] || continue
    if [[ -z $tf ]] || awk -v a="$t" -v b="$tf" 'BEGIN {exit !(a < b)}'; then fastest=$mode tf=$t; fi
  done
  tp=${shaped["$pick@$rate"]:-}
  if [[ -z $tp ]]; then
    read -r ms _ < <(testbed "$pick" "$rate")
    read -r ms2 _ < <(testbed "$pick" "$rate")
    tp=$(best "$ms" "$ms2")
  fi
  echo "at $rate estimate advises '$pick': measured $tp s; fastest of the others measured '$fastest' $tf s ($(awk -v a="$tp" -v b="$tf" 'BEGIN {printf "%+.0f%%", (a / b - 1) * 100}'))"
done
