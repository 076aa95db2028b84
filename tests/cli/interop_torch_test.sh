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

# The other way: the peer's freshly built GPT, its state_dict saved as safetensors under its
# own names, starts a zerodp run (--init-from); the step-0 checkpoint exports the same tensors.
if "$torch_python" - "$peer" "$tmp/torch.safetensors" <<'EOF'; then
import json, struct, sys
import torch
sys.path.insert(0, sys.argv[1])
from train_ref import build_model
torch.manual_seed(7)
model, _ = build_model(256, 2, 2, 32, 32)
header, body, off = {}, bytearray(), 0
for name, t in model.state_dict().items():
    data = struct.pack(f"<{t.numel()}f", *t.detach().float().flatten().tolist())
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
    body += data
    off += len(data)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-(8 + len(text)) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + body)
EOF
  if "$zerodp" train --size tiny --data synthetic --no-progress --ranks 2 --stage 3 --steps 0 \
      --init-from "$tmp/torch.safetensors" --checkpoint-dir "$tmp/from_torch" >"$tmp/out" 2>&1 &&
    "$zerodp" export "$tmp/from_torch" --out "$tmp/back.safetensors" --quiet &&
    "$torch_python" - "$tmp/torch.safetensors" "$tmp/back.safetensors" <<'EOF'; then
import json, struct, sys
def tensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    h = json.loads(blob[8:8 + n]); h.pop("__metadata__", None); data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
EOF
    echo "ok: a PyTorch state_dict starts a zerodp run (2 ranks, stage 3): the same tensors back"
  else
    echo "FAIL: a PyTorch state_dict through --init-from"; tail -3 "$tmp/out"; fail=1
  fi
else
  echo "FAIL: writing the peer's state_dict"; fail=1
fi
exit $fail
