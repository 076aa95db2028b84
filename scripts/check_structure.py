#!/usr/bin/env python3
"""The code's shape, checked so it does not drift (CI runs it; docs/architecture.md).

* Layering: a file in src/X includes only X's own headers and those of the modules X
  depends on, directly or not, as src/X/CMakeLists.txt's DEPS say: no arrow goes back up.
  Inside src/train, a module too large to be one layer, src/train/LAYERS puts each file in
  a layer, and a file includes train/ headers of its own layer or those below.
* Function length: no function over MAX_FUNCTION lines in src/ and cli/.
* File length: no file in src/ or cli/ over MAX_FILE lines; no test file (tests/**: .cc, .h,
  .sh, .py) over MAX_TEST_FILE.

Functions and files that were longer when the limits came in (src/tensor/gemm.cc, whose
kernels are one file on purpose, among them) are listed in
scripts/structure_baseline.txt with their length then: they may shrink, never grow, and a
line is dropped once its entry is under the limit. `--update` rewrites the baseline from
the tree (only to record a shrink; review the diff).

Function bodies are found on clang-formatted code: a definition at namespace level is a
brace block whose head holds a parenthesis and is not a class, struct, enum, union or an
initializer; its length runs from the first line of its head to its closing brace.
"""
import os
import re
import sys

MAX_FUNCTION = 100
MAX_FILE = 700
MAX_TEST_FILE = 1000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "scripts", "structure_baseline.txt")


def sources():
    for top in ("src", "cli"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith((".cc", ".h")):
                    yield os.path.relpath(os.path.join(d, f), ROOT)


def test_sources():
    for d, _, files in os.walk(os.path.join(ROOT, "tests")):
        for f in sorted(files):
            if f.endswith((".cc", ".h", ".sh", ".py")):
                yield os.path.relpath(os.path.join(d, f), ROOT)


def line_count(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    return len(lines) - (1 if lines and lines[-1] == "" else 0)


def strip_code(line, in_block):
    """The line without comments, string and character literals; and whether a /* */
    comment is still open at its end."""
    out = []
    i = 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i = end + 2
            in_block = False
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            in_block = True
            i += 2
            continue
        if c == 'R' and line.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', line[i:])
            if m:
                close = ")" + m.group(1) + '"'
                end = line.find(close, i + len(m.group(0)))
                i = len(line) if end < 0 else end + len(close)
                out.append('""')
                continue
        if c in "\"'":
            j = i + 1
            while j < len(line) and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out), in_block


def functions(path):
    """(name, first line, length) of each namespace-level function definition."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    found = []
    stack = []  # one entry per open brace: "ns", "func", "other"
    head = []   # (line number, code) since the last statement or block at namespace level
    in_block = False
    func_start = 0
    func_name = "?"
    for n, raw in enumerate(lines, 1):
        code, in_block = strip_code(raw, in_block)
        if code.lstrip().startswith("#"):
            continue
        cur = ""  # this line's text since the last brace or statement end
        for ch in code:
            outside = all(s == "ns" for s in stack)
            if ch == "{":
                kind = "other"
                if outside:
                    text = " ".join([c for _, c in head] + [cur]).strip()
                    first = head[0][0] if head else n
                    if re.match(r"^(inline\s+)?namespace\b", text) or text.startswith('extern "C"'):
                        kind = "ns"
                    elif "(" in text and not re.match(
                            r"^(template\s*<.*>\s*)?(class|struct|enum|union)\b", text) \
                            and not text.endswith("="):
                        kind = "func"
                        func_start = first
                        m = re.search(r"([~\w:]+)\s*\(", text)
                        func_name = m.group(1) if m else "?"
                stack.append(kind)
                head, cur = [], ""
            elif ch == "}":
                kind = stack.pop() if stack else "other"
                if kind == "func":
                    found.append((func_name, func_start, n - func_start + 1))
                head, cur = [], ""
            elif ch == ";" and outside:
                head, cur = [], ""
            else:
                cur += ch
        if all(s == "ns" for s in stack) and cur.strip():
            head.append((n, cur.strip()))
    return found, len(lines) - (1 if lines and lines[-1] == "" else 0)


def module_deps():
    deps = {}
    for d in os.listdir(os.path.join(ROOT, "src")):
        cm = os.path.join(ROOT, "src", d, "CMakeLists.txt")
        if os.path.isfile(cm):
            with open(cm, encoding="utf-8") as f:
                deps[d] = set(re.findall(r"zerodp::(\w+)", f.read()))
    closure = {}

    def reach(m, seen):
        for d in deps.get(m, ()):
            if d not in seen:
                seen.add(d)
                reach(d, seen)
        return seen

    for m in deps:
        closure[m] = reach(m, set())
    return closure


def check_layering(closure):
    problems = []
    for path in sources():
        parts = path.split(os.sep)
        if parts[0] != "src":
            continue
        mine = parts[1]
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = re.match(r'#include "(\w+)/', line)
                if not m:
                    continue
                other = m.group(1)
                if other != mine and other in closure and other not in closure.get(mine, set()):
                    problems.append(
                        f"{path}:{n}: src/{mine} includes {other}/, which it does not depend on "
                        f"(src/{mine}/CMakeLists.txt's DEPS reach {sorted(closure.get(mine, []))})")
    return problems


LAYERS = os.path.join(ROOT, "src", "train", "LAYERS")


def read_layers():
    """{file stem: (layer index, layer name)} from src/train/LAYERS ("name: stems...", a
    line that starts with blanks continuing the one before)."""
    layers = {}
    names = []
    with open(LAYERS, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            if not line[0].isspace():
                name, _, rest = line.partition(":")
                names.append(name.strip())
            else:
                rest = line
            for stem in rest.split():
                layers[stem] = (len(names) - 1, names[-1])
    return layers


def check_train_layers():
    layers = read_layers()
    problems = []
    train = os.path.join("src", "train")
    for path in sources():
        if os.path.dirname(path) != train:
            continue
        mine = os.path.splitext(os.path.basename(path))[0]
        if mine not in layers:
            problems.append(f"{path}: in no layer of src/train/LAYERS; give it one")
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = re.match(r'#include "train/(\w+)\.h"', line)
                if not m or m.group(1) == mine:
                    continue
                other = m.group(1)
                if other not in layers:
                    problems.append(f"{path}:{n}: train/{other}.h is in no layer of src/train/LAYERS")
                elif layers[other][0] > layers[mine][0]:
                    problems.append(
                        f"{path}:{n}: {mine} ({layers[mine][1]} layer) includes train/{other}.h of "
                        f"the {layers[other][1]} layer above it (src/train/LAYERS)")
    return problems


def measure():
    long_functions = {}
    long_files = {}
    for path in sources():
        found, total = functions(path)
        if total > MAX_FILE:
            long_files[path] = total
        for name, start, length in found:
            if length > MAX_FUNCTION:
                long_functions[f"{path} {name}"] = max(length, long_functions.get(f"{path} {name}", 0))
    for path in test_sources():
        total = line_count(path)
        if total > MAX_TEST_FILE:
            long_files[path] = total
    return long_functions, long_files


def limit_of(key):
    if not key.endswith(" (file)"):
        return MAX_FUNCTION
    return MAX_TEST_FILE if key.startswith("tests" + os.sep) else MAX_FILE


def read_baseline():
    base = {}
    if os.path.exists(BASELINE):
        with open(BASELINE, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    key, length = line.rsplit(" ", 1)
                    base[key] = int(length)
    return base


def main():
    long_functions, long_files = measure()
    now = {**{k: v for k, v in long_functions.items()},
           **{f"{k} (file)": v for k, v in long_files.items()}}
    if "--update" in sys.argv:
        with open(BASELINE, "w", encoding="utf-8") as f:
            f.write(f"# Written by scripts/check_structure.py --update: functions over "
                    f"{MAX_FUNCTION} lines, files over {MAX_FILE}\n# and test files over "
                    f"{MAX_TEST_FILE}, with their length when recorded. They may shrink, never "
                    f"grow;\n# new ones may not appear.\n")
            for key in sorted(now):
                f.write(f"{key} {now[key]}\n")
        print(f"check_structure: baseline written, {len(now)} entries")
        return 0
    base = read_baseline()
    problems = check_layering(module_deps()) + check_train_layers()
    for key, length in sorted(now.items()):
        limit = limit_of(key)
        if key not in base:
            problems.append(f"{key}: {length} lines, over the limit of {limit}; split it")
        elif length > base[key]:
            problems.append(f"{key}: {length} lines, grown from {base[key]} (the limit is "
                            f"{limit}); split it rather than add to it")
    stale = sorted(k for k in base if k not in now)
    for p in problems:
        print(f"check_structure: {p}")
    if stale:
        print(f"check_structure: {len(stale)} baseline entries are now under the limit; run "
              f"scripts/check_structure.py --update to drop them: {', '.join(stale)}")
    if problems:
        return 1
    print(f"check_structure: layering holds; {len(now)} functions or files over the limits, "
          f"none grown (scripts/structure_baseline.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
