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
    "ShapeCachedExecutable", "SymbolicSpec", "TensorSpec", "Trainer", "__version__", "bench",
    "cli_path", "compile", "cuda_available", "from_torch", "load", "zoo_models",
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


def bench(model, *, mode="infer", device="cpu", precision=None, batch_size=None, steps=None,
          warmup=None, image_size=None, num_classes=None, optimizer=None, shapes=None,
          memory_limit=None):
    """`fusebox bench`'s figures as a dict: the whole model's steps timed as the CLI times them
    (compile = the first step, then `warmup` untimed and `steps` timed steps; inference or, with
    mode="train", whole training steps), in a process of its own so that nothing of the caller's
    (its threads, its GPU work) is in the figures. The keys are the CLI's --json report's:
    step_ms_median / _min / _max, images_per_s, compile_s, peak_device_bytes, batch, precision,
    device, commit, ...

    model: a path to an ONNX file, a zoo name ("resnet50"), or a fusebox.Model (written to a
    temporary ONNX file first). The other arguments are the CLI's options of the same names
    (None: the CLI's default); shapes: {input name: shape} for symbolic input extents. A
    refused option or a failed run raises fusebox.Error with the CLI's message."""
    import json as _json
    import subprocess as _subprocess
    import tempfile as _tempfile

    with _tempfile.TemporaryDirectory(prefix="fusebox-bench-") as tmp:
        if isinstance(model, Model):
            path = _os.path.join(tmp, "model.onnx")
            model.save(path)
        elif isinstance(model, DynamicModel):
            path = model.path
        elif isinstance(model, (str, _os.PathLike)):
            path = _os.fspath(model)
        else:
            raise Error(f"[fusebox.bench] model must be a path, a zoo name or a fusebox.Model, "
                        f"not {type(model).__name__}")
        report = _os.path.join(tmp, "bench.json")
        command = [cli_path(), "bench", path, "--mode", mode, "--device", device,
                   "--json", report]
        options = {"--precision": precision, "--batch-size": batch_size, "--steps": steps,
                   "--warmup": warmup, "--image-size": image_size, "--num-classes": num_classes,
                   "--optimizer": optimizer, "--memory-limit": memory_limit}
        for option, value in options.items():
            if value is not None:
                command += [option, str(value)]
        for name, shape in (shapes or {}).items():
            command += ["--shape", f"{name}={','.join(str(int(d)) for d in shape)}"]
        done = _subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip() or done.stdout.strip())[-4000:]
            raise Error(f"[fusebox.bench {path}] " + (why or f"exit status {done.returncode}"))
        with open(report) as f:
            return _json.load(f)
