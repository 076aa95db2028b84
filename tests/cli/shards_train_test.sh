#!/usr/bin/env bash
# Training over token shards on disk (--data DIR): llm.c's format, read as the steps need it.
#   1. an llm.c directory (no manifest) needs --vocab, and trains with it;
#   2. a stop and a resume on another rank count at another stage, mid-shard, continue the run
#      that never stopped bit for bit (weights hash), and the chain of the samples read is the
#      uninterrupted run's;
#   3. the checkpoint names its data set: a resume on another set is refused;
#   4. a token past the vocabulary is refused naming the shard and the offset.
# The shards hold the repository's docs as bytes (vocabulary 256), cut at odd places so that
# windows cross shard boundaries.
#   shards_train_test.sh ZERODP
set -uo pipefail
zerodp=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cd "$tmp" || exit 1

# llm.c's writer, as dev/data/data_common.py lays the file out: 256 int32 (magic 20240520,
# version 1, count), then uint16 tokens.
cat "$repo"/docs/*.md | head -c 600000 >corpus.bin
python3 - <<'EOF'
import os, struct
data = open("corpus.bin", "rb").read()
def write(path, toks):
    head = struct.pack("<3i", 20240520, 1, len(toks)) + b"\0" * (1024 - 12)
    open(path, "wb").write(head + b"".join(struct.pack("<H", t) for t in toks))
cuts = [0, 99991, 250007, len(data) - 30011, len(data)]
os.makedirs("set", exist_ok=True)
for i in range(3):
    write(f"set/docs_train_{i:06d}.bin", data[cuts[i]:cuts[i + 1]])
write("set/docs_val_000000.bin", data[cuts[3]:])
EOF

common=(--size tiny --data set --steps 12 --schedule constant --warmup 0 --no-progress)
err=$("$zerodp" train --size tiny --data set --steps 1 --no-progress 2>&1 >/dev/null)
if [[ $err == *"do not say their vocabulary; give --vocab"* ]]; then
  echo "ok: an llm.c directory without --vocab: $err"
else
  echo "FAIL: an llm.c directory without --vocab: $err"; fail=1
fi

field() { sed -n "s/.*$1 \([0-9a-f]*\).*/\1/p" "$2" | head -1; }
"$zerodp" train "${common[@]}" --vocab 256 --ranks 2 --micro-batch 4 --grad-accum 2 --stage 3 \
  >full.out 2>&1 || { echo "FAIL: the uninterrupted run"; cat full.out; fail=1; }
"$zerodp" train "${common[@]}" --vocab 256 --ranks 2 --micro-batch 4 --grad-accum 2 --stage 3 \
  --checkpoint-dir ck --checkpoint-every 5 --stop-after 5 >part.out 2>&1 ||
  { echo "FAIL: the first part"; cat part.out; fail=1; }
"$zerodp" train "${common[@]}" --vocab 256 --ranks 4 --micro-batch 4 --stage 1 --resume latest \
  --checkpoint-dir ck >rest.out 2>&1 || { echo "FAIL: the resume"; cat rest.out; fail=1; }
w_full=$(field "weights sha256" full.out) w_rest=$(field "weights sha256" rest.out)
c_full=$(field "chained: sha256" full.out) c_rest=$(field "chained: sha256" rest.out)
if [[ -n $w_full && $w_full == "$w_rest" && -n $c_full && $c_full == "$c_rest" ]]; then
  echo "ok: stopped after step 5 on 2 ranks (stage 3), resumed on 4 (stage 1): weights $w_full and samples chain $c_full as the run that never stopped"
else
  echo "FAIL: resume on shards: weights $w_full / $w_rest, chain $c_full / $c_rest"; fail=1
fi

# Another set of the same size (its files renamed): its digest differs.
mkdir other
for f in set/*; do b=$(basename "$f"); cp "$f" "other/${b/docs/else}"; done
err=$("$zerodp" train --size tiny --data other --vocab 256 --steps 12 --no-progress --ranks 2 \
  --micro-batch 4 --grad-accum 2 --resume ck/step_00000005 2>&1 >/dev/null)
if [[ $err == *"trained on the token shard set of digest"*"use the data the checkpoint was trained on"* ]]; then
  echo "ok: a resume on another shard set: $err"
else
  echo "FAIL: a resume on another shard set: $err"; fail=1
fi

# A token of 300 with a vocabulary of 256, 50 tokens into the second shard.
python3 - <<'EOF'
import struct
p = "set/docs_train_000001.bin"
b = bytearray(open(p, "rb").read())
b[1024 + 2 * 50:1024 + 2 * 51] = struct.pack("<H", 300)
open(p, "wb").write(bytes(b))
EOF
err=$("$zerodp" train --size tiny --data set --vocab 256 --steps 400 --no-progress 2>&1 >/dev/null)
if [[ $err == *"docs_train_000001.bin"* && $err == *"300"* ]]; then
  echo "ok: a token past the vocabulary: $err"
else
  echo "FAIL: a token past the vocabulary: $err"; fail=1
fi
exit $fail
