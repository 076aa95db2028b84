#!/usr/bin/env bash
# Hugging Face's layout both ways, against the PyTorch reference (bench/vs_torch/hf_ref.py),
# for the gpt (as GPT-2) and the llama, tiny and small:
#   1. the reference writes a model in HF's layout (sharded for small); zerodp samples it and
#      starts training from it (--init-from DIR, the model taken from config.json);
#   2. zerodp exports that run's step 0 in HF's layout (--format hf, sharded for small); the
#      reference loads zerodp's export;
#   3. in both directions zerodp's fp32 logits err against the reference's float64 copy at
#      most 2x the reference's own fp32 logits, and greedy decoding is identical;
#   4. HF export -> --init-from -> HF export gives the same files byte for byte, across rank
#      counts and stages, in F32 and BF16; zerodp's export holds the reference's tensors.
# Skipped (77) when /usr/bin/python3 cannot import torch.
#   hf_interop_test.sh ZERODP
set -uo pipefail
zerodp=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ref=$repo/bench/vs_torch/hf_ref.py
py=/usr/bin/python3
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIP: $py cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cd "$tmp" || exit 1
printf 'In the beginning God created the' >prompt.txt

# zerodp's logits of MODEL against the reference's float64 logits of the same directory.
logits_check() {  # LABEL MODEL
  local label=$1 model=$2
  if ! "$zerodp" sample "$model" --prompt "$(cat prompt.txt)" --logits z.npy 2>z.err ||
    ! "$py" "$ref" logits "$model" --text prompt.txt --out r >/dev/null 2>r.err; then
    echo "FAIL: $label: logits"; cat z.err r.err; fail=1; return
  fi
  "$py" - "$label" <<'EOF' || fail=1
import sys
import numpy as np
z = np.load("z.npy").astype(np.float64)
t = np.load("r.fp32.npy").astype(np.float64).reshape(z.shape)
d = np.load("r.fp64.npy").reshape(z.shape)
ez, et = np.abs(z - d).max(), np.abs(t - d).max()
verdict = "ok" if ez <= 2 * et else "FAIL"
print(f"{verdict}: {sys.argv[1]}: logits {z.shape}, largest error against float64 zerodp "
      f"{ez:.3e}, PyTorch fp32 {et:.3e} (ratio {ez / et:.2f}, at most 2)")
sys.exit(verdict != "ok")
EOF
}

greedy_check() {  # LABEL MODEL [zerodp flags]
  local label=$1 model=$2
  shift 2
  local want got
  want=$("$py" "$ref" greedy "$model" --prompt "And God said" --tokens 60 2>/dev/null)
  got=$("$zerodp" sample "$model" --prompt "And God said" --temperature 0 --max-tokens 60 "$@" |
    od -An -v -tu1 | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
  if [[ -n $got && $got == "$want" ]]; then
    echo "ok: $label: 60 greedy tokens equal the reference's"
  else
    echo "FAIL: $label greedy: zerodp '$got', reference '$want'"; fail=1
  fi
}

# Every tensor of A's files byte for byte in B's (names, dtypes, shapes, bytes).
same_tensors() {  # A B
  "$py" - "$1" "$2" <<'EOF'
import json, os, struct, sys
def tensors(d):
    files = ["model.safetensors"]
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        files = sorted(set(json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"].values()))
    out = {}
    for f in files:
        raw = open(os.path.join(d, f), "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
        for k, v in h.items():
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], raw[8 + n + b:8 + n + e])
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = sorted(k for k in a if a[k] != b.get(k)) + sorted(set(b) - set(a))
if bad:
    print(f"differ: {bad[:5]} ({len(bad)} of {len(a)})"); sys.exit(1)
print(f"{len(a)} tensors equal")
EOF
}

for kind in gpt llama; do
  for size in tiny small; do
    name="$kind $size"
    shard=()
    [[ $size == small ]] && shard=(--max-shard-size 200000)
    cache=()
    [[ $kind == llama ]] && cache=(--no-cache)
    # 1. The reference's model, in HF's layout.
    if ! "$py" "$ref" init --model "$kind" --size "$size" --seed 3 --std 0.3 --norm-jitter 0.2 \
        --gpt own --out "ref-$kind-$size" "${shard[@]}" >/dev/null 2>init.err; then
      echo "FAIL: $name: hf_ref.py init"; cat init.err; fail=1; continue
    fi
    logits_check "$name, the reference's HF files in zerodp" "ref-$kind-$size"
    greedy_check "$name, the reference's HF files in zerodp" "ref-$kind-$size" "${cache[@]}"
    # 2. A run from them (no model flag: config.json says), exported in HF's layout.
    if ! "$zerodp" train --init-from "ref-$kind-$size" --data synthetic --steps 0 --no-progress \
        --ranks 2 --stage 3 --precision fp32 --checkpoint-dir "ck-$kind-$size" >train.out 2>&1 ||
      ! "$zerodp" export "ck-$kind-$size" --format hf --out "hf-$kind-$size" "${shard[@]}" \
        --quiet 2>export.err; then
      echo "FAIL: $name: train --init-from, export --format hf"; cat train.out export.err; fail=1
      continue
    fi
    if out=$(same_tensors "ref-$kind-$size" "hf-$kind-$size"); then
      echo "ok: $name: zerodp's HF export holds the reference's tensors byte for byte ($out)"
    else
      echo "FAIL: $name: zerodp's export against the reference's files: $out"; fail=1
    fi
    logits_check "$name, zerodp's HF export in the reference" "hf-$kind-$size"
    greedy_check "$name, zerodp's HF export in the reference" "hf-$kind-$size" "${cache[@]}"
  done
done

# 4. HF export -> --init-from -> HF export: the same files, across rank counts and stages,
#    in F32 and in BF16 (a BF16 file's values widen exactly into the fp32 master).
for pair in "gpt f32" "llama bf16" ; do
  read -r kind dtype <<<"$pair"
  {
    prev=ck-$kind-small
    first=
    for layout in "1 0" "3 1" "4 3"; do
      read -r ranks stage <<<"$layout"
      out=rt-$kind-$dtype-$ranks
      "$zerodp" export "$prev" --format hf --dtype "$dtype" --max-shard-size 200000 --out "$out" \
        --quiet 2>export.err || { echo "FAIL: export $prev"; cat export.err; fail=1; break; }
      if [[ -n $first ]] && ! cmp -s <(cd "$first" && cat config.json model*) <(cd "$out" && cat config.json model*); then
        echo "FAIL: $kind $dtype: the export after --init-from at $ranks ranks, stage $stage differs from the first"
        fail=1
      fi
      first=${first:-$out}
      "$zerodp" train --init-from "$out" --data synthetic --steps 0 --no-progress --ranks "$ranks" \
        --stage "$stage" --checkpoint-dir "ck-rt-$kind-$dtype-$ranks" >train.out 2>&1 ||
        { echo "FAIL: --init-from $out"; cat train.out; fail=1; break; }
      prev=ck-rt-$kind-$dtype-$ranks
    done
    n=$(ls "$first" | wc -l)
    echo "ok: $kind small $dtype: HF export -> --init-from (1 rank stage 0, 3 ranks stage 1, 4 ranks stage 3) -> HF export: the same $n files byte for byte"
  }
done

# Refused, naming what is wrong: a shard the index names that is missing, a tensor of
# another shape, a config zerodp cannot hold.
d="ref-llama-small"
cp -r "$d" broken
rm "broken/$(ls broken | grep -m1 '^model-')"
expect() {  # WHAT PATTERN CMD...
  local what=$1 pattern=$2
  shift 2
  local err
  err=$("$@" 2>&1 >/dev/null)
  if [[ $? -ne 0 && $err == *"$pattern"* ]]; then
    echo "ok: $what: $err"
  else
    echo "FAIL: $what: wanted '$pattern', got: $err"; fail=1
  fi
}
expect "a shard missing" "model.safetensors.index.json names model-00001-of-" \
  "$zerodp" train --init-from broken --data synthetic --steps 0 --no-progress
expect "a model flag against config.json" "--layers 3 differs from config.json's layers, 4" \
  "$zerodp" train --init-from "$d" --layers 3 --data synthetic --steps 0 --no-progress
rm -rf broken && cp -r ref-gpt-tiny broken
sed -i 's/"activation_function": "gelu"/"activation_function": "gelu_new"/' broken/config.json
expect "GPT-2's tanh GELU" '"activation_function" is "gelu_new"' \
  "$zerodp" sample broken --max-tokens 1
"$zerodp" train --model mlp --data synthetic --steps 1 --no-progress --checkpoint-dir ck-mlp \
  >/dev/null 2>&1
expect "a model without a layout" "kind mlp, which has no Hugging Face layout" \
  "$zerodp" export ck-mlp --format hf --out mlp-out
exit $fail
