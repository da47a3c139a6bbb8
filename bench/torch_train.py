"""PyTorch side of `fusebox bench`: a torchvision model's training step or inference, timed the
same way, so that one GPU run gives both sides of the table. Random weights (weights=None: no
download), channels_last model and input, cudnn.benchmark on.

    python3 bench/torch_train.py --model resnet50 --mode train|infer --batch 256 \
        --precision f32|tf32|bf16|f16 [--image-size 224] [--num-classes 1000] [--steps 50] \
        [--warmup 10] [--compile eager|compile|both] [--cuda-graph] [--json FILE] [--device cuda]

f32: TF32 off for convolutions and matmuls; tf32: on; bf16/f16: autocast, f32 master weights
(f16 with a GradScaler, which reads found-inf on the host every step, as PyTorch f16 does).
Train: SGD lr 0.05 (fusebox train's default, not scaled with the batch: speed does not depend
on it, the labels are random, the loss only has to stay finite), momentum 0.9, cross-entropy,
one synthetic batch made on the device once. Infer: eval + inference_mode; each step copies the
input from pinned host memory and the logits back to pinned host memory, non_blocking (as
fusebox's inference bench does); --cuda-graph adds the replay of a captured forward.
Per variant: the first step (s; compilation and graph capture included); after --warmup steps,
--steps timed steps: ms per step from CUDA events (upper median, min, max; the host clock on
--device cpu), images/s from their wall time with one synchronize at the end, peak device
memory of the timed steps and of the whole variant, the final loss (train). Inductor's caches
are off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 unless set), so that the compile variants' first
step is a cold compile; cuDNN's autotuning is kept within the process, so a variant after the
first (eager+graph, say) finds its convolutions' algorithms already chosen.
Exit 2 when it cannot run at all (no torch, torchvision or CUDA; unknown model), 1 when a
variant failed (its error is in the table and the JSON), else 0.
"""
import argparse
import gc
import math
import os
import platform
import sys
import time

# Read when torch is imported: a compile time read from a warm cache would mean nothing.
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
try:
    import torch
except ImportError as e:
    print(f"torch_train: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(2)

from common.torch_bench import SCHEMA_VERSION, report, source_commit, write_report

BENCH = "torch_train"
AUTOCAST = {"f32": None, "tf32": None, "bf16": torch.bfloat16, "f16": torch.float16}


def fail(message):
    print(f"{BENCH}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet50", help="a torchvision model name")
    ap.add_argument("--mode", choices=("train", "infer"), default="train")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--precision", choices=tuple(AUTOCAST), default="tf32")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps after the first")
    ap.add_argument("--compile", choices=("eager", "compile", "both"), default="eager")
    ap.add_argument("--cuda-graph", action="store_true", help="infer: add CUDA-graph replay")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a smoke test)")
    args = ap.parse_args()
    if min(args.batch, args.image_size, args.num_classes, args.steps) < 1 or args.warmup < 0:
        ap.error("--batch, --image-size, --num-classes and --steps must be >= 1, --warmup >= 0")
    if args.cuda_graph and (args.mode != "infer" or not args.device.startswith("cuda")):
        ap.error("--cuda-graph applies to --mode infer on a CUDA device")
    return args


def logits_of(out):
    # Inception and GoogLeNet return (logits, aux...) in train mode.
    return out if torch.is_tensor(out) else out[0]


def autocast(device, dtype, cache=True):
    # Weight casts must not be cached across a graph capture (PyTorch's CUDA-graph notes).
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None,
                          cache_enabled=cache)


def make_train_step(model, fwd, args, device, dtype):
    """The training step, and its synthetic batch made once on the device."""
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device,
                    generator=gen).contiguous(memory_format=torch.channels_last)
    # Random classes, not zeros: one class for all is fitted by the last layer's bias alone.
    # The same batch every step, so the loss falls fast: it is a sanity check, not accuracy.
    y = torch.randint(0, args.num_classes, (args.batch,), device=device, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            loss = loss_fn(logits_of(fwd(x)), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss
    return step


def make_infer_step(fwd, args, device, dtype, graph):
    """Host input in, logits out to the host; with `graph`, a captured forward (the setup,
    warm-up and capture, happens here, and so counts in the first step's time)."""
    shape = (args.batch, args.image_size, args.image_size, 3)
    host = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    # NHWC memory seen as NCHW: a channels_last view, so the copy is one plain memcpy.
    host = (host.pin_memory() if device.type == "cuda" else host).permute(0, 3, 1, 2)
    if not graph:
        def step():
            with autocast(device, dtype):
                out = logits_of(fwd(host.to(device, non_blocking=True)))
            return out.to("cpu", non_blocking=True)  # into pinned memory: no sync per step
        return step
    static_in = host.to(device)
    side = torch.cuda.Stream()  # warm up off the default stream before capturing, per the docs
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), autocast(device, dtype, cache=False):
        for _ in range(3):
            fwd(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), autocast(device, dtype, cache=False):
        static_out = logits_of(fwd(static_in))

    def step():
        static_in.copy_(host, non_blocking=True)
        g.replay()
        return static_out.to("cpu", non_blocking=True)
    return step


def run_variant(tv, args, device, compiled, graph):
    dtype = AUTOCAST[args.precision]
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    torch.manual_seed(0)  # the same initial weights for every variant
    model = tv.models.get_model(args.model, weights=None, num_classes=args.num_classes)
    model = model.to(device, memory_format=torch.channels_last)
    model.train(args.mode == "train")
    if compiled:
        torch._dynamo.reset()  # compile from scratch: the first step's time includes it
    fwd = torch.compile(model) if compiled else model
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats(device)  # the weights already count: they stay
    with torch.inference_mode(args.mode == "infer"):
        t = time.perf_counter()
        step = (make_train_step(model, fwd, args, device, dtype) if args.mode == "train"
                else make_infer_step(fwd, args, device, dtype, graph))
        out = step()
        sync()
        first_s = time.perf_counter() - t
        for _ in range(args.warmup):
            out = step()
        sync()
        peak_warm = torch.cuda.max_memory_allocated(device) if cuda else None
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)

        # A mark after each step: CUDA events (the GPU's timeline, no sync), else the host clock.
        def mark():
            if not cuda:
                return time.perf_counter()
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        marks = [mark()]
        t = time.perf_counter()
        for _ in range(args.steps):
            out = step()
            marks.append(mark())
        sync()
        wall = time.perf_counter() - t
    ms = sorted(a.elapsed_time(b) if cuda else 1e3 * (b - a) for a, b in zip(marks, marks[1:]))
    peak_timed = torch.cuda.max_memory_allocated(device) if cuda else None
    loss = out.item() if args.mode == "train" else None
    if loss is not None and not math.isfinite(loss):
        print(f"{BENCH}: warning: the final loss is {loss}", file=sys.stderr)
    return {
        "first_step_s": first_s,
        "step_ms_median": ms[len(ms) // 2],  # the upper median, as bench/common's median()
        "step_ms_min": ms[0],
        "step_ms_max": ms[-1],
        "step_ms_source": "cuda_events" if cuda else "host_clock",
        "timed_wall_s": wall,
        "images_per_s": args.steps * args.batch / wall,
        "peak_bytes_timed": peak_timed,
        "peak_bytes_run": max(peak_warm, peak_timed) if cuda else None,
        "final_loss": loss,
    }


def cell(value, fmt, width):
    return f"{'N/A' if value is None else format(value, fmt):>{width}}"


def main():
    args = parse_args()
    try:
        import torchvision as tv
    except ImportError as e:
        fail(f"torchvision is not installed ({e})")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail("CUDA is not available (no GPU, driver or CUDA build of torch); "
                 "--device cpu runs a smoke test")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        result = report(BENCH)
        result["device"] = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        # report() names CUDA device 0; the same header for a CPU smoke test.
        result = {"schema_version": SCHEMA_VERSION, "bench": BENCH,
                  "device": f"cpu ({platform.processor() or platform.machine()})",
                  "commit": source_commit(), "torch": torch.__version__}
    else:
        fail(f"--device {args.device}: cuda, cuda:N or cpu")
    if args.model not in tv.models.list_models():
        fail(f"--model {args.model}: not a torchvision model")

    torch.backends.cudnn.benchmark = True
    # TF32 only matters for f32 tensors: off for f32, on otherwise (under autocast the
    # convolutions and matmuls are bf16/f16 anyway).
    tf32 = args.precision != "f32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32

    compiles = {"eager": (False,), "compile": (True,), "both": (False, True)}[args.compile]
    variants = [(c, g) for c in compiles for g in ((False, True) if args.cuda_graph else (False,))]
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    result.update(torchvision=tv.__version__, cudnn=cudnn, python=platform.python_version(),
                  config={**{k: v for k, v in vars(args).items() if k != "json"},
                          "device": str(device), "channels_last": True,
                          "cudnn_benchmark": True, "tf32": tf32, "optimizer": "sgd",
                          "momentum": 0.9, "autocast": args.precision in ("bf16", "f16"),
                          "grad_scaler": args.mode == "train" and args.precision == "f16"},
                  variants=[])
    print(f"torch {torch.__version__}, torchvision {tv.__version__}, cudnn {cudnn} on "
          f"{result['device']}; {args.model} {args.mode}, batch {args.batch}, "
          f"{args.image_size}x{args.image_size}, {args.precision}, "
          f"{args.steps} timed steps after 1 + {args.warmup}")
    print(f"{'variant':14} {'first s':>8} {'median ms':>10} {'min ms':>8} {'max ms':>8} "
          f"{'images/s':>9} {'peak GiB':>9} {'run GiB':>8} {'loss':>8}")
    failed = False
    for compiled, graph in variants:
        name = ("compile" if compiled else "eager") + ("+graph" if graph else "")
        try:
            r = run_variant(tv, args, device, compiled, graph)
        except Exception as e:  # one variant failing (OOM, compile error) leaves the others
            failed = True
            result["variants"].append({"variant": name, "error": f"{type(e).__name__}: {e}"})
            print(f"{name:14} failed: {type(e).__name__}: {str(e)[:200]}")
        else:
            result["variants"].append({"variant": name, **r})
            gib = [None if b is None else b / 2**30
                   for b in (r["peak_bytes_timed"], r["peak_bytes_run"])]
            print(f"{name:14} {r['first_step_s']:8.2f} {r['step_ms_median']:10.2f} "
                  f"{r['step_ms_min']:8.2f} {r['step_ms_max']:8.2f} {r['images_per_s']:9.0f} "
                  f"{cell(gib[0], '.2f', 9)} {cell(gib[1], '.2f', 8)} "
                  f"{cell(r['final_loss'], '.4f', 8)}")
        gc.collect()  # free this variant's model, optimizer and graph before the next
        if device.type == "cuda":
            torch.cuda.empty_cache()
    write_report(args.json, result)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
