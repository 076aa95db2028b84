#!/usr/bin/env python3
"""Changes a committed checkpoint the way damage a checksum cannot see would, with only the
standard library, for the CLI tests of what a resume refuses. meta.json's crc32c of the file
changed is recomputed, so only the check of the values (or of meta.json) can refuse it.

  edit_checkpoint.py set STEP_DIR RANK TENSOR INDEX VALUE
      element INDEX of TENSOR in rank RANK's shard becomes VALUE (nan, inf, -inf or a
      number), in the tensor's dtype (F32, BF16 or F16)
  edit_checkpoint.py meta STEP_DIR PATH JSON
      meta.json's field PATH (keys and list indices joined by dots: data.samples_per_step,
      files.0.sha256) becomes the JSON value
"""
import json
import os
import struct
import sys


def crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def encode(dtype, value):
    x = float(value)
    if dtype == "F32":
        return struct.pack("<f", x)
    if dtype == "F16":
        return struct.pack("<e", x)
    if dtype == "BF16":
        (bits,) = struct.unpack("<I", struct.pack("<f", x))
        return struct.pack("<H", bits >> 16)
    sys.exit(f"edit_checkpoint.py: cannot write a value into a {dtype} tensor")


def set_value(step, rank, tensor, index, value):
    name = f"rank_{int(rank):05d}.safetensors"
    path = os.path.join(step, name)
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    meta_path = os.path.join(step, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    entry = next(e for e in meta["files"] if e["name"] == name)
    # The table must be the one the writer used: the file as committed checks first.
    if "%08x" % crc32c(blob) != entry["crc32c"]:
        sys.exit(f"edit_checkpoint.py: {path} does not match its crc32c before the edit")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    t = header.get(tensor)
    if t is None:
        sys.exit(f"edit_checkpoint.py: {path} has no tensor {tensor}")
    raw = encode(t["dtype"], value)
    at = 8 + n + t["data_offsets"][0] + int(index) * len(raw)
    if at + len(raw) > 8 + n + t["data_offsets"][1]:
        sys.exit(f"edit_checkpoint.py: {tensor} has no element {index}")
    blob[at:at + len(raw)] = raw
    with open(path, "wb") as f:
        f.write(blob)
    entry["crc32c"] = "%08x" % crc32c(blob)
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)


def set_meta(step, path, value):
    meta_path = os.path.join(step, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    keys = path.split(".")
    node = meta
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    node[int(last) if isinstance(node, list) else last] = json.loads(value)
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)


def main():
    if len(sys.argv) == 7 and sys.argv[1] == "set":
        set_value(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "meta":
        set_meta(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
