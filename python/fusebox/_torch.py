"""fusebox.from_torch: a PyTorch module through PyTorch's ONNX exporter (docs/python.md)."""

import os
import tempfile

from . import _core


def from_torch(module, example_inputs, *, input_names=None, output_names=None, training=False,
               opset=17):
    """A fusebox.Model of `module`, exported by PyTorch's TorchScript-based ONNX exporter
    (torch.onnx.export(..., dynamo=False), opset 17) at the shapes of `example_inputs` (a
    tensor or a tuple of them), then loaded as fusebox.load loads a file (the file is deleted).

    input_names / output_names: the model's inputs and outputs (default "input", "input_1", ...
    and "output", "output_1", ...). training=True exports the module in training mode and
    loads it for a fusebox.Trainer (fusebox.load(..., training=True): each parameter keeps its
    state_dict name, so trainer.state_dict() and torch's name the same tensors). The module is
    left in the mode it was in. Errors: fusebox.Error naming the exporter's failure."""
    try:
        import torch
    except ImportError as e:
        raise _core.Error(f"[fusebox.from_torch] PyTorch is not installed: {e}") from None
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    inputs = tuple(inputs)
    if input_names is None:
        input_names = ["input"] + [f"input_{i}" for i in range(1, len(inputs))]
    was_training = module.training
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.onnx")
        try:
            module.train(training)
            kwargs = {"output_names": list(output_names)} if output_names is not None else {}
            torch.onnx.export(module, inputs, path, opset_version=opset,
                              input_names=list(input_names), dynamo=False, training=mode,
                              do_constant_folding=not training, **kwargs)
        except Exception as e:  # the exporter's own errors, as fusebox.Error
            raise _core.Error(f"[fusebox.from_torch] torch.onnx.export failed: {e}") from e
        finally:
            module.train(was_training)
        return _core.load(path, training=training)
