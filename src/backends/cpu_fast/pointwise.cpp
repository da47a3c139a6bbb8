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
//  - the threads split whole blocks; a second thread joins only past kMinElementsPerThread;
//  - each instruction's loop is compiled twice, for AVX2 (8 lanes) and for the build's
//    baseline (SSE2, 4 lanes), the CPU choosing at load time (FUSEBOX_VECTOR_CLONES): the
//    same IEEE operations per element, so the same bits; MobileNetV3-S batch 8 on one
//    thread ~12% faster a step.
// The last, partial block computes on the stale tail of its buffers and stores only its own
// elements.
#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>

#include "backends/cpu/kernel_util.h"
#include "backends/cpu/pointwise_math.h"
#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/threads.h"
#include "fusebox/ir/pointwise_program.h"
#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/onednn.h"
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
  // A gathered f32 input of one value per (sample, channel) of an output [N, C, S...] (a
  // squeeze-and-excitation scale [N, C, 1, 1]): the elements between two samples' values (C,
  // or 0 for one sample's broadcast); -1 for any other input.
  int64_t channel_sample_stride = -1;
};

// Where the channels lie in a layout a convolution leaves, for per-channel inputs: runs of
// `block` channels (channel c at c % block), one run per pixel, `pixels` runs per block of
// channels, `blocks` blocks per sample; channels past `channels` are padding. Channels last
// (nhwc) is one block of all channels; nChw8c blocks of 8.
struct ChannelOrder {
  int64_t block = 1, blocks = 1, pixels = 1, channels = 1;
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

// A block loop in an AVX2 clone and a baseline one, the CPU choosing at load time (an ifunc:
// GCC and Clang on x86-64 Linux). No FMA in the clone: an instruction stays one rounding.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define FUSEBOX_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FUSEBOX_VECTOR_CLONES
#endif

template <class F>
FUSEBOX_VECTOR_CLONES void map_block(F f, const float* __restrict x, float* __restrict r) {
  for (int64_t j = 0; j < kBlock; ++j) r[j] = f(x[j]);
}

template <class F>
FUSEBOX_VECTOR_CLONES void map_block(F f, const float* __restrict u, const float* __restrict v,
                                     float* __restrict r) {
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
                  std::vector<InputPlan> inputs, Shape y)
      : p_(p),
        dtypes_(std::move(dtypes)),
        inputs_(std::move(inputs)),
        y_(std::move(y)),
        numel_(numel(y_)),
        layout_free_(layout_free(dtypes_, inputs_)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    std::vector<const void*> data(in.size());
    for (size_t k = 0; k < in.size(); ++k) data[k] = in[k]->raw();
    run_raw(data, out[0].raw(), numel_);
  }

  // Own layouts: a program of f32 values whose every input is a scalar or has the output's
  // elements computes element by element in any order of the elements, so it runs over a
  // convolution's blocked output as it lies and leaves its result in that layout for the next
  // convolution (MobileNetV3's hardswish between two convolutions: a reorder out of oneDNN's
  // layout and one back into it, per activation, otherwise). The layouts are oneDNN's: a build
  // without it has none, and claiming one there left the output unallocated (a crash).
#ifdef FUSEBOX_WITH_ONEDNN
  bool writes_own_layout() const override {
    return layout_free_;
  }
  bool reads_own_layout(size_t input) const override {
    return layout_free_ && inputs_[input].placement == Placement::in_place;
  }
#endif

  void run_own(std::span<const Tensor* const> in, std::span<const OwnLayout* const> own_in,
               uint32_t /*consumable*/, std::span<Tensor> out,
               std::shared_ptr<OwnLayout>* own_out) override {
#ifdef FUSEBOX_WITH_ONEDNN
    using dnnl::memory;
    auto own = [&](size_t k) -> const memory* {
      const OwnLayout* o = k < own_in.size() ? own_in[k] : nullptr;
      return o ? &static_cast<const OnednnValue*>(o)->memory : nullptr;
    };
    // In the writers' layout: every input of the output's elements held in one layout, and
    // any padding that layout has (channels rounded up to its block) kept zero, as oneDNN's
    // readers may sum over it.
    std::optional<memory::desc> layout;
    bool in_layout = true;
    for (size_t k = 0; k < inputs_.size() && in_layout; ++k) {
      if (inputs_[k].placement != Placement::in_place) continue;
      const memory* m = own(k);
      in_layout = m != nullptr && (!layout || m->get_desc() == *layout);
      if (in_layout) layout = m->get_desc();
    }
    std::optional<ChannelOrder> order;
    if (in_layout && layout && has_per_channel_input()) order = channel_order(*layout);
    in_layout = in_layout && layout && layout->get_dims() == dims_of(y_) &&
                (!has_per_channel_input() || order) &&
                (layout->get_padded_dims() == layout->get_dims() || zero_stays_zero(in));
    std::vector<const void*> data(in.size());
    std::vector<memory> dense;  // own inputs reordered to dense, alive for the run
    for (size_t k = 0; k < in.size(); ++k) {
      const memory* m = own(k);
      if (m == nullptr) {
        data[k] = in[k]->raw();
      } else if (in_layout) {
        data[k] = m->get_data_handle();
      } else {
        dense.emplace_back(plain_desc(m->get_desc().get_dims()), cpu_engine());
        execute(dnnl::reorder(*m, dense.back()), {{DNNL_ARG_FROM, *m},
                                                  { DNNL_ARG_TO,
                                                    dense.back() }});
        data[k] = dense.back().get_data_handle();
      }
    }
    if (!in_layout) {
      if (!own_out) return run_raw(data, out[0].raw(), numel_);
      const memory y(plain_desc(dims_of(y_), dtypes_.back()), cpu_engine());
      run_raw(data, y.get_data_handle(), numel_);
      *own_out = std::make_shared<OnednnValue>(y);
      return;
    }
    // Per-channel inputs as the layout's channel blocks: [N][blocks * block], zero padded.
    std::vector<std::vector<float>> padded;
    if (order) {
      const int64_t samples = y_[0], per_sample = order->blocks * order->block;
      for (size_t k = 0; k < inputs_.size(); ++k) {
        if (inputs_[k].placement != Placement::gathered) continue;
        std::vector<float>& table = padded.emplace_back(size_t(samples * per_sample), 0.f);
        const float* src = static_cast<const float*>(data[k]);
        for (int64_t n = 0; n < samples; ++n)
          std::memcpy(table.data() + n * per_sample, src + n * inputs_[k].channel_sample_stride,
                      sizeof(float) * size_t(order->channels));
        data[k] = table.data();
      }
    }
    const memory y(*layout, cpu_engine());
    run_raw(data, y.get_data_handle(), int64_t(layout->get_size() / sizeof(float)),
            order ? &*order : nullptr);
    if (own_out) {
      *own_out = std::make_shared<OnednnValue>(y);
    } else {
      const memory dst = wrap(plain_desc(layout->get_dims()), out[0].raw());
      execute(dnnl::reorder(y, dst), {{DNNL_ARG_FROM, y}, { DNNL_ARG_TO, dst }});
    }
#else
    (void)own_in;
    (void)own_out;
    run(in, out);
#endif
  }

  std::string describe() const override {
    return cat("block interpreter (", p_.instrs.size(), " instructions, ", kBlock,
               "-element blocks",
               layout_free_ ? "; in a convolution's layout where it gets one" : "", ")");
  }

 private:
  bool has_per_channel_input() const {
    return std::any_of(inputs_.begin(), inputs_.end(),
                       [](const InputPlan& i) { return i.placement == Placement::gathered; });
  }

#ifdef FUSEBOX_WITH_ONEDNN
  // The channel order of `d` where it is channels last or oneDNN's channel blocks of 8 or 16
  // (what its convolutions leave on x86), else nullopt.
  static std::optional<ChannelOrder> channel_order(const dnnl::memory::desc& d) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims dims = d.get_dims();
    if (dims.size() < 3 || dims.size() > 5 || d.get_data_type() != dnnl::memory::data_type::f32)
      return std::nullopt;
    const size_t r = dims.size() - 3;
    const tag last[] = {tag::nwc, tag::nhwc, tag::ndhwc};
    const tag by8[] = {tag::nCw8c, tag::nChw8c, tag::nCdhw8c};
    const tag by16[] = {tag::nCw16c, tag::nChw16c, tag::nCdhw16c};
    ChannelOrder o;
    o.channels = dims[1];
    for (size_t i = 2; i < dims.size(); ++i) o.pixels *= dims[i];
    auto is = [&](tag t) { return d == dnnl::memory::desc(dims, d.get_data_type(), t); };
    if (is(last[r])) {
      o.block = o.channels;
    } else if (is(by8[r]) || is(by16[r])) {
      o.block = is(by8[r]) ? 8 : 16;
      o.blocks = (o.channels + o.block - 1) / o.block;
    } else {
      return std::nullopt;
    }
    return o;
  }
#endif

  static bool layout_free(const std::vector<DType>& dtypes, const std::vector<InputPlan>& inputs) {
    bool any = false;
    for (const InputPlan& input : inputs) {
      if (input.placement == Placement::gathered && input.channel_sample_stride < 0) return false;
      any = any || input.placement == Placement::in_place;
    }
    return any &&
           std::all_of(dtypes.begin(), dtypes.end(), [](DType t) { return t == DType::f32; });
  }

  // The program over `count` elements: input k's at data[k] (in place ones in the output's
  // order, scalars one element), the result into y.
  void run_raw(const std::vector<const void*>& data, void* y, int64_t count,
               const ChannelOrder* order = nullptr) const {
    const int64_t blocks = (count + kBlock - 1) / kBlock;
    auto blocks_from_to = [&](int64_t first, int64_t last) {
      // One f32 buffer per value, zeroed: a partial block's tail is computed on, never stored.
      std::vector<float> buffers(dtypes_.size() * size_t(kBlock), 0.f);
      std::vector<const float*> values(dtypes_.size());
      for (size_t k = 0; k < inputs_.size(); ++k)
        if (inputs_[k].placement == Placement::scalar) fill_scalar(data[k], k, buffer(buffers, k));
      for (int64_t b = first; b < last; ++b) {
        const int64_t begin = b * kBlock;
        block(data, y, buffers, values, begin, std::min(kBlock, count - begin), order);
      }
    };
    split_over_threads(blocks, std::max<int64_t>(1, kMinElementsPerThread / kBlock),
                       blocks_from_to);
  }

  // Whether the program gives 0 where its in-place and per-channel inputs are 0 (its scalars
  // as given): the padding of a blocked layout then stays zero.
  bool zero_stays_zero(std::span<const Tensor* const> in) const {
    // One block of zeros for every input but the scalars, a per-channel one read as a layout
    // of one channel per element (ChannelOrder's defaults), through the run's own path.
    const std::vector<float> zeros(size_t(kBlock), 0.f);
    std::vector<const void*> data(inputs_.size(), zeros.data());
    for (size_t k = 0; k < inputs_.size(); ++k)
      if (inputs_[k].placement == Placement::scalar) data[k] = in[k]->raw();
    std::vector<float> result(size_t(kBlock), 0.f);
    const ChannelOrder one_channel;
    run_raw(data, result.data(), kBlock, &one_channel);
    return std::all_of(result.begin(), result.end(), [](float v) { return v == 0.f; });
  }

  float* buffer(std::vector<float>& buffers, size_t v) const {
    return buffers.data() + v * size_t(kBlock);
  }

  // `order`: the layout the elements are in (in place inputs and the output), for the
  // per-channel inputs; null: the dense order.
  void block(const std::vector<const void*>& in, void* y, std::vector<float>& buffers,
             std::vector<const float*>& values, int64_t begin, int64_t count,
             const ChannelOrder* order) const {
    const bool full = count == kBlock;
    for (size_t k = 0; k < inputs_.size(); ++k) {
      const InputPlan& input = inputs_[k];
      if (input.placement == Placement::in_place && full) {
        values[k] = static_cast<const float*>(in[k]) + begin;
        continue;
      }
      float* dst = buffer(buffers, k);
      values[k] = dst;
      if (input.placement == Placement::in_place)  // the output's order (or the layout's)
        std::memcpy(dst, static_cast<const float*>(in[k]) + begin, sizeof(float) * size_t(count));
      else if (input.placement == Placement::gathered && order != nullptr)
        gather_channels(static_cast<const float*>(in[k]), *order, dst, begin, count);
      else if (input.placement != Placement::scalar)
        gather(in[k], input, dst, begin, count);
    }
    const size_t k = size_t(p_.inputs), last = p_.instrs.size() - 1;
    const bool into_output = full && dtypes_.back() == DType::f32;
    for (size_t i = 0; i <= last; ++i) {
      float* r = i == last && into_output ? static_cast<float*>(y) + begin : buffer(buffers, k + i);
      instruction(p_.instrs[i], dtypes_[k + i], values, r);
      values[k + i] = r;
    }
    if (into_output) return;
    const float* result = values.back();
    if (dtypes_.back() == DType::bf16) {  // exact: rounded; the top half of the f32 bits
      BFloat16* dst = static_cast<BFloat16*>(y) + begin;
      for (int64_t j = 0; j < count; ++j)
        dst[j].bits = uint16_t(bf16_rounded_bits(result[j]) >> 16);
      return;
    }
    visit_value_dtype(dtypes_.back(), [&](auto tag) {
      using T = decltype(tag);
      T* dst = static_cast<T*>(y) + begin;
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
      cpu::with_float_binary_instr<float>(ins, [&](auto f) { map_block(f, a, b, r); });
    }
    round_block(dtype, r);
  }

  void fill_scalar(const void* data, size_t k, float* dst) const {
    visit_value_dtype(inputs_[k].dtype, [&](auto tag) {
      using T = decltype(tag);
      std::fill(dst, dst + kBlock, to_compute(static_cast<const T*>(data)[0]));
    });
  }

  // A per-channel input's values for the elements [begin, begin + count) of a layout: each
  // pixel's run of a channel block copied from the block's values (`padded`: the input's
  // values per sample, channels rounded up to the layout's blocks, zeros in the padding).
  static void gather_channels(const float* padded, const ChannelOrder& o, float* dst, int64_t begin,
                              int64_t count) {
    const int64_t per_sample = o.blocks * o.block;
    int64_t q = begin;
    int64_t in_block = q % o.block;
    q /= o.block;
    int64_t pixel = q % o.pixels;
    q /= o.pixels;
    int64_t block = q % o.blocks, sample = q / o.blocks;
    for (int64_t j = 0; j < count;) {
      const int64_t run = std::min(o.block - in_block, count - j);
      std::memcpy(dst + j, padded + sample * per_sample + block * o.block + in_block,
                  sizeof(float) * size_t(run));
      j += run;
      in_block = 0;
      if (++pixel < o.pixels) continue;
      pixel = 0;
      if (++block < o.blocks) continue;
      block = 0;
      ++sample;
    }
  }

  // The input's elements for output elements [begin, begin + count), as f32.
  static void gather(const void* data, const InputPlan& input, float* dst, int64_t begin,
                     int64_t count) {
    visit_value_dtype(input.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* src = static_cast<const T*>(data);
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
  const Shape y_;
  const int64_t numel_;
  const bool layout_free_;  // may run in a convolution's layout (run_own)
};

// Whether x holds one value per (sample, channel) of y [N, C, S...]: [N or 1, C, 1...].
bool per_channel(const Shape& x, const Shape& y) {
  if (y.size() < 3 || x.size() != y.size() || x[1] != y[1] || (x[0] != 1 && x[0] != y[0]))
    return false;
  return std::all_of(x.begin() + 2, x.end(), [](int64_t e) { return e == 1; });
}

// Why no instruction of `p` is beyond this interpreter, or the first that is.
std::string unsupported_instruction(const PointwiseProgram& p) {
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const PointwiseInstr& ins = p.instrs[i];
    const auto nothing = [](auto) {};
    const bool known =
        ins.op == OpKind::cast ||
        (pointwise_arity(ins.op) == 1 ? cpu::with_float_unary<float>(ins, nothing)
                                      : cpu::with_float_binary_instr<float>(ins, nothing));
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
    else if (dtypes[k] == DType::f32 && per_channel(x, y))
      input.channel_sample_stride = x[0] == 1 ? 0 : x[1];
    inputs.push_back(std::move(input));
  }
  return {std::make_unique<PointwiseKernel>(p, std::move(dtypes), std::move(inputs), y), ""};
}

}  // namespace fusebox::cpu_fast
