#!/usr/bin/env python3
"""PyTorch's side of the model suite, one model and mode per process (so that an OOM or a
crash costs only that cell): the ONNX export (`export`), and the timing of PyTorch eager,
CUDA-graph replay and torch.compile (`time`). suite.py runs it; by hand:

    python3 bench/suite/torch_side.py export --model resnet50 --mode infer --out r50.onnx \
        [--device cuda] [--cpu-batch N]
    python3 bench/suite/torch_side.py time --model resnet50 --mode infer --json r50_torch.json \
        [--device cuda] [--variants eager,cuda_graph,compile] [--steps 20] [--warmup 5]

How PyTorch runs (its fastest reasonable configuration, the same work as fusebox bench):
  inference  the model's weights in bf16 (model.to(bfloat16)), channels_last for convnets,
             eval + inference_mode; each step copies the f32 input in from pinned host
             memory, casts it to bf16 on the device, and copies the logits back as f32 to
             pinned host memory, non_blocking -- what fusebox bench's inference step does.
  training   autocast bf16 with f32 weights (fusebox's bf16 training: autocast's rules, f32
             master weights), channels_last for convnets, the batch and its random labels on
             the device, forward + cross-entropy + backward + optimizer step (models.py:
             SGD momentum or AdamW, fused kernels).
  on the CPU f32 throughout (no bf16, no autocast): a CPU run only checks the plumbing.
  variants   eager; cuda_graph: the whole step captured once and replayed (training:
             PyTorch's whole-network capture, the optimizer capturable); compile:
             torch.compile(model) in its default mode (training: the model compiled, the
             optimizer step eager, as torch.compile's users run it), Inductor's caches off
             (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), so that its first step is a cold compile.
Per variant: first_step_s (build + compile + capture + the first step, to its result), after
--warmup steps --steps steps queued back to back with a CUDA event after each: ms/step median
(also min, max) and samples/s from the wall time of those steps; peak device memory
(torch.cuda.max_memory_allocated and max_memory_reserved) of the whole variant, weights
included. Each variant's error is recorded (its first line) and the next one runs.
"""
import argparse
import gc
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
import torch_models  # noqa: E402

VARIANTS = ("eager", "cuda_graph", "compile")


def first_line(text):
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return "(no message)"


def error_status(e):
    """The cell's status for an exception: OOM or run failed, with the error's first line."""
    text = f"{type(e).__name__}: {first_line(e)}"
    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "OOM: " + text
    return "run failed: " + text


def spec_for(args):
    spec = models.BY_NAME[args.model]
    return spec.for_cpu(args.cpu_batch) if args.device == "cpu" else spec


def make_optimizer(spec, params, device, capturable):
    kw = dict(models.OPTIMIZERS[spec.optimizer])
    fused = device.type == "cuda"
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, fused=fused, capturable=capturable and fused, **kw)
    return torch.optim.SGD(params, fused=fused, **kw)


def loss_of(spec, logits, y):
    if spec.family == "gpt2":  # [B, T, V] logits, [B, T] next-token labels
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
    return torch.nn.functional.cross_entropy(logits.float(), y)


def train_step_fn(spec, model, fwd, device, batch, graph):
    """A training step (and, with `graph`, its capture); returns step() -> loss tensor."""
    fmt = torch.channels_last if spec.channels_last and spec.family != "gpt2" else None
    x = torch_models.inputs(spec, batch, device)
    if fmt:
        x = x.contiguous(memory_format=fmt)
    y = torch_models.labels(spec, batch, device)
    opt = make_optimizer(spec, model.parameters(), device, capturable=graph)

    def forward_backward_update():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda",
                            cache_enabled=not graph):
            loss = loss_of(spec, fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    def eager_step():
        opt.zero_grad(set_to_none=True)
        return forward_backward_update()

    if not graph:
        return eager_step
    # PyTorch's whole-network capture: warm-up on a side stream, the gradients set to None
    # before the capture, so that the captured backward writes them (no zeroing to replay).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager_step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = forward_backward_update()

    def replay():
        g.replay()
        return static_loss
    return replay


def infer_step_fn(spec, fwd, device, batch, graph):
    """An inference step: f32 input from pinned host memory in, f32 logits out to pinned host
    memory (as fusebox bench); with `graph`, the device part captured once and replayed."""
    cuda = device.type == "cuda"
    host = torch_models.inputs(spec, batch, "cpu")
    if cuda:
        host = host.pin_memory()
    fmt = torch.channels_last if spec.channels_last and spec.family != "gpt2" else None
    # The weights' dtype (bf16 on CUDA); token ids stay integers.
    low = torch.bfloat16 if cuda and spec.family != "gpt2" else None

    def device_part(x):
        if low:
            x = x.to(low)
        if fmt:
            x = x.contiguous(memory_format=fmt)
        return fwd(x).float()

    out_host = None
    if not graph:
        def step():
            nonlocal out_host
            out = device_part(host.to(device, non_blocking=True))
            if out_host is None:
                out_host = torch.empty(out.shape, pin_memory=cuda)
            out_host.copy_(out, non_blocking=True)
            return out_host
        return step
    static_in = host.to(device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            device_part(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = device_part(static_in)
    out_host = torch.empty(static_out.shape, pin_memory=True)

    def replay():
        static_in.copy_(host, non_blocking=True)
        g.replay()
        out_host.copy_(static_out, non_blocking=True)
        return out_host
    return replay


def run_variant(spec, mode, variant, device, steps, warmup):
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    batch = spec.train_batch if mode == "train" else spec.infer_batch
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    model = torch_models.build(spec, training=mode == "train")
    if mode == "infer":
        model = model.to(torch.bfloat16) if cuda else model
    fmt = torch.channels_last if spec.channels_last and spec.family != "gpt2" else None
    model = model.to(device, memory_format=fmt) if fmt else model.to(device)
    if variant == "compile":
        torch._dynamo.reset()
    fwd = torch.compile(model) if variant == "compile" else model
    graph = variant == "cuda_graph"
    with torch.inference_mode(mode == "infer"):
        step = (train_step_fn(spec, model, fwd, device, batch, graph) if mode == "train"
                else infer_step_fn(spec, fwd, device, batch, graph))
        out = step()
        sync()
        first_s = time.perf_counter() - start
        for _ in range(warmup):
            out = step()
        sync()

        def mark():
            if not cuda:
                return time.perf_counter()
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        marks = [mark()]
        t = time.perf_counter()
        for _ in range(steps):
            out = step()
            marks.append(mark())
        sync()
        wall = time.perf_counter() - t
    ms = sorted(a.elapsed_time(b) if cuda else 1e3 * (b - a) for a, b in zip(marks, marks[1:]))
    result = {
        "status": "ok",
        "first_step_s": first_s,
        "ms_per_step": ms[len(ms) // 2],
        "ms_min": ms[0],
        "ms_max": ms[-1],
        "ms_source": "cuda_events" if cuda else "host_clock",
        "throughput": steps * batch / wall,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
    }
    if mode == "train":
        result["final_loss"] = float(out.item())
    return result


def cmd_time(args):
    spec = spec_for(args)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit(f"torch_side: unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    result = {"torch": torch.__version__, "device": (torch.cuda.get_device_name(device)
                                                     if device.type == "cuda" else "cpu"),
              "precision": ("infer: bf16 weights (model.to(bfloat16))" if args.mode == "infer"
                            else "train: autocast bf16, f32 weights"),
              "compile_mode": "default", "inductor_caches": os.environ.get(
                  "TORCHINDUCTOR_FORCE_DISABLE_CACHES") == "1" and "off" or "on",
              "variants": {}}
    if device.type == "cpu":
        result["precision"] = "f32 (a CPU run: plumbing only)"
    for variant in VARIANTS:
        if variant not in variants:
            continue
        if variant == "cuda_graph" and device.type != "cuda":
            result["variants"][variant] = {"status": "skipped: CUDA graphs need a CUDA device"}
            continue
        try:
            r = run_variant(spec, args.mode, variant, device, args.steps, args.warmup)
        except Exception as e:  # noqa: BLE001 -- a failing variant is data; the next one runs
            traceback.print_exc()
            r = {"status": error_status(e)}
        result["variants"][variant] = r
        print(f"torch {args.model} {args.mode} {variant}: "
              + (f"{r['ms_per_step']:.3f} ms/step, first step {r['first_step_s']:.1f} s"
                 if r["status"] == "ok" else r["status"]), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        with open(args.json, "w") as f:  # after each variant: a crash keeps what was done
            json.dump(result, f, indent=1)
    return 0


def cmd_export(args):
    spec = spec_for(args)
    batch = spec.train_batch if args.mode == "train" else spec.infer_batch
    warnings.filterwarnings("ignore")  # the exporter warns once per batch norm
    start = time.perf_counter()
    opset = torch_models.export(spec, batch, args.mode == "train", args.out, args.device)
    import torchvision
    print(json.dumps({"opset": opset, "seconds": time.perf_counter() - start, "batch": batch,
                      "torch": torch.__version__, "torchvision": torchvision.__version__}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("export", "time"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, choices=list(models.BY_NAME))
        p.add_argument("--mode", required=True, choices=("infer", "train"))
        p.add_argument("--device", default="cuda")
        p.add_argument("--cpu-batch", type=int, default=2)
    sub.choices["export"].add_argument("--out", required=True)
    t = sub.choices["time"]
    t.add_argument("--json", required=True)
    t.add_argument("--variants", default=",".join(VARIANTS))
    t.add_argument("--steps", type=int, default=models.TIMED_STEPS)
    t.add_argument("--warmup", type=int, default=models.WARMUP_STEPS)
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("torch_side: CUDA is not available here (--device cpu for a dry run)")
    return cmd_export(args) if args.command == "export" else cmd_time(args)


if __name__ == "__main__":
    sys.exit(main())
