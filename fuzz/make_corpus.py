#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/safetensors_fuzz.cc: small valid safetensors files and
slightly broken ones, one per rejection rule, so the fuzzer starts next to every branch.

    fuzz/make_corpus.py [DIR]    (default fuzz/corpus/safetensors, the checked-in copy)
"""
import json
import pathlib
import struct
import sys


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def file_bytes(header, data_bytes, length=None, pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:  # as zerodp's writer and the reference implementation: data 8-aligned
        text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + bytes((7 * i + 1) % 256 for i in range(data_bytes))


def corpus():
    one = {"w": entry("F32", [2], 0, 8)}
    mixed = {
        "__metadata__": {"format": "zerodp", "step": "12"},
        "weight": entry("F32", [3, 5], 0, 60),
        "bias": entry("BF16", [7], 60, 74),
        "empty": entry("F32", [0, 4], 74, 74),
        "scales": entry("F16", [2, 3, 4], 74, 122),
        "step": entry("F32", [], 122, 126),
    }
    foreign = {  # key order unlike data order, a hole, other element types
        "b": entry("I64", [2], 24, 40),
        "a": entry("BOOL", [3], 0, 3),
        "c": entry("U8", [1, 1, 1], 40, 41),
        "d": entry("F64", [1], 48, 56),
        "e": entry("I32", [1], 56, 60),
        "f": entry("I16", [1], 60, 62),
        "g": entry("I8", [1], 62, 63),
    }
    valid_file = file_bytes(one, 8)
    yield "valid_empty", file_bytes({}, 0)
    yield "valid_one", valid_file
    yield "valid_mixed", file_bytes(mixed, 126)
    yield "valid_foreign_unpadded", file_bytes(foreign, 64, pad=False)
    yield "valid_metadata_only", file_bytes({"__metadata__": {"k": "v", "\u00e9": "\u2603"}}, 0)
    yield "broken_short", b"\x10\x00\x00"
    yield "broken_length_past_file", file_bytes(one, 8, length=1000)
    yield "broken_length_huge", file_bytes(one, 8, length=1 << 62)
    yield "broken_truncated_header", valid_file[: len(valid_file) - 20]
    yield "broken_truncated_data", valid_file[:-1]
    yield "broken_not_object", file_bytes([1, 2], 0)
    yield "broken_not_json", file_bytes(b'{"w":{"dtype":"F32",', 8)
    yield "broken_nul", file_bytes(b"{}\x00x", 0, pad=False)
    yield "broken_duplicate_tensor", file_bytes(
        b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8)
    yield "broken_duplicate_field", file_bytes(
        b'{"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}', 8)
    yield "broken_missing_field", file_bytes({"w": {"dtype": "F32", "shape": [2]}}, 8)
    yield "broken_extra_field", file_bytes({"w": dict(entry("F32", [2], 0, 8), extra=1)}, 8)
    yield "broken_unknown_dtype", file_bytes({"w": entry("F8_E4M3", [8], 0, 8)}, 8)
    yield "broken_negative_dim", file_bytes({"w": entry("F32", [-2], 0, 8)}, 8)
    yield "broken_float_offset", file_bytes(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}', 8)
    yield "broken_overflow", file_bytes({"w": entry("F32", [1 << 32, 1 << 32], 0, 8)}, 8)
    yield "broken_size_mismatch", file_bytes({"w": entry("F32", [3], 0, 8)}, 8)
    yield "broken_begin_after_end", file_bytes({"w": entry("U8", [0], 8, 4)}, 8)
    yield "broken_past_data", file_bytes({"w": entry("F32", [4], 0, 16)}, 8)
    yield "broken_overlap", file_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, 12)
    yield "broken_metadata_value", file_bytes({"__metadata__": {"step": 12}}, 0)
    yield "broken_metadata_duplicate", file_bytes(b'{"__metadata__":{"k":"a","k":"b"}}', 0)


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                       pathlib.Path(__file__).parent / "corpus" / "safetensors")
    out.mkdir(parents=True, exist_ok=True)
    for name, data in corpus():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main()
