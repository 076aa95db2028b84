#!/usr/bin/env bash
# zerodp's fp32 training checked step by step against a PyTorch reference written from the
# equations (bench/vs_torch/llama_ref.py): the gpt tiny from the same weights (--init-from),
# on the same text, 20 steps; every step's loss must agree within 1e-5 relative. The
# reference reproduces the data order, the loss, gradient clipping, AdamW (which tensors
# decay) and the warmup + cosine schedule (llama_ref.py train_main lists the conventions).
# Also: the Llama reference's names and math against naive float64 equations (selfcheck).
# Skipped (77) when /usr/bin/python3 cannot import torch.
#   reference_steps_test.sh ZERODP
set -uo pipefail
zerodp=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ref=$repo/bench/vs_torch/llama_ref.py
torch_python=/usr/bin/python3
tolerance=1e-5
if ! "$torch_python" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIP: $torch_python cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
cd "$tmp" || exit 1

# The corpus: 64 KiB of the repository's docs, the same bytes for both tools.
cat "$repo"/docs/*.md | head -c 65536 >corpus.txt
# The weights: the reference's own GPT init (not the peer's, so the file does not depend on
# whether the peer is installed), biases and LayerNorm weights jittered so that the no-decay
# rule for them and their gradients matter from step 1.
"$torch_python" "$ref" init gpt.safetensors --model gpt --gpt own --size tiny --seed 7 \
  --norm-jitter 0.05 >/dev/null || { echo "FAIL: llama_ref.py init"; exit 1; }
# The llama's: Hugging Face's init (N(0, 0.02), norms 1), norms jittered likewise.
"$torch_python" "$ref" init llama.safetensors --model llama --size tiny --seed 7 \
  --norm-jitter 0.05 >/dev/null || { echo "FAIL: llama_ref.py init --model llama"; exit 1; }

# zerodp's defaults, stated on both sides so that a changed default fails here rather than
# silently comparing other recipes: lr 1e-3 with 2 warmup steps then cosine to 0.1x at step 20,
# clip at norm 1 (active: the norm stays above 1), weight decay 0.1, data seed 1337.
recipe=(--steps 20 --seed 1337 --lr 1e-3 --schedule cosine --warmup 2 --clip 1
        --weight-decay 0.1 --data corpus.txt)

compare() {  # compare NAME MODEL ZERODP_LAYOUT...: zerodp's 20 losses against the reference's
  local name=$1 model=$2
  shift 2
  rm -f m.jsonl
  if ! timeout 120 "$zerodp" train --model "$model" --size tiny --precision fp32 "${recipe[@]}" "$@" \
      --init-from "$model.safetensors" --metrics m.jsonl --no-progress >zerodp.out 2>&1; then
    echo "FAIL: $name: zerodp train exited $?:"; tail -5 zerodp.out; fail=1; return
  fi
  if ! timeout 120 "$torch_python" "$ref" train --model "$model" --size tiny "${recipe[@]}" "$@" \
      --init-from "$model.safetensors" --compare m.jsonl --tolerance "$tolerance" >ref.out 2>&1; then
    if ! grep -q '"max_rel_diff"' ref.out; then
      echo "FAIL: $name: llama_ref.py train failed:"; tail -5 ref.out; fail=1; return
    fi
  fi
  "$torch_python" - "$name" ref.out <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
for r in rows:
    if "step" in r:
        print(f"  {sys.argv[1]} step {r['step']:2d}: zerodp {r['zerodp_loss']:.9f}  "
              f"reference {r['loss']:.9f}  rel {r['rel_diff']:.2e}")
EOF
  local verdict
  verdict=$(grep '"max_rel_diff"' ref.out)
  local worst
  worst=$("$torch_python" -c 'import json,sys; print("%.3e" % json.loads(sys.argv[1])["max_rel_diff"])' "$verdict")
  if [[ $verdict == *'"ok": true'* ]]; then
    echo "ok: $name: 20 losses agree, largest relative difference $worst (tolerance $tolerance)"
  else
    echo "FAIL: $name: largest relative difference $worst is above $tolerance"; fail=1
  fi
}

# The target: one rank, stage 0.
compare "gpt tiny, 1 rank" gpt --ranks 1 --stage 0
# The same global batch split over 2 ranks x 2 micro-batches of 4 at stage 3: the reference
# takes the step's 16 samples in the sampler's order as one batch.
compare "gpt tiny, 2 ranks stage 3, accumulation 2" gpt --ranks 2 --stage 3 --micro-batch 4 --grad-accum 2

# The llama (issue 48): RMSNorm, rotary positions, SwiGLU and grouped-query attention from the
# equations, the blocked head's loss and gradients, the same AdamW.
compare "llama tiny, 1 rank" llama --ranks 1 --stage 0
compare "llama tiny, 2 ranks stage 3, accumulation 2" llama --ranks 2 --stage 3 --micro-batch 4 \
  --grad-accum 2

# Logits and greedy text from the same weights (std 0.3, norms jittered by 0.2, so that no two
# top logits tie within rounding): zerodp's fp32 logits against the reference's float64 copy
# err at most 2x the reference's own fp32 logits, on tiny and small; zerodp's greedy text
# without the cache (and with it) equals the reference's token for token, past the context.
printf 'In the beginning God created the' >prompt.txt  # 32 bytes: tiny's whole context
for size in tiny small; do
  "$torch_python" "$ref" init "l-$size.safetensors" --model llama --size "$size" --seed 3 \
    --std 0.3 --norm-jitter 0.2 >/dev/null || { echo "FAIL: init llama $size"; fail=1; continue; }
  if ! "$zerodp" sample "l-$size.safetensors" --prompt "$(cat prompt.txt)" --logits "z-$size.npy" \
      2>/dev/null ||
    ! "$torch_python" "$ref" logits "l-$size.safetensors" --text prompt.txt --out "r-$size" \
      >/dev/null; then
    echo "FAIL: llama $size: logits"; fail=1; continue
  fi
  "$torch_python" - "$size" <<'EOF' || fail=1
import sys
import numpy as np
size = sys.argv[1]
z = np.load(f"z-{size}.npy").astype(np.float64)
t = np.load(f"r-{size}.fp32.npy")[0].astype(np.float64)
d = np.load(f"r-{size}.fp64.npy")[0]
assert z.shape == d.shape, (z.shape, d.shape)
ez, et = np.abs(z - d).max(), np.abs(t - d).max()
verdict = "ok" if ez <= 2 * et else "FAIL"
print(f"{verdict}: llama {size} logits {z.shape}: largest error against float64 zerodp {ez:.3e}, "
      f"PyTorch fp32 {et:.3e} (ratio {ez / et:.2f}, at most 2)")
sys.exit(verdict != "ok")
EOF
  want=$("$torch_python" "$ref" greedy "l-$size.safetensors" --prompt "And God said" --max-tokens 80)
  for cache in --no-cache ""; do
    got=$("$zerodp" sample "l-$size.safetensors" --prompt "And God said" --temperature 0 \
      --max-tokens 80 $cache | od -An -v -tu1 | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
    if [[ -n $got && $got == "$want" ]]; then
      echo "ok: llama $size greedy ${cache:-with the cache}: 80 tokens equal the reference's"
    else
      echo "FAIL: llama $size greedy ${cache:-with the cache}: zerodp '$got', reference '$want'"
      fail=1
    fi
  done
done

# The Llama reference itself: HF names and shapes, and the module equal
# to naive float64 equations (GQA, rotate-half RoPE on zerodp's pinned tables, causal, RMSNorm).
if out=$(timeout 120 "$torch_python" "$ref" selfcheck 2>&1) && [[ $out == *'"ok": true'* ]]; then
  echo "ok: llama reference: $out"
else
  echo "FAIL: llama reference selfcheck: $out"; fail=1
fi

exit $fail
