#!/usr/bin/python3
"""A PyTorch 1.13 reference for zerodp's language models, written from the published
equations, and the step-by-step trainer that checks zerodp's training against it.

Models (--model):
  llama  Hugging Face's LlamaForCausalLM math written out (torch 1.13 has neither RMSNorm nor
         scaled_dot_product_attention). State-dict names, exactly (C embd, V vocab, F ffn,
         H heads, KV kv heads, hs = C / H, i = 0 .. layers - 1):
           model.embed_tokens.weight                      (V, C)
           model.layers.i.input_layernorm.weight          (C)
           model.layers.i.self_attn.q_proj.weight         (C, C)
           model.layers.i.self_attn.k_proj.weight         (KV*hs, C)
           model.layers.i.self_attn.v_proj.weight         (KV*hs, C)
           model.layers.i.self_attn.o_proj.weight         (C, C)
           model.layers.i.post_attention_layernorm.weight (C)
           model.layers.i.mlp.gate_proj.weight            (F, C)
           model.layers.i.mlp.up_proj.weight              (F, C)
           model.layers.i.mlp.down_proj.weight            (C, F)
           model.norm.weight                              (C)
           lm_head.weight                                 (V, C)   untied, no biases anywhere
         Block: x = x + attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)).
         RMSNorm: x * rsqrt(mean(x^2) + eps) * w, the statistics in fp32 (HF) or in float64
           for the float64 module; eps is zerodp's fp32 value (1e-5f) widened to double.
         RoPE, rotate-half (HF): q' = q cos + rotate_half(q) sin, rotate_half(x) =
           cat(-x[..., hs/2:], x[..., :hs/2]); cos and sin duplicated over the two halves.
           Tables pinned to zerodp's rope_table (src/nn/llama_layers.cc):
             inv_freq[i] = fp32(theta ** (-2i / hs))        float64 pow, rounded once
             angle[t, i] = fp32(t) * inv_freq[i]             ONE fp32 multiply
             cos, sin    = fp32(cos/sin(float64(angle)))     rounded once
           The float64 module uses the same fp32 tables widened to float64.
         Attention: GQA, kv head j shared by query heads j*H/KV .. (j+1)*H/KV - 1 (HF
           repeat_kv), scores * 1/sqrt(hs), causal, softmax over keys.
         MLP (SwiGLU): down(silu(gate(x)) * up(x)).
  gpt    zerodp's GPT (names as docs/interop.md, byte vocabulary, untied head): --gpt peer
         is the PyTorch peer's module (build_model of ../shared/peers/torch/train_ref.py;
         --peer-dir or $ZERODP_TORCH_PEER); --gpt own is build_gpt below, the same math
         (identical logits); --gpt auto (the default) takes the peer where it is found.
Loss: mean cross-entropy over all targets of the batch.

Subcommands:
  init    W.safetensors  random weights under the model's names (F32, seedable, with
                         __metadata__ giving the shape)
  logits  W --tokens F   logits of the fp32 module and of its .double() copy, written as .npy
                         (or raw little-endian), and the max abs error of fp32 vs float64
  greedy  W --prompt P   greedy decoding, full-window recompute (the last seq_len tokens),
                         prints the generated token ids
  train   [--init-from W] reproduces `zerodp train --precision fp32` step by step: the same
                         batches, loss, gradient clipping, AdamW and schedule (the conventions
                         are listed at train_main); prints one JSON line per step, or
                         --compare METRICS.jsonl to check zerodp's losses step by step
                         (exit 1 past --tolerance, default 1e-5 relative). Takes zerodp's
                         flags of the same names (--data --seed --steps --ranks --micro-batch
                         --grad-accum --lr --schedule --warmup --clip --weight-decay
                         --decay-all; --stage is accepted and ignored)
  selfcheck              the Llama module against naive float64 loops of the same equations,
                         and its state-dict names against the list above

Example (tests/cli/reference_steps_test.sh):
  llama_ref.py init w.safetensors --model gpt --size tiny --seed 7
  zerodp train --model gpt --size tiny --ranks 1 --precision fp32 --data corpus.txt \
      --steps 20 --init-from w.safetensors --metrics m.jsonl
  llama_ref.py train --model gpt --size tiny --data corpus.txt --steps 20 \
      --init-from w.safetensors --compare m.jsonl

Run with Debian's interpreter (/usr/bin/python3: PyTorch 1.13.1 CPU, numpy). Single-threaded
(torch.set_num_threads(1)) unless --threads; OPENBLAS_CORETYPE is left as the environment has it.
"""
import argparse
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MASK64 = (1 << 64) - 1

# zerodp's --size presets (src/models/gpt.cc, src/models/llama.cc; docs/llama.md), with the
# default micro-batch.
GPT_SIZES = {
    "tiny": dict(layers=2, heads=2, embd=32, seq_len=32, vocab=256, micro_batch=8),
    "small": dict(layers=4, heads=4, embd=128, seq_len=64, vocab=256, micro_batch=16),
    "medium": dict(layers=6, heads=6, embd=384, seq_len=128, vocab=256, micro_batch=8),
    "large": dict(layers=12, heads=12, embd=768, seq_len=1024, vocab=256, micro_batch=4),
}
LLAMA_SIZES = {
    "tiny": dict(layers=2, heads=2, kv_heads=1, embd=32, ffn=128, seq_len=32, vocab=256, micro_batch=8),
    "small": dict(layers=4, heads=4, kv_heads=2, embd=128, ffn=384, seq_len=64, vocab=256, micro_batch=16),
    "medium": dict(layers=6, heads=6, kv_heads=2, embd=384, ffn=1024, seq_len=128, vocab=256, micro_batch=8),
    "large": dict(layers=12, heads=12, kv_heads=4, embd=768, ffn=2048, seq_len=1024, vocab=256, micro_batch=4),
    "1.1b": dict(layers=22, heads=32, kv_heads=4, embd=2048, ffn=5632, seq_len=2048, vocab=32000, micro_batch=1),
}
LLAMA_DEFAULTS = dict(rope_theta=10000.0, norm_eps=1e-5)


def die(msg):
    sys.exit(f"llama_ref.py: {msg}")


def f32(x):
    """A Python float rounded to fp32 and back: what a C++ `float` field holds."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ------------------------------------------------------------------------------ safetensors

def read_safetensors(path):
    import torch

    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"{path}: {e.strerror}")
    if len(data) < 8:
        die(f"{path}: {len(data)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        die(f"{path}: header of {n} bytes runs past the file's {len(data)}")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + n:]
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in dtypes:
            die(f"{path}: tensor {name} is {info['dtype']}; want F32, F16, BF16 or F64")
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtypes[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).float()  # 16-bit values widen exactly
    return tensors, metadata


def write_safetensors(path, tensors, metadata, dtype="F32"):
    """tensors: list of (name, fp32 torch tensor) in file order; F32 (or, with dtype, BF16 or
    F16: the values rounded to nearest even), 8-aligned data."""
    import torch

    if dtype not in ("F32", "BF16", "F16"):
        raise ValueError(f"write_safetensors: dtype {dtype} is not F32, BF16 or F16")
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        t = t.detach().to("cpu").float().contiguous()
        if dtype == "F32":
            blob = t.numpy().astype("<f4").tobytes()
        else:  # numpy has no bfloat16: the 16-bit patterns through int16
            half = t.to(torch.bfloat16 if dtype == "BF16" else torch.float16)
            blob = half.view(torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ------------------------------------------------------------------------------ the Llama

def rope_tables(max_T, head_size, theta):
    """zerodp's rope_table, bit for bit: (cos, sin), each a (max_T, head_size / 2) fp32 numpy
    array (see the module docstring for the three roundings). Python's float pow, cos and sin
    are the C library's (glibc here, as zerodp's std::pow/cos/sin): numpy's own SIMD cos/sin
    are not used, since they need not be the same functions."""
    import numpy as np

    if head_size % 2 != 0:
        die(f"head size {head_size} is not even; rotary embedding pairs a head's two halves")
    half = head_size // 2
    theta = f32(theta)  # LlamaConfig::rope_theta is a float
    inv_freq = [f32(theta ** (-2.0 * i / head_size)) for i in range(half)]
    cos = np.empty((max_T, half), dtype=np.float32)
    sin = np.empty((max_T, half), dtype=np.float32)
    for t in range(max_T):
        for i, f in enumerate(inv_freq):
            # fp32(t) * inv_freq: the product of two fp32 values is exact in double, so one
            # rounding to fp32 is the fp32 multiply.
            angle = f32(f32(float(t)) * f)
            cos[t, i] = f32(math.cos(angle))
            sin[t, i] = f32(math.sin(angle))
    return cos, sin


def build_llama(cfg):
    """An nn.Module whose state_dict holds exactly the HF names above; forward(idx) -> logits,
    forward(idx, targets) -> the mean cross-entropy (fp32) of those logits against targets.
    cfg: layers, heads, kv_heads, embd, ffn, seq_len, vocab, rope_theta, norm_eps."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, H, KV, C, FF, T, V = (cfg[k] for k in ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab"))
    if C % H != 0:
        die(f"embd {C} is not a multiple of heads {H}")
    if H % KV != 0:
        die(f"kv_heads {KV} does not divide heads {H}")
    hs = C // H
    n_rep = H // KV
    eps = f32(cfg["norm_eps"])  # LlamaConfig::norm_eps is a float, added in double
    cos_h, sin_h = rope_tables(T, hs, cfg["rope_theta"])
    # Duplicated over the two halves (HF's cat((freqs, freqs), -1)); plain attributes, not
    # buffers, so the state dict holds the weights alone.
    cos32 = torch.from_numpy(np.concatenate([cos_h, cos_h], axis=1))
    sin32 = torch.from_numpy(np.concatenate([sin_h, sin_h], axis=1))

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            # HF LlamaRMSNorm: statistics in fp32 (float64 in the float64 copy).
            dt = torch.float64 if x.dtype == torch.float64 else torch.float32
            h = x.to(dt)
            var = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(var + eps)
            return self.weight * h.to(x.dtype)

    def rotate_half(x):
        return torch.cat((-x[..., hs // 2:], x[..., :hs // 2]), dim=-1)

    def repeat_kv(x):  # (B, KV, T, hs) -> (B, H, T, hs); query head h reads kv head h // n_rep
        if n_rep == 1:
            return x
        B, _, Tq, _ = x.shape
        return x[:, :, None, :, :].expand(B, KV, n_rep, Tq, hs).reshape(B, H, Tq, hs)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(C, H * hs, bias=False)
            self.k_proj = nn.Linear(C, KV * hs, bias=False)
            self.v_proj = nn.Linear(C, KV * hs, bias=False)
            self.o_proj = nn.Linear(H * hs, C, bias=False)

        def forward(self, x):
            B, Tq, _ = x.shape
            q = self.q_proj(x).view(B, Tq, H, hs).transpose(1, 2)
            k = self.k_proj(x).view(B, Tq, KV, hs).transpose(1, 2)
            v = self.v_proj(x).view(B, Tq, KV, hs).transpose(1, 2)
            cos = cos32[:Tq].to(x.dtype)
            sin = sin32[:Tq].to(x.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k, v = repeat_kv(k), repeat_kv(v)
            att = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(hs))
            mask = torch.ones(Tq, Tq, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, Tq, C)
            return self.o_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(C, FF, bias=False)
            self.up_proj = nn.Linear(C, FF, bias=False)
            self.down_proj = nn.Linear(FF, C, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, C)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.norm = RMSNorm()

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Body()
            self.lm_head = nn.Linear(C, V, bias=False)

        def forward(self, idx, targets=None):
            if idx.shape[1] > T:
                die(f"{idx.shape[1]} positions are past the rotary table's seq_len {T}")
            x = self.model.embed_tokens(idx)
            for layer in self.model.layers:
                x = layer(x)
            logits = self.lm_head(self.model.norm(x))
            if targets is None:
                return logits
            # With targets: the mean cross-entropy, in fp32 under autocast too (the PyTorch
            # peer's convention, for llama_peer.py's data-parallel training).
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

    return LlamaForCausalLM()


def llama_names(L):
    names = ["model.embed_tokens.weight"]
    for i in range(L):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight"] + [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [p + "post_attention_layernorm.weight"] + [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    return names + ["model.norm.weight", "lm_head.weight"]


# ------------------------------------------------------------------------------ the GPT

def build_gpt(cfg):
    """zerodp's GPT written out (the same math as the peer's build_model, for when the peer
    is not beside the checkout): docs/interop.md's names; pre-LN blocks, LayerNorm eps 1e-5,
    fused c_attn (q, k, v), causal attention scaled by 1/sqrt(C/H), exact-erf GELU MLP of 4C,
    final LayerNorm, untied head without bias; nanoGPT init (N(0, 0.02), c_proj weights
    N(0, 0.02/sqrt(2 layers)), zero biases, LayerNorm (1, 0))."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, H, C, T, V = (cfg[k] for k in ("layers", "heads", "embd", "seq_len", "vocab"))
    hs = C // H

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            B, Tq, _ = x.shape
            q, k, v = (t.view(B, Tq, H, hs).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(torch.ones(Tq, Tq, dtype=torch.bool).triu(1), float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, Tq, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = Attn()
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif ".ln_" in name or name.startswith("ln_"):
                    nn.init.ones_(p)
                elif name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                else:
                    nn.init.normal_(p, 0.0, 0.02)

    return GPT()


def build_gpt_module(a, cfg):
    """The peer's module (--gpt peer, the default where it is found) or build_gpt (--gpt own)."""
    choice = getattr(a, "gpt", "auto")
    if choice in ("auto", "peer"):
        d = a.peer_dir or os.environ.get("ZERODP_TORCH_PEER") or os.path.join(REPO, "..", "shared", "peers", "torch")
        if os.path.isfile(os.path.join(d, "train_ref.py")):
            sys.path.insert(0, d)
            from train_ref import build_model

            module, _ = build_model(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["embd"], cfg["seq_len"])
            return module
        if choice == "peer":
            die(f"no PyTorch peer (train_ref.py) in {d}; give --peer-dir, set ZERODP_TORCH_PEER or use --gpt own")
    return build_gpt(cfg)


def gpt_forward(m, idx):
    import torch

    T = idx.shape[1]
    x = m.wte(idx) + m.wpe(torch.arange(T, dtype=torch.long))
    for blk in m.h:
        x = blk(x)
    return m.lm_head(m.ln_f(x))


# ------------------------------------------------------------------------------ shapes

def model_config(a, tensors=None, metadata=None):
    """The shape from, in order of precedence: flags, the file's __metadata__, the tensors,
    the --size preset."""
    metadata = metadata or {}
    sizes = LLAMA_SIZES if a.model == "llama" else GPT_SIZES
    if (a.size or "tiny") not in sizes:
        die(f"--size {a.size} is not a {a.model} preset: {', '.join(sizes)}")
    cfg = dict(sizes[a.size or "tiny"])
    if a.model == "llama":
        cfg.update(LLAMA_DEFAULTS)
    if tensors is not None:
        if a.model == "llama":
            if "model.embed_tokens.weight" not in tensors:
                die("the file holds no model.embed_tokens.weight: not a llama (try --model gpt)")
            cfg["vocab"], cfg["embd"] = tensors["model.embed_tokens.weight"].shape
            cfg["layers"] = len({k.split(".")[2] for k in tensors if k.startswith("model.layers.")})
            cfg["ffn"] = tensors["model.layers.0.mlp.gate_proj.weight"].shape[0]
        else:
            if "wte.weight" not in tensors:
                die("the file holds no wte.weight: not a gpt (try --model llama)")
            cfg["vocab"], cfg["embd"] = tensors["wte.weight"].shape
            cfg["seq_len"] = tensors["wpe.weight"].shape[0]
            cfg["layers"] = len({k.split(".")[1] for k in tensors if k.startswith("h.")})
    for key in ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab"):
        if key in metadata and key in cfg:
            cfg[key] = int(metadata[key])
    for key in ("rope_theta", "norm_eps"):
        if key in metadata and key in cfg:
            cfg[key] = float(metadata[key])
    for key in ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab", "rope_theta", "norm_eps"):
        v = getattr(a, key, None)
        if v is not None and key in cfg:
            cfg[key] = v
    if a.model == "llama" and tensors is not None and "heads" not in metadata and a.heads is None and a.size is None:
        die("the file has no metadata naming the head count; give --heads (and --size or the shape flags)")
    if a.model == "llama" and tensors is not None:
        hs = cfg["embd"] // cfg["heads"]
        cfg["kv_heads"] = tensors["model.layers.0.self_attn.k_proj.weight"].shape[0] // hs
    return cfg


def make_module(a, cfg):
    if a.model == "llama":
        m = build_llama(cfg)
        return m, (lambda mod, idx: mod(idx))
    return build_gpt_module(a, cfg), gpt_forward


def metadata_of(a, cfg):
    keys = ["layers", "heads", "embd", "seq_len", "vocab"]
    if a.model == "llama":
        keys = ["layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab", "rope_theta", "norm_eps"]
    meta = {"format": "zerodp-export-1", "model": a.model}
    meta.update({k: cfg[k] for k in keys})
    if a.model == "llama":
        # As zerodp export writes them, so `zerodp sample` reads this file: the rotary base a
        # whole number, RMSNorm's eps as its fp32 bits.
        meta["rope_theta"] = int(cfg["rope_theta"])
        meta["norm_eps_fp32_bits"] = struct.unpack("<I", struct.pack("<f", cfg["norm_eps"]))[0]
    return meta


def load_model(a, path):
    """(fp32 module, forward, cfg) with the file's weights, strict names and shapes."""
    tensors, metadata = read_safetensors(path)
    if a.model is None:  # from the names: HF's llama or zerodp's gpt
        a.model = "llama" if "model.embed_tokens.weight" in tensors else "gpt" if "wte.weight" in tensors else None
        if a.model is None:
            die(f"{path} holds neither model.embed_tokens.weight (llama) nor wte.weight (gpt)")
    cfg = model_config(a, tensors, metadata)
    module, fwd = make_module(a, cfg)
    want = module.state_dict()
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        die(f"{path} does not fit {a.model} {cfg}: missing {missing[:5]}, extra {extra[:5]}")
    for k, t in want.items():
        if tuple(tensors[k].shape) != tuple(t.shape):
            die(f"{path}: tensor {k} is {list(tensors[k].shape)}, the model's is {list(t.shape)}")
    module.load_state_dict(tensors, strict=True)
    return module, fwd, cfg


# ------------------------------------------------------------------------------ init

def initialized_module(a, cfg):
    """The module with seeded random weights (torch.manual_seed(--seed)): the llama as HF's
    _init_weights (Linear and Embedding N(0, --std), RMSNorm weights 1), the gpt as nanoGPT's
    (build_gpt or the peer); --norm-jitter adds N(0, j^2) to norm weights (and gpt biases)."""
    import torch

    std = getattr(a, "std", 0.02)
    jitter = getattr(a, "norm_jitter", 0.0)
    std_scale = getattr(a, "std_scale", 1.0)
    torch.manual_seed(a.seed)
    module, fwd = make_module(a, cfg)
    with torch.no_grad():
        if a.model == "llama":
            for name, p in module.named_parameters():
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                    if jitter > 0:
                        p.add_(torch.randn_like(p) * jitter)
                else:
                    p.normal_(0.0, std)
        else:
            for name, p in module.named_parameters():
                is_ln = ".ln_" in name or name.startswith("ln_")
                if jitter > 0 and ((is_ln and name.endswith("weight")) or name.endswith("bias")):
                    p.add_(torch.randn_like(p) * jitter)
                elif std_scale != 1.0 and p.dim() >= 2:
                    p.mul_(std_scale)
    return module, fwd


def init_main(a):
    cfg = model_config(a)
    module, _ = initialized_module(a, cfg)
    sd = module.state_dict()
    order = llama_names(cfg["layers"]) if a.model == "llama" else list(sd)
    write_safetensors(a.out, [(k, sd[k]) for k in order], metadata_of(a, cfg))
    n = sum(t.numel() for t in sd.values())
    print(json.dumps({"wrote": a.out, "model": a.model, "params": n, "config": cfg}))


# ------------------------------------------------------------------------------ logits

def read_tokens(a):
    import numpy as np

    if a.text is not None:
        with open(a.text, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)[None, :]
    if a.tokens.endswith(".npy"):
        t = np.load(a.tokens).astype(np.int64)
    else:
        with open(a.tokens) as f:
            rows = [[int(v) for v in line.replace(",", " ").split()] for line in f if line.strip()]
        if len({len(r) for r in rows}) != 1:
            die(f"{a.tokens}: rows of different lengths")
        t = np.array(rows, dtype=np.int64)
    return t if t.ndim == 2 else t[None, :]


def logits_main(a):
    import numpy as np
    import torch

    module, fwd, cfg = load_model(a, a.weights)
    if (a.text is None) == (a.tokens is None):
        die("give exactly one of --tokens FILE (.npy, or whitespace/comma separated ids, a row a line) or --text FILE (bytes)")
    idx = read_tokens(a)
    if a.max_positions:
        idx = idx[:, :a.max_positions]
    if idx.shape[1] > cfg["seq_len"]:
        idx = idx[:, :cfg["seq_len"]]
    if idx.min() < 0 or idx.max() >= cfg["vocab"]:
        die(f"token ids must be in 0..{cfg['vocab'] - 1}")
    l32, l64 = fp32_fp64_logits(module, fwd, torch.from_numpy(idx))
    prefix = a.out
    if a.format == "npy":
        files = [prefix + ".fp32.npy", prefix + ".fp64.npy"]
        np.save(files[0], l32)
        np.save(files[1], l64)
    else:  # raw little-endian, shape in the report line
        files = [prefix + ".fp32.f32", prefix + ".fp64.f64"]
        l32.astype("<f4").tofile(files[0])
        l64.astype("<f8").tofile(files[1])
    print(json.dumps(logits_report(a.model, l32, l64, files)))


def fp32_fp64_logits(module, fwd, x):
    """(fp32 logits, float64 logits) as numpy arrays of the fp32 module and of its float64
    copy (the module itself is left in float64: .double() is in place)."""
    import torch

    with torch.no_grad():
        l32 = fwd(module, x).float().numpy()
        l64 = fwd(module.double(), x).numpy()
    return l32, l64


def logits_report(model, l32, l64, files):
    """The logits subcommand's JSON line: the max abs (and relative) error of fp32 vs float64."""
    import numpy as np

    err = np.abs(l32.astype(np.float64) - l64)
    return {"model": model, "shape": list(l32.shape), "files": files,
            "max_abs_err_fp32_vs_fp64": float(err.max()),
            "max_abs_logit_fp64": float(np.abs(l64).max()),
            "max_rel_err_fp32_vs_fp64": float(err.max() / max(np.abs(l64).max(), 1e-30))}


# ------------------------------------------------------------------------------ greedy

def greedy_main(a):
    import torch

    module, fwd, cfg = load_model(a, a.weights)
    if a.prompt_ids is not None:
        ids = [int(v) for v in a.prompt_ids.replace(",", " ").split()]
    else:
        ids = list(a.prompt.encode("utf-8"))
    if not ids:
        die("the prompt is empty")
    if a.float64:
        module = module.double()
    out = greedy_decode(module, fwd, cfg["seq_len"], ids, a.max_tokens)
    print(" ".join(str(t) for t in out))


def greedy_decode(module, fwd, seq_len, ids, max_tokens):
    """The max_tokens ids greedy decoding appends to the prompt ids, each from a full-window
    recompute over the last seq_len ids."""
    import torch

    ids, out = list(ids), []
    with torch.no_grad():
        for _ in range(max_tokens):
            window = ids[-seq_len:]  # full-window recompute, sliding past seq_len
            logits = fwd(module, torch.tensor([window], dtype=torch.long))[0, -1]
            nxt = int(torch.argmax(logits).item())  # ties: torch returns the first maximum
            ids.append(nxt)
            out.append(nxt)
    return out


# ------------------------------------------------------------------------------ selfcheck

def naive_llama_logits(sd, cfg, idx):
    """The Llama equations again, independently of build_llama: numpy float64, explicit loops
    over heads and positions, the rotation written per pair (i, i + hs/2), each query head
    reading kv head h // (H / KV), causal softmax by hand. idx: (B, T) ints."""
    import numpy as np

    W = {k: v.double().numpy() for k, v in sd.items()}
    H, KV, C = cfg["heads"], cfg["kv_heads"], cfg["embd"]
    hs, half = C // H, C // H // 2
    eps = f32(cfg["norm_eps"])
    cos, sin = (t.astype(np.float64) for t in rope_tables(idx.shape[1], hs, cfg["rope_theta"]))

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rot(x, t):  # x: (hs,) at position t
        y = np.empty_like(x)
        for i in range(half):
            y[i] = x[i] * cos[t, i] - x[i + half] * sin[t, i]
            y[i + half] = x[i + half] * cos[t, i] + x[i] * sin[t, i]
        return y

    out = []
    for row in idx:
        T = len(row)
        x = W["model.embed_tokens.weight"][row]  # (T, C)
        for l in range(cfg["layers"]):
            p = f"model.layers.{l}."
            h = rms(x, W[p + "input_layernorm.weight"])
            q = h @ W[p + "self_attn.q_proj.weight"].T
            k = h @ W[p + "self_attn.k_proj.weight"].T
            v = h @ W[p + "self_attn.v_proj.weight"].T
            y = np.zeros((T, C))
            for head in range(H):
                kvh = head // (H // KV)
                qs = np.stack([rot(q[t, head * hs:(head + 1) * hs], t) for t in range(T)])
                ks = np.stack([rot(k[t, kvh * hs:(kvh + 1) * hs], t) for t in range(T)])
                vs = v[:, kvh * hs:(kvh + 1) * hs]
                for t in range(T):
                    sc = np.array([qs[t] @ ks[u] / math.sqrt(hs) for u in range(t + 1)])
                    e = np.exp(sc - sc.max())
                    y[t, head * hs:(head + 1) * hs] = (e / e.sum()) @ vs[:t + 1]
            x = x + y @ W[p + "self_attn.o_proj.weight"].T
            h = rms(x, W[p + "post_attention_layernorm.weight"])
            g = h @ W[p + "mlp.gate_proj.weight"].T
            u = h @ W[p + "mlp.up_proj.weight"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
        out.append(rms(x, W["model.norm.weight"]) @ W["lm_head.weight"].T)
    return np.stack(out)


def selfcheck_main(a):
    """The module against the naive equations, its names against the list, and fp32 against
    float64, on a random GQA Llama with non-trivial norm weights."""
    import numpy as np
    import torch

    torch.manual_seed(a.seed)
    cfg = dict(layers=2, heads=4, kv_heads=2, embd=32, ffn=96, seq_len=24, vocab=64, **LLAMA_DEFAULTS)
    m = build_llama(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    names = list(m.state_dict())
    shapes_ok = all(tuple(m.state_dict()[n].shape) == s for n, s in [
        ("model.embed_tokens.weight", (64, 32)), ("model.layers.0.self_attn.q_proj.weight", (32, 32)),
        ("model.layers.0.self_attn.k_proj.weight", (16, 32)), ("model.layers.0.self_attn.v_proj.weight", (16, 32)),
        ("model.layers.0.self_attn.o_proj.weight", (32, 32)), ("model.layers.0.mlp.gate_proj.weight", (96, 32)),
        ("model.layers.0.mlp.up_proj.weight", (96, 32)), ("model.layers.0.mlp.down_proj.weight", (32, 96)),
        ("model.norm.weight", (32,)), ("lm_head.weight", (64, 32))])
    idx = torch.randint(0, 64, (2, 24))
    with torch.no_grad():
        l32 = m(idx).double().numpy()
        l64 = m.double()(idx).numpy()
    ref = naive_llama_logits(m.state_dict(), cfg, idx.numpy())
    scale = float(np.abs(ref).max())
    res = {"names_exact": names == llama_names(2), "shapes_ok": shapes_ok,
           "max_abs_logit": scale,
           "module_fp64_vs_naive_fp64": float(np.abs(l64 - ref).max()),
           "module_fp32_vs_naive_fp64": float(np.abs(l32 - ref).max())}
    res["ok"] = bool(res["names_exact"] and shapes_ok and res["module_fp64_vs_naive_fp64"] < 1e-9 * max(scale, 1)
                     and res["module_fp32_vs_naive_fp64"] < 1e-4 * max(scale, 1))
    print(json.dumps(res))
    return 0 if res["ok"] else 1


# ------------------------------------------------------------------------------ data

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


STREAM_EPOCH_SHUFFLE = 0x53485546464C4531  # "SHUFFLE1" (src/data/random.h)
STREAM_SYNTHETIC_TEXT = 0x53594E5454585431


def derive_key(seed, stream, counter):
    return mix64(mix64(mix64(seed & MASK64) ^ stream) ^ counter)


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        return mix64(self.state)

    def below(self, bound):
        reject_below = ((1 << 64) - bound) % bound  # 2^64 mod bound
        r = self.next()
        while r < reject_below:
            r = self.next()
        return r % bound


def epoch_order(size, seed, epoch):
    """src/data/sampler.cc epoch_order: Fisher-Yates from the back."""
    order = list(range(size))
    rng = SplitMix64(derive_key(seed, STREAM_EPOCH_SHUFFLE, epoch))
    for i in range(size, 1, -1):
        j = rng.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def synthetic_text(seed, size_bytes=1 << 20, period=64):
    alphabet = list(range(ord("!"), ord("~") + 1))
    rng = SplitMix64(derive_key(seed, STREAM_SYNTHETIC_TEXT, 0))
    for i in range(len(alphabet) - 1, 0, -1):
        j = rng.below(i + 1)
        alphabet[i], alphabet[j] = alphabet[j], alphabet[i]
    cycle = bytes(alphabet[:period])
    return (cycle * (size_bytes // period + 1))[:size_bytes]


def load_corpus(a):
    if a.data == "synthetic":
        return synthetic_text(a.seed)
    if a.data == "kjv":
        cache = a.cache_dir
        if cache is None:
            xdg = os.environ.get("XDG_CACHE_HOME", "")
            cache = os.path.join(xdg, "zerodp") if xdg.startswith("/") else os.path.join(os.environ.get("HOME", ""), ".cache", "zerodp")
        path = os.path.join(cache, "kjv-cd45f0c9cedab8e4.txt")
        if not os.path.isfile(path):
            die(f"no KJV cache at {path}: run zerodp train --data kjv once to prepare it, or give --cache-dir")
    else:
        path = a.data
    with open(path, "rb") as f:
        data = f.read()
    if a.data == "kjv":
        import hashlib

        if hashlib.sha256(data).hexdigest() != "cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47229d":
            die(f"{path} is not the pinned KJV text")
    return data


class Batches:
    """zerodp's text data and DistributedSampler for one optimizer step's whole global batch:
    the training part is all but the last floor(size * 0.02) bytes; sample i is the window of
    T + 1 bytes at i * T (inputs its first T, targets its last T); (size - 1) // T samples;
    each epoch visits them in epoch_order(S, seed, epoch); an optimizer step takes the next
    K = ranks * micro_batch * grad_accum positions of it (the epoch's S mod K tail dropped)."""

    def __init__(self, data, seq_len, seed, samples_per_step, validation_fraction=0.02):
        val_bytes = math.floor(float(len(data)) * validation_fraction)
        self.text = data[:len(data) - val_bytes]
        self.T = seq_len
        self.S = (len(self.text) - 1) // seq_len
        self.seed = seed
        self.K = samples_per_step
        if self.K > self.S:
            die(f"one step needs {self.K} samples, the training part has {self.S}")
        self.steps_per_epoch = self.S // self.K
        self._epoch, self._order = None, None

    def indices(self, step0):
        epoch, s = divmod(step0, self.steps_per_epoch)
        if self._epoch != epoch:
            self._epoch, self._order = epoch, epoch_order(self.S, self.seed, epoch)
        return self._order[s * self.K:(s + 1) * self.K]

    def batch(self, step0):
        import numpy as np
        import torch

        idx = self.indices(step0)
        T = self.T
        rows = np.stack([np.frombuffer(self.text, dtype=np.uint8, count=T + 1, offset=i * T) for i in idx])
        rows = torch.from_numpy(rows.astype(np.int64))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), idx


# ------------------------------------------------------------------------------ train

def lr_at(step0, a, warmup):
    """zerodp's LrSchedule (src/optim/lr_schedule.cc) at 0-based step step0; --lr is a float
    field (fp32), min_lr = fp32(fp32(lr) * fp32(0.1)), both widened to double."""
    max_lr = f32(a.lr)
    min_lr = f32(max_lr * f32(0.1))
    if step0 < warmup:
        return max_lr * ((step0 + 1) / warmup)
    if a.schedule == "constant":
        return max_lr
    if step0 >= a.steps:
        return min_lr
    ratio = (step0 - warmup) / (a.steps - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return max_lr - (1.0 - coeff) * (max_lr - min_lr)


def fma32_emul(a, b, c):
    """fp32 fma(a, b, c) through float64: a*b of two fp32 values is exact in float64; the sum
    rounds to float64 then fp32 (a double rounding that can differ from a true fma by an ulp in
    rare ties, far below what a loss comparison sees)."""
    return (a.double() * b.double() + c.double()).float()


def adamw_step(params, states, decays, lr, wd, t, coef, dtype):
    """zerodp's adamw_element (src/optim/adamw_kernel.h), per element, each op rounded once in
    `dtype` (fp32 to match zerodp; float64 for the float64 reference):
      g = grad * coef;  p = p * fp32(1 - lr*wd) (decaying tensors only)
      m = fma(fp32(1 - b1), g, m * fp32(b1));  v = fma(fp32(1 - b2) * g, g, v * fp32(b2))
      p = p + (fp32(-(lr / (1 - b1^t))) * m) / (sqrt(v) / fp32(sqrt(1 - b2^t)) + fp32(eps))"""
    import torch

    b1, b2, eps = 0.9, 0.95, 1e-8

    def s(x):
        return torch.tensor(x, dtype=dtype)

    bias1 = 1.0 - b1 ** float(t)
    bias2 = 1.0 - b2 ** float(t)
    k_decay = s(1.0 - lr * wd)
    k_b1, k_c1, k_b2, k_c2 = s(b1), s(1.0 - b1), s(b2), s(1.0 - b2)
    k_s2, k_alpha, k_eps = s(math.sqrt(bias2)), s(-(lr / bias1)), s(eps)
    with torch.no_grad():
        for p, st, decay in zip(params, states, decays):
            g = p.grad * s(coef)
            decayed = p * k_decay if decay else p.clone()
            if dtype == torch.float32:
                m = fma32_emul(k_c1.expand_as(g), g, st["m"] * k_b1)
                v = fma32_emul(k_c2 * g, g, st["v"] * k_b2)
            else:
                m = k_c1 * g + st["m"] * k_b1
                v = k_c2 * g * g + st["v"] * k_b2
            denom = torch.sqrt(v) / k_s2 + k_eps
            p.copy_(decayed + (k_alpha * m) / denom)
            st["m"], st["v"] = m, v


def preset_micro_batch(a, cfg):
    """zerodp's default micro-batch: the --size preset's; without --size, the preset whose
    shape the weights have (zerodp train --init-from needs --size or the shape flags too)."""
    sizes = LLAMA_SIZES if a.model == "llama" else GPT_SIZES
    if a.size is not None:
        return sizes[a.size]["micro_batch"]
    keys = [k for k in ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab") if k in cfg]
    for name, preset in sizes.items():
        if all(preset[k] == cfg[k] for k in keys):
            return preset["micro_batch"]
    die("the weights' shape is no --size preset's: give --micro-batch (zerodp's, or the preset's)")


def train_main(a):
    """Conventions matched to `zerodp train --precision fp32` (one rank, or the same global
    batch on any ranks):
      data     the training part of the text, windows, sampler: class Batches
      loss     mean cross-entropy over the step's global batch (zerodp averages the equal-sized
               micro-batches' mean losses: the same value up to rounding)
      clip     grad_norm = sqrt(sum of squares in double of the fp32 gradients);
               coef = fp32(min(1, clip / (grad_norm + 1e-6))), 1 with --clip 0; g = grad * coef
      AdamW    adamw_step above; betas (0.9, 0.95), eps 1e-8 (zerodp's AdamWConfig defaults);
               lr and weight decay are fp32 fields widened to double; the decay factor
               fp32(1 - lr * wd) applies to tensors of 2+ dims (embeddings, Linear weights,
               head) and not to norm weights and biases (TensorSpec weight_decay), unless
               --decay-all; Adam's step counter t is 1-based
      schedule lr_at above at the 0-based step (zerodp's step s uses lr_at(s - 1));
               --warmup auto = steps / 20 with cosine, 0 with constant
      order    loss at the weights before the step's update (zerodp's metrics `loss`)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    dtype = torch.float64 if a.dtype == "float64" else torch.float32
    if a.init_from:
        module, fwd, cfg = load_model(a, a.init_from)
    else:
        cfg = model_config(a)
        module, fwd = initialized_module(a, cfg)  # seeded by --seed, as zerodp's init is
    if dtype == torch.float64:
        module = module.double()
    micro_batch = a.micro_batch or preset_micro_batch(a, cfg)
    seq_len = a.data_seq_len or cfg["seq_len"]
    K = a.ranks * micro_batch * a.grad_accum
    batches = Batches(load_corpus(a), seq_len, a.seed, K)
    warmup = a.warmup
    if warmup == "auto":
        warmup = a.steps // 20 if a.schedule == "cosine" else 0
    warmup = int(warmup)
    wd = f32(a.weight_decay)
    clip = f32(a.clip)

    named = list(module.named_parameters())
    params = [p for _, p in named]
    decays = [a.decay_all or p.dim() >= 2 for p in params]
    states = [{"m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in params]
    compare = None
    if a.compare:
        with open(a.compare) as f:
            compare = {int(r["step"]): r for r in (json.loads(line) for line in f if line.strip())}
    worst = 0.0
    out_rows = []
    for step in range(1, a.steps + 1):
        x, y, idx = batches.batch(step - 1)
        lr = lr_at(step - 1, a, warmup)
        for p in params:
            p.grad = None
        logits = fwd(module, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        sq = sum(float(p.grad.double().pow(2).sum()) for p in params)
        norm = math.sqrt(sq)
        coef = 1.0 if clip == 0 else f32(min(1.0, clip / (norm + 1e-6)))
        adamw_step(params, states, decays, lr, wd, step, coef, dtype)
        row = {"step": step, "loss": float(loss.item()), "grad_norm": norm, "lr": lr}
        if compare is not None:
            z = compare.get(step)
            if z is None:
                die(f"{a.compare} has no step {step}")
            rel = abs(z["loss"] - row["loss"]) / abs(row["loss"])
            worst = max(worst, rel)
            row.update({"zerodp_loss": z["loss"], "rel_diff": rel,
                        "zerodp_grad_norm": z.get("grad_norm"), "zerodp_lr": z.get("lr")})
        out_rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            for row in out_rows:
                f.write(json.dumps(row) + "\n")
    if compare is not None:
        ok = worst <= a.tolerance
        print(json.dumps({"steps": a.steps, "model": a.model, "max_rel_diff": worst,
                          "tolerance": a.tolerance, "ok": ok}), flush=True)
        return 0 if ok else 1
    return 0


# ------------------------------------------------------------------------------ CLI

def add_model_flags(p, with_size=True):
    p.add_argument("--model", choices=["llama", "gpt"], default=None,
                   help="default: a weights file's (from its names), else llama")
    if with_size:
        p.add_argument("--size", choices=sorted(set(GPT_SIZES) | set(LLAMA_SIZES)), default=None,
                       help="zerodp's --size preset (default tiny; a file's shape wins over it)")
    for key in ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab"):
        p.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=None)
    p.add_argument("--rope-theta", dest="rope_theta", type=float, default=None)
    p.add_argument("--norm-eps", dest="norm_eps", type=float, default=None)
    p.add_argument("--peer-dir", default=None, help="the folder of the PyTorch peer's train_ref.py (gpt)")
    p.add_argument("--gpt", choices=["auto", "peer", "own"], default="auto",
                   help="gpt module: the peer's build_model (auto: where found) or this file's build_gpt")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    pi = sub.add_parser("init", help="random weights as safetensors")
    pi.add_argument("out")
    add_model_flags(pi)
    pi.add_argument("--seed", type=int, default=1337)
    pi.add_argument("--std", type=float, default=0.02, help="llama: N(0, std) for Linear and Embedding (HF's initializer_range)")
    pi.add_argument("--std-scale", type=float, default=1.0, help="gpt: multiply the peer's init of 2-D weights")
    pi.add_argument("--norm-jitter", type=float, default=0.0,
                    help="add N(0, j^2) to norm weights (and gpt biases): non-trivial values for checks")

    pl = sub.add_parser("logits", help="fp32 and float64 logits of a token batch")
    pl.add_argument("weights")
    add_model_flags(pl)
    pl.add_argument("--tokens", default=None, help=".npy (T) or (B, T) ints, or text: ids separated by spaces/commas, a row a line")
    pl.add_argument("--text", default=None, help="a file whose bytes are the token ids (one row)")
    pl.add_argument("--max-positions", type=int, default=None)
    pl.add_argument("--out", default="logits", help="prefix: PREFIX.fp32.npy and PREFIX.fp64.npy")
    pl.add_argument("--format", choices=["npy", "raw"], default="npy",
                    help="raw: PREFIX.fp32.f32 and PREFIX.fp64.f64, little-endian, row-major (B, T, V)")

    pg = sub.add_parser("greedy", help="greedy decoding, full-window recompute")
    pg.add_argument("weights")
    add_model_flags(pg)
    pg.add_argument("--prompt", default="In the beginning", help="its UTF-8 bytes are the ids")
    pg.add_argument("--prompt-ids", default=None, help="ids separated by spaces or commas")
    pg.add_argument("--max-tokens", type=int, default=40)
    pg.add_argument("--float64", action="store_true", help="decode with the float64 copy")

    pt = sub.add_parser("train", help="zerodp's fp32 training, step by step")
    add_model_flags(pt)
    pt.add_argument("--init-from", default=None, help="safetensors weights (else the seeded init)")
    pt.add_argument("--data", default="synthetic", help="a text file PATH, kjv (zerodp's cache) or synthetic")
    pt.add_argument("--cache-dir", default=None)
    pt.add_argument("--data-seq-len", type=int, default=None, help="window length (default the model's seq_len)")
    pt.add_argument("--steps", type=int, default=20)
    pt.add_argument("--seed", type=int, default=1337, help="zerodp's --seed: the data order (and init without --init-from)")
    pt.add_argument("--ranks", type=int, default=1, help="zerodp's --ranks: the global batch is ranks x micro-batch x grad-accum")
    pt.add_argument("--stage", type=int, default=0, help="accepted and ignored: every ZeRO stage trains the same math")
    pt.add_argument("--micro-batch", type=int, default=None)
    pt.add_argument("--grad-accum", type=int, default=1)
    pt.add_argument("--lr", type=float, default=1e-3)
    pt.add_argument("--schedule", choices=["constant", "cosine"], default="cosine")
    pt.add_argument("--warmup", default="auto")
    pt.add_argument("--clip", type=float, default=1.0)
    pt.add_argument("--weight-decay", type=float, default=0.1)
    pt.add_argument("--decay-all", action="store_true")
    pt.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    pt.add_argument("--threads", type=int, default=1)
    pt.add_argument("--compare", default=None, help="zerodp's --metrics file: print both losses per step, exit 1 past --tolerance")
    pt.add_argument("--tolerance", type=float, default=1e-5, help="largest relative loss difference for --compare")
    pt.add_argument("--out", default=None, help="write the per-step JSON lines here")

    ps = sub.add_parser("selfcheck", help="the Llama module against naive float64 equations")
    ps.add_argument("--seed", type=int, default=1)

    a = p.parse_args(argv)
    if a.cmd in ("init", "train") and getattr(a, "init_from", None) is None:
        a.model = a.model or "llama"
    if a.cmd == "selfcheck":
        return selfcheck_main(a)
    if a.cmd == "init":
        return init_main(a)
    if a.cmd == "logits":
        return logits_main(a)
    if a.cmd == "greedy":
        return greedy_main(a)
    return train_main(a)


if __name__ == "__main__":
    sys.exit(main() or 0)
