// all_reduce (ops.h) on the GPU: one bucket per node, reduced by one NCCL collective.
//
//   1. pack:   bucket[offset_i + j] = reduce_t(x_i[j])          (one launch per 32 inputs of a
//              dtype; grid.y the input, grid.x a grid-stride loop over its elements)
//   2. reduce: ncclAllReduce(bucket, sum) over ctx.world, captured as a child graph of the
//              step; skipped without a world
//   3. unpack: y_i[j] = out_t(float(bucket[offset_i + j]) * scale)   (scale 1 / world for a
//              mean)
//
// Each input is read flat, in the order it is stored: an input not in its output's order
// (the layout pass's pairwise role keeps them equal; a view can differ) is first copied into
// the output, which is then packed from. The bucket is a buffer of its own, not arena bytes:
// a node after this one never writes memory the collective touches, so none waits for it,
// and the collective overlaps the rest of the backward pass (the memory plan keeps the
// inputs to the step's end for the same reason). Every collective also declares the
// communicator's order byte as written, which chains the collectives in recording order, the
// one order every rank issues them in.
#include <algorithm>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/dtype_dispatch.cuh"
#include "backends/cuda/runtime/nccl.h"

namespace fusebox::cuda {

namespace {

// Inputs (or outputs) per launch: a kernel parameter of about 800 bytes.
constexpr int kSegmentsPerLaunch = 32;

struct Segments {
  void* data[kSegmentsPerLaunch];
  int64_t count[kSegmentsPerLaunch];
  int64_t offset[kSegmentsPerLaunch];  // in the bucket, in elements
};

template <class From, class Bucket>
__global__ void pack_kernel(Segments s, Bucket* bucket) {
  const int k = int(blockIdx.y);
  const From* src = static_cast<const From*>(s.data[k]);
  Bucket* dst = bucket + s.offset[k];
  for (int64_t i = global_thread_index(); i < s.count[k]; i += grid_stride())
    dst[i] = convert<Bucket>(src[i]);
}

template <class Bucket, class To>
__global__ void unpack_kernel(Segments s, const Bucket* bucket, float scale) {
  const int k = int(blockIdx.y);
  To* dst = static_cast<To*>(s.data[k]);
  const Bucket* src = bucket + s.offset[k];
  for (int64_t i = global_thread_index(); i < s.count[k]; i += grid_stride())
    dst[i] = convert<To>(__fmul_rn(convert<float>(src[i]), scale));
}

// One tensor of a pack or unpack: its (dense) elements and where they go in the bucket.
struct Part {
  const DeviceTensor* tensor;
  int64_t offset;
};

// Launches `kernel<T>` over `parts` grouped by dtype, kSegmentsPerLaunch at a time.
template <class Launch>
void launch_batches(const Node& n, const std::vector<Part>& parts, Launch&& launch) {
  std::vector<DType> dtypes;
  for (const Part& p : parts)
    if (std::find(dtypes.begin(), dtypes.end(), p.tensor->dtype) == dtypes.end())
      dtypes.push_back(p.tensor->dtype);
  for (DType dtype : dtypes) {
    std::vector<const Part*> of_dtype;
    for (const Part& p : parts)
      if (p.tensor->dtype == dtype && p.tensor->numel() > 0) of_dtype.push_back(&p);
    for (size_t first = 0; first < of_dtype.size(); first += kSegmentsPerLaunch) {
      const size_t size = std::min<size_t>(kSegmentsPerLaunch, of_dtype.size() - first);
      Segments s{};
      BufferList ranges;
      int64_t largest = 0;
      for (size_t k = 0; k < size; ++k) {
        const Part& p = *of_dtype[first + k];
        s.data[k] = p.tensor->data();
        s.count[k] = p.tensor->numel();
        s.offset[k] = p.offset;
        largest = std::max(largest, s.count[k]);
        ranges.push_back(p.tensor->range());
      }
      const unsigned per_part =
          std::min(launch_blocks(largest),
                   unsigned(std::max<int64_t>(1, kMaxGridStrideBlocks / int64_t(size))));
      launch(n, dtype, s, dim3(per_part, unsigned(size)), ranges);
    }
  }
}

}  // namespace

void all_reduce(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const auto& a = std::get<AllReduceAttrs>(n.attrs);
  FUSEBOX_CHECK(in.size() == out.size(), node_label(n), "has ", in.size(), " inputs but ",
                out.size(), " outputs");
  // The inputs as packed: each in its output's order.
  std::vector<Part> packed, unpacked;
  int64_t total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    FUSEBOX_CHECK(in[i]->dtype != DType::f64, node_label(n),
                  "the CUDA all_reduce takes f32, f16 and bf16 values, got f64 for input ", i);
    const bool same_order = in[i]->strides == out[i].strides;
    if (!same_order) copy_strided(ctx, *in[i], out[i]);
    packed.push_back({same_order ? in[i] : &out[i], total});
    unpacked.push_back({&out[i], total});
    total += out[i].numel();
  }
  if (total == 0) return;
  const size_t element = dtype_size(a.reduce_dtype);
  DeviceBuffer bucket = ctx.allocator.allocate(size_t(total) * element);
  ctx.encoder.add_temporary(bucket);
  const BufferRange whole(bucket, 0, size_t(total) * element);

  visit_device_float(n, a.reduce_dtype, [&](auto bucket_tag) {
    using B = decltype(bucket_tag);
    B* data = static_cast<B*>(bucket.data());
    launch_batches(
        n, packed,
        [&](const Node& node, DType dtype, const Segments& s, dim3 grid, const BufferList& reads) {
          visit_device_float(node, dtype, [&](auto from_tag) {
            using F = decltype(from_tag);
            ctx.encoder.launch(pack_kernel<F, B>, grid, kDefaultThreads, 0, reads, {whole}, s,
                               data);
          });
        });

    // A world of one rank still calls NCCL (a copy there): the path the tests on one GPU take.
    const int ranks = ctx.world != nullptr ? ctx.world->world_size() : 1;
    if (ctx.world != nullptr) {
      NcclCommunicator& world = *ctx.world;
      const BufferList touched{whole, BufferRange(world.order(), 0, world.order().size())};
      ctx.encoder.capture_library_call(touched, touched, [&](cudaStream_t stream) {
        world.comm().all_reduce_sum(bucket.data(), size_t(total), a.reduce_dtype, stream);
      });
    }

    const float scale = a.mean ? 1.0f / float(ranks) : 1.0f;
    launch_batches(
        n, unpacked,
        [&](const Node& node, DType dtype, const Segments& s, dim3 grid, const BufferList& writes) {
          visit_device_float(node, dtype, [&](auto to_tag) {
            using T = decltype(to_tag);
            ctx.encoder.launch(unpack_kernel<B, T>, grid, kDefaultThreads, 0, {whole}, writes, s,
                               static_cast<const B*>(data), scale);
          });
        });
  });
}

}  // namespace fusebox::cuda
