// fused_pointwise on the fast CPU path: the generated pointwise program interpreted over blocks
// of output elements, one instruction at a time over a whole block, with pointwise_math.h's
// formulas (the reference's, backends/cpu/fused_pointwise.cpp), so the results are the
// reference's bits. Values of f32, bf16 and f16 only: all of them compute in f32 there, each
// instruction's result rounded to its dtype; a program with an f64 value computes in double
// and stays on the reference.
//
// What makes it faster than the reference's interpreter, which has the same structure:
//  - every loop over a block runs exactly kBlock times, whatever is left of the output, with
//    operands that cannot alias (__restrict): the loops GCC's -O2 cost model vectorises
//    (it takes a loop only where no scalar remainder and no run-time overlap check is needed);
//  - inputs are placed per kind, decided at compile: an f32 input of the output's shape is
//    read in place, a single element filled once per thread, any other broadcast gathered
//    run by run (a per-channel input: one fill per run);
//  - the last instruction of an f32 program writes into the output; f32 results are not
//    rounded (they already are);
//  - the threads split whole blocks; a second thread joins only past kMinElementsPerThread.
// The last, partial block computes on the stale tail of its buffers and stores only its own
// elements.
#include <algorithm>
#include <cstring>
#include <exception>

#include "backends/cpu/kernel_util.h"
#include "backends/cpu/pointwise_math.h"
#include "backends/cpu_fast/kernels.h"
#include "fusebox/core/parallel.h"
#include "fusebox/ir/pointwise_program.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace fusebox::cpu_fast {
namespace {

using cpu::convert;
using cpu::StridedNest;
using cpu::to_compute;

constexpr int64_t kBlock = 256;  // a multiple of every vector width
// About 10 us of the cheapest programs: less is not worth waking another thread.
constexpr int64_t kMinElementsPerThread = int64_t(1) << 14;

// How input k's values for a block are placed.
enum class Placement {
  in_place,  // f32, the output's elements: the block reads the tensor itself (full blocks)
  scalar,    // one element: filled once per thread
  gathered,  // converted or broadcast, run by run
};

struct InputPlan {
  DType dtype;
  Placement placement;
  StridedNest<2> nest;  // output offsets, input offsets
};

// The value `v` of dtype T, as the reference holds it: rounded to T, kept as f32.
template <class T>
void round_block(float* __restrict v) {
  for (int64_t j = 0; j < kBlock; ++j) v[j] = to_compute(convert<T>(v[j]));
}

// bf16's rounding of an f32 value as BFloat16(float) rounds it (to nearest even; a NaN
// quieted), kept as f32: inline and branch-free, so that GCC vectorises the block's loops
// (BFloat16's constructor is out of line: a call per element made MobileNetV3-S's bf16
// programs 4x slower than its f32 ones).
inline uint32_t bf16_rounded_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet = (x | 0x00400000u) & 0xffff0000u;
  return (x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}

void round_block_bf16(float* __restrict v) {
  for (int64_t j = 0; j < kBlock; ++j) {
    const uint32_t x = bf16_rounded_bits(v[j]);
    std::memcpy(&v[j], &x, sizeof x);
  }
}

void round_block(DType t, float* v) {
  if (t == DType::bf16)
    round_block_bf16(v);
  else if (t == DType::f16)
    round_block<Half>(v);
}

template <class F>
void map_block(F f, const float* __restrict x, float* __restrict r) {
  for (int64_t j = 0; j < kBlock; ++j) r[j] = f(x[j]);
}

template <class F>
void map_block(F f, const float* __restrict u, const float* __restrict v, float* __restrict r) {
  for (int64_t j = 0; j < kBlock; ++j) r[j] = f(u[j], v[j]);
}

template <class F>
decltype(auto) visit_value_dtype(DType t, F&& f) {
  switch (t) {
    case DType::bf16:
      return f(BFloat16{});
    case DType::f16:
      return f(Half{});
    default:
      return f(float{});
  }
}

class PointwiseKernel final : public Kernel {
 public:
  PointwiseKernel(const PointwiseProgram& p, std::vector<DType> dtypes,
                  std::vector<InputPlan> inputs, int64_t numel)
      : p_(p), dtypes_(std::move(dtypes)), inputs_(std::move(inputs)), numel_(numel) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const int64_t blocks = (numel_ + kBlock - 1) / kBlock;
    auto blocks_from_to = [&](int64_t first, int64_t last) {
      // One f32 buffer per value, zeroed: a partial block's tail is computed on, never stored.
      std::vector<float> buffers(dtypes_.size() * size_t(kBlock), 0.f);
      std::vector<const float*> values(dtypes_.size());
      for (size_t k = 0; k < inputs_.size(); ++k)
        if (inputs_[k].placement == Placement::scalar) fill_scalar(*in[k], k, buffer(buffers, k));
      for (int64_t b = first; b < last; ++b) {
        const int64_t begin = b * kBlock, count = std::min(kBlock, numel_ - begin);
        block(in, out[0], buffers, values, begin, count);
      }
    };
#if defined(_OPENMP)
    // On oneDNN's OpenMP threads (libgomp, the one runtime): fusebox's own pool woke threads
    // that competed with OpenMP's workers still spinning after a convolution (libgomp was
    // 31% of MobileNetV3-S's batch-1 profile, and a second pool thread bought nothing).
    const int threads = int(std::clamp<int64_t>(
        blocks / std::max<int64_t>(1, kMinElementsPerThread / kBlock), 1, num_threads()));
    if (threads == 1) return blocks_from_to(0, blocks);
    std::exception_ptr failure;
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      try {
        blocks_from_to(blocks * t / n, blocks * (t + 1) / n);
      } catch (...) {
#pragma omp critical
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
#else
    parallel_for(blocks, kMinElementsPerThread / kBlock, blocks_from_to);
#endif
  }

  std::string describe() const override {
    return cat("block interpreter (", p_.instrs.size(), " instructions, ", kBlock,
               "-element blocks)");
  }

 private:
  float* buffer(std::vector<float>& buffers, size_t v) const {
    return buffers.data() + v * size_t(kBlock);
  }

  void block(std::span<const Tensor* const> in, Tensor& y, std::vector<float>& buffers,
             std::vector<const float*>& values, int64_t begin, int64_t count) const {
    const bool full = count == kBlock;
    for (size_t k = 0; k < inputs_.size(); ++k) {
      const InputPlan& input = inputs_[k];
      if (input.placement == Placement::in_place && full) {
        values[k] = in[k]->data<float>() + begin;
        continue;
      }
      float* dst = buffer(buffers, k);
      values[k] = dst;
      if (input.placement != Placement::scalar) gather(*in[k], input, dst, begin, count);
    }
    const size_t k = size_t(p_.inputs), last = p_.instrs.size() - 1;
    const bool into_output = full && dtypes_.back() == DType::f32;
    for (size_t i = 0; i <= last; ++i) {
      float* r = i == last && into_output ? y.data<float>() + begin : buffer(buffers, k + i);
      instruction(p_.instrs[i], dtypes_[k + i], values, r);
      values[k + i] = r;
    }
    if (into_output) return;
    const float* result = values.back();
    if (dtypes_.back() == DType::bf16) {  // exact: rounded; the top half of the f32 bits
      BFloat16* dst = y.data<BFloat16>() + begin;
      for (int64_t j = 0; j < count; ++j)
        dst[j].bits = uint16_t(bf16_rounded_bits(result[j]) >> 16);
      return;
    }
    visit_value_dtype(dtypes_.back(), [&](auto tag) {
      using T = decltype(tag);
      T* dst = y.data<T>() + begin;
      for (int64_t j = 0; j < count; ++j) dst[j] = convert<T>(result[j]);  // exact: rounded
    });
  }

  // r = the instruction over the block, rounded to `dtype`.
  static void instruction(const PointwiseInstr& ins, DType dtype,
                          const std::vector<const float*>& values, float* r) {
    const float* a = values[size_t(ins.operands[0])];
    if (ins.op == OpKind::cast) {  // a is exact in its dtype: rounding it to `dtype` is the cast
      std::memcpy(r, a, sizeof(float) * size_t(kBlock));
    } else if (pointwise_arity(ins.op) == 1) {
      cpu::with_float_unary<float>(ins, [&](auto f) { map_block(f, a, r); });
    } else {
      const float* b = values[size_t(ins.operands[1])];
      cpu::with_float_binary<float>(ins.op, [&](auto f) { map_block(f, a, b, r); });
    }
    round_block(dtype, r);
  }

  void fill_scalar(const Tensor& t, size_t k, float* dst) const {
    visit_value_dtype(inputs_[k].dtype, [&](auto tag) {
      using T = decltype(tag);
      std::fill(dst, dst + kBlock, to_compute(t.data<T>()[0]));
    });
  }

  // The input's elements for output elements [begin, begin + count), as f32.
  static void gather(const Tensor& t, const InputPlan& input, float* dst, int64_t begin,
                     int64_t count) {
    visit_value_dtype(input.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* src = t.data<T>();
      const int64_t stride = input.nest.inner_stride(1);
      input.nest.for_each_run(begin, begin + count,
                              [&](const std::array<int64_t, 2>& off, int64_t run) {
                                float* out = dst + (off[0] - begin);
                                const T* from = src + off[1];
                                if (stride == 0) {
                                  std::fill(out, out + run, to_compute(*from));
                                } else if (stride == 1) {  // a loop GCC vectorises
                                  for (int64_t j = 0; j < run; ++j) out[j] = to_compute(from[j]);
                                } else {
                                  for (int64_t j = 0; j < run; ++j)
                                    out[j] = to_compute(from[j * stride]);
                                }
                              });
    });
  }

  const PointwiseProgram p_;
  const std::vector<DType> dtypes_;  // every value's: the inputs, then the instructions'
  const std::vector<InputPlan> inputs_;
  const int64_t numel_;
};

// Why no instruction of `p` is beyond this interpreter, or the first that is.
std::string unsupported_instruction(const PointwiseProgram& p) {
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const PointwiseInstr& ins = p.instrs[i];
    const auto nothing = [](auto) {};
    const bool known =
        ins.op == OpKind::cast ||
        (pointwise_arity(ins.op) == 1 ? cpu::with_float_unary<float>(ins, nothing)
                                      : cpu::with_float_binary<float>(ins.op, nothing));
    if (!known) return cat("instruction t", i, ": ", op_name(ins.op), " (not interpreted here)");
  }
  return "";
}

}  // namespace

Planned plan_fused_pointwise(const Graph& g, const Node& n) {
  const auto& p = std::get<PointwiseProgram>(n.attrs);
  std::vector<DType> input_dtypes;
  for (ValueId v : n.inputs) input_dtypes.push_back(g.value(v).type.dtype);
  std::vector<DType> dtypes;
  try {
    dtypes = check_pointwise_program(p, input_dtypes, node_label(n));
  } catch (const Error& e) {  // the reference says so when it runs the node
    return {nullptr, cat("a malformed program: ", e.what())};
  }
  for (DType t : dtypes)
    if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
      return {nullptr, cat("an ", dtype_name(t), " value (the reference computes it in double)")};
  if (const std::string why = unsupported_instruction(p); !why.empty()) return {nullptr, why};
  const Shape& y = g.value(n.outputs[0]).type.shape;
  std::vector<InputPlan> inputs;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const Shape& x = g.value(n.inputs[k]).type.shape;
    InputPlan input{dtypes[k], Placement::gathered,
                    StridedNest<2>{y, {contiguous_strides(y), cpu::broadcast_strides(x, y)}}};
    input.nest.simplify();
    if (numel(x) == 1)
      input.placement = Placement::scalar;
    else if (numel(x) == numel(y) && dtypes[k] == DType::f32)  // y's elements: 1-dims added
      input.placement = Placement::in_place;
    inputs.push_back(std::move(input));
  }
  return {std::make_unique<PointwiseKernel>(p, std::move(dtypes), std::move(inputs), numel(y)), ""};
}

}  // namespace fusebox::cpu_fast
