"""fusebox: compile and run neural networks (ONNX files, zoo models) on the CPU or an NVIDIA GPU.

    import numpy as np
    import fusebox

    model = fusebox.load("model.onnx")                # or a zoo name: fusebox.load("resnet50")
    exe = fusebox.compile(model, device="cpu")         # "cuda", precision="bf16", ...
    (y,) = exe(np.zeros(model.inputs[0].shape, np.float32))

Arrays in: numpy, or any tensor with __dlpack__ (torch, cupy, jax). Arrays out: numpy on the CPU,
DLPack-capable arrays on CUDA. Errors: fusebox.Error. What exists and what does not yet, and
when arrays are copied: docs/python.md.
"""

import os as _os

from ._core import (  # noqa: F401 (re-exported)
    Error,
    Executable,
    Model,
    Loss,
    OutOfMemory,
    TensorSpec,
    Trainer,
    __version__,
    cuda_available,
    zoo_models,
)
from . import _core
from ._shapes import DynamicModel, ShapeCachedExecutable, SymbolicSpec
from ._torch import from_torch

# The classes as users name them (help(), repr of types, tracebacks).
for _cls in (Executable, Loss, Model, TensorSpec, Trainer):
    _cls.__module__ = "fusebox"
del _cls

__all__ = [
    "DynamicModel", "Error", "Executable", "Loss", "Model", "OutOfMemory",
    "ShapeCachedExecutable", "SymbolicSpec", "TensorSpec", "Trainer", "__version__", "cli_path",
    "compile", "cuda_available", "from_torch", "load", "zoo_models",
]


def load(source, *, shapes=None, batch=None, image_size=None, num_classes=None, seed=None,
         training=False):
    path = _os.fspath(source) if isinstance(source, _os.PathLike) else source
    zoo = {"batch": batch, "image_size": image_size, "num_classes": num_classes, "seed": seed}
    try:
        return _core.load(path, shapes=shapes, training=training, **zoo)
    except Error:
        # An import without shapes= fails on inputs with symbolic extents (the importer fixes
        # the inputs first): then, and only then, is the file read for its declared inputs.
        if (shapes is not None or training or any(v is not None for v in zoo.values())
                or not isinstance(path, str) or not _os.path.isfile(path)):
            raise
        specs = _core.onnx_inputs(path)
        if not any(s["shape"] is None or None in s["shape"] for s in specs):
            raise
        return DynamicModel(path, specs)


load.__doc__ = (_core.load.__doc__ or "") + (
    "\n\nAn ONNX file with symbolic or unknown input extents (a dynamic batch) and no shapes= "
    "gives a fusebox.DynamicModel: nothing is imported until fusebox.compile's executable is "
    "called, which compiles (and keeps) one executable per input shape.")


def compile(model, device="cpu", precision="f32", *, max_shapes=8):
    if isinstance(model, (str, _os.PathLike)):
        model = load(_os.fspath(model))
    if isinstance(model, DynamicModel):
        return ShapeCachedExecutable(model, device, precision, max_shapes)
    return _core.compile(model, device, precision)


compile.__doc__ = (_core.compile.__doc__ or "") + (
    "\n\nmodel: a fusebox.Model, a fusebox.DynamicModel, or what fusebox.load takes (a path or "
    "a zoo name). A DynamicModel gives a fusebox.ShapeCachedExecutable: an executable compiled "
    "per input shape on first use, the max_shapes most recently used kept.")


def cli_path():
    """The `fusebox` CLI that `python -m fusebox` runs: $FUSEBOX_CLI when set, else the one
    installed with the package (fusebox/bin/fusebox), else the one the build tree made next to
    this package (recorded in fusebox/_build.py)."""
    given = _os.environ.get("FUSEBOX_CLI")
    if given:
        return given
    installed = _os.path.join(_os.path.dirname(__file__), "bin", "fusebox")
    if _os.path.exists(installed):
        return installed
    try:
        from ._build import cli
    except ImportError:
        raise Error("[fusebox.cli_path] no fusebox CLI found: set FUSEBOX_CLI to the binary")
    return cli
