"""The suite's results: one JSON per model and mode (written by suite.py as it goes), merged
into one JSON and a markdown table with geometric means and the targets' verdicts. Pure
Python: no torch, so that the table can be made anywhere and the self-test runs in CI."""
import json
import math
import time
from pathlib import Path

import models

SCHEMA_VERSION = 1
TORCH_VARIANTS = ("eager", "cuda_graph", "compile")

# What later sessions are judged by (issue 40): per mode, the geometric mean of fusebox's
# speed-up over torch.compile, the least any one model may have over torch.compile and over
# CUDA-graph replay, the first step's compile time warm and cold, and peak memory at most
# PyTorch eager's.
TARGETS = {
    "infer": {"geomean_vs_compile": 1.3, "min_vs_compile": 1.0, "min_vs_cuda_graph": 1.0},
    "train": {"geomean_vs_compile": 1.15, "min_vs_compile": 0.95},
}
COMPILE_TARGET_S = {"warm": 5.0, "cold": 15.0}


def cell_path(out_dir, model, mode):
    return Path(out_dir) / "models" / f"{model}_{mode}.json"


def is_ok(status):
    return isinstance(status, str) and status.startswith("ok")


def ratios(record):
    """PyTorch's ms/step over fusebox's for each variant (> 1: fusebox is faster), and fusebox's
    peak memory over PyTorch eager's; None where either side has no figure."""
    fb = record.get("fusebox", {})
    fb_ms = fb.get("ms_per_step") if is_ok(fb.get("status")) else None
    out = {}
    for v in TORCH_VARIANTS:
        t = record.get("torch", {}).get("variants", {}).get(v, {})
        t_ms = t.get("ms_per_step") if is_ok(t.get("status")) else None
        out[f"vs_{v}"] = t_ms / fb_ms if fb_ms and t_ms else None
    eager = record.get("torch", {}).get("variants", {}).get("eager", {})
    fb_peak, t_peak = fb.get("peak_bytes"), eager.get("peak_bytes")
    out["memory_vs_eager"] = fb_peak / t_peak if fb_peak and t_peak else None
    return out


def geomean(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def load_cells(out_dir):
    """The folder's cells in models.py's order (unknown names last), inference first."""
    cells = []
    for p in sorted((Path(out_dir) / "models").glob("*.json")):
        with open(p) as f:
            cells.append(json.load(f))
    order = {name: i for i, name in enumerate(models.BY_NAME)}
    return sorted(cells, key=lambda c: (c.get("mode") != "infer", order.get(c.get("model"),
                                                                             len(order)),
                                        c.get("model", "")))


def summarize(cells, mode):
    """The mode's geometric means over the models that have every ratio, and the targets'
    verdicts: which models are below a bound, which compile too slowly, which use more memory
    than PyTorch eager."""
    rows = [c for c in cells if c.get("mode") == mode]
    complete = [c for c in rows if all(c["ratios"].get(f"vs_{v}") for v in TORCH_VARIANTS)]
    s = {"models": [c["model"] for c in rows], "models_in_geomean": [c["model"] for c in complete]}
    for v in TORCH_VARIANTS:
        s[f"geomean_vs_{v}"] = geomean([c["ratios"][f"vs_{v}"] for c in complete])
    targets = TARGETS.get(mode, {})
    verdict = {}
    if "geomean_vs_compile" in targets and s["geomean_vs_compile"] is not None:
        verdict["geomean_vs_compile"] = {"value": s["geomean_vs_compile"],
                                         "target": targets["geomean_vs_compile"],
                                         "met": s["geomean_vs_compile"] >= targets["geomean_vs_compile"]}
    for key in ("min_vs_compile", "min_vs_cuda_graph"):
        if key in targets:
            ratio = key[len("min_"):]
            below = [c["model"] for c in rows if c["ratios"].get(ratio) is not None
                     and c["ratios"][ratio] < targets[key]]
            verdict[key] = {"target": targets[key], "below": below}
    slow = {}
    for c in rows:
        fb = c.get("fusebox", {})
        for kind in ("warm", "cold"):
            t = fb.get(f"compile_s_{kind}")
            if t is not None and t > COMPILE_TARGET_S[kind]:
                slow.setdefault(kind, []).append(c["model"])
    verdict["compile_s"] = {"target": COMPILE_TARGET_S, "over": slow}
    verdict["memory_over_eager"] = [c["model"] for c in rows
                                    if (c["ratios"].get("memory_vs_eager") or 0) > 1.0]
    verdict["not_ok"] = [c["model"] for c in rows if not is_ok(c.get("status"))]
    s["verdict"] = verdict
    return s


def merge(out_dir, json_path=None, markdown_path=None):
    """Merges the folder's per-model JSON files into one JSON and a markdown table; returns the
    merged object."""
    cells = load_cells(out_dir)
    for c in cells:
        c["ratios"] = ratios(c)
    modes = [m for m in ("infer", "train") if any(c.get("mode") == m for c in cells)]
    first = cells[0] if cells else {}
    merged = {"schema_version": SCHEMA_VERSION, "bench": "suite",
              "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "commit": first.get("commit"), "device": first.get("device"),
              "torch": (first.get("torch", {}).get("torch")
                        or first.get("export", {}).get("torch")),
              "dry_run": any(c.get("dry_run") for c in cells),
              "summary": {m: summarize(cells, m) for m in modes}, "cells": cells}
    json_path = Path(json_path or Path(out_dir) / "suite.json")
    markdown_path = Path(markdown_path or Path(out_dir) / "suite.md")
    json_path.write_text(json.dumps(merged, indent=1) + "\n")
    markdown_path.write_text(markdown(merged))
    return merged


def _ms(v):
    return "-" if v is None else f"{v:.2f}"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def _gib(v):
    return "-" if v is None else f"{v / 2**30:.1f}"


def _s(v):
    return "-" if v is None else f"{v:.1f}"


def markdown(merged):
    lines = [f"# Model suite: fusebox against PyTorch ({merged.get('device')}, commit "
             f"{merged.get('commit')}, torch {merged.get('torch')})"
             + (" -- dry run: export and import only" if merged.get("dry_run") else ""), "",
             "ms: one step (inference: input in from pinned host memory, logits out; training: "
             "forward, backward, optimizer step). x: PyTorch's ms over fusebox's (> 1: fusebox is "
             "faster). compile: the first step, s (fusebox cold = empty plan cache, warm = a "
             "second process with it; PyTorch: torch.compile's first step, Inductor caches off). "
             "peak: device memory, GiB. `*` fusebox ran its zoo model of the same architecture "
             "(the JSON says why).", ""]
    for mode, s in merged["summary"].items():
        lines += [f"## {mode}", "",
                  "| model | batch | fusebox ms | samples/s | eager ms | graph ms | compile ms "
                  "| x eager | x graph | x compile | fb compile cold / warm s | torch compile s "
                  "| fb peak | eager peak | status |",
                  "|" + "---|" * 15]
        for c in merged["cells"]:
            if c.get("mode") != mode:
                continue
            fb = c.get("fusebox", {})
            tv = c.get("torch", {}).get("variants", {})
            r = c["ratios"]
            ms = {v: tv.get(v, {}).get("ms_per_step") for v in TORCH_VARIANTS}
            zoo = "*" if fb.get("source", "").startswith("zoo") else ""
            lines.append(
                f"| {c['model']}{zoo} | {c.get('config', {}).get('batch', '-')} "
                f"| {_ms(fb.get('ms_per_step'))} | {_s(fb.get('throughput'))} "
                f"| {_ms(ms['eager'])} | {_ms(ms['cuda_graph'])} | {_ms(ms['compile'])} "
                f"| {_x(r['vs_eager'])} | {_x(r['vs_cuda_graph'])} | {_x(r['vs_compile'])} "
                f"| {_s(fb.get('compile_s_cold'))} / {_s(fb.get('compile_s_warm'))} "
                f"| {_s(tv.get('compile', {}).get('first_step_s'))} "
                f"| {_gib(fb.get('peak_bytes'))} | {_gib(tv.get('eager', {}).get('peak_bytes'))} "
                f"| {c.get('status', '?')} |")
        lines.append(f"| geomean ({len(s['models_in_geomean'])} models) | | | | | | "
                     f"| {_x(s['geomean_vs_eager'])} | {_x(s['geomean_vs_cuda_graph'])} "
                     f"| {_x(s['geomean_vs_compile'])} | | | | | |")
        lines += ["", "Targets:"]
        v = s["verdict"]
        if "geomean_vs_compile" in v:
            g = v["geomean_vs_compile"]
            lines.append(f"- geomean vs torch.compile {g['value']:.2f}x (target >= "
                         f"{g['target']}x): {'met' if g['met'] else 'NOT met'}")
        for key in ("min_vs_compile", "min_vs_cuda_graph"):
            if key in v:
                what = key[len("min_vs_"):].replace("_", "-")
                below = ", ".join(v[key]["below"]) or "none"
                lines.append(f"- below {v[key]['target']}x {what}: {below}")
        over = v["compile_s"]["over"]
        lines.append(f"- compile over {COMPILE_TARGET_S['warm']:g} s warm: "
                     f"{', '.join(over.get('warm', [])) or 'none'}; over "
                     f"{COMPILE_TARGET_S['cold']:g} s cold: "
                     f"{', '.join(over.get('cold', [])) or 'none'}")
        lines.append(f"- peak memory above PyTorch eager's: "
                     f"{', '.join(v['memory_over_eager']) or 'none'}")
        lines.append(f"- cells not ok: {', '.join(v['not_ok']) or 'none'}")
        lines.append("")
    return "\n".join(lines) + "\n"
