#!/usr/bin/env bash
# Training over token shards larger than the memory the run may use: GB gigabytes of
# synthetic uint16 shards (random tokens below 8192, written at disk speed, not tokenized
# text) and a small set of the same kind, each trained on under a cgroup (v1 memory
# controller) limited to LIMIT, memory included the page cache. Prints, per set: its size,
# tokens/s, rank 0's data wait per step, the process's peak RSS and the cgroup's peak usage.
#   bench/data/larger_than_memory.sh ZERODP [GB=20] [LIMIT=2G] [DIR=/var/tmp]
# Needs root (the cgroup) and GB of free disk under DIR; removes what it made.
set -euo pipefail
zerodp=$(realpath "$1")
gb=${2:-20}
limit=${3:-2G}
work=$(mktemp -d "${4:-/var/tmp}/zerodp-ltm.XXXXXX")
cg=/sys/fs/cgroup/memory/zerodp-ltm-$$
cleanup() {
  rm -rf "$work"
  if [[ -d $cg ]]; then rmdir "$cg" 2>/dev/null || true; fi
}
trap cleanup EXIT
[[ -d /sys/fs/cgroup/memory ]] || { echo "no cgroup v1 memory controller here"; exit 77; }

# llm.c's layout (dev/data/data_common.py): 256 int32 (20240520, 1, count), uint16 tokens.
python3 - "$work" "$gb" <<'PY'
import os, sys, time
import random
out, gb = sys.argv[1], float(sys.argv[2])
per = 100_000_000  # tokens a shard, as llm.c's fineweb.py cuts them
def shard(path, n, seed):
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        f.write((20240520).to_bytes(4, "little") + (1).to_bytes(4, "little") +
                n.to_bytes(4, "little") + bytes(1024 - 12))
        block = bytes(rnd.getrandbits(8) & (0xff if i % 2 == 0 else 0x1f) for i in range(1 << 20))
        left = 2 * n
        while left:
            k = min(left, len(block))
            f.write(block[:k])
            left -= k
t = time.time()
os.makedirs(f"{out}/big"); os.makedirs(f"{out}/small")
count = max(1, int(gb * 1e9 / (2 * per)))
for i in range(count):
    shard(f"{out}/big/synth_train_{i:06d}.bin", per, i)
shard(f"{out}/big/synth_val_000000.bin", 1_000_000, 10**6)
shard(f"{out}/small/synth_train_000000.bin", 10_000_000, 1)
shard(f"{out}/small/synth_val_000000.bin", 1_000_000, 10**6)
took = time.time() - t
print(f"wrote {count} shards of {per} tokens ({count * 2 * per / 1e9:.1f} GB) in {took:.0f} s "
      f"({count * 2 * per / 1e6 / took:.0f} MB/s)")
PY
sync
mkdir "$cg"
echo "$limit" >"$cg/memory.limit_in_bytes"
for set in small big; do
  bytes=$(du -sb "$work/$set" | cut -f1)
  # Each set starts cold: its pages dropped, the cgroup's peak reset.
  python3 - "$work/$set" <<'PY'
import os, sys
for n in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], n), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
  echo 0 >"$cg/memory.max_usage_in_bytes"
  bash -c "echo \$\$ >'$cg/cgroup.procs' && exec /usr/bin/time -f '%M' '$zerodp' train --model llama \
    --size small --data '$work/$set' --vocab 8192 --steps 150 --ranks 2 --stage 3 --no-progress \
    --metrics '$work/m.jsonl'" >"$work/out" 2>"$work/rss"
  rss_kb=$(tail -1 "$work/rss")
  peak=$(cat "$cg/memory.max_usage_in_bytes")
  python3 - "$work/m.jsonl" "$set" "$bytes" "$rss_kb" "$peak" "$limit" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
wait = sum(r["data_seconds"] for r in rows) / len(rows)
step = sum(r["seconds"] for r in rows) / len(rows)
tokens = sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)
print(f"{sys.argv[2]:>5} set {int(sys.argv[3]) / 1e9:6.2f} GB under {sys.argv[6]}: {tokens:,.0f} tokens/s, "
      f"data wait {1000 * wait:.2f} ms of a {1000 * step:.1f} ms step ({100 * wait / step:.2f} %), "
      f"peak RSS {int(sys.argv[4]) / 1024:.0f} MiB, cgroup peak {int(sys.argv[5]) / 2**20:.0f} MiB "
      "(page cache included)")
PY
done
