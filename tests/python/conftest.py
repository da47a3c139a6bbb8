"""Shared fixtures of the Python package's tests (run by ctest: tests/CMakeLists.txt, with
PYTHONPATH=build/<preset>/python; by hand: PYTHONPATH=build/release/python .venv/bin/python -m
pytest tests/python)."""

import subprocess
import sys

import numpy as np
import pytest

import fusebox


@pytest.fixture(scope="session")
def small_cnn_onnx(tmp_path_factory):
    """small_cnn (32x32 images, 10 classes) written as ONNX by the CLI's exporter."""
    path = tmp_path_factory.mktemp("models") / "small_cnn.onnx"
    subprocess.run([sys.executable, "-m", "fusebox", "zoo", "small_cnn", "--out", str(path),
                    "--image-size", "32", "--num-classes", "10", "--batch", "2"],
                   check=True, capture_output=True)
    return path


def onnx_model(path, nodes, inputs, outputs, initializers=()):
    """Writes an ONNX model (opset 17) of `nodes`; inputs/outputs: (name, numpy dtype, shape)."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    def info(name, dtype, shape):
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))

    graph = helper.make_graph(nodes, "test_model", [info(*i) for i in inputs],
                              [info(*o) for o in outputs],
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def rss_bytes():
    """This process's resident set, from /proc/self/statm (pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
