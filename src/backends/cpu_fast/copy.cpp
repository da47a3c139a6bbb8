// transpose and slice as oneDNN reorders: the input read through a memory descriptor of the
// output's dims with the input's strides permuted (transpose) or offset and scaled (slice),
// written dense. Why: the reference's strided nest moved ViT-B/16's [197, 768] transposes at
// ~1.4 GB/s (16 of 187 ms at batch 1 on 2 cores); oneDNN's reorders are blocked and threaded.
// A copy that is, its dims merged (extent-1 dims dropped, neighbours the input stores together
// joined), a batch of 2-D transposes runs on 32 x 32 tiles of the project's own instead:
// oneDNN's reorder moved GPT-2's [128, 50257] logits to classes-first in 18-38 ms on 2 AVX2
// cores, the tiles in 9.5-12 (interleaved runs; onnxruntime 8). Copies whose innermost dim is
// contiguous (attention's head split, q, k, v of a packed projection) stay on the reorders:
// runs of memcpy were no faster there.
#ifdef FUSEBOX_WITH_ONEDNN
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "backends/cpu_fast/kernels.h"
#include "backends/cpu_fast/onednn.h"
#include "backends/cpu_fast/threads.h"

namespace fusebox::cpu_fast {
namespace {

using dnnl::memory;

class StridedCopyKernel final : public Kernel {
 public:
  StridedCopyKernel(dnnl::reorder::primitive_desc pd, memory::desc from, memory::desc to,
                    int64_t offset_bytes)
      : pd_(std::move(pd)), primitive_(pd_), from_(from), to_(to), offset_(offset_bytes) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    const auto* base = static_cast<const std::byte*>(in[0]->raw());
    execute(primitive_,
            {{DNNL_ARG_FROM, wrap(from_, base + offset_)}, {DNNL_ARG_TO, wrap(to_, out[0].raw())}});
  }
  std::string describe() const override { return cat("oneDNN reorder ", implementation(pd_)); }

 private:
  dnnl::reorder::primitive_desc pd_;
  dnnl::reorder primitive_;
  memory::desc from_, to_;
  int64_t offset_;
};

// The output's dims merged: extent-1 dims dropped, a dim joined to the one outside it where
// the input stores the two together; `from`: the input's stride of each.
struct Merged {
  Shape dims, from;
};

Merged merged(const Shape& shape, const Shape& strides) {
  Merged m;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!m.dims.empty() && m.from.back() == strides[i] * shape[i]) {
      m.dims.back() *= shape[i];
      m.from.back() = strides[i];
      continue;
    }
    m.dims.push_back(shape[i]);
    m.from.push_back(strides[i]);
  }
  return m;
}

// y [batches, P, Q] (dense) = x read with strides (batch_stride, 1, q_stride): each batch a 2-D
// transpose, moved a 32 x 32 tile at a time (both the tile's reads and its writes in cache
// lines), the threads splitting the rows of tiles.
class TiledTransposeKernel final : public Kernel {
 public:
  TiledTransposeKernel(size_t element, int64_t offset, int64_t batches, int64_t p, int64_t q,
                       int64_t batch_stride, int64_t q_stride)
      : element_(element),
        offset_(offset),
        batches_(batches),
        p_(p),
        q_(q),
        batch_stride_(batch_stride),
        q_stride_(q_stride) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor> out) override {
    if (element_ == 4)
      move<uint32_t>(in[0]->raw(), out[0].raw());
    else
      move<uint16_t>(in[0]->raw(), out[0].raw());
  }
  std::string describe() const override { return "32 x 32 tiles (a batched 2-D transpose)"; }

 private:
  static constexpr int64_t kTile = 32;

  template <class E>
  void move(const void* from, void* to) const {
    const E* x = static_cast<const E*>(from) + offset_;
    E* y = static_cast<E*>(to);
    const int64_t tile_rows = (p_ + kTile - 1) / kTile;
    split_over_threads(batches_ * tile_rows, 4, [&](int64_t first, int64_t last) {
      for (int64_t item = first; item < last; ++item) {
        const int64_t b = item / tile_rows, p0 = item % tile_rows * kTile;
        const int64_t p1 = std::min(p_, p0 + kTile);
        const E* xb = x + b * batch_stride_;
        E* yb = y + b * p_ * q_;
        for (int64_t q0 = 0; q0 < q_; q0 += kTile) {
          const int64_t q1 = std::min(q_, q0 + kTile);
          for (int64_t p = p0; p < p1; ++p)
            for (int64_t q = q0; q < q1; ++q) yb[p * q_ + q] = xb[p + q * q_stride_];
        }
      }
    });
  }

  size_t element_;
  int64_t offset_, batches_, p_, q_, batch_stride_, q_stride_;
};

// The copy of the input viewed as `strides` (elements) at `offset` into the dense output: the
// tiled kernel where its merged dims are a batch of 2-D transposes, else oneDNN's reorder.
Planned strided_copy(const Graph& g, const Node& n, const Shape& strides, int64_t offset) {
  const TensorType& y = g.value(n.outputs[0]).type;
  if (!data_type_of(y.dtype))
    return {nullptr, cat("a ", dtype_name(y.dtype), " tensor (f32, bf16 and f16 only)")};
  if (y.shape.empty() || numel(y.shape) == 0) return {nullptr, "a scalar or empty output"};
  for (int64_t s : strides)
    if (s < 0) return {nullptr, "a negative step (oneDNN's strides are not negative)"};
  const size_t element = dtype_size(y.dtype);
  Merged m = merged(y.shape, strides);
  if (m.dims.size() == 2) m.dims.insert(m.dims.begin(), 1), m.from.insert(m.from.begin(), 0);
  if (m.dims.size() == 3 && m.from[1] == 1 && m.from[2] == m.dims[1] && m.dims[1] >= 8 &&
      m.dims[2] >= 8 && (element == 4 || element == 2))
    return {std::make_unique<TiledTransposeKernel>(element, offset, m.dims[0], m.dims[1], m.dims[2],
                                                   m.from[0], m.from[2]),
            ""};
  const memory::desc from(dims_of(y.shape), *data_type_of(y.dtype), dims_of(strides));
  const memory::desc to = plain_desc(dims_of(y.shape), y.dtype);
  try {
    dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to);
    return {std::make_unique<StridedCopyKernel>(pd, from, to, offset * int64_t(element)), ""};
  } catch (const dnnl::error& e) {
    return {nullptr, cat("oneDNN has no reorder for it (", e.what(), ")")};
  }
}

}  // namespace

Planned plan_transpose(const Graph& g, const Node& n) {
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  const Shape x = contiguous_strides(g.value(n.inputs[0]).type.shape);
  Shape strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) strides[i] = x[size_t(perm[i])];
  return strided_copy(g, n, strides, 0);
}

// Normalised attributes (ir/graph.h): absolute starts, the output's shape holds the counts.
Planned plan_slice(const Graph& g, const Node& n) {
  const auto& a = std::get<SliceAttrs>(n.attrs);
  Shape strides = contiguous_strides(g.value(n.inputs[0]).type.shape);
  int64_t offset = 0;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t d = size_t(a.axes[i]);
    offset += a.starts[i] * strides[d];
    strides[d] *= a.steps[i];
  }
  return strided_copy(g, n, strides, offset);
}

}  // namespace fusebox::cpu_fast
#endif  // FUSEBOX_WITH_ONEDNN
