// Writes or checks the seed corpus of the ONNX model fuzz target (fuzz_onnx_model.cpp,
// docs/fuzzing.md): one small model per op the issue-38 attacks go through (conv, matmul,
// reshape, gather, resize, slice, expand, pad, tile, range, einsum, scatter) and the attacks
// themselves (a batch of 0, zero dims, sizes and repeats whose element counts pass 2^63 or
// wrap 2^64), built with the importer tests' TestModel.
//   make_corpus --write DIR   writes DIR/<seed>.onnx
//   make_corpus --check DIR   exit status 1 unless every DIR/<seed>.onnx is what seeds()
//                             makes and every valid seed imports (ctest fuzz_corpus_current)
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "fusebox/io/tensor_file.h"
#include "onnx_test_util.h"

namespace fusebox::testing {
namespace {

using onnx::TensorProto;

struct Seed {
  std::string name;  // the file is <name>.onnx
  // Whether the model is valid and small: it must import (a fuzz run starts from models
  // the importer takes); the attacks may be refused.
  bool valid;
  TestModel model;
};

Tensor int64s(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
}
Tensor floats(const Shape& shape) {
  return random_tensor(DType::f32, shape, 38);
}

constexpr int64_t k2_31 = int64_t(1) << 31, k2_32 = int64_t(1) << 32, k2_62 = int64_t(1) << 62;

// x (float, dims) -> op(x, the named int64 initializers) -> y.
TestModel on_x(const std::string& op, const std::vector<int64_t>& dims,
               const std::vector<std::pair<std::string, Tensor>>& initializers,
               const std::function<void(onnx::NodeProto*)>& attrs = {}) {
  TestModel m;
  m.input("x", TensorProto::FLOAT, dims);
  std::vector<std::string> inputs{"x"};
  for (const auto& [name, t] : initializers) {
    inputs.push_back(name);
    if (!name.empty()) m.initializer(name, t);
  }
  onnx::NodeProto* n = m.node(op, inputs, {"y"}, "n");
  if (attrs) attrs(n);
  m.output("y");
  return m;
}

TestModel conv(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& pads) {
  return on_x("Conv", x_dims, {{"w", floats({3, 2, 3, 3})}, {"b", floats({3})}},
              [&](onnx::NodeProto* n) {
                attr_ints(n, "kernel_shape", {3, 3});
                attr_ints(n, "pads", pads);
              });
}

TestModel matmul(const std::vector<int64_t>& a, const Shape& b) {
  return on_x("MatMul", a, {{"b", floats(b)}});
}

TestModel resize_to(const std::vector<int64_t>& sizes) {
  return on_x("Resize", {1, 1, 2, 2}, {{"", {}}, {"", {}}, {"sizes", int64s(sizes)}},
              [](onnx::NodeProto* n) { attr_string(n, "mode", "nearest"); });
}

// Range(start, limit, delta) + x: the range's length is x's.
TestModel range(int64_t limit, int64_t delta, int64_t x_length) {
  TestModel m;
  m.initializer("start", Tensor::scalar(DType::i64, 0));
  m.initializer("limit", Tensor::scalar(DType::i64, double(limit)));
  m.initializer("delta", Tensor::scalar(DType::i64, double(delta)));
  m.input("x", TensorProto::INT64, {x_length});
  m.node("Range", {"start", "limit", "delta"}, {"r"}, "range");
  m.node("Add", {"x", "r"}, {"y"}, "n");
  m.output("y", TensorProto::INT64);
  return m;
}

// Data x [5, 3] indexed by an int64 graph input: the fuzz run feeds 0..9, so some indices
// are out of range and must be refused at run time.
TestModel gather_fed_indices() {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {5, 3});
  m.input("i", TensorProto::INT64, {4});
  attr_int(m.node("Gather", {"x", "i"}, {"y"}, "n"), "axis", 0);
  m.output("y");
  return m;
}

TestModel scatter_nd() {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {4, 4});
  m.initializer("indices", Tensor::from_vector<int64_t>({2, 1}, {0, 2}));
  m.initializer("updates", floats({2, 4}));
  m.node("ScatterND", {"x", "indices", "updates"}, {"y"}, "n");
  m.output("y");
  return m;
}

TestModel scatter_elements() {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {3, 4});
  m.initializer("indices", Tensor::from_vector<int64_t>({2, 2}, {0, 2, -1, 1}));
  m.initializer("updates", floats({2, 2}));
  attr_int(m.node("ScatterElements", {"x", "indices", "updates"}, {"y"}, "n"), "axis", 1);
  m.output("y");
  return m;
}

// a, b (float graph inputs) -> op(a, b) -> y.
TestModel two_inputs(const std::string& op, const std::vector<int64_t>& a_dims,
                     const std::vector<int64_t>& b_dims,
                     const std::function<void(onnx::NodeProto*)>& attrs = {}) {
  TestModel m;
  m.input("a", TensorProto::FLOAT, a_dims);
  m.input("b", TensorProto::FLOAT, b_dims);
  onnx::NodeProto* n = m.node(op, {"a", "b"}, {"y"}, "n");
  if (attrs) attrs(n);
  m.output("y");
  return m;
}

// The example: x [1, 1] expanded to [2^44 + 1, 2^20] (2^64 + 2^20 elements, which
// wraps to 2^20) and transposed.
TestModel expand_wrapping_then_transpose() {
  TestModel m;
  m.input("x", TensorProto::FLOAT, {1, 1});
  m.initializer("shape", int64s({(int64_t(1) << 44) + 1, int64_t(1) << 20}));
  m.node("Expand", {"x", "shape"}, {"e"}, "expand");
  m.node("Transpose", {"e"}, {"y"}, "n");
  m.output("y");
  return m;
}

TestModel constant_of_shape(const std::vector<int64_t>& shape) {
  TestModel m;
  m.initializer("shape", int64s(shape));
  attr_tensor(m.node("ConstantOfShape", {"shape"}, {"y"}, "n"), "value",
              Tensor::full(DType::f32, {1}, 1.0));
  m.output("y");
  return m;
}

std::vector<Seed> seeds() {
  std::vector<Seed> s;
  auto valid = [&](std::string name, TestModel m) { s.push_back({name, true, std::move(m)}); };
  auto attack = [&](std::string name, TestModel m) { s.push_back({name, false, std::move(m)}); };
  valid("conv", conv({1, 2, 5, 5}, {1, 1, 1, 1}));
  valid("matmul", matmul({2, 3}, {3, 4}));
  valid("reshape", on_x("Reshape", {2, 3, 4}, {{"shape", int64s({4, -1})}}));
  valid("gather", on_x("Gather", {5, 4}, {{"i", int64s({4, -1})}}));
  valid("gather_fed_indices", gather_fed_indices());
  valid("resize_scales",
        on_x("Resize", {1, 1, 2, 2},
             {{"", {}}, {"scales", Tensor::from_vector<float>({4}, {1, 1, 2, 1.5f})}},
             [](onnx::NodeProto* n) { attr_string(n, "mode", "linear"); }));
  valid("resize_sizes", resize_to({1, 1, 3, 5}));
  valid("slice", on_x("Slice", {4, 5},
                      {{"starts", int64s({1, 0})},
                       {"ends", int64s({3, -1})},
                       {"axes", int64s({0, 1})},
                       {"steps", int64s({1, 2})}}));
  valid("expand", on_x("Expand", {3, 1}, {{"shape", int64s({2, 3, 4})}}));
  valid("pad", on_x("Pad", {2, 3}, {{"pads", int64s({1, 0, 1, 2})}},
                    [](onnx::NodeProto* n) { attr_string(n, "mode", "reflect"); }));
  valid("tile", on_x("Tile", {2, 3}, {{"repeats", int64s({2, 2})}}));
  valid("range", range(10, 3, 4));
  valid("einsum", two_inputs("Einsum", {2, 2, 3}, {2, 3, 4}, [](onnx::NodeProto* n) {
          attr_string(n, "equation", "bij,bjk->bik");
        }));
  valid("scatter_nd", scatter_nd());
  valid("scatter_elements", scatter_elements());
  valid("constant_of_shape", constant_of_shape({2, 3}));
  // A batch of 0 and zero dims.
  attack("conv_batch_0", conv({0, 2, 5, 5}, {1, 1, 1, 1}));
  attack("matmul_inner_0", matmul({2, 0}, {0, 3}));
  attack("reduce_over_0",
         on_x("ReduceMax", {3, 0}, {}, [](onnx::NodeProto* n) { attr_ints(n, "axes", {1}); }));
  attack("max_pool_batch_0", on_x("MaxPool", {0, 1, 4, 4}, {}, [](onnx::NodeProto* n) {
           attr_ints(n, "kernel_shape", {2, 2});
         }));
  // Huge shapes: element counts near 2^31, 2^32 and 2^63, and products that wrap 2^64.
  attack("expand_wrapping_then_transpose", expand_wrapping_then_transpose());
  attack("expand_2_62", on_x("Expand", {1, 1}, {{"shape", int64s({k2_31, k2_31})}}));
  attack("tile_wrapping", on_x("Tile", {2, 3}, {{"repeats", int64s({k2_32, k2_32})}}));
  attack("pad_huge", on_x("Pad", {2, 3}, {{"pads", int64s({0, k2_62, 0, k2_62})}}));
  attack("resize_sizes_huge", resize_to({1, 1, k2_31, k2_32 + 1}));
  attack("resize_scales_huge",
         on_x("Resize", {1, 1, 2, 2},
              {{"", {}}, {"scales", Tensor::from_vector<float>({4}, {1, 1, 4e9f, 4e9f})}}));
  attack("range_huge", range(k2_62, 1, 4));
  attack("conv_huge_pads", conv({1, 2, 5, 5}, {k2_31, k2_32, k2_31, k2_32}));
  attack("constant_of_shape_wrapping", constant_of_shape({k2_32, k2_32, 2}));
  attack("matmul_huge", two_inputs("MatMul", {k2_32, 3}, {3, k2_32}));
  return s;
}

// The problems with DIR's seeds: "" when they are all there, as seeds() makes them, and
// the valid ones import.
std::string check(const std::string& dir) {
  std::string problems;
  for (const Seed& seed : seeds()) {
    const std::string path = dir + "/" + seed.name + ".onnx";
    if (!std::filesystem::exists(path))
      problems += cat(path, " is missing\n");
    else if (read_file(path) != seed.model.bytes())
      problems += cat(path, " is not what seeds() makes\n");
    if (!seed.valid) continue;
    try {
      import(seed.model);
    } catch (const Error& e) {
      problems += cat("the valid seed ", seed.name, " does not import: ", e.what(), "\n");
    }
  }
  return problems;
}

}  // namespace
}  // namespace fusebox::testing

int main(int argc, char** argv) {
  using namespace fusebox::testing;
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode == "--write") {
    for (const Seed& seed : seeds())
      fusebox::write_file_atomic(std::string(argv[2]) + "/" + seed.name + ".onnx",
                                 seed.model.bytes());
    return 0;
  }
  if (mode == "--check") {
    const std::string problems = check(argv[2]);
    if (problems.empty()) return 0;
    std::fprintf(stderr, "%sRewrite the corpus with: make_corpus --write %s\n", problems.c_str(),
                 argv[2]);
    return 1;
  }
  std::fprintf(stderr, "usage: %s --write|--check DIR\n", argv[0]);
  return 2;
}
