#!/usr/bin/env python3
"""PyTorch reference for bench/bench_conv.cpp: ResNet-50's distinct convolutions at N=64,
forward, backward-data and backward-filter, bf16 and f32 (TF32 allowed), channels_last,
cudnn.benchmark=True. Same shape names as bench_conv.

    python3 bench/torch_conv.py [--json FILE] [--iters N] [--repeats N] [--targets]
                                [--shapes NAME,...] [--ops fprop,dgrad,wgrad] [--dtypes bf16,f32]

--shapes keeps the named shapes (e.g. l4_1x1s2_c1024k2048_14, ResNet-50's stage-4
downsample), --ops and --dtypes narrow further, as in bench_conv.

Timing: CUDA events around `iters` calls after warm-up (which runs cudnn.benchmark's search),
the median per call over `repeats` runs. dgrad and wgrad through
torch.ops.aten.convolution_backward with output_mask selecting one gradient. Random inputs.
"""
import argparse

import torch

from common.torch_bench import report, time_us, write_report

BATCH = 64
# name, C, K, input H=W, R=S, stride, pad, has an issue target
SHAPES = [
    ("conv1_7x7s2_c3k64_224", 3, 64, 224, 7, 2, 3, True),
    ("l1_1x1_c64k64_56", 64, 64, 56, 1, 1, 0, False),
    ("l1_3x3_c64k64_56", 64, 64, 56, 3, 1, 1, True),
    ("l1_1x1_c64k256_56", 64, 256, 56, 1, 1, 0, True),
    ("l1_1x1_c256k64_56", 256, 64, 56, 1, 1, 0, False),
    ("l2_1x1_c256k128_56", 256, 128, 56, 1, 1, 0, False),
    ("l2_3x3s2_c128k128_56", 128, 128, 56, 3, 2, 1, False),
    ("l2_1x1_c128k512_28", 128, 512, 28, 1, 1, 0, False),
    ("l2_1x1s2_c256k512_56", 256, 512, 56, 1, 2, 0, False),
    ("l2_1x1_c512k128_28", 512, 128, 28, 1, 1, 0, False),
    ("l2_3x3_c128k128_28", 128, 128, 28, 3, 1, 1, True),
    ("l3_1x1_c512k256_28", 512, 256, 28, 1, 1, 0, False),
    ("l3_3x3s2_c256k256_28", 256, 256, 28, 3, 2, 1, False),
    ("l3_1x1_c256k1024_14", 256, 1024, 14, 1, 1, 0, False),
    ("l3_1x1s2_c512k1024_28", 512, 1024, 28, 1, 2, 0, False),
    ("l3_1x1_c1024k256_14", 1024, 256, 14, 1, 1, 0, True),
    ("l3_3x3_c256k256_14", 256, 256, 14, 3, 1, 1, True),
    ("l4_1x1_c1024k512_14", 1024, 512, 14, 1, 1, 0, False),
    ("l4_3x3s2_c512k512_14", 512, 512, 14, 3, 2, 1, False),
    ("l4_1x1_c512k2048_7", 512, 2048, 7, 1, 1, 0, False),
    ("l4_1x1s2_c1024k2048_14", 1024, 2048, 14, 1, 2, 0, False),
    ("l4_1x1_c2048k512_7", 2048, 512, 7, 1, 1, 0, False),
    ("l4_3x3_c512k512_7", 512, 512, 7, 3, 1, 1, True),
]
# --depthwise (groups == C == K): name, C, K, H=W, R=S, stride, pad, target, groups
DEPTHWISE = [
    ("dw3x3_c256_56", 256, 256, 56, 3, 1, 1, True, 256),
    ("dw3x3s2_c256_56", 256, 256, 56, 3, 2, 1, False, 256),
    ("dw7x7_c96_56", 96, 96, 56, 7, 1, 3, True, 96),
    ("dw7x7_c192_28", 192, 192, 28, 7, 1, 3, True, 192),
    ("dw7x7_c384_14", 384, 384, 14, 7, 1, 3, True, 384),
    ("dw7x7_c768_7", 768, 768, 7, 7, 1, 3, True, 768),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--targets", action="store_true")
    parser.add_argument("--shapes", help="comma-separated shape names (default: all)")
    parser.add_argument("--ops", default="fprop,dgrad,wgrad")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--depthwise", action="store_true",
                        help="the depthwise shapes instead of ResNet-50's")
    args = parser.parse_args()
    table = [s + (1,) for s in SHAPES] if not args.depthwise else DEPTHWISE
    names = {s[0] for s in table}
    shapes = set(args.shapes.split(",")) if args.shapes else None
    if shapes and not shapes <= names:
        parser.error(f"unknown shapes: {', '.join(sorted(shapes - names))}")
    ops = set(args.ops.split(","))
    dtypes = set(args.dtypes.split(","))
    if not ops <= {"fprop", "dgrad", "wgrad"} or not dtypes <= {"bf16", "f32"}:
        parser.error("--ops takes fprop, dgrad, wgrad; --dtypes bf16, f32")

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}")
    results = []
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        if dtype_name not in dtypes:
            continue
        for name, c, k, hw, r, s, p, target, groups in table:
            if shapes is not None and name not in shapes:
                continue
            if shapes is None and args.targets and not target:
                continue
            o = (hw + 2 * p - r) // s + 1
            cl = torch.channels_last
            x = torch.rand(BATCH, c, hw, hw, device=dev, dtype=dtype).mul_(2).sub_(1)
            x = x.contiguous(memory_format=cl)
            w = torch.rand(k, c // groups, r, r, device=dev, dtype=dtype).mul_(2).sub_(1)
            w = w.contiguous(memory_format=cl)
            dy = torch.rand(BATCH, k, o, o, device=dev, dtype=dtype).mul_(2).sub_(1)
            dy = dy.contiguous(memory_format=cl)
            stride, pad, dil = [s, s], [p, p], [1, 1]
            flops = 2.0 * BATCH * k * o * o * (c // groups) * r * r

            def fprop():
                return torch.nn.functional.conv2d(x, w, None, stride, pad, dil, groups)

            def dgrad():
                return torch.ops.aten.convolution_backward(
                    dy, x, w, None, stride, pad, dil, False, [0, 0], groups, [True, False, False])

            def wgrad():
                return torch.ops.aten.convolution_backward(
                    dy, x, w, None, stride, pad, dil, False, [0, 0], groups, [False, True, False])

            for op, fn in (("fprop", fprop), ("dgrad", dgrad), ("wgrad", wgrad)):
                if op not in ops:
                    continue
                # Warm-up: cudnn.benchmark picks its algorithm there.
                ms = time_us(lambda i: fn(), args.iters, args.repeats, warmup=5) / 1e3
                results.append({"shape": name, "op": op, "dtype": dtype_name, "flops": flops,
                                "ms": ms, "tflops": flops / ms / 1e9})
                print(f"{name:24s} {op:5s} {dtype_name:4s} {ms:8.4f} ms "
                      f"{flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
    write_report(args.json, report("torch_conv", cudnn_version=torch.backends.cudnn.version(),
                                   batch=BATCH, layout="channels_last", results=results))


if __name__ == "__main__":
    main()
