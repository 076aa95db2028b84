#!/usr/bin/env bash
# The exported format means the same in PyTorch: the peer's GPT module (train_ref.py's
# build_model) loads the file with load_state_dict(strict=True) and its greedy text equals
# zerodp sample's, byte for byte. Skipped (77) without torch or the peer.
set -uo pipefail
zerodp=$1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
torch_python=/usr/bin/python3
peer=${ZERODP_TORCH_PEER:-$repo/../shared/peers/torch}
if ! "$torch_python" -c "import torch" 2>/dev/null; then
  echo "SKIP: $torch_python cannot import torch (apt-get install python3-torch)"
  exit 77
fi
if [[ ! -f $peer/train_ref.py ]]; then
  echo "SKIP: no PyTorch peer at $peer (set ZERODP_TORCH_PEER)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
"$torch_python" "$here/write_tiny_gpt.py" "$tmp/tiny.safetensors" || { echo "FAIL: writer"; exit 1; }

compare() {  # compare NAME ARGS...: zerodp sample and torch_sample.py with ARGS, same bytes
  local name=$1
  shift
  timeout 120 "$zerodp" sample "$tmp/tiny.safetensors" "$@" >"$tmp/zerodp.out" || {
    echo "FAIL: zerodp sample $* exited $?"
    fail=1
    return
  }
  timeout 300 "$torch_python" "$repo/scripts/torch_sample.py" "$tmp/tiny.safetensors" \
    --peer-dir "$peer" "$@" >"$tmp/torch.out" || {
    echo "FAIL: torch_sample.py $* exited $?"
    fail=1
    return
  }
  if cmp -s "$tmp/zerodp.out" "$tmp/torch.out" && [[ -s $tmp/zerodp.out ]]; then
    echo "ok: $name: $(wc -c <"$tmp/zerodp.out") identical bytes ($(od -An -c -N 16 "$tmp/zerodp.out" | tr -s ' ')...)"
  else
    echo "FAIL: $name differs"
    echo "  zerodp: $(od -An -tx1 "$tmp/zerodp.out" | tr -d '\n')"
    echo "  torch:  $(od -An -tx1 "$tmp/torch.out" | tr -d '\n')"
    fail=1
  fi
}
compare "greedy" --temperature 0 --max-tokens 40 --prompt "In the beginning"
# Past seq_len (32), so the window slides in both.
compare "greedy, 80 bytes" --temperature 0 --max-tokens 80 --prompt "And God said, Let there be light"
# The documented draw (splitmix64, softmax in double) reproduced in Python.
compare "sampled, seed 5, top-k 50" --temperature 1 --top-k 50 --seed 5 --max-tokens 40 \
  --prompt "In the beginning"
exit $fail
