#!/usr/bin/env python3
"""PyTorch's LayerNorm and RMSNorm on the same shapes and byte counts as bench_norms.

    python3 bench/torch_norms.py [--json FILE] [--iters N] [--repeats N]

What is timed matches bench_norms:
  forward:  F.layer_norm(x, (cols,), weight, bias) and F.rms_norm(x, (cols,), weight),
            under no_grad (PyTorch then keeps no statistics; bench_norms writes them,
            8 bytes per row, which the byte count includes on both sides).
  backward: torch.autograd.grad of the output with respect to x, weight and bias
            (rms_norm: x and weight) for a fixed dy: dx, dweight (and dbias), as
            bench_norms computes dx, dscale (and dbias). The forward graph is built once
            and its backward replayed (retain_graph), so only the backward kernels run.
Bytes: forward x + y + weight (+ bias) + statistics; backward x + dy + dx + weight +
statistics + dweight (+ dbias), in f32 for the parameter gradients as on our side.
Timing: CUDA events around `iters` calls, median over `repeats` after a warm-up; inputs
random, rotated over enough copies that the working set exceeds the 50 MB L2.
"""
import argparse

import torch
import torch.nn.functional as F

from common.torch_bench import (BANDWIDTH_TITLES, bandwidth, bandwidth_cells, report, time_us,
                                write_report)

SHAPES = [(16384, 1024), (8192, 4096), (4096, 16384)]
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def run_shape(name, dtype, rows, cols, iters, repeats, results):
    elem = torch.tensor([], dtype=dtype).element_size()
    tensor_bytes = rows * cols * elem
    sets = max(2, min(8, (256 << 20) // (3 * tensor_bytes) + 1))
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.rand(rows, cols, device="cuda", dtype=dtype, generator=gen) * 4 - 1 for _ in range(sets)]
    dys = [torch.rand(rows, cols, device="cuda", dtype=dtype, generator=gen) * 2 - 1 for _ in range(sets)]
    weight = torch.rand(cols, device="cuda", dtype=dtype, generator=gen) + 0.5
    bias = torch.rand(cols, device="cuda", dtype=dtype, generator=gen) * 2 - 1
    for op in ("layer_norm", "rms_norm"):
        layer = op == "layer_norm"
        params = cols * elem * (2 if layer else 1)
        stats = rows * 4 * (2 if layer else 1)

        def forward(x, w, b):
            if layer:
                return F.layer_norm(x, (cols,), w, b, 1e-5)
            return F.rms_norm(x, (cols,), w, 1e-5)

        fwd_bytes = 2 * tensor_bytes + params + stats
        with torch.no_grad():
            fwd_us = time_us(lambda i: forward(xs[i % sets], weight, bias), iters, repeats)
        results.append(dict(op=op, **{"pass": "fwd"}, dtype=name, rows=rows, cols=cols,
                            **bandwidth(fwd_bytes, fwd_us, iters, repeats)))

        # Backward: one forward graph per input set, replayed.
        graphs = []
        for s in range(sets):
            x = xs[s].detach().requires_grad_(True)
            w = weight.detach().requires_grad_(True)
            b = bias.detach().requires_grad_(True) if layer else None
            y = forward(x, w, b)
            graphs.append((y, [x, w, b] if layer else [x, w], dys[s]))

        def backward(i):
            y, wrt, dy = graphs[i % sets]
            torch.autograd.grad(y, wrt, dy, retain_graph=True)

        grads = cols * 4 * (2 if layer else 1)
        bwd_bytes = 3 * tensor_bytes + cols * elem + stats + grads
        bwd_us = time_us(backward, iters, repeats)
        results.append(dict(op=op, **{"pass": "bwd"}, dtype=name, rows=rows, cols=cols,
                            **bandwidth(bwd_bytes, bwd_us, iters, repeats)))
        del graphs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    results = []
    for name, dtype in DTYPES.items():
        for rows, cols in SHAPES:
            run_shape(name, dtype, rows, cols, args.iters, args.repeats, results)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print(f"{'op':<11} {'pass':<4} {'dtype':<5} {'shape':>13} {BANDWIDTH_TITLES}")
    for r in results:
        shape = f"{r['rows']}x{r['cols']}"
        print(f"{r['op']:<11} {r['pass']:<4} {r['dtype']:<5} {shape:>13} {bandwidth_cells(r)}")
    write_report(args.json, report("torch_norms", results=results))


if __name__ == "__main__":
    main()
