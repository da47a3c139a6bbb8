#!/usr/bin/env python3
"""PyTorch reference for bench/bench_conv_fusion.cpp: the same convolution + epilogue cases
(bf16, channels_last, batch 64, cudnn.benchmark), eager (conv with bias, then relu / add +
relu as their own kernels) and, with --compile, through torch.compile (Inductor may fuse the
epilogue into its own kernel after cuDNN's convolution).

    python3 bench/torch_conv_fusion.py [--json FILE] [--iters N] [--repeats N] [--compile]
"""
import argparse

import torch
import torch.nn.functional as F

from common.torch_bench import report, time_us, write_report

BATCH = 64
# name, C, K, H=W, R, residual: as bench_conv_fusion.cpp's kCases
CASES = [
    ("anchor_1x1_c64k256_56_bias_relu", 64, 256, 56, 1, False),
    ("l1_3x3_c64k64_56_bias_relu", 64, 64, 56, 3, False),
    ("l1_end_1x1_c64k256_56_residual_relu", 64, 256, 56, 1, True),
    ("l2_end_1x1_c128k512_28_residual_relu", 128, 512, 28, 1, True),
    ("l3_end_1x1_c256k1024_14_residual_relu", 256, 1024, 14, 1, True),
    ("l4_end_1x1_c512k2048_7_residual_relu", 512, 2048, 7, 1, True),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    dev, dt, cl = torch.device("cuda"), torch.bfloat16, torch.channels_last
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cudnn {torch.backends.cudnn.version()}")

    def rand(*shape):
        return torch.rand(*shape, device=dev, dtype=dt).mul_(2).sub_(1)

    results = []
    for name, c, k, hw, r, residual in CASES:
        x = rand(BATCH, c, hw, hw).contiguous(memory_format=cl)
        w = rand(k, c, r, r).contiguous(memory_format=cl)
        b = rand(k)
        z = rand(BATCH, k, hw, hw).contiguous(memory_format=cl)
        pad = r // 2

        def block(x, w, b, z):
            y = F.conv2d(x, w, b, 1, pad)
            return F.relu(y + z) if residual else F.relu(y)

        def conv_only(x, w):
            return F.conv2d(x, w, None, 1, pad)

        row = {"case": name}
        row["eager_ms"] = time_us(lambda i: block(x, w, b, z), args.iters, args.repeats, 5) / 1e3
        row["conv_ms"] = time_us(lambda i: conv_only(x, w), args.iters, args.repeats, 5) / 1e3
        if args.compile:
            compiled = torch.compile(block)
            row["compile_ms"] = time_us(lambda i: compiled(x, w, b, z), args.iters,
                                        args.repeats, 5) / 1e3
        results.append(row)
        print(f"{name:40s} eager {row['eager_ms']:.4f} ms  conv alone {row['conv_ms']:.4f} ms"
              + (f"  compiled {row['compile_ms']:.4f} ms" if args.compile else ""), flush=True)
    write_report(args.json, report("torch_conv_fusion", cudnn_version=torch.backends.cudnn.version(),
                                   batch=BATCH, dtype="bf16", layout="channels_last",
                                   results=results))


if __name__ == "__main__":
    main()
