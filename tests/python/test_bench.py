"""fusebox.bench: `fusebox bench`'s figures as a dict (the CLI in a process of its own)."""

import pytest

import fusebox


def test_bench_a_zoo_model_and_a_model_object():
    small = dict(device="cpu", batch_size=2, image_size=32, steps=3, warmup=1)
    r = fusebox.bench("resnet18", **small)
    assert r["bench"] == "fusebox_bench" and r["model"] == "resnet18"
    assert r["batch"] == 2 and r["device"] == "cpu" and r["cpu_kernels"] == "fast"
    assert r["mode"] == "infer"
    assert 0 < r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
    assert r["compile_s"] > 0
    model = fusebox.load("resnet18", batch=2, image_size=32)
    m = fusebox.bench(model, device="cpu", steps=3, warmup=1)
    assert m["batch"] == 2 and m["step_ms_median"] > 0
    t = fusebox.bench("resnet18", mode="train", **small)
    assert t["mode"] == "train" and t["step_ms_median"] > 0 and "final_loss" in t


def test_bench_errors_are_fusebox_errors_with_the_clis_message():
    with pytest.raises(fusebox.Error, match="no-such-model"):
        fusebox.bench("no-such-model", steps=1)
    with pytest.raises(fusebox.Error, match="--precision"):
        fusebox.bench("resnet18", precision="f7", steps=1)
    with pytest.raises(fusebox.Error, match="fusebox.Model"):
        fusebox.bench(42)
