// libFuzzer target for the path `fusebox run MODEL.onnx` takes on the CPU (issue 38): the
// bytes are parsed as an ONNX model, imported (shape inference runs node by node), verified,
// compiled for the CPU backend and, when every value is small, run on random inputs (floats
// U(-1, 1), integers 0..9, bools 0/1, as `fusebox run` feeds them).
//
// The property: a fusebox::Error (a refusal, caught), or success with every output of the
// declared dtype and shape. Anything else is a bug and aborts, so that libFuzzer (or the
// replay, replay_main.cpp) reports it: another exception type (std::bad_alloc, ...), a
// verified graph holding a value past the bytes one tensor may hold (kMaxTensorBytes), an
// output of another type, a crash, a hang, or a sanitizer report. Host memory is limited to
// 512 MiB (core/memory.h), so that a model asking for more is refused with an Error.
//
// scripts/fuzz.sh builds it with libFuzzer (docs/fuzzing.md); the normal build replays the
// corpus and the regressions through it under ctest. Under libFuzzer, a custom mutator
// mostly changes the numbers that decide shapes (graph input dims, int64 initializers such
// as Reshape's shape or Pad's pads, int and float attributes) to extents near 0, 2^31, 2^32
// and 2^63, so that the mutants stay models and reach inference and the kernels; bytes that
// do not parse get libFuzzer's own mutations.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <random>
#include <string>

#include <onnx/onnx_pb.h>

#include "fusebox/core/memory.h"
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

// Elements of `type`, or -1 past what one tensor may hold (core/memory.h).
int64_t checked_numel(const TensorType& type) {
  const std::optional<TensorSize> size = checked_tensor_size(type.shape, dtype_size(type.dtype));
  return size ? size->elements : -1;
}

// Whether every value of the verified graph `g` fits kMaxTensorBytes (a bug otherwise)
// and the graph is small enough to run.
bool small_enough_to_run(const Graph& g) {
  bool small = true;
  for (const Value& v : g.values()) {
    const int64_t n = checked_numel(v.type);
    if (n < 0)
      bug(cat("value '", v.name, "' of the verified graph has type ", dtype_name(v.type.dtype),
              shape_str(v.type.shape), ": past what one tensor may hold"));
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
  static const bool host_memory_limited = (set_host_memory_limit(size_t(512) << 20), true);
  (void)host_memory_limited;
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

#ifdef FUSEBOX_LIBFUZZER
// The values a mutation writes: small extents, zero, negatives, and extents whose products
// reach or wrap 2^31, 2^32, 2^63 and 2^64.
constexpr int64_t kInterestingInts[] = {0,
                                        1,
                                        2,
                                        3,
                                        -1,
                                        -2,
                                        (int64_t(1) << 31) - 1,
                                        int64_t(1) << 31,
                                        (int64_t(1) << 32) + 1,
                                        (int64_t(1) << 44) + 1,
                                        int64_t(1) << 62,
                                        std::numeric_limits<int64_t>::max(),
                                        std::numeric_limits<int64_t>::min()};
constexpr float kInterestingFloats[] = {0.0f,
                                        -1.0f,
                                        0.5f,
                                        3.0f,
                                        1e10f,
                                        -1e10f,
                                        std::numeric_limits<float>::infinity(),
                                        std::numeric_limits<float>::quiet_NaN()};

// One mutation of a parsed model that changes a number; false when `model` has no number of
// the kind `rng` picked.
bool mutate_a_number(onnx::ModelProto& model, std::mt19937_64& rng) {
  auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(std::max<int64_t>(n, 1))); };
  auto interesting_int = [&] {
    return pick(4) == 0 ? pick(64) : kInterestingInts[pick(std::size(kInterestingInts))];
  };
  onnx::GraphProto* g = model.mutable_graph();
  switch (pick(4)) {
    case 0: {  // a graph input's dim
      if (g->input_size() == 0) return false;
      onnx::TensorShapeProto* shape = g->mutable_input(int(pick(g->input_size())))
                                          ->mutable_type()
                                          ->mutable_tensor_type()
                                          ->mutable_shape();
      if (shape->dim_size() == 0) return false;
      shape->mutable_dim(int(pick(shape->dim_size())))->set_dim_value(interesting_int());
      return true;
    }
    case 1: {  // an element of an int64 initializer (shapes, pads, repeats, starts, ...)
      if (g->initializer_size() == 0) return false;
      onnx::TensorProto* t = g->mutable_initializer(int(pick(g->initializer_size())));
      if (t->data_type() != onnx::TensorProto::INT64) return false;
      const int64_t v = interesting_int();
      if (t->int64_data_size() > 0) {
        t->set_int64_data(int(pick(t->int64_data_size())), v);
      } else {
        std::string& raw = *t->mutable_raw_data();
        if (raw.size() < sizeof v) return false;
        std::memcpy(raw.data() + sizeof v * size_t(pick(int64_t(raw.size() / sizeof v))), &v,
                    sizeof v);
      }
      return true;
    }
    case 2: {  // an int or ints attribute
      if (g->node_size() == 0) return false;
      onnx::NodeProto* n = g->mutable_node(int(pick(g->node_size())));
      if (n->attribute_size() == 0) return false;
      onnx::AttributeProto* a = n->mutable_attribute(int(pick(n->attribute_size())));
      if (a->type() == onnx::AttributeProto::INT)
        a->set_i(interesting_int());
      else if (a->type() == onnx::AttributeProto::INTS && a->ints_size() > 0)
        a->set_ints(int(pick(a->ints_size())), interesting_int());
      else
        return false;
      return true;
    }
    default: {  // a float attribute, or an element of a float initializer (Resize's scales)
      const float v = kInterestingFloats[pick(std::size(kInterestingFloats))];
      if (g->initializer_size() > 0 && pick(2) == 0) {
        onnx::TensorProto* t = g->mutable_initializer(int(pick(g->initializer_size())));
        std::string& raw = *t->mutable_raw_data();
        if (t->data_type() != onnx::TensorProto::FLOAT || raw.size() < sizeof v) return false;
        std::memcpy(raw.data() + sizeof v * size_t(pick(int64_t(raw.size() / sizeof v))), &v,
                    sizeof v);
        return true;
      }
      if (g->node_size() == 0) return false;
      onnx::NodeProto* n = g->mutable_node(int(pick(g->node_size())));
      for (onnx::AttributeProto& a : *n->mutable_attribute()) {
        if (a.type() == onnx::AttributeProto::FLOAT) {
          a.set_f(v);
          return true;
        }
      }
      return false;
    }
  }
}
#endif

}  // namespace
}  // namespace fusebox::fuzz

#ifdef FUSEBOX_LIBFUZZER
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Three mutations in four change a number of a model that parses; the rest, and bytes that do
// not parse, are libFuzzer's byte mutations.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::mt19937_64 rng(seed);
  onnx::ModelProto model;
  if (rng() % 4 != 0 && model.ParseFromArray(data, int(size))) {
    for (int attempt = 0; attempt < 8; ++attempt) {
      if (!fusebox::fuzz::mutate_a_number(model, rng)) continue;
      std::string bytes;
      if (!model.SerializeToString(&bytes) || bytes.size() > max_size) break;
      std::memcpy(data, bytes.data(), bytes.size());
      return bytes.size();
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}
#endif

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
