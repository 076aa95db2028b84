#!/usr/bin/env bash
# zerodp export --format hf on a gpt and a llama trained 2 steps: config.json's fields are the
# checkpoint's model, the shards' index covers every tensor once with the right total_size,
# every file's __metadata__ says "format": "pt", the names and shapes are Hugging Face's
# (GPT-2's Conv1D transposed, (C, 3C) for c_attn) and the values the F32 export's (bf16:
# rounded to nearest even). A re-export replaces the earlier one; the refusals exit 2 naming
# the culprit; the default format is --format zerodp byte for byte; train --init-from reads the
# sharded directory back to the checkpoint's weights.
set -uo pipefail
zerodp=$1
python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

cat >"$tmp/check.py" <<'EOF'
# check.py KIND HF_DIR ZERODP_FILE META_JSON TORCH_DTYPE MIN_FILES
import json, os, re, struct, sys

kind, hf, zfile, meta_path, torch_dtype, min_files = sys.argv[1:]
meta = json.load(open(meta_path))
shape = meta["model"]
errors = []


def check(cond, what):
    if not cond:
        errors.append(what)


def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    md = header.pop("__metadata__", {})
    body = data[8 + n:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, md


config = json.load(open(os.path.join(hf, "config.json")))
C, V, T, L, H = (shape[k] for k in ("embd", "vocab", "seq_len", "layers", "heads"))
if kind == "gpt":
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": C,
            "n_layer": L, "n_head": H, "n_positions": T, "vocab_size": V,
            "tie_word_embeddings": False, "torch_dtype": torch_dtype}
else:
    want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": C,
            "num_hidden_layers": L, "num_attention_heads": H,
            "num_key_value_heads": shape["kv_heads"], "intermediate_size": shape["ffn"],
            "max_position_embeddings": T, "vocab_size": V, "tie_word_embeddings": False,
            "torch_dtype": torch_dtype}
for k, v in want.items():
    check(config.get(k) == v, f"config.json {k} = {config.get(k)!r}, want {v!r}")

# The weight files: one, or the index's shards.
index_path = os.path.join(hf, "model.safetensors.index.json")
if os.path.exists(index_path):
    index = json.load(open(index_path))
    weight_map = index["weight_map"]
    files = sorted(set(weight_map.values()))
    n = len(files)
    check(files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)],
          f"shard names {files}")
else:
    files, weight_map, index = ["model.safetensors"], None, None
check(len(files) >= int(min_files), f"{len(files)} weight files, want at least {min_files}")
check(sorted(os.listdir(hf)) == sorted(files + ["config.json"] +
                                       (["model.safetensors.index.json"] if index else [])),
      f"directory holds {sorted(os.listdir(hf))}")

tensors, total = {}, 0
for f in files:
    t, md = read(os.path.join(hf, f))
    check(md.get("format") == "pt", f"{f}: __metadata__ format {md.get('format')!r}")
    check(md.get("zerodp_format") == "zerodp-export-1", f"{f}: zerodp_format")
    check(md.get("model") == kind, f"{f}: model {md.get('model')!r}")
    check(md.get("step") == str(meta["step"]), f"{f}: step {md.get('step')!r}")
    check(md.get("layers") == str(L), f"{f}: layers {md.get('layers')!r}")
    for name, v in t.items():
        check(name not in tensors, f"{name} in two files")
        if weight_map is not None:
            check(weight_map.get(name) == f, f"index puts {name} in {weight_map.get(name)}, not {f}")
        total += len(v[2])
    tensors.update(t)
if index is not None:
    check(set(weight_map) == set(tensors), "weight_map's names are not the files' names")
    check(index["metadata"]["total_size"] == total,
          f"total_size {index['metadata']['total_size']}, tensors hold {total}")

# Names, shapes and values against zerodp's own F32 export.
ref, _ = read(zfile)
conv1d = re.compile(r"^h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
dtype = "BF16" if torch_dtype == "bfloat16" else "F32"
names = set()
for name, (_, zshape, zbytes) in ref.items():
    hname, transposed = name, False
    if kind == "gpt" and name != "lm_head.weight":
        hname, transposed = "transformer." + name, bool(conv1d.match(name))
    names.add(hname)
    if hname not in tensors:
        errors.append(f"{hname} missing")
        continue
    got_type, got_shape, got = tensors[hname]
    check(got_type == dtype, f"{hname} is {got_type}")
    vals = struct.unpack(f"<{len(zbytes) // 4}f", zbytes)
    if transposed:
        r, k = zshape
        check(got_shape == [k, r], f"{hname} shape {got_shape}, want {[k, r]}")
        vals = [vals[i * k + j] for j in range(k) for i in range(r)]
    else:
        check(got_shape == zshape, f"{hname} shape {got_shape}, want {zshape}")
    if dtype == "F32":
        check(got == struct.pack(f"<{len(vals)}f", *vals), f"{hname}: values differ")
    else:
        bits = struct.unpack(f"<{len(vals)}I", struct.pack(f"<{len(vals)}f", *vals))
        want16 = [((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF for b in bits]
        check(got == struct.pack(f"<{len(want16)}H", *want16), f"{hname}: not rounded to even")
check(names == set(tensors), f"extra tensors {sorted(set(tensors) - names)}")
if kind == "gpt":
    check(tensors["transformer.h.0.attn.c_attn.weight"][1] == [C, 3 * C], "c_attn is not (C, 3C)")
    check(tensors["transformer.h.0.mlp.c_fc.weight"][1] == [C, 4 * C], "c_fc is not (C, 4C)")
    check(tensors["transformer.wte.weight"][1] == [V, C], "wte is not (V, C)")
    check(tensors["lm_head.weight"][1] == [V, C], "lm_head is not (V, C)")
else:
    kv = shape["kv_heads"] * C // H
    check(tensors["model.embed_tokens.weight"][1] == [V, C], "embed_tokens is not (V, C)")
    check(tensors["model.layers.0.self_attn.k_proj.weight"][1] == [kv, C], "k_proj's shape")
    check(tensors["model.layers.0.mlp.gate_proj.weight"][1] == [shape["ffn"], C],
          "gate_proj's shape")
for e in errors[:20]:
    print(e)
sys.exit(1 if errors else 0)
EOF

# expect_refused WANT ARGS...: zerodp ARGS exits 2 with WANT in its one-line message.
expect_refused() {
  local want=$1
  shift
  "$zerodp" "$@" >"$tmp/refused.out" 2>"$tmp/refused.err"
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -qF -- "$want" "$tmp/refused.err"; then
    ok "refused: $*"
  else
    bad "zerodp $*: exit $rc, want 2 naming '$want': $(cat "$tmp/refused.err")"
  fi
}

for kind in gpt llama; do
  ck=$tmp/ck-$kind
  if ! timeout 120 "$zerodp" train --model "$kind" --size tiny --data synthetic --no-progress \
    --steps 2 --checkpoint-dir "$ck" >"$tmp/train-$kind.log" 2>&1; then
    bad "train --model $kind: $(tail -3 "$tmp/train-$kind.log")"
    continue
  fi
  meta=$ck/$(cat "$ck/latest")/meta.json
  "$zerodp" export "$ck" --out "$tmp/$kind.safetensors" --quiet || bad "export $kind"
  # 40KB: the embeddings alone are 32 KiB (V = 256, C = 32), so several shards.
  if "$zerodp" export "$ck" --format hf --out "$tmp/hf-$kind" --max-shard-size 40KB \
    2>"$tmp/export.err"; then
    if "$python" "$tmp/check.py" "$kind" "$tmp/hf-$kind" "$tmp/$kind.safetensors" "$meta" \
      float32 3; then
      ok "$kind: sharded F32 export: $(cat "$tmp/export.err")"
    else
      bad "$kind: sharded F32 export"
    fi
  else
    bad "$kind: export --format hf: $(cat "$tmp/export.err")"
  fi
  # Back in through train --init-from (the import): the same tensors, bit for bit.
  if timeout 120 "$zerodp" train --model "$kind" --size tiny --data synthetic --no-progress \
    --init-from "$tmp/hf-$kind" --steps 0 --checkpoint-dir "$tmp/rt-$kind" >"$tmp/rt.log" 2>&1 &&
    "$zerodp" export "$tmp/rt-$kind" --out "$tmp/rt-$kind.safetensors" --quiet &&
    "$python" - "$tmp/rt-$kind.safetensors" "$tmp/$kind.safetensors" <<'EOF'
import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__")
    return {k: (v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
EOF
  then
    ok "$kind: the sharded export read back by --init-from is the checkpoint's weights"
  else
    bad "$kind: --init-from the export: $(tail -3 "$tmp/rt.log")"
  fi
  if "$zerodp" export "$ck" --format hf --out "$tmp/hf16-$kind" --dtype bf16 --quiet &&
    "$python" "$tmp/check.py" "$kind" "$tmp/hf16-$kind" "$tmp/$kind.safetensors" "$meta" \
      bfloat16 1; then
    ok "$kind: one BF16 file, rounded to nearest even"
  else
    bad "$kind: --dtype bf16"
  fi
done

ck=$tmp/ck-gpt
# Into the sharded export's directory with the default 5GB: one file, the shards and index gone.
shard_files=("$tmp"/hf-gpt/model-*-of-*.safetensors)
shards=${#shard_files[@]}
if "$zerodp" export "$ck" --format hf --out "$tmp/hf-gpt" 2>"$tmp/again.err" &&
  "$python" "$tmp/check.py" gpt "$tmp/hf-gpt" "$tmp/gpt.safetensors" \
    "$ck/$(cat "$ck/latest")/meta.json" float32 1 &&
  grep -q "removed $((shards + 1)) files" "$tmp/again.err"; then
  ok "a re-export replaces the sharded one: $(tail -1 "$tmp/again.err")"
else
  bad "re-export into an earlier export: $(cat "$tmp/again.err"); $(ls "$tmp/hf-gpt")"
fi

# The default is --format zerodp, byte for byte (the step is the only metadata that varies).
"$zerodp" export "$ck" --format zerodp --out "$tmp/z.safetensors" --dtype f32 --quiet
if cmp -s "$tmp/z.safetensors" "$tmp/gpt.safetensors"; then
  ok "--format zerodp is the default's bytes"
else
  bad "--format zerodp differs from the default"
fi

mkdir "$tmp/mine"
echo "keep me" >"$tmp/mine/notes.txt"
expect_refused "notes.txt" export "$ck" --format hf --out "$tmp/mine"
[[ $(cat "$tmp/mine/notes.txt") == "keep me" && $(ls "$tmp/mine") == notes.txt ]] ||
  bad "a refused export touched the user's directory: $(ls "$tmp/mine")"
expect_refused "lies inside it" export "$ck" --format hf --out "$ck/$(cat "$ck/latest")/hf"
expect_refused "is the checkpoint directory" export "$ck" --format hf --out "$ck"
expect_refused "which its checkpoints own" export "$ck/$(cat "$ck/latest")" --format hf \
  --out "$ck/latest"
expect_refused "create it first" export "$ck" --format hf --out "$tmp/no/such/dir"
expect_refused "--max-shard-size" export "$ck" --out "$tmp/x.safetensors" --max-shard-size 1GB
expect_refused "--dtype bf16" export "$ck" --out "$tmp/x.safetensors" --dtype bf16
expect_refused "--format 'onnx'" export "$ck" --out "$tmp/x" --format onnx
expect_refused "12XB" export "$ck" --format hf --out "$tmp/x" --max-shard-size 12XB
expect_refused "f16" export "$ck" --format hf --out "$tmp/x" --dtype f16
[[ -e $tmp/x || -e $tmp/x.safetensors ]] && bad "a refused export left an output"
if timeout 120 "$zerodp" train --model mlp --data synthetic --no-progress --steps 1 \
  --checkpoint-dir "$tmp/ck-mlp" >"$tmp/train-mlp.log" 2>&1; then
  expect_refused "kind mlp, which has no Hugging Face layout (the kinds with one: gpt, llama)" \
    export "$tmp/ck-mlp" --format hf --out "$tmp/hf-mlp"
  [[ -e $tmp/hf-mlp ]] && bad "the refused mlp export created its directory"
else
  bad "train --model mlp: $(tail -3 "$tmp/train-mlp.log")"
fi

exit $fail
