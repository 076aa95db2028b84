#!/usr/bin/env bash
# train --init-from: a run starts from a safetensors file's weights at any stage and rank
# count (each rank reading its own ranges), in memory and offloaded; the round trip export ->
# init (--steps 0) -> export gives the same tensors, byte for byte; 16-bit files are widened;
# fine-tuning from a file gives the same bits at every rank count; a file that does not fit
# the model is refused naming the tensor; the report records the file and its sha256.
set -uo pipefail
zerodp=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
edit=$here/edit_safetensors.py
py=$(command -v python3)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cd "$tmp" || exit 1
tiny=(--size tiny --data synthetic --no-progress)

# The tensors (header without __metadata__, and the data) of two files are the same bytes.
same_tensors() {
  "$py" - "$1" "$2" <<'EOF'
import json, struct, sys
def load(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return header, blob[8 + n:]
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)
EOF
}

"$zerodp" train "${tiny[@]}" --steps 3 --ranks 2 --checkpoint-dir src >/dev/null 2>&1 &&
  "$zerodp" export src --out w.safetensors --quiet || { echo "FAIL: making the weights"; exit 1; }

# Round trips at several layouts: export -> init -> export.
for layout in "--ranks 3 --stage 3" "--ranks 2 --stage 1" "--ranks 1 --stage 0 --precision fp32" \
              "--ranks 2 --stage 3 --offload optimizer,params --offload-dir $tmp"; do
  rm -rf rt rt.safetensors
  # shellcheck disable=SC2086 # a layout is a word list
  if ! "$zerodp" train "${tiny[@]}" $layout --steps 0 --init-from w.safetensors \
      --checkpoint-dir rt >out 2>&1 || ! "$zerodp" export rt --out rt.safetensors --quiet; then
    echo "FAIL: round trip at $layout:"; tail -3 out; fail=1; continue
  fi
  if same_tensors w.safetensors rt.safetensors; then
    echo "ok: round trip at $layout: the same tensors"
  else
    echo "FAIL: round trip at $layout: the tensors differ"; fail=1
  fi
done

# A BF16 file: the master starts from its values widened, exactly.
"$py" "$edit" w.safetensors w16.safetensors --bf16
"$py" "$edit" w16.safetensors w16wide.safetensors  # the same file, to widen below
"$py" - w16.safetensors w16wide.safetensors <<'EOF'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
h = json.loads(blob[8:8 + n]); meta = h.pop("__metadata__", None); data = blob[8 + n:]
out, body, off = ({"__metadata__": meta} if meta else {}), bytearray(), 0
for name, t in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    b, e = t["data_offsets"]
    wide = b"".join(struct.pack("<I", v << 16) for (v,) in struct.iter_unpack("<H", data[b:e]))
    out[name] = {"dtype": "F32", "shape": t["shape"], "data_offsets": [off, off + len(wide)]}
    body += wide; off += len(wide)
text = json.dumps(out, separators=(",", ":")).encode(); text += b" " * (-(8 + len(text)) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + body)
EOF
rm -rf rt
if "$zerodp" train "${tiny[@]}" --ranks 2 --stage 2 --steps 0 --init-from w16.safetensors \
    --checkpoint-dir rt >out 2>&1 && "$zerodp" export rt --out rt16.safetensors --quiet &&
    same_tensors w16wide.safetensors rt16.safetensors; then
  echo "ok: a BF16 file starts the fp32 master from its values widened"
else
  echo "FAIL: BF16 file"; tail -3 out; fail=1
fi

# Fine-tuning from the file: the same bits at 1, 2 and 4 ranks (the same 4 micro-batches a
# step); not the bits of a run from the init function; the report names the file and its
# sha256.
want_sha=$(sha256sum w.safetensors | cut -d' ' -f1)
declare -A sha
for layout in "--ranks 1 --grad-accum 4" "--ranks 2 --grad-accum 2" "--ranks 4 --grad-accum 1"; do
  # shellcheck disable=SC2086
  "$zerodp" train "${tiny[@]}" --stage 3 $layout --steps 3 --init-from w.safetensors \
    --report r.json >out 2>&1 || { echo "FAIL: fine-tune at $layout"; tail -3 out; fail=1; continue; }
  sha[$layout]=$(grep -o 'weights sha256 [0-9a-f]*' out | cut -d' ' -f3)
  got=$("$py" -c 'import json,sys; r=json.load(open("r.json")); print(r["init_from"]["file"], r["init_from"]["sha256"])')
  [[ $got == "w.safetensors $want_sha" ]] || { echo "FAIL: report's init_from at $layout: $got"; fail=1; }
done
scratch=$("$zerodp" train "${tiny[@]}" --stage 3 --ranks 2 --grad-accum 2 --steps 3 2>&1 |
  grep -o 'weights sha256 [0-9a-f]*' | cut -d' ' -f3)
one=${sha["--ranks 1 --grad-accum 4"]:-} two=${sha["--ranks 2 --grad-accum 2"]:-}
four=${sha["--ranks 4 --grad-accum 1"]:-}
if [[ -n $one && $one == "$two" && $two == "$four" && $scratch != "$two" ]]; then
  echo "ok: fine-tuning from the file: $two at 1, 2 and 4 ranks (from scratch: $scratch)"
else
  echo "FAIL: fine-tuning bits: ${sha[*]} (scratch $scratch)"; fail=1
fi

# DiLoCo's islands start from the file too: two islands of two ranks, and the same two
# islands in turn on two ranks, give the same bits.
isl=(--stage 1 --steps 3 --islands 2 --outer-every 2 --grad-accum 1 --init-from w.safetensors)
cluster=$("$zerodp" train "${tiny[@]}" "${isl[@]}" --ranks 4 2>&1 | grep -o 'weights sha256 [0-9a-f]*')
turn=$("$zerodp" train "${tiny[@]}" "${isl[@]}" --ranks 2 --islands-in-turn 2>&1 |
  grep -o 'weights sha256 [0-9a-f]*')
if [[ -n $cluster && $cluster == "$turn" ]]; then
  echo "ok: islands from the file, on ranks of their own and in turn: $cluster"
else
  echo "FAIL: islands from the file: '$cluster' on their own ranks, '$turn' in turn"; fail=1
fi

# Files that do not fit the model: refused before training, naming the tensor.
refused() {  # refused NAME FILE PATTERN [FLAGS...]
  local name=$1 file=$2 pattern=$3
  shift 3
  "$zerodp" train "${tiny[@]}" --steps 1 --init-from "$file" "$@" >out 2>&1
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -q -- "$pattern" out; then
    echo "ok: $name: $(grep -- "$pattern" out | head -1)"
  else
    echo "FAIL: $name: exit $rc, wanted /$pattern/:"; cat out; fail=1
  fi
}
"$py" "$edit" w.safetensors missing.safetensors --drop h.1.mlp.c_fc.weight
"$py" "$edit" w.safetensors extra.safetensors --extra h.0.attn.bias
"$py" "$edit" w.safetensors ints.safetensors --retype h.0.ln_1.weight=I32
refused "a missing tensor" missing.safetensors "no tensor h.1.mlp.c_fc.weight \[128, 32\]"
refused "an extra tensor" extra.safetensors "holds h.0.attn.bias \[4\], which gpt tiny does not have"
"$py" "$edit" w.safetensors nan.safetensors --nan h.1.attn.c_proj.weight
refused "a NaN weight" nan.safetensors "tensor h.1.attn.c_proj.weight holds nan at element 0; give finite weights"
refused "an integer tensor" ints.safetensors "tensor h.0.ln_1.weight is I32; use F32, BF16 or F16"
refused "another model's shape" w.safetensors "tensor wte.weight is \[256, 32\] in the file, \[256, 64\]" --embd 64
refused "no such file" nothing.safetensors "init-from nothing.safetensors does not exist"
# A symbolic link loop is named as one, not as a missing file.
ln -s loop-b.safetensors loop-a.safetensors && ln -s loop-a.safetensors loop-b.safetensors
refused "a link loop" loop-a.safetensors "init-from loop-a.safetensors is a loop of symbolic links"

# A finite weight so large that every step overflows: nothing trains, and the run says so
# and fails rather than end with 'final loss -nan' and exit 0.
"$py" - w.safetensors huge.safetensors <<'EOF'
import json, struct, sys
blob = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack("<Q", blob[:8])
h = json.loads(blob[8:8 + n])
b = h["h.0.attn.c_attn.weight"]["data_offsets"][0]
blob[8 + n + b:8 + n + b + 4] = struct.pack("<f", 3e38)
open(sys.argv[2], "wb").write(blob)
EOF
"$zerodp" train "${tiny[@]}" --steps 3 --init-from huge.safetensors >out 2>&1
rc=$?
if [[ $rc -eq 1 ]] && grep -q "no step trained: all 3 were skipped for non-finite gradients or loss" out; then
  echo "ok: every step skipped: exit 1, $(grep 'no step trained' out)"
else
  echo "FAIL: every step skipped: exit $rc:"; cat out; fail=1
fi

# Last: an output over the input would destroy it.
refused "the report over the weights" w.safetensors "would overwrite --init-from" --report w.safetensors

exit $fail
