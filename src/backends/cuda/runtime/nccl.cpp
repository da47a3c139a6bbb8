#include "backends/cuda/runtime/nccl.h"

#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

#include "backends/cuda/runtime/check.h"
#include "backends/cuda/runtime/device.h"
#include "fusebox/core/error.h"

namespace fusebox::cuda {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";

// The NCCL entry points this file calls, resolved from the loaded library.
struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
};

template <class F>
void resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(::dlsym(lib, name));
  FUSEBOX_CHECK(out != nullptr, "nccl", kLibrary, " has no ", name);
}

// Loads NCCL once per process; an Error (each time asked) when it cannot.
const NcclApi& nccl() {
  static std::once_flag once;
  static NcclApi api;
  static std::optional<Error> failure;
  std::call_once(once, [] {
    try {
      void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        const char* why = ::dlerror();
        throw Error("nccl", cat("cannot load ", kLibrary, " (", why ? why : "?",
                                "): put the directory of NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".",
                                NCCL_PATCH,
                                " (the PyTorch environment's nvidia/nccl/lib, or the "
                                "nvidia-nccl-cu13 wheel's) on LD_LIBRARY_PATH"));
      }
      NcclApi a;
      resolve(lib, "ncclGetVersion", a.get_version);
      resolve(lib, "ncclGetUniqueId", a.get_unique_id);
      resolve(lib, "ncclCommInitRank", a.comm_init_rank);
      resolve(lib, "ncclCommDestroy", a.comm_destroy);
      resolve(lib, "ncclCommAbort", a.comm_abort);
      resolve(lib, "ncclAllReduce", a.all_reduce);
      resolve(lib, "ncclBroadcast", a.broadcast);
      resolve(lib, "ncclAllGather", a.all_gather);
      resolve(lib, "ncclGetErrorString", a.error_string);
      int version = 0;
      a.get_version(&version);
      // Codes since 2.9: major * 10000 + minor * 100 + patch.
      FUSEBOX_CHECK(version / 100 == NCCL_VERSION_CODE / 100, "nccl", "loaded NCCL ", version,
                    " but the build's headers are ", NCCL_VERSION_CODE,
                    ": one NCCL release (major.minor) throughout (scripts/setup.sh pins it)");
      api = a;
    } catch (const Error& e) {
      failure = e;
    }
  });
  if (failure) throw *failure;
  return api;
}

void check(ncclResult_t rc, const char* call, int rank) {
  if (rc == ncclSuccess) return;
  throw Error("nccl", cat(call, " failed on rank ", rank, ": ", nccl().error_string(rc)));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i64:
      return ncclInt64;
    default:
      break;
  }
  throw Error("nccl", cat("all_reduce_sum of ", dtype_name(d),
                          " is not supported (f32, f64, f16, bf16, i64)"));
}

}  // namespace

NcclComm::NcclComm(const std::string& unique_id, int rank, int world_size, int device)
    : rank_(rank), world_size_(world_size), device_(device) {
  FUSEBOX_CHECK(unique_id.size() == sizeof(ncclUniqueId), "nccl", "rank ", rank,
                ": a unique id of ", unique_id.size(), " bytes (NCCL's are ", sizeof(ncclUniqueId),
                ")");
  FUSEBOX_CHECK(rank >= 0 && rank < world_size, "nccl", "rank ", rank, " of ", world_size);
  const NcclApi& api = nccl();
  FUSEBOX_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id;
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  ncclComm_t comm = nullptr;
  check(api.comm_init_rank(&comm, world_size, id, rank), "ncclCommInitRank", rank);
  comm_ = comm;
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) nccl().comm_destroy(static_cast<ncclComm_t>(comm_));
}

void NcclComm::all_reduce_sum(void* data, size_t count, DType dtype, cudaStream_t stream) {
  FUSEBOX_CHECK(comm_ != nullptr, "nccl", "rank ", rank_, ": all_reduce_sum after abort()");
  check(nccl().all_reduce(data, data, count, nccl_type(dtype), ncclSum,
                          static_cast<ncclComm_t>(comm_), stream),
        "ncclAllReduce", rank_);
}

void NcclComm::broadcast(void* data, size_t bytes, int root, cudaStream_t stream) {
  FUSEBOX_CHECK(comm_ != nullptr, "nccl", "rank ", rank_, ": broadcast after abort()");
  check(
      nccl().broadcast(data, data, bytes, ncclUint8, root, static_cast<ncclComm_t>(comm_), stream),
      "ncclBroadcast", rank_);
}

void NcclComm::all_gather(void* data, size_t bytes, cudaStream_t stream) {
  FUSEBOX_CHECK(comm_ != nullptr, "nccl", "rank ", rank_, ": all_gather after abort()");
  const void* own = static_cast<const char*>(data) + size_t(rank_) * bytes;
  check(nccl().all_gather(own, data, bytes, ncclUint8, static_cast<ncclComm_t>(comm_), stream),
        "ncclAllGather", rank_);
}

void NcclComm::abort() {
  if (comm_ == nullptr) return;
  nccl().comm_abort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

// ---- NcclCommunicator ---------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(const std::string& unique_id, int rank, int world_size,
                                   int device)
    : comm_(unique_id, rank, world_size, device) {
  DeviceGuard guard(device);
  order_ = CachingAllocator::for_device(device).allocate(sizeof(int32_t));
  FUSEBOX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

NcclCommunicator::~NcclCommunicator() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

// Host tensors go through the device: `t`'s bytes up, `collective` on them, back into `t`.
template <class Collective>
void NcclCommunicator::through_device(Tensor& t, Collective&& collective) {
  if (t.nbytes() == 0) return;
  DeviceGuard guard(comm_.device());
  DeviceBuffer d = CachingAllocator::for_device(comm_.device()).allocate(t.nbytes());
  FUSEBOX_CUDA_CHECK(
      cudaMemcpyAsync(d.data(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice, stream_));
  collective(d.data());
  FUSEBOX_CUDA_CHECK(
      cudaMemcpyAsync(t.raw(), d.data(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
  FUSEBOX_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// f16 and bf16 travel as f32 (the interface's promise: summed in f32, rounded once).
void NcclCommunicator::all_reduce_sum(Tensor& t) {
  const bool half = t.dtype() == DType::f16 || t.dtype() == DType::bf16;
  Tensor wire = half ? t.cast(DType::f32) : t;
  through_device(wire, [&](void* data) {
    comm_.all_reduce_sum(data, size_t(wire.numel()), wire.dtype(), stream_);
  });
  if (half) {  // into t's own buffer, as the MPI world does
    const Tensor sum = wire.cast(t.dtype());
    std::memcpy(t.raw(), sum.raw(), sum.nbytes());
  }
}

Tensor NcclCommunicator::all_gather(const Tensor& t) {
  Shape shape = t.shape();
  shape.insert(shape.begin(), world_size());
  Tensor all = Tensor::zeros(t.dtype(), shape);
  std::memcpy(static_cast<char*>(all.raw()) + size_t(rank()) * t.nbytes(), t.raw(), t.nbytes());
  through_device(all, [&](void* data) { comm_.all_gather(data, t.nbytes(), stream_); });
  return all;
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
  through_device(t, [&](void* data) { comm_.broadcast(data, t.nbytes(), root, stream_); });
}

void NcclCommunicator::barrier() {
  Tensor one = Tensor::scalar(DType::f32, 1.0);
  all_reduce_sum(one);
}

}  // namespace fusebox::cuda

namespace fusebox::dist {

std::string nccl_unique_id() {
  ncclUniqueId id;
  cuda::check(cuda::nccl().get_unique_id(&id), "ncclGetUniqueId", -1);
  return std::string(id.internal, sizeof id.internal);
}

std::shared_ptr<Communicator> nccl_communicator(const std::string& unique_id, int rank,
                                                int world_size, int device) {
  return std::make_shared<cuda::NcclCommunicator>(unique_id, rank, world_size, device);
}

}  // namespace fusebox::dist
