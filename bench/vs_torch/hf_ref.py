#!/usr/bin/python3
"""Hugging Face's layout for llama_ref.py's two models, both ways: load_hf reads what
`save_pretrained` writes for GPT2LMHeadModel and LlamaForCausalLM (and what the Hub serves)
into llama_ref's modules, save_hf writes their state dicts in that layout. Written from the
published formats (no `transformers` here); the math is llama_ref.py's.

Format facts relied on:
  files      DIR/config.json and either DIR/model.safetensors, or the shards
             DIR/model-0000k-of-0000n.safetensors (5 digits, k from 1) with
             DIR/model.safetensors.index.json = {"metadata": {"total_size": N},
             "weight_map": {tensor name: shard file name}}, N the tensors' bytes. A single
             .safetensors file loads too, with the config.json beside it. save_hf shards only
             when --max-shard-size is given and exceeded: greedily in state-dict order, a new
             shard when the next tensor would pass the limit (a tensor above it alone).
  metadata   safetensors' __metadata__ is {"format": "pt"} (transformers refuses other
             formats, and takes a file without one as "pt"). A file whose format is
             zerodp-export-1 is zerodp's own layout (llama_ref's load_model), never HF's:
             its gpt names look like GPT-2's without the prefix but are NOT transposed.
  dtypes     F32, BF16, F16 (and F64) load, widened to fp32 exactly; save_hf writes F32, BF16
             or F16 (rounded to nearest even) with config.json's torch_dtype to match.
  llama      the names are llama_ref's (identity). Skipped on load: the rotary buffers
             model.layers.N.self_attn.rotary_emb.inv_freq (older transformers saved them);
             with tie_word_embeddings (default false) lm_head.weight := model.embed_tokens.weight.
             config.json: hidden_size, intermediate_size, num_hidden_layers,
             num_attention_heads, vocab_size required; num_key_value_heads (default heads),
             rms_norm_eps (default 1e-6; held as the fp32 value, as zerodp and llama_ref hold
             it), rope_theta (default 10000), max_position_embeddings (default 2048; the
             seq_len: the rotary table's length). Refused, naming the key: hidden_act other
             than silu, rope_scaling not null, attention_bias or mlp_bias true, head_dim other
             than hidden_size / num_attention_heads.
  gpt2       GPT2LMHeadModel names = llama_ref's gpt names under "transformer." (the Hub's
             gpt2 files have no prefix: both load), the head "lm_head.weight". GPT-2's Conv1D
             holds its weight (in, out), y = x @ W + b: h.N.attn.c_attn.weight (C, 3C),
             h.N.attn.c_proj.weight (C, C), h.N.mlp.c_fc.weight (C, 4C), h.N.mlp.c_proj.weight
             (4C, C) are the transposes of the nn.Linear (out, in) weights; biases, LayerNorms,
             wte, wpe and the head are as they are. Skipped on load: the attention masks
             h.N.attn.bias and h.N.attn.masked_bias (buffers, no parameters). With
             tie_word_embeddings (GPT-2's default: true) or no lm_head.weight in the files,
             lm_head.weight := wte.weight. config.json: n_embd, n_layer, n_head, n_positions
             (the seq_len), vocab_size required; activation_function must be "gelu" (exact
             erf; the default and the Hub's "gelu_new" is the tanh approximation, which
             neither this reference nor zerodp has), n_inner null or 4 n_embd,
             layer_norm_epsilon 1e-5, scale_attn_weights true, no
             scale_attn_by_inverse_layer_idx, no add_cross_attention.
  save       config.json as save_pretrained writes it (indent 2, sorted keys): architectures,
             model_type, the size fields, torch_dtype, tie_word_embeddings false (zerodp's
             heads are untied), gpt2: activation_function "gelu", n_inner null,
             layer_norm_epsilon 1e-5, dropouts 0.0, scale_attn_weights true; llama: hidden_act
             "silu", rms_norm_eps (the shortest decimal of zerodp's fp32 value), rope_theta,
             rope_scaling null, attention_bias false, mlp_bias false, num_key_value_heads,
             max_position_embeddings = seq_len, head_dim. A save removes the model*.safetensors
             and index an earlier save left in DIR (as save_pretrained does).

Subcommands (PATH: an HF directory, an HF .safetensors file, or a zerodp export file):
  logits   PATH (--tokens F | --text F | --prompt P | --prompt-ids IDS) [--out PREFIX | --out-dir D]
           logits of the fp32 module and of its float64 copy, PREFIX.fp32.npy (float32) and
           PREFIX.fp64.npy (float64), (T, V) for one row of tokens ((B, T, V) for several);
           --out-dir D is --out D/logits. Prints llama_ref's JSON line (max_abs_err_fp32_vs_fp64).
           --tokens/--text as llama_ref's (the first seq_len positions); --prompt's UTF-8 bytes
           or --prompt-ids keep the last seq_len, as `zerodp sample --logits` does.
  greedy   PATH [--prompt P | --prompt-ids IDS] [--tokens N]  greedy decoding, full-window
           recompute (llama_ref's); prints the N generated ids on one line
  save     SRC --out DIR [--dtype bfloat16] [--max-shard-size BYTES]  SRC (zerodp export or HF)
           written in HF's layout
  init     --out DIR [--model gpt|llama] [--size tiny] [shape flags] [--seed S]  llama_ref's
           seeded init written straight in HF's layout
  selfcheck round trips (both kinds; sharded or not; F32, BF16, F16), the names and Conv1D
           transposes on disk against naive float64 forwards from HF's names, GPT-2 files with
           and without the prefix and with the masks, tied heads, the zerodp-export path, and
           the refusals; exit 1 on any failure

Example:
  zerodp export CK --format hf --out hf/
  hf_ref.py logits hf/ --prompt "In the beginning" --out-dir ref/   # ref/logits.fp32.npy (T, V)
  hf_ref.py greedy hf/ --prompt "In the beginning" --tokens 40
  hf_ref.py init --model llama --size tiny --seed 7 --out w/ && zerodp train --init-from w/ ...

Run with Debian's interpreter (/usr/bin/python3: PyTorch 1.13.1 CPU, numpy).
"""
import argparse
import contextlib
import io
import json
import os
import re
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD_RE = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
GPT_KEYS = ("layers", "heads", "embd", "seq_len", "vocab")
LLAMA_KEYS = ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab", "rope_theta", "norm_eps")


class HfError(ValueError):
    """A file or config this reference cannot read as Hugging Face's layout (the message
    names the file and the key or tensor)."""


def die(msg):
    sys.exit(f"hf_ref.py: {msg}")


def kind_of(model_kind):
    if model_kind in ("gpt", "gpt2"):
        return "gpt"
    if model_kind == "llama":
        return "llama"
    raise HfError(f"model kind {model_kind!r} has no Hugging Face layout here (gpt or llama)")


# ------------------------------------------------------------------------------ names

def is_conv1d(name):
    """True for the module name (no prefix) of one of GPT-2's four Conv1D weights."""
    parts = name.split(".", 2)
    return len(parts) == 3 and parts[0] == "h" and parts[1].isdigit() and parts[2] in CONV1D


GPT2_SKIP = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
LLAMA_SKIP = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def expected_shapes(kind, cfg):
    """{module name: shape} of llama_ref's module for cfg, in state-dict order."""
    L, C, V, T = cfg["layers"], cfg["embd"], cfg["vocab"], cfg["seq_len"]
    if kind == "llama":
        hs = C // cfg["heads"]
        KV, FF = cfg["kv_heads"] * hs, cfg["ffn"]
        per = {"input_layernorm.weight": (C,), "self_attn.q_proj.weight": (C, C),
               "self_attn.k_proj.weight": (KV, C), "self_attn.v_proj.weight": (KV, C),
               "self_attn.o_proj.weight": (C, C), "post_attention_layernorm.weight": (C,),
               "mlp.gate_proj.weight": (FF, C), "mlp.up_proj.weight": (FF, C), "mlp.down_proj.weight": (C, FF)}
        out = {"model.embed_tokens.weight": (V, C)}
        for name in R.llama_names(L)[1:-2]:
            out[name] = per[name.split(".", 3)[3]]
        out["model.norm.weight"] = (C,)
        out["lm_head.weight"] = (V, C)
        return out
    out = {"wte.weight": (V, C), "wpe.weight": (T, C)}
    for i in range(L):
        p = f"h.{i}."
        out.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
                    p + "attn.c_attn.weight": (3 * C, C), p + "attn.c_attn.bias": (3 * C,),
                    p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                    p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                    p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_fc.bias": (4 * C,),
                    p + "mlp.c_proj.weight": (C, 4 * C), p + "mlp.c_proj.bias": (C,)})
    out.update({"ln_f.weight": (C,), "ln_f.bias": (C,), "lm_head.weight": (V, C)})
    return out


def module_to_hf(kind, sd):
    """[(HF name, tensor)] in save_pretrained's order: GPT-2 under "transformer." with the
    Conv1D weights transposed to (in, out), the head "lm_head.weight"; the llama as it is."""
    out = []
    for name, t in sd.items():
        if kind == "gpt" and name != "lm_head.weight":
            out.append(("transformer." + name, t.t().contiguous() if is_conv1d(name) else t))
        else:
            out.append((name, t))
    return out


def hf_to_module(kind, cfg, tied, tensors, what):
    """HF-named fp32 tensors -> the module's state dict (strict: every name and shape)."""
    sd = {}
    for hf_name, t in tensors.items():
        name = hf_name
        if kind == "gpt":
            if name.startswith("transformer."):
                name = name[len("transformer."):]
            if GPT2_SKIP.fullmatch(name):
                continue
            if name == "lm_head.weight" and hf_name != name:
                raise HfError(f"{what}: transformer.lm_head.weight is no GPT2LMHeadModel name")
            if name in sd:
                raise HfError(f"{what}: tensor {name} is there both with and without the transformer. prefix")
            if is_conv1d(name):
                if t.dim() != 2:
                    raise HfError(f"{what}: Conv1D weight {hf_name} is {list(t.shape)}, not 2-D")
                t = t.t().contiguous()  # (in, out) -> nn.Linear's (out, in)
        elif LLAMA_SKIP.fullmatch(name):
            continue
        if name == "lm_head.weight" and tied:
            continue  # a tied head is the embedding, whatever the files hold
        sd[name] = t
    embed = "wte.weight" if kind == "gpt" else "model.embed_tokens.weight"
    if (tied or (kind == "gpt" and "lm_head.weight" not in sd)) and embed in sd:
        sd["lm_head.weight"] = sd[embed].clone()
    want = expected_shapes(kind, cfg)
    missing = [n for n in want if n not in sd]
    extra = [n for n in sd if n not in want]
    if missing or extra:
        raise HfError(f"{what} does not fit the config's {kind} {cfg}: missing {missing[:5]}, extra {extra[:5]}")
    for name, shape in want.items():
        if tuple(sd[name].shape) != shape:
            got = list(sd[name].shape)
            if kind == "gpt" and is_conv1d(name):
                raise HfError(f"{what}: Conv1D weight transformer.{name} is {got[::-1]}, want (in, out) "
                              f"{list(shape[::-1])}")
            raise HfError(f"{what}: tensor {name} is {got}, the config's model has {list(shape)}")
    return {n: sd[n] for n in want}


# ------------------------------------------------------------------------------ config.json

def shortest_f32(x):
    """The shortest decimal whose fp32 rounding is fp32(x): 1e-05 for zerodp's 1e-5f."""
    for digits in range(1, 18):
        v = float(f"{x:.{digits}g}")
        if R.f32(v) == R.f32(x):
            return v
    return float(x)


def read_config(config, what):
    """(kind, cfg, tied) from a config.json dict; HfError naming the key for what neither
    this reference nor zerodp can hold."""
    mt = config.get("model_type")

    def need(key):
        if config.get(key) is None:
            raise HfError(f"{what}: no {key} (a {mt} config needs it)")
        v = config[key]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise HfError(f"{what}: {key} {v!r} is not a positive integer")
        return v

    def refuse_true(key):
        if config.get(key):
            raise HfError(f"{what}: {key} {json.dumps(config[key])}: only {key} false is supported")

    if mt == "llama":
        cfg = {"embd": need("hidden_size"), "ffn": need("intermediate_size"), "layers": need("num_hidden_layers"),
               "heads": need("num_attention_heads"), "vocab": need("vocab_size")}
        cfg["kv_heads"] = need("num_key_value_heads") if config.get("num_key_value_heads") is not None else cfg["heads"]
        cfg["seq_len"] = need("max_position_embeddings") if config.get("max_position_embeddings") is not None else 2048
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise HfError(f"{what}: hidden_act {act!r}: only 'silu' (SwiGLU) is supported")
        if config.get("rope_scaling") is not None:
            raise HfError(f"{what}: rope_scaling {json.dumps(config['rope_scaling'])}: only null (plain RoPE) is supported")
        refuse_true("attention_bias")
        refuse_true("mlp_bias")
        if cfg["embd"] % cfg["heads"] != 0:
            raise HfError(f"{what}: hidden_size {cfg['embd']} is not a multiple of num_attention_heads {cfg['heads']}")
        if cfg["heads"] % cfg["kv_heads"] != 0:
            raise HfError(f"{what}: num_key_value_heads {cfg['kv_heads']} does not divide num_attention_heads {cfg['heads']}")
        if config.get("head_dim") is not None and config["head_dim"] != cfg["embd"] // cfg["heads"]:
            raise HfError(f"{what}: head_dim {config['head_dim']} is not hidden_size / num_attention_heads = "
                          f"{cfg['embd'] // cfg['heads']}")
        theta = config.get("rope_theta")
        cfg["rope_theta"] = float(10000.0 if theta is None else theta)
        eps = config.get("rms_norm_eps")
        cfg["norm_eps"] = R.f32(float(1e-6 if eps is None else eps))  # zerodp's fp32 field
        tied = bool(config.get("tie_word_embeddings", False))
        return "llama", {k: cfg[k] for k in LLAMA_KEYS}, tied
    if mt == "gpt2":
        cfg = {"embd": need("n_embd"), "layers": need("n_layer"), "heads": need("n_head"),
               "seq_len": need("n_positions"), "vocab": need("vocab_size")}
        act = config.get("activation_function", "gelu_new")
        if act != "gelu":
            extra = " (GPT-2's tanh approximation)" if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast") else ""
            raise HfError(f"{what}: activation_function {act!r}{extra}: only 'gelu' (exact erf) is supported; "
                          "this reference and zerodp have no tanh GELU")
        if config.get("n_inner") is not None and config["n_inner"] != 4 * cfg["embd"]:
            raise HfError(f"{what}: n_inner {config['n_inner']} is not null or 4 n_embd = {4 * cfg['embd']}")
        eps = config.get("layer_norm_epsilon", 1e-5)
        if eps != 1e-5:
            raise HfError(f"{what}: layer_norm_epsilon {eps}: only 1e-05 is supported")
        if config.get("scale_attn_weights", True) is not True:
            raise HfError(f"{what}: scale_attn_weights {json.dumps(config['scale_attn_weights'])}: only true is supported")
        refuse_true("scale_attn_by_inverse_layer_idx")
        refuse_true("add_cross_attention")
        if cfg["embd"] % cfg["heads"] != 0:
            raise HfError(f"{what}: n_embd {cfg['embd']} is not a multiple of n_head {cfg['heads']}")
        tied = bool(config.get("tie_word_embeddings", True))
        return "gpt", {k: cfg[k] for k in GPT_KEYS}, tied
    raise HfError(f"{what}: model_type {mt!r}: only 'gpt2' and 'llama' are supported")


def config_json(kind, cfg, dtype="float32"):
    """config.json's dict as save_pretrained writes it for GPT2LMHeadModel / LlamaForCausalLM."""
    if kind == "gpt":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "vocab_size": cfg["vocab"], "n_positions": cfg["seq_len"], "n_embd": cfg["embd"],
                "n_layer": cfg["layers"], "n_head": cfg["heads"], "n_inner": None,
                "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "layer_norm_epsilon": 1e-05, "initializer_range": 0.02, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                "use_cache": True, "tie_word_embeddings": False, "torch_dtype": dtype}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": cfg["vocab"], "hidden_size": cfg["embd"], "intermediate_size": cfg["ffn"],
            "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["heads"],
            "num_key_value_heads": cfg["kv_heads"], "head_dim": cfg["embd"] // cfg["heads"],
            "max_position_embeddings": cfg["seq_len"], "hidden_act": "silu",
            "rms_norm_eps": shortest_f32(cfg["norm_eps"]), "rope_theta": float(cfg["rope_theta"]),
            "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
            "tie_word_embeddings": False, "torch_dtype": dtype}


# ------------------------------------------------------------------------------ files

def read_header(path):
    """A safetensors file's header (JSON dict, __metadata__ included), without its data."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HfError(f"{path}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20:
                raise HfError(f"{path}: a header of {n} bytes is no safetensors header")
            return json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise HfError(f"{path}: {e.strerror}")


def file_format(path):
    return ((read_header(path).get("__metadata__") or {}).get("format"))


def read_hf_file(path):
    fmt = file_format(path)
    if fmt == "zerodp-export-1":
        raise HfError(f"{path} is a zerodp export (format zerodp-export-1), not Hugging Face's layout")
    if fmt is not None and fmt != "pt":
        raise HfError(f"{path}: __metadata__ format {fmt!r}: only 'pt' (PyTorch) files are read")
    tensors, _ = R.read_safetensors(path)
    return tensors


def load_hf(path):
    """(kind, cfg, state_dict): kind "gpt" or "llama", cfg in llama_ref's keys, the state dict
    in llama_ref's module names and (out, in) layout, fp32. path: an HF directory (config.json
    + model.safetensors or the index and its shards) or one .safetensors file (config.json
    beside it). HfError for anything that does not fit."""
    if os.path.isdir(path):
        d = path
        index = os.path.join(d, INDEX)
        if os.path.isfile(index):
            with open(index) as f:
                idx = json.load(f)
            wmap = idx.get("weight_map")
            if not isinstance(wmap, dict) or not wmap:
                raise HfError(f"{index}: no weight_map")
            tensors = {}
            for shard in sorted(set(wmap.values())):
                if os.path.basename(shard) != shard:
                    raise HfError(f"{index}: shard {shard!r} is not a file name in {d}")
                got = read_hf_file(os.path.join(d, shard))
                for name in got:
                    if wmap.get(name) != shard:
                        raise HfError(f"{index}: {shard} holds {name}, which the weight_map puts in {wmap.get(name)}")
                tensors.update(got)
            missing = [n for n in wmap if n not in tensors]
            if missing:
                raise HfError(f"{index}: {missing[:5]} are in no shard")
        elif os.path.isfile(os.path.join(d, SINGLE)):
            tensors = read_hf_file(os.path.join(d, SINGLE))
        else:
            raise HfError(f"{d}: neither {SINGLE} nor {INDEX}")
    elif os.path.isfile(path):
        d = os.path.dirname(os.path.abspath(path))
        tensors = read_hf_file(path)
    else:
        raise HfError(f"{path}: no such file or directory")
    cpath = os.path.join(d, CONFIG)
    if not os.path.isfile(cpath):
        raise HfError(f"{path}: no {CONFIG} beside the weights")
    with open(cpath) as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as e:
            raise HfError(f"{cpath}: {e}")
    kind, cfg, tied = read_config(config, cpath)
    return kind, cfg, hf_to_module(kind, cfg, tied, tensors, path)


def parse_size(text):
    """BYTES, or with a suffix as transformers' max_shard_size: KB/MB/GB decimal, KiB/MiB/GiB."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise HfError(f"shard size {text!r} is not BYTES or N[KB|MB|GB|KiB|MiB|GiB]")
    unit = (m.group(2) or "").upper()
    mult = {"": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(m.group(1)) * mult


def save_hf(module_state_dict, cfg, model_kind, out_dir, dtype="float32", max_shard_bytes=None):
    """Writes what save_pretrained writes for GPT2LMHeadModel / LlamaForCausalLM into out_dir:
    config.json, model.safetensors (or, when max_shard_bytes is given and the tensors exceed
    it, model-0000k-of-0000n.safetensors + model.safetensors.index.json). Returns the files."""
    kind = kind_of(model_kind)
    if dtype not in DTYPES:
        raise HfError(f"dtype {dtype!r}: float32, bfloat16 or float16")
    st = DTYPES[dtype]
    width = 4 if st == "F32" else 2
    want = expected_shapes(kind, cfg)
    sd = dict(module_state_dict)
    if list(sd) != list(want) and set(sd) == set(want):
        sd = {n: sd[n] for n in want}
    for name, shape in want.items():
        if name not in sd or tuple(sd[name].shape) != shape:
            raise HfError(f"the state dict does not fit {kind} {cfg} at {name}")
    if set(sd) != set(want):
        raise HfError(f"the state dict has tensors no {kind} has: {sorted(set(sd) - set(want))[:5]}")
    tensors = module_to_hf(kind, sd)
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):  # a previous save's weights (save_pretrained's clean-up)
        if old in (SINGLE, INDEX) or SHARD_RE.fullmatch(old):
            os.remove(os.path.join(out_dir, old))
    shards, cur, cur_bytes = [], [], 0
    for name, t in tensors:
        nbytes = t.numel() * width
        if max_shard_bytes is not None and cur and cur_bytes + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, t))
        cur_bytes += nbytes
    shards.append(cur)
    meta = {"format": "pt"}
    files = []
    if len(shards) == 1:
        files.append(os.path.join(out_dir, SINGLE))
        R.write_safetensors(files[0], tensors, meta, dtype=st)
    else:
        n = len(shards)
        wmap = {}
        for k, shard in enumerate(shards, 1):
            fname = f"model-{k:05d}-of-{n:05d}.safetensors"
            R.write_safetensors(os.path.join(out_dir, fname), shard, meta, dtype=st)
            files.append(os.path.join(out_dir, fname))
            wmap.update({name: fname for name, _ in shard})
        total = sum(t.numel() * width for _, t in tensors)
        with open(os.path.join(out_dir, INDEX), "w") as f:
            f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=2, sort_keys=True) + "\n")
        files.append(os.path.join(out_dir, INDEX))
    with open(os.path.join(out_dir, CONFIG), "w") as f:
        f.write(json.dumps(config_json(kind, cfg, dtype), indent=2, sort_keys=True) + "\n")
    files.append(os.path.join(out_dir, CONFIG))
    return files


# ------------------------------------------------------------------------------ modules

def gpt_args(gpt="auto", peer_dir=None, **extra):
    """A namespace with what llama_ref's make_module / load_model read."""
    a = argparse.Namespace(model=None, size=None, gpt=gpt, peer_dir=peer_dir, rope_theta=None, norm_eps=None)
    for key in ("layers", "heads", "kv_heads", "embd", "ffn", "seq_len", "vocab"):
        setattr(a, key, None)
    for k, v in extra.items():
        setattr(a, k, v)
    return a


def build(kind, cfg, sd, gpt="auto", peer_dir=None):
    """(fp32 module, forward) of llama_ref with the state dict loaded strictly."""
    a = gpt_args(gpt, peer_dir, model=kind)
    module, fwd = R.make_module(a, dict(cfg))
    module.load_state_dict(sd, strict=True)
    return module, fwd


def is_zerodp_export(path):
    return os.path.isfile(path) and file_format(path) == "zerodp-export-1"


def load_any(path, gpt="auto", peer_dir=None):
    """(kind, cfg, state dict) from an HF directory or file, or a zerodp export file."""
    if is_zerodp_export(path):
        a = gpt_args(gpt, peer_dir)
        module, _, cfg = R.load_model(a, path)
        keys = LLAMA_KEYS if a.model == "llama" else GPT_KEYS
        return a.model, {k: cfg[k] for k in keys}, dict(module.state_dict())
    return load_hf(path)


# ------------------------------------------------------------------------------ subcommands

def prompt_ids(a):
    if a.prompt_ids is not None:
        return [int(v) for v in a.prompt_ids.replace(",", " ").split()]
    return list(a.prompt.encode("utf-8"))


def logits_main(a):
    import numpy as np
    import torch

    kind, cfg, sd = load_any(a.path, a.gpt, a.peer_dir)
    module, fwd = build(kind, cfg, sd, a.gpt, a.peer_dir)
    given = [x for x in (a.tokens, a.text, a.prompt, a.prompt_ids) if x is not None]
    if len(given) != 1:
        die("give exactly one of --tokens FILE (.npy, or whitespace/comma separated ids, a row a line), "
            "--text FILE (bytes), --prompt TEXT (UTF-8 bytes) or --prompt-ids IDS")
    if a.tokens is not None or a.text is not None:  # llama_ref's: the first seq_len positions
        idx = R.read_tokens(a)
        if a.max_positions:
            idx = idx[:, :a.max_positions]
        idx = idx[:, :cfg["seq_len"]]
    else:  # zerodp sample --logits's: the last seq_len
        ids = prompt_ids(a)
        if len(ids) > cfg["seq_len"]:
            print(f"hf_ref.py: the prompt's {len(ids)} tokens are past seq_len {cfg['seq_len']}: "
                  f"its last {cfg['seq_len']}", file=sys.stderr)
            ids = ids[-cfg["seq_len"]:]
        idx = np.array([ids], dtype=np.int64)
    if idx.size == 0:
        die("no tokens")
    if idx.min() < 0 or idx.max() >= cfg["vocab"]:
        die(f"token ids must be in 0..{cfg['vocab'] - 1}")
    l32, l64 = R.fp32_fp64_logits(module, fwd, torch.from_numpy(idx))
    if l32.shape[0] == 1:  # one row: (T, V), as zerodp sample --logits writes
        l32, l64 = l32[0], l64[0]
    prefix = a.out
    if a.out_dir is not None:
        os.makedirs(a.out_dir, exist_ok=True)
        prefix = os.path.join(a.out_dir, "logits")
    if a.format == "npy":
        files = [prefix + ".fp32.npy", prefix + ".fp64.npy"]
        np.save(files[0], np.ascontiguousarray(l32, dtype=np.float32))
        np.save(files[1], np.ascontiguousarray(l64, dtype=np.float64))
    else:
        files = [prefix + ".fp32.f32", prefix + ".fp64.f64"]
        l32.astype("<f4").tofile(files[0])
        l64.astype("<f8").tofile(files[1])
    print(json.dumps(R.logits_report(kind, l32, l64, files)))
    return 0


def greedy_main(a):
    kind, cfg, sd = load_any(a.path, a.gpt, a.peer_dir)
    module, fwd = build(kind, cfg, sd, a.gpt, a.peer_dir)
    ids = prompt_ids(a)
    if not ids:
        die("the prompt is empty")
    if min(ids) < 0 or max(ids) >= cfg["vocab"]:
        die(f"prompt ids must be in 0..{cfg['vocab'] - 1}")
    if a.float64:
        module = module.double()
    print(" ".join(str(t) for t in R.greedy_decode(module, fwd, cfg["seq_len"], ids, a.max_tokens)))
    return 0


def save_main(a):
    kind, cfg, sd = load_any(a.src, "own")
    files = save_hf(sd, cfg, kind, a.out, a.dtype, parse_size(a.max_shard_size) if a.max_shard_size else None)
    print(json.dumps({"wrote": a.out, "files": [os.path.basename(f) for f in files], "model": kind,
                      "dtype": a.dtype, "config": cfg}))
    return 0


def init_main(a):
    cfg = R.model_config(a)
    module, _ = R.initialized_module(a, cfg)
    sd = module.state_dict()
    keys = LLAMA_KEYS if a.model == "llama" else GPT_KEYS
    cfg = {k: cfg[k] for k in keys}
    files = save_hf(sd, cfg, a.model, a.out, a.dtype, parse_size(a.max_shard_size) if a.max_shard_size else None)
    n = sum(t.numel() for t in sd.values())
    print(json.dumps({"wrote": a.out, "files": [os.path.basename(f) for f in files], "model": a.model,
                      "params": n, "config": cfg}))
    return 0


# ------------------------------------------------------------------------------ selfcheck

def naive_gpt2_logits(W, cfg, idx):
    """GPT-2's forward from HF's tensors as GPT2LMHeadModel computes it, numpy float64,
    independent of llama_ref's module: Conv1D y = x @ W + b with W (in, out), pre-LN blocks,
    LayerNorm eps 1e-5, fused qkv split q | k | v, heads scaled by 1/sqrt(hs), causal softmax,
    exact-erf GELU, ln_f, logits = x @ lm_head.weight^T. W: HF name -> float64 array."""
    import math

    import numpy as np

    C, H = cfg["embd"], cfg["heads"]
    hs = C // H
    erf = np.vectorize(math.erf)
    tr = "transformer."

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * W[p + ".weight"] + W[p + ".bias"]

    def conv1d(x, p):
        return x @ W[p + ".weight"] + W[p + ".bias"]

    out = []
    for row in idx:
        T = len(row)
        x = W[tr + "wte.weight"][row] + W[tr + "wpe.weight"][:T]
        for l in range(cfg["layers"]):
            p = f"{tr}h.{l}."
            qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
            y = np.zeros((T, C))
            for h in range(H):
                q, k, v = (qkv[:, j * C + h * hs:j * C + (h + 1) * hs] for j in range(3))
                for t in range(T):
                    sc = q[t] @ k[:t + 1].T / math.sqrt(hs)
                    e = np.exp(sc - sc.max())
                    y[t, h * hs:(h + 1) * hs] = (e / e.sum()) @ v[:t + 1]
            x = x + conv1d(y, p + "attn.c_proj")
            u = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
            x = x + conv1d(0.5 * u * (1.0 + erf(u / math.sqrt(2.0))), p + "mlp.c_proj")
        out.append(ln(x, tr + "ln_f") @ W["lm_head.weight"].T)
    return np.stack(out)


def selfcheck_main(a):
    import numpy as np
    import torch

    torch.manual_seed(a.seed)
    results, failures = [], []

    def check(name, ok, detail=""):
        results.append({"check": name, "ok": bool(ok), **({"detail": detail} if detail else {})})
        if not ok:
            failures.append(name)

    def same(sd1, sd2):
        return list(sd1) == list(sd2) and all(torch.equal(sd1[k], sd2[k]) for k in sd1)

    def run_checks():
        cfgs = {"gpt": dict(layers=2, heads=2, embd=16, seq_len=12, vocab=40),
                "llama": dict(layers=2, heads=4, kv_heads=2, embd=32, ffn=48, seq_len=12, vocab=40,
                              rope_theta=500000.0, norm_eps=R.f32(1e-6))}
        sds = {}
        for kind, cfg in cfgs.items():
            m, _ = R.make_module(gpt_args("own", model=kind), cfg)
            with torch.no_grad():
                for _, p in m.named_parameters():
                    if p.dim() == 1:
                        p.copy_(1.0 + 0.3 * torch.randn_like(p))
                    else:
                        p.normal_(0.0, 0.3)
            sds[kind] = {k: v.clone() for k, v in m.state_dict().items()}
            check(f"{kind}: expected_shapes = the module's state dict",
                  {k: tuple(v.shape) for k, v in sds[kind].items()} == expected_shapes(kind, cfg))

        idx = torch.randint(0, 40, (2, 12))
        with tempfile.TemporaryDirectory() as tmp:
            # Round trips: both kinds, F32 / BF16 / F16, one file or shards.
            for kind, cfg in cfgs.items():
                sd = sds[kind]
                total32 = sum(t.numel() * 4 for t in sd.values())
                for dtype in ("float32", "bfloat16", "float16"):
                    for shard in (None, total32 // 5):
                        d = os.path.join(tmp, f"{kind}-{dtype}-{shard}")
                        save_hf(sd, cfg, kind, d, dtype, shard)
                        tag = f"{kind} {dtype} {'sharded' if shard else 'one file'}"
                        k2, c2, sd2 = load_hf(d)
                        td = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
                        want = {k: v.to(td).float() for k, v in sd.items()}
                        check(f"{tag}: round trip, identical tensors", k2 == kind and c2 == cfg and same(want, sd2),
                              "" if c2 == cfg else f"cfg {c2}")
                        with open(os.path.join(d, CONFIG)) as f:
                            conf = json.load(f)
                        check(f"{tag}: config torch_dtype", conf["torch_dtype"] == dtype)
                        if shard:
                            with open(os.path.join(d, INDEX)) as f:
                                index = json.load(f)
                            width = 4 if dtype == "float32" else 2
                            shard_files = sorted(x for x in os.listdir(d) if SHARD_RE.fullmatch(x))
                            n = len(shard_files)
                            names_ok = shard_files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
                            sizes_ok = all(sum(int(np.prod(i["shape"])) * width for k, i in read_header(os.path.join(d, s)).items()
                                               if k != "__metadata__") <= shard or
                                           len(read_header(os.path.join(d, s))) == 2 for s in shard_files)
                            check(f"{tag}: {n} shards, 5-digit names, each within the limit (or one tensor), "
                                  "index total_size and weight_map",
                                  n > 1 and names_ok and sizes_ok and not os.path.exists(os.path.join(d, SINGLE)) and
                                  index["metadata"]["total_size"] == total32 // 4 * width and
                                  set(index["weight_map"].values()) == set(shard_files) and
                                  len(index["weight_map"]) == len(sd), f"{n} shards")
                        else:
                            check(f"{tag}: model.safetensors alone", not os.path.exists(os.path.join(d, INDEX)))
                # A sharded save over a one-file save leaves no stale model.safetensors behind.
                d = os.path.join(tmp, f"{kind}-resave")
                save_hf(sd, cfg, kind, d, "float32")
                save_hf(sd, cfg, kind, d, "float32", total32 // 3)
                check(f"{kind}: a sharded save over a one-file save removes model.safetensors",
                      not os.path.exists(os.path.join(d, SINGLE)) and same(sd, load_hf(d)[2]))

            # On disk: names, Conv1D orientation, metadata, config fields; and the HF tensors run
            # through independent naive forwards equal the module's logits.
            g = os.path.join(tmp, "gpt-float32-None")
            hdr = read_header(os.path.join(g, SINGLE))
            C = cfgs["gpt"]["embd"]
            gt, _ = R.read_safetensors(os.path.join(g, SINGLE))
            want_names = ["transformer." + n for n in sds["gpt"] if n != "lm_head.weight"] + ["lm_head.weight"]
            check("gpt2 on disk: transformer. names, lm_head.weight, __metadata__ {format: pt}",
                  sorted(gt) == sorted(want_names) and hdr["__metadata__"] == {"format": "pt"})
            check("gpt2 on disk: Conv1D weights (in, out), the transposes",
                  hdr["transformer.h.0.attn.c_attn.weight"]["shape"] == [C, 3 * C] and
                  hdr["transformer.h.1.mlp.c_fc.weight"]["shape"] == [C, 4 * C] and
                  hdr["transformer.h.1.mlp.c_proj.weight"]["shape"] == [4 * C, C] and
                  all(torch.equal(gt["transformer." + n], sds["gpt"][n].t()) for n in sds["gpt"] if is_conv1d(n)) and
                  torch.equal(gt["transformer.h.0.attn.c_attn.bias"], sds["gpt"]["h.0.attn.c_attn.bias"]))
            with open(os.path.join(g, CONFIG)) as f:
                gc = json.load(f)
            check("gpt2 config.json", gc["architectures"] == ["GPT2LMHeadModel"] and gc["model_type"] == "gpt2" and
                  gc["activation_function"] == "gelu" and gc["n_inner"] is None and gc["tie_word_embeddings"] is False and
                  gc["layer_norm_epsilon"] == 1e-5 and gc["n_positions"] == 12 and gc["n_embd"] == C and
                  gc["attn_pdrop"] == gc["embd_pdrop"] == gc["resid_pdrop"] == 0.0 and gc["scale_attn_weights"] is True)
            lc_path = os.path.join(tmp, "llama-float32-None", CONFIG)
            with open(lc_path) as f:
                lc = json.load(f)
            check("llama config.json", lc["architectures"] == ["LlamaForCausalLM"] and lc["model_type"] == "llama" and
                  lc["hidden_act"] == "silu" and lc["rope_scaling"] is None and lc["attention_bias"] is False and
                  lc["mlp_bias"] is False and lc["num_key_value_heads"] == 2 and lc["head_dim"] == 8 and
                  lc["max_position_embeddings"] == 12 and lc["rms_norm_eps"] == 1e-06 and lc["rope_theta"] == 500000.0 and
                  lc["tie_word_embeddings"] is False, json.dumps(lc))
            W = {k: v.double().numpy() for k, v in gt.items()}
            m, fwd = build("gpt", cfgs["gpt"], load_hf(g)[2], "own")
            with torch.no_grad():
                l64 = fwd(m.double(), idx).numpy()
            ref = naive_gpt2_logits(W, cfgs["gpt"], idx.numpy())
            err = float(np.abs(l64 - ref).max())
            check("gpt2: module from load_hf = naive GPT2LMHeadModel forward on the HF tensors (float64)",
                  err < 1e-9 * max(1.0, float(np.abs(ref).max())), f"max abs diff {err:.3g}")
            lt, _ = R.read_safetensors(os.path.join(tmp, "llama-float32-None", SINGLE))
            m, fwd = build("llama", cfgs["llama"], load_hf(os.path.join(tmp, "llama-float32-None"))[2])
            with torch.no_grad():
                l64 = fwd(m.double(), idx).numpy()
            ref = R.naive_llama_logits(lt, cfgs["llama"], idx.numpy())
            err = float(np.abs(l64 - ref).max())
            check("llama: module from load_hf = naive equations on the HF tensors (float64, rope_theta 5e5, eps 1e-6)",
                  err < 1e-9 * max(1.0, float(np.abs(ref).max())) and list(lt) == R.llama_names(2), f"max abs diff {err:.3g}")

            # GPT-2 variants: without the prefix plus the attention masks, as the Hub's gpt2 file.
            def variant(name, tensors, config, meta={"format": "pt"}):
                d = os.path.join(tmp, name)
                os.makedirs(d, exist_ok=True)
                R.write_safetensors(os.path.join(d, SINGLE), list(tensors.items()), meta)
                with open(os.path.join(d, CONFIG), "w") as f:
                    json.dump(config, f)
                return d

            T = cfgs["gpt"]["seq_len"]
            bare = {}
            for k, v in gt.items():
                name = k[len("transformer."):] if k.startswith("transformer.") else k
                bare[name] = v
                if name.endswith("ln_1.weight"):
                    layer = name[:-len("ln_1.weight")]
                    bare[layer + "attn.bias"] = torch.ones(T, T).tril().view(1, 1, T, T)
                    bare[layer + "attn.masked_bias"] = torch.tensor(-1e4)
            d = variant("gpt-bare", bare, gc)
            check("gpt2 without the transformer. prefix, with attn.bias / attn.masked_bias: loads the same",
                  same(sds["gpt"], load_hf(d)[2]))
            prefixed = dict(gt)
            prefixed["transformer.h.0.attn.bias"] = torch.ones(1, 1, T, T)
            d = variant("gpt-masks", prefixed, gc)
            check("gpt2 with the prefix and transformer.h.0.attn.bias: loads the same", same(sds["gpt"], load_hf(d)[2]))
            # Tied: no lm_head.weight, tie_word_embeddings absent (GPT-2's default true).
            tied_conf = {k: v for k, v in gc.items() if k != "tie_word_embeddings"}
            d = variant("gpt-tied", {k: v for k, v in bare.items() if k != "lm_head.weight"}, tied_conf)
            got = load_hf(d)[2]
            want = dict(sds["gpt"], **{"lm_head.weight": sds["gpt"]["wte.weight"]})
            check("gpt2 tied (default true), no lm_head.weight: the head equals wte", same(want, got))
            # Tied explicitly with a (stale) head in the files: the embedding wins, as HF ties it.
            d = variant("gpt-tied2", gt, dict(gc, tie_word_embeddings=True))
            check("gpt2 tie_word_embeddings true with a head in the files: the head equals wte", same(want, load_hf(d)[2]))
            # Untied but no head: also wte.
            d = variant("gpt-nohead", {k: v for k, v in gt.items() if k != "lm_head.weight"}, gc)
            check("gpt2 untied without lm_head.weight: the head equals wte", same(want, load_hf(d)[2]))
            # A single .safetensors file path with config.json beside it.
            check("a .safetensors file path with config.json beside it", same(sds["gpt"], load_hf(os.path.join(g, SINGLE))[2]))
            # Llama: tied, the rotary buffers skipped, no metadata at all.
            lsd = {k: v for k, v in lt.items() if k != "lm_head.weight"}
            lsd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
            lsd["model.layers.1.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
            d = variant("llama-tied", lsd, dict(lc, tie_word_embeddings=True), meta=None)
            wantl = dict(sds["llama"], **{"lm_head.weight": sds["llama"]["model.embed_tokens.weight"]})
            check("llama tied, rotary_emb.inv_freq skipped, no __metadata__: head equals embed_tokens", same(wantl, load_hf(d)[2]))
            # Config defaults: a minimal llama config (kv heads = heads, eps 1e-6, theta 1e4, 2048).
            _, c, _ = read_config({"model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
                                   "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 40}, "min")
            check("llama config defaults", c == dict(layers=2, heads=4, kv_heads=4, embd=32, ffn=48, seq_len=2048, vocab=40,
                                                     rope_theta=10000.0, norm_eps=R.f32(1e-6)), str(c))

            # Refusals, each naming its key.
            def refused(what, d_or_conf, key):
                try:
                    if isinstance(d_or_conf, dict):
                        read_config(d_or_conf, what)
                    else:
                        load_hf(d_or_conf)
                except HfError as e:
                    check(f"refused: {what}", key in str(e), str(e))
                    return
                check(f"refused: {what}", False, "accepted")

            refused("llama rope_scaling", dict(lc, rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling")
            refused("llama attention_bias", dict(lc, attention_bias=True), "attention_bias")
            refused("llama mlp_bias", dict(lc, mlp_bias=True), "mlp_bias")
            refused("llama head_dim", dict(lc, head_dim=16), "head_dim")
            refused("llama hidden_act", dict(lc, hidden_act="gelu"), "hidden_act")
            refused("gpt2 gelu_new", dict(gc, activation_function="gelu_new"), "gelu_new")
            refused("gpt2 default activation (gelu_new)", {k: v for k, v in gc.items() if k != "activation_function"},
                    "activation_function")
            refused("gpt2 n_inner", dict(gc, n_inner=3 * C), "n_inner")
            refused("gpt2 layer_norm_epsilon", dict(gc, layer_norm_epsilon=1e-6), "layer_norm_epsilon")
            refused("gpt2 missing n_head", {k: v for k, v in gc.items() if k != "n_head"}, "n_head")
            refused("model_type bert", dict(gc, model_type="bert"), "model_type")
            refused("llama config on disk with rope_scaling",
                    variant("llama-rs", lt, dict(lc, rope_scaling={"type": "dynamic", "factor": 4.0})), "rope_scaling")
            refused("a zerodp export read as HF", variant("zx", gt, gc, meta={"format": "zerodp-export-1"}), "zerodp")
            wrong = dict(bare)
            wrong["h.0.mlp.c_fc.weight"] = wrong["h.0.mlp.c_fc.weight"].t().contiguous()  # left in (out, in)
            refused("gpt2 Conv1D weight in nn.Linear's layout", variant("gpt-wrong", wrong, gc), "c_fc.weight")
            extra = dict(gt, **{"transformer.h.0.attn.c_attn.extra": torch.ones(2)})
            refused("an unknown tensor", variant("gpt-extra", extra, gc), "c_attn.extra")

            # The CLI: a zerodp export -> save (sharded, bf16) and save (f32) -> logits / greedy
            # equal llama_ref's on the export; init writes an HF directory that loads.
            for kind, cfg in cfgs.items():
                zx = os.path.join(tmp, f"{kind}.zerodp.safetensors")
                order = R.llama_names(cfg["layers"]) if kind == "llama" else list(sds[kind])
                R.write_safetensors(zx, [(k, sds[kind][k]) for k in order], R.metadata_of(argparse.Namespace(model=kind), cfg))
                hfd = os.path.join(tmp, f"{kind}-cli")
                quiet = io.StringIO()
                with contextlib.redirect_stdout(quiet):
                    main(["save", zx, "--out", hfd])
                    main(["save", zx, "--out", hfd + "-bf16", "--dtype", "bfloat16", "--max-shard-size", "2KB"])
                check(f"cli save {kind}: zerodp export -> HF, identical tensors", same(sds[kind], load_hf(hfd)[2]))
                bf = load_hf(hfd + "-bf16")[2]
                check(f"cli save {kind} --dtype bfloat16 --max-shard-size 2KB: the rounded tensors, sharded",
                      same({k: v.to(torch.bfloat16).float() for k, v in sds[kind].items()}, bf) and
                      os.path.isfile(os.path.join(hfd + "-bf16", INDEX)))
                outs = {}
                for src, prog in ((zx, R.main), (hfd, main)):
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        prog(["greedy", src, "--prompt-ids", "1 2 3", "--max-tokens", "15", "--gpt", "own"])
                    outs[prog is main] = buf.getvalue()
                check(f"cli greedy {kind}: HF directory = llama_ref on the zerodp export (15 ids, past seq_len)",
                      outs[True] == outs[False] and len(outs[True].split()) == 15, outs[True].strip())
                tok = os.path.join(tmp, "tokens.txt")
                with open(tok, "w") as f:
                    f.write(" ".join(str(int(t)) for t in idx[0]) + "\n")
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    main(["logits", hfd, "--tokens", tok, "--out-dir", os.path.join(tmp, "lo"), "--gpt", "own"])
                    R.main(["logits", zx, "--tokens", tok, "--out", os.path.join(tmp, "lr"), "--gpt", "own"])
                mine = np.load(os.path.join(tmp, "lo", "logits.fp32.npy"))
                theirs = np.load(os.path.join(tmp, "lr.fp32.npy"))
                rep = json.loads(buf.getvalue().splitlines()[0])
                check(f"cli logits {kind}: (T, V) float32, = llama_ref's on the export, the error line",
                      mine.dtype == np.float32 and mine.shape == (12, 40) and np.array_equal(mine, theirs[0]) and
                      "max_abs_err_fp32_vs_fp64" in rep and rep["max_abs_err_fp32_vs_fp64"] < 1e-4, str(rep))
                init_dir = os.path.join(tmp, f"{kind}-init")
                with contextlib.redirect_stdout(quiet):
                    main(["init", "--model", kind, "--size", "tiny", "--seed", "3", "--gpt", "own", "--out", init_dir])
                ia = argparse.Namespace(model=kind, size="tiny", seed=3, gpt="own", peer_dir=None, std=0.02, std_scale=1.0,
                                        norm_jitter=0.0, **{k: None for k in LLAMA_KEYS})
                im, _ = R.initialized_module(ia, R.model_config(ia))
                check(f"cli init {kind}: HF directory = llama_ref's seeded init", same(dict(im.state_dict()), load_hf(init_dir)[2]))

    try:
        run_checks()
    except (Exception, SystemExit) as e:  # a crash is a failure, reported with the rest
        import traceback

        check("selfcheck ran to the end", False, f"{type(e).__name__}: {e} at " +
              " <- ".join(f"{f.name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)[-3:][::-1]))

    for r in results:
        print(json.dumps(r))
    print(json.dumps({"checks": len(results), "failed": failures, "ok": not failures}))
    return 0 if not failures else 1


# ------------------------------------------------------------------------------ CLI

def add_gpt_flags(p):
    p.add_argument("--gpt", choices=["auto", "peer", "own"], default="auto",
                   help="gpt module: the PyTorch peer's build_model (auto: where found) or llama_ref's build_gpt")
    p.add_argument("--peer-dir", default=None, help="the folder of the PyTorch peer's train_ref.py (gpt)")


def add_prompt_flags(p, default_prompt):
    p.add_argument("--prompt", default=default_prompt, help="its UTF-8 bytes are the ids")
    p.add_argument("--prompt-ids", default=None, help="ids separated by spaces or commas")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    pl = sub.add_parser("logits", help="fp32 and float64 logits of a token batch")
    pl.add_argument("path", help="an HF directory or .safetensors file, or a zerodp export file")
    pl.add_argument("--tokens", default=None, help=".npy (T) or (B, T) ints, or text: ids separated by spaces/commas, a row a line")
    pl.add_argument("--text", default=None, help="a file whose bytes are the token ids (one row)")
    add_prompt_flags(pl, None)
    pl.add_argument("--max-positions", type=int, default=None, help="--tokens/--text: keep the first N")
    pl.add_argument("--out", default="logits", help="prefix: PREFIX.fp32.npy and PREFIX.fp64.npy")
    pl.add_argument("--out-dir", default=None, help="write DIR/logits.fp32.npy and DIR/logits.fp64.npy")
    pl.add_argument("--format", choices=["npy", "raw"], default="npy",
                    help="raw: PREFIX.fp32.f32 and PREFIX.fp64.f64, little-endian, row-major")
    add_gpt_flags(pl)

    pg = sub.add_parser("greedy", help="greedy decoding, full-window recompute")
    pg.add_argument("path", help="an HF directory or .safetensors file, or a zerodp export file")
    add_prompt_flags(pg, "In the beginning")
    pg.add_argument("--tokens", "--max-tokens", dest="max_tokens", type=int, default=40, help="how many ids to generate")
    pg.add_argument("--float64", action="store_true", help="decode with the float64 copy")
    add_gpt_flags(pg)

    ps = sub.add_parser("save", help="a zerodp export (or HF directory) written in HF's layout")
    ps.add_argument("src", help="a zerodp export file (zerodp-export-1) or an HF directory or file")
    ps.add_argument("--out", required=True, help="the directory to write")
    ps.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ps.add_argument("--max-shard-size", default=None, help="BYTES (or 5GB, 500MiB ...): shard past it")

    pi = sub.add_parser("init", help="llama_ref's seeded init written in HF's layout")
    pi.add_argument("--out", required=True, help="the directory to write")
    R.add_model_flags(pi)
    pi.add_argument("--seed", type=int, default=1337)
    pi.add_argument("--std", type=float, default=0.02, help="llama: N(0, std) for Linear and Embedding")
    pi.add_argument("--std-scale", type=float, default=1.0, help="gpt: multiply the init of 2-D weights")
    pi.add_argument("--norm-jitter", type=float, default=0.0, help="add N(0, j^2) to norm weights (and gpt biases)")
    pi.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    pi.add_argument("--max-shard-size", default=None, help="BYTES (or 5GB, 500MiB ...): shard past it")

    pc = sub.add_parser("selfcheck", help="round trips, the layout against naive forwards, the refusals")
    pc.add_argument("--seed", type=int, default=1)

    a = p.parse_args(argv)
    try:
        if a.cmd == "selfcheck":
            return selfcheck_main(a)
        if a.cmd == "init":
            a.model = a.model or "llama"
            return init_main(a)
        if a.cmd == "save":
            return save_main(a)
        if a.cmd == "logits":
            return logits_main(a)
        return greedy_main(a)
    except HfError as e:
        die(str(e))


if __name__ == "__main__":
    sys.exit(main() or 0)
