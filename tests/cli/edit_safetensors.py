#!/usr/bin/env python3
"""Rewrites a safetensors file with things changed, with only the standard library, for the
CLI tests of hostile or foreign model files.

  edit_safetensors.py IN OUT [--nan TENSOR] [--metadata KEY=VALUE ...] [--drop TENSOR]
                             [--extra TENSOR] [--retype TENSOR=DTYPE] [--bf16]

--nan TENSOR      the first element of that F32 tensor becomes NaN
--metadata K=V    __metadata__ key K becomes V (added when absent)
--drop TENSOR     that tensor is left out
--extra TENSOR    a tensor of that name (F32, shape [4], zeros) is added
--retype T=DTYPE  tensor T's dtype is relabelled (same element size: F32 -> I32, U32)
--bf16            every F32 tensor becomes BF16, rounded to nearest even
"""
import argparse
import json
import struct
import sys


def to_bf16(data):
    out = bytearray()
    for (bits,) in struct.iter_unpack("<I", data):
        if (bits & 0x7FFFFFFF) > 0x7F800000:  # NaN stays a quiet NaN
            out += struct.pack("<H", (bits >> 16) | 0x40)
            continue
        bits += 0x7FFF + ((bits >> 16) & 1)
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--nan", default=None, metavar="TENSOR")
    p.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--drop", action="append", default=[], metavar="TENSOR")
    p.add_argument("--extra", action="append", default=[], metavar="TENSOR")
    p.add_argument("--retype", action="append", default=[], metavar="TENSOR=DTYPE")
    p.add_argument("--bf16", action="store_true")
    a = p.parse_args()

    with open(a.src, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", None)
    tensors = {}  # name -> [dtype, shape, bytes], in the file's order of offsets
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = t["data_offsets"]
        tensors[name] = [t["dtype"], t["shape"], bytearray(data[begin:end])]
    for kv in a.metadata:
        key, _, value = kv.partition("=")
        metadata = metadata or {}
        metadata[key] = value
    if a.nan is not None:
        t = tensors.get(a.nan)
        if t is None or t[0] != "F32":
            sys.exit(f"edit_safetensors.py: no F32 tensor {a.nan}")
        t[2][0:4] = struct.pack("<f", float("nan"))
    for name in a.drop:
        if tensors.pop(name, None) is None:
            sys.exit(f"edit_safetensors.py: no tensor {name} to drop")
    for name in a.extra:
        tensors[name] = ["F32", [4], bytearray(16)]
    for kv in a.retype:
        name, _, dtype = kv.partition("=")
        tensors[name][0] = dtype
    if a.bf16:
        for t in tensors.values():
            if t[0] == "F32":
                t[0], t[2] = "BF16", to_bf16(t[2])

    out_header = {}
    if metadata is not None:
        out_header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape, payload) in tensors.items():
        out_header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, payload in tensors.values():
            f.write(payload)


if __name__ == "__main__":
    main()
