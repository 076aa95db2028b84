"""Where a benchmark figure came from: the CPU, what oneDNN chose on it, zerodp's calibrated peaks.

A figure from bench/vs_torch only carries over to another machine together with these: the
same step runs 3x faster in bf16 on a CPU with AMX tiles than on one with AVX512-BF16 alone.

cpu_info()            lscpu's model name, cores, and the flags that decide the GEMM kernels
onednn_probe(...)     one 1-step `zerodp train --size small --precision bf16` with
                      ONEDNN_VERBOSE=1: oneDNN's version, its ISA line, the matmul kernels it ran,
                      and that run's calibrated bf16 peak per core (from its --report)
peak_per_core(report) a zerodp report's calibrated GEMM peak per core and its precision
"""

import collections
import json
import os
import subprocess

# lscpu flag -> what the flag means for a bf16 or fp32 product.
FEATURES = (
    ("amx_bf16", "AMX-BF16"),
    ("amx_tile", "AMX tiles"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512f", "AVX-512"),
)


def _lscpu():
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.partition(":")[2].split()
    except OSError:
        pass
    return []


def cpu_info():
    """The CPU this process runs on; fields lscpu lacks are None, never guessed."""
    f = _lscpu()
    flags = set(f.get("Flags", "").split()) or set(_cpuinfo_flags())

    def number(key):
        try:
            return int(f[key])
        except (KeyError, ValueError):
            return None

    per_socket, sockets = number("Core(s) per socket"), number("Socket(s)")
    return dict(
        model=f.get("Model name"),
        vendor=f.get("Vendor ID"),
        cores=per_socket * sockets if per_socket and sockets else None,
        logical_cpus=number("CPU(s)"),
        usable_cpus=len(os.sched_getaffinity(0)),
        flags={flag: flag in flags for flag, _ in FEATURES},
        source="lscpu" if f else "/proc/cpuinfo",
    )


def cpu_line(c):
    feats = ", ".join(f"{name} {'yes' if c['flags'][flag] else 'no'}" for flag, name in FEATURES)
    cores = f"{c['cores']} cores" if c["cores"] else "cores unknown"
    return (f"# CPU: {c['model'] or 'unknown model'}, {cores} ({c['logical_cpus']} logical CPUs, "
            f"{c['usable_cpus']} usable by this process); {feats} ({c['source']} flags "
            "amx_bf16, amx_tile, avx512_bf16, avx512f)")


def peak_per_core(report):
    """(precision, GFLOP/s per core) of a zerodp report: its calibrated GEMM peak / its cores."""
    t = report["throughput"]
    return report["config"]["precision"], t["peak_flops"] / t["peak_cores"] / 1e9


def onednn_probe(zerodp, work, timeout=120):
    """What oneDNN picks for bf16 products here, from one short verbose run; never raises.

    The matmul kernel names (e.g. brg:avx512_core_amx on AMX, brg:avx512_core_bf16 with
    AVX512-BF16 alone, gemm:jit for small shapes) come from oneDNN's own verbose lines; fp32
    products go through dnnl_sgemm, which prints none.
    """
    report = os.path.join(work, "onednn-probe.json")
    cmd = [zerodp, "train", "--size", "small", "--ranks", "1", "--steps", "1", "--precision", "bf16",
           "--eval-batches", "1", "--no-progress", "--report", report]
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return dict(error=f"{type(e).__name__}: {e}", command=" ".join(cmd))
    if proc.returncode != 0:
        return dict(error=f"exit {proc.returncode}: {proc.stdout.strip()[-300:]}", command=" ".join(cmd))
    version, isa = None, None
    kernels = collections.Counter()
    for line in proc.stdout.splitlines():
        if not line.startswith(("onednn_verbose", "dnnl_verbose")):
            continue
        fields = line.split(",")
        if "isa:" in line and isa is None:
            isa = line.partition("isa:")[2].strip()
        elif version is None and any(x.strip().startswith(("oneDNN v", "DNNL v")) for x in fields):
            version = next(x.split()[1] for x in fields if x.strip().startswith(("oneDNN v", "DNNL v")))
        elif "exec" in fields:
            i = fields.index("exec")  # then engine, primitive kind, implementation
            if len(fields) > i + 3:
                kernels[f"{fields[i + 2]} {fields[i + 3]}"] += 1
    out = dict(version=version, isa=isa, kernels=dict(kernels.most_common()), command=" ".join(cmd))
    try:
        with open(report) as f:
            out["precision"], out["peak_gflops_per_core"] = peak_per_core(json.load(f))
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        pass
    if not kernels:
        out["error"] = "oneDNN printed no exec lines (ONEDNN_VERBOSE not honoured by this build?)"
    return out


def onednn_line(p):
    if p.get("error") and not p.get("kernels"):
        return f"# oneDNN: probe failed ({p['error']})"
    ks = ", ".join(f"{k} x{n}" for k, n in p["kernels"].items())
    return (f"# oneDNN {p.get('version') or '(version not printed)'}: isa \"{p.get('isa') or '?'}\"; "
            f"bf16 products in a 1-step small run: {ks}")
