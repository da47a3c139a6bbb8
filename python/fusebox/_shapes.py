"""Models whose inputs have symbolic extents (a dynamic batch), and their executables: one
compiled per concrete input shape on first use, the most recently used kept (docs/python.md).

fusebox compiles for concrete shapes (memory plan, kernels, CUDA graph); a symbolic extent is
fixed per call, as the shapes= of fusebox.load would fix it, and each shape's executable kept.
"""

import collections
import threading

from . import _core


class SymbolicSpec:
    """An input as an ONNX file declares it: .name, .dtype ('f32', ...), .shape (a tuple with
    None for a symbolic or unknown extent, or None when the file gives no shape) and
    .dim_params (the symbols, '' where none)."""

    def __init__(self, name, dtype, shape, dim_params):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.dim_params = tuple(dim_params)

    @property
    def symbolic(self):
        return self.shape is None or None in self.shape

    def __repr__(self):
        if self.shape is None:
            dims = "?"
        else:
            dims = ", ".join(str(d) if d is not None else (p or "?")
                             for d, p in zip(self.shape, self.dim_params))
        return f"SymbolicSpec('{self.name}', {self.dtype}[{dims}])"


class DynamicModel:
    """An ONNX file with symbolic input extents (fusebox.load without shapes=): .path, .name,
    .inputs (SymbolicSpec). fusebox.compile gives a ShapeCachedExecutable."""

    def __init__(self, path, specs):
        self.path = path
        self.name = path
        self.inputs = [SymbolicSpec(s["name"], s["dtype"], s["shape"], s["dim_params"])
                       for s in specs]

    def __repr__(self):
        return f"DynamicModel('{self.path}', inputs={self.inputs})"


class ShapeCachedExecutable:
    """exe(*arrays) / exe(**named) at any extents the model leaves symbolic: the first call with
    a new combination of input shapes imports the model with those shapes and compiles it (as
    fusebox.compile would); later calls with the same shapes reuse it. At most `max_shapes`
    executables are kept (the least recently used goes). exe.cache_info() says what is held."""

    def __init__(self, model, device, precision, max_shapes):
        if not isinstance(max_shapes, int) or max_shapes < 1:
            raise _core.Error(f"[fusebox.compile] max_shapes must be an integer >= 1, got "
                              f"{max_shapes!r}")
        self._model, self._device, self._precision = model, device, precision
        self._max = max_shapes
        self._cache = collections.OrderedDict()  # shapes (one tuple per input) -> Executable
        self._hits = self._misses = 0
        self._last = None
        self._lock = threading.Lock()

    @property
    def inputs(self):
        return list(self._model.inputs)

    @property
    def device(self):
        return self._last.device if self._last is not None else self._device

    def _shapes(self, args, kwargs):
        where = f"run {self._model.path}"
        names = [s.name for s in self._model.inputs]
        if len(args) > len(names):
            raise _core.Error(f"[{where}] {len(args)} positional arrays for {len(names)} inputs")
        given = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise _core.Error(f"[{where}] '{name}' is not an input (inputs: "
                                  f"{', '.join(names)})")
            if name in given:
                raise _core.Error(f"[{where}] input '{name}' is given twice")
            given[name] = value
        shapes = []
        for name in names:
            if name not in given:
                raise _core.Error(f"[{where}] input '{name}' is not given")
            shape = getattr(given[name], "shape", None)
            if shape is None:
                raise _core.Error(f"[{where}] input '{name}' is not an array (no .shape): "
                                  f"{type(given[name]).__name__}")
            shapes.append(tuple(int(d) for d in shape))
        return tuple(shapes)

    def _executable(self, shapes):
        with self._lock:
            exe = self._cache.get(shapes)
            if exe is not None:
                self._cache.move_to_end(shapes)
                self._hits += 1
            else:
                self._misses += 1
                fixed = {s.name: list(shape) for s, shape in zip(self._model.inputs, shapes)
                         if s.symbolic}
                model = _core.load(self._model.path, shapes=fixed)
                exe = _core.compile(model, self._device, self._precision)
                self._cache[shapes] = exe
                while len(self._cache) > self._max:
                    self._cache.popitem(last=False)
            self._last = exe
            return exe

    def __call__(self, *args, **kwargs):
        return self._executable(self._shapes(args, kwargs))(*args, **kwargs)

    def cache_info(self):
        """{'shapes': the held executables' input shapes, least recently used first,
        'hits', 'misses' (each a compile), 'max_shapes'}."""
        with self._lock:
            return {"shapes": list(self._cache), "hits": self._hits, "misses": self._misses,
                    "max_shapes": self._max}

    def _require_last(self, what):
        if self._last is None:
            raise _core.Error(f"[{what}] no call yet: the executable of a shape is compiled by "
                              f"the first call with it")
        return self._last

    def report(self):
        """report() of the executable the last call ran."""
        return self._require_last("report").report()

    def stats(self):
        """stats() of the executable the last call ran."""
        return self._require_last("stats").stats()

    def profile(self, repeats=None):
        """profile() of the executable the last call ran (on that call's inputs)."""
        return self._require_last("profile").profile(repeats)

    def __repr__(self):
        return (f"ShapeCachedExecutable('{self._model.path}', device='{self.device}', "
                f"{len(self._cache)} of at most {self._max} shapes compiled)")
