#!/usr/bin/env python3
"""Compares every .npy in two output directories (fusebox run --output-dir).

Usage: compare_outputs.py REF_DIR TEST_DIR [--rtol R]
Passes when, for every array, max|test - ref| <= rtol * max(1, max|ref|): a tolerance
relative to the output's scale, because logits of a deep network carry the accumulated
rounding of every layer (f32 here: a few 1e-5 of the largest logit is normal, 1e-3 is not).
"""
import argparse, pathlib, sys
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("ref"); ap.add_argument("test")
ap.add_argument("--rtol", type=float, default=1e-3)
a = ap.parse_args()
refs = sorted(pathlib.Path(a.ref).glob("*.npy"))
if not refs:
    sys.exit(f"compare_outputs: no .npy in {a.ref}")
ok = True
for r in refs:
    t = pathlib.Path(a.test) / r.name
    if not t.exists():
        print(f"{r.name}: missing in {a.test}"); ok = False; continue
    x, y = np.load(r).astype(np.float64), np.load(t).astype(np.float64)
    if x.shape != y.shape:
        print(f"{r.name}: shape {y.shape} != {x.shape}"); ok = False; continue
    scale = max(1.0, float(np.abs(x).max()))
    err = float(np.abs(x - y).max())
    good = err <= a.rtol * scale and np.isfinite(y).all()
    ok &= good
    print(f"{r.name}: shape {x.shape} max|ref| {scale:.4g} max|diff| {err:.3g} "
          f"(limit {a.rtol * scale:.3g}) {'ok' if good else 'FAIL'}")
sys.exit(0 if ok else 1)
