"""Many calls leave memory flat: the outputs handed out and the inputs read in place are all
released. 10,000 calls of a small CNN (issue 41's count: a leak of ~400 bytes a call shows);
1,000 of 1 MiB arrays (the pooled outputs; one array kept per call would add 1 GiB)."""

import numpy as np
import pytest

import fusebox
from conftest import onnx_model, rss_bytes


def calls_grow_rss(exe, make_inputs, calls=1000):
    for _ in range(100):  # warm up: allocator pools, kernel caches
        exe(*make_inputs())
    before = rss_bytes()
    for _ in range(calls):
        outputs = exe(*make_inputs())
    assert outputs
    return rss_bytes() - before


def test_ten_thousand_calls_of_a_cnn_keep_memory_flat():
    model = fusebox.load("small_cnn", batch=2, image_size=16, num_classes=10)
    exe = fusebox.compile(model, device="cpu-ref")
    x = np.random.default_rng(0).uniform(-1, 1, model.inputs[0].shape).astype(np.float32)
    grown = calls_grow_rss(exe, lambda: (x.copy(),), calls=10000)
    assert grown < 4 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 10,000 calls"


@pytest.mark.parametrize("device", ["cpu", "cpu-ref"])
def test_thousand_calls_on_megabyte_arrays_keep_memory_flat(tmp_path, device):
    # 1 MiB inputs and outputs: one array kept per call would add 1 GiB.
    from onnx import helper
    shape = (512, 512)
    path = onnx_model(tmp_path / "add.onnx", [helper.make_node("Add", ["a", "b"], ["y"]),
                                              helper.make_node("Neg", ["a"], ["z"])],
                      [("a", np.float32, shape), ("b", np.float32, shape)],
                      [("y", np.float32, shape), ("z", np.float32, shape)])
    exe = fusebox.compile(fusebox.load(str(path)), device=device)
    b = np.ones(shape, np.float32)
    grown = calls_grow_rss(exe, lambda: (np.full(shape, 2, np.float32), b[::-1]))
    assert grown < 8 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 1,000 calls"
