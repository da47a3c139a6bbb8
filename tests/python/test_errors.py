"""Bad input from Python is a fusebox.Error naming what is wrong and what was expected."""

import numpy as np
import pytest

import fusebox
from conftest import onnx_model


@pytest.fixture
def exe(tmp_path):
    from onnx import helper
    path = onnx_model(tmp_path / "add.onnx", [helper.make_node("Add", ["a", "b"], ["y"])],
                      [("a", np.float32, (2, 3)), ("b", np.float32, (2, 3))],
                      [("y", np.float32, (2, 3))])
    return fusebox.compile(fusebox.load(str(path)), device="cpu")


def test_error_is_an_exception_class_of_the_package():
    assert issubclass(fusebox.Error, RuntimeError)
    assert issubclass(fusebox.OutOfMemory, fusebox.Error)
    assert fusebox.Error.__module__ == "fusebox"


def test_wrong_dtype_names_the_input_and_both_types(exe):
    ok = np.zeros((2, 3), np.float32)
    with pytest.raises(fusebox.Error, match=r"input 'b' expects f32\[2, 3\] but was given f64\[2, 3\]"):
        exe(ok, np.zeros((2, 3), np.float64))
    with pytest.raises(fusebox.Error, match=r"input 'a' expects f32\[2, 3\] but was given uint8\[2, 3\]"):
        exe(np.zeros((2, 3), np.uint8), ok)


def test_wrong_shape_names_the_input(exe):
    with pytest.raises(fusebox.Error, match=r"input 'a' expects f32\[2, 3\] but was given f32\[3, 2\]") as e:
        exe(np.zeros((3, 2), np.float32), np.zeros((2, 3), np.float32))
    assert e.value.where.startswith("run ")


def test_missing_extra_twice_and_not_an_array(exe):
    ok = np.zeros((2, 3), np.float32)
    with pytest.raises(fusebox.Error, match=r"input 'b' \(f32\[2, 3\]\) is not given"):
        exe(ok)
    with pytest.raises(fusebox.Error, match=r"has 2 inputs \(a, b\) but was given 3 arrays"):
        exe(ok, ok, ok)
    with pytest.raises(fusebox.Error, match=r"'c' is not an input of the model \(its inputs: a, b\)"):
        exe(ok, ok, c=ok)
    with pytest.raises(fusebox.Error, match=r"input 'a' is given twice"):
        exe(ok, ok, a=ok)
    with pytest.raises(fusebox.Error, match=r"input 'a' is a list, not an array"):
        exe([[0.0] * 3] * 2, ok)


def test_bad_options_and_files(tmp_path):
    with pytest.raises(fusebox.Error, match="no_such.onnx"):
        fusebox.load(str(tmp_path / "no_such.onnx"))
    with pytest.raises(fusebox.Error, match="apply to zoo models"):
        fusebox.load(str(tmp_path / "no_such.onnx"), batch=2)
    with pytest.raises(fusebox.Error, match="shapes= applies to ONNX files"):
        fusebox.load("small_cnn", shapes={"input": [1, 3, 8, 8]})
    model = fusebox.load("small_cnn", image_size=8)
    with pytest.raises(fusebox.Error, match="precision"):
        fusebox.compile(model, precision="f8")
    with pytest.raises(fusebox.Error, match="device"):
        fusebox.compile(model, device="tpu")


def test_unknown_shape_name_is_an_error(tmp_path):
    from onnx import helper
    path = onnx_model(tmp_path / "sym.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                      [("x", np.float32, ("batch", 4))], [("y", np.float32, ("batch", 4))])
    model = fusebox.load(str(path), shapes={"x": [3, 4]})
    assert model.inputs[0].shape == (3, 4)
    with pytest.raises(fusebox.Error, match=r"input_shapes names 'z', which is not a graph input"):
        fusebox.load(str(path), shapes={"x": [3, 4], "z": [1]})


def test_a_kernel_error_names_the_node(tmp_path):
    from onnx import helper
    path = onnx_model(tmp_path / "gather.onnx",
                      [helper.make_node("Gather", ["data", "index"], ["y"], name="pick")],
                      [("data", np.float32, (4, 2)), ("index", np.int64, (1,))],
                      [("y", np.float32, (1, 2))])
    exe = fusebox.compile(fusebox.load(str(path)), device="cpu-ref")
    (y,) = exe(np.arange(8, dtype=np.float32).reshape(4, 2), np.array([3], np.int64))
    np.testing.assert_array_equal(y, [[6, 7]])
    with pytest.raises(fusebox.Error, match="pick") as e:
        exe(np.zeros((4, 2), np.float32), np.array([9], np.int64))
    assert "pick" in e.value.where
