"""zerodp against the PyTorch peer, run in alternation in one invocation.

For each case (size x precision) and each ZeRO stage, runs `zerodp train` and the peer's
matching mode (../shared/peers/torch/train_ref.py) with the same shapes, micro-batch,
sequence length, ranks, optimizer recipe and step count, and prints tokens/s, median step
time, peak RSS per rank, the ratio zerodp / PyTorch, and both runs' losses after the same
steps. Timing rule, both sides: the median step time after the warm-up steps;
tokens/s = global tokens per step / that median.

Before the first run it prints where the figures come from (machine.py): the CPU (lscpu's
model name, cores, and whether it has AMX-BF16, AMX tiles, AVX512-BF16, AVX-512), the matmul
kernels oneDNN ran in a 1-step bf16 probe (--no-probe skips it), and, as the runs report
them, zerodp's calibrated GEMM peak per core in fp32 and bf16. --json writes
{"machine": {...}, "rows": [...]}.

Cases: small and medium as listed under --cases; `large` (12 layers, T = 1024, micro-batch 4
per rank) is not in the default list because on 2 cores one zerodp step takes tens of seconds
and one of the peer's minutes: run it as `--cases large:bf16 --stages 3` (4 steps, 1 warm-up,
900 s per run unless --steps, --warmup, --timeout say otherwise; ~12 min in all).

--model llama runs the same cases with zerodp's `--model llama` (the --size preset of
docs/llama.md: RMSNorm, RoPE, SwiGLU, grouped-query attention, the byte vocabulary) against
llama_peer.py beside this file: train_ref.py's own training (same modes, data, sampler, recipe,
timing) with llama_ref.py's Llama as its model and FSDP wrapping per decoder layer. The default,
--model gpt, is the GPT against train_ref.py, as it always was.

Besides the tables, it prints zerodp's MFU on the model's own GEMM shapes per case and stage:
its flops per token x the median-step tokens/s over the run's calibrated model-shape peak, and
the figure zerodp's stdout gives ("x% of a Y GFLOP/s peak on the model's own GEMM shapes", from
its whole-run tokens/s).

Run it through bench/vs_torch/vs_torch (which installs the peer and builds zerodp).
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import machine

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODES = {0: "ddp", 1: "zero1", 2: "fsdp_grad_op", 3: "fsdp_full"}
STEPS = {"small": 60, "medium": 20, "large": 4}
WARMUP = {"small": 5, "medium": 3, "large": 1}
TIMEOUT = {"small": 240, "medium": 240, "large": 900}  # seconds per run, before one retry


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples: bench/vs_torch/vs_torch --cases small:fp32 --stages 0,3 --repeats 2\n"
               "          bench/vs_torch/vs_torch --cases large:bf16 --stages 3   # long sequences, ~12 min")
    p.add_argument("--zerodp", required=True, help="the zerodp binary")
    p.add_argument("--model", choices=["gpt", "llama"], default="gpt",
                   help="gpt (default): zerodp's GPT against train_ref.py; llama: zerodp's "
                        "--model llama against llama_peer.py (train_ref.py training llama_ref.py's Llama)")
    p.add_argument("--peer-dir", default=os.environ.get("ZERODP_TORCH_PEER") or
                   os.path.join(os.path.dirname(ROOT), "shared", "peers", "torch"),
                   help="where train_ref.py lives (default $ZERODP_TORCH_PEER, else "
                        "../shared/peers/torch beside the project)")
    p.add_argument("--cases", default="small:fp32,medium:fp32,medium:bf16",
                   help="comma-separated SIZE:PRECISION pairs; SIZE small, medium or large (12 layers, "
                        "T = 1024; not in the default, slow); PRECISION fp32 or bf16 (peer: autocast)")
    p.add_argument("--stages", default="0,1,2,3", help="ZeRO stages to run (comma-separated)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per run (default: small 60, medium 20, large 4)")
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the timing (default: small 5, medium 3, large 1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="pairs per (case, stage); the figures are medians over them, and the order "
                        "of zerodp and the peer alternates between repeats")
    p.add_argument("--peer-blas", choices=["avx512", "env"], default="avx512",
                   help="avx512 (default, the peer's best): run the peer without this environment's "
                        "OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE; env: as the environment sets them")
    p.add_argument("--timeout", type=int, default=None,
                   help="seconds before one run is abandoned and retried once (the peer, with the "
                        "AVX-512 OpenBLAS kernel, now and then hangs with one rank gone); default "
                        "small and medium 240, large 900")
    p.add_argument("--no-probe", action="store_true",
                   help="skip the 1-step ONEDNN_VERBOSE run that names oneDNN's bf16 kernels (~1 s)")
    p.add_argument("--json", default=None, help="also write every run's figures to this file")
    p.add_argument("--work-dir", default=None, help="where reports and the text go (default: a temp dir)")
    a = p.parse_args()
    a.case_list = []
    for c in a.cases.split(","):
        size, _, prec = c.partition(":")
        if size not in STEPS or prec not in ("fp32", "bf16"):
            p.error(f"--cases entry '{c}' is not SIZE:PRECISION with SIZE small|medium|large and "
                    "PRECISION fp32|bf16")
        a.case_list.append((size, prec))
    try:
        a.stage_list = [int(s) for s in a.stages.split(",")]
    except ValueError:
        p.error(f"--stages '{a.stages}' is not a comma-separated list of 0..3")
    if any(s not in MODES for s in a.stage_list):
        p.error(f"--stages '{a.stages}': each stage must be 0, 1, 2 or 3")
    if not os.path.isfile(os.path.join(a.peer_dir, "train_ref.py")):
        p.error(f"--peer-dir {a.peer_dir} has no train_ref.py; point it at ../shared/peers/torch")
    peer_sizes = peer_size_choices(a.peer_dir, a.model)
    for size in sorted({size for size, _ in a.case_list}):
        if peer_sizes is not None and size not in peer_sizes:
            p.error(f"--cases asks for size {size}, but the peer {a.peer_dir}/train_ref.py offers "
                    f"--size {'|'.join(peer_sizes)} only; drop {size} from --cases or use a peer that "
                    "has it")
    return a


def peer_script(peer_dir, model):
    """The peer's command, less its flags: train_ref.py for the GPT, llama_peer.py for the llama."""
    if model == "llama":
        return ["/usr/bin/python3", os.path.join(HERE, "llama_peer.py"), "--peer-dir", peer_dir]
    return ["/usr/bin/python3", os.path.join(peer_dir, "train_ref.py")]


def peer_size_choices(peer_dir, model="gpt"):
    """The --size values the peer accepts (from its --help), or None when its help says nothing."""
    try:
        out = subprocess.run(peer_script(peer_dir, model) + ["--help"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"--size \{([^}]*)\}", out)
    return m.group(1).split(",") if m else None


def kjv_text(work):
    """The KJV text the peer reads: the same bytes zerodp's --data kjv prepares."""
    path = os.path.join(work, "kjv.txt")
    if not os.path.exists(path):
        with open(path, "wb") as f:
            subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, stdout=f,
                           check=True)
    return path


def timeout_for(a, size):
    return a.timeout if a.timeout is not None else TIMEOUT[size]


def run_zerodp(a, size, prec, stage, steps, warmup, work, tag):
    report = os.path.join(work, f"z-{tag}.json")
    metrics = os.path.join(work, f"z-{tag}.jsonl")
    for f in (report, metrics):
        if os.path.exists(f):
            os.remove(f)
    model = ["--model", "llama"] if a.model == "llama" else []  # the GPT's command as it was
    cmd = [a.zerodp, "train", *model, "--size", size, "--ranks", str(a.ranks), "--stage", str(stage),
           "--precision", prec, "--steps", str(steps), "--schedule", "constant", "--clip", "0",
           "--decay-all", "--lr", "1e-3", "--eval-batches", "1", "--no-progress",
           "--report", report, "--metrics", metrics]
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout_for(a, size))
    if proc.returncode != 0:
        raise RuntimeError(f"zerodp failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    with open(report) as f:
        r = json.load(f)
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    secs = [l["seconds"] for l in lines]
    tokens = lines[0]["tokens"]
    med = statistics.median(secs[warmup:])
    shape_line = re.search(r"[0-9.]+% of a [0-9.]+ GFLOP/s peak on the model's own GEMM shapes", proc.stdout)
    ledger = [rk["peak_bytes"]["total"] for rk in r["ranks"]]
    outside = [rk.get("outside_ledger_bytes", {}).get("gemm_bf16_copies", 0) for rk in r["ranks"]]
    rss = r["process"]["peak_rss_bytes"]
    return dict(side="zerodp", tokens_per_s=tokens / med, step_s=med,
                rss_mib_per_rank=rss / a.ranks / 2**20, process_rss_mib=rss / 2**20,
                ledger_peak_mib=[b / 2**20 for b in ledger],
                bf16_copies_mib=[b / 2**20 for b in outside],
                losses=[l["loss"] for l in lines], flops_per_token=r["throughput"]["flops_per_token"],
                peak_flops=r["throughput"]["peak_flops"], peak_cores=r["throughput"]["peak_cores"],
                peak_precision=machine.peak_per_core(r)[0],
                peak_gflops_per_core=machine.peak_per_core(r)[1],
                peak_flops_model_shapes=r["throughput"].get("peak_flops_model_shapes"),
                mfu_model_shapes_reported=r["throughput"].get("mfu_model_shapes"),
                mfu_model_shapes_line=shape_line.group(0) if shape_line else None,
                wall_s=time.time() - t0,
                command=" ".join(cmd))


def run_peer(a, size, prec, stage, steps, warmup, text, tag):
    env = dict(os.environ)
    if a.peer_blas == "avx512":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    cmd = peer_script(a.peer_dir, a.model) + [
        "--data", text, "--size", size, "--mode", MODES[stage], "--world", str(a.ranks),
        "--steps", str(steps), "--warmup", str(warmup), "--tag", tag]
    if prec == "bf16":
        cmd += ["--amp", "bf16"]
    last = ""
    for attempt in range(2):  # gloo's rendezvous port can collide with a lingering socket
        t0 = time.time()
        # Its own session, so that a hang is ended with its spawned ranks (its process group)
        # and nothing else.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_for(a, size))
        except subprocess.TimeoutExpired:
            last = f"timed out after {timeout_for(a, size)} s"
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            continue
        line = next((l for l in out.splitlines() if l.startswith("{")), None)
        if proc.returncode == 0 and line:
            r = json.loads(line)
            return dict(side="torch", tokens_per_s=r["tokens_per_s"], step_s=r["step_time_median_s"],
                        rss_mib_per_rank=max(r["peak_rss_mib"]), losses=r["loss_curve"],
                        openblas_core=r.get("openblas_core"), wall_s=time.time() - t0,
                        command=" ".join(cmd))
        last = err[-2000:]
        time.sleep(2)
    raise RuntimeError(f"peer failed twice: {' '.join(cmd)}\n{last}")


def peaks_line(where, peaks, pending):
    """zerodp's calibrated GEMM peak per core (512^3, one thread) in fp32 and bf16, and whence.

    peaks: precision -> the benchmark runs' figures so far; pending: precisions whose runs are
    still to come (empty once the runs are done)."""
    probe = where["onednn"] or {}
    parts = []
    for prec in ("fp32", "bf16"):
        got = peaks.get(prec)
        if got:
            spread = f", {min(got):.1f}-{max(got):.1f}" if len(got) > 1 else ""
            parts.append(f"{prec} {statistics.median(got):.1f} GFLOP/s (median of {len(got)} "
                         f"benchmark run{'s' if len(got) > 1 else ''}{spread})")
        elif probe.get("precision") == prec and "peak_gflops_per_core" in probe:
            parts.append(f"{prec} {probe['peak_gflops_per_core']:.1f} GFLOP/s (the oneDNN probe's run)")
        elif prec in pending:
            parts.append(f"{prec} from the first {prec} run below")
        else:
            parts.append(f"{prec} not measured (no {prec} case)")
    return "# zerodp's calibrated GEMM peak per core (512^3, one thread, at start-up): " + "; ".join(parts)


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def mfu_model_shapes(z):
    """A zerodp run's flops per token x its median-step tokens/s over its calibrated peak on the
    model's own GEMM shapes (None where the report has no such peak)."""
    peak = z.get("peak_flops_model_shapes")
    return z["flops_per_token"] * z["tokens_per_s"] / peak if peak else None


def main():
    a = parse_args()
    work = a.work_dir or tempfile.mkdtemp(prefix="zerodp-vs-torch-")
    os.makedirs(work, exist_ok=True)
    text = kjv_text(work)
    total = len(a.case_list) * len(a.stage_list) * a.repeats
    label = (lambda size: size) if a.model == "gpt" else (lambda size: f"{a.model} {size}")
    peer = "train_ref.py" if a.model == "gpt" else "llama_peer.py (train_ref.py's training, llama_ref.py's Llama)"
    print(f"# model: {a.model}; peer: {peer}", flush=True)
    print(f"# zerodp vs PyTorch: {a.ranks} ranks, {len(a.case_list)} cases x {len(a.stage_list)} stages "
          f"x {a.repeats} repeats = {total} pairs; work dir {work}", flush=True)
    print(f"# peer BLAS: {a.peer_blas} ({'OPENBLAS_CORETYPE unset' if a.peer_blas == 'avx512' else 'environment as set'}); "
          "zerodp: --schedule constant --clip 0 --decay-all --lr 1e-3", flush=True)
    where = dict(cpu=machine.cpu_info(), onednn=None if a.no_probe else machine.onednn_probe(a.zerodp, work))
    print(machine.cpu_line(where["cpu"]), flush=True)
    print(machine.onednn_line(where["onednn"]) if where["onednn"] else "# oneDNN: not probed (--no-probe)",
          flush=True)
    print(peaks_line(where, {}, {prec for _, prec in a.case_list}), flush=True)
    peaks = {}  # precision -> every benchmark run's calibrated GFLOP/s per core
    results = {}
    n = 0
    for rep in range(a.repeats):
        for size, prec in a.case_list:
            steps = a.steps or STEPS[size]
            warmup = a.warmup if a.warmup is not None else WARMUP[size]
            if warmup >= steps:
                sys.exit(f"--warmup {warmup} leaves no timed step of --steps {steps}")
            for stage in a.stage_list:
                n += 1
                tag = f"{size}-{prec}-s{stage}-r{rep}"
                order = ["zerodp", "torch"] if (rep + stage) % 2 == 0 else ["torch", "zerodp"]
                got = {}
                for side in order:
                    if side == "zerodp":
                        got[side] = run_zerodp(a, size, prec, stage, steps, warmup, work, tag)
                    else:
                        got[side] = run_peer(a, size, prec, stage, steps, warmup, text, tag)
                z, t = got["zerodp"], got["torch"]
                if z["peak_precision"] not in peaks:
                    print(f"# calibrated GEMM peak per core, {z['peak_precision']}: "
                          f"{z['peak_gflops_per_core']:.1f} GFLOP/s (zerodp's report of {tag}: "
                          f"peak_flops / peak_cores {z['peak_cores']:g})", flush=True)
                peaks.setdefault(z["peak_precision"], []).append(z["peak_gflops_per_core"])
                print(f"[{n}/{total}] {label(size)} {prec} stage {stage} ({MODES[stage]}): zerodp "
                      f"{z['tokens_per_s']:,.0f} tok/s, torch {t['tokens_per_s']:,.0f} tok/s, "
                      f"ratio {z['tokens_per_s'] / t['tokens_per_s']:.2f}x", flush=True)
                results.setdefault((size, prec, stage), {"zerodp": [], "torch": []})
                results[(size, prec, stage)]["zerodp"].append(z)
                results[(size, prec, stage)]["torch"].append(t)

    print()
    print("| model | precision | stage (peer mode) | zerodp tok/s | PyTorch tok/s | ratio | zerodp step s "
          "| PyTorch step s | zerodp RSS MiB/rank | PyTorch RSS MiB/rank | loss at step 1 (z / pt) "
          "| loss at last step (z / pt) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for (size, prec, stage), runs in results.items():
        z, t = runs["zerodp"], runs["torch"]
        zl, tl = z[0]["losses"], t[0]["losses"]
        last = min(len(zl), len(tl))
        row = dict(model=a.model, size=size, precision=prec, stage=stage, peer_mode=MODES[stage],
                   zerodp_tokens_per_s=med(z, "tokens_per_s"), torch_tokens_per_s=med(t, "tokens_per_s"),
                   zerodp_step_s=med(z, "step_s"), torch_step_s=med(t, "step_s"),
                   zerodp_rss_mib_per_rank=med(z, "rss_mib_per_rank"),
                   torch_rss_mib_per_rank=med(t, "rss_mib_per_rank"),
                   zerodp_process_rss_mib=med(z, "process_rss_mib"),
                   zerodp_ledger_peak_mib=z[0]["ledger_peak_mib"],
                   zerodp_bf16_copies_mib=z[0]["bf16_copies_mib"],
                   zerodp_loss_first=zl[0], torch_loss_first=tl[0],
                   zerodp_loss_last=zl[last - 1], torch_loss_last=tl[last - 1], last_step=last,
                   gflops=med(z, "tokens_per_s") * z[0]["flops_per_token"] / 1e9,
                   peak_gflops=z[0]["peak_flops"] / 1e9, runs=runs)
        row["ratio"] = row["zerodp_tokens_per_s"] / row["torch_tokens_per_s"]
        row["zerodp_tokens_per_s_best"] = max(r["tokens_per_s"] for r in z)
        row["torch_tokens_per_s_best"] = max(r["tokens_per_s"] for r in t)
        row["ratio_best"] = row["zerodp_tokens_per_s_best"] / row["torch_tokens_per_s_best"]
        best = max(z, key=lambda r: r["tokens_per_s"])
        row["zerodp_mfu_model_shapes"] = mfu_model_shapes(best)
        row["zerodp_peak_gflops_model_shapes"] = (best["peak_flops_model_shapes"] / 1e9
                                                  if best.get("peak_flops_model_shapes") else None)
        row["zerodp_mfu_model_shapes_line"] = best["mfu_model_shapes_line"]
        summary.append(row)
        print(f"| {label(size)} | {prec} | {stage} ({MODES[stage]}) | {row['zerodp_tokens_per_s']:,.0f} "
              f"| {row['torch_tokens_per_s']:,.0f} | **{row['ratio']:.2f}x** | {row['zerodp_step_s']:.4f} "
              f"| {row['torch_step_s']:.4f} | {row['zerodp_rss_mib_per_rank']:.0f} "
              f"| {row['torch_rss_mib_per_rank']:.0f} | {zl[0]:.3f} / {tl[0]:.3f} "
              f"| {zl[last - 1]:.3f} / {tl[last - 1]:.3f} (step {last}) |")

    print()
    with_stage0 = [(size, prec) for size, prec in a.case_list if (size, prec, 0) in results]
    if not with_stage0:
        print("# no stage-0 run: the table of stage-3 / stage-0 steps and GFLOP/s needs stage 0 in --stages")
    else:
        print("| model | precision | zerodp stage-3 / stage-0 step | PyTorch FULL_SHARD / DDP step "
              "| zerodp GFLOP/s (stage 0) | GEMM peak GFLOP/s (calibrated, the run's compute) | of peak |")
        print("|---|---|---|---|---|---|---|")
    for size, prec in with_stage0:
        s0 = next(r for r in summary if (r["size"], r["precision"], r["stage"]) == (size, prec, 0))
        s3 = next((r for r in summary if (r["size"], r["precision"], r["stage"]) == (size, prec, 3)), None)
        z_ratio = f"{s3['zerodp_step_s'] / s0['zerodp_step_s']:.3f}x" if s3 else "-"
        t_ratio = f"{s3['torch_step_s'] / s0['torch_step_s']:.3f}x" if s3 else "-"
        print(f"| {label(size)} | {prec} | {z_ratio} | {t_ratio} | {s0['gflops']:.1f} | {s0['peak_gflops']:.1f} "
              f"| {100 * s0['gflops'] / s0['peak_gflops']:.0f}% |")

    print()
    print("| model | precision | stage | zerodp process peak RSS MiB | sum of ledger peaks MiB "
          "| RSS - ledger MiB | of which bf16 operand copies MiB (reported) |")
    print("|---|---|---|---|---|---|---|")
    for r in summary:
        ledger = sum(r["zerodp_ledger_peak_mib"])
        copies = sum(r["zerodp_bf16_copies_mib"])
        print(f"| {label(r['size'])} | {r['precision']} | {r['stage']} | {r['zerodp_process_rss_mib']:.0f} "
              f"| {ledger:.0f} | {r['zerodp_process_rss_mib'] - ledger:.0f} | {copies:.0f} |")

    print()
    print(f"zerodp / PyTorch tokens/s per stage, best of {a.repeats} run{'s' if a.repeats > 1 else ''} "
          "of each side (and the median's ratio, as above); zerodp's MFU on the model's own GEMM "
          "shapes: its best run's flops/token x median-step tokens/s over that run's calibrated "
          "model-shape peak, and what zerodp printed (whole-run tokens/s)")
    print("| model | precision | stage (peer mode) | zerodp tok/s (best) | PyTorch tok/s (best) "
          "| ratio (best) | ratio (median) | zerodp MFU, model shapes | zerodp printed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in summary:
        mfu = r["zerodp_mfu_model_shapes"]
        mfu_text = (f"{100 * mfu:.1f}% of {r['zerodp_peak_gflops_model_shapes']:.1f} GFLOP/s"
                    if mfu is not None else "-")
        print(f"| {label(r['size'])} | {r['precision']} | {r['stage']} ({r['peer_mode']}) "
              f"| {r['zerodp_tokens_per_s_best']:,.0f} | {r['torch_tokens_per_s_best']:,.0f} "
              f"| **{r['ratio_best']:.2f}x** | {r['ratio']:.2f}x | {mfu_text} "
              f"| {r['zerodp_mfu_model_shapes_line'] or '-'} |")

    print()
    print(machine.cpu_line(where["cpu"]))
    if where["onednn"]:
        print(machine.onednn_line(where["onednn"]))
    print(peaks_line(where, peaks, set()))
    where["peak_gflops_per_core"] = {
        prec: dict(median=statistics.median(v), min=min(v), max=max(v), runs=len(v),
                   source="the benchmark's zerodp reports") for prec, v in peaks.items()}
    probe = where["onednn"] or {}
    if "peak_gflops_per_core" in probe and probe["precision"] not in peaks:
        where["peak_gflops_per_core"][probe["precision"]] = dict(
            median=probe["peak_gflops_per_core"], runs=1, source="the oneDNN probe's report")

    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(machine=where, rows=summary), f, indent=1)
        print(f"\n# wrote {a.json}")


if __name__ == "__main__":
    main()
