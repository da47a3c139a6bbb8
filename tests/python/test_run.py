"""Load, compile and run from Python against the CPU oracle (the reference kernels, through the
CLI and through the package), numpy round trips and DLPack inputs."""

import subprocess
import sys

import numpy as np
import pytest

import fusebox
from conftest import onnx_model


def test_load_zoo_and_file(small_cnn_onnx):
    zoo = fusebox.load("small_cnn", batch=2, image_size=32, num_classes=10)
    model = fusebox.load(str(small_cnn_onnx))
    assert [(s.name, s.dtype, s.shape) for s in model.inputs] == [("input", "f32", (2, 3, 32, 32))]
    assert [(s.name, s.dtype, s.shape) for s in model.outputs] == [("logits", "f32", (2, 10))]
    assert zoo.inputs[0].shape == model.inputs[0].shape
    assert repr(model.inputs[0]) == "TensorSpec(name='input', dtype='f32', shape=(2, 3, 32, 32))"
    assert fusebox.Model.__module__ == "fusebox"
    assert "small_cnn" in fusebox.zoo_models()


def test_cpu_ref_matches_the_cli_and_fast_is_within_tolerance(small_cnn_onnx, tmp_path):
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    subprocess.run([sys.executable, "-m", "fusebox", "run", str(small_cnn_onnx), "--device",
                    "cpu-ref", "--input", f"input={tmp_path / 'x.npy'}", "--output-dir",
                    str(tmp_path / "out")], check=True, capture_output=True)
    oracle = np.load(tmp_path / "out" / "logits.npy")

    model = fusebox.load(str(small_cnn_onnx))
    (ref,) = fusebox.compile(model, device="cpu-ref")(x)
    np.testing.assert_array_equal(ref, oracle)  # the same kernels: bit for bit
    fast = fusebox.compile(model, device="cpu")
    assert fast.stats()["fast_nodes"] > 0
    (y,) = fast(x)
    assert y.dtype == np.float32 and y.shape == (2, 10)
    np.testing.assert_allclose(y, oracle, rtol=1e-3, atol=1e-4)  # docs/cpu_fast.md
    (by_name,) = fast(input=x)
    np.testing.assert_array_equal(by_name, y)


def test_compile_takes_a_path_and_a_low_precision(small_cnn_onnx):
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    (f32,) = fusebox.compile(small_cnn_onnx, device="cpu-ref")(x)
    (bf16,) = fusebox.compile(small_cnn_onnx, device="cpu-ref", precision="bf16")(x)
    assert bf16.dtype == np.float32  # the model's outputs keep their dtype
    np.testing.assert_allclose(bf16, f32, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_])
def test_numpy_round_trip_of_every_dtype(tmp_path, dtype):
    from onnx import helper
    path = onnx_model(tmp_path / "m.onnx", [helper.make_node("Identity", ["x"], ["y"])],
                      [("x", dtype, (2, 3))], [("y", dtype, (2, 3))])
    exe = fusebox.compile(fusebox.load(str(path)), device="cpu-ref")
    x = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    (y,) = exe(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, x)
    # The output is the model's input passed through: handed out as a copy, never the caller's
    # own memory.
    assert not np.shares_memory(y, x)


def add_mul_model(tmp_path, shape=(3, 4)):
    from onnx import helper
    return fusebox.load(str(onnx_model(
        tmp_path / "add_mul.onnx",
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["sum", "b"], ["prod"])],
        [("a", np.float32, shape), ("b", np.float32, shape)],
        [("sum", np.float32, shape), ("prod", np.float32, shape)])))


def test_positional_named_and_outputs_in_order(tmp_path):
    exe = fusebox.compile(add_mul_model(tmp_path), device="cpu")
    assert [s.name for s in exe.inputs] == ["a", "b"]
    assert [s.name for s in exe.outputs] == ["sum", "prod"]
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4), np.float32), rng.standard_normal((3, 4), np.float32)
    s, p = exe(a, b)
    np.testing.assert_allclose(s, a + b, rtol=1e-6)
    np.testing.assert_allclose(p, (a + b) * b, rtol=1e-6)
    s2, p2 = exe(b=b, a=a)
    np.testing.assert_array_equal(s2, s)
    s3, _ = exe(a, b=b)
    np.testing.assert_array_equal(s3, s)


# (512, 1024): 2 MiB outputs, which the CPU executable takes from its pool of freed blocks:
# never one a live array holds.
@pytest.mark.parametrize("shape", [(3, 4), (512, 1024)])
def test_outputs_are_the_callers_after_the_next_run(tmp_path, shape):
    exe = fusebox.compile(add_mul_model(tmp_path, shape), device="cpu")
    ones = np.ones(shape, np.float32)
    first, _ = exe(ones, ones)
    kept = first.copy()
    exe(ones * 5, ones)
    np.testing.assert_array_equal(first, kept)
    first += 1  # writable, and writing it changes nothing fusebox holds
    again, _ = exe(ones, ones)
    np.testing.assert_array_equal(again, kept)


def test_non_contiguous_and_read_only_inputs(tmp_path):
    exe = fusebox.compile(add_mul_model(tmp_path), device="cpu-ref")
    rng = np.random.default_rng(3)
    big = rng.standard_normal((4, 6), np.float32)
    a = big[:3, ::-1][:, 1:5]           # strided, negative steps: copied once
    b = np.asfortranarray(rng.standard_normal((3, 4), np.float32))
    b.flags.writeable = False
    s, _ = exe(a, b)
    np.testing.assert_array_equal(s, np.ascontiguousarray(a) + np.ascontiguousarray(b))
    c = np.ascontiguousarray(b)
    c.flags.writeable = False  # contiguous and read-only: read in place all the same
    s, _ = exe(c, c)
    np.testing.assert_array_equal(s, c + c)


class DLPackOnly:
    """An object with nothing but the DLPack protocol (as cupy and jax arrays present it)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_in_and_out(tmp_path):
    exe = fusebox.compile(add_mul_model(tmp_path), device="cpu")
    a = np.full((3, 4), 2, np.float32)
    b = np.full((3, 4), 3, np.float32)
    s, p = exe(DLPackOnly(a), b=DLPackOnly(b))
    np.testing.assert_array_equal(s, a + b)
    back = np.from_dlpack(p)  # outputs export DLPack too
    np.testing.assert_array_equal(back, (a + b) * b)
    assert np.shares_memory(back, p)


def test_contiguous_inputs_are_read_in_place_and_outputs_handed_over(tmp_path):
    exe = fusebox.compile(add_mul_model(tmp_path), device="cpu-ref")
    a = np.ones((3, 4), np.float32)
    strided = np.ones((3, 8), np.float32)[:, ::2]
    base_a, base_strided = sys.getrefcount(a), sys.getrefcount(strided)
    s, _ = exe(a, strided)
    # The executable keeps its last feed as the input's contents: `a` itself (read in place),
    # a contiguous copy of `strided`.
    assert sys.getrefcount(a) > base_a
    assert sys.getrefcount(strided) == base_strided
    exe(np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32))
    assert sys.getrefcount(a) == base_a  # released by the next run
    # The output is the run's own memory, not a copy numpy owns.
    assert not s.flags.owndata
