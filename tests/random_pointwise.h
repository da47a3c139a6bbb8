// Random pointwise chains for the fused_pointwise tests (CPU, pass, CUDA): a program over
// inputs of numpy-broadcast shapes and float dtypes, and the same computation as a graph of
// the unfused ops (one node per instruction), which must give the same bits on the CPU.
// Instructions: casts, the unary and binary pointwise ops, unary_backward of the activations.
//
//   RandomChain c = random_chain(seed);
//   run_graph(fused_graph(c), c.feeds())  ==  run_graph(unfused_graph(c), c.feeds())
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "fusebox/ir/op_groups.h"
#include "fusebox/ir/pointwise_program.h"
#include "testing.h"

namespace fusebox::testing {

struct ChainOptions {
  std::vector<DType> dtypes = {DType::f32, DType::bf16, DType::f16};
  int max_inputs = 5;
  int max_instrs = 8;
  int max_rank = 4;
  int64_t max_extent = 6;
  Shape shape;  // the output's; empty with random_shape: drawn
  bool random_shape = true;
  bool well_conditioned = false;  // no sub, div, pow, reciprocal, exp, log, rsqrt (GPU
                                  // comparisons: no cancellation or blow-up of ulps)
  bool derivatives = true;        // unary_backward instructions too (dy and x of one shape)
};

struct RandomChain {
  PointwiseProgram program;
  std::vector<Tensor> inputs;

  NamedTensors feeds() const {
    NamedTensors f;
    for (size_t k = 0; k < inputs.size(); ++k) f[cat("in", k)] = inputs[k];
    return f;
  }
};

namespace random_pointwise_detail {

class Builder {
 public:
  Builder(uint64_t seed, const ChainOptions& o) : rng_(seed), o_(o) {}

  RandomChain build(uint64_t seed) {
    Shape out = o_.shape;
    if (o_.random_shape) {
      out.clear();
      for (int d = pick(o_.max_rank + 1); d > 0; --d) out.push_back(1 + pick(int(o_.max_extent)));
    }
    RandomChain c;
    const int k = 1 + pick(o_.max_inputs);
    for (int j = 0; j < k; ++j) {
      const DType t = o_.dtypes[size_t(pick(int(o_.dtypes.size())))];
      Shape s = out;
      if (j > 0) {  // broadcast: some dims 1, maybe fewer leading dims
        for (int64_t& e : s)
          if (pick(2) == 0) e = 1;
        if (!s.empty() && pick(3) == 0) s.erase(s.begin(), s.begin() + pick(int(s.size()) + 1));
      }
      c.inputs.push_back(random_tensor(t, s, seed * 101 + uint64_t(j), -2.0, 2.0));
      dtypes_.push_back(t);
      shapes_.push_back(s);
    }
    for (int i = 1 + pick(o_.max_instrs); i > 0; --i) instruction();
    // Every input and every instruction but the last read: the unread are added in.
    std::vector<bool> read(dtypes_.size(), false);
    for (const PointwiseInstr& ins : instrs_)
      for (int32_t a : ins.operands) read[size_t(a)] = true;
    int32_t result = last();
    const DType t = dtypes_.back();
    for (int32_t v = 0; v < int32_t(read.size()) - 1; ++v) {
      if (read[size_t(v)]) continue;
      const int32_t u =
          dtypes_[size_t(v)] == t ? v : push({.op = OpKind::cast, .operands = {v}, .to = t});
      result = push({OpKind::add, {result, u}});
    }
    c.program = {k, instrs_};
    return c;
  }

 private:
  int pick(int n) { return int(rng_() % uint64_t(n)); }
  int32_t last() const { return int32_t(dtypes_.size()) - 1; }

  int32_t push(PointwiseInstr ins) {
    DType t = dtypes_[size_t(ins.operands[0])];
    if (ins.op == OpKind::cast) t = ins.to;
    Shape shape;
    for (int32_t a : ins.operands) {
      Shape merged;
      broadcast_shapes(shape, shapes_[size_t(a)], &merged);
      shape = merged;
    }
    instrs_.push_back(std::move(ins));
    dtypes_.push_back(t);
    shapes_.push_back(shape);
    return last();
  }

  // A recent value more often than an old one, so that chains grow long.
  int32_t operand() { return pick(2) == 0 ? last() : pick(int(dtypes_.size())); }

  void instruction() {
    static const OpKind kUnary[] = {
#define FUSEBOX_LIST_OP(name) OpKind::name,
        FUSEBOX_UNARY_POINTWISE_OPS(FUSEBOX_LIST_OP)};
    static const OpKind kBinary[] = {FUSEBOX_BINARY_POINTWISE_OPS(FUSEBOX_LIST_OP)};
#undef FUSEBOX_LIST_OP
    const int kind = pick(10);
    int32_t a = operand();
    if (kind < 1) {  // cast
      push({.op = OpKind::cast,
            .operands = {a},
            .to = o_.dtypes[size_t(pick(int(o_.dtypes.size())))]});
      return;
    }
    if (kind < 6) {
      const OpKind op = kUnary[pick(int(std::size(kUnary)))];
      if (o_.well_conditioned && (op == OpKind::exp || op == OpKind::log || op == OpKind::rsqrt ||
                                  op == OpKind::reciprocal))
        return push_unary(OpKind::tanh, a);
      if (op == OpKind::log || op == OpKind::sqrt || op == OpKind::rsqrt)
        a = push({OpKind::abs, {a}});  // in their domain (0 aside)
      return push_unary(op, a);
    }
    if (kind == 9 && o_.derivatives) return push_derivative(a);
    const OpKind op = kBinary[pick(int(std::size(kBinary)))];
    if (o_.well_conditioned && (op == OpKind::sub || op == OpKind::div || op == OpKind::pow)) {
      push({OpKind::mul, {a, same_dtype(a)}});
      return;
    }
    if (op == OpKind::pow) {
      a = push({OpKind::abs, {a}});  // a negative base to a fractional power is NaN
      push({OpKind::pow, {a, operand()}});
      return;
    }
    push({op, {a, same_dtype(a)}});
  }

  void push_unary(OpKind op, int32_t a) {
    PointwiseInstr ins{op, {a}};
    static const double kAlphas[] = {0.01, 0.2, 1.5};
    ins.alpha = kAlphas[pick(3)];
    ins.tanh_approximation = pick(2) == 0;
    ins.min = pick(3) == 0 ? -INFINITY : -0.3 * (1 + pick(5));  // bounds some dtypes cannot hold
    ins.max = pick(3) == 0 ? INFINITY : 0.7 * (1 + pick(3));
    push(std::move(ins));
  }

  // unary_backward (dy = a, x = a value of a's dtype and shape) of an activation the programs
  // take (is_program_derivative), with random attributes.
  void push_derivative(int32_t a) {
    static const OpKind kForward[] = {OpKind::relu, OpKind::leaky_relu, OpKind::gelu,
                                      OpKind::silu, OpKind::sigmoid,    OpKind::tanh};
    std::vector<int32_t> same;
    for (int32_t v = 0; v <= last(); ++v)
      if (dtypes_[size_t(v)] == dtypes_[size_t(a)] && shapes_[size_t(v)] == shapes_[size_t(a)])
        same.push_back(v);
    PointwiseInstr ins{OpKind::unary_backward, {a, same[size_t(pick(int(same.size())))]}};
    ins.of = kForward[pick(int(std::size(kForward)))];
    static const double kAlphas[] = {0.01, 0.2, 1.5};
    ins.alpha = kAlphas[pick(3)];
    ins.tanh_approximation = pick(2) == 0;
    push(std::move(ins));
  }

  // Another value of a's dtype (a itself when there is none).
  int32_t same_dtype(int32_t a) {
    std::vector<int32_t> same;
    for (int32_t v = 0; v <= last(); ++v)
      if (dtypes_[size_t(v)] == dtypes_[size_t(a)]) same.push_back(v);
    return same[size_t(pick(int(same.size())))];
  }

  std::mt19937_64 rng_;
  const ChainOptions& o_;
  std::vector<DType> dtypes_;  // every value's
  std::vector<Shape> shapes_;  // every value's
  std::vector<PointwiseInstr> instrs_;
};

}  // namespace random_pointwise_detail

inline RandomChain random_chain(uint64_t seed, const ChainOptions& options = {}) {
  return random_pointwise_detail::Builder(seed, options).build(seed);
}

// Inputs "in0".., one node per instruction ("t0"..), the last instruction's value "y" marked.
inline Graph unfused_graph(const RandomChain& c) {
  Graph g("unfused");
  std::vector<ValueId> values;
  for (size_t k = 0; k < c.inputs.size(); ++k)
    values.push_back(g.add_input(cat("in", k), c.inputs[k].dtype(), c.inputs[k].shape()));
  for (size_t i = 0; i < c.program.instrs.size(); ++i) {
    const PointwiseInstr& ins = c.program.instrs[i];
    std::vector<ValueId> operands;
    for (int32_t a : ins.operands) operands.push_back(values[size_t(a)]);
    const bool last = i + 1 == c.program.instrs.size();
    values.push_back(g.add_node(ins.op, pointwise_instr_attrs(ins), operands, cat("t", i),
                                {last ? "y" : cat("t", i)})[0]);
  }
  g.mark_output(values.back());
  return g;
}

// The same inputs, one fused_pointwise node writing "y".
inline Graph fused_graph(const RandomChain& c) {
  Graph g("fused");
  std::vector<ValueId> inputs;
  for (size_t k = 0; k < c.inputs.size(); ++k)
    inputs.push_back(g.add_input(cat("in", k), c.inputs[k].dtype(), c.inputs[k].shape()));
  g.mark_output(g.add_node(OpKind::fused_pointwise, c.program, inputs, "fused", {"y"})[0]);
  return g;
}

}  // namespace fusebox::testing
