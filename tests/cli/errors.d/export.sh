# zerodp export and zerodp sample on hostile checkpoints, model files and output paths
# Sourced by errors_test.sh.
ex_tools=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ex_py=$(command -v python3 || echo /usr/bin/python3)
ex_tmp=$(mktemp -d)
ex_bad() { echo "FAIL: $*"; fail=1; }
"$zerodp" train --size tiny --data synthetic --steps 1 --micro-batch 2 --ranks 2 --no-progress \
  --checkpoint-dir "$ex_tmp/ck" >/dev/null 2>&1 || ex_bad "export.sh: could not train a checkpoint"
ex_step=$ex_tmp/ck/step_00000001

# A copy of the checkpoint with meta.json edited by a Python expression on `m` (meta.json
# carries the shards' checksums, not its own, so an edit needs nothing recomputed).
ex_meta() {  # ex_meta NAME EXPR
  rm -rf "$ex_tmp/$1" && cp -r "$ex_step" "$ex_tmp/$1"
  "$ex_py" - "$ex_tmp/$1/meta.json" "$2" <<'PY'
import json, sys
path, expr = sys.argv[1], sys.argv[2]
m = json.load(open(path))
exec(expr)
json.dump(m, open(path, "w"), indent=2)
PY
}
# Nothing half-written may stay beside the output after a refusal.
ex_no_leftovers() {  # ex_no_leftovers DIR LABEL
  local left
  left=$(find "$1" -maxdepth 1 \( -name '*.partial' -o -name '.*.tmp.*' -o -name 'out.safetensors' \))
  [[ -z $left ]] || ex_bad "$2 left $left behind"
}

# Class 9: meta.json's model description is checked against itself before anything is written.
mkdir -p "$ex_tmp/o"
ex_meta swapped 'm["units"][0]["tensors"][0]["shape"] = [32, 256]'
expect_code 3 'field "units[0].tensors[0]"' export "$ex_tmp/swapped" --out "$ex_tmp/o/out.safetensors"
ex_no_leftovers "$ex_tmp/o" "export of a swapped shape"
ex_meta layers 'm["model"]["layers"] = 3'
expect_code 3 'field "model.layers" is 3' export "$ex_tmp/layers" --out "$ex_tmp/o/out.safetensors"
ex_meta heads 'm["model"]["heads"] = 3'
expect_code 3 'field "model.heads" is 3' export "$ex_tmp/heads" --out "$ex_tmp/o/out.safetensors"
ex_meta huge 'm["model"]["layers"] = 10**12'
expect_code 3 'field "model.layers"' export "$ex_tmp/huge" --out "$ex_tmp/o/out.safetensors"
ex_meta numel 'm["units"][0]["tensors"][1]["numel"] = 1000'
expect_code 3 'field "units[0].tensors[1].numel" is 1000' export "$ex_tmp/numel" \
  --out "$ex_tmp/o/out.safetensors"
ex_no_leftovers "$ex_tmp/o" "export of a wrong numel"
ex_meta offset 'm["units"][1]["tensors"][1]["offset"] = 40'
expect_code 3 'field "units[1].tensors[1].offset" is 40' export "$ex_tmp/offset" \
  --out "$ex_tmp/o/out.safetensors"
ex_meta shape 'm["units"][0]["tensors"][1]["shape"] = [33, 32]'
expect_code 3 'field "units[0].tensors[1].numel"' export "$ex_tmp/shape" --out "$ex_tmp/o/out.safetensors"
ex_no_leftovers "$ex_tmp/o" "export of a wrong shape"
# train --resume reads the same meta.json the same way.
expect_code 3 'field "units[0].tensors[1].numel"' train --size tiny --data synthetic --steps 2 \
  --micro-batch 2 --ranks 2 --no-progress --resume "$ex_tmp/shape"
# sample reads a checkpoint directory through the same checks.
expect_code 3 'field "units[0].tensors[0]"' sample "$ex_tmp/swapped" --max-tokens 2

# Classes 1 and 2: the output goes through what a link names, into a device in place, and
# never over the checkpoint it reads.
ln -s /dev/full "$ex_tmp/o/full"
expect_code 1 "--out '$ex_tmp/o/full'" export "$ex_step" --out "$ex_tmp/o/full"
[[ -L $ex_tmp/o/full ]] || ex_bad "export --out LINK-TO-/dev/full replaced the link"
ex_sum=$(sha256sum "$ex_step/rank_00000.safetensors")
expect "would overwrite" export "$ex_tmp/ck" --out "$ex_step/rank_00000.safetensors"
expect "would overwrite" export "$ex_step" --out "$ex_step/meta.json"
[[ $(sha256sum "$ex_step/rank_00000.safetensors") == "$ex_sum" ]] ||
  ex_bad "export --out SHARD changed the shard"
ln -s "$ex_step/rank_00001.safetensors" "$ex_tmp/o/shard-link"
expect "would overwrite" export "$ex_tmp/ck" --out "$ex_tmp/o/shard-link"

# Class 11: a shard or meta.json that is not a regular file is corrupt data, named.
ex_meta fifo 'pass'
rm "$ex_tmp/fifo/rank_00001.safetensors" && mkfifo "$ex_tmp/fifo/rank_00001.safetensors"
expect_code 3 "rank_00001.safetensors' is a FIFO" export "$ex_tmp/fifo" --out "$ex_tmp/o/out.safetensors"
ex_meta dir 'pass'
rm "$ex_tmp/dir/rank_00000.safetensors" && mkdir "$ex_tmp/dir/rank_00000.safetensors"
expect_code 3 "rank_00000.safetensors' is a directory" export "$ex_tmp/dir" \
  --out "$ex_tmp/o/out.safetensors"
ex_meta zero 'pass'
ln -sf /dev/zero "$ex_tmp/zero/rank_00000.safetensors"
expect_code 3 "rank_00000.safetensors' is a character device" export "$ex_tmp/zero" \
  --out "$ex_tmp/o/out.safetensors"
ex_meta metafifo 'pass'
rm "$ex_tmp/metafifo/meta.json" && mkfifo "$ex_tmp/metafifo/meta.json"
expect_code 3 "meta.json' is a FIFO" export "$ex_tmp/metafifo" --out "$ex_tmp/o/out.safetensors"
ex_no_leftovers "$ex_tmp/o" "export of a non-regular shard"

# Class 11: non-finite weights are corrupt data naming the file and the tensor, at load.
"$ex_py" "$ex_tools/write_tiny_gpt.py" "$ex_tmp/tiny.safetensors"
"$ex_py" "$ex_tools/edit_safetensors.py" "$ex_tmp/tiny.safetensors" "$ex_tmp/nan.safetensors" \
  --nan h.1.mlp.c_fc.weight
expect_code 3 "nan.safetensors: tensor h.1.mlp.c_fc.weight holds nan" sample \
  "$ex_tmp/nan.safetensors" --max-tokens 2

# Class 8: shape fields in the metadata are checked against the tensors before any
# allocation (seq_len 1e9 was a bad_alloc, 2e7 cost 2.5 GB).
for ex_kv in seq_len=20000000 seq_len=1000000000 layers=1000000000 vocab=128 embd=0; do
  "$ex_py" "$ex_tools/edit_safetensors.py" "$ex_tmp/tiny.safetensors" "$ex_tmp/meta.safetensors" \
    --metadata "$ex_kv"
  expect_code 3 "meta.safetensors: metadata ${ex_kv%%=*} is ${ex_kv#*=}" sample \
    "$ex_tmp/meta.safetensors" --max-tokens 2
done
# Class 5: a FIFO as MODEL is refused, not read forever.
mkfifo "$ex_tmp/model.fifo"
expect "is a FIFO" sample "$ex_tmp/model.fifo" --max-tokens 2
rm -rf "$ex_tmp"
