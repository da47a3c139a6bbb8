"""What the PyTorch references (bench/torch_*.py) share: the report header the C++ benchmarks
write (bench/common/report.h), CUDA-event timing and the copy bandwidth, measured as theirs."""
import json
import os
import subprocess
from pathlib import Path

import torch

SCHEMA_VERSION = 1  # bench/common/report.h: kReportSchemaVersion


def source_commit():
    """$GPU_CHECK_COMMIT (scripts/gpu_check.sh), else the checkout's commit, else "unknown"."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, check=True)
        return git.stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(bench, **fields):
    """The header (schema_version, bench, device, commit, torch), then `fields`."""
    return {
        "schema_version": SCHEMA_VERSION,
        "bench": bench,
        "device": torch.cuda.get_device_name(0),
        "commit": source_commit(),
        "torch": torch.__version__,
        **fields,
    }


def write_report(path, result):
    """Writes `result` to `path`; nothing when `path` is empty (no --json given)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def time_us(fn, iters, repeats, warmup=3):
    """Median microseconds per call of fn(i) over `repeats` runs of `iters` calls between CUDA
    events, after `warmup` calls; the upper median, as the C++ benchmarks report."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        for i in range(iters):
            fn(i)
        stop.record()
        stop.synchronize()
        samples.append(1000.0 * start.elapsed_time(stop) / iters)
    return sorted(samples)[len(samples) // 2]


_copy_gbps = {}


def copy_gbps(nbytes, iters, repeats, rotation_bytes=0):
    """Device-to-device copy bandwidth (read + write) for `nbytes` of traffic, measured once per
    byte count; with rotation_bytes, rotating over as many buffer pairs as fit in it."""
    if nbytes not in _copy_gbps:
        half = nbytes // 2
        copies = max(1, rotation_bytes // nbytes)
        src = [torch.ones(half, dtype=torch.uint8, device="cuda") for _ in range(copies)]
        dst = [torch.empty_like(s) for s in src]
        us = time_us(lambda i: dst[i % copies].copy_(src[i % copies]), iters, repeats)
        _copy_gbps[nbytes] = 2 * half / us / 1e3
    return _copy_gbps[nbytes]


def bandwidth(nbytes, us, iters, repeats, rotation_bytes=0):
    """`us` for `nbytes` of traffic against the copy of as many bytes: a result's us, gbps,
    copy_gbps and pct_copy, as the C++ benchmarks' KernelBench::bandwidth."""
    copy = copy_gbps(nbytes, iters, repeats, rotation_bytes)
    gbps = nbytes / us / 1e3
    return {"us": us, "gbps": gbps, "copy_gbps": copy, "pct_copy": 100 * gbps / copy}

# The columns bench/common's Bandwidth prints: us, GB/s, copy and % copy.
BANDWIDTH_TITLES = f"{'us':>10} {'GB/s':>8} {'copy':>8} {'% copy':>8}"


def bandwidth_cells(r):
    """A bandwidth() result's us, GB/s, copy and % copy, under BANDWIDTH_TITLES."""
    return f"{r['us']:>10.1f} {r['gbps']:>8.0f} {r['copy_gbps']:>8.0f} {r['pct_copy']:>7.1f}%"
