// fused_pointwise on the CPU (the oracle of the generated CUDA kernels): the program is
// interpreted over blocks of output elements, one instruction at a time over a whole block,
// with pointwise_math.h's formulas (the unfused ops' own), so a block costs one switch per
// instruction rather than one per element.
//
// Values. Every value (input or instruction result) of a block lives in a buffer of its
// compute type: double for f64 values, float for the others. An instruction computes in the
// compute type of its result's dtype from its operands (converted first where they are of
// the other width: pow's exponent, a cast's source) and rounds each result to its dtype
// (check_pointwise_program says which), as the op alone stores it: the unfused chain's bits.
//
// Inputs broadcast by index math: each input has a strided nest over the output's shape
// (stride 0 where it broadcasts, backends/cpu/kernel_util.h), walked for each block.
#include "fusebox/ir/pointwise_program.h"
#include "kernel_util.h"
#include "kernels.h"
#include "pointwise_math.h"

namespace fusebox::cpu {

namespace {

constexpr int64_t kBlock = 512;  // output elements per interpreted block

// Where each value's block buffer is: slot `slot` of the float or the double buffers.
struct ValueSlot {
  DType dtype;
  bool wide;  // f64: computed in double
  size_t slot;
};

// One thread's block buffers.
class Buffers {
 public:
  Buffers(size_t floats, size_t doubles)
      : f_(floats * kBlock), d_(doubles * kBlock), scratch_f_(kBlock), scratch_d_(kBlock) {}

  template <class C>
  C* of(const ValueSlot& v) {
    if constexpr (std::is_same_v<C, double>)
      return d_.data() + v.slot * kBlock;
    else
      return f_.data() + v.slot * kBlock;
  }
  // Value v as C: its own buffer, or converted into a scratch buffer when it is the other
  // width (the conversion the unfused op applies: float(double) rounds to nearest).
  template <class C>
  const C* as(const ValueSlot& v, int64_t count) {
    if (v.wide == std::is_same_v<C, double>) return of<C>(v);
    C* out = scratch<C>();
    if (v.wide) {
      const double* src = of<double>(v);
      for (int64_t j = 0; j < count; ++j) out[j] = C(src[j]);
    } else {
      const float* src = of<float>(v);
      for (int64_t j = 0; j < count; ++j) out[j] = C(src[j]);
    }
    return out;
  }

 private:
  template <class C>
  C* scratch() {
    if constexpr (std::is_same_v<C, double>)
      return scratch_d_.data();
    else
      return scratch_f_.data();
  }
  std::vector<float> f_;
  std::vector<double> d_;
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};

class Interpreter {
 public:
  Interpreter(const Node& n, Inputs in, Tensor& y)
      : n_(n), p_(std::get<PointwiseProgram>(n.attrs)), in_(in), y_(y) {
    std::vector<DType> input_dtypes;
    for (const Tensor* t : in) input_dtypes.push_back(t->dtype());
    const std::vector<DType> dtypes = check_pointwise_program(p_, input_dtypes, node_label(n));
    for (DType t : dtypes) {
      const bool wide = t == DType::f64;
      values_.push_back({t, wide, wide ? doubles_++ : floats_++});
    }
    for (const Tensor* t : in) {
      StridedNest<2> nest{
          y.shape(), {contiguous_strides(y.shape()), broadcast_strides(t->shape(), y.shape())}};
      nest.simplify();
      nests_.push_back(std::move(nest));
    }
  }

  void run() {
    parallel_for(y_.numel(), kGrain, [&](int64_t begin, int64_t end) {
      Buffers buffers(floats_, doubles_);
      for (int64_t b = begin; b < end; b += kBlock) block(buffers, b, std::min(kBlock, end - b));
    });
  }

 private:
  void block(Buffers& buf, int64_t begin, int64_t count) {
    for (size_t k = 0; k < in_.size(); ++k) load(buf, k, begin, count);
    for (size_t i = 0; i < p_.instrs.size(); ++i) instruction(buf, i, count);
    const ValueSlot& last = values_.back();
    visit_float(n_, last.dtype, [&](auto tag) {
      using T = decltype(tag);
      const compute_t<T>* src = buf.of<compute_t<T>>(last);
      T* dst = y_.data<T>() + begin;
      for (int64_t j = 0; j < count; ++j) dst[j] = convert<T>(src[j]);  // exact: rounded
    });
  }

  // Input k's elements for output elements [begin, begin + count), as its compute type.
  void load(Buffers& buf, size_t k, int64_t begin, int64_t count) {
    const ValueSlot& v = values_[k];
    visit_float(n_, v.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* src = in_[k]->data<T>();
      compute_t<T>* dst = buf.of<compute_t<T>>(v);
      const StridedNest<2>& nest = nests_[k];
      const int64_t stride = nest.inner_stride(1);
      nest.for_each_run(begin, begin + count, [&](const std::array<int64_t, 2>& off, int64_t run) {
        compute_t<T>* out = dst + (off[0] - begin);
        for (int64_t j = 0; j < run; ++j) out[j] = to_compute(src[off[1] + j * stride]);
      });
    });
  }

  void instruction(Buffers& buf, size_t i, int64_t count) {
    const PointwiseInstr& ins = p_.instrs[i];
    const ValueSlot& result = values_[size_t(p_.inputs) + i];
    const ValueSlot& a = values_[size_t(ins.operands[0])];
    visit_float(n_, result.dtype, [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      C* r = buf.of<C>(result);
      // Each result rounded to T, as the op alone stores it, and kept as C.
      auto round = [](C v) { return to_compute(convert<T>(v)); };
      if (ins.op == OpKind::cast) {
        if (a.wide) {
          const double* src = buf.of<double>(a);
          for (int64_t j = 0; j < count; ++j) r[j] = to_compute(convert<T>(src[j]));
        } else {
          const float* src = buf.of<float>(a);
          for (int64_t j = 0; j < count; ++j) r[j] = to_compute(convert<T>(src[j]));
        }
        return;
      }
      if (pointwise_arity(ins.op) == 1) {
        const C* x = buf.as<C>(a, count);
        if (with_float_unary<C>(ins, [&](auto f) {
              for (int64_t j = 0; j < count; ++j) r[j] = round(f(x[j]));
            }))
          return;
      } else {
        const C* u = buf.as<C>(a, count);
        // The exponent of pow may be the other width; as() reuses one scratch buffer per
        // width, and u is never converted (binary operands share the result's dtype).
        const C* v = buf.as<C>(values_[size_t(ins.operands[1])], count);
        if (with_float_binary_instr<C>(ins, [&](auto f) {
              for (int64_t j = 0; j < count; ++j) r[j] = round(f(u[j], v[j]));
            }))
          return;
      }
      throw Error(node_label(n_),
                  cat("program instruction t", i, ": ", op_name(ins.op), " is not a pointwise op"));
    });
  }

  const Node& n_;
  const PointwiseProgram& p_;
  Inputs in_;
  Tensor& y_;
  std::vector<ValueSlot> values_;  // inputs, then instruction results
  size_t floats_ = 0, doubles_ = 0;
  std::vector<StridedNest<2>> nests_;  // per input
};

}  // namespace

void fused_pointwise(const Node& n, Inputs in, Outputs out) {
  Interpreter(n, in, out[0]).run();
}

}  // namespace fusebox::cpu
