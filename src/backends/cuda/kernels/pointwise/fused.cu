// fused_pointwise on the GPU: the program's kernel is generated (fused_codegen.h), compiled
// by NVRTC when the node is recorded (runtime/nvrtc.h: at an executable's compile time,
// cached in memory and on disk) and launched by handle through the command encoder, so it
// is a node of the step's CUDA graph like any other kernel. Each input is read once and the
// output written once.
//
// The host picks the access pattern per call, from the inputs' strides and alignment:
//   vectorised  the output 16-byte aligned, and every input contiguous with the output's
//               shape (16-byte aligned), or constant over each W-element step (a per-channel
//               or scalar broadcast: `uniform`), or a contiguous run of W along the innermost
//               dim at an aligned offset (a broadcast over outer dims: `row`); W = 16 bytes of
//               the narrowest dtype among the output and the inputs, times the vectors per
//               step (fused_codegen.h; fewer when the inputs do not allow that many)
//   general     anything else (strided views, misaligned bases, odd broadcasts): per-element
//               index math over the merged walk (at most 8 dims, as the other kernels)
// The pattern, the dtypes and W are all the generated source depends on (sizes, strides
// and pointers are parameters), so equal patterns share one compiled kernel.
//
// A generated kernel NVRTC does not compile (or load) is not an error of the run: the source is
// written to a file, a warning names the node and the file, and the node runs unfused, each
// instruction as its own op's kernel on temporaries (the values of the ops the fusion took in;
// a product and a sum the fused kernel contracts into one FMA round twice there). Once per
// source: later recordings of the same pattern go straight to the unfused ops.
// FUSEBOX_TEST_NVRTC_FAILURE=1 makes every generated kernel fail so (docs/settings.md: tests).
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>

#include "backends/cuda/device/math.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common/indexing.cuh"
#include "backends/cuda/kernels/pointwise/fused_codegen.h"
#include "backends/cuda/runtime/nvrtc.h"

namespace fusebox::cuda {

namespace {

constexpr size_t kOperands = size_t(kMaxPointwiseInputs) + 1;  // the output, then the inputs

// Input k is constant over every step of w elements: its strides are 0 along the innermost
// dims up to the first whose extents multiply to a multiple of w (or along every dim).
bool uniform_over(const FusedParams& p, int rank, size_t k, int w) {
  int64_t span = 1;
  for (int d = 0; d < rank && span % w != 0; ++d) {
    if (p.stride[k][d] != 0) return false;
    span *= p.extent[d];
  }
  return true;
}

// Input k reads w contiguous elements per step at an offset that is a multiple of w.
bool row_of(const FusedParams& p, int rank, size_t k, int w) {
  if (p.stride[k][0] != 1 || p.extent[0] % w != 0) return false;
  for (int d = 1; d < rank; ++d)
    if (p.stride[k][d] % w != 0) return false;
  return true;
}

// The program one instruction at a time, each its own op's kernel (run_node: any strides,
// broadcasts, channels-last), the intermediate values on temporaries, the last into y.
void run_unfused(Context& ctx, const Node& n, const std::vector<DType>& values, Inputs in,
                 const DeviceTensor& y) {
  const PointwiseProgram& program = std::get<PointwiseProgram>(n.attrs);
  std::vector<DeviceTensor> computed;
  computed.reserve(program.instrs.size());
  for (size_t i = 0; i < program.instrs.size(); ++i) {
    const PointwiseInstr& instr = program.instrs[i];
    std::vector<const DeviceTensor*> operands;
    Shape shape;
    for (int32_t o : instr.operands) {
      operands.push_back(o < program.inputs ? in[size_t(o)]
                                            : &computed[size_t(o - program.inputs)]);
      Shape merged;
      FUSEBOX_CHECK(broadcast_shapes(shape, operands.back()->shape, &merged), node_label(n),
                    "instruction ", i, "'s operands do not broadcast");
      shape = merged;
    }
    Node node;
    node.op = instr.op;
    node.attrs = pointwise_instr_attrs(instr);
    node.name = cat(n.name, "/unfused", i);
    const bool last = i + 1 == program.instrs.size();
    computed.push_back(last ? y : temporary_tensor(ctx, values[size_t(program.inputs) + i], shape));
    run_node(ctx, node, operands, std::span<DeviceTensor>(&computed.back(), 1));
  }
}

// The sources NVRTC refused in this process (their hashes): recorded again, they run unfused
// without another try or warning.
struct RefusedSources {
  std::mutex mutex;
  std::set<size_t> hashes;
};
RefusedSources& refused_sources() {
  static auto* r = new RefusedSources();
  return *r;
}

// Writes `source` next to the other temporary files and says so, naming the node.
void report_refused(const Node& n, const std::string& source, size_t hash, const Error& e) {
  char name[64];
  std::snprintf(name, sizeof name, "fusebox_generated_%016zx.cu", hash);
  const std::filesystem::path file = std::filesystem::temp_directory_path() / name;
  std::ofstream(file) << source;
  std::fprintf(stderr,
               "fusebox: %s: its generated kernel did not compile (%s); the source is in %s; the "
               "node runs unfused (one kernel per op)\n",
               node_label(n).c_str(), std::string(e.what()).substr(0, 300).c_str(),
               file.string().c_str());
}

}  // namespace

void fused_pointwise(Context& ctx, const Node& n, Inputs in, Outputs out) {
  const DeviceTensor& y = out[0];
  const PointwiseProgram& program = std::get<PointwiseProgram>(n.attrs);
  std::vector<DType> input_dtypes;
  for (const DeviceTensor* t : in) input_dtypes.push_back(t->dtype);
  FusedKernelSpec spec;
  spec.program = program;
  spec.values = check_pointwise_program(program, input_dtypes, node_label(n));
  FUSEBOX_CHECK(y.is_contiguous() && y.dtype == spec.values.back(), node_label(n),
                "the output must be a contiguous ", dtype_name(spec.values.back()), " tensor, got ",
                dtype_name(y.dtype), shape_str(y.shape));
  const int64_t count = y.numel();
  if (count == 0) return;

  // The walk over the output's shape, every input's strides broadcast to it (unused operands
  // walk with stride 0, which merges with anything).
  std::array<Shape, kOperands> strides;
  strides.fill(Shape(y.shape.size(), 0));
  strides[0] = y.strides;
  for (size_t k = 0; k < in.size(); ++k) {
    Shape common;
    FUSEBOX_CHECK(broadcast_shapes(in[k]->shape, y.shape, &common) && common == y.shape,
                  node_label(n), "input ", k, " ", shape_str(in[k]->shape),
                  " does not broadcast to the output ", shape_str(y.shape));
    strides[1 + k] = broadcast_strides(in[k]->shape, in[k]->strides, y.shape);
  }
  Shape shape = y.shape;
  simplify_strided_walk(shape, strides);
  FUSEBOX_CHECK(shape.size() <= size_t(kFusedMaxDims), node_label(n), "a walk over ",
                shape_str(y.shape), " keeps ", shape.size(),
                " dims after merging; the generated kernels handle at most ", kFusedMaxDims);

  FusedParams params{};
  const int rank = int(shape.size());
  spec.rank = rank;
  params.out = y.data();
  params.n = count;
  for (int d = 0; d < rank; ++d) params.extent[d] = shape[size_t(rank - 1 - d)];  // innermost first
  size_t narrowest = dtype_size(y.dtype);
  for (size_t k = 0; k < in.size(); ++k) {
    params.in[k] = in[k]->data();
    uint32_t moves = 0;
    for (int d = 0; d < rank; ++d) {
      params.stride[k][d] = strides[1 + k][size_t(rank - 1 - d)];
      if (params.stride[k][d] != 0) moves |= 1u << d;
    }
    spec.moves.push_back(moves);
    narrowest = std::min(narrowest, dtype_size(in[k]->dtype));
  }

  // Vectorised when every input allows it (with as many vectors per step as they allow);
  // else the general path.
  const bool out_aligned = is_aligned(params.out, kVecBytes);
  int w = 1;
  for (int vectors = fused_vectors_per_step(); vectors >= 1 && w == 1 && out_aligned;
       vectors /= 2) {
    const int width = vectors * int(kVecBytes / narrowest);
    spec.access.clear();
    for (size_t k = 0; k < in.size(); ++k) {
      const bool aligned = is_aligned(params.in[k], kVecBytes);
      if (strides[1 + k] == strides[0] && aligned)
        spec.access.push_back(FusedAccess::contiguous);
      else if (uniform_over(params, rank, k, width))
        spec.access.push_back(FusedAccess::uniform);
      else if (row_of(params, rank, k, width) && aligned)
        spec.access.push_back(FusedAccess::row);
      else
        break;
    }
    if (spec.access.size() == in.size()) w = width;
  }
  if (w == 1) {
    spec.access.clear();
    for (size_t k = 0; k < in.size(); ++k)
      spec.access.push_back(strides[1 + k] == strides[0] ? FusedAccess::contiguous
                                                         : FusedAccess::strided);
  }
  spec.vector_width = w;
  spec.unroll = w > 1 ? fused_steps_per_iteration() : 1;
  spec.index32 = fits_u32(count);
  if (spec.index32) {
    for (int d = 0; d < rank; ++d) {
      const FastDivisor f = fast_divisor(uint32_t(params.extent[d]));
      params.div_mul[d] = f.mul;
      params.div_shift[d] = f.shift;
    }
  }

  const std::string source = fused_kernel_source(spec);
  const size_t hash = std::hash<std::string>{}(source);
  RefusedSources& refused = refused_sources();
  {
    const std::lock_guard lock(refused.mutex);
    if (refused.hashes.count(hash)) return run_unfused(ctx, n, spec.values, in, y);
  }
  GeneratedKernel kernel;
  try {
    const char* injected = std::getenv("FUSEBOX_TEST_NVRTC_FAILURE");
    if (injected != nullptr && std::string(injected) == "1")
      throw Error(node_label(n), "FUSEBOX_TEST_NVRTC_FAILURE=1: NVRTC refused it, as asked");
    kernel = generated_kernel(ctx.device, source, kFusedKernelName, kDefaultThreads, node_label(n));
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    {
      const std::lock_guard lock(refused.mutex);
      refused.hashes.insert(hash);
    }
    report_refused(n, source, hash, e);
    return run_unfused(ctx, n, spec.values, in, y);
  }
  BufferList reads;
  for (const DeviceTensor* t : in) reads.push_back(t->range());
  void* args[] = {&params};
  // One wave of resident blocks at most: a grid-stride loop needs no more, and a partial
  // last wave would leave SMs idle while it runs.
  const int64_t steps = w > 1 ? count / w + 1 : count;
  const int64_t wave = int64_t(ctx.device.properties().sm_count) * kernel.blocks_per_sm;
  const auto blocks =
      unsigned(std::clamp<int64_t>((steps + kDefaultThreads - 1) / kDefaultThreads, 1, wave));
  ctx.encoder.launch_handle(kernel.kernel, blocks, kDefaultThreads, 0, args, reads, {y.range()});
}

}  // namespace fusebox::cuda
