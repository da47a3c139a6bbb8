#!/usr/bin/env python3
"""Real-model suite (issue 15): torchvision models exported by PyTorch's own ONNX exporter
(TorchScript-based, opset 17), each run through `fusebox run` and compared with PyTorch on the
same input. What a new user does first: `fusebox run their_model.onnx`.

    python3 bench/real_models.py --fusebox build/release/tools/fusebox [--device cpu|cuda]
        [--models resnet18,vit_b_16,...] [--batch 1] [--json FILE] [--work DIR] [--keep]

Per model: random weights (weights=None: no download; parameters torchvision initialises to
zero, e.g. ViT's head, drawn N(0, 0.02^2) so the logits are not trivially 0), eval mode, an
input U(-1, 1) of the
model's usual size; PyTorch computes the reference in f32 with TF32 off on --device; the
export is fed the same input (`--input input=x.npy`). Status: `match` (relative L2 error of the
logits <= 1e-3, the issue's bar), `mismatch`, `import` (fusebox refused or failed the model:
the first line of its error), `run` (fusebox failed after import), `export` (PyTorch could not
export it). Prints a table and a summary; --json writes the rows.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torchvision

# name, input size; the segmentation models return {"out": ...}: their "out" is compared.
CLASSIFIERS = [
    ("alexnet", 224), ("vgg11", 224), ("resnet18", 224), ("resnet50", 224),
    ("resnext50_32x4d", 224), ("wide_resnet50_2", 224), ("densenet121", 224),
    ("squeezenet1_0", 224), ("googlenet", 224), ("inception_v3", 299), ("mobilenet_v2", 224),
    ("mobilenet_v3_small", 224), ("mnasnet0_5", 224), ("shufflenet_v2_x1_0", 224),
    ("efficientnet_b0", 224), ("efficientnet_v2_s", 384), ("regnet_y_400mf", 224),
    ("convnext_tiny", 224), ("vit_b_16", 224), ("swin_t", 224), ("maxvit_t", 224),
]
SEGMENTATION = [
    ("fcn_resnet50", 224), ("deeplabv3_mobilenet_v3_large", 224),
    ("lraspp_mobilenet_v3_large", 224),
]


class Logits(torch.nn.Module):
    """A model whose forward returns one tensor (segmentation: the "out" map)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        if isinstance(y, dict):
            return y["out"]
        if isinstance(y, tuple):  # googlenet / inception aux outputs in eval are off
            return y[0]
        return y


def build(name):
    if any(name == n for n, _ in SEGMENTATION):
        kwargs = {"weights": None, "weights_backbone": None}
        if name != "lraspp_mobilenet_v3_large":
            kwargs["aux_loss"] = False
        return Logits(torchvision.models.segmentation.__dict__[name](**kwargs))
    kwargs = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    return Logits(torchvision.models.__dict__[name](**kwargs))


def first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def run_one(name, size, args, work):
    row = {"model": name, "input": [args.batch, 3, size, size]}
    torch.manual_seed(0)
    model = build(name).eval()
    with torch.no_grad():  # zero-initialised layers (ViT's head) would make the logits 0
        for p in model.parameters():
            if p.abs().max() == 0:
                p.normal_(0.0, 0.02)
    model = model.to(args.device)
    x = torch.rand(args.batch, 3, size, size, device=args.device) * 2 - 1
    with torch.no_grad():
        want = model(x).float().cpu().numpy()
    path = work / f"{name}.onnx"
    try:
        torch.onnx.export(model, (x,), str(path), opset_version=17, input_names=["input"],
                          output_names=["logits"], dynamo=False)
    except Exception as e:  # noqa: BLE001 -- the exporter's own failures are data here
        row.update(status="export", detail=first_line(str(e)))
        return row
    np.save(work / f"{name}_x.npy", x.cpu().numpy())
    out_dir = work / f"{name}_out"
    command = [args.fusebox, "run", str(path), "--device", args.device, "--input",
               f"input={work / f'{name}_x.npy'}", "--output-dir", str(out_dir)]
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True)
    row["fusebox_seconds"] = round(time.time() - start, 2)
    if proc.returncode != 0:
        err = proc.stderr
        row.update(status="import" if "onnx import" in err else "run", detail=first_line(err))
        return row
    got = np.load(out_dir / "logits.npy").astype(np.float64)
    ref = want.astype(np.float64)
    if got.shape != ref.shape:
        row.update(status="mismatch", detail=f"shape {got.shape} vs {ref.shape}")
        return row
    if np.linalg.norm(ref) == 0:
        row.update(status="mismatch", detail="the reference output is all zeros")
        return row
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    row.update(rel_l2=rel, max_abs=float(np.max(np.abs(got - ref))),
               status="match" if rel <= 1e-3 else "mismatch")
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fusebox", required=True, help="the fusebox binary")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--work", help="directory for the exports (default: a temporary one)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    table = CLASSIFIERS + SEGMENTATION
    if args.models:
        wanted = args.models.split(",")
        unknown = set(wanted) - {n for n, _ in table}
        if unknown:
            parser.error(f"unknown models: {', '.join(sorted(unknown))}")
        table = [(n, s) for n, s in table if n in wanted]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fusebox_models_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, device "
          f"{args.device}, work dir {work}", flush=True)
    rows = []
    for name, size in table:
        row = run_one(name, size, args, work)
        rows.append(row)
        detail = (f"rel {row['rel_l2']:.2e}" if "rel_l2" in row else row.get("detail", ""))
        print(f"{name:30s} {row['status']:9s} {detail}", flush=True)
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "real_models", "torch": torch.__version__,
                       "torchvision": torchvision.__version__, "device": args.device,
                       "rows": rows}, f, indent=1)
    return 0 if counts.get("mismatch", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
