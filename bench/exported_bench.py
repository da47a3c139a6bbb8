#!/usr/bin/env python3
"""Exported models at speed (issue 15: "judged also on exported models"): each model of
bench/real_models.py's tables exported by PyTorch's ONNX exporter at --batch, then
`fusebox bench MODEL.onnx --precision bf16 --report` against PyTorch eager inference of the same
module under bf16 autocast, in the same process run.

    python3 bench/exported_bench.py --fusebox build/release/tools/fusebox \
        [--models vit_b_16,hf_style_bert] [--batch 64] [--exporter torchscript|dynamo] \
        [--json FILE] [--work DIR]

PyTorch: eval, inference_mode, autocast bf16, the input already on the device (fusebox bench
copies its input in from pinned host memory every step: a small handicap on fusebox's side),
30 timed steps after 10, CUDA events, the median. fusebox: its own bench (30 steps after 5),
whose --report lists the fusion groups (is the attention fused? with its mask?) and the time by
op; its stderr names the attention implementation per problem. Token-id inputs are random ids
0..9 from fusebox bench (and an all-ones attention mask on PyTorch's side).
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import real_models  # noqa: E402


def torch_ms(model, inputs, steps=30, warmup=10):
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(warmup):
            model(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fusebox", required=True)
    parser.add_argument("--models", default="vit_b_16,hf_style_bert")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript")
    parser.add_argument("--json")
    parser.add_argument("--work")
    args = parser.parse_args()
    sizes = dict(real_models.CLASSIFIERS + real_models.SEGMENTATION + real_models.DECODERS +
                 real_models.ENCODERS)
    work = Path(args.work or tempfile.mkdtemp(prefix="fusebox_exported_"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        size = sizes[name]
        torch.manual_seed(0)
        model = real_models.build(name).eval().cuda()
        if name in dict(real_models.DECODERS + real_models.ENCODERS):
            inputs = {"input": torch.randint(0, 10, (args.batch, size), device="cuda")}
            if name in dict(real_models.ENCODERS):
                inputs["attention_mask"] = torch.ones(args.batch, size, dtype=torch.int64,
                                                      device="cuda")
        else:
            inputs = {"input": torch.rand(args.batch, 3, size, size, device="cuda") * 2 - 1}
        path = work / f"{name}_b{args.batch}.onnx"
        torch.onnx.export(model, tuple(inputs.values()), str(path), input_names=list(inputs),
                          output_names=["logits"], dynamo=args.exporter == "dynamo",
                          **({} if args.exporter == "dynamo" else {"opset_version": 17}))
        row = {"model": name, "batch": args.batch, "exporter": args.exporter,
               "torch_eager_bf16_ms": torch_ms(model, tuple(inputs.values()))}
        out = work / f"{name}_fusebox.json"
        proc = subprocess.run([args.fusebox, "bench", str(path), "--precision", "bf16",
                               "--device", "cuda", "--report", "--json", str(out)],
                              capture_output=True, text=True)
        print(proc.stdout[-6000:])
        print("\n".join(line for line in proc.stderr.splitlines() if "attention" in line))
        if proc.returncode != 0:
            row["fusebox_error"] = proc.stderr.strip().splitlines()[-1:] or ["?"]
        else:
            report = json.load(open(out))
            row["fusebox_bf16_ms"] = report["step_ms_median"]
            row["ratio"] = row["torch_eager_bf16_ms"] / row["fusebox_bf16_ms"]
            row["fusebox"] = report
        rows.append(row)
        print(f"{name:20s} torch eager {row['torch_eager_bf16_ms']:.3f} ms  fusebox "
              f"{row.get('fusebox_bf16_ms', float('nan')):.3f} ms  "
              f"ratio {row.get('ratio', float('nan')):.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "exported_bench", "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
