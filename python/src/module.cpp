// fusebox._core: the Python binding (nanobind) of fusebox's public C++ API. The package
// python/fusebox/ re-exports it; docs/python.md says what exists and how arrays travel.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "arrays.h"
#include "executable.h"
#include "fusebox/backends/cuda.h"
#include "fusebox/frontends/onnx.h"
#include "fusebox/ir/ops.h"
#include "fusebox/passes/pipeline.h"
#include "fusebox/zoo.h"
#include "trainer.h"

namespace fusebox::python {

namespace {

// fusebox.Model: a graph, as imported or built (never changed: compile copies what it needs).
struct Model {
  std::shared_ptr<const Graph> graph;
};

std::vector<TensorSpec> specs(const Graph& g, const std::vector<ValueId>& values) {
  std::vector<TensorSpec> out;
  for (ValueId v : values)
    out.push_back({g.value(v).name, g.value(v).type.dtype, g.value(v).type.shape});
  return out;
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t d : s) l.append(d);
  return nb::tuple(l);
}

// fusebox.Error and fusebox.OutOfMemory (a subclass), created once at import.
PyObject* g_error = nullptr;
PyObject* g_out_of_memory = nullptr;

void raise_error(PyObject* type, const Error& e) {
  nb::object exc = nb::steal(PyObject_CallFunction(type, "s", e.what()));
  if (!exc.is_valid()) return;  // the call set its own exception
  nb::setattr(exc, "where", nb::str(e.where().c_str()));
  PyErr_SetObject(type, exc.ptr());
}

Model load(const std::string& source, std::optional<std::map<std::string, Shape>> shapes,
           std::optional<int64_t> batch, std::optional<int64_t> image_size,
           std::optional<int64_t> num_classes, std::optional<uint64_t> seed, bool training) {
  const std::string where = "fusebox.load";
  const std::vector<std::string> zoo = zoo_models();
  const bool is_zoo =
      !std::filesystem::exists(source) && std::find(zoo.begin(), zoo.end(), source) != zoo.end();
  nb::gil_scoped_release released;
  if (is_zoo) {
    FUSEBOX_CHECK(!shapes, where, "shapes= applies to ONNX files; for the zoo model '", source,
                  "' give batch= and image_size=");
    ZooOptions opts;
    opts.batch = batch.value_or(opts.batch);
    opts.image_size = image_size.value_or(opts.image_size);
    opts.num_classes = num_classes.value_or(opts.num_classes);
    opts.seed = seed.value_or(opts.seed);
    return {std::make_shared<const Graph>(build_zoo_model(source, opts))};
  }
  std::string zoo_names;
  for (const std::string& z : zoo) zoo_names += (zoo_names.empty() ? "" : ", ") + z;
  FUSEBOX_CHECK(!batch && !image_size && !num_classes && !seed, where,
                "batch=, image_size=, num_classes= and seed= apply to zoo models (", zoo_names,
                "); '", source, "' is not one (for an ONNX file give shapes=)");
  OnnxImportOptions opts;
  if (shapes) opts.input_shapes = *shapes;
  opts.keep_parameter_transforms = training;
  // The importer refuses a shape for a name that is not an input.
  return {std::make_shared<const Graph>(import_onnx_file(source, opts))};
}

// The CLI's run (tools/fusebox/cmd_run.cpp): the inference pipeline on CUDA and on the fast CPU
// kernels; the reference kernels run the model as imported unless a low precision is asked for.
PyExecutable* compile(const Model& model, const std::string& device_name,
                      const std::string& precision_name) {
  const Device device = parse_device(device_name);
  const CpuKernels kernels = cpu_kernels_for(device_name);
  const Precision precision = parse_precision(precision_name);
  nb::gil_scoped_release released;
  CompileOptions opts{.device = device, .cpu_kernels = kernels};
  const bool low = precision == Precision::bf16 || precision == Precision::f16;
  if (device == Device::cuda || kernels == CpuKernels::fast || low)
    opts.pipeline = {.kind = PipelineKind::inference,
                     .precision = precision,
                     .fusion = InferenceFusionOptions::from_env()};
  if (device == Device::cuda) cuda::set_tf32(precision != Precision::f32);
  return new PyExecutable(Executable::compile(*model.graph, opts));
}

nb::dict report_dict(const ExecutableReport& r) {
  nb::list convs;
  for (const ConvDecision& c : r.convolutions) {
    nb::dict d;
    d["node"] = c.node;
    d["op"] = c.op;
    d["problem"] = c.problem;
    d["path"] = c.path;
    d["plan"] = c.plan;
    d["reason"] = c.reason;
    d["workspace_bytes"] = c.workspace_bytes;
    d["tuned_ms"] = c.tuned_ms < 0 ? nb::object(nb::none()) : nb::cast(c.tuned_ms);
    d["calls"] = c.calls;
    convs.append(d);
  }
  const ConvPlanStats& p = r.plan_cache;
  nb::dict cache;
  cache["problems"] = p.problems;
  cache["memory_hits"] = p.memory_hits;
  cache["heuristics_queries"] = p.heuristics_queries;
  cache["plans_built"] = p.plans_built;
  cache["autotune_runs"] = p.autotune_runs;
  cache["disk_hits"] = p.disk_hits;
  cache["disk_misses"] = p.disk_misses;
  cache["disk_writes"] = p.disk_writes;
  cache["disk_rejects"] = p.disk_rejects;
  cache["refusals"] = p.refusals;
  cache["native_graph_nodes"] = p.native_graph_nodes;
  cache["captured_calls"] = p.captured_calls;
  nb::dict d;
  d["convolutions"] = convs;
  d["plan_cache"] = cache;
  return d;
}

nb::dict stats_dict(const ExecutableStats& s) {
  nb::dict d;
  d["compile_seconds"] = s.compile_seconds;
  d["nodes"] = s.nodes;
  d["operations"] = s.operations;
  d["arena_bytes"] = s.arena_bytes;
  d["unshared_bytes"] = s.unshared_bytes;
  d["largest_value_bytes"] = s.largest_value_bytes;
  d["largest_value"] = s.largest_value;
  d["io_bytes"] = s.io_bytes;
  d["constant_bytes"] = s.constant_bytes;
  d["temporary_bytes"] = s.temporary_bytes;
  d["views"] = s.views;
  d["fast_nodes"] = s.fast_nodes;
  d["fast_summary"] = s.fast_summary;
  d["aliases_in_place"] = s.aliases_in_place;
  d["aliases_copied"] = s.aliases_copied;
  d["runs_not_applied"] = s.runs_not_applied;
  return d;
}

std::string spec_repr(const TensorSpec& s) {
  std::string shape = "(";
  for (size_t i = 0; i < s.shape.size(); ++i) shape += cat(i ? ", " : "", s.shape[i]);
  shape += s.shape.size() == 1 ? ",)" : ")";
  return cat("TensorSpec(name='", s.name, "', dtype='", dtype_name(s.dtype), "', shape=", shape,
             ")");
}

}  // namespace
}  // namespace fusebox::python

NB_MODULE(_core, m) {
  using namespace fusebox;
  using namespace fusebox::python;
  using namespace nb::literals;
  m.doc() = "fusebox's C++ core (the package `fusebox` re-exports it: use that).";
  m.attr("__version__") = FUSEBOX_VERSION;

  g_error = PyErr_NewExceptionWithDoc(
      "fusebox.Error",
      "An error fusebox reports: the message reads '[where] what', `where` naming the node, "
      "input or file at fault (also the attribute `where`).",
      PyExc_RuntimeError, nullptr);
  g_out_of_memory =
      PyErr_NewExceptionWithDoc("fusebox.OutOfMemory",
                                "Memory refused: a budget (FUSEBOX_CPU_MEMORY_LIMIT, "
                                "FUSEBOX_CUDA_MEMORY_LIMIT) or the system. A fusebox.Error.",
                                g_error, nullptr);
  m.attr("Error") = nb::handle(g_error);
  m.attr("OutOfMemory") = nb::handle(g_out_of_memory);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const OutOfMemory& e) {
      raise_error(g_out_of_memory, e);
    } catch (const Error& e) {
      raise_error(g_error, e);
    }
  });

  nb::class_<TensorSpec>(m, "TensorSpec",
                         "An input or output: its name, dtype (fusebox's name: 'f32', 'bf16', "
                         "'i64', 'bool', ...) and shape.")
      .def_ro("name", &TensorSpec::name)
      .def_prop_ro("dtype", [](const TensorSpec& s) { return std::string(dtype_name(s.dtype)); })
      .def_prop_ro("shape", [](const TensorSpec& s) { return shape_tuple(s.shape); })
      .def("__repr__", &spec_repr);

  nb::class_<Model>(m, "Model", "A model (a graph) loaded by fusebox.load; compile it to run it.")
      .def_prop_ro("name", [](const Model& md) { return md.graph->name(); })
      .def_prop_ro(
          "inputs", [](const Model& md) { return specs(*md.graph, md.graph->inputs()); },
          "The inputs, in the order exe(*arrays) takes them (list of TensorSpec).")
      .def_prop_ro(
          "outputs", [](const Model& md) { return specs(*md.graph, md.graph->outputs()); },
          "The outputs, in the order exe() returns them (list of TensorSpec).")
      .def_prop_ro("num_nodes", [](const Model& md) { return md.graph->nodes().size(); })
      .def(
          "save",
          [](const Model& md, const std::string& path) {
            nb::gil_scoped_release released;
            export_onnx_file(*md.graph, path);
          },
          "path"_a, "Writes the model as an ONNX file (opset 17).")
      .def("__repr__", [](const Model& md) {
        return cat("Model('", md.graph->name(), "', ", md.graph->nodes().size(), " nodes)");
      });

  m.def("load", &python::load, "source"_a, nb::kw_only(), "shapes"_a = nb::none(),
        "batch"_a = nb::none(), "image_size"_a = nb::none(), "num_classes"_a = nb::none(),
        "seed"_a = nb::none(), "training"_a = false,
        R"(Loads a model: an ONNX file, or the name of a zoo model (fusebox.zoo_models()).

ONNX files: shapes={"input": [1, 3, 224, 224]} fixes inputs whose dims are symbolic (a name that
is not an input is an error); training=True keeps each weight the initializer it is (a
transposed Linear weight, a tied embedding stay one parameter under their own names) for a
fusebox.Trainer. Zoo models: batch, image_size, num_classes and seed (seeded random weights).
Returns a fusebox.Model; errors are fusebox.Error naming the file and node.)");

  nb::class_<PyExecutable>(m, "Executable",
                           "A compiled model (fusebox.compile). Call it on arrays: exe(*arrays) "
                           "or exe(**named); it returns a tuple of the outputs.")
      .def("__call__", &PyExecutable::call,
           R"(Runs the executable once and returns its outputs, in the order of exe.outputs.

Inputs: numpy arrays or any tensor with __dlpack__ (torch, cupy, jax), positional in the order of
exe.inputs or by name, of exactly the input's dtype and shape and on the executable's device
(else fusebox.Error naming the input and what it expects). CPU: a C-contiguous array is read in
place (no copy), another is copied once. CUDA: contiguous tensors on this GPU, copied once into
the executable's own buffer.

Outputs: CPU, numpy arrays over the run's own memory (no copy; bf16 outputs come back as f32
copies); CUDA, arrays with __dlpack__ (torch.from_dlpack(y)), one device-to-device copy of the
executable's buffers, which its next run overwrites. The GIL is released while it runs.)")
      .def_prop_ro("inputs", &PyExecutable::inputs, "The inputs (list of TensorSpec).")
      .def_prop_ro("outputs", &PyExecutable::outputs, "The outputs (list of TensorSpec).")
      .def_prop_ro(
          "device", [](const PyExecutable& e) { return std::string(device_name(e.device())); },
          "'cpu' or 'cuda'.")
      .def(
          "report", [](const PyExecutable& e) { return report_dict(e.executable().report()); },
          "What compile decided on the GPU (Executable::report): {'convolutions': [one dict per "
          "convolution: node, op, problem, path, plan, reason, workspace_bytes, tuned_ms, calls], "
          "'plan_cache': {counters}}. Empty lists and zeros on the CPU.")
      .def(
          "stats", [](const PyExecutable& e) { return stats_dict(e.executable().stats()); },
          "What compile did and what the executable holds (ExecutableStats) as a dict.")
      .def(
          "profile",
          [](PyExecutable& e, std::optional<int> repeats) {
            nb::list rows;
            for (const NodeTime& t : e.profile(repeats)) {
              nb::dict d;
              d["node"] = t.node;
              d["op"] = op_name(t.op);
              d["ms"] = t.ms;
              rows.append(d);
            }
            return rows;
          },
          "repeats"_a = nb::none(),
          "Runs the last inputs again node by node, timing each `repeats` times (default 10 on "
          "CUDA, 1 on the CPU): [{'node', 'op', 'ms'}] in the step's order. Call it after a run.")
      .def("__repr__", [](const PyExecutable& e) {
        return cat("Executable('", e.executable().graph().name(), "', device='",
                   device_name(e.device()), "')");
      });

  m.def("compile", &python::compile, "model"_a, "device"_a = "cpu", "precision"_a = "f32",
        nb::rv_policy::take_ownership,
        R"(Compiles a model for a device, as the CLI's `fusebox run` does.

device: "cpu" (oneDNN's kernels where it has the node, the reference elsewhere), "cpu-ref" (the
reference kernels alone: the exact oracle), "cuda", or "auto" (cuda when a GPU is there).
precision: "f32", "tf32", "bf16" or "f16" (docs/mixed_precision.md); on CUDA, f32 turns TF32 off
and the others turn it on, for the executables compiled from then on. The GIL is released while
it compiles. Returns a fusebox.Executable.)");

  m.def(
      "onnx_inputs",
      [](const std::string& path) {
        std::vector<OnnxInputSpec> specs;
        {
          nb::gil_scoped_release released;
          specs = onnx_input_specs(path);
        }
        nb::list out;
        for (const OnnxInputSpec& spec : specs) {
          nb::dict d;
          d["name"] = spec.name;
          d["dtype"] = std::string(dtype_name(spec.dtype));
          if (spec.has_shape) {
            nb::list dims;
            for (const std::optional<int64_t>& e : spec.dims)
              dims.append(e ? nb::object(nb::int_(*e)) : nb::none());
            d["shape"] = nb::tuple(dims);
            d["dim_params"] = spec.dim_params;
          } else {
            d["shape"] = nb::none();
            d["dim_params"] = std::vector<std::string>();
          }
          out.append(d);
        }
        return out;
      },
      "path"_a,
      "An ONNX file's graph inputs as it declares them, before any import: [{'name', 'dtype', "
      "'shape' (a tuple, None for a symbolic or unknown extent; None for no shape at all), "
      "'dim_params' (the symbols, '' where none)}].");
  nb::class_<PendingLoss>(m, "Loss",
                          "A training step's loss, on its way: float(loss) or loss.item() waits "
                          "for the step (and raises fusebox.Error for a step whose data was bad).")
      .def("item", &PendingLoss::item, "The loss (waits for the step).")
      .def("__float__", &PendingLoss::item)
      .def_prop_ro("ready", &PendingLoss::ready, "Whether the step is done (never waits).")
      .def("__repr__", [](PendingLoss& l) {
        return l.ready() ? cat("Loss(", l.item(), ")") : std::string("Loss(pending)");
      });

  nb::class_<PyTrainer>(m, "Trainer",
                        "Trains a model (fusebox/train/session.h) on batches from any data "
                        "loader: trainer.step(x, y) per batch.")
      .def(
          "__init__",
          [](PyTrainer* self, const Model& model, const std::string& optimizer,
             std::optional<double> lr, double momentum, std::optional<double> weight_decay,
             const std::string& device, const std::string& precision) {
            new (self)
                PyTrainer(model.graph, optimizer, lr, momentum, weight_decay, device, precision);
          },
          "model"_a, nb::kw_only(), "optimizer"_a = "sgd", "lr"_a = nb::none(), "momentum"_a = 0.9,
          "weight_decay"_a = nb::none(), "device"_a = "cpu", "precision"_a = "f32",
          R"(A training session for `model` (a fusebox.Model of one input and one output of logits:
images [N, C, H, W] -> [N, classes] or [N, classes, H, W], token ids [N, T] -> [N, vocab, T])
with the cross-entropy loss. optimizer: "sgd" (lr 0.05, momentum 0.9, weight_decay 0 by default)
or "adamw" (lr 1e-3, weight_decay 0.01). device: "cpu" or "cuda"; precision: "f32", "tf32",
"bf16" or "f16" (f16 scales the loss). The batch size is the model's: load an ONNX file with
shapes= for another.)")
      .def("step", &PyTrainer::step, "x"_a, "y"_a,
           "One optimizer step on a batch: x the model's input, y the labels (i64), each of "
           "exactly trainer.batch's dtype and shape, on the trainer's device (CPU: read in place "
           "where C-contiguous; CUDA: one device copy). Returns a fusebox.Loss at once.")
      .def("predict", &PyTrainer::predict, "x"_a,
           "The model's outputs on x (a host array) in eval form (batch norms with their running "
           "statistics), as a tuple of numpy arrays.")
      .def("state_dict", &PyTrainer::state_dict,
           "Parameters and buffers (running statistics) by the model's names, as numpy copies.")
      .def("load_state_dict", &PyTrainer::load_state_dict, "state"_a, "strict"_a = true,
           "Takes parameters and buffers by name (host arrays of the same dtypes and shapes; "
           "strict: all of them and no other). The optimizer state stays. On error nothing "
           "changes.")
      .def("save", &PyTrainer::save, "path"_a, "Writes a checkpoint (.npz): the whole state.")
      .def("load", &PyTrainer::load, "path"_a,
           "Takes the state of a checkpoint of this model and optimizer.")
      .def("export", &PyTrainer::export_onnx, "path"_a,
           "Writes the trained model as ONNX (batch norms in inference form).")
      .def_prop_ro("steps", &PyTrainer::step_count, "Optimizer steps taken.")
      .def_prop_rw("lr", &PyTrainer::lr, &PyTrainer::set_lr, "The learning rate (settable).")
      .def_prop_ro(
          "batch", [](const PyTrainer& t) { return t.batch(); },
          "What a step takes: the model's input, then the labels (list of TensorSpec).")
      .def_prop_ro("device",
                   [](const PyTrainer& t) { return std::string(device_name(t.device())); });

  m.def("zoo_models", &zoo_models, "The names fusebox.load takes as zoo models.");
  m.def("cuda_available", &cuda_available,
        "Whether a CUDA GPU is usable (and the CUDA backend built).");
}
