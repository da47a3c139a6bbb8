#!/usr/bin/env python3
"""PyTorch's batch norm on the same shapes and byte counts as bench_batch_norm.

    python3 bench/torch_batch_norm.py [--json FILE] [--iters N] [--repeats N] [--dtype bf16]

ResNet-50's batch-norm inputs at N = 64, NCHW (torch.contiguous_format) and NHWC
(torch.channels_last). Passes, as bench_batch_norm:
  fwd_train: F.batch_norm(x, running_mean, running_var, weight, bias, training=True)
             under no_grad (updates the running statistics);
  fwd_infer: the same with training=False;
  backward:  torch.autograd.grad of a training-mode forward's output with respect to x,
             weight and bias for a fixed dy (the forward graph built once per input set
             and replayed with retain_graph, so only the backward kernels run).
Parameters are f32 (PyTorch's mixed-precision batch norm), activations in --dtype.
Bytes: forward x + y, backward x + dy + dx (activations once, per-channel vectors ignored).
Timing: CUDA events around `iters` calls, median over `repeats` after a warm-up; inputs
random, rotated over enough copies that the working set exceeds twice the 50 MB L2.
"""
import argparse

import torch
import torch.nn.functional as F

from common.torch_bench import (BANDWIDTH_TITLES, bandwidth, bandwidth_cells, report, time_us,
                                write_report)

BATCH = 64
SHAPES = [(64, 112), (64, 56), (256, 56), (128, 56), (128, 28), (512, 28),
          (256, 28), (256, 14), (1024, 14), (512, 14), (512, 7), (2048, 7)]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
ROTATION_BYTES = 120 << 20


def run_shape(dtype_name, dtype, channels, size, iters, repeats, results):
    shape = (BATCH, channels, size, size)
    elem = torch.tensor([], dtype=dtype).element_size()
    act_bytes = BATCH * channels * size * size * elem
    copies = max(1, ROTATION_BYTES // act_bytes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.rand(channels, device="cuda", generator=gen) + 0.5
    bias = torch.rand(channels, device="cuda", generator=gen) * 2 - 1
    running_mean = torch.zeros(channels, device="cuda")
    running_var = torch.ones(channels, device="cuda")
    for layout, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        xs = [(torch.rand(shape, device="cuda", generator=gen) * 4 + 1).to(dtype)
              .contiguous(memory_format=fmt) for _ in range(copies)]
        dys = [(torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
               .contiguous(memory_format=fmt) for _ in range(copies)]
        for training in (True, False):
            with torch.no_grad():
                us = time_us(lambda i: F.batch_norm(xs[i % copies], running_mean, running_var,
                                                    weight, bias, training, 0.1, 1e-5),
                             iters, repeats)
            results.append(dict(channels=channels, size=size, layout=layout,
                                **{"pass": "fwd_train" if training else "fwd_infer"},
                                dtype=dtype_name,
                                **bandwidth(2 * act_bytes, us, iters, repeats, ROTATION_BYTES)))
        graphs = []
        for s in range(copies):
            x = xs[s].detach().requires_grad_(True)
            w = weight.detach().requires_grad_(True)
            b = bias.detach().requires_grad_(True)
            y = F.batch_norm(x, running_mean, running_var, w, b, True, 0.1, 1e-5)
            graphs.append((y, [x, w, b], dys[s]))

        def backward(i):
            y, wrt, dy = graphs[i % copies]
            torch.autograd.grad(y, wrt, dy, retain_graph=True)

        us = time_us(backward, iters, repeats)
        results.append(dict(channels=channels, size=size, layout=layout, **{"pass": "backward"},
                            dtype=dtype_name,
                            **bandwidth(3 * act_bytes, us, iters, repeats, ROTATION_BYTES)))
        del graphs, xs, dys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = parser.parse_args()
    results = []
    for channels, size in SHAPES:
        run_shape(args.dtype, DTYPES[args.dtype], channels, size, args.iters, args.repeats, results)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}, batch_norm {args.dtype}, "
          f"N = {BATCH}")
    print(f"{'shape':<16} {'layout':<6} {'pass':<10} {BANDWIDTH_TITLES}")
    for r in results:
        shape = f"[{BATCH},{r['channels']},{r['size']},{r['size']}]"
        print(f"{shape:<16} {r['layout']:<6} {r['pass']:<10} {bandwidth_cells(r)}")
    write_report(args.json, report("torch_batch_norm", dtype=args.dtype, batch=BATCH,
                                   results=results))


if __name__ == "__main__":
    main()
