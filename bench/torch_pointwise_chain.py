#!/usr/bin/env python3
"""PyTorch's cost for bench_pointwise_chain's workload: a chain of tiny kernels (alternating
y = x + a and y = x * b, a and b scalar tensors) on a 1024-element f32 tensor, timed
  eager   every op launched by PyTorch's dispatcher
  graph   the chain captured once with torch.cuda.graph and replayed
as microseconds per node: wall time of many iterations (synchronised at the end) over the
node count, plus the GPU time of one iteration (CUDA events, median of 20).

  python3 bench/torch_pointwise_chain.py [--nodes 400] [--elements 1024] [--iters 200]
                                         [--json FILE]
"""
import argparse
import json
import math
import statistics
import time

import torch


def chain(x, a, b, nodes):
    for i in range(nodes):
        x = x + a if i % 2 == 0 else x * b
    return x


def expected(x0, add, mul, nodes):
    out = []
    for v in x0:
        for i in range(nodes):
            v = v + add if i % 2 == 0 else v * mul
        out.append(v)
    return out


def gpu_us_per_node(run, nodes, stream):
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times) * 1000.0 / nodes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=400)
    p.add_argument("--elements", type=int, default=1024)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--json", default="")
    args = p.parse_args()

    dev = torch.device("cuda")
    x0 = [math.sin(i) * 3.0 for i in range(args.elements)]
    x = torch.tensor(x0, dtype=torch.float32, device=dev)
    a = torch.tensor(0.5, dtype=torch.float32, device=dev)
    b = torch.tensor(0.75, dtype=torch.float32, device=dev)
    want = torch.tensor(expected(x0, 0.5, 0.75, args.nodes), dtype=torch.float32)
    stream = torch.cuda.current_stream()
    results = []

    # Eager.
    for _ in range(5):
        y = chain(x, a, b, args.nodes)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.iters):
        y = chain(x, a, b, args.nodes)
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - start) * 1e6 / (args.iters * args.nodes)
    eager_ok = torch.allclose(y.cpu(), want, rtol=1e-5, atol=1e-5)
    results.append({"mode": "eager", "us_per_node": eager_us,
                    "gpu_us_per_node": gpu_us_per_node(lambda: chain(x, a, b, args.nodes),
                                                       args.nodes, stream),
                    "correct": bool(eager_ok)})

    # CUDA graph: capture once (after warm-up on a side stream, as the docs ask), replay.
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(3):
            chain(x, a, b, args.nodes)
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = chain(x, a, b, args.nodes)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.iters):
        graph.replay()
    torch.cuda.synchronize()
    graph_us = (time.perf_counter() - start) * 1e6 / (args.iters * args.nodes)
    graph_ok = torch.allclose(y_graph.cpu(), want, rtol=1e-5, atol=1e-5)
    results.append({"mode": "graph", "us_per_node": graph_us,
                    "gpu_us_per_node": gpu_us_per_node(graph.replay, args.nodes, stream),
                    "correct": bool(graph_ok)})

    print(f"torch {torch.__version__} pointwise chain: {args.nodes} nodes, "
          f"{args.elements} f32 elements, {args.iters} iterations")
    print(f"{'mode':<10} {'us/node':>10} {'gpu':>10} {'correct':>8}")
    for r in results:
        print(f"{r['mode']:<10} {r['us_per_node']:>10.3f} {r['gpu_us_per_node']:>10.3f} "
              f"{'yes' if r['correct'] else 'NO':>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "torch_pointwise_chain", "torch": torch.__version__,
                       "device": torch.cuda.get_device_name(0), "nodes": args.nodes,
                       "elements": args.elements, "iters": args.iters, "results": results},
                      f, indent=2)


if __name__ == "__main__":
    main()
