"""Symbolic input extents (a dynamic batch): fusebox.load gives a DynamicModel, and the
executable fusebox.compile makes of it compiles one executable per input shape on first use,
keeps at most max_shapes (least recently used out), and names what is wrong in an input."""

import numpy as np
import pytest

import fusebox
from conftest import onnx_model


@pytest.fixture
def dynamic_onnx(tmp_path):
    """y = relu(x @ w): x [N, 4] (N symbolic), w [4, 3]."""
    onnx = pytest.importorskip("onnx")
    w = np.array([[1, -2, 0.5], [0, 1, -1], [2, 0, 1], [-1, 1, 1]], np.float32)
    nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["xw"]),
             onnx.helper.make_node("Relu", ["xw"], ["y"])]
    path = onnx_model(tmp_path / "dynamic.onnx", nodes, [("x", np.float32, ("N", 4))],
                      [("y", np.float32, ("N", 3))], [("w", w)])
    return path, w


def test_load_gives_a_dynamic_model(dynamic_onnx):
    path, _ = dynamic_onnx
    model = fusebox.load(path)
    assert isinstance(model, fusebox.DynamicModel)
    (x,) = model.inputs
    assert (x.name, x.dtype, x.shape, x.dim_params) == ("x", "f32", (None, 4), ("N", ""))
    assert "N, 4" in repr(x)
    # shapes= still fixes them at load: a fusebox.Model as before.
    fixed = fusebox.load(path, shapes={"x": [3, 4]})
    assert isinstance(fixed, fusebox.Model)
    assert fixed.inputs[0].shape == (3, 4)


def test_one_executable_per_shape(dynamic_onnx):
    path, w = dynamic_onnx
    exe = fusebox.compile(path, device="cpu-ref")
    assert isinstance(exe, fusebox.ShapeCachedExecutable)
    rng = np.random.default_rng(0)
    for batch in (2, 5, 2):
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        (y,) = exe(x)
        np.testing.assert_allclose(y, np.maximum(x @ w, 0), rtol=1e-6, atol=1e-6)
    (y,) = exe(x=np.ones((7, 4), np.float32))  # by name too
    assert y.shape == (7, 3)
    info = exe.cache_info()
    assert info["shapes"] == [((5, 4),), ((2, 4),), ((7, 4),)]  # least recently used first
    assert (info["hits"], info["misses"], info["max_shapes"]) == (1, 3, 8)
    assert exe.device == "cpu"
    assert isinstance(exe.stats(), dict)


def test_least_recently_used_shape_goes(dynamic_onnx):
    path, _ = dynamic_onnx
    exe = fusebox.compile(fusebox.load(path), device="cpu-ref", max_shapes=2)
    for batch in (1, 2, 3, 1):
        exe(np.zeros((batch, 4), np.float32))
    info = exe.cache_info()
    assert info["shapes"] == [((3, 4),), ((1, 4),)]
    assert (info["hits"], info["misses"]) == (0, 4)  # 1 was compiled again
    with pytest.raises(fusebox.Error, match="max_shapes must be an integer >= 1"):
        fusebox.compile(path, max_shapes=0)


def test_bad_inputs_name_what_is_wrong(dynamic_onnx):
    path, _ = dynamic_onnx
    exe = fusebox.compile(path, device="cpu-ref")
    with pytest.raises(fusebox.Error, match="fixes dim 1 to 4"):
        exe(np.zeros((2, 5), np.float32))
    with pytest.raises(fusebox.Error, match="declares rank 2"):
        exe(np.zeros((2, 4, 1), np.float32))
    with pytest.raises(fusebox.Error, match="input 'x' is not given"):
        exe()
    with pytest.raises(fusebox.Error, match="'z' is not an input"):
        exe(z=np.zeros((2, 4), np.float32))
    with pytest.raises(fusebox.Error, match=r"not an array \(no .shape\)"):
        exe([1, 2, 3, 4])
    with pytest.raises(fusebox.Error, match="expects f32"):  # the compiled executable's check
        exe(np.zeros((2, 4), np.float64))
    with pytest.raises(fusebox.Error, match="no call yet"):
        fusebox.compile(path, device="cpu-ref").report()
