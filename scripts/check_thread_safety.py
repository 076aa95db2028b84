#!/usr/bin/env python3
"""clang's thread-safety analysis over every source that uses core/mutex.h.

The annotations of src/core/thread_annotations.h (GUARDED_BY, REQUIRES, ...), on the Mutex
of src/core/mutex.h, expand to nothing under GCC, which builds the project; this runs clang
in -fsyntax-only mode (no code generated) with -Wthread-safety as an error over the
translation units of src/ and cli/ that include either header, directly or through others
(no other unit can hold an annotation, so no other can have a finding), with each unit's
include paths, defines and -std from the build's compile_commands.json. An annotation clang
ignores (GUARDED_BY on a local variable) is an error too.

Usage: scripts/check_thread_safety.py [-j JOBS] [BUILD_DIR] (default build/release; JOBS
defaults to the core count). Exit 1 on any finding, naming it.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
jobs = os.cpu_count() or 2
if args[:1] == ["-j"] and len(args) >= 2:
    jobs = max(1, int(args[1]))
    args = args[2:]
build = args[0] if args else os.path.join(root, "build", "release")
commands_path = os.path.join(build, "compile_commands.json")
if not os.path.exists(commands_path):
    sys.exit(f"check_thread_safety: {commands_path} is missing; configure first "
             "(cmake --preset release)")
include = re.compile(r'#include "([^"]+)"')


search = [os.path.join(root, "src"), os.path.join(root, "cli")]


def includes(path):
    """The project headers `path` includes, as real paths: a quoted include is looked up
    beside the file first, then in src/ and cli/ (as the compiler does)."""
    with open(path, encoding="utf-8") as f:
        names = include.findall(f.read())
    out = set()
    for name in names:
        for d in [os.path.dirname(path)] + search:
            candidate = os.path.realpath(os.path.join(d, name))
            if os.path.isfile(candidate):
                out.add(candidate)
                break
    return out


# Headers that reach the annotations, to a fixed point.
headers = {}
for d in search:
    for dirpath, _, names in os.walk(d):
        for n in names:
            if n.endswith(".h"):
                p = os.path.realpath(os.path.join(dirpath, n))
                headers[p] = includes(p)
users = {os.path.realpath(os.path.join(root, "src", "core", h))
         for h in ("mutex.h", "thread_annotations.h")}
changed = True
while changed:
    changed = False
    for h, inc in headers.items():
        if h not in users and users.intersection(inc):
            users.add(h)
            changed = True

with open(commands_path, encoding="utf-8") as f:
    entries = json.load(f)
units = []
for e in entries:
    src = os.path.realpath(e["file"])
    rel = os.path.relpath(src, root)
    if not (rel.startswith("src/") or rel.startswith("cli/")) or not src.endswith(".cc"):
        continue
    if not users.intersection(includes(src)):
        continue
    args = shlex.split(e["command"]) if "command" in e else e["arguments"]
    keep = []
    it = iter(args[1:])
    for a in it:
        if a in ("-I", "-isystem", "-D"):
            keep += [a, next(it)]
        elif a.startswith(("-I", "-isystem", "-D", "-std=")):
            keep.append(a)
    # -Werror=ignored-attributes: an annotation where clang ignores it (GUARDED_BY on a
    # local variable) would otherwise pass unchecked.
    units.append((rel, ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                        "-Werror=ignored-attributes", *keep, src], e["directory"]))


def check(unit):
    rel, cmd, cwd = unit
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return rel, r.returncode, r.stderr


failed = 0
start = time.monotonic()
with ThreadPoolExecutor(max_workers=jobs) as pool:
    for rel, code, err in pool.map(check, sorted(units)):
        if code != 0:
            failed += 1
            print(err.strip(), file=sys.stderr)
print(f"check_thread_safety: {len(units)} translation units using core/mutex.h, "
      f"{failed} with findings ({time.monotonic() - start:.0f} s, {jobs} jobs)")
sys.exit(1 if failed else 0)
