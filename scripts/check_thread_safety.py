#!/usr/bin/env python3
"""clang's thread-safety analysis over every source that uses core/mutex.h.

The annotations in src/core/mutex.h (GUARDED_BY, REQUIRES, ...) expand to nothing under GCC,
which builds the project; this runs clang in -fsyntax-only mode (no code generated) with
-Wthread-safety as an error over the translation units that include core/mutex.h, directly
or through a header, with each unit's include paths and defines from the build's
compile_commands.json. Usage: scripts/check_thread_safety.py [BUILD_DIR] (default
build/release). Exit 1 on any finding, naming it.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "release")
commands_path = os.path.join(build, "compile_commands.json")
if not os.path.exists(commands_path):
    sys.exit(f"check_thread_safety: {commands_path} is missing; configure first "
             "(cmake --preset release)")
include = re.compile(r'#include "([^"]+)"')


def includes(path):
    with open(path, encoding="utf-8") as f:
        return include.findall(f.read())


# Headers that reach core/mutex.h, to a fixed point.
headers = {}
for d in ("src", "cli"):
    for dirpath, _, names in os.walk(os.path.join(root, d)):
        for n in names:
            if n.endswith(".h"):
                p = os.path.join(dirpath, n)
                headers[os.path.relpath(p, os.path.join(root, "src"))] = includes(p)
users = {"core/mutex.h"}
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
    units.append((rel, ["clang++", "-fsyntax-only", "-Wthread-safety",
                        "-Werror=thread-safety", *keep, src], e["directory"]))


def check(unit):
    rel, cmd, cwd = unit
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return rel, r.returncode, r.stderr


failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for rel, code, err in pool.map(check, sorted(units)):
        if code != 0:
            failed += 1
            print(err.strip(), file=sys.stderr)
print(f"check_thread_safety: {len(units)} translation units using core/mutex.h, "
      f"{failed} with findings")
sys.exit(1 if failed else 0)
