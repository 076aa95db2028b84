#!/usr/bin/env python3
"""Rewrites a safetensors file with one thing changed, with only the standard library, for the
CLI tests of hostile model files.

  edit_safetensors.py IN OUT [--nan TENSOR] [--metadata KEY=VALUE ...]

--nan TENSOR      the first element of that F32 tensor becomes NaN
--metadata K=V    __metadata__ key K becomes V (added when absent)
"""
import argparse
import json
import struct
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--nan", default=None, metavar="TENSOR")
    p.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args()

    with open(a.src, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = bytearray(blob[8 + n:])
    for kv in a.metadata:
        key, _, value = kv.partition("=")
        header.setdefault("__metadata__", {})[key] = value
    if a.nan is not None:
        t = header.get(a.nan)
        if t is None or t["dtype"] != "F32":
            sys.exit(f"edit_safetensors.py: no F32 tensor {a.nan}")
        begin = t["data_offsets"][0]
        data[begin:begin + 4] = struct.pack("<f", float("nan"))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


if __name__ == "__main__":
    main()
