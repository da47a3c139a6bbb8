#ifdef FUSEBOX_WITH_ONEDNN
#include "backends/cpu_fast/onednn.h"

#include <limits>

namespace fusebox::cpu_fast {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

void execute(const dnnl::primitive& p, const std::unordered_map<int, dnnl::memory>& args) {
  // A stream per call: they are cheap on the CPU, and executables may run on several threads.
  try {
    dnnl::stream stream(cpu_engine());
    p.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    throw Error("oneDNN", cat("a primitive failed to run: ", e.what()));
  }
}

dnnl::memory::dims dims_of(const Shape& s) {
  return dnnl::memory::dims(s.begin(), s.end());
}

std::optional<dnnl::memory::data_type> data_type_of(DType t) {
  switch (t) {
    case DType::f32:
      return dnnl::memory::data_type::f32;
    case DType::bf16:
      return dnnl::memory::data_type::bf16;
    case DType::f16:
      return dnnl::memory::data_type::f16;
    default:
      return std::nullopt;
  }
}

dnnl::memory::desc plain_desc(const dnnl::memory::dims& dims, DType dtype) {
  dnnl::memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return dnnl::memory::desc(dims, data_type_of(dtype).value_or(dnnl::memory::data_type::f32),
                            strides);
}

dnnl::memory wrap(const dnnl::memory::desc& desc, const void* data) {
  // oneDNN takes a mutable handle; inputs are only read through it.
  return dnnl::memory(desc, cpu_engine(), const_cast<void*>(data));
}

std::optional<Eltwise> eltwise_of(const FusedActivation& a, std::string* why) {
  using dnnl::algorithm;
  switch (a.kind) {
    case Activation::none:
      break;
    case Activation::relu:
      return Eltwise{algorithm::eltwise_relu, 0.f, 0.f};
    case Activation::gelu:
      return Eltwise{algorithm::eltwise_gelu_erf, 0.f, 0.f};
    case Activation::gelu_tanh:
      return Eltwise{algorithm::eltwise_gelu_tanh, 0.f, 0.f};
    case Activation::silu:
      return Eltwise{algorithm::eltwise_swish, 1.f, 0.f};
    case Activation::sigmoid:
      return Eltwise{algorithm::eltwise_logistic, 0.f, 0.f};
    case Activation::tanh:
      return Eltwise{algorithm::eltwise_tanh, 0.f, 0.f};
    case Activation::clip: {
      // clip_v2: min(max(x, alpha), beta); an infinite bound as the float range's end.
      const float lo = std::max(float(a.min), std::numeric_limits<float>::lowest());
      const float hi = std::min(float(a.max), std::numeric_limits<float>::max());
      return Eltwise{algorithm::eltwise_clip_v2, lo, hi};
    }
  }
  *why = cat("no oneDNN eltwise for the activation ", activation_name(a.kind));
  return std::nullopt;
}

bool append_activation(dnnl::post_ops& ops, const FusedActivation& a, std::string* why) {
  if (!a) return true;
  const std::optional<Eltwise> e = eltwise_of(a, why);
  if (e) ops.append_eltwise(e->algorithm, e->alpha, e->beta);
  return e.has_value();
}

dnnl::memory in_layout(const dnnl::memory& data, const dnnl::memory::desc& want) {
  if (data.get_desc() == want) return data;
  dnnl::memory out(want, cpu_engine());
  execute(dnnl::reorder(data, out), {{DNNL_ARG_FROM, data}, {DNNL_ARG_TO, out}});
  return out;
}

dnnl::memory prepared_copy(const Tensor& t, const dnnl::memory::desc& given,
                           const dnnl::memory::desc& want) {
  const dnnl::memory from = wrap(given, t.raw());
  dnnl::memory to(want, cpu_engine());
  execute(dnnl::reorder(from, to), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
  return to;
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
