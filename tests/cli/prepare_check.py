#!/usr/bin/env python3
"""Checks a directory zerodp prepare wrote against its inputs, by the documented rules alone.

usage: prepare_check.py SHARD_DIR TOKENIZER BOS VAL_EVERY BLOCK_BYTES NUL_ID OUT_DIR INPUT...

Reads manifest.json and every shard (llm.c's header: 256 int32, magic 20240520, version 1,
the count; uint16 tokens), checks the manifest's fields, and rebuilds from the inputs what
each split must hold: the inputs in order (a directory's files recursively, in byte order
of their paths below it, names starting with '.' skipped; *.jsonl a document per non-blank
line, its "text"), text files cut into blocks ending at the first newline at or past
BLOCK_BYTES, every VAL_EVERY-th block (counted from 1 over all inputs) to validation, and a
bos before each run of a document's consecutive blocks in one split. Writes OUT_DIR/SPLIT.ids
(the split's tokens with each bos replaced by NUL_ID, the NUL byte's token, for one decode
call) and OUT_DIR/SPLIT.expected (the runs, each after a NUL), for the caller to decode and
compare; and OUT_DIR/first_run.txt and first_run.ids (the first training run's text and
tokens). Exits 1 naming the first difference.
"""
import hashlib
import json
import os
import struct
import sys


def fail(message):
    print(f"prepare_check: {message}")
    sys.exit(1)


def files_of(path):
    if not os.path.isdir(path):
        return [path]
    found = []
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in files:
            if not f.startswith("."):
                full = os.path.join(d, f)
                found.append((os.path.relpath(full, path).encode(), full))
    return [full for _, full in sorted(found)]


def blocks_of(path, block_bytes, documents):
    """(document, text bytes) for each block of one input file."""
    data = open(path, "rb").read()
    if path.endswith(".jsonl"):
        out = []
        for line in data.split(b"\n"):
            if line.strip(b" \t\r") == b"":
                continue
            out.append((next(documents), json.loads(line)["text"].encode("utf-8")))
        return out
    doc = next(documents)
    if not data:
        return [(doc, b"")]
    out, at = [], 0
    while at < len(data):
        nl = data.find(b"\n", at + block_bytes - 1)
        end = len(data) if nl < 0 else nl + 1
        out.append((doc, data[at:end]))
        at = end
    return out


def read_split(directory, entries):
    tokens = []
    for e in entries:
        raw = open(os.path.join(directory, e["file"]), "rb").read()
        magic, version, count = struct.unpack_from("<3i", raw)
        if (magic, version) != (20240520, 1) or e["token_bytes"] != 2:
            fail(f"{e['file']}: header {magic} {version}, token_bytes {e['token_bytes']}")
        if count != e["tokens"] or len(raw) != 1024 + 2 * count or e["bytes"] != len(raw):
            fail(f"{e['file']}: count {count}, {len(raw)} bytes, manifest {e}")
        if any(raw[12:1024]):
            fail(f"{e['file']}: header past the count is not zeros")
        tokens += struct.unpack_from(f"<{count}H", raw, 1024)
    return tokens


def main():
    shard_dir, model, bos, val_every, block_bytes, nul, out = sys.argv[1:8]
    bos, val_every, block_bytes, nul = int(bos), int(val_every), int(block_bytes), int(nul)
    inputs = sys.argv[8:]
    m = json.load(open(os.path.join(shard_dir, "manifest.json")))
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    if m["format"] != "zerodp-token-shards-1" or m["tokenizer"]["sha256"] != sha:
        fail(f"format or tokenizer: {m['format']} {m['tokenizer']}")
    if m["dropped"] != {"blank_lines": 1, "empty_documents": 1}:
        fail(f"dropped: {m['dropped']}")
    content = {k: v for k, v in m.items() if k != "digest"}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"),
                                       ensure_ascii=False).encode()).hexdigest()
    if digest != m["digest"]:
        fail(f"digest {m['digest']}, content's {digest}")

    documents = iter(range(1 << 40))
    blocks = []
    for path in inputs:
        for f in files_of(path):
            blocks += blocks_of(f, block_bytes, documents)
    runs = {"train": [], "val": []}
    open_run = None
    for i, (doc, text) in enumerate(blocks):
        split = "val" if (i + 1) % val_every == 0 else "train"
        if not text:
            continue
        if open_run != (doc, split):
            runs[split].append(b"")
            open_run = (doc, split)
        runs[split][-1] += text
    if not runs["val"] or len(runs["val"]) >= len(runs["train"]):
        fail(f"{len(runs['train'])} train runs, {len(runs['val'])} validation runs")

    os.makedirs(out, exist_ok=True)
    for split, key in (("train", "train"), ("val", "validation")):
        tokens = read_split(shard_dir, m[key]["shards"])
        if sum(len(r) for r in runs[split]) != m[key]["text_bytes"]:
            fail(f"{key}.text_bytes {m[key]['text_bytes']}, the runs hold "
                 f"{sum(len(r) for r in runs[split])}")
        if tokens.count(bos) != len(runs[split]) or tokens[0] != bos:
            fail(f"{split}: {tokens.count(bos)} bos ids for {len(runs[split])} runs")
        if max(tokens) > m["largest_token"] or m["largest_token"] >= 1000:
            fail(f"largest_token {m['largest_token']}")
        with open(os.path.join(out, f"{split}.ids"), "w") as f:
            f.write(" ".join(str(nul if t == bos else t) for t in tokens) + "\n")
        with open(os.path.join(out, f"{split}.expected"), "wb") as f:
            f.write(b"".join(b"\0" + r for r in runs[split]))
        if split == "train":
            second = tokens.index(bos, 1)
            with open(os.path.join(out, "first_run.ids"), "w") as f:
                f.write("\n".join(str(t) for t in tokens[1:second]))
            with open(os.path.join(out, "first_run.txt"), "wb") as f:
                f.write(runs["train"][0])
    print(f"prepare_check: {len(blocks)} blocks; train {len(runs['train'])} runs, "
          f"validation {len(runs['val'])} runs; manifest and headers as documented")


main()
