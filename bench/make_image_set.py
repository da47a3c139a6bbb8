#!/usr/bin/env python3
"""An ImageNet-like set of JPEG files for the input pipeline's benchmarks (issue 42): --images
JPEGs of --width x --height (default 500 x 375, ImageNet's typical size) at --quality (90), in
--classes class folders (DIR/train/<class>/<n>.jpg, PyTorch's ImageFolder layout) and, with
--shards N, the same images as N WebDataset tar shards (DIR/shards/train-{0000..N-1}.tar:
key.jpg + key.cls). Each image is its class's colour and a plane wave of its own phase plus noise,
so that a model can learn the set and the JPEG coder meets texture, not flat colour. Seeded: the
same arguments give the same files.

    python3 bench/make_image_set.py DIR [--images 50000] [--classes 100] [--shards 64]
        [--width 500] [--height 375] [--quality 90] [--seed 0] [--workers N]

Needs numpy and Pillow (the GPU machine's PyTorch environment has both)."""
import argparse
import io
import os
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor


def image_bytes(index, args):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng([args.seed, index])
    cls = index % args.classes
    y, x = np.mgrid[0:args.height, 0:args.width].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi)
    wave = 60 * np.sin(x * (0.01 + 0.002 * (cls % 7)) + y * 0.013 + phase)
    colour = np.array([(cls * 37) % 200 + 28, (cls * 91) % 200 + 28, (cls * 53) % 200 + 28],
                      np.float32)
    pixels = colour + wave[..., None] + rng.normal(0, 12, (args.height, args.width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG",
                                                                   quality=args.quality)
    return cls, out.getvalue()


def write_range(start, stop, args):
    for i in range(start, stop):
        cls, data = image_bytes(i, args)
        path = os.path.join(args.dir, "train", f"class{cls:04d}", f"{i:08d}.jpg")
        with open(path, "wb") as f:
            f.write(data)
    return stop - start


def write_shard(shard, args):
    per = (args.images + args.shards - 1) // args.shards
    name = os.path.join(args.dir, "shards", f"train-{shard:04d}.tar")
    with tarfile.open(name, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(shard * per, min(args.images, (shard + 1) * per)):
            cls, data = image_bytes(i, args)
            for suffix, payload in ((".jpg", data), (".cls", str(cls).encode())):
                info = tarfile.TarInfo(f"{i:08d}{suffix}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--images", type=int, default=50000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--shards", type=int, default=0)
    ap.add_argument("--width", type=int, default=500)
    ap.add_argument("--height", type=int, default=375)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if args.images < 1 or args.classes < 1 or args.shards < 0:
        ap.error("--images and --classes must be >= 1, --shards >= 0")
    for c in range(args.classes):
        os.makedirs(os.path.join(args.dir, "train", f"class{c:04d}"), exist_ok=True)
    chunk = max(1, args.images // (args.workers * 8))
    with ProcessPoolExecutor(args.workers) as pool:
        done = sum(pool.map(write_range, range(0, args.images, chunk),
                            [min(args.images, s + chunk) for s in range(0, args.images, chunk)],
                            [args] * len(range(0, args.images, chunk))))
        print(f"{done} JPEGs in {os.path.join(args.dir, 'train')} ({args.classes} classes)")
        if args.shards:
            os.makedirs(os.path.join(args.dir, "shards"), exist_ok=True)
            names = list(pool.map(write_shard, range(args.shards), [args] * args.shards))
            print(f"{len(names)} shards in {os.path.join(args.dir, 'shards')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
