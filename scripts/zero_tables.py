#!/usr/bin/env python3
"""Regenerates docs/zero.md from real `zerodp train --report` runs.

Every number in the generated tables comes from a report written by this script's runs:
per-rank model-state memory by category, peak memory, communication per step by collective,
and throughput, for stages 0-3 at N = 1, 2, 4, 8 local ranks.

    scripts/zero_tables.py [--zerodp build/release/cli/zerodp] [--out docs/zero.md]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "zero_template.md")


def mib(b):
    return f"{b / 2**20:.2f}"


def run(zerodp, n, stage, args, tmp):
    path = os.path.join(tmp, f"r{n}_{stage}.json")
    cmd = [zerodp, "train", "--ranks", str(n), "--stage", str(stage), "--no-progress",
           "--report", path] + args
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f), " ".join(["zerodp"] + cmd[1:-2])


def tables(zerodp, args):
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        reports = {}
        for n in (1, 2, 4, 8):
            for stage in range(4):
                reports[(n, stage)] = run(zerodp, n, stage, args, tmp)
        r0 = reports[(1, 0)][0]
        phi = r0["params"]
        out.append(f"Model: GPT `{r0['config']['size']}`, Φ = {phi:,} parameters, "
                   f"{r0['precision']}, micro-batch {r0['config']['micro_batch']}, "
                   f"{r0['config']['steps']} steps. Command for each cell: "
                   f"`{reports[(4, 3)][1]}` with `--ranks` and `--stage` varied.\n")
        out.append("### Model states per rank (rank 0, MiB), measured by the memory ledger\n")
        out.append("| N | stage | params | grads | master | adam_m | adam_v | total | 16Φ/N·(stage formula) |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for n in (1, 2, 4, 8):
            for stage in range(4):
                r = reports[(n, stage)][0]
                m = r["ranks"][0]["model_state_bytes"]
                total = sum(m.values())
                # The ZeRO paper's per-rank formula for 16-bit precisions, Φ divisible by N.
                formula = [16 * phi, 4 * phi + 12 * phi / n, 2 * phi + 14 * phi / n, 16 * phi / n][stage]
                out.append(f"| {n} | {stage} | {mib(m['params'])} | {mib(m['grads'])} | "
                           f"{mib(m['master'])} | {mib(m['adam_m'])} | {mib(m['adam_v'])} | "
                           f"**{mib(total)}** | {mib(formula)} |")
        out.append("")
        out.append("### Peak memory per rank (rank 0, MiB): model states plus transients\n")
        out.append("| N | stage | gathered | grad_buckets | activations | comm_buffers | workspace | peak total |")
        out.append("|---|---|---|---|---|---|---|---|")
        for n in (1, 2, 4, 8):
            for stage in range(4):
                p = reports[(n, stage)][0]["ranks"][0]["peak_bytes"]
                out.append(f"| {n} | {stage} | {mib(p['gathered'])} | {mib(p['grad_buckets'])} | "
                           f"{mib(p['activations'])} | {mib(p['comm_buffers'])} | "
                           f"{mib(p['workspace'])} | **{mib(p['total'])}** |")
        out.append("")
        out.append("### Communication per step, summed over ranks (MiB), and throughput\n")
        out.append("Bytes each rank received from its peers, summed over ranks and divided by the "
                   "steps; Φw(N−1) is one ring reduce-scatter or all-gather of the model.\n")
        out.append("| N | stage | all_reduce | reduce_scatter | all_gather | total | ÷ Φw(N−1) | tokens/s |")
        out.append("|---|---|---|---|---|---|---|---|")
        for n in (1, 2, 4, 8):
            for stage in range(4):
                r = reports[(n, stage)][0]
                steps = len(r["steps"])
                w = 4 if r["precision"] == "fp32" else 2
                s = {k: sum(rank["comm"][k]["bytes"] for rank in r["ranks"]) / steps
                     for k in ("all_reduce", "reduce_scatter", "all_gather")}
                total = sum(s.values())
                ratio = f"{total / (phi * w * (n - 1)):.2f}" if n > 1 else "–"
                out.append(f"| {n} | {stage} | {mib(s['all_reduce'])} | {mib(s['reduce_scatter'])} | "
                           f"{mib(s['all_gather'])} | **{mib(total)}** | {ratio} | "
                           f"{r['throughput']['tokens_per_second']:.0f} |")
        hashes = {stage: reports[(4, stage)][0]["final"]["weights_sha256"] for stage in range(4)}
        out.append("")
        same = len(set(hashes.values())) == 1
        out.append(f"At N = 4 the four stages ended with weights_sha256 "
                   f"`{hashes[0][:16]}…`{' — the same for every stage' if same else ' (DIFFERENT: a bug)'}.")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zerodp", default="build/release/cli/zerodp")
    p.add_argument("--out", default="docs/zero.md")
    p.add_argument("--steps", default="6")
    a = p.parse_args()
    args = ["--size", "small", "--steps", a.steps]
    body = tables(a.zerodp, args)
    with open(TEMPLATE) as f:
        text = f.read().replace("{{TABLES}}", body)
    with open(a.out, "w") as f:
        f.write(text)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
