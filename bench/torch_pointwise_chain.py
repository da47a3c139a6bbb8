#!/usr/bin/env python3
"""PyTorch's cost for bench_pointwise_chain's workload: a chain of tiny kernels (alternating
y = x + a and y = x * b, a and b scalar tensors) on a 1024-element f32 tensor, with the same
methodology and JSON keys as the C++ benchmark:
  eager   every op launched by PyTorch's dispatcher
  first   what a first graph run costs: capture the chain into a new torch.cuda.CUDAGraph
          (record), end the capture (instantiate), replay it once; every iteration anew
  replay  the chain captured once, then graph.replay() per iteration
us_per_node is the wall time of many iterations (synchronised once at the end) over the node
count; the host columns split the host's time per node (record, prepare = end of capture and
instantiation, launch = replay()); gpu is the GPU time of one iteration (CUDA events around
it, median of 20) per node (eager: including the gaps the host leaves between kernels).
PyTorch's "first" record time includes what entering torch.cuda.graph does (synchronize,
gc.collect, empty_cache): part of what a first captured run costs there.

  python3 bench/torch_pointwise_chain.py [--nodes 400] [--elements 1024] [--iters 200]
                                         [--json FILE]
"""
import argparse
import math
import statistics
import time

import torch

from common.torch_bench import report, write_report

ADD, MUL = 0.5, 0.75


def chain(x, a, b, nodes):
    for i in range(nodes):
        x = x + a if i % 2 == 0 else x * b
    return x


def expected(x0, nodes):
    out = []
    for v in x0:
        for i in range(nodes):
            v = v + ADD if i % 2 == 0 else v * MUL
        out.append(v)
    return out


def gpu_us_per_node(launch, nodes, stream, before=lambda: None):
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        before()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        launch()
        end.record(stream)
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times) * 1000.0 / nodes


class Capture:
    """Captures the chain into a new CUDA graph, timing the recording and the end of the
    capture (which instantiates the graph) apart."""

    def __init__(self, x, a, b, nodes):
        self.graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(self.graph):
            self.y = chain(x, a, b, nodes)
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        self.record_s = t1 - t0
        self.prepare_s = t2 - t1


def result(mode, nodes_run, wall_s, record_s=0.0, prepare_s=0.0, launch_s=0.0, gpu=0.0,
           correct=False):
    per = 1e6 / nodes_run
    return {"mode": mode, "us_per_node": wall_s * per,
            "host_us_per_node": (record_s + prepare_s + launch_s) * per,
            "record_us_per_node": record_s * per, "prepare_us_per_node": prepare_s * per,
            "launch_us_per_node": launch_s * per, "gpu_us_per_node": gpu,
            "correct": bool(correct)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=400)
    p.add_argument("--elements", type=int, default=1024)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--json", default="")
    args = p.parse_args()
    nodes, iters = args.nodes, args.iters

    dev = torch.device("cuda")
    x0 = [math.sin(i) * 3.0 for i in range(args.elements)]
    x = torch.tensor(x0, dtype=torch.float32, device=dev)
    a = torch.tensor(ADD, dtype=torch.float32, device=dev)
    b = torch.tensor(MUL, dtype=torch.float32, device=dev)
    want = torch.tensor(expected(x0, nodes), dtype=torch.float32)

    def ok(y):
        return torch.allclose(y.cpu(), want, rtol=1e-5, atol=1e-5)

    stream = torch.cuda.current_stream()
    results = []

    # Eager.
    for _ in range(5):
        y = chain(x, a, b, nodes)
    torch.cuda.synchronize()
    record_s = 0.0
    start = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        y = chain(x, a, b, nodes)
        record_s += time.perf_counter() - t
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    results.append(result("eager", iters * nodes, wall_s, record_s=record_s,
                          gpu=gpu_us_per_node(lambda: chain(x, a, b, nodes), nodes, stream),
                          correct=ok(y)))

    # Warm-up on a side stream before any capture, as the docs ask.
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(3):
            chain(x, a, b, nodes)
    stream.wait_stream(side)
    torch.cuda.synchronize()

    # First run: capture + instantiate + one replay, anew each iteration (fewer of them).
    first_iters = max(1, iters // 10)
    for _ in range(2):
        Capture(x, a, b, nodes).graph.replay()
    torch.cuda.synchronize()
    record_s = prepare_s = launch_s = 0.0
    start = time.perf_counter()
    for _ in range(first_iters):
        c = Capture(x, a, b, nodes)
        t = time.perf_counter()
        c.graph.replay()
        launch_s += time.perf_counter() - t
        record_s += c.record_s
        prepare_s += c.prepare_s
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    holder = {}

    def capture_fresh():
        holder["c"] = Capture(x, a, b, nodes)

    first_gpu = gpu_us_per_node(lambda: holder["c"].graph.replay(), nodes, stream,
                                before=capture_fresh)
    results.append(result("first", first_iters * nodes, wall_s, record_s, prepare_s, launch_s,
                          first_gpu, ok(holder["c"].y)))

    # Replay: captured once.
    captured = Capture(x, a, b, nodes)
    for _ in range(5):
        captured.graph.replay()
    torch.cuda.synchronize()
    launch_s = 0.0
    start = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        captured.graph.replay()
        launch_s += time.perf_counter() - t
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    results.append(result("replay", iters * nodes, wall_s, launch_s=launch_s,
                          gpu=gpu_us_per_node(captured.graph.replay, nodes, stream),
                          correct=ok(captured.y)))

    print(f"torch {torch.__version__} pointwise chain: {nodes} nodes, {args.elements} f32 "
          f"elements, {iters} iterations on {torch.cuda.get_device_name(0)}")
    print(f"{'mode':<8} {'us/node':>9} | {'host':>9} {'record':>9} {'prepare':>9} "
          f"{'launch':>9} | {'gpu':>9} {'correct':>8}")
    for r in results:
        print(f"{r['mode']:<8} {r['us_per_node']:>9.3f} | {r['host_us_per_node']:>9.3f} "
              f"{r['record_us_per_node']:>9.3f} {r['prepare_us_per_node']:>9.3f} "
              f"{r['launch_us_per_node']:>9.3f} | {r['gpu_us_per_node']:>9.3f} "
              f"{'yes' if r['correct'] else 'NO':>8}")
    write_report(args.json, report("torch_pointwise_chain", benchmark="torch_pointwise_chain",
                                   nodes=nodes, elements=args.elements, iters=iters,
                                   results=results))
    return 0 if all(r["correct"] for r in results) else 2


if __name__ == "__main__":
    raise SystemExit(main())
