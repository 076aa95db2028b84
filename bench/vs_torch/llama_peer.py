#!/usr/bin/python3
"""The PyTorch peer's data-parallel training (../shared/peers/torch/train_ref.py), of the Llama.

Runs train_ref.py's own main, unchanged (its argument list, data, sampler, AdamW recipe, modes
ddp / zero1 / fsdp_grad_op / fsdp_full over gloo, timing and JSON line) with two things
replaced:
  the model   train_ref.build_model returns llama_ref.build_llama of zerodp's `--model llama`
              preset of the same --size (layers, heads, KV heads, embd, FFN, seq_len, the
              256-byte vocabulary: docs/llama.md), initialized as zerodp's llama (every Linear
              weight and the embedding N(0, 0.02), RMSNorm weights 1; seeded by --seed) and
              computing train_ref's loss (mean cross-entropy, fp32 under autocast);
  the wrap    FSDP's transformer auto-wrap wraps the llama's decoder layer (the class of
              model.layers[i]) where train_ref wraps its GPT Block.
The micro-batch and seq_len are the preset's, as train_ref's SIZES has them for the GPT (the
two families' presets share them). The JSON line's flops_per_token keeps train_ref's formula;
params counts the llama's parameters and params_wpe is 0 (no position embedding).

    /usr/bin/python3 bench/vs_torch/llama_peer.py --data kjv.txt --size small --mode fsdp_full \\
        --world 2 --steps 60 [--peer-dir ../shared/peers/torch]

--peer-dir (else $ZERODP_TORCH_PEER, else ../shared/peers/torch beside the project) names the
folder of train_ref.py; every other flag is train_ref.py's (--help lists them; --tied and
--vocab char are refused: zerodp's llama has an untied head over bytes).
"""
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _peer_dir(argv):
    for i, arg in enumerate(argv):
        if arg == "--peer-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--peer-dir="):
            return arg.partition("=")[2]
    return (os.environ.get("ZERODP_TORCH_PEER")
            or os.path.join(os.path.dirname(ROOT), "shared", "peers", "torch"))


# Module level on purpose: torch.multiprocessing.spawn's children run this file again (as
# __mp_main__) before they unpickle train_ref's worker, so they get the same replacements.
# The environment carries the peer's folder to them.
PEER_DIR = os.path.abspath(_peer_dir(sys.argv))
os.environ["ZERODP_TORCH_PEER"] = PEER_DIR
if not os.path.isfile(os.path.join(PEER_DIR, "train_ref.py")):
    sys.exit(f"llama_peer.py: no train_ref.py in {PEER_DIR}; give --peer-dir or set ZERODP_TORCH_PEER")
for d in (HERE, PEER_DIR):
    if d not in sys.path:
        sys.path.insert(0, d)

import llama_ref  # noqa: E402
import train_ref  # noqa: E402

INIT_STD = 0.02  # zerodp's llama init (src/models/llama_units.cc kInitStd)


def llama_preset(n_layer, n_head, n_embd, block_size):
    """The llama --size preset whose layers, heads, embd and seq_len train_ref asked for."""
    for name, p in llama_ref.LLAMA_SIZES.items():
        if (p["layers"], p["heads"], p["embd"], p["seq_len"]) == (n_layer, n_head, n_embd, block_size):
            return name, p
    sys.exit(f"llama_peer.py: no llama preset has {n_layer} layers, {n_head} heads, embd {n_embd}, "
             f"seq_len {block_size}")


def build_model(vocab_size, n_layer, n_head, n_embd, block_size, tied=False):
    """train_ref.build_model's contract, for the llama: (module whose forward(idx, targets)
    returns the loss, the class FSDP wraps)."""
    import torch

    if tied:
        sys.exit("llama_peer.py: --tied: zerodp's llama head is untied (its tied head is not built)")
    name, preset = llama_preset(n_layer, n_head, n_embd, block_size)
    if vocab_size != preset["vocab"]:
        sys.exit(f"llama_peer.py: vocabulary {vocab_size}; the llama {name} preset's is "
                 f"{preset['vocab']} (use --vocab byte)")
    cfg = dict(preset, **llama_ref.LLAMA_DEFAULTS)
    model = llama_ref.build_llama(cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD)
    # train_ref reads model.wpe.weight.numel() for its params_wpe figure: the llama has no
    # position embedding. A plain attribute, not a module: no parameter, nothing to wrap.
    model.wpe = types.SimpleNamespace(weight=torch.empty(0))
    return model, type(model.model.layers[0])


train_ref.build_model = build_model
train_ref.__doc__ = (f"{__doc__}\n-------- train_ref.py ({PEER_DIR}), whose flags these are --------\n"
                     f"{train_ref.__doc__}")


def main():
    argv = sys.argv[1:]
    out = []
    i = 0
    while i < len(argv):  # --peer-dir is ours; train_ref's parser would refuse it
        if argv[i] == "--peer-dir":
            i += 2
            continue
        if not argv[i].startswith("--peer-dir="):
            out.append(argv[i])
        i += 1
    if "--tied" in out:
        sys.exit("llama_peer.py: --tied: zerodp's llama head is untied")
    if any(x == "char" for j, x in enumerate(out) if j > 0 and out[j - 1] == "--vocab") or "--vocab=char" in out:
        sys.exit("llama_peer.py: --vocab char: zerodp's llama reads bytes (--vocab byte, the default)")
    sys.argv = [sys.argv[0]] + out
    train_ref.main()


if __name__ == "__main__":
    main()
