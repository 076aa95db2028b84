#!/usr/bin/env bash
# Islands in turn against the same islands on ranks of their own (issue: low-communication
# training): GPT on synthetic data, I islands of n ranks on I x n ranks, and the same I
# islands in turn on n ranks. Prints, per run, the weights hash (the two must agree), rank
# 0's ledger peak and its model states, the process's max RSS and tokens/s; the two runs
# alternate, REPEAT times each.
#
#   bench/diloco/in_turn.sh [ZERODP] [SIZE] [ISLANDS] [RANKS] [REPEAT]
#       (defaults: build/release/cli/zerodp, medium, 4, 2, 2)
set -euo pipefail
zerodp=${1:-build/release/cli/zerodp}
size=${2:-medium}
islands=${3:-4}
ranks=${4:-2}
repeat=${5:-2}
out=$(mktemp -d /tmp/zerodp-in-turn.XXXXXX)
trap 'rm -rf "$out"' EXIT
common=(train --size "$size" --data synthetic --steps 4 --no-progress --islands "$islands"
        --outer-every 2 --stage 1 --micro-batch 4 --grad-accum 1)
printf '%-28s %-18s %14s %14s %14s %10s\n' run weights "peak/rank MiB" "states MiB" "max RSS MB" tokens/s
for ((k = 0; k < repeat; k++)); do
  for mode in cluster turn; do
    if [[ $mode == cluster ]]; then
      flags=(--ranks $((islands * ranks)))
      name="$islands islands of $ranks"
    else
      flags=(--ranks "$ranks" --islands-in-turn)
      name="$islands islands in turn on $ranks"
    fi
    /usr/bin/time -f "%M" -o "$out/rss" "$zerodp" "${common[@]}" "${flags[@]}" \
      --report "$out/r.json" >/dev/null
    rss=$(( $(cat "$out/rss") / 1000 ))
    /usr/bin/python3 - "$out/r.json" "$name" "$rss" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rank0 = r["ranks"][0]
states = sum(rank0["model_state_bytes"][k] for k in ("params", "grads", "master", "adam_m", "adam_v"))
print(f'{sys.argv[2]:<28} {r["final"]["weights_sha256"][:16]:<18} '
      f'{rank0["peak_bytes"]["total"] / 2**20:14.1f} {states / 2**20:14.1f} {sys.argv[3]:>14} '
      f'{r["throughput"]["tokens_per_second"]:10.0f}')
PY
  done
done
