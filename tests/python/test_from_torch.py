"""fusebox.from_torch: a PyTorch module through PyTorch's ONNX exporter gives the outputs PyTorch
gives (f32, CPU oracle), and loaded for training, a Trainer whose state_dict names the module's
parameters as torch does. Skips without torch (CI's environment has none; the GPU machines do)."""

import numpy as np
import pytest

import fusebox

try:
    import torch
except ImportError:
    torch = None

# Collected and skipped one by one (a module-level skip would collect nothing, which pytest and
# so ctest count as a failure).
pytestmark = pytest.mark.skipif(torch is None, reason="torch is not installed (not in .venv): "
                                "from_torch needs PyTorch's exporter")


def small_module():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))


def test_outputs_match_pytorch():
    module = small_module().eval()
    x = torch.randn(2, 3, 16, 16)
    model = fusebox.from_torch(module, x, output_names=["logits"])
    assert [s.name for s in model.inputs] == ["input"]
    assert [s.name for s in model.outputs] == ["logits"]
    (y,) = fusebox.compile(model, device="cpu-ref")(x.numpy())
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert not module.training  # left in the mode it was in


def test_training_names_the_parameters_as_torch():
    module = small_module().train()
    x = torch.randn(4, 3, 16, 16)
    trainer = fusebox.Trainer(fusebox.from_torch(module, x, training=True), optimizer="sgd")
    state = trainer.state_dict()
    floats = {k for k, v in module.state_dict().items() if v.dtype.is_floating_point}
    assert floats <= set(state), sorted(floats - set(state))
    np.testing.assert_array_equal(state["0.weight"], module.state_dict()["0.weight"].numpy())
    assert module.training
    loss = trainer.step(x.numpy(), np.array([0, 1, 2, 3]))
    assert np.isfinite(float(loss))


def test_exporter_failures_are_fusebox_errors():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.eig(x)[0].real  # no ONNX form

    with pytest.raises(fusebox.Error, match="torch.onnx.export failed"):
        fusebox.from_torch(Bad(), torch.randn(3, 3))
