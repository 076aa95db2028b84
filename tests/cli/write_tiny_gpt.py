#!/usr/bin/env python3
"""Writes a random-weight gpt in zerodp's export format (safetensors, F32, canonical names,
__metadata__ format=zerodp-export-1), with only the standard library, for the CLI tests.

The layout is make_gpt's (src/models/gpt.h): wte, wpe, then per block ln_1, attn.c_attn,
attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, then ln_f and lm_head (untied, no bias). Weights
are N(0, scale^2), LayerNorm weights 1 + N(0, 0.2^2): larger than the initial ones, so the
logits are spread and greedy text is not one repeated byte.

  write_tiny_gpt.py OUT [--layers 2 --heads 2 --embd 32 --seq-len 32 --vocab 256]
                        [--seed 1] [--scale 0.3] [--no-metadata]
                        [--wrong-shape TENSOR]  (that tensor gets a wrong shape, same bytes)
"""
import argparse
import json
import random
import struct
import sys


def gpt_tensors(layers, embd, seq_len, vocab):
    """(name, shape, is_layernorm_weight) in make_gpt's order."""
    C, V, T = embd, vocab, seq_len
    out = [("wte.weight", [V, C], False), ("wpe.weight", [T, C], False)]
    for i in range(layers):
        p = f"h.{i}."
        out += [
            (p + "ln_1.weight", [C], True),
            (p + "ln_1.bias", [C], False),
            (p + "attn.c_attn.weight", [3 * C, C], False),
            (p + "attn.c_attn.bias", [3 * C], False),
            (p + "attn.c_proj.weight", [C, C], False),
            (p + "attn.c_proj.bias", [C], False),
            (p + "ln_2.weight", [C], True),
            (p + "ln_2.bias", [C], False),
            (p + "mlp.c_fc.weight", [4 * C, C], False),
            (p + "mlp.c_fc.bias", [4 * C], False),
            (p + "mlp.c_proj.weight", [C, 4 * C], False),
            (p + "mlp.c_proj.bias", [C], False),
        ]
    out += [("ln_f.weight", [C], True), ("ln_f.bias", [C], False), ("lm_head.weight", [V, C], False)]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--embd", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scale", type=float, default=0.3)
    p.add_argument("--no-metadata", action="store_true", help="a file from elsewhere: no __metadata__")
    p.add_argument("--wrong-shape", default=None, metavar="TENSOR")
    a = p.parse_args()

    rng = random.Random(a.seed)
    header = {}
    blobs = []
    offset = 0
    tensors = gpt_tensors(a.layers, a.embd, a.seq_len, a.vocab)
    if a.wrong_shape is not None and a.wrong_shape not in {t[0] for t in tensors}:
        sys.exit(f"write_tiny_gpt.py: no tensor {a.wrong_shape}")
    for name, shape, is_ln_weight in tensors:
        n = numel(shape)
        values = [(1.0 + 0.2 * rng.gauss(0, 1)) if is_ln_weight else a.scale * rng.gauss(0, 1) for _ in range(n)]
        stored_shape = list(shape)
        if name == a.wrong_shape:
            # Same byte count, so only the shape check can catch it.
            stored_shape = list(reversed(shape)) if len(shape) == 2 and shape[0] != shape[1] else [n // 2, 2]
        blob = struct.pack(f"<{n}f", *values)
        header[name] = {"dtype": "F32", "shape": stored_shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if not a.no_metadata:
        header["__metadata__"] = {
            "format": "zerodp-export-1",
            "model": "gpt",
            "layers": str(a.layers),
            "heads": str(a.heads),
            "embd": str(a.embd),
            "seq_len": str(a.seq_len),
            "vocab": str(a.vocab),
        }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # the data section starts 8-aligned, as writers do
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main()
