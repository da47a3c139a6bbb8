#!/usr/bin/env python3
"""The CPU backend against onnxruntime, on inputs neither has seen before.

Two sets (ctest runs this as `onnxruntime_crosscheck`; scripts/setup.sh installs the pinned
onnxruntime, onnx and numpy into .venv):
  zoo    models written by our exporter (`fusebox zoo`), a random input each;
  node   every ONNX node test that fusebox's conformance run passes, with its stored inputs
         perturbed: floats scaled elementwise by U(0.8, 1.2) (signs, and so the domains of
         log, sqrt, pow, kept), integer and bool inputs as stored (indices, shapes, masks).
Both run `fusebox run --device cpu`; onnxruntime runs the same model (for node tests whose
shape-like inputs the importer must know, both run a copy of the model with those inputs
as initializers of the stored values). Outputs must agree within the dtype's tolerance,
relative to the output's scale; NaN matches NaN. Prints one line per mismatch and a
summary; exits 1 on any mismatch, 77 (ctest's skip) when onnxruntime is not installed.

  crosscheck.py --fusebox BIN --conformance BIN --data NODE_TEST_DIR --skips FILE [--work DIR]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
except ImportError as e:  # not set up: a skip, not a failure
    print(f"crosscheck: skipped: {e} (scripts/setup.sh installs onnxruntime into .venv)")
    sys.exit(77)

# rtol, atol per output dtype: both compute f32 on the CPU; for f16 / bf16 onnxruntime may
# compute in the narrow type where fusebox computes in f32 and rounds once.
TOLERANCE = {np.dtype(np.float64): (1e-7, 1e-7), np.dtype(np.float32): (1e-4, 1e-5),
             np.dtype(np.float16): (4e-3, 2e-3)}


def sanitized(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def run_fusebox(fusebox, model, feeds, work):
    """Outputs of `fusebox run` by output name, or an error string."""
    out_dir = os.path.join(work, "out")
    shutil.rmtree(out_dir, ignore_errors=True)
    args = [fusebox, "run", model, "--device", "cpu", "--output-dir", out_dir]
    for i, (name, value) in enumerate(feeds.items()):
        path = os.path.join(work, f"in{i}.npy")
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return (r.stderr or r.stdout).strip().splitlines()[-1:] or ["failed"]
    outs = {}
    for o in onnx.load(model, load_external_data=False).graph.output:
        path = os.path.join(out_dir, sanitized(o.name) + ".npy")
        if not os.path.exists(path):
            return [f"no output file for '{o.name}'"]
        outs[o.name] = np.load(path)
    return outs


def run_ort(model, feeds):
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def compare(ref, got):
    """None when they agree, else what differs."""
    for name, r in ref.items():
        g = got.get(name)
        if g is None:
            return f"output '{name}' missing"
        if g.shape != r.shape:
            return f"output '{name}': shape {g.shape} vs onnxruntime's {r.shape}"
        if r.dtype.kind in "biu" or r.dtype == np.bool_:
            if not np.array_equal(g.astype(r.dtype), r):
                return f"output '{name}': {int((g.astype(r.dtype) != r).sum())} values differ"
            continue
        rtol, atol = TOLERANCE.get(r.dtype, (1e-2, 1e-2))
        rf, gf = r.astype(np.float64), g.astype(np.float64)
        nan = np.isnan(rf)
        if not np.array_equal(nan, np.isnan(gf)):
            return f"output '{name}': NaNs differ"
        finite = np.isfinite(rf) & ~nan
        if not np.array_equal(rf[~finite & ~nan], gf[~finite & ~nan]):
            return f"output '{name}': infinities differ"
        scale = max(1.0, float(np.abs(rf[finite]).max())) if finite.any() else 1.0
        err = float(np.abs(rf[finite] - gf[finite]).max()) if finite.any() else 0.0
        if err > atol + rtol * scale:
            return f"output '{name}': max |diff| {err:.3g} > {atol + rtol * scale:.3g}"
    return None


def check_zoo(fusebox, work):
    results = []
    for name, args in [("small_cnn", ["--image-size", "32", "--num-classes", "10"]),
                       ("resnet18", ["--image-size", "64", "--num-classes", "10"]),
                       ("vit_test", []), ("convnext_test", [])]:
        model = os.path.join(work, f"{name}.onnx")
        subprocess.run([fusebox, "zoo", name, "--out", model, "--batch", "2"] + args,
                       check=True, capture_output=True)
        rng = np.random.default_rng(7)
        feeds = {}
        for i in onnx.load(model).graph.input:
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.uniform(-1, 1, dims).astype(np.float32)
        got = run_fusebox(fusebox, model, feeds, work)
        why = got[0] if isinstance(got, list) else compare(run_ort(model, feeds), got)
        results.append((f"zoo {name}", why))
    return results


def passing_node_tests(conformance, data, skips):
    r = subprocess.run([conformance, "--data", data, "--skips", skips, "--device", "cpu",
                        "--verbose"], capture_output=True, text=True, timeout=1800)
    return [line.split()[1] for line in r.stdout.splitlines() if line.startswith("passed ")]


def node_inputs(test_dir, model):
    data = os.path.join(test_dir, "test_data_set_0")
    values = []
    for i in range(len(model.graph.input)):
        path = os.path.join(data, f"input_{i}.pb")
        if not os.path.exists(path):
            break
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        values.append(numpy_helper.to_array(t))
    initialized = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initialized]
    return dict(zip(names, values))


def frozen(model, values, keep, path):
    """`model` with every input not in `keep` turned into an initializer of its value."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name, v in values.items():
        if name in keep:
            continue
        for k, i in enumerate(m.graph.input):
            if i.name == name:
                del m.graph.input[k]
                break
        m.graph.initializer.append(numpy_helper.from_array(v, name))
    onnx.save(m, path)
    return path


def check_node_test(fusebox, data, test, work, rng):
    test_dir = os.path.join(data, test)
    model = onnx.load(os.path.join(test_dir, "model.onnx"))
    stored = node_inputs(test_dir, model)
    feeds = {}
    for name, v in stored.items():
        if v.dtype.kind == "f":
            v = np.asarray(v * rng.uniform(0.8, 1.2, v.shape)).astype(v.dtype)
        feeds[name] = v
    # Fed as graph inputs where the importer takes them, else (a "must be known" refusal)
    # the floats only, then the first input only, then none; frozen inputs keep their
    # stored values (Resize's scales, Range's bounds: a perturbed shape is another test).
    float_inputs = [n for n, v in feeds.items() if v.dtype.kind == "f"]
    attempts = [list(feeds), float_inputs, list(feeds)[:1], []]
    why = None
    for keep in attempts:
        path = os.path.join(work, "model.onnx")
        frozen(model, stored, set(keep), path)
        got = run_fusebox(fusebox, path, {n: feeds[n] for n in keep}, work)
        if isinstance(got, list):
            why = got[0]
            if "must be known" in why or "known at import" in why:
                continue
            return why
        try:
            ref = run_ort(path, {n: feeds[n] for n in keep})
        except Exception as e:  # onnxruntime cannot run this test: not ours to judge
            return f"SKIP onnxruntime: {str(e).splitlines()[0][:120]}"
        return compare(ref, got)
    return why


def main():
    ort.set_default_logger_severity(3)  # errors only: old-opset test models warn
    ap = argparse.ArgumentParser()
    ap.add_argument("--fusebox", required=True)
    ap.add_argument("--conformance", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--skips", required=True)
    ap.add_argument("--work")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="fusebox_ort_")
    os.makedirs(work, exist_ok=True)
    results = check_zoo(a.fusebox, work)
    rng = np.random.default_rng(20261125)
    tests = passing_node_tests(a.conformance, a.data, a.skips)
    for test in tests:
        results.append((test, check_node_test(a.fusebox, a.data, test, work, rng)))
    bad = [(t, w) for t, w in results if w and not w.startswith("SKIP")]
    skipped = [(t, w) for t, w in results if w and w.startswith("SKIP")]
    for t, w in skipped:
        print(f"skipped   {t}: {w[5:]}")
    for t, w in bad:
        print(f"MISMATCH  {t}: {w}")
    print(f"onnxruntime {ort.__version__} crosscheck: {len(results) - len(bad) - len(skipped)} "
          f"agree, {len(bad)} differ, {len(skipped)} onnxruntime cannot run "
          f"({len(tests)} node tests, {len(results) - len(tests)} zoo models)")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
