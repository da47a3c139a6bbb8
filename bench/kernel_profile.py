#!/usr/bin/env python3
"""Kernel time per step, by kind, fusebox beside PyTorch: where a whole-model gap comes from.

  kernel_profile.py torch --model resnet50 --mode train --batch 128 --precision tf32 --json T.json
      PyTorch (eager, channels_last, cudnn.benchmark, as bench/torch_train.py) under
      torch.profiler: the GPU time of each kernel over --steps steps after --warmup.
  kernel_profile.py ncu NCU.csv --runs R --json F.json
      An Nsight Compute CSV of fusebox's kernels (one metric: gpu__time_duration.sum), e.g.
        FUSEBOX_CUDA_GRAPHS=0 ncu --metrics gpu__time_duration.sum --csv --print-units base \\
          --log-file NCU.csv fusebox bench resnet50 --mode train --steps 1 --warmup 0 ...
      R: how many step runs the CSV holds (the kernels are summed and divided by R).
  kernel_profile.py table F.json T.json
      Both side by side: milliseconds per step by kind (convolution forward, data and weight
      gradients, batch norm, pointwise, optimizer, layout copies, ...) and the top kernels.
"""
import argparse
import csv
import json
import re
import sys

# The first pattern that matches a (lower-cased) kernel name names its kind.
KINDS = [
    ("batch norm", r"batch_?norm|\bbn|bn::|welford"),
    ("conv wgrad", r"wgrad|filter|dw_|conv.*bwd.*filter"),
    ("conv dgrad", r"dgrad|bwd_data|convolve_dgrad"),
    ("pool", r"pool"),
    ("conv fprop", r"fprop|implicit_gemm|xmma|conv|cudnn|sm90_.*gemm|cutlass"),
    ("matmul", r"gemm|cublas|matmul"),
    ("optimizer", r"sgd|momentum|adam|multi_tensor|foreach|optimizer"),
    ("layout / copy", r"copy|transpose|permute|convert|nchw|nhwc|strided|memcpy|cast"),
    ("loss / softmax", r"softmax|cross_entropy|nll|log_softmax|entropy"),
    ("reduction", r"reduce|sum|mean"),
    ("pointwise", r"elementwise|pointwise|relu|threshold|add|mul|fill|unary|binary"),
]


def kind_of(name):
    low = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def from_torch(args):
    import torch
    import torchvision as tv
    from torch.profiler import ProfilerActivity, profile

    torch.backends.cudnn.benchmark = True
    tf32 = args.precision != "f32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(args.precision)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = tv.models.get_model(args.model, weights=None, num_classes=args.num_classes)
    model = model.to(dev, memory_format=torch.channels_last).train(args.mode == "train")
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=dev)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, args.num_classes, (args.batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            if args.mode == "infer":
                with torch.no_grad():
                    return model(x)
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup + 1):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kernels.setdefault(e.name, [0.0, 0])
        k[0] += e.device_time / 1e3 / args.steps  # ms per step (device_time: us)
        k[1] += 1 / args.steps
    return {"source": f"torch {torch.__version__} {args.model} {args.mode} b{args.batch} "
                      f"{args.precision}", "kernels": kernels}


def from_ncu(args):
    kernels = {}
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # skip ncu's own messages
    rows = list(csv.DictReader(lines))
    for row in rows:
        name = row.get("Kernel Name") or row.get("Function Name") or "?"
        value = row.get("gpu__time_duration.sum") or row.get("Metric Value")
        if row.get("Metric Name") not in (None, "gpu__time_duration.sum"):
            continue
        try:
            ns = float(str(value).replace(",", ""))
        except ValueError:
            continue  # the units row
        k = kernels.setdefault(name, [0.0, 0])
        k[0] += ns / 1e6 / args.runs
        k[1] += 1 / args.runs
    return {"source": f"ncu {args.csv}", "kernels": kernels}


def table(args):
    sides = [json.load(open(p)) for p in args.files]
    by_kind = []
    for s in sides:
        sums = {}
        for name, (ms, n) in s["kernels"].items():
            k = sums.setdefault(kind_of(name), [0.0, 0.0])
            k[0] += ms
            k[1] += n
        by_kind.append(sums)
    kinds = sorted({k for s in by_kind for k in s}, key=lambda k: -by_kind[0].get(k, [0])[0])
    print("ms per step (kernels per step)")
    print(f"{'kind':16}" + "".join(f"{p[-28:]:>30}" for p in args.files))
    for kind in kinds + ["total"]:
        cells = []
        for s in by_kind:
            ms, n = ([sum(v[0] for v in s.values()), sum(v[1] for v in s.values())]
                     if kind == "total" else s.get(kind, [0.0, 0.0]))
            cells.append(f"{ms:20.3f} ({n:6.0f})")
        print(f"{kind:16}" + "".join(f"{c:>30}" for c in cells))
    for p, s in zip(args.files, sides):
        print(f"\ntop kernels of {p} ({s['source']}):")
        top = sorted(s["kernels"].items(), key=lambda kv: -kv[1][0])[: args.top]
        for name, (ms, n) in top:
            print(f"  {ms:8.3f} ms {n:6.1f}x  {kind_of(name):14} {name[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--model", default="resnet50")
    t.add_argument("--mode", choices=("train", "infer"), default="train")
    t.add_argument("--batch", type=int, default=128)
    t.add_argument("--precision", choices=("f32", "tf32", "bf16", "f16"), default="tf32")
    t.add_argument("--image-size", type=int, default=224)
    t.add_argument("--num-classes", type=int, default=1000)
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--json", required=True)
    n = sub.add_parser("ncu")
    n.add_argument("csv")
    n.add_argument("--runs", type=float, default=1)
    n.add_argument("--json", required=True)
    tb = sub.add_parser("table")
    tb.add_argument("files", nargs="+")
    tb.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if args.cmd == "table":
        table(args)
        return
    result = from_torch(args) if args.cmd == "torch" else from_ncu(args)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
