"""torch tensors (when torch is importable) and CUDA (when a GPU is there)."""

import numpy as np
import pytest

import fusebox


def small_cnn():
    return fusebox.load("small_cnn", batch=2, image_size=16, num_classes=10)


def test_torch_cpu_tensors_round_trip():
    torch = pytest.importorskip("torch", reason="torch is not installed (not in .venv)")
    model = small_cnn()
    exe = fusebox.compile(model, device="cpu-ref")
    x = torch.rand(*model.inputs[0].shape)
    (y,) = exe(x)
    (expected,) = exe(x.numpy())
    np.testing.assert_array_equal(y, expected)
    assert torch.equal(torch.from_dlpack(y), torch.from_numpy(expected))
    with pytest.raises(fusebox.Error, match="expects f32"):
        exe(x.double())


def cuda_or_skip():
    if not fusebox.cuda_available():
        pytest.skip("no CUDA GPU on this machine: the CUDA tests run where there is one")


def test_cuda_matches_the_cpu_with_torch_tensors():
    cuda_or_skip()
    torch = pytest.importorskip("torch", reason="the CUDA test feeds torch CUDA tensors")
    model = small_cnn()
    x = torch.rand(*model.inputs[0].shape, device="cuda")
    (expected,) = fusebox.compile(model, device="cpu-ref")(x.cpu())
    exe = fusebox.compile(model, device="cuda", precision="f32")
    (y,) = exe(x)
    assert y.__dlpack_device__()[0] == 2  # kDLCUDA
    got = torch.from_dlpack(y)
    assert got.is_cuda
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-3, atol=1e-4)
    (again,) = exe(x * 2)  # the first output is the caller's: the next run leaves it
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-3, atol=1e-4)
    assert isinstance(exe.report()["convolutions"], list)


def test_cuda_refuses_host_arrays_and_cpu_refuses_device_ones():
    cuda_or_skip()
    model = small_cnn()
    x = np.zeros(model.inputs[0].shape, np.float32)
    with pytest.raises(fusebox.Error, match=r"input 'input' is on the cpu but the executable runs on cuda"):
        fusebox.compile(model, device="cuda")(x)
    torch = pytest.importorskip("torch")
    with pytest.raises(fusebox.Error, match=r"input 'input' is on cuda:0 but the executable runs on the cpu"):
        fusebox.compile(model, device="cpu")(torch.zeros(*x.shape, device="cuda"))


def test_without_a_gpu_cuda_is_an_error_and_auto_is_the_cpu():
    if fusebox.cuda_available():
        pytest.skip("a GPU is there: the CUDA tests above cover it")
    model = small_cnn()
    with pytest.raises(fusebox.Error):
        fusebox.compile(model, device="cuda")
    exe = fusebox.compile(model, device="auto")
    assert exe.device == "cpu"
