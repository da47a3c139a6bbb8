"""PyTorch side of bench_resnet: torchvision's ResNet-50 inference (eval, no_grad),
channels_last, f32 (TF32 convolutions, as fusebox's default) and bf16, batch 32; each step
copies the input in and the logits out, as bench_resnet's steps do. Eager and CUDA-graph
replay. Without torchvision there it writes a JSON naming why and exits 0.

    python3 bench/torch_resnet.py [--json FILE] [--batch N] [--iters N]
"""
import argparse
import time

import torch

from common.torch_bench import report, write_report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    result = report("torch_resnet", rows=[])
    try:
        import torchvision
    except ImportError as e:
        result["error"] = f"torchvision not available: {e}"
        print(result["error"])
        write_report(args.json, result)
        return
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"torch {torch.__version__} on {result['device']}; resnet50 inference, batch {args.batch}")
    print(f"{'dtype':6} {'mode':8} {'ms/step':>10} {'images/s':>10}")
    for dtype in (torch.float32, torch.bfloat16):
        model = torchvision.models.resnet50().eval().cuda().to(dtype)
        model = model.to(memory_format=torch.channels_last)
        host = (torch.rand(args.batch, 3, 224, 224) * 2 - 1).to(dtype).pin_memory()
        static_in = torch.empty_like(host, device="cuda").to(memory_format=torch.channels_last)
        with torch.no_grad():
            for _ in range(3):
                model(static_in)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = model(static_in)

            def eager():
                x = host.cuda(non_blocking=True).to(memory_format=torch.channels_last)
                return model(x).cpu()

            def replay():
                static_in.copy_(host, non_blocking=True)
                graph.replay()
                return static_out.cpu()

            for mode, step in (("eager", eager), ("graph", replay)):
                step()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    step()
                ms = (time.perf_counter() - t0) * 1000 / args.iters
                name = "f32" if dtype == torch.float32 else "bf16"
                print(f"{name:6} {mode:8} {ms:10.3f} {args.batch * 1000 / ms:10.0f}")
                result["rows"].append({"dtype": name, "mode": mode, "batch": args.batch,
                                       "ms_per_step": ms})
    write_report(args.json, result)


if __name__ == "__main__":
    main()
