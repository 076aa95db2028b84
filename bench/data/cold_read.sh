#!/usr/bin/env bash
# How long a step waits for data read from token shards whose pages are not in the page
# cache: the shards' pages are dropped (posix_fadvise DONTNEED) before each run, then rank
# 0's time reading its samples (the report's data_seconds) is summed over the steps and set
# against the steps' wall time, step 1 aside.
#   bench/data/cold_read.sh ZERODP [SHARDS_DIR]
# Without SHARDS_DIR: a tokenizer (vocab 8192) and shards of the KJV are made in a temporary
# directory. Prints one line per case: model, steps, data wait / step time.
set -euo pipefail
zerodp=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shards=${2:-}
if [[ -z $shards ]]; then
  "$zerodp" tokenizer train --input kjv --vocab 8192 --out "$tmp/tok.model" --quiet
  "$zerodp" prepare --tokenizer "$tmp/tok.model" --out "$tmp/shards" kjv --quiet
  shards=$tmp/shards
fi
drop() {
  python3 - "$shards" <<'PY'
import os, sys
for name in sorted(os.listdir(sys.argv[1])):
    if name.endswith(".bin"):
        fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}
for case in "small 80" "medium 24"; do
  read -r size steps <<<"$case"
  drop
  "$zerodp" train --model llama --size "$size" --data "$shards" --ranks 2 --stage 3 \
    --steps "$steps" --no-progress --metrics "$tmp/m.jsonl" >/dev/null
  python3 - "$tmp/m.jsonl" "$size" "$steps" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
wait = sum(r["data_seconds"] for r in rows)
total = sum(r["seconds"] for r in rows)
print(f"llama {sys.argv[2]}, {sys.argv[3]} steps, cold shards: data wait {1000 * wait / len(rows):.3f} ms "
      f"of {1000 * total / len(rows):.1f} ms per step = {100 * wait / total:.3f} % (step 1 aside)")
PY
done
