"""PyTorch DDP side of the data-parallel benchmark (issue 16): ResNet-50 training on N GPUs of
one machine, batch B per GPU, bf16 autocast with f32 master weights, channels_last, SGD
momentum 0.9, cudnn.benchmark, one synthetic batch per rank made on its GPU once, DDP with
25 MB buckets (gradient_as_bucket_view). With one process (no torchrun) the model is not
wrapped: the single-GPU baseline of the scaling efficiency.

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/torch_ddp.py \
        --batch 256 [--steps 40] [--warmup 10] [--json FILE]
    python3 bench/torch_ddp.py --batch 256            # one GPU, no DDP

--sync-bn converts the batch norms to torch.nn.SyncBatchNorm (DDP runs only): the comparison
for fusebox train --sync-bn.

Rank 0 prints and writes: images/s of the whole run (all ranks' images over the wall time of
--steps steps after --warmup, one synchronize at each end and a barrier), ms per step.
"""
import argparse
import json
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torchvision
except ImportError as e:
    print(f"torch_ddp: PyTorch or torchvision is not installed ({e})", file=sys.stderr)
    sys.exit(2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--json", default="")
    p.add_argument("--sync-bn", action="store_true")
    a = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, a.model)(weights=None, num_classes=1000)
    if a.sync_bn and world > 1:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.cuda().to(memory_format=torch.channels_last)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local], bucket_cap_mb=25, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda", generator=g).to(
        memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device="cuda", generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    images = a.steps * a.batch * world
    result = {"bench": "torch_ddp", "model": a.model, "gpus": world, "batch_per_gpu": a.batch,
              "precision": "bf16", "sync_bn": a.sync_bn and world > 1, "steps": a.steps, "warmup": a.warmup,
              "images_per_s": images / seconds, "ms_per_step": 1000 * seconds / a.steps,
              "final_loss": float(loss), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(local)}
    if rank == 0:
        sync = ", SyncBatchNorm" if result["sync_bn"] else ""
        print(f"torch_ddp {a.model} {world} GPU(s), batch {a.batch} each, bf16{sync}: "
              f"{result['images_per_s']:.1f} images/s, {result['ms_per_step']:.2f} ms/step")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
