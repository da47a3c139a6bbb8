// libFuzzer target for the path `fusebox run MODEL.onnx` takes on the CPU (issue 38): the
// bytes are parsed as an ONNX model, imported (shape inference runs node by node), verified,
// compiled for the CPU backend and, when every value is small, run on random inputs (floats
// U(-1, 1), integers 0..9, bools 0/1, as `fusebox run` feeds them).
//
// The property: a fusebox::Error (a refusal, caught), or success with every output of the
// declared dtype and shape. Anything else is a bug and aborts, so that libFuzzer (or the
// replay, replay_main.cpp) reports it: another exception type (std::bad_alloc, ...), a
// verified graph holding a value whose element count or byte size is not representable, an
// output of another type, a crash, a hang, or a sanitizer report.
//
// scripts/fuzz.sh builds it with libFuzzer (docs/fuzzing.md); the normal build replays the
// corpus and the regressions through it under ctest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "fusebox/frontends/onnx.h"
#include "fusebox/runtime/executable.h"
#include "testing.h"

namespace fusebox::fuzz {
namespace {

// Above these the model is imported and compiled but not run: the run would take longer
// than a fuzz input should (milliseconds). Elements of one value, and a node's inputs times
// its outputs (a bound on any kernel's work: a convolution or matmul reads each input
// element once per output element at most).
constexpr int64_t kMaxRunElements = int64_t(1) << 16;
constexpr int64_t kMaxNodeWork = int64_t(1) << 26;

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_onnx_model: BUG: %s\n", what.c_str());
  std::abort();
}

// Elements of `type`, or -1 when the count or the byte size does not fit an int64_t.
int64_t checked_numel(const TensorType& type) {
  return testing::representable_numel(type.dtype, type.shape).value_or(-1);
}

// Whether every value of the verified graph `g` has a representable size (a bug otherwise)
// and the graph is small enough to run.
bool small_enough_to_run(const Graph& g) {
  bool small = true;
  for (const Value& v : g.values()) {
    const int64_t n = checked_numel(v.type);
    if (n < 0)
      bug(cat("value '", v.name, "' of the verified graph has type ", dtype_name(v.type.dtype),
              shape_str(v.type.shape), ": its element count or byte size wraps"));
    small = small && n <= kMaxRunElements;
  }
  if (!small) return false;
  for (const Node& node : g.nodes()) {  // every value small: the sums cannot overflow
    int64_t in = 0, out = 0;
    for (ValueId v : node.inputs)
      if (v != kNoValue) in += checked_numel(g.value(v).type);
    for (ValueId v : node.outputs) out += checked_numel(g.value(v).type);
    if (in * out > kMaxNodeWork) return false;
  }
  return true;
}

void import_compile_and_run(const std::string& bytes) {
  const Graph g = import_onnx_bytes(bytes, "fuzz.onnx");
  g.verify();
  const bool run = small_enough_to_run(g);
  std::unique_ptr<Executable> exe = Executable::compile(g, {.device = Device::cpu, .poison = true});
  if (!run) return;
  NamedTensors feeds;
  uint64_t seed = 0;
  for (ValueId v : g.inputs()) {
    const Value& in = g.value(v);
    const bool integer = !is_floating(in.type.dtype) && in.type.dtype != DType::boolean;
    feeds[in.name] = testing::random_tensor(in.type.dtype, in.type.shape, ++seed,
                                            integer ? 0.0 : -1.0, integer ? 10.0 : 1.0);
  }
  const NamedTensors outputs = exe->run(feeds);
  for (ValueId v : g.outputs()) {
    const Value& declared = g.value(v);
    auto it = outputs.find(declared.name);
    if (it == outputs.end()) bug(cat("no tensor for output '", declared.name, "'"));
    const Tensor& t = it->second;
    if (t.dtype() != declared.type.dtype || t.shape() != declared.type.shape)
      bug(cat("output '", declared.name, "' is ", dtype_name(t.dtype()), shape_str(t.shape()),
              ", declared ", dtype_name(declared.type.dtype), shape_str(declared.type.shape)));
  }
}

}  // namespace
}  // namespace fusebox::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    fusebox::fuzz::import_compile_and_run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const fusebox::Error&) {
    // A refusal with a message: the expected outcome for most mutated models.
  } catch (const std::exception& e) {
    fusebox::fuzz::bug(fusebox::cat("an exception other than fusebox::Error: ", e.what()));
  }
  return 0;
}
