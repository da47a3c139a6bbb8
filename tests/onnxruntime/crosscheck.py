#!/usr/bin/env python3
"""The CPU backend against onnxruntime, on inputs neither has seen before.

Three sets (ctest runs this as `onnxruntime_crosscheck`; scripts/setup.sh installs the pinned
onnxruntime, onnx and numpy into .venv):
  zoo    models written by our exporter (`fusebox zoo`), a random input each;
  opset  one-node models of the ops that changed in opsets 18-22 (written here), random input;
  node   every ONNX node test that fusebox's conformance run passes, with its stored inputs
         perturbed: floats scaled elementwise by U(0.8, 1.2) (signs, and so the domains of
         log, sqrt, pow, kept), integer and bool inputs as stored (indices, shapes, masks).
Both run `fusebox run --device cpu` (the fast kernels: oneDNN where it takes the node, the
reference kernels elsewhere; docs/cpu_fast.md); onnxruntime runs the same model (for node tests whose
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


# Models of opsets 18-22 (written here with onnx.helper: the node tests are opset <= 17):
# name, opset, nodes, inputs {name: shape}, initializers {name: array}, output names.
def opset_models():
    h = onnx.helper
    i64 = lambda *v: np.array(v, dtype=np.int64)
    f32 = lambda *v: np.array(v, dtype=np.float32)
    x4 = {"x": [2, 6, 5, 7]}
    m = []
    m.append(("reduce_mean_axes_input_18", 18,
              [h.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0, noop_with_empty_axes=0)], x4,
              {"axes": i64(1, -1)}, ["y"]))
    m.append(("reduce_max_no_axes_18", 18, [h.make_node("ReduceMax", ["x"], ["y"])], x4, {},
              ["y"]))
    m.append(("split_num_outputs_18", 18,
              [h.make_node("Split", ["x"], ["a", "b", "c"], axis=3, num_outputs=3)], x4, {},
              ["a", "b", "c"]))
    m.append(("pad_axes_18", 18,
              [h.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode="reflect")], x4,
              {"pads": i64(1, 2, 2, 1), "axes": i64(2, -1)}, ["y"]))
    m.append(("pad_wrap_19", 19, [h.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")], x4,
              {"pads": i64(0, 0, 2, 3, 0, 0, 1, -2)}, ["y"]))
    m.append(("group_norm_18", 18,
              [h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3,
                           epsilon=1e-3)], x4, {"s": f32(0.5, -1.0, 2.0),
                                                "b": f32(0.1, 0.2, -0.3)}, ["y"]))
    m.append(("group_norm_21", 21,
              [h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)], x4,
              {"s": f32(1, 2, 3, -1, 0.5, 1), "b": f32(0, 1, 0, -1, 0, 2)}, ["y"]))
    for approximate in ("none", "tanh"):
        m.append((f"gelu_{approximate}_20", 20,
                  [h.make_node("Gelu", ["x"], ["y"], approximate=approximate)], x4, {}, ["y"]))
    m.append(("cast_like_floor_ceil_round_19", 19,
              [h.make_node("Mul", ["x", "k"], ["xk"]), h.make_node("Floor", ["xk"], ["f"]),
               h.make_node("Ceil", ["xk"], ["c"]), h.make_node("Round", ["xk"], ["r"]),
               h.make_node("CastLike", ["f", "i"], ["fi"])], x4,
              {"k": f32(3.0), "i": i64(0)}, ["f", "c", "r", "fi"]))
    m.append(("resize_axes_not_larger_18", 18,
              [h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                           axes=[3, 2], keep_aspect_ratio_policy="not_larger")], x4,
              {"sizes": i64(9, 8)}, ["y"]))
    m.append(("resize_half_pixel_symmetric_19", 19,
              [h.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear",
                           coordinate_transformation_mode="half_pixel_symmetric")], x4,
              {"scales": f32(1, 1, 1.7, 0.6)}, ["y"]))
    m.append(("resize_cubic_align_corners_13", 13,
              [h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic",
                           coordinate_transformation_mode="align_corners")], x4,
              {"sizes": i64(2, 6, 9, 4)}, ["y"]))
    m.append(("resize_linear_fractional_13", 13,
              [h.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], x4,
              {"scales": f32(1, 1, 2.5, 0.75)}, ["y"]))
    m.append(("resize_nearest_ceil_asymmetric_13", 13,
              [h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                           coordinate_transformation_mode="asymmetric", nearest_mode="ceil")],
              x4, {"sizes": i64(2, 6, 3, 11)}, ["y"]))
    return m


def check_opset_models(fusebox, work):
    results = []
    h = onnx.helper
    rng = np.random.default_rng(18)
    for name, opset, nodes, inputs, inits, outputs in opset_models():
        graph = h.make_graph(
            nodes, name,
            [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs.items()],
            [h.make_tensor_value_info(n, onnx.TensorProto.INT64 if n == "fi" else
                                      onnx.TensorProto.FLOAT, None) for n in outputs],
            [numpy_helper.from_array(v, n) for n, v in inits.items()])
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
        path = os.path.join(work, f"{name}.onnx")
        onnx.save(model, path)
        feeds = {n: rng.uniform(-2, 2, s).astype(np.float32) for n, s in inputs.items()}
        got = run_fusebox(fusebox, path, feeds, work)
        if isinstance(got, list):
            results.append((f"opset {name}", got[0]))
            continue
        try:
            ref = run_ort(path, feeds)
        except Exception as e:  # onnxruntime cannot run this model: not ours to judge
            results.append((f"opset {name}", f"SKIP onnxruntime: {str(e).splitlines()[0][:120]}"))
            continue
        results.append((f"opset {name}", compare(ref, got)))
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


# Node tests where onnxruntime departs from ONNX's reference implementation (which wrote the
# tests' expected outputs, and which the conformance run holds fusebox to): not ours to judge.
ORT_DIFFERS_FROM_REFERENCE = {
    name: "align_corners with scales: onnxruntime divides by the rounded output length, "
          "ONNX's reference by the unrounded scale * length (2.4 for 4 * 0.6)"
    for name in ("test_resize_downsample_scales_cubic_align_corners",
                 "test_resize_downsample_scales_linear_align_corners")
}


def check_node_test(fusebox, data, test, work, rng):
    if test in ORT_DIFFERS_FROM_REFERENCE:
        return f"SKIP onnxruntime differs from ONNX's reference: {ORT_DIFFERS_FROM_REFERENCE[test]}"
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
    results = check_zoo(a.fusebox, work) + check_opset_models(a.fusebox, work)
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
          f"({len(tests)} node tests, {len(results) - len(tests)} zoo and opset 18-22 models)")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
